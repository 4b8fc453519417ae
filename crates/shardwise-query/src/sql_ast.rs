//! Parsed SQL that shardwise's passes over a statement write themselves (a merged USING key's
//! `coalesce`, the calls that carry PostgreSQL's reading of an operator, the templates of
//! ClickHouse's functions and `LIMIT BY`): one place that knows how sqlparser spells a plain
//! function call, and that parses a pass's own SQL text.

use datafusion::sql::sqlparser::ast::{
    Expr, Function, FunctionArg, FunctionArgExpr, FunctionArgumentList, FunctionArguments, Ident, ObjectName, Query,
};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;

use crate::error::QueryError;

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
