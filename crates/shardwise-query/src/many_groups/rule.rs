//! Which final aggregations [`ManyGroupsExec`] takes, and the rewrite that puts it into a
//! fragment's plan.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::error::Result;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};

use super::ManyGroupsExec;
use super::merge::MergeKind;
use super::packed::PackedKeys;
use super::radix::Buckets;
use crate::settings::ShardwiseSettings;
use crate::small_groups::plain_grouping;

/// The aggregates of `agg`, if [`ManyGroupsExec`] computes it exactly: a final step
/// (`Final` or `FinalPartitioned`) with [`super::packed::KEYS_MIN`] to
/// [`super::packed::KEYS_MAX`] plain GROUP BY keys of integer or string types, no grouping sets,
/// no FILTER, no limit, unordered input, only aggregates [`MergeKind::of`] knows, and an input
/// that is exactly the keys and then each aggregate's states.
pub(super) fn eligible(agg: &AggregateExec) -> Option<Vec<MergeKind>> {
    // The states' schema (`agg.input_schema()` is the partial step's input).
    let input = agg.input().schema();
    let group_by = agg.group_expr();
    let plain = matches!(agg.mode(), AggregateMode::Final | AggregateMode::FinalPartitioned) && plain_grouping(agg);
    if !plain {
        return None;
    }
    let key_types = group_by.expr().iter().map(|(key, _)| key.data_type(&input).ok()).collect::<Option<Vec<_>>>()?;
    let output = agg.schema();
    let same_keys = key_types.iter().zip(output.fields().iter()).all(|(t, f)| t == f.data_type());
    if !same_keys || PackedKeys::for_types(&key_types).is_none() {
        return None;
    }
    let merges: Vec<MergeKind> = agg.aggr_expr().iter().map(|a| MergeKind::of(a)).collect::<Option<_>>()?;
    let columns = key_types.len() + merges.iter().map(|m| m.state_columns()).sum::<usize>();
    let state_types: Vec<_> = input.fields().iter().skip(key_types.len()).map(|f| f.data_type().clone()).collect();
    (columns == input.fields().len() && Buckets::new(&state_types).is_some()).then_some(merges)
}

/// `plan` with every final aggregation [`ManyGroupsExec`] computes put in its hands, unless
/// `many_groups_aggregation` is off.
pub fn rewrite(plan: Arc<dyn ExecutionPlan>, settings: &ShardwiseSettings) -> Result<Arc<dyn ExecutionPlan>> {
    if !settings.many_groups_aggregation.0 {
        return Ok(plan);
    }
    plan.transform_up(|node| {
        let Some(agg) = node.downcast_ref::<AggregateExec>() else { return Ok(Transformed::no(node)) };
        match ManyGroupsExec::try_new(agg) {
            Some(exec) => Ok(Transformed::yes(Arc::new(exec) as Arc<dyn ExecutionPlan>)),
            None => Ok(Transformed::no(node)),
        }
    })
    .data()
}
