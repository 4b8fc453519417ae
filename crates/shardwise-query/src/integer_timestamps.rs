//! A whole number becoming a timestamp is seconds since 1970, wherever the cast comes from.
//!
//! DataFusion's SQL planner reads `CAST(1700000000 AS TIMESTAMP)` as seconds (it casts to
//! `Timestamp(s)` first), but a cast it adds itself, such as the one that makes an `INSERT`'s
//! value the column's type (`INSERT INTO t (ts) VALUES (1700000000)`), is Arrow's cast, which
//! reads the number in the target's unit: nanoseconds for `TIMESTAMP`, so the row stored
//! `1970-01-01 00:00:01.7`. [`IntegersAsSeconds`], an analyzer rule, gives every cast from an
//! integer to a timestamp of another unit the planner's step through seconds, so the two agree
//! (and `shardwise load` reads numbers for timestamp columns the same way).

use datafusion::arrow::datatypes::{DataType, Field, TimeUnit};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result;
use datafusion::logical_expr::expr::Cast;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{Expr, ExprSchemable, LogicalPlan};
use datafusion::optimizer::AnalyzerRule;
use std::sync::Arc;

/// The analyzer rule (see the module doc).
#[derive(Debug, Default)]
pub struct IntegersAsSeconds;

impl AnalyzerRule for IntegersAsSeconds {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        plan.transform_up_with_subqueries(|node| {
            let schema = node.inputs().first().map(|input| Arc::clone(input.schema()));
            let names = NamePreserver::new(&node);
            node.map_expressions(|e| {
                let name = names.save(&e);
                let rewritten = e.transform_up(|e| through_seconds(e, schema.as_deref()))?;
                Ok(rewritten.update_data(|e| name.restore(e)))
            })
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "shardwise_integers_as_seconds"
    }
}

/// `CAST(n AS Timestamp(unit))` of an integer `n` as `CAST(CAST(n AS Timestamp(s)) AS
/// Timestamp(unit))`; other expressions as they are.
fn through_seconds(e: Expr, schema: Option<&datafusion::common::DFSchema>) -> Result<Transformed<Expr>> {
    let Expr::Cast(Cast { expr, field }) = &e else { return Ok(Transformed::no(e)) };
    let DataType::Timestamp(unit, zone) = field.data_type() else { return Ok(Transformed::no(e)) };
    if *unit == TimeUnit::Second {
        return Ok(Transformed::no(e));
    }
    let input_type = match (expr.as_ref(), schema) {
        (Expr::Literal(value, _), _) => value.data_type(),
        (_, Some(schema)) => match expr.get_type(schema) {
            Ok(t) => t,
            Err(_) => return Ok(Transformed::no(e)),
        },
        (_, None) => return Ok(Transformed::no(e)),
    };
    if !input_type.is_integer() {
        return Ok(Transformed::no(e));
    }
    let seconds = Arc::new(Field::new("", DataType::Timestamp(TimeUnit::Second, zone.clone()), true));
    let inner = Expr::Cast(Cast { expr: expr.clone(), field: seconds });
    Ok(Transformed::yes(Expr::Cast(Cast { expr: Box::new(inner), field: Arc::clone(field) })))
}
