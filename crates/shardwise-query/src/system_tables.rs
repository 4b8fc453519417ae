//! The `system` schema: tables that describe the running cluster rather than user data.
//!
//! The tables hold no rows of their own: every scan computes them afresh ([`ComputedTable`]), so
//! a query sees the state of the moment it runs. `system.nodes` is the operator's view of
//! membership (asked of the [`ClusterView`]); `system.queries` lists what this node ran as
//! initiator ([`QueryLog`]); `system.settings` ([`crate::system_settings`]) the settings of the
//! statement reading it.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};

use datafusion::arrow::array::{
    ArrayRef, RecordBatch, StringArray, TimestampMillisecondArray, UInt32Array, UInt64Array,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::catalog::memory::MemorySourceConfig;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, TableType};
use datafusion::physical_plan::ExecutionPlan;
use shardwise_cluster::{ClusterView, DATA_ADDR_KEY, MemberInfo};

use crate::query_log::{QueryLog, queries_batch, queries_schema};

/// Name of the schema holding the system tables.
pub const SYSTEM_SCHEMA: &str = "system";
/// Name of the membership table in [`SYSTEM_SCHEMA`].
pub const NODES_TABLE: &str = "nodes";
/// Name of the table of queries this node ran as initiator.
pub const QUERIES_TABLE: &str = "queries";

static NODES_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    let utc = Some(Arc::from("UTC"));
    Arc::new(Schema::new(vec![
        Field::new("rank", DataType::UInt32, false),
        Field::new("node_id", DataType::Utf8, false),
        Field::new("role", DataType::Utf8, false),
        Field::new("flight_addr", DataType::Utf8, true),
        Field::new("pg_addr", DataType::Utf8, true),
        Field::new("http_addr", DataType::Utf8, true),
        Field::new("state", DataType::Utf8, false),
        Field::new("epoch", DataType::UInt64, false),
        Field::new("last_heartbeat", DataType::Timestamp(TimeUnit::Millisecond, utc), true),
        // The data plane's address, which nodes ship rows and fragments to (not for clients).
        Field::new("data_addr", DataType::Utf8, true),
    ]))
});

/// The future of a computed table's rows.
pub type RowsFuture = Pin<Box<dyn Future<Output = Result<RecordBatch>> + Send>>;

/// A system table whose rows are computed afresh at every scan, so a query sees the state of
/// the moment it runs; the rows may depend on the scanning statement's configuration
/// (`system.settings`).
pub struct ComputedTable {
    schema: SchemaRef,
    rows: Box<dyn Fn(&ConfigOptions) -> RowsFuture + Send + Sync>,
}

impl std::fmt::Debug for ComputedTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ComputedTable").field("schema", &self.schema).finish_non_exhaustive()
    }
}

impl ComputedTable {
    /// A table of `schema` whose rows `rows` computes from the scanning statement's configuration.
    pub fn new(schema: SchemaRef, rows: impl Fn(&ConfigOptions) -> RowsFuture + Send + Sync + 'static) -> Self {
        ComputedTable { schema, rows: Box::new(rows) }
    }

    /// `system.nodes`: one row per cluster member, read from the [`ClusterView`].
    pub fn nodes(cluster: Arc<dyn ClusterView>) -> Self {
        let rows = move |_: &ConfigOptions| -> RowsFuture {
            let cluster = Arc::clone(&cluster);
            Box::pin(async move { nodes_batch(&cluster.members().await) })
        };
        ComputedTable { schema: Arc::clone(&NODES_SCHEMA), rows: Box::new(rows) }
    }

    /// `system.queries`: the queries this node runs or ran as initiator ([`QueryLog`]).
    pub fn queries(log: Arc<QueryLog>) -> Self {
        let rows = move |_: &ConfigOptions| -> RowsFuture {
            let batch = queries_batch(&log.snapshot());
            Box::pin(async move { batch })
        };
        ComputedTable { schema: queries_schema(), rows: Box::new(rows) }
    }
}

/// The rows of `system.nodes` as one batch in [`NODES_SCHEMA`] order.
fn nodes_batch(members: &[MemberInfo]) -> Result<RecordBatch> {
    let addr = |service: &str| -> ArrayRef {
        Arc::new(members.iter().map(|m| m.addrs.get(service).map(String::as_str)).collect::<StringArray>())
    };
    let columns: Vec<ArrayRef> = vec![
        Arc::new(members.iter().map(|m| m.rank).collect::<UInt32Array>()),
        Arc::new(members.iter().map(|m| Some(m.node_id.as_str())).collect::<StringArray>()),
        Arc::new(members.iter().map(|m| Some(m.role.as_str())).collect::<StringArray>()),
        addr("flight"),
        addr("pg"),
        addr("http"),
        Arc::new(members.iter().map(|m| Some(m.state.as_str())).collect::<StringArray>()),
        Arc::new(members.iter().map(|m| m.epoch).collect::<UInt64Array>()),
        Arc::new(
            members
                .iter()
                .map(|m| m.last_heartbeat_unix_ms.and_then(|ms| i64::try_from(ms).ok()))
                .collect::<TimestampMillisecondArray>()
                .with_timezone("UTC"),
        ),
        addr(DATA_ADDR_KEY),
    ];
    Ok(RecordBatch::try_new(Arc::clone(&NODES_SCHEMA), columns)?)
}

/// The future `scan` returns (`TableProvider` is an `async_trait`; this crate spells out what
/// that macro would generate instead of depending on it).
type ScanFuture<'a> = Pin<Box<dyn Future<Output = Result<Arc<dyn ExecutionPlan>>> + Send + 'a>>;

impl TableProvider for ComputedTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    fn scan<'life0, 'life1, 'life2, 'life3, 'async_trait>(
        &'life0 self,
        state: &'life1 dyn Session,
        projection: Option<&'life2 Vec<usize>>,
        _filters: &'life3 [Expr],
        _limit: Option<usize>,
    ) -> ScanFuture<'async_trait>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        'life2: 'async_trait,
        'life3: 'async_trait,
        Self: 'async_trait,
    {
        let rows = (self.rows)(state.config_options());
        Box::pin(async move {
            let batch = rows.await?;
            let plan: Arc<dyn ExecutionPlan> =
                MemorySourceConfig::try_new_exec(&[vec![batch]], Arc::clone(&self.schema), projection.cloned())?;
            Ok(plan)
        })
    }
}
