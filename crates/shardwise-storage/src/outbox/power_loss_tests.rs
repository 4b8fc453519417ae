//! Power-loss tests of the outbox on `SimFs`: seqs that never repeat across crashes, truncation
//! and a lost log tail; fsync failures that fail the outbox; damage reported on reopen; and a
//! seeded random run of appends, acks, discards, injected fsync failures, process crashes and
//! (torn) power cuts. After every reopen the pending items must be exactly those acknowledged and
//! not acked or discarded — each once, under its seq, with its payload — give or take the one
//! operation that failed; and no seq is ever handed out twice.

use std::collections::BTreeMap;
use std::path::Path;

use super::tests::{DIR, TestResult, all_pending, item, open_sim, options, segments, seqs, small, wal_dir};
use super::*;
use crate::fs::SimFs;
use crate::wal::{Corruption, WAL_SEGMENT_MAX_BYTES_DEFAULT};
use crate::xorshift::XorShift64;

#[test]
fn seqs_strictly_increase_across_reopens_and_full_truncation() -> TestResult {
    let sim = SimFs::new();
    let mut last = 0;
    let (mut outbox, _) = open_sim(&sim, &small())?;
    for cycle in 0..60u64 {
        for i in 0..1 + cycle % 4 {
            let seq = outbox.append(vec![item("t", (i % 2) as u32, 1, &[cycle as u8; 50])], cycle)?;
            assert!(seq > last, "cycle {cycle}: seq {seq} after {last}");
            last = seq;
        }
        if cycle % 3 == 0 {
            drop(outbox);
            outbox = open_sim(&sim, &small())?.0;
        }
        outbox.ack(0, last)?;
        outbox.ack(1, last)?;
        assert!(outbox.destinations().is_empty());
        assert_eq!(segments(&sim)?.len(), 1, "cycle {cycle}: only the active segment is left");
        drop(outbox);
        if cycle % 2 == 0 {
            // Make the one remaining segment empty, as a crash right after a roll leaves it.
            let active = wal_dir().join(&segments(&sim)?[0]);
            sim.truncate(&active, 0)?;
        }
        outbox = open_sim(&sim, &small())?.0;
    }
    Ok(())
}

#[test]
fn losing_the_end_of_the_log_never_reuses_a_seq() -> TestResult {
    // A disk that lied about a flush (or bit rot in the last record) loses acknowledged records
    // at the end of the log; the WAL takes that for a torn tail. A receiver may hold those seqs.
    let sim = SimFs::new();
    let (mut outbox, _) = open_sim(&sim, &small())?;
    let mut delivered = 0;
    for round in 0..20u8 {
        delivered = delivered.max(outbox.append(vec![item("t", 1, 1, &[round; 8])], 0)?);
        drop(outbox);
        let last = wal_dir().join(segments(&sim)?.last().ok_or("no segment")?);
        let len = sim.read(&last)?.len() as u64;
        sim.truncate(&last, len.saturating_sub(5))?;
        let (reopened, recovery) = open_sim(&sim, &small())?;
        assert!(recovery.wal.truncated_tail.is_some(), "round {round}");
        outbox = reopened;
        let seq = outbox.append(vec![item("t", 1, 1, b"new")], 0)?;
        assert!(seq > delivered, "round {round}: seq {seq} reuses one up to {delivered}");
        delivered = seq;
    }
    Ok(())
}

#[test]
fn an_fsync_failure_fails_the_outbox_until_reopened() -> TestResult {
    let sim = SimFs::new();
    let (mut outbox, _) = open_sim(&sim, &small())?;
    let kept = outbox.append(vec![item("t", 1, 1, b"kept")], 0)?;
    sim.fail_next_fsync();
    assert!(matches!(outbox.append(vec![item("t", 1, 1, b"lost?")], 0), Err(StorageError::Io { .. })));
    assert!(outbox.failure().is_some());
    assert_eq!(seqs(&outbox.pending(1, 10, u64::MAX)), vec![kept], "memory shows only what was acknowledged");
    assert!(matches!(outbox.append(vec![item("t", 1, 1, b"x")], 0), Err(StorageError::WalFailed { .. })));
    assert!(matches!(outbox.ack(1, kept), Err(StorageError::WalFailed { .. })));
    assert!(matches!(outbox.discard_table("none"), Err(StorageError::WalFailed { .. })));
    drop(outbox);
    sim.power_loss();
    let (mut outbox, _) = open_sim(&sim, &small())?;
    assert_eq!(seqs(&outbox.pending(1, 10, u64::MAX)), vec![kept]);
    assert!(outbox.append(vec![item("t", 1, 1, b"after")], 0)? > kept);
    Ok(())
}

/// What a node does once its outbox failed (`tables/reopen.rs`): it opens the outbox again while
/// the failed one is still open, uses the new one, and drops the old one later. The new one holds
/// every acknowledged item, hands out seqs above every one used, and dropping the failed one
/// changes nothing on disk.
#[test]
fn a_failed_outbox_reopened_beside_itself_takes_over() -> TestResult {
    let sim = SimFs::new();
    let (mut failed, _) = open_sim(&sim, &small())?;
    let kept = failed.append(vec![item("t", 1, 1, b"kept")], 0)?;
    sim.fail_next_fsync();
    assert!(failed.append(vec![item("t", 1, 1, b"lost?")], 0).is_err());
    assert!(failed.failure().is_some());
    let (mut reopened, _) = open_sim(&sim, &small())?;
    assert!(reopened.failure().is_none());
    let pending = seqs(&reopened.pending(1, 10, u64::MAX));
    assert_eq!(pending.first(), Some(&kept), "{pending:?}");
    let after = reopened.append(vec![item("t", 1, 1, b"after")], 0)?;
    assert!(pending.iter().all(|&seq| seq < after), "{pending:?} then {after}");
    drop(failed);
    reopened.ack(1, kept)?;
    drop(reopened);
    let (outbox, _) = open_sim(&sim, &small())?;
    let pending = seqs(&outbox.pending(1, 10, u64::MAX));
    assert!(!pending.contains(&kept) && pending.last() == Some(&after), "{pending:?}");
    drop(outbox);
    // The append after the reopen was fsynced (an ack is not: lost, it is a resend).
    sim.power_loss();
    let (outbox, _) = open_sim(&sim, &small())?;
    assert_eq!(seqs(&outbox.pending(1, 10, u64::MAX)).last(), Some(&after));
    Ok(())
}

#[test]
fn a_failed_seq_lease_extension_fails_the_outbox() -> TestResult {
    let sim = SimFs::new();
    let opts = options(OUTBOX_MAX_BYTES_DEFAULT, WAL_SEGMENT_MAX_BYTES_DEFAULT); // no segment rolls
    let (mut outbox, _) = open_sim(&sim, &opts)?;
    let mut last = 0;
    // An append fsyncs its record once; one that extends the lease first fsyncs the new lease
    // file and then the directory for its rename. Failing the second fsync hits exactly that.
    loop {
        sim.fail_fsync_after(1);
        match outbox.append(vec![item("t", 1, 1, b"x")], 0) {
            Ok(seq) => last = seq,
            Err(StorageError::Io { op: "fsync dir", path, .. }) if path == Path::new(DIR) => break,
            Err(other) => return Err(other.into()),
        }
        sim.heal_fsync();
    }
    sim.heal_fsync();
    assert!(matches!(outbox.append(vec![item("t", 1, 1, b"x")], 0), Err(StorageError::OutboxFailed { .. })));
    assert!(outbox.failure().is_some());
    drop(outbox);
    sim.power_loss(); // the rename is undone: the old lease is back
    let (mut outbox, _) = open_sim(&sim, &opts)?;
    assert!(outbox.append(vec![item("t", 1, 1, b"x")], 0)? > last);
    Ok(())
}

#[test]
fn mid_log_corruption_is_reported_not_an_error() -> TestResult {
    let sim = SimFs::new();
    let (mut outbox, _) = open_sim(&sim, &small())?;
    for i in 0..20u8 {
        outbox.append(vec![item("t", 1, 1, &[i; 60])], 0)?;
    }
    drop(outbox);
    let first = wal_dir().join(&segments(&sim)?[0]);
    sim.flip_bit(&first, 30, 3)?;
    let (outbox, recovery) = open_sim(&sim, &small())?;
    assert!(
        matches!(recovery.wal.corruptions.as_slice(), [Corruption::MidLog { .. }, ..]),
        "{:?}",
        recovery.wal.corruptions
    );
    let pending = outbox.pending(1, 100, u64::MAX);
    assert!(!pending.is_empty() && pending.len() < 20, "later segments replay: {}", pending.len());
    assert_eq!(recovery.pending_items, pending.len() as u64);
    Ok(())
}

/// Pending items by (dest, seq): (table, rows, payload, appended_unix_ms).
type State = BTreeMap<(u32, u64), (String, u64, Vec<u8>, u64)>;

const TABLES: [&str; 3] = ["a", "b", "c"];
const DESTS: u32 = 4;

/// An operation that returned an I/O error: after the reopen it has taken effect wholly or not
/// at all.
#[derive(Debug, Clone)]
enum Uncertain {
    Append { items: Vec<OutboxItem>, now_unix_ms: u64 },
    Ack { dest: u32, up_to_seq: u64 },
    AckItems { dest: u32, seqs: Vec<u64> },
    Discard { table: String },
}

#[derive(Default)]
struct Model {
    pending: State,
    uncertain: Option<Uncertain>,
    /// The highest seq handed out or seen so far: every new one must be above it.
    max_seq: u64,
    /// Failed operations that turned out to have taken effect.
    took_effect: usize,
    /// Items removed by acks since the last fsynced operation: acks are not fsynced, so a power
    /// cut may bring these back (to be resent), but nothing else.
    unsynced_acked: State,
    /// How many items a power cut made pending again.
    resurrected: usize,
}

fn state_of(outbox: &Outbox) -> State {
    all_pending(outbox)
        .into_iter()
        .map(|(dest, seq, table, rows, payload, ms)| ((dest, seq), (table, rows, payload, ms)))
        .collect()
}

fn with_append(state: &State, seq: u64, items: &[OutboxItem], now_unix_ms: u64) -> State {
    let mut out = state.clone();
    for i in items {
        out.insert((i.dest, seq), (i.table.to_string(), i.rows, i.payload.clone(), now_unix_ms));
    }
    out
}

impl Model {
    fn appended(&mut self, seq: u64, items: &[OutboxItem], now_unix_ms: u64, context: &str) {
        assert!(seq > self.max_seq, "{context}: seq {seq} handed out again (max so far {})", self.max_seq);
        self.max_seq = seq;
        self.pending = with_append(&self.pending, seq, items, now_unix_ms);
    }

    fn acked(&mut self, dest: u32, up_to_seq: u64) {
        let (removed, kept): (State, State) =
            std::mem::take(&mut self.pending).into_iter().partition(|&((d, seq), _)| d == dest && seq <= up_to_seq);
        self.pending = kept;
        self.unsynced_acked.extend(removed);
    }

    fn acked_items(&mut self, dest: u32, seqs: &[u64]) {
        let (removed, kept): (State, State) =
            std::mem::take(&mut self.pending).into_iter().partition(|&((d, seq), _)| d == dest && seqs.contains(&seq));
        self.pending = kept;
        self.unsynced_acked.extend(removed);
    }

    fn discarded(&mut self, table: &str) {
        self.pending.retain(|_, (t, ..)| t != table);
    }

    /// An fsynced operation succeeded: every earlier ack is durable.
    fn synced(&mut self) {
        self.unsynced_acked.clear();
    }

    /// Checks the live outbox against the model (no uncertain operation outstanding).
    fn check_live(&self, outbox: &Outbox, context: &str) {
        assert_eq!(state_of(outbox), self.pending, "{context}: live state");
        let bytes: u64 = self.pending.values().map(|(_, _, p, _)| p.len() as u64).sum();
        assert_eq!(outbox.pending_bytes(), bytes, "{context}: pending_bytes");
        let items: u64 = (0..DESTS).map(|d| outbox.dest_stats(d).pending_items).sum();
        assert_eq!(items, self.pending.len() as u64, "{context}: dest_stats");
    }

    /// Checks a reopened outbox: the model's items, plus or minus the uncertain operation.
    fn check_reopen(&mut self, outbox: &Outbox, recovery: &OutboxRecovery, context: &str) {
        assert!(recovery.wal.is_clean(), "{context}: {:?}", recovery.wal.corruptions);
        let actual = state_of(outbox);
        assert_eq!(recovery.pending_items, actual.len() as u64, "{context}");
        let uncertain = self.uncertain.take();
        // Items whose ack a power cut took back are pending again, unchanged; set them aside.
        let resurrected: State = actual
            .iter()
            .filter(|(k, v)| !self.pending.contains_key(*k) && self.unsynced_acked.get(*k) == Some(*v))
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        self.unsynced_acked.clear();
        let full_actual = actual;
        let actual: State =
            full_actual.iter().filter(|(k, _)| !resurrected.contains_key(*k)).map(|(k, v)| (*k, v.clone())).collect();
        self.resurrected += resurrected.len();
        if actual != self.pending {
            let mut with = self.pending.clone();
            match &uncertain {
                None => {}
                Some(Uncertain::Append { items, now_unix_ms }) => {
                    // The failed append may have reached the disk under the seq it was given.
                    let seq = actual.keys().map(|&(_, s)| s).find(|s| !self.pending.keys().any(|&(_, m)| m == *s));
                    if let Some(seq) = seq {
                        assert!(seq > self.max_seq, "{context}: failed append replayed under used seq {seq}");
                        self.max_seq = seq;
                        with = with_append(&self.pending, seq, items, *now_unix_ms);
                    }
                }
                Some(Uncertain::Ack { dest, up_to_seq }) => with.retain(|&(d, s), _| d != *dest || s > *up_to_seq),
                Some(Uncertain::AckItems { dest, seqs }) => with.retain(|&(d, s), _| d != *dest || !seqs.contains(&s)),
                Some(Uncertain::Discard { table }) => with.retain(|_, (t, ..)| t != table),
            }
            assert_eq!(actual, with, "{context}: after reopen (uncertain: {uncertain:?})");
            self.took_effect += 1;
        }
        self.pending = full_actual;
        self.check_live(outbox, context);
    }
}

fn random_items(rng: &mut XorShift64, step: u64) -> Vec<OutboxItem> {
    let first = rng.below(DESTS as usize) as u32;
    let count = 1 + rng.below(3) as u32;
    (0..count)
        .map(|k| {
            let dest = (first + k) % DESTS;
            let mut payload = format!("s{step}d{dest}:").into_bytes();
            payload.extend((0..rng.below(100)).map(|_| rng.below(256) as u8));
            let table: Arc<str> = TABLES[rng.below(TABLES.len())].into();
            OutboxItem { table, dest, rows: rng.below(1000) as u64, payload }
        })
        .collect()
}

#[test]
fn random_appends_acks_discards_crashes_and_power_cuts_keep_every_acknowledged_item() -> TestResult {
    let opts = options(1_200, 256);
    let (mut acked_appends, mut io_failures, mut full, mut torn_tails, mut took_effect) = (0, 0, 0, 0, 0);
    let mut resurrected = 0;
    let mut max_segments = 0;
    for seed in 1..=40u64 {
        let mut rng = XorShift64::new(seed);
        let sim = SimFs::new();
        let mut model = Model::default();
        let (mut outbox, recovery) = open_sim(&sim, &opts)?;
        model.check_reopen(&outbox, &recovery, &format!("seed {seed} start"));
        for step in 0..80u64 {
            let context = format!("seed {seed} step {step}");
            let choice = rng.below(14);
            if choice <= 9 && rng.below(7) == 0 && outbox.failure().is_none() {
                sim.fail_fsync_after(rng.below(3) as u64);
            }
            let (result, op) = match choice {
                0..=4 => {
                    let items = random_items(&mut rng, step);
                    let result = outbox.append(items.clone(), step);
                    if let Ok(seq) = result {
                        model.appended(seq, &items, step, &context);
                        model.synced();
                        acked_appends += 1;
                    }
                    (result.map(|_| ()), Some(Uncertain::Append { items, now_unix_ms: step }))
                }
                5..=8 => {
                    let dest = rng.below(DESTS as usize) as u32;
                    let seqs: Vec<u64> = model.pending.keys().filter(|k| k.0 == dest).map(|k| k.1).collect();
                    let up_to_seq = match rng.below(4) {
                        0 => u64::MAX,
                        _ => seqs.get(rng.below(seqs.len() + 1)).copied().unwrap_or(model.max_seq),
                    };
                    if rng.below(2) == 0 {
                        // Single items, as after a shipment the destination took only part of.
                        let seqs: Vec<u64> = seqs.into_iter().filter(|_| rng.below(2) == 0).collect();
                        let result = outbox.ack_items(dest, &seqs);
                        if result.is_ok() {
                            model.acked_items(dest, &seqs);
                        }
                        (result.map(|_| ()), Some(Uncertain::AckItems { dest, seqs }))
                    } else {
                        let result = outbox.ack(dest, up_to_seq);
                        if result.is_ok() {
                            model.acked(dest, up_to_seq);
                        }
                        (result.map(|_| ()), Some(Uncertain::Ack { dest, up_to_seq }))
                    }
                }
                9 => {
                    let table = TABLES[rng.below(TABLES.len())].to_string();
                    let result = outbox.discard_table(&table);
                    if let Ok(dropped) = result {
                        if dropped > 0 {
                            model.synced();
                        }
                        let before = model.pending.len();
                        model.discarded(&table);
                        assert_eq!(dropped, (before - model.pending.len()) as u64, "{context}");
                    }
                    (result.map(|_| ()), Some(Uncertain::Discard { table }))
                }
                10 => {
                    sim.power_loss();
                    (Ok(()), None)
                }
                11 | 12 => {
                    sim.power_loss_torn(rng.next_u64());
                    (Ok(()), None)
                }
                _ => (Ok(()), None), // process crash
            };
            sim.heal_fsync();
            match result {
                Ok(()) => {}
                Err(StorageError::OutboxFull { .. }) => full += 1,
                Err(StorageError::WalFailed { .. } | StorageError::OutboxFailed { .. }) => {}
                Err(error) => {
                    assert!(outbox.failure().is_some(), "{context}: {error} did not fail the outbox");
                    assert!(model.uncertain.is_none(), "{context}: a second write after a failure");
                    model.uncertain = op;
                    io_failures += 1;
                }
            }
            if model.uncertain.is_none() {
                model.check_live(&outbox, &context);
            }
            max_segments = max_segments.max(segments(&sim)?.len());
            if choice >= 10 {
                drop(outbox);
                let (reopened, recovery) = open_sim(&sim, &opts)?;
                outbox = reopened;
                torn_tails += usize::from(recovery.wal.truncated_tail.is_some());
                model.check_reopen(&outbox, &recovery, &context);
            }
        }
        drop(outbox);
        sim.power_loss_torn(seed);
        let (outbox, recovery) = open_sim(&sim, &opts)?;
        model.check_reopen(&outbox, &recovery, &format!("seed {seed} end"));
        took_effect += model.took_effect;
        resurrected += model.resurrected;
    }
    // The run must have exercised the interesting paths, not just happy appends.
    assert!(acked_appends > 600, "only {acked_appends} acknowledged appends");
    assert!(resurrected > 0, "no power cut ever took an unsynced ack back");
    assert!(io_failures > 40, "only {io_failures} failed operations");
    assert!(took_effect > 5, "only {took_effect} failed operations took effect after the reopen");
    assert!(torn_tails > 10, "only {torn_tails} torn tails");
    assert!(full > 3, "only {full} full outboxes");
    assert!(max_segments < 40, "the log grew to {max_segments} segments");
    Ok(())
}
