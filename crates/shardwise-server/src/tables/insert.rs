//! The initiator's side of an insert: check the rows against the table, cut them into chunks,
//! place every row on its shard, and then, by the table's sync mode:
//! - `immediate`: write each chunk's pieces to every replica at once and acknowledge when
//!   `insert_quorum` replicas of every shard have them durable; a replica that missed its piece
//!   while the quorum was met gets it through this node's outbox (hinted handoff);
//! - `delay_mode_distributed`: append each chunk's pieces to the outbox (fsynced) and
//!   acknowledge; the senders ship them.
//!
//! Every piece carries `insert_id/chunk` as its dedup key, so a retried insert (same id, same
//! rows) is applied once by every shard replica, however far the first attempt got.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::compute::interleave_record_batch;
use datafusion::arrow::record_batch::RecordBatch;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use shardwise_cluster::{ClusterView, MemberInfo, NodeState};
use shardwise_query::{InsertOptions, QueryError};
use shardwise_storage::{CatalogEntry, OutboxItem, StorageError, SyncMode};

use super::chunks::{chunk_max_bytes, chunks};
use super::{TablesNode, outbox_holders, outbox_key, run_locked_short, storage_error};
use crate::codec::{PieceSet, PieceSetHeader, ShipItem, ShipRequest};
use crate::ingest::client_insert_id;

/// The longest insert id accepted.
pub const INSERT_ID_MAX_BYTES: usize = 256;

/// Checks an insert id a client gave (`SETTINGS insert_id`, the ingest option, `shardwise load
/// --insert-id`): 1 to [`INSERT_ID_MAX_BYTES`] bytes. An empty one would dedup nothing.
pub fn check_insert_id(insert_id: &str) -> Result<(), String> {
    match insert_id.len() {
        0 => Err(format!(
            "insert_id is empty; give 1 to {INSERT_ID_MAX_BYTES} bytes, or no insert_id for a new one per insert"
        )),
        n if n > INSERT_ID_MAX_BYTES => {
            Err(format!("insert_id must be 1 to {INSERT_ID_MAX_BYTES} bytes, got {n} bytes"))
        }
        // `id/chunk` and `id/seg-k/chunk` are the keys of an insert's pieces: an id with a slash
        // could name another insert's piece.
        _ if insert_id.contains('/') => Err(format!(
            "insert_id {insert_id:?} contains '/', which shardwise uses to name the chunks and segments of an insert"
        )),
        _ => Ok(()),
    }
}

/// An insert's error when its table was dropped, or dropped and created again, or truncated,
/// while it ran.
fn gone_meanwhile(table: &str) -> QueryError {
    QueryError::Rejected(format!(
        "table {table} was dropped, or dropped and created again, or truncated, while this insert ran: rows it \
         stored before that (if any) went with the table as it was; nothing more was written"
    ))
}

/// One chunk of an insert, placed: the pieces each destination rank gets.
struct PlacedChunk {
    index: u64,
    /// Destination rank -> its piece set.
    by_rank: BTreeMap<u32, PieceSet>,
    /// Shard -> rows in that shard's piece.
    shard_rows: BTreeMap<u32, u64>,
}

impl TablesNode {
    pub(crate) async fn insert_batches(
        &self,
        table: &str,
        batches: Vec<RecordBatch>,
        opts: InsertOptions,
    ) -> Result<u64, QueryError> {
        // The catalog as new as the master's first: a node that was paused or cut off may have
        // missed a DROP and CREATE of this very table (and one with no master refuses).
        self.metadata.ensure_current(true).await?;
        // An insert bound to the table it was planned against (`INSERT ... SELECT`, a load) goes
        // there under whatever name it has now (renamed, exchanged), and never to another table
        // that took its name.
        let (catalog_version, entry) = match opts.incarnation {
            Some((id, generation)) => self.entry_of_incarnation(id, generation).ok_or_else(|| gone_meanwhile(table))?,
            None => self.entry(table)?,
        };
        let current_name = entry.def.name.clone();
        let table = current_name.as_str();
        let batches = conform(&entry, batches)?;
        let insert_id = match opts.insert_id {
            Some(id) => {
                check_insert_id(client_insert_id(&id)).map_err(QueryError::Rejected)?;
                id
            }
            None => uuid::Uuid::new_v4().to_string(),
        };
        let total_rows: u64 = batches.iter().map(|b| b.num_rows() as u64).sum();
        if total_rows == 0 {
            return Ok(0);
        }
        let quorum = match (entry.def.sync_mode, opts.insert_quorum) {
            (_, Some(q)) if q == 0 || q > entry.def.replicas => {
                return Err(QueryError::Rejected(format!(
                    "insert_quorum = {q}: table {table} has {} replicas; give 1 to {}",
                    entry.def.replicas, entry.def.replicas
                )));
            }
            (_, Some(q)) => q,
            (_, None) => entry.def.replicas,
        };
        let writes_replicas = matches!((entry.def.sync_mode, opts.foreground), (SyncMode::Immediate, _) | (_, true));
        if writes_replicas {
            self.check_quorum_reachable(&entry, quorum, &batches).await?;
        }
        // Up to `insert_pipeline_depth` chunks in flight: one is placed and encoded while the
        // one before is being written. Chunks complete in order; after the first failure no
        // chunk is started, but those already writing finish, hand-offs included: a chunk cut
        // short after some replicas stored it would leave them different from the others.
        let batches = match opts.order_may_vary {
            true => in_value_order(&batches)?,
            false => batches,
        };
        let chunk_bytes = chunk_max_bytes(self.settings.insert_chunk_max_bytes, entry.def.replicas);
        let chunk_list = chunks(&batches, self.settings.insert_chunk_rows, chunk_bytes)?;
        // A delayed insert of one chunk that fails stored nothing: its outbox append is refused
        // whole, and nothing else writes.
        let all_or_nothing = chunk_list.len() == 1 && !writes_replicas;
        let (entry_ref, insert_id_ref) = (&entry, insert_id.as_str());
        let failed = AtomicBool::new(false);
        let failed_ref = &failed;
        let mut writes = futures::stream::iter(chunk_list.into_iter().enumerate().map(|(index, chunk)| async move {
            if failed_ref.load(Ordering::Acquire) {
                return Err(QueryError::Unavailable("not started: an earlier chunk failed".into()));
            }
            let placed = self.place(entry_ref, catalog_version, insert_id_ref, index as u64, &chunk)?;
            match (entry_ref.def.sync_mode, opts.foreground) {
                (SyncMode::Immediate, _) | (SyncMode::DelayModeDistributed, true) => {
                    self.write_immediate_to_the_end(entry_ref, placed, quorum).await
                }
                (SyncMode::DelayModeDistributed, false) => self.queue(entry_ref, placed).await,
            }
        }))
        .buffered(self.settings.insert_pipeline_depth.max(1));
        let (mut index, mut first_error) = (0, None);
        while let Some(done) = writes.next().await {
            match done {
                Ok(()) if first_error.is_none() => index += 1,
                Ok(()) => {}
                Err(e) if first_error.is_none() => {
                    failed.store(true, Ordering::Release);
                    first_error = Some(match all_or_nothing {
                        true => nothing_stored(e, table),
                        false => with_retry_hint(e, table, &insert_id, index),
                    });
                }
                Err(_) => {}
            }
        }
        match first_error {
            None => Ok(total_rows),
            // Its replicas failed because the table went (its files removed under the write):
            // said so, not as a node or disk fault to retry on; a retry would go elsewhere.
            Some(_) if !self.is_live(entry.id, entry.generation) => Err(gone_meanwhile(table)),
            Some(e) => Err(e),
        }
    }

    /// [`Self::write_immediate`] in a task of its own, so that it runs to its end (its hand-off
    /// of missed pieces included) even when the insert is dropped part-way, as when its client
    /// goes away: a write cut short after some replicas stored their pieces would leave the
    /// replicas of a shard different, with nothing queued to mend them.
    async fn write_immediate_to_the_end(
        &self,
        entry: &CatalogEntry,
        placed: PlacedChunk,
        quorum: u32,
    ) -> Result<(), QueryError> {
        let node = self.me.upgrade().ok_or_else(|| QueryError::Unavailable("the node is stopping".into()))?;
        let entry = entry.clone();
        tokio::spawn(async move {
            let _writing = node.immediate_writes.start((entry.id, entry.generation));
            node.write_immediate(&entry, placed, quorum).await
        })
        .await
        .map_err(|e| QueryError::Storage(format!("insert task failed: {e}")))?
    }

    /// Splits a chunk by shard and groups the shards by the ranks that hold them. Each shard's
    /// piece is gathered from the chunk's batches in one pass (no per-batch pieces to concatenate
    /// afterwards: one copy of the rows, not two).
    fn place(
        &self,
        entry: &CatalogEntry,
        catalog_version: u64,
        insert_id: &str,
        index: u64,
        chunk: &[RecordBatch],
    ) -> Result<PlacedChunk, QueryError> {
        let def = &entry.def;
        let key = def.shard_key_indices().map_err(|e| QueryError::Rejected(e.to_string()))?;
        // Indexed by shard (at most MAX_SHARDS): (batch, row) of each of its rows, in input order.
        let mut rows_by_shard: Vec<Vec<(usize, usize)>> = vec![Vec::new(); def.shards as usize];
        for (batch_index, batch) in chunk.iter().enumerate() {
            let shards = def.placement.shard_of_rows(batch, &key, def.shards).map_err(storage_error)?;
            for (row, shard) in shards.into_iter().enumerate() {
                let rows = rows_by_shard.get_mut(shard as usize).ok_or_else(|| {
                    QueryError::Storage(format!("bug: placement gave shard {shard} of {}", def.shards))
                })?;
                rows.push((batch_index, row));
            }
        }
        let sources: Vec<&RecordBatch> = chunk.iter().collect();
        let mut by_rank: BTreeMap<u32, PieceSet> = BTreeMap::new();
        let mut shard_rows = BTreeMap::new();
        for (shard, rows) in (0u32..).zip(rows_by_shard).filter(|(_, rows)| !rows.is_empty()) {
            let piece = match sources.as_slice() {
                // Everything of a single batch goes to one shard: no copy needed.
                [single] if rows.len() == single.num_rows() => (*single).clone(),
                _ => interleave_record_batch(&sources, &rows).map_err(storage_error)?,
            };
            shard_rows.insert(shard, piece.num_rows() as u64);
            for rank in def.replica_ranks(shard, self.world_size) {
                let set = by_rank.entry(rank).or_insert_with(|| PieceSet {
                    header: PieceSetHeader {
                        table: def.name.clone(),
                        table_id: entry.id,
                        generation: entry.generation,
                        catalog_version,
                        insert_id: insert_id.to_string(),
                        chunk: index,
                        shards: Vec::new(),
                    },
                    batches: Vec::new(),
                });
                set.header.shards.push(shard);
                set.batches.push(piece.clone());
            }
        }
        Ok(PlacedChunk { index, by_rank, shard_rows })
    }

    /// Fails an insert that writes replicas before anything is written when some shard its rows
    /// go to has fewer replicas than `quorum` on nodes the membership does not say are down (no
    /// heartbeat for `down_after_ms`): it could only fail, after waiting for a connection to time
    /// out, or write some shards and not others. ClickHouse refuses such an insert the same way
    /// (`Number of alive replicas ... is less than requested quorum`). Shards the rows do not go to
    /// may be down.
    async fn check_quorum_reachable(
        &self,
        entry: &CatalogEntry,
        quorum: u32,
        batches: &[RecordBatch],
    ) -> Result<(), QueryError> {
        let Some(members) = self.recent_members.get(self.cluster.as_ref()).await else { return Ok(()) };
        let down: Vec<u32> =
            members.iter().filter(|m| m.state == NodeState::Down && m.rank != self.rank).map(|m| m.rank).collect();
        if down.is_empty() {
            return Ok(());
        }
        let mut short = Vec::new();
        for shard in 0..entry.def.shards {
            let ranks = entry.def.replica_ranks(shard, self.world_size);
            let alive = ranks.iter().filter(|r| !down.contains(r)).count() as u32;
            if alive < quorum {
                let missing: Vec<String> =
                    ranks.iter().filter(|r| down.contains(r)).map(|r| format!("rank {r}")).collect();
                short.push((
                    shard,
                    format!("shard {shard}: {alive} of {} alive ({} down)", ranks.len(), missing.join(", ")),
                ));
            }
        }
        if short.is_empty() {
            return Ok(());
        }
        // Only now (some shard is short) is it worth placing the rows to see where they go.
        let key = entry.def.shard_key_indices().map_err(|e| QueryError::Rejected(e.to_string()))?;
        let mut touched = vec![false; entry.def.shards as usize];
        for batch in batches {
            for shard in entry.def.placement.shard_of_rows(batch, &key, entry.def.shards).map_err(storage_error)? {
                if let Some(t) = touched.get_mut(shard as usize) {
                    *t = true;
                }
            }
        }
        short.retain(|(shard, _)| touched.get(*shard as usize) == Some(&true));
        if short.is_empty() {
            return Ok(());
        }
        let short: Vec<String> = short.into_iter().map(|(_, text)| text).collect();
        Err(QueryError::Unavailable(format!(
            "table {} has shards the rows go to with fewer live replicas than insert_quorum = {quorum}: {} (no heartbeat: see \
             system.nodes); nothing was written",
            entry.def.name,
            short.join("; ")
        )))
    }

    async fn write_immediate(&self, entry: &CatalogEntry, placed: PlacedChunk, quorum: u32) -> Result<(), QueryError> {
        let schema = &entry.def.schema;
        // Remote ranks get the encoded piece set; this rank applies the batches as they are.
        let mut payloads = BTreeMap::new();
        for (rank, set) in placed.by_rank.iter().filter(|(rank, _)| **rank != self.rank) {
            payloads.insert(*rank, Arc::new(set.encode(schema).map_err(storage_error)?));
        }
        let sends = placed.by_rank.iter().map(|(rank, set)| {
            let payload = payloads.get(rank).cloned();
            async move {
                let result = match payload {
                    Some(payload) => {
                        let req = ShipRequest { origin: None, items: vec![ShipItem { seq: None, payload }] };
                        // An `immediate` write is applied whole or refused whole.
                        self.peers.ship(*rank, &req).await.and_then(|outcome| match outcome.refused.first() {
                            None => Ok(outcome.rows),
                            Some(refused) => Err(QueryError::Storage(refused.error.clone())),
                        })
                    }
                    None => self.apply_sets(None, vec![(None, set.clone())]).await,
                };
                (*rank, result)
            }
        });
        // Answers as they come; once every shard has its quorum, replicas still writing are not
        // waited for (a stopped node would hold the insert until `ship_timeout_ms`): they get
        // their piece sets through the outbox below, like a replica that failed. A write that
        // still lands there is applied once (the piece sets carry the insert's key).
        let mut pending: FuturesUnordered<_> = sends.collect();
        let mut results: BTreeMap<u32, Result<u64, QueryError>> = BTreeMap::new();
        while let Some((rank, result)) = pending.next().await {
            results.insert(rank, result);
            if !pending.is_empty() && quorum_met(entry, &placed, &results, quorum, self.world_size) {
                break;
            }
        }
        drop(pending);
        let mut short = Vec::new();
        for shard in placed.shard_rows.keys() {
            let ranks = entry.def.replica_ranks(*shard, self.world_size);
            let acked = ranks.iter().filter(|r| matches!(results.get(r), Some(Ok(_)))).count() as u32;
            if acked < quorum {
                short.push(format!("shard {shard}: {acked} of {} replicas durable, quorum {quorum}", ranks.len()));
            }
        }
        // The replicas that did not count: those that failed, and those not answered yet.
        let failed: Vec<(u32, Missed<'_>)> = placed
            .by_rank
            .keys()
            .filter_map(|rank| match results.get(rank) {
                Some(Ok(_)) => None,
                Some(Err(e)) => Some((*rank, Missed::Failed(e))),
                None => Some((*rank, Missed::StillWriting)),
            })
            .collect();
        if !short.is_empty() {
            let causes: Vec<String> = failed.iter().map(|(r, e)| format!("rank {r}: {e}")).collect();
            let mut message = format!("{} ({})", short.join("; "), causes.join("; "));
            // Some replicas stored their piece: the ones that missed theirs get it through the
            // outbox, as with a quorum met, so that the replicas do not stay different (a read
            // would depend on the replica it chose). A retry with the insert id is applied once.
            if results.values().any(|r| r.is_ok()) {
                match self.hand_off(entry, &placed, &payloads, &failed).await {
                    Ok(()) => message.push_str("; the replicas that missed it get it in the background"),
                    Err(e) => {
                        tracing::warn!(table = %entry.def.name, "could not queue the missed pieces: {e}");
                        message.push_str(&format!(
                            "; queueing it for the replicas that missed it failed too ({e}), so they differ \
                             from the others until the insert is retried"
                        ));
                    }
                }
            }
            return Err(QueryError::Unavailable(message));
        }
        if failed.is_empty() {
            return Ok(());
        }
        // Quorum met, some replicas missed their piece: hinted handoff through the outbox.
        self.hand_off(entry, &placed, &payloads, &failed).await
    }

    /// Queues the piece sets of the `failed` replicas in the outbox (hinted handoff): their
    /// senders deliver them when the replicas answer again.
    async fn hand_off(
        &self,
        entry: &CatalogEntry,
        placed: &PlacedChunk,
        payloads: &BTreeMap<u32, Arc<Vec<u8>>>,
        failed: &[(u32, Missed<'_>)],
    ) -> Result<(), QueryError> {
        let key: Arc<str> = outbox_key(entry).into();
        let mut items = Vec::new();
        for (rank, _) in failed {
            let Some(set) = placed.by_rank.get(rank) else { continue };
            let rows = set.batches.iter().map(|b| b.num_rows() as u64).sum();
            let payload = match payloads.get(rank) {
                Some(p) => p.as_ref().clone(),
                None => set.encode(&entry.def.schema).map_err(storage_error)?,
            };
            items.push(OutboxItem { table: Arc::clone(&key), dest: *rank, rows, payload });
        }
        // Said once queued: when queueing fails, the caller says that instead.
        self.append_outbox(items, entry).await?;
        for (rank, missed) in failed {
            match missed {
                // The normal path of an insert_quorum below the replica count, not a failure
                // worth a warning on every insert.
                Missed::StillWriting => {
                    tracing::debug!(table = %entry.def.name, rank, "replica still writing at quorum, its piece queued")
                }
                Missed::Failed(e) => {
                    tracing::warn!(table = %entry.def.name, rank, "replica missed an immediate insert, queued: {e}")
                }
            }
        }
        Ok(())
    }

    async fn queue(&self, entry: &CatalogEntry, placed: PlacedChunk) -> Result<(), QueryError> {
        let key: Arc<str> = outbox_key(entry).into();
        let mut items = Vec::with_capacity(placed.by_rank.len());
        for (rank, set) in &placed.by_rank {
            let rows = set.batches.iter().map(|b| b.num_rows() as u64).sum();
            let payload = set.encode(&entry.def.schema).map_err(storage_error)?;
            items.push(OutboxItem { table: Arc::clone(&key), dest: *rank, rows, payload });
        }
        tracing::trace!(chunk = placed.index, "queued");
        self.append_outbox(items, entry).await
    }

    /// Appends to the outbox (fsynced), waiting up to `outbox_full_wait_ms` for room.
    async fn append_outbox(&self, items: Vec<OutboxItem>, entry: &CatalogEntry) -> Result<(), QueryError> {
        let deadline = Instant::now() + Duration::from_millis(self.settings.outbox_full_wait_ms);
        let queued: Vec<(u32, u64, u64)> = items.iter().map(|i| (i.dest, i.rows, i.payload.len() as u64)).collect();
        loop {
            let attempt = items.clone();
            let now_ms = unix_ms();
            let r = run_locked_short(&self.outbox, move |outbox| outbox.append(attempt, now_ms)).await?;
            match r {
                Ok(_) => {
                    self.outbox_refused.store(false, std::sync::atomic::Ordering::Relaxed);
                    break;
                }
                // No shipping ever makes room for a chunk larger than the whole outbox.
                Err(StorageError::OutboxFull { append_bytes, max_bytes, .. }) if append_bytes > max_bytes => {
                    return Err(QueryError::Rejected(format!(
                        "one chunk of this insert takes {append_bytes} bytes in the outbox, more than all of \
                         outbox_max_bytes ({max_bytes} bytes), so waiting could not make room: the chunk was \
                         not stored (earlier chunks of the insert, if any, were); raise --outbox-max-bytes"
                    )));
                }
                Err(StorageError::OutboxFull { .. }) if Instant::now() < deadline => {
                    // Ship now, whatever the delay settings say: only shipping makes room.
                    self.senders.hurry_all();
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e @ StorageError::OutboxFull { .. }) => {
                    self.outbox_refused.store(true, std::sync::atomic::Ordering::Relaxed);
                    let holders = run_locked_short(&self.outbox, |outbox| outbox_holders(outbox)).await?;
                    return Err(QueryError::Unavailable(format!(
                        "{e}; waited {} ms (outbox_full_wait_ms) for the senders to make room; pending for: {holders}",
                        self.settings.outbox_full_wait_ms
                    )));
                }
                // This node's disk, not the insert: another node can take it (a 503, not a 500).
                Err(
                    e @ (StorageError::Io { .. } | StorageError::WalFailed { .. } | StorageError::OutboxFailed { .. }),
                ) => {
                    return Err(QueryError::Unavailable(format!(
                        "{e}; this node cannot queue rows until it restarts, another node can take the insert"
                    )));
                }
                Err(e) => return Err(storage_error(e)),
            }
        }
        let delay = entry.def.delay;
        for (dest, rows, bytes) in queued {
            self.senders.queued(dest, rows, bytes, delay.delay_max_rows, delay.delay_max_bytes);
        }
        Ok(())
    }
}

/// Why a replica's piece of an `immediate` insert did not count toward the quorum.
#[derive(Debug, Clone, Copy)]
enum Missed<'a> {
    /// Its write failed.
    Failed(&'a QueryError),
    /// It had not answered when every shard had its quorum (the insert did not wait for it).
    StillWriting,
}

impl std::fmt::Display for Missed<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Missed::Failed(e) => write!(f, "{e}"),
            Missed::StillWriting => f.write_str("still writing when the quorum was met"),
        }
    }
}

/// How long an insert reuses the membership it last asked for (on a worker, asking is a round
/// trip to the master).
const MEMBERSHIP_REUSE_MS: u64 = 1_000;
/// How long an insert waits for the membership before going on without checking it (a master
/// that does not answer would otherwise hold it for the operation timeout).
const MEMBERSHIP_WAIT_MS: u64 = 200;

/// The membership as inserts check it: asked for at most once per [`MEMBERSHIP_REUSE_MS`].
#[derive(Debug, Default)]
pub(crate) struct RecentMembers(std::sync::Mutex<Option<(Instant, Arc<Vec<MemberInfo>>)>>);

impl RecentMembers {
    /// The membership, asked for again if the last answer is older than [`MEMBERSHIP_REUSE_MS`];
    /// `None` when it does not come within [`MEMBERSHIP_WAIT_MS`].
    async fn get(&self, cluster: &dyn ClusterView) -> Option<Arc<Vec<MemberInfo>>> {
        let lock = || self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, members)) = lock().as_ref()
            && at.elapsed() < Duration::from_millis(MEMBERSHIP_REUSE_MS)
        {
            return Some(Arc::clone(members));
        }
        let fresh = tokio::time::timeout(Duration::from_millis(MEMBERSHIP_WAIT_MS), cluster.members()).await.ok()?;
        let fresh = Arc::new(fresh);
        *lock() = Some((Instant::now(), Arc::clone(&fresh)));
        Some(fresh)
    }
}

/// True when every shard of `placed` has `quorum` replicas that answered durable.
fn quorum_met(
    entry: &CatalogEntry,
    placed: &PlacedChunk,
    results: &BTreeMap<u32, Result<u64, QueryError>>,
    quorum: u32,
    world_size: u32,
) -> bool {
    placed.shard_rows.keys().all(|shard| {
        let ranks = entry.def.replica_ranks(*shard, world_size);
        ranks.iter().filter(|r| matches!(results.get(r), Some(Ok(_)))).count() as u32 >= quorum
    })
}

pub(crate) fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Rebuilds every batch with the table's schema (all columns nullable, no metadata), checking
/// names and types, with every float NaN stored as the one NaN ([`one_nan`]).
fn conform(entry: &CatalogEntry, batches: Vec<RecordBatch>) -> Result<Vec<RecordBatch>, QueryError> {
    let schema = &entry.def.schema;
    batches
        .into_iter()
        .filter(|b| b.num_rows() > 0)
        .map(|batch| {
            let given = batch.schema();
            if given.fields().len() != schema.fields().len() {
                return Err(QueryError::Rejected(format!(
                    "table {} has {} columns, the rows have {}",
                    entry.def.name,
                    schema.fields().len(),
                    given.fields().len()
                )));
            }
            for (want, got) in schema.fields().iter().zip(given.fields()) {
                if want.name() != got.name() || want.data_type() != got.data_type() {
                    return Err(QueryError::Rejected(format!(
                        "table {}: column {} is {}, the rows have {} {}",
                        entry.def.name,
                        want.name(),
                        want.data_type(),
                        got.name(),
                        got.data_type()
                    )));
                }
            }
            for (field, column) in schema.fields().iter().zip(batch.columns()) {
                if let Some(bad) = shardwise_query::date_range::first_date_out_of_range(column) {
                    return Err(QueryError::Rejected(format!(
                        "table {} column {}, row {} of the rows sent: {}; nothing was stored",
                        entry.def.name,
                        field.name(),
                        bad.row + 1,
                        bad.message
                    )));
                }
            }
            let columns = batch.columns().iter().map(one_nan).collect();
            RecordBatch::try_new(Arc::clone(schema), columns).map_err(storage_error)
        })
        .collect()
}

/// A float column with every NaN made the positive quiet NaN (`'NaN'::double`). Arithmetic on
/// x86 makes NaNs with the sign bit set (`'Infinity' - 'Infinity'`), and DataFusion's sorts,
/// groups, `DISTINCT` and `=` tell the two apart (the sign bit orders one below every number),
/// where PostgreSQL has one NaN above every number: stored values are made alike once, here.
/// Columns without such a NaN are returned as they are.
fn one_nan(column: &ArrayRef) -> ArrayRef {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::{DataType, Float32Type, Float64Type};
    match column.data_type() {
        DataType::Float64 => {
            let floats = column.as_primitive::<Float64Type>();
            match floats.values().iter().any(|v| v.is_nan() && v.is_sign_negative()) {
                true => Arc::new(floats.unary::<_, Float64Type>(|v| if v.is_nan() { f64::NAN } else { v })),
                false => Arc::clone(column),
            }
        }
        DataType::Float32 => {
            let floats = column.as_primitive::<Float32Type>();
            match floats.values().iter().any(|v| v.is_nan() && v.is_sign_negative()) {
                true => Arc::new(floats.unary::<_, Float32Type>(|v| if v.is_nan() { f32::NAN } else { v })),
                false => Arc::clone(column),
            }
        }
        _ => Arc::clone(column),
    }
}

/// Rows in one output batch of [`in_value_order`].
const VALUE_ORDER_BATCH_ROWS: usize = 64 * 1024;

/// The rows of `batches` in an order that depends on their values only: sorted by the placement
/// hash of the whole row (`xxhash64-v1`, the same on every node and version). An insert whose
/// rows arrive in another order each time (a query's) then makes the same chunks on a retry.
/// Rows of equal hash are equal rows, which may trade places to no effect (two different rows of
/// one 64-bit hash could land in other chunks: the chance that any pair among 10M rows shares one
/// is about 3 in a million, n^2 / 2^65).
fn in_value_order(batches: &[RecordBatch]) -> Result<Vec<RecordBatch>, QueryError> {
    let Some(first) = batches.first() else { return Ok(Vec::new()) };
    let columns: Vec<usize> = (0..first.num_columns()).collect();
    if columns.is_empty() {
        return Ok(batches.to_vec());
    }
    let total: usize = batches.iter().map(RecordBatch::num_rows).sum();
    let too_many = |what: &str| QueryError::Storage(format!("an insert of more than 2^32 {what} cannot be ordered"));
    // 16 bytes a row: the hash, the batch and the row within it.
    let mut keyed: Vec<(u64, u32, u32)> = Vec::with_capacity(total);
    for (b, batch) in batches.iter().enumerate() {
        let b = u32::try_from(b).map_err(|_| too_many("batches"))?;
        let hashes = shardwise_storage::hash_rows(batch, &columns).map_err(storage_error)?;
        for (row, h) in hashes.into_iter().enumerate() {
            keyed.push((h, b, u32::try_from(row).map_err(|_| too_many("rows in a batch"))?));
        }
    }
    keyed.sort_unstable_by_key(|&(h, _, _)| h);
    let sources: Vec<&RecordBatch> = batches.iter().collect();
    keyed
        .chunks(VALUE_ORDER_BATCH_ROWS)
        .map(|part| {
            let indices: Vec<(usize, usize)> = part.iter().map(|&(_, b, row)| (b as usize, row as usize)).collect();
            interleave_record_batch(&sources, &indices).map_err(storage_error)
        })
        .collect()
}

fn nothing_stored(e: QueryError, table: &str) -> QueryError {
    let said = "nothing of the insert was stored, so it can be sent again as it is";
    match e {
        QueryError::Unavailable(m) => QueryError::Unavailable(format!("insert into {table} failed: {m}; {said}")),
        QueryError::Storage(m) => QueryError::Storage(format!("insert into {table} failed: {m}; {said}")),
        other => other,
    }
}

fn with_retry_hint(e: QueryError, table: &str, insert_id: &str, chunk: usize) -> QueryError {
    let insert_id = client_insert_id(insert_id);
    let hint = format!(
        "chunk {chunk} failed and part of the insert may already be stored; retry with SETTINGS insert_id = \
         '{insert_id}' (shardwise load: --insert-id {insert_id}) to complete it exactly once"
    );
    match e {
        QueryError::Unavailable(m) => QueryError::Unavailable(format!("insert into {table} failed: {m}; {hint}")),
        QueryError::Storage(m) => QueryError::Storage(format!("insert into {table} failed: {m}; {hint}")),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    #[test]
    fn rows_in_value_order_make_the_same_chunks_whatever_order_they_came_in() {
        use datafusion::arrow::array::StringArray;
        let schema =
            Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, true), Field::new("s", DataType::Utf8, true)]));
        let rows: Vec<(Option<i64>, Option<String>)> =
            (0..1000i64).map(|i| ((i % 7 != 0).then_some(i % 37), Some(format!("s{}", i % 11)))).collect();
        let batch = |rows: &[(Option<i64>, Option<String>)]| {
            let k = Int64Array::from(rows.iter().map(|r| r.0).collect::<Vec<_>>());
            let s = StringArray::from(rows.iter().map(|r| r.1.clone()).collect::<Vec<_>>());
            RecordBatch::try_new(schema.clone(), vec![Arc::new(k), Arc::new(s)]).unwrap()
        };
        let mut reversed = rows.clone();
        reversed.reverse();
        let arrived_once = [batch(&rows[..400]), batch(&rows[400..])];
        let arrived_again = [batch(&reversed[..123]), batch(&reversed[123..700]), batch(&reversed[700..])];
        let text = |batches: &[RecordBatch]| {
            chunks(&in_value_order(batches).unwrap(), 100, usize::MAX)
                .unwrap()
                .iter()
                .map(|chunk| datafusion::arrow::util::pretty::pretty_format_batches(chunk).unwrap().to_string())
                .collect::<Vec<_>>()
        };
        let (once, again) = (text(&arrived_once), text(&arrived_again));
        assert_eq!(once.len(), 10);
        assert_eq!(once, again);
        // Position chunks differ with the order: what a retry of a query's insert made before.
        assert_ne!(
            chunks(&arrived_once, 100, usize::MAX).unwrap()[0][0],
            chunks(&arrived_again, 100, usize::MAX).unwrap()[0][0]
        );
    }

    #[test]
    fn every_nan_is_stored_as_the_one_nan() {
        use datafusion::arrow::array::{AsArray, Float32Array, Float64Array};
        use datafusion::arrow::datatypes::{Float32Type, Float64Type};
        let negative = -f64::NAN;
        assert!(negative.is_nan() && negative.is_sign_negative());
        let column: ArrayRef = Arc::new(Float64Array::from(vec![Some(1.0), Some(negative), None, Some(f64::NAN)]));
        let stored = one_nan(&column);
        let floats = stored.as_primitive::<Float64Type>();
        let bits: Vec<Option<u64>> = floats.iter().map(|v| v.map(f64::to_bits)).collect();
        let nan = f64::NAN.to_bits();
        assert_eq!(bits, vec![Some(1.0f64.to_bits()), Some(nan), None, Some(nan)]);
        let narrow: ArrayRef = Arc::new(Float32Array::from(vec![-f32::NAN, -0.0]));
        let stored = one_nan(&narrow);
        let floats = stored.as_primitive::<Float32Type>();
        assert_eq!((floats.value(0).to_bits(), floats.value(1).to_bits()), (f32::NAN.to_bits(), (-0.0f32).to_bits()));
        // Nothing to change: the same array, not a copy.
        let plain: ArrayRef = Arc::new(Float64Array::from(vec![1.0, f64::NAN]));
        assert!(Arc::ptr_eq(&plain, &one_nan(&plain)));
    }

    #[test]
    fn insert_ids_are_1_to_256_bytes() {
        assert!(check_insert_id("a").is_ok());
        assert!(check_insert_id(&"x".repeat(INSERT_ID_MAX_BYTES)).is_ok());
        let long = check_insert_id(&"x".repeat(INSERT_ID_MAX_BYTES + 1)).unwrap_err();
        assert_eq!(long, "insert_id must be 1 to 256 bytes, got 257 bytes");
        let empty = check_insert_id("").unwrap_err();
        assert!(empty.starts_with("insert_id is empty; give 1 to 256 bytes"), "{empty}");
        // A load's segment ids are checked by the id the client gave.
        assert!(check_insert_id(client_insert_id("/seg-0")).is_err());
        assert!(check_insert_id(client_insert_id("load-1/seg-0")).is_ok());
        assert!(check_insert_id("zz/seg-0").unwrap_err().contains("contains '/'"));
    }

    /// A date no client could read back (a Parquet DATE or an Arrow batch may carry any `i32` of
    /// days) is refused, naming the table, column and row, whatever path the rows came by.
    #[test]
    fn a_date_beyond_what_can_be_read_back_is_refused() -> Result<(), Box<dyn std::error::Error>> {
        use datafusion::arrow::array::Date32Array;
        let schema = Arc::new(Schema::new(vec![Field::new("day", DataType::Date32, true)]));
        let options = [("shard_key".to_string(), "day".to_string())];
        let def = shardwise_storage::TableDef::from_options("t", schema.clone(), &options, 1)?;
        let entry = CatalogEntry { id: 1, generation: 0, def };
        let fine = RecordBatch::try_new(schema.clone(), vec![Arc::new(Date32Array::from(vec![Some(19_723), None]))])?;
        assert_eq!(conform(&entry, vec![fine])?.len(), 1);
        let far = RecordBatch::try_new(schema, vec![Arc::new(Date32Array::from(vec![0, -99_999_999]))])?;
        let err = conform(&entry, vec![far]).err().ok_or("accepted")?.to_string();
        assert!(err.contains("table t column day, row 2") && err.contains("nothing was stored"), "{err}");
        Ok(())
    }
}
