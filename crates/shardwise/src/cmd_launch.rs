//! `shardwise launch`: starts N local nodes as one cluster, the way `torchrun --standalone`
//! starts training processes. It sets the torchrun variables for each node, gives each its data
//! dir `D/rank-R`, generates a cluster secret for the run when none is given, prefixes every
//! output line with the node's rank, forwards Ctrl-C and SIGTERM, and stops every node when one
//! fails, or with `--max-restarts K` restarts the failed node alone (a database node rejoins its
//! cluster; the others keep running). Its own output may close (`launch ... | head`): lines are
//! then dropped, and the cluster keeps running.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::PathBuf;
use std::process::{ExitCode, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Command;
use tokio::sync::mpsc;

/// `eprintln!` that drops the line when stderr is closed, instead of panicking (and taking every
/// node down with the launcher).
macro_rules! say {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

/// Largest `--nproc` accepted.
const MAX_NPROC: u32 = 4096;

#[derive(clap::Args, Debug)]
pub struct LaunchArgs {
    /// Number of nodes to start (ranks 0..N-1; rank 0 is the master).
    #[arg(long)]
    pub nproc: u32,
    /// Address the master's rendezvous binds and the others connect to.
    #[arg(long, default_value = "127.0.0.1")]
    pub master_addr: String,
    /// Rendezvous port [default: a free port].
    #[arg(long)]
    pub master_port: Option<u16>,
    /// Parent of the nodes' data dirs; node R uses D/rank-R.
    #[arg(long, default_value = "shardwise-data")]
    pub data_dir: PathBuf,
    /// Restart a failed node up to K times instead of stopping the cluster.
    #[arg(long, default_value_t = 0)]
    pub max_restarts: u32,
    /// After asking the nodes to stop (SIGTERM), kill those still running after this long.
    #[arg(long, default_value_t = 10_000)]
    pub stop_timeout_ms: u64,
    /// Cluster secret file for every node [default: a random secret generated for this run].
    #[arg(long, env = "SHARDWISE_SECRET_FILE")]
    pub secret_file: Option<PathBuf>,
    /// Run the cluster without a secret.
    #[arg(long, env = "SHARDWISE_INSECURE", value_parser = clap::builder::BoolishValueParser::new())]
    pub insecure: bool,
    /// Arguments passed to every `shardwise node` (after `--`). Not the flags the launcher sets
    /// per node (--rank, --world-size, --master-addr, --master-port, --data-dir, --local-rank)
    /// nor the secret's (--insecure, --secret-file: give those to the launcher), nor fixed ports
    /// for more than one node, nor --replace-node; a --config file may not set them either.
    #[arg(last = true)]
    pub node_args: Vec<String>,
}

/// How the launcher's run ends.
enum Stop {
    /// Every node exited 0.
    AllDone,
    /// A signal asked us to stop: its name, and the exit code that says so (128 + its number,
    /// as a shell and torchrun report a run a signal ended), so `launch && next` does not go on.
    Signal(&'static str, u8),
    /// A node failed with this code and was not restarted.
    Failed { rank: u32, code: i32 },
}

pub async fn run(args: LaunchArgs) -> anyhow::Result<ExitCode> {
    if args.nproc == 0 || args.nproc > MAX_NPROC {
        bail!("--nproc {} is out of range: expected 1..={MAX_NPROC}", args.nproc);
    }
    if args.insecure && args.secret_file.is_some() {
        bail!(
            "both --insecure and --secret-file are given (or SHARDWISE_INSECURE and SHARDWISE_SECRET_FILE): \
             --insecure runs without a cluster secret; give one or the other"
        );
    }
    if args.insecure && std::env::var_os(shardwise_cluster::secret::SECRET_ENV).is_some() {
        bail!(
            "--insecure (or SHARDWISE_INSECURE) is given but {} is set: --insecure runs without a cluster secret; \
             unset it or drop --insecure",
            shardwise_cluster::secret::SECRET_ENV
        );
    }
    // The launcher makes the run's secret and sets each node's identity: a node given its own
    // (after `--`, in a config file, in an inherited variable) would refuse the secret or take
    // another node's rank, data dir or port (`launch_checks`).
    let env = |name: &str| std::env::var(name).ok();
    crate::launch_checks::check_node_settings(&args.node_args, args.nproc, args.insecure, &env)?;
    let master_port = match args.master_port {
        Some(0) => bail!("--master-port 0 is not a port: expected 1-65535, or leave it out for a free port"),
        Some(p) => p,
        None => crate::ports::free_port(&args.master_addr)?,
    };
    let exe = std::env::current_exe().context("cannot find the shardwise executable")?;
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    env.insert("WORLD_SIZE".into(), args.nproc.to_string());
    env.insert("LOCAL_WORLD_SIZE".into(), args.nproc.to_string());
    env.insert("MASTER_ADDR".into(), args.master_addr.clone());
    env.insert("MASTER_PORT".into(), master_port.to_string());
    if let Some(f) = &args.secret_file {
        env.insert("SHARDWISE_SECRET_FILE".into(), f.display().to_string());
    } else if args.insecure {
        env.insert("SHARDWISE_INSECURE".into(), "true".into());
    } else if std::env::var_os(shardwise_cluster::secret::SECRET_ENV).is_none() {
        let secret: [u8; 32] = rand::random();
        env.insert(shardwise_cluster::secret::SECRET_ENV.into(), hex::encode(secret));
    }
    say!(
        "[launch] starting {} nodes; master {}:{master_port}; data dirs {}/rank-*",
        args.nproc,
        args.master_addr,
        args.data_dir.display()
    );

    // Installed before any node starts, so a signal from now on stops the cluster gracefully.
    use tokio::signal::unix::{SignalKind, signal};
    let mut sigterm = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut sigint = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    let (exit_tx, mut exit_rx) = mpsc::channel::<(u32, std::io::Result<ExitStatus>)>(args.nproc as usize);
    let mut alive: BTreeMap<u32, Pid> = BTreeMap::new();
    let mut restarts: BTreeMap<u32, u32> = BTreeMap::new();
    let mut done: BTreeSet<u32> = BTreeSet::new();
    for rank in 0..args.nproc {
        let pid = spawn_node(&exe, &args, &env, rank, exit_tx.clone())?;
        alive.insert(rank, pid);
    }

    let mut stop: Option<Stop> = None;
    let mut kill_at: Option<tokio::time::Instant> = None;
    loop {
        if stop.is_some() && alive.is_empty() {
            break;
        }
        if stop.is_none() && done.len() == args.nproc as usize {
            stop = Some(Stop::AllDone);
            break;
        }
        let kill_sleep = async {
            match kill_at {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = sigint.recv(), if stop.is_none() => {
                say!("[launch] interrupted: stopping all nodes");
                stop = Some(Stop::Signal("interrupted", 128 + Signal::SIGINT as u8));
                kill_at = Some(signal_all(&alive, Signal::SIGTERM, args.stop_timeout_ms));
            }
            _ = sigterm.recv(), if stop.is_none() => {
                say!("[launch] SIGTERM: stopping all nodes");
                stop = Some(Stop::Signal("SIGTERM", 128 + Signal::SIGTERM as u8));
                kill_at = Some(signal_all(&alive, Signal::SIGTERM, args.stop_timeout_ms));
            }
            _ = kill_sleep => {
                say!("[launch] nodes still running after {} ms: killing {:?}", args.stop_timeout_ms, alive.keys().collect::<Vec<_>>());
                signal_all(&alive, Signal::SIGKILL, 0);
                kill_at = None;
            }
            Some((rank, status)) = exit_rx.recv() => {
                alive.remove(&rank);
                let code = match &status {
                    Ok(s) => exit_code(s),
                    Err(e) => { say!("[launch] cannot wait for rank {rank}: {e}"); 1 }
                };
                if stop.is_some() {
                    continue;
                }
                if code == 0 {
                    done.insert(rank);
                    // torchrun's rule: a node that exits 0 has finished (a SIGTERM asks a node to
                    // stop so), and is not restarted; said, as the cluster goes on without it.
                    if !alive.is_empty() {
                        say!(
                            "[launch] rank {rank} exited with code 0 (it was asked to stop, or finished); not restarted: \
                             the other {} nodes go on without it",
                            alive.len()
                        );
                    }
                    continue;
                }
                let used = restarts.entry(rank).or_insert(0);
                if *used < args.max_restarts {
                    *used += 1;
                    say!("[launch] rank {rank} exited with {}; restarting it ({} of {})", describe(&status), used, args.max_restarts);
                    let pid = spawn_node(&exe, &args, &env, rank, exit_tx.clone())?;
                    alive.insert(rank, pid);
                } else {
                    match args.max_restarts {
                        0 => say!("[launch] rank {rank} exited with {}; stopping all nodes", describe(&status)),
                        max => say!(
                            "[launch] rank {rank} exited with {}; it was restarted {max} times already \
                             (--max-restarts {max}): stopping all nodes",
                            describe(&status)
                        ),
                    }
                    stop = Some(Stop::Failed { rank, code });
                    kill_at = Some(signal_all(&alive, Signal::SIGTERM, args.stop_timeout_ms));
                }
            }
        }
    }
    Ok(match stop {
        Some(Stop::Failed { rank, code }) => {
            say!("[launch] failed: rank {rank} exited with code {code}");
            ExitCode::from(u8::try_from(code).ok().filter(|c| *c != 0).unwrap_or(1))
        }
        Some(Stop::Signal(what, code)) => {
            say!("[launch] stopped ({what})");
            ExitCode::from(code)
        }
        Some(Stop::AllDone) | None => ExitCode::SUCCESS,
    })
}

fn spawn_node(
    exe: &std::path::Path,
    args: &LaunchArgs,
    env: &BTreeMap<String, String>,
    rank: u32,
    exit_tx: mpsc::Sender<(u32, std::io::Result<ExitStatus>)>,
) -> anyhow::Result<Pid> {
    let mut cmd = Command::new(exe);
    cmd.arg("node")
        .args(&args.node_args)
        // Set from the launcher's own flags (in `env`) or not at all, never inherited.
        .env_remove(crate::launch_checks::SECRET_VARS[0])
        .env_remove(crate::launch_checks::SECRET_VARS[1])
        .envs(env)
        .env("RANK", rank.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("SHARDWISE_DATA_DIR", args.data_dir.join(format!("rank-{rank}")))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // SAFETY: the closure only calls prctl(2), which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            // Nodes die with the launcher, even if it is killed with SIGKILL.
            nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(std::io::Error::from)
        });
    }
    let mut child = cmd.spawn().with_context(|| format!("cannot start rank {rank} ({})", exe.display()))?;
    let pid = child.id().map(|id| Pid::from_raw(id as i32)).context("node exited before it could be tracked")?;
    if let Some(out) = child.stdout.take() {
        tokio::spawn(prefix_lines(out, rank, false));
    }
    if let Some(err) = child.stderr.take() {
        tokio::spawn(prefix_lines(err, rank, true));
    }
    tokio::spawn(async move {
        let status = child.wait().await;
        let _ = exit_tx.send((rank, status)).await;
    });
    Ok(pid)
}

/// Copies a node's output to ours, each line prefixed with `[rank R] `.
async fn prefix_lines(stream: impl AsyncRead + Unpin, rank: u32, to_stderr: bool) {
    let mut lines = BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        // A closed output (`launch ... | head`) drops the line: the nodes keep running, and
        // their output keeps being read so that they never block on a full pipe.
        let _ = match to_stderr {
            true => writeln!(std::io::stderr().lock(), "[rank {rank}] {line}"),
            false => writeln!(std::io::stdout().lock(), "[rank {rank}] {line}"),
        };
    }
}

fn signal_all(alive: &BTreeMap<u32, Pid>, sig: Signal, grace_ms: u64) -> tokio::time::Instant {
    for pid in alive.values() {
        let _ = kill(*pid, sig);
    }
    tokio::time::Instant::now() + Duration::from_millis(grace_ms)
}

fn exit_code(s: &ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0))
}

fn describe(s: &std::io::Result<ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match s {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(c), _) => format!("code {c}"),
            (None, Some(sig)) => format!("signal {sig}"),
            _ => "an unknown status".into(),
        },
        Err(e) => format!("an error ({e})"),
    }
}
