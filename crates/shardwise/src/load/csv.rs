//! CSV input: a header row naming the columns (matched to the table's by name, in any order), then
//! one record per row. An empty field is NULL; a table column the file lacks is NULL throughout.
//!
//! Arrow's CSV decoder (`arrow::csv::reader::Decoder`) splits records into text columns, and
//! [`super::convert_column`] turns each into the table's type. Arrow's reader does not say where a
//! record is (its errors count records, not lines, and a quoted field may span lines), so
//! [`Records`] first runs `csv_core`, the tokenizer inside Arrow's reader with the same settings,
//! over the same bytes: it finds each record's bytes, first line and field count. Field-count and
//! UTF-8 errors, and every bad value, then name the line a text editor shows.

use std::io::Read;
use std::sync::Arc;

use anyhow::{Context, anyhow, bail};
use arrow::array::{RecordBatch, new_null_array};
use arrow::csv::reader::ReaderBuilder;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::error::ArrowError;

mod records;

use records::{Record, Records, split_fields};

use super::progress::Progress;
use super::{BadValue, assemble, convert_column, first_null, no_such_column, quote_short, text_converts_to};

/// Reads CSV from `input` (named `label` in errors) into batches of `schema`.
pub fn read<R: Read>(
    input: R,
    label: &str,
    schema: &SchemaRef,
    batch_rows: usize,
    progress: &Progress,
) -> anyhow::Result<Vec<RecordBatch>> {
    let mut records = Records::new(input);
    let Some(header) = records.next(progress).with_context(|| format!("cannot read {label}"))? else {
        return Ok(Vec::new());
    };
    let columns = Columns::from_header(&records, &header, schema, label)?;
    records.discard_through(header.end);
    let mut batches = Vec::new();
    let mut pending: Vec<Record> = Vec::new();
    loop {
        let next = records.next(progress).with_context(|| format!("cannot read {label}"))?;
        if let Some(record) = next {
            columns.check_record(&records, &record, label)?;
            pending.push(record);
        }
        if pending.len() == batch_rows || (next.is_none() && !pending.is_empty()) {
            batches.push(columns.batch(&records, &pending, schema, label)?);
            progress.advance(0, pending.len() as u64);
            if let Some(last) = pending.last() {
                records.discard_through(last.end);
            }
            pending.clear();
        }
        if next.is_none() {
            return Ok(batches);
        }
    }
}

/// How the file's columns (header order) map onto the table's.
struct Columns {
    /// The header's names, in file order.
    names: Vec<String>,
    header_line: u64,
    /// For each table column, its position in the file, if the file has it.
    source: Vec<Option<usize>>,
}

impl Columns {
    /// Reads the header and checks it: known, distinct names; every NOT NULL column present.
    fn from_header<R>(
        records: &Records<R>,
        header: &Record,
        schema: &SchemaRef,
        label: &str,
    ) -> anyhow::Result<Columns> {
        let at = format!("{label} line {} (the header)", header.line);
        let mut names = Vec::new();
        for (index, field) in split_fields(records.record_bytes(header)).into_iter().enumerate() {
            match String::from_utf8(field.value) {
                Ok(name) => names.push(name),
                Err(_) => bail!("{at}, column {}: the name is not valid UTF-8", index + 1),
            }
        }
        let mut source = vec![None; schema.fields().len()];
        for (position, name) in names.iter().enumerate() {
            let Ok(table_index) = schema.index_of(name) else {
                bail!("{at}, column {} {}: {}", position + 1, quote_short(name), no_such_column(schema, name));
            };
            if let Some(first) = source[table_index] {
                bail!("{at}: column {} appears twice (columns {} and {})", quote_short(name), first + 1, position + 1);
            }
            let data_type = schema.field(table_index).data_type();
            if !text_converts_to(data_type) {
                bail!("{at}: column {} has type {data_type}, which load cannot read from CSV", quote_short(name));
            }
            source[table_index] = Some(position);
        }
        for (field, found) in schema.fields().iter().zip(&source) {
            if found.is_none() && !field.is_nullable() {
                bail!("{at}: no column {}, which the table requires (NOT NULL)", quote_short(field.name()));
            }
        }
        Ok(Columns { names, header_line: header.line, source })
    }

    /// Checks a record's field count and encoding before Arrow sees it.
    fn check_record<R>(&self, records: &Records<R>, record: &Record, label: &str) -> anyhow::Result<()> {
        let expected = self.names.len();
        if record.fields != expected {
            let detail = match self.names.get(record.fields) {
                Some(name) if record.fields < expected => {
                    format!("column {} {} is missing", record.fields + 1, quote_short(name))
                }
                _ => format!("field {} has no column", expected + 1),
            };
            bail!(
                "{label} line {}: {} fields, but the header (line {}) has {expected}: {detail}",
                record.line,
                record.fields,
                self.header_line
            );
        }
        if let Err(e) = std::str::from_utf8(records.record_bytes(record)) {
            let offset = record.content + e.valid_up_to();
            let column = self.column_at(records, record, offset);
            let line = records.line_at(record, offset);
            bail!("{label} line {line}, {}: not valid UTF-8", self.describe_column(column));
        }
        Ok(())
    }

    /// Decodes `pending` (consecutive records) with Arrow into text columns, then converts them.
    fn batch<R>(
        &self,
        records: &Records<R>,
        pending: &[Record],
        schema: &SchemaRef,
        label: &str,
    ) -> anyhow::Result<RecordBatch> {
        let (Some(first), Some(last)) = (pending.first(), pending.last()) else {
            return Ok(RecordBatch::new_empty(schema.clone()));
        };
        let lines = format!("{label} lines {}-{}", first.line, last.line);
        let text = decode_text(&records.buf[first.start..last.end], self.names.len(), pending.len())
            .with_context(|| format!("{lines}: cannot split into fields"))?;
        if text.num_rows() != pending.len() {
            bail!(
                "internal error (a bug in shardwise load): {lines}: Arrow's CSV reader found {} records, the scanner {}",
                text.num_rows(),
                pending.len()
            );
        }
        let mut columns = Vec::with_capacity(schema.fields().len());
        for (field, source) in schema.fields().iter().zip(&self.source) {
            let column = match source {
                Some(position) => convert_column(text.column(*position), field.data_type())
                    .map_err(|bad| self.bad_value(records, pending, *position, bad, label))?,
                None => new_null_array(field.data_type(), text.num_rows()),
            };
            if !field.is_nullable()
                && let (Some(row), Some(position)) = (first_null(&column), source)
            {
                let at = self.place(records, &pending[row], *position, label);
                bail!("{at}: empty, but the column is NOT NULL");
            }
            columns.push(column);
        }
        assemble(schema, columns)
    }

    fn bad_value<R>(
        &self,
        records: &Records<R>,
        pending: &[Record],
        position: usize,
        bad: BadValue,
        label: &str,
    ) -> anyhow::Error {
        match bad.row.and_then(|row| pending.get(row)) {
            Some(record) => anyhow!("{}: {}", self.place(records, record, position, label), bad.message),
            None => anyhow!("{label}, {}: {}", self.describe_column(position), bad.message),
        }
    }

    /// `FILE line L, column K "name"` for field `position` of `record`, L the line the field starts on.
    fn place<R>(&self, records: &Records<R>, record: &Record, position: usize, label: &str) -> String {
        let fields = split_fields(records.record_bytes(record));
        let offset = record.content + fields.get(position).map_or(0, |f| f.start);
        format!("{label} line {}, {}", records.line_at(record, offset), self.describe_column(position))
    }

    /// The field of `record` that holds byte `offset`.
    fn column_at<R>(&self, records: &Records<R>, record: &Record, offset: usize) -> usize {
        let fields = split_fields(records.record_bytes(record));
        let within = offset - record.content;
        fields.iter().rposition(|f| f.start <= within).unwrap_or(0)
    }

    fn describe_column(&self, position: usize) -> String {
        match self.names.get(position) {
            Some(name) => format!("column {} {}", position + 1, quote_short(name)),
            None => format!("column {}", position + 1),
        }
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
