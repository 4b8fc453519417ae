//! PostgreSQL's rules for exact numbers meeting floats and for exact division, applied before
//! DataFusion's type coercion.
//!
//! Why: shardwise reads `0.1` as the exact DECIMAL it is written as (PostgreSQL's `numeric`,
//! DuckDB's `DECIMAL`), so that `0.1 + 0.2 = 0.3` is true and `2.50 * 2` is `5.00`. DataFusion's
//! coercion then does two things neither engine does:
//! - it compares a DOUBLE with a DECIMAL as DECIMAL(30, 15): `b = 0.5` cast every `b` to that
//!   type, which fails on a value past 1e15 and loses those under 1e-15. In PostgreSQL a
//!   `numeric` meets a `double precision` as a `double precision` (the implicit cast goes that
//!   way only), in DuckDB too;
//! - a DECIMAL quotient keeps four digits more than the dividend: `1.0 / 3` was `0.33333`.
//!   PostgreSQL keeps at least 16 significant digits.
//!
//! How: [`PostgresNumericCoercion`], an analyzer rule that runs before DataFusion's
//! `TypeCoercion`, rewrites each expression whose operands mix the two kinds:
//! - in a comparison, arithmetic, `BETWEEN`, `IN`, the branches or tested values of a `CASE`,
//!   and the arguments of a function, a DECIMAL operand beside a float operand becomes a DOUBLE
//!   (a decimal literal the DOUBLE nearest its value, anything else a cast);
//! - the fraction of a percentile function's literal argument (`percentile_cont(0.5)`) is read
//!   as the DOUBLE those functions take;
//! - in a division of exact numbers (a DECIMAL by a DECIMAL or an integer, or an integer by a
//!   DECIMAL), the dividend is widened so that the quotient has [`QUOTIENT_SCALE`] fractional
//!   digits, as far as DECIMAL's 38 digits allow (see [`widened_dividend`]);
//! - the argument of `avg` of a DECIMAL is widened the same way, so that the average keeps
//!   [`QUOTIENT_SCALE`] digits too (DataFusion keeps four more than the column: `34.9163333`);
//! - a column of a `UNION` or a `VALUES` list that is a float in some inputs or rows and a
//!   DECIMAL in others is a DOUBLE in all.
//!
//! `SET datafusion.sql_parser.parse_float_as_decimal = false` gives DataFusion's DOUBLE literals
//! back; the rule then finds no DECIMAL literal to rewrite, and columns of both kinds still meet
//! as PostgreSQL has them.

use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{Column, DFSchema, ScalarValue};
use datafusion::error::Result;
use datafusion::logical_expr::expr::{AggregateFunction, Case, InList, InSubquery, ScalarFunction, WindowFunction};
use datafusion::logical_expr::{
    Between, BinaryExpr, Expr, ExprSchemable, LogicalPlan, LogicalPlanBuilder, Operator, Subquery, Union, Values,
    WindowFunctionDefinition,
};
use datafusion::optimizer::AnalyzerRule;

/// The fractional digits a quotient of exact numbers keeps (PostgreSQL keeps at least 16
/// significant digits; DataFusion four more than the dividend's).
pub const QUOTIENT_SCALE: i8 = 16;

/// DataFusion's increase of the dividend's scale in a DECIMAL division (Arrow's `div`).
const ARROW_DIVIDE_SCALE_INCREMENT: i8 = 4;

/// The most digits a DECIMAL128 holds.
const DECIMAL128_MAX_PRECISION: u8 = 38;

/// Aggregate functions whose literal fraction arguments are DOUBLE parameters.
const PERCENTILE_FUNCTIONS: &[&str] =
    &["approx_percentile_cont", "approx_percentile_cont_with_weight", "percentile_cont", "percentile_disc"];

/// The analyzer rule (see the module doc). Goes before DataFusion's `TypeCoercion`.
#[derive(Debug, Default)]
pub struct PostgresNumericCoercion;

impl AnalyzerRule for PostgresNumericCoercion {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        // An INSERT's rows are cast to its table's columns, each from its own type.
        let plan = if matches!(plan, LogicalPlan::Dml(_)) {
            plan
        } else {
            plan.transform_up_with_subqueries(floats_win_in_columns)?.data
        };
        crate::expression_rules::rewrite_expressions(plan, coerced)
    }

    fn name(&self) -> &str {
        "shardwise_postgres_numeric_coercion"
    }
}

fn is_float(t: &DataType) -> bool {
    matches!(t, DataType::Float16 | DataType::Float32 | DataType::Float64)
}

fn is_decimal(t: &DataType) -> bool {
    matches!(t, DataType::Decimal32(..) | DataType::Decimal64(..) | DataType::Decimal128(..) | DataType::Decimal256(..))
}

/// The type of `e` against `schema`; `None` where it cannot be typed here (an outer reference).
fn type_of(e: &Expr, schema: &DFSchema) -> Option<DataType> {
    e.get_type(schema).ok()
}

/// `e`, a DECIMAL, as a DOUBLE: a literal the DOUBLE nearest its value, anything else cast.
fn as_double(e: Expr) -> Expr {
    match e {
        Expr::Literal(value, metadata) if is_decimal(&value.data_type()) => {
            let double = if value.is_null() {
                Some(ScalarValue::Float64(None))
            } else {
                // The decimal's text parsed: the nearest DOUBLE, with one rounding.
                value.to_string().parse::<f64>().ok().map(|v| ScalarValue::Float64(Some(v)))
            };
            match double {
                Some(double) => Expr::Literal(double, metadata),
                None => Expr::Literal(value, metadata).cast_to_double(),
            }
        }
        other => other.cast_to_double(),
    }
}

trait CastToDouble {
    fn cast_to_double(self) -> Expr;
}

impl CastToDouble for Expr {
    fn cast_to_double(self) -> Expr {
        Expr::Cast(datafusion::logical_expr::Cast::new(Box::new(self), DataType::Float64))
    }
}

/// Makes the DECIMAL ones of `operands` DOUBLEs when any of them is a float; whether it did.
fn floats_win(operands: &mut [&mut Expr], schema: &DFSchema) -> bool {
    let types: Vec<Option<DataType>> = operands.iter().map(|e| type_of(e, schema)).collect();
    if !types.iter().flatten().any(is_float) {
        return false;
    }
    let mut changed = false;
    for (operand, t) in operands.iter_mut().zip(&types) {
        if t.as_ref().is_some_and(is_decimal) {
            let taken = std::mem::replace(&mut **operand, Expr::Literal(ScalarValue::Null, None));
            **operand = as_double(taken);
            changed = true;
        }
    }
    changed
}

/// In a `UNION` or a `VALUES` list, a column that is a float in some inputs (rows) and a DECIMAL
/// in others is a DOUBLE in all (DataFusion made it DECIMAL(30, 15), which fails on 1e20).
fn floats_win_in_columns(plan: LogicalPlan) -> Result<Transformed<LogicalPlan>> {
    match plan {
        LogicalPlan::Union(union) => {
            let width = union.schema.fields().len();
            let mixed: Vec<bool> = (0..width)
                .map(|i| {
                    let types = || union.inputs.iter().filter_map(|input| input.schema().fields().get(i));
                    types().any(|f| is_float(f.data_type())) && types().any(|f| is_decimal(f.data_type()))
                })
                .collect();
            if !mixed.contains(&true) {
                return Ok(Transformed::no(LogicalPlan::Union(union)));
            }
            let inputs =
                union.inputs.into_iter().map(|input| doubles_over(input, &mixed)).collect::<Result<Vec<_>>>()?;
            Ok(Transformed::yes(LogicalPlan::Union(Union::try_new_with_loose_types(inputs)?)))
        }
        LogicalPlan::Values(Values { schema, mut values }) => {
            let empty = DFSchema::empty();
            // Columns DataFusion's builder made DECIMAL though a row holds a float (it cast each
            // value to the common type, a DECIMAL(30, 15)): every value a DOUBLE instead.
            let mut doubled = Vec::new();
            for (column, field) in schema.fields().iter().enumerate() {
                if !is_decimal(field.data_type()) {
                    continue;
                }
                let written: Vec<Expr> =
                    values.iter().filter_map(|row| row.get(column)).map(|e| uncast(e, field.data_type())).collect();
                if !written.iter().any(|e| type_of(e, &empty).as_ref().is_some_and(is_float)) {
                    continue;
                }
                for (row, value) in values.iter_mut().zip(written) {
                    if let Some(slot) = row.get_mut(column) {
                        *slot = match type_of(&value, &empty) {
                            Some(DataType::Float64) => value,
                            _ => as_double(value),
                        };
                    }
                }
                doubled.push(column);
            }
            if doubled.is_empty() {
                return Ok(Transformed::no(LogicalPlan::Values(Values { schema, values })));
            }
            let fields: Vec<_> = schema
                .iter()
                .enumerate()
                .map(|(i, (qualifier, field))| {
                    let field = if doubled.contains(&i) {
                        field.as_ref().clone().with_data_type(DataType::Float64)
                    } else {
                        field.as_ref().clone()
                    };
                    (qualifier.cloned(), Arc::new(field))
                })
                .collect();
            let schema = Arc::new(DFSchema::new_with_metadata(fields, schema.metadata().clone())?);
            Ok(Transformed::yes(LogicalPlan::Values(Values { schema, values })))
        }
        other => Ok(Transformed::no(other)),
    }
}

/// `e` without the cast to `column_type` DataFusion's VALUES builder put over it.
fn uncast(e: &Expr, column_type: &DataType) -> Expr {
    match e {
        Expr::Cast(cast) if cast.field.data_type() == column_type => cast.expr.as_ref().clone(),
        other => other.clone(),
    }
}

/// `input` with its DECIMAL columns among `mixed` cast to DOUBLE, under their names.
fn doubles_over(input: Arc<LogicalPlan>, mixed: &[bool]) -> Result<Arc<LogicalPlan>> {
    let needs = input.schema().fields().iter().zip(mixed).any(|(field, &mixed)| mixed && is_decimal(field.data_type()));
    if !needs {
        return Ok(input);
    }
    let columns: Vec<Expr> = input
        .schema()
        .iter()
        .zip(mixed)
        .map(|((qualifier, field), &mixed)| {
            let column = Expr::Column(Column::new(qualifier.cloned(), field.name()));
            if mixed && is_decimal(field.data_type()) {
                column.cast_to_double().alias_qualified(qualifier.cloned(), field.name())
            } else {
                column
            }
        })
        .collect();
    Ok(Arc::new(LogicalPlanBuilder::from(input).project(columns)?.build()?))
}

/// The rewrite of one expression (see the module doc).
fn coerced(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    let mut e = e;
    let changed = match &mut e {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) if is_numeric_operator(*op) => {
            let mixed = floats_win(&mut [left.as_mut(), right.as_mut()], schema);
            if *op == Operator::Divide && !mixed {
                match widened_dividend(left, right, schema) {
                    Some(widened) => {
                        **left = widened;
                        true
                    }
                    None => false,
                }
            } else {
                mixed
            }
        }
        Expr::Between(Between { expr, low, high, .. }) => {
            floats_win(&mut [expr.as_mut(), low.as_mut(), high.as_mut()], schema)
        }
        Expr::InList(InList { expr, list, .. }) => {
            let mut operands: Vec<&mut Expr> = std::iter::once(expr.as_mut()).chain(list.iter_mut()).collect();
            floats_win(&mut operands, schema)
        }
        Expr::Case(Case { expr, when_then_expr, else_expr }) => {
            let mut results: Vec<&mut Expr> = Vec::new();
            let mut tested: Vec<&mut Expr> = Vec::new();
            if let Some(expr) = expr {
                tested.push(expr.as_mut());
            }
            for (when, then) in when_then_expr.iter_mut() {
                results.push(then.as_mut());
                if !tested.is_empty() {
                    tested.push(when.as_mut());
                }
            }
            if let Some(else_expr) = else_expr {
                results.push(else_expr.as_mut());
            }
            let results_changed = floats_win(&mut results, schema);
            floats_win(&mut tested, schema) | results_changed
        }
        Expr::ScalarFunction(ScalarFunction { func, args }) => {
            let mut operands: Vec<&mut Expr> = args.iter_mut().collect();
            let mixed = floats_win(&mut operands, schema);
            if !mixed
                && ROUNDING_FUNCTIONS.contains(&func.name())
                && let Some(first) = args.first_mut()
                && let Some(DataType::Decimal128(p, s)) = type_of(first, schema)
                && p < DECIMAL128_MAX_PRECISION
            {
                // `floor(-0.5)` is -1, a digit more than DECIMAL(1, 1) holds.
                let taken = std::mem::replace(first, Expr::Literal(ScalarValue::Null, None));
                *first =
                    Expr::Cast(datafusion::logical_expr::Cast::new(Box::new(taken), DataType::Decimal128(p + 1, s)));
                true
            } else {
                mixed
            }
        }
        Expr::InSubquery(InSubquery { expr, subquery, .. }) => floats_win_in_subquery(expr, subquery, schema)?,
        Expr::WindowFunction(window) => {
            let WindowFunction { fun, params } = window.as_mut();
            let is_avg = matches!(fun, WindowFunctionDefinition::AggregateUDF(f) if f.name() == "avg");
            if is_avg
                && let [arg] = params.args.as_mut_slice()
                && let Some(widened) = widened_average(arg, schema)
            {
                // `avg(x) OVER (...)` as the aggregate (it kept 4 more digits than `x`).
                *arg = widened;
                true
            } else {
                let mut operands: Vec<&mut Expr> = params.args.iter_mut().collect();
                floats_win(&mut operands, schema)
            }
        }
        Expr::AggregateFunction(AggregateFunction { func, params }) => {
            if PERCENTILE_FUNCTIONS.contains(&func.name()) {
                let mut changed = false;
                for arg in params.args.iter_mut() {
                    if type_of(arg, schema).as_ref().is_some_and(is_decimal) {
                        let taken = std::mem::replace(arg, Expr::Literal(ScalarValue::Null, None));
                        *arg = as_double(taken);
                        changed = true;
                    }
                }
                changed
            } else if func.name() == "avg"
                && let [arg] = params.args.as_mut_slice()
                && let Some(widened) = widened_average(arg, schema)
            {
                *arg = widened;
                true
            } else {
                let mut operands: Vec<&mut Expr> = params.args.iter_mut().collect();
                floats_win(&mut operands, schema)
            }
        }
        _ => false,
    };
    Ok(if changed { Transformed::yes(e) } else { Transformed::no(e) })
}

/// Functions whose result of a DECIMAL can need a digit more than the argument's type has.
const ROUNDING_FUNCTIONS: &[&str] = &["floor", "ceil", "round"];

/// `expr IN (subquery)` with a float on one side and a DECIMAL on the other: the DECIMAL side
/// as a DOUBLE (DataFusion compared as DECIMAL(30, 15)); whether it changed.
fn floats_win_in_subquery(expr: &mut Box<Expr>, subquery: &mut Subquery, schema: &DFSchema) -> Result<bool> {
    let Some(outer) = type_of(expr, schema) else { return Ok(false) };
    let inner_schema = Arc::clone(subquery.subquery.schema());
    let Some(inner) = inner_schema.fields().first().map(|f| f.data_type().clone()) else { return Ok(false) };
    if is_float(&outer) && is_decimal(&inner) {
        // The subquery's own item as a DOUBLE, under its name (a projection above it would
        // repeat the name once DataFusion decorrelates it).
        let LogicalPlan::Projection(projection) = subquery.subquery.as_ref() else { return Ok(false) };
        let name = inner_schema.field(0).name().clone();
        let mut exprs = projection.expr.clone();
        let Some(first) = exprs.first_mut() else { return Ok(false) };
        let taken = std::mem::replace(first, Expr::Literal(ScalarValue::Null, None));
        *first = as_double(taken.unalias()).alias(name);
        let rebuilt = datafusion::logical_expr::Projection::try_new(exprs, Arc::clone(&projection.input))?;
        subquery.subquery = Arc::new(LogicalPlan::Projection(rebuilt));
        return Ok(true);
    }
    if is_decimal(&outer) && is_float(&inner) {
        let taken = std::mem::replace(expr.as_mut(), Expr::Literal(ScalarValue::Null, None));
        **expr = as_double(taken);
        return Ok(true);
    }
    Ok(false)
}

/// Operators whose operands DataFusion brings to one numeric type.
fn is_numeric_operator(op: Operator) -> bool {
    matches!(
        op,
        Operator::Plus
            | Operator::Minus
            | Operator::Multiply
            | Operator::Divide
            | Operator::Modulo
            | Operator::Eq
            | Operator::NotEq
            | Operator::Lt
            | Operator::LtEq
            | Operator::Gt
            | Operator::GtEq
            | Operator::IsDistinctFrom
            | Operator::IsNotDistinctFrom
    )
}

/// A type of exact numbers as the DECIMAL128 DataFusion divides it as: (precision, scale).
fn exact_shape(t: &DataType) -> Option<(u8, i8)> {
    match t {
        DataType::Decimal128(p, s) => Some((*p, *s)),
        DataType::Int8 | DataType::UInt8 => Some((3, 0)),
        DataType::Int16 | DataType::UInt16 => Some((5, 0)),
        DataType::Int32 | DataType::UInt32 => Some((10, 0)),
        DataType::Int64 => Some((20, 0)),
        DataType::UInt64 => Some((20, 0)),
        _ => None,
    }
}

/// In `left / right` of exact numbers with a DECIMAL among them, `left` cast to a DECIMAL with
/// more fractional digits, so that the quotient (whose scale is the dividend's plus
/// [`ARROW_DIVIDE_SCALE_INCREMENT`]) has [`QUOTIENT_SCALE`]. Widened only as far as the
/// quotient's precision (dividend's precision + divisor's scale + the increment) stays within
/// 38 digits, so that no division that ran before overflows now; `None` when nothing widens.
fn widened_dividend(left: &Expr, right: &Expr, schema: &DFSchema) -> Option<Expr> {
    let (left_type, right_type) = (type_of(left, schema)?, type_of(right, schema)?);
    if !is_decimal(&left_type) && !is_decimal(&right_type) {
        return None;
    }
    let ((p1, s1), (_, s2)) = (exact_shape(&left_type)?, exact_shape(&right_type)?);
    // The quotient's precision: the dividend's + the divisor's scale + the increment.
    widened_to_quotient_scale(left, p1, s1, i16::from(s2.max(0)) + i16::from(ARROW_DIVIDE_SCALE_INCREMENT))
}

/// `e`, a DECIMAL(`p`, `s`), cast to one with as many more fractional digits as give a result of
/// scale `s` + [`ARROW_DIVIDE_SCALE_INCREMENT`] the [`QUOTIENT_SCALE`], as far as the result's
/// precision (`p` + `added_digits`) stays within 38 digits, so that nothing that ran before
/// overflows now; `None` when nothing widens.
fn widened_to_quotient_scale(e: &Expr, p: u8, s: i8, added_digits: i16) -> Option<Expr> {
    let wanted = i16::from(QUOTIENT_SCALE) - i16::from(ARROW_DIVIDE_SCALE_INCREMENT) - i16::from(s);
    let room = i16::from(DECIMAL128_MAX_PRECISION) - i16::from(p) - added_digits;
    let widen = wanted.min(room);
    if widen <= 0 {
        return None;
    }
    let precision = u8::try_from(i16::from(p) + widen).ok()?;
    let scale = i8::try_from(i16::from(s) + widen).ok()?;
    Some(Expr::Cast(datafusion::logical_expr::Cast::new(Box::new(e.clone()), DataType::Decimal128(precision, scale))))
}

/// The argument of `avg` of a DECIMAL, cast to a DECIMAL with more fractional digits, so that
/// the average (whose scale DataFusion makes the argument's plus
/// [`ARROW_DIVIDE_SCALE_INCREMENT`], in a sum of ten digits more) has [`QUOTIENT_SCALE`], as far
/// as the sum's 38 digits allow; `None` when nothing widens.
fn widened_average(arg: &Expr, schema: &DFSchema) -> Option<Expr> {
    let DataType::Decimal128(p, s) = type_of(arg, schema)? else { return None };
    widened_to_quotient_scale(arg, p, s, i16::from(AVG_SUM_PRECISION_INCREMENT))
}

/// The digits DataFusion's `avg` of a DECIMAL adds to the argument's precision for its sum.
const AVG_SUM_PRECISION_INCREMENT: u8 = 10;

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::util::pretty::pretty_format_batches;
    use datafusion::execution::SessionStateBuilder;
    use datafusion::optimizer::analyzer::resolve_grouping_function::ResolveGroupingFunction;
    use datafusion::optimizer::analyzer::type_coercion::TypeCoercion;
    use datafusion::prelude::{SessionConfig, SessionContext};

    use super::*;

    /// DataFusion as a node plans: decimal literals, the rule before type coercion.
    async fn run(sql: &str) -> String {
        let mut config = SessionConfig::new();
        config.options_mut().sql_parser.parse_float_as_decimal = true;
        let state = SessionStateBuilder::new()
            .with_config(config)
            .with_default_features()
            .with_analyzer_rules(vec![
                Arc::new(PostgresNumericCoercion),
                Arc::new(ResolveGroupingFunction::new()),
                Arc::new(TypeCoercion::new()),
            ])
            .build();
        let ctx = SessionContext::new_with_state(state);
        ctx.sql(
            "CREATE TABLE m (a BIGINT, b DOUBLE, n DECIMAL(12, 3)) AS VALUES \
             (1, 0.5, 1.25), (2, 1e-20, 3.5), (3, 1e20, 99.999), (4, NULL, NULL)",
        )
        .await
        .expect("table")
        .collect()
        .await
        .expect("rows");
        let batches = ctx.sql(sql).await.expect("plan").collect().await.expect("rows");
        pretty_format_batches(&batches).expect("format").to_string()
    }

    #[tokio::test]
    async fn decimal_literals_are_exact() {
        let text = run("SELECT 0.1 + 0.2 = 0.3 AS e, 2.50 * 2 AS m, 0.1 + 0.2 AS s").await;
        assert!(text.contains("| true | 5.00 | 0.3 |"), "{text}");
    }

    #[tokio::test]
    async fn a_double_beside_a_decimal_is_compared_as_a_double() {
        // DataFusion cast `b` to DECIMAL(30, 15): 1e20 failed and 1e-20 became 0.
        let text = run("SELECT count(*) AS c FROM m WHERE b = 0.5 OR b > 1.5e19 OR b BETWEEN 0.0 AND 0.001").await;
        assert!(text.contains("| 3 |"), "{text}");
        let text = run("SELECT count(*) AS c FROM m WHERE b IN (0.5, 2.5) OR b = 0.5 + 0.25").await;
        assert!(text.contains("| 1 |"), "{text}");
        let text = run("SELECT * FROM (SELECT a, b * 1.5 AS x, CASE WHEN a > 2 THEN 0.5 ELSE b END AS y, \
             coalesce(b, 0.25) AS z, power(b, 0.5) AS p, lag(b, 1, 0.75) OVER (ORDER BY a) AS l FROM m) \
             WHERE a = 3")
        .await;
        assert!(text.contains("| 3 | 1.5e20 | 0.5 | 1e20 | 10000000000.0 | 1e-20 |"), "{text}");
        // A DECIMAL column meets a DOUBLE column as a DOUBLE too.
        let text = run("SELECT count(*) AS c FROM m WHERE n < b").await;
        assert!(text.contains("| 1 |"), "{text}");
    }

    #[tokio::test]
    async fn a_quotient_of_exact_numbers_keeps_sixteen_digits() {
        let text = run("SELECT 1.0 / 3 AS a, 10.5 / 2 AS b, 2 / 4 AS i, 7 / 2.0 AS c").await;
        assert!(text.contains("| 0.3333333333333333 | 5.2500000000000000 | 0 | 3.5000000000000000 |"), "{text}");
        let text = run("SELECT avg(n) AS a FROM m").await;
        assert!(text.contains("| 34.9163333333333333 |"), "{text}");
        // The same as a window function.
        let text = run("SELECT avg(n) OVER () AS a FROM m LIMIT 1").await;
        assert!(text.contains("| 34.9163333333333333 |"), "{text}");
        let text = run("SELECT n / 3 AS q FROM m WHERE a = 3").await;
        assert!(text.contains("| 33.3330000000000000 |"), "{text}");
        // Widened only within 38 digits: a DECIMAL(38, 0) dividend divides as before.
        let text = run("SELECT CAST(10 AS DECIMAL(38, 0)) / 4 AS q").await;
        assert!(text.contains("| 2.5"), "{text}");
    }

    #[tokio::test]
    async fn unions_and_values_of_doubles_and_decimals_are_doubles() {
        let text = run("SELECT x FROM (SELECT 1.5 AS x UNION ALL SELECT b FROM m WHERE a = 3) ORDER BY x").await;
        assert!(text.contains("| 1.5  |\n| 1e20 |"), "{text}");
        // A node reads `1e-20` as a DOUBLE (see `crate::numeric_literals::exponents_as_double`).
        let text = run("SELECT column1 AS v FROM (VALUES (0.5), (CAST('1e-20' AS DOUBLE))) ORDER BY v").await;
        assert!(text.contains("| 1e-20 |\n| 0.5   |"), "{text}");
        let text = run("SELECT count(*) AS c FROM m WHERE b IN (SELECT 0.0) OR b IN (SELECT 0.5)").await;
        assert!(text.contains("| 1 |"), "{text}");
        // Exact where nothing is a float.
        let text = run("SELECT arrow_typeof(x) AS t FROM (SELECT 0.1 AS x UNION ALL SELECT 0.25) LIMIT 1").await;
        assert!(text.contains("Decimal128"), "{text}");
    }

    #[tokio::test]
    async fn percentile_fractions_are_doubles() {
        let text = run("SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY b) AS p FROM m WHERE a < 3").await;
        assert!(text.contains("| 0.25 |"), "{text}");
    }

    #[tokio::test]
    async fn rounding_a_decimal_has_room_for_the_carry() {
        let text = run(
            "SELECT floor(-0.5) AS f, ceil(0.000001) AS c, ceil(CAST(99.5 AS DECIMAL(3, 1))) AS h, round(9.95, 1) AS r",
        )
        .await;
        assert!(text.contains("| -1.0 | 1.000000 | 100.0 | 10.0 |"), "{text}");
    }
}
