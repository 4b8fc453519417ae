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

use datafusion::arrow::datatypes::{DataType, Field, TimeUnit};
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
