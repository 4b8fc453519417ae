//! `shardwise local` and the shell: an embedded cluster in one process, driven by a script or by
//! the interactive shell (fed on standard input with `--interactive`).

use std::time::Duration;

use crate::support::{Proc, shardwise};

#[test]
fn local_runs_a_script_against_an_embedded_cluster() {
    let mut cmd = shardwise();
    cmd.args(["local", "--nodes", "2", "--format", "csv", "-e"]).arg(
        "CREATE TABLE t (k BIGINT, v BIGINT, a BIGINT, b VARCHAR) WITH (shard_key = 'k'); \
         INSERT INTO t SELECT value, value % 3, NULL, NULL FROM generate_series(1, 1000); \
         SELECT v, count(*) AS c, count(a) AS a, count(b) AS b FROM t GROUP BY v ORDER BY v; \
         SELECT name, value FROM system.settings WHERE name = 'load_balancing'; \
         SELECT 'no header' AS h FORMAT CSV",
    );
    let (code, out) = Proc::spawn(cmd).wait_exit(Duration::from_secs(60));
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("v,c,a,b\n0,333,0,0\n1,334,0,0\n2,333,0,0"), "{out}");
    assert!(out.contains("name,value\nload_balancing,nearest\nno header"), "{out}");
}

#[test]
fn format_arrow_stream_writes_an_arrow_ipc_stream_to_a_pipe() {
    let mut cmd = shardwise();
    cmd.args(["local", "--nodes", "1", "-e", "SELECT 1 AS one, 'a' AS s FORMAT ArrowStream"]);
    let out = crate::support::run_with_timeout(cmd, Duration::from_secs(60));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let reader = arrow::ipc::reader::StreamReader::try_new(&out.stdout[..], None).expect("an Arrow IPC stream");
    let batches: Vec<_> = reader.collect::<Result<_, _>>().expect("batches");
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 1);
    assert_eq!(batches[0].schema().field(0).name(), "one");
}

#[test]
fn the_shell_reads_statements_over_lines_keeps_its_session_and_survives_errors() {
    let mut cmd = shardwise();
    cmd.args(["local", "--nodes", "2", "--interactive"]).env("SHARDWISE_HISTORY", "/dev/null");
    let input = "SELECT 1 AS one;\n\
                 SET distributed_aggregation = 'shuffle';\n\
                 \\settings\n\
                 SELECT\n  40 + 2\n  AS answer\n;\n\
                 SELECT nope;\n\
                 \\nope\n\
                 \\nodes\n\
                 \\timing\n\
                 SELECT 7 AS seven;\n\
                 \\q\n\
                 SELECT 'after quit';\n";
    let (code, out) = Proc::spawn_with_input(cmd, input).wait_exit(Duration::from_secs(60));
    assert_eq!(code, Some(0), "{out}");
    for want in [
        "| one |",
        "1 row in ",
        "| distributed_aggregation ", // \settings, with this session's SET
        "| shuffle ",
        "| answer |",
        "| 42     |",
        "error: Schema error: No field named nope",
        "unknown command \\nope",
        "| master |",
        "timing is off",
        "| seven |",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
    assert!(!out.contains("after quit"), "{out}");
    let after_timing_off = &out[out.find("timing is off").unwrap_or(0)..];
    assert!(!after_timing_off.contains(" rows in ") && !after_timing_off.contains("1 row in "), "{out}");
}

#[test]
fn ctrl_c_cancels_the_running_statement_and_the_shell_goes_on() {
    let mut cmd = shardwise();
    cmd.args(["local", "--nodes", "1", "--interactive"]).env("SHARDWISE_HISTORY", "/dev/null");
    let input = "SELECT 1 AS started;\n\
                 SELECT count(*) FROM generate_series(1, 100000000000);\n\
                 SELECT 7 AS seven;\n\
                 \\q\n";
    let mut shell = Proc::spawn_with_input(cmd, input);
    shell.wait_for_line("1 row in ", Duration::from_secs(60));
    // The long statement is running: Ctrl-C stops it, not the shell.
    std::thread::sleep(Duration::from_millis(1500));
    shell.signal("INT");
    let (code, out) = shell.wait_exit(Duration::from_secs(60));
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("error: cancelled (Ctrl-C)") && out.contains("| seven |"), "{out}");
}

#[test]
fn a_signal_stops_a_local_script_and_its_temporary_data_goes() {
    let tmp = crate::support::tempdir();
    let mut cmd = shardwise();
    cmd.args(["local", "--nodes", "1", "-e", "SELECT count(*) FROM generate_series(1, 100000000000)"])
        .env("TMPDIR", tmp.path());
    let mut local = Proc::spawn(cmd);
    crate::support::eventually(Duration::from_secs(60), "the temporary data directory", || {
        (std::fs::read_dir(tmp.path()).ok()?.count() > 0).then_some(())
    });
    std::thread::sleep(Duration::from_millis(1500));
    local.signal("INT");
    let (code, out) = local.wait_exit(Duration::from_secs(60));
    assert_eq!(code, Some(130), "{out}");
    assert!(out.contains("stopped by SIGINT"), "{out}");
    let left: Vec<_> = std::fs::read_dir(tmp.path()).expect("tmp").flatten().map(|e| e.path()).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn a_signal_stops_a_shell_waiting_at_its_prompt_and_its_temporary_data_goes() {
    for (signal, code) in [("TERM", 143), ("INT", 130)] {
        let tmp = crate::support::tempdir();
        let mut cmd = shardwise();
        cmd.args(["local", "--nodes", "1", "--interactive"])
            .env("SHARDWISE_HISTORY", "/dev/null")
            .env("TMPDIR", tmp.path());
        // Its input stays open: the shell waits for a line.
        let (mut shell, stdin) = Proc::spawn_with_stdin(cmd);
        shell.wait_for_line("statements end with ;", Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(500));
        shell.signal(signal);
        let (exit, out) = shell.wait_exit(Duration::from_secs(60));
        drop(stdin);
        assert_eq!(exit, Some(code), "SIG{signal}: {out}");
        assert!(out.contains(&format!("stopped by SIG{signal}")), "{out}");
        let left: Vec<_> = std::fs::read_dir(tmp.path()).expect("tmp").flatten().map(|e| e.path()).collect();
        assert!(left.is_empty(), "SIG{signal} left behind: {left:?}");
    }
}
