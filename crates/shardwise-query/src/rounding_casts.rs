//! A fraction cast to an integer is rounded, as PostgreSQL and DuckDB do: `CAST(9.99 AS INT)`
//! is 10, `CAST(-9.5 AS INT)` is -10 (a DECIMAL's half away from zero), and
//! `CAST(2.5::DOUBLE AS INT)` is 2 (a float's half to even, C's `rint`, as both engines do).
//!
//! Why: Arrow's cast cuts the fraction off (9 and -9), so the same query answered differently
//! here than on the engines whose SQL the PostgreSQL endpoint speaks, with no error.
//!
//! How: [`RoundingCasts`], an analyzer rule, puts `round(x)` (half away from zero, DataFusion's
//! `round`) under every cast or `TRY_CAST` from a decimal with a fraction to an integer type,
//! and [`round_half_even_udf`] under one from a float. An `INSERT` of a fraction into an integer column still fails
//! (`crate::insert_exact` checks the value before its cast).

use std::sync::{Arc, LazyLock};

use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::{DataType, Float32Type, Float64Type};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::error::Result;
use datafusion::functions::math::expr_fn::round;
use datafusion::logical_expr::expr::{Cast, ScalarFunction, TryCast};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ExprSchemable, LogicalPlan, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};
use datafusion::optimizer::AnalyzerRule;

/// The analyzer rule (see the module doc).
#[derive(Debug, Default)]
pub struct RoundingCasts;

impl AnalyzerRule for RoundingCasts {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        crate::expression_rules::rewrite_expressions(plan, rounded)
    }

    fn name(&self) -> &str {
        "shardwise_rounding_casts"
    }
}

/// Whether a value of type `t` can have a fraction.
fn has_fraction(t: &DataType) -> bool {
    match t {
        DataType::Float16 | DataType::Float32 | DataType::Float64 => true,
        DataType::Decimal32(_, s)
        | DataType::Decimal64(_, s)
        | DataType::Decimal128(_, s)
        | DataType::Decimal256(_, s) => *s > 0,
        _ => false,
    }
}

/// `e`, a cast of a fraction to an integer, over `round` of its argument; anything else as is.
fn rounded(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    let (expr, to) = match &e {
        Expr::Cast(Cast { expr, field }) | Expr::TryCast(TryCast { expr, field }) => (expr, field.data_type()),
        _ => return Ok(Transformed::no(e)),
    };
    let from = match expr.get_type(schema) {
        Ok(from) => from,
        // Not typed against this node's input (an outer reference): left as written.
        Err(_) => return Ok(Transformed::no(e)),
    };
    if !to.is_integer() || !has_fraction(&from) || is_rounded(expr) {
        return Ok(Transformed::no(e));
    }
    let float = matches!(from, DataType::Float16 | DataType::Float32 | DataType::Float64);
    let rounded = |x: Expr| {
        if float {
            Expr::ScalarFunction(ScalarFunction::new_udf(round_half_even_udf(), vec![x]))
        } else {
            round(vec![x])
        }
    };
    Ok(Transformed::yes(match e {
        Expr::Cast(Cast { expr, field }) => Expr::Cast(Cast { expr: Box::new(rounded(*expr)), field }),
        Expr::TryCast(TryCast { expr, field }) => Expr::TryCast(TryCast { expr: Box::new(rounded(*expr)), field }),
        other => other,
    }))
}

/// Whether `e` is a call of a rounding function already (the rule's own work, seen again).
fn is_rounded(e: &Expr) -> bool {
    matches!(e, Expr::ScalarFunction(f) if f.name() == "round" || f.name() == ROUND_HALF_EVEN)
}

/// The name of [`round_half_even_udf`], callable by users too (DuckDB's `roundbankers(x, 0)`).
pub const ROUND_HALF_EVEN: &str = "round_half_even";

/// `round_half_even(x)`: a float rounded to the nearest integer, halves to the even one
/// (`f64::round_ties_even`, C's `rint`).
pub fn round_half_even_udf() -> Arc<ScalarUDF> {
    static UDF: LazyLock<Arc<ScalarUDF>> = LazyLock::new(|| {
        Arc::new(ScalarUDF::new_from_impl(RoundHalfEven {
            signature: Signature::uniform(1, vec![DataType::Float64, DataType::Float32], Volatility::Immutable),
        }))
    });
    Arc::clone(&UDF)
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct RoundHalfEven {
    signature: Signature,
}

impl ScalarUDFImpl for RoundHalfEven {
    fn name(&self) -> &str {
        ROUND_HALF_EVEN
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        Ok(arg_types.first().cloned().unwrap_or(DataType::Float64))
    }

    /// Unbounded, of the argument's type ([`crate::udf_wrapper::unbounded_like`]).
    fn evaluate_bounds(
        &self,
        input: &[&datafusion::logical_expr::interval_arithmetic::Interval],
    ) -> Result<datafusion::logical_expr::interval_arithmetic::Interval> {
        crate::udf_wrapper::unbounded_like(input, 0)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let [x] = args.args.as_slice() else {
            return datafusion::common::exec_err!("{ROUND_HALF_EVEN} takes one argument");
        };
        Ok(match x {
            ColumnarValue::Scalar(ScalarValue::Float64(v)) => {
                ColumnarValue::Scalar(ScalarValue::Float64(v.map(f64::round_ties_even)))
            }
            ColumnarValue::Scalar(ScalarValue::Float32(v)) => {
                ColumnarValue::Scalar(ScalarValue::Float32(v.map(f32::round_ties_even)))
            }
            ColumnarValue::Array(array) => match array.data_type() {
                DataType::Float64 => ColumnarValue::Array(Arc::new(
                    array.as_primitive::<Float64Type>().unary::<_, Float64Type>(f64::round_ties_even),
                )),
                DataType::Float32 => ColumnarValue::Array(Arc::new(
                    array.as_primitive::<Float32Type>().unary::<_, Float32Type>(f32::round_ties_even),
                )),
                other => return datafusion::common::exec_err!("{ROUND_HALF_EVEN} of {other}"),
            },
            other => return datafusion::common::exec_err!("{ROUND_HALF_EVEN} of {}", other.data_type()),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use datafusion::arrow::util::pretty::pretty_format_batches;
    use datafusion::prelude::SessionContext;

    #[tokio::test]
    async fn floats_round_half_to_even() -> Result<()> {
        let ctx = SessionContext::new();
        ctx.add_analyzer_rule(Arc::new(RoundingCasts));
        ctx.register_udf(round_half_even_udf().as_ref().clone());
        let sql = "SELECT CAST(x AS INT) AS i, CAST(x AS BIGINT) AS b, CAST(CAST(x AS REAL) AS SMALLINT) AS s \
                   FROM (VALUES (2.5e0), (-2.5e0), (0.5e0), (-0.5e0), (3.5e0), (2.6e0)) v(x)";
        let batches = ctx.sql(sql).await?.collect().await?;
        let out = pretty_format_batches(&batches)?.to_string();
        let rows: Vec<&str> = out.lines().skip(3).filter(|l| l.starts_with("| ")).collect();
        let want = ["| 2  | 2  | 2  |", "| -2 | -2 | -2 |", "| 0  | 0  | 0  |", "| 0  | 0  | 0  |", "| 4  | 4  | 4  |"];
        assert_eq!(&rows[..5], &want, "{out}");
        Ok(())
    }

    #[tokio::test]
    async fn fractions_round_half_away_from_zero() -> Result<()> {
        let ctx = SessionContext::new();
        ctx.add_analyzer_rule(Arc::new(RoundingCasts));
        let sql = "SELECT CAST(9.99 AS INT) AS a, CAST(-9.5 AS INT) AS b, CAST(x AS BIGINT) AS c, \
                   TRY_CAST(CAST(-592.50 AS DECIMAL(10, 2)) AS INT) AS d, CAST(7 AS INT) AS e \
                   FROM (VALUES (15.6)) v(x)";
        let batches = ctx.sql(sql).await?.collect().await?;
        let out = pretty_format_batches(&batches)?.to_string();
        assert!(out.contains("| 10 | -10 | 16 | -593 | 7 |"), "{out}");
        Ok(())
    }
}
