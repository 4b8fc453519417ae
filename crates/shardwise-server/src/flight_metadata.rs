//! Flight SQL's metadata calls: `GetCatalogs`, `GetDbSchemas`, `GetTables` (with each table's
//! Arrow schema on request) and `GetTableTypes`, what ADBC's `get_objects` and
//! `get_table_schema`, and JDBC's `DatabaseMetaData` (DBeaver's navigator), send. The rows
//! come from the engine's catalogs ([`shardwise_query::table_listing`]); the filters a call
//! carries (catalog, schema and table name patterns, table types) are applied by arrow-flight's
//! builders, which implement the protocol's `%` / `_` patterns.

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::sql::{
    CommandGetCatalogs, CommandGetDbSchemas, CommandGetTableTypes, CommandGetTables, ProstMessageExt,
};
use arrow_flight::{FlightDescriptor, FlightEndpoint, FlightInfo, Ticket};
use futures::TryStreamExt;
use prost::Message;
use shardwise_query::QueryEngine;
use shardwise_query::table_listing::TABLE_TYPES;
use tonic::Status;

/// A `FlightInfo` whose one endpoint redeems `command` here, answering with `schema`.
pub fn info(
    command: &impl ProstMessageExt,
    schema: &SchemaRef,
    descriptor: FlightDescriptor,
) -> Result<FlightInfo, Status> {
    let ticket = Ticket::new(command.as_any().encode_to_vec());
    Ok(FlightInfo::new()
        .try_with_schema(schema.as_ref())
        .map_err(|e| Status::internal(format!("cannot encode the metadata schema: {e}")))?
        .with_endpoint(FlightEndpoint::new().with_ticket(ticket))
        .with_descriptor(descriptor))
}

/// One batch as a `DoGet` answer.
pub fn answer(
    schema: SchemaRef,
    batch: Result<RecordBatch, FlightError>,
) -> std::pin::Pin<Box<dyn futures::Stream<Item = Result<arrow_flight::FlightData, Status>> + Send>> {
    Box::pin(
        FlightDataEncoderBuilder::new()
            .with_schema(schema)
            .build(futures::stream::once(async { batch }))
            .map_err(Status::from),
    )
}

pub fn catalogs_schema(query: CommandGetCatalogs) -> SchemaRef {
    query.into_builder().schema()
}

pub fn catalogs(engine: &QueryEngine, query: CommandGetCatalogs) -> Result<RecordBatch, FlightError> {
    let mut builder = query.into_builder();
    let mut names: Vec<String> = engine.listed_schemas().into_iter().map(|(catalog, _)| catalog).collect();
    names.dedup();
    for name in names {
        builder.append(name);
    }
    builder.build()
}

pub fn db_schemas_schema(query: CommandGetDbSchemas) -> SchemaRef {
    query.into_builder().schema()
}

pub fn db_schemas(engine: &QueryEngine, query: CommandGetDbSchemas) -> Result<RecordBatch, FlightError> {
    let mut builder = query.into_builder();
    for (catalog, schema) in engine.listed_schemas() {
        builder.append(catalog, schema);
    }
    builder.build()
}

pub fn tables_schema(query: CommandGetTables) -> SchemaRef {
    query.into_builder().schema()
}

pub async fn tables(engine: &QueryEngine, query: CommandGetTables) -> Result<RecordBatch, FlightError> {
    let mut builder = query.into_builder();
    for t in engine.listed_tables().await {
        builder.append(&t.catalog, &t.schema, &t.name, t.table_type, &t.columns)?;
    }
    builder.build()
}

pub fn table_types_schema(query: CommandGetTableTypes) -> SchemaRef {
    query.into_builder().schema()
}

pub fn table_types(query: CommandGetTableTypes) -> Result<RecordBatch, FlightError> {
    let mut builder = query.into_builder();
    for t in TABLE_TYPES {
        builder.append(t);
    }
    builder.build()
}
