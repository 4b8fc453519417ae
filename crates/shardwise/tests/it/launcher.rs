//! `shardwise launch` supervision: a failed node stops the cluster, or with `--max-restarts` is
//! restarted alone and rejoins; SIGTERM to the launcher stops every node.

use std::time::Duration;

use crate::support::*;

const T: Duration = Duration::from_secs(60);

/// The pid a running node wrote into its data dir's LOCK file.
fn node_pid(data: &std::path::Path, rank: u32) -> String {
    std::fs::read_to_string(rank_dir(data, rank).join("LOCK")).unwrap().trim().to_string()
}

fn launch(data: &std::path::Path, extra: &[&str]) -> Proc {
    let mut c = shardwise();
    c.args(["launch", "--nproc", "2", "--data-dir"]).arg(data).args(extra).args([
        "--",
        "--heartbeat-interval-ms",
        "100",
    ]);
    Proc::spawn(c)
}

#[test]
fn a_failed_node_is_restarted_alone_and_rejoins() {
    let dir = tempdir();
    let mut l = launch(dir.path(), &["--max-restarts", "1"]);
    l.wait_for_line("[rank 0] listening rank=0", T);
    l.wait_for_line("[rank 1] listening rank=1", T);
    let master_addr = flight_addr(&l.wait_for_line("[rank 0] listening rank=0", T));
    let addresses = "SELECT flight_addr, http_addr, pg_addr FROM system.nodes WHERE rank = 1";
    let before = sql_csv(&master_addr, addresses).unwrap();
    let killed = node_pid(dir.path(), 1);
    std::process::Command::new("kill").args(["-9", &killed]).status().unwrap();
    l.wait_for_line("rank 1 exited with signal 9; restarting it (1 of 1)", T);
    eventually(Duration::from_secs(20), "rank 1 back up with a new process", || {
        let rows = sql_csv(&master_addr, "SELECT state, epoch FROM system.nodes WHERE rank = 1").ok()?;
        let back = rows.first()?[0] == "up" && rows[0][1] != "1" && node_pid(dir.path(), 1) != killed;
        back.then_some(())
    });
    // Back on the ports it had (they were free): its clients keep their addresses.
    assert_eq!(sql_csv(&master_addr, addresses).unwrap(), before);
    l.signal("TERM");
    let (code, out) = l.wait_exit(T);
    // Stopped by a signal, not finished: 128 + 15, as a shell reports it.
    assert_eq!(code, Some(143), "{out}");
    assert!(out.contains("stopped (SIGTERM)"), "{out}");
}

#[test]
fn a_launcher_whose_output_closed_keeps_its_cluster_running() {
    use std::io::BufRead;
    let dir = tempdir();
    let mut child = shardwise()
        .args(["launch", "--nproc", "2", "--max-restarts", "1", "--data-dir"])
        .arg(dir.path())
        .args(["--", "--heartbeat-interval-ms", "100"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Its stderr closed from the start; its stdout read until both nodes listen, then closed
    // too, as `launch ... | head` does.
    drop(child.stderr.take());
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut seen = String::new();
    let deadline = std::time::Instant::now() + T;
    while !(seen.contains("[rank 0] listening") && seen.contains("[rank 1] listening")) {
        assert!(std::time::Instant::now() < deadline, "nodes not listening: {seen}");
        let mut line = String::new();
        if out.read_line(&mut line).unwrap() == 0 {
            panic!("launcher output ended: {seen}");
        }
        seen.push_str(&line);
    }
    let master_addr = seen.lines().find(|l| l.contains("[rank 0] listening")).map(flight_addr).unwrap();
    drop(out);
    // The launcher now has lines to write to a closed pipe: a node's restart, its logs.
    let killed = node_pid(dir.path(), 1);
    std::process::Command::new("kill").args(["-9", &killed]).status().unwrap();
    eventually(Duration::from_secs(20), "rank 1 restarted, the launcher still running", || {
        let rows = sql_csv(&master_addr, "SELECT state FROM system.nodes WHERE rank = 1").ok()?;
        (rows.first()?[0] == "up" && node_pid(dir.path(), 1) != killed).then_some(())
    });
    assert!(child.try_wait().unwrap().is_none(), "the launcher exited");
    std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(143), "{status:?}");
}

#[test]
fn a_failed_node_stops_the_cluster_without_restarts() {
    let dir = tempdir();
    let mut l = launch(dir.path(), &[]);
    l.wait_for_line("[rank 1] listening rank=1", T);
    l.wait_for_line("[rank 0] listening rank=0", T);
    let master = node_pid(dir.path(), 0);
    std::process::Command::new("kill").args(["-9", &node_pid(dir.path(), 1)]).status().unwrap();
    let (code, out) = l.wait_exit(T);
    assert_ne!(code, Some(0), "{out}");
    assert!(out.contains("rank 1 exited with signal 9; stopping all nodes"), "{out}");
    // The master is gone too.
    assert!(!std::path::Path::new(&format!("/proc/{master}")).exists(), "master {master} still running");
}

#[test]
fn nodes_die_with_a_killed_launcher() {
    let dir = tempdir();
    let mut l = launch(dir.path(), &[]);
    l.wait_for_line("[rank 0] listening rank=0", T);
    l.wait_for_line("[rank 1] listening rank=1", T);
    let pids = [node_pid(dir.path(), 0), node_pid(dir.path(), 1)];
    l.kill9();
    for pid in pids {
        eventually(Duration::from_secs(15), &format!("node {pid} gone after the launcher's SIGKILL"), || {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            // Gone, or a zombie waiting for init to reap it.
            (status.is_empty() || status.contains("State:\tZ")).then_some(())
        });
    }
}

/// The rank flags after `--` would reach every node alike (two rank 1s, no master, a 120 s
/// wait for it): refused before anything starts.
#[test]
fn flags_the_launcher_sets_per_node_are_refused_after_the_separator() {
    let dir = tempdir();
    // The secret flags too (without the launcher's --insecure): the launcher makes the run's
    // secret, which a node told --insecure refused, naming a secret the user never gave.
    for flags in
        [&["--rank", "1"][..], &["--world-size=2"], &["--data-dir", "/tmp/x"], &["--insecure"], &["--secret-file=/f"]]
    {
        let secret = flags[0].contains("secure") || flags[0].contains("secret");
        let mut cmd = shardwise();
        cmd.args(["launch", "--nproc", "2"]).args(if secret { &[][..] } else { &["--insecure"][..] });
        cmd.arg("--data-dir").arg(dir.path()).arg("--").args(flags);
        let out = run_with_timeout(cmd, Duration::from_secs(20));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flags:?}: {stderr}");
        let flag = flags[0].split('=').next().unwrap_or_default();
        assert!(stderr.contains(&format!("{flag} is given after --")), "{flags:?}: {stderr}");
        if secret {
            assert!(stderr.contains(&format!("shardwise launch {flag}")), "{stderr}");
        }
    }
}
