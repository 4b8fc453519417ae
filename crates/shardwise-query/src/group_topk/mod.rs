//! Top-N per group: `row_number() OVER (PARTITION BY k ORDER BY v) <= N` without sorting the
//! table (db-benchmark's q8, "the two largest v3 per id6").
//!
//! DataFusion 55 sorts the whole input for the window, then filters. [`GroupTopKRule`] finds
//! the pattern and puts [`GroupTopKExec`] in place of the sort: it interns partition keys with
//! the aggregation hash table and copies admitted rows once per batch ([`state`]). It comes in
//! two steps:
//! - **partial**, per input partition, below the exchange that brings a group's rows together:
//!   the best N rows of each group in that partition are a superset of the group's best N that
//!   came from there, so only those cross the exchange (and, in a distributed plan, the network);
//!   when, past its first [`PARTIAL_MIN_ROWS`] rows, it still keeps most rows it has read
//!   (nearly every key new), it stops and passes rows on;
//! - **final**, per group-partitioned output partition, which emits the rows sorted by partition
//!   keys then ORDER BY keys, as the window above expects.
//!
//! `RANK()` keeps ties at the boundary and is left to DataFusion (a full sort, or its
//! `PartitionedTopKExec` if a user turns `datafusion.optimizer.enable_window_topn` on).

pub mod codec;
mod fast_key;
mod flat;
mod keys;
mod row_number;
mod rule;
mod state;

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::Result;
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{LexOrdering, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet, RecordOutput,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
};
use futures::{StreamExt, TryStreamExt};

/// How many rows ahead a lookup's slot is fetched into the cache.
const PREFETCH_ROWS_AHEAD: usize = 32;

/// Asks the CPU to bring `value`'s cache line in (a hint; it changes nothing else).
#[inline]
fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint that never faults and writes nothing; the pointer comes
    // from a reference.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>((value as *const T).cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

/// A seeded xorshift generator for the tests' random inputs (reproducible, no dependency).
#[cfg(test)]
fn test_rng(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}

pub use row_number::RowNumberExec;
pub use rule::GroupTopKRule;
pub use state::TopKState;

/// A partial step judges whether it reduces anything once it has read this many rows (before,
/// heaps are still filling and keep nearly every row), and again every [`PARTIAL_WINDOW_ROWS`].
pub const PARTIAL_MIN_ROWS: usize = 1 << 20;
pub const PARTIAL_WINDOW_ROWS: usize = 1 << 18;
/// A partial step that keeps more than this share of the rows it has read gives up and passes
/// rows through: nearly every key is new, and the final step does the work anyway.
pub const PARTIAL_MAX_KEPT_SHARE: f64 = 0.5;

/// Which step of a two-step top-N per group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopKStep {
    /// Per input partition, before the exchange; may give up and pass rows through.
    Partial,
    /// Over partitions holding whole groups; emits sorted rows.
    Final,
}

/// Keeps the first `fetch` rows of each partition key by the ORDER BY keys. See the module doc.
#[derive(Debug)]
pub struct GroupTopKExec {
    input: Arc<dyn ExecutionPlan>,
    /// Partition keys (the first `partition_len`), then ORDER BY keys.
    ordering: LexOrdering,
    partition_len: usize,
    fetch: usize,
    step: TopKStep,
    metrics: ExecutionPlanMetricsSet,
    cache: Arc<PlanProperties>,
}

impl GroupTopKExec {
    pub fn try_new(
        input: Arc<dyn ExecutionPlan>,
        ordering: LexOrdering,
        partition_len: usize,
        fetch: usize,
        step: TopKStep,
    ) -> Result<Self> {
        let mut eq = input.equivalence_properties().clone();
        match step {
            TopKStep::Final => {
                eq.reorder(ordering.clone())?;
            }
            TopKStep::Partial => eq.clear_orderings(),
        }
        let cache = Arc::new(PlanProperties::new(
            eq,
            input.output_partitioning().clone(),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Ok(GroupTopKExec {
            input,
            ordering,
            partition_len,
            fetch,
            step,
            metrics: ExecutionPlanMetricsSet::new(),
            cache,
        })
    }

    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }

    pub fn ordering(&self) -> &LexOrdering {
        &self.ordering
    }

    pub fn partition_len(&self) -> usize {
        self.partition_len
    }

    pub fn fetch(&self) -> usize {
        self.fetch
    }

    pub fn step(&self) -> TopKStep {
        self.step
    }

    fn partition_exprs(&self) -> Vec<Arc<dyn PhysicalExpr>> {
        self.ordering.iter().take(self.partition_len).map(|e| Arc::clone(&e.expr)).collect()
    }
}

impl DisplayAs for GroupTopKExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys: Vec<String> = self.partition_exprs().iter().map(|e| e.to_string()).collect();
        let order: Vec<String> = self.ordering.iter().skip(self.partition_len).map(|e| e.to_string()).collect();
        let step = match self.step {
            TopKStep::Partial => "partial",
            TopKStep::Final => "final",
        };
        write!(
            f,
            "GroupTopKExec: step={step}, fetch={}, partition=[{}], order=[{}]",
            self.fetch,
            keys.join(", "),
            order.join(", ")
        )
    }
}

impl ExecutionPlan for GroupTopKExec {
    fn name(&self) -> &str {
        "GroupTopKExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.cache
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<datafusion::common::tree_node::TreeNodeRecursion>,
    ) -> Result<datafusion::common::tree_node::TreeNodeRecursion> {
        use datafusion::common::tree_node::TreeNodeIterator;
        self.ordering.iter().apply_until_stop(|e| f(&e.expr))
    }

    #[allow(deprecated)] // DataFusion 55 derives the new requirement API from this one.
    fn required_input_distribution(&self) -> Vec<Distribution> {
        match self.step {
            TopKStep::Final => vec![Distribution::KeyPartitioned(self.partition_exprs())],
            TopKStep::Partial => vec![Distribution::UnspecifiedDistribution],
        }
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        let [input] = <[_; 1]>::try_from(children).map_err(|c| {
            datafusion::error::DataFusionError::Internal(format!("GroupTopKExec takes one child, got {}", c.len()))
        })?;
        Ok(Arc::new(GroupTopKExec::try_new(input, self.ordering.clone(), self.partition_len, self.fetch, self.step)?))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let mut input = self.input.execute(partition, Arc::clone(&context))?;
        let schema: SchemaRef = input.schema();
        let mut state = TopKState::try_new(Arc::clone(&schema), &self.ordering, self.partition_len, self.fetch)?;
        let reservation = MemoryConsumer::new(format!("GroupTopKExec[{partition}]")).register(context.memory_pool());
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let passed_through = MetricBuilder::new(&self.metrics).counter("passed_through_rows", partition);
        let batch_rows = context.session_config().batch_size().max(1);
        let step = self.step;
        let out_schema = Arc::clone(&schema);
        let kept = async move {
            let mut read_rows = 0usize;
            let mut judged_at = 0usize;
            while let Some(batch) = input.next().await {
                let batch = batch?;
                read_rows += batch.num_rows();
                {
                    let _timer = baseline.elapsed_compute().timer();
                    state.insert(&batch)?;
                }
                reservation.try_resize(state.size())?;
                if step != TopKStep::Partial
                    || read_rows < PARTIAL_MIN_ROWS
                    || read_rows - judged_at < PARTIAL_WINDOW_ROWS
                {
                    continue;
                }
                judged_at = read_rows;
                if state.live_rows() as f64 > PARTIAL_MAX_KEPT_SHARE * read_rows as f64 {
                    let kept = state.finish()?;
                    let head = chunks(kept, batch_rows);
                    head.iter().for_each(|b| _ = b.record_output(&baseline));
                    let head = futures::stream::iter(head.into_iter().map(Ok));
                    let rest = input.map(move |b| {
                        if let Ok(b) = &b {
                            _ = b.record_output(&baseline);
                            passed_through.add(b.num_rows());
                        }
                        b
                    });
                    drop(reservation);
                    return Ok::<_, datafusion::error::DataFusionError>(head.chain(rest).boxed());
                }
            }
            let kept = {
                let _timer = baseline.elapsed_compute().timer();
                state.finish()?
            };
            let kept = chunks(kept, batch_rows);
            kept.iter().for_each(|b| _ = b.record_output(&baseline));
            baseline.done();
            drop(reservation);
            Ok(futures::stream::iter(kept.into_iter().map(Ok)).boxed())
        };
        let stream = futures::stream::once(kept).try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(out_schema, stream)))
    }
}

/// `batch` cut into batches of at most `rows` rows (zero-copy).
pub(crate) fn chunks(batch: RecordBatch, rows: usize) -> Vec<RecordBatch> {
    let total = batch.num_rows();
    if total == 0 {
        return Vec::new();
    }
    (0..total).step_by(rows).map(|at| batch.slice(at, rows.min(total - at))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::compute::SortOptions;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::catalog::memory::MemorySourceConfig;
    use datafusion::physical_expr::PhysicalSortExpr;
    use datafusion::physical_expr::expressions::col;
    use datafusion::physical_plan::collect;

    /// `rows` rows of (g, v) with g = i % groups, in batches of 8192.
    async fn run_partial(rows: i64, groups: i64) -> (usize, usize) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("g", DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
        ]));
        let batches: Vec<RecordBatch> = (0..rows)
            .step_by(8192)
            .map(|at| {
                let ids = at..(at + 8192).min(rows);
                let g = Int64Array::from_iter_values(ids.clone().map(|i| i % groups));
                let v = Int64Array::from_iter_values(ids);
                RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(g), Arc::new(v)]).expect("batch")
            })
            .collect();
        let input = MemorySourceConfig::try_new_exec(&[batches], Arc::clone(&schema), None).expect("source");
        let ordering = LexOrdering::new([
            PhysicalSortExpr::new_default(col("g", &schema).expect("g")),
            PhysicalSortExpr::new(col("v", &schema).expect("v"), SortOptions { descending: true, nulls_first: true }),
        ])
        .expect("ordering");
        let exec = Arc::new(GroupTopKExec::try_new(input, ordering, 1, 2, TopKStep::Partial).expect("exec"));
        let out =
            collect(Arc::clone(&exec) as Arc<dyn ExecutionPlan>, Arc::new(TaskContext::default())).await.expect("run");
        let rows = out.iter().map(RecordBatch::num_rows).sum();
        let passed = exec.metrics().and_then(|m| m.sum_by_name("passed_through_rows")).map_or(0, |v| v.as_usize());
        (rows, passed)
    }

    #[tokio::test]
    async fn a_partial_step_filters_few_keys_and_passes_distinct_ones_through() {
        // 100 keys: the best 2 of each, nothing passed through.
        assert_eq!(run_partial(1_500_000, 100).await, (200, 0));
        // Every key distinct: past PARTIAL_MIN_ROWS the step gives up and passes the rest on.
        let (rows, passed) = run_partial(1_500_000, i64::MAX).await;
        assert_eq!(rows, 1_500_000);
        assert!(passed > 0 && passed <= 1_500_000 - PARTIAL_MIN_ROWS, "{passed}");
    }
}
