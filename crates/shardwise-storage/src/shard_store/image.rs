//! A replica's image: every row it holds and its dedup state, taken at one instant, and a new
//! store made from one. `REPAIR TABLE` rebuilds a damaged replica, or one that differs from its
//! shard's others, from another replica's image; the server's `tables/repair.rs` says when the
//! copy and the deliveries that follow it keep every row exactly once.
//!
//! The dedup state travels with the rows because the replicas of a shard share it: a delayed
//! insert reaches each replica under the same (origin, seq) and insert id. A store made from an
//! image therefore drops, as duplicates, the resends of everything the image holds, and applies
//! what came after it.
//!
//! On the wire an image is a JSON [`ImageHeader`] (dedup state, row count and content checksum)
//! and the rows as one Arrow IPC stream; [`ReplicaImage::decode`] checks the rows against the
//! header's checksum, so a copy damaged on its way is refused, never installed.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use serde::{Deserialize, Serialize};

use super::dedup::DedupState;
use super::{ShardStore, ShardStoreOptions};
use crate::checksum::{ContentChecksum, content_checksum};
use crate::error::StorageError;
use crate::fs::Fs;
use crate::ipc_size::row_bytes;

/// Everything a replica holds, as [`ShardStore::image`] took it.
#[derive(Debug, Clone)]
pub struct ReplicaImage {
    /// The rows, in the store's schema.
    pub batches: Vec<RecordBatch>,
    /// Per origin, the highest seq applied.
    pub hwm: BTreeMap<String, u64>,
    /// The remembered insert ids, oldest first.
    pub insert_ids: Vec<String>,
    pub verified_placement: bool,
}

/// What travels before an image's rows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageHeader {
    pub hwm: BTreeMap<String, u64>,
    pub insert_ids: Vec<String>,
    pub verified_placement: bool,
    /// The rows' count and checksum, checked when they arrive.
    pub content: ContentChecksum,
}

fn invalid(problem: impl Into<String>) -> StorageError {
    StorageError::ImageInvalid { problem: problem.into() }
}

impl ReplicaImage {
    /// The header and the rows as an Arrow IPC stream.
    pub fn encode(&self, schema: &SchemaRef) -> Result<(ImageHeader, Vec<u8>), StorageError> {
        let content = content_checksum(&self.batches)?;
        let mut rows = Vec::new();
        let mut writer = StreamWriter::try_new(&mut rows, schema).map_err(|e| invalid(format!("encode: {e}")))?;
        for batch in self.batches.iter().filter(|b| b.num_rows() > 0) {
            writer.write(batch).map_err(|e| invalid(format!("encode: {e}")))?;
        }
        writer.finish().map_err(|e| invalid(format!("encode: {e}")))?;
        drop(writer);
        let header = ImageHeader {
            hwm: self.hwm.clone(),
            insert_ids: self.insert_ids.clone(),
            verified_placement: self.verified_placement,
            content,
        };
        Ok((header, rows))
    }

    /// An image from its header and IPC rows, which must have `schema`'s columns and the
    /// header's row count and checksum.
    pub fn decode(
        header: ImageHeader,
        rows: impl std::io::Read,
        schema: &SchemaRef,
    ) -> Result<ReplicaImage, StorageError> {
        let reader = StreamReader::try_new(std::io::BufReader::new(rows), None)
            .map_err(|e| invalid(format!("its rows do not decode: {e}")))?;
        if reader.schema().fields() != schema.fields() {
            return Err(invalid(format!(
                "its columns {:?} are not the table's {:?}",
                reader.schema().fields(),
                schema.fields()
            )));
        }
        let mut batches = Vec::new();
        for batch in reader {
            let batch = batch.map_err(|e| invalid(format!("its rows do not decode: {e}")))?;
            batches.push(
                RecordBatch::try_new(Arc::clone(schema), batch.columns().to_vec())
                    .map_err(|e| invalid(e.to_string()))?,
            );
        }
        let content = content_checksum(&batches)?;
        if content != header.content {
            return Err(invalid(format!(
                "its rows ({} rows, checksum {:016x}) are not what its header says ({} rows, checksum {:016x}): \
                 damaged on the way",
                content.rows, content.checksum, header.content.rows, header.content.checksum
            )));
        }
        Ok(ReplicaImage {
            batches,
            hwm: header.hwm,
            insert_ids: header.insert_ids,
            verified_placement: header.verified_placement,
        })
    }
}

impl ShardStore {
    /// Every row and the dedup state, as of now (cheap: the batches are shared, not copied).
    pub fn image(&self) -> ReplicaImage {
        ReplicaImage {
            batches: self.snapshot(),
            hwm: self.dedup.hwm_map().clone(),
            insert_ids: self.dedup.window().cloned().collect(),
            verified_placement: self.verified_placement,
        }
    }

    /// Writes a new store holding `image` in `dir`, which must not hold a store yet: its rows as
    /// one part, then a manifest with the image's dedup state (each made durable, as a flush
    /// does), and returns it open. A crash part-way leaves a directory to delete, never one that
    /// opens as less than the image: the manifest, written last, is what makes it a store.
    pub fn create_from_image(
        dir: impl Into<PathBuf>,
        fs: Arc<dyn Fs>,
        schema: SchemaRef,
        opts: ShardStoreOptions,
        image: &ReplicaImage,
    ) -> Result<ShardStore, StorageError> {
        let dir = dir.into();
        let insert_id_window = opts.insert_id_window;
        let (mut store, _) = ShardStore::open(dir.clone(), fs, Arc::clone(&schema), opts)?;
        if store.stats().rows > 0 || !store.dedup.hwm_map().is_empty() || store.dedup.window().next().is_some() {
            return Err(invalid(format!("{} already holds a store; an image goes into a new one", dir.display())));
        }
        for batch in image.batches.iter().filter(|b| b.num_rows() > 0) {
            if batch.schema_ref().fields() != schema.fields() {
                return Err(invalid(format!("its columns {:?} are not the table's", batch.schema_ref().fields())));
            }
            let batch = RecordBatch::try_new(Arc::clone(&schema), batch.columns().to_vec())
                .map_err(|e| invalid(e.to_string()))?;
            store.buffer_rows += batch.num_rows();
            store.buffer_bytes += row_bytes(&batch);
            store.buffer.push(batch);
        }
        store.dedup = DedupState::new(image.hwm.clone(), image.insert_ids.clone(), insert_id_window);
        store.verified_placement = image.verified_placement;
        store.checkpoint(true)?;
        Ok(store)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{TestResult, ids, piece, schema, small_opts};
    use super::*;
    use crate::fs::SimFs;

    const COPY: &str = "/node/shards/t/0.rebuild";

    /// A source store with rows from two origins, one insert-id duplicate, parts and a buffer.
    fn source(sim: &SimFs) -> Result<ShardStore, StorageError> {
        let (mut store, _) = ShardStore::open("/node/shards/t/0", Arc::new(sim.clone()), schema(), small_opts())?;
        store.apply(&[piece(0..30, Some("a"), Some(1), Some("i1")), piece(30..35, Some("b"), Some(7), Some("i2"))])?;
        store.flush()?;
        store.apply(&[piece(35..40, Some("a"), Some(4), Some("i3")), piece(0..30, Some("b"), Some(9), Some("i1"))])?;
        Ok(store)
    }

    #[test]
    fn a_store_made_from_an_image_holds_its_rows_and_drops_their_resends_after_a_power_loss() -> TestResult {
        let sim = SimFs::new();
        let store = source(&sim)?;
        let (header, rows) = store.image().encode(&schema())?;
        assert_eq!((header.content.rows, header.hwm.get("a"), header.hwm.get("b")), (40, Some(&4), Some(&9)));
        let image = ReplicaImage::decode(header.clone(), rows.as_slice(), &schema())?;
        let copy = ShardStore::create_from_image(COPY, Arc::new(sim.clone()), schema(), small_opts(), &image)?;
        assert_eq!(ids(&copy), (0..40).collect::<Vec<_>>());
        drop(copy);
        // What it wrote is durable: it opens the same after the unsynced writes are lost.
        sim.power_loss();
        let (mut copy, _) = ShardStore::open(COPY, Arc::new(sim.clone()), schema(), small_opts())?;
        assert_eq!(crate::content_checksum(&copy.snapshot())?, header.content);
        assert!(copy.unreadable().is_none() && copy.stats().verified_placement);
        // Resends of what the image holds are dropped (by seq, and by insert id under a new
        // seq); what came after it is applied.
        let out = copy.apply(&[
            piece(35..40, Some("a"), Some(4), Some("i3")),
            piece(0..30, Some("c"), Some(1), Some("i2")),
            piece(40..42, Some("a"), Some(5), Some("i4")),
        ])?;
        use crate::ApplyOutcome::{Applied, Duplicate};
        assert_eq!(out, vec![Duplicate, Duplicate, Applied { rows: 2 }]);
        assert_eq!(copy.hwm("c"), Some(1), "an insert-id duplicate still moves its origin's mark");
        assert_eq!(ids(&copy), (0..42).collect::<Vec<_>>());
        Ok(())
    }

    #[test]
    fn an_empty_image_still_carries_its_marks() -> TestResult {
        let sim = SimFs::new();
        let (mut store, _) = ShardStore::open("/node/shards/t/0", Arc::new(sim.clone()), schema(), small_opts())?;
        store.apply(&[piece(0..0, Some("a"), Some(3), None)])?;
        let (header, rows) = store.image().encode(&schema())?;
        let image = ReplicaImage::decode(header, rows.as_slice(), &schema())?;
        drop(ShardStore::create_from_image(COPY, Arc::new(sim.clone()), schema(), small_opts(), &image)?);
        sim.power_loss();
        let (copy, _) = ShardStore::open(COPY, Arc::new(sim.clone()), schema(), small_opts())?;
        assert_eq!((copy.stats().rows, copy.hwm("a")), (0, Some(3)));
        Ok(())
    }

    #[test]
    fn a_damaged_or_foreign_image_is_refused_and_a_store_is_not_overwritten() -> TestResult {
        let sim = SimFs::new();
        let store = source(&sim)?;
        let (header, rows) = store.image().encode(&schema())?;
        let mut wrong = header.clone();
        wrong.content.checksum ^= 1;
        let e = ReplicaImage::decode(wrong, rows.as_slice(), &schema()).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains("damaged on the way"), "{e}");
        let e = ReplicaImage::decode(header.clone(), &rows[..rows.len() / 2], &schema()).map(|_| ());
        assert!(e.unwrap_err().to_string().contains("do not decode"));
        let other = Arc::new(arrow::datatypes::Schema::new(vec![arrow::datatypes::Field::new(
            "x",
            arrow::datatypes::DataType::Int64,
            true,
        )]));
        let e = ReplicaImage::decode(header.clone(), rows.as_slice(), &other).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains("not the table's"), "{e}");
        // Into a directory that holds a store: refused, and the store is as it was.
        let image = ReplicaImage::decode(header, rows.as_slice(), &schema())?;
        drop(store);
        let target = "/node/shards/t/0";
        let e = ShardStore::create_from_image(target, Arc::new(sim.clone()), schema(), small_opts(), &image);
        assert!(e.map(|_| ()).unwrap_err().to_string().contains("already holds a store"));
        let (store, _) = ShardStore::open(target, Arc::new(sim.clone()), schema(), small_opts())?;
        assert_eq!(store.stats().rows, 40);
        Ok(())
    }

    #[test]
    fn a_retired_store_takes_no_writes_and_is_not_read() -> TestResult {
        let sim = SimFs::new();
        let mut store = source(&sim)?;
        store.retire("being rebuilt");
        assert_eq!(store.unreadable().as_deref(), Some("being rebuilt"));
        let e = store.apply(&[piece(50..51, None, None, None)]).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains("being rebuilt"), "{e}");
        assert!(store.flush().is_err() && store.optimize(true).is_err());
        store.close_cleanly()?;
        store.unretire();
        assert!(store.unreadable().is_none());
        Ok(())
    }
}
