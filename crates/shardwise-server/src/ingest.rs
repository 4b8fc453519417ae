//! Bulk ingest over Flight SQL (`CommandStatementIngest`): the server side of `shardwise load`.
//!
//! The whole stream is received and checked (schema, row count) before anything is written, so a
//! load that is cut off or malformed leaves the table unchanged; then the rows are inserted as
//! one insert under the client's `insert_id`, which makes a retried load exactly-once.
//!
//! How the server knows the stream is complete: a client may give `expected_rows` up front, or
//! (what `shardwise load` does, since it sends while it is still reading the file) the option
//! `commit = marker`, and put [`COMMIT_MARKER_PREFIX`]`<rows>` in the `app_metadata` of its last
//! message. A stream that ends without that marker (a client that hit a bad row, or died, half
//! way) writes nothing. Without either option, a cleanly ended stream is complete, as Flight SQL
//! clients such as ADBC expect.

use arrow_flight::decode::{DecodedPayload, FlightDataDecoder};
use arrow_flight::sql::CommandStatementIngest;
use arrow_flight::sql::server::PeekableFlightDataStream;
use datafusion::arrow::record_batch::RecordBatch;
use futures::{StreamExt, TryStreamExt};
use shardwise_query::{InsertOptions, QueryEngine, QueryError};
use tonic::Status;

use crate::flight_sql::to_status;

/// Options a client may give an ingest.
pub const INGEST_OPTIONS: &str = "insert_id, expected_rows, insert_quorum, commit";

/// Start of the `app_metadata` of the last message of a stream sent with `commit = marker`,
/// followed by the number of rows sent.
pub const COMMIT_MARKER_PREFIX: &str = "shardwise-commit rows=";

pub async fn ingest(
    engine: &QueryEngine,
    command: CommandStatementIngest,
    stream: PeekableFlightDataStream,
) -> Result<i64, Status> {
    let access = engine.tables().ok_or_else(|| Status::unimplemented("this node stores no tables"))?;
    if command.catalog.is_some() || command.schema.is_some() {
        return Err(Status::invalid_argument("ingest: tables live in the default catalog and schema; give none"));
    }
    let mut opts = InsertOptions::default();
    let mut expected_rows: Option<u64> = None;
    let mut commit_marker = false;
    for (key, value) in &command.options {
        match key.as_str() {
            "insert_id" => opts.insert_id = Some(value.clone()),
            "expected_rows" => {
                expected_rows = Some(value.parse().map_err(|_| {
                    Status::invalid_argument(format!("ingest option expected_rows = {value:?} is not a row count"))
                })?)
            }
            "commit" if value == "marker" => commit_marker = true,
            "commit" => {
                return Err(Status::invalid_argument(format!("ingest option commit = {value:?}: expected \"marker\"")));
            }
            "insert_quorum" => {
                opts.insert_quorum = Some(value.parse().map_err(|_| {
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
    let table = command.table.clone();
    let catalog = access.catalog();
    let entry = catalog
        .tables
        .get(&table)
        .ok_or_else(|| to_status(QueryError::Rejected(catalog.unknown_table(&table).to_string())))?;
    let started = std::time::Instant::now();
    let mut decoder = FlightDataDecoder::new(stream.map_err(Into::into));
    let mut batches: Vec<RecordBatch> = Vec::new();
    let mut last_metadata = bytes::Bytes::new();
    while let Some(message) = decoder.next().await {
        let message = message
            .map_err(|e| Status::invalid_argument(format!("ingest into {table}: the data stream failed: {e}")))?;
        last_metadata = message.inner.app_metadata.clone();
        if let DecodedPayload::RecordBatch(batch) = message.payload {
            batches.push(batch);
        }
    }
    let schema = &entry.def.schema;
    for batch in &batches {
        let given = batch.schema();
        let same = given.fields().len() == schema.fields().len()
            && given
                .fields()
                .iter()
                .zip(schema.fields())
                .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type());
        if !same {
            return Err(Status::invalid_argument(format!(
                "ingest into {table}: the batches' columns ({}) are not the table's ({})",
                describe(&given),
                describe(schema)
            )));
        }
    }
    let rows: u64 = batches.iter().map(|b| b.num_rows() as u64).sum();
    if commit_marker {
        let marker = std::str::from_utf8(&last_metadata).ok().and_then(|m| m.strip_prefix(COMMIT_MARKER_PREFIX));
        match marker.map(str::parse::<u64>) {
            Some(Ok(sent)) if sent == rows => {}
            Some(Ok(sent)) => {
                return Err(Status::invalid_argument(format!(
                    "ingest into {table}: received {rows} rows, the client's commit marker says {sent}; nothing was written"
                )));
            }
            _ => {
                return Err(Status::invalid_argument(format!(
                    "ingest into {table}: the stream ended without its commit marker (the client stopped before the \
                     end); nothing was written"
                )));
            }
        }
    }
    if let Some(expected) = expected_rows
        && expected != rows
    {
        return Err(Status::invalid_argument(format!(
            "ingest into {table}: received {rows} rows, the client said it sent {expected}; nothing was written"
        )));
    }
    let received_ms = started.elapsed().as_millis() as u64;
    let inserted = access.insert(&table, batches, opts).await.map_err(to_status)?;
    tracing::info!(
        table = %table,
        rows,
        received_ms,
        stored_ms = started.elapsed().as_millis() as u64 - received_ms,
        "bulk ingest"
    );
    Ok(i64::try_from(inserted).unwrap_or(i64::MAX))
}

fn describe(schema: &datafusion::arrow::datatypes::Schema) -> String {
    schema.fields().iter().map(|f| format!("{} {}", f.name(), f.data_type())).collect::<Vec<_>>().join(", ")
}
