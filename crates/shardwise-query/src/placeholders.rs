//! Bound parameters spliced into a statement's text, for the protocols whose drivers send a
//! statement with placeholders and its values apart: PostgreSQL's extended protocol (`$1`) and
//! Flight SQL prepared statements (`$1` or `?`, as ADBC and JDBC write them).
//!
//! Each value arrives here already written as one SQL literal (the caller's job, from the value's
//! type); only the placeholder tokens the tokenizer finds are replaced, so a literal can never
//! become SQL of its own and the rest of the statement is kept byte for byte.

use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};

use crate::sql_split::LineStarts;

/// Why parameters could not be spliced.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlaceholderError {
    #[error("cannot read the statement: {0}")]
    Syntax(String),
    #[error("parameter {0}: only $1, $2, ... and ? are supported")]
    Unsupported(String),
    #[error("the statement uses parameter {used} but {bound} parameters were bound")]
    Missing { used: usize, bound: usize },
}

/// Which placeholders a protocol has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// `$1`, `$2`, ... only (PostgreSQL).
    Dollar,
    /// `$n` or `?` (Flight SQL clients: ADBC and JDBC write `?`).
    DollarOrQuestionMark,
}

/// Which parameter each placeholder of `sql` takes, 1-based, in the order they appear: `$n` is
/// `n`, and each `?` the next after the `?`s before it.
fn numbered(sql: &str, style: Style) -> Result<Vec<(usize, std::ops::Range<usize>)>, PlaceholderError> {
    let dialect = GenericDialect {};
    let tokens =
        Tokenizer::new(&dialect, sql).tokenize_with_location().map_err(|e| PlaceholderError::Syntax(e.to_string()))?;
    let lines = LineStarts::new(sql);
    let mut question_marks = 0;
    let mut found = Vec::new();
    for token in &tokens {
        let Token::Placeholder(name) = &token.token else { continue };
        let number = match name.as_str() {
            "?" if style == Style::DollarOrQuestionMark => {
                question_marks += 1;
                question_marks
            }
            _ => name
                .strip_prefix('$')
                .and_then(|n| n.parse().ok())
                .filter(|&n: &usize| n > 0)
                .ok_or_else(|| PlaceholderError::Unsupported(name.clone()))?,
        };
        found.push((number, lines.offset(token.span.start)..lines.offset(token.span.end)));
    }
    Ok(found)
}

/// How many parameters `sql` takes: its highest `$n`, or its number of `?`.
pub fn count(sql: &str, style: Style) -> Result<usize, PlaceholderError> {
    Ok(numbered(sql, style)?.into_iter().map(|(n, _)| n).max().unwrap_or(0))
}

/// `sql` with each placeholder replaced by its parameter's literal (`literals[n - 1]`). A literal
/// that starts with `-` is put in parentheses, so that `-$1` with `-5` is not `--5`, a comment.
pub fn splice(sql: &str, literals: &[String], style: Style) -> Result<String, PlaceholderError> {
    let mut out = String::with_capacity(sql.len());
    let mut copied = 0;
    for (number, span) in numbered(sql, style)? {
        let value =
            literals.get(number - 1).ok_or(PlaceholderError::Missing { used: number, bound: literals.len() })?;
        out.push_str(&sql[copied..span.start]);
        match value.starts_with('-') {
            true => {
                out.push('(');
                out.push_str(value);
                out.push(')');
            }
            false => out.push_str(value),
        }
        copied = span.end;
    }
    out.push_str(&sql[copied..]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dollar_and_question_mark_placeholders() {
        use Style::{Dollar, DollarOrQuestionMark as Both};
        let literals = ["1".to_string(), "'a''b'".to_string()];
        assert_eq!(splice("SELECT $2, $1, '$1'", &literals, Dollar).unwrap(), "SELECT 'a''b', 1, '$1'");
        assert_eq!(splice("SELECT ? + ?, '?'", &literals, Both).unwrap(), "SELECT 1 + 'a''b', '?'");
        assert_eq!(count("SELECT ?, ?, ?", Both).unwrap(), 3);
        assert!(count("SELECT ?", Dollar).is_err(), "PostgreSQL has no ? placeholder");
        assert_eq!(count("SELECT $3", Dollar).unwrap(), 3);
        assert_eq!(splice("SELECT $3", &literals, Dollar), Err(PlaceholderError::Missing { used: 3, bound: 2 }));
        assert!(matches!(splice("SELECT $0", &literals, Dollar), Err(PlaceholderError::Unsupported(_))));
        // Offsets on a line with other characters than ASCII, and many placeholders on one line.
        assert_eq!(splice("SELECT 'é', $1", &literals, Dollar).unwrap(), "SELECT 'é', 1");
        let many = format!("VALUES ({})", vec!["?"; 20_000].join(", "));
        let started = std::time::Instant::now();
        assert_eq!(count(&many, Both).unwrap(), 20_000);
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
        // A negative value after a minus is not a comment.
        assert_eq!(splice("SELECT 1 -$1", &["-5".to_string()], Dollar).unwrap(), "SELECT 1 -(-5)");
    }
}
