//! CSV input: a header row naming the columns (matched to the table's by name, in any order), then
//! one record per row. An empty field is NULL; a table column the file lacks is NULL throughout.
//!
//! [`Records`] finds the records as `csv_core`, the tokenizer inside Arrow's CSV reader, does with
//! the same settings: each record's bytes, first line and field count. Arrow's reader does not say
//! where a record is (its errors count records, not lines, and a quoted field may span lines), so
//! field-count and UTF-8 errors, and every bad value, name the line a text editor shows from
//! these. [`text_columns`] makes text columns of the records, as Arrow's CSV decoder does, and
//! [`super::convert_column`] turns each into the table's type.
//!
//! Finding the records is sequential; each batch's worth of them is then checked, decoded and
//! converted on a worker thread ([`super::parallel`]), as a [`Chunk`] of its own bytes.

use std::io::Read;

use anyhow::{Context, anyhow, bail};
use arrow::array::{RecordBatch, new_null_array};
use arrow::datatypes::{DataType, SchemaRef};

mod records;
mod text;

use records::{QuoteError, Record, Records, quote_error, split_fields};
use text::text_columns;

use super::parallel::{self, Jobs};
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
    read_on(parallel::workers(), input, label, schema, batch_rows, progress)
}

/// [`read`], converting batches on `workers` threads.
pub fn read_on<R: Read>(
    workers: usize,
    input: R,
    label: &str,
    schema: &SchemaRef,
    batch_rows: usize,
    progress: &Progress,
) -> anyhow::Result<Vec<RecordBatch>> {
    let mut records = Records::new(input);
    let Some(header) = records.next(progress).with_context(|| format!("cannot read {label}"))? else {
        // A header with no rows loads no rows; no header at all is not a CSV file of this table.
        bail!("{label} is empty: it has no header row naming the columns");
    };
    let columns = Columns::from_header(records.buf(), &header, schema, label)?;
    super::note_absent_columns(schema, &columns.source, label, progress);
    records.take_through(header.end);
    if columns.names.len() == 1 {
        records.keep_blank_lines();
    }
    parallel::in_order(
        workers,
        |jobs| split(&mut records, &columns, batch_rows, label, progress, jobs),
        |chunk: Chunk| {
            let batch = columns.batch(&chunk, schema, label)?;
            progress.advance(0, chunk.records.len() as u64);
            Ok(batch)
        },
    )
}

/// Consecutive records with their bytes: one batch's worth, converted on a worker thread.
struct Chunk {
    /// The bytes the records' offsets refer to.
    bytes: Vec<u8>,
    records: Vec<Record>,
}

/// Finds the records after the header and hands them on `batch_rows` at a time, until the end
/// of the file or until a batch fails.
fn split<R: Read>(
    records: &mut Records<R>,
    columns: &Columns,
    batch_rows: usize,
    label: &str,
    progress: &Progress,
    jobs: &mut Jobs<'_, Chunk>,
) -> anyhow::Result<()> {
    let mut pending: Vec<Record> = Vec::new();
    loop {
        let next = match records.next(progress) {
            Ok(next) => next,
            Err(e) => {
                // The records before it come first in the file, so their errors are reported first.
                columns.check_records(records.buf(), &pending, label)?;
                return Err(e).with_context(|| format!("cannot read {label}"));
            }
        };
        if let Some(record) = next {
            pending.push(record);
        }
        if pending.len() == batch_rows || (next.is_none() && !pending.is_empty()) {
            let room = pending.len();
            let full = std::mem::replace(&mut pending, Vec::with_capacity(room));
            let end = full.last().map_or(0, |last| last.end);
            if !jobs.push(Chunk { bytes: records.take_through(end), records: full }) {
                return Ok(());
            }
        }
        if next.is_none() {
            return Ok(());
        }
    }
}

/// What is wrong with the quotes of `record`, if anything (only a record with a quoted field can
/// have an error).
fn record_quote_error(bytes: &[u8], record: &Record) -> Option<QuoteError> {
    record.quoted.then(|| quote_error(record.text(bytes))).flatten()
}

/// Says what `error` is, for a message that has already named the place.
fn describe_quote_error(error: QuoteError) -> &'static str {
    match error {
        QuoteError::Unclosed(_) => "a quoted field is not closed (it runs to the end of the file)",
        QuoteError::TextAfterClosingQuote(_) => {
            "text after the closing quote of a quoted field (a quote inside a quoted field is written twice: \"\")"
        }
    }
}

/// The offset in the record's bytes that a quote error points at.
fn quote_error_offset(error: QuoteError) -> usize {
    match error {
        QuoteError::Unclosed(at) | QuoteError::TextAfterClosingQuote(at) => at,
    }
}

/// How the file's columns (header order) map onto the table's.
struct Columns {
    /// The header's names, in file order.
    names: Vec<String>,
    header_line: u64,
    /// For each table column, its position in the file, if the file has it.
    source: Vec<Option<usize>>,
    /// For each file column, whether it fills a text column (where `""` is an empty string).
    text_targets: Vec<bool>,
}

impl Columns {
    /// Reads the header and checks it: known, distinct names; every NOT NULL column present.
    fn from_header(bytes: &[u8], header: &Record, schema: &SchemaRef, label: &str) -> anyhow::Result<Columns> {
        let at = format!("{label} line {} (the header)", header.line);
        if let Some(error) = quote_error(header.text(bytes)) {
            let fields = split_fields(header.text(bytes));
            let column = fields.iter().rposition(|f| f.start <= quote_error_offset(error)).unwrap_or(0);
            bail!("{at}, column {}: {}", column + 1, describe_quote_error(error));
        }
        let mut names = Vec::new();
        for (index, field) in split_fields(header.text(bytes)).into_iter().enumerate() {
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
        let mut text_targets = vec![false; names.len()];
        for (field, found) in schema.fields().iter().zip(&source) {
            if let (Some(position), DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) =
                (found, field.data_type())
            {
                text_targets[*position] = true;
            }
        }
        Ok(Columns { names, header_line: header.line, source, text_targets })
    }

    /// Checks the records' quotes, field counts and encoding before they are decoded; the error
    /// is the first failing record's, a quoting error before its field count before its
    /// encoding.
    fn check_records(&self, bytes: &[u8], records: &[Record], label: &str) -> anyhow::Result<()> {
        let misquoted = records.iter().position(|r| record_quote_error(bytes, r).is_some());
        let miscounted = records.iter().position(|r| r.fields != self.names.len());
        let checked = &records[..miscounted.map_or(records.len(), |index| index + 1)];
        // One pass over all their bytes: records end at line breaks, which UTF-8 is valid across.
        let invalid = match (checked.first(), checked.last()) {
            (Some(first), Some(last)) => std::str::from_utf8(&bytes[first.content..last.end])
                .err()
                .map(|e| checked.partition_point(|r| r.end <= first.content + e.valid_up_to())),
            _ => None,
        };
        match miscounted.into_iter().chain(invalid).chain(misquoted).min() {
            Some(index) => self.check_record(bytes, &records[index], label),
            None => Ok(()),
        }
    }

    /// Checks a record's quotes, field count and encoding.
    fn check_record(&self, bytes: &[u8], record: &Record, label: &str) -> anyhow::Result<()> {
        if let Some(error) = record_quote_error(bytes, record) {
            let offset = record.content + quote_error_offset(error);
            let column = self.column_at(bytes, record, offset);
            let line = record.line_at(bytes, offset);
            bail!("{label} line {line}, {}: {}", self.describe_column(column), describe_quote_error(error));
        }
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
        if let Err(e) = std::str::from_utf8(record.text(bytes)) {
            let offset = record.content + e.valid_up_to();
            let column = self.column_at(bytes, record, offset);
            let line = record.line_at(bytes, offset);
            bail!("{label} line {line}, {}: not valid UTF-8", self.describe_column(column));
        }
        Ok(())
    }

    /// Checks the chunk's records, decodes them into text columns, then converts those.
    fn batch(&self, chunk: &Chunk, schema: &SchemaRef, label: &str) -> anyhow::Result<RecordBatch> {
        let (bytes, pending) = (chunk.bytes.as_slice(), chunk.records.as_slice());
        self.check_records(bytes, pending, label)?;
        let (Some(first), Some(last)) = (pending.first(), pending.last()) else {
            return Ok(RecordBatch::new_empty(schema.clone()));
        };
        let lines = format!("{label} lines {}-{}", first.line, last.line);
        let text = text_columns(bytes, pending, self.names.len(), &self.text_targets, &lines)?;
        let mut columns = Vec::with_capacity(schema.fields().len());
        for (field, source) in schema.fields().iter().zip(&self.source) {
            let column = match source {
                Some(position) => convert_column(&text[*position], field.data_type())
                    .map_err(|bad| self.bad_value(bytes, pending, *position, bad, label))?,
                None => new_null_array(field.data_type(), pending.len()),
            };
            if !field.is_nullable()
                && let (Some(row), Some(position)) = (first_null(&column), source)
            {
                let at = self.place(bytes, &pending[row], *position, label);
                bail!("{at}: empty, but the column is NOT NULL");
            }
            columns.push(column);
        }
        assemble(schema, columns)
    }

    fn bad_value(
        &self,
        bytes: &[u8],
        pending: &[Record],
        position: usize,
        bad: BadValue,
        label: &str,
    ) -> anyhow::Error {
        match bad.row.and_then(|row| pending.get(row)) {
            Some(record) => anyhow!("{}: {}", self.place(bytes, record, position, label), bad.message),
            None => anyhow!("{label}, {}: {}", self.describe_column(position), bad.message),
        }
    }

    /// `FILE line L, column K "name"` for field `position` of `record`, L the line the field starts on.
    fn place(&self, bytes: &[u8], record: &Record, position: usize, label: &str) -> String {
        let fields = split_fields(record.text(bytes));
        let offset = record.content + fields.get(position).map_or(0, |f| f.start);
        format!("{label} line {}, {}", record.line_at(bytes, offset), self.describe_column(position))
    }

    /// The field of `record` that holds byte `offset`.
    fn column_at(&self, bytes: &[u8], record: &Record, offset: usize) -> usize {
        let fields = split_fields(record.text(bytes));
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
