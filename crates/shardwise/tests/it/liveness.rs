//! Nodes that work hard or are paused: the statements a node plans and runs must not hold back
//! the heartbeats its peers judge it by (suspect after 400 ms, down after 1 s in these tests), and
//! what a paused node had in flight must not take effect after its client was told it failed.

use std::time::Duration;

use crate::support::*;
use crate::tables::{Cluster, one};

/// A `SELECT` whose 200 000-item `IN` list takes seconds to plan, logically and physically
/// (about 4 s on a debug build), and whose answer is 1.
fn long_planning_statement() -> String {
    let items: Vec<String> = (0..200_000u64).map(|i| (i * 7).to_string()).collect();
    format!("SELECT count(*) FROM (VALUES (7), (8)) v(n) WHERE n IN ({})", items.join(","))
}

/// The lines `proc` printed from `from` on that say a peer was taken for suspect or down, or
/// the master lost.
fn liveness_alarms(proc: &mut Proc, from: usize) -> Vec<String> {
    proc.drain(Duration::from_millis(500));
    proc.seen[from..]
        .iter()
        .filter(|l| l.contains("is suspect") || l.contains("is down") || l.contains("lost the master"))
        .cloned()
        .collect()
}

#[test]
fn planning_a_long_statement_does_not_stop_the_nodes_heartbeats() {
    let mut cluster = Cluster::start(2);
    // From a file: 1.3 MB is more than one command-line argument may hold.
    let dir = tempdir();
    let file = dir.path().join("in_list.sql");
    std::fs::write(&file, long_planning_statement()).expect("write the statement");
    // On a worker (the master must keep hearing it), then on the master (the worker must keep
    // hearing from it). Before the physical plan was made on a freed runtime worker, the first
    // had the master log `rank 1 is suspect`, the second had the worker rejoin.
    for rank in [1usize, 0] {
        let from: Vec<usize> = cluster.procs.iter_mut().map(|p| p.drain(Duration::from_millis(200))).collect();
        let mut client = shardwise();
        client.args(["sql", "--connect", &cluster.addrs[rank], "--format", "csv", "-f"]).arg(&file);
        let out = run_with_timeout(client, Duration::from_secs(120));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "rank {rank}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(stdout.lines().collect::<Vec<_>>(), ["count(*)", "1"], "rank {rank}");
        for (peer, proc) in cluster.procs.iter_mut().enumerate() {
            let alarms = liveness_alarms(proc, from[peer]);
            assert!(alarms.is_empty(), "while rank {rank} planned, rank {peer} logged: {alarms:?}");
        }
    }
}

/// A DDL statement sent to a master paused by SIGSTOP times out and says it was not applied; it
/// must then stay unapplied when the master resumes with it in its socket buffer. (Before, the
/// master applied such a TRUNCATE on resume, removing rows acknowledged after the client was
/// told it had failed.)
#[test]
fn a_ddl_that_timed_out_on_a_paused_master_is_not_applied_when_it_resumes() {
    let mut c = Cluster::start_with_env(2, &[("SHARDWISE_PROPOSE_TIMEOUT_MS", "1500")]);
    c.sql(0, "CREATE TABLE t (id BIGINT) WITH (shard_key = 'id')");
    c.sql(1, "INSERT INTO t SELECT value FROM generate_series(1, 100)");
    c.procs[0].signal("STOP");
    let err = c.sql_err(1, "TRUNCATE TABLE t");
    c.procs[0].signal("CONT");
    // Withdrawn when its time was up, or when the worker gave the silent master up (after 1 s):
    // either way the master never confirmed it, and says so.
    assert!(err.contains("the change was not applied"), "{err}");
    // The master has read the withdrawn TRUNCATE once it answers again; rows inserted since
    // stay, and so do the ones before.
    eventually(Duration::from_secs(20), "the resumed master answers", || sql_csv(&c.addrs[0], "SELECT 1").ok());
    c.sql(1, "INSERT INTO t SELECT value FROM generate_series(101, 150)");
    c.sql(0, "CREATE TABLE after_resume (id BIGINT) WITH (shard_key = 'id')");
    for rank in 0..2 {
        assert_eq!(one(c.sql(rank, "SELECT count(*) FROM t")), ["150"], "rank {rank}");
    }
    c.procs[0].drain(Duration::from_millis(100));
}

/// A worker with no connection to the master refuses writes: it cannot tell a master that is
/// down from one it is cut off from, which counts it down and may meanwhile truncate, drop or
/// rename the table it writes (a network tester saw acknowledged rows lost that way). Writes go
/// through again once the master is back, and a retried insert id is applied once.
#[test]
fn a_worker_without_its_master_refuses_writes_until_it_is_back() {
    let c = Cluster::start_with_env(2, &[("SHARDWISE_OP_TIMEOUT_MS", "2000")]);
    let create = "CREATE TABLE w (id BIGINT) WITH (shard_key = 'id', sync_mode = 'delay_mode_distributed', \
                  delay_max_ms = 50)";
    c.sql(0, create);
    c.sql(1, "INSERT INTO w VALUES (1), (2)");
    let http = one(c.sql(1, "SELECT http_addr FROM system.nodes WHERE rank = 1")).remove(0);
    assert!(health(&http).contains("\"status\":\"ok\""));
    c.procs[0].signal("STOP");
    // Once the worker has given the master up (down after 1 s here), its writes fail.
    let insert = "INSERT INTO w VALUES (3) SETTINGS insert_id = 'w-3'";
    let err = eventually(Duration::from_secs(30), "the worker refuses writes", || {
        sql_csv(&c.addrs[1], insert).err().filter(|e| e.contains("no connection to the master"))
    });
    assert!(err.contains("nothing was written"), "{err}");
    // Its /health says so, so that a balancer sends writes elsewhere (reads go on: 200).
    let reply = health(&http);
    assert!(
        reply.starts_with("HTTP/1.1 200")
            && reply.contains("\"status\":\"degraded\"")
            && reply.contains("no connection to the master"),
        "{reply}"
    );
    c.procs[0].signal("CONT");
    eventually(Duration::from_secs(30), "writes through the worker again", || sql_csv(&c.addrs[1], insert).ok());
    assert!(health(&http).contains("\"status\":\"ok\""));
    c.sql(1, "SYSTEM FLUSH DISTRIBUTED w");
    assert_eq!(one(c.sql(0, "SELECT count(*), sum(id) FROM w")), ["3", "6"]);
}

/// Answers a client has stopped reading hold their queries, and each query the streams it reads
/// a peer's rows on; those streams share the node's connection to that peer, and their unread
/// bytes held its whole flow-control window (32 MiB, two such answers), so every cross-node query
/// of the node, and its `immediate` inserts, waited for minutes. Now rows travel on a connection
/// of their own whose window takes 127 such streams, and no other call shares it.
#[test]
fn answers_nobody_reads_hold_back_no_other_query_or_insert() {
    use std::io::Write;
    let c = Cluster::start(2);
    // About 24 MB of rows on each rank: more than a stream's 16 MiB window.
    c.sql(0, "CREATE TABLE big (id BIGINT, pad VARCHAR) WITH (shard_key = 'id')");
    c.sql(0, "INSERT INTO big SELECT value, repeat('x', 100) FROM generate_series(1, 440000)");
    c.sql(0, "CREATE TABLE small (id BIGINT) WITH (shard_key = 'id', replicas = 2)");
    let http = one(c.sql(0, "SELECT http_addr FROM system.nodes WHERE rank = 0")).remove(0);
    let unread: Vec<std::net::TcpStream> = (0..3)
        .map(|_| {
            let mut stream = std::net::TcpStream::connect(&http).expect("connect to rank 0's HTTP endpoint");
            let sql = "SELECT * FROM big FORMAT CSV";
            write!(stream, "POST /query HTTP/1.1\r\nHost: {http}\r\nContent-Length: {}\r\n\r\n{sql}", sql.len())
                .expect("send the query");
            stream
        })
        .collect();
    // Let them fill every buffer and window they can.
    std::thread::sleep(Duration::from_secs(3));
    let within = Duration::from_secs(15);
    let started = std::time::Instant::now();
    let count = sql_csv_within(&c.addrs[0], "SELECT count(*) FROM big WHERE id % 2 = 0", within);
    assert_eq!(count, Ok(vec![vec!["220000".to_string()]]), "after {:?}", started.elapsed());
    let inserted = sql_csv_within(&c.addrs[0], "INSERT INTO small SELECT value FROM generate_series(1, 100)", within);
    assert!(inserted.is_ok(), "{inserted:?}");
    assert_eq!(one(c.sql(1, "SELECT count(*) FROM small")), ["100"]);
    drop(unread);
}
