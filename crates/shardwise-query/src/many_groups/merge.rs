//! The final step of the aggregates [`super::ManyGroupsExec`] computes: partial states merged
//! into plain vectors by group id, then evaluated, exactly as DataFusion's accumulators do.
//!
//! | aggregate | argument | partial state | merge | final |
//! | --- | --- | --- | --- | --- |
//! | `count` | any | `Int64` | wrapping sum | `Int64`, never null |
//! | `sum` | `Int64` | `Int64` | exact sum of the non-null ([`WideTotals`]) | `Int64` (an error past its range), null without values |
//! | `sum` | `Float64` | `Float64` | sum of the non-null | `Float64`, null without values |
//! | `avg` | `Float64` | `UInt64` count, `Float64` sum | sums of the non-null | `sum / count`, null without values |
//! | `min`, `max` | `Int32`, `Int64` | the argument's type | of the non-null | the argument's type, null without values |
//!
//! A group's states come in any order, as they do to DataFusion's final step (so a float sum may
//! differ from another run's in its last bits, as DataFusion's does). Anything else keeps
//! DataFusion's final aggregation ([`MergeKind::of`] says no). When the operator hands over, it
//! emits its merged states ([`Merge::states`]), which DataFusion's final step merges like any
//! other partial state.

use std::sync::Arc;

use crate::checked_sum::WideTotals;

use datafusion::arrow::array::{ArrayRef, Float64Array, Int64Array, UInt64Array};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Float64Type, Int32Type, Int64Type, UInt64Type};
use datafusion::error::{DataFusionError, Result};
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;

use crate::small_groups::accum::{each_value, primitive};

/// What one aggregate's final step computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeKind {
    Count,
    SumInt,
    SumFloat,
    Avg,
    /// `min` (`true`: `max`) of integers of this type (`Int32` or `Int64`).
    Extreme {
        max: bool,
        wide: bool,
    },
}

impl MergeKind {
    /// The kind `expr` is, if this module merges and evaluates it exactly as DataFusion does.
    pub fn of(expr: &AggregateFunctionExpr) -> Option<MergeKind> {
        if expr.is_distinct() || !expr.order_bys().is_empty() {
            return None;
        }
        let state: Vec<DataType> = expr.state_fields().ok()?.iter().map(|f| f.data_type().clone()).collect();
        let output = expr.field().data_type().clone();
        let kind = match (expr.fun().name(), state.as_slice(), &output) {
            ("count", [DataType::Int64], DataType::Int64) => MergeKind::Count,
            ("sum", [DataType::Int64], DataType::Int64) => MergeKind::SumInt,
            ("sum", [DataType::Float64], DataType::Float64) => MergeKind::SumFloat,
            ("avg", [DataType::UInt64, DataType::Float64], DataType::Float64) => MergeKind::Avg,
            (name @ ("min" | "max"), [state], output) if state == output => match state {
                DataType::Int32 => MergeKind::Extreme { max: name == "max", wide: false },
                DataType::Int64 => MergeKind::Extreme { max: name == "max", wide: true },
                _ => return None,
            },
            _ => return None,
        };
        // `count(*)` is `count(1)`: one argument, as every kind here.
        (expr.expressions().len() == 1).then_some(kind)
    }

    /// How many state columns this kind reads.
    pub fn state_columns(self) -> usize {
        match self {
            MergeKind::Avg => 2,
            _ => 1,
        }
    }
}

/// One aggregate's merged states, by group id.
#[derive(Debug)]
pub struct Merge {
    kind: MergeKind,
    /// `count`, `min`, `max`: the value; `avg`: the count (as `i64` bits).
    ints: Vec<i64>,
    /// `sum` of integers: exact totals, checked against `Int64` when they are emitted.
    totals: WideTotals<i64>,
    /// `sum` of floats and `avg`'s sum.
    floats: Vec<f64>,
    /// Whether the group has a non-null state (not kept for `count`).
    seen: Vec<bool>,
}

impl Merge {
    pub fn new(kind: MergeKind) -> Self {
        Merge { kind, ints: Vec::new(), totals: WideTotals::default(), floats: Vec::new(), seen: Vec::new() }
    }

    /// Merges the states of a batch (`states`: this aggregate's state columns) whose rows have
    /// groups `ids`; `groups` is the number of groups so far.
    pub fn update(&mut self, ids: &[u32], groups: usize, states: &[ArrayRef]) -> Result<()> {
        let state = |i: usize| {
            states.get(i).ok_or_else(|| DataFusionError::Internal("many-group aggregation: a state is missing".into()))
        };
        let first = state(0)?;
        if first.len() < ids.len() {
            return Err(DataFusionError::Internal("many-group aggregation: a state column is short".into()));
        }
        let Merge { kind, ints, totals, floats, seen } = self;
        match *kind {
            MergeKind::Count => {
                ints.resize(groups, 0);
                let counts = primitive::<Int64Type>(first)?;
                each_value(ids, counts, |g, v| ints[g] = ints[g].wrapping_add(v));
            }
            MergeKind::SumInt => {
                totals.resize(groups);
                seen.resize(groups, false);
                each_value(ids, primitive::<Int64Type>(first)?, |g, v| {
                    totals.add(g, v);
                    seen[g] = true;
                });
            }
            MergeKind::SumFloat => {
                grow(floats, seen, groups, 0.0);
                each_value(ids, primitive::<Float64Type>(first)?, |g, v| {
                    floats[g] += v;
                    seen[g] = true;
                });
            }
            MergeKind::Avg => {
                grow(ints, seen, groups, 0);
                floats.resize(groups, 0.0);
                // Count and sum of a state are null together (DataFusion's avg builds both from
                // one null mask); each is merged where it is valid, as DataFusion does.
                each_value(ids, primitive::<UInt64Type>(first)?, |g, v| {
                    ints[g] = (ints[g] as u64).wrapping_add(v) as i64;
                    seen[g] = true;
                });
                let sums = primitive::<Float64Type>(state(1)?)?;
                if sums.len() < ids.len() {
                    return Err(DataFusionError::Internal("many-group aggregation: a state column is short".into()));
                }
                each_value(ids, sums, |g, v| {
                    floats[g] += v;
                    seen[g] = true;
                });
            }
            MergeKind::Extreme { max, wide } => {
                let start = if max { i64::MIN } else { i64::MAX };
                grow(ints, seen, groups, start);
                let mut fold = |g: usize, v: i64| {
                    ints[g] = if max { ints[g].max(v) } else { ints[g].min(v) };
                    seen[g] = true;
                };
                match wide {
                    true => each_value(ids, primitive::<Int64Type>(first)?, fold),
                    false => each_value(ids, primitive::<Int32Type>(first)?, |g, v| fold(g, i64::from(v))),
                }
            }
        }
        Ok(())
    }

    /// The final values of groups `groups`.
    pub fn evaluate(&self, groups: std::ops::Range<usize>) -> Result<ArrayRef> {
        let nulls = || NullBuffer::from(&self.seen[groups.clone()]);
        Ok(match self.kind {
            MergeKind::Count => Arc::new(Int64Array::from(self.ints[groups].to_vec())),
            MergeKind::SumInt => {
                let values = self.totals.checked(groups.clone(), |g| self.seen[g])?;
                Arc::new(Int64Array::new(values.into(), Some(nulls())))
            }
            MergeKind::SumFloat => {
                Arc::new(Float64Array::new(self.floats[groups.clone()].to_vec().into(), Some(nulls())))
            }
            MergeKind::Avg => {
                let values: Vec<f64> = self.ints[groups.clone()]
                    .iter()
                    .zip(&self.floats[groups.clone()])
                    .map(|(&count, &sum)| sum / count as u64 as f64)
                    .collect();
                Arc::new(Float64Array::new(values.into(), Some(nulls())))
            }
            MergeKind::Extreme { wide, .. } => self.extremes(groups, wide)?,
        })
    }

    /// The partial states of groups `groups` (DataFusion's types and nulls), for DataFusion's
    /// final step when the operator hands over.
    pub fn states(&self, groups: std::ops::Range<usize>) -> Result<Vec<ArrayRef>> {
        let nulls = || NullBuffer::from(&self.seen[groups.clone()]);
        Ok(match self.kind {
            MergeKind::Count => vec![Arc::new(Int64Array::from(self.ints[groups].to_vec()))],
            MergeKind::SumInt | MergeKind::SumFloat | MergeKind::Extreme { .. } => vec![self.evaluate(groups)?],
            MergeKind::Avg => {
                let counts: Vec<u64> = self.ints[groups.clone()].iter().map(|&c| c as u64).collect();
                vec![
                    Arc::new(UInt64Array::new(counts.into(), Some(nulls()))),
                    Arc::new(Float64Array::new(self.floats[groups.clone()].to_vec().into(), Some(nulls()))),
                ]
            }
        })
    }

    fn extremes(&self, groups: std::ops::Range<usize>, wide: bool) -> Result<ArrayRef> {
        let nulls = NullBuffer::from(&self.seen[groups.clone()]);
        let values: ArrayRef = Arc::new(Int64Array::new(self.ints[groups].to_vec().into(), Some(nulls)));
        // Every value came from an `Int32` state: the cast back cannot fail or round.
        Ok(match wide {
            true => values,
            false => cast(&values, &DataType::Int32)?,
        })
    }
}

/// `values` and `seen` grown to `groups` entries, new ones `fill` and unseen.
fn grow<T: Copy>(values: &mut Vec<T>, seen: &mut Vec<bool>, groups: usize, fill: T) {
    values.resize(groups, fill);
    seen.resize(groups, false);
}
