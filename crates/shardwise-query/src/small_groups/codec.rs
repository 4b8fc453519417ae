//! How a [`SmallGroupsExec`] travels inside a fragment: `max_groups` as a little-endian `u64`,
//! then the aggregation it stands for, as `datafusion-proto` bytes of that `AggregateExec` over
//! an `EmptyExec` with its input's schema (the real input is the extension node's own child).
//! DataFusion's encoding of the aggregate expressions is reused as it is.

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

use super::{SmallGroupsExec, with_input};

/// The encoded node, if `node` is a [`SmallGroupsExec`].
pub fn encode(node: &Arc<dyn ExecutionPlan>, codec: &dyn PhysicalExtensionCodec) -> Result<Option<Vec<u8>>> {
    let Some(exec) = node.downcast_ref::<SmallGroupsExec>() else { return Ok(None) };
    let mut out = (exec.max_groups() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&aggregate_to_bytes(exec.aggregate(), codec)?);
    Ok(Some(out))
}

/// The node `encode` wrote, over `input`.
pub fn decode(
    buf: &[u8],
    input: Arc<dyn ExecutionPlan>,
    ctx: &TaskContext,
    codec: &dyn PhysicalExtensionCodec,
) -> Result<Arc<dyn ExecutionPlan>> {
    let bad =
        |what: &str| DataFusionError::Plan(format!("not a shardwise fragment ticket: small-group aggregation {what}"));
    let (max_groups, rest) = buf.split_first_chunk::<8>().ok_or_else(|| bad("cut short"))?;
    let max_groups = usize::try_from(u64::from_le_bytes(*max_groups)).map_err(|_| bad("max_groups is too large"))?;
    let agg = aggregate_from_bytes(rest, input, ctx, codec)?;
    let agg = agg.downcast_ref::<AggregateExec>().ok_or_else(|| bad("is not an aggregation"))?;
    let exec =
        SmallGroupsExec::try_new(agg, max_groups).ok_or_else(|| bad("names an aggregation it does not compute"))?;
    Ok(Arc::new(exec))
}

/// `agg` as `datafusion-proto` bytes, over an `EmptyExec` with its input's schema (the real input
/// travels as the extension node's child).
pub(crate) fn aggregate_to_bytes(agg: &Arc<AggregateExec>, codec: &dyn PhysicalExtensionCodec) -> Result<Vec<u8>> {
    let placeholder = Arc::new(EmptyExec::new(agg.input().schema()));
    let described = with_input(Arc::clone(agg) as _, placeholder)?;
    Ok(physical_plan_to_bytes_with_extension_codec(described, codec)?.to_vec())
}

/// The plan [`aggregate_to_bytes`] wrote, over `input`.
pub(crate) fn aggregate_from_bytes(
    buf: &[u8],
    input: Arc<dyn ExecutionPlan>,
    ctx: &TaskContext,
    codec: &dyn PhysicalExtensionCodec,
) -> Result<Arc<dyn ExecutionPlan>> {
    with_input(physical_plan_from_bytes_with_extension_codec(buf, ctx, codec)?, input)
}
