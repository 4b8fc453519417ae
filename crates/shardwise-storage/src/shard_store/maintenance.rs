//! Writing parts: [`ShardStore::flush`] turns the memory buffer into a part and checkpoints,
//! [`ShardStore::compact`] merges small parts, [`ShardStore::maintain`] does either when due, and
//! [`ShardStore::optimize`] does both now, when asked (`OPTIMIZE TABLE`).
//! Each makes its new file durable, then a manifest naming it, and only then deletes what the
//! manifest no longer needs (WAL segments, merged parts); see the module doc of [`super`].

use arrow::array::RecordBatch;

use super::ShardStore;
use super::files;
use super::manifest::Manifest;
use super::part::{EncodedPart, Part};
use crate::error::StorageError;

/// A flush starts a new WAL segment (so the covered one can be deleted) when the active one holds
/// at least this much: smaller ones are left to fill, as a new file and two directory fsyncs
/// would cost more than the space.
pub const WAL_ROLL_AT_CHECKPOINT_MIN_BYTES: u64 = 1024 * 1024;

/// What [`ShardStore::optimize`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OptimizeOutcome {
    /// Rows moved from the memory buffer (and the WAL) into a new part.
    pub flushed_rows: u64,
    /// How many parts were merged into one (0: none).
    pub merged_parts: usize,
    /// Parts left.
    pub parts: usize,
}

impl ShardStore {
    /// Writes the memory buffer as a new immutable part if it is non-empty; then checkpoints:
    /// a new manifest, then the WAL segments it covers are deleted.
    pub fn flush(&mut self) -> Result<(), StorageError> {
        self.checkpoint(false)
    }

    /// [`Self::flush`]; with `always`, a manifest is written even when nothing changed since the
    /// last one (a store made from an image records its dedup state so).
    pub(super) fn checkpoint(&mut self, always: bool) -> Result<(), StorageError> {
        self.check_usable()?;
        let encoded = match self.buffer_rows {
            0 => None,
            _ => Some(EncodedPart::new(self.next_part_number, &self.schema, &self.buffer)?),
        };
        let checkpoint = self.wal.next_lsn();
        if !always && encoded.is_none() && checkpoint.0 == self.manifest.wal_checkpoint_lsn {
            return Ok(());
        }
        let mut manifest = Manifest {
            parts: self.manifest.parts.clone(),
            hwm: self.dedup.hwm_map().clone(),
            insert_ids: self.dedup.window().cloned().collect(),
            verified_placement: self.verified_placement,
            wal_checkpoint_lsn: checkpoint.0,
            ..Manifest::empty()
        };
        let mut written = None;
        if let Some(encoded) = encoded {
            self.next_part_number += 1;
            let part = self.guard(encoded.write(self.fs.as_ref(), &self.dir))?;
            manifest.parts.push(part.entry.clone());
            written = Some(part);
        }
        self.guard(manifest.write(self.fs.as_ref(), &self.dir))?;
        self.parts.extend(written);
        self.manifest = manifest;
        self.buffer.clear();
        (self.buffer_rows, self.buffer_bytes) = (0, 0);
        // Every record is in the part now: the segments that hold them go (the active one too,
        // once it is worth a new file).
        let rolled = self.wal.roll_if_covered(checkpoint, WAL_ROLL_AT_CHECKPOINT_MIN_BYTES);
        self.guard(rolled)?;
        let truncated = self.wal.truncate_before(checkpoint);
        self.guard(truncated).map(|_| ())
    }

    /// Merges small parts into one when compact_min_parts small parts exist. Returns how many
    /// parts were merged (0 = nothing to do).
    pub fn compact(&mut self) -> Result<usize, StorageError> {
        self.check_usable()?;
        let target = self.opts.part_target_rows as u64;
        self.merge_parts(|part| part.entry.rows < target, self.opts.compact_min_parts)
    }

    /// `OPTIMIZE TABLE`: writes the memory buffer as a part (and checkpoints, so a restart
    /// replays nothing), then merges the small parts into one if there are at least two, or with
    /// `all_parts` (`FINAL`) every part whatever its size. Briefly holds the merged rows twice.
    pub fn optimize(&mut self, all_parts: bool) -> Result<OptimizeOutcome, StorageError> {
        self.check_usable()?;
        let flushed_rows = self.buffer_rows as u64;
        self.flush()?;
        let target = self.opts.part_target_rows as u64;
        let merged_parts = match all_parts {
            true => self.merge_parts(|_| true, 2)?,
            false => self.merge_parts(|part| part.entry.rows < target, 2)?,
        };
        Ok(OptimizeOutcome { flushed_rows, merged_parts, parts: self.parts.len() })
    }

    /// Merges the parts `chosen` picks into one new part when at least `min_parts` are picked;
    /// returns how many were merged (0 = fewer were picked, nothing written).
    fn merge_parts(&mut self, chosen: impl Fn(&Part) -> bool, min_parts: usize) -> Result<usize, StorageError> {
        let picked: Vec<&Part> = self.parts.iter().filter(|p| chosen(p)).collect();
        if picked.len() < min_parts.max(2) {
            return Ok(0);
        }
        let merged = picked.len();
        let batches: Vec<RecordBatch> = picked.iter().flat_map(|p| p.batches.iter().cloned()).collect();
        let removed: Vec<String> = picked.iter().map(|p| p.entry.name.clone()).collect();
        let encoded = EncodedPart::new(self.next_part_number, &self.schema, &batches)?;
        tracing::debug!(dir = %self.dir.display(), merged, into = encoded.name(), "merging shard store parts");
        self.next_part_number += 1;
        let new_part = self.guard(encoded.write(self.fs.as_ref(), &self.dir))?;
        // The new part takes the place of the first part it replaces.
        let mut parts = Vec::with_capacity(self.parts.len() + 1 - merged);
        let mut new_part = Some(new_part);
        for part in &self.parts {
            if !removed.contains(&part.entry.name) {
                parts.push(part.clone());
            } else if let Some(new_part) = new_part.take() {
                parts.push(new_part);
            }
        }
        let manifest = Manifest { parts: parts.iter().map(|p| p.entry.clone()).collect(), ..self.manifest.clone() };
        self.guard(manifest.write(self.fs.as_ref(), &self.dir))?;
        self.parts = parts;
        self.manifest = manifest;
        self.guard(files::remove_durably(self.fs.as_ref(), &self.dir, &removed))?;
        Ok(merged)
    }

    /// Flushes if the buffer is over its limits, then compacts if due. The node calls this from
    /// a background task after applies.
    pub fn maintain(&mut self) -> Result<(), StorageError> {
        self.check_usable()?;
        if self.buffer_rows >= self.opts.buffer_max_rows || self.buffer_bytes >= self.opts.buffer_max_bytes {
            self.flush()?;
        }
        self.compact().map(|_| ())
    }
}
