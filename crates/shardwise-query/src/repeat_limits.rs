//! `repeat(s, n)` with a bound on the string it builds.
//!
//! Why: DataFusion's `repeat` built whatever was asked: `repeat('ab', 600000000)` made a 1.2 GB
//! string in ten seconds, and over a column one such value per row could grow a node past its
//! memory until the kernel killed it (PostgreSQL refuses: "requested length too large").
//! `lpad`/`rpad` have the same bound for the same reason ([`crate::pad_limits`]).
//!
//! How: [`RepeatChecked`] wraps DataFusion's function, registered under its name: a row whose
//! result would pass [`MAX_REPEAT_BYTES`] fails the statement before anything is built, naming
//! the size. A negative count is an empty string, as before (and in PostgreSQL).

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::compute::kernels::length::length;
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::common::{Result, exec_err};
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl};

/// The longest string `repeat` builds, in bytes (PostgreSQL's bound is its 1 GB value size;
/// a repeated value this long is already far beyond any use).
pub const MAX_REPEAT_BYTES: i64 = 64 * 1024 * 1024;

/// See the module doc.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct RepeatChecked {
    inner: Arc<ScalarUDF>,
}

/// `repeat`, to register in place of DataFusion's.
pub fn repeat_udf() -> ScalarUDF {
    ScalarUDF::new_from_impl(RepeatChecked { inner: datafusion::functions::string::repeat() })
}

impl ScalarUDFImpl for RepeatChecked {
    crate::udf_wrapper::delegate_scalar!();

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        self.inner.coerce_types(arg_types)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        if let [text, count] = args.args.as_slice() {
            let rows = args.number_rows;
            let lengths = cast(&length(&text.to_array(rows)?)?, &DataType::Int64)?;
            let counts = cast(&count.to_array(rows)?, &DataType::Int64)?;
            let (lengths, counts) = (lengths.as_primitive::<Int64Type>(), counts.as_primitive::<Int64Type>());
            for i in 0..rows.min(lengths.len()).min(counts.len()) {
                if lengths.is_null(i) || counts.is_null(i) {
                    continue;
                }
                let bytes = lengths.value(i).saturating_mul(counts.value(i).max(0));
                if bytes > MAX_REPEAT_BYTES {
                    return exec_err!(
                        "repeat: a result of {bytes} bytes ({} bytes {} times) is beyond the longest string it \
                         builds ({MAX_REPEAT_BYTES} bytes)",
                        lengths.value(i),
                        counts.value(i)
                    );
                }
            }
        }
        self.inner.invoke_with_args(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::util::pretty::pretty_format_batches;
    use datafusion::prelude::SessionContext;

    async fn run(sql: &str) -> Result<String> {
        let ctx = SessionContext::new();
        ctx.register_udf(repeat_udf());
        let batches = ctx.sql(sql).await?.collect().await?;
        Ok(pretty_format_batches(&batches)?.to_string())
    }

    #[tokio::test]
    async fn huge_results_fail_and_others_are_built() -> Result<()> {
        let out = run("SELECT repeat(s, n) AS r FROM (VALUES ('ab', 3), ('x', -1), (NULL, 2)) v(s, n)").await?;
        assert!(out.contains("| ababab |"), "{out}");
        let e = run("SELECT repeat('ab', 600000000)").await.expect_err("too long");
        assert!(e.to_string().contains("1200000000 bytes"), "{e}");
        let e = run("SELECT repeat(s, n) FROM (VALUES ('abc', 1), ('abcd', 30000000)) v(s, n)")
            .await
            .expect_err("too long");
        assert!(e.to_string().contains("beyond the longest string"), "{e}");
        Ok(())
    }
}
