//! `shardwise demo`, the README's main job: an embedded cluster in this process (real
//! rendezvous, heartbeats, data plane and Flight SQL endpoints on loopback), driven the way a user
//! would drive it, showing the seed's three mechanisms and what each costs:
//! 1. `init_distributed_mode`: the nodes join; membership as any node sees it;
//! 2. `delay_mode_distributed` against `immediate`: the same sales loaded into one table of each
//!    mode with `shardwise load`, then the delayed table's sync queue draining;
//! 3. `distributed_group_by_no_merge`: the same GROUP BY with modes 0, 1 and 2, the automatic
//!    no-merge and the shuffle, each with its first rows, row count, time and the rows and bytes
//!    its fragments moved (from `system.queries`).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use arrow::array::{Array, RecordBatch, UInt64Array};
use arrow::util::pretty::pretty_format_batches;

use crate::cmd_load::LoadArgs;
use crate::cmd_sql::{OutputFormat, SqlClient};
use crate::demo_data;
use crate::embedded::{EmbeddedCluster, check_nodes, data_dir_or_temp};

/// Largest `--nodes` the demo starts.
const MAX_DEMO_NODES: u32 = 64;
/// How long the demo watches the sync queue drain before it flushes it.
const DRAIN_WATCH_MS: u64 = 30_000;
/// How often it looks.
const DRAIN_POLL_MS: u64 = 250;
/// The delayed table's `delay_max_ms`: long enough to see the queue, short enough to wait for.
const DEMO_DELAY_MAX_MS: u64 = 2_000;
/// Rows of each answer shown.
const SHOWN_ROWS: usize = 3;

#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Number of nodes in the embedded cluster.
    #[arg(long, default_value_t = 3)]
    pub nodes: u32,
    /// Rows of sales loaded into each of the two tables.
    #[arg(long, default_value_t = 10_000_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    pub rows: u64,
    /// Data directory [default: a temporary directory, removed at the end].
    #[arg(long)]
    pub data_dir: Option<std::path::PathBuf>,
    /// Do not draw progress bars.
    #[arg(long)]
    pub no_progress: bool,
}

pub async fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    check_nodes(args.nodes, MAX_DEMO_NODES)?;
    let (_tmp, data_dir) = data_dir_or_temp(args.data_dir.as_deref())?;

    println!("== init_distributed_mode: {} nodes in one process, data in {}", args.nodes, data_dir.display());
    let started = Instant::now();
    let cluster = EmbeddedCluster::start(args.nodes, &data_dir).await?;
    println!("   every rank joined and passed the barrier in {:.0} ms", started.elapsed().as_secs_f64() * 1000.0);
    let result = tour(&cluster, &args, &data_dir).await;
    cluster.shutdown().await;
    result?;
    Ok(ExitCode::SUCCESS)
}

async fn tour(cluster: &EmbeddedCluster, args: &DemoArgs, data_dir: &std::path::Path) -> anyhow::Result<()> {
    let first = cluster.nodes.first().context("no nodes")?;
    let last = cluster.nodes.last().context("no nodes")?;
    let mut client = SqlClient::connect(&last.flight_addr, "default", "", Duration::from_secs(10)).await?;
    let sql = "SELECT rank, role, state, epoch, flight_addr FROM system.nodes ORDER BY rank";
    println!("\n== membership, asked of rank {} over Flight SQL\n   {sql}", last.node.rank);
    client.print(sql, OutputFormat::Table).await?;

    // 2. The same rows into an immediate and a delayed table.
    let csv = data_dir.join("sales.csv");
    let started = Instant::now();
    demo_data::write_csv(&csv, args.rows)?;
    println!(
        "\n== {} rows of sales (customer and product ids skewed: a few take most orders) written to {} in {:.1} s",
        args.rows,
        csv.display(),
        started.elapsed().as_secs_f64()
    );
    let replicas = if cluster.nodes.len() > 1 { 2 } else { 1 };
    let mut loader = SqlClient::connect(&first.flight_addr, "default", "", Duration::from_secs(10)).await?;
    for (table, mode) in [
        ("sales_now", "sync_mode = 'immediate'".to_string()),
        ("sales_later", format!("sync_mode = 'delay_mode_distributed', delay_max_ms = {DEMO_DELAY_MAX_MS}")),
    ] {
        let ddl = format!(
            "CREATE TABLE {table} ({}) WITH (shard_key = 'customer_id', replicas = {replicas}, {mode})",
            demo_data::COLUMNS
        );
        println!("\n== {ddl}");
        loader.print(&ddl, OutputFormat::Table).await?;
        println!("   shardwise load --connect {} {table} {}", first.flight_addr, csv.display());
        crate::cmd_load::run(load_args(&first.flight_addr, table, &csv, args.no_progress)).await?;
    }
    println!(
        "   immediate: acknowledged once both replicas of every shard had each chunk fsynced; \
         delay_mode_distributed: once rank {}'s outbox had it fsynced",
        first.node.rank
    );
    watch_drain(&mut client, "sales_later").await?;

    let sql = "SELECT \"table\", shard, replica, rank, rows, verified_placement FROM system.shards \
               WHERE \"table\" = 'sales_later' ORDER BY shard, replica";
    println!("\n== every replica of every shard of sales_later\n   {sql}");
    client.print(sql, OutputFormat::Table).await?;

    // 3. The same GROUP BY, five ways.
    println!("\n== distributed_group_by_no_merge: revenue by product and region (not the shard key)");
    let by_product = "SELECT product, region, count(*) AS orders, round(sum(amount), 2) AS revenue \
                      FROM sales_later GROUP BY product, region";
    let ordered = format!("{by_product} ORDER BY revenue DESC LIMIT 5");
    let runs = [
        (
            "mode 0: shards send partial states, the initiator merges",
            format!("{by_product} SETTINGS distributed_aggregation = 'initiator'"),
        ),
        (
            "mode 1: each shard answers alone, the initiator concatenates (a group appears once per shard)",
            format!("{by_product} SETTINGS distributed_group_by_no_merge = 1"),
        ),
        (
            "mode 2: as 1, then ORDER BY and LIMIT on the initiator (each shard's top 5, merged)",
            format!("{ordered} SETTINGS distributed_group_by_no_merge = 2"),
        ),
        (
            "shuffle: partial states hashed to the merging nodes, the initiator concatenates",
            format!("{by_product} SETTINGS distributed_aggregation = 'shuffle'"),
        ),
    ];
    for (what, sql) in &runs {
        show_query(&mut client, what, sql).await?;
    }
    println!("\n== the automatic no-merge: GROUP BY the shard key, so no group spans shards");
    let by_customer =
        "SELECT customer_id, count(*) AS orders, sum(amount) AS revenue FROM sales_later GROUP BY customer_id";
    show_query(&mut client, "optimize_distributed_group_by_sharding_key = 1 (the default)", by_customer).await?;
    show_query(
        &mut client,
        "the same with it off: every customer's partial state goes to the initiator",
        &format!("{by_customer} SETTINGS optimize_distributed_group_by_sharding_key = 0, distributed_aggregation = 'initiator'"),
    )
    .await?;
    println!("\nEXPLAIN names each plan's strategy and why; docs/distributed-queries.md has the rest.");
    Ok(())
}

fn load_args(addr: &str, table: &str, file: &std::path::Path, no_progress: bool) -> LoadArgs {
    LoadArgs {
        table: table.to_string(),
        file: file.to_path_buf(),
        connect: addr.to_string(),
        format: None,
        insert_id: None,
        user: "default".to_string(),
        password: String::new(),
        batch_rows: 65_536,
        no_progress,
        retries: 3,
        connect_timeout_ms: 10_000,
    }
}

/// Prints the delayed table's queue every [`DRAIN_POLL_MS`] until it is empty; flushes it if it
/// is not empty after [`DRAIN_WATCH_MS`].
async fn watch_drain(client: &mut SqlClient, table: &str) -> anyhow::Result<()> {
    let sql = format!(
        "SELECT sum(pending_rows), max(oldest_pending_age_ms) FROM system.sync_queues WHERE \"table\" = '{table}'"
    );
    println!("\n== the sync queue of {table} draining in the background\n   {sql}");
    let started = Instant::now();
    loop {
        let answer = client.query(&sql).await.map_err(|e| anyhow!("{e}"))?;
        let pending = first_u64(&answer, 0).unwrap_or(0);
        let age = first_u64(&answer, 1);
        let at = started.elapsed().as_secs_f64();
        match age {
            Some(age) if pending > 0 => {
                println!("   {at:>5.2} s: {pending} row copies pending (one per replica), the oldest for {age} ms")
            }
            _ => println!("   {at:>5.2} s: {pending} row copies pending"),
        }
        if pending == 0 {
            return Ok(());
        }
        if started.elapsed() > Duration::from_millis(DRAIN_WATCH_MS) {
            println!("   still pending after {DRAIN_WATCH_MS} ms: SYSTEM FLUSH DISTRIBUTED {table}");
            client.query(&format!("SYSTEM FLUSH DISTRIBUTED {table}")).await.map_err(|e| anyhow!("{e}"))?;
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(DRAIN_POLL_MS)).await;
    }
}

fn first_u64(batches: &[RecordBatch], column: usize) -> Option<u64> {
    let batch = batches.iter().find(|b| b.num_rows() > 0)?;
    let array = arrow::compute::cast(batch.column(column), &arrow::datatypes::DataType::UInt64).ok()?;
    let values = array.as_any().downcast_ref::<UInt64Array>()?;
    values.is_valid(0).then(|| values.value(0))
}

/// Runs `sql`, then prints its first rows, its row count and time, and what `system.queries`
/// recorded for it.
async fn show_query(client: &mut SqlClient, what: &str, sql: &str) -> anyhow::Result<()> {
    println!("\n-- {what}\n   {sql}");
    let started = Instant::now();
    let answer = client.query(sql).await.map_err(|e| anyhow!("{sql}: {e}"))?;
    let elapsed = started.elapsed();
    let rows: usize = answer.iter().map(RecordBatch::num_rows).sum();
    let shown: Vec<RecordBatch> =
        answer.first().map(|b| vec![b.slice(0, b.num_rows().min(SHOWN_ROWS))]).unwrap_or_default();
    println!("{}", pretty_format_batches(&shown)?);
    let record = format!(
        "SELECT strategy, fragments, rows_moved, bytes_moved FROM system.queries WHERE query = '{}' \
         ORDER BY started DESC LIMIT 1",
        sql.replace('\'', "''")
    );
    let logged = client.query(&record).await.map_err(|e| anyhow!("{e}"))?;
    let text = |c: usize| {
        logged
            .first()
            .filter(|b| b.num_rows() > 0)
            .and_then(|b| arrow::util::display::array_value_to_string(b.column(c), 0).ok())
            .unwrap_or_else(|| "?".into())
    };
    println!(
        "   {rows} rows in {:.0} ms; strategy={}, {} fragments moved {} rows, {} bytes",
        elapsed.as_secs_f64() * 1000.0,
        text(0),
        text(1),
        text(2),
        text(3)
    );
    Ok(())
}
