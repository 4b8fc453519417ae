//! Power-loss tests of the WAL on `SimFs`: what `append` acknowledged survives any power cut,
//! what it did not may be lost but never comes back corrupted or twice, and a seeded random run
//! of appends, crashes, torn power cuts and checkpoints checks that on every reopen.

use std::collections::BTreeMap;
use std::path::Path;

use super::tests::{DIR, SMALL_SEGMENT_BYTES, TestResult, lsns_and_payloads, open_sim, payload};
use super::*;
use crate::fs::SimFs;
use crate::xorshift::XorShift64;

#[test]
fn acknowledged_records_survive_power_loss_across_segment_rolls() -> TestResult {
    let sim = SimFs::new();
    let (mut wal, _) = open_sim(&sim, SMALL_SEGMENT_BYTES)?;
    let mut acked = Vec::new();
    for i in 1..=30 {
        let lsns = wal.append(&[&payload(i)])?;
        acked.push((lsns.start.0, payload(i)));
    }
    let segments = wal.segment_count();
    assert!(segments >= 3);
    drop(wal);
    // Survival of the later segments proves the WAL fsynced the directory when it created them.
    sim.power_loss();
    let (wal, recovery) = open_sim(&sim, SMALL_SEGMENT_BYTES)?;
    assert_eq!(lsns_and_payloads(&recovery), acked);
    assert_eq!(wal.segment_count(), segments);
    assert!(recovery.is_clean() && recovery.truncated_tail.is_none());
    Ok(())
}

#[test]
fn unsynced_appends_are_lost_whole_by_a_power_cut_and_made_durable_by_the_next_fsync() -> TestResult {
    for seed in 0..20u64 {
        let sim = SimFs::new();
        let (mut wal, _) = open_sim(&sim, SMALL_SEGMENT_BYTES)?;
        wal.append(&[&payload(1)])?;
        wal.append_unsynced(&[&payload(2), &payload(3)])?;
        if seed % 2 == 0 {
            wal.append(&[&payload(4)])?; // its fsync covers 2 and 3 too
        }
        drop(wal);
        if seed % 4 < 2 {
            sim.power_loss()
        } else {
            sim.power_loss_torn(seed)
        }
        let (_, recovery) = open_sim(&sim, SMALL_SEGMENT_BYTES)?;
        assert!(recovery.is_clean(), "seed {seed}: {:?}", recovery.corruptions);
        let got: Vec<u64> = lsns_and_payloads(&recovery).iter().map(|(l, _)| *l).collect();
        if seed % 2 == 0 {
            assert_eq!(got, vec![1, 2, 3, 4], "seed {seed}");
        } else {
            assert!(got.len() <= 3 && got[0] == 1 && got.windows(2).all(|w| w[1] == w[0] + 1), "seed {seed}: {got:?}");
        }
    }
    // An explicit sync makes them durable as well.
    let sim = SimFs::new();
    let (mut wal, _) = open_sim(&sim, SMALL_SEGMENT_BYTES)?;
    wal.append_unsynced(&[&payload(1)])?;
    wal.sync()?;
    drop(wal);
    sim.power_loss();
    let (_, recovery) = open_sim(&sim, SMALL_SEGMENT_BYTES)?;
    assert_eq!(lsns_and_payloads(&recovery), vec![(1, payload(1))]);
    Ok(())
}

#[test]
fn a_segment_created_without_a_directory_fsync_disappears() -> TestResult {
    // The control for the test above: SimFs really drops an entry whose directory was not synced.
    let sim = SimFs::new();
    let (mut wal, _) = open_sim(&sim, WAL_SEGMENT_MAX_BYTES_DEFAULT)?;
    wal.append(&[b"kept"])?;
    drop(wal);
    let stray = Path::new(DIR).join(segment_name(Lsn(2)));
    let mut file = sim.create_append(&stray)?;
    let mut frame_bytes = Vec::new();
    frame::encode(&mut frame_bytes, Lsn(2), b"synced data, unsynced entry");
    file.write_all(&frame_bytes)?;
    file.sync_data()?;
    sim.power_loss();
    let (_, recovery) = open_sim(&sim, WAL_SEGMENT_MAX_BYTES_DEFAULT)?;
    assert_eq!(recovery.records.len(), 1);
    assert!(!sim.list_dir(Path::new(DIR))?.contains(&segment_name(Lsn(2))));
    Ok(())
}

#[test]
fn an_unacknowledged_append_may_be_lost_but_never_corrupt_or_doubled() -> TestResult {
    for seed in 0..40 {
        let sim = SimFs::new();
        let (mut wal, _) = open_sim(&sim, SMALL_SEGMENT_BYTES)?;
        for i in 1..=3 {
            wal.append(&[&payload(i)])?;
        }
        sim.fail_next_fsync();
        let unacked: Vec<Vec<u8>> = (4..=8).map(payload).collect();
        let refs: Vec<&[u8]> = unacked.iter().map(Vec::as_slice).collect();
        assert!(wal.append(&refs).is_err());
        drop(wal);
        match seed % 3 {
            0 => sim.power_loss(),
            1 => sim.power_loss_torn(seed),
            _ => {} // process crash only: the page cache still holds the writes
        }
        let (_, recovery) = open_sim(&sim, SMALL_SEGMENT_BYTES)?;
        assert!(recovery.is_clean(), "seed {seed}: {:?}", recovery.corruptions);
        let got = lsns_and_payloads(&recovery);
        assert!(got.len() >= 3 && got.len() <= 8, "seed {seed}");
        for (lsn, bytes) in &got {
            assert_eq!(*bytes, payload(*lsn), "seed {seed}: wrong payload at LSN {lsn}");
        }
        let lsns: Vec<u64> = got.iter().map(|(l, _)| *l).collect();
        assert_eq!(lsns, (1..=got.len() as u64).collect::<Vec<_>>(), "seed {seed}: dense, once each");
        if seed % 3 == 0 {
            assert_eq!(got.len(), 3, "a plain power loss drops every unsynced byte");
        }
    }
    Ok(())
}

#[test]
fn records_replayed_from_the_page_cache_are_made_durable_by_reopen() -> TestResult {
    let sim = SimFs::new();
    let (mut wal, _) = open_sim(&sim, WAL_SEGMENT_MAX_BYTES_DEFAULT)?;
    wal.append(&[&payload(1)])?;
    sim.fail_next_fsync();
    assert!(wal.append(&[&payload(2)]).is_err());
    drop(wal); // crash: the write is still in the page cache
    let (_, recovery) = open_sim(&sim, WAL_SEGMENT_MAX_BYTES_DEFAULT)?;
    assert_eq!(recovery.records.len(), 2, "the caller may now apply record 2");
    sim.power_loss();
    let (_, recovery) = open_sim(&sim, WAL_SEGMENT_MAX_BYTES_DEFAULT)?;
    assert_eq!(lsns_and_payloads(&recovery), vec![(1, payload(1)), (2, payload(2))]);
    Ok(())
}

#[test]
fn a_segment_whose_directory_fsync_failed_is_made_durable_by_reopen() -> TestResult {
    let sim = SimFs::new();
    let (mut wal, _) = open_sim(&sim, SMALL_SEGMENT_BYTES)?;
    // One-record appends fsync once, except the one that rolls to a new segment: it fsyncs the
    // full segment, then the directory. Failing the second fsync of an append hits exactly that.
    loop {
        sim.fail_fsync_after(1);
        if wal.append(&[&payload(wal.next_lsn().0)]).is_err() {
            break;
        }
        sim.heal_fsync();
    }
    assert_eq!(sim.list_dir(Path::new(DIR))?.len(), 2, "it failed in the roll, after the create");
    drop(wal); // crash: the new segment's entry exists, but only in memory
    let (mut wal, _) = open_sim(&sim, SMALL_SEGMENT_BYTES)?;
    let acked = wal.append(&[b"acknowledged after reopen"])?;
    drop(wal);
    sim.power_loss();
    let (_, recovery) = open_sim(&sim, SMALL_SEGMENT_BYTES)?;
    let last = recovery.records.last().ok_or("no records")?;
    assert_eq!((last.lsn, last.payload.as_slice()), (acked.start, &b"acknowledged after reopen"[..]));
    Ok(())
}

/// The model of the random run: what must survive, and what may.
#[derive(Default)]
struct Model {
    /// Records that must be replayed (LSN at or above `checkpoint`): acknowledged or replayed.
    durable: BTreeMap<u64, Vec<u8>>,
    /// Records of a failed append: each may or may not be replayed (a prefix of them).
    maybe: BTreeMap<u64, Vec<u8>>,
    /// Everything below this LSN may have been deleted by `truncate_before`.
    checkpoint: u64,
}

impl Model {
    /// Checks a recovery against the model and makes its records the new durable set.
    fn check_reopen(&mut self, recovery: &Recovery, context: &str) {
        assert!(recovery.is_clean(), "{context}: {:?}", recovery.corruptions);
        let got = lsns_and_payloads(recovery);
        for pair in got.windows(2) {
            assert_eq!(pair[0].0 + 1, pair[1].0, "{context}: LSNs not dense");
        }
        for (lsn, bytes) in &got {
            let known = self.durable.get(lsn).or_else(|| self.maybe.get(lsn));
            assert_eq!(known, Some(bytes), "{context}: LSN {lsn} replayed with a payload never acked or attempted");
        }
        let replayed: BTreeMap<u64, Vec<u8>> = got.into_iter().collect();
        for lsn in self.durable.keys().filter(|&&l| l >= self.checkpoint) {
            assert!(replayed.contains_key(lsn), "{context}: acknowledged LSN {lsn} lost");
        }
        self.durable = replayed;
        self.maybe.clear();
    }
}

#[test]
fn random_appends_crashes_and_power_cuts_keep_every_acknowledged_record() -> TestResult {
    random_appends_crashes_and_power_cuts(0)
}

#[test]
fn random_appends_crashes_and_power_cuts_with_preallocation_keep_every_acknowledged_record() -> TestResult {
    random_appends_crashes_and_power_cuts(SMALL_SEGMENT_BYTES / 2)
}

fn random_appends_crashes_and_power_cuts(preallocate_bytes: u64) -> TestResult {
    let open_sim = |sim: &SimFs, max_bytes: u64| {
        let opts = WalOptions { wal_segment_max_bytes: max_bytes, wal_preallocate_bytes: preallocate_bytes };
        Wal::open(DIR, std::sync::Arc::new(sim.clone()), opts)
    };
    let (mut torn_tails, mut failed_appends, mut acked_total) = (0, 0, 0);
    for seed in 1..=60u64 {
        let mut rng = XorShift64::new(seed);
        let sim = SimFs::new();
        let mut model = Model::default();
        let (mut wal, recovery) = open_sim(&sim, SMALL_SEGMENT_BYTES)?;
        model.check_reopen(&recovery, &format!("seed {seed} start"));
        for step in 0..80 {
            let context = format!("seed {seed} step {step}");
            let reopen = match rng.below(12) {
                0..=6 => {
                    let batch: Vec<Vec<u8>> = (0..1 + rng.below(4))
                        .map(|_| (0..rng.below(90)).map(|_| rng.below(256) as u8).collect())
                        .collect();
                    let refs: Vec<&[u8]> = batch.iter().map(Vec::as_slice).collect();
                    // Only a live WAL reaches an fsync; a failed one would leave the fault armed.
                    if rng.below(8) == 0 && wal.failure().is_none() {
                        sim.fail_next_fsync();
                    }
                    let start = wal.next_lsn().0;
                    let numbered = (start..).zip(batch.iter().cloned());
                    match wal.append(&refs) {
                        Ok(lsns) => {
                            assert_eq!(lsns.start.0, start, "{context}");
                            model.durable.extend(numbered);
                            acked_total += batch.len();
                        }
                        Err(StorageError::WalFailed { .. }) => {}
                        Err(_) => {
                            model.maybe.extend(numbered);
                            failed_appends += 1;
                        }
                    }
                    false
                }
                7 => {
                    let target = Lsn(rng.below(wal.next_lsn().0 as usize + 1) as u64);
                    if wal.truncate_before(target).is_ok() {
                        model.checkpoint = model.checkpoint.max(target.0);
                    }
                    false
                }
                8 => {
                    sim.power_loss();
                    true
                }
                9 | 10 => {
                    sim.power_loss_torn(rng.next_u64());
                    true
                }
                _ => true, // process crash
            };
            if reopen {
                drop(wal);
                let (reopened, recovery) = open_sim(&sim, SMALL_SEGMENT_BYTES)?;
                wal = reopened;
                torn_tails += usize::from(recovery.truncated_tail.is_some());
                model.check_reopen(&recovery, &context);
            }
        }
        drop(wal);
        sim.power_loss_torn(seed);
        let (_, recovery) = open_sim(&sim, SMALL_SEGMENT_BYTES)?;
        model.check_reopen(&recovery, &format!("seed {seed} end"));
    }
    // The run must have exercised the interesting paths, not just happy appends.
    assert!(torn_tails > 10, "only {torn_tails} torn tails");
    assert!(failed_appends > 10, "only {failed_appends} failed appends");
    assert!(acked_total > 1000, "only {acked_total} acknowledged records");
    Ok(())
}
