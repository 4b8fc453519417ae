//! A whole number becoming a timestamp is seconds since 1970, wherever the cast comes from.
//!
//! DataFusion's SQL planner reads `CAST(1700000000 AS TIMESTAMP)` as seconds (it casts to
//! `Timestamp(s)` first), but a cast it adds itself, such as the one that makes an `INSERT`'s
//! value the column's type (`INSERT INTO t (ts) VALUES (1700000000)`), is Arrow's cast, which
//! reads the number in the target's unit: nanoseconds for `TIMESTAMP`, so the row stored
//! `1970-01-01 00:00:01.7`. [`IntegersAsSeconds`], an analyzer rule, gives every cast from an
//! integer to a timestamp of another unit the planner's step through seconds, so the two agree
//! (and `shardwise load` reads numbers for timestamp columns the same way). A float or a decimal
//! is seconds too, with its fraction (`1700000000.5` is half a second past): Arrow's cast would
//! read it in the target's unit as well.
//!
//! Batches that arrive typed (Flight SQL bulk ingest, Parquet and Arrow over HTTP, and
//! `shardwise load`'s files) are converted by [`seconds_as_timestamps`], which reads numbers the
//! same way: Arrow's cast read a Parquet DOUBLE `1700000000.5` as 1.7 seconds past 1970.

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int64Array};
use datafusion::arrow::compute::{CastOptions, cast_with_options};
use datafusion::arrow::datatypes::{DataType, Field, Float64Type, TimeUnit};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::error::Result;
use datafusion::functions::math::expr_fn::{round, trunc};
use datafusion::logical_expr::expr::Cast;
use datafusion::logical_expr::{Expr, ExprSchemable, LogicalPlan};
use datafusion::optimizer::AnalyzerRule;
use std::sync::Arc;

/// The analyzer rule (see the module doc).
#[derive(Debug, Default)]
pub struct IntegersAsSeconds;

impl AnalyzerRule for IntegersAsSeconds {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        crate::expression_rules::rewrite_expressions(plan, through_seconds)
    }

    fn name(&self) -> &str {
        "shardwise_integers_as_seconds"
    }
}

/// `CAST(n AS Timestamp(unit))` of an integer `n` as `CAST(CAST(n AS Timestamp(s)) AS
/// Timestamp(unit))`; of a float or decimal `x` as seconds with their fraction (through a double:
/// whole seconds, and the fraction rounded to the nanosecond), then the target's unit; other
/// expressions as they are. An expression of a node without input (`VALUES`) is typed against an empty schema.
fn through_seconds(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    let Expr::Cast(Cast { expr, field }) = &e else { return Ok(Transformed::no(e)) };
    let DataType::Timestamp(unit, zone) = field.data_type() else { return Ok(Transformed::no(e)) };
    if *unit == TimeUnit::Second {
        return Ok(Transformed::no(e));
    }
    let input_type = match expr.as_ref() {
        Expr::Literal(value, _) => value.data_type(),
        other => match other.get_type(schema) {
            Ok(t) => t,
            Err(_) => return Ok(Transformed::no(e)),
        },
    };
    let cast =
        |expr: Expr, to: DataType| Expr::Cast(Cast { expr: Box::new(expr), field: Arc::new(Field::new("", to, true)) });
    let inner = if input_type.is_integer() {
        cast(*expr.clone(), DataType::Timestamp(TimeUnit::Second, zone.clone()))
    } else if input_type.is_floating() || matches!(input_type, DataType::Decimal128(..) | DataType::Decimal256(..)) {
        // Whole seconds and the fraction apart: a double's 53 bits hold today's seconds and a
        // fraction to about 0.2 microseconds, not the 61 bits of today's nanoseconds.
        let seconds = cast(*expr.clone(), DataType::Float64);
        let whole = trunc(vec![seconds.clone()]);
        let fraction_ns = round(vec![(seconds - whole.clone()) * Expr::Literal(ScalarValue::Float64(Some(1e9)), None)]);
        let nanos = cast(whole, DataType::Int64) * Expr::Literal(ScalarValue::Int64(Some(1_000_000_000)), None)
            + cast(fraction_ns, DataType::Int64);
        cast(nanos, DataType::Timestamp(TimeUnit::Nanosecond, zone.clone()))
    } else {
        return Ok(Transformed::no(e));
    };
    Ok(Transformed::yes(Expr::Cast(Cast { expr: Box::new(inner), field: Arc::clone(field) })))
}

/// A number that [`seconds_as_timestamps`] could not make a timestamp.
#[derive(Debug, Clone, PartialEq)]
pub struct NotATimestamp {
    /// The row, when one value is the cause.
    pub row: Option<usize>,
    /// Why, naming the value.
    pub message: String,
}

/// Seconds since 1970 that fit an `i64` of nanoseconds (1677-09-21 to 2262-04-11), with a margin
/// the checked arithmetic below catches.
const SECONDS_MAX: f64 = 9.3e9;

/// `array` of numbers (seconds since 1970, a float's or decimal's fraction a part of a second)
/// as the timestamp type `to`; `None` when `array` holds no numbers or `to` is no timestamp.
pub fn seconds_as_timestamps(array: &ArrayRef, to: &DataType) -> Option<Result<ArrayRef, NotATimestamp>> {
    let DataType::Timestamp(_, zone) = to else { return None };
    let from = array.data_type();
    let checked = CastOptions { safe: false, ..Default::default() };
    let failed = |e: datafusion::arrow::error::ArrowError| NotATimestamp {
        row: None,
        message: format!("a {from} value does not convert to {to} ({e})"),
    };
    if from.is_integer() {
        let seconds = DataType::Timestamp(TimeUnit::Second, zone.clone());
        return Some(
            cast_with_options(array, &seconds, &checked)
                .and_then(|s| cast_with_options(&s, to, &checked))
                .map_err(failed),
        );
    }
    if !from.is_floating() && !matches!(from, DataType::Decimal128(..) | DataType::Decimal256(..)) {
        return None;
    }
    Some((|| {
        let seconds = cast_with_options(array, &DataType::Float64, &checked).map_err(failed)?;
        let seconds = seconds.as_primitive::<Float64Type>();
        let mut nanos = Vec::with_capacity(seconds.len());
        for (row, value) in seconds.iter().enumerate() {
            let Some(s) = value else {
                nanos.push(None);
                continue;
            };
            // Whole seconds and the fraction apart, as the INSERT's cast computes them.
            let whole = s.trunc();
            let ns = (s.is_finite() && whole.abs() < SECONDS_MAX)
                .then(|| (whole as i64).checked_mul(1_000_000_000)?.checked_add(((s - whole) * 1e9).round() as i64))
                .flatten()
                .ok_or_else(|| NotATimestamp {
                    row: Some(row),
                    message: format!("{s} (seconds since 1970) is out of range for {to}"),
                })?;
            nanos.push(Some(ns));
        }
        let nanos: ArrayRef = Arc::new(Int64Array::from(nanos));
        let at = DataType::Timestamp(TimeUnit::Nanosecond, zone.clone());
        cast_with_options(&nanos, &at, &checked).and_then(|t| cast_with_options(&t, to, &checked)).map_err(failed)
    })())
}

#[cfg(test)]
mod array_tests {
    use datafusion::arrow::array::{Decimal128Array, Float64Array, Int32Array};
    use datafusion::arrow::datatypes::TimestampMicrosecondType;

    use super::*;

    fn micros(array: ArrayRef) -> Vec<Option<i64>> {
        let to = DataType::Timestamp(TimeUnit::Microsecond, None);
        let done = seconds_as_timestamps(&array, &to).expect("numbers").expect("converted");
        done.as_primitive::<TimestampMicrosecondType>().iter().collect()
    }

    #[test]
    fn numbers_are_seconds_with_their_fraction() {
        let floats: ArrayRef = Arc::new(Float64Array::from(vec![Some(1_700_000_000.5), None, Some(-1.25)]));
        assert_eq!(micros(floats), vec![Some(1_700_000_000_500_000), None, Some(-1_250_000)]);
        let decimals = Decimal128Array::from(vec![17_000_000_005, 10]).with_precision_and_scale(12, 1).expect("dec");
        assert_eq!(micros(Arc::new(decimals)), vec![Some(1_700_000_000_500_000), Some(1_000_000)]);
        let ints: ArrayRef = Arc::new(Int32Array::from(vec![1_700_000_000]));
        assert_eq!(micros(ints), vec![Some(1_700_000_000_000_000)]);
    }

    #[test]
    fn numbers_beyond_the_range_are_named() {
        let to = DataType::Timestamp(TimeUnit::Nanosecond, None);
        let floats: ArrayRef = Arc::new(Float64Array::from(vec![1.0, 1e12, f64::NAN]));
        let e = seconds_as_timestamps(&floats, &to).expect("numbers").expect_err("1e12 s");
        assert_eq!(e.row, Some(1));
        assert!(e.message.contains("1000000000000 (seconds since 1970) is out of range"), "{}", e.message);
        let text: ArrayRef = Arc::new(datafusion::arrow::array::StringArray::from(vec!["1"]));
        assert!(seconds_as_timestamps(&text, &to).is_none());
    }
}
