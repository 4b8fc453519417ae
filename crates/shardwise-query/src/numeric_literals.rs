//! Numeric literals read as PostgreSQL and DuckDB read them: `12345678901234.5678` is an exact
//! DECIMAL, `1.5e3` a DOUBLE.
//!
//! DataFusion reads every literal with a fraction as a DOUBLE unless
//! `datafusion.sql_parser.parse_float_as_decimal` is set. For a DECIMAL column that is a wrong
//! answer without an error: `INSERT ... VALUES (12345678901234.5678)` stored `...5680`, and
//! `WHERE price = 395616.196` compared the column with the DOUBLE nearest that value, cast to a
//! DECIMAL(30, 15) (`395616.195999999983616`), and matched no row. shardwise turns the setting on
//! (in [`crate::QueryEngine`]). With it, DataFusion reads an exponent as a decimal scale too:
//! `1.5e3` became DECIMAL(2, -2), which no client protocol can carry, and `1e400` failed. So a
//! literal written with an exponent is read as a DOUBLE here, before planning, as DuckDB reads it.
//! Setting `parse_float_as_decimal` back to false reads every literal as DataFusion does.

use std::ops::ControlFlow;

use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{
    CastKind, DataType, ExactNumberInfo, Expr, Value, ValueWithSpan, VisitMut, VisitorMut,
};

/// Rewrites every numeric literal with an exponent in `statement` to a DOUBLE.
pub fn exponents_as_double(statement: &mut DfStatement) {
    match statement {
        DfStatement::Statement(statement) => {
            let _ = statement.visit(&mut ExponentsAsDouble);
        }
        DfStatement::Explain(explain) => exponents_as_double(&mut explain.statement),
        _ => {}
    }
}

struct ExponentsAsDouble;

impl VisitorMut for ExponentsAsDouble {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        if let Expr::Value(ValueWithSpan { value: Value::Number(text, _), span }) = expr
            && text.contains(['e', 'E'])
        {
            let text = Expr::Value(ValueWithSpan { value: Value::SingleQuotedString(text.clone()), span: *span });
            *expr = Expr::Cast {
                kind: CastKind::Cast,
                expr: Box::new(text),
                data_type: DataType::Double(ExactNumberInfo::None),
                array: false,
                format: None,
            };
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::util::pretty::pretty_format_batches;
    use datafusion::prelude::{SessionConfig, SessionContext};

    use super::*;

    async fn run(sql: &str) -> String {
        let mut config = SessionConfig::new();
        config.options_mut().sql_parser.parse_float_as_decimal = true;
        let ctx = SessionContext::new_with_config(config);
        let state = ctx.state();
        let dialect = state.config().options().sql_parser.dialect;
        let mut statement = state.sql_to_statement(sql, &dialect).expect("parse");
        exponents_as_double(&mut statement);
        let plan = state.statement_to_plan(statement).await.expect("plan");
        let batches = ctx.execute_logical_plan(plan).await.expect("run").collect().await.expect("rows");
        pretty_format_batches(&batches).expect("format").to_string()
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
