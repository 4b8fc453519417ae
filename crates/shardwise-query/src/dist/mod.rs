//! Distributed execution of queries over sharded tables.
//!
//! DataFusion plans every query as if it ran on one node, over a leaf ([`ShardScanExec`]) whose
//! partitions are slices of the table's shards. [`DistributeRule`], the last physical optimizer
//! rule, then cuts the plan where rows must leave the shards and puts a [`FragmentExec`] there:
//! the subtree below it is serialized ([`codec`]) and run by a replica of each shard, local or
//! remote, and its rows flow back into the rest of the plan on the initiator. The settings that
//! steer the cut (`distributed_group_by_no_merge`, `optimize_distributed_group_by_sharding_key`,
//! `load_balancing`, `skip_unavailable_shards`) are documented in docs/distributed-queries.md.

pub mod codec;
pub mod fragment;
pub mod planner;
pub mod scan;

pub use codec::{FragmentTicket, LeafAssignment, ShardwiseCodec};
pub use fragment::{FragmentExec, Strategy, StrategyKind, run_fragment_ticket};
pub use planner::DistributeRule;
pub use scan::{ShardScanExec, ShardSlice, ShardTableRef};
