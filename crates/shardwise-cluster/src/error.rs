//! The cluster crate's error type: every way `init_distributed_mode` and the running node can
//! fail, each carrying what an operator needs to fix it (the value, where it came from, what was
//! expected).

use std::path::PathBuf;

use crate::source::SourceError;

/// Errors from joining or running a cluster node.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(transparent)]
    Source(#[from] SourceError),

    #[error("invalid setting {name}={value}: {expected}")]
    InvalidSetting { name: String, value: String, expected: String },

    #[error("master address {addr}:{port} does not resolve: {reason}")]
    MasterUnresolvable { addr: String, port: u16, reason: String },

    #[error(
        "no cluster secret for a {world_size}-node cluster: give --secret-file or \
         SHARDWISE_CLUSTER_SECRET (at least {min_bytes} bytes), or pass --insecure"
    )]
    SecretRequired { world_size: u32, min_bytes: usize },

    #[error("cluster secret from {origin} is {len} bytes; at least {min_bytes} are required")]
    SecretTooShort { origin: String, len: usize, min_bytes: usize },

    #[error("cannot read cluster secret file {path}: {source}")]
    SecretFile { path: PathBuf, source: std::io::Error },

    #[error("data dir {path} is locked by another running node (lock file {lock})")]
    DataDirLocked { path: PathBuf, lock: PathBuf },

    #[error("data dir {path}: {reason}")]
    DataDir { path: PathBuf, reason: String },

    #[error("data dir {path}: I/O error during {op}: {source}")]
    DataDirIo { path: PathBuf, op: &'static str, source: std::io::Error },

    #[error("init_distributed_mode was already called in this process (rank {rank})")]
    AlreadyInitialized { rank: u32 },

    #[error(
        "cannot bind the rendezvous port {addr}: {source} (the master's port: MASTER_PORT or --master-port; \
         under Slurm without them it is 15000 + the last four digits of SLURM_JOB_ID, which two jobs can share: \
         give a free one)"
    )]
    RendezvousBind { addr: String, source: std::io::Error },

    #[error("could not reach the master at {addr} within the join timeout of {timeout_ms} ms: {last_error}")]
    MasterUnreachable { addr: String, timeout_ms: u64, last_error: String },

    #[error(
        "join timeout after {timeout_ms} ms: {joined} of {world_size} ranks joined; missing ranks: {}",
        format_ranks(missing)
    )]
    JoinTimeout { timeout_ms: u64, joined: u32, world_size: u32, missing: Vec<u32> },

    #[error("the master refused this node: {reason}")]
    Refused { reason: String },

    #[error("peer {peer} does not speak the shardwise cluster protocol: {detail}")]
    WrongProtocol { peer: String, detail: String },

    #[error("peer {peer} speaks cluster protocol version {theirs}; this node speaks {ours}")]
    ProtocolVersion { peer: String, ours: u16, theirs: u16 },

    #[error("authentication with {peer} failed: {detail}")]
    Auth { peer: String, detail: String },

    #[error("connection to {peer} failed: {detail}")]
    Connection { peer: String, detail: String },

    #[error("{op} timed out after {timeout_ms} ms")]
    Timeout { op: String, timeout_ms: u64 },

    #[error("this node was fenced out: {reason}")]
    Fenced { reason: String },

    /// What answers on the master's port is a master this node recorded as replaced
    /// (`master_ids`): not joined, and tried again (the master that replaced it may come back
    /// there), unlike a refusal.
    #[error("{reason}")]
    StaleMaster { reason: String },

    #[error("the node is shutting down")]
    ShuttingDown,

    /// The metadata machine (or a limit of the replicated metadata) refused a proposal; nothing
    /// changed.
    #[error("metadata change rejected: {reason}")]
    MetadataRejected { reason: String },

    /// The master takes no metadata change for now (a replacement master still taking the
    /// catalog from the ranks, or a node's newer version still on its way to it); nothing
    /// changed, and the same change may succeed when retried.
    #[error("metadata change refused for now: {reason}")]
    MetadataNotNow { reason: String },

    /// A proposal got no answer from the master. `sent` tells whether it left this node (then it
    /// may have been applied).
    #[error(
        "could not reach the master ({master}) to apply a metadata change: {detail}; {}",
        if *sent { "the change may or may not have been applied" } else { "the change was not applied" }
    )]
    MetadataUnreachable { master: String, detail: String, sent: bool },

    /// The master could not store an accepted change durably, so it told nobody about it.
    #[error(
        "the master could not store a metadata change durably: {detail}; the change was not \
         announced to any node, and may or may not have been applied"
    )]
    MetadataStore { detail: String },
}

/// `2, 3, 7`
pub fn format_ranks(ranks: &[u32]) -> String {
    ranks.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ")
}

pub type Result<T, E = ClusterError> = std::result::Result<T, E>;
