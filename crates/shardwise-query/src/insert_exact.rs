//! An `INSERT` stores a number into a column of another numeric type only when no part of it is
//! lost: a fraction into an integer column, or a DOUBLE beyond REAL's range into a REAL column, is
//! an error that names the value, where DataFusion's implicit cast would store `1` for `1.5` and
//! `inf` for `1e39`.
//!
//! Why: `shardwise load` and Flight SQL bulk ingest already refuse a fraction for an integer
//! column (a CSV cell `1.5` is not an integer), and an `INSERT` is the same act by other means.
//! ClickHouse refuses `1.5` for an `Int32` in `VALUES` too. Truncating silently changes the data a
//! user meant to store; to store the whole part, say so: `CAST(x AS INT)`, `round(x)` or
//! `trunc(x)` give the column its type before the insert sees it, and nothing is checked then.
//!
//! How: [`StrictInsertCasts`], an analyzer rule after type coercion, wraps each implicit cast of
//! an insert's values (the projection DataFusion puts above the insert's source, and the cells of
//! an `INSERT ... VALUES`) from a float or decimal to an integer, or from a DOUBLE to a REAL, in
//! `shardwise_insert_fits(value, 'type')`, which returns its argument unchanged or fails. Its
//! error reads as Arrow's cast errors do (`Cast error: Can't cast value 1.5 to type Int32 ...`), so
//! the engine names the column and, for `VALUES`, the row ([`crate::insert_select`],
//! [`crate::insert_values`]). Constants fail as the optimizer folds them, before anything runs;
//! other values fail as the source is read, and an insert writes nothing until its source is
//! read whole.
//!
//! The same rule first gives every value of an `INSERT ... SELECT` its column's type
//! ([`aligned_to_table`]): DataFusion's casts to the table's types are planned before
//! shardwise's rules change a value's type (a DECIMAL average keeps 16 fractional digits), and
//! the rows must reach the table in its own types.
//!
//! An integer for a DATE column is refused outright (a plan error): Arrow's cast reads it as days
//! since 1970, so `20240101` became the year 57385, where PostgreSQL and DuckDB refuse it.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, StringArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Decimal128Type, Float16Type, Float32Type, Float64Type};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DFSchema, Result, ScalarValue, exec_err, plan_err};
use datafusion::logical_expr::expr::{Alias, Cast};
use datafusion::logical_expr::{
    ColumnarValue, DmlStatement, Expr, ExprSchemable, LogicalPlan, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl,
    Signature, Volatility, WriteOp, lit,
};
use datafusion::optimizer::AnalyzerRule;

/// The check function's SQL name (fragments that carry it are decoded by this name).
pub const INSERT_FITS: &str = "shardwise_insert_fits";

/// The analyzer rule. See the module doc.
#[derive(Debug, Default)]
pub struct StrictInsertCasts;

impl AnalyzerRule for StrictInsertCasts {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        let mut dml = match plan {
            LogicalPlan::Dml(dml @ DmlStatement { op: WriteOp::Insert(_), .. }) => dml,
            other => return Ok(other),
        };
        let source = aligned_to_table(Arc::unwrap_or_clone(dml.input), &dml.target.schema())?;
        dml.input = Arc::new(strict_source(source)?);
        Ok(LogicalPlan::Dml(dml))
    }

    fn name(&self) -> &str {
        "shardwise_strict_insert_casts"
    }
}

/// The insert's source (the projection DataFusion puts above it, one expression per table
/// column) with every value of another type than its column's cast to the column's type.
///
/// DataFusion adds those casts as it plans the statement, from the types it sees then; rules that
/// run later can change a value's type (`crate::numeric_coercion` gives a DECIMAL quotient or
/// average 16 fractional digits: `avg(d)` of a DECIMAL(18, 4) planned as a DECIMAL(22, 8) is a
/// DECIMAL(30, 16) once analyzed), and the rows would then reach the table in a type it does not
/// have. Casting here stores them as an `INSERT` of that type stores any value: rounded to the
/// column's scale, refused when out of its range.
fn aligned_to_table(source: LogicalPlan, table: &datafusion::arrow::datatypes::SchemaRef) -> Result<LogicalPlan> {
    let LogicalPlan::Projection(projection) = source else { return Ok(source) };
    let fields = projection.schema.fields();
    let same_columns = fields.len() == table.fields().len()
        && fields.iter().zip(table.fields()).all(|(field, column)| field.name() == column.name());
    if !same_columns {
        return Ok(LogicalPlan::Projection(projection));
    }
    let input_schema = Arc::clone(projection.input.schema());
    let types = projection.expr.iter().map(|e| e.get_type(&input_schema)).collect::<Result<Vec<_>>>()?;
    if types.iter().zip(table.fields()).all(|(t, column)| t == column.data_type()) {
        return Ok(LogicalPlan::Projection(projection));
    }
    let mut exprs = Vec::with_capacity(projection.expr.len());
    for ((expr, column), from) in projection.expr.into_iter().zip(table.fields()).zip(types) {
        let to = column.data_type();
        if from == *to {
            exprs.push(expr);
            continue;
        }
        let (name, value) = match expr {
            Expr::Alias(Alias { expr, name, .. }) => (name, *expr),
            other => (column.name().clone(), other),
        };
        exprs.push(Expr::Cast(Cast::new(Box::new(value), to.clone())).alias(name));
    }
    Ok(LogicalPlan::Projection(datafusion::logical_expr::Projection::try_new(exprs, projection.input)?))
}

/// The insert's source with its casts checked: a projection's expressions (and the cells of a
/// VALUES list under it), or a VALUES list's cells.
fn strict_source(source: LogicalPlan) -> Result<LogicalPlan> {
    match source {
        LogicalPlan::Projection(_) => {
            let source = source
                .map_children(|child| match child {
                    LogicalPlan::Values(_) => strict_source(child).map(Transformed::yes),
                    other => Ok(Transformed::no(other)),
                })?
                .data;
            let LogicalPlan::Projection(projection) = &source else { return Ok(source) };
            let input_schema = Arc::clone(projection.input.schema());
            Ok(source.map_expressions(|e| strict_cast(e, &input_schema).map(Transformed::yes))?.data)
        }
        LogicalPlan::Values(_) => {
            let empty = DFSchema::empty();
            Ok(source.map_expressions(|e| strict_cast(e, &empty).map(Transformed::yes))?.data)
        }
        other => Ok(other),
    }
}

/// `expr` (a value the insert stores: a cast, perhaps under an alias) with its cast checked when
/// the cast could lose part of the value; `schema` is the one `expr` reads.
pub fn strict_cast(expr: Expr, schema: &DFSchema) -> Result<Expr> {
    match expr {
        Expr::Alias(Alias { expr, relation, name, metadata }) => {
            Ok(Expr::Alias(Alias { expr: Box::new(strict_cast(*expr, schema)?), relation, name, metadata }))
        }
        Expr::Cast(Cast { expr, field }) => {
            let from = expr.get_type(schema)?;
            let to = field.data_type();
            // Arrow reads an integer as days since 1970 (20240101 as the year 57385), which
            // PostgreSQL and DuckDB refuse, and clients cannot read back.
            if from.is_integer() && matches!(to, DataType::Date32 | DataType::Date64) {
                return plan_err!(
                    "an integer ({expr}) cannot be stored in a DATE column: write the date as text \
                     ('2024-01-01') or as make_date(year, month, day)"
                );
            }
            // A finer time keeps its instant's start, as text does (`crate::time_floor`).
            if crate::time_floor::coarsening(&from, to).is_some() {
                let floored = crate::time_floor::floor_time_udf().call(vec![*expr, lit(to.to_string())]);
                return Ok(Expr::Cast(Cast { expr: Box::new(floored), field }));
            }
            if !may_lose(&from, to) {
                return Ok(Expr::Cast(Cast { expr, field }));
            }
            let checked = insert_fits_udf().call(vec![*expr, lit(to.to_string())]);
            Ok(Expr::Cast(Cast { expr: Box::new(checked), field }))
        }
        other => Ok(other),
    }
}

/// Whether Arrow's cast from `from` to `to` can store a number other than the one it was given
/// without failing: a fraction cut off, or a DOUBLE too large for a REAL made infinite.
fn may_lose(from: &DataType, to: &DataType) -> bool {
    let from_float = matches!(from, DataType::Float16 | DataType::Float32 | DataType::Float64);
    let from_fraction = from_float || decimal_scale(from).is_some_and(|scale| scale > 0);
    (from_fraction && to.is_integer())
        || (matches!(from, DataType::Float64) && matches!(to, DataType::Float32 | DataType::Float16))
        || (is_text(from) && to.is_floating())
}

fn is_text(data_type: &DataType) -> bool {
    matches!(data_type, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

/// Whether the number `text` would not be kept by a cast to the float type `to`: a finite
/// number made infinite (`'3.5e38'` for a REAL, `'1e400'` for a DOUBLE), or one other than zero
/// made 0 (`'1e-50'` for a REAL). Text that is no number is left to the cast to refuse.
fn text_lost(text: &str, to: &DataType) -> Option<&'static str> {
    let text = text.trim();
    let wide: f64 = text.parse().ok()?;
    let unsigned = text.trim_start_matches(['+', '-']).to_ascii_lowercase();
    if wide.is_nan() || unsigned.starts_with("inf") {
        return None;
    }
    let narrow = match to {
        DataType::Float64 => wide,
        _ => f64::from(wide as f32),
    };
    if narrow.is_infinite() {
        Some(BEYOND_RANGE)
    } else if narrow == 0.0 && names_nonzero(text) {
        Some(TOO_CLOSE_TO_ZERO)
    } else {
        None
    }
}

/// The first value of `text` (its row, and why) that a cast to the float type `to` would not
/// keep ([`text_lost`]: `'1e400'` made infinite, `'1e-400'` made 0), for the paths that convert
/// text themselves.
pub fn first_text_lost(text: &StringArray, to: &DataType) -> Option<(usize, &'static str)> {
    text.iter().enumerate().find_map(|(row, t)| Some((row, text_lost(t?, to)?)))
}

/// Whether `text` is a number with a digit other than 0 before its exponent (`1e-400` is one,
/// though it reads as 0.0 even as a DOUBLE).
pub fn names_nonzero(text: &str) -> bool {
    let text = text.trim();
    let mantissa = text.split(['e', 'E']).next().unwrap_or_default();
    text.parse::<f64>().is_ok() && mantissa.bytes().any(|b| matches!(b, b'1'..=b'9'))
}

const BEYOND_RANGE: &str = "it is beyond the type's range";
const TOO_CLOSE_TO_ZERO: &str = "it is too close to zero for the type (it would be 0)";

fn decimal_scale(data_type: &DataType) -> Option<i8> {
    match data_type {
        DataType::Decimal32(_, s)
        | DataType::Decimal64(_, s)
        | DataType::Decimal128(_, s)
        | DataType::Decimal256(_, s) => Some(*s),
        _ => None,
    }
}

/// The check function, ready to call or register.
pub fn insert_fits_udf() -> Arc<ScalarUDF> {
    Arc::new(ScalarUDF::new_from_impl(InsertFits { signature: Signature::any(2, Volatility::Immutable) }))
}

/// `shardwise_insert_fits(value, 'type')`: `value`, when Arrow's cast to `type` keeps all of it.
#[derive(Debug, PartialEq, Eq, Hash)]
struct InsertFits {
    signature: Signature,
}

impl ScalarUDFImpl for InsertFits {
    fn name(&self) -> &str {
        INSERT_FITS
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        match arg_types.first() {
            Some(value) => Ok(value.clone()),
            None => exec_err!("{INSERT_FITS} takes a value and a type name"),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let (value, to, target) = crate::time_floor::value_and_type(&args.args, INSERT_FITS)?;
        let array = value.to_array(1)?;
        if let Some(i) = first_lost(&array, &to) {
            let value = ScalarValue::try_from_array(&array, i)?;
            let (shown, why) = (shown(&value), why_lost(&to, &value));
            // Arrow's words for a value that does not fit, so the engine names the column.
            return exec_err!("Cast error: Can't cast value {shown} to type {target}: {why}");
        }
        Ok(value.clone())
    }
}

/// Why `value`, which a cast to `to` would not keep, does not fit.
pub fn why_lost(to: &DataType, value: &ScalarValue) -> &'static str {
    match value {
        _ if to.is_integer() => "it has a fraction (round() or CAST it to the column's type first)",
        ScalarValue::Float64(Some(v)) if v.abs() < 1.0 => TOO_CLOSE_TO_ZERO,
        ScalarValue::Utf8(Some(t)) | ScalarValue::LargeUtf8(Some(t)) | ScalarValue::Utf8View(Some(t)) => {
            text_lost(t, to).unwrap_or(BEYOND_RANGE)
        }
        _ => BEYOND_RANGE,
    }
}

/// The first value of `array` that Arrow's cast to `to` would not keep whole (a fraction for an
/// integer, a DOUBLE beyond a REAL's range), for stores that cast batches themselves (bulk
/// ingest); `None` when every value fits, or the cast cannot lose any.
/// The value is shown as the INSERT's error shows it, with the reason.
pub fn first_unfit(array: &ArrayRef, to: &DataType) -> Option<Unfit> {
    if !may_lose(array.data_type(), to) {
        return None;
    }
    let i = first_lost(array, to)?;
    let value = ScalarValue::try_from_array(array, i).ok()?;
    Some(Unfit { row: i, shown: shown(&value), why: why_lost(to, &value) })
}

/// A value [`first_unfit`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unfit {
    /// Its index in the array.
    pub row: usize,
    /// The value, as an error shows it.
    pub shown: String,
    /// Why it does not fit ("it has a fraction ...", "it is beyond the type's range").
    pub why: &'static str,
}

/// `value` as a message shows it: a float far from 1 with an exponent (`1e39`, where `Display`
/// writes forty digits).
fn shown(value: &ScalarValue) -> String {
    match value {
        ScalarValue::Float64(Some(v)) if v.abs() >= 1e16 => format!("{v:e}"),
        ScalarValue::Float32(Some(v)) if v.abs() >= 1e16 => format!("{v:e}"),
        other => other.to_string(),
    }
}

/// Whether the finite DOUBLE `v` is no REAL: infinite as one, or zero when it is not (PostgreSQL's
/// "out of range" and "underflow"; a subnormal REAL is kept, as there).
fn beyond_real(v: f64) -> bool {
    let narrow = v as f32;
    narrow.is_infinite() || (narrow == 0.0 && v != 0.0)
}

/// The index of the first value of `array` that a cast to `to` would not keep.
fn first_lost(array: &ArrayRef, to: &DataType) -> Option<usize> {
    let to_float = matches!(to, DataType::Float16 | DataType::Float32);
    let lost = |i: usize, v: f64| {
        let lost = match to_float {
            true => beyond_real(v),
            false => v.fract() != 0.0,
        };
        (!array.is_null(i) && v.is_finite() && lost).then_some(i)
    };
    match array.data_type() {
        data_type if is_text(data_type) => {
            let text = cast(array, &DataType::Utf8).ok()?;
            text.as_string::<i32>().iter().position(|t| t.is_some_and(|t| text_lost(t, to).is_some()))
        }
        DataType::Float64 => {
            array.as_primitive::<Float64Type>().values().iter().enumerate().find_map(|(i, v)| lost(i, *v))
        }
        DataType::Float32 if !to_float => {
            array.as_primitive::<Float32Type>().values().iter().enumerate().find_map(|(i, v)| lost(i, f64::from(*v)))
        }
        DataType::Float16 if !to_float => {
            array.as_primitive::<Float16Type>().values().iter().enumerate().find_map(|(i, v)| lost(i, v.to_f64()))
        }
        data_type if !to_float => match decimal_scale(data_type) {
            Some(scale) if scale > 0 => {
                // Every decimal up to 38 digits is a Decimal128 exactly; a wider one that is not
                // overflows an integer in the cast itself.
                let Ok(wide) = cast(array, &DataType::Decimal128(38, scale)) else { return None };
                let unit = 10i128.pow(u32::from(scale.unsigned_abs()));
                wide.as_primitive::<Decimal128Type>()
                    .values()
                    .iter()
                    .enumerate()
                    .find_map(|(i, v)| (!wide.is_null(i) && v % unit != 0).then_some(i))
            }
            _ => None,
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::util::pretty::pretty_format_batches;
    use datafusion::execution::SessionStateBuilder;
    use datafusion::prelude::{SessionConfig, SessionContext};

    use super::*;

    async fn context() -> SessionContext {
        let state = SessionStateBuilder::new()
            .with_config(SessionConfig::new())
            .with_default_features()
            .with_analyzer_rule(Arc::new(StrictInsertCasts))
            .build();
        let ctx = SessionContext::new_with_state(state);
        ctx.register_udf(insert_fits_udf().as_ref().clone());
        let create = "CREATE TABLE t (i INT, b BIGINT, r REAL, d DOUBLE, m DECIMAL(10, 2))";
        ctx.sql(create).await.expect("planned").collect().await.expect("created");
        let create =
            "CREATE TABLE src (x DOUBLE, y DECIMAL(10, 2), z DOUBLE) AS VALUES (2.0, 3.00, 1e30), (2.5, 3.25, 1e39)";
        ctx.sql(create).await.expect("planned").collect().await.expect("created");
        ctx
    }

    async fn run(ctx: &SessionContext, sql: &str) -> Result<String> {
        let batches = ctx.sql(sql).await?.collect().await?;
        Ok(pretty_format_batches(&batches)?.to_string())
    }

    #[tokio::test]
    async fn whole_numbers_go_in_and_fractions_are_refused() {
        let ctx = context().await;
        run(&ctx, "INSERT INTO t VALUES (1.0, 2e3, 1.5, 1e39, 1.25)").await.expect("whole numbers fit");
        let e = run(&ctx, "INSERT INTO t (i) VALUES (1.5)").await.expect_err("a fraction");
        assert!(e.to_string().contains("Can't cast value 1.5 to type Int32: it has a fraction"), "{e}");
        let e = run(&ctx, "INSERT INTO t (b) VALUES (CAST(7.25 AS DECIMAL(5, 2)))").await.expect_err("a fraction");
        assert!(e.to_string().contains("Can't cast value 7.25 to type Int64"), "{e}");
        let e = run(&ctx, "INSERT INTO t (r) VALUES (1e39)").await.expect_err("beyond REAL");
        assert!(e.to_string().contains("to type Float32: it is beyond the type's range"), "{e}");
        // From a table: the rows that fit go nowhere when one does not.
        let e = run(&ctx, "INSERT INTO t (i, m) SELECT x, y FROM src").await.expect_err("2.5");
        assert!(e.to_string().contains("Can't cast value 2.5 to type Int32"), "{e}");
        let e = run(&ctx, "INSERT INTO t (b) SELECT y FROM src").await.expect_err("3.25");
        assert!(e.to_string().contains("Can't cast value 3.25 to type Int64"), "{e}");
        let e = run(&ctx, "INSERT INTO t (r) SELECT z FROM src").await.expect_err("1e39");
        assert!(e.to_string().contains("Can't cast value 1e39 to type Float32"), "{e}");
        let text = run(&ctx, "SELECT count(*) AS n FROM t").await.expect("counted");
        assert!(text.contains("| 1 |"), "{text}");
    }

    /// A number written as a string is checked as a number is ('3.5e38' was stored as inf).
    #[tokio::test]
    async fn numbers_in_strings_are_checked_too() {
        let ctx = context().await;
        for (sql, why) in [
            ("INSERT INTO t (r) VALUES ('3.5e38')", "Can't cast value 3.5e38 to type Float32: it is beyond"),
            ("INSERT INTO t (r) VALUES (' -1e39 ')", "to type Float32: it is beyond the type's range"),
            ("INSERT INTO t (r) VALUES ('1e-50')", "to type Float32: it is too close to zero"),
            ("INSERT INTO t (d) VALUES ('1e400')", "to type Float64: it is beyond the type's range"),
        ] {
            let e = run(&ctx, sql).await.expect_err(sql);
            assert!(e.to_string().contains(why), "{sql}: {e}");
        }
        run(&ctx, "INSERT INTO t (r, d) VALUES ('inf', '-Infinity'), ('0e-99', 'NaN'), ('1.5', '1e300')")
            .await
            .expect("these fit");
        let text = run(&ctx, "SELECT count(*) AS n FROM t").await.expect("counted");
        assert!(text.contains("| 3 |"), "{text}");
    }

    #[tokio::test]
    async fn an_integer_is_not_a_date() {
        let ctx = SessionContext::new();
        ctx.add_analyzer_rule(Arc::new(StrictInsertCasts));
        ctx.sql("CREATE TABLE d (d DATE)").await.expect("table").collect().await.expect("created");
        let e = run(&ctx, "INSERT INTO d VALUES (20240101)").await.expect_err("an integer");
        assert!(e.to_string().contains("an integer (Int64(20240101)) cannot be stored in a DATE column"), "{e}");
        run(&ctx, "INSERT INTO d VALUES ('2024-01-01')").await.expect("text");
    }

    #[tokio::test]
    async fn an_explicit_cast_or_round_says_what_to_store() {
        let ctx = context().await;
        run(&ctx, "INSERT INTO t (i, b) SELECT CAST(x AS INT), round(y) FROM src").await.expect("explicit");
        run(&ctx, "INSERT INTO t (i, r) SELECT 3, CAST(z AS REAL) FROM src WHERE x = 2").await.expect("explicit");
        let text = run(&ctx, "SELECT i, b FROM t ORDER BY i, b").await.expect("read");
        assert!(text.contains("| 2 | 3 |"), "{text}");
        // NULLs, NaN and infinities are left to the cast (which refuses NaN into an integer).
        run(&ctx, "INSERT INTO t (i, r) VALUES (NULL, CAST('inf' AS DOUBLE))").await.expect("null and inf");
        assert!(run(&ctx, "INSERT INTO t (i) VALUES (CAST('NaN' AS DOUBLE))").await.is_err());
    }

    #[test]
    fn the_first_unfit_value_is_named() {
        use datafusion::arrow::array::{Decimal128Array, Float64Array};
        let floats: ArrayRef = Arc::new(Float64Array::from(vec![Some(1.0), None, Some(2.5), Some(3.5)]));
        let shown = |array: &ArrayRef, to: &DataType| first_unfit(array, to).map(|u| (u.row, u.shown));
        assert_eq!(shown(&floats, &DataType::Int64), Some((2, "2.5".to_string())));
        assert_eq!(shown(&floats, &DataType::Float32), None);
        let decimals: ArrayRef =
            Arc::new(Decimal128Array::from(vec![100, 250]).with_precision_and_scale(5, 2).expect("a decimal"));
        assert_eq!(shown(&decimals, &DataType::Int32), Some((1, "2.50".to_string())));
        let large: ArrayRef = Arc::new(Float64Array::from(vec![1e30, -1e39]));
        assert_eq!(shown(&large, &DataType::Float32), Some((1, "-1e39".to_string())));
        // Too small for a REAL: 0 as one, which PostgreSQL calls an underflow; a subnormal REAL
        // and a zero are kept.
        let small: ArrayRef = Arc::new(Float64Array::from(vec![0.0, -0.0, 1e-40, 1e-50]));
        let unfit = first_unfit(&small, &DataType::Float32).expect("1e-50");
        assert_eq!((unfit.row, unfit.why), (3, "it is too close to zero for the type (it would be 0)"));
    }

    #[test]
    fn only_casts_that_can_lose_are_checked() {
        assert!(may_lose(&DataType::Float64, &DataType::Int32));
        assert!(may_lose(&DataType::Decimal128(5, 2), &DataType::UInt8));
        assert!(may_lose(&DataType::Float64, &DataType::Float32));
        assert!(!may_lose(&DataType::Decimal128(5, 0), &DataType::Int64));
        assert!(!may_lose(&DataType::Int64, &DataType::Int32));
        assert!(!may_lose(&DataType::Float32, &DataType::Float64));
        assert!(!may_lose(&DataType::Utf8, &DataType::Int32));
    }
}
