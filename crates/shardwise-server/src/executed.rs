//! Results of statements the Flight SQL endpoint ran when they were submitted, held until the
//! client fetches them.
//!
//! Flight SQL runs a statement in two calls: `GetFlightInfo` plans it and returns a ticket, and
//! `DoGet` with the ticket streams the rows. A client that submits DDL or an `INSERT` through the
//! query path and never fetches (ADBC's `cursor.execute`, for one, may close the cursor first)
//! would otherwise never run it, or race its own close. So statements run for their effect
//! ([`shardwise_query::Planned::runs_for_effect`]) run at `GetFlightInfo`, and their small result
//! (nothing, or a row count) waits here under a ticket of its own for `DoGet`, for at most
//! [`EXECUTED_RESULT_TTL_MS`]; at most [`EXECUTED_RESULTS_MAX`] wait at once, the oldest going
//! first.

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;

use crate::ticket_store::TicketStore;

/// How long a result waits to be fetched.
pub const EXECUTED_RESULT_TTL_MS: u64 = 60_000;

/// Most results waiting at once.
pub const EXECUTED_RESULTS_MAX: usize = 1024;

/// The ticket handle of a waiting result starts with this; no SQL text does.
const HANDLE_PREFIX: &[u8] = b"\0executed:";

/// A result waiting to be fetched.
#[derive(Debug)]
pub struct Executed {
    pub schema: SchemaRef,
    pub batches: Vec<RecordBatch>,
}

/// The waiting results of one endpoint.
pub type ExecutedResults = TicketStore<Executed>;

/// An empty store of waiting results.
pub fn executed_results() -> ExecutedResults {
    TicketStore::new(HANDLE_PREFIX, EXECUTED_RESULT_TTL_MS, EXECUTED_RESULTS_MAX)
}
