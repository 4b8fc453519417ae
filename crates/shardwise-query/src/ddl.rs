//! The statements shardwise runs itself instead of handing them to DataFusion: `CREATE TABLE ...
//! WITH (...)` (also `... AS SELECT`), `DROP TABLE`, `TRUNCATE TABLE`, `SHOW TABLES`, `SHOW CREATE
//! TABLE t` (a query of `system.tables`), `SYSTEM FLUSH DISTRIBUTED t` (also `FLUSH TABLE t`),
//! `OPTIMIZE TABLE t [FINAL]`, `CHECK TABLE t` and `REPAIR TABLE t`.
//! Each becomes a [`Command`] that does nothing until executed, or a statement for DataFusion.
//!
//! `CREATE TABLE` borrows DataFusion for the column list: the statement is planned without its
//! `WITH` options (which DataFusion would refuse), so SQL types map to Arrow exactly as they do
//! everywhere else in DataFusion (`DECIMAL(10,2)`, `TIMESTAMP`, `VARCHAR`...); with `AS SELECT`
//! the columns are the query's. The options and the schema then go through
//! [`TableDef::from_options`], which checks everything before anything is created.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::execution::SessionState;
use datafusion::logical_expr::{DdlStatement, LogicalPlan};
use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{
    AlterTableOperation, CreateTable, CreateTableOptions, ObjectName, ObjectType, RenameTableNameKind,
    ShowCreateObject, ShowStatementFilter, ShowStatementFilterPosition, ShowStatementOptions, SqlOption, Statement,
};
use shardwise_storage::{CatalogOp, TableDef};

use crate::error::QueryError;
use crate::settings;

/// A statement shardwise executes itself.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    Ddl(CatalogOp),
    /// `CREATE TABLE t WITH (...) AS SELECT ...`: create `def`, then run `insert` (`INSERT INTO
    /// t SELECT ...`); if the insert fails the table is dropped again. With `if_not_exists` and
    /// the table already there, nothing runs.
    CreateTableAs {
        def: TableDef,
        if_not_exists: bool,
        insert: DfStatement,
    },
    /// Wait until no node has anything pending for the table.
    Flush {
        table: String,
    },
    /// `OPTIMIZE TABLE t [FINAL]`: every replica writes its buffer as a part and merges its
    /// small parts (`all_parts`: every part) into one.
    Optimize {
        table: String,
        all_parts: bool,
    },
    /// `CHECK TABLE t`: read every replica of every shard and compare it with the shard's other
    /// replicas; answers rows.
    Check {
        table: String,
    },
    /// `REPAIR TABLE t`: rebuild every replica `CHECK TABLE` fails from one that passes;
    /// answers rows.
    Repair {
        table: String,
    },
    /// Stop a query this node is running.
    Kill {
        query_id: String,
    },
}

/// What a statement turned out to be.
#[derive(Debug)]
pub enum Classified {
    Command(Command),
    /// Plan this SQL with DataFusion (possibly rewritten, e.g. `SHOW TABLES`).
    DataFusion(DfStatement),
}

/// The query `SHOW TABLES [FROM | IN schema] [LIKE 'p' | ILIKE 'p' | WHERE expr] [LIMIT n]` runs
/// (MySQL's and ClickHouse's form): the tables of `schema` (`public`, the user's tables, by
/// default; `system` lists the system tables), one column `name`. A schema that does not exist is
/// an error, not an empty list.
fn show_tables_sql(options: &ShowStatementOptions, state: &SessionState) -> Result<String, QueryError> {
    let schema = match options.show_in.as_ref().and_then(|i| i.parent_name.as_ref()) {
        None => "public".to_string(),
        Some(name) => match name.0.as_slice() {
            [part] => part.as_ident().map(|i| i.value.clone()).unwrap_or_else(|| part.to_string()),
            _ => return Err(QueryError::Rejected(format!("SHOW TABLES FROM {name}: give one schema name"))),
        },
    };
    let config = state.config_options();
    let schemas = state.catalog_list().catalog(&config.catalog.default_catalog).map(|c| c.schema_names());
    if let Some(schemas) = schemas.filter(|names| !names.contains(&schema)) {
        let mut names = schemas;
        names.sort();
        return Err(QueryError::Rejected(format!(
            "SHOW TABLES FROM {schema}: no such schema; there are {}",
            names.join(", ")
        )));
    }
    if options.starts_with.is_some() || options.limit_from.is_some() {
        return Err(QueryError::Unsupported("SHOW TABLES: STARTS WITH and LIMIT ... FROM are not supported".into()));
    }
    let filter = match &options.filter_position {
        None => String::new(),
        Some(ShowStatementFilterPosition::Infix(f) | ShowStatementFilterPosition::Suffix(f)) => match f {
            ShowStatementFilter::Like(p) => format!(" WHERE name LIKE {}", crate::sql_text::string_literal(p)),
            ShowStatementFilter::ILike(p) => format!(" WHERE name ILIKE {}", crate::sql_text::string_literal(p)),
            ShowStatementFilter::Where(e) => format!(" WHERE {e}"),
            ShowStatementFilter::NoKeyword(p) => format!(" WHERE name LIKE {}", crate::sql_text::string_literal(p)),
        },
    };
    let limit = options.limit.as_ref().map(|n| format!(" LIMIT {n}")).unwrap_or_default();
    Ok(format!(
        "SELECT name FROM (SELECT table_name AS name FROM information_schema.tables WHERE table_schema = {}){filter} \
         ORDER BY name{limit}",
        crate::sql_text::string_literal(&schema)
    ))
}

/// Recognises `SYSTEM FLUSH DISTRIBUTED t` and `FLUSH TABLE t`, which no SQL parser knows.
pub fn flush_command(sql: &str) -> Result<Option<Command>, QueryError> {
    if !crate::sql_text::mentions(sql, "flush") {
        return Ok(None);
    }
    let words = settings::leading_words(sql, 5)?;
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    let table = match words.as_slice() {
        ["system", "flush", "distributed", table] | ["flush", "table", table] => table,
        ["system", "flush", "distributed", ..] | ["flush", "table", ..] => {
            return Err(QueryError::Rejected(
                "expected SYSTEM FLUSH DISTRIBUTED <table> (or FLUSH TABLE <table>) naming one table".to_string(),
            ));
        }
        _ => return Ok(None),
    };
    Ok(Some(Command::Flush { table: table.trim_matches('"').to_string() }))
}

/// `CHECK TABLE t` (ClickHouse's form, which no SQL parser here knows), if `sql` is one.
pub fn check_command(sql: &str) -> Result<Option<Command>, QueryError> {
    let table = one_table_command(sql, "check", "CHECK TABLE", "reads them all")?;
    Ok(table.map(|table| Command::Check { table }))
}

/// `REPAIR TABLE t` (MySQL's name; no SQL parser here knows it), if `sql` is one.
pub fn repair_command(sql: &str) -> Result<Option<Command>, QueryError> {
    let table = one_table_command(sql, "repair", "REPAIR TABLE", "repairs them all")?;
    Ok(table.map(|table| Command::Repair { table }))
}

/// The table of `<verb> TABLE [public.]t`, if `sql` is one; `all` ends the message refusing a
/// PARTITION or PART ("reads them all").
fn one_table_command(sql: &str, verb: &str, name: &str, all: &str) -> Result<Option<String>, QueryError> {
    if !crate::sql_text::mentions(sql, verb) {
        return Ok(None);
    }
    let words = settings::leading_words(sql, 6)?;
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    match words.as_slice() {
        [v, "table", table] | [v, "table", "public", ".", table] if *v == verb => {
            Ok(Some(table.trim_matches('"').to_string()))
        }
        [v, "table", schema, ".", _] if *v == verb => Err(QueryError::Rejected(format!(
            "{name}: tables live in the default schema, public; {schema} has no sharded tables"
        ))),
        [v, "table", ..] if *v == verb => Err(QueryError::Rejected(format!(
            "expected {name} <table> naming one table (PARTITION and PART are not supported: a table's only \
             division is its shards, and {name} {all})"
        ))),
        _ => Ok(None),
    }
}

/// `EXCHANGE TABLES a AND b` (ClickHouse's atomic swap, which no SQL parser knows), if `sql` is
/// one.
pub fn exchange_command(sql: &str) -> Result<Option<Command>, QueryError> {
    if !crate::sql_text::mentions(sql, "exchange") {
        return Ok(None);
    }
    let words = settings::leading_words(sql, 6)?;
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    match words.as_slice() {
        ["exchange", "tables", a, "and", b] => {
            Ok(Some(Command::Ddl(CatalogOp::ExchangeTables { a: a.to_string(), b: b.to_string() })))
        }
        ["exchange", ..] => Err(QueryError::Rejected("expected EXCHANGE TABLES a AND b".to_string())),
        _ => Ok(None),
    }
}

/// `KILL QUERY WHERE query_id = '...'` (ClickHouse's form), if `sql` is one.
pub fn kill_command(sql: &str) -> Result<Option<Command>, QueryError> {
    if !crate::sql_text::mentions(sql, "kill") {
        return Ok(None);
    }
    let words = settings::leading_words(sql, 7)?;
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    match words.as_slice() {
        ["kill", "query", "where", "query_id", "=", id]
            if id.len() >= 2 && id.starts_with('\'') && id.ends_with('\'') =>
        {
            Ok(Some(Command::Kill { query_id: id[1..id.len() - 1].to_string() }))
        }
        ["kill", "query", ..] => {
            Err(QueryError::Rejected("expected KILL QUERY WHERE query_id = '<id>' (ids are in system.queries)".into()))
        }
        _ => Ok(None),
    }
}

/// Sorts a parsed statement into a [`Command`] or something for DataFusion.
pub async fn classify(statement: DfStatement, state: &SessionState, world_size: u32) -> Result<Classified, QueryError> {
    if let Some(explained) = explain_of_create_as(&statement)? {
        return Ok(Classified::DataFusion(explained));
    }
    let DfStatement::Statement(sql) = statement else { return Ok(Classified::DataFusion(statement)) };
    match *sql {
        Statement::CreateTable(create) => create_table(create, state, world_size).await.map(Classified::Command),
        Statement::Drop { object_type: ObjectType::Table, if_exists, names, .. } => {
            let name = one_name(&names, "DROP TABLE")?;
            Ok(Classified::Command(Command::Ddl(CatalogOp::DropTable { name, if_exists, id: None })))
        }
        Statement::Truncate(truncate) => {
            let names: Vec<ObjectName> = truncate.table_names.iter().map(|t| t.name.clone()).collect();
            let name = one_name(&names, "TRUNCATE TABLE")?;
            Ok(Classified::Command(Command::Ddl(CatalogOp::TruncateTable { name })))
        }
        Statement::ShowCreate { obj_type: ShowCreateObject::Table, obj_name } => {
            let name = table_name(&obj_name, "SHOW CREATE TABLE")?;
            if !state.schema_for_ref(name.as_str())?.table_exist(&name) {
                return Err(QueryError::Rejected(format!(
                    "SHOW CREATE TABLE: unknown table {name} (SHOW TABLES lists them)"
                )));
            }
            rewritten(&format!(
                "SELECT create_table_query AS statement FROM system.tables WHERE name = {}",
                crate::sql_text::string_literal(&name)
            ))
        }
        Statement::ShowTables {
            terse: false,
            history: false,
            extended: false,
            full: false,
            external: false,
            show_options,
        } => rewritten(&show_tables_sql(&show_options, state)?),
        Statement::ShowTables { .. } => Err(QueryError::Unsupported(
            "SHOW TABLES takes FROM (or IN) a schema, LIKE, ILIKE or WHERE, and LIMIT; not TERSE, HISTORY, \
             EXTENDED, FULL or EXTERNAL"
                .into(),
        )),
        Statement::RenameTable(renames) => {
            let renames = renames
                .iter()
                .map(|r| Ok((table_name(&r.old_name, "RENAME TABLE")?, table_name(&r.new_name, "RENAME TABLE")?)))
                .collect::<Result<Vec<_>, QueryError>>()?;
            Ok(Classified::Command(Command::Ddl(CatalogOp::RenameTables { renames, if_exists: false })))
        }
        Statement::AlterTable(alter) => match alter.operations.as_slice() {
            [
                AlterTableOperation::RenameTable {
                    table_name: RenameTableNameKind::To(to) | RenameTableNameKind::As(to),
                },
            ] => {
                let renames = vec![(table_name(&alter.name, "ALTER TABLE")?, table_name(to, "ALTER TABLE")?)];
                Ok(Classified::Command(Command::Ddl(CatalogOp::RenameTables { renames, if_exists: alter.if_exists })))
            }
            _ => Err(QueryError::Unsupported(
                "ALTER TABLE: a table's columns and options are fixed once created (its name is not: ALTER \
                 TABLE ... RENAME TO renames it); make the new table with CREATE TABLE ... AS SELECT, then \
                 swap the two with RENAME TABLE t TO t_old, t_new TO t and DROP TABLE t_old"
                    .into(),
            )),
        },
        Statement::OptimizeTable {
            name,
            partition,
            include_final,
            deduplicate,
            predicate,
            zorder,
            on_cluster: _,
            has_table_keyword: _,
        } => {
            let table = table_name(&name, "OPTIMIZE TABLE")?;
            if partition.is_some() {
                return Err(QueryError::Unsupported(
                    "OPTIMIZE TABLE ... PARTITION: tables have no partitions here (shards are their only division); \
                     leave PARTITION out to optimize every shard"
                        .into(),
                ));
            }
            if deduplicate.is_some() {
                return Err(QueryError::Unsupported(
                    "OPTIMIZE TABLE ... DEDUPLICATE: rows are not deduplicated by value (a retried insert is \
                     applied once by its insert id); to keep distinct rows, CREATE TABLE t2 ... AS SELECT DISTINCT \
                     * FROM t, then EXCHANGE TABLES t AND t2"
                        .into(),
                ));
            }
            if predicate.is_some() || zorder.is_some() {
                return Err(QueryError::Unsupported(
                    "OPTIMIZE ... WHERE / ZORDER BY: parts keep rows in arrival order; OPTIMIZE TABLE t [FINAL] \
                     merges them"
                        .into(),
                ));
            }
            Ok(Classified::Command(Command::Optimize { table, all_parts: include_final }))
        }
        Statement::Update(_) | Statement::Delete(_) | Statement::Merge(_) => Err(QueryError::Unsupported(
            "UPDATE, DELETE and MERGE: tables take INSERTs only; keep the rows you want with CREATE TABLE \
             ... AS SELECT ... WHERE, or empty a table with TRUNCATE TABLE"
                .into(),
        )),
        other => Ok(Classified::DataFusion(DfStatement::Statement(Box::new(other)))),
    }
}

/// `EXPLAIN CREATE TABLE ... AS SELECT`: the plan of its SELECT, which is what runs (as the
/// insert into the new table). `EXPLAIN ANALYZE` of one is refused: it would have to create and
/// fill the table.
fn explain_of_create_as(statement: &DfStatement) -> Result<Option<DfStatement>, QueryError> {
    let DfStatement::Explain(explain) = statement else { return Ok(None) };
    let DfStatement::Statement(inner) = explain.statement.as_ref() else { return Ok(None) };
    let Statement::CreateTable(CreateTable { query: Some(query), .. }) = inner.as_ref() else { return Ok(None) };
    if explain.options.analyze {
        return Err(QueryError::Unsupported(
            "EXPLAIN ANALYZE CREATE TABLE ... AS SELECT would create and fill the table; EXPLAIN ANALYZE its SELECT"
                .into(),
        ));
    }
    let mut explain = explain.clone();
    explain.statement = Box::new(DfStatement::Statement(Box::new(Statement::Query(query.clone()))));
    Ok(Some(DfStatement::Explain(explain)))
}

/// A statement answered by the query `sql` instead (for DataFusion).
fn rewritten(sql: &str) -> Result<Classified, QueryError> {
    let mut parsed = datafusion::sql::parser::DFParser::parse_sql(sql)?;
    let statement = parsed.pop_front().ok_or_else(|| QueryError::Rejected("empty statement".into()))?;
    Ok(Classified::DataFusion(statement))
}

/// The single, unqualified table name of a DROP or TRUNCATE.
fn one_name(names: &[ObjectName], what: &str) -> Result<String, QueryError> {
    match names {
        [name] => table_name(name, what),
        _ => Err(QueryError::Rejected(format!("{what} takes exactly one table, {} given", names.len()))),
    }
}

/// The table a one-part name means, as queries resolve it: unquoted names are lowercased (DataFusion
/// normalizes identifiers so), quoted ones kept as written; `CREATE TABLE Sales` makes `sales`,
/// which `SELECT ... FROM Sales` then finds.
fn table_name(name: &ObjectName, what: &str) -> Result<String, QueryError> {
    match name.0.as_slice() {
        [part] => part
            .as_ident()
            .map(|ident| match ident.quote_style {
                None => ident.value.to_ascii_lowercase(),
                Some(_) => ident.value.clone(),
            })
            .ok_or_else(|| QueryError::Rejected(format!("{what}: {name} is not a table name"))),
        _ => Err(QueryError::Rejected(format!(
            "{what}: {name}: tables live in the default schema; give the table name without a schema"
        ))),
    }
}

async fn create_table(mut create: CreateTable, state: &SessionState, world_size: u32) -> Result<Command, QueryError> {
    let name = table_name(&create.name, "CREATE TABLE")?;
    let query = create.query.clone();
    if query.is_some() && !create.columns.is_empty() {
        return Err(QueryError::Rejected(format!(
            "CREATE TABLE {name}: give a column list or AS SELECT, not both (the columns of AS SELECT are \
             the query's; rename them with AS in the query)"
        )));
    }
    let options = match std::mem::take(&mut create.table_options) {
        CreateTableOptions::None => Vec::new(),
        CreateTableOptions::With(options) => options.iter().map(option_pair).collect::<Result<Vec<_>, _>>()?,
        other => {
            return Err(QueryError::Rejected(format!(
                "CREATE TABLE {name}: {other} is not supported; give options as WITH (shard_key = 'col', ...)"
            )));
        }
    };
    let if_not_exists = create.if_not_exists;
    let plan = state.statement_to_plan(DfStatement::Statement(Box::new(Statement::CreateTable(create)))).await?;
    let LogicalPlan::Ddl(DdlStatement::CreateMemoryTable(cmd)) = plan else {
        return Err(QueryError::Rejected(format!("CREATE TABLE {name}: unsupported form of CREATE TABLE")));
    };
    if !cmd.constraints.is_empty() {
        return Err(QueryError::Rejected(format!(
            "CREATE TABLE {name}: constraints (PRIMARY KEY, UNIQUE...) are not supported"
        )));
    }
    if !cmd.column_defaults.is_empty() {
        return Err(QueryError::Rejected(format!("CREATE TABLE {name}: column DEFAULT values are not supported")));
    }
    // A query's columns have the types its rows will have: those of the analyzed plan, where
    // shardwise's rules have run (a DECIMAL average keeps 16 fractional digits,
    // `crate::numeric_coercion`), not the types DataFusion first planned.
    let input_schema = match query {
        Some(_) => {
            let input = Arc::unwrap_or_clone(Arc::clone(&cmd.input));
            Arc::clone(state.analyzer().execute_and_check(input, state.config_options(), |_, _| {})?.schema())
        }
        None => Arc::clone(cmd.input.schema()),
    };
    // DataFusion maps VARCHAR/TEXT to Utf8View by default; tables store plain Utf8. A query's
    // columns become nullable ones, as in PostgreSQL and DuckDB (tables have no NOT NULL).
    let fields: Vec<Field> = input_schema
        .fields()
        .iter()
        .map(|f| {
            let data_type = match f.data_type() {
                DataType::Utf8View | DataType::LargeUtf8 => DataType::Utf8,
                other => other.clone(),
            };
            Field::new(f.name(), data_type, f.is_nullable() || query.is_some())
        })
        .collect();
    // A negative scale (DECIMAL(5, -1): multiples of ten) is an Arrow type no client protocol
    // carries and no text reader parses; PostgreSQL and DuckDB refuse it too.
    if let Some(f) = fields.iter().find(|f| matches!(f.data_type(), DataType::Decimal128(_, s) if *s < 0)) {
        return Err(QueryError::Rejected(format!(
            "table {name}: column {:?} is {}: a DECIMAL's scale must be 0 or more",
            f.name(),
            f.data_type()
        )));
    }
    let schema = Arc::new(Schema::new(fields));
    let def = TableDef::from_options(name.clone(), schema, &options, world_size)
        .map_err(|e| QueryError::Rejected(e.to_string()))?;
    let Some(query) = query else { return Ok(Command::Ddl(CatalogOp::CreateTable { def, if_not_exists })) };
    // The query's text as sqlparser prints it parses back to the same query.
    let insert_sql = format!("INSERT INTO {} {query}", crate::sql_text::quote_identifier(&name));
    let dialect = state.config().options().sql_parser.dialect;
    let insert = state.sql_to_statement(&insert_sql, &dialect)?;
    Ok(Command::CreateTableAs { def, if_not_exists, insert })
}

/// `key = value` of a `WITH` option, the value as text (`'a,b'`, `2`, `immediate`).
fn option_pair(option: &SqlOption) -> Result<(String, String), QueryError> {
    let SqlOption::KeyValue { key, value } = option else {
        return Err(QueryError::Rejected(format!("table option {option}: expected key = value")));
    };
    let text = crate::sql_text::value_text(value);
    Ok((key.value.clone(), text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_query_is_recognised_and_checked() {
        let cmd = kill_command("KILL QUERY WHERE query_id = 'a-1';").expect("parse");
        assert!(matches!(cmd, Some(Command::Kill { query_id }) if query_id == "a-1"));
        assert!(kill_command("SELECT 1").expect("parse").is_none());
        let err = kill_command("KILL QUERY 12").expect_err("bad form");
        assert!(err.to_string().contains("KILL QUERY WHERE query_id"), "{err}");
    }

    #[test]
    fn check_table_is_recognised_and_checked() {
        let cmd = check_command("check table Sales;").expect("parse");
        assert!(matches!(cmd, Some(Command::Check { table }) if table == "sales"));
        let cmd = check_command("CHECK TABLE \"Sales\"").expect("parse");
        assert!(matches!(cmd, Some(Command::Check { table }) if table == "Sales"));
        let cmd = check_command("CHECK TABLE public.sales").expect("parse");
        assert!(matches!(cmd, Some(Command::Check { table }) if table == "sales"));
        let err = check_command("CHECK TABLE system.tables").expect_err("not sharded");
        assert!(err.to_string().contains("system has no sharded tables"), "{err}");
        assert!(check_command("SELECT 'check table t'").expect("parse").is_none());
        for bad in ["CHECK TABLE", "CHECK TABLE t PARTITION 1", "CHECK TABLE a, b"] {
            let err = check_command(bad).expect_err(bad);
            assert!(err.to_string().contains("expected CHECK TABLE <table>"), "{bad}: {err}");
        }
    }

    #[test]
    fn repair_table_is_recognised_and_checked() {
        let cmd = repair_command("repair table Sales;").expect("parse");
        assert!(matches!(cmd, Some(Command::Repair { table }) if table == "sales"));
        let cmd = repair_command("REPAIR TABLE public.\"Sales\"").expect("parse");
        assert!(matches!(cmd, Some(Command::Repair { table }) if table == "Sales"));
        assert!(repair_command("CHECK TABLE t").expect("parse").is_none());
        assert!(check_command("REPAIR TABLE t").expect("parse").is_none());
        let err = repair_command("REPAIR TABLE system.tables").expect_err("not sharded");
        assert!(err.to_string().starts_with("REPAIR TABLE: tables live in the default schema"), "{err}");
        for bad in ["REPAIR TABLE", "REPAIR TABLE t PARTITION 1", "repair table a, b"] {
            let err = repair_command(bad).expect_err(bad);
            assert!(err.to_string().contains("expected REPAIR TABLE <table>"), "{bad}: {err}");
            assert!(err.to_string().ends_with("REPAIR TABLE repairs them all)"), "{bad}: {err}");
        }
    }

    #[test]
    fn table_names_are_normalized_as_queries_resolve_them() {
        use datafusion::sql::sqlparser::dialect::GenericDialect;
        use datafusion::sql::sqlparser::parser::Parser;
        let name = |sql: &str| match Parser::parse_sql(&GenericDialect {}, sql).ok().and_then(|mut s| s.pop()) {
            Some(Statement::Drop { names, .. }) => one_name(&names, "DROP TABLE").ok(),
            _ => None,
        };
        assert_eq!(name("DROP TABLE Sales").as_deref(), Some("sales"));
        assert_eq!(name("DROP TABLE \"Sales\"").as_deref(), Some("Sales"));
        assert!(name("DROP TABLE a.b").is_none());
    }
}
