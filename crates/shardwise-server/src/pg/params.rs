//! Bind parameters (`$1`, `$2`, ...) of the extended protocol, as drivers send them (psycopg's
//! `cur.execute("... WHERE a = %s", (1,))`): each value becomes a SQL literal spliced into the
//! statement where its placeholder was, typed by the parameter type the client declared
//! (`CAST('42' AS BIGINT)`), or a plain string literal when it declared none.
//!
//! Values never become SQL text of their own: a value is always one quoted string literal with
//! its quotes doubled (the dialect shardwise parses takes no backslash escapes), and only the
//! placeholder tokens the tokenizer found are replaced; the rest of the statement is kept byte
//! for byte.

use chrono::{DateTime, FixedOffset, NaiveDate, NaiveDateTime};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
use pgwire::api::Type;
use pgwire::api::portal::Portal;
use pgwire::error::PgWireResult;
use rust_decimal::Decimal;
use shardwise_query::sql_split::LineStarts;
use shardwise_query::sql_text::string_literal;

use super::Statement;
use super::errors::{error, syntax_error};

/// The SQL type a literal of PostgreSQL type `ty` is cast to; `None`: left a string literal.
fn sql_type(ty: &Type) -> Option<&'static str> {
    Some(match *ty {
        Type::BOOL => "BOOLEAN",
        Type::INT2 => "SMALLINT",
        Type::INT4 => "INT",
        Type::INT8 => "BIGINT",
        Type::FLOAT4 => "REAL",
        Type::FLOAT8 => "DOUBLE",
        Type::NUMERIC => "DECIMAL(38, 10)",
        Type::DATE => "DATE",
        Type::TIMESTAMP => "TIMESTAMP",
        Type::TIMESTAMPTZ => "TIMESTAMP",
        _ => return None,
    })
}

/// The literal of parameter `index` of `portal`, read in the format the client sent it.
fn literal(portal: &Portal<Statement>, index: usize, ty: &Type) -> PgWireResult<String> {
    let text: Option<String> = match *ty {
        Type::BOOL => portal.parameter::<bool>(index, ty)?.map(|v| v.to_string()),
        Type::INT2 => portal.parameter::<i16>(index, ty)?.map(|v| v.to_string()),
        Type::INT4 => portal.parameter::<i32>(index, ty)?.map(|v| v.to_string()),
        Type::INT8 => portal.parameter::<i64>(index, ty)?.map(|v| v.to_string()),
        Type::FLOAT4 => portal.parameter::<f32>(index, ty)?.map(|v| v.to_string()),
        Type::FLOAT8 => portal.parameter::<f64>(index, ty)?.map(|v| v.to_string()),
        Type::NUMERIC => portal.parameter::<Decimal>(index, ty)?.map(|v| v.to_string()),
        Type::DATE => portal.parameter::<NaiveDate>(index, ty)?.map(|v| v.to_string()),
        Type::TIMESTAMP => portal.parameter::<NaiveDateTime>(index, ty)?.map(|v| v.to_string()),
        Type::TIMESTAMPTZ => portal.parameter::<DateTime<FixedOffset>>(index, ty)?.map(|v| v.naive_utc().to_string()),
        _ => portal.parameter::<String>(index, &Type::TEXT)?,
    };
    Ok(match (text, sql_type(ty)) {
        (None, _) => "NULL".to_string(),
        (Some(v), Some(cast)) => format!("CAST({} AS {cast})", string_literal(&v)),
        (Some(v), None) => string_literal(&v),
    })
}

/// A NULL of the parameter type the client declared, for planning a statement without its values.
pub fn null_of(ty: Option<&Type>) -> String {
    match ty.and_then(sql_type) {
        Some(cast) => format!("CAST(NULL AS {cast})"),
        None => "NULL".to_string(),
    }
}

/// How many parameters `sql` uses: its highest `$n`.
pub fn count(sql: &str) -> PgWireResult<usize> {
    let dialect = GenericDialect {};
    let tokens = Tokenizer::new(&dialect, sql)
        .tokenize()
        .map_err(|e| syntax_error(format!("cannot read the statement: {e}")))?;
    Ok(tokens
        .iter()
        .filter_map(|t| match t {
            Token::Placeholder(name) => name.strip_prefix('$').and_then(|n| n.parse::<usize>().ok()),
            _ => None,
        })
        .max()
        .unwrap_or(0))
}

/// The portal's statement with its parameters spliced in.
pub fn bind(portal: &Portal<Statement>) -> PgWireResult<String> {
    let declared = &portal.statement.parameter_types;
    let literals = (0..portal.parameter_len())
        .map(|i| literal(portal, i, declared.get(i).cloned().flatten().as_ref().unwrap_or(&Type::UNKNOWN)))
        .collect::<PgWireResult<Vec<_>>>()?;
    splice(&portal.statement.statement.sql, &literals)
}

/// `sql` with each `$n` replaced by `literals[n - 1]`.
pub fn splice(sql: &str, literals: &[String]) -> PgWireResult<String> {
    let dialect = GenericDialect {};
    let tokens = Tokenizer::new(&dialect, sql)
        .tokenize_with_location()
        .map_err(|e| syntax_error(format!("cannot read the statement: {e}")))?;
    let lines = LineStarts::new(sql);
    let mut out = String::with_capacity(sql.len());
    let mut copied = 0;
    for token in &tokens {
        let Token::Placeholder(name) = &token.token else { continue };
        let number: usize = name
            .strip_prefix('$')
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| error("42P02", format!("parameter {name}: only $1, $2, ... are supported")))?;
        let value = number.checked_sub(1).and_then(|i| literals.get(i)).ok_or_else(|| {
            error("08P01", format!("the statement uses ${number} but {} parameters were bound", literals.len()))
        })?;
        let (start, end) = (lines.offset(token.span.start), lines.offset(token.span.end));
        out.push_str(&sql[copied..start]);
        out.push_str(value);
        copied = end;
    }
    out.push_str(&sql[copied..]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splices_literals_where_the_placeholders_were() {
        let sql = "SELECT '$1', a FROM t WHERE a = $1 AND b = $2 -- $3\n";
        let out = splice(sql, &["CAST('1' AS BIGINT)".into(), string_literal("it's")]).unwrap();
        assert_eq!(out, "SELECT '$1', a FROM t WHERE a = CAST('1' AS BIGINT) AND b = 'it''s' -- $3\n");
    }

    #[test]
    fn a_value_stays_one_literal() {
        let hostile = string_literal("x'; DROP TABLE t; --");
        let out = splice("SELECT $1", &[hostile]).unwrap();
        let tokens = Tokenizer::new(&GenericDialect {}, &out).tokenize().unwrap();
        let strings: Vec<_> = tokens
            .iter()
            .filter_map(|t| if let Token::SingleQuotedString(s) = t { Some(s.clone()) } else { None })
            .collect();
        assert_eq!(strings, vec!["x'; DROP TABLE t; --".to_string()]);
        assert!(!tokens.iter().any(|t| matches!(t, Token::SemiColon)));
    }

    #[test]
    fn too_few_parameters_is_an_error() {
        assert!(splice("SELECT $2", &["1".into()]).is_err());
    }
}
