//! `min` and `max` of floats, by group or not, with PostgreSQL's order: every NaN above every
//! number, and infinities as values.
//!
//! Why: DataFusion's groups accumulator for `min`/`max` of floats (the one every GROUP BY uses)
//! took any value compared with NaN as the new extreme, so `min` of 1, NaN, 3 in a group was 3
//! and `max` of NaN, -1 was -1; and it starts from the largest finite value, so the `max` of a
//! group holding only `-Infinity` was -1.7976931348623157e308. Its accumulator without groups
//! orders floats by their bits' total order, which puts a NaN with the sign bit set (what x86
//! arithmetic makes of `'Infinity' - 'Infinity'`) below every number: `min` of 1 and such a NaN
//! was NaN.
//!
//! How: [`NanOrdered`] wraps DataFusion's `Min` and `Max` (registered under their names) and is
//! them in everything but the accumulators of `Float32` and `Float64`: with groups, DataFusion's
//! own primitive groups accumulator with a fold that orders NaN (of either sign) above every
//! number and starts from the bottom of that order (`max`: -Infinity; `min`: NaN); without,
//! [`FloatExtreme`], the same fold over one value. (Window frames keep DataFusion's sliding
//! accumulator.)

use std::hash::Hash;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, AsArray};
use datafusion::arrow::datatypes::{ArrowPrimitiveType, DataType, Float32Type, Float64Type};
use datafusion::common::{Result, ScalarValue};
use datafusion::functions_aggregate::min_max::{Max, Min};
use datafusion::logical_expr::function::AccumulatorArgs;
use datafusion::logical_expr::{Accumulator, AggregateUDF, AggregateUDFImpl, GroupsAccumulator, StatisticsArgs};
use datafusion_functions_aggregate_common::aggregate::groups_accumulator::prim_op::PrimitiveGroupsAccumulator;

/// DataFusion's `Min` or `Max` with NaN-ordered float groups. See the module doc.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct NanOrdered<T> {
    inner: T,
    max: bool,
}

/// `min` and `max`, to register with a session in place of DataFusion's.
pub fn min_max_udafs() -> [Arc<AggregateUDF>; 2] {
    [
        Arc::new(AggregateUDF::new_from_impl(NanOrdered { inner: Min::new(), max: false })),
        Arc::new(AggregateUDF::new_from_impl(NanOrdered { inner: Max::new(), max: true })),
    ]
}

/// `a < b` with every NaN above every number (and equal to every other NaN).
fn below<F: num_like::Float>(a: F, b: F) -> bool {
    match (a.is_nan(), b.is_nan()) {
        (true, _) => false,
        (false, true) => true,
        (false, false) => a < b,
    }
}

/// The two float types' common operations, without a crate for them.
mod num_like {
    pub trait Float: Copy + PartialOrd + Send + Sync + 'static {
        const NEG_INFINITY: Self;
        const NAN: Self;
        fn is_nan(self) -> bool;
    }
    impl Float for f32 {
        const NEG_INFINITY: Self = f32::NEG_INFINITY;
        const NAN: Self = f32::NAN;
        fn is_nan(self) -> bool {
            f32::is_nan(self)
        }
    }
    impl Float for f64 {
        const NEG_INFINITY: Self = f64::NEG_INFINITY;
        const NAN: Self = f64::NAN;
        fn is_nan(self) -> bool {
            f64::is_nan(self)
        }
    }
}

/// The groups accumulator of `min` (`max`: true) over floats of type `T`.
fn float_groups<T>(data_type: &DataType, max: bool) -> Box<dyn GroupsAccumulator>
where
    T: ArrowPrimitiveType + Send,
    T::Native: num_like::Float,
{
    use num_like::Float;
    if max {
        let fold = |current: &mut T::Native, new: T::Native| {
            if below(*current, new) {
                *current = new
            }
        };
        Box::new(PrimitiveGroupsAccumulator::<T, _>::new(data_type, fold).with_starting_value(T::Native::NEG_INFINITY))
    } else {
        let fold = |current: &mut T::Native, new: T::Native| {
            if below(new, *current) {
                *current = new
            }
        };
        Box::new(PrimitiveGroupsAccumulator::<T, _>::new(data_type, fold).with_starting_value(T::Native::NAN))
    }
}

/// `min` (`max`: true) of floats of type `T` without groups: the extreme so far, in the order of
/// [`below`].
#[derive(Debug)]
struct FloatExtreme<T: ArrowPrimitiveType> {
    data_type: DataType,
    max: bool,
    current: Option<T::Native>,
}

impl<T> FloatExtreme<T>
where
    T: ArrowPrimitiveType + Send + Sync + std::fmt::Debug,
    T::Native: num_like::Float,
{
    fn boxed(data_type: DataType, max: bool) -> Box<dyn Accumulator> {
        Box::new(FloatExtreme::<T> { data_type, max, current: None })
    }

    fn fold(&mut self, values: &ArrayRef) {
        for v in values.as_primitive::<T>().iter().flatten() {
            let replace = match self.current {
                None => true,
                Some(current) if self.max => below(current, v),
                Some(current) => below(v, current),
            };
            if replace {
                self.current = Some(v);
            }
        }
    }
}

impl<T> Accumulator for FloatExtreme<T>
where
    T: ArrowPrimitiveType + Send + Sync + std::fmt::Debug,
    T::Native: num_like::Float,
{
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        values.iter().take(1).for_each(|v| self.fold(v));
        Ok(())
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        self.update_batch(states)
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        Ok(vec![self.evaluate()?])
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        ScalarValue::new_primitive::<T>(self.current, &self.data_type)
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self)
    }
}

impl<T: AggregateUDFImpl + PartialEq + Eq + Hash> AggregateUDFImpl for NanOrdered<T> {
    crate::udaf_wrapper::delegate_aggregate!();

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        let data_type = args.return_field.data_type().clone();
        match data_type {
            DataType::Float64 => Ok(FloatExtreme::<Float64Type>::boxed(data_type, self.max)),
            DataType::Float32 => Ok(FloatExtreme::<Float32Type>::boxed(data_type, self.max)),
            _ => self.inner.accumulator(args),
        }
    }

    fn create_groups_accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn GroupsAccumulator>> {
        let data_type = args.return_field.data_type().clone();
        match data_type {
            DataType::Float64 => Ok(float_groups::<Float64Type>(&data_type, self.max)),
            DataType::Float32 => Ok(float_groups::<Float32Type>(&data_type, self.max)),
            _ => self.inner.create_groups_accumulator(args),
        }
    }

    fn create_sliding_accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        self.inner.create_sliding_accumulator(args)
    }

    fn value_from_stats(&self, statistics_args: &StatisticsArgs) -> Option<ScalarValue> {
        self.inner.value_from_stats(statistics_args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{AsArray, RecordBatch};
    use datafusion::arrow::datatypes::Float64Type;
    use datafusion::prelude::SessionContext;

    /// `(min, max)` of each group of the `VALUES` rows, by group.
    async fn extremes(rows: &str) -> Result<Vec<(f64, f64)>> {
        let ctx = SessionContext::new();
        for udaf in min_max_udafs() {
            ctx.register_udaf(udaf.as_ref().clone());
        }
        let sql = format!("SELECT g, min(v), max(v) FROM (VALUES {rows}) t(g, v) GROUP BY g ORDER BY g");
        let batches: Vec<RecordBatch> = ctx.sql(&sql).await?.collect().await?;
        let mut out = Vec::new();
        for b in &batches {
            let (min, max) = (b.column(1).as_primitive::<Float64Type>(), b.column(2).as_primitive::<Float64Type>());
            out.extend((0..b.num_rows()).map(|i| (min.value(i), max.value(i))));
        }
        Ok(out)
    }

    #[tokio::test]
    async fn nan_is_above_every_number_and_infinities_are_values() -> Result<()> {
        let nan = "CAST('NaN' AS DOUBLE)";
        let got = extremes(&format!("(1, 1.0), (1, {nan}), (1, 3.0), (2, {nan}), (2, -1.0), (3, {nan})")).await?;
        assert_eq!((got[0].0, got[1].0), (1.0, -1.0));
        assert!(got[0].1.is_nan() && got[1].1.is_nan() && got[2].0.is_nan() && got[2].1.is_nan(), "{got:?}");
        let got = extremes("(1, CAST('-inf' AS DOUBLE)), (2, CAST('inf' AS DOUBLE))").await?;
        assert_eq!(got, [(f64::NEG_INFINITY, f64::NEG_INFINITY), (f64::INFINITY, f64::INFINITY)]);
        Ok(())
    }

    #[tokio::test]
    async fn without_groups_too_and_whatever_the_sign_of_the_nan() -> Result<()> {
        let ctx = SessionContext::new();
        for udaf in min_max_udafs() {
            ctx.register_udaf(udaf.as_ref().clone());
        }
        // x86 arithmetic makes the NaN of inf - inf with its sign bit set; -NaN too.
        let computed = "CAST('Infinity' AS DOUBLE) - CAST('Infinity' AS DOUBLE)";
        let negated = "-CAST('NaN' AS DOUBLE)";
        for (rows, min, max) in [
            (format!("(1.0), ({computed}), (3.0)"), Some(1.0), Some(f64::NAN)),
            (format!("({negated}), (-1.0)"), Some(-1.0), Some(f64::NAN)),
            (format!("({negated})"), Some(f64::NAN), Some(f64::NAN)),
            (
                "(CAST('-inf' AS DOUBLE)), (CAST(NULL AS DOUBLE))".to_string(),
                Some(f64::NEG_INFINITY),
                Some(f64::NEG_INFINITY),
            ),
            ("(CAST(NULL AS DOUBLE))".to_string(), None, None),
        ] {
            let sql = format!("SELECT min(v) AS lo, max(v) AS hi FROM (VALUES {rows}) t(v)");
            let batches: Vec<RecordBatch> = ctx.sql(&sql).await?.collect().await?;
            let (lo, hi) = (
                batches[0].column(0).as_primitive::<Float64Type>(),
                batches[0].column(1).as_primitive::<Float64Type>(),
            );
            let got = (lo.iter().next().flatten(), hi.iter().next().flatten());
            let same = |a: Option<f64>, b: Option<f64>| match (a, b) {
                (Some(a), Some(b)) => a == b || (a.is_nan() && b.is_nan()),
                (a, b) => a == b,
            };
            assert!(same(got.0, min) && same(got.1, max), "{sql}: {got:?}");
            let sql = format!("SELECT min(w) FROM (SELECT CAST(v AS REAL) AS w FROM (VALUES {rows}) t(v))");
            let batches: Vec<RecordBatch> = ctx.sql(&sql).await?.collect().await?;
            let narrow = batches[0].column(0).as_primitive::<datafusion::arrow::datatypes::Float32Type>();
            assert!(same(narrow.iter().next().flatten().map(f64::from), min), "{sql}");
        }
        Ok(())
    }
}
