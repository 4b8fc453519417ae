//! Opening a shard store: manifest, parts, orphan clean-up, WAL replay (see the module doc of
//! [`super`] for why each step is safe after a crash at any point).

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::datatypes::SchemaRef;

use super::dedup::DedupState;
use super::files::{
    DAMAGED_NAME, MANIFEST_NAME, WAL_DIR_NAME, is_temp_name, parse_part_name, remove_durably, write_durably,
};
use super::manifest::Manifest;
use super::{ShardRecovery, ShardStore, ShardStoreOptions, part, record};
use crate::error::StorageError;
use crate::fs::Fs;
use crate::wal::{Lsn, RecordDefect, Recovery, Wal, parse_segment_name};

pub(super) fn open(
    dir: PathBuf,
    fs: Arc<dyn Fs>,
    schema: SchemaRef,
    opts: ShardStoreOptions,
) -> Result<(ShardStore, ShardRecovery), StorageError> {
    opts.validate()?;
    fs.create_dir_all(&dir).map_err(StorageError::io("create dir", &dir))?;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs.sync_dir(parent).map_err(StorageError::io("fsync dir", parent))?;
    }
    // What is read below may be a rename whose directory fsync failed before a crash (a flush's
    // manifest, say); it must be durable before anything is deleted on its word.
    fs.sync_dir(&dir).map_err(StorageError::io("fsync dir", &dir))?;
    let manifest = match Manifest::read(fs.as_ref(), &dir)? {
        Some(manifest) => manifest,
        None => create_manifest(fs.as_ref(), &dir)?,
    };
    let parts: Vec<_> =
        manifest.parts.iter().map(|entry| part::load(fs.as_ref(), &dir, entry, &schema)).collect::<Result<_, _>>()?;
    let names = fs.list_dir(&dir).map_err(StorageError::io("list", &dir))?;
    let orphan_parts_removed = remove_orphans(fs.as_ref(), &dir, &names, &manifest)?;
    let highest_part = names.iter().filter_map(|n| parse_part_name(n)).chain(manifest.max_part_number()).max();
    let next_part_number = highest_part.map_or(1, |n| n.saturating_add(1));

    let wal_dir = dir.join(WAL_DIR_NAME);
    let (mut wal, mut report) = Wal::open(&wal_dir, Arc::clone(&fs), opts.wal.clone())?;
    let damage = damage(fs.as_ref(), &dir, &report)?;
    let checkpoint = Lsn(manifest.wal_checkpoint_lsn);
    if wal.next_lsn() < checkpoint {
        // The log lost records the manifest already covers (damage at its end): new records must
        // still get LSNs at or above the checkpoint, or replay would skip them.
        tracing::warn!(dir = %dir.display(), wal_next_lsn = %wal.next_lsn(), %checkpoint, "WAL ends below the checkpoint");
        wal.skip_to(checkpoint)?;
    }
    let records = std::mem::take(&mut report.records);
    let dedup = DedupState::new(manifest.hwm.clone(), manifest.insert_ids.clone(), opts.insert_id_window);
    let mut store = ShardStore {
        verified_placement: manifest.verified_placement,
        dir,
        fs,
        schema,
        opts,
        wal,
        manifest,
        parts,
        buffer: Vec::new(),
        buffer_rows: 0,
        buffer_bytes: 0,
        encode_buffer: Vec::new(),
        dedup,
        next_part_number,
        failure: None,
        damage,
        tail_cut: tail_cut(&report),
        retired: None,
    };
    let mut replayed_records = 0;
    for wal_record in records.into_iter().filter(|r| r.lsn >= checkpoint) {
        let piece = record::decode(&wal_record.payload, &store.schema).map_err(|problem| {
            StorageError::WalRecordInvalid { dir: wal_dir.clone(), lsn: wal_record.lsn.0, problem }
        })?;
        store.absorb(piece);
        replayed_records += 1;
    }
    store.wal.truncate_before(checkpoint)?;
    tracing::info!(
        dir = %store.dir.display(),
        parts = store.parts.len(),
        replayed_records,
        orphans = orphan_parts_removed.len(),
        "shard store opened"
    );
    Ok((store, ShardRecovery { wal: report, replayed_records, orphan_parts_removed }))
}

/// The recovery's cut of a whole last record that failed its checksum, in words (see
/// [`ShardStore::warning`]).
fn tail_cut(report: &Recovery) -> Option<String> {
    let cut = report.truncated_tail.as_ref()?;
    matches!(cut.defect, RecordDefect::ChecksumMismatch { .. }).then(|| {
        format!(
            "the node's start cut the WAL's last record ({} bytes at offset {} of {}): it was whole but \
             failed its checksum ({}); a crash while it was written explains that, but if it had been \
             acknowledged its rows are missing from this replica (the other replicas have them)",
            cut.dropped_bytes, cut.offset_bytes, cut.segment, cut.defect
        )
    })
}

/// Why the replica must not be read, if it must not: its WAL found corrupt by this recovery
/// (records past the damage were not replayed, so rows it acknowledged are missing), or by an
/// earlier one, as its `DAMAGED` file records. Recovery sets the damaged segment aside, so the
/// next open finds a clean log: the file is what remembers, written durably before the store
/// serves anything.
fn damage(fs: &dyn Fs, dir: &Path, report: &Recovery) -> Result<Option<String>, StorageError> {
    let path = dir.join(DAMAGED_NAME);
    let recorded = match fs.read(&path) {
        Ok(bytes) => Some(String::from_utf8_lossy(&bytes).trim().to_string()),
        Err(error) if error.kind() == ErrorKind::NotFound => None,
        Err(error) => return Err(StorageError::io("read", &path)(error)),
    };
    if report.is_clean() {
        return Ok(recorded);
    }
    if let Some(earlier) = recorded {
        // Already out of reads; what this recovery found (the gap the set-aside segment left,
        // often) is in its report and the log, not appended to the file at every open.
        return Ok(Some(earlier));
    }
    let found: Vec<String> = report.corruptions.iter().map(ToString::to_string).collect();
    let text = format!(
        "its WAL was found damaged when the store was opened, so rows it had acknowledged may be missing: {}",
        found.join("; ")
    );
    write_durably(fs, dir, DAMAGED_NAME, text.as_bytes())?;
    tracing::error!(dir = %dir.display(), "shard replica marked damaged: it is not read until rebuilt: {text}");
    Ok(Some(text))
}

/// Writes the manifest of a new, empty store, after checking that the directory really holds
/// no store: parts or WAL segments without a manifest mean it was lost, and starting empty would
/// throw their rows away.
fn create_manifest(fs: &dyn Fs, dir: &Path) -> Result<Manifest, StorageError> {
    let names = fs.list_dir(dir).map_err(StorageError::io("list", dir))?;
    let mut found: Vec<String> = names.into_iter().filter(|n| parse_part_name(n).is_some()).collect();
    let wal_dir = dir.join(WAL_DIR_NAME);
    match fs.list_dir(&wal_dir) {
        Ok(wal_names) => found.extend(
            wal_names.into_iter().filter(|n| parse_segment_name(n).is_some()).map(|n| format!("{WAL_DIR_NAME}/{n}")),
        ),
        Err(error) if error.kind() == ErrorKind::NotFound => {}
        Err(error) => return Err(StorageError::io("list", wal_dir)(error)),
    }
    if !found.is_empty() {
        return Err(StorageError::ManifestInvalid {
            path: dir.join(MANIFEST_NAME),
            problem: format!(
                "missing, but the directory holds store files ({}); refusing to start an empty store over them",
                found.join(", ")
            ),
        });
    }
    let manifest = Manifest::empty();
    manifest.write(fs, dir)?;
    Ok(manifest)
}

/// Deletes temp files and part files the manifest does not list, durably; returns their names.
fn remove_orphans(fs: &dyn Fs, dir: &Path, names: &[String], manifest: &Manifest) -> Result<Vec<String>, StorageError> {
    let listed = |name: &str| manifest.parts.iter().any(|p| p.name == name);
    let orphans: Vec<String> = names
        .iter()
        .filter(|name| is_temp_name(name) || (parse_part_name(name).is_some() && !listed(name)))
        .cloned()
        .collect();
    if !orphans.is_empty() {
        tracing::info!(dir = %dir.display(), ?orphans, "removing files no manifest lists");
    }
    remove_durably(fs, dir, &orphans)?;
    Ok(orphans)
}
