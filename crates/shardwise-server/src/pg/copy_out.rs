//! `COPY (query) TO STDOUT` and `COPY table [(columns)] TO STDOUT`, what psql's `\copy ... to
//! 'file'` sends: the rows stream to the client as PostgreSQL's text format (tab-separated, `\N`
//! for NULL, backslash escapes) or, with `CSV` / `FORMAT csv`, as CSV (NULL an empty field, an
//! empty string `""`), with a header row on request. Values are written as PostgreSQL writes them
//! (`t`/`f`, `2024-01-31 10:00:00`, lists as `[1, 2]`). `COPY ... FROM STDIN` is
//! [`super::copy_in`]'s; `COPY` to or from a server file is refused.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StringArray};
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::error::DataFusionError;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::sql::sqlparser::ast::{
    CopyLegacyCsvOption, CopyLegacyOption, CopyOption, CopySource, CopyTarget, Statement as SqlStatement,
};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;
use futures::{StreamExt, TryStreamExt, stream};
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::copy::CopyData;
use shardwise_query::QueryError;

use super::errors::pg_error;

/// A `COPY ... TO STDOUT`: the query whose rows go out, and how they are written.
#[derive(Debug, Clone, PartialEq)]
pub struct CopyOut {
    pub query: String,
    csv: bool,
    header: bool,
    delimiter: char,
    null: String,
}

/// A `COPY` statement shardwise runs.
#[derive(Debug, Clone, PartialEq)]
pub enum Copy {
    /// `COPY ... TO STDOUT`.
    Out(CopyOut),
    /// `COPY table [(columns)] FROM STDIN`: the table, the columns named (empty: all), and the
    /// format, read as [`CopyOut`] would write it.
    In { table: String, columns: Vec<String>, format: CopyOut },
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
    let statements = Parser::parse_sql(&PostgreSqlDialect {}, sql)
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
    let mut copy = CopyOut { query, csv: false, header: false, delimiter: '\t', null: String::new() };
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
            table: table_name.to_string(),
            // Unquoted names fold to lower case, as everywhere in DataFusion.
            columns: columns
                .iter()
                .map(|c| if c.quote_style.is_some() { c.value.clone() } else { c.value.to_lowercase() })
                .collect(),
            format: copy,
        })),
        _ => Ok(Some(Copy::Out(copy))),
    }
}

impl CopyOut {
    /// Text (`false`) or CSV.
    pub fn csv(&self) -> bool {
        self.csv
    }

    /// Whether the first line is a header.
    pub fn header(&self) -> bool {
        self.header
    }

    pub fn delimiter(&self) -> char {
        self.delimiter
    }

    /// What stands for NULL.
    pub fn null(&self) -> &str {
        &self.null
    }
}

impl CopyOut {
    /// The rows of `results` as COPY data: one message per row, after the header if asked for.
    ///
    /// The header travels in the first row's message (pgwire counts messages for the `COPY n`
    /// tag, which counts rows), or alone when there are no rows.
    pub fn data(
        self,
        results: SendableRecordBatchStream,
    ) -> impl futures::Stream<Item = PgWireResult<CopyData>> + Send + 'static {
        let header = self.header.then(|| {
            let names: Vec<Option<String>> = results.schema().fields().iter().map(|f| Some(f.name().clone())).collect();
            self.line(&names)
        });
        let header = Arc::new(std::sync::Mutex::new(header));
        let unsent = Arc::clone(&header);
        let this = Arc::new(self);
        let rows = results
            .map_err(|e| pg_error(QueryError::from(e)))
            .and_then(move |batch| {
                let (this, header) = (Arc::clone(&this), Arc::clone(&header));
                async move {
                    let mut lines = this.lines(&batch)?;
                    if let Some(first) = lines.first_mut()
                        && let Some(h) = header.lock().unwrap_or_else(|p| p.into_inner()).take()
                    {
                        first.insert_str(0, &h);
                    }
                    Ok(lines)
                }
            })
            .map_ok(|lines| stream::iter(lines.into_iter().map(|l| Ok(CopyData::new(l.into())))))
            .try_flatten();
        let last = stream::once(async move { unsent.lock().unwrap_or_else(|p| p.into_inner()).take() })
            .filter_map(|h| async move { h.map(|h| Ok(CopyData::new(h.into()))) });
        rows.chain(last)
    }

    fn lines(&self, batch: &RecordBatch) -> PgWireResult<Vec<String>> {
        let columns: Vec<StringArray> = batch.columns().iter().map(pg_text).collect::<Result<_, _>>()?;
        Ok((0..batch.num_rows())
            .map(|row| {
                let values: Vec<Option<String>> =
                    columns.iter().map(|c| c.is_valid(row).then(|| c.value(row).to_string())).collect();
                self.line(&values)
            })
            .collect())
    }

    /// One row, ended by a newline.
    fn line(&self, values: &[Option<String>]) -> String {
        let mut out = String::new();
        for (i, value) in values.iter().enumerate() {
            if i > 0 {
                out.push(self.delimiter);
            }
            match value {
                None => out.push_str(&self.null),
                Some(v) if self.csv => self.push_csv(&mut out, v),
                Some(v) => self.push_text(&mut out, v),
            }
        }
        out.push('\n');
        out
    }

    /// CSV: quoted when it holds the delimiter, a quote, a line break, or reads as NULL.
    fn push_csv(&self, out: &mut String, v: &str) {
        let quote = v == self.null || v.contains([self.delimiter, '"', '\n', '\r']);
        if quote {
            out.push('"');
            out.push_str(&v.replace('"', "\"\""));
            out.push('"');
        } else {
            out.push_str(v);
        }
    }

    /// PostgreSQL's text format: backslash escapes for the characters it gives meaning to.
    fn push_text(&self, out: &mut String, v: &str) {
        for c in v.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                c if c == self.delimiter => {
                    out.push('\\');
                    out.push(c);
                }
                c => out.push(c),
            }
        }
    }
}

/// A column's values as PostgreSQL writes them in text: booleans `t`/`f`, timestamps with a
/// space, the rest as Arrow displays them; NULLs stay NULL.
fn pg_text(column: &ArrayRef) -> PgWireResult<StringArray> {
    let len = column.len();
    if let DataType::Boolean = column.data_type() {
        let b = column.as_boolean();
        return Ok((0..len).map(|i| b.is_valid(i).then(|| if b.value(i) { "t" } else { "f" })).collect());
    }
    let options = FormatOptions::default()
        .with_timestamp_format(Some("%Y-%m-%d %H:%M:%S%.f"))
        .with_timestamp_tz_format(Some("%Y-%m-%d %H:%M:%S%.f%:z"))
        .with_datetime_format(Some("%Y-%m-%d %H:%M:%S%.f"));
    let formatter = ArrayFormatter::try_new(column.as_ref(), &options)
        .map_err(|e| pg_error(QueryError::from(DataFusionError::from(e))))?;
    Ok((0..len).map(|i| column.is_valid(i).then(|| formatter.value(i).to_string())).collect())
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{BooleanArray, Int64Array};

    use super::*;

    fn copy(sql: &str) -> CopyOut {
        match parse(sql).unwrap().unwrap() {
            Copy::Out(c) => c,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn psql_copy_statements_are_read() {
        let c = copy("COPY ( SELECT a FROM t ) TO STDOUT CSV HEADER");
        assert_eq!(
            (c.query.as_str(), c.csv, c.header, c.delimiter, c.null.as_str()),
            ("SELECT a FROM t", true, true, ',', "")
        );
        let c = copy("copy t (a, b) to stdout with (format csv, header true, delimiter ';')");
        assert_eq!((c.query.as_str(), c.csv, c.header, c.delimiter), ("SELECT a, b FROM t", true, true, ';'));
        let c = copy("COPY t TO STDOUT");
        assert_eq!((c.query.as_str(), c.csv, c.delimiter, c.null.as_str()), ("SELECT * FROM t", false, '\t', "\\N"));
        assert_eq!(parse("SELECT 1").unwrap(), None);
        let Some(Copy::In { table, columns, format }) = parse("COPY t (a, \"B\") FROM STDIN CSV HEADER").unwrap()
        else {
            panic!("COPY FROM STDIN")
        };
        assert_eq!(
            (table.as_str(), columns, format.csv, format.header),
            ("t", vec!["a".into(), "B".into()], true, true)
        );
        for bad in ["COPY t FROM '/tmp/x'", "COPY t TO '/tmp/x'", "COPY t TO STDOUT (FORMAT binary, FREEZE)"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn values_are_written_as_postgresql_writes_them() {
        let batch = RecordBatch::try_from_iter([
            ("n", Arc::new(Int64Array::from(vec![Some(1), None])) as ArrayRef),
            ("s", Arc::new(StringArray::from(vec![Some("a\tb,\"c\""), Some("")])) as ArrayRef),
            ("b", Arc::new(BooleanArray::from(vec![Some(true), None])) as ArrayRef),
        ])
        .unwrap();
        let text = copy("COPY t TO STDOUT").lines(&batch).unwrap();
        assert_eq!(text, vec!["1\ta\\tb,\"c\"\tt\n", "\\N\t\t\\N\n"]);
        let csv = copy("COPY t TO STDOUT CSV").lines(&batch).unwrap();
        assert_eq!(csv, vec!["1,\"a\tb,\"\"c\"\"\",t\n", ",\"\",\n"]);
    }
}
