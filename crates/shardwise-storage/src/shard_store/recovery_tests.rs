//! Recovery tests of the shard store: orphan files, corrupt parts, torn WAL tails, undecodable
//! records, a lost manifest, a WAL behind its checkpoint, and a round trip on the real filesystem.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::files::{MANIFEST_NAME, WAL_DIR_NAME};
use super::tests::{DIR, TestResult, dir_names, ids, open_sim, part_paths, piece, schema, small_opts};
use super::*;
use crate::fs::{RealFs, SimFs};
use crate::wal::parse_segment_name;

#[test]
fn orphan_parts_and_temp_files_are_removed_on_open() -> TestResult {
    let sim = SimFs::new();
    let (mut store, _) = open_sim(&sim, small_opts())?;
    store.apply(&[piece(0..5, None, None, None)])?;
    store.flush()?;
    drop(store);
    let orphans = ["MANIFEST.tmp", "part-00000000000000000042.arrow.tmp", "part-00000000000000000099.arrow"];
    for name in orphans.iter().chain(&["notes.txt"]) {
        sim.create_append(&Path::new(DIR).join(name))?.write_all(b"junk")?;
    }
    let (mut store, recovery) = open_sim(&sim, small_opts())?;
    let mut expected: Vec<String> = orphans.iter().map(|s| s.to_string()).collect();
    expected.sort();
    assert_eq!(recovery.orphan_parts_removed, expected);
    let names = dir_names(&sim)?;
    assert!(names.contains(&"notes.txt".to_string()), "files that are not the store's are left alone");
    assert!(orphans.iter().all(|o| !names.contains(&o.to_string())));
    assert_eq!(ids(&store), (0..5).collect::<Vec<_>>());
    // Part numbers continue past the orphan's, so a new part never reuses a number.
    store.apply(&[piece(5..6, None, None, None)])?;
    store.flush()?;
    assert!(dir_names(&sim)?.contains(&"part-00000000000000000100.arrow".to_string()));
    Ok(())
}

#[test]
fn a_corrupt_or_short_part_is_an_error_naming_it() -> TestResult {
    for damage in ["flip", "cut"] {
        let sim = SimFs::new();
        let (mut store, _) = open_sim(&sim, small_opts())?;
        store.apply(&[piece(0..50, None, None, None)])?;
        store.flush()?;
        drop(store);
        let [part] = <[PathBuf; 1]>::try_from(part_paths(&sim)?).map_err(|p| format!("{p:?}"))?;
        match damage {
            "flip" => sim.flip_bit(&part, 200, 3)?,
            _ => sim.truncate(&part, 100)?,
        }
        let err = open_sim(&sim, small_opts()).map(|_| ());
        let Err(StorageError::PartCorrupt { path, problem }) = &err else { return Err(format!("{err:?}").into()) };
        assert_eq!(path, &part, "{damage}");
        assert!(problem.contains(if damage == "flip" { "CRC32C" } else { "bytes long" }), "{problem}");
        let message = err.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("part-00000000000000000001.arrow"), "{message}");
    }
    Ok(())
}

#[test]
fn a_torn_wal_tail_is_cut_and_the_acknowledged_pieces_replayed() -> TestResult {
    let sim = SimFs::new();
    let (mut store, _) = open_sim(&sim, small_opts())?;
    store.apply(&[piece(0..3, Some("o"), Some(1), None)])?;
    store.apply(&[piece(3..6, Some("o"), Some(2), None)])?;
    sim.fail_next_fsync();
    assert!(matches!(store.apply(&[piece(6..9, Some("o"), Some(3), None)]), Err(StorageError::Io { .. })));
    let err = store.apply(&[piece(9..10, None, None, None)]);
    assert!(matches!(err, Err(StorageError::ShardStoreFailed { .. })), "{err:?}");
    assert!(matches!(store.flush(), Err(StorageError::ShardStoreFailed { .. })));
    assert_eq!(ids(&store), (0..6).collect::<Vec<_>>(), "a failed call applies nothing");
    drop(store);
    // Half of the unacknowledged record reached the disk.
    let wal_dir = Path::new(DIR).join(WAL_DIR_NAME);
    let segment = wal_dir.join(sim.list_dir(&wal_dir)?.last().ok_or("no segment")?);
    let len = sim.read(&segment)?.len() as u64;
    sim.truncate(&segment, len - 40)?;
    let (store, recovery) = open_sim(&sim, small_opts())?;
    assert!(recovery.wal.truncated_tail.is_some() && recovery.wal.is_clean());
    assert!(recovery.wal.records.is_empty(), "moved into the store");
    assert_eq!((recovery.replayed_records, store.hwm("o")), (2, Some(2)));
    assert_eq!(ids(&store), (0..6).collect::<Vec<_>>());
    Ok(())
}

#[test]
fn a_whole_last_record_that_fails_its_checksum_is_cut_and_said() -> TestResult {
    let sim = SimFs::new();
    let (mut store, _) = open_sim(&sim, small_opts())?;
    store.apply(&[piece(0..3, Some("o"), Some(1), None)])?;
    store.apply(&[piece(3..6, Some("o"), Some(2), None)])?;
    assert!(store.warning().is_none());
    drop(store);
    // A flipped bit in the last record, which is whole: a torn write, or damage.
    let wal_dir = Path::new(DIR).join(WAL_DIR_NAME);
    let segment = wal_dir.join(sim.list_dir(&wal_dir)?.last().ok_or("no segment")?);
    let len = sim.read(&segment)?.len() as u64;
    sim.flip_bit(&segment, len as usize - 20, 2)?;
    let (store, recovery) = open_sim(&sim, small_opts())?;
    assert!(recovery.wal.truncated_tail.is_some());
    assert_eq!(ids(&store), (0..3).collect::<Vec<_>>());
    // Read (nothing says rows are missing), but said.
    assert!(store.unreadable().is_none());
    let warning = store.warning().ok_or("no warning")?;
    assert!(warning.contains("failed its checksum") && warning.contains("missing from this replica"), "{warning}");
    // A record cut short, the mark of a crash mid-write, is no warning.
    drop(store);
    let sim = SimFs::new();
    let (mut store, _) = open_sim(&sim, small_opts())?;
    store.apply(&[piece(0..3, Some("o"), Some(1), None)])?;
    drop(store);
    let segment = wal_dir.join(sim.list_dir(&wal_dir)?.last().ok_or("no segment")?);
    let len = sim.read(&segment)?.len() as u64;
    sim.truncate(&segment, len - 10)?;
    let (store, recovery) = open_sim(&sim, small_opts())?;
    assert!(recovery.wal.truncated_tail.is_some() && store.warning().is_none());
    Ok(())
}

#[test]
fn a_replica_whose_wal_was_damaged_is_not_read_and_says_so_after_every_open() -> TestResult {
    let sim = SimFs::new();
    let (mut store, _) = open_sim(&sim, small_opts())?;
    for i in 0..4 {
        store.apply(&[piece(i * 10..i * 10 + 10, Some("o"), Some(i as u64 + 1), None)])?;
    }
    assert!(store.unreadable().is_none());
    drop(store);
    // A flipped bit in the second record: the records after it are not replayed.
    let wal_dir = Path::new(DIR).join(WAL_DIR_NAME);
    let segment = wal_dir.join(sim.list_dir(&wal_dir)?.first().ok_or("no segment")?);
    let len = sim.read(&segment)?.len();
    sim.flip_bit(&segment, len / 3, 2)?;
    let (store, recovery) = open_sim(&sim, small_opts())?;
    assert!(!recovery.wal.is_clean());
    let why = store.unreadable().ok_or("a damaged replica must not be read")?;
    assert!(
        why.starts_with("damaged: its WAL was found damaged")
            && why.contains("a damaged record at byte")
            && !why.contains("MidLog"),
        "{why}"
    );
    assert!(dir_names(&sim)?.contains(&"DAMAGED".to_string()));
    drop(store);
    // The file remembers, whatever the next recovery finds (the damaged segment is set aside).
    let (store, _) = open_sim(&sim, small_opts())?;
    assert_eq!(store.unreadable().as_ref(), Some(&why));
    drop(store);
    let (store, _) = open_sim(&sim, small_opts())?;
    assert_eq!(store.unreadable(), Some(why));
    Ok(())
}

#[test]
fn an_undecodable_wal_record_is_an_error_naming_its_lsn() -> TestResult {
    let sim = SimFs::new();
    let (mut store, _) = open_sim(&sim, small_opts())?;
    store.apply(&[piece(0..3, None, None, None)])?;
    drop(store);
    let fs: Arc<dyn Fs> = Arc::new(sim.clone());
    let (mut wal, _) = Wal::open(Path::new(DIR).join(WAL_DIR_NAME), fs, WalOptions::default())?;
    // A valid header, then an IPC message of 4 bytes that is no flatbuffer.
    let lsns = wal.append(&[b"SWPR\x01\x01\x00\xff\xff\xff\xff\x04\x00\x00\x00abcd"])?;
    drop(wal);
    let err = open_sim(&sim, small_opts()).map(|_| ());
    let Err(StorageError::WalRecordInvalid { lsn, problem, .. }) = &err else { return Err(format!("{err:?}").into()) };
    assert_eq!(*lsn, lsns.start.0);
    assert!(problem.contains("IPC"), "{problem}");
    Ok(())
}

#[test]
fn a_lost_manifest_is_an_error_not_an_empty_store() -> TestResult {
    let sim = SimFs::new();
    let (mut store, _) = open_sim(&sim, small_opts())?;
    store.apply(&[piece(0..3, None, None, None)])?;
    drop(store);
    sim.remove_file(&Path::new(DIR).join(MANIFEST_NAME))?;
    let err = open_sim(&sim, small_opts()).map(|_| ());
    assert!(
        matches!(&err, Err(StorageError::ManifestInvalid { problem, .. }) if problem.contains("wal/wal-")),
        "{err:?}"
    );
    let mut file = sim.create_append(&Path::new(DIR).join(MANIFEST_NAME))?;
    file.write_all(br#"{"format_version": 2}"#)?;
    let err = open_sim(&sim, small_opts()).map(|_| ());
    assert!(
        matches!(&err, Err(StorageError::ManifestInvalid { problem, .. }) if problem.contains("version")),
        "{err:?}"
    );
    Ok(())
}

#[test]
fn a_wal_that_lost_checkpointed_records_skips_ahead_instead_of_reusing_their_lsns() -> TestResult {
    let sim = SimFs::new();
    let (mut store, _) = open_sim(&sim, small_opts())?;
    for i in 0..5 {
        store.apply(&[piece(i..i + 1, None, None, None)])?;
    }
    store.flush()?;
    drop(store);
    // The log is gone (say, the disk lost it); the manifest covers all of it.
    let wal_dir = Path::new(DIR).join(WAL_DIR_NAME);
    for name in sim.list_dir(&wal_dir)? {
        sim.remove_file(&wal_dir.join(name))?;
    }
    let (mut store, _) = open_sim(&sim, small_opts())?;
    assert_eq!(ids(&store), (0..5).collect::<Vec<_>>());
    store.apply(&[piece(5..6, None, None, None)])?;
    drop(store);
    let (store, recovery) = open_sim(&sim, small_opts())?;
    assert_eq!(recovery.replayed_records, 1, "the new record got an LSN at or above the checkpoint");
    assert_eq!(ids(&store), (0..6).collect::<Vec<_>>());
    let segments = sim.list_dir(&wal_dir)?.into_iter().filter(|n| parse_segment_name(n).is_some()).count();
    assert_eq!((segments, recovery.wal.is_clean()), (1, true));
    Ok(())
}

#[test]
fn real_fs_round_trip_with_flush_compaction_and_reopen() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("shard");
    let fs: Arc<dyn Fs> = Arc::new(RealFs);
    let (mut store, _) = ShardStore::open(&dir, Arc::clone(&fs), schema(), small_opts())?;
    for i in 0..4 {
        store.apply(&[piece(i * 10..i * 10 + 10, Some("o"), Some(i as u64 + 1), None)])?;
        store.flush()?;
    }
    assert_eq!(store.compact()?, 4);
    store.apply(&[piece(40..45, None, None, Some("late"))])?;
    drop(store);
    let (mut store, recovery) = ShardStore::open(&dir, fs, schema(), small_opts())?;
    assert_eq!((recovery.replayed_records, store.stats().parts, store.hwm("o")), (1, 1, Some(4)));
    assert_eq!(ids(&store), (0..45).collect::<Vec<_>>());
    assert_eq!(store.apply(&[piece(40..45, None, None, Some("late"))])?, vec![ApplyOutcome::Duplicate]);
    Ok(())
}
