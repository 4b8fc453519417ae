//! The methods a scalar function that wraps one of DataFusion's hands on unchanged
//! ([`crate::coalesce_types`], [`crate::pad_limits`]): each wrapper changes how its arguments are
//! coerced or checked and must be the wrapped function in everything else (its name, types,
//! simplification, ordering properties), or plans that name it would change.
//! [`delegate_scalar!`] writes those methods, to `self.inner`, inside the wrapper's
//! `impl ScalarUDFImpl`, as [`crate::udaf_wrapper`] does for aggregates.

/// Inside `impl ScalarUDFImpl for W`, where `W.inner` is the wrapped function: every method but
/// `invoke_with_args` and `coerce_types` (the ones a wrapper changes, written by it) and
/// `with_updated_config` (delegated, it would hand back the wrapped function without its wrapper),
/// delegated.
macro_rules! delegate_scalar {
    () => {
        fn name(&self) -> &str {
            self.inner.name()
        }

        fn aliases(&self) -> &[String] {
            self.inner.aliases()
        }

        fn schema_name(&self, args: &[datafusion::logical_expr::Expr]) -> Result<String> {
            self.inner.inner().schema_name(args)
        }

        fn signature(&self) -> &datafusion::logical_expr::Signature {
            self.inner.signature()
        }

        fn return_type(
            &self,
            arg_types: &[datafusion::arrow::datatypes::DataType],
        ) -> Result<datafusion::arrow::datatypes::DataType> {
            self.inner.return_type(arg_types)
        }

        fn return_field_from_args(
            &self,
            args: datafusion::logical_expr::ReturnFieldArgs,
        ) -> Result<datafusion::arrow::datatypes::FieldRef> {
            self.inner.return_field_from_args(args)
        }

        fn is_strict(&self) -> bool {
            self.inner.inner().is_strict()
        }

        fn simplify(
            &self,
            args: Vec<datafusion::logical_expr::Expr>,
            info: &datafusion::logical_expr::simplify::SimplifyContext,
        ) -> Result<datafusion::logical_expr::simplify::ExprSimplifyResult> {
            self.inner.simplify(args, info)
        }

        fn short_circuits(&self) -> bool {
            self.inner.short_circuits()
        }

        fn evaluate_bounds(
            &self,
            input: &[&datafusion::logical_expr::interval_arithmetic::Interval],
        ) -> Result<datafusion::logical_expr::interval_arithmetic::Interval> {
            self.inner.evaluate_bounds(input)
        }

        fn propagate_constraints(
            &self,
            interval: &datafusion::logical_expr::interval_arithmetic::Interval,
            inputs: &[&datafusion::logical_expr::interval_arithmetic::Interval],
        ) -> Result<Option<Vec<datafusion::logical_expr::interval_arithmetic::Interval>>> {
            self.inner.propagate_constraints(interval, inputs)
        }

        fn output_ordering(
            &self,
            inputs: &[datafusion::logical_expr::sort_properties::ExprProperties],
        ) -> Result<datafusion::logical_expr::sort_properties::SortProperties> {
            self.inner.output_ordering(inputs)
        }

        fn preserves_lex_ordering(
            &self,
            inputs: &[datafusion::logical_expr::sort_properties::ExprProperties],
        ) -> Result<bool> {
            self.inner.preserves_lex_ordering(inputs)
        }

        fn strictly_order_preserving(
            &self,
            inputs: &[datafusion::logical_expr::sort_properties::ExprProperties],
        ) -> Result<bool> {
            self.inner.inner().strictly_order_preserving(inputs)
        }

        fn documentation(&self) -> Option<&datafusion::logical_expr::Documentation> {
            self.inner.documentation()
        }
    };
}

pub(crate) use delegate_scalar;

/// The bounds of a scalar function whose range shardwise does not work out: unbounded, of the
/// type of its `index`-th argument (its result's). DataFusion's default is of type Null, which
/// functions over the result (`abs`) cannot compare with their type's zero: `ORDER BY abs(a - 2)`
/// failed to plan.
pub(crate) fn unbounded_like(
    input: &[&datafusion::logical_expr::interval_arithmetic::Interval],
    index: usize,
) -> datafusion::common::Result<datafusion::logical_expr::interval_arithmetic::Interval> {
    let data_type = input.get(index).map(|i| i.data_type()).unwrap_or(datafusion::arrow::datatypes::DataType::Null);
    datafusion::logical_expr::interval_arithmetic::Interval::make_unbounded(&data_type)
}

/// A function's answer `array` as the caller gave its arguments: one value when every argument
/// was one (`scalar`), else the column.
pub(crate) fn answer_shaped(
    array: datafusion::arrow::array::ArrayRef,
    scalar: bool,
) -> datafusion::common::Result<datafusion::logical_expr::ColumnarValue> {
    use datafusion::logical_expr::ColumnarValue;
    if scalar {
        Ok(ColumnarValue::Scalar(datafusion::common::ScalarValue::try_from_array(&array, 0)?))
    } else {
        Ok(ColumnarValue::Array(array))
    }
}
