//! Stopping a query's work once nobody waits for its rows: the client went away, `KILL QUERY`,
//! `max_execution_time_ms`.
//!
//! Dropping a query's stream drops the tasks DataFusion spawned for it, but a tokio task ends only
//! at its next yield, and an operator over in-memory input can compute for a long time without
//! one: a nested-loop join of two 200 000-row inputs went on for 80 s of CPU after its query had
//! been stopped. So each query's task context carries a [`StopFlag`], set when the query's stream
//! is dropped ([`stop_on_drop`]), and shardwise's leaf operators (shard scans, fragments) check it
//! before every batch they hand out ([`stop_checked`]): the operators above them end at their next
//! input batch, with an error nobody reads.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use futures::{Stream, StreamExt};

/// Set once the query it belongs to is stopped.
#[derive(Debug, Default)]
pub struct StopFlag(AtomicBool);

impl StopFlag {
    /// The flag of the query `context` runs, if it has one.
    pub fn of(context: &TaskContext) -> Option<Arc<StopFlag>> {
        context.session_config().get_extension::<StopFlag>()
    }

    pub fn stop(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn is_stopped(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// `context` with a stop flag of its own, and the flag.
pub fn with_stop_flag(context: Arc<TaskContext>) -> (Arc<TaskContext>, Arc<StopFlag>) {
    let flag = Arc::new(StopFlag::default());
    let config = context.session_config().clone().with_extension(Arc::clone(&flag));
    (crate::memory_limit::with_config_and_runtime(&context, config, context.runtime_env()), flag)
}

/// `stream`, ending with an error at its next batch once the query of `context` is stopped.
pub fn stop_checked(stream: SendableRecordBatchStream, context: &TaskContext) -> SendableRecordBatchStream {
    match StopFlag::of(context) {
        Some(flag) => Box::pin(Checked { inner: stream, flag, ended: false }),
        None => stream,
    }
}

/// `stream`, stopping its query (`flag`) when it is dropped.
pub fn stop_on_drop(stream: SendableRecordBatchStream, flag: Arc<StopFlag>) -> SendableRecordBatchStream {
    Box::pin(StopOnDrop { inner: stream, flag })
}

struct Checked {
    inner: SendableRecordBatchStream,
    flag: Arc<StopFlag>,
    ended: bool,
}

impl Stream for Checked {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.ended {
            return Poll::Ready(None);
        }
        if self.flag.is_stopped() {
            self.ended = true;
            return Poll::Ready(Some(Err(DataFusionError::Execution("the query was stopped".into()))));
        }
        self.inner.poll_next_unpin(cx)
    }
}

impl RecordBatchStream for Checked {
    fn schema(&self) -> SchemaRef {
        self.inner.schema()
    }
}

struct StopOnDrop {
    inner: SendableRecordBatchStream,
    flag: Arc<StopFlag>,
}

impl Stream for StopOnDrop {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.poll_next_unpin(cx)
    }
}

impl RecordBatchStream for StopOnDrop {
    fn schema(&self) -> SchemaRef {
        self.inner.schema()
    }
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.flag.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_plan::stream::RecordBatchStreamAdapter;

    fn endless(schema: SchemaRef) -> SendableRecordBatchStream {
        let batch = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(Int64Array::from(vec![1]))]).ok();
        let batches = futures::stream::repeat_with(move || {
            batch.clone().ok_or_else(|| DataFusionError::Internal("no test batch".into()))
        });
        Box::pin(RecordBatchStreamAdapter::new(schema, batches))
    }

    fn schema_of_n() -> SchemaRef {
        Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)]))
    }

    #[tokio::test]
    async fn a_leaf_ends_once_the_stream_of_its_query_is_dropped() {
        let schema = schema_of_n();
        let (context, flag) = with_stop_flag(Arc::new(TaskContext::default()));
        let mut leaf = stop_checked(endless(Arc::clone(&schema)), &context);
        assert!(matches!(leaf.next().await, Some(Ok(_))));
        let query = stop_on_drop(endless(schema), flag);
        drop(query);
        assert!(matches!(leaf.next().await, Some(Err(e)) if e.to_string().contains("stopped")));
        assert!(leaf.next().await.is_none());
        // Without a flag in its context, a leaf is left as it is.
        let plain = stop_checked(endless(schema_of_n()), &TaskContext::default());
        assert!(StopFlag::of(&TaskContext::default()).is_none());
        drop(plain);
    }
}
