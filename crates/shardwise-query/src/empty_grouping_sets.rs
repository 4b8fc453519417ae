//! `GROUP BY GROUPING SETS (())` is the aggregate of all rows, once per empty set.
//!
//! Why: DataFusion plans grouping sets that group by no column at all as a grouping-set
//! aggregate with no key, and the partial aggregation a shard runs lost the grouping-set id on
//! its way to the initiator, whose final aggregation then answered no row at all (PostgreSQL
//! and DuckDB: one row, `count(*)` of every row, 0 on an empty table).
//!
//! How: [`EmptyGroupingSets`], an analyzer rule that runs before DataFusion's own, replaces an
//! aggregate whose only grouping is a `GROUPING SETS` list of empty sets by the aggregate
//! without GROUP BY (one row, whatever the input), under a `UNION ALL` of as many copies as
//! there are empty sets.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::Transformed;
use datafusion::error::Result;
use datafusion::logical_expr::{Aggregate, Expr, GroupingSet, LogicalPlan, Union};
use datafusion::optimizer::AnalyzerRule;

/// The analyzer rule (see the module doc).
#[derive(Debug, Default)]
pub struct EmptyGroupingSets;

impl AnalyzerRule for EmptyGroupingSets {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        plan.transform_up_with_subqueries(rewrite).map(|t| t.data)
    }

    fn name(&self) -> &str {
        "shardwise_empty_grouping_sets"
    }
}

fn rewrite(plan: LogicalPlan) -> Result<Transformed<LogicalPlan>> {
    let LogicalPlan::Aggregate(aggregate) = &plan else { return Ok(Transformed::no(plan)) };
    let copies = match aggregate.group_expr.as_slice() {
        [Expr::GroupingSet(GroupingSet::GroupingSets(sets))] if sets.iter().all(Vec::is_empty) => sets.len(),
        _ => return Ok(Transformed::no(plan)),
    };
    let global =
        LogicalPlan::Aggregate(Aggregate::try_new(Arc::clone(&aggregate.input), vec![], aggregate.aggr_expr.clone())?);
    if copies == 1 {
        return Ok(Transformed::yes(global));
    }
    let global = Arc::new(global);
    let inputs = (0..copies).map(|_| Arc::clone(&global)).collect();
    Ok(Transformed::yes(LogicalPlan::Union(Union::try_new_with_loose_types(inputs)?)))
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::util::pretty::pretty_format_batches;
    use datafusion::execution::SessionStateBuilder;
    use datafusion::optimizer::analyzer::resolve_grouping_function::ResolveGroupingFunction;
    use datafusion::optimizer::analyzer::type_coercion::TypeCoercion;
    use datafusion::prelude::{SessionConfig, SessionContext};

    use super::*;

    async fn run(sql: &str) -> String {
        let state = SessionStateBuilder::new()
            .with_config(SessionConfig::new())
            .with_default_features()
            .with_analyzer_rules(vec![
                Arc::new(EmptyGroupingSets),
                Arc::new(ResolveGroupingFunction::new()),
                Arc::new(TypeCoercion::new()),
            ])
            .build();
        let ctx = SessionContext::new_with_state(state);
        ctx.sql("CREATE TABLE e (a BIGINT)").await.expect("e");
        ctx.sql("CREATE TABLE f (a BIGINT) AS VALUES (1), (2), (3)").await.expect("f");
        let batches = ctx.sql(sql).await.expect("plan").collect().await.expect("rows");
        pretty_format_batches(&batches).expect("format").to_string()
    }

    #[tokio::test]
    async fn one_row_per_empty_set() {
        let text = run("SELECT count(*) AS c, sum(a) AS s FROM f GROUP BY GROUPING SETS (())").await;
        assert!(text.contains("| 3 | 6 |"), "{text}");
        let text = run("SELECT count(*) AS c FROM e GROUP BY GROUPING SETS (())").await;
        assert!(text.contains("| 0 |"), "{text}");
        let text = run("SELECT count(*) AS c FROM f GROUP BY GROUPING SETS ((), ())").await;
        assert_eq!(text.matches("| 3 |").count(), 2, "{text}");
        // A set with a key keeps DataFusion's plan.
        let text = run("SELECT a, count(*) AS c FROM f GROUP BY GROUPING SETS ((a), ()) ORDER BY a").await;
        assert!(text.contains("|   | 3 |"), "{text}");
    }
}
