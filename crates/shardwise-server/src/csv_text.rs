//! Answers as CSV or TabSeparated, for the HTTP API and `shardwise sql --format csv|tsv`,
//! written so that they read back as they were. CSV: NULL is an empty field and an empty string
//! is `""` (PostgreSQL's and DuckDB's convention, which `shardwise load` and `COPY ... FROM` read
//! back the same way); Arrow's CSV writer wrote both as an empty field. TabSeparated (ClickHouse's
//! default format): NULL is `\N`, and a backslash, tab, line feed or carriage return in a value is
//! written `\\`, `\t`, `\n`, `\r` (PostgreSQL's text format, which `COPY ... FROM` and an HTTP
//! `INSERT ... FORMAT TSV` read back). List, struct and map values, which CSV has no
//! form for, are written as JSON (`[1,null,3]`, `["a,b",null,""]`, `{"a":1}`), which keeps a NULL
//! element apart from an empty one, and strings quoted; Arrow's writer fails on them part-way
//! through an answer. Other values are written as Arrow's CSV writer writes them.

use datafusion::arrow::array::{Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::json::writer::{EncoderOptions, make_encoder};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};

/// How an answer's text is delimited and escaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextFormat {
    Csv,
    /// TabSeparated.
    Tsv,
}

impl TextFormat {
    fn delimiter(self) -> u8 {
        match self {
            TextFormat::Csv => b',',
            TextFormat::Tsv => b'\t',
        }
    }

    /// A field's value, quoted (CSV) or escaped (TabSeparated).
    fn write_value(self, value: &[u8], out: &mut Vec<u8>) {
        match self {
            TextFormat::Csv => write_field(value, out),
            TextFormat::Tsv => write_escaped(value, out),
        }
    }
}

/// Writes the header row of a CSV answer: the column names.
pub fn write_header(schema: &Schema, out: &mut Vec<u8>) {
    write_header_as(TextFormat::Csv, schema, out)
}

/// Writes the header row: the column names.
pub fn write_header_as(format: TextFormat, schema: &Schema, out: &mut Vec<u8>) {
    for (i, field) in schema.fields().iter().enumerate() {
        if i > 0 {
            out.push(format.delimiter());
        }
        format.write_value(field.name().as_bytes(), out);
    }
    out.extend_from_slice(b"\n");
}

/// Writes the rows of `batch` as CSV, one line each.
pub fn write_rows(batch: &RecordBatch, out: &mut Vec<u8>) -> Result<(), ArrowError> {
    write_rows_as(TextFormat::Csv, batch, out)
}

/// Writes the rows of `batch`, one line each.
pub fn write_rows_as(format: TextFormat, batch: &RecordBatch, out: &mut Vec<u8>) -> Result<(), ArrowError> {
    let options = FormatOptions::default().with_display_error(true);
    let json_options = EncoderOptions::default().with_explicit_nulls(true);
    let schema = batch.schema();
    let mut columns = Vec::with_capacity(batch.num_columns());
    for (field, array) in schema.fields().iter().zip(batch.columns()) {
        columns.push(match is_nested(field.data_type()) {
            true => Column::Json(make_encoder(field, array.as_ref(), &json_options)?),
            false => Column::Text(ArrayFormatter::try_new(array.as_ref(), &options)?),
        });
    }
    // Logical nulls: a column of untyped NULLs (`SELECT NULL`) has no validity buffer.
    let nulls: Vec<_> = batch.columns().iter().map(|a| a.logical_nulls()).collect();
    let mut value = Vec::new();
    for row in 0..batch.num_rows() {
        for (i, column) in columns.iter_mut().enumerate() {
            if i > 0 {
                out.push(format.delimiter());
            }
            value.clear();
            if nulls[i].as_ref().is_some_and(|n| n.is_null(row)) {
                if format == TextFormat::Tsv {
                    out.extend_from_slice(b"\\N");
                }
                continue;
            }
            match column {
                Column::Text(formatter) => {
                    use std::io::Write as _;
                    write!(value, "{}", formatter.value(row)).map_err(|e| ArrowError::CsvError(e.to_string()))?;
                }
                Column::Json(encoder) => encoder.encode(row, &mut value),
            }
            match (format, value.is_empty()) {
                (TextFormat::Csv, true) => out.extend_from_slice(b"\"\""),
                (format, _) => format.write_value(&value, out),
            }
        }
        out.push(b'\n');
    }
    Ok(())
}

/// A column's writer: Arrow's display text, or JSON for nested values.
enum Column<'a> {
    Text(ArrayFormatter<'a>),
    Json(datafusion::arrow::json::writer::NullableEncoder<'a>),
}

fn is_nested(data_type: &DataType) -> bool {
    match data_type {
        DataType::Dictionary(_, value) => is_nested(value),
        other => other.is_nested(),
    }
}

/// A field, quoted when it holds a comma, a quote or a line break (quotes doubled inside).
fn write_field(value: &[u8], out: &mut Vec<u8>) {
    if !value.iter().any(|b| matches!(b, b',' | b'"' | b'\r' | b'\n')) {
        out.extend_from_slice(value);
        return;
    }
    out.push(b'"');
    for &b in value {
        if b == b'"' {
            out.push(b'"');
        }
        out.push(b);
    }
    out.push(b'"');
}

/// A TabSeparated field: backslash, tab, line feed and carriage return escaped.
fn write_escaped(value: &[u8], out: &mut Vec<u8>) {
    for &b in value {
        match b {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\t' => out.extend_from_slice(b"\\t"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            other => out.push(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{ArrayRef, Int64Array, ListArray, StringArray, TimestampMicrosecondArray};
    use datafusion::arrow::datatypes::Int64Type;

    use super::*;

    fn csv(batch: &RecordBatch) -> String {
        let mut out = Vec::new();
        write_header(&batch.schema(), &mut out);
        write_rows(batch, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn an_empty_string_is_quoted_and_null_is_an_empty_field() {
        let s = StringArray::from(vec![Some(""), None, Some("a,b"), Some("say \"hi\"\nthere")]);
        let n = Int64Array::from(vec![Some(1), None, Some(-3), Some(4)]);
        let batch =
            RecordBatch::try_from_iter([("s", Arc::new(s) as ArrayRef), ("n, m", Arc::new(n) as ArrayRef)]).unwrap();
        assert_eq!(csv(&batch), "s,\"n, m\"\n\"\",1\n,\n\"a,b\",-3\n\"say \"\"hi\"\"\nthere\",4\n");
    }

    #[test]
    fn tab_separated_escapes_and_writes_null_as_backslash_n() {
        let s = StringArray::from(vec![Some(""), None, Some("a\tb\\c"), Some("two\nlines\r")]);
        let n = Int64Array::from(vec![Some(1), None, Some(-3), Some(4)]);
        let batch =
            RecordBatch::try_from_iter([("s", Arc::new(s) as ArrayRef), ("n\tm", Arc::new(n) as ArrayRef)]).unwrap();
        let mut out = Vec::new();
        write_header_as(TextFormat::Tsv, &batch.schema(), &mut out);
        write_rows_as(TextFormat::Tsv, &batch, &mut out).unwrap();
        let want = "s\tn\\tm\n\t1\n\\N\t\\N\na\\tb\\\\c\t-3\ntwo\\nlines\\r\t4\n";
        assert_eq!(String::from_utf8(out).unwrap(), want);
    }

    #[test]
    fn an_untyped_null_is_an_empty_field() {
        // `SELECT NULL AS c, '' AS b`: a NullArray has no validity buffer to say so.
        let null = datafusion::arrow::array::NullArray::new(2);
        let b = StringArray::from(vec![Some(""), Some("x")]);
        let batch =
            RecordBatch::try_from_iter([("c", Arc::new(null) as ArrayRef), ("b", Arc::new(b) as ArrayRef)]).unwrap();
        assert_eq!(csv(&batch), "c,b\n,\"\"\n,x\n");
    }

    #[test]
    fn nested_values_are_json() {
        let list = ListArray::from_iter_primitive::<Int64Type, _, _>(vec![
            Some(vec![Some(1), None, Some(3)]),
            None,
            Some(vec![]),
        ]);
        let strings = datafusion::arrow::array::ListArray::new(
            Arc::new(datafusion::arrow::datatypes::Field::new_list_field(DataType::Utf8, true)),
            datafusion::arrow::buffer::OffsetBuffer::from_lengths([3, 0, 0]),
            Arc::new(StringArray::from(vec![Some("a,b"), None, Some("")])),
            None,
        );
        let batch =
            RecordBatch::try_from_iter([("l", Arc::new(list) as ArrayRef), ("s", Arc::new(strings) as ArrayRef)])
                .unwrap();
        assert_eq!(csv(&batch), "l,s\n\"[1,null,3]\",\"[\"\"a,b\"\",null,\"\"\"\"]\"\n,[]\n[],[]\n");
    }

    #[test]
    fn timestamps_are_written_as_arrow_writes_them() {
        let ts = TimestampMicrosecondArray::from(vec![1_614_834_367_123_456]);
        let batch = RecordBatch::try_from_iter([("t", Arc::new(ts) as ArrayRef)]).unwrap();
        assert_eq!(csv(&batch), "t\n2021-03-04T05:06:07.123456\n");
    }
}
