//! A window function over the rows a correlated subquery selects for each outer row is refused
//! rather than answered wrong.
//!
//! Why: `(SELECT count(*) OVER () FROM u WHERE u.k = t.k LIMIT 1)` and the same in a LATERAL
//! subquery must count each outer row's matches (PostgreSQL, DuckDB). Decorrelating the subquery
//! into a join moves the correlated condition above the window, which then runs once over all
//! of `u`: every row got the count of the whole table, with no error.
//!
//! How: [`CorrelatedWindows`], an analyzer rule that runs before any subquery is rewritten,
//! fails a plan with a window whose input refers to an outer query's columns, saying what to
//! write instead. A window computed before the correlated condition (a window in a derived
//! table the subquery then filters by the outer row) is exact and stays allowed.

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion::optimizer::AnalyzerRule;

/// What the refused plan fails with.
pub const MESSAGE: &str = "a window function over the rows a correlated subquery selects for each outer row is \
     not supported: write the window over the whole table in a derived table (with PARTITION BY the \
     correlated columns) and join it, or filter it by the outer row outside the window";

/// The analyzer rule (see the module doc).
#[derive(Debug, Default)]
pub struct CorrelatedWindows;

impl AnalyzerRule for CorrelatedWindows {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        plan.apply_with_subqueries(|node| {
            if let LogicalPlan::Window(window) = node
                && refers_to_outer_rows(&window.input)?
            {
                return Err(DataFusionError::NotImplemented(MESSAGE.into()));
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        Ok(plan)
    }

    fn name(&self) -> &str {
        "shardwise_correlated_windows"
    }
}

/// Whether an expression of `plan` or its inputs (not their subqueries, whose outer references
/// are to these rows) refers to an outer query's column.
fn refers_to_outer_rows(plan: &LogicalPlan) -> Result<bool> {
    let mut found = false;
    plan.apply(|node| {
        for expr in node.expressions() {
            expr.apply(|e| {
                if matches!(e, Expr::OuterReferenceColumn(..)) {
                    found = true;
                    return Ok(TreeNodeRecursion::Stop);
                }
                Ok(TreeNodeRecursion::Continue)
            })?;
        }
        Ok(if found { TreeNodeRecursion::Stop } else { TreeNodeRecursion::Continue })
    })?;
    Ok(found)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::prelude::SessionContext;

    use super::*;

    async fn run(sql: &str) -> Result<usize> {
        let ctx = SessionContext::new();
        ctx.add_analyzer_rule(Arc::new(CorrelatedWindows));
        ctx.sql("CREATE TABLE t (k BIGINT) AS VALUES (1), (1), (2)").await?;
        ctx.sql("CREATE TABLE u (k BIGINT) AS VALUES (1), (2), (2)").await?;
        let batches = ctx.sql(sql).await?.collect().await?;
        Ok(batches.iter().map(|b| b.num_rows()).sum())
    }

    #[tokio::test]
    async fn a_window_below_the_correlation_is_refused() {
        for sql in [
            "SELECT t.k, (SELECT count(*) OVER () FROM u WHERE u.k = t.k LIMIT 1) FROM t",
            "SELECT t.k, l.r FROM t, LATERAL (SELECT row_number() OVER () AS r FROM u WHERE u.k = t.k) l",
        ] {
            let err = run(sql).await.expect_err("refused").to_string();
            assert!(err.contains("window function over the rows a correlated subquery selects"), "{sql}: {err}");
        }
        // The window over the whole table, filtered by the outer row afterwards, is exact.
        let rows = run(
            "SELECT t.k, (SELECT max(r) FROM (SELECT k, row_number() OVER () AS r FROM u) z WHERE z.k = t.k) FROM t",
        )
        .await
        .expect("runs");
        assert_eq!(rows, 3);
        assert_eq!(run("SELECT k, row_number() OVER () FROM t").await.expect("runs"), 3);
    }
}
