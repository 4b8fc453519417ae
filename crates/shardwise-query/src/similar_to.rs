//! `x SIMILAR TO pattern` as the SQL standard and PostgreSQL read it: the whole string matches
//! the pattern, `%` is any run of characters, `_` any one character, `.` `^` `$` are themselves,
//! and `|` `*` `+` `?` `{m,n}` `( )` `[...]` are regular-expression operators.
//!
//! Why: DataFusion runs the pattern as a regular expression unanchored and untranslated, so `'abc'
//! SIMILAR TO 'b'` was true, `'abc' SIMILAR TO 'a%'` false and `'abc' SIMILAR TO 'a.c'` true:
//! wrong answers without an error.
//!
//! How: PostgreSQL's own way. [`SimilarToAsRegex`], an analyzer rule before type coercion, turns
//! `x [NOT] SIMILAR TO p [ESCAPE e]` into `x ~ similar_to_escape(p, e)` (`!~` when negated);
//! `similar_to_escape`, PostgreSQL's function of that name, translates the pattern into an
//! anchored regular expression ([`similar_to_regex`]). A literal pattern is translated once, as
//! the optimizer folds the call. The item keeps its name.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, StringArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DFSchema, DataFusionError, Result, ScalarValue, exec_err};
use datafusion::logical_expr::expr::{Like, ScalarFunction};
use datafusion::logical_expr::{
    BinaryExpr, ColumnarValue, Expr, LogicalPlan, Operator, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    TypeSignature, Volatility,
};
use datafusion::optimizer::AnalyzerRule;

/// The SQL name of the translating function (PostgreSQL's).
const FUNCTION_NAME: &str = "similar_to_escape";

/// The escape character when a pattern names none (PostgreSQL's default).
const DEFAULT_ESCAPE: char = '\\';

/// The analyzer rule. See the module doc.
#[derive(Debug, Default)]
pub struct SimilarToAsRegex;

impl AnalyzerRule for SimilarToAsRegex {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        crate::expression_rules::rewrite_expressions(plan, as_regex)
    }

    fn name(&self) -> &str {
        "shardwise_similar_to_as_regex"
    }
}

fn as_regex(e: Expr, _schema: &DFSchema) -> Result<Transformed<Expr>> {
    let Expr::SimilarTo(Like { negated, expr, pattern, escape_char, case_insensitive }) = e else {
        return Ok(Transformed::no(e));
    };
    let escape = escape_char.unwrap_or(DEFAULT_ESCAPE).to_string();
    let regex = Expr::ScalarFunction(ScalarFunction::new_udf(
        similar_to_escape_udf(),
        vec![*pattern, Expr::Literal(ScalarValue::Utf8(Some(escape)), None)],
    ));
    let op = match (negated, case_insensitive) {
        (false, false) => Operator::RegexMatch,
        (true, false) => Operator::RegexNotMatch,
        (false, true) => Operator::RegexIMatch,
        (true, true) => Operator::RegexNotIMatch,
    };
    Ok(Transformed::yes(Expr::BinaryExpr(BinaryExpr { left: expr, op, right: Box::new(regex) })))
}

/// `similar_to_escape(pattern [, escape])`, to register with a session.
pub fn similar_to_escape_udf() -> Arc<ScalarUDF> {
    Arc::new(ScalarUDF::new_from_impl(SimilarToEscape {
        signature: Signature::one_of(vec![TypeSignature::String(1), TypeSignature::String(2)], Volatility::Immutable),
    }))
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct SimilarToEscape {
    signature: Signature,
}

impl ScalarUDFImpl for SimilarToEscape {
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
        let rows = args.number_rows;
        let all_scalars = args.args.iter().all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let arrays: Vec<ArrayRef> = args.args.iter().map(|a| a.to_array(rows)).collect::<Result<Vec<_>>>()?;
        let as_utf8 = |a: &ArrayRef| -> Result<ArrayRef> { Ok(cast(a, &DataType::Utf8)?) };
        let patterns = match arrays.first() {
            Some(a) => as_utf8(a)?,
            None => return exec_err!("{FUNCTION_NAME} takes a pattern"),
        };
        let escapes = arrays.get(1).map(as_utf8).transpose()?;
        let patterns = patterns.as_string::<i32>();
        let escapes = escapes.as_ref().map(|e| e.as_string::<i32>());
        let mut out = Vec::with_capacity(patterns.len());
        for i in 0..patterns.len() {
            if patterns.is_null(i) || escapes.is_some_and(|e| e.is_null(i)) {
                out.push(None);
                continue;
            }
            let escape = match escapes.map(|e| e.value(i)) {
                None => Some(DEFAULT_ESCAPE),
                Some(text) => escape_character(text)?,
            };
            out.push(Some(similar_to_regex(patterns.value(i), escape).map_err(DataFusionError::Execution)?));
        }
        let array: ArrayRef = Arc::new(StringArray::from(out));
        crate::udf_wrapper::answer_shaped(array, all_scalars)
    }
}

/// An ESCAPE clause's text as the escape character: one character, or none for `''`.
fn escape_character(text: &str) -> Result<Option<char>> {
    let mut chars = text.chars();
    match (chars.next(), chars.next()) {
        (None, _) => Ok(None),
        (Some(c), None) => Ok(Some(c)),
        _ => exec_err!("invalid escape string '{text}' for SIMILAR TO: it must be empty or one character"),
    }
}

/// The anchored regular expression (Rust's `regex` syntax, which DataFusion's `~` runs) that
/// matches what `pattern` matches under SIMILAR TO, with `escape` as the escape character.
/// The translation is PostgreSQL's (`similar_escape` in its `regexp.c`): an escaped character is
/// itself; `%` `_` become `.*` `.`; `.` `^` `$` `\` are themselves; inside `[...]` characters are
/// copied; the rest are the regular expression's operators. PostgreSQL's `\"` markers (which
/// only `SUBSTRING ... SIMILAR` reads) match nothing.
pub fn similar_to_regex(pattern: &str, escape: Option<char>) -> std::result::Result<String, String> {
    // `(?s)`: `%` and `_` match line breaks too, as in PostgreSQL.
    let mut out = String::with_capacity(pattern.len() * 2 + 10);
    out.push_str("(?s)^(?:");
    let mut in_class = false;
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        if Some(c) == escape {
            match chars.next() {
                Some('"') if !in_class => {}
                Some(next) => out.push_str(&regex_syntax_escape(next)),
                None => return Err(format!("SIMILAR TO pattern '{pattern}' ends with its escape character")),
            }
            continue;
        }
        if in_class {
            if c == '\\' {
                out.push('\\');
            }
            out.push(c);
            if c == ']' {
                in_class = false;
            }
            continue;
        }
        match c {
            '[' => {
                out.push('[');
                in_class = true;
                // `[^]...]` and `[]...]`: a `]` right after the opening is a member.
                if chars.peek() == Some(&'^') {
                    out.push('^');
                    chars.next();
                }
                if chars.peek() == Some(&']') {
                    out.push_str("\\]");
                    chars.next();
                }
            }
            '%' => out.push_str(".*"),
            '_' => out.push('.'),
            '.' | '^' | '$' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    if in_class {
        return Err(format!("SIMILAR TO pattern '{pattern}' has an unterminated [ ] list"));
    }
    out.push_str(")$");
    Ok(out)
}

/// `c` as a literal in a regular expression.
fn regex_syntax_escape(c: char) -> String {
    let mut buf = [0u8; 4];
    regex_escape(c.encode_utf8(&mut buf))
}

/// The characters of `text` each as itself in Rust's regular expressions.
fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    for c in text.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::BooleanArray;
    use datafusion::prelude::SessionContext;

    fn matches(value: &str, pattern: &str) -> bool {
        let regex = similar_to_regex(pattern, Some('\\')).expect("translates");
        regex::Regex::new(&regex).expect("compiles").is_match(value)
    }

    #[test]
    fn patterns_match_whole_strings_with_sql_wildcards() {
        assert!(!matches("abc", "b"));
        assert!(matches("abc", "a%"));
        assert!(matches("abc", "_b_"));
        assert!(matches("abc", "(a|x)bc"));
        assert!(!matches("abc", "a.c"));
        assert!(matches("a.c", "a.c"));
        assert!(matches("a$^c", "a$^c"));
        assert!(matches("abbbc", "ab+c") && matches("ac", "ab*c") && !matches("abbc", "ab?c"));
        assert!(matches("abbc", "ab{2}c") && !matches("abc", "ab{2}c"));
        assert!(matches("b", "[a-c]") && !matches("d", "[a-c]") && matches("d", "[^a-c]"));
        assert!(matches("a%", "a\\%") && !matches("ab", "a\\%"));
        assert!(matches("a\nb", "a%b") && matches("a\nb", "a_b"));
        assert!(matches("", "%") && !matches("", "_"));
        assert!(matches("a]", "a[]]"));
    }

    #[test]
    fn escape_characters_and_bad_patterns() {
        let regex = similar_to_regex("a#%#_", Some('#')).expect("translates");
        let re = regex::Regex::new(&regex).expect("compiles");
        assert!(re.is_match("a%_") && !re.is_match("ab_"));
        // Without an escape character a backslash is itself.
        let regex = similar_to_regex("a\\%", None).expect("translates");
        assert!(regex::Regex::new(&regex).expect("compiles").is_match("a\\xyz"));
        assert!(similar_to_regex("abc\\", Some('\\')).is_err());
        assert!(similar_to_regex("[abc", Some('\\')).is_err());
        assert!(escape_character("ab").is_err());
        assert_eq!(escape_character("").ok(), Some(None));
    }

    #[tokio::test]
    async fn similar_to_in_sql_is_postgres_similar_to() -> Result<()> {
        let ctx = SessionContext::new();
        ctx.add_analyzer_rule(Arc::new(SimilarToAsRegex));
        ctx.register_udf(similar_to_escape_udf().as_ref().clone());
        let batches = ctx
            .sql(
                "SELECT 'abc' SIMILAR TO 'b', 'abc' SIMILAR TO 'a%', 'abc' NOT SIMILAR TO '_b_', \
                 'a!c' SIMILAR TO 'a!!c' ESCAPE '!', CAST(NULL AS VARCHAR) SIMILAR TO 'a'",
            )
            .await?
            .collect()
            .await?;
        let batch = &batches[0];
        let column = |i: usize| batch.column(i).as_any().downcast_ref::<BooleanArray>().map(|a| a.iter().next());
        assert_eq!(column(0), Some(Some(Some(false))));
        assert_eq!(column(1), Some(Some(Some(true))));
        assert_eq!(column(2), Some(Some(Some(false))));
        assert_eq!(column(3), Some(Some(Some(true))));
        assert_eq!(column(4), Some(Some(None)));
        assert_eq!(batch.schema().field(0).name(), "Utf8(\"abc\") SIMILAR TO Utf8(\"b\")");
        Ok(())
    }
}
