//! Correlated scalar subqueries that DataFusion cannot turn into a join, evaluated once per
//! outer row: `(SELECT count(*) FROM u WHERE u.ts > t.ts)`, `(SELECT min(v) FROM u WHERE u.k =
//! t.k AND u.v <> t.name)`, `(SELECT s FROM u WHERE t.flag AND u.k = t.k)`.
//!
//! Why: DataFusion decorrelates a scalar subquery only when every correlated predicate is an
//! equality between a column of the subquery and an expression of the outer row; the answer's
//! groups are then keyed by that column. Any other correlation (`<`, `<>`, a condition on the
//! outer row alone) stayed in the plan and failed in the physical planner ("Physical plan does
//! not support logical expression ScalarSubquery"). PostgreSQL runs them all, and client catalog
//! queries (psql's `\d`, SQLAlchemy's column listing) use them.
//!
//! How: [`NumberedOuterRows`], an analyzer rule, rewrites the node that holds such a subquery,
//! a projection or a filter over an input `outer`:
//! 1. the outer rows are numbered (`row_number() OVER ()`);
//! 2. left-joined to the subquery's rows on the correlated conditions of its `WHERE` clause
//!    (outer references become columns of the join; its other conditions filter its rows
//!    first), each inner row marked;
//! 3. grouped by the row number: the subquery's aggregates over the marked rows only (`FILTER`,
//!    so an outer row without a match aggregates no rows: `count` 0, others NULL, as the
//!    subquery would), and each outer column's one value (`first_value`);
//! 4. the subquery's expression above its aggregate computed from those, in place of it.
//!
//! Every outer row is one group, so the node's rows are the same rows, with the subquery's value
//! per row. The subquery must be an aggregate without GROUP BY (a non-aggregated one already
//! became one, see `crate::scalar_subqueries`), its correlation in the `WHERE` clause under the
//! aggregate; other shapes are left to DataFusion. Numbering the rows takes them to one
//! partition (on a cluster: to the node running the query), so this plan trades scaling for
//! running at all; subqueries DataFusion can join on equalities keep its plan.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, Result};
use datafusion::functions_aggregate::first_last::first_value_udaf;
use datafusion::functions_window::expr_fn::row_number;
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::logical_plan::{Filter, Projection};
use datafusion::logical_expr::utils::{conjunction, split_conjunction_owned};
use datafusion::logical_expr::{Expr, JoinType, LogicalPlan, LogicalPlanBuilder, Subquery, lit};
use datafusion::optimizer::AnalyzerRule;
use datafusion::optimizer::decorrelate::PullUpCorrelatedExpr;

/// The analyzer rule. See the module doc.
#[derive(Debug, Default)]
pub struct NumberedOuterRows;

impl AnalyzerRule for NumberedOuterRows {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        let mut rewritten = 0usize;
        plan.transform_up_with_subqueries(|node| {
            let mut node = node;
            let mut changed = false;
            while let Some((subquery, shape)) = candidate(&node)? {
                rewritten += 1;
                node = numbered(node, &subquery, shape, rewritten)?;
                changed = true;
            }
            Ok(if changed { Transformed::yes(node) } else { Transformed::no(node) })
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "shardwise_numbered_outer_rows"
    }
}

/// A subquery taken apart: `value` (its output, over the aggregates' results named
/// `__aggregate_i` and the outer columns), `aggregates` and `predicate` (its correlated
/// conjuncts) over the columns of `rows` and outer references.
struct Shape {
    value: Expr,
    aggregates: Vec<Expr>,
    predicate: Expr,
    rows: LogicalPlan,
}

/// The first scalar subquery of `node` that this rule rewrites, if any.
fn candidate(node: &LogicalPlan) -> Result<Option<(Subquery, Shape)>> {
    if !matches!(node, LogicalPlan::Projection(_) | LogicalPlan::Filter(_)) {
        return Ok(None);
    }
    let [outer] = node.inputs()[..] else { return Ok(None) };
    let mut found = None;
    node.apply_expressions(|e| {
        e.apply(|e| {
            if let Expr::ScalarSubquery(sq) = e
                && !sq.outer_ref_columns.is_empty()
                && let Some(shape) = shape(sq, outer)?
            {
                found = Some((sq.clone(), shape));
                return Ok(TreeNodeRecursion::Stop);
            }
            Ok(TreeNodeRecursion::Continue)
        })
    })?;
    Ok(found)
}

/// `sq` taken apart, when DataFusion cannot join it and it has the shape this rule handles.
fn shape(sq: &Subquery, outer: &LogicalPlan) -> Result<Option<Shape>> {
    // Every outer reference must be a column of this node's input (not of a query further out).
    let outer_schema = outer.schema();
    let all_here = sq.outer_ref_columns.iter().all(|e| match e {
        Expr::OuterReferenceColumn(_, c) => outer_schema.has_column(c),
        _ => false,
    });
    if !all_here || datafusion_joins_it(sq) {
        return Ok(None);
    }
    // Above the aggregate: projections and aliases of one value.
    let mut node = sq.subquery.as_ref();
    while let LogicalPlan::Projection(Projection { input, .. })
    | LogicalPlan::SubqueryAlias(datafusion::logical_expr::SubqueryAlias { input, .. }) = node
    {
        node = input;
    }
    let LogicalPlan::Aggregate(aggregate) = node else { return Ok(None) };
    if !aggregate.group_expr.is_empty() {
        return Ok(None);
    }
    let Some(value) = output(sq.subquery.as_ref(), 0)? else { return Ok(None) };
    // Below it: projections and aliases down to the filter that holds the correlation.
    let mut below = Vec::new();
    let mut node = aggregate.input.as_ref();
    let filter = loop {
        match node {
            LogicalPlan::Projection(_) | LogicalPlan::SubqueryAlias(_) => below.push(node),
            LogicalPlan::Filter(f) if f.predicate.contains_outer() => break f,
            _ => return Ok(None),
        }
        node = node.inputs()[0];
    };
    if correlated_below(&filter.input)? {
        return Ok(None);
    }
    let mut aggregates = Vec::with_capacity(aggregate.aggr_expr.len());
    for e in &aggregate.aggr_expr {
        // Outer references in the aggregates or the projections under them (`sum(u.v * t.w)`)
        // become columns of the join's rows in [`numbered`].
        match through(e.clone().unalias_nested().data, &below)? {
            Some(e) => aggregates.push(e),
            None => return Ok(None),
        }
    }
    // Conditions on the subquery's rows alone filter them before the join; the others are the
    // join's condition, where a subquery cannot be planned.
    let (correlated, local): (Vec<Expr>, Vec<Expr>) =
        split_conjunction_owned(filter.predicate.clone()).into_iter().partition(Expr::contains_outer);
    if correlated.iter().any(has_subquery) {
        return Ok(None);
    }
    let mut rows = LogicalPlanBuilder::from(filter.input.as_ref().clone());
    if let Some(local) = conjunction(local) {
        rows = rows.filter(local)?;
    }
    let Some(predicate) = conjunction(correlated) else { return Ok(None) };
    Ok(Some(Shape { value, aggregates, predicate, rows: rows.build()? }))
}

/// Whether `e` holds a subquery (scalar, EXISTS or IN).
pub(crate) fn has_subquery(e: &Expr) -> bool {
    e.exists(|e| Ok(matches!(e, Expr::ScalarSubquery(_) | Expr::Exists(_) | Expr::InSubquery(_)))).unwrap_or(true)
}

/// True when DataFusion's own decorrelation (`scalar_subquery_to_join`) takes `sq`.
fn datafusion_joins_it(sq: &Subquery) -> bool {
    let mut pull_up = PullUpCorrelatedExpr::new().with_need_handle_count_bug(true);
    sq.subquery.as_ref().clone().rewrite(&mut pull_up).is_ok() && pull_up.can_pull_up
}

/// True when a node of `plan` refers to a query further out, or holds a correlated subquery.
fn correlated_below(plan: &LogicalPlan) -> Result<bool> {
    plan.exists(|node| {
        let mut correlated = node.contains_outer_reference();
        node.apply_expressions(|e| {
            e.apply(|e| {
                if matches!(e, Expr::ScalarSubquery(sq) if !sq.outer_ref_columns.is_empty())
                    || matches!(e, Expr::Exists(x) if !x.subquery.outer_ref_columns.is_empty())
                    || matches!(e, Expr::InSubquery(x) if !x.subquery.outer_ref_columns.is_empty())
                {
                    correlated = true;
                    return Ok(TreeNodeRecursion::Stop);
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })?;
        Ok(correlated)
    })
}

/// The name given to the subquery's `i`th aggregate in the rewritten plan `n`.
fn aggregate_name(n: usize, i: usize) -> String {
    format!("__shardwise_subquery_{n}_value_{i}")
}

/// Output `index` of `node` (above the aggregate) as an expression of the aggregates' results
/// (columns `__aggregate_i`, renamed in [`numbered`]) and the outer columns; `None` for a node
/// this rule does not read.
fn output(node: &LogicalPlan, index: usize) -> Result<Option<Expr>> {
    match node {
        LogicalPlan::Aggregate(_) => Ok(Some(Expr::Column(Column::new_unqualified(format!("__aggregate_{index}"))))),
        LogicalPlan::SubqueryAlias(a) => output(&a.input, index),
        LogicalPlan::Projection(p) => {
            let Some(e) = p.expr.get(index) else { return Ok(None) };
            if has_subquery(e) {
                return Ok(None);
            }
            let input = p.input.as_ref();
            let mut unknown = false;
            let e = e
                .clone()
                .unalias_nested()
                .data
                .transform(|e| match e {
                    Expr::Column(c) => match input.schema().index_of_column(&c) {
                        Ok(i) => match output(input, i)? {
                            Some(e) => Ok(Transformed::yes(e)),
                            None => {
                                unknown = true;
                                Ok(Transformed::no(Expr::Column(c)))
                            }
                        },
                        Err(_) => {
                            unknown = true;
                            Ok(Transformed::no(Expr::Column(c)))
                        }
                    },
                    Expr::OuterReferenceColumn(_, c) => Ok(Transformed::yes(Expr::Column(c))),
                    other => Ok(Transformed::no(other)),
                })?
                .data;
            Ok((!unknown).then_some(e))
        }
        _ => Ok(None),
    }
}

/// `e`, over the output of the first of `path` (projections and aliases, top down), as an
/// expression over the input of the last; `None` if a column is not found.
fn through(mut e: Expr, path: &[&LogicalPlan]) -> Result<Option<Expr>> {
    for node in path {
        let input = node.inputs()[0];
        let mut unknown = false;
        e = e
            .transform(|e| match e {
                Expr::Column(c) => {
                    let Ok(i) = node.schema().index_of_column(&c) else {
                        unknown = true;
                        return Ok(Transformed::no(Expr::Column(c)));
                    };
                    let defined = match node {
                        LogicalPlan::Projection(p) => p.expr[i].clone().unalias_nested().data,
                        _ => {
                            let (qualifier, field) = input.schema().qualified_field(i);
                            Expr::Column(Column::new(qualifier.cloned(), field.name()))
                        }
                    };
                    Ok(Transformed::yes(defined))
                }
                other => Ok(Transformed::no(other)),
            })?
            .data;
        if unknown {
            return Ok(None);
        }
    }
    Ok(Some(e))
}

/// `e` with its outer references as plain columns (of the join's left side).
fn outer_as_columns(e: Expr) -> Result<Expr> {
    e.transform(|e| match e {
        Expr::OuterReferenceColumn(_, c) => Ok(Transformed::yes(Expr::Column(c))),
        other => Ok(Transformed::no(other)),
    })
    .map(|t| t.data)
}

/// `node` with `subquery` computed per outer row as the module doc says (`n` numbers the
/// rewrite, for names of its own).
fn numbered(node: LogicalPlan, subquery: &Subquery, shape: Shape, n: usize) -> Result<LogicalPlan> {
    let Shape { value, aggregates, predicate, rows } = shape;
    let outer = node.inputs()[0].clone();
    let row = format!("__shardwise_subquery_{n}_row");
    let matched = format!("__shardwise_subquery_{n}_match");
    let numbered = LogicalPlanBuilder::from(outer.clone()).window(vec![row_number().alias(&row)])?.build()?;
    // The subquery's columns get names of their own, so that none clashes with an outer one
    // (`FROM u ... WHERE (SELECT .. FROM u WHERE u.v > t.v)`); then outer references become
    // plain columns.
    let rows_schema = Arc::clone(rows.schema());
    let renamed = |i: usize| format!("__shardwise_subquery_{n}_column_{i}");
    let to_join = |e: Expr| -> Result<Expr> {
        let e = e
            .transform(|e| match e {
                Expr::Column(c) => match rows_schema.index_of_column(&c) {
                    Ok(i) => Ok(Transformed::yes(Expr::Column(Column::new_unqualified(renamed(i))))),
                    Err(_) => Ok(Transformed::no(Expr::Column(c))),
                },
                other => Ok(Transformed::no(other)),
            })?
            .data;
        outer_as_columns(e)
    };
    let predicate = to_join(predicate)?;
    let aggregates = aggregates.into_iter().map(to_join).collect::<Result<Vec<_>>>()?;
    let mut marked: Vec<Expr> =
        rows_schema.columns().into_iter().enumerate().map(|(i, c)| Expr::Column(c).alias(renamed(i))).collect();
    marked.push(lit(true).alias(&matched));
    let marked = LogicalPlanBuilder::from(rows).project(marked)?.build()?;
    let joined = LogicalPlanBuilder::from(numbered).join_on(marked, JoinType::Left, vec![predicate])?.build()?;

    let is_match = Expr::Column(Column::new_unqualified(&matched)).is_not_null();
    let mut aggr_expr = Vec::new();
    for (qualifier, field) in outer.schema().iter() {
        let column = Expr::Column(Column::new(qualifier.cloned(), field.name()));
        let first = AggregateFunction::new_udf(first_value_udaf(), vec![column], false, None, Vec::new(), None);
        aggr_expr.push(Expr::AggregateFunction(first).alias_qualified(qualifier.cloned(), field.name()));
    }
    for (i, aggregate) in aggregates.into_iter().enumerate() {
        let Expr::AggregateFunction(mut f) = aggregate else {
            return datafusion::common::plan_err!("a subquery's aggregate is not an aggregate function: {aggregate}");
        };
        f.params.filter = Some(Box::new(match f.params.filter.take() {
            Some(filter) => filter.and(is_match.clone()),
            None => is_match.clone(),
        }));
        aggr_expr.push(Expr::AggregateFunction(f).alias(aggregate_name(n, i)));
    }
    let grouped = LogicalPlanBuilder::from(joined)
        .aggregate(vec![Expr::Column(Column::new_unqualified(&row))], aggr_expr)?
        .build()?;

    let value = value
        .transform(|e| match e {
            Expr::Column(c) if c.relation.is_none() && c.name.starts_with("__aggregate_") => {
                let i: usize = c.name["__aggregate_".len()..].parse().unwrap_or(usize::MAX);
                Ok(Transformed::yes(Expr::Column(Column::new_unqualified(aggregate_name(n, i)))))
            }
            other => Ok(Transformed::no(other)),
        })?
        .data;
    let replace = |e: Expr| -> Result<Expr> {
        e.transform(|e| match e {
            Expr::ScalarSubquery(sq) if &sq == subquery => Ok(Transformed::yes(value.clone())),
            other => Ok(Transformed::no(other)),
        })
        .map(|t| t.data)
    };
    match node {
        LogicalPlan::Projection(p) => {
            let names = NamePreserver::new_for_projection();
            let mut exprs = Vec::with_capacity(p.expr.len());
            for e in p.expr {
                let name = names.save(&e);
                exprs.push(name.restore(replace(e)?));
            }
            Ok(LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(grouped))?))
        }
        LogicalPlan::Filter(f) => {
            let filtered = LogicalPlan::Filter(Filter::try_new(replace(f.predicate)?, Arc::new(grouped))?);
            let columns = outer.schema().columns().into_iter().map(Expr::Column);
            LogicalPlanBuilder::from(filtered).project(columns)?.build()
        }
        other => Ok(other),
    }
}

#[cfg(test)]
pub(crate) mod tests;
