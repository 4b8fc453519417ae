//! Group ids for string keys: a hash table of group ids whose keys live in one byte buffer, and
//! in front of it a direct-mapped cache of short keys.
//!
//! Why the cache: db-benchmark's `id1` and `id2` (100 values of 5 bytes) and most codes and
//! names are at most 8 bytes, so a key fits one machine word. A row's lookup is then a load of
//! the word, a multiply for the slot and one compare; the hash table (a hash of the bytes, a
//! probe and a compare through the key buffer) is asked only on a cache miss.
//!
//! The loop over a `Utf8` column is the hottest code of `GROUP BY id1` (two thirds of the node's
//! CPU in a profile of q1), so it keeps its state in locals: the cache is a fixed-size array
//! (its index needs no bounds check), the ids are written into a slice sized once per batch, and
//! a key's word is masked through a table rather than a branch.

use std::hash::BuildHasher;

use datafusion::arrow::array::{
    Array, ArrayRef, GenericStringArray, LargeStringBuilder, OffsetSizeTrait, StringBuilder, StringViewArray,
    StringViewBuilder,
};
use datafusion::arrow::datatypes::DataType;
use datafusion::error::Result;
use hashbrown::HashTable;

use super::keys::{Mapped, unexpected};
use super::view_table::{NOT_SHORT, ViewTable};

/// Bits of a short key's hash that pick its cache slot.
pub const CACHE_BITS: u32 = 12;
/// Slots of the short-key cache (16 bytes each: 64 KiB).
const CACHE_SLOTS: usize = 1 << CACHE_BITS;
/// Longest key the cache holds: one little-endian word.
const SHORT_KEY_MAX_BYTES: usize = 8;
/// Longest string a `Utf8View` holds inline (in its 16-byte view, after the 4-byte length).
const INLINE_VIEW_MAX_BYTES: usize = 12;
/// A fixed seed: group ids do not depend on it, only the table's layout does.
const HASH_SEED: u64 = 0x5eed_5a11_9b0f_2ad3;
/// `WORD_MASKS[n]` keeps the first `n` bytes of a little-endian word.
const WORD_MASKS: [u64; SHORT_KEY_MAX_BYTES + 1] = {
    let mut masks = [0u64; SHORT_KEY_MAX_BYTES + 1];
    let mut n = 1;
    while n <= SHORT_KEY_MAX_BYTES {
        masks[n] = u64::MAX >> (64 - 8 * n);
        n += 1;
    }
    masks
};

/// String keys: see the module doc.
#[derive(Debug)]
pub struct ByteKeys {
    groups: Groups,
    /// The group of null keys, if there is one (its key in `groups` is empty).
    null_group: Option<u32>,
    /// Keys of up to 8 bytes seen last in each slot (by a hash of the key). Made on first use.
    cache: Option<Box<[CacheSlot; CACHE_SLOTS]>>,
    /// `Utf8View` keys of up to 12 bytes (held whole in their view) by their view
    /// ([`ViewTable`]), and scratch for a batch's views.
    views: ViewTable,
    short_views: Vec<u128>,
}

/// Every group's key and the hash table that finds a key's group.
#[derive(Debug)]
struct Groups {
    /// (hash, group) per group.
    table: HashTable<(u64, u32)>,
    hasher: foldhash::fast::FixedState,
    /// Every group's key, one after the other.
    bytes: Vec<u8>,
    /// Where each group's key starts in `bytes` (it ends where the next starts).
    starts: Vec<usize>,
}

/// A short key (its bytes as a little-endian word, zero-padded) and its group.
#[derive(Debug, Clone, Copy)]
struct CacheSlot {
    word: u64,
    /// `u32::MAX` in an empty slot (no key is that long).
    len: u32,
    group: u32,
}

impl CacheSlot {
    const EMPTY: CacheSlot = CacheSlot { word: 0, len: u32::MAX, group: 0 };
}

/// The `len` (at most 8) bytes at `start` of `values` as a little-endian word, zero-padded.
#[inline]
fn short_word(values: &[u8], start: usize, len: usize) -> u64 {
    let mask = WORD_MASKS[len.min(SHORT_KEY_MAX_BYTES)];
    match values.get(start..).and_then(|v| v.first_chunk::<8>()) {
        Some(chunk) => u64::from_le_bytes(*chunk) & mask,
        None => {
            let mut word = [0u8; 8];
            word[..len].copy_from_slice(&values[start..start + len]);
            u64::from_le_bytes(word)
        }
    }
}

/// The cache slot of a short key (always below [`CACHE_SLOTS`]).
#[inline]
fn cache_index(word: u64, len: usize) -> usize {
    (word.wrapping_add(len as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - CACHE_BITS)) as usize
}

impl Default for ByteKeys {
    fn default() -> Self {
        let groups = Groups {
            table: HashTable::new(),
            hasher: foldhash::fast::FixedState::with_seed(HASH_SEED),
            bytes: Vec::new(),
            starts: Vec::new(),
        };
        ByteKeys { groups, null_group: None, cache: None, views: ViewTable::new(HASH_SEED), short_views: Vec::new() }
    }
}

impl Groups {
    /// The group of `key`, made if it is new and there is room.
    #[inline]
    fn find_or_insert(&mut self, key: &[u8], max_groups: usize) -> Option<u32> {
        let Groups { table, hasher, bytes, starts } = self;
        let hash = hasher.hash_one(key);
        let key_of = |g: u32| {
            let start = starts[g as usize];
            let end = starts.get(g as usize + 1).copied().unwrap_or(bytes.len());
            &bytes[start..end]
        };
        if let Some(&(_, id)) = table.find(hash, |&(h, g)| h == hash && key_of(g) == key) {
            return Some(id);
        }
        if starts.len() >= max_groups {
            return None;
        }
        let id = starts.len() as u32;
        starts.push(bytes.len());
        bytes.extend_from_slice(key);
        table.insert_unique(hash, (hash, id), |&(h, _)| h);
        Some(id)
    }

    fn key(&self, group: usize) -> &str {
        let start = self.starts[group];
        let end = self.starts.get(group + 1).copied().unwrap_or(self.bytes.len());
        // Whole keys copied from string arrays: valid UTF-8, cut on their own boundaries.
        std::str::from_utf8(&self.bytes[start..end]).unwrap_or_default()
    }
}

impl ByteKeys {
    /// Groups made so far.
    pub fn len(&self) -> usize {
        self.groups.starts.len()
    }

    /// Bytes held.
    pub fn size(&self) -> usize {
        let Groups { table, bytes, starts, .. } = &self.groups;
        let cache = self.cache.as_ref().map_or(0, |c| std::mem::size_of_val(c.as_ref()));
        let views = self.views.size() + self.short_views.capacity() * 16;
        bytes.capacity() + starts.capacity() * 8 + table.capacity() * 16 + cache + views
    }

    /// `Utf8` and `LargeUtf8` keys; `ids` is empty on entry and on [`Mapped::Done`] holds a group
    /// per row. Keys of up to 8 bytes are looked up in the cache first.
    pub fn map_offsets<O: OffsetSizeTrait>(
        &mut self,
        keys: &GenericStringArray<O>,
        max_groups: usize,
        ids: &mut Vec<u32>,
    ) -> Mapped {
        let ByteKeys { groups, null_group, cache, .. } = self;
        let cache = cache.get_or_insert_with(|| Box::new([CacheSlot::EMPTY; CACHE_SLOTS]));
        let (offsets, values) = (keys.value_offsets(), keys.value_data());
        let nulls = keys.nulls().filter(|n| n.null_count() > 0);
        debug_assert!(ids.is_empty(), "GroupKeys::map clears the ids");
        ids.resize(keys.len(), 0);
        let mut stopped_at = None;
        for (row, (id, bounds)) in ids.iter_mut().zip(offsets.windows(2)).enumerate() {
            if nulls.is_some_and(|n| n.is_null(row)) {
                match groups.null_group(null_group, max_groups) {
                    Some(group) => *id = group,
                    None => {
                        stopped_at = Some(row);
                        break;
                    }
                }
                continue;
            }
            let (start, end) = (bounds[0].as_usize(), bounds[1].as_usize());
            let len = end - start;
            if len <= SHORT_KEY_MAX_BYTES {
                let word = short_word(values, start, len);
                let slot = &mut cache[cache_index(word, len)];
                if slot.word == word && slot.len == len as u32 {
                    *id = slot.group;
                    continue;
                }
                match groups.find_or_insert(&values[start..end], max_groups) {
                    Some(group) => {
                        *slot = CacheSlot { word, len: len as u32, group };
                        *id = group;
                    }
                    None => {
                        stopped_at = Some(row);
                        break;
                    }
                }
                continue;
            }
            match groups.find_or_insert(&values[start..end], max_groups) {
                Some(group) => *id = group,
                None => {
                    stopped_at = Some(row);
                    break;
                }
            }
        }
        match stopped_at {
            Some(row) => {
                ids.truncate(row);
                Mapped::Full
            }
            None => Mapped::Done,
        }
    }

    /// `Utf8View` keys: those of up to 12 bytes by their view ([`ViewTable`]), longer ones
    /// through the hash table of bytes. `ids` as for [`ByteKeys::map_offsets`].
    pub fn map_views(&mut self, keys: &StringViewArray, max_groups: usize, ids: &mut Vec<u32>) -> Mapped {
        let ByteKeys { groups, null_group, views, short_views, .. } = self;
        let nulls = keys.nulls().filter(|n| n.null_count() > 0);
        short_views.clear();
        short_views.extend(keys.views().iter().enumerate().map(|(row, &view)| {
            let len = view as u32 as usize;
            match len <= INLINE_VIEW_MAX_BYTES && !nulls.is_some_and(|n| n.is_null(row)) {
                // The length and the bytes, the padding cleared (only a valid key's bytes count).
                true => view & (u128::MAX >> (96 - 8 * len)),
                false => NOT_SHORT,
            }
        }));
        let mut full = false;
        views.lookup(short_views, |row, known| {
            let group = match known {
                Some(group) => Some(group),
                None if nulls.is_some_and(|n| n.is_null(row)) => groups.null_group(null_group, max_groups),
                None => groups.find_or_insert(keys.value(row).as_bytes(), max_groups),
            };
            match group {
                Some(group) => ids.push(group),
                None => full = true,
            }
            group
        });
        match full {
            true => Mapped::Full,
            false => Mapped::Done,
        }
    }

    /// The keys of the first `groups` groups, as an array of `data_type` (the key column's).
    pub fn emit(&self, groups: usize, data_type: &DataType) -> Result<ArrayRef> {
        let null = self.null_group.map(|g| g as usize);
        let keys = (0..groups).map(|g| (Some(g) != null).then(|| self.groups.key(g)));
        let bytes = self.groups.bytes.len();
        Ok(match data_type {
            DataType::Utf8 => {
                let mut b = StringBuilder::with_capacity(groups, bytes);
                keys.for_each(|k| b.append_option(k));
                std::sync::Arc::new(b.finish())
            }
            DataType::LargeUtf8 => {
                let mut b = LargeStringBuilder::with_capacity(groups, bytes);
                keys.for_each(|k| b.append_option(k));
                std::sync::Arc::new(b.finish())
            }
            DataType::Utf8View => {
                let mut b = StringViewBuilder::with_capacity(groups);
                keys.for_each(|k| b.append_option(k));
                std::sync::Arc::new(b.finish())
            }
            other => return Err(unexpected(other)),
        })
    }
}

impl Groups {
    /// The group of null keys (`null_group`), made with an empty key if there is room.
    fn null_group(&mut self, null_group: &mut Option<u32>, max_groups: usize) -> Option<u32> {
        if null_group.is_none() && self.starts.len() < max_groups {
            *null_group = Some(self.starts.len() as u32);
            self.starts.push(self.bytes.len());
        }
        *null_group
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{AsArray, StringArray};
    use datafusion::arrow::compute::cast;

    use super::super::keys::GroupKeys;
    use super::super::keys::tests::ids;
    use super::*;

    #[test]
    fn string_keys_of_every_layout_map_alike() {
        let values = vec![Some("id001"), Some(""), Some("a much longer key than twelve bytes"), Some("id001"), None];
        let utf8 = StringArray::from(values.clone());
        for data_type in [DataType::Utf8, DataType::LargeUtf8, DataType::Utf8View] {
            let array = cast(&utf8, &data_type).expect("cast");
            let mut keys = GroupKeys::for_type(&data_type).expect("type");
            let (_, out) = ids(&mut keys, &array, 10);
            assert_eq!(out, [0, 1, 2, 0, 3], "{data_type}");
            let emitted = keys.emit(keys.len(), &data_type).expect("emit");
            let back = cast(&emitted, &DataType::Utf8).expect("cast");
            let back: Vec<Option<&str>> = back.as_string::<i32>().iter().collect();
            assert_eq!(back, [Some("id001"), Some(""), Some("a much longer key than twelve bytes"), None]);
        }
    }

    #[test]
    fn short_string_keys_that_share_cache_slots_keep_their_groups() {
        // Far more short keys than cache slots, in two orders: every key keeps its first id.
        let values: Vec<String> = (0..20_000).map(|i| format!("k{i}")).collect();
        let mut keys = GroupKeys::for_type(&DataType::Utf8).expect("utf8");
        let (_, first) = ids(&mut keys, &StringArray::from(values.clone()), usize::MAX);
        let reversed: Vec<String> = values.iter().rev().cloned().collect();
        let (_, second) = ids(&mut keys, &StringArray::from(reversed), usize::MAX);
        assert_eq!(first, (0..20_000).collect::<Vec<u32>>());
        assert_eq!(second, (0..20_000).rev().collect::<Vec<u32>>());
    }

    #[test]
    fn view_keys_inline_or_not_keep_their_groups() {
        // 20 000 keys of 10 to 14 bytes (inline up to 12), in two orders, with nulls and the
        // empty string: every key keeps its first id.
        let values: Vec<Option<String>> = (0..20_000)
            .map(|i| match i {
                0 => Some(String::new()),
                _ if i % 997 == 0 => None,
                _ => Some(format!("{:0width$}", i, width = 10 + i % 5)),
            })
            .collect();
        let array = StringViewArray::from_iter(values.iter().map(|v| v.as_deref()));
        let reversed = StringViewArray::from_iter(values.iter().rev().map(|v| v.as_deref()));
        let mut keys = GroupKeys::for_type(&DataType::Utf8View).expect("view");
        let (_, first) = ids(&mut keys, &array, usize::MAX);
        let (_, second) = ids(&mut keys, &reversed, usize::MAX);
        let mut by_value = std::collections::HashMap::new();
        for (value, id) in values.iter().zip(&first).chain(values.iter().rev().zip(&second)) {
            assert_eq!(*by_value.entry(value.clone()).or_insert(*id), *id, "{value:?}");
        }
        let distinct: std::collections::HashSet<&u32> = first.iter().collect();
        assert_eq!(distinct.len(), by_value.len());
        let emitted = keys.emit(keys.len(), &DataType::Utf8View).expect("emit");
        for (value, &id) in values.iter().zip(&first) {
            assert_eq!(emitted.as_string_view().is_null(id as usize), value.is_none());
            if let Some(v) = value {
                assert_eq!(emitted.as_string_view().value(id as usize), v);
            }
        }
    }

    #[test]
    fn a_full_mapping_keeps_the_ids_of_the_rows_before_it() {
        let mut keys = GroupKeys::for_type(&DataType::Utf8).expect("utf8");
        let batch = StringArray::from(vec![Some("a"), Some("b"), Some("a"), None, Some("c")]);
        assert_eq!(ids(&mut keys, &batch, 2), (Mapped::Full, vec![0, 1, 0]));
        // Room for one more group: the null rows get it, and keep it.
        let batch = StringArray::from(vec![None, Some("b"), None, Some("a")]);
        assert_eq!(ids(&mut keys, &batch, 3), (Mapped::Done, vec![2, 1, 2, 0]));
        assert_eq!(keys.len(), 3);
    }
}
