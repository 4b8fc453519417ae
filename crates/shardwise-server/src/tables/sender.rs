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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

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
        let items =
            lock_from_runtime(&self.outbox).pending(dest, self.settings.ship_max_items, self.settings.ship_max_bytes);
        let Some(last_seq) = items.last().map(|i| i.seq) else { return backoff_ms };
        let req = ShipRequest {
            origin: Some(self.origin_id.clone()),
            items: items.iter().map(|i| ShipItem { seq: Some(i.seq), payload: Arc::clone(&i.payload) }).collect(),
        };
        match self.deliver(dest, req).await {
            Ok(_) => {
                let outbox = Arc::clone(&self.outbox);
                let acked = blocking(move || {
                    let delivered = lock(&outbox).ack(dest, last_seq);
                    // The lock is released: the delivered items are freed after it (`Delivered`).
                    delivered.map_err(super::storage_error)
                })
                .await;
                if let Err(e) = acked {
                    tracing::error!(dest, "cannot record a delivery in the outbox (it will be resent): {e}");
                    lock(&slot.status).last_error = Some(e.to_string());
                    tokio::time::sleep(Duration::from_millis(self.settings.sender_backoff_max_ms)).await;
                }
                0
            }
            Err(e) => {
                {
                    let mut status = lock(&slot.status);
                    status.retries += 1;
                    status.last_error = Some(e.to_string());
                }
                tracing::debug!(dest, "send failed, will retry: {e}");
                let next = if backoff_ms == 0 {
                    self.settings.sender_backoff_initial_ms
                } else {
                    (backoff_ms * 2).min(self.settings.sender_backoff_max_ms)
                };
                let jitter = rand::rng().random_range(0..=next / 4);
                // A flush or a new insert does not cut the backoff short: only time does.
                tokio::time::sleep(Duration::from_millis(next + jitter)).await;
                next
            }
        }
    }
}
