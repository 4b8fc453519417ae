//! `LIKE pattern ESCAPE 'c'` with any escape character, the pattern a literal or not: the pattern
//! is rewritten to DataFusion's only escape character, the backslash.
//!
//! Why: DataFusion refused an ESCAPE other than the backslash ("LIKE does not support escape_char
//! other than the backslash"). SQLAlchemy writes `nspname NOT LIKE %(p)s || '%%' ESCAPE '/'` for
//! `inspect(engine).get_schema_names()` and `col.contains(x, autoescape=True)`, so both failed.
//!
//! How: [`backslash_escaped`] translates a pattern (`c` then a character: that character, escaped
//! by a backslash; a backslash of the pattern: doubled). A literal pattern is translated before
//! planning (`postgres_operators`); any other becomes `shardwise_like_pattern(pattern, 'c')`
//! ([`like_pattern_udf`]), translated row by row, and the ESCAPE clause goes.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, AsArray, StringArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{Result, exec_err};
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility};

/// The SQL name of the translating function.
pub const FUNCTION_NAME: &str = "shardwise_like_pattern";

/// `pattern` with `escape` as its escape character, written with the backslash instead.
pub fn backslash_escaped(pattern: &str, escape: char) -> String {
    let mut out = String::with_capacity(pattern.len() + 4);
    let mut rest = pattern.chars();
    while let Some(c) = rest.next() {
        match c {
            c if c == escape => match rest.next() {
                Some(next) => {
                    out.push('\\');
                    out.push(next);
                }
                None => out.push(c),
            },
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out
}

/// `shardwise_like_pattern`, to register with a session.
pub fn like_pattern_udf() -> Arc<ScalarUDF> {
    Arc::new(ScalarUDF::new_from_impl(LikePattern { signature: Signature::any(2, Volatility::Immutable) }))
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct LikePattern {
    signature: Signature,
}

impl ScalarUDFImpl for LikePattern {
    fn name(&self) -> &str {
        FUNCTION_NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let [pattern, escape] = args.args.as_slice() else {
            return exec_err!("{FUNCTION_NAME} takes a pattern and its escape character");
        };
        let escape = match escape {
            ColumnarValue::Scalar(s) => match s.to_string().chars().collect::<Vec<_>>().as_slice() {
                [c] => *c,
                _ => return exec_err!("ESCAPE takes one character, not '{s}'"),
            },
            ColumnarValue::Array(_) => return exec_err!("ESCAPE takes a constant character"),
        };
        let is_scalar = matches!(pattern, ColumnarValue::Scalar(_));
        let patterns = cast(&pattern.to_array(args.number_rows)?, &DataType::Utf8)?;
        let out: StringArray =
            patterns.as_string::<i32>().iter().map(|p| p.map(|p| backslash_escaped(p, escape))).collect();
        let out: ArrayRef = Arc::new(out);
        crate::udf_wrapper::answer_shaped(out, is_scalar)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_translate_to_backslash_escapes() {
        assert_eq!(backslash_escaped("a!%b", '!'), "a\\%b");
        assert_eq!(backslash_escaped("pg/_%", '/'), "pg\\_%");
        assert_eq!(backslash_escaped("a\\b", '/'), "a\\\\b");
        assert_eq!(backslash_escaped("end/", '/'), "end/");
    }
}
