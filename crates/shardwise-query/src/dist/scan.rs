//! [`ShardScanExec`]: the leaf of every plan over a sharded table. Each output partition is one
//! slice of one shard ([`ShardSlice`]); executing it reads that shard from *this* node's store.
//!
//! On the initiator the leaf only describes the data: the distributed planner
//! ([`super::planner`]) wraps every leaf in a fragment that runs on a node holding a replica of
//! the shard, where the leaf is rebuilt (through [`super::codec`]) with the slices that node is to
//! read. Slices split a shard's rows evenly by position (zero-copy `RecordBatch::slice`), so a
//! shard can be read by several threads, or a small cluster can use every core. Positions are only
//! meaningful within one read of one replica: the slices of a shard run in one fragment, on one
//! replica (`super::planner`), and share one read of it (`super::shard_reads`).

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType, SchedulingType};
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet, RecordOutput};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties};
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};

use super::shard_reads::ShardReads;
use crate::access::TableAccess;
use crate::error::QueryError;

/// Which incarnation of which table a plan reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardTableRef {
    pub name: String,
    pub table_id: u64,
    pub generation: u64,
    /// A catalog version that has this incarnation: a node executing the plan waits for it.
    pub catalog_version: u64,
    pub shards: u32,
    /// Shard-key column names.
    pub shard_key: Vec<String>,
}

/// One partition of a shard scan: slice `slice` of `slices` equal slices of shard `shard`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardSlice {
    pub shard: u32,
    pub slice: u32,
    pub slices: u32,
}

impl ShardSlice {
    /// Every slice of `shard` when it is cut in `slices`.
    pub fn all_of(shard: u32, slices: u32) -> Vec<ShardSlice> {
        let slices = slices.max(1);
        (0..slices).map(|slice| ShardSlice { shard, slice, slices }).collect()
    }

    /// The row range `[start, end)` this slice covers in a shard of `rows` rows.
    pub fn row_range(self, rows: usize) -> (usize, usize) {
        let slices = self.slices.max(1) as usize;
        let at = |i: usize| ((rows as u128 * i as u128) / slices as u128) as usize;
        (at(self.slice as usize), at(self.slice as usize + 1))
    }
}

/// The leaf over a sharded table. See the module doc.
#[derive(Debug, Clone)]
pub struct ShardScanExec {
    table: ShardTableRef,
    /// The table's full schema (the projection applies to it).
    table_schema: SchemaRef,
    projection: Option<Vec<usize>>,
    parts: Vec<ShardSlice>,
    access: Arc<dyn TableAccess>,
    /// Refuse to read a shard replica holding rows that did not arrive through shardwise's
    /// placement (a plan that relies on groups not spanning shards sets this).
    require_verified_placement: bool,
    /// The WHERE pinned the shard key, so the parts leave out the other shards
    /// (`optimize_skip_unused_shards`; for EXPLAIN).
    skipped_shards: bool,
    schema: SchemaRef,
    metrics: ExecutionPlanMetricsSet,
    /// One read per shard and execution, whatever the number of its slices.
    reads: Arc<ShardReads>,
    cache: Arc<PlanProperties>,
}

impl ShardScanExec {
    pub fn try_new(
        table: ShardTableRef,
        table_schema: SchemaRef,
        projection: Option<Vec<usize>>,
        parts: Vec<ShardSlice>,
        access: Arc<dyn TableAccess>,
    ) -> Result<Self> {
        let schema = match &projection {
            Some(p) => Arc::new(table_schema.project(p)?),
            None => Arc::clone(&table_schema),
        };
        let cache = Arc::new(
            PlanProperties::new(
                EquivalenceProperties::new(Arc::clone(&schema)),
                Partitioning::UnknownPartitioning(parts.len().max(1)),
                EmissionType::Incremental,
                Boundedness::Bounded,
            )
            // It yields on its own (`SCAN_BATCHES_PER_YIELD`): DataFusion's EnsureCooperative
            // rule must not wrap it in a budget that yields every 128 batches (measured slower).
            .with_scheduling_type(SchedulingType::Cooperative),
        );
        Ok(ShardScanExec {
            table,
            table_schema,
            projection,
            parts,
            access,
            require_verified_placement: false,
            skipped_shards: false,
            schema,
            metrics: ExecutionPlanMetricsSet::new(),
            reads: Arc::default(),
            cache,
        })
    }

    /// The same scan reading `parts` instead.
    pub fn with_parts(&self, parts: Vec<ShardSlice>) -> Result<Self> {
        Self::try_new(
            self.table.clone(),
            Arc::clone(&self.table_schema),
            self.projection.clone(),
            parts,
            Arc::clone(&self.access),
        )
        .map(|scan| scan.with_required_verified_placement(self.require_verified_placement))
    }

    /// The same scan, refusing (or not) replicas whose placement is not verified.
    pub fn with_required_verified_placement(mut self, required: bool) -> Self {
        self.require_verified_placement = required;
        self
    }

    /// The same scan, marked as reading only the shards its WHERE pinned.
    pub fn with_skipped_shards(mut self, skipped: bool) -> Self {
        self.skipped_shards = skipped;
        self
    }

    /// The shards the parts read, ascending.
    pub fn shards(&self) -> Vec<u32> {
        let mut shards: Vec<u32> = self.parts.iter().map(|p| p.shard).collect();
        shards.sort_unstable();
        shards.dedup();
        shards
    }

    pub fn requires_verified_placement(&self) -> bool {
        self.require_verified_placement
    }

    pub fn table(&self) -> &ShardTableRef {
        &self.table
    }

    pub fn table_schema(&self) -> &SchemaRef {
        &self.table_schema
    }

    pub fn projection(&self) -> Option<&Vec<usize>> {
        self.projection.as_ref()
    }

    pub fn parts(&self) -> &[ShardSlice] {
        &self.parts
    }

    /// The table column each output column is (by name).
    pub fn output_column_names(&self) -> Vec<String> {
        self.schema.fields().iter().map(|f| f.name().clone()).collect()
    }
}

impl DisplayAs for ShardScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let columns = self.output_column_names().join(", ");
        let mut shards: Vec<u32> = self.parts.iter().map(|p| p.shard).collect();
        shards.dedup();
        let slices = self.parts.iter().map(|p| p.slices).max().unwrap_or(1);
        write!(f, "ShardScanExec: table={}, columns=[{columns}], shards={shards:?}", self.table.name)?;
        if self.skipped_shards {
            write!(f, " of {} (optimize_skip_unused_shards: the WHERE pins the shard key)", self.table.shards)?;
        }
        if slices > 1 {
            write!(f, ", slices_per_shard={slices}")?;
        }
        Ok(())
    }
}

impl ExecutionPlan for ShardScanExec {
    plan_node_methods!("ShardScanExec", leaf);

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let part = *self.parts.get(partition).ok_or_else(|| {
            DataFusionError::Internal(format!("ShardScanExec: partition {partition} of {}", self.parts.len()))
        })?;
        let access = Arc::clone(&self.access);
        let table = self.table.clone();
        let projection = self.projection.clone();
        let batch_rows = context.session_config().batch_size().max(1);
        let require_verified = self.require_verified_placement;
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let readers = self.parts.iter().filter(|p| p.shard == part.shard).count();
        let shared = self.reads.take(&context, part.shard, readers);
        let read = async move {
            let data = shared
                .get_or_try_init(|| async {
                    let data = access
                        .read_shard(table.table_id, table.generation, table.catalog_version, part.shard)
                        .await
                        .map_err(|e| DataFusionError::External(Box::new(e)))?;
                    Ok::<_, DataFusionError>(Arc::new(data))
                })
                .await?;
            if require_verified && !data.verified_placement {
                return Err(DataFusionError::External(Box::new(QueryError::Rejected(format!(
                    "table {} shard {}: this replica holds rows that did not arrive through shardwise's placement, \
                     so groups may span shards; rerun with optimize_distributed_group_by_sharding_key = 0",
                    table.name, part.shard
                )))));
            }
            let out = {
                let _timer = baseline.elapsed_compute().timer();
                slice_rows(&data.batches, part, batch_rows, projection.as_deref())?
            };
            out.iter().for_each(|b| _ = b.record_output(&baseline));
            baseline.done();
            Ok::<_, DataFusionError>(futures::stream::iter(out.into_iter().map(Ok)))
        };
        let stream = YieldEvery { inner: futures::stream::once(read).try_flatten().boxed(), since_yield: 0 };
        let stream = Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&self.schema), stream));
        Ok(crate::stop::stop_checked(stream, &context))
    }
}

/// Batches a shard read hands over before it yields to the other tasks on its thread.
///
/// The batches are in memory and always ready: without a yield point, the operator above (an
/// aggregation) would run over the whole shard in one poll and hold its worker thread, starving
/// the other tasks on it (another query, a fragment waiting to be sent, a cancellation). Tokio's
/// own budget (DataFusion's `coop`, a yield every 128 batches) measured 1.03-1.16x slower on
/// db-benchmark's q1-q9 (BENCHMARKS.md); at 1024 batches of 8192 rows a yield comes every 8M rows.
pub const SCAN_BATCHES_PER_YIELD: u32 = 1024;

/// `inner`, returning `Pending` once (waking itself at once) after every
/// [`SCAN_BATCHES_PER_YIELD`] batches.
struct YieldEvery<S> {
    inner: S,
    since_yield: u32,
}

impl<S: futures::Stream + Unpin> futures::Stream for YieldEvery<S> {
    type Item = S::Item;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        if self.since_yield >= SCAN_BATCHES_PER_YIELD {
            self.since_yield = 0;
            cx.waker().wake_by_ref();
            return std::task::Poll::Pending;
        }
        let next = std::pin::Pin::new(&mut self.inner).poll_next(cx);
        if matches!(next, std::task::Poll::Ready(Some(_))) {
            self.since_yield += 1;
        }
        next
    }
}

/// The rows of `part` out of a shard's `batches`, cut into batches of at most `batch_rows` rows,
/// projected. Zero-copy.
fn slice_rows(
    batches: &[RecordBatch],
    part: ShardSlice,
    batch_rows: usize,
    projection: Option<&[usize]>,
) -> Result<Vec<RecordBatch>> {
    let total: usize = batches.iter().map(RecordBatch::num_rows).sum();
    let (start, end) = part.row_range(total);
    let mut out = Vec::new();
    let mut offset = 0;
    for batch in batches {
        let (from, to) = (offset, offset + batch.num_rows());
        offset = to;
        let (lo, hi) = (start.max(from), end.min(to));
        let mut at = lo;
        while at < hi {
            let len = (hi - at).min(batch_rows);
            let piece = batch.slice(at - from, len);
            out.push(match projection {
                Some(p) => piece.project(p)?,
                None => piece,
            });
            at += len;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::test_access::OneShard;
    use datafusion::arrow::array::{Array, Int64Array};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    fn batch(from: i64, n: i64) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, true)]));
        let values = Int64Array::from_iter_values(from..from + n);
        RecordBatch::try_new(schema, vec![Arc::new(values)]).expect("batch")
    }

    /// A table of one shard, keyed by `v`.
    fn one_shard_table() -> ShardTableRef {
        ShardTableRef {
            name: "t".into(),
            table_id: 1,
            generation: 1,
            catalog_version: 1,
            shards: 1,
            shard_key: vec!["v".into()],
        }
    }

    fn values(batches: &[RecordBatch]) -> Vec<i64> {
        batches
            .iter()
            .flat_map(|b| {
                let a = b.column(0).as_any().downcast_ref::<Int64Array>().expect("int64").clone();
                (0..a.len()).map(move |i| a.value(i))
            })
            .collect()
    }

    #[test]
    fn slices_cover_every_row_once() {
        let batches = vec![batch(0, 7), batch(7, 0), batch(7, 10), batch(17, 3)];
        for slices in 1..6 {
            let mut all = Vec::new();
            for part in ShardSlice::all_of(0, slices) {
                let out = slice_rows(&batches, part, 4, None).expect("slice");
                assert!(out.iter().all(|b| b.num_rows() <= 4 && b.num_rows() > 0));
                all.extend(values(&out));
            }
            assert_eq!(all, (0..20).collect::<Vec<_>>(), "slices = {slices}");
        }
    }

    /// A task reading a shard whose rows are all in memory yields to the other tasks on its
    /// thread as it goes, instead of running to the end in one poll.
    #[test]
    fn reading_a_shard_lets_other_tasks_run() {
        use std::sync::atomic::{AtomicBool, Ordering};

        let n = 3 * i64::from(SCAN_BATCHES_PER_YIELD);
        let batches: Vec<RecordBatch> = (0..n).map(|i| batch(i * 8, 8)).collect();
        let schema = batches[0].schema();
        let table = one_shard_table();
        let scan =
            ShardScanExec::try_new(table, schema, None, ShardSlice::all_of(0, 1), Arc::new(OneShard::new(batches)))
                .expect("scan");
        let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let (rows, other_ran_before_the_end) = runtime.block_on(async {
            let reader = tokio::spawn(async move {
                let mut stream = scan.execute(0, Arc::new(TaskContext::default())).expect("execute");
                let (mut rows, mut other) = (0, None);
                let other_ran = Arc::new(AtomicBool::new(false));
                while let Some(batch) = stream.next().await {
                    rows += batch.expect("batch").num_rows();
                    if other.is_none() {
                        // Queued behind this task: it runs only if this task yields.
                        let flag = Arc::clone(&other_ran);
                        other = Some(tokio::spawn(async move { flag.store(true, Ordering::SeqCst) }));
                    }
                }
                let ran = other_ran.load(Ordering::SeqCst);
                if let Some(other) = other {
                    other.await.expect("other task");
                }
                (rows, ran)
            });
            reader.await.expect("reader")
        });
        assert_eq!(rows as i64, n * 8);
        assert!(other_ran_before_the_end, "the reader ran {n} batches without letting another task run");
    }

    /// The slices of a shard read it once per execution: rows inserted between two reads must
    /// not move the rows under the slice boundaries (before, each slice read the shard afresh,
    /// and this shard, one batch longer at each read, lost and repeated rows).
    #[test]
    fn the_slices_of_a_shard_share_one_read() {
        let shard = Arc::new(OneShard::growing(vec![batch(0, 8)], batch(100, 8)));
        let table = one_shard_table();
        let scan = ShardScanExec::try_new(
            table,
            batch(0, 1).schema(),
            None,
            ShardSlice::all_of(0, 2),
            Arc::clone(&shard) as Arc<dyn TableAccess>,
        )
        .expect("scan");
        let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let run = |context: Arc<TaskContext>| {
            runtime.block_on(async {
                let mut rows = Vec::new();
                for partition in 0..2 {
                    let stream = scan.execute(partition, Arc::clone(&context)).expect("execute");
                    let batches: Vec<RecordBatch> = stream.try_collect().await.expect("rows");
                    rows.extend(values(&batches));
                }
                rows
            })
        };
        assert_eq!(run(Arc::new(TaskContext::default())), (0..8).collect::<Vec<_>>());
        assert_eq!(shard.reads_taken.load(std::sync::atomic::Ordering::Relaxed), 1, "one read for both slices");
        // The next execution reads again, and sees the rows added since.
        let mut again = run(Arc::new(TaskContext::default()));
        again.sort_unstable();
        assert_eq!(again, (0..8).chain(100..108).collect::<Vec<_>>());
    }

    #[test]
    fn row_ranges_are_even() {
        let ranges: Vec<_> = ShardSlice::all_of(3, 3).into_iter().map(|p| p.row_range(10)).collect();
        assert_eq!(ranges, [(0, 3), (3, 6), (6, 10)]);
        assert_eq!(ShardSlice { shard: 0, slice: 0, slices: 0 }.row_range(5), (0, 5));
    }
}
