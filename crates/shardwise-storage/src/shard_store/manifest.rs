//! The MANIFEST of a shard store: which parts hold its data, the dedup state as of the
//! checkpoint, and the checkpoint LSN. JSON, replaced atomically (temp file, fsync, rename, fsync
//! of the directory), so after a crash it is the old manifest or the new one, never a mix.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::files::{MANIFEST_NAME, parse_part_name, write_durably};
use crate::error::StorageError;
use crate::fs::Fs;

/// The manifest format this build writes and reads.
pub(super) const MANIFEST_FORMAT_VERSION: u32 = 1;

/// One immutable part file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PartEntry {
    pub name: String,
    pub rows: u64,
    pub len_bytes: u64,
    /// CRC32C of the whole file.
    pub crc32c: u32,
}

/// The manifest's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Manifest {
    pub format_version: u32,
    pub parts: Vec<PartEntry>,
    /// Per-origin high-water marks as of the checkpoint.
    pub hwm: BTreeMap<String, u64>,
    /// The insert-id window as of the checkpoint, oldest first.
    pub insert_ids: Vec<String>,
    /// True when every row in the parts was placed by shardwise's placement function.
    pub verified_placement: bool,
    /// Every WAL record with a lower LSN is reflected in the parts and the dedup state above.
    pub wal_checkpoint_lsn: u64,
}

impl Manifest {
    /// The manifest of a new, empty store.
    pub(super) fn empty() -> Self {
        Manifest {
            format_version: MANIFEST_FORMAT_VERSION,
            parts: Vec::new(),
            hwm: BTreeMap::new(),
            insert_ids: Vec::new(),
            verified_placement: true,
            wal_checkpoint_lsn: crate::wal::Lsn::FIRST.0,
        }
    }

    /// Reads `dir/MANIFEST`; `Ok(None)` if there is none.
    pub(super) fn read(fs: &dyn Fs, dir: &Path) -> Result<Option<Self>, StorageError> {
        let path = dir.join(MANIFEST_NAME);
        let names = fs.list_dir(dir).map_err(StorageError::io("list", dir))?;
        if !names.iter().any(|name| name == MANIFEST_NAME) {
            return Ok(None);
        }
        let bytes = fs.read(&path).map_err(StorageError::io("read", &path))?;
        let invalid = |problem: String| StorageError::ManifestInvalid { path: path.clone(), problem };
        // The version first, so a newer manifest is refused as such rather than as unknown fields.
        let value: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| invalid(format!("not valid JSON: {e}")))?;
        let version = value.get("format_version").and_then(serde_json::Value::as_u64);
        if version != Some(u64::from(MANIFEST_FORMAT_VERSION)) {
            return Err(invalid(format!(
                "format_version {version:?}; this build reads version {MANIFEST_FORMAT_VERSION}"
            )));
        }
        let manifest: Manifest = serde_json::from_value(value).map_err(|e| invalid(format!("{e}")))?;
        manifest.validate().map_err(invalid)?;
        Ok(Some(manifest))
    }

    /// Replaces `dir/MANIFEST` with this one, atomically and durably.
    pub(super) fn write(&self, fs: &dyn Fs, dir: &Path) -> Result<(), StorageError> {
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| StorageError::ManifestInvalid {
            path: dir.join(MANIFEST_NAME),
            problem: format!("cannot encode: {e}"),
        })?;
        write_durably(fs, dir, MANIFEST_NAME, &bytes)
    }

    /// The largest part number the manifest names.
    pub(super) fn max_part_number(&self) -> Option<u64> {
        self.parts.iter().filter_map(|p| parse_part_name(&p.name)).max()
    }

    fn validate(&self) -> Result<(), String> {
        let mut names = BTreeSet::new();
        for part in &self.parts {
            if parse_part_name(&part.name).is_none() {
                return Err(format!("{:?} is not a part file name", part.name));
            }
            if !names.insert(part.name.as_str()) {
                return Err(format!("part {} is listed twice", part.name));
            }
        }
        Ok(())
    }
}
