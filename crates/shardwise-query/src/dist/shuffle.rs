//! Shuffle aggregation (`distributed_aggregation = 'shuffle'`): partial aggregation states are
//! repartitioned by a hash of the group key to every node, each node merges its bucket, and the
//! initiator only concatenates, so no single node holds every group.
//!
//! Stage 1 runs once per shard on one replica: the partial aggregation over the whole shard, its
//! output cut into `buckets` by [`bucket_of_rows`] and held in this node's [`ExchangeRegistry`]
//! until each bucket has been fetched. Stage 2 is a fragment per bucket whose leaf is a
//! [`ShuffleReaderExec`]: it fetches its bucket from one replica of every shard (through the data
//! plane, also when the replica is on the same node), and the final aggregation above it merges.
//!
//! A bucket is handed out once and then forgotten; a second request for it (a stage-2 fragment
//! that failed part-way and was retried elsewhere) is an error that asks for the query to be
//! retried. Exchanges nobody fetched from (a cancelled query) are dropped after
//! [`SHUFFLE_BUFFER_TTL_MS`]. Buffers are held in memory.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use datafusion::arrow::array::UInt32Array;
use datafusion::arrow::compute::take_record_batch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::hash_utils::create_hashes;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::joins::SeededRandomState;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties};
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};

use super::codec::{LeafAssignment, ShardwiseCodec};
use super::fragment::execute_merged;
use crate::access::TableAccess;
use crate::error::QueryError;
use crate::memory_limit::{explain_memory_errors, with_memory_limit};
use crate::settings;

/// How long an exchange's buffers wait for their fetchers before they are dropped.
pub const SHUFFLE_BUFFER_TTL_MS: u64 = 600_000;

/// Seed of the bucket hash. DataFusion repartitions with seed 0; a different seed keeps a
/// bucket's rows spread when the node that merges it repartitions them over its threads.
const SHUFFLE_HASH_SEED: u64 = 0x5348_5546_464c_4531;

const SHUFFLE_MAGIC: &[u8; 4] = b"SWSB";

/// Splits `batch` by the hash of its first `key_columns` columns into `buckets`.
pub fn bucket_of_rows(batch: &RecordBatch, key_columns: usize, buckets: usize) -> Result<Vec<(usize, RecordBatch)>> {
    let buckets = buckets.max(1);
    if buckets == 1 || batch.num_rows() == 0 {
        return Ok(vec![(0, batch.clone())]);
    }
    let mut hashes = vec![0u64; batch.num_rows()];
    let state = SeededRandomState::with_seed(SHUFFLE_HASH_SEED);
    create_hashes(&batch.columns()[..key_columns.min(batch.num_columns())], state.random_state(), &mut hashes)?;
    let mut indices: Vec<Vec<u32>> = vec![Vec::new(); buckets];
    for (row, hash) in hashes.iter().enumerate() {
        indices[(*hash % buckets as u64) as usize].push(row as u32);
    }
    let mut out = Vec::new();
    for (bucket, rows) in indices.into_iter().enumerate().filter(|(_, rows)| !rows.is_empty()) {
        out.push((bucket, take_record_batch(batch, &UInt32Array::from(rows))?));
    }
    Ok(out)
}

/// One shard feeding a shuffle, and the replicas that can run its stage 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShuffleSource {
    pub shard: u32,
    pub replicas: Vec<u32>,
}

/// A request for one bucket of one shard's stage 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShuffleHeader {
    pub exchange_id: String,
    pub shard: u32,
    pub bucket: u32,
    pub buckets: u32,
    pub key_columns: usize,
    /// The query's `max_memory_usage` (0: no limit), enforced by the node running stage 1.
    #[serde(default)]
    pub max_memory_usage: u64,
}

/// Encodes a bucket request: `SWSB`, u32 header length, JSON header, stage-1 plan bytes.
pub fn encode_shuffle_ticket(header: &ShuffleHeader, stage1: &[u8]) -> Result<Vec<u8>> {
    let json = serde_json::to_vec(header).map_err(|e| DataFusionError::Internal(e.to_string()))?;
    let len = u32::try_from(json.len()).map_err(|_| DataFusionError::Internal("shuffle header over 4 GiB".into()))?;
    let mut out = Vec::with_capacity(8 + json.len() + stage1.len());
    out.extend_from_slice(SHUFFLE_MAGIC);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&json);
    out.extend_from_slice(stage1);
    Ok(out)
}

/// True when `bytes` is a bucket request.
pub fn is_shuffle_ticket(bytes: &[u8]) -> bool {
    bytes.starts_with(SHUFFLE_MAGIC)
}

fn decode_shuffle_ticket(bytes: &[u8]) -> Result<(ShuffleHeader, &[u8])> {
    let bad = |why: &str| DataFusionError::Plan(format!("not a shardwise shuffle ticket: {why}"));
    let rest = bytes.strip_prefix(SHUFFLE_MAGIC.as_slice()).ok_or_else(|| bad("no SWSB magic"))?;
    let (len, rest) = rest.split_first_chunk::<4>().ok_or_else(|| bad("cut short"))?;
    let len = u32::from_le_bytes(*len) as usize;
    if rest.len() < len {
        return Err(bad("header cut short"));
    }
    let header: ShuffleHeader = serde_json::from_slice(&rest[..len]).map_err(|e| bad(&e.to_string()))?;
    if header.buckets == 0 || header.bucket >= header.buckets {
        return Err(bad(&format!("bucket {} of {}", header.bucket, header.buckets)));
    }
    Ok((header, &rest[len..]))
}

type Buckets = Vec<Option<Vec<RecordBatch>>>;

struct Exchange {
    created: Instant,
    stage1: tokio::sync::OnceCell<std::result::Result<Mutex<Buckets>, String>>,
    remaining: AtomicUsize,
}

/// A node's stage-1 outputs waiting to be fetched. See the module doc.
#[derive(Default)]
pub struct ExchangeRegistry {
    entries: Mutex<HashMap<(String, u32), Arc<Exchange>>>,
}

impl fmt::Debug for ExchangeRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.entries.lock().map(|e| e.len()).unwrap_or(0);
        f.debug_struct("ExchangeRegistry").field("exchanges", &n).finish()
    }
}

impl ExchangeRegistry {
    /// Serves one bucket request: runs the shard's stage 1 if this is the first request. `rank`
    /// is this node's, for errors.
    pub async fn fetch(
        &self,
        access: Arc<dyn TableAccess>,
        context: Arc<TaskContext>,
        ticket: &[u8],
        rank: u32,
    ) -> Result<Vec<RecordBatch>> {
        let (header, stage1) = decode_shuffle_ticket(ticket)?;
        let context =
            with_memory_limit(context, header.max_memory_usage).map_err(|e| DataFusionError::External(Box::new(e)))?;
        let exchange = self.entry(&header);
        let buffers = exchange
            .stage1
            .get_or_init(|| async {
                run_stage1(access, context, &header, stage1, rank).await.map(Mutex::new).map_err(|e| e.to_string())
            })
            .await;
        let bucket = match buffers {
            Ok(buffers) => {
                let mut buffers = buffers.lock().unwrap_or_else(|p| p.into_inner());
                buffers.get_mut(header.bucket as usize).and_then(Option::take)
            }
            Err(e) => {
                self.forget(&header);
                return Err(DataFusionError::External(Box::new(QueryError::Unavailable(format!(
                    "shuffle stage 1 of shard {}: {e}",
                    header.shard
                )))));
            }
        };
        if exchange.remaining.fetch_sub(1, Ordering::AcqRel) <= 1 {
            self.forget(&header);
        }
        bucket.ok_or_else(|| {
            DataFusionError::External(Box::new(QueryError::Unavailable(format!(
                "shuffle {} shard {} bucket {} was already fetched (a stage-2 fragment ran twice); retry the query",
                header.exchange_id, header.shard, header.bucket
            ))))
        })
    }

    fn entry(&self, header: &ShuffleHeader) -> Arc<Exchange> {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let ttl = Duration::from_millis(SHUFFLE_BUFFER_TTL_MS);
        entries.retain(|_, e| e.created.elapsed() < ttl);
        let key = (header.exchange_id.clone(), header.shard);
        Arc::clone(entries.entry(key).or_insert_with(|| {
            Arc::new(Exchange {
                created: Instant::now(),
                stage1: tokio::sync::OnceCell::new(),
                remaining: AtomicUsize::new(header.buckets as usize),
            })
        }))
    }

    fn forget(&self, header: &ShuffleHeader) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.remove(&(header.exchange_id.clone(), header.shard));
    }
}

async fn run_stage1(
    access: Arc<dyn TableAccess>,
    context: Arc<TaskContext>,
    header: &ShuffleHeader,
    stage1: &[u8],
    rank: u32,
) -> Result<Buckets> {
    let threads = context.session_config().target_partitions();
    let codec = ShardwiseCodec::for_worker(access, LeafAssignment::WholeShard(header.shard), threads);
    let plan = codec.decode_plan(stage1, &context)?;
    let mut stream = explain_memory_errors(execute_merged(plan, context)?, header.max_memory_usage, rank);
    let mut buckets: Vec<Vec<RecordBatch>> = vec![Vec::new(); header.buckets as usize];
    while let Some(batch) = stream.next().await {
        for (bucket, rows) in bucket_of_rows(&batch?, header.key_columns, header.buckets as usize)? {
            buckets[bucket].push(rows);
        }
    }
    Ok(buckets.into_iter().map(Some).collect())
}

/// Stage 2's leaf: one bucket of every shard's stage 1. See the module doc.
#[derive(Debug, Clone)]
pub struct ShuffleReaderExec {
    pub(crate) exchange_id: String,
    pub(crate) stage1: Arc<Vec<u8>>,
    pub(crate) sources: Vec<ShuffleSource>,
    pub(crate) key_columns: usize,
    /// The bucket this node merges; `None` in the initiator's copy of the plan.
    pub(crate) bucket: Option<u32>,
    pub(crate) buckets: u32,
    schema: SchemaRef,
    access: Arc<dyn TableAccess>,
    cache: Arc<PlanProperties>,
}

impl ShuffleReaderExec {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        exchange_id: String,
        stage1: Arc<Vec<u8>>,
        sources: Vec<ShuffleSource>,
        key_columns: usize,
        bucket: Option<u32>,
        buckets: u32,
        schema: SchemaRef,
        access: Arc<dyn TableAccess>,
    ) -> Self {
        let cache = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        ShuffleReaderExec { exchange_id, stage1, sources, key_columns, bucket, buckets, schema, access, cache }
    }

    /// The same reader, merging `bucket`.
    pub fn for_bucket(&self, bucket: u32) -> Self {
        ShuffleReaderExec { bucket: Some(bucket), ..self.clone() }
    }
}

impl DisplayAs for ShuffleReaderExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ShuffleReaderExec: buckets={}, sources={} shards, key_columns={}",
            self.buckets,
            self.sources.len(),
            self.key_columns
        )
    }
}

impl ExecutionPlan for ShuffleReaderExec {
    plan_node_methods!("ShuffleReaderExec", leaf);

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let max_memory_usage = settings::current(context.session_config().options()).max_memory_usage;
        let bucket = self.bucket.filter(|_| partition == 0).ok_or_else(|| {
            DataFusionError::Internal("ShuffleReaderExec runs on the node that merges a bucket".into())
        })?;
        let reader = self.clone();
        let schema = Arc::clone(&self.schema);
        let fetches = futures::stream::iter(self.sources.clone())
            .then(move |source| {
                let reader = reader.clone();
                async move { reader.fetch(&source, bucket, max_memory_usage).await }
            })
            .map_ok(|batches| futures::stream::iter(batches.into_iter().map(Ok)))
            .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, fetches)))
    }
}

impl ShuffleReaderExec {
    /// One shard's bucket, from its first replica that answers.
    async fn fetch(&self, source: &ShuffleSource, bucket: u32, max_memory_usage: u64) -> Result<Vec<RecordBatch>> {
        let header = ShuffleHeader {
            exchange_id: self.exchange_id.clone(),
            shard: source.shard,
            bucket,
            buckets: self.buckets,
            key_columns: self.key_columns,
            max_memory_usage,
        };
        let ticket = encode_shuffle_ticket(&header, &self.stage1)?;
        let mut errors = Vec::new();
        for rank in &source.replicas {
            match self.access.remote_fragment(*rank, ticket.clone()).await {
                Ok(rows) => match rows.try_collect::<Vec<RecordBatch>>().await {
                    Ok(batches) => {
                        let schema = Arc::clone(&self.schema);
                        return batches
                            .into_iter()
                            .map(|b| Ok(RecordBatch::try_new(Arc::clone(&schema), b.columns().to_vec())?))
                            .collect();
                    }
                    Err(e) => errors.push(format!("rank {rank}: {e}")),
                },
                Err(e) => errors.push(format!("rank {rank}: {e}")),
            }
        }
        Err(DataFusionError::External(Box::new(QueryError::Unavailable(format!(
            "shuffle: no replica of shard {} sent bucket {bucket} ({})",
            source.shard,
            errors.join("; ")
        )))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Array, Int64Array};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    #[test]
    fn buckets_partition_rows_by_key_and_agree_across_calls() {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, true)]));
        let keys = Int64Array::from_iter((0..1000).map(|i| if i % 7 == 0 { None } else { Some(i % 37) }));
        let batch = RecordBatch::try_new(schema, vec![Arc::new(keys)]).expect("batch");
        let a = bucket_of_rows(&batch, 1, 3).expect("buckets");
        let b = bucket_of_rows(&batch.slice(0, 500), 1, 3).expect("buckets");
        assert_eq!(a.iter().map(|(_, r)| r.num_rows()).sum::<usize>(), 1000);
        // Each key lands in one bucket, the same one for any batch it is in.
        let mut home: HashMap<Option<i64>, usize> = HashMap::new();
        for (bucket, rows) in a.iter().chain(&b) {
            let col = rows.column(0).as_any().downcast_ref::<Int64Array>().expect("int64");
            for i in 0..col.len() {
                let key = col.is_valid(i).then(|| col.value(i));
                assert_eq!(*home.entry(key).or_insert(*bucket), *bucket, "key {key:?}");
            }
        }
        assert!(home.values().collect::<std::collections::HashSet<_>>().len() == 3);
    }

    #[test]
    fn tickets_round_trip_and_bad_buckets_are_errors() {
        let header = ShuffleHeader {
            exchange_id: "x".into(),
            shard: 1,
            bucket: 2,
            buckets: 3,
            key_columns: 1,
            max_memory_usage: 0,
        };
        let bytes = encode_shuffle_ticket(&header, &[9, 9]).expect("encode");
        assert!(is_shuffle_ticket(&bytes));
        let (back, plan) = decode_shuffle_ticket(&bytes).expect("decode");
        assert_eq!((back, plan), (header.clone(), &[9u8, 9][..]));
        let bad = encode_shuffle_ticket(&ShuffleHeader { bucket: 3, ..header }, &[]).expect("encode");
        assert!(decode_shuffle_ticket(&bad).expect_err("bucket 3 of 3").to_string().contains("bucket 3 of 3"));
        assert!(decode_shuffle_ticket(&bytes[..6]).is_err());
    }
}
