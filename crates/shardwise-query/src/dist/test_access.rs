//! Test support: a [`TableAccess`] that holds one shard of one table in memory and refuses
//! everything else.

use std::sync::atomic::{AtomicUsize, Ordering};

use datafusion::arrow::record_batch::RecordBatch;

use crate::access::TableAccess;
use crate::error::QueryError;

/// A node holding one shard of one table, in memory; nothing else. Counts the samples taken
/// and the reads of the shard.
#[derive(Debug)]
pub(crate) struct OneShard {
    batches: Vec<RecordBatch>,
    pub(crate) samples_taken: AtomicUsize,
    pub(crate) reads_taken: AtomicUsize,
    /// Appended once more at every read (rows inserted between two reads), if set.
    growth: Option<RecordBatch>,
}

impl OneShard {
    pub(crate) fn new(batches: Vec<RecordBatch>) -> Self {
        OneShard { batches, samples_taken: AtomicUsize::new(0), reads_taken: AtomicUsize::new(0), growth: None }
    }

    /// A shard that gains `growth` at every read.
    pub(crate) fn growing(batches: Vec<RecordBatch>, growth: RecordBatch) -> Self {
        OneShard { growth: Some(growth), ..OneShard::new(batches) }
    }
}

fn refused<T: Send + 'static>() -> shardwise_cluster::BoxFuture<'static, Result<T, QueryError>> {
    Box::pin(async { Err(QueryError::Unavailable("not in this test".into())) })
}

impl TableAccess for OneShard {
    fn catalog(&self) -> std::sync::Arc<shardwise_storage::Catalog> {
        std::sync::Arc::default()
    }
    fn world_size(&self) -> u32 {
        1
    }
    fn ddl(&self, _: shardwise_storage::CatalogOp) -> shardwise_cluster::BoxFuture<'_, Result<(), QueryError>> {
        refused()
    }
    fn insert(
        &self,
        _: &str,
        _: Vec<RecordBatch>,
        _: crate::access::InsertOptions,
    ) -> shardwise_cluster::BoxFuture<'_, Result<u64, QueryError>> {
        refused()
    }
    fn local_rank(&self) -> u32 {
        0
    }
    fn replica_problems(&self) -> (bool, Vec<String>) {
        (false, Vec::new())
    }
    fn down_ranks(&self) -> shardwise_cluster::BoxFuture<'_, Vec<u32>> {
        Box::pin(async { Vec::new() })
    }
    fn catalog_version(&self) -> u64 {
        1
    }
    fn read_shard(
        &self,
        _: u64,
        _: u64,
        _: u64,
        _: u32,
    ) -> shardwise_cluster::BoxFuture<'_, Result<crate::access::ShardData, QueryError>> {
        let earlier_reads = self.reads_taken.fetch_add(1, Ordering::Relaxed);
        let mut batches = self.batches.clone();
        batches.extend(self.growth.iter().cycle().take(earlier_reads).cloned());
        let data = crate::access::ShardData { batches, verified_placement: true };
        Box::pin(async move { Ok(data) })
    }
    fn sample(&self, _: u64, _: u64, _: usize) -> Option<crate::dist::TableSample> {
        self.samples_taken.fetch_add(1, Ordering::Relaxed);
        let table_rows = self.batches.iter().map(|b| b.num_rows() as u64).sum();
        Some(crate::dist::TableSample { batches: self.batches.clone(), table_rows })
    }
    fn remote_fragment(
        &self,
        _: u32,
        _: Vec<u8>,
        _: crate::access::FragmentReport,
    ) -> shardwise_cluster::BoxFuture<'_, Result<crate::access::RemoteRows, QueryError>> {
        refused()
    }
    fn flush(&self, _: &str, _: std::time::Duration) -> shardwise_cluster::BoxFuture<'_, Result<(), QueryError>> {
        refused()
    }
    fn optimize(
        &self,
        _: &str,
        _: bool,
        _: std::time::Duration,
    ) -> shardwise_cluster::BoxFuture<'_, Result<(), QueryError>> {
        refused()
    }
    fn shards(&self) -> shardwise_cluster::BoxFuture<'_, Result<Vec<crate::access::ShardReplicaRow>, QueryError>> {
        refused()
    }
    fn sync_queues(&self) -> shardwise_cluster::BoxFuture<'_, Result<Vec<crate::access::SyncQueueRow>, QueryError>> {
        refused()
    }
    fn check_table(
        &self,
        _: &str,
        _: std::time::Duration,
    ) -> shardwise_cluster::BoxFuture<'_, Result<Vec<crate::access::ReplicaCheckRow>, QueryError>> {
        refused()
    }
    fn repair_table(
        &self,
        _: &str,
        _: std::time::Duration,
        _: Option<u64>,
    ) -> shardwise_cluster::BoxFuture<'_, Result<Vec<crate::access::ReplicaRepairRow>, QueryError>> {
        refused()
    }
}
