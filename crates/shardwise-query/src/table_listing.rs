//! Every table a query can name, with its columns: what Flight SQL's metadata calls
//! (`GetCatalogs`, `GetDbSchemas`, `GetTables`, what ADBC's `get_objects` and
//! `get_table_schema` and JDBC's `DatabaseMetaData` send) list. Read from the same catalogs the
//! SQL planner resolves names in, so what is listed is what a query finds.

use datafusion::arrow::datatypes::SchemaRef;
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
        for schema_name in catalog.schema_names() {
            let Some(schema) = catalog.schema(&schema_name) else { continue };
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

/// Every `(catalog, schema)` of `ctx`, sorted.
pub fn list_schemas(ctx: &SessionContext) -> Vec<(String, String)> {
    let mut schemas: Vec<(String, String)> = ctx
        .catalog_names()
        .into_iter()
        .filter_map(|c| ctx.catalog(&c).map(|catalog| (c, catalog)))
        .flat_map(|(c, catalog)| catalog.schema_names().into_iter().map(move |s| (c.clone(), s)))
        .collect();
    schemas.sort();
    schemas
}
