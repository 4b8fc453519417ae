//! `SELECT generate_series(1, 3)` answers three rows, as in PostgreSQL, where a set-returning
//! function in a SELECT list makes a row for each of its values.
//!
//! Why: DataFusion's `generate_series` in a SELECT list is a scalar function answering one list
//! (`[1, 2, 3]`), a single row where PostgreSQL users expect three (its table function form,
//! `FROM generate_series(1, 3)`, is a table already).
//!
//! How: [`rows_of_set_returning_items`], a pass over the parsed statement, writes a SELECT item
//! that is a call of `generate_series` as `unnest(generate_series(...))`, named
//! `generate_series` (PostgreSQL's name for it) unless it has an alias. A call inside a larger
//! expression is left as it is.

use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{Expr, Ident, SelectItem};

/// Rewrites `statement` (see the module doc).
pub fn rows_of_set_returning_items(statement: &mut DfStatement) {
    crate::repeated_items::visit_statement_mut(
        statement,
        &mut crate::repeated_items::EachSelectList(|items| items.iter_mut().for_each(rows_of)),
    );
}

fn is_series(e: &Expr) -> bool {
    matches!(e, Expr::Function(f) if f.over.is_none() && f.name.to_string().eq_ignore_ascii_case("generate_series"))
}

fn rows_of(item: &mut SelectItem) {
    match item {
        SelectItem::UnnamedExpr(e) if is_series(e) => {
            let call = crate::sql_ast::function_call("unnest", vec![e.clone()]);
            *item = SelectItem::ExprWithAlias { expr: call, alias: Ident::new("generate_series") };
        }
        SelectItem::ExprWithAlias { expr, .. } if is_series(expr) => {
            *expr = crate::sql_ast::function_call("unnest", vec![expr.clone()]);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewritten(sql: &str) -> String {
        crate::sql_ast::rewritten_by(sql, rows_of_set_returning_items)
    }

    #[test]
    fn series_items_become_rows() {
        assert_eq!(
            rewritten("SELECT generate_series(1, 3)"),
            "SELECT unnest(generate_series(1, 3)) AS generate_series"
        );
        assert_eq!(
            rewritten("SELECT k, generate_series(1, k) AS i FROM t"),
            "SELECT k, unnest(generate_series(1, k)) AS i FROM t"
        );
        // Its table form, and a call inside an expression, as written.
        assert_eq!(rewritten("SELECT * FROM generate_series(1, 3)"), "SELECT * FROM generate_series(1, 3)");
        assert_eq!(rewritten("SELECT cardinality(generate_series(1, 3))"), "SELECT cardinality(generate_series(1, 3))");
    }
}
