//! How top-N-per-group nodes travel inside a fragment: one kind byte, the step (or ranking
//! function), the partition-key count and fetch as little-endian integers, then the ordering as
//! `datafusion-proto` sort expressions. Both shardwise's [`GroupTopKExec`] and DataFusion's
//! `PartitionedTopKExec` (kept for `RANK()`) are covered, since either may sit on a shard, and so
//! is the [`RowNumberExec`] above them: its partition keys as the ordering, and before them its
//! column's name (length and UTF-8 bytes) and nullability.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{LexOrdering, PhysicalSortExpr};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::sorts::partitioned_topk::{PartitionedTopKExec, WindowFnKind};
use datafusion_proto::physical_plan::from_proto::parse_physical_sort_exprs;
use datafusion_proto::physical_plan::to_proto::serialize_physical_sort_exprs;
use datafusion_proto::physical_plan::{
    PhysicalExtensionCodec, PhysicalPlanDecodeContext, PhysicalProtoConverterExtension,
};
use datafusion_proto::protobuf;
use prost::Message;

use super::{GroupTopKExec, RowNumberExec, TopKStep};

const GROUP_TOPK_PARTIAL: u8 = 1;
const GROUP_TOPK_FINAL: u8 = 2;
const PARTITIONED_ROW_NUMBER: u8 = 3;
const PARTITIONED_RANK: u8 = 4;
const ROW_NUMBER: u8 = 5;

/// The encoded node, if `node` is a top-N per group.
pub fn encode(
    node: &Arc<dyn ExecutionPlan>,
    codec: &dyn PhysicalExtensionCodec,
    converter: &dyn PhysicalProtoConverterExtension,
) -> Result<Option<Vec<u8>>> {
    let (kind, ordering, partition_len, fetch) = if let Some(t) = node.downcast_ref::<GroupTopKExec>() {
        let kind = match t.step() {
            TopKStep::Partial => GROUP_TOPK_PARTIAL,
            TopKStep::Final => GROUP_TOPK_FINAL,
        };
        (kind, t.ordering(), t.partition_len(), t.fetch())
    } else if let Some(t) = node.downcast_ref::<PartitionedTopKExec>() {
        let kind = match t.fn_kind() {
            WindowFnKind::RowNumber => PARTITIONED_ROW_NUMBER,
            WindowFnKind::Rank => PARTITIONED_RANK,
        };
        (kind, t.expr(), t.partition_prefix_len(), t.fetch())
    } else if let Some(r) = node.downcast_ref::<RowNumberExec>() {
        let keys = r.partition_by().iter().map(|e| PhysicalSortExpr::new_default(Arc::clone(e)));
        let nodes = serialize_physical_sort_exprs(keys, codec, converter)?;
        let name = r.field().name().as_bytes();
        let mut out = vec![ROW_NUMBER];
        out.extend_from_slice(&(r.partition_by().len() as u32).to_le_bytes());
        out.extend_from_slice(&0u64.to_le_bytes());
        out.extend_from_slice(&(name.len() as u32).to_le_bytes());
        out.extend_from_slice(name);
        out.push(u8::from(r.field().is_nullable()));
        protobuf::PhysicalSortExprNodeCollection { physical_sort_expr_nodes: nodes }
            .encode(&mut out)
            .map_err(|e| DataFusionError::Internal(format!("encoding a row number: {e}")))?;
        return Ok(Some(out));
    } else {
        return Ok(None);
    };
    let nodes = serialize_physical_sort_exprs(ordering.iter().cloned(), codec, converter)?;
    let mut out = vec![kind];
    out.extend_from_slice(&(partition_len as u32).to_le_bytes());
    out.extend_from_slice(&(fetch as u64).to_le_bytes());
    protobuf::PhysicalSortExprNodeCollection { physical_sort_expr_nodes: nodes }
        .encode(&mut out)
        .map_err(|e| DataFusionError::Internal(format!("encoding a top-N per group: {e}")))?;
    Ok(Some(out))
}

/// The node `encode` wrote, over `input`.
pub fn decode(
    buf: &[u8],
    input: Arc<dyn ExecutionPlan>,
    ctx: &TaskContext,
    codec: &dyn PhysicalExtensionCodec,
    converter: &dyn PhysicalProtoConverterExtension,
) -> Result<Arc<dyn ExecutionPlan>> {
    let bad = |what: &str| DataFusionError::Plan(format!("not a shardwise fragment ticket: top-N per group {what}"));
    let (&kind, rest) = buf.split_first().ok_or_else(|| bad("is empty"))?;
    let (partition_len, rest) = rest.split_first_chunk::<4>().ok_or_else(|| bad("cut short"))?;
    let (fetch, rest) = rest.split_first_chunk::<8>().ok_or_else(|| bad("cut short"))?;
    let partition_len = u32::from_le_bytes(*partition_len) as usize;
    let fetch = usize::try_from(u64::from_le_bytes(*fetch)).map_err(|_| bad("fetch is too large"))?;
    if kind == ROW_NUMBER {
        let (len, rest) = rest.split_first_chunk::<4>().ok_or_else(|| bad("cut short"))?;
        let len = u32::from_le_bytes(*len) as usize;
        let (name, rest) = rest.split_at_checked(len).ok_or_else(|| bad("cut short"))?;
        let name = std::str::from_utf8(name).map_err(|_| bad("has a column name that is not UTF-8"))?;
        let (&nullable, rest) = rest.split_first().ok_or_else(|| bad("cut short"))?;
        let nodes = protobuf::PhysicalSortExprNodeCollection::decode(rest).map_err(|e| bad(&format!("keys: {e}")))?;
        let decode_ctx = PhysicalPlanDecodeContext::new(ctx, codec);
        let keys = parse_physical_sort_exprs(&nodes.physical_sort_expr_nodes, &decode_ctx, &input.schema(), converter)?;
        if keys.len() != partition_len || keys.is_empty() {
            return Err(bad(&format!("row number has {} partition keys, {partition_len} announced", keys.len())));
        }
        let field = Arc::new(Field::new(name, DataType::UInt64, nullable != 0));
        let keys = keys.into_iter().map(|k| k.expr).collect();
        return Ok(Arc::new(RowNumberExec::try_new(input, keys, field)?));
    }
    let nodes = protobuf::PhysicalSortExprNodeCollection::decode(rest).map_err(|e| bad(&format!("ordering: {e}")))?;
    let decode_ctx = PhysicalPlanDecodeContext::new(ctx, codec);
    let exprs = parse_physical_sort_exprs(&nodes.physical_sort_expr_nodes, &decode_ctx, &input.schema(), converter)?;
    if partition_len == 0 || partition_len >= exprs.len() {
        return Err(bad(&format!("has {partition_len} partition keys of {} sort keys", exprs.len())));
    }
    let ordering = LexOrdering::new(exprs).ok_or_else(|| bad("has no sort keys"))?;
    Ok(match kind {
        GROUP_TOPK_PARTIAL | GROUP_TOPK_FINAL => {
            let step = if kind == GROUP_TOPK_PARTIAL { TopKStep::Partial } else { TopKStep::Final };
            Arc::new(GroupTopKExec::try_new(input, ordering, partition_len, fetch, step)?)
        }
        PARTITIONED_ROW_NUMBER | PARTITIONED_RANK if fetch > 0 => {
            let kind = if kind == PARTITIONED_RANK { WindowFnKind::Rank } else { WindowFnKind::RowNumber };
            Arc::new(PartitionedTopKExec::try_new(input, ordering, partition_len, fetch, kind)?)
        }
        other => return Err(bad(&format!("of unknown kind {other} (fetch {fetch})"))),
    })
}
