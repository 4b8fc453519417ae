//! Bulk ingest over Flight SQL (`CommandStatementIngest`): the server side of `shardwise load`.
//!
//! The whole stream is received and checked (schema, row count) before anything is written, so a
//! load that is cut off or malformed leaves the table unchanged; then the rows are inserted as
//! one insert under the client's `insert_id`, which makes a retried load exactly-once.

use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::sql::CommandStatementIngest;
use arrow_flight::sql::server::PeekableFlightDataStream;
use datafusion::arrow::record_batch::RecordBatch;
use futures::TryStreamExt;
use shardwise_query::{InsertOptions, QueryEngine, QueryError};
use tonic::Status;

use crate::flight_sql::to_status;

/// Options a client may give an ingest.
pub const INGEST_OPTIONS: &str = "insert_id, expected_rows, insert_quorum";

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
    for (key, value) in &command.options {
        match key.as_str() {
            "insert_id" => opts.insert_id = Some(value.clone()),
            "expected_rows" => {
                expected_rows = Some(value.parse().map_err(|_| {
                    Status::invalid_argument(format!("ingest option expected_rows = {value:?} is not a row count"))
                })?)
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
    let batches: Vec<RecordBatch> = FlightRecordBatchStream::new_from_flight_data(stream.map_err(Into::into))
        .try_collect()
        .await
        .map_err(|e| Status::invalid_argument(format!("ingest into {table}: the data stream failed: {e}")))?;
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
    if let Some(expected) = expected_rows
        && expected != rows
    {
        return Err(Status::invalid_argument(format!(
            "ingest into {table}: received {rows} rows, the client said it sent {expected}; nothing was written"
        )));
    }
    let inserted = access.insert(&table, batches, opts).await.map_err(to_status)?;
    Ok(i64::try_from(inserted).unwrap_or(i64::MAX))
}

fn describe(schema: &datafusion::arrow::datatypes::Schema) -> String {
    schema.fields().iter().map(|f| format!("{} {}", f.name(), f.data_type())).collect::<Vec<_>>().join(", ")
}
