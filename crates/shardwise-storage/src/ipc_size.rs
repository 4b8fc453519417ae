//! How many bytes record batches hold: the size to reserve before encoding them as Arrow IPC,
//! and the size a shard store counts them at.
//!
//! Encoders here write a whole piece, WAL record or part into one `Vec` before it goes to disk or
//! the network. Letting that `Vec` grow by doubling copied multi-megabyte buffers several times
//! over into freshly faulted memory, which was most of a bulk load's CPU; reserving the encoded
//! size up front costs one allocation.
//!
//! Arrow's own `get_array_memory_size` counts every buffer an array points into whole, once per
//! array: the columns of a batch decoded from one IPC message are slices of that message's one
//! buffer, so each column counted the whole message and a shipped batch of nine columns was
//! counted about twelve times over. [`row_bytes`] counts what the rows show.

use arrow::array::{Array, RecordBatch};

/// Bytes reserved, besides the rows and [`IPC_FRAMING_PER_COLUMN_BYTES`], for an IPC stream's
/// or file's fixed parts: continuation markers, the end-of-stream marker, a file's magic and
/// footer, message headers' fixed fields.
pub const IPC_FRAMING_BASE_BYTES: usize = 1024;

/// Bytes reserved per column of each batch, and once more per column for the schema: a field's
/// entry in the schema, its node and buffer entries in each message header, and the padding
/// after its buffers (Arrow aligns them to 64 bytes; a stream of 5 rows of 7 columns, one of
/// them a list, took 2,056 bytes). A flat 64 KiB, as before, was 20 times a 100-row insert's
/// piece set, and the outbox keeps each pending payload with its capacity (rank 0's peak
/// resident memory over `shardwise bench insert --count 10000`: 351 MB then, 316 MB now).
pub const IPC_FRAMING_PER_COLUMN_BYTES: usize = 256;

/// About the size of `batches` encoded as Arrow IPC: the bytes of the rows they show (a slice
/// counts only its own rows, not the buffers it shares), plus the framing above. An estimate
/// short of the encoding (deeply nested types, large field metadata) costs a reallocation, not
/// an error.
pub fn ipc_size_estimate<'a>(batches: impl IntoIterator<Item = &'a RecordBatch>) -> usize {
    let (mut bytes, mut schema_columns) = (IPC_FRAMING_BASE_BYTES, 0);
    for batch in batches {
        bytes += row_bytes(batch) + IPC_FRAMING_PER_COLUMN_BYTES * batch.num_columns();
        schema_columns = schema_columns.max(batch.num_columns());
    }
    bytes + IPC_FRAMING_PER_COLUMN_BYTES * schema_columns
}

/// The bytes of the rows `batch` shows: a slice counts only its own rows, and buffers its
/// columns share with each other or with other batches count only for the part each column
/// shows (Arrow's `get_slice_memory_size`; for a type it cannot size that way, the array's
/// whole buffers).
pub fn row_bytes(batch: &RecordBatch) -> usize {
    batch
        .columns()
        .iter()
        .map(|column| column.to_data().get_slice_memory_size().unwrap_or_else(|_| column.get_array_memory_size()))
        .sum()
}

/// `batch` written as an Arrow IPC stream and read back, as a shipped piece arrives: the columns
/// of the result are slices of the one buffer its message was read into.
#[cfg(test)]
pub(crate) fn ipc_round_trip(batch: &RecordBatch) -> RecordBatch {
    let mut message = Vec::new();
    let mut writer = arrow::ipc::writer::StreamWriter::try_new(&mut message, &batch.schema()).expect("writer");
    writer.write(batch).expect("write");
    writer.finish().expect("finish");
    drop(writer);
    let mut reader = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(message), None).expect("reader");
    reader.next().expect("one batch").expect("decoded")
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
        assert!(estimate < out.len() + 2 * IPC_FRAMING_BASE_BYTES, "{estimate} vs {}", out.len());
        let slice = batch.slice(0, 100);
        assert!(ipc_size_estimate([&slice]) < IPC_FRAMING_BASE_BYTES + 4096);
    }

    /// Batches of many columns and types, small and large, several to a stream: the reservation
    /// covers the encoding without being many times its size.
    #[test]
    fn the_estimate_covers_batches_of_many_columns_and_types() {
        use arrow::array::{BooleanArray, Decimal128Array, Float64Array, ListArray, TimestampMicrosecondArray};
        use arrow::datatypes::Int32Type;
        let list = ListArray::from_iter_primitive::<Int32Type, _, _>((0..5).map(|i| Some(vec![Some(i), None])));
        let columns: Vec<arrow::array::ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![Some(1), None, Some(3), Some(4), Some(5)])),
            Arc::new(StringArray::from(vec![Some("a"), Some("bb"), None, Some("dddd"), Some("")])),
            Arc::new(Float64Array::from(vec![0.5; 5])),
            Arc::new(BooleanArray::from(vec![true, false, true, false, true])),
            Arc::new(Decimal128Array::from(vec![1, 2, 3, 4, 5]).with_precision_and_scale(10, 2).unwrap()),
            Arc::new(TimestampMicrosecondArray::from(vec![1, 2, 3, 4, 5])),
            Arc::new(list),
        ];
        let fields: Vec<Field> = columns
            .iter()
            .enumerate()
            .map(|(i, c)| Field::new(format!("a_rather_long_column_name_{i}"), c.data_type().clone(), true))
            .collect();
        let small = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap();
        // And a large one of the same columns (a bulk load's), where the rows dominate.
        let large = arrow::compute::concat_batches(&small.schema(), &vec![small.clone(); 20_000]).unwrap();
        for (batch, count) in [(&small, 1), (&small, 3), (&large, 1), (&large, 2)] {
            let batches = vec![batch.clone(); count];
            let mut out = Vec::new();
            let mut writer = StreamWriter::try_new(&mut out, &batch.schema()).unwrap();
            for b in &batches {
                writer.write(b).unwrap();
            }
            writer.finish().unwrap();
            drop(writer);
            let estimate = ipc_size_estimate(&batches);
            assert!(estimate >= out.len(), "{count} batches: {estimate} < {}", out.len());
            assert!(estimate < 4 * out.len(), "{count} batches: {estimate} vs {}", out.len());
        }
    }

    #[test]
    fn a_decoded_batch_counts_its_rows_once_not_its_message_once_per_column() {
        let schema = Arc::new(Schema::new(
            (0..8).map(|i| Field::new(format!("c{i}"), DataType::Int64, false)).collect::<Vec<_>>(),
        ));
        let columns = (0..8).map(|_| Arc::new(Int64Array::from_iter_values(0..100_000)) as _).collect();
        let batch = RecordBatch::try_new(schema, columns).unwrap();
        let decoded = ipc_round_trip(&batch);
        let rows = 8 * 100_000 * 8;
        assert_eq!(row_bytes(&batch), rows);
        assert_eq!(row_bytes(&decoded), rows);
        // What Arrow's own measure says of the decoded batch, whose columns share the buffer the
        // message was read into (the reason for `row_bytes`).
        let arrow_counts = decoded.get_array_memory_size();
        assert!(arrow_counts > 4 * rows, "{arrow_counts} vs {rows}");
    }
}
