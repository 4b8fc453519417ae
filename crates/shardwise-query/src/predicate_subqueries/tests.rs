//! The rule against PostgreSQL's answers, worked out by hand, on two small tables with NULLs.

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::common::Result;
use datafusion::prelude::SessionContext;

use super::PredicateSubqueries;

/// `mo (id, ts)`: (1, 10), (2, 50), (NULL, 5); `mi (x, ts)`: (1, 20), (NULL, 30), (3, 40).
fn context() -> Result<SessionContext> {
    let ctx = SessionContext::new();
    // As the engine orders them: what this rule makes, the scalar rules take.
    ctx.add_analyzer_rule(Arc::new(PredicateSubqueries));
    ctx.add_analyzer_rule(Arc::new(crate::scalar_subqueries::ScalarSubqueryRows));
    ctx.add_analyzer_rule(Arc::new(crate::numbered_subqueries::NumberedOuterRows));
    ctx.register_udaf(crate::scalar_subqueries::single_value_udaf().as_ref().clone());
    ctx.register_udf(crate::scalar_subqueries::single_row_udf().as_ref().clone());
    let table = |a: &str, b: &str, first: Vec<Option<i64>>, second: Vec<Option<i64>>| {
        let schema = Schema::new(vec![Field::new(a, DataType::Int64, true), Field::new(b, DataType::Int64, true)]);
        RecordBatch::try_new(
            Arc::new(schema),
            vec![Arc::new(Int64Array::from(first)), Arc::new(Int64Array::from(second))],
        )
    };
    ctx.register_batch("mo", table("id", "ts", vec![Some(1), Some(2), None], vec![Some(10), Some(50), Some(5)])?)?;
    ctx.register_batch("mi", table("x", "ts", vec![Some(1), None, Some(3)], vec![Some(20), Some(30), Some(40)])?)?;
    Ok(ctx)
}

/// The first column of the answer, sorted (NULL first).
async fn ids(sql: &str) -> Result<Vec<Option<i64>>> {
    let batches = context()?.sql(sql).await?.collect().await?;
    let mut ids: Vec<Option<i64>> = batches
        .iter()
        .flat_map(|b| {
            let c = b.column(0).as_primitive::<Int64Type>();
            (0..c.len()).map(|i| c.is_valid(i).then(|| c.value(i))).collect::<Vec<_>>()
        })
        .collect();
    ids.sort();
    Ok(ids)
}

#[tokio::test]
async fn a_subquery_that_aggregates_without_group_by_has_one_row_for_every_outer_row() -> Result<()> {
    let all = vec![None, Some(1), Some(2)];
    assert_eq!(ids("SELECT id FROM mo WHERE EXISTS (SELECT count(*) FROM mi WHERE mi.x = mo.id)").await?, all);
    assert_eq!(ids("SELECT id FROM mo WHERE EXISTS (SELECT max(ts) FROM mi WHERE mi.x = mo.id)").await?, all);
    assert!(ids("SELECT id FROM mo WHERE NOT EXISTS (SELECT count(*) FROM mi WHERE mi.x = mo.id)").await?.is_empty());
    let none_matched = vec![None, Some(2)];
    let sql = "SELECT id FROM mo WHERE 0 IN (SELECT count(*) FROM mi WHERE mi.x = mo.id)";
    assert_eq!(ids(sql).await?, none_matched);
    let sql = "SELECT id FROM mo WHERE 0 NOT IN (SELECT count(*) FROM mi WHERE mi.x = mo.id)";
    assert_eq!(ids(sql).await?, [Some(1)]);
    let sql = "SELECT id FROM mo WHERE EXISTS (SELECT count(*) FROM mi WHERE mi.x = mo.id HAVING count(*) = 0)";
    assert_eq!(ids(sql).await?, none_matched);
    Ok(())
}

#[tokio::test]
async fn a_correlated_not_in_compares_each_outer_row_with_its_own_rows() -> Result<()> {
    // id 1 meets x 1; id 2 meets no row (TRUE); the NULL id meets rows (NULL).
    assert_eq!(ids("SELECT id FROM mo WHERE id NOT IN (SELECT x FROM mi WHERE mi.ts > mo.ts)").await?, [Some(2)]);
    // Correlated on one column, compared on another: DataFusion refused it.
    let sql = "SELECT id FROM mo WHERE ts NOT IN (SELECT ts FROM mi WHERE mi.x = mo.id)";
    assert_eq!(ids(sql).await?, [None, Some(1), Some(2)]);
    let sql = "SELECT id FROM mo WHERE ts NOT IN (SELECT ts - 10 FROM mi WHERE mi.x = mo.id)";
    assert_eq!(ids(sql).await?, [None, Some(2)]);
    Ok(())
}

#[tokio::test]
async fn in_inside_another_condition_can_be_null() -> Result<()> {
    // mi.x holds a NULL: `id NOT IN` is never TRUE, so only `ts = 10` passes.
    assert_eq!(ids("SELECT id FROM mo WHERE ts = 10 OR id NOT IN (SELECT x FROM mi)").await?, [Some(1)]);
    let sql = "SELECT count(*) FROM mo WHERE (id IN (SELECT x FROM mi)) IS NULL";
    assert_eq!(ids(sql).await?, [Some(2)]);
    let sql = "SELECT id FROM mo WHERE ts = 5 OR id IN (SELECT x FROM mi WHERE mi.ts < mo.ts + 15)";
    assert_eq!(ids(sql).await?, [None, Some(1)]);
    Ok(())
}

#[tokio::test]
async fn in_and_uncorrelated_not_in_keep_datafusions_plans() -> Result<()> {
    assert_eq!(ids("SELECT id FROM mo WHERE id IN (SELECT x FROM mi)").await?, [Some(1)]);
    assert!(ids("SELECT id FROM mo WHERE id NOT IN (SELECT x FROM mi)").await?.is_empty());
    assert_eq!(ids("SELECT id FROM mo WHERE id NOT IN (SELECT x FROM mi WHERE x IS NOT NULL)").await?, [Some(2)]);
    Ok(())
}

#[tokio::test]
async fn a_value_that_reads_no_column_not_in_a_subquery_with_a_null_is_never_true() -> Result<()> {
    // mi.x is 1, NULL, 3: `5 NOT IN` is NULL, `1 NOT IN` FALSE; without the NULL, `5` passes.
    assert!(ids("SELECT id FROM mo WHERE 5 NOT IN (SELECT x FROM mi)").await?.is_empty());
    assert!(ids("SELECT id FROM mo WHERE 1 NOT IN (SELECT x FROM mi)").await?.is_empty());
    assert!(ids("SELECT id FROM mo WHERE 1 NOT IN (SELECT CAST(NULL AS BIGINT))").await?.is_empty());
    assert!(ids("SELECT id FROM mo WHERE ts > 0 AND 2 + 3 NOT IN (SELECT x FROM mi)").await?.is_empty());
    let all = vec![None, Some(1), Some(2)];
    assert_eq!(ids("SELECT id FROM mo WHERE 5 NOT IN (SELECT x FROM mi WHERE x IS NOT NULL)").await?, all);
    assert!(ids("SELECT id FROM mo WHERE 3 NOT IN (SELECT x FROM mi WHERE x IS NOT NULL)").await?.is_empty());
    // An empty subquery: TRUE, even for a NULL value.
    assert_eq!(ids("SELECT id FROM mo WHERE CAST(NULL AS BIGINT) NOT IN (SELECT x FROM mi WHERE false)").await?, all);
    assert!(
        ids("SELECT id FROM mo WHERE CAST(NULL AS BIGINT) NOT IN (SELECT x FROM mi WHERE x = 1)").await?.is_empty()
    );
    Ok(())
}

#[tokio::test]
async fn exists_and_in_in_a_select_list() -> Result<()> {
    let sql = "SELECT CASE WHEN EXISTS (SELECT 1 FROM mi WHERE mi.x = mo.id) THEN 1 ELSE 0 END FROM mo ORDER BY id";
    assert_eq!(ids(sql).await?, [Some(0), Some(0), Some(1)]);
    let sql = "SELECT CAST(NOT EXISTS (SELECT 1 FROM mi WHERE mi.ts > mo.ts) AS BIGINT) FROM mo";
    assert_eq!(ids(sql).await?, [Some(0), Some(0), Some(1)]);
    // 1 IN: TRUE; 2: NULL (mi.x holds a NULL); NULL: NULL.
    let sql = "SELECT CAST(id IN (SELECT x FROM mi) AS BIGINT) FROM mo";
    assert_eq!(ids(sql).await?, [None, None, Some(1)]);
    let sql = "SELECT CAST(id NOT IN (SELECT x FROM mi WHERE x IS NOT NULL) AS BIGINT) FROM mo";
    assert_eq!(ids(sql).await?, [None, Some(0), Some(1)]);
    // The subquery reads the outer query's table, unaliased: one answer per outer row (it was a
    // cross join, every row repeated and TRUE).
    let sql = "SELECT CAST(id IN (SELECT id FROM mo WHERE id < 2) AS BIGINT) FROM mo";
    assert_eq!(ids(sql).await?, [None, Some(0), Some(1)]);
    let sql = "SELECT CAST(EXISTS (SELECT 1 FROM mo WHERE ts > 20) AS BIGINT) FROM mo";
    assert_eq!(ids(sql).await?, [Some(1), Some(1), Some(1)]);
    Ok(())
}
