//! Test support: a [`TableAccess`] that holds one shard of one table in memory and refuses
//! everything else.

use datafusion::arrow::record_batch::RecordBatch;

use crate::access::TableAccess;
use crate::error::QueryError;

/// A node holding one shard of one table, in memory; nothing else.
#[derive(Debug)]
pub(crate) struct OneShard(pub(crate) Vec<RecordBatch>);

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
        let data = crate::access::ShardData { batches: self.0.clone(), verified_placement: true };
        Box::pin(async move { Ok(data) })
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
    fn shards(&self) -> shardwise_cluster::BoxFuture<'_, Result<Vec<crate::access::ShardReplicaRow>, QueryError>> {
        refused()
    }
    fn sync_queues(&self) -> shardwise_cluster::BoxFuture<'_, Result<Vec<crate::access::SyncQueueRow>, QueryError>> {
        refused()
    }
}
