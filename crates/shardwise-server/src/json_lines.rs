//! Answers as JSON lines (ClickHouse's `JSONEachRow`), for the HTTP API and `shardwise sql
//! --format json`: one object per row, every column in every line (NULL as `null`).
//!
//! An answer may name two columns alike (`SELECT a.c, b.c FROM a JOIN b ...`, both `c`), which
//! CSV and PostgreSQL show side by side, but a JSON object would hold twice: parsers keep one of
//! the two, and a value disappeared without a word. So a repeated name gets the first free
//! suffix, `c`, `c_1`, `c_2` (DuckDB's way of naming such columns), in the JSON only.

use std::collections::HashSet;
use std::io::Write;
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{Field, Schema};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::json::writer::{LineDelimited, WriterBuilder};

/// Writes `batches` as JSON lines to `out`.
pub fn write<'a, W: Write>(out: W, batches: impl IntoIterator<Item = &'a RecordBatch>) -> Result<(), ArrowError> {
    let mut writer = WriterBuilder::new().with_explicit_nulls(true).build::<_, LineDelimited>(out);
    for batch in batches {
        writer.write(&with_unique_names(batch)?)?;
    }
    writer.finish()
}

/// `batch` with each repeated column name made unique (see the module doc).
fn with_unique_names(batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
    let schema = batch.schema();
    let mut seen: HashSet<&str> = HashSet::new();
    if schema.fields().iter().all(|f| seen.insert(f.name())) {
        return Ok(batch.clone());
    }
    let mut taken: HashSet<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
    let mut first_use: HashSet<String> = HashSet::new();
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| {
            if first_use.insert(f.name().clone()) {
                return f.as_ref().clone();
            }
            let name = (1..).map(|n| format!("{}_{n}", f.name())).find(|n| !taken.contains(n)).unwrap_or_default();
            taken.insert(name.clone());
            f.as_ref().clone().with_name(name)
        })
        .collect();
    let schema = Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()));
    RecordBatch::try_new(schema, batch.columns().to_vec())
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::DataType;

    use super::*;

    #[test]
    fn repeated_names_get_the_first_free_suffix() {
        let schema = Schema::new(["c", "c_1", "c", "k", "c"].map(|n| Field::new(n, DataType::Int64, true)).to_vec());
        let columns = (1..=5).map(|v| Arc::new(Int64Array::from(vec![v])) as _).collect();
        let batch = RecordBatch::try_new(Arc::new(schema), columns).unwrap();
        let mut out = Vec::new();
        write(&mut out, [&batch]).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "{\"c\":1,\"c_1\":2,\"c_2\":3,\"k\":4,\"c_3\":5}\n");
    }
}
