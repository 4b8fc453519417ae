//! A condition that guards a division or a cast in the same `AND` / `OR` is respected:
//! `WHERE a <> 0 AND 10 / a > 1` answers, as in PostgreSQL, instead of failing with "division by
//! zero" on the rows the guard excludes.
//!
//! Why: DataFusion evaluates both sides of `AND` over a whole batch (it evaluates the right side
//! on the guard's rows only when they are under a fifth of the batch), so the division ran on
//! `a = 0` too, and whether a query failed depended on how many rows a batch held. The same for
//! `a = 0 OR 10 / a > 1`, for `%`, for `s ~ '^[0-9]+$' AND CAST(s AS INT) > 5`, and for the idiom
//! `SELECT ... FROM (SELECT ... WHERE a <> 0) WHERE 10 / a > 1`, whose two filters the optimizer
//! merges into one `AND`.
//!
//! How: [`GuardedOperands`], the last logical optimizer rule (after the filters are pushed down
//! and merged), rewrites `p AND q`, where `q` divides by or casts from a value that can fail, so
//! that the failing operand is read only where `p` does not already decide the answer: the
//! divisor `d` of an integer or DECIMAL `/` or `%` in `q` becomes `CASE WHEN p IS NOT FALSE THEN d
//! END`, as does the string operand of a cast to another type (for `OR`: `p IS NOT TRUE`). Where
//! `p` is false, `q` then sees a NULL and the `AND` is false as before; elsewhere `q` is what it
//! was, so the answer is the same in every context (not only in a WHERE). The guard is a
//! non-boolean CASE, which DataFusion's simplifier leaves alone, and an operand already guarded by
//! `p` is not guarded again, so the rule can run in every optimizer pass.

use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DFSchema, Result};
use datafusion::logical_expr::expr::Case;
use datafusion::logical_expr::utils::{conjunction, merge_schema, split_conjunction};
use datafusion::logical_expr::{BinaryExpr, Cast, Expr, ExprSchemable, LogicalPlan, Operator};
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};

/// The optimizer rule. See the module doc.
#[derive(Debug, Default)]
pub struct GuardedOperands;

impl OptimizerRule for GuardedOperands {
    fn name(&self) -> &str {
        "shardwise_guarded_operands"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::BottomUp)
    }

    fn rewrite(&self, plan: LogicalPlan, _config: &dyn OptimizerConfig) -> Result<Transformed<LogicalPlan>> {
        let schema = merge_schema(&plan.inputs());
        plan.map_expressions(|e| e.transform_up(|e| guarded(e, &schema)))
    }
}

/// `p AND q` / `p OR q` with the failing operands of `q` guarded by `p`, or of `p` by `q` when only
/// `p` has any (the optimizer may have put the guard second: `AND` and `OR` are symmetric, so
/// either side may decide the answer before the other is read); anything else as it is.
fn guarded(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    let Expr::BinaryExpr(BinaryExpr { left, op: op @ (Operator::And | Operator::Or), right }) = e else {
        return Ok(Transformed::no(e));
    };
    let deciding = |side: &Expr| match op {
        Operator::And => Expr::IsNotFalse(Box::new(side.clone())),
        _ => Expr::IsNotTrue(Box::new(side.clone())),
    };
    if has_failing_operand(&left, schema) && !has_failing_operand(&right, schema) {
        let guard = deciding(&right);
        let left = left.transform_up(|x| guard_operand(x, &guard, schema))?;
        return Ok(left.update_data(|left| Expr::BinaryExpr(BinaryExpr { left: Box::new(left), op, right })));
    }
    let guard = deciding(&left);
    let right = right.transform_up(|x| guard_operand(x, &guard, schema))?;
    Ok(right.update_data(|right| Expr::BinaryExpr(BinaryExpr { left, op, right: Box::new(right) })))
}

/// Whether `e` reads an operand that can fail and is not behind a guard yet.
fn has_failing_operand(e: &Expr, schema: &DFSchema) -> bool {
    let unguarded = |x: &Expr| !matches!(x, Expr::Case(Case { expr: None, when_then_expr, else_expr: None }) if when_then_expr.len() == 1);
    e.exists(|x| {
        Ok(match x {
            Expr::BinaryExpr(BinaryExpr { op: Operator::Divide | Operator::Modulo, right, .. }) => {
                unguarded(right) && right.get_type(schema).is_ok_and(|t| t.is_integer() || is_decimal(&t))
            }
            Expr::Cast(Cast { expr, field }) => {
                unguarded(expr) && !is_string(field.data_type()) && expr.get_type(schema).is_ok_and(|t| is_string(&t))
            }
            _ => false,
        })
    })
    .unwrap_or(false)
}

/// A division, remainder or cast in `e` whose operand can fail, with that operand guarded.
fn guard_operand(e: Expr, guard: &Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    match e {
        Expr::BinaryExpr(BinaryExpr { left, op: op @ (Operator::Divide | Operator::Modulo), right })
            if right.get_type(schema).is_ok_and(|t| t.is_integer() || is_decimal(&t)) =>
        {
            let right = with_guard(*right, guard);
            Ok(right.update_data(|right| Expr::BinaryExpr(BinaryExpr { left, op, right: Box::new(right) })))
        }
        Expr::Cast(Cast { expr, field })
            if !is_string(field.data_type()) && expr.get_type(schema).is_ok_and(|t| is_string(&t)) =>
        {
            let expr = with_guard(*expr, guard);
            Ok(expr.update_data(|expr| Expr::Cast(Cast { expr: Box::new(expr), field })))
        }
        other => Ok(Transformed::no(other)),
    }
}

/// `CASE WHEN guard THEN operand END`; an operand already behind a guard takes `guard` into its
/// condition unless the condition has it.
fn with_guard(operand: Expr, guard: &Expr) -> Transformed<Expr> {
    if let Expr::Case(Case { expr: None, when_then_expr, else_expr: None }) = &operand
        && let [(when, then)] = when_then_expr.as_slice()
    {
        if split_conjunction(when).contains(&guard) {
            return Transformed::no(operand);
        }
        let when = conjunction([when.as_ref().clone(), guard.clone()]).unwrap_or_else(|| guard.clone());
        return Transformed::yes(Expr::Case(Case {
            expr: None,
            when_then_expr: vec![(Box::new(when), then.clone())],
            else_expr: None,
        }));
    }
    Transformed::yes(Expr::Case(Case {
        expr: None,
        when_then_expr: vec![(Box::new(guard.clone()), Box::new(operand))],
        else_expr: None,
    }))
}

fn is_decimal(t: &DataType) -> bool {
    matches!(t, DataType::Decimal32(..) | DataType::Decimal64(..) | DataType::Decimal128(..) | DataType::Decimal256(..))
}

fn is_string(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{AsArray, RecordBatch};
    use datafusion::arrow::datatypes::Int64Type;
    use datafusion::prelude::{SessionConfig, SessionContext};
    use std::sync::Arc;

    async fn context() -> Result<SessionContext> {
        // Batches of 4 rows, most of them passing the guard: DataFusion evaluates the whole
        // right side then.
        let ctx = SessionContext::new_with_config(SessionConfig::new().with_batch_size(4));
        ctx.add_optimizer_rule(Arc::new(GuardedOperands));
        ctx.sql(
            "CREATE TABLE r (a BIGINT, s VARCHAR) AS VALUES (0, 'x'), (1, '1'), (2, '2'), (3, '3'), (5, '5'), \
             (10, '10'), (NULL, NULL), (20, '20')",
        )
        .await?
        .collect()
        .await?;
        Ok(ctx)
    }

    async fn count(ctx: &SessionContext, sql: &str) -> Result<i64> {
        let batches: Vec<RecordBatch> = ctx.sql(sql).await?.collect().await?;
        Ok(batches[0].column(0).as_primitive::<Int64Type>().value(0))
    }

    #[tokio::test]
    async fn guards_in_the_same_condition_are_respected() -> Result<()> {
        let ctx = context().await?;
        assert_eq!(count(&ctx, "SELECT count(*) FROM r WHERE a <> 0 AND 10 / a > 1").await?, 4);
        assert_eq!(count(&ctx, "SELECT count(*) FROM r WHERE a = 0 OR 10 / a > 1").await?, 5);
        assert_eq!(count(&ctx, "SELECT count(*) FROM r WHERE a <> 0 AND 10 % a = 0").await?, 4);
        assert_eq!(count(&ctx, "SELECT count(*) FROM (SELECT a FROM r WHERE a <> 0) x WHERE 10 / a > 1").await?, 4);
        assert_eq!(count(&ctx, "SELECT count(*) FROM r WHERE s <> 'x' AND CAST(s AS INT) > 4").await?, 3);
        // The guard second.
        assert_eq!(count(&ctx, "SELECT count(*) FROM r WHERE CAST(s AS INT) > 4 AND s <> 'x'").await?, 3);
        assert_eq!(count(&ctx, "SELECT count(*) FROM r WHERE 10 / a > 1 AND a <> 0").await?, 4);
        // In a select list the answer is the same as without the guard's rows: false, NULL, true.
        let batches = ctx
            .sql("SELECT count(*) FILTER (WHERE ok), count(*) FILTER (WHERE NOT ok), count(ok) FROM (SELECT a <> 0 AND 10 / a > 1 AS ok FROM r) t")
            .await?
            .collect()
            .await?;
        let column = |i: usize| batches[0].column(i).as_primitive::<Int64Type>().value(0);
        assert_eq!((column(0), column(1), column(2)), (4, 3, 7));
        // Without a guard the division still fails.
        let e = ctx.sql("SELECT count(*) FROM r WHERE 10 / a > 1").await?.collect().await.expect_err("divides by zero");
        assert!(e.to_string().contains("Divide by zero"), "{e}");
        Ok(())
    }
}
