//! The walk the analyzer rules that rewrite expressions share: every expression of every node
//! (subqueries included), bottom up, each typed against the node's inputs, a SELECT item keeping
//! the name it had (a column does not change name because a rule changed its expression).
//! [`rewrite_expressions`] is that walk; each rule gives only its rewrite of one expression.

use datafusion::common::DFSchema;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::utils::merge_schema;
use datafusion::logical_expr::{Expr, LogicalPlan};

/// `plan` with `rewrite(e, schema)` applied to each of its expressions bottom up, `schema` the
/// columns of the expression's node's inputs (empty for a node without input, `VALUES`).
pub(crate) fn rewrite_expressions(
    plan: LogicalPlan,
    rewrite: impl Fn(Expr, &DFSchema) -> Result<Transformed<Expr>>,
) -> Result<LogicalPlan> {
    plan.transform_up_with_subqueries(|node| {
        let schema = merge_schema(&node.inputs());
        let names = NamePreserver::new(&node);
        node.map_expressions(|e| {
            let name = names.save(&e);
            let rewritten = e.transform_up(|e| rewrite(e, &schema))?;
            Ok(rewritten.update_data(|e| name.restore(e)))
        })
    })
    .map(|t| t.data)
}

/// A session whose analyzer runs `rule` before DataFusion's coercion, as the engine runs its
/// rules that change an expression's type (the coercion then types the plan again).
#[cfg(test)]
pub(crate) fn context_with_rule_first(
    rule: std::sync::Arc<dyn datafusion::optimizer::AnalyzerRule + Send + Sync>,
) -> datafusion::prelude::SessionContext {
    use datafusion::optimizer::analyzer::resolve_grouping_function::ResolveGroupingFunction;
    use datafusion::optimizer::analyzer::type_coercion::TypeCoercion;
    let state = datafusion::execution::SessionStateBuilder::new()
        .with_default_features()
        .with_analyzer_rules(vec![
            rule,
            std::sync::Arc::new(ResolveGroupingFunction::new()),
            std::sync::Arc::new(TypeCoercion::new()),
        ])
        .build();
    datafusion::prelude::SessionContext::new_with_state(state)
}
