//! CSV has no nested values: list, struct and map columns are written as their text (`[1, 2]`,
//! `{a: 1, b: x}`), as DuckDB and ClickHouse write them, instead of arrow's CSV writer failing on
//! them part-way through an answer. Used by the HTTP API and `shardwise sql --format csv`.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};

/// `batch` with every nested column replaced by a `Utf8` column of its values' text (nulls stay
/// null); the batch itself when it has none.
pub fn nested_as_text(batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
    if !batch.schema().fields().iter().any(|f| f.data_type().is_nested()) {
        return Ok(batch.clone());
    }
    let options = FormatOptions::default();
    let mut fields = Vec::with_capacity(batch.num_columns());
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(batch.num_columns());
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        if !field.data_type().is_nested() {
            fields.push(Arc::clone(field));
            columns.push(Arc::clone(column));
            continue;
        }
        let formatter = ArrayFormatter::try_new(column.as_ref(), &options)?;
        let text: StringArray =
            (0..column.len()).map(|row| column.is_valid(row).then(|| formatter.value(row).to_string())).collect();
        fields.push(Arc::new(Field::new(field.name(), DataType::Utf8, true)));
        columns.push(Arc::new(text));
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Int64Array, ListArray};
    use datafusion::arrow::datatypes::Int64Type;

    use super::*;

    #[test]
    fn lists_become_their_text_and_other_columns_stay() {
        let list = ListArray::from_iter_primitive::<Int64Type, _, _>(vec![Some(vec![Some(1), None]), None]);
        let batch = RecordBatch::try_from_iter([
            ("n", Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef),
            ("l", Arc::new(list) as ArrayRef),
        ])
        .unwrap();
        let text = nested_as_text(&batch).unwrap();
        assert_eq!(text.column(0).data_type(), &DataType::Int64);
        let l = text.column(1).as_any().downcast_ref::<StringArray>().unwrap();
        assert_eq!((l.value(0), l.is_null(1)), ("[1, ]", true));
        let mut out = Vec::new();
        datafusion::arrow::csv::WriterBuilder::new().build(&mut out).write(&text).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "n,l\n1,\"[1, ]\"\n2,\n");
    }
}
