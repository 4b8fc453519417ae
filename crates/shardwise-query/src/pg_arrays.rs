//! PostgreSQL's `ARRAY(subquery)` in clients' catalog queries, as DataFusion can plan it.
//!
//! Why: psql's `\du` lists each role's memberships as `ARRAY(SELECT b.rolname FROM
//! pg_auth_members m JOIN pg_roles b ... WHERE m.member = r.oid)`, and `\d+ t` reads a table's
//! options as `c.reloptions || array(select 'toast.' || x from unnest(tc.reloptions) x)`.
//! DataFusion has no `ARRAY(subquery)` ("Invalid function 'array'"), so both commands failed.
//!
//! How: [`rewrite`] changes a catalog statement's syntax tree (`crate::pg_catalog` calls it):
//! - `ARRAY(SELECT e FROM ... [ORDER BY o])` becomes the scalar subquery `(SELECT array_agg(e
//!   [ORDER BY o]) FROM ...)`, which DataFusion runs correlated or not. One difference remains:
//!   over no rows PostgreSQL's `ARRAY()` is an empty array and `array_agg` is NULL.
//! - `ARRAY(SELECT ... FROM unnest(<reloptions or relacl>) ...)` becomes an empty text array:
//!   those `pg_class` columns are NULL on every row here (`crate::pg_catalog_tables`), so the
//!   subquery has no row, and DataFusion cannot unnest a column of the outer query.
//!
//! Any other `ARRAY(...)` (a set operation, `DISTINCT`, `GROUP BY`, several columns) is left as
//! it is, and fails as before.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    Expr, FunctionArg, FunctionArgExpr, FunctionArguments, GroupByExpr, ObjectNamePart, OrderByKind, Query, SelectItem,
    SetExpr, Statement, TableFactor, VisitMut, VisitorMut,
};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;

/// `pg_class` columns that are NULL on every row here (`crate::pg_catalog_tables`).
const ALWAYS_NULL_ARRAYS: [&str; 2] = ["reloptions", "relacl"];

/// `statement` with its `ARRAY(subquery)` expressions planned as the module doc says.
pub fn rewrite(mut statement: Statement) -> Statement {
    let _ = statement.visit(&mut Arrays);
    statement
}

struct Arrays;

impl VisitorMut for Arrays {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        if let Some(replacement) = array_subquery(expr) {
            *expr = replacement;
        }
        ControlFlow::Continue(())
    }
}

fn parsed(sql: &str) -> Option<Expr> {
    Parser::new(&PostgreSqlDialect {}).try_with_sql(sql).ok()?.parse_expr().ok()
}

/// The replacement of `expr`, when it is an `ARRAY(subquery)` of a form the module doc names.
fn array_subquery(expr: &Expr) -> Option<Expr> {
    let Expr::Function(function) = expr else { return None };
    let last = function.name.0.last()?;
    let ObjectNamePart::Identifier(name) = last else { return None };
    let FunctionArguments::Subquery(query) = &function.args else { return None };
    if !name.value.eq_ignore_ascii_case("array") {
        return None;
    }
    let SetExpr::Select(select) = query.body.as_ref() else { return None };
    let plain = query.with.is_none()
        && query.limit_clause.is_none()
        && query.fetch.is_none()
        && select.distinct.is_none()
        && select.having.is_none()
        && matches!(&select.group_by, GroupByExpr::Expressions(e, m) if e.is_empty() && m.is_empty());
    let [item] = select.projection.as_slice() else { return None };
    let element = match item {
        SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => e,
        _ => return None,
    };
    if !plain {
        return None;
    }
    if unnests_an_always_null_column(select.from.iter().map(|t| &t.relation)) {
        return parsed("CAST(make_array() AS TEXT[])");
    }
    let order = match query.order_by.as_ref().map(|o| &o.kind) {
        None => String::new(),
        Some(OrderByKind::Expressions(exprs)) if !exprs.is_empty() => {
            format!(" ORDER BY {}", exprs.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))
        }
        Some(_) => return None,
    };
    let mut aggregated: Query = query.as_ref().clone();
    aggregated.order_by = None;
    let SetExpr::Select(select) = aggregated.body.as_mut() else { return None };
    select.projection = vec![SelectItem::UnnamedExpr(parsed(&format!("array_agg({element}{order})"))?)];
    Some(Expr::Subquery(Box::new(aggregated)))
}

/// Whether a FROM list is one `unnest(<a column of ALWAYS_NULL_ARRAYS>)`, however qualified.
fn unnests_an_always_null_column<'a>(mut from: impl Iterator<Item = &'a TableFactor>) -> bool {
    let (Some(TableFactor::Table { name, args: Some(args), .. }), None) = (from.next(), from.next()) else {
        return false;
    };
    let is_unnest =
        matches!(name.0.last(), Some(ObjectNamePart::Identifier(i)) if i.value.eq_ignore_ascii_case("unnest"));
    let column = match args.args.as_slice() {
        [FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::CompoundIdentifier(parts)))] => parts.last(),
        [FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Identifier(i)))] => Some(i),
        _ => None,
    };
    is_unnest && column.is_some_and(|c| ALWAYS_NULL_ARRAYS.iter().any(|n| c.value.eq_ignore_ascii_case(n)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewritten(sql: &str) -> String {
        let statement = Parser::parse_sql(&PostgreSqlDialect {}, sql).expect("parses").remove(0);
        rewrite(statement).to_string()
    }

    #[test]
    fn an_array_subquery_becomes_an_aggregate_in_a_scalar_subquery() {
        let out = rewritten(
            "SELECT r.rolname, ARRAY(SELECT b.rolname FROM pg_auth_members m JOIN pg_roles b ON (m.roleid = b.oid) \
             WHERE m.member = r.oid ORDER BY 1) AS memberof FROM pg_roles r",
        );
        assert!(
            out.contains("(SELECT array_agg(b.rolname ORDER BY 1) FROM pg_auth_members AS m JOIN")
                || out.contains("(SELECT array_agg(b.rolname ORDER BY 1) FROM pg_auth_members m JOIN"),
            "{out}"
        );
        assert!(!out.to_ascii_uppercase().contains("ARRAY(SELECT"), "{out}");
    }

    #[test]
    fn psqls_toast_options_are_an_empty_array() {
        let out = rewritten(
            "SELECT array_to_string(c.reloptions || array(select 'toast.' || x from pg_catalog.unnest(tc.reloptions) \
             x), ', ') FROM pg_class c LEFT JOIN pg_class tc ON (c.reltoastrelid = tc.oid)",
        );
        assert!(out.contains("c.reloptions || CAST(make_array() AS TEXT[])"), "{out}");
    }

    #[test]
    fn other_forms_are_left_alone() {
        for sql in [
            "SELECT ARRAY(SELECT a FROM t UNION SELECT b FROM u)",
            "SELECT ARRAY(SELECT DISTINCT a FROM t)",
            "SELECT ARRAY(SELECT a, b FROM t)",
            "SELECT ARRAY(SELECT a FROM t LIMIT 2)",
            "SELECT ARRAY[1, 2]",
        ] {
            let statement = Parser::parse_sql(&PostgreSqlDialect {}, sql).expect("parses").remove(0);
            assert_eq!(rewrite(statement.clone()), statement, "{sql}");
        }
    }
}
