//! `INTERSECT ALL` and `EXCEPT ALL`, which DataFusion 55 answers wrongly, are refused.
//!
//! SQL keeps duplicates by count: `{1,1,1,2} INTERSECT ALL {1,1,2,2}` is `{1,1,2}` (each row as
//! many times as the smaller side has it) and `{1,1,1,2,3} EXCEPT ALL {1,1,2,2}` is `{1,3}`.
//! DataFusion 55 plans them as a semi and an anti join, which keep every row of the left side
//! that has (or lacks) a match: `{1,1,1,2}` and `{3}`. PostgreSQL and DuckDB answer by count. A
//! wrong answer is worse than none, so these two are refused with a message that says what to
//! write instead; `UNION ALL`, and `INTERSECT` and `EXCEPT` without `ALL` (which drop duplicates,
//! where DataFusion is right), run.

use std::ops::ControlFlow;

use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{Query, SetExpr, SetOperator, SetQuantifier, Visit, Visitor};

use crate::error::QueryError;

/// An error when `statement` holds an `INTERSECT ALL` or `EXCEPT ALL` anywhere (subqueries too).
pub fn refuse_unsupported(statement: &DfStatement) -> Result<(), QueryError> {
    let mut found = Found(None);
    visit(statement, &mut found);
    match found.0 {
        None => Ok(()),
        Some(op) => Err(QueryError::Rejected(format!(
            "{op} ALL is not supported: the engine (DataFusion 55) would keep every duplicate of the left side \
             {} instead of counting them; write {op} (without ALL) for distinct rows, or count the rows of each \
             side with GROUP BY and compare the counts",
            match op {
                "INTERSECT" => "that has a match",
                _ => "that has no match, and drop every one that has",
            }
        ))),
    }
}

fn visit(statement: &DfStatement, visitor: &mut Found) {
    match statement {
        DfStatement::Statement(statement) => {
            let _ = statement.visit(visitor);
        }
        DfStatement::Explain(explain) => visit(&explain.statement, visitor),
        _ => {}
    }
}

/// The first `INTERSECT ALL` or `EXCEPT ALL` seen.
struct Found(Option<&'static str>);

impl Visitor for Found {
    type Break = ();

    fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<()> {
        self.0 = self.0.or_else(|| counted(&query.body));
        ControlFlow::Continue(())
    }
}

/// `INTERSECT` or `EXCEPT` when `body` has one of them with `ALL` (nested queries are visited on
/// their own).
fn counted(body: &SetExpr) -> Option<&'static str> {
    let SetExpr::SetOperation { op, set_quantifier, left, right } = body else { return None };
    let all = matches!(set_quantifier, SetQuantifier::All | SetQuantifier::AllByName);
    let this = match op {
        SetOperator::Intersect if all => Some("INTERSECT"),
        SetOperator::Except | SetOperator::Minus if all => Some("EXCEPT"),
        _ => None,
    };
    this.or_else(|| counted(left)).or_else(|| counted(right))
}

#[cfg(test)]
mod tests {
    use datafusion::sql::parser::DFParser;

    use super::*;

    fn check(sql: &str) -> Result<(), QueryError> {
        let statement = DFParser::parse_sql(sql).expect("parses").pop_front().expect("one statement");
        refuse_unsupported(&statement)
    }

    #[test]
    fn intersect_all_and_except_all_are_refused_anywhere() {
        for sql in [
            "SELECT a FROM t INTERSECT ALL SELECT a FROM u",
            "SELECT a FROM t EXCEPT ALL SELECT a FROM u",
            "SELECT * FROM (SELECT a FROM t UNION ALL (SELECT a FROM u EXCEPT ALL SELECT a FROM v)) x",
            "SELECT count(*) FROM t WHERE a IN (SELECT a FROM u INTERSECT ALL SELECT a FROM v)",
            "EXPLAIN SELECT a FROM t INTERSECT ALL SELECT a FROM u",
        ] {
            let err = check(sql).expect_err(sql).to_string();
            assert!(err.contains(" ALL is not supported") && err.contains("without ALL"), "{sql}: {err}");
        }
        for sql in [
            "SELECT a FROM t UNION ALL SELECT a FROM u",
            "SELECT a FROM t INTERSECT SELECT a FROM u",
            "SELECT a FROM t EXCEPT SELECT a FROM u",
            "SELECT a FROM t EXCEPT DISTINCT SELECT a FROM u",
        ] {
            assert!(check(sql).is_ok(), "{sql}");
        }
    }
}
