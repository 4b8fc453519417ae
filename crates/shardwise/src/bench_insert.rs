//! `shardwise bench insert`: latency of small inserts in each sync mode, beside a bare fsync.
//!
//! Starts 3 node processes, creates one `immediate` and one `delay_mode_distributed` table (both
//! `replicas = 2`), and times `--count` inserts of `--rows` rows each through rank 0, as a client
//! sees them (Flight SQL bulk ingest: one call, no SQL parsing). In the same run it times the same
//! number of bare `write` + `fdatasync` calls of the same size on the same file system: the floor
//! any durable insert pays. The delay mode is then timed again with the two other nodes paused
//! (SIGSTOP): its latency must not depend on them. With `--others-data-dir` (e.g. on /dev/shm),
//! ranks 1 and 2 keep their data elsewhere, so that their fsyncs do not share rank 0's disk; with
//! `--pin`, rank 0 and this process (the client, and the bare fsyncs) run on CPU 0 and ranks 1
//! and 2 on CPU 1, so that their work does not take rank 0's CPU either: together, the other
//! nodes as on other machines. `--others-idle` is the CPU half of that without halving rank 0's
//! CPUs: ranks 1 and 2 run under `SCHED_IDLE`, so they only get CPU time that rank 0 and the
//! client leave. With `--timings-out FILE` every timed insert is written to a CSV file, with when
//! it was sent, so that the slow ones can be matched to what the nodes did then. With
//! `--server-timing`, each insert's time is split into rank 0's part (from the ingest handler's
//! start to its answer, from rank 0's debug log) and the rest (the client, gRPC and loopback on
//! both sides), so that a p99 can be traced to one or the other.
//! With `--bare-alongside`, the client also times a bare write + fdatasync right before each
//! insert: the floor at the same moments as the inserts, when the other nodes' work shares the
//! disk and the CPUs, beside the floor timed on an idle cluster. Each mode's CPU cost is printed
//! too: the CPU time rank 0, the two other nodes and the client used per insert (from `/proc`),
//! which moves less with the host's noise than a p99.

use std::collections::HashMap;
use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use arrow::array::{Float64Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow_flight::sql::CommandStatementIngest;
use arrow_flight::sql::client::FlightSqlServiceClient;
use tonic::transport::Endpoint;

use crate::cmd_sql::SqlClient;
use crate::proc_cluster::{ProcCluster, cpu_set, idle_priority, pin_this_process};
use crate::proc_stats::cpu_seconds;

#[derive(clap::Args, Debug, Clone)]
pub struct InsertBenchArgs {
    /// Inserts timed per mode.
    #[arg(long, default_value_t = 500)]
    pub count: usize,
    /// Rows per insert.
    #[arg(long, default_value_t = 100)]
    pub rows: usize,
    /// Where the nodes keep their data [default: a temporary directory].
    #[arg(long)]
    pub data_dir: Option<std::path::PathBuf>,
    /// Keep ranks 1 and 2's data here instead (e.g. on /dev/shm), so that their writes and
    /// fsyncs do not share rank 0's disk, as on separate machines (created if missing).
    #[arg(long)]
    pub others_data_dir: Option<std::path::PathBuf>,
    /// Rank 0 and this process (the client) on CPU 0, ranks 1 and 2 on CPU 1, so that the other
    /// nodes' work does not take rank 0's CPU, as on separate machines (needs 2 CPUs).
    #[arg(long)]
    pub pin: bool,
    /// Run ranks 1 and 2 under the `SCHED_IDLE` policy: they get only CPU time that rank 0 and
    /// the client leave, as on machines of their own, while all three share both CPUs (unlike
    /// `--pin`, which leaves rank 0 and the client one CPU).
    #[arg(long)]
    pub others_idle: bool,
    /// Write every timed insert to this CSV file (mode, insert id, start and duration in ms, and
    /// rank 0's handler time with `--server-timing`), to see when the slow ones came.
    #[arg(long)]
    pub timings_out: Option<std::path::PathBuf>,
    /// More table options for both tables, as in `WITH (..)`, e.g. `delay_max_ms = 60000` (no
    /// background shipping while the inserts are timed).
    #[arg(long)]
    pub table_options: Option<String>,
    /// Also split each insert's time into rank 0's part (from its ingest handler's start to the
    /// answer, read from rank 0's debug log) and the rest (client, gRPC, loopback). Rank 0 then
    /// writes one log line per insert, which adds a little to both.
    #[arg(long)]
    pub server_timing: bool,
    /// Also time a bare write + fdatasync of the same size right before each insert, on the
    /// client's thread and the nodes' file system: the floor at the same moments as the inserts
    /// (the other nodes' work sharing the disk and CPUs), beside the floor timed on an idle
    /// cluster before the inserts.
    #[arg(long)]
    pub bare_alongside: bool,
    /// Send the inserts at this many a second (open loop) instead of each right after the one
    /// before (closed loop, the default: the node's and the client's most a second, where the
    /// latency includes waiting for a CPU behind the benchmark's own load). An insert sent late,
    /// because the one before it took longer than its share, is timed from when it was due, so
    /// slow answers are not hidden by sending fewer requests. The bare fsyncs keep the same pace.
    #[arg(long, value_parser = parse_rate)]
    pub rate: Option<f64>,
}

/// `--rate`: a positive, finite number of inserts a second.
fn parse_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate > 0.0 => Ok(rate),
        _ => Err(format!("`{text}` is not a positive number of inserts a second")),
    }
}

/// When the calls of a series are sent: each right after the one before, or at a fixed rate.
#[derive(Debug, Clone, Copy)]
struct Pace {
    interval: Option<Duration>,
    first: Instant,
}

impl Pace {
    fn new(rate: Option<f64>) -> Pace {
        Pace { interval: rate.map(|r| Duration::from_secs_f64(1.0 / r)), first: Instant::now() }
    }

    /// Waits (blocking the thread, for a wake-up finer than the runtime's 1 ms timer) until call
    /// `i` is due, and returns when its time starts: when it was due if it is late (the call
    /// before took longer than its share), else now.
    fn wait_for(&self, i: usize) -> Instant {
        let Some(interval) = self.interval else { return Instant::now() };
        let due = self.first + interval.mul_f64(i as f64);
        let now = Instant::now();
        match due.checked_duration_since(now) {
            Some(wait) if !wait.is_zero() => {
                std::thread::sleep(wait);
                Instant::now()
            }
            _ => due,
        }
    }
}

/// Where and how large the bare fsyncs timed alongside the inserts are (`--bare-alongside`).
#[derive(Debug, Clone)]
struct BareProbe {
    dir: std::path::PathBuf,
    bytes: usize,
}

/// A bare `write` + `fdatasync` of a fixed size into one file, timed call by call.
struct BareFsync {
    path: std::path::PathBuf,
    file: std::fs::File,
    payload: Vec<u8>,
}

impl BareFsync {
    fn create(dir: &std::path::Path, name: &str, bytes: usize) -> anyhow::Result<Self> {
        let path = dir.join(name);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        Ok(BareFsync { path, file, payload: vec![7u8; bytes] })
    }

    /// One write + fdatasync, in milliseconds.
    fn time_one(&mut self) -> anyhow::Result<f64> {
        let started = Instant::now();
        self.file.write_all(&self.payload)?;
        self.file.sync_data()?;
        Ok(started.elapsed().as_secs_f64() * 1000.0)
    }
}

impl Drop for BareFsync {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Inserts sent before the timed ones in each series, to warm the connection and caches up.
const WARMUP_INSERTS: usize = 20;

/// Node log filter for `--server-timing`: the default, plus the ingest handler's per-call line.
const SERVER_TIMING_LOG_FILTER: &str = "info,shardwise_server::ingest=debug";

/// One timed insert, as the client saw it.
#[derive(Debug, Clone, PartialEq)]
struct TimedInsert {
    insert_id: String,
    /// When it was sent, in milliseconds since the series' first timed insert.
    start_ms: f64,
    /// How long it took, in milliseconds.
    ms: f64,
}

type Timed = Vec<TimedInsert>;

fn sorted_ms(timed: &Timed) -> Vec<f64> {
    let mut ms: Vec<f64> = timed.iter().map(|t| t.ms).collect();
    ms.sort_by(f64::total_cmp);
    ms
}

/// The insert id and the handler's time in microseconds (receiving plus storing) of one of the
/// ingest handler's debug lines (`... bulk ingest ... insert_id=ID ... received_us=N stored_us=M`).
fn parse_ingest_line(line: &str) -> Option<(String, u64)> {
    if !line.contains("bulk ingest") {
        return None;
    }
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
            .map(|v| v.trim_matches('"').to_string())
    };
    let received: u64 = field("received_us")?.parse().ok()?;
    let stored: u64 = field("stored_us")?.parse().ok()?;
    Some((field("insert_id")?, received + stored))
}

/// Rank 0's handler time and the rest (ms, each sorted), for the inserts of `timed` that
/// `server_us` (from rank 0's log) has.
fn split_times(timed: &Timed, server_us: &HashMap<String, u64>) -> (Vec<f64>, Vec<f64>) {
    let (mut server, mut rest) = (Vec::new(), Vec::new());
    for t in timed {
        if let Some(server_ms) = handler_ms(server_us, &t.insert_id) {
            server.push(server_ms);
            rest.push(t.ms - server_ms);
        }
    }
    server.sort_by(f64::total_cmp);
    rest.sort_by(f64::total_cmp);
    (server, rest)
}

/// Rank 0's handler time for `insert_id`, in ms, if its log has it.
fn handler_ms(server_us: &HashMap<String, u64>, insert_id: &str) -> Option<f64> {
    server_us.get(insert_id).map(|us| *us as f64 / 1000.0)
}

/// The `--timings-out` file: one line per timed insert, in the order sent.
fn timings_csv(modes: &[(&str, &Timed)], server_us: &HashMap<String, u64>) -> String {
    let mut out = String::from("mode,insert_id,start_ms,ms,handler_ms\n");
    for (mode, timed) in modes {
        for t in timed.iter() {
            let handler = handler_ms(server_us, &t.insert_id).map(|ms| format!("{ms:.3}")).unwrap_or_default();
            out.push_str(&format!("{mode},{},{:.3},{:.3},{handler}\n", t.insert_id, t.start_ms, t.ms));
        }
    }
    out
}

/// CPU seconds used so far by rank 0, by ranks 1 and 2 together, and by this process (the client).
#[derive(Debug, Clone, Copy, PartialEq)]
struct CpuUse {
    rank0: f64,
    others: f64,
    client: f64,
}

impl CpuUse {
    /// Now, or `None` where `/proc` does not say (then no CPU line is printed).
    fn now(cluster: &ProcCluster) -> Option<CpuUse> {
        let of = |ranks: &[u32]| -> Option<f64> {
            cluster.pids(ranks).iter().map(|pid| cpu_seconds(pid.as_raw() as u32)).sum::<Option<f64>>()
        };
        Some(CpuUse { rank0: of(&[0])?, others: of(&[1, 2])?, client: cpu_seconds(std::process::id())? })
    }

    /// Milliseconds of CPU per insert between `before` and `self`, over `count` inserts.
    fn per_insert_ms(&self, before: &CpuUse, count: usize) -> CpuUse {
        let per = |a: f64, b: f64| (a - b).max(0.0) * 1000.0 / count.max(1) as f64;
        CpuUse {
            rank0: per(self.rank0, before.rank0),
            others: per(self.others, before.others),
            client: per(self.client, before.client),
        }
    }
}

fn percentile(sorted_ms: &[f64], p: f64) -> f64 {
    if sorted_ms.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted_ms.len() as f64 - 1.0) * p).round() as usize;
    sorted_ms[i.min(sorted_ms.len() - 1)]
}

fn batch(rows: usize, start: i64) -> anyhow::Result<RecordBatch> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("name", DataType::Utf8, true),
        Field::new("v", DataType::Float64, true),
    ]));
    let ids: Vec<i64> = (start..start + rows as i64).collect();
    let names: Vec<String> = ids.iter().map(|i| format!("name-{i}")).collect();
    Ok(RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(ids.clone())),
            Arc::new(StringArray::from(names)),
            Arc::new(Float64Array::from(ids.iter().map(|i| *i as f64 * 0.5).collect::<Vec<_>>())),
        ],
    )?)
}

/// Times the inserts from a thread of its own running a single-threaded runtime, as most clients
/// are (psql, a Python driver): the client's request and its connection's I/O then run on one
/// thread, without a wake-up of another thread for each message.
/// With a probe, a bare fsync is timed right before each timed insert (sorted, in ms).
async fn time_inserts(run: InsertRun, args: &InsertBenchArgs) -> anyhow::Result<(Timed, Vec<f64>)> {
    let args = args.clone();
    let timer = std::thread::Builder::new().name("insert-client".into()).spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        runtime.block_on(time_inserts_here(&run, &args))
    })?;
    tokio::task::spawn_blocking(move || timer.join())
        .await?
        .map_err(|_| anyhow!("the insert client thread panicked"))?
}

/// One timed series of inserts: into `table` through `addr`, ids and keys from `offset` on.
struct InsertRun {
    addr: String,
    table: &'static str,
    offset: i64,
    probe: Option<BareProbe>,
}

/// One bulk ingest, as `FlightSqlServiceClient::execute_ingest` sends it, but with the answer
/// read to its end. `execute_ingest` drops the answer after its first message, which resets the
/// stream when the server's trailers have not arrived yet; the HTTP/2 client counts such resets
/// and, after 1024 on one connection, ends it (`GoAway too_many_internal_resets`): against a
/// faster insert path every run of more than about a thousand inserts failed.
async fn ingest(
    client: &mut FlightSqlServiceClient<tonic::transport::Channel>,
    cmd: CommandStatementIngest,
    batch: RecordBatch,
) -> anyhow::Result<()> {
    use arrow_flight::sql::ProstMessageExt;
    use futures::TryStreamExt;
    use prost::Message;
    let descriptor = arrow_flight::FlightDescriptor::new_cmd(cmd.as_any().encode_to_vec());
    let data: Vec<arrow_flight::FlightData> = arrow_flight::encode::FlightDataEncoderBuilder::new()
        .with_flight_descriptor(Some(descriptor))
        .build(futures::stream::iter([Ok(batch)]))
        .try_collect()
        .await?;
    let mut answer = client.inner_mut().do_put(futures::stream::iter(data)).await?.into_inner();
    while answer.message().await?.is_some() {}
    Ok(())
}

async fn time_inserts_here(run: &InsertRun, args: &InsertBenchArgs) -> anyhow::Result<(Timed, Vec<f64>)> {
    let InsertRun { addr, table, offset, probe } = run;
    let (table, offset) = (*table, *offset);
    let channel = Endpoint::from_shared(format!("http://{addr}"))?.connect().await?;
    let mut client = FlightSqlServiceClient::new(channel);
    let mut times = Vec::with_capacity(args.count);
    let mut bare_file = match &probe {
        Some(p) => Some(BareFsync::create(&p.dir, &format!("bare-alongside-{table}-{offset}.bin"), p.bytes)?),
        None => None,
    };
    let mut bare = Vec::new();
    let mut first_timed: Option<Instant> = None;
    let pace = Pace::new(args.rate);
    for i in 0..args.count + WARMUP_INSERTS {
        let b = batch(args.rows, offset + (i * args.rows) as i64)?;
        let insert_id = format!("{table}-{offset}-{i}");
        let cmd = CommandStatementIngest {
            table: table.to_string(),
            options: HashMap::from([("insert_id".to_string(), insert_id.clone())]),
            ..Default::default()
        };
        let due = pace.wait_for(i);
        let mut probe_time = Duration::ZERO;
        if let Some(file) = bare_file.as_mut() {
            let ms = file.time_one()?;
            probe_time = Duration::from_secs_f64(ms / 1000.0);
            if i >= WARMUP_INSERTS {
                bare.push(ms);
            }
        }
        // Open loop: timed from when it was due (late if the insert before overran), less the
        // probe's fsync. Closed loop: from now, as it is sent.
        let started = match args.rate {
            Some(_) => due + probe_time,
            None => Instant::now(),
        };
        ingest(&mut client, cmd, b).await.map_err(|e| anyhow!("insert into {table}: {e:#}"))?;
        if i >= WARMUP_INSERTS {
            let ms = started.elapsed().as_secs_f64() * 1000.0;
            let start_ms = started.duration_since(*first_timed.get_or_insert(started)).as_secs_f64() * 1000.0;
            times.push(TimedInsert { insert_id, start_ms, ms });
        }
    }
    bare.sort_by(f64::total_cmp);
    Ok((times, bare))
}

fn time_bare_fsync(dir: &std::path::Path, bytes: usize, count: usize, rate: Option<f64>) -> anyhow::Result<Vec<f64>> {
    let mut file = BareFsync::create(dir, "bare-fsync.bin", bytes)?;
    let pace = Pace::new(rate);
    let mut times = (0..count)
        .map(|i| {
            pace.wait_for(i);
            file.time_one()
        })
        .collect::<anyhow::Result<Vec<f64>>>()?;
    times.sort_by(f64::total_cmp);
    Ok(times)
}

/// Makes ranks 1 and 2's data dirs (`DIR/rank-R`) links into a fresh directory under `base`
/// (created if missing, as `--data-dir` is), removed when the returned guard drops.
fn place_others(base: &std::path::Path, dir: &std::path::Path) -> anyhow::Result<tempfile::TempDir> {
    std::fs::create_dir_all(base).with_context(|| format!("cannot create {}", base.display()))?;
    let others =
        tempfile::tempdir_in(base).with_context(|| format!("cannot create a directory in {}", base.display()))?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for rank in [1, 2] {
        let target = others.path().join(format!("rank-{rank}"));
        std::fs::create_dir_all(&target).with_context(|| format!("cannot create {}", target.display()))?;
        let link = dir.join(format!("rank-{rank}"));
        std::os::unix::fs::symlink(&target, &link)
            .with_context(|| format!("cannot link {} (does it exist already?)", link.display()))?;
    }
    Ok(others)
}

pub async fn run(args: InsertBenchArgs) -> anyhow::Result<ExitCode> {
    let temp = tempfile::tempdir().context("cannot create a temp dir")?;
    let dir = args.data_dir.clone().unwrap_or_else(|| temp.path().to_path_buf());
    let others_temp = match &args.others_data_dir {
        Some(base) => Some(place_others(base, &dir)?),
        None => None,
    };
    let node_args = match args.server_timing {
        true => vec!["--log".to_string(), SERVER_TIMING_LOG_FILTER.to_string()],
        false => Vec::new(),
    };
    let cluster = match args.pin {
        true => {
            pin_this_process(&cpu_set(&[0])?)?;
            ProcCluster::start_pinned(3, &dir, &node_args, vec![vec![0], vec![1], vec![1]]).await?
        }
        false => ProcCluster::start(3, &dir, &node_args).await?,
    };
    if args.others_idle {
        for pid in cluster.pids(&[1, 2]) {
            idle_priority(pid)?;
        }
    }
    let addr = cluster.flight_addr(0);
    let mut sql = SqlClient::connect(&addr, "default", "", Duration::from_secs(5)).await?;
    let extra = args.table_options.as_deref().map(|o| format!(", {o}")).unwrap_or_default();
    for (table, mode) in [("lat_immediate", "immediate"), ("lat_delay", "delay_mode_distributed")] {
        sql.query(&format!(
            "CREATE TABLE {table} (id BIGINT, name VARCHAR, v DOUBLE) WITH (shard_key = 'id', replicas = 2, \
             sync_mode = '{mode}'{extra})"
        ))
        .await
        .map_err(|e| anyhow!("{e}"))?;
    }
    let payload_bytes = {
        let mut buf = Vec::new();
        let b = batch(args.rows, 0)?;
        let mut w = arrow::ipc::writer::StreamWriter::try_new(&mut buf, &b.schema())?;
        w.write(&b)?;
        w.finish()?;
        drop(w);
        buf.len()
    };
    let bare = time_bare_fsync(&dir, payload_bytes, args.count, args.rate)?;
    let probe = args.bare_alongside.then(|| BareProbe { dir: dir.clone(), bytes: payload_bytes });
    let run = |table: &'static str, offset: i64| InsertRun { addr: addr.clone(), table, offset, probe: probe.clone() };
    // The inserts of a series and their warm-up, for CPU per insert.
    let sent = args.count + WARMUP_INSERTS;
    let cpu_start = CpuUse::now(&cluster);
    let (immediate, immediate_bare) = time_inserts(run("lat_immediate", 0), &args).await?;
    let cpu_immediate = CpuUse::now(&cluster);
    let (delay, delay_bare) = time_inserts(run("lat_delay", 0), &args).await?;
    let cpu_delay = CpuUse::now(&cluster);
    // The other nodes paused: a delay-mode insert must not wait for them.
    let pids = cluster.pids(&[1, 2]);
    for pid in &pids {
        let _ = nix::sys::signal::kill(*pid, nix::sys::signal::Signal::SIGSTOP);
    }
    let paused = time_inserts(run("lat_delay", 10_000_000), &args).await;
    let cpu_paused = CpuUse::now(&cluster);
    for pid in &pids {
        let _ = nix::sys::signal::kill(*pid, nix::sys::signal::Signal::SIGCONT);
    }
    let (paused, paused_bare) = paused?;
    let cpu = [(cpu_start, cpu_immediate), (cpu_immediate, cpu_delay), (cpu_delay, cpu_paused)]
        .map(|(a, b)| Some(b?.per_insert_ms(&a?, sent)));
    let rank0_log = cluster.log(0);
    cluster.stop().await;
    let server_us: HashMap<String, u64> = match args.server_timing {
        true => std::fs::read_to_string(&rank0_log)
            .with_context(|| format!("cannot read {}", rank0_log.display()))?
            .lines()
            .filter_map(parse_ingest_line)
            .collect(),
        false => HashMap::new(),
    };
    drop(others_temp);
    if let Some(path) = &args.timings_out {
        let modes =
            [("immediate", &immediate), ("delay_mode_distributed", &delay), ("delay_mode_distributed_paused", &paused)];
        std::fs::write(path, timings_csv(&modes, &server_us))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }

    let bare_p99 = percentile(&bare, 0.99);
    println!(
        "{} inserts of {} rows ({} bytes as Arrow IPC) per mode; 3 nodes, replicas = 2{}",
        args.count,
        args.rows,
        payload_bytes,
        if args.pin { "; rank 0 and the client on CPU 0, ranks 1 and 2 on CPU 1" } else { "" }
    );
    if args.others_idle {
        println!("ranks 1 and 2 under SCHED_IDLE (--others-idle)");
    }
    match args.rate {
        Some(rate) => println!("open loop: {rate} inserts (and bare fsyncs) a second, each timed from when it was due"),
        None => println!("closed loop: each insert sent when the one before it was answered"),
    }
    println!("{:<36} {:>9} {:>9} {:>22}", "what", "p50_ms", "p99_ms", "p99 - bare fsync p99");
    let line = |what: &str, t: &[f64]| {
        let p99 = percentile(t, 0.99);
        println!("{what:<36} {:>9.3} {:>9.3} {:>19.3} ms", percentile(t, 0.5), p99, p99 - bare_p99);
    };
    line("bare write + fdatasync", &bare);
    let modes = [
        ("immediate", &immediate),
        ("delay_mode_distributed", &delay),
        ("delay_mode_distributed, others paused", &paused),
    ];
    for (what, timed) in modes {
        line(what, &sorted_ms(timed));
    }
    if args.bare_alongside {
        println!("bare write + fdatasync right before each insert (--bare-alongside), p50 / p99, and the gap:");
        for ((what, timed), alongside) in modes.iter().zip([&immediate_bare, &delay_bare, &paused_bare]) {
            let (p50, p99) = (percentile(alongside, 0.5), percentile(alongside, 0.99));
            let gap = percentile(&sorted_ms(timed), 0.99) - p99;
            println!("  {what:<40} bare {p50:.3} / {p99:.3} ms; insert p99 - bare p99 {gap:.3} ms");
        }
    }
    if cpu.iter().all(Option::is_some) {
        println!(
            "CPU per insert (ms; warm-up inserts included; the client's whole process, with any --bare-alongside fsyncs):"
        );
        for ((what, _), cpu) in modes.iter().zip(cpu.iter().flatten()) {
            println!("  {what:<40} rank 0 {:.3}, ranks 1 and 2 {:.3}, client {:.3}", cpu.rank0, cpu.others, cpu.client);
        }
    }
    if args.server_timing {
        println!("split (--server-timing): rank 0's ingest handler / the rest (client, gRPC, loopback)");
        for (what, timed) in modes {
            let (server, rest) = split_times(timed, &server_us);
            if server.len() < timed.len() {
                bail!("rank 0's log has {} of the {} inserts of {what}", server.len(), timed.len());
            }
            let p = |t: &[f64]| format!("{:.3} / {:.3}", percentile(t, 0.5), percentile(t, 0.99));
            println!("  {what:<40} handler p50 / p99 {:>15} ms, rest {:>15} ms", p(&server), p(&rest));
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_per_insert_is_the_difference_over_the_count() {
        let before = CpuUse { rank0: 1.0, others: 2.0, client: 0.5 };
        let after = CpuUse { rank0: 1.9, others: 2.3, client: 0.5 };
        let per = after.per_insert_ms(&before, 3000);
        assert!((per.rank0 - 0.3).abs() < 1e-9 && (per.others - 0.1).abs() < 1e-9, "{per:?}");
        assert_eq!(per.client, 0.0);
        // A reading that went backwards (a restarted process) counts as nothing, not as negative.
        assert_eq!(before.per_insert_ms(&after, 3000).rank0, 0.0);
    }

    #[test]
    fn ingest_debug_lines_are_read_and_joined_with_the_client_times() {
        let log = "2026-12-02T11:50:01.000001Z  INFO node ready rank=0\n\
                   2026-12-02T11:50:02.000001Z DEBUG bulk ingest table=t insert_id=t-0-20 rows=100 streamed=false \
                   received_us=40 stored_us=260\n\
                   2026-12-02T11:50:02.000002Z DEBUG bulk ingest table=t insert_id=\"t-0-21\" rows=100 \
                   streamed=false received_us=x stored_us=1\n";
        let server_us: HashMap<String, u64> = log.lines().filter_map(parse_ingest_line).collect();
        assert_eq!(server_us, HashMap::from([("t-0-20".to_string(), 300)]));
        let at = |id: &str, ms: f64| TimedInsert { insert_id: id.to_string(), start_ms: 0.0, ms };
        let timed: Timed = vec![at("t-0-20", 0.5), at("t-0-21", 0.7)];
        let (server, rest) = split_times(&timed, &server_us);
        assert_eq!(server, vec![0.3]);
        assert!((rest[0] - 0.2).abs() < 1e-9, "{rest:?}");
        let csv = timings_csv(&[("delay", &timed)], &server_us);
        assert_eq!(
            csv,
            "mode,insert_id,start_ms,ms,handler_ms\ndelay,t-0-20,0.000,0.500,0.300\ndelay,t-0-21,0.000,0.700,\n"
        );
    }

    #[test]
    fn a_paced_call_is_timed_from_when_it_was_due_when_late_and_from_its_wake_up_otherwise() {
        let interval = Duration::from_millis(20);
        let first = Instant::now() - Duration::from_millis(100);
        let pace = Pace { interval: Some(interval), first };
        // Call 2 was due 60 ms ago: sent at once, timed from then.
        assert_eq!(pace.wait_for(2), first + interval * 2);
        // Call 6 is due in 20 ms: waited for, timed from the wake-up.
        let woke = pace.wait_for(6);
        assert!(woke >= first + interval * 6);
        // Closed loop: now.
        let before = Instant::now();
        assert!(Pace::new(None).wait_for(1_000) >= before);
        assert!(parse_rate("0").is_err() && parse_rate("nan").is_err() && parse_rate("-3").is_err());
        assert_eq!(parse_rate("250"), Ok(250.0));
    }

    #[test]
    fn other_ranks_data_goes_under_a_base_made_if_missing() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (base, dir) = (tmp.path().join("not/yet"), tmp.path().join("nodes"));
        let others = place_others(&base, &dir).expect("placed");
        for rank in [1, 2] {
            let link = dir.join(format!("rank-{rank}"));
            let target = std::fs::read_link(&link).expect("a link");
            assert!(target.starts_with(&base) && target.is_dir(), "{}", target.display());
        }
        drop(others);
        assert!(!dir.join("rank-1").exists(), "the linked directories go with the guard");
    }
}
