//! How many bytes an insert's rows count for when it is cut into chunks, and how many one chunk
//! of a table may hold: the server cuts by these, and `shardwise load` checks a file's rows
//! against them before it sends anything, so a row too large for any chunk fails the load
//! before any of it is stored rather than part-way.

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::DataType;

use crate::WAL_RECORD_MAX_BYTES;

/// The default of a node's `insert_chunk_max_bytes`: the most row bytes of one chunk, below what
/// a WAL record leaves ([`chunk_max_bytes`]).
pub const INSERT_CHUNK_MAX_BYTES_DEFAULT: usize = 64 * 1024 * 1024;

/// The share of a WAL record a chunk's copies may fill; the rest is left for the encoding's
/// framing (message headers, buffer padding, one piece per shard and destination).
const RECORD_FILL_PERCENT: usize = 75;

/// The most row bytes (as [`row_sizes`] counts them) one chunk of a table with `replicas`
/// copies may hold, within `setting` (`insert_chunk_max_bytes`).
pub fn chunk_max_bytes(setting: usize, replicas: u32) -> usize {
    let record_share = WAL_RECORD_MAX_BYTES / 100 * RECORD_FILL_PERCENT / (replicas.max(1) as usize);
    setting.min(record_share).max(1)
}

/// The bytes each row of `batch` holds: its fixed-width values, and the bytes (and offset) of
/// each string or binary value. The same for a row whatever batch holds it.
pub fn row_sizes(batch: &RecordBatch) -> Vec<usize> {
    let mut sizes = vec![0usize; batch.num_rows()];
    for column in batch.columns() {
        match column.data_type() {
            DataType::Utf8 => add_lengths(&mut sizes, column.as_string::<i32>().offsets().windows(2), 4),
            DataType::LargeUtf8 => add_lengths(&mut sizes, column.as_string::<i64>().offsets().windows(2), 8),
            DataType::Binary => add_lengths(&mut sizes, column.as_binary::<i32>().offsets().windows(2), 4),
            DataType::LargeBinary => add_lengths(&mut sizes, column.as_binary::<i64>().offsets().windows(2), 8),
            DataType::Utf8View => {
                for (size, view) in sizes.iter_mut().zip(column.as_string_view().views()) {
                    *size += 16 + (*view as u32) as usize;
                }
            }
            other => {
                let width = other.primitive_width().unwrap_or(1);
                sizes.iter_mut().for_each(|size| *size += width);
            }
        }
    }
    sizes
}

/// The sum of [`row_sizes`] of `batch`, from each column's offsets or width, without sizing its
/// rows one by one.
pub fn batch_bytes(batch: &RecordBatch) -> usize {
    let rows = batch.num_rows();
    let span = |first: i128, last: i128| (last - first).max(0) as usize;
    batch
        .columns()
        .iter()
        .map(|column| match column.data_type() {
            DataType::Utf8 => {
                let o = column.as_string::<i32>().offsets();
                4 * rows + span(i128::from(o[0]), i128::from(o[rows]))
            }
            DataType::LargeUtf8 => {
                let o = column.as_string::<i64>().offsets();
                8 * rows + span(i128::from(o[0]), i128::from(o[rows]))
            }
            DataType::Binary => {
                let o = column.as_binary::<i32>().offsets();
                4 * rows + span(i128::from(o[0]), i128::from(o[rows]))
            }
            DataType::LargeBinary => {
                let o = column.as_binary::<i64>().offsets();
                8 * rows + span(i128::from(o[0]), i128::from(o[rows]))
            }
            DataType::Utf8View => column.as_string_view().views().iter().map(|v| 16 + (*v as u32) as usize).sum(),
            other => other.primitive_width().unwrap_or(1) * rows,
        })
        .sum()
}

/// Adds each value's length (the difference of its offsets) plus the offset's own bytes.
fn add_lengths<'a, T: Copy + Into<i128> + 'a>(
    sizes: &mut [usize],
    pairs: impl Iterator<Item = &'a [T]>,
    offset_bytes: usize,
) {
    for (size, pair) in sizes.iter_mut().zip(pairs) {
        let length = (pair[1].into() - pair[0].into()).max(0) as usize;
        *size += offset_bytes + length;
    }
}
