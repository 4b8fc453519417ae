//! Power-loss tests of the shard store on `SimFs`: every fsync of a flush and of a compaction
//! failed in turn, and a seeded random run of applies (outbox origins with seqs, clients with
//! insert ids, resends), flushes, compactions, injected fsync failures, crashes and torn power
//! cuts, checking on every reopen that each acknowledged piece's rows are there exactly once and
//! nothing is ever there twice.

use std::collections::BTreeMap;
use std::ops::Range;

use super::tests::{TestResult, id_counts, open_sim, piece, small_opts};
use super::*;
use crate::fs::SimFs;
use crate::xorshift::XorShift64;

fn ids_once(store: &ShardStore, ids: Range<i64>, context: &str) {
    let counts = id_counts(store);
    assert!(counts.values().all(|&n| n == 1), "{context}: an id appears twice");
    assert_eq!(counts.into_keys().collect::<Vec<_>>(), ids.collect::<Vec<_>>(), "{context}");
}

#[test]
fn each_fsync_of_a_flush_or_compaction_can_fail_without_losing_or_doubling_rows() -> TestResult {
    for op in ["flush", "compact"] {
        for failing_fsync in 0..8 {
            for power in 0..3 {
                let context = format!("{op}, fsync {failing_fsync} fails, power {power}");
                let sim = SimFs::new();
                let (mut store, _) = open_sim(&sim, small_opts())?;
                for i in 0..3 {
                    store.apply(&[piece(i * 10..i * 10 + 10, Some("o"), Some(i as u64 + 1), None)])?;
                    if op == "compact" {
                        store.flush()?;
                    }
                }
                sim.fail_fsync_after(failing_fsync);
                let result = if op == "flush" { store.flush() } else { store.compact().map(|_| ()) };
                sim.heal_fsync();
                if result.is_err() {
                    assert!(store.failure().is_some(), "{context}");
                }
                drop(store);
                match power {
                    0 => sim.power_loss(),
                    1 => sim.power_loss_torn(failing_fsync),
                    _ => {}
                }
                let (mut store, recovery) = open_sim(&sim, small_opts())?;
                assert!(recovery.wal.is_clean(), "{context}");
                ids_once(&store, 0..30, &context);
                // The resends are recognised whichever manifest survived.
                let resend: Vec<Piece> =
                    (0..3).map(|i| piece(i * 10..i * 10 + 10, Some("o"), Some(i as u64 + 1), None)).collect();
                assert_eq!(store.apply(&resend)?, vec![ApplyOutcome::Duplicate; 3], "{context}");
                store.flush()?;
                store.compact()?;
                drop(store);
                sim.power_loss();
                ids_once(&open_sim(&sim, small_opts())?.0, 0..30, &context);
            }
        }
    }
    Ok(())
}

/// One logical insert: a range of ids, sent as one or more pieces that dedup recognises as the
/// same (resends, or the same insert re-sent through an outbox under its insert id).
#[derive(Debug, Clone, Copy, Default)]
struct Insert {
    end: i64,
    acked: bool,
}

/// An outbox: sends its pieces in seq order, resending every unacknowledged one before anything
/// newer (as the real outbox does; otherwise a newer seq would make an older one a duplicate).
#[derive(Default)]
struct Outbox {
    next_seq: u64,
    unacked: Vec<Piece>,
    acked: Vec<Piece>,
}

/// What the random run knows must (or may) be in the store.
#[derive(Default)]
struct Model {
    /// By first id.
    inserts: BTreeMap<i64, Insert>,
    next_id: i64,
    outboxes: [Outbox; 2],
    client_unacked: Vec<Piece>,
    client_acked: Vec<Piece>,
}

const ORIGINS: [&str; 2] = ["node-a", "node-b"];

impl Outbox {
    /// The highest acknowledged seq (acknowledged pieces are kept in seq order).
    fn acked_seq(&self) -> Option<u64> {
        self.acked.last().and_then(|p| p.seq)
    }
}

fn origin_index(piece: &Piece) -> Option<usize> {
    piece.origin.as_deref().and_then(|o| ORIGINS.iter().position(|&x| x == o))
}

fn first_id(piece: &Piece) -> i64 {
    let ids = piece.batch.column(0).as_any().downcast_ref::<arrow::array::Int64Array>();
    ids.and_then(|a| a.values().first().copied()).unwrap_or(-1)
}

impl Model {
    fn new_insert(&mut self, rng: &mut XorShift64) -> Range<i64> {
        let ids = self.next_id..self.next_id + 1 + rng.below(4) as i64;
        self.next_id = ids.end;
        self.inserts.insert(ids.start, Insert { end: ids.end, acked: false });
        ids
    }

    /// A random call: each outbox's unacknowledged pieces, then maybe new ones; client pieces,
    /// new and retried; resends of acknowledged pieces; sometimes an acknowledged client insert
    /// re-sent through an outbox under a new seq (a duplicate by insert id that moves the mark).
    fn make_call(&mut self, rng: &mut XorShift64) -> Vec<Piece> {
        let mut call = Vec::new();
        for (o, origin) in ORIGINS.iter().enumerate() {
            call.append(&mut self.outboxes[o].unacked);
            for _ in 0..rng.below(3) {
                let reuse = (rng.below(5) == 0).then(|| self.client_acked.get(rng.below(self.client_acked.len() + 1)));
                let mut p = match reuse.flatten() {
                    Some(client) => client.clone(),
                    None => {
                        let ids = self.new_insert(rng);
                        let id = (rng.below(2) == 0).then(|| format!("ob-{}", ids.start));
                        piece(ids, None, None, id.as_deref())
                    }
                };
                self.outboxes[o].next_seq += 1 + rng.below(2) as u64; // seqs may skip values
                (p.origin, p.seq) = (Some(origin.to_string()), Some(self.outboxes[o].next_seq));
                call.push(p);
            }
        }
        for _ in 0..rng.below(3) {
            let ids = self.new_insert(rng);
            let id = format!("client-{}", ids.start);
            call.push(piece(ids, None, None, Some(&id)));
        }
        if rng.below(2) == 0 {
            call.append(&mut self.client_unacked);
        }
        for _ in 0..rng.below(3) {
            let o = rng.below(ORIGINS.len());
            let acked = &self.outboxes[o].acked;
            call.extend(acked.get(rng.below(acked.len() + 1)).cloned());
            call.extend(self.client_acked.get(rng.below(self.client_acked.len() + 1)).cloned());
        }
        call
    }

    fn acked(&mut self, call: Vec<Piece>) {
        for p in call {
            let insert = self.inserts.get_mut(&first_id(&p));
            let was_acked = insert.as_ref().is_some_and(|i| i.acked);
            if let Some(insert) = insert {
                insert.acked = true;
            }
            match origin_index(&p) {
                Some(o) if p.seq > self.outboxes[o].acked_seq() => self.outboxes[o].acked.push(p),
                Some(_) => {}
                None if !was_acked => self.client_acked.push(p),
                None => {}
            }
        }
    }

    /// A failed call: outbox pieces will be resent; a client retries, or (one time in three)
    /// gives up, so its rows may or may not be there.
    fn failed(&mut self, call: Vec<Piece>, rng: &mut XorShift64) {
        for p in call {
            let acked = self.inserts.get(&first_id(&p)).is_some_and(|i| i.acked);
            match origin_index(&p) {
                Some(o) if p.seq > self.outboxes[o].acked_seq() => self.outboxes[o].unacked.push(p),
                Some(_) => {}
                None if !acked && rng.below(3) > 0 => self.client_unacked.push(p),
                None => {}
            }
        }
    }

    fn check(&self, store: &ShardStore, context: &str) {
        let counts = id_counts(store);
        for (id, n) in &counts {
            assert_eq!(*n, 1, "{context}: id {id} appears {n} times");
            let insert = self.inserts.range(..=id).next_back().filter(|(_, i)| *id < i.end);
            assert!(insert.is_some(), "{context}: id {id} was never sent");
        }
        for (start, insert) in &self.inserts {
            let present = (*start..insert.end).filter(|id| counts.contains_key(id)).count();
            let len = (insert.end - start) as usize;
            assert!(present == 0 || present == len, "{context}: insert {start} is partly there");
            assert!(!insert.acked || present == len, "{context}: acknowledged insert {start} lost");
        }
        for (o, outbox) in self.outboxes.iter().enumerate() {
            assert!(store.hwm(ORIGINS[o]) >= outbox.acked_seq(), "{context}: {} mark went back", ORIGINS[o]);
        }
    }
}

#[test]
fn random_applies_crashes_and_power_cuts_keep_every_acknowledged_row_exactly_once() -> TestResult {
    let opts = ShardStoreOptions {
        part_target_rows: 30,
        wal: WalOptions { wal_segment_max_bytes: 2048, ..WalOptions::default() },
        ..small_opts()
    };
    let (mut failed_ops, mut reopens, mut duplicates, mut torn_tails, mut orphans) = (0, 0, 0, 0, 0);
    for seed in 1..=40u64 {
        let mut rng = XorShift64::new(seed);
        let sim = SimFs::new();
        let mut model = Model::default();
        let (mut store, _) = open_sim(&sim, opts.clone())?;
        for step in 0..60 {
            let context = format!("seed {seed} step {step}");
            let op = rng.below(12);
            if op <= 8 && rng.below(6) == 0 {
                sim.fail_fsync_after(rng.below(4) as u64);
            }
            let ok = match op {
                0..=5 => {
                    let call = model.make_call(&mut rng);
                    match store.apply(&call) {
                        Ok(outcomes) => {
                            assert_eq!(outcomes.len(), call.len(), "{context}");
                            duplicates += outcomes.iter().filter(|o| **o == ApplyOutcome::Duplicate).count();
                            model.acked(call);
                            true
                        }
                        Err(_) => {
                            model.failed(call, &mut rng);
                            false
                        }
                    }
                }
                6 => store.flush().is_ok(),
                7 => store.compact().is_ok(),
                8 => store.maintain().is_ok(),
                _ => true,
            };
            sim.heal_fsync();
            if ok {
                model.check(&store, &context);
            } else {
                failed_ops += 1;
                assert!(store.failure().is_some(), "{context}: an I/O error must fail the store");
            }
            if ok && op <= 8 {
                continue;
            }
            drop(store);
            match op {
                9 => sim.power_loss(),
                10 => sim.power_loss_torn(rng.next_u64()),
                _ if rng.below(2) == 0 => sim.power_loss_torn(rng.next_u64()),
                _ => {} // process crash only
            }
            let (reopened, recovery) = open_sim(&sim, opts.clone())?;
            store = reopened;
            reopens += 1;
            torn_tails += usize::from(recovery.wal.truncated_tail.is_some());
            orphans += recovery.orphan_parts_removed.len();
            assert!(recovery.wal.is_clean(), "{context}: {:?}", recovery.wal.corruptions);
            model.check(&store, &format!("{context} after reopen"));
        }
        // Drain: every outbox resends until acknowledged; every acknowledged piece is resent.
        drop(store);
        sim.power_loss_torn(seed);
        let (mut store, _) = open_sim(&sim, opts.clone())?;
        let mut resends: Vec<Piece> = Vec::new();
        for outbox in &mut model.outboxes {
            resends.append(&mut outbox.unacked);
        }
        store.apply(&resends)?;
        model.acked(resends);
        let acked: Vec<Piece> =
            model.outboxes.iter().flat_map(|o| o.acked.iter()).chain(&model.client_acked).cloned().collect();
        let outcomes = store.apply(&acked)?;
        assert!(outcomes.iter().all(|o| *o == ApplyOutcome::Duplicate), "seed {seed}: {outcomes:?}");
        model.check(&store, &format!("seed {seed} end"));
        assert!(store.stats().rows as usize <= model.next_id as usize);
    }
    // The run must have exercised the interesting paths, not just happy applies.
    eprintln!("failed {failed_ops}, reopens {reopens}, duplicates {duplicates}, torn {torn_tails}, orphans {orphans}");
    assert!(failed_ops > 40, "only {failed_ops} failed operations");
    assert!(reopens > 300, "only {reopens} reopens");
    assert!(duplicates > 300, "only {duplicates} duplicates");
    assert!(torn_tails > 10, "only {torn_tails} torn WAL tails");
    assert!(orphans > 5, "only {orphans} orphan files removed");
    Ok(())
}
