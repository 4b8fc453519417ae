//! The node's data dir: its lock, its on-disk format version, its identity and the cluster it
//! belongs to.
//!
//! A node is its data dir: the `node_id` kept here makes a restarted process the same node, and
//! the recorded run id and rank stop a data dir from being attached to another cluster or rank
//! by mistake. The lock (an advisory `flock` on `LOCK`, released by the kernel when the process
//! dies, even by SIGKILL) keeps two live processes from sharing one dir.
//!
//! Layout (format 1):
//! ```text
//! IDENTITY       "shardwise data dir format 1" and "node_id <UUID>", one per line
//! LOCK           locked while a node runs; holds its pid
//! cluster.json   {"run_id", "rank", "world_size"} once the cluster the node joined has formed
//! REPLACING      the node id of a lost data dir this (fresh) one takes the rank of
//!                (`--replace-node`), until the node's tables have taken note
//! master/        the master's membership.json and metadata.json (rank 0 only)
//! ```
//! Every file is written with [`write_atomic`]: temp file, fsync, rename, fsync of the directory.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::error::{ClusterError, Result};

/// The on-disk format this build reads and writes.
pub const DATA_DIR_FORMAT_VERSION: u32 = 1;
/// Format version and node id in one file: one durable write when a data dir is created.
const IDENTITY_FILE: &str = "IDENTITY";
const FORMAT_PREFIX: &str = "shardwise data dir format ";
const NODE_ID_PREFIX: &str = "node_id ";
const LOCK_FILE: &str = "LOCK";
const CLUSTER_FILE: &str = "cluster.json";
const REPLACING_FILE: &str = "REPLACING";

/// What a data dir records about the cluster it joined.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterRecord {
    pub run_id: String,
    pub rank: u32,
    pub world_size: u32,
}

/// An open, locked data dir. The lock is held until this value is dropped.
#[derive(Debug)]
pub struct DataDir {
    path: PathBuf,
    _lock: File,
    node_id: Uuid,
    cluster: Option<ClusterRecord>,
    /// The node id of the lost data dir whose rank this one takes ([`DataDir::mark_replacing`]).
    replacing: Option<String>,
}

impl DataDir {
    /// Creates (if needed), locks and reads the data dir at `path`.
    pub fn open(path: &Path) -> Result<DataDir> {
        let io = |op: &'static str| move |source| ClusterError::DataDirIo { path: path.to_path_buf(), op, source };
        // A file where the data dir (or a folder above it) should be: say so, not "File exists".
        if let Some(file) = path.ancestors().find(|p| p.is_file()) {
            return Err(ClusterError::DataDirIo {
                path: path.to_path_buf(),
                op: "create",
                source: std::io::Error::other(format!("{} is a file, not a directory", file.display())),
            });
        }
        create_dir_durably(path)?;
        let lock_path = path.join(LOCK_FILE);
        let mut lock =
            OpenOptions::new().create(true).truncate(false).write(true).open(&lock_path).map_err(io("open LOCK"))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(ClusterError::DataDirLocked { path: path.to_path_buf(), lock: lock_path });
            }
            Err(TryLockError::Error(source)) => {
                return Err(ClusterError::DataDirIo { path: path.to_path_buf(), op: "lock", source });
            }
        }
        lock.set_len(0).map_err(io("write LOCK"))?;
        writeln!(lock, "{}", std::process::id()).map_err(io("write LOCK"))?;

        let node_id = read_or_create_identity(path)?;
        remove_stale_temp_files(path)?;
        let cluster = read_json::<ClusterRecord>(path, CLUSTER_FILE)?;
        let replacing = match fs::read_to_string(path.join(REPLACING_FILE)) {
            Ok(text) => Some(text.trim().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => {
                return Err(ClusterError::DataDirIo { path: path.to_path_buf(), op: "read REPLACING", source });
            }
        };
        Ok(DataDir { path: path.to_path_buf(), _lock: lock, node_id, cluster, replacing })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn node_id(&self) -> Uuid {
        self.node_id
    }

    /// The cluster this dir joined before, if any.
    pub fn cluster(&self) -> Option<&ClusterRecord> {
        self.cluster.as_ref()
    }

    /// Checks that this dir may serve as `rank` of a `world_size` cluster.
    pub fn check_rank(&self, rank: u32, world_size: u32) -> Result<()> {
        if let Some(rec) = &self.cluster {
            if rec.rank != rank {
                return Err(self.err(format!(
                    "it belongs to rank {} of run {}, but this node was started as rank {rank}; \
                     give each rank its own data dir",
                    rec.rank, rec.run_id
                )));
            }
            if rec.world_size != world_size {
                return Err(self.err(format!(
                    "it belongs to a cluster of world size {} (run {}), but this node was started \
                     with world size {world_size}",
                    rec.world_size, rec.run_id
                )));
            }
        }
        Ok(())
    }

    /// The node id of the lost data dir this one replaces, until [`DataDir::finish_replacing`].
    pub fn replacing(&self) -> Option<&str> {
        self.replacing.as_deref()
    }

    /// Records (durably, before the node asks the master for the rank) that this dir takes the
    /// rank of node `old`, whose data dir was lost.
    pub fn mark_replacing(&mut self, old: &str) -> Result<()> {
        write_atomic(&self.path, REPLACING_FILE, format!("{old}\n").as_bytes())?;
        self.replacing = Some(old.to_string());
        Ok(())
    }

    /// Records (durably) that this dir has joined `record`'s cluster.
    pub fn record_cluster(&mut self, record: ClusterRecord) -> Result<()> {
        if self.cluster.as_ref() == Some(&record) {
            return Ok(());
        }
        let bytes =
            serde_json::to_vec_pretty(&record).map_err(|e| self.err(format!("cannot encode {CLUSTER_FILE}: {e}")))?;
        write_atomic(&self.path, CLUSTER_FILE, &bytes)?;
        self.cluster = Some(record);
        Ok(())
    }

    fn err(&self, reason: String) -> ClusterError {
        ClusterError::DataDir { path: self.path.clone(), reason }
    }
}

/// Reads the format version and node id, or, in a new directory, creates them.
fn read_or_create_identity(dir: &Path) -> Result<Uuid> {
    let bad = |reason: String| ClusterError::DataDir { path: dir.to_path_buf(), reason };
    match fs::read_to_string(dir.join(IDENTITY_FILE)) {
        Ok(text) => {
            let mut lines = text.lines();
            let first = lines.next().unwrap_or("").trim();
            let version = first
                .strip_prefix(FORMAT_PREFIX)
                .and_then(|v| v.parse::<u32>().ok())
                .ok_or_else(|| bad(format!("{IDENTITY_FILE} starts with {first:?}, expected \"{FORMAT_PREFIX}N\"")))?;
            if version != DATA_DIR_FORMAT_VERSION {
                return Err(bad(format!(
                    "on-disk format version {version}; this build reads version {DATA_DIR_FORMAT_VERSION}"
                )));
            }
            let second = lines.next().unwrap_or("").trim();
            let id = second.strip_prefix(NODE_ID_PREFIX).ok_or_else(|| {
                bad(format!("{IDENTITY_FILE} line 2 is {second:?}, expected \"{NODE_ID_PREFIX}<UUID>\""))
            })?;
            Uuid::parse_str(id).map_err(|e| bad(format!("{IDENTITY_FILE} holds node_id {id:?}, not a UUID: {e}")))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let stray = fs::read_dir(dir)
                .map_err(|source| ClusterError::DataDirIo { path: dir.to_path_buf(), op: "list", source })?
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .find(|name| name != LOCK_FILE && !name.starts_with('.'));
            if let Some(name) = stray {
                return Err(bad(format!(
                    "not a shardwise data dir (no {IDENTITY_FILE} file, but it holds {name:?}); \
                     give an empty or new directory"
                )));
            }
            let id = Uuid::new_v4();
            let text = format!("{FORMAT_PREFIX}{DATA_DIR_FORMAT_VERSION}\n{NODE_ID_PREFIX}{id}\n");
            write_atomic(dir, IDENTITY_FILE, text.as_bytes())?;
            Ok(id)
        }
        Err(source) => Err(ClusterError::DataDirIo { path: dir.to_path_buf(), op: "read IDENTITY", source }),
    }
}

/// Whether the data dir at `dir` still records a replacement ([`finish_replacing`] not done).
pub fn still_replacing(dir: &Path) -> bool {
    dir.join(REPLACING_FILE).exists()
}

/// Forgets the replacement a data dir at `dir` records ([`DataDir::mark_replacing`]) once the
/// node's tables have recorded what it means for them (which replicas await their rebuild); the
/// removal is made durable.
pub fn finish_replacing(dir: &Path) -> Result<()> {
    match fs::remove_file(dir.join(REPLACING_FILE)) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(ClusterError::DataDirIo { path: dir.to_path_buf(), op: "remove REPLACING", source }),
    }
    File::open(dir).and_then(|d| d.sync_all()).map_err(|source| ClusterError::DataDirIo {
        path: dir.to_path_buf(),
        op: "fsync",
        source,
    })
}

/// Reads `dir/name` as JSON; `None` when the file does not exist.
pub fn read_json<T: for<'de> Deserialize<'de>>(dir: &Path, name: &str) -> Result<Option<T>> {
    match fs::read(dir.join(name)) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| ClusterError::DataDir {
            path: dir.to_path_buf(),
            reason: format!("{name} is not valid: {e}"),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ClusterError::DataDirIo { path: dir.to_path_buf(), op: "read", source }),
    }
}

/// Replaces `dir/name` with `bytes` atomically and durably: write a temp file, fsync it, rename
/// it over the target, fsync the directory. A crash leaves either the old or the new content.
///
/// Each call writes its own temp file (`.<name>.<pid>.<n>.tmp`), so concurrent writers of one
/// file cannot rename or truncate each other's temp file; the last rename wins. Callers that
/// need the newest content to win serialize their writes themselves.
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    static NEXT_TEMP: AtomicU64 = AtomicU64::new(0);
    let io = |op: &'static str| move |source| ClusterError::DataDirIo { path: dir.join(name), op, source };
    let n = NEXT_TEMP.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.{}.{n}.tmp", std::process::id()));
    let written = (|| {
        let mut f = File::create(&tmp).map_err(io("create temp file"))?;
        f.write_all(bytes).map_err(io("write"))?;
        f.sync_all().map_err(io("fsync"))?;
        drop(f);
        fs::rename(&tmp, dir.join(name)).map_err(io("rename"))
    })();
    if written.is_err() {
        // Best effort: the error being returned matters more than a stray temp file.
        let _ = fs::remove_file(&tmp);
    }
    written?;
    sync_dir(dir)
}

/// Removes the temp files [`write_atomic`] left in `dir` when a process died part-way through a
/// write (`.<name>.<pid>.<n>.tmp` of another process, or the single `.<name>.tmp` of older
/// builds); this process's own, perhaps being written now, are kept. The names removed.
pub fn remove_stale_temp_files(dir: &Path) -> Result<Vec<String>> {
    let io = |op: &'static str| move |source| ClusterError::DataDirIo { path: dir.to_path_buf(), op, source };
    let pid = std::process::id().to_string();
    let mut removed = Vec::new();
    for entry in fs::read_dir(dir).map_err(io("list"))? {
        let name = entry.map_err(io("list"))?.file_name().to_string_lossy().into_owned();
        let Some(inner) = name.strip_prefix('.').and_then(|n| n.strip_suffix(".tmp")) else { continue };
        let mut parts = inner.rsplitn(3, '.');
        let (_n, writer, target) = (parts.next(), parts.next(), parts.next());
        if target.is_some() && writer == Some(pid.as_str()) {
            continue;
        }
        fs::remove_file(dir.join(&name)).map_err(io("remove stale temp file"))?;
        removed.push(name);
    }
    Ok(removed)
}

/// Creates `dir` (and missing parents) and fsyncs each new directory's parent, so the new entries
/// survive power loss. An existing directory costs nothing.
pub fn create_dir_durably(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_dir_durably(parent)?;
    }
    match fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => return Ok(()),
        Err(source) => return Err(ClusterError::DataDirIo { path: dir.to_path_buf(), op: "create", source }),
    }
    match dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(parent) => sync_dir(parent),
        None => sync_dir(Path::new(".")),
    }
}

/// fsyncs a directory so that a create or rename in it survives power loss.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|source| ClusterError::DataDirIo {
        path: dir.to_path_buf(),
        op: "fsync directory",
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_id_survives_reopen() {
        let tmp = tempfile::tempdir().unwrap();
        let id = DataDir::open(tmp.path()).unwrap().node_id();
        assert_eq!(DataDir::open(tmp.path()).unwrap().node_id(), id);
    }

    #[test]
    fn nested_new_data_dirs_are_created() {
        let tmp = tempfile::tempdir().unwrap();
        let deep = tmp.path().join("a/b/rank-3");
        create_dir_durably(&deep).unwrap();
        assert!(deep.is_dir());
        create_dir_durably(&deep).unwrap(); // existing: nothing to do
        DataDir::open(&tmp.path().join("c/rank-0")).unwrap();
        // A file in the way is named as one.
        std::fs::write(tmp.path().join("f"), "x").unwrap();
        for path in ["f", "f/rank-0"] {
            let err = DataDir::open(&tmp.path().join(path)).unwrap_err().to_string();
            assert!(err.contains("f is a file, not a directory"), "{err}");
        }
    }

    #[test]
    fn second_open_is_refused_while_locked() {
        let tmp = tempfile::tempdir().unwrap();
        let _held = DataDir::open(tmp.path()).unwrap();
        let err = DataDir::open(tmp.path()).unwrap_err();
        assert!(matches!(err, ClusterError::DataDirLocked { .. }), "{err}");
        assert!(err.to_string().contains("locked by another running node"));
    }

    #[test]
    fn foreign_directory_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("thesis.tex"), "x").unwrap();
        let err = DataDir::open(tmp.path()).unwrap_err().to_string();
        assert!(err.contains("not a shardwise data dir"), "{err}");
    }

    #[test]
    fn newer_format_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join(IDENTITY_FILE), "shardwise data dir format 9\nnode_id x\n").unwrap();
        let err = DataDir::open(tmp.path()).unwrap_err().to_string();
        assert!(err.contains("format version 9"), "{err}");
    }

    #[test]
    fn rank_and_world_size_are_bound_to_the_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let mut dir = DataDir::open(tmp.path()).unwrap();
        dir.record_cluster(ClusterRecord { run_id: "r1".into(), rank: 2, world_size: 4 }).unwrap();
        drop(dir);
        let dir = DataDir::open(tmp.path()).unwrap();
        assert_eq!(dir.cluster().unwrap().run_id, "r1");
        dir.check_rank(2, 4).unwrap();
        assert!(dir.check_rank(1, 4).unwrap_err().to_string().contains("belongs to rank 2"));
        assert!(dir.check_rank(2, 3).unwrap_err().to_string().contains("world size 4"));
    }

    #[test]
    fn concurrent_atomic_writes_of_one_file_all_succeed() {
        // Two ranks rejoining a restarted master at once both rewrite membership.json; with one
        // shared temp name, one writer's rename found the other's temp file already gone.
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let writers = 8;
        let rounds = 50;
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..writers)
                .map(|w| {
                    s.spawn(move || {
                        for r in 0..rounds {
                            let body = serde_json::to_vec(&serde_json::json!({"writer": w, "round": r})).unwrap();
                            write_atomic(dir, "membership.json", &body).unwrap();
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
        });
        let last: serde_json::Value = read_json(dir, "membership.json").unwrap().unwrap();
        assert!(last["writer"].as_u64().unwrap() < writers, "{last}");
        let names: Vec<String> =
            fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        assert_eq!(names, ["membership.json"], "temp files left behind");
    }

    #[test]
    fn temp_files_of_dead_writers_are_removed_on_open() {
        let tmp = tempfile::tempdir().unwrap();
        drop(DataDir::open(tmp.path()).unwrap());
        let own = format!(".cluster.json.{}.7.tmp", std::process::id());
        let stale = [".cluster.json.tmp", ".cluster.json.4000000000.3.tmp"];
        for name in stale.iter().chain([&own.as_str()]) {
            fs::write(tmp.path().join(name), "partial").unwrap();
        }
        drop(DataDir::open(tmp.path()).unwrap());
        assert!(stale.iter().all(|name| !tmp.path().join(name).exists()));
        assert!(tmp.path().join(&own).exists(), "this process's own temp file may be being written");
        assert!(tmp.path().join(IDENTITY_FILE).exists());
    }

    #[test]
    fn corrupt_node_id_is_reported() {
        let tmp = tempfile::tempdir().unwrap();
        drop(DataDir::open(tmp.path()).unwrap());
        fs::write(tmp.path().join(IDENTITY_FILE), "shardwise data dir format 1\nnode_id garbage\n").unwrap();
        let err = DataDir::open(tmp.path()).unwrap_err().to_string();
        assert!(err.contains("not a UUID"), "{err}");
    }
}
