//! `to_utf8view(s)`: a `Utf8` (or `LargeUtf8`) column as `Utf8View`, with views into the column's
//! own value buffer: no string byte is copied, and a short string's view is one masked 16-byte
//! load.
//!
//! Why: [`crate::view_keys`] groups string keys as `Utf8View`, and arrow's cast builds each view
//! through a builder call that copies the string (in a profile of
//! `SELECT id1, sum(v1) FROM x GROUP BY id1` on 1e7 rows the cast was 40% of the node's CPU).
//! Values are unchanged: `to_utf8view(s) = CAST(s AS Utf8View)` for every row.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, GenericStringArray, OffsetSizeTrait, StringViewArray};
use datafusion::arrow::buffer::ScalarBuffer;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::common::Result;
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

/// The function's SQL name.
pub const TO_UTF8VIEW: &str = "to_utf8view";

/// Longest string a view holds inline (Arrow's `Utf8View` layout).
const INLINE_MAX_BYTES: usize = 12;

/// The UDF. See the module doc.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ToUtf8View {
    signature: Signature,
}

impl Default for ToUtf8View {
    fn default() -> Self {
        let types = vec![DataType::Utf8, DataType::LargeUtf8, DataType::Utf8View];
        ToUtf8View { signature: Signature::uniform(1, types, Volatility::Immutable) }
    }
}

/// The function, ready to call or register.
pub fn to_utf8view_udf() -> Arc<ScalarUDF> {
    Arc::new(ScalarUDF::new_from_impl(ToUtf8View::default()))
}

impl ScalarUDFImpl for ToUtf8View {
    fn name(&self) -> &str {
        TO_UTF8VIEW
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8View)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let nullable = args.arg_fields.iter().any(|f| f.is_nullable());
        Ok(Arc::new(Field::new(self.name(), DataType::Utf8View, nullable)))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let [arg] = args.args.as_slice() else {
            return datafusion::common::exec_err!("{TO_UTF8VIEW} takes one argument, got {}", args.args.len());
        };
        match arg {
            ColumnarValue::Array(array) => Ok(ColumnarValue::Array(to_view(array)?)),
            ColumnarValue::Scalar(scalar) => Ok(ColumnarValue::Scalar(scalar.cast_to(&DataType::Utf8View)?)),
        }
    }
}

/// `array` as `Utf8View`: views into its buffer for `Utf8` and `LargeUtf8` (whose value buffer
/// a view can address), arrow's cast otherwise.
pub fn to_view(array: &ArrayRef) -> Result<ArrayRef> {
    let viewed = match array.data_type() {
        DataType::Utf8View => return Ok(Arc::clone(array)),
        DataType::Utf8 => string_to_view(array.as_string::<i32>()),
        DataType::LargeUtf8 => string_to_view(array.as_string::<i64>()),
        _ => None,
    };
    match viewed {
        Some(viewed) => Ok(Arc::new(viewed)),
        None => Ok(cast(array, &DataType::Utf8View)?),
    }
}

/// `None` when the value buffer is too large for a view's 32-bit offset.
fn string_to_view<O: OffsetSizeTrait>(array: &GenericStringArray<O>) -> Option<StringViewArray> {
    let values = array.values();
    if u32::try_from(values.len()).is_err() {
        return None;
    }
    let data = values.as_slice();
    let offsets = array.value_offsets();
    let mut views = Vec::with_capacity(array.len());
    let mut start = offsets.first().map_or(0, |o| o.as_usize());
    for end in offsets.iter().skip(1).map(|o| o.as_usize()) {
        views.push(view_of(data, start, end));
        start = end;
    }
    // SAFETY: each view is made by `view_of` from bytes of `data`, the value buffer (buffer 0):
    // inline, or a prefix with the bytes' offset in it (below 2^32, checked above). The offsets
    // of a valid string array delimit valid UTF-8 (and `view_of` falls back to an empty string
    // should they not lie in the buffer); the null buffer is the array's own.
    Some(unsafe {
        StringViewArray::new_unchecked(ScalarBuffer::from(views), vec![values.clone()], array.nulls().cloned())
    })
}

/// The view of `data[start..end]` as buffer 0 of a view array (an empty string if that range is
/// not in `data`, which a valid array's offsets never give).
#[inline(always)]
fn view_of(data: &[u8], start: usize, end: usize) -> u128 {
    let len = end.wrapping_sub(start);
    if len <= INLINE_MAX_BYTES
        && let Some(chunk) = data.get(start..start + 16)
        && let Ok(bytes) = <[u8; 16]>::try_from(chunk)
    {
        // Length in bytes 0..4, the string in bytes 4..4 + len, zeros after.
        let word = u128::from_le_bytes(bytes) << 32;
        let kept_bits = 32 + 8 * len as u32;
        let mask = if kept_bits == 128 { u128::MAX } else { (1u128 << kept_bits) - 1 };
        return (word & mask) | len as u128;
    }
    let Some(bytes) = data.get(start..end) else { return 0 };
    if bytes.len() <= INLINE_MAX_BYTES {
        let mut view = [0u8; 16];
        view[..4].copy_from_slice(&(bytes.len() as u32).to_le_bytes());
        view[4..4 + bytes.len()].copy_from_slice(bytes);
        return u128::from_le_bytes(view);
    }
    // Length, the first 4 bytes, buffer index 0, offset.
    let prefix = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    bytes.len() as u128 | (prefix as u128) << 32 | (start as u128) << 96
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{Array, ArrayRef, AsArray, LargeStringArray, StringArray, StringViewArray};
    use datafusion::arrow::compute::cast;
    use datafusion::arrow::datatypes::DataType;

    use super::to_view;

    /// Every length from 0 to 40 bytes (inline, the 12-byte edge, out of line), multi-byte UTF-8,
    /// nulls, and values at the very end of the buffer (no 16 bytes left to load).
    fn strings() -> Vec<Option<String>> {
        let mut out: Vec<Option<String>> = (0..=40).map(|n| Some("abcdefghij".repeat(4)[..n].to_string())).collect();
        out.extend([None, Some("héllo wörld ✓".into()), Some(String::new()), None, Some("€".into())]);
        out.extend((0..20).map(|i| Some(format!("id{i:010}"))));
        out.push(Some("z".into()));
        out
    }

    fn check(array: ArrayRef) {
        let got = to_view(&array).expect("to_view");
        let want = cast(&array, &DataType::Utf8View).expect("cast");
        got.to_data().validate_full().expect("a valid view array");
        assert_eq!(got.as_ref(), want.as_ref());
        // Bit for bit: the zero padding of inline views included (equality reads only lengths'
        // worth of bytes).
        let (got, want) = (got.as_string_view(), want.as_string_view());
        for i in (0..got.len()).filter(|&i| got.is_valid(i)) {
            let (g, w) = (got.views()[i], want.views()[i]);
            if (w as u32) <= 12 {
                assert_eq!(g, w, "row {i}: {:?}", got.value(i));
            } else {
                assert_eq!(g as u64, w as u64, "row {i}: length and prefix of {:?}", got.value(i));
            }
        }
    }

    #[test]
    fn equals_arrows_cast_for_every_length_nulls_and_slices() {
        let strings = strings();
        let utf8: ArrayRef = Arc::new(StringArray::from(strings.clone()));
        let large: ArrayRef = Arc::new(LargeStringArray::from(strings.clone()));
        for array in [utf8, large] {
            check(Arc::clone(&array));
            for (offset, len) in [(1, 10), (7, 30), (40, 20), (strings.len() - 3, 3), (5, 0)] {
                check(array.slice(offset, len));
            }
        }
        let view: ArrayRef = Arc::new(StringViewArray::from(strings));
        check(view);
    }

    #[test]
    fn views_share_the_value_buffer() {
        let array: ArrayRef = Arc::new(StringArray::from(vec!["a string longer than twelve bytes", "short"]));
        let got = to_view(&array).expect("to_view");
        let view = got.as_any().downcast_ref::<StringViewArray>().expect("a view array");
        let values = array.as_any().downcast_ref::<StringArray>().expect("strings").values();
        assert_eq!(view.data_buffers()[0].as_ptr(), values.as_ptr());
    }
}
