//! Every table a query can name, with its columns: what Flight SQL's metadata calls
//! (`GetCatalogs`, `GetDbSchemas`, `GetTables`, what ADBC's `get_objects` and
//! `get_table_schema` and JDBC's `DatabaseMetaData` send) list. Read from the same catalogs the
//! SQL planner resolves names in, so what is listed is what a query finds: `information_schema`
//! too, which DataFusion answers outside the catalogs' own schemas.

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::SchemaProvider;
use datafusion::catalog::information_schema::{INFORMATION_SCHEMA, InformationSchemaProvider};
use datafusion::logical_expr::TableType;
use datafusion::prelude::SessionContext;

/// One table, view or system table.
#[derive(Debug, Clone)]
pub struct ListedTable {
    pub catalog: String,
    pub schema: String,
    pub name: String,
    /// `TABLE`, `VIEW` or `LOCAL TEMPORARY`, as Flight SQL and JDBC name them.
    pub table_type: &'static str,
    pub columns: SchemaRef,
}

/// The table types [`ListedTable::table_type`] takes.
pub const TABLE_TYPES: &[&str] = &["TABLE", "VIEW", "LOCAL TEMPORARY"];

/// Every table of every schema of every catalog of `ctx`, sorted by catalog, schema and name.
pub async fn list_tables(ctx: &SessionContext) -> Vec<ListedTable> {
    let mut tables = Vec::new();
    for catalog_name in ctx.catalog_names() {
        let Some(catalog) = ctx.catalog(&catalog_name) else { continue };
        let mut schemas: Vec<(String, Arc<dyn SchemaProvider>)> = catalog
            .schema_names()
            .into_iter()
            .filter_map(|name| catalog.schema(&name).map(|schema| (name, schema)))
            .collect();
        if let Some(information_schema) = information_schema(ctx, &schemas) {
            schemas.push((INFORMATION_SCHEMA.to_string(), information_schema));
        }
        for (schema_name, schema) in schemas {
            for name in schema.table_names() {
                // A table dropped since the names were read is skipped.
                let Ok(Some(table)) = schema.table(&name).await else { continue };
                let table_type = match table.table_type() {
                    TableType::Base => "TABLE",
                    TableType::View => "VIEW",
                    TableType::Temporary => "LOCAL TEMPORARY",
                };
                tables.push(ListedTable {
                    catalog: catalog_name.clone(),
                    schema: schema_name.clone(),
                    name,
                    table_type,
                    columns: table.schema(),
                });
            }
        }
    }
    tables.sort_by(|a, b| (&a.catalog, &a.schema, &a.name).cmp(&(&b.catalog, &b.schema, &b.name)));
    tables
}

/// `information_schema`, when the session answers it and no catalog schema has its name.
fn information_schema(
    ctx: &SessionContext,
    schemas: &[(String, Arc<dyn SchemaProvider>)],
) -> Option<Arc<dyn SchemaProvider>> {
    let state = ctx.state();
    let answered = state.config().information_schema() && schemas.iter().all(|(name, _)| name != INFORMATION_SCHEMA);
    answered.then(|| Arc::new(InformationSchemaProvider::new(Arc::clone(state.catalog_list()))) as _)
}

/// Every `(catalog, schema)` of `ctx`, `information_schema` included when the session answers
/// it, sorted.
pub fn list_schemas(ctx: &SessionContext) -> Vec<(String, String)> {
    let answered = ctx.state().config().information_schema();
    let mut schemas: Vec<(String, String)> = Vec::new();
    for catalog_name in ctx.catalog_names() {
        let Some(catalog) = ctx.catalog(&catalog_name) else { continue };
        let names = catalog.schema_names();
        if answered && !names.iter().any(|name| name == INFORMATION_SCHEMA) {
            schemas.push((catalog_name.clone(), INFORMATION_SCHEMA.to_string()));
        }
        schemas.extend(names.into_iter().map(|name| (catalog_name.clone(), name)));
    }
    schemas.sort();
    schemas
}
