//! Launch-environment detection and validation through the binary: `--dry-run` output and the
//! error (and non-zero exit) for each misconfiguration.

use std::time::Duration;

use crate::support::*;

const T: Duration = Duration::from_secs(30);

/// What `--dry-run` detects (printed whether or not a start would pass its checks).
fn dry_run(envs: &[(&str, &str)], args: &[&str]) -> serde_json::Value {
    let mut c = shardwise();
    c.args(["node", "--dry-run"]).args(args).envs(envs.iter().copied());
    let out = run_with_timeout(c, T);
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("one JSON object ({e}); stderr: {}", String::from_utf8_lossy(&out.stderr)))
}

/// `--dry-run`'s exit code and stderr.
fn dry_run_verdict(envs: &[(&str, &str)], args: &[&str]) -> (Option<i32>, String) {
    let mut c = shardwise();
    c.args(["node", "--dry-run"]).args(args).envs(envs.iter().copied());
    let out = run_with_timeout(c, T);
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// A dry run exits 0 only when a real start would get past the checks made before the data dir
/// and the ports are touched (it approved settings every start refused).
#[test]
fn dry_run_fails_where_a_start_would() {
    let two = [("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")];
    assert_eq!(dry_run_verdict(&two, &["--insecure"]).0, Some(0));
    let (code, stderr) = dry_run_verdict(&two, &[]);
    assert!(code == Some(1) && stderr.contains("a start with these settings would fail"), "{stderr}");
    assert!(stderr.contains("secret"), "{stderr}");
    let (code, stderr) = dry_run_verdict(&two, &["--insecure", "--suspect-after-ms", "7000"]);
    assert!(code == Some(1) && stderr.contains("must be more than suspect_after_ms"), "{stderr}");
    let mut unresolvable = two;
    unresolvable[2] = ("MASTER_ADDR", "no.such.host.invalid");
    let (code, stderr) = dry_run_verdict(&unresolvable, &["--insecure"]);
    assert!(code == Some(1) && stderr.contains("does not resolve"), "{stderr}");
    // The detection is printed all the same.
    assert_eq!(dry_run(&unresolvable, &["--insecure"])["master_addr"], "no.such.host.invalid");
}

/// Runs `node` expecting failure; returns stderr.
fn fails(envs: &[(&str, &str)], args: &[&str]) -> String {
    let mut c = shardwise();
    c.arg("node").args(args).envs(envs.iter().copied());
    let out = run_with_timeout(c, T);
    assert!(!out.status.success(), "expected failure; stdout: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn dry_run_reports_each_source() {
    let v = dry_run(&[], &[]);
    assert_eq!(v["source"], "none");
    assert_eq!(v["world_size"], 1);

    let torchrun =
        [("RANK", "1"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "1"), ("MASTER_ADDR", "10.1.2.3"), ("MASTER_PORT", "1234")];
    let v = dry_run(&torchrun, &[]);
    assert_eq!(v["source"], "torchrun");
    assert_eq!((v["rank"].as_u64(), v["world_size"].as_u64(), v["local_rank"].as_u64()), (Some(1), Some(4), Some(1)));
    assert_eq!((v["master_addr"].as_str(), v["master_port"].as_u64()), (Some("10.1.2.3"), Some(1234)));

    let slurm = [
        ("SLURM_PROCID", "5"),
        ("SLURM_NTASKS", "8"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_JOB_NODELIST", "gpu[07-08,11],login1"),
        ("SLURM_JOB_NUM_NODES", "4"),
        ("SLURM_JOB_ID", "123456"),
    ];
    let v = dry_run(&slurm, &[]);
    assert_eq!(v["source"], "slurm");
    assert_eq!(v["master_addr"], "gpu07");
    assert_eq!(v["master_port"], 15000 + 3456);

    // torchrun inside a Slurm allocation wins.
    let mut both = slurm.to_vec();
    both.extend_from_slice(&torchrun);
    assert_eq!(dry_run(&both, &[])["source"], "torchrun");
    // ... and the dry run names the variables it ignored.
    let mut c = shardwise();
    c.args(["node", "--dry-run"]).envs(both.iter().copied());
    let stderr = String::from_utf8_lossy(&run_with_timeout(c, T).stderr).into_owned();
    assert!(stderr.contains("warning: ignoring Slurm variables (SLURM_PROCID"), "{stderr}");

    let v = dry_run(&[("OMPI_COMM_WORLD_RANK", "2"), ("OMPI_COMM_WORLD_SIZE", "3"), ("MASTER_ADDR", "h")], &[]);
    assert_eq!((v["source"].as_str(), v["rank"].as_u64()), (Some("openmpi"), Some(2)));
    // Boolean variables take 1/0 and yes/no as well as true/false.
    assert_eq!(dry_run(&[("SHARDWISE_INSECURE", "1")], &[])["source"], "none");
    // An empty variable is an unset one (`export SHARDWISE_CONFIG=`), not a flag without a value.
    assert_eq!(dry_run(&[("SHARDWISE_CONFIG", ""), ("SHARDWISE_SECRET_FILE", "")], &[])["source"], "none");
    let v = dry_run(&[("PMI_RANK", "0"), ("PMI_SIZE", "1")], &[]);
    assert_eq!(v["source"], "pmi");

    // Flags win over the environment; a config file is its own source.
    let v = dry_run(&torchrun, &["--rank", "2", "--world-size", "3"]);
    assert_eq!((v["source"].as_str(), v["rank"].as_u64()), (Some("flags"), Some(2)));
    let dir = tempdir();
    let cfg = dir.path().join("node.toml");
    std::fs::write(&cfg, "rank = 1\nworld_size = 2\nmaster_port = 4000\n").unwrap();
    let v = dry_run(&[], &["--config", cfg.to_str().unwrap()]);
    assert_eq!((v["source"].as_str(), v["master_port"].as_u64()), (Some("config"), Some(4000)));
}

#[test]
fn misconfigurations_fail_with_a_message() {
    let e = fails(&[("RANK", "1")], &["--dry-run"]);
    assert!(e.contains("WORLD_SIZE"), "{e}");
    let e = fails(&[], &["--rank", "4", "--world-size", "4", "--dry-run"]);
    assert!(e.contains('4'), "{e}");
    let e = fails(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "70000")], &["--dry-run"]);
    assert!(e.contains("70000"), "{e}");
    let e = fails(&[("RANK", "x"), ("WORLD_SIZE", "2")], &["--dry-run"]);
    assert!(e.contains("RANK"), "{e}");
    let dir = tempdir();
    let cfg = dir.path().join("bad.toml");
    std::fs::write(&cfg, "rnak = 1\n").unwrap();
    let e = fails(&[], &["--config", cfg.to_str().unwrap(), "--dry-run"]);
    assert!(e.contains("rnak"), "{e}");

    let data = dir.path().join("d");
    let data = data.to_str().unwrap();
    let e = fails(
        &[],
        &[
            "--rank",
            "1",
            "--world-size",
            "2",
            "--master-addr",
            "no-such-host.invalid",
            "--insecure",
            "--data-dir",
            data,
        ],
    );
    assert!(e.contains("no-such-host.invalid") && e.contains("does not resolve"), "{e}");
    let e = fails(&[], &["--rank", "1", "--world-size", "2", "--data-dir", data]);
    assert!(e.contains("no cluster secret"), "{e}");
    let e = fails(&[("SHARDWISE_CLUSTER_SECRET", "short")], &["--rank", "1", "--world-size", "2", "--data-dir", data]);
    assert!(e.contains("at least 16"), "{e}");
    // A secret left exported beside --insecure: which one was meant is unknown.
    let e = fails(
        &[("SHARDWISE_CLUSTER_SECRET", SECRET)],
        &["--rank", "1", "--world-size", "2", "--insecure", "--data-dir", data],
    );
    assert!(e.contains("both --insecure and a cluster secret"), "{e}");
    // Other machines cannot connect to a wildcard address.
    let e =
        fails(&[], &["--rank", "0", "--world-size", "2", "--insecure", "--listen-host", "0.0.0.0", "--data-dir", data]);
    assert!(e.contains("wildcard") && e.contains("--advertise-host"), "{e}");
    let e = fails(&[], &["--rank", "0", "--world-size", "1", "--advertise-host", " ", "--data-dir", data]);
    assert!(e.contains("--advertise-host is empty"), "{e}");
    // A node's port that is the master's, on the master's machine: the master could not open its
    // rendezvous there, and a worker would join itself. Refused before the data dir is made.
    let port = free_port().to_string();
    let fresh = dir.path().join("fresh");
    let two = ["--world-size", "2", "--master-port", &port, "--insecure", "--data-dir", fresh.to_str().unwrap()];
    let e = fails(&[], &[&["--rank", "0", "--http-port", &port], &two[..]].concat());
    assert!(
        e.contains(&format!("--http-port {port} (http_port in a config file) is also the master's port"))
            && e.contains("listens there"),
        "{e}"
    );
    let e = fails(&[], &[&["--rank", "1", "--pg-port", &port, "--master-addr", "127.0.0.1"], &two[..]].concat());
    assert!(e.contains("joining its own port"), "{e}");
    assert!(!fresh.exists(), "the data dir was made");
}

#[test]
fn a_locked_data_dir_is_refused() {
    let dir = tempdir();
    let data = rank_dir(dir.path(), 0);
    let mut first = Proc::spawn(node_cmd(0, 1, free_port(), &data));
    first.wait_for_line("listening rank=0", T);
    let (code, out) = Proc::spawn(node_cmd(0, 1, free_port(), &data)).wait_exit(T);
    assert_ne!(code, Some(0));
    assert!(out.contains("locked by another running node"), "{out}");
}

#[test]
fn a_data_dir_is_bound_to_its_rank() {
    let dir = tempdir();
    let port = free_port();
    let mut c = shardwise();
    c.args(["launch", "--nproc", "2", "--data-dir"]).arg(dir.path()).args(["--", "--exit-after-init"]);
    assert!(run_with_timeout(c, T).status.success());
    let (code, out) = Proc::spawn(node_cmd(1, 2, port, &rank_dir(dir.path(), 0))).wait_exit(T);
    assert_ne!(code, Some(0));
    assert!(out.contains("belongs to rank 0"), "{out}");
}

#[test]
fn a_signal_while_waiting_to_join_stops_the_node_with_a_word() {
    let dir = tempdir();
    let data = dir.path().join("r0");
    let mut c = shardwise();
    c.args(["node", "--rank", "0", "--world-size", "2", "--insecure", "--progress-interval-ms", "100"]).args([
        "--master-port",
        &free_port().to_string(),
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    let mut p = Proc::spawn(c);
    p.wait_for_line("waiting for 1 of 2 ranks", T);
    p.signal("TERM");
    let (code, out) = p.wait_exit(T);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("SIGTERM while waiting to join the cluster"), "{out}");
}
