//! The checksum `CHECK TABLE` compares a shard's replicas by: what each replica holds, as a
//! multiset of rows, in 64 bits, whatever order its parts and buffer keep the rows in.
//!
//! Replicas of one shard receive the same rows through different paths (an `immediate` insert
//! writes each, a `delay_mode_distributed` table's senders ship to each on their own schedule)
//! and store them in different batches and parts, so neither the row order nor the batch layout
//! is shared: only the multiset of rows is. The checksum is the wrapping sum, over the rows, of
//! each row's xxHash64 under the placement encoding ([`crate::placement`], every column in
//! table order). A sum is order-free and counts a repeated row each time, so a replica that lost
//! or doubled a row differs; a different multiset gives the same sum with a chance of about
//! 2^-64.

use arrow::record_batch::RecordBatch;

use crate::error::StorageError;
use crate::placement::hash_rows;

/// Rows and checksum of a replica's content.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ContentChecksum {
    pub rows: u64,
    pub checksum: u64,
}

/// The checksum of `batches`, which all have the table's columns.
pub fn content_checksum(batches: &[RecordBatch]) -> Result<ContentChecksum, StorageError> {
    let mut out = ContentChecksum::default();
    for batch in batches.iter().filter(|b| b.num_rows() > 0) {
        let columns: Vec<usize> = (0..batch.num_columns()).collect();
        for hash in hash_rows(batch, &columns)? {
            out.checksum = out.checksum.wrapping_add(hash);
        }
        out.rows += batch.num_rows() as u64;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn batch(ids: &[i64], names: &[Option<&str>]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("name", DataType::Utf8, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![Arc::new(Int64Array::from(ids.to_vec())), Arc::new(StringArray::from(names.to_vec()))],
        )
        .unwrap()
    }

    #[test]
    fn the_same_rows_in_another_order_and_layout_have_the_same_checksum() {
        let one = content_checksum(&[batch(&[1, 2, 3], &[Some("a"), None, Some("c")])]).unwrap();
        let other = content_checksum(&[batch(&[3], &[Some("c")]), batch(&[], &[]), batch(&[2, 1], &[None, Some("a")])])
            .unwrap();
        assert_eq!(one, other);
        assert_eq!(one.rows, 3);
        assert_eq!(content_checksum(&[]).unwrap(), ContentChecksum { rows: 0, checksum: 0 });
    }

    #[test]
    fn a_lost_doubled_or_changed_row_changes_it() {
        let base = content_checksum(&[batch(&[1, 2], &[Some("a"), Some("b")])]).unwrap();
        let lost = content_checksum(&[batch(&[1], &[Some("a")])]).unwrap();
        let doubled = content_checksum(&[batch(&[1, 2, 2], &[Some("a"), Some("b"), Some("b")])]).unwrap();
        let changed = content_checksum(&[batch(&[1, 2], &[Some("a"), Some("B")])]).unwrap();
        // Values moved between rows: the same columns' multisets, other rows.
        let swapped = content_checksum(&[batch(&[1, 2], &[Some("b"), Some("a")])]).unwrap();
        // A NULL is not the empty string.
        let nulled = content_checksum(&[batch(&[1, 2], &[Some("a"), None])]).unwrap();
        let empty = content_checksum(&[batch(&[1, 2], &[Some("a"), Some("")])]).unwrap();
        let all = [base, lost, doubled, changed, swapped, nulled, empty];
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(a.checksum, b.checksum, "{a:?} and {b:?}");
            }
        }
    }
}
