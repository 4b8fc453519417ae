//! Date and timestamp literals as PostgreSQL and DuckDB read them: a time without seconds
//! (`'2024-01-01 10:00'`) and spaces around the text.
//!
//! Why: Arrow's parser refused both (`Error parsing timestamp from '2024-01-01 10:00': error
//! parsing time`, `Cannot cast string ' 2024-01-01' to value of Date32 type`), in a WHERE clause
//! (`t >= '2024-01-01 10:00'`), an INSERT or a `TIMESTAMP '...'` literal.
//!
//! How: [`TimeLiterals`], an analyzer rule after type coercion (which makes those comparisons
//! casts), trims a string literal cast to a date or a timestamp and gives `YYYY-MM-DD HH:MM` its
//! `:00`. Anything else reaches Arrow's parser as written, with its errors. Values of text
//! ingest (HTTP's CSV, `COPY`, `shardwise load`) are read the same way
//! (`crate::text_values::times_as_arrow_reads`).

use datafusion::arrow::datatypes::DataType;
use datafusion::common::ScalarValue;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::Transformed;
use datafusion::error::Result;
use datafusion::logical_expr::expr::{Cast, TryCast};
use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion::optimizer::AnalyzerRule;

/// The analyzer rule (see the module doc).
#[derive(Debug, Default)]
pub struct TimeLiterals;

impl AnalyzerRule for TimeLiterals {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        crate::expression_rules::rewrite_expressions(plan, |e, _| Ok(normalized(e)))
    }

    fn name(&self) -> &str {
        "shardwise_time_literals"
    }
}

/// `text` as Arrow parses it for a date or timestamp `to`, when it differs. Allocates nothing
/// when it does not: text ingest asks this of every value of a timestamp column.
pub(crate) fn as_arrow_reads(text: &str, to: &DataType) -> Option<String> {
    let trimmed = text.trim();
    let bytes = trimmed.as_bytes();
    let minutes_only = matches!(to, DataType::Timestamp(..))
        && bytes.len() == 16
        && bytes[4] == b'-'
        && bytes[7] == b'-'
        && matches!(bytes[10], b' ' | b'T')
        && bytes[13] == b':'
        && [0..4, 5..7, 8..10, 11..13, 14..16].into_iter().all(|r| bytes[r].iter().all(u8::is_ascii_digit));
    if minutes_only {
        Some(format!("{trimmed}:00"))
    } else {
        (trimmed.len() != text.len()).then(|| trimmed.to_string())
    }
}

fn normalized(e: Expr) -> Transformed<Expr> {
    let (literal, to) = match &e {
        Expr::Cast(Cast { expr, field }) | Expr::TryCast(TryCast { expr, field }) => (expr.as_ref(), field.data_type()),
        _ => return Transformed::no(e),
    };
    if !matches!(to, DataType::Timestamp(..) | DataType::Date32 | DataType::Date64) {
        return Transformed::no(e);
    }
    let Expr::Literal(
        ScalarValue::Utf8(Some(text)) | ScalarValue::Utf8View(Some(text)) | ScalarValue::LargeUtf8(Some(text)),
        _,
    ) = literal
    else {
        return Transformed::no(e);
    };
    let Some(text) = as_arrow_reads(text, to) else { return Transformed::no(e) };
    let literal = Box::new(Expr::Literal(ScalarValue::Utf8(Some(text)), None));
    Transformed::yes(match e {
        Expr::Cast(Cast { field, .. }) => Expr::Cast(Cast { expr: literal, field }),
        Expr::TryCast(TryCast { field, .. }) => Expr::TryCast(TryCast { expr: literal, field }),
        other => other,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use datafusion::arrow::util::pretty::pretty_format_batches;
    use datafusion::prelude::SessionContext;

    #[tokio::test]
    async fn minutes_without_seconds_and_spaces_around() -> Result<()> {
        let ctx = SessionContext::new();
        ctx.add_analyzer_rule(Arc::new(TimeLiterals));
        let sql = "SELECT CAST('2024-01-01 10:00' AS TIMESTAMP) AS a, TIMESTAMP '2024-01-01T10:05' AS b, \
                   CAST(' 2024-01-02 ' AS DATE) AS c, \
                   CAST('2024-01-01 10:30:00' AS TIMESTAMP) >= '2024-01-01 10:00' AS d";
        let out = pretty_format_batches(&ctx.sql(sql).await?.collect().await?)?.to_string();
        assert!(out.contains("| 2024-01-01T10:00:00 | 2024-01-01T10:05:00 | 2024-01-02 | true |"), "{out}");
        // Not a time: Arrow's error names the text as written.
        let e = ctx.sql("SELECT CAST('2024-01-01 10:0x' AS TIMESTAMP)").await?.collect().await.expect_err("bad");
        assert!(e.to_string().contains("'2024-01-01 10:0x'"), "{e}");
        Ok(())
    }
}
