//! Intervals compare and sort by their length, as in PostgreSQL: `INTERVAL '25 hours' > INTERVAL
//! '1 day'` is true, `INTERVAL '24 hours' = INTERVAL '1 day'`, and `now() - ts > INTERVAL '1 day'`
//! keeps the rows older than a day.
//!
//! Why: Arrow compares an interval as its three parts in turn (months, then days, then
//! nanoseconds), so any interval with a day in it was longer than any number of hours, and the
//! difference of two timestamps (nanoseconds only) was shorter than `INTERVAL '1 day'` however
//! large it was: the everyday "older than N days" filter found no rows, without an error.
//!
//! How: [`IntervalOrder`], an analyzer rule after type coercion, compares (`=`, `<>`, `<`, `<=`,
//! `>`, `>=`, `IS [NOT] DISTINCT FROM`, `BETWEEN`) and sorts (`ORDER BY`) intervals and durations
//! by `shardwise_interval_order(x)` ([`order_key`]), PostgreSQL's comparison key: a month is 30
//! days and a day 24 hours, in nanoseconds, exact in 128 bits. `min`, `max` and `DISTINCT` of
//! intervals keep Arrow's order (left as they are).

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, Decimal128Array};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, IntervalMonthDayNanoType, IntervalUnit};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DFSchema, Result, exec_err};
use datafusion::logical_expr::expr::{ScalarFunction, Sort};
use datafusion::logical_expr::{
    Between, BinaryExpr, ColumnarValue, Expr, ExprSchemable, LogicalPlan, Operator, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature, Volatility,
};
use datafusion::optimizer::AnalyzerRule;

/// The SQL name of the key function.
const FUNCTION_NAME: &str = "shardwise_interval_order";

/// Nanoseconds in a day, and days in a month, as PostgreSQL compares intervals.
const NANOS_PER_DAY: i128 = 86_400_000_000_000;
const DAYS_PER_MONTH: i128 = 30;

/// The analyzer rule. See the module doc.
#[derive(Debug, Default)]
pub struct IntervalOrder;

impl AnalyzerRule for IntervalOrder {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        let plan = crate::expression_rules::rewrite_expressions(plan, by_length)?;
        // ORDER BY: the sort expressions of each Sort node (a Sort has no names to keep).
        plan.transform_up_with_subqueries(|node| {
            let LogicalPlan::Sort(mut sort) = node else { return Ok(Transformed::no(node)) };
            let schema = Arc::clone(sort.input.schema());
            let mut changed = false;
            for Sort { expr, .. } in sort.expr.iter_mut() {
                if is_interval(expr, &schema) {
                    *expr = key(expr.clone());
                    changed = true;
                }
            }
            let node = LogicalPlan::Sort(sort);
            Ok(if changed { Transformed::yes(node) } else { Transformed::no(node) })
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "shardwise_interval_order"
    }
}

fn is_interval_type(t: &DataType) -> bool {
    matches!(t, DataType::Interval(_) | DataType::Duration(_))
}

fn is_interval(e: &Expr, schema: &DFSchema) -> bool {
    e.get_type(schema).is_ok_and(|t| is_interval_type(&t))
}

fn key(e: Expr) -> Expr {
    Expr::ScalarFunction(ScalarFunction::new_udf(interval_order_udf(), vec![e]))
}

fn by_length(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    match e {
        Expr::BinaryExpr(BinaryExpr { left, op, right })
            if matches!(
                op,
                Operator::Eq
                    | Operator::NotEq
                    | Operator::Lt
                    | Operator::LtEq
                    | Operator::Gt
                    | Operator::GtEq
                    | Operator::IsDistinctFrom
                    | Operator::IsNotDistinctFrom
            ) && is_interval(&left, schema)
                && is_interval(&right, schema) =>
        {
            Ok(Transformed::yes(Expr::BinaryExpr(BinaryExpr {
                left: Box::new(key(*left)),
                op,
                right: Box::new(key(*right)),
            })))
        }
        Expr::Between(Between { expr, negated, low, high })
            if is_interval(&expr, schema) && is_interval(&low, schema) && is_interval(&high, schema) =>
        {
            Ok(Transformed::yes(Expr::Between(Between {
                expr: Box::new(key(*expr)),
                negated,
                low: Box::new(key(*low)),
                high: Box::new(key(*high)),
            })))
        }
        other => Ok(Transformed::no(other)),
    }
}

/// `shardwise_interval_order`, to register with a session.
pub fn interval_order_udf() -> Arc<ScalarUDF> {
    Arc::new(ScalarUDF::new_from_impl(OrderKey { signature: Signature::any(1, Volatility::Immutable) }))
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct OrderKey {
    signature: Signature,
}

impl ScalarUDFImpl for OrderKey {
    fn name(&self) -> &str {
        FUNCTION_NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Decimal128(38, 0))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let [value] = args.args.as_slice() else { return exec_err!("{FUNCTION_NAME} takes one interval") };
        let is_scalar = matches!(value, ColumnarValue::Scalar(_));
        let array = value.to_array(args.number_rows)?;
        if !is_interval_type(array.data_type()) {
            return exec_err!("{FUNCTION_NAME} takes an interval, not {}", array.data_type());
        }
        let intervals = cast(&array, &DataType::Interval(IntervalUnit::MonthDayNano))?;
        let intervals = intervals.as_primitive::<IntervalMonthDayNanoType>();
        let keys: Decimal128Array = intervals.iter().map(|v| v.map(order_key)).collect();
        let keys = keys.with_precision_and_scale(38, 0)?;
        crate::udf_wrapper::answer_shaped(Arc::new(keys), is_scalar)
    }
}

/// PostgreSQL's comparison key of an interval: its length in nanoseconds, a month taken as 30
/// days and a day as 24 hours.
pub fn order_key(v: datafusion::arrow::datatypes::IntervalMonthDayNano) -> i128 {
    (i128::from(v.months) * DAYS_PER_MONTH + i128::from(v.days)) * NANOS_PER_DAY + i128::from(v.nanoseconds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::BooleanArray;

    #[tokio::test]
    async fn intervals_compare_and_sort_by_length() -> Result<()> {
        let ctx = datafusion::prelude::SessionContext::new();
        ctx.add_analyzer_rule(Arc::new(IntervalOrder));
        let batches = ctx
            .sql(
                "SELECT INTERVAL '25 hours' > INTERVAL '1 day', INTERVAL '24 hours' = INTERVAL '1 day', \
                 INTERVAL '40 days' > INTERVAL '1 month', \
                 TIMESTAMP '2024-01-03 00:00:00' - TIMESTAMP '2024-01-01 00:00:00' > INTERVAL '1 day', \
                 TIMESTAMP '2024-01-03 00:00:00' - TIMESTAMP '2024-01-01 00:00:00' < INTERVAL '1 day', \
                 TIMESTAMP '2024-01-03 00:00:00' - TIMESTAMP '2024-01-01 00:00:00' BETWEEN INTERVAL '1 day' AND INTERVAL '3 days'",
            )
            .await?
            .collect()
            .await?;
        let batch = &batches[0];
        let values: Vec<Option<bool>> = (0..batch.num_columns())
            .map(|i| batch.column(i).as_any().downcast_ref::<BooleanArray>().map(|a| a.value(0)))
            .collect();
        assert_eq!(values, [Some(true), Some(true), Some(true), Some(true), Some(false), Some(true)]);
        // ORDER BY: 2 hours, 1 day, 25 hours, 31 days, 1 month... by length.
        let batches = ctx
            .sql(
                "SELECT CAST(i AS VARCHAR) AS t FROM (VALUES (INTERVAL '25 hours'), (INTERVAL '1 day'), (INTERVAL '2 hours')) v(i) \
                 ORDER BY i DESC",
            )
            .await?
            .collect()
            .await?;
        let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches)?.to_string();
        let (first, last) = (text.find("25 hours").unwrap_or(usize::MAX), text.find("2 hours").unwrap_or(0));
        assert!(first < text.find("1 days").unwrap_or(0) && text.find("1 days").unwrap_or(usize::MAX) < last, "{text}");
        Ok(())
    }
}
