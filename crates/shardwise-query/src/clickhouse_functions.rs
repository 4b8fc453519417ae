//! ClickHouse's names for the aggregate, conditional, date and conversion functions a `GROUP BY`
//! query uses most (`uniq`, `uniqExact`, `countIf`, `sumIf`, `argMax`, `groupArray`,
//! `quantile(0.9)(x)`, `if`, `multiIf`, `toDate`, `toStartOfHour`, `toYYYYMM`, ...), run as the
//! DataFusion expressions that compute them.
//!
//! Why: shardwise answers ClickHouse's `distributed_group_by_no_merge` and its HTTP interface, so
//! ClickHouse users bring ClickHouse queries; `SELECT uniq(user_id) FROM events` failed with
//! "Invalid function 'uniq'".
//!
//! How: [`as_datafusion`], a pass over the parsed statement, replaces each call of a name in
//! [`TEMPLATES`] (unquoted, in any case, as DataFusion reads function names; never one DataFusion
//! itself has) by its template: an expression in which `__a0`, `__a1`, ... stand for the call's
//! arguments and `__p0` for its parameter (`quantile(0.9)(x)`). A call's `OVER` and `FILTER`
//! clauses stay on the outer call of the template. An unaliased SELECT item that held such a call
//! is named by its text as written (`uniq(g)`), as ClickHouse names it; PostgreSQL clients see
//! PostgreSQL's names as for any query (`crate::postgres_names`). Where ClickHouse leaves the
//! answer to chance, the template chooses: `any(x)` is the smallest non-NULL value and
//! `anyLast(x)` the largest, `uniq` is DataFusion's HyperLogLog estimate; the aggregates give NULL
//! over no rows, as this engine's `sum` does (ClickHouse gives 0).

use std::ops::ControlFlow;

use datafusion::execution::SessionState;
use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{
    BinaryOperator, Expr, Function, FunctionArg, FunctionArgExpr, FunctionArguments, Ident, ObjectName, Query,
    SelectItem, SetExpr, Visit, VisitMut, Visitor, VisitorMut,
};

use crate::error::QueryError;

/// ClickHouse's function (lowercased), how many arguments it takes, and the expression that
/// computes it. A quantile takes a parameter too (`__p0`, 0.5 when not given).
pub const TEMPLATES: &[(&str, usize, &str)] = &[
    // Aggregates.
    ("uniq", 1, "approx_distinct(__a0)"),
    ("uniqcombined", 1, "approx_distinct(__a0)"),
    ("uniqcombined64", 1, "approx_distinct(__a0)"),
    ("uniqhll12", 1, "approx_distinct(__a0)"),
    ("uniqexact", 1, "count(DISTINCT __a0)"),
    ("countdistinct", 1, "count(DISTINCT __a0)"),
    ("medianexact", 1, "median(__a0)"),
    ("avgweighted", 2, "sum(__a0 * __a1) / sum(CASE WHEN __a0 IS NOT NULL THEN __a1 END)"),
    ("countif", 1, "count(CASE WHEN __a0 THEN 1 END)"),
    ("sumif", 2, "sum(CASE WHEN __a1 THEN __a0 END)"),
    ("avgif", 2, "avg(CASE WHEN __a1 THEN __a0 END)"),
    ("minif", 2, "min(CASE WHEN __a1 THEN __a0 END)"),
    ("maxif", 2, "max(CASE WHEN __a1 THEN __a0 END)"),
    ("uniqif", 2, "approx_distinct(CASE WHEN __a1 THEN __a0 END)"),
    ("uniqexactif", 2, "count(DISTINCT CASE WHEN __a1 THEN __a0 END)"),
    ("any", 1, "min(__a0)"),
    ("anylast", 1, "max(__a0)"),
    ("argmax", 2, "first_value(__a0 ORDER BY __a1 DESC) FILTER (WHERE __a1 IS NOT NULL)"),
    ("argmin", 2, "first_value(__a0 ORDER BY __a1 ASC) FILTER (WHERE __a1 IS NOT NULL)"),
    // DuckDB's, Trino's and Spark's names for the same two.
    ("arg_max", 2, "first_value(__a0 ORDER BY __a1 DESC) FILTER (WHERE __a1 IS NOT NULL)"),
    ("arg_min", 2, "first_value(__a0 ORDER BY __a1 ASC) FILTER (WHERE __a1 IS NOT NULL)"),
    ("max_by", 2, "first_value(__a0 ORDER BY __a1 DESC) FILTER (WHERE __a1 IS NOT NULL)"),
    ("min_by", 2, "first_value(__a0 ORDER BY __a1 ASC) FILTER (WHERE __a1 IS NOT NULL)"),
    ("grouparray", 1, "array_agg(__a0) FILTER (WHERE __a0 IS NOT NULL)"),
    ("groupuniqarray", 1, "array_agg(DISTINCT __a0) FILTER (WHERE __a0 IS NOT NULL)"),
    ("quantile", 1, "approx_percentile_cont(__a0, __p0)"),
    ("quantiletdigest", 1, "approx_percentile_cont(__a0, __p0)"),
    // The value at position floor(level * n) of the sorted non-NULL values (the last at level 1),
    // as ClickHouse's quantileExact picks it: every value of the group is gathered.
    (
        "quantileexact",
        1,
        "array_element(array_sort(array_agg(__a0) FILTER (WHERE __a0 IS NOT NULL)), \
         CAST(least(floor(__p0 * count(__a0)), count(__a0) - 1) AS BIGINT) + 1)",
    ),
    ("stddevpop", 1, "stddev_pop(__a0)"),
    ("stddevsamp", 1, "stddev_samp(__a0)"),
    ("varpop", 1, "var_pop(__a0)"),
    ("varsamp", 1, "var_samp(__a0)"),
    // Conditionals (`multiIf` is built by `multi_if`).
    ("if", 3, "CASE WHEN __a0 THEN __a1 ELSE __a2 END"),
    // Dates and times.
    ("todate", 1, "CAST(__a0 AS DATE)"),
    ("todatetime", 1, "CAST(__a0 AS TIMESTAMP)"),
    ("tostartofminute", 1, "date_trunc('minute', __a0)"),
    ("tostartoffiveminutes", 1, "date_bin(INTERVAL '5 minutes', __a0)"),
    ("tostartoffifteenminutes", 1, "date_bin(INTERVAL '15 minutes', __a0)"),
    ("tostartofhour", 1, "date_trunc('hour', __a0)"),
    ("tostartofday", 1, "date_trunc('day', __a0)"),
    ("tostartofinterval", 2, "date_bin(__a1, __a0)"),
    ("tomonday", 1, "CAST(date_trunc('week', __a0) AS DATE)"),
    ("tostartofweek", 1, "CAST(date_trunc('week', __a0 + INTERVAL '1 day') - INTERVAL '1 day' AS DATE)"),
    ("tostartofmonth", 1, "CAST(date_trunc('month', __a0) AS DATE)"),
    ("tostartofquarter", 1, "CAST(date_trunc('quarter', __a0) AS DATE)"),
    ("tostartofyear", 1, "CAST(date_trunc('year', __a0) AS DATE)"),
    ("toyear", 1, "CAST(date_part('year', __a0) AS INT)"),
    ("toquarter", 1, "CAST(date_part('quarter', __a0) AS INT)"),
    ("tomonth", 1, "CAST(date_part('month', __a0) AS INT)"),
    ("todayofmonth", 1, "CAST(date_part('day', __a0) AS INT)"),
    ("todayofweek", 1, "CAST(date_part('isodow', __a0) AS INT)"),
    ("todayofyear", 1, "CAST(date_part('doy', __a0) AS INT)"),
    ("tohour", 1, "CAST(date_part('hour', __a0) AS INT)"),
    ("tominute", 1, "CAST(date_part('minute', __a0) AS INT)"),
    ("tosecond", 1, "CAST(date_part('second', __a0) AS INT)"),
    ("toyyyymm", 1, "CAST(date_part('year', __a0) * 100 + date_part('month', __a0) AS INT)"),
    (
        "toyyyymmdd",
        1,
        "CAST(date_part('year', __a0) * 10000 + date_part('month', __a0) * 100 + date_part('day', __a0) AS INT)",
    ),
    ("tounixtimestamp", 1, "CAST(date_part('epoch', __a0) AS BIGINT)"),
    ("addseconds", 2, "__a0 + __a1 * INTERVAL '1 second'"),
    ("addminutes", 2, "__a0 + __a1 * INTERVAL '1 minute'"),
    ("addhours", 2, "__a0 + __a1 * INTERVAL '1 hour'"),
    ("adddays", 2, "__a0 + __a1 * INTERVAL '1 day'"),
    ("addweeks", 2, "__a0 + __a1 * INTERVAL '7 days'"),
    ("addmonths", 2, "__a0 + __a1 * INTERVAL '1 month'"),
    ("addyears", 2, "__a0 + __a1 * INTERVAL '1 year'"),
    ("subtractseconds", 2, "__a0 - __a1 * INTERVAL '1 second'"),
    ("subtractminutes", 2, "__a0 - __a1 * INTERVAL '1 minute'"),
    ("subtracthours", 2, "__a0 - __a1 * INTERVAL '1 hour'"),
    ("subtractdays", 2, "__a0 - __a1 * INTERVAL '1 day'"),
    ("subtractweeks", 2, "__a0 - __a1 * INTERVAL '7 days'"),
    ("subtractmonths", 2, "__a0 - __a1 * INTERVAL '1 month'"),
    ("subtractyears", 2, "__a0 - __a1 * INTERVAL '1 year'"),
    ("formatdatetime", 2, "to_char(__a0, __a1)"),
    ("today", 0, "current_date()"),
    // ClickHouse's databases are the schemas here (what SHOW DATABASES lists): the one a name
    // without a schema is looked up in.
    ("currentdatabase", 0, "current_schema()"),
    ("yesterday", 0, "current_date() - INTERVAL '1 day'"),
    // Strings and NULLs.
    ("lowerutf8", 1, "lower(__a0)"),
    ("upperutf8", 1, "upper(__a0)"),
    ("lengthutf8", 1, "character_length(__a0)"),
    ("startswith", 2, "starts_with(__a0, __a1)"),
    ("endswith", 2, "ends_with(__a0, __a1)"),
    ("replaceall", 3, "replace(__a0, __a1, __a2)"),
    ("replaceregexpall", 3, "regexp_replace(__a0, __a1, __a2, 'g')"),
    ("match", 2, "regexp_like(__a0, __a1)"),
    ("splitbychar", 2, "string_to_array(__a1, __a0)"),
    ("isnull", 1, "__a0 IS NULL"),
    ("isnotnull", 1, "__a0 IS NOT NULL"),
    // Arrays: a row per element (`Rewrite::one_array_join` keeps it to one array per SELECT).
    ("arrayjoin", 1, "unnest(__a0)"),
    // Conversions.
    ("tostring", 1, "CAST(__a0 AS VARCHAR)"),
    ("toint8", 1, "CAST(__a0 AS TINYINT)"),
    ("toint16", 1, "CAST(__a0 AS SMALLINT)"),
    ("toint32", 1, "CAST(__a0 AS INT)"),
    ("toint64", 1, "CAST(__a0 AS BIGINT)"),
    ("tofloat32", 1, "CAST(__a0 AS REAL)"),
    ("tofloat64", 1, "CAST(__a0 AS DOUBLE)"),
];

/// The quantiles, whose level is a parameter: `quantile(0.9)(x)` (`quantiles(0.5, 0.9)(x)`, the
/// array of several, is built by `quantiles`).
const PARAMETRIC: [&str; 3] = ["quantile", "quantiletdigest", "quantileexact"];

/// Rewrites `statement`'s ClickHouse calls (see the module doc); an error names a call whose
/// arguments do not fit (the statement is then not to be planned: it may be partly rewritten).
pub fn as_datafusion(statement: &mut DfStatement, state: &SessionState) -> Result<(), QueryError> {
    let mut rewrite = Rewrite { state, error: None, array_joins: Vec::new() };
    crate::repeated_items::visit_statement_mut(statement, &mut rewrite);
    rewrite.error.map_or(Ok(()), Err)
}

struct Rewrite<'a> {
    state: &'a SessionState,
    error: Option<QueryError>,
    /// Per query being visited (innermost last): the argument of its `arrayJoin`, if it has one.
    array_joins: Vec<Option<String>>,
}

impl Rewrite<'_> {
    /// The template of `name`, if it is ClickHouse's and DataFusion has no function of its own
    /// by that name.
    fn template(&self, f: &Function) -> Option<(&'static str, usize, &'static str)> {
        let [part] = f.name.0.as_slice() else { return None };
        let ident = part.as_ident()?;
        if ident.quote_style.is_some() {
            return None;
        }
        let name = ident.value.to_ascii_lowercase();
        if self.state.scalar_functions().contains_key(&name)
            || self.state.aggregate_functions().contains_key(&name)
            || self.state.window_functions().contains_key(&name)
        {
            return None;
        }
        if let Some(special) = ["multiif", "quantiles", "quantilestdigest"].into_iter().find(|n| *n == name) {
            return Some((special, 0, ""));
        }
        TEMPLATES.iter().find(|(n, _, _)| *n == name).copied()
    }

    /// ClickHouse multiplies the rows of two `arrayJoin` calls over different arrays in one
    /// SELECT; `unnest`, which they become, would pair them instead. One array per query level is
    /// allowed (the same array twice is one join in ClickHouse too).
    fn one_array_join(&mut self, written: &ObjectName, array: &Expr) -> Result<(), QueryError> {
        let text = array.to_string();
        match self.array_joins.last_mut() {
            Some(Some(first)) if *first != text => Err(QueryError::Unsupported(format!(
                "{written}({text}) beside {written}({first}) in one SELECT: ClickHouse gives every pair of \
                 their elements, which this engine's unnest does not; take the second in an outer query \
                 (SELECT x, arrayJoin(b) FROM (SELECT arrayJoin(a) AS x, b FROM t))"
            ))),
            Some(slot) => {
                *slot = Some(text);
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn rewritten(&mut self, f: &Function) -> Result<Option<Expr>, QueryError> {
        let Some((name, arity, template)) = self.template(f) else { return Ok(None) };
        let written = &f.name;
        let args = plain_args(&f.args).ok_or_else(|| {
            QueryError::Rejected(format!(
                "{written}: ClickHouse's form takes plain arguments here (no DISTINCT, ORDER BY or named arguments)"
            ))
        })?;
        let parameters = match &f.parameters {
            FunctionArguments::None => Vec::new(),
            params => plain_args(params).ok_or_else(|| {
                QueryError::Rejected(format!("{written}: its parameters must be plain values, as in quantile(0.9)(x)"))
            })?,
        };
        if name == "multiif" {
            return multi_if(written, &args).map(Some);
        }
        if name.starts_with("quantiles") {
            return quantiles(written, &args, &parameters).map(Some);
        }
        if matches!(name, "uniqexact" | "countdistinct") && args.len() > 1 && parameters.is_empty() {
            let mut expr = distinct_tuples(&args)?;
            keep_clauses(written, f, &mut expr)?;
            return Ok(Some(expr));
        }
        if args.len() != arity {
            return Err(QueryError::Rejected(format!(
                "{written} takes {arity} argument{} (ClickHouse's {written}), {} given",
                if arity == 1 { "" } else { "s" },
                args.len()
            )));
        }
        let parametric = PARAMETRIC.contains(&name);
        if parameters.len() > usize::from(parametric) {
            return Err(QueryError::Rejected(match parametric {
                true => format!("{written}(level)(x) takes one level, {} given", parameters.len()),
                false => format!("{written} takes no parameters (its form is {written}(...), not {written}(...)(...))"),
            }));
        }
        let level = match parameters.is_empty() {
            true => vec![number("0.5")],
            false => parameters,
        };
        if name == "arrayjoin" {
            self.one_array_join(written, &args[0])?;
        }
        let mut expr = instantiate(template, &args, &level)?;
        keep_clauses(written, f, &mut expr)?;
        Ok(Some(expr))
    }

    /// Whether `expr` holds a call this pass rewrites.
    fn holds_call(&self, expr: &Expr) -> bool {
        Visit::visit(expr, &mut FindCall { rewrite: self }).is_break()
    }
}

impl VisitorMut for Rewrite<'_> {
    type Break = ();

    fn pre_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
        self.name_items(&mut query.body);
        self.array_joins.push(None);
        ControlFlow::Continue(())
    }

    fn post_visit_query(&mut self, _: &mut Query) -> ControlFlow<()> {
        self.array_joins.pop();
        ControlFlow::Continue(())
    }

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        let Expr::Function(f) = expr else { return ControlFlow::Continue(()) };
        match self.rewritten(f) {
            Ok(Some(new)) => *expr = new,
            Ok(None) => {}
            Err(e) => {
                self.error = Some(e);
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    }
}

impl Rewrite<'_> {
    /// Names each unaliased item of `body`'s SELECT lists that holds a rewritten call by its text
    /// as written, unless another item has the same text (the two keep DataFusion's names).
    fn name_items(&self, body: &mut SetExpr) {
        match body {
            SetExpr::Select(select) => {
                let holds: Vec<bool> = select
                    .projection
                    .iter()
                    .map(|item| matches!(item, SelectItem::UnnamedExpr(expr) if self.holds_call(expr)))
                    .collect();
                // Most queries have none: no item is written out as text for them.
                if !holds.contains(&true) {
                    return;
                }
                let texts: Vec<String> = select.projection.iter().map(|item| item.to_string()).collect();
                for (i, item) in select.projection.iter_mut().enumerate() {
                    let SelectItem::UnnamedExpr(expr) = item else { continue };
                    if !holds[i] || texts.iter().filter(|t| **t == texts[i]).count() > 1 {
                        continue;
                    }
                    let alias = Ident::with_quote('"', texts[i].clone());
                    *item = SelectItem::ExprWithAlias { expr: expr.clone(), alias };
                }
            }
            SetExpr::SetOperation { left, right, .. } => {
                self.name_items(left);
                self.name_items(right);
            }
            _ => {}
        }
    }
}

struct FindCall<'a, 'b> {
    rewrite: &'a Rewrite<'b>,
}

impl Visitor for FindCall<'_, '_> {
    type Break = ();

    fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<()> {
        match expr {
            Expr::Function(f) if self.rewrite.template(f).is_some() => ControlFlow::Break(()),
            _ => ControlFlow::Continue(()),
        }
    }
}

/// The arguments of a call written `f(a, b)`: `None` for DISTINCT, ORDER BY, named arguments or `*`.
fn plain_args(args: &FunctionArguments) -> Option<Vec<Expr>> {
    match args {
        FunctionArguments::None => Some(Vec::new()),
        FunctionArguments::Subquery(_) => None,
        FunctionArguments::List(list) if list.duplicate_treatment.is_some() || !list.clauses.is_empty() => None,
        FunctionArguments::List(list) => list
            .args
            .iter()
            .map(|arg| match arg {
                FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Some(e.clone()),
                _ => None,
            })
            .collect(),
    }
}

/// `template` parsed, with `__aN` the Nth of `args` and `__pN` the Nth of `parameters`.
fn instantiate(template: &str, args: &[Expr], parameters: &[Expr]) -> Result<Expr, QueryError> {
    let mut expr = crate::sql_ast::parse_expr(template)?;
    let _ = VisitMut::visit(&mut expr, &mut Substitute { args, parameters });
    Ok(expr)
}

struct Substitute<'a> {
    args: &'a [Expr],
    parameters: &'a [Expr],
}

impl VisitorMut for Substitute<'_> {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        let Expr::Identifier(ident) = expr else { return ControlFlow::Continue(()) };
        let nth = |prefix: &str, list: &[Expr]| {
            ident.value.strip_prefix(prefix).and_then(|n| n.parse::<usize>().ok()).and_then(|n| list.get(n).cloned())
        };
        let replacement = nth("__a", self.args).or_else(|| nth("__p", self.parameters));
        if let Some(replacement) = replacement {
            *expr = replacement;
        }
        ControlFlow::Continue(())
    }
}

/// Moves the call's `OVER` and `FILTER` onto the template's outer call (a `FILTER` the template
/// has is kept: both must hold).
fn keep_clauses(written: &impl std::fmt::Display, f: &Function, expr: &mut Expr) -> Result<(), QueryError> {
    if f.over.is_none() && f.filter.is_none() && f.null_treatment.is_none() {
        return Ok(());
    }
    let Expr::Function(outer) = expr else {
        return Err(QueryError::Rejected(format!("{written} is not an aggregate: it takes no OVER or FILTER")));
    };
    outer.over = f.over.clone();
    outer.null_treatment = f.null_treatment;
    if let Some(filter) = &f.filter {
        outer.filter = Some(Box::new(match outer.filter.take() {
            Some(own) => {
                Expr::BinaryOp { left: own, op: BinaryOperator::And, right: Box::new(Expr::Nested(filter.clone())) }
            }
            None => (**filter).clone(),
        }));
    }
    Ok(())
}

/// `multiIf(c1, a1, c2, a2, ..., else)` as `CASE WHEN c1 THEN a1 WHEN c2 THEN a2 ... ELSE else END`.
fn multi_if(written: &impl std::fmt::Display, args: &[Expr]) -> Result<Expr, QueryError> {
    if args.len() < 3 || args.len().is_multiple_of(2) {
        return Err(QueryError::Rejected(format!(
            "{written} takes conditions and values in pairs, then the value when none holds (an odd number of \
             arguments, at least 3), {} given",
            args.len()
        )));
    }
    let pairs = args.len() / 2;
    let whens: String = (0..pairs).map(|i| format!(" WHEN __a{} THEN __a{}", 2 * i, 2 * i + 1)).collect();
    instantiate(&format!("CASE{whens} ELSE __a{} END", args.len() - 1), args, &[])
}

/// `uniqExact(a, b, ...)`: the distinct tuples of rows where no argument is NULL (ClickHouse skips
/// a row with a NULL argument, as every aggregate does), counted as structs.
fn distinct_tuples(args: &[Expr]) -> Result<Expr, QueryError> {
    let names: Vec<String> = (0..args.len()).map(|i| format!("__a{i}")).collect();
    let present: Vec<String> = names.iter().map(|n| format!("{n} IS NOT NULL")).collect();
    let template = format!("count(DISTINCT CASE WHEN {} THEN struct({}) END)", present.join(" AND "), names.join(", "));
    instantiate(&template, args, &[])
}

/// `quantiles(l1, l2, ...)(x)` as the array of `approx_percentile_cont(x, l)` for each level.
fn quantiles(written: &impl std::fmt::Display, args: &[Expr], levels: &[Expr]) -> Result<Expr, QueryError> {
    if args.len() != 1 || levels.is_empty() {
        return Err(QueryError::Rejected(format!(
            "{written}(level, ...)(x) takes one or more levels and one argument, {} and {} given",
            levels.len(),
            args.len()
        )));
    }
    let each: Vec<String> = (0..levels.len()).map(|i| format!("approx_percentile_cont(__a0, __p{i})")).collect();
    instantiate(&format!("make_array({})", each.join(", ")), args, levels)
}

fn number(text: &str) -> Expr {
    Expr::value(datafusion::sql::sqlparser::ast::Value::Number(text.to_string(), false))
}

#[cfg(test)]
mod tests {
    use datafusion::prelude::SessionContext;
    use datafusion::sql::parser::DFParser;

    use super::*;

    fn rewritten(sql: &str) -> Result<String, QueryError> {
        let mut statement = DFParser::parse_sql(sql).expect("parse").pop_front().expect("statement");
        as_datafusion(&mut statement, &SessionContext::new().state())?;
        Ok(statement.to_string())
    }

    #[test]
    fn calls_become_their_templates_and_items_keep_their_text_as_name() {
        assert_eq!(
            rewritten("SELECT g, uniq(u), countIf(v > 1), sumIf(v, g = 'a') AS s FROM t GROUP BY g").unwrap(),
            "SELECT g, approx_distinct(u) AS \"uniq(u)\", count(CASE WHEN v > 1 THEN 1 END) AS \"countIf(v > 1)\", \
             sum(CASE WHEN g = 'a' THEN v END) AS s FROM t GROUP BY g"
        );
        assert_eq!(
            rewritten("SELECT argMax(id, ts) FILTER (WHERE id > 0) OVER (PARTITION BY g) FROM t").unwrap(),
            "SELECT first_value(id ORDER BY ts DESC) FILTER (WHERE ts IS NOT NULL AND (id > 0)) OVER \
             (PARTITION BY g) AS \"argMax(id, ts) FILTER (WHERE id > 0) OVER (PARTITION BY g)\" FROM t"
        );
        assert_eq!(
            rewritten("SELECT quantile(0.9)(v), quantile(v), multiIf(v < 1, 'a', v < 2, 'b', 'c') AS m FROM t")
                .unwrap(),
            "SELECT approx_percentile_cont(v, 0.9) AS \"quantile(0.9)(v)\", approx_percentile_cont(v, 0.5) AS \
             \"quantile(v)\", CASE WHEN v < 1 THEN 'a' WHEN v < 2 THEN 'b' ELSE 'c' END AS m FROM t"
        );
        // Nested calls, calls outside the SELECT list, and a repeated item (left to DataFusion's names).
        assert_eq!(
            rewritten("SELECT toYYYYMM(toDate(ts)) FROM t WHERE toHour(ts) = 3 ORDER BY uniq(x)").unwrap(),
            "SELECT CAST(date_part('year', CAST(ts AS DATE)) * 100 + date_part('month', CAST(ts AS DATE)) AS \
             INT) AS \"toYYYYMM(toDate(ts))\" FROM t WHERE CAST(date_part('hour', ts) AS INT) = 3 ORDER BY \
             approx_distinct(x)"
        );
        assert_eq!(
            rewritten("SELECT uniq(x), uniq(x) FROM t").unwrap(),
            "SELECT approx_distinct(x), approx_distinct(x) FROM t"
        );
        // DataFusion's own functions and quoted names are left alone.
        assert_eq!(rewritten("SELECT count(x), \"uniq\"(x) FROM t").unwrap(), "SELECT count(x), \"uniq\"(x) FROM t");
    }

    #[test]
    fn calls_that_do_not_fit_are_named() {
        let err = |sql: &str| rewritten(sql).unwrap_err().to_string();
        assert!(err("SELECT uniq(a, b) FROM t").contains("uniq takes 1 argument (ClickHouse's uniq), 2 given"));
        assert!(err("SELECT sumIf(x) FROM t").contains("sumIf takes 2 arguments"));
        assert!(err("SELECT multiIf(a, b) FROM t").contains("an odd number of arguments"));
        assert!(err("SELECT uniq(DISTINCT x) FROM t").contains("plain arguments"));
        assert!(err("SELECT quantile(0.1, 0.2)(x) FROM t").contains("takes one level, 2 given"));
        assert!(err("SELECT quantiles(x) FROM t").contains("takes one or more levels and one argument, 0 and 1 given"));
        assert!(err("SELECT toDate(x) OVER () FROM t").contains("is not an aggregate"));
        let two = err("SELECT arrayJoin(a), arrayJoin(b) FROM t");
        assert!(two.contains("arrayJoin(b) beside arrayJoin(a) in one SELECT"), "{two}");
        // The same array twice, and one array per query level, are fine.
        assert!(rewritten("SELECT arrayJoin(a) AS x, arrayJoin(a) + 1 FROM t").is_ok());
        assert!(rewritten("SELECT x, arrayJoin(b) FROM (SELECT arrayJoin(a) AS x, b FROM t)").is_ok());
    }

    /// One call of every template, on a small table, and its answer.
    const EXAMPLES: &[(&str, &str)] = &[
        ("quantiles(0, 1)(v)", "[1.0, 3.0]"),
        ("quantilesTDigest(1)(v)", "[3.0]"),
        ("uniq(g)", "2"),
        ("uniqCombined(g)", "2"),
        ("uniqCombined64(g)", "2"),
        ("uniqHLL12(g)", "2"),
        ("uniqExact(g)", "2"),
        ("countDistinct(g)", "2"),
        ("uniqExact(g, v)", "2"),
        ("countDistinct(g, id > 1)", "3"),
        ("medianExact(v)", "2.0"),
        ("avgWeighted(v, id)", "2.5"),
        ("countIf(v > 1)", "1"),
        ("sumIf(v, g = 'a')", "1.0"),
        ("avgIf(v, v IS NOT NULL)", "2.0"),
        ("minIf(id, g = 'b')", "3"),
        ("maxIf(id, g = 'a')", "2"),
        ("uniqIf(g, id > 1)", "2"),
        ("uniqExactIf(g, id > 1)", "2"),
        ("any(g)", "a"),
        ("anyLast(g)", "b"),
        ("argMax(id, v)", "3"),
        ("argMin(id, v)", "1"),
        ("arg_max(id, v)", "3"),
        ("arg_min(id, v)", "1"),
        ("max_by(id, v)", "3"),
        ("min_by(id, v)", "1"),
        ("groupArray(v)", "[1.0, 3.0]"),
        ("array_length(groupUniqArray(g), 1)", "2"),
        ("quantile(1)(v)", "3.0"),
        ("quantileTDigest(0)(v)", "1.0"),
        ("quantileExact(0.5)(v)", "3.0"),
        ("quantileExact(0)(id) + quantileExact(1)(id) * 10", "31"),
        ("stddevPop(v)", "1.0"),
        ("stddevSamp(v) * stddevSamp(v)", "2.0000000000000004"),
        ("varPop(v)", "1.0"),
        ("varSamp(v)", "2.0"),
        ("min(if(id > 1, 'x', 'y'))", "x"),
        ("min(multiIf(id = 1, 'one', id = 2, 'two', 'many'))", "many"),
        ("min(toDate(ts))", "2026-03-04"),
        ("min(toDateTime('2026-03-04 05:06:07'))", "2026-03-04T05:06:07"),
        ("min(toStartOfMinute(ts))", "2026-03-04T05:06:00"),
        ("min(toStartOfFiveMinutes(ts))", "2026-03-04T05:05:00"),
        ("min(toStartOfFifteenMinutes(ts))", "2026-03-04T05:00:00"),
        ("min(toStartOfHour(ts))", "2026-03-04T05:00:00"),
        ("min(toStartOfDay(ts))", "2026-03-04T00:00:00"),
        ("min(toStartOfInterval(ts, INTERVAL '2 hours'))", "2026-03-04T04:00:00"),
        ("min(toMonday(ts))", "2026-03-02"),
        ("min(toStartOfWeek(ts))", "2026-03-01"),
        ("min(addSeconds(ts, 1))", "2026-03-04T05:06:08"),
        ("min(addMinutes(ts, 1))", "2026-03-04T05:07:07"),
        ("min(addHours(ts, 1))", "2026-03-04T06:06:07"),
        ("min(addDays(ts, 1))", "2026-03-05T05:06:07"),
        ("min(addWeeks(ts, 1))", "2026-03-11T05:06:07"),
        ("min(addMonths(ts, 1))", "2026-04-04T05:06:07"),
        ("min(addYears(ts, 1))", "2027-03-04T05:06:07"),
        ("min(subtractSeconds(ts, 7))", "2026-03-04T05:06:00"),
        ("min(subtractMinutes(ts, 6))", "2026-03-04T05:00:07"),
        ("min(subtractHours(ts, 5))", "2026-03-04T00:06:07"),
        ("min(subtractDays(ts, 3))", "2026-03-01T05:06:07"),
        ("min(subtractWeeks(ts, 1))", "2026-02-25T05:06:07"),
        ("min(subtractMonths(ts, 1))", "2026-02-04T05:06:07"),
        ("min(subtractYears(ts, 1))", "2025-03-04T05:06:07"),
        ("min(formatDateTime(ts, '%Y-%m-%d %H:%M'))", "2026-03-04 05:06"),
        ("min(toStartOfMonth(ts))", "2026-03-01"),
        ("min(toStartOfQuarter(ts))", "2026-01-01"),
        ("min(toStartOfYear(ts))", "2026-01-01"),
        ("min(toYear(ts))", "2026"),
        ("min(toQuarter(ts))", "1"),
        ("min(toMonth(ts))", "3"),
        ("min(toDayOfMonth(ts))", "4"),
        ("min(toDayOfWeek(ts))", "3"),
        ("min(toDayOfYear(ts))", "63"),
        ("min(toHour(ts))", "5"),
        ("min(toMinute(ts))", "6"),
        ("min(toSecond(ts))", "7"),
        ("min(toYYYYMM(ts))", "202603"),
        ("min(toYYYYMMDD(ts))", "20260304"),
        ("min(toUnixTimestamp(ts))", "1772600767"),
        ("today() = current_date()", "true"),
        ("yesterday() < today()", "true"),
        ("currentDatabase() = current_schema()", "true"),
        ("min(toString(id))", "1"),
        ("min(lowerUTF8(upperUTF8(g)))", "a"),
        ("max(lengthUTF8(g || 'é'))", "2"),
        ("countIf(startsWith(g, 'a') AND endsWith(g, 'a'))", "2"),
        ("min(replaceAll(g, 'a', 'x'))", "b"),
        ("max(replaceRegexpAll(g, '(.)', '\\1\\1'))", "bb"),
        ("countIf(match(g, '^[ab]$'))", "3"),
        ("max(splitByChar(',', 'p,q'))", "[p, q]"),
        ("arrayJoin(splitByChar(',', 'p,q'))", "p"),
        ("countIf(isNull(v)) * 10 + countIf(isNotNull(v))", "12"),
        ("toInt8('5') + toInt16('5') + toInt32('5') + toInt64('5')", "20"),
        ("toFloat32('1.5') + toFloat64('1.5')", "3.0"),
    ];

    #[tokio::test]
    async fn every_template_answers_as_clickhouse_does() {
        use datafusion::arrow::array::{Float64Array, Int64Array, StringArray, TimestampNanosecondArray};
        use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
        use datafusion::arrow::record_batch::RecordBatch;
        use datafusion::arrow::util::display::array_value_to_string;
        use std::sync::Arc;

        for (name, _, _) in TEMPLATES {
            let used = EXAMPLES.iter().any(|(call, _)| call.to_ascii_lowercase().contains(&format!("{name}(")));
            assert!(used, "{name} has no example");
        }
        let ctx = SessionContext::new();
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("g", DataType::Utf8, true),
            Field::new("v", DataType::Float64, true),
            Field::new("ts", DataType::Timestamp(TimeUnit::Nanosecond, None), true),
        ]));
        let at = 1_772_600_767_000_000_000i64;
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![1, 2, 3])),
                Arc::new(StringArray::from(vec![Some("a"), Some("a"), Some("b")])),
                Arc::new(Float64Array::from(vec![Some(1.0), None, Some(3.0)])),
                Arc::new(TimestampNanosecondArray::from(vec![Some(at), Some(at + 90_061_000_000_000), None])),
            ],
        )
        .unwrap();
        ctx.register_batch("t", batch).unwrap();
        // As the engine runs after this pass: `n * INTERVAL '1 day'` (`crate::interval_scaling`).
        ctx.register_udf(crate::interval_scaling::interval_scale_udf().as_ref().clone());
        // `current_schema()`, as the engine has it.
        crate::pg_catalog::install(&ctx, "datafusion").unwrap();
        for (call, want) in EXAMPLES {
            let sql = format!("SELECT {call} FROM t");
            let mut statement = DFParser::parse_sql(&sql).unwrap().pop_front().unwrap();
            as_datafusion(&mut statement, &ctx.state()).unwrap();
            crate::postgres_operators::bind_as_postgres(&mut statement);
            let plan = ctx.state().statement_to_plan(statement).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
            let batches = ctx.execute_logical_plan(plan).await.unwrap().collect().await.unwrap();
            let got = array_value_to_string(batches[0].column(0), 0).unwrap();
            assert_eq!(&got, want, "{sql}");
            assert_eq!(batches[0].schema().field(0).name(), call, "{sql}: named as written");
        }
    }
}
