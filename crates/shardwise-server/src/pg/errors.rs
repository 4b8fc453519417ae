//! Engine errors as PostgreSQL errors: each [`QueryError`] gets the SQLSTATE a PostgreSQL client
//! would act on (`42601` syntax error, `42P01` unknown table, `0A000` not supported, `57014`
//! canceled, `XX000` internal, ...), and the message shardwise would print anywhere else.

use datafusion::arrow::error::ArrowError;
use datafusion::error::DataFusionError;
use pgwire::error::{ErrorInfo, PgWireError};
use shardwise_query::QueryError;

/// An `ERROR` with `code` and `message`.
pub fn error(code: &str, message: String) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new("ERROR".to_string(), code.to_string(), message)))
}

/// `42601 syntax_error`.
pub fn syntax_error(message: String) -> PgWireError {
    error("42601", message)
}

/// The PostgreSQL error of an engine error.
pub fn pg_error(e: QueryError) -> PgWireError {
    let code = sqlstate(&e);
    if !e.is_user_error() {
        tracing::warn!(error = %e, "postgres query failed");
    }
    error(code, e.to_string())
}

fn sqlstate(e: &QueryError) -> &'static str {
    let message = e.to_string();
    let has = |s: &str| message.contains(s);
    match e {
        QueryError::Invalid(df) => match df.find_root() {
            DataFusionError::SQL(..) => "42601",
            DataFusionError::SchemaError(..) if has("not found") || has("No field named") => "42703",
            DataFusionError::Plan(..) if has("table") && has("not found") => "42P01",
            DataFusionError::Plan(..) | DataFusionError::SchemaError(..) => "42000",
            DataFusionError::ArrowError(a, _) => match a.as_ref() {
                ArrowError::DivideByZero => "22012",
                ArrowError::CastError(_) if out_of_range(&message) => "22003",
                ArrowError::CastError(_) | ArrowError::ParseError(_) => "22P02",
                ArrowError::ArithmeticOverflow(_) => "22003",
                // `CAST(1234.5 AS DECIMAL(5, 2))`: "... is too large to store in a Decimal128 ...".
                ArrowError::InvalidArgumentError(_) if out_of_range(&message) => "22003",
                _ => "22000",
            },
            DataFusionError::NotImplemented(..) => "0A000",
            _ if out_of_range(&message) => "22003",
            _ if bad_text(&message) => "22P02",
            _ => "22000",
        },
        QueryError::Unsupported(_) => "0A000",
        QueryError::Rejected(_) if e.stopped().is_some() => "57014",
        QueryError::Rejected(_) if has("already exists") => "42P07",
        QueryError::Rejected(_) if has("unknown table option") => "22023",
        QueryError::Rejected(_) if has("unknown table") || has("does not exist") => "42P01",
        // An error of a fragment another node ran arrives as its text.
        QueryError::Rejected(_) if has(shardwise_query::error::DIVISION_BY_ZERO) || has("Divide by zero") => "22012",
        // A value that does not fit its column, or text that is not a value of its type.
        QueryError::Rejected(_) if out_of_range(&message) => "22003",
        QueryError::Rejected(_) if bad_text(&message) => "22P02",
        QueryError::Rejected(_) => "22023",
        QueryError::BadSetting(_) if has("unknown setting") => "42704",
        QueryError::BadSetting(_) => "22023",
        // The cluster cannot serve the statement now; it may later.
        QueryError::Unavailable(_) => "57P03",
        QueryError::Internal(_) => "XX000",
        QueryError::Storage(_) => "58030",
    }
}

/// Arrow's and DataFusion's words for a number that does not fit its type (`22003
/// numeric_value_out_of_range`).
fn out_of_range(message: &str) -> bool {
    ["Can't cast value", "Overflow", "overflow", "out of range", "too large to store"]
        .iter()
        .any(|w| message.contains(w))
}

/// Their words for text that is not a value of the type asked for (`22P02
/// invalid_text_representation`).
fn bad_text(message: &str) -> bool {
    ["Cast error", "Cannot cast string", "Parser error", "is not a valid"].iter().any(|w| message.contains(w))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(e: QueryError) -> String {
        match pg_error(e) {
            PgWireError::UserError(info) => info.code,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_decimal_cast_that_does_not_fit_is_out_of_range() {
        let arrow = ArrowError::InvalidArgumentError(
            "123450 is too large to store in a Decimal128 of precision 5. Max is 99999".into(),
        );
        assert_eq!(code(QueryError::from(DataFusionError::ArrowError(Box::new(arrow), None))), "22003");
    }

    #[test]
    fn classes_map_to_sqlstates() {
        assert_eq!(code(QueryError::Unsupported("x".into())), "0A000");
        assert_eq!(code(QueryError::Rejected("table \"t\" already exists".into())), "42P07");
        assert_eq!(code(QueryError::Rejected("the query was stopped by KILL QUERY".into())), "57014");
        let timed_out = "shard 1: the query ran longer than max_execution_time_ms = 10 and was stopped";
        assert_eq!(code(QueryError::Rejected(timed_out.into())), "57014");
        // The form of a KILL statement is a mistake in it, not a cancel.
        assert_eq!(code(QueryError::Rejected("expected KILL QUERY WHERE query_id = '<id>'".into())), "22023");
        assert_eq!(code(QueryError::Unavailable("shard 1".into())), "57P03");
        assert_eq!(code(QueryError::Storage("disk".into())), "58030");
        let parse = DataFusionError::SQL(
            Box::new(datafusion::sql::sqlparser::parser::ParserError::ParserError("bad".into())),
            None,
        );
        assert_eq!(code(QueryError::Invalid(parse)), "42601");
        let zero = DataFusionError::ArrowError(Box::new(ArrowError::DivideByZero), None);
        assert_eq!(code(QueryError::Invalid(zero)), "22012");
        let todo = DataFusionError::NotImplemented("Unsupported SQL statement: DECLARE".into());
        assert_eq!(code(QueryError::Invalid(todo)), "0A000");
        let text = "INSERT INTO t: row 1, column n: Cast error: Cannot cast string 'x' to value of Int64 type";
        assert_eq!(code(QueryError::Rejected(text.into())), "22P02");
        let big = "ingest into t: column small: Cast error: Can't cast value 70000 to type Int16";
        assert_eq!(code(QueryError::Rejected(big.into())), "22003");
        assert_eq!(code(QueryError::Rejected("insert_quorum = 3: table t has 2 replicas".into())), "22023");
        // A bad option of a table is no missing table.
        let option = "unknown table option \"colour\"; accepted options: shard_key, shards";
        assert_eq!(code(QueryError::Rejected(option.into())), "22023");
        assert_eq!(code(QueryError::Rejected("unknown table nope".into())), "42P01");
    }
}
