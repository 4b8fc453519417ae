//! The types of a statement's parameters (`$1`, `$2`, ...), as a PostgreSQL server infers them
//! when a driver prepares a statement without declaring them: asyncpg (and so SQLAlchemy's
//! `postgresql+asyncpg`) sends none, encodes each value by the type the server's
//! `ParameterDescription` names, and refused every call while shardwise named none.
//!
//! How: the statement is planned with its placeholders in place; a parameter's type is what
//! DataFusion's planner gave it (`id > $1` is the column's type, `VALUES ($1)` the inserted
//! column's), else the type of a cast around it (`$1::bigint`); one with neither is `None` (the
//! PostgreSQL endpoint calls it text, as PostgreSQL does for an unconstrained `$1`).

use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::logical_expr::expr::{Cast, Placeholder, TryCast};
use datafusion::logical_expr::{Expr, LogicalPlan};

/// The types of parameters `$1` to `$count` in `plan`, as far as the plan says.
pub fn of_plan(plan: &LogicalPlan, count: usize) -> Vec<Option<DataType>> {
    let mut types: Vec<Option<DataType>> = vec![None; count];
    let mut note = |id: &str, data_type: Option<&DataType>| {
        let Some(data_type) = data_type.filter(|t| **t != DataType::Null) else { return };
        let Some(slot) = id.strip_prefix('$').and_then(|n| n.parse::<usize>().ok()).and_then(|n| n.checked_sub(1))
        else {
            return;
        };
        if let Some(entry) = types.get_mut(slot)
            && entry.is_none()
        {
            *entry = Some(data_type.clone());
        }
    };
    let _ = plan.apply_with_subqueries(|node| {
        node.apply_expressions(|e| {
            e.apply(|expr| {
                match expr {
                    Expr::Cast(Cast { expr, field }) | Expr::TryCast(TryCast { expr, field }) => {
                        if let Expr::Placeholder(Placeholder { id, field: None }) = expr.as_ref() {
                            note(id, Some(field.data_type()));
                        }
                    }
                    Expr::Placeholder(Placeholder { id, field }) => note(id, field.as_ref().map(|f| f.data_type())),
                    _ => {}
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })
    });
    types
}

#[cfg(test)]
mod tests {
    use datafusion::prelude::SessionContext;

    use super::*;

    async fn types(sql: &str, count: usize) -> Vec<Option<DataType>> {
        let ctx = SessionContext::new();
        ctx.sql("CREATE TABLE t (id BIGINT, name VARCHAR, price DOUBLE)").await.expect("table");
        let plan = ctx.state().create_logical_plan(sql).await.expect("planned");
        of_plan(&plan, count)
    }

    #[tokio::test]
    async fn parameters_take_their_columns_and_casts_types() {
        assert_eq!(
            types("SELECT id FROM t WHERE id > $1 AND name = $2", 2).await,
            vec![Some(DataType::Int64), Some(DataType::Utf8View)]
        );
        assert_eq!(
            types("SELECT $1::bigint, CAST($2 AS DOUBLE), $3", 3).await,
            vec![Some(DataType::Int64), Some(DataType::Float64), None]
        );
        assert_eq!(
            types("INSERT INTO t (id, price) VALUES ($1, $2)", 2).await,
            vec![Some(DataType::Int64), Some(DataType::Float64)]
        );
    }
}
