//! `shardwise`: the command-line binary. Each subcommand lives in its own module; this file only
//! parses the command line and reports errors (with their causes) and the exit code.

mod bench_crash;
mod bench_groupby;
mod bench_insert;
mod bench_load;
mod bench_memory;
mod cmd_bench;
mod cmd_demo;
mod cmd_launch;
mod cmd_load;
mod cmd_local;
mod cmd_node;
mod cmd_passwd;
mod cmd_sql;
mod cpu_steal;
mod demo_data;
mod embedded;
mod launch_checks;
mod line_reader;
mod load;
mod logging;
mod malloc_tuning;
mod node_host;
mod port_probe;
mod ports;
mod proc_cluster;
mod proc_stats;
mod script;
mod script_run;
mod shell;
mod sql_print;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// shardwise: a distributed analytical engine. Tables sharded by key across a cluster of nodes,
/// kept in sync, queried with SQL.
#[derive(Parser, Debug)]
#[command(name = "shardwise", version, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run one cluster node (init_distributed_mode, then serve).
    ///
    /// Rank, world size and master address come from, in this order: flags or --config; torchrun
    /// variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT); Slurm
    /// (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_JOB_NODELIST, SLURM_JOB_ID); Open MPI
    /// (OMPI_COMM_WORLD_*); PMI (PMI_RANK, PMI_SIZE). With none of them: a single-node cluster.
    Node(Box<cmd_node::NodeArgs>),
    /// Start N local nodes as one cluster, as `torchrun --standalone` does.
    Launch(cmd_launch::LaunchArgs),
    /// Run SQL against a node: the interactive shell on a terminal, else -e SQL, -f FILE, or
    /// statements on standard input.
    Sql(cmd_sql::SqlArgs),
    /// An embedded cluster in this process with the shell (or -e / -f), as clickhouse-local.
    Local(cmd_local::LocalArgs),
    /// Bulk-load a CSV, Parquet or NDJSON file into a table, exactly once.
    ///
    /// The whole file is read and checked against the table's schema (from the server) before
    /// anything is sent: a malformed row fails the load naming its line and column. The rows then
    /// go in one Flight SQL bulk ingest under an insert id, which the server applies at most once;
    /// errors that may be transient are retried under the same id, and a failed load re-run with
    /// `--insert-id ID` completes exactly once.
    Load(cmd_load::LoadArgs),
    /// The main job: an embedded cluster in this process, shown end to end.
    Demo(cmd_demo::DemoArgs),
    /// Benchmarks (run on a release build); each prints ratios against a same-run baseline.
    Bench(cmd_bench::BenchArgs),
    /// Print a user's line for the `[users]` table of a node's config: the password as a salted
    /// SCRAM-SHA-256 verifier, used by PostgreSQL clients, Flight SQL and HTTP alike.
    Passwd(cmd_passwd::PasswdArgs),
}

fn main() -> ExitCode {
    malloc_tuning::configure();
    forget_empty_settings();
    // A malformed upload's decoder panic is answered as an error; it is not printed.
    shardwise_server::flight_decode::install_panic_hook();
    let cli = Cli::parse();
    // Statements are planned on this runtime's threads, recursing once per level of an
    // expression (see `shardwise_query::ast_limits`).
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .thread_stack_size(shardwise_query::ast_limits::QUERY_THREAD_STACK_BYTES)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Node(args) => cmd_node::run(*args).await,
            Command::Launch(args) => cmd_launch::run(args).await,
            Command::Sql(args) => cmd_sql::run(args).await.map(|()| ExitCode::SUCCESS),
            Command::Local(args) => cmd_local::run(args).await,
            Command::Load(args) => cmd_load::run(args).await.map(|()| ExitCode::SUCCESS),
            Command::Demo(args) => cmd_demo::run(args).await,
            Command::Bench(args) => cmd_bench::run(args).await,
            Command::Passwd(args) => cmd_passwd::run(args).map(|()| ExitCode::SUCCESS),
        }
    });
    // Do not wait for stray blocking tasks (a stdin reader, say) at exit.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    match result {
        Ok(code) => code,
        Err(e) if e.downcast_ref::<line_reader::StoppedBySigint>().is_some() => {
            eprintln!("{e}");
            ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("error: {}", error_text(&e));
            ExitCode::FAILURE
        }
    }
}

/// Treats an empty `SHARDWISE_*` variable as unset: `export SHARDWISE_SECRET_FILE=` is a common
/// way to unset one, and clap would report it as a flag given without a value.
fn forget_empty_settings() {
    let empty: Vec<std::ffi::OsString> = std::env::vars_os()
        .filter(|(name, value)| value.is_empty() && name.to_string_lossy().starts_with("SHARDWISE_"))
        .map(|(name, _)| name)
        .collect();
    for name in empty {
        // SAFETY: called first thing in `main`, before any other thread exists (the runtime is
        // built after it), so nothing reads the environment concurrently.
        unsafe { std::env::remove_var(name) };
    }
}

/// `e` and its causes joined by `: `, leaving out a cause whose text the message already holds
/// (many errors name their cause in their own message and also return it as their source).
fn error_text(e: &anyhow::Error) -> String {
    shardwise_server::error::with_causes(e.to_string(), e.chain().skip(1).map(|c| c.to_string()))
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    #[test]
    fn a_cause_already_in_the_message_is_printed_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("reading x: {source}")]
        struct Named {
            source: std::io::Error,
        }
        let named = anyhow::Error::new(Named { source: std::io::Error::other("disk gone") });
        assert_eq!(super::error_text(&named), "reading x: disk gone");
        let added = anyhow::Error::new(std::io::Error::other("disk gone")).context("reading y");
        assert_eq!(super::error_text(&added), "reading y: disk gone");
    }

    use super::{Cli, Command};

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn statements_come_with_the_flags_other_clients_use() {
        for flag in ["-e", "--execute", "-c", "--query"] {
            let cli = Cli::try_parse_from(["shardwise", "sql", flag, "SELECT 1"]).expect(flag);
            let Command::Sql(args) = cli.command else { panic!("{flag}: not the sql command") };
            assert_eq!(args.script.execute.as_deref(), Some("SELECT 1"), "{flag}");
        }
        let cli = Cli::try_parse_from(["shardwise", "local", "-c", "SELECT 2"]).expect("local -c");
        let Command::Local(args) = cli.command else { panic!("not the local command") };
        assert_eq!(args.script.execute.as_deref(), Some("SELECT 2"));
        assert!(Cli::try_parse_from(["shardwise", "sql", "-c", "SELECT 1", "-f", "x.sql"]).is_err());
    }
}
