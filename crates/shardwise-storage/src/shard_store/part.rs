//! Parts: immutable Arrow IPC files holding flushed or compacted rows, each checked against the
//! length and CRC32C its manifest entry records before a byte of it is decoded.

use std::io::{BufWriter, Cursor, Write};
use std::path::Path;
use std::sync::Arc;

use arrow::array::{MutableArrayData, RecordBatch, RecordBatchOptions, make_array};
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

/// The most rows a part's batch holds in memory (DataFusion's batch size, which scans hand on).
///
/// Why: a part is written in batches of up to [`PART_BATCH_MAX_ROWS`] rows, and a scan hands a
/// query slices of [`PART_MEMORY_BATCH_ROWS`] rows of them, zero-copy. DataFusion counts a
/// batch's memory as the whole capacity of every buffer it points into, so each slice of a
/// million-row batch (or of an Arrow IPC message, whose columns all point into one body) was
/// counted as the whole batch: a sort of 16 MB of keys reserved 537 MB and failed under a 400 MB
/// `max_memory_usage`, without spilling. So a part's rows are held in batches of this many rows
/// with buffers of their own ([`own_buffers`]), copied once when the part is written or loaded,
/// and what a query holds is counted as what it holds.
pub(super) const PART_MEMORY_BATCH_ROWS: usize = 8192;

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
        Ok(Part { entry, batches: own_buffers(&batches), mem_bytes })
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
    Ok(Part { entry: entry.clone(), batches: own_buffers(&batches), mem_bytes })
}

/// `batches` as batches of at most [`PART_MEMORY_BATCH_ROWS`] rows, each column copied into
/// buffers of its own, sized to its rows (see [`PART_MEMORY_BATCH_ROWS`]).
pub(super) fn own_buffers(batches: &[RecordBatch]) -> Vec<RecordBatch> {
    let mut out = Vec::with_capacity(batches.iter().map(|b| b.num_rows().div_ceil(PART_MEMORY_BATCH_ROWS)).sum());
    for batch in batches {
        let rows = batch.num_rows();
        for at in (0..rows).step_by(PART_MEMORY_BATCH_ROWS) {
            let len = PART_MEMORY_BATCH_ROWS.min(rows - at);
            let copy_column = |column: &arrow::array::ArrayRef| {
                let data = column.to_data();
                let mut copy = MutableArrayData::new(vec![&data], false, len);
                copy.try_extend(0, at, at + len).map(|()| make_array(copy.freeze()))
            };
            let options = RecordBatchOptions::new().with_row_count(Some(len));
            let copied = batch
                .columns()
                .iter()
                .map(copy_column)
                .collect::<Result<Vec<_>, _>>()
                .and_then(|columns| RecordBatch::try_new_with_options(batch.schema(), columns, &options));
            // A copy cut from a valid batch does not fail (offsets only shrink); if it did, the
            // slice holds the same rows, only counted larger.
            out.push(copied.unwrap_or_else(|_| batch.slice(at, len)));
        }
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Array, Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    /// What DataFusion counts for a batch: the whole capacity of every distinct buffer it points
    /// into (`datafusion_common::utils::memory::get_record_batch_memory_size`).
    fn counted(batch: &RecordBatch) -> usize {
        let mut seen = std::collections::HashSet::new();
        let mut total = 0;
        for column in batch.columns() {
            for buffer in column.to_data().buffers() {
                if seen.insert(buffer.data_ptr()) {
                    total += buffer.capacity();
                }
            }
        }
        total
    }

    #[test]
    fn a_parts_rows_are_held_in_small_batches_counted_as_what_they_hold() {
        let schema =
            Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, true), Field::new("s", DataType::Utf8, true)]));
        let rows = 100_000;
        let keys = Int64Array::from_iter_values(0..rows as i64);
        let text = StringArray::from_iter_values((0..rows).map(|i| format!("value {i}")));
        let whole = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(keys), Arc::new(text)]).expect("batch");
        // As a part's batch arrives: a slice of something larger (a network message, a file).
        let part = [whole.slice(10, rows - 20)];
        let held = own_buffers(&part);
        assert!(held.iter().all(|b| b.num_rows() <= PART_MEMORY_BATCH_ROWS), "batches too long");
        assert_eq!(concat_batches(&schema, &held).expect("concat"), part[0]);
        let data: usize = held.iter().map(row_bytes).sum();
        let counted_now: usize = held.iter().map(counted).sum();
        assert!(counted_now <= data * 3 / 2 + held.len() * 256, "counted {counted_now} for {data} bytes of rows");
        // Each slice of the part as it was counted the whole part.
        assert!(counted(&part[0].slice(0, PART_MEMORY_BATCH_ROWS)) > data / 2);
        assert!(own_buffers(&[]).is_empty());
    }
}
