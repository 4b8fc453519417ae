//! `COPY ... TO STDOUT` ([`super::copy`]), what psql's `\copy ... to 'file'` sends: the rows
//! stream to the client as PostgreSQL's text format (tab-separated, `\N` for NULL, backslash
//! escapes) or as CSV (NULL an empty field, an empty string `""`), with a header row on request.
//! Values are written as PostgreSQL writes them (`t`/`f`, `2024-01-31 10:00:00`, lists as
//! arrays: `{1,2}`, `{"a,b",NULL,""}`, `{{1,2},{3}}`), so that PostgreSQL reads them back.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, ListArray, RecordBatch, StringArray};
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::error::DataFusionError;
use datafusion::execution::SendableRecordBatchStream;
use futures::{Sink, SinkExt, StreamExt, TryStreamExt, stream};
use pgwire::api::results::Tag;
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::PgWireBackendMessage;
use pgwire::messages::copy::{CopyData, CopyDone, CopyOutResponse};
use shardwise_query::QueryError;
use shardwise_query::postgres_text::text_of;

use super::copy::CopyFormat;
use super::errors::pg_error;

/// Sends a `COPY ... TO STDOUT`'s response and rows to `client` and returns its `COPY n` tag.
///
/// Why not pgwire's `Response::CopyOut`: its sender ends a copy whose rows fail part-way (a
/// division by zero in row 150 000) with `CopyFail`, a message only clients send, so psql
/// reported a protocol error and psycopg the wrong exception. Here a failure returns the error,
/// which the caller answers with an `ErrorResponse` in the middle of the copy, as PostgreSQL does.
pub async fn send<C>(
    client: &mut C,
    columns: usize,
    data: impl futures::Stream<Item = PgWireResult<CopyData>>,
) -> PgWireResult<Tag>
where
    C: Sink<PgWireBackendMessage> + Unpin,
    C::Error: std::fmt::Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    // Text formats: every column's format code is 0.
    let column_formats = vec![0i16; columns];
    let width = i16::try_from(columns).map_err(|_| pg_error(QueryError::Rejected("too many columns".into())))?;
    client.send(PgWireBackendMessage::CopyOutResponse(CopyOutResponse::new(0, width, column_formats))).await?;
    let mut data = std::pin::pin!(data);
    let mut messages = 0;
    while let Some(message) = data.next().await {
        let message = message?;
        if !message.data.is_empty() {
            messages += 1;
            client.feed(PgWireBackendMessage::CopyData(message)).await?;
        }
    }
    client.send(PgWireBackendMessage::CopyDone(CopyDone::new())).await?;
    Ok(Tag::new("COPY").with_rows(messages))
}

impl CopyFormat {
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

/// A column's values as PostgreSQL writes them in text: booleans `t`/`f`, floats and timestamps
/// by [`text_of`], lists as arrays, the rest as Arrow displays them; NULLs stay NULL.
fn pg_text(column: &ArrayRef) -> PgWireResult<StringArray> {
    let len = column.len();
    if let DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(..) = column.data_type() {
        let list = datafusion::arrow::compute::cast(column, &DataType::new_list(list_element(column), true))
            .map_err(|e| to_pg(e.into()))?;
        return pg_array_text(list.as_list::<i32>());
    }
    match column.data_type() {
        // Floats and timestamps as PostgreSQL's output functions write them (`1`, `1e+20`,
        // `Infinity`, `2024-01-31 10:00:00.5`, `...+00`), not as Arrow displays them.
        DataType::Float32 | DataType::Float64 | DataType::Timestamp(..) => return text_of(column).map_err(to_pg),
        DataType::Float16 => {
            let f32s = datafusion::arrow::compute::cast(column, &DataType::Float32).map_err(|e| to_pg(e.into()))?;
            return text_of(&f32s).map_err(to_pg);
        }
        _ => {}
    }
    if let DataType::Boolean = column.data_type() {
        let b = column.as_boolean();
        return Ok((0..len).map(|i| b.is_valid(i).then(|| if b.value(i) { "t" } else { "f" })).collect());
    }
    let options = FormatOptions::default().with_datetime_format(Some("%Y-%m-%d %H:%M:%S%.f"));
    let formatter = ArrayFormatter::try_new(column.as_ref(), &options).map_err(|e| to_pg(e.into()))?;
    // Logical nulls: a column of untyped NULLs (`SELECT NULL`) has no validity buffer.
    let nulls = column.logical_nulls();
    let is_null = |i: usize| nulls.as_ref().is_some_and(|n| n.is_null(i));
    Ok((0..len).map(|i| (!is_null(i)).then(|| formatter.value(i).to_string())).collect())
}

fn to_pg(e: DataFusionError) -> pgwire::error::PgWireError {
    pg_error(QueryError::from(e))
}

/// The element type of a list column.
fn list_element(column: &ArrayRef) -> DataType {
    match column.data_type() {
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => f.data_type().clone(),
        other => other.clone(),
    }
}

/// Each list as PostgreSQL's array literal: `{` elements `}`, an element NULL as `NULL`, quoted
/// (with `"` and `\` escaped by a backslash) when it is empty, reads as NULL, or holds a brace, a
/// quote, a comma, a backslash or white space; an element that is itself a list is written as
/// an array, unquoted.
fn pg_array_text(list: &ListArray) -> PgWireResult<StringArray> {
    let elements = pg_text(list.values())?;
    let nested = matches!(list.value_type(), DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(..));
    let offsets = list.value_offsets();
    let mut out = Vec::with_capacity(list.len());
    for row in 0..list.len() {
        if list.is_null(row) {
            out.push(None);
            continue;
        }
        let mut text = String::from("{");
        for (n, i) in (offsets[row] as usize..offsets[row + 1] as usize).enumerate() {
            if n > 0 {
                text.push(',');
            }
            match elements.is_valid(i).then(|| elements.value(i)) {
                None => text.push_str("NULL"),
                Some(v) if nested => text.push_str(v),
                Some(v) => push_array_element(&mut text, v),
            }
        }
        text.push('}');
        out.push(Some(text));
    }
    Ok(StringArray::from(out))
}

/// One element of an array literal, quoted when PostgreSQL would quote it.
fn push_array_element(out: &mut String, v: &str) {
    let quote = v.is_empty()
        || v.eq_ignore_ascii_case("NULL")
        || v.chars().any(|c| matches!(c, '{' | '}' | ',' | '"' | '\\') || c.is_whitespace());
    if !quote {
        out.push_str(v);
        return;
    }
    out.push('"');
    for c in v.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{BooleanArray, Int64Array};

    use super::super::copy::{Copy, parse};
    use super::*;

    fn copy(sql: &str) -> CopyFormat {
        match parse(sql).unwrap().unwrap() {
            Copy::Out { format, .. } => format,
            other => panic!("{other:?}"),
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

    /// Floats and timestamps as PostgreSQL writes them, so that PostgreSQL reads them back
    /// (Arrow's display wrote `10262.0`, `1e20`, `inf` and `2024-01-31T10:00:00.500`).
    #[test]
    fn floats_and_timestamps_are_written_as_postgresql_writes_them() {
        use datafusion::arrow::array::{Float32Array, Float64Array, TimestampMicrosecondArray};
        let batch = RecordBatch::try_from_iter([
            ("d", Arc::new(Float64Array::from(vec![10262.0, 1e20, f64::INFINITY, f64::NAN, 0.5])) as ArrayRef),
            ("r", Arc::new(Float32Array::from(vec![1.5f32, 1e7, f32::NEG_INFINITY, 2.0, 1e-5])) as ArrayRef),
            (
                "ts",
                Arc::new(TimestampMicrosecondArray::from(vec![1_706_695_200_500_000, 1_706_695_200_000_000, 0, 1, -1]))
                    as ArrayRef,
            ),
            ("tz", Arc::new(TimestampMicrosecondArray::from(vec![0, 1, 2, 3, 4]).with_timezone("+00:00")) as ArrayRef),
        ])
        .unwrap();
        let text = copy("COPY t TO STDOUT").lines(&batch).unwrap();
        assert_eq!(
            text,
            vec![
                "10262\t1.5\t2024-01-31 10:00:00.5\t1970-01-01 00:00:00+00\n",
                "1e+20\t1e+07\t2024-01-31 10:00:00\t1970-01-01 00:00:00.000001+00\n",
                "Infinity\t-Infinity\t1970-01-01 00:00:00\t1970-01-01 00:00:00.000002+00\n",
                "NaN\t2\t1970-01-01 00:00:00.000001\t1970-01-01 00:00:00.000003+00\n",
                "0.5\t1e-05\t1969-12-31 23:59:59.999999\t1970-01-01 00:00:00.000004+00\n",
            ]
        );
    }

    #[test]
    fn lists_are_written_as_postgresql_arrays() {
        use datafusion::arrow::datatypes::{Field, Int64Type};
        let ints =
            ListArray::from_iter_primitive::<Int64Type, _, _>(vec![Some(vec![Some(1), None]), None, Some(vec![])]);
        let strings =
            StringArray::from(vec![Some("a,b"), None, Some(""), Some("null"), Some("x\"y\\z"), Some("plain")]);
        let field = Arc::new(Field::new_list_field(DataType::Utf8, true));
        let offsets = datafusion::arrow::buffer::OffsetBuffer::new(vec![0, 6, 6, 6].into());
        let texts = ListArray::new(field, offsets, Arc::new(strings), None);
        let nested_field = Arc::new(Field::new_list_field(ints.data_type().clone(), true));
        let nested_offsets = datafusion::arrow::buffer::OffsetBuffer::new(vec![0, 2, 2, 3].into());
        let nested = ListArray::new(nested_field, nested_offsets, Arc::new(ints.clone()), None);
        let batch = RecordBatch::try_from_iter([
            ("i", Arc::new(ints) as ArrayRef),
            ("s", Arc::new(texts) as ArrayRef),
            ("n", Arc::new(nested) as ArrayRef),
        ])
        .unwrap();
        let text = copy("COPY t TO STDOUT").lines(&batch).unwrap();
        assert_eq!(
            text,
            vec![
                "{1,NULL}\t{\"a,b\",NULL,\"\",\"null\",\"x\\\\\"y\\\\\\\\z\",plain}\t{{1,NULL},NULL}\n",
                "\\N\t{}\t{}\n",
                "{}\t{}\t{{}}\n"
            ]
        );
        let csv = copy("COPY t TO STDOUT CSV").lines(&batch).unwrap();
        assert_eq!(
            csv[0],
            "\"{1,NULL}\",\"{\"\"a,b\"\",NULL,\"\"\"\",\"\"null\"\",\"\"x\\\"\"y\\\\z\"\",plain}\",\"{{1,NULL},NULL}\"\n"
        );
    }
}
