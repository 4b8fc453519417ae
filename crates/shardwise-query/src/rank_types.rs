//! `row_number()`, `rank()`, `dense_rank()` and `ntile()` in a statement's answer are BIGINT, as
//! in PostgreSQL.
//!
//! Why: DataFusion's are unsigned 64-bit integers, which the PostgreSQL endpoint sends as NUMERIC
//! (PostgreSQL has no unsigned type, and NUMERIC holds every value): psycopg read them as
//! `Decimal`, pandas as objects.
//!
//! How: [`RankTypes`], an analyzer rule, casts such a column of the statement's final SELECT list
//! (below any ORDER BY or LIMIT on top) to BIGINT under its name. Only the answer's columns: a
//! rank compared inside the query (`WHERE rn <= 2` over a subquery) keeps DataFusion's type and
//! its plans. A rank cannot pass the BIGINT range (it counts rows).

use datafusion::arrow::datatypes::DataType;
use datafusion::common::Result;
use datafusion::common::config::ConfigOptions;
use datafusion::logical_expr::{Cast, Expr, ExprSchemable, LogicalPlan, Projection};
use datafusion::optimizer::AnalyzerRule;
use std::sync::Arc;

/// The window functions whose answer is a count of rows.
const RANK_FUNCTIONS: [&str; 4] = ["row_number(", "rank(", "dense_rank(", "ntile("];

/// The analyzer rule. See the module doc.
#[derive(Debug, Default)]
pub struct RankTypes;

impl AnalyzerRule for RankTypes {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        top_projection_ranks_as_bigint(plan)
    }

    fn name(&self) -> &str {
        "shardwise_rank_types"
    }
}

fn top_projection_ranks_as_bigint(plan: LogicalPlan) -> Result<LogicalPlan> {
    match plan {
        LogicalPlan::Projection(projection) => ranks_as_bigint(projection),
        LogicalPlan::Sort(_) | LogicalPlan::Limit(_) => {
            use datafusion::common::tree_node::{Transformed, TreeNode};
            let rewritten = plan.map_children(|child| top_projection_ranks_as_bigint(child).map(Transformed::yes))?;
            rewritten.data.recompute_schema()
        }
        other => Ok(other),
    }
}

/// Whether `e`, an item of a projection over `input`, is a column that a rank function computes
/// (through the projections, sorts and filters between them).
fn is_rank_column(e: &Expr, input: &LogicalPlan) -> bool {
    let Expr::Column(c) = e.clone().unalias() else { return false };
    e.get_type(input.schema().as_ref()).is_ok_and(|t| t == DataType::UInt64) && computed_by_rank(input, &c.name)
}

fn computed_by_rank(plan: &LogicalPlan, name: &str) -> bool {
    match plan {
        LogicalPlan::Window(window) => {
            let own = window.window_expr.iter().find(|w| w.schema_name().to_string() == name);
            match own {
                Some(w) => RANK_FUNCTIONS.iter().any(|f| w.clone().unalias().schema_name().to_string().starts_with(f)),
                None => computed_by_rank(&window.input, name),
            }
        }
        LogicalPlan::Projection(p) => p.expr.iter().any(|e| {
            e.schema_name().to_string() == name
                && matches!(e.clone().unalias(), Expr::Column(c) if computed_by_rank(&p.input, &c.name))
        }),
        LogicalPlan::Sort(_) | LogicalPlan::Limit(_) | LogicalPlan::Filter(_) | LogicalPlan::SubqueryAlias(_) => {
            plan.inputs().first().is_some_and(|input| computed_by_rank(input, name))
        }
        _ => false,
    }
}

fn ranks_as_bigint(projection: Projection) -> Result<LogicalPlan> {
    let input = Arc::clone(&projection.input);
    if !projection.expr.iter().any(|e| is_rank_column(e, &input)) {
        return Ok(LogicalPlan::Projection(projection));
    }
    let exprs = projection
        .expr
        .iter()
        .map(|e| {
            if !is_rank_column(e, &input) {
                return e.clone();
            }
            let (qualifier, name) = e.qualified_name();
            let column = e.clone().unalias();
            Expr::Cast(Cast::new(Box::new(column), DataType::Int64)).alias_qualified(qualifier, name)
        })
        .collect();
    Ok(LogicalPlan::Projection(Projection::try_new(exprs, projection.input)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;

    #[tokio::test]
    async fn ranks_in_the_answer_are_bigint() -> Result<()> {
        let ctx = SessionContext::new();
        ctx.add_analyzer_rule(Arc::new(RankTypes));
        ctx.sql("CREATE TABLE t (g INT, v INT) AS VALUES (1, 5), (1, 7), (2, 3)").await?.collect().await?;
        let df = ctx
            .sql(
                "SELECT g, row_number() OVER (PARTITION BY g ORDER BY v) AS rn, rank() OVER (ORDER BY v), \
                 ntile(2) OVER (ORDER BY v) FROM t ORDER BY g, v LIMIT 10",
            )
            .await?;
        let batches = df.collect().await?;
        let schema = batches[0].schema();
        let types: Vec<&DataType> = schema.fields().iter().map(|f| f.data_type()).collect();
        assert_eq!(types, [&DataType::Int32, &DataType::Int64, &DataType::Int64, &DataType::Int64]);
        assert_eq!(schema.field(1).name(), "rn");
        assert!(schema.field(2).name().starts_with("rank()"), "{}", schema.field(2).name());
        // Inside a subquery the rank keeps its type (and the plans that read it).
        let batches = ctx
            .sql("SELECT g FROM (SELECT g, row_number() OVER (ORDER BY v) AS rn FROM t) s WHERE rn <= 2")
            .await?
            .collect()
            .await?;
        assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 2);
        Ok(())
    }
}
