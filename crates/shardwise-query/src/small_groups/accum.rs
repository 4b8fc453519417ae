//! The aggregates [`super::SmallGroupsExec`] computes itself, one plain vector per state field
//! indexed by group id, with the partial states DataFusion's own accumulators emit (same types,
//! same nulls), so DataFusion's final aggregation merges them unchanged.
//!
//! | aggregate | argument | state |
//! | --- | --- | --- |
//! | `count` | any (`count(*)` is a literal) | `Int64`, never null |
//! | `sum` | `Int64` | `Int64` (exact, an error past its range, as [`crate::checked_sum`]), null without values |
//! | `sum` | `Float64` | `Float64`, null without values |
//! | `avg` | `Float64` | `UInt64` count, `Float64` sum; both null without values |
//! | `min`, `max` | `Int32`, `Int64` | the argument's type, null without values |
//! | `corr`, `var`, `stddev`, `median` and kin | `Float64` | see [`super::stats`] |
//!
//! DataFusion casts other argument types to these (`sum(Int32)` reads `Int64`, `avg` reads
//! `Float64`); anything else keeps DataFusion's aggregation ([`AccumKind::of`] says no). Such a
//! cast of an `Int32` or `Int64` column is not evaluated: [`widened_from`] finds it, and the
//! update converts each value as the cast would, without making the cast array.

use std::sync::Arc;

use crate::checked_sum::WideTotals;

use datafusion::arrow::array::{
    Array, ArrayRef, ArrowPrimitiveType, AsArray, Float64Array, Int64Array, PrimitiveArray, UInt64Array,
};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Float64Type, Int32Type, Int64Type, Schema};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::ColumnarValue;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use datafusion::physical_expr::expressions::CastExpr;

use super::stats;

/// What one aggregate computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccumKind {
    Count,
    SumInt,
    SumFloat,
    Avg,
    Min(IntWidth),
    Max(IntWidth),
    Corr,
    /// `var`, `var_pop`, `stddev`, `stddev_pop` (the same state).
    Variance,
    Median,
}

/// The integer argument types `min` and `max` read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntWidth {
    I32,
    I64,
}

impl IntWidth {
    fn data_type(self) -> DataType {
        match self {
            IntWidth::I32 => DataType::Int32,
            IntWidth::I64 => DataType::Int64,
        }
    }
}

impl AccumKind {
    /// The kind `expr` is, if this module computes it with exactly DataFusion's state.
    pub fn of(expr: &AggregateFunctionExpr, input: &Schema) -> Option<AccumKind> {
        if expr.is_distinct() || !expr.order_bys().is_empty() {
            return None;
        }
        let args = expr.expressions();
        let kind = match (expr.fun().name(), args.as_slice()) {
            ("corr", [x, y]) => {
                let floats = [x, y].iter().all(|a| a.data_type(input).ok() == Some(DataType::Float64));
                floats.then_some(AccumKind::Corr)?
            }
            (_, [arg]) => Self::of_one(expr.fun().name(), &arg.data_type(input).ok()?)?,
            _ => return None,
        };
        let state: Vec<DataType> = expr.state_fields().ok()?.iter().map(|f| f.data_type().clone()).collect();
        (state == kind.state_types()).then_some(kind)
    }

    /// The kind of the one-argument aggregate `name` over `arg_type`.
    fn of_one(name: &str, arg_type: &DataType) -> Option<AccumKind> {
        Some(match (name, arg_type) {
            ("count", _) => AccumKind::Count,
            ("sum", DataType::Int64) => AccumKind::SumInt,
            ("sum", DataType::Float64) => AccumKind::SumFloat,
            ("avg", DataType::Float64) => AccumKind::Avg,
            ("min", DataType::Int32) => AccumKind::Min(IntWidth::I32),
            ("min", DataType::Int64) => AccumKind::Min(IntWidth::I64),
            ("max", DataType::Int32) => AccumKind::Max(IntWidth::I32),
            ("max", DataType::Int64) => AccumKind::Max(IntWidth::I64),
            ("var" | "var_pop" | "stddev" | "stddev_pop", DataType::Float64) => AccumKind::Variance,
            ("median", DataType::Float64) => AccumKind::Median,
            _ => return None,
        })
    }

    /// The types of the state fields this kind emits.
    pub fn state_types(self) -> Vec<DataType> {
        match self {
            AccumKind::Count | AccumKind::SumInt => vec![DataType::Int64],
            AccumKind::SumFloat => vec![DataType::Float64],
            AccumKind::Avg => vec![DataType::UInt64, DataType::Float64],
            AccumKind::Min(w) | AccumKind::Max(w) => vec![w.data_type()],
            AccumKind::Corr => stats::Corr::state_types(),
            AccumKind::Variance => stats::Variance::state_types(),
            AccumKind::Median => stats::Median::state_types(),
        }
    }
}

/// The argument to evaluate instead of `arg` when `arg` only widens an `Int32` or `Int64` value
/// to the type `kind` reads (`CAST(v AS BIGINT)` for `sum`, `CAST(v AS DOUBLE)` for `sum` and
/// `avg`), which [`Accum::update`] then converts row by row.
pub fn widened_from(kind: AccumKind, arg: &Arc<dyn PhysicalExpr>, input: &Schema) -> Option<Arc<dyn PhysicalExpr>> {
    let cast = arg.downcast_ref::<CastExpr>()?;
    let from = cast.expr().data_type(input).ok()?;
    let takes = match (kind, cast.cast_type()) {
        (AccumKind::SumInt, DataType::Int64) => from == DataType::Int32,
        (
            AccumKind::SumFloat | AccumKind::Avg | AccumKind::Corr | AccumKind::Variance | AccumKind::Median,
            DataType::Float64,
        ) => {
            matches!(from, DataType::Int32 | DataType::Int64)
        }
        _ => false,
    };
    takes.then(|| Arc::clone(cast.expr()))
}

/// Which groups have a value, for the aggregates whose state is only null or not (`sum`, `min`,
/// `max`), kept without a pass over the rows while the argument has had no nulls: then every
/// group has one, since each group was made by a row that also reached this aggregate. A
/// `perf` profile of q1 on a node had a per-row count at 14% of its CPU, where `sum` needs none.
#[derive(Debug, Default)]
pub struct Seen {
    /// `None` while every group has a value; after the first null, per group.
    has_value: Option<Vec<bool>>,
    /// Groups there were at the last update.
    groups: usize,
}

impl Seen {
    /// Notes a batch: `ids` (one per row) of `groups` groups, `nulls` the argument's.
    fn update(&mut self, ids: &[u32], groups: usize, nulls: Option<&NullBuffer>) {
        let nulls = nulls.filter(|n| n.null_count() > 0);
        if self.has_value.is_none() && nulls.is_some() {
            // Every group made before this batch has a value.
            self.has_value = Some(vec![true; self.groups]);
        }
        if let Some(has_value) = &mut self.has_value {
            has_value.resize(groups, false);
            match nulls {
                None => ids.iter().for_each(|&g| has_value[g as usize] = true),
                Some(nulls) => {
                    for (i, &g) in ids.iter().enumerate() {
                        if nulls.is_valid(i) {
                            has_value[g as usize] = true;
                        }
                    }
                }
            }
        }
        self.groups = self.groups.max(groups);
    }

    /// Whether each of the first `groups` groups has a value; `None` when all do.
    fn validity(&self, groups: usize) -> Option<NullBuffer> {
        let has_value = self.has_value.as_ref()?;
        let valid = NullBuffer::from_iter((0..groups).map(|g| has_value.get(g).copied().unwrap_or(false)));
        (valid.null_count() > 0).then_some(valid)
    }

    fn has_value(&self, group: usize) -> bool {
        self.has_value.as_ref().is_none_or(|h| h.get(group).copied().unwrap_or(false))
    }

    fn size(&self) -> usize {
        self.has_value.as_ref().map_or(0, Vec::capacity)
    }
}

/// One aggregate's states, by group id. `count` and `avg` need each group's count of values:
/// the caller counts each group's rows once for them ([`count_rows`], only when one of them is
/// in the query, [`Accum::needs_row_counts`]), and they count only the rows where their argument
/// is null, a group's count being `rows - nulls`. `sum`, `min` and `max` need only whether a
/// group has a value ([`Seen`]). Without nulls, an update is one pass that only adds (or
/// compares).
#[derive(Debug)]
pub enum Accum {
    Count {
        nulls: Vec<u64>,
    },
    SumInt {
        /// Exact totals, checked against `Int64` when emitted.
        sums: WideTotals<i64>,
        seen: Seen,
    },
    SumFloat {
        sums: Vec<f64>,
        seen: Seen,
    },
    Avg {
        sums: Vec<f64>,
        nulls: Vec<u64>,
    },
    /// Starts at `i64::MAX` (min) or `i64::MIN` (max), so an update is one `min`/`max`.
    MinMax {
        values: Vec<i64>,
        seen: Seen,
        max: bool,
        width: IntWidth,
    },
    Corr(stats::Corr),
    Variance(stats::Variance),
    Median(stats::Median),
}

/// Adds each null row of a batch (`arg_nulls`) to its group's null count (`nulls` grown to
/// `groups` first).
fn count_nulls(nulls: &mut Vec<u64>, ids: &[u32], groups: usize, arg_nulls: Option<&NullBuffer>) {
    nulls.resize(groups, 0);
    if let Some(arg_nulls) = arg_nulls.filter(|n| n.null_count() > 0) {
        for (i, &g) in ids.iter().enumerate() {
            if arg_nulls.is_null(i) {
                nulls[g as usize] += 1;
            }
        }
    }
}

/// Adds each row of a batch to its group's row count (`rows` grown to `groups` first).
pub fn count_rows(rows: &mut Vec<u64>, ids: &[u32], groups: usize) {
    rows.resize(groups, 0);
    ids.iter().for_each(|&g| rows[g as usize] += 1);
}

impl Accum {
    pub fn new(kind: AccumKind) -> Self {
        let nulls = Vec::new();
        match kind {
            AccumKind::Count => Accum::Count { nulls },
            AccumKind::SumInt => Accum::SumInt { sums: WideTotals::default(), seen: Seen::default() },
            AccumKind::SumFloat => Accum::SumFloat { sums: Vec::new(), seen: Seen::default() },
            AccumKind::Avg => Accum::Avg { sums: Vec::new(), nulls },
            AccumKind::Min(width) => Accum::MinMax { values: Vec::new(), seen: Seen::default(), max: false, width },
            AccumKind::Max(width) => Accum::MinMax { values: Vec::new(), seen: Seen::default(), max: true, width },
            AccumKind::Corr => Accum::Corr(Default::default()),
            AccumKind::Variance => Accum::Variance(Default::default()),
            AccumKind::Median => Accum::Median(Default::default()),
        }
    }

    /// Whether this aggregate's states need each group's row count ([`count_rows`]).
    pub fn needs_row_counts(&self) -> bool {
        matches!(self, Accum::Count { .. } | Accum::Avg { .. })
    }

    /// Adds the rows of `args` (one value per argument) to the groups `ids` names (one id per
    /// row, each below `groups`).
    pub fn update(&mut self, ids: &[u32], groups: usize, args: Vec<ColumnarValue>) -> Result<()> {
        let mut args = args.into_iter();
        let (Some(arg), second) = (args.next(), args.next()) else {
            return Err(DataFusionError::Internal("small-group aggregation: an aggregate without arguments".into()));
        };
        match self {
            Accum::Corr(corr) => {
                let y = second
                    .ok_or_else(|| DataFusionError::Internal("small-group aggregation: corr of one argument".into()))?;
                return corr.update(ids, groups, &arg.into_array(ids.len())?, &y.into_array(ids.len())?);
            }
            Accum::Variance(variance) => return variance.update(ids, groups, &arg.into_array(ids.len())?),
            Accum::Median(median) => return median.update(ids, groups, &arg.into_array(ids.len())?),
            _ => {}
        }
        if let (Accum::Count { nulls }, ColumnarValue::Scalar(value)) = (&mut *self, &arg) {
            nulls.resize(groups, 0);
            if value.is_null() {
                ids.iter().for_each(|&g| nulls[g as usize] += 1);
            }
            return Ok(());
        }
        let array = arg.into_array(ids.len())?;
        let arg_nulls = array.logical_nulls();
        match self {
            Accum::Count { nulls } => count_nulls(nulls, ids, groups, arg_nulls.as_ref()),
            Accum::SumInt { sums, seen } => {
                sums.resize(groups);
                let mut add = |g: usize, v: i64| sums.add(g, v);
                match array.data_type() {
                    DataType::Int32 => each_value(ids, primitive::<Int32Type>(&array)?, |g, v| add(g, v.into())),
                    _ => each_value(ids, primitive::<Int64Type>(&array)?, add),
                }
                seen.update(ids, groups, arg_nulls.as_ref());
            }
            Accum::SumFloat { sums, seen } => {
                sums.resize(groups, 0.0);
                each_float(ids, &array, |g, v| sums[g] += v)?;
                seen.update(ids, groups, arg_nulls.as_ref());
            }
            Accum::Avg { sums, nulls } => {
                sums.resize(groups, 0.0);
                each_float(ids, &array, |g, v| sums[g] += v)?;
                count_nulls(nulls, ids, groups, arg_nulls.as_ref());
            }
            Accum::MinMax { values, seen, max, width } => {
                let max = *max;
                values.resize(groups, if max { i64::MIN } else { i64::MAX });
                let mut take = |g: usize, v: i64| values[g] = if max { values[g].max(v) } else { values[g].min(v) };
                match width {
                    IntWidth::I32 => each_value(ids, primitive::<Int32Type>(&array)?, |g, v| take(g, v.into())),
                    IntWidth::I64 => each_value(ids, primitive::<Int64Type>(&array)?, take),
                }
                seen.update(ids, groups, arg_nulls.as_ref());
            }
            Accum::Corr(_) | Accum::Variance(_) | Accum::Median(_) => {
                return Err(DataFusionError::Internal("statistics were updated above".into()));
            }
        }
        Ok(())
    }

    /// The state arrays of the first `groups` groups, whose row counts are `rows` when this
    /// aggregate [needs them](Accum::needs_row_counts) (groups past the last update have no
    /// values).
    pub fn emit(&self, groups: usize, rows: &[u64]) -> Result<Vec<ArrayRef>> {
        let nulls: &[u64] = match self {
            Accum::Count { nulls } | Accum::Avg { nulls, .. } => nulls,
            Accum::SumInt { sums, seen } => {
                let values = sums.checked(0..groups, |g| seen.has_value(g))?;
                return Ok(vec![Arc::new(Int64Array::new(values.into(), seen.validity(groups)))]);
            }
            Accum::SumFloat { sums, seen } => {
                return Ok(vec![Arc::new(Float64Array::new(padded(sums, groups, 0.0), seen.validity(groups)))]);
            }
            Accum::MinMax { values, seen, width, .. } => {
                // A group without a value still holds its start value: 0 under the null instead.
                let values: Vec<i64> = (0..groups)
                    .map(|g| if seen.has_value(g) { values.get(g).copied().unwrap_or(0) } else { 0 })
                    .collect();
                // Every value left came from `width`'s type, so the cast back is exact.
                return Ok(vec![cast(&Int64Array::new(values.into(), seen.validity(groups)), &width.data_type())?]);
            }
            Accum::Corr(corr) => return Ok(corr.emit(groups)),
            Accum::Variance(variance) => return Ok(variance.emit(groups)),
            Accum::Median(median) => return median.emit(groups),
        };
        // Rows with a value, per group.
        let counts: Vec<u64> = (0..groups)
            .map(|g| rows.get(g).copied().unwrap_or(0).saturating_sub(nulls.get(g).copied().unwrap_or(0)))
            .collect();
        let valid = NullBuffer::from_iter(counts.iter().map(|&c| c > 0));
        let valid = (valid.null_count() > 0).then_some(valid);
        Ok(match self {
            Accum::Count { .. } => vec![Arc::new(Int64Array::from_iter_values(counts.iter().map(|&c| c as i64)))],
            Accum::Avg { sums, .. } => vec![
                Arc::new(UInt64Array::new(counts.into(), valid.clone())),
                Arc::new(Float64Array::new(padded(sums, groups, 0.0), valid)),
            ],
            _ => return Err(DataFusionError::Internal("emitted above".into())),
        })
    }

    /// Bytes held.
    pub fn size(&self) -> usize {
        match self {
            Accum::Count { nulls } => nulls.capacity() * 8,
            Accum::SumInt { sums, seen } => sums.size() + seen.size(),
            Accum::SumFloat { sums, seen } => sums.capacity() * 8 + seen.size(),
            Accum::Avg { sums, nulls } => (sums.capacity() + nulls.capacity()) * 8,
            Accum::MinMax { values, seen, .. } => values.capacity() * 8 + seen.size(),
            Accum::Corr(corr) => corr.size(),
            Accum::Variance(variance) => variance.size(),
            Accum::Median(median) => median.size(),
        }
    }
}

/// `array` as a `PrimitiveArray<T>`, or an internal error naming both types.
pub(crate) fn primitive<T: ArrowPrimitiveType>(array: &ArrayRef) -> Result<&PrimitiveArray<T>> {
    array.as_primitive_opt::<T>().ok_or_else(|| {
        DataFusionError::Internal(format!(
            "group aggregation: an array of type {} where {} was planned",
            array.data_type(),
            T::DATA_TYPE
        ))
    })
}

/// Calls `f(group, value)` for every non-null row.
#[inline]
pub(crate) fn each_value<T: ArrowPrimitiveType>(
    ids: &[u32],
    array: &PrimitiveArray<T>,
    mut f: impl FnMut(usize, T::Native),
) {
    let values = array.values();
    match array.nulls().filter(|n| n.null_count() > 0) {
        None => ids.iter().zip(values.iter()).for_each(|(&g, &v)| f(g as usize, v)),
        Some(nulls) => {
            for (i, (&g, &v)) in ids.iter().zip(values.iter()).enumerate() {
                if nulls.is_valid(i) {
                    f(g as usize, v);
                }
            }
        }
    }
}

/// Calls `f(group, value as f64)` for every non-null row of a `Float64`, `Int64` or `Int32`
/// array (the conversion is the one `CAST(.. AS DOUBLE)` makes).
#[inline]
fn each_float(ids: &[u32], array: &ArrayRef, f: impl FnMut(usize, f64)) -> Result<()> {
    let mut f = f;
    match array.data_type() {
        DataType::Int32 => each_value(ids, primitive::<Int32Type>(array)?, |g, v| f(g, v.into())),
        DataType::Int64 => each_value(ids, primitive::<Int64Type>(array)?, |g, v| f(g, v as f64)),
        _ => each_value(ids, primitive::<Float64Type>(array)?, f),
    }
    Ok(())
}

/// The first `groups` values, padded with `fill` for groups no update reached.
pub(super) fn padded<T: Copy + datafusion::arrow::datatypes::ArrowNativeType>(
    values: &[T],
    groups: usize,
    fill: T,
) -> datafusion::arrow::buffer::ScalarBuffer<T> {
    let mut out = values[..values.len().min(groups)].to_vec();
    out.resize(groups, fill);
    out.into()
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Int32Array, Int64Array};

    use super::*;

    fn update(accum: &mut Accum, ids: &[u32], groups: usize, values: Vec<Option<i64>>) {
        let array: ArrayRef = Arc::new(Int64Array::from(values));
        accum.update(ids, groups, vec![ColumnarValue::Array(array)]).expect("update");
    }

    #[test]
    fn an_integer_sum_past_bigint_fails_when_emitted_and_one_that_comes_back_is_exact() {
        let big = i64::MAX / 2 + 1;
        let mut sum = Accum::new(AccumKind::SumInt);
        update(&mut sum, &[0, 1, 0, 1], 2, vec![Some(big), Some(big), Some(big), Some(big)]);
        update(&mut sum, &[1], 2, vec![Some(-big)]);
        let e = sum.emit(2, &[]).expect_err("group 0 is 2^63").to_string();
        assert!(e.contains("integer overflow in sum: a total is 9223372036854775808"), "{e}");
        // Group 1 passed the range and came back: exact.
        let want: ArrayRef = Arc::new(Int64Array::from(vec![Some(big)]));
        let mut one = Accum::new(AccumKind::SumInt);
        update(&mut one, &[0, 0, 0], 1, vec![Some(big), Some(big), Some(-big)]);
        assert_eq!(&one.emit(1, &[]).expect("fits")[0], &want);
    }

    /// Groups made before the argument's first null, groups made in a batch with nulls and given
    /// a value only later, and groups that never get one.
    fn batches(accum: &mut Accum) {
        update(accum, &[0, 1, 0], 2, vec![Some(1), Some(2), Some(3)]);
        update(accum, &[2, 0, 3, 4], 5, vec![None, Some(5), None, None]);
        update(accum, &[3, 1], 5, vec![Some(7), Some(8)]);
    }

    #[test]
    fn sum_min_max_know_which_groups_have_a_value_without_row_counts() {
        let mut sum = Accum::new(AccumKind::SumInt);
        assert!(!sum.needs_row_counts());
        batches(&mut sum);
        let want: ArrayRef = Arc::new(Int64Array::from(vec![Some(9), Some(10), None, Some(7), None]));
        assert_eq!(&sum.emit(5, &[]).expect("emit")[0], &want);
        // The first groups only (an operator handing over part-way).
        let want: ArrayRef = Arc::new(Int64Array::from(vec![Some(9), Some(10)]));
        assert_eq!(&sum.emit(2, &[]).expect("emit")[0], &want);

        let mut min = Accum::new(AccumKind::Min(IntWidth::I32));
        let values = |v: Vec<Option<i32>>| vec![ColumnarValue::Array(Arc::new(Int32Array::from(v)) as ArrayRef)];
        min.update(&[0, 1, 0], 2, values(vec![Some(4), Some(-2), Some(3)])).expect("update");
        min.update(&[2, 0, 2], 3, values(vec![None, Some(1), None])).expect("update");
        let want: ArrayRef = Arc::new(Int32Array::from(vec![Some(1), Some(-2), None]));
        assert_eq!(&min.emit(3, &[]).expect("emit")[0], &want);
    }

    #[test]
    fn without_nulls_every_group_has_a_value_and_no_per_row_flags_are_kept() {
        let mut max = Accum::new(AccumKind::Max(IntWidth::I64));
        update(&mut max, &[0, 1, 2, 1], 3, vec![Some(1), Some(5), Some(-3), Some(2)]);
        update(&mut max, &[3], 4, vec![Some(0)]);
        let Accum::MinMax { seen, .. } = &max else { panic!("min/max") };
        assert_eq!(seen.size(), 0);
        let want: ArrayRef = Arc::new(Int64Array::from(vec![1, 5, -3, 0]));
        assert_eq!(&max.emit(4, &[]).expect("emit")[0], &want);
    }

    #[test]
    fn count_and_avg_still_take_the_row_counts() {
        let mut count = Accum::new(AccumKind::Count);
        let mut avg = Accum::new(AccumKind::Avg);
        assert!(count.needs_row_counts() && avg.needs_row_counts());
        let (ids, mut rows) = ([0u32, 1, 0], Vec::new());
        count_rows(&mut rows, &ids, 2);
        let floats =
            || vec![ColumnarValue::Array(Arc::new(Float64Array::from(vec![Some(1.0), None, Some(2.0)])) as ArrayRef)];
        count.update(&ids, 2, floats()).expect("update");
        avg.update(&ids, 2, floats()).expect("update");
        let want: ArrayRef = Arc::new(Int64Array::from(vec![2, 0]));
        assert_eq!(&count.emit(2, &rows).expect("emit")[0], &want);
        let states = avg.emit(2, &rows).expect("emit");
        let want: ArrayRef = Arc::new(UInt64Array::from(vec![Some(2), None]));
        assert_eq!(&states[0], &want);
    }
}
