//! PostgreSQL's run-time parameters as shardwise answers them, for `SHOW name` on the PostgreSQL
//! endpoint and for `current_setting(name)` in any query.
//!
//! Why: drivers and ORMs read them when they connect or reflect a table: SQLAlchemy's
//! `SHOW transaction isolation level`, and its table reflection's
//! `current_setting('default_table_access_method')`, which failed ("Invalid function").
//!
//! What: [`POSTGRES_PARAMETERS`], what holds for shardwise (every statement applies on its own,
//! which is at least `read committed`; strings are standard; text is UTF-8; a table needs no
//! access method, so the default is PostgreSQL's `heap`). `current_setting(name [, missing_ok])`
//! answers one of those, else the session's value of a shardwise or DataFusion setting (as
//! `SHOW` prints it), else fails as PostgreSQL does (`unrecognized configuration parameter`),
//! or is NULL when `missing_ok` is true.

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, StringArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::config::{ConfigExtension, ConfigOptions};
use datafusion::common::{ScalarValue, exec_err};
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, TypeSignature, Volatility,
};

/// A PostgreSQL parameter (lower case) and the value shardwise answers for it.
pub const POSTGRES_PARAMETERS: &[(&str, &str)] = &[
    ("transaction_isolation", "read committed"),
    ("default_transaction_isolation", "read committed"),
    ("transaction_read_only", "off"),
    ("default_transaction_read_only", "off"),
    ("standard_conforming_strings", "on"),
    ("server_version", crate::pg_functions::POSTGRES_VERSION),
    ("server_version_num", "160006"),
    ("server_encoding", "UTF8"),
    ("client_encoding", "UTF8"),
    ("datestyle", "ISO, MDY"),
    ("intervalstyle", "postgres"),
    ("timezone", "UTC"),
    ("integer_datetimes", "on"),
    ("max_identifier_length", "63"),
    ("search_path", "public"),
    ("bytea_output", "hex"),
    ("lc_collate", "C.UTF-8"),
    ("lc_ctype", "C.UTF-8"),
    ("is_superuser", "on"),
    ("default_table_access_method", "heap"),
];

/// The value of parameter `name` in `options` (see the module doc); `None` if there is none.
pub fn setting(name: &str, options: &ConfigOptions) -> Option<String> {
    let lower = name.to_ascii_lowercase();
    if let Some((_, value)) = POSTGRES_PARAMETERS.iter().find(|(known, _)| *known == lower) {
        return Some((*value).to_string());
    }
    // PostgreSQL's name for `max_execution_time_ms`, in its units (`SET statement_timeout` sets it).
    if lower == "statement_timeout" {
        let ms = entry_value(options, &crate::settings::option_key("max_execution_time_ms"))?;
        return Some(postgres_milliseconds(ms.parse().ok()?));
    }
    entry_value(options, &crate::settings::option_key(name))
}

/// The value of option `key` (`shardwise.max_threads`, `datafusion.execution.batch_size`):
/// DataFusion lists an extension's options without its prefix.
fn entry_value(options: &ConfigOptions, key: &str) -> Option<String> {
    let unprefixed = key.strip_prefix(crate::settings::ShardwiseSettings::PREFIX).and_then(|k| k.strip_prefix('.'));
    let entry = options.entries().into_iter().find(|e| e.key == key || Some(e.key.as_str()) == unprefixed)?;
    Some(entry.value.unwrap_or_default())
}

/// Milliseconds as PostgreSQL shows a setting in them: `0`, else in the largest unit that holds
/// them whole (`1500ms`, `2s`, `5min`, `1h`, `1d`).
fn postgres_milliseconds(ms: u64) -> String {
    let units = [(86_400_000, "d"), (3_600_000, "h"), (60_000, "min"), (1_000, "s")];
    match units.iter().find(|(size, _)| ms != 0 && ms.is_multiple_of(*size)) {
        Some((size, unit)) => format!("{}{unit}", ms / size),
        None if ms == 0 => "0".to_string(),
        None => format!("{ms}ms"),
    }
}

/// `current_setting`, to register with a session.
pub fn current_setting_udf() -> ScalarUDF {
    let signature = Signature::one_of(
        vec![TypeSignature::Exact(vec![DataType::Utf8]), TypeSignature::Exact(vec![DataType::Utf8, DataType::Boolean])],
        Volatility::Stable,
    );
    ScalarUDF::new_from_impl(CurrentSetting { signature })
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct CurrentSetting {
    signature: Signature,
}

impl ScalarUDFImpl for CurrentSetting {
    fn name(&self) -> &str {
        "current_setting"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let scalar = args.args.iter().all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let rows = if scalar { 1 } else { args.number_rows };
        let names = match args.args.first() {
            Some(names) => cast(&names.to_array(rows)?, &DataType::Utf8)?,
            None => return exec_err!("current_setting takes a parameter name"),
        };
        let names = names.as_string::<i32>();
        let missing_ok = match args.args.get(1) {
            Some(flags) => Some(flags.to_array(rows)?),
            None => None,
        };
        let mut values = Vec::with_capacity(rows);
        for i in 0..rows {
            if names.is_null(i) {
                values.push(None);
                continue;
            }
            let name = names.value(i);
            match setting(name, &args.config_options) {
                Some(value) => values.push(Some(value)),
                None if missing_ok.as_ref().is_some_and(|m| m.is_valid(i) && m.as_boolean().value(i)) => {
                    values.push(None)
                }
                None => return exec_err!("unrecognized configuration parameter \"{name}\""),
            }
        }
        let values = Arc::new(StringArray::from(values));
        Ok(match scalar {
            true => ColumnarValue::Scalar(ScalarValue::try_from_array(values.as_ref(), 0)?),
            false => ColumnarValue::Array(values),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;

    #[test]
    fn milliseconds_in_postgresql_units() {
        let shown: Vec<String> = [0, 1500, 2000, 300_000, 3_600_000, 86_400_000].map(postgres_milliseconds).into();
        assert_eq!(shown, ["0", "1500ms", "2s", "5min", "1h", "1d"]);
    }

    #[tokio::test]
    async fn postgres_parameters_then_session_settings_then_an_error() -> Result<()> {
        let config = datafusion::prelude::SessionConfig::new()
            .with_option_extension(crate::settings::ShardwiseSettings::default());
        let ctx = SessionContext::new_with_config(config);
        ctx.register_udf(current_setting_udf());
        let one = |sql: &'static str| {
            let ctx = ctx.clone();
            async move {
                let batches = ctx.sql(sql).await?.collect().await?;
                Ok::<_, datafusion::error::DataFusionError>(
                    ScalarValue::try_from_array(batches[0].column(0), 0)?.to_string(),
                )
            }
        };
        assert_eq!(one("SELECT current_setting('default_table_access_method')").await?, "heap");
        assert_eq!(one("SELECT current_setting('Search_Path')").await?, "public");
        ctx.sql("SET datafusion.execution.batch_size = 1234").await?.collect().await?;
        assert_eq!(one("SELECT current_setting('datafusion.execution.batch_size')").await?, "1234");
        // shardwise's own settings (DataFusion lists them without their prefix), and
        // PostgreSQL's name for one of them in its units.
        ctx.sql("SET shardwise.max_execution_time_ms = 90000").await?.collect().await?;
        assert_eq!(one("SELECT current_setting('max_execution_time_ms')").await?, "90000");
        assert_eq!(one("SELECT current_setting('statement_timeout')").await?, "90s");
        assert_eq!(one("SELECT current_setting('no_such_thing', true)").await?, "NULL");
        let e = one("SELECT current_setting('no_such_thing')").await.expect_err("unknown");
        assert!(e.to_string().contains("unrecognized configuration parameter \"no_such_thing\""), "{e}");
        Ok(())
    }
}
