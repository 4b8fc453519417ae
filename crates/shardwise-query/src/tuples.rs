//! Row values whose first item is not a column or a literal: `(a, b) IN ((-100, 'x'), (5, 'y'))`,
//! `(a, b) = (k + 1, 'x')`.
//!
//! Why: DataFusion plans a parenthesized list only when its *first* item is a column name or a
//! literal, and refuses the rest ("Only identifiers and literals are supported in tuples"); a
//! negative number is an expression (a minus applied to a number), so `(-100, '')` was refused
//! where `('', -100)` was answered. PostgreSQL and DuckDB answer both.
//!
//! How: [`as_structs`] writes such a list as `struct(...)`, which is what DataFusion makes of the
//! others (a struct of fields `c0`, `c1`, ...), so it compares with them as before.

use std::ops::ControlFlow;

use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{Expr, VisitorMut};

/// Rewrites every such list in `statement` (see the module doc).
pub fn as_structs(statement: &mut DfStatement) {
    crate::repeated_items::visit_statement_mut(statement, &mut AsStructs);
}

struct AsStructs;

impl VisitorMut for AsStructs {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        let Expr::Tuple(items) = expr else { return ControlFlow::Continue(()) };
        let planned =
            matches!(items.first(), None | Some(Expr::Identifier(_) | Expr::CompoundIdentifier(_) | Expr::Value(_)));
        if !planned {
            *expr = crate::sql_ast::function_call("struct", std::mem::take(items));
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    fn rewritten(sql: &str) -> String {
        crate::sql_ast::rewritten_by(sql, as_structs)
    }

    #[test]
    fn only_lists_datafusion_refuses_become_structs() {
        assert_eq!(
            rewritten("SELECT 1 FROM t WHERE (a, b) IN ((-100, ''), (5, 'x'), (k + 1, 'y'))"),
            "SELECT 1 FROM t WHERE (a, b) IN (struct(-100, ''), (5, 'x'), struct(k + 1, 'y'))"
        );
    }
}
