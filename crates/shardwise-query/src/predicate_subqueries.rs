//! `EXISTS`, `IN` and `NOT IN` subqueries rewritten where DataFusion's joins for them give wrong
//! answers: rows dropped or kept where PostgreSQL says otherwise, without an error.
//!
//! Why, and what each rewrite does ([`PredicateSubqueries`], an analyzer rule):
//! - A subquery that aggregates without GROUP BY (`SELECT count(*) FROM u WHERE u.k = t.k`)
//!   returns exactly one row for every outer row, but DataFusion's semi join lost the outer rows
//!   without a match. `EXISTS` of it is TRUE (`NOT EXISTS` FALSE); with a HAVING it is `(SELECT
//!   <having> ...) IS TRUE`; `x IN` of it is `x = (SELECT ...)`, and `NOT IN` is `<>`.
//! - `x NOT IN (SELECT y ... correlated)`: DataFusion's null-aware anti join saw a NULL `y` of any
//!   outer row's subquery (and refused correlations on more than one column). As a condition of
//!   the WHERE clause it is `NOT EXISTS (SELECT ... WHERE y = x OR y IS NULL OR x IS NULL)`: the
//!   same rows pass, since a WHERE drops a NULL as it drops FALSE.
//! - `x [NOT] IN (SELECT y ...)` inside another condition (`a OR x NOT IN (...)`), where a NULL
//!   is not a FALSE: DataFusion's mark join answered TRUE or FALSE, never PostgreSQL's NULL. It
//!   becomes `EXISTS (... WHERE y = x) OR NULLIF(EXISTS (... WHERE y IS NULL OR x IS NULL),
//!   TRUE)` (under NOT for NOT IN): TRUE on a match, else NULL if a NULL was compared, else
//!   FALSE.
//!
//! - `EXISTS (...)` and `x [NOT] IN (...)` in a SELECT list, which DataFusion could not plan
//!   there at all: `(SELECT count(*) FROM (...)) > 0`, a scalar subquery (the `IN` as above,
//!   with such counts for its `EXISTS`).
//!
//! `IN` as a condition of its own and an uncorrelated `NOT IN` of a column keep DataFusion's
//! plans, which are right.

use std::ops::Not;
use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DFSchema, Result};
use datafusion::logical_expr::expr::{Exists, InSubquery};
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::logical_plan::Filter;
use datafusion::logical_expr::utils::{conjunction, split_conjunction_owned};
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder, Subquery, lit};
use datafusion::optimizer::AnalyzerRule;

/// The analyzer rule. See the module doc.
#[derive(Debug, Default)]
pub struct PredicateSubqueries;

impl AnalyzerRule for PredicateSubqueries {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        plan.transform_up_with_subqueries(|node| {
            // The one-row subqueries, wherever they are.
            let names = NamePreserver::new(&node);
            let node = node.map_expressions(|e| {
                let name = names.save(&e);
                let rewritten = e.transform_up(one_row)?;
                Ok(rewritten.update_data(|e| name.restore(e)))
            })?;
            // In a SELECT list, where DataFusion has no join for them, as counts.
            if let LogicalPlan::Projection(p) = &node.data {
                let schema = Arc::clone(p.input.schema());
                let names = NamePreserver::new(&node.data);
                let transformed = node.transformed;
                let counted = node.data.map_expressions(|e| {
                    let name = names.save(&e);
                    let rewritten = e.transform_up(|e| counted(e, &schema))?;
                    Ok(rewritten.update_data(|e| name.restore(e)))
                })?;
                return Ok(if transformed { Transformed::yes(counted.data) } else { counted });
            }
            let LogicalPlan::Filter(filter) = node.data else { return Ok(node) };
            let schema = Arc::clone(filter.input.schema());
            let mut changed = node.transformed;
            let mut conditions = Vec::new();
            for condition in split_conjunction_owned(filter.predicate) {
                let rewritten = match condition {
                    Expr::InSubquery(InSubquery { expr, subquery, negated: true })
                        if !subquery.outer_ref_columns.is_empty() || is_constant(&expr)? =>
                    {
                        match not_in_as_not_exists(&expr, &subquery, &schema)? {
                            Some(e) => Transformed::yes(e),
                            None => Transformed::no(Expr::InSubquery(InSubquery { expr, subquery, negated: true })),
                        }
                    }
                    Expr::InSubquery(top) => Transformed::no(Expr::InSubquery(top)),
                    other => other.transform_up(|e| embedded_in(e, &schema))?,
                };
                changed |= rewritten.transformed;
                conditions.push(rewritten.data);
            }
            let predicate = conjunction(conditions).unwrap_or_else(|| lit(true));
            let filter = LogicalPlan::Filter(Filter::try_new(predicate, filter.input)?);
            Ok(if changed { Transformed::yes(filter) } else { Transformed::no(filter) })
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "shardwise_predicate_subqueries"
    }
}

/// The aggregate without GROUP BY at the top of `plan` (under projections and aliases), with
/// the HAVING condition over it if there is one; `None` if `plan` is not one.
fn one_row_aggregate(plan: &LogicalPlan) -> Option<(Option<&Expr>, &LogicalPlan)> {
    match plan {
        LogicalPlan::Projection(p) => one_row_aggregate(&p.input),
        LogicalPlan::SubqueryAlias(a) => one_row_aggregate(&a.input),
        LogicalPlan::Aggregate(a) if a.group_expr.is_empty() => Some((None, plan)),
        LogicalPlan::Filter(f) => match f.input.as_ref() {
            LogicalPlan::Aggregate(a) if a.group_expr.is_empty() => Some((Some(&f.predicate), f.input.as_ref())),
            _ => None,
        },
        _ => None,
    }
}

/// `EXISTS` / `IN` of a subquery that returns one row (see the module doc).
fn one_row(e: Expr) -> Result<Transformed<Expr>> {
    match e {
        Expr::Exists(Exists { subquery, negated }) => match one_row_aggregate(&subquery.subquery) {
            Some((None, _)) => Ok(Transformed::yes(lit(!negated))),
            Some((Some(having), aggregate)) => {
                let test = LogicalPlanBuilder::from(aggregate.clone()).project(vec![having.clone()])?.build()?;
                let value = Expr::ScalarSubquery(Subquery { subquery: Arc::new(test), ..subquery });
                Ok(Transformed::yes(if negated { value.is_not_true() } else { value.is_true() }))
            }
            None => Ok(Transformed::no(Expr::Exists(Exists { subquery, negated }))),
        },
        Expr::InSubquery(InSubquery { expr, subquery, negated })
            if matches!(one_row_aggregate(&subquery.subquery), Some((None, _))) =>
        {
            let value = Expr::ScalarSubquery(subquery);
            Ok(Transformed::yes(if negated { (*expr).not_eq(value) } else { (*expr).eq(value) }))
        }
        other => Ok(Transformed::no(other)),
    }
}

/// Whether `x` reads no column (`3`, `$1`, `CAST(NULL AS INT)`): DataFusion's null-aware anti
/// join for `3 NOT IN (SELECT y ...)` took the comparison as a filter of the subquery's rows, so
/// a NULL `y` no longer reached it (DataFusion issue 25340).
fn is_constant(x: &Expr) -> Result<bool> {
    let reads = x.exists(|e| {
        Ok(matches!(e, Expr::Column(_) | Expr::OuterReferenceColumn(..) | Expr::ScalarSubquery(_))
            || matches!(e, Expr::InSubquery(_) | Expr::Exists(_)))
    })?;
    Ok(!reads)
}

/// `x` as the subquery sees it: its columns (of the outer row, `schema`) as outer references;
/// `None` if it holds a subquery.
fn as_outer(x: &Expr, schema: &DFSchema) -> Result<Option<Expr>> {
    if crate::numbered_subqueries::has_subquery(x) {
        return Ok(None);
    }
    let mut unknown = false;
    let outer = x
        .clone()
        .transform(|e| match e {
            Expr::Column(c) => match schema.qualified_field_from_column(&c) {
                Ok((_, field)) => Ok(Transformed::yes(Expr::OuterReferenceColumn(Arc::clone(field), c))),
                Err(_) => {
                    unknown = true;
                    Ok(Transformed::no(Expr::Column(c)))
                }
            },
            other => Ok(Transformed::no(other)),
        })?
        .data;
    Ok((!unknown).then_some(outer))
}

/// A number for each subquery [`exists_where`] names.
static NEXT_ALIAS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// `EXISTS (SELECT * FROM (subquery) WHERE condition(y, x))`, `y` the subquery's column and `x`
/// an outer expression.
fn exists_where(
    subquery: &Subquery,
    x: &Expr,
    schema: &DFSchema,
    condition: fn(Expr, Expr) -> Expr,
) -> Result<Option<Expr>> {
    let Some(x) = as_outer(x, schema)? else { return Ok(None) };
    if subquery.subquery.schema().fields().is_empty() {
        return Ok(None);
    }
    // An uncorrelated subquery under a name of its own: its column and the outer row's would
    // otherwise share a name when both read one table (`k IN (SELECT k FROM r ...)` over `r`), and
    // DataFusion's decorrelation read `r.k = outer r.k` as a condition on the subquery alone (a
    // cross join, every outer row repeated). A correlated one keeps its plan, which DataFusion's
    // decorrelation needs to see through.
    let builder = LogicalPlanBuilder::from(subquery.subquery.as_ref().clone());
    let builder = if subquery.outer_ref_columns.is_empty() {
        builder.alias(format!("__shardwise_in_{}", NEXT_ALIAS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)))?
    } else {
        builder
    };
    let y = match subquery.subquery.head_output_expr()? {
        Some(Expr::Alias(a)) if subquery.outer_ref_columns.is_empty().not() => {
            Expr::Column(datafusion::common::Column::new_unqualified(a.name))
        }
        Some(Expr::Column(c)) if subquery.outer_ref_columns.is_empty().not() => Expr::Column(c),
        _ => {
            let (qualifier, field) = builder.schema().qualified_field(0);
            Expr::Column(datafusion::common::Column::new(qualifier.cloned(), field.name()))
        }
    };
    let filtered = builder.filter(condition(y, x.clone()))?.build()?;
    let mut outer_ref_columns = subquery.outer_ref_columns.clone();
    x.apply(|e| {
        if matches!(e, Expr::OuterReferenceColumn(..)) && !outer_ref_columns.contains(e) {
            outer_ref_columns.push(e.clone());
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    })?;
    let subquery = Subquery { subquery: Arc::new(filtered), outer_ref_columns, spans: subquery.spans.clone() };
    Ok(Some(Expr::Exists(Exists { subquery, negated: false })))
}

/// `y = x OR y IS NULL OR x IS NULL`: a row `x NOT IN` does not pass.
fn equal_or_null(y: Expr, x: Expr) -> Expr {
    y.clone().eq(x.clone()).or(y.is_null()).or(x.is_null())
}

/// `y IS NULL OR x IS NULL`: a row that makes `x IN` NULL where no row is equal.
fn either_null(y: Expr, x: Expr) -> Expr {
    y.is_null().or(x.is_null())
}

fn equal(y: Expr, x: Expr) -> Expr {
    y.eq(x)
}

/// A WHERE condition `x NOT IN (correlated subquery)` as `NOT EXISTS (...)`.
fn not_in_as_not_exists(x: &Expr, subquery: &Subquery, schema: &DFSchema) -> Result<Option<Expr>> {
    Ok(exists_where(subquery, x, schema, equal_or_null)?.map(Expr::not))
}

/// `x [NOT] IN (subquery)` inside another condition, as the module doc says.
fn embedded_in(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    let Expr::InSubquery(InSubquery { expr, subquery, negated }) = e else { return Ok(Transformed::no(e)) };
    let (Some(matched), Some(nulls)) =
        (exists_where(&subquery, &expr, schema, equal)?, exists_where(&subquery, &expr, schema, either_null)?)
    else {
        return Ok(Transformed::no(Expr::InSubquery(InSubquery { expr, subquery, negated })));
    };
    let null_if_any = datafusion::functions::expr_fn::nullif(nulls, lit(true));
    let is_in = matched.or(null_if_any);
    Ok(Transformed::yes(if negated { is_in.not() } else { is_in }))
}

/// `EXISTS (subquery)` as `(SELECT count(*) FROM (subquery)) > 0`, a scalar subquery (`= 0` for
/// NOT EXISTS).
fn exists_as_count(exists: Expr) -> Result<Expr> {
    let Expr::Exists(Exists { subquery, negated }) = exists else { return Ok(exists) };
    let count = datafusion::functions_aggregate::count::count_all();
    let plan = LogicalPlanBuilder::from(subquery.subquery.as_ref().clone())
        .aggregate(Vec::<Expr>::new(), vec![count])?
        .build()?;
    let rows = Expr::ScalarSubquery(Subquery { subquery: Arc::new(plan), ..subquery });
    Ok(if negated { rows.eq(lit(0i64)) } else { rows.gt(lit(0i64)) })
}

/// `EXISTS` and `x [NOT] IN` of a SELECT list as scalar subqueries that count (the second as the
/// module doc's `IN` inside another condition).
fn counted(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    match e {
        Expr::Exists(_) => Ok(Transformed::yes(exists_as_count(e)?)),
        Expr::InSubquery(InSubquery { expr, subquery, negated }) => {
            let (Some(matched), Some(nulls)) =
                (exists_where(&subquery, &expr, schema, equal)?, exists_where(&subquery, &expr, schema, either_null)?)
            else {
                return Ok(Transformed::no(Expr::InSubquery(InSubquery { expr, subquery, negated })));
            };
            let null_if_any = datafusion::functions::expr_fn::nullif(exists_as_count(nulls)?, lit(true));
            let is_in = exists_as_count(matched)?.or(null_if_any);
            Ok(Transformed::yes(if negated { is_in.not() } else { is_in }))
        }
        other => Ok(Transformed::no(other)),
    }
}

#[cfg(test)]
mod tests;
