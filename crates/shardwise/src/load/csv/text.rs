//! A chunk's records as text columns, one per column of the file, each value a string or NULL
//! (an empty field): what Arrow's CSV decoder makes of them, except that a quoted empty field
//! (`""`) bound for a text column is an empty string, as PostgreSQL and DuckDB read it and as
//! shardwise's CSV answers write one ([`keep_quoted_empties`]).
//!
//! Records with a quoted field go through Arrow's decoder (`csv_core` unquotes them). The others,
//! most of most files, hold their values verbatim between commas, so they are split here, which
//! gives the same columns without tokenizing the bytes a second time.

use std::sync::Arc;

use anyhow::{Context, bail};
use arrow::array::{Array, ArrayRef, NullBufferBuilder, RecordBatch, StringArray};
use arrow::buffer::{Buffer, OffsetBuffer, ScalarBuffer};
use arrow::csv::reader::ReaderBuilder;
use arrow::datatypes::{DataType, Field, Schema};
use arrow::error::ArrowError;

use super::records::{Record, split_fields};

/// A UTF-8 byte order mark: a fresh Arrow decoder skips one at the start of its input.
const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// The text columns of `records` (consecutive, each with `columns` fields, valid UTF-8), whose
/// offsets refer to `bytes`; `lines` names them in errors. `text[i]` says whether column `i` is
/// read into a text column of the table.
pub fn text_columns(
    bytes: &[u8],
    records: &[Record],
    columns: usize,
    text_targets: &[bool],
    lines: &str,
) -> anyhow::Result<Vec<ArrayRef>> {
    let span = match (records.first(), records.last()) {
        (Some(first), Some(last)) => &bytes[first.start..last.end],
        _ => &[],
    };
    // A file of one column has blank lines among its records, which Arrow's decoder would skip.
    if columns == 1 {
        return Ok(vec![one_column(bytes, records, text_targets.first() == Some(&true), lines)?]);
    }
    // Arrow's decoder would skip a byte order mark at the start of its input.
    if !records.iter().any(|r| r.quoted) && !span.starts_with(UTF8_BOM) {
        return split_unquoted(bytes, records, columns, lines);
    }
    let text =
        decode_text(span, columns, records.len()).with_context(|| format!("{lines}: cannot split into fields"))?;
    if text.num_rows() != records.len() {
        bail!(
            "internal error (a bug in shardwise load): {lines}: Arrow's CSV reader found {} records, the scanner {}",
            text.num_rows(),
            records.len()
        );
    }
    let mut columns = text.columns().to_vec();
    keep_quoted_empties(bytes, records, text_targets, &mut columns);
    Ok(columns)
}

/// Makes each quoted empty field (`""`) of a text column an empty string where Arrow's decoder,
/// which cannot tell it from an unquoted one, made it NULL. Only records with a quoted field are
/// looked at again.
fn keep_quoted_empties(bytes: &[u8], records: &[Record], text_targets: &[bool], columns: &mut [ArrayRef]) {
    let mut empty_rows: Vec<Vec<usize>> = vec![Vec::new(); columns.len()];
    for (row, record) in records.iter().enumerate() {
        let null_text = |i: usize| text_targets.get(i) == Some(&true) && columns.get(i).is_some_and(|c| c.is_null(row));
        if !record.quoted || !(0..columns.len()).any(null_text) {
            continue;
        }
        let raw = record.text(bytes);
        for (i, field) in split_fields(raw).iter().enumerate() {
            if null_text(i) && field.value.is_empty() && raw.get(field.start) == Some(&b'"') {
                empty_rows[i].push(row);
            }
        }
    }
    for (column, rows) in columns.iter_mut().zip(empty_rows) {
        let Some(strings) = column.as_any().downcast_ref::<StringArray>().filter(|_| !rows.is_empty()) else {
            continue;
        };
        let mut rows = rows.into_iter().peekable();
        let fixed: StringArray = (0..strings.len())
            .map(|row| match rows.next_if_eq(&row) {
                Some(_) => Some(""),
                None => strings.is_valid(row).then(|| strings.value(row)),
            })
            .collect();
        *column = Arc::new(fixed);
    }
}

/// Arrow's CSV decoder over exactly `rows` complete records, every field as nullable text (an
/// empty field is NULL). A fresh decoder per batch sizes its buffers to the batch.
fn decode_text(bytes: &[u8], columns: usize, rows: usize) -> Result<RecordBatch, ArrowError> {
    let fields: Vec<Field> = (0..columns).map(|i| Field::new(format!("c{i}"), DataType::Utf8, true)).collect();
    let schema = Arc::new(Schema::new(fields));
    let mut decoder = ReaderBuilder::new(schema.clone()).with_header(false).with_batch_size(rows).build_decoder();
    let mut rest = bytes;
    while !rest.is_empty() {
        let used = decoder.decode(rest)?;
        if used == 0 {
            break;
        }
        rest = &rest[used..];
    }
    // End of input: completes a last record that has no line break after it.
    decoder.decode(&[])?;
    Ok(decoder.flush()?.unwrap_or_else(|| RecordBatch::new_empty(schema)))
}

/// The one text column of a file of one column, record by record: an unquoted record's value is
/// its bytes (NULL when blank), a quoted one's is unquoted by the tokenizer (`""` is an empty
/// string when the column is `text`, else NULL, as in [`keep_quoted_empties`]).
fn one_column(bytes: &[u8], records: &[Record], text: bool, lines: &str) -> anyhow::Result<ArrayRef> {
    let room = records.last().map_or(0, |last| last.end) - records.first().map_or(0, |first| first.content);
    let mut column = TextColumn::with_capacity(records.len(), room);
    for record in records {
        let raw = without_line_break(record.text(bytes));
        if !record.quoted {
            column.push(raw);
            continue;
        }
        let value = split_fields(raw).into_iter().next().map(|field| field.value).unwrap_or_default();
        match value.is_empty() && text && raw.starts_with(b"\"") {
            true => column.push_empty_string(),
            false => column.push(&value),
        }
    }
    column.finish(records.len(), 0, lines)
}

/// A record's bytes without the line break that ends it, if one does.
fn without_line_break(text: &[u8]) -> &[u8] {
    match text.last() {
        Some(b'\r' | b'\n') => &text[..text.len() - 1],
        _ => text,
    }
}

/// The text columns of records without a quoted field: each field is the bytes between commas.
fn split_unquoted(bytes: &[u8], records: &[Record], columns: usize, lines: &str) -> anyhow::Result<Vec<ArrayRef>> {
    let room = bytes.len() / columns.max(1);
    let mut built: Vec<TextColumn> = (0..columns).map(|_| TextColumn::with_capacity(records.len(), room)).collect();
    for record in records {
        let text = without_line_break(record.text(bytes));
        for (column, field) in built.iter_mut().zip(text.split(|&b| b == b',')) {
            column.push(field);
        }
    }
    built.into_iter().enumerate().map(|(index, column)| column.finish(records.len(), index, lines)).collect()
}

/// A text column being built: the values end to end, where each ends, which are NULL.
struct TextColumn {
    values: Vec<u8>,
    offsets: Vec<i32>,
    nulls: NullBufferBuilder,
}

impl TextColumn {
    fn with_capacity(rows: usize, value_bytes: usize) -> TextColumn {
        let mut offsets = Vec::with_capacity(rows + 1);
        offsets.push(0);
        TextColumn { values: Vec::with_capacity(value_bytes), offsets, nulls: NullBufferBuilder::new(rows) }
    }

    /// Appends a field: NULL when empty, as Arrow's CSV reader has it.
    fn push(&mut self, field: &[u8]) {
        self.values.extend_from_slice(field);
        // Exact unless the values pass `i32::MAX` bytes, which `finish` rejects.
        self.offsets.push(self.values.len() as i32);
        self.nulls.append(!field.is_empty());
    }

    /// Appends an empty string (not NULL).
    fn push_empty_string(&mut self) {
        self.offsets.push(self.values.len() as i32);
        self.nulls.append_non_null();
    }

    fn finish(mut self, rows: usize, index: usize, lines: &str) -> anyhow::Result<ArrayRef> {
        if i32::try_from(self.values.len()).is_err() {
            bail!(
                "{lines}: column {} has more than 2 GiB of text in one batch: load with a smaller --batch-rows",
                index + 1
            );
        }
        if self.offsets.len() != rows + 1 {
            bail!(
                "internal error (a bug in shardwise load): {lines}: column {} has {} values, not {rows}",
                index + 1,
                self.offsets.len() - 1
            );
        }
        // A text column may be kept as it is (for a text column of the table): no spare room.
        self.values.shrink_to_fit();
        let offsets = OffsetBuffer::new(ScalarBuffer::from(self.offsets));
        let array = StringArray::try_new(offsets, Buffer::from_vec(self.values), self.nulls.finish())
            .with_context(|| format!("internal error (a bug in shardwise load): {lines}: column {}", index + 1))?;
        Ok(Arc::new(array))
    }
}

#[cfg(test)]
mod tests {
    use super::super::records::Records;
    use super::*;
    use crate::load::progress::Progress;

    /// The records after the header of `text`, and the buffer they refer to.
    fn records(text: &[u8]) -> (Vec<u8>, Vec<Record>) {
        let (mut records, progress) = (Records::new(text), Progress::hidden());
        let header = records.next(&progress).expect("read").expect("a header");
        records.take_through(header.end);
        let mut found = Vec::new();
        while let Some(record) = records.next(&progress).expect("read") {
            found.push(record);
        }
        (records.buf().to_vec(), found)
    }

    #[test]
    fn unquoted_records_split_as_arrow_decodes_them() {
        let pieces = ["", "a", "bc", "a\"b", "x\"\"", "caf\u{e9}", " 1 ", "\u{feff}z"];
        let breaks = ["\n", "\r\n", "\r", "\n\n", "\r\n\r\n"];
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        let mut checked = 0;
        for _ in 0..500 {
            let columns = 1 + next(4);
            let mut text = format!("{}\n", vec!["h"; columns].join(","));
            for row in 0..next(12) {
                if row > 0 {
                    text.push_str(breaks[next(breaks.len())]);
                }
                let fields: Vec<&str> = (0..columns).map(|_| pieces[next(pieces.len())]).collect();
                text.push_str(&fields.join(","));
            }
            if next(2) == 0 {
                text.push('\n');
            }
            let (bytes, found) = records(text.as_bytes());
            let (Some(first), Some(last)) = (found.first(), found.last()) else { continue };
            let span = &bytes[first.start..last.end];
            // Arrow's decoder skips a byte order mark at the start of its input, so that goes to it.
            if span.starts_with(UTF8_BOM) {
                continue;
            }
            assert!(found.iter().all(|r| !r.quoted && r.fields == columns), "{text:?}");
            let split = split_unquoted(&bytes, &found, columns, "lines").expect("split");
            let decoded = decode_text(span, columns, found.len()).expect("decoded");
            assert_eq!(split, decoded.columns(), "{text:?}");
            checked += 1;
        }
        assert!(checked > 300, "{checked} inputs checked");
    }
}
