//! The `system` tables about stored data: `system.tables` (the catalog), `system.shards` (where
//! every replica of every shard lives and what it holds) and `system.sync_queues` (what
//! `delay_mode_distributed` senders still have to ship: the sync lag).
//!
//! Like `system.nodes`, they hold no rows: each scan asks the node ([`TableAccess`]) afresh.

use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, BooleanArray, RecordBatch, StringArray, UInt32Array, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::memory::MemorySourceConfig;
use datafusion::catalog::{Session, TableProvider};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{Expr, TableType};
use datafusion::physical_plan::ExecutionPlan;

use crate::access::{ShardReplicaRow, SyncQueueRow, TableAccess};

/// Which storage system table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageTableKind {
    Tables,
    Shards,
    SyncQueues,
}

impl StorageTableKind {
    pub const ALL: [StorageTableKind; 3] =
        [StorageTableKind::Tables, StorageTableKind::Shards, StorageTableKind::SyncQueues];

    pub fn name(self) -> &'static str {
        match self {
            StorageTableKind::Tables => "tables",
            StorageTableKind::Shards => "shards",
            StorageTableKind::SyncQueues => "sync_queues",
        }
    }

    fn schema(self) -> SchemaRef {
        match self {
            StorageTableKind::Tables => Arc::clone(&TABLES_SCHEMA),
            StorageTableKind::Shards => Arc::clone(&SHARDS_SCHEMA),
            StorageTableKind::SyncQueues => Arc::clone(&SYNC_QUEUES_SCHEMA),
        }
    }
}

static TABLES_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("name", DataType::Utf8, false),
        Field::new("id", DataType::UInt64, false),
        Field::new("generation", DataType::UInt64, false),
        Field::new("shard_key", DataType::Utf8, false),
        Field::new("shards", DataType::UInt32, false),
        Field::new("replicas", DataType::UInt32, false),
        Field::new("sync_mode", DataType::Utf8, false),
        Field::new("delay_max_ms", DataType::UInt64, false),
        Field::new("delay_max_rows", DataType::UInt64, false),
        Field::new("delay_max_bytes", DataType::UInt64, false),
        Field::new("placement", DataType::Utf8, false),
        Field::new("create_table_query", DataType::Utf8, false),
    ]))
});

static SHARDS_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("table", DataType::Utf8, false),
        Field::new("shard", DataType::UInt32, false),
        Field::new("replica", DataType::UInt32, false),
        Field::new("rank", DataType::UInt32, false),
        Field::new("node_state", DataType::Utf8, false),
        Field::new("rows", DataType::UInt64, true),
        Field::new("bytes", DataType::UInt64, true),
        Field::new("parts", DataType::UInt64, true),
        Field::new("verified_placement", DataType::Boolean, true),
        Field::new("placement", DataType::Utf8, false),
        Field::new("problem", DataType::Utf8, true),
    ]))
});

static SYNC_QUEUES_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("rank", DataType::UInt32, false),
        // NULL, as the figures, on the row of a node whose queues are not known (`problem`).
        Field::new("table", DataType::Utf8, true),
        Field::new("destination", DataType::UInt32, true),
        Field::new("pending_rows", DataType::UInt64, true),
        Field::new("pending_bytes", DataType::UInt64, true),
        Field::new("oldest_pending_age_ms", DataType::UInt64, true),
        Field::new("retries", DataType::UInt64, true),
        Field::new("last_error", DataType::Utf8, true),
        Field::new("last_error_age_ms", DataType::UInt64, true),
        Field::new("problem", DataType::Utf8, true),
    ]))
});

/// One of the storage system tables.
#[derive(Debug)]
pub struct StorageSystemTable {
    kind: StorageTableKind,
    access: Arc<dyn TableAccess>,
}

impl StorageSystemTable {
    pub fn new(kind: StorageTableKind, access: Arc<dyn TableAccess>) -> Self {
        StorageSystemTable { kind, access }
    }

    async fn batch(&self) -> Result<RecordBatch> {
        let external = |e| DataFusionError::External(Box::new(e));
        let columns = match self.kind {
            StorageTableKind::Tables => tables_columns(&self.access),
            StorageTableKind::Shards => shards_columns(&self.access.shards().await.map_err(external)?),
            StorageTableKind::SyncQueues => queue_columns(&self.access.sync_queues().await.map_err(external)?),
        };
        Ok(RecordBatch::try_new(self.kind.schema(), columns)?)
    }
}

fn strings<'a>(values: impl Iterator<Item = &'a str>) -> ArrayRef {
    Arc::new(values.map(Some).collect::<StringArray>())
}

fn tables_columns(access: &Arc<dyn TableAccess>) -> Vec<ArrayRef> {
    let catalog = access.catalog();
    let entries: Vec<_> = catalog.tables.values().collect();
    let keys: Vec<String> = entries.iter().map(|e| e.def.shard_key.join(",")).collect();
    let statements: Vec<String> = entries.iter().map(|e| crate::show_create::create_statement(&e.def)).collect();
    vec![
        strings(entries.iter().map(|e| e.def.name.as_str())),
        Arc::new(entries.iter().map(|e| e.id).collect::<UInt64Array>()),
        Arc::new(entries.iter().map(|e| e.generation).collect::<UInt64Array>()),
        strings(keys.iter().map(String::as_str)),
        Arc::new(entries.iter().map(|e| e.def.shards).collect::<UInt32Array>()),
        Arc::new(entries.iter().map(|e| e.def.replicas).collect::<UInt32Array>()),
        strings(entries.iter().map(|e| e.def.sync_mode.as_str())),
        Arc::new(entries.iter().map(|e| e.def.delay.delay_max_ms).collect::<UInt64Array>()),
        Arc::new(entries.iter().map(|e| e.def.delay.delay_max_rows).collect::<UInt64Array>()),
        Arc::new(entries.iter().map(|e| e.def.delay.delay_max_bytes).collect::<UInt64Array>()),
        strings(entries.iter().map(|e| e.def.placement.as_str())),
        strings(statements.iter().map(String::as_str)),
    ]
}

fn shards_columns(rows: &[ShardReplicaRow]) -> Vec<ArrayRef> {
    vec![
        strings(rows.iter().map(|r| r.table.as_str())),
        Arc::new(rows.iter().map(|r| r.shard).collect::<UInt32Array>()),
        Arc::new(rows.iter().map(|r| r.replica).collect::<UInt32Array>()),
        Arc::new(rows.iter().map(|r| r.rank).collect::<UInt32Array>()),
        strings(rows.iter().map(|r| r.node_state.as_str())),
        Arc::new(rows.iter().map(|r| r.rows).collect::<UInt64Array>()),
        Arc::new(rows.iter().map(|r| r.bytes).collect::<UInt64Array>()),
        Arc::new(rows.iter().map(|r| r.parts).collect::<UInt64Array>()),
        Arc::new(rows.iter().map(|r| r.verified_placement).collect::<BooleanArray>()),
        strings(rows.iter().map(|r| r.placement.as_str())),
        Arc::new(rows.iter().map(|r| r.problem.as_deref()).collect::<StringArray>()),
    ]
}

fn queue_columns(rows: &[SyncQueueRow]) -> Vec<ArrayRef> {
    // A row with a problem stands for a node whose queues are unknown: no figures.
    let known = |r: &SyncQueueRow| r.problem.is_none();
    vec![
        Arc::new(rows.iter().map(|r| r.rank).collect::<UInt32Array>()),
        Arc::new(rows.iter().map(|r| known(r).then_some(r.table.as_str())).collect::<StringArray>()),
        Arc::new(rows.iter().map(|r| known(r).then_some(r.destination)).collect::<UInt32Array>()),
        Arc::new(rows.iter().map(|r| known(r).then_some(r.pending_rows)).collect::<UInt64Array>()),
        Arc::new(rows.iter().map(|r| known(r).then_some(r.pending_bytes)).collect::<UInt64Array>()),
        Arc::new(rows.iter().map(|r| r.oldest_pending_age_ms).collect::<UInt64Array>()),
        Arc::new(rows.iter().map(|r| known(r).then_some(r.retries)).collect::<UInt64Array>()),
        Arc::new(rows.iter().map(|r| r.last_error.as_deref()).collect::<StringArray>()),
        Arc::new(rows.iter().map(|r| r.last_error_age_ms).collect::<UInt64Array>()),
        Arc::new(rows.iter().map(|r| r.problem.as_deref()).collect::<StringArray>()),
    ]
}

#[async_trait]
impl TableProvider for StorageSystemTable {
    fn schema(&self) -> SchemaRef {
        self.kind.schema()
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let batch = self.batch().await?;
        let plan: Arc<dyn ExecutionPlan> =
            MemorySourceConfig::try_new_exec(&[vec![batch]], self.kind.schema(), projection.cloned())?;
        Ok(plan)
    }
}
