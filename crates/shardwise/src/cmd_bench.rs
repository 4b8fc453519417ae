//! `shardwise bench`: benchmarks that print ratios against a baseline measured in the same run
//! (this machine's speed drifts; ratios hold). Figures go to BENCHMARKS.md with the command.
//!
//! `bench init` measures cluster start-up: for each N, the time until every rank of a fresh
//! N-node cluster has passed the barrier (`node --exit-after-init`), beside the time the same
//! machine needs just to start N node processes that exit at once (`node --dry-run`); and the
//! resident memory of an idle node.

use std::path::Path;
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub which: BenchKind,
}

#[derive(clap::Subcommand, Debug)]
pub enum BenchKind {
    /// Cluster start-up time against bare process start-up, and idle memory.
    Init(InitBenchArgs),
    /// Crash soak: kill -9 random nodes while writing to a delay_mode_distributed table, then
    /// check every acknowledged row is present exactly once.
    Crash(crate::bench_crash::CrashArgs),
    /// Latency of small inserts in each sync mode beside a bare local fsync, and the CPU each
    /// insert cost the nodes and the client.
    Insert(crate::bench_insert::InsertBenchArgs),
    /// Bulk CSV load throughput on 2 and 3 nodes, beside ClickHouse in the same run.
    Load(crate::bench_load::LoadBenchArgs),
    /// db-benchmark groupby q1-q10: a 1-node cluster beside plain DataFusion, and 1 -> 2 nodes
    /// beside DataFusion's 1 -> 2 threads.
    Groupby(crate::bench_groupby::GroupbyBenchArgs),
    /// The initiator's peak memory for a GROUP BY as groups grow from 1e3 to 1e7, with initiator
    /// merge and with shuffle aggregation.
    Memory(crate::bench_memory::MemoryBenchArgs),
}

#[derive(clap::Args, Debug)]
pub struct InitBenchArgs {
    /// Cluster sizes to measure, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "8,64,256")]
    pub nproc: Vec<u32>,
    /// Runs per size; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub repeat: u32,
    /// Give up on one run after this long.
    #[arg(long, default_value_t = 120_000)]
    pub timeout_ms: u64,
}

pub async fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let before = crate::cpu_steal::CpuTimes::now();
    let result = match args.which {
        BenchKind::Init(a) => init(a).await,
        BenchKind::Crash(a) => crate::bench_crash::run(a).await,
        BenchKind::Insert(a) => crate::bench_insert::run(a).await,
        BenchKind::Load(a) => crate::bench_load::run(a).await,
        BenchKind::Groupby(a) => crate::bench_groupby::run(a).await,
        BenchKind::Memory(a) => crate::bench_memory::run(a).await,
    };
    let after = crate::cpu_steal::CpuTimes::now();
    if let (Some(before), Some(after)) = (before, after)
        && let Some(steal) = after.steal_percent_since(&before)
    {
        // On stderr: some benches end stdout with a JSON summary line.
        eprintln!("CPU time stolen by the hypervisor during the run: {steal:.1}%");
    }
    result
}

async fn init(args: InitBenchArgs) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("cannot find the shardwise executable")?;
    let timeout = Duration::from_millis(args.timeout_ms);
    println!("{:>6} {:>14} {:>14} {:>8}", "ranks", "bare_start_ms", "init_ms", "ratio");
    for &n in &args.nproc {
        if n == 0 {
            bail!("--nproc values must be positive");
        }
        let mut bare = Vec::new();
        let mut full = Vec::new();
        for _ in 0..args.repeat.max(1) {
            bare.push(start_all(&exe, n, None, timeout).await?);
            let dir = tempfile::tempdir().context("cannot create a temp dir")?;
            full.push(start_all(&exe, n, Some(dir.path()), timeout).await?);
        }
        let (b, f) = (median(&mut bare), median(&mut full));
        println!("{n:>6} {b:>14.1} {f:>14.1} {:>8.2}", f / b);
    }
    let rss_kib = idle_rss_kib(&exe, timeout).await?;
    println!("idle node resident memory: {:.1} MiB", rss_kib as f64 / 1024.0);
    Ok(ExitCode::SUCCESS)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Starts `n` nodes at once and waits until each has printed its JSON line (with a data dir:
/// a real cluster, `--exit-after-init`) or exited (without: `--dry-run`). Returns milliseconds.
async fn start_all(exe: &Path, n: u32, data: Option<&Path>, timeout: Duration) -> anyhow::Result<f64> {
    let port = crate::ports::free_port("127.0.0.1")?;
    let secret = hex::encode(rand::random::<[u8; 32]>());
    let started = Instant::now();
    let mut waits = tokio::task::JoinSet::new();
    for rank in 0..n {
        let mut cmd = Command::new(exe);
        cmd.arg("node")
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("SHARDWISE_CLUSTER_SECRET", &secret)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        match data {
            Some(d) => cmd.arg("--exit-after-init").arg("--data-dir").arg(d.join(format!("rank-{rank}"))),
            None => cmd.arg("--dry-run"),
        };
        let mut child = cmd.spawn().with_context(|| format!("cannot start rank {rank}"))?;
        let stdout = child.stdout.take().context("no stdout")?;
        waits.spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if line.starts_with('{') {
                    let at = started.elapsed();
                    let _ = child.wait().await;
                    return Ok(at);
                }
            }
            let status = child.wait().await?;
            anyhow::bail!("rank {rank} exited with {status} before printing its JSON line")
        });
    }
    let mut last = Duration::ZERO;
    let all = async {
        while let Some(r) = waits.join_next().await {
            last = last.max(r??);
        }
        anyhow::Ok(())
    };
    tokio::time::timeout(timeout, all)
        .await
        .with_context(|| format!("{n} ranks did not start within {timeout:?}"))??;
    Ok(last.as_secs_f64() * 1000.0)
}

/// Starts a 2-node cluster, lets it idle for a second, and reads the worker's VmRSS.
async fn idle_rss_kib(exe: &Path, timeout: Duration) -> anyhow::Result<u64> {
    let dir = tempfile::tempdir()?;
    let port = crate::ports::free_port("127.0.0.1")?;
    let mut children = Vec::new();
    for rank in 0..2u32 {
        let mut child = Command::new(exe)
            .args(["node", "--insecure", "--rank", &rank.to_string(), "--world-size", "2"])
            .env_remove("SHARDWISE_CLUSTER_SECRET")
            .env_remove("SHARDWISE_SECRET_FILE")
            .args(["--master-port", &port.to_string(), "--data-dir"])
            .arg(dir.path().join(format!("rank-{rank}")))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child.stdout.take().context("no stdout")?;
        children.push((child, BufReader::new(stdout).lines()));
    }
    for (_, lines) in children.iter_mut() {
        let ready = async {
            while let Ok(Some(l)) = lines.next_line().await {
                if l.starts_with("listening") {
                    return true;
                }
            }
            false
        };
        if !tokio::time::timeout(timeout, ready).await.unwrap_or(false) {
            bail!("the idle-memory cluster did not start");
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pid = children[1].0.id().context("worker exited")?;
    crate::proc_stats::status_kib(pid, "VmRSS:")
}
