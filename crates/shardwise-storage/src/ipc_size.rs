//! How big a buffer to reserve before encoding record batches as Arrow IPC.
//!
//! Encoders here write a whole piece, WAL record or part into one `Vec` before it goes to disk or
//! the network. Letting that `Vec` grow by doubling copied multi-megabyte buffers several times
//! over into freshly faulted memory, which was most of a bulk load's CPU; reserving the encoded
//! size up front costs one allocation.

use arrow::array::{Array, RecordBatch};

/// Bytes reserved, besides the rows, for an IPC stream's or file's schema, message headers,
/// padding and footer.
pub const IPC_FRAMING_ESTIMATE_BYTES: usize = 64 * 1024;

/// About the size of `batches` encoded as Arrow IPC: the bytes of the rows they show (a slice
/// counts only its own rows, not the buffers it shares), plus [`IPC_FRAMING_ESTIMATE_BYTES`].
pub fn ipc_size_estimate<'a>(batches: impl IntoIterator<Item = &'a RecordBatch>) -> usize {
    let rows: usize = batches
        .into_iter()
        .flat_map(|batch| batch.columns())
        .map(|column| column.to_data().get_slice_memory_size().unwrap_or_else(|_| column.get_array_memory_size()))
        .sum();
    rows + IPC_FRAMING_ESTIMATE_BYTES
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use arrow::ipc::writer::StreamWriter;

    use super::*;

    #[test]
    fn the_estimate_covers_the_encoding_and_counts_slices_by_their_rows() {
        let schema =
            Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, true), Field::new("s", DataType::Utf8, true)]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from_iter_values(0..10_000)),
                Arc::new(StringArray::from_iter_values((0..10_000).map(|i| format!("row {i}")))),
            ],
        )
        .unwrap();
        let mut out = Vec::new();
        let mut writer = StreamWriter::try_new(&mut out, &schema).unwrap();
        writer.write(&batch).unwrap();
        writer.finish().unwrap();
        drop(writer);
        let estimate = ipc_size_estimate([&batch]);
        assert!(estimate >= out.len(), "{estimate} < {}", out.len());
        assert!(estimate < out.len() + 2 * IPC_FRAMING_ESTIMATE_BYTES, "{estimate} vs {}", out.len());
        let slice = batch.slice(0, 100);
        assert!(ipc_size_estimate([&slice]) < IPC_FRAMING_ESTIMATE_BYTES + 4096);
    }
}
