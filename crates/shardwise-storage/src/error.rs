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
        "WAL in {} is failed and accepts no more writes (reopen it to recover); first error: {cause}",
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

    /// A `shard_key` that is empty, names a column twice, or names no column of the table.
    #[error("table {table}: invalid shard_key {shard_key:?}: {problem}; expected {expected}")]
    InvalidShardKey { table: String, shard_key: String, problem: String, expected: String },

    /// A shard key column index handed to placement is not a column of the batch.
    #[error("shard key column index {index} is out of range for a batch of {num_columns} columns")]
    KeyColumnOutOfRange { index: usize, num_columns: usize },

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
