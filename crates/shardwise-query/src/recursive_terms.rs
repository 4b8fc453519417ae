//! A recursive query's recursive term may not aggregate its own rows, as in PostgreSQL.
//!
//! Why: DataFusion runs `WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT count(*) FROM r)`:
//! each step's count is one row, so the query never ends (it ran until `max_execution_time_ms`).
//! PostgreSQL refuses aggregates and window functions over the recursive reference.
//!
//! How: [`RecursiveTerms`], an analyzer rule, fails a plan whose recursive term has an
//! aggregation or a window over the work table (the recursive reference), naming the CTE. An
//! aggregate inside a subquery over other tables stays allowed.

use datafusion::common::config::ConfigOptions;
use datafusion::common::plan_err;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::error::Result;
use datafusion::logical_expr::{LogicalPlan, RecursiveQuery};
use datafusion::optimizer::AnalyzerRule;

/// The analyzer rule (see the module doc).
#[derive(Debug, Default)]
pub struct RecursiveTerms;

impl AnalyzerRule for RecursiveTerms {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        plan.apply_with_subqueries(|node| {
            if let LogicalPlan::RecursiveQuery(RecursiveQuery { name, recursive_term, .. }) = node
                && let Some(what) = aggregates_own_rows(recursive_term, name)?
            {
                return plan_err!(
                    "{what} are not allowed in a recursive query's recursive term (the part of `{name}` after \
                     UNION that reads `{name}`): each step would make a new row from the last, without end"
                );
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        Ok(plan)
    }

    fn name(&self) -> &str {
        "shardwise_recursive_terms"
    }
}

/// What in `term` (outside its subqueries) aggregates rows read from the work table `name`.
fn aggregates_own_rows(term: &LogicalPlan, name: &str) -> Result<Option<&'static str>> {
    let mut found = None;
    term.apply(|node| {
        let what = match node {
            LogicalPlan::Aggregate(_) => "aggregate functions",
            LogicalPlan::Window(_) => "window functions",
            _ => return Ok(TreeNodeRecursion::Continue),
        };
        if reads_work_table(node, name)? {
            found = Some(what);
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(found)
}

fn reads_work_table(plan: &LogicalPlan, name: &str) -> Result<bool> {
    let mut reads = false;
    plan.apply(|node| {
        if let LogicalPlan::TableScan(scan) = node
            && scan.table_name.table() == name
        {
            reads = true;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(reads)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::prelude::SessionContext;

    use super::*;

    async fn run(sql: &str) -> Result<usize> {
        let ctx = SessionContext::new();
        ctx.add_analyzer_rule(Arc::new(RecursiveTerms));
        let batches = ctx.sql(sql).await?.collect().await?;
        Ok(batches.iter().map(|b| b.num_rows()).sum())
    }

    #[tokio::test]
    async fn an_aggregate_over_the_recursive_reference_is_refused() {
        let err = run("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT count(*) FROM r) SELECT * FROM r")
            .await
            .expect_err("refused")
            .to_string();
        assert!(err.contains("aggregate functions are not allowed in a recursive query's recursive term"), "{err}");
        // An ordinary recursion, and an aggregate over another table inside the term, run.
        let rows = run("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 5) SELECT * FROM r")
            .await
            .expect("runs");
        assert_eq!(rows, 5);
        let rows =
            run("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + (SELECT count(*) FROM (VALUES (1)) v(x)) \
             FROM r WHERE n < 3) SELECT * FROM r")
            .await
            .expect("runs");
        assert_eq!(rows, 3);
    }
}
