//! The Flight SQL side of `shardwise load` before the ingest: connecting and logging in to a node
//! (as `shardwise sql` does; its helpers are private to `cmd_sql.rs`, so they are repeated here
//! until the two share a client module), learning the table's schema, and wording errors.

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use arrow::datatypes::SchemaRef;
use arrow_flight::HandshakeRequest;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::sql::client::FlightSqlServiceClient;
use base64::Engine as _;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

/// Largest gRPC message the client accepts (as `shardwise sql`; matches the server's limit).
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// The table's schema: the result schema of `SELECT * FROM "table" LIMIT 0` (planned, not run).
pub async fn table_schema(
    client: &mut FlightSqlServiceClient<Channel>,
    addr: &str,
    table: &str,
) -> anyhow::Result<SchemaRef> {
    let sql = format!("SELECT * FROM {} LIMIT 0", quote_identifier(table));
    let info = client.execute(sql, None).await.map_err(|e| match &e {
        FlightError::Tonic(status)
            if matches!(status.code(), Code::InvalidArgument | Code::NotFound)
                && status.message().contains("not found") =>
        {
            anyhow!(
                "table {} does not exist on {addr} (the server says: {})",
                quote_identifier(table),
                status.message()
            )
        }
        _ => {
            anyhow!("cannot learn the columns of table {} from {addr}: {}", quote_identifier(table), flight_message(e))
        }
    })?;
    let schema = info.try_decode_schema().with_context(|| format!("{addr} sent a schema that cannot be decoded"))?;
    if schema.fields().is_empty() {
        bail!("table {} has no columns", quote_identifier(table));
    }
    Ok(Arc::new(schema))
}

/// `name` as a SQL identifier: in double quotes, inner double quotes doubled, case kept.
pub fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Connects to `addr` (`host:port` or a URI) and logs in.
pub async fn connect(
    addr: &str,
    user: &str,
    password: &str,
    timeout: Duration,
) -> anyhow::Result<FlightSqlServiceClient<Channel>> {
    let uri = if addr.contains("://") { addr.to_string() } else { format!("http://{addr}") };
    let endpoint = Endpoint::from_shared(uri)
        .map_err(|e| anyhow!("invalid address {addr:?}: {}", error_chain(&e)))?
        .connect_timeout(timeout);
    let channel = match tokio::time::timeout(timeout, endpoint.connect()).await {
        Ok(Ok(channel)) => channel,
        Ok(Err(e)) => bail!("could not connect to {addr}: {}", error_chain(&e)),
        Err(_) => bail!("could not connect to {addr}: timed out after {} ms", timeout.as_millis()),
    };
    let inner = FlightServiceClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES);
    let mut client = FlightSqlServiceClient::new_from_inner(inner);
    handshake(&mut client, user, password)
        .await
        .map_err(|message| anyhow!("could not log in to {addr} as {user:?}: {message}"))?;
    Ok(client)
}

/// Basic-auth handshake; keeps the bearer token the server returns.
async fn handshake(client: &mut FlightSqlServiceClient<Channel>, user: &str, password: &str) -> Result<(), String> {
    let credentials = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let header = format!("Basic {credentials}")
        .parse()
        .map_err(|_| "user name or password cannot be sent in a header".to_string())?;
    let hello = HandshakeRequest { protocol_version: 0, payload: Default::default() };
    let mut request = tonic::Request::new(futures::stream::iter([hello]));
    request.metadata_mut().insert("authorization", header);
    let response = client.inner_mut().handshake(request).await.map_err(|s| status_message(&s))?;
    let token = response
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string);
    let mut replies = response.into_inner();
    while replies.message().await.map_err(|s| status_message(&s))?.is_some() {}
    if let Some(token) = token {
        client.set_token(token);
    }
    Ok(())
}

pub fn flight_message(e: FlightError) -> String {
    match e {
        FlightError::Tonic(status) => status_message(&status),
        FlightError::Arrow(e) => e.to_string(),
        other => other.to_string(),
    }
}

pub fn status_message(status: &tonic::Status) -> String {
    let mut message = status.message().to_string();
    if message.is_empty() {
        message = format!("{:?}", status.code());
    }
    if let Some(source) = status.source() {
        let chain = error_chain(source);
        message = if chain.starts_with(&message) { chain } else { format!("{message}: {chain}") };
    }
    message
}

fn error_chain(e: &(dyn StdError + 'static)) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text = format!("{text}: {cause_text}");
        }
        next = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_identifiers() {
        assert_eq!(quote_identifier("trades"), "\"trades\"");
        assert_eq!(quote_identifier("My \"T\""), "\"My \"\"T\"\"\"");
    }

    #[test]
    fn status_messages_do_not_repeat_their_source() {
        let mut status = tonic::Status::unavailable("transport error");
        status.set_source(Arc::new(std::io::Error::other("transport error: connection reset")));
        assert_eq!(status_message(&status), "transport error: connection reset");
        let mut status = tonic::Status::unknown("h2 protocol error");
        status.set_source(Arc::new(std::io::Error::other("stream reset")));
        assert_eq!(status_message(&status), "h2 protocol error: stream reset");
    }
}
