//! Partition keys to dense group ids, for the top-N state.
//!
//! A single integer key (db-benchmark's q8 partitions by `id6`, a BIGINT with 100 000 values)
//! goes through small-group aggregation's direct-mapped window
//! ([`crate::small_groups::keys`]): `slots[key - lo]`, one load per row, with a hash map for keys
//! the window cannot cover. Where DataFusion's `GroupValues` reads its hash table and then the
//! group's value elsewhere, both missing the cache on 10M rows over 100k groups, the window of
//! 100 000 keys is 400 KB. Other keys use DataFusion's [`GroupValues`].

use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::error::{DataFusionError, Result};
use datafusion::physical_plan::aggregates::group_values::{GroupValues, new_group_values};
use datafusion::physical_plan::aggregates::order::GroupOrdering;

use crate::small_groups::keys::{GroupKeys as DirectKeys, Mapped};

/// See the module doc.
pub enum GroupKeys {
    /// The direct window, and its ids of the last batch (widened into the caller's `usize`s).
    Int(DirectKeys, Vec<u32>),
    General(Box<dyn GroupValues>),
}

impl GroupKeys {
    /// Keys of `schema`'s columns.
    pub fn try_new(schema: SchemaRef) -> Result<Self> {
        let types: Vec<&DataType> = schema.fields().iter().map(|f| f.data_type()).collect();
        let direct = match types[..] {
            [t @ (DataType::Int64 | DataType::Int32)] => DirectKeys::for_type(t),
            _ => None,
        };
        Ok(match direct {
            Some(keys) => GroupKeys::Int(keys, Vec::new()),
            None => GroupKeys::General(new_group_values(schema, &GroupOrdering::None)?),
        })
    }

    /// The group id of each row of `columns`, new groups numbered on from [`GroupKeys::len`].
    pub fn intern(&mut self, columns: &[ArrayRef], ids: &mut Vec<usize>) -> Result<()> {
        match self {
            GroupKeys::General(groups) => groups.intern(columns, ids),
            GroupKeys::Int(keys, scratch) => {
                let [column] = columns else {
                    return Err(DataFusionError::Internal(format!(
                        "top-N per group: {} partition key columns for one integer key",
                        columns.len()
                    )));
                };
                // No group limit but the ids' own (u32).
                if keys.map(column.as_ref(), usize::MAX, scratch)? == Mapped::Full {
                    return Err(DataFusionError::ResourcesExhausted(
                        "top-N per group: more than 4 billion partition keys".into(),
                    ));
                }
                ids.clear();
                ids.extend(scratch.iter().map(|&g| g as usize));
                Ok(())
            }
        }
    }

    /// Groups seen.
    pub fn len(&self) -> usize {
        match self {
            GroupKeys::General(groups) => groups.len(),
            GroupKeys::Int(keys, _) => keys.len(),
        }
    }

    /// Bytes held.
    pub fn size(&self) -> usize {
        match self {
            GroupKeys::General(groups) => groups.size(),
            GroupKeys::Int(keys, scratch) => keys.size() + scratch.capacity() * 4,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use datafusion::arrow::array::{Int32Array, Int64Array};
    use datafusion::arrow::datatypes::{Field, Schema};

    use super::*;

    fn keys(t: DataType) -> GroupKeys {
        GroupKeys::try_new(Arc::new(Schema::new(vec![Field::new("k", t, true)]))).expect("keys")
    }

    #[test]
    fn integer_keys_get_dense_ids_in_order_of_first_appearance() {
        let mut next = super::super::test_rng(5);
        let mut groups = keys(DataType::Int64);
        assert!(matches!(groups, GroupKeys::Int(..)));
        let mut expected: HashMap<Option<i64>, usize> = HashMap::new();
        let mut ids = Vec::new();
        for _ in 0..50 {
            // Keys spread wide (and negative) and clustered, with nulls; enough to grow often.
            let values: Vec<Option<i64>> = (0..2_000)
                .map(|_| match next() % 10 {
                    0 => None,
                    1..=4 => Some((next() % 3_000) as i64 * 1_000_003),
                    _ => Some(next() as i64),
                })
                .collect();
            groups.intern(&[Arc::new(Int64Array::from(values.clone()))], &mut ids).expect("intern");
            for (value, id) in values.iter().zip(&ids) {
                let n = expected.len();
                assert_eq!(*expected.entry(*value).or_insert(n), *id, "{value:?}");
            }
        }
        assert_eq!(groups.len(), expected.len());
        let mut small = keys(DataType::Int32);
        small
            .intern(&[Arc::new(Int32Array::from(vec![Some(-1), None, Some(7), Some(-1), None]))], &mut ids)
            .expect("i32");
        assert_eq!((ids.clone(), small.len()), (vec![0, 1, 2, 0, 1], 3));
        assert!(matches!(keys(DataType::Utf8), GroupKeys::General(_)));
        // A column of another type than declared is an error, not a panic.
        let strings = Arc::new(datafusion::arrow::array::StringArray::from(vec!["a"]));
        assert!(small.intern(&[strings], &mut ids).is_err());
    }
}
