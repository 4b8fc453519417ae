//! The query runtime: a tokio runtime of its own for executing plans, apart from the one that
//! serves the network and runs the cluster's heartbeats.
//!
//! DataFusion runs CPU-bound operators inside async tasks. On a shared runtime a long query would
//! hold every worker thread, and a node whose heartbeats go unanswered for `down_after_ms` is
//! taken for dead. Here a plan is started and polled on the query runtime; its batches cross to the
//! caller through a small channel. Dropping the returned stream closes the channel, the driving
//! task stops at its next send, and dropping the plan's stream cancels its work (and the remote
//! fragment calls under it). A panic while driving the plan ends the stream with an error, never
//! as if its rows were all there.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::{FutureExt, StreamExt};
use tokio::runtime::{Handle, Runtime};

use crate::error::QueryError;

/// Runs `work` (planning a statement) to completion on the calling thread, with
/// the runtime worker it occupied handed to another thread first (`block_in_place`), on a
/// multi-threaded runtime; elsewhere (a test's runtime) it is awaited as it is.
///
/// Why: planning a large statement (an `INSERT` of 100 000 rows in its text) holds its thread for
/// seconds, and a task queued behind it on that worker (the heartbeat acknowledgement a peer
/// waits for) waited as long: the peer took the node for dead. The worker's queue goes to another
/// thread; the planning keeps its thread, and its stack. `work` cannot be stopped once started
/// (dropping the caller's future waits for it): only for work that ends by itself.
pub async fn with_worker_freed<T>(work: impl Future<Output = T>) -> T {
    match Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(|| handle.block_on(work))
        }
        _ => work.await,
    }
}

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
            // Deep expressions recurse (see `crate::ast_limits`).
            .thread_stack_size(crate::ast_limits::QUERY_THREAD_STACK_BYTES)
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
        let failed = tx.clone();
        // Set once the task has sent the stream's last item; a channel that closes before it
        // (the task cancelled: the runtime stopping with the node) ends the rows with an error.
        let finished = Arc::new(AtomicBool::new(false));
        let (ended, panic_ended) = (Arc::clone(&finished), Arc::clone(&finished));
        let drive = async move {
            let mut stream = match start() {
                Ok(stream) => stream,
                Err(e) => {
                    ended.store(true, Ordering::Release);
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
                let Some(item) = item else {
                    ended.store(true, Ordering::Release);
                    break;
                };
                if tx.send(item).await.is_err() {
                    break;
                }
            }
        };
        // A panic in the plan (a function's bug) ends the task: its channel would close as at
        // the end of the rows, and the caller (a remote initiator too) would take a part of the
        // answer for the whole. It is the stream's last item instead, an error.
        self.handle()?.spawn(async move {
            if let Err(panic) = std::panic::AssertUnwindSafe(drive).catch_unwind().await {
                panic_ended.store(true, Ordering::Release);
                let _ = failed.send(Err(panicked(panic.as_ref()))).await;
            }
        });
        let rows = futures::stream::unfold(Some(rx), move |rx| {
            let finished = Arc::clone(&finished);
            async move {
                let mut rx = rx?;
                match rx.recv().await {
                    Some(item) => Some((item, Some(rx))),
                    None if finished.load(Ordering::Acquire) => None,
                    None => Some((Err(stopped()), None)),
                }
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, rows)))
    }

    /// Runs `work` on the query runtime and waits for it.
    pub async fn run<T: Send + 'static>(&self, work: impl Future<Output = Result<T>> + Send + 'static) -> Result<T> {
        self.handle()?.spawn(work).await.map_err(|e| DataFusionError::Internal(format!("a query task failed: {e}")))?
    }
}

/// The error for rows cut short because the query runtime stopped (the node is stopping).
fn stopped() -> DataFusionError {
    DataFusionError::External(Box::new(QueryError::Unavailable(
        "the node stopped running this query before its end".to_string(),
    )))
}

/// The error for a panic whose payload is `panic`: a bug, with its message.
pub fn panicked(panic: &(dyn std::any::Any + Send)) -> DataFusionError {
    let message = panic
        .downcast_ref::<&str>()
        .map(|m| (*m).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_string());
    DataFusionError::Internal(format!("a query task panicked: {message}"))
}

impl Drop for QueryRuntime {
    fn drop(&mut self) {
        // Dropping a runtime from inside another one blocks, which tokio forbids.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    #[test]
    fn a_task_queued_behind_long_planning_runs_meanwhile() {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("rt");
        let waited = runtime.block_on(async {
            tokio::spawn(async {
                // Spawned from this worker, the task waits in its slot until the worker is free.
                let queued_at = std::time::Instant::now();
                let beat = tokio::spawn(async move { queued_at.elapsed() });
                with_worker_freed(async { std::thread::sleep(std::time::Duration::from_millis(1500)) }).await;
                beat.await
            })
            .await
        });
        let waited = waited.expect("task").expect("beat");
        assert!(waited < std::time::Duration::from_millis(1000), "the queued task waited {waited:?}");
    }

    #[tokio::test]
    async fn rows_cut_short_by_a_stopping_runtime_end_with_an_error() {
        let runtime = QueryRuntime::new(1).expect("runtime");
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        let plan_schema = Arc::clone(&schema);
        // A plan that never ends, then the runtime stops under it.
        let stream = runtime
            .drive(Arc::clone(&schema), move || {
                let endless = futures::stream::pending::<Result<RecordBatch>>();
                Ok(Box::pin(RecordBatchStreamAdapter::new(plan_schema, endless)) as SendableRecordBatchStream)
            })
            .expect("driven");
        drop(runtime);
        let items: Vec<Result<RecordBatch>> = stream.collect().await;
        assert_eq!(items.len(), 1, "an error, not an empty answer");
        let e = items[0].as_ref().expect_err("cut short");
        assert!(e.to_string().contains("stopped running this query"), "{e}");
    }

    #[tokio::test]
    async fn a_panic_in_the_plan_ends_the_rows_with_an_error() {
        let runtime = QueryRuntime::new(1).expect("runtime");
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        let batch =
            RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(Int64Array::from(vec![1]))]).expect("batch");
        let rows = futures::stream::iter(0..3).map(move |i| {
            assert!(i < 1, "a function's bug");
            Ok(batch.clone())
        });
        let plan_schema = Arc::clone(&schema);
        let stream = runtime
            .drive(Arc::clone(&schema), move || {
                Ok(Box::pin(RecordBatchStreamAdapter::new(plan_schema, rows)) as SendableRecordBatchStream)
            })
            .expect("driven");
        let items: Vec<Result<RecordBatch>> = stream.collect().await;
        assert_eq!(items.len(), 2, "one batch, then the error");
        let e = items[1].as_ref().expect_err("the panic");
        assert!(e.to_string().contains("a query task panicked: a function's bug"), "{e}");
    }
}
