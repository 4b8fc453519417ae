//! Partition keys to dense group ids, for the top-N state.
//!
//! A single integer key (db-benchmark's q8 partitions by `id6`, a BIGINT) has a table of its own:
//! open addressing with the key stored in the slot, so a lookup reads one slot where DataFusion's
//! `GroupValues` reads its hash table and then the group's value elsewhere (on 10M rows over 100k
//! groups, both reads miss the cache). Other keys use DataFusion's [`GroupValues`].

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::datatypes::{DataType, Int32Type, Int64Type, SchemaRef};
use datafusion::error::{DataFusionError, Result};
use datafusion::physical_plan::aggregates::group_values::{GroupValues, new_group_values};
use datafusion::physical_plan::aggregates::order::GroupOrdering;

use super::{PREFETCH_ROWS_AHEAD, prefetch};

/// The integer table's slots at first; it doubles whenever it would be more than half full.
const INT_KEYS_MIN_SLOTS: usize = 1024;

/// See the module doc.
pub enum GroupKeys {
    Int(IntKeys),
    General(Box<dyn GroupValues>),
}

impl GroupKeys {
    /// Keys of `schema`'s columns.
    pub fn try_new(schema: SchemaRef) -> Result<Self> {
        let int = matches!(
            schema.fields().iter().map(|f| f.data_type()).collect::<Vec<_>>()[..],
            [DataType::Int64 | DataType::Int32]
        );
        Ok(match int {
            true => GroupKeys::Int(IntKeys::default()),
            false => GroupKeys::General(new_group_values(schema, &GroupOrdering::None)?),
        })
    }

    /// The group id of each row of `columns`, new groups numbered on from [`GroupKeys::len`].
    pub fn intern(&mut self, columns: &[ArrayRef], ids: &mut Vec<usize>) -> Result<()> {
        match self {
            GroupKeys::General(groups) => groups.intern(columns, ids),
            GroupKeys::Int(keys) => {
                ids.clear();
                let column = &columns[0];
                if let Some(c) = column.as_primitive_opt::<Int64Type>() {
                    keys.intern(c.len(), |row| c.is_valid(row).then(|| c.value(row) as u64), ids);
                } else if let Some(c) = column.as_primitive_opt::<Int32Type>() {
                    keys.intern(c.len(), |row| c.is_valid(row).then(|| c.value(row) as i64 as u64), ids);
                } else {
                    return Err(DataFusionError::Internal(format!(
                        "top-N per group: an integer partition key arrived as {}",
                        column.data_type()
                    )));
                }
                Ok(())
            }
        }
    }

    /// Groups seen.
    pub fn len(&self) -> usize {
        match self {
            GroupKeys::General(groups) => groups.len(),
            GroupKeys::Int(keys) => keys.len,
        }
    }

    /// Bytes held.
    pub fn size(&self) -> usize {
        match self {
            GroupKeys::General(groups) => groups.size(),
            GroupKeys::Int(keys) => keys.slots.capacity() * std::mem::size_of::<Slot>(),
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    key: u64,
    /// Group id + 1; 0 is an empty slot. (A u32 would not make the slot smaller: it is padded
    /// to 16 bytes either way.)
    id: u64,
}

/// Open addressing, linear probing, Fibonacci hashing. See the module doc.
#[derive(Debug, Default)]
pub struct IntKeys {
    slots: Vec<Slot>,
    /// Groups, the null key's included.
    len: usize,
    null_id: Option<usize>,
}

impl IntKeys {
    /// Interns the `rows` keys `key_at` gives (`None`: null), in order.
    fn intern(&mut self, rows: usize, key_at: impl Fn(usize) -> Option<u64>, ids: &mut Vec<usize>) {
        // Room for every row to be a new key, so that no slot moves while the batch is looked
        // up: each row's slot is then known ahead, and fetched ahead (the lookups miss the
        // cache; the CPU overlaps the misses of rows whose slots are already on their way).
        while (self.len + rows + 1) * 2 > self.slots.len() {
            self.grow();
        }
        let mask = self.slots.len() - 1;
        for row in 0..rows {
            if let Some(ahead) = (row + PREFETCH_ROWS_AHEAD < rows).then(|| key_at(row + PREFETCH_ROWS_AHEAD)).flatten()
            {
                prefetch(&self.slots[home(ahead, mask)]);
            }
            let id = match key_at(row) {
                Some(key) => self.id_of(key),
                None => *self.null_id.get_or_insert_with(|| {
                    self.len += 1;
                    self.len - 1
                }),
            };
            ids.push(id);
        }
    }

    /// The id of `key`, a new one if it is new. The table has room (see `intern`).
    #[inline]
    fn id_of(&mut self, key: u64) -> usize {
        let mask = self.slots.len() - 1;
        let mut at = home(key, mask);
        loop {
            let slot = self.slots[at];
            if slot.id == 0 {
                self.len += 1;
                self.slots[at] = Slot { key, id: self.len as u64 };
                return self.len - 1;
            }
            if slot.key == key {
                return slot.id as usize - 1;
            }
            at = (at + 1) & mask;
        }
    }

    fn grow(&mut self) {
        let size = (self.slots.len() * 2).max(INT_KEYS_MIN_SLOTS);
        let old = std::mem::replace(&mut self.slots, vec![Slot::default(); size]);
        let mask = size - 1;
        for slot in old.into_iter().filter(|s| s.id != 0) {
            let mut at = home(slot.key, mask);
            while self.slots[at].id != 0 {
                at = (at + 1) & mask;
            }
            self.slots[at] = slot;
        }
    }
}

/// The slot a key is looked for first: the top bits of the key times 2^64 / phi.
#[inline]
fn home(key: u64, mask: usize) -> usize {
    let bits = mask.count_ones();
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - bits).min(63)) as usize & mask
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
        assert!(matches!(groups, GroupKeys::Int(_)));
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
