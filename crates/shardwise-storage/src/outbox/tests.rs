//! Behaviour tests of the outbox on `SimFs`: queue order, acks, limits, discards, stats, reopen,
//! identity, segment deletion and compaction, bad records. (Seqs across crashes, fsync failures
//! and power cuts are in `power_loss_tests`.)

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::*;
use crate::fs::SimFs;
use crate::wal::{WAL_RECORD_MAX_BYTES, parse_segment_name};

pub(super) const DIR: &str = "/node/outbox";
pub(super) const SMALL_SEGMENT_BYTES: u64 = 256;

pub(super) type TestResult = Result<(), Box<dyn std::error::Error>>;

/// One pending item, flattened for comparison: (dest, seq, table, rows, payload, appended_unix_ms).
pub(super) type Flat = (u32, u64, String, u64, Vec<u8>, u64);

pub(super) fn options(max_bytes: u64, segment_bytes: u64) -> OutboxOptions {
    // Preallocating half a segment ahead: every test also runs the preallocation paths.
    let wal = WalOptions { wal_segment_max_bytes: segment_bytes, wal_preallocate_bytes: segment_bytes / 2 };
    OutboxOptions { outbox_max_bytes: max_bytes, wal }
}

pub(super) fn small() -> OutboxOptions {
    options(OUTBOX_MAX_BYTES_DEFAULT, SMALL_SEGMENT_BYTES)
}

pub(super) fn open_sim(sim: &SimFs, opts: &OutboxOptions) -> Result<(Outbox, OutboxRecovery), StorageError> {
    Outbox::open(DIR, Arc::new(sim.clone()), opts.clone())
}

pub(super) fn item(table: &str, dest: u32, rows: u64, payload: &[u8]) -> OutboxItem {
    OutboxItem { table: table.into(), dest, rows, payload: payload.to_vec() }
}

/// Every pending item of every destination, by destination then seq.
pub(super) fn all_pending(outbox: &Outbox) -> Vec<Flat> {
    let mut out = Vec::new();
    for dest in outbox.destinations() {
        for p in outbox.pending(dest, usize::MAX, u64::MAX) {
            out.push((dest, p.seq, p.table.to_string(), p.rows, p.payload.to_vec(), p.appended_unix_ms));
        }
    }
    out
}

pub(super) fn wal_dir() -> PathBuf {
    Path::new(DIR).join(OUTBOX_WAL_DIR)
}

pub(super) fn segments(sim: &SimFs) -> Result<Vec<String>, std::io::Error> {
    Ok(sim.list_dir(&wal_dir())?.into_iter().filter(|n| parse_segment_name(n).is_some()).collect())
}

pub(super) fn seqs(items: &[PendingItem]) -> Vec<u64> {
    items.iter().map(|p| p.seq).collect()
}

/// What a flush that began at a seq waits for: items of its table appended before it, per
/// destination, until they are acked.
#[test]
fn items_appended_before_a_seq_are_told_apart_from_later_ones() -> TestResult {
    let sim = SimFs::new();
    let (mut outbox, _) = open_sim(&sim, &small())?;
    let a = outbox.append(vec![item("t", 1, 1, b"a"), item("u", 2, 1, b"a")], 10)?;
    let began = outbox.next_seq();
    let b = outbox.append(vec![item("t", 1, 1, b"b"), item("t", 2, 1, b"b")], 11)?;
    assert!(a < began && began <= b);
    let is_t = |key: &str| key == "t";
    assert!(outbox.any_pending_before(1, began, is_t));
    // Rank 2's item of t came after: not waited for; its item from before is another table's.
    assert!(!outbox.any_pending_before(2, began, is_t));
    assert!(outbox.any_pending_before(2, began, |key| key == "u"));
    outbox.ack(1, a)?;
    assert!(!outbox.any_pending_before(1, began, is_t), "acked");
    assert_eq!(seqs(&outbox.pending(1, 10, u64::MAX)), vec![b]);
    Ok(())
}

#[test]
fn pending_is_per_destination_in_seq_order_and_multi_destination_items_share_a_seq() -> TestResult {
    let sim = SimFs::new();
    let (mut outbox, recovery) = open_sim(&sim, &small())?;
    assert_eq!((recovery.pending_items, outbox.destinations()), (0, vec![]));
    let a = outbox.append(vec![item("t", 1, 1, b"a")], 10)?;
    let b = outbox.append(vec![item("t", 2, 2, b"b2"), item("u", 1, 3, b"b1")], 11)?;
    let c = outbox.append(vec![item("t", 2, 4, b"c")], 12)?;
    assert!(a < b && b < c);
    let one = outbox.pending(1, 10, u64::MAX);
    assert_eq!(seqs(&one), vec![a, b]);
    assert_eq!(
        (&*one[1].table, one[1].rows, one[1].payload.as_slice(), one[1].appended_unix_ms),
        ("u", 3, &b"b1"[..], 11)
    );
    let two = outbox.pending(2, 10, u64::MAX);
    assert_eq!(seqs(&two), vec![b, c]);
    assert_eq!(two[0].payload.as_slice(), b"b2");
    assert!(outbox.pending(3, 10, u64::MAX).is_empty());
    assert_eq!(outbox.destinations(), vec![1, 2]);
    let before = all_pending(&outbox);
    drop(outbox);
    let (outbox, recovery) = open_sim(&sim, &small())?;
    assert_eq!(all_pending(&outbox), before);
    assert_eq!(recovery.pending_items, 4);
    assert!(recovery.wal.records.is_empty(), "the outbox consumed the records");
    Ok(())
}

#[test]
fn acks_remove_up_to_a_seq_for_one_destination_only() -> TestResult {
    let sim = SimFs::new();
    let (mut outbox, _) = open_sim(&sim, &small())?;
    let mut all = Vec::new();
    for i in 0..5u8 {
        all.push(outbox.append(vec![item("t", 1, 1, &[i]), item("t", 2, 1, &[i])], 0)?);
    }
    let syncs = sim.sync_data_count();
    assert_eq!(outbox.ack(1, all[0] - 1)?.items(), 0); // below everything
    assert_eq!(outbox.ack(9, u64::MAX)?.items(), 0); // nothing pending there
    assert_eq!(sim.sync_data_count(), syncs, "an ack of nothing writes nothing");
    let delivered = outbox.ack(1, all[2])?;
    assert_eq!(delivered.items(), 3, "the delivered items leave the outbox with the ack");
    assert_eq!(outbox.pending_bytes(), 7, "and no longer count as pending while the caller holds them");
    drop(delivered);
    assert_eq!(seqs(&outbox.pending(1, 10, u64::MAX)), all[3..].to_vec());
    assert_eq!(seqs(&outbox.pending(2, 10, u64::MAX)), all, "dest 2 untouched");
    let syncs = sim.sync_data_count();
    outbox.ack(1, all[2])?; // again: nothing new to ack
    assert_eq!(sim.sync_data_count(), syncs);
    assert_eq!(seqs(&outbox.pending(1, 10, u64::MAX)), all[3..].to_vec());
    outbox.ack(1, u64::MAX)?;
    assert!(outbox.pending(1, 10, u64::MAX).is_empty());
    assert_eq!(outbox.destinations(), vec![2]);
    drop(outbox);
    let (mut outbox, _) = open_sim(&sim, &small())?;
    assert_eq!(outbox.destinations(), vec![2]);
    outbox.ack(2, all[4])?;
    assert!(outbox.destinations().is_empty() && outbox.pending_bytes() == 0);
    Ok(())
}

#[test]
fn single_items_acked_leave_the_others_pending_across_a_reopen() -> TestResult {
    let sim = SimFs::new();
    let (mut outbox, _) = open_sim(&sim, &small())?;
    let mut all = Vec::new();
    for i in 0..5u8 {
        let table = if i % 2 == 0 { "t" } else { "u" };
        all.push(outbox.append(vec![item(table, 1, 1, &[i]), item(table, 2, 1, &[i])], 0)?);
    }
    let syncs = sim.sync_data_count();
    assert_eq!(outbox.ack_items(1, &[all[4] + 10])?.items(), 0, "nothing pending of that seq");
    assert_eq!(outbox.ack_items(3, &all)?.items(), 0, "nothing pending there");
    assert_eq!(sim.sync_data_count(), syncs, "an ack of nothing writes nothing");
    // The items of table u went in, those of t were refused: u's leave, t's stay, in order.
    let delivered = outbox.ack_items(1, &[all[1], all[3]])?;
    assert_eq!(delivered.items(), 2);
    drop(delivered);
    assert_eq!(sim.sync_data_count(), syncs, "an ack is not fsynced");
    let kept = vec![all[0], all[2], all[4]];
    assert_eq!(seqs(&outbox.pending(1, 10, u64::MAX)), kept);
    assert_eq!(seqs(&outbox.pending(2, 10, u64::MAX)), all, "dest 2 untouched");
    assert_eq!(outbox.pending_bytes(), 8);
    // Made durable by the next fsync, and replayed.
    outbox.append(vec![item("t", 2, 1, b"z")], 0)?;
    drop(outbox);
    let (mut outbox, _) = open_sim(&sim, &small())?;
    assert_eq!(seqs(&outbox.pending(1, 10, u64::MAX)), kept);
    // A prefix ack after them still takes what is left up to its seq.
    outbox.ack(1, all[2])?;
    assert_eq!(seqs(&outbox.pending(1, 10, u64::MAX)), vec![all[4]]);
    Ok(())
}

#[test]
fn pending_honours_max_items_and_max_bytes_but_returns_at_least_one() -> TestResult {
    let sim = SimFs::new();
    let (mut outbox, _) = open_sim(&sim, &small())?;
    for len in [10usize, 20, 30] {
        outbox.append(vec![item("t", 1, 1, &vec![7; len])], 0)?;
    }
    let lens = |items: Vec<PendingItem>| items.iter().map(|p| p.payload.len()).collect::<Vec<_>>();
    assert_eq!(lens(outbox.pending(1, 2, u64::MAX)), vec![10, 20]);
    assert_eq!(lens(outbox.pending(1, 10, 30)), vec![10, 20]);
    assert_eq!(lens(outbox.pending(1, 10, 29)), vec![10]);
    assert_eq!(lens(outbox.pending(1, 10, 60)), vec![10, 20, 30]);
    assert_eq!(lens(outbox.pending(1, 10, 5)), vec![10], "the first item even if larger than max_bytes");
    assert_eq!(lens(outbox.pending(1, 0, u64::MAX)), vec![10], "at least one item");
    Ok(())
}

#[test]
fn a_full_outbox_or_an_invalid_append_changes_nothing() -> TestResult {
    let sim = SimFs::new();
    let opts = options(100, SMALL_SEGMENT_BYTES);
    let (mut outbox, _) = open_sim(&sim, &opts)?;
    let first = outbox.append(vec![item("t", 1, 1, &[1; 40]), item("t", 2, 1, &[2; 20])], 5)?;
    let snapshot = |outbox: &Outbox| -> Result<_, std::io::Error> {
        let files: Vec<(String, Vec<u8>)> = segments(&sim)?
            .into_iter()
            .map(|n| Ok((n.clone(), sim.read(&wal_dir().join(n))?)))
            .collect::<Result<_, std::io::Error>>()?;
        Ok((all_pending(outbox), outbox.stats(), outbox.pending_bytes(), sim.sync_data_count(), files))
    };
    let before = snapshot(&outbox)?;
    let full = outbox.append(vec![item("t", 1, 1, &[3; 30]), item("t", 3, 1, &[4; 11])], 6);
    let Err(StorageError::OutboxFull { pending_bytes: 60, append_bytes: 41, max_bytes: 100, .. }) = full else {
        return Err(format!("expected OutboxFull, got {full:?}").into());
    };
    assert!(matches!(outbox.append(vec![], 6), Err(StorageError::OutboxAppendInvalid { .. })));
    let twice = outbox.append(vec![item("t", 1, 1, b"x"), item("u", 1, 1, b"y")], 6);
    assert!(
        matches!(&twice, Err(StorageError::OutboxAppendInvalid { problem }) if problem.contains("destination 1 appears twice"))
    );
    let huge = outbox.append(vec![item("t", 1, 1, &vec![0; WAL_RECORD_MAX_BYTES])], 6);
    assert!(matches!(huge, Err(StorageError::RecordTooLarge { .. })), "{huge:?}");
    assert_eq!(snapshot(&outbox)?, before, "nothing changed in memory or on disk");
    assert!(outbox.failure().is_none());
    // Exactly at the limit is fine; acks make room.
    let second = outbox.append(vec![item("t", 3, 1, &[5; 40])], 7)?;
    assert!(matches!(outbox.append(vec![item("t", 3, 1, b"z")], 8), Err(StorageError::OutboxFull { .. })));
    outbox.ack(1, first)?;
    let third = outbox.append(vec![item("t", 3, 1, &[6; 40])], 9)?;
    assert!(first < second && second < third);
    Ok(())
}

#[test]
fn discard_table_drops_its_items_for_every_destination_durably() -> TestResult {
    let sim = SimFs::new();
    let (mut outbox, _) = open_sim(&sim, &small())?;
    outbox.append(vec![item("gone", 1, 1, b"a"), item("kept", 2, 1, b"b")], 0)?;
    let kept = outbox.append(vec![item("kept", 1, 1, b"c")], 0)?;
    outbox.append(vec![item("gone", 2, 1, b"d"), item("gone", 3, 1, b"e")], 0)?;
    assert_eq!(outbox.discard_table("gone")?, 3);
    let syncs = sim.sync_data_count();
    assert_eq!(outbox.discard_table("gone")?, 0);
    assert_eq!(outbox.discard_table("never")?, 0);
    assert_eq!(sim.sync_data_count(), syncs, "discarding nothing writes nothing");
    let later = outbox.append(vec![item("gone", 1, 1, b"new")], 0)?;
    let expect = |outbox: &Outbox| {
        let keys: Vec<(String, u32)> = outbox.stats().into_keys().collect();
        assert_eq!(keys, vec![("gone".to_string(), 1), ("kept".to_string(), 1), ("kept".to_string(), 2)]);
        assert_eq!(seqs(&outbox.pending(1, 10, u64::MAX)), vec![kept, later]);
        assert_eq!(outbox.destinations(), vec![1, 2]);
    };
    expect(&outbox);
    drop(outbox);
    let (outbox, _) = open_sim(&sim, &small())?;
    expect(&outbox); // the discard replays before the later append, and only drops what preceded it
    Ok(())
}

#[test]
fn stats_count_rows_bytes_and_the_oldest_append_per_queue() -> TestResult {
    let sim = SimFs::new();
    let (mut outbox, _) = open_sim(&sim, &small())?;
    outbox.append(vec![item("t", 1, 10, &[0; 5]), item("u", 2, 7, &[0; 3])], 1_000)?;
    outbox.append(vec![item("t", 1, 20, &[0; 6])], 900)?; // the clock stepped back
    outbox.append(vec![item("u", 1, 1, &[0; 1])], 2_000)?;
    let stats = outbox.stats();
    let q = |items, rows, bytes, oldest| QueueStats {
        pending_items: items,
        pending_rows: rows,
        pending_bytes: bytes,
        oldest_pending_unix_ms: Some(oldest),
    };
    assert_eq!(stats.len(), 3);
    assert_eq!(stats.get(&("t".to_string(), 1)), Some(&q(2, 30, 11, 900)));
    assert_eq!(stats.get(&("u".to_string(), 1)), Some(&q(1, 1, 1, 2_000)));
    assert_eq!(stats.get(&("u".to_string(), 2)), Some(&q(1, 7, 3, 1_000)));
    assert_eq!(outbox.dest_stats(1), q(3, 31, 12, 900));
    assert_eq!(outbox.dest_stats(2), q(1, 7, 3, 1_000));
    assert_eq!(outbox.dest_stats(3), QueueStats::default());
    let t = |name: &str| -> Arc<str> { name.into() };
    assert_eq!(outbox.dest_table_stats(1), vec![(t("t"), q(2, 30, 11, 900)), (t("u"), q(1, 1, 1, 2_000))]);
    assert_eq!(outbox.dest_table_stats(2), vec![(t("u"), q(1, 7, 3, 1_000))]);
    assert_eq!(outbox.pending_bytes(), 15);
    outbox.ack(2, u64::MAX)?;
    assert!(!outbox.stats().contains_key(&("u".to_string(), 2)), "only non-empty queues");
    assert!(outbox.dest_table_stats(2).is_empty());
    Ok(())
}

#[test]
fn reopen_restores_exactly_the_pending_items() -> TestResult {
    let sim = SimFs::new();
    let (mut outbox, _) = open_sim(&sim, &small())?;
    let mut seqs = Vec::new();
    for i in 0..40u64 {
        let payload = format!("item-{i}-{}", "p".repeat((i % 13) as usize)).into_bytes();
        let table = ["a", "b", "c"][(i % 3) as usize];
        let items = vec![item(table, (i % 4) as u32, i, &payload), item(table, 10, i * 2, &payload[..3])];
        seqs.push(outbox.append(items, 1_000 + i)?);
    }
    outbox.ack(0, seqs[20])?;
    outbox.ack(10, seqs[35])?;
    outbox.discard_table("b")?;
    outbox.ack(3, seqs[39])?;
    let before = all_pending(&outbox);
    let (stats, bytes) = (outbox.stats(), outbox.pending_bytes());
    assert!(before.len() > 10);
    drop(outbox);
    let (outbox, recovery) = open_sim(&sim, &small())?;
    assert!(recovery.wal.is_clean());
    assert_eq!(recovery.pending_items, before.len() as u64);
    assert_eq!(all_pending(&outbox), before);
    assert_eq!((outbox.stats(), outbox.pending_bytes()), (stats, bytes));
    // Replayed items of one table share one name, as the items of an append do.
    let names: Vec<Arc<str>> =
        outbox.destinations().iter().flat_map(|&d| outbox.pending(d, usize::MAX, u64::MAX)).map(|p| p.table).collect();
    let a: Vec<&Arc<str>> = names.iter().filter(|n| &***n == "a").collect();
    assert!(a.len() > 2 && a.iter().all(|n| Arc::ptr_eq(n, a[0])), "{} items of a", a.len());
    Ok(())
}

#[test]
fn the_identity_is_created_once_and_kept() -> TestResult {
    let sim = SimFs::new();
    let (mut outbox, _) = open_sim(&sim, &small())?;
    let id = outbox.origin_id().to_string();
    assert!(id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()), "{id}");
    outbox.append(vec![item("t", 1, 1, b"x")], 0)?;
    drop(outbox);
    sim.power_loss();
    for _ in 0..3 {
        let (outbox, _) = open_sim(&sim, &small())?;
        assert_eq!(outbox.origin_id(), id);
    }
    let other = Outbox::open("/node/other", Arc::new(sim.clone()), small())?.0;
    assert_ne!(other.origin_id(), id);
    assert_eq!(sim.read(&Path::new(DIR).join(OUTBOX_ID_FILE))?, format!("{id}\n").into_bytes());
    Ok(())
}

#[test]
fn metadata_and_log_that_do_not_belong_together_are_refused() -> TestResult {
    let dir = Path::new(DIR);
    let setup = || -> Result<SimFs, StorageError> {
        let sim = SimFs::new();
        let (mut outbox, _) = open_sim(&sim, &small())?;
        outbox.append(vec![item("t", 1, 1, b"x")], 0)?;
        Ok(sim)
    };
    // A damaged identity is never replaced.
    let sim = setup()?;
    sim.truncate(&dir.join(OUTBOX_ID_FILE), 10)?;
    assert!(
        matches!(open_sim(&sim, &small()), Err(StorageError::OutboxMetaInvalid { path, .. }) if path.ends_with(OUTBOX_ID_FILE))
    );
    let sim = setup()?;
    sim.flip_bit(&dir.join(SEQ_LEASE_FILE), 0, 6)?;
    assert!(
        matches!(open_sim(&sim, &small()), Err(StorageError::OutboxMetaInvalid { path, .. }) if path.ends_with(SEQ_LEASE_FILE))
    );
    // The log lost (identity without segments), the lease lost, the identity lost.
    for lost in ["segments", SEQ_LEASE_FILE, OUTBOX_ID_FILE] {
        let sim = setup()?;
        if lost == "segments" {
            for name in segments(&sim)? {
                sim.remove_file(&wal_dir().join(name))?;
            }
        } else {
            sim.remove_file(&dir.join(lost))?;
        }
        let err = open_sim(&sim, &small()).map(|_| ());
        assert!(matches!(err, Err(StorageError::OutboxInconsistent { .. })), "{lost}: {err:?}");
    }
    // Leftover temporary files of an interrupted replace are removed; the real files are kept.
    let sim = setup()?;
    let id = open_sim(&sim, &small())?.0.origin_id().to_string();
    for name in ["OUTBOX_ID.tmp", "SEQ_LEASE.tmp"] {
        sim.create_append(&dir.join(name))?.write_all(b"partial")?;
    }
    let (outbox, _) = open_sim(&sim, &small())?;
    assert_eq!(outbox.origin_id(), id);
    assert!(!sim.list_dir(dir)?.iter().any(|n| n.ends_with(".tmp")));
    Ok(())
}

#[test]
fn acks_delete_segments_that_hold_only_delivered_items() -> TestResult {
    let sim = SimFs::new();
    let (mut outbox, _) = open_sim(&sim, &small())?;
    let mut seqs = Vec::new();
    for i in 0..30u8 {
        seqs.push(outbox.append(vec![item("t", 1, 1, &[i; 40]), item("t", 2, 1, &[i; 40])], 0)?);
    }
    let full = segments(&sim)?.len();
    assert!(full >= 6, "{full} segments");
    outbox.ack(1, seqs[29])?;
    assert_eq!(segments(&sim)?.len(), full, "dest 2 still needs every segment");
    outbox.ack(2, seqs[14])?;
    let half = segments(&sim)?.len();
    assert!(half < full && half > 1, "{half} of {full}");
    outbox.ack(2, seqs[29])?;
    assert_eq!(segments(&sim)?.len(), 1);
    drop(outbox);
    let (outbox, _) = open_sim(&sim, &small())?;
    assert!(all_pending(&outbox).is_empty());
    Ok(())
}

#[test]
fn a_stalled_destination_does_not_pin_the_log() -> TestResult {
    // Dest 9 never acks a few small items; dest 1 moves lots of data. Without compaction the
    // first item of dest 9 would keep every segment alive.
    let sim = SimFs::new();
    let (mut outbox, _) = open_sim(&sim, &small())?;
    let mut stalled = Vec::new();
    for round in 0..300u64 {
        let mut items = vec![item("big", 1, 1, &[round as u8; 120])];
        if round % 50 == 0 {
            items.push(item("small", 9, round, format!("stalled-{round}").as_bytes()));
        }
        let seq = outbox.append(items, round)?;
        if round % 50 == 0 {
            stalled.push(seq);
        }
        outbox.ack(1, seq)?;
        assert!(segments(&sim)?.len() <= 6, "round {round}: {} segments", segments(&sim)?.len());
    }
    let before = all_pending(&outbox);
    assert_eq!(before.iter().map(|p| p.1).collect::<Vec<_>>(), stalled);
    drop(outbox);
    sim.power_loss();
    let (mut outbox, recovery) = open_sim(&sim, &small())?;
    assert!(recovery.wal.is_clean());
    let (after, resent): (Vec<_>, Vec<_>) = all_pending(&outbox).into_iter().partition(|p| p.0 == 9);
    assert_eq!(after, before, "carried items keep their seq, payload and time");
    // The last ack was not fsynced: the power cut may make that one item pending again (a resend).
    assert!(resent.iter().all(|p| p.0 == 1 && p.1 == 300), "{resent:?}");
    outbox.ack(9, stalled[2])?;
    assert_eq!(outbox.pending(9, 10, u64::MAX).len(), 3);
    outbox.ack(9, u64::MAX)?;
    outbox.ack(1, u64::MAX)?;
    assert_eq!(segments(&sim)?.len(), 1);
    Ok(())
}

#[test]
fn a_record_that_does_not_decode_is_an_error_naming_its_lsn() -> TestResult {
    let sim = SimFs::new();
    let (mut outbox, _) = open_sim(&sim, &small())?;
    outbox.append(vec![item("t", 1, 1, b"x")], 0)?;
    drop(outbox);
    let fs: Arc<dyn Fs> = Arc::new(sim.clone());
    let (mut wal, _) =
        Wal::open(wal_dir(), fs, WalOptions { wal_segment_max_bytes: SMALL_SEGMENT_BYTES, ..WalOptions::default() })?;
    let lsn = wal.append(&[b"\x07not an outbox record"])?.start;
    drop(wal);
    let err = open_sim(&sim, &small()).map(|_| ());
    let Err(StorageError::OutboxRecordInvalid { lsn: at, problem, .. }) = &err else {
        return Err(format!("expected OutboxRecordInvalid, got {err:?}").into());
    };
    assert_eq!(*at, lsn.0);
    assert!(problem.contains("unknown record tag 0x07"), "{problem}");
    Ok(())
}

#[test]
fn invalid_options_are_rejected() {
    let sim = SimFs::new();
    let bad = [options(0, SMALL_SEGMENT_BYTES), options(1, 1)];
    for opts in bad {
        assert!(matches!(open_sim(&sim, &opts), Err(StorageError::InvalidOption { .. })), "{opts:?}");
    }
}
