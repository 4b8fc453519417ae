//! PostgreSQL's `float8` and `float4` as text: `Infinity`, `-Infinity` and `NaN`, and with the
//! default `extra_float_digits` (1 and up) the shortest digits that read back as the value, in
//! exponent form from 1e15 (1e6 for `float4`) and below 1e-4: `1`, `1e+20`, `1e-05`, as
//! PostgreSQL's `float8out` writes them. pgwire writes `inf`, which PostgreSQL's own parsers and
//! JDBC's `Double.parseDouble` refuse, `1.0` for 1 and `1e20` for 1e20. Below 1 `extra_float_digits`
//! asks for rounded digits, which pgwire writes. The binary form is pgwire's (IEEE 754 bytes).

use std::error::Error;

use bytes::{BufMut, BytesMut};
use pgwire::types::ToSqlText;
use pgwire::types::format::FormatOptions;
use pgwire::types::format::float_digits::ExtraFloatDigits;
use postgres_types::{IsNull, ToSql, Type, to_sql_checked};
use shardwise_query::postgres_text::{float4_text, float8_text};

/// A DOUBLE, sent as PostgreSQL sends a `float8`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Float8(pub f64);

/// A REAL, sent as PostgreSQL sends a `float4`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Float4(pub f32);

/// The text of a float: PostgreSQL's words for the special values, else `shortest` (the default)
/// or `rounded` (`extra_float_digits` below 1).
fn write_text(
    v: f64,
    options: &FormatOptions,
    shortest: impl FnOnce() -> String,
    rounded: impl FnOnce(ExtraFloatDigits) -> String,
    out: &mut BytesMut,
) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
    let text = match v {
        v if v.is_nan() => "NaN".to_string(),
        f64::INFINITY => "Infinity".to_string(),
        f64::NEG_INFINITY => "-Infinity".to_string(),
        _ if options.extra_float_digits >= 1 => shortest(),
        _ => rounded(ExtraFloatDigits(options.extra_float_digits)),
    };
    out.put_slice(text.as_bytes());
    Ok(IsNull::No)
}

impl ToSqlText for Float8 {
    fn to_sql_text(
        &self,
        _ty: &Type,
        out: &mut BytesMut,
        options: &FormatOptions,
    ) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        let v = self.0;
        write_text(v, options, || float8_text(v), |digits| digits.format_f64(v).to_string(), out)
    }
}

impl ToSqlText for Float4 {
    fn to_sql_text(
        &self,
        _ty: &Type,
        out: &mut BytesMut,
        options: &FormatOptions,
    ) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        let v = self.0;
        write_text(f64::from(v), options, || float4_text(v), |digits| digits.format_f32(v).to_string(), out)
    }
}

impl ToSql for Float8 {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        self.0.to_sql(ty, out)
    }

    fn accepts(ty: &Type) -> bool {
        <f64 as ToSql>::accepts(ty)
    }

    to_sql_checked!();
}

impl ToSql for Float4 {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        self.0.to_sql(ty, out)
    }

    fn accepts(ty: &Type) -> bool {
        <f32 as ToSql>::accepts(ty)
    }

    to_sql_checked!();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(v: &impl ToSqlText, extra_float_digits: i8) -> String {
        let mut out = BytesMut::new();
        let mut options = FormatOptions::default();
        options.extra_float_digits = extra_float_digits;
        v.to_sql_text(&Type::FLOAT8, &mut out, &options).unwrap();
        String::from_utf8(out.to_vec()).unwrap()
    }

    #[test]
    fn floats_read_as_postgresql_writes_them() {
        let cases = [
            (f64::INFINITY, "Infinity"),
            (f64::NEG_INFINITY, "-Infinity"),
            (-f64::NAN, "NaN"),
            (1.0, "1"),
            (1e20, "1e+20"),
            (0.00001, "1e-05"),
            (0.1 + 0.2, "0.30000000000000004"),
        ];
        for (v, want) in cases {
            assert_eq!(text(&Float8(v), 1), want, "{v}");
        }
        assert_eq!(text(&Float4(f32::NEG_INFINITY), 1), "-Infinity");
        assert_eq!(text(&Float4(1e6), 1), "1e+06");
        assert_eq!(text(&Float4(0.5), 1), "0.5");
        // Rounded digits when asked for, still with PostgreSQL's words for the special values.
        assert_eq!(text(&Float8(0.1 + 0.2), 0), "0.3");
        assert_eq!(text(&Float8(f64::INFINITY), 0), "Infinity");
    }

    #[test]
    fn the_binary_form_is_the_ieee_bytes() {
        let mut out = BytesMut::new();
        Float8(1.5).to_sql(&Type::FLOAT8, &mut out).unwrap();
        assert_eq!(out.to_vec(), 1.5f64.to_be_bytes());
    }
}
