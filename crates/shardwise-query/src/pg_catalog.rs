//! `pg_catalog` for PostgreSQL clients: psql's `\dt` and `\d t`, and the schema browsers of
//! DBeaver, Grafana and the like, read PostgreSQL's catalog tables when they connect or list
//! tables. Without them these clients fail on a shardwise node.
//!
//! Both halves come from the `datafusion-pg-catalog` crate (written for DataFusion servers that
//! speak the PostgreSQL protocol), not written here:
//! - [`install`]: the `pg_catalog` schema (`pg_class`, `pg_namespace`, `pg_attribute`,
//!   `pg_type`, ..., computed from the catalogs queries resolve names in, so the sharded tables
//!   and `system.*` appear) and the functions those clients call (`pg_table_is_visible`,
//!   `format_type`, `pg_get_userbyid`, `current_database`, ...), in the engine's context, so
//!   every protocol can read them;
//! - [`rewrite`]: PostgreSQL-only syntax in the clients' catalog queries
//!   (`OPERATOR(pg_catalog.~)`, `'t'::regclass`, `COLLATE pg_catalog.default`, `ANY(array)`)
//!   turned into SQL DataFusion plans. The PostgreSQL endpoint applies it to statements that
//!   name a catalog object; every other statement is planned as written.

use std::sync::{Arc, OnceLock};

use datafusion::prelude::SessionContext;
use datafusion_pg_catalog::pg_catalog::context::EmptyContextProvider;
use datafusion_pg_catalog::sql::PostgresCompatibilityParser;

use crate::error::QueryError;

/// Adds the `pg_catalog` schema to `catalog` of `ctx`, and the catalog functions to `ctx`.
pub fn install(ctx: &SessionContext, catalog: &str) -> Result<(), QueryError> {
    datafusion_pg_catalog::setup_pg_catalog(ctx, catalog, EmptyContextProvider)
        .map_err(|e| QueryError::Internal(*e))?;
    // What psql's `\dt+`, `\dn+` and `\df` call besides, and the crate lacks or makes up.
    crate::pg_functions::register(ctx);
    crate::pg_json::register(ctx);
    Ok(())
}

/// Words whose presence sends a statement through [`rewrite`]: catalog tables and functions
/// (`pg_class`, `pg_catalog.`, `pg_table_is_visible`), the object-identifier casts and
/// `OPERATOR(...)`. A statement without any of them is left alone, unparsed.
const CATALOG_WORDS: [&str; 3] = ["pg_", "::reg", "operator("];

/// `sql` as DataFusion can plan it, when it is a catalog query written for PostgreSQL; `None`
/// when it needs nothing (it names no catalog object, or the rewrite changes nothing) or is not
/// one PostgreSQL statement (then it is planned as written, and any error is DataFusion's).
pub fn rewrite(sql: &str) -> Option<String> {
    if !CATALOG_WORDS.iter().any(|w| crate::sql_text::mentions(sql, w)) {
        return None;
    }
    static PARSER: OnceLock<Arc<PostgresCompatibilityParser>> = OnceLock::new();
    let parser = PARSER.get_or_init(|| Arc::new(PostgresCompatibilityParser::new()));
    let mut statements = parser.parse(sql).ok()?;
    let statement = statements.pop().filter(|_| statements.is_empty())?;
    let rewritten = statement.to_string();
    (rewritten != sql.trim().trim_end_matches(';').trim()).then_some(rewritten)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_naming_no_catalog_object_are_left_alone() {
        assert_eq!(rewrite("SELECT count(*) FROM t WHERE k = 1"), None);
        assert_eq!(rewrite("CREATE TABLE t (k INT) WITH (shard_key = 'k')"), None);
    }

    #[test]
    fn psql_operators_and_casts_become_datafusion_sql() {
        let sql = "SELECT c.relname FROM pg_catalog.pg_class c \
                   WHERE c.relname OPERATOR(pg_catalog.~) '^(t)$' COLLATE pg_catalog.default";
        let out = rewrite(sql).expect("rewritten");
        assert!(!out.contains("OPERATOR"), "{out}");
        assert!(!out.to_ascii_uppercase().contains("COLLATE"), "{out}");
        assert!(out.contains("~"), "{out}");
    }

    #[test]
    fn what_does_not_parse_as_postgresql_is_planned_as_written() {
        assert_eq!(rewrite("SELECT * FROM pg_class SETTINGS max_threads = 2 garbage ("), None);
        assert_eq!(rewrite("SELECT 1 FROM pg_class; SELECT 2 FROM pg_class"), None);
    }
}
