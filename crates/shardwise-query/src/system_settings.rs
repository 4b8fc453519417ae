//! `system.settings` and `SHOW [CHANGED] SETTINGS [LIKE | ILIKE 'pattern']`, as in ClickHouse:
//! every setting a query can use, with the value it has for the query that reads the table (the
//! node's, then the session's `SET`, then the statement's `SETTINGS` clause), the node's value,
//! whether it differs, and what it does.
//!
//! shardwise's own settings come first, under the names users write (`max_memory_usage`), then
//! DataFusion's options under theirs (`datafusion.execution.batch_size`). The values are read
//! from the configuration of the statement scanning the table.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use datafusion::arrow::array::{ArrayRef, BooleanArray, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::config::{ConfigEntry, ConfigOptions};
use datafusion::error::Result;
use datafusion::sql::sqlparser::tokenizer::Token;

use crate::error::QueryError;
use crate::settings::{statement_tokens, word_at};
use crate::sql_text::{mentions, string_literal};
use crate::system_tables::{ComputedTable, RowsFuture};

/// Name of the table in the `system` schema.
pub const SETTINGS_TABLE: &str = "settings";

static SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("name", DataType::Utf8, false),
        Field::new("value", DataType::Utf8, true),
        Field::new("default", DataType::Utf8, true),
        Field::new("changed", DataType::Boolean, false),
        Field::new("description", DataType::Utf8, false),
    ]))
});

/// `system.settings`, with `node`'s values as the defaults every session starts from.
pub fn settings_table(node: &ConfigOptions) -> ComputedTable {
    let defaults: Arc<Defaults> = Arc::new(node.entries().into_iter().map(|e| (e.key, e.value)).collect());
    ComputedTable::new(Arc::clone(&SCHEMA), move |options: &ConfigOptions| -> RowsFuture {
        let batch = settings_batch(&defaults, options);
        Box::pin(async move { batch })
    })
}

/// The node's value of each setting, by configuration key.
type Defaults = HashMap<String, Option<String>>;

fn settings_batch(defaults: &Defaults, options: &ConfigOptions) -> Result<RecordBatch> {
    let mut entries = options.entries();
    // shardwise's first, in declaration order (an extension's entries carry its bare names),
    // then DataFusion's.
    entries.sort_by_key(|e| e.key.starts_with("datafusion."));
    let default = |e: &ConfigEntry| defaults.get(&e.key).cloned().flatten();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(entries.iter().map(|e| Some(e.key.as_str())).collect::<StringArray>()),
        Arc::new(entries.iter().map(|e| e.value.clone()).collect::<StringArray>()),
        Arc::new(entries.iter().map(default).collect::<StringArray>()),
        Arc::new(entries.iter().map(|e| Some(e.value != default(e))).collect::<BooleanArray>()),
        Arc::new(entries.iter().map(|e| Some(e.description.trim())).collect::<StringArray>()),
    ];
    Ok(RecordBatch::try_new(Arc::clone(&SCHEMA), columns)?)
}

/// The query `SHOW [CHANGED] SETTINGS [LIKE | ILIKE 'pattern']` runs, if `sql` is one.
pub fn show_settings_query(sql: &str) -> Result<Option<String>, QueryError> {
    if !mentions(sql, "settings") {
        return Ok(None);
    }
    let tokens = statement_tokens(sql)?;
    let word = |i: usize| word_at(&tokens, i);
    if word(0).as_deref() != Some("show") {
        return Ok(None);
    }
    let changed = word(1).as_deref() == Some("changed");
    let at = if changed { 2 } else { 1 };
    if word(at).as_deref() != Some("settings") {
        return Ok(None);
    }
    let mut conditions = Vec::new();
    if changed {
        conditions.push("changed".to_string());
    }
    match (word(at + 1).as_deref(), tokens.get(at + 2), tokens.len() - at) {
        (None, None, 1) => {}
        (Some(op @ ("like" | "ilike")), Some(Token::SingleQuotedString(pattern)), 3) => {
            conditions.push(format!("name {} {}", op.to_ascii_uppercase(), string_literal(pattern)));
        }
        _ => {
            return Err(QueryError::Rejected(
                "expected SHOW [CHANGED] SETTINGS [LIKE | ILIKE 'pattern'] (or query system.settings)".into(),
            ));
        }
    }
    let filter = if conditions.is_empty() { String::new() } else { format!(" WHERE {}", conditions.join(" AND ")) };
    Ok(Some(format!("SELECT name, value, \"default\", changed, description FROM system.{SETTINGS_TABLE}{filter}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::ShardwiseSettings;

    #[test]
    fn show_settings_becomes_a_query() {
        let q = |sql: &str| show_settings_query(sql).unwrap();
        assert_eq!(q("SELECT 1"), None);
        assert_eq!(q("SHOW TABLES"), None);
        assert_eq!(q("SHOW ALL"), None);
        assert_eq!(
            q("show settings").unwrap(),
            "SELECT name, value, \"default\", changed, description FROM system.settings"
        );
        assert!(q("SHOW SETTINGS LIKE '%merge%';").unwrap().ends_with(" WHERE name LIKE '%merge%'"));
        assert!(q("SHOW CHANGED SETTINGS ILIKE 'MAX%'").unwrap().ends_with(" WHERE changed AND name ILIKE 'MAX%'"));
        assert!(q("SHOW CHANGED SETTINGS").unwrap().ends_with(" WHERE changed"));
        assert!(q("SHOW SETTINGS LIKE 'it''s'").unwrap().ends_with("LIKE 'it''s'"));
        for bad in ["SHOW SETTINGS LIKE", "SHOW SETTINGS LIKE x", "SHOW SETTINGS 'x'", "SHOW SETTINGS LIKE 'a' b"] {
            let err = show_settings_query(bad).unwrap_err().to_string();
            assert!(err.contains("SHOW [CHANGED] SETTINGS"), "{bad}: {err}");
        }
    }

    #[test]
    fn the_table_shows_the_reading_querys_values_against_the_nodes() {
        let mut extensions = datafusion::common::config::Extensions::new();
        extensions.insert(ShardwiseSettings::default());
        let node = ConfigOptions::new().with_extensions(extensions);
        let defaults: Defaults = node.entries().into_iter().map(|e| (e.key, e.value)).collect();
        let mut query = node.clone();
        query.set("shardwise.max_memory_usage", "1000").unwrap();
        let batch = settings_batch(&defaults, &query).unwrap();
        let column = |i: usize| batch.column(i).as_any().downcast_ref::<StringArray>().unwrap().clone();
        let (names, values, defaults) = (column(0), column(1), column(2));
        let changed = batch.column(3).as_any().downcast_ref::<BooleanArray>().unwrap();
        assert_eq!(names.value(0), "insert_id", "shardwise's settings first, by their bare names");
        let row = (0..batch.num_rows()).find(|&i| names.value(i) == "max_memory_usage").unwrap();
        assert_eq!((values.value(row), defaults.value(row), changed.value(row)), ("1000", "0", true));
        let row = (0..batch.num_rows()).find(|&i| names.value(i) == "datafusion.execution.batch_size").unwrap();
        assert!(!changed.value(row));
        assert_eq!(changed.iter().filter(|c| *c == Some(true)).count(), 1);
    }
}
