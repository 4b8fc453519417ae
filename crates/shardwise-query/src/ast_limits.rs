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

/// `error`, a parse failure of `sql`, as the parser's recursion limit when that is what it is.
///
/// The parser reports nesting past `datafusion.sql_parser.recursion_limit` as such for
/// parentheses, but a `CASE` nested that deep fails while the parser tries another reading, as
/// a syntax error at a valid token (`found: 0 at Column 18`). So a syntax error in a statement
/// whose `CASE`s and parentheses nest within a few levels of the limit is reported as the limit.
pub fn explain_parse_failure(
    error: datafusion::error::DataFusionError,
    sql: &str,
    recursion_limit: usize,
) -> datafusion::error::DataFusionError {
    use datafusion::error::DataFusionError;
    use datafusion::sql::sqlparser::parser::ParserError;
    // DataFusion wraps some parser errors with a diagnostic: the error inside.
    let mut inner = &error;
    while let DataFusionError::Diagnostic(_, wrapped) = inner {
        inner = wrapped;
    }
    let syntax = matches!(inner, DataFusionError::SQL(e, _) if matches!(e.as_ref(), ParserError::ParserError(_)));
    match syntax && nesting_depth(sql) + RECURSION_LIMIT_MARGIN >= recursion_limit {
        true => DataFusionError::SQL(Box::new(ParserError::RecursionLimitExceeded), None),
        false => error,
    }
}

/// How close to the parser's recursion limit a statement's nesting must come for a syntax error
/// in it to be taken as the limit (a level of `CASE` costs the parser about one of its levels,
/// plus a few for the statement around it).
const RECURSION_LIMIT_MARGIN: usize = 5;

/// The deepest nesting of parentheses and `CASE ... END` in `sql`, from its tokens.
fn nesting_depth(sql: &str) -> usize {
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::keywords::Keyword;
    use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
    let Ok(tokens) = Tokenizer::new(&GenericDialect {}, sql).tokenize() else { return 0 };
    let (mut depth, mut deepest) = (0usize, 0usize);
    for token in tokens {
        match token {
            Token::LParen => depth += 1,
            Token::Word(w) if w.keyword == Keyword::CASE => depth += 1,
            Token::RParen => depth = depth.saturating_sub(1),
            Token::Word(w) if w.keyword == Keyword::END => depth = depth.saturating_sub(1),
            _ => {}
        }
        deepest = deepest.max(depth);
    }
    deepest
}

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

    /// A `CASE` nested past the parser's limit is named as the limit, not as a syntax error at a
    /// valid token; a real syntax error stays one.
    #[test]
    fn deeply_nested_case_is_the_recursion_limit() {
        let nested = |depth: usize| {
            let cases: String = (0..depth).map(|i| format!("CASE WHEN {i} = 1 THEN {i} ELSE ")).collect();
            format!("SELECT {cases}0{} AS x", " END".repeat(depth))
        };
        let ctx = datafusion::prelude::SessionContext::new();
        let limit: usize = ctx.state().config().options().sql_parser.recursion_limit.into();
        let parse = |sql: &str| {
            let state = ctx.state();
            let dialect = state.config().options().sql_parser.dialect;
            state.sql_to_statement(sql, &dialect).map(drop).map_err(|e| explain_parse_failure(e, sql, limit))
        };
        assert!(parse(&nested(10)).is_ok());
        let e = parse(&nested(limit)).expect_err("past the limit").to_string();
        assert!(e.contains("RecursionLimitExceeded"), "{e}");
        let e = parse("SELECT CASE WHEN 1 THEN END").expect_err("no result").to_string();
        assert!(!e.contains("RecursionLimit"), "{e}");
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
