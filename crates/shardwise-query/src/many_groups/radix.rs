//! Each packed word's group, found one bucket of the words' hashes at a time.
//!
//! Why buckets: with millions of groups, one hash table is far larger than the caches, and each
//! probe is a miss to memory (a quarter of the node's CPU on q10 went to one such table). So the
//! rows are first cut by the top [`BUCKET_BITS`] bits of their word's hash into [`BUCKETS`]
//! buckets, each row written once, in order, with its states beside it (sequential writes to a
//! few dozen streams). After the last input batch, each bucket's groups are found with a table
//! of its own, a sixty-fourth of the size, whose probes hit the cache; a group lives in exactly
//! one bucket, so the buckets are answered one after the other. (DuckDB's hash aggregation
//! partitions by radix for the same reason.)
//!
//! A row is `2 + 1 + states` 64-bit values: the word, its hash's low 32 bits beside one null bit
//! per state column, and the states' values as bits (`Int32` states sign-extended). A bucket
//! keeps its rows in chunks that are never moved ([`Chunks`]): a bucket held in one growing
//! vector was copied by `realloc` each time it doubled (3% of a node's CPU on q10's aggregation).

use std::hash::BuildHasher;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float64Array, Int32Array, Int64Array, UInt64Array};
use datafusion::arrow::buffer::{Buffer, NullBuffer, ScalarBuffer};
use datafusion::arrow::datatypes::{DataType, Float64Type, Int32Type, Int64Type, UInt64Type};
use datafusion::error::{DataFusionError, Result};
use hashbrown::HashTable;

/// Bits of a word's hash that pick its bucket.
pub const BUCKET_BITS: u32 = 6;
/// Buckets per partition.
pub const BUCKETS: usize = 1 << BUCKET_BITS;
/// Most state columns a row carries (one null bit each in the row's 32 high meta bits).
pub const STATE_COLUMNS_MAX: usize = 32;
/// Rows in a bucket's first chunk; each next chunk holds twice as many, up to
/// [`CHUNK_ROWS_MAX`].
const CHUNK_ROWS_MIN: usize = 256;
/// Rows in a bucket's largest chunks (a few hundred KiB each).
const CHUNK_ROWS_MAX: usize = 16 * 1024;
/// A fixed seed: groups do not depend on it, only the tables' layout does.
const HASH_SEED: u64 = 0x6d61_6e79_5f67_7270;
/// Values before a row's states: the word's two halves and the meta value.
const HEAD: usize = 3;

/// The types of state column a row carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StateType {
    Int64,
    UInt64,
    Float64,
    Int32,
}

impl StateType {
    fn of(data_type: &DataType) -> Option<Self> {
        Some(match data_type {
            DataType::Int64 => StateType::Int64,
            DataType::UInt64 => StateType::UInt64,
            DataType::Float64 => StateType::Float64,
            DataType::Int32 => StateType::Int32,
            _ => return None,
        })
    }
}

/// The rows of one partition, cut into buckets. See the module doc.
#[derive(Debug)]
pub struct Buckets {
    types: Vec<StateType>,
    stride: usize,
    rows: Vec<Chunks>,
    hasher: foldhash::fast::FixedState,
    /// Scratch for one batch: each state column's values as bits.
    values: Vec<Vec<u64>>,
    /// Scratch for [`Buckets::take`]: one bucket's group table, kept (emptied) for the next
    /// bucket so that each bucket does not fault in fresh memory for a table of its own.
    table: HashTable<(u32, u32)>,
}

/// One bucket's groups: each group's word (by group id), each row's group, and the rows' states
/// (one array per state column, of the input's types).
#[derive(Debug)]
pub struct Bucket {
    pub words: Vec<u128>,
    pub ids: Vec<u32>,
    pub states: Vec<ArrayRef>,
}

/// The table hash for a word's 32-bit hash: the same bits twice, so that both hashbrown's bucket
/// (low bits) and tag (top 7 bits) come from the stored 32 bits and a rehash needs no word.
#[inline]
fn table_hash(h32: u32) -> u64 {
    (u64::from(h32) << 32) | u64::from(h32)
}

impl Buckets {
    /// Buckets for rows with states of these types, if each is one a row carries and there are
    /// at most [`STATE_COLUMNS_MAX`].
    pub fn new(state_types: &[DataType]) -> Option<Self> {
        if state_types.len() > STATE_COLUMNS_MAX {
            return None;
        }
        let types = state_types.iter().map(StateType::of).collect::<Option<Vec<_>>>()?;
        Some(Buckets {
            stride: HEAD + types.len(),
            values: vec![Vec::new(); types.len()],
            types,
            rows: (0..BUCKETS).map(|_| Chunks::default()).collect(),
            hasher: foldhash::fast::FixedState::with_seed(HASH_SEED),
            table: HashTable::new(),
        })
    }

    /// Bytes held.
    pub fn size(&self) -> usize {
        let rows: usize = self.rows.iter().map(|b| b.capacity() * 8).sum();
        rows + self.table.allocation_size() + self.values.iter().map(|v| v.capacity() * 8).sum::<usize>()
    }

    /// Rows held in bucket `bucket`.
    pub fn rows(&self, bucket: usize) -> usize {
        self.rows.get(bucket).map_or(0, |b| b.len() / self.stride)
    }

    /// Adds a batch's rows: `words` (one per row) and `states` (one array per state column).
    pub fn push(&mut self, words: &[u128], states: &[ArrayRef]) -> Result<()> {
        if states.len() != self.types.len() || states.iter().any(|s| s.len() != words.len()) {
            return Err(DataFusionError::Internal("many-group aggregation: a batch's states do not fit".into()));
        }
        for ((out, state), &state_type) in self.values.iter_mut().zip(states).zip(&self.types) {
            bits_of(state, state_type, out)?;
        }
        let nulls: Vec<(usize, &NullBuffer)> = states
            .iter()
            .enumerate()
            .filter_map(|(c, s)| s.nulls().filter(|n| n.null_count() > 0).map(|n| (c, n)))
            .collect();
        let Buckets { rows, hasher, values, stride, .. } = self;
        for (row, &word) in words.iter().enumerate() {
            let hash = hasher.hash_one(word);
            let bucket = rows[(hash >> (64 - BUCKET_BITS)) as usize].room_for(*stride);
            let mut null_bits = 0u64;
            for &(c, n) in &nulls {
                null_bits |= u64::from(n.is_null(row)) << c;
            }
            bucket.extend_from_slice(&[word as u64, (word >> 64) as u64, (hash as u32 as u64) | (null_bits << 32)]);
            bucket.extend(values.iter().map(|v| v[row]));
        }
        Ok(())
    }

    /// Takes bucket `bucket`'s rows (the bucket is then empty) and finds their groups.
    pub fn take(&mut self, bucket: usize) -> Result<Bucket> {
        let rows = self.rows.get_mut(bucket).map(std::mem::take).unwrap_or_default();
        let count = rows.len() / self.stride;
        let table = &mut self.table;
        table.clear();
        table.reserve(count, |&(_, h)| table_hash(h));
        // At most one group per row: sized once, never moved while it fills (for the length of
        // this call it may hold more than the groups need, at 16 bytes a row against the 8 bytes
        // a value of the bucket's rows being read).
        let mut words: Vec<u128> = Vec::with_capacity(count);
        let mut ids = Vec::with_capacity(count);
        let mut values: Vec<Vec<u64>> = self.types.iter().map(|_| Vec::with_capacity(count)).collect();
        let mut any_null = 0u64;
        for row in rows.rows(self.stride) {
            let word = u128::from(row[0]) | (u128::from(row[1]) << 64);
            let h32 = row[2] as u32;
            any_null |= row[2] >> 32;
            let found = table.find(table_hash(h32), |&(g, h)| h == h32 && words[g as usize] == word);
            let group = match found {
                Some(&(group, _)) => group,
                None => {
                    let group = u32::try_from(words.len()).map_err(|_| {
                        DataFusionError::Internal("many-group aggregation: more than 2^32 groups in a bucket".into())
                    })?;
                    words.push(word);
                    table.insert_unique(table_hash(h32), (group, h32), |&(_, h)| table_hash(h));
                    group
                }
            };
            ids.push(group);
            for (out, &v) in values.iter_mut().zip(&row[HEAD..]) {
                out.push(v);
            }
        }
        let states = values
            .into_iter()
            .zip(&self.types)
            .enumerate()
            .map(|(c, (bits, &state_type))| {
                let nulls = (any_null >> c & 1 == 1)
                    .then(|| NullBuffer::from_iter(rows.rows(self.stride).map(|row| (row[2] >> (32 + c)) & 1 == 0)));
                array_of(bits, state_type, nulls)
            })
            .collect();
        Ok(Bucket { words, ids, states })
    }
}

/// One bucket's rows: vectors that are filled and never grown past the capacity they were
/// made with, each next one twice the size of the last (up to [`CHUNK_ROWS_MAX`] rows), so that
/// no row is ever copied to make room.
#[derive(Debug, Default)]
struct Chunks {
    chunks: Vec<Vec<u64>>,
    /// Values held in all chunks.
    len: usize,
}

impl Chunks {
    /// The chunk with room for one more row of `stride` values (a new one if the last is full),
    /// counted as held: the caller pushes exactly `stride` values into it.
    #[inline]
    fn room_for(&mut self, stride: usize) -> &mut Vec<u64> {
        self.len += stride;
        let full = self.chunks.last().is_none_or(|c| c.len() + stride > c.capacity());
        if full {
            let rows = self.chunks.last().map_or(CHUNK_ROWS_MIN, |c| (c.capacity() / stride * 2).min(CHUNK_ROWS_MAX));
            self.chunks.push(Vec::with_capacity(rows.max(1) * stride));
        }
        let last = self.chunks.len() - 1;
        &mut self.chunks[last]
    }

    fn len(&self) -> usize {
        self.len
    }

    fn capacity(&self) -> usize {
        self.chunks.iter().map(Vec::capacity).sum()
    }

    /// Every row, in the order pushed.
    fn rows(&self, stride: usize) -> impl Iterator<Item = &[u64]> {
        self.chunks.iter().flat_map(move |c| c.chunks_exact(stride))
    }
}

/// `array`'s values as 64-bit patterns, into `out` (cleared first).
fn bits_of(array: &ArrayRef, state_type: StateType, out: &mut Vec<u64>) -> Result<()> {
    let wrong =
        || DataFusionError::Internal(format!("many-group aggregation: a state of type {} changed", array.data_type()));
    out.clear();
    match state_type {
        StateType::Int64 => {
            out.extend(array.as_primitive_opt::<Int64Type>().ok_or_else(wrong)?.values().iter().map(|&v| v as u64))
        }
        StateType::UInt64 => out.extend_from_slice(array.as_primitive_opt::<UInt64Type>().ok_or_else(wrong)?.values()),
        StateType::Float64 => {
            out.extend(array.as_primitive_opt::<Float64Type>().ok_or_else(wrong)?.values().iter().map(|v| v.to_bits()))
        }
        StateType::Int32 => out.extend(
            array.as_primitive_opt::<Int32Type>().ok_or_else(wrong)?.values().iter().map(|&v| i64::from(v) as u64),
        ),
    }
    Ok(())
}

/// The array of `state_type` whose values' bits are `bits`.
fn array_of(bits: Vec<u64>, state_type: StateType, nulls: Option<NullBuffer>) -> ArrayRef {
    let len = bits.len();
    match state_type {
        StateType::Int32 => Arc::new(Int32Array::new(bits.iter().map(|&v| v as i64 as i32).collect(), nulls)),
        // The same 64-bit patterns, read as the state's type.
        StateType::Int64 => Arc::new(Int64Array::new(ScalarBuffer::new(Buffer::from_vec(bits), 0, len), nulls)),
        StateType::UInt64 => Arc::new(UInt64Array::new(ScalarBuffer::new(Buffer::from_vec(bits), 0, len), nulls)),
        StateType::Float64 => Arc::new(Float64Array::new(ScalarBuffer::new(Buffer::from_vec(bits), 0, len), nulls)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_keep_their_states_and_equal_words_share_a_group() {
        let mut buckets =
            Buckets::new(&[DataType::Int64, DataType::Float64, DataType::Int32, DataType::UInt64]).expect("types");
        let words: Vec<u128> = (0..5000u128).map(|i| (i % 1500) << 70 | (i % 1500)).collect();
        let states: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from_iter((0..5000).map(|i| (i % 3 != 0).then_some(-i)))),
            Arc::new(Float64Array::from_iter_values((0..5000).map(|i| i as f64 / 4.0))),
            Arc::new(Int32Array::from_iter((0..5000).map(|i: i32| (i % 7 != 0).then_some(i - 2500)))),
            Arc::new(UInt64Array::from_iter_values((0..5000).map(|i| u64::MAX - i))),
        ];
        buckets.push(&words[..2000], &states.iter().map(|s| s.slice(0, 2000)).collect::<Vec<_>>()).expect("push");
        buckets.push(&words[2000..], &states.iter().map(|s| s.slice(2000, 3000)).collect::<Vec<_>>()).expect("push");
        // Every row comes back once, with its word's group and its own states.
        let mut seen = std::collections::HashMap::new();
        let mut rows = 0;
        for b in 0..BUCKETS {
            let bucket = buckets.take(b).expect("take");
            for (row, &group) in bucket.ids.iter().enumerate() {
                let word = bucket.words[group as usize];
                let i = bucket.states[3].as_primitive::<UInt64Type>().value(row);
                let i = u64::MAX - i;
                assert_eq!(word, words[i as usize]);
                assert_eq!(*seen.entry(word).or_insert((b, group)), (b, group));
                let int = bucket.states[0].as_primitive::<Int64Type>();
                assert_eq!(int.is_valid(row), i % 3 != 0);
                if int.is_valid(row) {
                    assert_eq!(int.value(row), -(i as i64));
                }
                assert_eq!(bucket.states[1].as_primitive::<Float64Type>().value(row), i as f64 / 4.0);
                let narrow = bucket.states[2].as_primitive::<Int32Type>();
                assert_eq!(narrow.is_valid(row), i % 7 != 0);
                if narrow.is_valid(row) {
                    assert_eq!(narrow.value(row), i as i32 - 2500);
                }
                rows += 1;
            }
            assert!(buckets.take(b).expect("again").ids.is_empty());
        }
        assert_eq!((rows, seen.len()), (5000, 1500));
        assert!(Buckets::new(&[DataType::Utf8]).is_none());
    }

    #[test]
    fn a_bucket_grows_by_new_chunks_without_moving_its_rows() {
        let stride = 5;
        let mut chunks = Chunks::default();
        let total = 3 * CHUNK_ROWS_MAX + 7;
        let mut first_chunk_at = None;
        for i in 0..total as u64 {
            chunks.room_for(stride).extend((0..stride as u64).map(|v| i * 10 + v));
            // The first chunk stays where it was made: it is never grown by a reallocation.
            let at = chunks.chunks[0].as_ptr();
            assert_eq!(*first_chunk_at.get_or_insert(at), at);
        }
        assert_eq!(chunks.len(), total * stride);
        let sizes: Vec<usize> = chunks.chunks.iter().map(|c| c.capacity() / stride).collect();
        assert_eq!(sizes[..3], [CHUNK_ROWS_MIN, 2 * CHUNK_ROWS_MIN, 4 * CHUNK_ROWS_MIN]);
        assert!(sizes.iter().all(|&rows| rows <= CHUNK_ROWS_MAX), "{sizes:?}");
        assert!(chunks.chunks.iter().all(|c| c.len() % stride == 0 && c.len() <= c.capacity()));
        let rows: Vec<&[u64]> = chunks.rows(stride).collect();
        assert_eq!(rows.len(), total);
        assert!(rows.iter().enumerate().all(|(i, row)| row[0] == i as u64 * 10 && row[4] == i as u64 * 10 + 4));
    }
}
