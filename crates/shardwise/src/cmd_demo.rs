//! `shardwise demo`, the README's main job: starts an embedded cluster in this process (real
//! rendezvous, heartbeats and Flight SQL endpoints on loopback), then talks to it the way a user
//! would, through Flight SQL, printing what each step shows.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::cmd_sql::{OutputFormat, SqlClient};
use crate::embedded::EmbeddedCluster;

/// Largest `--nodes` the demo starts.
const MAX_DEMO_NODES: u32 = 64;

#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Number of nodes in the embedded cluster.
    #[arg(long, default_value_t = 3)]
    pub nodes: u32,
    /// Data directory [default: a temporary directory, removed at the end].
    #[arg(long)]
    pub data_dir: Option<std::path::PathBuf>,
}

pub async fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    if args.nodes == 0 || args.nodes > MAX_DEMO_NODES {
        anyhow::bail!("--nodes {} is out of range: expected 1..={MAX_DEMO_NODES}", args.nodes);
    }
    let tmp = tempfile::tempdir().context("cannot create a temporary data dir")?;
    let data_dir = args.data_dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());

    println!("== init_distributed_mode: {} nodes in one process, data in {}", args.nodes, data_dir.display());
    let started = Instant::now();
    let cluster = EmbeddedCluster::start(args.nodes, &data_dir).await?;
    println!("   every rank joined and passed the barrier in {:.0} ms", started.elapsed().as_secs_f64() * 1000.0);
    for n in &cluster.nodes {
        println!(
            "   listening rank={} flight={}  ({}, node_id {})",
            n.node.rank,
            n.flight_addr,
            n.node.role().as_str(),
            n.node.node_id
        );
    }

    let result = tour(&cluster).await;
    cluster.shutdown().await;
    result?;
    Ok(ExitCode::SUCCESS)
}

async fn tour(cluster: &EmbeddedCluster) -> anyhow::Result<()> {
    let last = cluster.nodes.last().context("no nodes")?;
    let mut client = SqlClient::connect(&last.flight_addr, "default", "", Duration::from_secs(10)).await?;

    let sql = "SELECT rank, role, state, epoch, flight_addr FROM system.nodes ORDER BY rank";
    println!("\n== membership, asked of rank {} over Flight SQL\n   {sql}", last.node.rank);
    client.print(sql, OutputFormat::Table).await?;

    let sql = "SELECT region, count(*) AS orders, sum(amount) AS revenue \
               FROM (VALUES ('eu', 10.5), ('us', 3.0), ('eu', 7.25), ('apac', 1.0), ('us', 4.0)) AS t(region, amount) \
               GROUP BY region ORDER BY revenue DESC";
    println!("\n== SQL on a node (DataFusion)\n   {sql}");
    client.print(sql, OutputFormat::Table).await?;
    println!(
        "\nSharded tables (`delay_mode_distributed`) and distributed GROUP BY \
         (`distributed_group_by_no_merge`) are not built yet; see README.md."
    );
    Ok(())
}
