//! Memory for rows that arrive from other nodes, reserved as they arrive.
//!
//! DataFusion's operators reserve what they keep (a hash table, its accumulators), not the
//! batches they are handed. A batch from a local scan is small and its memory is the table's;
//! a batch from another node is decoded in full before any operator sees it, and it can be
//! large: a shard's partial `array_agg` state of one group is one row holding every value of the
//! group. Unreserved, such batches took an initiator to 7.5 GB resident under a 3.5 GB
//! `max_server_memory_usage` (20 M rows, `array_agg(repeat(s, 20))` by ten keys, 2026-12-05)
//! before anything asked the pool for memory. Here each stream of received rows holds a
//! reservation the size of the batch it last handed on, until the next one arrives or the
//! stream ends, so a batch that does not fit beside what the node holds fails the query with
//! the pool's error (the setting, its value, the node) as soon as it arrives.

use std::sync::Arc;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::Result;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool};
use futures::StreamExt;
use futures::stream::BoxStream;

/// `rows` with each batch's memory reserved from `pool` under `consumer` while it is the last
/// one handed on (see the module doc). A batch the pool refuses ends the stream with its error.
pub fn reserved(
    rows: BoxStream<'static, Result<RecordBatch>>,
    pool: &Arc<dyn MemoryPool>,
    consumer: String,
) -> BoxStream<'static, Result<RecordBatch>> {
    let reservation = MemoryConsumer::new(consumer).register(pool);
    let mut failed = false;
    rows.map(move |batch| {
        let batch = batch?;
        reservation.try_resize(shardwise_storage::row_bytes(&batch))?;
        Ok(batch)
    })
    // After an error the stream ends: what follows a refusal would be read past it.
    .take_while(move |batch| {
        let go_on = !failed;
        failed |= batch.is_err();
        futures::future::ready(go_on)
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::error::DataFusionError;
    use datafusion::execution::memory_pool::GreedyMemoryPool;

    fn batch(rows: usize) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)]));
        RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from_iter_values(0..rows as i64))]).expect("batch")
    }

    fn stream_of(batches: Vec<RecordBatch>) -> BoxStream<'static, Result<RecordBatch>> {
        futures::stream::iter(batches.into_iter().map(Ok)).boxed()
    }

    #[tokio::test]
    async fn holds_the_last_batch_handed_on_and_frees_it_when_dropped() {
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(10_000));
        let mut rows = reserved(stream_of(vec![batch(100), batch(10)]), &pool, "test".into());
        assert_eq!(rows.next().await.expect("first").expect("fits").num_rows(), 100);
        assert_eq!(pool.reserved(), 800);
        assert_eq!(rows.next().await.expect("second").expect("fits").num_rows(), 10);
        assert_eq!(pool.reserved(), 80, "the reservation follows the last batch, it does not add up");
        assert!(rows.next().await.is_none());
        drop(rows);
        assert_eq!(pool.reserved(), 0);
    }

    #[tokio::test]
    async fn a_batch_that_does_not_fit_fails_the_stream_with_the_pools_error() {
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1_000));
        let mut rows = reserved(stream_of(vec![batch(100), batch(200), batch(1)]), &pool, "rows from rank 1".into());
        assert!(rows.next().await.expect("first").is_ok());
        let err = rows.next().await.expect("second").expect_err("1600 bytes do not fit in 1000");
        assert!(matches!(err.find_root(), DataFusionError::ResourcesExhausted(_)), "{err}");
        assert!(err.to_string().contains("rows from rank 1"), "{err}");
        assert!(rows.next().await.is_none(), "nothing after the refusal");
    }

    #[tokio::test]
    async fn errors_from_the_sender_pass_through() {
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1_000));
        let failing = futures::stream::iter(vec![Err(DataFusionError::Execution("rank 2 went away".into()))]).boxed();
        let mut rows = reserved(failing, &pool, "test".into());
        let err = rows.next().await.expect("an item").expect_err("the sender's error");
        assert!(err.to_string().contains("rank 2 went away"), "{err}");
        assert_eq!(pool.reserved(), 0);
    }
}
