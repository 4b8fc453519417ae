//! Group ids for one or several GROUP BY keys (db-benchmark's q2 groups by `id1, id2`, q9 by
//! `id2, id4`: 100 values each, 10 000 groups).
//!
//! Each key column maps its values to its own dense ids ([`GroupKeys`]), and the ids of two
//! columns map to a dense pair id through a direct table: `table[left << bits | right]`, one load
//! per row, no hashing. More keys chain: the pair id of the first two keys is the left side of the
//! pair with the third, and so on. A table covers every combination of the ids seen so far, so it
//! is only for keys whose value counts multiply to at most [`PAIR_SLOTS_MAX`]; a batch that would
//! need more stops the mapping with [`Mapped::Full`], as passing `max_groups` does, and the
//! operator hands over to DataFusion's aggregation.
//!
//! One key is mapped by its column alone, without a pair table.

use datafusion::arrow::array::{ArrayRef, UInt32Array};
use datafusion::arrow::compute::take;
use datafusion::arrow::datatypes::DataType;
use datafusion::error::{DataFusionError, Result};

use super::keys::{GroupKeys, Mapped};

/// Most slots one pair table holds (a `u32` each: 4 MiB): the product of the value counts of
/// the keys it pairs, each rounded up to a power of two on the right.
pub const PAIR_SLOTS_MAX: usize = 1 << 20;
/// Most GROUP BY keys one mapping takes.
pub const KEYS_MAX: usize = 4;
/// A slot no pair has taken.
const EMPTY: u32 = u32::MAX;

/// The group-id mapping for all the GROUP BY keys of one aggregation.
#[derive(Debug)]
pub struct KeySet {
    columns: Vec<GroupKeys>,
    /// `pairs[i]` pairs the ids of keys `0..=i` with those of key `i + 1`.
    pairs: Vec<PairKeys>,
    /// Scratch: one key's ids for the batch being mapped, and a pair's.
    column_ids: Vec<Vec<u32>>,
    pair_ids: Vec<u32>,
}

impl KeySet {
    /// A mapping for keys of these types, if there are at most [`KEYS_MAX`] and
    /// [`GroupKeys::for_type`] takes each.
    pub fn for_types(types: &[DataType]) -> Option<Self> {
        if types.is_empty() || types.len() > KEYS_MAX {
            return None;
        }
        let columns = types.iter().map(GroupKeys::for_type).collect::<Option<Vec<_>>>()?;
        let pairs = (1..types.len()).map(|_| PairKeys::default()).collect();
        Some(KeySet { columns, pairs, column_ids: vec![Vec::new(); types.len()], pair_ids: Vec::new() })
    }

    /// How many keys.
    pub fn width(&self) -> usize {
        self.columns.len()
    }

    /// Groups made so far.
    pub fn len(&self) -> usize {
        match self.pairs.last() {
            Some(pair) => pair.lefts.len(),
            None => self.columns.first().map_or(0, GroupKeys::len),
        }
    }

    /// Fills `ids` (cleared first) with the group of each row; `keys` holds one array per key,
    /// in order. Stops with [`Mapped::Full`] before making more than `max_groups` groups, or
    /// when a pair table would pass [`PAIR_SLOTS_MAX`].
    pub fn map(&mut self, keys: &[ArrayRef], max_groups: usize, ids: &mut Vec<u32>) -> Result<Mapped> {
        if keys.len() != self.columns.len() {
            return Err(DataFusionError::Internal(format!(
                "small-group aggregation: {} key arrays for {} keys",
                keys.len(),
                self.columns.len()
            )));
        }
        if let ([column], [key]) = (self.columns.as_mut_slice(), keys) {
            return column.map(key.as_ref(), column.max_groups(max_groups), ids);
        }
        for ((column, key), out) in self.columns.iter_mut().zip(keys).zip(&mut self.column_ids) {
            let limit = column.max_groups(usize::MAX);
            if column.map(key.as_ref(), limit, out)? == Mapped::Full {
                return Ok(Mapped::Full);
            }
        }
        // Key 0's ids are the left side of the first pair; each pair's ids the left of the next.
        let mut left_groups = self.columns[0].len();
        std::mem::swap(ids, &mut self.column_ids[0]);
        let pairs = self.pairs.len();
        for (i, pair) in self.pairs.iter_mut().enumerate() {
            let limit = if i + 1 == pairs { max_groups } else { usize::MAX };
            let right = (self.column_ids[i + 1].as_slice(), self.columns[i + 1].len());
            let mapped = pair.map((ids.as_slice(), left_groups), right, limit, &mut self.pair_ids);
            std::mem::swap(ids, &mut self.pair_ids);
            if mapped == Mapped::Full {
                return Ok(Mapped::Full);
            }
            left_groups = pair.lefts.len();
        }
        Ok(Mapped::Done)
    }

    /// The keys of the first `groups` groups, one array per key, of the given types (the key
    /// columns').
    pub fn emit(&self, groups: usize, types: &[DataType]) -> Result<Vec<ArrayRef>> {
        if let ([column], [data_type]) = (self.columns.as_slice(), types) {
            return Ok(vec![column.emit(groups, data_type)?]);
        }
        // Walk the chain back: the last pair's groups give key n-1's ids and the ids of the
        // pair before it, and so on down to key 0.
        let mut per_key: Vec<Vec<u32>> = vec![Vec::new(); self.columns.len()];
        let mut current: Vec<u32> = (0..groups as u32).collect();
        for (i, pair) in self.pairs.iter().enumerate().rev() {
            per_key[i + 1] = current.iter().map(|&g| pair.rights[g as usize]).collect();
            current = current.iter().map(|&g| pair.lefts[g as usize]).collect();
        }
        per_key[0] = current;
        self.columns
            .iter()
            .zip(types)
            .zip(per_key)
            .map(|((column, data_type), ids)| {
                let values = column.emit(column.len(), data_type)?;
                Ok(take(values.as_ref(), &UInt32Array::from(ids), None)?)
            })
            .collect()
    }

    /// Bytes held.
    pub fn size(&self) -> usize {
        let columns: usize = self.columns.iter().map(GroupKeys::size).sum();
        let pairs: usize = self.pairs.iter().map(PairKeys::size).sum();
        let scratch: usize = self.column_ids.iter().map(|v| v.capacity() * 4).sum();
        columns + pairs + scratch + self.pair_ids.capacity() * 4
    }
}

/// Pairs of dense ids (left, right) to dense group ids, through a direct table.
#[derive(Debug, Default)]
struct PairKeys {
    /// Right ids stay below `1 << bits`: a table row's width.
    bits: u32,
    /// `table[left << bits | right]`: the pair's group, or [`EMPTY`]. Rows for left ids
    /// `0..table.len() >> bits`.
    table: Vec<u32>,
    /// Each group's left and right id.
    lefts: Vec<u32>,
    rights: Vec<u32>,
}

impl PairKeys {
    /// Fills `ids` (cleared first) with the group of each row's pair; `left` and `right` are
    /// each side's ids and how many ids that side has made.
    fn map(
        &mut self,
        (left, left_groups): (&[u32], usize),
        (right, right_groups): (&[u32], usize),
        max_groups: usize,
        ids: &mut Vec<u32>,
    ) -> Mapped {
        ids.clear();
        if !self.cover(left_groups, right_groups) {
            return Mapped::Full;
        }
        let max_groups = max_groups.min(EMPTY as usize);
        ids.reserve(left.len());
        let bits = self.bits;
        for (&l, &r) in left.iter().zip(right) {
            let slot = &mut self.table[((l as usize) << bits) | r as usize];
            if *slot == EMPTY {
                if self.lefts.len() >= max_groups {
                    return Mapped::Full;
                }
                *slot = self.lefts.len() as u32;
                self.lefts.push(l);
                self.rights.push(r);
            }
            ids.push(*slot);
        }
        Mapped::Done
    }

    /// Makes the table cover left ids below `left_groups` and right ids below `right_groups`;
    /// false if that needs more than [`PAIR_SLOTS_MAX`] slots.
    fn cover(&mut self, left_groups: usize, right_groups: usize) -> bool {
        let bits = self.bits.max(right_groups.max(1).next_power_of_two().trailing_zeros());
        let rows = (self.table.len() >> self.bits).max(left_groups);
        if bits == self.bits && rows == self.table.len() >> self.bits && !self.table.is_empty() {
            return true;
        }
        // Rows grow by doubling (left ids that keep coming rebuild O(log) times).
        let rows = if rows > self.table.len() >> self.bits { rows.next_power_of_two() } else { rows };
        let Some(slots) = rows.checked_mul(1usize << bits).filter(|&s| s <= PAIR_SLOTS_MAX) else {
            return false;
        };
        if bits == self.bits {
            self.table.resize(slots, EMPTY);
            return true;
        }
        let mut table = vec![EMPTY; slots];
        for (g, (&l, &r)) in self.lefts.iter().zip(&self.rights).enumerate() {
            table[((l as usize) << bits) | r as usize] = g as u32;
        }
        self.table = table;
        self.bits = bits;
        true
    }

    fn size(&self) -> usize {
        (self.table.capacity() + self.lefts.capacity() + self.rights.capacity()) * 4
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{Array, Int32Array, StringArray};

    use super::*;

    fn key_arrays(a: Vec<Option<&str>>, b: Vec<Option<i32>>) -> Vec<ArrayRef> {
        vec![Arc::new(StringArray::from(a)), Arc::new(Int32Array::from(b))]
    }

    #[test]
    fn pairs_get_one_group_each_as_tables_grow() {
        let types = [DataType::Utf8, DataType::Int32];
        let mut keys = KeySet::for_types(&types).unwrap();
        let mut ids = Vec::new();
        let mut seen = std::collections::HashMap::new();
        // Batches that widen the right side (new ints) and add left rows (new strings) in turn.
        for round in 0..40i32 {
            let names: Vec<String> = (0..50).map(|i| format!("k{}", (i * 7 + round) % (round + 3))).collect();
            let a: Vec<Option<&str>> =
                names.iter().enumerate().map(|(i, s)| (i % 11 != 0).then_some(s.as_str())).collect();
            let b: Vec<Option<i32>> = (0..50).map(|i| (i % 13 != 0).then_some((i * round) % (round * 5 + 1))).collect();
            let arrays = key_arrays(a.clone(), b.clone());
            assert_eq!(keys.map(&arrays, usize::MAX, &mut ids).unwrap(), Mapped::Done);
            for (row, &id) in ids.iter().enumerate() {
                let key = (a[row].map(str::to_string), b[row]);
                assert_eq!(*seen.entry(key.clone()).or_insert(id), id, "{key:?} changed group");
            }
        }
        assert_eq!(keys.len(), seen.len());
        let emitted = keys.emit(keys.len(), &types).unwrap();
        let (a, b) = (emitted[0].as_any().downcast_ref::<StringArray>().unwrap(), emitted[1].as_primitive_i32());
        for ((name, number), &id) in &seen {
            let g = id as usize;
            assert_eq!(a.is_valid(g).then(|| a.value(g).to_string()), *name);
            assert_eq!(b.is_valid(g).then(|| b.value(g)), *number);
        }
    }

    #[test]
    fn three_keys_chain_and_stop_at_max_groups() {
        let types = [DataType::Int32, DataType::Int32, DataType::Int32];
        let mut keys = KeySet::for_types(&types).unwrap();
        let column = |v: Vec<i32>| Arc::new(Int32Array::from(v)) as ArrayRef;
        let arrays = vec![column(vec![1, 1, 2, 1]), column(vec![5, 5, 5, 6]), column(vec![0, 0, 0, 0])];
        let mut ids = Vec::new();
        assert_eq!(keys.map(&arrays, 3, &mut ids).unwrap(), Mapped::Done);
        assert_eq!(ids, [0, 0, 1, 2]);
        let more = vec![column(vec![1, 9]), column(vec![5, 5]), column(vec![0, 0])];
        assert_eq!(keys.map(&more, 3, &mut ids).unwrap(), Mapped::Full);
        let emitted = keys.emit(3, &types).unwrap();
        let firsts: Vec<i32> = emitted[0].as_primitive_i32().values().to_vec();
        assert_eq!(firsts, [1, 2, 1]);
    }

    #[test]
    fn too_many_combinations_stop_the_mapping() {
        let types = [DataType::Int64, DataType::Int64];
        let mut keys = KeySet::for_types(&types).unwrap();
        let n = 2048i64;
        let left = Arc::new(datafusion::arrow::array::Int64Array::from_iter_values(0..n)) as ArrayRef;
        let right = Arc::new(datafusion::arrow::array::Int64Array::from_iter_values((0..n).map(|i| i * 3))) as ArrayRef;
        let mut ids = Vec::new();
        assert_eq!(keys.map(&[left, right], usize::MAX, &mut ids).unwrap(), Mapped::Full);
    }

    trait AsI32 {
        fn as_primitive_i32(&self) -> &Int32Array;
    }
    impl AsI32 for ArrayRef {
        fn as_primitive_i32(&self) -> &Int32Array {
            self.as_any().downcast_ref::<Int32Array>().unwrap()
        }
    }
}
