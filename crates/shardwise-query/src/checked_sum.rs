//! `sum` of integers that fails when a total leaves its type's range, instead of wrapping.
//!
//! Why: DataFusion's `sum` of a `BIGINT` column adds with wrapping arithmetic, so totals past
//! 9223372036854775807 came back as large negative numbers. PostgreSQL and DuckDB sum a
//! `BIGINT` into a wider type and cannot overflow there; shardwise keeps DataFusion's result types
//! (`sum` of an integer is `BIGINT`, of an unsigned integer `BIGINT UNSIGNED`) and refuses a total
//! that does not fit, naming it and saying how to get it: `sum(CAST(x AS DECIMAL(38, 0)))`.
//!
//! How: [`CheckedSum`] is registered under DataFusion's name `sum` and is DataFusion's `Sum` in
//! everything but its integer accumulators. They keep exact totals (a single total in 128 bits;
//! totals by group in 64 bits with each group's wraps counted aside, [`WideTotals`], as fast as
//! DataFusion's) and check each against the result type when it is emitted, as a partial state (a
//! shard's or a partition's total) or as the final value. A total that fits is exact whatever the
//! order of the additions, so the answer does not depend on how rows are split across shards;
//! only a partial total emitted beyond the range fails a query whose whole would fit. Floats and
//! decimals keep DataFusion's accumulators. shardwise's own aggregation paths
//! ([`crate::small_groups`], [`crate::many_groups`]) keep their totals in [`WideTotals`] too.

mod totals;
pub use totals::{Total, WideTotals};

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, PrimitiveArray};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::compute::{cast, sum};
use datafusion::arrow::datatypes::{ArrowPrimitiveType, DataType, Int64Type, UInt64Type};
use datafusion::common::{DataFusionError, Result, ScalarValue, exec_err};
use datafusion::functions_aggregate::sum::Sum;
use datafusion::logical_expr::function::AccumulatorArgs;
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, EmitTo, GroupsAccumulator, StatisticsArgs,
};
use datafusion::physical_expr::expressions::CastExpr;

/// The `sum` aggregate with checked integer totals. See the module doc.
#[derive(Debug, Default, PartialEq, Eq, Hash)]
pub struct CheckedSum {
    inner: Sum,
}

/// `sum`, to register with a session in place of DataFusion's.
pub fn checked_sum_udaf() -> Arc<AggregateUDF> {
    Arc::new(AggregateUDF::new_from_impl(CheckedSum::default()))
}

/// The error for a total that does not fit `data_type` (`total`: the exact total, when known).
pub fn overflow_error(total: Option<i128>, data_type: &DataType) -> DataFusionError {
    let (max, min) = match data_type {
        DataType::UInt64 => (u64::MAX as i128, 0),
        _ => (i64::MAX as i128, i64::MIN as i128),
    };
    let total = match total {
        Some(t) => format!("a total is {t}"),
        None if data_type == &DataType::UInt64 => format!("a total passed {max}"),
        None => format!("a total passed {max} or {min}"),
    };
    DataFusionError::Execution(format!(
        "integer overflow in sum: {total}, beyond the range of {data_type} ({min} to {max}); sum a \
         wider type: sum(CAST(x AS DECIMAL(38, 0)))"
    ))
}

/// The integer result types this module checks; others keep DataFusion's accumulators.
fn checked_type(args: &AccumulatorArgs) -> Option<DataType> {
    match args.return_field.data_type() {
        t @ (DataType::Int64 | DataType::UInt64) => Some(t.clone()),
        _ => None,
    }
}

impl AggregateUDFImpl for CheckedSum {
    crate::udaf_wrapper::delegate_aggregate!();

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        match checked_type(&args) {
            Some(t) if args.is_distinct => Ok(Box::new(DistinctSum::new(t))),
            Some(t) => Ok(Box::new(SumAccumulator::new(t, &args))),
            None => self.inner.accumulator(args),
        }
    }

    fn create_groups_accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn GroupsAccumulator>> {
        match checked_type(&args) {
            Some(DataType::UInt64) => Ok(Box::new(SumGroups::<UInt64Type>::new())),
            Some(_) => Ok(Box::new(SumGroups::<Int64Type>::new())),
            None => self.inner.create_groups_accumulator(args),
        }
    }

    fn create_sliding_accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        match checked_type(&args) {
            Some(t) if args.is_distinct => Ok(Box::new(DistinctSum::new(t))),
            Some(t) => Ok(Box::new(SumAccumulator::new(t, &args))),
            None => self.inner.create_sliding_accumulator(args),
        }
    }

    fn value_from_stats(&self, statistics_args: &StatisticsArgs) -> Option<ScalarValue> {
        // Statistics hold no proof that their sum did not wrap: always read the rows.
        let _ = statistics_args;
        None
    }
}

/// `values` as the result type's array (DataFusion's coercion has mostly cast them already).
fn as_result_type(values: &ArrayRef, data_type: &DataType) -> Result<ArrayRef> {
    if values.data_type() == data_type { Ok(Arc::clone(values)) } else { Ok(cast(values, data_type)?) }
}

/// Calls `f(row, value)` for each valid value of `array` (of `data_type`) as a 128-bit integer.
fn each_wide(array: &ArrayRef, data_type: &DataType, mut f: impl FnMut(usize, i128)) -> Result<()> {
    let array = as_result_type(array, data_type)?;
    match data_type {
        DataType::UInt64 => each_valid(array.as_primitive::<UInt64Type>(), |i, v| f(i, i128::from(v))),
        _ => each_valid(array.as_primitive::<Int64Type>(), |i, v| f(i, i128::from(v))),
    }
    Ok(())
}

fn each_valid<T: datafusion::arrow::datatypes::ArrowPrimitiveType>(
    array: &PrimitiveArray<T>,
    mut f: impl FnMut(usize, T::Native),
) {
    let values = array.values();
    match array.nulls() {
        None => values.iter().enumerate().for_each(|(i, v)| f(i, *v)),
        Some(nulls) => nulls.valid_indices().for_each(|i| f(i, values[i])),
    }
}

/// `total` as a scalar of `data_type`, or the overflow error.
fn scalar(total: Option<i128>, data_type: &DataType) -> Result<ScalarValue> {
    let Some(t) = total else { return ScalarValue::try_from(data_type) };
    match data_type {
        DataType::UInt64 => u64::try_from(t).map(|v| ScalarValue::UInt64(Some(v))),
        _ => i64::try_from(t).map(|v| ScalarValue::Int64(Some(v))),
    }
    .map_err(|_| overflow_error(Some(t), data_type))
}

/// One total (no GROUP BY, or a window).
#[derive(Debug)]
struct SumAccumulator {
    total: i128,
    /// Values in the total (a window's frame may empty again).
    count: u64,
    data_type: DataType,
    /// The argument is a 32-bit or narrower integer widened to the result type (`sum` of an
    /// `INT` column): a batch's wrapping 64-bit sum, Arrow's fastest, is exact then.
    narrow: bool,
}

impl SumAccumulator {
    fn new(data_type: DataType, args: &AccumulatorArgs) -> Self {
        SumAccumulator { total: 0, count: 0, data_type, narrow: narrow_argument(args) }
    }
}

/// True when the aggregate's argument is a cast of an integer of at most 32 bits.
fn narrow_argument(args: &AccumulatorArgs) -> bool {
    let Some(cast) = args.exprs.first().and_then(|e| e.downcast_ref::<CastExpr>()) else { return false };
    cast.expr().data_type(args.schema).is_ok_and(|t| {
        matches!(
            t,
            DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::UInt8 | DataType::UInt16 | DataType::UInt32
        )
    })
}

impl SumAccumulator {
    /// The exact sum and count of the valid values of `values`.
    fn sum_of(&self, values: &ArrayRef, narrow: bool) -> Result<(i128, u64)> {
        let array = as_result_type(values, &self.data_type)?;
        // Values of 32 bits, fewer than 2^31 of them: the sum stays within 2^62.
        if narrow && array.len() < 1 << 31 {
            let count = (array.len() - array.null_count()) as u64;
            let sum = match self.data_type {
                DataType::UInt64 => sum(array.as_primitive::<UInt64Type>()).map(i128::from),
                _ => sum(array.as_primitive::<Int64Type>()).map(i128::from),
            };
            return Ok((sum.unwrap_or(0), count));
        }
        if array.null_count() == 0 {
            let sum = match self.data_type {
                DataType::UInt64 => exact_sum_u64(array.as_primitive::<UInt64Type>().values()),
                _ => exact_sum_i64(array.as_primitive::<Int64Type>().values()),
            };
            return Ok((sum, array.len() as u64));
        }
        let (mut sum, mut count) = (0i128, 0u64);
        each_wide(&array, &self.data_type, |_, v| {
            sum = sum.wrapping_add(v);
            count += 1;
        })?;
        Ok((sum, count))
    }
}

/// Lanes of [`exact_sum`]: eight independent sums, which the compiler turns into vector adds.
const LANES: usize = 8;

/// The exact sum of 64-bit values, kept as two wrapping 64-bit sums in one pass: of the values'
/// lower 32 bits, and of their upper 32 bits (`upper`, signed as the type is). Each is safe from
/// overflow for 2^31 values, so the values are taken 2^30 at a time. Written in lanes, as
/// Arrow's own `sum` is, for the compiler to vectorize; a widened INT column, the common case,
/// takes Arrow's `sum` instead (see [`SumAccumulator::sum_of`]).
fn exact_sum<T: Copy>(values: &[T], lower: impl Fn(T) -> u64 + Copy, upper: impl Fn(T) -> i64 + Copy) -> i128 {
    let mut total = 0i128;
    for part in values.chunks(1 << 30) {
        let (mut low, mut high) = ([0u64; LANES], [0i64; LANES]);
        let lanes = part.chunks_exact(LANES);
        let rest = lanes.remainder();
        for chunk in lanes {
            for i in 0..LANES {
                low[i] = low[i].wrapping_add(lower(chunk[i]));
                high[i] = high[i].wrapping_add(upper(chunk[i]));
            }
        }
        for &v in rest {
            low[0] = low[0].wrapping_add(lower(v));
            high[0] = high[0].wrapping_add(upper(v));
        }
        let low: i128 = low.iter().map(|&l| i128::from(l)).sum();
        let high: i128 = high.iter().map(|&h| i128::from(h)).sum();
        total += (high << 32) + low;
    }
    total
}

fn exact_sum_i64(values: &[i64]) -> i128 {
    exact_sum(values, |v| v as u64 & 0xFFFF_FFFF, |v| v >> 32)
}

fn exact_sum_u64(values: &[u64]) -> i128 {
    exact_sum(values, |v| v & 0xFFFF_FFFF, |v| (v >> 32) as i64)
}

impl Accumulator for SumAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let Some(values) = values.first() else { return exec_err!("sum takes one argument") };
        let (sum, count) = self.sum_of(values, self.narrow)?;
        self.total = self.total.wrapping_add(sum);
        self.count += count;
        Ok(())
    }

    fn retract_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let Some(values) = values.first() else { return exec_err!("sum takes one argument") };
        let (sum, count) = self.sum_of(values, self.narrow)?;
        self.total = self.total.wrapping_sub(sum);
        self.count = self.count.saturating_sub(count);
        Ok(())
    }

    fn supports_retract_batch(&self) -> bool {
        true
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        // Partial totals are 64-bit values: added exactly.
        let Some(states) = states.first() else { return exec_err!("sum has one state column") };
        let (sum, count) = self.sum_of(states, false)?;
        self.total = self.total.wrapping_add(sum);
        self.count += count;
        Ok(())
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        Ok(vec![self.evaluate()?])
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        scalar((self.count > 0).then_some(self.total), &self.data_type)
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self)
    }
}

/// `sum(DISTINCT x)`: the distinct values with how often each is in (a window retracts them).
/// Its state is DataFusion's: the list of distinct values.
#[derive(Debug)]
struct DistinctSum {
    values: HashMap<i128, u64>,
    data_type: DataType,
}

impl DistinctSum {
    fn new(data_type: DataType) -> Self {
        DistinctSum { values: HashMap::new(), data_type }
    }
}

impl Accumulator for DistinctSum {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let Some(values) = values.first() else { return exec_err!("sum takes one argument") };
        each_wide(values, &self.data_type, |_, v| *self.values.entry(v).or_insert(0) += 1)
    }

    fn retract_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let Some(values) = values.first() else { return exec_err!("sum takes one argument") };
        each_wide(values, &self.data_type, |_, v| {
            if let Some(n) = self.values.get_mut(&v) {
                *n -= 1;
                if *n == 0 {
                    self.values.remove(&v);
                }
            }
        })
    }

    fn supports_retract_batch(&self) -> bool {
        true
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let Some(lists) = states.first() else { return exec_err!("sum(DISTINCT) takes one state") };
        let lists = lists.as_list::<i32>();
        for i in 0..lists.len() {
            if lists.is_valid(i) {
                self.update_batch(&[lists.value(i)])?;
            }
        }
        Ok(())
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        let values: Vec<ScalarValue> = match self.data_type {
            DataType::UInt64 => self.values.keys().map(|&v| ScalarValue::UInt64(Some(v as u64))).collect(),
            _ => self.values.keys().map(|&v| ScalarValue::Int64(Some(v as i64))).collect(),
        };
        Ok(vec![ScalarValue::List(ScalarValue::new_list_nullable(&values, &self.data_type))])
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        let total = (!self.values.is_empty()).then(|| self.values.keys().sum::<i128>());
        scalar(total, &self.data_type)
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self) + self.values.capacity() * (16 + 8 + 8)
    }
}

/// Totals by group (GROUP BY), of the result type `A` (`Int64` or `UInt64`).
#[derive(Debug)]
struct SumGroups<A: ArrowPrimitiveType> {
    totals: WideTotals<A::Native>,
    /// Which groups have a value; `None` while every batch so far had neither nulls nor a
    /// filter (then every group has one, and the hot loop writes nothing else, as DataFusion's
    /// `NullState` does).
    seen: Option<Vec<bool>>,
    groups: usize,
}

impl<A: ArrowPrimitiveType> SumGroups<A>
where
    A::Native: Total,
{
    fn new() -> Self {
        SumGroups { totals: WideTotals::default(), seen: None, groups: 0 }
    }
}

impl<A: ArrowPrimitiveType> GroupsAccumulator for SumGroups<A>
where
    A::Native: Total,
{
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        let Some(values) = values.first() else { return exec_err!("sum takes one argument") };
        let values = as_result_type(values, &A::DATA_TYPE)?;
        let values = values.as_primitive::<A>();
        self.totals.resize(total_num_groups);
        if opt_filter.is_none() && values.null_count() == 0 && self.seen.is_none() {
            for (&g, &v) in group_indices.iter().zip(values.values()) {
                self.totals.add(g, v);
            }
            self.groups = total_num_groups;
            return Ok(());
        }
        let groups = self.groups;
        let seen = self.seen.get_or_insert_with(|| vec![true; groups]);
        seen.resize(total_num_groups, false);
        self.groups = total_num_groups;
        let totals = &mut self.totals;
        each_valid(values, |row, v| {
            if opt_filter.is_none_or(|f| f.is_valid(row) && f.value(row)) {
                let g = group_indices[row];
                totals.add(g, v);
                seen[g] = true;
            }
        });
        Ok(())
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        let n = match emit_to {
            EmitTo::All => self.groups,
            EmitTo::First(n) => n.min(self.groups),
        };
        let (values, nulls) = match &mut self.seen {
            None => (self.totals.checked(0..n, |_| true)?, None),
            Some(seen) => {
                let values = self.totals.checked(0..n, |g| seen[g])?;
                let taken: Vec<bool> = seen.drain(..n).collect();
                (values, Some(NullBuffer::from(taken)))
            }
        };
        self.totals.drop_first(n);
        self.groups -= n;
        Ok(Arc::new(PrimitiveArray::<A>::new(values.into(), nulls)))
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        Ok(vec![self.evaluate(emit_to)?])
    }

    fn merge_batch(&mut self, values: &[ArrayRef], group_indices: &[usize], total_num_groups: usize) -> Result<()> {
        self.update_batch(values, group_indices, None, total_num_groups)
    }

    fn convert_to_state(&self, values: &[ArrayRef], opt_filter: Option<&BooleanArray>) -> Result<Vec<ArrayRef>> {
        let Some(values) = values.first() else { return exec_err!("sum takes one argument") };
        let values = as_result_type(values, &A::DATA_TYPE)?;
        let Some(filter) = opt_filter else { return Ok(vec![values]) };
        let keep = NullBuffer::from(
            (0..filter.len()).map(|i| filter.is_valid(i) && filter.value(i) && values.is_valid(i)).collect::<Vec<_>>(),
        );
        let data = values.to_data().into_builder().nulls(Some(keep)).build()?;
        Ok(vec![datafusion::arrow::array::make_array(data)])
    }

    fn size(&self) -> usize {
        self.totals.size() + self.seen.as_ref().map_or(0, Vec::capacity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int32Array, Int64Array, RecordBatch};
    use datafusion::arrow::datatypes::{Field, Schema};
    use datafusion::prelude::SessionContext;

    async fn run(sql: &str, values: Vec<Option<i64>>) -> Result<Vec<RecordBatch>> {
        let ctx = SessionContext::new();
        ctx.register_udaf(checked_sum_udaf().as_ref().clone());
        let n = values.len();
        let schema = Arc::new(Schema::new(vec![
            Field::new("g", DataType::Int64, false),
            Field::new("v", DataType::Int64, true),
        ]));
        let groups = Int64Array::from((0..n as i64).map(|i| i % 2).collect::<Vec<_>>());
        let batch = RecordBatch::try_new(schema, vec![Arc::new(groups), Arc::new(Int64Array::from(values))])?;
        ctx.register_batch("t", batch)?;
        ctx.sql(sql).await?.collect().await
    }

    fn ints(batches: &[RecordBatch], column: usize) -> Vec<Option<i64>> {
        batches.iter().flat_map(|b| b.column(column).as_primitive::<Int64Type>().iter().collect::<Vec<_>>()).collect()
    }

    const BIG: i64 = i64::MAX / 2 + 1;

    #[tokio::test]
    async fn a_total_beyond_bigint_is_an_error_in_every_form() {
        let rows = vec![Some(BIG), Some(BIG + 1), Some(BIG + 2), Some(BIG + 3)];
        for sql in [
            "SELECT sum(v) FROM t",
            "SELECT g, sum(v) FROM t GROUP BY g",
            "SELECT sum(DISTINCT v) FROM t",
            "SELECT sum(v) OVER (ORDER BY g ROWS BETWEEN 2 PRECEDING AND CURRENT ROW) FROM t",
            "SELECT sum(v) OVER (PARTITION BY g) FROM t",
        ] {
            let e = match run(sql, rows.clone()).await {
                Ok(b) => panic!("{sql} answered {b:?}"),
                Err(e) => e.to_string(),
            };
            assert!(
                e.contains("integer overflow in sum: a total is ") && e.contains("beyond the range of Int64"),
                "{sql}: {e}"
            );
            assert!(e.contains("sum(CAST(x AS DECIMAL(38, 0)))"), "{sql}: {e}");
        }
    }

    #[tokio::test]
    async fn distinct_sums_merge_their_partial_states() -> Result<()> {
        // Two partitions and a second DISTINCT aggregate: partial aggregates hand over their
        // distinct values (`state`), as a cluster's shards do.
        let ctx = SessionContext::new();
        ctx.register_udaf(checked_sum_udaf().as_ref().clone());
        let schema =
            Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, true), Field::new("b", DataType::Int32, true)]));
        let part = |a: Vec<Option<i64>>, b: Vec<Option<i32>>| {
            RecordBatch::try_new(
                Arc::clone(&schema),
                vec![Arc::new(Int64Array::from(a)), Arc::new(Int32Array::from(b))],
            )
        };
        let first = part(vec![Some(1), Some(1)], vec![Some(2), Some(3)])?;
        let second = part(vec![Some(2), Some(3)], vec![Some(3), None])?;
        let table = datafusion::datasource::MemTable::try_new(Arc::clone(&schema), vec![vec![first], vec![second]])?;
        ctx.register_table("md", Arc::new(table))?;
        let sql = "SELECT count(DISTINCT a), sum(DISTINCT b), sum(DISTINCT a) FROM md";
        let batches = ctx.sql(sql).await?.collect().await?;
        assert_eq!(ints(&batches, 1), [Some(5)]);
        assert_eq!(ints(&batches, 2), [Some(6)]);
        Ok(())
    }

    #[tokio::test]
    async fn totals_that_fit_are_exact_even_when_a_running_total_would_not() -> Result<()> {
        // BIG + BIG passes i64::MAX before the negative values bring it back.
        let rows = vec![Some(BIG), Some(BIG), Some(-BIG), Some(-BIG), None, Some(5)];
        assert_eq!(ints(&run("SELECT sum(v) FROM t", rows.clone()).await?, 0), [Some(5)]);
        let grouped = run("SELECT g, sum(v) FROM t GROUP BY g ORDER BY g", rows.clone()).await?;
        assert_eq!(ints(&grouped, 1), [Some(0), Some(5)]);
        let distinct = run("SELECT sum(DISTINCT v) FROM t", rows.clone()).await?;
        assert_eq!(ints(&distinct, 0), [Some(5)]);
        // A sliding window adds and takes away values.
        let window =
            run("SELECT sum(v) OVER (ORDER BY g, v ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) FROM t", rows).await?;
        assert_eq!(ints(&window, 0).len(), 6);
        Ok(())
    }

    #[tokio::test]
    async fn sums_of_int_columns_take_the_fast_path_and_are_exact() -> Result<()> {
        use datafusion::arrow::array::Int32Array;
        let ctx = SessionContext::new();
        ctx.register_udaf(checked_sum_udaf().as_ref().clone());
        let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::Int32, true)]));
        let values = Int32Array::from(vec![Some(i32::MAX), None, Some(i32::MAX), Some(i32::MIN), Some(i32::MAX)]);
        ctx.register_batch("t", RecordBatch::try_new(schema, vec![Arc::new(values)])?)?;
        let batches = ctx.sql("SELECT sum(n), sum(n) FILTER (WHERE n < 0), count(n) FROM t").await?.collect().await?;
        assert_eq!(ints(&batches, 0), [Some(2 * i64::from(i32::MAX) - 1)]);
        assert_eq!(ints(&batches, 1), [Some(i64::from(i32::MIN))]);
        Ok(())
    }

    #[test]
    fn exact_sums_of_halves_equal_128_bit_sums() {
        let signed = [i64::MAX, i64::MAX, -1, i64::MIN, 12345, -(1 << 40), 1 << 33];
        let want: i128 = signed.iter().map(|&v| i128::from(v)).sum();
        assert_eq!(exact_sum_i64(&signed), want);
        // Enough values to fill the lanes, extremes among them.
        let many: Vec<i64> = (0..1003i64)
            .map(|i| match i % 3 {
                0 => i64::MAX - i,
                1 => i64::MIN + i,
                _ => -(i << 40),
            })
            .collect();
        let want: i128 = many.iter().map(|&v| i128::from(v)).sum();
        assert_eq!(exact_sum_i64(&many), want);
        let many: Vec<u64> = (0..1003u64).map(|i| u64::MAX - i * (1 << 50)).collect();
        let want: i128 = many.iter().map(|&v| i128::from(v)).sum();
        assert_eq!(exact_sum_u64(&many), want);
        let unsigned = [u64::MAX, u64::MAX, 1, 1 << 63];
        let want: i128 = unsigned.iter().map(|&v| i128::from(v)).sum();
        assert_eq!(exact_sum_u64(&unsigned), want);
    }

    #[test]
    fn groups_see_values_across_batches_with_and_without_nulls() -> Result<()> {
        let mut sums = SumGroups::<Int64Type>::new();
        let batch = |v: Vec<Option<i64>>| -> Vec<ArrayRef> { vec![Arc::new(Int64Array::from(v))] };
        sums.update_batch(&batch(vec![Some(1), Some(2), Some(3)]), &[0, 1, 0], None, 2)?;
        // A new group that gets only a null, and a filtered-out value for group 1.
        let filter = BooleanArray::from(vec![true, true, false]);
        sums.update_batch(&batch(vec![None, Some(5), Some(100)]), &[2, 0, 1], Some(&filter), 3)?;
        let first = sums.evaluate(EmitTo::First(1))?;
        assert_eq!(first.as_primitive::<Int64Type>().iter().collect::<Vec<_>>(), [Some(9)]);
        let rest = sums.evaluate(EmitTo::All)?;
        assert_eq!(rest.as_primitive::<Int64Type>().iter().collect::<Vec<_>>(), [Some(2), None]);
        Ok(())
    }

    #[tokio::test]
    async fn empty_and_null_inputs_give_null() -> Result<()> {
        assert_eq!(ints(&run("SELECT sum(v) FROM t WHERE v > 100", vec![Some(1)]).await?, 0), [None]);
        assert_eq!(ints(&run("SELECT sum(v) FROM t", vec![None, None]).await?, 0), [None]);
        let filtered =
            run("SELECT g, sum(v) FILTER (WHERE v > 1) FROM t GROUP BY g ORDER BY g", vec![Some(1), Some(2), Some(3)])
                .await?;
        assert_eq!(ints(&filtered, 1), [Some(3), Some(2)]);
        Ok(())
    }
}
