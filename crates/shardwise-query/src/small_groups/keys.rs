//! Group ids for [`super::SmallGroupsExec`]: each row's key becomes a dense group index
//! (0, 1, 2, .. in the order keys are first seen), which the accumulators use to index plain
//! vectors.
//!
//! - Integer keys go through a direct-mapped window: `slots[key - lo]` holds the key's group, so
//!   a lookup is one subtraction and one load, no hashing. The window covers at most
//!   [`DIRECT_SPAN_MAX`] values and widens as batches bring keys outside it; keys it cannot
//!   cover go to a hash map, and when a widening covers keys already in the map, they move
//!   into the window (one group per key, always).
//! - String keys go through a hash table of group ids whose keys live in one byte buffer, with a
//!   cache of short keys in front ([`super::byte_keys`]).
//!
//! A mapping stops with [`Mapped::Full`] before it would make more than `max_groups` groups; the
//! groups made by the batch it was mapping then carry no values yet (the caller emits only the
//! groups that existed before that batch).

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int64Array};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{
    DataType, Date32Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type,
};
use datafusion::error::{DataFusionError, Result};
use hashbrown::HashMap;

pub use super::byte_keys::ByteKeys;
use super::byte_keys::CACHE_BITS;

/// Most key values one integer window covers (a `u32` slot each: 1 MiB).
pub const DIRECT_SPAN_MAX: u64 = 1 << 18;
/// The first window's size when its batch's keys span less (room to grow without a rebuild).
const DIRECT_SPAN_MIN: u64 = 1 << 10;
/// String keys beyond this many groups go to DataFusion's aggregation: past what the short-key
/// cache holds, a lookup is a probe of the hash table and a compare through the key buffer, which
/// measured slower than DataFusion's own table (q3's 100 000 keys of 12 bytes: 1.5x).
pub const BYTE_KEYS_MAX_GROUPS: usize = 1 << CACHE_BITS;
/// A slot of the window no key has taken.
const EMPTY: u32 = u32::MAX;

/// Did every row of the batch get a group id?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mapped {
    Done,
    /// One more group would pass `max_groups`; the batch's ids are incomplete.
    Full,
}

/// The group-id mapping for one key column.
#[derive(Debug)]
pub enum GroupKeys {
    Int(IntKeys),
    Bytes(ByteKeys),
}

impl GroupKeys {
    /// A mapping for keys of type `data_type`, if it is one this module handles.
    pub fn for_type(data_type: &DataType) -> Option<Self> {
        match data_type {
            DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::Date32 => Some(GroupKeys::Int(IntKeys::default())),
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Some(GroupKeys::Bytes(ByteKeys::default())),
            _ => None,
        }
    }

    /// The most groups this mapping makes, given the configured `max_groups`: string keys stop
    /// at [`BYTE_KEYS_MAX_GROUPS`].
    pub fn max_groups(&self, configured: usize) -> usize {
        match self {
            GroupKeys::Int(_) => configured,
            GroupKeys::Bytes(_) => configured.min(BYTE_KEYS_MAX_GROUPS),
        }
    }

    /// Groups made so far.
    pub fn len(&self) -> usize {
        match self {
            GroupKeys::Int(k) => k.values.len(),
            GroupKeys::Bytes(k) => k.len(),
        }
    }

    /// Fills `ids` (cleared first) with the group of each row of `keys`.
    pub fn map(&mut self, keys: &dyn Array, max_groups: usize, ids: &mut Vec<u32>) -> Result<Mapped> {
        ids.clear();
        ids.reserve(keys.len());
        let max_groups = max_groups.min(EMPTY as usize);
        match self {
            GroupKeys::Int(k) => match keys.data_type() {
                DataType::Int8 => Ok(k.map(keys.as_primitive::<Int8Type>().values(), keys.nulls(), max_groups, ids)),
                DataType::Int16 => Ok(k.map(keys.as_primitive::<Int16Type>().values(), keys.nulls(), max_groups, ids)),
                DataType::Int32 => Ok(k.map(keys.as_primitive::<Int32Type>().values(), keys.nulls(), max_groups, ids)),
                DataType::Int64 => Ok(k.map(keys.as_primitive::<Int64Type>().values(), keys.nulls(), max_groups, ids)),
                DataType::UInt8 => Ok(k.map(keys.as_primitive::<UInt8Type>().values(), keys.nulls(), max_groups, ids)),
                DataType::UInt16 => {
                    Ok(k.map(keys.as_primitive::<UInt16Type>().values(), keys.nulls(), max_groups, ids))
                }
                DataType::UInt32 => {
                    Ok(k.map(keys.as_primitive::<UInt32Type>().values(), keys.nulls(), max_groups, ids))
                }
                DataType::Date32 => {
                    Ok(k.map(keys.as_primitive::<Date32Type>().values(), keys.nulls(), max_groups, ids))
                }
                other => Err(unexpected(other)),
            },
            GroupKeys::Bytes(k) => match keys.data_type() {
                DataType::Utf8 => Ok(k.map_offsets(keys.as_string::<i32>(), max_groups, ids)),
                DataType::LargeUtf8 => Ok(k.map_offsets(keys.as_string::<i64>(), max_groups, ids)),
                DataType::Utf8View => Ok(k.map_views(keys.as_string_view(), max_groups, ids)),
                other => Err(unexpected(other)),
            },
        }
    }

    /// The keys of the first `groups` groups, as an array of `data_type` (the key column's).
    pub fn emit(&self, groups: usize, data_type: &DataType) -> Result<ArrayRef> {
        match self {
            GroupKeys::Int(k) => k.emit(groups, data_type),
            GroupKeys::Bytes(k) => k.emit(groups, data_type),
        }
    }

    /// Bytes held.
    pub fn size(&self) -> usize {
        match self {
            GroupKeys::Int(k) => {
                k.slots.capacity() * 4 + k.values.capacity() * 8 + k.spill.capacity() * 16 + k.spill.capacity() / 8
            }
            GroupKeys::Bytes(k) => k.size(),
        }
    }
}

pub(super) fn unexpected(data_type: &DataType) -> DataFusionError {
    DataFusionError::Internal(format!("small-group aggregation: keys of type {data_type} changed mid-stream"))
}

/// Integer keys: a direct-mapped window, and a hash map for the keys outside it.
#[derive(Debug)]
pub struct IntKeys {
    /// The key that `slots[0]` stands for.
    lo: i64,
    slots: Vec<u32>,
    /// Keys outside the window.
    spill: HashMap<i64, u32>,
    /// Each group's key (0 for the null group).
    values: Vec<i64>,
    /// The group of null keys, if there is one.
    null_group: Option<u32>,
}

impl Default for IntKeys {
    fn default() -> Self {
        IntKeys { lo: 0, slots: Vec::new(), spill: HashMap::new(), values: Vec::new(), null_group: None }
    }
}

impl IntKeys {
    fn map<T: Copy + Into<i64>>(
        &mut self,
        keys: &[T],
        nulls: Option<&NullBuffer>,
        max_groups: usize,
        ids: &mut Vec<u32>,
    ) -> Mapped {
        let nulls = nulls.filter(|n| n.null_count() > 0);
        let valid = |i: usize| nulls.is_none_or(|n| n.is_valid(i));
        let range = match nulls {
            None => keys.iter().map(|&k| k.into()).fold(None, widen),
            Some(_) => (0..keys.len()).filter(|&i| valid(i)).map(|i| keys[i].into()).fold(None, widen),
        };
        if let Some((lo, hi)) = range {
            self.cover(lo, hi);
            let inside = lo >= self.lo && (hi as i128) < self.lo as i128 + self.slots.len() as i128;
            // The common case: no nulls, every key inside the window, and room for a group per
            // row. Then no row can fail, and the loop is a subtraction and a load per row.
            if nulls.is_none() && inside && self.values.len().saturating_add(keys.len()) <= max_groups {
                let (base, slots, values) = (self.lo, &mut self.slots, &mut self.values);
                ids.extend(keys.iter().map(|&k| {
                    let key: i64 = k.into();
                    let slot = &mut slots[(key - base) as usize];
                    if *slot == EMPTY {
                        *slot = values.len() as u32;
                        values.push(key);
                    }
                    *slot
                }));
                return Mapped::Done;
            }
        }
        let window = self.slots.len() as u64;
        for (i, key) in keys.iter().enumerate() {
            if !valid(i) {
                let id = match self.null_group {
                    Some(id) => id,
                    None if self.values.len() >= max_groups => return Mapped::Full,
                    None => {
                        let id = self.values.len() as u32;
                        self.values.push(0);
                        self.null_group = Some(id);
                        id
                    }
                };
                ids.push(id);
                continue;
            }
            let key: i64 = (*key).into();
            let offset = key.wrapping_sub(self.lo) as u64;
            let id = if offset < window && key >= self.lo {
                let slot = &mut self.slots[offset as usize];
                if *slot == EMPTY {
                    if self.values.len() >= max_groups {
                        return Mapped::Full;
                    }
                    *slot = self.values.len() as u32;
                    self.values.push(key);
                }
                *slot
            } else {
                match self.spill.get(&key) {
                    Some(&id) => id,
                    None if self.values.len() >= max_groups => return Mapped::Full,
                    None => {
                        let id = self.values.len() as u32;
                        self.values.push(key);
                        self.spill.insert(key, id);
                        id
                    }
                }
            };
            ids.push(id);
        }
        Mapped::Done
    }

    /// Widens the window to cover `lo..=hi` as well, if the result spans at most
    /// [`DIRECT_SPAN_MAX`] values; keys of the spill map that fall inside move into it.
    fn cover(&mut self, lo: i64, hi: i64) {
        let end = |lo: i64, len: usize| lo as i128 + len as i128;
        if !self.slots.is_empty() && lo >= self.lo && (hi as i128) < end(self.lo, self.slots.len()) {
            return;
        }
        let (new_lo, new_end) = if self.slots.is_empty() {
            (lo as i128, hi as i128 + 1)
        } else {
            ((lo.min(self.lo)) as i128, (hi as i128 + 1).max(end(self.lo, self.slots.len())))
        };
        let needed = new_end - new_lo;
        if needed > DIRECT_SPAN_MAX as i128 {
            return;
        }
        // Room to grow upwards (keys that rise batch after batch rebuild O(log) times).
        let len = (needed as u64).max((self.slots.len() as u64 * 2).max(DIRECT_SPAN_MIN)).min(DIRECT_SPAN_MAX);
        // `new_lo` is one of two i64 keys, so it fits.
        let new_lo = new_lo as i64;
        let mut slots = vec![EMPTY; len as usize];
        if !self.slots.is_empty() {
            let shift = (self.lo as i128 - new_lo as i128) as usize;
            slots[shift..shift + self.slots.len()].copy_from_slice(&self.slots);
        }
        let len = len as i128;
        self.spill.retain(|&key, &mut id| {
            let offset = key as i128 - new_lo as i128;
            if (0..len).contains(&offset) {
                slots[offset as usize] = id;
                false
            } else {
                true
            }
        });
        self.lo = new_lo;
        self.slots = slots;
    }

    fn emit(&self, groups: usize, data_type: &DataType) -> Result<ArrayRef> {
        let values = Int64Array::from_iter_values(self.values[..groups].iter().copied());
        let values = match self.null_group {
            Some(null) if (null as usize) < groups => {
                let nulls = NullBuffer::from_iter((0..groups).map(|g| g != null as usize));
                Int64Array::new(values.values().clone(), Some(nulls))
            }
            _ => values,
        };
        // Every value came from a column of `data_type`, so the cast back cannot fail or round.
        Ok(cast(&values, data_type)?)
    }
}

/// `range` widened to cover `v`.
fn widen(range: Option<(i64, i64)>, v: i64) -> Option<(i64, i64)> {
    match range {
        None => Some((v, v)),
        Some((lo, hi)) => Some((v.min(lo), v.max(hi))),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use datafusion::arrow::array::{Int32Array, StringArray};

    /// The ids `keys` gives `array`'s rows, and whether it mapped them all.
    pub(in crate::small_groups) fn ids(
        keys: &mut GroupKeys,
        array: &dyn Array,
        max_groups: usize,
    ) -> (Mapped, Vec<u32>) {
        let mut out = Vec::new();
        let mapped = keys.map(array, max_groups, &mut out).expect("map");
        (mapped, out)
    }

    #[test]
    fn integer_keys_get_one_group_each_across_windows_and_the_spill_map() {
        let mut keys = GroupKeys::for_type(&DataType::Int64).expect("int");
        // A window from 0, then keys it cannot cover (spill map), then a batch that widens the
        // window over a key seen before only in the spill map.
        let far = DIRECT_SPAN_MAX as i64 * 4;
        let (_, a) = ids(&mut keys, &Int64Array::from(vec![0, 10, 5, 0]), 100);
        let (_, b) = ids(&mut keys, &Int64Array::from(vec![10, far, -3, i64::MIN, i64::MAX]), 100);
        let (_, c) = ids(&mut keys, &Int64Array::from(vec![far, far - 1, 0, -3]), 100);
        let (_, d) = ids(&mut keys, &Int64Array::from(vec![far + 1, i64::MIN, i64::MAX, far - 1, far]), 100);
        assert_eq!(a, [0, 1, 2, 0]);
        assert_eq!(b, [1, 3, 4, 5, 6]);
        assert_eq!(c, [3, 7, 0, 4]);
        assert_eq!(d, [8, 5, 6, 7, 3]);
        // The window widens down to -3, which moves from the spill map into it.
        let (_, e) = ids(&mut keys, &Int64Array::from(vec![-3, -2, 500, -3]), 100);
        assert_eq!(e, [4, 9, 10, 4]);
        let GroupKeys::Int(int) = &keys else { panic!("integer keys") };
        assert_eq!((int.lo, int.spill.contains_key(&-3)), (-3, false));
        let emitted = keys.emit(keys.len(), &DataType::Int64).expect("emit");
        let emitted = emitted.as_primitive::<Int64Type>();
        assert_eq!(emitted.values().to_vec(), [0, 10, 5, far, -3, i64::MIN, i64::MAX, far - 1, far + 1, -2, 500]);
    }

    #[test]
    fn a_rising_key_domain_keeps_every_key_in_one_group() {
        // Batches of consecutive keys moving up (the window slides and grows), each key twice.
        let mut keys = GroupKeys::for_type(&DataType::Int32).expect("int");
        let mut seen = std::collections::HashMap::new();
        for batch in 0..40 {
            let values: Vec<i32> = (0..2000).map(|i| batch * 1500 + i).flat_map(|k| [k, k]).collect();
            let (mapped, out) = ids(&mut keys, &Int32Array::from(values.clone()), usize::MAX);
            assert_eq!(mapped, Mapped::Done);
            for (key, id) in values.iter().zip(out) {
                assert_eq!(*seen.entry(*key).or_insert(id), id, "key {key}");
            }
        }
        assert_eq!(keys.len(), seen.len());
    }

    #[test]
    fn null_keys_form_one_group_and_emit_as_null() {
        for data_type in [DataType::Int32, DataType::Utf8] {
            let mut keys = GroupKeys::for_type(&data_type).expect("type");
            let array: ArrayRef = match data_type {
                DataType::Int32 => std::sync::Arc::new(Int32Array::from(vec![Some(7), None, Some(7), None])),
                _ => std::sync::Arc::new(StringArray::from(vec![Some("a"), None, Some("a"), None])),
            };
            let (_, out) = ids(&mut keys, &array, 10);
            assert_eq!(out, [0, 1, 0, 1]);
            let emitted = keys.emit(2, &data_type).expect("emit");
            assert_eq!(emitted.null_count(), 1);
            assert!(emitted.is_null(1));
        }
    }

    #[test]
    fn mapping_stops_before_passing_max_groups() {
        let mut keys = GroupKeys::for_type(&DataType::Utf8).expect("utf8");
        let (mapped, _) = ids(&mut keys, &StringArray::from(vec!["a", "b", "a"]), 2);
        assert_eq!(mapped, Mapped::Done);
        let (mapped, _) = ids(&mut keys, &StringArray::from(vec!["b", "c"]), 2);
        assert_eq!(mapped, Mapped::Full);
        let mut keys = GroupKeys::for_type(&DataType::Int64).expect("int");
        let (mapped, _) = ids(&mut keys, &Int64Array::from(vec![1, 2, 3]), 2);
        assert_eq!(mapped, Mapped::Full);
    }
}
