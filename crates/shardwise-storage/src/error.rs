//! The storage crate's error type: every way opening or writing the WAL can fail, each naming the
//! file and the operation so an operator can find what broke.
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
}

impl StorageError {
    /// Wraps an I/O error with the operation and the path it concerned.
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> Self {
        let path = path.into();
        move |source| StorageError::Io { op, path, source }
    }
}
