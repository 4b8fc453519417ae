//! A node that took the rank of one whose data dir was lost (`shardwise node --replace-node`):
//! its replicas of the tables that existed then hold nothing, and must not serve as if they
//! were right, empty. Each waits, fenced (no reads, which go to the other replicas; no writes,
//! which wait in the senders' queues or fail an `immediate` insert that needs it), until
//! `REPAIR TABLE` has rebuilt it from another replica of its shard, which the node starts by
//! itself ([`TablesNode::rebuild_replaced`]) and retries until every one is done.
//!
//! Which replicas wait is written durably in `tables/AWAITING_REBUILD.json` before the data
//! dir forgets that it is a replacement (`REPLACING`, in the cluster crate), so a crash at any
//! point leaves either the file or the marker, and a restart picks up where it was. A replica
//! leaves the file once its rebuild is swapped in. A table dropped or truncated meanwhile needs
//! nothing; a shard whose only replica was here (`replicas = 1`) has nothing to be rebuilt from:
//! its rows were lost with the data dir, which the node logs as an error before it serves the
//! replica empty.
//!
//! # A shard whose every replica was lost
//!
//! When every replica of a shard was on a lost data dir (two nodes lost at about the same time,
//! each replaced), nothing holds its old rows but the other nodes' outboxes, which still queue
//! those not yet delivered. Each replacement then lets its replica go empty (an error in the
//! log), and the queued rows arrive. Such a replica is **released after loss**: it serves, but it
//! is no copy of the shard's history, because a rebuild takes a source's dedup high-water marks
//! with its rows, and a released replica's marks cover rows it never held (those newer rows came
//! from an origin whose older ones were delivered to the lost dirs, or are still queued for the
//! other replica). A replica still awaiting its rebuild copied from it would drop those older
//! queued rows as duplicates. So, durably marked in the same file, a released replica fails
//! `CHECK TABLE` (it is not read, [`RELEASED_MARK`]) until no other replica of its shard awaits a
//! rebuild: an awaiting replica then finds no source and is released too, and takes its own
//! queued rows. Once the marks are gone, the check of the other shards (`Judge::MostRows`,
//! below) copies the replica that received the most over the others. While inserts go on, the
//! fullest cannot be told from a replica that new rows reached first, and the check leaves the
//! replicas as they are: so it is tried again ([`RECONCILE_AFTER_LOSS_TRIES`]), since such a
//! difference does not go away by itself.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shardwise_query::{QueryError, ReplicaRepairRow};
use shardwise_storage::Catalog;

use super::repair::Judge;
use super::{StoreKey, TablesNode, lock, storage_error};

/// The file, in `tables/`, that lists the replicas awaiting their rebuild.
const AWAITING_FILE: &str = "AWAITING_REBUILD.json";
/// How long each step of an automatic rebuild may take on each node (`repair_timeout_ms`).
pub const REPLACED_REBUILD_TIMEOUT_MS: u64 = 600_000;
/// The first wait before an automatic rebuild is tried again (doubling after each failure).
pub const REPLACED_REBUILD_RETRY_MS: u64 = 1_000;
/// The longest wait between two tries.
pub const REPLACED_REBUILD_RETRY_MAX_MS: u64 = 30_000;
/// How many times, once this node's replicas are rebuilt, the other shards' replicas are
/// compared and made the same before the node says which statements to run instead (the waits
/// between tries as a rebuild's: about 5 minutes in all).
pub const RECONCILE_AFTER_LOSS_TRIES: u32 = 14;
/// What the reason a replica awaiting its rebuild is fenced says, and so what `REPAIR TABLE`
/// reports for it (on any node): a shard whose every replica says it holds nothing to copy.
const AWAITING_MARK: &str = "awaits its rebuild from the shard's other replicas";
/// What a replica released after loss says when checked, until no other replica of its shard
/// awaits a rebuild (see the module doc).
pub(crate) const RELEASED_MARK: &str = "started empty after every replica of its shard was lost";
/// How long each node may take to answer the check that decides whether a released replica's
/// mark can go (`check_timeout_ms`).
const RELEASED_CHECK_TIMEOUT_MS: u64 = 30_000;

#[derive(Debug, Default, Serialize, Deserialize)]
struct AwaitingFile {
    /// The node whose lost data dir this node replaced.
    replaced_node: String,
    /// `(table id, generation, shard)` of each replica still to be rebuilt.
    replicas: BTreeSet<StoreKey>,
    /// Replicas released after loss, not a source for a rebuild while another replica of their
    /// shard awaits one (see the module doc).
    #[serde(default)]
    released: BTreeSet<StoreKey>,
}

/// The replicas on this node awaiting their rebuild, as `AWAITING_REBUILD.json` holds them.
#[derive(Debug)]
pub(crate) struct AwaitingRebuild {
    dir: PathBuf,
    state: Mutex<AwaitingFile>,
    /// Whether any replica awaits: every store lookup asks, and almost always the answer is no.
    any: AtomicBool,
}

impl AwaitingRebuild {
    /// Reads the file in `tables_dir`, if there is one.
    pub(crate) fn load(tables_dir: &Path) -> Result<AwaitingRebuild, QueryError> {
        let file = tables_dir.join(AWAITING_FILE);
        let state = match std::fs::read(&file) {
            Ok(bytes) => serde_json::from_slice::<AwaitingFile>(&bytes)
                .map_err(|e| storage_error(format!("{} is not valid: {e}", file.display())))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => AwaitingFile::default(),
            Err(e) => return Err(storage_error(format!("cannot read {}: {e}", file.display()))),
        };
        let any = AtomicBool::new(!state.replicas.is_empty());
        Ok(AwaitingRebuild { dir: tables_dir.to_path_buf(), state: Mutex::new(state), any })
    }

    /// Records that this node replaced `old`: every replica it holds of a table in `catalog`
    /// awaits its rebuild (durably, when this returns).
    pub(crate) fn note_replacement(
        &self,
        old: &str,
        catalog: &Catalog,
        rank: u32,
        world_size: u32,
    ) -> Result<usize, QueryError> {
        let mut state = lock(&self.state);
        state.replaced_node = old.to_string();
        for entry in catalog.tables.values() {
            for shard in 0..entry.def.shards {
                if entry.def.replica_ranks(shard, world_size).contains(&rank) {
                    state.replicas.insert((entry.id, entry.generation, shard));
                }
            }
        }
        self.write(&state)?;
        self.any.store(!state.replicas.is_empty(), Ordering::SeqCst);
        Ok(state.replicas.len())
    }

    /// Why the replica of `key` takes no reads or writes, if it awaits its rebuild.
    pub(crate) fn why(&self, key: StoreKey, rank: u32) -> Option<String> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        let state = lock(&self.state);
        state.replicas.contains(&key).then(|| {
            format!(
                "rank {rank}: its replica of shard {} {AWAITING_MARK} (this node took the rank of node {}, whose data \
                 dir was lost)",
                key.2, state.replaced_node
            )
        })
    }

    pub(crate) fn is_empty(&self) -> bool {
        !self.any.load(Ordering::Relaxed)
    }

    pub(crate) fn contains(&self, key: StoreKey) -> bool {
        self.any.load(Ordering::Relaxed) && lock(&self.state).replicas.contains(&key)
    }

    /// The replicas awaiting, in order.
    pub(crate) fn keys(&self) -> Vec<StoreKey> {
        lock(&self.state).replicas.iter().copied().collect()
    }

    /// The replica of `key` needs no rebuild now (rebuilt, or its table gone): durably.
    pub(crate) fn done(&self, key: StoreKey) -> Result<(), QueryError> {
        self.leave(key, false)
    }

    /// The replica of `key` serves empty, every replica of its shard having been lost: durably
    /// released after loss (see the module doc).
    pub(crate) fn release_lost(&self, key: StoreKey) -> Result<(), QueryError> {
        self.leave(key, true)
    }

    fn leave(&self, key: StoreKey, released: bool) -> Result<(), QueryError> {
        let mut state = lock(&self.state);
        if !state.replicas.contains(&key) {
            return Ok(());
        }
        let before = (state.replicas.clone(), state.released.clone());
        state.replicas.remove(&key);
        if released {
            state.released.insert(key);
        }
        if let Err(e) = self.write(&state) {
            (state.replicas, state.released) = before;
            return Err(e);
        }
        self.any.store(!state.replicas.is_empty(), Ordering::SeqCst);
        Ok(())
    }

    /// Why the replica of `key` is not read by a check, if it was released after loss and may
    /// not be a source yet.
    pub(crate) fn released_why(&self, key: StoreKey) -> Option<String> {
        let state = lock(&self.state);
        state.released.contains(&key).then(|| {
            format!(
                "its replica of shard {} {RELEASED_MARK} (node {}'s among them), and holds only rows that came since: \
                 not a source for a rebuild while another replica of the shard awaits one",
                key.2, state.replaced_node
            )
        })
    }

    /// The replicas released after loss whose mark is still there.
    fn released_keys(&self) -> Vec<StoreKey> {
        lock(&self.state).released.iter().copied().collect()
    }

    /// The replica of `key` may be a source again: durably.
    fn clear_released(&self, key: StoreKey) -> Result<(), QueryError> {
        let mut state = lock(&self.state);
        if !state.released.remove(&key) {
            return Ok(());
        }
        if let Err(e) = self.write(&state) {
            state.released.insert(key);
            return Err(e);
        }
        Ok(())
    }

    fn write(&self, state: &AwaitingFile) -> Result<(), QueryError> {
        shardwise_cluster::datadir::create_dir_durably(&self.dir).map_err(storage_error)?;
        let bytes = serde_json::to_vec_pretty(state).map_err(storage_error)?;
        shardwise_cluster::datadir::write_atomic(&self.dir, AWAITING_FILE, &bytes).map_err(storage_error)
    }
}

impl TablesNode {
    /// Rebuilds every replica awaiting it (`REPAIR TABLE t SETTINGS repair_rebuild_rank = <this
    /// rank>` for each of their tables, from this node), trying again, with a growing wait,
    /// until none is left: a rebuild needs every node up.
    pub(crate) async fn rebuild_replaced(node: std::sync::Weak<TablesNode>) {
        let mut retry_ms = REPLACED_REBUILD_RETRY_MS;
        loop {
            let Some(n) = node.upgrade() else { return };
            let tables = n.awaiting_tables();
            if n.awaiting.is_empty() {
                if n.settle_released().await {
                    break;
                }
                drop(n);
                tokio::time::sleep(Duration::from_millis(retry_ms)).await;
                retry_ms = retry_ms.saturating_mul(2).min(REPLACED_REBUILD_RETRY_MAX_MS);
                continue;
            }
            for (name, incarnation) in tables {
                let timeout = Duration::from_millis(REPLACED_REBUILD_TIMEOUT_MS);
                match n.repair_cluster(&name, timeout, Some(u64::from(n.rank)), Judge::Majority).await {
                    Ok(rows) => n.after_repair(&name, incarnation, &rows),
                    Err(e) => tracing::warn!(table = %name, "rebuilding this replacement node's replicas: {e}"),
                }
            }
            if n.awaiting.is_empty() {
                continue;
            }
            drop(n);
            tokio::time::sleep(Duration::from_millis(retry_ms)).await;
            retry_ms = retry_ms.saturating_mul(2).min(REPLACED_REBUILD_RETRY_MAX_MS);
        }
        // Every replica here is rebuilt or released: the other shards' replicas are made the same.
        let Some(n) = node.upgrade() else { return };
        let (_, catalog) = n.catalog_now();
        let mut tables: Vec<(u64, u64)> =
            catalog.tables.values().filter(|e| e.def.replicas > 1).map(|e| (e.id, e.generation)).collect();
        drop(n);
        let mut retry_ms = REPLACED_REBUILD_RETRY_MS;
        for attempt in 1..=RECONCILE_AFTER_LOSS_TRIES {
            let Some(n) = node.upgrade() else { return };
            tables = n.reconcile_after_loss(&tables).await;
            if tables.is_empty() {
                break;
            }
            if attempt == RECONCILE_AFTER_LOSS_TRIES {
                let (_, catalog) = n.catalog_now();
                let names: Vec<&str> =
                    tables.iter().filter_map(|(id, _)| catalog.by_id(*id)).map(|e| e.def.name.as_str()).collect();
                tracing::error!(tables = ?names,
                    "after the lost data dir, these tables' replicas still differ after {attempt} tries (the log says \
                     why for each): run CHECK TABLE, then REPAIR TABLE, once writes to them pause");
                break;
            }
            drop(n);
            tokio::time::sleep(Duration::from_millis(retry_ms)).await;
            retry_ms = retry_ms.saturating_mul(2).min(REPLACED_REBUILD_RETRY_MAX_MS);
        }
        tracing::warn!("every replica of the data dir this node replaced is rebuilt");
    }

    /// Lifts the mark of each replica here released after loss whose shard has no other replica
    /// awaiting a rebuild any more (every other one read by a check, or released too); whether
    /// none is left.
    async fn settle_released(&self) -> bool {
        let (_, catalog) = self.catalog_now();
        // By table incarnation: one check each.
        let mut by_table: BTreeMap<(u64, u64), Vec<u32>> = BTreeMap::new();
        for (id, generation, shard) in self.awaiting.released_keys() {
            by_table.entry((id, generation)).or_default().push(shard);
        }
        for ((id, generation), shards) in by_table {
            let clear = |shard: u32| {
                self.awaiting
                    .clear_released((id, generation, shard))
                    .map_err(|e| tracing::error!("cannot record that a released replica may be a source: {e}"))
            };
            let Some(entry) = catalog.by_id(id).filter(|e| e.generation == generation) else {
                // Dropped or truncated: nothing to protect.
                shards.into_iter().for_each(|shard| _ = clear(shard));
                continue;
            };
            let name = &entry.def.name;
            let rows = match self.check_cluster(name, Duration::from_millis(RELEASED_CHECK_TIMEOUT_MS)).await {
                Ok(rows) => rows,
                Err(e) => {
                    tracing::warn!(table = %name, "checking the other replicas of shards released after loss: {e}");
                    continue;
                }
            };
            for shard in shards {
                let mut others = rows.iter().filter(|r| r.shard == shard && r.rank != self.rank);
                if others.all(|r| r.rows.is_some() || r.message.contains(RELEASED_MARK)) && clear(shard).is_ok() {
                    tracing::info!(table = %name, shard,
                        "no replica of the shard awaits a rebuild any more: the one here, released empty after the \
                         loss, may be copied again");
                }
            }
        }
        self.awaiting.released_keys().is_empty()
    }

    /// Once this node's replicas are rebuilt: the other shards' replicas, which the lost node's
    /// queued rows may have reached in part (delivered to one replica, not yet to another, when
    /// its data dir was lost; or, for a shard whose every replica was lost, queued rows other
    /// nodes delivered to one of its new replicas only), are made the same, each from the one
    /// that holds the most rows (`Judge::MostRows`), said in the log for each replica copied.
    ///
    /// Of `tables` (by incarnation; one dropped or truncated since needs nothing), returns those
    /// to compare again: a replica left as it was (writes under way, so that the fullest cannot
    /// be told from one that rows reached first; a node down), or a repair that failed. Such a
    /// difference does not go away by itself, so the caller tries again.
    async fn reconcile_after_loss(&self, tables: &[(u64, u64)]) -> Vec<(u64, u64)> {
        let (_, catalog) = self.catalog_now();
        let timeout = Duration::from_millis(REPLACED_REBUILD_TIMEOUT_MS);
        let mut again = Vec::new();
        for &(id, generation) in tables {
            let Some(entry) = catalog.by_id(id).filter(|e| e.generation == generation) else { continue };
            let name = &entry.def.name;
            match self.repair_cluster(name, timeout, None, Judge::MostRows).await {
                Ok(rows) => {
                    for row in rows.iter().filter(|r| r.action != "none") {
                        tracing::warn!(table = %name, shard = row.shard, rank = row.rank, action = %row.action,
                            source = ?row.source_rank,
                            "after the lost data dir, the shard's replicas differed: {}", row.message);
                    }
                    if rows.iter().any(|r| r.action == "left") {
                        again.push((id, generation));
                    }
                }
                Err(e) => {
                    tracing::warn!(table = %name, "checking the table's replicas after the lost data dir: {e}");
                    again.push((id, generation));
                }
            }
        }
        again
    }

    /// What a repair left of this node's replicas awaiting their rebuild: a shard whose every
    /// replica awaits one, or was released after loss (two nodes lost at about the same time,
    /// each replaced), has nothing to copy from, its rows lost but for those other nodes still
    /// queue for it: its replicas here are released after loss, said as an error, and serve;
    /// the others are tried again.
    fn after_repair(&self, name: &str, (id, generation): (u64, u64), rows: &[ReplicaRepairRow]) {
        for row in rows.iter().filter(|r| r.rank == self.rank && self.awaiting.contains((id, generation, r.shard))) {
            let mut shard = rows.iter().filter(|o| o.shard == row.shard);
            if shard.all(|o| o.message.contains(AWAITING_MARK) || o.message.contains(RELEASED_MARK)) {
                tracing::error!(table = %name, shard = row.shard,
                    "every replica of the shard was on a lost data dir (this node's and other replacement nodes'): \
                     its rows are lost but for those other nodes still queue for it, and the replica here starts \
                     empty");
                if let Err(e) = self.awaiting.release_lost((id, generation, row.shard)) {
                    tracing::error!("cannot record that a replica needs no rebuild: {e}");
                }
            } else {
                tracing::warn!(table = %name, shard = row.shard, action = %row.action,
                    "a replica of this replacement node is not rebuilt yet: {}", row.message);
            }
        }
    }

    /// The tables (name, incarnation) with replicas awaiting their rebuild; replicas that need
    /// none any more (their table dropped or truncated, or nothing to rebuild them from) are let go.
    fn awaiting_tables(&self) -> BTreeMap<String, (u64, u64)> {
        let (_, catalog) = self.catalog_now();
        let mut tables = BTreeMap::new();
        for key in self.awaiting.keys() {
            let entry = catalog.by_id(key.0).filter(|e| e.generation == key.1);
            let release = match entry {
                None => true,
                Some(e) if e.def.replica_ranks(key.2, self.world_size).len() < 2 => {
                    tracing::error!(table = %e.def.name, shard = key.2,
                        "the shard's only replica was on the lost data dir this node replaced: its rows are lost, \
                         and the replica here starts empty");
                    true
                }
                Some(e) => {
                    tables.insert(e.def.name.clone(), (e.id, e.generation));
                    false
                }
            };
            if release && let Err(e) = self.awaiting.done(key) {
                tracing::error!("cannot record that a replica needs no rebuild: {e}");
            }
        }
        tables
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_replicas_awaiting_survive_a_restart_and_leave_one_by_one() -> Result<(), Box<dyn std::error::Error>> {
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().join("tables");
        let awaiting = AwaitingRebuild::load(&dir)?;
        assert!(awaiting.keys().is_empty() && awaiting.why((1, 1, 0), 2).is_none());
        let mut catalog = Catalog::default();
        let schema = std::sync::Arc::new(arrow::datatypes::Schema::new(vec![arrow::datatypes::Field::new(
            "id",
            arrow::datatypes::DataType::Int64,
            true,
        )]));
        for (name, replicas) in [("a", "2"), ("b", "1")] {
            let options = [("shard_key".to_string(), "id".to_string()), ("replicas".to_string(), replicas.to_string())];
            let def = shardwise_storage::TableDef::from_options(name, schema.clone(), &options, 3)?;
            let op = shardwise_storage::CatalogOp::CreateTable { def, if_not_exists: false };
            catalog = catalog.apply(&op, 3)?.0;
        }
        // 3 shards on 3 ranks: rank 2 holds shard 2 of both (replica 0) and shard 1 of `a` (replica 1).
        assert_eq!(awaiting.note_replacement("old-node", &catalog, 2, 3)?, 3);
        let again = AwaitingRebuild::load(&dir)?;
        assert_eq!(again.keys(), awaiting.keys());
        let first = again.keys()[0];
        let why = again.why(first, 2).ok_or("not fenced")?;
        assert!(why.contains("old-node") && why.contains("awaits its rebuild"), "{why}");
        again.done(first)?;
        assert!(again.why(first, 2).is_none());
        assert_eq!(AwaitingRebuild::load(&dir)?.keys().len(), 2);
        Ok(())
    }

    #[test]
    fn a_replica_released_after_loss_is_no_source_until_its_mark_is_lifted_even_across_a_restart()
    -> Result<(), Box<dyn std::error::Error>> {
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().join("tables");
        let awaiting = AwaitingRebuild::load(&dir)?;
        let mut catalog = Catalog::default();
        let schema = std::sync::Arc::new(arrow::datatypes::Schema::new(vec![arrow::datatypes::Field::new(
            "id",
            arrow::datatypes::DataType::Int64,
            true,
        )]));
        let options = [("shard_key".to_string(), "id".to_string()), ("replicas".to_string(), "2".to_string())];
        let def = shardwise_storage::TableDef::from_options("a", schema, &options, 3)?;
        catalog = catalog.apply(&shardwise_storage::CatalogOp::CreateTable { def, if_not_exists: false }, 3)?.0;
        awaiting.note_replacement("old-node", &catalog, 0, 3)?;
        let [first, second] = awaiting.keys()[..] else { return Err("rank 0 holds two replicas".into()) };
        // Released: it serves (no fence), it is not in the list of those awaiting, but a check
        // does not read it, with the mark that a rebuild of the other replica looks for.
        awaiting.release_lost(first)?;
        assert!(awaiting.why(first, 0).is_none() && !awaiting.contains(first));
        let why = awaiting.released_why(first).ok_or("no mark")?;
        assert!(why.contains(RELEASED_MARK) && why.contains("old-node"), "{why}");
        assert!(awaiting.released_why(second).is_none());
        // Done (rebuilt) is not released.
        awaiting.done(second)?;
        assert!(awaiting.is_empty() && awaiting.released_why(second).is_none());
        let again = AwaitingRebuild::load(&dir)?;
        assert!(again.is_empty() && again.released_why(first).is_some());
        assert_eq!(again.released_keys(), [first]);
        again.clear_released(first)?;
        assert!(AwaitingRebuild::load(&dir)?.released_keys().is_empty());
        Ok(())
    }
}
