//! Parts: immutable Arrow IPC files holding flushed or compacted rows, each checked against the
//! length and CRC32C its manifest entry records before a byte of it is decoded.

use std::io::Cursor;
use std::path::Path;

use arrow::array::RecordBatch;
use arrow::compute::concat_batches;
use arrow::datatypes::SchemaRef;
use arrow::ipc::reader::FileReader;
use arrow::ipc::writer::FileWriter;

use super::files::{part_name, write_durably};
use super::manifest::PartEntry;
use crate::error::StorageError;
use crate::fs::Fs;

/// The most rows a part's batch gets when small batches are merged (a bigger input batch stays
/// as it is).
pub(super) const PART_BATCH_MAX_ROWS: usize = 1 << 20;
/// The most Arrow memory a part's batch gets when small batches are merged: well below the 2 GiB
/// a string column's 32-bit offsets can address.
pub(super) const PART_BATCH_MAX_BYTES: usize = 256 * 1024 * 1024;

/// A part, decoded and held in memory.
#[derive(Debug, Clone)]
pub(super) struct Part {
    pub entry: PartEntry,
    pub batches: Vec<RecordBatch>,
    /// Arrow memory size of `batches`.
    pub mem_bytes: usize,
}

/// A part encoded and ready to be written.
pub(super) struct EncodedPart {
    part: Part,
    bytes: Vec<u8>,
}

impl EncodedPart {
    /// Merges `batches` into few batches and encodes them as part number `number`: no I/O yet.
    pub(super) fn new(number: u64, schema: &SchemaRef, batches: &[RecordBatch]) -> Result<Self, StorageError> {
        let batches = coalesce(schema, batches)?;
        let arrow_err = |source| StorageError::Arrow { op: "encode part as Arrow IPC file", source };
        let mut writer = FileWriter::try_new(Vec::new(), schema).map_err(arrow_err)?;
        for batch in &batches {
            writer.write(batch).map_err(arrow_err)?;
        }
        writer.finish().map_err(arrow_err)?;
        let bytes = writer.into_inner().map_err(arrow_err)?;
        let entry = PartEntry {
            name: part_name(number),
            rows: batches.iter().map(|b| b.num_rows() as u64).sum(),
            len_bytes: bytes.len() as u64,
            crc32c: crc32c::crc32c(&bytes),
        };
        let mem_bytes = batches.iter().map(RecordBatch::get_array_memory_size).sum();
        Ok(EncodedPart { part: Part { entry, batches, mem_bytes }, bytes })
    }

    pub(super) fn name(&self) -> &str {
        &self.part.entry.name
    }

    /// Writes the part durably (temp file, fsync, rename, fsync of `dir`).
    pub(super) fn write(self, fs: &dyn Fs, dir: &Path) -> Result<Part, StorageError> {
        write_durably(fs, dir, &self.part.entry.name, &self.bytes)?;
        Ok(self.part)
    }
}

/// Reads and decodes the part `entry` names, after checking its length and CRC32C: a file that
/// does not match its entry is an error naming it, and is never decoded.
pub(super) fn load(fs: &dyn Fs, dir: &Path, entry: &PartEntry, schema: &SchemaRef) -> Result<Part, StorageError> {
    let path = dir.join(&entry.name);
    let corrupt = |problem: String| StorageError::PartCorrupt { path: path.clone(), problem };
    let bytes = fs.read(&path).map_err(|e| corrupt(format!("cannot read the file the manifest lists: {e}")))?;
    if bytes.len() as u64 != entry.len_bytes {
        return Err(corrupt(format!("{} bytes long, the manifest says {}", bytes.len(), entry.len_bytes)));
    }
    let crc = crc32c::crc32c(&bytes);
    if crc != entry.crc32c {
        return Err(corrupt(format!("CRC32C {crc:#010x}, the manifest says {:#010x}", entry.crc32c)));
    }
    let reader = FileReader::try_new(Cursor::new(bytes), None).map_err(|e| corrupt(format!("Arrow IPC file: {e}")))?;
    if reader.schema().fields() != schema.fields() {
        return Err(corrupt(format!("schema {:?} is not the store's {:?}", reader.schema(), schema)));
    }
    let mut batches = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| corrupt(format!("Arrow IPC file: {e}")))?;
        let batch = RecordBatch::try_new(schema.clone(), batch.columns().to_vec())
            .map_err(|e| corrupt(format!("rebuilding a batch: {e}")))?;
        batches.push(batch);
    }
    let rows: u64 = batches.iter().map(|b| b.num_rows() as u64).sum();
    if rows != entry.rows {
        return Err(corrupt(format!("{rows} rows, the manifest says {}", entry.rows)));
    }
    let mem_bytes = batches.iter().map(RecordBatch::get_array_memory_size).sum();
    Ok(Part { entry: entry.clone(), batches, mem_bytes })
}

/// Merges runs of consecutive small batches into batches of at most [`PART_BATCH_MAX_ROWS`] rows
/// and [`PART_BATCH_MAX_BYTES`]; drops empty batches.
fn coalesce(schema: &SchemaRef, batches: &[RecordBatch]) -> Result<Vec<RecordBatch>, StorageError> {
    let mut out = Vec::new();
    let mut run: Vec<&RecordBatch> = Vec::new();
    let (mut run_rows, mut run_bytes) = (0, 0);
    for batch in batches.iter().filter(|b| b.num_rows() > 0) {
        let (rows, bytes) = (batch.num_rows(), batch.get_array_memory_size());
        if !run.is_empty() && (run_rows + rows > PART_BATCH_MAX_ROWS || run_bytes + bytes > PART_BATCH_MAX_BYTES) {
            out.push(concat_run(schema, &run)?);
            run.clear();
            (run_rows, run_bytes) = (0, 0);
        }
        run.push(batch);
        run_rows += rows;
        run_bytes += bytes;
    }
    if !run.is_empty() {
        out.push(concat_run(schema, &run)?);
    }
    Ok(out)
}

fn concat_run(schema: &SchemaRef, run: &[&RecordBatch]) -> Result<RecordBatch, StorageError> {
    match run {
        [single] => Ok((*single).clone()),
        _ => concat_batches(schema, run.iter().copied())
            .map_err(|source| StorageError::Arrow { op: "merge batches into a part", source }),
    }
}
