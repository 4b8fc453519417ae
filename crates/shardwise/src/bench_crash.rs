//! `shardwise bench crash`: the crash soak of `delay_mode_distributed`.
//!
//! Starts N node processes, creates a `delay_mode_distributed` table with `replicas = 2`, and
//! runs writers that insert batches of rows with unique ids through random nodes, each batch
//! with its own `insert_id`, retrying a failed batch with the same id through another node until
//! it is acknowledged. Meanwhile it kills a random node (initiator, receiver or the master) with
//! SIGKILL, keeps it down for a moment and restarts it, `--kills` times. Then it stops the
//! writers, flushes, and checks, by id:
//! - every acknowledged row is present exactly once;
//! - a row whose batch was never acknowledged is present at most once;
//! - every replica of every shard holds the same number of rows (`system.shards`).
//!
//! It prints one JSON line with the figures and exits non-zero on any violation. CI runs it
//! with 5 kills; the soak runs hundreds.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use arrow::array::{Array, Int64Array, UInt32Array, UInt64Array};
use rand::Rng;
use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::sync::Mutex;

use crate::cmd_sql::SqlClient;
use crate::proc_cluster::ProcCluster;

#[derive(clap::Args, Debug, Clone)]
pub struct CrashArgs {
    /// Nodes in the cluster.
    #[arg(long, default_value_t = 3)]
    pub nodes: u32,
    /// How many times a random node is killed with SIGKILL and restarted.
    #[arg(long, default_value_t = 100)]
    pub kills: u32,
    /// Replicas of the table.
    #[arg(long, default_value_t = 2)]
    pub replicas: u32,
    /// Concurrent writers.
    #[arg(long, default_value_t = 2)]
    pub writers: u32,
    /// Rows per insert.
    #[arg(long, default_value_t = 50)]
    pub batch_rows: u64,
    /// Mean time between kills; each wait is drawn from 0.5x to 1.5x of it.
    #[arg(long, default_value_t = 1500)]
    pub kill_interval_ms: u64,
    /// Longest time a killed node stays down before its restart.
    #[arg(long, default_value_t = 1000)]
    pub max_down_ms: u64,
    /// Seed of the kill schedule.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Where the nodes keep their data [default: a temporary directory, removed after a pass].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// How long the final flush may take.
    #[arg(long, default_value_t = 120_000)]
    pub flush_timeout_ms: u64,
}

const TABLE: &str = "crash_soak";

/// Flight SQL clients, one per rank, reconnected after a failure.
struct Clients {
    addrs: Vec<String>,
    clients: HashMap<u32, SqlClient>,
}

impl Clients {
    async fn run(&mut self, rank: u32, sql: &str) -> Result<Vec<arrow::array::RecordBatch>, String> {
        if !self.clients.contains_key(&rank) {
            let c = SqlClient::connect(&self.addrs[rank as usize], "default", "", Duration::from_secs(2))
                .await
                .map_err(|e| e.to_string())?;
            self.clients.insert(rank, c);
        }
        let client = self.clients.get_mut(&rank).ok_or("no client")?;
        let r = tokio::time::timeout(Duration::from_secs(30), client.query(sql)).await;
        let r = r.unwrap_or_else(|_| Err("timed out after 30 s".to_string()));
        if r.is_err() {
            self.clients.remove(&rank);
        }
        r
    }
}

#[derive(Default)]
struct Ledger {
    acked: Vec<(i64, i64)>,
    unacked: Vec<(i64, i64)>,
    retries: u64,
}

async fn writer(
    w: u64,
    addrs: Vec<String>,
    batch_rows: u64,
    stop: Arc<AtomicBool>,
    ledger: Arc<Mutex<Ledger>>,
) -> anyhow::Result<()> {
    let n = addrs.len() as u32;
    let mut clients = Clients { addrs, clients: HashMap::new() };
    let mut rng = StdRng::seed_from_u64(w);
    let mut batch = 0i64;
    while !stop.load(Ordering::SeqCst) {
        let first = (w as i64) * 1_000_000_000 + batch * batch_rows as i64;
        let range = (first, first + batch_rows as i64);
        let values: Vec<String> = (range.0..range.1).map(|id| format!("({id}, {w})")).collect();
        let sql = format!("INSERT INTO {TABLE} VALUES {} SETTINGS insert_id = 'w{w}-b{batch}'", values.join(", "));
        let started = Instant::now();
        let mut acked = false;
        // Retry through random nodes with the same insert id until acknowledged (or 120 s).
        while started.elapsed() < Duration::from_secs(120) {
            let rank = rng.random_range(0..n);
            match clients.run(rank, &sql).await {
                Ok(_) => {
                    acked = true;
                    break;
                }
                Err(e) => {
                    tracing::debug!("writer {w}: batch {batch} via rank {rank}: {e}");
                    ledger.lock().await.retries += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        let mut l = ledger.lock().await;
        if acked {
            l.acked.push(range)
        } else {
            l.unacked.push(range)
        }
        batch += 1;
    }
    Ok(())
}

pub async fn run(args: CrashArgs) -> anyhow::Result<ExitCode> {
    if args.nodes < 2 || args.replicas == 0 || args.replicas > args.nodes {
        bail!("--nodes must be at least 2 and --replicas from 1 to --nodes");
    }
    let temp = match &args.data_dir {
        Some(_) => None,
        None => Some(tempfile::tempdir().context("cannot create a temp dir")?),
    };
    let dir = args.data_dir.clone().or_else(|| temp.as_ref().map(|t| t.path().to_path_buf())).context("no dir")?;
    let seed = args.seed.unwrap_or_else(rand::random);
    let started = Instant::now();
    let mut cluster = ProcCluster::start(args.nodes, &dir, &[]).await?;
    let addrs: Vec<String> = (0..args.nodes).map(|r| cluster.flight_addr(r)).collect();
    let mut admin = Clients { addrs: addrs.clone(), clients: HashMap::new() };
    admin
        .run(
            0,
            &format!(
                "CREATE TABLE {TABLE} (id BIGINT, writer BIGINT) WITH (shard_key = 'id', replicas = {}, \
                 sync_mode = 'delay_mode_distributed', delay_max_ms = 50)",
                args.replicas
            ),
        )
        .await
        .map_err(|e| anyhow::anyhow!("cannot create the table: {e}"))?;

    let stop = Arc::new(AtomicBool::new(false));
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let writers: Vec<_> = (0..args.writers)
        .map(|w| tokio::spawn(writer(u64::from(w), addrs.clone(), args.batch_rows, stop.clone(), ledger.clone())))
        .collect();

    let mut rng = StdRng::seed_from_u64(seed);
    let mut kills_per_rank = vec![0u32; args.nodes as usize];
    for k in 0..args.kills {
        let wait = rng.random_range(args.kill_interval_ms / 2..=args.kill_interval_ms * 3 / 2);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        let rank = rng.random_range(0..args.nodes);
        cluster.kill9(rank).await?;
        kills_per_rank[rank as usize] += 1;
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..=args.max_down_ms))).await;
        cluster.restart(rank).await.with_context(|| format!("restart after kill {}", k + 1))?;
        eprintln!("kill {}/{}: rank {rank} killed and restarted", k + 1, args.kills);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::SeqCst);
    for w in writers {
        w.await.context("writer task failed")??;
    }

    // Flush (retried: a node may still be rejoining), then check by id.
    let deadline = Instant::now() + Duration::from_millis(args.flush_timeout_ms);
    loop {
        match admin.run(0, &format!("SYSTEM FLUSH DISTRIBUTED {TABLE} SETTINGS flush_timeout_ms = 10000")).await {
            Ok(_) => break,
            Err(e) if Instant::now() < deadline => {
                tracing::debug!("flush: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => bail!("the final flush failed: {e}"),
        }
    }
    let batches = admin.run(0, &format!("SELECT id FROM {TABLE}")).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut seen: HashMap<i64, u32> = HashMap::new();
    for b in &batches {
        let ids = b.column(0).as_any().downcast_ref::<Int64Array>().context("id column is not Int64")?;
        for id in ids.iter().flatten() {
            *seen.entry(id).or_default() += 1;
        }
    }
    let ledger = ledger.lock().await;
    let mut violations = Vec::new();
    let mut acked_rows = 0u64;
    let mut known: HashSet<i64> = HashSet::new();
    for &(a, b) in &ledger.acked {
        for id in a..b {
            acked_rows += 1;
            known.insert(id);
            match seen.get(&id).copied().unwrap_or(0) {
                1 => {}
                c => violations.push(format!("acknowledged id {id} present {c} times")),
            }
        }
    }
    let mut unacked_present = 0u64;
    for &(a, b) in &ledger.unacked {
        for id in a..b {
            known.insert(id);
            match seen.get(&id).copied().unwrap_or(0) {
                0 => {}
                1 => unacked_present += 1,
                c => violations.push(format!("unacknowledged id {id} present {c} times")),
            }
        }
    }
    for (id, _) in seen.iter().filter(|(id, _)| !known.contains(id)) {
        violations.push(format!("id {id} was never sent"));
    }
    let shards = admin
        .run(0, &format!("SELECT shard, replica, rows FROM system.shards WHERE \"table\" = '{TABLE}'"))
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut per_shard: HashMap<u32, Vec<Option<u64>>> = HashMap::new();
    for b in &shards {
        let shard = b.column(0).as_any().downcast_ref::<UInt32Array>().context("shard column")?;
        let rows = b.column(2).as_any().downcast_ref::<UInt64Array>().context("rows column")?;
        for i in 0..b.num_rows() {
            per_shard.entry(shard.value(i)).or_default().push(rows.is_valid(i).then(|| rows.value(i)));
        }
    }
    for (shard, counts) in &per_shard {
        if counts.iter().any(|c| c.is_none() || *c != counts[0]) {
            violations.push(format!("shard {shard}: replicas differ: {counts:?}"));
        }
    }
    cluster.stop().await;
    let summary = serde_json::json!({
        "kills": args.kills,
        "kills_per_rank": kills_per_rank,
        "nodes": args.nodes,
        "replicas": args.replicas,
        "seed": seed,
        "acked_batches": ledger.acked.len(),
        "acked_rows": acked_rows,
        "unacked_batches": ledger.unacked.len(),
        "unacked_rows_present": unacked_present,
        "rows_present": seen.len(),
        "writer_retries": ledger.retries,
        "violations": violations.len(),
        "elapsed_s": started.elapsed().as_secs_f64(),
    });
    println!("{summary}");
    if violations.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        for v in violations.iter().take(20) {
            eprintln!("violation: {v}");
        }
        if let Some(t) = temp {
            eprintln!("data kept in {}", t.keep().display());
        }
        Ok(ExitCode::FAILURE)
    }
}
