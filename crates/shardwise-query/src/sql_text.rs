//! Writing values and names into SQL text that shardwise builds itself (`SHOW CREATE TABLE`,
//! the insert of `CREATE TABLE ... AS SELECT`, pgwire's bound parameters, `shardwise load`'s
//! probe of a table): one place that knows how SQL quotes them.

use datafusion::sql::sqlparser::ast::{Expr, Value};
use datafusion::sql::sqlparser::keywords::{
    ALL_KEYWORDS, ALL_KEYWORDS_INDEX, RESERVED_FOR_COLUMN_ALIAS, RESERVED_FOR_IDENTIFIER, RESERVED_FOR_TABLE_ALIAS,
};

/// The text a `key = value` option or setting gives its value (`'a,b'` is `a,b`, `2` is `2`, a
/// bare word is itself); any other expression as written (`-5`, `1 + 1`), for the option's or
/// setting's own check to accept or refuse by name.
pub fn value_text(value: &Expr) -> String {
    match value {
        Expr::Value(v) => match &v.value {
            Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => s.clone(),
            Value::Number(n, _) => n.to_string(),
            Value::Boolean(b) => b.to_string(),
            other => other.to_string(),
        },
        Expr::Identifier(ident) => ident.value.clone(),
        other => other.to_string(),
    }
}

/// `text` as a SQL string literal: in single quotes, inner single quotes doubled.
pub fn string_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// `name` as a SQL identifier that keeps its case: in double quotes, inner double quotes doubled.
pub fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `name` as it must be written to mean exactly itself, for text people read: bare when it is a
/// lower-case word that is no reserved SQL word (DataFusion folds bare names to lower case),
/// double-quoted otherwise.
pub fn identifier(name: &str) -> String {
    let plain = name.chars().next().is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !is_reserved(name);
    match plain {
        true => name.to_string(),
        false => quote_identifier(name),
    }
}

/// True when `sql` holds `word` (ASCII, any case) anywhere: a cheap test that lets the checks
/// for statements shardwise recognises itself (`SHOW SETTINGS`, a `FORMAT` clause) skip
/// tokenizing a statement that cannot be one, such as a long `INSERT ... VALUES`.
pub fn mentions(sql: &str, word: &str) -> bool {
    let word = word.as_bytes();
    !word.is_empty() && sql.as_bytes().windows(word.len()).any(|w| w.eq_ignore_ascii_case(word))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mentions_is_an_ascii_case_insensitive_substring_test() {
        assert!(mentions("SELECT 1 FORMAT CSV", "format") && mentions("reset x", "set"));
        assert!(!mentions("SELECT 1", "format") && !mentions("", "kill") && !mentions("kill", ""));
        assert!(mentions("SELECT 'é' FROM système.Settings", "settings"));
    }

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
    }

    #[test]
    fn literals_and_quoted_names_double_their_quotes() {
        assert_eq!(string_literal("it's"), "'it''s'");
        assert_eq!(quote_identifier("trades"), "\"trades\"");
        assert_eq!(quote_identifier("My \"T\""), "\"My \"\"T\"\"\"");
    }
}
