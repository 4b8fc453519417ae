//! Casts that DataFusion names like the value they cast: `SELECT max(id), max(id::text)`,
//! `count(DISTINCT f), count(DISTINCT f::text)`. (`GROUP BY f, f::text` is still refused: the
//! names collide in a projection planned after this.)
//!
//! Why: DataFusion names `CAST(x AS T)` as `x`, so `max(id)` and `max(CAST(id AS TEXT))` are both
//! `max(t.id)`, and the aggregate (or projection) holding both is refused ("Schema contains
//! duplicate unqualified field name"), where PostgreSQL and DuckDB answer. Naming the SELECT items
//! ([`crate::repeated_items`]) does not help: the names collide inside the plan.
//!
//! How: when DataFusion refused a query so, it is planned again ([`crate::engine`]) with every
//! cast written as `shardwise_cast_named(CAST(x AS T), 'T')`, a function that returns its first
//! argument as it is; its name holds the type, so the two are told apart. Only that second
//! planning does it, so other queries keep DataFusion's plans and names.

use std::ops::ControlFlow;
use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::{Result, exec_err};
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility};
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
    use datafusion::sql::parser::DFParser;

    use super::*;

    #[test]
    fn every_cast_is_named_by_its_type() {
        let sql = "SELECT max(id), max(id::text), count(DISTINCT CAST(f AS DOUBLE)) FROM t GROUP BY f, f::text";
        let mut statement = DFParser::parse_sql(sql).expect("parse").pop_front().expect("statement");
        name_casts(&mut statement);
        assert_eq!(
            statement.to_string(),
            "SELECT max(id), max(shardwise_cast_named(id::TEXT, 'TEXT')), \
             count(DISTINCT shardwise_cast_named(CAST(f AS DOUBLE), 'DOUBLE')) FROM t \
             GROUP BY f, shardwise_cast_named(f::TEXT, 'TEXT')"
        );
    }
}
