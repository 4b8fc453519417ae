//! Parquet: round trip of every type, columns by name, casts with overflow checks.

use super::*;
use arrow::array::{
    ArrayRef, BooleanArray, Date32Array, Decimal128Array, Float32Array, Float64Array, Int8Array, Int16Array,
    Int32Array, Int64Array, StringArray, TimestampMicrosecondArray, TimestampNanosecondArray, UInt8Array, UInt16Array,
    UInt32Array, UInt64Array,
};
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::file::properties::WriterProperties;

/// Writes `batch` as Parquet (row groups of `group_rows`) and reads it back as `schema`.
fn round_trip(
    batch: &RecordBatch,
    schema: &SchemaRef,
    batch_rows: usize,
    group_rows: usize,
) -> anyhow::Result<Vec<RecordBatch>> {
    let file = tempfile::tempfile().expect("temp file");
    let properties = WriterProperties::builder().set_max_row_group_row_count(Some(group_rows)).build();
    let mut writer =
        ArrowWriter::try_new(file.try_clone().expect("clone"), batch.schema(), Some(properties)).expect("writer");
    writer.write(batch).expect("write");
    writer.close().expect("close");
    let size = file.metadata().expect("size").len();
    parquet::read(file, size, "data.parquet", schema, batch_rows, &Progress::hidden())
}

fn error(result: anyhow::Result<Vec<RecordBatch>>) -> String {
    match result {
        Ok(batches) => panic!("expected an error, read {} batches", batches.len()),
        Err(e) => format!("{e:#}"),
    }
}

fn every_type_batch() -> RecordBatch {
    let us = [1_706_702_400_123_456, 0];
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int8Array::from(vec![Some(-128), None])),
        Arc::new(Int16Array::from(vec![Some(-32768), Some(32767)])),
        Arc::new(Int32Array::from(vec![i32::MIN, i32::MAX])),
        Arc::new(Int64Array::from(vec![i64::MIN, i64::MAX])),
        Arc::new(UInt8Array::from(vec![0, u8::MAX])),
        Arc::new(UInt16Array::from(vec![0, u16::MAX])),
        Arc::new(UInt32Array::from(vec![0, u32::MAX])),
        Arc::new(UInt64Array::from(vec![0, u64::MAX])),
        Arc::new(Float32Array::from(vec![1.5, f32::MAX])),
        Arc::new(Float64Array::from(vec![-2.25, f64::MAX])),
        Arc::new(Decimal128Array::from(vec![Some(-1_234_567_891), None]).with_precision_and_scale(10, 2).expect("dec")),
        Arc::new(BooleanArray::from(vec![Some(true), None])),
        Arc::new(StringArray::from(vec![Some("é"), None])),
        Arc::new(Date32Array::from(vec![19_782, 0])),
        Arc::new(TimestampMicrosecondArray::from(us.to_vec())),
        Arc::new(TimestampNanosecondArray::from(vec![1_706_702_400_123_456_789, 0])),
        Arc::new(TimestampMicrosecondArray::from(us.to_vec()).with_timezone("UTC")),
        Arc::new(TimestampNanosecondArray::from(vec![1, 2]).with_timezone("UTC")),
    ];
    RecordBatch::try_new(all_types(), columns).expect("batch")
}

#[test]
fn round_trips_every_supported_type() {
    let batch = every_type_batch();
    let batches = round_trip(&batch, &all_types(), 10, 10).expect("read");
    assert_eq!(batches, vec![batch]);
}

#[test]
fn matches_columns_by_name_and_casts_to_the_table_types() {
    // The file has name then id, id as Int32 and without qty; the table wants Int64 and Int8.
    let file = RecordBatch::try_from_iter([
        ("name", Arc::new(StringArray::from(vec!["a", "b"])) as ArrayRef),
        ("id", Arc::new(Int32Array::from(vec![1, 2])) as ArrayRef),
    ])
    .expect("batch");
    let batches = round_trip(&file, &small(), 10, 10).expect("read");
    assert_eq!(
        table(&batches),
        "+----+-----+------+\n\
         | id | qty | name |\n\
         +----+-----+------+\n\
         | 1  |     | a    |\n\
         | 2  |     | b    |\n\
         +----+-----+------+"
    );
    assert_eq!(batches[0].schema(), small());
}

#[test]
fn batches_are_batch_rows_long_across_row_groups() {
    let ids: Vec<i64> = (0..10).collect();
    let file = RecordBatch::try_from_iter([("id", Arc::new(Int64Array::from(ids)) as ArrayRef)]).expect("batch");
    let batches = round_trip(&file, &small(), 4, 3).expect("read");
    assert_eq!(rows(&batches), [4, 4, 2]);
}

#[test]
fn overflow_names_the_row_and_column() {
    let file = RecordBatch::try_from_iter([
        ("id", Arc::new(Int64Array::from(vec![1, 2, 3, 4, 5])) as ArrayRef),
        ("qty", Arc::new(Int64Array::from(vec![1, -128, 127, 0, 300])) as ArrayRef),
    ])
    .expect("batch");
    let err = error(round_trip(&file, &small(), 2, 2));
    assert_eq!(err, "data.parquet row 5, column \"qty\" (file column 2): 300 is out of range for Int8 (-128 to 127)");
}

#[test]
fn other_lossy_casts_are_errors() {
    let float = schema(&[("f", DataType::Float32, true)]);
    let file =
        RecordBatch::try_from_iter([("f", Arc::new(Float64Array::from(vec![1.0, 1e39])) as ArrayRef)]).expect("batch");
    let err = error(round_trip(&file, &float, 10, 10));
    assert_eq!(err, "data.parquet row 2, column \"f\" (file column 1): 1e39 is out of range for Float32");

    let decimal = schema(&[("d", DataType::Decimal128(5, 2), true)]);
    let wide = Decimal128Array::from(vec![12_345, 12_345_678]).with_precision_and_scale(10, 2).expect("dec");
    let file = RecordBatch::try_from_iter([("d", Arc::new(wide) as ArrayRef)]).expect("batch");
    let err = error(round_trip(&file, &decimal, 10, 10));
    assert_eq!(
        err,
        "data.parquet row 2, column \"d\" (file column 1): 123456.78 does not fit Decimal128(5, 2) (at most 3 digits before the decimal point, once rounded to 2 decimals)"
    );

    let text =
        RecordBatch::try_from_iter([("id", Arc::new(StringArray::from(vec!["1", "x"])) as ArrayRef)]).expect("batch");
    let err = error(round_trip(&text, &small(), 10, 10));
    assert_eq!(err, "data.parquet row 2, column \"id\" (file column 1): \"x\" is not an integer (column type Int64)");
}

#[test]
fn fractions_into_integers_are_errors_and_numbers_into_timestamps_are_seconds() {
    // Arrow's cast would store 18 for 18.7, and read 1700000000 as nanoseconds.
    let floats =
        RecordBatch::try_from_iter([("id", Arc::new(Float64Array::from(vec![3.0, 18.7])) as ArrayRef)]).expect("batch");
    let err = error(round_trip(&floats, &small(), 10, 10));
    assert_eq!(err, "data.parquet row 2, column \"id\" (file column 1): 18.7 is not an integer (column type Int64)");
    let whole =
        RecordBatch::try_from_iter([("id", Arc::new(Float64Array::from(vec![3.0, -4.0])) as ArrayRef)]).expect("batch");
    let batches = round_trip(&whole, &small(), 10, 10).expect("whole floats");
    use arrow::array::AsArray;
    assert_eq!(batches[0].column(0).as_primitive::<arrow::datatypes::Int64Type>().values(), &[3, -4]);

    let ts = schema(&[("ts", DataType::Timestamp(arrow::datatypes::TimeUnit::Nanosecond, None), true)]);
    let epoch = RecordBatch::try_from_iter([(
        "ts",
        Arc::new(arrow::array::Int64Array::from(vec![1_700_000_000, 10_000_000_000_000])) as ArrayRef,
    )])
    .expect("batch");
    let err = error(round_trip(&epoch, &ts, 10, 10));
    assert!(
        err.starts_with(
            "data.parquet row 2, column \"ts\" (file column 1): 10000000000000 (seconds since 1970) is out of range"
        ),
        "{err}"
    );
    let batches = round_trip(&epoch.slice(0, 1), &ts, 10, 10).expect("seconds");
    let shown = arrow::util::pretty::pretty_format_batches(&batches).expect("shown").to_string();
    assert!(shown.contains("2023-11-14T22:13:20"), "{shown}");
}

#[test]
fn unknown_and_missing_columns() {
    let file = RecordBatch::try_from_iter([
        ("id", Arc::new(Int64Array::from(vec![1])) as ArrayRef),
        ("colour", Arc::new(StringArray::from(vec!["red"])) as ArrayRef),
    ])
    .expect("batch");
    let err = error(round_trip(&file, &small(), 10, 10));
    assert!(err.starts_with("data.parquet, column \"colour\" (file column 2): the table has no such column;"), "{err}");

    let file = RecordBatch::try_from_iter([("qty", Arc::new(Int8Array::from(vec![1])) as ArrayRef)]).expect("batch");
    let err = error(round_trip(&file, &small(), 10, 10));
    assert_eq!(err, "data.parquet: no column \"id\", which the table requires (NOT NULL)");

    let file = RecordBatch::try_from_iter([("id", Arc::new(Int64Array::from(vec![Some(1), None])) as ArrayRef)])
        .expect("batch");
    let err = error(round_trip(&file, &small(), 10, 10));
    assert_eq!(err, "data.parquet row 2, column \"id\" (file column 1): NULL, but the column is NOT NULL");
}

#[test]
fn a_column_of_the_null_type_loads_as_nulls() {
    // What pyarrow writes for a column of only None.
    let file = RecordBatch::try_from_iter([
        ("id", Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef),
        ("name", Arc::new(arrow::array::NullArray::new(2)) as ArrayRef),
    ])
    .expect("batch");
    let batches = round_trip(&file, &small(), 10, 10).expect("a null column loads");
    let name = batches[0].column(2);
    assert_eq!((name.data_type(), name.len(), name.null_count()), (&DataType::Utf8, 2, 2));
}

#[test]
fn an_empty_file_loads_no_rows() {
    let empty = RecordBatch::new_empty(small());
    assert_eq!(rows(&round_trip(&empty, &small(), 10, 10).expect("read")), Vec::<usize>::new());
}

#[test]
fn not_parquet_is_a_clear_error() {
    let mut file = tempfile::tempfile().expect("temp file");
    std::io::Write::write_all(&mut file, b"id,qty\n1,2\n").expect("write");
    let err = error(parquet::read(file, 11, "data.parquet", &small(), 10, &Progress::hidden()));
    assert_eq!(err, "data.parquet is not a readable Parquet file: Parquet error: Invalid Parquet file. Corrupt footer");
}

#[test]
fn a_number_for_a_date_and_a_date_no_client_could_read_are_errors() {
    let schema: SchemaRef = Arc::new(Schema::new(vec![Field::new("day", DataType::Date32, true)]));
    // Arrow's cast would read 20240101 as days since 1970: the year 57385.
    let numbers =
        RecordBatch::try_from_iter([("day", Arc::new(Int32Array::from(vec![None, Some(20_240_101)])) as ArrayRef)])
            .expect("batch");
    let err = error(round_trip(&numbers, &schema, 10, 10));
    assert!(err.contains("row 2") && err.contains("20240101 is a number, not a date"), "{err}");
    let far = RecordBatch::try_from_iter([("day", Arc::new(Date32Array::from(vec![0, -99_999_999])) as ArrayRef)])
        .expect("batch");
    let err = error(round_trip(&far, &schema, 10, 10));
    assert!(err.contains("row 2") && err.contains("beyond the dates a DATE holds"), "{err}");
    let nulls =
        RecordBatch::try_from_iter([("day", Arc::new(Int32Array::from(vec![None, None])) as ArrayRef)]).expect("batch");
    assert_eq!(round_trip(&nulls, &schema, 10, 10).expect("all NULL")[0].column(0).null_count(), 2);
}

/// A list for a text column: Arrow's cast would store its debug text (`[1, 2]`).
#[test]
fn a_nested_column_is_refused_not_stored_as_text() {
    let list = arrow::array::ListArray::from_iter_primitive::<arrow::datatypes::Int64Type, _, _>(vec![
        Some(vec![Some(1), Some(2)]),
        Some(vec![Some(3)]),
    ]);
    let file = RecordBatch::try_from_iter([
        ("id", Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef),
        ("name", Arc::new(list) as ArrayRef),
    ])
    .expect("batch");
    let err = error(round_trip(&file, &small(), 10, 10));
    assert!(err.starts_with("data.parquet, column \"name\" (file column 2): the file's type List("), "{err}");
    assert!(err.contains("is nested (a list, struct, map or union)"), "{err}");
}
