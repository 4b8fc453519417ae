//! The storage crate's error type: every way opening or writing the WAL can fail, each naming the
//! file and the operation so an operator can find what broke, and every way a table definition or
//! a batch to place can be wrong, each naming what was given and what was expected.
//!
//! Corruption found on recovery is not an error here: [`crate::wal::Wal::open`] repairs or sets
//! aside what it can and reports it in [`crate::wal::Recovery`], so the caller decides whether a
//! hole in the log is acceptable.

use std::io;
use std::path::PathBuf;

/// Errors from the storage layer.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// A filesystem call failed. If `op` is an fsync, the WAL that saw it is now failed.
    #[error("{op} {}: {source}", path.display())]
    Io { op: &'static str, path: PathBuf, source: io::Error },

    /// A payload is larger than a WAL record may be; nothing of the batch was written.
    #[error("WAL record of {len_bytes} bytes exceeds WAL_RECORD_MAX_BYTES ({max_bytes} bytes)")]
    RecordTooLarge { len_bytes: usize, max_bytes: usize },

    /// An earlier I/O error left the WAL in an unknown state; it refuses every call until it is
    /// reopened, and reopening recovers from what is really on disk.
    #[error(
        "WAL in {} has failed and accepts no more writes until it is reopened (a node retries every store_reopen_interval_ms, 10 s, and at its restart), which reads what is on disk; first error: {cause}",
        dir.display()
    )]
    WalFailed { dir: PathBuf, cause: String },

    /// A setting is out of its allowed range.
    #[error("invalid setting {name}={value}: {expected}")]
    InvalidOption { name: &'static str, value: String, expected: String },

    /// The log has handed out every LSN a `u64` can hold.
    #[error("WAL LSN space exhausted: next LSN {next_lsn}, batch of {batch_len} records")]
    LsnExhausted { next_lsn: u64, batch_len: usize },

    /// A table option (`WITH (key = value, ...)`) that shardwise does not know.
    #[error("unknown table option {key:?}; accepted options: {accepted}")]
    UnknownTableOption { key: String, accepted: &'static str },

    /// A table option given more than once.
    #[error(
        "table option {key:?} is given more than once; give each option at most once (accepted options: {accepted})"
    )]
    DuplicateTableOption { key: String, accepted: &'static str },

    /// A table name that cannot be used.
    #[error("invalid table name {name:?}: expected {expected}")]
    InvalidTableName { name: String, expected: String },

    /// A table's column list is unusable as a whole (none, too many, a name repeated or empty).
    #[error("table {table}: invalid columns: {problem}; expected {expected}")]
    InvalidColumns { table: String, problem: String, expected: String },

    /// A column declared NOT NULL: every shardwise column is nullable.
    #[error("table {table}: column {column:?} is declared NOT NULL; every column of a shardwise table is nullable")]
    NonNullableColumn { table: String, column: String },

    /// A column type that shardwise cannot store or place.
    #[error("column {column:?} has unsupported type {data_type}; supported types: {supported}")]
    UnsupportedColumnType { column: String, data_type: String, supported: &'static str },

    /// A table created without a `shard_key` option.
    #[error(
        "table {table} has no shard_key: every table is sharded by key; add WITH (shard_key = 'col1[,col2...]') \
         naming columns of the table (shards, replicas and sync_mode have defaults)"
    )]
    MissingShardKey { table: String },

    /// A `shard_key` that is empty, names a column twice, or names no column of the table.
    #[error("table {table}: invalid shard_key {shard_key:?}: {problem}; expected {expected}")]
    InvalidShardKey { table: String, shard_key: String, problem: String, expected: String },

    /// A shard key column index handed to placement is not a column of the batch.
    #[error("shard key column index {index} is out of range for a batch of {num_columns} columns")]
    KeyColumnOutOfRange { index: usize, num_columns: usize },

    /// A table name the catalog does not have.
    #[error("unknown table {name:?}; tables: {known}")]
    UnknownTable { name: String, known: String },

    /// CREATE TABLE of a name that exists (without IF NOT EXISTS).
    #[error("table {name:?} already exists (use CREATE TABLE IF NOT EXISTS to ignore this)")]
    TableExists { name: String },

    /// RENAME TABLE onto a name that is taken.
    #[error(
        "cannot rename table {from:?} to {to:?}: a table {to:?} already exists (DROP TABLE it first, or swap \
         the two with RENAME TABLE {from} TO tmp, {to} TO {from}, tmp TO {to})"
    )]
    RenameTargetExists { from: String, to: String },

    /// RENAME TABLE of a table to the name it has.
    #[error("cannot rename table {name:?} to {name:?}: it is called {name:?} already")]
    RenameToItself { name: String },

    /// The replicated catalog cannot be read or written.
    #[error("catalog: {problem}")]
    CatalogFormat { problem: String },

    /// A piece handed to a shard store does not have the store's columns (names, types,
    /// nullability); nothing of the call was written.
    #[error("shard store {}: piece {piece} does not match the store's schema: expected {expected}, got {found}", dir.display())]
    PieceSchemaMismatch { dir: PathBuf, piece: usize, expected: String, found: String },

    /// A piece handed to a shard store is malformed (a `seq` without an `origin`, an encoded piece
    /// too large for one WAL record); nothing of the call was written.
    #[error("shard store {}: invalid piece {piece}: {problem}", dir.display())]
    InvalidPiece { dir: PathBuf, piece: usize, problem: String },

    /// A replica image that cannot be installed (`REPAIR TABLE`): it does not decode, does not
    /// match its checksum or the table's columns, or its target already holds a store.
    #[error("replica image: {problem}")]
    ImageInvalid { problem: String },

    /// A shard store set aside on purpose ([`crate::ShardStore::retire`]): it takes no writes.
    #[error("shard store {}: {why}", dir.display())]
    ShardStoreRetired { dir: PathBuf, why: String },

    /// An earlier I/O error left a shard store in an unknown state; it refuses every write until it
    /// is reopened, and reopening recovers from what is really on disk.
    #[error(
        "shard store in {} has failed and accepts no more writes until it is reopened (a node retries every store_reopen_interval_ms, 10 s, and at its restart), which reads what is on disk; first error: {cause}",
        dir.display()
    )]
    ShardStoreFailed { dir: PathBuf, cause: String },

    /// A shard store's MANIFEST cannot be used: unreadable, from a newer format, inconsistent, or
    /// missing while the store has data.
    #[error("shard store manifest {}: {problem}", path.display())]
    ManifestInvalid { path: PathBuf, problem: String },

    /// A shard store's part file is damaged or does not match its manifest entry; it is never read.
    #[error("shard store part {}: {problem}", path.display())]
    PartCorrupt { path: PathBuf, problem: String },

    /// A shard store's WAL record passed its checksum but cannot be decoded, so it cannot be replayed.
    #[error("shard store WAL {}: record at LSN {lsn} cannot be replayed: {problem}", dir.display())]
    WalRecordInvalid { dir: PathBuf, lsn: u64, problem: String },

    /// An outbox append would take the pending payload past `outbox_max_bytes`; nothing was
    /// written. Retry once senders have delivered (and acked) some of the backlog.
    #[error(
        "outbox {} is full: {pending_bytes} bytes pending + {append_bytes} bytes to append exceed \
         outbox_max_bytes ({max_bytes} bytes)",
        dir.display()
    )]
    OutboxFull { dir: PathBuf, pending_bytes: u64, append_bytes: u64, max_bytes: u64 },

    /// An outbox append that cannot be accepted as given (no items, a destination twice); nothing
    /// was written.
    #[error("invalid outbox append: {problem}")]
    OutboxAppendInvalid { problem: String },

    /// An earlier I/O error outside its WAL (writing `SEQ_LEASE`) left the outbox in an unknown
    /// state; it refuses every write until it is reopened.
    #[error(
        "outbox in {} has failed and accepts no more writes until it is reopened (a node retries every store_reopen_interval_ms, 10 s, and at its restart), which reads what is on disk; first error: {cause}",
        dir.display()
    )]
    OutboxFailed { dir: PathBuf, cause: String },

    /// An outbox WAL record passed its checksum but cannot be decoded or applied, so the outbox
    /// cannot be replayed.
    #[error("outbox WAL {}: record at LSN {lsn} cannot be replayed: {problem}", dir.display())]
    OutboxRecordInvalid { dir: PathBuf, lsn: u64, problem: String },

    /// An outbox metadata file (`OUTBOX_ID`, `SEQ_LEASE`) cannot be used. It is never replaced:
    /// a new identity would make receivers take resent items for new data, a guessed seq lease
    /// could hand out a seq twice.
    #[error("outbox metadata file {}: {problem}", path.display())]
    OutboxMetaInvalid { path: PathBuf, problem: String },

    /// The outbox identity and its log do not belong together (one is missing).
    #[error("outbox {}: {problem}", dir.display())]
    OutboxInconsistent { dir: PathBuf, problem: String },

    /// An Arrow kernel failed.
    #[error("{op}: {source}")]
    Arrow { op: &'static str, source: arrow::error::ArrowError },
}

impl StorageError {
    /// Wraps an I/O error with the operation and the path it concerned.
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> Self {
        let path = path.into();
        move |source| StorageError::Io { op, path, source }
    }
}
