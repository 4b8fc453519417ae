//! `init_distributed_mode` across real processes: launch, join timeouts, refusals, failure
//! detection and rejoin after SIGKILL (workers and the master).

use std::collections::BTreeSet;
use std::time::Duration;

use crate::support::*;

const T: Duration = Duration::from_secs(60);

#[test]
fn launch_four_nodes_exit_after_init() {
    let dir = tempdir();
    let mut c = shardwise();
    c.args(["launch", "--nproc", "4", "--data-dir"]).arg(dir.path()).args(["--", "--exit-after-init"]);
    let out = run_with_timeout(c, T);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "launch failed: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    let mut ranks = BTreeSet::new();
    let mut ids = BTreeSet::new();
    let mut masters = 0;
    for line in stdout.lines() {
        let Some(json) = line.find('{').map(|i| &line[i..]) else { continue };
        let v: serde_json::Value = serde_json::from_str(json).unwrap();
        let prefix = format!("[rank {}]", v["rank"]);
        assert!(line.starts_with(&prefix), "line not prefixed with its rank: {line}");
        assert_eq!(v["world_size"], 4);
        ranks.insert(v["rank"].as_u64().unwrap());
        ids.insert(v["node_id"].as_str().unwrap().to_string());
        if v["role"] == "master" {
            masters += 1;
            assert_eq!(v["rank"], 0);
        }
        assert!(v["init_ms"].as_u64().is_some());
    }
    assert_eq!(ranks, (0..4).collect::<BTreeSet<u64>>(), "{stdout}");
    assert_eq!(masters, 1);
    assert_eq!(ids.len(), 4, "node ids not distinct: {ids:?}");
}

#[test]
fn join_timeout_names_the_missing_rank() {
    let dir = tempdir();
    let port = free_port();
    let mut nodes: Vec<Proc> = (0..2)
        .map(|r| {
            let mut c = node_cmd(r, 3, port, &rank_dir(dir.path(), r));
            c.args(["--join-timeout-ms", "3000"]);
            Proc::spawn(c)
        })
        .collect();
    for (r, n) in nodes.iter_mut().enumerate() {
        let (code, out) = n.wait_exit(Duration::from_secs(20));
        assert_ne!(code, Some(0), "rank {r} should fail:\n{out}");
        assert!(out.contains("missing ranks: 2"), "rank {r} does not name rank 2:\n{out}");
    }
    assert!(nodes[0].seen.iter().any(|l| l.contains("waiting for 1 of 3 ranks: 2")), "{:?}", nodes[0].seen);
}

/// Starts a master for `world` ranks and returns it with its port.
fn master(world: u32, dir: &std::path::Path) -> (Proc, u16) {
    let port = free_port();
    (Proc::spawn(node_cmd(0, world, port, &rank_dir(dir, 0))), port)
}

#[test]
fn duplicate_rank_is_refused() {
    let dir = tempdir();
    let (mut m, port) = master(3, dir.path());
    let _first = Proc::spawn(node_cmd(1, 3, port, &rank_dir(dir.path(), 1)));
    m.wait_for_line("rank 1 joined", T);
    let mut second = Proc::spawn(node_cmd(1, 3, port, &dir.path().join("other")));
    let (code, out) = second.wait_exit(T);
    assert_ne!(code, Some(0));
    assert!(out.contains("rank 1 is already held by live node"), "{out}");
}

#[test]
fn wrong_secret_is_refused() {
    let dir = tempdir();
    let (_m, port) = master(2, dir.path());
    let mut c = node_cmd(1, 2, port, &rank_dir(dir.path(), 1));
    c.env("SHARDWISE_CLUSTER_SECRET", "another-secret-0123456789");
    let (code, out) = Proc::spawn(c).wait_exit(T);
    assert_ne!(code, Some(0));
    assert!(out.contains("wrong cluster secret"), "{out}");
}

#[test]
fn mismatched_world_size_is_refused() {
    let dir = tempdir();
    let (_m, port) = master(2, dir.path());
    let (code, out) = Proc::spawn(node_cmd(1, 3, port, &rank_dir(dir.path(), 1))).wait_exit(T);
    assert_ne!(code, Some(0));
    assert!(out.contains("world size mismatch"), "{out}");
}

/// Rows of system.nodes as (rank, node_id, state, epoch).
fn nodes(addr: &str) -> Option<Vec<(String, String, String, u64)>> {
    let rows = sql_csv(addr, "SELECT rank, node_id, state, epoch FROM system.nodes ORDER BY rank").ok()?;
    Some(rows.into_iter().map(|r| (r[0].clone(), r[1].clone(), r[2].clone(), r[3].parse().unwrap_or(0))).collect())
}

fn state_of(addr: &str, rank: &str) -> Option<String> {
    nodes(addr)?.into_iter().find(|n| n.0 == rank).map(|n| n.2)
}

#[test]
fn killed_nodes_go_down_and_rejoin_with_their_identity() {
    let dir = tempdir();
    let port = free_port();
    let mut procs: Vec<Proc> = (0..3).map(|r| Proc::spawn(node_cmd(r, 3, port, &rank_dir(dir.path(), r)))).collect();
    let addrs: Vec<String> = procs.iter_mut().map(|p| flight_addr(&p.wait_for_line("listening rank=", T))).collect();
    let before = eventually(Duration::from_secs(10), "all three up", || {
        let n = nodes(&addrs[0])?;
        (n.len() == 3 && n.iter().all(|m| m.2 == "up")).then_some(n)
    });
    // A client given the master's rendezvous port is told what it reached.
    let err = sql_csv(&format!("127.0.0.1:{port}"), "SELECT 1").unwrap_err();
    assert!(err.contains("answers as the master's rendezvous port (MASTER_PORT)"), "{err}");

    // A paused worker (SIGSTOP) is suspect, then down; resumed, it is up again.
    procs[1].signal("STOP");
    eventually(Duration::from_secs(10), "paused rank 1 down", || (state_of(&addrs[0], "1")? == "down").then_some(()));
    procs[1].signal("CONT");
    eventually(Duration::from_secs(10), "resumed rank 1 up", || (state_of(&addrs[0], "1")? == "up").then_some(()));
    // Its own pause is not the master's silence: it keeps its session, blames no one, and
    // keeps its epoch (it dropped the session and rejoined under a new one).
    procs[1].drain(Duration::from_millis(1_500));
    let lost: Vec<&String> = procs[1].seen.iter().filter(|l| l.contains("lost the master")).collect();
    assert!(lost.is_empty(), "the resumed worker blamed the master: {lost:?}");
    assert_eq!(nodes(&addrs[0]).map(|n| n[1].3), Some(before[1].3), "the resumed worker's epoch changed");

    // A paused master (2.5 s, past down_after_ms) does not count its own pause as the workers'
    // silence: resumed, it marks no one down.
    let before_pause = procs[0].drain(Duration::from_millis(300));
    procs[0].signal("STOP");
    std::thread::sleep(Duration::from_millis(2_500));
    procs[0].signal("CONT");
    eventually(Duration::from_secs(10), "all up after the master's pause", || {
        nodes(&addrs[0])?.iter().all(|m| m.2 == "up").then_some(())
    });
    let after_pause = procs[0].drain(Duration::from_millis(1_500));
    let downs: Vec<&String> =
        procs[0].seen[before_pause..after_pause].iter().filter(|l| l.contains("is down")).collect();
    assert!(downs.is_empty(), "the resumed master marked workers down: {downs:?}");

    // A worker killed with SIGKILL is `down` within down_after_ms (1 s) plus slack.
    procs[2].kill9();
    eventually(Duration::from_secs(10), "rank 2 down", || (state_of(&addrs[0], "2")? == "down").then_some(()));
    // Restarted on the same data dir: same node_id, higher epoch, up.
    procs[2] = Proc::spawn(node_cmd(2, 3, port, &rank_dir(dir.path(), 2)));
    procs[2].wait_for_line("listening rank=2", T);
    let after = eventually(Duration::from_secs(10), "rank 2 up", || {
        let n = nodes(&addrs[0])?;
        (n[2].2 == "up").then_some(n)
    });
    assert_eq!(after[2].1, before[2].1, "rank 2 changed node_id");
    assert!(after[2].3 > before[2].3, "epoch did not grow: {after:?}");

    // The master: killed, seen down by a worker, restarted, the same cluster again.
    procs[0].kill9();
    eventually(Duration::from_secs(10), "master down as seen by rank 1", || {
        (state_of(&addrs[1], "0")? == "down").then_some(())
    });
    // Without the master no one can say whether rank 2 still runs: suspect, not up; rank 1 itself
    // is up.
    assert_eq!(
        (state_of(&addrs[1], "2").as_deref(), state_of(&addrs[1], "1").as_deref()),
        (Some("suspect"), Some("up"))
    );
    procs[0] = Proc::spawn(node_cmd(0, 3, port, &rank_dir(dir.path(), 0)));
    let line = procs[0].wait_for_line("listening rank=0", T);
    let master_addr = flight_addr(&line);
    let resumed = eventually(Duration::from_secs(15), "all up after the master restarts", || {
        let n = nodes(&master_addr)?;
        n.iter().all(|m| m.2 == "up").then_some(n)
    });
    for r in 0..3 {
        assert_eq!(resumed[r].1, before[r].1, "rank {r} changed node_id");
    }
    assert!(resumed[0].3 > before[0].3, "master epoch did not grow");
}

#[test]
fn sigterm_stops_a_node_gracefully() {
    let dir = tempdir();
    let mut p = Proc::spawn(node_cmd(0, 1, free_port(), &rank_dir(dir.path(), 0)));
    p.wait_for_line("listening rank=0", T);
    p.signal("TERM");
    let (code, out) = p.wait_exit(Duration::from_secs(15));
    assert_eq!(code, Some(0), "{out}");
}

/// A worker waiting for its master holds its ports (and recorded them in `ports.json`) but
/// serves none: a client is answered at once (HTTP 503, a PostgreSQL FATAL 57P03 after its
/// startup message, a closed connection for gRPC) instead of left connected to a port nobody
/// answers until the join timeout (psql, curl and health checks hung for its 120 s). And a second node
/// given a port the first holds fails at its start, naming the port, instead of joining and
/// failing once the cluster has formed around it.
#[test]
fn a_worker_waiting_for_the_master_turns_clients_away_and_keeps_its_ports() {
    use std::io::Read;
    let dir = tempdir();
    let data = rank_dir(dir.path(), 1);
    let master_port = free_port();
    let mut worker = Proc::spawn(node_cmd(1, 3, master_port, &data));
    let ports: serde_json::Value = eventually(Duration::from_secs(10), "ports.json written", || {
        serde_json::from_slice(&std::fs::read(data.join("ports.json")).ok()?).ok()
    });
    // HTTP is answered in HTTP: 503, joining (a readiness check fails, as it should).
    let http = format!("127.0.0.1:{}", ports["http"].as_u64().expect("http port"));
    let reply = health(&http);
    assert!(reply.starts_with("HTTP/1.1 503") && reply.contains("joining"), "{reply}");
    for name in ["flight", "pg"] {
        let port = ports[name].as_u64().unwrap_or_else(|| panic!("{name} in {ports}"));
        match std::net::TcpStream::connect(("127.0.0.1", port as u16)) {
            // Closed by the node: end of stream or a reset, within the timeout.
            Ok(mut stream) => {
                stream.set_read_timeout(Some(Duration::from_secs(5))).expect("read timeout");
                let read = stream.read(&mut [0u8; 1]).map_err(|e| e.kind());
                assert!(
                    matches!(read, Ok(0) | Err(std::io::ErrorKind::ConnectionReset)),
                    "{name} port {port} left a client waiting: {read:?}"
                );
            }
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{name} port {port}"),
        }
    }
    let data_port = ports["data"].as_u64().expect("data port").to_string();
    let mut second = node_cmd(2, 3, master_port, &rank_dir(dir.path(), 2));
    second.args(["--data-port", &data_port]);
    let out = run_with_timeout(second, Duration::from_secs(20));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains(&format!("127.0.0.1:{data_port}")), "{err}");
    assert!(err.contains("data plane") && err.contains("in use"), "{err}");
    assert!(worker.child.try_wait().expect("try_wait").is_none(), "the worker stopped waiting");
    worker.kill9();
}

/// A node started as torchrun starts it, under the launcher run id `run`.
fn torchrun_node(rank: u32, world: u32, master_port: u16, data_dir: &std::path::Path, run: &str) -> Proc {
    let mut c = shardwise();
    c.args(["node", "--insecure", "--data-dir"])
        .arg(data_dir)
        .envs([("RANK", rank.to_string()), ("WORLD_SIZE", world.to_string()), ("MASTER_PORT", master_port.to_string())])
        .envs([("MASTER_ADDR", "127.0.0.1"), ("TORCHELASTIC_RUN_ID", run), ("SHARDWISE_JOIN_TIMEOUT_MS", "3000")]);
    Proc::spawn(c)
}

/// Every rank joined, and one never passed the barrier (stopped after its hello): nothing is
/// recorded, so the next run, under a new launcher run id, forms on the same data dirs. The
/// master used to keep the first run's membership and refuse every worker of the next.
#[test]
fn a_barrier_that_times_out_leaves_the_data_dirs_free_for_the_next_run() {
    let dir = tempdir();
    let port = free_port();
    let mut master = torchrun_node(0, 3, port, &rank_dir(dir.path(), 0), "run-a");
    let mut stalled = torchrun_node(1, 3, port, &rank_dir(dir.path(), 1), "run-a");
    master.wait_for_line("rank 1 joined", Duration::from_secs(20));
    stalled.signal("STOP");
    let mut last = torchrun_node(2, 3, port, &rank_dir(dir.path(), 2), "run-a");
    let (code, out) = master.wait_exit(Duration::from_secs(30));
    assert!(code != Some(0) && out.contains("barrier timed out"), "{out}");
    stalled.kill9();
    last.wait_exit(Duration::from_secs(30));
    for rank in 0..3 {
        let d = rank_dir(dir.path(), rank);
        assert!(!d.join("cluster.json").exists() && !d.join("master/membership.json").exists(), "rank {rank}");
    }
    let mut nodes: Vec<Proc> = (0..3).map(|r| torchrun_node(r, 3, port, &rank_dir(dir.path(), r), "run-b")).collect();
    for node in &mut nodes {
        node.wait_for_line("listening rank=", Duration::from_secs(30));
    }
    let record = std::fs::read_to_string(rank_dir(dir.path(), 1).join("cluster.json")).expect("rank 1's record");
    assert!(record.contains("run-b"), "{record}");
}
