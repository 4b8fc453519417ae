//! What a bulk ingest's table and batches must be, and how batches from clients that do not send
//! the table's exact types are made into the table's (ADBC's `adbc_ingest` of a pandas or pyarrow
//! table sends `int32` for a `BIGINT` column, its own column order, and so on).
//!
//! - The ingest's table definition options: shardwise appends to an existing table. ADBC's
//!   `mode = "append"` and `"create_append"` do that; `"create"` on an existing table fails
//!   (the table exists), as ADBC defines it; `"replace"` and temporary tables are refused, since
//!   an ingest cannot drop and create a sharded table (its shard key is not in the stream), and
//!   a transaction id is refused: there are no transactions.
//! - Columns are matched to the table's by name (exactly, else ignoring case), in any order; a
//!   column the table lacks is an error, a nullable table column the batch lacks is NULL, and a
//!   column of another type is cast to the table's with Arrow's checked cast (a value that does
//!   not fit fails the ingest, naming the column), except that, as `shardwise load` reads them, a
//!   number for a timestamp is seconds since 1970 (a float's fraction a part of one) and a fraction for an integer (or a DOUBLE
//!   beyond a REAL's range) is refused, as an `INSERT` refuses it ([`shardwise_query::insert_exact`]).

use std::sync::Arc;

use arrow_flight::sql::{CommandStatementIngest, TableExistsOption, TableNotExistOption};
use datafusion::arrow::array::{ArrayRef, new_null_array};
use datafusion::arrow::compute::{CastOptions, can_cast_types, cast_with_options};
use datafusion::arrow::datatypes::{DataType, Schema, SchemaRef};
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchOptions};
use datafusion::arrow::util::display::FormatOptions;
use tonic::Status;

/// Refuses what shardwise's ingest cannot do before the stream is read; `exists` says whether
/// the table is in the catalog.
pub fn check_definition_options(command: &CommandStatementIngest, exists: bool) -> Result<(), Status> {
    let table = &command.table;
    if command.temporary {
        return Err(Status::invalid_argument(format!(
            "ingest into {table}: temporary tables are not supported; ingest into a table made with CREATE TABLE"
        )));
    }
    if command.transaction_id.is_some() {
        return Err(Status::invalid_argument(format!(
            "ingest into {table}: transactions are not supported (each insert applies on its own); send no \
             transaction id"
        )));
    }
    let Some(options) = &command.table_definition_options else { return Ok(()) };
    let if_exists = TableExistsOption::try_from(options.if_exists).unwrap_or(TableExistsOption::Unspecified);
    let if_not_exist = TableNotExistOption::try_from(options.if_not_exist).unwrap_or(TableNotExistOption::Unspecified);
    match (exists, if_exists, if_not_exist) {
        (true, TableExistsOption::Fail, _) => Err(Status::already_exists(format!(
            "ingest into {table}: the table exists and the client asked to create it (ADBC mode \"create\"); use \
             mode \"append\" to add rows to it"
        ))),
        (true, TableExistsOption::Replace, _) => Err(Status::invalid_argument(format!(
            "ingest into {table}: replacing a table is not supported (ADBC mode \"replace\"): TRUNCATE TABLE \
             {table}, then ingest with mode \"append\""
        ))),
        (false, _, TableNotExistOption::Create) => Err(Status::not_found(format!(
            "ingest into {table}: no such table, and ingest cannot create one (a sharded table needs its shard \
             key): CREATE TABLE {table} (...) WITH (shard_key = '...') first, then ingest with mode \"append\""
        ))),
        _ => Ok(()),
    }
}

/// `batch` with the table's columns and types (see the module doc); `outcome` ends an error with
/// what became of the rows.
pub fn conform(table: &str, batch: RecordBatch, schema: &SchemaRef, outcome: &str) -> Result<RecordBatch, Status> {
    conform_as(&format!("ingest into {table}"), batch, schema, outcome)
}

/// [`conform`] for rows that `statement` (such as `INSERT INTO t`) stores: its errors begin so.
pub fn conform_as(
    statement: &str,
    batch: RecordBatch,
    schema: &SchemaRef,
    outcome: &str,
) -> Result<RecordBatch, Status> {
    let given = batch.schema();
    if given.fields().len() == schema.fields().len()
        && given
            .fields()
            .iter()
            .zip(schema.fields())
            .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type())
    {
        return Ok(batch);
    }
    let refuse = |what: String| Status::invalid_argument(format!("{statement}: {what}; {outcome}"));
    let mut source: Vec<Option<usize>> = vec![None; schema.fields().len()];
    for (position, field) in given.fields().iter().enumerate() {
        let found = schema.index_of(field.name()).ok().or_else(|| {
            let mut same =
                schema.fields().iter().enumerate().filter(|(_, f)| f.name().eq_ignore_ascii_case(field.name()));
            match (same.next(), same.next()) {
                (Some((index, _)), None) => Some(index),
                _ => None,
            }
        });
        let Some(index) = found else {
            return Err(refuse(format!(
                "the batches have a column {:?} the table does not have (its columns: {})",
                field.name(),
                describe(schema)
            )));
        };
        if source[index].replace(position).is_some() {
            return Err(refuse(format!("the batches have column {:?} twice", schema.field(index).name())));
        }
    }
    let options = CastOptions { safe: false, format_options: FormatOptions::default() };
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for (field, position) in schema.fields().iter().zip(&source) {
        let column = match position {
            None if field.is_nullable() => new_null_array(field.data_type(), batch.num_rows()),
            None => {
                return Err(refuse(format!("the batches lack column {:?}, which is NOT NULL", field.name())));
            }
            Some(position) => {
                let column = batch.column(*position);
                if column.data_type() == field.data_type() {
                    Arc::clone(column)
                } else if column.data_type().is_integer()
                    && matches!(field.data_type(), DataType::Date32 | DataType::Date64)
                {
                    // As an INSERT refuses it: a number is no date (Arrow's cast would read days
                    // since 1970).
                    return Err(refuse(format!(
                        "column {:?}: a {} value cannot be stored in a DATE column; send dates as an Arrow date \
                         type, or as text ('2024-01-31')",
                        field.name(),
                        column.data_type()
                    )));
                } else if column.data_type().is_nested() && !field.data_type().is_nested() {
                    // Arrow would cast a list to text as its debug form (`[1, 2]`).
                    return Err(refuse(format!(
                        "column {:?}: a {} value is nested (a list, struct, map or union), and the column holds one value ({})",
                        field.name(),
                        column.data_type(),
                        field.data_type()
                    )));
                } else if can_cast_types(column.data_type(), field.data_type()) {
                    let failed = |e: datafusion::arrow::error::ArrowError| {
                        refuse(format!(
                            "column {:?}: a {} value does not convert to the column's type {} ({e})",
                            field.name(),
                            column.data_type(),
                            field.data_type()
                        ))
                    };
                    // A fraction for an integer column is refused, not truncated, as an INSERT
                    // refuses it (so is a DOUBLE beyond a REAL's range).
                    if let Some(unfit) = shardwise_query::insert_exact::first_unfit(column, field.data_type()) {
                        return Err(refuse(format!(
                            "column {:?}: the {} value {} does not convert to the column's type {}: {}",
                            field.name(),
                            column.data_type(),
                            unfit.shown,
                            field.data_type(),
                            unfit.why
                        )));
                    }
                    // A number for a timestamp is seconds since 1970 (a float's fraction a part
                    // of one), as `CAST` and `shardwise load` read it (Arrow's cast reads the
                    // column's unit).
                    match shardwise_query::integer_timestamps::seconds_as_timestamps(column, field.data_type()) {
                        Some(converted) => {
                            converted.map_err(|e| refuse(format!("column {:?}: {}", field.name(), e.message)))?
                        }
                        // A finer time keeps its instant's start, as text does.
                        None => match shardwise_query::time_floor::floored(column, field.data_type()) {
                            Some(floored) => cast_with_options(&floored, field.data_type(), &options),
                            None => cast_with_options(column, field.data_type(), &options),
                        }
                        .map_err(failed)?,
                    }
                } else {
                    return Err(refuse(format!(
                        "column {:?} is {} in the batches, which does not convert to the column's type {}",
                        field.name(),
                        column.data_type(),
                        field.data_type()
                    )));
                }
            }
        };
        columns.push(column);
    }
    let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    RecordBatch::try_new_with_options(Arc::clone(schema), columns, &options)
        .map_err(|e| refuse(format!("the batches do not fit the table's columns ({}): {e}", describe(schema))))
}

fn describe(schema: &Schema) -> String {
    schema.fields().iter().map(|f| format!("{} {}", f.name(), f.data_type())).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use arrow_flight::sql::TableDefinitionOptions;
    use datafusion::arrow::array::{AsArray, Int32Array, Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, TimeUnit};

    use super::*;

    fn table() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
            Field::new("small", DataType::Int16, true),
        ]))
    }

    fn command(if_not_exist: TableNotExistOption, if_exists: TableExistsOption) -> CommandStatementIngest {
        CommandStatementIngest {
            table_definition_options: Some(TableDefinitionOptions {
                if_not_exist: if_not_exist.into(),
                if_exists: if_exists.into(),
            }),
            table: "t".into(),
            ..Default::default()
        }
    }

    #[test]
    fn adbc_modes_append_or_are_refused() {
        use TableExistsOption as E;
        use TableNotExistOption as N;
        // append, create_append
        assert!(check_definition_options(&command(N::Fail, E::Append), true).is_ok());
        assert!(check_definition_options(&command(N::Create, E::Append), true).is_ok());
        // create on an existing table, replace
        let err = check_definition_options(&command(N::Create, E::Fail), true).unwrap_err();
        assert_eq!(err.code(), tonic::Code::AlreadyExists);
        let err = check_definition_options(&command(N::Create, E::Replace), true).unwrap_err();
        assert!(err.message().contains("TRUNCATE TABLE t"), "{}", err.message());
        // create of a missing table
        let err = check_definition_options(&command(N::Create, E::Fail), false).unwrap_err();
        assert!(err.message().contains("shard_key"), "{}", err.message());
        // no options at all (shardwise load sends append)
        assert!(check_definition_options(&CommandStatementIngest::default(), true).is_ok());
        let temporary = CommandStatementIngest { temporary: true, ..Default::default() };
        assert!(check_definition_options(&temporary, true).unwrap_err().message().contains("temporary"));
    }

    #[test]
    fn an_integer_is_no_date() {
        let schema = Arc::new(Schema::new(vec![Field::new("day", DataType::Date32, true)]));
        let batch =
            RecordBatch::try_from_iter([("day", Arc::new(Int32Array::from(vec![18_000])) as ArrayRef)]).unwrap();
        let message = conform("t", batch, &schema, "-").unwrap_err().message().to_string();
        assert!(message.contains("a Int32 value cannot be stored in a DATE column"), "{message}");
        let dates = datafusion::arrow::array::Date32Array::from(vec![18_000]);
        let batch = RecordBatch::try_from_iter([("day", Arc::new(dates) as ArrayRef)]).unwrap();
        assert!(conform("t", batch, &schema, "-").is_ok());
    }

    /// A finer time keeps its instant's start, as the same text does: `1969-12-31 23:59:59.5`
    /// into a TIMESTAMP(0) is 23:59:59, not 1970-01-01 00:00:00 (Arrow's cast divides toward
    /// zero); a DATE64 of -1 ms is 1969-12-31.
    #[test]
    fn finer_times_are_floored_to_the_column() {
        use datafusion::arrow::array::{Date64Array, TimestampNanosecondArray};
        let schema = Arc::new(Schema::new(vec![
            Field::new("t0", DataType::Timestamp(TimeUnit::Second, None), true),
            Field::new("day", DataType::Date32, true),
        ]));
        let batch = RecordBatch::try_from_iter([
            ("t0", Arc::new(TimestampNanosecondArray::from(vec![-500_000_000, 1_500_000_000])) as ArrayRef),
            ("day", Arc::new(Date64Array::from(vec![-1, 86_400_001])) as ArrayRef),
        ])
        .unwrap();
        let out = conform("t", batch, &schema, "-").unwrap();
        let seconds = out.column(0).as_primitive::<datafusion::arrow::datatypes::TimestampSecondType>();
        assert_eq!(seconds.values().to_vec(), vec![-1, 1]);
        let days = out.column(1).as_primitive::<datafusion::arrow::datatypes::Date32Type>();
        assert_eq!(days.values().to_vec(), vec![-1, 1]);
    }

    #[test]
    fn columns_are_matched_by_name_and_cast() {
        let batch = RecordBatch::try_from_iter([
            ("SMALL", Arc::new(Int32Array::from(vec![Some(7), None])) as ArrayRef),
            ("id", Arc::new(Int32Array::from(vec![1, 2])) as ArrayRef),
        ])
        .unwrap();
        let out = conform("t", batch, &table(), "nothing was written").unwrap();
        assert_eq!(out.schema(), table());
        assert_eq!(out.column(0).as_ref(), &Int64Array::from(vec![1, 2]) as &dyn datafusion::arrow::array::Array);
        assert_eq!(out.column(1).null_count(), 2);
        // A value that does not fit, a column the table lacks, a NOT NULL column missing.
        let big = RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from(vec![1])) as ArrayRef),
            ("small", Arc::new(Int64Array::from(vec![70_000])) as ArrayRef),
        ])
        .unwrap();
        let err = conform("t", big, &table(), "nothing was written").unwrap_err();
        assert!(err.message().starts_with("ingest into t: column \"small\": a Int64 value"), "{}", err.message());
        assert!(err.message().ends_with("; nothing was written"), "{}", err.message());
        let extra = RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from(vec![1])) as ArrayRef),
            ("x", Arc::new(StringArray::from(vec!["a"])) as ArrayRef),
        ])
        .unwrap();
        assert!(
            conform("t", extra, &table(), "-").unwrap_err().message().contains("column \"x\" the table does not have")
        );
        // As `shardwise load` reads them: a fraction for an integer is refused, a whole number for
        // a timestamp is seconds.
        let fraction = RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from(vec![1])) as ArrayRef),
            ("small", Arc::new(datafusion::arrow::array::Float64Array::from(vec![18.7])) as ArrayRef),
        ])
        .unwrap();
        let message = conform("t", fraction, &table(), "-").unwrap_err().message().to_string();
        assert!(message.contains("the Float64 value 18.7 does not convert"), "{message}");
        assert!(message.contains("it has a fraction"), "{message}");
        // A list for a text column (Arrow's cast would store its debug text, `[1, 2]`).
        let list =
            datafusion::arrow::array::ListArray::from_iter_primitive::<datafusion::arrow::datatypes::Int64Type, _, _>(
                vec![Some(vec![Some(1), Some(2)])],
            );
        let nested = RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from(vec![1])) as ArrayRef),
            ("name", Arc::new(list)),
        ])
        .unwrap();
        let message = conform("t", nested, &table(), "-").unwrap_err().message().to_string();
        assert!(message.contains("column \"name\": a List(") && message.contains("is nested"), "{message}");
        let decimal = RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from(vec![1])) as ArrayRef),
            (
                "small",
                Arc::new(
                    datafusion::arrow::array::Decimal128Array::from(vec![1870]).with_precision_and_scale(6, 2).unwrap(),
                ) as ArrayRef,
            ),
        ])
        .unwrap();
        let message = conform("t", decimal, &table(), "-").unwrap_err().message().to_string();
        assert!(message.contains("value 18.70 does not convert"), "{message}");
        let ts = Arc::new(Schema::new(vec![Field::new("ts", DataType::Timestamp(TimeUnit::Nanosecond, None), true)]));
        let epoch =
            RecordBatch::try_from_iter([("ts", Arc::new(Int64Array::from(vec![1_700_000_000])) as ArrayRef)]).unwrap();
        let out = conform("t", epoch, &ts, "-").unwrap();
        let nanos = out.column(0).as_primitive::<datafusion::arrow::datatypes::TimestampNanosecondType>().value(0);
        assert_eq!(nanos, 1_700_000_000_000_000_000);
        // A float is seconds with its fraction (Arrow's cast read 1700000000.5 as 1.7 s).
        let float = RecordBatch::try_from_iter([(
            "ts",
            Arc::new(datafusion::arrow::array::Float64Array::from(vec![1_700_000_000.5])) as ArrayRef,
        )])
        .unwrap();
        let out = conform("t", float, &ts, "-").unwrap();
        let nanos = out.column(0).as_primitive::<datafusion::arrow::datatypes::TimestampNanosecondType>().value(0);
        assert_eq!(nanos, 1_700_000_000_500_000_000);
        let missing =
            RecordBatch::try_from_iter([("name", Arc::new(StringArray::from(vec!["a"])) as ArrayRef)]).unwrap();
        assert!(conform("t", missing, &table(), "-").unwrap_err().message().contains("lack column \"id\""));
    }
}
