//! `max_server_memory_usage`: how much memory a node may hold while it runs queries, as
//! ClickHouse's setting of that name. Without it, one query with ten million groups and a
//! `count(DISTINCT)` took a node past 11 GB of resident memory (`/proc/PID/status`, three nodes on
//! one machine, 2026-12-03), and the others stopped answering their peers.
//!
//! Every query's operators reserve from the node's pool ([`ServerMemory`], fair to operators
//! that spill, as DataFusion's `FairSpillPool` is); a query with a
//! `max_memory_usage` of its own reserves from its own pool *and* the node's ([`Within`]), so
//! neither limit can be passed. An operator that can spill does so when the node's pool is full;
//! the rest fail the query with an error that names the setting, its value and the node. The
//! default, set by `shardwise node`, is 80% of the machine's memory (or of its cgroup's limit);
//! 0 means no limit.
//!
//! DataFusion's operators count most, not all, of what they hold (hash tables and their
//! accumulators' heap are estimates), and the node holds memory no query reserves (storage
//! buffers, network messages, the allocator's overhead). So the node's own pool, the one
//! [`ServerMemory::start`] makes, samples the process's resident memory every
//! [`SERVER_MEMORY_SAMPLE_MS`] (`crate::resident_memory`) and counts what lies beyond the queries'
//! reservations as held too: a reservation must fit beside both. Before it refuses one for that
//! reason it samples again and, if that is not enough, gives the allocator's free memory back to
//! the kernel (`malloc_trim`) and samples once more, so memory a finished query freed but the
//! allocator kept does not hold the next queries back. A release walks every heap, so it runs at
//! most once per [`SERVER_MEMORY_RELEASE_INTERVAL_MS`] unless the queries have given memory back,
//! or the memory outside them has grown, since the last one. A request for no more memory is never
//! refused.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::{FairSpillPool, MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation};

use crate::resident_memory::{anon_resident_bytes, release_free_heap};

/// Words that start the node pool's error, by which `crate::memory_limit` tells it apart from a
/// query's own limit.
pub const SERVER_MEMORY_ERROR: &str = "the queries running on rank";

/// How often the node's pool reads the process's resident memory.
pub const SERVER_MEMORY_SAMPLE_MS: u64 = 100;

/// At most one release of the allocator's free memory (`malloc_trim`, which walks every heap
/// under its lock) per this many milliseconds, and only when the pool is about to refuse memory.
pub const SERVER_MEMORY_RELEASE_INTERVAL_MS: u64 = 1_000;

/// A release sooner than [`SERVER_MEMORY_RELEASE_INTERVAL_MS`] after the last one when the queries
/// have given back, or the memory outside them has grown, by the limit divided by this since (the
/// memory of a query that ended, left with the allocator).
pub const SERVER_MEMORY_RELEASE_GROWTH_DIVISOR: usize = 16;

/// When the allocator's free memory was last given back, with what the queries held then and
/// what lay outside them right after.
#[derive(Debug, Clone, Copy)]
struct Release {
    at: Instant,
    reserved: usize,
    outside_after: usize,
}

/// Where a pool reads the process's resident memory in bytes (`None`: unknown).
type ResidentSource = Box<dyn Fn() -> Option<u64> + Send + Sync>;

/// The node's pool: DataFusion's `FairSpillPool` over all queries (operators that cannot spill
/// take what they need first; those that can share the rest equally, so one large sort cannot
/// starve the other queries' hash tables), plus the node's memory outside the queries'
/// reservations when it samples it, with an error that names the setting and the node.
pub struct ServerMemory {
    limit_bytes: usize,
    inner: FairSpillPool,
    rank: u32,
    /// The process's resident memory less the queries' reservations, at the last sample.
    outside_bytes: AtomicUsize,
    /// `None`: count reservations only.
    resident: Option<ResidentSource>,
    /// The last release of the allocator's free memory.
    last_release: Mutex<Option<Release>>,
}

impl std::fmt::Debug for ServerMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerMemory")
            .field("limit_bytes", &self.limit_bytes)
            .field("reserved", &self.inner.reserved())
            .field("outside_bytes", &self.outside())
            .field("rank", &self.rank)
            .finish_non_exhaustive()
    }
}

impl ServerMemory {
    /// A pool of `limit_bytes` that counts the queries' reservations only.
    pub fn new(limit_bytes: u64, rank: u32) -> ServerMemory {
        let limit_bytes = usize::try_from(limit_bytes).unwrap_or(usize::MAX);
        ServerMemory {
            limit_bytes,
            inner: FairSpillPool::new(limit_bytes),
            rank,
            outside_bytes: AtomicUsize::new(0),
            resident: None,
            last_release: Mutex::new(None),
        }
    }

    /// A pool that also counts what `resident` reports beyond the queries' reservations, as of
    /// the last [`ServerMemory::sample`].
    pub fn with_resident(limit_bytes: u64, rank: u32, resident: ResidentSource) -> ServerMemory {
        ServerMemory { resident: Some(resident), ..ServerMemory::new(limit_bytes, rank) }
    }

    /// The node's pool: it counts the process's resident memory, sampled now and then every
    /// [`SERVER_MEMORY_SAMPLE_MS`] by a thread that ends with the pool. Warns when the node
    /// already holds more than the limit before any query.
    pub fn start(limit_bytes: u64, rank: u32) -> Arc<ServerMemory> {
        let pool = Arc::new(ServerMemory::with_resident(limit_bytes, rank, Box::new(anon_resident_bytes)));
        pool.sample();
        if pool.outside() >= pool.limit_bytes {
            tracing::warn!(
                "max_server_memory_usage = {} bytes is less than this node holds before any query ({} bytes \
                 resident): every query that needs memory will be refused",
                pool.limit_bytes,
                pool.outside()
            );
        }
        let weak: Weak<ServerMemory> = Arc::downgrade(&pool);
        let sampler = std::thread::Builder::new().name("shardwise-memory".into()).spawn(move || {
            loop {
                std::thread::sleep(Duration::from_millis(SERVER_MEMORY_SAMPLE_MS));
                match weak.upgrade() {
                    Some(pool) => pool.sample(),
                    None => return,
                }
            }
        });
        if let Err(e) = sampler {
            tracing::warn!("max_server_memory_usage counts query reservations only: no sampling thread: {e}");
        }
        pool
    }

    /// Reads the resident memory and counts what lies beyond the queries' reservations.
    pub fn sample(&self) {
        if let Some(resident) = self.resident.as_ref().and_then(|read| read()) {
            let resident = usize::try_from(resident).unwrap_or(usize::MAX);
            self.outside_bytes.store(resident.saturating_sub(self.inner.reserved()), Ordering::Relaxed);
        }
    }

    /// Memory the node holds beyond the queries' reservations, as of the last sample.
    pub fn outside(&self) -> usize {
        self.outside_bytes.load(Ordering::Relaxed)
    }

    fn fits(&self, additional: usize) -> bool {
        self.inner.reserved().saturating_add(self.outside()).saturating_add(additional) <= self.limit_bytes
    }

    /// Samples again and, if the reservation still does not fit, gives the allocator's free
    /// memory back and samples once more. The release is skipped when one ran less than
    /// [`SERVER_MEMORY_RELEASE_INTERVAL_MS`] ago and since then neither have the queries given back
    /// nor has the memory outside them grown by [`SERVER_MEMORY_RELEASE_GROWTH_DIVISOR`]th of the
    /// limit (either leaves freed memory with the allocator). A thread that finds another running
    /// one waits for it and samples what it left: a query's partitions reserve at once, and the
    /// ones that did not run the release were refused while it was freeing the memory they asked
    /// for (a 16-byte reservation, right after a large query had failed, with nothing running).
    fn sample_and_release(&self, additional: usize) {
        self.sample();
        if self.resident.is_none() || self.fits(additional) {
            return;
        }
        let mut last = match self.last_release.try_lock() {
            Ok(last) => last,
            Err(_) => {
                let last = self.last_release.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                self.sample();
                if self.fits(additional) {
                    return;
                }
                last
            }
        };
        let step = self.limit_bytes / SERVER_MEMORY_RELEASE_GROWTH_DIVISOR;
        let reserved = self.inner.reserved();
        if let Some(release) = *last
            && release.at.elapsed() < Duration::from_millis(SERVER_MEMORY_RELEASE_INTERVAL_MS)
            && reserved.saturating_add(step) > release.reserved
            && self.outside() <= release.outside_after.saturating_add(step)
        {
            return;
        }
        release_free_heap();
        self.sample();
        *last = Some(Release { at: Instant::now(), reserved, outside_after: self.outside() });
    }

    fn refusal(&self, reservation: &MemoryReservation, additional: usize) -> DataFusionError {
        DataFusionError::ResourcesExhausted(format!(
            "{SERVER_MEMORY_ERROR} {} hold {} bytes and the rest of the node {} bytes (its resident memory \
             beyond the queries' reservations), and {} asks for {additional} more: more than \
             max_server_memory_usage = {} bytes (shardwise node --max-server-memory-bytes) allows, even with \
             the operators that can spill to disk doing so; run fewer or smaller queries at once, or raise it",
            self.rank,
            self.inner.reserved(),
            self.outside(),
            reservation.consumer().name(),
            self.limit_bytes,
        ))
    }
}

impl ServerMemory {
    /// The node had room, but the operator asked past its share: the pool gives each operator
    /// that can spill an even part of what the others that cannot spill leave, as DataFusion's
    /// `FairSpillPool` does (an error that blamed the node's limit alone read as false, its own
    /// figures adding up to less).
    fn share_refusal(
        &self,
        reservation: &MemoryReservation,
        additional: usize,
        inner: &DataFusionError,
    ) -> DataFusionError {
        DataFusionError::ResourcesExhausted(format!(
            "{SERVER_MEMORY_ERROR} {} hold {} bytes, and {} asks for {additional} more, past its share of \
             max_server_memory_usage = {} bytes (shardwise node --max-server-memory-bytes): the operators that \
             can spill to disk share what the others leave evenly, and many running at once (concurrent \
             queries, several partitions each) make each share small ({}); run fewer queries at once, or \
             raise it",
            self.rank,
            self.inner.reserved(),
            reservation.consumer().name(),
            self.limit_bytes,
            inner.message(),
        ))
    }
}

impl std::fmt::Display for ServerMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "max_server_memory_usage({} of {} bytes, {} more held outside queries)",
            self.reserved(),
            self.limit_bytes,
            self.outside()
        )
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
        // Asking for nothing more is never refused, however full the node is.
        if additional > 0 && !self.fits(additional) {
            self.sample_and_release(additional);
            if !self.fits(additional) {
                return Err(self.refusal(reservation, additional));
            }
        }
        self.inner.try_grow(reservation, additional).map_err(|e| self.share_refusal(reservation, additional, &e))
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
    use std::sync::atomic::AtomicU64;

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

    /// An operator that can spill refused past its even share, with room left in the node, is
    /// told so, not that the node's limit was passed.
    #[test]
    fn a_refusal_past_an_operators_share_says_so() {
        let node: Arc<dyn MemoryPool> = Arc::new(ServerMemory::new(1000, 1));
        let a = MemoryConsumer::new("a").with_can_spill(true).register(&node);
        let b = MemoryConsumer::new("b").with_can_spill(true).register(&node);
        a.try_grow(400).expect("within its share of 500");
        b.try_grow(100).expect("fits");
        let err = a.try_grow(200).expect_err("past its share").to_string();
        assert!(err.contains("a asks for 200 more, past its share") && err.contains("hold 500 bytes"), "{err}");
    }

    /// A pool whose resident memory is what the test stores in the returned cell.
    fn sampled(limit_bytes: u64) -> (Arc<ServerMemory>, Arc<AtomicU64>) {
        let resident = Arc::new(AtomicU64::new(0));
        let source = Arc::clone(&resident);
        let read = Box::new(move || Some(source.load(Ordering::Relaxed)));
        (Arc::new(ServerMemory::with_resident(limit_bytes, 2, read)), resident)
    }

    #[test]
    fn memory_the_node_holds_beyond_the_reservations_counts_against_the_limit() {
        let (pool, resident) = sampled(1000);
        let node: Arc<dyn MemoryPool> = Arc::clone(&pool) as Arc<dyn MemoryPool>;
        let q = MemoryConsumer::new("q").register(&node);
        q.try_grow(300).expect("fits");
        resident.store(900, Ordering::Relaxed);
        pool.sample();
        assert_eq!(pool.outside(), 600, "900 resident, 300 of it reserved");
        let err = q.try_grow(200).expect_err("300 + 600 + 200 is over 1000").to_string();
        assert!(err.contains("rank 2 hold 300 bytes and the rest of the node 600 bytes"), "{err}");
        assert_eq!(node.reserved(), 300, "nothing kept of a refused grow");
        q.try_grow(0).expect("asking for nothing more is never refused");
        q.try_grow(100).expect("300 + 600 + 100 fits");
        // The memory outside the queries is given back: room again at the next sample.
        resident.store(400, Ordering::Relaxed);
        pool.sample();
        assert_eq!(pool.outside(), 0);
        q.try_grow(500).expect("900 reserved, nothing outside");
        assert!(pool.to_string().contains("900 of 1000 bytes, 0 more held outside queries"), "{pool}");
    }

    #[test]
    fn a_pool_samples_again_before_it_refuses() {
        let (pool, resident) = sampled(1000);
        let node: Arc<dyn MemoryPool> = Arc::clone(&pool) as Arc<dyn MemoryPool>;
        resident.store(900, Ordering::Relaxed);
        pool.sample();
        // Memory freed since the last sample (a query that ended) does not refuse the next one.
        resident.store(100, Ordering::Relaxed);
        let q = MemoryConsumer::new("q").register(&node);
        q.try_grow(500).expect("the sample taken before refusing says 100 bytes outside");
        assert_eq!(pool.outside(), 100);
        // A pool that counts reservations only ignores resident memory altogether.
        let plain: Arc<dyn MemoryPool> = Arc::new(ServerMemory::new(1000, 0));
        MemoryConsumer::new("p").register(&plain).try_grow(1000).expect("all of it");
    }

    /// One partition of a query runs the release while another asks: the second waits for it
    /// and takes what it freed (it was refused at once).
    #[test]
    fn a_reservation_waits_for_a_release_under_way() {
        let (pool, resident) = sampled(1000);
        resident.store(900, Ordering::Relaxed);
        pool.sample();
        let under_way = pool.last_release.lock().expect("lock");
        let asking = {
            let node: Arc<dyn MemoryPool> = Arc::clone(&pool) as Arc<dyn MemoryPool>;
            std::thread::spawn(move || MemoryConsumer::new("q").register(&node).try_grow(500))
        };
        std::thread::sleep(Duration::from_millis(50));
        // What the release under way frees.
        resident.store(100, Ordering::Relaxed);
        drop(under_way);
        asking.join().expect("thread").expect("the memory the release freed");
    }

    #[test]
    fn the_node_pool_samples_this_process() {
        let pool = ServerMemory::start(u64::MAX, 0);
        assert!(cfg!(not(target_os = "linux")) || pool.outside() > 0, "{pool:?}");
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
