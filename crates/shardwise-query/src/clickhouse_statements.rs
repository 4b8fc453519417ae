//! ClickHouse's spellings of a few statements a user types first on a new engine, as the
//! statements shardwise runs: `DESCRIBE TABLE t` (and `DESC TABLE t`), `SHOW DATABASES`
//! (`SHOW SCHEMAS`) and `SHOW PROCESSLIST`.
//!
//! Why: each failed with a parser error ("Expected: end of statement, found: t") or "Unsupported
//! SQL statement" while `DESCRIBE t`, `information_schema.schemata` and `system.queries` answer
//! the same questions.
//!
//! How: [`rewrite`] reads the statement's tokens (so comments and case do not matter) and, for
//! one of these forms, gives the text to plan instead; any other statement is left alone.

use crate::error::QueryError;
use crate::settings::{statement_tokens, word_at};

/// The statement `sql` stands for, if it is one of the module doc's forms.
pub fn rewrite(sql: &str) -> Result<Option<String>, QueryError> {
    let first = sql.trim_start().split(|c: char| !c.is_ascii_alphabetic()).next().unwrap_or("");
    if !["describe", "desc", "show"].iter().any(|w| first.eq_ignore_ascii_case(w)) {
        return Ok(None);
    }
    let tokens = statement_tokens(sql)?;
    let word = |i: usize| word_at(&tokens, i);
    let rewritten = match (word(0).as_deref(), word(1).as_deref(), tokens.len()) {
        // `DESCRIBE TABLE t`: the same statement without the keyword (what follows it as written).
        (Some("describe" | "desc"), Some("table"), n) if n > 2 => {
            let rest: Vec<String> = tokens[2..].iter().map(ToString::to_string).collect();
            format!("DESCRIBE {}", rest.join(""))
        }
        (Some("show"), Some("databases" | "schemas"), 2) => {
            "SELECT DISTINCT schema_name AS name FROM information_schema.schemata ORDER BY name".to_string()
        }
        (Some("show"), Some("processlist"), 2) => {
            "SELECT query_id, query, started, duration_ms FROM system.queries WHERE state = 'running' \
             ORDER BY started"
                .to_string()
        }
        _ => return Ok(None),
    };
    Ok(Some(rewritten))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clickhouses_spellings_become_the_statements_shardwise_runs() {
        let r = |sql: &str| rewrite(sql).expect("tokens");
        assert_eq!(r("DESCRIBE TABLE events").as_deref(), Some("DESCRIBE events"));
        assert_eq!(r("desc table \"My T\";").as_deref(), Some("DESCRIBE \"My T\""));
        assert_eq!(r("DESC TABLE system.nodes").as_deref(), Some("DESCRIBE system.nodes"));
        assert!(r("SHOW DATABASES").is_some_and(|s| s.contains("information_schema.schemata")));
        assert!(r("show schemas;").is_some_and(|s| s.contains("information_schema.schemata")));
        assert!(r("SHOW PROCESSLIST").is_some_and(|s| s.contains("system.queries")));
        for other in ["DESCRIBE events", "SHOW TABLES", "SHOW DATABASES LIKE 'x'", "SELECT 1", "DESCRIBE TABLE"] {
            assert_eq!(r(other), None, "{other}");
        }
    }
}
