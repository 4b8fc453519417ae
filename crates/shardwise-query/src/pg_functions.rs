//! PostgreSQL catalog functions that psql's describe commands call and `datafusion-pg-catalog`
//! does not provide, or provides with made-up values: `\dt+`, `\dn+` and `\df` failed on them.
//!
//! Each answers what is true of shardwise, or NULL where shardwise does not know:
//! - `obj_description`, `col_description`, `shobj_description`: NULL, since shardwise has no
//!   `COMMENT ON`.
//! - `pg_function_is_visible`: true, since every function `pg_proc` lists is in `pg_catalog`,
//!   which is always on the search path.
//! - `pg_table_size`, `pg_relation_size`, `pg_total_relation_size`, `pg_indexes_size`: NULL,
//!   since a table's bytes are spread over its shards' nodes and `system.shards` has them. The
//!   crate's versions return 0, which would read as "empty".
//! - `pg_size_pretty`: PostgreSQL's own formatting of a byte count.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, AsArray, StringArray, new_null_array};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, TypeSignature, Volatility,
};
use datafusion::prelude::SessionContext;

/// A function of one or two arguments (of any type) that always answers `value` (NULL or true)
/// as `return_type`.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Constant {
    name: &'static str,
    signature: Signature,
    return_type: DataType,
    value: Option<bool>,
}

impl Constant {
    fn udf(name: &'static str, return_type: DataType, value: Option<bool>) -> ScalarUDF {
        let signature = Signature::one_of(vec![TypeSignature::Any(1), TypeSignature::Any(2)], Volatility::Stable);
        ScalarUDF::new_from_impl(Constant { name, signature, return_type, value })
    }
}

impl ScalarUDFImpl for Constant {
    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> Result<DataType> {
        Ok(self.return_type.clone())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let array: ArrayRef = match self.value {
            None => new_null_array(&self.return_type, rows),
            Some(v) => Arc::new(datafusion::arrow::array::BooleanArray::from(vec![v; rows])),
        };
        Ok(ColumnarValue::Array(array))
    }
}

/// `pg_size_pretty(bigint)`.
#[derive(Debug, PartialEq, Eq, Hash)]
struct SizePretty {
    signature: Signature,
}

impl ScalarUDFImpl for SizePretty {
    fn name(&self) -> &str {
        "pg_size_pretty"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let sizes = cast(&arrays[0], &DataType::Int64)?;
        let sizes = sizes.as_primitive::<Int64Type>();
        let text: StringArray = sizes.iter().map(|size| size.map(size_pretty)).collect();
        Ok(ColumnarValue::Array(Arc::new(text)))
    }
}

/// PostgreSQL's `pg_size_pretty`: bytes below 10 kB, then kB, MB, GB, TB and PB, each used
/// below 20 of the next, rounded half away from zero.
pub fn size_pretty(bytes: i64) -> String {
    const LIMIT: i64 = 10 * 1024;
    const LIMIT2: i64 = LIMIT * 2 - 1;
    let half_rounded = |x: i64| (x + if x < 0 { -1 } else { 1 }) / 2;
    if bytes.abs() < LIMIT {
        return format!("{bytes} bytes");
    }
    // One extra bit kept for the rounding.
    let mut size = bytes >> 9;
    for unit in ["kB", "MB", "GB", "TB"] {
        if size.abs() < LIMIT2 {
            return format!("{} {unit}", half_rounded(size));
        }
        size >>= 10;
    }
    format!("{} PB", half_rounded(size))
}

/// Registers the functions in `ctx` (after the crate's, which they replace where both exist).
pub fn register(ctx: &SessionContext) {
    for name in ["obj_description", "col_description", "shobj_description"] {
        ctx.register_udf(Constant::udf(name, DataType::Utf8, None));
    }
    for name in ["pg_table_size", "pg_relation_size", "pg_total_relation_size", "pg_indexes_size"] {
        ctx.register_udf(Constant::udf(name, DataType::Int64, None));
    }
    ctx.register_udf(Constant::udf("pg_function_is_visible", DataType::Boolean, Some(true)));
    let signature = Signature::one_of(vec![TypeSignature::Any(1)], Volatility::Immutable);
    ctx.register_udf(ScalarUDF::new_from_impl(SizePretty { signature }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_written_as_postgresql_writes_them() {
        // PostgreSQL 16: SELECT pg_size_pretty(x::bigint) for each x.
        for (bytes, shown) in [
            (0, "0 bytes"),
            (10239, "10239 bytes"),
            (10240, "10 kB"),
            (1_000_000, "977 kB"),
            (20_970_000, "20 MB"),
            (1 << 40, "1024 GB"),
            (-10240, "-10 kB"),
        ] {
            assert_eq!(size_pretty(bytes), shown, "{bytes}");
        }
    }

    #[tokio::test]
    async fn describe_functions_answer() {
        let ctx = SessionContext::new();
        register(&ctx);
        let sql = "SELECT obj_description(1, 'pg_class') AS d, pg_table_size(1) AS s, \
                   pg_function_is_visible(3) AS v, pg_size_pretty(123456) AS p";
        let batches = ctx.sql(sql).await.expect("plan").collect().await.expect("run");
        let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches).expect("format").to_string();
        assert!(text.contains("|   |   | true | 121 kB |"), "{text}");
    }
}
