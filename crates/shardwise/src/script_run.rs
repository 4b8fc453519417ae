//! Runs a script for `shardwise sql` (`-e`, `-f FILE`, or standard input) step by step, stopping
//! at the first error, which names the statement (counted among the script's statements, not its
//! backslash commands) and the line it starts on.
//!
//! Standard input is read line by line and each statement runs once its `;` arrives, as psql
//! runs a pipe: a program that writes statements to `shardwise sql` and waits for their answers
//! gets them, and a script that ends in an error has run everything before it. `\timing` turns
//! on the time after each statement (scripts start without it), and a node that restarted since
//! the log-in is logged in to again, as in the interactive shell.

use std::io::{BufRead, IsTerminal};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use shardwise_query::sql_split::split_statements;

use crate::cmd_sql::{OutputFormat, SqlClient};
use crate::script::{Splitter, Step};
use crate::shell::Command;

/// How many lines of standard input may wait, read but not yet run.
const STDIN_LINES_AHEAD: usize = 1024;

/// Runs the statements of `-e`, of `-f`, or of standard input, stopping at the first error.
pub async fn run_script(
    client: SqlClient,
    execute: &Option<String>,
    file: &Option<PathBuf>,
    format: OutputFormat,
) -> anyhow::Result<()> {
    let mut run = ScriptRun { client, format, timing: false, statements: 0, label: None, single: false };
    match (execute, file) {
        // `-e` is SQL only; a file or a pipe may hold the shell's backslash commands too.
        (Some(sql), _) => {
            let steps: Vec<_> = split_statements(sql)
                .into_iter()
                .map(|piece| match piece {
                    Ok(statement) => (statement.line, Ok(Step::Sql(statement.text))),
                    Err(e) => (e.line, Err(e.message)),
                })
                .collect();
            run.single = steps.len() == 1;
            for (line, step) in steps {
                if run.step(line, step).await? == Flow::Quit {
                    break;
                }
            }
        }
        (None, Some(path)) => {
            let text =
                tokio::fs::read_to_string(path).await.with_context(|| format!("cannot read {}", path.display()))?;
            run.label = Some(path.display().to_string());
            for (line, step) in crate::script::steps(&text) {
                if run.step(line, step).await? == Flow::Quit {
                    break;
                }
            }
        }
        (None, None) => {
            run.label = Some("stdin".to_string());
            run_stdin(&mut run).await?;
        }
    }
    Ok(())
}

/// Standard input, each step run as soon as its last line is read.
async fn run_stdin(run: &mut ScriptRun) -> anyhow::Result<()> {
    if std::io::stdin().is_terminal() {
        eprintln!("reading SQL from standard input; end with Ctrl-D");
    }
    let (tx, mut lines) = tokio::sync::mpsc::channel::<std::io::Result<String>>(STDIN_LINES_AHEAD);
    // Blocking reads on a thread of their own (tokio's async stdin is not enabled in this
    // build); the thread ends at the end of input, or when the script stops and drops `lines`.
    std::thread::Builder::new()
        .name("shardwise-stdin".into())
        .spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let failed = line.is_err();
                if tx.blocking_send(line).is_err() || failed {
                    return;
                }
            }
        })
        .context("cannot start the standard input reader")?;
    let mut splitter = Splitter::default();
    while let Some(line) = lines.recv().await {
        let line = line.with_context(|| format!("cannot read standard input (line {})", splitter.lines() + 1))?;
        for (number, step) in splitter.push_line(&line) {
            if run.step(number, step).await? == Flow::Quit {
                return Ok(());
            }
        }
    }
    for (number, step) in splitter.finish() {
        if run.step(number, step).await? == Flow::Quit {
            return Ok(());
        }
    }
    Ok(())
}

#[derive(Debug, PartialEq, Eq)]
enum Flow {
    Continue,
    Quit,
}

/// A script being run: the client, and what the script has set and done so far.
struct ScriptRun {
    client: SqlClient,
    format: OutputFormat,
    /// `\timing`: print the rows and time after each statement.
    timing: bool,
    /// Statements run or tried so far (for the error's "statement N").
    statements: usize,
    /// The file (or `stdin`) errors name; none for `-e`.
    label: Option<String>,
    /// One statement from `-e`: its error is printed alone, without a place.
    single: bool,
}

impl ScriptRun {
    /// Runs one step; an error names where it is in the script.
    async fn step(&mut self, line: u64, step: Result<Step, String>) -> anyhow::Result<Flow> {
        let (what, outcome) = match step {
            Ok(Step::Sql(sql)) => {
                self.statements += 1;
                (format!("statement {}", self.statements), self.statement(&sql).await)
            }
            Ok(Step::Command(text)) => {
                let outcome = match crate::shell::command(&text) {
                    Command::Quit => return Ok(Flow::Quit),
                    Command::Help => {
                        println!("{}", crate::shell::HELP);
                        Ok(())
                    }
                    Command::Timing => {
                        self.timing = !self.timing;
                        Ok(())
                    }
                    Command::Sql(sql) => self.statement(&sql).await,
                    Command::Unknown(word) => Err(format!("unknown command {word}; \\? lists them")),
                };
                (format!("command {text}"), outcome)
            }
            Err(message) => {
                self.statements += 1;
                (format!("statement {}", self.statements), Err(message))
            }
        };
        let Err(message) = outcome else { return Ok(Flow::Continue) };
        if self.single {
            bail!("{message}");
        }
        let place = match &self.label {
            Some(label) => format!("{label} line {line}"),
            None => format!("line {line}"),
        };
        bail!("{what} ({place}): {message}")
    }

    async fn statement(&mut self, sql: &str) -> Result<(), String> {
        let started = Instant::now();
        let rows = self.client.print_counted(sql, self.format).await?;
        if self.timing {
            println!("{}", crate::shell::rows_and_time(rows, started));
        }
        Ok(())
    }
}
