//! Where shardwise's `pg_catalog` tables differ from `datafusion-pg-catalog`'s: `pg_index` lists
//! no index, `pg_class` has PostgreSQL's `reloptions` and `relacl` columns, `pg_settings` its
//! `boot_val`, and `pg_attribute` gives a decimal column its precision and scale.
//!
//! Why: the crate fills `pg_index` with the 164 rows of a PostgreSQL server's own system indexes
//! (on `pg_class`, `pg_attribute`, ...), which do not exist here: psql's `\di` listed them, and
//! SQLAlchemy's index listing needed `pg_get_indexdef` for them. The same listing reads
//! `pg_class.reloptions` (a table's storage parameters), a column the crate's `pg_class` lacks.
//!
//! How: [`wrap`] puts [`CatalogTables`] over the crate's `pg_catalog` schema: every table as the
//! crate has it, except `pg_index`, which keeps its columns and has no rows, and `pg_class`,
//! read through a view that adds `reloptions` as NULL (shardwise keeps a table's options in its
//! `WITH (...)`, shown by `SHOW CREATE TABLE`, not as PostgreSQL storage parameters) and
//! `relacl` as NULL (no privileges are granted on a table; psql's `\dp` reads it).
//! `pg_get_indexdef` (in `crate::pg_functions`) is NULL, as PostgreSQL's is for an OID that is
//! not an index's.
//!
//! The crate's `pg_attribute` has `atttypmod = -1` (no modifier) on every column, so psql's
//! `\d t`, SQLAlchemy's reflection and schema browsers, which all read a column's type as
//! `format_type(atttypid, atttypmod)`, showed a `DECIMAL(12, 2)` column as `numeric`. The wrapped
//! `pg_attribute` is a view that takes the modifier of a decimal column from
//! `information_schema.columns` (PostgreSQL's encoding: `(precision << 16 | scale) + 4`), found
//! by its schema, table and position through `pg_class` and `pg_namespace`; every other column
//! keeps -1, as PostgreSQL has for `bigint`, `text` and the rest of the types shardwise has.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, Field};
use datafusion::catalog::information_schema::InformationSchemaProvider;
use datafusion::catalog::{CatalogProviderList, MemTable, SchemaProvider, TableProvider};
use datafusion::common::{Column, JoinType, ScalarValue};
use datafusion::datasource::{ViewTable, provider_as_source};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{Expr, LogicalPlanBuilder, cast, col, lit, when};

/// PostgreSQL's type OID of `numeric`.
const NUMERIC_OID: i32 = 1700;
/// What PostgreSQL adds to a type modifier (`VARHDRSZ`), so that a set one is never below 4.
const TYPMOD_OFFSET: i64 = 4;

/// See the module doc.
#[derive(Debug)]
pub struct CatalogTables {
    inner: Arc<dyn SchemaProvider>,
    /// Where the column types come from: the catalogs queries resolve names in.
    catalogs: Arc<dyn CatalogProviderList>,
    /// The catalog (database) `inner` describes.
    catalog: String,
}

/// `pg_catalog` of `inner` as the module doc says; its tables describe `catalog` of `catalogs`.
pub fn wrap(
    inner: Arc<dyn SchemaProvider>,
    catalogs: Arc<dyn CatalogProviderList>,
    catalog: &str,
) -> Arc<dyn SchemaProvider> {
    Arc::new(CatalogTables { inner, catalogs, catalog: catalog.to_string() })
}

/// `table` (the crate's `name`) with `added` columns after its own, each one it lacks.
fn with_columns(name: &str, table: Arc<dyn TableProvider>, added: Vec<(&str, Expr)>) -> Result<Arc<dyn TableProvider>> {
    let schema = table.schema();
    let missing: Vec<(&str, Expr)> = added.into_iter().filter(|(c, _)| schema.field_with_name(c).is_err()).collect();
    if missing.is_empty() {
        return Ok(table);
    }
    let mut columns: Vec<Expr> =
        schema.fields().iter().map(|f| Expr::Column(Column::new(Some(name), f.name()))).collect();
    columns.extend(missing.into_iter().map(|(c, e)| e.alias(c)));
    let plan = LogicalPlanBuilder::scan(name, provider_as_source(table), None)?.project(columns)?.build()?;
    Ok(Arc::new(ViewTable::new(plan, None)))
}

/// `pg_class` with `reloptions` and `relacl` (`text[]`, NULL: no storage parameters, no
/// privileges granted; psql's `\dp` reads the second).
fn pg_class(table: Arc<dyn TableProvider>) -> Result<Arc<dyn TableProvider>> {
    let text_array = DataType::List(Arc::new(Field::new("item", DataType::Utf8, true)));
    let null_array = || cast(lit(ScalarValue::Null), text_array.clone());
    with_columns("pg_class", table, vec![("reloptions", null_array()), ("relacl", null_array())])
}

/// `pg_settings` with `boot_val`, the value at start, which here is `reset_val` (psql's
/// `\dconfig` compares `setting` with it).
fn pg_settings(table: Arc<dyn TableProvider>) -> Result<Arc<dyn TableProvider>> {
    let reset = Expr::Column(Column::new(Some("pg_settings"), "reset_val"));
    with_columns("pg_settings", table, vec![("boot_val", reset)])
}

impl CatalogTables {
    async fn inner_table(&self, name: &str) -> Result<Arc<dyn TableProvider>> {
        self.inner.table(name).await?.ok_or_else(|| DataFusionError::Internal(format!("pg_catalog.{name} is missing")))
    }

    /// `pg_attribute` with decimal columns' `atttypmod` set (see the module doc): the crate's
    /// columns, in its order, under a view.
    async fn with_typmods(&self, pg_attribute: Arc<dyn TableProvider>) -> Result<Arc<dyn TableProvider>> {
        let schema = pg_attribute.schema();
        let columns = InformationSchemaProvider::new(Arc::clone(&self.catalogs))
            .table("columns")
            .await?
            .ok_or_else(|| DataFusionError::Internal("information_schema.columns is missing".into()))?;
        let scan =
            |name: &str, table: Arc<dyn TableProvider>| LogicalPlanBuilder::scan(name, provider_as_source(table), None);
        let classes = scan("c", self.inner_table("pg_class").await?)?
            .project([col("c.oid"), col("c.relname"), col("c.relnamespace")])?
            .build()?;
        let namespaces =
            scan("n", self.inner_table("pg_namespace").await?)?.project([col("n.oid"), col("n.nspname")])?.build()?;
        // DataFusion's own table, whose `ordinal_position` counts from 0.
        let decimals = scan("d", columns)?
            .filter(col("d.table_catalog").eq(lit(self.catalog.as_str())).and(col("d.numeric_scale").is_not_null()))?
            .project([
                col("d.table_schema"),
                col("d.table_name"),
                col("d.ordinal_position"),
                col("d.numeric_precision"),
                col("d.numeric_scale"),
            ])?
            .build()?;
        let position = cast(col("d.ordinal_position"), DataType::Int64) + lit(1i64);
        let plan = scan("a", pg_attribute)?
            .join_on(classes, JoinType::Left, [col("c.oid").eq(col("a.attrelid"))])?
            .join_on(namespaces, JoinType::Left, [col("n.oid").eq(col("c.relnamespace"))])?
            .join_on(
                decimals,
                JoinType::Left,
                [
                    col("d.table_schema").eq(col("n.nspname")),
                    col("d.table_name").eq(col("c.relname")),
                    position.eq(cast(col("a.attnum"), DataType::Int64)),
                ],
            )?;
        let precision = cast(col("d.numeric_precision"), DataType::Int64);
        let scale = cast(col("d.numeric_scale"), DataType::Int64);
        let typmod = precision * lit(1i64 << 16) + scale + lit(TYPMOD_OFFSET);
        let typmod = when(
            col("a.atttypid").eq(lit(NUMERIC_OID)).and(col("d.numeric_scale").is_not_null()),
            cast(typmod, DataType::Int32),
        )
        .otherwise(col("a.atttypmod"))?;
        let projection: Vec<Expr> = schema
            .fields()
            .iter()
            .map(|f| match f.name().as_str() {
                "atttypmod" => typmod.clone().alias("atttypmod"),
                name => Expr::Column(Column::new(Some("a"), name)),
            })
            .collect();
        Ok(Arc::new(ViewTable::new(plan.project(projection)?.build()?, None)))
    }
}

#[async_trait]
impl SchemaProvider for CatalogTables {
    fn owner_name(&self) -> Option<&str> {
        self.inner.owner_name()
    }

    fn table_names(&self) -> Vec<String> {
        self.inner.table_names()
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        let table = self.inner.table(name).await?;
        match (name, table) {
            ("pg_index", Some(table)) => Ok(Some(Arc::new(MemTable::try_new(table.schema(), vec![Vec::new()])?))),
            ("pg_class", Some(table)) => Ok(Some(pg_class(table)?)),
            ("pg_settings", Some(table)) => Ok(Some(pg_settings(table)?)),
            ("pg_attribute", Some(table)) => Ok(Some(self.with_typmods(table).await?)),
            (_, other) => Ok(other),
        }
    }

    fn table_exist(&self, name: &str) -> bool {
        self.inner.table_exist(name)
    }
}

#[cfg(test)]
mod tests {
    use datafusion::prelude::SessionContext;

    async fn rows(ctx: &SessionContext, sql: &str) -> String {
        let batches = ctx.sql(sql).await.expect("plan").collect().await.expect("run");
        datafusion::arrow::util::pretty::pretty_format_batches(&batches).expect("format").to_string()
    }

    #[tokio::test]
    async fn a_decimal_column_is_described_with_its_precision_and_scale() {
        let ctx = SessionContext::new();
        ctx.sql("CREATE TABLE prices (id BIGINT, price DECIMAL(12, 2), rate DECIMAL(38, 0), note VARCHAR)")
            .await
            .expect("create")
            .collect()
            .await
            .expect("created");
        crate::pg_catalog::install(&ctx, "datafusion").expect("install");
        // What psql's `\d prices` and SQLAlchemy's column reflection ask.
        let sql = "SELECT a.attname, format_type(a.atttypid, a.atttypmod) AS t, a.atttypmod \
                   FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid \
                   WHERE c.relname = 'prices' AND a.attnum > 0 ORDER BY a.attnum";
        let described = rows(&ctx, sql).await;
        for line in [
            "| id      | bigint        | -1        |",
            "| price   | numeric(12,2) | 786438    |",
            // PostgreSQL writes `numeric(38,0)`; the crate's `format_type` leaves a zero scale out.
            "| rate    | numeric(38)   | 2490372   |",
            "| note    | text          | -1        |",
        ] {
            assert!(described.contains(line), "{line} in\n{described}");
        }
        // Every column of the crate's table, once: the joins neither drop nor repeat a row.
        let counted = rows(&ctx, "SELECT count(*) AS n FROM pg_catalog.pg_attribute WHERE attname = 'price'").await;
        assert!(counted.contains("| 1 |"), "{counted}");
    }
}
