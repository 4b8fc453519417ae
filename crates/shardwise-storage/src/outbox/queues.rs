//! The outbox's in-memory state: every pending item, per destination in seq order, and which WAL
//! records still hold a pending item (the oldest of them bounds what the log may delete).
//!
//! The same methods apply a record whether it was just written or is being replayed, so what a
//! restart rebuilds is what the running outbox had.
//!
//! Per-queue (table, destination) totals are kept as items come and go, so reading them costs
//! the number of queues, not the number of items: senders read them under the outbox lock that
//! inserts take, and a queue to an unreachable node holds many thousands of items.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::record::{self, Record};
use super::{OutboxItem, PendingItem, QueueStats};

/// Bytes the WAL adds around a record payload (frame header and LSN).
const FRAME_OVERHEAD_BYTES: u64 = 16;

/// One pending item.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub table: Arc<str>,
    pub rows: u64,
    pub payload: Arc<Vec<u8>>,
    pub appended_unix_ms: u64,
    /// The LSN of the WAL record that holds this item now (its append, or a later carry).
    pub record_lsn: u64,
}

/// A WAL record that still holds pending items.
#[derive(Debug, Clone, Copy)]
struct LiveRecord {
    items: u64,
    /// Where the record starts, in bytes of log written or replayed since open.
    log_pos: u64,
}

/// The running totals of one (table, destination) queue.
#[derive(Debug, Default)]
struct QueueTotals {
    items: u64,
    rows: u64,
    bytes: u64,
    /// How many pending items were appended at each time (ms): the first key is the oldest.
    appended_unix_ms: BTreeMap<u64, u64>,
}

impl QueueTotals {
    fn stats(&self) -> QueueStats {
        QueueStats {
            pending_items: self.items,
            pending_rows: self.rows,
            pending_bytes: self.bytes,
            oldest_pending_unix_ms: self.appended_unix_ms.keys().next().copied(),
        }
    }
}

/// Pending items and the bookkeeping for truncation and compaction.
#[derive(Debug, Default)]
pub(super) struct Queues {
    /// Per destination, pending items by seq.
    dests: BTreeMap<u32, BTreeMap<u64, Entry>>,
    /// Per destination, then table, the totals of each queue with pending items.
    totals: BTreeMap<u32, BTreeMap<Arc<str>, QueueTotals>>,
    /// Records holding pending items, by LSN.
    live_records: BTreeMap<u64, LiveRecord>,
    pending_items: u64,
    pending_bytes: u64,
    /// What carry records of every pending item would take, in bytes.
    pending_carry_bytes: u64,
    /// The log position of the next record.
    log_end: u64,
    /// The highest seq of any item appended, replayed or carried: the next must be above it.
    max_seq: u64,
}

impl Queues {
    /// Applies a replayed record found at `lsn`.
    pub fn apply(&mut self, lsn: u64, payload_len: usize, record: Record) -> Result<(), String> {
        let log_pos = self.note_record(payload_len);
        match record {
            Record::Append { seq, appended_unix_ms, items } => {
                if seq <= self.max_seq {
                    return Err(format!("append seq {seq} is not above the highest seq before it, {}", self.max_seq));
                }
                self.max_seq = seq;
                for item in items {
                    let entry = Entry {
                        table: self.shared_name(item.table),
                        rows: item.rows,
                        payload: Arc::new(item.payload),
                        appended_unix_ms,
                        record_lsn: lsn,
                    };
                    self.insert(item.dest, seq, entry, log_pos);
                }
            }
            Record::Ack { acks } => {
                for (dest, up_to_seq) in acks {
                    self.ack(dest, up_to_seq);
                }
            }
            Record::AckedItems { items } => {
                for (dest, seq) in items {
                    self.remove(dest, seq);
                }
            }
            Record::Discard { table } => {
                self.discard(&table);
            }
            Record::Carry { items } => {
                for carried in items {
                    self.max_seq = self.max_seq.max(carried.seq);
                    let entry = Entry {
                        table: self.shared_name(carried.item.table),
                        rows: carried.item.rows,
                        payload: Arc::new(carried.item.payload),
                        appended_unix_ms: carried.appended_unix_ms,
                        record_lsn: lsn,
                    };
                    self.insert(carried.item.dest, carried.seq, entry, log_pos);
                }
            }
        }
        Ok(())
    }

    /// `table` as the name pending items already share, if any has it (a replayed item then
    /// shares its table's name with the others, as the items of an append do).
    fn shared_name(&self, table: String) -> Arc<str> {
        let known = self.totals.values().find_map(|tables| tables.get_key_value(table.as_str()));
        known.map_or_else(|| table.into(), |(name, _)| Arc::clone(name))
    }

    /// Adds the items of an append of `seq` just written at `lsn`.
    pub fn append(&mut self, seq: u64, lsn: u64, payload_len: usize, appended_unix_ms: u64, items: Vec<OutboxItem>) {
        let log_pos = self.note_record(payload_len);
        self.max_seq = self.max_seq.max(seq);
        for item in items {
            let entry = Entry {
                table: item.table,
                rows: item.rows,
                payload: Arc::new(item.payload),
                appended_unix_ms,
                record_lsn: lsn,
            };
            self.insert(item.dest, seq, entry, log_pos);
        }
    }

    /// Notes that a carry record holding `keys` (dest, seq) was just written at `lsn`.
    pub fn carried(&mut self, lsn: u64, payload_len: usize, keys: &[(u32, u64)]) {
        let log_pos = self.note_record(payload_len);
        for &(dest, seq) in keys {
            if let Some(mut entry) = self.remove(dest, seq) {
                entry.record_lsn = lsn;
                self.insert(dest, seq, entry, log_pos);
            }
        }
    }

    /// Notes a record that holds no item (an ack or a discard) at the end of the log.
    pub fn note_record(&mut self, payload_len: usize) -> u64 {
        let log_pos = self.log_end;
        self.log_end = self.log_end.saturating_add(payload_len as u64 + FRAME_OVERHEAD_BYTES);
        log_pos
    }

    /// True if `ack(dest, up_to_seq)` would remove something.
    pub fn ackable(&self, dest: u32, up_to_seq: u64) -> bool {
        let first = self.dests.get(&dest).and_then(|queue| queue.keys().next());
        first.is_some_and(|&seq| seq <= up_to_seq)
    }

    /// Removes `dest`'s items with seq <= `up_to_seq` and returns them (for the caller to free
    /// when it likes: see [`super::Delivered`]).
    pub fn ack(&mut self, dest: u32, up_to_seq: u64) -> BTreeMap<u64, Entry> {
        let Some(queue) = self.dests.get_mut(&dest) else { return BTreeMap::new() };
        let acked = match up_to_seq.checked_add(1) {
            Some(first_kept) => {
                let kept = queue.split_off(&first_kept);
                std::mem::replace(queue, kept)
            }
            None => std::mem::take(queue),
        };
        if queue.is_empty() {
            self.dests.remove(&dest);
        }
        for entry in acked.values() {
            self.forget(dest, entry);
        }
        acked
    }

    /// Removes `dest`'s items of the seqs `seqs` that are pending and returns them (for the
    /// caller to free when it likes, as [`Self::ack`]).
    pub fn ack_items(&mut self, dest: u32, seqs: &[u64]) -> BTreeMap<u64, Entry> {
        seqs.iter().filter_map(|&seq| self.remove(dest, seq).map(|entry| (seq, entry))).collect()
    }

    /// Whether any of `seqs` is pending for `dest`.
    pub fn any_pending(&self, dest: u32, seqs: &[u64]) -> bool {
        self.dests.get(&dest).is_some_and(|queue| seqs.iter().any(|seq| queue.contains_key(seq)))
    }

    /// How many pending items belong to `table`.
    pub fn count_table(&self, table: &str) -> u64 {
        self.dests.values().flat_map(BTreeMap::values).filter(|e| &*e.table == table).count() as u64
    }

    /// Removes every pending item of `table`; returns how many.
    pub fn discard(&mut self, table: &str) -> u64 {
        let doomed: Vec<(u32, u64)> = self
            .dests
            .iter()
            .flat_map(|(&dest, queue)| {
                queue.iter().filter(|(_, e)| &*e.table == table).map(move |(&seq, _)| (dest, seq))
            })
            .collect();
        for &(dest, seq) in &doomed {
            self.remove(dest, seq);
        }
        doomed.len() as u64
    }

    /// `dest`'s first pending items in seq order, those of the tables `skip` names left out: at
    /// most `max_items`, and no more than `max_bytes` of payload unless the first item alone is
    /// larger (at least one if any).
    pub fn pending(&self, dest: u32, max_items: usize, max_bytes: u64, skip: &BTreeSet<Arc<str>>) -> Vec<PendingItem> {
        let Some(queue) = self.dests.get(&dest) else { return Vec::new() };
        let mut out = Vec::new();
        let mut bytes = 0u64;
        for (&seq, entry) in queue.iter().filter(|(_, e)| !skip.contains(&e.table)) {
            let len = entry.payload.len() as u64;
            if !out.is_empty() && (out.len() >= max_items || bytes.saturating_add(len) > max_bytes) {
                break;
            }
            bytes = bytes.saturating_add(len);
            out.push(PendingItem {
                seq,
                table: Arc::clone(&entry.table),
                rows: entry.rows,
                payload: Arc::clone(&entry.payload),
                appended_unix_ms: entry.appended_unix_ms,
            });
        }
        out
    }

    /// Every pending item as (dest, seq, entry), by destination then seq.
    pub fn entries(&self) -> impl Iterator<Item = (u32, u64, &Entry)> {
        self.dests.iter().flat_map(|(&dest, queue)| queue.iter().map(move |(&seq, e)| (dest, seq, e)))
    }

    /// Whether `dest` has a pending item below seq `before` whose table key `table` accepts.
    pub fn any_pending_before(&self, dest: u32, before: u64, table: impl Fn(&str) -> bool) -> bool {
        self.dests.get(&dest).is_some_and(|queue| queue.range(..before).any(|(_, e)| table(&e.table)))
    }

    pub fn get(&self, dest: u32, seq: u64) -> Option<&Entry> {
        self.dests.get(&dest)?.get(&seq)
    }

    /// Every non-empty queue's totals, by (table, destination).
    pub fn stats(&self) -> BTreeMap<(String, u32), QueueStats> {
        let queues = self.totals.iter().flat_map(|(&dest, tables)| tables.iter().map(move |(t, q)| (t, dest, q)));
        queues.map(|(table, dest, totals)| ((table.to_string(), dest), totals.stats())).collect()
    }

    /// Each table's queue to `dest` that has pending items.
    pub fn dest_table_stats(&self, dest: u32) -> Vec<(Arc<str>, QueueStats)> {
        let tables = self.totals.get(&dest).into_iter().flat_map(BTreeMap::iter);
        tables.filter(|(_, q)| q.items > 0).map(|(table, q)| (Arc::clone(table), q.stats())).collect()
    }

    /// The totals of every table's queue to `dest`.
    pub fn dest_stats(&self, dest: u32) -> QueueStats {
        let mut stats = QueueStats::default();
        for totals in self.totals.get(&dest).into_iter().flat_map(BTreeMap::values) {
            stats.pending_items += totals.items;
            stats.pending_rows = stats.pending_rows.saturating_add(totals.rows);
            stats.pending_bytes += totals.bytes;
            let oldest = totals.appended_unix_ms.keys().next().copied();
            stats.oldest_pending_unix_ms = match (stats.oldest_pending_unix_ms, oldest) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        stats
    }

    pub fn destinations(&self) -> Vec<u32> {
        self.dests.keys().copied().collect()
    }

    /// The highest seq seen (0 if none).
    pub fn max_seq(&self) -> u64 {
        self.max_seq
    }

    pub fn pending_items(&self) -> u64 {
        self.pending_items
    }

    pub fn pending_bytes(&self) -> u64 {
        self.pending_bytes
    }

    pub fn pending_carry_bytes(&self) -> u64 {
        self.pending_carry_bytes
    }

    /// The LSN of the oldest record that still holds a pending item.
    pub fn oldest_live_lsn(&self) -> Option<u64> {
        self.live_records.keys().next().copied()
    }

    /// Bytes of log from the oldest record holding a pending item to the end: what the WAL must
    /// keep, give or take a segment.
    pub fn live_log_span_bytes(&self) -> u64 {
        let oldest = self.live_records.values().next().map_or(self.log_end, |r| r.log_pos);
        self.log_end.saturating_sub(oldest)
    }

    /// Adds (or, for a key already pending, replaces) an item held by the record at `log_pos`.
    fn insert(&mut self, dest: u32, seq: u64, entry: Entry, log_pos: u64) {
        self.remove(dest, seq);
        let record = self.live_records.entry(entry.record_lsn).or_insert(LiveRecord { items: 0, log_pos });
        record.items += 1;
        self.pending_items += 1;
        self.pending_bytes += entry.payload.len() as u64;
        self.pending_carry_bytes += record::carried_item_encoded_bytes(&entry.table, entry.payload.len()) as u64;
        let tables = self.totals.entry(dest).or_default();
        let totals = tables.entry(Arc::clone(&entry.table)).or_default();
        totals.items += 1;
        totals.rows = totals.rows.saturating_add(entry.rows);
        totals.bytes += entry.payload.len() as u64;
        *totals.appended_unix_ms.entry(entry.appended_unix_ms).or_default() += 1;
        self.dests.entry(dest).or_default().insert(seq, entry);
    }

    fn remove(&mut self, dest: u32, seq: u64) -> Option<Entry> {
        let queue = self.dests.get_mut(&dest)?;
        let entry = queue.remove(&seq)?;
        if queue.is_empty() {
            self.dests.remove(&dest);
        }
        self.forget(dest, &entry);
        Some(entry)
    }

    /// Takes an item removed from `dest`'s queue out of the counters and its record's count.
    fn forget(&mut self, dest: u32, entry: &Entry) {
        if let Some(tables) = self.totals.get_mut(&dest)
            && let Some(totals) = tables.get_mut(&*entry.table)
        {
            totals.items -= 1;
            totals.rows = totals.rows.saturating_sub(entry.rows);
            totals.bytes -= entry.payload.len() as u64;
            if let Some(n) = totals.appended_unix_ms.get_mut(&entry.appended_unix_ms) {
                *n -= 1;
                if *n == 0 {
                    totals.appended_unix_ms.remove(&entry.appended_unix_ms);
                }
            }
            if totals.items == 0 {
                tables.remove(&*entry.table);
                if tables.is_empty() {
                    self.totals.remove(&dest);
                }
            }
        }
        self.pending_items -= 1;
        self.pending_bytes -= entry.payload.len() as u64;
        self.pending_carry_bytes -= record::carried_item_encoded_bytes(&entry.table, entry.payload.len()) as u64;
        if let Some(record) = self.live_records.get_mut(&entry.record_lsn) {
            record.items -= 1;
            if record.items == 0 {
                self.live_records.remove(&entry.record_lsn);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xorshift::XorShift64;

    /// The totals counted from the items themselves.
    fn recount(queues: &Queues) -> BTreeMap<(String, u32), QueueStats> {
        let mut out: BTreeMap<(String, u32), QueueStats> = BTreeMap::new();
        for (dest, _, entry) in queues.entries() {
            let stats = out.entry((entry.table.to_string(), dest)).or_default();
            stats.pending_items += 1;
            stats.pending_rows += entry.rows;
            stats.pending_bytes += entry.payload.len() as u64;
            let oldest = stats.oldest_pending_unix_ms.map_or(entry.appended_unix_ms, |t| t.min(entry.appended_unix_ms));
            stats.oldest_pending_unix_ms = Some(oldest);
        }
        out
    }

    #[test]
    fn running_totals_match_a_recount_through_appends_acks_carries_and_discards() {
        let mut rng = XorShift64::new(7);
        let mut queues = Queues::default();
        let mut seq = 0;
        for step in 0..3_000u64 {
            match rng.below(10) {
                0..=5 => {
                    seq += 1;
                    let items = (0..1 + rng.below(3))
                        .map(|_| OutboxItem {
                            table: format!("t{}", rng.below(3)).into(),
                            dest: rng.below(4) as u32,
                            rows: rng.below(100) as u64,
                            payload: vec![0; rng.below(50)],
                        })
                        .collect();
                    // Times go backwards now and then (a clock step), and repeat.
                    queues.append(seq, step, 10, 1_000 + step / 3 - rng.below(5) as u64, items);
                }
                6..=7 => {
                    queues.ack(rng.below(4) as u32, seq.saturating_sub(rng.below(20) as u64));
                }
                8 => {
                    let keys: Vec<(u32, u64)> = queues.entries().take(5).map(|(d, s, _)| (d, s)).collect();
                    queues.carried(step, 10, &keys);
                }
                _ if rng.below(10) == 0 => {
                    queues.discard(&format!("t{}", rng.below(3)));
                }
                _ => {}
            }
            let expected = recount(&queues);
            assert_eq!(queues.stats(), expected, "step {step}");
            for dest in 0..4 {
                let mut sum = QueueStats::default();
                for ((_, d), q) in expected.iter().filter(|((_, d), _)| *d == dest) {
                    assert_eq!(*d, dest);
                    sum.pending_items += q.pending_items;
                    sum.pending_rows += q.pending_rows;
                    sum.pending_bytes += q.pending_bytes;
                    sum.oldest_pending_unix_ms = match (sum.oldest_pending_unix_ms, q.oldest_pending_unix_ms) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
                assert_eq!(queues.dest_stats(dest), sum, "step {step}, dest {dest}");
            }
        }
        assert!(queues.pending_items() > 0, "the walk should end with items pending");
    }
}
