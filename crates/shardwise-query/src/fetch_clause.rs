//! `FETCH FIRST n ROWS ONLY` (the SQL standard's LIMIT, which PostgreSQL, DB2 and Oracle
//! users write) runs as `LIMIT n`.
//!
//! Why: DataFusion parses the clause and refuses it ("FETCH clause is not supported yet").
//!
//! How: [`fetch_as_limit`], a pass over the parsed statement, moves the row count of a `FETCH
//! FIRST | NEXT [n] ROW[S] ONLY` (1 when absent, as the standard says) into the query's LIMIT,
//! keeping its OFFSET. `WITH TIES` and `PERCENT` are left to DataFusion, which refuses them.

use std::ops::ControlFlow;

use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{Expr, LimitClause, Query, Value, VisitorMut};

/// Rewrites `statement` (see the module doc).
pub fn fetch_as_limit(statement: &mut DfStatement) {
    crate::repeated_items::visit_statement_mut(statement, &mut FetchAsLimit);
}

struct FetchAsLimit;

impl VisitorMut for FetchAsLimit {
    type Break = ();

    fn pre_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
        let Some(fetch) = &query.fetch else { return ControlFlow::Continue(()) };
        if fetch.with_ties || fetch.percent {
            return ControlFlow::Continue(());
        }
        let count = fetch.quantity.clone().unwrap_or_else(|| Expr::value(Value::Number("1".into(), false)));
        match query.limit_clause.take() {
            None => {
                query.limit_clause =
                    Some(LimitClause::LimitOffset { limit: Some(count), offset: None, limit_by: vec![] })
            }
            Some(LimitClause::LimitOffset { limit: None, offset, limit_by }) => {
                query.limit_clause = Some(LimitClause::LimitOffset { limit: Some(count), offset, limit_by })
            }
            // Both LIMIT and FETCH: left for DataFusion to refuse.
            other => {
                query.limit_clause = other;
                return ControlFlow::Continue(());
            }
        }
        query.fetch = None;
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    fn rewritten(sql: &str) -> String {
        crate::sql_ast::rewritten_by(sql, fetch_as_limit)
    }

    #[test]
    fn fetch_becomes_limit() {
        assert_eq!(
            rewritten("SELECT a FROM t ORDER BY a FETCH FIRST 3 ROWS ONLY"),
            "SELECT a FROM t ORDER BY a LIMIT 3"
        );
        assert_eq!(
            rewritten("SELECT a FROM t ORDER BY a OFFSET 2 ROWS FETCH NEXT 3 ROWS ONLY"),
            "SELECT a FROM t ORDER BY a LIMIT 3 OFFSET 2 ROWS"
        );
        assert_eq!(rewritten("SELECT a FROM t FETCH FIRST ROW ONLY"), "SELECT a FROM t LIMIT 1");
        let ties = "SELECT a FROM t ORDER BY a FETCH FIRST 3 ROWS WITH TIES";
        assert!(rewritten(ties).contains("WITH TIES"));
    }
}
