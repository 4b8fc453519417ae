//! Text values to a column's type, for the paths that receive rows as text: `COPY ... FROM
//! STDIN` and HTTP's `INSERT ... FORMAT CSV / TSV / JSONEachRow` on the server, and
//! `shardwise load`'s CSV and NDJSON on the client (DECIMALs with exponents).
//!
//! Why: Arrow's cast from text reads a REAL as an `f32` directly, so `3.5e38` became `inf` and
//! `1e-50` became `0`, where an `INSERT`, bind parameters and bulk ingest refuse them, as
//! PostgreSQL does ("out of range", "underflow"); and it refuses a DECIMAL written with an
//! exponent (`1e-3`, what JSON writers emit), which PostgreSQL and ClickHouse read.
//!
//! A number for a TIMESTAMP (`1700000000.5`) is seconds since 1970, as an `INSERT` and
//! `shardwise load` read it ([`numbers_among`]).
//!
//! How: a REAL (or half-float) column is read as DOUBLE first and checked with the `INSERT`'s
//! check ([`crate::insert_exact::first_unfit`]) before it is narrowed; a DECIMAL value
//! with an exponent is written out without it (`1e-3` as `0.001`) before the cast, which then
//! rounds or refuses it as any DECIMAL text.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Float64Array, StringArray};
use datafusion::arrow::compute::kernels::zip::zip;
use datafusion::arrow::compute::{CastOptions, cast_with_options, nullif};
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::util::display::FormatOptions;

/// The most an exponent may shift a DECIMAL's point: DECIMAL holds at most 76 digits, so
/// anything further is out of range or zero whatever the digits.
const DECIMAL_EXPONENT_MAX: i64 = 100;

/// Why a column of text did not convert.
#[derive(Debug)]
pub struct NotConverted {
    /// The first value that does not, when known.
    pub row: Option<usize>,
    /// Why.
    pub why: String,
}

/// `text` as Arrow's parser reads dates and timestamps of type `to`, as a literal is read
/// (`crate::time_literals`): a time without seconds (`2024-01-03 10:00`) gets its `:00`, and
/// spaces around a value go; `None` when no value needs it (or `to` is no date or timestamp).
pub fn times_as_arrow_reads(text: &StringArray, to: &DataType) -> Option<StringArray> {
    if !matches!(to, DataType::Timestamp(..) | DataType::Date32 | DataType::Date64) {
        return None;
    }
    let read = |v: &str| crate::time_literals::as_arrow_reads(v, to);
    if !text.iter().flatten().any(|v| read(v).is_some()) {
        return None;
    }
    Some(text.iter().map(|v| v.map(|v| read(v).unwrap_or_else(|| v.to_string()))).collect())
}

/// `text` as a column of type `to`, every value checked (see the module doc).
pub fn text_column(text: &StringArray, to: &DataType) -> Result<ArrayRef, NotConverted> {
    let read_as_literals = times_as_arrow_reads(text, to);
    let text = read_as_literals.as_ref().unwrap_or(text);
    match to {
        // A number beyond the type's range, or too close to zero for it, is refused rather than
        // stored as an infinity or 0 (the `inf` and `NaN` words are kept).
        DataType::Float64 | DataType::Float32 | DataType::Float16
            if let Some((row, why)) = crate::insert_exact::first_text_lost(text, to) =>
        {
            Err(NotConverted { row: Some(row), why: why.to_string() })
        }
        DataType::Float32 | DataType::Float16 => {
            let wide = cast_text(text, &DataType::Float64)?;
            if let Some(unfit) = crate::insert_exact::first_unfit(&wide, to) {
                return Err(NotConverted { row: Some(unfit.row), why: unfit.why.to_string() });
            }
            cast_with_options(&wide, to, &options()).map_err(|e| NotConverted { row: None, why: e.to_string() })
        }
        DataType::Decimal32(..) | DataType::Decimal64(..) | DataType::Decimal128(..) | DataType::Decimal256(..) => {
            match decimals_without_exponents(text) {
                Some(plain) => cast_text(&plain, to),
                None => cast_text(text, to),
            }
        }
        DataType::Timestamp(..) => match numbers_among(text) {
            None => cast_text(text, to),
            Some((seconds, numbers)) => {
                let from_numbers = match crate::integer_timestamps::seconds_as_timestamps(&seconds, to) {
                    Some(converted) => converted.map_err(|e| NotConverted { row: e.row, why: e.message })?,
                    None => return cast_text(text, to),
                };
                // The other values as text; the numbers' rows left out (NULL).
                let others = nullif(text, &numbers).map_err(|e| NotConverted { row: None, why: e.to_string() })?;
                let from_text = cast_text(others.as_string::<i32>(), to)?;
                zip(&numbers, &from_numbers, &from_text).map_err(|e| NotConverted { row: None, why: e.to_string() })
            }
        },
        _ => cast_text(text, to),
    }
}

/// The values of `text` that are numbers (`1700000000`, `1700000000.5`, `-1`), as DOUBLEs (NULL
/// elsewhere), and which rows they are; `None` when none is (timestamps written as text): a
/// number for a TIMESTAMP is seconds since 1970 ([`crate::integer_timestamps`]).
pub fn numbers_among(text: &StringArray) -> Option<(ArrayRef, BooleanArray)> {
    let number = |value: Option<&str>| {
        let value = value?.trim();
        let numeric = value.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'+' | b'e' | b'E'));
        (numeric && value.bytes().any(|b| b.is_ascii_digit())).then(|| value.parse::<f64>().ok()).flatten()
    };
    if !text.iter().any(|v| number(v).is_some()) {
        return None;
    }
    let seconds: Float64Array = text.iter().map(number).collect();
    let numbers: BooleanArray = (0..seconds.len()).map(|row| Some(seconds.is_valid(row))).collect();
    Some((Arc::new(seconds), numbers))
}

/// `text` with each number written with an exponent written out without it (`1e-3` as
/// `0.001`), for a cast to DECIMAL, which reads no exponent; `None` when no value has one.
pub fn decimals_without_exponents(text: &StringArray) -> Option<StringArray> {
    if !text.iter().flatten().any(has_exponent) {
        return None;
    }
    Some(text.iter().map(|v| v.map(|v| if has_exponent(v) { without_exponent(v) } else { v.to_string() })).collect())
}

fn options() -> CastOptions<'static> {
    CastOptions { safe: false, format_options: FormatOptions::default() }
}

/// Arrow's cast of `text` to `to`; on failure, the first value that fails.
fn cast_text(text: &StringArray, to: &DataType) -> Result<ArrayRef, NotConverted> {
    cast_with_options(text, to, &options()).map_err(|e| {
        let row = (0..text.len()).find(|&r| cast_with_options(&text.slice(r, 1), to, &options()).is_err());
        NotConverted { row, why: e.to_string() }
    })
}

fn has_exponent(value: &str) -> bool {
    value.contains(['e', 'E'])
}

/// `value`, a number written with an exponent (`-1.5e-3`), written out without it (`-0.0015`);
/// anything else unchanged, for the cast to refuse.
pub fn without_exponent(value: &str) -> String {
    let unchanged = || value.to_string();
    let trimmed = value.trim();
    let Some((mantissa, exponent)) = trimmed.split_once(['e', 'E']) else { return unchanged() };
    let Ok(exponent) = exponent.parse::<i64>() else { return unchanged() };
    if exponent.abs() > DECIMAL_EXPONENT_MAX {
        return unchanged();
    }
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", mantissa.strip_prefix('+').unwrap_or(mantissa)),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() && fraction.is_empty() || !all_digits(whole) || !all_digits(fraction) {
        return unchanged();
    }
    let digits = format!("{whole}{fraction}");
    // Where the point goes, counted in digits from the left of `digits`.
    let point = whole.len() as i64 + exponent;
    let text = if point <= 0 {
        format!("0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
    } else if point as usize >= digits.len() {
        format!("{digits}{}", "0".repeat(point as usize - digits.len()))
    } else {
        let (left, right) = digits.split_at(point as usize);
        format!("{left}.{right}")
    };
    format!("{sign}{text}")
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::{Decimal128Type, Float32Type};

    use super::*;

    fn one(value: &str, to: &DataType) -> Result<ArrayRef, NotConverted> {
        text_column(&StringArray::from(vec![value]), to)
    }

    #[test]
    fn a_time_without_seconds_and_spaces_around_a_date_are_read_as_literals_are() {
        let ts = DataType::Timestamp(datafusion::arrow::datatypes::TimeUnit::Microsecond, None);
        let minutes = one("2024-01-03 10:00", &ts).expect("a time without seconds");
        assert_eq!(
            minutes.as_primitive::<datafusion::arrow::datatypes::TimestampMicrosecondType>().value(0),
            1_704_276_000_000_000
        );
        let date = one(" 2024-01-03 ", &DataType::Date32).expect("spaces around a date");
        assert_eq!(date.as_primitive::<datafusion::arrow::datatypes::Date32Type>().value(0), 19_725);
        // Nothing to change: no new column.
        assert!(times_as_arrow_reads(&StringArray::from(vec!["2024-01-03 10:00:00"]), &ts).is_none());
        assert!(times_as_arrow_reads(&StringArray::from(vec!["2024-01-03 10:00"]), &DataType::Utf8).is_none());
        // Still refused: what a literal refuses.
        assert!(one("2024-01-03 10", &ts).is_err());
    }

    #[test]
    fn exponents_are_written_out() {
        for (given, want) in [
            ("1e-3", "0.001"),
            ("-1.5E-3", "-0.0015"),
            ("+2.5e2", "250"),
            ("1e2", "100"),
            ("12.34e1", "123.4"),
            (".5e1", "5"),
            ("5.e-1", "0.5"),
            ("e5", "e5"),
            ("1e", "1e"),
            ("1e999", "1e999"),
            ("1.2.3e1", "1.2.3e1"),
        ] {
            assert_eq!(without_exponent(given), want, "{given}");
        }
    }

    #[test]
    fn decimals_with_exponents_convert_and_bad_ones_are_named() {
        let got = one("1.25e1", &DataType::Decimal128(10, 2)).unwrap();
        assert_eq!(got.as_primitive::<Decimal128Type>().value(0), 1250);
        let column = StringArray::from(vec![Some("1"), None, Some("2e-2"), Some("x1e2")]);
        let e = text_column(&column, &DataType::Decimal128(10, 2)).unwrap_err();
        assert_eq!(e.row, Some(3), "{}", e.why);
    }

    /// A number for a TIMESTAMP is seconds since 1970, beside timestamps written as text.
    #[test]
    fn numbers_for_timestamps_are_seconds() {
        use datafusion::arrow::datatypes::{TimeUnit, TimestampMicrosecondType};
        let to = DataType::Timestamp(TimeUnit::Microsecond, None);
        let column = StringArray::from(vec![Some("1700000000.5"), None, Some("2024-01-31 12:00:00"), Some("-1")]);
        let got = text_column(&column, &to).unwrap();
        let got: Vec<Option<i64>> = got.as_primitive::<TimestampMicrosecondType>().iter().collect();
        assert_eq!(got, vec![Some(1_700_000_000_500_000), None, Some(1_706_702_400_000_000), Some(-1_000_000)]);
        let e = text_column(&StringArray::from(vec!["1", "1e12"]), &to).unwrap_err();
        assert_eq!(e.row, Some(1), "{}", e.why);
        assert_eq!(text_column(&StringArray::from(vec!["1", "soon"]), &to).unwrap_err().row, Some(1));
    }

    #[test]
    fn reals_beyond_range_or_too_small_are_refused() {
        let got = one("3.25e38", &DataType::Float32).unwrap();
        assert_eq!(got.as_primitive::<Float32Type>().value(0), 3.25e38);
        for kept in ["inf", "-Infinity", "0", "-0", "1e-40", "NaN"] {
            assert!(one(kept, &DataType::Float32).is_ok(), "{kept}");
        }
        let column = StringArray::from(vec![Some("1"), None, Some("3.5e38")]);
        let e = text_column(&column, &DataType::Float32).unwrap_err();
        assert_eq!(e.row, Some(2));
        assert!(e.why.contains("beyond the type's range"), "{}", e.why);
        let e = one("1e-50", &DataType::Float32).unwrap_err();
        assert!(e.why.contains("too close to zero"), "{}", e.why);
        assert_eq!(one("x", &DataType::Float32).unwrap_err().row, Some(0));
    }

    /// A DOUBLE too: `1e400` was stored as `inf` and `1e-400` as 0 (COPY, HTTP CSV), where an
    /// INSERT and `shardwise load` refuse them.
    #[test]
    fn doubles_beyond_range_or_too_small_are_refused() {
        for kept in ["inf", "-Infinity", "1.7e308", "-0", "0e-400", "4.9e-324", "NaN"] {
            assert!(one(kept, &DataType::Float64).is_ok(), "{kept}");
        }
        let column = StringArray::from(vec![Some("1"), None, Some("-1e400")]);
        let e = text_column(&column, &DataType::Float64).unwrap_err();
        assert_eq!(e.row, Some(2));
        assert!(e.why.contains("beyond the type's range"), "{}", e.why);
        let e = one("1e-400", &DataType::Float64).unwrap_err();
        assert!(e.why.contains("too close to zero"), "{}", e.why);
        // A REAL column's DOUBLE step no longer turns 1e400 into an infinity either.
        assert!(one("1e400", &DataType::Float32).unwrap_err().why.contains("beyond the type's range"));
    }
}
