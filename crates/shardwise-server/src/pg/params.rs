//! Bind parameters (`$1`, `$2`, ...) of the extended protocol, as drivers send them (psycopg's
//! `cur.execute("... WHERE a = %s", (1,))`): each value becomes a SQL literal spliced into the
//! statement where its placeholder was, typed by the parameter type the client declared
//! (`CAST('42' AS BIGINT)`), or a plain string literal when it declared none.
//!
//! Values never become SQL text of their own: a value is always one quoted string literal with
//! its quotes doubled (the dialect shardwise parses takes no backslash escapes), and only the
//! placeholder tokens the tokenizer found are replaced; the rest of the statement is kept byte
//! for byte.

use chrono::{DateTime, FixedOffset, NaiveDate, NaiveDateTime, NaiveTime};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
use pgwire::api::Type;
use pgwire::api::portal::Portal;
use pgwire::error::PgWireResult;
use rust_decimal::Decimal;
use shardwise_query::placeholders::{self, PlaceholderError, Style};
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
        Type::TIME => "TIME",
        Type::INTERVAL => "INTERVAL",
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
        Type::NUMERIC => return numeric_literal(portal, index, ty),
        Type::DATE => portal.parameter::<NaiveDate>(index, ty)?.map(|v| v.to_string()),
        Type::TIMESTAMP => portal.parameter::<NaiveDateTime>(index, ty)?.map(|v| v.to_string()),
        Type::TIMESTAMPTZ => portal.parameter::<DateTime<FixedOffset>>(index, ty)?.map(|v| v.naive_utc().to_string()),
        // Binary only: pgwire's text reader of `time` wants six fraction digits (`12:30:01.5`
        // fails), while the text itself casts as it is.
        Type::TIME if portal.parameter_format.is_binary(index) => {
            portal.parameter::<NaiveTime>(index, ty)?.map(|v| v.to_string())
        }
        Type::TIME => portal.parameter::<String>(index, &Type::TEXT)?,
        // Bytes as a hex literal (`X'6869'`), which holds any byte, a zero included.
        Type::BYTEA => {
            return Ok(match portal.parameter::<Vec<u8>>(index, ty)? {
                Some(bytes) => format!("X'{}'", bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()),
                None => "NULL".to_string(),
            });
        }
        // Binary: microseconds (i64), days (i32), months (i32), big-endian.
        Type::INTERVAL if portal.parameter_format.is_binary(index) => match &portal.parameters[index] {
            Some(bytes) => Some(interval_text(bytes).ok_or_else(|| bad_parameter(index, ty, "not 16 bytes"))?),
            None => None,
        },
        Type::UUID if portal.parameter_format.is_binary(index) => match &portal.parameters[index] {
            Some(bytes) => Some(uuid_text(bytes).ok_or_else(|| bad_parameter(index, ty, "not 16 bytes"))?),
            None => None,
        },
        _ if array_element(ty).is_some() => return array_literal(portal, index, ty),
        // Text in binary is its UTF-8 bytes.
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME => portal.parameter::<String>(index, &Type::TEXT)?,
        // Another type in binary: its bytes are not text, and reading them as such would splice
        // garbage (or a zero byte) into the statement.
        _ if portal.parameter_format.is_binary(index) => {
            return Err(bad_parameter(
                index,
                ty,
                "is sent in binary, which shardwise does not read for this type; send it as text",
            ));
        }
        _ => portal.parameter::<String>(index, &Type::TEXT)?,
    };
    if text.as_deref().is_some_and(|t| t.contains('\0')) {
        return Err(bad_parameter(index, ty, "holds a zero byte, which PostgreSQL text cannot hold"));
    }
    Ok(match (text, sql_type(ty)) {
        (None, _) => "NULL".to_string(),
        (Some(v), Some(cast)) => format!("CAST({} AS {cast})", string_literal(&v)),
        (Some(v), None) => string_literal(&v),
    })
}

/// A NUMERIC parameter as a DECIMAL literal of its own digits, read from its text (`1E-7` too)
/// or its binary form by shardwise: pgwire reads both through a 96-bit decimal, which rounded a
/// binary value past 28 digits without a word and refused such text.
fn numeric_literal(portal: &Portal<Statement>, index: usize, ty: &Type) -> PgWireResult<String> {
    let Some(bytes) = portal.parameters.get(index).cloned().flatten() else { return Ok("NULL".to_string()) };
    let text = match portal.parameter_format.is_binary(index) {
        true => numeric_binary_text(&bytes).ok_or_else(|| bad_parameter(index, ty, "is not a binary numeric"))?,
        false => String::from_utf8(bytes.to_vec()).map_err(|_| bad_parameter(index, ty, "is not UTF-8"))?,
    };
    decimal_literal(&text).map_err(|why| bad_parameter(index, ty, &why))
}

/// The most digits a DECIMAL holds.
const DECIMAL_DIGITS_MAX: usize = 38;

/// `text`, a number (`-12.50`, `1E+5`), as `CAST('...' AS DECIMAL(p, s))` with the precision and
/// scale its digits need (scale cut so that the precision stays within 38 digits); `Err` says why
/// it is none.
fn decimal_literal(text: &str) -> Result<String, String> {
    let text = text.trim();
    let plain = shardwise_query::text_values::without_exponent(text);
    let unsigned = plain.strip_prefix(['-', '+']).unwrap_or(&plain);
    let (whole, fraction) = unsigned.split_once('.').unwrap_or((unsigned, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if (whole.is_empty() && fraction.is_empty()) || !digits(whole) || !digits(fraction) {
        return Err(match text.to_ascii_lowercase().trim_start_matches(['-', '+']) {
            "nan" | "infinity" | "inf" => format!("is {text}, which a DECIMAL cannot hold"),
            _ => format!("{text:?} is not a number"),
        });
    }
    let whole_digits = whole.trim_start_matches('0').len();
    if whole_digits > DECIMAL_DIGITS_MAX {
        return Err(format!(
            "has {whole_digits} digits before the point; a DECIMAL holds at most {DECIMAL_DIGITS_MAX}"
        ));
    }
    let scale = fraction.len().min(DECIMAL_DIGITS_MAX - whole_digits);
    let precision = (whole_digits + scale).max(1);
    Ok(format!("CAST({} AS DECIMAL({precision}, {scale}))", string_literal(&plain)))
}

/// PostgreSQL's binary NUMERIC (digit count, weight, sign, display scale, then base-10000
/// digits, all 16-bit big-endian) as decimal text; `None` when the bytes are not one.
fn numeric_binary_text(bytes: &[u8]) -> Option<String> {
    let word = |at: usize| bytes.get(at..at + 2).map(|b| u16::from_be_bytes([b[0], b[1]]));
    let (count, weight, sign, scale) = (word(0)? as usize, i32::from(word(2)? as i16), word(4)?, word(6)? as usize);
    if bytes.len() != 8 + 2 * count || weight > 1000 || scale > 1000 {
        return None;
    }
    let negative = match sign {
        0x0000 => false,
        0x4000 => true,
        0xC000 => return Some("NaN".to_string()),
        0xD000 => return Some("Infinity".to_string()),
        0xF000 => return Some("-Infinity".to_string()),
        _ => return None,
    };
    let groups: Vec<u16> = (0..count).map(|i| word(8 + 2 * i)).collect::<Option<_>>()?;
    if groups.iter().any(|&g| g > 9999) {
        return None;
    }
    // Group i is worth 10000^(weight - i); groups outside the ones sent are zero.
    let group = |i: i32| usize::try_from(i).ok().and_then(|i| groups.get(i)).copied().unwrap_or(0);
    let whole: String = (0..=weight).map(|i| format!("{:04}", group(i))).collect();
    let whole = match whole.trim_start_matches('0') {
        "" => "0",
        digits => digits,
    };
    let mut fraction: String = (0..scale.div_ceil(4) as i32).map(|j| format!("{:04}", group(weight + 1 + j))).collect();
    fraction.truncate(scale);
    let sign = if negative { "-" } else { "" };
    Some(match fraction.is_empty() {
        true => format!("{sign}{whole}"),
        false => format!("{sign}{whole}.{fraction}"),
    })
}

/// `22P02`: parameter `$index+1` of type `ty` cannot be read.
fn bad_parameter(index: usize, ty: &Type, problem: &str) -> pgwire::error::PgWireError {
    error("22P02", format!("parameter ${} (type {}) {problem}", index + 1, ty.name()))
}

/// An interval's 16 binary bytes as text DataFusion reads (`1 months 2 days 3.000004 seconds`).
fn interval_text(bytes: &[u8]) -> Option<String> {
    let bytes: [u8; 16] = bytes.try_into().ok()?;
    let micros = i64::from_be_bytes(bytes[..8].try_into().ok()?);
    let days = i32::from_be_bytes(bytes[8..12].try_into().ok()?);
    let months = i32::from_be_bytes(bytes[12..].try_into().ok()?);
    let sign = if micros < 0 { "-" } else { "" };
    let (seconds, fraction) = (micros.unsigned_abs() / 1_000_000, micros.unsigned_abs() % 1_000_000);
    Some(format!("{months} months {days} days {sign}{seconds}.{fraction:06} seconds"))
}

/// A UUID's 16 bytes in its text form.
fn uuid_text(bytes: &[u8]) -> Option<String> {
    let bytes: [u8; 16] = bytes.try_into().ok()?;
    Some(uuid::Uuid::from_bytes(bytes).hyphenated().to_string())
}

/// The element type of a PostgreSQL array type shardwise reads as a parameter.
fn array_element(ty: &Type) -> Option<Type> {
    Some(match *ty {
        Type::BOOL_ARRAY => Type::BOOL,
        Type::INT2_ARRAY => Type::INT2,
        Type::INT4_ARRAY => Type::INT4,
        Type::INT8_ARRAY => Type::INT8,
        Type::FLOAT4_ARRAY => Type::FLOAT4,
        Type::FLOAT8_ARRAY => Type::FLOAT8,
        Type::NUMERIC_ARRAY => Type::NUMERIC,
        Type::TEXT_ARRAY => Type::TEXT,
        Type::VARCHAR_ARRAY => Type::VARCHAR,
        Type::DATE_ARRAY => Type::DATE,
        Type::TIMESTAMP_ARRAY => Type::TIMESTAMP,
        _ => return None,
    })
}

/// An array parameter (psycopg sends a Python list as one, as in `WHERE id = ANY(%s)`) as
/// `make_array(...)` of its elements' literals.
fn array_literal(portal: &Portal<Statement>, index: usize, ty: &Type) -> PgWireResult<String> {
    fn each<T: ToString>(values: Option<Vec<Option<T>>>) -> Option<Vec<Option<String>>> {
        values.map(|v| v.into_iter().map(|e| e.map(|e| e.to_string())).collect())
    }
    // In text format, the elements as PostgreSQL reads them (`""` is the empty string, a quoted
    // `"NULL"` the text NULL), each cast from its text below; in binary, as the type decodes.
    let text = match portal.parameter_format.is_binary(index) {
        true => None,
        false => portal.parameters.get(index).cloned().flatten(),
    };
    // A binary array's header says how many elements follow; the decoder reserves room for that
    // many before it reads them, so a 20-byte parameter claiming 2^31 elements made the node
    // ask for 32 GiB and abort. Each element takes at least its 4-byte length.
    if portal.parameter_format.is_binary(index)
        && let Some(Some(bytes)) = portal.parameters.get(index)
    {
        binary_array_fits(bytes).map_err(|why| bad_parameter(index, ty, &why))?;
    }
    let elements = match (text, ty.clone()) {
        (Some(bytes), _) => {
            let text = std::str::from_utf8(&bytes).map_err(|_| bad_parameter(index, ty, "is not UTF-8"))?;
            Some(shardwise_query::array_literals::parse(text).map_err(|e| bad_parameter(index, ty, &e))?)
        }
        (None, Type::BOOL_ARRAY) => each(portal.parameter::<Vec<Option<bool>>>(index, ty)?),
        (None, Type::INT2_ARRAY) => each(portal.parameter::<Vec<Option<i16>>>(index, ty)?),
        (None, Type::INT4_ARRAY) => each(portal.parameter::<Vec<Option<i32>>>(index, ty)?),
        (None, Type::INT8_ARRAY) => each(portal.parameter::<Vec<Option<i64>>>(index, ty)?),
        (None, Type::FLOAT4_ARRAY) => each(portal.parameter::<Vec<Option<f32>>>(index, ty)?),
        (None, Type::FLOAT8_ARRAY) => each(portal.parameter::<Vec<Option<f64>>>(index, ty)?),
        (None, Type::NUMERIC_ARRAY) => each(portal.parameter::<Vec<Option<Decimal>>>(index, ty)?),
        (None, Type::DATE_ARRAY) => each(portal.parameter::<Vec<Option<NaiveDate>>>(index, ty)?),
        (None, Type::TIMESTAMP_ARRAY) => each(portal.parameter::<Vec<Option<NaiveDateTime>>>(index, ty)?),
        (None, _) => portal.parameter::<Vec<Option<String>>>(index, ty)?,
    };
    let Some(elements) = elements else { return Ok("NULL".to_string()) };
    let element = array_element(ty).unwrap_or(Type::TEXT);
    let cast = sql_type(&element).unwrap_or("VARCHAR");
    let literals: Vec<String> = elements
        .into_iter()
        .map(|e| match e {
            Some(v) if v.contains('\0') => Err(bad_parameter(index, ty, "holds a zero byte")),
            Some(v) => Ok(format!("CAST({} AS {cast})", string_literal(&v))),
            None => Ok(format!("CAST(NULL AS {cast})")),
        })
        .collect::<PgWireResult<_>>()?;
    // An empty list still has its element type.
    Ok(match literals.is_empty() {
        true => format!("CAST(make_array() AS {cast}[])"),
        false => format!("make_array({})", literals.join(", ")),
    })
}

/// Checks a binary array (dimension count, null flag, element type, then a length and lower bound
/// per dimension, then each element as a length and its bytes) claims no more elements than its
/// bytes can hold; `Err` says what is wrong.
fn binary_array_fits(bytes: &[u8]) -> Result<(), String> {
    let int = |at: usize| bytes.get(at..at + 4).map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]));
    let dimensions = int(0).ok_or("is not a binary array (shorter than its header)")?;
    let dimensions = usize::try_from(dimensions).map_err(|_| "has a negative dimension count".to_string())?;
    let header = 12usize.checked_add(dimensions.checked_mul(8).ok_or("has too many dimensions")?);
    let header = header.ok_or("has too many dimensions")?;
    let mut elements: u64 = if dimensions == 0 { 0 } else { 1 };
    for d in 0..dimensions {
        let length = int(12 + 8 * d).ok_or("is cut short in its dimensions")?;
        let length = u64::try_from(length).map_err(|_| "has a negative dimension length".to_string())?;
        elements = elements.saturating_mul(length);
    }
    let room = (bytes.len().saturating_sub(header) / 4) as u64;
    match elements <= room {
        true => Ok(()),
        false => Err(format!("claims {elements} elements, more than its {} bytes hold", bytes.len())),
    }
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
    placeholders::count(sql, Style::Dollar).map_err(placeholder_error)
}

/// A splicing failure as PostgreSQL reports it.
fn placeholder_error(e: PlaceholderError) -> pgwire::error::PgWireError {
    match e {
        PlaceholderError::Syntax(_) => syntax_error(e.to_string()),
        PlaceholderError::Unsupported(_) => error("42P02", e.to_string()),
        PlaceholderError::Missing { .. } => error("08P01", e.to_string()),
    }
}

/// The portal's statement with its parameters spliced in.
pub fn bind(portal: &Portal<Statement>) -> PgWireResult<String> {
    let declared = &portal.statement.parameter_types;
    let sql = &portal.statement.statement.sql;
    let in_any = any_operands(sql)?;
    let inferred = &portal.statement.statement.parameter_types;
    let literals = (0..portal.parameter_len())
        .map(|i| {
            // A value the client sent as text without a type stays text, for the statement to
            // read as its context needs; one sent in binary is read as the type the statement
            // was described with (asyncpg encodes by it).
            let ty = match declared.get(i).cloned().flatten() {
                Some(ty) => ty,
                None if portal.parameter_format.is_binary(i) => inferred.get(i).cloned().unwrap_or(Type::UNKNOWN),
                None => Type::UNKNOWN,
            };
            // An untyped `{a,b}` as the operand of ANY / ALL is a text array (psycopg sends a
            // list of strings so, as PostgreSQL infers it there).
            let text_array = matches!(ty, Type::UNKNOWN | Type::TEXT | Type::VARCHAR)
                && in_any.contains(&(i + 1))
                && !portal.parameter_format.is_binary(i)
                && portal.parameters.get(i).cloned().flatten().is_some_and(|v| v.starts_with(b"{"));
            match text_array {
                true => array_literal(portal, i, &Type::TEXT_ARRAY),
                false => literal(portal, i, &ty),
            }
        })
        .collect::<PgWireResult<Vec<_>>>()?;
    splice(sql, &literals)
}

/// The parameters (`$n`) written as the whole operand of `ANY (...)` or `ALL (...)`.
fn any_operands(sql: &str) -> PgWireResult<Vec<usize>> {
    let dialect = GenericDialect {};
    let tokens: Vec<Token> = Tokenizer::new(&dialect, sql)
        .tokenize()
        .map_err(|e| syntax_error(format!("cannot read the statement: {e}")))?
        .into_iter()
        .filter(|t| !matches!(t, Token::Whitespace(_)))
        .collect();
    Ok(tokens
        .windows(4)
        .filter_map(|w| match w {
            [Token::Word(word), Token::LParen, Token::Placeholder(name), Token::RParen]
                if word.value.eq_ignore_ascii_case("any") || word.value.eq_ignore_ascii_case("all") =>
            {
                name.strip_prefix('$').and_then(|n| n.parse().ok())
            }
            _ => None,
        })
        .collect())
}

/// `sql` with each `$n` replaced by `literals[n - 1]`.
pub fn splice(sql: &str, literals: &[String]) -> PgWireResult<String> {
    placeholders::splice(sql, literals, Style::Dollar).map_err(placeholder_error)
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
    fn any_operands_are_found() {
        assert_eq!(any_operands("SELECT 1 WHERE a = ANY($1) AND b = all ( $3 ) OR c = $2").unwrap(), vec![1, 3]);
        assert!(any_operands("SELECT ANY_VALUE($1)").unwrap().is_empty());
    }

    /// NUMERIC parameters keep every digit, whichever form they come in.
    #[test]
    fn numerics_keep_their_digits() {
        // 1234567890123456789012345678.0123456789 in PostgreSQL's binary form: weight 6, scale 10.
        let groups: [u16; 10] = [1234, 5678, 9012, 3456, 7890, 1234, 5678, 123, 4567, 8900];
        let mut bytes = vec![0, 10, 0, 6, 0x40, 0, 0, 10];
        bytes.extend(groups.iter().flat_map(|g| g.to_be_bytes()));
        assert_eq!(numeric_binary_text(&bytes).as_deref(), Some("-1234567890123456789012345678.0123456789"));
        // 0.0000001: weight -2, one group 10 (0.0000|0010), scale 7; 100000: weight 1, one group 10.
        assert_eq!(numeric_binary_text(&[0, 1, 0xFF, 0xFE, 0, 0, 0, 7, 0, 10]).as_deref(), Some("0.0000001"));
        assert_eq!(numeric_binary_text(&[0, 1, 0, 1, 0, 0, 0, 0, 0, 10]).as_deref(), Some("100000"));
        assert_eq!(numeric_binary_text(&[0, 0, 0, 0, 0, 0, 0, 2]).as_deref(), Some("0.00"));
        assert_eq!(numeric_binary_text(&[0, 0, 0, 0, 0xC0, 0, 0, 0]).as_deref(), Some("NaN"));
        assert_eq!(numeric_binary_text(&[0, 2, 0, 0, 0, 0, 0, 0, 0, 1]), None, "cut short");

        assert_eq!(decimal_literal("1E-7").unwrap(), "CAST('0.0000001' AS DECIMAL(7, 7))");
        assert_eq!(decimal_literal("1E+5").unwrap(), "CAST('100000' AS DECIMAL(6, 0))");
        assert_eq!(
            decimal_literal("-1234567890123456789012345678.0123456789").unwrap(),
            "CAST('-1234567890123456789012345678.0123456789' AS DECIMAL(38, 10))"
        );
        assert!(decimal_literal("NaN").unwrap_err().contains("which a DECIMAL cannot hold"));
        assert!(decimal_literal("1.2.3").unwrap_err().contains("is not a number"));
        assert!(decimal_literal(&"9".repeat(39)).unwrap_err().contains("39 digits before the point"));
    }

    /// A binary array claiming more elements than its bytes hold is refused before anything is
    /// reserved for them.
    #[test]
    fn binary_arrays_claim_no_more_than_their_bytes() {
        let header = |dims: &[i32]| {
            let mut bytes: Vec<u8> = [dims.len() as i32, 0, 20].iter().flat_map(|v| v.to_be_bytes()).collect();
            for d in dims {
                bytes.extend(d.to_be_bytes());
                bytes.extend(1i32.to_be_bytes());
            }
            bytes
        };
        let mut two = header(&[2]);
        for v in [7i64, 8] {
            two.extend(8i32.to_be_bytes());
            two.extend(v.to_be_bytes());
        }
        assert_eq!(binary_array_fits(&two), Ok(()));
        assert_eq!(binary_array_fits(&header(&[])), Ok(()), "an empty array");
        let e = binary_array_fits(&header(&[i32::MAX])).unwrap_err();
        assert!(e.contains("claims 2147483647 elements"), "{e}");
        assert!(binary_array_fits(&header(&[65536, 65536])).unwrap_err().contains("claims 4294967296"));
        assert!(binary_array_fits(&header(&[-1])).unwrap_err().contains("negative"));
        assert!(binary_array_fits(&[0, 0]).is_err());
    }

    #[test]
    fn too_few_parameters_is_an_error() {
        assert!(splice("SELECT $2", &["1".into()]).is_err());
    }
}
