//! The parts of `shardwise load` (the command is `cmd_load.rs`): reading a file, CSV, NDJSON or
//! Parquet, into record batches of exactly the table's schema, every value checked before anything
//! is sent; [`client`] talks to the node; [`progress`] draws the bar.
//!
//! Each format has its module; Arrow's readers do the parsing (`arrow::csv`, `arrow::json`,
//! `datafusion::parquet`). CSV and NDJSON split the file on the calling thread and parse and check
//! its batches on worker threads ([`parallel`]). What the formats share lives here:
//! [`convert_column`], which turns a column into the table's type with Arrow's cast kernel and
//! finds the first value that does not fit (Arrow's safe cast makes such a value NULL, so a value
//! that was there and is NULL after the cast is a bad one), [`first_null`] for NOT NULL columns,
//! and how values are shown in errors. Each reader adds where the value is: a line and column of
//! the file, or a row.

pub mod client;
pub mod csv;
pub mod ndjson;
pub mod parallel;
pub mod parquet;
pub mod progress;
#[cfg(test)]
mod tests;

use std::path::Path;

use anyhow::{Context, bail};
use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::{DataType, Float64Type, SchemaRef};
use arrow::util::display::{ArrayFormatter, FormatOptions};

use progress::Progress;

/// Longest value (in characters) quoted whole in an error message; longer ones are cut.
const MAX_SHOWN_VALUE_CHARS: usize = 40;
/// Most table columns an "unknown column" error lists.
const MAX_LISTED_COLUMNS: usize = 20;

/// The file formats `shardwise load` reads.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Comma-separated values with a header row naming the columns; an empty field is NULL, and
    /// a quoted empty one (`""`) in a text column an empty string.
    Csv,
    /// Apache Parquet; columns matched by name and cast to the table's types.
    Parquet,
    /// Newline-delimited JSON: one object per line, keys naming the columns.
    #[value(alias = "jsonl")]
    Ndjson,
}

impl Format {
    /// The format a file's extension names (`.csv`, `.parquet`, `.ndjson`, `.jsonl`, `.json`). A
    /// `.json` file is read as newline-delimited JSON, as DuckDB and ClickHouse's `JSONEachRow`
    /// users name them; one holding a single JSON array is refused with a way to convert it.
    pub fn from_path(path: &Path) -> anyhow::Result<Format> {
        let extension = path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
        match extension.as_str() {
            "csv" => Ok(Format::Csv),
            "parquet" | "pq" => Ok(Format::Parquet),
            "ndjson" | "jsonl" | "json" => Ok(Format::Ndjson),
            "gz" | "zst" | "bz2" | "xz" | "zip" => {
                bail!("{} is compressed, which load does not read: decompress it first", path.display())
            }
            _ => bail!(
                "cannot tell the format of {} from its extension: pass --format csv, parquet or ndjson",
                path.display()
            ),
        }
    }
}

/// Reads and checks the whole of `path` into batches of `schema`, at most `batch_rows` rows each.
pub fn read_file(
    path: &Path,
    format: Format,
    schema: &SchemaRef,
    batch_rows: usize,
    progress: &Progress,
) -> anyhow::Result<Vec<RecordBatch>> {
    let label = path.display().to_string();
    let file = std::fs::File::open(path).with_context(|| format!("cannot open {label}"))?;
    let size = file.metadata().with_context(|| format!("cannot read {label}"))?.len();
    progress.start_phase("reading", size);
    match format {
        Format::Csv => csv::read(file, &label, schema, batch_rows, progress),
        Format::Ndjson => ndjson::read(std::io::BufReader::new(file), &label, schema, batch_rows, progress),
        Format::Parquet => parquet::read(file, size, &label, schema, batch_rows, progress),
    }
}

/// A value that does not convert to its column's type: its row in the column and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadValue {
    /// Row within the converted column; `None` when the column as a whole could not be converted.
    pub row: Option<usize>,
    /// The value and why it does not fit, e.g. `"300" is out of range for Int8 (-128 to 127)`.
    pub message: String,
}

/// Converts `source` to `target` with Arrow's cast kernel, or names the first value that does not
/// fit: one Arrow would turn into NULL, or a finite number that becomes infinite as a float; a
/// number with a fraction for an integer column is refused, and a number for a timestamp is
/// seconds since 1970.
pub fn convert_column(source: &ArrayRef, target: &DataType) -> Result<ArrayRef, BadValue> {
    // A time without seconds (`2024-01-03 10:00`) as an INSERT reads it.
    let read_as_literals = source
        .as_string_opt::<i32>()
        .and_then(|text| shardwise_query::text_values::times_as_arrow_reads(text, target))
        .map(|text| std::sync::Arc::new(text) as ArrayRef);
    let source = read_as_literals.as_ref().unwrap_or(source);
    if !matches!(target, DataType::Date32 | DataType::Date64) {
        return convert_value_column(source, target);
    }
    // A number is no date (Arrow's cast would read days since 1970, so 20240101 became the year
    // 57385), as an INSERT and a Flight SQL ingest refuse it.
    if source.data_type().is_integer() || source.data_type().is_floating() {
        let row = (0..source.len()).find(|i| source.is_valid(*i));
        return match row {
            None => Ok(arrow::array::new_null_array(target, source.len())),
            Some(row) => Err(BadValue {
                row: Some(row),
                message: format!(
                    "{} is a number, not a date (column type {target}): write dates as text, YYYY-MM-DD",
                    shown_value(source, row)
                ),
            }),
        };
    }
    let converted = convert_value_column(source, target)?;
    // A date beyond what can be read back (a Parquet DATE of any i32 days).
    match shardwise_query::date_range::first_date_out_of_range(&converted) {
        Some(bad) => Err(BadValue { row: Some(bad.row), message: bad.message }),
        None => Ok(converted),
    }
}

/// [`convert_column`] for every type, dates without their checks.
fn convert_value_column(source: &ArrayRef, target: &DataType) -> Result<ArrayRef, BadValue> {
    if source.data_type() == target {
        return Ok(source.clone());
    }
    // A column of Arrow's `null` type (pyarrow and pandas give one to a column of only None) is
    // NULL in any type. Its array has no validity buffer, so the check below would take its
    // values for valid ones that the cast lost.
    if source.data_type() == &DataType::Null {
        return Ok(arrow::array::new_null_array(target, source.len()));
    }
    // A DECIMAL written with an exponent (`1e-10`, as JSON writers and pandas write small
    // numbers) is written out without it first: Arrow's cast reads no exponent.
    if matches!(
        target,
        DataType::Decimal32(..) | DataType::Decimal64(..) | DataType::Decimal128(..) | DataType::Decimal256(..)
    ) && let Some(text) = source.as_string_opt::<i32>()
        && let Some(plain) = shardwise_query::text_values::decimals_without_exponents(text)
    {
        let plain: ArrayRef = std::sync::Arc::new(plain);
        // Errors show the value as the file has it.
        return cast_checked(&plain, target).map_err(|bad| match bad.row {
            Some(row) => BadValue {
                message: bad.message.replacen(&shown_value(&plain, row), &shown_value(source, row), 1),
                ..bad
            },
            None => bad,
        });
    }
    // A number for a timestamp is seconds since 1970, as `CAST(1700000000 AS TIMESTAMP)` reads
    // it, a float's fraction a part of one (Arrow's cast would read it in the column's unit,
    // nanoseconds for TIMESTAMP).
    if source.data_type().is_integer()
        && let DataType::Timestamp(_, zone) = target
    {
        let seconds = DataType::Timestamp(arrow::datatypes::TimeUnit::Second, zone.clone());
        let as_seconds = cast_checked(source, &seconds)?;
        return cast_checked(&as_seconds, target).map_err(|bad| BadValue {
            message: match bad.row {
                Some(row) => format!("{} (seconds since 1970) is out of range for {target}", shown_value(source, row)),
                None => bad.message,
            },
            ..bad
        });
    }
    if let Some(converted) = shardwise_query::integer_timestamps::seconds_as_timestamps(source, target) {
        return converted.map_err(|e| BadValue { row: e.row, message: e.message });
    }
    // The same for a number written as text (a CSV field, a JSON number read as its text).
    if let DataType::Timestamp(..) = target
        && let Some(converted) = number_texts_as_timestamps(source, target)
    {
        return converted;
    }
    // A fraction for an integer column is refused, as in text ("1.5" is not an integer), not
    // truncated as Arrow's cast would.
    if source.data_type().is_floating()
        && target.is_integer()
        && let Some(row) = first_fraction(source)
    {
        return Err(BadValue {
            row: Some(row),
            message: format!("{} is not an integer (column type {target})", shown_value(source, row)),
        });
    }
    cast_checked(source, target)
}

/// Arrow's cast of `source` to `target`, or the first value that does not fit.
fn cast_checked(source: &ArrayRef, target: &DataType) -> Result<ArrayRef, BadValue> {
    let safe = CastOptions { safe: true, ..Default::default() };
    let converted = cast_with_options(source, target, &safe).map_err(|e| BadValue {
        row: None,
        message: format!("{} cannot be converted to {target}: {e}", source.data_type()),
    })?;
    if converted.null_count() != source.null_count() {
        let bad = (0..source.len()).find(|&row| source.is_valid(row) && converted.is_null(row));
        if let Some(row) = bad {
            return Err(BadValue { row: Some(row), message: describe(source, row, target, false) });
        }
    }
    if target.is_floating()
        && let Some(row) = first_overflow_to_infinity(source, &converted)
    {
        return Err(BadValue { row: Some(row), message: describe(source, row, target, true) });
    }
    if target.is_floating()
        && let Some(row) = first_underflow_to_zero(source, &converted)
    {
        let message = format!("{} is too close to zero for {target} (it would be 0)", shown_value(source, row));
        return Err(BadValue { row: Some(row), message });
    }
    Ok(converted)
}

/// First row that is zero after the conversion to a float type but was a number other than
/// zero before (`1e-50` for a REAL), which PostgreSQL refuses as an underflow.
fn first_underflow_to_zero(source: &ArrayRef, converted: &ArrayRef) -> Option<usize> {
    let as_f64 = cast_with_options(converted, &DataType::Float64, &CastOptions::default()).ok()?;
    let values = as_f64.as_primitive::<Float64Type>();
    let mut zeros = (0..values.len()).filter(|&row| values.is_valid(row) && values.value(row) == 0.0);
    let first = zeros.next()?;
    let source_f64 = cast_with_options(source, &DataType::Float64, &CastOptions::default()).ok();
    std::iter::once(first).chain(zeros).find(|&row| match string_value(source, row) {
        Some(text) => shardwise_query::insert_exact::names_nonzero(text),
        None => source_f64.as_ref().is_some_and(|before| before.as_primitive::<Float64Type>().value(row) != 0.0),
    })
}

/// `source` (text) converted to the timestamp column `target` with each value that is a number
/// read as seconds since 1970 (`1700000000`, `1700000000.5`, `-1`); `None` when no value is one.
fn number_texts_as_timestamps(source: &ArrayRef, target: &DataType) -> Option<Result<ArrayRef, BadValue>> {
    let (seconds, numbers) = shardwise_query::text_values::numbers_among(source.as_string_opt::<i32>()?)?;
    Some((|| {
        let from_numbers = convert_column(&seconds, target)?;
        // The other values as text; the numbers' rows left out (NULL), which text would not read.
        let others = arrow::compute::nullif(source, &numbers)
            .map_err(|e| BadValue { row: None, message: format!("cannot set the numbers aside: {e}") })?;
        let from_text = cast_checked(&others, target)?;
        arrow::compute::kernels::zip::zip(&numbers, &from_numbers, &from_text)
            .map_err(|e| BadValue { row: None, message: format!("cannot combine the converted values: {e}") })
    })())
}

/// First row of a float column with a fractional part (or not finite).
fn first_fraction(source: &ArrayRef) -> Option<usize> {
    let as_f64 = cast_with_options(source, &DataType::Float64, &CastOptions::default()).ok()?;
    let values = as_f64.as_primitive::<Float64Type>();
    (0..values.len()).find(|&row| values.is_valid(row) && values.value(row).fract() != 0.0)
}

/// First row that is infinite after the conversion to a float type but was not infinite before.
fn first_overflow_to_infinity(source: &ArrayRef, converted: &ArrayRef) -> Option<usize> {
    let as_f64 = cast_with_options(converted, &DataType::Float64, &CastOptions::default()).ok()?;
    let values = as_f64.as_primitive::<Float64Type>();
    let mut infinite = (0..values.len()).filter(|&row| values.is_valid(row) && values.value(row).is_infinite());
    let first = infinite.next()?;
    // Rare from here on: only files with an infinite value get this far.
    let source_f64 = cast_with_options(source, &DataType::Float64, &CastOptions::default()).ok();
    std::iter::once(first).chain(infinite).find(|&row| match string_value(source, row) {
        Some(text) => !names_infinity(text),
        None => {
            source_f64.as_ref().is_some_and(|before| !before.as_primitive::<Float64Type>().value(row).is_infinite())
        }
    })
}

/// Whether `text` spells infinity (`inf`, `-Infinity`, ...), as Arrow's float parser accepts.
fn names_infinity(text: &str) -> bool {
    let unsigned = text.trim().trim_start_matches(['+', '-']).to_ascii_lowercase();
    unsigned == "inf" || unsigned == "infinity"
}

/// The first row where `column` is NULL.
pub fn first_null(column: &ArrayRef) -> Option<usize> {
    if column.null_count() == 0 {
        return None;
    }
    (0..column.len()).find(|&row| column.is_null(row))
}

/// `value` + why it does not fit `target`, e.g. `"abc" is not an integer (column type Int32)`.
fn describe(source: &ArrayRef, row: usize, target: &DataType, overflowed: bool) -> String {
    let text = string_value(source, row);
    let why = if target.is_integer() {
        match text {
            Some(text) if !is_integer_text(text) => format!("is not an integer (column type {target})"),
            _ => format!("is out of range for {target} ({})", integer_range(target)),
        }
    } else if target.is_floating() {
        if overflowed {
            format!("is out of range for {target}")
        } else {
            format!("is not a number (column type {target})")
        }
    } else {
        match target {
            DataType::Decimal32(precision, scale)
            | DataType::Decimal64(precision, scale)
            | DataType::Decimal128(precision, scale)
            | DataType::Decimal256(precision, scale) => match text {
                Some(text) if !is_decimal_text(text) => format!("is not a decimal number (column type {target})"),
                _ => {
                    let integer_digits = (i16::from(*precision) - i16::from(*scale)).max(0);
                    // `999.995` in a DECIMAL(5, 2) has 3 such digits, and is rounded to 1000.00.
                    let rounded =
                        if *scale >= 0 { format!(", once rounded to {scale} decimals") } else { String::new() };
                    format!("does not fit {target} (at most {integer_digits} digits before the decimal point{rounded})")
                }
            },
            DataType::Boolean => "is not a boolean (column type Boolean: true or false)".to_string(),
            DataType::Date32 | DataType::Date64 => format!("is not a date (column type {target}: YYYY-MM-DD)"),
            DataType::Timestamp(..) => match text {
                Some(_) if !is_timestamp_text(source, row) => format!(
                    "is not a timestamp (column type {target}; e.g. 2024-01-31 12:00:00 or 2024-01-31T12:00:00Z)"
                ),
                _ => format!("is out of range for {target}"),
            },
            _ => format!("cannot be converted to {target}"),
        }
    };
    format!("{} {why}", shown_value(source, row))
}

/// Whether a string value reads as a timestamp at all (in seconds, the widest range), to tell a
/// malformed timestamp from one out of the column unit's range.
fn is_timestamp_text(source: &ArrayRef, row: usize) -> bool {
    let seconds = DataType::Timestamp(arrow::datatypes::TimeUnit::Second, None);
    cast_with_options(&source.slice(row, 1), &seconds, &CastOptions::default()).is_ok_and(|a| a.is_valid(0))
}

/// The text of a string column's value; `None` for other types or NULL.
fn string_value(array: &ArrayRef, row: usize) -> Option<&str> {
    if array.is_null(row) {
        return None;
    }
    match array.data_type() {
        DataType::Utf8 => Some(array.as_string::<i32>().value(row)),
        DataType::LargeUtf8 => Some(array.as_string::<i64>().value(row)),
        DataType::Utf8View => Some(array.as_string_view().value(row)),
        _ => None,
    }
}

/// A value as an error message shows it: strings quoted, long ones cut.
pub fn shown_value(array: &ArrayRef, row: usize) -> String {
    if let Some(text) = string_value(array, row) {
        return quote_short(text);
    }
    match ArrayFormatter::try_new(array.as_ref(), &FormatOptions::default()) {
        Ok(formatter) => shorten(&formatter.value(row).to_string()),
        Err(_) => "the value".to_string(),
    }
}

/// `text` in double quotes (escaped as Rust does), cut after [`MAX_SHOWN_VALUE_CHARS`].
pub fn quote_short(text: &str) -> String {
    let chars = text.chars().count();
    if chars <= MAX_SHOWN_VALUE_CHARS {
        return format!("{text:?}");
    }
    let head: String = text.chars().take(MAX_SHOWN_VALUE_CHARS).collect();
    format!("{head:?}... ({chars} characters)")
}

/// `text`, cut after [`MAX_SHOWN_VALUE_CHARS`].
pub fn shorten(text: &str) -> String {
    let chars = text.chars().count();
    if chars <= MAX_SHOWN_VALUE_CHARS {
        return text.to_string();
    }
    let head: String = text.chars().take(MAX_SHOWN_VALUE_CHARS).collect();
    format!("{head}... ({chars} characters)")
}

/// An optional sign and decimal digits (what an integer column accepts, less its range).
fn is_integer_text(text: &str) -> bool {
    let digits = text.trim().trim_start_matches(['+', '-']);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// An optional sign, digits, and at most one decimal point among them.
fn is_decimal_text(text: &str) -> bool {
    let unsigned = text.trim().trim_start_matches(['+', '-']);
    let (whole, fraction) = unsigned.split_once('.').unwrap_or((unsigned, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    !(whole.is_empty() && fraction.is_empty()) && digits(whole) && digits(fraction)
}

/// `min to max` of an integer type.
fn integer_range(data_type: &DataType) -> String {
    let (min, max): (i128, i128) = match data_type {
        DataType::Int8 => (i8::MIN.into(), i8::MAX.into()),
        DataType::Int16 => (i16::MIN.into(), i16::MAX.into()),
        DataType::Int32 => (i32::MIN.into(), i32::MAX.into()),
        DataType::Int64 => (i64::MIN.into(), i64::MAX.into()),
        DataType::UInt8 => (0, u8::MAX.into()),
        DataType::UInt16 => (0, u16::MAX.into()),
        DataType::UInt32 => (0, u32::MAX.into()),
        DataType::UInt64 => (0, u64::MAX.into()),
        _ => return "its range".to_string(),
    };
    format!("{min} to {max}")
}

/// Why `name` is not a column of `schema`, with a hint when only its case differs.
pub fn no_such_column(schema: &SchemaRef, name: &str) -> String {
    let fields = schema.fields();
    let hint = fields
        .iter()
        .find(|f| f.name().eq_ignore_ascii_case(name))
        .map(|f| format!(" (did you mean {}? names are case-sensitive)", quote_short(f.name())))
        .unwrap_or_default();
    let mut listed: Vec<String> = fields.iter().take(MAX_LISTED_COLUMNS).map(|f| quote_short(f.name())).collect();
    if fields.len() > MAX_LISTED_COLUMNS {
        listed.push(format!("and {} more", fields.len() - MAX_LISTED_COLUMNS));
    }
    format!("the table has no such column{hint}; its columns are {}", listed.join(", "))
}

/// Says which nullable table columns the file does not have (they load as NULL), so a misspelt
/// or forgotten header is seen before the rows land; `source[i]` is where table column `i` comes from.
pub fn note_absent_columns(schema: &SchemaRef, source: &[Option<usize>], label: &str, progress: &Progress) {
    if let Some(line) = absent_columns_note(schema, source, label) {
        progress.note(&line);
    }
}

/// The line [`note_absent_columns`] prints, if any column is absent.
pub fn absent_columns_note(schema: &SchemaRef, source: &[Option<usize>], label: &str) -> Option<String> {
    let absent: Vec<String> = schema
        .fields()
        .iter()
        .zip(source)
        .filter(|(_, found)| found.is_none())
        .map(|(field, _)| quote_short(field.name()))
        .collect();
    if absent.is_empty() {
        return None;
    }
    let (noun, shown) = if absent.len() == 1 { ("column", absent[0].clone()) } else { ("columns", absent.join(", ")) };
    Some(format!("note: {label} has no {noun} {shown}: every row gets NULL there"))
}

/// Whether a text column can become `target` at all (checked once per column, before any row).
pub fn text_converts_to(target: &DataType) -> bool {
    arrow::compute::can_cast_types(&DataType::Utf8, target)
}

/// Checks `batch` against `schema` field by field; the error is a bug in a reader, not the file's.
pub fn assemble(schema: &SchemaRef, columns: Vec<ArrayRef>) -> anyhow::Result<RecordBatch> {
    RecordBatch::try_new(schema.clone(), columns)
        .context("internal error (a bug in shardwise load): a converted batch does not match the table schema")
}
