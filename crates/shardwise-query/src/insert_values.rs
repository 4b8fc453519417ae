//! Names the row and column of an `INSERT ... VALUES` cell that does not fit its table.
//!
//! DataFusion plans `INSERT INTO t VALUES (...), (...)` as a `Values` node whose every cell is a
//! cast to the target column's type, and its optimizer evaluates those casts; one that fails
//! (`'2020-13-01'` into a DATE, `70000` into a SMALLINT) fails the statement with
//! `Optimizer rule 'simplify_expressions' failed ... Cast error: ...`, saying neither which row
//! nor which column. Nothing has been written at that point. This module, called only on that
//! error path, evaluates the cells one by one and says where the first bad one is, so a user
//! with a thousand-row statement can find it: `row 2, column d (column type Date32): Cannot cast
//! string ...`.

use std::sync::Arc;

use datafusion::arrow::datatypes::Schema;
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchOptions};
use datafusion::common::DFSchema;
use datafusion::common::tree_node::TreeNode;
use datafusion::error::DataFusionError;
use datafusion::execution::context::ExecutionProps;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::{DmlStatement, Expr, LogicalPlan, WriteOp};
use datafusion::optimizer::analyzer::type_coercion::TypeCoercionRewriter;
use datafusion::physical_expr::create_physical_expr;

/// Where an INSERT's first unfit value is, and why it does not fit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadValue {
    /// The table inserted into, as the statement named it.
    pub table: String,
    /// 1-based row of the VALUES list.
    pub row: usize,
    /// The target column's name.
    pub column: String,
    /// The target column's type, as Arrow names it (what `shardwise load` says too); `None` if
    /// the table's schema does not have the column (not expected).
    pub column_type: Option<String>,
    /// Why the value does not fit (DataFusion's message, without its optimizer wrapping).
    pub reason: String,
}

impl std::fmt::Display for BadValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let BadValue { table, row, column, column_type, reason } = self;
        match column_type {
            Some(t) => write!(f, "INSERT INTO {table}: row {row}, column {column} (column type {t}): {reason}"),
            None => write!(f, "INSERT INTO {table}: row {row}, column {column}: {reason}"),
        }
    }
}

/// The first cell of `plan`'s VALUES list (row by row, left to right) whose evaluation fails, when
/// `plan` is an `INSERT ... VALUES`; `None` for any other plan, or when every cell evaluates (the
/// failure was elsewhere). Cells that cannot be evaluated alone (placeholders, subqueries) are
/// passed over.
pub fn first_bad_value(plan: &LogicalPlan) -> Option<BadValue> {
    let LogicalPlan::Dml(dml @ DmlStatement { op: WriteOp::Insert(_), .. }) = plan else {
        return None;
    };
    let (projection, values) = match dml.input.as_ref() {
        LogicalPlan::Projection(p) => match p.input.as_ref() {
            LogicalPlan::Values(v) => (Some(p), v),
            _ => return None,
        },
        LogicalPlan::Values(v) => (None, v),
        _ => return None,
    };
    let one_row = RecordBatch::try_new_with_options(
        Arc::new(Schema::empty()),
        vec![],
        &RecordBatchOptions::new().with_row_count(Some(1)),
    )
    .ok()?;
    let (empty, props, planning) = (DFSchema::empty(), ExecutionProps::new(), PhysicalPlanningContext::default());
    for (i, row) in values.values.iter().enumerate() {
        for (j, cell) in row.iter().enumerate() {
            // The cell with its operands' types made to agree, as the analyzer does before the
            // optimizer folds it (`2.0::double * 3` multiplies two DOUBLEs): the plan here has not
            // been through it. A cell whose types cannot agree is the bad one.
            let evaluated = cell
                .clone()
                .rewrite(&mut TypeCoercionRewriter::new(&empty))
                .map(|t| t.data)
                .map(|cell| {
                    // The cell as the insert checks it (see `crate::insert_exact`).
                    crate::insert_exact::strict_cast(cell.clone(), &empty).unwrap_or(cell)
                })
                .and_then(|cell| {
                    let Ok(physical) = create_physical_expr(&cell, &empty, &props, &planning) else { return Ok(()) };
                    physical.evaluate(&one_row).map(|_| ())
                });
            if let Err(e) = evaluated {
                let column = values.schema.field(j).name().clone();
                let column = projection.and_then(|p| target_column(p, &column)).unwrap_or(column);
                let reason = match e.find_root() {
                    DataFusionError::ArrowError(arrow, _) => arrow.to_string(),
                    DataFusionError::Execution(message) => message.clone(),
                    root => root.strip_backtrace(),
                };
                let schema = dml.target.schema();
                let column_type = schema.field_with_name(&column).ok().map(|f| f.data_type().to_string());
                return Some(BadValue { table: dml.table_name.to_string(), row: i + 1, column, column_type, reason });
            }
        }
    }
    None
}

/// The name the INSERT's projection gives to the VALUES column `values_column` (the table
/// column it fills).
fn target_column(projection: &datafusion::logical_expr::Projection, values_column: &str) -> Option<String> {
    projection.expr.iter().find_map(|e| match e {
        Expr::Alias(alias) if alias.expr.column_refs().iter().any(|c| c.name == values_column) => {
            Some(alias.name.clone())
        }
        _ => None,
    })
}

/// DataFusion's `got 3 values in row 1 but expected 4` counts rows from 0; the same message
/// counting from 1, as every other row number a user sees does (the expected count is the
/// table's or the column list's width). `None` for other messages.
pub fn rephrase_row_length(message: &str) -> Option<String> {
    let rest = message.split("Inconsistent data length across values list: got ").nth(1)?;
    let (got, rest) = rest.split_once(" values in row ")?;
    let (row, expected) = rest.split_once(" but expected ")?;
    let row: usize = row.trim().parse().ok()?;
    let expected = expected.trim();
    Some(format!("VALUES row {} has {got} values where {expected} are expected", row + 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{DataType, Field};
    use datafusion::datasource::MemTable;
    use datafusion::prelude::SessionContext;

    async fn planned(sql: &str) -> LogicalPlan {
        let ctx = SessionContext::new();
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("d", DataType::Date32, true),
            Field::new("x", DataType::Int16, true),
        ]));
        let table = MemTable::try_new(schema, vec![vec![]]).expect("an empty table");
        ctx.register_table("t", Arc::new(table)).expect("registered");
        ctx.state().create_logical_plan(sql).await.expect("planned")
    }

    #[tokio::test]
    async fn the_first_unfit_cell_is_named_by_row_and_column() {
        let plan = planned("INSERT INTO t VALUES (1, '2020-01-01', 1), (2, '2020-13-01', 2), (3, 'x', 3)").await;
        let bad = first_bad_value(&plan).expect("a bad value");
        assert_eq!((bad.row, bad.column.as_str()), (2, "d"), "{bad}");
        assert!(bad.reason.starts_with("Cast error: Cannot cast string '2020-13-01'"), "{bad}");
        assert!(!bad.to_string().contains("Optimizer rule"), "{bad}");

        let plan = planned("INSERT INTO t VALUES (1, '2020-01-01', 1), (2, NULL, 70000)").await;
        let bad = first_bad_value(&plan).expect("a bad value");
        assert_eq!((bad.row, bad.column.as_str()), (2, "x"), "{bad}");
    }

    #[tokio::test]
    async fn a_good_row_holding_arithmetic_is_not_blamed() {
        // Its operands' types agree only once coerced: evaluated raw, `2.0 * 3` multiplied a
        // DOUBLE by a BIGINT and failed, and row 1 was named instead of row 2.
        let plan = planned("INSERT INTO t VALUES (5 * 2.0, NULL, CAST(2.0 AS DOUBLE) * 3), (6, NULL, 'oops')").await;
        let bad = first_bad_value(&plan).expect("a bad value");
        assert_eq!((bad.row, bad.column.as_str()), (2, "x"), "{bad}");
        assert!(bad.reason.contains("oops"), "{bad}");
    }

    #[tokio::test]
    async fn a_column_list_names_the_listed_column() {
        let plan = planned("INSERT INTO t (x, id) VALUES (1, 5), (2, 'zz')").await;
        let bad = first_bad_value(&plan).expect("a bad value");
        assert_eq!((bad.row, bad.column.as_str()), (2, "id"), "{bad}");
        assert!(bad.to_string().starts_with("INSERT INTO t: row 2, column id (column type Int64): "), "{bad}");
    }

    #[tokio::test]
    async fn good_values_and_other_statements_name_nothing() {
        assert_eq!(first_bad_value(&planned("INSERT INTO t VALUES (1, '2020-01-01', 1)").await), None);
        assert_eq!(first_bad_value(&planned("INSERT INTO t SELECT 1, NULL, 2").await), None);
        assert_eq!(first_bad_value(&planned("SELECT 1").await), None);
    }

    #[test]
    fn row_lengths_are_counted_from_one() {
        let m =
            "Error during planning: Inconsistent data length across values list: got 3 values in row 1 but expected 4";
        assert_eq!(rephrase_row_length(m).as_deref(), Some("VALUES row 2 has 3 values where 4 are expected"));
        assert_eq!(rephrase_row_length("something else"), None);
    }
}
