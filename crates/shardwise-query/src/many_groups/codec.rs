//! How a [`ManyGroupsExec`] travels inside a fragment: the aggregation it stands for, as
//! `datafusion-proto` bytes of that `AggregateExec` over an `EmptyExec` with its input's schema (the partial states')
//! (the real input is the extension node's own child).

use std::sync::Arc;

use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion_proto::bytes::{
    physical_plan_from_bytes_with_extension_codec, physical_plan_to_bytes_with_extension_codec,
};
use datafusion_proto::physical_plan::PhysicalExtensionCodec;

use super::ManyGroupsExec;
use crate::small_groups::with_input;

/// The encoded node, if `node` is a [`ManyGroupsExec`].
pub fn encode(node: &Arc<dyn ExecutionPlan>, codec: &dyn PhysicalExtensionCodec) -> Result<Option<Vec<u8>>> {
    let Some(exec) = node.downcast_ref::<ManyGroupsExec>() else { return Ok(None) };
    let agg = exec.aggregate();
    let placeholder = Arc::new(EmptyExec::new(agg.input().schema()));
    let described = with_input(Arc::clone(agg) as _, placeholder)?;
    Ok(Some(physical_plan_to_bytes_with_extension_codec(described, codec)?.to_vec()))
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
    let described = physical_plan_from_bytes_with_extension_codec(buf, ctx, codec)?;
    let agg = with_input(described, input)?;
    let agg = agg.downcast_ref::<AggregateExec>().ok_or_else(|| bad("is not an aggregation"))?;
    let exec = ManyGroupsExec::try_new(agg).ok_or_else(|| bad("names an aggregation it does not compute"))?;
    Ok(Arc::new(exec))
}
