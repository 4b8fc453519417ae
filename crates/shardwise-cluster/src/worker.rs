//! A non-master node's side of the cluster: joining the master's rendezvous (with exponential
//! backoff and jitter), the barrier, and afterwards a link that sends heartbeats, answers
//! membership queries, forwards metadata proposals and keeps the newest metadata snapshot,
//! notices a silent master and rejoins when it comes back.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::error::{ClusterError, Result, format_ranks};
use crate::membership::{MemberInfo, NodeState};
use crate::metadata::{self, MetadataSnapshot, ProposeOutcome};
use crate::rendezvous::{HelloProof, decode_nonce};
use crate::secret::{ClusterSecret, nonce};
use crate::settings::Timeouts;
use crate::wire::{
    Direction, FrameReader, FrameWriter, MAX_PAYLOAD_BYTES, MasterMsg, NodeMsg, PROTOCOL_VERSION, encode,
    exchange_preamble,
};

/// First delay between connection attempts.
const BACKOFF_MIN_MS: u64 = 10;
/// Longest delay between connection attempts.
const BACKOFF_MAX_MS: u64 = 1_000;
/// Growth of the delay between attempts (gentler than doubling: a node that started before the
/// master should notice it soon after it is up).
const BACKOFF_FACTOR: f32 = 1.5;
/// How long past its own join deadline a connected node waits for the master's verdict.
const JOIN_VERDICT_GRACE_MS: u64 = 2_000;
/// How often a worker that cannot reach its master says so while it retries.
const JOIN_RETRY_WARN_INTERVAL_MS: u64 = 10_000;
/// Messages queued for the master before the link counts as stuck.
const LINK_QUEUE_LEN: usize = 256;
/// How often a node that cannot rejoin its master says why (it keeps trying meanwhile).
const REJOIN_WARN_INTERVAL_MS: u64 = 10_000;
/// Longest wait for the master to acknowledge a graceful leave.
const LEAVE_WAIT_MS: u64 = 2_000;
/// How often a replacement node asks whether a replacement master has taken the catalog yet
/// ([`WorkerLink::wait_until_master_has_catalog`]).
const ADOPTION_POLL_MS: u64 = 100;

/// Who this node is and where the master is.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    pub master: SocketAddr,
    pub rank: u32,
    pub world_size: u32,
    pub node_id: String,
    /// The run this node belongs to (from its data dir or `--run-id`), if known.
    pub run_id: Option<String>,
    pub addrs: BTreeMap<String, String>,
    pub secret: Option<ClusterSecret>,
    pub timeouts: Timeouts,
    /// The node id of the lost data dir whose rank this one takes (`--replace-node`), said on
    /// every attempt until the node's tables have taken note (its data dir then no longer
    /// records it: [`crate::datadir::still_replacing`]).
    pub replaces: Option<String>,
    /// The node's data dir, where it keeps what must outlive the master's: its copy of the
    /// cluster's metadata (`metadata.json`, written whenever a newer version arrives; see
    /// [`crate::rendezvous::MasterSettings::adopting`]) and the masters it served under
    /// ([`crate::master_ids`]). `None` keeps neither.
    pub data_dir: Option<PathBuf>,
}

/// An authenticated control connection, right after the master's welcome.
pub(crate) struct Session {
    reader: FrameReader,
    writer: FrameWriter,
    run_id: String,
    pub(crate) epoch: u64,
    /// This process's token, said again on every rejoin (`NodeMsg::Hello::incarnation`).
    incarnation: String,
    /// The master's heartbeat settings, which hold cluster-wide: how often to beat, and how long
    /// the master may stay silent before this node reconnects.
    pub(crate) heartbeat_interval_ms: u64,
    pub(crate) down_after_ms: u64,
    formed: bool,
    view: Vec<MemberInfo>,
    /// The master's metadata when it welcomed this node (or newer, while waiting to form).
    metadata: MetadataSnapshot,
}

/// Called with the run id when the master has admitted this node into a formed cluster.
pub type OnWelcome<'a> = dyn FnMut(&str) -> Result<()> + Send + 'a;

/// What the node learned by joining.
#[derive(Debug, Clone)]
pub struct Joined {
    pub run_id: String,
    pub epoch: u64,
    pub view: Vec<MemberInfo>,
}

fn backoff() -> impl Iterator<Item = Duration> {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(BACKOFF_MIN_MS))
        .with_max_delay(Duration::from_millis(BACKOFF_MAX_MS))
        .with_factor(BACKOFF_FACTOR)
        .with_jitter()
        .without_max_times()
        .build()
}

/// Errors after which retrying cannot help.
fn is_terminal(e: &ClusterError) -> bool {
    matches!(
        e,
        ClusterError::Refused { .. }
            | ClusterError::WrongProtocol { .. }
            | ClusterError::ProtocolVersion { .. }
            | ClusterError::Auth { .. }
            | ClusterError::Fenced { .. }
    )
}

/// Longest refusal reason shown from a peer.
const REASON_MAX_CHARS: usize = 500;

/// `text` from a peer as it may be printed: control characters (newlines, terminal escapes)
/// escaped, and at most [`REASON_MAX_CHARS`] characters.
fn printable(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars().take(REASON_MAX_CHARS) {
        match c.is_control() {
            true => out.extend(c.escape_default()),
            false => out.push(c),
        }
    }
    if text.chars().nth(REASON_MAX_CHARS).is_some() {
        out.push('…');
    }
    out
}

/// A reason the master gave before proving it knows the secret (when this node has one).
fn unproven(s: &WorkerSettings, peer: &str, reason: &str) -> String {
    match s.secret.is_some() {
        true => format!("{} (said by {peer} before it proved it knows the cluster secret)", printable(reason)),
        false => printable(reason),
    }
}

/// One attempt to join or rejoin; `incarnation` is this process's token, `held_epoch` the epoch
/// it held before it lost the master (`None` on its first join).
pub(crate) async fn connect_once(s: &WorkerSettings, incarnation: &str, held_epoch: Option<u64>) -> Result<Session> {
    let peer = s.master.to_string();
    let t = &s.timeouts;
    let stream = tokio::time::timeout(t.connect_timeout(), TcpStream::connect(s.master))
        .await
        .map_err(|_| ClusterError::Connection {
            peer: peer.clone(),
            detail: format!("connect timed out after {} ms", t.connect_timeout_ms),
        })?
        .map_err(|e| ClusterError::Connection { peer: peer.clone(), detail: e.to_string() })?;
    let _ = stream.set_nodelay(true);
    let (mut r, mut w) = stream.into_split();
    exchange_preamble(&mut r, &mut w, &peer, t.op_timeout()).await?;
    let mut reader = FrameReader::new(r, peer.clone(), Direction::ToNode);
    let mut writer = FrameWriter::new(w, peer.clone(), Direction::ToMaster);
    let challenge = read_timeout(&mut reader, t.op_timeout(), "waiting for the master's challenge").await?;
    let MasterMsg::Challenge { nonce: master_nonce, secured, node_id: master_id, .. } = challenge else {
        return Err(ClusterError::WrongProtocol { peer, detail: "the master did not send a challenge".into() });
    };
    // A replaced master's data dir, started again: left before the hello, admitted by nothing.
    if let (Some(dir), Some(master_id)) = (&s.data_dir, &master_id) {
        crate::master_ids::check_master(dir, master_id, &peer)?;
    }
    let master_nonce = decode_nonce(&master_nonce, &peer)?;
    if secured && s.secret.is_none() {
        return Err(ClusterError::Refused {
            reason: format!(
                "the master at {peer} requires a cluster secret, and this node has none (it was started with \
                 --insecure, or without --secret-file or {})",
                crate::secret::SECRET_ENV
            ),
        });
    }
    let node_nonce = nonce();
    let last_master = s.data_dir.as_deref().and_then(crate::master_ids::current);
    let last_ranks = s.data_dir.as_deref().and_then(crate::master_ids::last_ranks);
    // Claimed until the node's tables have taken note (the data dir then forgets it): by then the
    // master that admitted the node had recorded it in the rank, and a master that replaces that
    // one learns the rank's node from the members, so a claim still sent would name a node the
    // rank no longer belongs to, and be refused.
    let replaces = s.replaces.clone().filter(|_| s.data_dir.as_deref().is_none_or(crate::datadir::still_replacing));
    let proof = s.secret.as_ref().map(|secret| {
        let parts = HelloProof {
            master_nonce: &master_nonce,
            node_nonce: &node_nonce,
            rank: s.rank,
            world_size: s.world_size,
            node_id: &s.node_id,
            run_id: s.run_id.as_deref(),
            addrs: &s.addrs,
            held_epoch,
            incarnation: Some(incarnation),
            replaces: replaces.as_deref(),
            master: last_master.as_deref(),
            ranks: last_ranks.as_ref(),
        }
        .parts();
        let parts: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
        hex::encode(secret.tag("hello", &parts))
    });
    writer
        .write(&NodeMsg::Hello {
            protocol: PROTOCOL_VERSION,
            rank: s.rank,
            world_size: s.world_size,
            node_id: s.node_id.clone(),
            run_id: s.run_id.clone(),
            addrs: s.addrs.clone(),
            nonce: hex::encode(node_nonce),
            proof,
            epoch: held_epoch,
            incarnation: Some(incarnation.to_string()),
            replaces,
            master: last_master.clone(),
            ranks: last_ranks.map(|ranks| ranks.into_iter().collect()),
        })
        .await?;
    // The welcome carries the membership (when the cluster has formed): let it be large.
    reader.set_trusted();
    let (run_id, epoch, heartbeat_interval_ms, down_after_ms, formed, view) =
        match read_timeout(&mut reader, t.op_timeout(), "waiting for the master's welcome").await? {
            // Before its welcome the master has not proved it knows the secret: anything on the
            // master's port could have sent this, so the text is shown escaped, and marked.
            MasterMsg::Refused { reason } => return Err(ClusterError::Refused { reason: unproven(s, &peer, &reason) }),
            // With a secret, a fence counts only when the master proves it knows it; else it is a
            // refusal, retried (anything on the master's port could send one).
            MasterMsg::Fenced { reason, proof } => {
                let proven = match &s.secret {
                    None => true,
                    Some(secret) => proof
                        .and_then(|p| hex::decode(p).ok())
                        .is_some_and(|p| secret.verify("fenced", &[&master_nonce, &node_nonce, reason.as_bytes()], &p)),
                };
                return Err(match proven {
                    true => ClusterError::Fenced { reason: printable(&reason) },
                    false => ClusterError::Refused { reason: unproven(s, &peer, &reason) },
                });
            }
            MasterMsg::Welcome { run_id, epoch, proof, formed, view, heartbeat_interval_ms, down_after_ms } => {
                if let Some(secret) = &s.secret {
                    let ok = proof.and_then(|p| hex::decode(p).ok()).is_some_and(|p| {
                        secret.verify(
                            "welcome",
                            &[&master_nonce, &node_nonce, run_id.as_bytes(), &epoch.to_be_bytes()],
                            &p,
                        )
                    });
                    if !ok {
                        return Err(ClusterError::Auth {
                            peer,
                            detail: "the master could not prove it knows the cluster secret".into(),
                        });
                    }
                    let key = secret.session_key(&master_nonce, &node_nonce);
                    reader.set_key(key);
                    writer.set_key(key);
                }
                // Heartbeats are checked against the master's settings, so they are the ones used
                // (a master from before `down_after_ms` was sent leaves this node's own).
                let down_after_ms = down_after_ms.unwrap_or(t.down_after_ms).max(heartbeat_interval_ms);
                (run_id, epoch, heartbeat_interval_ms.max(1), down_after_ms, formed, view)
            }
            other => {
                return Err(ClusterError::WrongProtocol {
                    peer,
                    detail: format!("unexpected reply to hello: {}", message_kind(&other)),
                });
            }
        };
    // A replaced master's data dir, started again, is refused (`master_ids`); the master is
    // recorded once it serves (`WorkerLink::note_membership`).
    if let (Some(dir), Some(master)) = (&s.data_dir, view.iter().find(|m| m.rank == 0)) {
        crate::master_ids::check_master(dir, &master.node_id, &peer)?;
    }
    // The metadata comes right after the welcome, in the first authenticated frame.
    match read_timeout(&mut reader, t.op_timeout(), "waiting for the master's metadata snapshot").await? {
        MasterMsg::Metadata { snapshot: metadata } => Ok(Session {
            reader,
            writer,
            run_id,
            epoch,
            incarnation: incarnation.to_string(),
            heartbeat_interval_ms,
            down_after_ms,
            formed,
            view,
            metadata,
        }),
        other => Err(ClusterError::WrongProtocol {
            peer,
            detail: format!("expected the metadata snapshot after the welcome, got {}", message_kind(&other)),
        }),
    }
}

/// A message's type, for errors (its fields may be large).
fn message_kind(msg: &MasterMsg) -> String {
    serde_json::to_value(msg)
        .ok()
        .and_then(|v| v.get("type").and_then(Value::as_str).map(str::to_string))
        .unwrap_or_else(|| "an undecodable message".into())
}

async fn read_timeout(reader: &mut FrameReader, d: Duration, what: &str) -> Result<MasterMsg> {
    tokio::time::timeout(d, reader.read::<MasterMsg>())
        .await
        .map_err(|_| ClusterError::Timeout { op: what.to_string(), timeout_ms: d.as_millis() as u64 })?
}

/// Joins the cluster: connects (retrying with backoff), waits for every rank, passes the
/// barrier. Fails on refusal at once, and otherwise at the join timeout, naming the missing ranks.
async fn join(s: &WorkerSettings, on_welcome: &mut OnWelcome<'_>) -> Result<(Session, Joined)> {
    let t = &s.timeouts;
    let deadline = Instant::now() + t.join_timeout();
    // Drawn once per process (per link): every attempt and rejoin says it.
    let incarnation = uuid::Uuid::new_v4().to_string();
    let mut delays = backoff();
    let mut last_error = String::from("no attempt made");
    // The first warning after one interval: a master started at the same moment is normal.
    let mut last_warned = Instant::now();
    let mut missing: Option<Vec<u32>> = None;
    let mut announced = false;
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(match missing {
                Some(missing) => ClusterError::JoinTimeout {
                    timeout_ms: t.join_timeout_ms,
                    joined: s.world_size - missing.len() as u32,
                    world_size: s.world_size,
                    missing,
                },
                None => ClusterError::MasterUnreachable {
                    addr: s.master.to_string(),
                    timeout_ms: t.join_timeout_ms,
                    last_error,
                },
            });
        }
        // Once connected, the master's verdict on the join timeout comes first (it names the
        // missing ranks for everyone); the grace covers clock skew between the two deadlines.
        let grace = t.op_timeout().min(Duration::from_millis(JOIN_VERDICT_GRACE_MS));
        let attempt = tokio::time::timeout(remaining + grace, async {
            let mut session = connect_once(s, &incarnation, None).await?;
            if !announced {
                info!(rank = s.rank, "joined the rendezvous at {}; waiting for the cluster to form", s.master);
                announced = true;
            }
            if session.formed {
                let view = std::mem::take(&mut session.view);
                return Ok(Some((session, view)));
            }
            loop {
                match session.reader.read::<MasterMsg>().await? {
                    MasterMsg::Waiting { missing: m, joined, world_size } => {
                        debug!("waiting for {} of {world_size} ranks ({joined} joined): {}", m.len(), format_ranks(&m));
                        missing = Some(m);
                    }
                    MasterMsg::Formed { view } => {
                        session.view = view;
                        session.writer.write(&NodeMsg::BarrierEnter).await?;
                    }
                    MasterMsg::Release => {
                        let view = std::mem::take(&mut session.view);
                        return Ok(Some((session, view)));
                    }
                    MasterMsg::Abort { reason } | MasterMsg::Refused { reason } => {
                        return Err(ClusterError::Refused { reason });
                    }
                    MasterMsg::Fenced { reason, .. } => return Err(ClusterError::Fenced { reason }),
                    MasterMsg::Metadata { snapshot } if snapshot.version > session.metadata.version => {
                        session.metadata = snapshot;
                    }
                    _ => {}
                }
            }
        })
        .await;
        match attempt {
            // The deadline came during an attempt; the top of the loop reports it.
            Err(_) => {
                if missing.is_none() {
                    last_error = match announced {
                        // It had answered as a master: it stopped, or hangs, since.
                        true => "the master had admitted this node, then stopped answering before the cluster \
                                 formed (stopped, hung or cut off)"
                            .to_string(),
                        false => format!(
                            "an attempt was still waiting for an answer from {} when the time was up (something \
                             there accepts connections but does not answer as a shardwise master)",
                            s.master
                        ),
                    };
                }
                continue;
            }
            Ok(Ok(Some((session, view)))) => {
                // Recorded only now that the cluster has formed: a formation that never
                // completes (a rank that never came) leaves the data dir as fresh as it was, so
                // the next attempt may come under another launcher run id (a new Slurm job).
                on_welcome(&session.run_id)?;
                let joined = Joined { run_id: session.run_id.clone(), epoch: session.epoch, view };
                return Ok((session, joined));
            }
            Ok(Ok(None)) => continue,
            Ok(Err(e)) if is_terminal(&e) => return Err(e),
            Ok(Err(e)) => {
                debug!("join attempt failed: {e}");
                // A worker started before its master (or given a wrong address) says so while it
                // retries, instead of waiting the whole join timeout in silence.
                if last_warned.elapsed() >= Duration::from_millis(JOIN_RETRY_WARN_INTERVAL_MS) {
                    warn!(
                        "cannot reach the master at {} yet ({e}); retrying for {} s more (join_timeout_ms)",
                        s.master,
                        deadline.saturating_duration_since(Instant::now()).as_secs()
                    );
                    last_warned = Instant::now();
                }
                last_error = match announced {
                    true => {
                        format!("the master had admitted this node, then went away before the cluster formed ({e})")
                    }
                    false => e.to_string(),
                };
                let delay = delays.next().unwrap_or(Duration::from_millis(BACKOFF_MAX_MS));
                tokio::time::sleep(delay.min(deadline.saturating_duration_since(Instant::now()))).await;
            }
        }
    }
}

struct LinkState {
    tx: Option<mpsc::Sender<NodeMsg>>,
    view: Vec<MemberInfo>,
    pending: HashMap<u64, oneshot::Sender<Vec<MemberInfo>>>,
    /// Proposals sent on the current session, waiting for the master's answer.
    proposals: HashMap<u64, PendingProposal>,
    /// When the last message from the master was read (every metadata version it published
    /// before that message has been applied here: the channel is ordered).
    last_heard: Option<std::time::Instant>,
    /// The master is a replacement still taking the catalog from the ranks (`MasterMsg::Waiting`
    /// after this session's welcome, until `Release`): which ranks it waits for. Writes wait: a
    /// rank not yet back may hold a newer catalog (a table truncated since this node's).
    master_adopting: Option<Vec<u32>>,
    /// The membership (rank to node id) last recorded in `masters.json`.
    noted_ranks: BTreeMap<u32, String>,
}

/// A proposal waiting for the master's answer.
struct PendingProposal {
    answer: oneshot::Sender<Result<MetadataSnapshot>>,
    /// The master asked whether this node still waits (`MasterMsg::Confirm`) and was told yes:
    /// it is applying the change, so the proposer waits for the outcome past its deadline.
    confirmed: bool,
}

/// The joined node's link to the master. Dropping it does not stop its task; call
/// [`WorkerLink::leave`].
pub struct WorkerLink {
    settings: WorkerSettings,
    state: Mutex<LinkState>,
    next_req: AtomicU64,
    /// Set when the node must stop (fenced, or refused when rejoining).
    fatal: watch::Sender<Option<String>>,
    task: Mutex<Option<JoinHandle<()>>>,
    leaving: std::sync::atomic::AtomicBool,
    /// The newest metadata snapshot received from the master.
    metadata: watch::Sender<MetadataSnapshot>,
    /// The version of this node's copy on disk ([`WorkerSettings::data_dir`]).
    persisted: Arc<Mutex<u64>>,
    /// Counts control sessions; changed (with `tx` set, under the state lock) when one starts.
    sessions: watch::Sender<u64>,
}

impl std::fmt::Debug for WorkerLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerLink").field("rank", &self.settings.rank).finish_non_exhaustive()
    }
}

impl WorkerLink {
    /// Joins the cluster and starts the link. Returns once the barrier is passed.
    pub async fn join(settings: WorkerSettings) -> Result<(Arc<WorkerLink>, Joined)> {
        Self::join_then(settings, &mut |_| Ok(())).await
    }

    /// As [`WorkerLink::join`], calling `on_welcome` with the run id once the master has
    /// admitted this node into a formed cluster (at the barrier's release, or at once when the
    /// cluster had formed before), e.g. to record the run in the data dir.
    pub async fn join_then(
        settings: WorkerSettings,
        on_welcome: &mut OnWelcome<'_>,
    ) -> Result<(Arc<WorkerLink>, Joined)> {
        let (session, joined) = join(&settings, on_welcome).await?;
        // Every rejoin says the run it joined (a fresh data dir learns it from the welcome): a
        // master that replaces a lost one admits only nodes of its run.
        let settings = WorkerSettings { run_id: Some(joined.run_id.clone()), ..settings };
        if let (Some(dir), Some(master)) = (&settings.data_dir, joined.view.iter().find(|m| m.rank == 0)) {
            crate::master_ids::check_master(dir, &master.node_id, &settings.master.to_string())?;
        }
        let held = match &settings.data_dir {
            Some(dir) => metadata::load(dir).unwrap_or_else(|e| {
                warn!("cannot read this node's copy of the cluster's metadata: {e}");
                MetadataSnapshot::default()
            }),
            None => MetadataSnapshot::default(),
        };
        let on_disk = held.version;
        let metadata = if held.version > session.metadata.version { held } else { session.metadata.clone() };
        let link = Arc::new(WorkerLink {
            settings,
            state: Mutex::new(LinkState {
                tx: None,
                view: joined.view.clone(),
                pending: HashMap::new(),
                proposals: HashMap::new(),
                last_heard: None,
                master_adopting: None,
                noted_ranks: BTreeMap::new(),
            }),
            next_req: AtomicU64::new(1),
            fatal: watch::channel(None).0,
            task: Mutex::new(None),
            leaving: std::sync::atomic::AtomicBool::new(false),
            metadata: watch::channel(metadata).0,
            persisted: Arc::new(Mutex::new(on_disk)),
            sessions: watch::channel(0).0,
        });
        link.keep_copy();
        let runner = Arc::clone(&link);
        let handle = tokio::spawn(async move { runner.run(session).await });
        *link.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
        Ok((link, joined))
    }

    fn lock(&self) -> MutexGuard<'_, LinkState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records in `masters.json`, off the link's task, the master and which node holds each rank
    /// when the membership the master answered says something new: what refuses a replaced
    /// master's data dir, and what a replacement master checks a `--replace-node` by. Not while
    /// the master is a replacement still taking the catalog: it may yet give up, recording
    /// nothing, and a node it admitted for a rank is not checked yet (the first answer to a
    /// session comes after its `Waiting`, so this is known by then).
    fn note_membership(&self, view: &[MemberInfo]) {
        let Some(dir) = self.settings.data_dir.clone() else { return };
        // Every membership answer comes here (queries ask for it): compared in place, and a map
        // made only when it says something new.
        let ranks = {
            let mut st = self.lock();
            let same = st.noted_ranks.len() == view.len()
                && view.iter().all(|m| st.noted_ranks.get(&m.rank) == Some(&m.node_id));
            if view.is_empty() || same || st.master_adopting.is_some() {
                return;
            }
            let ranks: BTreeMap<u32, String> = view.iter().map(|m| (m.rank, m.node_id.clone())).collect();
            st.noted_ranks = ranks.clone();
            ranks
        };
        tokio::task::spawn_blocking(move || {
            if let Some(master) = ranks.get(&0) {
                crate::master_ids::record_master(&dir, master);
            }
            crate::master_ids::record_ranks(&dir, ranks);
        });
    }

    /// Asks the master for the membership once the link's first session is up (within the
    /// operation timeout), so that its answer is recorded ([`Self::note_membership`]) at the
    /// start, not only at the node's first query.
    pub async fn record_membership(&self) {
        let mut sessions = self.sessions.subscribe();
        let started = sessions.wait_for(|n| *n > 0);
        if tokio::time::timeout(self.settings.timeouts.op_timeout(), started).await.is_ok() {
            self.ask_members().await;
        }
    }

    /// Records the master that has just let the ranks go after taking the catalog (a
    /// replacement's `Release`): it serves now. Only the master: this node's view of the other
    /// ranks dates from its welcome, when not every rank was back.
    fn note_released_master(&self) {
        let Some(dir) = self.settings.data_dir.clone() else { return };
        let Some(master) = self.lock().view.iter().find(|m| m.rank == 0).map(|m| m.node_id.clone()) else { return };
        tokio::task::spawn_blocking(move || crate::master_ids::record_master(&dir, &master));
    }

    /// Why writes through this node are refused now as far as its link to the master tells,
    /// without asking the master (for `/health`): no connection to it, or a replacement master
    /// still taking the catalog. `None` when connected and the master takes writes.
    pub fn master_problem(&self) -> Option<String> {
        let st = self.lock();
        if let Some(missing) = &st.master_adopting {
            return Some(format!(
                "the master replaces one whose data dir was lost and is taking the catalog from the ranks (ranks {} \
                 not yet rejoined): writes through this node are refused until it has",
                format_ranks(missing)
            ));
        }
        if st.tx.is_none() {
            let since =
                st.last_heard.map_or_else(String::new, |h| format!(" (last heard {} ms ago)", h.elapsed().as_millis()));
            return Some(format!(
                "no connection to the master at {}{since}: writes through this node are refused, and its catalog may \
                 be out of date",
                self.settings.master
            ));
        }
        None
    }

    /// For a node on the empty data dir of a lost one (`--replace-node`), which decides from the
    /// catalog which of its replicas await a rebuild: when the master is itself a replacement
    /// still taking the catalog from the ranks, the catalog this node was welcomed with is the
    /// master's empty one. Waits, up to `join_timeout_ms`, until the master has taken it and let
    /// the ranks go (`MasterMsg::Release`); the catalog it took was sent before that, so this
    /// node holds it when this returns.
    pub async fn wait_until_master_has_catalog(&self) -> Result<()> {
        let timeout_ms = self.settings.timeouts.join_timeout_ms;
        let deadline = Instant::now() + Duration::from_millis(timeout_ms);
        let mut said = false;
        loop {
            // Its answer comes after every message the master sent before it (a `Waiting` after
            // the welcome among them), all handled here by then.
            if self.ask_members().await.is_some() {
                match self.lock().master_adopting.clone() {
                    None => return Ok(()),
                    Some(missing) if !said => {
                        info!(
                            "the master replaces a lost one and is taking the catalog from the ranks (ranks {} not yet \
                             rejoined): this node's replicas to rebuild are known once it has",
                            format_ranks(&missing)
                        );
                        said = true;
                    }
                    Some(_) => {}
                }
            }
            if Instant::now() >= deadline {
                return Err(ClusterError::Timeout {
                    op: "waiting for the replacement master to take the cluster's catalog from the ranks".into(),
                    timeout_ms,
                });
            }
            tokio::time::sleep(Duration::from_millis(ADOPTION_POLL_MS)).await;
        }
    }

    /// Becomes `Some(reason)` when this node must stop.
    pub fn fatal(&self) -> watch::Receiver<Option<String>> {
        self.fatal.subscribe()
    }

    /// The membership from the master, or the last one received if the master does not answer
    /// within the operation timeout.
    pub async fn members(&self) -> Vec<MemberInfo> {
        match self.ask_members().await {
            Some(view) => view,
            None => self.lock().view.clone(),
        }
    }

    /// The membership as the master answers it now, within the operation timeout; `None` with no
    /// connection to the master or no answer. The answer comes after every message the master
    /// sent before it, all handled here by then.
    async fn ask_members(&self) -> Option<Vec<MemberInfo>> {
        let req = self.next_req.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut st = self.lock();
            let link = st.tx.clone()?;
            link.try_send(NodeMsg::MembersQuery { req }).ok()?;
            st.pending.insert(req, tx);
        }
        match tokio::time::timeout(self.settings.timeouts.op_timeout(), rx).await {
            Ok(Ok(view)) => Some(view),
            _ => {
                self.lock().pending.remove(&req);
                None
            }
        }
    }

    /// Makes sure this node's metadata is as new as the master's before a write relies on it.
    /// Heard from the master within a few heartbeat intervals: it is (a change the master
    /// publishes is sent to every connected node before the DDL that made it returns, and waited
    /// for up to `metadata_applied_timeout_ms`). Otherwise (this node was paused, starved of CPU,
    /// or its connection stalled, while the master may have published a change, say a DROP and
    /// CREATE of the table being written), a round trip to the master first: its answer comes
    /// after every version it sent before, all applied here by then, ZooKeeper's `sync`. Without
    /// it, a worker resumed from SIGSTOP acknowledged an insert into the table as it was before
    /// the DROP, whose rows the other nodes then threw away with it. `Err` when the master does
    /// not answer within the operation timeout.
    ///
    /// With no connection to the master at all, a `writing` statement fails: this node cannot
    /// tell a master that is down (no change can be made) from one it is cut off from, which
    /// goes on without it once it counts it down, and applied a TRUNCATE, a DROP and CREATE or
    /// a RENAME while inserts here were acknowledged into the table as it was, and lost
    /// (ClickHouse's replicated tables turn read-only without their Keeper for the same reason).
    /// Reads go on with the catalog this node has.
    pub async fn ensure_metadata_current(&self, writing: bool) -> std::result::Result<(), String> {
        let t = &self.settings.timeouts;
        let fresh_ms = (t.heartbeat_interval_ms.saturating_mul(3)).min(t.metadata_applied_timeout_ms / 2).max(1);
        let (heard, connected) = {
            let st = self.lock();
            (st.last_heard, st.tx.is_some())
        };
        let silent = heard.map(|h| h.elapsed());
        if let Some(missing) = self.lock().master_adopting.clone().filter(|_| writing) {
            return Err(format!(
                "the master replaces one whose data dir was lost and is taking the cluster's catalog from the \
                 ranks as they rejoin; ranks {} have not yet, and one may hold a newer catalog than rank {}'s \
                 (a table truncated or dropped since): nothing was written; retry once they have (reads go on)",
                format_ranks(&missing),
                self.settings.rank
            ));
        }
        if !connected {
            if !writing {
                return Ok(());
            }
            let since = silent.map_or_else(String::new, |d| format!(" (last heard {} ms ago)", d.as_millis()));
            return Err(format!(
                "rank {} has no connection to the master{since}, so it cannot tell whether a table it writes \
                 was truncated, dropped or renamed meanwhile; nothing was written; retry once the master is \
                 reachable (reads go on)",
                self.settings.rank
            ));
        }
        if silent.is_some_and(|d| d <= Duration::from_millis(fresh_ms)) {
            return Ok(());
        }
        let asked = std::time::Instant::now();
        if self.ask_members().await.is_some() {
            return Ok(());
        }
        // Said as it happened: the connection may have ended before the operation timeout.
        let waited = asked.elapsed();
        let outcome = match waited >= t.op_timeout() {
            true => format!("the master did not answer within {} ms", t.op_timeout().as_millis()),
            false => format!("the connection to the master ended after {} ms without an answer", waited.as_millis()),
        };
        let silent_ms = silent.map_or_else(|| "a while".to_string(), |d| format!("{} ms", d.as_millis()));
        Err(format!(
            "rank {} had not heard from the master for {silent_ms} and {outcome}, so its catalog may be out of date \
             (a table dropped and created again meanwhile); nothing was written, retry",
            self.settings.rank
        ))
    }

    /// The newest replicated metadata this node has received.
    pub fn metadata(&self) -> watch::Receiver<MetadataSnapshot> {
        self.metadata.subscribe()
    }

    /// Sends a metadata operation to the master and waits for its answer, for at most
    /// `propose_timeout_ms` (waiting for the master to come back if the link is down). When this
    /// returns `Ok`, [`WorkerLink::metadata`] already holds the returned version or a newer one.
    pub async fn propose(&self, op: Value) -> Result<MetadataSnapshot> {
        let timeouts = &self.settings.timeouts;
        let deadline = tokio::time::Instant::now() + timeouts.propose_timeout();
        let unreachable = |detail: String, sent: bool| ClusterError::MetadataUnreachable {
            master: self.settings.master.to_string(),
            detail,
            sent,
        };
        metadata::check_op(&op)?;
        let req = self.next_req.fetch_add(1, Ordering::Relaxed);
        let mut msg = NodeMsg::Propose { req, op };
        let len = encode(&msg).map_err(|reason| ClusterError::MetadataRejected { reason })?.len();
        if len > MAX_PAYLOAD_BYTES {
            return Err(ClusterError::MetadataRejected {
                reason: format!(
                    "the operation is {len} bytes when sent, more than the control frame limit of \
                     {MAX_PAYLOAD_BYTES} bytes"
                ),
            });
        }
        let (answer_tx, answer) = oneshot::channel();
        let mut answer_tx = Some(answer_tx);
        let mut sessions = self.sessions.subscribe();
        let mut fatal = self.fatal.subscribe();
        loop {
            if self.leaving.load(Ordering::SeqCst) {
                return Err(ClusterError::ShuttingDown);
            }
            if let Some(reason) = fatal.borrow_and_update().clone() {
                return Err(unreachable(format!("this node must stop: {reason}"), false));
            }
            let seen = {
                let mut st = self.lock();
                let seen = *sessions.borrow_and_update();
                if let Some(link) = st.tx.clone() {
                    match link.try_send(msg) {
                        Ok(()) => {
                            if let Some(answer) = answer_tx.take() {
                                st.proposals.insert(req, PendingProposal { answer, confirmed: false });
                            }
                            break;
                        }
                        Err(TrySendError::Full(_)) => {
                            return Err(unreachable("the link to the master is not draining its queue".into(), false));
                        }
                        Err(TrySendError::Closed(m)) => msg = m, // the session just ended
                    }
                }
                seen
            };
            // Not connected: wait for the next session (or for this node to be told to stop).
            let next = tokio::time::timeout_at(deadline, async {
                tokio::select! {
                    _ = sessions.wait_for(|n| *n != seen) => {}
                    _ = fatal.changed() => {}
                }
            });
            if next.await.is_err() {
                return Err(unreachable(
                    format!(
                        "not connected, and the master did not come back within propose_timeout_ms ({} ms)",
                        timeouts.propose_timeout_ms
                    ),
                    false,
                ));
            }
        }
        let lost = || unreachable("the connection to the master was lost before it answered".into(), true);
        tokio::pin!(answer);
        match tokio::time::timeout_at(deadline, &mut answer).await {
            Ok(Ok(result)) => return result,
            Ok(Err(_)) => return Err(lost()),
            Err(_) => {}
        }
        // Out of time. Unless the master has already confirmed that it applies the change, it is
        // withdrawn here: the master asks before applying, is told no, and drops it.
        let confirmed = {
            let mut st = self.lock();
            match st.proposals.get(&req).map(|p| p.confirmed) {
                Some(true) => true,
                Some(false) => {
                    st.proposals.remove(&req);
                    false
                }
                None => true, // answered (or the session ended) just now: the answer decides
            }
        };
        if !confirmed {
            return Err(unreachable(
                format!(
                    "no answer within propose_timeout_ms ({} ms), and the master had not started applying it, \
                     so it was withdrawn",
                    timeouts.propose_timeout_ms
                ),
                false,
            ));
        }
        // The master is applying it: its answer follows the new version to every node.
        match tokio::time::timeout(timeouts.propose_timeout(), &mut answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(lost()),
            Err(_) => {
                self.lock().proposals.remove(&req);
                Err(unreachable(
                    format!(
                        "the master started applying it but gave no answer within twice propose_timeout_ms ({} ms)",
                        timeouts.propose_timeout_ms
                    ),
                    true,
                ))
            }
        }
    }

    /// Tells the master this node is leaving and stops the link.
    pub async fn leave(&self) {
        self.leaving.store(true, Ordering::SeqCst);
        let tx = self.lock().tx.take();
        let handle = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(tx) = tx {
            let _ = tx.try_send(NodeMsg::Leave);
        }
        if let Some(mut h) = handle {
            // The master closes the connection after `Leave`; that ends the task.
            let wait = self.settings.timeouts.op_timeout().min(Duration::from_millis(LEAVE_WAIT_MS));
            if tokio::time::timeout(wait, &mut h).await.is_err() {
                h.abort();
            }
        }
    }

    async fn run(self: Arc<Self>, first: Session) {
        // The epoch of the last session: a rejoin says it, so that a process a newer incarnation
        // has replaced is fenced out instead of taking its rank back.
        let mut held_epoch = first.epoch;
        let incarnation = first.incarnation.clone();
        let mut session = Some(first);
        let mut last_warned: Option<Instant> = None;
        let mut delays = backoff();
        loop {
            if self.leaving.load(Ordering::SeqCst) {
                return;
            }
            if let Some(s) = session.take() {
                delays = backoff();
                held_epoch = s.epoch;
                let reason = self.serve(s).await;
                match reason {
                    Err(e) if matches!(e, ClusterError::Fenced { .. }) => {
                        self.fatal.send_replace(Some(e.to_string()));
                        return;
                    }
                    _ if self.leaving.load(Ordering::SeqCst) => return,
                    Err(e) => warn!("lost the master at {}: {e}; reconnecting", self.settings.master),
                    Ok(()) => return,
                }
                self.master_lost();
            }
            tokio::time::sleep(delays.next().unwrap_or(Duration::from_millis(BACKOFF_MAX_MS))).await;
            match connect_once(&self.settings, &incarnation, Some(held_epoch)).await {
                Ok(s) => {
                    info!(epoch = s.epoch, "rejoined the master at {}", self.settings.master);
                    session = Some(s);
                    last_warned = None;
                }
                // Only a newer incarnation ends this one. Anything else (a master restarted
                // with other settings, stalled, or replaced by something else on its port) may be
                // mended while this node keeps serving what it holds: it keeps trying, and says so.
                Err(e @ ClusterError::Fenced { .. }) => {
                    warn!("{e}");
                    self.fatal.send_replace(Some(e.to_string()));
                    return;
                }
                Err(e) if is_terminal(&e) => {
                    if last_warned.is_none_or(|at| at.elapsed() >= Duration::from_millis(REJOIN_WARN_INTERVAL_MS)) {
                        warn!("cannot rejoin the master at {}: {e}; retrying", self.settings.master);
                        last_warned = Some(Instant::now());
                    }
                }
                // Unreachable (down, partitioned, restarting): said with the reason, again every
                // REJOIN_WARN_INTERVAL_MS while it lasts, so a long outage shows in the log.
                Err(e) => {
                    if last_warned.is_none_or(|at| at.elapsed() >= Duration::from_millis(REJOIN_WARN_INTERVAL_MS)) {
                        warn!("still no connection to the master at {}: {e}; retrying", self.settings.master);
                        last_warned = Some(Instant::now());
                    } else {
                        debug!("reconnect failed: {e}");
                    }
                }
            }
        }
    }

    /// The link to the master is gone: the master is down in this node's view, and every other
    /// node it held `up` is `suspect`, since the master, which tracks their heartbeats, can no
    /// longer say (a list kept as it was would show a node stopped since as `up`).
    fn master_lost(&self) {
        let rank = self.settings.rank;
        let mut st = self.lock();
        st.tx = None;
        // A replacement master's wait ended with its session: what this node waits for now is a
        // connection (`ensure_metadata_current` and `/health` say so).
        st.master_adopting = None;
        st.pending.clear();
        // The master applies a node's change only after this node confirmed it, on the session
        // that just ended: the changes not confirmed yet will never be applied.
        for (_, p) in st.proposals.drain() {
            if !p.confirmed {
                let _ = p.answer.send(Err(ClusterError::MetadataUnreachable {
                    master: self.settings.master.to_string(),
                    detail: "the connection to the master was lost before it started applying it".into(),
                    sent: false,
                }));
            } // else dropped: the caller learns the outcome is unknown
        }
        for m in st.view.iter_mut() {
            match m.rank {
                0 => m.state = NodeState::Down,
                r if r != rank && m.state == NodeState::Up => m.state = NodeState::Suspect,
                _ => {}
            }
        }
    }

    /// Keeps `snapshot` if it is newer than the one this node has. An older one is ignored: a
    /// late message, or (from a welcome) a master that lost its `metadata.json`, which is worth
    /// a warning.
    fn receive_metadata(&self, snapshot: MetadataSnapshot, welcome: bool) {
        let (offered, held) = (snapshot.version, self.metadata.borrow().version);
        let advanced = metadata::advance(&self.metadata, snapshot);
        if advanced {
            self.keep_copy();
        }
        if !advanced && welcome && offered < held {
            warn!(
                "the master's metadata is at version {offered}, older than this node's {held}; keeping \
                 version {held} and sending it to the master (a master replacing a lost one, or its master/{} \
                 restored from an older backup)",
                metadata::METADATA_FILE
            );
        }
    }

    /// Writes the newest metadata to this node's copy ([`WorkerSettings::data_dir`]), off
    /// the runtime; a write that finds a newer one already there does nothing. A failure is
    /// logged: the copy is for a master whose data dir is lost, and the node runs on without it.
    fn keep_copy(&self) {
        let Some(dir) = self.settings.data_dir.clone() else { return };
        let snapshot = self.metadata.borrow().clone();
        let persisted = Arc::clone(&self.persisted);
        tokio::task::spawn_blocking(move || {
            let mut written = persisted.lock().unwrap_or_else(|p| p.into_inner());
            if snapshot.version <= *written {
                return;
            }
            match metadata::persist(&dir, &snapshot) {
                Ok(()) => *written = snapshot.version,
                Err(e) => {
                    warn!(version = snapshot.version, "cannot keep this node's copy of the cluster's metadata: {e}")
                }
            }
        });
    }

    /// What `propose` returns for the master's answer. An applied version arrived just before
    /// the answer, on the same connection.
    fn proposal_result(&self, outcome: ProposeOutcome) -> Result<MetadataSnapshot> {
        match outcome {
            ProposeOutcome::Applied { version } => {
                let current = self.metadata.borrow().clone();
                if current.version >= version {
                    Ok(current)
                } else {
                    Err(ClusterError::MetadataUnreachable {
                        master: self.settings.master.to_string(),
                        detail: format!(
                            "the master applied version {version}, but this node has received only version {} \
                             (a bug)",
                            current.version
                        ),
                        sent: true,
                    })
                }
            }
            ProposeOutcome::Rejected { reason } => Err(ClusterError::MetadataRejected { reason }),
            ProposeOutcome::NotNow { reason } => Err(ClusterError::MetadataNotNow { reason }),
            ProposeOutcome::Failed { reason } => Err(ClusterError::MetadataStore { detail: reason }),
        }
    }

    /// Runs one control session until it fails; `Ok` only when the link was asked to stop.
    async fn serve(&self, session: Session) -> Result<()> {
        let Session { mut reader, mut writer, view, metadata: welcomed, heartbeat_interval_ms, down_after_ms, .. } =
            session;
        let welcomed_version = welcomed.version;
        self.receive_metadata(welcomed, true);
        let (tx, mut rx) = mpsc::channel::<NodeMsg>(LINK_QUEUE_LEN);
        // A master behind this node (its metadata.json restored from an older backup) takes
        // this node's version.
        let held = self.metadata.borrow().clone();
        if held.version > welcomed_version {
            let _ = tx.try_send(NodeMsg::NewerMetadata { snapshot: held });
        }
        {
            let mut st = self.lock();
            st.tx = Some(tx.clone());
            st.master_adopting = None;
            if !view.is_empty() {
                st.view = view;
            }
            self.sessions.send_modify(|n| *n += 1);
        }
        let writer_task = tokio::spawn(async move {
            while let Some(msg) = rx.recv().await {
                if writer.write(&msg).await.is_err() {
                    break;
                }
            }
            writer.shutdown().await;
        });
        let applied_tx = tx.clone();
        let interval = Duration::from_millis(heartbeat_interval_ms);
        let heartbeat = tokio::spawn(async move {
            let mut seq = 0u64;
            let mut tick = tokio::time::interval(interval);
            loop {
                tick.tick().await;
                seq += 1;
                if tx.send(NodeMsg::Heartbeat { seq }).await.is_err() {
                    break;
                }
            }
        });
        let silence = Duration::from_millis(down_after_ms);
        let result = loop {
            let msg = match read_crediting_own_stalls(&mut reader, silence, interval).await {
                Err(_) => {
                    break Err(ClusterError::Timeout {
                        op: "waiting for the master's heartbeat acknowledgement".into(),
                        timeout_ms: silence.as_millis() as u64,
                    });
                }
                Ok(Err(e)) => break Err(e),
                Ok(Ok(m)) => m,
            };
            self.lock().last_heard = Some(std::time::Instant::now());
            match msg {
                MasterMsg::Members { req, view } => {
                    let waiter = {
                        let mut st = self.lock();
                        st.view = view.clone();
                        st.pending.remove(&req)
                    };
                    self.note_membership(&view);
                    if let Some(waiter) = waiter {
                        let _ = waiter.send(view);
                    }
                }
                MasterMsg::Metadata { snapshot } => {
                    let offered = snapshot.version;
                    self.receive_metadata(snapshot, false);
                    let held = self.metadata.borrow().clone();
                    let version = held.version;
                    // A master behind this node (restored from an older backup) takes this
                    // node's version.
                    if version > offered {
                        let _ = applied_tx.try_send(NodeMsg::NewerMetadata { snapshot: held });
                    }
                    // Tells the master this node runs with it (it waits for that to answer a
                    // change); a full queue only makes the master wait out its timeout.
                    let _ = applied_tx.try_send(NodeMsg::MetadataApplied { version });
                }
                MasterMsg::Proposed { req, outcome } => {
                    let waiter = self.lock().proposals.remove(&req);
                    if let Some(waiter) = waiter {
                        let _ = waiter.answer.send(self.proposal_result(outcome));
                    }
                }
                MasterMsg::Confirm { req } => {
                    let waiting = match self.lock().proposals.get_mut(&req) {
                        Some(p) => {
                            p.confirmed = true;
                            true
                        }
                        None => false,
                    };
                    // A full queue leaves the master without an answer: it drops the change
                    // and says so to this node, if it still waits.
                    let _ = applied_tx.try_send(NodeMsg::Confirmed { req, waiting });
                }
                // Only a replacement master sends these after the welcome (see `master_adopting`).
                MasterMsg::Waiting { missing, .. } => self.lock().master_adopting = Some(missing),
                MasterMsg::Release => {
                    self.lock().master_adopting = None;
                    self.note_released_master();
                }
                MasterMsg::Fenced { reason, .. } => break Err(ClusterError::Fenced { reason }),
                MasterMsg::Abort { reason } | MasterMsg::Refused { reason } => {
                    break Err(ClusterError::Refused { reason });
                }
                _ => {}
            }
        };
        heartbeat.abort();
        writer_task.abort();
        result
    }
}

/// The master's next message, or `Err` after `silence` of it, counted on this node's clock only
/// while this node runs: the wait goes in steps of `step` (the heartbeat interval), and a step
/// that took far longer (this process was paused by SIGSTOP, a frozen VM, a starved CPU) counts
/// as two steps. So a worker that was itself paused does not blame the master for its own
/// silence, drop its session and rejoin under a new epoch; its heartbeats resume on the session
/// it has (the master's failure detector credits its own stalls the same way).
async fn read_crediting_own_stalls(
    reader: &mut FrameReader,
    silence: Duration,
    step: Duration,
) -> std::result::Result<Result<MasterMsg>, tokio::time::error::Elapsed> {
    let read = reader.read::<MasterMsg>();
    tokio::pin!(read);
    let mut silent = Duration::ZERO;
    loop {
        let started = tokio::time::Instant::now();
        match tokio::time::timeout(step, &mut read).await {
            Ok(message) => return Ok(message),
            Err(elapsed) => {
                silent += started.elapsed().min(step * 2);
                if silent >= silence {
                    return Err(elapsed);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn a_peers_text_is_printed_escaped_and_bounded() {
        assert_eq!(printable("bad\nline \u{1b}[31mred"), "bad\\nline \\u{1b}[31mred");
        assert_eq!(printable("héllo"), "héllo");
        let long = printable(&"x".repeat(10_000));
        assert_eq!(long.chars().count(), super::REASON_MAX_CHARS + 1);
        assert!(long.ends_with('…'));
    }
}
