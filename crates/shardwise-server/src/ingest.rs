//! Bulk ingest over Flight SQL (`CommandStatementIngest`): the server side of `shardwise load`.
//!
//! Two ways to end a stream, chosen by the client:
//! - **`commit = marker`** (what `shardwise load` sends): the rows are stored **while they
//!   arrive**. They are cut into segments of [`INGEST_SEGMENT_ROWS`] rows counted from the first
//!   row, and segment `k` is inserted as soon as it is complete under the insert id
//!   `<insert_id>/seg-<k>` ([`segment_insert_id`]), up to [`INGEST_SEGMENTS_IN_FLIGHT`] at once,
//!   while later messages are still being received. The last message's `app_metadata` carries
//!   [`COMMIT_MARKER_PREFIX`]`<rows>`; the load is acknowledged once that marker has arrived, its
//!   count matches, and every segment is durable. The server holds at most a few segments in
//!   memory, and the time to receive overlaps the time to store.
//!
//!   `shardwise load` reads and checks the whole file before it sends a byte, so bad input still
//!   changes nothing. A stream cut off part-way (the client died, the network failed) is an
//!   availability failure like a replica lost mid-insert: the segments received may be stored,
//!   the error names the insert id, and re-sending the same rows with the same insert id stores
//!   each segment exactly once (the segments, and so their dedup keys, depend only on the rows'
//!   order). The same holds for a stream whose row count does not match its marker.
//! - **no marker** (third-party Flight SQL clients such as ADBC): the whole stream is received and
//!   checked (schema, `expected_rows` if given) before anything is written, then inserted as one
//!   insert under the client's `insert_id`. A cleanly ended stream is complete. The rows held
//!   meanwhile are reserved from the node's memory pool (`max_server_memory_usage`): an upload
//!   larger than the node can hold fails, with nothing written, instead of taking the node's
//!   memory.
//!
//! Either way, an ingest is shown in `system.queries` while it runs (under the `query_id` option
//! if the client gave one), counts toward `MAX_CONCURRENT_QUERIES`, and stops receiving when
//! `KILL QUERY` names it or when its client sends nothing for [`INGEST_RECEIVE_TIMEOUT_MS`]: the
//! stream's end decides the outcome, and a client that stops sending must not hold the node's
//! memory and a query place for ever.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_flight::decode::{DecodedFlightData, DecodedPayload};
use arrow_flight::sql::CommandStatementIngest;
use arrow_flight::sql::server::PeekableFlightDataStream;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool};
use futures::stream::FuturesUnordered;
use futures::{StreamExt, TryStreamExt};
use shardwise_query::query_log::RunningStatement;
use shardwise_query::{InsertOptions, QueryEngine, QueryError, TableAccess};
use tonic::Status;

use crate::flight_decode::Decoded;
use crate::flight_sql::to_status;
use crate::ingest_schema::conform;

/// Options a client may give an ingest.
pub const INGEST_OPTIONS: &str = "insert_id, expected_rows, insert_quorum, commit, query_id";

/// Longest wait for an ingest's next message, in milliseconds (ClickHouse's `receive_timeout`,
/// 300 s): then the ingest fails as a stream cut off does.
pub const INGEST_RECEIVE_TIMEOUT_MS: u64 = 300_000;

/// Start of the `app_metadata` of the last message of a stream sent with `commit = marker`,
/// followed by the number of rows sent.
pub const COMMIT_MARKER_PREFIX: &str = "shardwise-commit rows=";

/// Rows per segment of a streamed ingest. Part of the dedup keys of a streamed load (a retry must
/// cut the same segments), so it is a format constant, not a setting.
pub const INGEST_SEGMENT_ROWS: usize = 262_144;

/// How many segments of one streamed ingest are being stored at once; receiving waits beyond
/// that, so a fast client cannot fill the server's memory.
pub const INGEST_SEGMENTS_IN_FLIGHT: usize = 2;

/// Between a streamed ingest's insert id and a segment number.
const SEGMENT_SEPARATOR: &str = "/seg-";

/// The insert id segment `segment` of a streamed ingest with insert id `insert_id` is stored under.
pub fn segment_insert_id(insert_id: &str, segment: u64) -> String {
    format!("{insert_id}{SEGMENT_SEPARATOR}{segment}")
}

/// The insert id a client gives and retries with: for a segment of a streamed ingest, the ingest's
/// own id; any other id as it is.
pub fn client_insert_id(insert_id: &str) -> &str {
    match insert_id.rsplit_once(SEGMENT_SEPARATOR) {
        Some((id, segment)) if !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit()) => id,
        _ => insert_id,
    }
}

/// What the client asked for in the command's options.
struct IngestRequest {
    table: String,
    opts: InsertOptions,
    expected_rows: Option<u64>,
    commit_marker: bool,
    query_id: Option<String>,
}

pub async fn ingest(
    engine: &QueryEngine,
    command: CommandStatementIngest,
    stream: PeekableFlightDataStream,
) -> Result<i64, Status> {
    let access = engine.tables().ok_or_else(|| Status::unimplemented("this node stores no tables"))?;
    let catalog = access.catalog();
    crate::ingest_schema::check_definition_options(&command, catalog.tables.contains_key(&command.table))?;
    let mut request = parse_command(command)?;
    let started = Instant::now();
    // A streamed load is stored under an insert id, which its error gives for a retry; one the
    // client did not give is made here, so that `system.queries` shows it too.
    if request.commit_marker && request.opts.insert_id.is_none() {
        request.opts.insert_id = Some(uuid::Uuid::new_v4().to_string());
    }
    let sql = match &request.opts.insert_id {
        Some(id) => format!("INSERT INTO {} (Flight SQL bulk ingest, insert_id {id:?})", request.table),
        None => format!("INSERT INTO {} (Flight SQL bulk ingest)", request.table),
    };
    let statement = engine.begin_statement(&sql, request.query_id.clone()).map_err(to_status)?;
    let Some(entry) = catalog.tables.get(&request.table) else {
        let status = to_status(QueryError::Rejected(catalog.unknown_table(&request.table).to_string()));
        statement.end(Err(status.message().to_string()));
        return Err(status);
    };
    let decoder = crate::flight_decode::decoded(stream.map_err(Into::into));
    let schema = entry.def.schema.clone();
    // Every segment of a streamed load goes to this incarnation of the table or fails.
    request.opts.incarnation = Some((entry.id, entry.generation));
    let call = Ingest {
        access: access.as_ref(),
        request: &request,
        schema: &schema,
        started,
        statement: &statement,
        memory: engine.memory_pool(),
    };
    let outcome = if request.commit_marker { call.streamed(decoder).await } else { call.whole(decoder).await };
    // One row answered (the count), as for every insert in `system.queries`.
    statement.end(outcome.as_ref().map(|_| 1).map_err(|status| status.message().to_string()));
    let outcome = outcome?;
    tracing::debug!(
        table = %request.table,
        insert_id = %request.opts.insert_id.as_deref().unwrap_or(""),
        rows = outcome.rows,
        streamed = request.commit_marker,
        received_us = outcome.received_us,
        stored_us = (started.elapsed().as_micros() as u64).saturating_sub(outcome.received_us),
        "bulk ingest"
    );
    Ok(i64::try_from(outcome.rows).unwrap_or(i64::MAX))
}

fn parse_command(command: CommandStatementIngest) -> Result<IngestRequest, Status> {
    if command.catalog.is_some() || command.schema.is_some() {
        return Err(Status::invalid_argument("ingest: tables live in the default catalog and schema; give none"));
    }
    let mut request = IngestRequest {
        table: command.table,
        opts: InsertOptions::default(),
        expected_rows: None,
        commit_marker: false,
        query_id: None,
    };
    for (key, value) in &command.options {
        match key.as_str() {
            "insert_id" => {
                crate::tables::check_insert_id(value)
                    .map_err(|e| Status::invalid_argument(format!("ingest option {e}")))?;
                request.opts.insert_id = Some(value.clone())
            }
            "expected_rows" => {
                request.expected_rows = Some(value.parse().map_err(|_| {
                    Status::invalid_argument(format!("ingest option expected_rows = {value:?} is not a row count"))
                })?)
            }
            "commit" if value == "marker" => request.commit_marker = true,
            "query_id" => request.query_id = Some(value.clone()),
            "commit" => {
                return Err(Status::invalid_argument(format!("ingest option commit = {value:?}: expected \"marker\"")));
            }
            "insert_quorum" => {
                request.opts.insert_quorum = Some(value.parse().map_err(|_| {
                    Status::invalid_argument(format!("ingest option insert_quorum = {value:?} is not a number"))
                })?)
            }
            other => {
                return Err(Status::invalid_argument(format!(
                    "unknown ingest option {other:?}; known: {INGEST_OPTIONS}"
                )));
            }
        }
    }
    Ok(request)
}

/// Rows stored, and how long receiving the stream took (for the log).
struct Outcome {
    rows: u64,
    received_us: u64,
}

/// One ingest call being served.
struct Ingest<'a> {
    access: &'a dyn TableAccess,
    request: &'a IngestRequest,
    schema: &'a SchemaRef,
    started: Instant,
    statement: &'a RunningStatement,
    /// The node's pool, which the rows held by [`Ingest::whole`] are reserved from.
    memory: Arc<dyn MemoryPool>,
}

impl Ingest<'_> {
    /// The next message, or `None` at the stream's end (see [`next_message`]).
    async fn next(&self, decoder: &mut Decoded, outcome: &str) -> Result<Option<DecodedFlightData>, Status> {
        let receive_timeout = Duration::from_millis(INGEST_RECEIVE_TIMEOUT_MS);
        next_message(decoder, &self.request.table, outcome, receive_timeout, self.statement).await
    }

    /// The whole stream first, then one insert: for clients that send no commit marker.
    async fn whole(&self, mut decoder: Decoded) -> Result<Outcome, Status> {
        let Ingest { access, request, schema, started, .. } = self;
        let table = &request.table;
        let nothing = "nothing was written";
        let mut batches: Vec<RecordBatch> = Vec::new();
        let held = MemoryConsumer::new(format!("bulk ingest into {table}")).register(&self.memory);
        while let Some(message) = self.next(&mut decoder, nothing).await? {
            if let DecodedPayload::RecordBatch(batch) = message.payload {
                // What arrived: the decoded columns are slices of the message's body. (Their
                // `get_array_memory_size` counts that body once per buffer that points into it,
                // three times over for a string column.)
                let arrived = message.inner.data_body.len() + message.inner.data_header.len();
                if let Err(e) = held.try_grow(arrived) {
                    return Err(Status::resource_exhausted(format!(
                        "ingest into {table}: the rows received so far ({} bytes as sent) and the next message's {arrived} \
                         bytes do not fit in this node's memory ({e}); {nothing}. An upload without a commit marker is \
                         held whole until it ends: send it with commit = marker (as shardwise load does), which stores \
                         rows as they arrive, or in smaller uploads",
                        held.size()
                    )));
                }
                batches.push(conform(table, batch, schema, nothing)?);
            }
        }
        let rows: u64 = batches.iter().map(|b| b.num_rows() as u64).sum();
        if let Some(expected) = request.expected_rows
            && expected != rows
        {
            return Err(Status::invalid_argument(format!(
                "ingest into {table}: received {rows} rows, the client said it sent {expected}; nothing was written"
            )));
        }
        let received_us = started.elapsed().as_micros() as u64;
        let rows = access.insert(table, batches, request.opts.clone()).await.map_err(to_status)?;
        drop(held);
        Ok(Outcome { rows, received_us })
    }

    /// Stores segments while the stream arrives: for clients that end it with a commit marker.
    async fn streamed(&self, mut decoder: Decoded) -> Result<Outcome, Status> {
        let Ingest { access, request, schema, started, .. } = *self;
        let table = &request.table;
        let insert_id = request.opts.insert_id.clone().unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        debug_assert!(request.opts.insert_id.is_some(), "made by `ingest` for a streamed load");
        let unfinished = format!(
            "segments received before it may be stored; re-send the same rows with insert id {insert_id} (shardwise \
             load --insert-id {insert_id}) to complete the load exactly once"
        );
        let mut segments = Segments::new(access, table, &insert_id, &request.opts);
        let mut last_metadata = bytes::Bytes::new();
        let mut received: u64 = 0;
        loop {
            // Receive only while fewer than INGEST_SEGMENTS_IN_FLIGHT segments are being stored.
            let message = tokio::select! {
                done = segments.in_flight.next(), if !segments.in_flight.is_empty() => {
                    if let Some(Err(e)) = done {
                        return Err(segments.failed(e, &unfinished).await);
                    }
                    continue;
                }
                message = self.next(&mut decoder, &unfinished), if segments.in_flight.len() < INGEST_SEGMENTS_IN_FLIGHT => message,
            };
            let message = match message {
                Ok(Some(message)) => message,
                Ok(None) => break,
                Err(e) => return Err(segments.drained(e).await),
            };
            last_metadata = message.inner.app_metadata.clone();
            if let DecodedPayload::RecordBatch(batch) = message.payload {
                let batch = match conform(table, batch, schema, &unfinished) {
                    Ok(batch) => batch,
                    Err(e) => return Err(segments.drained(e).await),
                };
                received += batch.num_rows() as u64;
                segments.push(batch);
            }
        }
        let received_us = started.elapsed().as_micros() as u64;
        let marker = std::str::from_utf8(&last_metadata).ok().and_then(|m| m.strip_prefix(COMMIT_MARKER_PREFIX));
        let problem = match marker.map(str::parse::<u64>) {
            Some(Ok(sent)) if sent == received => None,
            Some(Ok(sent)) => Some(format!("received {received} rows, the client's commit marker says {sent}")),
            _ => Some(format!(
                "the stream ended without its commit marker after {received} rows (the client stopped before the end)"
            )),
        };
        if let Some(problem) = problem {
            return Err(segments
                .drained(Status::invalid_argument(format!("ingest into {table}: {problem}; {unfinished}")))
                .await);
        }
        if let Some(expected) = request.expected_rows
            && expected != received
        {
            let problem = format!("received {received} rows, the client said it sent {expected}");
            return Err(segments
                .drained(Status::invalid_argument(format!("ingest into {table}: {problem}; {unfinished}")))
                .await);
        }
        segments.finish();
        while let Some(done) = segments.in_flight.next().await {
            if let Err(e) = done {
                return Err(segments.failed(e, &unfinished).await);
            }
        }
        Ok(Outcome { rows: received, received_us })
    }
}

/// The next message of an ingest into `table`, or `None` at the stream's end; an error when the
/// stream fails, when nothing comes for `receive_timeout`, or when `KILL QUERY` names
/// `statement`. `outcome` says what became of the rows.
async fn next_message(
    decoder: &mut Decoded,
    table: &str,
    outcome: &str,
    receive_timeout: Duration,
    statement: &RunningStatement,
) -> Result<Option<DecodedFlightData>, Status> {
    tokio::select! {
        message = tokio::time::timeout(receive_timeout, decoder.next()) => match message {
            Ok(Some(Ok(message))) => Ok(Some(message)),
            Ok(Some(Err(e))) => Err(stream_failed(table, e, outcome)),
            Ok(None) => Ok(None),
            Err(_) => Err(Status::deadline_exceeded(format!(
                "ingest into {table}: the client sent nothing for {} s (INGEST_RECEIVE_TIMEOUT_MS); {outcome}",
                receive_timeout.as_secs_f64()
            ))),
        },
        () = statement.killed() => {
            Err(to_status(QueryError::Rejected(format!("{}; {outcome}", shardwise_query::error::KILLED))))
        }
    }
}

type SegmentInsert<'a> = shardwise_cluster::BoxFuture<'a, Result<u64, QueryError>>;

/// The segments of a streamed ingest: rows waiting for their segment to fill, and the inserts of
/// full segments under way.
struct Segments<'a> {
    access: &'a dyn TableAccess,
    table: &'a str,
    insert_id: &'a str,
    opts: &'a InsertOptions,
    pending: Vec<RecordBatch>,
    pending_rows: usize,
    next: u64,
    in_flight: FuturesUnordered<SegmentInsert<'a>>,
}

impl<'a> Segments<'a> {
    fn new(access: &'a dyn TableAccess, table: &'a str, insert_id: &'a str, opts: &'a InsertOptions) -> Self {
        Segments {
            access,
            table,
            insert_id,
            opts,
            pending: Vec::new(),
            pending_rows: 0,
            next: 0,
            in_flight: FuturesUnordered::new(),
        }
    }

    /// Adds received rows; starts the insert of every segment they complete.
    fn push(&mut self, batch: RecordBatch) {
        let mut offset = 0;
        while offset < batch.num_rows() {
            let take = (INGEST_SEGMENT_ROWS - self.pending_rows).min(batch.num_rows() - offset);
            self.pending.push(batch.slice(offset, take));
            self.pending_rows += take;
            offset += take;
            if self.pending_rows == INGEST_SEGMENT_ROWS {
                self.start();
            }
        }
    }

    /// Starts the insert of the last, partial segment.
    fn finish(&mut self) {
        if self.pending_rows > 0 {
            self.start();
        }
    }

    fn start(&mut self) {
        let batches = std::mem::take(&mut self.pending);
        self.pending_rows = 0;
        let opts = InsertOptions {
            insert_id: Some(segment_insert_id(self.insert_id, self.next)),
            insert_quorum: self.opts.insert_quorum,
            foreground: self.opts.foreground,
            incarnation: self.opts.incarnation,
            // A load sends its rows in the file's order, the same on every retry.
            order_may_vary: false,
        };
        self.next += 1;
        self.in_flight.push(self.access.insert(self.table, batches, opts));
    }

    /// Waits for the inserts under way (so the error is the last word on this ingest), then
    /// returns `error`.
    async fn drained(&mut self, error: Status) -> Status {
        while self.in_flight.next().await.is_some() {}
        error
    }

    /// A segment's insert failed: its error, with what the client should do.
    async fn failed(&mut self, e: QueryError, unfinished: &str) -> Status {
        let mut status = to_status(e);
        let message = format!("ingest into {}: {}; {unfinished}", self.table, status.message());
        status = Status::new(status.code(), message);
        self.drained(status).await
    }
}

fn stream_failed(table: &str, e: arrow_flight::error::FlightError, outcome: &str) -> Status {
    Status::invalid_argument(format!("ingest into {table}: the data stream failed: {e}; {outcome}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client that sends nothing is given up after the receive timeout, and `KILL QUERY` stops
    /// the wait at once; either way the error says what became of the rows.
    #[tokio::test]
    async fn a_silent_stream_times_out_and_a_killed_one_stops() {
        let log = Arc::new(shardwise_query::query_log::QueryLog::default());
        let statement = log.begin("INSERT INTO t (Flight SQL bulk ingest)", Some("q1".into())).unwrap();
        let mut silent: Decoded = futures::stream::pending().boxed();
        let started = Instant::now();
        let waited = next_message(&mut silent, "t", "nothing was written", Duration::from_millis(200), &statement);
        let status = waited.await.expect_err("no timeout");
        assert!(started.elapsed() >= Duration::from_millis(190));
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
        assert!(status.message().contains("sent nothing for 0.2 s (INGEST_RECEIVE_TIMEOUT_MS); nothing was written"));
        assert!(log.kill("q1"));
        let waited = next_message(&mut silent, "t", "nothing was written", Duration::from_secs(60), &statement);
        let status = waited.await.expect_err("not stopped");
        assert_eq!(status.code(), tonic::Code::Cancelled);
        assert!(status.message().contains("KILL QUERY; nothing was written"), "{}", status.message());
        statement.end(Err(status.message().to_string()));
        let records = log.snapshot();
        assert_eq!((records.len(), records[0].state.as_str()), (1, "killed"));
    }

    #[test]
    fn segment_ids_retry_as_the_ingest_id() {
        assert_eq!(segment_insert_id("load-1", 7), "load-1/seg-7");
        assert_eq!(client_insert_id(&segment_insert_id("load-1", 7)), "load-1");
        assert_eq!(client_insert_id("a/seg-"), "a/seg-");
        assert_eq!(client_insert_id("a/seg-x"), "a/seg-x");
        assert_eq!(client_insert_id("plain"), "plain");
    }
}
