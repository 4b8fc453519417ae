//! The dates a `DATE` column holds: those chrono, and so DataFusion's casts, date arithmetic and
//! every answer format, can show (262143 BCE to 262142 CE). Arrow's `Date32` holds any `i32` of
//! days since 1970, so a Parquet file or an Arrow batch can carry a date beyond them, which would
//! be stored and then read back as an error in place of its value. Every insert checks its
//! date columns against this range instead.

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{DataType, Date32Type, Date64Type};

const MS_PER_DAY: i64 = 86_400_000;

/// The first and last day (since 1970-01-01) a `DATE` may be.
pub fn day_range() -> (i64, i64) {
    let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).unwrap_or_default();
    let days = |d: chrono::NaiveDate| d.signed_duration_since(epoch).num_days();
    (days(chrono::NaiveDate::MIN), days(chrono::NaiveDate::MAX))
}

/// A date no client could read back, in a `Date32` or `Date64` column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DateOutOfRange {
    /// Its index in the array.
    pub row: usize,
    /// What the message says of it.
    pub message: String,
}

/// The first value of `array` (of a date type; other types have none) outside [`day_range`].
pub fn first_date_out_of_range(array: &dyn Array) -> Option<DateOutOfRange> {
    let (min, max) = day_range();
    let outside = |days: i64| days < min || days > max;
    let (row, days) = match array.data_type() {
        DataType::Date32 => {
            let dates = array.as_primitive::<Date32Type>();
            dates
                .iter()
                .enumerate()
                .find_map(|(i, d)| d.filter(|d| outside(i64::from(*d))).map(|d| (i, i64::from(d))))?
        }
        DataType::Date64 => {
            let dates = array.as_primitive::<Date64Type>();
            dates
                .iter()
                .enumerate()
                .find_map(|(i, d)| d.map(|d| (i, d.div_euclid(MS_PER_DAY))).filter(|(_, d)| outside(*d)))?
        }
        _ => return None,
    };
    Some(DateOutOfRange {
        row,
        message: format!(
            "the date {days} days from 1970-01-01 is beyond the dates a DATE holds ({} to {})",
            chrono::NaiveDate::MIN,
            chrono::NaiveDate::MAX
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Date32Array, Date64Array};

    #[test]
    fn dates_chrono_cannot_show_are_found_and_the_rest_pass() {
        let (min, max) = day_range();
        assert!(min < -90_000_000 && max > 90_000_000, "{min} {max}");
        let fine = Date32Array::from(vec![Some(0), None, Some(min as i32), Some(max as i32)]);
        assert_eq!(first_date_out_of_range(&fine), None);
        let bad = Date32Array::from(vec![Some(19_723), None, Some(-99_999_999)]);
        let found = first_date_out_of_range(&bad).expect("out of range");
        assert_eq!(found.row, 2);
        assert!(found.message.contains("-99999999 days"), "{}", found.message);
        let bad64 = Date64Array::from(vec![Some(0), Some((max + 1) * MS_PER_DAY)]);
        assert_eq!(first_date_out_of_range(&bad64).map(|f| f.row), Some(1));
    }
}
