//! `coalesce(date_column, '2020-01-01')`: a string among the arguments of another type is read as
//! that type, as PostgreSQL reads an untyped literal there.
//!
//! Why: DataFusion's `coalesce` finds one type for its arguments by its union rules, which have
//! none for a DATE (or TIMESTAMP, or a number) beside a string, and the query failed with
//! "Function 'coalesce' user-defined coercion failed ... Expect to get struct but got Date32",
//! a message about neither. PostgreSQL and DuckDB answer it.
//!
//! How: [`StringsAsOthers`] is DataFusion's `coalesce` (registered under its name) except where
//! its coercion fails and every argument that is not a string (or NULL) has one type: then the
//! strings are cast to it, and one that does not parse fails as a cast does, naming the value.

use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::Result;
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl};

/// See the module doc.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct StringsAsOthers {
    inner: Arc<ScalarUDF>,
}

/// `coalesce`, to register in place of DataFusion's.
pub fn coalesce_udf() -> ScalarUDF {
    ScalarUDF::new_from_impl(StringsAsOthers { inner: datafusion::functions::core::coalesce() })
}

fn is_string(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8)
}

impl ScalarUDFImpl for StringsAsOthers {
    crate::udf_wrapper::delegate_scalar!();

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        self.inner.invoke_with_args(args)
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        let refused = match self.inner.coerce_types(arg_types) {
            Ok(types) => return Ok(types),
            Err(e) => e,
        };
        let mut others = arg_types.iter().filter(|t| !is_string(t) && !t.is_null());
        let Some(other) = others.next() else { return Err(refused) };
        if others.any(|t| t != other) || !arg_types.iter().any(is_string) {
            return Err(refused);
        }
        Ok(arg_types.iter().map(|_| other.clone()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::util::pretty::pretty_format_batches;
    use datafusion::prelude::SessionContext;

    async fn run(sql: &str) -> Result<String> {
        let ctx = SessionContext::new();
        ctx.register_udf(coalesce_udf());
        let batches = ctx.sql(sql).await?.collect().await?;
        Ok(pretty_format_batches(&batches)?.to_string())
    }

    #[tokio::test]
    async fn a_string_beside_a_date_is_a_date() -> Result<()> {
        let sql = "SELECT coalesce(d, '2020-01-01') AS c FROM (VALUES (CAST('2024-05-06' AS DATE)), (NULL)) v(d)";
        let out = run(sql).await?;
        assert!(out.contains("| 2024-05-06 |") && out.contains("| 2020-01-01 |"), "{out}");
        let e =
            run("SELECT coalesce(d, 'soon') FROM (VALUES (CAST(NULL AS DATE))) v(d)").await.expect_err("not a date");
        assert!(e.to_string().contains("soon"), "{e}");
        // Types DataFusion unites stay its own.
        assert!(run("SELECT coalesce(NULL, 1, 2.5) AS c").await?.contains("| 1.0 |"));
        Ok(())
    }
}
