//! Parts: immutable Arrow IPC files holding flushed or compacted rows, each checked against the
//! length and CRC32C its manifest entry records before a byte of it is decoded.

use std::io::{BufWriter, Cursor, Write};
use std::path::Path;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::compute::concat_batches;
use arrow::datatypes::SchemaRef;
use arrow::ipc::reader::FileReader;
use arrow::ipc::writer::FileWriter;

use super::files::{part_name, write_durably_with};
use super::manifest::PartEntry;
use crate::error::StorageError;
use crate::fs::{AppendFile, Fs};
use crate::ipc_size::row_bytes;

/// The most rows a part's batch gets when small batches are merged (a bigger input batch stays
/// as it is).
pub(super) const PART_BATCH_MAX_ROWS: usize = 1 << 20;
/// The most Arrow memory a part's batch gets when small batches are merged: well below the 2 GiB
/// a string column's 32-bit offsets can address.
pub(super) const PART_BATCH_MAX_BYTES: usize = 256 * 1024 * 1024;

/// A batch with at least this many rows is written to a part as it is; only runs of smaller ones
/// are merged (a copy of the rows is worth it only to avoid many tiny batches).
pub(super) const PART_BATCH_MERGE_BELOW_ROWS: usize = 1 << 16;

/// A part, decoded and held in memory.
#[derive(Debug, Clone)]
pub(super) struct Part {
    pub entry: PartEntry,
    pub batches: Vec<RecordBatch>,
    /// Arrow memory size of `batches`.
    pub mem_bytes: usize,
}

/// A part ready to be written: its batches merged, not yet encoded.
pub(super) struct EncodedPart {
    name: String,
    batches: Vec<RecordBatch>,
    schema: SchemaRef,
}

impl EncodedPart {
    /// Merges `batches` into few batches for part number `number`: no I/O yet.
    pub(super) fn new(number: u64, schema: &SchemaRef, batches: &[RecordBatch]) -> Result<Self, StorageError> {
        Ok(EncodedPart { name: part_name(number), batches: coalesce(schema, batches)?, schema: Arc::clone(schema) })
    }

    pub(super) fn name(&self) -> &str {
        &self.name
    }

    /// Encodes the part straight into its file, durably (temp file, fsync, rename, fsync of
    /// `dir`), computing its length and CRC32C on the way: no in-memory copy of the whole file.
    pub(super) fn write(self, fs: &dyn Fs, dir: &Path) -> Result<Part, StorageError> {
        let EncodedPart { name, batches, schema } = self;
        let (len_bytes, crc32c) = write_durably_with(fs, dir, &name, |file, temp| {
            let io_err = StorageError::io("write", temp);
            let arrow_err = |source| StorageError::Arrow { op: "encode part as Arrow IPC file", source };
            let sink = ChecksummedWriter { file, crc32c: 0, len_bytes: 0 };
            let buffered = BufWriter::with_capacity(PART_WRITE_BUFFER_BYTES, sink);
            let mut writer = FileWriter::try_new(buffered, &schema).map_err(arrow_err)?;
            for batch in &batches {
                writer.write(batch).map_err(arrow_err)?;
            }
            writer.finish().map_err(arrow_err)?;
            let sink = writer.into_inner().map_err(arrow_err)?.into_inner().map_err(|e| io_err(e.into_error()))?;
            Ok((sink.len_bytes, sink.crc32c))
        })?;
        let entry = PartEntry { name, rows: batches.iter().map(|b| b.num_rows() as u64).sum(), len_bytes, crc32c };
        let mem_bytes = batches.iter().map(row_bytes).sum();
        Ok(Part { entry, batches, mem_bytes })
    }
}

/// Size of the buffer that gathers an IPC file's small writes (message headers, padding) into
/// fewer system calls; larger writes go to the file directly.
const PART_WRITE_BUFFER_BYTES: usize = 1024 * 1024;

/// Appends to a part's temp file, keeping the CRC32C and length of what was written.
struct ChecksummedWriter<'a> {
    file: &'a mut dyn AppendFile,
    crc32c: u32,
    len_bytes: u64,
}

impl Write for ChecksummedWriter<'_> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.file.write_all(data)?;
        self.crc32c = crc32c::crc32c_append(self.crc32c, data);
        self.len_bytes += data.len() as u64;
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
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
    let mem_bytes = batches.iter().map(row_bytes).sum();
    Ok(Part { entry: entry.clone(), batches, mem_bytes })
}

/// Merges runs of consecutive small batches (fewer than [`PART_BATCH_MERGE_BELOW_ROWS`] rows) into
/// batches of at most [`PART_BATCH_MAX_ROWS`] rows and [`PART_BATCH_MAX_BYTES`]; keeps larger
/// batches as they are; drops empty batches.
fn coalesce(schema: &SchemaRef, batches: &[RecordBatch]) -> Result<Vec<RecordBatch>, StorageError> {
    let mut out = Vec::new();
    let mut run: Vec<&RecordBatch> = Vec::new();
    let (mut run_rows, mut run_bytes) = (0, 0);
    for batch in batches.iter().filter(|b| b.num_rows() > 0) {
        if batch.num_rows() >= PART_BATCH_MERGE_BELOW_ROWS {
            if !run.is_empty() {
                out.push(concat_run(schema, &run)?);
                run.clear();
                (run_rows, run_bytes) = (0, 0);
            }
            out.push(batch.clone());
            continue;
        }
        let (rows, bytes) = (batch.num_rows(), row_bytes(batch));
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
