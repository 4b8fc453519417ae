//! One sender per destination rank (this node included): takes that destination's pending
//! outbox items in order, ships them in batches, and acks them in the outbox only after the
//! destination replied that it has them durable.
//!
//! Batching follows the tables' `delay_max_ms`, `delay_max_rows` and `delay_max_bytes`: a sender
//! ships when the oldest pending item is `delay_max_ms` old, or when `delay_max_rows` rows or
//! `delay_max_bytes` bytes are pending (the smallest setting among the tables with pending
//! items), or at once when a flush asks, or when the outbox holds half of `outbox_max_bytes`
//! ([`OUTBOX_PRESSURE_PERCENT`]: delay settings larger than the outbox must not make inserts wait
//! for room that only shipping makes), or when an insert found it full. A failed send keeps the items, counts a retry, keeps
//! the error for `system.sync_queues`, and backs off (doubling, capped at
//! `sender_backoff_max_ms`, with jitter).
//!
//! When the destination takes a shipment but refuses some of its items (a replica there of their
//! table cannot take writes: damaged files, a full disk; `apply.rs`), the items it took are acked
//! one by one, and the refused items' tables are **held back**: the sender goes on shipping the
//! other tables' items at once, and sends the held ones again, first in a shipment, after the
//! same doubling backoff, until the destination takes them. So one broken replica delays its own
//! table's rows to that node, not every table's.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use rand::Rng;
use tokio::sync::Notify;

use super::insert::unix_ms;
use super::{TablesNode, blocking, lock, lock_from_runtime, outbox_key_entry};
use crate::codec::{ShipItem, ShipRequest};

/// How full the outbox may get (percent of `outbox_max_bytes`) before every sender ships what it
/// has whatever the tables' delay settings say.
pub const OUTBOX_PRESSURE_PERCENT: u64 = 50;

/// What `system.sync_queues` shows of a sender.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SenderStatus {
    /// Failed sends since the node started.
    pub retries: u64,
    /// The last failure, kept after later successes so an operator can still see it.
    pub last_error: Option<String>,
    /// When it happened.
    pub last_error_at: Option<Instant>,
}

impl SenderStatus {
    fn failed(&mut self, error: String) {
        self.last_error = Some(error);
        self.last_error_at = Some(Instant::now());
    }
}

#[derive(Debug, Default)]
struct Slot {
    wake: Notify,
    urgent: AtomicBool,
    status: Mutex<SenderStatus>,
    /// Rows and bytes queued for this destination since its sender last shipped: an insert
    /// wakes the sender only when these pass a table's `delay_max_rows` / `delay_max_bytes`, so
    /// small inserts do not each make it look at the queue (under the outbox lock).
    queued_rows: AtomicU64,
    queued_bytes: AtomicU64,
    held: Mutex<Held>,
}

/// Tables (outbox keys) whose items the destination refused: left out of shipments until
/// `retry_at`, then sent again first.
#[derive(Debug, Default)]
struct Held {
    tables: BTreeSet<Arc<str>>,
    /// The error each held table's items were refused with.
    errors: BTreeMap<Arc<str>, String>,
    retry_at: Option<Instant>,
    backoff_ms: u64,
}

/// The senders' shared state, by destination rank.
#[derive(Debug)]
pub(crate) struct Senders {
    slots: Vec<Slot>,
}

impl Senders {
    pub(crate) fn new(world_size: u32) -> Self {
        Senders { slots: (0..world_size).map(|_| Slot::default()).collect() }
    }

    /// Counts rows and bytes queued for `dest`; wakes its sender once they reach the limits.
    pub(crate) fn queued(&self, dest: u32, rows: u64, bytes: u64, max_rows: u64, max_bytes: u64) {
        if let Some(s) = self.slots.get(dest as usize) {
            let r = s.queued_rows.fetch_add(rows, Ordering::Relaxed) + rows;
            let b = s.queued_bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
            if r >= max_rows || b >= max_bytes {
                s.wake.notify_one();
            }
        }
    }

    /// Makes every sender ship what it has now, ignoring the delay settings (for a flush).
    pub(crate) fn hurry_all(&self) {
        for s in &self.slots {
            s.urgent.store(true, Ordering::SeqCst);
            s.wake.notify_one();
        }
    }

    pub(crate) fn status(&self, dest: u32) -> SenderStatus {
        self.slots.get(dest as usize).map(|s| lock(&s.status).clone()).unwrap_or_default()
    }

    /// [`Self::last_error`] for a message about rows pending now: whether the table's rows are
    /// held back, or else how old the last error of shipping to `dest` is (it is kept after
    /// later successes, and may be about another table: a flush that timed out showed a
    /// three-minute-old error beside rows inserted a moment before, as if it were the reason).
    pub(crate) fn last_error_noted(&self, dest: u32, table: &str) -> Option<String> {
        let slot = self.slots.get(dest as usize)?;
        if let Some(held) = lock(&slot.held).errors.get(table) {
            return Some(format!("held back: {held}"));
        }
        let status = lock(&slot.status);
        let error = status.last_error.as_ref()?;
        let ago_s = status.last_error_at.map_or(0, |at| at.elapsed().as_secs());
        Some(format!("last error shipping to it, {ago_s} s ago: {error}"))
    }

    /// Whether `dest`'s sender holds back the items of a table whose outbox key `is_table` takes
    /// (the destination refused them).
    pub(crate) fn holds_back(&self, dest: u32, is_table: impl Fn(&str) -> bool) -> bool {
        self.slots.get(dest as usize).is_some_and(|slot| lock(&slot.held).tables.iter().any(|t| is_table(t)))
    }

    /// The last error of `dest`'s queue of the table with outbox key `table`: why its items are
    /// held back, if they are, else the last error of shipping to `dest`.
    pub(crate) fn last_error(&self, dest: u32, table: &str) -> Option<String> {
        let slot = self.slots.get(dest as usize)?;
        let held = lock(&slot.held).errors.get(table).cloned();
        held.or_else(|| lock(&slot.status).last_error.clone())
    }
}

/// Starts one sender per destination on the background runtime (`background.rs`), so that
/// shipping, and applying this node's own share, never takes a worker that answers requests.
pub(crate) fn spawn_all(node: &Arc<TablesNode>) -> Result<(), shardwise_query::QueryError> {
    for dest in 0..node.world_size {
        node.background.spawn(run(Arc::downgrade(node), dest))?;
    }
    Ok(())
}

/// Whether `dest`'s queue should be shipped now, and if not, how long until it should.
fn due(node: &TablesNode, dest: u32) -> Option<Duration> {
    let (_, catalog) = node.catalog_now();
    let (stats, outbox_bytes) = {
        let outbox = lock_from_runtime(&node.outbox);
        (outbox.dest_table_stats(dest), outbox.pending_bytes())
    };
    if !stats.is_empty() && outbox_bytes >= node.settings.outbox_max_bytes / 100 * OUTBOX_PRESSURE_PERCENT {
        return None;
    }
    let now = unix_ms();
    let mut total_rows = 0;
    let mut total_bytes = 0;
    let mut wait = Duration::from_millis(node.settings.sender_idle_poll_ms);
    let mut any = false;
    let (mut max_rows, mut max_bytes) = (u64::MAX, u64::MAX);
    for (key, q) in &stats {
        any = true;
        total_rows += q.pending_rows;
        total_bytes += q.pending_bytes;
        // A table dropped meanwhile: its items are about to be discarded; ship what is left now.
        let delay = outbox_key_entry(&catalog, key).map(|e| e.def.delay)?;
        max_rows = max_rows.min(delay.delay_max_rows);
        max_bytes = max_bytes.min(delay.delay_max_bytes);
        let age = now.saturating_sub(q.oldest_pending_unix_ms.unwrap_or(now));
        if age >= delay.delay_max_ms {
            return None;
        }
        wait = wait.min(Duration::from_millis(delay.delay_max_ms - age));
    }
    if !any || total_rows >= max_rows || total_bytes >= max_bytes {
        return if any { None } else { Some(wait) };
    }
    Some(wait)
}

async fn run(node: Weak<TablesNode>, dest: u32) {
    let mut backoff_ms = 0u64;
    loop {
        let Some(n) = node.upgrade() else { return };
        let Some(wait) = n.sender_wait(dest) else {
            backoff_ms = n.send_once(dest, backoff_ms).await;
            continue;
        };
        let Some(slot) = n.senders.slots.get(dest as usize) else { return };
        let notified = slot.wake.notified();
        tokio::pin!(notified);
        tokio::select! {
            _ = &mut notified => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

impl TablesNode {
    /// `None` if `dest`'s queue should be shipped now, else how long to wait.
    fn sender_wait(&self, dest: u32) -> Option<Duration> {
        let slot = self.senders.slots.get(dest as usize)?;
        let pending = lock_from_runtime(&self.outbox).dest_stats(dest).pending_items;
        if pending == 0 {
            slot.urgent.store(false, Ordering::SeqCst);
            return Some(Duration::from_millis(self.settings.sender_idle_poll_ms));
        }
        if slot.urgent.load(Ordering::SeqCst) { None } else { due(self, dest) }
    }

    /// Ships one batch of `dest`'s queue; returns the next backoff (0 after a success).
    async fn send_once(&self, dest: u32, backoff_ms: u64) -> u64 {
        let Some(slot) = self.senders.slots.get(dest as usize) else { return backoff_ms };
        slot.queued_rows.store(0, Ordering::Relaxed);
        slot.queued_bytes.store(0, Ordering::Relaxed);
        // Tables held back, unless it is time to send them again (then every item goes, in order).
        let (skip, retry_at) = {
            let held = lock(&slot.held);
            match held.retry_at {
                Some(at) if Instant::now() < at => (held.tables.clone(), Some(at)),
                _ => (BTreeSet::new(), None),
            }
        };
        let items = lock_from_runtime(&self.outbox).pending_except(
            dest,
            self.settings.ship_max_items,
            self.settings.ship_max_bytes,
            &skip,
        );
        let Some(last_seq) = items.last().map(|i| i.seq) else {
            // Only held-back items are pending: wait for their turn (or a poll).
            if let Some(at) = retry_at {
                let poll = Duration::from_millis(self.settings.sender_idle_poll_ms);
                tokio::time::sleep(at.saturating_duration_since(Instant::now()).min(poll)).await;
            }
            return backoff_ms;
        };
        let req = ShipRequest {
            origin: Some(self.origin_id.clone()),
            items: items.iter().map(|i| ShipItem { seq: Some(i.seq), payload: Arc::clone(&i.payload) }).collect(),
        };
        match self.deliver(dest, req).await {
            Ok(outcome) => {
                let refused: BTreeMap<u64, String> = outcome.refused.into_iter().map(|r| (r.seq, r.error)).collect();
                // All of a prefix of the queue: one ack up to its last seq; else the items taken.
                let taken = match skip.is_empty() && refused.is_empty() {
                    true => Taken::UpTo(last_seq),
                    false => {
                        Taken::Items(items.iter().map(|i| i.seq).filter(|seq| !refused.contains_key(seq)).collect())
                    }
                };
                self.ack_taken(dest, slot, taken).await;
                let mut held = lock(&slot.held);
                if refused.is_empty() {
                    if skip.is_empty() {
                        *held = Held::default();
                    }
                    return 0;
                }
                // Hold the refused items' tables back; the others go on at once.
                let refused_tables: BTreeMap<Arc<str>, String> = items
                    .iter()
                    .filter_map(|i| refused.get(&i.seq).map(|error| (Arc::clone(&i.table), error.clone())))
                    .collect();
                if skip.is_empty() {
                    held.tables.clear();
                    held.errors.clear();
                }
                held.tables.extend(refused_tables.keys().cloned());
                held.errors.extend(refused_tables);
                held.backoff_ms = self.next_backoff_ms(held.backoff_ms);
                held.retry_at = Some(Instant::now() + Duration::from_millis(with_jitter(held.backoff_ms)));
                let error = refused.into_values().next().unwrap_or_default();
                drop(held);
                let mut status = lock(&slot.status);
                status.retries += 1;
                status.failed(error.clone());
                tracing::debug!(dest, "items refused, their tables held back: {error}");
                0
            }
            Err(e) => {
                {
                    let mut status = lock(&slot.status);
                    status.retries += 1;
                    status.failed(e.to_string());
                }
                tracing::debug!(dest, "send failed, will retry: {e}");
                let next = self.next_backoff_ms(backoff_ms);
                // A flush or a new insert does not cut the backoff short: only time does.
                tokio::time::sleep(Duration::from_millis(with_jitter(next))).await;
                next
            }
        }
    }

    /// The backoff after one of `backoff_ms` (0: none yet): doubling, capped.
    fn next_backoff_ms(&self, backoff_ms: u64) -> u64 {
        match backoff_ms {
            0 => self.settings.sender_backoff_initial_ms,
            _ => (backoff_ms * 2).min(self.settings.sender_backoff_max_ms),
        }
    }

    /// Records in the outbox that `dest` has `taken` durable.
    async fn ack_taken(&self, dest: u32, slot: &Slot, taken: Taken) {
        if matches!(&taken, Taken::Items(seqs) if seqs.is_empty()) {
            return;
        }
        let outbox = Arc::clone(&self.outbox);
        let acked = blocking(move || {
            let mut outbox = lock(&outbox);
            let delivered = match &taken {
                Taken::UpTo(last_seq) => outbox.ack(dest, *last_seq),
                Taken::Items(seqs) => outbox.ack_items(dest, seqs),
            };
            drop(outbox);
            // The lock is released: the delivered items are freed after it (`Delivered`).
            delivered.map(drop).map_err(super::storage_error)
        })
        .await;
        if let Err(e) = acked {
            tracing::error!(dest, "cannot record a delivery in the outbox (it will be resent): {e}");
            lock(&slot.status).failed(e.to_string());
            tokio::time::sleep(Duration::from_millis(self.settings.sender_backoff_max_ms)).await;
        }
    }
}

/// What a destination took of a shipment.
enum Taken {
    /// Every item up to this seq.
    UpTo(u64),
    /// These items.
    Items(Vec<u64>),
}

/// `ms` and up to a quarter more, at random.
fn with_jitter(ms: u64) -> u64 {
    ms + rand::rng().random_range(0..=ms / 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_queue_names_its_held_error_or_the_age_of_the_last_one() {
        let senders = Senders::new(2);
        assert_eq!(senders.last_error_noted(1, "t"), None);
        lock(&senders.slots[1].status).failed("rank 1: connection refused".into());
        let noted = senders.last_error_noted(1, "t").unwrap_or_default();
        assert_eq!(noted, "last error shipping to it, 0 s ago: rank 1: connection refused");
        lock(&senders.slots[1].held).errors.insert(Arc::from("t"), "replica failed".into());
        assert_eq!(senders.last_error_noted(1, "t").as_deref(), Some("held back: replica failed"));
        assert!(senders.last_error_noted(1, "u").unwrap_or_default().starts_with("last error shipping"));
    }
}
