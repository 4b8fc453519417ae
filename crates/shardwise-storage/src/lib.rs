//! shardwise-storage: everything a node keeps on its own disk.
//!
//! This first piece is the write-ahead log ([`wal`]) and the filesystem seam it goes through
//! ([`fs`]). The seam exists so that power-loss behaviour can be tested without a power cut:
//! [`fs::SimFs`] remembers what each fsync made durable and can drop everything else, following
//! the Linux rules (an fsync'd file is durable, its directory entry only once the directory is
//! fsync'd too). Shard stores and the `delay_mode_distributed` outbox will build on the WAL.
//!
//! A table's definition ([`table`]: schema, shard key, shard and replica counts, sync mode) and the
//! documented, stable function that places each row on a shard ([`placement`]) live here too,
//! since every shard store is a store of one table's shard.
//!
//! Durability rules followed throughout (reference notes §5.1–5.3):
//! - a write is acknowledged only after an fsync of the file, and a new or renamed file only
//!   after an fsync of its directory;
//! - any fsync error is fatal for the WAL: it stops accepting writes and must be reopened, which
//!   recovers from what is really on disk (fsyncgate: a retried fsync can lie);
//! - on recovery a torn tail is truncated, but corruption with valid data after it is set aside
//!   and reported, never skipped silently.

pub mod catalog;
pub mod checksum;
pub mod chunk_size;
pub mod error;
pub mod fs;
pub mod ipc_size;
pub mod outbox;
pub mod placement;
pub mod shard_store;
pub mod table;
pub mod wal;
mod xorshift;

pub use catalog::{Catalog, CatalogChange, CatalogEntry, CatalogOp};
pub use checksum::{ContentChecksum, content_checksum};
pub use error::StorageError;
pub use fs::{AppendFile, Fs, RealFs, SimFs};
pub use ipc_size::{ipc_size_estimate, row_bytes};
pub use outbox::{
    Delivered, OUTBOX_ID_FILE, OUTBOX_MAX_BYTES_DEFAULT, OUTBOX_WAL_DIR, OUTBOX_WAL_PREALLOCATE_BYTES, Outbox,
    OutboxItem, OutboxOptions, OutboxRecovery, PendingItem, QueueStats, SEQ_LEASE_FILE,
};
pub use placement::{PlacementVersion, hash_rows, shard_of_rows, split_by_shard};
pub use shard_store::{
    ApplyOutcome, ImageHeader, OptimizeOutcome, OriginId, Piece, ReplicaImage, ShardRecovery, ShardStats, ShardStore,
    ShardStoreOptions,
};
pub use table::{DelaySettings, MAX_SHARDS, SyncMode, TableDef, check_column_type};
pub use wal::{
    Corruption, Lsn, RecordDefect, Recovery, TailTruncation, WAL_RECORD_MAX_BYTES, WAL_SEGMENT_MAX_BYTES_DEFAULT,
    WAL_SEGMENT_MIN_BYTES, Wal, WalOptions, WalRecord,
};
