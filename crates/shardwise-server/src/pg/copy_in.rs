//! `COPY table [(columns)] FROM STDIN`, what psql's `\copy table from 'file.csv' csv header`
//! sends: the client streams the rows after the statement, in PostgreSQL's text format or CSV
//! (the options of [`super::copy`]), and they are stored as one `INSERT` of them would be.
//!
//! As everywhere in shardwise, the input is checked whole before anything is written: the data is
//! held (up to [`COPY_IN_MAX_BYTES`]), every line is split and every value converted to its
//! column's type, and only then are the rows inserted. A bad line is an error that names its line
//! and column, and the table is unchanged. Columns the statement does not name are NULL. In CSV an
//! unquoted empty field (or the NULL option's string) is NULL and a quoted `""` an empty string,
//! as in PostgreSQL ([`super::copy_csv`]); a line `\.` ends the data, as in PostgreSQL.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch, StringArray, new_null_array};
use datafusion::arrow::datatypes::SchemaRef;
use shardwise_query::query_log::RunningStatement;
use shardwise_query::{QueryEngine, QueryError, Session};

use super::copy::CopyFormat;
use shardwise_query::text_values::text_column;

/// Most bytes of COPY data one statement may send; the rows are held until the last arrives.
pub const COPY_IN_MAX_BYTES: usize = 256 << 20;

/// One line of COPY data: its line number and its fields (`None`: NULL).
pub type Row = (u64, Vec<Option<String>>);

/// A `COPY ... FROM STDIN` whose data is arriving.
#[derive(Debug)]
pub struct PendingCopyIn {
    pub table: String,
    /// The table's columns, in order.
    pub table_schema: SchemaRef,
    /// Indices into the table's columns of the columns the data holds, in the data's order.
    pub columns: Vec<usize>,
    pub format: CopyFormat,
    /// The COPY's own settings (its `SETTINGS` clause), over the connection's.
    pub settings: Vec<(String, String)>,
    data: Vec<u8>,
    /// Set when the data went past [`COPY_IN_MAX_BYTES`]; the rest is dropped.
    too_large: bool,
    /// What errors call the statement: `COPY` (PostgreSQL's), or `INSERT INTO` for the same
    /// rows sent over HTTP (`crate::http_insert`).
    verb: &'static str,
    /// A COPY's entry in `system.queries` while its data arrives; `KILL QUERY` drops the data
    /// received and what follows, and the COPY fails at its end with nothing stored.
    pub running: Option<RunningStatement>,
    /// The table's `(id, generation)` when the COPY began, which its rows go to: the client was
    /// told that table's columns, and a `RENAME` or a `DROP` and `CREATE` of the name while the
    /// data arrives must not send them to another table.
    pub incarnation: Option<(u64, u64)>,
}

impl PendingCopyIn {
    pub fn new(
        table: String,
        table_schema: SchemaRef,
        columns: Vec<usize>,
        format: CopyFormat,
        settings: Vec<(String, String)>,
    ) -> Self {
        PendingCopyIn {
            table,
            table_schema,
            columns,
            format,
            settings,
            data: Vec::new(),
            too_large: false,
            verb: "COPY",
            running: None,
            incarnation: None,
        }
    }

    /// The same, shown in `system.queries` as `running` while its data arrives.
    pub fn running(mut self, running: RunningStatement) -> Self {
        self.running = Some(running);
        self
    }

    /// The same, bound to the table `incarnation` (see the field).
    pub fn bound_to(mut self, incarnation: Option<(u64, u64)>) -> Self {
        self.incarnation = incarnation;
        self
    }

    /// The same, with errors that call the statement `verb` (`INSERT INTO`) instead of `COPY`.
    pub fn named(mut self, verb: &'static str) -> Self {
        self.verb = verb;
        self
    }

    /// Takes one CopyData message.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.killed() {
            self.data = Vec::new();
            return;
        }
        if self.too_large || self.data.len() + bytes.len() > COPY_IN_MAX_BYTES {
            self.too_large = true;
            self.data = Vec::new();
            return;
        }
        self.data.extend_from_slice(bytes);
    }

    /// Whether `KILL QUERY` stopped it.
    fn killed(&self) -> bool {
        self.running.as_ref().is_some_and(RunningStatement::killed_now)
    }

    /// The rows received, as one batch of the table's columns; or what is wrong with them.
    pub fn batch(&self) -> Result<RecordBatch, QueryError> {
        if self.killed() {
            let killed = shardwise_query::error::KILLED;
            return Err(QueryError::Rejected(format!("{} {}: {killed}; nothing was stored", self.verb, self.table)));
        }
        if self.too_large {
            return Err(bad(format!(
                "{} {}: more than {} MiB of data (COPY_IN_MAX_BYTES); load large files with `shardwise load`",
                self.verb,
                self.table,
                COPY_IN_MAX_BYTES >> 20
            )));
        }
        let text = std::str::from_utf8(&self.data)
            .map_err(|e| bad(format!("{} {}: the data is not UTF-8 ({e})", self.verb, self.table)))?;
        let rows = if self.format.csv { self.csv_rows(text)? } else { self.text_rows(text)? };
        self.batch_of(&rows)
    }

    /// `rows` (line numbers and the text of their fields, `None` for NULL, in the order of the
    /// columns given) as one batch of the table's columns; or the first field that does not fit.
    pub fn batch_of(&self, rows: &[Row]) -> Result<RecordBatch, QueryError> {
        let width = self.columns.len();
        for (line, fields) in rows {
            if fields.len() != width {
                return Err(bad(format!(
                    "{} {} line {line}: {} fields, the statement names {width} column(s)",
                    self.verb,
                    self.table,
                    fields.len()
                )));
            }
        }
        let mut columns: Vec<ArrayRef> =
            self.table_schema.fields().iter().map(|f| new_null_array(f.data_type(), rows.len())).collect();
        for (i, &column) in self.columns.iter().enumerate() {
            let field = self.table_schema.field(column);
            let text: StringArray = rows.iter().map(|(_, fields)| fields[i].as_deref()).collect();
            columns[column] = text_column(&text, field.data_type()).map_err(|e| match e.row {
                Some(r) => bad(format!(
                    "{} {} line {}, column {}: {:?} is not a {} ({})",
                    self.verb,
                    self.table,
                    rows[r].0,
                    field.name(),
                    text.value(r),
                    field.data_type(),
                    e.why
                )),
                None => bad(format!("{} {}, column {}: {}", self.verb, self.table, field.name(), e.why)),
            })?;
        }
        RecordBatch::try_new(Arc::clone(&self.table_schema), columns)
            .map_err(|e| bad(format!("{} {}: {e}", self.verb, self.table)))
    }

    /// CSV records with their line numbers; an unquoted field equal to the NULL string (empty
    /// unless the NULL option says) is NULL, a quoted one is text.
    fn csv_rows(&self, text: &str) -> Result<Vec<Row>, QueryError> {
        let records = super::copy_csv::records(text, self.format.delimiter)
            .map_err(|e| bad(format!("{} {} {e}", self.verb, self.table)))?;
        let null = &self.format.null;
        let mut rows = Vec::with_capacity(records.len());
        for (line, fields) in records.into_iter().skip(usize::from(self.format.header)) {
            if let [only] = fields.as_slice()
                && !only.quoted
                && only.text == "\\."
            {
                break;
            }
            rows.push((line, fields.into_iter().map(|f| (f.quoted || f.text != *null).then_some(f.text)).collect()));
        }
        Ok(rows)
    }

    /// PostgreSQL's text format: one line per row, fields split by the delimiter, backslash
    /// escapes, `\N` (or the NULL option) for NULL.
    fn text_rows(&self, text: &str) -> Result<Vec<Row>, QueryError> {
        let mut rows = Vec::new();
        let skip = usize::from(self.format.header);
        for (i, line) in text.lines().enumerate().skip(skip) {
            if line == "\\." {
                break;
            }
            rows.push((i as u64 + 1, self.text_fields(line)));
        }
        Ok(rows)
    }

    fn text_fields(&self, line: &str) -> Vec<Option<String>> {
        let (delimiter, null) = (self.format.delimiter, &self.format.null);
        let mut fields = Vec::new();
        let (mut raw, mut value) = (String::new(), String::new());
        let mut chars = line.chars();
        let mut end_field = |raw: &mut String, value: &mut String| {
            fields.push((raw.as_str() != null).then(|| value.clone()));
            raw.clear();
            value.clear();
        };
        while let Some(c) = chars.next() {
            if c == delimiter {
                end_field(&mut raw, &mut value);
                continue;
            }
            raw.push(c);
            if c != '\\' {
                value.push(c);
                continue;
            }
            let Some(e) = chars.next() else { break };
            raw.push(e);
            value.push(match e {
                'n' => '\n',
                'r' => '\r',
                't' => '\t',
                'b' => '\u{8}',
                'f' => '\u{c}',
                'v' => '\u{b}',
                other => other,
            });
        }
        end_field(&mut raw, &mut value);
        fields
    }
}

/// The columns of `table` (named as the catalog spells it) and the positions among them of the
/// columns `names` (all of them, in order, when `names` is empty), for rows that fill those
/// columns; an error starting with `verb` names a column the table lacks.
pub async fn target_columns(
    engine: &QueryEngine,
    session: &Arc<Session>,
    table: &str,
    names: &[String],
    verb: &str,
) -> Result<(SchemaRef, Vec<usize>), QueryError> {
    let probe = format!("SELECT * FROM {} LIMIT 0", shardwise_query::sql_text::quote_identifier(table));
    let schema = engine.plan(&probe, session).await?.schema();
    let columns = match names.is_empty() {
        true => (0..schema.fields().len()).collect(),
        false => names
            .iter()
            .map(|c| schema.index_of(c).map_err(|_| bad(format!("{verb} {table}: no column {c:?} in {table}"))))
            .collect::<Result<_, _>>()?,
    };
    Ok((schema, columns))
}

fn bad(message: String) -> QueryError {
    QueryError::Rejected(message)
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{AsArray, Int64Array};
    use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};

    use super::super::copy::{Copy, parse};
    use super::*;

    fn pending(sql: &str, columns: Vec<usize>, data: &str) -> PendingCopyIn {
        let Some(Copy::In { format, .. }) = parse(sql).unwrap() else { panic!("{sql}") };
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("s", DataType::Utf8, true),
            Field::new("b", DataType::Boolean, true),
        ]));
        let mut p = PendingCopyIn::new("t".into(), schema, columns, format, Vec::new());
        p.push(data.as_bytes());
        p
    }

    #[test]
    fn csv_and_text_rows_become_the_tables_columns() {
        let batch =
            pending("COPY t FROM STDIN CSV HEADER", vec![0, 1, 2], "id,s,b\n1,\"a,b\",t\n2,,f\n3,\"\",\n\\.\n9,x,t\n")
                .batch()
                .unwrap();
        assert_eq!(batch.num_rows(), 3);
        // A quoted empty string is text, an unquoted empty field NULL (as in PostgreSQL).
        assert_eq!((batch.column(1).as_string::<i32>().value(2), batch.column(1).is_null(2)), ("", false));
        assert!(batch.column(2).is_null(2));
        assert_eq!(batch.column(0).as_primitive::<Int64Type>(), &Int64Array::from(vec![1, 2, 3]));
        assert_eq!((batch.column(1).as_string::<i32>().value(0), batch.column(1).is_null(1)), ("a,b", true));
        let batch = pending("COPY t (s) FROM STDIN CSV NULL 'NA'", vec![1], "NA\n\"NA\"\n").batch().unwrap();
        assert_eq!((batch.column(1).is_null(0), batch.column(1).as_string::<i32>().value(1)), (true, "NA"));
        let batch = pending("COPY t (s, id) FROM STDIN", vec![1, 0], "a\\tb\\\\\t7\n\\N\t8\n").batch().unwrap();
        assert_eq!(batch.column(1).as_string::<i32>().value(0), "a\tb\\");
        assert!(batch.column(1).is_null(1) && batch.column(2).is_null(0), "unnamed columns are NULL");
        assert_eq!(batch.column(0).as_primitive::<Int64Type>().value(1), 8);
    }

    #[test]
    fn a_bad_line_is_named() {
        let err = pending("COPY t FROM STDIN CSV", vec![0, 1, 2], "1,a,t\n2,b,maybe\n").batch().unwrap_err();
        assert!(err.to_string().contains("line 2, column b: \"maybe\""), "{err}");
        let err = pending("COPY t FROM STDIN CSV", vec![0, 1, 2], "1,\"a,t\n2,b,t\n").batch().unwrap_err();
        assert!(err.to_string().contains("COPY t line 1: a quoted field is not closed"), "{err}");
        let err = pending("COPY t FROM STDIN", vec![0, 1, 2], "1\ta\n").batch().unwrap_err();
        assert!(err.to_string().contains("line 1: 2 fields"), "{err}");
        let mut big = pending("COPY t FROM STDIN", vec![0], "");
        big.push(&vec![b'1'; COPY_IN_MAX_BYTES + 1]);
        assert!(big.batch().unwrap_err().to_string().contains("COPY_IN_MAX_BYTES"));
    }
}
