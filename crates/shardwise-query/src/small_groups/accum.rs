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
//! | `corr`, `var`, `stddev`, `median` and kin | `Float64` | see [`super::stats`] |
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

/// One aggregate's states, by group id. The caller counts each group's rows once for all
/// aggregates ([`count_rows`]), so an aggregate counts only the rows where its argument is null:
/// without nulls, an update is one pass that only adds (or compares), and a group's count and
/// whether it has a value are `rows - nulls`.
#[derive(Debug)]
pub enum Accum {
    Count {
        nulls: Vec<u64>,
    },
    SumInt {
        sums: Vec<i64>,
        nulls: Vec<u64>,
    },
    SumFloat {
        sums: Vec<f64>,
        nulls: Vec<u64>,
    },
    Avg {
        sums: Vec<f64>,
        nulls: Vec<u64>,
    },
    /// Starts at `i64::MAX` (min) or `i64::MIN` (max), so an update is one `min`/`max`.
    MinMax {
        values: Vec<i64>,
        nulls: Vec<u64>,
        max: bool,
        width: IntWidth,
    },
    Corr(stats::Corr),
    Variance(stats::Variance),
    Median(stats::Median),
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
            AccumKind::SumInt => Accum::SumInt { sums: Vec::new(), nulls },
            AccumKind::SumFloat => Accum::SumFloat { sums: Vec::new(), nulls },
            AccumKind::Avg => Accum::Avg { sums: Vec::new(), nulls },
            AccumKind::Min(width) => Accum::MinMax { values: Vec::new(), nulls, max: false, width },
            AccumKind::Max(width) => Accum::MinMax { values: Vec::new(), nulls, max: true, width },
            AccumKind::Corr => Accum::Corr(Default::default()),
            AccumKind::Variance => Accum::Variance(Default::default()),
            AccumKind::Median => Accum::Median(Default::default()),
        }
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
        let nulls = match self {
            Accum::Count { nulls } => nulls,
            Accum::SumInt { sums, nulls } => {
                sums.resize(groups, 0);
                let mut add = |g: usize, v: i64| sums[g] = sums[g].wrapping_add(v);
                match array.data_type() {
                    DataType::Int32 => each_value(ids, primitive::<Int32Type>(&array)?, |g, v| add(g, v.into())),
                    _ => each_value(ids, primitive::<Int64Type>(&array)?, add),
                }
                nulls
            }
            Accum::SumFloat { sums, nulls } | Accum::Avg { sums, nulls } => {
                sums.resize(groups, 0.0);
                each_float(ids, &array, |g, v| sums[g] += v)?;
                nulls
            }
            Accum::MinMax { values, nulls, max, width } => {
                let max = *max;
                values.resize(groups, if max { i64::MIN } else { i64::MAX });
                let mut take = |g: usize, v: i64| values[g] = if max { values[g].max(v) } else { values[g].min(v) };
                match width {
                    IntWidth::I32 => each_value(ids, primitive::<Int32Type>(&array)?, |g, v| take(g, v.into())),
                    IntWidth::I64 => each_value(ids, primitive::<Int64Type>(&array)?, take),
                }
                nulls
            }
            Accum::Corr(_) | Accum::Variance(_) | Accum::Median(_) => {
                return Err(DataFusionError::Internal("statistics were updated above".into()));
            }
        };
        nulls.resize(groups, 0);
        if let Some(null_rows) = array.logical_nulls().filter(|n| n.null_count() > 0) {
            for (i, &g) in ids.iter().enumerate() {
                if null_rows.is_null(i) {
                    nulls[g as usize] += 1;
                }
            }
        }
        Ok(())
    }

    /// The state arrays of the first `groups` groups, whose row counts are `rows` (groups past
    /// the last update have no values).
    pub fn emit(&self, groups: usize, rows: &[u64]) -> Result<Vec<ArrayRef>> {
        let nulls: &[u64] = match self {
            Accum::Count { nulls }
            | Accum::SumInt { nulls, .. }
            | Accum::SumFloat { nulls, .. }
            | Accum::Avg { nulls, .. }
            | Accum::MinMax { nulls, .. } => nulls,
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
            Accum::SumInt { sums, .. } => vec![Arc::new(Int64Array::new(padded(sums, groups, 0), valid))],
            Accum::SumFloat { sums, .. } => vec![Arc::new(Float64Array::new(padded(sums, groups, 0.0), valid))],
            Accum::Avg { sums, .. } => vec![
                Arc::new(UInt64Array::new(counts.into(), valid.clone())),
                Arc::new(Float64Array::new(padded(sums, groups, 0.0), valid)),
            ],
            Accum::MinMax { values, width, .. } => {
                // A group without a value still holds its start value: 0 under the null instead.
                let values: Vec<i64> =
                    (0..groups).map(|g| if counts[g] > 0 { values.get(g).copied().unwrap_or(0) } else { 0 }).collect();
                // Every value left came from `width`'s type, so the cast back is exact.
                vec![cast(&Int64Array::new(values.into(), valid), &width.data_type())?]
            }
            Accum::Corr(_) | Accum::Variance(_) | Accum::Median(_) => {
                return Err(DataFusionError::Internal("statistics were emitted above".into()));
            }
        })
    }

    /// Bytes held.
    pub fn size(&self) -> usize {
        match self {
            Accum::Count { nulls } => nulls.capacity() * 8,
            Accum::SumInt { sums, nulls } => (sums.capacity() + nulls.capacity()) * 8,
            Accum::SumFloat { sums, nulls } | Accum::Avg { sums, nulls } => (sums.capacity() + nulls.capacity()) * 8,
            Accum::MinMax { values, nulls, .. } => (values.capacity() + nulls.capacity()) * 8,
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
