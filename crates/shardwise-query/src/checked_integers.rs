//! Integer arithmetic that does not fit its type is an error, not a wrapped-around number.
//!
//! Why: DataFusion adds, subtracts, multiplies and negates integers with Arrow's wrapping
//! kernels, so `SELECT a * a` of an `INT` column holding 100000 answered `1410065408`, and
//! `9223372036854775807 + 1` a large negative number: a wrong answer that looks right.
//! PostgreSQL (`integer out of range`) and DuckDB (`Overflow in multiplication`) refuse such a
//! result; shardwise does too. The error names the operation and the type, and says how to get
//! the result: widen an operand first (`CAST(a AS BIGINT) * a`, or `DECIMAL(38, 0)`).
//!
//! How: [`CheckedIntegerArithmetic`], an analyzer rule after type coercion, replaces each `+`,
//! `-` and `*` whose operands are integers of one type, and each `-x` of a signed integer, with
//! `shardwise_checked_add` / `_subtract` / `_multiply` / `_negate`, which run Arrow's checked
//! kernels (the same loops with an overflow test). Names are kept (`a * a` is still the column's
//! name). The functions travel in fragments by name, so each node checks its own rows. The
//! optimizer folds them over constants as it folds the operators; a constant that overflows is
//! left to fail when the query runs. Integer division already fails on overflow and on division
//! by zero in DataFusion; `sum` is checked in [`crate::checked_sum`].

use std::sync::Arc;

use datafusion::arrow::compute::kernels::numeric;
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::error::ArrowError;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DFSchema, DataFusionError, Result, exec_err};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{
    BinaryExpr, ColumnarValue, Expr, ExprSchemable, LogicalPlan, Operator, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature, Volatility,
};
use datafusion::optimizer::AnalyzerRule;
use datafusion::physical_expr_common::datum::apply;

/// The analyzer rule. See the module doc.
#[derive(Debug, Default)]
pub struct CheckedIntegerArithmetic;

impl AnalyzerRule for CheckedIntegerArithmetic {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        crate::expression_rules::rewrite_expressions(plan, checked)
    }

    fn name(&self) -> &str {
        "shardwise_checked_integer_arithmetic"
    }
}

/// `a + b`, `a - b`, `a * b` of integers of one type, and `-a` of a signed integer, as the
/// checking function; anything else as it is. An expression whose type cannot be read here
/// (it is checked later by the planner) is left as it is.
fn checked(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    let op = match &e {
        Expr::BinaryExpr(BinaryExpr { op: Operator::Plus, .. }) => CheckedOp::Add,
        Expr::BinaryExpr(BinaryExpr { op: Operator::Minus, .. }) => CheckedOp::Subtract,
        Expr::BinaryExpr(BinaryExpr { op: Operator::Multiply, .. }) => CheckedOp::Multiply,
        Expr::Negative(_) => CheckedOp::Negate,
        _ => return Ok(Transformed::no(e)),
    };
    let type_of = |x: &Expr| x.get_type(schema).ok();
    let args = match e {
        Expr::BinaryExpr(BinaryExpr { left, right, .. }) => match (type_of(&left), type_of(&right)) {
            (Some(l), Some(r)) if l == r && l.is_integer() => vec![*left, *right],
            _ => return Ok(Transformed::no(Expr::BinaryExpr(BinaryExpr { left, op: op.operator(), right }))),
        },
        Expr::Negative(x) => match type_of(&x) {
            Some(t) if t.is_signed_integer() => vec![*x],
            _ => return Ok(Transformed::no(Expr::Negative(x))),
        },
        other => return Ok(Transformed::no(other)),
    };
    Ok(Transformed::yes(Expr::ScalarFunction(ScalarFunction::new_udf(op.udf(), args))))
}

/// One checked operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CheckedOp {
    Add,
    Subtract,
    Multiply,
    Negate,
}

impl CheckedOp {
    pub const ALL: [CheckedOp; 4] = [CheckedOp::Add, CheckedOp::Subtract, CheckedOp::Multiply, CheckedOp::Negate];

    /// The function's SQL name (fragments that carry it are decoded by this name).
    pub fn function_name(self) -> &'static str {
        match self {
            CheckedOp::Add => "shardwise_checked_add",
            CheckedOp::Subtract => "shardwise_checked_subtract",
            CheckedOp::Multiply => "shardwise_checked_multiply",
            CheckedOp::Negate => "shardwise_checked_negate",
        }
    }

    fn operator(self) -> Operator {
        match self {
            CheckedOp::Add => Operator::Plus,
            CheckedOp::Subtract | CheckedOp::Negate => Operator::Minus,
            CheckedOp::Multiply => Operator::Multiply,
        }
    }

    fn words(self) -> &'static str {
        match self {
            CheckedOp::Add => "addition",
            CheckedOp::Subtract => "subtraction",
            CheckedOp::Multiply => "multiplication",
            CheckedOp::Negate => "negation",
        }
    }

    /// The checking function for this operation.
    pub fn udf(self) -> Arc<ScalarUDF> {
        let arity = if self == CheckedOp::Negate { 1 } else { 2 };
        Arc::new(ScalarUDF::new_from_impl(CheckedArithmetic {
            op: self,
            signature: Signature::any(arity, Volatility::Immutable),
        }))
    }
}

/// The checking functions, to register with a session.
pub fn checked_udfs() -> Vec<Arc<ScalarUDF>> {
    CheckedOp::ALL.iter().map(|op| op.udf()).collect()
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct CheckedArithmetic {
    op: CheckedOp,
    signature: Signature,
}

impl ScalarUDFImpl for CheckedArithmetic {
    fn name(&self) -> &str {
        self.op.function_name()
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        match arg_types.first() {
            Some(t) => Ok(t.clone()),
            None => exec_err!("{} takes integer operands", self.op.function_name()),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let data_type = args.return_field.data_type().clone();
        let result = match (self.op, args.args.as_slice()) {
            (CheckedOp::Add, [l, r]) => apply(l, r, numeric::add),
            (CheckedOp::Subtract, [l, r]) => apply(l, r, numeric::sub),
            (CheckedOp::Multiply, [l, r]) => apply(l, r, numeric::mul),
            (CheckedOp::Negate, [x]) => match x {
                ColumnarValue::Array(a) => numeric::neg(a.as_ref()).map(ColumnarValue::Array).map_err(Into::into),
                ColumnarValue::Scalar(s) => numeric::neg(&s.to_array()?)
                    .map_err(DataFusionError::from)
                    .and_then(|a| Ok(ColumnarValue::Scalar(datafusion::common::ScalarValue::try_from_array(&a, 0)?))),
            },
            _ => return exec_err!("{}: wrong number of operands", self.op.function_name()),
        };
        result.map_err(|e| overflow_error(e, self.op, &data_type))
    }
}

/// Arrow's overflow error in shardwise's words; other errors as they are.
fn overflow_error(e: DataFusionError, op: CheckedOp, data_type: &DataType) -> DataFusionError {
    let arrow = match e.find_root() {
        DataFusionError::ArrowError(a, _) => a.as_ref(),
        _ => return e,
    };
    match arrow {
        ArrowError::ArithmeticOverflow(detail) => {
            let detail = detail.strip_prefix("Overflow happened on: ").unwrap_or(detail);
            let wider = match data_type {
                DataType::Int64 | DataType::UInt64 => "CAST(x AS DECIMAL(38, 0))",
                _ => "CAST(x AS BIGINT), or DECIMAL(38, 0)",
            };
            DataFusionError::Execution(format!(
                "integer overflow in {}: {detail} does not fit in {data_type}; widen an operand first ({wider})",
                op.words()
            ))
        }
        _ => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int32Array, Int64Array, RecordBatch};
    use datafusion::arrow::datatypes::{Field, Schema};
    use datafusion::prelude::SessionContext;

    async fn run(sql: &str) -> Result<Vec<RecordBatch>> {
        let ctx = SessionContext::new();
        ctx.add_analyzer_rule(Arc::new(CheckedIntegerArithmetic));
        for udf in checked_udfs() {
            ctx.register_udf(udf.as_ref().clone());
        }
        let schema =
            Arc::new(Schema::new(vec![Field::new("a", DataType::Int32, true), Field::new("b", DataType::Int64, true)]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int32Array::from(vec![Some(100_000), Some(-3), None])),
                Arc::new(Int64Array::from(vec![Some(i64::MAX), Some(i64::MIN), Some(7)])),
            ],
        )?;
        ctx.register_batch("t", batch)?;
        ctx.sql(sql).await?.collect().await
    }

    async fn error(sql: &str) -> String {
        match run(sql).await {
            Ok(batches) => panic!("{sql} answered {batches:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[tokio::test]
    async fn overflowing_integer_results_are_errors() {
        let e = error("SELECT a * a FROM t").await;
        assert!(e.contains("integer overflow in multiplication: 100000 * 100000 does not fit in Int32"), "{e}");
        assert!(e.contains("CAST(x AS BIGINT)"), "{e}");
        let e = error("SELECT b + 1 FROM t").await;
        assert!(e.contains("integer overflow in addition") && e.contains("Int64"), "{e}");
        assert!(e.contains("(CAST(x AS DECIMAL(38, 0)))") && !e.contains("BIGINT"), "{e}");
        let e = error("SELECT b - 1 FROM t").await;
        assert!(e.contains("integer overflow in subtraction"), "{e}");
        let e = error("SELECT -b FROM t WHERE b < 0").await;
        assert!(e.contains("integer overflow in negation"), "{e}");
        // In a filter too, and in an aggregate's argument.
        let e = error("SELECT count(*) FROM t WHERE a * a > 0").await;
        assert!(e.contains("integer overflow in multiplication"), "{e}");
        let e = error("SELECT sum(b + b) FROM t").await;
        assert!(e.contains("integer overflow in addition"), "{e}");
    }

    #[tokio::test]
    async fn results_that_fit_are_unchanged_and_keep_their_names() -> Result<()> {
        let batches = run("SELECT a * 2, -a, b + 7, CAST(a AS BIGINT) * a FROM t WHERE a < 0").await?;
        let batch = &batches[0];
        let schema = batch.schema();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["t.a * Int64(2)", "(- t.a)", "t.b + Int64(7)", "t.a * t.a"]);
        let col = |i: usize| batch.column(i).as_any().downcast_ref::<Int64Array>().map(|a| a.value(0));
        assert_eq!(col(0), Some(-6));
        assert_eq!(batch.column(1).as_any().downcast_ref::<Int32Array>().map(|a| a.value(0)), Some(3));
        assert_eq!(col(2), Some(i64::MIN + 7));
        assert_eq!(col(3), Some(9));
        // Nulls stay null; constants fold.
        let batches = run("SELECT a + 1, 2 * 3 FROM t WHERE a IS NULL").await?;
        assert!(batches[0].column(0).is_null(0));
        assert_eq!(batches[0].column(1).as_any().downcast_ref::<Int64Array>().map(|a| a.value(0)), Some(6));
        Ok(())
    }

    #[tokio::test]
    async fn other_arithmetic_is_left_to_datafusion() -> Result<()> {
        // Floats, dates and mixed types are not integer arithmetic of one type.
        let batches =
            run("SELECT CAST(a AS DOUBLE) * a, DATE '2024-01-01' + INTERVAL '1 day' FROM t WHERE a = 100000").await?;
        assert_eq!(batches[0].num_rows(), 1);
        let e = error("SELECT b / 0 FROM t").await;
        assert!(e.contains("Divide by zero"), "{e}");
        Ok(())
    }
}
