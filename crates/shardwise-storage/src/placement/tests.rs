//! Unit tests of [`super`].
use std::sync::Arc;

use arrow::array::{
    BooleanArray, Date32Array, Decimal128Array, Float32Array, Float64Array, Int8Array, Int16Array, Int32Array,
    Int64Array, LargeStringArray, StringArray, StringViewArray, TimestampMicrosecondArray, TimestampMillisecondArray,
    TimestampNanosecondArray, TimestampSecondArray, UInt8Array, UInt16Array, UInt32Array, UInt64Array,
};
use arrow::datatypes::{Field, Schema};

use super::*;

/// A batch with one column per array, named c0, c1, ...
fn batch(columns: Vec<ArrayRef>) -> RecordBatch {
    let fields: Vec<Field> =
        columns.iter().enumerate().map(|(i, a)| Field::new(format!("c{i}"), a.data_type().clone(), true)).collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
}

fn hashes(column: ArrayRef) -> Vec<u64> {
    hash_rows(&batch(vec![column]), &[0]).unwrap()
}

fn xxh64(bytes: &[u8]) -> u64 {
    XxHash64::oneshot(0, bytes)
}

/// `0x01` followed by `value`: the encoding of a non-NULL value.
fn tagged(value: &[u8]) -> Vec<u8> {
    let mut bytes = vec![TAG_VALUE];
    bytes.extend_from_slice(value);
    bytes
}

#[test]
fn xxhash64_reference_vectors() {
    // From the xxHash reference implementation (seed 0): the algorithm itself is pinned,
    // including the path for inputs of 32 bytes and more.
    assert_eq!(xxh64(b""), 0xEF46_DB37_51D8_E999);
    assert_eq!(xxh64(b"a"), 0xD24E_C4F1_A98C_6E5B);
    assert_eq!(xxh64(b"abc"), 0x44BC_2CF5_AD77_0999);
    assert_eq!(xxh64(b"The quick brown fox jumps over the lazy dog"), 0x0B24_2D36_1FDA_71BC);
}

/// Golden values: computed once with this implementation and pinned. If one of these fails,
/// the placement function changed, and existing tables would have their rows on the wrong
/// shards. Do not update them; define a new `PlacementVersion` instead.
#[test]
fn golden_values() {
    // (hash, shard of 16, shard of 7)
    let int64 =
        batch(vec![Arc::new(Int64Array::from(vec![Some(0), Some(1), Some(42), Some(-1), None, Some(i64::MAX)]))]);
    let expected: [(u64, u32, u32); 6] = [
        (0xa244_3c71_157c_b676, 6, 2),
        (0x7b20_75f9_0a67_1183, 3, 6),
        (0xee53_6f90_35b7_1091, 1, 4),
        (0xe4a4_2358_fe73_e0b6, 6, 1),
        (0xe934_a84a_db05_2768, 8, 5),
        (0x0628_092f_6dc6_4641, 1, 0),
    ];
    assert_golden(&int64, &[0], &expected);

    let strings = batch(vec![Arc::new(StringArray::from(vec![Some(""), Some("a"), Some("shardwise"), None]))]);
    assert_golden(
        &strings,
        &[0],
        &[
            (0xf3e5_687a_f187_8726, 6, 4),
            (0x7c6a_890d_0599_f64b, 11, 2),
            (0x7a97_68fb_5c7e_b3f4, 4, 5),
            (0xe934_a84a_db05_2768, 8, 5),
        ],
    );

    let floats = batch(vec![Arc::new(Float64Array::from(vec![0.0, 1.5, f64::NAN, -2.25]))]);
    assert_golden(
        &floats,
        &[0],
        &[
            (0xa244_3c71_157c_b676, 6, 2),
            (0x937f_f86b_ce04_5d70, 0, 6),
            (0xd866_2a94_572a_50c6, 6, 0),
            (0xd4d3_aa4b_0a4c_cd4a, 10, 4),
        ],
    );

    let bools = batch(vec![Arc::new(BooleanArray::from(vec![Some(false), Some(true), None]))]);
    assert_golden(
        &bools,
        &[0],
        &[(0xdd8f_621d_bf7f_57f1, 1, 0), (0x52fc_4823_a13c_997a, 10, 3), (0xe934_a84a_db05_2768, 8, 5)],
    );

    let decimals =
        batch(vec![Arc::new(Decimal128Array::from(vec![12345, -1]).with_precision_and_scale(18, 2).unwrap())]);
    assert_golden(&decimals, &[0], &[(0x189e_a92f_8cf1_ba42, 2, 0), (0x075d_ec01_0fcd_3849, 9, 3)]);

    let dates = batch(vec![Arc::new(Date32Array::from(vec![0, 19000, -1]))]);
    assert_golden(
        &dates,
        &[0],
        &[(0xa244_3c71_157c_b676, 6, 2), (0x09d0_bb34_44d7_edc0, 0, 0), (0xe4a4_2358_fe73_e0b6, 6, 1)],
    );

    let ts = batch(vec![Arc::new(TimestampMillisecondArray::from(vec![1_700_000_000_000]))]);
    assert_golden(&ts, &[0], &[(0x03fc_134a_e30e_da1e, 14, 5)]);

    let multi = batch(vec![
        Arc::new(Int32Array::from(vec![Some(7), None, Some(7)])),
        Arc::new(StringArray::from(vec![Some("x"), Some("x"), None])),
    ]);
    assert_golden(
        &multi,
        &[0, 1],
        &[(0x7cce_ec2e_9768_163a, 10, 1), (0x5660_c5f0_62cc_ebed, 13, 5), (0x685f_3c50_4180_d7fd, 13, 5)],
    );

    // A key of 32 bytes or more takes xxHash64's long-input path.
    let long = batch(vec![Arc::new(StringArray::from(vec!["a key long enough for the striped loop"]))]);
    assert_golden(&long, &[0], &[(0x0ea0_9c16_c474_cc23, 3, 5)]);
}

fn assert_golden(batch: &RecordBatch, key: &[usize], expected: &[(u64, u32, u32)]) {
    let hashes: Vec<u64> = expected.iter().map(|e| e.0).collect();
    let of16: Vec<u32> = expected.iter().map(|e| e.1).collect();
    let of7: Vec<u32> = expected.iter().map(|e| e.2).collect();
    assert_eq!(hash_rows(batch, key).unwrap(), hashes, "hashes");
    assert_eq!(shard_of_rows(batch, key, 16).unwrap(), of16, "shards of 16");
    assert_eq!(shard_of_rows(batch, key, 7).unwrap(), of7, "shards of 7");
    assert_eq!(PlacementVersion::XxHash64V1.shard_of_rows(batch, key, 16).unwrap(), of16);
}

/// Each type's bytes, as the module docs specify them, built by hand.
#[test]
fn encoding_matches_the_spec() {
    let cases: Vec<(ArrayRef, Vec<u8>)> = vec![
        (Arc::new(Int8Array::from(vec![-2])), tagged(&(-2i64).to_le_bytes())),
        (Arc::new(Int16Array::from(vec![-300])), tagged(&(-300i64).to_le_bytes())),
        (Arc::new(Int32Array::from(vec![70_000])), tagged(&70_000i64.to_le_bytes())),
        (Arc::new(Int64Array::from(vec![1 << 40])), tagged(&(1i64 << 40).to_le_bytes())),
        (Arc::new(UInt8Array::from(vec![200])), tagged(&200u64.to_le_bytes())),
        (Arc::new(UInt16Array::from(vec![60_000])), tagged(&60_000u64.to_le_bytes())),
        (Arc::new(UInt32Array::from(vec![u32::MAX])), tagged(&u64::from(u32::MAX).to_le_bytes())),
        (Arc::new(UInt64Array::from(vec![u64::MAX])), tagged(&u64::MAX.to_le_bytes())),
        (Arc::new(Float32Array::from(vec![0.5f32])), tagged(&0.5f64.to_bits().to_le_bytes())),
        (Arc::new(Float64Array::from(vec![-3.75])), tagged(&(-3.75f64).to_bits().to_le_bytes())),
        (Arc::new(Float64Array::from(vec![f64::NAN])), tagged(&0x7FF8_0000_0000_0000u64.to_le_bytes())),
        (Arc::new(Float64Array::from(vec![-0.0])), tagged(&[0; 8])),
        (
            Arc::new(Decimal128Array::from(vec![-12345]).with_precision_and_scale(10, 3).unwrap()),
            tagged(&[&(-12345i128).to_le_bytes()[..], &[3]].concat()),
        ),
        (
            Arc::new(Decimal128Array::from(vec![5]).with_precision_and_scale(10, -2).unwrap()),
            tagged(&[&5i128.to_le_bytes()[..], &[0xFE]].concat()),
        ),
        (Arc::new(BooleanArray::from(vec![true])), tagged(&[1])),
        (Arc::new(BooleanArray::from(vec![false])), tagged(&[0])),
        (Arc::new(StringArray::from(vec!["héllo"])), tagged(&[&6u32.to_le_bytes()[..], "héllo".as_bytes()].concat())),
        (Arc::new(LargeStringArray::from(vec!["ab"])), tagged(&[2, 0, 0, 0, b'a', b'b'])),
        (Arc::new(StringViewArray::from(vec!["ab"])), tagged(&[2, 0, 0, 0, b'a', b'b'])),
        (Arc::new(Date32Array::from(vec![-5])), tagged(&(-5i64).to_le_bytes())),
        (Arc::new(TimestampSecondArray::from(vec![9])), tagged(&[&9i64.to_le_bytes()[..], &[0]].concat())),
        (Arc::new(TimestampMillisecondArray::from(vec![9])), tagged(&[&9i64.to_le_bytes()[..], &[1]].concat())),
        (
            Arc::new(TimestampMicrosecondArray::from(vec![-9]).with_timezone("UTC")),
            tagged(&[&(-9i64).to_le_bytes()[..], &[2]].concat()),
        ),
        (
            Arc::new(TimestampNanosecondArray::from(vec![9]).with_timezone("Asia/Tokyo")),
            tagged(&[&9i64.to_le_bytes()[..], &[3]].concat()),
        ),
    ];
    for (array, bytes) in cases {
        let data_type = array.data_type().clone();
        assert_eq!(hashes(array), vec![xxh64(&bytes)], "{data_type}");
    }
}

#[test]
fn null_is_one_zero_byte_per_column_for_every_type() {
    let nulls: Vec<ArrayRef> = vec![
        Arc::new(Int8Array::from(vec![None])),
        Arc::new(UInt64Array::from(vec![None])),
        Arc::new(Float32Array::from(vec![None])),
        Arc::new(Decimal128Array::from(vec![None]).with_precision_and_scale(10, 2).unwrap()),
        Arc::new(BooleanArray::from(vec![None])),
        Arc::new(StringArray::from(vec![None::<&str>])),
        Arc::new(Date32Array::from(vec![None])),
        Arc::new(TimestampNanosecondArray::from(vec![None])),
    ];
    for array in &nulls {
        assert_eq!(hashes(Arc::clone(array)), vec![xxh64(&[TAG_NULL])], "{}", array.data_type());
    }
    let all = batch(nulls);
    let key: Vec<usize> = (0..all.num_columns()).collect();
    assert_eq!(hash_rows(&all, &key).unwrap(), vec![xxh64(&[TAG_NULL; 8])]);
    // A NULL differs from every value, including zero and the empty string.
    assert_ne!(hashes(Arc::new(Int64Array::from(vec![None])))[0], hashes(Arc::new(Int64Array::from(vec![0])))[0]);
    assert_ne!(
        hashes(Arc::new(StringArray::from(vec![None::<&str>])))[0],
        hashes(Arc::new(StringArray::from(vec![""])))[0]
    );
}

#[test]
fn integer_widths_and_float_widths_agree() {
    let values = [i64::from(i32::MIN), -5, -1, 0, 5, i64::from(i32::MAX)];
    let as_i64 = hashes(Arc::new(Int64Array::from(values.to_vec())));
    let as_i32 = hashes(Arc::new(Int32Array::from(values.iter().map(|&v| v as i32).collect::<Vec<_>>())));
    assert_eq!(as_i32, as_i64);
    let small = [-128i64, -1, 0, 5, 127];
    let as_i64 = hashes(Arc::new(Int64Array::from(small.to_vec())));
    assert_eq!(hashes(Arc::new(Int8Array::from(small.iter().map(|&v| v as i8).collect::<Vec<_>>()))), as_i64);
    assert_eq!(hashes(Arc::new(Int16Array::from(small.iter().map(|&v| v as i16).collect::<Vec<_>>()))), as_i64);
    let unsigned = [0u64, 5, 255];
    let as_u64 = hashes(Arc::new(UInt64Array::from(unsigned.to_vec())));
    assert_eq!(hashes(Arc::new(UInt8Array::from(unsigned.iter().map(|&v| v as u8).collect::<Vec<_>>()))), as_u64);
    assert_eq!(hashes(Arc::new(UInt32Array::from(unsigned.iter().map(|&v| v as u32).collect::<Vec<_>>()))), as_u64);
    // Non-negative values are the same signed or unsigned.
    assert_eq!(hashes(Arc::new(Int64Array::from(vec![0, 5, 255]))), as_u64);

    let floats = [0.0f32, 1.5, -2.25, f32::MAX, f32::MIN_POSITIVE, f32::INFINITY];
    assert_eq!(
        hashes(Arc::new(Float32Array::from(floats.to_vec()))),
        hashes(Arc::new(Float64Array::from(floats.iter().map(|&f| f64::from(f)).collect::<Vec<_>>())))
    );
    // Strings agree across Utf8, LargeUtf8 and Utf8View.
    let strings = vec!["", "a", "a longer string that is not inlined in a view"];
    let utf8 = hashes(Arc::new(StringArray::from(strings.clone())));
    assert_eq!(hashes(Arc::new(LargeStringArray::from(strings.clone()))), utf8);
    assert_eq!(hashes(Arc::new(StringViewArray::from(strings))), utf8);
}

#[test]
fn zero_and_nan_are_normalised() {
    let nan_payload = f64::from_bits(0x7FF0_0000_0000_0001);
    let neg_nan = f64::from_bits(0xFFF8_0000_0000_0000);
    assert!(nan_payload.is_nan() && neg_nan.is_nan());
    let h = hashes(Arc::new(Float64Array::from(vec![0.0, -0.0, f64::NAN, nan_payload, neg_nan])));
    assert_eq!(h[0], h[1]);
    assert_eq!(h[2], h[3]);
    assert_eq!(h[2], h[4]);
    assert_ne!(h[0], h[2]);
    let h32 = hashes(Arc::new(Float32Array::from(vec![0.0f32, -0.0, f32::NAN, f32::from_bits(0xFFC0_0001)])));
    assert_eq!(h32[0], h[0]);
    assert_eq!(h32[1], h[0]);
    assert_eq!(h32[2], h[2]);
    assert_eq!(h32[3], h[2]);
}

#[test]
fn multi_column_keys_depend_on_every_column_and_their_order() {
    let b = batch(vec![
        Arc::new(StringArray::from(vec!["ab", "a", "ab"])),
        Arc::new(StringArray::from(vec!["c", "bc", "c"])),
    ]);
    let h = hash_rows(&b, &[0, 1]).unwrap();
    // Length prefixes keep ("ab","c") and ("a","bc") apart.
    assert_ne!(h[0], h[1]);
    assert_eq!(h[0], h[2]);
    assert_ne!(hash_rows(&b, &[1, 0]).unwrap()[0], h[0]);
    assert_ne!(hash_rows(&b, &[0]).unwrap()[0], h[0]);
    // A NULL in one column is not the same as a missing column.
    let n = batch(vec![Arc::new(Int64Array::from(vec![1])), Arc::new(Int64Array::from(vec![None]))]);
    assert_ne!(hash_rows(&n, &[0, 1]).unwrap(), hash_rows(&n, &[0]).unwrap());
}

#[test]
fn sliced_arrays_place_like_whole_ones() {
    let whole = batch(vec![
        Arc::new(Int64Array::from(vec![Some(1), None, Some(3), Some(4), None])),
        Arc::new(StringArray::from(vec![Some("a"), Some("b"), None, Some("d"), Some("e")])),
    ]);
    let all = hash_rows(&whole, &[0, 1]).unwrap();
    let slice = whole.slice(1, 3);
    assert_eq!(hash_rows(&slice, &[0, 1]).unwrap(), all[1..4].to_vec());
}

#[test]
fn bad_arguments() {
    let b = batch(vec![Arc::new(Int64Array::from(vec![1, 2]))]);
    let err = shard_of_rows(&b, &[0], 0).unwrap_err();
    assert!(matches!(err, StorageError::InvalidOption { name: "shards", .. }), "{err}");
    let err = shard_of_rows(&b, &[], 4).unwrap_err();
    assert!(err.to_string().contains("at least one shard key column"), "{err}");
    let err = shard_of_rows(&b, &[1], 4).unwrap_err();
    assert!(matches!(err, StorageError::KeyColumnOutOfRange { index: 1, num_columns: 1 }), "{err}");
    let bin = batch(vec![Arc::new(arrow::array::BinaryArray::from(vec![&b"x"[..]]))]);
    let err = split_by_shard(&bin, &[0], 4).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("\"c0\"") && msg.contains("Binary") && msg.contains("Int64"), "{msg}");
    assert!(split_by_shard(&b, &[0], 0).is_err());
}

#[test]
fn one_shard_gets_everything() {
    let b = batch(vec![Arc::new(Int64Array::from((0..100).collect::<Vec<i64>>()))]);
    assert!(shard_of_rows(&b, &[0], 1).unwrap().iter().all(|&s| s == 0));
    let pieces = split_by_shard(&b, &[0], 1).unwrap();
    assert_eq!(pieces.len(), 1);
    assert_eq!(pieces[0].0, 0);
    assert_eq!(pieces[0].1, b);
}

#[test]
fn empty_batch() {
    let b = batch(vec![Arc::new(Int64Array::from(Vec::<i64>::new()))]);
    assert!(shard_of_rows(&b, &[0], 4).unwrap().is_empty());
    assert!(split_by_shard(&b, &[0], 4).unwrap().is_empty());
}

#[test]
fn split_keeps_every_row_once_in_order() {
    let n = 1000i64;
    let b = batch(vec![
        Arc::new(Int64Array::from((0..n).collect::<Vec<_>>())),
        Arc::new(StringArray::from((0..n).map(|i| (i % 37 != 0).then(|| format!("k{}", i % 13))).collect::<Vec<_>>())),
    ]);
    let shards = 8;
    let row_shards = shard_of_rows(&b, &[1, 0], shards).unwrap();
    let pieces = split_by_shard(&b, &[1, 0], shards).unwrap();
    assert!(pieces.windows(2).all(|w| w[0].0 < w[1].0), "ascending shards");
    let mut seen = vec![0u32; n as usize];
    for (shard, piece) in &pieces {
        assert!(piece.num_rows() > 0, "only non-empty pieces");
        assert_eq!(piece.schema(), b.schema());
        let ids = piece.column(0).as_primitive::<Int64Type>();
        let ids: Vec<i64> = ids.values().to_vec();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "row order kept within shard {shard}");
        for id in ids {
            seen[id as usize] += 1;
            assert_eq!(row_shards[id as usize], *shard, "row {id} in the shard placement gives it");
        }
        // The pieces re-hash to their own shard.
        assert!(shard_of_rows(piece, &[1, 0], shards).unwrap().iter().all(|s| s == shard));
    }
    assert!(seen.iter().all(|&c| c == 1), "every row exactly once");
}

#[test]
fn sequential_keys_spread_evenly() {
    const ROWS: i64 = 100_000;
    const SHARDS: u32 = 16;
    let b = batch(vec![Arc::new(Int64Array::from((0..ROWS).collect::<Vec<_>>()))]);
    let mut counts = [0u64; SHARDS as usize];
    for shard in shard_of_rows(&b, &[0], SHARDS).unwrap() {
        counts[shard as usize] += 1;
    }
    let mean = ROWS as f64 / f64::from(SHARDS);
    for (shard, &count) in counts.iter().enumerate() {
        let deviation = (count as f64 - mean).abs() / mean;
        assert!(deviation <= 0.05, "shard {shard} has {count} rows, mean {mean}: {counts:?}");
    }
}

#[test]
fn placement_version_names() {
    assert_eq!(PlacementVersion::CURRENT.as_str(), "xxhash64-v1");
    assert_eq!(PlacementVersion::XxHash64V1.to_string(), "xxhash64-v1");
    assert_eq!("XXHASH64-V1".parse::<PlacementVersion>().unwrap(), PlacementVersion::XxHash64V1);
    assert!("xxhash64-v2".parse::<PlacementVersion>().unwrap_err().to_string().contains("xxhash64-v1"));
}
