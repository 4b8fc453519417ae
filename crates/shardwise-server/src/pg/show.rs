//! `SHOW` of PostgreSQL's own run-time parameters, which drivers ask for when they connect:
//! SQLAlchemy's PostgreSQL dialect reads `SHOW transaction isolation level` and `SHOW
//! standard_conforming_strings`, JDBC and psql others. Each is answered with what holds for
//! shardwise (`shardwise_query::pg_settings`) as a one-row result named after the parameter, as
//! PostgreSQL names it. `SHOW` of shardwise's own settings goes to the engine, as before.

/// The parameters and their values (shared with `current_setting`).
use shardwise_query::pg_settings::POSTGRES_PARAMETERS as PARAMETERS;

/// The `SELECT` that answers `sql` when it is `SHOW` of one of [`PARAMETERS`]; `None` for any
/// other statement.
pub fn rewrite(sql: &str) -> Option<String> {
    let mut words = super::words(sql, 5);
    // A closing `;` is an empty word.
    while words.last().is_some_and(String::is_empty) {
        words.pop();
    }
    let (first, rest) = words.split_first()?;
    if first != "SHOW" || rest.iter().any(String::is_empty) {
        return None;
    }
    let name = match rest.iter().map(|w| w.to_ascii_lowercase()).collect::<Vec<_>>().join(" ").as_str() {
        // PostgreSQL's spelling with spaces, and its name for the column.
        "transaction isolation level" => "transaction_isolation".to_string(),
        one if !one.contains(' ') => one.to_string(),
        _ => return None,
    };
    // One column named as the parameter, in PostgreSQL's units, as PostgreSQL answers it.
    if name == "statement_timeout" {
        return Some("SELECT current_setting('statement_timeout') AS statement_timeout".to_string());
    }
    let (name, value) = PARAMETERS.iter().find(|(known, _)| *known == name)?;
    Some(format!("SELECT '{value}' AS {name}"))
}

#[cfg(test)]
mod tests {
    use super::rewrite;

    #[test]
    fn postgres_parameters_are_answered() {
        assert_eq!(
            rewrite("show transaction isolation level").as_deref(),
            Some("SELECT 'read committed' AS transaction_isolation")
        );
        assert_eq!(
            rewrite("SHOW standard_conforming_strings;").as_deref(),
            Some("SELECT 'on' AS standard_conforming_strings")
        );
        assert_eq!(rewrite("SHOW DateStyle").as_deref(), Some("SELECT 'ISO, MDY' AS datestyle"));
    }

    #[test]
    fn other_statements_are_left_to_the_engine() {
        assert_eq!(rewrite("SHOW distributed_group_by_no_merge"), None);
        assert_eq!(rewrite("SHOW TABLES"), None);
        assert_eq!(rewrite("SHOW SETTINGS LIKE '%merge%'"), None);
        assert_eq!(rewrite("SELECT 1"), None);
        assert_eq!(rewrite("SHOW transaction isolation"), None);
    }
}
