//! shardwise-query: the SQL session layer shared by every front end (Flight SQL now, pgwire and
//! HTTP later).
//!
//! A [`QueryEngine`] owns the DataFusion context, knows the `system` tables, decides which
//! statements may run, and classifies failures as the user's or the server's ([`QueryError`]).

pub mod engine;
pub mod error;
pub mod system_tables;

pub use engine::{Planned, QueryEngine};
pub use error::QueryError;

#[cfg(test)]
mod tests;
