//! The queries a node runs as initiator: `system.queries`, `max_execution_time_ms` and
//! `KILL QUERY`.
//!
//! Every statement that executes a plan is registered with an id while it runs and recorded when
//! it ends (finished, failed, killed, timed out, or abandoned by its client): the strategies the
//! distributed planner chose, how many fragments ran, the rows and bytes they sent back (in all
//! and per stage, with a shuffle's exchange between the nodes, which the nodes running its
//! buckets report after their rows), the rows of the answer, the time and the error. The newest [`QUERY_LOG_MAX_ENTRIES`] are kept.
//!
//! Stopping a query ends its stream with an error; dropping the stream drops every fragment
//! stream under it, which cancels the remote calls, so the nodes running fragments stop too.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use datafusion::arrow::array::{ArrayRef, RecordBatch, StringArray, TimestampMillisecondArray, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;
use tokio::sync::Notify;

use crate::dist::FragmentExec;
use crate::error::QueryError;

/// How many ended queries `system.queries` keeps.
pub const QUERY_LOG_MAX_ENTRIES: usize = 1000;

/// Most statements reading tables that a node runs at once as initiator (ClickHouse's
/// `max_concurrent_queries`, whose own default is 0, no limit, and which ClickHouse's sample
/// `config.xml` has set to 100): one more is refused. Each holds memory and its
/// fragments' streams for as long as its client keeps it, reading or not (an open PostgreSQL
/// cursor, a Flight stream nobody reads): 180 of them took a node to 5.5 GB. Uploads still
/// being received count too ([`QueryLog::begin`]: a bulk ingest, `COPY ... FROM STDIN`), as
/// their client paces them. Statements that read no table (`system.queries`, `KILL QUERY`,
/// `SELECT 1`) are not counted or refused, so an operator can still see and stop the ones
/// running.
pub const MAX_CONCURRENT_QUERIES: usize = 100;

/// Most bytes of a statement's text `system.queries` keeps (ClickHouse's
/// `log_queries_cut_to_length`, also 100 000): the log kept each statement whole, and 40
/// statements of 16 MB held 671 MB of text.
pub const QUERY_LOG_TEXT_MAX_BYTES: usize = 100_000;

/// `sql`, cut to [`QUERY_LOG_TEXT_MAX_BYTES`] on a character boundary, saying how much was cut.
fn cut_to_length(sql: &str) -> String {
    if sql.len() <= QUERY_LOG_TEXT_MAX_BYTES {
        return sql.to_string();
    }
    let mut end = QUERY_LOG_TEXT_MAX_BYTES;
    while !sql.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} more bytes)", &sql[..end], sql.len() - end)
}

/// Longest `query_id` a client may choose (bytes).
pub const QUERY_ID_MAX_BYTES: usize = 128;

/// How a query ended, or that it has not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueryState {
    Running,
    Finished,
    Failed,
    Killed,
    TimedOut,
    /// The client stopped reading before the end.
    Cancelled,
}

impl QueryState {
    pub fn as_str(self) -> &'static str {
        match self {
            QueryState::Running => "running",
            QueryState::Finished => "finished",
            QueryState::Failed => "failed",
            QueryState::Killed => "killed",
            QueryState::TimedOut => "timed_out",
            QueryState::Cancelled => "cancelled",
        }
    }
}

/// One row of `system.queries`.
#[derive(Debug, Clone)]
pub struct QueryRecord {
    pub query_id: String,
    pub sql: String,
    pub started_unix_ms: u64,
    pub duration_ms: Option<u64>,
    pub state: QueryState,
    /// The strategy of each distributed fragment, e.g. `initiator_merge`.
    pub strategies: Vec<String>,
    /// What each stage moved: per distributed fragment, the rows and bytes sent to this node,
    /// and for a shuffle also its exchange between the nodes.
    pub stages: Vec<String>,
    pub fragments: u64,
    /// Rows and Arrow bytes the fragments sent back to this node.
    pub rows_moved: u64,
    pub bytes_moved: u64,
    pub result_rows: u64,
    pub error: Option<String>,
    /// E.g. shards left out under `skip_unavailable_shards`.
    pub warnings: Vec<String>,
}

impl QueryRecord {
    /// A record of `sql` under a new id, with nothing moved yet.
    fn new(sql: &str, started_unix_ms: u64, state: QueryState) -> QueryRecord {
        QueryRecord {
            query_id: uuid::Uuid::new_v4().to_string(),
            sql: cut_to_length(sql),
            started_unix_ms,
            duration_ms: None,
            state,
            strategies: Vec::new(),
            stages: Vec::new(),
            fragments: 0,
            rows_moved: 0,
            bytes_moved: 0,
            result_rows: 0,
            error: None,
            warnings: Vec::new(),
        }
    }
}

struct Running {
    record: QueryRecord,
    /// Whether it counts toward [`MAX_CONCURRENT_QUERIES`].
    counted: bool,
    kill: Arc<Notify>,
    /// Its plan, whose fragments' strategies and metrics a snapshot reads while it runs (none
    /// for a statement that runs outside a plan).
    plan: Option<Arc<dyn ExecutionPlan>>,
}

/// See the module doc.
#[derive(Default)]
pub struct QueryLog {
    running: Mutex<HashMap<String, Running>>,
    ended: Mutex<VecDeque<QueryRecord>>,
    totals: Mutex<QueryTotals>,
}

/// Counts over every query this node ran as initiator since it started (for `/metrics`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueryTotals {
    /// Ended queries by state (`finished`, `failed`, ...).
    pub by_state: std::collections::BTreeMap<String, u64>,
    pub result_rows: u64,
    pub rows_moved: u64,
    pub bytes_moved: u64,
}

impl std::fmt::Debug for QueryLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueryLog").field("running", &lock(&self.running).len()).finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Why a query was stopped.
#[derive(Debug, Clone, Copy)]
enum Stop {
    Killed,
    TimedOut(u64),
}

impl QueryLog {
    /// Runs `stream` (the output of `plan`) as query `sql`: registered while it runs, recorded
    /// when it ends, stopped after `max_execution_time_ms` (0: no limit) or by [`QueryLog::kill`].
    /// A plan that `reads_tables` is refused while [`MAX_CONCURRENT_QUERIES`] such are running.
    pub fn track(
        self: &Arc<Self>,
        sql: &str,
        query_id: Option<String>,
        (plan, reads_tables): (Arc<dyn ExecutionPlan>, bool),
        stream: SendableRecordBatchStream,
        max_execution_time_ms: u64,
    ) -> Result<SendableRecordBatchStream, QueryError> {
        // An INSERT's write runs to its end once the rows are read (`sharded_table::InsertSink`).
        let note = match plan.downcast_ref::<datafusion::datasource::sink::DataSinkExec>().is_some() {
            true => {
                "; an INSERT stopped while it read its rows wrote none of them, and one stopped after it had read \
                 them all completes its write (the node's log says so)"
            }
            false => "",
        };
        let record = QueryRecord::new(sql, unix_ms(), QueryState::Running);
        let (query_id, kill) = self.register(record, query_id, reads_tables, Some(Arc::clone(&plan)))?;
        let guard = Arc::new(EndGuard {
            log: Arc::clone(self),
            query_id,
            plan,
            started: Instant::now(),
            rows: AtomicU64::new(0),
            outcome: Mutex::new(None),
        });
        let stop_reason: Arc<Mutex<Option<Stop>>> = Arc::default();
        let reason = Arc::clone(&stop_reason);
        let stop = async move {
            let deadline = async {
                match max_execution_time_ms {
                    0 => std::future::pending::<()>().await,
                    ms => tokio::time::sleep(Duration::from_millis(ms)).await,
                }
            };
            let why = tokio::select! {
                _ = kill.notified() => Stop::Killed,
                _ = deadline => Stop::TimedOut(max_execution_time_ms),
            };
            *lock(&reason) = Some(why);
        };
        let schema = stream.schema();
        let counted = {
            let guard = Arc::clone(&guard);
            stream.take_until(Box::pin(stop)).map(move |item| {
                match &item {
                    Ok(batch) => {
                        guard.rows.fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
                    }
                    Err(e) => guard.end(QueryState::Failed, Some(e.to_string())),
                }
                item
            })
        };
        let tail = futures::stream::once(async move {
            match *lock(&stop_reason) {
                Some(Stop::Killed) => {
                    let e = QueryError::Rejected(format!("{}{note}", crate::error::KILLED));
                    guard.end(QueryState::Killed, Some(e.to_string()));
                    Some(Err(DataFusionError::External(Box::new(e))))
                }
                Some(Stop::TimedOut(ms)) => {
                    let e = QueryError::Rejected(format!("{} = {ms} and was stopped{note}", crate::error::TIMED_OUT));
                    guard.end(QueryState::TimedOut, Some(e.to_string()));
                    Some(Err(DataFusionError::External(Box::new(e))))
                }
                None => {
                    guard.end(QueryState::Finished, None);
                    None
                }
            }
        })
        .filter_map(std::future::ready);
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, counted.chain(tail))))
    }

    /// Registers `record` as running, under the client's `query_id` if it gave one; refused when
    /// that id is running, or when `counted` and [`MAX_CONCURRENT_QUERIES`] counted statements
    /// are. Its id, and what [`QueryLog::kill`] notifies.
    fn register(
        &self,
        mut record: QueryRecord,
        query_id: Option<String>,
        counted: bool,
        plan: Option<Arc<dyn ExecutionPlan>>,
    ) -> Result<(String, Arc<Notify>), QueryError> {
        if let Some(id) = query_id {
            if id.is_empty() || id.len() > QUERY_ID_MAX_BYTES {
                return Err(QueryError::BadSetting(format!(
                    "query_id {:?}: expected 1 to {QUERY_ID_MAX_BYTES} bytes (QUERY_ID_MAX_BYTES)",
                    id.chars().take(40).collect::<String>()
                )));
            }
            record.query_id = id;
        }
        let query_id = record.query_id.clone();
        let kill = Arc::new(Notify::new());
        let mut running = lock(&self.running);
        if running.contains_key(&query_id) {
            return Err(QueryError::Rejected(format!(
                "query_id {query_id:?} is the id of a query running on this node; give each query its own"
            )));
        }
        if counted && running.values().filter(|r| r.counted).count() >= MAX_CONCURRENT_QUERIES {
            return Err(QueryError::Unavailable(format!(
                "too many simultaneous queries: {MAX_CONCURRENT_QUERIES} reading tables or receiving rows are \
                 running on this node (MAX_CONCURRENT_QUERIES; open cursors, answers not yet read and uploads not \
                 yet ended count); see system.queries, end some or KILL QUERY, or retry later"
            )));
        }
        running.insert(query_id.clone(), Running { record, counted, kill: Arc::clone(&kill), plan });
        Ok((query_id, kill))
    }

    /// Registers a statement that runs outside a plan while it receives rows from its client (a
    /// Flight SQL bulk ingest, `COPY ... FROM STDIN`): shown as `running` in `system.queries`,
    /// stopped by `KILL QUERY` (the caller waits on [`RunningStatement::killed`]), and counted
    /// toward [`MAX_CONCURRENT_QUERIES`], since a client that sends slowly holds its memory as
    /// long as it likes. Recorded when it ends ([`RunningStatement::end`]), or as `cancelled` if
    /// it is dropped first.
    pub fn begin(self: &Arc<Self>, sql: &str, query_id: Option<String>) -> Result<RunningStatement, QueryError> {
        let record = QueryRecord::new(sql, unix_ms(), QueryState::Running);
        let (query_id, kill) = self.register(record, query_id, true, None)?;
        Ok(RunningStatement {
            log: Arc::clone(self),
            query_id,
            started: Instant::now(),
            kill,
            kill_seen: AtomicBool::new(false),
            ended: false,
        })
    }

    /// Records a statement that failed before it could run (a parse or planning error, a value
    /// that does not fit its column): one `failed` row, as ClickHouse's query log keeps
    /// exceptions raised before a query starts. Under the `query_id` the client gave it, if it
    /// gave a valid one, so that it finds the failure where it looks.
    pub fn record_failed(&self, sql: &str, error: &str, started: Instant, query_id: Option<String>) {
        let duration_ms = started.elapsed().as_millis() as u64;
        let mut record = QueryRecord {
            duration_ms: Some(duration_ms),
            error: Some(error.to_string()),
            ..QueryRecord::new(sql, unix_ms().saturating_sub(duration_ms), QueryState::Failed)
        };
        if let Some(id) = query_id.filter(|id| !id.is_empty() && id.len() <= QUERY_ID_MAX_BYTES) {
            record.query_id = id;
        }
        self.finish(record);
    }

    /// Records a statement that ran outside a plan (rows inserted from an HTTP body or a
    /// `COPY ... FROM STDIN`): one ended row, `finished` with the one row it answered (the
    /// count, as a SQL `INSERT` answers) or `failed` with its error.
    pub fn record_ended(&self, sql: &str, started: Instant, query_id: Option<String>, outcome: Result<(), String>) {
        let duration_ms = started.elapsed().as_millis() as u64;
        let state = if outcome.is_ok() { QueryState::Finished } else { QueryState::Failed };
        let mut record = QueryRecord {
            duration_ms: Some(duration_ms),
            result_rows: u64::from(outcome.is_ok()),
            error: outcome.err(),
            ..QueryRecord::new(sql, unix_ms().saturating_sub(duration_ms), state)
        };
        if let Some(id) = query_id.filter(|id| !id.is_empty() && id.len() <= QUERY_ID_MAX_BYTES) {
            record.query_id = id;
        }
        self.finish(record);
    }

    /// Stops the running query `query_id`; false if no such query is running.
    pub fn kill(&self, query_id: &str) -> bool {
        match lock(&self.running).get(query_id) {
            Some(running) => {
                running.kill.notify_one();
                true
            }
            None => false,
        }
    }

    /// Running queries first, then ended ones, newest first.
    pub fn snapshot(&self) -> Vec<QueryRecord> {
        let now = unix_ms();
        let mut out: Vec<QueryRecord> = lock(&self.running)
            .values()
            .map(|r| {
                // What its fragments have done so far: a long query can be looked at as it runs.
                let mut record =
                    QueryRecord { duration_ms: Some(now.saturating_sub(r.record.started_unix_ms)), ..r.record.clone() };
                if let Some(plan) = &r.plan {
                    add_fragments(&mut record, plan);
                }
                record
            })
            .collect();
        out.sort_by_key(|r| std::cmp::Reverse(r.started_unix_ms));
        out.extend(lock(&self.ended).iter().rev().cloned());
        out
    }

    /// Counts since the node started.
    pub fn totals(&self) -> QueryTotals {
        lock(&self.totals).clone()
    }

    /// How many queries are running now.
    pub fn running(&self) -> usize {
        lock(&self.running).len()
    }

    fn finish(&self, record: QueryRecord) {
        {
            let mut totals = lock(&self.totals);
            *totals.by_state.entry(record.state.as_str().to_string()).or_default() += 1;
            totals.result_rows += record.result_rows;
            totals.rows_moved += record.rows_moved;
            totals.bytes_moved += record.bytes_moved;
        }
        // Only the query's own `EndGuard` takes it out of `running` (before calling this): a
        // failed statement recorded here may carry a client's id equal to a running query's.
        let mut ended = lock(&self.ended);
        ended.push_back(record);
        while ended.len() > QUERY_LOG_MAX_ENTRIES {
            ended.pop_front();
        }
    }
}

/// Records the query once, when it ends or when its stream is dropped unfinished.
struct EndGuard {
    log: Arc<QueryLog>,
    query_id: String,
    plan: Arc<dyn ExecutionPlan>,
    started: Instant,
    rows: AtomicU64,
    outcome: Mutex<Option<(QueryState, Option<String>)>>,
}

impl EndGuard {
    fn end(&self, state: QueryState, error: Option<String>) {
        lock(&self.outcome).get_or_insert((state, error));
    }
}

impl Drop for EndGuard {
    fn drop(&mut self) {
        let (state, error) = lock(&self.outcome).take().unwrap_or((QueryState::Cancelled, None));
        let Some(running) = lock(&self.log.running).remove(&self.query_id).map(|r| r.record) else { return };
        let mut record = QueryRecord {
            duration_ms: Some(self.started.elapsed().as_millis() as u64),
            state,
            error,
            result_rows: self.rows.load(Ordering::Relaxed),
            ..running
        };
        add_fragments(&mut record, &self.plan);
        self.log.finish(record);
    }
}

/// A statement registered by [`QueryLog::begin`]; recorded once, when it ends or is dropped.
pub struct RunningStatement {
    log: Arc<QueryLog>,
    query_id: String,
    started: Instant,
    kill: Arc<Notify>,
    /// Whether it has seen `KILL QUERY` ([`RunningStatement::killed`], `killed_now`).
    kill_seen: AtomicBool,
    ended: bool,
}

impl std::fmt::Debug for RunningStatement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningStatement").field("query_id", &self.query_id).finish_non_exhaustive()
    }
}

impl RunningStatement {
    /// Its id in `system.queries`.
    pub fn query_id(&self) -> &str {
        &self.query_id
    }

    /// Resolves when `KILL QUERY` names it (at once if that happened already).
    pub async fn killed(&self) {
        if !self.kill_seen.load(Ordering::Relaxed) {
            self.kill.notified().await;
            self.kill_seen.store(true, Ordering::Relaxed);
        }
    }

    /// Whether `KILL QUERY` has named it, without waiting: for a caller that is handed its rows
    /// piece by piece rather than awaiting them (a `COPY ... FROM STDIN`).
    pub fn killed_now(&self) -> bool {
        if !self.kill_seen.load(Ordering::Relaxed) && futures::FutureExt::now_or_never(self.kill.notified()).is_some() {
            self.kill_seen.store(true, Ordering::Relaxed);
        }
        self.kill_seen.load(Ordering::Relaxed)
    }

    /// Records it as `finished` having answered `result_rows` rows, or with its error: `killed`
    /// if it saw `KILL QUERY` (through [`RunningStatement::killed`] or `killed_now`), else
    /// `failed`.
    pub fn end(mut self, outcome: Result<u64, String>) {
        let (state, rows, error) = match outcome {
            Ok(rows) => (QueryState::Finished, rows, None),
            Err(error) if self.kill_seen.load(Ordering::Relaxed) => (QueryState::Killed, 0, Some(error)),
            Err(error) => (QueryState::Failed, 0, Some(error)),
        };
        self.record(state, rows, error);
    }

    /// Records it as stopped at its `max_execution_time_ms`, with `error`.
    pub fn end_timed_out(mut self, error: String) {
        self.record(QueryState::TimedOut, 0, Some(error));
    }

    fn record(&mut self, state: QueryState, result_rows: u64, error: Option<String>) {
        self.ended = true;
        let Some(running) = lock(&self.log.running).remove(&self.query_id).map(|r| r.record) else { return };
        let duration_ms = Some(self.started.elapsed().as_millis() as u64);
        self.log.finish(QueryRecord { duration_ms, state, error, result_rows, ..running });
    }
}

impl Drop for RunningStatement {
    fn drop(&mut self) {
        if !self.ended {
            self.record(QueryState::Cancelled, 0, None);
        }
    }
}

/// `plan`'s distributed fragments into `record`: their strategies, how many, what they sent back
/// so far, and the shards they answered without.
fn add_fragments(record: &mut QueryRecord, plan: &Arc<dyn ExecutionPlan>) {
    let _ = plan.apply(|node| {
        if let Some(fragment) = node.downcast_ref::<FragmentExec>() {
            record.strategies.push(fragment.strategy().kind.as_str().to_string());
            record.fragments += fragment.targets().len() as u64;
            record.warnings.extend(fragment.skipped());
            if let Some(metrics) = fragment.metrics() {
                let count = |name: &str| metrics.sum_by_name(name).map(|v| v.as_usize()).unwrap_or(0) as u64;
                let (rows, bytes) = (metrics.output_rows().unwrap_or(0) as u64, count("bytes_received"));
                record.rows_moved += rows;
                record.bytes_moved += bytes;
                let kind = fragment.strategy().kind;
                if matches!(kind, crate::dist::fragment::StrategyKind::Shuffle) {
                    let (rows, bytes) = (count("exchanged_rows"), count("exchanged_bytes"));
                    record.stages.push(format!("shuffle exchange: {rows} rows, {bytes} bytes between the nodes"));
                }
                let n = fragment.targets().len();
                let kind = kind.as_str();
                record.stages.push(format!("{kind}: {n} fragments, {rows} rows, {bytes} bytes to this node"));
            }
        }
        Ok(TreeNodeRecursion::Continue)
    });
}

/// `system.queries`' columns.
pub fn queries_schema() -> SchemaRef {
    let utc = Some(Arc::from("UTC"));
    Arc::new(Schema::new(vec![
        Field::new("query_id", DataType::Utf8, false),
        Field::new("query", DataType::Utf8, false),
        Field::new("started", DataType::Timestamp(TimeUnit::Millisecond, utc), false),
        Field::new("duration_ms", DataType::UInt64, true),
        Field::new("state", DataType::Utf8, false),
        Field::new("strategy", DataType::Utf8, true),
        Field::new("stages", DataType::Utf8, true),
        Field::new("fragments", DataType::UInt64, false),
        Field::new("rows_moved", DataType::UInt64, false),
        Field::new("bytes_moved", DataType::UInt64, false),
        Field::new("result_rows", DataType::UInt64, false),
        Field::new("error", DataType::Utf8, true),
        Field::new("warnings", DataType::Utf8, true),
    ]))
}

/// The rows of `system.queries`.
pub fn queries_batch(records: &[QueryRecord]) -> Result<RecordBatch> {
    let text = |f: &dyn Fn(&QueryRecord) -> Option<String>| -> ArrayRef {
        Arc::new(records.iter().map(f).collect::<StringArray>())
    };
    let num = |f: &dyn Fn(&QueryRecord) -> Option<u64>| -> ArrayRef {
        Arc::new(records.iter().map(f).collect::<UInt64Array>())
    };
    let started = records.iter().map(|r| i64::try_from(r.started_unix_ms).ok()).collect::<TimestampMillisecondArray>();
    let columns: Vec<ArrayRef> = vec![
        text(&|r| Some(r.query_id.clone())),
        text(&|r| Some(r.sql.clone())),
        Arc::new(started.with_timezone("UTC")),
        num(&|r| r.duration_ms),
        text(&|r| Some(r.state.as_str().to_string())),
        text(&|r| (!r.strategies.is_empty()).then(|| r.strategies.join(", "))),
        text(&|r| (!r.stages.is_empty()).then(|| r.stages.join("; "))),
        num(&|r| Some(r.fragments)),
        num(&|r| Some(r.rows_moved)),
        num(&|r| Some(r.bytes_moved)),
        num(&|r| Some(r.result_rows)),
        text(&|r| r.error.clone()),
        text(&|r| (!r.warnings.is_empty()).then(|| r.warnings.join("; "))),
    ];
    Ok(RecordBatch::try_new(queries_schema(), columns)?)
}

#[cfg(test)]
mod tests {
    use datafusion::physical_plan::empty::EmptyExec;
    use datafusion::physical_plan::stream::EmptyRecordBatchStream;

    use super::*;

    fn tracked(log: &Arc<QueryLog>, reads_tables: bool) -> Result<SendableRecordBatchStream, QueryError> {
        let schema = Arc::new(Schema::empty());
        let plan: Arc<dyn ExecutionPlan> = Arc::new(EmptyExec::new(Arc::clone(&schema)));
        let stream: SendableRecordBatchStream = Box::pin(EmptyRecordBatchStream::new(schema));
        log.track("SELECT * FROM t", None, (plan, reads_tables), stream, 0)
    }

    #[test]
    fn long_statements_are_kept_cut() {
        assert_eq!(cut_to_length("SELECT 1"), "SELECT 1");
        let long = format!("SELECT '{}'", "é".repeat(QUERY_LOG_TEXT_MAX_BYTES));
        let kept = cut_to_length(&long);
        assert!(kept.len() < QUERY_LOG_TEXT_MAX_BYTES + 40, "{}", kept.len());
        assert!(kept.starts_with("SELECT 'é") && kept.ends_with(" more bytes)"), "{}", &kept[kept.len() - 40..]);
    }

    /// Past MAX_CONCURRENT_QUERIES running statements that read tables, one more is refused, and
    /// statements that read none still run; one ending makes room.
    #[tokio::test]
    async fn statements_reading_tables_are_capped_and_the_others_are_not() {
        let log = Arc::new(QueryLog::default());
        let mut open: Vec<SendableRecordBatchStream> =
            (0..MAX_CONCURRENT_QUERIES).map(|_| tracked(&log, true).expect("under the cap")).collect();
        let refused = tracked(&log, true).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(refused.contains("too many simultaneous queries"), "{refused}");
        let unlimited: Vec<SendableRecordBatchStream> =
            (0..3).map(|_| tracked(&log, false).expect("reads no table")).collect();
        drop(open.pop());
        assert!(tracked(&log, true).is_ok(), "a query that ended made room");
        drop(unlimited);
    }
}
