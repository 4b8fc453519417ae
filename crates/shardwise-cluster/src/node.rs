//! `init_distributed_mode`: from a detected launch environment to a node that has joined its
//! cluster, in two steps so that every check runs before anything starts:
//! [`prepare`] validates settings, resolves the master, opens and locks the data dir;
//! [`Prepared::join`] (given the addresses this node serves) runs the rendezvous and barrier.
//! The joined [`Node`] also carries the replicated metadata ([`Node::metadata`],
//! [`Node::propose`]).

use std::collections::BTreeMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{info, warn};
use uuid::Uuid;

use crate::datadir::{ClusterRecord, DataDir};
use crate::error::{ClusterError, Result};
use crate::membership::{BoxFuture, ClusterView, MemberInfo, NodeState, Role};
use crate::metadata::{MetadataMachine, MetadataSnapshot};
use crate::rendezvous::{Master, MasterSettings, PersistedMembership};
use crate::secret::{ClusterSecret, MIN_SECRET_BYTES};
use crate::settings::Timeouts;
use crate::source::{Detected, LaunchSource};
use crate::worker::{OnWelcome, WorkerLink, WorkerSettings};

static INITIALIZED: AtomicBool = AtomicBool::new(false);

/// Everything `init_distributed_mode` needs.
#[derive(Debug, Clone)]
pub struct InitOptions {
    /// Rank, world size and master address, from [`crate::source::detect`].
    pub detected: Detected,
    pub data_dir: PathBuf,
    pub secret: Option<ClusterSecret>,
    /// Allow a multi-node cluster without a secret.
    pub insecure: bool,
    /// An explicit run id (`--run-id`); must match the data dir's and the master's.
    pub run_id: Option<String>,
    pub timeouts: Timeouts,
    /// One of several nodes of an embedded cluster in this process: the once-per-process
    /// guard and the secret requirement do not apply.
    pub embedded: bool,
    /// What a replicated metadata operation does. Only rank 0's is used; a master without one
    /// rejects every proposal.
    pub metadata_machine: Option<Arc<dyn MetadataMachine>>,
    /// `--replace-node`: the node id of a worker whose data dir was lost, whose rank this node
    /// takes with a fresh data dir.
    pub replace_node: Option<String>,
}

/// A validated configuration with its data dir locked, ready to join.
#[derive(Debug)]
pub struct Prepared {
    opts: InitOptions,
    data_dir: DataDir,
    master: Option<SocketAddr>,
    started: Instant,
}

/// Checks everything that can be checked without the network, in the order an operator would
/// fix them, and locks the data dir.
pub fn prepare(opts: InitOptions) -> Result<Prepared> {
    let started = Instant::now();
    let master = check(&opts)?;
    let d = &opts.detected;
    if !opts.embedded && INITIALIZED.swap(true, Ordering::SeqCst) {
        return Err(ClusterError::AlreadyInitialized { rank: d.rank });
    }
    let data_dir = match open_checked(&opts) {
        Ok(dir) => dir,
        Err(e) => {
            if !opts.embedded {
                INITIALIZED.store(false, Ordering::SeqCst);
            }
            return Err(e);
        }
    };
    Ok(Prepared { opts, data_dir, master, started })
}

/// What [`prepare`] checks before it touches the data dir: the timeouts, the secret a cluster of
/// several nodes needs, and that the master's address resolves (which it returns). `--dry-run`
/// runs it too, so that it approves only what a real start would accept.
pub fn check(opts: &InitOptions) -> Result<Option<SocketAddr>> {
    opts.timeouts.validate()?;
    if let Some(old) = &opts.replace_node {
        replaced_id(opts, old)?;
    }
    let d = &opts.detected;
    if d.world_size > 1 && opts.secret.is_none() && !opts.insecure && !opts.embedded {
        return Err(ClusterError::SecretRequired { world_size: d.world_size, min_bytes: MIN_SECRET_BYTES });
    }
    if d.world_size > 1 { resolve(&d.master_addr, d.master_port).map(Some) } else { Ok(None) }
}

fn open_checked(opts: &InitOptions) -> Result<DataDir> {
    let dir = DataDir::open(&opts.data_dir)?;
    dir.check_rank(opts.detected.rank, opts.detected.world_size)?;
    if let (Some(explicit), Some(rec)) = (&opts.run_id, dir.cluster())
        && *explicit != rec.run_id
    {
        return Err(ClusterError::DataDir {
            path: opts.data_dir.clone(),
            reason: format!("it belongs to run {}, but --run-id is {explicit}", rec.run_id),
        });
    }
    if let Some(old) = &opts.replace_node {
        return replacing(opts, dir, old);
    }
    Ok(dir)
}

/// Checks `--replace-node old` and, on a fresh data dir, records it there (durably, before the
/// node asks for the rank). On a data dir that has joined as itself since, the flag is moot
/// (a restart with the same command line).
fn replacing(opts: &InitOptions, mut dir: DataDir, old: &str) -> Result<DataDir> {
    let old = replaced_id(opts, old)?;
    let bad = |expected: &str| ClusterError::InvalidSetting {
        name: "replace_node".into(),
        value: old.to_string(),
        expected: expected.into(),
    };
    if old == dir.node_id().to_string() {
        return Err(bad("another node's id: this data dir is that node's own, so nothing is replaced; start it \
                        without --replace-node"));
    }
    match (dir.cluster(), dir.replacing()) {
        (_, Some(recorded)) if recorded == old => {}
        // Never admitted (a refused attempt: a wrong id, the old node still connected): the
        // dir has joined nothing, and may name another node.
        (None, Some(_)) => dir.mark_replacing(&old)?,
        (Some(_), Some(recorded)) => {
            return Err(bad(&format!(
                "{recorded}, the node this data dir has replaced (it has joined the cluster in that node's place)"
            )));
        }
        (Some(rec), None) => {
            info!(
                rank = rec.rank,
                "this data dir has joined as node {}; --replace-node {old} is ignored",
                dir.node_id()
            );
        }
        (None, None) => dir.mark_replacing(&old)?,
    }
    Ok(dir)
}

/// `--replace-node`'s node id, checked against what can be known before the data dir is opened.
fn replaced_id(opts: &InitOptions, old: &str) -> Result<String> {
    let bad = |expected: &str| ClusterError::InvalidSetting {
        name: "replace_node".into(),
        value: old.to_string(),
        expected: expected.into(),
    };
    if opts.detected.world_size < 2 {
        return Err(bad("a node of a cluster of several nodes: a single node has no replicas to rebuild from"));
    }
    if opts.detected.rank == 0 && opts.run_id.is_none() {
        return Err(bad(
            "given together with --run-id on rank 0: a master on an empty data dir knows neither the cluster's \
                        run nor its catalog, which it takes from the other ranks as they rejoin; give the run id \
                        (\"run_id\" in any worker's data dir, cluster.json, or in the workers' logs)",
        ));
    }
    Uuid::parse_str(old.trim())
        .map(|id| id.to_string())
        .map_err(|_| bad("the node id (a UUID) of the lost data dir, as the master's refusal or system.nodes names it"))
}

/// Where the master's rendezvous listens: the master's address, or every address when that
/// address is this machine's own name mapped to loopback here in a job across machines
/// ([`crate::reachable::own_name_on_loopback`]), where the other machines could not reach it.
fn rendezvous_bind_addr(d: &crate::source::Detected, master: SocketAddr) -> SocketAddr {
    if !crate::reachable::own_name_on_loopback(&d.master_addr, master.ip(), d.world_size, d.local_world_size) {
        return master;
    }
    let every: std::net::IpAddr = match master {
        SocketAddr::V4(_) => std::net::Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
    };
    warn!(
        "the master's address {} is this machine's name, which resolves here to {}, a loopback address (as \
         /etc/hosts maps it), while the job spans machines ({} of its {} ranks here): the rendezvous listens on every \
         address, port {}, so that the others reach it",
        d.master_addr,
        master.ip(),
        d.local_world_size.unwrap_or(1),
        d.world_size,
        master.port()
    );
    SocketAddr::new(every, master.port())
}

/// Resolves the master address, preferring IPv4 (what launchers hand out).
pub fn resolve(addr: &str, port: u16) -> Result<SocketAddr> {
    if let Ok(ip) = addr.parse::<std::net::IpAddr>() {
        return Ok(SocketAddr::new(ip, port)); // a literal address needs no resolver
    }
    let unresolvable = |reason: String| ClusterError::MasterUnresolvable { addr: addr.to_string(), port, reason };
    let addrs: Vec<SocketAddr> = (addr, port).to_socket_addrs().map_err(|e| unresolvable(e.to_string()))?.collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
        .ok_or_else(|| unresolvable("no addresses".into()))
}

impl Prepared {
    pub fn rank(&self) -> u32 {
        self.opts.detected.rank
    }

    pub fn node_id(&self) -> Uuid {
        self.data_dir.node_id()
    }

    /// Joins the cluster, announcing `addrs` (service name -> `host:port`) to the other nodes.
    pub async fn join(mut self, addrs: BTreeMap<String, String>) -> Result<Node> {
        let d = self.opts.detected.clone();
        let node_id = self.data_dir.node_id();
        let recorded = self.data_dir.cluster().map(|r| r.run_id.clone());
        let (run_id, epoch, inner) = if d.rank == 0 {
            let state_dir = self.data_dir.path().join("master");
            let mut resumed = PersistedMembership::load(&state_dir)?;
            let run_id = self
                .opts
                .run_id
                .clone()
                .or(recorded)
                // Formed, and stopped before its cluster.json was written: the run it formed.
                .or_else(|| resumed.as_ref().map(|p| p.run_id.clone()))
                .or_else(|| d.run_id.clone())
                .unwrap_or_else(|| Uuid::new_v4().to_string());
            // A master on an empty data dir in place of a lost one: the cluster has formed, and
            // its ranks' nodes and catalog are taken from them as they rejoin, all of them before
            // this node serves (a crash meanwhile resumes the same way: the data dir still
            // records the replacement and not every rank).
            let adopting = self.data_dir.replacing().is_some()
                && resumed.as_ref().is_none_or(|p| p.members.len() < d.world_size as usize);
            if adopting && resumed.is_none() {
                let replaced = self.data_dir.replacing().map(|old| (old.to_string(), node_id.to_string()));
                warn!(run_id, "this node replaces a master whose data dir was lost; waiting for every rank to rejoin");
                resumed = Some(PersistedMembership {
                    run_id: run_id.clone(),
                    world_size: d.world_size,
                    members: Vec::new(),
                    secured: Some(self.opts.secret.is_some()),
                    replaced: replaced.into_iter().collect(),
                });
            }
            if let Some(p) = &resumed {
                if p.world_size != d.world_size || p.run_id != run_id {
                    return Err(ClusterError::DataDir {
                        path: state_dir,
                        reason: format!(
                            "the membership on disk is run {} of world size {}, not run {run_id} of world size {}",
                            p.run_id, p.world_size, d.world_size
                        ),
                    });
                }
                if p.secured == Some(true) && self.opts.secret.is_none() {
                    return Err(ClusterError::DataDir {
                        path: state_dir,
                        reason: "this cluster was formed with a cluster secret, and the master was started without \
                                 one: start it with the same secret (--secret-file or SHARDWISE_CLUSTER_SECRET), or \
                                 its nodes cannot rejoin"
                            .into(),
                    });
                }
                let metadata_file = state_dir.join(crate::metadata::METADATA_FILE);
                if !adopting && !metadata_file.exists() && holds_table_data(self.data_dir.path()) {
                    return Err(ClusterError::DataDir {
                        path: metadata_file,
                        reason: "missing, though this cluster has run and this data dir holds shard replicas \
                                 (tables/): the catalog of the cluster's tables is lost. Starting without it would \
                                 make an empty catalog, whose new tables would reuse the ids of the existing ones. \
                                 Restore master/metadata.json from a backup of this data dir, even an older one: \
                                 the master takes the newer version the workers hold when they rejoin"
                            .into(),
                    });
                }
                if !adopting {
                    info!(run_id, "resuming the cluster recorded in the data dir");
                }
            }
            let listener = match self.master {
                Some(addr) => {
                    let addr = rendezvous_bind_addr(&d, addr);
                    Some(
                        TcpListener::bind(addr)
                            .await
                            .map_err(|source| ClusterError::RendezvousBind { addr: addr.to_string(), source })?,
                    )
                }
                None => None,
            };
            let own = MemberInfo {
                rank: 0,
                node_id: node_id.to_string(),
                role: Role::Master,
                addrs,
                state: NodeState::Up,
                epoch: 1,
                last_heartbeat_unix_ms: None,
            };
            let settings = MasterSettings {
                run_id: run_id.clone(),
                world_size: d.world_size,
                secret: self.opts.secret.clone(),
                timeouts: self.opts.timeouts.clone(),
                state_dir,
                own,
                metadata_machine: self.opts.metadata_machine.clone(),
                adopting,
                replaces_master: self.data_dir.replacing().filter(|_| adopting).map(str::to_string),
            };
            let master = Master::start(settings, listener, resumed)?;
            // The run is recorded once the cluster has formed (a replacement's, once every rank
            // has confirmed it): an attempt that does not form (a rank that never came, a
            // mistyped --run-id) leaves the data dir free for the next one, which may come under
            // another launcher run id (a resubmitted Slurm job, a new torchrun run).
            if let Err(e) = master.form().await {
                // Its rendezvous port is free again for the next attempt in this process.
                master.shutdown().await;
                return Err(e);
            }
            self.data_dir.record_cluster(ClusterRecord {
                run_id: run_id.clone(),
                rank: d.rank,
                world_size: d.world_size,
            })?;
            let epoch = master.members().first().map(|m| m.epoch).unwrap_or(1);
            (run_id, epoch, Inner::Master(master))
        } else {
            let master = self.master.ok_or_else(|| ClusterError::InvalidSetting {
                name: "world_size".into(),
                value: d.world_size.to_string(),
                expected: "more than 1 for a worker rank".into(),
            })?;
            let settings = WorkerSettings {
                master,
                rank: d.rank,
                world_size: d.world_size,
                node_id: node_id.to_string(),
                // A launcher's run id (SLURM_JOB_ID, TORCHELASTIC_RUN_ID) names a forming
                // cluster's run, not a formed one's: a replacement joins a cluster formed under
                // an earlier job, whose run it names by the node it replaces instead.
                run_id: self.opts.run_id.clone().or(recorded).or_else(|| match self.data_dir.replacing() {
                    Some(_) => None,
                    None => d.run_id.clone(),
                }),
                addrs,
                secret: self.opts.secret.clone(),
                timeouts: self.opts.timeouts.clone(),
                replaces: self.data_dir.replacing().map(str::to_string),
                data_dir: Some(self.data_dir.path().to_path_buf()),
            };
            let data_dir = &mut self.data_dir;
            let (rank, world_size) = (d.rank, d.world_size);
            let mut record =
                |run_id: &str| data_dir.record_cluster(ClusterRecord { run_id: run_id.to_string(), rank, world_size });
            let replacing = settings.replaces.is_some();
            // A replacement is recorded as joined only once its master serves: a replacement
            // master may still refuse it at the end of its wait, recording nothing, and the data
            // dir must then be free to name another node.
            let mut later = |_: &str| Ok(());
            let on_welcome: &mut OnWelcome<'_> = if replacing { &mut later } else { &mut record };
            let (link, joined) = WorkerLink::join_then(settings, on_welcome).await?;
            if replacing {
                let waited = link.wait_until_master_has_catalog().await;
                if let Err(e) = waited.and_then(|()| record(&joined.run_id)) {
                    // Not left running behind the error (the link keeps rejoining otherwise).
                    link.leave().await;
                    return Err(e);
                }
            }
            // The membership as the master answers it, recorded in `masters.json` (the master
            // this node serves under, and each rank's node).
            link.record_membership().await;
            (joined.run_id, joined.epoch, Inner::Worker(link))
        };
        let init_ms = self.started.elapsed().as_millis() as u64;
        Ok(Node {
            rank: d.rank,
            world_size: d.world_size,
            source: d.source,
            node_id,
            run_id,
            epoch,
            init_ms,
            rendezvous: self.master,
            view: Arc::new(NodeView { rank: d.rank, world_size: d.world_size, inner }),
            master_fatal: watch::channel(None).0,
            _data_dir: self.data_dir,
        })
    }
}

/// `init_distributed_mode` in one call: [`prepare`], then [`Prepared::join`].
pub async fn init_distributed_mode(opts: InitOptions, addrs: BTreeMap<String, String>) -> Result<Node> {
    prepare(opts)?.join(addrs).await
}

#[derive(Debug, Clone)]
enum Inner {
    Master(Arc<Master>),
    Worker(Arc<WorkerLink>),
}

#[derive(Debug)]
struct NodeView {
    rank: u32,
    world_size: u32,
    inner: Inner,
}

impl ClusterView for NodeView {
    fn rank(&self) -> u32 {
        self.rank
    }
    fn world_size(&self) -> u32 {
        self.world_size
    }
    fn members(&self) -> BoxFuture<'_, Vec<MemberInfo>> {
        Box::pin(async move {
            match &self.inner {
                Inner::Master(m) => m.members(),
                Inner::Worker(w) => w.members().await,
            }
        })
    }
}

/// Shared access to the replicated metadata ([`Node::metadata`], [`Node::propose`]).
#[derive(Debug, Clone)]
pub struct MetadataHandle {
    view: Arc<NodeView>,
}

impl MetadataHandle {
    /// See [`Node::metadata`].
    pub fn metadata(&self) -> watch::Receiver<MetadataSnapshot> {
        match &self.view.inner {
            Inner::Worker(w) => w.metadata(),
            Inner::Master(m) => m.metadata(),
        }
    }

    /// Makes sure this node's metadata is as new as the master's before a statement (`writing`:
    /// a write) relies on it (at once on the master; see [`WorkerLink::ensure_metadata_current`]).
    pub async fn ensure_current(&self, writing: bool) -> std::result::Result<(), String> {
        match &self.view.inner {
            Inner::Worker(w) => w.ensure_metadata_current(writing).await,
            Inner::Master(_) => Ok(()),
        }
    }

    /// Why writes through this node are refused now, as its link to the master tells without a
    /// round trip ([`WorkerLink::master_problem`]); `None` on the master.
    pub fn master_problem(&self) -> Option<String> {
        match &self.view.inner {
            Inner::Worker(w) => w.master_problem(),
            Inner::Master(_) => None,
        }
    }

    /// See [`Node::propose`].
    pub async fn propose(&self, op: Value) -> Result<MetadataSnapshot> {
        match &self.view.inner {
            Inner::Worker(w) => w.propose(op).await,
            Inner::Master(m) => m.propose(op).await,
        }
    }
}

/// A node that has joined its cluster. Holds the data dir lock for its lifetime.
#[derive(Debug)]
pub struct Node {
    pub rank: u32,
    pub world_size: u32,
    pub source: LaunchSource,
    pub node_id: Uuid,
    pub run_id: String,
    /// This incarnation's epoch.
    pub epoch: u64,
    /// Milliseconds from `prepare` to passing the barrier.
    pub init_ms: u64,
    /// The master's rendezvous address (None in a single-node cluster).
    pub rendezvous: Option<SocketAddr>,
    view: Arc<NodeView>,
    /// The master's never-firing `fatal` channel (kept so receivers do not see it closed).
    master_fatal: watch::Sender<Option<String>>,
    _data_dir: DataDir,
}

impl Node {
    pub fn role(&self) -> Role {
        Role::for_rank(self.rank)
    }

    /// Membership access for the query layer.
    pub fn view(&self) -> Arc<dyn ClusterView> {
        self.view.clone()
    }

    /// The replicated metadata: the current snapshot, updated as changes arrive. A node only
    /// ever moves to newer versions. Holds the master's current snapshot as soon as
    /// `init_distributed_mode` returns.
    pub fn metadata(&self) -> watch::Receiver<MetadataSnapshot> {
        self.metadata_handle().metadata()
    }

    /// Proposes a change to the replicated metadata. The master applies proposals one at a
    /// time with its [`MetadataMachine`], stores the new snapshot durably, sends it to every
    /// connected node and then answers. On `Ok`, [`Node::metadata`] on this node already holds
    /// the returned version or a newer one.
    ///
    /// Errors: [`ClusterError::MetadataRejected`] (the machine or a limit refused it; nothing
    /// changed); [`ClusterError::MetadataNotNow`] (the master takes no change for now, as a
    /// replacement master before every rank rejoined; nothing changed, retry);
    /// [`ClusterError::MetadataUnreachable`] (no answer within `propose_timeout_ms`;
    /// the message says whether the change may have been applied);
    /// [`ClusterError::MetadataStore`] (the master could not write it to disk).
    pub async fn propose(&self, op: Value) -> Result<MetadataSnapshot> {
        self.metadata_handle().propose(op).await
    }

    /// A handle on the replicated metadata that can be kept and shared independently of the
    /// `Node` (the table layer holds one).
    pub fn metadata_handle(&self) -> MetadataHandle {
        MetadataHandle { view: Arc::clone(&self.view) }
    }

    /// Becomes `Some(reason)` if this node must stop (fenced out by a newer incarnation, or
    /// refused when rejoining). Never fires on the master.
    pub fn fatal(&self) -> watch::Receiver<Option<String>> {
        match &self.view.inner {
            Inner::Worker(w) => w.fatal(),
            Inner::Master(_) => self.master_fatal.subscribe(),
        }
    }

    /// The node id of the lost data dir this node took the rank of (`--replace-node`), as its
    /// data dir recorded it when the node started (and until [`Node::finish_replacing`]).
    pub fn replacing(&self) -> Option<&str> {
        self._data_dir.replacing()
    }

    /// Forgets the replacement: the node's tables have durably recorded which replicas await
    /// their rebuild.
    pub fn finish_replacing(&self) -> Result<()> {
        crate::datadir::finish_replacing(self._data_dir.path())
    }

    /// Graceful shutdown: a worker tells the master it leaves; the master stops serving (the
    /// workers keep running and rejoin when it returns).
    pub async fn shutdown(self) {
        match &self.view.inner {
            Inner::Worker(w) => w.leave().await,
            Inner::Master(m) => m.shutdown().await,
        }
        if self.view.rank == 0 || self.world_size == 1 {
            INITIALIZED.store(false, Ordering::SeqCst);
        }
    }
}

/// Whether `data_dir` holds shard replicas: the table layer keeps them under `tables/`.
fn holds_table_data(data_dir: &std::path::Path) -> bool {
    std::fs::read_dir(data_dir.join("tables")).is_ok_and(|mut entries| entries.next().is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::Detected;
    use serde_json::Value;

    fn opts(rank: u32, world: u32, port: u16, dir: &std::path::Path, secret: Option<&str>) -> InitOptions {
        InitOptions {
            detected: Detected {
                source: LaunchSource::Flags,
                rank,
                world_size: world,
                local_rank: Some(rank),
                local_world_size: Some(world),
                master_addr: "127.0.0.1".into(),
                master_port: port,
                run_id: None,
                warnings: vec![],
            },
            data_dir: dir.join(format!("rank-{rank}")),
            secret: secret.map(|s| ClusterSecret::new(s.as_bytes().to_vec(), "test").unwrap()),
            insecure: false,
            run_id: None,
            timeouts: Timeouts { join_timeout_ms: 10_000, ..Timeouts::default() },
            embedded: true,
            metadata_machine: None,
            replace_node: None,
        }
    }

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    /// Ranks 0..n of one cluster, started together in this process.
    async fn form(n: u32, port: u16, dir: &std::path::Path, secret: Option<&str>) -> Vec<Node> {
        let starts = (0..n).map(|r| init_distributed_mode(opts(r, n, port, dir, secret), addrs(r))).collect();
        futures_join(starts).await.into_iter().map(|node| node.unwrap()).collect()
    }

    fn addrs(rank: u32) -> BTreeMap<String, String> {
        BTreeMap::from([("flight".to_string(), format!("127.0.0.1:{}", 40000 + rank))])
    }

    #[tokio::test]
    async fn three_nodes_form_a_cluster_in_one_process() {
        let tmp = tempfile::tempdir().unwrap();
        let port = free_port();
        let secret = Some("0123456789abcdef-secret");
        let nodes = form(3, port, tmp.path(), secret).await;
        let run_ids: std::collections::BTreeSet<_> = nodes.iter().map(|n| n.run_id.clone()).collect();
        assert_eq!(run_ids.len(), 1);
        for n in &nodes {
            let members = n.view().members().await;
            assert_eq!(members.len(), 3);
            assert!(members.iter().all(|m| m.state == NodeState::Up), "{members:?}");
            assert_eq!(members[2].addrs["flight"], "127.0.0.1:40002");
        }
        // A second node for rank 2 with another identity is refused while rank 2 is live.
        let other = tempfile::tempdir().unwrap();
        let err = init_distributed_mode(opts(2, 3, port, other.path(), secret), addrs(2)).await.unwrap_err();
        assert!(err.to_string().contains("already held by live node"), "{err}");
        // A node with the wrong secret is refused.
        let err = init_distributed_mode(opts(1, 3, port, other.path(), Some("another-secret-0123")), addrs(1))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("wrong cluster secret"), "{err}");
        // A node of another run is refused.
        let mut o = opts(1, 3, port, other.path(), secret);
        o.run_id = Some("another-run".into());
        let err = init_distributed_mode(o, addrs(1)).await.unwrap_err();
        assert!(err.to_string().contains("run id mismatch"), "{err}");
        // A node with another world size is refused.
        let err = init_distributed_mode(opts(1, 4, port, other.path(), secret), addrs(1)).await.unwrap_err();
        assert!(err.to_string().contains("world size mismatch"), "{err}");
        for n in nodes {
            n.shutdown().await;
        }
    }

    /// A launcher's run id (a Slurm job id) names the attempt that forms the cluster: one that
    /// never formed (a rank never came) records nothing, so the next job, with another id,
    /// forms on the same data dirs; and a replacement under a later job is not held to it.
    #[tokio::test]
    async fn a_formation_that_never_completed_leaves_the_data_dirs_free_for_the_next_job() {
        let tmp = tempfile::tempdir().unwrap();
        let port = free_port();
        let job = |rank: u32, id: &str, join_timeout_ms: u64| {
            let mut o = opts(rank, 3, port, tmp.path(), None);
            o.detected.run_id = Some(id.to_string());
            o.timeouts.join_timeout_ms = join_timeout_ms;
            o
        };
        // Job 100: rank 2 never comes.
        let first = futures_join(vec![
            init_distributed_mode(job(0, "100", 1_500), addrs(0)),
            init_distributed_mode(job(1, "100", 1_500), addrs(1)),
        ])
        .await;
        assert!(first.iter().all(|r| r.is_err()));
        for rank in [0, 1] {
            let dir = DataDir::open(&tmp.path().join(format!("rank-{rank}"))).unwrap();
            assert!(dir.cluster().is_none(), "rank {rank} recorded a run that never formed");
        }
        // Job 101: all three come, and form.
        let nodes: Vec<Node> =
            futures_join((0..3).map(|r| init_distributed_mode(job(r, "101", 10_000), addrs(r))).collect())
                .await
                .into_iter()
                .map(|n| n.unwrap())
                .collect();
        assert!(nodes.iter().all(|n| n.run_id == "101"));
        for rank in 0..3 {
            let record = std::fs::read_to_string(tmp.path().join(format!("rank-{rank}/cluster.json"))).unwrap();
            assert_eq!(serde_json::from_str::<Value>(&record).unwrap()["run_id"], "101", "rank {rank}");
        }
        // Rank 1 back without a record of its run (as after a barrier that never passed: workers
        // record the run once it has), under job 102: its node is the membership's, so it is
        // admitted whatever run id its launcher gives.
        let mut nodes = nodes;
        let rank_1 = nodes.remove(1);
        rank_1.shutdown().await;
        std::fs::remove_file(tmp.path().join("rank-1/cluster.json")).unwrap();
        let rank_1 = init_distributed_mode(job(1, "102", 10_000), addrs(1)).await.unwrap();
        assert_eq!(rank_1.run_id, "101");
        nodes.insert(1, rank_1);
        // Rank 2's data dir lost; its replacement comes under job 102.
        let lost = nodes.pop().unwrap();
        let old = lost.node_id.to_string();
        lost.shutdown().await;
        let fresh = tempfile::tempdir().unwrap();
        let mut o = job(2, "102", 10_000);
        o.data_dir = fresh.path().join("rank-2");
        o.replace_node = Some(old);
        let replacement = init_distributed_mode(o, addrs(2)).await.unwrap();
        assert_eq!(replacement.run_id, "101");
        replacement.shutdown().await;
        for n in nodes {
            n.shutdown().await;
        }
    }

    #[tokio::test]
    async fn a_worker_restarted_on_its_data_dir_keeps_its_id_with_a_higher_epoch() {
        let tmp = tempfile::tempdir().unwrap();
        let port = free_port();
        let mut nodes = form(2, port, tmp.path(), None).await;
        let w = nodes.pop().unwrap();
        let (id, epoch) = (w.node_id, w.epoch);
        w.shutdown().await;
        // A graceful stop is `down` at once, without waiting for the failure detector.
        let members = nodes[0].view().members().await;
        assert_eq!(members[1].state, NodeState::Down, "{members:?}");
        let w = init_distributed_mode(opts(1, 2, port, tmp.path(), None), addrs(1)).await.unwrap();
        assert_eq!(w.node_id, id);
        assert!(w.epoch > epoch);
        let members = nodes[0].view().members().await;
        assert_eq!(members[1].state, NodeState::Up);
        assert_eq!(members[1].epoch, w.epoch);
        w.shutdown().await;
        nodes.pop().unwrap().shutdown().await;
    }

    /// A worker whose data dir was lost: an empty one is refused, naming the node id to give;
    /// with `--replace-node` naming it the new node takes the rank (and says so until its tables
    /// took note), the lost node's id is then refused, and a restart with the flag still given
    /// is the new node again.
    #[tokio::test]
    async fn a_worker_whose_data_dir_was_lost_is_replaced_only_when_named() {
        let tmp = tempfile::tempdir().unwrap();
        let port = free_port();
        let mut nodes = form(2, port, tmp.path(), Some("0123456789abcdef-secret")).await;
        let w = nodes.pop().unwrap();
        let old = w.node_id.to_string();
        w.shutdown().await;
        let lost = tmp.path().join("rank-1");
        let kept = tmp.path().join("rank-1-old");
        std::fs::rename(&lost, &kept).unwrap();
        let fresh = |replace: Option<&str>| {
            let mut o = opts(1, 2, port, tmp.path(), Some("0123456789abcdef-secret"));
            o.timeouts.join_timeout_ms = 3_000;
            o.replace_node = replace.map(str::to_string);
            o
        };
        let err = init_distributed_mode(fresh(None), addrs(1)).await.unwrap_err().to_string();
        assert!(err.contains(&format!("--replace-node {old}")), "{err}");
        std::fs::remove_dir_all(&lost).unwrap();
        // Checked before the data dir is made.
        let err = init_distributed_mode(fresh(Some("not-a-uuid")), addrs(1)).await.unwrap_err().to_string();
        assert!(err.contains("node id (a UUID)"), "{err}");
        let mut on_master = opts(0, 2, port, tmp.path(), None);
        on_master.replace_node = Some(old.clone());
        let err = prepare(on_master).unwrap_err().to_string();
        assert!(err.contains("given together with --run-id on rank 0"), "{err}");
        assert!(!lost.exists());
        let other = "22222222-2222-2222-2222-222222222222";
        let err = init_distributed_mode(fresh(Some(other)), addrs(1)).await.unwrap_err().to_string();
        assert!(err.contains(&format!("rank 1 belongs to node {old}")), "{err}");
        // A refused attempt leaves the dir free to name the right node.
        assert_eq!(std::fs::read_to_string(lost.join("REPLACING")).unwrap().trim(), other);

        let w = init_distributed_mode(fresh(Some(&old)), addrs(1)).await.unwrap();
        assert_ne!(w.node_id.to_string(), old);
        assert_eq!(w.replacing(), Some(old.as_str()));
        let members = nodes[0].view().members().await;
        assert_eq!(members[1].node_id, w.node_id.to_string());
        w.finish_replacing().unwrap();
        let new_id = w.node_id;
        w.shutdown().await;
        // The lost node, back after all, is refused: its rank is the new node's.
        let mut back = opts(1, 2, port, tmp.path(), Some("0123456789abcdef-secret"));
        back.data_dir = kept;
        back.timeouts.join_timeout_ms = 3_000;
        let err = init_distributed_mode(back, addrs(1)).await.unwrap_err().to_string();
        assert!(err.contains(&format!("was replaced by node {new_id}")) && err.contains("stale"), "{err}");
        // Restarted with the same command line, the new node is itself, not a replacement.
        let w = init_distributed_mode(fresh(Some(&old)), addrs(1)).await.unwrap();
        assert_eq!((w.node_id, w.replacing()), (new_id, None));
        w.shutdown().await;
        nodes.pop().unwrap().shutdown().await;
    }

    #[tokio::test]
    async fn a_secured_cluster_is_not_resumed_without_its_secret() {
        let tmp = tempfile::tempdir().unwrap();
        let port = free_port();
        let secret = Some("0123456789abcdef-secret");
        for n in form(2, port, tmp.path(), secret).await {
            n.shutdown().await;
        }
        let mut o = opts(0, 2, free_port(), tmp.path(), None);
        o.insecure = true;
        let err = init_distributed_mode(o, addrs(0)).await.unwrap_err();
        assert!(err.to_string().contains("formed with a cluster secret"), "{err}");
    }

    #[tokio::test]
    async fn a_newer_incarnation_fences_the_old_one_out() {
        use crate::worker::{WorkerLink, WorkerSettings};
        let tmp = tempfile::tempdir().unwrap();
        let port = free_port();
        let settings = WorkerSettings {
            master: format!("127.0.0.1:{port}").parse().unwrap(),
            rank: 1,
            world_size: 2,
            node_id: "11111111-1111-1111-1111-111111111111".into(),
            run_id: None,
            addrs: addrs(1),
            secret: None,
            timeouts: Timeouts::default(),
            replaces: None,
            data_dir: None,
        };
        let master = tokio::spawn(init_distributed_mode(opts(0, 2, port, tmp.path(), None), addrs(0)));
        let (old, joined) = WorkerLink::join(settings.clone()).await.unwrap();
        let master = master.await.unwrap().unwrap();
        // The same node (same node_id) comes back while the old incarnation is still connected,
        // as after a pause or a partition: it gets a higher epoch and the old one is fenced.
        let (new, rejoined) = WorkerLink::join(settings.clone()).await.unwrap();
        assert!(rejoined.epoch > joined.epoch);
        let mut fatal = old.fatal();
        let reason = tokio::time::timeout(std::time::Duration::from_secs(5), fatal.wait_for(|f| f.is_some()))
            .await
            .expect("old incarnation fenced within 5 s")
            .unwrap()
            .clone()
            .unwrap();
        assert!(reason.contains("fenced"), "{reason}");
        assert!(new.fatal().borrow().is_none());
        let members = master.view().members().await;
        assert_eq!(members[1].epoch, rejoined.epoch);
        // The old incarnation reconnecting (say its heartbeat timer fired before it read the
        // `Fenced`) says which epoch it held, and is fenced out instead of taking the rank back.
        let err = crate::worker::connect_once(&settings, "another process", Some(joined.epoch))
            .await
            .err()
            .expect("stale rejoin refused");
        assert!(matches!(err, ClusterError::Fenced { .. }), "{err}");
        assert!(err.to_string().contains("newer incarnation"), "{err}");
        assert!(new.fatal().borrow().is_none());
        assert_eq!(master.view().members().await[1].epoch, rejoined.epoch);
        // A node follows the master's heartbeat settings, whatever its own flags say.
        let own = Timeouts {
            heartbeat_interval_ms: 7_000,
            suspect_after_ms: 8_000,
            down_after_ms: 20_000,
            ..Timeouts::default()
        };
        let session = crate::worker::connect_once(
            &WorkerSettings { timeouts: own, ..settings.clone() },
            "x",
            Some(rejoined.epoch),
        )
        .await
        .expect("the current incarnation may reconnect");
        assert_eq!((session.heartbeat_interval_ms, session.down_after_ms), (500, 6_000));
        let admitted = session.epoch;
        drop(session);
        // The same process again with the epoch before that one (its attempt was admitted, then
        // cut off before it learned the new epoch): a retry, not a stale incarnation.
        let again = crate::worker::connect_once(&settings, "x", Some(rejoined.epoch)).await.expect("a retry");
        assert!(again.epoch > admitted);
        drop(again);
        new.leave().await;
        master.shutdown().await;
    }

    /// A table catalog in miniature: `{"create": NAME}` adds a table (a second one of the same
    /// name is refused); `{"blob_bytes": N}` stores an N-byte string alongside. Either may carry
    /// `"sleep_ms": N`: the change takes that long to apply (a slow disk, a busy master).
    #[derive(Debug)]
    struct Tables;

    impl MetadataMachine for Tables {
        fn apply(&self, state: &Value, op: &Value) -> std::result::Result<Value, String> {
            if let Some(ms) = op.get("sleep_ms").and_then(Value::as_u64) {
                std::thread::sleep(std::time::Duration::from_millis(ms));
            }
            let mut next = if state.is_null() { serde_json::json!({"tables": []}) } else { state.clone() };
            if let Some(name) = op.get("create").and_then(Value::as_str) {
                let tables = next["tables"].as_array_mut().ok_or("state has no table list")?;
                if tables.iter().any(|t| t == name) {
                    return Err(format!("table {name} already exists"));
                }
                tables.push(name.into());
            } else if let Some(n) = op.get("blob_bytes").and_then(Value::as_u64) {
                next["blob"] = "x".repeat(n as usize).into();
            } else {
                return Err(format!("unknown operation {op}"));
            }
            Ok(next)
        }
    }

    fn meta_opts(rank: u32, world: u32, port: u16, dir: &std::path::Path, propose_timeout_ms: u64) -> InitOptions {
        let mut o = opts(rank, world, port, dir, Some("0123456789abcdef-secret"));
        o.timeouts.propose_timeout_ms = propose_timeout_ms;
        o.metadata_machine = Some(Arc::new(Tables));
        o
    }

    async fn start(world: u32, port: u16, dir: &std::path::Path, propose_timeout_ms: u64) -> Vec<Node> {
        futures_join(
            (0..world)
                .map(|r| init_distributed_mode(meta_opts(r, world, port, dir, propose_timeout_ms), addrs(r)))
                .collect(),
        )
        .await
        .into_iter()
        .map(|n| n.unwrap())
        .collect()
    }

    fn table_names(s: &MetadataSnapshot) -> Vec<String> {
        s.state["tables"]
            .as_array()
            .map(|a| a.iter().filter_map(|t| t.as_str().map(String::from)).collect())
            .unwrap_or_default()
    }

    fn create(name: &str) -> Value {
        serde_json::json!({ "create": name })
    }

    /// Waits (at most 5 s) until `node` has seen `version`.
    async fn seen(node: &Node, version: u64) -> MetadataSnapshot {
        let mut rx = node.metadata();
        let waited =
            tokio::time::timeout(std::time::Duration::from_secs(5), rx.wait_for(|s| s.version >= version)).await;
        let snapshot = waited.expect("version reached within 5 s").unwrap().clone();
        assert_eq!(snapshot.version, version, "{snapshot:?}");
        snapshot
    }

    fn on_disk(dir: &std::path::Path) -> MetadataSnapshot {
        crate::metadata::load(&dir.join("rank-0/master")).unwrap()
    }

    #[tokio::test]
    async fn metadata_changes_from_any_node_reach_every_node_in_order() {
        let tmp = tempfile::tempdir().unwrap();
        let nodes = start(3, free_port(), tmp.path(), 10_000).await;
        for n in &nodes {
            assert_eq!(*n.metadata().borrow(), MetadataSnapshot::default());
        }
        // Versions a worker observes must only grow, whatever order messages arrive in.
        let mut watched = nodes[2].metadata();
        let observer = tokio::spawn(async move {
            let mut versions = Vec::new();
            while watched.changed().await.is_ok() {
                versions.push(watched.borrow_and_update().version);
                if versions.last() == Some(&14) {
                    break;
                }
            }
            versions
        });

        let v1 = nodes[0].propose(create("a")).await.unwrap();
        assert_eq!((v1.version, table_names(&v1)), (1, vec!["a".to_string()]));
        assert!(nodes[0].metadata().borrow().version >= 1);
        let v2 = nodes[1].propose(create("b")).await.unwrap();
        assert_eq!((v2.version, table_names(&v2)), (2, vec!["a".to_string(), "b".to_string()]));
        // The proposer's own view holds the new version as soon as `propose` returns.
        assert_eq!(*nodes[1].metadata().borrow(), v2);
        // Stored before anyone was told.
        assert_eq!(on_disk(tmp.path()), v2);

        // Rejected operations change nothing, on a worker or on the master.
        for (n, op) in [(2, create("a")), (0, create("b")), (1, serde_json::json!({"drop": "a"}))] {
            let err = nodes[n].propose(op).await.unwrap_err();
            assert!(matches!(err, ClusterError::MetadataRejected { .. }), "{err}");
            assert!(err.to_string().starts_with("metadata change rejected: "), "{err}");
        }
        let err = nodes[2].propose(create("a")).await.unwrap_err().to_string();
        assert!(err.contains("table a already exists"), "{err}");
        // A state that would not fit in one control frame is refused, and so is an operation.
        let err = nodes[1].propose(serde_json::json!({"blob_bytes": crate::wire::MAX_FRAME_BYTES})).await.unwrap_err();
        assert!(err.to_string().contains("more than the control frame limit"), "{err}");
        let huge_op = serde_json::json!({"create": "x".repeat(crate::wire::MAX_FRAME_BYTES)});
        let err = nodes[2].propose(huge_op).await.unwrap_err();
        assert!(matches!(err, ClusterError::MetadataRejected { .. }), "{err}");
        assert!(err.to_string().contains("the operation is 16777"), "{err}");
        for n in &nodes {
            assert_eq!(seen(n, 2).await, v2);
        }
        assert_eq!(on_disk(tmp.path()), v2);

        // Concurrent proposals from every node are applied one at a time: distinct versions.
        let nodes = Arc::new(nodes);
        let proposals = (0..12u32).map(|i| {
            let nodes = Arc::clone(&nodes);
            async move { nodes[(i % 3) as usize].propose(create(&format!("t{i}"))).await.unwrap().version }
        });
        let mut versions = futures_join(proposals.collect()).await;
        versions.sort();
        assert_eq!(versions, (3..=14).collect::<Vec<u64>>());
        let last = seen(&nodes[0], 14).await;
        assert_eq!(table_names(&last).len(), 14);
        for n in nodes.iter() {
            assert_eq!(seen(n, 14).await, last);
        }
        let observed = tokio::time::timeout(std::time::Duration::from_secs(5), observer).await.unwrap().unwrap();
        assert!(observed.windows(2).all(|w| w[0] < w[1]), "{observed:?}");
        assert_eq!(observed.last(), Some(&14));
        let Ok(nodes) = Arc::try_unwrap(nodes) else { panic!("nodes still shared") };
        for n in nodes.into_iter().rev() {
            n.shutdown().await;
        }
    }

    #[tokio::test]
    async fn a_master_without_a_machine_rejects_every_proposal() {
        let tmp = tempfile::tempdir().unwrap();
        let port = free_port();
        let nodes = form(2, port, tmp.path(), None).await;
        for n in &nodes {
            let err = n.propose(create("a")).await.unwrap_err().to_string();
            assert!(err.contains("has no metadata machine"), "{err}");
            assert_eq!(n.metadata().borrow().version, 0);
        }
        for n in nodes.into_iter().rev() {
            n.shutdown().await;
        }
    }

    #[tokio::test]
    async fn a_node_restarted_after_changes_has_them_when_init_returns() {
        let tmp = tempfile::tempdir().unwrap();
        let port = free_port();
        let mut nodes = start(3, port, tmp.path(), 10_000).await;
        nodes[1].propose(create("a")).await.unwrap();
        let worker = nodes.pop().unwrap();
        worker.shutdown().await;
        // Changes made while rank 2 is away.
        nodes[0].propose(create("b")).await.unwrap();
        let v3 = nodes[1].propose(create("c")).await.unwrap();
        let worker = init_distributed_mode(meta_opts(2, 3, port, tmp.path(), 10_000), addrs(2)).await.unwrap();
        assert_eq!(*worker.metadata().borrow(), v3, "the snapshot arrives before init returns");
        // And every later change.
        let v4 = worker.propose(create("d")).await.unwrap();
        assert_eq!(seen(&nodes[1], 4).await, v4);
        worker.shutdown().await;
        for n in nodes.into_iter().rev() {
            n.shutdown().await;
        }
    }

    /// A proposal whose proposer gave up (here: it waited behind a slow change on the master;
    /// in the wild, a master paused by SIGSTOP for longer than `propose_timeout_ms`) must not be
    /// applied when the master gets to it: the proposer has already said it failed, and a
    /// TRUNCATE applied 30 s later would remove rows acknowledged meanwhile. One the master has
    /// started applying is waited for past the deadline instead.
    #[tokio::test]
    async fn a_proposal_given_up_by_its_proposer_is_not_applied_later() {
        let tmp = tempfile::tempdir().unwrap();
        let propose_timeout_ms = 1_000;
        let mut nodes = start(2, free_port(), tmp.path(), propose_timeout_ms).await;
        let worker = Arc::new(nodes.pop().unwrap());
        let master = Arc::new(nodes.pop().unwrap());

        // The master is busy with a slow change for 1.8 s; the worker's change waits behind it.
        let slow = {
            let master = Arc::clone(&master);
            tokio::spawn(async move { master.propose(serde_json::json!({"create": "slow", "sleep_ms": 1_800})).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let started = Instant::now();
        let err = worker.propose(create("late")).await.unwrap_err();
        assert!(matches!(err, ClusterError::MetadataUnreachable { sent: false, .. }), "{err}");
        let text = err.to_string();
        assert!(text.contains("withdrawn") && text.contains("the change was not applied"), "{text}");
        assert!(started.elapsed().as_millis() < u128::from(propose_timeout_ms) + 500);
        slow.await.unwrap().unwrap();
        // The next change comes after the withdrawn one in the master's queue: once it is
        // applied, the withdrawn one has been dropped.
        let next = worker.propose(create("next")).await.unwrap();
        assert_eq!(table_names(&next), vec!["slow".to_string(), "next".to_string()]);
        assert_eq!(on_disk(tmp.path()), next);

        // A change that takes longer to apply than the proposer's timeout: the master confirmed
        // it before applying it, so the proposer waits for the outcome and learns it.
        let started = Instant::now();
        let applied = worker.propose(serde_json::json!({"create": "long", "sleep_ms": 1_500})).await.unwrap();
        assert!(started.elapsed().as_millis() >= 1_500);
        assert_eq!(table_names(&applied), vec!["slow".to_string(), "next".to_string(), "long".to_string()]);

        // The same on the master itself: its own change, queued behind the worker's slow one.
        let slow = {
            let worker = Arc::clone(&worker);
            tokio::spawn(async move { worker.propose(serde_json::json!({"create": "slow2", "sleep_ms": 1_800})).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let err = master.propose(create("late2")).await.unwrap_err();
        assert!(matches!(err, ClusterError::MetadataUnreachable { sent: false, .. }), "{err}");
        assert!(err.to_string().contains("withdrawn"), "{err}");
        slow.await.unwrap().unwrap();
        let last = master.propose(create("last")).await.unwrap();
        assert_eq!(table_names(&last), ["slow", "next", "long", "slow2", "last"].map(String::from).to_vec());
        Arc::into_inner(worker).unwrap().shutdown().await;
        Arc::into_inner(master).unwrap().shutdown().await;
    }

    #[tokio::test]
    async fn a_restarted_master_resumes_its_metadata_and_a_proposal_without_it_fails_in_time() {
        let tmp = tempfile::tempdir().unwrap();
        let port = free_port();
        let propose_timeout_ms = 1_500;
        let mut nodes = start(2, port, tmp.path(), propose_timeout_ms).await;
        let worker = nodes.pop().unwrap();
        let master = nodes.pop().unwrap();
        master.propose(create("a")).await.unwrap();
        let v2 = worker.propose(create("b")).await.unwrap();
        master.shutdown().await;

        // Wait until the worker has noticed (its membership shows the master down).
        let noticed = async {
            while worker.view().members().await[0].state != NodeState::Down {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(5), noticed).await.expect("master loss noticed");
        // Without the master, writes are refused (it may be alive and changing the catalog
        // behind a partition); reads go on with the catalog this node has.
        let refused = worker.metadata_handle().ensure_current(true).await.unwrap_err();
        assert!(
            refused.contains("no connection to the master") && refused.contains("nothing was written"),
            "{refused}"
        );
        worker.metadata_handle().ensure_current(false).await.unwrap();
        let started = Instant::now();
        let err = worker.propose(create("c")).await.unwrap_err();
        let elapsed_ms = started.elapsed().as_millis() as u64;
        assert!(matches!(err, ClusterError::MetadataUnreachable { sent: false, .. }), "{err}");
        let text = err.to_string();
        assert!(text.contains("could not reach the master") && text.contains("the change was not applied"), "{text}");
        assert!(text.contains("propose_timeout_ms (1500 ms)"), "{text}");
        assert!((propose_timeout_ms..propose_timeout_ms + 1_000).contains(&elapsed_ms), "{elapsed_ms} ms");
        assert_eq!(*worker.metadata().borrow(), v2, "the worker keeps what it had");

        // The master restarts on its data dir: it resumes version 2, and the worker catches up.
        let master =
            init_distributed_mode(meta_opts(0, 2, port, tmp.path(), propose_timeout_ms), addrs(0)).await.unwrap();
        assert_eq!(*master.metadata().borrow(), v2);
        let v3 = tokio::time::timeout(std::time::Duration::from_secs(5), async {
            loop {
                // The worker may still be reconnecting (backoff): retry until it gets through.
                match worker.propose(create("c")).await {
                    Ok(s) => break s,
                    Err(ClusterError::MetadataUnreachable { sent: false, .. }) => continue,
                    Err(e) => panic!("{e}"),
                }
            }
        })
        .await
        .expect("the worker rejoined within 5 s");
        assert_eq!((v3.version, table_names(&v3)), (3, vec!["a".into(), "b".into(), "c".into()]));
        assert_eq!(seen(&master, 3).await, v3);
        assert_eq!(on_disk(tmp.path()), v3);
        master.shutdown().await;

        // A master whose metadata.json went back to an older version (restored from an older
        // backup; here, none at all): the worker keeps its newer version (versions only move
        // forward), and the master takes it from the worker, so that the next change builds on
        // it (the same names are not handed out again).
        std::fs::remove_file(tmp.path().join("rank-0/master").join(crate::metadata::METADATA_FILE)).unwrap();
        let master =
            init_distributed_mode(meta_opts(0, 2, port, tmp.path(), propose_timeout_ms), addrs(0)).await.unwrap();
        assert_eq!(seen(&master, 3).await, v3, "taken from the worker");
        assert_eq!(on_disk(tmp.path()), v3, "and stored");
        assert_eq!(*worker.metadata().borrow(), v3);
        let v4 = master.propose(create("d")).await.unwrap();
        assert_eq!((v4.version, table_names(&v4)), (4, vec!["a".into(), "b".into(), "c".into(), "d".into()]));
        assert_eq!(seen(&worker, 4).await, v4);
        let err = master.propose(create("a")).await.unwrap_err().to_string();
        assert!(err.contains("table a already exists"), "{err}");
        master.shutdown().await;

        // But not beside shard replicas: their catalog is lost, and an empty one would hand their
        // table ids out again. The master refuses to start, naming the file.
        std::fs::remove_file(tmp.path().join("rank-0/master").join(crate::metadata::METADATA_FILE)).unwrap();
        std::fs::create_dir_all(tmp.path().join("rank-0/tables/t0-g0")).unwrap();
        let err = init_distributed_mode(meta_opts(0, 2, port, tmp.path(), propose_timeout_ms), addrs(0))
            .await
            .expect_err("a master without its catalog beside table data");
        let text = err.to_string();
        assert!(text.contains("metadata.json: missing, though this cluster has run"), "{text}");
        worker.shutdown().await;
    }

    /// A master whose data dir was lost: a node on an empty one, given `--replace-node` and the
    /// run id, takes rank 0 once every worker has rejoined, with the newest catalog they hold
    /// (rank 1 kept running; rank 2 restarted while the master was gone, with only the copy it
    /// keeps on disk). The next change builds on that catalog; a fresh worker data dir is
    /// refused meanwhile; an empty master data dir without `--replace-node` fails, naming the
    /// way; the lost master's data dir, back after all, is refused by the workers.
    #[tokio::test]
    async fn a_master_whose_data_dir_was_lost_takes_the_catalog_from_the_workers() {
        let tmp = tempfile::tempdir().unwrap();
        let port = free_port();
        let mut nodes = start(3, port, tmp.path(), 3_000).await;
        let (w2, w1, master) = (nodes.pop().unwrap(), nodes.pop().unwrap(), nodes.pop().unwrap());
        master.propose(create("a")).await.unwrap();
        let v2 = w1.propose(create("b")).await.unwrap();
        seen(&w2, 2).await;
        let copy = tmp.path().join("rank-2");
        let kept = async {
            while crate::metadata::load(&copy).unwrap().version < 2 {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(5), kept).await.expect("rank 2's copy written");
        let (old, run_id) = (master.node_id.to_string(), master.run_id.clone());
        w2.shutdown().await;
        master.shutdown().await;
        let lost = tmp.path().join("rank-0");
        let kept_aside = tmp.path().join("rank-0-lost");
        std::fs::rename(&lost, &kept_aside).unwrap();

        let replacement = |run_id: Option<&str>, replace: bool| {
            let mut o = meta_opts(0, 3, port, tmp.path(), 3_000);
            o.replace_node = replace.then(|| old.clone());
            o.run_id = run_id.map(str::to_string);
            o
        };
        let err = prepare(replacement(None, true)).unwrap_err().to_string();
        assert!(err.contains("--run-id") && err.contains("cluster.json"), "{err}");
        assert!(!lost.exists(), "refused before the data dir is made");
        // Without --replace-node, an empty master data dir would form a new cluster: rank 1,
        // which has run in this one, tells it otherwise.
        let err = init_distributed_mode(replacement(Some(&run_id), false), addrs(0)).await.unwrap_err().to_string();
        assert!(err.contains("rank 1") && err.contains("--replace-node") && err.contains(&run_id), "{err}");
        std::fs::remove_dir_all(&lost).unwrap();

        // The wrong node named: rank 1 served under another master, and says so.
        let mut wrong = replacement(Some(&run_id), true);
        wrong.replace_node = Some(w1.node_id.to_string());
        let err = init_distributed_mode(wrong, addrs(0)).await.unwrap_err().to_string();
        assert!(err.contains(&format!("last served under master {old}")), "{err}");
        // A mistyped run id: no rank rejoins it, and the data dir is left as free as it was.
        let mut typo = replacement(Some("11111111-2222-3333-4444-555555555555"), true);
        typo.timeouts.join_timeout_ms = 1_500;
        let err = init_distributed_mode(typo, addrs(0)).await.unwrap_err().to_string();
        assert!(err.contains("1, 2") && err.contains("is --run-id 11111111"), "{err}");
        assert!(!lost.join("cluster.json").exists() && !lost.join("master/membership.json").exists());
        let new_master = tokio::spawn(init_distributed_mode(replacement(Some(&run_id), true), addrs(0)));
        // A fresh data dir for a worker's rank is not taken for that rank's node.
        let mut fresh = meta_opts(2, 3, port, &tmp.path().join("fresh"), 3_000);
        fresh.timeouts.join_timeout_ms = 2_000;
        let err = init_distributed_mode(fresh, addrs(2)).await.unwrap_err().to_string();
        assert!(err.contains("does not know rank 2's node yet"), "{err}");
        // Until rank 2 is back, no change: it might hold a newer catalog.
        let refused = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            loop {
                match w1.propose(create("x")).await {
                    Err(ClusterError::MetadataNotNow { reason }) => break reason,
                    Err(ClusterError::MetadataUnreachable { sent: false, .. }) => continue, // still rejoining
                    other => panic!("{other:?}"),
                }
            }
        })
        .await
        .expect("rank 1 rejoined");
        assert!(refused.contains("2 have not yet") && refused.contains("retry"), "{refused}");
        // Nor writes through it: rank 2 might hold a newer catalog (a table truncated since).
        let paused = w1.metadata_handle().ensure_current(true).await.unwrap_err();
        assert!(paused.contains("ranks 2 have not yet") && paused.contains("nothing was written"), "{paused}");
        w1.metadata_handle().ensure_current(false).await.unwrap();
        let w2 = init_distributed_mode(meta_opts(2, 3, port, tmp.path(), 3_000), addrs(2)).await.unwrap();
        let master = new_master.await.unwrap().unwrap();
        assert_eq!((master.run_id.as_str(), master.replacing()), (run_id.as_str(), Some(old.as_str())));
        let writable = async {
            while w1.metadata_handle().ensure_current(true).await.is_err() {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(5), writable).await.expect("writes resume");
        assert_eq!(*master.metadata().borrow(), v2, "the catalog taken from the workers");
        assert_eq!(on_disk(tmp.path()), v2, "and stored");
        let members = w2.view().members().await;
        assert_eq!(members[0].node_id, master.node_id.to_string());
        let v3 = master.propose(create("c")).await.unwrap();
        assert_eq!((v3.version, table_names(&v3)), (3, vec!["a".into(), "b".into(), "c".into()]));
        assert_eq!(seen(&w2, 3).await, v3);
        let err = w1.propose(create("a")).await.unwrap_err().to_string();
        assert!(err.contains("table a already exists"), "{err}");
        master.finish_replacing().unwrap();
        master.shutdown().await;

        // The lost master's data dir, started again while the new master is down: the workers
        // do not rejoin it.
        let mut stale = meta_opts(0, 3, port, tmp.path(), 3_000);
        stale.data_dir = kept_aside;
        let first = init_distributed_mode(stale.clone(), addrs(0)).await.unwrap();
        // Each worker tries to rejoin at least once a second (`BACKOFF_MAX_MS`): one that did
        // would have handed the stale master its newer catalog (version 3).
        tokio::time::sleep(std::time::Duration::from_millis(3_000)).await;
        assert_eq!(*first.metadata().borrow(), v2, "no worker rejoined the stale master");
        let err = w1.propose(create("d")).await.unwrap_err();
        assert!(matches!(err, ClusterError::MetadataUnreachable { .. }), "{err}");
        first.shutdown().await;
        // Started again: the workers' attempts were admitted by nothing there (they leave at its
        // challenge), so it holds no newer epoch of theirs to fence them out with; they go on
        // (and rejoin the new master below).
        let again = init_distributed_mode(stale, addrs(0)).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(2_000)).await;
        again.shutdown().await;
        let master = init_distributed_mode(replacement(Some(&run_id), true), addrs(0)).await.unwrap();
        let v4 = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            loop {
                match w1.propose(create("d")).await {
                    Ok(s) => break s,
                    Err(ClusterError::MetadataUnreachable { .. }) => continue,
                    Err(e) => panic!("{e}"),
                }
            }
        })
        .await
        .expect("rank 1 rejoined the new master");
        assert_eq!(v4.version, 4);
        for n in [w1, w2, master] {
            n.shutdown().await;
        }
    }

    /// A worker's data dir and the master's lost together: the worker's replacement joins the
    /// replacement master before the rank holding the catalog has, and is welcomed with the
    /// master's empty catalog. It waits until the master has taken the catalog, so that it
    /// holds it when its start goes on (its tables decide from it which replicas await a rebuild).
    #[tokio::test]
    async fn a_replacement_worker_waits_for_a_replacement_master_to_take_the_catalog() {
        let tmp = tempfile::tempdir().unwrap();
        let port = free_port();
        let mut nodes = start(3, port, tmp.path(), 3_000).await;
        let (w2, w1, master) = (nodes.pop().unwrap(), nodes.pop().unwrap(), nodes.pop().unwrap());
        master.propose(create("a")).await.unwrap();
        let v2 = master.propose(create("b")).await.unwrap();
        assert_eq!(seen(&w1, 2).await, v2);
        let copy = tmp.path().join("rank-1");
        let kept = async {
            while crate::metadata::load(&copy).unwrap().version < 2 {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(5), kept).await.expect("rank 1's copy written");
        let (old_master, old_w2, run_id) = (master.node_id.to_string(), w2.node_id.to_string(), master.run_id.clone());
        for n in [w1, w2, master] {
            n.shutdown().await;
        }
        remove_when_quiet(&tmp.path().join("rank-0")).await;
        remove_when_quiet(&tmp.path().join("rank-2")).await;
        let mut o = meta_opts(0, 3, port, tmp.path(), 10_000);
        o.replace_node = Some(old_master);
        o.run_id = Some(run_id);
        let new_master = tokio::spawn(init_distributed_mode(o, addrs(0)));
        let mut o = meta_opts(2, 3, port, tmp.path(), 10_000);
        o.replace_node = Some(old_w2);
        let mut new_w2 = tokio::spawn(init_distributed_mode(o, addrs(2)));
        // Rank 1, which holds the catalog, is not back: the master has none to give yet.
        let early = tokio::time::timeout(std::time::Duration::from_millis(1_500), &mut new_w2).await;
        assert!(early.is_err(), "rank 2's replacement went on before the master had a catalog");
        let w1 = init_distributed_mode(meta_opts(1, 3, port, tmp.path(), 10_000), addrs(1)).await.unwrap();
        let w2 = new_w2.await.unwrap().unwrap();
        assert_eq!(*w2.metadata().borrow(), v2, "the catalog the master took, when rank 2's start goes on");
        let master = new_master.await.unwrap().unwrap();
        for n in [w1, w2, master] {
            n.shutdown().await;
        }
    }

    /// A replacement master checks the node a worker's `--replace-node` names against the
    /// membership the other workers last saw (kept in their `masters.json`): a wrong one is
    /// refused at once when a worker that knows has rejoined, and ends the replacement (recording
    /// nothing) when that worker comes back only after it was admitted. The right one is
    /// recorded as replaced.
    #[tokio::test]
    async fn a_replacement_master_checks_the_node_a_worker_replacement_names() {
        let tmp = tempfile::tempdir().unwrap();
        let port = free_port();
        let mut nodes = start(3, port, tmp.path(), 3_000).await;
        let (w2, w1, master) = (nodes.pop().unwrap(), nodes.pop().unwrap(), nodes.pop().unwrap());
        master.propose(create("a")).await.unwrap();
        seen(&w1, 1).await;
        // A membership answer is what a worker records.
        w1.view().members().await;
        let w1_dir = tmp.path().join("rank-1");
        let recorded = async {
            while crate::master_ids::last_ranks(&w1_dir).is_none_or(|r| r.len() < 3) {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(5), recorded).await.expect("rank 1 recorded the ranks");
        let (old_master, old_w2, run_id) = (master.node_id.to_string(), w2.node_id.to_string(), master.run_id.clone());
        for n in [w1, w2, master] {
            n.shutdown().await;
        }
        for r in [0, 2] {
            remove_when_quiet(&tmp.path().join(format!("rank-{r}"))).await;
        }
        let new_master = || {
            let mut o = meta_opts(0, 3, port, tmp.path(), 3_000);
            o.replace_node = Some(old_master.clone());
            o.run_id = Some(run_id.clone());
            o.timeouts.join_timeout_ms = 20_000;
            tokio::spawn(init_distributed_mode(o, addrs(0)))
        };
        let replacement = |named: &str| {
            let mut o = meta_opts(2, 3, port, tmp.path(), 3_000);
            o.replace_node = Some(named.to_string());
            o.timeouts.join_timeout_ms = 20_000;
            tokio::spawn(init_distributed_mode(o, addrs(2)))
        };
        let wrong = "00000000-1111-2222-3333-444444444444";
        let belonged = format!("rank 2 belonged to node {old_w2} (as rank 1 last saw the membership)");

        // Admitted while nobody who knows rank 2's node is back; rank 1, back, says otherwise.
        let master = new_master();
        let mut o = meta_opts(2, 3, port, tmp.path(), 3_000);
        o.replace_node = Some(wrong.to_string());
        o.timeouts.join_timeout_ms = 3_000;
        let made_up = tokio::spawn(init_distributed_mode(o, addrs(2)));
        tokio::time::sleep(std::time::Duration::from_millis(1_000)).await;
        let w1 = init_distributed_mode(meta_opts(1, 3, port, tmp.path(), 3_000), addrs(1));
        let w1 = tokio::spawn(w1);
        let err = master.await.unwrap().unwrap_err().to_string();
        assert!(err.contains(&belonged) && err.contains(&format!("--replace-node {old_w2}")), "{err}");
        assert!(!tmp.path().join("rank-0/master/membership.json").exists(), "nothing recorded");
        // It waited for the master to take the catalog, and gives up (leaving: it does not
        // rejoin the next master).
        let err = made_up.await.unwrap().unwrap_err().to_string();
        assert!(err.contains("waiting for the replacement master to take the cluster's catalog"), "{err}");
        // Nobody recorded the attempt: the next one may come on another empty data dir, and
        // rank 2's data dir may name another node.
        let masters = std::fs::read_to_string(w1_dir.join(crate::master_ids::MASTERS_FILE)).unwrap();
        assert!(masters.contains(&old_master), "{masters}");
        remove_when_quiet(&tmp.path().join("rank-0")).await;
        assert!(!tmp.path().join("rank-2/cluster.json").exists());

        // Rank 1 is back first this time (a new process: its link knows nothing of the master
        // that gave up): the made-up node is refused when it comes.
        w1.await.unwrap().unwrap().shutdown().await;
        let master = new_master();
        let w1 = init_distributed_mode(meta_opts(1, 3, port, tmp.path(), 3_000), addrs(1)).await.unwrap();
        let rejoined = async {
            loop {
                let waiting = w1.metadata_handle().ensure_current(true).await.err();
                if waiting.is_some_and(|e| e.contains("replaces one whose data dir was lost")) {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(10), rejoined).await.expect("rank 1 rejoined");
        let err = replacement(wrong).await.unwrap().unwrap_err().to_string();
        assert!(err.contains(&belonged), "{err}");
        let w2 = replacement(&old_w2).await.unwrap().unwrap();
        let master = master.await.unwrap().unwrap();
        let membership = std::fs::read_to_string(tmp.path().join("rank-0/master/membership.json")).unwrap();
        assert!(membership.contains(&old_w2) && membership.contains(&w2.node_id.to_string()), "{membership}");
        for n in [w1, w2, master] {
            n.shutdown().await;
        }
    }

    /// Removes a data dir whose node has just shut down: a file it records off its tasks (its
    /// copy of the catalog, `masters.json`) may still be being written, which makes a removal
    /// fail with "directory not empty"; tried again until it goes.
    async fn remove_when_quiet(dir: &std::path::Path) {
        for _ in 0..50 {
            if std::fs::remove_dir_all(dir).is_ok() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// No rank holds a catalog (here: none was ever made; or every worker's copy is gone): a
    /// replacement master refuses to start with an empty one, which would hand out the ids of
    /// tables whose replicas the workers may hold again.
    #[tokio::test]
    async fn a_replacement_master_without_any_catalog_refuses_to_start() {
        let tmp = tempfile::tempdir().unwrap();
        let port = free_port();
        let mut nodes = start(2, port, tmp.path(), 3_000).await;
        let (w1, master) = (nodes.pop().unwrap(), nodes.pop().unwrap());
        let (old, run_id) = (master.node_id.to_string(), master.run_id.clone());
        master.shutdown().await;
        remove_when_quiet(&tmp.path().join("rank-0")).await;
        let mut o = meta_opts(0, 2, port, tmp.path(), 3_000);
        o.replace_node = Some(old);
        o.run_id = Some(run_id);
        let err = init_distributed_mode(o, addrs(0)).await.unwrap_err().to_string();
        assert!(err.contains("no rank holds a copy of the cluster's catalog"), "{err}");
        w1.shutdown().await;
    }

    #[tokio::test]
    async fn a_change_is_answered_once_every_node_runs_with_it() {
        let tmp = tempfile::tempdir().unwrap();
        let nodes = start(3, free_port(), tmp.path(), 10_000).await;
        for i in 0..30 {
            let changed = nodes[i % 3].propose(create(&format!("t{i}"))).await.unwrap();
            for (rank, node) in nodes.iter().enumerate() {
                let has = node.metadata().borrow().version;
                assert!(
                    has >= changed.version,
                    "change {i}: rank {rank} runs with version {has} < {}",
                    changed.version
                );
            }
        }
        for n in nodes {
            n.shutdown().await;
        }
    }

    /// Runs futures concurrently on the current task (no extra dependency for `join_all`).
    async fn futures_join<F: std::future::Future + Send + 'static>(fs: Vec<F>) -> Vec<F::Output>
    where
        F::Output: Send + 'static,
    {
        let handles: Vec<_> = fs.into_iter().map(tokio::spawn).collect();
        let mut out = Vec::new();
        for h in handles {
            out.push(h.await.unwrap());
        }
        out
    }
}
