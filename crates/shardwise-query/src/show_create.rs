//! `SHOW CREATE TABLE t` and `system.tables.create_table_query`: the statement that creates a
//! table like `t` (its columns, shard key, shard and replica counts, sync mode and delay
//! settings), as ClickHouse shows one. Run on a cluster of the same size, it gives a table that
//! `DESCRIBE` and `system.tables` show alike (a test checks it for every column type).
//!
//! One caveat: a `TIMESTAMP WITH TIME ZONE` column takes the session's time zone when created
//! (DataFusion's mapping), so the statement recreates that zone only under the same setting.

use datafusion::arrow::datatypes::{DataType, TimeUnit};
use datafusion::sql::sqlparser::keywords::{
    ALL_KEYWORDS, ALL_KEYWORDS_INDEX, RESERVED_FOR_COLUMN_ALIAS, RESERVED_FOR_IDENTIFIER, RESERVED_FOR_TABLE_ALIAS,
};
use shardwise_storage::TableDef;

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

/// `name` as it must be written to mean exactly itself: bare when it is a lower-case word that
/// is no reserved SQL word (DataFusion folds bare names to lower case), double-quoted otherwise.
fn identifier(name: &str) -> String {
    let plain = name.chars().next().is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !is_reserved(name);
    match plain {
        true => name.to_string(),
        false => format!("\"{}\"", name.replace('"', "\"\"")),
    }
}

/// True for the words sqlparser keeps from being a bare alias or name (`order`, `select`,
/// `from`...); other keywords (`id`, `day`, `name`) are fine bare.
fn is_reserved(word: &str) -> bool {
    let upper = word.to_ascii_uppercase();
    let Ok(i) = ALL_KEYWORDS.binary_search(&upper.as_str()) else { return false };
    ALL_KEYWORDS_INDEX.get(i).is_some_and(|k| {
        RESERVED_FOR_COLUMN_ALIAS.contains(k)
            || RESERVED_FOR_TABLE_ALIAS.contains(k)
            || RESERVED_FOR_IDENTIFIER.contains(k)
    })
}

/// `text` as a SQL string literal.
pub(crate) fn string_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_quoted_only_when_they_must_be() {
        assert_eq!(identifier("user_id2"), "user_id2");
        assert_eq!(identifier("order"), "\"order\"");
        assert_eq!(identifier("select"), "\"select\"");
        assert_eq!(identifier("id"), "id");
        assert_eq!(identifier("day"), "day");
        assert_eq!(identifier("Amount"), "\"Amount\"");
        assert_eq!(identifier("2x"), "\"2x\"");
        assert_eq!(identifier("a\"b"), "\"a\"\"b\"");
        assert_eq!(string_literal("it's"), "'it''s'");
    }

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
