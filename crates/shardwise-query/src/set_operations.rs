//! `INTERSECT ALL` and `EXCEPT ALL` by count, as the SQL standard, PostgreSQL and DuckDB answer
//! them.
//!
//! SQL keeps duplicates by count: `{1,1,1,2} INTERSECT ALL {1,1,2,2}` is `{1,1,2}` (each row as
//! many times as the smaller side has it) and `{1,1,1,2,3} EXCEPT ALL {1,1,2,2}` is `{1,3}` (as
//! many times as the left side has it more). DataFusion 55 plans them as a semi and an anti join
//! on every column, NULLs equal, which keep every row of the left side that has (or lacks) a
//! match: `{1,1,1,2}` and `{3}`.
//!
//! How: [`CountedSetOperations`], an analyzer rule, numbers the copies of each row on both sides
//! (`row_number() OVER (PARTITION BY every column)`) and adds the copy number to the join's keys:
//! the k-th copy of a row on the left matches iff the right side has at least k copies, so the
//! semi join keeps `min(left, right)` copies and the anti join `max(left - right, 0)`. The
//! numbers are projected away again.
//!
//! Which joins: those DataFusion's SQL planner makes for these two operators, and nothing else
//! makes before the optimizer: a semi or anti join with no filter, NULLs equal, keyed on every
//! column of its left side. Its `DISTINCT` forms put a `Distinct` over the left side, where every
//! row is one copy and the join is already right; a left side that is distinct anyway (`SELECT
//! DISTINCT ... INTERSECT ALL ...`) is left as it is for the same reason.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{Column, NullEquality, Result};
use datafusion::functions_window::expr_fn::row_number;
use datafusion::logical_expr::{Expr, ExprFunctionExt, Join, JoinType, LogicalPlan, LogicalPlanBuilder};
use datafusion::optimizer::AnalyzerRule;

/// Names of the copy numbers on each side of a rewritten join (dropped after it).
const LEFT_COPY: &str = "__shardwise_left_copy";
const RIGHT_COPY: &str = "__shardwise_right_copy";

/// The analyzer rule. See the module doc.
#[derive(Debug, Default)]
pub struct CountedSetOperations;

impl AnalyzerRule for CountedSetOperations {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        Ok(plan.transform_up_with_subqueries(counted)?.data)
    }

    fn name(&self) -> &str {
        "shardwise_counted_set_operations"
    }
}

fn counted(plan: LogicalPlan) -> Result<Transformed<LogicalPlan>> {
    let LogicalPlan::Join(join) = &plan else { return Ok(Transformed::no(plan)) };
    let is_counted_set_operation = matches!(join.join_type, JoinType::LeftSemi | JoinType::LeftAnti)
        && join.null_equality == NullEquality::NullEqualsNull
        && join.filter.is_none()
        && join.on.len() == join.left.schema().fields().len()
        && !matches!(join.left.as_ref(), LogicalPlan::Distinct(_));
    if !is_counted_set_operation {
        return Ok(Transformed::no(plan));
    }
    let columns = join.left.schema().columns();
    let mut on = join.on.clone();
    on.push((Expr::Column(Column::from_name(LEFT_COPY)), Expr::Column(Column::from_name(RIGHT_COPY))));
    let counted = Join::try_new(
        Arc::new(numbered(Arc::clone(&join.left), LEFT_COPY)?),
        Arc::new(numbered(Arc::clone(&join.right), RIGHT_COPY)?),
        on,
        None,
        join.join_type,
        join.join_constraint,
        NullEquality::NullEqualsNull,
        join.null_aware,
    )?;
    let projected =
        LogicalPlanBuilder::from(LogicalPlan::Join(counted)).project(columns.into_iter().map(Expr::Column))?.build()?;
    Ok(Transformed::yes(projected))
}

/// `plan` with a column `name` numbering the copies of each row (1, 2, ... per distinct row).
fn numbered(plan: Arc<LogicalPlan>, name: &str) -> Result<LogicalPlan> {
    let every_column = plan.schema().columns().into_iter().map(Expr::Column).collect::<Vec<_>>();
    let copy = row_number().partition_by(every_column).build()?.alias(name);
    LogicalPlanBuilder::from(plan).window(vec![copy])?.build()
}

#[cfg(test)]
mod tests {
    use datafusion::prelude::SessionContext;

    use super::*;

    async fn answer(sql: &str) -> Vec<String> {
        let ctx = SessionContext::new();
        ctx.add_analyzer_rule(Arc::new(CountedSetOperations));
        let setup = [
            "CREATE TABLE l (a INT, b VARCHAR) AS VALUES (1, 'x'), (1, 'x'), (1, 'x'), (2, NULL), (3, 'z'), (2, NULL)",
            "CREATE TABLE r (a INT, b VARCHAR) AS VALUES (1, 'x'), (1, 'x'), (2, NULL), (2, NULL), (2, NULL), (4, 'w')",
        ];
        for s in setup {
            ctx.sql(s).await.expect("setup").collect().await.expect("setup");
        }
        let batches = ctx.sql(sql).await.expect("plans").collect().await.expect("runs");
        let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches).expect("format").to_string();
        // The table's lines that start with "| ", the first being the header.
        let mut rows: Vec<String> = text.lines().filter(|l| l.starts_with("| ")).skip(1).map(str::to_string).collect();
        rows.sort();
        rows
    }

    fn rows(expected: &[&str]) -> Vec<String> {
        let mut rows: Vec<String> = expected.iter().map(|r| r.to_string()).collect();
        rows.sort();
        rows
    }

    #[tokio::test]
    async fn intersect_all_keeps_the_smaller_count_of_each_row() {
        let got = answer("SELECT a, b FROM l INTERSECT ALL SELECT a, b FROM r").await;
        assert_eq!(got, rows(&["| 1 | x |", "| 1 | x |", "| 2 |   |", "| 2 |   |"]));
    }

    #[tokio::test]
    async fn except_all_keeps_what_the_left_has_more() {
        let got = answer("SELECT a, b FROM l EXCEPT ALL SELECT a, b FROM r").await;
        assert_eq!(got, rows(&["| 1 | x |", "| 3 | z |"]));
        let got = answer("SELECT a, b FROM r EXCEPT ALL SELECT a, b FROM l").await;
        assert_eq!(got, rows(&["| 2 |   |", "| 4 | w |"]));
    }

    #[tokio::test]
    async fn the_distinct_forms_and_self_intersections_are_unchanged() {
        let got = answer("SELECT a, b FROM l INTERSECT SELECT a, b FROM r").await;
        assert_eq!(got, rows(&["| 1 | x |", "| 2 |   |"]));
        let got = answer("SELECT a, b FROM l EXCEPT SELECT a, b FROM r").await;
        assert_eq!(got, rows(&["| 3 | z |"]));
        let got = answer("SELECT a FROM l INTERSECT ALL SELECT a FROM l").await;
        assert_eq!(got, rows(&["| 1 |", "| 1 |", "| 1 |", "| 2 |", "| 2 |", "| 3 |"]));
        let got = answer("SELECT DISTINCT a FROM l INTERSECT ALL SELECT a FROM r").await;
        assert_eq!(got, rows(&["| 1 |", "| 2 |"]));
    }

    #[tokio::test]
    async fn in_a_subquery_too() {
        let got =
            answer("SELECT count(*) AS n FROM (SELECT a FROM l INTERSECT ALL SELECT a FROM r) s WHERE a IN (SELECT a FROM l EXCEPT ALL SELECT a FROM r)")
                .await;
        // l's a: {1,1,1,2,2,3}; r's a: {1,1,2,2,2,4}. INTERSECT ALL {1,1,2,2}; EXCEPT ALL {1,3}.
        assert_eq!(got, rows(&["| 2 |"]));
    }
}
