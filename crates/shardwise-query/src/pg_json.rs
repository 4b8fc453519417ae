//! PostgreSQL's `json_build_object(key, value, ...)`: a JSON object of the key/value pairs, as
//! text. SQLAlchemy's PostgreSQL dialect builds its column descriptions with it when it reflects
//! a table, and users of PostgreSQL reach for it to shape rows as JSON.
//!
//! Keys are the arguments' text, kept in the order given (duplicates too, as PostgreSQL's `json`
//! keeps them); a value is a JSON number (integers, floats, decimals), boolean, string or null by
//! its type, and the text of any other type (dates, timestamps).

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, StringBuilder};
use datafusion::common::ScalarValue;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility};
use datafusion::prelude::SessionContext;
use serde_json::{Number, Value};

#[derive(Debug, PartialEq, Eq, Hash)]
struct JsonBuildObject {
    signature: Signature,
}

impl ScalarUDFImpl for JsonBuildObject {
    fn name(&self) -> &str {
        "json_build_object"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(
        &self,
        args: &[datafusion::arrow::datatypes::DataType],
    ) -> Result<datafusion::arrow::datatypes::DataType> {
        if !args.len().is_multiple_of(2) {
            return Err(DataFusionError::Plan(format!(
                "json_build_object takes key/value pairs: an even number of arguments, not {}",
                args.len()
            )));
        }
        Ok(datafusion::arrow::datatypes::DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let arrays: Vec<ArrayRef> = ColumnarValue::values_to_arrays(&args.args)?;
        let rows = args.number_rows;
        let mut out = StringBuilder::with_capacity(rows, rows * 32);
        for row in 0..rows {
            let mut members = Vec::with_capacity(arrays.len() / 2);
            for pair in arrays.chunks(2) {
                let key = ScalarValue::try_from_array(&pair[0], row)?;
                if key.is_null() {
                    return Err(DataFusionError::Execution("json_build_object: a key is NULL".into()));
                }
                let value = pair.get(1).map(|v| ScalarValue::try_from_array(v, row)).transpose()?;
                let value = value.map_or(Value::Null, |v| json_of(&v));
                members.push(format!("{}:{value}", Value::String(text_of(&key))));
            }
            out.append_value(format!("{{{}}}", members.join(",")));
        }
        Ok(ColumnarValue::Array(Arc::new(out.finish())))
    }
}

/// A value as text: strings as they are, the rest as a cast to text writes them (dates and
/// timestamps in ISO 8601, not their underlying integers).
fn text_of(v: &ScalarValue) -> String {
    match v {
        ScalarValue::Utf8(Some(s)) | ScalarValue::LargeUtf8(Some(s)) | ScalarValue::Utf8View(Some(s)) => s.clone(),
        other => other
            .to_array()
            .and_then(|a| Ok(datafusion::arrow::compute::cast(&a, &datafusion::arrow::datatypes::DataType::Utf8)?))
            .ok()
            .and_then(|a| ScalarValue::try_from_array(&a, 0).ok())
            .and_then(|t| match t {
                ScalarValue::Utf8(Some(s)) => Some(s),
                _ => None,
            })
            .unwrap_or_else(|| other.to_string()),
    }
}

fn json_of(v: &ScalarValue) -> Value {
    if v.is_null() {
        return Value::Null;
    }
    match v {
        ScalarValue::Boolean(Some(b)) => Value::Bool(*b),
        ScalarValue::Int8(Some(n)) => Value::from(*n),
        ScalarValue::Int16(Some(n)) => Value::from(*n),
        ScalarValue::Int32(Some(n)) => Value::from(*n),
        ScalarValue::Int64(Some(n)) => Value::from(*n),
        ScalarValue::UInt8(Some(n)) => Value::from(*n),
        ScalarValue::UInt16(Some(n)) => Value::from(*n),
        ScalarValue::UInt32(Some(n)) => Value::from(*n),
        ScalarValue::UInt64(Some(n)) => Value::from(*n),
        ScalarValue::Float32(Some(f)) => Number::from_f64(f64::from(*f)).map_or(Value::Null, Value::Number),
        ScalarValue::Float64(Some(f)) => Number::from_f64(*f).map_or(Value::Null, Value::Number),
        ScalarValue::Decimal128(..) | ScalarValue::Decimal256(..) => {
            let text = v.to_string();
            serde_json::from_str::<Number>(&text).map_or(Value::String(text), Value::Number)
        }
        other => Value::String(text_of(other)),
    }
}

/// Registers `json_build_object` in `ctx`.
pub fn register(ctx: &SessionContext) {
    let signature = Signature::variadic_any(Volatility::Immutable);
    ctx.register_udf(ScalarUDF::new_from_impl(JsonBuildObject { signature }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn builds_an_object_of_typed_values() {
        let ctx = SessionContext::new();
        register(&ctx);
        let sql = "SELECT json_build_object('b', 1, 'a', 'x\"y', 'c', NULL, 'd', true, 'e', 1.5, \
                   't', CAST('2024-02-29 12:30:00' AS TIMESTAMP)) AS j";
        let batches = ctx.sql(sql).await.expect("plan").collect().await.expect("run");
        let text = datafusion::arrow::array::AsArray::as_string::<i32>(batches[0].column(0)).value(0).to_string();
        assert_eq!(text, r#"{"b":1,"a":"x\"y","c":null,"d":true,"e":1.5,"t":"2024-02-29T12:30:00"}"#);
        let err = ctx.sql("SELECT json_build_object('a')").await.expect_err("odd arguments");
        assert!(err.to_string().contains("even number of arguments"), "{err}");
    }
}
