//! PostgreSQL's `age(ts1, ts2)` and `age(ts)`: the time between two timestamps in calendar
//! years, months and days, then hours, minutes and seconds (`age('2024-05-05', '2024-01-01')` is
//! `4 mons 4 days`); `age(ts)` is from `ts` to today's midnight.
//!
//! Why: DataFusion has no `age` ("Invalid function 'age'"), a common PostgreSQL function
//! (`age(birth_date)`), and `ts1 - ts2` is a number of days and seconds, not of months.
//!
//! How: [`age_udf`], a function registered under PostgreSQL's name, computes the difference field
//! by field and borrows downwards as PostgreSQL's `timestamp_age` does ([`symbolic_age`]): a
//! negative day count borrows the days of the month before the later date's. `age(ts)` is written
//! as `age(CAST(current_date() AS TIMESTAMP), ts)` when the plan is simplified.

use std::sync::Arc;

use chrono::{Datelike, NaiveDate, NaiveDateTime, Timelike};
use datafusion::arrow::array::{Array, AsArray, IntervalMonthDayNanoArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, IntervalMonthDayNano, IntervalUnit, TimeUnit, TimestampNanosecondType};
use datafusion::arrow::temporal_conversions::timestamp_ns_to_datetime;
use datafusion::common::{Result, exec_err};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::simplify::{ExprSimplifyResult, SimplifyContext};
use datafusion::logical_expr::{
    Cast, ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, TypeSignature, Volatility,
};

/// `age`, to register with a session.
pub fn age_udf() -> Arc<ScalarUDF> {
    Arc::new(ScalarUDF::new_from_impl(Age {
        signature: Signature::one_of(vec![TypeSignature::Any(1), TypeSignature::Any(2)], Volatility::Stable),
    }))
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct Age {
    signature: Signature,
}

fn is_time(t: &DataType) -> bool {
    matches!(t, DataType::Timestamp(..) | DataType::Date32 | DataType::Date64)
}

impl ScalarUDFImpl for Age {
    fn name(&self) -> &str {
        "age"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        if !arg_types.iter().all(is_time) {
            return exec_err!("age takes timestamps or dates, not {arg_types:?}");
        }
        Ok(DataType::Interval(IntervalUnit::MonthDayNano))
    }

    /// `age(ts)` as `age(today at midnight, ts)`.
    fn simplify(&self, args: Vec<Expr>, _info: &SimplifyContext) -> Result<ExprSimplifyResult> {
        if args.len() != 1 {
            return Ok(ExprSimplifyResult::Original(args));
        }
        let today = Expr::Cast(Cast::new(
            Box::new(datafusion::functions::datetime::expr_fn::current_date()),
            DataType::Timestamp(TimeUnit::Nanosecond, None),
        ));
        let mut both = vec![today];
        both.extend(args);
        Ok(ExprSimplifyResult::Simplified(Expr::ScalarFunction(ScalarFunction::new_udf(age_udf(), both))))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let all_scalars = args.args.iter().all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let [later, earlier] = args.args.as_slice() else {
            return exec_err!("age(ts) is planned as age(today, ts); age takes one or two timestamps");
        };
        let as_nanos = |v: &ColumnarValue| -> Result<_> {
            Ok(cast(&v.to_array(rows)?, &DataType::Timestamp(TimeUnit::Nanosecond, None))?)
        };
        let (later, earlier) = (as_nanos(later)?, as_nanos(earlier)?);
        let (later, earlier) =
            (later.as_primitive::<TimestampNanosecondType>(), earlier.as_primitive::<TimestampNanosecondType>());
        let mut out = Vec::with_capacity(rows);
        for i in 0..rows {
            if later.is_null(i) || earlier.is_null(i) {
                out.push(None);
                continue;
            }
            let (Some(a), Some(b)) =
                (timestamp_ns_to_datetime(later.value(i)), timestamp_ns_to_datetime(earlier.value(i)))
            else {
                return exec_err!("age: timestamp out of range");
            };
            out.push(Some(symbolic_age(a, b)));
        }
        let array = IntervalMonthDayNanoArray::from(out);
        crate::udf_wrapper::answer_shaped(Arc::new(array), all_scalars)
    }
}

/// Days in `month` (1-12) of `year`.
fn days_in_month(year: i32, month: u32) -> i64 {
    let (next_year, next_month) = if month == 12 { (year + 1, 1) } else { (year, month + 1) };
    match (NaiveDate::from_ymd_opt(year, month, 1), NaiveDate::from_ymd_opt(next_year, next_month, 1)) {
        (Some(first), Some(next)) => (next - first).num_days(),
        _ => 30,
    }
}

/// `a - b` in years, months, days and time, borrowing as PostgreSQL's `timestamp_age` does.
pub fn symbolic_age(a: NaiveDateTime, b: NaiveDateTime) -> IntervalMonthDayNano {
    let negative = a < b;
    let sign = if negative { -1 } else { 1 };
    let field = |x: i64, y: i64| sign * (x - y);
    let mut nanos = field(i64::from(a.nanosecond()), i64::from(b.nanosecond()));
    let mut sec = field(i64::from(a.second()), i64::from(b.second()));
    let mut min = field(i64::from(a.minute()), i64::from(b.minute()));
    let mut hour = field(i64::from(a.hour()), i64::from(b.hour()));
    let mut day = field(i64::from(a.day()), i64::from(b.day()));
    let mut mon = field(i64::from(a.month()), i64::from(b.month()));
    let mut year = field(i64::from(a.year()), i64::from(b.year()));
    while nanos < 0 {
        nanos += 1_000_000_000;
        sec -= 1;
    }
    while sec < 0 {
        sec += 60;
        min -= 1;
    }
    while min < 0 {
        min += 60;
        hour -= 1;
    }
    while hour < 0 {
        hour += 24;
        day -= 1;
    }
    // The month borrowed from: the earlier date's when counting forward (PostgreSQL's tm2, or
    // tm1 when the order is reversed).
    let borrow_from = if negative { a } else { b };
    while day < 0 {
        day += days_in_month(borrow_from.year(), borrow_from.month());
        mon -= 1;
    }
    while mon < 0 {
        mon += 12;
        year -= 1;
    }
    let months = sign * (year * 12 + mon);
    let time = sign * (((hour * 60 + min) * 60 + sec) * 1_000_000_000 + nanos);
    IntervalMonthDayNano::new(months as i32, (sign * day) as i32, time)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> NaiveDateTime {
        NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S").expect("a timestamp")
    }

    #[test]
    fn ages_as_postgres_counts_them() {
        let hour = 3_600_000_000_000i64;
        // PostgreSQL 15: age('2024-05-05', '2024-01-01') = 4 mons 4 days.
        assert_eq!(
            symbolic_age(at("2024-05-05 00:00:00"), at("2024-01-01 00:00:00")),
            IntervalMonthDayNano::new(4, 4, 0)
        );
        // age('2024-03-01', '2024-01-31') = 1 mon 1 day (January's 31 days borrowed).
        assert_eq!(
            symbolic_age(at("2024-03-01 00:00:00"), at("2024-01-31 00:00:00")),
            IntervalMonthDayNano::new(1, 1, 0)
        );
        // age('2001-04-10', '1957-06-13') = 43 years 9 mons 27 days (PostgreSQL's documentation).
        assert_eq!(
            symbolic_age(at("2001-04-10 00:00:00"), at("1957-06-13 00:00:00")),
            IntervalMonthDayNano::new(43 * 12 + 9, 27, 0)
        );
        // Negative, and with a time of day.
        assert_eq!(
            symbolic_age(at("2024-01-01 00:00:00"), at("2024-05-05 00:00:00")),
            IntervalMonthDayNano::new(-4, -4, 0)
        );
        assert_eq!(
            symbolic_age(at("2024-01-02 01:00:00"), at("2024-01-01 03:00:00")),
            IntervalMonthDayNano::new(0, 0, 22 * hour)
        );
    }

    #[tokio::test]
    async fn age_in_sql() -> Result<()> {
        let ctx = datafusion::prelude::SessionContext::new();
        ctx.register_udf(age_udf().as_ref().clone());
        let batches = ctx
            .sql("SELECT age(TIMESTAMP '2024-05-05 00:00:00', TIMESTAMP '2024-01-01 00:00:00') AS a, age(DATE '2020-01-01') AS b")
            .await?
            .collect()
            .await?;
        let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches)?.to_string();
        assert!(text.contains("4 mons 4 days"), "{text}");
        Ok(())
    }
}
