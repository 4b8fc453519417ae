//! A client session: the settings `SET` changed, kept for one connection and applied over the
//! node's defaults to every statement it runs, as in ClickHouse, PostgreSQL and DuckDB. A
//! statement's own `SETTINGS` clause comes on top, for that statement only.
//!
//! Front ends decide what a session is: the Flight SQL endpoint keeps one per TCP connection
//! and drops it when the connection closes.

use std::sync::Mutex;

use datafusion::common::config::ConfigOptions;

use crate::error::QueryError;
use crate::settings;

/// Most settings one session may change: every one is re-applied to each statement.
pub const SESSION_SETTINGS_MAX: usize = 256;

/// Settings that name one statement, so a session may not keep them, and why.
const STATEMENT_ONLY: [(&str, &str); 2] = [
    (
        "insert_id",
        "insert_id names one insert and cannot be set for a session: give it in the INSERT, \
         `INSERT ... SETTINGS insert_id = '...'` (or `shardwise load --insert-id`)",
    ),
    (
        "query_id",
        "query_id names one query and cannot be set for a session: give it in the statement, \
         `... SETTINGS query_id = '...'`",
    ),
];

/// See the module doc.
#[derive(Debug, Default)]
pub struct Session {
    /// (option key, value) in the order set; a key appears once.
    changed: Mutex<Vec<(String, String)>>,
    /// The session runs one statement and ends (an HTTP request): its settings are that
    /// statement's, so `insert_id` may be one of them.
    one_statement: bool,
    /// The node's own statements (the figures of `GET /metrics`): not recorded in
    /// `system.queries` nor counted among the queries the node ran for its clients.
    unrecorded: bool,
}

impl Session {
    /// A session with every setting at the node's default.
    pub fn new() -> Self {
        Self::default()
    }

    /// A session for one statement only (an HTTP request), whose settings may name its insert.
    pub fn for_one_statement() -> Self {
        Session { one_statement: true, ..Self::default() }
    }

    /// A session for the node's own statements, left out of `system.queries` and its counters:
    /// a Prometheus scrape every 15 s would otherwise push the clients' queries out of the log.
    pub fn unrecorded() -> Self {
        Session { unrecorded: true, ..Self::default() }
    }

    /// Whether its statements are recorded in `system.queries`.
    pub fn is_recorded(&self) -> bool {
        !self.unrecorded
    }

    /// What `SET` changed, in order.
    pub fn changed(&self) -> Vec<(String, String)> {
        self.lock().clone()
    }

    /// Applies the session's settings to `options`.
    pub fn apply(&self, options: &mut ConfigOptions) -> Result<(), QueryError> {
        settings::apply(options, &self.changed())
    }

    /// `SET key = value`: checked against `options` (a copy is changed, so a bad value changes
    /// nothing), then kept.
    pub fn set(&self, options: &ConfigOptions, key: &str, value: &str) -> Result<(), QueryError> {
        // An insert id names one insert: kept for the session, it made every later insert a
        // retry of the first, dropped on the shards the first had written (rows lost silently).
        // A query id names one query, and two running queries may not share one.
        if !self.one_statement
            && let Some((_, why)) = STATEMENT_ONLY.iter().find(|(name, _)| {
                key.eq_ignore_ascii_case(name) || key.eq_ignore_ascii_case(&format!("shardwise.{name}"))
            })
        {
            return Err(QueryError::Rejected(why.to_string()));
        }
        let pair = (key.to_string(), value.to_string());
        settings::apply(&mut options.clone(), std::slice::from_ref(&pair))?;
        let mut changed = self.lock();
        changed.retain(|(k, _)| k != key);
        if changed.len() >= SESSION_SETTINGS_MAX {
            return Err(QueryError::Rejected(format!(
                "a session may change at most {SESSION_SETTINGS_MAX} settings (SESSION_SETTINGS_MAX)"
            )));
        }
        changed.push(pair);
        Ok(())
    }

    /// `RESET key`: back to the node's default; `RESET ALL`: every setting the session changed.
    pub fn reset(&self, key: &str) {
        match key.eq_ignore_ascii_case("all") {
            true => self.lock().clear(),
            false => self.lock().retain(|(k, _)| k != key),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(String, String)>> {
        self.changed.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use datafusion::prelude::SessionConfig;

    use super::*;
    use crate::ShardwiseSettings;

    fn options() -> ConfigOptions {
        SessionConfig::new().with_option_extension(ShardwiseSettings::default()).options().as_ref().clone()
    }

    #[test]
    fn an_insert_id_is_the_setting_of_a_one_statement_session() {
        let session = Session::for_one_statement();
        session.set(&options(), "shardwise.insert_id", "a-1").expect("one statement's insert");
        let mut applied = options();
        session.apply(&mut applied).expect("applies");
        assert_eq!(settings::current(&applied).insert_id.as_deref(), Some("a-1"));
    }

    #[test]
    fn an_insert_id_is_not_a_session_setting() {
        let session = Session::default();
        let e = session.set(&options(), "insert_id", "a-1").expect_err("refused");
        assert!(e.to_string().contains("SETTINGS insert_id"), "{e}");
        assert!(session.changed().is_empty());
    }

    #[test]
    fn set_keeps_the_last_value_and_a_bad_value_changes_nothing() {
        let session = Session::new();
        let base = options();
        session.set(&base, "shardwise.distributed_aggregation", "shuffle").expect("set");
        session.set(&base, "shardwise.max_memory_usage", "1000").expect("set");
        session.set(&base, "shardwise.distributed_aggregation", "initiator").expect("set again");
        assert!(session.set(&base, "shardwise.distributed_aggregation", "sideways").is_err());
        assert_eq!(
            session.changed(),
            vec![
                ("shardwise.max_memory_usage".to_string(), "1000".to_string()),
                ("shardwise.distributed_aggregation".to_string(), "initiator".to_string()),
            ]
        );
        let mut applied = options();
        session.apply(&mut applied).expect("apply");
        assert_eq!(settings::current(&applied).max_memory_usage, 1000);
        session.reset("shardwise.max_memory_usage");
        assert_eq!(session.changed().len(), 1);
        // RESET ALL (PostgreSQL's, and part of DISCARD ALL) forgets every change.
        session.reset("ALL");
        assert!(session.changed().is_empty());
    }
}
