//! One 128-bit word per row for two to [`KEYS_MAX`] GROUP BY keys with many combinations
//! (db-benchmark's q10: six keys, nearly every row its own group).
//!
//! Each key column maps its values to dense ids of its own (the small-group mapping,
//! [`GroupKeys`]: a direct window for integers, a short-key cache and a hash table for strings),
//! and a row's ids are packed into one 128-bit word, `128 / keys` bits per key (32 at most): two
//! rows have the same keys exactly when they have the same word. The words' groups are found by
//! [`super::radix`].
//!
//! A key with more values than its bits can number stops the packing with [`Mapped::Full`]; the
//! operator then hands over to DataFusion's aggregation.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, UInt32Array};
use datafusion::arrow::compute::take;
use datafusion::arrow::datatypes::DataType;
use datafusion::error::{DataFusionError, Result};

use crate::small_groups::keys::{GroupKeys, Mapped};

/// Fewest keys this mapping takes (one key's dense id is its group: DataFusion's single-column
/// tables already do that well).
pub const KEYS_MIN: usize = 2;
/// Most keys: each gets `128 / keys` bits, so 16 bits (65 536 values) at eight keys.
pub const KEYS_MAX: usize = 8;
/// Most bits one key's ids take (its ids are `u32`).
const BITS_MAX: u32 = 32;

/// The packing of all the GROUP BY keys of one aggregation. See the module doc.
#[derive(Debug)]
pub struct PackedKeys {
    columns: Vec<GroupKeys>,
    /// Bits per key in a packed word.
    bits: u32,
    /// Scratch for one batch: each key's ids.
    column_ids: Vec<Vec<u32>>,
}

impl PackedKeys {
    /// A mapping for keys of these types, if there are [`KEYS_MIN`] to [`KEYS_MAX`] of them
    /// and [`GroupKeys::for_type`] takes each.
    pub fn for_types(types: &[DataType]) -> Option<Self> {
        if !(KEYS_MIN..=KEYS_MAX).contains(&types.len()) {
            return None;
        }
        let columns = types.iter().map(GroupKeys::for_type).collect::<Option<Vec<_>>>()?;
        let bits = (128 / types.len() as u32).min(BITS_MAX);
        Some(PackedKeys { columns, bits, column_ids: vec![Vec::new(); types.len()] })
    }

    /// Bytes held.
    pub fn size(&self) -> usize {
        let columns: usize = self.columns.iter().map(GroupKeys::size).sum();
        columns + self.column_ids.iter().map(|ids| ids.capacity() * 4).sum::<usize>()
    }

    /// Most ids one key's bits number.
    fn ids_per_key(&self) -> usize {
        match self.bits {
            BITS_MAX => u32::MAX as usize,
            bits => 1usize << bits,
        }
    }

    /// Fills `words` (cleared first) with each row's packed word; `keys` holds one array per
    /// key, in order. Stops with [`Mapped::Full`] (and `words` incomplete) when a key has more
    /// values than its bits number.
    pub fn pack(&mut self, keys: &[ArrayRef], words: &mut Vec<u128>) -> Result<Mapped> {
        if keys.len() != self.columns.len() {
            return Err(DataFusionError::Internal(format!(
                "many-group aggregation: {} key arrays for {} keys",
                keys.len(),
                self.columns.len()
            )));
        }
        words.clear();
        let rows = keys.first().map_or(0, |k| k.len());
        let per_key = self.ids_per_key();
        for ((column, key), out) in self.columns.iter_mut().zip(keys).zip(&mut self.column_ids) {
            if column.map(key.as_ref(), per_key, out)? == Mapped::Full {
                return Ok(Mapped::Full);
            }
        }
        // One key at a time (a loop the compiler vectorises).
        words.resize(rows, 0);
        for (k, column_ids) in self.column_ids.iter().enumerate() {
            let shift = self.bits * k as u32;
            for (word, &id) in words.iter_mut().zip(column_ids) {
                *word |= u128::from(id) << shift;
            }
        }
        Ok(Mapped::Done)
    }

    /// Each key's values by id, as arrays of the given types (the key columns'): what
    /// [`PackedKeys::emit`] takes from.
    pub fn dictionaries(&self, types: &[DataType]) -> Result<Vec<ArrayRef>> {
        self.columns.iter().zip(types).map(|(column, data_type)| column.emit(column.len(), data_type)).collect()
    }

    /// The keys of the groups whose words are `words`, one array per key, taken from
    /// `dictionaries`.
    pub fn emit(&self, words: &[u128], dictionaries: &[ArrayRef]) -> Result<Vec<ArrayRef>> {
        let mask = match self.bits {
            BITS_MAX => u128::from(u32::MAX),
            bits => (1u128 << bits) - 1,
        };
        dictionaries
            .iter()
            .enumerate()
            .map(|(k, dictionary)| {
                let shift = self.bits * k as u32;
                let ids = UInt32Array::from_iter_values(words.iter().map(|w| ((w >> shift) & mask) as u32));
                let keys = take(dictionary.as_ref(), &ids, None)?;
                // Views taken from a dictionary point into all of its buffers; keep only theirs,
                // so that a batch does not carry (or encode) every key's bytes.
                Ok(match keys.data_type() {
                    DataType::Utf8View if !keys.as_string_view().data_buffers().is_empty() => {
                        Arc::new(keys.as_string_view().gc()) as ArrayRef
                    }
                    _ => keys,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringArray, StringViewArray};

    fn arrays(ints: &[Option<i64>], strings: &[Option<&str>]) -> Vec<ArrayRef> {
        vec![Arc::new(Int64Array::from(ints.to_vec())), Arc::new(StringArray::from(strings.to_vec()))]
    }

    #[test]
    fn equal_key_tuples_pack_alike_and_emit_back() {
        let mut keys = PackedKeys::for_types(&[DataType::Int64, DataType::Utf8]).expect("types");
        let mut words = Vec::new();
        let batch =
            arrays(&[Some(1), Some(1), None, Some(2), None], &[Some("a"), Some("b"), Some("a"), None, Some("a")]);
        assert_eq!(keys.pack(&batch, &mut words).expect("pack"), Mapped::Done);
        let first = words.clone();
        assert_eq!(first[2], first[4]);
        let distinct: std::collections::HashSet<u128> = first.iter().copied().collect();
        assert_eq!(distinct.len(), 4);
        let batch = arrays(&[Some(2), Some(1), Some(3)], &[None, Some("b"), Some("a")]);
        assert_eq!(keys.pack(&batch, &mut words).expect("pack"), Mapped::Done);
        assert_eq!((words[0], words[1]), (first[3], first[1]));
        let dictionaries = keys.dictionaries(&[DataType::Int64, DataType::Utf8]).expect("dictionaries");
        let emitted = keys.emit(&[first[1], first[2], first[3], words[2]], &dictionaries).expect("emit");
        let ints: Vec<Option<i64>> =
            emitted[0].as_primitive::<datafusion::arrow::datatypes::Int64Type>().iter().collect();
        let strings: Vec<Option<&str>> = emitted[1].as_string::<i32>().iter().collect();
        assert_eq!(ints, [Some(1), None, Some(2), Some(3)]);
        assert_eq!(strings, [Some("b"), Some("a"), None, Some("a")]);
    }

    #[test]
    fn packing_stops_at_a_key_past_its_bits() {
        // Eight keys get 16 bits each: a key with 65 537 values does not fit.
        let types = vec![DataType::Int64; KEYS_MAX];
        let mut keys = PackedKeys::for_types(&types).expect("types");
        let mut words = Vec::new();
        let wide: ArrayRef = Arc::new(Int64Array::from_iter_values(0..(1 << 16) + 1));
        let narrow: ArrayRef = Arc::new(Int64Array::from_iter_values(std::iter::repeat_n(7, (1 << 16) + 1)));
        let mut batch = vec![Arc::clone(&wide)];
        batch.extend(std::iter::repeat_n(Arc::clone(&narrow), KEYS_MAX - 1));
        assert_eq!(keys.pack(&batch, &mut words).expect("pack"), Mapped::Full);
        // Seven keys get 18 bits: it fits.
        let mut keys = PackedKeys::for_types(&types[1..]).expect("types");
        assert_eq!(keys.pack(&batch[1..], &mut words).expect("pack"), Mapped::Done);
        assert!(PackedKeys::for_types(&[DataType::Int64]).is_none());
        assert!(PackedKeys::for_types(&vec![DataType::Int64; KEYS_MAX + 1]).is_none());
        assert!(PackedKeys::for_types(&[DataType::Int64, DataType::Float64]).is_none());
    }

    #[test]
    fn emitted_views_keep_only_their_own_bytes() {
        let long: Vec<String> = (0..1000).map(|i| format!("a key longer than twelve bytes {i}")).collect();
        let views: ArrayRef = Arc::new(StringViewArray::from_iter_values(long.iter()));
        let ints: ArrayRef = Arc::new(Int64Array::from_iter_values(0..1000));
        let mut keys = PackedKeys::for_types(&[DataType::Utf8View, DataType::Int64]).expect("types");
        let mut words = Vec::new();
        keys.pack(&[views, ints], &mut words).expect("pack");
        let dictionaries = keys.dictionaries(&[DataType::Utf8View, DataType::Int64]).expect("dictionaries");
        let emitted = keys.emit(&words[10..12], &dictionaries).expect("emit");
        let view = emitted[0].as_string_view();
        assert_eq!(view.iter().collect::<Vec<_>>(), [Some(long[10].as_str()), Some(long[11].as_str())]);
        let held: usize = view.data_buffers().iter().map(|b| b.len()).sum();
        assert!(held < 100, "{held} bytes for two keys");
    }
}
