//! WAL recovery: reading the segments back after a restart, and deciding for each bad record
//! whether it is a torn write at the tail (safe to cut off) or corruption inside the log (set
//! aside and reported).
//!
//! The rules (reference notes §5.3):
//! - a defect in the **last** segment with no intact record after it is a torn tail: the file is
//!   truncated at the defect and fsynced, and the truncation is reported;
//! - a defect with an intact record after it, a defect in an earlier segment, or an intact record
//!   carrying the wrong LSN is **mid-log corruption**: the whole segment is copied aside to
//!   `<name>.corrupt` (fsynced, directory fsynced), the segment is truncated to its valid prefix,
//!   and the corruption is reported with segment name and byte offset. Nothing after the defect
//!   is replayed from that segment;
//! - zeros from the defect to the end of the **last** segment are the WAL's preallocation (see
//!   the WAL's module doc), not damage: they are cut off (truncated, fsynced) without a report;
//! - segments must continue each other's LSNs: a gap is reported (the missing LSNs are lost), a
//!   segment that repeats LSNs is renamed aside whole and reported.
//!
//! Keeping the valid prefix in the live log (rather than renaming the whole segment aside) means a
//! second restart still replays it, and still reports the hole as an LSN gap until a checkpoint
//! moves past it. LSNs seen after a defect are never handed out again.

use std::collections::BTreeSet;
use std::path::Path;

use super::frame::{self, RecordDefect};
use super::{Lsn, WalRecord, parse_segment_name};
use crate::error::StorageError;
use crate::fs::Fs;

/// What [`super::Wal::open`] found on disk and what it did about it.
#[derive(Debug, Default)]
pub struct Recovery {
    /// Every valid record, in LSN order, for replay.
    pub records: Vec<WalRecord>,
    /// The torn tail cut off the last segment, if there was one. Not corruption: the records in
    /// it were never acknowledged.
    pub truncated_tail: Option<TailTruncation>,
    /// Everything that is not explained by a crash during a write; empty on a healthy disk.
    pub corruptions: Vec<Corruption>,
    /// How many segment files were read.
    pub segments_scanned: usize,
}

impl Recovery {
    /// True when nothing but (at most) a torn tail was found.
    pub fn is_clean(&self) -> bool {
        self.corruptions.is_empty()
    }
}

/// A torn tail cut off the last segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TailTruncation {
    pub segment: String,
    /// Where the file now ends.
    pub offset_bytes: u64,
    pub dropped_bytes: u64,
    pub defect: RecordDefect,
}

/// Damage that a crash during a write cannot explain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Corruption {
    /// A bad record inside the log. Records before `offset_bytes` were replayed; nothing after
    /// it in this segment was. The original segment is kept as `set_aside_as`.
    MidLog {
        segment: String,
        offset_bytes: u64,
        defect: RecordDefect,
        set_aside_as: String,
        /// The highest LSN of an intact record seen after the defect (not replayed).
        highest_lsn_after: Option<Lsn>,
    },
    /// LSNs `expected_lsn .. found_lsn` are missing before `segment`.
    LsnGap { segment: String, expected_lsn: Lsn, found_lsn: Lsn },
    /// `segment` starts at `found_lsn`, below `expected_lsn`: it repeats LSNs and was renamed to
    /// `set_aside_as` without being replayed.
    LsnOverlap { segment: String, expected_lsn: Lsn, found_lsn: Lsn, set_aside_as: String },
    /// The log ends before `closed_next_lsn`, where it ended when it was last closed cleanly
    /// ([`super::Wal::close_cleanly`]): records it had acknowledged were removed while it was
    /// closed (a file cut short or deleted), and the log now ends at `found_next_lsn`.
    EndsBeforeCleanClose { closed_next_lsn: Lsn, found_next_lsn: Lsn },
}

/// What an operator reads (`system.shards`, `CHECK TABLE`, the node's log): the segment, where,
/// and what became of the records after the damage.
impl std::fmt::Display for Corruption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Corruption::MidLog { segment, offset_bytes, defect, set_aside_as, highest_lsn_after } => {
                write!(f, "{segment}: a damaged record at byte {offset_bytes} ({defect}); the records after it")?;
                if let Some(lsn) = highest_lsn_after {
                    write!(f, " (intact ones up to LSN {lsn} among them)")?;
                }
                write!(f, " were not replayed; the segment is kept as {set_aside_as}")
            }
            Corruption::LsnGap { segment, expected_lsn, found_lsn } => {
                write!(f, "LSNs {expected_lsn} to {found_lsn} (not included) are missing before {segment}")
            }
            Corruption::LsnOverlap { segment, expected_lsn, found_lsn, set_aside_as } => write!(
                f,
                "{segment} starts at LSN {found_lsn}, below {expected_lsn}: it repeats records, was not replayed and \
                 is kept as {set_aside_as}"
            ),
            Corruption::EndsBeforeCleanClose { closed_next_lsn, found_next_lsn } => write!(
                f,
                "the log ends at LSN {found_next_lsn}, but it ended at {closed_next_lsn} when it was last closed \
                 cleanly: acknowledged records were removed while it was closed"
            ),
        }
    }
}

/// A live segment. `end_lsn` and `len_bytes` are as of recovery or of the segment's close; the
/// WAL does not keep them current for the segment it is appending to.
#[derive(Debug, Clone)]
pub(crate) struct SegmentMeta {
    pub first_lsn: Lsn,
    pub name: String,
    /// One past the LSN of its last record.
    pub end_lsn: Lsn,
    pub len_bytes: u64,
}

pub(crate) struct Recovered {
    pub report: Recovery,
    pub segments: Vec<SegmentMeta>,
    pub next_lsn: Lsn,
}

/// Reads every segment in `dir`, repairs or sets aside what is damaged, and reports it.
pub(crate) fn recover(fs: &dyn Fs, dir: &Path) -> Result<Recovered, StorageError> {
    let names = fs.list_dir(dir).map_err(StorageError::io("list", dir))?;
    let mut segments: Vec<(Lsn, &String)> =
        names.iter().filter_map(|name| Some((parse_segment_name(name)?, name))).collect();
    segments.sort();
    let mut recoverer = Recoverer {
        fs,
        dir,
        taken_names: names.iter().cloned().collect(),
        report: Recovery::default(),
        live: Vec::new(),
        expected: None,
        highest_seen: None,
    };
    for (i, (first_lsn, name)) in segments.iter().enumerate() {
        recoverer.segment(*first_lsn, name, i + 1 == segments.len())?;
    }
    let end = recoverer.expected.unwrap_or(Lsn::FIRST);
    let next_lsn = end.max(recoverer.highest_seen.map_or(Lsn::FIRST, Lsn::next));
    Ok(Recovered { report: recoverer.report, segments: recoverer.live, next_lsn })
}

struct Recoverer<'a> {
    fs: &'a dyn Fs,
    dir: &'a Path,
    taken_names: BTreeSet<String>,
    report: Recovery,
    live: Vec<SegmentMeta>,
    /// The LSN the next live segment must start at.
    expected: Option<Lsn>,
    /// The highest LSN of any intact record seen, replayed or not: never to be reused.
    highest_seen: Option<Lsn>,
}

impl Recoverer<'_> {
    fn segment(&mut self, first_lsn: Lsn, name: &str, is_last: bool) -> Result<(), StorageError> {
        self.report.segments_scanned += 1;
        let path = self.dir.join(name);
        let bytes = self.fs.read(&path).map_err(StorageError::io("read", &path))?;
        let (records, defect) = scan_segment(&bytes, first_lsn);
        self.saw(records.last().map(|r| r.lsn));
        self.saw(defect.as_ref().and_then(|d| d.highest_lsn_after));

        if let Some(expected) = self.expected {
            if first_lsn < expected {
                let set_aside_as = self.rename_aside(name)?;
                tracing::warn!(segment = name, %expected, "WAL segment repeats LSNs; set aside as {set_aside_as}");
                let segment = name.to_string();
                self.report.corruptions.push(Corruption::LsnOverlap {
                    segment,
                    expected_lsn: expected,
                    found_lsn: first_lsn,
                    set_aside_as,
                });
                return Ok(());
            }
            if first_lsn > expected {
                tracing::warn!(segment = name, %expected, found = %first_lsn, "WAL LSN gap: records lost");
                let segment = name.to_string();
                self.report.corruptions.push(Corruption::LsnGap {
                    segment,
                    expected_lsn: expected,
                    found_lsn: first_lsn,
                });
            }
        }

        let mut len_bytes = bytes.len();
        if let Some(defect) = defect {
            len_bytes = defect.offset;
            self.repair(name, &bytes, defect, is_last)?;
        }
        let end_lsn = Lsn(first_lsn.0.saturating_add(records.len() as u64));
        self.report.records.extend(records);
        self.live.push(SegmentMeta { first_lsn, name: name.to_string(), end_lsn, len_bytes: len_bytes as u64 });
        self.expected = Some(end_lsn);
        Ok(())
    }

    /// Cuts a torn tail, or sets a corrupted segment aside and cuts it to its valid prefix.
    fn repair(&mut self, name: &str, bytes: &[u8], defect: Defect, is_last: bool) -> Result<(), StorageError> {
        let segment = name.to_string();
        let offset_bytes = defect.offset as u64;
        if is_last && defect.zero_tail {
            tracing::debug!(segment = name, offset_bytes, "cutting the preallocated zeros off the last WAL segment");
            return self.truncate_durably(name, offset_bytes);
        }
        if is_last && defect.is_torn_tail() {
            let dropped_bytes = (bytes.len() - defect.offset) as u64;
            // A whole record that fails its checksum may also be damage to an acknowledged one.
            if matches!(defect.defect, RecordDefect::ChecksumMismatch { .. }) {
                tracing::warn!(
                    segment = name,
                    offset_bytes,
                    dropped_bytes,
                    "cutting the WAL's last record, whole but failing its checksum: a write torn by a crash, or damage: {}",
                    defect.defect
                );
            } else {
                tracing::info!(
                    segment = name,
                    offset_bytes,
                    dropped_bytes,
                    "truncating torn WAL tail: {}",
                    defect.defect
                );
            }
            self.truncate_durably(name, offset_bytes)?;
            self.report.truncated_tail =
                Some(TailTruncation { segment, offset_bytes, dropped_bytes, defect: defect.defect });
            return Ok(());
        }
        let set_aside_as = self.copy_aside(name, bytes)?;
        self.truncate_durably(name, offset_bytes)?;
        tracing::warn!(
            segment = name,
            offset_bytes,
            "mid-log WAL corruption ({}); segment kept as {set_aside_as}",
            defect.defect
        );
        self.report.corruptions.push(Corruption::MidLog {
            segment,
            offset_bytes,
            defect: defect.defect,
            set_aside_as,
            highest_lsn_after: defect.highest_lsn_after,
        });
        Ok(())
    }

    fn saw(&mut self, lsn: Option<Lsn>) {
        self.highest_seen = self.highest_seen.max(lsn);
    }

    fn aside_name(&mut self, name: &str) -> String {
        let mut candidate = format!("{name}.corrupt");
        let mut n = 1;
        while self.taken_names.contains(&candidate) {
            candidate = format!("{name}.corrupt.{n}");
            n += 1;
        }
        self.taken_names.insert(candidate.clone());
        candidate
    }

    fn copy_aside(&mut self, name: &str, bytes: &[u8]) -> Result<String, StorageError> {
        let aside = self.aside_name(name);
        let path = self.dir.join(&aside);
        let mut file = self.fs.create_append(&path).map_err(StorageError::io("create", &path))?;
        file.write_all(bytes).map_err(StorageError::io("write", &path))?;
        file.sync_data().map_err(StorageError::io("fsync", &path))?;
        self.fs.sync_dir(self.dir).map_err(StorageError::io("fsync dir", self.dir))?;
        Ok(aside)
    }

    fn rename_aside(&mut self, name: &str) -> Result<String, StorageError> {
        let aside = self.aside_name(name);
        let (from, to) = (self.dir.join(name), self.dir.join(&aside));
        self.fs.rename(&from, &to).map_err(StorageError::io("rename", &from))?;
        self.fs.sync_dir(self.dir).map_err(StorageError::io("fsync dir", self.dir))?;
        Ok(aside)
    }

    fn truncate_durably(&self, name: &str, len_bytes: u64) -> Result<(), StorageError> {
        let path = self.dir.join(name);
        self.fs.truncate(&path, len_bytes).map_err(StorageError::io("truncate", &path))?;
        let mut file = self.fs.open_append(&path).map_err(StorageError::io("open", &path))?;
        file.sync_data().map_err(StorageError::io("fsync", &path))
    }
}

/// The first bad record of a segment.
#[derive(Debug)]
struct Defect {
    offset: usize,
    defect: RecordDefect,
    /// The highest LSN of an intact record found after the defect, if any.
    highest_lsn_after: Option<Lsn>,
    /// Every byte from the defect to the end of the segment is zero.
    zero_tail: bool,
}

impl Defect {
    /// A defect that a crash during an append explains: nothing intact after it, and not an
    /// intact record in the wrong place.
    fn is_torn_tail(&self) -> bool {
        self.highest_lsn_after.is_none() && !matches!(self.defect, RecordDefect::UnexpectedLsn { .. })
    }
}

/// The valid records of a segment up to its first defect, and that defect.
fn scan_segment(bytes: &[u8], first_lsn: Lsn) -> (Vec<WalRecord>, Option<Defect>) {
    let mut records = Vec::new();
    let mut pos = 0;
    let mut expected = first_lsn;
    while pos < bytes.len() {
        let (defect, found) = match frame::decode(&bytes[pos..]) {
            Ok(f) if f.lsn == expected => {
                records.push(WalRecord { lsn: f.lsn, payload: f.payload.to_vec() });
                pos += f.frame_bytes;
                expected = expected.next();
                continue;
            }
            Ok(f) => (RecordDefect::UnexpectedLsn { expected, found: f.lsn }, Some(f.lsn)),
            Err(defect) => (defect, None),
        };
        let zero_tail = bytes[pos..].iter().all(|b| *b == 0);
        let highest_lsn_after =
            if zero_tail { None } else { highest_intact_lsn_after(bytes, pos + 1, expected).max(found) };
        return (records, Some(Defect { offset: pos, defect, highest_lsn_after, zero_tail }));
    }
    (records, None)
}

/// Follows the chain of intact frames after a defect and returns the last LSN on it.
fn highest_intact_lsn_after(bytes: &[u8], from: usize, lsn_min: Lsn) -> Option<Lsn> {
    let (mut highest, mut pos, mut lsn_min) = (None, from, lsn_min);
    while let Some((at, frame)) = frame::find_intact_frame(bytes, pos, lsn_min) {
        highest = Some(frame.lsn);
        pos = at + frame.frame_bytes;
        lsn_min = frame.lsn.next();
    }
    highest
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(first: u64, payloads: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, p) in payloads.iter().enumerate() {
            frame::encode(&mut out, Lsn(first + i as u64), p);
        }
        out
    }

    #[test]
    fn clean_segment_scans_every_record() {
        let bytes = segment(10, &[b"a", b"bb", b""]);
        let (records, defect) = scan_segment(&bytes, Lsn(10));
        assert!(defect.is_none());
        assert_eq!(records.iter().map(|r| r.lsn.0).collect::<Vec<_>>(), vec![10, 11, 12]);
    }

    #[test]
    fn wrong_lsn_with_intact_checksum_is_never_a_torn_tail() {
        let bytes = segment(10, &[b"a", b"b"]);
        let (records, defect) = scan_segment(&bytes, Lsn(9));
        assert!(records.is_empty());
        let defect = defect.expect("defect");
        assert_eq!(defect.defect, RecordDefect::UnexpectedLsn { expected: Lsn(9), found: Lsn(10) });
        assert!(!defect.is_torn_tail());
    }

    #[test]
    fn damage_followed_by_intact_records_knows_the_highest_lsn_after() {
        let mut bytes = segment(1, &[b"one", b"two", b"three", b"four"]);
        let second = frame::frame_len_bytes(3);
        bytes[second + 9] ^= 0x10; // inside record 2's LSN
        let (records, defect) = scan_segment(&bytes, Lsn(1));
        assert_eq!(records.len(), 1);
        let defect = defect.expect("defect");
        assert_eq!((defect.offset, defect.highest_lsn_after), (second, Some(Lsn(4))));
    }
}
