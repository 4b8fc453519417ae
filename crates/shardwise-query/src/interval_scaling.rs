//! `interval * n`, `n * interval` and `interval / n`, as in PostgreSQL: `INTERVAL '1 day' * 3` is
//! 3 days, `INTERVAL '1 month' * 1.5` is 1 month 15 days, `INTERVAL '1 day' / 3` is 8 hours.
//!
//! Why: DataFusion has no arithmetic between an interval and a number and refused these with a
//! message about an operation the user did not write ("Invalid interval arithmetic operation:
//! Interval(MonthDayNano) * Interval(MonthDayNano)"); `now() - INTERVAL '1 day' * n` is a common
//! PostgreSQL idiom.
//!
//! How: [`with_interval_scaling`], a pass over the parsed statement (DataFusion refuses the
//! operator while it plans the SQL, before any rule could see it), writes a product or quotient
//! of an interval literal (`INTERVAL '...'`) and any number as `shardwise_interval_scale(interval,
//! numerator, denominator)`, which scales each part of the interval and carries fractions down as
//! PostgreSQL's `interval_mul` does ([`scaled`]): a fraction of a month as days of 30, a fraction
//! of a day as 24 hours. The call is named as the operator was (`IntervalMonthDayNano(...) *
//! Int64(3)`). Dividing by zero fails with `division by zero`. An interval that is not a literal
//! (a difference of timestamps) times a number is still refused.

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, IntervalMonthDayNanoArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{
    DataType, Float64Type, IntervalMonthDayNano, IntervalMonthDayNanoType, IntervalUnit,
};
use datafusion::common::{Result, ScalarValue, exec_err};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::sql::sqlparser::ast::{BinaryOperator, Expr as SqlExpr, Value};

/// The SQL name of the scaling function.
const FUNCTION_NAME: &str = "shardwise_interval_scale";

/// Days in a month and nanoseconds in a day, for carrying fractions down (PostgreSQL's).
const DAYS_PER_MONTH: f64 = 30.0;
const NANOS_PER_DAY: f64 = 86_400e9;

/// `expr` with a product or quotient of an interval literal and a number written as the scaling
/// call (see the module doc); anything else as it is. Called on each expression after its
/// operands (bottom up).
pub fn with_interval_scaling(expr: SqlExpr) -> SqlExpr {
    let SqlExpr::BinaryOp { left, op, right } = expr else { return expr };
    let is_interval = |e: &SqlExpr| matches!(e, SqlExpr::Interval(_));
    let (interval, numerator, denominator) = match op {
        BinaryOperator::Multiply if is_interval(&left) && !is_interval(&right) => (*left, *right, one()),
        BinaryOperator::Multiply if is_interval(&right) && !is_interval(&left) => (*right, *left, one()),
        BinaryOperator::Divide if is_interval(&left) && !is_interval(&right) => (*left, one(), *right),
        op => return SqlExpr::BinaryOp { left, op, right },
    };
    crate::sql_ast::function_call(FUNCTION_NAME, vec![interval, numerator, denominator])
}

/// The literal `1`.
fn one() -> SqlExpr {
    SqlExpr::Value(Value::Number("1".to_string(), false).into())
}

/// `shardwise_interval_scale`, to register with a session.
pub fn interval_scale_udf() -> Arc<ScalarUDF> {
    Arc::new(ScalarUDF::new_from_impl(IntervalScale { signature: Signature::any(3, Volatility::Immutable) }))
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct IntervalScale {
    signature: Signature,
}

impl ScalarUDFImpl for IntervalScale {
    fn name(&self) -> &str {
        FUNCTION_NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Interval(IntervalUnit::MonthDayNano))
    }

    /// The operator's name: `interval * n`, or `interval / n`.
    fn schema_name(&self, args: &[Expr]) -> Result<String> {
        let is_one = |e: &Expr| matches!(e, Expr::Literal(ScalarValue::Int64(Some(1)), _));
        Ok(match args {
            [interval, n, one] if is_one(one) => format!("{} * {}", interval.schema_name(), n.schema_name()),
            [interval, _, n] => format!("{} / {}", interval.schema_name(), n.schema_name()),
            _ => FUNCTION_NAME.to_string(),
        })
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let all_scalars = args.args.iter().all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let [interval, numerator, denominator] = args.args.as_slice() else {
            return exec_err!("{FUNCTION_NAME} takes an interval, a numerator and a denominator");
        };
        let interval = cast(&interval.to_array(rows)?, &DataType::Interval(IntervalUnit::MonthDayNano))?;
        let numerator = cast(&numerator.to_array(rows)?, &DataType::Float64)?;
        let denominator = cast(&denominator.to_array(rows)?, &DataType::Float64)?;
        let interval = interval.as_primitive::<IntervalMonthDayNanoType>();
        let (numerator, denominator) =
            (numerator.as_primitive::<Float64Type>(), denominator.as_primitive::<Float64Type>());
        let mut out = Vec::with_capacity(rows);
        for i in 0..rows {
            if interval.is_null(i) || numerator.is_null(i) || denominator.is_null(i) {
                out.push(None);
                continue;
            }
            if denominator.value(i) == 0.0 {
                return exec_err!("division by zero");
            }
            out.push(Some(scaled(interval.value(i), numerator.value(i) / denominator.value(i))?));
        }
        let array = IntervalMonthDayNanoArray::from(out);
        crate::udf_wrapper::answer_shaped(Arc::new(array), all_scalars)
    }
}

/// `value` times `factor`, each part scaled and its fraction carried to the next smaller part
/// (PostgreSQL's `interval_mul`); an error when a part leaves its range.
pub fn scaled(value: IntervalMonthDayNano, factor: f64) -> Result<IntervalMonthDayNano> {
    if !factor.is_finite() {
        return exec_err!("interval out of range: scaled by {factor}");
    }
    let months_exact = f64::from(value.months) * factor;
    let months = months_exact.trunc();
    let month_days = (months_exact - months) * DAYS_PER_MONTH;
    let days_exact = f64::from(value.days) * factor + month_days;
    let days = days_exact.trunc();
    let nanos_exact = value.nanoseconds as f64 * factor + (days_exact - days) * NANOS_PER_DAY;
    let nanos = nanos_exact.round();
    let in_i32 = |x: f64| (f64::from(i32::MIN)..=f64::from(i32::MAX)).contains(&x);
    if !in_i32(months) || !in_i32(days) || !(-9.2e18..=9.2e18).contains(&nanos) {
        return exec_err!("interval out of range");
    }
    Ok(IntervalMonthDayNano::new(months as i32, days as i32, nanos as i64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn interval(months: i32, days: i32, nanos: i64) -> IntervalMonthDayNano {
        IntervalMonthDayNano::new(months, days, nanos)
    }

    #[test]
    fn parts_scale_and_fractions_carry_down() -> Result<()> {
        let hour = 3_600_000_000_000i64;
        assert_eq!(scaled(interval(0, 1, 0), 3.0)?, interval(0, 3, 0));
        assert_eq!(scaled(interval(1, 0, 0), 1.5)?, interval(1, 15, 0));
        assert_eq!(scaled(interval(0, 1, 0), 1.0 / 3.0)?, interval(0, 0, 8 * hour));
        assert_eq!(scaled(interval(0, 0, hour), -2.0)?, interval(0, 0, -2 * hour));
        assert!(scaled(interval(i32::MAX, 0, 0), 2.0).is_err());
        Ok(())
    }

    #[tokio::test]
    async fn products_and_quotients_in_sql() -> Result<()> {
        use datafusion::sql::sqlparser::ast::{VisitMut, VisitorMut};
        struct Rewrite;
        impl VisitorMut for Rewrite {
            type Break = ();
            fn post_visit_expr(&mut self, expr: &mut SqlExpr) -> std::ops::ControlFlow<()> {
                let placeholder = SqlExpr::Value(Value::Null.into());
                *expr = with_interval_scaling(std::mem::replace(expr, placeholder));
                std::ops::ControlFlow::Continue(())
            }
        }
        let ctx = datafusion::prelude::SessionContext::new();
        ctx.register_udf(interval_scale_udf().as_ref().clone());
        let run = |sql: &str| {
            let state = ctx.state();
            let sql = sql.to_string();
            async move {
                let dialect = state.config().options().sql_parser.dialect;
                let mut statement = state.sql_to_statement(&sql, &dialect)?;
                if let datafusion::sql::parser::Statement::Statement(s) = &mut statement {
                    let _ = s.visit(&mut Rewrite);
                }
                let plan = state.statement_to_plan(statement).await?;
                datafusion::prelude::SessionContext::new_with_state(state)
                    .execute_logical_plan(plan)
                    .await?
                    .collect()
                    .await
            }
        };
        let batches = run("SELECT INTERVAL '1 day' * 3 AS a, 2 * INTERVAL '1 hour' AS b, INTERVAL '1 day' / 4 AS c, \
             TIMESTAMP '2024-01-10 00:00:00' - INTERVAL '1 day' * n AS d FROM (VALUES (2)) v(n)")
        .await?;
        let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches)?.to_string();
        assert!(text.contains("3 days") && text.contains("2 hours") && text.contains("6 hours"), "{text}");
        assert!(text.contains("2024-01-08T00:00:00"), "{text}");
        let e = run("SELECT INTERVAL '1 day' / 0").await.expect_err("by zero");
        assert!(e.to_string().contains("division by zero"), "{e}");
        Ok(())
    }
}
