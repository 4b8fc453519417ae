//! [`GroupTopKRule`]: finds `row_number() OVER (PARTITION BY .. ORDER BY ..) <= N` in a finished
//! physical plan and replaces the full sort under the window with [`GroupTopKExec`].
//!
//! The pattern, top down: a `FilterExec` whose whole predicate compares one column with a
//! positive integer literal (`rn <= N`, `rn < N`, `N >= rn`, `N > rn`); any `ProjectionExec`s
//! that pass that column through (traced by index, so renaming, reordering and dropping other
//! columns are fine); a `BoundedWindowAggExec` with exactly one window expression, `row_number()`
//! with a PARTITION BY, whose output the column is (with a second expression, the top-N would
//! change what that one sees); and under it the `SortExec` DataFusion put there for the window,
//! sorting by the partition keys, then the ORDER BY keys. The filter goes (the window numbers
//! only the rows kept, 1..N), the sort becomes a final [`GroupTopKExec`] with the same ordering,
//! a hash exchange under it gets a partial step below it, and the window becomes a
//! [`RowNumberExec`] (its rows arrive sorted, so numbering them is one pass).
//!
//! DataFusion 55's own `WindowTopN` rule (off by default) maps the filter's column to the window
//! by assuming the projection between them passes every input column through in order, so it
//! misses `SELECT g, v FROM (.. PARTITION BY k ..)`, which drops `k`; and it does not look at the
//! window's other expressions. If a user turns it on, its `ROW_NUMBER()` operator is swapped for
//! [`GroupTopKExec`] as well.

use std::sync::Arc;

use datafusion::common::ScalarValue;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::expressions::{BinaryExpr, Column, Literal};
use datafusion::physical_expr::window::StandardWindowExpr;
use datafusion::physical_expr::{LexOrdering, PhysicalExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
#[allow(deprecated)] // older plans may still hold it between the exchange and the sort
use datafusion::physical_plan::coalesce_batches::CoalesceBatchesExec;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::partitioned_topk::{PartitionedTopKExec, WindowFnKind};
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::windows::{BoundedWindowAggExec, WindowUDFExpr};
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties, Partitioning};

use super::{GroupTopKExec, RowNumberExec, TopKStep};

/// The rule. Runs after DataFusion's rules, before the distributed planner.
#[derive(Debug, Default)]
pub struct GroupTopKRule;

impl PhysicalOptimizerRule for GroupTopKRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, _config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_down(|node| {
            if let Some(rewritten) = rewrite_filter(&node)? {
                return Ok(Transformed::yes(rewritten));
            }
            if let Some(topk) = node.downcast_ref::<PartitionedTopKExec>()
                && (topk.fn_kind() == WindowFnKind::RowNumber || topk.fetch() == 0)
            {
                // RANK keeps ties at the boundary: DataFusion's operator does that, except with
                // fetch 0 (`rank() < 1`), where nothing qualifies.
                let input = with_partial_below_exchange(
                    Arc::clone(topk.input()),
                    topk.expr(),
                    topk.partition_prefix_len(),
                    topk.fetch(),
                )?;
                let exec = GroupTopKExec::try_new(
                    input,
                    topk.expr().clone(),
                    topk.partition_prefix_len(),
                    topk.fetch(),
                    TopKStep::Final,
                )?;
                return Ok(Transformed::yes(Arc::new(exec) as Arc<dyn ExecutionPlan>));
            }
            Ok(Transformed::no(node))
        })
        .data()
    }

    fn name(&self) -> &str {
        "shardwise_group_topk"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// The plan below `node` without the filter and with the top-N, if `node` is the pattern.
fn rewrite_filter(node: &Arc<dyn ExecutionPlan>) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let Some(filter) = node.downcast_ref::<FilterExec>() else { return Ok(None) };
    let Some((mut column, fetch)) = row_limit(filter.predicate()) else { return Ok(None) };
    // Down through projections, following the column.
    let mut projections = Vec::new();
    let mut below = Arc::clone(filter.input());
    while let Some(projection) = below.downcast_ref::<ProjectionExec>() {
        let Some(expr) = projection.expr().get(column) else { return Ok(None) };
        let Some(source) = expr.expr.downcast_ref::<Column>() else { return Ok(None) };
        column = source.index();
        projections.push(Arc::clone(&below));
        below = Arc::clone(projection.input());
    }
    let Some(window) = below.downcast_ref::<BoundedWindowAggExec>() else { return Ok(None) };
    let [expr] = window.window_expr() else { return Ok(None) };
    if column != window.input().schema().fields().len() || !is_row_number(expr.as_ref()) {
        return Ok(None);
    }
    let partition_len = expr.partition_by().len();
    // The sort under the window: one sort per partition (the rows already exchanged by key), or,
    // with one target partition, per-partition sorts merged into one stream (`merged`).
    let (sort, merged) = match window.input().downcast_ref::<SortExec>() {
        Some(sort) => (sort, false),
        None => {
            let Some(merge) = window.input().downcast_ref::<SortPreservingMergeExec>() else { return Ok(None) };
            let Some(sort) = merge.input().downcast_ref::<SortExec>() else { return Ok(None) };
            if merge.fetch().is_some() || !sort.preserve_partitioning() || merge.expr() != sort.expr() {
                return Ok(None);
            }
            (sort, true)
        }
    };
    let ordering = sort.expr();
    let keys_first = partition_len > 0
        && ordering.len() == partition_len + expr.order_by().len()
        && ordering
            .iter()
            .take(partition_len)
            .all(|s| expr.partition_by().iter().any(|p| p.as_ref() == s.expr.as_ref()))
        && ordering.iter().skip(partition_len).eq(expr.order_by().iter());
    // A sort that merges partitions into one: the top-N would keep them apart.
    let merges = !sort.preserve_partitioning() && sort.input().output_partitioning().partition_count() > 1;
    if sort.fetch().is_some() || merges || !keys_first || expr.order_by().is_empty() {
        return Ok(None);
    }
    let input = if merged {
        // A key's rows are in every partition: a partial step in each, then all in one.
        let mut input = Arc::clone(sort.input());
        if fetch > 0 {
            input = Arc::new(GroupTopKExec::try_new(input, ordering.clone(), partition_len, fetch, TopKStep::Partial)?);
        }
        Arc::new(CoalescePartitionsExec::new(input))
    } else {
        with_partial_below_exchange(Arc::clone(sort.input()), ordering, partition_len, fetch)?
    };
    let topk = GroupTopKExec::try_new(input, ordering.clone(), partition_len, fetch, TopKStep::Final)?;
    // The top-N's rows come sorted by partition keys, then the window's ORDER BY: numbering them
    // is one pass, without the window's state per key.
    let field = window
        .schema()
        .fields()
        .last()
        .cloned()
        .ok_or_else(|| DataFusionError::Internal("top-N per group: a window without columns".into()))?;
    let mut plan: Arc<dyn ExecutionPlan> =
        Arc::new(RowNumberExec::try_new(Arc::new(topk), expr.partition_by().to_vec(), field)?);
    for projection in projections.into_iter().rev() {
        plan = replace_children_if_necessary(projection, vec![plan])?;
    }
    // The filter's own projection (DataFusion folds a projection above it into it) stays.
    if let Some(columns) = filter.projection() {
        let schema = plan.schema();
        let exprs = columns
            .iter()
            .map(|&i| {
                let name = schema.fields().get(i).map(|f| f.name().clone()).ok_or_else(|| {
                    DataFusionError::Internal(format!("filter projects column {i} of {}", schema.fields().len()))
                })?;
                Ok((Arc::new(Column::new(&name, i)) as Arc<dyn PhysicalExpr>, name))
            })
            .collect::<Result<Vec<_>>>()?;
        plan = Arc::new(ProjectionExec::try_new(exprs, plan)?);
    }
    Ok(Some(plan))
}

/// `(column, N)` for a predicate that keeps rows whose `column` is at most N (a positive
/// integer; `rn < 1` gives 0).
fn row_limit(predicate: &Arc<dyn PhysicalExpr>) -> Option<(usize, usize)> {
    let binary = predicate.downcast_ref::<BinaryExpr>()?;
    let (column, literal, op) = match (binary.left().downcast_ref::<Column>(), binary.right().downcast_ref::<Literal>())
    {
        (Some(c), Some(l)) => (c, l, *binary.op()),
        _ => {
            let c = binary.right().downcast_ref::<Column>()?;
            let l = binary.left().downcast_ref::<Literal>()?;
            (c, l, binary.op().swap()?)
        }
    };
    if !literal.value().data_type().is_integer() {
        return None;
    }
    let n = match literal.value().cast_to(&datafusion::arrow::datatypes::DataType::UInt64).ok()? {
        ScalarValue::UInt64(Some(n)) if n > 0 => usize::try_from(n).ok()?,
        _ => return None,
    };
    match op {
        Operator::LtEq => Some((column.index(), n)),
        Operator::Lt => Some((column.index(), n - 1)),
        _ => None,
    }
}

fn is_row_number(expr: &dyn datafusion::physical_expr::window::WindowExpr) -> bool {
    expr.as_any()
        .downcast_ref::<StandardWindowExpr>()
        .and_then(|e| e.get_standard_func_expr().as_any().downcast_ref::<WindowUDFExpr>())
        .is_some_and(|f| f.fun().name() == "row_number")
}

/// `input`, with a partial step under it if it is a hash exchange (possibly under batch
/// coalescing).
#[allow(deprecated)]
fn with_partial_below_exchange(
    input: Arc<dyn ExecutionPlan>,
    ordering: &LexOrdering,
    partition_len: usize,
    fetch: usize,
) -> Result<Arc<dyn ExecutionPlan>> {
    let (exchange, above) = match input.downcast_ref::<CoalesceBatchesExec>() {
        Some(coalesce) => (Arc::clone(coalesce.input()), Some(Arc::clone(&input))),
        None => (Arc::clone(&input), None),
    };
    let Some(repartition) = exchange.downcast_ref::<RepartitionExec>() else { return Ok(input) };
    if !matches!(repartition.partitioning(), Partitioning::Hash(..)) || fetch == 0 {
        return Ok(input);
    }
    let partial = GroupTopKExec::try_new(
        Arc::clone(repartition.input()),
        ordering.clone(),
        partition_len,
        fetch,
        TopKStep::Partial,
    )?;
    let exchange = replace_children_if_necessary(Arc::clone(&exchange), vec![Arc::new(partial)])?;
    match above {
        Some(coalesce) => replace_children_if_necessary(coalesce, vec![exchange]),
        None => Ok(exchange),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{Float64Array, Int64Array, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::arrow::util::pretty::pretty_format_batches;
    use datafusion::datasource::MemTable;
    use datafusion::execution::SessionStateBuilder;
    use datafusion::physical_plan::displayable;
    use datafusion::prelude::{SessionConfig, SessionContext};

    use super::GroupTopKRule;

    /// Two partitions of `(g, v)`, a context with `target_partitions` threads.
    fn context(target_partitions: usize, with_rule: bool) -> SessionContext {
        let schema = Arc::new(Schema::new(vec![
            Field::new("g", DataType::Int64, true),
            Field::new("v", DataType::Float64, true),
        ]));
        let mut next = super::super::test_rng(3);
        let partition = |n: usize, next: &mut dyn FnMut() -> u64| {
            let g = Int64Array::from_iter((0..n).map(|_| Some((next() % 50) as i64)));
            let v = Float64Array::from_iter((0..n).map(|i| (i % 13 != 0).then(|| (next() % 1000) as f64)));
            RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(g), Arc::new(v)]).expect("batch")
        };
        let parts = vec![vec![partition(3000, &mut next)], vec![partition(2000, &mut next)]];
        let table = MemTable::try_new(Arc::clone(&schema), parts).expect("table");
        let config = SessionConfig::new().with_target_partitions(target_partitions);
        let mut state = SessionStateBuilder::new().with_config(config).with_default_features();
        if with_rule {
            state = state.with_physical_optimizer_rule(Arc::new(GroupTopKRule));
        }
        let ctx = SessionContext::new_with_state(state.build());
        ctx.register_table("t", Arc::new(table)).expect("register");
        ctx
    }

    const SQL: &str = "SELECT g, v FROM (SELECT g, v, row_number() OVER (PARTITION BY g ORDER BY v DESC) AS rn \
                       FROM t) WHERE rn <= 2 ORDER BY g, v DESC";

    #[tokio::test]
    async fn one_target_partition_gets_the_top_n_plan_and_the_same_answer() {
        for target_partitions in [1, 2] {
            let ctx = context(target_partitions, true);
            let df = ctx.sql(SQL).await.expect("plan");
            let plan = df.clone().create_physical_plan().await.expect("physical plan");
            let text = displayable(plan.as_ref()).indent(true).to_string();
            assert!(
                text.contains("GroupTopKExec: step=final") && text.contains("GroupTopKExec: step=partial"),
                "{target_partitions} partitions: {text}"
            );
            let got = pretty_format_batches(&df.collect().await.expect("run")).expect("format").to_string();
            let plain = context(target_partitions, false);
            let want = plain.sql(SQL).await.expect("plan").collect().await.expect("run");
            assert_eq!(got, pretty_format_batches(&want).expect("format").to_string());
        }
    }
}
