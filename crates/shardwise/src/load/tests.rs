//! Tests of the readers: every malformed input names its file, line (or row) and column exactly.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::util::pretty::pretty_format_batches;

use super::progress::Progress;
use super::{Format, csv, ndjson, parquet};

fn schema(fields: &[(&str, DataType, bool)]) -> SchemaRef {
    Arc::new(Schema::new(
        fields
            .iter()
            .map(|(name, data_type, nullable)| Field::new(*name, data_type.clone(), *nullable))
            .collect::<Vec<_>>(),
    ))
}

/// A small table: `id Int64 NOT NULL, qty Int8, name Utf8`.
fn small() -> SchemaRef {
    schema(&[("id", DataType::Int64, false), ("qty", DataType::Int8, true), ("name", DataType::Utf8, true)])
}

/// Every supported column type, nullable.
fn all_types() -> SchemaRef {
    let utc = Some("UTC".into());
    schema(&[
        ("i8", DataType::Int8, true),
        ("i16", DataType::Int16, true),
        ("i32", DataType::Int32, true),
        ("i64", DataType::Int64, true),
        ("u8", DataType::UInt8, true),
        ("u16", DataType::UInt16, true),
        ("u32", DataType::UInt32, true),
        ("u64", DataType::UInt64, true),
        ("f32", DataType::Float32, true),
        ("f64", DataType::Float64, true),
        ("dec", DataType::Decimal128(10, 2), true),
        ("ok", DataType::Boolean, true),
        ("s", DataType::Utf8, true),
        ("day", DataType::Date32, true),
        ("ts_us", DataType::Timestamp(TimeUnit::Microsecond, None), true),
        ("ts_ns", DataType::Timestamp(TimeUnit::Nanosecond, None), true),
        ("ts_us_utc", DataType::Timestamp(TimeUnit::Microsecond, utc.clone()), true),
        ("ts_ns_utc", DataType::Timestamp(TimeUnit::Nanosecond, utc), true),
    ])
}

fn read_csv(text: &[u8], schema: &SchemaRef, batch_rows: usize) -> anyhow::Result<Vec<RecordBatch>> {
    csv::read(text, "data.csv", schema, batch_rows, &Progress::hidden())
}

fn csv_error(text: &str, schema: &SchemaRef) -> String {
    csv_error_bytes(text.as_bytes(), schema)
}

fn csv_error_bytes(text: &[u8], schema: &SchemaRef) -> String {
    match read_csv(text, schema, 2) {
        Ok(batches) => panic!("expected an error, read {} batches", batches.len()),
        Err(e) => format!("{e:#}"),
    }
}

fn read_ndjson(text: &[u8], schema: &SchemaRef, batch_rows: usize) -> anyhow::Result<Vec<RecordBatch>> {
    ndjson::read(text, "data.ndjson", schema, batch_rows, &Progress::hidden())
}

fn ndjson_error(text: &str, schema: &SchemaRef) -> String {
    match read_ndjson(text.as_bytes(), schema, 2) {
        Ok(batches) => panic!("expected an error, read {} batches", batches.len()),
        Err(e) => format!("{e:#}"),
    }
}

fn table(batches: &[RecordBatch]) -> String {
    pretty_format_batches(batches).expect("format").to_string()
}

fn rows(batches: &[RecordBatch]) -> Vec<usize> {
    batches.iter().map(RecordBatch::num_rows).collect()
}

mod format {
    use super::*;
    use std::path::Path;

    #[test]
    fn from_the_extension() {
        assert_eq!(Format::from_path(Path::new("a.csv")).expect("csv"), Format::Csv);
        assert_eq!(Format::from_path(Path::new("a.CSV")).expect("csv"), Format::Csv);
        assert_eq!(Format::from_path(Path::new("a.parquet")).expect("parquet"), Format::Parquet);
        assert_eq!(Format::from_path(Path::new("a.ndjson")).expect("ndjson"), Format::Ndjson);
        assert_eq!(Format::from_path(Path::new("a.jsonl")).expect("jsonl"), Format::Ndjson);
        assert_eq!(Format::from_path(Path::new("a.json")).expect("json"), Format::Ndjson);
        let gz = Format::from_path(Path::new("a.csv.gz")).expect_err("gz").to_string();
        assert_eq!(gz, "a.csv.gz is compressed, which load does not read: decompress it first");
        let unknown = Format::from_path(Path::new("a.txt")).expect_err("txt").to_string();
        assert_eq!(unknown, "cannot tell the format of a.txt from its extension: pass --format csv, parquet or ndjson");
    }
}

mod csv_input;
mod ndjson_input;
mod parquet_input;

/// The table of the db-benchmark groupby data (`bench/gen_groupby_csv.py`): `id1..id3` text.
fn groupby() -> SchemaRef {
    schema(&[
        ("id1", DataType::Utf8, true),
        ("id2", DataType::Utf8, true),
        ("id3", DataType::Utf8, true),
        ("id4", DataType::Int32, true),
        ("id5", DataType::Int32, true),
        ("id6", DataType::Int32, true),
        ("v1", DataType::Int32, true),
        ("v2", DataType::Int32, true),
        ("v3", DataType::Float64, true),
    ])
}

/// Reads `path` with the groupby schema and prints the time it took.
fn time_read(path: &str, format: Format) {
    let started = std::time::Instant::now();
    let batches = super::read_file(path.as_ref(), format, &groupby(), 65_536, &Progress::hidden()).expect("read");
    let elapsed = started.elapsed();
    let mib = batches.iter().map(RecordBatch::get_array_memory_size).sum::<usize>() >> 20;
    println!(
        "{path}: {} rows in {} batches in {:.3} s ({mib} MiB in memory)",
        rows(&batches).iter().sum::<usize>(),
        batches.len(),
        elapsed.as_secs_f64()
    );
}

/// Times reading the 10M-row groupby CSV (`/tmp/G1_1e7.csv`); run in release with
/// `cargo test --release -p shardwise --bin shardwise -- --ignored read_speed --nocapture`.
#[test]
#[ignore = "a benchmark: needs /tmp/G1_1e7.csv and a release build"]
fn read_speed() {
    time_read("/tmp/G1_1e7.csv", Format::Csv);
}

/// Times reading its first 2M rows as NDJSON (`/tmp/G1_2e6.ndjson`, one object per row).
#[test]
#[ignore = "a benchmark: needs /tmp/G1_2e6.ndjson and a release build"]
fn read_speed_ndjson() {
    time_read("/tmp/G1_2e6.ndjson", Format::Ndjson);
}
