//! The methods an aggregate that wraps one of DataFusion's hands on unchanged
//! ([`crate::checked_sum`], [`crate::float_min_max`]): each wrapper replaces a few accumulators and
//! must be the wrapped function in everything else (its name, types, display, ordering
//! properties), or plans that name it would change. [`delegate_aggregate!`] writes those
//! methods, to `self.inner`, inside the wrapper's `impl AggregateUDFImpl`.

/// Inside `impl AggregateUDFImpl for W`, where `W.inner` is the wrapped aggregate: every method
/// but `accumulator`, `create_groups_accumulator`, `create_sliding_accumulator` and
/// `value_from_stats` (the ones a wrapper changes), delegated.
macro_rules! delegate_aggregate {
    () => {
        fn name(&self) -> &str {
            self.inner.name()
        }

        fn aliases(&self) -> &[String] {
            self.inner.aliases()
        }

        fn schema_name(&self, params: &datafusion::logical_expr::expr::AggregateFunctionParams) -> Result<String> {
            self.inner.schema_name(params)
        }

        fn human_display(&self, params: &datafusion::logical_expr::expr::AggregateFunctionParams) -> Result<String> {
            self.inner.human_display(params)
        }

        fn window_function_schema_name(
            &self,
            params: &datafusion::logical_expr::expr::WindowFunctionParams,
        ) -> Result<String> {
            self.inner.window_function_schema_name(params)
        }

        fn display_name(&self, params: &datafusion::logical_expr::expr::AggregateFunctionParams) -> Result<String> {
            self.inner.display_name(params)
        }

        fn window_function_display_name(
            &self,
            params: &datafusion::logical_expr::expr::WindowFunctionParams,
        ) -> Result<String> {
            self.inner.window_function_display_name(params)
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

        fn return_field(
            &self,
            arg_fields: &[datafusion::arrow::datatypes::FieldRef],
        ) -> Result<datafusion::arrow::datatypes::FieldRef> {
            self.inner.return_field(arg_fields)
        }

        fn is_nullable(&self) -> bool {
            self.inner.is_nullable()
        }

        fn state_fields(
            &self,
            args: datafusion::logical_expr::function::StateFieldsArgs,
        ) -> Result<Vec<datafusion::arrow::datatypes::FieldRef>> {
            self.inner.state_fields(args)
        }

        fn groups_accumulator_supported(&self, args: datafusion::logical_expr::function::AccumulatorArgs) -> bool {
            self.inner.groups_accumulator_supported(args)
        }

        fn order_sensitivity(&self) -> datafusion::logical_expr::utils::AggregateOrderSensitivity {
            self.inner.order_sensitivity()
        }

        fn simplify_expr_op_literal(
            &self,
            agg_function: &datafusion::logical_expr::expr::AggregateFunction,
            arg: &datafusion::logical_expr::Expr,
            op: datafusion::logical_expr::Operator,
            lit: &datafusion::logical_expr::Expr,
            arg_is_left: bool,
        ) -> Result<Option<datafusion::logical_expr::Expr>> {
            self.inner.simplify_expr_op_literal(agg_function, arg, op, lit, arg_is_left)
        }

        fn reverse_expr(&self) -> datafusion::logical_expr::ReversedUDAF {
            self.inner.reverse_expr()
        }

        fn coerce_types(
            &self,
            arg_types: &[datafusion::arrow::datatypes::DataType],
        ) -> Result<Vec<datafusion::arrow::datatypes::DataType>> {
            self.inner.coerce_types(arg_types)
        }

        fn is_descending(&self) -> Option<bool> {
            self.inner.is_descending()
        }

        fn default_value(
            &self,
            data_type: &datafusion::arrow::datatypes::DataType,
        ) -> Result<datafusion::common::ScalarValue> {
            self.inner.default_value(data_type)
        }

        fn supports_null_handling_clause(&self) -> bool {
            self.inner.supports_null_handling_clause()
        }

        fn supports_within_group_clause(&self) -> bool {
            self.inner.supports_within_group_clause()
        }

        fn documentation(&self) -> Option<&datafusion::logical_expr::Documentation> {
            self.inner.documentation()
        }

        fn set_monotonicity(
            &self,
            data_type: &datafusion::arrow::datatypes::DataType,
        ) -> datafusion::logical_expr::SetMonotonicity {
            self.inner.set_monotonicity(data_type)
        }
    };
}

pub(crate) use delegate_aggregate;
