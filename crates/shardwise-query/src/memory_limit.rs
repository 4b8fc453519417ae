//! `max_memory_usage`: how much memory one query may take on each node, as in ClickHouse.
//!
//! A query with a limit runs with a memory pool of its own of that many bytes, on the initiator
//! and in every fragment and shuffle stage it sends to other nodes (the limit travels in their
//! tickets). DataFusion's operators reserve from that pool: those that can spill to disk (sorts,
//! the final stage of an aggregation) do so under pressure, in the node's temporary directory,
//! the partial stage of an aggregation passes its groups on early, and the rest (a hash join's
//! build side, windows) fail the query. The error names the setting, the limit and the node.
//! A sort's up-front reservation for merging spilled runs is capped at a tenth of the limit.
//!
//! The pool is DataFusion's `FairSpillPool` (spilling operators share what the others leave),
//! wrapped in `TrackConsumersPool` so the error lists the largest consumers, and held inside the
//! node's pool (`max_server_memory_usage`, `crate::server_memory`): a reservation must fit both.
//! 0 (the default) means no limit of the query's own: the node's pool alone.

use std::num::NonZeroUsize;
use std::sync::Arc;

use datafusion::error::DataFusionError;
use datafusion::execution::memory_pool::{FairSpillPool, TrackConsumersPool};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::TryStreamExt;

use crate::error::QueryError;
use crate::server_memory::{SERVER_MEMORY_ERROR, Within};

/// Under a limit, a sort's merge reservation is at most this fraction (1/n) of it.
const SORT_MERGE_SHARE: usize = 10;

/// How many of the largest memory consumers an out-of-memory error lists.
const CONSUMERS_LISTED: usize = 3;

/// `context` for one query whose memory on this node is limited to `max_memory_usage` bytes;
/// `context` itself when the limit is 0.
pub fn with_memory_limit(context: Arc<TaskContext>, max_memory_usage: u64) -> Result<Arc<TaskContext>, QueryError> {
    if max_memory_usage == 0 {
        return Ok(context);
    }
    let bytes = usize::try_from(max_memory_usage).unwrap_or(usize::MAX);
    let top = NonZeroUsize::new(CONSUMERS_LISTED).unwrap_or(NonZeroUsize::MIN);
    let query = Arc::new(TrackConsumersPool::new(FairSpillPool::new(bytes), top));
    let pool = Arc::new(Within { query, node: Arc::clone(context.memory_pool()) });
    let runtime =
        RuntimeEnvBuilder::from_runtime_env(&context.runtime_env()).with_memory_pool(pool).build_arc().map_err(
            |e| QueryError::Internal(DataFusionError::Internal(format!("cannot limit the query's memory: {e}"))),
        )?;
    // A sort reserves this much up front for merging its spilled runs (10 MB by default): more
    // than a small limit holds. A tenth of the limit leaves the rest to the operators.
    let mut config = context.session_config().clone();
    let execution = &mut config.options_mut().execution;
    execution.sort_spill_reservation_bytes = execution.sort_spill_reservation_bytes.min(bytes / SORT_MERGE_SHARE);
    Ok(with_config_and_runtime(&context, config, runtime))
}

/// `context` with another configuration and runtime environment, the rest (ids, functions) kept.
pub(crate) fn with_config_and_runtime(
    context: &TaskContext,
    config: datafusion::execution::config::SessionConfig,
    runtime: Arc<datafusion::execution::runtime_env::RuntimeEnv>,
) -> Arc<TaskContext> {
    Arc::new(TaskContext::new(
        context.task_id(),
        context.session_id(),
        config,
        context.scalar_functions().clone(),
        context.higher_order_functions().clone(),
        context.aggregate_functions().clone(),
        context.window_functions().clone(),
        runtime,
    ))
}

/// The rows of `stream`, with an out-of-memory error turned into one that names the limit it
/// met: `max_memory_usage` (its value and the node, `rank`), a refusal of the statement as
/// written, or the node's `max_server_memory_usage` (whose error says so already), a refusal for
/// now (`unavailable`).
pub fn explain_memory_errors(
    stream: SendableRecordBatchStream,
    max_memory_usage: u64,
    rank: u32,
) -> SendableRecordBatchStream {
    let schema = stream.schema();
    let mapped = stream.map_err(move |e| match e.find_root() {
        // What the other queries hold now: the same statement may run once they end (HTTP 503,
        // not a 400 a client does not retry).
        DataFusionError::ResourcesExhausted(detail) if detail.contains(SERVER_MEMORY_ERROR) => {
            DataFusionError::External(Box::new(QueryError::Unavailable(server_detail(detail))))
        }
        DataFusionError::ResourcesExhausted(detail) if max_memory_usage > 0 => {
            DataFusionError::External(Box::new(QueryError::Rejected(memory_message(max_memory_usage, rank, detail))))
        }
        _ => e,
    });
    Box::pin(RecordBatchStreamAdapter::new(schema, mapped))
}

/// The node pool's own words, from where they start in `detail` (a wrapping pool may put its
/// list of consumers after them).
fn server_detail(detail: &str) -> String {
    detail.find(SERVER_MEMORY_ERROR).map_or(detail, |at| &detail[at..]).to_string()
}

fn memory_message(max_memory_usage: u64, rank: u32, detail: &str) -> String {
    format!(
        "the query needs more memory on rank {rank} than max_memory_usage = {max_memory_usage} bytes allows, even \
         with the operators that can spill to disk doing so ({detail}); raise max_memory_usage, or set it to 0 for \
         no limit"
    )
}

#[cfg(test)]
mod tests {
    use datafusion::execution::memory_pool::MemoryConsumer;

    use super::*;

    #[test]
    fn a_limited_context_refuses_more_than_the_limit_and_zero_means_none() {
        let base = Arc::new(TaskContext::default());
        let limited = with_memory_limit(Arc::clone(&base), 1024 * 1024).expect("context");
        let r = MemoryConsumer::new("test").register(limited.memory_pool());
        assert!(r.try_grow(512 * 1024).is_ok());
        let err = r.try_grow(1024 * 1024).expect_err("over the limit");
        assert!(matches!(err.find_root(), DataFusionError::ResourcesExhausted(_)), "{err}");
        let same = with_memory_limit(Arc::clone(&base), 0).expect("context");
        assert!(Arc::ptr_eq(&same, &base));
    }

    #[test]
    fn the_message_names_the_setting_the_limit_and_the_rank() {
        let m = memory_message(4096, 2, "Failed to allocate");
        assert!(m.contains("max_memory_usage = 4096") && m.contains("rank 2") && m.contains("Failed to allocate"));
    }
}
