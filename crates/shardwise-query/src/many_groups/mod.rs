//! The final step of an aggregation by several keys with many groups (db-benchmark's q10: six
//! keys, ten million rows, nearly as many groups) without DataFusion's general group table.
//!
//! Why: in q10 the partial step passes almost every row through (each is its own group), and the
//! final step's `GroupValuesColumn` did the work: a `perf` profile of the node had its hash table
//! inserts, the table's growth (rehashing and zeroing fresh pages) and the interning of six key
//! columns at well over half the node's CPU, and the query's first answer batch came only when
//! DataFusion in process had finished the whole query. [`ManyGroupsExec`] stands in for a final
//! aggregation (`Final` or `FinalPartitioned`) by two to eight integer or string keys with only
//! `count`, `sum`, `avg`, `min` and `max` ([`merge`]): each key gets dense ids and a row's ids are
//! packed into one 128-bit word ([`packed`]); the rows, with their states, are cut into buckets by
//! the word's hash, and once the input ends each bucket's groups are found with a table that fits
//! the cache ([`radix`]) and its states merged into plain vectors by group. Its answer (same
//! schema, types and nulls) is made a bucket at a time as it is read, so the first batch leaves
//! when the first bucket is merged. On q10 it took 0.82-0.90x the time of DataFusion's step
//! (BENCHMARKS.md).
//!
//! It holds input rows (word and states) where DataFusion holds groups; when groups come in
//! several states each, buckets are merged while input still arrives ([`Compaction`]). Like the
//! small-group aggregation, it cannot
//! spill: when the query's memory limit would be
//! passed, or a key has more values than its share of the 128 bits numbers, it emits the merged
//! states it has and hands them, with the rest of its input, to DataFusion's final aggregation
//! (which spills where it can). [`rewrite`] puts it into a fragment before the fragment is
//! encoded; `many_groups_aggregation = 0` turns it off.

pub mod codec;
mod merge;
mod packed;
mod radix;
mod rule;

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet, RecordOutput,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::{StreamExt, TryStreamExt};

use crate::small_groups::keys::Mapped;
use crate::small_groups::{aggregate_over, hand_over};
use merge::{Merge, MergeKind};
use packed::PackedKeys;
use radix::{BUCKETS, Bucket, Buckets};
pub use rule::rewrite;

/// A final aggregation by several keys with many groups. See the module doc.
#[derive(Debug)]
pub struct ManyGroupsExec {
    /// The final aggregation this computes: its expressions, output schema and properties, and
    /// what runs the input if this operator hands over.
    agg: Arc<AggregateExec>,
    merges: Vec<MergeKind>,
    metrics: ExecutionPlanMetricsSet,
}

impl ManyGroupsExec {
    /// Stands in for `agg`, if it is a final aggregation this operator computes exactly (only
    /// then is `agg` copied).
    pub fn try_new(agg: &AggregateExec) -> Option<Self> {
        let merges = rule::eligible(agg)?;
        Some(ManyGroupsExec { agg: Arc::new(agg.clone()), merges, metrics: ExecutionPlanMetricsSet::new() })
    }

    /// The aggregation this operator stands in for.
    pub fn aggregate(&self) -> &Arc<AggregateExec> {
        &self.agg
    }
}

impl DisplayAs for ManyGroupsExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys: Vec<String> = self.agg.group_expr().expr().iter().map(|(e, name)| format!("{e} as {name}")).collect();
        let aggs: Vec<&str> = self.agg.aggr_expr().iter().map(|a| a.name()).collect();
        write!(f, "ManyGroupsExec: mode={:?}, gby=[{}], aggr=[{}]", self.agg.mode(), keys.join(", "), aggs.join(", "))
    }
}

impl ExecutionPlan for ManyGroupsExec {
    fn name(&self) -> &str {
        "ManyGroupsExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.agg.properties()
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<datafusion::common::tree_node::TreeNodeRecursion>,
    ) -> Result<datafusion::common::tree_node::TreeNodeRecursion> {
        self.agg.apply_expressions(f)
    }

    fn input_distribution_requirements(&self) -> datafusion::physical_plan::InputDistributionRequirements {
        self.agg.input_distribution_requirements()
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![self.agg.input()]
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        let agg = aggregate_over(&self.agg, children, "ManyGroupsExec")?;
        let exec = ManyGroupsExec::try_new(&agg)
            .ok_or_else(|| DataFusionError::Internal("ManyGroupsExec: the new input changed the keys' types".into()))?;
        Ok(Arc::new(exec))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let mut input = self.agg.input().execute(partition, Arc::clone(&context))?;
        let schema = self.agg.schema();
        // The states' schema (`input_schema()` is the partial step's input).
        let input_schema = self.agg.input().schema();
        let key_exprs: Vec<Arc<dyn PhysicalExpr>> =
            self.agg.group_expr().expr().iter().map(|(e, _)| Arc::clone(e)).collect();
        let key_types = key_exprs.iter().map(|e| e.data_type(&input_schema)).collect::<Result<Vec<_>>>()?;
        // The aggregates' state columns follow the keys in the input, in order (`rule::eligible`
        // checked that they fill it).
        let state_types: Vec<DataType> =
            input_schema.fields().iter().skip(key_exprs.len()).map(|f| f.data_type().clone()).collect();
        let internal = |what: &str| DataFusionError::Internal(format!("ManyGroupsExec: {what}"));
        let mut keys = PackedKeys::for_types(&key_types).ok_or_else(|| internal("keys of types it does not take"))?;
        let mut buckets = Buckets::new(&state_types).ok_or_else(|| internal("states of types it does not take"))?;
        let answer = Answer {
            merges: self.merges.clone(),
            batch_rows: context.session_config().batch_size().max(1),
            key_columns: key_exprs.len(),
        };
        let fallback_plan = Arc::clone(&self.agg);
        let reservation = MemoryConsumer::new(format!("ManyGroupsExec[{partition}]")).register(context.memory_pool());
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let handed_over = MetricBuilder::new(&self.metrics).counter("handed_over_rows", partition);
        let compacted = MetricBuilder::new(&self.metrics).counter("compacted_rows", partition);
        let mut compaction = Compaction::new();
        let stream_schema = Arc::clone(&schema);
        let run = async move {
            let mut words = Vec::new();
            while let Some(batch) = input.next().await {
                let batch = batch?;
                let timer = baseline.elapsed_compute().timer();
                let key_arrays = key_exprs
                    .iter()
                    .map(|e| e.evaluate(&batch)?.into_array(batch.num_rows()))
                    .collect::<Result<Vec<_>>>()?;
                let full = keys.pack(&key_arrays, &mut words)? == Mapped::Full;
                if !full {
                    let states =
                        batch.columns().get(key_exprs.len()..).ok_or_else(|| internal("a batch without states"))?;
                    buckets.push(&words, states)?;
                    compaction.run(&answer, &mut buckets, &compacted)?;
                }
                let held = keys.size() + buckets.size() + words.capacity() * 16;
                let out_of_memory = !full && reservation.try_resize(held).is_err();
                if full || out_of_memory {
                    // The merged states so far, then the rest of the input (from this batch on
                    // if it was not taken), through DataFusion's final aggregation.
                    let head = answer.states(&input_schema, &keys, &key_types, buckets)?;
                    timer.done();
                    drop(reservation);
                    let pending = full.then_some(batch);
                    return hand_over(&fallback_plan, head, pending, input, &handed_over, context);
                }
                timer.done();
            }
            answer.stream(schema, keys, buckets, reservation, baseline)
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(stream_schema, futures::stream::once(run).try_flatten())))
    }
}

/// Rows a bucket holds before it is first compacted.
pub const COMPACT_MIN_ROWS: usize = 1 << 12;

/// When buckets are merged while input still arrives, so that the rows held stay near the
/// number of groups when each group comes in many states (a shuffle's merge of several shards,
/// a final step whose partial step passed rows through): a bucket is compacted (its rows merged
/// into one per group) when it holds twice the rows it had after its last compaction, and at
/// least [`COMPACT_MIN_ROWS`]. When a compaction saves less than a quarter of its rows (nearly
/// every row its own group, as in q10), there is nothing to gain and it stops for good.
#[derive(Debug)]
struct Compaction {
    /// The rows at which each bucket is compacted next.
    at: Vec<usize>,
    on: bool,
}

impl Compaction {
    fn new() -> Self {
        Compaction { at: vec![COMPACT_MIN_ROWS; BUCKETS], on: true }
    }

    /// Compacts the buckets that are due; the rows it removed count in `compacted`.
    fn run(&mut self, answer: &Answer, buckets: &mut Buckets, compacted: &Count) -> Result<()> {
        for b in 0..BUCKETS {
            if !self.on {
                return Ok(());
            }
            let rows = buckets.rows(b);
            if rows < self.at[b] {
                continue;
            }
            let bucket = buckets.take(b)?;
            let groups = bucket.words.len();
            let merges = answer.merged(&bucket)?;
            let mut states = Vec::new();
            for merge in &merges {
                states.extend(merge.states(0..groups)?);
            }
            // Every word of bucket `b` hashes to `b` again.
            buckets.push(&bucket.words, &states)?;
            compacted.add(rows - groups);
            self.at[b] = (2 * groups).max(COMPACT_MIN_ROWS);
            self.on = 4 * groups <= 3 * rows;
        }
        Ok(())
    }
}

/// What a bucket's groups become.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Emit {
    /// The answer: keys and final values.
    Final,
    /// Partial states, as the input carries them (for DataFusion's final step).
    States,
}

/// How one partition's buckets become batches.
#[derive(Debug)]
struct Answer {
    merges: Vec<MergeKind>,
    batch_rows: usize,
    key_columns: usize,
}

impl Answer {
    /// The answer, a bucket at a time as the consumer asks for it (a group lives in one bucket,
    /// so each bucket's groups are final on their own). A bucket's full batches leave as they
    /// are; its last, short one waits to be joined with the next buckets' (so that a small answer
    /// does not leave as 64 small batches, and a large one is not copied again). `reservation`
    /// covers what is still held: it keeps the whole input-end size while a bucket is answered
    /// (the taken bucket's memory covers its answering temporaries), then shrinks to the keys,
    /// the buckets not yet answered and the short batches waiting to be joined. Batches that
    /// have left are the consumer's to count.
    fn stream(
        self,
        schema: SchemaRef,
        keys: PackedKeys,
        mut buckets: Buckets,
        reservation: MemoryReservation,
        baseline: BaselineMetrics,
    ) -> Result<SendableRecordBatchStream> {
        let out_key_types: Vec<DataType> =
            schema.fields().iter().take(self.key_columns).map(|f| f.data_type().clone()).collect();
        let dictionaries = keys.dictionaries(&out_key_types)?;
        let out = Arc::clone(&schema);
        let mut pending: Vec<RecordBatch> = Vec::new();
        let batches = futures::stream::iter(0..BUCKETS).map(move |b| {
            let _timer = baseline.elapsed_compute().timer();
            let mut ready = Vec::new();
            for batch in self.bucket(buckets.take(b)?, &keys, &dictionaries, &out, Emit::Final)? {
                match batch.num_rows() == self.batch_rows {
                    true => ready.push(batch),
                    false => pending.push(batch),
                }
            }
            let last = b + 1 == BUCKETS;
            while pending.iter().map(RecordBatch::num_rows).sum::<usize>() >= self.batch_rows || last {
                let (batch, rest) = self.take_batch(&out, std::mem::take(&mut pending))?;
                pending = rest;
                match batch {
                    Some(batch) => ready.push(batch),
                    None => break,
                }
            }
            let pending_bytes: usize = pending.iter().map(RecordBatch::get_array_memory_size).sum();
            reservation.resize(keys.size() + buckets.size() + pending_bytes);
            ready.iter().for_each(|b| _ = b.record_output(&baseline));
            if last {
                baseline.done();
            }
            Ok::<_, DataFusionError>(futures::stream::iter(ready.into_iter().map(Ok)))
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, batches.try_flatten())))
    }

    /// Every bucket's groups as partial states, in batches of `input_schema` (the keys, then the
    /// states, as the input carries them), for DataFusion's final step.
    fn states(
        &self,
        input_schema: &SchemaRef,
        keys: &PackedKeys,
        key_types: &[DataType],
        mut buckets: Buckets,
    ) -> Result<Vec<RecordBatch>> {
        let dictionaries = keys.dictionaries(key_types)?;
        let mut batches = Vec::new();
        for b in 0..BUCKETS {
            batches.extend(self.bucket(buckets.take(b)?, keys, &dictionaries, input_schema, Emit::States)?);
        }
        Ok(batches)
    }

    /// The first `batch_rows` rows of `pending` as one batch (all of them if fewer), and the
    /// batches left; `None` when `pending` is empty.
    fn take_batch(
        &self,
        schema: &SchemaRef,
        pending: Vec<RecordBatch>,
    ) -> Result<(Option<RecordBatch>, Vec<RecordBatch>)> {
        let mut taken = Vec::new();
        let mut rows = 0;
        let mut rest = Vec::new();
        for batch in pending {
            let room = self.batch_rows - rows;
            if room == 0 {
                rest.push(batch);
            } else if batch.num_rows() <= room {
                rows += batch.num_rows();
                taken.push(batch);
            } else {
                taken.push(batch.slice(0, room));
                rest.push(batch.slice(room, batch.num_rows() - room));
                rows += room;
            }
        }
        Ok(match taken.len() {
            0 => (None, rest),
            1 => (taken.pop(), rest),
            _ => (Some(concat_batches(schema, &taken)?), rest),
        })
    }

    /// Each aggregate's states of `bucket`'s rows, merged by group.
    fn merged(&self, bucket: &Bucket) -> Result<Vec<Merge>> {
        let groups = bucket.words.len();
        let mut merges: Vec<Merge> = self.merges.iter().map(|k| Merge::new(*k)).collect();
        let mut at = 0;
        for (merge, kind) in merges.iter_mut().zip(&self.merges) {
            let columns = kind.state_columns();
            let states = bucket.states.get(at..at + columns).ok_or_else(|| {
                DataFusionError::Internal("ManyGroupsExec: fewer state columns than aggregates need".into())
            })?;
            merge.update(&bucket.ids, groups, states)?;
            at += columns;
        }
        Ok(merges)
    }

    /// The groups of `bucket`, merged, in batches of at most `batch_rows` rows of `schema`.
    fn bucket(
        &self,
        bucket: Bucket,
        keys: &PackedKeys,
        dictionaries: &[ArrayRef],
        schema: &SchemaRef,
        emit: Emit,
    ) -> Result<Vec<RecordBatch>> {
        let groups = bucket.words.len();
        let merges = self.merged(&bucket)?;
        (0..groups)
            .step_by(self.batch_rows)
            .map(|start| {
                let range = start..(start + self.batch_rows).min(groups);
                let mut columns = keys.emit(&bucket.words[range.clone()], dictionaries)?;
                for merge in &merges {
                    match emit {
                        Emit::Final => columns.push(merge.evaluate(range.clone())?),
                        Emit::States => columns.extend(merge.states(range.clone())?),
                    }
                }
                Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
