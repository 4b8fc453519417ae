//! A cluster of real `shardwise node` child processes on 127.0.0.1, with fixed ports so a node
//! restarted after `kill -9` comes back at the same addresses. Used by the crash soak and the
//! load benchmarks; the process tests use the same commands.
//!
//! Each node's output goes to `DIR/logs/rank-R.log`; a node is ready when a new
//! `listening rank=R` line appears there. Children are killed if this process dies
//! (`PR_SET_PDEATHSIG`) or drops the cluster.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::process::{Child, Command};

/// How long a node may take to print its `listening` line.
pub const NODE_READY_TIMEOUT_MS: u64 = 60_000;

/// N node processes.
pub struct ProcCluster {
    exe: PathBuf,
    dir: PathBuf,
    n: u32,
    master_port: u16,
    flight_ports: Vec<u16>,
    data_ports: Vec<u16>,
    extra_args: Vec<String>,
    /// CPUs each rank is pinned to (`None`: not pinned).
    cpus: Option<Vec<Vec<usize>>>,
    children: Vec<Option<Child>>,
}

fn count_ready(log: &Path, rank: u32) -> usize {
    std::fs::read_to_string(log).map(|s| s.matches(&format!("listening rank={rank} ")).count()).unwrap_or(0)
}

fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

impl ProcCluster {
    /// Starts `n` nodes with data dirs `dir/rank-R` and waits until all are ready.
    pub async fn start(n: u32, dir: &Path, extra_args: &[String]) -> anyhow::Result<ProcCluster> {
        Self::start_with(n, dir, extra_args, None).await
    }

    /// As [`ProcCluster::start`], with rank R pinned to the CPUs `cpus[R]` (so it also sizes its
    /// thread pools to them).
    pub async fn start_pinned(
        n: u32,
        dir: &Path,
        extra_args: &[String],
        cpus: Vec<Vec<usize>>,
    ) -> anyhow::Result<ProcCluster> {
        if cpus.len() != n as usize {
            bail!("{} CPU sets for {n} nodes", cpus.len());
        }
        Self::start_with(n, dir, extra_args, Some(cpus)).await
    }

    async fn start_with(
        n: u32,
        dir: &Path,
        extra_args: &[String],
        cpus: Option<Vec<Vec<usize>>>,
    ) -> anyhow::Result<ProcCluster> {
        let exe = std::env::current_exe().context("cannot find the shardwise executable")?;
        std::fs::create_dir_all(dir.join("logs")).with_context(|| format!("cannot create {}", dir.display()))?;
        let mut ports = Vec::new();
        while ports.len() < 1 + 2 * n as usize {
            let p = crate::ports::free_port("127.0.0.1")?;
            if !ports.contains(&p) {
                ports.push(p);
            }
        }
        let mut cluster = ProcCluster {
            exe,
            dir: dir.to_path_buf(),
            n,
            master_port: ports[0],
            flight_ports: ports[1..=n as usize].to_vec(),
            data_ports: ports[n as usize + 1..].to_vec(),
            extra_args: extra_args.to_vec(),
            cpus,
            children: (0..n).map(|_| None).collect(),
        };
        let before: Vec<usize> = (0..n).map(|r| count_ready(&cluster.log(r), r)).collect();
        for rank in 0..n {
            cluster.spawn(rank)?;
        }
        for rank in 0..n {
            cluster.wait_ready(rank, before[rank as usize]).await?;
        }
        Ok(cluster)
    }

    /// Where `rank`'s stdout and stderr go.
    pub fn log(&self, rank: u32) -> PathBuf {
        self.dir.join("logs").join(format!("rank-{rank}.log"))
    }

    /// The Flight SQL address of `rank`.
    pub fn flight_addr(&self, rank: u32) -> String {
        format!("127.0.0.1:{}", self.flight_ports[rank as usize])
    }

    /// Process ids of the given ranks that are running.
    pub fn pids(&self, ranks: &[u32]) -> Vec<nix::unistd::Pid> {
        ranks
            .iter()
            .filter_map(|r| self.children.get(*r as usize)?.as_ref()?.id())
            .map(|id| nix::unistd::Pid::from_raw(id as i32))
            .collect()
    }

    /// The data dir of `rank`.
    pub fn data_dir(&self, rank: u32) -> PathBuf {
        self.dir.join(format!("rank-{rank}"))
    }

    fn spawn(&mut self, rank: u32) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log(rank))
            .with_context(|| format!("cannot open {}", self.log(rank).display()))?;
        let log2 = log.try_clone().context("cannot share the log file")?;
        let mut cmd = Command::new(&self.exe);
        cmd.arg("node")
            .args(["--rank", &rank.to_string(), "--world-size", &self.n.to_string()])
            .args(["--master-addr", "127.0.0.1", "--master-port", &self.master_port.to_string()])
            .args(["--flight-port", &self.flight_ports[rank as usize].to_string()])
            .args(["--data-port", &self.data_ports[rank as usize].to_string()])
            .arg("--data-dir")
            .arg(self.data_dir(rank))
            .arg("--insecure")
            .env_remove("SHARDWISE_CLUSTER_SECRET")
            .env_remove("SHARDWISE_SECRET_FILE")
            .args(&self.extra_args)
            .env_remove("RANK")
            .env_remove("WORLD_SIZE")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log2))
            .kill_on_drop(true);
        let cpu_set = match self.cpus.as_ref().and_then(|c| c.get(rank as usize)) {
            Some(cpus) => Some(cpu_set(cpus).with_context(|| format!("cannot pin rank {rank}"))?),
            None => None,
        };
        // SAFETY: the closure only calls prctl(2) and sched_setaffinity(2), which are
        // async-signal-safe, on values made before the fork.
        unsafe {
            cmd.pre_exec(move || {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).map_err(std::io::Error::from)?;
                if let Some(set) = &cpu_set {
                    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), set).map_err(std::io::Error::from)?;
                }
                Ok(())
            });
        }
        let child = cmd.spawn().with_context(|| format!("cannot start rank {rank}"))?;
        self.children[rank as usize] = Some(child);
        Ok(())
    }

    async fn wait_ready(&mut self, rank: u32, before: usize) -> anyhow::Result<()> {
        let log = self.log(rank);
        let deadline = Instant::now() + Duration::from_millis(NODE_READY_TIMEOUT_MS);
        loop {
            if count_ready(&log, rank) > before {
                return Ok(());
            }
            if let Some(child) = self.children[rank as usize].as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                bail!("rank {rank} exited ({status}) before it was ready; its log ends:\n{}", tail(&log));
            }
            if Instant::now() > deadline {
                bail!("rank {rank} was not ready after {NODE_READY_TIMEOUT_MS} ms; its log ends:\n{}", tail(&log));
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Kills `rank` with SIGKILL and reaps it.
    pub async fn kill9(&mut self, rank: u32) -> anyhow::Result<()> {
        if let Some(mut child) = self.children[rank as usize].take() {
            child.start_kill().with_context(|| format!("cannot kill rank {rank}"))?;
            child.wait().await.with_context(|| format!("cannot reap rank {rank}"))?;
        }
        Ok(())
    }

    /// Starts `rank` again (after [`ProcCluster::kill9`]) and waits until it is ready.
    pub async fn restart(&mut self, rank: u32) -> anyhow::Result<()> {
        let before = count_ready(&self.log(rank), rank);
        self.spawn(rank)?;
        self.wait_ready(rank, before).await
    }

    /// Stops every node with SIGTERM, workers first, and waits (SIGKILL after 10 s).
    pub async fn stop(mut self) {
        for rank in (0..self.n).rev() {
            if let Some(mut child) = self.children[rank as usize].take() {
                if let Some(pid) = child.id() {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid as i32),
                        nix::sys::signal::Signal::SIGTERM,
                    );
                }
                if tokio::time::timeout(Duration::from_secs(10), child.wait()).await.is_err() {
                    let _ = child.start_kill();
                    let _ = child.wait().await;
                }
            }
        }
    }
}

/// The thread ids of process `proc_dir` (`self` or a pid) at the time of the call.
fn threads_of(proc_dir: &str) -> anyhow::Result<Vec<i32>> {
    let tasks = format!("/proc/{proc_dir}/task");
    let mut tids = Vec::new();
    for entry in std::fs::read_dir(&tasks).with_context(|| format!("cannot list {tasks}"))? {
        let name = entry.with_context(|| format!("cannot list {tasks}"))?.file_name();
        if let Ok(tid) = name.to_string_lossy().parse::<i32>() {
            tids.push(tid);
        }
    }
    Ok(tids)
}

/// Puts every thread of process `pid` under `SCHED_IDLE`: it then runs only on a CPU that no
/// normal thread wants, as a process on a machine of its own would take nothing from the others.
/// Threads started later inherit the policy from the thread that starts them.
pub(crate) fn idle_priority(pid: nix::unistd::Pid) -> anyhow::Result<()> {
    for tid in threads_of(&pid.to_string())? {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: sched_setscheduler reads `param` and changes thread `tid`'s policy; no memory
        // of this process is handed over beyond the call.
        if unsafe { libc::sched_setscheduler(tid, libc::SCHED_IDLE, &param) } != 0 {
            let e = std::io::Error::last_os_error();
            // A thread that ended since the listing.
            if e.raw_os_error() != Some(libc::ESRCH) {
                anyhow::bail!("cannot give thread {tid} of process {pid} the idle policy: {e}");
            }
        }
    }
    Ok(())
}

/// Pins every thread of this process to `set` (threads started later inherit it from theirs).
pub(crate) fn pin_this_process(set: &nix::sched::CpuSet) -> anyhow::Result<()> {
    for tid in threads_of("self")? {
        match nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(tid), set) {
            // A thread that ended since the listing.
            Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
            Err(e) => anyhow::bail!("cannot pin thread {tid} of this process: {e}"),
        }
    }
    Ok(())
}

/// The CPU set of `cpus` (for `sched_setaffinity`).
pub(crate) fn cpu_set(cpus: &[usize]) -> anyhow::Result<nix::sched::CpuSet> {
    let mut set = nix::sched::CpuSet::new();
    for cpu in cpus {
        set.set(*cpu).with_context(|| format!("no CPU {cpu} to pin to"))?;
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::{cpu_set, idle_priority, pin_this_process};

    #[test]
    fn pinning_this_process_pins_every_thread_and_is_undone() {
        let here = nix::unistd::Pid::from_raw(0);
        let all = nix::sched::sched_getaffinity(here).expect("affinity");
        let first = (0..nix::sched::CpuSet::count()).find(|c| all.is_set(*c).unwrap_or(false)).expect("a CPU");
        let (ready, wait) = std::sync::mpsc::channel::<()>();
        let (done, check) = std::sync::mpsc::channel();
        let other = std::thread::spawn(move || {
            ready.send(()).expect("send");
            check.recv().expect("recv");
            nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).expect("affinity")
        });
        wait.recv().expect("thread started");
        pin_this_process(&cpu_set(&[first]).expect("set")).expect("pin");
        done.send(()).expect("send");
        let seen = other.join().expect("thread");
        pin_this_process(&all).expect("unpin");
        let count = |set: &nix::sched::CpuSet| {
            (0..nix::sched::CpuSet::count()).filter(|c| set.is_set(*c).unwrap_or(false)).count()
        };
        assert_eq!(count(&seen), 1, "a thread that already ran was pinned too");
        assert!(seen.is_set(first).unwrap_or(false));
        assert_eq!(nix::sched::sched_getaffinity(here).expect("affinity"), all);
        assert!(cpu_set(&[usize::MAX]).is_err());
    }

    #[test]
    fn a_process_put_under_the_idle_policy_has_it_on_every_thread() {
        let mut child = std::process::Command::new("sleep").arg("5").spawn().expect("sleep");
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        idle_priority(pid).expect("idle");
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
        // Field 41 (`policy`), counted after the parenthesised command name.
        let policy: i32 = stat[stat.rfind(')').expect("comm") + 2..]
            .split_whitespace()
            .nth(41 - 3)
            .and_then(|f| f.parse().ok())
            .expect("policy field");
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(policy, libc::SCHED_IDLE);
        assert!(idle_priority(nix::unistd::Pid::from_raw(i32::MAX)).is_err(), "no such process");
    }
}
