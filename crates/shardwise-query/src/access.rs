//! [`TableAccess`]: what the SQL layer needs from the node that stores the tables.
//!
//! The query crate plans SQL; it does not know where shards live, how inserts are shipped or how
//! DDL reaches the master. The node (the server crate) implements this trait, and the SQL layer
//! turns statements into calls on it. Keeping the seam here lets the query layer be tested with
//! an in-memory implementation and keeps network and disk out of planning.

use std::fmt::Debug;
use std::time::Duration;

use datafusion::arrow::record_batch::RecordBatch;
use shardwise_cluster::BoxFuture;
use shardwise_storage::{Catalog, CatalogOp};

use crate::error::QueryError;

/// How an insert is to be made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InsertOptions {
    /// The client's idempotency key: an insert retried with the same id is applied once.
    pub insert_id: Option<String>,
    /// `immediate` tables: how many replicas of each shard must have the rows durable before
    /// the insert is acknowledged; `None` means all of them.
    pub insert_quorum: Option<u32>,
    /// `distributed_foreground_insert`: write the replicas before acknowledging even when the
    /// table is `delay_mode_distributed`.
    pub foreground: bool,
    /// The table's `(id, generation)` the insert must go to: a table dropped and re-created, or
    /// truncated, since (a load whose segments are separate inserts) fails it rather than
    /// sending the rest of the load to the new table.
    pub incarnation: Option<(u64, u64)>,
    /// The rows may arrive in another order when the insert runs again (an `INSERT ... SELECT`
    /// from tables, whose shards answer in any order): the node cuts them into chunks by their
    /// values, not by their position, so that a retry with the same `insert_id` makes the same
    /// chunks and is applied once.
    pub order_may_vary: bool,
}

impl InsertOptions {
    /// The options a statement's settings give an insert (`insert_id`, `insert_quorum`,
    /// `distributed_foreground_insert`).
    pub fn from_settings(settings: &crate::settings::ShardwiseSettings) -> datafusion::error::Result<InsertOptions> {
        if let Some(id) = settings.insert_id.as_deref().filter(|id| id.contains('/')) {
            return Err(datafusion::error::DataFusionError::Configuration(format!(
                "insert_id {id:?} contains '/', which shardwise uses to name the chunks and segments of an insert"
            )));
        }
        Ok(InsertOptions {
            // As given, even empty: the node refuses an id that is not 1 to 256 bytes, where
            // an empty one read as "no id" would make a retry insert the rows again.
            insert_id: settings.insert_id.clone(),
            insert_quorum: match settings.insert_quorum {
                0 => None,
                q => Some(u32::try_from(q).map_err(|_| {
                    datafusion::error::DataFusionError::Configuration(format!(
                        "insert_quorum = {q} is larger than any replica count"
                    ))
                })?),
            },
            foreground: settings.distributed_foreground_insert.0,
            incarnation: None,
            order_may_vary: false,
        })
    }
}

/// One row of `system.shards`: one replica of one shard of one table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardReplicaRow {
    pub table: String,
    pub shard: u32,
    /// 0 for the shard's primary replica.
    pub replica: u32,
    pub rank: u32,
    /// The node's state (`up`, `suspect`, `down`) as the master sees it.
    pub node_state: String,
    /// `None` when the node could not be asked.
    pub rows: Option<u64>,
    pub bytes: Option<u64>,
    pub parts: Option<u64>,
    /// Every row of the replica arrived through shardwise's placement.
    pub verified_placement: Option<bool>,
    pub placement: String,
    /// Why the replica is not read (it failed, or its WAL was found damaged); `None` when it is
    /// read, or the node could not be asked.
    pub problem: Option<String>,
}

/// One row of `CHECK TABLE t`'s answer under `check_query_single_value_result = 0`: one replica
/// of one shard, compared with the shard's other replicas by rows and content checksum
/// (`shardwise_storage::checksum`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaCheckRow {
    pub shard: u32,
    /// 0 for the shard's primary replica.
    pub replica: u32,
    pub rank: u32,
    /// `None` when the replica could not be read.
    pub rows: Option<u64>,
    pub checksum: Option<u64>,
    /// Read, and the same as every other replica of its shard.
    pub is_passed: bool,
    /// Why not, and rows still queued for its node; `""` when there is nothing to say.
    pub message: String,
    /// Not read because of the replica itself (damaged, failed, files gone), not its node.
    pub replica_fault: bool,
    /// Read, but its last opening cut a WAL record that was whole and failed its checksum (a
    /// torn write, or damage to rows it acknowledged): said in `message`.
    pub suspect: bool,
}

/// What `REPAIR TABLE` did with one shard replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaRepairRow {
    pub shard: u32,
    /// 0 for the shard's primary replica.
    pub replica: u32,
    pub rank: u32,
    /// `none` (it passed the check), `rebuilt` (copied from `source_rank`), `left` (it did not
    /// pass, and nothing said which replica to copy over it) or `failed` (its rebuild did not
    /// finish); `message` says why.
    pub action: String,
    /// The rank whose replica was (or was to be) copied.
    pub source_rank: Option<u32>,
    /// Its rows now, when known.
    pub rows: Option<u64>,
    /// What the check found, and what went wrong; `""` when there is nothing to say.
    pub message: String,
}

/// One row of `system.sync_queues`: what one node still has to ship for one table to one
/// destination. Serializable: nodes send their rows to the node that runs the query.
///
/// Or, with a `problem` ([`SyncQueueRow::unknown`]), a node whose queues could not be read (it
/// is down or did not answer): its other figures are shown as NULL, so that "nothing pending"
/// and "not known" do not look alike.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SyncQueueRow {
    pub rank: u32,
    pub table: String,
    pub destination: u32,
    pub pending_rows: u64,
    pub pending_bytes: u64,
    /// How long the oldest pending insert has waited: the sync lag.
    pub oldest_pending_age_ms: Option<u64>,
    /// Failed sends to the destination since the node started (all tables' shipments: one
    /// sender per destination ships them together).
    pub retries: u64,
    pub last_error: Option<String>,
    /// How long ago the destination's last failed send was: a `last_error` is kept after later
    /// successes, and may be about another table's shipment.
    #[serde(default)]
    pub last_error_age_ms: Option<u64>,
    /// Why this node's queues are not known; `None` on a row of figures.
    #[serde(default)]
    pub problem: Option<String>,
}

impl SyncQueueRow {
    /// The row for node `rank`, whose queues could not be read, and why.
    pub fn unknown(rank: u32, problem: String) -> Self {
        SyncQueueRow {
            rank,
            table: String::new(),
            destination: 0,
            pending_rows: 0,
            pending_bytes: 0,
            oldest_pending_age_ms: None,
            retries: 0,
            last_error: None,
            last_error_age_ms: None,
            problem: Some(problem),
        }
    }
}

/// One node's replica of one shard, as a fragment reads it.
#[derive(Debug, Clone, Default)]
pub struct ShardData {
    pub batches: Vec<RecordBatch>,
    /// Every row arrived through shardwise's placement function.
    pub verified_placement: bool,
}

/// Rows a fragment sends back from another node.
pub type RemoteRows = futures::stream::BoxStream<'static, Result<RecordBatch, QueryError>>;

/// What the node that ran a fragment tells the initiator once its rows have all been sent: its
/// plan with metrics (the text `EXPLAIN ANALYZE` shows) when asked for, and the rows and bytes
/// its shuffle readers received from the shards (a shuffle's exchange stage, for
/// `system.queries`).
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FragmentOutcome {
    pub plan: Option<String>,
    pub exchanged_rows: u64,
    pub exchanged_bytes: u64,
}

impl FragmentOutcome {
    /// Nothing to tell.
    pub fn is_empty(&self) -> bool {
        self.plan.is_none() && self.exchanged_rows == 0 && self.exchanged_bytes == 0
    }
}

/// Where a fragment's [`FragmentOutcome`] lands on the initiator.
pub type FragmentReport = std::sync::Arc<std::sync::Mutex<FragmentOutcome>>;

/// The storage side of a node, as the SQL layer sees it.
pub trait TableAccess: Send + Sync + Debug {
    /// The catalog as this node knows it now (shared, not copied: an insert and a query each
    /// look at it, and a deep copy of every table's definition cost a little per call).
    fn catalog(&self) -> std::sync::Arc<Catalog>;

    /// The cluster's world size (a table's default shard count).
    fn world_size(&self) -> u32;

    /// Makes sure [`TableAccess::catalog`] is as new as the master's before a statement is
    /// planned against it: a node that was paused or cut off may have missed a DDL statement.
    /// At once when this node heard from the master moments ago.
    fn ensure_catalog_current(&self) -> BoxFuture<'_, Result<(), QueryError>> {
        Box::pin(async { Ok(()) })
    }

    /// Applies a DDL operation cluster-wide; returns once this node's catalog has it.
    fn ddl(&self, op: CatalogOp) -> BoxFuture<'_, Result<(), QueryError>>;

    /// Inserts `batches` (in the table's schema) into `table`; returns the number of rows.
    fn insert(
        &self,
        table: &str,
        batches: Vec<RecordBatch>,
        opts: InsertOptions,
    ) -> BoxFuture<'_, Result<u64, QueryError>>;

    /// This node's rank.
    fn local_rank(&self) -> u32;

    /// This node's shard replicas that are not read, and why (`table shard N: why`); the first
    /// element is true when one of them failed (it takes no writes either).
    fn replica_problems(&self) -> (bool, Vec<String>);

    /// The ranks the membership lists as down (missed their heartbeats): not asked for anything,
    /// since a hung node would hold the asker until a connection timeout.
    fn down_ranks(&self) -> BoxFuture<'_, Vec<u32>>;

    /// The version of the catalog [`TableAccess::catalog`] returns (or a later one).
    fn catalog_version(&self) -> u64;

    /// This node's replica of `shard` of the table incarnation `(table_id, generation)`, once
    /// this node has catalog version `catalog_version`.
    fn read_shard(
        &self,
        table_id: u64,
        generation: u64,
        catalog_version: u64,
        shard: u32,
    ) -> BoxFuture<'_, Result<ShardData, QueryError>>;

    /// Up to `max_rows` rows of the table incarnation `(table_id, generation)` from the shards
    /// this node holds, as they are in memory now (no I/O, no waiting), with the table's row
    /// count estimated from them; `None` when this node holds none of its shards. For planning
    /// estimates (`distributed_aggregation = 'auto'`).
    fn sample(&self, _table_id: u64, _generation: u64, _max_rows: usize) -> Option<crate::dist::TableSample> {
        None
    }

    /// Runs an encoded fragment ticket on node `rank` and streams its rows back; the node's
    /// plan with metrics lands in `report` after the last row.
    fn remote_fragment(
        &self,
        rank: u32,
        ticket: Vec<u8>,
        report: FragmentReport,
    ) -> BoxFuture<'_, Result<RemoteRows, QueryError>>;

    /// Waits until no node has anything pending for `table`, up to `timeout`.
    fn flush(&self, table: &str, timeout: Duration) -> BoxFuture<'_, Result<(), QueryError>>;

    /// `OPTIMIZE TABLE table [FINAL]`: every replica of the table writes its memory buffer as a
    /// part and merges its small parts (`all_parts`: every part) into one, up to `timeout`.
    fn optimize(&self, table: &str, all_parts: bool, timeout: Duration) -> BoxFuture<'_, Result<(), QueryError>>;

    /// `system.shards`.
    fn shards(&self) -> BoxFuture<'_, Result<Vec<ShardReplicaRow>, QueryError>>;

    /// `system.sync_queues`.
    fn sync_queues(&self) -> BoxFuture<'_, Result<Vec<SyncQueueRow>, QueryError>>;

    /// `CHECK TABLE table`: every replica of every shard read and compared with the shard's
    /// other replicas, each node given `timeout` for its share.
    fn check_table(&self, table: &str, timeout: Duration) -> BoxFuture<'_, Result<Vec<ReplicaCheckRow>, QueryError>>;

    /// `REPAIR TABLE table`: every replica `check_table` fails, rebuilt from one of its shard
    /// that passed (or, where none did, the replicas on `rebuild_rank` from the others); each
    /// step on each node given `timeout`.
    fn repair_table(
        &self,
        table: &str,
        timeout: Duration,
        rebuild_rank: Option<u64>,
    ) -> BoxFuture<'_, Result<Vec<ReplicaRepairRow>, QueryError>>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::ShardwiseSettings;

    #[test]
    fn an_empty_insert_id_is_passed_on_to_be_refused_not_dropped() {
        let mut settings = ShardwiseSettings::default();
        assert_eq!(InsertOptions::from_settings(&settings).unwrap().insert_id, None);
        settings.insert_id = Some(String::new());
        assert_eq!(InsertOptions::from_settings(&settings).unwrap().insert_id.as_deref(), Some(""));
        settings.insert_id = Some("a-1".into());
        assert_eq!(InsertOptions::from_settings(&settings).unwrap().insert_id.as_deref(), Some("a-1"));
    }

    #[test]
    fn settings_insert_id_empty_string_is_kept_as_set() {
        use datafusion::common::config::{ConfigOptions, Extensions};
        let mut extensions = Extensions::new();
        extensions.insert(ShardwiseSettings::default());
        let mut options = ConfigOptions::new().with_extensions(extensions);
        crate::settings::apply(&mut options, &[("insert_id".into(), String::new())]).unwrap();
        let opts = InsertOptions::from_settings(&crate::settings::current(&options)).unwrap();
        assert_eq!(opts.insert_id.as_deref(), Some(""));
    }
}
