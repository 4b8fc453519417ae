//! `x op ANY(array)` with SQL's NULLs: true when some element compares true; otherwise NULL
//! when `x` is NULL or the array holds a NULL (an unknown comparison), false when every
//! comparison is false (an empty array included), NULL for a NULL array.
//!
//! Why: DataFusion plans `x = ANY(arr)` as `array_has(arr, x)` and the other comparisons through
//! the array's least or greatest element, all of which skip NULL elements: `5 = ANY(ARRAY[1,
//! NULL, 3])` was false where PostgreSQL says NULL, so `NOT (5 = ANY(...))` kept rows that
//! PostgreSQL filters out.
//!
//! How: [`with_null_semantics`] rewrites the parsed `x op ANY(arr)` (not over a subquery, which
//! DataFusion plans as a join) into `shardwise_any_nulls(x op ANY(arr), x, arr)`: DataFusion's
//! answer for the true cases, and [`AnyNulls`] the rest from `x` and the array. The call is
//! named as the comparison it wraps.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{Result, exec_err};
use datafusion::logical_expr::{
    ColumnarValue, Expr as LogicalExpr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::sql::sqlparser::ast::{BinaryOperator, Expr};

/// The SQL name of the wrapping function.
const FUNCTION_NAME: &str = "shardwise_any_nulls";

/// `expr` with its `x op ANY(array)` given SQL's NULLs (see the module doc), and `x = ANY
/// (subquery)` / `x <> ALL (subquery)` as `x [NOT] IN (subquery)`, their equal; anything else as
/// it is. Called on each expression after its operands (bottom up).
pub fn with_null_semantics(expr: Expr) -> Expr {
    if let Expr::AllOp { left, compare_op: BinaryOperator::NotEq, right } = expr {
        return match *right {
            Expr::Subquery(query) => Expr::InSubquery { expr: left, subquery: query, negated: true },
            other => Expr::AllOp { left, compare_op: BinaryOperator::NotEq, right: Box::new(other) },
        };
    }
    let Expr::AnyOp { left, compare_op, right, is_some } = expr else { return expr };
    if let Expr::Subquery(query) = *right {
        // `x = ANY (SELECT ...)` is `x IN (SELECT ...)`, NULLs included; DataFusion's own plan of
        // it failed in a SELECT list ("optimize_projections failed").
        if compare_op == BinaryOperator::Eq {
            return Expr::InSubquery { expr: left, subquery: query, negated: false };
        }
        return Expr::AnyOp { left, compare_op, right: Box::new(Expr::Subquery(query)), is_some };
    }
    let (x, array) = ((*left).clone(), (*right).clone());
    let comparison = Expr::AnyOp { left, compare_op, right, is_some };
    crate::sql_ast::function_call(FUNCTION_NAME, vec![comparison, x, array])
}

/// `shardwise_any_nulls(found, x, array)`, to register with a session.
pub fn any_nulls_udf() -> Arc<ScalarUDF> {
    Arc::new(ScalarUDF::new_from_impl(AnyNulls { signature: Signature::any(3, Volatility::Immutable) }))
}

/// See the module doc.
#[derive(Debug, PartialEq, Eq, Hash)]
struct AnyNulls {
    signature: Signature,
}

impl ScalarUDFImpl for AnyNulls {
    fn name(&self) -> &str {
        FUNCTION_NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Boolean)
    }

    /// The comparison's name: the wrapper does not rename a column.
    fn schema_name(&self, args: &[LogicalExpr]) -> Result<String> {
        match args.first() {
            Some(comparison) => Ok(comparison.schema_name().to_string()),
            None => Ok(FUNCTION_NAME.to_string()),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let all_scalars = args.args.iter().all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let [found, x, array] = args.args.as_slice() else {
            return exec_err!("{FUNCTION_NAME} takes a comparison, its left side and its array");
        };
        let found = found.to_array(rows)?;
        let Some(found) = found.as_boolean_opt() else {
            return exec_err!("{FUNCTION_NAME}: the comparison is {}, not a boolean", found.data_type());
        };
        let (x, array) = (x.to_array(rows)?, array.to_array(rows)?);
        let elements = Elements::of(&array)?;
        let answer: BooleanArray = (0..rows)
            .map(|i| {
                if found.is_valid(i) && found.value(i) {
                    return Some(true);
                }
                let (length, nulls) = elements.at(i)?;
                if length == 0 {
                    Some(false)
                } else if x.is_null(i) || nulls > 0 {
                    None
                } else {
                    Some(false)
                }
            })
            .collect();
        crate::udf_wrapper::answer_shaped(Arc::new(answer) as ArrayRef, all_scalars)
    }
}

/// The array argument, read row by row.
enum Elements<'a> {
    List(&'a datafusion::arrow::array::ListArray),
    LargeList(&'a datafusion::arrow::array::LargeListArray),
    FixedSizeList(&'a datafusion::arrow::array::FixedSizeListArray),
    /// An untyped NULL.
    Null,
}

impl<'a> Elements<'a> {
    fn of(array: &'a ArrayRef) -> Result<Self> {
        Ok(match array.data_type() {
            DataType::List(_) => Elements::List(array.as_list::<i32>()),
            DataType::LargeList(_) => Elements::LargeList(array.as_list::<i64>()),
            DataType::FixedSizeList(..) => Elements::FixedSizeList(array.as_fixed_size_list()),
            DataType::Null => Elements::Null,
            other => return exec_err!("{FUNCTION_NAME}: ANY takes an array, not {other}"),
        })
    }

    /// Row `i`'s number of elements and of NULL elements; `None` for a NULL array.
    fn at(&self, i: usize) -> Option<(usize, usize)> {
        let value = match self {
            Elements::List(a) => a.is_valid(i).then(|| a.value(i)),
            Elements::LargeList(a) => a.is_valid(i).then(|| a.value(i)),
            Elements::FixedSizeList(a) => a.is_valid(i).then(|| a.value(i)),
            Elements::Null => None,
        }?;
        Some((value.len(), value.null_count()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;
    use datafusion::sql::sqlparser::ast::{SelectItem, SetExpr, Statement, VisitorMut};
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::parser::Parser;
    use std::ops::ControlFlow;

    struct Rewrite;

    impl VisitorMut for Rewrite {
        type Break = ();
        fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
            let placeholder = Expr::Value(datafusion::sql::sqlparser::ast::Value::Null.into());
            *expr = with_null_semantics(std::mem::replace(expr, placeholder));
            ControlFlow::Continue(())
        }
    }

    /// The answers of `sql`'s SELECT items, each a boolean, with the rewrite applied.
    async fn answers(sql: &str) -> Result<Vec<Option<bool>>> {
        let mut statement = Parser::parse_sql(&GenericDialect {}, sql)?.remove(0);
        let _ = datafusion::sql::sqlparser::ast::VisitMut::visit(&mut statement, &mut Rewrite);
        let ctx = SessionContext::new();
        ctx.register_udf(any_nulls_udf().as_ref().clone());
        let state = ctx.state();
        let plan = state.statement_to_plan(datafusion::sql::parser::Statement::Statement(Box::new(statement))).await?;
        let batches = ctx.execute_logical_plan(plan).await?.collect().await?;
        let batch = &batches[0];
        for field in batch.schema().fields() {
            assert!(!field.name().starts_with(FUNCTION_NAME), "{}", field.name());
        }
        Ok((0..batch.num_columns()).map(|i| batch.column(i).as_boolean().iter().next().flatten()).collect())
    }

    #[tokio::test]
    async fn null_elements_make_an_unfound_comparison_unknown() -> Result<()> {
        let got = answers(
            "SELECT 5 = ANY(ARRAY[1, NULL, 3]), 1 = ANY(ARRAY[1, NULL, 3]), 5 = ANY(ARRAY[1, 3]), \
             CAST(NULL AS INT) = ANY(ARRAY[1]), 5 > ANY(ARRAY[NULL, 10]), 5 > ANY(ARRAY[NULL, 1]), \
             5 <> ANY(ARRAY[5, NULL]), 1 = ANY(CAST(NULL AS INT[])), CAST(NULL AS INT) = ANY(CAST([] AS INT[]))",
        )
        .await?;
        assert_eq!(got, [None, Some(true), Some(false), None, None, Some(true), None, None, Some(false)]);
        Ok(())
    }

    #[test]
    fn subqueries_and_names_are_kept() {
        let sql = "SELECT x = ANY(SELECT 1), y < ANY(arr)";
        let mut statement = Parser::parse_sql(&GenericDialect {}, sql).expect("parses").remove(0);
        let _ = datafusion::sql::sqlparser::ast::VisitMut::visit(&mut statement, &mut Rewrite);
        let Statement::Query(query) = statement else { unreachable!("a query") };
        let SetExpr::Select(select) = *query.body else { unreachable!("a select") };
        let items: Vec<String> = select
            .projection
            .iter()
            .map(|item| match item {
                SelectItem::UnnamedExpr(e) => e.to_string(),
                other => other.to_string(),
            })
            .collect();
        assert_eq!(items, ["x IN (SELECT 1)", "shardwise_any_nulls(y < ANY(arr), y, arr)"]);
    }
}
