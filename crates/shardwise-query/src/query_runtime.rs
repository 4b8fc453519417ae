//! The query runtime: a tokio runtime of its own for executing plans, apart from the one that
//! serves the network and runs the cluster's heartbeats.
//!
//! DataFusion runs CPU-bound operators inside async tasks. On a shared runtime a long query would
//! hold every worker thread, and a node whose heartbeats go unanswered for `down_after_ms` is
//! taken for dead. Here a plan is started and polled on the query runtime; its batches cross to the
//! caller through a small channel. Dropping the returned stream closes the channel, the driving
//! task stops at its next send, and dropping the plan's stream cancels its work (and the remote
//! fragment calls under it).

use std::future::Future;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;
use tokio::runtime::{Handle, Runtime};

use crate::error::QueryError;

/// Batches in flight between the query runtime and the caller, per stream.
pub const QUERY_STREAM_BUFFER_BATCHES: usize = 2;

/// See the module doc.
pub struct QueryRuntime {
    runtime: Option<Runtime>,
}

impl std::fmt::Debug for QueryRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueryRuntime").finish_non_exhaustive()
    }
}

impl QueryRuntime {
    /// A runtime with `threads` worker threads.
    pub fn new(threads: usize) -> Result<Self, QueryError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("shardwise-query")
            .enable_all()
            .build()
            .map_err(|e| QueryError::Internal(DataFusionError::External(Box::new(e))))?;
        Ok(QueryRuntime { runtime: Some(runtime) })
    }

    fn handle(&self) -> Result<&Handle> {
        self.runtime
            .as_ref()
            .map(Runtime::handle)
            .ok_or_else(|| DataFusionError::Internal("the query runtime has stopped".into()))
    }

    /// Starts `start` (which builds a stream of `schema`) on the query runtime and returns its
    /// batches. An error from `start` is the stream's first item.
    pub fn drive(
        &self,
        schema: SchemaRef,
        start: impl FnOnce() -> Result<SendableRecordBatchStream> + Send + 'static,
    ) -> Result<SendableRecordBatchStream> {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<RecordBatch>>(QUERY_STREAM_BUFFER_BATCHES);
        self.handle()?.spawn(async move {
            let mut stream = match start() {
                Ok(stream) => stream,
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            };
            // Ends as soon as the receiver is gone, not at the next batch: a query whose first
            // batch is its last (a count) would otherwise run to its end for nobody.
            loop {
                let item = tokio::select! {
                    biased;
                    _ = tx.closed() => break,
                    item = stream.next() => item,
                };
                let Some(item) = item else { break };
                if tx.send(item).await.is_err() {
                    break;
                }
            }
        });
        let rows = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, rows)))
    }

    /// Runs `work` on the query runtime and waits for it.
    pub async fn run<T: Send + 'static>(&self, work: impl Future<Output = Result<T>> + Send + 'static) -> Result<T> {
        self.handle()?.spawn(work).await.map_err(|e| DataFusionError::Internal(format!("a query task failed: {e}")))?
    }
}

impl Drop for QueryRuntime {
    fn drop(&mut self) {
        // Dropping a runtime from inside another one blocks, which tokio forbids.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
