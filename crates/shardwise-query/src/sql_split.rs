//! Splits a SQL script into statements on top-level `;`, using the tokenizer DataFusion's parser
//! uses, so a `;` inside a string, a quoted name or a comment is not a separator. Each statement
//! keeps the line it starts on, for error messages.

use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::tokenizer::{Location, Token, TokenWithSpan, Tokenizer};

/// One statement of a script, without its terminating `;`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqlStatement {
    pub text: String,
    /// 1-based line of the statement's first token (leading comments excluded).
    pub line: u64,
}

/// A script that cannot be tokenized (unterminated string or comment, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitError {
    /// Line where the failing statement starts.
    pub line: u64,
    pub message: String,
}

/// Splits a script into statements on `;` outside strings, quoted identifiers and comments.
/// Pieces holding only whitespace and comments are dropped. When the script cannot be tokenized,
/// the statements before the bad one are returned followed by one `Err`.
pub fn split_statements(src: &str) -> Vec<Result<SqlStatement, SplitError>> {
    let dialect = GenericDialect {};
    let mut tokens: Vec<TokenWithSpan> = Vec::new();
    let failure = Tokenizer::new(&dialect, src).tokenize_with_location_into_buf(&mut tokens).err();
    let lines = LineStarts::new(src);
    let mut out = Vec::new();
    let mut first: Option<Location> = None;
    for token in &tokens {
        match token.token {
            Token::SemiColon => {
                if let Some(start) = first.take() {
                    let end = lines.offset(token.span.start);
                    out.push(Ok(statement(src, lines.offset(start), end, start.line)));
                }
            }
            Token::Whitespace(_) | Token::EOF => {}
            _ => {
                if first.is_none() {
                    first = Some(token.span.start);
                }
            }
        }
    }
    match failure {
        None => {
            if let Some(start) = first {
                out.push(Ok(statement(src, lines.offset(start), src.len(), start.line)));
            }
        }
        Some(e) => out
            .push(Err(SplitError { line: first.map_or(e.location.line, |start| start.line), message: e.to_string() })),
    }
    out
}

/// True when `src` ends with a `;` outside strings and comments (ignoring what follows it that
/// is only whitespace or comments): the shell has a whole statement to run. An unterminated
/// string or comment is not complete.
pub fn is_complete(src: &str) -> bool {
    let mut tokens: Vec<TokenWithSpan> = Vec::new();
    if Tokenizer::new(&GenericDialect {}, src).tokenize_with_location_into_buf(&mut tokens).is_err() {
        return false;
    }
    let last = tokens.iter().rev().find(|t| !matches!(t.token, Token::Whitespace(_) | Token::EOF));
    matches!(last.map(|t| &t.token), Some(Token::SemiColon))
}

fn statement(src: &str, start: usize, end: usize, line: u64) -> SqlStatement {
    let text = src.get(start..end.max(start)).unwrap_or_default().trim_end();
    SqlStatement { text: text.to_string(), line }
}

/// Maps the tokenizer's (line, column) locations, both 1-based and counted in characters, to
/// byte offsets.
pub struct LineStarts<'a> {
    src: &'a str,
    starts: Vec<usize>,
    /// ASCII text, where a column is a byte count: no walk over the line's characters (a long
    /// line with many placeholders was quadratic).
    ascii: bool,
}

impl<'a> LineStarts<'a> {
    pub fn new(src: &'a str) -> Self {
        let mut starts = vec![0];
        starts.extend(src.match_indices('\n').map(|(i, _)| i + 1));
        LineStarts { src, starts, ascii: src.is_ascii() }
    }

    /// The byte offset of `location` (1-based line and character column).
    pub fn offset(&self, location: Location) -> usize {
        let line = usize::try_from(location.line.saturating_sub(1)).unwrap_or(usize::MAX);
        let Some(&line_start) = self.starts.get(line) else {
            return self.src.len();
        };
        let column = usize::try_from(location.column.saturating_sub(1)).unwrap_or(usize::MAX);
        if self.ascii {
            return line_start.saturating_add(column).min(self.src.len());
        }
        self.src[line_start..].char_indices().nth(column).map_or(self.src.len(), |(i, _)| line_start + i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statement_is_complete_at_a_semicolon_outside_strings_and_comments() {
        assert!(is_complete("SELECT 1;\n"));
        assert!(is_complete("SELECT 1; -- done\n"));
        assert!(!is_complete("SELECT 1\n"));
        assert!(!is_complete("SELECT ';\n"));
        assert!(!is_complete("SELECT 1 /* ; */\n"));
        assert!(is_complete("SELECT\n  1\n;"));
    }

    fn ok(pieces: Vec<Result<SqlStatement, SplitError>>) -> Vec<(String, u64)> {
        pieces
            .into_iter()
            .map(|p| match p {
                Ok(s) => (s.text, s.line),
                Err(e) => panic!("unexpected split error: {e:?}"),
            })
            .collect()
    }

    #[test]
    fn splits_on_top_level_semicolons() {
        let got = ok(split_statements("SELECT 1; SELECT 2;\nSELECT 3"));
        assert_eq!(got, [("SELECT 1".to_string(), 1), ("SELECT 2".to_string(), 1), ("SELECT 3".to_string(), 2)]);
    }

    #[test]
    fn semicolons_in_strings_identifiers_and_comments_do_not_split() {
        let src = "SELECT 'a;b', \"c;d\" -- e;f\n FROM t /* g;\n h */ WHERE x = ';';\nSELECT 2";
        let got = ok(split_statements(src));
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].0, "SELECT 'a;b', \"c;d\" -- e;f\n FROM t /* g;\n h */ WHERE x = ';'");
        assert_eq!(got[1], ("SELECT 2".to_string(), 4));
    }

    #[test]
    fn empty_and_comment_only_pieces_are_dropped() {
        assert!(split_statements("").is_empty());
        assert!(split_statements("  \n ;;\n -- nothing\n/* here */ ;").is_empty());
        let got = ok(split_statements(";;SELECT 1;;"));
        assert_eq!(got, [("SELECT 1".to_string(), 1)]);
    }

    #[test]
    fn line_numbers_skip_leading_comments_and_blank_lines() {
        let src = "-- header\n\nSELECT 1;\n\n  -- about two\n  SELECT\n 2;";
        let got = ok(split_statements(src));
        assert_eq!(got, [("SELECT 1".to_string(), 3), ("SELECT\n 2".to_string(), 6)]);
    }

    #[test]
    fn multibyte_text_keeps_its_bytes() {
        let got = ok(split_statements("SELECT 'héllo; wörld' AS é; SELECT 'ü'"));
        assert_eq!(got, [("SELECT 'héllo; wörld' AS é".to_string(), 1), ("SELECT 'ü'".to_string(), 1)]);
    }

    #[test]
    fn tokenizer_errors_come_after_the_good_statements() {
        let got = split_statements("SELECT 1;\nSELECT 'unterminated;\nSELECT 3;");
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0], Ok(SqlStatement { text: "SELECT 1".into(), line: 1 }));
        let Err(e) = &got[1] else { panic!("expected an error: {got:?}") };
        assert_eq!(e.line, 2);
        assert!(e.message.contains("Unterminated"), "{}", e.message);
    }
}
