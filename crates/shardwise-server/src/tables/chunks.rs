//! How an insert is cut into chunks: each chunk is placed, then written to the replicas or queued
//! in the outbox, as a unit.
//!
//! Why a byte bound beside the row bound: a `delay_mode_distributed` chunk goes into the outbox
//! as one WAL record holding every destination's copy of its rows (`replicas` copies), and a WAL
//! record holds at most [`WAL_RECORD_MAX_BYTES`]. 262 144 rows of 130 bytes with two replicas
//! passed it, so every large insert or `shardwise load` of wide rows into a delayed table failed
//! (and its error said to retry, which failed the same way). A chunk now also ends before its
//! rows pass [`chunk_max_bytes`] for the table's replica count.
//!
//! Chunks are counted from the first row, by each row's own size, never by how the input was
//! cut into batches, so the same rows always make the same chunks: the dedup keys of an
//! `insert_id` retry rely on it. A single row too large for a chunk is refused before anything
//! is written.

use datafusion::arrow::array::RecordBatch;
use shardwise_query::QueryError;
use shardwise_storage::WAL_RECORD_MAX_BYTES;
pub(crate) use shardwise_storage::chunk_size::{batch_bytes, chunk_max_bytes, row_sizes};

/// Cuts the rows into chunks of at most `chunk_rows` rows and `chunk_bytes` row bytes, counted
/// from the first row, so the same input always gives the same chunks (which the dedup keys rely
/// on). A row larger than `chunk_bytes` is an error giving its size (not its number: an insert's
/// rows may have been put in value order first).
pub(crate) fn chunks(
    batches: &[RecordBatch],
    chunk_rows: usize,
    chunk_bytes: usize,
) -> Result<Vec<Vec<RecordBatch>>, QueryError> {
    let chunk_rows = chunk_rows.max(1);
    let mut out: Vec<Vec<RecordBatch>> = Vec::new();
    let mut current: Vec<RecordBatch> = Vec::new();
    let (mut current_rows, mut current_bytes) = (0, 0);
    // Most inserts (a load's 262 144-row segments of narrow rows among them) hold fewer bytes in
    // all than one chunk may: no chunk can then end by bytes, and the rows are not sized one by
    // one (each row counts 0 below).
    let by_bytes = batches.iter().map(batch_bytes).sum::<usize>() > chunk_bytes;
    for batch in batches {
        let sizes = match by_bytes {
            true => row_sizes(batch),
            false => vec![0; batch.num_rows()],
        };
        let mut start = 0;
        for (row, &size) in sizes.iter().enumerate() {
            if size > chunk_bytes {
                return Err(QueryError::Rejected(format!(
                    "a row of {size} bytes is more than an insert chunk of this table may hold ({chunk_bytes} \
                     bytes: one WAL record of at most {WAL_RECORD_MAX_BYTES} bytes carries every replica's copy); \
                     the insert holding it was refused before any of it was written"
                )));
            }
            if current_rows == chunk_rows || current_bytes + size > chunk_bytes {
                if row > start {
                    current.push(batch.slice(start, row - start));
                }
                out.push(std::mem::take(&mut current));
                (start, current_rows, current_bytes) = (row, 0, 0);
            }
            current_rows += 1;
            current_bytes += size;
        }
        if sizes.len() > start {
            current.push(batch.slice(start, sizes.len() - start));
        }
    }
    if current_rows > 0 {
        out.push(current);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn rows_of(out: &[Vec<RecordBatch>]) -> Vec<usize> {
        out.iter().map(|c| c.iter().map(|b| b.num_rows()).sum()).collect()
    }

    #[test]
    fn chunks_are_cut_by_row_count_from_the_start() {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, true)]));
        let b =
            |n: i64| RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from_iter_values(0..n))]).unwrap();
        let out = chunks(&[b(5), b(7), b(1)], 4, usize::MAX).unwrap();
        assert_eq!(rows_of(&out), vec![4, 4, 4, 1]);
        assert!(chunks(&[], 4, usize::MAX).unwrap().is_empty());
        // By bytes: 8 a row, 20 a chunk.
        let out = chunks(&[b(5), b(7), b(1)], 100, 20).unwrap();
        assert_eq!(rows_of(&out), vec![2, 2, 2, 2, 2, 2, 1]);
    }

    #[test]
    fn chunks_by_bytes_do_not_depend_on_the_batches() {
        let schema = Arc::new(Schema::new(vec![Field::new("s", DataType::Utf8, true)]));
        let values: Vec<Option<String>> = (0..200).map(|i| (i % 9 != 0).then(|| "x".repeat((i * 37) % 101))).collect();
        let batch = |v: &[Option<String>]| {
            RecordBatch::try_new(schema.clone(), vec![Arc::new(StringArray::from(v.to_vec()))]).unwrap()
        };
        let whole = chunks(&[batch(&values)], 1000, 600).unwrap();
        let cut = chunks(&[batch(&values[..13]), batch(&values[13..150]), batch(&values[150..])], 1000, 600).unwrap();
        let text = |out: &[Vec<RecordBatch>]| {
            out.iter()
                .map(|c| datafusion::arrow::util::pretty::pretty_format_batches(c).unwrap().to_string())
                .collect::<Vec<_>>()
        };
        assert!(whole.len() > 10);
        assert_eq!(text(&whole), text(&cut));
        for chunk in &whole {
            let bytes: usize = chunk.iter().map(|b| row_sizes(b).iter().sum::<usize>()).sum();
            assert!(bytes <= 600, "{bytes}");
            // Sized at once, sliced batches included, as row by row.
            assert_eq!(chunk.iter().map(batch_bytes).sum::<usize>(), bytes);
        }
        // All of it within one chunk's bytes: cut by rows only, as when sized row by row.
        let total: usize = [batch(&values)].iter().map(batch_bytes).sum();
        assert_eq!(rows_of(&chunks(&[batch(&values)], 64, total).unwrap()), vec![64, 64, 64, 8]);
        // A row larger than a chunk is refused, named.
        let big = vec![Some("y".repeat(10)), Some("z".repeat(700))];
        let e = chunks(&[batch(&big)], 1000, 600).unwrap_err();
        assert!(e.to_string().contains("a row of 704 bytes"), "{e}");
    }

    #[test]
    fn the_byte_bound_shares_a_record_among_the_replicas() {
        assert_eq!(chunk_max_bytes(usize::MAX, 1), WAL_RECORD_MAX_BYTES / 100 * 75);
        assert_eq!(chunk_max_bytes(usize::MAX, 3), WAL_RECORD_MAX_BYTES / 100 * 75 / 3);
        assert_eq!(chunk_max_bytes(1000, 2), 1000);
    }
}
