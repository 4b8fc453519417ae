//! `regexp_replace(s, pattern, replacement [, flags])` reading the replacement as PostgreSQL does:
//! `\1` ... `\9` are the groups, `\&` the whole match, `\\` a backslash, and everything else,
//! `$` included, is itself.
//!
//! Why: DataFusion hands the replacement to Rust's `regex`, whose `$name` is a group reference,
//! so `regexp_replace('cost', 'cost', '$5.00')` answered `.00` (group 5 does not exist) and a
//! `$` in a replacement silently took the text after it; `\&` was left as written, and `\12`
//! was group 12 (PostgreSQL: group 1, then `2`).
//!
//! How: [`ReplacementAsPostgres`] is DataFusion's `regexp_replace` (registered under its name)
//! with the replacement rewritten first into Rust's syntax (`$` as `$$`, `\N` as `${N}`, `\&` as
//! `${0}`), which DataFusion's own translation (`\N` to `${N}`) then leaves as it is. One case
//! stays DataFusion's: an escaped backslash followed by a digit (`\\1`) is read as a group.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, LargeStringArray, StringArray, StringViewArray};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl};

/// See the module doc.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ReplacementAsPostgres {
    inner: Arc<ScalarUDF>,
}

/// `regexp_replace`, to register in place of DataFusion's.
pub fn regexp_replace_udf() -> ScalarUDF {
    ScalarUDF::new_from_impl(ReplacementAsPostgres { inner: datafusion::functions::regex::regexp_replace() })
}

/// PostgreSQL's replacement `text` in the syntax of Rust's `regex` (see the module doc).
pub fn rust_replacement(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '$' => out.push_str("$$"),
            '\\' => match chars.peek().copied() {
                Some(d @ '1'..='9') => {
                    chars.next();
                    out.push_str("${");
                    out.push(d);
                    out.push('}');
                }
                Some('&') => {
                    chars.next();
                    out.push_str("${0}");
                }
                Some('\\') => {
                    chars.next();
                    out.push('\\');
                }
                _ => out.push('\\'),
            },
            c => out.push(c),
        }
    }
    out
}

/// The replacement argument (scalar or column, of any string type) rewritten, keeping its type.
fn rewritten(value: &ColumnarValue) -> Result<ColumnarValue> {
    Ok(match value {
        ColumnarValue::Scalar(ScalarValue::Utf8(s)) => {
            ColumnarValue::Scalar(ScalarValue::Utf8(s.as_deref().map(rust_replacement)))
        }
        ColumnarValue::Scalar(ScalarValue::LargeUtf8(s)) => {
            ColumnarValue::Scalar(ScalarValue::LargeUtf8(s.as_deref().map(rust_replacement)))
        }
        ColumnarValue::Scalar(ScalarValue::Utf8View(s)) => {
            ColumnarValue::Scalar(ScalarValue::Utf8View(s.as_deref().map(rust_replacement)))
        }
        ColumnarValue::Array(array) => {
            let array: ArrayRef = match array.data_type() {
                DataType::Utf8 => {
                    Arc::new(array.as_string::<i32>().iter().map(|s| s.map(rust_replacement)).collect::<StringArray>())
                }
                DataType::LargeUtf8 => Arc::new(
                    array.as_string::<i64>().iter().map(|s| s.map(rust_replacement)).collect::<LargeStringArray>(),
                ),
                DataType::Utf8View => Arc::new(
                    array.as_string_view().iter().map(|s| s.map(rust_replacement)).collect::<StringViewArray>(),
                ),
                _ => Arc::clone(array),
            };
            ColumnarValue::Array(array)
        }
        other => other.clone(),
    })
}

impl ScalarUDFImpl for ReplacementAsPostgres {
    crate::udf_wrapper::delegate_scalar!();

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        self.inner.coerce_types(arg_types)
    }

    fn invoke_with_args(&self, mut args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        if let Some(replacement) = args.args.get_mut(2) {
            *replacement = rewritten(replacement)?;
        }
        self.inner.invoke_with_args(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;

    #[test]
    fn replacements_in_rust_syntax() {
        assert_eq!(rust_replacement("$5.00"), "$$5.00");
        assert_eq!(rust_replacement(r"\1\12"), "${1}${1}2");
        assert_eq!(rust_replacement(r"[\&]"), "[${0}]");
        assert_eq!(rust_replacement(r"a\\b\x"), r"a\b\x");
    }

    #[tokio::test]
    async fn replacements_read_as_postgres() -> Result<()> {
        let ctx = SessionContext::new();
        ctx.register_udf(regexp_replace_udf());
        let batches = ctx
            .sql(
                "SELECT regexp_replace('cost', 'cost', '$5.00'), regexp_replace('ab', '(a)', '$1$1'), \
                 regexp_replace('abc', 'b', '[\\&]'), regexp_replace('abcabc', '(b)', '<\\1>', 'g'), \
                 regexp_replace(s, 'x', r) FROM (VALUES ('axb', '$')) v(s, r)",
            )
            .await?
            .collect()
            .await?;
        let batch = &batches[0];
        let text = |i: usize| {
            let column = batch.column(i);
            match column.data_type() {
                DataType::Utf8View => column.as_string_view().value(0).to_string(),
                _ => column.as_string::<i32>().value(0).to_string(),
            }
        };
        assert_eq!(text(0), "$5.00");
        assert_eq!(text(1), "$1$1b");
        assert_eq!(text(2), "a[b]c");
        assert_eq!(text(3), "a<b>ca<b>c");
        assert_eq!(text(4), "a$b");
        Ok(())
    }
}
