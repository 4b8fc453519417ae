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
    let mut out = Vec::new();
    let (mut buffer, mut buffer_line) = (String::new(), 1u64);
    for (index, line) in src.lines().enumerate() {
        let number = index as u64 + 1;
        if line.trim_start().starts_with('\\') && at_statement_start(&buffer) {
            flush(&mut buffer, buffer_line, &mut out);
            out.push((number, Ok(Step::Command(line.trim().to_string()))));
            continue;
        }
        if buffer.is_empty() {
            buffer_line = number;
        }
        buffer.push_str(line);
        buffer.push('\n');
    }
    flush(&mut buffer, buffer_line, &mut out);
    out
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

    #[test]
    fn a_backslash_inside_a_statement_is_sql() {
        let src = "SELECT 'a\n\\not a command' AS s;\nSELECT 1\n\\nodes\n;";
        let got = shown(src);
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got[0].1.contains("\\not a command"), "{got:?}");
        assert!(got[1].1.starts_with("sql SELECT 1\n\\nodes"), "{got:?}");
    }
}
