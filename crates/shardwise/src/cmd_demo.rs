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

    let first = cluster.nodes.first().context("no nodes")?;
    let mut other = SqlClient::connect(&first.flight_addr, "default", "", Duration::from_secs(10)).await?;
    let replicas = if cluster.nodes.len() > 1 { 2 } else { 1 };
    let steps = [
        format!(
            "CREATE TABLE orders (order_id BIGINT, region VARCHAR, amount DOUBLE) WITH (shard_key = 'order_id', \
             replicas = {replicas}, sync_mode = 'delay_mode_distributed', delay_max_ms = 60000)"
        ),
        "INSERT INTO orders SELECT value, CASE value % 3 WHEN 0 THEN 'eu' WHEN 1 THEN 'us' ELSE 'apac' END, \
         (value % 100) * 1.5 FROM generate_series(1, 30000) SETTINGS insert_id = 'demo-1'"
            .to_string(),
    ];
    println!("\n== a sharded table in delay_mode_distributed, through rank {}", first.node.rank);
    for sql in &steps {
        println!("   {sql}");
        other.print(sql, OutputFormat::Table).await?;
    }
    let sql =
        "SELECT rank, destination, pending_rows, oldest_pending_age_ms FROM system.sync_queues ORDER BY destination";
    println!("\n== acknowledged at once: the rows wait in rank {}'s outbox (fsynced)\n   {sql}", first.node.rank);
    client.print(sql, OutputFormat::Table).await?;
    let sql = "SYSTEM FLUSH DISTRIBUTED orders";
    println!("\n== ship them now, exactly once, and wait\n   {sql}");
    client.print(sql, OutputFormat::Table).await?;
    let sql = "SELECT shard, replica, rank, rows, verified_placement FROM system.shards ORDER BY shard, replica";
    println!("\n== every replica of every shard\n   {sql}");
    client.print(sql, OutputFormat::Table).await?;
    let sql = "SELECT region, count(*) AS orders, sum(amount) AS revenue FROM orders GROUP BY region ORDER BY region";
    println!("\n== SQL over all shards, asked of rank {}\n   {sql}", last.node.rank);
    client.print(sql, OutputFormat::Table).await?;
    println!(
        "\nThe distributed GROUP BY plans (`distributed_group_by_no_merge`) are not built yet: the shards' rows \
         are gathered on the node that runs the query. See README.md."
    );
    Ok(())
}
