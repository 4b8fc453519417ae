//! The data plane: an Arrow Flight service between nodes, on its own port (advertised in the
//! membership as `data`), separate from the client-facing Flight SQL endpoint.
//!
//! Calls:
//! - `DoAction("apply")`: a [`ShipRequest`]; replies with the rows applied (JSON number) once
//!   every piece is durable here.
//! - `DoGet(ticket)`: a query fragment ticket ([`FragmentTicket`], starting `SWFT`): runs the
//!   fragment over this node's shards and streams its rows as they are produced. Or a shuffle
//!   bucket request (`SWSB`): one bucket of a shard's shuffle stage 1, which runs here on the
//!   first request.
//! - `DoAction("flush")`: a JSON [`FlushRequest`]; replies (a JSON [`FlushReply`](crate::tables::stats::FlushReply)) once this
//!   node's queues for the table are empty, or at the request's timeout naming what is pending.
//! - `DoAction("optimize")`: a JSON [`OptimizeRequest`]; writes and merges this node's replicas
//!   of the table, then replies with what it did (a JSON
//!   [`OptimizeReply`](crate::tables::optimize::OptimizeReply)).
//! - `DoAction("check")`: a JSON [`CheckRequest`]; reads and checksums this node's replicas of
//!   the table for `CHECK TABLE`, and counts its rows queued here.
//! - `DoAction("repair_fence" | "repair_drain" | "repair_install" | "repair_unfence")`: the steps
//!   of rebuilding a replica for `REPAIR TABLE` (JSON requests and replies; `tables/repair.rs`).
//! - `DoAction("repair_image")`: a JSON [`ReplicaRef`]; replies with this node's replica of it as
//!   a stream of results: a JSON image header, then the rows as Arrow IPC in chunks of at most
//!   [`REPAIR_IMAGE_CHUNK_BYTES`].
//! - `DoAction("shards")`, `DoAction("sync_queues")`: this node's figures, as JSON.
//!
//! Every call must carry the cluster credential ([`DataPlaneAuth`]); a call without it, or from
//! a client speaking something else, is refused before anything is read.

use std::pin::Pin;
use std::sync::Arc;

use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo, HandshakeRequest, HandshakeResponse,
    PollInfo, PutResult, SchemaResult, Ticket,
};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::ExecutionPlan;
use futures::{Stream, StreamExt, TryStreamExt};
use shardwise_query::dist::{FragmentTicket, is_shuffle_ticket};
use shardwise_query::{QueryEngine, QueryError};
use tonic::{Request, Response, Status, Streaming};

use crate::codec::ShipRequest;
use crate::tables::check::CheckRequest;
use crate::tables::optimize::OptimizeRequest;
use crate::tables::repair::{DrainRequest, FenceRequest, REPAIR_IMAGE_CHUNK_BYTES, ReplicaRef};
use crate::tables::stats::FlushRequest;
use crate::tables::{DataPlaneAuth, TablesNode};

/// The `DoAction` types this service knows.
const ACTIONS: [&str; 11] = [
    "apply",
    "check",
    "flush",
    "optimize",
    "repair_drain",
    "repair_fence",
    "repair_image",
    "repair_install",
    "repair_unfence",
    "shards",
    "sync_queues",
];

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// The data plane service of one node.
#[derive(Debug, Clone)]
pub struct DataPlane {
    tables: Arc<TablesNode>,
    engine: Arc<QueryEngine>,
    auth: DataPlaneAuth,
}

fn to_status(e: QueryError) -> Status {
    match e {
        QueryError::Rejected(m) => Status::invalid_argument(m),
        QueryError::Unavailable(m) => Status::unavailable(m),
        QueryError::Storage(m) => Status::internal(m),
        other if other.is_user_error() => Status::invalid_argument(other.to_string()),
        other => Status::internal(other.to_string()),
    }
}

/// Whether `req` carries this cluster's data plane credential.
fn check_credential<T>(auth: &DataPlaneAuth, req: &Request<T>) -> Result<(), Status> {
    let header = req.metadata().get("authorization").and_then(|v| v.to_str().ok());
    if auth.check(header) {
        Ok(())
    } else {
        Err(Status::unauthenticated("data plane call without a valid cluster credential"))
    }
}

fn json<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, Status> {
    serde_json::to_vec(value).map_err(|e| Status::internal(format!("cannot encode reply: {e}")))
}

fn one_result(body: Vec<u8>) -> Response<BoxStream<arrow_flight::Result>> {
    let item = arrow_flight::Result { body: body.into() };
    Response::new(Box::pin(futures::stream::once(async move { Ok(item) })))
}

impl DataPlane {
    pub fn new(tables: Arc<TablesNode>, engine: Arc<QueryEngine>, auth: DataPlaneAuth) -> Self {
        DataPlane { tables, engine, auth }
    }

    fn check<T>(&self, req: &Request<T>) -> Result<(), Status> {
        check_credential(&self.auth, req)
    }

    /// Serves the data plane on `listener` until `shutdown` completes.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        max_message_bytes: usize,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), crate::ServerError> {
        let auth = self.auth.clone();
        let service = FlightServiceServer::new(self)
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes);
        // The credential is checked before a call's message is read: without it, anyone could
        // make the node read and decode up to max_message_bytes (256 MiB) per call before it
        // refused. (The handlers check again.)
        let service = tonic::service::interceptor::InterceptedService::new(service, move |req: Request<()>| {
            check_credential(&auth, &req)?;
            crate::connections::admit(&req);
            Ok(req)
        });
        crate::http2::server(tonic::transport::Server::builder())
            .tcp_nodelay(true)
            .add_service(service)
            .serve_with_incoming_shutdown(crate::connections::tracked_grpc(listener, Default::default()), shutdown)
            .await?;
        Ok(())
    }
}

impl DataPlane {
    /// Runs a query fragment; errors keep their class (the user's or the node's). After the last
    /// row comes the plan with metrics ([`crate::fragment_report`]) if the ticket asks for it.
    fn run_fragment(&self, ticket: &[u8]) -> Result<Response<BoxStream<FlightData>>, Status> {
        let (stream, plan, report) = self.engine.run_fragment(ticket).map_err(to_status)?;
        Ok(reported_response(stream, Some((plan, report))))
    }
}

/// `stream`'s rows, then, once they have all gone, what the initiator is to learn of the `plan`
/// that made them ([`crate::fragment_report`]): its metrics when `report` (the bool), and what
/// its shuffle readers received.
fn reported_response(
    stream: SendableRecordBatchStream,
    ran: Option<(Arc<dyn ExecutionPlan>, bool)>,
) -> Response<BoxStream<FlightData>> {
    let Some((plan, report)) = ran else { return stream_response(stream) };
    let schema = stream.schema();
    let rows = stream_response(stream).into_inner();
    let report = futures::stream::once(async move {
        let outcome = shardwise_query::dist::fragment::outcome(&plan, report);
        match outcome.is_empty() {
            true => futures::stream::empty().boxed(),
            false => crate::fragment_report::trailer(schema, &outcome),
        }
    })
    .flatten();
    Response::new(Box::pin(rows.chain(report)))
}

/// A plan's rows as a `DoGet` reply, sent as they are produced.
fn stream_response(stream: SendableRecordBatchStream) -> Response<BoxStream<FlightData>> {
    let schema = stream.schema();
    let rows = stream
        .map_ok(|batch| futures::stream::iter(crate::flight_split::split(batch).into_iter().map(Ok)))
        .map_err(|e| FlightError::Tonic(Box::new(to_status(QueryError::from(e)))))
        .try_flatten();
    let flight = crate::flight_split::encoder().with_schema(schema).build(rows).map_err(Status::from);
    Response::new(Box::pin(flight))
}

fn unsupported<T>(what: &str) -> Result<T, Status> {
    Err(Status::unimplemented(format!("{what} is not part of the shardwise data plane")))
}

#[tonic::async_trait]
impl FlightService for DataPlane {
    type HandshakeStream = BoxStream<HandshakeResponse>;
    type ListFlightsStream = BoxStream<FlightInfo>;
    type DoGetStream = BoxStream<FlightData>;
    type DoPutStream = BoxStream<PutResult>;
    type DoActionStream = BoxStream<arrow_flight::Result>;
    type ListActionsStream = BoxStream<ActionType>;
    type DoExchangeStream = BoxStream<FlightData>;

    async fn handshake(
        &self,
        _request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        unsupported("Handshake")
    }

    async fn list_flights(&self, _request: Request<Criteria>) -> Result<Response<Self::ListFlightsStream>, Status> {
        unsupported("ListFlights")
    }

    async fn get_flight_info(&self, _request: Request<FlightDescriptor>) -> Result<Response<FlightInfo>, Status> {
        unsupported("GetFlightInfo")
    }

    async fn poll_flight_info(&self, _request: Request<FlightDescriptor>) -> Result<Response<PollInfo>, Status> {
        unsupported("PollFlightInfo")
    }

    async fn get_schema(&self, _request: Request<FlightDescriptor>) -> Result<Response<SchemaResult>, Status> {
        unsupported("GetSchema")
    }

    async fn do_get(&self, request: Request<Ticket>) -> Result<Response<Self::DoGetStream>, Status> {
        self.check(&request)?;
        if FragmentTicket::is_fragment(&request.get_ref().ticket) {
            return self.run_fragment(&request.get_ref().ticket);
        }
        if is_shuffle_ticket(&request.get_ref().ticket) {
            let (stream, plan) = self.engine.shuffle_bucket(&request.get_ref().ticket).await.map_err(to_status)?;
            return Ok(reported_response(stream, plan.map(|plan| (plan, true))));
        }
        Err(Status::invalid_argument(
            "DoGet: not a shardwise ticket (expected a query fragment or a shuffle bucket request)",
        ))
    }

    async fn do_put(&self, _request: Request<Streaming<FlightData>>) -> Result<Response<Self::DoPutStream>, Status> {
        unsupported("DoPut")
    }

    async fn do_action(&self, request: Request<Action>) -> Result<Response<Self::DoActionStream>, Status> {
        self.check(&request)?;
        let action = request.into_inner();
        match action.r#type.as_str() {
            "apply" => {
                let req = ShipRequest::decode(&action.body).map_err(|e| Status::invalid_argument(e.to_string()))?;
                let outcome = self.tables.apply_ship(req).await.map_err(to_status)?;
                let reply = outcome.encode().map_err(|e| Status::internal(format!("cannot encode the reply: {e}")))?;
                Ok(one_result(reply))
            }
            "flush" => {
                let req: FlushRequest = serde_json::from_slice(&action.body)
                    .map_err(|e| Status::invalid_argument(format!("bad flush request: {e}")))?;
                let timeout = std::time::Duration::from_millis(req.timeout_ms);
                let reply = self.tables.flush_local(&req.table, req.incarnation, timeout).await.map_err(to_status)?;
                Ok(one_result(reply.encode()))
            }
            "optimize" => {
                let req: OptimizeRequest = serde_json::from_slice(&action.body)
                    .map_err(|e| Status::invalid_argument(format!("bad optimize request: {e}")))?;
                let reply = self.tables.optimize_local(&req).await.map_err(to_status)?;
                Ok(one_result(json(&reply)?))
            }
            "check" => {
                let req: CheckRequest = serde_json::from_slice(&action.body)
                    .map_err(|e| Status::invalid_argument(format!("bad check request: {e}")))?;
                let reply = self.tables.check_local(&req).await.map_err(to_status)?;
                Ok(one_result(json(&reply)?))
            }
            "repair_fence" | "repair_unfence" | "repair_install" => {
                let req: FenceRequest = serde_json::from_slice(&action.body)
                    .map_err(|e| Status::invalid_argument(format!("bad {} request: {e}", action.r#type)))?;
                let reply = match action.r#type.as_str() {
                    "repair_fence" => self.tables.repair_fence(&req).await,
                    "repair_unfence" => self.tables.repair_unfence(&req).await,
                    _ => self.tables.repair_install(&req).await,
                };
                Ok(one_result(json(&reply.map_err(to_status)?)?))
            }
            "repair_drain" => {
                let req: DrainRequest = serde_json::from_slice(&action.body)
                    .map_err(|e| Status::invalid_argument(format!("bad repair_drain request: {e}")))?;
                Ok(one_result(json(&self.tables.repair_drain(&req).await.map_err(to_status)?)?))
            }
            "repair_image" => {
                let req: ReplicaRef = serde_json::from_slice(&action.body)
                    .map_err(|e| Status::invalid_argument(format!("bad repair_image request: {e}")))?;
                let (header, rows) = self.tables.repair_image(&req).await.map_err(to_status)?;
                // Slices of the one encoded buffer, not copies.
                let rows = bytes::Bytes::from(rows);
                let chunks = (0..rows.len()).step_by(REPAIR_IMAGE_CHUNK_BYTES);
                let chunks = chunks.map(move |at| rows.slice(at..rows.len().min(at + REPAIR_IMAGE_CHUNK_BYTES)));
                let results = std::iter::once(bytes::Bytes::from(json(&header)?)).chain(chunks);
                let results = results.map(|body| Ok(arrow_flight::Result { body }));
                Ok(Response::new(Box::pin(futures::stream::iter(results))))
            }
            "shards" => {
                let stats = self.tables.local_shard_stats().await.map_err(to_status)?;
                Ok(one_result(json(&stats)?))
            }
            "sync_queues" => Ok(one_result(json(&self.tables.local_queue_rows())?)),
            other => Err(Status::invalid_argument(format!(
                "unknown data plane action {other:?}; known: {}",
                ACTIONS.join(", ")
            ))),
        }
    }

    async fn list_actions(&self, request: Request<Empty>) -> Result<Response<Self::ListActionsStream>, Status> {
        self.check(&request)?;
        let actions = ACTIONS.map(|a| Ok(ActionType { r#type: a.to_string(), description: String::new() }));
        Ok(Response::new(Box::pin(futures::stream::iter(actions))))
    }

    async fn do_exchange(
        &self,
        _request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        unsupported("DoExchange")
    }
}
