//! The master's side of the cluster: the rendezvous every rank joins, the barrier, and the
//! authoritative membership with its failure detector.
//!
//! One task accepts connections; each connection gets a reader task and a writer task fed by a
//! bounded queue, so no lock is ever held across I/O and a node that stops reading is
//! disconnected instead of stalling the master. State changes bump a `watch` counter that
//! [`Master::form`] waits on. The membership is written to the master's data dir when the
//! cluster forms and whenever an epoch changes, so a restarted master resumes the same cluster.
//!
//! The master also owns the replicated metadata ([`crate::metadata`]): one task applies
//! proposals in order, stores each new version, then sends it to every connection under the
//! same lock that admits new connections, so a node gets every version after the one it was
//! welcomed with, in order.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use crate::datadir::{create_dir_durably, read_json, remove_stale_temp_files, write_atomic};
use crate::error::{ClusterError, Result, format_ranks};
use crate::membership::{MemberInfo, NodeState};
use crate::metadata::{self, MetadataMachine, MetadataSnapshot, ProposeOutcome};
use crate::secret::{ClusterSecret, NONCE_BYTES, nonce};
use crate::settings::Timeouts;
use crate::wire::{
    Direction, FrameReader, FrameWriter, MasterMsg, NodeMsg, PROTOCOL_VERSION, encode, exchange_preamble,
};

/// Messages queued for one connection before it counts as stuck and is dropped.
const CONN_QUEUE_LEN: usize = 256;
const MEMBERSHIP_FILE: &str = "membership.json";
/// How long a shutting-down master waits for queued messages to reach the nodes.
const SHUTDOWN_DRAIN_MS: u64 = 2_000;
/// How long a connection the master dropped stays open for the node to read its last messages.
const CLOSE_LINGER_MS: u64 = 2_000;
/// Metadata proposals waiting to be applied; more are refused with "busy" (nothing changes).
const PROPOSAL_QUEUE_LEN: usize = 1_024;

/// What the master keeps on disk (`<data dir>/master/membership.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PersistedMembership {
    pub run_id: String,
    pub world_size: u32,
    pub members: Vec<MemberInfo>,
    /// Whether the cluster runs with a secret: a master restarted without one (a forgotten
    /// `--secret-file`) is refused rather than resume a secured cluster insecurely. Absent in
    /// files from before it was recorded.
    #[serde(default)]
    pub secured: Option<bool>,
    /// Node ids replaced by another node (`--replace-node`), with the id that replaced them: a
    /// replaced data dir that turns up again is told it is stale. Absent in older files.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub replaced: BTreeMap<String, String>,
}

impl PersistedMembership {
    pub fn load(dir: &std::path::Path) -> Result<Option<PersistedMembership>> {
        read_json(dir, MEMBERSHIP_FILE)
    }
}

/// Everything the master needs to run.
#[derive(Debug, Clone)]
pub struct MasterSettings {
    pub run_id: String,
    pub world_size: u32,
    pub secret: Option<ClusterSecret>,
    pub timeouts: Timeouts,
    /// Where the membership is persisted.
    pub state_dir: PathBuf,
    /// The master's own entry (rank 0).
    pub own: MemberInfo,
    /// What a metadata operation does; `None` refuses every proposal.
    pub metadata_machine: Option<Arc<dyn MetadataMachine>>,
    /// This master replaces one whose data dir was lost (`--replace-node` on rank 0), and has
    /// not yet heard every rank: it knows neither their nodes nor the cluster's catalog, which it
    /// takes from them as they rejoin ([`Master::form`] waits for all of them).
    pub adopting: bool,
    /// The lost master's node id (`--replace-node`), which the rejoining workers must have
    /// served under.
    pub replaces_master: Option<String>,
}

struct Conn {
    id: u64,
    tx: mpsc::Sender<Outgoing>,
}

/// An encoded message on its way to one node; a broadcast shares one encoding.
#[derive(Clone)]
struct Outgoing {
    payload: Arc<Vec<u8>>,
    /// The connection closes after this message (fenced, aborted).
    last: bool,
}

impl Outgoing {
    fn new(msg: &MasterMsg) -> Option<Outgoing> {
        match encode(msg) {
            Ok(payload) => Some(Outgoing {
                payload: Arc::new(payload),
                last: matches!(msg, MasterMsg::Fenced { .. } | MasterMsg::Abort { .. }),
            }),
            Err(e) => {
                warn!("{e}");
                None
            }
        }
    }
}

struct Slot {
    info: MemberInfo,
    last_seen: Option<Instant>,
    conn: Option<Conn>,
    /// The token of the process that holds the rank (`NodeMsg::Hello::incarnation`).
    incarnation: Option<String>,
    /// The newest metadata version the node runs with (`NodeMsg::MetadataApplied`; on
    /// admission, the version its first message carries).
    metadata_applied: u64,
    /// A heartbeat came on the current connection: whatever the node sent before it (its newer
    /// metadata, right after the welcome) has been read.
    heard: bool,
    /// On a replacement master: the node that held each rank when this node last saw the
    /// membership (its hello's `ranks`), and the node whose lost data dir it replaces.
    said_ranks: Option<BTreeMap<u32, String>>,
    replaces: Option<String>,
}

struct State {
    formed: bool,
    released: bool,
    slots: BTreeMap<u32, Slot>,
    entered: BTreeSet<u32>,
    next_conn_id: u64,
    /// `MasterMsg::Metadata` of the current metadata version: the first message every new
    /// connection gets after its welcome.
    metadata_frame: Outgoing,
    /// The version `metadata_frame` carries.
    metadata_version: u64,
    /// `Confirm` questions waiting for their node's answer, by (rank, connection id, req).
    confirms: HashMap<(u32, u64, u64), oneshot::Sender<bool>>,
    /// [`PersistedMembership::replaced`].
    replaced: BTreeMap<String, String>,
    /// [`MasterSettings::adopting`], until every rank has rejoined and its metadata is taken.
    adopting: bool,
    /// Why this master cannot form the cluster, said by a rejoining node (set by [`admit`];
    /// [`Master::form`] fails with it): one that has passed a formation of this run rejoined a
    /// master forming one (this data dir is not the cluster's), or a replacement master names
    /// another node than the one the workers served under.
    cannot_form: Option<String>,
    /// The run of the last node refused for belonging to another (a mistyped `--run-id`).
    refused_run: Option<String>,
    /// The ranks whose node connected from another machine than the master's
    /// (`reachable::is_afar`): a membership that spans machines admits no loopback addresses.
    afar: BTreeSet<u32>,
}

/// A metadata operation waiting to be applied, and who gets the answer.
struct Proposal {
    op: Value,
    reply: ProposalReply,
}

enum ProposalReply {
    /// `propose` on the master itself.
    Local(oneshot::Sender<Result<MetadataSnapshot>>, Arc<Claim>),
    /// A node's `Propose { req }` on connection `conn_id`.
    Remote { rank: u32, conn_id: u64, req: u64 },
    /// Not a change: rank `rank`'s newer snapshot (`NodeMsg::NewerMetadata`), the proposal's
    /// `op`, for the master to take ([`Master::adopt`]), in turn with the changes.
    Adopt { rank: u32 },
    /// Not a change: answered once everything queued before it is done.
    Sync(oneshot::Sender<()>),
}

/// Who got to a local proposal first: the metadata task, to apply it, or its proposer, to give
/// up on it (so a change its proposer reported as failed is never applied after the fact).
#[derive(Debug, Default)]
struct Claim(std::sync::atomic::AtomicU8);

impl Claim {
    const QUEUED: u8 = 0;
    const APPLYING: u8 = 1;
    const WITHDRAWN: u8 = 2;

    fn take(&self, to: u8) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        self.0.compare_exchange(Self::QUEUED, to, SeqCst, SeqCst).is_ok()
    }
}

/// The running master.
pub struct Master {
    settings: MasterSettings,
    state: Mutex<State>,
    changed: watch::Sender<u64>,
    local_addr: Option<SocketAddr>,
    /// One task per control connection.
    tasks: Mutex<JoinSet<()>>,
    /// The accept loop, the failure detector and the metadata task.
    background: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// The current metadata (the master's own view of it).
    metadata: watch::Sender<MetadataSnapshot>,
    /// Bumped when a node confirms a metadata version (`await_applied` waits on it).
    applied: watch::Sender<u64>,
    /// Proposals for the metadata task, applied in arrival order.
    proposals: mpsc::Sender<Proposal>,
    /// Held while the membership is snapshotted and written, so that concurrent writers (two
    /// ranks rejoining at once) write one after the other and the newest snapshot lands last.
    persisting: Mutex<()>,
}

impl std::fmt::Debug for Master {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Master").field("local_addr", &self.local_addr).finish_non_exhaustive()
    }
}

impl Master {
    /// Starts serving the rendezvous on `listener`. With `resumed`, the cluster is already
    /// formed (a restarted master): nodes rejoin as they reconnect.
    pub fn start(
        mut settings: MasterSettings,
        listener: Option<TcpListener>,
        resumed: Option<PersistedMembership>,
    ) -> Result<Arc<Master>> {
        let local_addr = match &listener {
            Some(l) => Some(
                l.local_addr()
                    .map_err(|source| ClusterError::RendezvousBind { addr: "rendezvous listener".into(), source })?,
            ),
            None => None,
        };
        let mut slots = BTreeMap::new();
        let formed = resumed.is_some();
        let replaced = resumed.as_ref().map(|p| p.replaced.clone()).unwrap_or_default();
        if let Some(p) = resumed {
            for mut m in p.members {
                if m.rank == 0 {
                    settings.own.epoch = m.epoch + 1;
                    continue;
                }
                m.state = NodeState::Down;
                m.last_heartbeat_unix_ms = None;
                slots.insert(
                    m.rank,
                    Slot {
                        info: m,
                        last_seen: None,
                        conn: None,
                        incarnation: None,
                        metadata_applied: 0,
                        heard: false,
                        said_ranks: None,
                        replaces: None,
                    },
                );
            }
        }
        let own = settings.own.clone();
        let own_slot = Slot {
            info: own,
            last_seen: None,
            conn: None,
            incarnation: None,
            metadata_applied: 0,
            heard: true,
            said_ranks: None,
            replaces: None,
        };
        slots.insert(0, own_slot);
        if settings.state_dir.is_dir() {
            let removed = remove_stale_temp_files(&settings.state_dir)?;
            if !removed.is_empty() {
                debug!(dir = %settings.state_dir.display(), ?removed, "removed temp files of interrupted writes");
            }
        }
        let snapshot = metadata::load(&settings.state_dir)?;
        if snapshot.version > 0 {
            info!(version = snapshot.version, "resuming the replicated metadata recorded in the data dir");
        }
        let metadata_frame = metadata::encode_frame(&snapshot)
            .map(|payload| Outgoing { payload: Arc::new(payload), last: false })
            .map_err(|reason| ClusterError::DataDir {
                path: settings.state_dir.join(metadata::METADATA_FILE),
                reason,
            })?;
        let (proposals, proposal_rx) = mpsc::channel(PROPOSAL_QUEUE_LEN);
        let adopting = settings.adopting;
        let master = Arc::new(Master {
            settings,
            state: Mutex::new(State {
                formed,
                released: formed,
                slots,
                entered: BTreeSet::new(),
                next_conn_id: 1,
                metadata_frame,
                metadata_version: snapshot.version,
                confirms: HashMap::new(),
                replaced,
                adopting,
                cannot_form: None,
                refused_run: None,
                afar: BTreeSet::new(),
            }),
            changed: watch::channel(0).0,
            local_addr,
            tasks: Mutex::new(JoinSet::new()),
            background: Mutex::new(Vec::new()),
            metadata: watch::channel(snapshot).0,
            applied: watch::channel(0).0,
            proposals,
            persisting: Mutex::new(()),
        });
        // A replacement master records nothing until it has heard every rank: an attempt that
        // fails (a mistyped --run-id) leaves its data dir as empty as it was.
        if formed && !adopting {
            master.persist()?;
        }
        let accept = Arc::clone(&master);
        let detector = Arc::clone(&master);
        let committer = Arc::clone(&master);
        {
            let mut bg = master.background.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(listener) = listener {
                bg.push(tokio::spawn(async move { accept.accept_loop(listener).await }));
            }
            bg.push(tokio::spawn(async move { detector.failure_detector().await }));
            bg.push(tokio::spawn(async move { committer.metadata_loop(proposal_rx).await }));
        }
        Ok(master)
    }

    /// The rendezvous address (None for a single-node cluster, which serves none).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock is a bug elsewhere; keep serving with the state as is.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_tasks(&self) -> MutexGuard<'_, JoinSet<()>> {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    /// Waits until every rank has joined and passed the barrier, printing progress. On timeout
    /// every waiting node is told why and the error names the missing ranks.
    pub async fn form(&self) -> Result<()> {
        if self.lock().adopting {
            return self.adopt_from_all().await;
        }
        if self.lock().released {
            return Ok(()); // resumed from disk: the cluster formed before this restart
        }
        let t = &self.settings.timeouts;
        let world = self.settings.world_size;
        let deadline = Instant::now() + t.join_timeout();
        let mut rx = self.changed.subscribe();
        // Phase 1: every rank joins.
        let joined = self.wait_for_ranks(deadline, missing_ranks, |missing| {
            info!("waiting for {} of {world} ranks: {}", missing.len(), format_ranks(missing));
            let joined = world - missing.len() as u32;
            self.broadcast(|| MasterMsg::Waiting { joined, world_size: world, missing: missing.to_vec() });
        });
        if let Err(err) = joined.await {
            self.broadcast(|| MasterMsg::Abort { reason: err.to_string() });
            return Err(err);
        }
        // Phase 2: the barrier. The membership is final; every node confirms it over its channel.
        let view = {
            let mut s = self.lock();
            s.formed = true;
            if s.slots.len() == 1 {
                s.released = true;
            }
            snapshot(&s)
        };
        self.broadcast(|| MasterMsg::Formed { view: view.clone() });
        let barrier_deadline = deadline.max(Instant::now() + t.op_timeout());
        loop {
            let pending: Vec<u32> = {
                let s = self.lock();
                s.slots.keys().copied().filter(|r| *r != 0 && !s.entered.contains(r)).collect()
            };
            if pending.is_empty() {
                break;
            }
            if Instant::now() >= barrier_deadline {
                let reason = format!("barrier timed out: ranks {} did not confirm", format_ranks(&pending));
                self.broadcast(|| MasterMsg::Abort { reason: reason.clone() });
                return Err(ClusterError::Timeout { op: reason, timeout_ms: t.join_timeout_ms });
            }
            tokio::select! {
                _ = rx.changed() => {}
                _ = tokio::time::sleep_until(barrier_deadline.into()) => {}
            }
        }
        // Recorded once every rank has passed the barrier, as the workers record their run at
        // its release: a barrier that times out (a rank killed or cut off after its hello)
        // leaves nothing behind, and the next attempt, under another launcher run id too, forms
        // the cluster afresh instead of resuming a run no worker recorded.
        self.persist()?;
        self.lock().released = true;
        self.broadcast(|| MasterMsg::Release);
        info!("all {world} ranks joined and passed the barrier");
        Ok(())
    }

    /// A replacement master ([`MasterSettings::adopting`]): waits until every rank has rejoined
    /// and been heard, so that the newest catalog any of them holds has been taken
    /// ([`Master::adopt`]), then records the membership. Until then changes are refused. On
    /// timeout the error names the ranks not heard; the rejoined nodes stay connected.
    async fn adopt_from_all(&self) -> Result<()> {
        let world = self.settings.world_size;
        let deadline = Instant::now() + self.settings.timeouts.join_timeout();
        let heard = self.wait_for_ranks(deadline, unheard_ranks, |missing| {
            info!(
                "replacing the lost master: waiting for {} of {world} ranks to rejoin (their catalog is taken from \
                 them): {}",
                missing.len(),
                format_ranks(missing)
            );
        });
        match heard.await {
            Err(ClusterError::JoinTimeout { missing, .. }) if self.lock().refused_run.is_some() => {
                let run = self.lock().refused_run.clone().unwrap_or_default();
                return Err(ClusterError::DataDir {
                    path: self.settings.state_dir.clone(),
                    reason: format!(
                        "ranks {} did not rejoin within --join-timeout-ms; a node of run {run} was refused: is \
                         --run-id {} right? (it is run_id in any worker's cluster.json)",
                        format_ranks(&missing),
                        self.settings.run_id
                    ),
                });
            }
            other => other?,
        }
        // Every rank's newer metadata was queued before its first heartbeat: once what is queued
        // now is done, the newest of them is the master's.
        let (done, synced) = oneshot::channel();
        if self.proposals.send(Proposal { op: Value::Null, reply: ProposalReply::Sync(done) }).await.is_err()
            || synced.await.is_err()
        {
            return Err(ClusterError::MetadataStore { detail: "the metadata task stopped".into() });
        }
        if self.metadata.borrow().version == 0 {
            return Err(ClusterError::DataDir {
                path: self.settings.state_dir.clone(),
                reason: "no rank holds a copy of the cluster's catalog (each keeps one in <data dir>/metadata.json): \
                         a replacement master takes it from them, and an empty one would hand out the ids of the \
                         tables whose replicas the workers hold again. Restore master/metadata.json from a backup \
                         into this data dir, or a worker's metadata.json, and start again; if the cluster never had \
                         a table, start a new cluster instead"
                    .into(),
            });
        }
        // A node that took a rank with --replace-node before any node that knew the rank's
        // holder had rejoined is checked now; a wrong one ends the replacement, recording nothing.
        if let Some(reason) = check_replacements(&mut self.lock()) {
            return Err(ClusterError::DataDir { path: self.settings.state_dir.clone(), reason });
        }
        self.lock().adopting = false;
        self.persist()?;
        self.broadcast(|| MasterMsg::Release);
        let version = self.metadata.borrow().version;
        info!(version, "replaced the lost master: every rank rejoined, catalog version {version} taken from them");
        Ok(())
    }

    /// Waits until `missing` (of the state and the world size) names no rank, calling `progress`
    /// with the ranks still missing every `progress_interval_ms`. Fails when a node said this
    /// master cannot form the cluster (`cannot_form`), or at `deadline` (`JoinTimeout`).
    async fn wait_for_ranks(
        &self,
        deadline: Instant,
        missing: fn(&State, u32) -> Vec<u32>,
        progress: impl Fn(&[u32]),
    ) -> Result<()> {
        let t = &self.settings.timeouts;
        let world = self.settings.world_size;
        let mut rx = self.changed.subscribe();
        let mut next_progress = Instant::now() + Duration::from_millis(t.progress_interval_ms);
        loop {
            let (refused, missing) = {
                let s = self.lock();
                (s.cannot_form.clone(), missing(&s, world))
            };
            if let Some(reason) = refused {
                return Err(ClusterError::DataDir { path: self.settings.state_dir.clone(), reason });
            }
            if missing.is_empty() {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(ClusterError::JoinTimeout {
                    timeout_ms: t.join_timeout_ms,
                    joined: world - missing.len() as u32,
                    world_size: world,
                    missing,
                });
            }
            if now >= next_progress {
                progress(&missing);
                next_progress = now + Duration::from_millis(t.progress_interval_ms);
            }
            tokio::select! {
                _ = rx.changed() => {}
                _ = tokio::time::sleep_until(deadline.min(next_progress).into()) => {}
            }
        }
    }

    /// Sends a message to every connected node (a stuck node is disconnected).
    fn broadcast(&self, msg: impl Fn() -> MasterMsg) {
        let Some(out) = Outgoing::new(&msg()) else { return };
        broadcast_locked(&mut self.lock(), &out);
    }

    /// The membership as of now, rank order.
    pub fn members(&self) -> Vec<MemberInfo> {
        snapshot(&self.lock())
    }

    fn persist(&self) -> Result<()> {
        // Nothing panics while this is held that would leave the file half written (the write is
        // atomic), so a poisoned lock is still good.
        let _persisting = self.persisting.lock().unwrap_or_else(|p| p.into_inner());
        let members = self.members();
        let replaced = self.lock().replaced.clone();
        let p = PersistedMembership {
            run_id: self.settings.run_id.clone(),
            world_size: self.settings.world_size,
            members,
            secured: Some(self.settings.secret.is_some()),
            replaced,
        };
        let bytes = serde_json::to_vec_pretty(&p).map_err(|e| ClusterError::DataDir {
            path: self.settings.state_dir.clone(),
            reason: format!("cannot encode membership: {e}"),
        })?;
        create_dir_durably(&self.settings.state_dir)?;
        write_atomic(&self.settings.state_dir, MEMBERSHIP_FILE, &bytes)
    }

    /// The current replicated metadata, updated as changes are applied.
    pub fn metadata(&self) -> watch::Receiver<MetadataSnapshot> {
        self.metadata.subscribe()
    }

    /// Applies a metadata operation (queued behind earlier proposals) and returns the new
    /// snapshot once it is stored and sent to every connected node.
    pub async fn propose(&self, op: Value) -> Result<MetadataSnapshot> {
        let timeout_ms = self.settings.timeouts.propose_timeout_ms;
        let deadline = tokio::time::Instant::now() + self.settings.timeouts.propose_timeout();
        let unreachable = |detail: String, sent: bool| ClusterError::MetadataUnreachable {
            master: "this node, rank 0".into(),
            detail,
            sent,
        };
        let (tx, mut rx) = oneshot::channel();
        let claim = Arc::new(Claim::default());
        let proposal = Proposal { op, reply: ProposalReply::Local(tx, Arc::clone(&claim)) };
        match tokio::time::timeout_at(deadline, self.proposals.send(proposal)).await {
            Err(_) => {
                return Err(unreachable(
                    format!(
                        "{PROPOSAL_QUEUE_LEN} earlier changes still waiting after propose_timeout_ms ({timeout_ms} ms)"
                    ),
                    false,
                ));
            }
            Ok(Err(_)) => return Err(unreachable("the master is shutting down".into(), false)),
            Ok(Ok(())) => {}
        }
        let stopped = || unreachable("the master stopped before the change was done".into(), true);
        match tokio::time::timeout_at(deadline, &mut rx).await {
            Err(_) => {}
            Ok(Err(_)) => return Err(stopped()),
            Ok(Ok(result)) => return result,
        }
        if claim.take(Claim::WITHDRAWN) {
            return Err(unreachable(
                format!(
                    "no result within propose_timeout_ms ({timeout_ms} ms): it waited behind earlier changes and \
                     was withdrawn before the master started applying it"
                ),
                false,
            ));
        }
        // Being applied: wait for the outcome.
        match tokio::time::timeout(self.settings.timeouts.propose_timeout(), rx).await {
            Err(_) => Err(unreachable(
                format!("no result within twice propose_timeout_ms ({timeout_ms} ms) after applying began"),
                true,
            )),
            Ok(Err(_)) => Err(stopped()),
            Ok(Ok(result)) => result,
        }
    }

    /// Takes a node's newer snapshot as the master's own: stored, then sent to every node, as a
    /// change is. For a master whose `metadata.json` was restored from an older backup (the
    /// node kept every version since); an older or equal one, or one that cannot be sent, is
    /// left.
    async fn adopt(&self, rank: u32, op: Value) {
        let current_version = self.metadata.borrow().version;
        let snapshot = match serde_json::from_value::<MetadataSnapshot>(op) {
            Ok(snapshot) if snapshot.version > current_version => snapshot,
            Ok(_) => return,
            Err(e) => {
                warn!("rank {rank} sent metadata that cannot be read: {e}");
                return;
            }
        };
        let frame = match metadata::encode_frame(&snapshot) {
            Ok(frame) => frame,
            Err(e) => {
                warn!("rank {rank}'s metadata version {} cannot be taken: {e}", snapshot.version);
                return;
            }
        };
        let dir = self.settings.state_dir.clone();
        let stored = snapshot.clone();
        let persisted = tokio::task::spawn_blocking(move || metadata::persist(&dir, &stored)).await;
        if let Err(e) = persisted.map_err(|e| e.to_string()).and_then(|r| r.map_err(|e| e.to_string())) {
            warn!("cannot store rank {rank}'s metadata version {}: {e}", snapshot.version);
            return;
        }
        let version = snapshot.version;
        self.publish(frame, snapshot);
        match self.lock().adopting {
            true => info!("took the cluster's catalog, metadata version {version}, from rank {rank}"),
            false => warn!(
                "took metadata version {version} from rank {rank}: master/{} held only version {current_version} \
                 (restored from an older backup?)",
                metadata::METADATA_FILE
            ),
        }
    }

    /// Makes a stored snapshot the current one: sent to every connected node (and to each node
    /// that joins later, first after its welcome), then seen here.
    fn publish(&self, frame: Vec<u8>, snapshot: MetadataSnapshot) {
        {
            let out = Outgoing { payload: Arc::new(frame), last: false };
            let mut s = self.lock();
            s.metadata_frame = out.clone();
            s.metadata_version = snapshot.version;
            broadcast_locked(&mut s, &out);
        }
        metadata::advance(&self.metadata, snapshot);
    }

    /// Applies proposals one at a time, in arrival order. A proposal's caller may give up (time
    /// out) while it runs; the change still completes, so what is stored is what is announced.
    async fn metadata_loop(self: Arc<Self>, mut proposals: mpsc::Receiver<Proposal>) {
        while let Some(Proposal { op, reply }) = proposals.recv().await {
            let reply = match reply {
                ProposalReply::Adopt { rank } => {
                    self.adopt(rank, op).await;
                    continue;
                }
                ProposalReply::Sync(done) => {
                    let _ = done.send(());
                    continue;
                }
                other => other,
            };
            let wanted = match &reply {
                ProposalReply::Remote { rank, conn_id, req } => self.still_wanted(*rank, *conn_id, *req).await,
                ProposalReply::Local(_, claim) => claim.take(Claim::APPLYING),
                ProposalReply::Adopt { .. } | ProposalReply::Sync(_) => true,
            };
            if !wanted {
                continue;
            }
            let result = self.commit(op, &reply).await;
            match reply {
                ProposalReply::Local(tx, _) => {
                    let _ = tx.send(result);
                }
                ProposalReply::Adopt { .. } | ProposalReply::Sync(_) => {}
                ProposalReply::Remote { rank, conn_id, req } => {
                    if let Err(e) = &result {
                        let outcome = ProposeOutcome::from_error(e);
                        let mut s = self.lock();
                        if let Some(slot) = current_slot(&mut s, rank, conn_id) {
                            send(slot, MasterMsg::Proposed { req, outcome });
                        }
                    }
                }
            }
        }
    }

    /// Whether rank `rank` still waits for its proposal `req` (sent on connection `conn_id`):
    /// asked right before it is applied, so that a change whose proposer gave up (it timed out
    /// while this master was paused, or while the proposal queued behind others) is not applied
    /// after its proposer said it failed. A proposer that does not answer within `op_timeout_ms`
    /// is told its change was refused; one whose connection is gone, or that no longer waits,
    /// learns nothing more (it already reported the outcome).
    async fn still_wanted(&self, rank: u32, conn_id: u64, req: u64) -> bool {
        let (answer_tx, answer) = oneshot::channel();
        {
            let mut s = self.lock();
            let Some(slot) = current_slot(&mut s, rank, conn_id) else {
                info!(rank, req, "dropped rank {rank}'s metadata change: its connection closed before it was applied");
                return false;
            };
            send(slot, MasterMsg::Confirm { req });
            s.confirms.insert((rank, conn_id, req), answer_tx);
        }
        let timeout = self.settings.timeouts.op_timeout();
        let answer = tokio::time::timeout(timeout, answer).await;
        self.lock().confirms.remove(&(rank, conn_id, req));
        match answer {
            Ok(Ok(true)) => true,
            Ok(Ok(false)) => {
                info!(rank, req, "dropped rank {rank}'s metadata change: its proposer had given up waiting");
                false
            }
            Ok(Err(_)) => {
                info!(rank, req, "dropped rank {rank}'s metadata change: its connection closed before it was applied");
                false
            }
            Err(_) => {
                let reason = format!(
                    "rank {rank} did not confirm the change within op_timeout_ms ({} ms) before it was \
                     applied; nothing changed, retry",
                    timeout.as_millis()
                );
                info!(rank, req, "dropped rank {rank}'s metadata change: {reason}");
                if let Some(slot) = current_slot(&mut self.lock(), rank, conn_id) {
                    send(slot, MasterMsg::Proposed { req, outcome: ProposeOutcome::Rejected { reason } });
                }
                false
            }
        }
    }

    /// Applies `op`, stores the new version, sends it to every node and (for a node's proposal)
    /// answers the proposer right behind it.
    async fn commit(&self, op: Value, reply: &ProposalReply) -> Result<MetadataSnapshot> {
        let current = self.metadata.borrow().clone();
        // A node runs with a newer version than this master's: a change made now would build on
        // a catalog that misses what that node has (ids handed out again). The node's snapshot
        // is on its way (`adopt`); until it is taken, changes are refused.
        let newer = {
            let s = self.lock();
            if s.adopting {
                let missing = unheard_ranks(&s, self.settings.world_size);
                return Err(ClusterError::MetadataNotNow {
                    reason: format!(
                        "this master replaces one whose data dir was lost and takes the cluster's catalog from \
                         the other ranks as they rejoin; ranks {} have not yet: retry once they have",
                        format_ranks(&missing)
                    ),
                });
            }
            s.slots
                .iter()
                .map(|(rank, slot)| (slot.metadata_applied, *rank))
                .filter(|(v, _)| *v > current.version)
                .max()
        };
        if let Some((version, rank)) = newer {
            return Err(ClusterError::MetadataNotNow {
                reason: format!(
                    "rank {rank} runs with metadata version {version}, newer than the master's {} (was the \
                     master's master/{} restored from an older backup?); the master takes rank {rank}'s \
                     version first: retry in a moment",
                    current.version,
                    metadata::METADATA_FILE
                ),
            });
        }
        let machine = self.settings.metadata_machine.clone();
        let dir = self.settings.state_dir.clone();
        // The machine is the caller's code and the write fsyncs: both stay off the runtime.
        let staged = tokio::task::spawn_blocking(move || {
            let staged = metadata::stage(machine.as_deref(), &current, &op)?;
            metadata::persist(&dir, &staged.snapshot)
                .map_err(|e| ClusterError::MetadataStore { detail: e.to_string() })?;
            Ok::<_, ClusterError>(staged)
        })
        .await
        .map_err(|e| ClusterError::MetadataStore { detail: format!("the metadata task failed: {e}") })??;
        let version = staged.snapshot.version;
        self.publish(staged.frame, staged.snapshot.clone());
        self.await_applied(version).await;
        if let ProposalReply::Remote { rank, conn_id, req } = *reply {
            let mut s = self.lock();
            if let Some(slot) = current_slot(&mut s, rank, conn_id) {
                send(slot, MasterMsg::Proposed { req, outcome: ProposeOutcome::Applied { version } });
            }
        }
        info!(version, "metadata version {version} applied");
        Ok(staged.snapshot)
    }

    /// Waits until every connected node runs with metadata `version`, at most
    /// `metadata_applied_timeout_ms`: so that a statement sent to any node after a DDL statement
    /// returned sees it (an INSERT after a TRUNCATE went into the old generation, acknowledged,
    /// then thrown away with it). A node that does not confirm in time (hung, not yet known to be
    /// down) is named in the log; it gets the version when it answers again.
    async fn await_applied(&self, version: u64) {
        let timeout_ms = self.settings.timeouts.metadata_applied_timeout_ms;
        let deadline = tokio::time::Instant::now() + Duration::from_millis(timeout_ms);
        let mut changed = self.applied.subscribe();
        loop {
            let pending: Vec<u32> = {
                let s = self.lock();
                s.slots
                    .iter()
                    // A node known to be down (heartbeats missed, though its connection is
                    // still open: a hung process) is not waited for.
                    .filter(|(rank, slot)| {
                        **rank != 0
                            && slot.conn.is_some()
                            && slot.info.state != NodeState::Down
                            && slot.metadata_applied < version
                    })
                    .map(|(rank, _)| *rank)
                    .collect()
            };
            if pending.is_empty() {
                return;
            }
            if tokio::time::timeout_at(deadline, changed.changed()).await.is_err() {
                warn!(
                    version,
                    ?pending,
                    "metadata version {version}: ranks {pending:?} did not confirm it within \
                     metadata_applied_timeout_ms ({timeout_ms} ms); answering the change without them"
                );
                return;
            }
        }
    }

    /// Tells every node the master is going away (they will reconnect when it returns) and
    /// stops the master's tasks.
    pub async fn shutdown(&self) {
        let background = std::mem::take(&mut *self.background.lock().unwrap_or_else(|p| p.into_inner()));
        for h in background {
            h.abort();
            // Until the task is dropped its listener holds the rendezvous port.
            let _ = h.await;
        }
        {
            let mut s = self.lock();
            for slot in s.slots.values_mut() {
                slot.conn = None; // each writer drains its queue, then closes its connection
            }
        }
        let mut tasks = std::mem::take(&mut *self.lock_tasks());
        let drain = async { while tasks.join_next().await.is_some() {} };
        let _ = tokio::time::timeout(Duration::from_millis(SHUTDOWN_DRAIN_MS), drain).await;
        tasks.shutdown().await;
    }

    async fn accept_loop(self: Arc<Self>, listener: TcpListener) {
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    let master = Arc::clone(&self);
                    self.lock_tasks().spawn(async move {
                        if let Err(e) = master.serve_conn(stream, peer).await {
                            match e {
                                ClusterError::Connection { .. } => debug!(%peer, "control connection closed: {e}"),
                                _ => warn!(%peer, "control connection: {e}"),
                            }
                        }
                    });
                }
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    warn!("rendezvous accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    async fn serve_conn(self: Arc<Self>, stream: TcpStream, peer: SocketAddr) -> Result<()> {
        let peer_s = peer.to_string();
        let local = stream.local_addr().ok();
        let _ = stream.set_nodelay(true);
        let op_timeout = self.settings.timeouts.op_timeout();
        let (mut r, mut w) = stream.into_split();
        exchange_preamble(&mut r, &mut w, &peer_s, op_timeout).await?;
        let mut reader = FrameReader::new(r, peer_s.clone(), Direction::ToMaster);
        let mut writer = FrameWriter::new(w, peer_s.clone(), Direction::ToNode);
        let master_nonce = nonce();
        writer
            .write(&MasterMsg::Challenge {
                nonce: hex::encode(master_nonce),
                run_id: self.settings.run_id.clone(),
                world_size: self.settings.world_size,
                secured: self.settings.secret.is_some(),
                node_id: Some(self.settings.own.node_id.clone()),
            })
            .await?;
        let hello = timeout(op_timeout, "waiting for the node's hello", reader.read::<NodeMsg>()).await??;
        let NodeMsg::Hello {
            protocol,
            rank,
            world_size,
            node_id,
            run_id,
            addrs,
            nonce: node_nonce,
            proof,
            epoch: held,
            incarnation,
            replaces,
            master,
            ranks,
        } = hello
        else {
            return Err(ClusterError::WrongProtocol { peer: peer_s, detail: "first message was not a hello".into() });
        };
        let node_nonce = decode_nonce(&node_nonce, &peer_s)?;
        let ranks: Option<BTreeMap<u32, String>> = ranks.map(|pairs| pairs.into_iter().collect());
        let check = HelloCheck {
            protocol,
            rank,
            world_size,
            node_id: &node_id,
            run_id: run_id.as_deref(),
            addrs: &addrs,
            proof: proof.as_deref(),
            held_epoch: held,
            incarnation: incarnation.as_deref(),
            replaces: replaces.as_deref(),
            master: master.as_deref(),
            ranks: ranks.as_ref(),
        };
        let afar = crate::reachable::is_afar(peer, local);
        let unreachable = || {
            if let Some(why) = crate::reachable::loopback_from_afar(peer, local, &addrs) {
                return Err(why);
            }
            let s = self.lock();
            let mut members: Vec<(u32, &BTreeMap<String, String>)> =
                s.slots.iter().map(|(r, slot)| (*r, &slot.info.addrs)).collect();
            if !s.slots.contains_key(&0) {
                members.push((0, &self.settings.own.addrs));
            }
            let members_afar: Vec<u32> = s.afar.iter().copied().collect();
            crate::reachable::mixed_membership(rank, afar, &addrs, &members, &members_afar).map_or(Ok(()), Err)
        };
        if let Err(reason) = self.check_proof(&check, &master_nonce, &node_nonce).and_then(|()| unreachable()) {
            warn!(%peer, rank, "refused a node: {reason}");
            writer.write(&MasterMsg::Refused { reason }).await?;
            writer.shutdown().await;
            return Ok(());
        }
        let (tx, rx) = mpsc::channel(CONN_QUEUE_LEN);
        let admitted = {
            let mut s = self.lock();
            let verdict = match stale_incarnation(&s, &check) {
                Some(reason) => {
                    let proof = self.settings.secret.as_ref().map(|secret| {
                        hex::encode(secret.tag("fenced", &[&master_nonce, &node_nonce, reason.as_bytes()]))
                    });
                    Err(MasterMsg::Fenced { reason, proof })
                }
                None => admit(&mut s, &self.settings, &check).map_err(|reason| MasterMsg::Refused { reason }),
            };
            match verdict {
                Err(refusal) => Err(refusal),
                Ok(epoch) => {
                    let conn_id = s.next_conn_id;
                    s.next_conn_id += 1;
                    match afar {
                        true => s.afar.insert(rank),
                        false => s.afar.remove(&rank),
                    };
                    // First in the fresh queue, so first after the welcome; every later version
                    // is queued behind it by `commit`, under this same lock.
                    let _ = tx.try_send(s.metadata_frame.clone());
                    // A replacement master still taking the catalog: the node's writes wait
                    // (`Release` when every rank is heard).
                    if s.adopting {
                        let world_size = self.settings.world_size;
                        let missing: Vec<u32> =
                            unheard_ranks(&s, world_size).into_iter().filter(|r| *r != rank).collect();
                        let joined = world_size - missing.len() as u32;
                        if let Some(out) = Outgoing::new(&MasterMsg::Waiting { joined, world_size, missing }) {
                            let _ = tx.try_send(out);
                        }
                    }
                    let now = Instant::now();
                    let info = MemberInfo {
                        rank,
                        node_id: node_id.clone(),
                        role: crate::membership::Role::for_rank(rank),
                        addrs: addrs.clone(),
                        state: NodeState::Up,
                        epoch,
                        last_heartbeat_unix_ms: None,
                    };
                    let metadata_applied = s.metadata_version;
                    let old = s.slots.insert(
                        rank,
                        Slot {
                            info,
                            last_seen: Some(now),
                            conn: Some(Conn { id: conn_id, tx }),
                            incarnation: incarnation.clone(),
                            metadata_applied,
                            heard: false,
                            said_ranks: ranks.clone(),
                            replaces: replaces.clone(),
                        },
                    );
                    let replaced = old.as_ref().filter(|o| o.info.node_id != node_id).map(|o| o.info.node_id.clone());
                    if let Some(old_id) = &replaced {
                        s.replaced.insert(old_id.clone(), node_id.clone());
                    }
                    if let Some(Slot { conn: Some(old), .. }) = old
                        && let Some(out) = Outgoing::new(&MasterMsg::Fenced {
                            reason: format!("rank {rank} rejoined with epoch {epoch}"),
                            proof: None,
                        })
                    {
                        let _ = old.tx.try_send(out);
                    }
                    if s.formed && !s.released {
                        s.entered.insert(rank);
                    }
                    // Before formation the view is sent with `Formed`, once for everyone.
                    let view = if s.formed { snapshot(&s) } else { Vec::new() };
                    Ok((conn_id, epoch, s.formed, view, replaced))
                }
            }
        };
        let (conn_id, epoch, formed, view, replaced) = match admitted {
            Err(refusal) => {
                if let MasterMsg::Refused { reason } | MasterMsg::Fenced { reason, .. } = &refusal {
                    warn!(%peer, rank, "refused a node: {reason}");
                }
                self.bump(); // a refusal may end the formation (`cannot_form`)
                writer.write(&refusal).await?;
                writer.shutdown().await;
                return Ok(());
            }
            Ok(a) => a,
        };
        if let Some(old) = &replaced {
            warn!(rank, %node_id, replaced = %old, "rank {rank} is taken by a new node in place of one whose data dir was lost");
            // Recorded before the welcome: once the node has it, it takes no other answer, and
            // a master restarted with the old node's id would refuse it.
            self.persist()?;
        }
        let welcome_proof = self.settings.secret.as_ref().map(|s| {
            hex::encode(
                s.tag("welcome", &[&master_nonce, &node_nonce, self.settings.run_id.as_bytes(), &epoch.to_be_bytes()]),
            )
        });
        writer
            .write(&MasterMsg::Welcome {
                run_id: self.settings.run_id.clone(),
                epoch,
                proof: welcome_proof,
                heartbeat_interval_ms: self.settings.timeouts.heartbeat_interval_ms,
                down_after_ms: Some(self.settings.timeouts.down_after_ms),
                formed,
                view,
            })
            .await?;
        reader.set_trusted();
        if let Some(secret) = &self.settings.secret {
            let key = secret.session_key(&master_nonce, &node_nonce);
            reader.set_key(key);
            writer.set_key(key);
        }
        info!(rank, %node_id, epoch, %peer, "rank {rank} joined");
        // Not while the barrier is under way: the membership is recorded once it has passed.
        if formed && {
            let s = self.lock();
            s.released && !s.adopting
        } {
            self.persist()?;
        }
        self.bump();
        let mut writer_task = tokio::spawn(write_loop(writer, rx));
        let (result, writer_ended) = tokio::select! {
            r = self.read_loop(&mut reader, rank, conn_id) => (r, false),
            // The writer ends when this connection was dropped (fenced, stuck, shutdown).
            _ = &mut writer_task => (Ok(()), true),
        };
        let dropped = current_slot(&mut self.lock(), rank, conn_id).is_none();
        if dropped {
            // The master let this connection go (fenced, stuck, shutting down): let the node
            // read its last messages before the socket closes. Closing with unread incoming
            // frames (a heartbeat) sends a reset, and the node's kernel then discards what it
            // has not read yet, the `Fenced` included: the old incarnation would reconnect and
            // fence the new one.
            let _ = tokio::time::timeout(Duration::from_millis(CLOSE_LINGER_MS), async {
                // A finished task's handle must not be polled again (tokio panics).
                if !writer_ended {
                    let _ = (&mut writer_task).await;
                }
                while reader.read::<NodeMsg>().await.is_ok() {}
            })
            .await;
        }
        writer_task.abort();
        self.disconnected(rank, conn_id);
        result
    }

    fn check_proof(
        &self,
        h: &HelloCheck<'_>,
        master_nonce: &[u8],
        node_nonce: &[u8],
    ) -> std::result::Result<(), String> {
        if h.protocol != PROTOCOL_VERSION {
            return Err(format!("protocol version {} is not the master's {PROTOCOL_VERSION}", h.protocol));
        }
        match (&self.settings.secret, h.proof) {
            (None, None) => Ok(()),
            (Some(_), None) => Err("this node has no cluster secret, and the master requires one".into()),
            (None, Some(_)) => Err("the master runs without a cluster secret (--insecure), but this node has one; \
                 give every node the same secret"
                .into()),
            (Some(secret), Some(proof)) => {
                let proof = hex::decode(proof).unwrap_or_default();
                let parts = HelloProof {
                    master_nonce,
                    node_nonce,
                    rank: h.rank,
                    world_size: h.world_size,
                    node_id: h.node_id,
                    run_id: h.run_id,
                    addrs: h.addrs,
                    held_epoch: h.held_epoch,
                    incarnation: h.incarnation,
                    replaces: h.replaces,
                    master: h.master,
                    ranks: h.ranks,
                }
                .parts();
                let parts: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
                if secret.verify("hello", &parts, &proof) { Ok(()) } else { Err("wrong cluster secret".into()) }
            }
        }
    }

    async fn read_loop(&self, reader: &mut FrameReader, rank: u32, conn_id: u64) -> Result<()> {
        loop {
            let msg = reader.read::<NodeMsg>().await?;
            let mut s = self.lock();
            let Some(slot) = current_slot(&mut s, rank, conn_id) else {
                return Ok(()); // fenced: a newer incarnation owns the rank
            };
            match msg {
                NodeMsg::Heartbeat { seq } => {
                    slot.last_seen = Some(Instant::now());
                    let first = !std::mem::replace(&mut slot.heard, true);
                    if slot.info.state != NodeState::Up {
                        info!(rank, "rank {rank} is up");
                        slot.info.state = NodeState::Up;
                    }
                    send(slot, MasterMsg::HeartbeatAck { seq });
                    if first {
                        drop(s);
                        self.bump(); // a replacement master waits for every rank's first one
                    }
                }
                NodeMsg::MembersQuery { req } => {
                    let view = snapshot(&s);
                    if let Some(slot) = s.slots.get_mut(&rank) {
                        send(slot, MasterMsg::Members { req, view });
                    }
                }
                NodeMsg::NewerMetadata { snapshot } => {
                    let newer = snapshot.version > s.metadata_version;
                    drop(s);
                    if newer {
                        let op = serde_json::to_value(&snapshot).unwrap_or(Value::Null);
                        let adopt = Proposal { op, reply: ProposalReply::Adopt { rank } };
                        if self.proposals.try_send(adopt).is_err() {
                            warn!("cannot queue rank {rank}'s newer metadata; it sends it again when it rejoins");
                        }
                    }
                }
                NodeMsg::MetadataApplied { version } => {
                    slot.metadata_applied = slot.metadata_applied.max(version);
                    drop(s);
                    self.applied.send_modify(|n| *n += 1);
                }
                NodeMsg::BarrierEnter => {
                    s.entered.insert(rank);
                    drop(s);
                    self.bump();
                }
                NodeMsg::Confirmed { req, waiting } => {
                    if let Some(answer) = s.confirms.remove(&(rank, conn_id, req)) {
                        let _ = answer.send(waiting);
                    }
                }
                NodeMsg::Propose { req, op } => {
                    let proposal = Proposal { op, reply: ProposalReply::Remote { rank, conn_id, req } };
                    if let Err(e) = self.proposals.try_send(proposal) {
                        let outcome = match e {
                            mpsc::error::TrySendError::Full(_) => ProposeOutcome::Rejected {
                                reason: format!(
                                    "the master is busy: {PROPOSAL_QUEUE_LEN} metadata changes are already \
                                     waiting; try again"
                                ),
                            },
                            mpsc::error::TrySendError::Closed(_) => {
                                ProposeOutcome::Rejected { reason: "the master is shutting down".into() }
                            }
                        };
                        send(slot, MasterMsg::Proposed { req, outcome });
                    }
                }
                NodeMsg::Leave => {
                    info!(rank, "rank {rank} left (graceful shutdown)");
                    slot.info.state = NodeState::Down;
                    slot.conn = None;
                    return Ok(());
                }
                NodeMsg::Hello { .. } => {
                    return Err(ClusterError::WrongProtocol {
                        peer: reader.peer().to_string(),
                        detail: "a second hello on one connection".into(),
                    });
                }
            }
        }
    }

    fn disconnected(&self, rank: u32, conn_id: u64) {
        let mut s = self.lock();
        // Questions to the node on this connection will not be answered: their proposals drop.
        s.confirms.retain(|&(r, c, _), _| (r, c) != (rank, conn_id));
        let formed = s.formed;
        let ours = s.slots.get(&rank).is_some_and(|sl| sl.conn.as_ref().is_some_and(|c| c.id == conn_id));
        if !ours {
            return;
        }
        if formed {
            if let Some(slot) = s.slots.get_mut(&rank) {
                slot.conn = None; // liveness now decays through the failure detector
            }
        } else {
            s.slots.remove(&rank); // before formation a rank is freed when its node goes away
            s.entered.remove(&rank);
            info!(rank, "rank {rank} disconnected before the cluster formed");
        }
        drop(s);
        self.bump();
    }

    async fn failure_detector(self: Arc<Self>) {
        let t = self.settings.timeouts.clone();
        let period = Duration::from_millis((t.heartbeat_interval_ms / 2).max(10));
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_tick = Instant::now();
        loop {
            tick.tick().await;
            let now = Instant::now();
            // Time the master itself could not observe (it was stopped with SIGSTOP, its VM was
            // paused, or it got no CPU): the nodes' heartbeats of that time are still in its
            // sockets, so that silence is the master's, and it is not counted against them.
            let stalled = stalled_for(now.duration_since(last_tick), period, t.heartbeat_interval_ms);
            last_tick = now;
            let mut s = self.lock();
            if !s.formed {
                continue;
            }
            for slot in s.slots.values_mut().filter(|sl| sl.info.rank != 0) {
                if !stalled.is_zero() {
                    slot.last_seen = slot.last_seen.map(|seen| (seen + stalled).min(now));
                }
                let Some(seen) = slot.last_seen else { continue };
                let silent_ms = now.duration_since(seen).as_millis() as u64;
                let next = if silent_ms >= t.down_after_ms {
                    NodeState::Down
                } else if silent_ms >= t.suspect_after_ms {
                    NodeState::Suspect
                } else {
                    NodeState::Up
                };
                if next != slot.info.state && slot.info.state != NodeState::Down {
                    warn!(
                        rank = slot.info.rank,
                        "rank {} is {} (no heartbeat for {silent_ms} ms)",
                        slot.info.rank,
                        next.as_str()
                    );
                    slot.info.state = next;
                }
            }
        }
    }
}

/// How much of the `elapsed` time between two of the failure detector's ticks, `period` apart,
/// the master was not running: the part beyond one heartbeat interval of lateness (a tick a few
/// hundred milliseconds late is ordinary scheduling, and is counted as silence as usual).
fn stalled_for(elapsed: Duration, period: Duration, heartbeat_interval_ms: u64) -> Duration {
    elapsed.saturating_sub(period + Duration::from_millis(heartbeat_interval_ms))
}

/// Decodes a peer's nonce: hex of exactly [`NONCE_BYTES`] bytes (a short or empty nonce would
/// weaken replay protection, so it is a protocol error, not a failed proof).
pub(crate) fn decode_nonce(hex_nonce: &str, peer: &str) -> Result<Vec<u8>> {
    match hex::decode(hex_nonce) {
        Ok(n) if n.len() == NONCE_BYTES => Ok(n),
        _ => Err(ClusterError::WrongProtocol {
            peer: peer.to_string(),
            detail: format!("nonce {hex_nonce:?} is not {NONCE_BYTES} hex-encoded bytes"),
        }),
    }
}

/// The fields of a hello that its proof covers: all of them but the proof, so that someone who can
/// change frames in flight cannot change a rejoin's epoch or token, its run id or the addresses
/// the cluster will use for the node.
pub(crate) struct HelloProof<'a> {
    pub master_nonce: &'a [u8],
    pub node_nonce: &'a [u8],
    pub rank: u32,
    pub world_size: u32,
    pub node_id: &'a str,
    pub run_id: Option<&'a str>,
    pub addrs: &'a BTreeMap<String, String>,
    pub held_epoch: Option<u64>,
    pub incarnation: Option<&'a str>,
    pub replaces: Option<&'a str>,
    pub master: Option<&'a str>,
    pub ranks: Option<&'a BTreeMap<u32, String>>,
}

impl HelloProof<'_> {
    /// The covered fields as the MAC's parts (the MAC prefixes each with its length, and an
    /// absent optional field is an empty part, a present one a `1` byte and its value).
    pub(crate) fn parts(&self) -> Vec<Vec<u8>> {
        let optional = |v: Option<&[u8]>| v.map(|v| [&[1u8][..], v].concat()).unwrap_or_default();
        let addrs: Vec<u8> = self
            .addrs
            .iter()
            .flat_map(|(k, v)| {
                [&(k.len() as u64).to_be_bytes()[..], k.as_bytes(), &(v.len() as u64).to_be_bytes()[..], v.as_bytes()]
                    .concat()
            })
            .collect();
        let mut parts = vec![
            self.master_nonce.to_vec(),
            self.node_nonce.to_vec(),
            self.rank.to_be_bytes().to_vec(),
            self.world_size.to_be_bytes().to_vec(),
            self.node_id.as_bytes().to_vec(),
            optional(self.run_id.map(str::as_bytes)),
            addrs,
            optional(self.held_epoch.map(u64::to_be_bytes).as_ref().map(|e| &e[..])),
            optional(self.incarnation.map(str::as_bytes)),
            optional(self.replaces.map(str::as_bytes)),
        ];
        // Only when said, so that a hello without them is proved as before; with the ranks, the
        // master is an optional part before them (a different number of parts: no ambiguity).
        match (self.master, self.ranks) {
            (None, None) => {}
            (Some(master), None) => parts.push(master.as_bytes().to_vec()),
            (master, Some(ranks)) => {
                parts.push(optional(master.map(str::as_bytes)));
                let ranks: Vec<u8> = ranks
                    .iter()
                    .flat_map(|(rank, node)| {
                        [&rank.to_be_bytes()[..], &(node.len() as u64).to_be_bytes()[..], node.as_bytes()].concat()
                    })
                    .collect();
                parts.push(ranks);
            }
        }
        parts
    }
}

struct HelloCheck<'a> {
    protocol: u16,
    rank: u32,
    world_size: u32,
    node_id: &'a str,
    run_id: Option<&'a str>,
    addrs: &'a BTreeMap<String, String>,
    proof: Option<&'a str>,
    /// The epoch the node held before it lost the master (a rejoin), if any.
    held_epoch: Option<u64>,
    /// The process's token (`NodeMsg::Hello::incarnation`).
    incarnation: Option<&'a str>,
    /// The node whose lost data dir this one replaces (`NodeMsg::Hello::replaces`).
    replaces: Option<&'a str>,
    /// The master the node last served under (`NodeMsg::Hello::master`).
    master: Option<&'a str>,
    /// The membership the node last saw (`NodeMsg::Hello::ranks`).
    ranks: Option<&'a BTreeMap<u32, String>>,
}

/// Why a rejoining process may not have its rank back: it held an older epoch, so a newer
/// incarnation (started with the same data dir while this one was stopped or cut off) has taken
/// the rank since. It is fenced out, even when it reconnects before reading the `Fenced` the
/// master sent it.
fn stale_incarnation(s: &State, h: &HelloCheck<'_>) -> Option<String> {
    let slot = s.slots.get(&h.rank).filter(|slot| slot.info.node_id == h.node_id)?;
    let held = h.held_epoch.filter(|held| *held < slot.info.epoch)?;
    // The same process retrying: its last attempt was admitted, then cut off before it learned
    // its new epoch.
    if h.incarnation.is_some() && slot.incarnation.as_deref() == h.incarnation {
        return None;
    }
    Some(format!(
        "this process held rank {} at epoch {held}, and a newer incarnation of it has joined since (epoch {})",
        h.rank, slot.info.epoch
    ))
}

/// Decides whether a node may take its rank; returns its new epoch or the reason for refusal.
fn admit(s: &mut State, settings: &MasterSettings, h: &HelloCheck<'_>) -> std::result::Result<u64, String> {
    let world = settings.world_size;
    if h.world_size != world {
        return Err(format!(
            "world size mismatch: this node was started with world size {}, the master's cluster has world size {world}",
            h.world_size
        ));
    }
    if h.rank >= world {
        return Err(format!("rank {} is out of range for world size {world}", h.rank));
    }
    if h.rank == 0 {
        return Err("rank 0 is the master's rank, and the master is already running".into());
    }
    // Only a node that has passed a formation rejoins with an epoch: the cluster formed, with a
    // master whose data dir is not this one (lost, or another).
    if !s.formed
        && let Some(held) = h.held_epoch
    {
        let run = h.run_id.unwrap_or("?");
        let reason = format!(
            "no cluster has formed with this data dir, but rank {} (node {}, epoch {held}) is already running in \
             run {run}, whose master it lost: start the master on its own data dir; if that is lost, start \
             this one on an empty data dir with --replace-node <the lost master's node id, in system.nodes> \
             --run-id {run}",
            h.rank, h.node_id
        );
        s.cannot_form.get_or_insert(reason.clone());
        return Err(reason);
    }
    // A replacement takes the rank of a node of a cluster that has formed: one that is forming
    // for the first time has no node to replace (and, since a replacement names its cluster by
    // that node rather than by its launcher's run id, it could be another job's node).
    if let Some(named) = h.replaces
        && !s.formed
        && !s.adopting
    {
        return Err(format!(
            "--replace-node {named}: this cluster is forming for the first time and has no node to replace; start \
             rank {} without --replace-node (a node of another job is refused as well)",
            h.rank
        ));
    }
    // A node this membership already lists for its rank (its data dir's node_id) belongs to
    // this cluster, whatever run id it says: a worker records its run only once the cluster
    // has formed, so one whose barrier never passed comes back under its launcher's run id (a
    // resubmitted Slurm job's).
    let listed = s.slots.get(&h.rank).is_some_and(|slot| slot.info.node_id == h.node_id);
    if let Some(run_id) = h.run_id
        && run_id != settings.run_id
        && !listed
    {
        s.refused_run = Some(run_id.to_string());
        return Err(format!("run id mismatch: this node belongs to run {run_id}, the master runs {}", settings.run_id));
    }
    // A replacement master named the wrong node: the workers served under another.
    if s.adopting
        && let (Some(served), Some(named)) = (h.master, settings.replaces_master.as_deref())
        && served != named
        // This master itself, in an earlier attempt at the same replacement that did not finish
        // (a wrong worker replacement ended it): the worker recorded it as its master.
        && served != settings.own.node_id
    {
        let reason = format!(
            "--replace-node names node {named}, but rank {} (node {}) last served under master {served}: name the \
             lost master (--replace-node {served})",
            h.rank, h.node_id
        );
        s.cannot_form.get_or_insert(reason.clone());
        return Err(reason);
    }
    match s.slots.get(&h.rank) {
        // A replacement master learns the ranks' nodes as they rejoin: a node whose data dir
        // has joined this run says so (its run id), a fresh one does not.
        None if s.adopting
            && let Some(named) = h.replaces
            && let Some((by, held)) = said_holder(s, h.rank)
            && held != named =>
        {
            Err(wrong_replacement(h.rank, named, by, &held))
        }
        None if s.adopting && h.run_id.is_none() && h.replaces.is_none() => Err(format!(
            "this master replaces one whose data dir was lost, and does not know rank {}'s node yet: only a \
             node whose data dir has joined run {} rejoins it (if this rank's data dir was lost too, start this \
             node with --replace-node <its old node id>)",
            h.rank, settings.run_id
        )),
        None => Ok(h.held_epoch.unwrap_or(0).saturating_add(1)),
        Some(slot) if slot.info.node_id == h.node_id => {
            Ok(slot.info.epoch.max(h.held_epoch.unwrap_or(0)).saturating_add(1))
        }
        // A data dir whose node was replaced, turning up again: what it holds is stale.
        _ if s.replaced.contains_key(h.node_id) => Err(format!(
            "this data dir's node {} was replaced by node {} (--replace-node), whose replicas were rebuilt \
             from the others: what this data dir holds is stale; do not start it again (keep it aside, or \
             remove it)",
            h.node_id,
            s.replaced.get(h.node_id).map(String::as_str).unwrap_or("?")
        )),
        // A fresh data dir taking the rank of a lost one, named by the operator: once that node
        // is not connected, or is connected but taken for down (a process hung on its dead
        // disk keeps its connection; it is fenced out when the new one is admitted).
        Some(slot)
            if h.replaces == Some(slot.info.node_id.as_str())
                && (slot.conn.is_none() || slot.info.state == NodeState::Down) =>
        {
            Ok(slot.info.epoch.saturating_add(1))
        }
        // Connected and not taken for down: up, or suspect (a replacement may wait for down).
        Some(slot) if slot.conn.is_some() && slot.info.state != NodeState::Down => {
            let addr = slot.info.addrs.values().next().map(String::as_str).unwrap_or("no address");
            match (slot.info.state, h.replaces) {
                (NodeState::Suspect, Some(named)) if named == slot.info.node_id => Err(format!(
                    "rank {} is held by node {} ({addr}), which is suspect (no recent heartbeat) but still \
                     connected to the master: stop that process, or wait until the membership takes it for down, \
                     and start this node again",
                    h.rank, slot.info.node_id
                )),
                _ => Err(format!("rank {} is already held by live node {} ({addr})", h.rank, slot.info.node_id)),
            }
        }
        Some(slot) => match h.replaces {
            Some(named) => Err(format!(
                "--replace-node names node {named}, but rank {} belongs to node {}: name the node whose data dir \
                 was lost",
                h.rank, slot.info.node_id
            )),
            None => Err(format!(
                "rank {} belongs to node {}, which holds its data; restart that node with its data dir. If that \
                 data dir is lost, start this node on an empty one with --replace-node {}: its replicas are then \
                 rebuilt from the others",
                h.rank, slot.info.node_id, slot.info.node_id
            )),
        },
    }
}

/// The ranks no node has joined as yet (before formation).
fn missing_ranks(s: &State, world_size: u32) -> Vec<u32> {
    (0..world_size).filter(|r| !s.slots.contains_key(r)).collect()
}

/// The ranks not connected, or not heard on their connection yet (see [`Slot::heard`]).
/// Which node held `rank`, as a node that has rejoined a replacement master last saw the
/// membership (its hello's `ranks`): the first such node's rank, and the node it names.
fn said_holder(s: &State, rank: u32) -> Option<(u32, String)> {
    s.slots.iter().filter(|(r, _)| **r != rank).find_map(|(by, slot)| {
        let held = slot.said_ranks.as_ref()?.get(&rank)?;
        Some((*by, held.clone()))
    })
}

/// Why a replacement master refuses a node that names another node than the one `by` saw
/// holding `rank`.
fn wrong_replacement(rank: u32, named: &str, by: u32, held: &str) -> String {
    format!(
        "--replace-node names node {named}, but rank {rank} belonged to node {held} (as rank {by} last saw the \
         membership): name the node whose data dir was lost (--replace-node {held}). (Had rank {by} been down \
         when rank {rank} was last replaced, its view is older than that, and naming node {held} is what lets this \
         master go on.)"
    )
}

/// On a replacement master once every rank is back: each node that took a rank with
/// `--replace-node` while no node that knew the rank's holder had rejoined yet, checked now
/// against what the others said; the first mismatch, if any. The replaced nodes are recorded, so
/// that their data dirs are refused if they turn up.
fn check_replacements(s: &mut State) -> Option<String> {
    let named: Vec<(u32, String, String)> = s
        .slots
        .iter()
        .filter_map(|(rank, slot)| Some((*rank, slot.replaces.clone()?, slot.info.node_id.clone())))
        .collect();
    for (rank, named, node) in named {
        if let Some((by, held)) = said_holder(s, rank)
            && held != named
        {
            return Some(wrong_replacement(rank, &named, by, &held));
        }
        s.replaced.insert(named, node);
    }
    None
}

fn unheard_ranks(s: &State, world_size: u32) -> Vec<u32> {
    let heard = |r: &u32| s.slots.get(r).is_some_and(|slot| slot.conn.is_some() && slot.heard);
    (1..world_size).filter(|r| !heard(r)).collect()
}

/// Queues `out` on every connection (a node that is not reading is disconnected).
fn broadcast_locked(s: &mut State, out: &Outgoing) {
    for slot in s.slots.values_mut() {
        if let Some(c) = &slot.conn
            && c.tx.try_send(out.clone()).is_err()
        {
            warn!(rank = slot.info.rank, "node is not reading its control channel; disconnecting it");
            slot.conn = None;
        }
    }
}

/// `rank`'s slot if connection `conn_id` still serves it.
fn current_slot(s: &mut State, rank: u32, conn_id: u64) -> Option<&mut Slot> {
    s.slots.get_mut(&rank).filter(|sl| sl.conn.as_ref().is_some_and(|c| c.id == conn_id))
}

fn send(slot: &mut Slot, msg: MasterMsg) {
    let Some(out) = Outgoing::new(&msg) else { return };
    if let Some(c) = &slot.conn
        && c.tx.try_send(out).is_err()
    {
        warn!(rank = slot.info.rank, "node is not reading its control channel; disconnecting it");
        slot.conn = None;
    }
}

fn snapshot(s: &State) -> Vec<MemberInfo> {
    let now = Instant::now();
    let now_unix_ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    s.slots
        .values()
        .map(|slot| {
            let mut info = slot.info.clone();
            if info.rank == 0 {
                info.state = NodeState::Up;
                info.last_heartbeat_unix_ms = Some(now_unix_ms);
            } else if let Some(seen) = slot.last_seen {
                let ago = now.duration_since(seen).as_millis() as u64;
                info.last_heartbeat_unix_ms = Some(now_unix_ms.saturating_sub(ago));
            }
            info
        })
        .collect()
}

async fn write_loop(mut writer: FrameWriter, mut rx: mpsc::Receiver<Outgoing>) {
    while let Some(out) = rx.recv().await {
        if let Err(e) = writer.write_payload(&out.payload).await {
            debug!("control write failed: {e}");
            return;
        }
        if out.last {
            break;
        }
    }
    writer.shutdown().await;
}

async fn timeout<F: std::future::Future>(d: Duration, what: &str, f: F) -> Result<F::Output> {
    tokio::time::timeout(d, f)
        .await
        .map_err(|_| ClusterError::Timeout { op: what.to_string(), timeout_ms: d.as_millis() as u64 })
}

#[cfg(test)]
mod hello_proof_tests {
    use super::*;

    /// Every field of a hello changes its proof: changing one in flight makes the proof fail.
    #[test]
    fn a_hellos_proof_covers_every_field() {
        let addrs: BTreeMap<String, String> = [("flight".to_string(), "127.0.0.1:1".to_string())].into();
        let other_addrs: BTreeMap<String, String> = [("flight".to_string(), "10.0.0.9:1".to_string())].into();
        let base = HelloProof {
            master_nonce: b"m",
            node_nonce: b"n",
            rank: 1,
            world_size: 2,
            node_id: "id",
            run_id: Some("run"),
            addrs: &addrs,
            held_epoch: Some(3),
            incarnation: Some("token"),
            replaces: None,
            master: None,
            ranks: None,
        };
        let ranks: BTreeMap<u32, String> = [(2, "node".to_string())].into();
        let other_ranks: BTreeMap<u32, String> = [(2, "other".to_string())].into();
        let variants = [
            HelloProof { rank: 0, ..base },
            HelloProof { world_size: 3, ..base },
            HelloProof { node_id: "other", ..base },
            HelloProof { run_id: None, ..base },
            HelloProof { run_id: Some(""), ..base },
            HelloProof { addrs: &other_addrs, ..base },
            HelloProof { held_epoch: None, ..base },
            HelloProof { held_epoch: Some(4), ..base },
            HelloProof { incarnation: None, ..base },
            HelloProof { incarnation: Some("forged"), ..base },
            HelloProof { replaces: Some("lost"), ..base },
            HelloProof { master: Some("m"), ..base },
            HelloProof { master: Some(""), ..base },
            HelloProof { ranks: Some(&ranks), ..base },
            HelloProof { ranks: Some(&other_ranks), ..base },
            HelloProof { master: Some("m"), ranks: Some(&ranks), ..base },
        ];
        let mut seen = vec![base.parts()];
        for v in variants {
            let parts = v.parts();
            assert!(!seen.contains(&parts), "two hellos with the same proof parts: {parts:?}");
            seen.push(parts);
        }
    }
}

#[cfg(test)]
mod failure_detector_tests {
    use super::*;

    /// A tick on time or a little late credits nothing; a master stopped for 20 s is credited the
    /// 20 s less one period and one heartbeat interval of ordinary lateness.
    #[test]
    fn only_the_masters_own_stall_is_credited() {
        let period = Duration::from_millis(250);
        assert_eq!(stalled_for(Duration::from_millis(250), period, 500), Duration::ZERO);
        assert_eq!(stalled_for(Duration::from_millis(700), period, 500), Duration::ZERO);
        assert_eq!(stalled_for(Duration::from_millis(20_000), period, 500), Duration::from_millis(19_250));
    }
}
