//! One read of a shard per execution of a plan, shared by the slices that read it.
//!
//! A scan cuts a shard into slices by row position (`ShardSlice::row_range`), one partition each.
//! If each partition read the shard on its own, an insert, a flush or a compaction landing
//! between two reads would move the rows under the slice boundaries, and the query would skip
//! some rows and count others twice. So the partitions of one execution that read the same shard
//! share one read: the first to ask makes it, the others wait for it, and the last to take it
//! lets the scan forget it (the batches live as long as the partitions that read them).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use datafusion::execution::TaskContext;
use tokio::sync::OnceCell;

use crate::access::ShardData;

/// A shard's read, made once and shared.
pub type SharedRead = Arc<OnceCell<Arc<ShardData>>>;

/// The reads in flight, per shard.
#[derive(Debug, Default)]
pub struct ShardReads {
    pending: Mutex<HashMap<u32, Pending>>,
}

#[derive(Debug)]
struct Pending {
    /// The execution the read is for.
    execution: Weak<TaskContext>,
    read: SharedRead,
    /// Partitions of that execution that have yet to take it.
    readers_left: usize,
}

impl ShardReads {
    /// The read of `shard` for `execution`, which `readers` partitions take in all (each calls
    /// this once).
    pub fn take(&self, execution: &Arc<TaskContext>, shard: u32, readers: usize) -> SharedRead {
        // A panic elsewhere under this lock leaves the map as it was: still the reads to share.
        let mut pending = self.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let fresh =
            || Pending { execution: Arc::downgrade(execution), read: SharedRead::default(), readers_left: readers };
        let entry = pending.entry(shard).or_insert_with(fresh);
        let same_execution = entry.execution.upgrade().is_some_and(|e| Arc::ptr_eq(&e, execution));
        if !same_execution || entry.readers_left == 0 {
            *entry = fresh();
        }
        entry.readers_left = entry.readers_left.saturating_sub(1);
        let read = Arc::clone(&entry.read);
        if entry.readers_left == 0 {
            pending.remove(&shard);
        }
        read
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_partitions_of_one_execution_share_a_read_and_the_next_reads_afresh() {
        let reads = ShardReads::default();
        let run = Arc::new(TaskContext::default());
        let a = reads.take(&run, 0, 2);
        let other_shard = reads.take(&run, 1, 1);
        let b = reads.take(&run, 0, 2);
        assert!(Arc::ptr_eq(&a, &b), "two slices of shard 0 share one read");
        assert!(!Arc::ptr_eq(&a, &other_shard));
        assert!(reads.pending.lock().map(|p| p.is_empty()).unwrap_or(false), "forgotten once all took it");
        let c = reads.take(&run, 0, 2);
        assert!(!Arc::ptr_eq(&a, &c), "a later run of the same plan reads afresh");
        let next = Arc::new(TaskContext::default());
        let d = reads.take(&next, 0, 2);
        assert!(!Arc::ptr_eq(&c, &d), "another execution reads afresh");
    }
}
