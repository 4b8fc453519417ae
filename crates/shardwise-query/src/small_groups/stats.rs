//! The statistical aggregates [`super::SmallGroupsExec`] computes: `corr`, the variances and
//! standard deviations, and `median` (db-benchmark's q9 and q6). Each keeps exactly the state
//! DataFusion's own groups accumulator keeps, updated row by row in the same order, so the final
//! aggregation merges and evaluates them unchanged. Unlike the aggregates of [`super::accum`],
//! they count their own rows (those where their arguments are set): their states have no nulls.
//!
//! | aggregate | state (DataFusion's) |
//! | --- | --- |
//! | `corr(x, y)` | `UInt64` count, sums of x, y, xy, xx, yy (`Float64`) |
//! | `var`, `var_pop`, `stddev`, `stddev_pop` | `UInt64` count, `Float64` mean and m2 (Welford's update) |
//! | `median` | the group's values, `List(Float64)` (an empty list without values) |

use std::borrow::Cow;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float64Array, ListArray, UInt64Array};
use datafusion::arrow::buffer::{NullBuffer, OffsetBuffer};
use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Int32Type, Int64Type};
use datafusion::error::{DataFusionError, Result};

use super::accum::padded;

/// `corr(x, y)`: over the rows where both are set, their count and the sums of x, y, x*y, x*x
/// and y*y, as DataFusion's `CorrelationGroupsAccumulator` keeps them.
#[derive(Debug, Default)]
pub struct Corr {
    counts: Vec<u64>,
    sums: [Vec<f64>; 5],
}

impl Corr {
    pub fn state_types() -> Vec<DataType> {
        let mut types = vec![DataType::UInt64];
        types.extend(std::iter::repeat_n(DataType::Float64, 5));
        types
    }

    pub fn update(&mut self, ids: &[u32], groups: usize, x: &ArrayRef, y: &ArrayRef) -> Result<()> {
        self.counts.resize(groups, 0);
        self.sums.iter_mut().for_each(|s| s.resize(groups, 0.0));
        let (xs, ys) = (floats(x)?, floats(y)?);
        let both = NullBuffer::union(x.logical_nulls().as_ref(), y.logical_nulls().as_ref());
        let [sx, sy, sxy, sxx, syy] = &mut self.sums;
        for (i, &g) in ids.iter().enumerate() {
            if both.as_ref().is_some_and(|n| n.is_null(i)) {
                continue;
            }
            let (g, x, y) = (g as usize, xs[i], ys[i]);
            self.counts[g] += 1;
            sx[g] += x;
            sy[g] += y;
            sxy[g] += x * y;
            sxx[g] += x * x;
            syy[g] += y * y;
        }
        Ok(())
    }

    pub fn emit(&self, groups: usize) -> Vec<ArrayRef> {
        let mut states: Vec<ArrayRef> = vec![Arc::new(UInt64Array::new(padded(&self.counts, groups, 0), None))];
        states.extend(self.sums.iter().map(|s| Arc::new(Float64Array::new(padded(s, groups, 0.0), None)) as ArrayRef));
        states
    }

    pub fn size(&self) -> usize {
        (self.counts.capacity() + self.sums.iter().map(Vec::capacity).sum::<usize>()) * 8
    }
}

/// `var`, `var_pop`, `stddev`, `stddev_pop`: count, mean and m2 by Welford's update, as
/// DataFusion's `VarianceGroupsAccumulator` (the four differ only in their final step).
#[derive(Debug, Default)]
pub struct Variance {
    counts: Vec<u64>,
    means: Vec<f64>,
    m2s: Vec<f64>,
}

impl Variance {
    pub fn state_types() -> Vec<DataType> {
        vec![DataType::UInt64, DataType::Float64, DataType::Float64]
    }

    pub fn update(&mut self, ids: &[u32], groups: usize, x: &ArrayRef) -> Result<()> {
        self.counts.resize(groups, 0);
        self.means.resize(groups, 0.0);
        self.m2s.resize(groups, 0.0);
        let values = floats(x)?;
        let nulls = x.logical_nulls().filter(|n| n.null_count() > 0);
        for (i, &g) in ids.iter().enumerate() {
            if nulls.as_ref().is_some_and(|n| n.is_null(i)) {
                continue;
            }
            let (g, value) = (g as usize, values[i]);
            // DataFusion's `variance::update`, term for term.
            let count = self.counts[g] + 1;
            let delta1 = value - self.means[g];
            let mean = delta1 / count as f64 + self.means[g];
            let delta2 = value - mean;
            self.counts[g] = count;
            self.means[g] = mean;
            self.m2s[g] += delta1 * delta2;
        }
        Ok(())
    }

    pub fn emit(&self, groups: usize) -> Vec<ArrayRef> {
        vec![
            Arc::new(UInt64Array::new(padded(&self.counts, groups, 0), None)),
            Arc::new(Float64Array::new(padded(&self.means, groups, 0.0), None)),
            Arc::new(Float64Array::new(padded(&self.m2s, groups, 0.0), None)),
        ]
    }

    pub fn size(&self) -> usize {
        (self.counts.capacity() + self.means.capacity() + self.m2s.capacity()) * 8
    }
}

/// `median` of `Float64`: every value of each group, as DataFusion's `MedianGroupsAccumulator`.
#[derive(Debug, Default)]
pub struct Median {
    values: Vec<Vec<f64>>,
    /// The capacities of `values`' vectors, in values (kept as they grow: summing them per batch
    /// would walk every group).
    held_values: usize,
}

impl Median {
    pub fn state_types() -> Vec<DataType> {
        vec![DataType::List(Arc::new(Field::new_list_field(DataType::Float64, true)))]
    }

    pub fn update(&mut self, ids: &[u32], groups: usize, x: &ArrayRef) -> Result<()> {
        self.values.resize_with(groups, Vec::new);
        let values = floats(x)?;
        let nulls = x.logical_nulls().filter(|n| n.null_count() > 0);
        for (i, &g) in ids.iter().enumerate() {
            if nulls.as_ref().is_some_and(|n| n.is_null(i)) {
                continue;
            }
            let group = &mut self.values[g as usize];
            let before = group.capacity();
            group.push(values[i]);
            self.held_values += group.capacity() - before;
        }
        Ok(())
    }

    pub fn emit(&self, groups: usize) -> Result<Vec<ArrayRef>> {
        let kept = &self.values[..self.values.len().min(groups)];
        let lengths = kept.iter().map(Vec::len).chain(std::iter::repeat_n(0, groups - kept.len()));
        let offsets = OffsetBuffer::<i32>::from_lengths(lengths);
        let flat: Vec<f64> = kept.iter().flatten().copied().collect();
        let field = Arc::new(Field::new_list_field(DataType::Float64, true));
        let list = ListArray::try_new(field, offsets, Arc::new(Float64Array::from(flat)), None)?;
        Ok(vec![Arc::new(list)])
    }

    pub fn size(&self) -> usize {
        self.held_values * 8 + self.values.capacity() * size_of::<Vec<f64>>()
    }
}

/// The values of a `Float64`, `Int64` or `Int32` array as `f64` (as `CAST(.. AS DOUBLE)`
/// converts them; null rows hold whatever the array holds).
fn floats(array: &ArrayRef) -> Result<Cow<'_, [f64]>> {
    let wrong = || {
        DataFusionError::Internal(format!(
            "small-group aggregation: argument of type {} where Float64 was planned",
            array.data_type()
        ))
    };
    Ok(match array.data_type() {
        DataType::Int32 => array.as_primitive::<Int32Type>().values().iter().map(|&v| f64::from(v)).collect(),
        DataType::Int64 => array.as_primitive::<Int64Type>().values().iter().map(|&v| v as f64).collect(),
        _ => Cow::Borrowed(array.as_primitive_opt::<Float64Type>().ok_or_else(wrong)?.values().as_ref()),
    })
}
