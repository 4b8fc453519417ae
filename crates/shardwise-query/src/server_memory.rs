//! `max_server_memory_usage`: how much memory all the queries running on a node may hold
//! together, as ClickHouse's setting of that name. Without it, one query with ten million groups
//! and a `count(DISTINCT)` took a node past 11 GB of resident memory (`/proc/PID/status`, three
//! nodes on one machine, 2026-12-03), and the others stopped answering their peers.
//!
//! Every query's operators reserve from the node's pool ([`ServerMemory`], fair to operators
//! that spill, as DataFusion's `FairSpillPool` is); a query with a
//! `max_memory_usage` of its own reserves from its own pool *and* the node's ([`Within`]), so
//! neither limit can be passed. An operator that can spill does so when the node's pool is full;
//! the rest fail the query with an error that names the setting, its value and the node. The
//! default, set by `shardwise node`, is 80% of the machine's memory (or of its cgroup's limit);
//! 0 means no limit. DataFusion's operators count most, not all, of what they hold (hash tables
//! and their accumulators' heap are estimates), so the process can pass the limit by some.

use std::sync::Arc;

use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::{FairSpillPool, MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation};

/// Words that start the node pool's error, by which `crate::memory_limit` tells it apart from a
/// query's own limit.
pub const SERVER_MEMORY_ERROR: &str = "the queries running on rank";

/// The node's pool: DataFusion's `FairSpillPool` over all queries (operators that cannot spill
/// take what they need first; those that can share the rest equally, so one large sort cannot
/// starve the other queries' hash tables), with an error that names the setting and the node.
#[derive(Debug)]
pub struct ServerMemory {
    limit_bytes: usize,
    inner: FairSpillPool,
    rank: u32,
}

impl ServerMemory {
    pub fn new(limit_bytes: u64, rank: u32) -> ServerMemory {
        let limit_bytes = usize::try_from(limit_bytes).unwrap_or(usize::MAX);
        ServerMemory { limit_bytes, inner: FairSpillPool::new(limit_bytes), rank }
    }
}

impl std::fmt::Display for ServerMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "max_server_memory_usage({} of {} bytes)", self.reserved(), self.limit_bytes)
    }
}

impl MemoryPool for ServerMemory {
    fn name(&self) -> &str {
        "max_server_memory_usage"
    }

    fn register(&self, consumer: &MemoryConsumer) {
        self.inner.register(consumer);
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        self.inner.unregister(consumer);
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.inner.grow(reservation, additional);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.inner.shrink(reservation, shrink);
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> Result<()> {
        let limit = self.limit_bytes;
        self.inner.try_grow(reservation, additional).map_err(|_| {
            DataFusionError::ResourcesExhausted(format!(
                "{SERVER_MEMORY_ERROR} {} hold {} bytes, and {} asks for {additional} more: more than \
                 max_server_memory_usage = {limit} bytes (shardwise node --max-server-memory-bytes) allows, even \
                 with the operators that can spill to disk doing so; run fewer or smaller queries at once, or \
                 raise it",
                self.rank,
                self.inner.reserved(),
                reservation.consumer().name(),
            ))
        })
    }

    fn reserved(&self) -> usize {
        self.inner.reserved()
    }

    fn memory_limit(&self) -> MemoryLimit {
        MemoryLimit::Finite(self.limit_bytes)
    }
}

/// A query's own pool inside the node's: a reservation must fit in both.
#[derive(Debug)]
pub struct Within {
    pub query: Arc<dyn MemoryPool>,
    pub node: Arc<dyn MemoryPool>,
}

impl std::fmt::Display for Within {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} within {}", self.query, self.node)
    }
}

impl MemoryPool for Within {
    fn name(&self) -> &str {
        self.query.name()
    }

    fn register(&self, consumer: &MemoryConsumer) {
        self.query.register(consumer);
        self.node.register(consumer);
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        self.query.unregister(consumer);
        self.node.unregister(consumer);
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.query.grow(reservation, additional);
        self.node.grow(reservation, additional);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.query.shrink(reservation, shrink);
        self.node.shrink(reservation, shrink);
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> Result<()> {
        self.query.try_grow(reservation, additional)?;
        if let Err(e) = self.node.try_grow(reservation, additional) {
            self.query.shrink(reservation, additional);
            return Err(e);
        }
        Ok(())
    }

    fn reserved(&self) -> usize {
        self.query.reserved()
    }

    fn memory_limit(&self) -> MemoryLimit {
        self.query.memory_limit()
    }
}

#[cfg(test)]
mod tests {
    use datafusion::execution::memory_pool::UnboundedMemoryPool;

    use super::*;

    #[test]
    fn the_node_pool_bounds_all_queries_together() {
        let node: Arc<dyn MemoryPool> = Arc::new(ServerMemory::new(1000, 3));
        let a = MemoryConsumer::new("a").register(&node);
        let b = MemoryConsumer::new("b").register(&node);
        a.try_grow(600).expect("fits");
        let err = b.try_grow(600).expect_err("over the node's limit").to_string();
        assert!(err.contains("rank 3 hold 600 bytes") && err.contains("max_server_memory_usage = 1000"), "{err}");
        drop(a);
        b.try_grow(600).expect("room again once a is gone");
        assert_eq!(node.reserved(), 600);
    }

    #[test]
    fn a_query_pool_within_the_node_pool_fits_both_and_undoes_a_refusal() {
        let node: Arc<dyn MemoryPool> = Arc::new(ServerMemory::new(1000, 0));
        let other = MemoryConsumer::new("other").register(&node);
        other.try_grow(700).expect("fits");
        let query: Arc<dyn MemoryPool> =
            Arc::new(Within { query: Arc::new(FairSpillPool::new(500)), node: Arc::clone(&node) });
        let r = MemoryConsumer::new("q").register(&query);
        assert!(r.try_grow(400).is_err(), "the node has 300 left");
        assert_eq!((query.reserved(), node.reserved()), (0, 700), "nothing kept of a refused grow");
        r.try_grow(300).expect("fits both");
        drop(other);
        assert!(r.try_grow(300).is_err(), "the query's own 500 bytes");
        let unbounded: Arc<dyn MemoryPool> =
            Arc::new(Within { query: Arc::new(UnboundedMemoryPool::default()), node: Arc::clone(&node) });
        let big = MemoryConsumer::new("big").register(&unbounded);
        big.try_grow(700).expect("the node's 1000 less the query's 300");
        assert!(big.try_grow(1).is_err());
    }
}
