//! `shardwise bench memory`: the initiator's peak memory for a GROUP BY as the number of groups
//! grows, with `distributed_aggregation = 'initiator'` and `'shuffle'`.
//!
//! Starts `--nodes` node processes, loads one table of `--rows` rows sharded by `id`, with key
//! columns `k3` .. `k7` holding 1e3 .. 1e7 distinct values (spread by a hash of the row number),
//! and runs `SELECT kE, sum(v), count(*) FROM m GROUP BY kE` (with `--two-keys`, by `kE, z`, `z`
//! being 0 in every row) through rank 0 in each mode. Before
//! each query the peak resident size of every node is reset (`/proc/PID/clear_refs`, 5); after it,
//! each node's peak (`VmHWM`) above its resident size at the start is reported. The client (this
//! process) receives and counts the answer: its memory is not a node's. Linux only.

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use arrow::array::{Float64Array, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow_flight::sql::CommandStatementIngest;
use arrow_flight::sql::client::FlightSqlServiceClient;
use tonic::transport::Endpoint;

use crate::cmd_sql::SqlClient;
use crate::proc_cluster::ProcCluster;
use crate::proc_stats::status_kib;

#[derive(clap::Args, Debug, Clone)]
pub struct MemoryBenchArgs {
    /// Rows in the table (at least as many as the largest group count measured).
    #[arg(long, default_value_t = 10_000_000)]
    pub rows: u64,
    /// Node processes.
    #[arg(long, default_value_t = 3)]
    pub nodes: u32,
    /// Group counts to measure, as powers of ten (3 to 7).
    #[arg(long, value_delimiter = ',', default_value = "3,4,5,6,7")]
    pub groups_pow10: Vec<u32>,
    /// Where the nodes keep their data [default: a temporary directory].
    #[arg(long)]
    pub data_dir: Option<std::path::PathBuf>,
    /// Group by `kE, z` instead of `kE`: `z` is 0 in every row, so the groups are the same, but
    /// with two keys the merge runs in the many-group operator (docs/distributed-queries.md).
    #[arg(long)]
    pub two_keys: bool,
    /// Also append this setting to every query (e.g. `many_groups_aggregation = 0`). Repeatable.
    #[arg(long = "setting", value_name = "NAME = VALUE")]
    pub settings: Vec<String>,
}

/// Rows per ingest call while loading.
const LOAD_BATCH_ROWS: u64 = 1_000_000;
const KEY_POWERS: std::ops::RangeInclusive<u32> = 3..=7;

fn schema() -> SchemaRef {
    let mut fields = vec![Field::new("id", DataType::Int64, true)];
    fields.extend(KEY_POWERS.map(|e| Field::new(format!("k{e}"), DataType::Int64, true)));
    fields.push(Field::new("z", DataType::Int64, true));
    fields.push(Field::new("v", DataType::Float64, true));
    Arc::new(Schema::new(fields))
}

/// splitmix64: spreads consecutive row numbers over the key space.
fn mix(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn rows(from: u64, to: u64) -> anyhow::Result<RecordBatch> {
    let ids: Vec<i64> = (from..to).map(|i| i as i64).collect();
    let mut columns: Vec<Arc<dyn arrow::array::Array>> = vec![Arc::new(Int64Array::from(ids))];
    for e in KEY_POWERS {
        let groups = 10u64.pow(e);
        // Every key value appears (the first `groups` rows cover them), the rest spread by hash.
        let keys = (from..to).map(|i| if i < groups { i as i64 } else { (mix(i) % groups) as i64 });
        columns.push(Arc::new(keys.collect::<Int64Array>()));
    }
    columns.push(Arc::new(Int64Array::from(vec![0; (to - from) as usize])));
    columns.push(Arc::new((from..to).map(|i| (i % 1000) as f64 * 0.5).collect::<Float64Array>()));
    Ok(RecordBatch::try_new(schema(), columns)?)
}

async fn load(addr: &str, total: u64) -> anyhow::Result<()> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))?.connect().await?;
    let mut client = FlightSqlServiceClient::new(channel);
    let mut from = 0;
    while from < total {
        let to = (from + LOAD_BATCH_ROWS).min(total);
        let cmd = CommandStatementIngest {
            table: "m".to_string(),
            options: HashMap::from([("insert_id".to_string(), format!("bench-memory-{from}"))]),
            ..Default::default()
        };
        client
            .execute_ingest(cmd, futures::stream::iter([Ok(rows(from, to)?)]))
            .await
            .map_err(|e| anyhow!("loading rows {from}..{to}: {e}"))?;
        from = to;
    }
    Ok(())
}

fn reset_peak(pid: nix::unistd::Pid) -> anyhow::Result<u64> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").with_context(|| format!("cannot reset {pid}'s peak"))?;
    status_kib(pid.as_raw() as u32, "VmRSS:")
}

pub async fn run(args: MemoryBenchArgs) -> anyhow::Result<ExitCode> {
    if let Some(bad) = args.groups_pow10.iter().find(|e| !KEY_POWERS.contains(e)) {
        bail!("--groups-pow10 {bad}: the table has 1e3 to 1e7 groups (3 to 7)");
    }
    let largest = args.groups_pow10.iter().map(|e| 10u64.pow(*e)).max().unwrap_or(0);
    if args.rows < largest {
        bail!("--rows {} is below the largest group count measured ({largest})", args.rows);
    }
    let temp = tempfile::tempdir().context("cannot create a temp dir")?;
    let dir = args.data_dir.clone().unwrap_or_else(|| temp.path().to_path_buf());
    let cluster = ProcCluster::start(args.nodes, &dir, &[]).await?;
    let addr = cluster.flight_addr(0);
    let mut sql = SqlClient::connect(&addr, "default", "", Duration::from_secs(5)).await?;
    let keys: Vec<String> = KEY_POWERS.map(|e| format!("k{e} BIGINT")).collect();
    sql.query(&format!("CREATE TABLE m (id BIGINT, {}, z BIGINT, v DOUBLE) WITH (shard_key = 'id')", keys.join(", ")))
        .await
        .map_err(|e| anyhow!("{e}"))?;
    let started = Instant::now();
    load(&addr, args.rows).await?;
    eprintln!("loaded {} rows in {:.1} s", args.rows, started.elapsed().as_secs_f64());
    let ranks: Vec<u32> = (0..args.nodes).collect();
    let pids = cluster.pids(&ranks);
    println!(
        "{} rows, {} nodes; peak resident memory above the start of each query, MiB (rank 0 is the initiator)",
        args.rows, args.nodes
    );
    let others: Vec<String> = (1..args.nodes).map(|r| format!("rank {r}")).collect();
    println!("{:<8} {:<10} {:>9} {:>8} {:>10} {}", "groups", "mode", "rows", "time_s", "initiator", others.join("  "));
    for e in &args.groups_pow10 {
        for mode in ["initiator", "shuffle"] {
            let keys = match args.two_keys {
                true => format!("k{e}, z"),
                false => format!("k{e}"),
            };
            let extra: String = args.settings.iter().map(|s| format!(", {s}")).collect();
            let query = format!(
                "SELECT {keys}, sum(v) AS s, count(*) AS c FROM m GROUP BY {keys} \
                 SETTINGS distributed_aggregation = '{mode}'{extra}"
            );
            let before: Vec<u64> = pids.iter().map(|p| reset_peak(*p)).collect::<anyhow::Result<_>>()?;
            let started = Instant::now();
            let answer = sql.query(&query).await.map_err(|err| anyhow!("{query}: {err}"))?;
            let secs = started.elapsed().as_secs_f64();
            let n: usize = answer.iter().map(RecordBatch::num_rows).sum();
            if n as u64 != 10u64.pow(*e) {
                bail!("{query}: {n} groups, expected {}", 10u64.pow(*e));
            }
            drop(answer);
            let mut peaks = Vec::new();
            for (pid, start) in pids.iter().zip(&before) {
                peaks.push(status_kib(pid.as_raw() as u32, "VmHWM:")?.saturating_sub(*start) as f64 / 1024.0);
            }
            let rest: Vec<String> = peaks[1..].iter().map(|p| format!("{p:>6.1}")).collect();
            println!("1e{e:<6} {mode:<10} {n:>9} {secs:>8.2} {:>10.1} {}", peaks[0], rest.join("  "));
        }
    }
    cluster.stop().await;
    Ok(ExitCode::SUCCESS)
}
