//! Where shardwise's `pg_catalog` tables differ from `datafusion-pg-catalog`'s: `pg_index` lists
//! no index, and `pg_class` has PostgreSQL's `reloptions` column.
//!
//! Why: the crate fills `pg_index` with the 164 rows of a PostgreSQL server's own system indexes
//! (on `pg_class`, `pg_attribute`, ...), which do not exist here: psql's `\di` listed them, and
//! SQLAlchemy's index listing needed `pg_get_indexdef` for them. The same listing reads
//! `pg_class.reloptions` (a table's storage parameters), a column the crate's `pg_class` lacks.
//!
//! How: [`wrap`] puts [`CatalogTables`] over the crate's `pg_catalog` schema: every table as the
//! crate has it, except `pg_index`, which keeps its columns and has no rows, and `pg_class`,
//! read through a view that adds `reloptions` as NULL (shardwise keeps a table's options in its
//! `WITH (...)`, shown by `SHOW CREATE TABLE`, not as PostgreSQL storage parameters).
//! `pg_get_indexdef` (in `crate::pg_functions`) is NULL, as PostgreSQL's is for an OID that is
//! not an index's.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, Field};
use datafusion::catalog::{MemTable, SchemaProvider, TableProvider};
use datafusion::common::{Column, ScalarValue};
use datafusion::datasource::{ViewTable, provider_as_source};
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, LogicalPlanBuilder, cast, lit};

/// See the module doc.
#[derive(Debug)]
pub struct CatalogTables {
    inner: Arc<dyn SchemaProvider>,
}

/// `pg_catalog` of `inner` as the module doc says.
pub fn wrap(inner: Arc<dyn SchemaProvider>) -> Arc<dyn SchemaProvider> {
    Arc::new(CatalogTables { inner })
}

/// `pg_class` with `reloptions` (`text[]`, NULL) after the crate's columns.
fn with_reloptions(pg_class: Arc<dyn TableProvider>) -> Result<Arc<dyn TableProvider>> {
    let schema = pg_class.schema();
    if schema.field_with_name("reloptions").is_ok() {
        return Ok(pg_class);
    }
    let mut columns: Vec<Expr> =
        schema.fields().iter().map(|f| Expr::Column(Column::new(Some("pg_class"), f.name()))).collect();
    let text_array = DataType::List(Arc::new(Field::new("item", DataType::Utf8, true)));
    columns.push(cast(lit(ScalarValue::Null), text_array).alias("reloptions"));
    let plan = LogicalPlanBuilder::scan("pg_class", provider_as_source(pg_class), None)?.project(columns)?.build()?;
    Ok(Arc::new(ViewTable::new(plan, None)))
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
            ("pg_class", Some(table)) => Ok(Some(with_reloptions(table)?)),
            (_, other) => Ok(other),
        }
    }

    fn table_exist(&self, name: &str) -> bool {
        self.inner.table_exist(name)
    }
}
