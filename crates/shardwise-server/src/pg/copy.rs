//! The `COPY` statements of the PostgreSQL endpoint, read with sqlparser's PostgreSQL dialect:
//! `COPY (query) TO STDOUT` and `COPY table [(columns)] TO STDOUT` ([`super::copy_out`]),
//! `COPY table [(columns)] FROM STDIN` ([`super::copy_in`]), what psql's `\copy` sends; with
//! PostgreSQL's text format or CSV (`CSV`, `FORMAT csv`), `HEADER`, `DELIMITER` and `NULL`.
//! `COPY` to or from a file on the server is refused: nothing reads or writes server files.

use datafusion::sql::sqlparser::ast::{
    CopyLegacyCsvOption, CopyLegacyOption, CopyOption, CopySource, CopyTarget, ObjectName, Statement as SqlStatement,
};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;
use pgwire::error::{PgWireError, PgWireResult};
use shardwise_query::QueryError;

use super::errors::pg_error;

/// How COPY data is written and read: PostgreSQL's text format or CSV, and their options.
#[derive(Debug, Clone, PartialEq)]
pub struct CopyFormat {
    /// CSV, else PostgreSQL's text format.
    pub(crate) csv: bool,
    /// The first line is a header.
    pub(crate) header: bool,
    pub(crate) delimiter: char,
    /// What stands for NULL (`\N` in text, nothing in CSV, unless the NULL option says).
    pub(crate) null: String,
}

/// A `COPY` statement shardwise runs.
#[derive(Debug, Clone, PartialEq)]
pub enum Copy {
    /// `COPY (query) TO STDOUT`, `COPY table [(columns)] TO STDOUT`: the query whose rows go out.
    Out { query: String, format: CopyFormat },
    /// `COPY table [(columns)] FROM STDIN [SETTINGS name = value, ...]`: the table, the columns
    /// named (empty: all), and the insert's own settings (`insert_id`, `insert_quorum`).
    In { table: String, columns: Vec<String>, format: CopyFormat, settings: Vec<(String, String)> },
}

fn refused(message: String) -> PgWireError {
    pg_error(QueryError::Unsupported(message))
}

/// The `COPY` in `sql`, if it is one: `COPY ... TO STDOUT` or `COPY t FROM STDIN`; an error for
/// the other forms; `None` for any other statement.
pub fn parse(sql: &str) -> PgWireResult<Option<Copy>> {
    let first = sql.trim_start().get(..4).unwrap_or("");
    if !first.eq_ignore_ascii_case("copy") {
        return Ok(None);
    }
    // A trailing SETTINGS clause, as on an INSERT: how a COPY names its insert (`insert_id`).
    let (sql, settings) = shardwise_query::settings::split_settings_clause(sql).map_err(pg_error)?;
    let statements = Parser::parse_sql(&PostgreSqlDialect {}, &sql)
        .map_err(|e| pg_error(QueryError::Rejected(format!("COPY: {e}"))))?;
    let [SqlStatement::Copy { source, to, target, options, legacy_options, .. }] = statements.as_slice() else {
        return Ok(None);
    };
    let expected = if *to { CopyTarget::Stdout } else { CopyTarget::Stdin };
    if *target != expected {
        return Err(refused(
            "COPY: only COPY ... TO STDOUT and COPY table FROM STDIN (psql's \\copy); nothing reads or \
             writes server files"
                .into(),
        ));
    }
    let query = match source {
        CopySource::Query(_) if !to => return Err(refused("COPY FROM STDIN loads a table, not a query".into())),
        CopySource::Query(query) => query.to_string(),
        CopySource::Table { table_name, columns } if columns.is_empty() => format!("SELECT * FROM {table_name}"),
        CopySource::Table { table_name, columns } => {
            let columns: Vec<String> = columns.iter().map(ToString::to_string).collect();
            format!("SELECT {} FROM {table_name}", columns.join(", "))
        }
    };
    let mut copy = CopyFormat { csv: false, header: false, delimiter: '\t', null: String::new() };
    let mut delimiter = None;
    let mut null = None;
    for option in options {
        match option {
            CopyOption::Format(name) if name.value.eq_ignore_ascii_case("csv") => copy.csv = true,
            CopyOption::Format(name) if name.value.eq_ignore_ascii_case("text") => copy.csv = false,
            CopyOption::Header(on) => copy.header = *on,
            CopyOption::Delimiter(c) => delimiter = Some(*c),
            CopyOption::Null(s) => null = Some(s.clone()),
            other => return Err(refused(format!("COPY option {other} is not supported"))),
        }
    }
    for option in legacy_options {
        match option {
            CopyLegacyOption::Csv(csv_options) => {
                copy.csv = true;
                for o in csv_options {
                    match o {
                        CopyLegacyCsvOption::Header => copy.header = true,
                        other => return Err(refused(format!("COPY option {other} is not supported"))),
                    }
                }
            }
            CopyLegacyOption::Header => copy.header = true,
            CopyLegacyOption::Delimiter(c) => delimiter = Some(*c),
            CopyLegacyOption::Null(s) => null = Some(s.clone()),
            other => return Err(refused(format!("COPY option {other} is not supported"))),
        }
    }
    copy.delimiter = delimiter.unwrap_or(if copy.csv { ',' } else { '\t' });
    copy.null = null.unwrap_or_else(|| if copy.csv { String::new() } else { "\\N".into() });
    if matches!(copy.delimiter, '\n' | '\r' | '\\' | '"') {
        return Err(refused(format!("COPY delimiter {:?} cannot be used", copy.delimiter)));
    }
    match source {
        CopySource::Table { table_name, columns } if !to => Ok(Some(Copy::In {
            table: table_of(table_name)?,
            // Unquoted names fold to lower case, as everywhere in DataFusion.
            columns: columns
                .iter()
                .map(|c| if c.quote_style.is_some() { c.value.clone() } else { c.value.to_lowercase() })
                .collect(),
            format: copy,
            settings,
        })),
        _ if !settings.is_empty() => Err(refused(
            "COPY ... TO STDOUT: a SETTINGS clause goes inside the query, COPY (SELECT ... SETTINGS ...) TO STDOUT"
                .into(),
        )),
        _ => Ok(Some(Copy::Out { query, format: copy })),
    }
}

/// The table a `COPY ... FROM` names, as the catalog spells it (see [`table_name`]).
fn table_of(name: &ObjectName) -> Result<String, PgWireError> {
    table_name(name).map_err(|e| refused(format!("COPY {e}")))
}

/// The table `name` names, as the catalog spells it: an unquoted name folded to lower case, a
/// quoted one as written, with an optional schema `public` (where every table is). The error
/// starts with the name as written.
pub(crate) fn table_name(name: &ObjectName) -> Result<String, String> {
    let parts: Vec<String> = name
        .0
        .iter()
        .map(|part| match part.as_ident() {
            Some(ident) if ident.quote_style.is_some() => Ok(ident.value.clone()),
            Some(ident) => Ok(ident.value.to_lowercase()),
            None => Err(format!("{name}: not a table name")),
        })
        .collect::<Result<_, _>>()?;
    match parts.as_slice() {
        [table] => Ok(table.clone()),
        [schema, table] if schema == "public" => Ok(table.clone()),
        _ => Err(format!("{name}: tables live in schema public; name the table alone")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psql_copy_statements_are_read() {
        let out = |sql: &str| match parse(sql).unwrap().unwrap() {
            Copy::Out { query, format } => (query, format),
            other => panic!("{other:?}"),
        };
        let (q, c) = out("COPY ( SELECT a FROM t ) TO STDOUT CSV HEADER");
        assert_eq!(
            (q.as_str(), c.csv, c.header, c.delimiter, c.null.as_str()),
            ("SELECT a FROM t", true, true, ',', "")
        );
        let (q, c) = out("copy t (a, b) to stdout with (format csv, header true, delimiter ';')");
        assert_eq!((q.as_str(), c.csv, c.header, c.delimiter), ("SELECT a, b FROM t", true, true, ';'));
        let (q, c) = out("COPY t TO STDOUT");
        assert_eq!((q.as_str(), c.csv, c.delimiter, c.null.as_str()), ("SELECT * FROM t", false, '\t', "\\N"));
        assert_eq!(parse("SELECT 1").unwrap(), None);
        let Some(Copy::In { table, columns, format, settings }) =
            parse("COPY t (a, \"B\") FROM STDIN CSV HEADER").unwrap()
        else {
            panic!("COPY FROM STDIN")
        };
        assert!(settings.is_empty());
        assert_eq!(
            (table.as_str(), columns, format.csv, format.header),
            ("t", vec!["a".into(), "B".into()], true, true)
        );
        // Table names as everywhere else: unquoted ones fold to lower case; schema public.
        for (sql, name) in [
            ("COPY \"MixedCase\" FROM STDIN", "MixedCase"),
            ("COPY TX FROM STDIN", "tx"),
            ("COPY public.Tx FROM STDIN CSV", "tx"),
        ] {
            let Some(Copy::In { table, .. }) = parse(sql).unwrap() else { panic!("{sql}") };
            assert_eq!(table, name, "{sql}");
        }
        // The insert's own settings, as on an INSERT.
        let named = parse("COPY t FROM STDIN (FORMAT csv) SETTINGS insert_id = 'load-7', insert_quorum = 1").unwrap();
        let Some(Copy::In { settings, format, .. }) = named else { panic!("COPY FROM STDIN SETTINGS") };
        let expected =
            vec![("insert_id".to_string(), "load-7".to_string()), ("insert_quorum".to_string(), "1".to_string())];
        assert_eq!((settings, format.csv), (expected, true));
        for bad in [
            "COPY t TO STDOUT SETTINGS max_execution_time_ms = 5",
            "COPY t FROM '/tmp/x'",
            "COPY t TO '/tmp/x'",
            "COPY t TO STDOUT (FORMAT binary, FREEZE)",
            "COPY other.t FROM STDIN",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
