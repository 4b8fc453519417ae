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
//! `-` and `*` whose operands are integers of one type with `shardwise_checked_arithmetic`, and
//! each `-x` of a signed integer with `shardwise_checked_negate`, which run Arrow's checked
//! kernels (the same loops with an overflow test). A left-nested chain (`a + b - c * d + e` is
//! `((a + b) - (c * d)) + e`) becomes one call that folds its terms left to right,
//! `shardwise_checked_arithmetic('+-+', a, b, c * d, e)`: the same order of operations, so the
//! same overflows, and an expression whose size grows with the chain's length. (One call per
//! operator nested a function call per term: a 400-term sum took seconds to plan, as DataFusion
//! names every level, and a few hundred levels passed protobuf's decoding depth in fragments.)
//! Names are kept (`a * a` is still the column's name; the function names itself as the
//! operators would). The functions travel in fragments by name, so each node checks its own
//! rows. The optimizer folds them over constants as it folds the operators; a constant that
//! overflows is left to fail when the query runs. Integer division already fails on overflow and
//! on division by zero in DataFusion; `sum` is checked in [`crate::checked_sum`].

use std::fmt::Write as _;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Datum};
use datafusion::arrow::compute::kernels::numeric;
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::error::ArrowError;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DFSchema, DataFusionError, Result, ScalarValue, exec_err};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{
    BinaryExpr, ColumnarValue, Expr, ExprSchemable, LogicalPlan, Operator, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature, Volatility,
};
use datafusion::optimizer::AnalyzerRule;
use datafusion::physical_expr_common::datum::apply;

/// The name of the left fold of `+`, `-` and `*`.
const FOLD_NAME: &str = "shardwise_checked_arithmetic";
/// The name of the checked `-x`.
const NEGATE_NAME: &str = "shardwise_checked_negate";

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
/// checking function (the walk is bottom up, so `a` may already be a fold, which takes `b` as
/// its next term); anything else as it is. An expression whose type cannot be read here (it is
/// checked later by the planner) is left as it is.
fn checked(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    match e {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            let Some(step) = Step::of(op) else {
                return Ok(Transformed::no(Expr::BinaryExpr(BinaryExpr { left, op, right })));
            };
            let same_integers = match (integer_type(&left, schema), right.get_type(schema).ok()) {
                (Some(l), Some(r)) => l == r && l.is_integer(),
                _ => false,
            };
            if !same_integers {
                return Ok(Transformed::no(Expr::BinaryExpr(BinaryExpr { left, op, right })));
            }
            // A fold on the left takes `right` as its next term.
            let args = match *left {
                Expr::ScalarFunction(f) if f.func.name() == FOLD_NAME && fold_parts(&f.args).is_some() => {
                    let mut args = f.args;
                    if let Some(Expr::Literal(ScalarValue::Utf8(Some(steps)), _)) = args.first_mut() {
                        steps.push(step.symbol());
                    }
                    args.push(*right);
                    args
                }
                other => vec![Expr::Literal(ScalarValue::Utf8(Some(step.symbol().to_string())), None), other, *right],
            };
            Ok(Transformed::yes(Expr::ScalarFunction(ScalarFunction::new_udf(fold_udf(), args))))
        }
        Expr::Negative(x) => match x.get_type(schema) {
            Ok(t) if t.is_signed_integer() => {
                Ok(Transformed::yes(Expr::ScalarFunction(ScalarFunction::new_udf(negate_udf(), vec![*x]))))
            }
            _ => Ok(Transformed::no(Expr::Negative(x))),
        },
        other => Ok(Transformed::no(other)),
    }
}

/// The type of `e`, read from a fold's first term when `e` is one (its type is its terms'; typing
/// the whole fold again at every step of a long chain would cost the chain's length each time).
fn integer_type(e: &Expr, schema: &DFSchema) -> Option<DataType> {
    match e {
        Expr::ScalarFunction(f) if f.func.name() == FOLD_NAME => match fold_parts(&f.args) {
            Some((_, terms)) => terms.first()?.get_type(schema).ok(),
            None => e.get_type(schema).ok(),
        },
        _ => e.get_type(schema).ok(),
    }
}

/// A fold's operators (its first argument, one symbol per step) and its terms, when the
/// arguments are well formed: one more term than operators.
fn fold_parts(args: &[Expr]) -> Option<(&str, &[Expr])> {
    let (Expr::Literal(ScalarValue::Utf8(Some(steps)), _), terms) = args.split_first()? else {
        return None;
    };
    (steps.chars().count() + 1 == terms.len() && steps.chars().all(|c| Step::from_symbol(c).is_some()))
        .then_some((steps.as_str(), terms))
}

/// One binary step of a fold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Add,
    Subtract,
    Multiply,
}

impl Step {
    fn of(op: Operator) -> Option<Step> {
        match op {
            Operator::Plus => Some(Step::Add),
            Operator::Minus => Some(Step::Subtract),
            Operator::Multiply => Some(Step::Multiply),
            _ => None,
        }
    }

    fn symbol(self) -> char {
        match self {
            Step::Add => '+',
            Step::Subtract => '-',
            Step::Multiply => '*',
        }
    }

    fn from_symbol(c: char) -> Option<Step> {
        match c {
            '+' => Some(Step::Add),
            '-' => Some(Step::Subtract),
            '*' => Some(Step::Multiply),
            _ => None,
        }
    }

    fn words(self) -> &'static str {
        match self {
            Step::Add => "addition",
            Step::Subtract => "subtraction",
            Step::Multiply => "multiplication",
        }
    }

    fn kernel(self) -> fn(&dyn Datum, &dyn Datum) -> std::result::Result<ArrayRef, ArrowError> {
        match self {
            Step::Add => numeric::add,
            Step::Subtract => numeric::sub,
            Step::Multiply => numeric::mul,
        }
    }
}

fn fold_udf() -> Arc<ScalarUDF> {
    Arc::new(ScalarUDF::new_from_impl(CheckedFold { signature: Signature::variadic_any(Volatility::Immutable) }))
}

fn negate_udf() -> Arc<ScalarUDF> {
    Arc::new(ScalarUDF::new_from_impl(CheckedNegate { signature: Signature::any(1, Volatility::Immutable) }))
}

/// The checking functions, to register with a session.
pub fn checked_udfs() -> Vec<Arc<ScalarUDF>> {
    vec![fold_udf(), negate_udf()]
}

/// `shardwise_checked_arithmetic(steps, t1, ..., tn)`: `((t1 s1 t2) s2 t3) ...`, each step
/// checked, `steps` a string of `+`, `-`, `*`.
#[derive(Debug, PartialEq, Eq, Hash)]
struct CheckedFold {
    signature: Signature,
}

impl ScalarUDFImpl for CheckedFold {
    fn name(&self) -> &str {
        FOLD_NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        match arg_types.get(1) {
            Some(t) => Ok(t.clone()),
            None => exec_err!("{FOLD_NAME} takes a list of operators and integer operands"),
        }
    }

    /// The name the operators would have had: `t1 + t2 - t3`.
    fn schema_name(&self, args: &[Expr]) -> Result<String> {
        let Some((steps, terms)) = fold_parts(args) else {
            let names: Vec<String> = args.iter().map(|a| a.schema_name().to_string()).collect();
            return Ok(format!("{FOLD_NAME}({})", names.join(",")));
        };
        let Some((first, rest)) = terms.split_first() else {
            return Ok(String::new());
        };
        let mut name = first.schema_name().to_string();
        for (symbol, term) in steps.chars().zip(rest) {
            let _ = write!(name, " {symbol} {}", term.schema_name());
        }
        Ok(name)
    }

    /// Unbounded, of the terms' type ([`crate::udf_wrapper::unbounded_like`]).
    fn evaluate_bounds(
        &self,
        input: &[&datafusion::logical_expr::interval_arithmetic::Interval],
    ) -> Result<datafusion::logical_expr::interval_arithmetic::Interval> {
        crate::udf_wrapper::unbounded_like(input, 1)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let data_type = args.return_field.data_type().clone();
        let Some((ColumnarValue::Scalar(ScalarValue::Utf8(Some(steps))), terms)) = args.args.split_first() else {
            return exec_err!("{FOLD_NAME}: the first argument must be the operators");
        };
        let Some((first, rest)) = terms.split_first() else {
            return exec_err!("{FOLD_NAME}: no operands");
        };
        if steps.chars().count() != rest.len() {
            return exec_err!("{FOLD_NAME}: {} operators for {} operands", steps.chars().count(), terms.len());
        }
        let mut acc = first.clone();
        for (symbol, term) in steps.chars().zip(rest) {
            let Some(step) = Step::from_symbol(symbol) else {
                return exec_err!("{FOLD_NAME}: unknown operator {symbol:?}");
            };
            acc = apply(&acc, term, step.kernel()).map_err(|e| overflow_error(e, step.words(), &data_type))?;
        }
        Ok(acc)
    }
}

/// `shardwise_checked_negate(x)`: `-x`, checked.
#[derive(Debug, PartialEq, Eq, Hash)]
struct CheckedNegate {
    signature: Signature,
}

impl ScalarUDFImpl for CheckedNegate {
    fn name(&self) -> &str {
        NEGATE_NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        match arg_types.first() {
            Some(t) => Ok(t.clone()),
            None => exec_err!("{NEGATE_NAME} takes an integer operand"),
        }
    }

    /// Unbounded, of the operand's type ([`crate::udf_wrapper::unbounded_like`]).
    fn evaluate_bounds(
        &self,
        input: &[&datafusion::logical_expr::interval_arithmetic::Interval],
    ) -> Result<datafusion::logical_expr::interval_arithmetic::Interval> {
        crate::udf_wrapper::unbounded_like(input, 0)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let data_type = args.return_field.data_type().clone();
        let result = match args.args.as_slice() {
            [ColumnarValue::Array(a)] => numeric::neg(a.as_ref()).map(ColumnarValue::Array).map_err(Into::into),
            [ColumnarValue::Scalar(s)] => numeric::neg(&s.to_array()?)
                .map_err(DataFusionError::from)
                .and_then(|a| Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(&a, 0)?))),
            _ => return exec_err!("{NEGATE_NAME}: wrong number of operands"),
        };
        result.map_err(|e| overflow_error(e, "negation", &data_type))
    }
}

/// Arrow's overflow error in shardwise's words; other errors as they are.
fn overflow_error(e: DataFusionError, words: &str, data_type: &DataType) -> DataFusionError {
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
                "integer overflow in {words}: {detail} does not fit in {data_type}; widen an operand first ({wider})"
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
    async fn a_chain_folds_left_to_right_in_one_call() -> Result<()> {
        // Left to right, as the operators: the overflow of `b + 1` comes before the `- 1`.
        let e = error("SELECT b + 1 - 1 FROM t WHERE b > 0").await;
        assert!(e.contains("integer overflow in addition"), "{e}");
        let batches = run("SELECT b - 1 + 1, a + a * 2 - a, a - (a - 1) FROM t WHERE b > 0").await?;
        let batch = &batches[0];
        let schema = batch.schema();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["t.b - Int64(1) + Int64(1)", "t.a + t.a * Int64(2) - t.a", "t.a - t.a - Int64(1)"]);
        assert_eq!(batch.column(0).as_any().downcast_ref::<Int64Array>().map(|a| a.value(0)), Some(i64::MAX));
        assert_eq!(batch.column(1).as_any().downcast_ref::<Int64Array>().map(|a| a.value(0)), Some(200_000));
        assert_eq!(batch.column(2).as_any().downcast_ref::<Int64Array>().map(|a| a.value(0)), Some(1));
        // A function over a fold orders (`abs` reads the fold's range in its type).
        let batches = run("SELECT a FROM t ORDER BY abs(a - 2) LIMIT 1").await?;
        assert_eq!(batches[0].column(0).as_any().downcast_ref::<Int32Array>().map(|a| a.value(0)), Some(-3));

        // One call for the whole chain (its terms' products nested once), not one per operator.
        let ctx = SessionContext::new();
        ctx.add_analyzer_rule(Arc::new(CheckedIntegerArithmetic));
        let analyzed = ctx.state().analyzer().execute_and_check(
            ctx.state().create_logical_plan("SELECT 1 + 2 * 3 - 4 + 5").await?,
            ctx.state().config_options(),
            |_, _| {},
        )?;
        let text = analyzed.display_indent().to_string();
        assert_eq!(text.matches(FOLD_NAME).count(), 2, "{text}");
        assert!(text.contains(r#"Utf8("+-+")"#) && text.contains(r#"Utf8("*")"#), "{text}");
        Ok(())
    }

    #[test]
    fn long_chains_plan_in_linear_time() -> Result<()> {
        // 999 terms (the engine refuses deeper chains, `max_ast_depth`): one call per operator
        // took minutes to plan (each level's name formats the levels below it), one fold takes
        // well under a second. A 32 MiB stack, as the engine's planning threads have.
        let handle = std::thread::Builder::new().stack_size(32 << 20).spawn(|| {
            let runtime = tokio::runtime::Builder::new_current_thread().build()?;
            runtime.block_on(async {
                let terms = vec!["a"; 999].join(" + ");
                let started = std::time::Instant::now();
                let batches = run(&format!("SELECT {terms} FROM t WHERE a = -3")).await?;
                let value = batches[0].column(0).as_any().downcast_ref::<Int32Array>().map(|a| a.value(0));
                Ok::<_, DataFusionError>((value, started.elapsed()))
            })
        });
        let (value, elapsed) = match handle.map_err(DataFusionError::from)?.join() {
            Ok(result) => result?,
            Err(_) => panic!("the planning thread panicked"),
        };
        assert_eq!(value, Some(-2997));
        assert!(elapsed < std::time::Duration::from_secs(30), "{elapsed:?}");
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
