//! [`FragmentExec`]: the initiator's handle on a plan fragment that runs next to the data. Each
//! output partition is one [`LeafAssignment`] (a shard, or slices of one), run on a replica of
//! that shard chosen by `load_balancing`: in this process when the replica is local, otherwise
//! through the data plane of the node that holds it ([`TableAccess::remote_fragment`]).
//!
//! Failover: replicas are tried in order until one produces its first batch (or ends without
//! one); a failure after rows have started to flow fails the query, since a retry elsewhere
//! could repeat them, and so does an error the statement or its data caused (every replica
//! would repeat it). With no replica left the shard is missing: an error naming it, or, under
//! `skip_unavailable_shards = 1`, an empty result for that shard and a warning.
//!
//! The fragment plan is this node's only child, so `EXPLAIN` prints it under the line that says
//! which strategy was chosen and why; it is never executed as a child here, only decoded from the
//! bytes every replica receives, so local and remote runs execute the same plan.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet, Time};
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning, PlanProperties,
};
use futures::{StreamExt, TryStreamExt};
use shardwise_cluster::{ClusterView, NodeState};

use super::codec::{FragmentTicket, LeafAssignment, ShardwiseCodec, TicketHeader};
use super::remote_start::{REMOTE_START_WAIT_MS, RemoteStarts};
use super::scan::ShardTableRef;
use crate::access::{FragmentReport, TableAccess};
use crate::error::QueryError;
use crate::settings::{self, LoadBalancing};

/// How the distributed planner split a query (the line `EXPLAIN` shows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StrategyKind {
    /// Shards send partial states (or filtered rows); the initiator merges.
    InitiatorMerge,
    /// Shards run the complete aggregation; the initiator concatenates.
    NoMerge,
    /// As `NoMerge`, then ORDER BY and LIMIT on the initiator.
    NoMergeOrdered,
    /// Partial states repartitioned by group-key hash to every node.
    Shuffle,
}

impl StrategyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            StrategyKind::InitiatorMerge => "initiator_merge",
            StrategyKind::NoMerge => "no_merge",
            StrategyKind::NoMergeOrdered => "no_merge_ordered",
            StrategyKind::Shuffle => "shuffle",
        }
    }
}

/// The chosen strategy and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Strategy {
    pub kind: StrategyKind,
    pub reason: String,
}

/// Who runs a fragment and how replicas are chosen.
#[derive(Debug, Clone)]
pub struct Placement {
    pub table: ShardTableRef,
    /// Replica ranks of each shard, in replica order.
    pub replicas: Vec<Vec<u32>>,
    pub load_balancing: LoadBalancing,
    pub skip_unavailable_shards: bool,
    /// What a target is: `shard` or (for a shuffle's merge) `bucket`.
    pub unit: &'static str,
}

/// See the module doc.
#[derive(Debug)]
pub struct FragmentExec {
    fragment: Arc<dyn ExecutionPlan>,
    encoded: Arc<Vec<u8>>,
    targets: Vec<LeafAssignment>,
    placement: Placement,
    strategy: Strategy,
    access: Arc<dyn TableAccess>,
    cluster: Arc<dyn ClusterView>,
    metrics: ExecutionPlanMetricsSet,
    /// Shards left out under `skip_unavailable_shards`, with why (for `system.queries`).
    skipped: Arc<std::sync::Mutex<Vec<String>>>,
    /// Whether runs keep the plan they ran with its metrics (`EXPLAIN ANALYZE` asks before it
    /// executes; other queries do not pay for rendering and sending it).
    reporting: AtomicBool,
    /// Per finished run: which target ran where, and the plan it ran with its metrics.
    reports: Reports,
    /// Remote runs opening, which local runs let start first.
    remote_starts: Arc<RemoteStarts>,
    cache: Arc<PlanProperties>,
}

/// Finished runs' `(what ran where, the plan it ran with its metrics)`.
type Reports = Arc<std::sync::Mutex<Vec<(String, String)>>>;

/// Shared by every query of this process, so `round_robin` moves on between queries.
static ROUND_ROBIN: AtomicUsize = AtomicUsize::new(0);

impl FragmentExec {
    /// A counter of what a shuffle's exchange moved into this stage's runs: registered (shown by
    /// EXPLAIN ANALYZE) for a shuffle stage, a bare counter for the others.
    fn exchange_counter(&self, name: &'static str, partition: usize) -> Count {
        match self.strategy.kind {
            StrategyKind::Shuffle => MetricBuilder::new(&self.metrics).counter(name, partition),
            _ => Count::new(),
        }
    }

    /// Encodes `fragment` (whose leaf reads `placement.table`) to run once per target.
    pub fn try_new(
        fragment: Arc<dyn ExecutionPlan>,
        targets: Vec<LeafAssignment>,
        placement: Placement,
        strategy: Strategy,
        access: Arc<dyn TableAccess>,
        cluster: Arc<dyn ClusterView>,
    ) -> Result<Self> {
        let encoded = ShardwiseCodec::new(Arc::clone(&access)).encode_plan(Arc::clone(&fragment))?;
        // One output partition per target; the ordering (and other equivalences) of the
        // fragment hold within each.
        let cache = Arc::new(
            PlanProperties::clone(fragment.properties())
                .with_partitioning(Partitioning::UnknownPartitioning(targets.len().max(1))),
        );
        Ok(FragmentExec {
            fragment,
            encoded: Arc::new(encoded),
            targets,
            placement,
            strategy,
            access,
            cluster,
            metrics: ExecutionPlanMetricsSet::new(),
            skipped: Arc::default(),
            reporting: AtomicBool::new(false),
            reports: Arc::default(),
            remote_starts: Arc::default(),
            cache,
        })
    }

    /// Makes the runs started from now on keep the plan they ran with its metrics ([`Self::reports`]).
    pub fn keep_reports(&self) {
        self.reporting.store(true, Ordering::Relaxed);
    }

    /// For each run that finished (after [`Self::keep_reports`]): `(what ran where, its plan
    /// with metrics)`, as `EXPLAIN ANALYZE` shows them.
    pub fn reports(&self) -> Vec<(String, String)> {
        let mut reports = self.reports.lock().map(|r| r.clone()).unwrap_or_default();
        reports.sort();
        reports
    }

    pub fn strategy(&self) -> &Strategy {
        &self.strategy
    }

    pub fn fragment(&self) -> &Arc<dyn ExecutionPlan> {
        &self.fragment
    }

    pub fn targets(&self) -> &[LeafAssignment] {
        &self.targets
    }

    /// The shards this run answered without (`skip_unavailable_shards = 1`), each with why.
    pub fn skipped(&self) -> Vec<String> {
        self.skipped.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl DisplayAs for FragmentExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.placement;
        // The shards (or buckets) the targets read, with their replicas.
        let read: Vec<u32> = self.targets.iter().map(LeafAssignment::index).collect();
        let shards: Vec<String> = p
            .replicas
            .iter()
            .enumerate()
            .filter(|(shard, _)| read.contains(&(*shard as u32)))
            .map(|(shard, ranks)| {
                let ranks: Vec<String> = ranks.iter().map(u32::to_string).collect();
                format!("{shard}@[{}]", ranks.join(","))
            })
            .collect();
        write!(
            f,
            "DistributedFragmentExec: strategy={}, reason=\"{}\", table={}, fragments={}, {}s=[{}], load_balancing={}",
            self.strategy.kind.as_str(),
            self.strategy.reason,
            p.table.name,
            self.targets.len(),
            p.unit,
            shards.join(" "),
            p.load_balancing
        )?;
        if p.skip_unavailable_shards {
            write!(f, ", skip_unavailable_shards")?;
        }
        Ok(())
    }
}

impl ExecutionPlan for FragmentExec {
    plan_node_methods!("DistributedFragmentExec");

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.fragment]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        match <[_; 1]>::try_from(children) {
            Ok([child]) if Arc::ptr_eq(&child, &self.fragment) => Ok(self),
            Ok([child]) => Ok(Arc::new(FragmentExec::try_new(
                child,
                self.targets.clone(),
                self.placement.clone(),
                self.strategy.clone(),
                Arc::clone(&self.access),
                Arc::clone(&self.cluster),
            )?)),
            Err(_) => Err(DataFusionError::Internal("DistributedFragmentExec has one child".into())),
        }
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let target = self.targets.get(partition).cloned().ok_or_else(|| {
            DataFusionError::Internal(format!(
                "DistributedFragmentExec: partition {partition} of {}",
                self.targets.len()
            ))
        })?;
        let shard = target.index();
        let replicas = self.placement.replicas.get(shard as usize).cloned().unwrap_or_default();
        let run = Run {
            target,
            shard,
            replicas,
            encoded: Arc::clone(&self.encoded),
            placement: self.placement.clone(),
            access: Arc::clone(&self.access),
            cluster: Arc::clone(&self.cluster),
            schema: self.schema(),
            context,
            skipped: Arc::clone(&self.skipped),
            reports: self.reporting.load(Ordering::Relaxed).then(|| Arc::clone(&self.reports)),
            remote_starts: Arc::clone(&self.remote_starts),
            rows: MetricBuilder::new(&self.metrics).output_rows(partition),
            bytes: MetricBuilder::new(&self.metrics).counter("bytes_received", partition),
            elapsed: MetricBuilder::new(&self.metrics).subset_time("time_to_first_batch", partition),
            // Shown (and summed into system.queries) for a shuffle only: nothing else exchanges.
            exchanged_rows: self.exchange_counter("exchanged_rows", partition),
            exchanged_bytes: self.exchange_counter("exchanged_bytes", partition),
        };
        let schema = self.schema();
        let stop_of = Arc::clone(&run.context);
        let stream = futures::stream::once(run.open()).try_flatten();
        Ok(crate::stop::stop_checked(Box::pin(RecordBatchStreamAdapter::new(schema, stream)), &stop_of))
    }
}

type BatchStream = futures::stream::BoxStream<'static, Result<RecordBatch>>;

/// One partition's run: open the fragment on a replica, with failover.
struct Run {
    target: LeafAssignment,
    shard: u32,
    replicas: Vec<u32>,
    encoded: Arc<Vec<u8>>,
    placement: Placement,
    access: Arc<dyn TableAccess>,
    cluster: Arc<dyn ClusterView>,
    schema: SchemaRef,
    context: Arc<TaskContext>,
    skipped: Arc<std::sync::Mutex<Vec<String>>>,
    /// Where to keep the plan this run ran with its metrics, if anyone asked.
    reports: Option<Reports>,
    remote_starts: Arc<RemoteStarts>,
    rows: Count,
    bytes: Count,
    elapsed: Time,
    /// What the run's shuffle readers received from the shards (a shuffle's exchange stage).
    exchanged_rows: Count,
    exchanged_bytes: Count,
}

impl Run {
    async fn open(self) -> Result<BatchStream> {
        let (ranks, down) = self.ordered_replicas().await;
        // A node that has missed its heartbeats is not waited for: a hung one (SIGSTOP, a frozen
        // VM) would hold the query until the connection's keepalive gave up on it.
        let mut errors: Vec<String> =
            down.iter().map(|rank| format!("rank {rank}: down (it has missed its heartbeats)")).collect();
        // A replica that refused for want of node memory (other queries hold it) may leave room
        // on the next one; if none has any, the query fails, never answered without the shard.
        let mut out_of_memory = false;
        // A replica that ran the fragment and failed (a storage or internal error) is tried
        // past as well, but the shard was not unavailable: `skip_unavailable_shards` does not
        // answer without it (ClickHouse's rule: a shard is unavailable when no replica can be
        // reached), and the error is not called unavailability.
        let mut failed_to_run = false;
        for rank in ranks {
            let timer = self.elapsed.timer();
            let attempt = match rank == self.access.local_rank() {
                true => {
                    // Let the sibling partitions send their remote fragments first: a local
                    // fragment's first poll runs until its scan yields (its input is in memory,
                    // always ready; `SCAN_BATCHES_PER_YIELD`), and on a query runtime with one
                    // worker (a node on one core) the remote shards would start only then; and
                    // wait until they run (`remote_start`).
                    tokio::task::yield_now().await;
                    self.remote_starts.wait(Duration::from_millis(REMOTE_START_WAIT_MS)).await;
                    self.run_local()
                }
                false => {
                    let _opening = self.remote_starts.enter();
                    self.run_remote(rank).await
                }
            };
            let mut stream = match attempt {
                Ok(stream) => stream,
                Err(e) => {
                    if let Some(dropped) = self.dropped_meanwhile() {
                        return Err(dropped);
                    }
                    out_of_memory |= is_server_memory(&e);
                    let failure = replica_failure(e)?;
                    failed_to_run |= !matches!(failure, QueryError::Unavailable(_));
                    errors.push(replica_error(rank, failure));
                    continue;
                }
            };
            let first = stream.next().await;
            timer.done();
            match first {
                Some(Err(e)) => {
                    if let Some(dropped) = self.dropped_meanwhile() {
                        return Err(dropped);
                    }
                    out_of_memory |= is_server_memory(&e);
                    let failure = replica_failure(e)?;
                    failed_to_run |= !matches!(failure, QueryError::Unavailable(_));
                    errors.push(replica_error(rank, failure));
                    continue;
                }
                first => return Ok(self.instrument(rank, first, stream)),
            }
        }
        let table = &self.placement.table.name;
        let shard = self.shard;
        let unit = self.placement.unit;
        if let Some(dropped) = self.dropped_meanwhile() {
            return Err(dropped);
        }
        // Busy, not gone: never a shard to answer without.
        if out_of_memory {
            return Err(external(QueryError::Rejected(format!(
                "table {table} {unit} {shard}: no replica had the memory to run its fragment ({})",
                errors.join("; ")
            ))));
        }
        if failed_to_run {
            return Err(external(QueryError::Storage(format!(
                "table {table} {unit} {shard}: its fragment failed ({})",
                errors.join("; ")
            ))));
        }
        if self.placement.skip_unavailable_shards {
            let why = format!("answered without table {table} shard {shard} ({})", errors.join("; "));
            tracing::warn!(table, shard, "skip_unavailable_shards: {why}");
            if let Ok(mut skipped) = self.skipped.lock() {
                skipped.push(why);
            }
            return Ok(futures::stream::empty().boxed());
        }
        let hint = match unit {
            "shard" => "; SET skip_unavailable_shards = 1 answers from the other shards",
            _ => "",
        };
        Err(DataFusionError::External(Box::new(QueryError::Unavailable(format!(
            "table {table} {unit} {shard}: no node could run its fragment ({}){hint}",
            errors.join("; ")
        )))))
    }

    /// The query's error when the table it reads is no longer in this node's catalog: dropped
    /// or truncated after the query was planned, which is why its replicas failed (their files
    /// gone, or their catalog without it), not that they were unavailable.
    fn dropped_meanwhile(&self) -> Option<DataFusionError> {
        let table = &self.placement.table;
        let catalog = self.access.catalog();
        let live = catalog.by_id(table.table_id).is_some_and(|e| e.generation == table.generation);
        (!live).then(|| {
            external(QueryError::Rejected(format!(
                "table {} was dropped or truncated while the query ran; run it again",
                table.name
            )))
        })
    }

    /// Replica ranks to try, in the order `load_balancing` gives, and those the membership
    /// knows to be down (not tried).
    async fn ordered_replicas(&self) -> (Vec<u32>, Vec<u32>) {
        let mut ranks = self.replicas.clone();
        if ranks.is_empty() {
            return (ranks, Vec::new());
        }
        let n = ranks.len();
        match self.placement.load_balancing {
            LoadBalancing::InOrder => {}
            LoadBalancing::Nearest => {
                let local = self.access.local_rank();
                ranks.sort_by_key(|r| *r != local);
            }
            LoadBalancing::Random => ranks.rotate_left((uuid::Uuid::new_v4().as_u128() % n as u128) as usize),
            LoadBalancing::RoundRobin => ranks.rotate_left(ROUND_ROBIN.fetch_add(1, Ordering::Relaxed) % n),
        }
        let members = self.cluster.members().await;
        let down = |rank: &u32| members.iter().any(|m| m.rank == *rank && m.state == NodeState::Down);
        ranks.into_iter().partition(|rank| !down(rank))
    }

    fn run_local(&self) -> Result<BatchStream> {
        let threads = self.context.session_config().target_partitions();
        let codec = ShardwiseCodec::for_worker(Arc::clone(&self.access), self.target.clone(), threads);
        let plan = codec.decode_plan(&self.encoded, &self.context)?;
        let stream = execute_merged(Arc::clone(&plan), Arc::clone(&self.context))?.boxed();
        let (reports, label) = (self.reports.clone(), self.label(self.access.local_rank()));
        let (exchanged_rows, exchanged_bytes) = (self.exchanged_rows.clone(), self.exchanged_bytes.clone());
        Ok(after_last(stream, move || {
            let (rows, bytes) = super::shuffle::exchanged(&plan);
            exchanged_rows.add(rows as usize);
            exchanged_bytes.add(bytes as usize);
            if let Some(Ok(mut reports)) = reports.as_ref().map(|r| r.lock()) {
                reports.push((label, render_with_metrics(&plan)));
            }
        }))
    }

    /// `shard 3 on rank 1`, `bucket 0 on rank 2`.
    fn label(&self, rank: u32) -> String {
        format!("{} {} on rank {rank}", self.placement.unit, self.shard)
    }

    async fn run_remote(&self, rank: u32) -> Result<BatchStream> {
        let ticket = FragmentTicket {
            header: TicketHeader {
                query_id: uuid::Uuid::new_v4().to_string(),
                leaf: self.target.clone(),
                max_memory_usage: settings::current(self.context.session_config().options()).max_memory_usage,
                report: self.reports.is_some(),
            },
            plan: self.encoded.as_ref().clone(),
        };
        let report = FragmentReport::default();
        let rows = self.access.remote_fragment(rank, ticket.encode()?, Arc::clone(&report)).await.map_err(external)?;
        let schema = Arc::clone(&self.schema);
        // Batches come back with the fragment's columns; give them its exact schema (field
        // metadata does not survive every transport).
        let rows = rows.map(move |r| r.map_err(external).and_then(|b| super::with_schema(&schema, &b))).boxed();
        let (reports, label) = (self.reports.clone(), self.label(rank));
        let (exchanged_rows, exchanged_bytes) = (self.exchanged_rows.clone(), self.exchanged_bytes.clone());
        Ok(after_last(rows, move || {
            let outcome = report.lock().map(|mut r| std::mem::take(&mut *r)).unwrap_or_default();
            exchanged_rows.add(outcome.exchanged_rows as usize);
            exchanged_bytes.add(outcome.exchanged_bytes as usize);
            if let (Some(text), Some(Ok(mut reports))) = (outcome.plan, reports.as_ref().map(|r| r.lock())) {
                reports.push((label, text));
            }
        }))
    }

    /// The rows `rank` sends, counted; a failure after its first rows (the node died or hung
    /// mid-stream) names the table, the shard and the node, and why it was not retried.
    fn instrument(self, rank: u32, first: Option<Result<RecordBatch>>, rest: BatchStream) -> BatchStream {
        let (rows, bytes) = (self.rows, self.bytes);
        let what = format!("table {} {} {} on rank {rank}", self.placement.table.name, self.placement.unit, self.shard);
        let count = move |batch: Result<RecordBatch>| match batch {
            Ok(b) => {
                rows.add(b.num_rows());
                bytes.add(shardwise_storage::row_bytes(&b));
                Ok(b)
            }
            Err(e) if is_server_memory(&e) => Err(e),
            Err(e) => match replica_failure(e) {
                Ok(failure) => Err(external(QueryError::Unavailable(format!(
                    "{what} failed after sending rows, so it was not retried on another replica: {}",
                    replica_error(rank, failure)
                )))),
                Err(statement_error) => Err(statement_error),
            },
        };
        // Reserved once a replica answers: a batch that does not fit here is this node's lack
        // of memory, which another replica's rows would meet as well.
        let consumer = format!("DistributedFragmentExec[{}] (rows from rank {rank})", self.shard);
        let received = futures::stream::iter(first).chain(rest).boxed();
        super::received::reserved(received, self.context.memory_pool(), consumer).map(count).boxed()
    }
}

/// A replica's failure, to try the next replica with (a node's `max_server_memory_usage`
/// included); `Err` when the statement or its data caused it (a division by zero, a failed
/// cast, a refused plan, more memory than the query's own `max_memory_usage` allows), which every replica would repeat: the query fails with it at
/// once, and `skip_unavailable_shards` does not hide it. (A remote fragment's memory error
/// arrives already named as the setting's; the initiator's own fragment's arrives as DataFusion
/// raised it, and the query's stream names the setting.)
fn replica_failure(e: DataFusionError) -> Result<QueryError> {
    if is_server_memory(&e) {
        return Ok(QueryError::Rejected(QueryError::from(e).to_string()));
    }
    let memory = matches!(e.find_root(), DataFusionError::ResourcesExhausted(_));
    match memory || QueryError::is_user_error_of(&e) {
        true => Err(e),
        false => Ok(QueryError::from(e)),
    }
}

/// True when `e` is a node's `max_server_memory_usage` refusal: what other queries hold there,
/// so another replica may have room (`crate::server_memory`).
fn is_server_memory(e: &DataFusionError) -> bool {
    e.to_string().contains(crate::server_memory::SERVER_MEMORY_ERROR)
}

/// One replica's failure as the query's error lists it: `rank 2: fragment: ...`, without the
/// class (the query's error has its own) or the rank twice.
fn replica_error(rank: u32, e: QueryError) -> String {
    let text = match e {
        QueryError::Unavailable(m) => m,
        other => other.to_string(),
    };
    match text.starts_with(&format!("rank {rank}:")) {
        true => text,
        false => format!("rank {rank}: {text}"),
    }
}

/// `stream`, calling `done` once it has ended (not if it is dropped before).
fn after_last(stream: BatchStream, done: impl FnOnce() + Send + 'static) -> BatchStream {
    let tail = futures::stream::once(async move {
        done();
        None
    });
    stream.map(Some).chain(tail).filter_map(futures::future::ready).boxed()
}

/// What a node that ran `plan` as a fragment tells the initiator after its rows: the plan with
/// metrics when `report`, and what its shuffle readers received.
pub fn outcome(plan: &Arc<dyn ExecutionPlan>, report: bool) -> crate::access::FragmentOutcome {
    let (exchanged_rows, exchanged_bytes) = super::shuffle::exchanged(plan);
    crate::access::FragmentOutcome { plan: report.then(|| render_with_metrics(plan)), exchanged_rows, exchanged_bytes }
}

/// A plan with each operator's metrics, indented, as `EXPLAIN ANALYZE` prints one.
pub fn render_with_metrics(plan: &Arc<dyn ExecutionPlan>) -> String {
    let mut text = datafusion::physical_plan::display::DisplayableExecutionPlan::with_metrics(plan.as_ref())
        .indent(true)
        .to_string();
    // A bucket's merge also shows the shuffle stage 1 that fed it, as each shard's node reported it.
    let _ = datafusion::common::tree_node::TreeNode::apply(plan, |node| {
        if let Some(reader) = node.downcast_ref::<super::ShuffleReaderExec>() {
            for report in reader.stage1_reports() {
                text.push_str(&report);
            }
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    });
    text
}

fn external(e: QueryError) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// Executes every partition of `plan` as one stream: merged in order when the partitions are
/// sorted, concatenated otherwise.
pub fn execute_merged(plan: Arc<dyn ExecutionPlan>, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
    let plan: Arc<dyn ExecutionPlan> = match plan.output_partitioning().partition_count() {
        1 => plan,
        _ => match plan.output_ordering().cloned() {
            Some(ordering) => Arc::new(SortPreservingMergeExec::new(ordering, plan)),
            None => Arc::new(CoalescePartitionsExec::new(plan)),
        },
    };
    plan.execute(0, context)
}

/// The node side of a fragment ticket: decodes the plan with this node's tables under its leaf.
pub fn decode_fragment_ticket(
    access: Arc<dyn TableAccess>,
    context: &TaskContext,
    ticket: FragmentTicket,
) -> Result<Arc<dyn ExecutionPlan>> {
    let threads = context.session_config().target_partitions();
    let codec = ShardwiseCodec::for_worker(access, ticket.header.leaf.clone(), threads).reporting(ticket.header.report);
    tracing::debug!(query_id = %ticket.header.query_id, leaf = ?ticket.header.leaf, "running a fragment");
    codec.decode_plan(&ticket.plan, context)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_failure_names_its_rank_once() {
        let e = QueryError::Unavailable("rank 2: fragment: keep-alive timed out".into());
        assert_eq!(replica_error(2, e), "rank 2: fragment: keep-alive timed out");
        let e = QueryError::Unavailable("the node is still starting".into());
        assert_eq!(replica_error(1, e), "rank 1: the node is still starting");
        let e = QueryError::Storage("disk gone".into());
        assert_eq!(replica_error(0, e), "rank 0: storage error: disk gone");
    }
}
