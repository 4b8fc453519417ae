//! Names the column of an `INSERT ... SELECT` value that does not fit its table.
//!
//! DataFusion plans the insert's source under a projection that casts each selected column to the
//! type of the table column it fills. A value that does not fit (`-7811` into a TINYINT, `395616.2`
//! into a DECIMAL(5, 2)) fails the cast where it runs, often in a fragment on another node, with
//! `Cast error: Can't cast value -7811 to type Int8`: the value, but not the column. Nothing is
//! written then (the whole source is read and checked before any row is stored). The message
//! names the target type, so the casts to that type are the candidates: this module prefixes the
//! error with the column, or the columns, cast to it: `INSERT INTO t: column tiny: Cast error: ...`.
//! A constant that does not fit (`INSERT INTO t (id) SELECT 'x'`) fails earlier, as the optimizer
//! folds its cast; the engine explains that error the same way ([`InsertCasts::explain`]).

use datafusion::arrow::datatypes::DataType;
use datafusion::error::DataFusionError;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::logical_expr::{DmlStatement, Expr, LogicalPlan, WriteOp};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::TryStreamExt;

use crate::error::QueryError;

/// The table and the casting columns of an `INSERT ... SELECT` (`None` for other statements,
/// and for an insert whose source casts nothing).
#[derive(Debug, Clone, PartialEq)]
pub struct InsertCasts {
    table: String,
    /// Each table column filled through a cast, and the type it is cast to.
    columns: Vec<(String, DataType)>,
}

impl InsertCasts {
    pub fn of(plan: &LogicalPlan) -> Option<InsertCasts> {
        let LogicalPlan::Dml(DmlStatement { table_name, op: WriteOp::Insert(_), input, .. }) = plan else {
            return None;
        };
        let LogicalPlan::Projection(projection) = input.as_ref() else { return None };
        let columns: Vec<(String, DataType)> = projection
            .expr
            .iter()
            .zip(projection.schema.fields())
            .filter_map(|(expr, field)| match expr.clone().unalias() {
                // A column the insert leaves out is filled with a cast NULL, which always fits.
                Expr::Cast(cast) if is_null_literal(&cast.expr) => None,
                Expr::TryCast(cast) if is_null_literal(&cast.expr) => None,
                Expr::Cast(cast) => Some((field.name().clone(), cast.field.data_type().clone())),
                Expr::TryCast(cast) => Some((field.name().clone(), cast.field.data_type().clone())),
                _ => None,
            })
            .collect();
        (!columns.is_empty()).then(|| InsertCasts { table: table_name.to_string(), columns })
    }

    /// `message` with the columns whose cast it is about, when its words name their type.
    pub fn explain(&self, message: &str) -> Option<String> {
        let names: Vec<&str> = self
            .columns
            .iter()
            .filter(|(_, data_type)| names_type(message, data_type))
            .map(|(name, _)| name.as_str())
            .collect();
        let columns = match names.as_slice() {
            [] => return None,
            [one] => format!("column {one}"),
            several => format!("one of the columns {}", several.join(", ")),
        };
        Some(format!("INSERT INTO {}: {columns}: {message}", self.table))
    }

    /// `stream` with each cast error explained.
    pub fn explain_errors(self, stream: SendableRecordBatchStream) -> SendableRecordBatchStream {
        let schema = stream.schema();
        let mapped = stream.map_err(move |e| match self.explain(&e.to_string()) {
            Some(message) => DataFusionError::External(Box::new(QueryError::Rejected(message))),
            None => e,
        });
        Box::pin(RecordBatchStreamAdapter::new(schema, mapped))
    }
}

fn is_null_literal(expr: &Expr) -> bool {
    matches!(expr, Expr::Literal(value, _) if value.is_null())
}

/// Whether a cast error's `message` is about a cast to `data_type`: Arrow's words for a value
/// out of range (`to type Int8`, `to value of Int32 type`) or too wide for a decimal
/// (`Decimal128 of precision 5`).
fn names_type(message: &str, data_type: &DataType) -> bool {
    if !message.contains("Cast error") && !message.contains("too large to store") {
        return false;
    }
    let decimal_precision = match data_type {
        DataType::Decimal32(p, _) => Some(format!("Decimal32 of precision {p}")),
        DataType::Decimal64(p, _) => Some(format!("Decimal64 of precision {p}")),
        DataType::Decimal128(p, _) => Some(format!("Decimal128 of precision {p}")),
        DataType::Decimal256(p, _) => Some(format!("Decimal256 of precision {p}")),
        _ => None,
    };
    message.contains(&format!("to type {data_type}"))
        || message.contains(&format!("to value of {data_type} type"))
        || decimal_precision.is_some_and(|words| message.contains(&words))
}

#[cfg(test)]
mod tests {
    use datafusion::prelude::SessionContext;

    use super::*;

    async fn casts(sql: &str) -> Option<InsertCasts> {
        let ctx = SessionContext::new();
        ctx.sql("CREATE TABLE t (id BIGINT, tiny TINYINT, small TINYINT, d DECIMAL(5, 2))").await.expect("table");
        ctx.sql("CREATE TABLE s (id BIGINT, v INT, x DOUBLE)").await.expect("source");
        InsertCasts::of(&ctx.state().create_logical_plan(sql).await.expect("planned"))
    }

    #[tokio::test]
    async fn the_cast_named_by_the_error_is_the_column() {
        let casts = casts("INSERT INTO t SELECT id, v, 1, x FROM s").await.expect("casts");
        let err = "rank 1: fragment: Arrow error: Cast error: Can't cast value -7811 to type Int8";
        assert_eq!(
            casts.explain(err).as_deref(),
            Some(format!("INSERT INTO t: one of the columns tiny, small: {err}").as_str())
        );
        let err = "Arrow error: Invalid argument error: 395616.20 is too large to store in a Decimal128 of precision 5";
        assert_eq!(casts.explain(err), Some(format!("INSERT INTO t: column d: {err}")));
        // Errors of another kind, or naming no cast's type, are left alone.
        assert_eq!(casts.explain("Arrow error: Divide by zero error"), None);
        assert_eq!(casts.explain("Cast error: Can't cast value 1 to type UInt8"), None);
    }

    #[tokio::test]
    async fn only_an_insert_from_a_query_has_casts() {
        assert!(casts("SELECT * FROM s").await.is_none());
        // Columns of the table's own types are not cast; the selected NULL is.
        let same_types = "INSERT INTO t SELECT id, CAST(v AS TINYINT) AS a, CAST(v AS TINYINT) AS b, NULL FROM s";
        let casts = casts(same_types).await.expect("casts");
        assert_eq!(casts.columns, vec![("d".to_string(), DataType::Decimal128(5, 2))]);
    }

    /// Columns an insert leaves out (filled with NULLs) are not named by its errors.
    #[tokio::test]
    async fn columns_left_out_are_not_named() {
        let casts = casts("INSERT INTO t (id, small) SELECT id, v * 100 FROM s").await.expect("casts");
        assert_eq!(casts.columns, vec![("small".to_string(), DataType::Int8)]);
        let err = "Arrow error: Cast error: Can't cast value 200 to type Int8";
        assert_eq!(casts.explain(err), Some(format!("INSERT INTO t: column small: {err}")));
    }
}
