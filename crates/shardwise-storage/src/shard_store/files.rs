//! The files of a shard store's directory: their names, and writing one atomically and durably.

use std::io::ErrorKind;
use std::path::Path;

use crate::error::StorageError;
use crate::fs::{AppendFile, Fs};

/// The manifest's file name.
pub(super) const MANIFEST_NAME: &str = "MANIFEST";
/// The WAL's subdirectory.
pub(super) const WAL_DIR_NAME: &str = "wal";
/// Written when recovery found the WAL damaged: why the replica is not read (it is kept until
/// the replica is rebuilt; see [`super::ShardStore::unreadable`]).
pub(super) const DAMAGED_NAME: &str = "DAMAGED";
/// What a file is called while it is being written, before its rename.
const TEMP_SUFFIX: &str = ".tmp";
const PART_PREFIX: &str = "part-";
const PART_SUFFIX: &str = ".arrow";
const PART_NUMBER_DIGITS: usize = 20;

/// The file name of part number `n`.
pub(super) fn part_name(n: u64) -> String {
    format!("{PART_PREFIX}{n:0width$}{PART_SUFFIX}", width = PART_NUMBER_DIGITS)
}

/// The number of a part file name, or `None` if the name is not a part's.
pub(super) fn parse_part_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(PART_PREFIX)?.strip_suffix(PART_SUFFIX)?;
    if digits.len() != PART_NUMBER_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// True for the temporary name of a part or of the manifest: left behind only by a crash or a
/// failed write, and never referenced by a manifest.
pub(super) fn is_temp_name(name: &str) -> bool {
    name.strip_suffix(TEMP_SUFFIX).is_some_and(|base| base == MANIFEST_NAME || parse_part_name(base).is_some())
}

/// Writes `bytes` as `dir/name` atomically and durably: to `name.tmp`, fsync, rename over
/// `name`, fsync the directory (reference notes §5.1, PostgreSQL's `durable_rename`). After a
/// crash, `dir/name` is either its old content or all of `bytes`.
pub(super) fn write_durably(fs: &dyn Fs, dir: &Path, name: &str, bytes: &[u8]) -> Result<(), StorageError> {
    write_durably_with(fs, dir, name, |file, temp| file.write_all(bytes).map_err(StorageError::io("write", temp)))
}

/// [`write_durably`] of what `write` appends to the temp file (given with its path); returns what
/// `write` returned. If `write` fails, nothing is renamed.
pub(super) fn write_durably_with<T>(
    fs: &dyn Fs,
    dir: &Path,
    name: &str,
    write: impl FnOnce(&mut dyn AppendFile, &Path) -> Result<T, StorageError>,
) -> Result<T, StorageError> {
    let temp = dir.join(format!("{name}{TEMP_SUFFIX}"));
    // A temp file left by an earlier failed attempt in this process (recovery removes the others).
    match fs.remove_file(&temp) {
        Err(error) if error.kind() != ErrorKind::NotFound => return Err(StorageError::io("remove", &temp)(error)),
        _ => {}
    }
    let mut file = fs.create_append(&temp).map_err(StorageError::io("create", &temp))?;
    let written = write(file.as_mut(), &temp).and_then(|written| {
        file.sync_data().map_err(StorageError::io("fsync", &temp))?;
        Ok(written)
    });
    drop(file);
    // A temp file that failed (a full disk) goes at once: left until the next open, it held
    // the space the node's other stores needed.
    let written = written.inspect_err(|_| {
        let _ = fs.remove_file(&temp);
    })?;
    let path = dir.join(name);
    fs.rename(&temp, &path).map_err(StorageError::io("rename", &temp))?;
    fs.sync_dir(dir).map_err(StorageError::io("fsync dir", dir))?;
    Ok(written)
}

/// Removes `names` from `dir`, then fsyncs `dir` once so the removals are durable.
pub(super) fn remove_durably(fs: &dyn Fs, dir: &Path, names: &[String]) -> Result<(), StorageError> {
    if names.is_empty() {
        return Ok(());
    }
    for name in names {
        let path = dir.join(name);
        fs.remove_file(&path).map_err(StorageError::io("remove", &path))?;
    }
    fs.sync_dir(dir).map_err(StorageError::io("fsync dir", dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_names_round_trip_and_temp_names_are_recognised() {
        assert_eq!(part_name(7), "part-00000000000000000007.arrow");
        assert_eq!(parse_part_name(&part_name(u64::MAX)), Some(u64::MAX));
        for bad in ["part-7.arrow", "part-0000000000000000000x.arrow", "part-00000000000000000007.arrow.tmp"] {
            assert_eq!(parse_part_name(bad), None, "{bad}");
        }
        assert!(is_temp_name("MANIFEST.tmp") && is_temp_name("part-00000000000000000007.arrow.tmp"));
        assert!(!is_temp_name("MANIFEST") && !is_temp_name("notes.tmp") && !is_temp_name("wal"));
    }

    #[test]
    fn a_failed_write_leaves_no_temp_file() {
        let sim = crate::fs::SimFs::new();
        let dir = Path::new("/d");
        let listed = |sim: &crate::fs::SimFs| sim.list_dir(dir).unwrap_or_default();
        sim.create_dir_all(dir).expect("the directory");
        sim.fail_next_fsync();
        assert!(write_durably(&sim, dir, "MANIFEST", b"{}").is_err());
        assert!(listed(&sim).is_empty(), "{:?}", listed(&sim));
        let failed = write_durably_with(&sim, dir, "part", |file, temp| {
            file.write_all(b"half").map_err(StorageError::io("write", temp))?;
            Err::<(), _>(StorageError::io("write", temp)(std::io::Error::other("No space left on device")))
        });
        assert!(failed.is_err());
        assert!(listed(&sim).is_empty(), "{:?}", listed(&sim));
        write_durably(&sim, dir, "MANIFEST", b"{}").expect("then it works");
        assert_eq!(listed(&sim), vec!["MANIFEST".to_string()]);
    }
}
