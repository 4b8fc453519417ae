//! The write-ahead log: an append-only, checksummed, segmented record log that a shard store
//! writes before it changes anything, so a crash loses nothing that was acknowledged.
//!
//! On disk, a directory of segments named `wal-<first LSN, 20 digits>.log`, each a sequence of
//! frames (see [`frame`] for the layout). Every record gets an LSN (log sequence number) from the
//! WAL, dense and increasing. Durability contract:
//! - [`Wal::append`] returns only after its records are fsynced (one fsync for the whole batch:
//!   group commit); a new segment's directory entry is fsynced when the segment is created;
//! - any I/O error while appending (a failed write leaves a partial frame, a failed fsync leaves
//!   the page cache lying, §5.2) puts the WAL in a failed state: every later call fails until the
//!   WAL is reopened, and reopening recovers from what is really on disk. fsync is never retried;
//! - [`Wal::open`] replays everything valid and repairs or reports the rest ([`recovery`]).
//!
//! Recovery holds every replayed record in memory; callers keep the log short with
//! [`Wal::truncate_before`] after each checkpoint.
//!
//! # Preallocation
//! With [`WalOptions::wal_preallocate_bytes`] above 0, the active segment is kept zero-filled
//! ahead of the records: when a small record would pass the zeros, that many more bytes of zeros
//! are written first (fsynced with the record). A record then overwrites bytes that already
//! exist, so its `fdatasync` flushes data only; appending past the end would also commit the new
//! file size through the filesystem's journal, which doubles the cost of the fsync and makes it
//! wait behind any other metadata change on the disk. Records of a quarter of the preallocation
//! or more are written past the end as they are (for them the fsync's fixed cost matters less than
//! writing their bytes twice). A segment is cut to its records before the next one is created,
//! so only the last segment can end in zeros; recovery cuts an all-zero tail off it quietly (it
//! is not a torn write).

mod frame;
#[cfg(test)]
mod power_loss_tests;
mod recovery;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use frame::{RecordDefect, WAL_RECORD_MAX_BYTES};
pub use recovery::{Corruption, Recovery, TailTruncation};

use crate::error::StorageError;
use crate::fs::{AppendFile, Fs};
use recovery::SegmentMeta;

/// The default size at which a new segment is started.
pub const WAL_SEGMENT_MAX_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;
/// The smallest allowed `wal_segment_max_bytes` (a few records; small values are for tests).
pub const WAL_SEGMENT_MIN_BYTES: u64 = 64;

/// Payloads at least this large are written to the segment straight from the caller's buffer
/// (after their frame header) instead of being copied into one buffer with the batch's other
/// records: a bulk insert's records are megabytes, and that copy was a sizeable share of its CPU.
const WAL_COPY_MAX_BYTES: usize = 64 * 1024;
const SEGMENT_PREFIX: &str = "wal-";
const SEGMENT_SUFFIX: &str = ".log";
const SEGMENT_LSN_DIGITS: usize = 20;

/// A log sequence number: the position of a record in the log, dense and increasing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

impl Lsn {
    /// The LSN of the first record of a new log. 0 is never used, so it can mean "nothing".
    pub const FIRST: Lsn = Lsn(1);

    /// The LSN after this one.
    pub fn next(self) -> Lsn {
        Lsn(self.0.saturating_add(1))
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// One record read back from the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalRecord {
    pub lsn: Lsn,
    pub payload: Vec<u8>,
}

/// WAL settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalOptions {
    /// A new segment is started before a record that would take the current one past this size
    /// (a single larger record gets a segment of its own).
    pub wal_segment_max_bytes: u64,
    /// How far ahead of its records the active segment is zero-filled; 0 turns preallocation
    /// off (see the module doc). Worth it for logs of small, latency-bound records.
    pub wal_preallocate_bytes: u64,
}

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions { wal_segment_max_bytes: WAL_SEGMENT_MAX_BYTES_DEFAULT, wal_preallocate_bytes: 0 }
    }
}

impl WalOptions {
    fn validate(&self) -> Result<(), StorageError> {
        if self.wal_segment_max_bytes < WAL_SEGMENT_MIN_BYTES {
            return Err(StorageError::InvalidOption {
                name: "wal_segment_max_bytes",
                value: self.wal_segment_max_bytes.to_string(),
                expected: format!("at least {WAL_SEGMENT_MIN_BYTES} bytes"),
            });
        }
        Ok(())
    }
}

/// The file name of the segment whose first record has `first_lsn`.
pub(crate) fn segment_name(first_lsn: Lsn) -> String {
    format!("{SEGMENT_PREFIX}{:0width$}{SEGMENT_SUFFIX}", first_lsn.0, width = SEGMENT_LSN_DIGITS)
}

/// The first LSN of a segment file name, or `None` if the name is not a segment's.
pub(crate) fn parse_segment_name(name: &str) -> Option<Lsn> {
    let digits = name.strip_prefix(SEGMENT_PREFIX)?.strip_suffix(SEGMENT_SUFFIX)?;
    if digits.len() != SEGMENT_LSN_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().map(Lsn)
}

/// A segmented write-ahead log in one directory. See the module doc for the contract.
pub struct Wal {
    fs: Arc<dyn Fs>,
    dir: PathBuf,
    opts: WalOptions,
    /// Live segments, oldest first; the last one is the one being appended to.
    segments: VecDeque<SegmentMeta>,
    active: Box<dyn AppendFile>,
    /// Bytes of records in the active segment: where the next one is written.
    active_len_bytes: u64,
    /// The active segment's file length: `active_len_bytes` plus any preallocated zeros.
    active_file_bytes: u64,
    next_lsn: Lsn,
    /// Set by the first I/O error that leaves the log in an unknown state.
    failure: Option<String>,
}

impl fmt::Debug for Wal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wal")
            .field("dir", &self.dir)
            .field("segments", &self.segments.len())
            .field("next_lsn", &self.next_lsn)
            .field("failure", &self.failure)
            .finish_non_exhaustive()
    }
}

impl Wal {
    /// Opens (or creates) the WAL in `dir`, recovering it: returns the WAL, ready to append after
    /// the last valid record, and a [`Recovery`] with every valid record to replay and a report
    /// of what was repaired or set aside.
    pub fn open(dir: impl Into<PathBuf>, fs: Arc<dyn Fs>, opts: WalOptions) -> Result<(Wal, Recovery), StorageError> {
        opts.validate()?;
        let dir = dir.into();
        fs.create_dir_all(&dir).map_err(StorageError::io("create dir", &dir))?;
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs.sync_dir(parent).map_err(StorageError::io("fsync dir", parent))?;
        }
        let closed_next_lsn = read_closed(fs.as_ref(), &dir)?;
        let mut recovered = recovery::recover(fs.as_ref(), &dir)?;
        make_durable(fs.as_ref(), &dir, &recovered.segments)?;
        if let Some(closed_next_lsn) = closed_next_lsn {
            if recovered.next_lsn < closed_next_lsn {
                let found_next_lsn = recovered.next_lsn;
                recovered.report.corruptions.push(Corruption::EndsBeforeCleanClose { closed_next_lsn, found_next_lsn });
            }
            // The log is open again: a crash from now on leaves no claim about where it ends.
            let path = dir.join(CLOSED_NAME);
            fs.remove_file(&path).map_err(StorageError::io("remove", &path))?;
            fs.sync_dir(&dir).map_err(StorageError::io("fsync dir", &dir))?;
        }
        let mut segments: VecDeque<SegmentMeta> = recovered.segments.into();
        let next_lsn = recovered.next_lsn;
        let (active, active_len_bytes) = match segments.back() {
            Some(last) if last.end_lsn == next_lsn => {
                let path = dir.join(&last.name);
                (fs.open_append(&path).map_err(StorageError::io("open", &path))?, last.len_bytes)
            }
            _ => {
                let (meta, file) = create_segment(fs.as_ref(), &dir, next_lsn)?;
                segments.push_back(meta);
                (file, 0)
            }
        };
        let active_file_bytes = active_len_bytes;
        let wal = Wal { fs, dir, opts, segments, active, active_len_bytes, active_file_bytes, next_lsn, failure: None };
        Ok((wal, recovered.report))
    }

    /// Appends one record per payload and fsyncs them all (one fsync for the batch) before
    /// returning their LSNs. An error other than [`StorageError::RecordTooLarge`] fails the WAL.
    pub fn append(&mut self, payloads: &[&[u8]]) -> Result<Range<Lsn>, StorageError> {
        self.append_with(payloads, true)
    }

    /// Like [`Wal::append`] but without the final fsync: the records reach the disk with the next
    /// fsync of the log (any later `append` or [`Wal::sync`]), or are lost whole by a power cut
    /// before it (a torn one is cut off as a torn tail). For records whose loss is harmless, such
    /// as the outbox's delivery acks, which a power cut only turns into resends.
    pub fn append_unsynced(&mut self, payloads: &[&[u8]]) -> Result<Range<Lsn>, StorageError> {
        self.append_with(payloads, false)
    }

    /// Makes every record appended so far durable (`fdatasync` of the active segment).
    pub fn sync(&mut self) -> Result<(), StorageError> {
        self.check_usable()?;
        self.sync_active().map_err(|e| self.fail(e))
    }

    fn append_with(&mut self, payloads: &[&[u8]], sync: bool) -> Result<Range<Lsn>, StorageError> {
        self.check_usable()?;
        if let Some(big) = payloads.iter().find(|p| p.len() > WAL_RECORD_MAX_BYTES) {
            return Err(StorageError::RecordTooLarge { len_bytes: big.len(), max_bytes: WAL_RECORD_MAX_BYTES });
        }
        let start = self.next_lsn;
        let end = start.0.checked_add(payloads.len() as u64);
        let end = end.ok_or(StorageError::LsnExhausted { next_lsn: start.0, batch_len: payloads.len() })?;
        if payloads.is_empty() {
            return Ok(start..start);
        }
        match self.write_batch(payloads, sync) {
            Ok(()) => {
                self.next_lsn = Lsn(end);
                Ok(start..self.next_lsn)
            }
            Err(error) => Err(self.fail(error)),
        }
    }

    /// Deletes whole segments whose records all have LSNs below `lsn` (call after a checkpoint
    /// covering everything below `lsn`). The segment being appended to is never deleted. Returns
    /// how many segments were deleted.
    pub fn truncate_before(&mut self, lsn: Lsn) -> Result<usize, StorageError> {
        self.check_usable()?;
        let mut deleted = 0;
        while self.segments.len() > 1 && self.segments[1].first_lsn <= lsn {
            let Some(oldest) = self.segments.front() else { break };
            let path = self.dir.join(&oldest.name);
            self.fs.remove_file(&path).map_err(StorageError::io("remove", &path))?;
            // One directory fsync per deletion, so a power loss can only undo a suffix of the
            // deletions and never leave a hole in the middle of the log.
            if let Err(error) = self.fs.sync_dir(&self.dir) {
                return Err(self.fail(StorageError::Io { op: "fsync dir", path: self.dir.clone(), source: error }));
            }
            self.segments.pop_front();
            deleted += 1;
        }
        Ok(deleted)
    }

    /// Starts a new, empty segment when a checkpoint at `lsn` covers every record of the log
    /// (`lsn` is [`Wal::next_lsn`] or beyond) and the active segment holds at least `min_bytes`,
    /// so that [`Wal::truncate_before`] can delete it: otherwise the records a checkpoint made
    /// useless stay on disk until the segment fills (up to `wal_segment_max_bytes`), beside the
    /// part that now holds their rows. Returns whether it rolled. An I/O error fails the WAL.
    pub fn roll_if_covered(&mut self, lsn: Lsn, min_bytes: u64) -> Result<bool, StorageError> {
        self.check_usable()?;
        if lsn < self.next_lsn || self.active_len_bytes < min_bytes.max(1) {
            return Ok(false);
        }
        // The active segment's records are durable (every append ends with an fsync); its
        // preallocated zeros are cut first, as before any roll.
        if let Err(error) = self.trim_active() {
            return Err(self.fail(error));
        }
        if let Err(error) = self.roll_segment(self.next_lsn) {
            return Err(self.fail(error));
        }
        Ok(true)
    }

    /// Makes the next record get `lsn`, if that is ahead of [`Wal::next_lsn`], by starting a new,
    /// empty segment whose first LSN is `lsn` (the LSNs in between are never used). For a caller
    /// whose checkpoint is ahead of the log, because the log lost records the checkpoint already
    /// covers: without this, new records would get LSNs the checkpoint says are reflected
    /// elsewhere, and would never be replayed. Until [`Wal::truncate_before`] passes `lsn`, a reopen
    /// reports the skipped LSNs as a gap. An I/O error fails the WAL.
    pub fn skip_to(&mut self, lsn: Lsn) -> Result<(), StorageError> {
        self.check_usable()?;
        if lsn <= self.next_lsn {
            return Ok(());
        }
        // The active segment's records are durable (every append ends with an fsync), but its
        // preallocated zeros are cut first.
        if let Err(error) = self.trim_active() {
            return Err(self.fail(error));
        }
        if let Some(current) = self.segments.back_mut() {
            current.end_lsn = self.next_lsn;
            current.len_bytes = self.active_len_bytes;
        }
        let (meta, file) = match create_segment(self.fs.as_ref(), &self.dir, lsn) {
            Ok(created) => created,
            Err(error) => return Err(self.fail(error)),
        };
        tracing::warn!(dir = %self.dir.display(), from = %self.next_lsn, to = %lsn, "WAL skips LSNs");
        self.segments.push_back(meta);
        self.active = file;
        self.active_len_bytes = 0;
        self.active_file_bytes = 0;
        self.next_lsn = lsn;
        Ok(())
    }

    /// Closes the log at a clean stop: records, durably, where it ends (the [`CLOSED_NAME`]
    /// file), so that the next [`Wal::open`] can tell records removed while it was closed (a
    /// segment cut short or deleted by hand, a restored backup) from a crash's torn tail, which
    /// looks the same on disk; it reports them as [`Corruption::EndsBeforeCleanClose`]. Every
    /// later call fails, as on a failed log. A crash leaves no such file, and then nothing tells
    /// a cut at a record's boundary from the log's end.
    pub fn close_cleanly(&mut self) -> Result<(), StorageError> {
        self.check_usable()?;
        // Records appended without an fsync are made durable first: the file claims them.
        if let Err(error) = self.sync_active() {
            return Err(self.fail(error));
        }
        let path = self.dir.join(CLOSED_NAME);
        let written = (|| {
            match self.fs.remove_file(&path) {
                Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
                _ => {}
            }
            let mut file = self.fs.create_append(&path)?;
            file.write_all(format!("{CLOSED_PREFIX}{}\n", self.next_lsn.0).as_bytes())?;
            file.sync_data()?;
            self.fs.sync_dir(&self.dir)
        })();
        written.map_err(StorageError::io("write", &path))?;
        self.failure = Some("the log was closed; reopen it to append".to_string());
        Ok(())
    }

    /// The LSN the next appended record will get.
    pub fn next_lsn(&self) -> Lsn {
        self.next_lsn
    }

    /// The file names of the live segments, oldest first.
    pub fn segment_names(&self) -> impl Iterator<Item = &str> {
        self.segments.iter().map(|s| s.name.as_str())
    }

    /// The directory the log lives in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How many live segment files the log has.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// The first error that failed the WAL, if it has failed.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    fn check_usable(&self) -> Result<(), StorageError> {
        match &self.failure {
            Some(cause) => Err(StorageError::WalFailed { dir: self.dir.clone(), cause: cause.clone() }),
            None => Ok(()),
        }
    }

    fn fail(&mut self, error: StorageError) -> StorageError {
        tracing::error!(dir = %self.dir.display(), "WAL failed, refusing further writes until reopened: {error}");
        self.failure.get_or_insert_with(|| error.to_string());
        error
    }

    /// Writes the batch, rolling to new segments as needed, and fsyncs it.
    fn write_batch(&mut self, payloads: &[&[u8]], sync: bool) -> Result<(), StorageError> {
        let mut lsn = self.next_lsn;
        let mut buf = Vec::new();
        for payload in payloads {
            let frame_bytes = frame::frame_len_bytes(payload.len()) as u64;
            let pending_bytes = self.active_len_bytes + buf.len() as u64;
            if pending_bytes > 0 && pending_bytes + frame_bytes > self.opts.wal_segment_max_bytes {
                self.write_active(&buf)?;
                buf.clear();
                self.sync_active()?;
                self.trim_active()?;
                self.roll_segment(lsn)?;
            }
            if payload.len() < WAL_COPY_MAX_BYTES {
                frame::encode(&mut buf, lsn, payload);
            } else {
                // A large payload goes to the file from the caller's buffer, not through `buf`.
                buf.extend_from_slice(&frame::header(lsn, payload));
                self.write_active(&buf)?;
                buf.clear();
                self.write_active(payload)?;
            }
            lsn = lsn.next();
        }
        self.write_active(&buf)?;
        if sync { self.sync_active() } else { Ok(()) }
    }

    fn active_path(&self) -> PathBuf {
        let name = self.segments.back().map_or("", |s| s.name.as_str());
        self.dir.join(name)
    }

    fn write_active(&mut self, buf: &[u8]) -> Result<(), StorageError> {
        let end = self.active_len_bytes + buf.len() as u64;
        let prealloc = self.opts.wal_preallocate_bytes;
        if end > self.active_file_bytes && prealloc > 0 && (buf.len() as u64) < prealloc / 4 {
            let target = (end + prealloc).min(self.opts.wal_segment_max_bytes).max(end);
            self.active.preallocate(target).map_err(StorageError::io("preallocate", self.active_path()))?;
            self.active_file_bytes = target;
        }
        self.active.write_all(buf).map_err(StorageError::io("write", self.active_path()))?;
        self.active_len_bytes = end;
        self.active_file_bytes = self.active_file_bytes.max(end);
        Ok(())
    }

    /// Cuts the active segment's preallocated zeros off, durably (before another segment follows
    /// it, so that only the last segment can end in zeros).
    fn trim_active(&mut self) -> Result<(), StorageError> {
        if self.active_file_bytes <= self.active_len_bytes {
            return Ok(());
        }
        let path = self.active_path();
        self.fs.truncate(&path, self.active_len_bytes).map_err(StorageError::io("truncate", &path))?;
        self.active.sync_data().map_err(StorageError::io("fsync", &path))?;
        self.active_file_bytes = self.active_len_bytes;
        Ok(())
    }

    fn sync_active(&mut self) -> Result<(), StorageError> {
        self.active.sync_data().map_err(StorageError::io("fsync", self.active_path()))
    }

    /// Starts a new segment whose first record is `first_lsn`. The current one is already synced.
    fn roll_segment(&mut self, first_lsn: Lsn) -> Result<(), StorageError> {
        if let Some(current) = self.segments.back_mut() {
            current.end_lsn = first_lsn;
            current.len_bytes = self.active_len_bytes;
        }
        let (meta, file) = create_segment(self.fs.as_ref(), &self.dir, first_lsn)?;
        self.segments.push_back(meta);
        self.active = file;
        self.active_len_bytes = 0;
        self.active_file_bytes = 0;
        Ok(())
    }
}

/// The file [`Wal::close_cleanly`] leaves in the log's directory, holding [`CLOSED_PREFIX`] and
/// the LSN the next record would have got.
pub const CLOSED_NAME: &str = "CLOSED";
const CLOSED_PREFIX: &str = "next_lsn ";

/// The next LSN a clean close recorded, if the log was closed cleanly. A file that does not read
/// (a crash while it was written) is no claim, and is said so.
fn read_closed(fs: &dyn Fs, dir: &Path) -> Result<Option<Lsn>, StorageError> {
    let path = dir.join(CLOSED_NAME);
    let bytes = match fs.read(&path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(StorageError::io("read", &path)(error)),
    };
    let text = String::from_utf8_lossy(&bytes);
    let lsn = text.trim_end().strip_prefix(CLOSED_PREFIX).and_then(|n| n.parse().ok()).map(Lsn);
    if lsn.is_none() {
        tracing::warn!(path = %path.display(), "the WAL's clean-close record does not read: ignored ({text:?})");
    }
    Ok(lsn)
}

/// Fsyncs every live segment and the directory before anything is appended or replayed.
///
/// What recovery read may have come from the page cache of a process that crashed before its
/// fsync (or whose fsync failed), and a segment's directory entry may never have been synced.
/// Replaying such records and then losing them to a power cut would undo effects the caller
/// already applied, and appending into a segment whose entry is not durable would lose
/// acknowledged records; so recovery makes what it replays durable first.
fn make_durable(fs: &dyn Fs, dir: &Path, segments: &[SegmentMeta]) -> Result<(), StorageError> {
    for segment in segments {
        let path = dir.join(&segment.name);
        let mut file = fs.open_append(&path).map_err(StorageError::io("open", &path))?;
        file.sync_data().map_err(StorageError::io("fsync", &path))?;
    }
    fs.sync_dir(dir).map_err(StorageError::io("fsync dir", dir))
}

/// Creates an empty segment and fsyncs the directory so its entry survives a power loss.
fn create_segment(fs: &dyn Fs, dir: &Path, first_lsn: Lsn) -> Result<(SegmentMeta, Box<dyn AppendFile>), StorageError> {
    let name = segment_name(first_lsn);
    let path = dir.join(&name);
    let file = fs.create_append(&path).map_err(StorageError::io("create", &path))?;
    fs.sync_dir(dir).map_err(StorageError::io("fsync dir", dir))?;
    Ok((SegmentMeta { first_lsn, name, end_lsn: first_lsn, len_bytes: 0 }, file))
}
