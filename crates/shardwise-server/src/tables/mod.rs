//! The tables of one node: the catalog as it arrives from the master, the shard stores this rank
//! holds, the `delay_mode_distributed` outbox and its senders, and the calls that tie them to
//! SQL ([`TableAccess`]) and to the other nodes (the data plane).
//!
//! Layout under the node's data dir:
//! - `tables/t<id>-g<generation>/shard-<s>/`: one [`ShardStore`] per shard replica held here.
//!   A DROP or TRUNCATE changes the `(id, generation)` the catalog names, and the directories of
//!   incarnations the catalog no longer names are deleted.
//! - `outbox/`: the node's one [`Outbox`].
//!
//! Stores are opened lazily (first insert, scan or stats call), which also replays their WAL.
//! What fsyncs runs on the blocking pool, except an insert's outbox append, which runs in place
//! on its runtime worker while the other workers serve the rest ([`locks`]).

pub mod apply;
mod background;
pub mod check;
mod chunks;
mod insert;
mod locks;
pub mod optimize;
pub mod peers;
mod reopen;
pub mod repair;
mod replaced;
mod sender;
pub mod stats;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use datafusion::arrow::record_batch::RecordBatch;
use shardwise_cluster::{BoxFuture, ClusterView, MetadataSnapshot, NodeState};
use shardwise_query::dist::TableSample;
use shardwise_query::{
    FragmentReport, InsertOptions, QueryError, RemoteRows, ReplicaCheckRow, ReplicaRepairRow, ShardData,
    ShardReplicaRow, SyncQueueRow, TableAccess,
};
use shardwise_storage::{Catalog, CatalogEntry, CatalogOp, Outbox, OutboxOptions, RealFs, ShardStore};
use tokio::sync::watch;

pub use insert::{INSERT_ID_MAX_BYTES, check_insert_id};
pub(crate) use locks::{blocking, lock, lock_from_runtime, run_locked_short};
pub use peers::{DataPlaneAuth, Peers};
pub use sender::SenderStatus;

use crate::settings::StorageSettings;

/// How full the outbox may be (percent of `outbox_max_bytes` pending) before `/health` says
/// `degraded`: delayed inserts then soon wait for room, and fail after `outbox_full_wait_ms`.
pub const OUTBOX_NEARLY_FULL_PERCENT: u64 = 90;

/// How DDL reaches the master and how the catalog comes back: implemented over the cluster
/// crate's replicated metadata.
pub trait MetadataAccess: Send + Sync + std::fmt::Debug {
    fn watch(&self) -> watch::Receiver<MetadataSnapshot>;
    fn propose(&self, op: serde_json::Value) -> BoxFuture<'_, Result<MetadataSnapshot, QueryError>>;
    /// Makes sure the metadata [`MetadataAccess::watch`] gives is as new as the master's before
    /// a statement (`writing`: a write) relies on it (`Node::ensure_current`).
    fn ensure_current(&self, writing: bool) -> BoxFuture<'_, Result<(), QueryError>> {
        let _ = writing;
        Box::pin(async { Ok(()) })
    }
    /// Why writes through this node are refused now as far as it knows without asking the
    /// master (no connection to it, a replacement master taking the catalog): for `/health`.
    fn master_problem(&self) -> Option<String> {
        None
    }
}

/// How long after a failed removal of dropped tables' files the next one is tried.
pub const DROPPED_FILES_RETRY_MS: u64 = 5_000;

/// Key of one shard replica store: table id, generation, shard.
pub(crate) type StoreKey = (u64, u64, u32);
pub(crate) type SharedStore = Arc<Mutex<ShardStore>>;

/// The tables of one node. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct TablesNode {
    pub(crate) rank: u32,
    pub(crate) world_size: u32,
    pub(crate) settings: StorageSettings,
    pub(crate) cluster: Arc<dyn ClusterView>,
    pub(crate) metadata: Arc<dyn MetadataAccess>,
    tables_dir: PathBuf,
    stores: Mutex<HashMap<StoreKey, SharedStore>>,
    /// Held while a store is opened, so two first uses of a store cannot open it twice.
    opening: tokio::sync::Mutex<()>,
    /// Shard replicas here that failed to open (damaged files), with the error: `/health` and
    /// `system.shards` name them. Cleared when one opens.
    open_failures: Mutex<BTreeMap<StoreKey, String>>,
    /// Failed shard replicas and when they were last tried (or first seen failed): the
    /// maintenance loop reopens them (`reopen.rs`).
    reopen_attempts: Mutex<HashMap<StoreKey, std::time::Instant>>,
    /// When the failed outbox was last reopened, or its failure first seen (see `reopen`).
    outbox_reopen_attempt: Mutex<Option<std::time::Instant>>,
    pub(crate) outbox: Arc<Mutex<Outbox>>,
    /// Whether the last delayed insert that waited for room in the outbox was refused (set by
    /// that refusal, cleared by the next append): `/health` says `degraded` while it is.
    pub(crate) outbox_refused: std::sync::atomic::AtomicBool,
    pub(crate) origin_id: String,
    pub(crate) peers: Peers,
    pub(crate) senders: sender::Senders,
    /// Applying delayed shipments and store maintenance, at a lower CPU priority.
    pub(crate) background: background::BackgroundPool,
    /// The catalog parsed from the newest metadata snapshot, with its version.
    catalog: Mutex<(u64, Arc<Catalog>)>,
    /// The membership `immediate` inserts check their quorum against.
    pub(crate) recent_members: insert::RecentMembers,
    /// This node, for the tasks it starts that must outlive a request (an insert's replica writes).
    me: std::sync::Weak<TablesNode>,
    /// Replicas being rebuilt (`REPAIR TABLE`), which take no reads or writes meanwhile.
    fences: Mutex<HashMap<StoreKey, repair::Fence>>,
    /// The `immediate` inserts whose replica writes are under way, for a repair to wait for.
    pub(crate) immediate_writes: repair::ImmediateWrites,
    /// Replicas of a node that replaced a lost data dir, fenced until rebuilt (`replaced.rs`).
    awaiting: replaced::AwaitingRebuild,
}

/// The destinations that hold the outbox's pending bytes: `rank 1 123456 bytes, ...`.
pub(crate) fn outbox_holders(outbox: &Outbox) -> String {
    let holders: Vec<String> = outbox
        .destinations()
        .into_iter()
        .map(|dest| format!("rank {dest} {} bytes", outbox.dest_stats(dest).pending_bytes))
        .collect();
    holders.join(", ")
}

/// Opens the node's outbox in `dir` (at start, and again after it failed: `reopen.rs`), logging
/// what its recovery found.
fn open_outbox(dir: PathBuf, outbox_max_bytes: u64) -> Result<Outbox, QueryError> {
    let opts = OutboxOptions { outbox_max_bytes, ..OutboxOptions::default() };
    let (outbox, recovery) = Outbox::open(dir, Arc::new(RealFs), opts).map_err(storage_error)?;
    for c in &recovery.wal.corruptions {
        tracing::error!("outbox WAL corruption: {c:?}");
    }
    if recovery.pending_items > 0 {
        tracing::info!(pending = recovery.pending_items, "outbox recovered pending inserts");
    }
    Ok(outbox)
}

pub(crate) fn storage_error(e: impl std::fmt::Display) -> QueryError {
    QueryError::Storage(e.to_string())
}

impl TablesNode {
    /// Opens the node's outbox and starts its senders and the maintenance task.
    pub async fn start(
        data_dir: &Path,
        cluster: Arc<dyn ClusterView>,
        metadata: Arc<dyn MetadataAccess>,
        auth: DataPlaneAuth,
        settings: StorageSettings,
        replacing: Option<&str>,
    ) -> Result<Arc<TablesNode>, QueryError> {
        let outbox_dir = data_dir.join("outbox");
        let max_bytes = settings.outbox_max_bytes;
        let outbox = blocking(move || open_outbox(outbox_dir, max_bytes)).await?;
        let origin_id = outbox.origin_id().to_string();
        let snapshot = metadata.watch().borrow().clone();
        let catalog = Catalog::from_json(&snapshot.state).map_err(storage_error)?;
        let tables_dir = data_dir.join("tables");
        let awaiting = replaced::AwaitingRebuild::load(&tables_dir)?;
        if let Some(old) = replacing {
            // Before anything is served: the replicas here are empty, not right.
            let n = awaiting.note_replacement(old, &catalog, cluster.rank(), cluster.world_size())?;
            tracing::warn!(
                replaced = old,
                replicas = n,
                "this node took the rank of a lost data dir: its replicas \
                are rebuilt from the others before they serve. Rows the lost node had acknowledged into \
                delay_mode_distributed tables and not shipped yet were only in its outbox, and are lost"
            );
        }
        let background = background::BackgroundPool::new()?;
        let node = Arc::new_cyclic(|me| TablesNode {
            rank: cluster.rank(),
            world_size: cluster.world_size(),
            peers: Peers::new(Arc::clone(&cluster), auth, &settings),
            senders: sender::Senders::new(cluster.world_size()),
            background,
            settings,
            cluster,
            metadata,
            tables_dir,
            stores: Mutex::new(HashMap::new()),
            opening: tokio::sync::Mutex::new(()),
            open_failures: Mutex::new(BTreeMap::new()),
            reopen_attempts: Mutex::new(HashMap::new()),
            outbox_reopen_attempt: Mutex::new(None),
            outbox: Arc::new(Mutex::new(outbox)),
            outbox_refused: std::sync::atomic::AtomicBool::new(false),
            origin_id,
            catalog: Mutex::new((snapshot.version, Arc::new(catalog))),
            recent_members: insert::RecentMembers::default(),
            me: me.clone(),
            fences: Mutex::new(HashMap::new()),
            immediate_writes: repair::ImmediateWrites::default(),
            awaiting,
        });
        node.remove_dropped().await;
        tokio::spawn(Self::open_local_stores(Arc::downgrade(&node)));
        sender::spawn_all(&node)?;
        tokio::spawn(Self::watch_catalog(Arc::downgrade(&node)));
        tokio::spawn(Self::maintain_loop(Arc::downgrade(&node)));
        if !node.awaiting.is_empty() {
            tokio::spawn(Self::rebuild_replaced(Arc::downgrade(&node)));
        }
        Ok(node)
    }

    /// The catalog and its version as this node knows them now.
    pub(crate) fn catalog_now(&self) -> (u64, Arc<Catalog>) {
        let rx = self.metadata.watch();
        let mut cached = lock(&self.catalog);
        let snapshot = rx.borrow();
        if snapshot.version > cached.0 {
            match Catalog::from_json(&snapshot.state) {
                Ok(c) => *cached = (snapshot.version, Arc::new(c)),
                Err(e) => tracing::error!("catalog version {} cannot be read: {e}", snapshot.version),
            }
        }
        cached.clone()
    }

    /// Waits (up to `catalog_wait_ms`) until this node's catalog is at least `version`.
    pub(crate) async fn catalog_at_least(&self, version: u64) -> (u64, Arc<Catalog>) {
        let mut rx = self.metadata.watch();
        let wait = Duration::from_millis(self.settings.catalog_wait_ms);
        let _ = tokio::time::timeout(wait, rx.wait_for(|s| s.version >= version)).await;
        self.catalog_now()
    }

    /// The catalog entry of table incarnation `(id, generation)` once this node's catalog is at
    /// least version `catalog_version` (the one another node named it in); an error when it is
    /// not there, dropped or truncated meanwhile.
    pub(crate) async fn incarnation_at(
        &self,
        id: u64,
        generation: u64,
        catalog_version: u64,
    ) -> Result<CatalogEntry, QueryError> {
        let (_, catalog) = self.catalog_at_least(catalog_version).await;
        catalog.by_id(id).filter(|e| e.generation == generation).cloned().ok_or_else(|| {
            QueryError::Rejected(format!(
                "rank {}: table id {id} generation {generation} is not in this node's catalog (dropped or truncated \
                 meanwhile)",
                self.rank
            ))
        })
    }

    pub(crate) fn entry(&self, table: &str) -> Result<(u64, CatalogEntry), QueryError> {
        let (version, catalog) = self.catalog_now();
        match catalog.tables.get(table) {
            Some(e) => Ok((version, e.clone())),
            None => Err(QueryError::Rejected(catalog.unknown_table(table).to_string())),
        }
    }

    /// Whether table incarnation `(id, generation)` is still in the catalog (not dropped or
    /// truncated since).
    pub(crate) fn is_live(&self, id: u64, generation: u64) -> bool {
        self.entry_of_incarnation(id, generation).is_some()
    }

    /// The catalog entry of table incarnation `(id, generation)`, whatever its name now; `None`
    /// once it was dropped or truncated.
    pub(crate) fn entry_of_incarnation(&self, id: u64, generation: u64) -> Option<(u64, CatalogEntry)> {
        let (version, catalog) = self.catalog_now();
        catalog.by_id(id).filter(|e| e.generation == generation).map(|e| (version, e.clone()))
    }

    fn store_dir(&self, key: StoreKey) -> PathBuf {
        self.tables_dir.join(format!("t{}-g{}", key.0, key.1)).join(format!("shard-{}", key.2))
    }

    /// The store of a shard replica this rank holds, opening (and recovering) it on first use.
    pub(crate) async fn store(&self, entry: &CatalogEntry, shard: u32) -> Result<SharedStore, QueryError> {
        if !entry.def.replica_ranks(shard, self.world_size).contains(&self.rank) {
            return Err(QueryError::Storage(format!(
                "table {} shard {shard} has no replica on rank {} (misrouted data)",
                entry.def.name, self.rank
            )));
        }
        let key = (entry.id, entry.generation, shard);
        // A replica being rebuilt: Unavailable, so a query reads another replica and a delayed
        // shipment holds its rows back for later.
        let fenced = |why| QueryError::Unavailable(why);
        if let Some(why) = self.fenced(key) {
            return Err(fenced(why));
        }
        if let Some(s) = lock(&self.stores).get(&key) {
            return Ok(Arc::clone(s));
        }
        let _opening = self.opening.lock().await;
        // Fenced while this call waited: it must not open a store that takes writes.
        if let Some(why) = self.fenced(key) {
            return Err(fenced(why));
        }
        if let Some(s) = lock(&self.stores).get(&key) {
            return Ok(Arc::clone(s));
        }
        let store = self.open_store(entry, key).await?;
        let mut stores = lock(&self.stores);
        Ok(Arc::clone(stores.entry(key).or_insert_with(|| Arc::new(Mutex::new(store)))))
    }

    /// Opens (and recovers) the store of `key` from its files, logging what its recovery found;
    /// a failure to open is kept in `open_failures` (for `/health` and `system.shards`) until an
    /// open succeeds. The caller holds `opening`.
    async fn open_store(&self, entry: &CatalogEntry, key: StoreKey) -> Result<ShardStore, QueryError> {
        let dir = self.store_dir(key);
        let schema = Arc::clone(&entry.def.schema);
        let opts = self.settings.shard_store_options();
        let (name, shard) = (entry.def.name.clone(), key.2);
        let opened = blocking(move || {
            durable_parents(&dir)?;
            repair::finish_swap(&dir)?;
            ShardStore::open(dir, Arc::new(RealFs), schema, opts)
                .map_err(|e| QueryError::Storage(format!("table {name} shard {shard}: {e}")))
        })
        .await;
        let (store, recovery) = match opened {
            Ok(opened) => {
                lock(&self.open_failures).remove(&key);
                opened
            }
            Err(e) => {
                lock(&self.open_failures).insert(key, e.to_string());
                return Err(e);
            }
        };
        for c in &recovery.wal.corruptions {
            tracing::error!(table = %entry.def.name, shard, "shard WAL corruption: {c:?}");
        }
        Ok(store)
    }

    /// At a clean stop, once the endpoints have stopped: closes the WAL of every open shard
    /// replica and the outbox's, each recording where it ends, so that the next start can tell
    /// records removed while the node was down (a file cut short or deleted) from a crash's torn
    /// tail, and keeps such a replica out of reads (`Wal::close_cleanly`). Writes after this
    /// fail; the process is about to exit.
    pub async fn close_cleanly(self: &Arc<Self>) {
        let node = Arc::clone(self);
        let closed = blocking(move || {
            let stores: Vec<(StoreKey, SharedStore)> =
                lock(&node.stores).iter().map(|(key, store)| (*key, Arc::clone(store))).collect();
            for ((table, generation, shard), store) in stores {
                if let Err(e) = lock(&store).close_cleanly() {
                    tracing::warn!(table, generation, shard, "shard replica not closed cleanly: {e}");
                }
            }
            if let Err(e) = lock(&node.outbox).close_cleanly() {
                tracing::warn!("outbox not closed cleanly: {e}");
            }
            Ok(())
        })
        .await;
        if let Err(e) = closed {
            tracing::warn!("the stores were not closed cleanly: {e}");
        }
    }

    /// Opens (and recovers) every shard replica this rank holds, in the background after start,
    /// as a database replays its logs on start: a WAL problem shows in the log now rather than at
    /// the first query, and the planner's estimate of groups (`sample`, which reads only open
    /// stores) sees this node's data after a restart.
    async fn open_local_stores(node: std::sync::Weak<TablesNode>) {
        let Some(node) = node.upgrade() else { return };
        let (_, catalog) = node.catalog_now();
        for entry in catalog.tables.values() {
            for shard in 0..entry.def.shards {
                // Not held here, or awaiting its rebuild (`replaced.rs`, which logs its own).
                let key = (entry.id, entry.generation, shard);
                if !entry.def.replica_ranks(shard, node.world_size).contains(&node.rank) || node.awaiting.contains(key)
                {
                    continue;
                }
                if let Err(e) = node.store(entry, shard).await {
                    tracing::error!(table = %entry.def.name, shard, "cannot open the shard replica: {e}");
                }
            }
        }
    }

    /// The replicas of the current catalog that failed to open, and why.
    pub(crate) fn open_failures_now(&self) -> Vec<(StoreKey, String)> {
        let (_, catalog) = self.catalog_now();
        let current = |k: &StoreKey| catalog.by_id(k.0).is_some_and(|e| e.generation == k.1);
        lock(&self.open_failures).iter().filter(|(k, _)| current(k)).map(|(k, e)| (*k, e.clone())).collect()
    }

    /// Open stores of the current catalog, for stats and maintenance.
    pub(crate) fn open_stores(&self) -> Vec<(StoreKey, SharedStore)> {
        lock(&self.stores).iter().map(|(k, s)| (*k, Arc::clone(s))).collect()
    }

    /// Forgets and deletes the stores, directories and pending outbox items of table
    /// incarnations the catalog no longer names: a dropped table (an id below the catalog's next
    /// one that it no longer lists), a truncated generation (below the table's current one). A
    /// directory the catalog has never made (a later id or generation) proves the catalog older
    /// than this node's data, as after a master lost its `metadata.json`: it is kept, and said.
    async fn remove_dropped(&self) -> bool {
        // No store is opened or swapped in (a rebuild's, `repair.rs`) while the files of dropped
        // incarnations are found and deleted: either could make a directory again.
        let _opening = self.opening.lock().await;
        let (version, catalog) = self.catalog_now();
        let live: std::collections::HashSet<(u64, u64)> =
            catalog.tables.values().map(|e| (e.id, e.generation)).collect();
        let current: std::collections::HashMap<u64, u64> =
            catalog.tables.values().map(|e| (e.id, e.generation)).collect();
        self.immediate_writes.forget_except(&live);
        let next_table_id = catalog.next_table_id;
        let dropped = move |(id, generation): (u64, u64)| match current.get(&id) {
            Some(current) => generation < *current,
            None => id < next_table_id,
        };
        // The dropped stores themselves, locked below while their directories are deleted: a
        // flush, merge or OPTIMIZE under way on one (each holds its store's lock) finishes first,
        // rather than failing the store halfway and leaving files in a directory being removed.
        let mut dropped_stores = Vec::new();
        lock(&self.stores).retain(|k, store| {
            let keep = live.contains(&(k.0, k.1));
            if !keep {
                dropped_stores.push(Arc::clone(store));
            }
            keep
        });
        let tables_dir = self.tables_dir.clone();
        let outbox = Arc::clone(&self.outbox);
        let live_incarnations = live.clone();
        let result = blocking(move || {
            // By identity, not name: a renamed table's queued rows are its own still.
            let stale: Vec<String> = lock(&outbox)
                .stats()
                .keys()
                .map(|(t, _)| t.clone())
                .filter(|t| outbox_key_incarnation(t).is_none_or(|k| !live_incarnations.contains(&k)))
                .collect();
            for key in stale {
                lock(&outbox).discard_table(&key).map_err(storage_error)?;
            }
            let _writers_done: Vec<_> = dropped_stores.iter().map(|store| lock(store)).collect();
            let Ok(dirs) = std::fs::read_dir(&tables_dir) else { return Ok(Vec::new()) };
            let mut unknown = Vec::new();
            for dir in dirs.flatten() {
                let name = dir.file_name().to_string_lossy().to_string();
                match parse_table_dir(&name) {
                    Some(k) if live.contains(&k) => {}
                    Some(k) if dropped(k) => {
                        std::fs::remove_dir_all(dir.path()).map_err(storage_error)?;
                        shardwise_cluster::datadir::sync_dir(&tables_dir).map_err(storage_error)?;
                    }
                    Some(_) => unknown.push(name),
                    None => {}
                }
            }
            Ok(unknown)
        })
        .await;
        match result {
            Ok(unknown) => {
                // A table created since this pass read the catalog has its directory already:
                // only one that the catalog of now has not made either proves it old.
                let (now, catalog) = self.catalog_now();
                let unknown: Vec<String> = unknown
                    .into_iter()
                    .filter(|name| match parse_table_dir(name) {
                        Some((id, generation)) => match catalog.tables.values().find(|e| e.id == id) {
                            Some(entry) => generation > entry.generation,
                            None => id >= catalog.next_table_id,
                        },
                        None => false,
                    })
                    .collect();
                if !unknown.is_empty() {
                    tracing::error!(
                        catalog_version = now,
                        "keeping table directories {unknown:?}: the catalog (version {now}) never made them, so \
                         it is older than this node's data (did the master lose its master/metadata.json?)"
                    );
                }
            }
            // A late write into a dropped table's directory (a delivery or read that looked the
            // table up just before the drop) can make its removal fail; the next pass retries.
            Err(e) => {
                tracing::warn!(
                    catalog_version = version,
                    "could not yet remove the files of dropped or truncated tables ({e}); retried in \
                     {DROPPED_FILES_RETRY_MS} ms"
                );
                return false;
            }
        }
        true
    }

    async fn watch_catalog(node: std::sync::Weak<TablesNode>) {
        let Some(mut rx) = node.upgrade().map(|n| n.metadata.watch()) else { return };
        let mut retry = false;
        loop {
            // A pass that could not remove everything is tried again after a while, not only at
            // the next catalog change, which a quiet cluster may never make.
            match retry {
                true => {
                    let wait = Duration::from_millis(DROPPED_FILES_RETRY_MS);
                    if let Ok(Err(_)) = tokio::time::timeout(wait, rx.changed()).await {
                        return;
                    }
                }
                false if rx.changed().await.is_err() => return,
                false => {}
            }
            let Some(node) = node.upgrade() else { return };
            retry = !node.remove_dropped().await;
        }
    }

    async fn maintain_loop(node: std::sync::Weak<TablesNode>) {
        loop {
            let interval = match node.upgrade() {
                Some(n) => Duration::from_millis(n.settings.maintain_interval_ms),
                None => return,
            };
            tokio::time::sleep(interval).await;
            let Some(n) = node.upgrade() else { return };
            if lock(&n.outbox).failure().is_some() {
                n.reopen_outbox_if_due().await;
            }
            for (key, store) in n.open_stores() {
                // A store that failed takes nothing until it is reopened; its failure was logged
                // when it happened (and `/health` names it), not once a second after.
                let set_aside = {
                    let guard = lock(&store);
                    guard.failure().is_some() || guard.is_retired()
                };
                if set_aside {
                    n.reopen_if_due(key, &store).await;
                    continue;
                }
                let r = n.background.blocking(move || lock(&store).maintain().map_err(storage_error)).await;
                // A store whose table was dropped (or truncated) meanwhile loses its directory
                // under its maintenance: expected, not an error.
                if let Err(e) = r {
                    if !lock(&n.stores).contains_key(&key) {
                        tracing::debug!(table_id = key.0, shard = key.2, "maintenance of a dropped store: {e}");
                        continue;
                    }
                    tracing::error!(table_id = key.0, shard = key.2, "shard maintenance failed: {e}");
                }
            }
        }
    }
}

/// The outbox's table key for one incarnation of a table: `name#id.generation`, so items of a
/// dropped table are never confused with a new table of the same name.
pub(crate) fn outbox_key(entry: &CatalogEntry) -> String {
    format!("{}#{}.{}", entry.def.name, entry.id, entry.generation)
}

/// The table name of an outbox key: the table's name when the rows were queued (it may have
/// been renamed since; [`outbox_key_entry`] finds it by its identity).
pub(crate) fn outbox_key_table(key: &str) -> &str {
    key.split_once('#').map(|(name, _)| name).unwrap_or(key)
}

/// The table incarnation, `(id, generation)`, of an outbox key.
pub(crate) fn outbox_key_incarnation(key: &str) -> Option<(u64, u64)> {
    let (_, incarnation) = key.rsplit_once('#')?;
    let (id, generation) = incarnation.split_once('.')?;
    Some((id.parse().ok()?, generation.parse().ok()?))
}

/// The catalog entry of the table incarnation whose rows an outbox key queues, whatever the
/// table is called now; `None` once it was dropped or truncated.
pub(crate) fn outbox_key_entry<'a>(catalog: &'a Catalog, key: &str) -> Option<&'a CatalogEntry> {
    let (id, generation) = outbox_key_incarnation(key)?;
    catalog.by_id(id).filter(|e| e.generation == generation)
}

/// Makes the directories above a store's (`tables/t<id>-g<generation>/`, and `tables/`) exist
/// durably: when the table's directory is made here, it and `tables/` are fsynced in their
/// parents, so that a power cut after a store's first acknowledged write cannot take the whole
/// table directory with it (the store itself fsyncs only its own entry in the table's
/// directory). One that is already there costs nothing (no fsyncs at every start). Blocking.
pub(crate) fn durable_parents(store_dir: &Path) -> Result<(), QueryError> {
    let Some(table_dir) = store_dir.parent() else { return Ok(()) };
    if table_dir.exists() {
        return Ok(());
    }
    std::fs::create_dir_all(table_dir).map_err(|e| storage_error(format!("create {}: {e}", table_dir.display())))?;
    let mut dir = table_dir;
    for _ in 0..2 {
        let Some(parent) = dir.parent() else { break };
        shardwise_cluster::datadir::sync_dir(parent).map_err(storage_error)?;
        dir = parent;
    }
    Ok(())
}

fn parse_table_dir(name: &str) -> Option<(u64, u64)> {
    let (id, generation) = name.strip_prefix('t')?.split_once("-g")?;
    Some((id.parse().ok()?, generation.parse().ok()?))
}

impl TableAccess for TablesNode {
    fn catalog(&self) -> Arc<Catalog> {
        self.catalog_now().1
    }

    fn world_size(&self) -> u32 {
        self.world_size
    }

    fn ddl(&self, op: CatalogOp) -> BoxFuture<'_, Result<(), QueryError>> {
        Box::pin(async move {
            let op = serde_json::to_value(&op).map_err(|e| QueryError::Storage(format!("cannot encode DDL: {e}")))?;
            let snapshot = self.metadata.propose(op).await?;
            self.catalog_at_least(snapshot.version).await;
            Ok(())
        })
    }

    fn insert(
        &self,
        table: &str,
        batches: Vec<RecordBatch>,
        opts: InsertOptions,
    ) -> BoxFuture<'_, Result<u64, QueryError>> {
        let table = table.to_string();
        Box::pin(async move { self.insert_batches(&table, batches, opts).await })
    }

    fn local_rank(&self) -> u32 {
        self.rank
    }

    fn down_ranks(&self) -> BoxFuture<'_, Vec<u32>> {
        Box::pin(async move {
            let members = self.cluster.members().await;
            members.into_iter().filter(|m| m.state == NodeState::Down).map(|m| m.rank).collect()
        })
    }

    fn replica_problems(&self) -> (bool, Vec<String>) {
        let (_, catalog) = self.catalog_now();
        let mut failed = false;
        let mut problems = Vec::new();
        // A worker cut off from the master refuses every write (reads go on): degraded, so that
        // a balancer can send writes elsewhere.
        problems.extend(self.metadata.master_problem());
        // A failed outbox takes no delayed insert until it is reopened: failing.
        let outbox = lock_from_runtime(&self.outbox);
        if let Some(failure) = outbox.failure() {
            problems.push(format!("outbox: {failure}"));
            failed = true;
        }
        // A full or nearly full one makes delayed inserts wait, then fail: degraded, naming the
        // destinations that hold it.
        let max_bytes = self.settings.outbox_max_bytes;
        let pending_bytes = outbox.pending_bytes();
        let refused = self.outbox_refused.load(std::sync::atomic::Ordering::Relaxed);
        if pending_bytes.saturating_mul(100) >= max_bytes.saturating_mul(OUTBOX_NEARLY_FULL_PERCENT) {
            problems.push(format!(
                "outbox: {pending_bytes} of {max_bytes} bytes (--outbox-max-bytes) pending{}, until the \
                 destinations take them ({})",
                if refused { ", and the last delayed insert that waited for room was refused" } else { "" },
                outbox_holders(&outbox)
            ));
        } else if refused {
            // Drained since, maybe: said as what it is, until the next delayed insert goes in.
            let holders = match pending_bytes {
                0 => String::new(),
                _ => format!(" ({})", outbox_holders(&outbox)),
            };
            problems.push(format!(
                "outbox: the last delayed insert that waited for room was refused (--outbox-max-bytes = \
                 {max_bytes}); {pending_bytes} bytes are pending now{holders}, and this clears when the next delayed \
                 insert goes in"
            ));
        }
        drop(outbox);
        // A replacement node's replicas out of service until rebuilt: degraded.
        let awaiting = self.awaiting.keys();
        if !awaiting.is_empty() {
            problems.push(format!(
                "{} shard replicas await their rebuild from the other replicas (this node replaced one whose data \
                 dir was lost; it rebuilds them itself: REPAIR TABLE)",
                awaiting.len()
            ));
        }
        // Replicas that cannot be opened take no writes: failing, as a store that failed.
        for (key, error) in self.open_failures_now() {
            let table = catalog.by_id(key.0).map(|e| e.def.name.as_str()).unwrap_or("(dropped)");
            problems.push(format!("table {table} shard {}: cannot be opened: {error}", key.2));
            failed = true;
        }
        for (key, store) in self.open_stores() {
            let guard = lock(&store);
            let Some(why) = guard.unreadable().or_else(|| guard.warning()) else { continue };
            failed |= guard.failure().is_some();
            let table = catalog.by_id(key.0).map(|e| e.def.name.as_str()).unwrap_or("(dropped)");
            problems.push(format!("table {table} shard {}: {why}", key.2));
        }
        (failed, problems)
    }

    fn catalog_version(&self) -> u64 {
        self.catalog_now().0
    }

    fn ensure_catalog_current(&self) -> BoxFuture<'_, Result<(), QueryError>> {
        self.metadata.ensure_current(false)
    }

    fn read_shard(
        &self,
        table_id: u64,
        generation: u64,
        catalog_version: u64,
        shard: u32,
    ) -> BoxFuture<'_, Result<ShardData, QueryError>> {
        let ticket = stats::ScanTicket { table_id, generation, shard, catalog_version };
        Box::pin(async move { self.read_shard_data(&ticket).await })
    }

    fn sample(&self, table_id: u64, generation: u64, max_rows: usize) -> Option<TableSample> {
        let (_, catalog) = self.catalog_now();
        let shards = catalog.by_id(table_id).filter(|e| e.generation == generation)?.def.shards;
        let stores: Vec<SharedStore> = lock(&self.stores)
            .iter()
            .filter(|((t, g, _), _)| (*t, *g) == (table_id, generation))
            .map(|(_, s)| Arc::clone(s))
            .collect();
        if stores.is_empty() {
            return None;
        }
        // An equal share of the sample from each local shard, from the start of its data.
        let per_store = max_rows.div_ceil(stores.len());
        let (mut batches, mut local_rows) = (Vec::new(), 0u64);
        for store in &stores {
            let guard = lock(store);
            local_rows += guard.stats().rows;
            let mut taken = 0;
            for batch in guard.snapshot() {
                if taken >= per_store {
                    break;
                }
                let rows = (per_store - taken).min(batch.num_rows());
                taken += rows;
                batches.push(batch.slice(0, rows));
            }
        }
        let table_rows = local_rows.saturating_mul(u64::from(shards)) / stores.len() as u64;
        Some(TableSample { batches, table_rows })
    }

    fn remote_fragment(
        &self,
        rank: u32,
        ticket: Vec<u8>,
        report: FragmentReport,
    ) -> BoxFuture<'_, Result<RemoteRows, QueryError>> {
        Box::pin(async move { self.peers.fragment(rank, ticket, report).await })
    }

    fn flush(&self, table: &str, timeout: Duration) -> BoxFuture<'_, Result<(), QueryError>> {
        let table = table.to_string();
        Box::pin(async move { self.flush_cluster(&table, timeout).await })
    }

    fn optimize(&self, table: &str, all_parts: bool, timeout: Duration) -> BoxFuture<'_, Result<(), QueryError>> {
        let table = table.to_string();
        Box::pin(async move { self.optimize_cluster(&table, all_parts, timeout).await })
    }

    fn shards(&self) -> BoxFuture<'_, Result<Vec<ShardReplicaRow>, QueryError>> {
        Box::pin(async move { self.shard_rows().await })
    }

    fn sync_queues(&self) -> BoxFuture<'_, Result<Vec<SyncQueueRow>, QueryError>> {
        Box::pin(async move { self.queue_rows().await })
    }

    fn check_table(&self, table: &str, timeout: Duration) -> BoxFuture<'_, Result<Vec<ReplicaCheckRow>, QueryError>> {
        let table = table.to_string();
        Box::pin(async move { self.check_cluster(&table, timeout).await })
    }

    fn repair_table(
        &self,
        table: &str,
        timeout: Duration,
        rebuild_rank: Option<u64>,
    ) -> BoxFuture<'_, Result<Vec<ReplicaRepairRow>, QueryError>> {
        let table = table.to_string();
        Box::pin(async move { self.repair_cluster(&table, timeout, rebuild_rank, repair::Judge::Majority).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_dirs_and_outbox_keys_parse() {
        assert_eq!(parse_table_dir("t12-g3"), Some((12, 3)));
        assert_eq!(parse_table_dir("t12"), None);
        assert_eq!(parse_table_dir("x12-g3"), None);
        assert_eq!(outbox_key_table("events#4.1"), "events");
        assert_eq!(outbox_key_incarnation("events#4.1"), Some((4, 1)));
        assert_eq!(outbox_key_incarnation("events"), None);
    }
}
