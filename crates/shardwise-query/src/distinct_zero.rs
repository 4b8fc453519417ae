//! `count(DISTINCT x)`, `avg(DISTINCT x)` ... of floats count `0.0` and `-0.0` as one value.
//!
//! Why: DataFusion's distinct accumulators keep float values by their bits, so `-0.0` and `0.0`
//! were two values: `SELECT count(*), count(DISTINCT f)` of those two rows gave 2, 2 where
//! PostgreSQL and DuckDB give 2, 1, while `GROUP BY f`, `DISTINCT`, `UNION` and `f = 0` in the
//! same engine take them for one (and `count(DISTINCT f)` alone, planned as a `GROUP BY`, gave 1).
//!
//! How: [`DistinctFloatZeros`], an analyzer rule after type coercion, rewrites the float
//! arguments of every `DISTINCT` aggregate as `x + 0.0`, which is `x` for every float but
//! `-0.0`, whose sum with `0.0` is `0.0` (IEEE 754, rounding to nearest); NaN stays NaN. The
//! aggregate keeps its name, so its column is named as written.

use datafusion::arrow::datatypes::DataType;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::{Aggregate, BinaryExpr, Expr, ExprSchemable, LogicalPlan, Operator, lit};
use datafusion::optimizer::AnalyzerRule;

/// The analyzer rule. See the module doc.
#[derive(Debug, Default)]
pub struct DistinctFloatZeros;

impl AnalyzerRule for DistinctFloatZeros {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        plan.transform_up_with_subqueries(|plan| {
            let LogicalPlan::Aggregate(aggregate) = plan else { return Ok(Transformed::no(plan)) };
            if !aggregate.aggr_expr.iter().any(is_distinct) {
                return Ok(Transformed::no(LogicalPlan::Aggregate(aggregate)));
            }
            let schema = aggregate.input.schema();
            let mut changed = false;
            let mut aggr_expr = Vec::with_capacity(aggregate.aggr_expr.len());
            for expr in &aggregate.aggr_expr {
                let name = expr.schema_name().to_string();
                let rewritten = expr.clone().transform(|e| match e {
                    Expr::AggregateFunction(mut f) if f.params.distinct => {
                        let mut any = false;
                        for arg in f.params.args.iter_mut() {
                            if let Some(zero) = float_zero(&arg.get_type(schema)?) {
                                *arg = Expr::BinaryExpr(BinaryExpr::new(
                                    Box::new(arg.clone()),
                                    Operator::Plus,
                                    Box::new(zero),
                                ));
                                any = true;
                            }
                        }
                        Ok(match any {
                            true => Transformed::yes(Expr::AggregateFunction(f)),
                            false => Transformed::no(Expr::AggregateFunction(f)),
                        })
                    }
                    other => Ok(Transformed::no(other)),
                })?;
                changed |= rewritten.transformed;
                aggr_expr.push(match rewritten.transformed {
                    true => rewritten.data.alias(name),
                    false => rewritten.data,
                });
            }
            if !changed {
                return Ok(Transformed::no(LogicalPlan::Aggregate(aggregate)));
            }
            let Aggregate { input, group_expr, .. } = aggregate;
            Ok(Transformed::yes(LogicalPlan::Aggregate(Aggregate::try_new(input, group_expr, aggr_expr)?)))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "shardwise_distinct_float_zeros"
    }
}

fn is_distinct(expr: &Expr) -> bool {
    let mut found = false;
    let _ = expr.apply(|e| {
        found |= matches!(e, Expr::AggregateFunction(AggregateFunction { params, .. }) if params.distinct);
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    });
    found
}

/// A zero of `data_type` when it is a float type whose `-0.0` is to be made `0.0`.
fn float_zero(data_type: &DataType) -> Option<Expr> {
    match data_type {
        DataType::Float64 => Some(lit(ScalarValue::Float64(Some(0.0)))),
        DataType::Float32 => Some(lit(ScalarValue::Float32(Some(0.0)))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::util::pretty::pretty_format_batches;
    use datafusion::execution::SessionStateBuilder;
    use datafusion::prelude::{SessionConfig, SessionContext};

    use super::*;

    async fn run(sql: &str) -> String {
        let state = SessionStateBuilder::new()
            .with_config(SessionConfig::new())
            .with_default_features()
            .with_analyzer_rule(Arc::new(DistinctFloatZeros))
            .build();
        let ctx = SessionContext::new_with_state(state);
        let create = "CREATE TABLE z (g INT, f DOUBLE, r REAL) AS VALUES \
                      (1, 0.0, 0.0), (1, -0.0, -0.0), (1, 3.0, 3.0), (2, -0.0, 1.0), (2, 'NaN', 'NaN')";
        ctx.sql(create).await.expect("planned").collect().await.expect("created");
        let batches = ctx.sql(sql).await.expect("planned").collect().await.expect("ran");
        // Cells without their padding.
        let text = pretty_format_batches(&batches).expect("printed").to_string();
        text.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    #[tokio::test]
    async fn minus_zero_and_zero_are_one_distinct_value() {
        let sql = "SELECT count(*) AS n, count(DISTINCT f) AS f, avg(DISTINCT f) AS a, count(DISTINCT r) AS r, \
                   count(DISTINCT g) AS g FROM z WHERE g = 1";
        let got = run(sql).await;
        assert!(got.contains("| 3 | 2 | 1.5 | 2 | 1 |"), "{got}");
        let got = run("SELECT count(DISTINCT f) FROM z").await;
        assert!(got.contains("count(DISTINCT z.f)") && got.contains("| 3 |"), "the column keeps its name: {got}");
        let got = run("SELECT g, count(*), count(DISTINCT f) FROM z GROUP BY g ORDER BY g").await;
        assert!(got.contains("| 1 | 3 | 2 |") && got.contains("| 2 | 2 | 2 |"), "{got}");
    }
}
