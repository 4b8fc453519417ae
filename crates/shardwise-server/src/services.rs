//! Starting a node's services once it has joined: the table layer, the data plane and the Flight
//! SQL, HTTP and PostgreSQL endpoints, with one stop switch for all. `shardwise node` and the embedded cluster both
//! start nodes through here, so they run the same code.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use shardwise_cluster::{ClusterError, ClusterSecret, MetadataHandle, MetadataSnapshot, Node};
use shardwise_query::{QueryEngine, QueryError};
use tokio::net::{TcpListener, TcpSocket};

use crate::held_port::{EarlyAnswer, HeldPort};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::data_plane::DataPlane;
use crate::settings::StorageSettings;
use crate::tables::{DataPlaneAuth, MetadataAccess, TablesNode};
use crate::users::Users;

/// The ports a node serves on, bound (and listened on) before it joins so their addresses can be
/// advertised, and served only once it has joined ([`Services::start`]); meanwhile a client that
/// connects is told at once that the node is joining (`held_port`), not left connected to a port
/// nobody answers (psql, curl and load balancers' health checks hung until their own timeouts,
/// 2026-12-05).
#[derive(Debug)]
pub struct Listeners {
    flight: HeldPort,
    data: HeldPort,
    http: HeldPort,
    pg: HeldPort,
}

pub use crate::held_port::LISTEN_BACKLOG;

/// The listeners of a joined node.
struct Listening {
    flight: TcpListener,
    data: TcpListener,
    http: TcpListener,
    pg: TcpListener,
}

/// The file in a node's data dir that records the ports it listens on, so that after a restart
/// it listens on the same ones when they are free: its clients (and `shardwise load`'s retries)
/// keep their address, as with a server configured with fixed ports.
pub const PORTS_FILE: &str = "ports.json";

impl Listeners {
    /// Binds the Flight SQL, data plane, HTTP and PostgreSQL ports (0: any free port) on `host`.
    pub async fn bind(host: &str, ports: Ports) -> std::io::Result<Listeners> {
        Listeners::bind_preferring(host, ports, Ports::default()).await
    }

    /// [`Listeners::bind`], where each port given as 0 is first tried as the one `data_dir`
    /// recorded (any free port when it is taken, or when it is `avoid`: the master's port, which
    /// the cluster may have moved to since); then records the ports bound. Failing to record
    /// them is only a warning: the node runs, a restart may listen elsewhere.
    pub async fn bind_keeping(
        host: &str,
        ports: Ports,
        data_dir: &Path,
        avoid: Option<u16>,
    ) -> std::io::Result<Listeners> {
        let last = match shardwise_cluster::datadir::read_json::<Ports>(data_dir, PORTS_FILE) {
            Ok(last) => last.unwrap_or_default(),
            Err(e) => {
                tracing::warn!("ignoring the ports recorded last time: {e}");
                Ports::default()
            }
        };
        let keep = |port: u16| if Some(port) == avoid { 0 } else { port };
        let last = Ports { flight: keep(last.flight), data: keep(last.data), http: keep(last.http), pg: keep(last.pg) };
        let listeners = Listeners::bind_preferring(host, ports, last).await?;
        let bound = Ports {
            flight: listeners.flight.local_addr().port(),
            data: listeners.data.local_addr().port(),
            http: listeners.http.local_addr().port(),
            pg: listeners.pg.local_addr().port(),
        };
        let recorded = serde_json::to_vec(&bound).map_err(|e| e.to_string()).and_then(|json| {
            shardwise_cluster::datadir::write_atomic(data_dir, PORTS_FILE, &json).map_err(|e| e.to_string())
        });
        if let Err(e) = recorded {
            tracing::warn!("cannot record the ports in {}: {e}", data_dir.display());
        }
        Ok(listeners)
    }

    async fn bind_preferring(host: &str, ports: Ports, last: Ports) -> std::io::Result<Listeners> {
        Ok(Listeners {
            flight: bind_one(host, ports.flight, last.flight, "Flight SQL", EarlyAnswer::Close).await?,
            data: bind_one(host, ports.data, last.data, "the data plane", EarlyAnswer::Close).await?,
            http: bind_one(host, ports.http, last.http, "HTTP", EarlyAnswer::Http).await?,
            pg: bind_one(host, ports.pg, last.pg, "PostgreSQL clients", EarlyAnswer::Postgres).await?,
        })
    }

    /// Hands every port to the service that answers on it.
    async fn listen(self) -> std::io::Result<Listening> {
        Ok(Listening {
            flight: self.flight.serve().await?,
            data: self.data.serve().await?,
            http: self.http.serve().await?,
            pg: self.pg.serve().await?,
        })
    }

    /// The membership addresses (`flight`, `data`) as other nodes and clients reach them.
    pub fn addrs(&self, advertise_host: &str) -> std::io::Result<BTreeMap<String, String>> {
        Ok(BTreeMap::from([
            ("flight".to_string(), format!("{advertise_host}:{}", self.flight.local_addr().port())),
            (
                crate::tables::peers::DATA_ADDR_KEY.to_string(),
                format!("{advertise_host}:{}", self.data.local_addr().port()),
            ),
            ("http".to_string(), format!("{advertise_host}:{}", self.http.local_addr().port())),
            ("pg".to_string(), format!("{advertise_host}:{}", self.pg.local_addr().port())),
        ]))
    }
}

/// Binds `port` on `host`; when it is 0, `last` first if that is free, else any free port.
async fn bind_one(host: &str, port: u16, last: u16, what: &str, early: EarlyAnswer) -> std::io::Result<HeldPort> {
    if port == 0
        && last != 0
        && let Ok(socket) = bind_socket(host, last, early).await
    {
        return Ok(socket);
    }
    bind_socket(host, port, early)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen for {what} on {host}:{port}: {e}")))
}

/// `host:port` (its first address that binds) bound and held (`held_port`); with `SO_REUSEADDR`,
/// as `TcpListener::bind` sets it, so a restart can take its port back while old connections
/// linger in `TIME_WAIT`.
async fn bind_socket(host: &str, port: u16, early: EarlyAnswer) -> std::io::Result<HeldPort> {
    let mut last_error = None;
    for addr in tokio::net::lookup_host((host, port)).await? {
        let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
        socket.set_reuseaddr(true)?;
        match socket.bind(addr).and_then(|()| HeldPort::hold(socket, early)) {
            Ok(held) => return Ok(held),
            Err(e) => last_error = Some(e),
        }
    }
    Err(last_error.unwrap_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no address to bind")))
}

/// The ports a node listens on; 0 picks any free port.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Ports {
    pub flight: u16,
    pub data: u16,
    pub http: u16,
    pub pg: u16,
}

/// What a node needs besides its [`Node`] to serve tables.
#[derive(Debug, Clone)]
pub struct ServiceOptions {
    pub data_dir: PathBuf,
    pub secret: Option<ClusterSecret>,
    pub settings: StorageSettings,
    /// Who may connect, over every client protocol.
    pub users: Arc<Users>,
}

#[derive(Debug)]
struct NodeMetadata(MetadataHandle);

impl MetadataAccess for NodeMetadata {
    fn watch(&self) -> watch::Receiver<MetadataSnapshot> {
        self.0.metadata()
    }

    fn master_problem(&self) -> Option<String> {
        self.0.master_problem()
    }

    fn ensure_current(&self, writing: bool) -> shardwise_cluster::BoxFuture<'_, Result<(), QueryError>> {
        Box::pin(async move { self.0.ensure_current(writing).await.map_err(QueryError::Unavailable) })
    }

    fn propose(&self, op: serde_json::Value) -> shardwise_cluster::BoxFuture<'_, Result<MetadataSnapshot, QueryError>> {
        Box::pin(async move {
            self.0.propose(op).await.map_err(|e| match e {
                ClusterError::MetadataRejected { reason } => QueryError::Rejected(reason),
                // Retryable: HTTP 503, SQLSTATE 57P03, as other unavailability.
                ClusterError::MetadataNotNow { reason } => QueryError::Unavailable(reason),
                other => QueryError::Unavailable(other.to_string()),
            })
        })
    }
}

/// A node's running services.
#[derive(Debug)]
pub struct Services {
    pub tables: Arc<TablesNode>,
    pub engine: Arc<QueryEngine>,
    stop: watch::Sender<bool>,
    flight: JoinHandle<Result<(), crate::ServerError>>,
    data: JoinHandle<Result<(), crate::ServerError>>,
    http: JoinHandle<Result<(), crate::ServerError>>,
    pg: JoinHandle<Result<(), crate::ServerError>>,
}

async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

impl Services {
    /// Starts the table layer, the data plane and the Flight SQL endpoint of a joined node.
    pub async fn start(node: &Node, listeners: Listeners, opts: ServiceOptions) -> Result<Services, QueryError> {
        let auth = DataPlaneAuth::new(opts.secret.as_ref(), &node.run_id);
        let metadata = Arc::new(NodeMetadata(node.metadata_handle()));
        let max_message_bytes = opts.settings.data_plane_max_message_bytes;
        let max_server_memory_bytes = opts.settings.max_server_memory_bytes;
        let replacing = node.replacing();
        let tables =
            TablesNode::start(&opts.data_dir, node.view(), metadata, auth.clone(), opts.settings, replacing).await?;
        // The replicas awaiting their rebuild are recorded: the data dir may forget it replaces.
        if replacing.is_some() {
            node.finish_replacing()
                .map_err(|e| QueryError::Storage(format!("cannot record that the replacement is under way: {e}")))?;
        }
        let listeners = listeners
            .listen()
            .await
            .map_err(|e| QueryError::Unavailable(format!("cannot listen on the node's ports: {e}")))?;
        let engine = Arc::new(QueryEngine::with_tables(node.view(), tables.clone(), max_server_memory_bytes)?);
        let (stop, rx) = watch::channel(false);
        let plane = DataPlane::new(Arc::clone(&tables), Arc::clone(&engine), auth);
        let data = tokio::spawn(plane.serve(listeners.data, max_message_bytes, stopped(rx.clone())));
        let http = tokio::spawn(crate::http::serve(
            listeners.http,
            Arc::clone(&engine),
            Arc::clone(&opts.users),
            stopped(rx.clone()),
        ));
        let pg = tokio::spawn(crate::pg::serve(
            listeners.pg,
            Arc::clone(&engine),
            Arc::clone(&opts.users),
            stopped(rx.clone()),
        ));
        let flight = tokio::spawn(crate::serve_flight(
            listeners.flight,
            Arc::clone(&engine),
            Arc::clone(&opts.users),
            stopped(rx.clone()),
        ));
        Ok(Services { tables, engine, stop, flight, data, http, pg })
    }

    /// Resolves if a server stops on its own, saying which and why.
    pub async fn failed(&mut self) -> String {
        let describe = |what: &str, r: Result<Result<(), crate::ServerError>, tokio::task::JoinError>| match r {
            Ok(Ok(())) => format!("the {what} server stopped"),
            Ok(Err(e)) => format!("the {what} server failed: {e}"),
            Err(e) => format!("the {what} server task failed: {e}"),
        };
        tokio::select! {
            r = &mut self.flight => describe("Flight SQL", r),
            r = &mut self.data => describe("data plane", r),
            r = &mut self.http => describe("HTTP", r),
            r = &mut self.pg => describe("PostgreSQL", r),
        }
    }

    /// Stops the servers, letting calls in flight finish, then closes the stores cleanly.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.flight.await;
        let _ = self.data.await;
        let _ = self.http.await;
        let _ = self.pg.await;
        self.tables.close_cleanly().await;
    }
}
