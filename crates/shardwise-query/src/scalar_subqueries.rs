//! Correlated scalar subqueries that are not aggregates: `(SELECT s FROM u WHERE u.k = t.k)`
//! and `(SELECT s FROM u WHERE u.k = t.k ORDER BY ts DESC LIMIT 1)`, as PostgreSQL runs them.
//!
//! Why: DataFusion runs a correlated scalar subquery only as an aggregate (`SELECT max(s) ...`),
//! which it turns into a join. The first form was refused ("Correlated scalar subquery must be
//! aggregated to return at most one row"), the second, the usual way to ask for the latest value
//! per row, failed in the physical planner ("Physical plan does not support logical expression
//! ScalarSubquery"). Client catalog queries (SQLAlchemy's column listing) have both forms.
//!
//! How: [`ScalarSubqueryRows`], an analyzer rule, gives such a subquery the aggregate it means:
//! - `... ORDER BY keys LIMIT 1` reads `first_value(s ORDER BY keys)` (without ORDER BY, any row:
//!   `first_value(s)`), exactly what the LIMIT picks;
//! - a subquery without LIMIT reads `shardwise_single_value(s)`: the value of its one row, NULL
//!   without rows, and PostgreSQL's error `more than one row returned by a subquery used as an
//!   expression` when a row of the outer query meets two.
//!
//! DataFusion then plans them as it plans `max(s)`: a left join on the correlated columns, which
//! runs distributed like any join. Subqueries that already aggregate or cannot return more than
//! one row are left as they are.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, StructArray, UInt64Array, make_array};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Fields, UInt64Type};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{Result, ScalarValue, exec_err};
use datafusion::functions_aggregate::first_last::first_value_udaf;
use datafusion::logical_expr::expr::{AggregateFunction, ScalarFunction, Sort};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::logical_plan::{FetchType, Projection, SkipType};
use datafusion::logical_expr::utils::{AggregateOrderSensitivity, format_state_name};
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, ColumnarValue, Expr, LogicalPlan, LogicalPlanBuilder,
    ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Subquery, Volatility,
};
use datafusion::optimizer::AnalyzerRule;

/// The SQL names of the row-counting aggregate and of the check of its count (fragments that
/// carry them are decoded by these names).
pub const SINGLE_VALUE: &str = "shardwise_single_value";
pub const SINGLE_ROW: &str = "shardwise_single_row";

/// The analyzer rule. See the module doc.
#[derive(Debug, Default)]
pub struct ScalarSubqueryRows;

impl AnalyzerRule for ScalarSubqueryRows {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        crate::expression_rules::rewrite_expressions(plan, |e, _| match e {
            Expr::ScalarSubquery(sq) if !sq.outer_ref_columns.is_empty() => as_aggregate(sq),
            other => Ok(Transformed::no(other)),
        })
    }

    fn name(&self) -> &str {
        "shardwise_scalar_subquery_rows"
    }
}

/// The subquery with its one value read by an aggregate, or as it is (see the module doc).
fn as_aggregate(sq: Subquery) -> Result<Transformed<Expr>> {
    let plan = sq.subquery.as_ref();
    let fields = plan.schema().fields();
    if fields.len() != 1 || aggregates(plan) {
        return Ok(Transformed::no(Expr::ScalarSubquery(sq)));
    }
    let name = fields[0].name().clone();
    // `LIMIT 0`: no row, a NULL of the column's type.
    if plan.max_rows() == Some(0) {
        let null = ScalarValue::try_from(fields[0].data_type())?;
        return Ok(Transformed::yes(datafusion::logical_expr::lit(null)));
    }
    // `(SELECT int_col ... LIMIT 1) + 100`: type coercion put a cast of the column over the
    // subquery; the rows under it are read as below, then cast.
    if let LogicalPlan::Projection(p) = plan
        && let [cast] = p.expr.as_slice()
        && matches!(cast.clone().unalias_nested().data, Expr::Cast(_) | Expr::TryCast(_))
        && let Some(FirstRow { below, column, order_by }) = first_row(&p.input)?
    {
        let (qualifier, field) = p.input.schema().qualified_field(0);
        let rows = FirstRow { below, column, order_by }.aggregated(qualifier.cloned(), field.name())?;
        let cast = LogicalPlan::Projection(Projection::try_new(p.expr.clone(), Arc::new(rows))?);
        return Ok(Transformed::yes(Expr::ScalarSubquery(Subquery { subquery: Arc::new(cast), ..sq })));
    }
    let new_plan = match first_row(plan)? {
        Some(first) => LogicalPlanBuilder::from(first.aggregated(None, &name)?),
        None if plan.max_rows().is_some_and(|rows| rows <= 1) => return Ok(Transformed::no(Expr::ScalarSubquery(sq))),
        None => {
            // The aggregate counts the rows; the check runs on the outer query's rows, after the
            // join, so that keys no outer row asks for may have any number of rows.
            let column = Expr::Column(first_column(plan));
            let single = AggregateFunction::new_udf(single_value_udaf(), vec![column], false, None, Vec::new(), None);
            let counted = LogicalPlanBuilder::from(plan.clone())
                .aggregate(Vec::<Expr>::new(), vec![Expr::AggregateFunction(single).alias(name)])?;
            let subquery = Subquery { subquery: Arc::new(counted.build()?), ..sq };
            let checked = ScalarFunction::new_udf(single_row_udf(), vec![Expr::ScalarSubquery(subquery)]);
            return Ok(Transformed::yes(Expr::ScalarFunction(checked)));
        }
    };
    let subquery = Subquery { subquery: Arc::new(new_plan.build()?), ..sq };
    Ok(Transformed::yes(Expr::ScalarSubquery(subquery)))
}

/// True when the subquery's rows come from an aggregate (DataFusion's own case).
fn aggregates(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::Aggregate(_) => true,
        LogicalPlan::Projection(p) => aggregates(&p.input),
        LogicalPlan::SubqueryAlias(a) => aggregates(&a.input),
        LogicalPlan::Filter(f) => matches!(f.input.as_ref(), LogicalPlan::Aggregate(_)),
        _ => false,
    }
}

/// A subquery of the form `[projections of one column] <- LIMIT 1 <- [ORDER BY] <- below`.
struct FirstRow {
    below: LogicalPlan,
    /// The output column, as a column of `below`.
    column: Expr,
    order_by: Vec<Sort>,
}

impl FirstRow {
    /// `first_value(column ORDER BY ...)` over `below`, one row named `qualifier.name`.
    fn aggregated(self, qualifier: Option<datafusion::common::TableReference>, name: &str) -> Result<LogicalPlan> {
        let FirstRow { below, column, order_by } = self;
        let first = AggregateFunction::new_udf(first_value_udaf(), vec![column], false, None, order_by, None);
        let first = Expr::AggregateFunction(first).alias_qualified(qualifier, name);
        LogicalPlanBuilder::from(below).aggregate(Vec::<Expr>::new(), vec![first])?.build()
    }
}

/// `plan` as a [`FirstRow`], when it is one: the projections above the LIMIT may only pass the
/// column on (rename it), so that it is one column of the row the LIMIT picks.
fn first_row(plan: &LogicalPlan) -> Result<Option<FirstRow>> {
    let mut node = plan;
    let mut column: Option<datafusion::common::Column> = None;
    loop {
        match node {
            LogicalPlan::Projection(p) => {
                let Some(passed) = passed_on(p, column.as_ref()) else { return Ok(None) };
                column = Some(passed);
                node = &p.input;
            }
            LogicalPlan::SubqueryAlias(a) => {
                let index = match &column {
                    None => 0,
                    Some(c) => match a.schema.index_of_column(c) {
                        Ok(i) => i,
                        Err(_) => return Ok(None),
                    },
                };
                let (qualifier, field) = a.input.schema().qualified_field(index);
                column = Some(datafusion::common::Column::new(qualifier.cloned(), field.name()));
                node = &a.input;
            }
            LogicalPlan::Limit(limit) => {
                let first_only = matches!(limit.get_skip_type()?, SkipType::Literal(0))
                    && matches!(limit.get_fetch_type()?, FetchType::Literal(Some(1)));
                if !first_only {
                    return Ok(None);
                }
                return Ok(ordered_below(&limit.input, column));
            }
            _ => return Ok(None),
        }
    }
}

/// The rows under a `LIMIT 1`: through projections that pass `column` on (`None`: the first),
/// down to the ORDER BY (dropped: its keys become the aggregate's) or to the first node that is
/// neither. `None` when a projection computes the column above an ORDER BY.
fn ordered_below(plan: &LogicalPlan, mut column: Option<datafusion::common::Column>) -> Option<FirstRow> {
    let mut node = plan;
    loop {
        match node {
            LogicalPlan::Projection(p) => {
                match passed_on(p, column.as_ref()) {
                    Some(passed) => column = Some(passed),
                    None if has_sort(&p.input) => return None,
                    None => break,
                }
                node = &p.input;
            }
            LogicalPlan::Sort(sort) if sort.fetch.is_none() => {
                let column = column.unwrap_or_else(|| first_column(&sort.input));
                sort.input.schema().index_of_column(&column).ok()?;
                let order_by = sort.expr.clone();
                return Some(FirstRow { below: sort.input.as_ref().clone(), column: Expr::Column(column), order_by });
            }
            _ => break,
        }
    }
    let column = column.unwrap_or_else(|| first_column(node));
    node.schema().index_of_column(&column).ok()?;
    Some(FirstRow { below: node.clone(), column: Expr::Column(column), order_by: Vec::new() })
}

/// The column of `p`'s input that its output `column` (`None`: its first) passes on, renamed or
/// not; `None` when the projection computes it or has no such column.
fn passed_on(p: &Projection, column: Option<&datafusion::common::Column>) -> Option<datafusion::common::Column> {
    let index = match column {
        None => 0,
        Some(c) => p.schema.index_of_column(c).ok()?,
    };
    match p.expr.get(index)?.clone().unalias_nested().data {
        Expr::Column(c) => Some(c),
        _ => None,
    }
}

/// True when an ORDER BY is under `plan`, through projections.
fn has_sort(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::Sort(_) => true,
        LogicalPlan::Projection(p) => has_sort(&p.input),
        _ => false,
    }
}

fn first_column(plan: &LogicalPlan) -> datafusion::common::Column {
    let (qualifier, field) = plan.schema().qualified_field(0);
    datafusion::common::Column::new(qualifier.cloned(), field.name())
}

/// `shardwise_single_value`, to register with a session.
pub fn single_value_udaf() -> Arc<AggregateUDF> {
    Arc::new(AggregateUDF::new_from_impl(SingleValue { signature: Signature::any(1, Volatility::Immutable) }))
}

/// `shardwise_single_row`, to register with a session.
pub fn single_row_udf() -> Arc<ScalarUDF> {
    Arc::new(ScalarUDF::new_from_impl(SingleRow { signature: Signature::any(1, Volatility::Immutable) }))
}

/// A struct of the value of a group's first row and the group's row count.
#[derive(Debug, PartialEq, Eq, Hash)]
struct SingleValue {
    signature: Signature,
}

/// The fields of [`SingleValue`]'s result for a value of type `value`.
fn counted_fields(value: &DataType) -> Fields {
    Fields::from(vec![Field::new("value", value.clone(), true), Field::new("rows", DataType::UInt64, false)])
}

impl AggregateUDFImpl for SingleValue {
    fn name(&self) -> &str {
        SINGLE_VALUE
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        match arg_types.first() {
            Some(t) => Ok(DataType::Struct(counted_fields(t))),
            None => exec_err!("{SINGLE_VALUE} takes one argument"),
        }
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        let Some(field) = args.expr_fields.first() else { return exec_err!("{SINGLE_VALUE} takes one argument") };
        let value = ScalarValue::try_from(field.data_type())?;
        Ok(Box::new(SingleValueAccumulator { fields: counted_fields(field.data_type()), value, rows: 0 }))
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        let Some(field) = args.input_fields.first() else { return exec_err!("{SINGLE_VALUE} takes one argument") };
        Ok(vec![
            Arc::new(Field::new(format_state_name(args.name, "value"), field.data_type().clone(), true)),
            Arc::new(Field::new(format_state_name(args.name, "rows"), DataType::UInt64, true)),
        ])
    }

    fn order_sensitivity(&self) -> AggregateOrderSensitivity {
        AggregateOrderSensitivity::Insensitive
    }
}

#[derive(Debug)]
struct SingleValueAccumulator {
    fields: Fields,
    value: ScalarValue,
    rows: u64,
}

impl SingleValueAccumulator {
    fn add(&mut self, rows: u64, value: impl FnOnce() -> Result<ScalarValue>) -> Result<()> {
        if self.rows == 0 && rows > 0 {
            self.value = value()?;
        }
        self.rows = self.rows.saturating_add(rows);
        Ok(())
    }
}

impl Accumulator for SingleValueAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let Some(values) = values.first() else { return exec_err!("{SINGLE_VALUE} takes one argument") };
        self.add(values.len() as u64, || ScalarValue::try_from_array(values, 0))
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let [values, rows] = states else { return exec_err!("{SINGLE_VALUE} has two state columns") };
        let rows = rows.as_primitive::<UInt64Type>();
        for i in 0..rows.len() {
            let n = if rows.is_valid(i) { rows.value(i) } else { 0 };
            self.add(n, || ScalarValue::try_from_array(values, i))?;
        }
        Ok(())
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        Ok(vec![self.value.clone(), ScalarValue::UInt64(Some(self.rows))])
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        let value = self.value.to_array()?;
        let rows: ArrayRef = Arc::new(UInt64Array::from(vec![self.rows]));
        let counted = StructArray::try_new(self.fields.clone(), vec![value, rows], None)?;
        Ok(ScalarValue::Struct(Arc::new(counted)))
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self) + self.value.size()
    }
}

/// The value of a [`SingleValue`] struct; an error where it counted more than one row.
#[derive(Debug, PartialEq, Eq, Hash)]
struct SingleRow {
    signature: Signature,
}

impl ScalarUDFImpl for SingleRow {
    fn name(&self) -> &str {
        SINGLE_ROW
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        match arg_types.first() {
            Some(DataType::Struct(fields)) if fields.len() == 2 => Ok(fields[0].data_type().clone()),
            other => exec_err!("{SINGLE_ROW} takes a {SINGLE_VALUE} struct, got {other:?}"),
        }
    }

    /// Unbounded, of the value's type (the default is of type Null, which functions over it,
    /// such as `abs`, cannot compare with their type's zero).
    fn evaluate_bounds(
        &self,
        input: &[&datafusion::logical_expr::interval_arithmetic::Interval],
    ) -> Result<datafusion::logical_expr::interval_arithmetic::Interval> {
        let data_type = match input.first().map(|i| i.data_type()) {
            Some(DataType::Struct(fields)) if fields.len() == 2 => fields[0].data_type().clone(),
            _ => DataType::Null,
        };
        datafusion::logical_expr::interval_arithmetic::Interval::make_unbounded(&data_type)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let [counted] = args.args.as_slice() else { return exec_err!("{SINGLE_ROW} takes one argument") };
        let scalar = matches!(counted, ColumnarValue::Scalar(_));
        let array = counted.to_array(1)?;
        let counted = array.as_struct();
        let rows = counted.column(1).as_primitive::<UInt64Type>();
        let too_many = (0..counted.len()).any(|i| counted.is_valid(i) && rows.is_valid(i) && rows.value(i) > 1);
        if too_many {
            return exec_err!("more than one row returned by a subquery used as an expression");
        }
        // A row of the outer query without a match has a null struct: its value is null.
        let values = counted.column(0);
        let values = match counted.nulls() {
            None => Arc::clone(values),
            Some(nulls) => {
                let combined = NullBuffer::union(Some(nulls), values.nulls());
                make_array(values.to_data().into_builder().nulls(combined).build()?)
            }
        };
        Ok(match scalar {
            true => ColumnarValue::Scalar(ScalarValue::try_from_array(&values, 0)?),
            false => ColumnarValue::Array(values),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::util::pretty::pretty_format_batches;

    /// The two tables of `crate::numbered_subqueries`'s tests, with both rules.
    async fn run(sql: &str) -> Result<String> {
        let ctx = crate::numbered_subqueries::tests::context()?;
        let batches = ctx.sql(sql).await?.collect().await?;
        Ok(pretty_format_batches(&batches)?.to_string())
    }

    #[tokio::test]
    async fn order_by_limit_1_reads_the_first_row_per_outer_row() -> Result<()> {
        let out =
            run("SELECT k, (SELECT s FROM u WHERE u.k = t.k ORDER BY ts DESC LIMIT 1) AS latest FROM t ORDER BY k")
                .await?;
        assert_eq!(
            out.lines().skip(3).take(3).collect::<Vec<_>>(),
            ["| 1 | a      |", "| 2 | new    |", "| 3 |        |"],
            "{out}"
        );
        // Ordered by a column the subquery does not return, and ascending with nulls first.
        let out = run(
            "SELECT k, (SELECT u.s FROM u WHERE u.k = t.k ORDER BY u.s ASC NULLS FIRST LIMIT 1) AS s FROM t ORDER BY k",
        )
        .await?;
        assert!(out.contains("| 2 |   |"), "{out}");
        let out =
            run("SELECT k, (SELECT ts FROM u WHERE u.k = t.k ORDER BY s LIMIT 1) AS ts FROM t ORDER BY k").await?;
        assert!(out.contains("| 2 | 30 |"), "{out}");
        // Cast by type coercion: an INT subquery added to a BIGINT, compared with one.
        let out = run(
            "SELECT k, (SELECT CAST(ts AS INT) AS i FROM u WHERE u.k = t.k ORDER BY ts DESC LIMIT 1) + 100 AS later FROM t \
             WHERE (SELECT CAST(ts AS INT) AS i FROM u WHERE u.k = t.k ORDER BY ts LIMIT 1) > 0 ORDER BY k",
        )
        .await?;
        assert_eq!(out.lines().skip(3).take(2).collect::<Vec<_>>(), ["| 1 | 101   |", "| 2 | 130   |"], "{out}");
        // Without ORDER BY, any one row: here only whether there is one.
        let out =
            run("SELECT k, (SELECT ts FROM u WHERE u.k = t.k LIMIT 1) IS NOT NULL AS has FROM t ORDER BY k").await?;
        assert_eq!(
            out.lines().skip(3).take(3).collect::<Vec<_>>(),
            ["| 1 | true  |", "| 2 | true  |", "| 3 | false |"],
            "{out}"
        );
        Ok(())
    }

    #[tokio::test]
    async fn limit_0_is_null() -> Result<()> {
        let out = run("SELECT k, (SELECT s FROM u WHERE u.k = t.k ORDER BY ts LIMIT 0) AS s FROM t ORDER BY k").await?;
        assert_eq!(out.lines().skip(3).take(3).collect::<Vec<_>>(), ["| 1 |   |", "| 2 |   |", "| 3 |   |"], "{out}");
        Ok(())
    }

    #[tokio::test]
    async fn without_limit_one_row_is_its_value_none_is_null_two_are_an_error() -> Result<()> {
        let out = run("SELECT k, (SELECT s FROM u WHERE u.k = t.k) AS s FROM t WHERE k <> 2 ORDER BY k").await?;
        assert_eq!(out.lines().skip(3).take(2).collect::<Vec<_>>(), ["| 1 | a |", "| 3 |   |"], "{out}");
        let e = run("SELECT k, (SELECT s FROM u WHERE u.k = t.k) FROM t").await.expect_err("k = 2 has three rows");
        assert!(e.to_string().contains("more than one row returned by a subquery used as an expression"), "{e}");
        // In a WHERE too.
        let out = run("SELECT k FROM t WHERE (SELECT s FROM u WHERE u.k = t.k AND ts > 5 AND ts < 15) = 'old'").await?;
        assert!(out.contains("| 2 |"), "{out}");
        Ok(())
    }

    #[tokio::test]
    async fn aggregating_subqueries_are_datafusions() -> Result<()> {
        let out = run("SELECT k, (SELECT max(ts) FROM u WHERE u.k = t.k) AS m FROM t ORDER BY k").await?;
        assert!(out.contains("| 2 | 30 |"), "{out}");
        Ok(())
    }
}
