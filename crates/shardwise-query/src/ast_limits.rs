//! A statement's nesting is bounded before it is planned (`max_ast_depth`, ClickHouse's name).
//!
//! Why: planning, optimizing and running an expression recurse once per level of its tree. The
//! SQL parser bounds the nesting of parentheses and subqueries (`datafusion.sql_parser.
//! recursion_limit`), but it builds a chain of operators (`a OR b OR c ...`, `1 + 1 + ...`) and
//! of set operations (`SELECT 0 UNION ALL SELECT 1 ...`) in a loop, to any depth: a generated
//! query of a few hundred `OR`s overflowed a thread's stack while it was planned, which aborts
//! the node (and `shardwise launch` stops the cluster with it).
//!
//! How: [`check_depth`] measures, without recursing, the longest chain of binary operators and
//! of set operations in the statement, and refuses it past the setting with an error that names
//! the setting. The threads that plan and run queries have stacks of
//! [`QUERY_THREAD_STACK_BYTES`], sized so that the default depth leaves a wide margin.

use std::ops::ControlFlow;

use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{Expr, Query, SetExpr, Visit, Visitor};

use crate::error::QueryError;

/// The stack size of the threads that plan and run queries (the server's runtime and the query
/// runtime). Untouched pages cost no memory.
pub const QUERY_THREAD_STACK_BYTES: usize = 32 << 20;

/// `Err` when a chain of operators or set operations in `statement` is deeper than `max_depth`.
pub fn check_depth(statement: &DfStatement, max_depth: u64) -> Result<(), QueryError> {
    let mut visitor = Depth { max_depth, found: 0 };
    let result = match statement {
        DfStatement::Statement(statement) => statement.visit(&mut visitor),
        DfStatement::Explain(explain) => match explain.statement.as_ref() {
            DfStatement::Statement(statement) => statement.visit(&mut visitor),
            _ => ControlFlow::Continue(()),
        },
        _ => ControlFlow::Continue(()),
    };
    match result {
        ControlFlow::Continue(()) => Ok(()),
        ControlFlow::Break(what) => Err(QueryError::Rejected(format!(
            "the statement nests {what} {} deep, more than max_ast_depth = {max_depth}: write long \
             lists of alternatives as `x IN (...)`, or raise the setting (SET max_ast_depth = ...)",
            visitor.found
        ))),
    }
}

struct Depth {
    max_depth: u64,
    found: u64,
}

impl Visitor for Depth {
    type Break = &'static str;

    /// Called on the outermost operator of a chain first, so a chain too deep is refused before
    /// the visitor descends into it.
    fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<Self::Break> {
        let depth = operator_chain(expr);
        if depth > self.max_depth {
            self.found = depth;
            return ControlFlow::Break("operators");
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<Self::Break> {
        let depth = set_operation_chain(&query.body);
        if depth > self.max_depth {
            self.found = depth;
            return ControlFlow::Break("set operations (UNION, INTERSECT, EXCEPT)");
        }
        ControlFlow::Continue(())
    }
}

/// The longest path of binary and unary operators below `expr` along the left and right
/// spines (how the parser builds chains), counted in a loop. Nesting through anything else
/// passes the parser's own recursion limit.
fn operator_chain(expr: &Expr) -> u64 {
    let mut deepest = 0;
    let mut stack: Vec<(&Expr, u64)> = vec![(expr, 0)];
    while let Some((e, depth)) = stack.pop() {
        deepest = deepest.max(depth);
        match e {
            Expr::BinaryOp { left, right, .. } => {
                stack.push((left, depth + 1));
                stack.push((right, depth + 1));
            }
            Expr::UnaryOp { expr, .. } | Expr::Nested(expr) => stack.push((expr, depth + 1)),
            _ => {}
        }
    }
    deepest
}

/// The longest path of set operations below `body`, counted in a loop.
fn set_operation_chain(body: &SetExpr) -> u64 {
    let mut deepest = 0;
    let mut stack: Vec<(&SetExpr, u64)> = vec![(body, 0)];
    while let Some((e, depth)) = stack.pop() {
        deepest = deepest.max(depth);
        if let SetExpr::SetOperation { left, right, .. } = e {
            stack.push((left, depth + 1));
            stack.push((right, depth + 1));
        }
    }
    deepest
}

#[cfg(test)]
mod tests {
    use datafusion::sql::parser::DFParser;

    use super::*;

    fn parsed(sql: &str) -> DfStatement {
        let mut statements = DFParser::parse_sql(sql).expect("parse");
        statements.pop_front().expect("a statement")
    }

    #[test]
    fn long_chains_are_refused_naming_the_setting() {
        let ors = (0..2000).map(|i| format!("a = {i}")).collect::<Vec<_>>().join(" OR ");
        let statement = parsed(&format!("SELECT count(*) FROM t WHERE {ors}"));
        let err = check_depth(&statement, 1000).expect_err("too deep").to_string();
        assert!(err.contains("operators 2000 deep") && err.contains("max_ast_depth = 1000"), "{err}");
        assert!(check_depth(&statement, 2000).is_ok());
        let union = (0..1500).map(|i| format!("SELECT {i}")).collect::<Vec<_>>().join(" UNION ALL ");
        let err = check_depth(&parsed(&union), 1000).expect_err("too deep").to_string();
        assert!(err.contains("set operations"), "{err}");
        let err = check_depth(&parsed(&format!("EXPLAIN {union}")), 1000).expect_err("too deep").to_string();
        assert!(err.contains("set operations"), "{err}");
    }

    #[test]
    fn ordinary_statements_pass() {
        let statement = parsed("SELECT a + b * (c - 1), (SELECT 1 UNION SELECT 2) FROM t WHERE NOT (a = 1 AND b = 2)");
        assert!(check_depth(&statement, 1000).is_ok());
        assert_eq!(operator_chain(&Expr::value(datafusion::sql::sqlparser::ast::Value::Boolean(true))), 0);
    }
}
