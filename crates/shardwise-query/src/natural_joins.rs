//! `a NATURAL [LEFT | RIGHT | FULL] JOIN b` as `a ... JOIN b USING (the columns both have)`, so
//! that its merged columns are PostgreSQL's ([`crate::using_joins`]).
//!
//! Why: DataFusion reads a NATURAL join as USING internally and keeps the left side's column for
//! every join type, so `SELECT k FROM a NATURAL FULL JOIN b` answered NULL for the rows only `b`
//! has (PostgreSQL: `COALESCE(a.k, b.k)`), as USING joins did before `using_joins`.
//!
//! How: [`natural_as_using`] looks up the columns of both tables of a SELECT's first join when it
//! is NATURAL and both sides are tables by name (not a CTE's name), and writes the join as USING
//! over the columns both have, in the left table's order (none in common: left as written, a cross
//! join). A NATURAL join after the first, or over a derived table, is left to DataFusion.

use std::collections::{HashMap, HashSet};
use std::ops::ControlFlow;

use datafusion::common::Result;
use datafusion::execution::SessionState;
use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::planner::object_name_to_table_reference;
use datafusion::sql::sqlparser::ast::{
    Ident, JoinConstraint, ObjectName, Query, Select, SetExpr, TableFactor, VisitorMut,
};

/// Rewrites the NATURAL joins of `statement` that it can (see the module doc), looking their
/// tables up in `state`'s catalog.
pub async fn natural_as_using(statement: &mut DfStatement, state: &SessionState) -> Result<()> {
    let mut found = Collect::default();
    crate::repeated_items::visit_statement_mut(statement, &mut found);
    if found.tables.is_empty() {
        return Ok(());
    }
    let mut columns: HashMap<String, Vec<String>> = HashMap::new();
    for name in found.tables {
        if found.ctes.contains(&name.to_string().to_lowercase()) {
            continue;
        }
        let Ok(reference) = object_name_to_table_reference(name.clone(), true) else { continue };
        let Ok(schema) = state.schema_for_ref(reference.clone()) else { continue };
        // A table that is not there is left for the planner to report.
        if let Ok(Some(table)) = schema.table(reference.table()).await {
            columns.insert(name.to_string(), table.schema().fields().iter().map(|f| f.name().clone()).collect());
        }
    }
    crate::repeated_items::visit_statement_mut(statement, &mut Rewrite { columns: &columns });
    Ok(())
}

/// The first NATURAL join of `select` over two tables by name: the tables' names.
fn first_natural_join(select: &Select) -> Option<(&ObjectName, &ObjectName)> {
    let [from] = select.from.as_slice() else { return None };
    let join = from.joins.first()?;
    if !matches!(crate::using_joins::constraint(&join.join_operator), Some(JoinConstraint::Natural)) {
        return None;
    }
    match (&from.relation, &join.relation) {
        (TableFactor::Table { name: left, args: None, .. }, TableFactor::Table { name: right, args: None, .. }) => {
            Some((left, right))
        }
        _ => None,
    }
}

/// Each SELECT of a query body (set operations' branches included).
fn each_select(body: &mut SetExpr, f: &mut impl FnMut(&mut Select)) {
    match body {
        SetExpr::Select(select) => f(select),
        SetExpr::SetOperation { left, right, .. } => {
            each_select(left, f);
            each_select(right, f);
        }
        _ => {}
    }
}

/// The tables of first NATURAL joins, and every CTE name (lower case) in the statement.
#[derive(Default)]
struct Collect {
    tables: Vec<ObjectName>,
    ctes: HashSet<String>,
}

impl VisitorMut for Collect {
    type Break = ();

    fn pre_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
        if let Some(with) = &query.with {
            self.ctes.extend(with.cte_tables.iter().map(|cte| cte.alias.name.value.to_lowercase()));
        }
        each_select(&mut query.body, &mut |select| {
            if let Some((left, right)) = first_natural_join(select) {
                self.tables.extend([left.clone(), right.clone()]);
            }
        });
        ControlFlow::Continue(())
    }
}

struct Rewrite<'a> {
    columns: &'a HashMap<String, Vec<String>>,
}

impl VisitorMut for Rewrite<'_> {
    type Break = ();

    fn pre_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
        each_select(&mut query.body, &mut |select| {
            let Some((left, right)) = first_natural_join(select) else { return };
            let (Some(left), Some(right)) = (self.columns.get(&left.to_string()), self.columns.get(&right.to_string()))
            else {
                return;
            };
            let common: Vec<ObjectName> = left
                .iter()
                .filter(|c| right.contains(c))
                .map(|c| ObjectName::from(vec![Ident::with_quote('"', c.as_str())]))
                .collect();
            if common.is_empty() {
                return;
            }
            if let Some(join) = select.from.first_mut().and_then(|from| from.joins.first_mut())
                && let Some(constraint) = crate::using_joins::constraint_mut(&mut join.join_operator)
            {
                *constraint = JoinConstraint::Using(common);
            }
        });
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{AsArray, RecordBatch};
    use datafusion::arrow::datatypes::Int64Type;
    use datafusion::prelude::SessionContext;

    async fn context() -> Result<SessionContext> {
        let ctx = SessionContext::new();
        ctx.sql("CREATE TABLE a (k BIGINT, x BIGINT) AS VALUES (1, 10), (2, 20)").await?.collect().await?;
        ctx.sql("CREATE TABLE b (y BIGINT, k BIGINT) AS VALUES (100, 2), (300, 3)").await?.collect().await?;
        Ok(ctx)
    }

    /// `sql` with NATURAL joins rewritten (and USING merged, as the engine does), run.
    async fn run(ctx: &SessionContext, sql: &str) -> Result<Vec<RecordBatch>> {
        let state = ctx.state();
        let dialect = state.config().options().sql_parser.dialect;
        let mut statement = state.sql_to_statement(sql, &dialect)?;
        natural_as_using(&mut statement, &state).await?;
        crate::using_joins::merge_using_columns(&mut statement);
        let plan = state.statement_to_plan(statement).await?;
        ctx.execute_logical_plan(plan).await?.collect().await
    }

    fn ints(batches: &[RecordBatch], column: usize) -> Vec<Option<i64>> {
        let mut out: Vec<Option<i64>> = batches
            .iter()
            .flat_map(|b| b.column(column).as_primitive::<Int64Type>().iter().collect::<Vec<_>>())
            .collect();
        out.sort();
        out
    }

    #[tokio::test]
    async fn natural_outer_joins_merge_keys_as_postgres() -> Result<()> {
        let ctx = context().await?;
        let full = run(&ctx, "SELECT k FROM a NATURAL FULL JOIN b").await?;
        assert_eq!(ints(&full, 0), [Some(1), Some(2), Some(3)]);
        let right = run(&ctx, "SELECT k, x FROM a NATURAL RIGHT JOIN b").await?;
        assert_eq!(ints(&right, 0), [Some(2), Some(3)]);
        let inner = run(&ctx, "SELECT * FROM a NATURAL JOIN b").await?;
        assert_eq!(inner[0].num_columns(), 3);
        assert_eq!(ints(&inner, 0), [Some(2)]);
        // A CTE named like a table is not looked up in the catalog.
        let cte = run(&ctx, "WITH b AS (SELECT 1 AS k) SELECT k FROM a NATURAL JOIN b").await?;
        assert_eq!(ints(&cte, 0), [Some(1)]);
        Ok(())
    }
}
