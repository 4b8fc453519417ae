//! Every limit of a node's table layer, named, with its default, in one place.

use shardwise_storage::ShardStoreOptions;

/// Limits and intervals of the table layer ([`crate::tables::TablesNode`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageSettings {
    /// An insert is cut into chunks of at most this many input rows; each chunk is written (or
    /// queued) as a unit, so one WAL record or shipped message stays bounded.
    pub insert_chunk_rows: usize,
    /// ... and at most this many bytes of rows, or less where a table's replicas must share one
    /// outbox WAL record (`tables::chunks`).
    pub insert_chunk_max_bytes: usize,
    /// How many chunks of one insert are placed and written at once.
    pub insert_pipeline_depth: usize,
    /// Most payload bytes a sender puts in one shipped message.
    pub ship_max_bytes: u64,
    /// Most queued inserts a sender puts in one shipped message.
    pub ship_max_items: usize,
    /// How long a shipped message (or an `immediate` write to a replica) may take.
    pub ship_timeout_ms: u64,
    /// First wait after a failed send; doubles per failure up to `sender_backoff_max_ms`.
    pub sender_backoff_initial_ms: u64,
    pub sender_backoff_max_ms: u64,
    /// How often an idle sender looks at its queue even without a wake-up.
    pub sender_idle_poll_ms: u64,
    /// How long a receiver waits for a catalog version a sender already has.
    pub catalog_wait_ms: u64,
    /// How often shard stores are flushed to parts and compacted when due.
    pub maintain_interval_ms: u64,
    /// How often a shard replica that failed (a full disk, an I/O error) is reopened, until it
    /// opens (`tables::reopen`).
    pub store_reopen_interval_ms: u64,
    /// Total bytes the outbox may hold; an insert that would pass it waits.
    pub outbox_max_bytes: u64,
    /// How long an insert waits for room in a full outbox before failing.
    pub outbox_full_wait_ms: u64,
    /// Largest gRPC message between nodes.
    pub data_plane_max_message_bytes: usize,
    /// How long connecting to a peer may take.
    pub peer_connect_timeout_ms: u64,
    /// How often a connection to a peer is pinged (HTTP/2 PING) while it carries calls, and
    /// how long a ping may go unanswered before the connection, and every call on it, fails.
    /// A stopped or hung node (SIGSTOP, a frozen VM) still accepts TCP connections and never
    /// answers; this is what ends a query's wait for it, so that it fails over to another
    /// replica or fails naming the shard (`skip_unavailable_shards` then answers without it).
    pub peer_keepalive_interval_ms: u64,
    pub peer_keepalive_timeout_ms: u64,
    /// Shard store limits.
    pub shard_buffer_max_rows: usize,
    pub shard_buffer_max_bytes: usize,
    /// How much memory the node may hold while it runs queries (`max_server_memory_usage`: the
    /// queries' reservations and the rest of its resident memory; 0: no limit). `shardwise node`
    /// defaults it to 80% of the machine's memory.
    pub max_server_memory_bytes: u64,
}

impl Default for StorageSettings {
    fn default() -> Self {
        StorageSettings {
            insert_chunk_rows: 262_144,
            insert_chunk_max_bytes: shardwise_storage::chunk_size::INSERT_CHUNK_MAX_BYTES_DEFAULT,
            insert_pipeline_depth: 2,
            ship_max_bytes: 16 * 1024 * 1024,
            ship_max_items: 4096,
            ship_timeout_ms: 30_000,
            sender_backoff_initial_ms: 100,
            sender_backoff_max_ms: 5_000,
            sender_idle_poll_ms: 100,
            catalog_wait_ms: 5_000,
            maintain_interval_ms: 1_000,
            store_reopen_interval_ms: 10_000,
            outbox_max_bytes: 1024 * 1024 * 1024,
            outbox_full_wait_ms: 10_000,
            data_plane_max_message_bytes: 256 * 1024 * 1024,
            peer_connect_timeout_ms: 2_000,
            peer_keepalive_interval_ms: 5_000,
            peer_keepalive_timeout_ms: 10_000,
            shard_buffer_max_rows: ShardStoreOptions::default().buffer_max_rows,
            shard_buffer_max_bytes: ShardStoreOptions::default().buffer_max_bytes,
            max_server_memory_bytes: 0,
        }
    }
}

impl StorageSettings {
    pub fn shard_store_options(&self) -> ShardStoreOptions {
        ShardStoreOptions {
            buffer_max_rows: self.shard_buffer_max_rows,
            buffer_max_bytes: self.shard_buffer_max_bytes,
            ..ShardStoreOptions::default()
        }
    }
}
