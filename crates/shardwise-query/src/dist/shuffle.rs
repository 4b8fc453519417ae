//! Shuffle aggregation (`distributed_aggregation = 'shuffle'`): partial aggregation states are
//! repartitioned by a hash of the group key to the merging nodes, each merges its bucket, and the
//! initiator only concatenates, so no single node holds every group. From
//! `SHUFFLE_INITIATOR_FREE_MIN_NODES` nodes on, the initiator merges no bucket, so its memory
//! stays flat however many groups there are.
//!
//! Stage 1 runs once per shard on one replica: the partial aggregation over the whole shard, its
//! output cut into `buckets` by [`bucket_of_rows`]. It is started by the first request for one
//! of its buckets, and streams: each bucket is a channel of [`SHUFFLE_BUCKET_BUFFER_BATCHES`]
//! batches to the node merging it, so stage 1 runs at the pace of its fetchers and holds no more
//! than that. Stage 2 is a fragment per bucket whose leaf is a [`ShuffleReaderExec`]: it fetches
//! its bucket from one replica of every shard at once (through the data plane, also when the
//! replica is on the same node), and the final aggregation above it merges.
//!
//! A bucket is handed out once; a second request for it (a stage-2 fragment that failed part-way
//! and was retried elsewhere) is an error that asks for the query to be retried. A fetcher that
//! goes away (a cancelled query) closes its channel and stage 1 stops sending to it, and stops
//! altogether once no bucket is wanted. A bucket nobody claims within
//! [`SHUFFLE_UNCLAIMED_BUCKET_MS`] is dropped, so stage 1 never waits on it for good.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use datafusion::arrow::array::UInt32Array;
use datafusion::arrow::compute::take_record_batch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::hash_utils::create_hashes;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::MemoryPool;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::joins::SeededRandomState;
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties};
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::codec::{LeafAssignment, ShardwiseCodec};
use super::fragment::execute_merged;
use crate::access::TableAccess;
use crate::error::QueryError;
use crate::memory_limit::{explain_memory_errors, with_memory_limit};
use crate::settings;

/// How long an exchange is kept at most, whatever its state (a backstop: buckets nobody claims
/// expire after [`SHUFFLE_UNCLAIMED_BUCKET_MS`]).
pub const SHUFFLE_BUFFER_TTL_MS: u64 = 600_000;

/// Batches buffered per bucket between a shard's stage 1 and the node merging the bucket: stage
/// 1 runs at the pace of its slowest fetcher, and holds no more than this.
pub const SHUFFLE_BUCKET_BUFFER_BATCHES: usize = 4;

/// A bucket nobody has asked for this long after its stage 1 started is dropped (its query
/// failed or was cancelled), so that stage 1 does not wait on it for good. The default of
/// [`ExchangeRegistry`]; [`ExchangeRegistry::with_unclaimed_bucket_ms`] sets another.
pub const SHUFFLE_UNCLAIMED_BUCKET_MS: u64 = 60_000;

/// How often, at most, a stage 1 waiting for room in a bucket checks whether the bucket was ever
/// claimed (a quarter of the expiry when that is shorter).
const SHUFFLE_UNCLAIMED_CHECK_MS: u64 = 1_000;

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
    /// Send stage 1's plan with metrics after the bucket's last row (`EXPLAIN ANALYZE`; asked
    /// with bucket 0 only, so that each stage 1 is reported once).
    #[serde(default)]
    pub report: bool,
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

/// Bucket 0 of 2 of shard 0, keyed by one column, no limit, no report.
#[cfg(test)]
pub(crate) fn test_header(exchange_id: &str) -> ShuffleHeader {
    ShuffleHeader {
        exchange_id: exchange_id.into(),
        shard: 0,
        bucket: 0,
        buckets: 2,
        key_columns: 1,
        max_memory_usage: 0,
        report: false,
    }
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

/// A bucket's rows on their way from stage 1 to the node that merges them.
type BucketRows = mpsc::Receiver<Result<RecordBatch>>;

/// Where one bucket of an exchange stands.
enum Slot {
    /// Stage 1 is filling it; nobody has asked for it yet.
    Waiting(BucketRows),
    /// Handed out to its fetcher.
    Taken,
    /// Nobody asked for it within the registry's expiry; its rows were dropped.
    Expired,
}

struct Exchange {
    created: Instant,
    /// A bucket still unclaimed this long after `created` expires.
    unclaimed_expiry: Duration,
    state: Mutex<ExchangeState>,
}

#[derive(Default)]
struct ExchangeState {
    /// Stage 1's output schema, once the first request has started it.
    schema: Option<SchemaRef>,
    /// Stage 1's plan, for its report.
    plan: Option<Arc<dyn ExecutionPlan>>,
    slots: Vec<Slot>,
}

impl Exchange {
    fn new(unclaimed_expiry: Duration) -> Self {
        Exchange { created: Instant::now(), unclaimed_expiry, state: Mutex::default() }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ExchangeState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Expires `bucket` if it is still unclaimed after the exchange's expiry; true when stage 1
    /// should stop sending to it.
    fn expire_if_unclaimed(&self, bucket: usize) -> bool {
        let mut state = self.state();
        let slots = &mut state.slots;
        match slots.get(bucket) {
            Some(Slot::Taken) => false,
            Some(Slot::Waiting(_)) if self.created.elapsed() < self.unclaimed_expiry => false,
            _ => {
                if let Some(slot) = slots.get_mut(bucket) {
                    *slot = Slot::Expired;
                }
                true
            }
        }
    }
}

/// A node's shuffle exchanges: stage 1 of each (query, shard) running here, and its buckets
/// waiting for their fetchers. See the module doc.
pub struct ExchangeRegistry {
    entries: Mutex<HashMap<(String, u32), Arc<Exchange>>>,
    /// See [`SHUFFLE_UNCLAIMED_BUCKET_MS`].
    unclaimed_bucket_ms: u64,
}

impl Default for ExchangeRegistry {
    fn default() -> Self {
        ExchangeRegistry::with_unclaimed_bucket_ms(SHUFFLE_UNCLAIMED_BUCKET_MS)
    }
}

impl fmt::Debug for ExchangeRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.entries.lock().map(|e| e.len()).unwrap_or(0);
        f.debug_struct("ExchangeRegistry").field("exchanges", &n).finish()
    }
}

impl ExchangeRegistry {
    /// A registry whose unclaimed buckets expire after `unclaimed_bucket_ms` (at least 1).
    pub fn with_unclaimed_bucket_ms(unclaimed_bucket_ms: u64) -> Self {
        ExchangeRegistry { entries: Mutex::default(), unclaimed_bucket_ms: unclaimed_bucket_ms.max(1) }
    }

    /// Serves one bucket request: starts the shard's stage 1 if this is the first request, and
    /// returns the bucket's rows as stage 1 produces them, with stage 1's plan when the request
    /// asks for its report (its metrics are final once the bucket's rows have ended). Must run
    /// on the runtime stage 1 is to run on. `rank` is this node's, for errors.
    pub fn fetch(
        &self,
        access: Arc<dyn TableAccess>,
        context: Arc<TaskContext>,
        ticket: &[u8],
        rank: u32,
    ) -> Result<(SendableRecordBatchStream, Option<Arc<dyn ExecutionPlan>>)> {
        let (header, stage1) = decode_shuffle_ticket(ticket)?;
        let exchange = self.entry(&header);
        let (slot, schema, done, report) = {
            let mut state = exchange.state();
            if state.schema.is_none() {
                let context = with_memory_limit(context, header.max_memory_usage)
                    .map_err(|e| DataFusionError::External(Box::new(e)))?;
                let threads = context.session_config().target_partitions();
                let leaf = LeafAssignment::WholeShard(header.shard);
                let plan = ShardwiseCodec::for_worker(access, leaf, threads).decode_plan(stage1, &context)?;
                let mut senders = Vec::with_capacity(header.buckets as usize);
                for _ in 0..header.buckets {
                    let (tx, rx) = mpsc::channel(SHUFFLE_BUCKET_BUFFER_BATCHES);
                    senders.push(Some(tx));
                    state.slots.push(Slot::Waiting(rx));
                }
                state.schema = Some(plan.schema());
                state.plan = Some(Arc::clone(&plan));
                let stage = Stage1 { context, header: header.clone(), rank, exchange: Arc::clone(&exchange) };
                tokio::spawn(stage.run(plan, senders));
            }
            let slot = state.slots.get_mut(header.bucket as usize).map(|s| std::mem::replace(s, Slot::Taken));
            let done = state.slots.iter().all(|s| !matches!(s, Slot::Waiting(_)));
            let report = state.plan.clone().filter(|_| header.report);
            (slot, state.schema.clone(), done, report)
        };
        if done {
            self.forget(&header);
        }
        let gone = |why: &str| {
            DataFusionError::External(Box::new(QueryError::Unavailable(format!(
                "shuffle {} shard {} bucket {} {why}; retry the query",
                header.exchange_id, header.shard, header.bucket
            ))))
        };
        let rows = match slot {
            Some(Slot::Waiting(rows)) => rows,
            Some(Slot::Taken) => return Err(gone("was already fetched (a stage-2 fragment ran twice)")),
            Some(Slot::Expired) => {
                return Err(gone(&format!("expired unclaimed after {} ms", self.unclaimed_bucket_ms)));
            }
            None => return Err(gone("does not exist")),
        };
        let schema = schema.ok_or_else(|| DataFusionError::Internal("shuffle exchange without a schema".into()))?;
        let rows = futures::stream::unfold(rows, |mut rows| async move { rows.recv().await.map(|r| (r, rows)) });
        Ok((Box::pin(RecordBatchStreamAdapter::new(schema, rows)), report))
    }

    fn entry(&self, header: &ShuffleHeader) -> Arc<Exchange> {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let ttl = Duration::from_millis(SHUFFLE_BUFFER_TTL_MS);
        entries.retain(|_, e| e.created.elapsed() < ttl);
        let key = (header.exchange_id.clone(), header.shard);
        Arc::clone(
            entries
                .entry(key)
                .or_insert_with(|| Arc::new(Exchange::new(Duration::from_millis(self.unclaimed_bucket_ms)))),
        )
    }

    fn forget(&self, header: &ShuffleHeader) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.remove(&(header.exchange_id.clone(), header.shard));
    }
}

/// One shard's stage 1, running on this node.
struct Stage1 {
    context: Arc<TaskContext>,
    header: ShuffleHeader,
    rank: u32,
    exchange: Arc<Exchange>,
}

impl Stage1 {
    /// Runs the partial aggregation and sends each batch's rows to their buckets, at the pace of
    /// the fetchers; stops early once no bucket is wanted. An error ends every bucket with it.
    async fn run(self, plan: Arc<dyn ExecutionPlan>, mut senders: Vec<Option<mpsc::Sender<Result<RecordBatch>>>>) {
        if let Err(e) = self.send_all(plan, &mut senders).await {
            let message = format!("shuffle stage 1 of shard {} on rank {}: {e}", self.header.shard, self.rank);
            let user_error = QueryError::is_user_error_of(&e);
            for tx in senders.iter().flatten() {
                let _ = tx.send(Err(classed(user_error, message.clone()))).await;
            }
        }
    }

    async fn send_all(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        senders: &mut [Option<mpsc::Sender<Result<RecordBatch>>>],
    ) -> Result<()> {
        let limit = self.header.max_memory_usage;
        let mut stream = explain_memory_errors(execute_merged(plan, Arc::clone(&self.context))?, limit, self.rank);
        let (key_columns, buckets) = (self.header.key_columns, self.header.buckets as usize);
        while let Some(batch) = stream.next().await {
            for (bucket, rows) in bucket_of_rows(&batch?, key_columns, buckets)? {
                self.send(senders, bucket, rows).await;
            }
            if senders.iter().all(Option::is_none) {
                return Ok(()); // nobody wants the rest: dropping the stream stops the plan
            }
        }
        Ok(())
    }

    /// Sends `rows` to `bucket`, waiting for room; gives the bucket up when its fetcher went
    /// away, or never came.
    async fn send(&self, senders: &mut [Option<mpsc::Sender<Result<RecordBatch>>>], bucket: usize, rows: RecordBatch) {
        let Some(tx) = senders.get(bucket).and_then(Option::as_ref) else { return };
        let check = Duration::from_millis(SHUFFLE_UNCLAIMED_CHECK_MS).min(self.exchange.unclaimed_expiry / 4);
        let dead = loop {
            match tokio::time::timeout(check, tx.reserve()).await {
                Ok(Ok(permit)) => {
                    permit.send(Ok(rows));
                    break false;
                }
                Ok(Err(_closed)) => break true,
                Err(_waited) if self.exchange.expire_if_unclaimed(bucket) => break true,
                Err(_waited) => {}
            }
        };
        if dead && let Some(slot) = senders.get_mut(bucket) {
            *slot = None;
        }
    }
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
    /// Ask each shard for its stage-1 report (the bucket's fragment is reported).
    report_stage1: bool,
    /// The stage-1 reports asked for: (shard, rank, filled after the bucket's last row).
    stage1_reports: Arc<Mutex<Vec<(u32, u32, crate::access::FragmentReport)>>>,
    schema: SchemaRef,
    access: Arc<dyn TableAccess>,
    cache: Arc<PlanProperties>,
    /// Rows and bytes received from the shards' stage 1 (the exchange).
    metrics: ExecutionPlanMetricsSet,
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
        ShuffleReaderExec {
            exchange_id,
            stage1,
            sources,
            key_columns,
            bucket,
            buckets,
            report_stage1: false,
            stage1_reports: Arc::default(),
            schema,
            access,
            cache,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    /// Rows and bytes this reader received from the shards so far.
    pub fn received(&self) -> (u64, u64) {
        let metrics = self.metrics.clone_inner();
        let rows = metrics.output_rows().unwrap_or(0) as u64;
        let bytes = metrics.sum_by_name("bytes_received").map(|v| v.as_usize()).unwrap_or(0) as u64;
        (rows, bytes)
    }

    /// The same reader, asking (or not) for the stage-1 reports of the shards it reads. Only
    /// the reader of bucket 0 asks: each stage 1 feeds every bucket and is reported once.
    pub fn with_stage1_reports(self, report: bool) -> Self {
        ShuffleReaderExec { report_stage1: report, ..self }
    }

    /// The stage-1 reports received, each as a titled block of plan lines.
    pub fn stage1_reports(&self) -> Vec<String> {
        let reports = self.stage1_reports.lock().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<(u32, String)> = reports
            .iter()
            .filter_map(|(shard, rank, slot)| {
                let text = slot.lock().unwrap_or_else(|p| p.into_inner()).plan.clone()?;
                let body: String = text.lines().map(|l| format!("  {l}\n")).collect();
                Some((*shard, format!("Shuffle stage 1 of shard {shard} on rank {rank}:\n{body}")))
            })
            .collect();
        out.sort();
        out.into_iter().map(|(_, text)| text).collect()
    }

    /// The same reader, merging `bucket`.
    pub fn for_bucket(&self, bucket: u32) -> Self {
        ShuffleReaderExec {
            bucket: Some(bucket),
            stage1_reports: Arc::default(),
            metrics: ExecutionPlanMetricsSet::new(),
            ..self.clone()
        }
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

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let max_memory_usage = settings::current(context.session_config().options()).max_memory_usage;
        let bucket = self.bucket.filter(|_| partition == 0).ok_or_else(|| {
            DataFusionError::Internal("ShuffleReaderExec runs on the node that merges a bucket".into())
        })?;
        // Every shard's bucket at once: each shard's stage 1 runs at the pace of its slowest
        // fetcher, so reading the shards one after the other would run their stage 1s in turn.
        let reader = self.clone();
        let schema = Arc::clone(&self.schema);
        let pool = Arc::clone(context.memory_pool());
        let opened = futures::stream::iter(self.sources.clone())
            .map(move |source| {
                let (reader, pool) = (reader.clone(), Arc::clone(&pool));
                async move { reader.open(&source, bucket, max_memory_usage, &pool).await }
            })
            .buffer_unordered(self.sources.len().max(1))
            .try_flatten_unordered(None);
        let rows = MetricBuilder::new(&self.metrics).output_rows(partition);
        let bytes = MetricBuilder::new(&self.metrics).counter("bytes_received", partition);
        let counted = opened.inspect_ok(move |batch| {
            rows.add(batch.num_rows());
            bytes.add(shardwise_storage::row_bytes(batch));
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, counted)))
    }
}

impl ShuffleReaderExec {
    /// One shard's bucket, from its first replica that answers. Once rows flow there is no
    /// failover: the bucket was handed out.
    async fn open(
        &self,
        source: &ShuffleSource,
        bucket: u32,
        max_memory_usage: u64,
        pool: &Arc<dyn MemoryPool>,
    ) -> Result<futures::stream::BoxStream<'static, Result<RecordBatch>>> {
        let header = ShuffleHeader {
            exchange_id: self.exchange_id.clone(),
            shard: source.shard,
            bucket,
            buckets: self.buckets,
            key_columns: self.key_columns,
            max_memory_usage,
            report: self.report_stage1 && bucket == 0,
        };
        let ticket = encode_shuffle_ticket(&header, &self.stage1)?;
        // A replica on a node known to be down is not asked: a hung one would hold the shuffle
        // until the connection gave up on it (15 s), on every query.
        let down = self.access.down_ranks().await;
        let mut errors: Vec<String> = source
            .replicas
            .iter()
            .filter(|rank| down.contains(rank))
            .map(|rank| format!("rank {rank}: down (it has missed its heartbeats)"))
            .collect();
        for &rank in source.replicas.iter().filter(|rank| !down.contains(rank)) {
            let report = crate::access::FragmentReport::default();
            match self.access.remote_fragment(rank, ticket.clone(), Arc::clone(&report)).await {
                Ok(rows) => {
                    if header.report {
                        let mut reports = self.stage1_reports.lock().unwrap_or_else(|p| p.into_inner());
                        reports.push((source.shard, rank, report));
                    }
                    // Batches come back with stage 1's columns; give them the exact schema.
                    let schema = Arc::clone(&self.schema);
                    let shard = source.shard;
                    let rows = rows
                        .map(move |batch| match batch {
                            Ok(b) => super::with_schema(&schema, &b),
                            Err(e) => Err(classed(
                                e.is_user_error(),
                                format!("shuffle: bucket {bucket} of shard {shard} from rank {rank} failed: {e}"),
                            )),
                        })
                        .boxed();
                    let consumer = format!("ShuffleReaderExec[{bucket}] (shard {shard} from rank {rank})");
                    return Ok(super::received::reserved(rows, pool, consumer));
                }
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

/// Rows and bytes the shuffle readers of `plan` received from the shards: what a shuffle's
/// exchange stage moved into this fragment.
pub fn exchanged(plan: &Arc<dyn ExecutionPlan>) -> (u64, u64) {
    use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
    let (mut rows, mut bytes) = (0, 0);
    let _ = plan.apply(|node| {
        if let Some(reader) = node.downcast_ref::<ShuffleReaderExec>() {
            let (r, b) = reader.received();
            (rows, bytes) = (rows + r, bytes + b);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    (rows, bytes)
}

/// A shuffle failure as the query's error: the query's own (an overflow, a division by zero: the
/// same on every replica, so not retried elsewhere) or the node's (it is).
fn classed(user_error: bool, message: String) -> DataFusionError {
    let error = match user_error {
        true => QueryError::Rejected(message),
        false => QueryError::Unavailable(message),
    };
    DataFusionError::External(Box::new(error))
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
            report: false,
        };
        let bytes = encode_shuffle_ticket(&header, &[9, 9]).expect("encode");
        assert!(is_shuffle_ticket(&bytes));
        let (back, plan) = decode_shuffle_ticket(&bytes).expect("decode");
        assert_eq!((back, plan), (header.clone(), &[9u8, 9][..]));
        let bad = encode_shuffle_ticket(&ShuffleHeader { bucket: 3, ..header }, &[]).expect("encode");
        assert!(decode_shuffle_ticket(&bad).expect_err("bucket 3 of 3").to_string().contains("bucket 3 of 3"));
        assert!(decode_shuffle_ticket(&bytes[..6]).is_err());
    }

    /// A one-column plan of `batches` batches of 1,000 keys, and how many rows go to each of 2
    /// buckets.
    fn keyed_plan(batches: usize) -> (Arc<dyn ExecutionPlan>, [usize; 2]) {
        use datafusion::catalog::memory::MemorySourceConfig;
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        let mut per_bucket = [0; 2];
        let data: Vec<RecordBatch> = (0..batches as i64)
            .map(|b| {
                let keys = Int64Array::from_iter_values((0..1000).map(|i| b * 1000 + i));
                let batch = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(keys)]).expect("batch");
                for (bucket, rows) in bucket_of_rows(&batch, 1, 2).expect("buckets") {
                    per_bucket[bucket] += rows.num_rows();
                }
                batch
            })
            .collect();
        let plan = MemorySourceConfig::try_new_exec(&[data], schema, None).expect("plan");
        (plan, per_bucket)
    }

    /// An exchange of 2 buckets expiring after `expiry`, stage 1 running `plan` into it.
    fn start_stage1(expiry: Duration, plan: Arc<dyn ExecutionPlan>) -> (Arc<Exchange>, tokio::task::JoinHandle<()>) {
        let exchange = Arc::new(Exchange::new(expiry));
        let mut senders = Vec::new();
        {
            let mut state = exchange.state();
            state.schema = Some(plan.schema());
            for _ in 0..2 {
                let (tx, rx) = mpsc::channel(SHUFFLE_BUCKET_BUFFER_BATCHES);
                senders.push(Some(tx));
                state.slots.push(Slot::Waiting(rx));
            }
        }
        let header = test_header("t");
        let stage =
            Stage1 { context: Arc::new(TaskContext::default()), header, rank: 0, exchange: Arc::clone(&exchange) };
        (exchange, tokio::spawn(stage.run(plan, senders)))
    }

    /// Claims `bucket` as a fetch does and counts its rows to the end.
    async fn drain(exchange: &Exchange, bucket: usize) -> usize {
        let slot = std::mem::replace(&mut exchange.state().slots[bucket], Slot::Taken);
        let Slot::Waiting(mut rows) = slot else { panic!("bucket {bucket} was not waiting") };
        let mut n = 0;
        while let Some(batch) = rows.recv().await {
            n += batch.expect("rows").num_rows();
        }
        n
    }

    #[tokio::test]
    async fn a_bucket_nobody_claims_expires_and_stage_1_finishes_the_others() {
        let expiry = Duration::from_millis(300);
        // 40 batches: bucket 1's buffer of SHUFFLE_BUCKET_BUFFER_BATCHES fills long before the end.
        let (plan, per_bucket) = keyed_plan(40);
        let started = Instant::now();
        let (exchange, stage1) = start_stage1(expiry, plan);
        let rows = drain(&exchange, 0).await;
        tokio::time::timeout(Duration::from_secs(10), stage1).await.expect("stage 1 ended").expect("no panic");
        assert_eq!(rows, per_bucket[0]);
        assert!(started.elapsed() >= expiry, "expired early, after {:?}", started.elapsed());
        assert!(matches!(exchange.state().slots[1], Slot::Expired));
    }

    #[tokio::test]
    async fn a_bucket_claimed_before_its_expiry_gets_every_row() {
        let expiry = Duration::from_millis(400);
        let (plan, per_bucket) = keyed_plan(40);
        let (exchange, stage1) = start_stage1(expiry, plan);
        let first = tokio::spawn({
            let exchange = Arc::clone(&exchange);
            async move { drain(&exchange, 0).await }
        });
        // Stage 1 is blocked on bucket 1 meanwhile; a claim within the expiry is served in full.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let second = drain(&exchange, 1).await;
        tokio::time::timeout(Duration::from_secs(10), stage1).await.expect("stage 1 ended").expect("no panic");
        assert_eq!([first.await.expect("drain"), second], per_bucket);
        assert!(!exchange.expire_if_unclaimed(1), "a claimed bucket never expires");
    }
}
