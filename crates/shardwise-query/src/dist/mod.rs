//! Distributed execution of queries over sharded tables.
//!
//! DataFusion plans every query as if it ran on one node, over a leaf ([`ShardScanExec`]) whose
//! partitions are slices of the table's shards. [`DistributeRule`], the last physical optimizer
//! rule, then cuts the plan where rows must leave the shards and puts a [`FragmentExec`] there:
//! the subtree below it is serialized ([`codec`]) and run by a replica of each shard, local or
//! remote, and its rows flow back into the rest of the plan on the initiator. The settings that
//! steer the cut (`distributed_group_by_no_merge`, `optimize_distributed_group_by_sharding_key`,
//! `distributed_aggregation`, `load_balancing`, `skip_unavailable_shards`) are documented in docs/distributed-queries.md.

/// The `ExecutionPlan` methods shardwise's plan nodes share: a name, cached properties in
/// `self.cache`, and no expressions of their own. `leaf` nodes also have no children.
macro_rules! plan_node_methods {
    ($name:literal) => {
        fn name(&self) -> &str {
            $name
        }

        fn properties(&self) -> &std::sync::Arc<datafusion::physical_plan::PlanProperties> {
            &self.cache
        }

        fn apply_expressions(
            &self,
            _f: &mut dyn FnMut(
                &std::sync::Arc<dyn datafusion::physical_expr::PhysicalExpr>,
            ) -> datafusion::error::Result<datafusion::common::tree_node::TreeNodeRecursion>,
        ) -> datafusion::error::Result<datafusion::common::tree_node::TreeNodeRecursion> {
            Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
        }
    };
    ($name:literal, leaf) => {
        plan_node_methods!($name);

        fn children(&self) -> Vec<&std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
            vec![]
        }

        fn with_new_children(
            self: std::sync::Arc<Self>,
            children: Vec<std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>>,
        ) -> datafusion::error::Result<std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
            if !children.is_empty() {
                return Err(datafusion::error::DataFusionError::Internal(format!("{} has no children", $name)));
            }
            Ok(self)
        }
    };
}

pub mod codec;
pub mod estimate;
pub mod fragment;
mod local_shuffle;
pub mod planner;
pub mod query_order;
mod received;
mod remote_start;
pub mod scan;
mod shard_reads;
pub mod shuffle;
#[cfg(test)]
pub(crate) mod test_access;

pub use codec::{FragmentTicket, LeafAssignment, ShardwiseCodec};
pub use estimate::{GroupEstimate, TableSample};
pub use fragment::{FragmentExec, Strategy, StrategyKind, decode_fragment_ticket, execute_merged};
pub(crate) use local_shuffle::LocalShuffle;
pub use planner::DistributeRule;
pub use scan::{ShardScanExec, ShardSlice, ShardTableRef};
pub use shuffle::{ExchangeRegistry, ShuffleReaderExec, is_shuffle_ticket};

/// `batch`'s columns under `schema`, the exact schema of the plan that made them (field
/// metadata does not survive every transport). Keeps the row count of a batch without columns
/// (`SELECT count(*) FROM (SELECT DISTINCT k ..)` ships those from a no-merge fragment).
pub(crate) fn with_schema(
    schema: &datafusion::arrow::datatypes::SchemaRef,
    batch: &datafusion::arrow::record_batch::RecordBatch,
) -> datafusion::error::Result<datafusion::arrow::record_batch::RecordBatch> {
    use datafusion::arrow::record_batch::{RecordBatch, RecordBatchOptions};
    let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    Ok(RecordBatch::try_new_with_options(std::sync::Arc::clone(schema), batch.columns().to_vec(), &options)?)
}
