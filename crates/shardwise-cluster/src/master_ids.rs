//! Which masters a worker has served under, so that a replaced master's data dir, started
//! again, is refused by the workers.
//!
//! Why: the master refuses a replaced *worker's* data dir (it records the replacement in its
//! membership), but nothing would refuse the lost *master's* data dir turning up after a new
//! master took rank 0 (`--replace-node` on rank 0): it would resume its old membership, take the
//! workers' newer catalog, and serve its stale replicas. Only the workers can tell: each keeps
//! the node id of the master that welcomed it and the ids of the masters it saw replaced
//! (`<data dir>/masters.json`), and refuses a master that is one of those. The refusal is retried
//! like any other, so the worker rejoins once the right master is back.
//!
//! A master's node id changes only when rank 0 is taken by a new data dir, which only a
//! replacement does: the first welcome from another id records the old one as replaced.
//!
//! The same file keeps which node held each rank when the worker last saw the membership: a
//! replacement master, which lost the membership with its data dir, checks against it that a
//! node taking a rank with `--replace-node` names the node that held it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::datadir::{read_json, write_atomic};
use crate::error::{ClusterError, Result};

/// The file, in the worker's data dir.
pub const MASTERS_FILE: &str = "masters.json";

/// Held while the file is read, changed and written: the link records from background threads,
/// and two writes in flight at once would each keep only their own change.
static WRITING: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[derive(Debug, Default, Serialize, Deserialize)]
struct Masters {
    /// The master that welcomed this node last.
    current: Option<String>,
    /// Masters replaced since (a new master took rank 0 while they were away).
    replaced: BTreeSet<String>,
    /// The node that held each rank, as this worker last saw the membership.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    ranks: BTreeMap<u32, String>,
}

/// The master the worker whose data dir is `dir` last served under, if it has recorded one.
pub fn current(dir: &Path) -> Option<String> {
    read_json::<Masters>(dir, MASTERS_FILE).ok().flatten().and_then(|m| m.current)
}

/// The node that held each rank when the worker whose data dir is `dir` last saw the
/// membership, if it has recorded it.
pub fn last_ranks(dir: &Path) -> Option<BTreeMap<u32, String>> {
    let ranks = read_json::<Masters>(dir, MASTERS_FILE).ok().flatten()?.ranks;
    (!ranks.is_empty()).then_some(ranks)
}

/// Records `ranks` (rank to node id) as the membership the worker whose data dir is `dir` saw
/// last. Blocking; a failure is logged (a guard against an operator's mistake, as above).
pub fn record_ranks(dir: &Path, ranks: BTreeMap<u32, String>) {
    let _one_at_a_time = WRITING.lock().unwrap_or_else(|p| p.into_inner());
    let mut masters = read(dir);
    if masters.ranks == ranks {
        return;
    }
    masters.ranks = ranks;
    write(dir, &masters, "the membership this node saw");
}

/// Checks the master `master_id`, which has just welcomed the worker whose data dir is `dir`:
/// refused if it was replaced. Blocking (a small file, on a rejoin). A file that cannot be read
/// is logged and does not keep the node from its master: the check is a guard against an
/// operator's mistake, not what the node's data depends on.
pub fn check_master(dir: &Path, master_id: &str, peer: &str) -> Result<()> {
    let masters = read(dir);
    if masters.replaced.contains(master_id) {
        let current = masters.current.as_deref().unwrap_or("another node");
        return Err(ClusterError::StaleMaster {
            reason: format!(
                "the master at {peer} is node {master_id}, which node {current} replaced (--replace-node on \
                 rank 0): what its data dir holds is stale; stop it, and start the master that replaced it"
            ),
        });
    }
    Ok(())
}

/// Records `master_id` as the master the worker whose data dir is `dir` serves under, the one
/// before it (if another) as replaced. Only once that master serves: a replacement master that
/// gives up before it has taken the catalog from the ranks records nothing, and nor do the
/// workers, so that the next attempt, on any empty data dir, is not taken for a replaced one's.
/// Blocking; a failure is logged.
pub fn record_master(dir: &Path, master_id: &str) {
    let _one_at_a_time = WRITING.lock().unwrap_or_else(|p| p.into_inner());
    let mut masters = read(dir);
    if masters.current.as_deref() == Some(master_id) {
        return;
    }
    if let Some(previous) = masters.current.replace(master_id.to_string()) {
        masters.replaced.insert(previous);
    }
    write(dir, &masters, "the master this node serves under");
}

/// [`check_master`], then [`record_master`].
pub fn admit_master(dir: &Path, master_id: &str, peer: &str) -> Result<()> {
    check_master(dir, master_id, peer)?;
    record_master(dir, master_id);
    Ok(())
}

fn read(dir: &Path) -> Masters {
    read_json(dir, MASTERS_FILE)
        .unwrap_or_else(|e| {
            warn!("{e}; the masters this node served under are forgotten");
            None
        })
        .unwrap_or_default()
}

fn write(dir: &Path, masters: &Masters, what: &str) {
    let written = serde_json::to_vec_pretty(masters)
        .map_err(|e| ClusterError::DataDir { path: dir.join(MASTERS_FILE), reason: e.to_string() })
        .and_then(|bytes| write_atomic(dir, MASTERS_FILE, &bytes));
    if let Err(e) = written {
        warn!("cannot record {what}: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replaced_master_is_refused_and_the_one_that_replaced_it_is_not() {
        let tmp = tempfile::tempdir().unwrap();
        admit_master(tmp.path(), "a", "m").unwrap();
        admit_master(tmp.path(), "a", "m").unwrap();
        admit_master(tmp.path(), "b", "m").unwrap();
        let err = admit_master(tmp.path(), "a", "127.0.0.1:1").unwrap_err().to_string();
        assert!(err.contains("node a, which node b replaced") && err.contains("stale"), "{err}");
        admit_master(tmp.path(), "b", "m").unwrap();
        // Replaced again: both earlier ones are refused.
        admit_master(tmp.path(), "c", "m").unwrap();
        assert!(admit_master(tmp.path(), "b", "m").is_err() && admit_master(tmp.path(), "a", "m").is_err());
        // The membership is kept beside them, and survives a new master.
        assert_eq!(last_ranks(tmp.path()), None);
        let ranks = BTreeMap::from([(0, "c".to_string()), (1, "w1".to_string())]);
        record_ranks(tmp.path(), ranks.clone());
        admit_master(tmp.path(), "d", "m").unwrap();
        assert_eq!(last_ranks(tmp.path()), Some(ranks));
        assert!(admit_master(tmp.path(), "c", "m").is_err());
    }
}
