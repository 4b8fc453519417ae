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

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;

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
#[derive(Debug, Default)]
pub struct ExecutedResults {
    waiting: Mutex<VecDeque<(Vec<u8>, Instant, Executed)>>,
}

impl ExecutedResults {
    /// Keeps `result` and returns the ticket handle that fetches it.
    pub fn put(&self, result: Executed) -> Vec<u8> {
        let mut handle = HANDLE_PREFIX.to_vec();
        handle.extend_from_slice(uuid::Uuid::new_v4().simple().to_string().as_bytes());
        let mut waiting = self.lock();
        expire(&mut waiting);
        if waiting.len() >= EXECUTED_RESULTS_MAX {
            waiting.pop_front();
        }
        waiting.push_back((handle.clone(), Instant::now(), result));
        handle
    }

    /// True when `handle` names a waiting result rather than SQL.
    pub fn is_handle(handle: &[u8]) -> bool {
        handle.starts_with(HANDLE_PREFIX)
    }

    /// Takes the result `handle` names; `None` when it expired or was fetched already.
    pub fn take(&self, handle: &[u8]) -> Option<Executed> {
        let mut waiting = self.lock();
        expire(&mut waiting);
        let at = waiting.iter().position(|(h, _, _)| h == handle)?;
        waiting.remove(at).map(|(_, _, result)| result)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(Vec<u8>, Instant, Executed)>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn expire(waiting: &mut VecDeque<(Vec<u8>, Instant, Executed)>) {
    let ttl = Duration::from_millis(EXECUTED_RESULT_TTL_MS);
    while waiting.front().is_some_and(|(_, at, _)| at.elapsed() > ttl) {
        waiting.pop_front();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::Schema;
    use std::sync::Arc;

    fn empty() -> Executed {
        Executed { schema: Arc::new(Schema::empty()), batches: Vec::new() }
    }

    #[test]
    fn a_result_is_fetched_once() {
        let results = ExecutedResults::default();
        let handle = results.put(empty());
        assert!(ExecutedResults::is_handle(&handle));
        assert!(!ExecutedResults::is_handle(b"SELECT 1"));
        assert!(results.take(&handle).is_some());
        assert!(results.take(&handle).is_none());
    }

    #[test]
    fn the_oldest_goes_when_full() {
        let results = ExecutedResults::default();
        let first = results.put(empty());
        for _ in 0..EXECUTED_RESULTS_MAX {
            results.put(empty());
        }
        assert!(results.take(&first).is_none());
    }
}
