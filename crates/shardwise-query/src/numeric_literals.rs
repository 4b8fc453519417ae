//! Numeric literals compared with, or stored into, DECIMAL values as they were written.
//!
//! DataFusion reads `395616.196` as a DOUBLE, and meets a DECIMAL by casting both sides to a
//! DECIMAL: the literal became the DOUBLE nearest it, `395616.195999999983616`, so `WHERE price =
//! 395616.196` matched no row, and `INSERT ... VALUES (12345678901234.5678)` stored `...5680`.
//! Reading every literal as a DECIMAL (`datafusion.sql_parser.parse_float_as_decimal`) is worse
//! for the common case: DataFusion then casts a DOUBLE column compared with `0.5` to
//! DECIMAL(30, 15), which loses values under 1e-15 and fails on values over 1e15, and `1.0 / 3`
//! keeps five digits. So shardwise keeps DataFusion's DOUBLE literals and corrects the two places
//! they go wrong:
//! - [`ExactDecimalLiterals`], an analyzer rule after type coercion: a DOUBLE literal cast to a
//!   DECIMAL (what coercion makes of a literal compared with, or combined with, a DECIMAL) becomes
//!   the decimal of its shortest text, which is the text written for any literal of up to 15
//!   significant digits: `CAST(395616.196 AS DECIMAL(30, 15))` is `395616.196000000000000`.
//! - `INSERT ... VALUES` is planned with `parse_float_as_decimal`, so a value of any length goes
//!   into a DECIMAL column exactly; each value is cast to its column's type on its own, so a
//!   DOUBLE column still gets a DOUBLE ([`is_insert_values`]). Only a value that is a literal
//!   (signed, in parentheses or cast) is read so: a literal inside arithmetic or a function call
//!   stays a DOUBLE ([`values_operands_as_double`]), so `VALUES (1.0 / 3)` computes what `SELECT
//!   1.0 / 3` does, not a decimal division that keeps five digits.
//!
//! With `parse_float_as_decimal` on (by `SET`, or for `INSERT ... VALUES`), a literal written
//! with an exponent (`1.5e3`) is read as a DOUBLE, as DuckDB reads it, before planning
//! ([`exponents_as_double`]); DataFusion would make it a DECIMAL of negative scale, which no
//! client protocol carries, and fail on `1e400`.

use std::ops::ControlFlow;

use datafusion::arrow::datatypes::DataType as ArrowType;
use datafusion::common::ScalarValue;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::Transformed;
use datafusion::error::Result;
use datafusion::logical_expr::expr::Cast;
use datafusion::logical_expr::{Expr as LogicalExpr, LogicalPlan};
use datafusion::optimizer::AnalyzerRule;
use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{
    CastKind, DataType, ExactNumberInfo, Expr, SetExpr, Statement, UnaryOperator, Value, ValueWithSpan, VisitMut,
    VisitorMut,
};

/// Whether `statement` is an `INSERT` of a `VALUES` list (planned with decimal literals).
pub fn is_insert_values(statement: &DfStatement) -> bool {
    let DfStatement::Statement(statement) = statement else { return false };
    let Statement::Insert(insert) = statement.as_ref() else { return false };
    insert.source.as_ref().is_some_and(|query| matches!(query.body.as_ref(), SetExpr::Values(_)))
}

/// In an `INSERT ... VALUES` planned with decimal literals, makes each literal with a point that
/// is an operand (of arithmetic, a function, a comparison) a DOUBLE, as it is in a query; a value
/// that is itself a literal (`-1.5`, `(2.5)`, `CAST(0.1 AS DECIMAL(3, 2))`) stays a DECIMAL.
pub fn values_operands_as_double(statement: &mut DfStatement) {
    let DfStatement::Statement(statement) = statement else { return };
    let Statement::Insert(insert) = statement.as_mut() else { return };
    let Some(query) = insert.source.as_mut() else { return };
    let SetExpr::Values(values) = query.body.as_mut() else { return };
    for value in values.rows.iter_mut().flat_map(|row| row.content.iter_mut()) {
        operands_as_double(value);
    }
}

/// Looks through the wrappers that keep a value a literal; anything else has operands.
fn operands_as_double(value: &mut Expr) {
    match value {
        Expr::Value(_) => {}
        Expr::Nested(inner) | Expr::Cast { expr: inner, .. } => operands_as_double(inner),
        Expr::UnaryOp { op: UnaryOperator::Minus | UnaryOperator::Plus, expr: inner } => operands_as_double(inner),
        other => {
            let _ = other.visit(&mut PointLiteralsAsDouble);
        }
    }
}

/// Rewrites each literal with a decimal point to a DOUBLE.
struct PointLiteralsAsDouble;

impl VisitorMut for PointLiteralsAsDouble {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        if let Expr::Value(ValueWithSpan { value: Value::Number(text, _), .. }) = expr
            && text.contains('.')
        {
            *expr = as_double(expr.clone());
        }
        ControlFlow::Continue(())
    }
}

/// `CAST('text' AS DOUBLE)` of a numeric literal (its text read as a DOUBLE, as DataFusion reads
/// a literal when decimal literals are off).
fn as_double(literal: Expr) -> Expr {
    let text = match literal {
        Expr::Value(ValueWithSpan { value: Value::Number(text, _), span }) => {
            Expr::Value(ValueWithSpan { value: Value::SingleQuotedString(text), span })
        }
        other => other,
    };
    Expr::Cast {
        kind: CastKind::Cast,
        expr: Box::new(text),
        data_type: DataType::Double(ExactNumberInfo::None),
        array: false,
        format: None,
    }
}

/// The analyzer rule: a DOUBLE literal cast to a DECIMAL is the decimal of its shortest text.
#[derive(Debug, Default)]
pub struct ExactDecimalLiterals;

impl AnalyzerRule for ExactDecimalLiterals {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        // A projection's columns keep the names the cast gave them.
        crate::expression_rules::rewrite_expressions(plan, |e, _| exact_cast(e))
    }

    fn name(&self) -> &str {
        "shardwise_exact_decimal_literals"
    }
}

fn exact_cast(e: LogicalExpr) -> Result<Transformed<LogicalExpr>> {
    if let LogicalExpr::Cast(Cast { expr, field }) = &e
        && let LogicalExpr::Literal(ScalarValue::Float64(Some(value)), _) = expr.as_ref()
        && let ArrowType::Decimal128(precision, scale) = field.data_type()
        && let Some(exact) = decimal_of_text(&value.to_string(), *precision, *scale)
    {
        return Ok(Transformed::yes(LogicalExpr::Literal(
            ScalarValue::Decimal128(Some(exact), *precision, *scale),
            None,
        )));
    }
    Ok(Transformed::no(e))
}

/// `text` (digits, an optional sign and point, no exponent: what `f64`'s `Display` writes) as
/// a DECIMAL(`precision`, `scale`), rounded half away from zero to the scale; `None` when it
/// does not fit, which leaves the cast to fail or round as DataFusion's does.
fn decimal_of_text(text: &str, precision: u8, scale: i8) -> Option<i128> {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    let scale = usize::try_from(scale).ok()?;
    if !whole.bytes().chain(fraction.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let kept: String = fraction.chars().chain(std::iter::repeat('0')).take(scale).collect();
    let round_up = fraction.as_bytes().get(scale).is_some_and(|&d| d >= b'5');
    let mut unscaled: i128 = format!("{whole}{kept}").parse().ok()?;
    unscaled = unscaled.checked_add(i128::from(round_up))?;
    let limit = 10i128.checked_pow(u32::from(precision))?;
    (unscaled < limit).then_some(if negative { -unscaled } else { unscaled })
}

/// Rewrites every numeric literal with an exponent in `statement` to a DOUBLE.
pub fn exponents_as_double(statement: &mut DfStatement) {
    crate::repeated_items::visit_statement_mut(statement, &mut ExponentsAsDouble);
}

struct ExponentsAsDouble;

impl VisitorMut for ExponentsAsDouble {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        if let Expr::Value(ValueWithSpan { value: Value::Number(text, _), .. }) = expr
            && text.contains(['e', 'E'])
        {
            *expr = as_double(expr.clone());
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::util::pretty::pretty_format_batches;
    use datafusion::execution::SessionStateBuilder;
    use datafusion::prelude::{SessionConfig, SessionContext};

    use super::*;

    #[test]
    fn shortest_text_becomes_the_decimal() {
        assert_eq!(decimal_of_text("395616.196", 30, 15), Some(395_616_196_000_000_000_000));
        assert_eq!(decimal_of_text("-0.0005", 12, 3), Some(-1));
        assert_eq!(decimal_of_text("0.0004", 12, 3), Some(0));
        assert_eq!(decimal_of_text("12", 5, 2), Some(1200));
        assert_eq!(decimal_of_text("1000", 5, 2), None);
        assert_eq!(decimal_of_text("NaN", 5, 2), None);
        assert_eq!(decimal_of_text("inf", 5, 2), None);
    }

    /// DataFusion as a node plans: DOUBLE literals, the rule after type coercion.
    async fn node_like(sql: &str) -> String {
        let state = SessionStateBuilder::new()
            .with_config(SessionConfig::new())
            .with_default_features()
            .with_analyzer_rule(Arc::new(ExactDecimalLiterals))
            .build();
        let ctx = SessionContext::new_with_state(state);
        ctx.sql("CREATE TABLE m (w DECIMAL(12, 3), d DOUBLE) AS VALUES (395616.196, 1e-20), (1.5, 1e20)")
            .await
            .expect("table")
            .collect()
            .await
            .expect("rows");
        run_in(&ctx, sql).await
    }

    #[tokio::test]
    async fn a_decimal_compared_with_a_literal_matches_it_as_written() {
        let text = node_like("SELECT count(*) AS n FROM m WHERE w = 395616.196 OR w IN (1.5, 2.5)").await;
        assert!(text.contains("| 2 |"), "{text}");
        // DOUBLE columns keep DOUBLE comparisons: nothing is cast to a decimal.
        let text = node_like("SELECT count(*) AS n FROM m WHERE d > 0.0 AND d > 0.5e-30").await;
        assert!(text.contains("| 2 |"), "{text}");
        // An unaliased cast keeps its column name.
        let text = node_like("SELECT CAST(2.675 AS DECIMAL(10, 2))").await;
        assert!(text.contains("| 2.68 "), "{text}");
    }

    /// `sql` run in `ctx` as a node runs it: exponents made DOUBLEs where literals are decimals.
    async fn run_in(ctx: &SessionContext, sql: &str) -> String {
        let state = ctx.state();
        let dialect = state.config().options().sql_parser.dialect;
        let mut statement = state.sql_to_statement(sql, &dialect).expect("parse");
        if state.config().options().sql_parser.parse_float_as_decimal {
            exponents_as_double(&mut statement);
        }
        let plan = state.statement_to_plan(statement).await.expect("plan");
        let batches = ctx.execute_logical_plan(plan).await.expect("run").collect().await.expect("rows");
        pretty_format_batches(&batches).expect("format").to_string()
    }

    /// `sql` with every literal a DECIMAL (`parse_float_as_decimal`).
    async fn run(sql: &str) -> String {
        let mut config = SessionConfig::new();
        config.options_mut().sql_parser.parse_float_as_decimal = true;
        run_in(&SessionContext::new_with_config(config), sql).await
    }

    #[tokio::test]
    async fn fractions_are_exact_and_exponents_are_doubles() {
        let text =
            run("SELECT arrow_typeof(12345678901234.5678) AS d, CAST(12345678901234.5678 AS DECIMAL(38, 4)) AS v, \
             arrow_typeof(1.5e3) AS e, 1.5e3 AS x, 1E400 > 0 AS huge, -2.5E-1 AS neg")
            .await;
        assert!(text.contains("| Decimal128(18, 4) | 12345678901234.5678 | Float64 | 1500.0 |"), "{text}");
        assert!(text.contains("| true | -0.25 |"), "{text}");
    }

    #[tokio::test]
    async fn a_literal_inside_a_subquery_or_explain_is_rewritten_too() {
        let text = run("SELECT (SELECT arrow_typeof(2e0)) AS t").await;
        assert!(text.contains("Float64"), "{text}");
        let text = run("EXPLAIN SELECT 2e0 + 1 AS t").await;
        assert!(text.contains("Float64"), "{text}");
    }
}
