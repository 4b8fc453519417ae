//! A script for `shardwise sql` (`-f FILE`, or statements on standard input) as the steps it
//! runs: SQL statements, and the shell's backslash commands (`\nodes`, `\tables`, `\q`, ...) on
//! lines of their own between statements, as psql takes them from a file or a pipe.
//!
//! A line is a backslash command when it starts with `\` where a statement could start: nothing
//! but whitespace and comments since the last `;`. Anywhere else (inside a statement or a
//! string) it is SQL text.

use shardwise_query::sql_split::{is_complete, split_statements};

/// One thing a script runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A statement.
    Sql(String),
    /// A backslash command, as written (trimmed).
    Command(String),
}

/// The steps of `src`, each with the line it starts on (1-based); `Err` for a statement that does
/// not split (an unterminated string, say), with what is wrong.
pub fn steps(src: &str) -> Vec<(u64, Result<Step, String>)> {
    let mut splitter = Splitter::default();
    let mut out: Vec<_> = src.lines().flat_map(|line| splitter.push_line(line)).collect();
    out.extend(splitter.finish());
    out
}

/// Splits a script read line by line, handing out each step as soon as its last line is in, as
/// psql runs a statement from a pipe once its `;` arrives (a script fed by another program runs
/// as it is written, not at the end of its input).
#[derive(Debug, Default)]
pub struct Splitter {
    /// Lines of statements not yet ended.
    buffer: String,
    /// The line `buffer` starts on.
    buffer_line: u64,
    /// Lines taken so far.
    lines: u64,
}

impl Splitter {
    /// Takes the script's next line (without its line break); returns the steps it completes.
    pub fn push_line(&mut self, line: &str) -> Vec<(u64, Result<Step, String>)> {
        self.lines += 1;
        let mut out = Vec::new();
        if line.trim_start().starts_with('\\') && at_statement_start(&self.buffer) {
            flush(&mut self.buffer, self.buffer_line, &mut out);
            out.push((self.lines, Ok(Step::Command(line.trim().to_string()))));
            return out;
        }
        if self.buffer.is_empty() {
            self.buffer_line = self.lines;
        }
        self.buffer.push_str(line);
        self.buffer.push('\n');
        // Only a line with a `;` can end a statement: a long statement is not tokenized again
        // for each of its lines.
        if line.contains(';') && is_complete(&self.buffer) {
            flush(&mut self.buffer, self.buffer_line, &mut out);
        }
        out
    }

    /// How many lines were taken.
    pub fn lines(&self) -> u64 {
        self.lines
    }

    /// The end of the script: the steps of what is left (a last statement without `;`, or an
    /// error for one that does not split).
    pub fn finish(&mut self) -> Vec<(u64, Result<Step, String>)> {
        let mut out = Vec::new();
        flush(&mut self.buffer, self.buffer_line, &mut out);
        out
    }
}

/// True when `buffer` holds only whole statements (or nothing but whitespace and comments).
fn at_statement_start(buffer: &str) -> bool {
    buffer.trim().is_empty() || is_complete(buffer) || split_statements(buffer).is_empty()
}

/// The statements of `buffer` (whose first line is line `first_line` of the script) onto `out`.
fn flush(buffer: &mut String, first_line: u64, out: &mut Vec<(u64, Result<Step, String>)>) {
    for piece in split_statements(buffer) {
        out.push(match piece {
            Ok(statement) => (first_line + statement.line - 1, Ok(Step::Sql(statement.text))),
            Err(e) => (first_line + e.line - 1, Err(e.message)),
        });
    }
    buffer.clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(src: &str) -> Vec<(u64, String)> {
        steps(src)
            .into_iter()
            .map(|(line, step)| {
                let text = match step {
                    Ok(Step::Sql(s)) => format!("sql {s}"),
                    Ok(Step::Command(c)) => format!("cmd {c}"),
                    Err(e) => format!("err {e}"),
                };
                (line, text)
            })
            .collect()
    }

    #[test]
    fn commands_between_statements_and_sql_around_them() {
        let src = "\\nodes\nSELECT 1;\n-- a comment\n  \\tables\nSELECT\n  2; SELECT 3;\n\\q\n";
        assert_eq!(
            shown(src),
            vec![
                (1, "cmd \\nodes".to_string()),
                (2, "sql SELECT 1".to_string()),
                (4, "cmd \\tables".to_string()),
                (5, "sql SELECT\n  2".to_string()),
                (6, "sql SELECT 3".to_string()),
                (7, "cmd \\q".to_string()),
            ]
        );
    }

    /// A statement is handed out with the line that ends it, not at the end of the script.
    #[test]
    fn steps_come_out_as_their_last_line_arrives() {
        let mut s = Splitter::default();
        assert!(s.push_line("SELECT").is_empty());
        assert_eq!(s.push_line("  1;"), vec![(1, Ok(Step::Sql("SELECT\n  1".into())))]);
        assert!(s.push_line("SELECT 'a;").is_empty(), "a string left open is not the end");
        assert_eq!(s.push_line("b';"), vec![(3, Ok(Step::Sql("SELECT 'a;\nb'".into())))]);
        assert_eq!(s.push_line("\\nodes"), vec![(5, Ok(Step::Command("\\nodes".into())))]);
        assert!(s.push_line("SELECT 2").is_empty());
        assert_eq!(s.finish(), vec![(6, Ok(Step::Sql("SELECT 2".into())))]);
    }

    #[test]
    fn a_backslash_inside_a_statement_is_sql() {
        let src = "SELECT 'a\n\\not a command' AS s;\nSELECT 1\n\\nodes\n;";
        let got = shown(src);
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got[0].1.contains("\\not a command"), "{got:?}");
        assert!(got[1].1.starts_with("sql SELECT 1\n\\nodes"), "{got:?}");
    }
}
