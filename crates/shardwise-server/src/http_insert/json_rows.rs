//! `FORMAT JSONEachRow` rows: one JSON object per line, its keys naming columns; a column an
//! object lacks, or gives as `null`, is NULL; blank lines are skipped.
//!
//! Every value becomes its text exactly as written (a number's digits, not an `f64`'s, so that
//! `12345678901234567890.12` reaches a `DECIMAL(38, 2)` column whole), and is then converted to
//! its column's type as a CSV field is (`crate::pg::copy_in`), with the same errors. Two passes:
//! serde_json reads each line, so that a line that is not an object, a key no column has, and a
//! nested value are named by line; then Arrow's JSON decoder, with every column as text and
//! primitive values coerced to text, gives each value's text as written.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::json::ReaderBuilder;
use serde_json::Value;
use shardwise_query::QueryError;

use crate::pg::copy_in::Row;

/// A key the rows name, and the line it first appears on.
pub type Key = (String, u64);

/// The columns the rows name (each object's new keys in the order written, after those of the
/// objects before it), each with the line it first appears on, and the rows, their fields in
/// that order.
pub fn rows(table: &str, data: &str) -> Result<(Vec<Key>, Vec<Row>), QueryError> {
    let bad = |line: u64, what: String| QueryError::Rejected(format!("INSERT INTO {table} line {line}{what}"));
    let mut names: Vec<Key> = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut lines: Vec<(u64, &str)> = Vec::new();
    // A byte order mark before the first object is skipped, as ClickHouse and `shardwise load` do.
    let data = data.strip_prefix('\u{feff}').unwrap_or(data);
    for (i, line) in data.lines().enumerate() {
        let number = i as u64 + 1;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let Object(object) =
            serde_json::from_str(line).map_err(|e| bad(number, format!(": not a JSON object ({e})")))?;
        for (i, (key, value)) in object.iter().enumerate() {
            if value.is_array() || value.is_object() {
                return Err(bad(number, format!(", column {key}: a nested value; a column holds one value")));
            }
            // serde_json and Arrow would each keep one of the two values; ClickHouse refuses it.
            if object[..i].iter().any(|(k, _)| k == key) {
                return Err(bad(number, format!(", column {key}: given twice in one object")));
            }
            if !seen.contains_key(key) {
                seen.insert(key.clone(), names.len());
                names.push((key.clone(), number));
            }
        }
        lines.push((number, line));
    }
    if lines.is_empty() {
        return Ok((names, Vec::new()));
    }
    let schema =
        Arc::new(Schema::new(names.iter().map(|n| Field::new(&n.0, DataType::Utf8, true)).collect::<Vec<_>>()));
    let internal = |e: datafusion::arrow::error::ArrowError| QueryError::Rejected(format!("INSERT INTO {table}: {e}"));
    let mut decoder = ReaderBuilder::new(schema)
        .with_batch_size(lines.len())
        .with_coerce_primitive(true)
        .build_decoder()
        .map_err(internal)?;
    for (_, line) in &lines {
        let mut rest = line.as_bytes();
        while !rest.is_empty() {
            let used = decoder.decode(rest).map_err(internal)?;
            if used == 0 {
                break;
            }
            rest = &rest[used..];
        }
    }
    let Some(batch) = decoder.flush().map_err(internal)? else { return Ok((names, Vec::new())) };
    if batch.num_rows() != lines.len() {
        return Err(QueryError::Rejected(format!(
            "INSERT INTO {table}: {} objects read from {} lines",
            batch.num_rows(),
            lines.len()
        )));
    }
    let columns: Vec<_> = batch.columns().iter().map(|c| c.as_string::<i32>()).collect();
    let rows = lines
        .iter()
        .enumerate()
        .map(|(r, (number, _))| {
            (*number, columns.iter().map(|c| c.is_valid(r).then(|| c.value(r).to_string())).collect())
        })
        .collect();
    Ok((names, rows))
}

/// A JSON object's members in the order written, a key given twice kept twice (a
/// `serde_json::Map` keeps only the last).
struct Object(Vec<(String, Value)>);

impl<'de> serde::Deserialize<'de> for Object {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Members;
        impl<'de> serde::de::Visitor<'de> for Members {
            type Value = Object;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Object, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry::<String, Value>()? {
                    members.push(member);
                }
                Ok(Object(members))
            }
        }
        deserializer.deserialize_map(Members)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_keep_their_text_and_missing_keys_are_null() {
        let data = "{\"id\": 1, \"v\": 12345678901234567890.12, \"s\": \"a\\\"b\"}\n\n{\"s\": true, \"id\": 2}\n{\"v\": null}\n";
        let (names, rows) = rows("t", data).expect("rows");
        assert_eq!(names, vec![("id".into(), 1), ("v".into(), 1), ("s".into(), 1)]);
        let text = |r: &Row| r.1.iter().map(|f| f.clone().unwrap_or_else(|| "NULL".into())).collect::<Vec<_>>();
        assert_eq!((rows[0].0, text(&rows[0])), (1, vec!["1".into(), "12345678901234567890.12".into(), "a\"b".into()]));
        assert_eq!((rows[1].0, text(&rows[1])), (3, vec!["2".into(), "NULL".into(), "true".into()]));
        assert_eq!((rows[2].0, text(&rows[2])), (4, vec!["NULL".into(), "NULL".into(), "NULL".into()]));
    }

    #[test]
    fn a_bad_line_is_named() {
        let err = rows("t", "{\"id\": 1}\n{\"id\": 2\n").unwrap_err().to_string();
        assert!(err.contains("INSERT INTO t line 2: not a JSON object"), "{err}");
        let err = rows("t", "{\"id\": 1}\n[1, 2]\n").unwrap_err().to_string();
        assert!(err.contains("line 2: not a JSON object"), "{err}");
        let err = rows("t", "{\"id\": [1]}\n").unwrap_err().to_string();
        assert!(err.contains("line 1, column id: a nested value"), "{err}");
        let err = rows("t", "{\"id\": 1}\n{\"id\": 2, \"v\": 1, \"id\": 3}\n").unwrap_err().to_string();
        assert!(err.contains("line 2, column id: given twice in one object"), "{err}");
        assert_eq!(rows("t", "\n\n").expect("no rows").1.len(), 0);
        assert_eq!(rows("t", "\u{feff}{\"id\": 1}\n").expect("a BOM first").1.len(), 1);
    }
}
