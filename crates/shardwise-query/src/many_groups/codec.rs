//! How a [`ManyGroupsExec`] travels inside a fragment: the aggregation it stands for, as
//! `datafusion-proto` bytes of that `AggregateExec` over an `EmptyExec` with its input's schema (the partial states')
//! (the real input is the extension node's own child).

use std::sync::Arc;

use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion_proto::physical_plan::PhysicalExtensionCodec;

use super::ManyGroupsExec;
use crate::small_groups::codec::{aggregate_from_bytes, aggregate_to_bytes};

/// The encoded node, if `node` is a [`ManyGroupsExec`].
pub fn encode(node: &Arc<dyn ExecutionPlan>, codec: &dyn PhysicalExtensionCodec) -> Result<Option<Vec<u8>>> {
    let Some(exec) = node.downcast_ref::<ManyGroupsExec>() else { return Ok(None) };
    Ok(Some(aggregate_to_bytes(exec.aggregate(), codec)?))
}

/// The node `encode` wrote, over `input`.
pub fn decode(
    buf: &[u8],
    input: Arc<dyn ExecutionPlan>,
    ctx: &TaskContext,
    codec: &dyn PhysicalExtensionCodec,
) -> Result<Arc<dyn ExecutionPlan>> {
    let bad =
        |what: &str| DataFusionError::Plan(format!("not a shardwise fragment ticket: many-group aggregation {what}"));
    let agg = aggregate_from_bytes(buf, input, ctx, codec)?;
    let agg = agg.downcast_ref::<AggregateExec>().ok_or_else(|| bad("is not an aggregation"))?;
    let exec = ManyGroupsExec::try_new(agg).ok_or_else(|| bad("names an aggregation it does not compute"))?;
    Ok(Arc::new(exec))
}
