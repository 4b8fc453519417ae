//! The aggregates [`super::SmallGroupsExec`] computes itself, one plain vector per state field
//! indexed by group id, with the partial states DataFusion's own accumulators emit (same types,
//! same nulls), so DataFusion's final aggregation merges them unchanged.
//!
//! | aggregate | argument | state |
//! | --- | --- | --- |
//! | `count` | any (`count(*)` is a literal) | `Int64`, never null |
//! | `sum` | `Int64` | `Int64` (wrapping, as DataFusion), null without values |
//! | `sum` | `Float64` | `Float64`, null without values |
//! | `avg` | `Float64` | `UInt64` count, `Float64` sum; both null without values |
//! | `min`, `max` | `Int32`, `Int64` | the argument's type, null without values |
//!
//! DataFusion casts other argument types to these (`sum(Int32)` reads `Int64`, `avg` reads
//! `Float64`); anything else keeps DataFusion's aggregation ([`AccumKind::of`] says no). Such a
//! cast of an `Int32` or `Int64` column is not evaluated: [`widened_from`] finds it, and the
//! update converts each value as the cast would, without making the cast array.

use std::sync::Arc;

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

/// What one aggregate computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccumKind {
    Count,
    SumInt,
    SumFloat,
    Avg,
    Min(IntWidth),
    Max(IntWidth),
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
        let [arg] = expr.expressions().try_into().ok()?;
        let arg_type = arg.data_type(input).ok()?;
        let kind = match (expr.fun().name(), &arg_type) {
            ("count", _) => AccumKind::Count,
            ("sum", DataType::Int64) => AccumKind::SumInt,
            ("sum", DataType::Float64) => AccumKind::SumFloat,
            ("avg", DataType::Float64) => AccumKind::Avg,
            ("min", DataType::Int32) => AccumKind::Min(IntWidth::I32),
            ("min", DataType::Int64) => AccumKind::Min(IntWidth::I64),
            ("max", DataType::Int32) => AccumKind::Max(IntWidth::I32),
            ("max", DataType::Int64) => AccumKind::Max(IntWidth::I64),
            _ => return None,
        };
        let state: Vec<DataType> = expr.state_fields().ok()?.iter().map(|f| f.data_type().clone()).collect();
        (state == kind.state_types()).then_some(kind)
    }

    /// The types of the state fields this kind emits.
    pub fn state_types(self) -> Vec<DataType> {
        match self {
            AccumKind::Count | AccumKind::SumInt => vec![DataType::Int64],
            AccumKind::SumFloat => vec![DataType::Float64],
            AccumKind::Avg => vec![DataType::UInt64, DataType::Float64],
            AccumKind::Min(w) | AccumKind::Max(w) => vec![w.data_type()],
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
        (AccumKind::SumFloat | AccumKind::Avg, DataType::Float64) => matches!(from, DataType::Int32 | DataType::Int64),
        _ => false,
    };
    takes.then(|| Arc::clone(cast.expr()))
}

/// One aggregate's states, by group id.
#[derive(Debug)]
pub enum Accum {
    Count { counts: Vec<i64> },
    SumInt { sums: Vec<i64>, seen: Vec<bool> },
    SumFloat { sums: Vec<f64>, seen: Vec<bool> },
    Avg { counts: Vec<u64>, sums: Vec<f64> },
    MinMax { values: Vec<i64>, seen: Vec<bool>, max: bool, width: IntWidth },
}

impl Accum {
    pub fn new(kind: AccumKind) -> Self {
        match kind {
            AccumKind::Count => Accum::Count { counts: Vec::new() },
            AccumKind::SumInt => Accum::SumInt { sums: Vec::new(), seen: Vec::new() },
            AccumKind::SumFloat => Accum::SumFloat { sums: Vec::new(), seen: Vec::new() },
            AccumKind::Avg => Accum::Avg { counts: Vec::new(), sums: Vec::new() },
            AccumKind::Min(width) => Accum::MinMax { values: Vec::new(), seen: Vec::new(), max: false, width },
            AccumKind::Max(width) => Accum::MinMax { values: Vec::new(), seen: Vec::new(), max: true, width },
        }
    }

    /// Adds the rows of `arg` to the groups `ids` names (one id per row, each below `groups`).
    pub fn update(&mut self, ids: &[u32], groups: usize, arg: ColumnarValue) -> Result<()> {
        if let (Accum::Count { counts }, ColumnarValue::Scalar(value)) = (&mut *self, &arg) {
            counts.resize(groups, 0);
            if !value.is_null() {
                ids.iter().for_each(|&g| counts[g as usize] += 1);
            }
            return Ok(());
        }
        let array = arg.into_array(ids.len())?;
        match self {
            Accum::Count { counts } => {
                counts.resize(groups, 0);
                let nulls = array.logical_nulls();
                each_valid(ids, nulls.as_ref(), |g| counts[g] += 1);
            }
            Accum::SumInt { sums, seen } => {
                sums.resize(groups, 0);
                seen.resize(groups, false);
                let mut add = |g: usize, v: i64| {
                    sums[g] = sums[g].wrapping_add(v);
                    seen[g] = true;
                };
                match array.data_type() {
                    DataType::Int32 => each_value(ids, primitive::<Int32Type>(&array)?, |g, v| add(g, v.into())),
                    _ => each_value(ids, primitive::<Int64Type>(&array)?, add),
                }
            }
            Accum::SumFloat { sums, seen } => {
                sums.resize(groups, 0.0);
                seen.resize(groups, false);
                each_float(ids, &array, |g, v| {
                    sums[g] += v;
                    seen[g] = true;
                })?;
            }
            Accum::Avg { counts, sums } => {
                counts.resize(groups, 0);
                sums.resize(groups, 0.0);
                each_float(ids, &array, |g, v| {
                    counts[g] += 1;
                    sums[g] += v;
                })?;
            }
            Accum::MinMax { values, seen, max, width } => {
                values.resize(groups, 0);
                seen.resize(groups, false);
                let max = *max;
                let mut take = |g: usize, v: i64| {
                    if !seen[g] || (max && v > values[g]) || (!max && v < values[g]) {
                        values[g] = v;
                        seen[g] = true;
                    }
                };
                match width {
                    IntWidth::I32 => each_value(ids, primitive::<Int32Type>(&array)?, |g, v| take(g, v.into())),
                    IntWidth::I64 => each_value(ids, primitive::<Int64Type>(&array)?, take),
                }
            }
        }
        Ok(())
    }

    /// The state arrays of the first `groups` groups (groups past the last update have none).
    pub fn emit(&self, groups: usize) -> Result<Vec<ArrayRef>> {
        let take = |n: usize| n.min(groups);
        Ok(match self {
            Accum::Count { counts } => {
                let mut counts = counts[..take(counts.len())].to_vec();
                counts.resize(groups, 0);
                vec![Arc::new(Int64Array::from(counts))]
            }
            Accum::SumInt { sums, seen } => {
                vec![Arc::new(Int64Array::new(padded(sums, groups, 0), seen_nulls(seen, groups)))]
            }
            Accum::SumFloat { sums, seen } => {
                vec![Arc::new(Float64Array::new(padded(sums, groups, 0.0), seen_nulls(seen, groups)))]
            }
            Accum::Avg { counts, sums } => {
                let seen: Vec<bool> = counts.iter().map(|&c| c > 0).collect();
                let nulls = seen_nulls(&seen, groups);
                vec![
                    Arc::new(UInt64Array::new(padded(counts, groups, 0), nulls.clone())),
                    Arc::new(Float64Array::new(padded(sums, groups, 0.0), nulls)),
                ]
            }
            Accum::MinMax { values, seen, width, .. } => {
                let values = Int64Array::new(padded(values, groups, 0), seen_nulls(seen, groups));
                // The values came from `width`'s type, so the cast back is exact.
                vec![cast(&values, &width.data_type())?]
            }
        })
    }

    /// Bytes held.
    pub fn size(&self) -> usize {
        match self {
            Accum::Count { counts } => counts.capacity() * 8,
            Accum::SumInt { sums, seen } => sums.capacity() * 8 + seen.capacity(),
            Accum::SumFloat { sums, seen } => sums.capacity() * 8 + seen.capacity(),
            Accum::Avg { counts, sums } => counts.capacity() * 8 + sums.capacity() * 8,
            Accum::MinMax { values, seen, .. } => values.capacity() * 8 + seen.capacity(),
        }
    }
}

fn primitive<T: ArrowPrimitiveType>(array: &ArrayRef) -> Result<&PrimitiveArray<T>> {
    array.as_primitive_opt::<T>().ok_or_else(|| {
        DataFusionError::Internal(format!(
            "small-group aggregation: argument of type {} where {} was planned",
            array.data_type(),
            T::DATA_TYPE
        ))
    })
}

/// Calls `f(group, value)` for every non-null row.
#[inline]
fn each_value<T: ArrowPrimitiveType>(ids: &[u32], array: &PrimitiveArray<T>, mut f: impl FnMut(usize, T::Native)) {
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

/// Calls `f(group)` for every row `nulls` does not mark null.
#[inline]
fn each_valid(ids: &[u32], nulls: Option<&NullBuffer>, mut f: impl FnMut(usize)) {
    match nulls.filter(|n| n.null_count() > 0) {
        None => ids.iter().for_each(|&g| f(g as usize)),
        Some(nulls) => {
            for (i, &g) in ids.iter().enumerate() {
                if nulls.is_valid(i) {
                    f(g as usize);
                }
            }
        }
    }
}

/// The first `groups` values, padded with `fill` for groups no update reached.
fn padded<T: Copy + datafusion::arrow::datatypes::ArrowNativeType>(
    values: &[T],
    groups: usize,
    fill: T,
) -> datafusion::arrow::buffer::ScalarBuffer<T> {
    let mut out = values[..values.len().min(groups)].to_vec();
    out.resize(groups, fill);
    out.into()
}

/// Validity from `seen` for the first `groups` groups (unseen ones null); `None` if all seen.
fn seen_nulls(seen: &[bool], groups: usize) -> Option<NullBuffer> {
    let valid = (0..groups).map(|g| seen.get(g).copied().unwrap_or(false));
    let nulls = NullBuffer::from_iter(valid);
    (nulls.null_count() > 0).then_some(nulls)
}
