//! Behaviour tests of the shard store on `SimFs`: apply and snapshot, dedup by seq and insert id
//! within and across calls, restarts, flushes and compactions, window eviction, rejected pieces,
//! flush and compaction, options. Recovery tests are in `recovery_tests.rs`; the helpers here
//! serve all three test modules.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use super::files::{WAL_DIR_NAME, parse_part_name};
use super::*;
use crate::fs::SimFs;

pub(super) const DIR: &str = "/node/shards/t/0";
pub(super) type TestResult = Result<(), Box<dyn std::error::Error>>;

pub(super) fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true), Field::new("v", DataType::Utf8, true)]))
}

/// Rows with ids `ids`, one per id.
pub(super) fn batch(ids: Range<i64>) -> RecordBatch {
    let v: Vec<String> = ids.clone().map(|i| format!("v{i}")).collect();
    let columns =
        vec![Arc::new(Int64Array::from_iter_values(ids)) as _, Arc::new(StringArray::from_iter_values(v)) as _];
    RecordBatch::try_new(schema(), columns).unwrap_or_else(|e| unreachable!("test batch: {e}"))
}

pub(super) fn piece(ids: Range<i64>, origin: Option<&str>, seq: Option<u64>, insert_id: Option<&str>) -> Piece {
    Piece {
        origin: origin.map(str::to_string),
        seq,
        insert_id: insert_id.map(str::to_string),
        verified_placement: true,
        batch: batch(ids),
    }
}

/// Small limits, so flushes, compactions and WAL segment rolls happen in small tests.
pub(super) fn small_opts() -> ShardStoreOptions {
    ShardStoreOptions {
        buffer_max_rows: 20,
        buffer_max_bytes: 1 << 20,
        compact_min_parts: 3,
        part_target_rows: 100,
        insert_id_window: 1000,
        wal: WalOptions { wal_segment_max_bytes: 4096, ..WalOptions::default() },
    }
}

pub(super) fn open_sim(sim: &SimFs, opts: ShardStoreOptions) -> Result<(ShardStore, ShardRecovery), StorageError> {
    ShardStore::open(DIR, Arc::new(sim.clone()), schema(), opts)
}

/// How many times each id appears in the store.
pub(super) fn id_counts(store: &ShardStore) -> BTreeMap<i64, usize> {
    let mut counts = BTreeMap::new();
    for batch in store.snapshot() {
        assert_eq!(batch.schema(), schema(), "snapshot batches carry the store schema");
        let ids = batch.column(0).as_any().downcast_ref::<Int64Array>().map(|a| a.values().to_vec());
        for id in ids.unwrap_or_default() {
            *counts.entry(id).or_default() += 1;
        }
    }
    counts
}

/// The ids in the store, sorted, each once; fails the test if one appears twice.
pub(super) fn ids(store: &ShardStore) -> Vec<i64> {
    let counts = id_counts(store);
    assert!(counts.values().all(|&n| n == 1), "an id appears twice: {counts:?}");
    counts.into_keys().collect()
}

fn applied(rows: u64) -> ApplyOutcome {
    ApplyOutcome::Applied { rows }
}

pub(super) fn dir_names(sim: &SimFs) -> Result<Vec<String>, std::io::Error> {
    sim.list_dir(Path::new(DIR))
}

pub(super) fn part_paths(sim: &SimFs) -> Result<Vec<PathBuf>, std::io::Error> {
    let names = dir_names(sim)?;
    Ok(names.iter().filter(|n| parse_part_name(n).is_some()).map(|n| Path::new(DIR).join(n)).collect())
}

#[test]
fn apply_is_one_fsync_and_snapshot_returns_every_row() -> TestResult {
    let sim = SimFs::new();
    let (mut store, recovery) = open_sim(&sim, small_opts())?;
    assert_eq!((recovery.replayed_records, recovery.orphan_parts_removed.len()), (0, 0));
    let before = sim.sync_data_count();
    let out =
        store.apply(&[piece(0..3, None, None, None), piece(3..5, None, None, None), piece(5..5, None, None, None)])?;
    assert_eq!(out, vec![applied(3), applied(2), applied(0)]);
    assert_eq!(sim.sync_data_count(), before + 1, "one WAL append, one fsync, for the call");
    assert_eq!(ids(&store), (0..5).collect::<Vec<_>>());
    assert!(store.apply(&[])?.is_empty());
    assert_eq!(sim.sync_data_count(), before + 1, "an empty call writes nothing");
    let stats = store.stats();
    assert_eq!((stats.rows, stats.buffer_rows, stats.parts), (5, 5, 0));
    assert!(stats.bytes > 0 && stats.verified_placement && stats.wal_segments == 1);
    Ok(())
}

#[test]
fn dedup_by_seq_within_and_across_calls() -> TestResult {
    let sim = SimFs::new();
    let (mut store, _) = open_sim(&sim, small_opts())?;
    let o = Some("node-1");
    let out = store.apply(&[
        piece(0..1, o, Some(1), None),
        piece(1..2, o, Some(2), None),
        piece(1..2, o, Some(2), None),
        piece(0..1, o, Some(1), None),
        piece(2..3, Some("node-2"), Some(1), None),
    ])?;
    assert_eq!(out, vec![applied(1), applied(1), ApplyOutcome::Duplicate, ApplyOutcome::Duplicate, applied(1)]);
    let out =
        store.apply(&[piece(1..2, o, Some(2), None), piece(3..4, o, Some(5), None), piece(9..10, o, Some(4), None)])?;
    assert_eq!(out, vec![ApplyOutcome::Duplicate, applied(1), ApplyOutcome::Duplicate]);
    assert_eq!((store.hwm("node-1"), store.hwm("node-2"), store.hwm("node-3")), (Some(5), Some(1), None));
    assert_eq!(ids(&store), vec![0, 1, 2, 3]);
    assert_eq!(store.stats().hwm_origins, 2);
    Ok(())
}

#[test]
fn an_insert_id_duplicate_still_advances_the_mark_durably() -> TestResult {
    let sim = SimFs::new();
    let (mut store, _) = open_sim(&sim, small_opts())?;
    let out = store.apply(&[piece(0..2, None, None, Some("a")), piece(0..2, None, None, Some("a"))])?;
    assert_eq!(out, vec![applied(2), ApplyOutcome::Duplicate]);
    let out = store.apply(&[piece(0..2, Some("o"), Some(7), Some("a"))])?;
    assert_eq!((out, store.hwm("o")), (vec![ApplyOutcome::Duplicate], Some(7)));
    drop(store);
    sim.power_loss();
    let (mut store, recovery) = open_sim(&sim, ShardStoreOptions { insert_id_window: 0, ..small_opts() })?;
    assert_eq!((recovery.replayed_records, store.hwm("o")), (2, Some(7)), "the mark has a record of its own");
    // Without the insert-id window, only the durable mark recognises the resend.
    assert_eq!(store.apply(&[piece(0..2, Some("o"), Some(7), Some("a"))])?, vec![ApplyOutcome::Duplicate]);
    assert_eq!(ids(&store), vec![0, 1]);
    Ok(())
}

#[test]
fn dedup_survives_restart_flush_and_compaction() -> TestResult {
    let sim = SimFs::new();
    let (mut store, _) = open_sim(&sim, small_opts())?;
    let pieces: Vec<Piece> = (0..8)
        .map(|i| match i % 3 {
            0 => piece(i * 10..i * 10 + 5, Some("o"), Some(i as u64 + 1), None),
            1 => piece(i * 10..i * 10 + 5, None, None, Some(&format!("id-{i}"))),
            _ => piece(i * 10..i * 10 + 5, Some("o"), Some(i as u64 + 1), Some(&format!("id-{i}"))),
        })
        .collect();
    for (i, p) in pieces.iter().enumerate() {
        store.apply(std::slice::from_ref(p))?;
        if i % 2 == 1 {
            store.flush()?;
        }
    }
    let expected = ids(&store);
    assert_eq!(expected.len(), 40);
    let all_duplicates = vec![ApplyOutcome::Duplicate; pieces.len()];
    for round in 0..3 {
        match round {
            0 => sim.power_loss(),
            1 => assert_eq!(store.compact()?, 4),
            _ => store.flush()?,
        }
        drop(store);
        store = open_sim(&sim, small_opts())?.0;
        assert_eq!(store.apply(&pieces)?, all_duplicates, "round {round}");
        assert_eq!(ids(&store), expected, "round {round}");
    }
    Ok(())
}

#[test]
fn the_insert_id_window_forgets_the_oldest_ids_in_order_across_restarts() -> TestResult {
    let sim = SimFs::new();
    let opts = ShardStoreOptions { insert_id_window: 3, ..small_opts() };
    let (mut store, _) = open_sim(&sim, opts.clone())?;
    for (i, id) in ["a", "b", "c", "d"].iter().enumerate() {
        store.apply(&[piece(i as i64..i as i64 + 1, None, None, Some(id))])?;
    }
    store.flush()?;
    drop(store);
    let (mut store, _) = open_sim(&sim, opts.clone())?;
    // The manifest kept [b, c, d] in order: "e" evicts "b", not "d".
    store.apply(&[piece(4..5, None, None, Some("e"))])?;
    assert_eq!(store.apply(&[piece(0..1, None, None, Some("a"))])?, vec![applied(1)], "a was evicted");
    assert_eq!(store.apply(&[piece(3..4, None, None, Some("d"))])?, vec![ApplyOutcome::Duplicate]);
    assert_eq!(store.apply(&[piece(1..2, None, None, Some("b"))])?, vec![applied(1)], "b was evicted");
    drop(store);
    // A smaller window on reopen keeps the newest ids: [a, b] of [e, a, b].
    let (mut store, _) = open_sim(&sim, ShardStoreOptions { insert_id_window: 2, ..opts })?;
    assert_eq!(store.apply(&[piece(1..2, None, None, Some("b"))])?, vec![ApplyOutcome::Duplicate]);
    assert_eq!(store.apply(&[piece(4..5, None, None, Some("e"))])?, vec![applied(1)]);
    assert_eq!(id_counts(&store).values().sum::<usize>(), 8);
    Ok(())
}

#[test]
fn a_bad_piece_is_rejected_with_nothing_written_and_the_store_still_works() -> TestResult {
    let sim = SimFs::new();
    let (mut store, _) = open_sim(&sim, small_opts())?;
    let other = Arc::new(Schema::new(vec![Field::new("id", DataType::Int32, true)]));
    let wrong = RecordBatch::try_new(other, vec![Arc::new(arrow::array::Int32Array::from(vec![1]))])?;
    let before = sim.sync_data_count();
    let bad = Piece { batch: wrong, ..piece(0..0, None, None, None) };
    let err = store.apply(&[piece(0..2, Some("o"), Some(1), Some("x")), bad]);
    assert!(matches!(err, Err(StorageError::PieceSchemaMismatch { piece: 1, .. })), "{err:?}");
    let err = store.apply(&[piece(0..2, None, Some(1), None)]);
    assert!(matches!(err, Err(StorageError::InvalidPiece { piece: 0, .. })), "{err:?}");
    assert_eq!(sim.sync_data_count(), before, "nothing was written");
    assert!(store.snapshot().is_empty() && store.hwm("o").is_none());
    // Nothing of the rejected call counts as seen: the same good piece applies now.
    assert_eq!(store.apply(&[piece(0..2, Some("o"), Some(1), Some("x"))])?, vec![applied(2)]);
    drop(store);
    let (_, recovery) = open_sim(&sim, small_opts())?;
    assert_eq!(recovery.replayed_records, 1);
    Ok(())
}

#[test]
fn flush_writes_a_part_checkpoints_and_reopen_replays_only_the_rest() -> TestResult {
    let sim = SimFs::new();
    let opts =
        ShardStoreOptions { wal: WalOptions { wal_segment_max_bytes: 1024, ..WalOptions::default() }, ..small_opts() };
    let (mut store, _) = open_sim(&sim, opts.clone())?;
    for i in 0..10 {
        store.apply(&[piece(i * 3..i * 3 + 3, None, None, None)])?;
    }
    assert!(store.stats().wal_segments > 2);
    store.flush()?;
    let stats = store.stats();
    assert_eq!((stats.parts, stats.buffer_rows, stats.rows, stats.wal_segments), (1, 0, 30, 1));
    let syncs = sim.sync_data_count();
    store.flush()?;
    assert_eq!(sim.sync_data_count(), syncs, "nothing new: no part, no manifest");
    store.apply(&[piece(30..32, None, None, None)])?;
    drop(store);
    sim.power_loss();
    let (store, recovery) = open_sim(&sim, opts)?;
    assert_eq!(recovery.replayed_records, 1, "records below the checkpoint are not replayed");
    assert_eq!(ids(&store), (0..32).collect::<Vec<_>>());
    assert_eq!((store.stats().parts, store.stats().buffer_rows), (1, 2));
    Ok(())
}

#[test]
fn a_flush_that_covers_the_whole_log_deletes_its_segment() -> TestResult {
    // One large segment (as by default): the flushed records would stay beside the part until
    // it filled. A flush that covers them all starts a new segment and deletes the old one.
    let sim = SimFs::new();
    let opts = ShardStoreOptions { buffer_max_rows: 1_000_000, wal: WalOptions::default(), ..small_opts() };
    let (mut store, _) = open_sim(&sim, opts.clone())?;
    store.apply(&[piece(0..100_000, None, None, None)])?;
    let wal = Path::new(DIR).join(files::WAL_DIR_NAME);
    let wal_bytes = |sim: &SimFs| -> Result<usize, std::io::Error> {
        let mut total = 0;
        for name in sim.list_dir(&wal)? {
            total += sim.read(&wal.join(name))?.iter().filter(|b| **b != 0).count();
        }
        Ok(total)
    };
    assert!(wal_bytes(&sim)? as u64 > maintenance::WAL_ROLL_AT_CHECKPOINT_MIN_BYTES);
    let before = sim.list_dir(&wal)?;
    store.flush()?;
    let after = sim.list_dir(&wal)?;
    assert_eq!((before.len(), after.len(), store.stats().wal_segments), (1, 1, 1));
    assert_ne!(before, after, "a new segment");
    assert_eq!(wal_bytes(&sim)?, 0, "the records the part holds are gone");
    // A small flush leaves its segment to fill.
    store.apply(&[piece(100_000..100_010, None, None, None)])?;
    store.flush()?;
    assert_eq!(sim.list_dir(&wal)?, after);
    drop(store);
    sim.power_loss();
    let (store, recovery) = open_sim(&sim, opts)?;
    assert_eq!((recovery.replayed_records, store.stats().rows), (0, 100_010));
    Ok(())
}

#[test]
fn compaction_merges_small_parts_keeps_rows_and_deletes_the_old_files() -> TestResult {
    let sim = SimFs::new();
    let (mut store, _) = open_sim(&sim, small_opts())?;
    store.apply(&[piece(0..150, None, None, None)])?;
    store.flush()?; // a part at the target size: never merged
    assert_eq!(store.compact()?, 0);
    for i in 0..4 {
        store.apply(&[piece(200 + i * 5..205 + i * 5, None, None, None)])?;
        store.flush()?;
    }
    assert_eq!(store.stats().parts, 5);
    let before = ids(&store);
    assert_eq!(store.compact()?, 4);
    assert_eq!(store.compact()?, 0, "one small part left: nothing to do");
    assert_eq!((store.stats().parts, ids(&store)), (2, before.clone()));
    assert_eq!(part_paths(&sim)?.len(), 2, "the merged parts' files are gone");
    drop(store);
    sim.power_loss();
    let (store, recovery) = open_sim(&sim, small_opts())?;
    assert!(recovery.orphan_parts_removed.is_empty());
    assert_eq!((store.stats().parts, ids(&store)), (2, before));
    Ok(())
}

#[test]
fn optimize_flushes_then_merges_small_parts_and_final_merges_every_part() -> TestResult {
    let sim = SimFs::new();
    let (mut store, _) = open_sim(&sim, small_opts())?;
    assert_eq!(store.optimize(false)?, OptimizeOutcome::default(), "an empty store: nothing to do");
    store.apply(&[piece(0..150, None, None, None)])?;
    // The buffer becomes a part at the target size, which only FINAL merges.
    assert_eq!(store.optimize(false)?, OptimizeOutcome { flushed_rows: 150, merged_parts: 0, parts: 1 });
    store.apply(&[piece(200..205, None, None, None)])?;
    store.flush()?;
    store.apply(&[piece(300..303, None, None, None)])?;
    // Two small parts are merged (compaction waits for compact_min_parts of them).
    assert_eq!(store.optimize(false)?, OptimizeOutcome { flushed_rows: 3, merged_parts: 2, parts: 2 });
    assert_eq!(store.optimize(false)?.merged_parts, 0, "one small part left");
    let before = ids(&store);
    assert_eq!(store.optimize(true)?, OptimizeOutcome { flushed_rows: 0, merged_parts: 2, parts: 1 });
    assert_eq!(store.optimize(true)?, OptimizeOutcome { flushed_rows: 0, merged_parts: 0, parts: 1 });
    assert_eq!((ids(&store), part_paths(&sim)?.len(), store.stats().wal_segments), (before.clone(), 1, 1));
    drop(store);
    sim.power_loss();
    let (store, recovery) = open_sim(&sim, small_opts())?;
    assert_eq!((recovery.replayed_records, store.stats().parts, ids(&store)), (0, 1, before));
    Ok(())
}

#[test]
fn maintain_flushes_a_full_buffer_then_compacts() -> TestResult {
    let sim = SimFs::new();
    let (mut store, _) = open_sim(&sim, small_opts())?;
    store.apply(&[piece(0..10, None, None, None)])?;
    store.maintain()?;
    assert_eq!(store.stats().parts, 0, "under buffer_max_rows: kept in memory");
    for i in 1..4 {
        store.apply(&[piece(i * 20..i * 20 + 20, None, None, None)])?;
        store.maintain()?;
    }
    // Three flushes made three small parts, which the third maintain merged.
    assert_eq!((store.stats().parts, store.stats().rows), (1, 70));
    drop(store);
    let (mut store, _) = open_sim(&sim, ShardStoreOptions { buffer_max_bytes: 1, ..small_opts() })?;
    store.apply(&[piece(100..101, None, None, None)])?;
    store.maintain()?;
    assert_eq!(store.stats().buffer_rows, 0, "over buffer_max_bytes: flushed");
    Ok(())
}

#[test]
fn shipped_rows_count_once_in_the_stats_not_their_message_per_column() -> TestResult {
    // A batch decoded from one IPC message, as a shipped piece is: its columns are slices of the
    // buffer the message was read into.
    let received = crate::ipc_size::ipc_round_trip(&batch(0..10_000));
    let shown = crate::ipc_size::row_bytes(&received);
    assert!(received.get_array_memory_size() > 2 * shown, "the columns share the message's buffer");

    let sim = SimFs::new();
    let (mut store, _) = open_sim(&sim, ShardStoreOptions { buffer_max_rows: 1_000_000, ..small_opts() })?;
    let piece = Piece { origin: None, seq: None, insert_id: None, verified_placement: true, batch: received };
    store.apply(&[piece])?;
    assert_eq!((store.stats().buffer_rows, store.stats().bytes), (10_000, shown as u64), "in the buffer");
    store.flush()?;
    let stats = store.stats();
    assert_eq!((stats.parts, stats.rows), (1, 10_000));
    assert!(stats.bytes <= 2 * shown as u64, "in a part: {} bytes for {shown}", stats.bytes);
    Ok(())
}

#[test]
fn verified_placement_is_false_once_any_row_is_unverified_and_survives_flush() -> TestResult {
    let sim = SimFs::new();
    let (mut store, _) = open_sim(&sim, small_opts())?;
    store.apply(&[
        piece(0..2, None, None, None),
        Piece { verified_placement: false, ..piece(2..2, None, None, None) },
    ])?;
    assert!(store.stats().verified_placement, "an empty unverified piece adds no unverified rows");
    store.apply(&[Piece { verified_placement: false, ..piece(2..3, None, None, None) }])?;
    assert!(!store.stats().verified_placement);
    store.flush()?;
    drop(store);
    assert!(!open_sim(&sim, small_opts())?.0.stats().verified_placement);
    Ok(())
}

#[test]
fn a_store_can_be_moved_to_another_thread() {
    fn is_send<T: Send>() {}
    is_send::<ShardStore>();
}

#[test]
fn invalid_options_are_rejected() {
    for (opts, name) in [
        (ShardStoreOptions { compact_min_parts: 1, ..small_opts() }, "compact_min_parts"),
        (ShardStoreOptions { buffer_max_rows: 0, ..small_opts() }, "buffer_max_rows"),
        (ShardStoreOptions { part_target_rows: 0, ..small_opts() }, "part_target_rows"),
    ] {
        let err = open_sim(&SimFs::new(), opts).map(|_| ());
        assert!(matches!(err, Err(StorageError::InvalidOption { name: n, .. }) if n == name), "{err:?}");
    }
}

#[test]
fn files_removed_from_under_an_open_store_are_named() -> TestResult {
    let sim = SimFs::new();
    let (mut store, _) = open_sim(&sim, small_opts())?;
    assert_eq!(store.missing_files()?, Vec::<String>::new(), "a new store: no manifest expected yet");
    store.apply(&[piece(0..5, None, None, None)])?;
    store.flush()?;
    store.apply(&[piece(5..8, None, None, None)])?;
    assert_eq!(store.missing_files()?, Vec::<String>::new());
    let part = part_paths(&sim)?.remove(0);
    sim.remove_file(&part)?;
    let segment = store.wal.segment_names().next().ok_or("a live segment")?.to_string();
    sim.remove_file(&Path::new(DIR).join(WAL_DIR_NAME).join(&segment))?;
    let part_name = part.file_name().and_then(|n| n.to_str()).ok_or("part name")?.to_string();
    assert_eq!(store.missing_files()?, vec![part_name, format!("wal/{segment}")]);
    // Its rows are still served from memory: only the files say what a restart would find.
    assert_eq!(ids(&store), (0..8).collect::<Vec<_>>());
    Ok(())
}
