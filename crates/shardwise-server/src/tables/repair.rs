//! `REPAIR TABLE t`: every replica that `CHECK TABLE` fails (damaged, its files gone, or
//! different from a majority of its shard's replicas) is rebuilt from one that passed.
//!
//! # Exactly once
//!
//! A rebuilt replica B is given the rows and dedup state of a source replica A ([`ReplicaImage`]).
//! Every delayed insert reaches both replicas under the same (origin, seq), and each origin
//! delivers to each node in seq order, so B then drops, as duplicates, exactly the pieces A
//! already holds: those with a seq at or below A's high-water mark for their origin. Nothing
//! is lost if A holds everything B ever acknowledged, which the steps below make sure of:
//!
//! 1. **Fence B** (on B's node): its store is retired ([`ShardStore::retire`], under the lock
//!    every apply holds, so one under way finishes first) and the replica refuses writes and
//!    reads: delayed shipments for it are held back by their senders and sent again later, an
//!    `immediate` insert counts it as a replica that failed, a query reads another replica. From
//!    here on B acknowledges nothing.
//! 2. **Drain to A** (on every node): each node notes its outbox's next seq and waits until it has
//!    delivered to A's node every item of the table below it. Whatever B acknowledged was queued
//!    before step 1, so A now has it too.
//! 3. **Install** (on B's node): B's node fetches A's image (taken under A's lock, at one instant),
//!    checks it against its content checksum, writes it as a new store beside the old one
//!    (`shard-<s>.rebuild`: one part, then a manifest with the dedup state, each fsynced), and swaps
//!    the directories (below). Then the fence is lifted: the held-back shipments arrive, and the
//!    new store applies exactly those A did not hold.
//!
//! Any node that cannot do its step (down, not answering within `repair_timeout_ms`) stops the
//! rebuild of that replica, and the fence is lifted with the old store back in service as it was
//! (not reopened from its files, which may be what was wrong with it). A fence also lapses by
//! itself ([`fence_lease`]), so an initiator that died part-way does not keep a replica fenced;
//! an install that comes after its fence lapsed is refused, and so is one for a table dropped or
//! truncated meanwhile.
//!
//! Which replicas are rebuilt, and from which, is [`plan`]'s decision on a check that has
//! settled (`settled_check`: differences that do not last through [`REPAIR_CHECK_ROUNDS`]
//! checks are rows on their way, not damage).
//!
//! # The directory swap, and a crash during it
//!
//! `shard-<s>.rebuild` is complete and durable before the swap starts. Then: `shard-<s>` is
//! renamed to `shard-<s>.replaced`, `shard-<s>.rebuild` to `shard-<s>`, each followed by an fsync
//! of the table's directory, and `shard-<s>.replaced` is deleted. [`finish_swap`], run before
//! every open of a store, completes or undoes a swap a crash cut short: with `shard-<s>` in place
//! the other two are leftovers to delete; without it, a `.replaced` beside a `.rebuild` means the
//! crash came between the renames, and the (complete) rebuild is renamed into place.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use shardwise_cluster::NodeState;
use shardwise_query::{QueryError, ReplicaCheckRow, ReplicaRepairRow, check_table};
use shardwise_storage::{CatalogEntry, ImageHeader, RealFs, ReplicaImage, ShardStore};

use super::stats::PeerShare;
use super::{StoreKey, TablesNode, blocking, lock, lock_from_runtime, outbox_key_incarnation, storage_error};

/// An image travels in results of at most this many bytes (far below the data plane's message
/// limit, so that no single message is large).
pub const REPAIR_IMAGE_CHUNK_BYTES: usize = 4 * 1024 * 1024;

/// How many times `REPAIR TABLE` checks a table whose replicas differ before it judges them
/// (`settled_check`).
pub const REPAIR_CHECK_ROUNDS: usize = 3;

/// How often a repair step waiting on another node looks whether the membership took it for
/// down.
const DOWN_POLL_MS: u64 = 500;

/// How often a drain looks at the outbox again.
const DRAIN_POLL_MS: u64 = 20;

/// How long a fence lasts without being lifted: the two steps after it each get `timeout`, plus
/// this much.
const FENCE_LEASE_EXTRA_MS: u64 = 10_000;

/// How long a fence set for a repair whose steps each take up to `timeout` lasts (`None`: no
/// end that an `Instant` can hold).
fn fence_lease(timeout: Duration) -> Option<Instant> {
    let lease = timeout.checked_mul(2)?.checked_add(Duration::from_millis(FENCE_LEASE_EXTRA_MS))?;
    Instant::now().checked_add(lease)
}

/// One shard replica of one table incarnation, as the initiator's catalog names it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicaRef {
    pub table_id: u64,
    pub generation: u64,
    pub catalog_version: u64,
    pub shard: u32,
}

/// `repair_fence`, `repair_unfence` and `repair_install` requests (the last with `source`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FenceRequest {
    pub replica: ReplicaRef,
    /// Names this repair's fence: only it lifts it or installs under it.
    pub token: String,
    pub timeout_ms: u64,
    /// The rank whose replica to copy (install only).
    #[serde(default)]
    pub source: Option<u32>,
}

/// A `repair_drain` request: deliver every queued item of the table below this node's next seq
/// to `dests` (every destination when `None`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrainRequest {
    pub table_id: u64,
    pub generation: u64,
    pub dests: Option<Vec<u32>>,
    pub timeout_ms: u64,
    /// Not waiting for a destination that refuses the table's items (their sender holds them
    /// back: its replica there is fenced, awaiting a rebuild, or broken). For the checks before
    /// a repair, which such a replica fails anyway; never for the drain to a rebuild's source.
    #[serde(default)]
    pub skip_held_back: bool,
}

/// What a node that was asked did: `rows` of the replica (fence: before; install: after), or
/// why it could not (drain: what is still pending).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RepairReply {
    pub rows: Option<u64>,
    pub pending: Option<String>,
    /// Drain: how many `immediate` inserts into the table have started on the node.
    #[serde(default)]
    pub immediate_started: u64,
}

/// A fenced replica on this node.
#[derive(Debug)]
pub(crate) struct Fence {
    token: String,
    until: Option<Instant>,
    why: String,
}

impl Fence {
    fn live(&self) -> bool {
        self.until.is_none_or(|until| Instant::now() < until)
    }
}

/// The `immediate` inserts of this node whose replica writes (hand-offs included) are under
/// way, numbered as they start: a drain waits for those that started before it, without holding
/// up those that start after.
#[derive(Debug, Default)]
pub(crate) struct ImmediateWrites {
    next: std::sync::atomic::AtomicU64,
    running: std::sync::Mutex<std::collections::BTreeSet<u64>>,
    /// How many have started, by table incarnation: a repair that sees the count move while
    /// it checks knows the table is being written.
    started: std::sync::Mutex<std::collections::HashMap<(u64, u64), u64>>,
}

/// One write under way; it ends when dropped.
pub(crate) struct ImmediateWrite<'a> {
    writes: &'a ImmediateWrites,
    id: u64,
}

impl ImmediateWrites {
    /// Notes a write into table incarnation `table` that starts now.
    pub(crate) fn start(&self, table: (u64, u64)) -> ImmediateWrite<'_> {
        *lock(&self.started).entry(table).or_default() += 1;
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        lock(&self.running).insert(id);
        ImmediateWrite { writes: self, id }
    }

    /// How many writes into `table` have started on this node.
    fn started(&self, table: (u64, u64)) -> u64 {
        lock(&self.started).get(&table).copied().unwrap_or_default()
    }

    /// Forgets the counts of table incarnations not in `live` (dropped or truncated).
    pub(crate) fn forget_except(&self, live: &std::collections::HashSet<(u64, u64)>) {
        lock(&self.started).retain(|table, _| live.contains(table));
    }

    /// The number the next write gets: every one started so far has a lower one.
    fn next_id(&self) -> u64 {
        self.next.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether a write numbered below `id` is still under way.
    fn any_before(&self, id: u64) -> bool {
        lock(&self.running).first().is_some_and(|first| *first < id)
    }
}

impl Drop for ImmediateWrite<'_> {
    fn drop(&mut self) {
        lock(&self.writes.running).remove(&self.id);
    }
}

/// Reads the chunks of an image's rows one after the other.
struct Chunks(std::collections::VecDeque<bytes::Bytes>);

impl std::io::Read for Chunks {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while let Some(front) = self.0.front_mut() {
            if front.is_empty() {
                self.0.pop_front();
                continue;
            }
            let n = buf.len().min(front.len());
            buf[..n].copy_from_slice(&front.split_to(n));
            return Ok(n);
        }
        Ok(0)
    }
}

/// The directory a rebuilt replica of `dir` (`.../shard-<s>`) is written in before the swap.
fn rebuild_dir(dir: &Path) -> PathBuf {
    dir.with_extension("rebuild")
}

/// Where the replaced replica of `dir` goes during the swap.
fn replaced_dir(dir: &Path) -> PathBuf {
    dir.with_extension("replaced")
}

fn io_error(what: &str, path: &Path, e: impl std::fmt::Display) -> QueryError {
    QueryError::Storage(format!("{what} {}: {e}", path.display()))
}

fn sync_parent(dir: &Path) -> Result<(), QueryError> {
    match dir.parent() {
        Some(parent) => shardwise_cluster::datadir::sync_dir(parent).map_err(storage_error),
        None => Ok(()),
    }
}

fn remove_if_there(path: &Path) -> Result<bool, QueryError> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_error("remove", path, e)),
    }
}

/// Completes or undoes a swap of a rebuilt replica into `dir` that a crash cut short (see the
/// module doc); does nothing when there is none. Blocking.
pub(crate) fn finish_swap(dir: &Path) -> Result<(), QueryError> {
    let (rebuild, replaced) = (rebuild_dir(dir), replaced_dir(dir));
    if !dir.exists() && replaced.exists() {
        // Between the renames: the rebuild was complete before the first.
        let back = if rebuild.exists() { &rebuild } else { &replaced };
        std::fs::rename(back, dir).map_err(|e| io_error("rename into place", back, e))?;
        sync_parent(dir)?;
        tracing::warn!(dir = %dir.display(), "finished the swap of a rebuilt shard replica that a crash interrupted");
    }
    let mut removed = remove_if_there(&replaced)?;
    removed |= remove_if_there(&rebuild)?;
    if removed {
        sync_parent(dir)?;
    }
    Ok(())
}

/// Puts the complete, durable `rebuild_dir(dir)` in place of `dir` (see the module doc).
/// Blocking.
fn swap_in(dir: &Path) -> Result<(), QueryError> {
    let (rebuild, replaced) = (rebuild_dir(dir), replaced_dir(dir));
    if !dir.exists() {
        std::fs::create_dir_all(dir).map_err(|e| io_error("create", dir, e))?;
        sync_parent(dir)?;
    }
    std::fs::rename(dir, &replaced).map_err(|e| io_error("rename", dir, e))?;
    sync_parent(dir)?;
    std::fs::rename(&rebuild, dir).map_err(|e| io_error("rename", &rebuild, e))?;
    sync_parent(dir)?;
    remove_if_there(&replaced)?;
    sync_parent(dir)
}

impl TablesNode {
    /// Why the replica of `key` takes no reads or writes now, if it is fenced for a rebuild.
    pub(crate) fn fenced(&self, key: StoreKey) -> Option<String> {
        let fence = lock(&self.fences).get(&key).filter(|f| f.live()).map(|f| f.why.clone());
        fence.or_else(|| self.awaiting.why(key, self.rank))
    }

    /// Forgets the fence of `key` if it lapsed (its repair died part-way); the caller holds
    /// `opening` and is about to reopen the store.
    pub(crate) fn forget_lapsed_fence(&self, key: StoreKey) {
        let mut fences = lock(&self.fences);
        if fences.get(&key).is_some_and(|f| !f.live()) {
            fences.remove(&key);
        }
    }

    /// The table entry and store key a repair request names, checking this node holds it.
    async fn replica_here(&self, r: &ReplicaRef) -> Result<(CatalogEntry, StoreKey), QueryError> {
        let entry = self.incarnation_at(r.table_id, r.generation, r.catalog_version).await?;
        if !entry.def.replica_ranks(r.shard, self.world_size).contains(&self.rank) {
            return Err(QueryError::Rejected(format!(
                "rank {} holds no replica of table {} shard {}",
                self.rank, entry.def.name, r.shard
            )));
        }
        Ok((entry, (r.table_id, r.generation, r.shard)))
    }

    /// Step 1 on the rebuilt replica's node: fence it and retire its store.
    pub async fn repair_fence(&self, req: &FenceRequest) -> Result<RepairReply, QueryError> {
        let (entry, key) = self.replica_here(&req.replica).await?;
        let why = format!(
            "rank {}: its replica of table {} shard {} is being rebuilt (REPAIR TABLE)",
            self.rank, entry.def.name, key.2
        );
        let _opening = self.opening.lock().await;
        {
            let mut fences = lock(&self.fences);
            if let Some(other) = fences.get(&key).filter(|f| f.live() && f.token != req.token) {
                return Err(QueryError::Rejected(format!("{}; wait for it to end", other.why)));
            }
            let until = fence_lease(Duration::from_millis(req.timeout_ms));
            fences.insert(key, Fence { token: req.token.clone(), until, why: why.clone() });
        }
        let Some(store) = lock(&self.stores).get(&key).cloned() else { return Ok(RepairReply::default()) };
        let rows = blocking(move || {
            let mut guard = lock(&store);
            guard.retire(why);
            Ok(guard.stats().rows)
        })
        .await?;
        Ok(RepairReply { rows: Some(rows), ..RepairReply::default() })
    }

    /// Lifts this repair's fence (if it is still there) without installing anything: the old
    /// store goes back in service as it was before the fence. Not reopened from its files: they
    /// may be what was wrong with it (removed from under the node, whose memory still holds the
    /// rows), and a reopen would serve it with fewer rows than before the repair.
    pub async fn repair_unfence(&self, req: &FenceRequest) -> Result<RepairReply, QueryError> {
        let r = &req.replica;
        if !self.is_live(r.table_id, r.generation) {
            // Dropped or truncated meanwhile: its replicas (and their fences) are gone with it.
            lock(&self.fences).remove(&(r.table_id, r.generation, r.shard));
            return Ok(RepairReply::default());
        }
        let (_, key) = self.replica_here(&req.replica).await?;
        let _opening = self.opening.lock().await;
        {
            let mut fences = lock(&self.fences);
            if fences.get(&key).is_none_or(|f| f.token != req.token) {
                return Ok(RepairReply::default());
            }
            fences.remove(&key);
        }
        Ok(RepairReply { rows: self.unretire(key), ..RepairReply::default() })
    }

    /// Puts the retired store of `key` back in service, if there is one; its rows. The caller
    /// holds `opening`.
    pub(crate) fn unretire(&self, key: StoreKey) -> Option<u64> {
        let store = lock(&self.stores).get(&key).cloned()?;
        let mut guard = lock(&store);
        guard.unretire();
        Some(guard.stats().rows)
    }

    /// Reopens the store of `key` from its files in place of a retired one (the caller holds
    /// `opening`).
    async fn reopen_retired(&self, entry: &CatalogEntry, key: StoreKey) -> Result<RepairReply, QueryError> {
        let current = lock(&self.stores).get(&key).cloned();
        let retired = match &current {
            Some(store) => lock(store).is_retired(),
            None => true,
        };
        if !retired {
            return Ok(RepairReply::default());
        }
        let reopened = self.open_store(entry, key).await?;
        let rows = reopened.stats().rows;
        lock(&self.stores).insert(key, Arc::new(std::sync::Mutex::new(reopened)));
        lock(&self.reopen_attempts).remove(&key);
        Ok(RepairReply { rows: Some(rows), ..RepairReply::default() })
    }

    /// Step 2 on every node: waits until the table's items queued here before now have reached
    /// `req.dest` (every destination when `None`), up to the timeout; names what is left.
    pub async fn repair_drain(&self, req: &DrainRequest) -> Result<RepairReply, QueryError> {
        let incarnation = Some((req.table_id, req.generation));
        let deadline = Instant::now().checked_add(Duration::from_millis(req.timeout_ms));
        // `immediate` inserts under way finish first: one that wrote the fenced replica before
        // its fence may still be queueing a hand-off for a replica that missed its piece.
        let started_before = self.immediate_writes.next_id();
        loop {
            if !self.immediate_writes.any_before(started_before) {
                break;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                let pending = format!(
                    "rank {}: immediate inserts under way did not finish within repair_timeout_ms = {} ms",
                    self.rank, req.timeout_ms
                );
                return Ok(RepairReply { pending: Some(pending), ..RepairReply::default() });
            }
            tokio::time::sleep(Duration::from_millis(DRAIN_POLL_MS)).await;
        }
        let immediate_started = self.immediate_writes.started((req.table_id, req.generation));
        let below = lock_from_runtime(&self.outbox).next_seq();
        let mut last_membership_look = Instant::now();
        let dests: Vec<u32> = match &req.dests {
            Some(dests) => dests.clone(),
            None => (0..self.world_size).collect(),
        };
        loop {
            let waiting: Vec<u32> = {
                let outbox = lock_from_runtime(&self.outbox);
                let first = |dest| outbox.first_pending_seq(dest, |key| outbox_key_incarnation(key) == incarnation);
                let held = |dest| {
                    req.skip_held_back
                        && self.senders.holds_back(dest, |key| outbox_key_incarnation(key) == incarnation)
                };
                dests
                    .iter()
                    .copied()
                    .filter(|dest| first(*dest).is_some_and(|seq| seq < below) && !held(*dest))
                    .collect()
            };
            if waiting.is_empty() {
                return Ok(RepairReply { immediate_started, ..RepairReply::default() });
            }
            // Rows for a node the membership takes for down cannot be delivered: said now, not
            // at the end of the timeout.
            if last_membership_look.elapsed() >= Duration::from_millis(DOWN_POLL_MS) {
                last_membership_look = Instant::now();
                let members = self.cluster.members().await;
                let down: Vec<String> = waiting
                    .iter()
                    .filter(|dest| members.iter().any(|m| m.rank == **dest && m.state == NodeState::Down))
                    .map(|dest| {
                        format!("rank {} -> rank {dest}: rank {dest} is down (so the membership says)", self.rank)
                    })
                    .collect();
                if !down.is_empty() {
                    return Ok(RepairReply { pending: Some(down.join("; ")), ..RepairReply::default() });
                }
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                let lines: Vec<String> = waiting
                    .iter()
                    .map(|dest| {
                        let key = lock_from_runtime(&self.outbox)
                            .stats()
                            .into_keys()
                            .find(|(k, d)| d == dest && outbox_key_incarnation(k) == incarnation);
                        let last = key.and_then(|(k, _)| self.senders.last_error_noted(*dest, &k));
                        let last = last.map(|e| format!(" ({e})")).unwrap_or_default();
                        format!(
                            "rank {} -> rank {dest}: rows queued before the repair began are not delivered within \
                             repair_timeout_ms = {} ms{last}",
                            self.rank, req.timeout_ms
                        )
                    })
                    .collect();
                return Ok(RepairReply { pending: Some(lines.join("; ")), ..RepairReply::default() });
            }
            self.senders.hurry_all();
            tokio::time::sleep(Duration::from_millis(DRAIN_POLL_MS)).await;
        }
    }

    /// On the source replica's node: its image, encoded (header, then the rows as Arrow IPC).
    pub async fn repair_image(&self, r: &ReplicaRef) -> Result<(ImageHeader, Vec<u8>), QueryError> {
        let (entry, key) = self.replica_here(r).await?;
        let store = self.store(&entry, key.2).await?;
        let image = {
            let guard = lock(&store);
            let not_read = |why: String| {
                QueryError::Unavailable(format!(
                    "rank {}: its replica of table {} shard {} cannot be copied: {why}",
                    self.rank, entry.def.name, key.2
                ))
            };
            if let Some(why) = guard.unreadable().or_else(|| self.awaiting.released_why(key)) {
                return Err(not_read(why));
            }
            let missing = guard.missing_files().map_err(|e| not_read(e.to_string()))?;
            if !missing.is_empty() {
                return Err(not_read(format!("its files {} are gone", missing.join(", "))));
            }
            guard.image()
        };
        let schema = Arc::clone(&entry.def.schema);
        self.background.blocking(move || image.encode(&schema).map_err(storage_error)).await
    }

    /// Step 3 on the rebuilt replica's node: copies the source's image, writes it beside the
    /// fenced replica, swaps it in and lifts the fence.
    pub async fn repair_install(&self, req: &FenceRequest) -> Result<RepairReply, QueryError> {
        let (entry, key) = self.replica_here(&req.replica).await?;
        let Some(source) = req.source else {
            return Err(QueryError::Rejected("repair_install without a source rank".into()));
        };
        let lapsed = || {
            QueryError::Unavailable(format!(
                "rank {}: the fence of table {} shard {} lapsed or was lifted before its rebuild was installed \
                 (repair_timeout_ms = {} ms); nothing was changed",
                self.rank, entry.def.name, key.2, req.timeout_ms
            ))
        };
        let holds_fence = || lock(&self.fences).get(&key).is_some_and(|f| f.token == req.token && f.live());
        if !holds_fence() {
            return Err(lapsed());
        }
        let body = serde_json::to_vec(&req.replica).map_err(storage_error)?;
        let timeout = Duration::from_millis(req.timeout_ms);
        let results = self.peers.action_all(source, "repair_image", body, timeout).await.map_err(|e| {
            e.prefixed(&format!(
                "copying rank {source}'s replica (within repair_timeout_ms = {} ms) failed: ",
                req.timeout_ms
            ))
        })?;
        let mut results = results.into_iter();
        let header: ImageHeader = match results.next() {
            Some(first) => serde_json::from_slice(&first).map_err(|e| {
                QueryError::Unavailable(format!("rank {source} answered repair_image with a malformed header: {e}"))
            })?,
            None => return Err(QueryError::Unavailable(format!("rank {source}: repair_image: no reply"))),
        };
        // Read in place, chunk after chunk: the image is not copied into one buffer first.
        let rows = Chunks(results.collect());
        let dir = self.store_dir(key);
        let (schema, opts) = (Arc::clone(&entry.def.schema), self.settings.shard_store_options());
        let rebuild = rebuild_dir(&dir);
        let written = self.background.blocking(move || {
            let image = ReplicaImage::decode(header, rows, &schema).map_err(storage_error)?;
            super::durable_parents(&rebuild)?;
            remove_if_there(&rebuild)?;
            match ShardStore::create_from_image(&rebuild, Arc::new(RealFs), schema, opts, &image) {
                Ok(store) => Ok(store.stats().rows),
                Err(e) => {
                    // A full disk, say: what was written goes (a crash instead leaves it to the
                    // next open of the replica, `finish_swap`).
                    let _ = remove_if_there(&rebuild);
                    Err(storage_error(e))
                }
            }
        });
        let rows = written.await?;
        let _opening = self.opening.lock().await;
        // Dropped or truncated meanwhile: its files go (`remove_dropped`, which holds `opening`
        // while it deletes them, so it cannot run between this and the swap); no replica is
        // made again in their place.
        let live = self.is_live(key.0, key.1);
        if !holds_fence() || !live {
            let rebuild = rebuild_dir(&dir);
            blocking(move || {
                remove_if_there(&rebuild)?;
                // The table's directory, if the copy made it and nothing else is in it.
                if let Some(table_dir) = rebuild.parent() {
                    let _ = std::fs::remove_dir(table_dir);
                }
                Ok(())
            })
            .await?;
            return Err(match live {
                true => lapsed(),
                false => QueryError::Rejected(format!(
                    "table {} was dropped or truncated while its replica was rebuilt; nothing was installed",
                    entry.def.name
                )),
            });
        }
        lock(&self.fences).remove(&key);
        let swap_dir = dir.clone();
        if let Err(e) = blocking(move || swap_in(&swap_dir)).await {
            // The old store goes back in service as it was (its files may be what was wrong with
            // it); whatever the swap left on disk, the next open sorts out (`finish_swap`).
            self.unretire(key);
            return Err(e);
        }
        // A replacement node's replica serves from now on (`replaced.rs`).
        self.awaiting.done(key)?;
        let reopened = self.reopen_retired(&entry, key).await?;
        tracing::warn!(table = %entry.def.name, shard = key.2, source, rows, "shard replica rebuilt from another replica");
        Ok(RepairReply { rows: reopened.rows.or(Some(rows)), ..RepairReply::default() })
    }

    /// `REPAIR TABLE`: delivers the table's queued rows, checks it, then rebuilds each replica
    /// [`plan`] names, one at a time; every step bounded by `timeout` on each node.
    pub(crate) async fn repair_cluster(
        &self,
        table: &str,
        timeout: Duration,
        rebuild_rank: Option<u64>,
        judge: Judge,
    ) -> Result<Vec<ReplicaRepairRow>, QueryError> {
        if timeout.is_zero() {
            return Err(QueryError::Rejected(
                "repair_timeout_ms = 0: each step of a rebuild (delivering the queued rows, copying the replica) \
                 takes time; give it at least 1 ms (the default is 600000)"
                    .into(),
            ));
        }
        let (catalog_version, entry) = self.entry(table)?;
        let rebuild_rank = match rebuild_rank {
            Some(rank) if rank >= u64::from(self.world_size) => {
                return Err(QueryError::Rejected(format!(
                    "repair_rebuild_rank = {rank}: the cluster's ranks are 0 to {}",
                    self.world_size - 1
                )));
            }
            rank => rank.map(|r| r as u32),
        };
        // Rows on their way are delivered first (by the nodes that are up, to those that are
        // up), so that they do not count as differences.
        let members = self.cluster.members().await;
        let up: Vec<u32> = (0..self.world_size)
            .filter(|rank| !members.iter().any(|m| m.rank == *rank && m.state == NodeState::Down))
            .collect();
        let timeout_ms = timeout.as_millis().min(u64::MAX as u128) as u64;
        let dests = Some(up.clone());
        // After a lost node (`Judge::MostRows`) the fullest replica is copied over the others, so
        // rows held back for a replica must have reached it first: its sender may have been holding
        // them while it awaited its rebuild, and the fullest is only the one with every row once
        // each node has delivered everything it queued.
        let skip_held_back = !matches!(judge, Judge::MostRows);
        let drain =
            DrainRequest { table_id: entry.id, generation: entry.generation, dests, timeout_ms, skip_held_back };
        let (checked, writes_seen) = self.settled_check(table, &up, &drain, timeout).await?;
        let mut out = Vec::with_capacity(checked.len());
        for (row, decision) in checked.iter().zip(plan(&checked, rebuild_rank, writes_seen, judge)) {
            let source = match decision {
                Decision::Rebuild(source) => Some(source),
                _ => None,
            };
            let outcome = match decision {
                Decision::Keep => Outcome::Kept(row.message.clone()),
                Decision::Reference(target, why) => Outcome::Kept(format!(
                    "kept: the copy for rank {target}'s replica, {why} (the check said: {})",
                    check_said(row)
                )),
                Decision::Leave(why) => Outcome::Left(why),
                Decision::Rebuild(source) => {
                    let replica = ReplicaRef {
                        table_id: entry.id,
                        generation: entry.generation,
                        catalog_version,
                        shard: row.shard,
                    };
                    // In a task of its own: a statement stopped part-way (KILL QUERY, its client
                    // gone) does not leave the replica fenced until the fence lapses.
                    let node =
                        self.me.upgrade().ok_or_else(|| QueryError::Unavailable("the node is stopping".into()))?;
                    let (entry, target) = (entry.clone(), row.rank);
                    let rebuilt =
                        tokio::spawn(async move { node.rebuild(&entry, replica, target, source, timeout).await });
                    let rebuilt =
                        rebuilt.await.unwrap_or_else(|e| Err(QueryError::Storage(format!("the rebuild failed: {e}"))));
                    rebuilt.map_or_else(|e| Outcome::Failed(e.to_string()), Outcome::Rebuilt)
                }
            };
            out.push(repair_row(row, source, outcome));
        }
        Ok(out)
    }

    /// The check `REPAIR TABLE` judges by. While the table is written, replicas read a moment
    /// apart can differ by rows on their way to one of them; a replica that lost rows, or
    /// holds rows the others never get, differs every time. So the table's queued rows are
    /// delivered and it is checked up to [`REPAIR_CHECK_ROUNDS`] times: a shard whose replicas
    /// agreed in any round is taken as it was then, and only shards that differed in every
    /// round (or had a replica that could not be read) are judged on the last.
    async fn settled_check(
        &self,
        table: &str,
        up: &[u32],
        drain: &DrainRequest,
        timeout: Duration,
    ) -> Result<(Vec<ReplicaCheckRow>, bool), QueryError> {
        let mut agreed: BTreeMap<u32, Vec<ReplicaCheckRow>> = BTreeMap::new();
        let mut last = Vec::new();
        let (mut first_started, mut writes_seen) = (None, false);
        for _ in 0..REPAIR_CHECK_ROUNDS {
            let started = self.drain_on(up, drain, timeout).await?;
            // `immediate` inserts started between two rounds: differences may be inserts that
            // reached one replica and not yet the other when it was read.
            writes_seen |= first_started.is_some_and(|first| started > first);
            first_started.get_or_insert(started);
            last = self.check_cluster(table, timeout).await?;
            // Delayed inserts queued since the delivery (the check names them for each replica
            // they are queued for): the table is being written, as above.
            writes_seen |= last.iter().any(|r| r.message.contains(check_table::QUEUED_NOTE));
            let mut by_shard: BTreeMap<u32, Vec<ReplicaCheckRow>> = BTreeMap::new();
            for row in &last {
                by_shard.entry(row.shard).or_default().push(row.clone());
            }
            let mut unsettled = false;
            for (shard, rows) in by_shard {
                if rows.iter().all(|r| r.is_passed) {
                    agreed.entry(shard).or_insert(rows);
                } else if !agreed.contains_key(&shard) && rows.iter().all(|r| r.rows.is_some()) {
                    // Every replica read, and they differ: maybe rows on their way.
                    unsettled = true;
                }
            }
            if !unsettled {
                break;
            }
        }
        // Each replica as the round its shard agreed in saw it, else as the last round did.
        let settled = last.into_iter().map(|row| {
            let agreed_then = agreed.get(&row.shard).and_then(|rows| rows.iter().find(|r| r.rank == row.rank));
            agreed_then.cloned().unwrap_or(row)
        });
        Ok((settled.collect(), writes_seen))
    }

    /// Rebuilds the replica on `target` from the one on `source` (the module doc's steps).
    async fn rebuild(
        &self,
        entry: &CatalogEntry,
        replica: ReplicaRef,
        target: u32,
        source: u32,
        timeout: Duration,
    ) -> Result<u64, QueryError> {
        let timeout_ms = timeout.as_millis().min(u64::MAX as u128) as u64;
        let token = uuid::Uuid::new_v4().simple().to_string();
        let fence = FenceRequest { replica: replica.clone(), token, timeout_ms, source: None };
        self.ask(target, "repair_fence", &fence, timeout, self.repair_fence(&fence)).await?;
        let drain = DrainRequest {
            table_id: entry.id,
            generation: entry.generation,
            dests: Some(vec![source]),
            timeout_ms,
            skip_held_back: false,
        };
        let install = FenceRequest { source: Some(source), ..fence.clone() };
        let all: Vec<u32> = (0..self.world_size).collect();
        let result = match self.drain_on(&all, &drain, timeout).await {
            Ok(_) => self.ask(target, "repair_install", &install, timeout, self.repair_install(&install)).await,
            Err(e) => Err(e),
        };
        match result {
            Ok(reply) => Ok(reply.rows.unwrap_or_default()),
            Err(e) => {
                if let Err(lift) =
                    self.ask(target, "repair_unfence", &fence, timeout, self.repair_unfence(&fence)).await
                {
                    tracing::warn!(table = %entry.def.name, shard = replica.shard, target, "could not lift the fence: {lift}");
                }
                Err(e)
            }
        }
    }

    /// Step 2 on `ranks` at once; an error names each node that could not finish it.
    /// Returns how many `immediate` inserts into the table have started on those nodes.
    async fn drain_on(&self, ranks: &[u32], req: &DrainRequest, timeout: Duration) -> Result<u64, QueryError> {
        let calls = ranks.iter().map(|rank| self.ask(*rank, "repair_drain", req, timeout, self.repair_drain(req)));
        let mut left = Vec::new();
        let mut immediate_started = 0u64;
        for reply in futures::future::join_all(calls).await {
            match reply {
                Ok(RepairReply { pending: Some(pending), .. }) => left.push(pending),
                Ok(reply) => immediate_started = immediate_started.saturating_add(reply.immediate_started),
                Err(e) => left.push(e.to_string()),
            }
        }
        match left.is_empty() {
            true => Ok(immediate_started),
            false => Err(QueryError::Unavailable(format!(
                "rows of the table queued before the repair began could not all be delivered: {}",
                left.join("; ")
            ))),
        }
    }

    /// A repair step on `rank` ([`TablesNode::share_on`]).
    async fn ask<T: serde::de::DeserializeOwned>(
        &self,
        rank: u32,
        kind: &str,
        req: &impl Serialize,
        timeout: Duration,
        local: impl std::future::Future<Output = Result<T, QueryError>>,
    ) -> Result<T, QueryError> {
        let body = serde_json::to_vec(req).map_err(storage_error)?;
        let members = self.cluster.members().await;
        let known_down = members.iter().any(|m| m.rank == rank && m.state == NodeState::Down);
        let share = PeerShare {
            kind,
            body,
            timeout,
            setting: "repair_timeout_ms",
            known_down,
            if_down: ", so the repair cannot go on",
            unknown: ", so the repair cannot go on",
        };
        let call = self.share_on(rank, share, local);
        if rank == self.rank {
            return call.await;
        }
        // A node that stops answering part-way is given up on as soon as the membership takes it
        // for down, not only at the end of `repair_timeout_ms` (ten minutes by default).
        tokio::select! {
            reply = call => reply,
            () = self.until_down(rank) => Err(QueryError::Unavailable(format!(
                "rank {rank} went down (so the membership says) during the repair, so the repair cannot go on"
            ))),
        }
    }

    /// Resolves once the membership takes `rank` for down (looked at every
    /// [`DOWN_POLL_MS`]).
    async fn until_down(&self, rank: u32) {
        loop {
            tokio::time::sleep(Duration::from_millis(DOWN_POLL_MS)).await;
            let members = self.cluster.members().await;
            if members.iter().any(|m| m.rank == rank && m.state == NodeState::Down) {
                return;
            }
        }
    }
}

/// What `REPAIR TABLE` does with one replica.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Decision {
    /// It passed the check.
    Keep,
    /// Copy the replica on this rank over it.
    Rebuild(u32),
    /// It failed the check only by differing from the replica on `repair_rebuild_rank` (this
    /// rank), which is made the same as it: kept.
    Reference(u32, &'static str),
    /// It failed the check, and nothing says which replica to copy: why.
    Leave(String),
}

/// The decision for each of `rows` (a check's answer, grouped by shard): a replica that failed
/// is rebuilt from one of its shard that passed, one not on `rebuild_rank` first. Where none
/// passed (two replicas that differ), the replicas on `rebuild_rank` are rebuilt from the
/// shard's others that were read, if those agree; otherwise the replica is left as it is.
fn plan(rows: &[ReplicaCheckRow], rebuild_rank: Option<u32>, writes_seen: bool, judge: Judge) -> Vec<Decision> {
    let content = |r: &ReplicaCheckRow| r.rows.zip(r.checksum);
    rows.iter()
        .map(|row| {
            if let (Judge::MostRows, None, false) = (judge, rebuild_rank, writes_seen) {
                let shard: Vec<&ReplicaCheckRow> = rows.iter().filter(|o| o.shard == row.shard).collect();
                if let Some(fullest) = fullest_sound(&shard) {
                    return match row.rank == fullest {
                        true => match shard.iter().find(|o| o.rank != fullest) {
                            Some(other) => Decision::Reference(other.rank, "from this one, which holds the most rows"),
                            None => Decision::Keep,
                        },
                        false => Decision::Rebuild(fullest),
                    };
                }
            }
            if row.is_passed {
                return Decision::Keep;
            }
            // Released empty after every replica of its shard was lost (`replaced.rs`): it may hold
            // rows the others never received (queued for it alone), so no copy goes over it until
            // its node lifts the mark.
            if row.message.contains(super::replaced::RELEASED_MARK) {
                return Decision::Leave(
                    "it started empty after every replica of its shard was lost, and is not copied over until no \
                     other replica of the shard awaits a rebuild"
                        .into(),
                );
            }
            // Unread because its node did not answer: what it holds is unknown, and it may be
            // the only right copy (the one read may be a replica that lost its files).
            if row.rows.is_none() && !row.replica_fault {
                return Decision::Leave(format!(
                    "its node did not let it be read, so what it holds is unknown; run REPAIR TABLE again when rank {} \
                     answers",
                    row.rank
                ));
            }
            let shard: Vec<&ReplicaCheckRow> = rows.iter().filter(|o| o.shard == row.shard).collect();
            let passed = shard.iter().filter(|o| o.is_passed && o.rank != row.rank);
            let mut passed: Vec<u32> = passed.map(|o| o.rank).collect();
            passed.sort_by_key(|rank| Some(*rank) == rebuild_rank);
            // `immediate` inserts went on while the table was checked: a replica read that
            // differs may be one an insert under way had not reached yet.
            let under_way = format!(
                "its shard's replicas differed in each of {REPAIR_CHECK_ROUNDS} checks, but inserts into the table \
                 went on meanwhile (immediate ones, or delayed ones queued after the delivery), so the difference may \
                 be inserts under way: run REPAIR TABLE again when they pause (CHECK TABLE then shows whether it \
                 lasts)"
            );
            let maybe_under_way =
                writes_seen && content(row).is_some() && !row.suspect && rebuild_rank != Some(row.rank);
            if let Some(source) = passed.first() {
                return match maybe_under_way {
                    true => Decision::Leave(under_way),
                    false => Decision::Rebuild(*source),
                };
            }
            // A rank named to rebuild that holds none of this shard's replicas says nothing about it.
            let names_this_shard = rebuild_rank.is_some_and(|r| shard.iter().any(|o| o.rank == r));
            if writes_seen && !names_this_shard && shard.iter().all(|o| !o.suspect) {
                return Decision::Leave(under_way);
            }
            let hint = format!(
                "no replica of shard {} passed the check (in any of {REPAIR_CHECK_ROUNDS} checks, each after the \
                 table's queued rows were delivered, so not rows on their way), so nothing says which is right: if \
                 the replicas on one rank lost rows (its disk was replaced, its files removed), SETTINGS \
                 repair_rebuild_rank = <that rank> rebuilds them from the others; if an insert failed part-way, \
                 retry it with its insert_id",
                row.shard
            );
            // Replicas whose opening cut a WAL record that failed its checksum (damage, maybe, to
            // rows they acknowledged) differ from the others, which agree: those are the copy,
            // when they hold more rows than every suspect one (a cut record can only have lost
            // rows; a partner with fewer is the one that lost more, its files, say).
            let sound: Vec<&&ReplicaCheckRow> = shard.iter().filter(|o| !o.suspect && content(o).is_some()).collect();
            let suspects: Vec<&&ReplicaCheckRow> = shard.iter().filter(|o| o.suspect && content(o).is_some()).collect();
            let agreed = sound.first().filter(|f| sound.iter().all(|o| content(o) == content(f)));
            let fuller = |f: &&&ReplicaCheckRow| suspects.iter().all(|o| o.rows < f.rows);
            if let Some(first) = agreed.filter(|f| rebuild_rank.is_none() && !suspects.is_empty() && fuller(f)) {
                return match row.suspect {
                    true => Decision::Rebuild(first.rank),
                    false => Decision::Reference(suspects[0].rank, "which is suspect"),
                };
            }
            let Some(named) = rebuild_rank.filter(|r| shard.iter().any(|o| o.rank == *r)) else {
                return Decision::Leave(hint);
            };
            let others: Vec<&&ReplicaCheckRow> =
                shard.iter().filter(|o| o.rank != named && content(o).is_some()).collect();
            if row.rank != named {
                // One of the copies the named rank's replica is made the same as: kept.
                let agree = others.iter().all(|o| content(o) == content(row));
                return match agree && content(row).is_some() {
                    true => Decision::Reference(named, "named by repair_rebuild_rank"),
                    false => Decision::Leave(hint),
                };
            }
            match others.first() {
                Some(first) if others.iter().all(|o| content(o) == content(first)) => {
                    match content(row) == content(first) {
                        true => Decision::Keep,
                        false => Decision::Rebuild(first.rank),
                    }
                }
                Some(_) => Decision::Leave(format!(
                    "the replicas of shard {} on other ranks than repair_rebuild_rank differ too, so none can be \
                     copied",
                    row.shard
                )),
                None => Decision::Leave(format!(
                    "no other replica of shard {} was read, so there is nothing to copy",
                    row.shard
                )),
            }
        })
        .collect()
}

/// Which replica of a shard whose replicas differ `REPAIR TABLE` takes for the right one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Judge {
    /// The replicas that agree with the majority of their shard's (`CHECK TABLE`'s verdict);
    /// without a majority, none (unless `repair_rebuild_rank` names the rank to rebuild).
    Majority,
    /// The replica that holds the most rows, when every replica was read whole, none is suspect
    /// and no other holds as many (else as `Majority`). Right after a node's data dir was lost
    /// (`replaced.rs`): the lost node had delivered its queued rows to some replicas and not
    /// others, and since each node delivers to each replica in order, the one that got the most
    /// of them holds every row the others hold, and more, even where the others are a majority.
    MostRows,
}

/// The replica of `shard` (its rank) that holds the most rows, when every replica was read,
/// none is suspect, and no other holds as many (so not when they all agree).
fn fullest_sound(shard: &[&ReplicaCheckRow]) -> Option<u32> {
    if shard.iter().any(|o| o.suspect || o.replica_fault || o.rows.is_none() || o.checksum.is_none()) {
        return None;
    }
    let most = shard.iter().filter_map(|o| o.rows).max()?;
    let mut fullest = shard.iter().filter(|o| o.rows == Some(most));
    match (fullest.next(), fullest.next()) {
        (Some(only), None) => Some(only.rank),
        _ => None,
    }
}

/// What the repair did with one replica.
enum Outcome {
    /// Nothing; what there is to say.
    Kept(String),
    /// Rebuilt: its rows now.
    Rebuilt(u64),
    /// It failed the check, and nothing said which replica to copy over it: why.
    Left(String),
    /// Its rebuild was tried and did not finish: why.
    Failed(String),
}

/// The answer row of one replica: what its check said and what the repair did.
fn repair_row(row: &ReplicaCheckRow, source: Option<u32>, outcome: Outcome) -> ReplicaRepairRow {
    let (action, source_rank, rows, message) = match outcome {
        Outcome::Kept(message) => ("none", None, row.rows, message),
        Outcome::Rebuilt(rows) => ("rebuilt", source, Some(rows), format!("was: {}", check_said(row))),
        Outcome::Left(why) => ("left", None, row.rows, format!("{why} (the check said: {})", check_said(row))),
        Outcome::Failed(e) => ("failed", source, row.rows, format!("{e} (the check said: {})", check_said(row))),
    };
    ReplicaRepairRow {
        shard: row.shard,
        replica: row.replica,
        rank: row.rank,
        action: action.to_string(),
        source_rank,
        rows,
        message,
    }
}

fn check_said(row: &ReplicaCheckRow) -> String {
    let rows = row.rows.map(|r| format!("{r} rows; ")).unwrap_or_default();
    format!("{rows}{}", row.message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(root: &Path) -> BTreeMap<String, Vec<String>> {
        let mut out = BTreeMap::new();
        for dir in std::fs::read_dir(root).into_iter().flatten().flatten() {
            let files = std::fs::read_dir(dir.path()).into_iter().flatten().flatten();
            let names = files.map(|f| f.file_name().to_string_lossy().to_string()).collect();
            out.insert(dir.file_name().to_string_lossy().to_string(), names);
        }
        out
    }

    fn make(dir: &Path, file: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(file), b"x").unwrap();
    }

    /// A checked replica; unread ones (`content` `None`) were damaged.
    fn row(shard: u32, rank: u32, content: Option<(u64, u64)>, is_passed: bool) -> ReplicaCheckRow {
        ReplicaCheckRow {
            shard,
            replica: 0,
            rank,
            rows: content.map(|c| c.0),
            checksum: content.map(|c| c.1),
            is_passed,
            message: String::new(),
            replica_fault: content.is_none(),
            suspect: false,
        }
    }

    #[test]
    fn a_replica_released_after_loss_is_not_copied_over() {
        let released = ReplicaCheckRow {
            message: format!("rank 2: its replica of shard 0 {} (...)", super::super::replaced::RELEASED_MARK),
            ..row(0, 2, None, false)
        };
        for judge in [Judge::Majority, Judge::MostRows] {
            let decided = plan(&[row(0, 0, Some((5, 1)), true), released.clone()], None, false, judge);
            assert!(matches!(decided[..], [Decision::Keep, Decision::Leave(_)]), "{judge:?}: {decided:?}");
            // Not even when told to rebuild that rank.
            let decided = plan(&[row(0, 0, Some((5, 1)), true), released.clone()], Some(2), false, judge);
            assert!(matches!(decided[1], Decision::Leave(_)), "{judge:?}: {decided:?}");
        }
        // Without the mark, the same unread replica is rebuilt from the one that passed.
        let decided = plan(&[row(0, 0, Some((5, 1)), true), row(0, 2, None, false)], None, false, Judge::Majority);
        assert_eq!(decided, [Decision::Keep, Decision::Rebuild(0)]);
    }

    #[test]
    fn failed_replicas_are_rebuilt_from_passed_ones_and_without_a_majority_only_when_told() {
        use Decision::{Keep, Leave, Rebuild, Reference};
        const L: Judge = Judge::Majority;
        let leave = |d: &Decision| matches!(d, Leave(_));
        // Shard 0: the majority passes, the odd one is copied over from one of it. Shard 1: an
        // unread (damaged) replica beside one that passed.
        let rows = [
            row(0, 0, Some((5, 1)), true),
            row(0, 1, Some((5, 1)), true),
            row(0, 2, Some((4, 2)), false),
            row(1, 1, None, false),
            row(1, 2, Some((3, 3)), true),
        ];
        assert_eq!(plan(&rows, None, false, L), [Keep, Keep, Rebuild(0), Rebuild(2), Keep]);
        // A source not on the rank named to rebuild comes first.
        let rows = [row(0, 0, Some((5, 1)), true), row(0, 1, Some((5, 1)), true), row(0, 2, None, false)];
        assert_eq!(plan(&rows, Some(0), false, L), [Keep, Keep, Rebuild(1)]);
        // Two replicas that differ: left, unless one's rank is named; then it is rebuilt from
        // the other.
        let rows = [row(0, 0, Some((5, 1)), false), row(0, 2, Some((0, 0)), false)];
        let decided = plan(&rows, None, false, L);
        assert!(decided.iter().all(leave), "{decided:?}");
        let Leave(why) = &decided[0] else { unreachable!() };
        assert!(why.contains("repair_rebuild_rank"), "{why}");
        assert_eq!(plan(&rows, Some(2), false, L), [Reference(2, "named by repair_rebuild_rank"), Rebuild(0)]);
        // Three that all differ, rank 2 named: the other two differ too, so nothing to copy.
        let rows = [row(0, 0, Some((5, 1)), false), row(0, 1, Some((6, 1)), false), row(0, 2, Some((0, 0)), false)];
        assert!(plan(&rows, Some(2), false, L).iter().all(leave));
        // Two that differ, one of them suspect (its WAL's last record was cut for failing its
        // checksum): it is rebuilt from the other without naming its rank.
        let suspect = ReplicaCheckRow { suspect: true, ..row(0, 2, Some((0, 0)), false) };
        let decided = plan(&[row(0, 0, Some((5, 1)), false), suspect.clone()], None, false, L);
        assert_eq!(decided, [Reference(2, "which is suspect"), Rebuild(0)]);
        // A suspect replica beside one that holds fewer rows (it lost its files): that one lost
        // more, and is not copied over the suspect one.
        let fuller_suspect = ReplicaCheckRow { suspect: true, ..row(0, 2, Some((9, 3)), false) };
        let decided = plan(&[row(0, 0, Some((0, 0)), false), fuller_suspect], None, false, L);
        assert!(decided.iter().all(leave), "{decided:?}");
        // Immediate inserts went on during the checks: a replica read that differs is not
        // rebuilt (it may be an insert under way), a damaged one still is, and one named is.
        let rows = [row(0, 0, Some((5, 1)), true), row(0, 1, Some((5, 1)), true), row(0, 2, Some((4, 2)), false)];
        let decided = plan(&rows, None, true, L);
        assert!(leave(&decided[2]), "{decided:?}");
        let Leave(why) = &decided[2] else { unreachable!() };
        assert!(why.contains("inserts under way"), "{why}");
        assert_eq!(plan(&rows, Some(2), true, L)[2], Rebuild(0));
        let rows = [row(0, 0, Some((5, 1)), true), row(0, 2, None, false)];
        assert_eq!(plan(&rows, None, true, L), [Keep, Rebuild(0)]);
        let rows = [row(0, 0, Some((5, 1)), false), row(0, 2, Some((4, 2)), false)];
        assert!(plan(&rows, None, true, L).iter().all(leave));
        // A rank named that holds none of the shard's replicas says nothing about it: the same
        // "under way" as without it (it said "not rows on their way", and to name a rank).
        let named_elsewhere = plan(&rows, Some(1), true, L);
        assert_eq!(named_elsewhere, plan(&rows, None, true, L));
        let Leave(why) = &named_elsewhere[0] else { unreachable!() };
        assert!(why.contains("inserts under way") && !why.contains("not rows on their way"), "{why}");
        // Both suspect: nothing says.
        let both = [ReplicaCheckRow { suspect: true, ..row(0, 0, Some((5, 1)), false) }, suspect];
        assert!(plan(&both, None, false, L).iter().all(leave));
        // Nothing read: nothing to copy.
        let rows = [row(0, 1, None, false), row(0, 2, None, false)];
        let decided = plan(&rows, Some(2), false, L);
        assert!(decided.iter().all(leave), "nothing read, nothing to copy: {decided:?}");
        // A replica whose node did not answer is left, even beside one that passed: the one
        // read may be the copy that lost rows.
        let unanswered = ReplicaCheckRow { replica_fault: false, ..row(0, 0, None, false) };
        let decided = plan(&[unanswered, row(0, 2, Some((0, 0)), true)], None, false, L);
        assert!(leave(&decided[0]) && decided[1] == Keep, "{decided:?}");
        let Leave(why) = &decided[0] else { unreachable!() };
        assert!(why.contains("when rank 0 answers"), "{why}");
        // After a lost node (`Judge::MostRows`): two sound replicas that differ, the
        // fuller copied over the other; not when one is suspect, unread, or two hold as many.
        let most = Judge::MostRows;
        let rows = [row(0, 0, Some((3, 1)), true), row(0, 1, Some((5, 2)), false), row(0, 2, Some((3, 1)), true)];
        assert_eq!(
            plan(&rows, None, false, most),
            [Rebuild(1), Reference(0, "from this one, which holds the most rows"), Rebuild(1)]
        );
        let tied = [row(0, 0, Some((5, 1)), false), row(0, 1, Some((5, 2)), false)];
        assert!(plan(&tied, None, false, most).iter().all(leave));
        let with_suspect =
            [row(0, 0, Some((3, 1)), false), ReplicaCheckRow { suspect: true, ..row(0, 1, Some((5, 2)), false) }];
        assert!(plan(&with_suspect, None, false, most)[0] != Rebuild(1));
        let unread = [row(0, 0, Some((3, 1)), false), row(0, 1, None, false)];
        assert!(plan(&unread, None, false, most)[0] != Rebuild(1));
        // Immediate inserts under way: judged by the majority, as without it.
        assert_eq!(plan(&rows, None, true, most), plan(&rows, None, true, L));
    }

    #[test]
    fn a_drain_waits_for_the_immediate_writes_started_before_it_only() {
        let writes = ImmediateWrites::default();
        let first = writes.start((1, 0));
        let before = writes.next_id();
        let second = writes.start((2, 0));
        assert!(writes.any_before(before));
        drop(first);
        assert!(!writes.any_before(before), "the one started later does not count");
        assert!(writes.any_before(writes.next_id()));
        drop(second);
        assert!(!writes.any_before(writes.next_id()));
        assert_eq!((writes.started((1, 0)), writes.started((2, 0)), writes.started((3, 0))), (1, 1, 0));
    }

    #[test]
    fn an_image_decodes_from_chunks_of_any_size() {
        use datafusion::arrow::array::{Int64Array, RecordBatch};
        use datafusion::arrow::datatypes::{DataType, Field, Schema};
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true)]));
        let batches = (0..3)
            .map(|i| {
                RecordBatch::try_new(
                    Arc::clone(&schema),
                    vec![Arc::new(Int64Array::from_iter_values(i * 100..i * 100 + 100))],
                )
            })
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let image = ReplicaImage {
            batches,
            hwm: BTreeMap::from([("o".into(), 7)]),
            insert_ids: vec!["i".into()],
            verified_placement: true,
        };
        let (header, rows) = image.encode(&schema).unwrap();
        for size in [1, 7, 4096, rows.len()] {
            let chunks = rows.chunks(size).map(bytes::Bytes::copy_from_slice).collect();
            let decoded = ReplicaImage::decode(header.clone(), Chunks(chunks), &schema).unwrap();
            let rows: usize = decoded.batches.iter().map(|b| b.num_rows()).sum();
            assert_eq!((rows, decoded.hwm.get("o")), (300, Some(&7)), "chunks of {size}");
        }
    }

    #[test]
    fn a_swap_cut_short_at_any_point_is_completed_or_undone() {
        let root = std::env::temp_dir().join(format!("shardwise-swap-{}", uuid::Uuid::new_v4().simple()));
        let dir = root.join("shard-0");
        let want_new = BTreeMap::from([("shard-0".to_string(), vec!["new".to_string()])]);
        let want_old = BTreeMap::from([("shard-0".to_string(), vec!["old".to_string()])]);
        // Before the first rename (rebuild written, maybe partly): the old replica stays.
        make(&dir, "old");
        make(&rebuild_dir(&dir), "new");
        finish_swap(&dir).unwrap();
        assert_eq!(tree(&root), want_old);
        // Between the renames: the rebuild goes in.
        std::fs::rename(&dir, replaced_dir(&dir)).unwrap();
        make(&rebuild_dir(&dir), "new");
        finish_swap(&dir).unwrap();
        assert_eq!(tree(&root), want_new);
        // After the second rename, before the old one was deleted.
        make(&replaced_dir(&dir), "old");
        finish_swap(&dir).unwrap();
        assert_eq!(tree(&root), want_new);
        // A whole swap, and one into a replica that never had a directory.
        make(&rebuild_dir(&dir), "newer");
        swap_in(&dir).unwrap();
        assert_eq!(tree(&root), BTreeMap::from([("shard-0".to_string(), vec!["newer".to_string()])]));
        std::fs::remove_dir_all(&dir).unwrap();
        make(&rebuild_dir(&dir), "new");
        swap_in(&dir).unwrap();
        assert_eq!(tree(&root), want_new);
        // Nothing to do.
        finish_swap(&dir).unwrap();
        assert_eq!(tree(&root), want_new);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
