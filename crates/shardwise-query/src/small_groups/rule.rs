//! Which partial aggregations [`SmallGroupsExec`] takes, and the rewrite that puts it into a
//! fragment's plan.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::error::Result;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::{ExecutionPlan, InputOrderMode};

use super::SmallGroupsExec;
use super::accum::AccumKind;
use super::composite::KeySet;
use crate::settings::ShardwiseSettings;

/// The aggregates of `agg`, if [`SmallGroupsExec`] computes it exactly: a partial step with
/// one to [`super::composite::KEYS_MAX`] plain GROUP BY keys of integer or string types, no grouping sets, no FILTER, no limit,
/// unordered input, and only aggregates [`AccumKind::of`] knows.
pub(super) fn eligible(agg: &AggregateExec) -> Option<Vec<AccumKind>> {
    let input = agg.input_schema();
    let group_by = agg.group_expr();
    let plain = *agg.mode() == AggregateMode::Partial && plain_grouping(agg);
    let key_types = group_by.expr().iter().map(|(key, _)| key.data_type(&input).ok()).collect::<Option<Vec<_>>>()?;
    if !plain || KeySet::for_types(&key_types).is_none() {
        return None;
    }
    agg.aggr_expr().iter().map(|a| AccumKind::of(a, &input)).collect()
}

/// Whether `agg` groups plainly: one grouping set, no FILTER, no limit, no dynamic filter it
/// feeds, unordered input, and at least one aggregate (what the small- and many-group operators
/// take, whatever the step).
pub(crate) fn plain_grouping(agg: &AggregateExec) -> bool {
    agg.group_expr().is_single()
        && agg.filter_expr().iter().all(Option::is_none)
        && agg.limit_options().is_none()
        && agg.dynamic_expressions_produced().is_empty()
        && *agg.input_order_mode() == InputOrderMode::Linear
        && !agg.aggr_expr().is_empty()
}

/// `plan` with every partial aggregation [`SmallGroupsExec`] computes put in its hands, unless
/// `small_group_aggregation` is off.
pub fn rewrite(plan: Arc<dyn ExecutionPlan>, settings: &ShardwiseSettings) -> Result<Arc<dyn ExecutionPlan>> {
    if !settings.small_group_aggregation.0 {
        return Ok(plan);
    }
    let max_groups = usize::try_from(settings.small_group_aggregation_max_groups).unwrap_or(usize::MAX);
    plan.transform_up(|node| {
        let Some(agg) = node.downcast_ref::<AggregateExec>() else { return Ok(Transformed::no(node)) };
        match SmallGroupsExec::try_new(agg, max_groups) {
            Some(exec) => Ok(Transformed::yes(Arc::new(exec) as Arc<dyn ExecutionPlan>)),
            None => Ok(Transformed::no(node)),
        }
    })
    .data()
}
