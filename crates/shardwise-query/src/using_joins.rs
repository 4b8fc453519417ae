//! The column a `JOIN ... USING (k)` merges, as PostgreSQL defines it: the left side's `k` in an
//! inner or left join, the right side's in a right join, `COALESCE(left.k, right.k)` in a full
//! join, and usable unqualified anywhere in the SELECT.
//!
//! Why: DataFusion takes the left side's `k` for every join type, so a right or full join
//! answered NULL keys for the rows only the right side has (`SELECT sum(k) FROM a RIGHT JOIN b
//! USING (k)` was 32 where PostgreSQL says 37), and it refused `k` in a WHERE (`Ambiguous
//! reference to unqualified field k`), the commonest shape of such a query.
//!
//! How: [`merge_using_columns`], a pass over the parsed statement, writes each unqualified use
//! of a merged column in a SELECT's list, WHERE, GROUP BY, HAVING and QUALIFY as the expression
//! above (a select item keeping the name `k`), and a `*` over a join of two relations as `<k>,
//! left.* EXCLUDE (k), right.* EXCLUDE (k)`, PostgreSQL's column order (DataFusion left the
//! merged columns where the left side has them). A
//! SELECT whose FROM it cannot follow (a list of several relations, a relation without a name,
//! a USING column whose left side is one of several earlier relations, a NATURAL join that
//! [`crate::natural_joins`] did not write as USING) is left to DataFusion. References inside
//! nested queries are theirs.

use std::collections::HashMap;
use std::ops::ControlFlow;

use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{
    ExcludeSelectItem, Expr, GroupByExpr, Ident, JoinConstraint, JoinOperator, ObjectName, Query, Select, SelectItem,
    SelectItemQualifiedWildcardKind, SetExpr, TableFactor, VisitMut, VisitorMut, WildcardAdditionalOptions,
};

/// Rewrites `statement` (see the module doc).
pub fn merge_using_columns(statement: &mut DfStatement) {
    crate::repeated_items::visit_statement_mut(statement, &mut EachQuery);
}

struct EachQuery;

impl VisitorMut for EachQuery {
    type Break = ();

    fn pre_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
        each_select(&mut query.body);
        ControlFlow::Continue(())
    }
}

fn each_select(body: &mut SetExpr) {
    match body {
        SetExpr::Select(select) => rewrite_select(select),
        SetExpr::SetOperation { left, right, .. } => {
            each_select(left);
            each_select(right);
        }
        _ => {}
    }
}

/// The merged columns of a FROM clause: by lower-case name, the expression that stands for it,
/// in the order they appear; and for a single join of two relations, the qualifiers of both (a
/// `*` over it is written out).
struct Merged {
    columns: Vec<(String, Ident, Expr)>,
    wildcard_sides: Option<(Ident, Ident)>,
}

fn rewrite_select(select: &mut Select) {
    let Some(merged) = merged_columns(select) else { return };
    let by_name: HashMap<String, Expr> =
        merged.columns.iter().map(|(lower, _, expr)| (lower.clone(), expr.clone())).collect();
    let mut rewriter = Rewriter { by_name: &by_name, depth: 0 };
    let mut projection = Vec::with_capacity(select.projection.len());
    for item in std::mem::take(&mut select.projection) {
        match item {
            SelectItem::UnnamedExpr(Expr::Identifier(ident)) if by_name.contains_key(&lower(&ident)) => {
                let expr = by_name[&lower(&ident)].clone();
                projection.push(SelectItem::ExprWithAlias { expr, alias: ident });
            }
            SelectItem::Wildcard(options) if merged.wildcard_sides.is_some() && is_plain(&options) => {
                let Some((left, right)) = &merged.wildcard_sides else { continue };
                for (_, name, expr) in &merged.columns {
                    projection.push(SelectItem::ExprWithAlias { expr: expr.clone(), alias: name.clone() });
                }
                let names: Vec<Ident> = merged.columns.iter().map(|(_, name, _)| name.clone()).collect();
                for side in [left, right] {
                    projection.push(SelectItem::QualifiedWildcard(
                        SelectItemQualifiedWildcardKind::ObjectName(ObjectName::from(vec![side.clone()])),
                        WildcardAdditionalOptions {
                            opt_exclude: Some(ExcludeSelectItem::Multiple(
                                names.iter().map(|n| ObjectName::from(vec![n.clone()])).collect(),
                            )),
                            ..options.clone()
                        },
                    ));
                }
            }
            mut other => {
                let _ = other.visit(&mut rewriter);
                projection.push(other);
            }
        }
    }
    select.projection = projection;
    if let Some(selection) = select.selection.as_mut() {
        let _ = selection.visit(&mut rewriter);
    }
    if let GroupByExpr::Expressions(exprs, _) = &mut select.group_by {
        for expr in exprs {
            let _ = expr.visit(&mut rewriter);
        }
    }
    if let Some(having) = select.having.as_mut() {
        let _ = having.visit(&mut rewriter);
    }
    if let Some(qualify) = select.qualify.as_mut() {
        let _ = qualify.visit(&mut rewriter);
    }
}

fn is_plain(options: &WildcardAdditionalOptions) -> bool {
    options.opt_ilike.is_none()
        && options.opt_exclude.is_none()
        && options.opt_except.is_none()
        && options.opt_replace.is_none()
        && options.opt_rename.is_none()
        && options.opt_alias.is_none()
}

fn lower(ident: &Ident) -> String {
    if ident.quote_style.is_some() { ident.value.clone() } else { ident.value.to_ascii_lowercase() }
}

/// The name a relation's columns are qualified with: its alias, or its table's last name part.
fn qualifier(relation: &TableFactor) -> Option<Ident> {
    match relation {
        TableFactor::Table { alias: Some(alias), .. } | TableFactor::Derived { alias: Some(alias), .. } => {
            Some(alias.name.clone())
        }
        TableFactor::Table { name, alias: None, .. } => name.0.last().and_then(|part| part.as_ident()).cloned(),
        _ => None,
    }
}

fn qualified(relation: &Ident, column: &Ident) -> Expr {
    Expr::CompoundIdentifier(vec![relation.clone(), column.clone()])
}

fn coalesce(left: Expr, right: Expr) -> Expr {
    crate::sql_ast::function_call("coalesce", vec![left, right])
}

/// The merged columns of `select`'s FROM, or `None` when there are none or it cannot follow it.
fn merged_columns(select: &Select) -> Option<Merged> {
    let [from] = select.from.as_slice() else { return None };
    if !from.joins.iter().any(|j| matches!(constraint(&j.join_operator), Some(JoinConstraint::Using(_)))) {
        return None;
    }
    let first = qualifier(&from.relation)?;
    let mut columns: Vec<(String, Ident, Expr)> = Vec::new();
    let mut wildcard_sides = None;
    for (i, join) in from.joins.iter().enumerate() {
        let right = qualifier(&join.relation)?;
        let kind = constraint(&join.join_operator)?;
        let using = match kind {
            JoinConstraint::Using(names) => names,
            JoinConstraint::On(_) | JoinConstraint::None => continue,
            JoinConstraint::Natural => return None,
        };
        let side = side_of(&join.join_operator)?;
        if i == 0 && from.joins.len() == 1 {
            wildcard_sides = Some((first.clone(), right.clone()));
        }
        for name in using {
            let [part] = name.0.as_slice() else { return None };
            let column = part.as_ident()?.clone();
            let key = lower(&column);
            let at = columns.iter().position(|(k, _, _)| *k == key);
            let left = match at {
                Some(at) => columns[at].2.clone(),
                // A column first merged here: its left side is the first relation, if it is the
                // only one so far.
                None if i == 0 => qualified(&first, &column),
                None => return None,
            };
            let merged = match side {
                Side::Left => left,
                Side::Right => qualified(&right, &column),
                Side::Full => coalesce(left, qualified(&right, &column)),
            };
            match at {
                Some(at) => columns[at].2 = merged,
                None => columns.push((key, column, merged)),
            }
        }
    }
    (!columns.is_empty()).then_some(Merged { columns, wildcard_sides })
}

/// Which side's key a join keeps (inner and left joins keep the left's).
enum Side {
    Left,
    Right,
    Full,
}

fn side_of(operator: &JoinOperator) -> Option<Side> {
    match operator {
        JoinOperator::Join(_) | JoinOperator::Inner(_) | JoinOperator::Left(_) | JoinOperator::LeftOuter(_) => {
            Some(Side::Left)
        }
        JoinOperator::Right(_) | JoinOperator::RightOuter(_) => Some(Side::Right),
        JoinOperator::FullOuter(_) => Some(Side::Full),
        _ => None,
    }
}

/// The constraint (`ON`, `USING`, `NATURAL`) of a join that has one.
pub(crate) fn constraint(operator: &JoinOperator) -> Option<&JoinConstraint> {
    match operator {
        JoinOperator::Join(c)
        | JoinOperator::Inner(c)
        | JoinOperator::Left(c)
        | JoinOperator::LeftOuter(c)
        | JoinOperator::Right(c)
        | JoinOperator::RightOuter(c)
        | JoinOperator::FullOuter(c)
        | JoinOperator::CrossJoin(c) => Some(c),
        _ => None,
    }
}

/// [`constraint`], to change.
pub(crate) fn constraint_mut(operator: &mut JoinOperator) -> Option<&mut JoinConstraint> {
    match operator {
        JoinOperator::Join(c)
        | JoinOperator::Inner(c)
        | JoinOperator::Left(c)
        | JoinOperator::LeftOuter(c)
        | JoinOperator::Right(c)
        | JoinOperator::RightOuter(c)
        | JoinOperator::FullOuter(c)
        | JoinOperator::CrossJoin(c) => Some(c),
        _ => None,
    }
}

/// Rewrites unqualified merged columns outside nested queries.
struct Rewriter<'a> {
    by_name: &'a HashMap<String, Expr>,
    depth: usize,
}

impl VisitorMut for Rewriter<'_> {
    type Break = ();

    fn pre_visit_query(&mut self, _query: &mut Query) -> ControlFlow<()> {
        self.depth += 1;
        ControlFlow::Continue(())
    }

    fn post_visit_query(&mut self, _query: &mut Query) -> ControlFlow<()> {
        self.depth -= 1;
        ControlFlow::Continue(())
    }

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        if self.depth == 0
            && let Expr::Identifier(ident) = expr
            && let Some(merged) = self.by_name.get(&lower(ident))
        {
            *expr = merged.clone();
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use datafusion::sql::parser::DFParser;

    use super::*;

    fn rewritten(sql: &str) -> String {
        crate::sql_ast::rewritten_by(sql, merge_using_columns)
    }

    #[test]
    fn merged_columns_by_join_type() {
        assert_eq!(
            rewritten("SELECT k, count(*) FROM a JOIN b USING (k) WHERE k = 1 GROUP BY k"),
            "SELECT a.k AS k, count(*) FROM a JOIN b USING(k) WHERE a.k = 1 GROUP BY a.k"
        );
        assert_eq!(rewritten("SELECT k FROM a RIGHT JOIN b USING (k)"), "SELECT b.k AS k FROM a RIGHT JOIN b USING(k)");
        assert_eq!(
            rewritten("SELECT sum(k) FROM a AS x FULL JOIN b y USING (k)"),
            "SELECT sum(coalesce(x.k, y.k)) FROM a AS x FULL JOIN b y USING(k)"
        );
        assert_eq!(
            rewritten("SELECT * FROM a FULL JOIN b USING (k)"),
            "SELECT coalesce(a.k, b.k) AS k, a.* EXCLUDE (k), b.* EXCLUDE (k) FROM a FULL JOIN b USING(k)"
        );
        // Every join type lists the merged columns first, in the USING list's order.
        assert_eq!(
            rewritten("SELECT * FROM a JOIN b USING (y, x)"),
            "SELECT a.y AS y, a.x AS x, a.* EXCLUDE (y, x), b.* EXCLUDE (y, x) FROM a JOIN b USING(y, x)"
        );
    }

    #[test]
    fn what_it_cannot_follow_is_left_as_written() {
        for sql in [
            "SELECT k FROM a JOIN b ON a.k = b.k",
            "SELECT k FROM a NATURAL JOIN b",
            "SELECT k FROM a, b JOIN c USING (k)",
            "SELECT k FROM a JOIN b ON a.x = b.x JOIN c USING (k)",
        ] {
            let statement = DFParser::parse_sql(sql).expect("parse").pop_front().expect("statement").to_string();
            assert_eq!(rewritten(sql), statement, "{sql}");
        }
        // A nested query's own `k` is its own.
        let sql = rewritten("SELECT k FROM a JOIN b USING (k) WHERE EXISTS (SELECT 1 FROM c WHERE c.x = k)");
        assert!(sql.ends_with("WHERE EXISTS (SELECT 1 FROM c WHERE c.x = k)"), "{sql}");
        // A chain: the second join's left side is the first join's merged column.
        let sql = rewritten("SELECT k FROM a FULL JOIN b USING (k) FULL JOIN c USING (k)");
        assert!(sql.starts_with("SELECT coalesce(coalesce(a.k, b.k), c.k) AS k"), "{sql}");
    }
}
