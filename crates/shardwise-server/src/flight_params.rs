//! Parameters of Flight SQL prepared statements, as ADBC and JDBC bind them: the client sends
//! the values as Arrow rows (`DoPut` on the prepared statement), one row per execution.
//!
//! The service is stateless: a prepared statement's handle is its SQL. A query's one row of
//! values is spliced into that SQL as literals ([`shardwise_query::placeholders`]), and the
//! statement's new handle, which Flight SQL lets a server return for exactly this, carries both
//! the SQL as prepared and the spliced text ([`Handle`]): the client's `GetFlightInfo` runs the
//! spliced text, and values bound again later are spliced into the SQL as prepared. The rows an
//! `executemany` sends for `INSERT ... VALUES (?, ...)` become one insert of many rows (stored from
//! their Arrow columns when the values are the placeholders alone: `crate::bound_insert`)
//! ([`values_row`]); another update runs once per row sent, in order, and reports the rows
//! affected in all, a row that fails stopping it with the rows before it applied (there are no
//! transactions).

use arrow::array::RecordBatch;
use arrow_flight::decode::DecodedPayload;
use arrow_flight::sql::server::PeekableFlightDataStream;
use datafusion::common::ScalarValue;
use datafusion::logical_expr::Expr;
use datafusion::sql::unparser::Unparser;
use futures::{StreamExt, TryStreamExt};
use shardwise_query::placeholders::{self, PlaceholderError, Style};
use tonic::Status;

/// Start of a handle that carries bound values (a plain handle is SQL, which cannot start so).
const BOUND_HANDLE_PREFIX: &[u8] = b"\0shardwise-bound-v1\0";

/// A prepared statement's handle: the SQL as prepared, and the SQL with its values once bound.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Handle {
    pub sql: String,
    pub bound: Option<String>,
}

impl Handle {
    pub fn parse(bytes: &[u8]) -> Result<Handle, Status> {
        match bytes.strip_prefix(BOUND_HANDLE_PREFIX) {
            Some(json) => serde_json::from_slice(json)
                .map_err(|e| Status::invalid_argument(format!("not a prepared statement handle of this server: {e}"))),
            None => std::str::from_utf8(bytes)
                .map(|sql| Handle { sql: sql.to_string(), bound: None })
                .map_err(|_| Status::invalid_argument("statement is not UTF-8")),
        }
    }

    /// The handle of this statement bound as `bound`.
    pub fn with_bound(&self, bound: String) -> Result<Vec<u8>, Status> {
        let handle = Handle { sql: self.sql.clone(), bound: Some(bound) };
        let json = serde_json::to_vec(&handle).map_err(|e| Status::internal(format!("cannot encode a handle: {e}")))?;
        Ok([BOUND_HANDLE_PREFIX, &json].concat())
    }

    /// What runs: the bound SQL, else the SQL as prepared.
    pub fn runnable(&self) -> &str {
        self.bound.as_deref().unwrap_or(&self.sql)
    }
}

/// The rows of values a `DoPut` on a prepared statement carries.
pub async fn bound_rows(stream: PeekableFlightDataStream) -> Result<Vec<RecordBatch>, Status> {
    let mut decoder = crate::flight_decode::decoded(stream.map_err(Into::into));
    let mut batches = Vec::new();
    while let Some(message) = decoder.next().await {
        let message = message.map_err(|e| Status::invalid_argument(format!("the bound parameters: {e}")))?;
        if let DecodedPayload::RecordBatch(batch) = message.payload
            && batch.num_rows() > 0
        {
            batches.push(batch);
        }
    }
    Ok(batches)
}

/// `sql` with the values of `row` of `batch` spliced in for its placeholders, one value per
/// placeholder.
pub fn bind_row(sql: &str, batch: &RecordBatch, row: usize) -> Result<String, Status> {
    let wanted = placeholders::count(sql, Style::DollarOrQuestionMark).map_err(placeholder_status)?;
    if batch.num_columns() != wanted {
        return Err(Status::invalid_argument(format!(
            "{} values were bound, the statement takes {wanted}",
            batch.num_columns()
        )));
    }
    let unparser = Unparser::default();
    let literals = batch
        .columns()
        .iter()
        .enumerate()
        .map(|(index, column)| {
            let value = ScalarValue::try_from_array(column, row).map_err(|e| parameter_error(index, column, e))?;
            if let Some(literal) = typed_literal(&value) {
                return Ok(literal);
            }
            unparser
                .expr_to_sql(&Expr::Literal(value, None))
                .map(|literal| literal.to_string())
                .map_err(|e| parameter_error(index, column, e))
        })
        .collect::<Result<Vec<_>, Status>>()?;
    placeholders::splice(sql, &literals, Style::DollarOrQuestionMark).map_err(placeholder_status)
}

/// Floats and decimals written as a cast of their exact text, where a bare literal would change
/// them: DataFusion's unparser writes NaN and infinities as `nan` and `inf` (read back as column
/// names), a large double in full (`1e308` as a 309-digit number, read back as a DECIMAL too wide
/// to plan), and a decimal as a number the planner reads as a DOUBLE (its low digits lost). `None`
/// for other values, NULLs included.
fn typed_literal(value: &ScalarValue) -> Option<String> {
    // Rust's `Debug` of a float is the shortest text that reads back as the same value, with
    // `NaN`, `inf` and `-inf` spelled as Arrow's cast from text accepts them.
    let float = |text: String, sql_type: &str| Some(format!("CAST('{text}' AS {sql_type})"));
    match value {
        ScalarValue::Float64(Some(v)) => float(format!("{v:?}"), "DOUBLE"),
        ScalarValue::Float32(Some(v)) => float(format!("{v:?}"), "REAL"),
        ScalarValue::Float16(Some(v)) => float(format!("{:?}", v.to_f32()), "REAL"),
        ScalarValue::Decimal128(Some(_), precision, scale) | ScalarValue::Decimal256(Some(_), precision, scale) => {
            Some(format!("CAST('{value}' AS DECIMAL({precision}, {scale}))"))
        }
        _ => None,
    }
}

/// For `INSERT ... VALUES (...)` with one row whose values hold every placeholder and nothing
/// after it: the text up to the row and the row's text, so that the rows of an `executemany`
/// become one insert of many rows (written at once, all or nothing) instead of one insert each.
pub fn values_row(sql: &str) -> Option<(&str, &str)> {
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::keywords::Keyword;
    use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
    let tokens = Tokenizer::new(&GenericDialect {}, sql).tokenize_with_location().ok()?;
    let lines = shardwise_query::sql_split::LineStarts::new(sql);
    let significant: Vec<_> = tokens.iter().filter(|t| !matches!(t.token, Token::Whitespace(_))).collect();
    let is_keyword = |t: &Token, k: Keyword| matches!(t, Token::Word(w) if w.keyword == k);
    if !significant.first().is_some_and(|t| is_keyword(&t.token, Keyword::INSERT)) {
        return None;
    }
    let values = significant.iter().rposition(|t| is_keyword(&t.token, Keyword::VALUES))?;
    let open = significant.get(values + 1).filter(|t| t.token == Token::LParen)?;
    let mut depth = 0usize;
    let mut close = None;
    for (index, t) in significant.iter().enumerate().skip(values + 1) {
        match t.token {
            Token::LParen => depth += 1,
            Token::RParen => {
                depth -= 1;
                if depth == 0 {
                    close = Some(index);
                    break;
                }
            }
            _ => {}
        }
    }
    let close = close?;
    if !significant[close + 1..].iter().all(|t| t.token == Token::SemiColon) {
        return None;
    }
    let start = lines.offset(open.span.start);
    let end = lines.offset(significant[close].span.end);
    let (before, row) = (&sql[..start], &sql[start..end]);
    let in_before = placeholders::count(before, Style::DollarOrQuestionMark).ok()?;
    (in_before == 0).then_some((before, row))
}

/// `sql` with a NULL for each placeholder: planned to describe a prepared statement's result
/// before its values are known.
pub fn with_nulls(sql: &str) -> Result<Option<String>, Status> {
    match placeholders::count(sql, Style::DollarOrQuestionMark).map_err(placeholder_status)? {
        0 => Ok(None),
        n => placeholders::splice(sql, &vec!["NULL".to_string(); n], Style::DollarOrQuestionMark)
            .map(Some)
            .map_err(placeholder_status),
    }
}

fn parameter_error(index: usize, column: &arrow::array::ArrayRef, e: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("parameter {} of type {} cannot be bound: {e}", index + 1, column.data_type()))
}

fn placeholder_status(e: PlaceholderError) -> Status {
    Status::invalid_argument(e.to_string())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Date32Array, Float64Array, Int64Array, StringArray};

    use super::*;

    #[test]
    fn a_row_of_values_becomes_literals() {
        let batch = RecordBatch::try_from_iter([
            ("a", Arc::new(Int64Array::from(vec![Some(5), None])) as ArrayRef),
            ("b", Arc::new(StringArray::from(vec!["it's; DROP TABLE t", "x"])) as ArrayRef),
            ("c", Arc::new(Float64Array::from(vec![1.5, 2.0])) as ArrayRef),
            ("d", Arc::new(Date32Array::from(vec![19_753, 0])) as ArrayRef),
        ])
        .unwrap();
        let sql = bind_row("SELECT * FROM t WHERE a = ? AND b = ? AND c = $3 AND d = $4", &batch, 0).unwrap();
        assert!(
            sql.starts_with(
                "SELECT * FROM t WHERE a = 5 AND b = 'it''s; DROP TABLE t' AND c = CAST('1.5' AS DOUBLE) AND d = "
            ),
            "{sql}"
        );
        assert!(sql.contains("2024-01-31"), "{sql}");
        assert!(bind_row("SELECT ?, ?, ?, ?", &batch, 1).unwrap().contains("NULL"));
        assert!(bind_row("SELECT ?", &batch, 0).unwrap_err().message().contains("4 values were bound"));
        // A bound handle keeps the SQL as prepared, for values bound again.
        let handle = Handle::parse(b"SELECT ?").unwrap();
        let bound = Handle::parse(&handle.with_bound("SELECT 5".into()).unwrap()).unwrap();
        assert_eq!((bound.sql.as_str(), bound.runnable()), ("SELECT ?", "SELECT 5"));
        assert_eq!(with_nulls("SELECT ? + $2").unwrap().as_deref(), Some("SELECT NULL + NULL"));
        assert_eq!(with_nulls("SELECT 1").unwrap(), None);
        // An executemany of one-row VALUES becomes one insert of many rows.
        assert_eq!(values_row("INSERT INTO t VALUES (?, ?);"), Some(("INSERT INTO t VALUES ", "(?, ?)")));
        assert_eq!(
            values_row("insert into t (a, b) values ($1, f($2))"),
            Some(("insert into t (a, b) values ", "($1, f($2))"))
        );
        assert_eq!(values_row("INSERT INTO t SELECT ?"), None);
        assert_eq!(values_row("INSERT INTO t VALUES (?) ON CONFLICT DO NOTHING"), None);
        assert_eq!(values_row("SELECT * FROM (VALUES (?))"), None);
    }

    /// Values that a bare literal would change come back exactly: NaN and infinities (which were
    /// read as the columns `nan` and `inf`), a double near its largest, a decimal of 29 digits.
    #[tokio::test]
    async fn floats_and_decimals_are_bound_exactly() {
        use arrow::array::{Decimal128Array, Float32Array};
        use datafusion::prelude::SessionContext;
        let doubles = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1e308, -0.0, 0.1, f64::MIN_POSITIVE];
        let decimal = Decimal128Array::from(vec![12_345_678_901_234_567_890_123_456_789i128])
            .with_precision_and_scale(38, 9)
            .unwrap();
        let batch = RecordBatch::try_from_iter([
            ("d", Arc::new(Float64Array::from(vec![f64::NAN])) as ArrayRef),
            ("f", Arc::new(Float32Array::from(vec![f32::NAN])) as ArrayRef),
            ("m", Arc::new(decimal) as ArrayRef),
        ])
        .unwrap();
        let ctx = SessionContext::new();
        for (row, want) in doubles.iter().enumerate() {
            let doubles =
                RecordBatch::try_from_iter([("d", Arc::new(Float64Array::from(vec![*want])) as ArrayRef)]).unwrap();
            let sql = bind_row("SELECT ? AS v", &doubles, 0).unwrap();
            let got = ctx.sql(&sql).await.unwrap().collect().await.unwrap();
            let got = got[0].column(0).as_any().downcast_ref::<Float64Array>().unwrap().value(0);
            assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "row {row}: {sql} gave {got}");
        }
        let sql = bind_row("SELECT ? AS d, ? AS f, ? AS m", &batch, 0).unwrap();
        let got = ctx.sql(&sql).await.unwrap().collect().await.unwrap();
        let f = got[0].column(1).as_any().downcast_ref::<Float32Array>().unwrap().value(0);
        assert!(f.is_nan(), "{sql}");
        let m = got[0].column(2).as_any().downcast_ref::<Decimal128Array>().unwrap();
        assert_eq!((m.value(0), m.precision(), m.scale()), (12_345_678_901_234_567_890_123_456_789, 38, 9), "{sql}");
    }
}
