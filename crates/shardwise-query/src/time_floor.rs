//! A time stored with less precision than it came with keeps the instant's start: its finer
//! digits are dropped (floored), on every insert path.
//!
//! Why: Arrow's cast from a finer TIMESTAMP unit to a coarser one, and from a DATE64 to a DATE,
//! divides toward zero, so an instant before 1970 moved *forward*: `1969-12-31 23:59:59.5` into a
//! TIMESTAMP(0) became `1970-01-01 00:00:00` through an INSERT of a TIMESTAMP value, `INSERT ...
//! SELECT`, a Parquet load and Flight SQL bulk ingest, while the same text through `COPY`, a CSV
//! load or an INSERT of a string became `1969-12-31 23:59:59` (its digits cut): one file loaded as
//! CSV and as Parquet gave different tables. Now every path drops the finer digits as text parsing
//! does, so an instant never moves to a later second or day. (PostgreSQL rounds to the column's
//! precision instead.)
//!
//! How: [`floored`] gives the value with its finer digits zeroed, in its own type, so that the
//! cast that follows is exact; bulk ingest calls it before its cast, and an INSERT's implicit
//! casts are wrapped in [`floor_time_udf`] by [`crate::insert_exact`].

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int64Array};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int64Type, TimeUnit};
use datafusion::common::{Result, ScalarValue, exec_err};
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility};

/// The function's SQL name.
pub const FLOOR_TIME: &str = "shardwise_floor_time";

/// Milliseconds in a day: a DATE64 holds milliseconds, a DATE whole days.
const MS_PER_DAY: i64 = 86_400_000;

/// How many of `from`'s units one of `to`'s holds, when a cast from `from` to `to` drops digits
/// (a coarser TIMESTAMP unit, or a DATE64 to a DATE).
pub fn coarsening(from: &DataType, to: &DataType) -> Option<i64> {
    let per_second = |unit: &TimeUnit| match unit {
        TimeUnit::Second => 1i64,
        TimeUnit::Millisecond => 1_000,
        TimeUnit::Microsecond => 1_000_000,
        TimeUnit::Nanosecond => 1_000_000_000,
    };
    match (from, to) {
        (DataType::Timestamp(from, _), DataType::Timestamp(to, _)) => {
            let factor = per_second(from) / per_second(to);
            (factor > 1).then_some(factor)
        }
        (DataType::Date64, DataType::Date32) => Some(MS_PER_DAY),
        _ => None,
    }
}

/// `array` with the digits a cast to `to` drops set to zero, rounding toward the past, in
/// `array`'s own type; `None` when the cast drops none (or none is set).
pub fn floored(array: &ArrayRef, to: &DataType) -> Option<ArrayRef> {
    let factor = coarsening(array.data_type(), to)?;
    let raw = cast(array, &DataType::Int64).ok()?;
    let raw = raw.as_primitive::<Int64Type>();
    if !raw.iter().flatten().any(|v| v.rem_euclid(factor) != 0) {
        return None;
    }
    // The earliest instant a type holds has no earlier multiple: it stays (its cast then cuts).
    let floored: Int64Array = raw.unary(|v| v.checked_sub(v.rem_euclid(factor)).unwrap_or(v));
    cast(&(Arc::new(floored) as ArrayRef), array.data_type()).ok()
}

/// The function, ready to call or register.
pub fn floor_time_udf() -> Arc<ScalarUDF> {
    Arc::new(ScalarUDF::new_from_impl(FloorTime { signature: Signature::any(2, Volatility::Immutable) }))
}

/// `shardwise_floor_time(value, 'type')`: `value` with the digits a cast to `type` drops zeroed.
#[derive(Debug, PartialEq, Eq, Hash)]
struct FloorTime {
    signature: Signature,
}

impl ScalarUDFImpl for FloorTime {
    fn name(&self) -> &str {
        FLOOR_TIME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        match arg_types.first() {
            Some(value) => Ok(value.clone()),
            None => exec_err!("{FLOOR_TIME} takes a value and a type name"),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let (value, to, _) = value_and_type(&args.args, FLOOR_TIME)?;
        match value {
            ColumnarValue::Array(array) => Ok(ColumnarValue::Array(floored(array, &to).unwrap_or(Arc::clone(array)))),
            ColumnarValue::Scalar(scalar) => {
                let array = scalar.to_array()?;
                match floored(&array, &to) {
                    Some(f) => Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(&f, 0)?)),
                    None => Ok(value.clone()),
                }
            }
        }
    }
}

/// The arguments of a function called as `f(value, 'type')`: the value, the type, and the
/// type's name as written.
pub(crate) fn value_and_type<'a>(
    args: &'a [ColumnarValue],
    name: &str,
) -> Result<(&'a ColumnarValue, DataType, &'a str)> {
    let [value, ColumnarValue::Scalar(target)] = args else {
        return exec_err!("{name} takes a value and a type name");
    };
    let target = match target {
        ScalarValue::Utf8(Some(t)) | ScalarValue::Utf8View(Some(t)) | ScalarValue::LargeUtf8(Some(t)) => t,
        other => return exec_err!("{name}: the type name must be a string, got {other}"),
    };
    Ok((value, target.parse()?, target))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Date64Array, TimestampNanosecondArray};
    use datafusion::arrow::datatypes::TimestampSecondType;

    #[test]
    fn finer_digits_are_dropped_toward_the_past() {
        let ns: ArrayRef = Arc::new(TimestampNanosecondArray::from(vec![
            Some(-500_000_000),
            Some(1_500_000_000),
            None,
            Some(-1),
            Some(-2_000_000_000),
        ]));
        let to = DataType::Timestamp(TimeUnit::Second, None);
        let cut = cast(&floored(&ns, &to).unwrap(), &to).unwrap();
        let seconds: Vec<Option<i64>> = cut.as_primitive::<TimestampSecondType>().iter().collect();
        assert_eq!(seconds, vec![Some(-1), Some(1), None, Some(-1), Some(-2)]);
        // Whole seconds already, or no coarser unit: nothing to do.
        let whole: ArrayRef = Arc::new(TimestampNanosecondArray::from(vec![-2_000_000_000, 0]));
        assert!(floored(&whole, &to).is_none());
        assert!(floored(&ns, &DataType::Timestamp(TimeUnit::Nanosecond, None)).is_none());
        // A DATE64 before 1970 with a time in it is the day it falls in.
        let ms: ArrayRef = Arc::new(Date64Array::from(vec![-1, MS_PER_DAY + 5]));
        let days = cast(&floored(&ms, &DataType::Date32).unwrap(), &DataType::Date32).unwrap();
        let days: Vec<i32> = days.as_primitive::<datafusion::arrow::datatypes::Date32Type>().values().to_vec();
        assert_eq!(days, vec![-1, 1]);
        // The earliest instant has no earlier second: kept (the cast then cuts it).
        let min: ArrayRef = Arc::new(TimestampNanosecondArray::from(vec![i64::MIN]));
        assert!(floored(&min, &to).is_some());
    }
}
