//! One schema for a Flight SQL answer: the one `GetFlightInfo` announces is the one `DoGet`'s
//! batches carry.
//!
//! Why: `GetFlightInfo` described a result from the logical plan and `DoGet` streamed the
//! physical plan's batches, which can differ in nullability (`count(*) + 1` is non-null in one
//! and nullable in the other, `ARRAY[1, 2]`'s elements too) and in a type's form; ADBC's driver
//! checks them and refused valid queries ("endpoint 0 returned inconsistent schema"), and an
//! error a query raised came out as that message.
//!
//! How: both sides use [`announced`], the statement's planned schema with every field (nested
//! ones included) nullable, and `DoGet` [`conform`]s each batch to it, casting a column whose
//! type differs.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, FieldRef, Schema, SchemaRef};
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::compute::cast;
use datafusion::arrow::error::ArrowError;

/// `schema` with every field, nested ones included, nullable.
pub fn announced(schema: &Schema) -> SchemaRef {
    Arc::new(Schema::new_with_metadata(
        schema.fields().iter().map(nullable_field).collect::<Vec<_>>(),
        schema.metadata().clone(),
    ))
}

fn nullable_field(f: &FieldRef) -> FieldRef {
    Arc::new(Field::new(f.name(), nullable_type(f.data_type()), true).with_metadata(f.metadata().clone()))
}

fn nullable_type(t: &DataType) -> DataType {
    match t {
        DataType::List(f) => DataType::List(nullable_field(f)),
        DataType::LargeList(f) => DataType::LargeList(nullable_field(f)),
        DataType::ListView(f) => DataType::ListView(nullable_field(f)),
        DataType::FixedSizeList(f, n) => DataType::FixedSizeList(nullable_field(f), *n),
        DataType::Struct(fields) => DataType::Struct(fields.iter().map(nullable_field).collect()),
        other => other.clone(),
    }
}

/// `batch` with `schema` (as [`announced`] makes it), its columns cast where their type differs.
pub fn conform(batch: RecordBatch, schema: &SchemaRef) -> Result<RecordBatch, ArrowError> {
    if batch.schema().as_ref() == schema.as_ref() {
        return Ok(batch);
    }
    if batch.num_columns() != schema.fields().len() {
        return Err(ArrowError::SchemaError(format!(
            "the answer has {} columns where {} were announced",
            batch.num_columns(),
            schema.fields().len()
        )));
    }
    let columns = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(column, field)| {
            if column.data_type() == field.data_type() {
                Ok(Arc::clone(column))
            } else {
                cast(column, field.data_type())
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new(Arc::clone(schema), columns)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Array, ArrayRef, Int64Array, ListArray};
    use datafusion::arrow::datatypes::Int64Type;

    #[test]
    fn batches_take_the_announced_nullable_schema() -> Result<(), ArrowError> {
        let strict = Schema::new(vec![
            Field::new("n", DataType::Int64, false),
            Field::new("l", DataType::List(Arc::new(Field::new("item", DataType::Int64, false))), false),
        ]);
        let schema = announced(&strict);
        assert!(schema.fields().iter().all(|f| f.is_nullable()));
        let list = ListArray::from_iter_primitive::<Int64Type, _, _>(vec![Some(vec![Some(1), Some(2)])]);
        let batch = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("n", DataType::Int64, true),
                Field::new("l", list.data_type().clone(), true),
            ])),
            vec![Arc::new(Int64Array::from(vec![7])) as ArrayRef, Arc::new(list) as ArrayRef],
        )?;
        let conformed = conform(batch, &schema)?;
        assert_eq!(conformed.schema(), schema);
        assert_eq!(conformed.num_rows(), 1);
        Ok(())
    }
}
