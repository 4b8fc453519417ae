//! Shuffle buckets a node fetches from itself, handed over in process.
//!
//! A shuffle's stage 2 fetches its bucket from one replica of every shard
//! ([`super::ShuffleReaderExec`]). The replica is often the merging node itself (on N nodes, one
//! bucket in N of every shard it holds), and going through the data plane then meant encoding
//! the bucket's rows as Arrow IPC, sending them over loopback gRPC to itself and decoding them
//! again (for db-benchmark's q10 on 2 nodes, counting rows: 5 million of the 25 million its
//! Flight streams carried; the nodes' CPU time for its aggregation fell by 0-6%, BENCHMARKS.md). [`LocalShuffle`] wraps the node's [`TableAccess`]: a fragment call for a shuffle
//! ticket addressed to this node's own rank is served straight from the node's
//! [`ExchangeRegistry`] (the same call the data plane makes for a remote request), with stage
//! 1's plan and metrics reported after the last row as the data plane reports them. Every other
//! call goes to the wrapped access.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use datafusion::execution::TaskContext;
use futures::StreamExt;
use shardwise_cluster::BoxFuture;
use shardwise_storage::{Catalog, CatalogOp};

use super::fragment::render_with_metrics;
use super::shuffle::{ExchangeRegistry, is_shuffle_ticket};
use crate::access::{FragmentReport, InsertOptions, RemoteRows, ShardData, ShardReplicaRow, SyncQueueRow, TableAccess};
use crate::error::QueryError;

/// See the module doc.
#[derive(Debug)]
pub(crate) struct LocalShuffle {
    inner: Arc<dyn TableAccess>,
    exchanges: Arc<ExchangeRegistry>,
    /// The node's task context (its functions decode stage 1's plan), set once the engine has
    /// made it. A snapshot, not the `SessionContext`: that holds the catalog, which holds this.
    ctx: OnceLock<Arc<TaskContext>>,
}

impl LocalShuffle {
    pub(crate) fn new(inner: Arc<dyn TableAccess>, exchanges: Arc<ExchangeRegistry>) -> Self {
        LocalShuffle { inner, exchanges, ctx: OnceLock::new() }
    }

    /// The context stage 1 runs in when this node fetches from itself.
    pub(crate) fn set_context(&self, ctx: Arc<TaskContext>) {
        // Set once, by the engine that made both; a second call would carry the same context.
        let _ = self.ctx.set(ctx);
    }

    /// `ticket`'s bucket from this node's own exchange.
    fn fetch_local(&self, ticket: &[u8], report: FragmentReport) -> Result<RemoteRows, QueryError> {
        let ctx = self.ctx.get().ok_or_else(|| QueryError::Unavailable("the node is still starting".into()))?;
        let (rows, plan) =
            self.exchanges.fetch(Arc::clone(&self.inner), Arc::clone(ctx), ticket, self.inner.local_rank())?;
        let rows = rows.map(|r| r.map_err(QueryError::from));
        let Some(plan) = plan else { return Ok(rows.boxed()) };
        let reported = futures::stream::once(async move {
            if let Ok(mut report) = report.lock() {
                report.plan = Some(render_with_metrics(&plan));
            }
            None
        })
        .filter_map(futures::future::ready);
        Ok(rows.chain(reported).boxed())
    }
}

impl TableAccess for LocalShuffle {
    fn catalog(&self) -> Arc<Catalog> {
        self.inner.catalog()
    }

    fn world_size(&self) -> u32 {
        self.inner.world_size()
    }

    fn ddl(&self, op: CatalogOp) -> BoxFuture<'_, Result<(), QueryError>> {
        self.inner.ddl(op)
    }

    fn insert(
        &self,
        table: &str,
        batches: Vec<datafusion::arrow::record_batch::RecordBatch>,
        opts: InsertOptions,
    ) -> BoxFuture<'_, Result<u64, QueryError>> {
        self.inner.insert(table, batches, opts)
    }

    fn local_rank(&self) -> u32 {
        self.inner.local_rank()
    }

    fn replica_problems(&self) -> (bool, Vec<String>) {
        self.inner.replica_problems()
    }

    fn down_ranks(&self) -> BoxFuture<'_, Vec<u32>> {
        self.inner.down_ranks()
    }

    fn catalog_version(&self) -> u64 {
        self.inner.catalog_version()
    }

    fn read_shard(
        &self,
        table_id: u64,
        generation: u64,
        catalog_version: u64,
        shard: u32,
    ) -> BoxFuture<'_, Result<ShardData, QueryError>> {
        self.inner.read_shard(table_id, generation, catalog_version, shard)
    }

    fn sample(&self, table_id: u64, generation: u64, max_rows: usize) -> Option<super::TableSample> {
        self.inner.sample(table_id, generation, max_rows)
    }

    fn remote_fragment(
        &self,
        rank: u32,
        ticket: Vec<u8>,
        report: FragmentReport,
    ) -> BoxFuture<'_, Result<RemoteRows, QueryError>> {
        if rank == self.inner.local_rank() && is_shuffle_ticket(&ticket) {
            let rows = self.fetch_local(&ticket, report);
            return Box::pin(async move { rows });
        }
        self.inner.remote_fragment(rank, ticket, report)
    }

    fn flush(&self, table: &str, timeout: Duration) -> BoxFuture<'_, Result<(), QueryError>> {
        self.inner.flush(table, timeout)
    }

    fn optimize(&self, table: &str, all_parts: bool, timeout: Duration) -> BoxFuture<'_, Result<(), QueryError>> {
        self.inner.optimize(table, all_parts, timeout)
    }

    fn shards(&self) -> BoxFuture<'_, Result<Vec<ShardReplicaRow>, QueryError>> {
        self.inner.shards()
    }

    fn sync_queues(&self) -> BoxFuture<'_, Result<Vec<SyncQueueRow>, QueryError>> {
        self.inner.sync_queues()
    }

    fn check_table(
        &self,
        table: &str,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<Vec<crate::access::ReplicaCheckRow>, QueryError>> {
        self.inner.check_table(table, timeout)
    }

    fn repair_table(
        &self,
        table: &str,
        timeout: Duration,
        rebuild_rank: Option<u64>,
    ) -> BoxFuture<'_, Result<Vec<crate::access::ReplicaRepairRow>, QueryError>> {
        self.inner.repair_table(table, timeout, rebuild_rank)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::shuffle::{encode_shuffle_ticket, test_header};
    use crate::dist::test_access::OneShard;

    fn run(access: &LocalShuffle, rank: u32, ticket: Vec<u8>) -> String {
        let report = FragmentReport::default();
        match futures::executor::block_on(access.remote_fragment(rank, ticket, report)) {
            Ok(_) => "rows".into(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_bucket_of_this_node_is_served_from_its_exchange_and_everything_else_goes_on() {
        let exchanges = Arc::new(ExchangeRegistry::default());
        let access = LocalShuffle::new(Arc::new(OneShard::new(Vec::new())), Arc::clone(&exchanges));
        let header = test_header("q1");
        // Not a plan: the exchange fails to decode it, where the wrapped access would refuse.
        let ticket = encode_shuffle_ticket(&header, b"not a plan").expect("ticket");
        assert!(run(&access, 0, ticket.clone()).contains("still starting"), "no context yet");
        access.set_context(Arc::new(TaskContext::default()));
        let local = run(&access, 0, ticket.clone());
        assert!(!local.contains("not in this test"), "rank 0's bucket went to the wrapped access: {local}");
        // Another rank's bucket, and anything that is not a bucket, go to the wrapped access.
        assert!(run(&access, 1, ticket).contains("not in this test"));
        assert!(run(&access, 0, b"a fragment ticket".to_vec()).contains("not in this test"));
        assert_eq!(access.local_rank(), 0);
        assert_eq!(access.world_size(), 1);
    }
}
