//! Answers whose DECIMAL values do not fit their precision are errors, not numbers.
//!
//! DataFusion 55's `sum` of a `DECIMAL(38, s)` column is a `DECIMAL(38, s)` and adds without
//! checking the precision: past 38 digits the result holds a value its type cannot, which clients
//! then print wrongly (`9999999999999999999999999999.9999999999 + 12345678901234567890123456.7890123456`
//! showed as `1001234567890123456789012345.6789012345`, ten times too small). DuckDB and
//! PostgreSQL raise an overflow. Every batch of an answer is checked here before it leaves the
//! node, only in its decimal columns (a comparison per value), and the first value out of its
//! precision fails the statement naming the column. A value used inside the query before it is
//! answered (`CAST(sum(d) AS VARCHAR)`) is not caught here.

use datafusion::arrow::array::{Array, Decimal128Array, Decimal256Array, RecordBatch};
use datafusion::arrow::datatypes::DataType;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;

/// `stream`, each batch checked for DECIMAL values out of their precision (as it is when the
/// answer has no decimal column).
pub fn checked(stream: SendableRecordBatchStream) -> SendableRecordBatchStream {
    let schema = stream.schema();
    let decimal = |t: &DataType| matches!(t, DataType::Decimal128(..) | DataType::Decimal256(..));
    if !schema.fields().iter().any(|f| decimal(f.data_type())) {
        return stream;
    }
    let rows = stream.map(|batch| batch.and_then(|b| check(&b).map(|()| b)));
    Box::pin(RecordBatchStreamAdapter::new(schema, rows))
}

/// An error naming the first DECIMAL column of `batch` that holds a value out of its precision.
pub fn check(batch: &RecordBatch) -> Result<()> {
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        let fits = match field.data_type() {
            DataType::Decimal128(precision, _) => column
                .as_any()
                .downcast_ref::<Decimal128Array>()
                .is_none_or(|a| a.validate_decimal_precision(*precision).is_ok()),
            DataType::Decimal256(precision, _) => column
                .as_any()
                .downcast_ref::<Decimal256Array>()
                .is_none_or(|a| a.validate_decimal_precision(*precision).is_ok()),
            _ => true,
        };
        if !fits {
            return Err(DataFusionError::Execution(format!(
                "Arithmetic overflow: column {} holds a value of more digits than its type {} allows (a sum \
                 past 38 digits, say); cast the column to a wider DECIMAL, or to DOUBLE, before adding",
                field.name(),
                field.data_type()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::prelude::SessionContext;

    use super::*;

    #[tokio::test]
    async fn a_decimal_sum_past_its_precision_is_an_error() {
        let ctx = SessionContext::new();
        let sql = "SELECT sum(d) AS total FROM (VALUES (CAST('9999999999999999999999999999.9999999999' AS DECIMAL(38, 10))), \
                   (CAST('12345678901234567890123456.7890123456' AS DECIMAL(38, 10)))) AS t(d)";
        let stream = ctx.sql(sql).await.unwrap().execute_stream().await.unwrap();
        let err = checked(stream).next().await.expect("a batch").expect_err("out of DECIMAL(38, 10)");
        assert!(err.to_string().contains("column total holds a value of more digits"), "{err}");
        // In range: passes unchanged.
        let stream =
            ctx.sql("SELECT CAST(1.5 AS DECIMAL(10, 2)) AS d, 1 AS i").await.unwrap().execute_stream().await.unwrap();
        let batch = checked(stream).next().await.expect("a batch").expect("fits");
        assert_eq!(batch.num_rows(), 1);
        let plain = RecordBatch::try_from_iter([(
            "i",
            Arc::new(datafusion::arrow::array::Int64Array::from(vec![1])) as Arc<dyn Array>,
        )])
        .unwrap();
        assert!(check(&plain).is_ok());
    }
}
