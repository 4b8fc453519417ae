//! `Execute` of the extended protocol, streamed. pgwire's own `Execute` collects a portal's
//! rows into memory before it sends the first (`Portal::fetch` gathers up to the row limit, and
//! 0, what drivers send, means all of them): a driver's `SELECT` of ten million rows then took
//! gigabytes on the node, outside `max_memory_usage`, and went on after the client left. Here a
//! portal run to completion (no row limit, not started yet: what psycopg, JDBC and asyncpg do)
//! sends its rows as the plan produces them, with the socket's backpressure, as the simple
//! protocol does; a client that goes away ends the write, which drops the plan and stops it.
//! Every other `Execute` (a row limit, a suspended portal, `COPY`, `BEGIN`) is pgwire's.

use std::fmt::Debug;

use futures::{Sink, SinkExt, StreamExt};
use pgwire::api::portal::PortalExecutionState;
use pgwire::api::query::{ExtendedQueryHandler, send_execution_response};
use pgwire::api::results::{Response, Tag};
use pgwire::api::store::{Entry, PortalStore};
use pgwire::api::{ClientInfo, ClientPortalStore, DEFAULT_NAME, PgWireConnectionState};
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::PgWireBackendMessage;
use pgwire::messages::extendedquery::Execute;

use super::{Handler, Kind, Statement, kind_of};

/// Most rows one `Execute` with a row limit is answered with at a time: pgwire sets aside room
/// for the whole limit up front (`i32::MAX` rows would be tens of gigabytes). A client whose
/// limit is larger gets `PortalSuspended` after this many and asks again, as drivers do.
const EXECUTE_MAX_ROWS: i32 = 65_536;

/// Runs `message`: streamed when the portal runs to completion, else as pgwire does.
pub(super) async fn execute<C>(handler: &Handler, client: &mut C, mut message: Execute) -> PgWireResult<()>
where
    C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
    C::PortalStore: PortalStore<Statement = Statement>,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    // A negative limit means none, as 0 does (pgwire would read it as a huge one).
    message.max_rows = match message.max_rows {
        ..0 => 0,
        rows => rows.min(EXECUTE_MAX_ROWS),
    };
    let name = message.name.as_deref().unwrap_or(DEFAULT_NAME);
    let portal = match client.portal_store().get_portal(name) {
        Some(Entry::Value(portal)) => portal,
        _ => return handler._on_execute(client, message).await,
    };
    let unstarted = matches!(*portal.state().lock().await, PortalExecutionState::Initial);
    let streams = message.max_rows == 0
        && unstarted
        && kind_of(&portal.statement.statement.sql) == Kind::Sql
        && matches!(client.state(), PgWireConnectionState::ReadyForQuery);
    if !streams {
        return handler._on_execute(client, message).await;
    }
    client.set_state(PgWireConnectionState::QueryInProgress);
    // Run once: executed again, the portal answers no rows, as PostgreSQL's does.
    *portal.state().lock().await = PortalExecutionState::Finished;
    match handler.do_query(client, portal.as_ref(), 0).await? {
        Response::Query(mut results) => {
            let tag = results.command_tag().to_owned();
            let rows = results.data_rows();
            let mut sent = 0;
            while let Some(row) = rows.next().await {
                client.feed(PgWireBackendMessage::DataRow(row?)).await?;
                sent += 1;
            }
            client.send(PgWireBackendMessage::CommandComplete(Tag::new(&tag).with_rows(sent).into())).await?;
        }
        Response::Execution(tag) => send_execution_response(client, tag).await?,
        Response::Error(e) => client.send(PgWireBackendMessage::ErrorResponse((*e).into())).await?,
        _ => return Err(PgWireError::ApiError("a statement run as a query answered as something else".into())),
    }
    client.set_state(PgWireConnectionState::ReadyForQuery);
    Ok(())
}
