//! `SHOW CREATE TABLE t` and `system.tables.create_table_query`: the statement that creates a
//! table like `t` (its columns, shard key, shard and replica counts, sync mode and delay
//! settings), as ClickHouse shows one. Run on a cluster of the same size, it gives a table that
//! `DESCRIBE` and `system.tables` show alike (a test checks it for every column type).
//!
//! One caveat: a `TIMESTAMP WITH TIME ZONE` column takes the session's time zone when created
//! (DataFusion's mapping), so the statement recreates that zone only under the same setting.

use datafusion::arrow::datatypes::{DataType, TimeUnit};
use shardwise_storage::TableDef;

use crate::sql_text::{identifier, string_literal};

/// The `CREATE TABLE` statement for `def`, on one line.
pub fn create_statement(def: &TableDef) -> String {
    let columns: Vec<String> =
        def.schema.fields().iter().map(|f| format!("{} {}", identifier(f.name()), sql_type(f.data_type()))).collect();
    let delay = &def.delay;
    format!(
        "CREATE TABLE {} ({}) WITH (shard_key = {}, shards = {}, replicas = {}, sync_mode = '{}', \
         delay_max_ms = {}, delay_max_rows = {}, delay_max_bytes = {})",
        identifier(&def.name),
        columns.join(", "),
        string_literal(&def.shard_key.join(",")),
        def.shards,
        def.replicas,
        def.sync_mode.as_str(),
        delay.delay_max_ms,
        delay.delay_max_rows,
        delay.delay_max_bytes,
    )
}

/// The SQL type DataFusion maps back to `data_type` (every type a table may have;
/// [`shardwise_storage::check_column_type`]). Anything else is printed as Arrow names it.
fn sql_type(data_type: &DataType) -> String {
    let name = match data_type {
        DataType::Int8 => "TINYINT",
        DataType::Int16 => "SMALLINT",
        DataType::Int32 => "INT",
        DataType::Int64 => "BIGINT",
        DataType::UInt8 => "TINYINT UNSIGNED",
        DataType::UInt16 => "SMALLINT UNSIGNED",
        DataType::UInt32 => "INT UNSIGNED",
        DataType::UInt64 => "BIGINT UNSIGNED",
        DataType::Float32 => "REAL",
        DataType::Float64 => "DOUBLE",
        DataType::Boolean => "BOOLEAN",
        DataType::Utf8 => "VARCHAR",
        DataType::Date32 => "DATE",
        DataType::Decimal128(precision, scale) => return format!("DECIMAL({precision}, {scale})"),
        DataType::Timestamp(unit, zone) => {
            let digits = match unit {
                TimeUnit::Second => 0,
                TimeUnit::Millisecond => 3,
                TimeUnit::Microsecond => 6,
                TimeUnit::Nanosecond => 9,
            };
            let with_zone = if zone.is_some() { " WITH TIME ZONE" } else { "" };
            return format!("TIMESTAMP({digits}){with_zone}");
        }
        other => return other.to_string(),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_type_has_a_sql_name() {
        for t in [
            DataType::Int8,
            DataType::UInt64,
            DataType::Float32,
            DataType::Decimal128(12, 2),
            DataType::Timestamp(TimeUnit::Millisecond, None),
            DataType::Timestamp(TimeUnit::Nanosecond, Some("+00:00".into())),
        ] {
            assert!(shardwise_storage::check_column_type("c", &t).is_ok());
            assert!(sql_type(&t).chars().next().is_some_and(|c| c.is_ascii_uppercase()), "{t}");
        }
        assert_eq!(sql_type(&DataType::Timestamp(TimeUnit::Millisecond, None)), "TIMESTAMP(3)");
    }
}
