//! `SimFs`: an in-memory filesystem that remembers what fsync made durable, so a test can cut the
//! power at any instant and see exactly what Linux promises to keep (reference notes §2.7, §5.1).
//!
//! Model:
//! - each file (an inode) has *volatile* content (what reads see) and *durable* content (as of
//!   its last `sync_data`);
//! - each directory has a volatile entry set and a durable one (as of its last `sync_dir`): a
//!   created, renamed or removed entry is durable only once its directory is synced;
//! - [`SimFs::power_loss`] drops every unsynced write and every unsynced entry change: files whose
//!   directory was never synced vanish, unsynced renames and removes revert;
//! - [`SimFs::power_loss_torn`] is the same, except each file keeps a random prefix of its
//!   unsynced appended tail, sometimes as zeros (size updated, data not) — a torn write;
//! - [`SimFs::fail_next_fsync`] (or [`SimFs::fail_fsync_after`]) makes the next (or a later)
//!   `sync_data` or `sync_dir` fail with an I/O error and make nothing durable.
//!
//! Directories themselves are created durable at once (the WAL does not test that step). Handles
//! opened before a power loss fail afterwards, like file descriptors of a rebooted machine.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, ErrorKind};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{AppendFile, Fs};
use crate::xorshift::XorShift64;

/// An in-memory filesystem with fsync-accurate power loss, for tests. Clones share one state.
#[derive(Debug, Clone, Default)]
pub struct SimFs {
    state: Arc<Mutex<SimState>>,
}

#[derive(Debug, Default)]
struct SimState {
    dirs: BTreeMap<PathBuf, SimDir>,
    inodes: BTreeMap<u64, SimInode>,
    next_inode: u64,
    /// Bumped by every power loss; handles from an older generation are dead.
    generation: u64,
    /// How many more fsyncs succeed before one fails; `None`: none fails.
    fsyncs_before_failure: Option<u64>,
    sync_data_count: u64,
}

#[derive(Debug, Default)]
struct SimDir {
    volatile: BTreeMap<String, u64>,
    durable: BTreeMap<String, u64>,
}

#[derive(Debug, Default)]
struct SimInode {
    volatile: Vec<u8>,
    durable: Vec<u8>,
}

struct SimFile {
    state: Arc<Mutex<SimState>>,
    inode: u64,
    generation: u64,
    pos_bytes: usize,
}

impl SimFs {
    /// An empty filesystem.
    pub fn new() -> Self {
        Self::default()
    }

    /// Cuts the power: every unsynced write and directory change is lost.
    pub fn power_loss(&self) {
        self.lose_power(None);
    }

    /// Cuts the power mid-write: like [`SimFs::power_loss`], but each file keeps a random prefix
    /// (chosen from `seed`) of its unsynced appended bytes, a quarter of the time as zeros.
    pub fn power_loss_torn(&self, seed: u64) {
        self.lose_power(Some(XorShift64::new(seed)));
    }

    /// Makes the next fsync (`sync_data` or `sync_dir`) fail with an I/O error.
    pub fn fail_next_fsync(&self) {
        self.fail_fsync_after(0);
    }

    /// Lets `successes` fsyncs succeed, then makes the next one fail with an I/O error.
    pub fn fail_fsync_after(&self, successes: u64) {
        self.lock().fsyncs_before_failure = Some(successes);
    }

    /// Disarms a pending injected fsync failure.
    pub fn heal_fsync(&self) {
        self.lock().fsyncs_before_failure = None;
    }

    /// How many `sync_data` calls have succeeded so far (to check group commit).
    pub fn sync_data_count(&self) -> u64 {
        self.lock().sync_data_count
    }

    /// Flips one bit of a file on "disk" (both its durable and volatile content): bit rot.
    pub fn flip_bit(&self, path: &Path, offset_bytes: usize, bit: u8) -> io::Result<()> {
        let mut state = self.lock();
        let id = state.lookup(path)?;
        let inode = state.inode_mut(id)?;
        for content in [&mut inode.volatile, &mut inode.durable] {
            if let Some(byte) = content.get_mut(offset_bytes) {
                *byte ^= 1 << (bit % 8);
            }
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, SimState> {
        // A test that panicked while holding the lock leaves a consistent state behind: every
        // mutation below completes before it could panic.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lose_power(&self, mut torn: Option<XorShift64>) {
        let mut state = self.lock();
        for dir in state.dirs.values_mut() {
            dir.volatile = dir.durable.clone();
        }
        let linked: BTreeSet<u64> = state.dirs.values().flat_map(|d| d.durable.values().copied()).collect();
        state.inodes.retain(|id, _| linked.contains(id));
        for inode in state.inodes.values_mut() {
            let kept = surviving_content(inode, torn.as_mut());
            inode.durable = kept.clone();
            inode.volatile = kept;
        }
        state.generation += 1;
        state.fsyncs_before_failure = None;
    }
}

/// What of a file survives a power loss: its durable content, plus (torn) a prefix of what was
/// written since, from the first byte that differs (an append, or an overwrite of preallocated
/// zeros), a quarter of the time as zeros (size updated, data not).
fn surviving_content(inode: &SimInode, torn: Option<&mut XorShift64>) -> Vec<u8> {
    let mut kept = inode.durable.clone();
    let Some(rng) = torn else { return kept };
    let volatile = &inode.volatile;
    let common = kept.iter().zip(volatile).take_while(|(a, b)| a == b).count();
    if volatile.len() < kept.len() || common == volatile.len() {
        return kept; // an unsynced truncation, or nothing new
    }
    let tail = &volatile[common..];
    let keep_bytes = rng.below(tail.len() + 1);
    let zeros = rng.below(4) == 0;
    let end = common + keep_bytes;
    if kept.len() < end {
        kept.resize(end, 0);
    }
    if !zeros {
        kept[common..end].copy_from_slice(&tail[..keep_bytes]);
    }
    kept
}

fn split(path: &Path) -> io::Result<(PathBuf, String)> {
    let parent = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let name = path.file_name().and_then(|n| n.to_str()).map(str::to_string);
    let name = name.ok_or_else(|| io::Error::new(ErrorKind::InvalidInput, "no file name"))?;
    Ok((parent, name))
}

fn not_found(what: &Path) -> io::Error {
    io::Error::new(ErrorKind::NotFound, format!("{}: not found (SimFs)", what.display()))
}

impl SimState {
    fn dir_mut(&mut self, dir: &Path) -> io::Result<&mut SimDir> {
        self.dirs.get_mut(dir).ok_or_else(|| not_found(dir))
    }

    fn inode_mut(&mut self, id: u64) -> io::Result<&mut SimInode> {
        self.inodes.get_mut(&id).ok_or_else(|| io::Error::other("SimFs: dangling inode"))
    }

    fn lookup(&self, path: &Path) -> io::Result<u64> {
        let (parent, name) = split(path)?;
        let dir = self.dirs.get(&parent).ok_or_else(|| not_found(&parent))?;
        dir.volatile.get(&name).copied().ok_or_else(|| not_found(path))
    }

    fn take_fsync_failure(&mut self) -> io::Result<()> {
        match self.fsyncs_before_failure {
            Some(0) => {
                self.fsyncs_before_failure = None;
                Err(io::Error::other("injected fsync failure (SimFs)"))
            }
            Some(n) => {
                self.fsyncs_before_failure = Some(n - 1);
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn check_generation(&self, generation: u64) -> io::Result<()> {
        if generation != self.generation {
            return Err(io::Error::other("SimFs: file handle from before a power loss"));
        }
        Ok(())
    }

    /// A handle writing at the end of the file.
    fn handle(&self, state: &Arc<Mutex<SimState>>, inode: u64) -> io::Result<Box<dyn AppendFile>> {
        let pos_bytes = self.inodes.get(&inode).map_or(0, |i| i.volatile.len());
        Ok(Box::new(SimFile { state: Arc::clone(state), inode, generation: self.generation, pos_bytes }))
    }
}

impl SimFile {
    fn with_inode<T>(&self, f: impl FnOnce(&mut SimState, u64) -> io::Result<T>) -> io::Result<T> {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        state.check_generation(self.generation)?;
        f(&mut state, self.inode)
    }
}

impl AppendFile for SimFile {
    fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        let pos = self.pos_bytes;
        self.with_inode(|state, id| {
            let content = &mut state.inode_mut(id)?.volatile;
            if content.len() < pos + data.len() {
                content.resize(pos + data.len(), 0);
            }
            content[pos..pos + data.len()].copy_from_slice(data);
            Ok(())
        })?;
        self.pos_bytes += data.len();
        Ok(())
    }

    fn preallocate(&mut self, len_bytes: u64) -> io::Result<()> {
        let len = usize::try_from(len_bytes).map_err(|_| io::Error::other("SimFs: preallocation too large"))?;
        self.with_inode(|state, id| {
            let content = &mut state.inode_mut(id)?.volatile;
            if content.len() < len {
                content.resize(len, 0);
            }
            Ok(())
        })
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.with_inode(|state, id| {
            state.take_fsync_failure()?;
            let inode = state.inode_mut(id)?;
            inode.durable = inode.volatile.clone();
            state.sync_data_count += 1;
            Ok(())
        })
    }
}

impl Fs for SimFs {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut state = self.lock();
        for ancestor in dir.ancestors() {
            state.dirs.entry(ancestor.to_path_buf()).or_default();
        }
        Ok(())
    }

    fn create_append(&self, path: &Path) -> io::Result<Box<dyn AppendFile>> {
        let (parent, name) = split(path)?;
        let mut state = self.lock();
        let id = state.next_inode;
        let dir = state.dir_mut(&parent)?;
        if dir.volatile.contains_key(&name) {
            return Err(io::Error::new(ErrorKind::AlreadyExists, path.display().to_string()));
        }
        dir.volatile.insert(name, id);
        state.inodes.insert(id, SimInode::default());
        state.next_inode += 1;
        state.handle(&self.state, id)
    }

    fn open_append(&self, path: &Path) -> io::Result<Box<dyn AppendFile>> {
        let state = self.lock();
        let id = state.lookup(path)?;
        state.handle(&self.state, id)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut state = self.lock();
        state.dir_mut(dir)?;
        state.take_fsync_failure()?;
        let entries = state.dir_mut(dir)?;
        entries.durable = entries.volatile.clone();
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let (from_dir, from_name) = split(from)?;
        let (to_dir, to_name) = split(to)?;
        let mut state = self.lock();
        state.dir_mut(&to_dir)?;
        let id = state.dir_mut(&from_dir)?.volatile.remove(&from_name).ok_or_else(|| not_found(from))?;
        state.dir_mut(&to_dir)?.volatile.insert(to_name, id);
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let (parent, name) = split(path)?;
        let mut state = self.lock();
        state.dir_mut(&parent)?.volatile.remove(&name).map(|_| ()).ok_or_else(|| not_found(path))
    }

    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        let state = self.lock();
        let entries = state.dirs.get(dir).ok_or_else(|| not_found(dir))?;
        Ok(entries.volatile.keys().cloned().collect())
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let mut state = self.lock();
        let id = state.lookup(path)?;
        Ok(state.inode_mut(id)?.volatile.clone())
    }

    fn truncate(&self, path: &Path, len_bytes: u64) -> io::Result<()> {
        let len = usize::try_from(len_bytes).map_err(io::Error::other)?;
        let mut state = self.lock();
        let id = state.lookup(path)?;
        state.inode_mut(id)?.volatile.resize(len, 0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIR: &str = "/sim/d";

    fn sim_with_dir() -> io::Result<SimFs> {
        let sim = SimFs::new();
        sim.create_dir_all(Path::new(DIR))?;
        Ok(sim)
    }

    fn write_synced(sim: &SimFs, name: &str, data: &[u8]) -> io::Result<()> {
        let mut file = sim.create_append(&Path::new(DIR).join(name))?;
        file.write_all(data)?;
        file.sync_data()
    }

    #[test]
    fn a_file_whose_dir_was_never_synced_vanishes() -> io::Result<()> {
        let sim = sim_with_dir()?;
        write_synced(&sim, "a", b"data")?;
        sim.power_loss();
        assert!(sim.list_dir(Path::new(DIR))?.is_empty());
        Ok(())
    }

    #[test]
    fn synced_data_in_a_synced_dir_survives_and_unsynced_bytes_do_not() -> io::Result<()> {
        let sim = sim_with_dir()?;
        let path = Path::new(DIR).join("a");
        write_synced(&sim, "a", b"durable")?;
        sim.sync_dir(Path::new(DIR))?;
        sim.open_append(&path)?.write_all(b" volatile")?;
        assert_eq!(sim.read(&path)?, b"durable volatile");
        sim.power_loss();
        assert_eq!(sim.read(&path)?, b"durable");
        Ok(())
    }

    #[test]
    fn unsynced_rename_and_remove_revert() -> io::Result<()> {
        let sim = sim_with_dir()?;
        let dir = Path::new(DIR);
        write_synced(&sim, "a", b"1")?;
        write_synced(&sim, "b", b"2")?;
        sim.sync_dir(dir)?;
        sim.rename(&dir.join("a"), &dir.join("c"))?;
        sim.remove_file(&dir.join("b"))?;
        assert_eq!(sim.list_dir(dir)?, vec!["c".to_string()]);
        sim.power_loss();
        assert_eq!(sim.list_dir(dir)?, vec!["a".to_string(), "b".to_string()]);
        assert_eq!(sim.read(&dir.join("a"))?, b"1");
        Ok(())
    }

    #[test]
    fn failed_fsync_makes_nothing_durable_and_fails_once() -> io::Result<()> {
        let sim = sim_with_dir()?;
        let dir = Path::new(DIR);
        write_synced(&sim, "a", b"x")?;
        sim.sync_dir(dir)?;
        let mut file = sim.open_append(&dir.join("a"))?;
        file.write_all(b"y")?;
        sim.fail_next_fsync();
        assert!(file.sync_data().is_err());
        sim.power_loss();
        assert_eq!(sim.read(&dir.join("a"))?, b"x");
        let mut file = sim.open_append(&dir.join("a"))?;
        file.write_all(b"z")?;
        file.sync_data()?;
        assert_eq!(sim.read(&dir.join("a"))?, b"xz");
        Ok(())
    }

    #[test]
    fn torn_power_loss_keeps_a_prefix_of_the_unsynced_tail() -> io::Result<()> {
        let path = Path::new(DIR).join("a");
        for seed in 0..50 {
            let sim = sim_with_dir()?;
            write_synced(&sim, "a", b"head")?;
            sim.sync_dir(Path::new(DIR))?;
            sim.open_append(&path)?.write_all(b"-tail-bytes")?;
            sim.power_loss_torn(seed);
            let content = sim.read(&path)?;
            assert!(content.starts_with(b"head") && content.len() <= 15, "seed {seed}");
            let rest = &content[4..];
            assert!(b"-tail-bytes".starts_with(rest) || rest.iter().all(|&b| b == 0));
        }
        Ok(())
    }

    #[test]
    fn handles_from_before_a_power_loss_are_dead() -> io::Result<()> {
        let sim = sim_with_dir()?;
        let mut file = sim.create_append(&Path::new(DIR).join("a"))?;
        sim.sync_dir(Path::new(DIR))?;
        sim.power_loss();
        assert!(file.write_all(b"late").is_err());
        Ok(())
    }
}
