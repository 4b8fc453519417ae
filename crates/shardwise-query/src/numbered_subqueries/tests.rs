//! The rule against answers worked out by hand on two small tables (`t.k` 1..3; `u` four rows),
//! with the rules and functions of `crate::scalar_subqueries` registered as the engine does.

use std::sync::Arc;

use datafusion::arrow::array::{Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::common::Result;
use datafusion::prelude::SessionContext;

use super::NumberedOuterRows;
use crate::scalar_subqueries::{ScalarSubqueryRows, single_row_udf, single_value_udaf};

/// `t` and `u` (also the tables of `crate::scalar_subqueries`'s tests).
pub(crate) fn context() -> Result<SessionContext> {
    let ctx = SessionContext::new();
    ctx.add_analyzer_rule(Arc::new(ScalarSubqueryRows));
    ctx.add_analyzer_rule(Arc::new(NumberedOuterRows));
    ctx.register_udaf(single_value_udaf().as_ref().clone());
    ctx.register_udf(single_row_udf().as_ref().clone());
    let t = Schema::new(vec![Field::new("k", DataType::Int64, false)]);
    let t = RecordBatch::try_new(Arc::new(t), vec![Arc::new(Int64Array::from(vec![1, 2, 3]))])?;
    ctx.register_batch("t", t)?;
    let u = Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("s", DataType::Utf8, true),
        Field::new("ts", DataType::Int64, false),
    ]);
    let u = RecordBatch::try_new(
        Arc::new(u),
        vec![
            Arc::new(Int64Array::from(vec![1, 2, 2, 2])),
            Arc::new(StringArray::from(vec![Some("a"), Some("old"), Some("new"), None])),
            Arc::new(Int64Array::from(vec![1, 10, 30, 20])),
        ],
    )?;
    ctx.register_batch("u", u)?;
    Ok(ctx)
}

/// The answer's rows, as `pretty` prints them, without the frame.
async fn rows(sql: &str) -> Result<Vec<String>> {
    let batches = context()?.sql(sql).await?.collect().await?;
    let out = pretty_format_batches(&batches)?.to_string();
    let lines: Vec<&str> = out.lines().collect();
    Ok(lines
        .iter()
        .skip(3)
        .take(lines.len().saturating_sub(4))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect())
}

#[tokio::test]
async fn an_inequality_correlation_counts_per_outer_row() -> Result<()> {
    let got = rows("SELECT k, (SELECT count(*) FROM u WHERE u.ts > t.k * 10) AS n FROM t ORDER BY k").await?;
    assert_eq!(got, ["| 1 | 2 |", "| 2 | 1 |", "| 3 | 0 |"]);
    // An expression over the aggregate, and two subqueries in one SELECT list.
    let got = rows(
        "SELECT k, (SELECT count(*) + 1 FROM u WHERE u.ts > t.k * 10) AS a, \
                   (SELECT max(ts) FROM u WHERE u.ts < t.k * 10) AS b FROM t ORDER BY k",
    )
    .await?;
    assert_eq!(got, ["| 1 | 3 | 1 |", "| 2 | 2 | 10 |", "| 3 | 1 | 20 |"]);
    Ok(())
}

#[tokio::test]
async fn a_condition_on_the_outer_row_alone_gives_no_rows_where_it_is_false() -> Result<()> {
    let got = rows("SELECT k, (SELECT min(s) FROM u WHERE t.k <> 2 AND u.k = t.k) AS s FROM t ORDER BY k").await?;
    assert_eq!(got, ["| 1 | a |", "| 2 | |", "| 3 | |"]);
    let got = rows("SELECT k, (SELECT count(*) FROM u WHERE t.k = 2 AND u.k = t.k) AS n FROM t ORDER BY k").await?;
    assert_eq!(got, ["| 1 | 0 |", "| 2 | 3 |", "| 3 | 0 |"]);
    Ok(())
}

#[tokio::test]
async fn a_subquery_without_aggregate_is_its_one_row_or_an_error() -> Result<()> {
    let got = rows("SELECT k, (SELECT s FROM u WHERE u.k = t.k AND u.ts > t.k * 12) AS s FROM t ORDER BY k").await?;
    assert_eq!(got, ["| 1 | |", "| 2 | new |", "| 3 | |"]);
    let e = rows("SELECT k, (SELECT s FROM u WHERE u.k = t.k AND u.ts > t.k) AS s FROM t")
        .await
        .expect_err("k = 2 meets 3 rows");
    assert!(e.to_string().contains("more than one row returned by a subquery used as an expression"), "{e}");
    Ok(())
}

#[tokio::test]
async fn outer_columns_in_the_aggregated_values() -> Result<()> {
    let got = rows("SELECT k, (SELECT sum(u.ts * t.k) FROM u WHERE u.ts > t.k * 10) AS n FROM t ORDER BY k").await?;
    assert_eq!(got, ["| 1 | 50 |", "| 2 | 60 |", "| 3 | |"]);
    let got = rows("SELECT k, (SELECT s || t.k FROM u WHERE t.k = 1 AND u.k = t.k) AS s FROM t ORDER BY k").await?;
    assert_eq!(got, ["| 1 | a1 |", "| 2 | |", "| 3 | |"]);
    Ok(())
}

#[tokio::test]
async fn in_a_where_clause_and_under_case() -> Result<()> {
    let got = rows("SELECT k FROM t WHERE (SELECT count(*) FROM u WHERE u.ts >= t.k * 10) >= 2 ORDER BY k").await?;
    assert_eq!(got, ["| 1 |", "| 2 |"]);
    let got =
        rows("SELECT k, CASE WHEN k > 1 THEN (SELECT count(*) FROM u WHERE u.ts > t.k) END AS n FROM t ORDER BY k")
            .await?;
    assert_eq!(got, ["| 1 | |", "| 2 | 3 |", "| 3 | 3 |"]);
    Ok(())
}

#[tokio::test]
async fn the_outer_query_may_read_the_subquerys_table() -> Result<()> {
    // `u` on both sides: its columns under the same names in the join.
    let got = rows(
        "SELECT t.k, u.ts, (SELECT count(*) FROM u WHERE u.ts > t.k * 10 AND u.s IS NOT NULL) AS n \
         FROM t JOIN u ON u.k = t.k WHERE u.ts < 25 ORDER BY t.k, u.ts",
    )
    .await?;
    assert_eq!(got, ["| 1 | 1 | 1 |", "| 2 | 10 | 1 |", "| 2 | 20 | 1 |"]);
    Ok(())
}

#[tokio::test]
async fn equal_outer_rows_each_keep_their_row() -> Result<()> {
    let got = rows(
        "SELECT d.k, (SELECT count(*) FROM u WHERE u.ts > d.k * 10) AS n \
         FROM (SELECT k FROM t UNION ALL SELECT k FROM t) d ORDER BY d.k",
    )
    .await?;
    assert_eq!(got, ["| 1 | 2 |", "| 1 | 2 |", "| 2 | 1 |", "| 2 | 1 |", "| 3 | 0 |", "| 3 | 0 |"]);
    Ok(())
}

#[tokio::test]
async fn equality_correlations_keep_datafusions_join() -> Result<()> {
    let ctx = context()?;
    let plan = ctx.sql("SELECT k, (SELECT max(ts) FROM u WHERE u.k = t.k) FROM t").await?.into_optimized_plan()?;
    assert!(!plan.display_indent().to_string().contains("row_number"), "{}", plan.display_indent());
    let plan = ctx.sql("SELECT k, (SELECT max(ts) FROM u WHERE u.k < t.k) FROM t").await?.into_optimized_plan()?;
    assert!(plan.display_indent().to_string().contains("row_number"), "{}", plan.display_indent());
    Ok(())
}
