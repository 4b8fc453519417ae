//! Operators as PostgreSQL (and DuckDB) read them, where the SQL parser DataFusion uses reads
//! them otherwise, silently: wrong answers without an error.
//!
//! - `a IS [NOT] DISTINCT FROM b AND c` is `(a IS DISTINCT FROM b) AND c`. The parser (sqlparser
//!   0.62) reads the right side of the test as a whole expression, so `AND` and `OR` after it
//!   bound inside: `b IS NOT DISTINCT FROM true AND k > 5` was planned as `b IS NOT DISTINCT FROM
//!   (true AND k > 5)` (and failed on a type error where the sides are not booleans). `IS` binds
//!   tighter than `NOT`, `AND` and `OR`, and looser than comparisons (`a IS DISTINCT FROM b = c`
//!   is `a IS DISTINCT FROM (b = c)`, as parsed). Where the right side is an unparenthesized
//!   `AND`, `OR` or `XOR`, the test takes that operator's left operand only (recursively, down its
//!   left side) and the operator moves above it; a parenthesized right side (`IS DISTINCT FROM
//!   (x AND y)`) is a `Nested` expression and stays.
//! - `a ^ b` is `a` to the power `b` (`2 ^ 3` is 8), not a bitwise XOR (1): the parser's generic
//!   dialect reads `^` as XOR, its PostgreSQL dialect as the power, which DataFusion plans as
//!   `power(a, b)`.
//! - `mod(a, b)` is `(a % b)`, PostgreSQL's function for the remainder, which DataFusion lacks.
//! - `to_char(ts, 'YYYY-MM-DD HH24:MI:SS')`, `to_date(s, 'YYYY-MM-DD')`, `to_timestamp(s,
//!   'YYYY-MM-DD HH24:MI:SS')`: PostgreSQL's template patterns become the chrono format
//!   DataFusion's functions take (`to_char` answered the template itself, for every row; the
//!   others failed, blaming the input).
//! - `LIKE 'a!%' ESCAPE '!'`: a literal pattern escaped by another character than the backslash
//!   becomes the same pattern escaped by backslashes (DataFusion refused the ESCAPE clause).
//!
//! - `substring(s FROM 'pattern')` is the pattern's first match, as in PostgreSQL.
//! - `x IN (VALUES (1), (2))` is the list `x IN (1, 2)` (DataFusion refused it).
//! - `INTERVAL '1 day' * n` and `/ n` scale the interval ([`crate::interval_scaling`]).
//! - `x op ANY(array)` answers NULL where a NULL element leaves it unknown ([`crate::any_nulls`]).
//!
//! [`bind_as_postgres`] applies both to a parsed statement before planning.

use std::ops::ControlFlow;

use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{
    BinaryOperator, Expr, Function, FunctionArg, FunctionArgExpr, FunctionArguments, VisitorMut,
};

/// Reads the operators of `statement` as PostgreSQL does (see the module doc).
pub fn bind_as_postgres(statement: &mut DfStatement) {
    crate::repeated_items::visit_statement_mut(statement, &mut Rebind);
}

struct Rebind;

/// PostgreSQL's array functions that act on every match, and DataFusion's functions that do.
const ALL_MATCHES: [(&str, &str); 2] = [("array_remove", "array_remove_all"), ("array_replace", "array_replace_all")];

/// `left IS [NOT] DISTINCT FROM right` (`make`), with the boolean operators at the top of
/// `right` moved above the test.
fn rebound(make: fn(Box<Expr>, Box<Expr>) -> Expr, left: Box<Expr>, right: Box<Expr>) -> Expr {
    match *right {
        Expr::BinaryOp {
            left: inner,
            op: op @ (BinaryOperator::And | BinaryOperator::Or | BinaryOperator::Xor),
            right: rest,
        } => Expr::BinaryOp { left: Box::new(rebound(make, left, inner)), op, right: rest },
        other => make(left, Box::new(other)),
    }
}

/// `mod(a, b)` as `(a % b)`; any other call to `mod` as written.
fn modulo(f: Function) -> Expr {
    if let FunctionArguments::List(list) = &f.args
        && let [FunctionArg::Unnamed(FunctionArgExpr::Expr(a)), FunctionArg::Unnamed(FunctionArgExpr::Expr(b))] =
            list.args.as_slice()
        && f.over.is_none()
        && f.filter.is_none()
    {
        let remainder =
            Expr::BinaryOp { left: Box::new(a.clone()), op: BinaryOperator::Modulo, right: Box::new(b.clone()) };
        return Expr::Nested(Box::new(remainder));
    }
    Expr::Function(f)
}

/// PostgreSQL's template patterns and the chrono specifiers DataFusion's `to_char` reads, the
/// longer of two that start alike first.
const PATTERNS: [(&str, &str); 21] = [
    ("YYYY", "%Y"),
    ("YY", "%y"),
    ("MONTH", "%B"),
    ("Month", "%B"),
    ("MON", "%b"),
    ("Mon", "%b"),
    ("MM", "%m"),
    ("DDD", "%j"),
    ("DD", "%d"),
    ("DAY", "%A"),
    ("Day", "%A"),
    ("DY", "%a"),
    ("Dy", "%a"),
    ("HH24", "%H"),
    ("HH12", "%I"),
    ("HH", "%I"),
    ("MI", "%M"),
    ("SS", "%S"),
    ("MS", "%3f"),
    ("US", "%6f"),
    ("AM", "%p"),
];

/// `to_char(value, 'YYYY-MM-DD HH24:MI:SS')`: a literal template without `%` (so not already
/// chrono's) in PostgreSQL's patterns, read as the chrono format DataFusion takes; DataFusion
/// answered the template itself. Text in double quotes is copied as it is, as in PostgreSQL.
fn postgres_pattern(f: &mut Function) {
    use datafusion::sql::sqlparser::ast::Value;
    let FunctionArguments::List(list) = &mut f.args else { return };
    let Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Value(template)))) = list.args.get_mut(1) else {
        return;
    };
    let Value::SingleQuotedString(text) = &mut template.value else { return };
    if text.contains('%') {
        return;
    }
    let mut out = String::with_capacity(text.len() * 2);
    let mut rest = text.as_str();
    while let Some(c) = rest.chars().next() {
        if c == '"' {
            let quoted = &rest[1..];
            let end = quoted.find('"').unwrap_or(quoted.len());
            out.push_str(&quoted[..end]);
            rest = quoted.get(end + 1..).unwrap_or("");
            continue;
        }
        match PATTERNS.iter().find(|(pattern, _)| rest.starts_with(pattern)) {
            Some((pattern, chrono)) => {
                out.push_str(chrono);
                rest = &rest[pattern.len()..];
            }
            None => {
                out.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
    }
    *text = out;
}

/// `LIKE 'a!%b' ESCAPE '!'`: a pattern with another escape character than the backslash (the
/// only one DataFusion takes) as the same pattern escaped by backslashes, without the ESCAPE
/// clause: a literal translated here, anything else by `shardwise_like_pattern` as it runs
/// (see `crate::like_escape`).
fn escaped_by_backslash(
    pattern: &mut Box<Expr>,
    escape_char: &mut Option<datafusion::sql::sqlparser::ast::ValueWithSpan>,
) {
    use datafusion::sql::sqlparser::ast::Value;
    let Some(escape_value) = escape_char.as_ref() else { return };
    let Value::SingleQuotedString(escape) = &escape_value.value else { return };
    let mut chars = escape.chars();
    let (Some(escape), None) = (chars.next(), chars.next()) else { return };
    if escape == '\\' {
        return;
    }
    match pattern.as_mut() {
        Expr::Value(value) if matches!(value.value, Value::SingleQuotedString(_)) => {
            if let Value::SingleQuotedString(text) = &mut value.value {
                *text = crate::like_escape::backslash_escaped(text, escape);
            }
        }
        other => {
            let escape_literal = Expr::Value(escape_value.clone());
            let taken = std::mem::replace(other, Expr::Value(Value::Null.into()));
            *other = crate::sql_ast::function_call(crate::like_escape::FUNCTION_NAME, vec![taken, escape_literal]);
        }
    }
    *escape_char = None;
}

/// Whether `e` is a string literal that is not a number: a pattern after `substring(s FROM`.
fn regex_literal(e: &Expr) -> bool {
    use datafusion::sql::sqlparser::ast::Value;
    matches!(e, Expr::Value(v) if matches!(&v.value, Value::SingleQuotedString(text) if text.trim().parse::<i64>().is_err()))
}

/// `regexp_match(value, pattern)[1]`: the first capture group of the first match, or the whole
/// match when the pattern has no group; NULL without a match (PostgreSQL's `substring(s FROM
/// pattern)`).
fn first_match(value: Expr, pattern: Expr) -> Expr {
    let one = Expr::Value(datafusion::sql::sqlparser::ast::Value::Number("1".to_string(), false).into());
    crate::sql_ast::function_call(
        "array_element",
        vec![crate::sql_ast::function_call("regexp_match", vec![value, pattern]), one],
    )
}

/// The one-column rows of a bare `VALUES` query (no ORDER BY, LIMIT or WITH), as a list.
fn values_as_list(query: &datafusion::sql::sqlparser::ast::Query) -> Option<Vec<Expr>> {
    use datafusion::sql::sqlparser::ast::SetExpr;
    if query.with.is_some() || query.order_by.is_some() || query.limit_clause.is_some() || query.fetch.is_some() {
        return None;
    }
    let SetExpr::Values(values) = query.body.as_ref() else { return None };
    values
        .rows
        .iter()
        .map(|row| match row.content.as_slice() {
            [one] => Some(one.clone()),
            _ => None,
        })
        .collect()
}

impl VisitorMut for Rebind {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        let placeholder = Expr::Value(datafusion::sql::sqlparser::ast::Value::Null.into());
        match std::mem::replace(expr, placeholder) {
            Expr::IsDistinctFrom(left, right) => *expr = rebound(Expr::IsDistinctFrom, left, right),
            Expr::IsNotDistinctFrom(left, right) => *expr = rebound(Expr::IsNotDistinctFrom, left, right),
            Expr::BinaryOp { left, op: BinaryOperator::BitwiseXor, right } => {
                *expr = Expr::BinaryOp { left, op: BinaryOperator::PGExp, right }
            }
            Expr::Function(f) if f.name.to_string().eq_ignore_ascii_case("mod") => *expr = modulo(f),
            Expr::Like { negated, any, expr: value, mut pattern, mut escape_char } => {
                escaped_by_backslash(&mut pattern, &mut escape_char);
                *expr = Expr::Like { negated, any, expr: value, pattern, escape_char }
            }
            Expr::ILike { negated, any, expr: value, mut pattern, mut escape_char } => {
                escaped_by_backslash(&mut pattern, &mut escape_char);
                *expr = Expr::ILike { negated, any, expr: value, pattern, escape_char }
            }
            // PostgreSQL's `array_remove` and `array_replace` act on every match; DataFusion's
            // on the first (its `_all` forms act on every one).
            Expr::Function(mut f) if ALL_MATCHES.iter().any(|(pg, _)| f.name.to_string().eq_ignore_ascii_case(pg)) => {
                let name = f.name.to_string();
                if let Some((_, all)) = ALL_MATCHES.iter().find(|(pg, _)| name.eq_ignore_ascii_case(pg)) {
                    f.name = datafusion::sql::sqlparser::ast::ObjectName::from(vec![
                        datafusion::sql::sqlparser::ast::Ident::new(*all),
                    ]);
                }
                *expr = Expr::Function(f);
            }
            Expr::Function(mut f)
                if ["to_char", "to_date", "to_timestamp"]
                    .iter()
                    .any(|n| f.name.to_string().eq_ignore_ascii_case(n)) =>
            {
                postgres_pattern(&mut f);
                *expr = Expr::Function(f);
            }
            // `INTERVAL '1 day' * n` (see `crate::interval_scaling`).
            e @ Expr::BinaryOp { op: BinaryOperator::Multiply | BinaryOperator::Divide, .. } => {
                *expr = crate::interval_scaling::with_interval_scaling(e)
            }
            // `x IN (VALUES (1), (2))` as the list `x IN (1, 2)`, which DataFusion refused
            // ("single expression required").
            Expr::InSubquery { expr: value, subquery, negated } => {
                *expr = match values_as_list(&subquery) {
                    Some(list) => Expr::InList { expr: value, list, negated },
                    None => Expr::InSubquery { expr: value, subquery, negated },
                }
            }
            // `substring(s FROM 'regex')`: the first match (or its first group), as PostgreSQL
            // reads a text after FROM; DataFusion read it as a position and refused it.
            Expr::Substring {
                expr: value,
                substring_from: Some(from),
                substring_for: None,
                special: false,
                shorthand,
            } => {
                *expr = match regex_literal(&from) {
                    true => first_match(*value, *from),
                    false => Expr::Substring {
                        expr: value,
                        substring_from: Some(from),
                        substring_for: None,
                        special: false,
                        shorthand,
                    },
                }
            }
            // `x op ANY(array)` with SQL's NULLs (see `crate::any_nulls`).
            e @ (Expr::AnyOp { .. } | Expr::AllOp { .. }) => *expr = crate::any_nulls::with_null_semantics(e),
            other => *expr = other,
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::sql::sqlparser::ast::{SelectItem, SetExpr, Statement};
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::parser::Parser;

    /// The first SELECT item of `sql` after the rebinding.
    fn first_item(sql: &str) -> Expr {
        let statement = Parser::parse_sql(&PostgreSqlDialect {}, sql).expect("parses").remove(0);
        let mut statement = DfStatement::Statement(Box::new(statement));
        bind_as_postgres(&mut statement);
        let DfStatement::Statement(statement) = statement else { unreachable!("a statement") };
        let Statement::Query(query) = *statement else { unreachable!("a query") };
        let SetExpr::Select(select) = *query.body else { unreachable!("a select") };
        match select.projection.into_iter().next() {
            Some(SelectItem::UnnamedExpr(e)) => e,
            other => unreachable!("{other:?}"),
        }
    }

    #[test]
    fn and_or_after_the_test_bind_outside_it() {
        // ((a IS DISTINCT FROM b) AND c) OR d
        let Expr::BinaryOp { left: and, op: BinaryOperator::Or, .. } =
            first_item("SELECT a IS DISTINCT FROM b AND c OR d")
        else {
            panic!("OR on top")
        };
        let Expr::BinaryOp { left: test, op: BinaryOperator::And, .. } = *and else { panic!("AND under it") };
        assert_eq!(test.to_string(), "a IS DISTINCT FROM b");
        let Expr::BinaryOp { left: test, op: BinaryOperator::And, .. } =
            first_item("SELECT a IS NOT DISTINCT FROM true AND k > 5")
        else {
            panic!("AND on top")
        };
        assert!(matches!(*test, Expr::IsNotDistinctFrom(..)), "{test}");
        // Parenthesized, and a comparison, stay on the right.
        assert!(matches!(first_item("SELECT a IS DISTINCT FROM (b AND c)"), Expr::IsDistinctFrom(..)));
        assert!(matches!(first_item("SELECT a IS DISTINCT FROM b = c"), Expr::IsDistinctFrom(..)));
    }

    #[test]
    fn substring_from_a_pattern_is_its_first_match() {
        assert_eq!(
            first_item("SELECT substring(s FROM '[0-9]+')").to_string(),
            "array_element(regexp_match(s, '[0-9]+'), 1)"
        );
        assert_eq!(first_item("SELECT substring(s FROM 2)").to_string(), "SUBSTRING(s FROM 2)");
        assert_eq!(first_item("SELECT substring(s FROM '2')").to_string(), "SUBSTRING(s FROM '2')");
        assert_eq!(first_item("SELECT substring(s FROM 'a' FOR 2)").to_string(), "SUBSTRING(s FROM 'a' FOR 2)");
    }

    #[test]
    fn like_escape_of_a_pattern_that_is_not_a_literal() {
        assert_eq!(
            first_item("SELECT s NOT LIKE p || '%' ESCAPE '/'").to_string(),
            "s NOT LIKE shardwise_like_pattern(p || '%', '/')"
        );
        assert_eq!(first_item("SELECT s LIKE 'a/%' ESCAPE '/'").to_string(), "s LIKE 'a\\%'");
    }

    #[test]
    fn in_values_is_a_list() {
        assert_eq!(first_item("SELECT k IN (VALUES (1), (2))").to_string(), "k IN (1, 2)");
        assert_eq!(first_item("SELECT k NOT IN (VALUES (1))").to_string(), "k NOT IN (1)");
        assert_eq!(first_item("SELECT k IN (VALUES (1, 2))").to_string(), "k IN (VALUES (1, 2))");
    }

    #[test]
    fn postgres_templates_in_to_date_and_to_timestamp() {
        assert_eq!(first_item("SELECT to_date(s, 'YYYY-MM-DD')").to_string(), "to_date(s, '%Y-%m-%d')");
        assert_eq!(
            first_item("SELECT to_timestamp(s, 'YYYY-MM-DD HH24:MI:SS')").to_string(),
            "to_timestamp(s, '%Y-%m-%d %H:%M:%S')"
        );
        // A chrono format, and epoch seconds, as written.
        assert_eq!(first_item("SELECT to_date(s, '%Y')").to_string(), "to_date(s, '%Y')");
        assert_eq!(first_item("SELECT to_timestamp(5)").to_string(), "to_timestamp(5)");
    }

    #[test]
    fn array_remove_and_replace_act_on_every_match() {
        assert_eq!(first_item("SELECT array_remove(a, 1)").to_string(), "array_remove_all(a, 1)");
        assert_eq!(first_item("SELECT ARRAY_REPLACE(a, 1, 2)").to_string(), "array_replace_all(a, 1, 2)");
        assert_eq!(first_item("SELECT array_remove_all(a, 1)").to_string(), "array_remove_all(a, 1)");
    }

    #[test]
    fn caret_is_the_power() {
        // The statements here are parsed in PostgreSQL's dialect, the engine's in the generic one.
        let statement = Parser::parse_sql(&datafusion::sql::sqlparser::dialect::GenericDialect {}, "SELECT 2 ^ 3")
            .expect("parses")
            .remove(0);
        let mut statement = DfStatement::Statement(Box::new(statement));
        bind_as_postgres(&mut statement);
        assert!(format!("{statement:?}").contains("PGExp"), "{statement:?}");
    }
}
