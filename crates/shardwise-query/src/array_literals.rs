//! PostgreSQL's array literals: `'{a,b}'::text[]`, `CAST('{1,2,NULL}' AS INT[])`, and the text
//! form of an array parameter (psycopg sends a Python list as `{"",a}`).
//!
//! Why: Arrow's cast of a string to a list makes a list of that one string, so
//! `'{a,b}'::text[]` was `["{a,b}"]`, `'a' = ANY('{a,b}'::text[])` was false and
//! `'{1,2}'::int[]` an error; a parser that took `""` or a quoted `"NULL"` for NULL lost the
//! empty string and the text `NULL` from a list parameter.
//!
//! How: [`parse`] reads a one-dimensional array's text as PostgreSQL's `array_in` does:
//! elements between braces, split by commas, double quotes around an element that holds
//! special characters, backslash escapes, surrounding spaces dropped, and an unquoted `NULL`
//! (any case) for NULL. [`casts_as_arrays`], a pass over the parsed statement, rewrites the cast
//! of a string literal to an array type as `make_array` of each element cast to the element
//! type, so every element is converted (and checked) as a cast of its text is. A malformed
//! literal is an error that says what is wrong, as PostgreSQL's "malformed array literal". A cast
//! of text that is not a literal (a column) is left to DataFusion.

use std::ops::ControlFlow;

use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{ArrayElemTypeDef, CastKind, DataType, Expr, Value, VisitorMut};

use crate::error::QueryError;

/// The elements of a one-dimensional PostgreSQL array's text (`{a,"b c",NULL}`), `None` for NULL.
pub fn parse(text: &str) -> Result<Vec<Option<String>>, String> {
    let malformed = |why: &str| format!("malformed array literal: {text:?}: {why}");
    let inner = text.trim();
    if inner.starts_with('[') {
        return Err(malformed("dimension decorations ([1:2]=) are not supported"));
    }
    let Some(inner) = inner.strip_prefix('{').and_then(|s| s.strip_suffix('}')) else {
        return Err(malformed("an array's text starts with \"{\" and ends with \"}\""));
    };
    let mut elements = Vec::new();
    if inner.trim().is_empty() {
        return Ok(elements);
    }
    let mut chars = inner.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        let element = match chars.peek() {
            Some('"') => {
                chars.next();
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => value.push(chars.next().ok_or_else(|| malformed("unexpected end of input"))?),
                        Some(c) => value.push(c),
                        None => return Err(malformed("a quoted element is not closed")),
                    }
                }
                while chars.next_if(|c| c.is_whitespace()).is_some() {}
                Some(value)
            }
            Some('{') => return Err(malformed("arrays of more than one dimension are not supported")),
            _ => {
                // Unquoted: up to the next comma; spaces around it are not part of it, escaped
                // ones are.
                let mut kept = 0;
                while let Some(&c) = chars.peek() {
                    match c {
                        ',' => break,
                        '"' | '{' | '}' => return Err(malformed(&format!("unexpected \"{c}\" in an element"))),
                        '\\' => {
                            chars.next();
                            value.push(chars.next().ok_or_else(|| malformed("unexpected end of input"))?);
                            kept = value.len();
                        }
                        c => {
                            chars.next();
                            value.push(c);
                            if !c.is_whitespace() {
                                kept = value.len();
                            }
                        }
                    }
                }
                value.truncate(kept);
                if value.is_empty() {
                    return Err(malformed("an element is empty (write \"\" for an empty string)"));
                }
                (!value.eq_ignore_ascii_case("NULL")).then_some(value)
            }
        };
        elements.push(element);
        match chars.next() {
            None => return Ok(elements),
            Some(',') => {}
            Some(c) => return Err(malformed(&format!("unexpected \"{c}\" after an element"))),
        }
    }
}

/// Rewrites every cast of a string literal to an array type in `statement` (see the module doc).
pub fn casts_as_arrays(statement: &mut DfStatement) -> Result<(), QueryError> {
    let mut pass = CastsAsArrays { error: None };
    crate::repeated_items::visit_statement_mut(statement, &mut pass);
    pass.error.map_or(Ok(()), Err)
}

struct CastsAsArrays {
    error: Option<QueryError>,
}

impl VisitorMut for CastsAsArrays {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        let Expr::Cast { kind, expr: operand, data_type: DataType::Array(element), .. } = expr else {
            return ControlFlow::Continue(());
        };
        let element = match element {
            ArrayElemTypeDef::SquareBracket(t, _)
            | ArrayElemTypeDef::AngleBracket(t)
            | ArrayElemTypeDef::Parenthesis(t) => t.as_ref().clone(),
            ArrayElemTypeDef::None => return ControlFlow::Continue(()),
        };
        let Expr::Value(value) = operand.as_ref() else { return ControlFlow::Continue(()) };
        let text = match &value.value {
            Value::SingleQuotedString(s) | Value::EscapedStringLiteral(s) | Value::DoubleQuotedString(s) => s.clone(),
            _ => return ControlFlow::Continue(()),
        };
        let elements = match parse(&text) {
            Ok(elements) => elements,
            Err(e) => {
                self.error = Some(QueryError::Rejected(e));
                return ControlFlow::Break(());
            }
        };
        let kind = kind.clone();
        *expr = as_make_array(elements, &element, kind);
        ControlFlow::Continue(())
    }
}

/// `make_array(CAST('e1' AS element), ...)`, or an empty array of the element type.
fn as_make_array(elements: Vec<Option<String>>, element: &DataType, kind: CastKind) -> Expr {
    let cast = |expr: Expr, data_type: DataType| Expr::Cast {
        kind: kind.clone(),
        expr: Box::new(expr),
        data_type,
        array: false,
        format: None,
    };
    let args: Vec<Expr> = elements
        .into_iter()
        .map(|e| {
            let value = match e {
                Some(text) => Value::SingleQuotedString(text),
                None => Value::Null,
            };
            cast(Expr::value(value), element.clone())
        })
        .collect();
    let empty = args.is_empty();
    let call = crate::sql_ast::function_call("make_array", args);
    match empty {
        true => cast(call, DataType::Array(ArrayElemTypeDef::SquareBracket(Box::new(element.clone()), None))),
        false => call,
    }
}

#[cfg(test)]
mod tests {
    use datafusion::sql::parser::DFParser;

    use super::*;

    fn some(values: &[&str]) -> Vec<Option<String>> {
        values.iter().map(|v| Some(v.to_string())).collect()
    }

    #[test]
    fn elements_are_read_as_postgresql_reads_them() {
        assert_eq!(parse("{a,b}").unwrap(), some(&["a", "b"]));
        assert_eq!(parse(" { a , b c } ").unwrap(), some(&["a", "b c"]));
        assert_eq!(parse("{}").unwrap(), Vec::<Option<String>>::new());
        assert_eq!(parse(r#"{"",a}"#).unwrap(), some(&["", "a"]));
        assert_eq!(parse(r#"{"NULL",NULL,null}"#).unwrap(), vec![Some("NULL".to_string()), None, None]);
        assert_eq!(parse(r#"{"x\"y","a,b"," s ",c\,d}"#).unwrap(), some(&["x\"y", "a,b", " s ", "c,d"]));
        assert_eq!(parse(r"{a\ }").unwrap(), some(&["a "]));
        assert_eq!(parse("{1,2,3}").unwrap(), some(&["1", "2", "3"]));
        for bad in ["a,b", "{a", "{a,,b}", "{{1,2},{3,4}}", "[1:2]={1,2}", r#"{"a}"#, r#"{a"b"}"#, "{a} x", "{,}"] {
            let e = parse(bad).expect_err(bad);
            assert!(e.starts_with("malformed array literal"), "{bad}: {e}");
        }
    }

    fn rewritten(sql: &str) -> Result<String, QueryError> {
        let mut statement = DFParser::parse_sql(sql).expect("parse").pop_front().expect("statement");
        casts_as_arrays(&mut statement)?;
        Ok(statement.to_string())
    }

    #[test]
    fn casts_of_literals_become_arrays_of_casts() {
        assert_eq!(rewritten("SELECT '{a,\"\"}'::text[]").unwrap(), "SELECT make_array('a'::TEXT, ''::TEXT)");
        assert_eq!(
            rewritten("SELECT CAST('{1,NULL}' AS INT[])").unwrap(),
            "SELECT make_array(CAST('1' AS INT), CAST(NULL AS INT))"
        );
        assert_eq!(rewritten("SELECT '{}'::int[]").unwrap(), "SELECT make_array()::INT[]");
        // Not a literal: left as it is.
        assert_eq!(rewritten("SELECT x::text[] FROM t").unwrap(), "SELECT x::TEXT[] FROM t");
        let e = rewritten("SELECT '{a'::text[]").unwrap_err();
        assert!(e.to_string().contains("malformed array literal"), "{e}");
    }
}
