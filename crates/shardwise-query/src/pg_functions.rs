//! PostgreSQL catalog functions that psql's describe commands call and `datafusion-pg-catalog`
//! does not provide, or provides with made-up values: `\dt+`, `\dn+` and `\df` failed on them.
//!
//! Each answers what is true of shardwise, or NULL where shardwise does not know:
//! - `obj_description`, `col_description`, `shobj_description`: NULL, since shardwise has no
//!   `COMMENT ON`.
//! - `pg_function_is_visible`, `pg_collation_is_visible`, `pg_type_is_visible`: true, since
//!   every function `pg_proc` lists and every collation and type is in `pg_catalog`, which is
//!   always on the search path.
//! - `pg_get_function_result`, `pg_get_function_arguments`, `pg_get_functiondef` (psql's `\df`,
//!   `\sf`): NULL, since no function here has PostgreSQL argument text or SQL source.
//! - `pg_database_size` (psql's `\l+`): NULL, as the table sizes below; `pg_tablespace_location`
//!   (`\db`): NULL, since there is no tablespace directory.
//! - `pg_get_serial_sequence`: NULL, since no column has a sequence behind it.
//! - `pg_get_indexdef`: NULL, since there is no index (`crate::pg_catalog_tables`).
//! - `pg_table_size`, `pg_relation_size`, `pg_total_relation_size`, `pg_indexes_size`: NULL,
//!   since a table's bytes are spread over its shards' nodes and `system.shards` has them. The
//!   crate's versions return 0, which would read as "empty".
//! - `pg_size_pretty`: PostgreSQL's own formatting of a byte count.
//! - `to_regtype(name)`: the type's OID (PostgreSQL's, as `pg_type` lists them) for the built-in
//!   types shardwise's columns map to and their usual names (`integer`, `character varying`),
//!   NULL for any other name (psycopg 3 asks for `hstore` this way when SQLAlchemy connects).
//! - `current_setting(name)`: see `crate::pg_settings`.
//! - `gen_random_uuid()`: DataFusion's `uuid()` under PostgreSQL's name (a version-4 UUID, as
//!   text).
//! - `pg_advisory_unlock_all()`: NULL (PostgreSQL's void), releasing nothing, since no advisory
//!   lock can be taken; asyncpg's pool calls it when a connection comes back to it.
//! - `version()`: `PostgreSQL 16.6 on x86_64-linux (shardwise 0.1.0, Apache DataFusion 55.2.0)`,
//!   the form other engines that speak PostgreSQL's protocol use (Redshift, Materialize), since
//!   client libraries read the PostgreSQL version from it (SQLAlchemy refuses to connect without
//!   one). 16.6 is the `server_version` the PostgreSQL endpoint reports at log-in.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, AsArray, StringArray, new_null_array};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::common::ScalarValue;
use datafusion::error::Result;
use datafusion::logical_expr::create_udf;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, TypeSignature, Volatility,
};
use datafusion::prelude::SessionContext;

/// A function of one to three arguments (of any type) that always answers `value` (NULL or true)
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
        let arities = vec![TypeSignature::Any(1), TypeSignature::Any(2), TypeSignature::Any(3)];
        let signature = Signature::one_of(arities, Volatility::Stable);
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

/// PostgreSQL's OIDs of the built-in types, by each of their names (what `to_regtype` knows).
const TYPE_OIDS: &[(&str, i32)] = &[
    ("bool", 16),
    ("boolean", 16),
    ("bytea", 17),
    ("int8", 20),
    ("bigint", 20),
    ("int2", 21),
    ("smallint", 21),
    ("int4", 23),
    ("integer", 23),
    ("int", 23),
    ("text", 25),
    ("oid", 26),
    ("json", 114),
    ("float4", 700),
    ("real", 700),
    ("float8", 701),
    ("double precision", 701),
    ("varchar", 1043),
    ("character varying", 1043),
    ("bpchar", 1042),
    ("char", 18),
    ("character", 1042),
    ("date", 1082),
    ("time", 1083),
    ("time without time zone", 1083),
    ("timestamp", 1114),
    ("timestamp without time zone", 1114),
    ("timestamptz", 1184),
    ("timestamp with time zone", 1184),
    ("interval", 1186),
    ("numeric", 1700),
    ("decimal", 1700),
    ("uuid", 2950),
    ("jsonb", 3802),
];

/// The OID of the type `name` names (`int4`, `pg_catalog.int4`, `INTEGER`, `"int4"`), if built in.
pub fn type_oid(name: &str) -> Option<i32> {
    let name = name.trim().to_ascii_lowercase();
    let name = name.strip_prefix("pg_catalog.").unwrap_or(&name).trim_matches('"');
    TYPE_OIDS.iter().find(|(known, _)| *known == name).map(|(_, oid)| *oid)
}

/// The PostgreSQL version shardwise's PostgreSQL endpoint speaks for (its `server_version`).
pub const POSTGRES_VERSION: &str = "16.6";

/// What `version()` answers: see the module doc.
pub fn version_text() -> String {
    format!(
        "PostgreSQL {POSTGRES_VERSION} on {}-{} (shardwise {}, Apache DataFusion {})",
        std::env::consts::ARCH,
        std::env::consts::OS,
        env!("CARGO_PKG_VERSION"),
        datafusion::DATAFUSION_VERSION
    )
}

/// `to_regtype(name)` on each row of `args[0]` (text).
fn to_regtype(args: &[ColumnarValue]) -> Result<ColumnarValue> {
    let names = ColumnarValue::values_to_arrays(args)?;
    let oids: datafusion::arrow::array::Int32Array =
        names[0].as_string::<i32>().iter().map(|name| name.and_then(type_oid)).collect();
    Ok(ColumnarValue::Array(Arc::new(oids)))
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
    ctx.register_udf(Constant::udf("pg_collation_is_visible", DataType::Boolean, Some(true)));
    ctx.register_udf(Constant::udf("pg_type_is_visible", DataType::Boolean, Some(true)));
    // psql's `\df` and `\sf`: no function has SQL source or PostgreSQL argument text here.
    for name in ["pg_get_function_result", "pg_get_function_arguments", "pg_get_functiondef"] {
        ctx.register_udf(Constant::udf(name, DataType::Utf8, None));
    }
    // psql's `\l+` and `\db`: a database's bytes are spread over the nodes, as a table's are;
    // there is no tablespace directory.
    ctx.register_udf(Constant::udf("pg_database_size", DataType::Int64, None));
    ctx.register_udf(Constant::udf("pg_tablespace_location", DataType::Utf8, None));
    // No column has a sequence behind it (SQLAlchemy asks for each when it reflects a table).
    ctx.register_udf(Constant::udf("pg_get_serial_sequence", DataType::Utf8, None));
    ctx.register_udf(crate::pg_settings::current_setting_udf());
    // No index exists (see `crate::pg_catalog_tables`); SQLAlchemy's index listing names it.
    ctx.register_udf(Constant::udf("pg_get_indexdef", DataType::Utf8, None));
    let signature = Signature::one_of(vec![TypeSignature::Any(1)], Volatility::Immutable);
    ctx.register_udf(ScalarUDF::new_from_impl(SizePretty { signature }));
    // PostgreSQL's name for a random UUID (as text: shardwise has no UUID type), DataFusion's `uuid()`.
    let uuid = datafusion::functions::string::uuid();
    ctx.register_udf(uuid.as_ref().clone().with_aliases(["gen_random_uuid"]));
    let nothing = |_: &[ColumnarValue]| Ok(ColumnarValue::Scalar(ScalarValue::Utf8(None)));
    ctx.register_udf(create_udf(
        "pg_advisory_unlock_all",
        vec![],
        DataType::Utf8,
        Volatility::Volatile,
        Arc::new(nothing),
    ));
    // `version()` replaces DataFusion's.
    let version = |_: &[ColumnarValue]| Ok(ColumnarValue::Scalar(ScalarValue::Utf8(Some(version_text()))));
    ctx.register_udf(create_udf("version", vec![], DataType::Utf8, Volatility::Stable, Arc::new(version)));
    ctx.register_udf(create_udf(
        "to_regtype",
        vec![DataType::Utf8],
        DataType::Int32,
        Volatility::Stable,
        Arc::new(to_regtype),
    ));
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

    #[tokio::test]
    async fn to_regtype_knows_the_built_in_types_only() {
        let ctx = SessionContext::new();
        register(&ctx);
        let sql = "SELECT to_regtype('int4') AS a, to_regtype('pg_catalog.INTEGER') AS b, \
                   to_regtype('character varying') AS c, to_regtype('hstore') AS d";
        let batches = ctx.sql(sql).await.expect("plan").collect().await.expect("run");
        let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches).expect("format").to_string();
        assert!(text.contains("| 23 | 23 | 1043 |   |"), "{text}");
    }

    #[tokio::test]
    async fn gen_random_uuid_gives_a_new_uuid_per_row() {
        let ctx = SessionContext::new();
        register(&ctx);
        let sql = "SELECT count(DISTINCT gen_random_uuid()) AS n, min(length(gen_random_uuid())) AS l \
                   FROM generate_series(1, 100)";
        let batches = ctx.sql(sql).await.expect("plan").collect().await.expect("run");
        let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches).expect("format").to_string();
        assert!(text.contains("| 100 | 36 |"), "{text}");
    }

    #[tokio::test]
    async fn version_names_postgres_first_then_shardwise() {
        let ctx = SessionContext::new();
        register(&ctx);
        let batches = ctx.sql("SELECT version() AS v").await.expect("plan").collect().await.expect("run");
        let text = batches[0].column(0).as_string::<i32>().value(0).to_string();
        // What SQLAlchemy's PostgreSQL dialect looks for: `PostgreSQL <major>.<minor>`.
        assert!(text.starts_with("PostgreSQL 16.6 on "), "{text}");
        assert!(text.contains(concat!("(shardwise ", env!("CARGO_PKG_VERSION"))), "{text}");
    }
}
