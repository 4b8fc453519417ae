//! Reclaiming disk: deleting the WAL segments that hold nothing pending, and compaction, which
//! re-writes still-pending items at the end of the log (carry records, under their original seqs)
//! when a slow destination would otherwise keep every segment after its oldest item.
//!
//! Trigger: the log from the oldest record holding a pending item to the end passes twice the
//! encoded size of every pending item plus two segments. Compaction then re-writes all pending
//! items, so each byte is re-written about once at most, amortised, and the WAL stays under about
//! `2 × outbox_max_bytes + 3 × wal_segment_max_bytes`. Carry records are written (fsynced) before
//! any segment is deleted; replay lets a carried item replace its earlier copy, so a crash at any
//! point leaves each pending item there exactly once.

use super::record::{self, ItemRef};
use super::{CARRY_BATCH_MAX_BYTES, CARRY_RECORD_TARGET_BYTES, Outbox};
use crate::error::StorageError;
use crate::wal::Lsn;

impl Outbox {
    /// Compacts if the log kept for pending items has grown too long, then deletes the segments
    /// below the oldest record that still holds a pending item.
    pub(super) fn reclaim(&mut self) -> Result<(), StorageError> {
        let span_bytes = self.queues.live_log_span_bytes();
        let carry_bytes = self.queues.pending_carry_bytes();
        let slack_bytes = self.opts.wal.wal_segment_max_bytes.saturating_mul(2);
        if span_bytes > carry_bytes.saturating_mul(2).saturating_add(slack_bytes) {
            tracing::debug!(span_bytes, carry_bytes, "outbox compaction: carrying pending items forward");
            self.carry_all()?;
        }
        let keep_from = self.queues.oldest_live_lsn().map_or(self.wal.next_lsn(), Lsn);
        self.wal.truncate_before(keep_from)?;
        Ok(())
    }

    /// Re-writes every pending item in carry records at the end of the log, so every older
    /// record holds nothing pending.
    fn carry_all(&mut self) -> Result<(), StorageError> {
        let mut records: Vec<Vec<(u32, u64)>> = Vec::new();
        let mut record_bytes = 0;
        for (dest, seq, entry) in self.queues.entries() {
            let bytes = record::carried_item_encoded_bytes(&entry.table, entry.payload.len());
            match records.last_mut() {
                Some(last) if record_bytes + bytes <= CARRY_RECORD_TARGET_BYTES => last.push((dest, seq)),
                _ => {
                    records.push(vec![(dest, seq)]);
                    record_bytes = 0;
                }
            }
            record_bytes += bytes;
        }
        let mut next = 0;
        while next < records.len() {
            let mut batch = Vec::new();
            let mut batch_bytes = 0;
            while let Some(keys) = records.get(next + batch.len()) {
                let encoded = self.encode_carry(keys);
                batch_bytes += encoded.len();
                batch.push(encoded);
                if batch_bytes >= CARRY_BATCH_MAX_BYTES {
                    break;
                }
            }
            let refs: Vec<&[u8]> = batch.iter().map(Vec::as_slice).collect();
            let first = self.wal.append(&refs)?.start.0;
            for (i, encoded) in batch.iter().enumerate() {
                self.queues.carried(first + i as u64, encoded.len(), &records[next + i]);
            }
            next += batch.len();
        }
        Ok(())
    }

    fn encode_carry(&self, keys: &[(u32, u64)]) -> Vec<u8> {
        let items: Vec<(u64, u64, ItemRef<'_>)> = keys
            .iter()
            .filter_map(|&(dest, seq)| {
                let e = self.queues.get(dest, seq)?;
                Some((seq, e.appended_unix_ms, ItemRef { dest, rows: e.rows, table: &e.table, payload: &e.payload }))
            })
            .collect();
        record::encode_carry(&items)
    }
}
