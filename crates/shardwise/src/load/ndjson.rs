//! NDJSON input: one JSON object per line, its keys naming columns. A key the table does not have
//! is an error; a column the object lacks (or gives as `null`) is NULL. Blank lines are skipped.
//!
//! Arrow's JSON decoder (`arrow::json::reader::Decoder`) parses the objects. Numbers pass through
//! it as their JSON text and become the column's type in [`super::convert_column`], as CSV values
//! do, because Arrow's JSON reader truncates `1.5` read into an integer column and turns a float
//! out of range into infinity. Numbers and booleans in a text column are kept as their JSON text.
//!
//! Arrow's JSON errors do not say which row failed. Lines are fed to the decoder one at a time, so
//! a syntax error is placed at once; when building a batch fails, the batch is decoded again a
//! line at a time to find the line, and that line a column at a time to find the column.
//!
//! The calling thread only splits the file into lines, a batch's worth at a time; worker threads
//! parse and convert the batches ([`super::parallel`]), each with a decoder of its own.

use std::io::BufRead;
use std::sync::Arc;

use anyhow::{Context, anyhow, bail};
use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, FieldRef, Schema, SchemaRef};
use arrow::error::ArrowError;
use arrow::json::reader::{Decoder, ReaderBuilder};

use super::parallel::{self, Jobs};
use super::progress::Progress;
use super::{assemble, convert_column, first_null, no_such_column, quote_short, shorten, text_converts_to};

/// A UTF-8 byte order mark, skipped at the start of the file.
const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";
/// Bytes read between updates of the progress bar.
const PROGRESS_STEP_BYTES: usize = 1 << 20;

/// Reads NDJSON from `input` (named `label` in errors) into batches of `schema`.
pub fn read<R: BufRead>(
    input: R,
    label: &str,
    schema: &SchemaRef,
    batch_rows: usize,
    progress: &Progress,
) -> anyhow::Result<Vec<RecordBatch>> {
    read_on(parallel::workers(), input, label, schema, batch_rows, progress)
}

/// [`read`], parsing and converting batches on `workers` threads.
pub fn read_on<R: BufRead>(
    workers: usize,
    input: R,
    label: &str,
    schema: &SchemaRef,
    batch_rows: usize,
    progress: &Progress,
) -> anyhow::Result<Vec<RecordBatch>> {
    let reader = Reader { wire: wire_schema(schema, label)?, schema, label, batch_rows };
    let batches = parallel::in_order(
        workers,
        |jobs| reader.split(input, progress, jobs),
        |chunk: Chunk| {
            let (mut decoder, pending) = reader.feed(&chunk)?;
            let batch = finish_batch(&mut decoder, &pending, &reader.wire, schema, label)?;
            progress.advance(0, pending.len() as u64);
            Ok(batch)
        },
    )?;
    // A key no line has is a column every row gets NULL in (a misspelt key, most likely): said as
    // for a CSV header without the column.
    if let Some(note) = never_given_note(schema, &batches, label) {
        progress.note(&note);
    }
    Ok(batches)
}

/// The note naming the columns that no line of a file of rows gave a value (`None` if there are
/// no such columns, or no rows).
pub fn never_given_note(schema: &SchemaRef, batches: &[RecordBatch], label: &str) -> Option<String> {
    if batches.iter().all(|b| b.num_rows() == 0) {
        return None;
    }
    let never: Vec<String> = (0..schema.fields().len())
        .filter(|&i| batches.iter().all(|b| b.column(i).null_count() == b.num_rows()))
        .map(|i| quote_short(schema.field(i).name()))
        .collect();
    match never.len() {
        0 => None,
        1 => Some(format!("note: no line of {label} gives column {} a value: every row gets NULL there", never[0])),
        _ => Some(format!(
            "note: no line of {label} gives columns {} a value: every row gets NULL there",
            never.join(", ")
        )),
    }
}

/// Consecutive lines of the file, with `batch_rows` values (or the last ones) among them.
struct Chunk {
    /// The number of the first line.
    first_line: u64,
    /// The lines, each with its line break (the last line of the file may have none).
    text: Vec<u8>,
}

/// What reading one file needs, shared by the splitting thread and the workers.
struct Reader<'a> {
    wire: SchemaRef,
    schema: &'a SchemaRef,
    label: &'a str,
    batch_rows: usize,
}

impl Reader<'_> {
    /// Reads the lines and hands them on, a batch's worth at a time, until the end of the file
    /// or until a batch fails.
    fn split<R: BufRead>(&self, mut input: R, progress: &Progress, jobs: &mut Jobs<'_, Chunk>) -> anyhow::Result<()> {
        let mut chunk = Chunk { first_line: 1, text: Vec::new() };
        let (mut number, mut values, mut unreported_bytes) = (0u64, 0, 0);
        loop {
            let line_start = chunk.text.len();
            let read = match input.read_until(b'\n', &mut chunk.text) {
                Ok(read) => read,
                Err(e) => {
                    // The lines before it come first in the file, so their errors are reported first.
                    chunk.text.truncate(line_start);
                    self.feed(&chunk)?;
                    return Err(e).with_context(|| format!("cannot read {}", self.label));
                }
            };
            if read == 0 {
                break;
            }
            number += 1;
            unreported_bytes += read;
            if unreported_bytes >= PROGRESS_STEP_BYTES {
                progress.advance(std::mem::take(&mut unreported_bytes) as u64, 0);
            }
            values += usize::from(!is_blank(content(&chunk.text[line_start..], number)));
            if values == self.batch_rows {
                let room = chunk.text.len();
                let full =
                    std::mem::replace(&mut chunk, Chunk { first_line: number + 1, text: Vec::with_capacity(room) });
                values = 0;
                if !jobs.push(full) {
                    return Ok(());
                }
            }
        }
        progress.advance(unreported_bytes as u64, 0);
        if values > 0 {
            jobs.push(chunk);
        }
        Ok(())
    }

    /// Checks the chunk's lines and feeds them to a new decoder: the first line that is not one
    /// JSON value, or not UTF-8, is the error.
    fn feed(&self, chunk: &Chunk) -> anyhow::Result<(Decoder, Lines)> {
        let (schema, label) = (self.schema, self.label);
        let mut decoder = new_decoder(&self.wire, self.batch_rows, true)?;
        let mut pending = Lines::default();
        for (number, raw) in (chunk.first_line..).zip(chunk.text.split_inclusive(|&b| b == b'\n')) {
            let line = content(raw, number);
            if is_blank(line) {
                continue;
            }
            if let Err(e) = std::str::from_utf8(line) {
                let at = match key_with_invalid_utf8(line) {
                    Some(key) => match schema.index_of(&key) {
                        Ok(index) => format!("{label} line {number}, {}", column_name(index, schema.field(index))),
                        Err(_) => format!("{label} line {number}, key {}", quote_short(&key)),
                    },
                    None => format!("{label} line {number}"),
                };
                bail!("{at}: not valid UTF-8 (at byte {} of the line)", e.valid_up_to() + 1);
            }
            if line.trim_ascii_start().starts_with(b"[") {
                bail!(
                    "{label} line {number}: a JSON array, where load reads newline-delimited JSON (one object \
                     per line); a file holding one array of objects converts with `jq -c '.[]' FILE > FILE.ndjson`"
                );
            }
            feed_line(&mut decoder, line).map_err(|message| anyhow!("{label} line {number}: {message}"))?;
            // Arrow's decoder keeps the last of a key given twice; ClickHouse and the HTTP
            // API refuse the object.
            if let Some(key) = shardwise_query::json_keys::key_given_twice(line) {
                bail!("{label} line {number}, key {}: given twice in one object", quote_short(&key));
            }
            pending.push(number, line);
        }
        Ok((decoder, pending))
    }
}

/// A line as read, without its line break (and, on line 1, a byte order mark).
fn content(raw: &[u8], number: u64) -> &[u8] {
    let line = raw.strip_suffix(b"\n").unwrap_or(raw);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if number == 1 { line.strip_prefix(UTF8_BOM).unwrap_or(line) } else { line }
}

/// A line with no value: blank lines are skipped.
fn is_blank(line: &[u8]) -> bool {
    line.iter().all(u8::is_ascii_whitespace)
}

/// The schema Arrow decodes into: the table's, every column nullable (NOT NULL is checked here,
/// with the line), numbers as text.
fn wire_schema(schema: &SchemaRef, label: &str) -> anyhow::Result<SchemaRef> {
    let mut fields = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let data_type = field.data_type();
        let as_text = travels_as_text(data_type);
        if as_text && !text_converts_to(data_type) {
            bail!("{label}: column {} has type {data_type}, which load cannot read", quote_short(field.name()));
        }
        let wire_type = if as_text { DataType::Utf8 } else { data_type.clone() };
        fields.push(Field::new(field.name(), wire_type, true));
    }
    Ok(Arc::new(Schema::new(fields)))
}

/// Numbers, timestamps (a number there is seconds since 1970, as for CSV and `CAST`; Arrow's
/// JSON decoder would read it in the column's unit) and dates (a number there is read as the
/// CSV loader reads its text, `20240101` as 2024-01-01; Arrow's decoder would take it for days
/// since 1970, the year 57385) are decoded as their text and converted; so are booleans, so that
/// `"true"` and `1` load as they do from a CSV (and HTTP's JSONEachRow).
fn travels_as_text(data_type: &DataType) -> bool {
    data_type.is_integer()
        || data_type.is_floating()
        || matches!(
            data_type,
            DataType::Decimal32(..)
                | DataType::Decimal64(..)
                | DataType::Decimal128(..)
                | DataType::Decimal256(..)
                | DataType::Timestamp(..)
                | DataType::Date32
                | DataType::Date64
                | DataType::Boolean
        )
}

/// A JSON decoder for `schema`; `strict` makes a key the schema lacks an error.
fn new_decoder(schema: &SchemaRef, batch_rows: usize, strict: bool) -> anyhow::Result<Decoder> {
    // One row of room beyond the batch, so a second value on a batch's last line is still seen.
    ReaderBuilder::new(schema.clone())
        .with_batch_size(batch_rows.saturating_add(1))
        .with_coerce_primitive(true)
        .with_strict_mode(strict)
        .build_decoder()
        .context("load cannot read the table's column types from JSON")
}

/// Feeds one line; it must hold exactly one complete JSON value.
fn feed_line(decoder: &mut Decoder, line: &[u8]) -> Result<(), String> {
    let before = decoder.len();
    for part in [line, b"\n"] {
        let mut rest = part;
        while !rest.is_empty() {
            let used = decoder.decode(rest).map_err(|e| format!("invalid JSON: {}", json_message(&e)))?;
            if used == 0 {
                break;
            }
            rest = &rest[used..];
        }
    }
    if decoder.has_partial_record() {
        return Err("the JSON value does not end on this line (each object must be on one line)".to_string());
    }
    match decoder.len().saturating_sub(before) {
        1 => Ok(()),
        0 => Err("no JSON value".to_string()),
        _ => Err("more than one JSON value on the line".to_string()),
    }
}

/// Builds the batch of the lines fed since the last one, or explains the first line that fails.
fn finish_batch(
    decoder: &mut Decoder,
    pending: &Lines,
    wire: &SchemaRef,
    schema: &SchemaRef,
    label: &str,
) -> anyhow::Result<RecordBatch> {
    let decoded = match decoder.flush() {
        Ok(Some(batch)) => batch,
        Ok(None) => return Ok(RecordBatch::new_empty(schema.clone())),
        Err(e) => return Err(locate_failure(pending, wire, schema, label, &e)),
    };
    let mut columns = Vec::with_capacity(schema.fields().len());
    for (index, field) in schema.fields().iter().enumerate() {
        let column = convert_column(decoded.column(index), field.data_type()).map_err(|bad| {
            let line = bad.row.and_then(|row| pending.number(row));
            let at = line.map_or_else(|| label.to_string(), |line| format!("{label} line {line}"));
            anyhow!("{at}, {}: {}", column_name(index, field), bad.message)
        })?;
        if !field.is_nullable()
            && let Some(row) = first_null(&column)
        {
            let line = pending.number(row).unwrap_or_default();
            bail!("{label} line {line}, {}: missing or null, but the column is NOT NULL", column_name(index, field));
        }
        columns.push(column);
    }
    assemble(schema, columns)
}

/// Decodes the batch's lines one by one to find the first that fails alone, and explains it.
fn locate_failure(pending: &Lines, wire: &SchemaRef, schema: &SchemaRef, label: &str, e: &ArrowError) -> anyhow::Error {
    for index in 0..pending.len() {
        let (Some(number), Some(line)) = (pending.number(index), pending.line(index)) else { break };
        if let Err(failure) = decode_alone(wire, line, true) {
            return explain_line(&format!("{label} line {number}"), line, wire, schema, &failure);
        }
    }
    let (first, last) =
        (pending.number(0).unwrap_or_default(), pending.number(pending.len().saturating_sub(1)).unwrap_or_default());
    anyhow!("{label} lines {first}-{last}: {}", json_message(e))
}

/// Decodes `line` alone with `schema`.
fn decode_alone(schema: &SchemaRef, line: &[u8], strict: bool) -> Result<(), String> {
    let mut decoder = new_decoder(schema, 1, strict).map_err(|e| format!("{e:#}"))?;
    feed_line(&mut decoder, line)?;
    decoder.flush().map(|_| ()).map_err(|e| json_message(&e))
}

/// Why a line Arrow rejects is wrong: not an object, a key the table lacks, or the first
/// column whose value Arrow cannot read (found by decoding each column alone).
fn explain_line(at: &str, line: &[u8], wire: &SchemaRef, schema: &SchemaRef, failure: &str) -> anyhow::Error {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(line) else {
        return anyhow!("{at}: {failure}");
    };
    let Some(object) = value.as_object() else {
        return anyhow!("{at}: expected a JSON object, found {}", shorten(&value.to_string()));
    };
    if let Some(key) = object.keys().find(|key| schema.index_of(key).is_err()) {
        return anyhow!("{at}, key {}: {}", quote_short(key), no_such_column(schema, key));
    }
    for (index, field) in wire.fields().iter().enumerate() {
        let Some(value) = object.get(field.name()) else { continue };
        let alone: SchemaRef = Arc::new(Schema::new(vec![FieldRef::clone(field)]));
        if let Err(why) = decode_alone(&alone, line, false) {
            let table_field = schema.field(index);
            let shown = shorten(&value.to_string());
            let prefix = format!("whilst decoding field '{}': ", field.name());
            let why = why.strip_prefix(&prefix).unwrap_or(&why);
            return anyhow!(
                "{at}, {}: {shown} is not a valid {} ({why})",
                column_name(index, table_field),
                table_field.data_type()
            );
        }
    }
    anyhow!("{at}: {failure}")
}

/// The key whose name or string value holds the invalid UTF-8 of `line`, if the line is an object.
fn key_with_invalid_utf8(line: &[u8]) -> Option<String> {
    let lossy = String::from_utf8_lossy(line);
    let value: serde_json::Value = serde_json::from_str(&lossy).ok()?;
    let replaced = |text: &str| text.contains(char::REPLACEMENT_CHARACTER);
    value
        .as_object()?
        .iter()
        .find(|(key, value)| replaced(key) || value.as_str().is_some_and(replaced))
        .map(|(k, _)| k.clone())
}

/// `column "name" (table column K)`.
fn column_name(index: usize, field: &Field) -> String {
    format!("column {} (table column {})", quote_short(field.name()), index + 1)
}

/// Arrow's JSON message without its `Json error: ` prefix.
fn json_message(e: &ArrowError) -> String {
    match e {
        ArrowError::JsonError(message) => message.clone(),
        other => other.to_string(),
    }
}

/// The lines of the batch being built: their text (kept to explain a failure) and numbers.
#[derive(Default)]
struct Lines {
    text: Vec<u8>,
    ends: Vec<usize>,
    numbers: Vec<u64>,
}

impl Lines {
    fn push(&mut self, number: u64, line: &[u8]) {
        self.text.extend_from_slice(line);
        self.ends.push(self.text.len());
        self.numbers.push(number);
    }

    fn len(&self) -> usize {
        self.numbers.len()
    }

    fn number(&self, index: usize) -> Option<u64> {
        self.numbers.get(index).copied()
    }

    fn line(&self, index: usize) -> Option<&[u8]> {
        let end = *self.ends.get(index)?;
        let start = if index == 0 { 0 } else { *self.ends.get(index - 1)? };
        self.text.get(start..end)
    }
}
