//! Names for SELECT items written more than once: `SELECT 1, 1`, `SELECT a, a FROM t`, or
//! `INSERT INTO t SELECT id, NULL, NULL FROM s`.
//!
//! PostgreSQL, DuckDB and ClickHouse answer these; DataFusion refuses a projection whose columns
//! would share a name ("Projections require unique expression names"), even in an INSERT's
//! source, where names play no part. Before planning, every unaliased item whose text appears
//! more than once in its SELECT list is given a name of its own: the text for the first, then
//! the text with `_2`, `_3`... (skipping names the list already uses), as pandas and Polars
//! name repeated columns. Items that differ in text but not in DataFusion's name for them
//! (`x` and `CAST(x AS DOUBLE)`, or `ts` and a subquery `(SELECT u.ts ...)`, which DataFusion
//! names `ts`) are planned again, once DataFusion has refused them, with each unaliased
//! expression named by its text ([`name_expressions_by_text`]); two plain columns (`a` and
//! `t.a`) are still left for DataFusion to refuse, with its message.

use std::collections::{HashMap, HashSet};
use std::ops::ControlFlow;

use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{Expr, Ident, Query, SelectItem, SetExpr, VisitMut, VisitorMut};

/// Gives repeated unaliased SELECT items distinct names, and items with a literal their text, in
/// every SELECT of `statement`.
pub fn name_repeated_items(statement: &mut DfStatement) {
    visit_statement_mut(
        statement,
        &mut EachSelectList(|items| {
            rename_items(items);
            name_literal_items(items);
        }),
    );
    visit_statement_mut(statement, &mut OrderByAliases);
}

/// An ORDER BY expression written as an aliased SELECT item is (`SELECT DISTINCT a * 0.5 AS x
/// ... ORDER BY a * 0.5`) sorts by the item's alias, the same value, and in a SELECT DISTINCT
/// one written as an unaliased item is sorts by its position: DataFusion otherwise looks for the
/// expression's columns in the SELECT list, which a DISTINCT query refuses.
struct OrderByAliases;

impl VisitorMut for OrderByAliases {
    type Break = ();

    fn pre_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
        use datafusion::sql::sqlparser::ast::OrderByKind;
        let SetExpr::Select(select) = query.body.as_ref() else { return ControlFlow::Continue(()) };
        let aliases: HashMap<String, Ident> = select
            .projection
            .iter()
            .filter_map(|item| match item {
                SelectItem::ExprWithAlias { expr, alias } => Some((expr.to_string(), alias.clone())),
                _ => None,
            })
            .collect();
        // In a SELECT DISTINCT, an unaliased item by its position (`ORDER BY 1`): DataFusion
        // refused `SELECT DISTINCT k + 1 ... ORDER BY k + 1` ("must appear in select list").
        let positions: HashMap<String, usize> = if select.distinct.is_some() {
            select
                .projection
                .iter()
                .enumerate()
                .filter_map(|(i, item)| match item {
                    SelectItem::UnnamedExpr(expr) => Some((expr.to_string(), i + 1)),
                    _ => None,
                })
                .collect()
        } else {
            HashMap::new()
        };
        if aliases.is_empty() && positions.is_empty() {
            return ControlFlow::Continue(());
        }
        if let Some(order_by) = query.order_by.as_mut()
            && let OrderByKind::Expressions(exprs) = &mut order_by.kind
        {
            for order in exprs.iter_mut() {
                if matches!(order.expr, Expr::Identifier(_) | Expr::Value(_)) {
                    continue;
                }
                let text = order.expr.to_string();
                if let Some(alias) = aliases.get(&text) {
                    order.expr = Expr::Identifier(alias.clone());
                } else if let Some(position) = positions.get(&text) {
                    let number = datafusion::sql::sqlparser::ast::Value::Number(position.to_string(), false);
                    order.expr = Expr::Value(number.into());
                }
            }
        }
        ControlFlow::Continue(())
    }
}

/// Names an unaliased item with a literal in it by its text, as DuckDB and ClickHouse name items:
/// `SELECT 1` is the column `1`, `SELECT 0.1 + 0.2` the column `0.1 + 0.2`, `SELECT 'x'` the
/// column `'x'`, `count(*) + 1` the column `count(*) + 1`. DataFusion names them after the
/// literals' types (`Int64(1)`, `Decimal128(0.1,1,1) + Decimal128(0.2,1,1)`, `Utf8("x")`), which
/// is what Flight SQL and HTTP clients showed. (Over PostgreSQL such columns are `?column?`, as
/// PostgreSQL names them: `crate::postgres_names`.)
fn name_literal_items(items: &mut [SelectItem]) {
    let mut taken: HashSet<String> = items
        .iter()
        .filter_map(|item| match item {
            SelectItem::ExprWithAlias { alias, .. } => Some(alias.value.clone()),
            _ => None,
        })
        .collect();
    for item in items.iter_mut() {
        if let SelectItem::UnnamedExpr(expr) = item
            && has_typed_literal(expr)
            && taken.insert(expr.to_string())
        {
            let alias = Ident::with_quote('"', expr.to_string());
            *item = SelectItem::ExprWithAlias { expr: expr.clone(), alias };
        }
    }
}

/// Whether `expr` has a number, string or boolean literal (which DataFusion names by its type).
fn has_typed_literal(expr: &Expr) -> bool {
    use datafusion::sql::sqlparser::ast::{Value, ValueWithSpan, Visit, Visitor};
    struct Find;
    impl Visitor for Find {
        type Break = ();
        fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<()> {
            match expr {
                Expr::Value(ValueWithSpan {
                    value:
                        Value::Number(..)
                        | Value::SingleQuotedString(_)
                        | Value::DoubleQuotedString(_)
                        | Value::EscapedStringLiteral(_)
                        | Value::Boolean(_),
                    ..
                }) => ControlFlow::Break(()),
                _ => ControlFlow::Continue(()),
            }
        }
    }
    expr.visit(&mut Find).is_break()
}

/// Whether `statement` is a query or an `INSERT ... SELECT` (or the EXPLAIN of one): what is
/// planned again with its items named by their text when their names collide.
pub fn is_query(statement: &DfStatement) -> bool {
    use datafusion::sql::sqlparser::ast::Statement;
    match statement {
        DfStatement::Statement(statement) => match statement.as_ref() {
            Statement::Query(_) => true,
            // An INSERT ... SELECT (not ... VALUES, which can be large to keep twice): its items'
            // names play no part, so naming them by their text changes nothing.
            Statement::Insert(insert) => {
                insert.source.as_ref().is_some_and(|q| !matches!(q.body.as_ref(), SetExpr::Values(_)))
            }
            _ => false,
        },
        DfStatement::Explain(explain) => is_query(&explain.statement),
        _ => false,
    }
}

/// Whether planning failed because two SELECT items got the same name from DataFusion, or
/// names only a qualifier tells apart (`SELECT t.ts, (SELECT u.ts FROM u ...)`: DataFusion
/// names the subquery's item `ts`, which is ambiguous beside `t.ts`).
pub fn is_name_collision(e: &datafusion::error::DataFusionError) -> bool {
    let message = e.to_string();
    message.contains("Projections require unique expression names")
        || message.contains("Schema contains duplicate unqualified field name")
        || (message.contains("Schema contains qualified field name") && message.contains("would be ambiguous"))
}

/// Names every unaliased SELECT item that is not a plain column by its text (`CAST(x AS
/// DOUBLE)`), in every SELECT of `statement` (repeated texts were named already): for a statement
/// DataFusion refused because items that differ in text share its name for them.
pub fn name_expressions_by_text(statement: &mut DfStatement) {
    visit_statement_mut(statement, &mut EachSelectList(name_by_text));
}

fn name_by_text(items: &mut [SelectItem]) {
    for item in items {
        if let SelectItem::UnnamedExpr(expr) = item
            && !matches!(expr, Expr::Identifier(_) | Expr::CompoundIdentifier(_))
        {
            let alias = Ident::with_quote('"', expr.to_string());
            *item = SelectItem::ExprWithAlias { expr: expr.clone(), alias };
        }
    }
}

/// Runs `visitor` over the SQL statement in `statement`, or the one an `EXPLAIN` wraps (the
/// passes over the parsed statement before planning: this one, `crate::numeric_literals`).
pub(crate) fn visit_statement_mut<V: VisitorMut>(statement: &mut DfStatement, visitor: &mut V) {
    match statement {
        DfStatement::Statement(statement) => {
            let _ = statement.visit(visitor);
        }
        DfStatement::Explain(explain) => visit_statement_mut(&mut explain.statement, visitor),
        _ => {}
    }
}

/// Applies its function to every SELECT list of a statement (each query, nested ones included,
/// and both sides of a set operation).
pub(crate) struct EachSelectList(pub(crate) fn(&mut [SelectItem]));

impl VisitorMut for EachSelectList {
    type Break = ();

    fn pre_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
        each_select_list(&mut query.body, self.0);
        ControlFlow::Continue(())
    }
}

/// The SELECT lists of `body` (nested queries are visited on their own).
fn each_select_list(body: &mut SetExpr, f: fn(&mut [SelectItem])) {
    match body {
        SetExpr::Select(select) => f(&mut select.projection),
        SetExpr::SetOperation { left, right, .. } => {
            each_select_list(left, f);
            each_select_list(right, f);
        }
        _ => {}
    }
}

fn rename_items(items: &mut [SelectItem]) {
    let texts: Vec<Option<String>> = items
        .iter()
        .map(|item| match item {
            SelectItem::UnnamedExpr(expr) => Some(expr.to_string()),
            _ => None,
        })
        .collect();
    let mut count: HashMap<&str, usize> = HashMap::new();
    for text in texts.iter().flatten() {
        *count.entry(text).or_default() += 1;
    }
    if count.values().all(|&n| n < 2) {
        return;
    }
    let mut taken: HashSet<String> = texts.iter().flatten().cloned().collect();
    taken.extend(items.iter().filter_map(|item| match item {
        SelectItem::ExprWithAlias { alias, .. } => Some(alias.value.clone()),
        _ => None,
    }));
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (item, text) in items.iter_mut().zip(&texts) {
        let Some(text) = text else { continue };
        if count[text.as_str()] < 2 {
            continue;
        }
        let n = seen.entry(text).or_default();
        *n += 1;
        let name = if *n == 1 {
            text.clone()
        } else {
            let mut k = *n;
            while taken.contains(&format!("{text}_{k}")) {
                k += 1;
            }
            format!("{text}_{k}")
        };
        taken.insert(name.clone());
        if let SelectItem::UnnamedExpr(expr) = item {
            *item = SelectItem::ExprWithAlias { expr: expr.clone(), alias: Ident::with_quote('"', name) };
        }
    }
}

#[cfg(test)]
mod tests {
    use datafusion::sql::parser::DFParser;

    use super::*;

    fn renamed(sql: &str) -> String {
        let mut statement = DFParser::parse_sql(sql).unwrap().pop_front().unwrap();
        name_repeated_items(&mut statement);
        statement.to_string()
    }

    #[test]
    fn an_insert_select_is_planned_again_when_names_collide_and_values_are_not() {
        let parse = |sql: &str| DFParser::parse_sql(sql).expect("parse").pop_front().expect("statement");
        assert!(is_query(&parse("SELECT 1")));
        assert!(is_query(&parse("INSERT INTO t (a, b) SELECT CAST(d AS REAL), d FROM g")));
        assert!(!is_query(&parse("INSERT INTO t VALUES (1)")));
    }

    #[test]
    fn repeated_items_get_names_and_others_are_untouched() {
        assert_eq!(renamed("SELECT 1, 1"), r#"SELECT 1 AS "1", 1 AS "1_2""#);
        assert_eq!(renamed("SELECT a, b, a, a FROM t"), r#"SELECT a AS "a", b, a AS "a_2", a AS "a_3" FROM t"#);
        assert_eq!(renamed("SELECT a, a, 5 AS a_2 FROM t"), r#"SELECT a AS "a", a AS "a_3", 5 AS a_2 FROM t"#);
        assert_eq!(renamed("SELECT a, b FROM t"), "SELECT a, b FROM t");
        assert_eq!(renamed("SELECT a, t.a FROM t"), "SELECT a, t.a FROM t");
        assert_eq!(
            renamed("INSERT INTO t SELECT id, NULL, NULL FROM s"),
            r#"INSERT INTO t SELECT id, NULL AS "NULL", NULL AS "NULL_2" FROM s"#
        );
        assert_eq!(
            renamed("SELECT * FROM (SELECT x, x FROM t) UNION ALL SELECT 2, 2"),
            r#"SELECT * FROM (SELECT x AS "x", x AS "x_2" FROM t) UNION ALL SELECT 2 AS "2", 2 AS "2_2""#
        );
        assert!(renamed("EXPLAIN SELECT NULL, NULL").contains(r#"NULL AS "NULL_2""#));
    }

    #[test]
    fn items_with_literals_are_named_by_their_text() {
        assert_eq!(renamed("SELECT 0.1 + 0.2, 1 + 2"), r#"SELECT 0.1 + 0.2 AS "0.1 + 0.2", 1 + 2 AS "1 + 2""#);
        assert_eq!(renamed("SELECT 1"), r#"SELECT 1 AS "1""#);
        assert_eq!(
            renamed("SELECT 'x', true, count(*) + 1, a, NULL FROM t"),
            r#"SELECT 'x' AS "'x'", true AS "true", count(*) + 1 AS "count(*) + 1", a, NULL FROM t"#
        );
        assert_eq!(
            renamed("SELECT a * 1.5, a * 1.5 AS x FROM t"),
            r#"SELECT a * 1.5 AS "a * 1.5", a * 1.5 AS x FROM t"#
        );
        // ORDER BY the same expression sorts by the item's name.
        assert_eq!(
            renamed("SELECT DISTINCT a * 0.5 FROM t ORDER BY a * 0.5 DESC"),
            r#"SELECT DISTINCT a * 0.5 AS "a * 0.5" FROM t ORDER BY "a * 0.5" DESC"#
        );
        // Repeated ones keep their numbered names.
        assert_eq!(renamed("SELECT 0.5, 0.5"), r#"SELECT 0.5 AS "0.5", 0.5 AS "0.5_2""#);
    }
}
