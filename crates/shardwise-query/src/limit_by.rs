//! ClickHouse's `LIMIT n BY expressions`: at most `n` rows for each value of the expressions,
//! taken in the query's `ORDER BY` order; the top few of every
//! group, as in `SELECT kind, user_id, sum(amount) AS s FROM events GROUP BY kind, user_id ORDER
//! BY s DESC LIMIT 3 BY kind`.
//!
//! Why: DataFusion parses the clause and refuses it ("LIMIT BY clause is not supported yet").
//!
//! How: [`as_window`] rewrites such a query (its body a plain `SELECT`, not `DISTINCT`) as a
//! numbering of its rows within each value, then a filter on the number:
//!
//! ```sql
//! SELECT * EXCLUDE (__shardwise_rn, __shardwise_order_0, ...) FROM (
//!     SELECT <the items>, row_number() OVER (PARTITION BY <by> ORDER BY <order>) AS __shardwise_rn,
//!            <order expression 0> AS __shardwise_order_0, ...
//!     FROM ... WHERE ... GROUP BY ... HAVING ...
//! ) AS __shardwise_limit_by
//! WHERE __shardwise_rn <= n
//! ORDER BY __shardwise_order_0, ...
//! ```
//!
//! An `ORDER BY` or `BY` expression that names an item's alias, or an `ORDER BY` position, is
//! replaced by the item's expression first (a window cannot see the aliases of its SELECT list).
//! Without `ORDER BY`, which rows of a value are kept is left open, as in ClickHouse.

use std::ops::ControlFlow;

use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{
    Expr, Ident, LimitClause, OrderBy, OrderByExpr, OrderByKind, Query, SelectItem, SetExpr, TableFactor, Value,
    VisitMut, VisitorMut, WindowSpec, WindowType,
};

use crate::error::QueryError;

/// The column that numbers the rows of each value.
const ROW_NUMBER: &str = "__shardwise_rn";
/// The columns that carry the `ORDER BY` expressions out of the numbered query.
const ORDER_PREFIX: &str = "__shardwise_order_";

/// Rewrites every query of `statement` that has a `LIMIT ... BY` (see the module doc).
pub fn as_window(statement: &mut DfStatement) -> Result<(), QueryError> {
    crate::sql_ast::try_each_query(statement, |query| {
        let has_limit_by =
            matches!(&query.limit_clause, Some(LimitClause::LimitOffset { limit_by, .. }) if !limit_by.is_empty());
        if has_limit_by {
            *query = rewritten(query)?;
        }
        Ok(())
    })
}

fn refused(what: &str) -> QueryError {
    QueryError::Unsupported(format!("LIMIT n BY: {what}"))
}

/// `query`, which has a `LIMIT ... BY`, as the numbered query and its filter.
fn rewritten(query: &mut Query) -> Result<Query, QueryError> {
    let Some(LimitClause::LimitOffset { limit, offset, limit_by }) = query.limit_clause.take() else {
        return Err(refused("expected LIMIT n BY expressions"));
    };
    let count = limit.ok_or_else(|| refused("give the number of rows to keep for each value (LIMIT n BY ...)"))?;
    // ClickHouse skips rows of each value with `LIMIT n OFFSET m BY` or `LIMIT m, n BY`, which the
    // parser does not read; an OFFSET it reads beside the clause could mean either of two things.
    if offset.is_some() {
        return Err(refused("not with OFFSET (a per-value offset is not supported)"));
    }
    let order: Vec<OrderByExpr> = match query.order_by.take() {
        None => Vec::new(),
        Some(OrderBy { kind: OrderByKind::Expressions(exprs), interpolate: None }) => exprs,
        Some(_) => return Err(refused("ORDER BY ALL and INTERPOLATE are not supported with it; name the expressions")),
    };
    let SetExpr::Select(select) = query.body.as_mut() else {
        return Err(refused("it applies to a plain SELECT (not a UNION, VALUES or other set operation)"));
    };
    if select.distinct.is_some() {
        return Err(refused("not with SELECT DISTINCT; take the distinct rows in a subquery first"));
    }
    let items = select.projection.clone();
    let by = limit_by.into_iter().map(|e| item_expr(e, &items, false)).collect::<Result<Vec<_>, _>>()?;
    let order = order
        .into_iter()
        .map(|o| Ok(OrderByExpr { expr: item_expr(o.expr, &items, true)?, ..o }))
        .collect::<Result<Vec<_>, QueryError>>()?;
    let mut row_number = crate::sql_ast::parse_expr("row_number()")?;
    if let Expr::Function(f) = &mut row_number {
        f.over = Some(WindowType::WindowSpec(WindowSpec {
            window_name: None,
            partition_by: by,
            order_by: order.clone(),
            window_frame: None,
        }));
    }
    select.projection.push(SelectItem::ExprWithAlias { expr: row_number, alias: Ident::new(ROW_NUMBER) });
    let mut hidden = vec![ROW_NUMBER.to_string()];
    let mut outer_order = Vec::new();
    for (i, o) in order.into_iter().enumerate() {
        let name = format!("{ORDER_PREFIX}{i}");
        select.projection.push(SelectItem::ExprWithAlias { expr: o.expr, alias: Ident::new(&name) });
        outer_order.push(OrderByExpr {
            expr: Expr::Identifier(Ident::new(&name)),
            options: o.options,
            with_fill: None,
        });
        hidden.push(name);
    }
    // The outer query: its derived table replaced by the numbered query, its filter's bounds
    // by the clause's.
    let outer_sql = format!(
        "SELECT * EXCLUDE ({}) FROM (SELECT 1) AS __shardwise_limit_by WHERE {ROW_NUMBER} <= __count",
        hidden.join(", ")
    );
    let mut outer = crate::sql_ast::parse_query(&outer_sql)?;
    let inner = Query {
        with: None,
        order_by: None,
        limit_clause: None,
        fetch: None,
        settings: None,
        format_clause: None,
        ..query.clone()
    };
    outer.with = query.with.take();
    outer.settings = query.settings.take();
    outer.format_clause = query.format_clause.take();
    outer.fetch = query.fetch.take();
    if !outer_order.is_empty() {
        outer.order_by = Some(OrderBy { kind: OrderByKind::Expressions(outer_order), interpolate: None });
    }
    let SetExpr::Select(outer_select) = outer.body.as_mut() else { return Err(internal("no outer SELECT")) };
    let Some(TableFactor::Derived { subquery, .. }) = outer_select.from.first_mut().map(|t| &mut t.relation) else {
        return Err(internal("no derived table"));
    };
    **subquery = inner;
    if let Some(selection) = &mut outer_select.selection {
        let _ = VisitMut::visit(selection, &mut Bound { count: &count });
    }
    Ok(outer)
}

/// `expr`, or the expression of the SELECT item it names by alias (or, for `ORDER BY`, by
/// position).
fn item_expr(expr: Expr, items: &[SelectItem], positions: bool) -> Result<Expr, QueryError> {
    match &expr {
        Expr::Identifier(name) => {
            let aliased = items.iter().find_map(|item| match item {
                SelectItem::ExprWithAlias { expr, alias } if same_name(alias, name) => Some(expr.clone()),
                _ => None,
            });
            Ok(aliased.unwrap_or(expr))
        }
        Expr::Value(v) if positions => {
            let Value::Number(text, _) = &v.value else { return Ok(expr) };
            let position: usize = text.parse().map_err(|_| refused(&format!("ORDER BY {text}: not a position")))?;
            match position.checked_sub(1).and_then(|i| items.get(i)) {
                Some(SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. }) => Ok(e.clone()),
                _ => Err(refused(&format!("ORDER BY {position}: no SELECT item with an expression at that position"))),
            }
        }
        _ => Ok(expr),
    }
}

/// Two identifiers naming the same thing: unquoted ones in any case, as names are normalized.
fn same_name(a: &Ident, b: &Ident) -> bool {
    match (a.quote_style, b.quote_style) {
        (None, None) => a.value.eq_ignore_ascii_case(&b.value),
        _ => a.value == b.value,
    }
}

struct Bound<'a> {
    count: &'a Expr,
}

impl VisitorMut for Bound<'_> {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        if matches!(expr, Expr::Identifier(ident) if ident.value == "__count") {
            *expr = Expr::Nested(Box::new(self.count.clone()));
        }
        ControlFlow::Continue(())
    }
}

fn internal(what: &str) -> QueryError {
    QueryError::Internal(datafusion::error::DataFusionError::Internal(format!("LIMIT BY rewrite: {what}")))
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::util::pretty::pretty_format_batches;
    use datafusion::prelude::SessionContext;
    use datafusion::sql::parser::DFParser;

    use super::*;

    async fn answer(ctx: &SessionContext, sql: &str) -> Result<String, QueryError> {
        let mut statement = DFParser::parse_sql(sql).expect("parse").pop_front().expect("statement");
        as_window(&mut statement)?;
        let plan = ctx.state().statement_to_plan(statement).await?;
        let batches = ctx.execute_logical_plan(plan).await?.collect().await?;
        Ok(pretty_format_batches(&batches).map_err(|e| QueryError::Internal(e.into()))?.to_string())
    }

    async fn context() -> SessionContext {
        let ctx = SessionContext::new();
        ctx.sql(
            "CREATE TABLE t AS SELECT * FROM (VALUES (1, 'a', 10), (2, 'a', 30), (3, 'a', 20), (4, 'b', 5), \
             (5, 'b', 7), (6, 'c', 1)) AS v(id, g, x)",
        )
        .await
        .unwrap();
        ctx
    }

    #[tokio::test]
    async fn the_top_rows_of_each_value_in_the_querys_order() {
        let ctx = context().await;
        let got = answer(&ctx, "SELECT g, id, x FROM t ORDER BY g, x DESC LIMIT 2 BY g").await.unwrap();
        let want = "+---+----+----+\n| g | id | x  |\n+---+----+----+\n| a | 2  | 30 |\n| a | 3  | 20 |\n\
                    | b | 5  | 7  |\n| b | 4  | 5  |\n| c | 6  | 1  |\n+---+----+----+";
        assert_eq!(got, want);
        // An alias, a position and an aggregate order the rows.
        let got =
            answer(&ctx, "SELECT g AS grp, id, sum(x) AS s FROM t GROUP BY g, id ORDER BY grp, s DESC LIMIT 1 BY grp")
                .await
                .unwrap();
        assert!(got.contains("| a   | 2  | 30 |\n| b   | 5  | 7  |\n| c   | 6  | 1  |\n+"), "{got}");
        let got = answer(&ctx, "SELECT g, max(x) FROM t GROUP BY g ORDER BY 2 DESC LIMIT 1 BY g").await.unwrap();
        assert!(
            got.contains("| g | max(t.x) |") && got.contains("| a | 30       |\n| b | 7        |\n| c | 1  "),
            "{got}"
        );
        // A subquery's clause, and a CTE the query reads.
        let got = answer(
            &ctx,
            "WITH u AS (SELECT * FROM t WHERE id > 1) SELECT count(*) FROM (SELECT g FROM u ORDER BY id LIMIT 1 BY g)",
        )
        .await
        .unwrap();
        assert!(got.contains("| 3 "), "{got}");
    }

    #[tokio::test]
    async fn what_it_cannot_number_is_refused() {
        let ctx = context().await;
        for (sql, needle) in [
            ("SELECT DISTINCT g FROM t LIMIT 1 BY g", "not with SELECT DISTINCT"),
            ("SELECT g FROM t UNION ALL SELECT g FROM t LIMIT 1 BY g", "plain SELECT"),
            ("SELECT g FROM t ORDER BY 5 LIMIT 1 BY g", "ORDER BY 5"),
            ("SELECT g FROM t LIMIT 1 BY g OFFSET 1", "not with OFFSET"),
        ] {
            let err = answer(&ctx, sql).await.unwrap_err().to_string();
            assert!(err.contains(needle), "{sql}: {err}");
        }
    }
}
