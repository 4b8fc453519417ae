//! Queries the Flight SQL endpoint planned at `GetFlightInfo`, kept for the `DoGet` that follows.
//!
//! `GetFlightInfo` must plan a query to describe its result; `DoGet` runs it. Planning is most of
//! a small query's fixed cost (parsing, the analyzer and shardwise's rewrites), so the plan waits
//! here for the `DoGet`, in a [`TicketStore`]. The ticket carries the SQL text too: a ticket whose
//! plan is gone (expired after [`PLANNED_QUERY_TTL_MS`], pushed out by newer ones past
//! [`PLANNED_QUERIES_MAX`], taken by an earlier `DoGet`) or redeemed on another connection than
//! the one that planned it is planned again from its text, in the redeeming session, as before
//! plans were kept. The plan is a logical one: optimization and physical planning happen when it
//! runs, so `now()` and the shards it reads are those of the `DoGet`.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use shardwise_query::{Planned, Session};

use crate::ticket_store::TicketStore;

/// How long a plan waits for its `DoGet`.
pub const PLANNED_QUERY_TTL_MS: u64 = 30_000;

/// Most plans waiting at once.
pub const PLANNED_QUERIES_MAX: usize = 1024;

/// A ticket handle naming a kept plan starts with this; no SQL text does.
const HANDLE_PREFIX: &[u8] = b"\0planned:";

/// A query planned at `GetFlightInfo`.
pub struct PlannedQuery {
    pub planned: Planned,
    /// The schema `GetFlightInfo` announced (see `flight_schema`).
    pub schema: SchemaRef,
    /// The session it was planned in.
    pub session: Arc<Session>,
}

impl std::fmt::Debug for PlannedQuery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlannedQuery").field("schema", &self.schema).finish_non_exhaustive()
    }
}

/// What a ticket handle of this kind redeems for.
pub enum Redeemed<'a> {
    /// The plan, kept and planned in the redeeming session.
    Plan(Box<PlannedQuery>),
    /// The SQL to plan again.
    Sql(&'a [u8]),
}

/// The plans of one endpoint.
#[derive(Debug)]
pub struct PlannedQueries {
    store: TicketStore<PlannedQuery>,
}

impl Default for PlannedQueries {
    fn default() -> Self {
        PlannedQueries { store: TicketStore::new(HANDLE_PREFIX, PLANNED_QUERY_TTL_MS, PLANNED_QUERIES_MAX) }
    }
}

impl PlannedQueries {
    /// Keeps `query` (planned from `sql`) and returns the ticket handle that redeems it.
    pub fn keep(&self, query: PlannedQuery, sql: &str) -> Vec<u8> {
        let mut handle = self.store.put(query);
        handle.extend_from_slice(sql.as_bytes());
        handle
    }

    /// What `handle` redeems for in `session`; `None` when it is not a handle of this kind.
    pub fn redeem<'a>(&self, handle: &'a [u8], session: &Arc<Session>) -> Option<Redeemed<'a>> {
        let (key, sql) = self.store.split(handle)?;
        Some(match self.store.take(key) {
            Some(kept) if Arc::ptr_eq(&kept.session, session) => Redeemed::Plan(Box::new(kept)),
            _ => Redeemed::Sql(sql),
        })
    }
}
