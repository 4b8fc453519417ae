//! `shardwise sql` against a real node: the three output formats, scripts that stop at the first
//! error naming its statement and line, and server errors shown as messages.

use std::time::Duration;

use crate::support::*;

const T: Duration = Duration::from_secs(30);

fn sql(addr: &str, args: &[&str]) -> std::process::Output {
    let mut c = shardwise();
    c.args(["sql", "--connect", addr]).args(args);
    run_with_timeout(c, T)
}

#[test]
fn formats_scripts_and_errors() {
    let dir = tempdir();
    let mut node = Proc::spawn(node_cmd(0, 1, free_port(), &rank_dir(dir.path(), 0)));
    let listening = node.wait_for_line("listening rank=0", T);
    let addr = flight_addr(&listening);
    let q = "SELECT * FROM (VALUES (1, 'a'), (2, NULL)) AS t(n, s) ORDER BY n";

    // The node's other ports, or none, are named as such (they failed with transport errors).
    for (other, says) in [
        (listening_addr(&listening, "pg"), "answers as a PostgreSQL server (a node's pg= port?), not as Flight SQL"),
        (listening_addr(&listening, "http"), "answers as an HTTP server (a node's http= port?), not as Flight SQL"),
        ("127.0.0.1".to_string(), "names no port"),
    ] {
        let out = sql(&other, &["-e", "SELECT 1"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{other}: {err}");
    }

    let out = sql(&addr, &["-e", q]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(table.contains("| n | s    |") && table.contains("| 2 | NULL |"), "{table}");

    let out = sql(&addr, &["--format", "csv", "-e", q]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "n,s\n1,a\n2,\n");

    let out = sql(&addr, &["--format", "tsv", "-e", q]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "n\ts\n1\ta\n2\t\\N\n");
    let out = sql(&addr, &["-e", &format!("{q} FORMAT TabSeparated")]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "1\ta\n2\t\\N\n");

    let out = sql(&addr, &["--format", "json", "-e", q]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "{\"n\":1,\"s\":\"a\"}\n{\"n\":2,\"s\":null}\n");

    let script = dir.path().join("script.sql");
    std::fs::write(&script, "SELECT 1 AS one;\n-- the next one is wrong\nSELECT nope FROM system.nodes;\nSELECT 3;\n")
        .unwrap();
    let out = sql(&addr, &["--format", "csv", "-f", script.to_str().unwrap()]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success());
    assert_eq!(stdout, "one\n1\n", "the first statement ran, the third did not");
    assert!(stderr.contains("statement 2 (") && stderr.contains("line 3") && stderr.contains("nope"), "{stderr}");

    // A script file may hold the shell's backslash commands on lines of their own, as psql's do.
    let script = dir.path().join("commands.sql");
    std::fs::write(&script, "\\nodes\nSELECT 'after' AS s;\n\\q\nSELECT 'not run' AS s;\n").unwrap();
    let out = sql(&addr, &["--format", "csv", "-f", script.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(",master,") && stdout.ends_with("s\nafter\n"), "{stdout}");
    std::fs::write(&script, "SELECT 1;\n\\nope\n").unwrap();
    let out = sql(&addr, &["-f", script.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && stderr.contains("command \\nope (")
            && stderr.contains("line 2)")
            && stderr.contains("unknown command \\nope"),
        "{stderr}"
    );

    // From a pipe each statement runs once its `;` is read, before the input ends; `\timing`
    // turns on the time; statements are counted without the commands between them.
    let mut c = shardwise();
    c.args(["sql", "--connect", &addr, "--format", "csv"]);
    let (mut piped, mut stdin) = Proc::spawn_with_stdin(c);
    std::io::Write::write_all(&mut stdin, b"SELECT 41 + 1 AS x;\n").expect("write");
    piped.wait_for_line("42", T);
    std::io::Write::write_all(&mut stdin, b"\\timing\nSELECT 2 AS y;\n").expect("write");
    piped.wait_for_line("1 row in ", T);
    std::io::Write::write_all(&mut stdin, b"SELECT nope;\nSELECT 'not run';\n").expect("write");
    drop(stdin);
    let (code, out) = piped.wait_exit(T);
    assert!(code != Some(0) && out.contains("statement 3 (stdin line 4)") && !out.contains("not run"), "{out}");

    // CSV is written as it arrives: a reader that stops after three lines of an endless result
    // ends the query (the failed write cancels it) instead of waiting for all of it.
    let mut c = shardwise();
    c.args(["sql", "--connect", &addr, "--format", "csv", "-e", "SELECT value FROM generate_series(1, 100000000000)"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().expect("spawn sql");
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().expect("stdout")));
    let first: Vec<String> = lines.by_ref().take(3).map(|l| l.expect("line")).collect();
    assert_eq!(first, ["value", "1", "2"]);
    drop(lines);
    let started = std::time::Instant::now();
    let status = loop {
        match child.try_wait().expect("wait") {
            Some(status) => break status,
            None if started.elapsed() > T => {
                let _ = child.kill();
                panic!("shardwise sql went on after its reader stopped");
            }
            None => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr).expect("stderr");
    assert!(!status.success() && stderr.contains("cannot write the result"), "{stderr}");
    // ... and the statement stopped on the node, not only in the client.
    let state = "SELECT state FROM system.queries WHERE query LIKE '%100000000000)' ORDER BY query_id";
    eventually(T, "the abandoned statement cancelled on the node", || {
        let rows = sql_csv(&addr, state).ok()?;
        (rows == vec![vec!["cancelled".to_string()]]).then_some(())
    });

    let out = sql(&addr, &["-e", "CREATE EXTERNAL TABLE t STORED AS CSV LOCATION '/etc/passwd'"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not supported"), "{}", String::from_utf8_lossy(&out.stderr));

    let out = sql("127.0.0.1:1", &["-e", "SELECT 1"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("could not connect to 127.0.0.1:1"));
}

#[test]
fn the_shell_logs_in_again_after_its_node_restarted() {
    use std::io::Write;
    let mut c = crate::tables::Cluster::start(1);
    let addr = c.addrs[0].clone();
    let mut cmd = shardwise();
    cmd.args(["sql", "--connect", &addr, "--interactive"]).env("SHARDWISE_HISTORY", "/dev/null");
    let (mut shell, mut stdin) = Proc::spawn_with_stdin(cmd);
    stdin.write_all(b"SET distributed_aggregation = 'shuffle';\nSELECT 1 AS a;\n").expect("write");
    shell.wait_for_line("1 row in ", T);
    // The node goes away and comes back (on the same port): its sessions are gone.
    c.procs[0].kill9();
    c.restart(0);
    assert_eq!(c.addrs[0], addr, "the node keeps its port");
    stdin.write_all(b"SELECT 2 AS b;\n\\q\n").expect("write");
    drop(stdin);
    let (code, out) = shell.wait_exit(T);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("the node restarted: logged in again") && out.contains("| b |"), "{out}");
}
