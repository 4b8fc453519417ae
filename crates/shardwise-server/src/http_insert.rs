//! `INSERT INTO t [(columns)] [SETTINGS ...] FORMAT name` followed by the rows themselves, as
//! ClickHouse's HTTP interface takes them: `curl --data-binary @rows.csv
//! 'http://HOST:PORT/query?query=INSERT%20INTO%20t%20FORMAT%20CSV'`, or the statement and the
//! rows in one body, the rows starting on the line after the statement.
//!
//! Why: a ClickHouse user's first way to put a file into a table over HTTP. Without it the rows
//! were read as SQL and failed with a parser error.
//!
//! How: [`parse`] finds the statement's end (the format's name after the word `FORMAT`), reads
//! the statement with sqlparser's ClickHouse dialect, and leaves the rest as the data. The rows
//! then go the way of a PostgreSQL `COPY t FROM STDIN` (`crate::pg::copy_in`): checked whole
//! (every field converted to its column's type; an error names its line and column, and nothing
//! is written), then stored as one insert, with the statement's settings (`insert_id`,
//! `insert_quorum`). Formats: `CSV` and `TabSeparated` (`TSV`), and their `WithNames` forms,
//! whose first line names the columns the rows hold, and `JSONEachRow` (`json_rows`). An
//! unquoted empty CSV field, or `\N` in TabSeparated, is NULL, as in what the HTTP API writes.
//! `Parquet`, `ArrowStream` and `Arrow` carry their types and go the way of a Flight SQL bulk
//! ingest instead (`typed_rows`).

use std::sync::Arc;

use bytes::Bytes;
use datafusion::arrow::array::{RecordBatch, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::sql::sqlparser::ast::{Statement, TableObject};
use datafusion::sql::sqlparser::dialect::ClickHouseDialect;
use datafusion::sql::sqlparser::parser::Parser;
use shardwise_query::{QueryEngine, QueryError, Session};

use crate::pg::copy::{CopyFormat, table_name};
use crate::pg::copy_in::{PendingCopyIn, target_columns};

mod ipc_body;
mod json_rows;
mod typed_rows;

pub use typed_rows::TypedFormat;

/// The formats an `INSERT ... FORMAT` over HTTP reads (ClickHouse's names, in any case).
pub const INPUT_FORMATS: &str = "CSV, CSVWithNames, TabSeparated (TSV), TabSeparatedWithNames (TSVWithNames), \
                                 JSONEachRow, Parquet, ArrowStream, Arrow";

/// How the rows of an `INSERT ... FORMAT` are written.
#[derive(Debug, Clone, PartialEq)]
pub enum RowsFormat {
    /// CSV or TabSeparated (PostgreSQL's text format), as a `COPY`'s; `header` for `WithNames`.
    Text(CopyFormat),
    /// One JSON object per line (`json_rows`).
    JsonEachRow,
    /// Typed columns (`typed_rows`).
    Typed(TypedFormat),
}

/// An `INSERT ... FORMAT` and its rows.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpInsert {
    /// The table, as the catalog spells it.
    pub table: String,
    /// The columns the statement names, as the catalog spells them (empty: all, or, with a
    /// `WithNames` format, those of the first line).
    pub columns: Vec<String>,
    /// The statement's own settings (its `SETTINGS` clause).
    pub settings: Vec<(String, String)>,
    /// How the rows are written.
    pub format: RowsFormat,
    /// The rows, as sent.
    pub data: Bytes,
}

/// The `INSERT ... FORMAT name` at the start of `body` and the rows after it; `None` when
/// `body` is not one (another statement, or an INSERT with VALUES or a SELECT: planned as SQL).
/// The statement is text; the rows after it may be binary (`Parquet`, `ArrowStream`).
pub fn parse(body: &Bytes) -> Result<Option<HttpInsert>, QueryError> {
    // The statement is read from the part of the body that is UTF-8; binary rows follow it.
    let text = match std::str::from_utf8(body) {
        Ok(text) => text,
        Err(e) => std::str::from_utf8(&body[..e.valid_up_to()]).unwrap_or_default(),
    };
    let start = text.trim_start();
    let offset = text.len() - start.len();
    if !start.get(..6).is_some_and(|w| w.eq_ignore_ascii_case("insert")) {
        return Ok(None);
    }
    let Some((header_end, name)) = format_name(start) else { return Ok(None) };
    let header = &start[..header_end];
    // A statement that does not read as an INSERT with a FORMAT clause (the word in a string,
    // say) is left to the SQL planner, which says what is wrong with it.
    let Ok(statements) = Parser::parse_sql(&ClickHouseDialect {}, header) else { return Ok(None) };
    let [Statement::Insert(insert)] = statements.as_slice() else { return Ok(None) };
    if insert.format_clause.is_none() || insert.source.is_some() {
        return Ok(None);
    }
    let TableObject::TableName(table) = &insert.table else {
        return Err(bad(format!("INSERT INTO {}: not a table", insert.table)));
    };
    let table = table_name(table).map_err(|e| bad(format!("INSERT INTO {e}")))?;
    let format = input_format(name).ok_or_else(|| {
        bad(format!("INSERT INTO {table} FORMAT {name}: not a format shardwise reads; accepted: {INPUT_FORMATS}"))
    })?;
    let columns = insert
        .columns
        .iter()
        .map(|c| match c.0.as_slice() {
            [part] => match part.as_ident() {
                Some(ident) if ident.quote_style.is_some() => Ok(ident.value.clone()),
                Some(ident) => Ok(ident.value.to_lowercase()),
                None => Err(bad(format!("INSERT INTO {table}: {c} is not a column name"))),
            },
            _ => Err(bad(format!("INSERT INTO {table}: {c} is not a column name"))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let settings = insert
        .settings
        .iter()
        .flatten()
        .map(|s| (s.key.value.to_lowercase(), shardwise_query::sql_text::value_text(&s.value)))
        .collect();
    let rows_start = offset + header_end + rows_after(&body[offset + header_end..]);
    Ok(Some(HttpInsert { table, columns, settings, format, data: body.slice(rows_start..) }))
}

/// Where the statement ends in `text` (just after the format's name) and the name: the first
/// word `FORMAT`, outside quotes, followed by a name.
fn format_name(text: &str) -> Option<(usize, &str)> {
    let bytes = text.as_bytes();
    let mut quote: Option<u8> = None;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match quote {
            Some(q) if b == q => quote = None,
            Some(_) => {}
            None if matches!(b, b'\'' | b'"' | b'`') => quote = Some(b),
            None => {
                let word_start = i == 0 || !is_word(bytes[i - 1]);
                // Compared as bytes: `i` may be inside a character of a name like `tä`; the match
                // is ASCII, so every offset sliced below is a character boundary.
                if word_start && bytes.get(i..i + 6).is_some_and(|w| w.eq_ignore_ascii_case(b"format")) {
                    let after = i + 6;
                    let name_start =
                        after + text[after..].len() - text[after..].trim_start_matches([' ', '\t', '\r', '\n']).len();
                    let name_len = text[name_start..].bytes().take_while(|&c| is_word(c)).count();
                    if name_start > after && name_len > 0 {
                        return Some((name_start + name_len, &text[name_start..name_start + name_len]));
                    }
                }
            }
        }
        i += 1;
    }
    None
}

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Where the rows start in what follows the statement: on the next line, or after the spaces
/// that follow the format's name when the rows start on the same line.
fn rows_after(rest: &[u8]) -> usize {
    let spaces = rest.iter().take_while(|&&b| b == b' ' || b == b'\t').count();
    let rest = &rest[spaces..];
    spaces
        + match rest {
            [b'\r', b'\n', ..] => 2,
            [b'\n', ..] => 1,
            _ => 0,
        }
}

fn input_format(name: &str) -> Option<RowsFormat> {
    let csv = CopyFormat { csv: true, header: false, delimiter: ',', null: String::new() };
    let tsv = CopyFormat { csv: false, header: false, delimiter: '\t', null: "\\N".into() };
    let text = match name.to_ascii_lowercase().as_str() {
        "csv" => csv,
        "csvwithnames" => CopyFormat { header: true, ..csv },
        "tabseparated" | "tsv" => tsv,
        "tabseparatedwithnames" | "tsvwithnames" => CopyFormat { header: true, ..tsv },
        "jsoneachrow" => return Some(RowsFormat::JsonEachRow),
        "parquet" => return Some(RowsFormat::Typed(TypedFormat::Parquet)),
        "arrowstream" => return Some(RowsFormat::Typed(TypedFormat::ArrowStream)),
        "arrow" => return Some(RowsFormat::Typed(TypedFormat::ArrowFile)),
        _ => return None,
    };
    Some(RowsFormat::Text(text))
}

/// Stores `insert`'s rows under a session of `settings` (the request's), then the statement's
/// own; answers with their count, as an `INSERT` statement does.
pub async fn store(
    engine: &QueryEngine,
    insert: HttpInsert,
    settings: &[(String, String)],
) -> Result<SendableRecordBatchStream, QueryError> {
    let session = engine.session_with(settings)?;
    // A bad setting of the statement fails before the rows are read.
    engine.session_with(&insert.settings)?;
    let table = &insert.table;
    let stated = &insert.columns;
    let rows = match &insert.format {
        RowsFormat::Typed(format) => {
            let (schema, _) = target_columns(engine, &session, table, &[], "INSERT INTO").await?;
            let batches = typed_rows::batches(*format, table, stated, &insert.data, &schema)?;
            let sql = format!("INSERT INTO {table} FORMAT ... (rows in the HTTP body)");
            engine.insert_batches(table, batches, &session, &insert.settings, &sql).await?
        }
        _ => store_text(engine, &session, insert).await?,
    };
    let counted = Arc::new(Schema::new(vec![Field::new("count", DataType::UInt64, false)]));
    let batch = RecordBatch::try_new(Arc::clone(&counted), vec![Arc::new(UInt64Array::from(vec![rows]))])
        .map_err(|e| QueryError::Internal(e.into()))?;
    Ok(Box::pin(RecordBatchStreamAdapter::new(counted, futures::stream::iter([Ok(batch)]))))
}

/// Stores rows written as text (CSV, TabSeparated, JSONEachRow): converted as a `COPY`'s are.
async fn store_text(engine: &QueryEngine, session: &Arc<Session>, insert: HttpInsert) -> Result<u64, QueryError> {
    let table = &insert.table;
    let stated = &insert.columns;
    let data = std::str::from_utf8(&insert.data).map_err(|e| {
        let line = insert.data[..e.valid_up_to()].iter().filter(|&&b| b == b'\n').count() + 1;
        bad(format!("INSERT INTO {table} line {line}: the rows are not UTF-8 ({e})"))
    })?;
    // The columns the rows hold: those a header line or the JSON keys name (which must agree
    // with the statement's, when it names any), else the statement's.
    let (names, json) = match &insert.format {
        RowsFormat::Text(format) if format.header => {
            let header = header_names(format, data)
                .map_err(|e| bad(format!("INSERT INTO {table} line 1 (the column names): {e}")))?;
            if !stated.is_empty() && *stated != header {
                return Err(bad(format!(
                    "INSERT INTO {table}: the statement names columns ({}) and the first line others ({}); give them once",
                    stated.join(", "),
                    header.join(", ")
                )));
            }
            (header, None)
        }
        RowsFormat::JsonEachRow => {
            let (keys, rows) = json_rows::rows(table, data)?;
            if let Some((key, line)) = keys.iter().find(|(k, _)| !stated.is_empty() && !stated.contains(k)) {
                return Err(bad(format!(
                    "INSERT INTO {table} line {line}: the rows have {key:?}, which the statement's columns ({}) \
                     leave out",
                    stated.join(", ")
                )));
            }
            let (schema, _) = target_columns(engine, session, table, &[], "INSERT INTO").await?;
            if let Some((key, line)) = keys.iter().find(|(k, _)| schema.index_of(k).is_err()) {
                return Err(bad(format!("INSERT INTO {table} line {line}: no column {key:?} in {table}")));
            }
            (keys.into_iter().map(|(k, _)| k).collect(), Some(rows))
        }
        RowsFormat::Text(_) | RowsFormat::Typed(_) => (stated.clone(), None),
    };
    let (schema, columns) = target_columns(engine, session, table, &names, "INSERT INTO").await?;
    // JSON rows come split already (`batch_of`); the text format is then never read.
    let text = match &insert.format {
        RowsFormat::Text(format) => format.clone(),
        _ => CopyFormat { csv: true, header: false, delimiter: ',', null: String::new() },
    };
    let mut pending = PendingCopyIn::new(table.clone(), schema, columns, text, insert.settings).named("INSERT INTO");
    let batch = match json {
        Some(rows) => pending.batch_of(&rows)?,
        None => {
            pending.push(data.as_bytes());
            pending.batch()?
        }
    };
    let sql = format!("INSERT INTO {table} FORMAT ... (rows in the HTTP body)");
    engine.insert_batches(table, vec![batch], session, &pending.settings, &sql).await
}

fn bad(message: String) -> QueryError {
    QueryError::Rejected(message)
}

/// The column names in the first line of a `WithNames` format's rows.
pub fn header_names(format: &CopyFormat, data: &str) -> Result<Vec<String>, String> {
    let first = data.lines().next().unwrap_or("");
    if format.csv {
        let records = crate::pg::copy_csv::records(first, format.delimiter)?;
        Ok(records
            .into_iter()
            .next()
            .map(|(_, fields)| fields.into_iter().map(|f| f.text).collect())
            .unwrap_or_default())
    } else {
        Ok(first.split(format.delimiter).map(str::to_string).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn insert(text: &str) -> HttpInsert {
        parse(&Bytes::from(text.to_string())).expect("parses").expect("an INSERT ... FORMAT")
    }

    fn parse_text(text: &str) -> Result<Option<HttpInsert>, QueryError> {
        parse(&Bytes::from(text.to_string()))
    }

    fn data(i: &HttpInsert) -> &str {
        std::str::from_utf8(&i.data).expect("text rows")
    }

    #[test]
    fn the_statement_ends_at_the_format_name_and_the_rows_follow() {
        let i = insert("INSERT INTO t FORMAT CSV\n1,a\n2,b\n");
        assert_eq!((i.table.as_str(), data(&i)), ("t", "1,a\n2,b\n"));
        let RowsFormat::Text(format) = &i.format else { panic!("CSV") };
        assert!(i.columns.is_empty() && i.settings.is_empty() && format.csv && !format.header);
        let i = insert(
            "  insert into \"Big\" (id, \"Name\") SETTINGS insert_id = 'b-1', insert_quorum = 2 format TSVWithNames\r\nid\tName\n",
        );
        assert_eq!((i.table.as_str(), i.columns.clone()), ("Big", vec!["id".to_string(), "Name".to_string()]));
        assert_eq!(i.settings, vec![("insert_id".into(), "b-1".into()), ("insert_quorum".into(), "2".into())]);
        let RowsFormat::Text(format) = &i.format else { panic!("TSV") };
        assert!(!format.csv && format.header && format.null == "\\N");
        assert_eq!(data(&i), "id\tName\n");
        // The rows may start on the statement's line, and the statement may be all there is.
        assert_eq!(data(&insert("INSERT INTO t FORMAT CSV 1,a")), "1,a");
        assert_eq!(data(&insert("INSERT INTO public.t FORMAT CSVWithNames")), "");
        // Names and rows beyond ASCII; unquoted, such names are not read by the ClickHouse
        // dialect, and the statement goes to the planner (scanned without slicing a character).
        let i = insert("INSERT INTO \"tä\" (\"größe\") FORMAT CSV\nü,1\n");
        assert_eq!((i.table.as_str(), data(&i)), ("tä", "ü,1\n"));
        assert_eq!(i.columns, vec!["größe".to_string()]);
        assert_eq!(parse_text("INSERT INTO tä (größe) FORMAT CSV\nü,1\n").expect("no error"), None);
        // Binary rows after the statement are kept byte for byte.
        let body = Bytes::from_static(b"INSERT INTO t FORMAT Parquet\r\nPAR1\xff\x00\nINSERT");
        let i = parse(&body).expect("parses").expect("an INSERT ... FORMAT");
        assert_eq!((i.format, &i.data[..]), (RowsFormat::Typed(TypedFormat::Parquet), &b"PAR1\xff\x00\nINSERT"[..]));
    }

    #[test]
    fn other_statements_are_left_to_the_planner() {
        for sql in [
            "SELECT 1 FORMAT CSV",
            "INSERT INTO t VALUES (1, 'FORMAT CSV')",
            "INSERT INTO t SELECT * FROM u",
            "INSERT INTO t VALUES (1) FORMAT CSV",
            "INSERT INTO t (format) VALUES (1)",
        ] {
            assert_eq!(parse_text(sql).expect("no error"), None, "{sql}");
        }
    }

    #[test]
    fn an_unread_format_or_table_is_refused_by_name() {
        let err = parse_text("INSERT INTO t FORMAT Values (1)").unwrap_err().to_string();
        assert!(err.contains("FORMAT Values: not a format shardwise reads") && err.contains("CSVWithNames"), "{err}");
        let err = parse_text("INSERT INTO other.t FORMAT CSV\n1").unwrap_err().to_string();
        assert!(err.contains("tables live in schema public"), "{err}");
    }

    #[test]
    fn a_header_line_names_columns() {
        let Some(RowsFormat::Text(csv)) = input_format("CSVWithNames") else { panic!("csv") };
        assert_eq!(header_names(&csv, "id,\"a b\"\n1,2\n").expect("names"), vec!["id", "a b"]);
        let Some(RowsFormat::Text(tsv)) = input_format("TSVWithNames") else { panic!("tsv") };
        assert_eq!(header_names(&tsv, "id\tv\n").expect("names"), vec!["id", "v"]);
        assert_eq!(input_format("jsoneachrow"), Some(RowsFormat::JsonEachRow));
    }
}
