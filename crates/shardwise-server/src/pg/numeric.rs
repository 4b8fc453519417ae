//! PostgreSQL's `numeric` for decimals of up to 38 digits (Arrow's Decimal128), in text and
//! binary. pgwire encodes `numeric` from `rust_decimal`, whose 96-bit mantissa holds 28 digits:
//! a DECIMAL(38, 10) value of more could not be sent at all.
//!
//! The binary form is PostgreSQL's (`numeric_send`): the digit count, the weight of the first
//! base-10000 digit, the sign, the display scale, then the base-10000 digits, leading and
//! trailing zero digits left out.

use std::error::Error;

use bytes::{BufMut, BytesMut};
use pgwire::types::ToSqlText;
use pgwire::types::format::FormatOptions;
use postgres_types::{IsNull, ToSql, Type, to_sql_checked};

/// Sign words of the binary form.
const NUMERIC_POSITIVE: u16 = 0x0000;
const NUMERIC_NEGATIVE: u16 = 0x4000;

/// An unscaled value and its scale: `value / 10^scale`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Numeric {
    pub value: i128,
    pub scale: u32,
}

impl Numeric {
    /// The integer and fraction digits of the absolute value (the fraction `scale` long).
    fn digits(&self) -> (String, String) {
        let scale = self.scale as usize;
        let mut digits = self.value.unsigned_abs().to_string();
        if digits.len() <= scale {
            digits = format!("{}{digits}", "0".repeat(scale + 1 - digits.len()));
        }
        let (whole, fraction) = digits.split_at(digits.len() - scale);
        (whole.to_string(), fraction.to_string())
    }

    /// `-123.4500`: every digit of the scale, as PostgreSQL writes a numeric.
    pub fn text(&self) -> String {
        let (whole, fraction) = self.digits();
        let sign = if self.value < 0 { "-" } else { "" };
        match fraction.is_empty() {
            true => format!("{sign}{whole}"),
            false => format!("{sign}{whole}.{fraction}"),
        }
    }

    fn write_binary(&self, out: &mut BytesMut) {
        let (whole, fraction) = self.digits();
        let whole = format!("{}{whole}", "0".repeat((4 - whole.len() % 4) % 4));
        let fraction = format!("{fraction}{}", "0".repeat((4 - fraction.len() % 4) % 4));
        let group = |s: &str| -> Vec<i16> {
            s.as_bytes().chunks(4).map(|c| c.iter().fold(0i16, |n, d| n * 10 + i16::from(d - b'0'))).collect()
        };
        let mut groups = group(&whole);
        let mut weight = groups.len() as i16 - 1;
        groups.extend(group(&fraction));
        let leading = groups.iter().take_while(|&&g| g == 0).count();
        groups.drain(..leading);
        weight -= leading as i16;
        while groups.last() == Some(&0) {
            groups.pop();
        }
        if groups.is_empty() {
            weight = 0;
        }
        let sign = if self.value < 0 && !groups.is_empty() { NUMERIC_NEGATIVE } else { NUMERIC_POSITIVE };
        out.put_i16(groups.len() as i16);
        out.put_i16(weight);
        out.put_u16(sign);
        out.put_u16(self.scale as u16);
        for g in groups {
            out.put_i16(g);
        }
    }
}

impl ToSqlText for Numeric {
    fn to_sql_text(
        &self,
        _ty: &Type,
        out: &mut BytesMut,
        _format_options: &FormatOptions,
    ) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        out.put_slice(self.text().as_bytes());
        Ok(IsNull::No)
    }
}

impl ToSql for Numeric {
    fn to_sql(&self, _ty: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        self.write_binary(out);
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::NUMERIC
    }

    to_sql_checked!();
}

#[cfg(test)]
mod tests {
    use rust_decimal::Decimal;

    use super::*;

    fn binary<T: ToSql>(v: &T) -> Vec<u8> {
        let mut out = BytesMut::new();
        v.to_sql(&Type::NUMERIC, &mut out).unwrap();
        out.to_vec()
    }

    #[test]
    fn text_keeps_every_digit_of_the_scale() {
        let n = |value, scale| Numeric { value, scale }.text();
        assert_eq!(n(-1234500, 4), "-123.4500");
        assert_eq!(n(5, 3), "0.005");
        assert_eq!(n(-5, 1), "-0.5");
        assert_eq!(n(42, 0), "42");
        assert_eq!(n(0, 2), "0.00");
        let big = 99_999_999_999_999_999_999_999_999_999_999_999_999i128;
        assert_eq!(n(big, 10), "9999999999999999999999999999.9999999999");
    }

    #[test]
    fn binary_is_what_rust_decimal_sends_where_it_can() {
        for (value, scale) in
            [(0i128, 0u32), (1, 0), (-1, 0), (12345, 3), (1, 4), (123_456_789_000_001, 6), (-5, 1), (100, 2)]
        {
            let ours = binary(&Numeric { value, scale });
            let theirs = binary(&Decimal::from_i128_with_scale(value, scale));
            assert_eq!(ours, theirs, "{value} scale {scale}");
        }
        // Trailing zero digits of the whole part are left out, as PostgreSQL's own numeric_send
        // does (rust_decimal keeps them; both read as 10000): one digit, 1, of weight 1.
        assert_eq!(binary(&Numeric { value: 10000, scale: 0 }), [0, 1, 0, 1, 0, 0, 0, 0, 0, 1]);
    }

    #[test]
    fn binary_of_38_digits() {
        // 12345678901234567890123456789.012345678 (38 digits, scale 9): weight 7, 11 digits.
        let value = 12_345_678_901_234_567_890_123_456_789_012_345_678i128;
        let out = binary(&Numeric { value, scale: 9 });
        let words: Vec<i16> = out.chunks(2).map(|c| i16::from_be_bytes([c[0], c[1]])).collect();
        assert_eq!(&words[..4], &[11, 7, 0, 9]);
        assert_eq!(&words[4..], &[1, 2345, 6789, 123, 4567, 8901, 2345, 6789, 123, 4567, 8000]);
    }
}
