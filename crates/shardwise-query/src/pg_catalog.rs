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
//!   (`OPERATOR(pg_catalog.~)`, `'t'::regclass`, `COLLATE pg_catalog.default`, `ANY(array)`,
//!   `ARRAY(subquery)`) turned into SQL DataFusion plans. The PostgreSQL endpoint applies it to statements that
//!   name a catalog object; every other statement is planned as written.

use std::sync::{Arc, OnceLock};

use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::Statement;
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;
use datafusion_pg_catalog::pg_catalog::context::EmptyContextProvider;
use datafusion_pg_catalog::sql::PostgresCompatibilityParser;

use crate::error::QueryError;

/// Adds the `pg_catalog` schema to `catalog` of `ctx`, and the catalog functions to `ctx`.
pub fn install(ctx: &SessionContext, catalog: &str) -> Result<(), QueryError> {
    datafusion_pg_catalog::setup_pg_catalog(ctx, catalog, EmptyContextProvider)
        .map_err(|e| QueryError::Internal(*e))?;
    // shardwise has no indexes, and decimal columns have a precision (see `crate::pg_catalog_tables`).
    if let Some(provider) = ctx.catalog(catalog)
        && let Some(schema) = provider.schema("pg_catalog")
    {
        let wrapped = crate::pg_catalog_tables::wrap(schema, Arc::clone(ctx.state().catalog_list()), catalog);
        provider.register_schema("pg_catalog", wrapped).map_err(QueryError::Internal)?;
    }
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
    let statement = keeping_subqueries(sql, statement);
    let statement = crate::pg_vectors::rewrite(statement);
    let statement = crate::pg_arrays::rewrite(statement);
    let rewritten = statement.to_string();
    (rewritten != sql.trim().trim_end_matches(';').trim()).then_some(rewritten)
}

/// `sql` rewritten by the crate's rules except `RemoveSubqueryFromProjection`, which replaces
/// every correlated subquery of a SELECT list by NULL (made for engines that cannot run them;
/// `crate::scalar_subqueries` and `crate::numbered_subqueries` run them, and a NULL where
/// PostgreSQL gives a value is a wrong answer) and puts `LIMIT 1` on the others (where
/// PostgreSQL fails on a second row). `crate_statement`, the crate's own rewrite, when its
/// whole-statement substitutions (client queries it replaces by name) changed the statement:
/// those are kept.
fn keeping_subqueries(sql: &str, crate_statement: Statement) -> Statement {
    use datafusion_pg_catalog::sql::rules::*;
    let Ok(mut parsed) = Parser::parse_sql(&PostgreSqlDialect {}, sql) else { return crate_statement };
    let (Some(parsed), true) = (parsed.pop(), parsed.is_empty()) else { return crate_statement };
    static RULES: OnceLock<Vec<Box<dyn SqlStatementRewriteRule>>> = OnceLock::new();
    // The crate's list (`PostgresCompatibilityParser::new`) in its order, one rule left out.
    let rules = RULES.get_or_init(|| {
        vec![
            Box::new(AliasDuplicatedProjectionRewrite),
            Box::new(ResolveUnqualifiedIdentifier),
            Box::new(RewriteArrayAnyAllOperation),
            Box::new(PrependUnqualifiedPgTableName),
            Box::new(StripCallableQualifier),
            Box::new(FixArrayLiteral),
            Box::new(CurrentUserVariableToSessionUserFunctionCall),
            Box::new(StripCollate),
            Box::new(RewritePgCatalogOperator),
            Box::new(RewriteRegCastToSubquery::new()),
            Box::new(FixVersionColumnName),
        ]
    });
    let apply = |mut s: Statement, with_removal: bool| {
        for (i, rule) in rules.iter().enumerate() {
            if with_removal && i + 1 == rules.len() {
                s = RemoveSubqueryFromProjection.rewrite(s);
            }
            s = rule.rewrite(s);
        }
        s
    };
    // The crate's rewrite of the statement as parsed here equals its own output unless a
    // substitution by name happened first.
    if apply(parsed.clone(), true) != crate_statement {
        return crate_statement;
    }
    apply(parsed, false)
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
    fn correlated_subqueries_are_kept_and_named_client_queries_still_replaced() {
        let sql = "SELECT a.attname, (SELECT d.adbin FROM pg_catalog.pg_attrdef d WHERE d.adrelid = a.attrelid) \
                   FROM pg_catalog.pg_attribute a";
        assert_eq!(rewrite(sql), None, "nothing to change");
        let sql = "SELECT a.attname, (SELECT d.adbin FROM pg_attrdef d WHERE d.adrelid = a.attrelid) \
                   FROM pg_attribute a WHERE a.attname OPERATOR(pg_catalog.~) '^k$'";
        let out = rewrite(sql).expect("rewritten");
        assert!(out.contains("(SELECT d.adbin FROM pg_catalog.pg_attrdef d WHERE d.adrelid = a.attrelid)"), "{out}");
        assert!(!out.contains("LIMIT"), "{out}");
        // grafana's search_path lookup, which the crate replaces by name.
        let sql = "SELECT 1 FROM pg_namespace WHERE nspname IN (SELECT CASE WHEN trim(s[i]) = '\"$user\"' THEN user \
                   ELSE trim(s[i]) END FROM generate_series(array_lower(string_to_array(current_setting('search_path'),','),1), \
                   array_upper(string_to_array(current_setting('search_path'),','),1)) as i, \
                   string_to_array(current_setting('search_path'),',') s)";
        let out = rewrite(sql).expect("rewritten");
        assert!(out.contains("IN ('')"), "{out}");
    }

    #[test]
    fn what_does_not_parse_as_postgresql_is_planned_as_written() {
        assert_eq!(rewrite("SELECT * FROM pg_class SETTINGS max_threads = 2 garbage ("), None);
        assert_eq!(rewrite("SELECT 1 FROM pg_class; SELECT 2 FROM pg_class"), None);
    }
}
