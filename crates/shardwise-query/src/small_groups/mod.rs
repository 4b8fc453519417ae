//! Partial aggregation by keys with few values (db-benchmark's q1 and q4: 100 groups over
//! 10 million rows; q2 and q9: two keys, 10 000 groups) without DataFusion's general machinery.
//!
//! DataFusion's partial `AggregateExec` hashes every row's key into its group table and then runs
//! each aggregate's accumulator over the batch; on q4, a profile had 48% of a node's CPU in
//! interning 100 integer keys and 29% in the `avg` accumulators. [`SmallGroupsExec`] stands in
//! for a partial aggregation with one to four integer or string keys and only `count`, `sum`,
//! `avg`, `min`, `max` (see [`accum`]), `corr`, the variances and `median` (see [`stats`]):
//! integer keys index a direct-mapped window instead of a hash table ([`keys`]), string keys a
//! short-key cache in front of one ([`byte_keys`]), several keys' ids index a table of pairs
//! ([`composite`]), and each aggregate adds into plain vectors by group id. It emits the same partial
//! states as DataFusion (same schema, types and nulls), so the final aggregation above it, on
//! this node or the initiator, is DataFusion's, unchanged.
//!
//! It is for few groups: past `max_groups` (the `small_group_aggregation_max_groups` setting),
//! when nearly every row makes a group, or when the query's memory limit would be passed (it
//! cannot spill), it emits the states it has and hands the rest of its input to DataFusion's
//! aggregation, which is what a partial step may do (the final step merges a group's states
//! from any number of rows). [`rewrite`] puts it into a fragment before the
//! fragment is encoded; `small_group_aggregation = 0` turns it off.

pub(crate) mod accum;
mod byte_keys;
pub mod codec;
mod composite;
pub(crate) mod keys;
mod rule;
mod stats;
mod view_table;

use std::fmt;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::execution_plan::{
    Boundedness, ChildrenPropertiesMode, EmissionType, ReplaceChildrenOptions,
};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet, RecordOutput,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties};
use futures::{StreamExt, TryStreamExt};

use crate::group_topk::chunks;
use accum::{Accum, AccumKind};
use composite::KeySet;
use keys::Mapped;
pub(crate) use rule::plain_grouping;
pub use rule::rewrite;

/// Past this many rows read, a partition whose keys made more than
/// [`HANDOVER_GROUPS_PER_ROW`] groups per row read hands over to DataFusion's aggregation (which
/// then skips partial aggregation as it sees fit): nearly every key is new, and the window and
/// vectors would only grow.
pub const HANDOVER_PROBE_ROWS: usize = 1 << 17;
pub const HANDOVER_GROUPS_PER_ROW: f64 = 0.8;

/// A partial aggregation by keys with few values. See the module doc.
#[derive(Debug)]
pub struct SmallGroupsExec {
    /// The partial aggregation this computes: its expressions, output schema and properties,
    /// and what runs the input past `max_groups`.
    agg: Arc<AggregateExec>,
    accums: Vec<AccumKind>,
    max_groups: usize,
    metrics: ExecutionPlanMetricsSet,
}

impl SmallGroupsExec {
    /// Stands in for `agg`, if it is a partial aggregation this operator computes exactly (only
    /// then is `agg` copied).
    pub fn try_new(agg: &AggregateExec, max_groups: usize) -> Option<Self> {
        let accums = rule::eligible(agg)?;
        let agg = Arc::new(agg.clone());
        Some(SmallGroupsExec { agg, accums, max_groups: max_groups.max(1), metrics: ExecutionPlanMetricsSet::new() })
    }

    /// The aggregation this operator stands in for.
    pub fn aggregate(&self) -> &Arc<AggregateExec> {
        &self.agg
    }

    pub fn max_groups(&self) -> usize {
        self.max_groups
    }
}

impl DisplayAs for SmallGroupsExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys: Vec<String> = self.agg.group_expr().expr().iter().map(|(e, name)| format!("{e} as {name}")).collect();
        let aggs: Vec<&str> = self.agg.aggr_expr().iter().map(|a| a.name()).collect();
        write!(
            f,
            "SmallGroupsExec: mode=Partial, gby=[{}], aggr=[{}], max_groups={}",
            keys.join(", "),
            aggs.join(", "),
            self.max_groups
        )
    }
}

impl ExecutionPlan for SmallGroupsExec {
    fn name(&self) -> &str {
        "SmallGroupsExec"
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

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![self.agg.input()]
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        let agg = aggregate_over(&self.agg, children, "SmallGroupsExec")?;
        let exec = SmallGroupsExec::try_new(&agg, self.max_groups)
            .ok_or_else(|| DataFusionError::Internal("SmallGroupsExec: the new input changed the key's type".into()))?;
        Ok(Arc::new(exec))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let mut input = self.agg.input().execute(partition, Arc::clone(&context))?;
        let schema = self.agg.schema();
        let input_schema = self.agg.input_schema();
        let key_exprs: Vec<Arc<dyn PhysicalExpr>> =
            self.agg.group_expr().expr().iter().map(|(e, _)| Arc::clone(e)).collect();
        let key_types = key_exprs.iter().map(|e| e.data_type(&input_schema)).collect::<Result<Vec<_>>>()?;
        // Each aggregate's arguments, a cast that only widens an integer column peeled off.
        let args: Vec<Vec<Arc<dyn PhysicalExpr>>> = self
            .agg
            .aggr_expr()
            .iter()
            .zip(&self.accums)
            .map(|(a, kind)| {
                let args = a.expressions();
                args.iter()
                    .map(|arg| accum::widened_from(*kind, arg, &input_schema).unwrap_or_else(|| Arc::clone(arg)))
                    .collect()
            })
            .collect();
        let mut keys = KeySet::for_types(&key_types)
            .ok_or_else(|| DataFusionError::Internal(format!("SmallGroupsExec: keys of types {key_types:?}")))?;
        let mut accums: Vec<Accum> = self.accums.iter().map(|k| Accum::new(*k)).collect();
        let max_groups = self.max_groups;
        let fallback_plan = Arc::clone(&self.agg);
        let reservation = MemoryConsumer::new(format!("SmallGroupsExec[{partition}]")).register(context.memory_pool());
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let handed_over = MetricBuilder::new(&self.metrics).counter("handed_over_rows", partition);
        let batch_rows = context.session_config().batch_size().max(1);
        let out_schema = Arc::clone(&schema);
        let run = async move {
            let mut ids = Vec::new();
            // Each group's rows, for the aggregates that need counts (theirs is this less their
            // null rows); not counted when none does.
            let mut rows: Vec<u64> = Vec::new();
            let need_row_counts = accums.iter().any(Accum::needs_row_counts);
            let mut read_rows = 0usize;
            while let Some(batch) = input.next().await {
                let batch = batch?;
                let timer = baseline.elapsed_compute().timer();
                let key_arrays = key_exprs
                    .iter()
                    .map(|e| e.evaluate(&batch)?.into_array(batch.num_rows()))
                    .collect::<Result<Vec<_>>>()?;
                let before = keys.len();
                let full = keys.map(&key_arrays, max_groups, &mut ids)? == Mapped::Full;
                if !full {
                    if need_row_counts {
                        accum::count_rows(&mut rows, &ids, keys.len());
                    }
                    for (accum, args) in accums.iter_mut().zip(&args) {
                        let values = args.iter().map(|a| a.evaluate(&batch)).collect::<Result<Vec<_>>>()?;
                        accum.update(&ids, keys.len(), values)?;
                    }
                    read_rows += batch.num_rows();
                }
                // Nearly a group per row: the keys have too many values for this operator.
                let scattered =
                    read_rows >= HANDOVER_PROBE_ROWS && keys.len() as f64 > HANDOVER_GROUPS_PER_ROW * read_rows as f64;
                // Past the query's memory limit: DataFusion's aggregation can spill, this cannot.
                let held = keys.size() + rows.capacity() * 8 + accums.iter().map(Accum::size).sum::<usize>();
                let out_of_memory = !full && reservation.try_resize(held).is_err();
                if full || scattered || out_of_memory {
                    // What this operator has so far, then DataFusion's aggregation over the
                    // rest (from this batch on if it did not take it).
                    let (head, pending) = match full {
                        true => (states(&schema, batch_rows, &keys, &accums, &rows, before)?, Some(batch)),
                        false => (states(&schema, batch_rows, &keys, &accums, &rows, keys.len())?, None),
                    };
                    timer.done();
                    drop(reservation);
                    head.iter().for_each(|b| _ = b.record_output(&baseline));
                    let tail = hand_over(&fallback_plan, Vec::new(), pending, input, &handed_over, context)?;
                    return Ok::<_, DataFusionError>(
                        futures::stream::iter(head.into_iter().map(Ok)).chain(tail).boxed(),
                    );
                }
                timer.done();
            }
            let out = {
                let _timer = baseline.elapsed_compute().timer();
                states(&schema, batch_rows, &keys, &accums, &rows, keys.len())?
            };
            out.iter().for_each(|b| _ = b.record_output(&baseline));
            baseline.done();
            drop(reservation);
            Ok(futures::stream::iter(out.into_iter().map(Ok)).boxed())
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(out_schema, futures::stream::once(run).try_flatten())))
    }
}

/// The partial states of the first `groups` groups, in batches of at most `batch_rows` rows.
fn states(
    schema: &SchemaRef,
    batch_rows: usize,
    keys: &KeySet,
    accums: &[Accum],
    rows: &[u64],
    groups: usize,
) -> Result<Vec<RecordBatch>> {
    if groups == 0 {
        return Ok(Vec::new());
    }
    let key_types: Vec<DataType> = schema.fields().iter().take(keys.width()).map(|f| f.data_type().clone()).collect();
    let mut columns: Vec<ArrayRef> = keys.emit(groups, &key_types)?;
    for accum in accums {
        columns.extend(accum.emit(groups, rows)?);
    }
    Ok(chunks(RecordBatch::try_new(Arc::clone(schema), columns)?, batch_rows))
}

/// DataFusion's aggregation `plan` run over `head`, then `pending`, then the rest of `input`
/// (an operator handing over part-way); the rows after `head` count in `handed_over`.
pub(crate) fn hand_over(
    plan: &Arc<AggregateExec>,
    head: Vec<RecordBatch>,
    pending: Option<RecordBatch>,
    input: SendableRecordBatchStream,
    handed_over: &Count,
    context: Arc<TaskContext>,
) -> Result<SendableRecordBatchStream> {
    let schema = input.schema();
    let rows = handed_over.clone();
    let rest = futures::stream::iter(pending.map(Ok)).chain(input).inspect(move |b| {
        if let Ok(b) = b {
            rows.add(b.num_rows());
        }
    });
    let replayed = futures::stream::iter(head.into_iter().map(Ok)).chain(rest);
    let stream = Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&schema), replayed));
    let replay = Arc::new(ReplayExec::new(schema, stream));
    with_input(Arc::clone(plan) as _, replay)?.execute(0, context)
}

/// The aggregation `agg` over the one plan in `children` instead: the `with_new_children` of an
/// operator (named `operator` in errors) that stands in for `agg`.
pub(crate) fn aggregate_over(
    agg: &Arc<AggregateExec>,
    children: Vec<Arc<dyn ExecutionPlan>>,
    operator: &str,
) -> Result<AggregateExec> {
    let [input] = <[_; 1]>::try_from(children)
        .map_err(|c| DataFusionError::Internal(format!("{operator} takes one child, got {}", c.len())))?;
    let plan = with_input(Arc::clone(agg) as _, input)?;
    plan.downcast_ref::<AggregateExec>()
        .cloned()
        .ok_or_else(|| DataFusionError::Internal(format!("{operator}: the aggregation changed kind")))
}

/// `plan` (one child) over `input` instead, its properties recomputed.
pub(crate) fn with_input(
    plan: Arc<dyn ExecutionPlan>,
    input: Arc<dyn ExecutionPlan>,
) -> Result<Arc<dyn ExecutionPlan>> {
    plan.replace_children(vec![input], ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute))
}

/// Plays back a stream already started, as the input of DataFusion's aggregation when
/// an operator hands over ([`hand_over`]): one partition, executable once.
struct ReplayExec {
    stream: Mutex<Option<SendableRecordBatchStream>>,
    cache: Arc<PlanProperties>,
}

impl fmt::Debug for ReplayExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplayExec").finish_non_exhaustive()
    }
}

impl ReplayExec {
    fn new(schema: SchemaRef, stream: SendableRecordBatchStream) -> Self {
        let cache = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        ReplayExec { stream: Mutex::new(Some(stream)), cache }
    }
}

impl DisplayAs for ReplayExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ReplayExec")
    }
}

impl ExecutionPlan for ReplayExec {
    fn name(&self) -> &str {
        "ReplayExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.cache
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<datafusion::common::tree_node::TreeNodeRecursion>,
    ) -> Result<datafusion::common::tree_node::TreeNodeRecursion> {
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        match children.is_empty() {
            true => Ok(self),
            false => Err(DataFusionError::Internal("ReplayExec has no children".into())),
        }
    }

    fn execute(&self, partition: usize, _context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let taken = self.stream.lock().ok().and_then(|mut s| s.take());
        match (partition, taken) {
            (0, Some(stream)) => Ok(stream),
            _ => Err(DataFusionError::Internal(format!("ReplayExec: partition {partition} was already played"))),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
