//! `date ± interval` is a TIMESTAMP, as in PostgreSQL and DuckDB: `DATE '2024-01-01' - INTERVAL
//! '1 hour'` is `2023-12-31 23:00:00`.
//!
//! Why: DataFusion adds an interval to a DATE as a DATE, dropping whatever part of the interval is
//! shorter than a day: that query answered `2024-01-01`, and `WHERE day + INTERVAL '12 hours' >
//! ts` compared the wrong instants (13 rows where PostgreSQL finds 24).
//!
//! How: [`DateIntervalsAsTimestamps`], an analyzer rule before type coercion, casts the DATE side
//! of a `+` or `-` whose other side is an INTERVAL to TIMESTAMP (midnight of that day). Intervals of
//! whole days or months give the same day as before, now as a timestamp at midnight (PostgreSQL's
//! type too); `date + integer` (days) and `date - date` stay as they were.

use datafusion::arrow::datatypes::{DataType, TimeUnit};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DFSchema, Result};
use datafusion::logical_expr::{BinaryExpr, Cast, Expr, ExprSchemable, LogicalPlan, Operator};
use datafusion::optimizer::AnalyzerRule;

/// The analyzer rule. See the module doc.
#[derive(Debug, Default)]
pub struct DateIntervalsAsTimestamps;

impl AnalyzerRule for DateIntervalsAsTimestamps {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        crate::expression_rules::rewrite_expressions(plan, as_timestamp)
    }

    fn name(&self) -> &str {
        "shardwise_date_intervals_as_timestamps"
    }
}

fn is_date(t: &DataType) -> bool {
    matches!(t, DataType::Date32 | DataType::Date64)
}

fn as_timestamp(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    let Expr::BinaryExpr(BinaryExpr { left, op: op @ (Operator::Plus | Operator::Minus), right }) = e else {
        return Ok(Transformed::no(e));
    };
    let (Ok(l), Ok(r)) = (left.get_type(schema), right.get_type(schema)) else {
        return Ok(Transformed::no(Expr::BinaryExpr(BinaryExpr { left, op, right })));
    };
    let timestamp = |e: Box<Expr>| Box::new(Expr::Cast(Cast::new(e, DataType::Timestamp(TimeUnit::Nanosecond, None))));
    let rewritten = match (&l, &r) {
        (date, DataType::Interval(_)) if is_date(date) => BinaryExpr { left: timestamp(left), op, right },
        (DataType::Interval(_), date) if is_date(date) && op == Operator::Plus => {
            BinaryExpr { left, op, right: timestamp(right) }
        }
        _ => return Ok(Transformed::no(Expr::BinaryExpr(BinaryExpr { left, op, right }))),
    };
    Ok(Transformed::yes(Expr::BinaryExpr(rewritten)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::util::pretty::pretty_format_batches;
    use std::sync::Arc;

    #[tokio::test]
    async fn a_date_and_an_interval_make_a_timestamp() -> Result<()> {
        // Before DataFusion's coercion, as in the engine (which casts `date + 2` to an interval).
        let ctx = crate::expression_rules::context_with_rule_first(Arc::new(DateIntervalsAsTimestamps));
        let batches = ctx
            .sql(
                "SELECT DATE '2024-01-01' - INTERVAL '1 hour' AS a, DATE '2024-01-31' + INTERVAL '36 hours' AS b, \
                 INTERVAL '90 minutes' + DATE '2024-01-01' AS c, DATE '2024-01-31' + INTERVAL '1 month' AS d, \
                 DATE '2024-01-01' + INTERVAL '1 hour' = TIMESTAMP '2024-01-01 01:00:00' AS e, \
                 DATE '2024-01-01' + 2 AS f",
            )
            .await?
            .collect()
            .await?;
        let text = pretty_format_batches(&batches)?.to_string();
        for expected in [
            "2023-12-31T23:00:00",
            "2024-02-01T12:00:00",
            "2024-01-01T01:30:00",
            "2024-02-29T00:00:00",
            "| true",
            "2024-01-03",
        ] {
            assert!(text.contains(expected), "{expected} in {text}");
        }
        Ok(())
    }
}
