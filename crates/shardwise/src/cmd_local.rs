//! `shardwise local`: an embedded cluster in this process, on the same code paths as separate
//! nodes (real rendezvous, Flight SQL endpoints and data plane on loopback), with the shell, as
//! `clickhouse-local` and `duckdb` give a database in one command. Data goes to a temporary
//! directory, removed at exit, unless `--data-dir` keeps it. Other clients can connect to the
//! addresses it prints while it runs.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use crate::cmd_sql::{ScriptArgs, SqlClient};
use crate::embedded::{EmbeddedCluster, check_nodes, data_dir_or_temp};

/// Largest `--nodes`.
const MAX_LOCAL_NODES: u32 = 64;

#[derive(clap::Args, Debug)]
pub struct LocalArgs {
    /// Nodes in the embedded cluster.
    #[arg(long, default_value_t = 3)]
    pub nodes: u32,
    /// Data directory, kept after exit [default: a temporary directory, removed at exit].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    #[command(flatten)]
    pub script: ScriptArgs,
}

pub async fn run(args: LocalArgs) -> anyhow::Result<ExitCode> {
    check_nodes(args.nodes, MAX_LOCAL_NODES)?;
    // A signal stops the session, then the cluster, and the temporary data directory goes as at
    // a normal exit (watched before the directory is made). The shell handles Ctrl-C itself (it
    // cancels the running statement).
    use tokio::signal::unix::{SignalKind, signal};
    let mut sigterm = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut sigint = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    let shell = args.script.wants_shell();
    let (_tmp, data_dir) = data_dir_or_temp(args.data_dir.as_deref())?;
    let cluster = EmbeddedCluster::start(args.nodes, &data_dir).await?;
    let stopped = async {
        tokio::select! {
            _ = sigterm.recv() => ("SIGTERM", 143),
            _ = sigint.recv(), if !shell => ("SIGINT", 130),
        }
    };
    let result = tokio::select! {
        result = session(&cluster, &args, &data_dir) => result.map(|()| ExitCode::SUCCESS),
        (name, code) = stopped => {
            crate::line_reader::restore_terminal();
            eprintln!("stopped by {name}");
            Ok(ExitCode::from(code))
        }
    };
    cluster.shutdown().await;
    result
}

async fn session(cluster: &EmbeddedCluster, args: &LocalArgs, data_dir: &std::path::Path) -> anyhow::Result<()> {
    let first = cluster.nodes.first().context("no nodes")?;
    let client = SqlClient::connect(&first.flight_addr, "default", "", Duration::from_secs(10)).await?;
    if args.script.wants_shell() {
        let addrs: Vec<String> =
            cluster.nodes.iter().map(|n| format!("rank {} {}", n.node.rank, n.flight_addr)).collect();
        eprintln!(
            "{} nodes in this process, data in {}; Flight SQL: {}",
            args.nodes,
            data_dir.display(),
            addrs.join(", ")
        );
    }
    crate::cmd_sql::run_on(client, &first.flight_addr, &args.script).await
}
