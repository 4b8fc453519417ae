//! Parsed SQL that shardwise's passes over a statement write themselves (a merged USING key's
//! `coalesce`, the calls that carry PostgreSQL's reading of an operator, the templates of
//! ClickHouse's functions and `LIMIT BY`): one place that knows how sqlparser spells a plain
//! function call, and that parses a pass's own SQL text.

use std::ops::ControlFlow;

use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{
    Expr, Function, FunctionArg, FunctionArgExpr, FunctionArgumentList, FunctionArguments, Ident, ObjectName, Query,
    VisitorMut,
};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;

use crate::error::QueryError;

/// Applies `f` to every query of `statement`, each after the queries nested in it (a pass that
/// rewrites or refuses a query); the first error stops the pass and is returned.
pub(crate) fn try_each_query(
    statement: &mut DfStatement,
    f: impl FnMut(&mut Query) -> Result<(), QueryError>,
) -> Result<(), QueryError> {
    let mut pass = EachQuery { f, error: None };
    crate::repeated_items::visit_statement_mut(statement, &mut pass);
    pass.error.map_or(Ok(()), Err)
}

struct EachQuery<F> {
    f: F,
    error: Option<QueryError>,
}

impl<F: FnMut(&mut Query) -> Result<(), QueryError>> VisitorMut for EachQuery<F> {
    type Break = ();

    fn post_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
        match (self.f)(query) {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => {
                self.error = Some(e);
                ControlFlow::Break(())
            }
        }
    }
}

/// An expression a pass writes as text (a template of its own, never a user's SQL), parsed as
/// the engine's dialect reads it; a failure is a bug in the pass.
pub(crate) fn parse_expr(sql: &str) -> Result<Expr, QueryError> {
    Parser::new(&GenericDialect {}).try_with_sql(sql).and_then(|mut p| p.parse_expr()).map_err(|e| own_sql(sql, e))
}

/// A query a pass writes as text, as [`parse_expr`].
pub(crate) fn parse_query(sql: &str) -> Result<Query, QueryError> {
    Parser::new(&GenericDialect {})
        .try_with_sql(sql)
        .and_then(|mut p| p.parse_query())
        .map(|q| *q)
        .map_err(|e| own_sql(sql, e))
}

fn own_sql(sql: &str, e: datafusion::sql::sqlparser::parser::ParserError) -> QueryError {
    QueryError::Internal(datafusion::error::DataFusionError::Internal(format!("shardwise's own SQL {sql:?}: {e}")))
}

/// `name(args...)`: a call without DISTINCT, FILTER, OVER or any other clause.
pub(crate) fn function_call(name: &str, args: Vec<Expr>) -> Expr {
    Expr::Function(Function {
        name: ObjectName::from(vec![Ident::new(name)]),
        uses_odbc_syntax: false,
        parameters: FunctionArguments::None,
        args: FunctionArguments::List(FunctionArgumentList {
            duplicate_treatment: None,
            args: args.into_iter().map(|e| FunctionArg::Unnamed(FunctionArgExpr::Expr(e))).collect(),
            clauses: vec![],
        }),
        filter: None,
        null_treatment: None,
        over: None,
        within_group: vec![],
    })
}

/// `sql` parsed, given to `rewrite`, and written back as SQL: what the tests of the statement
/// rewrites compare.
#[cfg(test)]
pub(crate) fn rewritten_by(sql: &str, rewrite: impl FnOnce(&mut DfStatement)) -> String {
    let parsed = datafusion::sql::parser::DFParser::parse_sql(sql).expect("parse").pop_front();
    let mut statement = parsed.expect("one statement");
    rewrite(&mut statement);
    statement.to_string()
}
