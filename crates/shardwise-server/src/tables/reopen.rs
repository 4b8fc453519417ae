//! Shard replicas that failed are reopened in place once their disk may be usable again.
//!
//! A store fails on any write or fsync error (a full disk, an I/O error) and takes nothing from
//! then on: after fsyncgate a log whose fsync failed is not trusted again without a reopen, which
//! reads what the disk really holds (docs/storage.md). It used to stay failed until the node
//! restarted, even once space was freed. Now the maintenance loop reopens it every
//! `store_reopen_interval_ms` until the open succeeds (as a restart would: recovery from its
//! files, the same checks and reports), then swaps the new store in. Rows the replica missed
//! meanwhile come as after a restart: delayed shipments held back for it, `immediate` pieces
//! handed off to their initiators' outboxes. The failed store takes no write and answers no
//! read while it is being replaced.
//!
//! The node's outbox is reopened the same way: a failed outbox refuses every delayed insert
//! through this node (`unavailable`), and its senders cannot record deliveries. Once a reopen
//! succeeds, the reopened outbox (its pending items recovered from its log, the same identity,
//! sequence numbers leased past every one used) replaces the failed one under the outbox's lock,
//! and the senders go on from what it holds: items they had shipped but not recorded as
//! delivered are shipped again, and the receivers' high-water marks drop the copies.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{SharedStore, StoreKey, TablesNode, lock};

impl TablesNode {
    /// Reopens the failed `store` of `key` if its last attempt (or its failure, first seen now)
    /// is at least `store_reopen_interval_ms` old; swaps the reopened store in.
    pub(super) async fn reopen_if_due(&self, key: StoreKey, store: &SharedStore) {
        let interval = Duration::from_millis(self.settings.store_reopen_interval_ms);
        let due = {
            let mut attempts = lock(&self.reopen_attempts);
            let last = *attempts.entry(key).or_insert_with(Instant::now);
            last.elapsed() >= interval
        };
        if !due {
            return;
        }
        let (_, catalog) = self.catalog_now();
        let Some(entry) = catalog.tables.values().find(|e| (e.id, e.generation) == (key.0, key.1)) else {
            // Dropped or truncated meanwhile: `remove_dropped` deletes it.
            lock(&self.reopen_attempts).remove(&key);
            return;
        };
        let (name, shard) = (entry.def.name.clone(), key.2);
        let _opening = self.opening.lock().await;
        // Being rebuilt: the repair reopens or replaces it. A fence that lapsed is forgotten.
        if self.fenced(key).is_some() {
            return;
        }
        // Replaced meanwhile (every swap holds `opening`): opening its files a second time, beside
        // the store that now uses them, could remove a part that store is writing.
        if !lock(&self.stores).get(&key).is_some_and(|current| Arc::ptr_eq(current, store)) {
            return;
        }
        self.forget_lapsed_fence(key);
        // A store retired for a repair that died part-way (its fence lapsed): back in service as
        // it was, not reopened (its files may be what was wrong with it).
        if lock(store).failure().is_none() {
            self.unretire(key);
            lock(&self.reopen_attempts).remove(&key);
            return;
        }
        let opened = self.open_store(entry, key).await;
        match opened {
            Ok(reopened) => {
                let mut stores = lock(&self.stores);
                // Only over the failed store: a drop may have removed it meanwhile.
                if stores.get(&key).is_some_and(|current| Arc::ptr_eq(current, store)) {
                    stores.insert(key, Arc::new(Mutex::new(reopened)));
                    tracing::warn!(table = %name, shard, "shard replica reopened after its failure; it takes writes again");
                }
                lock(&self.reopen_attempts).remove(&key);
            }
            Err(e) => {
                // Kept in `open_failures` too, which `/health` and `system.shards` show.
                tracing::debug!(table = %name, shard, "the failed shard replica does not reopen yet: {e}");
                lock(&self.reopen_attempts).insert(key, Instant::now());
            }
        }
    }

    /// Reopens the failed outbox if its last attempt (or its failure, first seen now) is at least
    /// `store_reopen_interval_ms` old; swaps the reopened outbox in.
    pub(super) async fn reopen_outbox_if_due(&self) {
        let interval = Duration::from_millis(self.settings.store_reopen_interval_ms);
        let due = {
            let mut attempt = lock(&self.outbox_reopen_attempt);
            attempt.get_or_insert_with(Instant::now).elapsed() >= interval
        };
        if !due {
            return;
        }
        let dir = lock(&self.outbox).dir().to_path_buf();
        let max_bytes = self.settings.outbox_max_bytes;
        let opened = self.background.blocking(move || super::open_outbox(dir, max_bytes)).await;
        match opened {
            Ok(reopened) => {
                let mut outbox = lock(&self.outbox);
                // The failed outbox takes no write, so nothing was added to it meanwhile.
                if outbox.failure().is_some() {
                    *outbox = reopened;
                    tracing::warn!("outbox reopened after its failure; it takes delayed inserts again");
                }
                *lock(&self.outbox_reopen_attempt) = None;
            }
            Err(e) => {
                // `/health` and the inserts it refuses name the outbox's failure meanwhile.
                tracing::debug!("the failed outbox does not reopen yet: {e}");
                *lock(&self.outbox_reopen_attempt) = Some(Instant::now());
            }
        }
    }
}
