//! Casts that DataFusion names like the value they cast: `SELECT max(id), max(id::text)`,
//! `count(DISTINCT f), count(DISTINCT f::text)`, `SELECT f::text ... GROUP BY f, f::text`.
//!
//! Why: DataFusion names `CAST(x AS T)` as `x`, so `max(id)` and `max(CAST(id AS TEXT))` are both
//! `max(t.id)`, and the aggregate (or projection) holding both is refused ("Schema contains
//! duplicate unqualified field name"), where PostgreSQL and DuckDB answer. Naming the SELECT items
//! ([`crate::repeated_items`]) does not help: the names collide inside the plan.
//!
//! How: when DataFusion refused a query so, it is planned again ([`crate::engine`]) with every
//! cast written as `shardwise_cast_named(CAST(x AS T), 'T')`, a function that returns its first
//! argument as it is; its name holds the type, so the two are told apart. Only that second
//! planning does it, so other queries keep DataFusion's plans and names. A value and its cast
//! grouped by are planned, and refused only as the plan is optimized: [`grouping_names_collide`]
//! finds them right after planning, while the query can still be planned again.

use std::collections::HashSet;
use std::ops::ControlFlow;
use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Result, exec_err};
use datafusion::logical_expr::{
    ColumnarValue, LogicalPlan, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{Expr, Value, VisitorMut};

/// The function's SQL name.
pub const CAST_NAMED: &str = "shardwise_cast_named";

/// Wraps every cast in `statement` (see the module doc).
pub fn name_casts(statement: &mut DfStatement) {
    crate::repeated_items::visit_statement_mut(statement, &mut NameCasts);
}

struct NameCasts;

impl VisitorMut for NameCasts {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        let Expr::Cast { data_type, .. } = expr else { return ControlFlow::Continue(()) };
        let label = Expr::value(Value::SingleQuotedString(data_type.to_string()));
        let cast = std::mem::replace(expr, Expr::value(Value::Null));
        *expr = crate::sql_ast::function_call(CAST_NAMED, vec![cast, label]);
        ControlFlow::Continue(())
    }
}

/// Whether an aggregate of `plan` (subqueries included) groups by two expressions DataFusion
/// names alike, a value and a cast of it (`GROUP BY f, f::text`): the aggregate takes them (one
/// is a qualified column, the other an unqualified name that reads the same), a projection built
/// as the plan is optimized does not.
pub fn grouping_names_collide(plan: &LogicalPlan) -> bool {
    let mut found = false;
    let _ = plan.apply_with_subqueries(|node| {
        if let LogicalPlan::Aggregate(aggregate) = node {
            let mut names = HashSet::new();
            found = !aggregate.group_expr.iter().all(|e| names.insert(e.schema_name().to_string()));
        }
        Ok(if found { TreeNodeRecursion::Stop } else { TreeNodeRecursion::Continue })
    });
    found
}

/// The function, ready to register.
pub fn cast_named_udf() -> Arc<ScalarUDF> {
    Arc::new(ScalarUDF::new_from_impl(CastNamed { signature: Signature::any(2, Volatility::Immutable) }))
}

/// `shardwise_cast_named(value, 'type')`: `value`.
#[derive(Debug, PartialEq, Eq, Hash)]
struct CastNamed {
    signature: Signature,
}

impl ScalarUDFImpl for CastNamed {
    fn name(&self) -> &str {
        CAST_NAMED
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        match arg_types.first() {
            Some(value) => Ok(value.clone()),
            None => exec_err!("{CAST_NAMED} takes a value and a type name"),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        match args.args.into_iter().next() {
            Some(value) => Ok(value),
            None => exec_err!("{CAST_NAMED} takes a value and a type name"),
        }
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn every_cast_is_named_by_its_type() {
        let sql = "SELECT max(id), max(id::text), count(DISTINCT CAST(f AS DOUBLE)) FROM t GROUP BY f, f::text";
        assert_eq!(
            crate::sql_ast::rewritten_by(sql, name_casts),
            "SELECT max(id), max(shardwise_cast_named(id::TEXT, 'TEXT')), \
             count(DISTINCT shardwise_cast_named(CAST(f AS DOUBLE), 'DOUBLE')) FROM t \
             GROUP BY f, shardwise_cast_named(f::TEXT, 'TEXT')"
        );
    }
}
