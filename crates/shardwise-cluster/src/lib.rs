//! shardwise-cluster: how a process becomes a node of a shardwise cluster.
//!
//! This crate is the seed's `init_distributed_mode`: it detects the launch environment
//! ([`source`]), validates it, opens the node's data dir ([`datadir`]), meets the other ranks at
//! the master's rendezvous ([`rendezvous`]), and afterwards keeps membership and liveness
//! ([`membership`]) with heartbeats. The master also keeps a small replicated state machine
//! ([`metadata`]) that every node receives.

pub mod datadir;
pub mod error;
pub mod hostlist;
pub mod master_ids;
pub mod membership;
pub mod metadata;
pub mod node;
pub mod reachable;
pub mod rendezvous;
pub mod secret;
pub mod settings;
pub mod source;
pub mod wire;
pub mod worker;

pub use error::ClusterError;
pub use membership::{BoxFuture, ClusterView, DATA_ADDR_KEY, MemberInfo, NodeState, Role};
pub use metadata::{MetadataMachine, MetadataSnapshot};
pub use node::{InitOptions, MetadataHandle, Node, Prepared, check, init_distributed_mode, prepare};
pub use secret::ClusterSecret;
pub use settings::Timeouts;
pub use source::{Detected, LaunchSource};
