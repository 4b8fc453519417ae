//! `lpad` and `rpad` with PostgreSQL's answer for a negative length and a bound on the length.
//!
//! Why: DataFusion's `lpad(s, n)`/`rpad(s, n)` with `n` from a column panicked on a negative `n`
//! ("capacity overflow"; PostgreSQL answers `''`), and built whatever length was asked: one
//! `lpad('x', 2147483647)` per row grew a node past its memory until the kernel killed it.
//!
//! How: [`PadChecked`] wraps DataFusion's function, registered under its name: negative lengths
//! become 0, and a length above [`MAX_PAD_LENGTH`] fails the statement before anything is built.

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, Int64Array};
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::common::{Result, ScalarValue, exec_err};
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl};

/// The longest string `lpad`/`rpad` builds, in characters (PostgreSQL's bound is its 1 GB
/// value size; padding to this length is already far beyond any use).
pub const MAX_PAD_LENGTH: i64 = 16 * 1024 * 1024;

/// See the module doc.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct PadChecked {
    inner: Arc<ScalarUDF>,
}

/// `lpad` and `rpad`, to register in place of DataFusion's.
pub fn pad_udfs() -> [ScalarUDF; 2] {
    [datafusion::functions::unicode::lpad(), datafusion::functions::unicode::rpad()]
        .map(|inner| ScalarUDF::new_from_impl(PadChecked { inner }))
}

/// `length` as the function may use it: 0 for a negative one; an error above the bound.
fn checked(name: &str, length: i64) -> Result<i64> {
    if length > MAX_PAD_LENGTH {
        return exec_err!("{name}: a length of {length} is beyond the longest string it builds ({MAX_PAD_LENGTH})");
    }
    Ok(length.max(0))
}

impl ScalarUDFImpl for PadChecked {
    crate::udf_wrapper::delegate_scalar!();

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        self.inner.coerce_types(arg_types)
    }

    fn invoke_with_args(&self, mut args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let name = self.inner.name().to_string();
        if let Some(length) = args.args.get_mut(1) {
            *length = match &*length {
                ColumnarValue::Scalar(ScalarValue::Int64(Some(n))) => {
                    ColumnarValue::Scalar(ScalarValue::Int64(Some(checked(&name, *n)?)))
                }
                ColumnarValue::Scalar(other) => ColumnarValue::Scalar(other.clone()),
                ColumnarValue::Array(lengths) => {
                    let lengths = lengths.as_primitive::<Int64Type>();
                    let mut out = Vec::with_capacity(lengths.len());
                    for i in 0..lengths.len() {
                        out.push(if lengths.is_valid(i) { Some(checked(&name, lengths.value(i))?) } else { None });
                    }
                    ColumnarValue::Array(Arc::new(Int64Array::from(out)))
                }
            };
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
        for udf in pad_udfs() {
            ctx.register_udf(udf);
        }
        let batches = ctx.sql(sql).await?.collect().await?;
        Ok(pretty_format_batches(&batches)?.to_string())
    }

    #[tokio::test]
    async fn negative_lengths_pad_to_nothing_and_huge_ones_fail() -> Result<()> {
        let out = run(
            "SELECT lpad(s, n) AS l, rpad(s, n, '*') AS r FROM (VALUES ('abc', 2), ('abc', -1), ('ab', 4)) v(s, n)",
        )
        .await?;
        assert!(
            out.contains("| ab   | ab   |") && out.contains("|      |      |") && out.contains("|   ab | ab** |"),
            "{out}"
        );
        let e = run("SELECT lpad('x', 2147483647)").await.expect_err("too long");
        assert!(e.to_string().contains("lpad: a length of 2147483647 is beyond the longest string"), "{e}");
        let e = run("SELECT rpad(s, n) FROM (VALUES ('x', 100000000)) v(s, n)").await.expect_err("too long");
        assert!(e.to_string().contains("rpad: a length of 100000000"), "{e}");
        Ok(())
    }
}
