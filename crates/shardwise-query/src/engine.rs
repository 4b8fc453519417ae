//! [`QueryEngine`]: turns SQL text into a checked plan, and a plan into a stream of batches.
//!
//! Planning and execution are separate steps because the wire protocols need the result schema
//! before any row exists (Flight SQL's `GetFlightInfo`, pgwire's `Describe`). Planning therefore
//! never runs anything: DataFusion's `SessionContext::sql` would execute DDL while planning, so
//! this uses `SessionState::create_logical_plan` and refuses DDL/DML before the plan can run.

use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::{MemorySchemaProvider, SchemaProvider};
use datafusion::execution::{SendableRecordBatchStream, SessionState, SessionStateBuilder};
use datafusion::logical_expr::{LogicalPlan, Statement, WriteOp};
use datafusion::optimizer::analyzer::resolve_grouping_function::ResolveGroupingFunction;
use datafusion::optimizer::analyzer::type_coercion::TypeCoercion;
use datafusion::physical_plan::EmptyRecordBatchStream;
use datafusion::prelude::{SQLOptions, SessionConfig, SessionContext};
use datafusion::sql::parser::Statement as DfStatement;
use futures::TryStreamExt;
use shardwise_cluster::ClusterView;
use shardwise_storage::{CatalogOp, TableDef};

use crate::access::{InsertOptions, TableAccess};
use crate::cast_names;
use crate::ddl::{self, Classified, Command};
use crate::dist::estimate::GroupEstimates;
use crate::dist::{
    DistributeRule, ExchangeRegistry, FragmentExec, FragmentTicket, LocalShuffle, ShardScanExec,
    decode_fragment_ticket, execute_merged,
};
use crate::error::QueryError;
use crate::format_clause::split_format_clause;
use crate::group_topk::GroupTopKRule;
use crate::memory_limit::{explain_memory_errors, with_memory_limit};
use crate::query_log::QueryLog;
use crate::query_runtime::QueryRuntime;
use crate::repeated_items;
use crate::session::Session;
use crate::settings::{self, ShardwiseSettings};
use crate::sharded_table::ShardedSchema;
use crate::system_settings::{SETTINGS_TABLE, settings_table, show_settings_query};
use crate::system_storage::{StorageSystemTable, StorageTableKind};
use crate::system_tables::{ComputedTable, NODES_TABLE, QUERIES_TABLE, SYSTEM_SCHEMA};
use crate::to_utf8view::to_utf8view_udf;
use crate::view_keys::ViewKeysRule;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::physical_plan::ExecutionPlan;

/// What a planned statement will do.
#[derive(Debug, Clone)]
enum Action {
    /// A DataFusion plan: a query, `SET`, or an `INSERT` into a sharded table.
    Plan(LogicalPlan),
    /// A statement shardwise runs itself (DDL, flush).
    Command(Command),
}

/// A statement that has been parsed, planned and checked, ready to execute. It carries the
/// session state with the statement's `SETTINGS` applied.
#[derive(Debug, Clone)]
pub struct Planned {
    action: Action,
    state: Box<SessionState>,
    /// The statement as the client sent it (for `system.queries`).
    sql: String,
    /// The session it was planned in (`SET` changes it).
    session: Arc<Session>,
    /// PostgreSQL's names for the answer's columns.
    names: crate::postgres_names::OutputNames,
}

impl Planned {
    /// The Arrow schema of the statement's result (empty for statements such as `SET` or DDL),
    /// as its rows will have it: of the plan after DataFusion's analyzer, whose type coercion
    /// can change a column's type (`CASE WHEN c THEN 1 ELSE 0.5 END` is Int64 before it and
    /// Decimal after; a client told Int64 then received decimals). A plan the analyzer refuses
    /// keeps its own schema (running it reports the error).
    pub fn schema(&self) -> SchemaRef {
        match &self.action {
            Action::Plan(plan) => {
                let analyzed =
                    self.state.analyzer().execute_and_check(plan.clone(), self.state.config_options(), |_, _| {});
                match analyzed {
                    Ok(analyzed) => Arc::clone(analyzed.schema().inner()),
                    Err(_) => Arc::clone(plan.schema().inner()),
                }
            }
            Action::Command(Command::Check { .. }) => crate::check_table::schema(
                settings::current(self.state.config_options()).check_query_single_value_result.0,
            ),
            Action::Command(Command::Repair { .. }) => crate::check_table::repair_schema(),
            Action::Command(_) => Arc::new(Schema::empty()),
        }
    }

    /// The answer's schema as the PostgreSQL endpoint describes it: no columns for an INSERT
    /// (PostgreSQL reports its row count in the command tag, not as a row), else
    /// [`Self::schema`] with PostgreSQL's names for unaliased columns (`crate::postgres_names`).
    pub fn postgres_schema(&self) -> SchemaRef {
        match &self.action {
            Action::Plan(LogicalPlan::Dml(_)) => Arc::new(Schema::empty()),
            _ => self.names.apply(&self.schema()),
        }
    }

    /// True for a statement run for its effect rather than its rows: DDL, `INSERT`, `SET`,
    /// `SYSTEM FLUSH`, `KILL QUERY`, `REPAIR TABLE` (not `CHECK TABLE`, which only reads).
    /// Front ends whose protocol runs a query only when its result is fetched (Flight SQL) run
    /// these at once instead, and a read-only request (an HTTP GET) refuses them.
    pub fn runs_for_effect(&self) -> bool {
        match &self.action {
            Action::Command(Command::Check { .. }) => false,
            Action::Command(_) => true,
            Action::Plan(plan) => matches!(
                plan,
                LogicalPlan::Dml(_) | LogicalPlan::Ddl(_) | LogicalPlan::Statement(_) | LogicalPlan::Copy(_)
            ),
        }
    }

    /// The types of parameters `$1` to `$count`, as far as the plan says
    /// ([`crate::parameter_types`]).
    pub fn parameter_types(&self, count: usize) -> Vec<Option<datafusion::arrow::datatypes::DataType>> {
        match &self.action {
            Action::Plan(plan) => crate::parameter_types::of_plan(plan, count),
            Action::Command(_) => vec![None; count],
        }
    }

    /// The DataFusion logical plan, if the statement has one (for `EXPLAIN`-like tooling and
    /// tests).
    pub fn logical_plan(&self) -> Option<&LogicalPlan> {
        match &self.action {
            Action::Plan(plan) => Some(plan),
            Action::Command(_) => None,
        }
    }
}

/// The SQL session layer of one node: one DataFusion context with the `system` schema and, when
/// the node stores tables, the sharded tables as the default schema.
pub struct QueryEngine {
    ctx: SessionContext,
    access: Option<Arc<dyn TableAccess>>,
    /// Shuffle stage-1 outputs this node holds for other nodes to fetch.
    exchanges: Arc<ExchangeRegistry>,
    /// Where plans execute, apart from the network and the heartbeats.
    runtime: QueryRuntime,
    /// The queries this node runs as initiator (`system.queries`, `KILL QUERY`).
    log: Arc<QueryLog>,
    /// This node's rank (named in errors).
    rank: u32,
}

impl std::fmt::Debug for QueryEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueryEngine").field("session_id", &self.ctx.session_id()).finish_non_exhaustive()
    }
}

/// The one catalog: what `current_database()`, `information_schema` and Flight SQL's
/// `GetCatalogs` name, and the database PostgreSQL clients connect to.
pub const CATALOG: &str = "shardwise";

fn internal(message: String) -> QueryError {
    QueryError::Internal(datafusion::error::DataFusionError::Internal(message))
}

/// The analyzer rules a node runs first, ending with DataFusion's two (its default list): what
/// must see the plan before DataFusion's type coercion. Shared with anything that must plan as a
/// node does (the tests' single-node oracle).
pub fn analyzer_rules_first() -> Vec<Arc<dyn datafusion::optimizer::AnalyzerRule + Send + Sync>> {
    vec![
        // `INTERSECT ALL` / `EXCEPT ALL` by count, before anything else sees their joins (see
        // `crate::set_operations`).
        Arc::new(crate::set_operations::CountedSetOperations),
        // `GROUPING SETS (())` as the aggregate of all rows (see `crate::empty_grouping_sets`).
        Arc::new(crate::empty_grouping_sets::EmptyGroupingSets),
        // A window below a correlation is refused before subqueries are rewritten (see
        // `crate::correlated_windows`).
        Arc::new(crate::correlated_windows::CorrelatedWindows),
        // DECIMALs meet floats as floats, and exact quotients keep 16 digits, before
        // DataFusion's coercion (see `crate::numeric_coercion`).
        Arc::new(crate::numeric_coercion::PostgresNumericCoercion),
        // `extract(second ...)` with the fraction (see `crate::fractional_seconds`).
        Arc::new(crate::fractional_seconds::FractionalSeconds),
        // `date ± interval` as a TIMESTAMP (see `crate::date_intervals`).
        Arc::new(crate::date_intervals::DateIntervalsAsTimestamps),
        // `SIMILAR TO` as a whole-string match of the standard's pattern (see
        // `crate::similar_to`).
        Arc::new(crate::similar_to::SimilarToAsRegex),
        Arc::new(ResolveGroupingFunction::new()),
        Arc::new(TypeCoercion::new()),
    ]
}

impl QueryEngine {
    /// An engine without tables: `system.nodes` and plain SQL only.
    pub fn new(cluster: Arc<dyn ClusterView>) -> Result<Self, QueryError> {
        Self::build(cluster, None, 0)
    }

    /// An engine whose default schema is the cluster's sharded tables, stored through `access`,
    /// on a node that may hold `max_server_memory_bytes` while it runs them (0: no limit;
    /// `crate::server_memory`).
    pub fn with_tables(
        cluster: Arc<dyn ClusterView>,
        access: Arc<dyn TableAccess>,
        max_server_memory_bytes: u64,
    ) -> Result<Self, QueryError> {
        Self::build(cluster, Some(access), max_server_memory_bytes)
    }

    fn build(
        cluster: Arc<dyn ClusterView>,
        access: Option<Arc<dyn TableAccess>>,
        max_server_memory_bytes: u64,
    ) -> Result<Self, QueryError> {
        let cluster_rank = cluster.rank();
        // Shuffle buckets this node fetches from itself are handed over in process.
        let exchanges = Arc::new(ExchangeRegistry::default());
        let local_shuffle = access.map(|inner| Arc::new(LocalShuffle::new(inner, Arc::clone(&exchanges))));
        let access = local_shuffle.clone().map(|a| a as Arc<dyn TableAccess>);
        let mut config = SessionConfig::new()
            .with_default_catalog_and_schema(CATALOG, "public")
            .with_information_schema(true)
            .with_option_extension(ShardwiseSettings::default());
        // Tables store strings as Utf8; plan string literals and casts the same way.
        config.options_mut().sql_parser.map_string_types_to_utf8view = false;
        // `0.1` is the exact DECIMAL written, as in PostgreSQL and DuckDB (see
        // `crate::numeric_coercion`).
        config.options_mut().sql_parser.parse_float_as_decimal = true;
        // Top-N per group without a full sort (`row_number() ... <= N`, see `crate::group_topk`).
        let mut runtime = datafusion::execution::runtime_env::RuntimeEnvBuilder::new();
        if max_server_memory_bytes > 0 {
            let pool = crate::server_memory::ServerMemory::start(max_server_memory_bytes, cluster_rank);
            runtime = runtime.with_memory_pool(pool);
        }
        let runtime = runtime.build_arc().map_err(QueryError::Internal)?;
        let mut state = SessionStateBuilder::new()
            .with_config(config)
            .with_runtime_env(runtime)
            .with_default_features()
            // shardwise's rules that run before DataFusion's own (see `analyzer_rules_first`).
            .with_analyzer_rules(analyzer_rules_first())
            // Literals compared with DECIMALs as written (see `crate::numeric_literals`).
            .with_analyzer_rule(Arc::new(crate::numeric_literals::ExactDecimalLiterals))
            .with_analyzer_rule(Arc::new(crate::integer_timestamps::IntegersAsSeconds))
            // A recursive term that aggregates its own rows is refused (see
            // `crate::recursive_terms`).
            .with_analyzer_rule(Arc::new(crate::recursive_terms::RecursiveTerms))
            // An insert stores no fraction into an integer (see `crate::insert_exact`).
            .with_analyzer_rule(Arc::new(crate::insert_exact::StrictInsertCasts))
            // `count(DISTINCT x)` of floats takes -0.0 for 0.0 (see `crate::distinct_zero`).
            .with_analyzer_rule(Arc::new(crate::distinct_zero::DistinctFloatZeros))
            // information_schema.columns.ordinal_position from 1 (see
            // `crate::information_schema_positions`).
            .with_analyzer_rule(Arc::new(crate::information_schema_positions::OrdinalFromOne))
            // '2024-01-01 10:00' and ' 2024-01-01 ' as dates and times (see `crate::time_literals`).
            .with_analyzer_rule(Arc::new(crate::time_literals::TimeLiterals))
            // A fraction cast to an integer rounds (see `crate::rounding_casts`).
            .with_analyzer_rule(Arc::new(crate::rounding_casts::RoundingCasts))
            // A timestamp or a float as text reads as PostgreSQL writes it (see
            // `crate::postgres_text`).
            .with_analyzer_rule(Arc::new(crate::postgres_text::PostgresText))
            // Intervals compare and sort by their length (see `crate::interval_order`).
            .with_analyzer_rule(Arc::new(crate::interval_order::IntervalOrder))
            // Ranks in the answer are BIGINT (see `crate::rank_types`).
            .with_analyzer_rule(Arc::new(crate::rank_types::RankTypes))
            // Integer arithmetic that overflows fails (see `crate::checked_integers`).
            .with_analyzer_rule(Arc::new(crate::checked_integers::CheckedIntegerArithmetic))
            // EXISTS / IN / NOT IN where DataFusion's joins answer wrongly (see
            // `crate::predicate_subqueries`); before the scalar rules, which take what it makes.
            .with_analyzer_rule(Arc::new(crate::predicate_subqueries::PredicateSubqueries))
            // Correlated scalar subqueries without an aggregate (see `crate::scalar_subqueries`).
            .with_analyzer_rule(Arc::new(crate::scalar_subqueries::ScalarSubqueryRows))
            // ... and those DataFusion cannot join, per outer row (see `crate::numbered_subqueries`).
            .with_analyzer_rule(Arc::new(crate::numbered_subqueries::NumberedOuterRows))
            .with_physical_optimizer_rule(Arc::new(GroupTopKRule));
        // String GROUP BY keys grouped as Utf8View (see `crate::view_keys`).
        // Both read group estimates from one cache (see `crate::dist::estimate`).
        let estimates = access.as_ref().map(|access| Arc::new(GroupEstimates::new(Arc::clone(access))));
        let view_keys = match &estimates {
            Some(estimates) => ViewKeysRule::new(Arc::clone(estimates)),
            None => ViewKeysRule::default(),
        };
        state = state.with_optimizer_rule(Arc::new(view_keys));
        // Last of the logical rules, after filters are pushed down and merged: a condition's guard
        // of a division or cast holds (see `crate::guarded_operands`).
        state = state.with_optimizer_rule(Arc::new(crate::guarded_operands::GuardedOperands));
        if let (Some(access), Some(estimates)) = (&access, estimates) {
            // Last of the physical rules: it cuts the finished single-node plan into fragments.
            let rule = DistributeRule::new(Arc::clone(access), Arc::clone(&cluster), estimates);
            state = state.with_physical_optimizer_rule(Arc::new(rule));
        }
        let ctx = SessionContext::new_with_state(state.build());
        // Fragments that carry it are decoded by name on the node that runs them.
        ctx.register_udf(to_utf8view_udf().as_ref().clone());
        ctx.register_udf(crate::insert_exact::insert_fits_udf().as_ref().clone());
        ctx.register_udf(crate::time_floor::floor_time_udf().as_ref().clone());
        ctx.register_udf(cast_names::cast_named_udf().as_ref().clone());
        for udf in crate::checked_integers::checked_udfs() {
            ctx.register_udf(udf.as_ref().clone());
        }
        // `sum` of integers fails past its type's range (see `crate::checked_sum`).
        ctx.register_udaf(crate::checked_sum::checked_sum_udaf().as_ref().clone());
        // PostgreSQL's names of functions DataFusion has under others.
        ctx.register_udf(datafusion::functions::math::signum().as_ref().clone().with_aliases(["sign"]));
        let variance = datafusion::functions_aggregate::variance::var_samp_udaf();
        ctx.register_udaf(variance.as_ref().clone().with_aliases(["variance"]));
        let every = datafusion::functions_aggregate::bool_and_or::bool_and_udaf();
        ctx.register_udaf(every.as_ref().clone().with_aliases(["every"]));
        // `coalesce(date, '2020-01-01')` (see `crate::coalesce_types`).
        ctx.register_udf(crate::coalesce_types::coalesce_udf());
        // What a float cast to an integer is rounded with (see `crate::rounding_casts`).
        ctx.register_udf(crate::rounding_casts::round_half_even_udf().as_ref().clone());
        ctx.register_udf(crate::similar_to::similar_to_escape_udf().as_ref().clone());
        ctx.register_udf(crate::any_nulls::any_nulls_udf().as_ref().clone());
        ctx.register_udf(crate::regexp_replacement::regexp_replace_udf());
        ctx.register_udf(crate::age::age_udf().as_ref().clone());
        ctx.register_udf(crate::like_escape::like_pattern_udf().as_ref().clone());
        ctx.register_udf(crate::interval_order::interval_order_udf().as_ref().clone());
        ctx.register_udf(crate::postgres_text::postgres_text_udf().as_ref().clone());
        ctx.register_udf(crate::interval_scaling::interval_scale_udf().as_ref().clone());
        // `lpad`/`rpad` bounded, negative lengths as PostgreSQL (see `crate::pad_limits`).
        for udf in crate::pad_limits::pad_udfs() {
            ctx.register_udf(udf);
        }
        // `repeat` bounded (see `crate::repeat_limits`).
        ctx.register_udf(crate::repeat_limits::repeat_udf());
        // `min`/`max` of floats by group order NaN highest (see `crate::float_min_max`).
        for udaf in crate::float_min_max::min_max_udafs() {
            ctx.register_udaf(udaf.as_ref().clone());
        }
        ctx.register_udaf(crate::scalar_subqueries::single_value_udaf().as_ref().clone());
        ctx.register_udf(crate::scalar_subqueries::single_row_udf().as_ref().clone());
        if let Some(local_shuffle) = &local_shuffle {
            local_shuffle.set_context(ctx.task_ctx());
        }
        let options = ctx.state().config_options().catalog.clone();
        let catalog = ctx
            .catalog(&options.default_catalog)
            .ok_or_else(|| internal(format!("default catalog {:?} is missing", options.default_catalog)))?;
        let system = Arc::new(MemorySchemaProvider::new());
        system
            .register_table(NODES_TABLE.to_string(), Arc::new(ComputedTable::nodes(cluster)))
            .map_err(QueryError::Internal)?;
        if let Some(access) = &access {
            for kind in StorageTableKind::ALL {
                let table = Arc::new(StorageSystemTable::new(kind, Arc::clone(access)));
                system.register_table(kind.name().to_string(), table).map_err(QueryError::Internal)?;
            }
            let public = Arc::new(ShardedSchema::new(Arc::clone(access)));
            catalog.register_schema(&options.default_schema, public).map_err(QueryError::Internal)?;
        }
        let log = Arc::new(QueryLog::default());
        system
            .register_table(QUERIES_TABLE.to_string(), Arc::new(ComputedTable::queries(Arc::clone(&log))))
            .map_err(QueryError::Internal)?;
        catalog
            .register_schema(SYSTEM_SCHEMA, Arc::clone(&system) as Arc<dyn SchemaProvider>)
            .map_err(QueryError::Internal)?;
        crate::pg_catalog::install(&ctx, &options.default_catalog)?;
        // After the install, which rebuilds the session state (turning off
        // `create_default_catalog_and_schema`, the catalog being there): the defaults are the
        // values every statement starts from, so SHOW CHANGED SETTINGS lists what a session changed.
        let settings_table = Arc::new(settings_table(ctx.state().config_options()));
        system.register_table(SETTINGS_TABLE.to_string(), settings_table).map_err(QueryError::Internal)?;
        let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let runtime = QueryRuntime::new(threads)?;
        let rank = cluster_rank;
        Ok(QueryEngine { ctx, access, exchanges, runtime, log, rank })
    }

    /// What statements DataFusion may run: queries and session statements (`SET`), but not its
    /// own DDL and DML (`CREATE EXTERNAL TABLE`, `COPY`), which would bypass shardwise. `INSERT`
    /// into a sharded table is checked separately.
    fn sql_options() -> SQLOptions {
        SQLOptions::new().with_allow_ddl(false).with_allow_dml(false).with_allow_statements(true)
    }

    /// Counts over the queries this node ran as initiator, and how many run now.
    pub fn query_totals(&self) -> (crate::query_log::QueryTotals, usize) {
        (self.log.totals(), self.log.running())
    }

    /// A one-statement session (an HTTP request) with `settings` (name, value) set, each checked
    /// as `SET` would check it; `insert_id` among them names the statement's insert.
    pub fn session_with(&self, settings: &[(String, String)]) -> Result<Arc<Session>, QueryError> {
        let session = Arc::new(Session::for_one_statement());
        let state = self.ctx.state();
        for (name, value) in settings {
            session.set(state.config_options(), &settings::option_key(name), value)?;
        }
        Ok(session)
    }

    /// The table layer, if this engine stores tables.
    pub fn tables(&self) -> Option<&Arc<dyn TableAccess>> {
        self.access.as_ref()
    }

    fn access(&self, what: &str) -> Result<&Arc<dyn TableAccess>, QueryError> {
        self.access.as_ref().ok_or_else(|| QueryError::Unsupported(format!("{what} (this engine stores no tables)")))
    }

    /// Runs a fragment another node sent (an encoded [`crate::dist::FragmentTicket`]) over this
    /// node's shards.
    /// Also returns the plan being run, whose metrics are final once the stream has ended (see
    /// [`crate::dist::fragment::outcome`]), and whether the ticket asks for it to be reported.
    pub fn run_fragment(
        &self,
        ticket: &[u8],
    ) -> Result<(SendableRecordBatchStream, Arc<dyn ExecutionPlan>, bool), QueryError> {
        let access = self.access("a distributed query fragment")?;
        let ticket = FragmentTicket::decode(ticket)?;
        let limit = ticket.header.max_memory_usage;
        let report = ticket.header.report;
        let (context, stop) = crate::stop::with_stop_flag(with_memory_limit(self.ctx.task_ctx(), limit)?);
        let plan = decode_fragment_ticket(Arc::clone(access), &context, ticket)?;
        let run = Arc::clone(&plan);
        let stream = self.runtime.drive(plan.schema(), move || execute_merged(run, context))?;
        let stream = crate::stop::stop_on_drop(explain_memory_errors(stream, limit, self.rank), stop);
        Ok((stream, plan, report))
    }

    /// Serves a shuffle bucket request (a [`crate::dist::shuffle`] ticket): runs this node's
    /// stage 1 for the shard on first request, then hands out the bucket; with the stage-1 plan
    /// to report after the bucket's last row when the request asks for it (`EXPLAIN ANALYZE`).
    pub async fn shuffle_bucket(
        &self,
        ticket: &[u8],
    ) -> Result<(SendableRecordBatchStream, Option<Arc<dyn ExecutionPlan>>), QueryError> {
        let access = Arc::clone(self.access("a shuffle")?);
        let (exchanges, context, ticket) = (Arc::clone(&self.exchanges), self.ctx.task_ctx(), ticket.to_vec());
        let rank = self.rank;
        // On the query runtime: stage 1, started by the first request, runs there.
        Ok(self.runtime.run(async move { exchanges.fetch(access, context, &ticket, rank) }).await?)
    }

    /// Every table a query can name ([`crate::table_listing`]).
    pub async fn listed_tables(&self) -> Vec<crate::table_listing::ListedTable> {
        crate::table_listing::list_tables(&self.ctx).await
    }

    /// Every `(catalog, schema)` a query can name.
    pub fn listed_schemas(&self) -> Vec<(String, String)> {
        crate::table_listing::list_schemas(&self.ctx)
    }

    /// Inserts rows read outside SQL (PostgreSQL's `COPY ... FROM STDIN`, the rows after an HTTP
    /// `INSERT ... FORMAT CSV`) into `table`, as an
    /// `INSERT` would under `session`'s settings and then the statement's own (`statement`, a
    /// `SETTINGS` clause: `insert_id`); `batches` have the table's columns. The rows stored.
    /// Recorded in `system.queries` as `sql` (what the client sent, described).
    pub async fn insert_batches(
        &self,
        table: &str,
        batches: Vec<RecordBatch>,
        session: &Arc<Session>,
        statement: &[(String, String)],
        sql: &str,
    ) -> Result<u64, QueryError> {
        self.insert_batches_as(table, batches, session, statement, Recorded::Ended(sql), None).await
    }

    /// The `(id, generation)` of the table named `table` now, if this node stores tables and has
    /// one by that name: what an insert whose rows arrive later is bound to
    /// ([`QueryEngine::insert_batches_as`]).
    pub fn incarnation_of(&self, table: &str) -> Option<(u64, u64)> {
        self.tables()?.catalog().tables.get(table).map(|e| (e.id, e.generation))
    }

    /// [`QueryEngine::insert_batches`] for a statement registered while its rows arrived
    /// ([`QueryEngine::begin_statement`]: a `COPY ... FROM STDIN`), ended here with the insert's
    /// outcome; bound to the table `incarnation` when given (the one the statement named when it
    /// began: renamed since, the rows follow it; dropped or truncated since, the insert fails
    /// rather than go to a table that took the name).
    pub async fn insert_batches_as(
        &self,
        table: &str,
        batches: Vec<RecordBatch>,
        session: &Arc<Session>,
        statement: &[(String, String)],
        recorded: Recorded<'_>,
        incarnation: Option<(u64, u64)>,
    ) -> Result<u64, QueryError> {
        let started = std::time::Instant::now();
        let current = self.settings_of(session, statement);
        let query_id = current.as_ref().ok().and_then(|c| c.query_id.clone());
        let stored = async {
            let mut opts = InsertOptions::from_settings(&current?)?;
            opts.incarnation = incarnation.or(opts.incarnation);
            self.access("storing rows")?.insert(table, batches, opts).await
        }
        .await;
        // One row answered (the count), as for every insert in `system.queries`.
        let outcome = stored.as_ref().map(|_| 1).map_err(ToString::to_string);
        match recorded {
            Recorded::Ended(sql) => self.log.record_ended(sql, started, query_id, outcome.map(|_| ())),
            Recorded::Running(running) => running.end(outcome),
        }
        stored
    }

    /// The settings a statement runs under: `session`'s, then the statement's own.
    fn settings_of(
        &self,
        session: &Arc<Session>,
        statement: &[(String, String)],
    ) -> Result<ShardwiseSettings, QueryError> {
        let mut state = self.ctx.state();
        session.apply(state.config_mut().options_mut())?;
        settings::apply(state.config_mut().options_mut(), statement)?;
        Ok(settings::current(state.config_options()))
    }

    /// [`QueryEngine::plan`] for a statement about to be run (not a probe of its result schema):
    /// a failure is recorded in `system.queries`.
    pub async fn plan_to_run(&self, sql: &str, session: &Arc<Session>) -> Result<Planned, QueryError> {
        let started = std::time::Instant::now();
        self.plan(sql, session)
            .await
            .inspect_err(|e| self.log.record_failed(sql, &e.to_string(), started, named_query_id(sql, session)))
    }

    /// Parses and plans one statement of `session` without executing anything: the node's
    /// settings, then the session's, then the statement's `SETTINGS`.
    pub async fn plan(&self, sql: &str, session: &Arc<Session>) -> Result<Planned, QueryError> {
        crate::query_runtime::with_worker_freed(self.plan_here(sql, session)).await
    }

    /// [`Self::plan`], on the calling thread.
    async fn plan_here(&self, sql: &str, session: &Arc<Session>) -> Result<Planned, QueryError> {
        // Planned against a catalog as new as the master's (see `TableAccess::ensure_catalog_current`).
        if let Some(access) = &self.access {
            access.ensure_catalog_current().await?;
        }
        if let (_, Some(_)) = split_format_clause(sql)? {
            return Err(QueryError::Rejected(
                "FORMAT: over PostgreSQL and Flight SQL the rows travel typed and the client formats them; \
                 the HTTP API (POST /query) and shardwise sql take a FORMAT clause"
                    .into(),
            ));
        }
        let (body, pairs) = settings::split_settings_clause(sql)?;
        let body = settings::qualify_set(&body)?;
        let body = show_settings_query(&body)?.unwrap_or(body);
        let body = crate::clickhouse_statements::rewrite(&body)?.unwrap_or(body);
        let mut state = self.ctx.state();
        session.apply(state.config_mut().options_mut())?;
        settings::apply(state.config_mut().options_mut(), &pairs)?;
        let session = Arc::clone(session);
        // Statements no SQL parser knows, each with what it needs sharded tables for (if it does).
        type Recognise = fn(&str) -> Result<Option<Command>, QueryError>;
        let recognisers: [(Recognise, Option<&str>); 5] = [
            (ddl::kill_command, None),
            (ddl::exchange_command, None),
            (ddl::flush_command, Some("SYSTEM FLUSH DISTRIBUTED")),
            (ddl::check_command, Some("CHECK TABLE")),
            (ddl::repair_command, Some("REPAIR TABLE")),
        ];
        let mut command = None;
        for (recognise, needs_tables) in recognisers {
            command = recognise(&body)?;
            if command.is_some() {
                if let Some(what) = needs_tables {
                    self.access(what)?;
                }
                break;
            }
        }
        if let Some(command) = command {
            return Ok(Planned {
                action: Action::Command(command),
                state: Box::new(state),
                sql: sql.to_string(),
                session,
                names: Default::default(),
            });
        }
        let dialect = state.config().options().sql_parser.dialect;
        let recursion_limit: usize = state.config().options().sql_parser.recursion_limit.into();
        let mut statement = state
            .sql_to_statement(&body, &dialect)
            .map_err(|e| crate::ast_limits::explain_parse_failure(e, &body, recursion_limit))?;
        // A chain of operators deep enough to exhaust a thread's stack is refused here.
        let max_ast_depth = settings::current(state.config().options()).max_ast_depth;
        crate::ast_limits::check_depth(&statement, max_ast_depth)?;
        // Read before any rewrite names or changes an item.
        let names = crate::postgres_names::OutputNames::of(&statement);
        repeated_items::name_repeated_items(&mut statement);
        // `uniq(x)`, `countIf(c)`, `toStartOfHour(t)` ... as DataFusion computes them (see
        // `crate::clickhouse_functions`).
        crate::clickhouse_functions::as_datafusion(&mut statement, &state)?;
        // ClickHouse's `LIMIT n BY x` as a numbering within each `x` (see `crate::limit_by`).
        crate::limit_by::as_window(&mut statement)?;
        // `GROUP BY a WITH ROLLUP | CUBE | TOTALS`, which DataFusion ignored, as grouping sets
        // (see `crate::group_by_modifiers`).
        crate::group_by_modifiers::as_grouping_sets(&mut statement)?;
        // `PREWHERE` as `WHERE`, a `SAMPLE` refused: DataFusion dropped both without a word (see
        // `crate::unplanned_clauses`).
        crate::unplanned_clauses::planned_or_refused(&mut statement)?;
        // `a IS DISTINCT FROM b AND c` and `a ^ b` as PostgreSQL reads them (see
        // `crate::postgres_operators`).
        crate::postgres_operators::bind_as_postgres(&mut statement);
        // `(a, b) IN ((-1, 'x'))`: row values DataFusion refused (see `crate::tuples`).
        crate::tuples::as_structs(&mut statement);
        // `OVER (w ORDER BY x)` with the clauses of `w` (see `crate::named_windows`).
        crate::named_windows::copy_named_windows(&mut statement);
        // A NATURAL join as USING over the columns its tables share (see `crate::natural_joins`).
        crate::natural_joins::natural_as_using(&mut statement, &state).await?;
        // `JOIN ... USING (k)`'s merged `k` as PostgreSQL has it (see `crate::using_joins`).
        crate::using_joins::merge_using_columns(&mut statement);
        // `SELECT generate_series(1, 3)` as rows (see `crate::set_returning`).
        crate::set_returning::rows_of_set_returning_items(&mut statement);
        // `FETCH FIRST n ROWS ONLY` as `LIMIT n` (see `crate::fetch_clause`).
        crate::fetch_clause::fetch_as_limit(&mut statement);
        // `'{a,b}'::text[]` as the array it writes (see `crate::array_literals`).
        crate::array_literals::casts_as_arrays(&mut statement)?;
        // `INTERVAL '1 day 02:00:00'` and ISO 8601 durations (see `crate::interval_text`).
        crate::interval_text::interval_literals(&mut statement);
        // An INSERT's values go into DECIMAL columns exactly (see `crate::numeric_literals`).
        if crate::numeric_literals::is_insert_values(&statement) {
            state.config_mut().options_mut().sql_parser.parse_float_as_decimal = true;
            crate::numeric_literals::values_operands_as_double(&mut statement);
        }
        if state.config().options().sql_parser.parse_float_as_decimal {
            crate::numeric_literals::exponents_as_double(&mut statement);
        }
        let world_size = self.access.as_ref().map(|a| a.world_size()).unwrap_or(1);
        let statement = match ddl::classify(statement, &state, world_size).await? {
            Classified::Command(command) => {
                self.access("DDL")?;
                return Ok(Planned {
                    action: Action::Command(command),
                    state: Box::new(state),
                    sql: sql.to_string(),
                    session,
                    names: Default::default(),
                });
            }
            Classified::DataFusion(statement) => statement,
        };
        // Kept for a second planning only for a query (an INSERT's VALUES can be large).
        let retry = repeated_items::is_query(&statement).then(|| statement.clone());
        let first = state.statement_to_plan(statement).await;
        let collides = match &first {
            Err(e) => repeated_items::is_name_collision(e),
            // A value and a cast of it grouped by (`GROUP BY f, f::text`) have one name to
            // DataFusion, which refuses the plan only as it optimizes it: planned again now.
            Ok(plan) => cast_names::grouping_names_collide(plan),
        };
        let plan = match (first, retry) {
            // Items whose DataFusion names collide though their texts differ (`x, CAST(x AS
            // DOUBLE)` are both `x` to it): planned again with each unaliased expression named
            // by its text, as DuckDB names them.
            (_, Some(mut named)) if collides => {
                repeated_items::name_expressions_by_text(&mut named);
                // Casts are named like what they cast (`max(x)`, `max(x::text)`): told apart
                // by their type (see `crate::cast_names`).
                cast_names::name_casts(&mut named);
                state.statement_to_plan(named).await
            }
            (planned, _) => planned,
        }
        .map_err(|e| match crate::insert_values::rephrase_row_length(&e.strip_backtrace()) {
            Some(message) => QueryError::Rejected(message),
            None => match self.unknown_user_table(&e) {
                Some(message) => QueryError::Rejected(message),
                None => QueryError::from(e),
            },
        })?;
        // `distributed_group_by_no_merge = 2` orders and limits by the query as written.
        if settings::current(state.config_options()).distributed_group_by_no_merge == 2 {
            crate::dist::query_order::QueryOrder::of(&plan).install(state.config_mut().options_mut());
        }
        let is_insert =
            |plan: &LogicalPlan| matches!(plan, LogicalPlan::Dml(dml) if matches!(dml.op, WriteOp::Insert(_)));
        match &plan {
            // EXPLAIN of an INSERT shows its plan; EXPLAIN ANALYZE would run it, which it does
            // not say it does, so it is refused by name.
            LogicalPlan::Explain(explain) if is_insert(&explain.plan) && self.access.is_some() => {
                return Ok(Planned {
                    action: Action::Plan(plan),
                    state: Box::new(state),
                    sql: sql.to_string(),
                    session,
                    names: Default::default(),
                });
            }
            LogicalPlan::Analyze(analyze) if is_insert(&analyze.input) => {
                return Err(QueryError::Unsupported(
                    "EXPLAIN ANALYZE of an INSERT (it would write the rows); EXPLAIN INSERT shows its plan".into(),
                ));
            }
            _ => {}
        }
        if !(is_insert(&plan) && self.access.is_some()) {
            Self::sql_options()
                .verify_plan(&plan)
                .map_err(|e| QueryError::Unsupported(describe_refusal(&e.find_root().message())))?;
        }
        Ok(Planned { action: Action::Plan(plan), state: Box::new(state), sql: sql.to_string(), session, names })
    }

    /// Registers in `system.queries` a statement that runs outside a plan while its client sends
    /// rows (a Flight SQL bulk ingest, as `shardwise load` sends; a `COPY ... FROM STDIN`): see
    /// [`QueryLog::begin`].
    pub fn begin_statement(
        &self,
        sql: &str,
        query_id: Option<String>,
    ) -> Result<crate::query_log::RunningStatement, QueryError> {
        self.log.begin(sql, query_id)
    }

    /// The `query_id` a statement runs under: its own `SETTINGS`, else its session's.
    pub fn query_id_of(&self, session: &Arc<Session>, statement: &[(String, String)]) -> Option<String> {
        self.settings_of(session, statement).ok().and_then(|current| current.query_id)
    }

    /// The node's memory pool (`max_server_memory_usage`), for memory held outside a plan, such
    /// as a bulk ingest's rows held until its stream ends.
    pub fn memory_pool(&self) -> Arc<dyn datafusion::execution::memory_pool::MemoryPool> {
        Arc::clone(&self.ctx.runtime_env().memory_pool)
    }

    /// DataFusion's `table 'shardwise.public.x' not found`, as an `INSERT ... VALUES` into it
    /// says it: `unknown table "x"; tables: ...` (one message for a missing table, whatever the
    /// statement; found by race testing, where both came up by the thousand).
    fn unknown_user_table(&self, e: &datafusion::error::DataFusionError) -> Option<String> {
        let datafusion::error::DataFusionError::Plan(message) = e.find_root() else { return None };
        let name = message.strip_prefix("table '")?.strip_suffix("' not found")?;
        let name = name.strip_prefix(&format!("{CATALOG}.public."))?;
        let catalog = self.access.as_ref()?.catalog();
        // Planned against a catalog without it, listed from a newer one that has it (a CREATE or
        // RENAME meanwhile): said so, rather than name it among the tables it is missing from.
        if catalog.tables.contains_key(name) {
            return Some(format!(
                "table {name:?} did not exist when the statement was planned, and does now (created or renamed \
                 meanwhile): run it again"
            ));
        }
        Some(catalog.unknown_table(name).to_string())
    }

    /// Executes a planned statement; rows arrive on the returned stream (which can still fail,
    /// with errors `QueryError::from` classifies).
    pub async fn execute(&self, planned: Planned) -> Result<SendableRecordBatchStream, QueryError> {
        // Not on a freed worker as planning is: a statement that runs for its effect (CREATE
        // TABLE ... AS SELECT) runs here, and must stop when its caller goes away.
        let Planned { action, state, sql, session, .. } = planned;
        match action {
            Action::Plan(LogicalPlan::Statement(Statement::SetVariable(set))) => {
                session.set(state.config_options(), &set.variable, &set.value)?;
                Ok(Box::pin(EmptyRecordBatchStream::new(Arc::new(Schema::empty()))))
            }
            Action::Plan(LogicalPlan::Statement(Statement::ResetVariable(reset))) => {
                session.reset(&reset.variable);
                Ok(Box::pin(EmptyRecordBatchStream::new(Arc::new(Schema::empty()))))
            }
            // SQL-level PREPARE / EXECUTE: DataFusion keeps prepared statements in the node's one
            // context, shared by every connection and never freed, and EXECUTE's answer did not
            // reach PostgreSQL clients; refused, pointing at the drivers' prepared statements.
            Action::Plan(LogicalPlan::Statement(Statement::Prepare(_) | Statement::Execute(_))) => {
                Err(QueryError::Unsupported(
                    "SQL PREPARE and EXECUTE are not supported: use your driver's prepared statements \
                     (the protocol's Parse/Bind, which psycopg, JDBC and ADBC use), or send the statement itself"
                        .to_string(),
                ))
            }
            Action::Plan(plan @ LogicalPlan::Statement(_)) => {
                let frame = self.ctx.execute_logical_plan(plan).await?;
                Ok(frame.execute_stream().await?)
            }
            Action::Plan(plan) => {
                let plan_is_analyze = matches!(plan, LogicalPlan::Analyze(_));
                let insert_casts = crate::insert_select::InsertCasts::of(&plan);
                let started = std::time::Instant::now();
                // Physical planning is CPU work too (a million-item IN list is pushed down and
                // compared for seconds): on a freed worker, as logical planning is, so that the
                // node's heartbeats queued behind it go on. It ends by itself.
                let physical = crate::query_runtime::with_worker_freed(state.create_physical_plan(&plan));
                let physical = physical.await.map_err(|e| {
                    // A constant that does not fit its column fails as the optimizer folds it.
                    let e = QueryError::from(e);
                    let cast = insert_casts.as_ref().and_then(|casts| casts.explain(&e.to_string()));
                    let e = match (crate::insert_values::first_bad_value(&plan), cast) {
                        (Some(bad), _) => QueryError::Rejected(bad.to_string()),
                        (None, Some(message)) => QueryError::Rejected(message),
                        (None, None) => e,
                    };
                    let query_id = settings::current(state.config_options()).query_id;
                    self.log.record_failed(&sql, &e.to_string(), started, query_id);
                    e
                })?;
                let current = settings::current(state.config_options());
                let memory_limit = current.max_memory_usage;
                let (plan, context) = (Arc::clone(&physical), with_memory_limit(state.task_ctx(), memory_limit)?);
                let (context, stop) = crate::stop::with_stop_flag(context);
                if plan_is_analyze {
                    let _ = physical.apply(|node| {
                        if let Some(fragment) = node.downcast_ref::<FragmentExec>() {
                            fragment.keep_reports();
                        }
                        Ok(TreeNodeRecursion::Continue)
                    });
                }
                // Plans that read tables run on the query runtime; the rest (an INSERT of VALUES,
                // a SELECT of constants) are cheap, and a hop between runtimes would only add
                // latency to them.
                let reads = reads_tables(&physical);
                let stream = match reads {
                    true => self
                        .runtime
                        .drive(physical.schema(), move || datafusion::physical_plan::execute_stream(plan, context))?,
                    false => datafusion::physical_plan::execute_stream(plan, context)?,
                };
                let stream = explain_memory_errors(stream, memory_limit, self.rank);
                let stream = crate::decimal_check::checked(stream);
                let stream = match insert_casts {
                    Some(casts) => casts.explain_errors(stream),
                    None => stream,
                };
                let stream = match plan_is_analyze {
                    true => with_fragment_reports(stream, Arc::clone(&physical)),
                    false => stream,
                };
                let stream = match session.is_recorded() {
                    true => self.log.track(
                        &sql,
                        current.query_id.clone(),
                        (physical, reads),
                        stream,
                        current.max_execution_time_ms,
                    )?,
                    false => stream,
                };
                Ok(crate::stop::stop_on_drop(stream, stop))
            }
            Action::Command(command) => match self.run_command(command, state, sql, session).await? {
                None => Ok(Box::pin(EmptyRecordBatchStream::new(Arc::new(Schema::empty())))),
                Some(batch) => {
                    let schema = batch.schema();
                    let rows = futures::stream::iter([Ok(batch)]);
                    Ok(Box::pin(datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(schema, rows)))
                }
            },
        }
    }

    /// `CREATE TABLE ... AS SELECT`: creates the table, then runs the insert as any other
    /// statement (logged, killable, under the statement's settings), dropping the table again if
    /// it fails.
    async fn create_table_as(
        &self,
        def: TableDef,
        if_not_exists: bool,
        insert: DfStatement,
        state: Box<SessionState>,
        sql: String,
        session: Arc<Session>,
    ) -> Result<(), QueryError> {
        let access = self.access("DDL")?;
        let name = def.name.clone();
        if if_not_exists && access.catalog().tables.contains_key(&name) {
            return Ok(());
        }
        // Not IF NOT EXISTS here: whoever creates the table first fills it, the other fails.
        access.ddl(CatalogOp::CreateTable { def, if_not_exists: false }).await?;
        // Dropped again on failure by its id: a table that took the name meanwhile (a rename, a
        // drop and create) is not this statement's to drop.
        let id = access.catalog().tables.get(&name).map(|e| e.id);
        let mut abandoned = DropIfAbandoned { access: Some(Arc::clone(access)), name: name.clone(), id };
        let inserted = async {
            let plan = state.statement_to_plan(insert).await?;
            let planned = Planned { action: Action::Plan(plan), state, sql, session, names: Default::default() };
            let stream = Box::pin(self.execute(planned)).await?;
            let _count: Vec<RecordBatch> = stream.try_collect().await?;
            Ok::<(), QueryError>(())
        };
        let result = inserted.await;
        abandoned.access = None;
        let Err(e) = result else { return Ok(()) };
        let outcome = match id {
            None => "the table was renamed or dropped meanwhile, and is left as it is".to_string(),
            // Said as what happened: a drop by id of a name another table took, or of a table
            // renamed, drops nothing (it used to say "dropped again" all the same).
            Some(id) => match access.catalog().by_id(id).map(|e| e.def.name.clone()) {
                None => "the table was dropped meanwhile".to_string(),
                Some(now) if now != name => {
                    format!(
                        "the table was renamed to {now} meanwhile, and is left as it is: DROP TABLE {now} if it is not wanted"
                    )
                }
                Some(_) => {
                    match access.ddl(CatalogOp::DropTable { name: name.clone(), if_exists: true, id: Some(id) }).await {
                        Ok(()) if access.catalog().by_id(id).is_none() => "table dropped again".to_string(),
                        Ok(()) => {
                            format!("the table was renamed or replaced meanwhile, and is left as it is (table id {id})")
                        }
                        Err(d) => format!("dropping the table failed too ({d}): DROP TABLE {name} before trying again"),
                    }
                }
            },
        };
        Err(e.prefixed(&format!("CREATE TABLE {name} AS SELECT: the insert failed ({outcome}): ")))
    }

    /// Runs a statement shardwise executes itself; `CHECK TABLE` and `REPAIR TABLE` answer rows, the others none.
    async fn run_command(
        &self,
        command: Command,
        state: Box<SessionState>,
        sql: String,
        session: Arc<Session>,
    ) -> Result<Option<RecordBatch>, QueryError> {
        if let Command::Kill { query_id } = &command {
            return match self.log.kill(query_id) {
                true => Ok(None),
                false => Err(QueryError::Rejected(format!(
                    "no query with query_id = '{query_id}' is running on this node (rank {}): KILL QUERY \
                     goes to the node the query was sent to, whose system.queries lists it",
                    self.rank
                ))),
            };
        }
        let access = self.access("DDL")?;
        let current = settings::current(state.config_options());
        match command {
            Command::Ddl(op) => access.ddl(op).await.map(|()| None),
            Command::CreateTableAs { def, if_not_exists, insert } => {
                self.create_table_as(def, if_not_exists, insert, state, sql, session).await.map(|()| None)
            }
            Command::Flush { table } => {
                let work = async { access.flush(&table, Duration::from_millis(current.flush_timeout_ms)).await };
                let note = "; the queued rows are still delivered in the background";
                self.tracked(&sql, &current, &session, note, async { work.await.map(|()| None) }).await
            }
            Command::Optimize { table, all_parts } => {
                let timeout = Duration::from_millis(current.optimize_timeout_ms);
                let work = async { access.optimize(&table, all_parts, timeout).await.map(|()| None) };
                let note = "; nodes already writing or merging their replicas finish that";
                self.tracked(&sql, &current, &session, note, work).await
            }
            Command::Check { table } => {
                let work = async {
                    let rows = access.check_table(&table, Duration::from_millis(current.check_timeout_ms)).await?;
                    crate::check_table::answer(&rows, current.check_query_single_value_result.0).map(Some)
                };
                self.tracked(&sql, &current, &session, "", work).await
            }
            Command::Repair { table } => {
                let work = async {
                    let timeout = current.repair_timeout_ms.duration();
                    let rows = access.repair_table(&table, timeout, current.repair_rebuild_rank).await?;
                    crate::check_table::repair_answer(&rows).map(Some)
                };
                let note = "; a replica being rebuilt then, if one was, is rebuilt to the end in the background \
                            (CHECK TABLE shows where the repair stopped)";
                self.tracked(&sql, &current, &session, note, work).await
            }
            Command::Kill { .. } => Ok(None),
        }
    }

    /// Runs a command that may take long (SYSTEM FLUSH DISTRIBUTED, OPTIMIZE, CHECK and REPAIR
    /// TABLE) as queries run: listed in `system.queries` while it runs (when its session is
    /// recorded), stopped by `KILL QUERY` or at `max_execution_time_ms`, and its end recorded.
    /// `note` says what stopping it leaves behind.
    async fn tracked(
        &self,
        sql: &str,
        current: &settings::ShardwiseSettings,
        session: &Arc<Session>,
        note: &str,
        work: impl std::future::Future<Output = Result<Option<RecordBatch>, QueryError>>,
    ) -> Result<Option<RecordBatch>, QueryError> {
        if !session.is_recorded() {
            return work.await;
        }
        let running = self.log.begin(sql, current.query_id.clone())?;
        let limit_ms = current.max_execution_time_ms;
        let deadline = async {
            match limit_ms {
                0 => std::future::pending::<()>().await,
                ms => tokio::time::sleep(Duration::from_millis(ms)).await,
            }
        };
        let outcome = tokio::select! {
            outcome = work => Ok(outcome),
            () = running.killed() => Err(QueryError::Rejected(format!("{}{note}", crate::error::KILLED))),
            () = deadline => Err(QueryError::Rejected(format!(
                "{} = {limit_ms} and was stopped{note}",
                crate::error::TIMED_OUT
            ))),
        };
        match outcome {
            Ok(outcome) => {
                let rows = outcome.as_ref().map(|batch| batch.as_ref().map_or(0, |b| b.num_rows() as u64));
                running.end(rows.map_err(|e| e.to_string()));
                outcome
            }
            Err(stopped) if running.killed_now() => {
                running.end(Err(stopped.to_string()));
                Err(stopped)
            }
            Err(timed_out) => {
                running.end_timed_out(timed_out.to_string());
                Err(timed_out)
            }
        }
    }
}

/// The table of a `CREATE TABLE ... AS SELECT` whose statement is dropped before its insert
/// has finished (the client went away): dropped too, in the background, so that no half-filled
/// table is left behind. Disarmed by taking `access`.
struct DropIfAbandoned {
    access: Option<Arc<dyn TableAccess>>,
    name: String,
    /// The table's id (`None`: it was renamed or dropped as soon as it was made).
    id: Option<u64>,
}

impl Drop for DropIfAbandoned {
    fn drop(&mut self) {
        let (Some(access), Some(id)) = (self.access.take(), self.id) else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let name = std::mem::take(&mut self.name);
        runtime.spawn(async move {
            let dropped = access.ddl(CatalogOp::DropTable { name: name.clone(), if_exists: true, id: Some(id) }).await;
            match dropped {
                Ok(()) => tracing::warn!(table = %name, "CREATE TABLE ... AS SELECT abandoned: table dropped"),
                Err(e) => tracing::warn!(table = %name, error = %e, "CREATE TABLE ... AS SELECT abandoned: cannot drop the table"),
            }
        });
    }
}

/// How a statement that runs outside a plan is recorded in `system.queries`.
pub enum Recorded<'a> {
    /// One ended row, described as this text, written when it ends.
    Ended(&'a str),
    /// Registered while it received its rows; ended with its outcome.
    Running(crate::query_log::RunningStatement),
}

/// True when `plan` reads a sharded table (or a fragment of one).
fn reads_tables(plan: &Arc<dyn ExecutionPlan>) -> bool {
    let mut found = false;
    let _ = plan.apply(|node| {
        found |= node.is::<FragmentExec>() || node.is::<ShardScanExec>();
        Ok(if found { TreeNodeRecursion::Stop } else { TreeNodeRecursion::Continue })
    });
    found
}

/// `EXPLAIN ANALYZE`'s rows, then one row per fragment run: `plan_type` says which shard (or
/// bucket) ran on which rank, `plan` is the plan that node ran, with its operators' metrics.
/// DataFusion's own rows show the fragment plan as the initiator built it, never executed there.
fn with_fragment_reports(
    stream: SendableRecordBatchStream,
    physical: Arc<dyn ExecutionPlan>,
) -> SendableRecordBatchStream {
    let schema = stream.schema();
    let out_schema = Arc::clone(&schema);
    let reports = futures::stream::once(async move {
        let mut kinds = Vec::new();
        let mut plans = Vec::new();
        let _ = physical.apply(|node| {
            if let Some(fragment) = node.downcast_ref::<FragmentExec>() {
                for (label, text) in fragment.reports() {
                    kinds.push(format!("Fragment: {label}"));
                    plans.push(text);
                }
            }
            Ok(TreeNodeRecursion::Continue)
        });
        let columns: Vec<datafusion::arrow::array::ArrayRef> = vec![
            Arc::new(datafusion::arrow::array::StringArray::from(kinds)),
            Arc::new(datafusion::arrow::array::StringArray::from(plans)),
        ];
        datafusion::arrow::record_batch::RecordBatch::try_new(schema, columns).map_err(Into::into)
    });
    let rows = futures::StreamExt::chain(stream, reports);
    Box::pin(datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(out_schema, rows))
}

/// Rewrites DataFusion's "DDL not supported: CreateExternalTable" as
/// "CreateExternalTable (DDL)", to follow the "statement not supported: " prefix.
fn describe_refusal(message: &str) -> String {
    match message.split_once(" not supported: ") {
        Some((kind, what)) => format!("{what} ({kind})"),
        None => message.to_string(),
    }
}

/// The `query_id` a client gave a statement that failed to plan: its `SETTINGS` clause's, else
/// the session's (an HTTP request's `?query_id=`). None if it gave none or the clause itself is
/// what failed.
fn named_query_id(sql: &str, session: &Session) -> Option<String> {
    let key = settings::option_key("query_id");
    let from_statement = settings::split_settings_clause(sql).ok().and_then(|(_, pairs)| {
        pairs.into_iter().rev().find(|(name, _)| settings::option_key(name) == key).map(|(_, value)| value)
    });
    from_statement.or_else(|| session.changed().into_iter().rev().find(|(name, _)| *name == key).map(|(_, v)| v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_is_rephrased() {
        assert_eq!(describe_refusal("DDL not supported: CreateExternalTable"), "CreateExternalTable (DDL)");
        assert_eq!(describe_refusal("something else"), "something else");
    }
}
