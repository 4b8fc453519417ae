//! A timestamp or a float as text reads as PostgreSQL writes it: `CAST(ts AS VARCHAR)`, `'at ' ||
//! ts` and `x::text` give `2024-01-01 10:00:00.5` and `1`, `1e+20`, `Infinity`.
//!
//! Why: DataFusion writes them as Arrow displays values, `2024-01-01T10:00:00.500` and `1.0`,
//! `1e20`, `inf`, so text built from them differed from PostgreSQL's, and a join or comparison of
//! `float_column::varchar` with a text column found no rows.
//!
//! How: [`PostgresText`], an analyzer rule after type coercion (which writes the casts of `||`),
//! replaces a cast of a TIMESTAMP or a float to a string, and such an argument of `concat` /
//! `concat_ws` (a boolean one there as `t` / `f`), with `shardwise_text(x)` ([`text_of`]),
//! PostgreSQL's output: a timestamp's fraction without trailing zeros (none when it is whole), a
//! time zone's timestamp in UTC with `+00`; a float's shortest digits that read back as the same
//! value, in exponent form below 1e-4 and from 1e15 (1e6 for a REAL). The item keeps its name.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, AsArray, StringArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Float32Type, Float64Type, TimeUnit, TimestampNanosecondType};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DFSchema, Result, exec_err};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{
    Cast, ColumnarValue, Expr, ExprSchemable, LogicalPlan, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility, lit,
};
use datafusion::optimizer::AnalyzerRule;

/// The SQL name of the formatting function.
const FUNCTION_NAME: &str = "shardwise_text";

/// The analyzer rule. See the module doc.
#[derive(Debug, Default)]
pub struct PostgresText;

impl AnalyzerRule for PostgresText {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        crate::expression_rules::rewrite_expressions(plan, as_postgres_text)
    }

    fn name(&self) -> &str {
        "shardwise_postgres_text"
    }
}

fn is_string(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8)
}

fn has_postgres_text(t: &DataType) -> bool {
    matches!(t, DataType::Timestamp(..) | DataType::Float32 | DataType::Float64)
}

fn as_postgres_text(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    if let Expr::ScalarFunction(ScalarFunction { func, .. }) = &e
        && ["concat", "concat_ws"].contains(&func.name())
    {
        return concat_arguments(e.clone(), schema);
    }
    let Expr::Cast(Cast { expr, field }) = e else { return Ok(Transformed::no(e)) };
    let target = field.data_type().clone();
    if !is_string(&target) || !expr.get_type(schema).is_ok_and(|t| has_postgres_text(&t)) {
        return Ok(Transformed::no(Expr::Cast(Cast { expr, field })));
    }
    let text = Expr::ScalarFunction(ScalarFunction::new_udf(postgres_text_udf(), vec![*expr]));
    Ok(Transformed::yes(if target == DataType::Utf8 { text } else { Expr::Cast(Cast::new(Box::new(text), target)) }))
}

/// `concat(...)` / `concat_ws(...)` with each boolean argument as `t` / `f` (PostgreSQL's output of
/// a boolean, which `concat` writes; a `||` casts to text: `true`). Timestamps and floats are
/// already cast to text there (by the coercion), and those casts are rewritten on their own.
fn concat_arguments(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    let Expr::ScalarFunction(ScalarFunction { func, args }) = e else { return Ok(Transformed::no(e)) };
    let is_boolean = |x: &Expr| x.get_type(schema).is_ok_and(|t| t == DataType::Boolean);
    let mut changed = false;
    let args = args
        .into_iter()
        .map(|arg| {
            // The coercion's cast to text, or the boolean itself.
            let boolean = match &arg {
                Expr::Cast(Cast { expr, .. }) if is_boolean(expr) => Some(expr.as_ref().clone()),
                other if is_boolean(other) => Some(other.clone()),
                _ => None,
            };
            let Some(boolean) = boolean else { return arg };
            changed = true;
            Expr::Case(datafusion::logical_expr::expr::Case {
                expr: Some(Box::new(boolean)),
                when_then_expr: vec![
                    (Box::new(lit(true)), Box::new(lit("t"))),
                    (Box::new(lit(false)), Box::new(lit("f"))),
                ],
                else_expr: None,
            })
        })
        .collect();
    let call = Expr::ScalarFunction(ScalarFunction { func, args });
    Ok(if changed { Transformed::yes(call) } else { Transformed::no(call) })
}

/// `shardwise_text`, to register with a session.
pub fn postgres_text_udf() -> Arc<ScalarUDF> {
    Arc::new(ScalarUDF::new_from_impl(TextOf { signature: Signature::any(1, Volatility::Immutable) }))
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct TextOf {
    signature: Signature,
}

impl ScalarUDFImpl for TextOf {
    fn name(&self) -> &str {
        FUNCTION_NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let [value] = args.args.as_slice() else { return exec_err!("{FUNCTION_NAME} takes one argument") };
        let is_scalar = matches!(value, ColumnarValue::Scalar(_));
        let array = value.to_array(args.number_rows)?;
        let text: ArrayRef = Arc::new(text_of(&array)?);
        crate::udf_wrapper::answer_shaped(text, is_scalar)
    }
}

/// Each value of `array` (a timestamp or a float) as PostgreSQL writes it.
pub fn text_of(array: &ArrayRef) -> Result<StringArray> {
    Ok(match array.data_type() {
        DataType::Float64 => array.as_primitive::<Float64Type>().iter().map(|v| v.map(float8_text)).collect(),
        DataType::Float32 => array.as_primitive::<Float32Type>().iter().map(|v| v.map(float4_text)).collect(),
        DataType::Timestamp(_, zone) => {
            let nanos = cast(array, &DataType::Timestamp(TimeUnit::Nanosecond, None))?;
            let suffix = if zone.is_some() { "+00" } else { "" };
            nanos
                .as_primitive::<TimestampNanosecondType>()
                .iter()
                .map(|v| v.map(|ns| format!("{}{suffix}", timestamp_text(ns))))
                .collect()
        }
        other => return exec_err!("{FUNCTION_NAME}: no PostgreSQL text for {other}"),
    })
}

/// Nanoseconds since 1970 as `YYYY-MM-DD HH:MM:SS[.fraction]`, the fraction without trailing zeros.
fn timestamp_text(ns: i64) -> String {
    // Whole seconds and the nanoseconds after them, without `ns - fraction`, which passes
    // i64::MIN in the first second of the range (1677-09-21 00:12:43.145224192 and after).
    let (seconds, fraction) = (ns.div_euclid(1_000_000_000), ns.rem_euclid(1_000_000_000));
    let Some(moment) = chrono::DateTime::from_timestamp(seconds, 0).map(|m| m.naive_utc()) else {
        return ns.to_string();
    };
    let mut text = moment.format("%Y-%m-%d %H:%M:%S").to_string();
    if fraction > 0 {
        let digits = format!("{fraction:09}");
        text.push('.');
        text.push_str(digits.trim_end_matches('0'));
    }
    text
}

/// A DOUBLE as PostgreSQL's `float8out`: the shortest digits that read back as `v`, in exponent
/// form when the decimal exponent is below -4 or at least 15.
pub fn float8_text(v: f64) -> String {
    float_text(v, 15, format!("{v:e}"), || format!("{v}"))
}

/// A REAL as PostgreSQL's `float4out` (exponent form from 1e6).
pub fn float4_text(v: f32) -> String {
    float_text(f64::from(v), 6, format!("{v:e}"), || format!("{v}"))
}

fn float_text(v: f64, max_exponent: i32, scientific: String, fixed: impl Fn() -> String) -> String {
    if v.is_nan() {
        return "NaN".to_string();
    }
    if v.is_infinite() {
        return if v > 0.0 { "Infinity" } else { "-Infinity" }.to_string();
    }
    let Some((mantissa, exponent)) = scientific.split_once('e') else { return fixed() };
    let Ok(exponent) = exponent.parse::<i32>() else { return fixed() };
    if v == 0.0 || (-4..max_exponent).contains(&exponent) {
        return fixed();
    }
    let sign = if exponent < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exponent.abs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_as_postgres_writes_them() {
        let cases = [
            (1.0, "1"),
            (-20.0, "-20"),
            (1.5, "1.5"),
            (1e20, "1e+20"),
            (1e15, "1e+15"),
            (1e14, "100000000000000"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (0.1 + 0.2, "0.30000000000000004"),
            (-0.0, "-0"),
            (f64::INFINITY, "Infinity"),
            (f64::NAN, "NaN"),
        ];
        for (value, text) in cases {
            assert_eq!(float8_text(value), text, "{value}");
        }
        assert_eq!(float4_text(1e6), "1e+06");
        assert_eq!(float4_text(123456.0), "123456");
        assert_eq!(float4_text(0.1), "0.1");
    }

    #[test]
    fn timestamps_as_postgres_writes_them() {
        assert_eq!(timestamp_text(1_704_103_200_500_000_000), "2024-01-01 10:00:00.5");
        assert_eq!(timestamp_text(1_704_103_200_000_000_000), "2024-01-01 10:00:00");
        assert_eq!(timestamp_text(-1), "1969-12-31 23:59:59.999999999");
        // The first second of the range (whole seconds below i64::MIN nanoseconds).
        assert_eq!(timestamp_text(i64::MIN), "1677-09-21 00:12:43.145224192");
        assert_eq!(timestamp_text(i64::MAX), "2262-04-11 23:47:16.854775807");
    }

    #[tokio::test]
    async fn casts_and_concatenations_in_sql() -> Result<()> {
        let ctx = datafusion::prelude::SessionContext::new();
        ctx.add_analyzer_rule(Arc::new(PostgresText));
        let batches = ctx
            .sql(
                "SELECT CAST(TIMESTAMP '2024-01-01 10:00:00.5' AS VARCHAR) AS a, 'at ' || TIMESTAMP '2024-01-01 10:00:00' AS b, \
                 CAST(CAST(1.0 AS DOUBLE) AS VARCHAR) AS c, 'x' || CAST(1e20 AS DOUBLE) AS d, \
                 concat(CAST(1.5 AS DOUBLE), false, NULL) AS e, concat_ws('-', 'a', true) AS f",
            )
            .await?
            .collect()
            .await?;
        let batch = &batches[0];
        let text = |i: usize| {
            let column = cast(batch.column(i), &DataType::Utf8).expect("text");
            column.as_string::<i32>().value(0).to_string()
        };
        assert_eq!(text(0), "2024-01-01 10:00:00.5");
        assert_eq!(text(1), "at 2024-01-01 10:00:00");
        assert_eq!(text(2), "1");
        assert_eq!(text(3), "x1e+20");
        assert_eq!(text(4), "1.5f");
        assert_eq!(text(5), "a-t");
        Ok(())
    }
}
