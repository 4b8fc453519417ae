//! The one error type of the server crate: what can stop an endpoint from starting or serving.

/// Failure to start or run a network endpoint.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The Flight SQL server failed (bad listener, fatal transport error).
    #[error("flight sql server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The static server description (`GetSqlInfo`) could not be built.
    #[error("cannot build the flight sql server description: {0}")]
    SqlInfo(#[source] arrow_flight::error::FlightError),
    /// The HTTP server failed.
    #[error("http server failed: {0}")]
    Http(#[source] std::io::Error),
}
