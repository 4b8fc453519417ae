//! shardwise-server: a node's services. The client-facing Arrow Flight SQL endpoint
//! ([`flight_sql`], run by [`serve_flight`]), the table layer that stores shards and ships
//! inserts ([`tables`]), the data plane between nodes ([`data_plane`]), the catalog's DDL
//! machine ([`catalog_machine`]), and [`services::Services`], which starts them all for a
//! joined node.

pub mod auth;
pub mod bound_insert;
pub mod catalog_machine;
pub mod codec;
pub mod connections;
pub mod csv_text;
pub mod data_plane;
pub mod error;
pub mod executed;
pub mod flight_decode;
pub mod flight_metadata;
pub mod flight_params;
pub mod flight_plans;
pub mod flight_schema;
pub mod flight_split;
pub mod flight_sql;
pub mod fragment_report;
pub mod held_port;
pub mod http;
pub mod http2;
pub mod http_connections;
pub mod http_insert;
pub mod ingest;
pub mod ingest_schema;
pub mod json_lines;
pub mod pg;
pub mod services;
pub mod settings;
pub mod tables;
pub mod ticket_store;
pub mod users;

use std::future::Future;
use std::sync::Arc;

use arrow_flight::flight_service_server::FlightServiceServer;
use shardwise_query::QueryEngine;

pub use catalog_machine::CatalogMachine;
pub use error::ServerError;
pub use flight_sql::FlightSqlEndpoint;
pub use services::{Listeners, Ports, ServiceOptions, Services};
pub use settings::StorageSettings;

/// Largest gRPC message accepted or sent by the Flight SQL endpoint. Result batches are split
/// into ~2 MiB messages by the encoder; this bounds what a client may send (`DoPut`, long SQL).
pub const MAX_FLIGHT_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Serves Flight SQL on `listener` until `shutdown` completes, then drains in-flight calls.
pub async fn serve_flight(
    listener: tokio::net::TcpListener,
    engine: Arc<QueryEngine>,
    users: Arc<users::Users>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let sessions = Arc::new(connections::Sessions::default());
    let endpoint = FlightSqlEndpoint::new(engine, Arc::clone(&sessions), users)?;
    let gate = endpoint.gate();
    let service = FlightServiceServer::new(endpoint)
        .max_decoding_message_size(MAX_FLIGHT_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_FLIGHT_MESSAGE_BYTES);
    // Credentials are checked before a call's message is read (each handler checks again, and
    // learns the user): else anyone could make the node buffer up to MAX_FLIGHT_MESSAGE_BYTES
    // per stream before it refused them.
    let service = tonic::service::interceptor::InterceptedService::new(service, move |req: tonic::Request<()>| {
        gate.authorize(req.metadata())?;
        connections::admit(&req);
        Ok(req)
    });
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "flight sql endpoint listening");
    }
    http2::server(tonic::transport::Server::builder())
        .add_service(service)
        .serve_with_incoming_shutdown(connections::tracked_grpc(listener, sessions), shutdown)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests;
