//! ClickHouse's trailing `FORMAT name` clause (`SELECT ... FORMAT CSV`): the output format of a
//! statement, for the clients that write the rows out (as text, or as Arrow IPC stream bytes).
//!
//! The HTTP API and `shardwise sql` take it off the statement before it is planned and write the
//! answer in that format, as ClickHouse's HTTP interface and clickhouse-client do. Over
//! PostgreSQL and Flight SQL the rows travel typed and the client formats them, so a statement
//! that still carries the clause is refused there rather than answered in another format than
//! the one asked for (DataFusion's parser would accept the clause and ignore it).

use datafusion::sql::sqlparser::tokenizer::Token;

use crate::error::QueryError;
use crate::settings::{byte_offset, significant, starts_settings_clause, tokens};
use crate::sql_text::mentions;

/// An output format a `FORMAT` clause can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClauseFormat {
    /// `CSV` (no header, as in ClickHouse) or `CSVWithNames` (a header row).
    Csv { header: bool },
    /// `TabSeparated` (`TSV`, no header) or `TabSeparatedWithNames` (`TSVWithNames`).
    Tsv { header: bool },
    /// `JSONEachRow` (also `JSONLines`, `NDJSON`): one JSON object per row and line.
    JsonEachRow,
    /// `ArrowStream`: an Arrow IPC stream.
    ArrowStream,
    /// `Pretty` (also `PrettyCompact`): an aligned text table.
    Pretty,
}

/// The names accepted, for error messages.
pub const FORMAT_NAMES: &str = "CSV, CSVWithNames, TabSeparated (TSV), TabSeparatedWithNames (TSVWithNames), JSONEachRow (JSONLines, \
     NDJSON), ArrowStream, Pretty (PrettyCompact; shardwise sql only, not over HTTP)";

impl ClauseFormat {
    /// The format `name` stands for (case-insensitive).
    pub fn from_name(name: &str) -> Result<ClauseFormat, QueryError> {
        match name.to_ascii_lowercase().as_str() {
            "csv" => Ok(ClauseFormat::Csv { header: false }),
            "csvwithnames" => Ok(ClauseFormat::Csv { header: true }),
            "tabseparated" | "tsv" => Ok(ClauseFormat::Tsv { header: false }),
            "tabseparatedwithnames" | "tsvwithnames" => Ok(ClauseFormat::Tsv { header: true }),
            "jsoneachrow" | "jsonlines" | "ndjson" => Ok(ClauseFormat::JsonEachRow),
            "arrowstream" => Ok(ClauseFormat::ArrowStream),
            "pretty" | "prettycompact" => Ok(ClauseFormat::Pretty),
            _ => Err(QueryError::Rejected(format!(
                "FORMAT {name}: not a format shardwise writes; accepted: {FORMAT_NAMES}"
            ))),
        }
    }
}

/// Takes a trailing `FORMAT name` off `sql` (before or after a `SETTINGS` clause): the statement
/// without it, and the format if there was one.
pub fn split_format_clause(sql: &str) -> Result<(String, Option<ClauseFormat>), QueryError> {
    if !mentions(sql, "format") {
        return Ok((sql.to_string(), None));
    }
    let all = tokens(sql)?;
    let mut toks = significant(&all);
    if toks.last().is_some_and(|t| t.token == Token::SemiColon) {
        toks.pop();
    }
    let mut depth = 0i32;
    for (i, t) in toks.iter().enumerate() {
        match &t.token {
            Token::LParen => depth += 1,
            Token::RParen => depth -= 1,
            Token::Word(w) if depth == 0 && w.quote_style.is_none() && w.value.eq_ignore_ascii_case("format") => {
                let Some(Token::Word(name)) = toks.get(i + 1).map(|t| &t.token) else { continue };
                // The clause ends the statement, or a SETTINGS clause follows it.
                let ends = match toks.get(i + 2) {
                    None => true,
                    Some(next) => {
                        matches!(&next.token, Token::Word(w) if w.value.eq_ignore_ascii_case("settings"))
                            && starts_settings_clause(&toks, i + 2)
                    }
                };
                if !ends {
                    continue;
                }
                let format = ClauseFormat::from_name(&name.value)?;
                let (start, end) = (t.span.start, toks[i + 1].span.end);
                let from = byte_offset(sql, start.line, start.column);
                let to = byte_offset(sql, end.line, end.column);
                let body = format!("{} {}", sql[..from].trim_end(), sql[to..].trim_start());
                return Ok((body.trim().to_string(), Some(format)));
            }
            _ => {}
        }
    }
    Ok((sql.to_string(), None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clause_is_taken_off_where_clickhouse_puts_it() {
        let split = |sql: &str| split_format_clause(sql).unwrap();
        assert_eq!(split("SELECT 1 FORMAT CSV"), ("SELECT 1".into(), Some(ClauseFormat::Csv { header: false })));
        assert_eq!(split("SELECT 1 format csvwithnames;").1, Some(ClauseFormat::Csv { header: true }));
        assert_eq!(
            split("SELECT 1 FORMAT JSONEachRow SETTINGS max_memory_usage = 5"),
            ("SELECT 1 SETTINGS max_memory_usage = 5".into(), Some(ClauseFormat::JsonEachRow))
        );
        assert_eq!(split("SELECT 1\nFORMAT ArrowStream").1, Some(ClauseFormat::ArrowStream));
        for untouched in [
            "SELECT 1",
            "EXPLAIN FORMAT tree SELECT 1",
            "SELECT format FROM t",
            "SELECT format('%s', x) FROM t",
            "SELECT * FROM (SELECT 1 FORMAT CSV) t",
            "SELECT 'FORMAT CSV'",
        ] {
            assert_eq!(split(untouched), (untouched.to_string(), None), "{untouched}");
        }
    }

    #[test]
    fn an_unknown_format_names_the_accepted_ones() {
        let err = split_format_clause("SELECT 1 FORMAT Parquet").unwrap_err().to_string();
        assert!(err.contains("FORMAT Parquet") && err.contains("CSVWithNames"), "{err}");
    }
}
