//! Calls to other nodes' data planes: lazily connected gRPC channels per rank, found through
//! the membership's `data` address, every call carrying the cluster credential.
//!
//! Each rank gets three channels, one per [`Lane`]: delayed shipments travel on their own, made
//! from the background runtime that runs the senders (`background.rs`), so that their
//! connection's I/O runs there and not on the workers that answer requests; and the rows queries
//! read from the rank travel apart from the other calls, so that answers a client has stopped
//! reading, which hold their streams' share of the connection's flow-control window, never
//! hold back an `immediate` insert, a flush or a DDL step; that connection's stream window is
//! small enough that such streams never hold all of it (`http2::RESULTS_STREAM_WINDOW_BYTES`).
//!
//! The credential is `HMAC-SHA256(secret, "shardwise-data-plane" ‖ run_id)` as a bearer token:
//! only holders of the cluster secret can compute it, and it differs per cluster run. A cluster
//! started without a secret (`--insecure`, the embedded cluster) uses no credential.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow_flight::decode::DecodedPayload;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{Action, Ticket};
use futures::{StreamExt, TryStreamExt};
use shardwise_cluster::{ClusterSecret, ClusterView};
use shardwise_query::{FragmentReport, QueryError, RemoteRows};
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};

use super::lock;
use crate::codec::ShipRequest;
use crate::settings::StorageSettings;

pub use shardwise_cluster::DATA_ADDR_KEY;

/// The longest timeout a call to another node carries (a year); a statement's longer timeout
/// (`flush_timeout_ms = 18446744073709551615`) waits that long at most for one call.
pub const PEER_CALL_TIMEOUT_MAX_MS: u64 = 365 * 24 * 3_600_000;

/// The data plane credential of this cluster run.
#[derive(Clone)]
pub struct DataPlaneAuth {
    token: Option<String>,
}

impl std::fmt::Debug for DataPlaneAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataPlaneAuth").field("secured", &self.token.is_some()).finish()
    }
}

impl DataPlaneAuth {
    pub fn new(secret: Option<&ClusterSecret>, run_id: &str) -> Self {
        let token = secret.map(|s| hex::encode(s.tag("shardwise-data-plane", &[run_id.as_bytes()])));
        DataPlaneAuth { token }
    }

    /// The `authorization` header value, if the cluster has a secret.
    pub fn header(&self) -> Option<String> {
        self.token.as_ref().map(|t| format!("Bearer {t}"))
    }

    /// Checks an incoming call's `authorization` header (constant time).
    pub fn check(&self, header: Option<&str>) -> bool {
        match (&self.token, header) {
            (None, _) => true,
            (Some(t), Some(h)) => {
                let want = format!("Bearer {t}");
                want.len() == h.len() && want.bytes().zip(h.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
            }
            (Some(_), None) => false,
        }
    }
}

/// Which channel to a rank a call travels on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Lane {
    /// Flushes, statistics, query and DDL steps, `immediate` replica writes.
    Requests,
    /// The rows of query fragments and shuffle buckets.
    Results,
    /// Delayed shipments (background work).
    Shipments,
}

/// Clients for every other rank.
#[derive(Debug)]
pub struct Peers {
    cluster: Arc<dyn ClusterView>,
    auth: DataPlaneAuth,
    channels: Mutex<HashMap<(u32, Lane), (String, Channel)>>,
    ship_timeout: Duration,
    connect_timeout: Duration,
    keepalive_interval: Duration,
    keepalive_timeout: Duration,
    max_message_bytes: usize,
}

fn unavailable(rank: u32, what: &str, e: impl std::fmt::Display) -> QueryError {
    QueryError::Unavailable(format!("rank {rank}: {what}: {e}"))
}

fn status_error(rank: u32, what: &str, s: tonic::Status) -> QueryError {
    use tonic::Code;
    // The transport's own words ("http2 error") say little; its causes say what happened
    // ("keep-alive timed out": the node stopped answering).
    let causes = std::iter::successors(std::error::Error::source(&s), |e| e.source()).map(|e| e.to_string());
    let message = crate::error::with_causes(format!("rank {rank}: {what}: {}", s.message()), causes);
    match s.code() {
        Code::InvalidArgument | Code::FailedPrecondition | Code::NotFound | Code::AlreadyExists => {
            QueryError::Rejected(message)
        }
        Code::Internal | Code::DataLoss => QueryError::Storage(message),
        _ => QueryError::Unavailable(message),
    }
}

impl Peers {
    pub fn new(cluster: Arc<dyn ClusterView>, auth: DataPlaneAuth, settings: &StorageSettings) -> Self {
        Peers {
            cluster,
            auth,
            channels: Mutex::new(HashMap::new()),
            ship_timeout: Duration::from_millis(settings.ship_timeout_ms),
            connect_timeout: Duration::from_millis(settings.peer_connect_timeout_ms),
            keepalive_interval: Duration::from_millis(settings.peer_keepalive_interval_ms),
            keepalive_timeout: Duration::from_millis(settings.peer_keepalive_timeout_ms),
            max_message_bytes: settings.data_plane_max_message_bytes,
        }
    }

    /// The channel to `rank` on `lane`: the cached one, or one to the address the membership
    /// gives (its connection then runs on the calling task's runtime).
    async fn channel(&self, rank: u32, lane: Lane) -> Result<Channel, QueryError> {
        if let Some((_, channel)) = lock(&self.channels).get(&(rank, lane)) {
            return Ok(channel.clone());
        }
        let addr = self
            .member_addr(rank)
            .await
            .ok_or_else(|| QueryError::Unavailable(format!("rank {rank} has no known data plane address")))?;
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| unavailable(rank, "bad data plane address", e))?
            .connect_timeout(self.connect_timeout)
            .http2_keep_alive_interval(self.keepalive_interval)
            .keep_alive_timeout(self.keepalive_timeout)
            .keep_alive_while_idle(true)
            .tcp_nodelay(true);
        let mut endpoint = crate::http2::client(endpoint);
        if lane == Lane::Results {
            endpoint = endpoint.initial_stream_window_size(crate::http2::RESULTS_STREAM_WINDOW_BYTES);
        }
        let channel = endpoint.connect_lazy();
        lock(&self.channels).insert((rank, lane), (addr, channel.clone()));
        Ok(channel)
    }

    /// `rank`'s data plane address as the membership knows it now.
    async fn member_addr(&self, rank: u32) -> Option<String> {
        let members = self.cluster.members().await;
        members.iter().find(|m| m.rank == rank).and_then(|m| m.addrs.get(DATA_ADDR_KEY).cloned())
    }

    /// Forgets `rank`'s channels after a failed call: it may have restarted on another address.
    fn forget(&self, rank: u32, e: &QueryError) {
        if matches!(e, QueryError::Unavailable(_)) {
            lock(&self.channels).retain(|(r, _), _| *r != rank);
        }
    }

    async fn client(&self, rank: u32, lane: Lane) -> Result<FlightServiceClient<Channel>, QueryError> {
        Ok(FlightServiceClient::new(self.channel(rank, lane).await?)
            .max_decoding_message_size(self.max_message_bytes)
            .max_encoding_message_size(self.max_message_bytes))
    }

    fn request<T>(&self, body: T, timeout: Option<Duration>) -> Result<tonic::Request<T>, QueryError> {
        let mut req = tonic::Request::new(body);
        if let Some(timeout) = timeout {
            // gRPC's timeout header holds at most 10^8 hours, and tonic panics past that: a
            // statement's timeout setting may be any u64 of milliseconds.
            req.set_timeout(timeout.min(Duration::from_millis(PEER_CALL_TIMEOUT_MAX_MS)));
        }
        if let Some(h) = self.auth.header() {
            let value: MetadataValue<_> =
                h.parse().map_err(|_| QueryError::Storage("the data plane credential is not a header".into()))?;
            req.metadata_mut().insert("authorization", value);
        }
        Ok(req)
    }

    /// Runs a data plane action on `rank` and returns its one result body.
    pub async fn action(&self, rank: u32, kind: &str, body: Vec<u8>, timeout: Duration) -> Result<Vec<u8>, QueryError> {
        self.action_on(Lane::Requests, rank, kind, body, timeout).await
    }

    /// Runs a data plane action on `rank` whose reply is a stream of results (a replica image):
    /// every result body, in order.
    pub async fn action_all(
        &self,
        rank: u32,
        kind: &str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<bytes::Bytes>, QueryError> {
        let call = || async {
            let mut client = self.client(rank, Lane::Requests).await?;
            let req = self.request(Action { r#type: kind.to_string(), body: body.clone().into() }, Some(timeout))?;
            let stream = client.do_action(req).await.map_err(|s| status_error(rank, kind, s))?.into_inner();
            stream.map_ok(|r| r.body).try_collect().await.map_err(|s| status_error(rank, kind, s))
        };
        self.once_more_if_moved(rank, Lane::Requests, call).await
    }

    /// [`Peers::action`] on `lane`.
    async fn action_on(
        &self,
        lane: Lane,
        rank: u32,
        kind: &str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, QueryError> {
        let call = || async {
            let mut client = self.client(rank, lane).await?;
            let req = self.request(Action { r#type: kind.to_string(), body: body.clone().into() }, Some(timeout))?;
            let mut stream = client.do_action(req).await.map_err(|s| status_error(rank, kind, s))?.into_inner();
            match stream.next().await {
                Some(Ok(r)) => Ok(r.body.to_vec()),
                Some(Err(s)) => Err(status_error(rank, kind, s)),
                None => Err(QueryError::Unavailable(format!("rank {rank}: {kind}: no reply"))),
            }
        };
        self.once_more_if_moved(rank, lane, call).await
    }

    /// Makes `call` to `rank`; when it fails as if the node were gone, forgets the node's
    /// channels, and when the membership now gives the node another address than the channel
    /// used (it restarted on new ports), makes the call once more there.
    async fn once_more_if_moved<T, F, Fut>(&self, rank: u32, lane: Lane, call: F) -> Result<T, QueryError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, QueryError>>,
    {
        let cached = lock(&self.channels).get(&(rank, lane)).map(|(addr, _)| addr.clone());
        let r = call().await;
        let Err(e) = &r else { return r };
        self.forget(rank, e);
        let moved =
            matches!(e, QueryError::Unavailable(_)) && cached.is_some() && self.member_addr(rank).await != cached;
        if !moved {
            return r;
        }
        let r = call().await;
        if let Err(e) = &r {
            self.forget(rank, e);
        }
        r
    }

    /// Ships piece sets to `rank`; returns the rows it applied. A delayed shipment (with an
    /// origin) goes on the shipments lane, whose channel is made by the first call, from the
    /// senders' background runtime; an `immediate` insert's replica write on the requests lane.
    pub async fn ship(&self, rank: u32, req: &ShipRequest) -> Result<super::apply::ShipOutcome, QueryError> {
        let lane = if req.origin.is_some() { Lane::Shipments } else { Lane::Requests };
        let body = req.encode().map_err(|e| QueryError::Storage(e.to_string()))?;
        let reply = self.action_on(lane, rank, "apply", body, self.ship_timeout).await?;
        super::apply::ShipOutcome::decode(&reply).map_err(|e| unavailable(rank, "apply: bad reply", e))
    }

    /// A node that restarted has new ports: when the cached channel fails and the membership
    /// now gives another address, the call is made once more there.
    pub async fn fragment(&self, rank: u32, ticket: Vec<u8>, report: FragmentReport) -> Result<RemoteRows, QueryError> {
        self.once_more_if_moved(rank, Lane::Results, || self.fragment_once(rank, ticket.clone(), Arc::clone(&report)))
            .await
    }

    /// One `DoGet` of a fragment (or shuffle bucket): its rows; a report message after them
    /// ([`crate::fragment_report`]) goes to `report`.
    async fn fragment_once(
        &self,
        rank: u32,
        ticket: Vec<u8>,
        report: FragmentReport,
    ) -> Result<RemoteRows, QueryError> {
        let mut client = self.client(rank, Lane::Results).await?;
        let req = self.request(Ticket { ticket: ticket.into() }, None)?;
        let stream = client.do_get(req).await.map_err(|s| status_error(rank, "fragment", s))?.into_inner();
        let messages = crate::flight_decode::decoded(stream.map_err(Into::into));
        Ok(messages
            .filter_map(move |message| {
                let row = match message {
                    Ok(decoded) => {
                        if let Some(outcome) = crate::fragment_report::report_of(&decoded.inner) {
                            *lock(&report) = outcome;
                        }
                        match decoded.payload {
                            DecodedPayload::RecordBatch(batch) => Some(Ok(batch)),
                            DecodedPayload::Schema(_) | DecodedPayload::None => None,
                        }
                    }
                    Err(FlightError::Tonic(status)) => Some(Err(status_error(rank, "fragment", *status))),
                    Err(other) => Some(Err(unavailable(rank, "fragment", other))),
                };
                futures::future::ready(row)
            })
            .boxed())
    }
}
