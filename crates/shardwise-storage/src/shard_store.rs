//! The shard store: one replica of one shard of one table, on one node's disk. It takes pieces of
//! rows, deduplicates resends, makes every acknowledged piece durable before it returns, and
//! serves everything applied so far as Arrow batches.
//!
//! # On disk
//!
//! ```text
//! <dir>/MANIFEST                     JSON: parts, dedup state and WAL checkpoint (format_version 1)
//! <dir>/part-<n, 20 digits>.arrow    immutable Arrow IPC files
//! <dir>/wal/wal-<lsn>.log            the write-ahead log (crate::wal)
//! <dir>/*.tmp                        a part or manifest being written; removed on open
//! ```
//!
//! - **Apply**: each piece that is not a duplicate becomes one WAL record (a versioned header with
//!   origin, seq, insert id and the placement flag, then the batch as an Arrow IPC stream; see
//!   `shard_store/record.rs`); the whole call is one [`Wal::append`], so one fsync. Only after it returns are
//!   the pieces added to the memory buffer and the dedup state. A piece whose insert id is a
//!   duplicate but whose `seq` is new gets a header-only record, so its origin's high-water mark
//!   advances durably too.
//! - **Flush**: the buffer is written as a new part (temp file, fsync, rename, fsync of `dir`),
//!   then a new MANIFEST (same steps) lists it with its length and CRC32C, the dedup state and
//!   `wal_checkpoint_lsn` = the WAL's next LSN: every record below it is reflected in the parts and
//!   the manifest. Only after the manifest is durable are WAL segments below the checkpoint deleted.
//! - **Compaction**: when `compact_min_parts` parts are smaller than `part_target_rows`, their
//!   batches are written as one new part, a manifest naming it instead of them is made durable,
//!   and only then are the old files deleted (and `dir` fsynced).
//! - **Dedup state** (per-origin high-water marks, the last `insert_id_window` insert ids) is
//!   committed with the data: through the WAL record for rows in the buffer, through the manifest
//!   for rows in parts. Replay rebuilds it exactly.
//! - **Open**: fsync `dir` (a rename read below must be durable before anything is deleted on its
//!   word); read the manifest (none, in a directory without parts or WAL segments: a new store,
//!   and an empty manifest is written; none while those exist: an error, never a guess); check
//!   each part's length and CRC32C before
//!   decoding it (a mismatch is an error naming the part); delete temp files and part files the
//!   manifest does not list (a crash between writing a part and the manifest, or between the
//!   manifest and deleting compacted parts); open the WAL and replay records at or above the
//!   checkpoint. Mid-log WAL corruption is reported in [`ShardRecovery::wal`]; a checksummed record
//!   that does not decode is an error naming its LSN. If the WAL ends below the checkpoint (it
//!   lost records the parts already hold), it skips ahead ([`Wal::skip_to`]) so new records are
//!   never numbered below the checkpoint and skipped by the next replay.
//!
//! # Dedup
//!
//! A piece with `origin` and `seq` is a duplicate when `seq` is at or below the origin's
//! high-water mark: the mark never forgets, but it assumes the origin sends in `seq` order (an
//! outbox resends everything unacknowledged before anything newer). A piece whose `insert_id` is
//! among the last `insert_id_window` applied ids is a duplicate too; that window is a count, not
//! a time, and forgets the oldest id first.
//!
//! A crash between any two steps loses no acknowledged row and doubles none: a part is counted
//! only once a durable manifest names it, and the manifest's checkpoint says which WAL records it
//! already covers.
//!
//! # Errors and limits
//!
//! Any I/O error while writing fails the store for good (as it does the WAL: a retried fsync
//! cannot be trusted); every later write returns [`StorageError::ShardStoreFailed`] until the store
//! is reopened, which recovers from what is really on disk. A bad piece (wrong schema, a `seq`
//! without an `origin`, larger than [`WAL_RECORD_MAX_BYTES`] once encoded) is rejected before
//! anything is written, and does not fail the store.
//!
//! Every part is held in memory, decoded, for as long as the store is open (and the buffer, up to
//! its limits): a shard replica must fit in RAM, and a compaction briefly holds the merged rows
//! twice. Replay holds the WAL's records in memory while it decodes them. The high-water-mark map has an entry per origin
//! ever seen (origins are nodes, so it stays small). One process may open a store at a time.

mod dedup;
mod files;
mod image;
pub use image::{ImageHeader, ReplicaImage};
mod maintenance;
pub use maintenance::OptimizeOutcome;
mod manifest;
mod part;
#[cfg(test)]
mod power_loss_tests;
mod record;
mod recovery;
#[cfg(test)]
mod recovery_tests;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;

use crate::error::StorageError;
use crate::fs::Fs;
use crate::ipc_size::row_bytes;
use crate::wal::{Recovery, WAL_RECORD_MAX_BYTES, Wal, WalOptions};
use dedup::{Decision, DedupState};
use manifest::Manifest;
use part::Part;
use record::PieceRecord;

/// Default `buffer_max_rows`.
pub const SHARD_BUFFER_MAX_ROWS_DEFAULT: usize = 1_000_000;
/// Default `buffer_max_bytes` (64 MiB).
pub const SHARD_BUFFER_MAX_BYTES_DEFAULT: usize = 64 * 1024 * 1024;
/// Default `compact_min_parts`.
pub const SHARD_COMPACT_MIN_PARTS_DEFAULT: usize = 8;
/// Default `part_target_rows`.
pub const SHARD_PART_TARGET_ROWS_DEFAULT: usize = 4_000_000;
/// Default `insert_id_window`.
pub const SHARD_INSERT_ID_WINDOW_DEFAULT: usize = 10_000;

/// The most memory a store keeps, between applies, for encoding WAL records. Reusing it spares
/// each bulk apply a fresh multi-megabyte allocation (and the page faults of touching it);
/// larger buffers are freed after use.
pub const SHARD_ENCODE_BUFFER_KEEP_BYTES: usize = 32 * 1024 * 1024;

/// Shard store settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardStoreOptions {
    /// [`ShardStore::maintain`] flushes the buffer to a part once it holds this many rows.
    pub buffer_max_rows: usize,
    /// ... or once its batches take this much Arrow memory.
    pub buffer_max_bytes: usize,
    /// Compact when at least this many parts are smaller than `part_target_rows` (at least 2).
    pub compact_min_parts: usize,
    /// Parts with fewer rows are small, and merged by compaction.
    pub part_target_rows: usize,
    /// How many recent insert ids are remembered for dedup (0: no dedup by insert id).
    pub insert_id_window: usize,
    /// The settings of the store's WAL (in `<dir>/wal`).
    pub wal: WalOptions,
}

impl Default for ShardStoreOptions {
    fn default() -> Self {
        ShardStoreOptions {
            buffer_max_rows: SHARD_BUFFER_MAX_ROWS_DEFAULT,
            buffer_max_bytes: SHARD_BUFFER_MAX_BYTES_DEFAULT,
            compact_min_parts: SHARD_COMPACT_MIN_PARTS_DEFAULT,
            part_target_rows: SHARD_PART_TARGET_ROWS_DEFAULT,
            insert_id_window: SHARD_INSERT_ID_WINDOW_DEFAULT,
            wal: WalOptions::default(),
        }
    }
}

impl ShardStoreOptions {
    fn validate(&self) -> Result<(), StorageError> {
        let check = |name, value: usize, min: usize| {
            if value >= min {
                return Ok(());
            }
            Err(StorageError::InvalidOption { name, value: value.to_string(), expected: format!("at least {min}") })
        };
        check("buffer_max_rows", self.buffer_max_rows, 1)?;
        check("buffer_max_bytes", self.buffer_max_bytes, 1)?;
        check("compact_min_parts", self.compact_min_parts, 2)?;
        check("part_target_rows", self.part_target_rows, 1)
    }
}

/// The identity of a sender whose pieces carry monotone sequence numbers (an outbox): dedup key.
pub type OriginId = String;

/// Rows to apply to a shard store, with what identifies a resend of them.
#[derive(Debug, Clone)]
pub struct Piece {
    /// With `seq`: per-origin high-water-mark dedup. Without `seq` it plays no part.
    pub origin: Option<OriginId>,
    /// Monotone per origin as seen by this store (may skip values). Requires `origin`.
    pub seq: Option<u64>,
    /// Client-given or generated idempotency key; dedup within the window.
    pub insert_id: Option<String>,
    /// The rows were placed by shardwise's placement function.
    pub verified_placement: bool,
    /// Must have the store's columns (names, types, nullability, field metadata); schema-level
    /// metadata is not compared, and stored rows carry the store's schema.
    pub batch: RecordBatch,
}

/// What [`ShardStore::apply`] did with one piece.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyOutcome {
    /// The rows are now durable in the store.
    Applied { rows: u64 },
    /// A resend of a piece already applied: nothing written.
    Duplicate,
}

/// Sizes and flags of a shard store, for monitoring and planning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ShardStats {
    /// Rows in parts and buffer.
    pub rows: u64,
    /// Bytes of the rows in parts and buffer (as Arrow arrays; [`crate::ipc_size::row_bytes`]).
    pub bytes: u64,
    pub parts: usize,
    pub buffer_rows: u64,
    pub wal_segments: usize,
    /// True when every row was placed by shardwise's placement function.
    pub verified_placement: bool,
    /// How many origins have a high-water mark.
    pub hwm_origins: usize,
}

/// What [`ShardStore::open`] found and did.
#[derive(Debug)]
pub struct ShardRecovery {
    /// The WAL's report. Its `records` are moved out: they were replayed into the store.
    pub wal: Recovery,
    /// How many WAL records at or above the checkpoint were replayed.
    pub replayed_records: usize,
    /// Temp files and part files no manifest listed, deleted.
    pub orphan_parts_removed: Vec<String>,
}

/// One shard replica's storage. See the module doc for the contract.
pub struct ShardStore {
    dir: PathBuf,
    fs: Arc<dyn Fs>,
    schema: SchemaRef,
    opts: ShardStoreOptions,
    wal: Wal,
    /// The manifest as it is on disk; `parts` are its parts, decoded.
    manifest: Manifest,
    parts: Vec<Part>,
    buffer: Vec<RecordBatch>,
    buffer_rows: usize,
    buffer_bytes: usize,
    /// Reused by `apply` to encode WAL records (at most [`SHARD_ENCODE_BUFFER_KEEP_BYTES`] kept).
    encode_buffer: Vec<u8>,
    dedup: DedupState,
    verified_placement: bool,
    next_part_number: u64,
    /// Set by the first I/O error that leaves the store in an unknown state.
    failure: Option<String>,
    /// Why the replica misses rows it acknowledged (a damaged WAL), if it does; see
    /// [`ShardStore::unreadable`].
    damage: Option<String>,
    /// What this open's recovery cut off the WAL's end that may have been acknowledged; see
    /// [`ShardStore::warning`].
    tail_cut: Option<String>,
    /// Why the store was set aside ([`ShardStore::retire`]), if it was.
    retired: Option<String>,
}

impl std::fmt::Debug for ShardStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardStore")
            .field("dir", &self.dir)
            .field("stats", &self.stats())
            .field("failure", &self.failure)
            .finish_non_exhaustive()
    }
}

impl ShardStore {
    /// Opens (or creates) the store in `dir` and recovers it (see the module doc).
    pub fn open(
        dir: impl Into<PathBuf>,
        fs: Arc<dyn Fs>,
        schema: SchemaRef,
        opts: ShardStoreOptions,
    ) -> Result<(ShardStore, ShardRecovery), StorageError> {
        recovery::open(dir.into(), fs, schema, opts)
    }

    /// Applies pieces in order; all applied ones are durable (one WAL append = one fsync for the
    /// lot) before it returns. Dedup: a piece with (origin, seq) where `seq <= hwm[origin]` is
    /// Duplicate; else a piece whose insert_id is in the window is Duplicate (but `hwm[origin]`
    /// still advances to seq). Duplicates within the same call are handled too. On an error
    /// nothing of the call is applied (an I/O error may leave its records in the WAL, to be
    /// replayed on reopen: resend them, and dedup drops what was kept).
    pub fn apply(&mut self, pieces: &[Piece]) -> Result<Vec<ApplyOutcome>, StorageError> {
        self.check_usable()?;
        let batches = self.check_pieces(pieces)?;
        let decisions = self.dedup.decide(pieces);
        // Every record of the call is encoded back to back into the store's reused buffer.
        let mut encoded = std::mem::take(&mut self.encode_buffer);
        encoded.clear();
        let mut records = Vec::new();
        for (index, ((piece, decision), batch)) in pieces.iter().zip(&decisions).zip(batches).enumerate() {
            let batch = match decision {
                Decision::Apply => Some(batch),
                Decision::DuplicateAdvance => None,
                Decision::Duplicate => continue,
            };
            let insert_id = piece.insert_id.clone().filter(|_| batch.is_some());
            let (origin, seq, verified_placement) = (piece.origin.clone(), piece.seq, piece.verified_placement);
            let record = PieceRecord { origin, seq, insert_id, verified_placement, batch };
            let start = encoded.len();
            record::encode_into(&record, &mut encoded)?;
            if encoded.len() - start > WAL_RECORD_MAX_BYTES {
                let problem = format!(
                    "{} bytes once encoded, more than one WAL record may hold ({WAL_RECORD_MAX_BYTES}); split it",
                    encoded.len() - start
                );
                return Err(StorageError::InvalidPiece { dir: self.dir.clone(), piece: index, problem });
            }
            records.push((record, start..encoded.len()));
        }
        if !records.is_empty() {
            let payloads: Vec<&[u8]> = records.iter().map(|(_, range)| &encoded[range.clone()]).collect();
            if let Err(error) = self.wal.append(&payloads) {
                if self.wal.failure().is_some() {
                    self.fail(&error);
                }
                return Err(error);
            }
        }
        if encoded.capacity() <= SHARD_ENCODE_BUFFER_KEEP_BYTES {
            self.encode_buffer = encoded;
        }
        for (record, _) in records {
            self.absorb(record);
        }
        let outcomes = pieces.iter().zip(decisions).map(|(piece, decision)| match decision {
            Decision::Apply => ApplyOutcome::Applied { rows: piece.batch.num_rows() as u64 },
            Decision::Duplicate | Decision::DuplicateAdvance => ApplyOutcome::Duplicate,
        });
        Ok(outcomes.collect())
    }

    /// Everything applied so far (parts + buffer), as batches of the store schema. Cheap (Arc
    /// clones).
    pub fn snapshot(&self) -> Vec<RecordBatch> {
        let parts = self.parts.iter().flat_map(|p| p.batches.iter());
        parts.chain(self.buffer.iter()).cloned().collect()
    }

    /// The files this store has open or listed (its manifest, parts and live WAL segments) that
    /// are no longer in its directory: removed from under a running node, whose memory still
    /// holds their rows (they would be gone at its next start). Empty when all are there.
    pub fn missing_files(&self) -> Result<Vec<String>, StorageError> {
        let listed = |dir: &Path| -> Result<std::collections::HashSet<String>, StorageError> {
            Ok(self.fs.list_dir(dir).map_err(StorageError::io("list", dir))?.into_iter().collect())
        };
        let here = listed(&self.dir)?;
        // A store writes its manifest with its first part.
        let mut missing: Vec<String> = std::iter::once(files::MANIFEST_NAME)
            .filter(|_| !self.parts.is_empty())
            .chain(self.parts.iter().map(|p| p.entry.name.as_str()))
            .filter(|name| !here.contains(*name))
            .map(str::to_string)
            .collect();
        let wal_dir = self.wal.dir();
        let in_wal = listed(wal_dir)?;
        missing.extend(
            self.wal.segment_names().filter(|n| !in_wal.contains(*n)).map(|n| format!("{}/{n}", files::WAL_DIR_NAME)),
        );
        Ok(missing)
    }

    /// Sizes and flags of the store.
    pub fn stats(&self) -> ShardStats {
        let part_rows: u64 = self.parts.iter().map(|p| p.entry.rows).sum();
        let part_bytes: usize = self.parts.iter().map(|p| p.mem_bytes).sum();
        ShardStats {
            rows: part_rows + self.buffer_rows as u64,
            bytes: (part_bytes + self.buffer_bytes) as u64,
            parts: self.parts.len(),
            buffer_rows: self.buffer_rows as u64,
            wal_segments: self.wal.segment_count(),
            verified_placement: self.verified_placement,
            hwm_origins: self.dedup.hwm_map().len(),
        }
    }

    /// The high-water mark of `origin`: the highest `seq` applied (or skipped as a duplicate by
    /// insert id) from it.
    pub fn hwm(&self, origin: &str) -> Option<u64> {
        self.dedup.hwm(origin)
    }

    /// The store's schema.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Closes the store's WAL at a clean stop, recording where it ends ([`Wal::close_cleanly`]):
    /// the next open then reports records removed meanwhile, and keeps the replica out of reads.
    /// A failed store is left as it is (its next open replays what its log holds). Every later
    /// write fails.
    pub fn close_cleanly(&mut self) -> Result<(), StorageError> {
        if self.failure.is_some() || self.retired.is_some() {
            return Ok(());
        }
        self.wal.close_cleanly()
    }

    /// Sets the store aside for good: from now on it takes no writes (applies, flushes, merges
    /// and a clean close all refuse) and is not read, `why` saying so. A replica being rebuilt
    /// (`REPAIR TABLE`) is retired first, so that nothing changes it, or its directory, while
    /// its replacement is made. Reopening its files gives a store that takes writes again.
    pub fn retire(&mut self, why: impl Into<String>) {
        self.retired.get_or_insert_with(|| why.into());
    }

    /// Puts a retired store back in service, as it was: its memory still holds every row it
    /// had (even rows whose files were removed from under it), which reopening its files might
    /// not give back.
    pub fn unretire(&mut self) {
        self.retired = None;
    }

    /// Whether the store was set aside ([`Self::retire`]).
    pub fn is_retired(&self) -> bool {
        self.retired.is_some()
    }

    /// The first error that failed the store, if it has failed.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// Why this replica must not answer reads, if it must not: it failed (an I/O error; rows
    /// written to the other replicas since are missing here, until it is reopened), or its WAL was found damaged (rows it acknowledged are missing, for good: the
    /// replica stays out of reads, its `DAMAGED` file saying why). Queries read another replica.
    pub fn unreadable(&self) -> Option<String> {
        if let Some(why) = &self.retired {
            return Some(why.clone());
        }
        match (&self.failure, &self.damage) {
            (Some(failure), _) => Some(format!(
                "it failed and takes no writes until it is reopened (retried every store_reopen_interval_ms, \
                     10 s) (first error: {failure})"
            )),
            (None, Some(damage)) => Some(format!("damaged: {damage}")),
            (None, None) => None,
        }
    }

    /// What an operator should know though the replica is read: the recovery that opened it cut
    /// a last WAL record that was whole but failed its checksum. A crash while the record was
    /// written explains that (it was not acknowledged, nothing is missing), but so does damage to
    /// a record that was (its rows are then missing here; the other replicas have them). A
    /// record cut short, the usual mark of a crash mid-write, is no warning.
    pub fn warning(&self) -> Option<String> {
        self.tail_cut.clone()
    }

    /// Checks every piece before anything is written; returns their batches with the store's
    /// schema.
    fn check_pieces(&self, pieces: &[Piece]) -> Result<Vec<RecordBatch>, StorageError> {
        let mut batches = Vec::with_capacity(pieces.len());
        for (index, piece) in pieces.iter().enumerate() {
            if piece.seq.is_some() && piece.origin.is_none() {
                let problem = "seq is set without origin (a sequence number means nothing without its sender)";
                return Err(StorageError::InvalidPiece {
                    dir: self.dir.clone(),
                    piece: index,
                    problem: problem.into(),
                });
            }
            let mismatch = |found: String| StorageError::PieceSchemaMismatch {
                dir: self.dir.clone(),
                piece: index,
                expected: format!("{:?}", self.schema.fields()),
                found,
            };
            if piece.batch.schema_ref().fields() != self.schema.fields() {
                return Err(mismatch(format!("{:?}", piece.batch.schema_ref().fields())));
            }
            let batch = RecordBatch::try_new(self.schema.clone(), piece.batch.columns().to_vec());
            batches.push(batch.map_err(|e| mismatch(e.to_string()))?);
        }
        Ok(batches)
    }

    /// Adds a durable (or replayed) record to the buffer and the dedup state.
    fn absorb(&mut self, record: PieceRecord) {
        self.dedup.observe(record.origin.as_deref(), record.seq, record.insert_id.as_deref());
        let Some(batch) = record.batch else { return };
        if batch.num_rows() == 0 {
            return;
        }
        self.verified_placement &= record.verified_placement;
        self.buffer_rows += batch.num_rows();
        self.buffer_bytes += row_bytes(&batch);
        self.buffer.push(batch);
    }

    fn check_usable(&self) -> Result<(), StorageError> {
        if let Some(why) = &self.retired {
            return Err(StorageError::ShardStoreRetired { dir: self.dir.clone(), why: why.clone() });
        }
        match &self.failure {
            Some(cause) => Err(StorageError::ShardStoreFailed { dir: self.dir.clone(), cause: cause.clone() }),
            None => Ok(()),
        }
    }

    fn fail(&mut self, error: &StorageError) {
        match self.dir.exists() {
            true => {
                tracing::error!(dir = %self.dir.display(), "shard store failed, refusing writes until reopened: {error}")
            }
            // The usual cause: its table was dropped or truncated, and its files removed, while a
            // flush, merge or late write was on its way; a warning, not an alarm.
            false => tracing::warn!(
                dir = %self.dir.display(),
                "shard store's directory is gone (its table dropped or truncated?); refusing writes: {error}"
            ),
        }
        self.failure.get_or_insert_with(|| error.to_string());
    }

    /// Fails the store if `result` is an error: for steps after which memory and disk may
    /// disagree.
    fn guard<T>(&mut self, result: Result<T, StorageError>) -> Result<T, StorageError> {
        result.inspect_err(|error| self.fail(error))
    }
}
