//! A small replicated state machine: state the whole cluster agrees on (the table catalog will
//! live here), kept durably by the master and pushed to every node.
//!
//! The cluster crate knows nothing of what the state means: it is a [`serde_json::Value`], and
//! what an operation does is decided by a [`MetadataMachine`] the caller supplies (only the
//! master's is used). Every change goes through the master, which applies proposals one at a
//! time:
//!
//! 1. the machine validates the operation against the current state and returns the new state
//!    (or a message for the user, and nothing changes);
//! 2. the new [`MetadataSnapshot`] (version + 1) must fit in one control frame;
//! 3. it is written to `<data dir>/master/metadata.json` with [`write_atomic`] (fsynced) before
//!    anyone is told;
//! 4. it is sent to every connected node, then the proposer gets its answer.
//!
//! A node that joins or rejoins gets the current snapshot right after the master's welcome,
//! before `init_distributed_mode` returns. A node keeps only the newest version it has seen.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::watch;

use crate::datadir::{create_dir_durably, read_json, write_atomic};
use crate::error::{ClusterError, Result};
use crate::wire::{MAX_PAYLOAD_BYTES, MasterMsg, encode};

/// The master's copy of the replicated metadata, in its data dir's `master/` directory.
pub const METADATA_FILE: &str = "metadata.json";
/// Deepest nesting of arrays and objects accepted in a state or an operation. The JSON decoder
/// of the control protocol refuses deeper documents (at 128 levels), so a deeper state could be
/// stored but never delivered.
pub const MAX_VALUE_DEPTH: usize = 100;

/// Decides what an operation does to the replicated state.
///
/// Implemented by the layer that owns the state's meaning (the table catalog); the master calls
/// it once per proposal, one proposal at a time, off the async runtime.
pub trait MetadataMachine: Send + Sync + std::fmt::Debug + 'static {
    /// Validates `op` against `state` and returns the new state, or a message for the user
    /// (nothing changes).
    fn apply(&self, state: &Value, op: &Value) -> std::result::Result<Value, String>;
}

/// One version of the replicated state. Version 0 with state `null` is the empty metadata of a
/// new cluster; each applied operation adds one to the version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetadataSnapshot {
    pub version: u64,
    pub state: Value,
}

impl Default for MetadataSnapshot {
    fn default() -> Self {
        MetadataSnapshot { version: 0, state: Value::Null }
    }
}

/// The master's answer to a node's proposal (the new snapshot itself arrives just before it, in
/// a `Metadata` message).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ProposeOutcome {
    /// The operation produced this version.
    Applied { version: u64 },
    /// The operation was refused; nothing changed.
    Rejected { reason: String },
    /// The master takes no change for now; nothing changed; a retry may succeed.
    NotNow { reason: String },
    /// The master could not complete the change (for example, it could not write it to disk);
    /// the change may or may not take effect.
    Failed { reason: String },
}

impl ProposeOutcome {
    /// The outcome for a failed proposal, as sent to the node that made it.
    pub(crate) fn from_error(e: &ClusterError) -> ProposeOutcome {
        match e {
            ClusterError::MetadataRejected { reason } => ProposeOutcome::Rejected { reason: reason.clone() },
            ClusterError::MetadataNotNow { reason } => ProposeOutcome::NotNow { reason: reason.clone() },
            ClusterError::MetadataStore { detail } => ProposeOutcome::Failed { reason: detail.clone() },
            other => ProposeOutcome::Failed { reason: other.to_string() },
        }
    }
}

/// A new version, checked and encoded, ready to be stored and sent.
#[derive(Debug)]
pub(crate) struct Staged {
    pub snapshot: MetadataSnapshot,
    /// `MasterMsg::Metadata` carrying `snapshot`, encoded once for every node.
    pub frame: Vec<u8>,
}

fn rejected(reason: impl Into<String>) -> ClusterError {
    ClusterError::MetadataRejected { reason: reason.into() }
}

/// Checks what every operation must satisfy, whatever the machine: it can be carried.
pub(crate) fn check_op(op: &Value) -> Result<()> {
    if exceeds_depth(op, MAX_VALUE_DEPTH) {
        return Err(rejected(format!("the operation nests arrays and objects deeper than {MAX_VALUE_DEPTH} levels")));
    }
    Ok(())
}

/// Applies `op` to `current` with `machine` and encodes the result; the result must fit in one
/// control frame. Runs the caller's code, so it is meant for a blocking thread.
pub(crate) fn stage(machine: Option<&dyn MetadataMachine>, current: &MetadataSnapshot, op: &Value) -> Result<Staged> {
    let Some(machine) = machine else {
        return Err(rejected(
            "this cluster's master has no metadata machine, so it accepts no metadata changes \
             (start rank 0 with one)",
        ));
    };
    check_op(op)?;
    let applied = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| machine.apply(&current.state, op)));
    let state = match applied {
        Ok(Ok(state)) => state,
        Ok(Err(reason)) => return Err(rejected(reason)),
        Err(_) => return Err(rejected("the metadata machine panicked while applying the operation (a bug)")),
    };
    if exceeds_depth(&state, MAX_VALUE_DEPTH) {
        return Err(rejected(format!(
            "the resulting metadata would nest arrays and objects deeper than {MAX_VALUE_DEPTH} levels"
        )));
    }
    let version = current.version.checked_add(1).ok_or_else(|| rejected("the metadata version is exhausted"))?;
    let snapshot = MetadataSnapshot { version, state };
    let frame = encode_frame(&snapshot).map_err(rejected)?;
    Ok(Staged { snapshot, frame })
}

/// Encodes the `Metadata` message for `snapshot`, or says why it cannot be sent.
pub(crate) fn encode_frame(snapshot: &MetadataSnapshot) -> std::result::Result<Vec<u8>, String> {
    let frame = encode(&MasterMsg::Metadata { snapshot: snapshot.clone() })?;
    if frame.len() > MAX_PAYLOAD_BYTES {
        return Err(format!(
            "the resulting metadata would be {} bytes when sent, more than the control frame limit of \
             {MAX_PAYLOAD_BYTES} bytes",
            frame.len()
        ));
    }
    Ok(frame)
}

/// Writes `snapshot` to `dir/metadata.json` durably (creating `dir` if needed). Blocking.
pub(crate) fn persist(dir: &Path, snapshot: &MetadataSnapshot) -> Result<()> {
    let bytes = serde_json::to_vec(snapshot)
        .map_err(|e| ClusterError::MetadataStore { detail: format!("cannot encode {METADATA_FILE}: {e}") })?;
    create_dir_durably(dir)?;
    write_atomic(dir, METADATA_FILE, &bytes)
}

/// The snapshot stored in `dir`, or the empty one when there is none yet.
pub(crate) fn load(dir: &Path) -> Result<MetadataSnapshot> {
    Ok(read_json::<MetadataSnapshot>(dir, METADATA_FILE)?.unwrap_or_default())
}

/// Replaces the watched snapshot with `snapshot` if it is newer; returns whether it was.
pub(crate) fn advance(watch: &watch::Sender<MetadataSnapshot>, snapshot: MetadataSnapshot) -> bool {
    watch.send_if_modified(|current| {
        if snapshot.version > current.version {
            *current = snapshot;
            true
        } else {
            false
        }
    })
}

/// Whether `value` nests arrays and objects more than `max` levels deep (iterative: a deep value
/// must not overflow the stack while being checked).
fn exceeds_depth(value: &Value, max: usize) -> bool {
    let mut stack = vec![(value, 0usize)];
    while let Some((v, depth)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match v {
            Value::Array(a) => Box::new(a.iter()),
            Value::Object(o) => Box::new(o.values()),
            _ => continue,
        };
        if depth + 1 > max {
            return true;
        }
        stack.extend(children.map(|c| (c, depth + 1)));
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Adds a name to a list; refuses duplicates and the name "boom" (which panics).
    #[derive(Debug)]
    struct Names;

    impl MetadataMachine for Names {
        fn apply(&self, state: &Value, op: &Value) -> std::result::Result<Value, String> {
            let name = op["add"].as_str().ok_or("expected {\"add\": NAME}")?;
            assert_ne!(name, "boom", "test machine asked to panic");
            let mut names = state.as_array().cloned().unwrap_or_default();
            if names.iter().any(|n| n == name) {
                return Err(format!("{name} already exists"));
            }
            names.push(json!(name));
            Ok(Value::Array(names))
        }
    }

    fn nested(depth: usize) -> Value {
        (0..depth).fold(json!(1), |v, _| json!([v]))
    }

    #[test]
    fn stage_applies_and_bumps_the_version() {
        let s = stage(Some(&Names), &MetadataSnapshot::default(), &json!({"add": "t"})).unwrap();
        assert_eq!(s.snapshot, MetadataSnapshot { version: 1, state: json!(["t"]) });
        let decoded: MasterMsg = serde_json::from_slice(&s.frame).unwrap();
        assert!(matches!(decoded, MasterMsg::Metadata { snapshot } if snapshot == s.snapshot));
        let again = stage(Some(&Names), &s.snapshot, &json!({"add": "t"})).unwrap_err();
        assert!(matches!(&again, ClusterError::MetadataRejected { reason } if reason == "t already exists"), "{again}");
    }

    #[test]
    fn no_machine_a_panicking_machine_and_deep_values_are_rejected() {
        let empty = MetadataSnapshot::default();
        let err = stage(None, &empty, &json!({"add": "t"})).unwrap_err().to_string();
        assert!(err.contains("no metadata machine"), "{err}");
        let err = stage(Some(&Names), &empty, &json!({"add": "boom"})).unwrap_err().to_string();
        assert!(err.contains("panicked"), "{err}");
        let err = stage(Some(&Names), &empty, &nested(MAX_VALUE_DEPTH + 1)).unwrap_err().to_string();
        assert!(err.contains("deeper than 100 levels"), "{err}");
        check_op(&nested(MAX_VALUE_DEPTH)).unwrap();
    }

    #[test]
    fn a_deep_value_still_fits_the_wire_decoder() {
        // The deepest accepted state, inside its message, decodes with serde_json's limit.
        let snapshot = MetadataSnapshot { version: 1, state: nested(MAX_VALUE_DEPTH) };
        let frame = encode_frame(&snapshot).unwrap();
        let decoded: MasterMsg = serde_json::from_slice(&frame).unwrap();
        assert!(matches!(decoded, MasterMsg::Metadata { snapshot: s } if s == snapshot));
    }

    #[test]
    fn a_state_too_large_for_a_frame_is_rejected() {
        #[derive(Debug)]
        struct Huge;
        impl MetadataMachine for Huge {
            fn apply(&self, _: &Value, _: &Value) -> std::result::Result<Value, String> {
                Ok(Value::String("x".repeat(MAX_PAYLOAD_BYTES)))
            }
        }
        let err = stage(Some(&Huge), &MetadataSnapshot::default(), &json!({})).unwrap_err().to_string();
        assert!(err.contains("more than the control frame limit of 16777184 bytes"), "{err}");
    }

    #[test]
    fn persisted_snapshot_loads_back_and_a_missing_file_is_empty() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("master");
        assert_eq!(load(&dir).unwrap(), MetadataSnapshot::default());
        let snap = MetadataSnapshot { version: 7, state: json!({"tables": ["a"]}) };
        persist(&dir, &snap).unwrap();
        assert_eq!(load(&dir).unwrap(), snap);
        std::fs::write(dir.join(METADATA_FILE), b"{not json").unwrap();
        let err = load(&dir).unwrap_err().to_string();
        assert!(err.contains("metadata.json is not valid"), "{err}");
    }

    #[test]
    fn versions_only_move_forward() {
        let (tx, rx) = watch::channel(MetadataSnapshot::default());
        assert!(advance(&tx, MetadataSnapshot { version: 2, state: json!("two") }));
        assert!(!advance(&tx, MetadataSnapshot { version: 1, state: json!("one, late") }));
        assert!(!advance(&tx, MetadataSnapshot { version: 2, state: json!("two again") }));
        assert_eq!(*rx.borrow(), MetadataSnapshot { version: 2, state: json!("two") });
        assert!(advance(&tx, MetadataSnapshot { version: 3, state: json!("three") }));
        assert_eq!(rx.borrow().version, 3);
    }
}
