//! shardwise-server: the network face of a node. For now, the Arrow Flight SQL endpoint
//! ([`flight_sql`]) and [`serve_flight`], which runs it on a listener until shutdown.

pub mod auth;
pub mod error;
pub mod flight_sql;

use std::future::Future;
use std::sync::Arc;

use arrow_flight::flight_service_server::FlightServiceServer;
use shardwise_query::QueryEngine;
use tokio_stream::wrappers::TcpListenerStream;

pub use error::ServerError;
pub use flight_sql::FlightSqlEndpoint;

/// Largest gRPC message accepted or sent by the Flight SQL endpoint. Result batches are split
/// into ~2 MiB messages by the encoder; this bounds what a client may send (`DoPut`, long SQL).
pub const MAX_FLIGHT_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Serves Flight SQL on `listener` until `shutdown` completes, then drains in-flight calls.
pub async fn serve_flight(
    listener: tokio::net::TcpListener,
    engine: Arc<QueryEngine>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let endpoint = FlightSqlEndpoint::new(engine)?;
    let service = FlightServiceServer::new(endpoint)
        .max_decoding_message_size(MAX_FLIGHT_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_FLIGHT_MESSAGE_BYTES);
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "flight sql endpoint listening");
    }
    tonic::transport::Server::builder()
        .add_service(service)
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests;
