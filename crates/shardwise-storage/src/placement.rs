//! Placement: which shard a row belongs to. This module is the specification users and other
//! tools rely on, so the function it describes must never change silently: data already on disk
//! was placed by it, and a query that trusts placement (no-merge `GROUP BY` on the shard key)
//! gives wrong answers if two nodes or two versions disagree.
//!
//! A table records the [`PlacementVersion`] it was created with. A future version may define a
//! different function under a new name; a table keeps the one it recorded, so upgrading shardwise
//! never moves data.
//!
//! # Placement function `xxhash64-v1`
//!
//! A row goes to shard `xxh64(key_bytes, seed = 0) mod shards`, computed as unsigned 64-bit
//! integers (`shards >= 1`). `xxh64` is xxHash64 as specified at
//! <https://github.com/Cyan4973/xxHash/blob/dev/doc/xxhash_spec.md>, with seed 0. It does not
//! depend on the machine, the OS, its endianness, the process or the shardwise version.
//!
//! `key_bytes` is the concatenation, for each shard key column in the order the table's
//! `shard_key` lists them, of:
//!
//! | value | bytes |
//! | --- | --- |
//! | NULL (any type) | `0x00` |
//! | non-NULL | `0x01`, then the value's encoding below |
//!
//! | column type | encoding of a value |
//! | --- | --- |
//! | `Int8`, `Int16`, `Int32`, `Int64` | sign-extended to `i64`, 8 bytes little-endian |
//! | `UInt8`, `UInt16`, `UInt32`, `UInt64` | zero-extended to `u64`, 8 bytes little-endian |
//! | `Float32`, `Float64` | converted to `f64` (exact); `-0.0` becomes `0.0` and every NaN becomes `0x7FF8_0000_0000_0000`; then the IEEE 754 bits, 8 bytes little-endian |
//! | `Decimal128(p, s)` | the unscaled `i128`, 16 bytes little-endian, then `s` as one byte (two's complement); `p` is not encoded |
//! | `Boolean` | one byte: `0x00` false, `0x01` true |
//! | `Utf8` (also `LargeUtf8`, `Utf8View`) | byte length as `u32`, 4 bytes little-endian, then the UTF-8 bytes |
//! | `Date32` | days since 1970-01-01, sign-extended to `i64`, 8 bytes little-endian |
//! | `Timestamp(unit, tz)` | the stored `i64`, 8 bytes little-endian, then one unit byte: `0` second, `1` millisecond, `2` microsecond, `3` nanosecond; the time zone is not encoded (the stored value is a UTC instant) |
//!
//! Consequences worth knowing:
//! - widening an integer column keeps placement: `Int32 5` and `Int64 5` (and `UInt8 5`) give the
//!   same bytes; so do `Float32 1.5` and `Float64 1.5`;
//! - the type itself is not encoded, so `Int64 -1` and `UInt64 18446744073709551615` collide, as do
//!   `Int64 5` and `Date32 5`; a key column has a single type, so this never mixes two tables' rows;
//! - `Decimal128` `1.0` (unscaled 10, scale 1) and `1.00` (unscaled 100, scale 2) place differently,
//!   and so do the same instant as `Timestamp(Second)` and `Timestamp(Millisecond)`: a key column's
//!   scale and unit must not change after the table has data;
//! - a row whose key is all NULL still has a shard (the bytes are one `0x00` per column).
//!
//! Example: a one-column `Int64` (or `Int32`...) key with value 42 has `key_bytes` =
//! `01 2a 00 00 00 00 00 00 00`, whose `xxh64` is `0xee53_6f90_35b7_1091`, so with 16 shards the
//! row goes to shard `0xee53_6f90_35b7_1091 mod 16 = 1`. More such golden values are pinned in
//! this module's tests, which fail if the function ever changes.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, LargeStringArray, RecordBatch, StringArray, StringViewArray, UInt32Array,
};
use arrow::buffer::NullBuffer;
use arrow::datatypes::{
    DataType, Date32Type, Decimal128Type, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type,
    TimeUnit, TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType, TimestampSecondType,
    UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use serde::{Deserialize, Serialize};
use twox_hash::XxHash64;

use crate::error::StorageError;

/// The seed of the `xxhash64-v1` placement hash.
pub const PLACEMENT_SEED_V1: u64 = 0;

/// The bits every NaN is replaced with before hashing (the usual quiet NaN).
const CANONICAL_NAN_BITS: u64 = 0x7FF8_0000_0000_0000;

const TAG_NULL: u8 = 0;
const TAG_VALUE: u8 = 1;

/// The placement functions shardwise knows, recorded with every table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PlacementVersion {
    /// xxHash64 (seed 0) over the canonical key encoding described in this module's docs.
    #[serde(rename = "xxhash64-v1")]
    XxHash64V1,
}

impl PlacementVersion {
    /// The placement function new tables get.
    pub const CURRENT: PlacementVersion = PlacementVersion::XxHash64V1;

    /// Every placement version, for error messages.
    const ACCEPTED: &'static str = "xxhash64-v1";

    /// The name recorded in the catalog.
    pub fn as_str(self) -> &'static str {
        match self {
            PlacementVersion::XxHash64V1 => "xxhash64-v1",
        }
    }

    /// The shard of every row of `batch` under this placement function.
    pub fn shard_of_rows(
        self,
        batch: &RecordBatch,
        key_columns: &[usize],
        shards: u32,
    ) -> Result<Vec<u32>, StorageError> {
        match self {
            PlacementVersion::XxHash64V1 => shard_of_rows(batch, key_columns, shards),
        }
    }

    /// `batch` split by shard under this placement function; see [`split_by_shard`].
    pub fn split_by_shard(
        self,
        batch: &RecordBatch,
        key_columns: &[usize],
        shards: u32,
    ) -> Result<Vec<(u32, RecordBatch)>, StorageError> {
        match self {
            PlacementVersion::XxHash64V1 => split_by_shard(batch, key_columns, shards),
        }
    }
}

impl fmt::Display for PlacementVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PlacementVersion {
    type Err = StorageError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim().eq_ignore_ascii_case("xxhash64-v1") {
            Ok(PlacementVersion::XxHash64V1)
        } else {
            Err(StorageError::InvalidOption {
                name: "placement",
                value: s.to_string(),
                expected: format!("one of: {}", Self::ACCEPTED),
            })
        }
    }
}

/// The `xxhash64-v1` hash of every row's shard key, in row order.
///
/// `key_columns` are indices into `batch`'s columns, in shard key order, and must not be empty.
pub fn hash_rows(batch: &RecordBatch, key_columns: &[usize]) -> Result<Vec<u64>, StorageError> {
    let readers = key_readers(batch, key_columns)?;
    let mut buf = Vec::with_capacity(16 * readers.len());
    let mut hashes = Vec::with_capacity(batch.num_rows());
    for row in 0..batch.num_rows() {
        buf.clear();
        for reader in &readers {
            reader.encode(row, &mut buf)?;
        }
        hashes.push(XxHash64::oneshot(PLACEMENT_SEED_V1, &buf));
    }
    Ok(hashes)
}

/// The shard (`0..shards`) of every row of `batch`, in row order, under `xxhash64-v1`.
///
/// `key_columns` are indices into `batch`'s columns, in shard key order.
pub fn shard_of_rows(batch: &RecordBatch, key_columns: &[usize], shards: u32) -> Result<Vec<u32>, StorageError> {
    check_shards(shards)?;
    let hashes = hash_rows(batch, key_columns)?;
    Ok(hashes.into_iter().map(|h| shard_of_hash(h, shards)).collect())
}

/// Splits `batch` into one batch per shard that has rows, in ascending shard order. Within a
/// piece, rows keep their order in `batch`. Every row is in exactly one piece.
pub fn split_by_shard(
    batch: &RecordBatch,
    key_columns: &[usize],
    shards: u32,
) -> Result<Vec<(u32, RecordBatch)>, StorageError> {
    let row_shards = shard_of_rows(batch, key_columns, shards)?;
    let mut rows_by_shard: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (row, shard) in row_shards.iter().enumerate() {
        let row = u32::try_from(row).map_err(|_| StorageError::InvalidOption {
            name: "batch rows",
            value: batch.num_rows().to_string(),
            expected: format!("at most {} rows in one batch", u32::MAX),
        })?;
        rows_by_shard.entry(*shard).or_default().push(row);
    }
    if rows_by_shard.len() == 1 {
        // Everything goes to one shard: no copy needed.
        return Ok(rows_by_shard.into_keys().map(|shard| (shard, batch.clone())).collect());
    }
    rows_by_shard
        .into_iter()
        .map(|(shard, rows)| {
            let indices = UInt32Array::from(rows);
            let piece = arrow::compute::take_record_batch(batch, &indices)
                .map_err(|source| StorageError::Arrow { op: "split batch by shard (take)", source })?;
            Ok((shard, piece))
        })
        .collect()
}

fn check_shards(shards: u32) -> Result<(), StorageError> {
    if shards == 0 {
        return Err(StorageError::InvalidOption {
            name: "shards",
            value: "0".to_string(),
            expected: "at least 1".to_string(),
        });
    }
    Ok(())
}

fn shard_of_hash(hash: u64, shards: u32) -> u32 {
    // The remainder is below `shards`, so it always fits a u32.
    (hash % u64::from(shards)) as u32
}

/// One key column, downcast once so the per-row loop does not dispatch on the data type.
struct KeyReader<'a> {
    nulls: Option<&'a NullBuffer>,
    values: KeyValues<'a>,
}

enum KeyValues<'a> {
    I8(&'a [i8]),
    I16(&'a [i16]),
    I32(&'a [i32]),
    I64(&'a [i64]),
    U8(&'a [u8]),
    U16(&'a [u16]),
    U32(&'a [u32]),
    U64(&'a [u64]),
    F32(&'a [f32]),
    F64(&'a [f64]),
    Decimal128 { values: &'a [i128], scale: i8 },
    Boolean(&'a BooleanArray),
    Utf8(&'a StringArray),
    LargeUtf8(&'a LargeStringArray),
    Utf8View(&'a StringViewArray),
    Date32(&'a [i32]),
    Timestamp { values: &'a [i64], unit: u8 },
}

fn key_readers<'a>(batch: &'a RecordBatch, key_columns: &[usize]) -> Result<Vec<KeyReader<'a>>, StorageError> {
    if key_columns.is_empty() {
        return Err(StorageError::InvalidOption {
            name: "key_columns",
            value: "[]".to_string(),
            expected: "at least one shard key column".to_string(),
        });
    }
    let schema = batch.schema_ref();
    key_columns
        .iter()
        .map(|&index| {
            let array = batch
                .columns()
                .get(index)
                .ok_or(StorageError::KeyColumnOutOfRange { index, num_columns: batch.num_columns() })?;
            let name = schema.field(index).name();
            key_reader(name, array)
        })
        .collect()
}

fn key_reader<'a>(name: &str, array: &'a ArrayRef) -> Result<KeyReader<'a>, StorageError> {
    let values = match array.data_type() {
        DataType::Int8 => KeyValues::I8(array.as_primitive::<Int8Type>().values()),
        DataType::Int16 => KeyValues::I16(array.as_primitive::<Int16Type>().values()),
        DataType::Int32 => KeyValues::I32(array.as_primitive::<Int32Type>().values()),
        DataType::Int64 => KeyValues::I64(array.as_primitive::<Int64Type>().values()),
        DataType::UInt8 => KeyValues::U8(array.as_primitive::<UInt8Type>().values()),
        DataType::UInt16 => KeyValues::U16(array.as_primitive::<UInt16Type>().values()),
        DataType::UInt32 => KeyValues::U32(array.as_primitive::<UInt32Type>().values()),
        DataType::UInt64 => KeyValues::U64(array.as_primitive::<UInt64Type>().values()),
        DataType::Float32 => KeyValues::F32(array.as_primitive::<Float32Type>().values()),
        DataType::Float64 => KeyValues::F64(array.as_primitive::<Float64Type>().values()),
        DataType::Decimal128(_, scale) => {
            KeyValues::Decimal128 { values: array.as_primitive::<Decimal128Type>().values(), scale: *scale }
        }
        DataType::Boolean => KeyValues::Boolean(array.as_boolean()),
        DataType::Utf8 => KeyValues::Utf8(array.as_string::<i32>()),
        DataType::LargeUtf8 => KeyValues::LargeUtf8(array.as_string::<i64>()),
        DataType::Utf8View => KeyValues::Utf8View(array.as_string_view()),
        DataType::Date32 => KeyValues::Date32(array.as_primitive::<Date32Type>().values()),
        DataType::Timestamp(unit, _) => {
            let values: &[i64] = match unit {
                TimeUnit::Second => array.as_primitive::<TimestampSecondType>().values(),
                TimeUnit::Millisecond => array.as_primitive::<TimestampMillisecondType>().values(),
                TimeUnit::Microsecond => array.as_primitive::<TimestampMicrosecondType>().values(),
                TimeUnit::Nanosecond => array.as_primitive::<TimestampNanosecondType>().values(),
            };
            KeyValues::Timestamp { values, unit: time_unit_byte(*unit) }
        }
        other => {
            return Err(StorageError::UnsupportedColumnType {
                column: name.to_string(),
                data_type: other.to_string(),
                supported: PLACEMENT_SUPPORTED_TYPES,
            });
        }
    };
    Ok(KeyReader { nulls: array.nulls(), values })
}

/// The types a shard key column may have, for error messages.
const PLACEMENT_SUPPORTED_TYPES: &str = "Int8, Int16, Int32, Int64, UInt8, UInt16, UInt32, UInt64, Float32, Float64, \
     Decimal128, Boolean, Utf8 (also LargeUtf8, Utf8View), Date32, Timestamp";

fn time_unit_byte(unit: TimeUnit) -> u8 {
    match unit {
        TimeUnit::Second => 0,
        TimeUnit::Millisecond => 1,
        TimeUnit::Microsecond => 2,
        TimeUnit::Nanosecond => 3,
    }
}

fn encode_f64(value: f64, buf: &mut Vec<u8>) {
    let bits = if value.is_nan() {
        CANONICAL_NAN_BITS
    } else if value == 0.0 {
        // Both +0.0 and -0.0.
        0
    } else {
        value.to_bits()
    };
    buf.extend_from_slice(&bits.to_le_bytes());
}

fn encode_str(value: &str, buf: &mut Vec<u8>) -> Result<(), StorageError> {
    let len = u32::try_from(value.len()).map_err(|_| StorageError::InvalidOption {
        name: "shard key string length",
        value: value.len().to_string(),
        expected: format!("at most {} bytes", u32::MAX),
    })?;
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(value.as_bytes());
    Ok(())
}

impl KeyReader<'_> {
    /// Appends row `row`'s encoding (tag and value) to `buf`.
    fn encode(&self, row: usize, buf: &mut Vec<u8>) -> Result<(), StorageError> {
        if self.nulls.is_some_and(|nulls| nulls.is_null(row)) {
            buf.push(TAG_NULL);
            return Ok(());
        }
        buf.push(TAG_VALUE);
        match &self.values {
            KeyValues::I8(v) => buf.extend_from_slice(&i64::from(v[row]).to_le_bytes()),
            KeyValues::I16(v) => buf.extend_from_slice(&i64::from(v[row]).to_le_bytes()),
            KeyValues::I32(v) => buf.extend_from_slice(&i64::from(v[row]).to_le_bytes()),
            KeyValues::I64(v) => buf.extend_from_slice(&v[row].to_le_bytes()),
            KeyValues::U8(v) => buf.extend_from_slice(&u64::from(v[row]).to_le_bytes()),
            KeyValues::U16(v) => buf.extend_from_slice(&u64::from(v[row]).to_le_bytes()),
            KeyValues::U32(v) => buf.extend_from_slice(&u64::from(v[row]).to_le_bytes()),
            KeyValues::U64(v) => buf.extend_from_slice(&v[row].to_le_bytes()),
            KeyValues::F32(v) => encode_f64(f64::from(v[row]), buf),
            KeyValues::F64(v) => encode_f64(v[row], buf),
            KeyValues::Decimal128 { values, scale } => {
                buf.extend_from_slice(&values[row].to_le_bytes());
                buf.extend_from_slice(&scale.to_le_bytes());
            }
            KeyValues::Boolean(a) => buf.push(u8::from(a.value(row))),
            KeyValues::Utf8(a) => encode_str(a.value(row), buf)?,
            KeyValues::LargeUtf8(a) => encode_str(a.value(row), buf)?,
            KeyValues::Utf8View(a) => encode_str(a.value(row), buf)?,
            KeyValues::Date32(v) => buf.extend_from_slice(&i64::from(v[row]).to_le_bytes()),
            KeyValues::Timestamp { values, unit } => {
                buf.extend_from_slice(&values[row].to_le_bytes());
                buf.push(*unit);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
