//! `extract(second FROM ts)` and `date_part('second', ts)` keep the fraction of the second, as in
//! PostgreSQL: `extract(second FROM TIMESTAMP '2024-01-01 10:00:07.25')` is 7.25.
//!
//! Why: DataFusion's `date_part('second', ...)` is the whole seconds only (7), so a time's seconds
//! lost their fraction without a word.
//!
//! How: [`FractionalSeconds`], an analyzer rule, writes `date_part('second', x)` of a timestamp or
//! a time as `CAST(date_part('microsecond', x) AS DOUBLE) / 1e6` (DataFusion's microseconds are
//! those of the minute, seconds included). The item keeps its name; the value is a DOUBLE
//! (PostgreSQL's is a NUMERIC with six fractional digits). Intervals keep DataFusion's reading.

use datafusion::arrow::datatypes::DataType;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DFSchema, Result, ScalarValue};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{BinaryExpr, Cast, Expr, ExprSchemable, LogicalPlan, Operator};
use datafusion::optimizer::AnalyzerRule;

/// The analyzer rule. See the module doc.
#[derive(Debug, Default)]
pub struct FractionalSeconds;

impl AnalyzerRule for FractionalSeconds {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        crate::expression_rules::rewrite_expressions(plan, with_fraction)
    }

    fn name(&self) -> &str {
        "shardwise_fractional_seconds"
    }
}

fn with_fraction(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    let Expr::ScalarFunction(ScalarFunction { func, args }) = &e else { return Ok(Transformed::no(e)) };
    if !func.name().eq_ignore_ascii_case("date_part") {
        return Ok(Transformed::no(e));
    }
    let [Expr::Literal(ScalarValue::Utf8(Some(part)), _), value] = args.as_slice() else {
        return Ok(Transformed::no(e));
    };
    let is_second = matches!(part.to_ascii_lowercase().as_str(), "second" | "seconds" | "s" | "sec" | "secs");
    let is_time = value
        .get_type(schema)
        .is_ok_and(|t| matches!(t, DataType::Timestamp(..) | DataType::Time32(_) | DataType::Time64(_)));
    if !is_second || !is_time {
        return Ok(Transformed::no(e));
    }
    let micros = Expr::ScalarFunction(ScalarFunction::new_udf(
        std::sync::Arc::clone(func),
        vec![Expr::Literal(ScalarValue::Utf8(Some("microsecond".to_string())), None), value.clone()],
    ));
    let seconds = Expr::BinaryExpr(BinaryExpr {
        left: Box::new(Expr::Cast(Cast::new(Box::new(micros), DataType::Float64))),
        op: Operator::Divide,
        right: Box::new(Expr::Literal(ScalarValue::Float64(Some(1e6)), None)),
    });
    Ok(Transformed::yes(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::Float64Type;
    use std::sync::Arc;

    #[tokio::test]
    async fn seconds_keep_their_fraction() -> Result<()> {
        let ctx = crate::expression_rules::context_with_rule_first(Arc::new(FractionalSeconds));
        let batches = ctx
            .sql(
                "SELECT extract(second FROM TIMESTAMP '2024-01-01 10:00:07.25') AS a, \
                 date_part('second', TIMESTAMP '1999-12-31 23:59:59.5') AS b, \
                 extract(minute FROM TIMESTAMP '2024-01-01 10:17:07.25') AS c",
            )
            .await?
            .collect()
            .await?;
        let batch = &batches[0];
        assert_eq!(batch.column(0).as_primitive::<Float64Type>().value(0), 7.25);
        assert_eq!(batch.column(1).as_primitive::<Float64Type>().value(0), 59.5);
        assert_eq!(batch.schema().field(0).name(), "a");
        assert_eq!(batch.column(2).data_type(), &DataType::Int32);
        Ok(())
    }
}
