//! `FORMAT Parquet`, `ArrowStream` and `Arrow` rows: typed columns, read by Arrow's readers and
//! made into the table's columns as a Flight SQL bulk ingest's are (`crate::ingest_schema`:
//! matched by name, cast with checks, a missing nullable column NULL).
//!
//! Why: a ClickHouse user posts a Parquet or Arrow file with `curl --data-binary @f.parquet
//! '...?query=INSERT INTO t FORMAT Parquet'`; the types travel with the data, so nothing is
//! parsed from text.
//!
//! A small body can decode to far more (a Parquet file compresses runs of one value to a few
//! bytes): the decoded rows are bounded by [`HTTP_INSERT_MAX_DECODED_BYTES`], and the whole file
//! is read and checked before anything is stored.

use std::io::Cursor;

use bytes::Bytes;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::ipc::reader::FileReader;
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use shardwise_query::QueryError;

/// The most memory the rows of one `INSERT ... FORMAT Parquet | ArrowStream | Arrow` may take
/// once decoded; a larger file goes through `shardwise load`, which sends it in parts.
pub const HTTP_INSERT_MAX_DECODED_BYTES: usize = 1024 * 1024 * 1024;

/// A format whose columns carry their types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TypedFormat {
    /// A Parquet file.
    Parquet,
    /// An Arrow IPC stream (what the HTTP API answers with `FORMAT ArrowStream`).
    ArrowStream,
    /// An Arrow IPC file (Feather v2).
    ArrowFile,
}

impl TypedFormat {
    fn name(self) -> &'static str {
        match self {
            TypedFormat::Parquet => "Parquet",
            TypedFormat::ArrowStream => "ArrowStream",
            TypedFormat::ArrowFile => "Arrow",
        }
    }
}

/// The rows of `data`, with `table`'s columns (`schema`). `stated`, the statement's column list
/// when it has one, must name the columns the file holds.
pub fn batches(
    format: TypedFormat,
    table: &str,
    stated: &[String],
    data: &Bytes,
    schema: &SchemaRef,
) -> Result<Vec<RecordBatch>, QueryError> {
    // arrow's and parquet's decoders panic on some malformed input (an Arrow schema whose
    // integer is 0x7ffffff0 bits wide did): a 400, as for any other body that does not decode.
    let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        crate::flight_decode::quietly(|| decode(format, table, stated, data, schema))
    }));
    decoded.unwrap_or_else(|panic| {
        let why = crate::flight_decode::panic_text(&*panic);
        Err(QueryError::Rejected(format!(
            "INSERT INTO {table} FORMAT {}: the body is not {} ({why})",
            format.name(),
            format.name()
        )))
    })
}

fn decode(
    format: TypedFormat,
    table: &str,
    stated: &[String],
    data: &Bytes,
    schema: &SchemaRef,
) -> Result<Vec<RecordBatch>, QueryError> {
    // No body is no rows, as an empty CSV body is.
    if data.is_empty() {
        return Ok(Vec::new());
    }
    let what = format!("INSERT INTO {table} FORMAT {}", format.name());
    let unreadable = |e: ArrowError| QueryError::Rejected(format!("{what}: the body is not {} ({e})", format.name()));
    let batches: Box<dyn Iterator<Item = Result<RecordBatch, ArrowError>>> = match format {
        TypedFormat::Parquet => Box::new(
            ParquetRecordBatchReaderBuilder::try_new(data.clone())
                .and_then(|b| b.build())
                .map_err(|e| unreadable(e.into()))?,
        ),
        // Not arrow's readers as they are: they allocate what the body claims (`ipc_body`).
        TypedFormat::ArrowStream => Box::new(super::ipc_body::stream_batches(data)),
        TypedFormat::ArrowFile => {
            super::ipc_body::check_file_blocks(data).map_err(unreadable)?;
            Box::new(FileReader::try_new(Cursor::new(data.clone()), None).map_err(unreadable)?)
        }
    };
    let mut out = Vec::new();
    let mut decoded_bytes = 0usize;
    for batch in batches {
        let batch = batch.map_err(unreadable)?;
        decoded_bytes += batch.get_array_memory_size();
        if decoded_bytes > HTTP_INSERT_MAX_DECODED_BYTES {
            return Err(QueryError::Rejected(format!(
                "{what}: the rows take over {HTTP_INSERT_MAX_DECODED_BYTES} bytes decoded \
                 (HTTP_INSERT_MAX_DECODED_BYTES); load the file with `shardwise load`, which sends it in parts"
            )));
        }
        if out.is_empty() {
            check_stated(&what, stated, &batch.schema())?;
        }
        let batch = crate::ingest_schema::conform(table, batch, schema, "nothing was stored").map_err(|status| {
            let message = status.message();
            let message = message.strip_prefix(&format!("ingest into {table}: ")).unwrap_or(message);
            QueryError::Rejected(format!("{what}: {message}"))
        })?;
        out.push(batch);
    }
    Ok(out)
}

/// The statement's column list, when it has one, and the file's columns must be the same names
/// (in any order, a name matched exactly or else ignoring case, as the table's are).
fn check_stated(what: &str, stated: &[String], given: &SchemaRef) -> Result<(), QueryError> {
    if stated.is_empty() {
        return Ok(());
    }
    let same = |a: &str, b: &str| a == b || a.eq_ignore_ascii_case(b);
    if let Some(field) = given.fields().iter().find(|f| !stated.iter().any(|s| same(s, f.name()))) {
        return Err(QueryError::Rejected(format!(
            "{what}: the rows have column {:?}, which the statement's columns ({}) leave out",
            field.name(),
            stated.join(", ")
        )));
    }
    if let Some(name) = stated.iter().find(|s| !given.fields().iter().any(|f| same(s, f.name()))) {
        return Err(QueryError::Rejected(format!("{what}: the statement names column {name:?}, which the rows lack")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{Array, AsArray, Int32Array, Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
    use datafusion::arrow::ipc::writer::{FileWriter, StreamWriter};
    use datafusion::parquet::arrow::ArrowWriter;

    use super::*;

    fn table() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("name", DataType::Utf8, true),
            Field::new("v", DataType::Float64, true),
        ]))
    }

    /// Two columns in another order and another integer width than the table's.
    fn given() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("NAME", DataType::Utf8, true),
            Field::new("id", DataType::Int32, false),
        ]));
        RecordBatch::try_new(
            schema,
            vec![Arc::new(StringArray::from(vec!["a", "b"])), Arc::new(Int32Array::from(vec![1, 2]))],
        )
        .unwrap()
    }

    fn encoded(format: TypedFormat, batch: &RecordBatch) -> Bytes {
        let mut out = Vec::new();
        match format {
            TypedFormat::Parquet => {
                let mut w = ArrowWriter::try_new(&mut out, batch.schema(), None).unwrap();
                w.write(batch).unwrap();
                w.close().unwrap();
            }
            TypedFormat::ArrowStream => {
                let mut w = StreamWriter::try_new(&mut out, &batch.schema()).unwrap();
                w.write(batch).unwrap();
                w.finish().unwrap();
            }
            TypedFormat::ArrowFile => {
                let mut w = FileWriter::try_new(&mut out, &batch.schema()).unwrap();
                w.write(batch).unwrap();
                w.finish().unwrap();
            }
        }
        Bytes::from(out)
    }

    /// An Arrow schema whose integer column claims an absurd width panics arrow's decoder (a
    /// tester's attack): the body is refused, the handler does not panic.
    #[test]
    fn a_body_that_panics_the_decoder_is_refused() {
        let data = encoded(TypedFormat::ArrowStream, &given());
        // `given`'s Int32 column: its bit width, 32, written as a little-endian i32 in the schema.
        let widths: Vec<usize> = (0..data.len() - 4).filter(|&i| data[i..i + 4] == 32i32.to_le_bytes()).collect();
        let mut panicked = 0;
        for at in widths {
            let mut bad = data.to_vec();
            bad[at..at + 4].copy_from_slice(&0x7fff_fff0i32.to_le_bytes());
            let bad = Bytes::from(bad);
            let raw = std::panic::catch_unwind(|| decode(TypedFormat::ArrowStream, "t", &[], &bad, &table()));
            panicked += usize::from(raw.is_err());
            // Never a panic from `batches`; an error or, where the change did not matter, rows.
            let _ = batches(TypedFormat::ArrowStream, "t", &[], &bad, &table());
        }
        assert!(panicked > 0, "no variant panicked the decoder: the test no longer covers the guard");
    }

    #[test]
    fn each_format_is_read_into_the_tables_columns() {
        for format in [TypedFormat::Parquet, TypedFormat::ArrowStream, TypedFormat::ArrowFile] {
            let data = encoded(format, &given());
            let out = batches(format, "t", &[], &data, &table()).unwrap();
            assert_eq!(out.len(), 1, "{format:?}");
            let b = &out[0];
            assert_eq!(b.schema(), table());
            assert_eq!(b.column(0).as_primitive::<Int64Type>(), &Int64Array::from(vec![1, 2]));
            assert_eq!(b.column(1).as_string::<i32>().value(1), "b");
            assert_eq!(b.column(2).null_count(), 2, "a column the file lacks is NULL");
            // The statement's columns, in another order and case, name the same ones.
            let stated = vec!["id".to_string(), "name".to_string()];
            assert_eq!(batches(format, "t", &stated, &data, &table()).unwrap()[0].num_rows(), 2);
        }
    }

    #[test]
    fn bad_bodies_and_columns_are_named() {
        assert!(batches(TypedFormat::Parquet, "t", &[], &Bytes::new(), &table()).unwrap().is_empty());
        let err = batches(TypedFormat::Parquet, "t", &[], &Bytes::from_static(b"1,a\n"), &table()).unwrap_err();
        assert!(err.to_string().contains("INSERT INTO t FORMAT Parquet: the body is not Parquet"), "{err}");
        let err = batches(TypedFormat::ArrowStream, "t", &[], &Bytes::from_static(b"PAR1"), &table()).unwrap_err();
        assert!(err.to_string().contains("the body is not ArrowStream"), "{err}");
        let data = encoded(TypedFormat::ArrowStream, &given());
        let err = batches(TypedFormat::ArrowStream, "t", &["id".into()], &data, &table()).unwrap_err();
        assert!(err.to_string().contains("the rows have column \"NAME\", which the statement's columns (id)"), "{err}");
        let stated = vec!["id".into(), "name".into(), "v".into()];
        let err = batches(TypedFormat::ArrowStream, "t", &stated, &data, &table()).unwrap_err();
        assert!(err.to_string().contains("names column \"v\", which the rows lack"), "{err}");
        // A column the table lacks, or a value that does not fit, as a bulk ingest says it.
        let other = Arc::new(Schema::new(vec![Field::new("id", DataType::Utf8, true)]));
        let text = RecordBatch::try_new(other, vec![Arc::new(StringArray::from(vec!["x"]))]).unwrap();
        let err = batches(TypedFormat::Parquet, "t", &[], &encoded(TypedFormat::Parquet, &text), &table()).unwrap_err();
        let err = err.to_string();
        assert!(
            err.starts_with("INSERT INTO t FORMAT Parquet: column \"id\"") && err.contains("nothing was stored"),
            "{err}"
        );
    }
}
