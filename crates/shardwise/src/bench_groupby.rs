//! `shardwise bench groupby`: the db-benchmark groupby questions q1-q10 on shardwise beside plain
//! DataFusion in this process, on the same data, in the same run.
//!
//! 1. **Overhead**: a 1-node cluster (node process, queries over Flight SQL, answers collected by
//!    the client) against DataFusion with the same thread count on the same rows in memory.
//! 2. **Scaling** (unless `--skip-scaling`): 2 nodes each pinned to its own core against 1 node
//!    pinned to one core, beside the speedup DataFusion gets from 1 to 2 threads. Each engine
//!    gets those cores for everything it does: while it is timed, this process (the client that
//!    receives and decodes the answer, or DataFusion itself) is pinned to them too. Without that
//!    a 1-node cluster on core 0 had its client decode the answer on core 1 for free, which a
//!    2-node cluster, or DataFusion on 1 thread, does not get.
//!
//! Each query's time is the best of `--runs`, the runs interleaved across the engines compared;
//! answers are materialized (collected), and the row counts of shardwise and DataFusion must
//! agree before any time is reported. With `--instances N` every shardwise configuration is N
//! clusters, all interleaved, and its time is the mean of their best times: two clusters of one
//! build, loaded alike, can differ by 15-25% on a query for as long as they run (BENCHMARKS.md),
//! which one cluster per configuration puts straight into the ratios. The CSV comes from
//! `bench/gen_groupby_csv.py ROWS FILE`.

use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::datasource::MemTable;
use datafusion::prelude::{SessionConfig, SessionContext};

use crate::cmd_sql::SqlClient;
use crate::proc_cluster::{ProcCluster, cpu_set, pin_this_process};

#[derive(clap::Args, Debug, Clone)]
pub struct GroupbyBenchArgs {
    /// The CSV (header id1,id2,id3,id4,id5,id6,v1,v2,v3), e.g. from bench/gen_groupby_csv.py.
    #[arg(long)]
    pub csv: PathBuf,
    /// Queries to run, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "q1,q2,q3,q4,q5,q6,q7,q8,q9,q10")]
    pub queries: Vec<String>,
    /// An extra query over table `x` as `NAME=SQL`, timed after `--queries` the same way (e.g.
    /// `--sql 'scan=SELECT * FROM x'` to see what moving 10M rows costs). Repeatable.
    #[arg(long = "sql", value_name = "NAME=SQL", value_parser = named_query)]
    pub extra: Vec<(String, String)>,
    /// Runs per query; the best is reported.
    #[arg(long, default_value_t = 3)]
    pub runs: u32,
    /// Only the 1-node comparison (the scaling half runs 1 node on core 0 and 2 nodes on cores 0
    /// and 1, DataFusion on 1 and 2 threads, this process pinned to the cores of what it times).
    #[arg(long)]
    pub skip_scaling: bool,
    /// Where the nodes keep their data [default: a temporary directory].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Also time the 1-node cluster with these settings appended to every query (e.g.
    /// `string_group_keys_as_views = 0`), interleaved with the other runs: an A/B of a setting.
    #[arg(long, value_name = "NAME = VALUE, ...")]
    pub setting: Option<String>,
    /// Clusters per shardwise configuration (1 node; 1 and 2 nodes pinned), all interleaved; a
    /// configuration's time is the mean of its clusters' best times.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=MAX_INSTANCES))]
    pub instances: u32,
}

/// The most clusters per configuration `--instances` starts (each holds the whole table).
const MAX_INSTANCES: i64 = 4;

/// Parses `--sql NAME=SQL`.
fn named_query(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((name, sql)) if !name.trim().is_empty() && !sql.trim().is_empty() => {
            Ok((name.trim().to_string(), sql.trim().to_string()))
        }
        _ => Err(format!("expected NAME=SQL, got {text:?}")),
    }
}

/// db-benchmark's groupby questions, as its DataFusion script writes them.
pub const QUERIES: &[(&str, &str)] = &[
    ("q1", "SELECT id1, sum(v1) AS v1 FROM x GROUP BY id1"),
    ("q2", "SELECT id1, id2, sum(v1) AS v1 FROM x GROUP BY id1, id2"),
    ("q3", "SELECT id3, sum(v1) AS v1, avg(v3) AS v3 FROM x GROUP BY id3"),
    ("q4", "SELECT id4, avg(v1) AS v1, avg(v2) AS v2, avg(v3) AS v3 FROM x GROUP BY id4"),
    ("q5", "SELECT id6, sum(v1) AS v1, sum(v2) AS v2, sum(v3) AS v3 FROM x GROUP BY id6"),
    ("q6", "SELECT id4, id5, median(v3) AS median_v3, stddev(v3) AS sd_v3 FROM x GROUP BY id4, id5"),
    ("q7", "SELECT id3, max(v1) - min(v2) AS range_v1_v2 FROM x GROUP BY id3"),
    (
        "q8",
        "SELECT id6, v3 FROM (SELECT id6, v3, row_number() OVER (PARTITION BY id6 ORDER BY v3 DESC) AS row FROM x) t \
         WHERE row <= 2",
    ),
    ("q9", "SELECT id2, id4, pow(corr(v1, v2), 2) AS r2 FROM x GROUP BY id2, id4"),
    (
        "q10",
        "SELECT id1, id2, id3, id4, id5, id6, sum(v3) AS v3, count(*) AS count FROM x \
         GROUP BY id1, id2, id3, id4, id5, id6",
    ),
];

const CREATE: &str = "CREATE TABLE x (id1 VARCHAR, id2 VARCHAR, id3 VARCHAR, id4 INT, id5 INT, id6 INT, v1 INT, \
                      v2 INT, v3 DOUBLE) WITH (shard_key = 'id6')";

fn schema() -> SchemaRef {
    let utf8 = |n: &str| Field::new(n, DataType::Utf8, true);
    let int = |n: &str| Field::new(n, DataType::Int32, true);
    Arc::new(Schema::new(vec![
        utf8("id1"),
        utf8("id2"),
        utf8("id3"),
        int("id4"),
        int("id5"),
        int("id6"),
        int("v1"),
        int("v2"),
        Field::new("v3", DataType::Float64, true),
    ]))
}

/// One engine's best time per query, and its answer's row count.
type Timings = Vec<(Duration, usize)>;

fn rows(batches: &[RecordBatch]) -> usize {
    batches.iter().map(RecordBatch::num_rows).sum()
}

/// A loaded engine that answers the queries.
enum Engine {
    DataFusion(SessionContext),
    /// `cluster` is `None` for a second client of another engine's cluster; `settings` is
    /// appended to every query.
    Shardwise {
        cluster: Option<Box<ProcCluster>>,
        sql: Box<SqlClient>,
        settings: String,
    },
}

impl Engine {
    /// DataFusion with `threads` partitions over the same batches, in this process.
    fn datafusion(batches: &[RecordBatch], threads: usize) -> anyhow::Result<Engine> {
        let mut config = SessionConfig::new().with_target_partitions(threads);
        config.options_mut().sql_parser.map_string_types_to_utf8view = false;
        let ctx = SessionContext::new_with_config(config);
        let n = threads.max(1);
        let mut partitions = vec![Vec::new(); n];
        for (i, b) in batches.iter().enumerate() {
            partitions[i % n].push(b.clone());
        }
        ctx.register_table("x", Arc::new(MemTable::try_new(schema(), partitions)?))?;
        Ok(Engine::DataFusion(ctx))
    }

    /// A cluster of `nodes` node processes (pinned to `cpus` if given) with the CSV loaded.
    async fn shardwise(
        args: &GroupbyBenchArgs,
        dir: &Path,
        nodes: u32,
        cpus: Option<Vec<Vec<usize>>>,
    ) -> anyhow::Result<Engine> {
        let cluster = match cpus {
            Some(cpus) => ProcCluster::start_pinned(nodes, dir, &[], cpus).await?,
            None => ProcCluster::start(nodes, dir, &[]).await?,
        };
        let addr = cluster.flight_addr(0);
        let mut sql = SqlClient::connect(&addr, "default", "", Duration::from_secs(5)).await?;
        sql.query(CREATE).await.map_err(|e| anyhow!("{e}"))?;
        let out = tokio::process::Command::new(std::env::current_exe()?)
            .args(["load", "--connect", &addr, "--no-progress", "x"])
            .arg(&args.csv)
            .stdin(Stdio::null())
            .output()
            .await?;
        if !out.status.success() {
            bail!("shardwise load failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(Engine::Shardwise { cluster: Some(Box::new(cluster)), sql: Box::new(sql), settings: String::new() })
    }

    /// Another client of `engine`'s cluster that appends `SETTINGS settings` to every query.
    async fn with_settings(engine: &Engine, settings: &str) -> anyhow::Result<Engine> {
        let Engine::Shardwise { cluster: Some(cluster), .. } = engine else {
            bail!("settings apply to a shardwise cluster");
        };
        let mut sql = SqlClient::connect(&cluster.flight_addr(0), "default", "", Duration::from_secs(5)).await?;
        let clause = format!(" SETTINGS {settings}");
        // A bad name or value fails here, before anything is timed.
        sql.query(&format!("SELECT 1{clause}")).await.map_err(|e| anyhow!("--setting {settings:?}: {e}"))?;
        Ok(Engine::Shardwise { cluster: None, sql: Box::new(sql), settings: clause })
    }

    /// Runs `sql` to the last row; the answer's row count.
    async fn run(&mut self, name: &str, sql: &str) -> anyhow::Result<usize> {
        let answer = match self {
            Engine::DataFusion(ctx) => {
                ctx.sql(sql).await?.collect().await.with_context(|| format!("DataFusion {name}"))?
            }
            Engine::Shardwise { sql: client, settings, .. } => {
                let sql = format!("{sql}{settings}");
                client.query(&sql).await.map_err(|e| anyhow!("shardwise {name}{settings}: {e}"))?
            }
        };
        Ok(rows(&answer))
    }

    async fn stop(self) {
        if let Engine::Shardwise { cluster: Some(cluster), .. } = self {
            cluster.stop().await;
        }
    }
}

/// Each engine's best time and row count per query. The runs are interleaved (for each query,
/// each run goes through every engine in turn), so that the machine's speed, which drifts over
/// minutes on a shared host, weighs on every engine alike.
///
/// `cores[i]`, when given, are the CPUs engine `i` runs on: this process is pinned to them while
/// that engine is timed (and to the CPUs it started with otherwise).
async fn interleaved_times(
    args: &GroupbyBenchArgs,
    engines: &mut [Engine],
    cores: &[Option<Vec<usize>>],
    queries: &[(&str, &str)],
) -> anyhow::Result<Vec<Timings>> {
    let all_cores = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
        .context("cannot read this process's CPU affinity")?;
    let sets = (0..engines.len())
        .map(|i| match cores.get(i).and_then(Option::as_deref) {
            Some(cpus) => cpu_set(cpus),
            None => Ok(all_cores),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut times: Vec<Timings> = vec![Vec::new(); engines.len()];
    for (name, sql) in queries {
        let mut best = vec![(Duration::MAX, 0); engines.len()];
        for _ in 0..args.runs.max(1) {
            for ((engine, best), set) in engines.iter_mut().zip(&mut best).zip(&sets) {
                pin_this_process(set)?;
                let started = Instant::now();
                let n = engine.run(name, sql).await?;
                *best = (best.0.min(started.elapsed()), n);
            }
        }
        for (times, best) in times.iter_mut().zip(best) {
            times.push(best);
        }
    }
    pin_this_process(&all_cores)?;
    Ok(times)
}

/// The mean of `instances`' best times per query (their row counts must agree, `what` says whose).
fn mean_of(queries: &[(&str, &str)], instances: &[Timings], what: &str) -> anyhow::Result<Timings> {
    let Some((first, rest)) = instances.split_first() else { bail!("{what}: no cluster was timed") };
    for other in rest {
        check_rows(queries, first, other, what)?;
    }
    let n = instances.len() as u32;
    Ok((0..first.len()).map(|q| (instances.iter().map(|t| t[q].0).sum::<Duration>() / n, first[q].1)).collect())
}

/// `name: a / b ...` per query: each cluster's best time of a configuration (for `--instances`).
fn print_instances(queries: &[(&str, &str)], label: &str, instances: &[Timings]) {
    if instances.len() < 2 {
        return;
    }
    println!("{label}, each cluster's best:");
    for (q, (name, _)) in queries.iter().enumerate() {
        let each: Vec<String> = instances.iter().map(|t| format!("{:.1}", ms(t[q].0))).collect();
        println!("  {name:<6} {}", each.join(" / "));
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn geomean(values: &[f64]) -> f64 {
    let logs: f64 = values.iter().map(|v| v.max(1e-9).ln()).sum();
    (logs / values.len().max(1) as f64).exp()
}

fn check_rows(queries: &[(&str, &str)], a: &Timings, b: &Timings, what: &str) -> anyhow::Result<()> {
    for ((name, _), ((_, x), (_, y))) in queries.iter().zip(a.iter().zip(b)) {
        if x != y {
            bail!("{name}: {what} answered {x} rows and {y} rows; not reporting times of different answers");
        }
    }
    Ok(())
}

pub async fn run(args: GroupbyBenchArgs) -> anyhow::Result<ExitCode> {
    let mut queries: Vec<(&str, &str)> = args
        .queries
        .iter()
        .filter(|q| !q.is_empty())
        .map(|q| {
            QUERIES.iter().find(|(name, _)| name == q).copied().ok_or_else(|| {
                anyhow!(
                    "unknown query {q:?}; known: {}",
                    QUERIES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
                )
            })
        })
        .collect::<anyhow::Result<_>>()?;
    queries.extend(args.extra.iter().map(|(name, sql)| (name.as_str(), sql.as_str())));
    if queries.is_empty() {
        bail!("no queries to run: give --queries or --sql");
    }
    let temp = tempfile::tempdir().context("cannot create a temp dir")?;
    let base = args.data_dir.clone().unwrap_or_else(|| temp.path().to_path_buf());
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    println!("reading {} for DataFusion ...", args.csv.display());
    let progress = crate::load::progress::Progress::new(false);
    let batches = crate::load::read_file(&args.csv, crate::load::Format::Csv, &schema(), 65536, &progress)?;
    println!("{} rows; {threads} threads; best of {} runs; times in ms", rows(&batches), args.runs);

    let n = args.instances as usize;
    let mut engines = vec![Engine::datafusion(&batches, threads)?];
    for i in 0..n {
        engines.push(Engine::shardwise(&args, &base.join(format!("one-node-{i}")), 1, None).await?);
    }
    if let Some(setting) = &args.setting {
        for i in 1..=n {
            let other = Engine::with_settings(&engines[i], setting).await?;
            engines.push(other);
        }
    }
    let unpinned = vec![None; engines.len()];
    let times = interleaved_times(&args, &mut engines, &unpinned, &queries).await;
    for engine in engines {
        engine.stop().await;
    }
    let times = times?;
    let Some((df, clusters)) = times.split_first() else { bail!("nothing was timed") };
    let sw = mean_of(&queries, clusters.get(..n).unwrap_or_default(), "the 1-node clusters")?;
    check_rows(&queries, df, &sw, "DataFusion and shardwise")?;
    println!("\n1 node, {threads} threads: shardwise (Flight SQL client) vs DataFusion (in process)");
    println!("{:<6} {:>12} {:>12} {:>8}", "query", "datafusion", "shardwise", "ratio");
    let mut ratios = Vec::new();
    for ((name, _), ((d, n), (s, _))) in queries.iter().zip(df.iter().zip(&sw)) {
        let ratio = ms(*s) / ms(*d);
        ratios.push(ratio);
        println!("{name:<6} {:>12.1} {:>12.1} {:>8.2}   ({n} rows)", ms(*d), ms(*s), ratio);
    }
    println!("{:<6} {:>12} {:>12} {:>8.2}", "geomean", "", "", geomean(&ratios));
    print_instances(&queries, "shardwise", clusters.get(..n).unwrap_or_default());
    if let Some(setting) = &args.setting {
        let with = mean_of(&queries, clusters.get(n..).unwrap_or_default(), "the clusters with the settings")?;
        check_rows(&queries, &sw, &with, "shardwise with and without the settings")?;
        println!("\nA/B on the same node: shardwise with `SETTINGS {setting}` vs without");
        println!("{:<6} {:>12} {:>12} {:>8}", "query", "without", "with", "ratio");
        let mut ratios = Vec::new();
        for ((name, _), ((s, _), (w, _))) in queries.iter().zip(sw.iter().zip(&with)) {
            let ratio = ms(*w) / ms(*s);
            ratios.push(ratio);
            println!("{name:<6} {:>12.1} {:>12.1} {:>8.2}", ms(*s), ms(*w), ratio);
        }
        println!("{:<6} {:>12} {:>12} {:>8.2}", "geomean", "", "", geomean(&ratios));
    }

    if args.skip_scaling {
        return Ok(ExitCode::SUCCESS);
    }
    if threads < 2 {
        bail!("the scaling comparison needs 2 cores; pass --skip-scaling");
    }
    let mut engines = vec![Engine::datafusion(&batches, 1)?, Engine::datafusion(&batches, 2)?];
    let mut cores = vec![Some(vec![0]), Some(vec![0, 1])];
    for i in 0..n {
        engines.push(Engine::shardwise(&args, &base.join(format!("pinned-1-{i}")), 1, Some(vec![vec![0]])).await?);
        cores.push(Some(vec![0]));
    }
    for i in 0..n {
        let pinned = Some(vec![vec![0], vec![1]]);
        engines.push(Engine::shardwise(&args, &base.join(format!("pinned-2-{i}")), 2, pinned).await?);
        cores.push(Some(vec![0, 1]));
    }
    drop(batches);
    let times = interleaved_times(&args, &mut engines, &cores, &queries).await;
    for engine in engines {
        engine.stop().await;
    }
    let times = times?;
    let (df1, df2, clusters) = match times.as_slice() {
        [df1, df2, clusters @ ..] if clusters.len() == 2 * n => (df1, df2, clusters),
        _ => bail!("{} engines were timed", 2 + 2 * n),
    };
    let (one, two) = clusters.split_at(n);
    let (sw1, sw2) = (mean_of(&queries, one, "the 1-node clusters")?, mean_of(&queries, two, "the 2-node clusters")?);
    check_rows(&queries, df1, &sw1, "DataFusion and shardwise")?;
    check_rows(&queries, &sw1, &sw2, "1 and 2 nodes")?;
    println!(
        "\nscaling: shardwise 1 node on core 0 -> 2 nodes on cores 0 and 1; DataFusion 1 -> 2 threads on the same \
         cores; the client on the cores of the engine it times"
    );
    println!(
        "{:<6} {:>10} {:>10} {:>9} {:>10} {:>10} {:>9} {:>10}",
        "query", "sw 1n", "sw 2n", "speedup", "df 1t", "df 2t", "speedup", "sw/df"
    );
    let mut rel = Vec::new();
    for (i, (name, _)) in queries.iter().enumerate() {
        let (s1, s2, d1, d2) = (ms(sw1[i].0), ms(sw2[i].0), ms(df1[i].0), ms(df2[i].0));
        let (ss, ds) = (s1 / s2, d1 / d2);
        rel.push(ss / ds);
        println!("{name:<6} {s1:>10.1} {s2:>10.1} {ss:>9.2} {d1:>10.1} {d2:>10.1} {ds:>9.2} {:>10.2}", ss / ds);
    }
    println!("{:<6} {:>71.2}", "geomean", geomean(&rel));
    print_instances(&queries, "sw 1n", one);
    print_instances(&queries, "sw 2n", two);
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::named_query;

    #[test]
    fn extra_queries_are_name_equals_sql() {
        assert_eq!(
            named_query("scan = SELECT a = 1 FROM x").unwrap(),
            ("scan".to_string(), "SELECT a = 1 FROM x".to_string())
        );
        for bad in ["SELECT 1", "=SELECT 1", "scan=", " = "] {
            assert!(named_query(bad).unwrap_err().contains("NAME=SQL"), "{bad}");
        }
    }
}
