//! Clauses the SQL parser reads and DataFusion's planner then drops without a word: ClickHouse's
//! `PREWHERE`, and `SAMPLE` / `TABLESAMPLE` on a table or subquery; and `SEMI JOIN` / `ANTI
//! JOIN` without a side, which it refused with a dump of its syntax tree.
//!
//! Why: `SELECT a FROM t PREWHERE a = 1` answered every row of `t`, and `FROM t SAMPLE 0.1`
//! every row instead of a tenth: wrong answers with no error.
//!
//! How: [`planned_or_refused`], a pass over the parsed statement. `PREWHERE c` is a filter that
//! ClickHouse applies before it reads the other columns, so its answer is that of `WHERE`: it is
//! joined to the query's `WHERE` with `AND`. A sample is refused: shardwise tables have no
//! sampling key, and an answer from all rows is not the one asked for. `SEMI JOIN` and `ANTI JOIN`
//! are the left ones, as in ClickHouse, Spark and DuckDB.

use std::ops::ControlFlow;

use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{
    BinaryOperator, Expr, JoinConstraint, JoinOperator, Select, TableFactor, TableWithJoins, VisitorMut,
};

use crate::error::QueryError;

/// Rewrites or refuses the clauses of `statement` the planner would drop (see the module doc).
pub fn planned_or_refused(statement: &mut DfStatement) -> Result<(), QueryError> {
    let mut pass = Pass { error: None };
    crate::repeated_items::visit_statement_mut(statement, &mut pass);
    pass.error.map_or(Ok(()), Err)
}

struct Pass {
    error: Option<QueryError>,
}

impl VisitorMut for Pass {
    type Break = ();

    fn pre_visit_query(&mut self, query: &mut datafusion::sql::sqlparser::ast::Query) -> ControlFlow<()> {
        if let datafusion::sql::sqlparser::ast::SetExpr::Select(select) = query.body.as_mut() {
            prewhere_into_where(select);
            select.from.iter_mut().for_each(left_semi_and_anti);
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<()> {
        if let TableFactor::NestedJoin { table_with_joins, .. } = factor {
            left_semi_and_anti(table_with_joins);
        }
        let sampled = match factor {
            TableFactor::Table { sample, .. } | TableFactor::Derived { sample, .. } => sample.is_some(),
            _ => false,
        };
        if sampled {
            self.error = Some(QueryError::Unsupported(
                "SAMPLE / TABLESAMPLE: shardwise tables have no sampling key, and an answer from every row is not \
                 the sample asked for; filter a share of the rows instead (WHERE abs(hash) % 10 = 0 over a key \
                 column, say)"
                    .to_string(),
            ));
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    }
}

/// `a SEMI JOIN b` as `a LEFT SEMI JOIN b`, and the same for `ANTI`.
fn left_semi_and_anti(from: &mut TableWithJoins) {
    for join in &mut from.joins {
        let sided = match std::mem::replace(&mut join.join_operator, JoinOperator::CrossJoin(JoinConstraint::None)) {
            JoinOperator::Semi(on) => JoinOperator::LeftSemi(on),
            JoinOperator::Anti(on) => JoinOperator::LeftAnti(on),
            other => other,
        };
        join.join_operator = sided;
    }
}

/// `PREWHERE p ... WHERE w` as `WHERE (p) AND (w)`.
fn prewhere_into_where(select: &mut Select) {
    let Some(prewhere) = select.prewhere.take() else { return };
    select.selection = Some(match select.selection.take() {
        None => prewhere,
        Some(selection) => Expr::BinaryOp {
            left: Box::new(Expr::Nested(Box::new(prewhere))),
            op: BinaryOperator::And,
            right: Box::new(Expr::Nested(Box::new(selection))),
        },
    });
}

#[cfg(test)]
mod tests {
    use datafusion::sql::parser::DFParser;

    use super::*;

    fn rewritten(sql: &str) -> Result<String, QueryError> {
        let mut statement = DFParser::parse_sql(sql).expect("parse").pop_front().expect("statement");
        planned_or_refused(&mut statement)?;
        Ok(statement.to_string())
    }

    #[test]
    fn prewhere_filters_as_where_does() {
        assert_eq!(rewritten("SELECT a FROM t PREWHERE a = 1").unwrap(), "SELECT a FROM t WHERE a = 1");
        assert_eq!(
            rewritten("SELECT a FROM t PREWHERE a = 1 OR a = 2 WHERE b > 0 OR b < -5").unwrap(),
            "SELECT a FROM t WHERE (a = 1 OR a = 2) AND (b > 0 OR b < -5)"
        );
        assert_eq!(
            rewritten("SELECT * FROM (SELECT a FROM t PREWHERE a = 1) AS s").unwrap(),
            "SELECT * FROM (SELECT a FROM t WHERE a = 1) AS s"
        );
    }

    #[test]
    fn semi_and_anti_joins_are_the_left_ones() {
        assert_eq!(
            rewritten(
                "SELECT * FROM a SEMI JOIN b ON a.x = b.x ANTI JOIN (c JOIN d SEMI JOIN e ON d.y = e.y) USING (z)"
            )
            .unwrap(),
            "SELECT * FROM a LEFT SEMI JOIN b ON a.x = b.x LEFT ANTI JOIN (c JOIN d LEFT SEMI JOIN e ON d.y = e.y) \
             USING(z)"
        );
    }

    #[test]
    fn a_sample_is_refused() {
        for sql in ["SELECT a FROM t SAMPLE 0.1", "SELECT a FROM (SELECT a FROM t) AS s TABLESAMPLE SYSTEM (10)"] {
            let err = rewritten(sql).map(|s| s.to_string()).unwrap_err().to_string();
            assert!(err.contains("SAMPLE / TABLESAMPLE"), "{sql}: {err}");
        }
    }
}
