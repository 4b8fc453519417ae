//! The interactive shell of `shardwise sql` and `shardwise local`: line editing and history
//! (rustyline, as datafusion-cli uses), statements over several lines until a `;` ends them,
//! results as aligned tables, the time of each statement, and backslash commands for what one
//! looks up often. Everything runs over one connection, so `SET` lasts for the session.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use rustyline::DefaultEditor;
use rustyline::error::ReadlineError;

use crate::cmd_sql::{OutputFormat, SqlClient};
use crate::line_reader::{LineReader, StoppedBySigint};
use shardwise_query::sql_split::{is_complete, split_statements};

/// Lines of history kept.
const HISTORY_MAX_LINES: usize = 10_000;

const PROMPT: &str = "shardwise> ";
const CONTINUATION: &str = "        -> ";

pub(crate) const HELP: &str = "\
  statements end with ;  (they may span lines; Ctrl-C drops the one being typed)
  \\nodes       the cluster's nodes (system.nodes)
  \\tables      the tables and how they are sharded (system.tables)
  \\settings    shardwise's settings in this session (SET name = value changes one)
  \\queries     the last queries this node ran (system.queries)
  \\timing      turn the time after each statement off or on
  \\?           this help
  \\q           quit (or Ctrl-D)";

/// What a backslash command asks for.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Command {
    Quit,
    Help,
    Timing,
    Sql(String),
    Unknown(String),
}

pub(crate) fn command(line: &str) -> Command {
    // psql users end these with `;` out of habit (`\dt;`).
    let word = line.split_whitespace().next().unwrap_or_default().trim_end_matches(';');
    match word {
        "\\q" | "\\quit" => Command::Quit,
        "\\?" | "\\h" | "\\help" => Command::Help,
        "\\timing" => Command::Timing,
        "\\nodes" => {
            Command::Sql("SELECT rank, role, state, epoch, flight_addr FROM system.nodes ORDER BY rank".into())
        }
        "\\tables" => {
            Command::Sql("SELECT name, shard_key, shards, replicas, sync_mode FROM system.tables ORDER BY name".into())
        }
        "\\settings" => Command::Sql(
            "SELECT name, value, \"default\", changed FROM system.settings WHERE name NOT LIKE 'datafusion.%' ORDER BY name"
                .into(),
        ),
        "\\queries" => Command::Sql(
            "SELECT query_id, state, strategy, duration_ms, result_rows, query FROM system.queries \
             ORDER BY started DESC LIMIT 10"
                .into(),
        ),
        other => Command::Unknown(other.to_string()),
    }
}

/// Where history is kept: `$SHARDWISE_HISTORY`, else `~/.shardwise_history`; none without a home.
fn history_path() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("SHARDWISE_HISTORY") {
        return Some(PathBuf::from(path));
    }
    std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".shardwise_history"))
}

/// Reads statements until `\q` or end of input; an error in one statement is printed and the
/// shell goes on.
pub async fn run(client: &mut SqlClient, addr: &str, format: OutputFormat) -> anyhow::Result<()> {
    let config = rustyline::Config::builder().max_history_size(HISTORY_MAX_LINES)?.auto_add_history(false).build();
    let mut editor = DefaultEditor::with_config(config).context("cannot start the line editor")?;
    let history = history_path();
    if let Some(path) = &history {
        let _ = editor.load_history(path); // none yet is fine
    }
    let editor = LineReader::start(editor).context("cannot start the line editor")?;
    println!("shardwise {} on {addr}; statements end with ;  \\? for help, \\q to quit", env!("CARGO_PKG_VERSION"));
    let mut timing = true;
    let mut buffer = String::new();
    loop {
        let prompt = if buffer.is_empty() { PROMPT } else { CONTINUATION };
        let read = tokio::select! {
            line = editor.read(prompt) => line,
            _ = tokio::signal::ctrl_c() => {
                crate::line_reader::restore_terminal();
                return Err(StoppedBySigint.into());
            }
        };
        let line = match read {
            Ok(line) => line,
            Err(ReadlineError::Interrupted) => {
                buffer.clear();
                continue;
            }
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(e).context("cannot read the next line"),
        };
        if buffer.is_empty() && line.trim_start().starts_with('\\') {
            editor.add_history(line.trim());
            match command(line.trim()) {
                Command::Quit => break,
                Command::Help => println!("{HELP}"),
                Command::Timing => {
                    timing = !timing;
                    println!("timing is {}", if timing { "on" } else { "off" });
                }
                Command::Sql(sql) => execute(client, &sql, format, timing).await,
                Command::Unknown(word) => eprintln!("unknown command {word}; \\? lists them"),
            }
            continue;
        }
        if buffer.is_empty() && line.trim().is_empty() {
            continue;
        }
        buffer.push_str(&line);
        buffer.push('\n');
        if !is_complete(&buffer) {
            continue;
        }
        editor.add_history(buffer.trim_end());
        for piece in split_statements(&buffer) {
            match piece {
                Ok(statement) => execute(client, &statement.text, format, timing).await,
                Err(e) => eprintln!("error: {}", e.message),
            }
        }
        buffer.clear();
    }
    if let Some(path) = &history
        && let Err(e) = editor.save_history(path.clone()).await
    {
        eprintln!("could not save the history to {}: {e}", path.display());
    }
    Ok(())
}

/// Runs one statement and prints its answer. Ctrl-C while it runs cancels it (the call is
/// dropped, which stops the query on the server) and the shell goes on, as in psql.
async fn execute(client: &mut SqlClient, sql: &str, format: OutputFormat, timing: bool) {
    let started = Instant::now();
    let answer = tokio::select! {
        answer = client.print_counted(sql, format) => answer,
        _ = tokio::signal::ctrl_c() => Err("cancelled (Ctrl-C); the query was stopped".to_string()),
    };
    match answer {
        Ok(rows) if timing => println!("{}", rows_and_time(rows, started)),
        Ok(_) => {}
        Err(message) => eprintln!("error: {message}"),
    }
}

/// What `\timing` prints after a statement: `3 rows in 1.2 ms`.
pub(crate) fn rows_and_time(rows: usize, started: Instant) -> String {
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    format!("{rows} row{} in {ms:.1} ms", if rows == 1 { "" } else { "s" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backslash_commands_are_recognised() {
        assert_eq!(command("\\q"), Command::Quit);
        assert_eq!(command("\\timing"), Command::Timing);
        assert!(matches!(command("\\nodes;"), Command::Sql(s) if s.contains("system.nodes")));
        assert!(matches!(command("\\nodes"), Command::Sql(s) if s.contains("system.nodes")));
        assert!(matches!(command("\\settings"), Command::Sql(s) if s.contains("FROM system.settings")));
        assert_eq!(command("\\nope x"), Command::Unknown("\\nope".into()));
    }
}
