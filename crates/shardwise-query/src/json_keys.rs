//! Whether a JSON object gives a key twice, for the readers that refuse such an object
//! (`shardwise load`'s NDJSON, the HTTP API's JSON body), as ClickHouse does.
//!
//! Why: serde_json and Arrow's JSON decoder each keep one of the two values without a word, so
//! `{"sql": "SELECT 1", "sql": "DROP TABLE t"}` ran the second, where something that read the
//! first (a proxy, a log) saw the first.

/// The first key the object `json` gives twice (values are skipped, not built); `None` when none
/// is, or `json` is no object (its reader says so).
pub fn key_given_twice(json: &[u8]) -> Option<String> {
    struct Keys;
    impl<'de> serde::de::Visitor<'de> for Keys {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut seen = std::collections::HashSet::new();
            let mut twice = None;
            while let Some(key) = map.next_key::<String>()? {
                map.next_value::<serde::de::IgnoredAny>()?;
                if twice.is_none() && !seen.insert(key.clone()) {
                    twice = Some(key);
                }
            }
            Ok(twice)
        }
    }
    let mut reader = serde_json::Deserializer::from_slice(json);
    serde::Deserializer::deserialize_map(&mut reader, Keys).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_given_twice_is_found_at_the_top_only() {
        assert_eq!(key_given_twice(br#"{"sql": "SELECT 1", "sql": "DROP TABLE t"}"#).as_deref(), Some("sql"));
        assert_eq!(key_given_twice(br#"{"a": {"b": 1, "b": 2}, "c": [1, 1]}"#), None);
        assert_eq!(key_given_twice(br#"{"a\u0062": 1, "ab": 2}"#).as_deref(), Some("ab"), "escapes read");
        assert_eq!(key_given_twice(b"[1, 2]"), None);
        assert_eq!(key_given_twice(b"{\"a\": "), None);
    }
}
