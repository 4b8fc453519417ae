//! `shardwise bench load`: bulk CSV load throughput, beside ClickHouse in the same run.
//!
//! For each cluster shape (`--shapes nodes:replicas,...`, default `2:1,3:2`) it starts node
//! processes, creates the db-benchmark groupby table sharded by `(id1, id2, id3)`, and times
//! `shardwise load` of the CSV (the real command, as a user runs it; fsync on, as always), then
//! checks the row count. With `--clickhouse-script` (default `bench/clickhouse/load.sh`, skipped
//! if missing) it runs ClickHouse's load of the same file on the same shapes (two shards on
//! loopback; a Distributed table with synchronous insert) and prints the ratio.
//!
//! The CSV comes from `bench/gen_groupby_csv.py ROWS FILE` (the H2O G1 shape).

use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use arrow::array::{Array, Int64Array};

use crate::cmd_sql::SqlClient;
use crate::proc_cluster::ProcCluster;

#[derive(clap::Args, Debug, Clone)]
pub struct LoadBenchArgs {
    /// The CSV to load (header id1,id2,id3,id4,id5,id6,v1,v2,v3).
    #[arg(long)]
    pub csv: PathBuf,
    /// Cluster shapes as nodes:replicas, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "2:1,3:2")]
    pub shapes: Vec<String>,
    /// ClickHouse loader to run on the same file and shapes; skipped if the file is missing.
    #[arg(long, default_value = "bench/clickhouse/load.sh")]
    pub clickhouse_script: PathBuf,
    /// Where the nodes keep their data [default: a temporary directory].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
}

const CREATE: &str = "CREATE TABLE groupby (id1 VARCHAR, id2 VARCHAR, id3 VARCHAR, id4 INT, id5 INT, id6 INT, \
                      v1 INT, v2 INT, v3 DOUBLE) WITH (shard_key = 'id1,id2,id3', replicas = {R})";

fn parse_shape(s: &str) -> anyhow::Result<(u32, u32)> {
    let (n, r) = s.split_once(':').ok_or_else(|| anyhow!("shape {s:?}: expected nodes:replicas"))?;
    let (n, r): (u32, u32) = (n.parse()?, r.parse()?);
    if n == 0 || r == 0 || r > n {
        bail!("shape {s:?}: need 1 <= replicas <= nodes");
    }
    Ok((n, r))
}

async fn shardwise_load(args: &LoadBenchArgs, nodes: u32, replicas: u32) -> anyhow::Result<(u64, f64)> {
    let temp = tempfile::tempdir().context("cannot create a temp dir")?;
    let base = args.data_dir.clone().unwrap_or_else(|| temp.path().to_path_buf());
    let dir = base.join(format!("load-{nodes}-{replicas}"));
    let cluster = ProcCluster::start(nodes, &dir, &[]).await?;
    let addr = cluster.flight_addr(0);
    let mut sql = SqlClient::connect(&addr, "default", "", Duration::from_secs(5)).await?;
    sql.query(&CREATE.replace("{R}", &replicas.to_string())).await.map_err(|e| anyhow!("{e}"))?;
    let exe = std::env::current_exe()?;
    let started = Instant::now();
    let out = tokio::process::Command::new(exe)
        .args(["load", "--connect", &addr, "--no-progress", "groupby"])
        .arg(&args.csv)
        .stdin(Stdio::null())
        .output()
        .await?;
    let seconds = started.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!("shardwise load failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let batches = sql.query("SELECT count(*) FROM groupby").await.map_err(|e| anyhow!("{e}"))?;
    let rows = batches
        .first()
        .and_then(|b| b.column(0).as_any().downcast_ref::<Int64Array>().map(|a| a.value(0)))
        .context("no count")? as u64;
    cluster.stop().await;
    Ok((rows, seconds))
}

fn clickhouse_load(args: &LoadBenchArgs, nodes: u32, replicas: u32) -> anyhow::Result<Option<(u64, f64)>> {
    if !args.clickhouse_script.exists() {
        return Ok(None);
    }
    let shards = if replicas == 1 { nodes } else { 2 };
    let out = std::process::Command::new("bash")
        .arg(&args.clickhouse_script)
        .arg(&args.csv)
        .args(["--shards", &shards.to_string(), "--replicas", &replicas.to_string()])
        .stdin(Stdio::null())
        .output()?;
    if !out.status.success() {
        eprintln!("clickhouse load failed: {}", String::from_utf8_lossy(&out.stderr));
        return Ok(None);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or("");
    let v: serde_json::Value = serde_json::from_str(line).with_context(|| format!("clickhouse output {line:?}"))?;
    Ok(Some((v["rows"].as_u64().unwrap_or(0), v["seconds"].as_f64().unwrap_or(f64::NAN))))
}

pub async fn run(args: LoadBenchArgs) -> anyhow::Result<ExitCode> {
    if !args.csv.exists() {
        bail!("{} does not exist; make one with bench/gen_groupby_csv.py ROWS FILE", args.csv.display());
    }
    let bytes = std::fs::metadata(&args.csv)?.len();
    println!("file {} ({:.1} MiB)", args.csv.display(), bytes as f64 / (1 << 20) as f64);
    println!(
        "{:<10} {:<12} {:>10} {:>9} {:>14} {:>22}",
        "shape", "system", "rows", "seconds", "rows_per_s", "shardwise/clickhouse"
    );
    for shape in &args.shapes {
        let (nodes, replicas) = parse_shape(shape)?;
        let (rows, secs) = shardwise_load(&args, nodes, replicas).await?;
        let ours = rows as f64 / secs;
        let label = format!("{nodes}n r={replicas}");
        println!("{label:<10} {:<12} {rows:>10} {secs:>9.2} {ours:>14.0} {:>22}", "shardwise", "");
        match clickhouse_load(&args, nodes, replicas)? {
            Some((crows, csecs)) => {
                let theirs = crows as f64 / csecs;
                println!(
                    "{label:<10} {:<12} {crows:>10} {csecs:>9.2} {theirs:>14.0} {:>22.2}",
                    "clickhouse",
                    ours / theirs
                );
            }
            None => println!("{label:<10} {:<12} skipped (no {})", "clickhouse", args.clickhouse_script.display()),
        }
    }
    Ok(ExitCode::SUCCESS)
}
