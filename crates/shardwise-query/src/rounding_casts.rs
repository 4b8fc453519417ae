//! A fraction cast to an integer is rounded, as PostgreSQL and DuckDB do: `CAST(9.99 AS INT)`
//! is 10, `CAST(-9.5 AS INT)` is -10.
//!
//! Why: Arrow's cast cuts the fraction off (9 and -9), so the same query answered differently
//! here than on the engines whose SQL the PostgreSQL endpoint speaks, with no error.
//!
//! How: [`RoundingCasts`], an analyzer rule, puts `round(x)` (half away from zero, DataFusion's
//! `round` for floats and decimals) under every cast or `TRY_CAST` from a float or a decimal with
//! a fraction to an integer type. An `INSERT` of a fraction into an integer column still fails
//! (`crate::insert_exact` checks the value before its cast).

use datafusion::arrow::datatypes::DataType;
use datafusion::common::DFSchema;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::Transformed;
use datafusion::error::Result;
use datafusion::functions::math::expr_fn::round;
use datafusion::logical_expr::expr::{Cast, TryCast};
use datafusion::logical_expr::{Expr, ExprSchemable, LogicalPlan};
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
    Ok(Transformed::yes(match e {
        Expr::Cast(Cast { expr, field }) => Expr::Cast(Cast { expr: Box::new(round(vec![*expr])), field }),
        Expr::TryCast(TryCast { expr, field }) => Expr::TryCast(TryCast { expr: Box::new(round(vec![*expr])), field }),
        other => other,
    }))
}

/// Whether `e` is a call of `round` already (the rule's own work, seen again).
fn is_rounded(e: &Expr) -> bool {
    matches!(e, Expr::ScalarFunction(f) if f.name() == "round")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use datafusion::arrow::util::pretty::pretty_format_batches;
    use datafusion::prelude::SessionContext;

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
