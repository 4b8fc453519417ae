//! Membership: who is in the cluster, in which role, at which addresses, and how alive.
//!
//! The master owns the authoritative list (it sees every heartbeat); other nodes ask it, and fall
//! back to the last list they received when it cannot be reached. These types are what
//! `system.nodes` shows, so every field is something an operator wants to read.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};

/// A node's role for the life of the cluster: rank 0 is the master.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Master,
    Worker,
}

impl Role {
    pub fn for_rank(rank: u32) -> Role {
        if rank == 0 { Role::Master } else { Role::Worker }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            Role::Master => "master",
            Role::Worker => "worker",
        }
    }
}

/// Liveness as judged by the master's failure detector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    /// Heartbeats arrive on time.
    Up,
    /// No heartbeat for `suspect_after_ms`.
    Suspect,
    /// No heartbeat for `down_after_ms`, or the node left.
    Down,
}

impl NodeState {
    pub fn as_str(&self) -> &'static str {
        match self {
            NodeState::Up => "up",
            NodeState::Suspect => "suspect",
            NodeState::Down => "down",
        }
    }
}

/// The [`MemberInfo::addrs`] key of a node's data plane (rows and query fragments between
/// nodes), which the server publishes and `system.nodes` shows as `data_addr`.
pub const DATA_ADDR_KEY: &str = "data";

/// One row of `system.nodes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberInfo {
    pub rank: u32,
    /// UUID kept in the node's data dir.
    pub node_id: String,
    pub role: Role,
    /// Service name (`flight`, `pg`, `http`) -> `host:port` this node serves it on.
    pub addrs: BTreeMap<String, String>,
    pub state: NodeState,
    /// Incarnation number for this rank; a restarted node gets a higher one and fences the old.
    pub epoch: u64,
    /// Unix time in milliseconds of the last heartbeat the master received (for the master
    /// itself: the time the list was produced).
    pub last_heartbeat_unix_ms: Option<u64>,
}

/// A boxed, sendable future (what `dyn` traits can return).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Read access to the cluster's membership, for `system.nodes` and the planner.
///
/// Implemented by the running node; the query layer depends only on this trait.
pub trait ClusterView: Send + Sync + std::fmt::Debug {
    /// This node's rank.
    fn rank(&self) -> u32;
    /// Number of ranks in the cluster.
    fn world_size(&self) -> u32;
    /// The current membership, rank order. Asks the master when this node is not the master;
    /// when the master cannot be reached, returns the last list received (whose states then
    /// describe that moment).
    fn members(&self) -> BoxFuture<'_, Vec<MemberInfo>>;
}
