//! Behaviour tests of the WAL on `SimFs` (and a few on the real filesystem): round trips across
//! segments, torn tails, mid-log corruption, LSN gaps and overlaps, fsync failure, truncation.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::*;
use crate::fs::{RealFs, SimFs};

pub(super) const DIR: &str = "/node/wal";
pub(super) const SMALL_SEGMENT_BYTES: u64 = 200;

pub(super) type TestResult = Result<(), Box<dyn std::error::Error>>;

pub(super) fn open_on(fs: &Arc<dyn Fs>, dir: &Path, max_bytes: u64) -> Result<(Wal, Recovery), StorageError> {
    Wal::open(dir, Arc::clone(fs), WalOptions { wal_segment_max_bytes: max_bytes, ..WalOptions::default() })
}

pub(super) fn open_sim(sim: &SimFs, max_bytes: u64) -> Result<(Wal, Recovery), StorageError> {
    let fs: Arc<dyn Fs> = Arc::new(sim.clone());
    open_on(&fs, Path::new(DIR), max_bytes)
}

/// A payload whose content and size identify record `i`.
pub(super) fn payload(i: u64) -> Vec<u8> {
    format!("record-{i}-{}", "x".repeat((i % 11) as usize)).into_bytes()
}

pub(super) fn lsns_and_payloads(recovery: &Recovery) -> Vec<(u64, Vec<u8>)> {
    recovery.records.iter().map(|r| (r.lsn.0, r.payload.clone())).collect()
}

fn expected(lsns: impl IntoIterator<Item = u64>) -> Vec<(u64, Vec<u8>)> {
    lsns.into_iter().map(|i| (i, payload(i))).collect()
}

/// Appends records `from..to` (payload(i) for LSN i), `batch` per call.
fn append_range(wal: &mut Wal, from: u64, to: u64, batch: usize) -> Result<(), StorageError> {
    let payloads: Vec<Vec<u8>> = (from..to).map(payload).collect();
    for chunk in payloads.chunks(batch) {
        let refs: Vec<&[u8]> = chunk.iter().map(Vec::as_slice).collect();
        let start = wal.next_lsn();
        let lsns = wal.append(&refs)?;
        assert_eq!(lsns, start..Lsn(start.0 + chunk.len() as u64));
    }
    Ok(())
}

fn segment_path(sim: &SimFs, index: usize) -> Result<PathBuf, std::io::Error> {
    let names = sim.list_dir(Path::new(DIR))?;
    let segments: Vec<&String> = names.iter().filter(|n| parse_segment_name(n).is_some()).collect();
    Ok(Path::new(DIR).join(segments[index]))
}

/// Byte offsets of each frame in a segment.
fn frame_offsets(bytes: &[u8]) -> Vec<usize> {
    let mut offsets = Vec::new();
    let mut pos = 0;
    while let Ok(frame) = frame::decode(&bytes[pos..]) {
        offsets.push(pos);
        pos += frame.frame_bytes;
    }
    offsets
}

/// Where a segment's intact frames end.
fn records_end(bytes: &[u8]) -> usize {
    let mut pos = 0;
    while let Ok(frame) = frame::decode(&bytes[pos..]) {
        pos += frame.frame_bytes;
    }
    pos
}

#[test]
fn segment_names_round_trip_and_reject_lookalikes() {
    assert_eq!(segment_name(Lsn(42)), "wal-00000000000000000042.log");
    assert_eq!(parse_segment_name("wal-00000000000000000042.log"), Some(Lsn(42)));
    for bad in [
        "wal-42.log",
        "wal-0000000000000000004x.log",
        "wal-00000000000000000042.log.corrupt",
        "wal-99999999999999999999.log",
    ] {
        assert_eq!(parse_segment_name(bad), None, "{bad}");
    }
}

#[test]
fn round_trip_across_segments_and_reopens() -> TestResult {
    let sim = SimFs::new();
    let (mut wal, recovery) = open_sim(&sim, SMALL_SEGMENT_BYTES)?;
    assert!(recovery.records.is_empty() && recovery.is_clean());
    assert_eq!(wal.next_lsn(), Lsn::FIRST);
    append_range(&mut wal, 1, 31, 3)?;
    assert!(wal.segment_count() >= 4, "{} segments", wal.segment_count());
    drop(wal);

    let (mut wal, recovery) = open_sim(&sim, SMALL_SEGMENT_BYTES)?;
    assert_eq!(lsns_and_payloads(&recovery), expected(1..31));
    assert!(recovery.is_clean() && recovery.truncated_tail.is_none());
    assert_eq!(wal.next_lsn(), Lsn(31));
    append_range(&mut wal, 31, 40, 4)?;
    drop(wal);
    let (_, recovery) = open_sim(&sim, SMALL_SEGMENT_BYTES)?;
    assert_eq!(lsns_and_payloads(&recovery), expected(1..40));
    Ok(())
}

#[test]
fn a_batch_is_one_fsync_and_empty_batches_and_huge_records_write_nothing() -> TestResult {
    let sim = SimFs::new();
    let (mut wal, _) = open_sim(&sim, WAL_SEGMENT_MAX_BYTES_DEFAULT)?;
    let before = sim.sync_data_count();
    append_range(&mut wal, 1, 11, 10)?;
    assert_eq!(sim.sync_data_count(), before + 1);
    assert_eq!(wal.append(&[])?, Lsn(11)..Lsn(11));
    let huge = vec![0u8; WAL_RECORD_MAX_BYTES + 1];
    assert!(matches!(wal.append(&[b"ok", &huge]), Err(StorageError::RecordTooLarge { .. })));
    assert_eq!(sim.sync_data_count(), before + 1);
    append_range(&mut wal, 11, 12, 1)?;
    Ok(())
}

#[test]
fn invalid_segment_size_is_rejected() {
    let sim = SimFs::new();
    let err = open_sim(&sim, WAL_SEGMENT_MIN_BYTES - 1).map(|_| ());
    assert!(matches!(err, Err(StorageError::InvalidOption { name: "wal_segment_max_bytes", .. })));
}

#[test]
fn torn_last_record_at_every_byte_is_cut_off_and_appends_continue() -> TestResult {
    let build = || -> Result<(SimFs, PathBuf, Vec<u8>), Box<dyn std::error::Error>> {
        let sim = SimFs::new();
        let (mut wal, _) = open_sim(&sim, SMALL_SEGMENT_BYTES)?;
        append_range(&mut wal, 1, 13, 2)?;
        let last = segment_path(&sim, wal.segment_count() - 1)?;
        let bytes = sim.read(&last)?;
        Ok((sim, last, bytes))
    };
    let (_, _, bytes) = build()?;
    let offsets = frame_offsets(&bytes);
    let last_start = *offsets.last().ok_or("no frames")?;
    for cut in last_start..bytes.len() {
        let (sim, last, _) = build()?;
        sim.truncate(&last, cut as u64)?;
        let (mut wal, recovery) = open_sim(&sim, SMALL_SEGMENT_BYTES)?;
        assert_eq!(lsns_and_payloads(&recovery), expected(1..12), "cut at {cut}");
        assert!(recovery.is_clean());
        let tail = recovery.truncated_tail.clone();
        if cut == last_start {
            assert!(tail.is_none());
        } else {
            let tail = tail.ok_or("no tail truncation")?;
            assert_eq!((tail.offset_bytes, tail.dropped_bytes), (last_start as u64, (cut - last_start) as u64));
        }
        assert_eq!(sim.read(&last)?.len(), last_start);
        assert_eq!(wal.append(&[b"after"])?, Lsn(12)..Lsn(13));
        drop(wal);
        let (_, recovery) = open_sim(&sim, SMALL_SEGMENT_BYTES)?;
        assert_eq!(recovery.records.last().map(|r| (r.lsn, r.payload.as_slice())), Some((Lsn(12), &b"after"[..])));
        assert_eq!(recovery.records.len(), 12);
    }
    Ok(())
}

#[test]
fn flipped_bit_in_a_middle_record_is_mid_log_corruption() -> TestResult {
    // One segment of five records; every byte of record 3 gets a bit flipped in turn.
    let build = || -> Result<(SimFs, PathBuf, Vec<u8>), Box<dyn std::error::Error>> {
        let sim = SimFs::new();
        let (mut wal, _) = open_sim(&sim, WAL_SEGMENT_MAX_BYTES_DEFAULT)?;
        append_range(&mut wal, 1, 6, 5)?;
        let path = segment_path(&sim, 0)?;
        let bytes = sim.read(&path)?;
        Ok((sim, path, bytes))
    };
    let (_, _, original) = build()?;
    let offsets = frame_offsets(&original);
    let (start, end) = (offsets[2], offsets[3]);
    for byte in start..end {
        let (sim, path, _) = build()?;
        sim.flip_bit(&path, byte, (byte % 8) as u8)?;
        let (mut wal, recovery) = open_sim(&sim, WAL_SEGMENT_MAX_BYTES_DEFAULT)?;
        assert_eq!(lsns_and_payloads(&recovery), expected(1..3), "flip at {byte}");
        assert!(recovery.truncated_tail.is_none());
        let [Corruption::MidLog { segment, offset_bytes, set_aside_as, highest_lsn_after, .. }] =
            recovery.corruptions.as_slice()
        else {
            return Err(format!("flip at {byte}: {:?}", recovery.corruptions).into());
        };
        assert_eq!((segment.as_str(), *offset_bytes), ("wal-00000000000000000001.log", start as u64));
        assert_eq!(*highest_lsn_after, Some(Lsn(5)));
        let kept = sim.read(&Path::new(DIR).join(set_aside_as))?;
        assert_eq!(kept.len(), original.len(), "the corrupt segment is kept whole");
        // LSNs 3..=5 were handed out once; they are never reused.
        assert_eq!(wal.append(&[b"next"])?, Lsn(6)..Lsn(7));
        drop(wal);
        let (_, again) = open_sim(&sim, WAL_SEGMENT_MAX_BYTES_DEFAULT)?;
        let lsns: Vec<u64> = again.records.iter().map(|r| r.lsn.0).collect();
        assert_eq!(lsns, vec![1, 2, 6]);
        let gap = Corruption::LsnGap { segment: segment_name(Lsn(6)), expected_lsn: Lsn(3), found_lsn: Lsn(6) };
        assert_eq!(again.corruptions, vec![gap], "the hole stays reported");
    }
    Ok(())
}

#[test]
fn damage_in_an_earlier_segment_is_corruption_even_at_its_end() -> TestResult {
    let sim = SimFs::new();
    let (mut wal, _) = open_sim(&sim, SMALL_SEGMENT_BYTES)?;
    append_range(&mut wal, 1, 31, 1)?;
    drop(wal);
    let first = segment_path(&sim, 0)?;
    let bytes = sim.read(&first)?;
    let offsets = frame_offsets(&bytes);
    let last_start = *offsets.last().ok_or("no frames")?;
    sim.flip_bit(&first, bytes.len() - 1, 3)?;
    let (_, recovery) = open_sim(&sim, SMALL_SEGMENT_BYTES)?;
    let lost_from = offsets.len() as u64; // the LSN of the damaged last record of segment 1
    let Some(Corruption::MidLog { offset_bytes, .. }) = recovery.corruptions.first() else {
        return Err(format!("{:?}", recovery.corruptions).into());
    };
    assert_eq!(*offset_bytes, last_start as u64);
    let Some(Corruption::LsnGap { expected_lsn, .. }) = recovery.corruptions.get(1) else {
        return Err(format!("{:?}", recovery.corruptions).into());
    };
    assert_eq!(expected_lsn.0, lost_from);
    let replayed: Vec<u64> = recovery.records.iter().map(|r| r.lsn.0).collect();
    let wanted: Vec<u64> = (1..31).filter(|&l| l != lost_from).collect();
    assert_eq!(replayed, wanted, "everything but the damaged record, never a wrong payload");
    assert!(recovery.records.iter().all(|r| r.payload == payload(r.lsn.0)));
    Ok(())
}

#[test]
fn flipped_bit_in_the_last_record_is_a_torn_tail() -> TestResult {
    let sim = SimFs::new();
    let (mut wal, _) = open_sim(&sim, WAL_SEGMENT_MAX_BYTES_DEFAULT)?;
    append_range(&mut wal, 1, 6, 1)?;
    drop(wal);
    let path = segment_path(&sim, 0)?;
    let bytes = sim.read(&path)?;
    let last_start = *frame_offsets(&bytes).last().ok_or("no frames")?;
    sim.flip_bit(&path, last_start + 12, 0)?;
    let (_, recovery) = open_sim(&sim, WAL_SEGMENT_MAX_BYTES_DEFAULT)?;
    assert_eq!(lsns_and_payloads(&recovery), expected(1..5));
    assert!(recovery.is_clean());
    let tail = recovery.truncated_tail.ok_or("no tail truncation")?;
    assert!(matches!(tail.defect, RecordDefect::ChecksumMismatch { .. }));
    assert_eq!(tail.offset_bytes, last_start as u64);
    Ok(())
}

#[test]
fn an_empty_segment_file_is_fine() -> TestResult {
    let sim = SimFs::new();
    sim.create_dir_all(Path::new(DIR))?;
    sim.create_append(&Path::new(DIR).join(segment_name(Lsn::FIRST)))?;
    let (mut wal, recovery) = open_sim(&sim, SMALL_SEGMENT_BYTES)?;
    assert!(recovery.records.is_empty() && recovery.is_clean() && recovery.truncated_tail.is_none());
    assert_eq!(recovery.segments_scanned, 1);
    assert_eq!(wal.segment_count(), 1);
    append_range(&mut wal, 1, 3, 2)?;
    Ok(())
}

#[test]
fn a_zero_filled_tail_is_cut_off_quietly() -> TestResult {
    let sim = SimFs::new();
    let (mut wal, _) = open_sim(&sim, WAL_SEGMENT_MAX_BYTES_DEFAULT)?;
    append_range(&mut wal, 1, 4, 3)?;
    drop(wal);
    let path = segment_path(&sim, 0)?;
    let good_len = sim.read(&path)?.len();
    sim.open_append(&path)?.write_all(&[0u8; 100])?;
    let (mut wal, recovery) = open_sim(&sim, WAL_SEGMENT_MAX_BYTES_DEFAULT)?;
    assert_eq!(lsns_and_payloads(&recovery), expected(1..4));
    // Zeros are what preallocation leaves: not a torn write, nothing to report.
    assert!(recovery.truncated_tail.is_none() && recovery.is_clean());
    assert_eq!(sim.read(&path)?.len(), good_len);
    append_range(&mut wal, 4, 5, 1)?;
    drop(wal);
    let (_, recovery) = open_sim(&sim, WAL_SEGMENT_MAX_BYTES_DEFAULT)?;
    assert_eq!(lsns_and_payloads(&recovery), expected(1..5));
    Ok(())
}

fn open_preallocating(sim: &SimFs, max_bytes: u64, prealloc_bytes: u64) -> Result<(Wal, Recovery), StorageError> {
    let opts = WalOptions { wal_segment_max_bytes: max_bytes, wal_preallocate_bytes: prealloc_bytes };
    Wal::open(DIR, Arc::new(sim.clone()), opts)
}

#[test]
fn preallocation_keeps_zeros_ahead_and_only_the_last_segment_ends_in_them() -> TestResult {
    let sim = SimFs::new();
    let (mut wal, _) = open_preallocating(&sim, 400, 160)?;
    append_range(&mut wal, 1, 4, 1)?;
    let first = segment_path(&sim, 0)?;
    let bytes = sim.read(&first)?;
    let end = records_end(&bytes);
    assert!(end > 0 && bytes.len() > end && bytes[end..].iter().all(|b| *b == 0), "zeros ahead of the records");
    // A crash now (the zeros are durable): the reopen cuts them off without a report.
    sim.power_loss();
    let (mut wal, recovery) = open_preallocating(&sim, 400, 160)?;
    assert_eq!(lsns_and_payloads(&recovery), expected(1..4));
    assert!(recovery.is_clean() && recovery.truncated_tail.is_none());
    // Across several segments: every segment but the last holds exactly its records.
    append_range(&mut wal, 4, 60, 2)?;
    let names = sim.list_dir(Path::new(DIR))?;
    assert!(names.len() > 3, "segments rolled: {names:?}");
    for name in &names[..names.len() - 1] {
        let bytes = sim.read(&Path::new(DIR).join(name))?;
        assert_eq!(records_end(&bytes), bytes.len(), "{name} ends in its last record");
    }
    drop(wal);
    let (_, recovery) = open_preallocating(&sim, 400, 160)?;
    assert_eq!(lsns_and_payloads(&recovery), expected(1..60));
    assert!(recovery.is_clean());
    Ok(())
}

#[test]
fn a_torn_write_into_preallocated_zeros_is_a_torn_tail() -> TestResult {
    for seed in 0..200 {
        let sim = SimFs::new();
        let (mut wal, _) = open_preallocating(&sim, 4096, 1024)?;
        append_range(&mut wal, 1, 6, 1)?;
        // Written, not fsynced, then the power goes: a prefix of it may survive over the zeros.
        let frames: Vec<Vec<u8>> = (6..9).map(payload).collect();
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        wal.append_unsynced(&refs)?;
        sim.power_loss_torn(seed);
        let (mut wal, recovery) = open_preallocating(&sim, 4096, 1024)?;
        let got = lsns_and_payloads(&recovery);
        assert!(got.len() >= 5 && got == expected(1..1 + got.len() as u64), "seed {seed}: {got:?}");
        assert!(recovery.corruptions.is_empty(), "seed {seed}: {:?}", recovery.corruptions);
        let next = 1 + got.len() as u64;
        append_range(&mut wal, next, next + 3, 1)?;
        drop(wal);
        let (_, recovery) = open_preallocating(&sim, 4096, 1024)?;
        assert_eq!(lsns_and_payloads(&recovery), expected(1..next + 3), "seed {seed}");
    }
    Ok(())
}

#[test]
fn a_missing_segment_is_reported_as_an_lsn_gap() -> TestResult {
    let sim = SimFs::new();
    let (mut wal, _) = open_sim(&sim, SMALL_SEGMENT_BYTES)?;
    append_range(&mut wal, 1, 31, 1)?;
    drop(wal);
    let second = segment_path(&sim, 1)?;
    let third = segment_path(&sim, 2)?;
    let third_name = third.file_name().and_then(|n| n.to_str()).ok_or("name")?.to_string();
    let second_first = parse_segment_name(second.file_name().and_then(|n| n.to_str()).ok_or("name")?).ok_or("lsn")?;
    let third_first = parse_segment_name(&third_name).ok_or("lsn")?;
    sim.remove_file(&second)?;
    let (_, recovery) = open_sim(&sim, SMALL_SEGMENT_BYTES)?;
    let gap = Corruption::LsnGap { segment: third_name, expected_lsn: second_first, found_lsn: third_first };
    assert_eq!(recovery.corruptions, vec![gap]);
    let wanted: Vec<u64> = (1..31).filter(|&l| l < second_first.0 || l >= third_first.0).collect();
    assert_eq!(recovery.records.iter().map(|r| r.lsn.0).collect::<Vec<_>>(), wanted);
    Ok(())
}

#[test]
fn a_segment_repeating_lsns_is_set_aside() -> TestResult {
    let sim = SimFs::new();
    let (mut wal, _) = open_sim(&sim, SMALL_SEGMENT_BYTES)?;
    append_range(&mut wal, 1, 31, 1)?;
    drop(wal);
    // A stray copy of the first segment under a name that overlaps it.
    let bytes = sim.read(&segment_path(&sim, 0)?)?;
    let stray = segment_name(Lsn(2));
    let mut file = sim.create_append(&Path::new(DIR).join(&stray))?;
    file.write_all(&bytes)?;
    let (_, recovery) = open_sim(&sim, SMALL_SEGMENT_BYTES)?;
    assert_eq!(lsns_and_payloads(&recovery), expected(1..31), "every record exactly once");
    let [Corruption::LsnOverlap { segment, found_lsn, set_aside_as, .. }] = recovery.corruptions.as_slice() else {
        return Err(format!("{:?}", recovery.corruptions).into());
    };
    assert_eq!((segment, *found_lsn), (&stray, Lsn(2)));
    assert!(sim.list_dir(Path::new(DIR))?.contains(set_aside_as));
    Ok(())
}

#[test]
fn an_fsync_failure_fails_the_wal_for_good() -> TestResult {
    let sim = SimFs::new();
    let (mut wal, _) = open_sim(&sim, SMALL_SEGMENT_BYTES)?;
    append_range(&mut wal, 1, 4, 1)?;
    sim.fail_next_fsync();
    let err = wal.append(&[b"lost?"]).map(|_| ());
    assert!(matches!(err, Err(StorageError::Io { op: "fsync", .. })), "{err:?}");
    assert!(wal.failure().is_some());
    // The fsync would succeed now; the WAL still refuses, since the page cache may have lied.
    assert!(matches!(wal.append(&[b"again"]), Err(StorageError::WalFailed { .. })));
    assert!(matches!(wal.truncate_before(Lsn(3)), Err(StorageError::WalFailed { .. })));
    assert_eq!(wal.next_lsn(), Lsn(4));
    drop(wal);
    let (mut wal, recovery) = open_sim(&sim, SMALL_SEGMENT_BYTES)?;
    assert!(recovery.records.len() >= 3 && recovery.is_clean());
    wal.append(&[b"fine after reopen"])?;
    Ok(())
}

#[test]
fn truncate_before_deletes_only_whole_segments_below_the_lsn() -> TestResult {
    let sim = SimFs::new();
    let (mut wal, _) = open_sim(&sim, SMALL_SEGMENT_BYTES)?;
    append_range(&mut wal, 1, 41, 2)?;
    let segments = wal.segment_count();
    let deleted = wal.truncate_before(Lsn(20))?;
    assert!(deleted >= 1 && wal.segment_count() == segments - deleted);
    sim.power_loss(); // the deletions were fsynced: they stay deleted
    let (mut wal, recovery) = open_sim(&sim, SMALL_SEGMENT_BYTES)?;
    let first = recovery.records.first().map(|r| r.lsn.0).ok_or("no records")?;
    assert!(first > 1 && first <= 20, "first replayed {first}");
    assert_eq!(lsns_and_payloads(&recovery), expected(first..41));
    assert_eq!(wal.segment_count(), segments - deleted);
    // Everything checkpointed: only the active segment stays, and it keeps the next LSN.
    wal.truncate_before(Lsn(u64::MAX))?;
    assert_eq!(wal.segment_count(), 1);
    drop(wal);
    let (wal, _) = open_sim(&sim, SMALL_SEGMENT_BYTES)?;
    assert_eq!(wal.next_lsn(), Lsn(41));
    Ok(())
}

#[test]
fn real_fs_round_trip_torn_tail_and_corruption() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("wal");
    let fs: Arc<dyn Fs> = Arc::new(RealFs);
    let (mut wal, _) = open_on(&fs, &dir, SMALL_SEGMENT_BYTES)?;
    append_range(&mut wal, 1, 21, 3)?;
    drop(wal);
    let (_, recovery) = open_on(&fs, &dir, SMALL_SEGMENT_BYTES)?;
    assert_eq!(lsns_and_payloads(&recovery), expected(1..21));

    // Torn tail: cut the last segment's last record in half.
    let mut names: Vec<String> = fs.list_dir(&dir)?.into_iter().filter(|n| parse_segment_name(n).is_some()).collect();
    names.sort();
    let last = dir.join(names.last().ok_or("no segments")?);
    let len = std::fs::metadata(&last)?.len();
    fs.truncate(&last, len - 3)?;
    let (mut wal, recovery) = open_on(&fs, &dir, SMALL_SEGMENT_BYTES)?;
    assert_eq!(lsns_and_payloads(&recovery), expected(1..20));
    assert!(recovery.truncated_tail.is_some() && recovery.is_clean());
    append_range(&mut wal, 20, 21, 1)?;
    drop(wal);

    // Bit rot in the first segment's first record.
    let first = dir.join(&names[0]);
    let mut bytes = std::fs::read(&first)?;
    bytes[10] ^= 0x40;
    std::fs::write(&first, &bytes)?;
    let (_, recovery) = open_on(&fs, &dir, SMALL_SEGMENT_BYTES)?;
    assert!(matches!(recovery.corruptions.first(), Some(Corruption::MidLog { offset_bytes: 0, .. })));
    assert!(recovery.records.iter().all(|r| r.payload == payload(r.lsn.0)));
    assert!(dir.join(format!("{}.corrupt", names[0])).exists());
    Ok(())
}

/// A log closed cleanly reopens clean, its `CLOSED` file gone; records removed while it was
/// closed (the last segment cut at a record's boundary, which alone looks like a clean end, or
/// deleted) are reported; a crash (no clean close) leaves nothing to compare with.
#[test]
fn records_removed_after_a_clean_close_are_reported() -> TestResult {
    let sim = SimFs::new();
    let (mut wal, _) = open_sim(&sim, 4096)?;
    append_range(&mut wal, 1, 11, 3)?;
    wal.close_cleanly()?;
    assert!(matches!(wal.append(&[b"after"]), Err(StorageError::WalFailed { .. })), "a closed log takes nothing");
    drop(wal);
    let (mut wal, recovery) = open_sim(&sim, 4096)?;
    assert!(recovery.is_clean(), "{:?}", recovery.corruptions);
    assert_eq!(recovery.records.len(), 10);
    assert!(!sim.list_dir(Path::new(DIR))?.contains(&CLOSED_NAME.to_string()), "the record is removed on open");
    append_range(&mut wal, 11, 13, 1)?;
    wal.close_cleanly()?;
    drop(wal);

    // Cut after record 7, at a frame's boundary.
    let path = segment_path(&sim, 0)?;
    let offsets = frame_offsets(&sim.read(&path)?);
    sim.truncate(&path, offsets[7] as u64)?;
    let (wal, recovery) = open_sim(&sim, 4096)?;
    assert!(recovery.truncated_tail.is_none(), "the cut looks like a clean end");
    let want = Corruption::EndsBeforeCleanClose { closed_next_lsn: Lsn(13), found_next_lsn: Lsn(8) };
    assert_eq!(recovery.corruptions, vec![want]);
    drop(wal);
    // Nothing left to compare with on the next open: the store's DAMAGED file remembers.
    let (mut wal, recovery) = open_sim(&sim, 4096)?;
    assert!(recovery.is_clean());
    wal.close_cleanly()?;
    drop(wal);

    // The only segment deleted.
    sim.remove_file(&segment_path(&sim, 0)?)?;
    let (wal, recovery) = open_sim(&sim, 4096)?;
    assert!(matches!(
        recovery.corruptions.as_slice(),
        [Corruption::EndsBeforeCleanClose { closed_next_lsn: Lsn(8), .. }]
    ));
    drop(wal);

    // A crash: records cut from a log that was not closed cleanly cannot be told from its end.
    let (mut wal, _) = open_sim(&sim, 4096)?;
    let from = wal.next_lsn().0;
    append_range(&mut wal, from, from + 4, 1)?;
    drop(wal);
    let path = segment_path(&sim, 0)?;
    let offsets = frame_offsets(&sim.read(&path)?);
    sim.truncate(&path, offsets[1] as u64)?;
    let (_, recovery) = open_sim(&sim, 4096)?;
    assert!(recovery.is_clean(), "{:?}", recovery.corruptions);
    Ok(())
}

/// A `CLOSED` file that does not read (a crash while it was written) is no claim.
#[test]
fn an_unreadable_clean_close_record_is_ignored() -> TestResult {
    let sim = SimFs::new();
    let (mut wal, _) = open_sim(&sim, 4096)?;
    append_range(&mut wal, 1, 4, 1)?;
    drop(wal);
    let mut file = sim.create_append(&Path::new(DIR).join(CLOSED_NAME))?;
    file.write_all(b"next_l")?;
    file.sync_data()?;
    let (_, recovery) = open_sim(&sim, 4096)?;
    assert!(recovery.is_clean());
    assert_eq!(recovery.records.len(), 3);
    Ok(())
}
