//! Arrow results as PostgreSQL rows: each Arrow type gets the PostgreSQL type a client expects
//! (`bigint`, `double precision`, `numeric`, `text`, `date`, `timestamp`, ...), and values are
//! written in the text or binary format the client asked for, by pgwire's encoders. A list of
//! one of those is a PostgreSQL array of it (`array_agg` of integers reads `{1,NULL,3}` in psql
//! and a `list` in psycopg). Intervals and durations (a timestamp minus a timestamp) are
//! PostgreSQL `interval`s (`1 day 02:00:03.500000`; a `timedelta` in psycopg), a duration's whole days
//! as days, as PostgreSQL gives a timestamp difference. Types PostgreSQL has no match for
//! (structs, maps, lists of lists or of binary) are sent as `text` in Arrow's display form.

use std::ops::Range;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Date32Array, Decimal128Array, DurationMicrosecondArray, Float32Array,
    Float64Array, Int16Array, Int32Array, Int64Array, IntervalMonthDayNanoArray, LargeBinaryArray, ListArray,
    StringArray, Time64MicrosecondArray, TimestampMicrosecondArray,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, IntervalUnit, Schema, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use pgwire::api::Type;
use pgwire::api::portal::Format;
use pgwire::api::results::{DataRowEncoder, FieldInfo};
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::data::DataRow;

use super::float::{Float4, Float8};
use super::numeric::Numeric;

/// The PostgreSQL type a parameter of Arrow type `data_type` is described as.
pub fn parameter_type(data_type: &DataType) -> Type {
    pg_type(data_type).0
}

/// The PostgreSQL type an Arrow column is sent as, and the Arrow type it is cast to first.
fn pg_type(data_type: &DataType) -> (Type, DataType) {
    use DataType as D;
    match data_type {
        D::Boolean => (Type::BOOL, D::Boolean),
        D::Int8 | D::Int16 | D::UInt8 => (Type::INT2, D::Int16),
        D::Int32 | D::UInt16 => (Type::INT4, D::Int32),
        D::Int64 | D::UInt32 => (Type::INT8, D::Int64),
        // No unsigned 64-bit type in PostgreSQL: numeric holds every value.
        D::UInt64 => (Type::NUMERIC, D::Decimal128(20, 0)),
        D::Float16 | D::Float32 => (Type::FLOAT4, D::Float32),
        D::Float64 => (Type::FLOAT8, D::Float64),
        D::Decimal32(p, s) | D::Decimal64(p, s) | D::Decimal128(p, s) => (Type::NUMERIC, D::Decimal128(*p, *s)),
        D::Utf8 | D::LargeUtf8 | D::Utf8View => (Type::TEXT, D::Utf8),
        D::Binary | D::LargeBinary | D::BinaryView | D::FixedSizeBinary(_) => (Type::BYTEA, D::LargeBinary),
        D::Date32 | D::Date64 => (Type::DATE, D::Date32),
        D::Timestamp(_, None) => (Type::TIMESTAMP, D::Timestamp(TimeUnit::Microsecond, None)),
        D::Timestamp(_, Some(_)) => (Type::TIMESTAMPTZ, D::Timestamp(TimeUnit::Microsecond, Some(Arc::from("+00:00")))),
        D::Time32(_) | D::Time64(_) => (Type::TIME, D::Time64(TimeUnit::Microsecond)),
        D::Interval(_) => (Type::INTERVAL, D::Interval(IntervalUnit::MonthDayNano)),
        D::Duration(_) => (Type::INTERVAL, D::Duration(TimeUnit::Microsecond)),
        D::Dictionary(_, value) => pg_type(value),
        D::List(element) | D::LargeList(element) | D::FixedSizeList(element, _) => match array_type(element) {
            Some((array, target)) => (array, D::List(Arc::new(Field::new_list_field(target, true)))),
            None => (Type::TEXT, D::Utf8),
        },
        _ => (Type::TEXT, D::Utf8),
    }
}

/// The PostgreSQL array type of a list of `element`, and the Arrow type its elements are cast to;
/// `None` when the element has no array type here (it is nested, binary, or sent as text).
fn array_type(element: &Field) -> Option<(Type, DataType)> {
    let (scalar, target) = pg_type(element.data_type());
    let array = match scalar {
        Type::BOOL => Type::BOOL_ARRAY,
        Type::INT2 => Type::INT2_ARRAY,
        Type::INT4 => Type::INT4_ARRAY,
        Type::INT8 => Type::INT8_ARRAY,
        Type::FLOAT4 => Type::FLOAT4_ARRAY,
        Type::FLOAT8 => Type::FLOAT8_ARRAY,
        Type::NUMERIC => Type::NUMERIC_ARRAY,
        Type::DATE => Type::DATE_ARRAY,
        Type::TIMESTAMP => Type::TIMESTAMP_ARRAY,
        Type::TIMESTAMPTZ => Type::TIMESTAMPTZ_ARRAY,
        // Text only when the elements are strings, not the display text of something nested.
        Type::TEXT if target == DataType::Utf8 && !element.data_type().is_nested() => Type::TEXT_ARRAY,
        _ => return None,
    };
    Some((array, target))
}

/// The row description of a result: one field per column, in the format the client asked for.
pub fn fields(schema: &Schema, format: &Format) -> Vec<FieldInfo> {
    schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, field)| {
            FieldInfo::new(field.name().clone(), None, None, pg_type(field.data_type()).0, format.format_for(i))
        })
        .collect()
}

/// Every field in text format (the simple query protocol).
pub fn text_format() -> Format {
    Format::UnifiedText
}

/// One column, cast to the Arrow type its PostgreSQL type is written from.
enum Column {
    Bool(BooleanArray),
    I16(Int16Array),
    I32(Int32Array),
    I64(Int64Array),
    F32(Float32Array),
    F64(Float64Array),
    Numeric(Decimal128Array, u32),
    Text(StringArray),
    Bytes(LargeBinaryArray),
    Date(Date32Array),
    Timestamp(TimestampMicrosecondArray),
    TimestampTz(TimestampMicrosecondArray),
    Time(Time64MicrosecondArray),
    Interval(IntervalMonthDayNanoArray),
    Duration(DurationMicrosecondArray),
    /// A list whose elements are the column inside (over the list's values).
    List(ListArray, Box<Column>),
}

fn conversion_error(field: &Field, e: impl std::fmt::Display) -> PgWireError {
    PgWireError::ApiError(format!("cannot send column {:?} ({}): {e}", field.name(), field.data_type()).into())
}

impl Column {
    fn new(field: &Field, array: &ArrayRef) -> PgWireResult<Column> {
        let (pg, target) = pg_type(field.data_type());
        if pg == Type::TEXT && !matches!(array.data_type(), DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) {
            return Ok(Column::Text(display_strings(array).map_err(|e| conversion_error(field, e))?));
        }
        // Nanoseconds are cut to microseconds toward the past, as they are stored: Arrow's cast
        // divides toward zero, and showed 1969-12-31 23:59:59.999999999 as 1970-01-01.
        let cast = match shardwise_query::time_floor::floored(array, &target) {
            Some(floored) => cast(&floored, &target),
            None => cast(array, &target),
        }
        .map_err(|e| conversion_error(field, e))?;
        Ok(match target {
            DataType::Boolean => Column::Bool(cast.as_boolean().clone()),
            DataType::Int16 => Column::I16(cast.as_primitive().clone()),
            DataType::Int32 => Column::I32(cast.as_primitive().clone()),
            DataType::Int64 => Column::I64(cast.as_primitive().clone()),
            DataType::Float32 => Column::F32(cast.as_primitive().clone()),
            DataType::Float64 => Column::F64(cast.as_primitive().clone()),
            DataType::Decimal128(_, scale) => {
                let scale = u32::try_from(scale).map_err(|_| conversion_error(field, "negative decimal scale"))?;
                Column::Numeric(cast.as_primitive().clone(), scale)
            }
            DataType::Utf8 => Column::Text(cast.as_string::<i32>().clone()),
            DataType::LargeBinary => Column::Bytes(cast.as_binary::<i64>().clone()),
            DataType::Date32 => Column::Date(cast.as_primitive().clone()),
            DataType::Timestamp(_, None) => Column::Timestamp(cast.as_primitive().clone()),
            DataType::Timestamp(_, Some(_)) => Column::TimestampTz(cast.as_primitive().clone()),
            DataType::Time64(_) => Column::Time(cast.as_primitive().clone()),
            DataType::Interval(_) => Column::Interval(cast.as_primitive().clone()),
            DataType::Duration(_) => Column::Duration(cast.as_primitive().clone()),
            DataType::List(element) => {
                let list = cast.as_list::<i32>().clone();
                let values = Column::new(&element, list.values())?;
                Column::List(list, Box::new(values))
            }
            other => return Err(conversion_error(field, format!("no encoder for {other}"))),
        })
    }

    fn encode(&self, row: usize, encoder: &mut DataRowEncoder) -> PgWireResult<()> {
        fn opt<A: Array, T>(a: &A, row: usize, f: impl FnOnce() -> T) -> Option<T> {
            if a.is_null(row) { None } else { Some(f()) }
        }
        match self {
            Column::Bool(a) => encoder.encode_field(&opt(a, row, || a.value(row))),
            Column::I16(a) => encoder.encode_field(&opt(a, row, || a.value(row))),
            Column::I32(a) => encoder.encode_field(&opt(a, row, || a.value(row))),
            Column::I64(a) => encoder.encode_field(&opt(a, row, || a.value(row))),
            Column::F32(a) => encoder.encode_field(&opt(a, row, || Float4(a.value(row)))),
            Column::F64(a) => encoder.encode_field(&opt(a, row, || Float8(a.value(row)))),
            Column::Numeric(a, scale) => {
                encoder.encode_field(&opt(a, row, || Numeric { value: a.value(row), scale: *scale }))
            }
            Column::Text(a) => encoder.encode_field(&opt(a, row, || a.value(row))),
            Column::Bytes(a) => encoder.encode_field(&opt(a, row, || a.value(row))),
            Column::Date(a) => encoder.encode_field(&a.value_as_date(row).filter(|_| !a.is_null(row))),
            Column::Timestamp(a) => encoder.encode_field(&a.value_as_datetime(row).filter(|_| !a.is_null(row))),
            Column::TimestampTz(a) => {
                encoder.encode_field(&a.value_as_datetime(row).filter(|_| !a.is_null(row)).map(|t| t.and_utc()))
            }
            Column::Time(a) => encoder.encode_field(&a.value_as_time(row).filter(|_| !a.is_null(row))),
            Column::Interval(a) => encoder.encode_field(&opt(a, row, || interval(a.value(row)))),
            Column::Duration(a) => encoder.encode_field(&opt(a, row, || duration(a.value(row)))),
            Column::List(list, values) if list.is_null(row) => values.encode_elements(None, encoder),
            Column::List(list, values) => {
                let offsets = list.value_offsets();
                let (start, end) = (offsets[row] as usize, offsets[row + 1] as usize);
                values.encode_elements(Some(start..end), encoder)
            }
        }
    }

    /// The elements `rows` of this column as one PostgreSQL array (NULL when `rows` is `None`).
    fn encode_elements(&self, rows: Option<Range<usize>>, encoder: &mut DataRowEncoder) -> PgWireResult<()> {
        /// `f` of each element in `rows` that is not NULL.
        fn each<A: Array, T>(
            a: &A,
            rows: &Option<Range<usize>>,
            f: impl Fn(usize) -> Option<T>,
        ) -> Option<Vec<Option<T>>> {
            rows.clone().map(|r| r.map(|i| if a.is_null(i) { None } else { f(i) }).collect())
        }
        match self {
            Column::Bool(a) => encoder.encode_field(&each(a, &rows, |i| Some(a.value(i)))),
            Column::I16(a) => encoder.encode_field(&each(a, &rows, |i| Some(a.value(i)))),
            Column::I32(a) => encoder.encode_field(&each(a, &rows, |i| Some(a.value(i)))),
            Column::I64(a) => encoder.encode_field(&each(a, &rows, |i| Some(a.value(i)))),
            Column::F32(a) => encoder.encode_field(&each(a, &rows, |i| Some(Float4(a.value(i))))),
            Column::F64(a) => encoder.encode_field(&each(a, &rows, |i| Some(Float8(a.value(i))))),
            Column::Numeric(a, scale) => {
                encoder.encode_field(&each(a, &rows, |i| Some(Numeric { value: a.value(i), scale: *scale })))
            }
            Column::Text(a) => encoder.encode_field(&each(a, &rows, |i| Some(a.value(i)))),
            Column::Date(a) => encoder.encode_field(&each(a, &rows, |i| a.value_as_date(i))),
            Column::Timestamp(a) => encoder.encode_field(&each(a, &rows, |i| a.value_as_datetime(i))),
            Column::TimestampTz(a) => {
                encoder.encode_field(&each(a, &rows, |i| a.value_as_datetime(i).map(|t| t.and_utc())))
            }
            // `array_type` gives none of them an array type.
            Column::Bytes(_) | Column::Time(_) | Column::Interval(_) | Column::Duration(_) | Column::List(..) => {
                Err(PgWireError::ApiError("a list of binary values or of lists has no array encoder".into()))
            }
        }
    }
}

/// An Arrow interval as PostgreSQL's (microseconds: PostgreSQL keeps no nanoseconds).
fn interval(value: datafusion::arrow::datatypes::IntervalMonthDayNano) -> pg_interval::Interval {
    pg_interval::Interval { months: value.months, days: value.days, microseconds: value.nanoseconds / 1_000 }
}

/// A duration in microseconds as the interval PostgreSQL gives a timestamp difference: whole
/// days as days (`2 days 02:00:00`, not `50:00:00`), no months.
fn duration(microseconds: i64) -> pg_interval::Interval {
    const MICROSECONDS_PER_DAY: i64 = 86_400_000_000;
    let days = microseconds / MICROSECONDS_PER_DAY;
    pg_interval::Interval {
        months: 0,
        days: i32::try_from(days).unwrap_or(if days < 0 { i32::MIN } else { i32::MAX }),
        microseconds: microseconds % MICROSECONDS_PER_DAY,
    }
}

/// Arrow's display form of each value (lists, structs, intervals, ...), nulls kept.
fn display_strings(array: &ArrayRef) -> Result<StringArray, datafusion::arrow::error::ArrowError> {
    let options = FormatOptions::default();
    let formatter = ArrayFormatter::try_new(array.as_ref(), &options)?;
    // Logical nulls: a column of untyped NULLs (`SELECT NULL`) has no validity buffer.
    let nulls = array.logical_nulls();
    let is_null = |i: usize| nulls.as_ref().is_some_and(|n| n.is_null(i));
    Ok((0..array.len()).map(|i| (!is_null(i)).then(|| formatter.value(i).to_string())).collect())
}

/// The rows of one batch, encoded for `fields`.
pub fn rows(batch: &RecordBatch, fields: &Arc<Vec<FieldInfo>>) -> PgWireResult<Vec<DataRow>> {
    let schema = batch.schema();
    let columns = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(array, field)| Column::new(field, array))
        .collect::<PgWireResult<Vec<_>>>()?;
    let mut encoder = DataRowEncoder::new(Arc::clone(fields));
    let mut out = Vec::with_capacity(batch.num_rows());
    for row in 0..batch.num_rows() {
        for column in &columns {
            column.encode(row, &mut encoder)?;
        }
        out.push(encoder.take_row());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, ListArray, UInt64Array};
    use datafusion::arrow::datatypes::Int64Type;

    fn text_of(row: &DataRow) -> Vec<Option<String>> {
        // DataRow holds `len: i32` then the bytes of each field (-1: null).
        let mut data = &row.data[..];
        let mut out = Vec::new();
        for _ in 0..row.field_count {
            let len = i32::from_be_bytes([data[0], data[1], data[2], data[3]]);
            data = &data[4..];
            if len < 0 {
                out.push(None);
            } else {
                let (value, rest) = data.split_at(len as usize);
                out.push(Some(String::from_utf8(value.to_vec()).unwrap()));
                data = rest;
            }
        }
        out
    }

    #[test]
    fn text_rows_of_common_types() {
        let list = ListArray::from_iter_primitive::<Int64Type, _, _>(vec![Some(vec![Some(1), Some(2)]), None]);
        let batch = RecordBatch::try_from_iter(vec![
            ("n", Arc::new(Int64Array::from(vec![Some(7), None])) as ArrayRef),
            ("u", Arc::new(UInt64Array::from(vec![u64::MAX, 0])) as ArrayRef),
            ("d", Arc::new(Decimal128Array::from(vec![12345, -5]).with_precision_and_scale(10, 2).unwrap())),
            ("s", Arc::new(StringArray::from(vec![Some("x"), None]))),
            ("day", Arc::new(Date32Array::from(vec![19000, 0]))),
            ("l", Arc::new(list)),
        ])
        .unwrap();
        let fields = Arc::new(fields(&batch.schema(), &text_format()));
        let types: Vec<_> = fields.iter().map(|f| f.datatype().clone()).collect();
        assert_eq!(types, vec![Type::INT8, Type::NUMERIC, Type::NUMERIC, Type::TEXT, Type::DATE, Type::INT8_ARRAY]);
        let rows = rows(&batch, &fields).unwrap();
        let some = |s: &str| Some(s.to_string());
        assert_eq!(
            text_of(&rows[0]),
            vec![some("7"), some("18446744073709551615"), some("123.45"), some("x"), some("2022-01-08"), some("{1,2}")]
        );
        assert_eq!(text_of(&rows[1]), vec![None, some("0"), some("-0.05"), None, some("1970-01-01"), None]);
        assert_eq!(fields[0].format(), pgwire::api::results::FieldFormat::Text);
    }

    /// Nanoseconds are cut to microseconds toward the past, before 1970 too (they were cut
    /// toward zero: the last nanosecond of 1969 was shown as 1970-01-01).
    #[test]
    fn nanosecond_timestamps_are_cut_toward_the_past() {
        use datafusion::arrow::array::TimestampNanosecondArray;
        let ts = TimestampNanosecondArray::from(vec![-1, 1_999]);
        let batch = RecordBatch::try_from_iter(vec![("t", Arc::new(ts) as ArrayRef)]).unwrap();
        let fields = Arc::new(fields(&batch.schema(), &text_format()));
        let rows = rows(&batch, &fields).unwrap();
        let texts: Vec<_> = rows.iter().map(|r| text_of(r)[0].clone().unwrap()).collect();
        assert_eq!(texts, ["1969-12-31 23:59:59.999999", "1970-01-01 00:00:00.000001"]);
    }

    #[test]
    fn intervals_and_durations_are_postgresql_intervals() {
        use datafusion::arrow::array::{DurationNanosecondArray, IntervalMonthDayNanoArray};
        use datafusion::arrow::datatypes::IntervalMonthDayNano;
        let hours = |h: i64| h * 3_600_000_000_000;
        let batch = RecordBatch::try_from_iter(vec![
            (
                "i",
                Arc::new(IntervalMonthDayNanoArray::from(vec![
                    Some(IntervalMonthDayNano::new(14, 1, hours(2) + 3_500_000_000)),
                    Some(IntervalMonthDayNano::new(0, -1, 0)),
                    None,
                ])) as ArrayRef,
            ),
            ("d", Arc::new(DurationNanosecondArray::from(vec![Some(hours(50)), Some(hours(14)), Some(0)]))),
        ])
        .unwrap();
        let fields = Arc::new(fields(&batch.schema(), &text_format()));
        assert!(fields.iter().all(|f| f.datatype() == &Type::INTERVAL));
        let rows = rows(&batch, &fields).unwrap();
        let some = |s: &str| Some(s.to_string());
        assert_eq!(text_of(&rows[0]), vec![some("1 year 2 mons 1 day 02:00:03.500000"), some("2 days 02:00:00")]);
        assert_eq!(text_of(&rows[1]), vec![some("-1 days"), some("14:00:00")]);
        assert_eq!(text_of(&rows[2]), vec![None, some("00:00:00")]);
    }

    #[test]
    fn lists_are_postgresql_arrays_in_text_and_binary() {
        use datafusion::arrow::buffer::OffsetBuffer;
        let strings = ListArray::new(
            Arc::new(Field::new_list_field(DataType::Utf8, true)),
            OffsetBuffer::from_lengths([4, 0]),
            Arc::new(StringArray::from(vec![Some("a,b"), None, Some(""), Some("say \"hi\"")])),
            None,
        );
        let ints = ListArray::from_iter_primitive::<Int64Type, _, _>(vec![Some(vec![Some(1), None]), None]);
        let nested = ListArray::new(
            Arc::new(Field::new_list_field(ints.data_type().clone(), true)),
            OffsetBuffer::from_lengths([1, 1]),
            Arc::new(ints.clone()),
            None,
        );
        let batch = RecordBatch::try_from_iter(vec![
            ("s", Arc::new(strings) as ArrayRef),
            ("i", Arc::new(ints) as ArrayRef),
            ("n", Arc::new(nested) as ArrayRef),
        ])
        .unwrap();
        let text = Arc::new(fields(&batch.schema(), &text_format()));
        let types: Vec<_> = text.iter().map(|f| f.datatype().clone()).collect();
        assert_eq!(types, vec![Type::TEXT_ARRAY, Type::INT8_ARRAY, Type::TEXT]);
        let rows_text = rows(&batch, &text).unwrap();
        let some = |s: &str| Some(s.to_string());
        assert_eq!(
            text_of(&rows_text[0]),
            vec![some(r#"{"a,b",NULL,"","say \"hi\""}"#), some("{1,NULL}"), some("[[1, ]]")]
        );
        assert_eq!(text_of(&rows_text[1]), vec![some("{}"), None, some("[]")]);
        // Binary (what psycopg asks for when it prepares): the array encoders take the rows too.
        let binary = Arc::new(fields(&batch.schema(), &Format::UnifiedBinary));
        assert_eq!(rows(&batch, &binary).unwrap().len(), 2);
    }

    #[test]
    fn untyped_nulls_are_sent_as_null() {
        // `SELECT NULL AS n`: a NullArray, which has no validity buffer to say so.
        let batch = RecordBatch::try_from_iter(vec![
            ("n", Arc::new(datafusion::arrow::array::NullArray::new(2)) as ArrayRef),
            ("one", Arc::new(Int64Array::from(vec![1, 1]))),
        ])
        .unwrap();
        let fields = Arc::new(fields(&batch.schema(), &text_format()));
        let rows = rows(&batch, &fields).unwrap();
        assert_eq!(text_of(&rows[0]), vec![None, Some("1".to_string())]);
    }
}
