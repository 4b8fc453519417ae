//! The durable outbox of `delay_mode_distributed`: an insert is appended here on the node that
//! received it (fsynced) and acknowledged at once; background senders, one per destination node,
//! read [`Outbox::pending`] items, ship them, and [`Outbox::ack`] them once the destination has
//! them durable. Receivers drop duplicates by (origin id, seq), so a crash between shipping and
//! acking only causes a resend, while a seq handed out twice would make receivers drop new data.
//!
//! # On disk
//! ```text
//! <dir>/OUTBOX_ID   32 lowercase hex digits + "\n": the identity, random, created once
//! <dir>/SEQ_LEASE   decimal u64 + "\n": every seq handed out so far is below it
//! <dir>/wal/        a `Wal`: segments wal-<first LSN, 20 digits>.log
//! ```
//! Both small files are replaced atomically (tmp file, fsync, rename, directory fsync; see
//! `meta`). Each WAL record is one outbox record (byte layouts in `record`): an **append** (a
//! seq and one insert's items, at most one per destination: all or none), an **ack** (`dest`,
//! `up_to_seq`), a **discard** (a table) or a **carry** (still-pending items re-written under
//! their original seqs). Replay applies them in LSN order; an ack or discard affects only the
//! items pending at that point, and one naming items that are not there is a no-op.
//!
//! # Seqs
//! Seqs are handed out in increasing order from a lease: before seq `s` is used, `SEQ_LEASE`
//! holds a value above `s` (it is extended by `SEQ_LEASE_SIZE` at a time, and on every open).
//! A reopen starts at the larger of the lease and one past the highest seq in the log, so a seq
//! is never reused, even after every segment but the active one was deleted, or if the end of the
//! log was lost (bit rot in its last record, a disk that lied about a flush). Seqs are therefore
//! increasing but not dense: each reopen skips the rest of a lease. [`Outbox::open`] refuses an
//! `OUTBOX_ID` without `SEQ_LEASE` or without any WAL segment (the log was lost), and a log with
//! records but no `OUTBOX_ID`.
//!
//! # What is fsynced, when
//! - `open`: the directory's parent; the WAL's segments and directory (by [`Wal::open`]); a new
//!   `SEQ_LEASE`; on first open then `OUTBOX_ID` (so an identity always has its log and lease);
//! - `append`: one WAL record, fsynced before the seq is returned (and `SEQ_LEASE` first, when
//!   the lease is used up);
//! - `ack` and `discard_table`: one WAL record each, fsynced, before memory changes; then, if
//!   needed, carry records (fsynced) and segment deletions (directory fsynced after each);
//! - any I/O error fails the outbox (the WAL's rule, fsyncgate): every later write fails until the
//!   outbox is reopened, which recovers from what is on disk. An append, ack or discard that
//!   returned an error may or may not have taken effect after the reopen, never partly.
//!
//! # Memory and disk bounds
//! Every pending payload is held in memory (so `pending` needs no I/O): at most
//! `outbox_max_bytes` of payload, enforced by `append`. A reopen with a smaller limit keeps
//! what is there and refuses appends until acks bring it under.
//! A segment can be deleted once no item in it is pending; so that one slow destination cannot pin
//! the log behind its oldest item, `ack` and `discard_table` compact it when needed (see
//! `compact`): the WAL stays under about `2 × outbox_max_bytes + 3 × wal_segment_max_bytes`.
//! `open` reads it whole into memory once.

mod compact;
mod meta;
#[cfg(test)]
mod power_loss_tests;
mod queues;
mod record;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use meta::{OUTBOX_ID_FILE, SEQ_LEASE_FILE};

use crate::error::StorageError;
use crate::fs::Fs;
use crate::wal::{Lsn, Recovery, Wal, WalOptions, parse_segment_name};
use queues::Queues;
use record::{ItemRef, check_items, item_ref};

/// The default `outbox_max_bytes`: 1 GiB of pending payload.
pub const OUTBOX_MAX_BYTES_DEFAULT: u64 = 1024 * 1024 * 1024;
/// The outbox's WAL directory, inside the outbox directory.
pub const OUTBOX_WAL_DIR: &str = "wal";
/// How far each extension of the seq lease reaches. Small under test, so tests renew it often.
const SEQ_LEASE_SIZE: u64 = if cfg!(test) { 4 } else { 1 << 16 };
/// Carry records are cut at about this size (a larger single item gets a record of its own).
pub(super) const CARRY_RECORD_TARGET_BYTES: usize = 4 * 1024 * 1024;
/// Carry records are written (and fsynced) in batches of at most about this many bytes.
pub(super) const CARRY_BATCH_MAX_BYTES: usize = 32 * 1024 * 1024;

/// Outbox settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxOptions {
    /// The most payload bytes that may be pending (in memory and on disk); an append that would
    /// go past it fails with [`StorageError::OutboxFull`].
    pub outbox_max_bytes: u64,
    pub wal: WalOptions,
}

/// How far ahead of its records the outbox keeps its log zero-filled (see the WAL's module doc):
/// inserts are small and acknowledged after the append's fsync, which this makes a data-only
/// flush. One insert in about `64 KiB / insert size` pays for writing the next zeros (about
/// 0.2 ms here; 256 KiB at a time took 0.6-1.2 ms inside a busy node, 4 MiB 16 ms).
pub const OUTBOX_WAL_PREALLOCATE_BYTES: u64 = 64 * 1024;

impl Default for OutboxOptions {
    fn default() -> Self {
        OutboxOptions {
            outbox_max_bytes: OUTBOX_MAX_BYTES_DEFAULT,
            wal: WalOptions { wal_preallocate_bytes: OUTBOX_WAL_PREALLOCATE_BYTES, ..WalOptions::default() },
        }
    }
}

/// One destination's share of an insert. The payload is opaque to the outbox.
#[derive(Debug, Clone)]
pub struct OutboxItem {
    /// Shared by an insert's items (one per destination) and kept as is while they are pending.
    pub table: Arc<str>,
    pub dest: u32,
    pub rows: u64,
    pub payload: Vec<u8>,
}

/// An item waiting to be delivered to its destination.
#[derive(Debug, Clone)]
pub struct PendingItem {
    pub seq: u64,
    pub table: Arc<str>,
    pub rows: u64,
    pub payload: Arc<Vec<u8>>,
    pub appended_unix_ms: u64,
}

/// The items an [`Outbox::ack`] removed, freed when this is dropped.
///
/// A shipping round acks up to `ship_max_items` items at once, and freeing them is that many
/// deallocations. The senders that ack run at a low priority (docs/sync.md) and hold the outbox's
/// lock, which every insert needs, while they ack: the less they do under it, the less a
/// preempted sender can hold the inserts up. So the items leave the outbox with this, to be
/// dropped after the lock is released. (No change in insert latency was measurable on the
/// benchmark host; BENCHMARKS.md, "Disk or CPU".)
#[derive(Debug, Default)]
pub struct Delivered {
    entries: BTreeMap<u64, queues::Entry>,
}

impl Delivered {
    /// How many items were delivered.
    pub fn items(&self) -> usize {
        self.entries.len()
    }
}

/// What is waiting in one queue (or several).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueStats {
    pub pending_items: u64,
    pub pending_rows: u64,
    pub pending_bytes: u64,
    /// The earliest `appended_unix_ms` of a pending item.
    pub oldest_pending_unix_ms: Option<u64>,
}

/// What [`Outbox::open`] found.
#[derive(Debug)]
pub struct OutboxRecovery {
    /// The WAL's report: torn tail cut, corruption set aside. Its `records` are left empty (the
    /// outbox consumed them).
    pub wal: Recovery,
    /// How many items are pending after replay.
    pub pending_items: u64,
}

/// The durable outbox. See the module doc for the contract.
pub struct Outbox {
    dir: PathBuf,
    fs: Arc<dyn Fs>,
    opts: OutboxOptions,
    origin_id: String,
    wal: Wal,
    queues: Queues,
    /// The seq the next append gets.
    next_seq: u64,
    /// What `SEQ_LEASE` holds: every seq handed out is below it.
    seq_lease: u64,
    /// Set by an I/O error outside the WAL (the lease file); the WAL keeps its own.
    failure: Option<String>,
}

impl fmt::Debug for Outbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Outbox")
            .field("dir", &self.dir)
            .field("origin_id", &self.origin_id)
            .field("pending_items", &self.queues.pending_items())
            .field("pending_bytes", &self.queues.pending_bytes())
            .field("wal", &self.wal)
            .finish_non_exhaustive()
    }
}

impl Outbox {
    /// Opens (or creates) the outbox in `dir` and replays its log: pending items are those
    /// appended and neither acked nor discarded. Mid-log corruption is reported in the
    /// [`OutboxRecovery`], not an error; a record that does not decode is an error.
    pub fn open(
        dir: impl Into<PathBuf>,
        fs: Arc<dyn Fs>,
        opts: OutboxOptions,
    ) -> Result<(Outbox, OutboxRecovery), StorageError> {
        opts.validate()?;
        let dir = dir.into();
        fs.create_dir_all(&dir).map_err(StorageError::io("create dir", &dir))?;
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs.sync_dir(parent).map_err(StorageError::io("fsync dir", parent))?;
        }
        let wal_dir = dir.join(OUTBOX_WAL_DIR);
        let meta = meta::read(fs.as_ref(), &dir)?;
        if meta.origin_id.is_some() {
            let missing = if meta.seq_lease.is_none() {
                Some(format!("{SEQ_LEASE_FILE} is missing"))
            } else if !has_segments(fs.as_ref(), &wal_dir)? {
                Some(format!("{} holds no WAL segment: the log was lost", wal_dir.display()))
            } else {
                None
            };
            if let Some(missing) = missing {
                let problem = format!("{OUTBOX_ID_FILE} exists but {missing}");
                return Err(StorageError::OutboxInconsistent { dir, problem });
            }
        }
        let (wal, mut wal_recovery) = Wal::open(&wal_dir, Arc::clone(&fs), opts.wal.clone())?;
        if meta.origin_id.is_none() && wal.next_lsn() != Lsn::FIRST {
            let problem = format!(
                "{OUTBOX_ID_FILE} is missing but the WAL has been written up to LSN {}: the identity its seqs \
                 belong to was lost",
                wal.next_lsn()
            );
            return Err(StorageError::OutboxInconsistent { dir, problem });
        }
        let mut queues = Queues::default();
        for rec in std::mem::take(&mut wal_recovery.records) {
            let applied = record::decode(&rec.payload).and_then(|r| queues.apply(rec.lsn.0, rec.payload.len(), r));
            applied.map_err(|problem| StorageError::OutboxRecordInvalid {
                dir: wal_dir.clone(),
                lsn: rec.lsn.0,
                problem,
            })?;
        }
        let next_seq = meta.seq_lease.unwrap_or(1).max(queues.max_seq().saturating_add(1));
        let seq_lease = extended_lease(&dir, next_seq)?;
        meta::write_lease(fs.as_ref(), &dir, seq_lease)?;
        let origin_id = match meta.origin_id {
            Some(id) => id,
            None => meta::create_id(fs.as_ref(), &dir)?,
        };
        let pending_items = queues.pending_items();
        tracing::info!(
            dir = %dir.display(),
            origin_id,
            pending_items,
            pending_bytes = queues.pending_bytes(),
            corruptions = wal_recovery.corruptions.len(),
            "outbox opened"
        );
        let outbox = Outbox { dir, fs, opts, origin_id, wal, queues, next_seq, seq_lease, failure: None };
        Ok((outbox, OutboxRecovery { wal: wal_recovery, pending_items }))
    }

    /// This outbox's persistent identity (random 128-bit hex, created once with the outbox,
    /// stored in the file `OUTBOX_ID` written atomically + dir fsync). Receivers use
    /// (origin_id, seq) for high-water-mark dedup.
    pub fn origin_id(&self) -> &str {
        &self.origin_id
    }

    /// Appends one insert's items (one per destination; a destination may appear once, since
    /// receivers dedup by seq) as ONE WAL record (all or none), fsynced before it returns.
    /// Returns the seq shared by these items: strictly greater than every seq this outbox handed
    /// out before, across restarts and truncation. Fails, changing nothing, with
    /// [`StorageError::OutboxFull`] if the pending payload would pass `outbox_max_bytes`, with
    /// [`StorageError::OutboxAppendInvalid`] for no items or a repeated destination, and with
    /// [`StorageError::RecordTooLarge`] if the record would pass `WAL_RECORD_MAX_BYTES`.
    pub fn append(&mut self, items: Vec<OutboxItem>, now_unix_ms: u64) -> Result<u64, StorageError> {
        self.check_usable()?;
        check_items(&items)?;
        let append_bytes = items.iter().map(|i| i.payload.len() as u64).sum::<u64>();
        let pending_bytes = self.queues.pending_bytes();
        let max_bytes = self.opts.outbox_max_bytes;
        if pending_bytes.saturating_add(append_bytes) > max_bytes {
            return Err(StorageError::OutboxFull { dir: self.dir.clone(), pending_bytes, append_bytes, max_bytes });
        }
        let seq = self.next_seq;
        if seq >= self.seq_lease {
            let seq_lease = extended_lease(&self.dir, seq)?;
            if let Err(error) = meta::write_lease(self.fs.as_ref(), &self.dir, seq_lease) {
                return Err(self.fail(error));
            }
            self.seq_lease = seq_lease;
        }
        let refs: Vec<ItemRef<'_>> = items.iter().map(item_ref).collect();
        let encoded = record::encode_append(seq, now_unix_ms, &refs);
        let lsn = self.wal.append(&[&encoded])?.start.0;
        self.next_seq = seq + 1; // below `seq_lease`, so no overflow
        self.queues.append(seq, lsn, encoded.len(), now_unix_ms, items);
        Ok(seq)
    }

    /// Pending items for `dest`, in seq order: at most `max_items`, and no more than `max_bytes`
    /// of payload, except that the first pending item is always returned (so a limit smaller than
    /// one item cannot stall a sender).
    pub fn pending(&self, dest: u32, max_items: usize, max_bytes: u64) -> Vec<PendingItem> {
        self.queues.pending(dest, max_items, max_bytes, &BTreeSet::new())
    }

    /// [`Self::pending`] without the items of the tables (outbox table keys) in `skip`: those a
    /// destination refused, held back while the others are shipped.
    pub fn pending_except(
        &self,
        dest: u32,
        max_items: usize,
        max_bytes: u64,
        skip: &BTreeSet<Arc<str>>,
    ) -> Vec<PendingItem> {
        self.queues.pending(dest, max_items, max_bytes, skip)
    }

    /// Marks `dest`'s items with seq <= `up_to_seq` as delivered: one WAL record (none if nothing
    /// is acked), written but **not fsynced** — it reaches the disk with the next append's fsync,
    /// and a power cut before that only makes the items pending again, i.e. resent (receivers
    /// drop resends). This keeps the fsync of a delivery off the path of the inserts that append
    /// behind it. Then the segments that hold only delivered items are deleted. An error after
    /// the ack record was written leaves the ack in effect and the outbox failed.
    ///
    /// Returns the delivered items, freed when the [`Delivered`] is dropped: a caller holding the
    /// outbox behind a lock that inserts wait for drops it after the lock (see [`Delivered`]).
    pub fn ack(&mut self, dest: u32, up_to_seq: u64) -> Result<Delivered, StorageError> {
        if !self.queues.ackable(dest, up_to_seq) {
            return Ok(Delivered::default());
        }
        self.check_usable()?;
        let encoded = record::encode_ack(&[(dest, up_to_seq)]);
        self.wal.append_unsynced(&[&encoded])?;
        self.queues.note_record(encoded.len());
        let delivered = Delivered { entries: self.queues.ack(dest, up_to_seq) };
        tracing::trace!(dest, up_to_seq, acked = delivered.items(), "outbox ack");
        self.reclaim()?;
        Ok(delivered)
    }

    /// Marks single items of `dest`, the seqs `seqs`, as delivered, as [`Self::ack`] does a
    /// prefix (one WAL record, not fsynced; the delivered items returned to be freed after the
    /// lock): for a shipment the destination took only part of, when some tables' replicas
    /// there refused their items. Seqs not pending are ignored.
    pub fn ack_items(&mut self, dest: u32, seqs: &[u64]) -> Result<Delivered, StorageError> {
        if !self.queues.any_pending(dest, seqs) {
            return Ok(Delivered::default());
        }
        self.check_usable()?;
        let pairs: Vec<(u32, u64)> = seqs.iter().map(|&seq| (dest, seq)).collect();
        let encoded = record::encode_acked_items(&pairs);
        self.wal.append_unsynced(&[&encoded])?;
        self.queues.note_record(encoded.len());
        let delivered = Delivered { entries: self.queues.ack_items(dest, seqs) };
        tracing::trace!(dest, acked = delivered.items(), "outbox ack of single items");
        self.reclaim()?;
        Ok(delivered)
    }

    /// Drops every pending item of `table` (DROP/TRUNCATE TABLE), durably (one fsynced WAL record
    /// if there is anything to drop). Returns how many items were dropped. Items appended later
    /// are kept. An error after the discard record was written leaves it in effect and the outbox
    /// failed; retrying after a reopen is safe.
    pub fn discard_table(&mut self, table: &str) -> Result<u64, StorageError> {
        // A failed outbox may hold a write on disk that memory does not show, so it cannot
        // vouch that nothing of `table` is pending.
        self.check_usable()?;
        if self.queues.count_table(table) == 0 {
            return Ok(0);
        }
        let encoded = record::encode_discard(table);
        self.wal.append(&[&encoded])?;
        self.queues.note_record(encoded.len());
        let dropped = self.queues.discard(table);
        tracing::debug!(table, dropped, "outbox discarded a table's pending items");
        self.reclaim()?;
        Ok(dropped)
    }

    /// The seq the next append gets: every item appended so far has a lower one.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The lowest seq among `dest`'s pending items whose table key `table` accepts, if any.
    pub fn first_pending_seq(&self, dest: u32, table: impl Fn(&str) -> bool) -> Option<u64> {
        self.queues.entries().find(|(d, _, entry)| *d == dest && table(&entry.table)).map(|(_, seq, _)| seq)
    }

    /// Whether `dest` still has an item appended before seq `before` (a [`Self::next_seq`] read
    /// earlier) whose table key `table` accepts: what a flush that began then waits for.
    pub fn any_pending_before(&self, dest: u32, before: u64, table: impl Fn(&str) -> bool) -> bool {
        self.queues.any_pending_before(dest, before, table)
    }

    /// Pending items per (table, destination); only non-empty queues.
    pub fn stats(&self) -> BTreeMap<(String, u32), QueueStats> {
        self.queues.stats()
    }

    /// Pending items per table for one destination; only non-empty queues.
    pub fn dest_table_stats(&self, dest: u32) -> Vec<(Arc<str>, QueueStats)> {
        self.queues.dest_table_stats(dest)
    }

    /// Pending items for one destination, all tables.
    pub fn dest_stats(&self, dest: u32) -> QueueStats {
        self.queues.dest_stats(dest)
    }

    /// Total pending payload bytes (what `outbox_max_bytes` bounds).
    pub fn pending_bytes(&self) -> u64 {
        self.queues.pending_bytes()
    }

    /// The destinations with pending items, ascending.
    pub fn destinations(&self) -> Vec<u32> {
        self.queues.destinations()
    }

    /// Closes the outbox's log at a clean stop, recording where it ends ([`crate::wal::Wal::close_cleanly`]):
    /// the next open reports records removed meanwhile. A failed outbox is left as it is. Every
    /// later call fails.
    pub fn close_cleanly(&mut self) -> Result<(), StorageError> {
        if self.failure().is_some() {
            return Ok(());
        }
        self.wal.close_cleanly()
    }

    /// The first error that failed the outbox, if one did: then it must be reopened.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref().or_else(|| self.wal.failure())
    }

    /// The outbox directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn check_usable(&self) -> Result<(), StorageError> {
        if let Some(cause) = &self.failure {
            let cause = cause.clone();
            return Err(StorageError::OutboxFailed { dir: self.dir.clone(), cause });
        }
        match self.wal.failure() {
            Some(cause) => Err(StorageError::WalFailed { dir: self.wal.dir().to_path_buf(), cause: cause.to_string() }),
            None => Ok(()),
        }
    }

    fn fail(&mut self, error: StorageError) -> StorageError {
        tracing::error!(dir = %self.dir.display(), "outbox failed, refusing further writes until reopened: {error}");
        self.failure.get_or_insert_with(|| error.to_string());
        error
    }
}

impl OutboxOptions {
    fn validate(&self) -> Result<(), StorageError> {
        if self.outbox_max_bytes == 0 {
            return Err(StorageError::InvalidOption {
                name: "outbox_max_bytes",
                value: self.outbox_max_bytes.to_string(),
                expected: "at least 1 byte".to_string(),
            });
        }
        Ok(())
    }
}

/// The lease to write before handing out `next_seq`.
fn extended_lease(dir: &Path, next_seq: u64) -> Result<u64, StorageError> {
    next_seq.checked_add(SEQ_LEASE_SIZE).ok_or_else(|| StorageError::OutboxInconsistent {
        dir: dir.to_path_buf(),
        problem: format!("seq space exhausted: next seq {next_seq}"),
    })
}

/// Whether `wal_dir` holds at least one WAL segment (a missing directory holds none).
fn has_segments(fs: &dyn Fs, wal_dir: &Path) -> Result<bool, StorageError> {
    match fs.list_dir(wal_dir) {
        Ok(names) => Ok(names.iter().any(|n| parse_segment_name(n).is_some())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(StorageError::Io { op: "list", path: wal_dir.to_path_buf(), source: e }),
    }
}
