//! `GROUP BY a, b WITH ROLLUP | WITH CUBE | WITH TOTALS` (MySQL's and ClickHouse's forms) run as
//! `GROUP BY ROLLUP(a, b)`, `GROUP BY CUBE(a, b)` and `GROUP BY GROUPING SETS ((a, b), ())`.
//!
//! Why: DataFusion parses the modifiers and then ignores them: `SELECT a, count(*) FROM t GROUP
//! BY a WITH TOTALS` answered the groups without the totals row, a wrong answer with no error.
//!
//! How: [`as_grouping_sets`], a pass over the parsed statement, moves each modifier into the
//! grouping. ClickHouse gives the totals row apart from the others (after a blank line in
//! TabSeparated, under `"totals"` in JSON); here it is one more row, its key columns NULL, as
//! `GROUPING SETS` gives it (`GROUPING(a)` tells it apart from a group whose key is NULL). More
//! than one modifier, a modifier after `GROUP BY ALL` or after a grouping that already has sets,
//! and Hive's `WITH GROUPING SETS` are refused.

use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{Expr, GroupByExpr, GroupByWithModifier, SetExpr};

use crate::error::QueryError;

/// Rewrites every `GROUP BY ... WITH` of `statement` (see the module doc).
pub fn as_grouping_sets(statement: &mut DfStatement) -> Result<(), QueryError> {
    crate::sql_ast::try_each_query(statement, |query| rewrite_body(&mut query.body))
}

fn refused(what: &str) -> QueryError {
    QueryError::Unsupported(format!("GROUP BY ... WITH: {what}"))
}

/// The SELECTs of `body` (nested queries are visited on their own).
fn rewrite_body(body: &mut SetExpr) -> Result<(), QueryError> {
    match body {
        SetExpr::Select(select) => {
            select.group_by =
                grouped(std::mem::replace(&mut select.group_by, GroupByExpr::Expressions(vec![], vec![])))?;
            Ok(())
        }
        SetExpr::SetOperation { left, right, .. } => {
            rewrite_body(left)?;
            rewrite_body(right)
        }
        _ => Ok(()),
    }
}

fn grouped(group_by: GroupByExpr) -> Result<GroupByExpr, QueryError> {
    let (exprs, modifier) = match group_by {
        GroupByExpr::All(modifiers) if modifiers.is_empty() => return Ok(GroupByExpr::All(modifiers)),
        GroupByExpr::All(_) => return Err(refused("not after GROUP BY ALL; name the grouping columns")),
        GroupByExpr::Expressions(exprs, modifiers) => match modifiers.as_slice() {
            [] => return Ok(GroupByExpr::Expressions(exprs, modifiers)),
            [one] => (exprs, one.clone()),
            _ => return Err(refused("one of WITH ROLLUP, WITH CUBE or WITH TOTALS at a time")),
        },
    };
    if exprs.iter().any(|e| matches!(e, Expr::Rollup(_) | Expr::Cube(_) | Expr::GroupingSets(_))) {
        return Err(refused("not with ROLLUP, CUBE or GROUPING SETS in the grouping; write the sets out"));
    }
    let each = || exprs.iter().map(|e| vec![e.clone()]).collect::<Vec<_>>();
    let sets = match modifier {
        GroupByWithModifier::Rollup => Expr::Rollup(each()),
        GroupByWithModifier::Cube => Expr::Cube(each()),
        GroupByWithModifier::Totals => Expr::GroupingSets(vec![exprs.clone(), vec![]]),
        GroupByWithModifier::GroupingSets(_) => {
            return Err(refused("WITH GROUPING SETS is not supported; write GROUP BY GROUPING SETS (...)"));
        }
    };
    Ok(GroupByExpr::Expressions(vec![sets], vec![]))
}

#[cfg(test)]
mod tests {
    use datafusion::sql::parser::DFParser;

    use super::*;

    fn rewritten(sql: &str) -> Result<String, QueryError> {
        let mut statement = DFParser::parse_sql(sql).expect("parse").pop_front().expect("statement");
        as_grouping_sets(&mut statement)?;
        Ok(statement.to_string())
    }

    #[test]
    fn each_modifier_becomes_its_grouping_sets() {
        assert_eq!(
            rewritten("SELECT a, b, count(*) FROM t GROUP BY a, b WITH ROLLUP").unwrap(),
            "SELECT a, b, count(*) FROM t GROUP BY ROLLUP (a, b)"
        );
        assert_eq!(
            rewritten("SELECT a, sum(x) FROM t GROUP BY a WITH CUBE").unwrap(),
            "SELECT a, sum(x) FROM t GROUP BY CUBE (a)"
        );
        assert_eq!(
            rewritten("SELECT * FROM (SELECT a, b, count(*) FROM t GROUP BY a, b WITH TOTALS) AS s").unwrap(),
            "SELECT * FROM (SELECT a, b, count(*) FROM t GROUP BY GROUPING SETS ((a, b), ())) AS s"
        );
        assert_eq!(rewritten("SELECT a FROM t GROUP BY a").unwrap(), "SELECT a FROM t GROUP BY a");
    }

    #[test]
    fn what_has_no_single_meaning_is_refused() {
        for (sql, needle) in [
            ("SELECT a FROM t GROUP BY a WITH ROLLUP WITH TOTALS", "one of WITH ROLLUP"),
            ("SELECT a FROM t GROUP BY ALL WITH TOTALS", "GROUP BY ALL"),
            ("SELECT a FROM t GROUP BY ROLLUP (a) WITH TOTALS", "write the sets out"),
        ] {
            let err = rewritten(sql).unwrap_err().to_string();
            assert!(err.contains(needle), "{sql}: {err}");
        }
    }
}
