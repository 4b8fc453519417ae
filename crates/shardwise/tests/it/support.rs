//! Helpers for process tests: start the built binary, read its output with deadlines, query a
//! node, and kill whatever is left when a test ends.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_shardwise");
pub const SECRET: &str = "test-secret-0123456789abcdef";

/// A `Command` for the binary with a clean environment (no launcher variables leak in).
pub fn shardwise() -> Command {
    let mut c = Command::new(BIN);
    for (k, _) in std::env::vars() {
        if k.starts_with("SLURM_")
            || k.starts_with("OMPI_")
            || k.starts_with("PMI_")
            || k.starts_with("SHARDWISE_")
            || ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"]
                .contains(&k.as_str())
        {
            c.env_remove(&k);
        }
    }
    c
}

/// Runs a command to completion with a deadline; kills it if it overruns.
pub fn run_with_timeout(mut cmd: Command, timeout: Duration) -> Output {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).stdin(Stdio::null());
    let child = cmd.spawn().expect("spawn shardwise");
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(timeout) {
        Ok(out) => out.expect("wait for shardwise"),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("command did not finish within {timeout:?}");
        }
    }
}

/// A free port for a master's rendezvous, below the kernel's ephemeral range so that no node's
/// `bind(0)` can take it between this pick and the master's bind (as `shardwise launch` does).
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 10_000 + (std::process::id() % 1000) as u16 * 20;
    loop {
        let port = base + NEXT.fetch_add(1, Ordering::Relaxed) % 20_000;
        if port < 32_768 && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// A running node process whose output lines are collected in the background.
pub struct Proc {
    pub child: Child,
    lines: mpsc::Receiver<(bool, String)>,
    pub seen: Vec<String>,
}

impl Proc {
    pub fn spawn(mut cmd: Command) -> Proc {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).stdin(Stdio::null());
        Proc::collect(cmd.spawn().expect("spawn shardwise"))
    }

    fn collect(mut child: Child) -> Proc {
        let (tx, rx) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        let err = child.stderr.take().unwrap();
        let tx2 = tx.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send((false, l));
            }
        });
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx2.send((true, l));
            }
        });
        Proc { child, lines: rx, seen: Vec::new() }
    }

    /// Like [`Proc::spawn`], with `input` on its standard input (then closed).
    pub fn spawn_with_input(mut cmd: Command, input: &str) -> Proc {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).stdin(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn shardwise");
        let mut stdin = child.stdin.take().expect("stdin");
        let input = input.to_string();
        std::thread::spawn(move || {
            use std::io::Write;
            let _ = stdin.write_all(input.as_bytes());
        });
        Proc::collect(child)
    }

    /// Like [`Proc::spawn`], with its standard input returned, to write to as the test goes.
    pub fn spawn_with_stdin(mut cmd: Command) -> (Proc, std::process::ChildStdin) {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).stdin(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn shardwise");
        let stdin = child.stdin.take().expect("stdin");
        (Proc::collect(child), stdin)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for an output line containing `needle`; panics with what was seen on timeout.
    pub fn wait_for_line(&mut self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        if let Some(l) = self.seen.iter().find(|l| l.contains(needle)) {
            return l.clone();
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((_, l)) => {
                    self.seen.push(l.clone());
                    if l.contains(needle) {
                        return l;
                    }
                }
                Err(_) => panic!("no line containing {needle:?} within {timeout:?}; saw:\n{}", self.seen.join("\n")),
            }
        }
    }

    /// Waits for the process to exit; returns its code and every line it printed.
    pub fn wait_exit(&mut self, timeout: Duration) -> (Option<i32>, String) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                // Drain what is left.
                while let Ok((_, l)) = self.lines.recv_timeout(Duration::from_millis(200)) {
                    self.seen.push(l);
                }
                return (status.code(), self.seen.join("\n"));
            }
            while let Ok((_, l)) = self.lines.try_recv() {
                self.seen.push(l);
            }
            if Instant::now() >= deadline {
                panic!("process did not exit within {timeout:?}; saw:\n{}", self.seen.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Takes in the lines printed so far, waiting `quiet` for more; returns how many were seen.
    pub fn drain(&mut self, quiet: Duration) -> usize {
        while let Ok((_, l)) = self.lines.recv_timeout(quiet) {
            self.seen.push(l);
        }
        self.seen.len()
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn signal(&self, sig: &str) {
        let _ = Command::new("kill").args([&format!("-{sig}"), &self.pid().to_string()]).status();
    }
}

impl Drop for Proc {
    /// Kills the process, and fails the test if it ever panicked: a panic in a task is caught by
    /// tokio and the node goes on, so only its output tells (a panicking task skips whatever
    /// clean-up came after the panic).
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        while let Ok((_, l)) = self.lines.recv_timeout(Duration::from_millis(100)) {
            self.seen.push(l);
        }
        // To see why a test failed: every node's output, one file per process.
        if std::thread::panicking()
            && let Ok(dir) = std::env::var("SHARDWISE_TEST_LOG_DIR")
        {
            let path = Path::new(&dir).join(format!("{}.log", self.pid()));
            let _ = std::fs::write(path, self.seen.join("\n"));
        }
        if !std::thread::panicking()
            && let Some(at) = self.seen.iter().position(|l| l.contains("panicked at"))
        {
            let end = (at + 12).min(self.seen.len());
            panic!("the process panicked:\n{}", self.seen[at..end].join("\n"));
        }
    }
}

/// Flags for one node of a test cluster with fast liveness settings.
pub fn node_cmd(rank: u32, world: u32, master_port: u16, data_dir: &Path) -> Command {
    let mut c = shardwise();
    c.args(["node", "--rank", &rank.to_string(), "--world-size", &world.to_string()])
        .args(["--master-addr", "127.0.0.1", "--master-port", &master_port.to_string()])
        .arg("--data-dir")
        .arg(data_dir)
        // Settings by environment, so that a test can still override one with its flag.
        .env("SHARDWISE_HEARTBEAT_INTERVAL_MS", "100")
        .env("SHARDWISE_SUSPECT_AFTER_MS", "400")
        .env("SHARDWISE_DOWN_AFTER_MS", "1000")
        .env("SHARDWISE_JOIN_TIMEOUT_MS", "20000")
        .env("SHARDWISE_PROGRESS_INTERVAL_MS", "500")
        .env("SHARDWISE_CLUSTER_SECRET", SECRET);
    c
}

/// Extracts `flight=HOST:PORT` from a `listening` line.
pub fn flight_addr(listening_line: &str) -> String {
    listening_addr(listening_line, "flight")
}

/// Extracts `KEY=HOST:PORT` (`flight`, `http`, `pg`) from a `listening` line.
pub fn listening_addr(listening_line: &str, key: &str) -> String {
    let prefix = format!("{key}=");
    listening_line
        .split_whitespace()
        .find_map(|w| w.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no {key}= in {listening_line:?}"))
        .to_string()
}

/// Runs SQL through `shardwise sql --format csv`; returns rows (header dropped) or the error text.
pub fn sql_csv(addr: &str, sql: &str) -> Result<Vec<Vec<String>>, String> {
    sql_csv_within(addr, sql, Duration::from_secs(30))
}

/// [`sql_csv`] with a deadline of its own.
pub fn sql_csv_within(addr: &str, sql: &str, timeout: Duration) -> Result<Vec<Vec<String>>, String> {
    let mut c = shardwise();
    c.args(["sql", "--connect", addr, "--format", "csv", "-e", sql]);
    let out = run_with_timeout(c, timeout);
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    Ok(text.lines().skip(1).map(|l| l.split(',').map(str::to_string).collect()).collect())
}

/// Polls `f` every 100 ms until it returns Some, or panics after `timeout` naming `what`.
pub fn eventually<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

pub fn rank_dir(base: &Path, rank: u32) -> PathBuf {
    base.join(format!("rank-{rank}"))
}

/// A node's `GET /health` answer, status line and body.
pub fn health(http: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(http).expect("connect to /health");
    write!(stream, "GET /health HTTP/1.1\r\nHost: {http}\r\nConnection: close\r\n\r\n").expect("request");
    let mut reply = String::new();
    stream.read_to_string(&mut reply).expect("reply");
    reply
}
