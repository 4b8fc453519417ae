//! Sharded tables across real node processes: DDL, inserts in both sync modes through every
//! node, bad input that must change nothing, a node down while its queue grows, and the crash
//! soak with a few kills.

use std::time::Duration;

use crate::support::*;

/// A 3-node cluster (with a cluster secret, so the data plane credential is checked).
pub(crate) struct Cluster {
    pub(crate) procs: Vec<Proc>,
    pub(crate) addrs: Vec<String>,
    port: u16,
    dir: tempfile::TempDir,
}

impl Cluster {
    pub(crate) fn start(n: u32) -> Cluster {
        Self::start_with_env(n, &[])
    }

    /// [`Cluster::start`] with extra environment variables (settings) for every node.
    pub(crate) fn start_with_env(n: u32, env: &[(&str, &str)]) -> Cluster {
        let dir = tempdir();
        let port = free_port();
        let mut procs: Vec<Proc> = (0..n)
            .map(|r| {
                let mut cmd = node_cmd(r, n, port, &rank_dir(dir.path(), r));
                cmd.envs(env.iter().copied());
                Proc::spawn(cmd)
            })
            .collect();
        let addrs = procs
            .iter_mut()
            .map(|p| flight_addr(&p.wait_for_line("listening rank=", Duration::from_secs(30))))
            .collect();
        Cluster { procs, addrs, port, dir }
    }

    pub(crate) fn sql(&self, rank: usize, sql: &str) -> Vec<Vec<String>> {
        sql_csv(&self.addrs[rank], sql).unwrap_or_else(|e| panic!("rank {rank}: {sql}: {e}"))
    }

    pub(crate) fn sql_err(&self, rank: usize, sql: &str) -> String {
        match sql_csv(&self.addrs[rank], sql) {
            Ok(rows) => panic!("rank {rank}: {sql}: expected an error, got {rows:?}"),
            Err(e) => e,
        }
    }

    /// The data dir of `rank`.
    pub(crate) fn data_dir(&self, rank: u32) -> std::path::PathBuf {
        rank_dir(self.dir.path(), rank)
    }

    pub(crate) fn restart(&mut self, rank: u32) {
        self.restart_with(rank, &[]);
    }

    /// [`Cluster::restart`] with extra arguments to `shardwise node`.
    pub(crate) fn restart_with(&mut self, rank: u32, args: &[&str]) {
        let mut p = self.spawn_node(rank, args);
        self.addrs[rank as usize] = flight_addr(&p.wait_for_line("listening rank=", Duration::from_secs(30)));
        self.procs[rank as usize] = p;
    }

    /// Starts the node of `rank` again with extra arguments, without waiting for it.
    pub(crate) fn spawn_node(&self, rank: u32, args: &[&str]) -> Proc {
        self.spawn_node_in(rank, &rank_dir(self.dir.path(), rank), args)
    }

    /// [`Cluster::spawn_node`] on another data dir.
    pub(crate) fn spawn_node_in(&self, rank: u32, data_dir: &std::path::Path, args: &[&str]) -> Proc {
        let n = self.procs.len() as u32;
        let mut cmd = node_cmd(rank, n, self.port, data_dir);
        cmd.args(args);
        Proc::spawn(cmd)
    }
}

pub(crate) fn one(rows: Vec<Vec<String>>) -> Vec<String> {
    assert_eq!(rows.len(), 1, "{rows:?}");
    rows.into_iter().next().unwrap_or_default()
}

#[test]
fn inserts_through_every_node_in_both_modes_agree() {
    let c = Cluster::start(3);
    c.sql(
        0,
        "CREATE TABLE imm (id BIGINT, g VARCHAR, v DOUBLE, d DECIMAL(10,2), ok BOOLEAN, day DATE, ts TIMESTAMP) \
         WITH (shard_key = 'id', replicas = 2)",
    );
    c.sql(
        1,
        "CREATE TABLE del (id BIGINT, g VARCHAR, v DOUBLE) WITH (shard_key = 'g,id', replicas = 2, \
              sync_mode = 'delay_mode_distributed', delay_max_ms = 200)",
    );
    // Both tables are visible everywhere.
    for r in 0..3 {
        assert_eq!(c.sql(r, "SHOW TABLES"), vec![vec!["del".to_string()], vec!["imm".to_string()]]);
    }
    let mut expected_sum = 0i64;
    for r in 0..3usize {
        let lo = r as i64 * 1000;
        c.sql(
            r,
            &format!(
                "INSERT INTO imm SELECT value, 'g' || (value % 7), value * 0.5, CAST(value AS DECIMAL(10,2)) AS d, \
                 value % 2 = 0, DATE '2024-01-01', TIMESTAMP '2024-01-01 00:00:00' FROM generate_series({lo}, {})",
                lo + 999
            ),
        );
        c.sql(
            r,
            &format!(
                "INSERT INTO del SELECT value, 'g' || (value % 7), value * 0.5 FROM generate_series({lo}, {})",
                lo + 999
            ),
        );
        expected_sum += (lo..lo + 1000).sum::<i64>();
    }
    // immediate: visible at once, from every node.
    for r in 0..3 {
        assert_eq!(
            one(c.sql(r, "SELECT count(*), sum(id), count(DISTINCT id) FROM imm")),
            vec!["3000".to_string(), expected_sum.to_string(), "3000".to_string()]
        );
    }
    // delay_mode_distributed: after a flush.
    c.sql(2, "SYSTEM FLUSH DISTRIBUTED del");
    for r in 0..3 {
        assert_eq!(
            one(c.sql(r, "SELECT count(*), sum(id), count(DISTINCT id) FROM del")),
            vec!["3000".to_string(), expected_sum.to_string(), "3000".to_string()]
        );
    }
    assert!(c.sql(0, "SELECT * FROM system.sync_queues").is_empty());
    // Every replica of every shard holds the same rows; data is marked as verified placement.
    let shards = c.sql(
        0,
        "SELECT \"table\", shard, min(rows), max(rows), bool_and(verified_placement) FROM system.shards GROUP BY 1, 2",
    );
    assert_eq!(shards.len(), 6, "{shards:?}");
    for s in &shards {
        assert_eq!(s[2], s[3], "replicas differ: {s:?}");
        assert_eq!(s[4], "true", "{s:?}");
    }
    // A retried insert with the same insert_id is applied once, in both modes.
    for table in ["imm", "del"] {
        for _ in 0..2 {
            c.sql(
                1,
                &format!(
                    "INSERT INTO {table} (id, g, v) VALUES (9999999, 'x', 1) SETTINGS insert_id = 'retry-{table}'"
                ),
            );
        }
    }
    c.sql(0, "SYSTEM FLUSH DISTRIBUTED del");
    for table in ["imm", "del"] {
        assert_eq!(one(c.sql(0, &format!("SELECT count(*) FROM {table} WHERE id = 9999999"))), vec!["1".to_string()]);
    }
    // TRUNCATE and DROP reach every node.
    c.sql(1, "TRUNCATE TABLE imm");
    assert_eq!(one(c.sql(2, "SELECT count(*) FROM imm")), vec!["0".to_string()]);
    c.sql(2, "DROP TABLE del");
    let err = c.sql_err(0, "SELECT count(*) FROM del");
    assert!(err.contains("unknown table \"del\"; tables: imm"), "{err}");
}

/// Several clients inserting into one node's `delay_mode_distributed` table at once: their
/// outbox appends contend (one runs in place on its worker, the others wait handed over), and
/// every row must still arrive exactly once.
#[test]
fn concurrent_inserts_through_one_node_are_kept_exactly_once() {
    let c = Cluster::start(3);
    c.sql(
        0,
        "CREATE TABLE conc (id BIGINT, writer INT) WITH (shard_key = 'id', replicas = 2, \
         sync_mode = 'delay_mode_distributed', delay_max_ms = 100)",
    );
    let (writers, inserts_per_writer, rows_per_insert) = (4i64, 40i64, 3i64);
    std::thread::scope(|scope| {
        for writer in 0..writers {
            let addr = c.addrs[0].clone();
            scope.spawn(move || {
                let statements: String = (0..inserts_per_writer)
                    .map(|i| {
                        let first = (writer * inserts_per_writer + i) * rows_per_insert;
                        let rows: Vec<String> =
                            (first..first + rows_per_insert).map(|id| format!("({id}, {writer})")).collect();
                        format!("INSERT INTO conc VALUES {};", rows.join(", "))
                    })
                    .collect();
                sql_csv(&addr, &statements).unwrap_or_else(|e| panic!("writer {writer}: {e}"));
            });
        }
    });
    c.sql(0, "SYSTEM FLUSH DISTRIBUTED conc");
    let total = writers * inserts_per_writer * rows_per_insert;
    for r in 0..3 {
        assert_eq!(
            one(c.sql(r, "SELECT count(*), count(DISTINCT id), sum(id) FROM conc")),
            vec![total.to_string(), total.to_string(), (0..total).sum::<i64>().to_string()]
        );
    }
    let per_writer = c.sql(1, "SELECT writer, count(*) FROM conc GROUP BY writer ORDER BY writer");
    let expected: Vec<Vec<String>> =
        (0..writers).map(|w| vec![w.to_string(), (inserts_per_writer * rows_per_insert).to_string()]).collect();
    assert_eq!(per_writer, expected);
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let c = Cluster::start(2);
    c.sql(0, "CREATE TABLE t (id BIGINT, small TINYINT, name VARCHAR) WITH (shard_key = 'id')");
    c.sql(0, "INSERT INTO t VALUES (1, 1, 'a')");
    let cases = [
        ("CREATE TABLE t (id BIGINT) WITH (shard_key = 'id')", "already exists"),
        ("CREATE TABLE u (id BIGINT) WITH (shard_key = 'nope')", "not a column"),
        ("CREATE TABLE u (id BIGINT) WITH (shard_key = 'id', replicas = 3)", "replicas"),
        ("CREATE TABLE u (id BIGINT) WITH (shard_key = 'id', sync_mode = 'eventually')", "sync_mode"),
        ("CREATE TABLE u (id BIGINT) WITH (shard_key = 'id', colour = 'red')", "unknown table option"),
        (
            "CREATE TABLE u (id BIGINT) WITH (shard_key = 'id', delay_max_ms = -5)",
            "delay_max_ms=-5: an integer from 1 to",
        ),
        ("CREATE TABLE u (id BIGINT NOT NULL) WITH (shard_key = 'id')", "NOT NULL"),
        ("CREATE TABLE u (id BIGINT)", "shard_key"),
        ("CREATE TABLE u (id BIGINT, d DECIMAL(5, -1)) WITH (shard_key = 'id')", "scale must be 0 or more"),
        (
            "INSERT INTO t VALUES (2, 300, 'b')",
            "row 1, column small (column type Int8): Cast error: Can't cast value 300",
        ),
        (
            "INSERT INTO t VALUES (2, 1, 'b'), (3, 'x', 'c')",
            "row 2, column small (column type Int8): Cast error: Cannot cast string 'x'",
        ),
        ("INSERT INTO t VALUES (2, 1, 'b'), (2, 1)", "VALUES row 2 has 2 values where 3 are expected"),
        // From a query whose values run in fragments, on both nodes: the column is named.
        ("INSERT INTO t SELECT value, value * 100, 'x' FROM generate_series(1, 5)", "INSERT INTO t: column small: "),
        ("INSERT INTO t SELECT id + 10, small * 200, name FROM t", "INSERT INTO t: column small: "),
        // A constant that does not fit fails as the optimizer folds it, before anything runs.
        ("INSERT INTO t (id, small) SELECT 'x', 1", "INSERT INTO t: column id: "),
        ("INSERT INTO nope VALUES (1)", "unknown table \"nope\"; tables: "),
        ("INSERT INTO nope SELECT 1", "unknown table \"nope\"; tables: "),
        ("INSERT INTO t (id, nope) VALUES (1, 2)", "nope"),
        ("INSERT INTO t VALUES (4, 1, 'd') SETTINGS insert_quorum = 5", "insert_quorum"),
        ("INSERT INTO t VALUES (4, 1, 'd') SETTINGS no_such_setting = 1", "no_such_setting"),
        ("DROP TABLE nope", "unknown table"),
        ("TRUNCATE TABLE nope", "unknown table"),
        ("SYSTEM FLUSH DISTRIBUTED nope", "unknown table"),
        ("ALTER TABLE t ADD COLUMN z INT", "CREATE TABLE ... AS SELECT"),
        ("UPDATE t SET small = 2", "INSERTs only"),
        ("DELETE FROM t WHERE id = 1", "INSERTs only"),
        ("EXPLAIN ANALYZE INSERT INTO t VALUES (5, 1, 'e')", "EXPLAIN ANALYZE of an INSERT"),
    ];
    for (sql, needle) in cases {
        let err = c.sql_err(1, sql);
        assert!(err.contains(needle), "{sql}: {err:?} lacks {needle:?}");
        assert!(!err.contains("Optimizer rule"), "{sql}: {err:?} names an optimizer rule");
    }
    // A date no client could read back (Arrow's DATE holds any 32-bit day count) is refused
    // whatever path brings it; the table stays empty.
    c.sql(0, "CREATE TABLE days (id BIGINT, day DATE) WITH (shard_key = 'id')");
    let err = c.sql_err(1, "INSERT INTO days SELECT 1, CAST(-99999999 AS DATE)");
    assert!(err.contains("column day") && err.contains("beyond the dates a DATE holds"), "{err}");
    assert_eq!(one(c.sql(0, "SELECT count(*) FROM days")), ["0"]);
    c.sql(0, "DROP TABLE days");
    // Statements that failed before running are in system.queries with their error.
    let logged = c.sql(
        1,
        "SELECT state, error LIKE '%No field named nope%' FROM system.queries \
         WHERE query = 'INSERT INTO t (id, nope) VALUES (1, 2)'",
    );
    assert_eq!(logged, vec![vec!["failed".to_string(), "true".to_string()]]);
    // EXPLAIN of an INSERT shows its plan and writes nothing.
    let plan = c.sql(1, "EXPLAIN INSERT INTO t VALUES (5, 1, 'e')").concat().join(" ");
    assert!(plan.contains("Dml") || plan.contains("Insert"), "{plan}");
    assert_eq!(
        c.sql(1, "SELECT id, small, name FROM t"),
        vec![vec!["1".to_string(), "1".to_string(), "a".to_string()]]
    );
    assert_eq!(c.sql(0, "SHOW TABLES"), vec![vec!["t".to_string()]]);
}

#[test]
fn create_table_as_select_copies_the_rows_or_leaves_no_table() {
    let c = Cluster::start(2);
    c.sql(0, "CREATE TABLE src (id BIGINT, g VARCHAR, v DOUBLE) WITH (shard_key = 'id')");
    c.sql(0, "INSERT INTO src VALUES (1, 'a', 1.5), (2, 'b', 2.5), (3, 'a', 3.5), (4, NULL, NULL)");
    c.sql(
        1,
        "CREATE TABLE per_g WITH (shard_key = 'g', replicas = 2) AS \
         SELECT g, count(*) AS n, sum(v) AS total FROM src GROUP BY g",
    );
    let want = [["a", "2", "5.0"], ["b", "1", "2.5"], ["", "1", ""]].map(|r| r.map(String::from).to_vec()).to_vec();
    assert_eq!(c.sql(0, "SELECT g, n, total FROM per_g ORDER BY g NULLS LAST"), want);
    // The query's columns, every one nullable (count(*) is not, in the query).
    assert_eq!(
        c.sql(0, "DESCRIBE per_g"),
        [["g", "Utf8", "YES"], ["n", "Int64", "YES"], ["total", "Float64", "YES"]]
            .map(|r| r.map(String::from).to_vec())
            .to_vec()
    );
    assert_eq!(one(c.sql(1, "SELECT replicas FROM system.tables WHERE name = 'per_g'")), vec!["2".to_string()]);
    // A DECIMAL average or quotient is typed as its rows are (16 fractional digits), in a new
    // table and into a column of another DECIMAL type (rounded to its scale).
    c.sql(0, "CREATE TABLE dd (g INT, d DECIMAL(18, 4)) WITH (shard_key = 'g')");
    c.sql(0, "INSERT INTO dd VALUES (1, 1.5), (1, 2.25), (2, 1)");
    c.sql(0, "CREATE TABLE dd_avg WITH (shard_key = 'g') AS SELECT g, avg(d) AS a, max(d) / 3 AS q FROM dd GROUP BY g");
    assert_eq!(
        c.sql(1, "SELECT g, a, q, arrow_typeof(a) = 'Decimal128(30, 16)' FROM dd_avg ORDER BY g"),
        [
            ["1", "1.8750000000000000", "0.7500000000000000", "true"],
            ["2", "1.0000000000000000", "0.3333333333333333", "true"]
        ]
        .map(|r| r.map(String::from).to_vec())
        .to_vec()
    );
    c.sql(0, "CREATE TABLE dd_into (g INT, a DECIMAL(22, 8), q DECIMAL(6, 2)) WITH (shard_key = 'g')");
    c.sql(1, "INSERT INTO dd_into SELECT g, avg(d), max(d) / 3 FROM dd GROUP BY g");
    assert_eq!(
        c.sql(0, "SELECT g, a, q FROM dd_into ORDER BY g"),
        [["1", "1.87500000", "0.75"], ["2", "1.00000000", "0.33"]].map(|r| r.map(String::from).to_vec()).to_vec()
    );
    for table in ["dd", "dd_avg", "dd_into"] {
        c.sql(0, &format!("DROP TABLE {table}"));
    }
    // Already there: IF NOT EXISTS runs nothing, without it an error.
    c.sql(0, "CREATE TABLE IF NOT EXISTS per_g WITH (shard_key = 'g') AS SELECT g, 0 AS n, 0.0 AS total FROM src");
    assert_eq!(one(c.sql(0, "SELECT count(*) FROM per_g")), vec!["3".to_string()]);
    let cases = [
        ("CREATE TABLE per_g WITH (shard_key = 'g') AS SELECT g FROM src", "already exists"),
        ("CREATE TABLE both (id BIGINT) WITH (shard_key = 'id') AS SELECT id FROM src", "not both"),
        ("CREATE TABLE nokey AS SELECT id FROM src", "shard_key"),
        ("CREATE TABLE arr WITH (shard_key = 'id') AS SELECT id, make_array(1, 2) AS a FROM src", "unsupported type"),
        ("CREATE TABLE q WITH (shard_key = 'id') AS SELECT id FROM nope", "nope"),
        // Created, then the insert fails on the data: the table goes again.
        ("CREATE TABLE bad WITH (shard_key = 'id') AS SELECT id, 10 / (id - id) AS x FROM src", "table dropped again"),
    ];
    for (sql, needle) in cases {
        let err = c.sql_err(0, sql);
        assert!(err.contains(needle), "{sql}: {err:?} lacks {needle:?}");
    }
    assert!(c.sql_err(0, cases[5].0).contains("division by zero"));
    // EXPLAIN shows the SELECT's plan and creates nothing; EXPLAIN ANALYZE would have to.
    let plan = c.sql(0, "EXPLAIN CREATE TABLE ex WITH (shard_key = 'g') AS SELECT g, count(*) FROM src GROUP BY g");
    assert!(plan.iter().any(|r| r.join(" ").contains("DistributedFragmentExec")), "{plan:?}");
    let err = c.sql_err(0, "EXPLAIN ANALYZE CREATE TABLE ex WITH (shard_key = 'g') AS SELECT g FROM src");
    assert!(err.contains("EXPLAIN ANALYZE its SELECT"), "{err}");
    // The insert ran as a query of its own node, under the statement's text.
    let logged = c.sql(1, "SELECT state FROM system.queries WHERE query LIKE 'CREATE TABLE per_g WITH%'");
    assert_eq!(logged, vec![vec!["finished".to_string()]]);
    assert_eq!(c.sql(1, "SHOW TABLES"), vec![vec!["per_g".to_string()], vec!["src".to_string()]]);

    // A client that goes away while the rows go in leaves no half-filled table behind.
    let mut client = Proc::spawn({
        let mut cmd = shardwise();
        cmd.args(["sql", "--connect", &c.addrs[0], "-e"])
            .arg("CREATE TABLE big WITH (shard_key = 'k') AS SELECT value AS k FROM generate_series(1, 30000000)");
        cmd
    });
    let has_big = |c: &Cluster| c.sql(1, "SHOW TABLES").iter().any(|r| r[0] == "big");
    eventually(Duration::from_secs(30), "the table of the CTAS", || has_big(&c).then_some(()));
    client.kill9();
    eventually(Duration::from_secs(30), "the abandoned CTAS's table to go", || (!has_big(&c)).then_some(()));

    // KILL QUERY stops one too, and its table goes.
    let mut client = Proc::spawn({
        let mut cmd = shardwise();
        cmd.args(["sql", "--connect", &c.addrs[0], "-e"])
            .arg("CREATE TABLE big WITH (shard_key = 'k') AS SELECT value AS k FROM generate_series(1, 30000000)");
        cmd
    });
    let running = "SELECT query_id FROM system.queries WHERE state = 'running' AND query LIKE 'CREATE TABLE big %'";
    let id = eventually(Duration::from_secs(30), "the CTAS in system.queries", || {
        c.sql(0, running).first().map(|r| r[0].clone())
    });
    c.sql(0, &format!("KILL QUERY WHERE query_id = '{id}'"));
    let (code, out) = client.wait_exit(Duration::from_secs(30));
    assert!(code != Some(0) && out.contains("KILL QUERY"), "{code:?} {out}");
    eventually(Duration::from_secs(30), "the killed CTAS's table to go", || (!has_big(&c)).then_some(()));

    // Renamed while its rows go in, then stopped: the table is left under its new name, and
    // the error says so (it said "table dropped again", having dropped nothing).
    let mut client = Proc::spawn({
        let mut cmd = shardwise();
        cmd.args(["sql", "--connect", &c.addrs[0], "-e"])
            .arg("CREATE TABLE big WITH (shard_key = 'k') AS SELECT value AS k FROM generate_series(1, 30000000)");
        cmd
    });
    let id = eventually(Duration::from_secs(30), "the CTAS in system.queries", || {
        c.sql(0, running).first().map(|r| r[0].clone())
    });
    c.sql(1, "RENAME TABLE big TO big_kept");
    c.sql(0, &format!("KILL QUERY WHERE query_id = '{id}'"));
    let (code, out) = client.wait_exit(Duration::from_secs(30));
    assert!(code != Some(0) && out.contains("renamed to big_kept") && !out.contains("dropped again"), "{out}");
    assert!(c.sql(1, "SHOW TABLES").iter().any(|r| r[0] == "big_kept"));
}

/// A flush waits for the table it was asked about by that table's identity: renamed while the
/// flush waits (its queued rows follow it), it is still waited for. It used to be looked up by
/// name again every 10 ms, found gone, and the flush answered done with rows still queued.
#[test]
fn a_flush_waits_for_its_table_through_a_rename() {
    let c = Cluster::start(3);
    c.sql(
        0,
        "CREATE TABLE ev (id BIGINT) WITH (shard_key = 'id', replicas = 2, sync_mode = 'delay_mode_distributed', \
         delay_max_ms = 3600000, delay_max_rows = 100000000, delay_max_bytes = 1073741824)",
    );
    for rank in 0..3 {
        let from = rank * 200_000 + 1;
        c.sql(rank, &format!("INSERT INTO ev SELECT value FROM generate_series({from}, {})", from + 199_999));
    }
    // Rank 2 cannot take its rows until it is continued: the flush has to wait for it.
    c.procs[2].signal("STOP");
    let flushed = std::thread::scope(|scope| {
        let addr = c.addrs[0].clone();
        let flush =
            scope.spawn(move || sql_csv(&addr, "SYSTEM FLUSH DISTRIBUTED ev SETTINGS flush_timeout_ms = 120000"));
        std::thread::sleep(Duration::from_millis(500));
        // Applied at once on ranks 0 and 1 (the master waits up to metadata_applied_timeout_ms
        // for rank 2 to apply it).
        let renamed = sql_csv(&c.addrs[1], "RENAME TABLE ev TO ev2");
        std::thread::sleep(Duration::from_millis(500));
        c.procs[2].signal("CONT");
        (renamed, flush.join().expect("the flush thread"))
    });
    assert!(flushed.0.is_ok() && flushed.1.is_ok(), "{flushed:?}");
    // Done means delivered: both replicas of every shard hold every row.
    let replicas = "SELECT sum(rows) FROM system.shards WHERE \"table\" = 'ev2'";
    assert_eq!(one(c.sql(2, replicas)), ["1200000"]);
    assert!(c.sql(0, "SELECT * FROM system.sync_queues").is_empty());
}

#[test]
fn renamed_tables_keep_their_rows_queues_and_identity() {
    let mut c = Cluster::start(2);
    // Rows held in the outboxes (nothing ships until a flush), then the table renamed.
    c.sql(
        0,
        "CREATE TABLE events (id BIGINT) WITH (shard_key = 'id', replicas = 2, sync_mode = 'delay_mode_distributed', \
         delay_max_ms = 3600000, delay_max_rows = 100000000, delay_max_bytes = 1073741824)",
    );
    c.sql(0, "INSERT INTO events SELECT value FROM generate_series(1, 100)");
    c.sql(1, "INSERT INTO events SELECT value FROM generate_series(101, 150)");
    let queued = "SELECT \"table\", sum(pending_rows) FROM system.sync_queues GROUP BY \"table\"";
    assert_eq!(c.sql(0, queued), vec![vec!["events".to_string(), "300".to_string()]]);
    c.sql(1, "RENAME TABLE events TO clicks");
    assert_eq!(c.sql(0, "SHOW TABLES"), vec![vec!["clicks".to_string()]]);
    assert_eq!(c.sql(0, queued), vec![vec!["clicks".to_string(), "300".to_string()]]);
    assert!(c.sql_err(0, "SELECT count(*) FROM events").contains("events"));
    c.sql(0, "INSERT INTO clicks SELECT value FROM generate_series(151, 160)");
    // The flush waits for the rows queued under either name; every replica then has them once.
    c.sql(0, "SYSTEM FLUSH DISTRIBUTED clicks");
    c.sql(1, "SYSTEM FLUSH DISTRIBUTED clicks");
    assert!(c.sql(0, "SELECT * FROM system.sync_queues").is_empty());
    for rank in 0..2 {
        assert_eq!(one(c.sql(rank, "SELECT count(*), count(DISTINCT id) FROM clicks")), vec!["160", "160"]);
    }
    let replicas = "SELECT sum(rows) FROM system.shards WHERE \"table\" = 'clicks'";
    assert_eq!(one(c.sql(1, replicas)), vec!["320".to_string()]);

    // A swap in one statement, applied in order, all or none.
    c.sql(0, "CREATE TABLE fresh (id BIGINT) WITH (shard_key = 'id')");
    c.sql(0, "INSERT INTO fresh VALUES (1), (2), (3)");
    c.sql(1, "RENAME TABLE clicks TO old_clicks, fresh TO clicks");
    assert_eq!(one(c.sql(0, "SELECT count(*) FROM clicks")), vec!["3".to_string()]);
    assert_eq!(one(c.sql(0, "SELECT count(*) FROM old_clicks")), vec!["160".to_string()]);
    let cases = [
        ("RENAME TABLE clicks TO other, old_clicks TO other", "a table \"other\" already exists"),
        ("RENAME TABLE nope TO other", "unknown table \"nope\""),
        ("RENAME TABLE clicks TO \"no-dash\"", "no-dash"),
        ("ALTER TABLE clicks ADD COLUMN x INT", "RENAME TABLE t TO t_old"),
    ];
    for (sql, needle) in cases {
        let err = c.sql_err(0, sql);
        assert!(err.contains(needle), "{sql}: {err:?} lacks {needle:?}");
    }
    assert_eq!(c.sql(1, "SHOW TABLES"), vec![vec!["clicks".to_string()], vec!["old_clicks".to_string()]]);
    // PostgreSQL's form, with IF EXISTS a no-op for a missing table.
    c.sql(0, "ALTER TABLE IF EXISTS nope RENAME TO other");
    c.sql(0, "ALTER TABLE old_clicks RENAME TO archived");
    let created = one(c.sql(0, "SHOW CREATE TABLE archived"));
    assert!(created.join(",").contains("CREATE TABLE archived (id BIGINT)"), "{created:?}");
    // The catalog is durable: a restarted node has the names, each with its own rows.
    c.procs[1].kill9();
    c.restart(1);
    assert_eq!(c.sql(1, "SHOW TABLES"), vec![vec!["archived".to_string()], vec!["clicks".to_string()]]);
    assert_eq!(one(c.sql(1, "SELECT count(*) FROM archived")), vec!["160".to_string()]);
    assert_eq!(one(c.sql(1, "SELECT count(*) FROM clicks")), vec!["3".to_string()]);
    // ClickHouse's swap in one step.
    c.sql(1, "EXCHANGE TABLES clicks AND archived");
    assert_eq!(one(c.sql(0, "SELECT count(*) FROM clicks")), vec!["160".to_string()]);
    assert_eq!(one(c.sql(0, "SELECT count(*) FROM archived")), vec!["3".to_string()]);
    assert!(c.sql_err(0, "EXCHANGE TABLES clicks AND nope").contains("unknown table \"nope\""));
    assert!(c.sql_err(0, "EXCHANGE TABLES clicks").contains("expected EXCHANGE TABLES a AND b"));

    // Inserts racing renames: each finds the table under its name or fails whole, and every row
    // acknowledged is there once.
    c.sql(
        0,
        "CREATE TABLE raced (id BIGINT) WITH (shard_key = 'id', replicas = 2, \
         sync_mode = 'delay_mode_distributed', delay_max_ms = 100)",
    );
    let addr = c.addrs[1].clone();
    let writer = std::thread::spawn(move || {
        let (mut acked, mut errors) = (0u64, Vec::new());
        for i in 0..60 {
            let sql = format!("INSERT INTO raced SELECT value FROM generate_series({}, {})", i * 100, i * 100 + 99);
            match sql_csv(&addr, &sql) {
                Ok(_) => acked += 100,
                Err(e) => errors.push(e),
            }
        }
        (acked, errors)
    });
    for _ in 0..10 {
        c.sql(0, "RENAME TABLE raced TO raced_away");
        std::thread::sleep(Duration::from_millis(30));
        c.sql(0, "RENAME TABLE raced_away TO raced");
        std::thread::sleep(Duration::from_millis(30));
    }
    let (acked, errors) = writer.join().expect("the writer");
    // Planned while the table was away, or gone between planning and storing.
    let missing =
        |e: &String| e.contains("table 'shardwise.public.raced' not found") || e.contains("unknown table \"raced\"");
    assert!(acked > 0 && errors.iter().all(missing), "{acked} {errors:?}");
    c.sql(0, "SYSTEM FLUSH DISTRIBUTED raced");
    c.sql(1, "SYSTEM FLUSH DISTRIBUTED raced");
    for rank in 0..2 {
        assert_eq!(one(c.sql(rank, "SELECT count(*), count(DISTINCT id) FROM raced")), vec![acked.to_string(); 2]);
    }
}

#[test]
fn optimize_table_writes_and_merges_every_replica() {
    let mut c = Cluster::start(3);
    c.sql(0, "CREATE TABLE m (id BIGINT, v DOUBLE) WITH (shard_key = 'id', replicas = 2)");
    let parts = "SELECT count(*), min(parts), max(parts), sum(rows) FROM system.shards WHERE \"table\" = 'm'";
    // Rows stay in the replicas' memory buffers (and WALs) until a million arrive.
    c.sql(1, "INSERT INTO m SELECT value, value * 2 FROM generate_series(1, 300)");
    assert_eq!(one(c.sql(0, parts)), vec!["6", "0", "0", "600"]);
    c.sql(2, "OPTIMIZE TABLE m");
    assert_eq!(one(c.sql(0, parts)), vec!["6", "1", "1", "600"], "each buffer written as a part");
    // A second part on every replica, merged with the first by the next OPTIMIZE.
    for rank in 0..3 {
        let (from, to) = (1000 + rank * 100, 1099 + rank * 100);
        c.sql(rank, &format!("INSERT INTO m SELECT value, value * 2 FROM generate_series({from}, {to})"));
    }
    c.sql(0, "OPTIMIZE TABLE m");
    assert_eq!(one(c.sql(0, parts)), vec!["6", "1", "1", "1200"]);
    c.sql(1, "INSERT INTO m SELECT value, value * 2 FROM generate_series(2000, 2099)");
    c.sql(1, "OPTIMIZE TABLE m FINAL SETTINGS optimize_timeout_ms = 60000");
    assert_eq!(one(c.sql(2, parts)), vec!["6", "1", "1", "1400"]);
    let answer = "SELECT count(*), count(DISTINCT id), CAST(sum(v) AS BIGINT) FROM m";
    let expected = vec!["700".to_string(), "700".to_string(), "1189900".to_string()];
    assert_eq!(one(c.sql(2, answer)), expected);
    // The parts are what a restart reads: nothing lost, nothing doubled.
    c.procs[1].kill9();
    c.restart(1);
    assert_eq!(one(c.sql(1, parts)), vec!["6", "1", "1", "1400"]);
    assert_eq!(one(c.sql(1, answer)), expected);
    let cases = [
        ("OPTIMIZE TABLE nope", "unknown table \"nope\""),
        ("OPTIMIZE TABLE m PARTITION 1", "no partitions"),
        ("OPTIMIZE TABLE m FINAL DEDUPLICATE", "not deduplicated by value"),
        ("OPTIMIZE m WHERE id > 1", "arrival order"),
    ];
    for (sql, needle) in cases {
        let err = c.sql_err(0, sql);
        assert!(err.contains(needle), "{sql}: {err:?} lacks {needle:?}");
    }
    // A node that cannot be reached is named; the others' replicas are optimized all the same.
    c.sql(0, "INSERT INTO m SELECT value, value * 2 FROM generate_series(3000, 3099)");
    c.procs[2].kill9();
    let err = c.sql_err(0, "OPTIMIZE TABLE m");
    assert!(err.contains("replicas on rank 2 were not optimized") && err.contains("running it again"), "{err}");
    let reachable = "SELECT min(parts), max(parts) FROM system.shards WHERE \"table\" = 'm' AND rank < 2";
    assert_eq!(one(c.sql(0, reachable)), vec!["1", "1"]);
    c.restart(2);
    c.sql(0, "OPTIMIZE TABLE m");
    assert_eq!(one(c.sql(2, parts)), vec!["6", "1", "1", "1600"]);
}

#[test]
fn optimize_racing_drop_fails_clearly_and_leaves_nothing_behind() {
    let c = Cluster::start(2);
    for round in 0..3 {
        c.sql(0, "CREATE TABLE od (id BIGINT, v DOUBLE) WITH (shard_key = 'id', replicas = 2)");
        c.sql(0, "INSERT INTO od SELECT value, 1.0 FROM generate_series(1, 300000)");
        let addr = c.addrs[1].clone();
        let optimize = std::thread::spawn(move || sql_csv(&addr, "OPTIMIZE TABLE od FINAL"));
        std::thread::sleep(Duration::from_millis(5 * round));
        c.sql(0, "DROP TABLE od");
        match optimize.join().expect("the OPTIMIZE thread") {
            Ok(_) => {}
            // Dropped under it, or before it found the table (the thread may start late).
            Err(e) => assert!(
                (e.contains("dropped") || e.contains("unknown table \"od\"")) && !e.contains("os error"),
                "round {round}: {e}"
            ),
        }
        // The dropped table's directories go once the merge under way has finished.
        for rank in 0..2 {
            let tables = c.data_dir(rank).join("tables");
            eventually(Duration::from_secs(10), "the dropped table's directories removed", || {
                let left = std::fs::read_dir(&tables).ok()?.count();
                (left == 0).then_some(())
            });
        }
    }
    c.sql(1, "CREATE TABLE od (id BIGINT) WITH (shard_key = 'id', replicas = 2)");
    c.sql(1, "INSERT INTO od VALUES (1), (2)");
    assert_eq!(one(c.sql(0, "SELECT count(*) FROM od")), vec!["2"]);
}

#[test]
fn a_nan_from_arithmetic_is_stored_as_the_one_nan() {
    let c = Cluster::start(2);
    c.sql(0, "CREATE TABLE f (id BIGINT, x DOUBLE) WITH (shard_key = 'x')");
    // x86 arithmetic sets the sign bit of these NaNs; stored, they are 'NaN' like the third.
    c.sql(
        1,
        "INSERT INTO f VALUES (1, 1.0), (2, CAST('Infinity' AS DOUBLE) - CAST('Infinity' AS DOUBLE)), \
         (3, CAST('NaN' AS DOUBLE)), (4, -CAST('NaN' AS DOUBLE)), (5, 2.0)",
    );
    // -0.0 is kept, and is the same value as 0.0 to DISTINCT aggregates as to everything else.
    c.sql(0, "INSERT INTO f VALUES (6, CAST('-0' AS DOUBLE)), (7, CAST('0' AS DOUBLE))");
    let checks = [
        ("SELECT min(x), max(x) FROM f WHERE id <= 5", vec![vec!["1.0", "NaN"]]),
        ("SELECT count(DISTINCT x) FROM f", vec![vec!["4"]]),
        (
            "SELECT count(*), count(DISTINCT x), avg(DISTINCT x) FILTER (WHERE x < 5) FROM f",
            vec![vec!["7", "4", "1.0"]],
        ),
        ("SELECT count(*), count(DISTINCT x) FROM f WHERE x = 0", vec![vec!["2", "1"]]),
        ("SELECT count(*) FROM f WHERE x = CAST('NaN' AS DOUBLE)", vec![vec!["3"]]),
        (
            "SELECT x, count(*) FROM f WHERE id <= 5 GROUP BY x ORDER BY x",
            vec![vec!["1.0", "1"], vec!["2.0", "1"], vec!["NaN", "3"]],
        ),
        ("SELECT id FROM f ORDER BY x, id LIMIT 1", vec![vec!["6"]]),
    ];
    for (sql, want) in checks {
        for rank in 0..2 {
            assert_eq!(c.sql(rank, sql), want, "rank {rank}: {sql}");
        }
    }
}

#[test]
fn wide_rows_go_into_a_delayed_table_in_chunks_its_outbox_records_hold() {
    // Two replicas of 4 rows of 10 MB: 80 MB, more than one outbox WAL record holds (64 MiB),
    // which failed the insert whatever was retried. The chunks are now cut by bytes too.
    let c = Cluster::start(2);
    c.sql(
        0,
        "CREATE TABLE wide (id BIGINT, s VARCHAR) WITH (shard_key = 'id', replicas = 2, \
         sync_mode = 'delay_mode_distributed')",
    );
    c.sql(1, "INSERT INTO wide SELECT value, repeat('x', 10000000) FROM generate_series(1, 4)");
    c.sql(1, "SYSTEM FLUSH DISTRIBUTED wide");
    for rank in 0..2 {
        assert_eq!(one(c.sql(rank, "SELECT count(*), sum(length(s)) FROM wide")), ["4", "40000000"]);
    }
    // One row larger than a chunk may be: refused before anything is written.
    let err = c.sql_err(0, "INSERT INTO wide SELECT 9, repeat('y', 30000000)");
    assert!(err.contains("a row of 30000012 bytes") && err.contains("before any of it was written"), "{err}");
    c.sql(0, "SYSTEM FLUSH DISTRIBUTED wide");
    assert_eq!(one(c.sql(0, "SELECT count(*) FROM wide")), ["4"]);
}

#[test]
fn a_foreground_insert_into_a_delayed_table_is_on_its_replicas_when_acknowledged() {
    let c = Cluster::start(2);
    c.sql(
        0,
        "CREATE TABLE fg (id BIGINT) WITH (shard_key = 'id', replicas = 2, sync_mode = 'delay_mode_distributed', \
         delay_max_ms = 600000)",
    );
    let stored = |c: &Cluster| one(c.sql(1, "SELECT coalesce(sum(rows), 0) FROM system.shards WHERE \"table\" = 'fg'"));
    // Queued in the outbox, shipped only after 10 minutes.
    c.sql(0, "INSERT INTO fg SELECT value FROM generate_series(1, 100)");
    assert_eq!(stored(&c), vec!["0".to_string()]);
    // Written to both replicas of every shard before the acknowledgement.
    c.sql(0, "INSERT INTO fg SELECT value FROM generate_series(101, 150) SETTINGS distributed_foreground_insert = 1");
    assert_eq!(stored(&c), vec!["100".to_string()]);
    // ClickHouse's older name, for the rest of the connection.
    c.sql(1, "SET insert_distributed_sync = 1; INSERT INTO fg SELECT value FROM generate_series(151, 180)");
    assert_eq!(stored(&c), vec!["160".to_string()]);
    c.sql(1, "SYSTEM FLUSH DISTRIBUTED fg");
    assert_eq!(stored(&c), vec!["360".to_string()]);
    assert_eq!(
        one(c.sql(0, "SELECT count(*), count(DISTINCT id) FROM fg")),
        vec!["180".to_string(), "180".to_string()]
    );
    let err = c.sql_err(0, "INSERT INTO fg VALUES (1) SETTINGS insert_distributed_sync = maybe");
    assert!(err.contains("insert_distributed_sync = maybe"), "{err}");
}

#[test]
fn show_create_table_gives_the_statement_that_makes_the_same_table() {
    let c = Cluster::start(2);
    c.sql(
        0,
        "CREATE TABLE \"Events\" (id BIGINT, \"order\" INT, \"Kind\" VARCHAR, small TINYINT, tiny TINYINT UNSIGNED, \
         s16 SMALLINT, u16 SMALLINT UNSIGNED, u32 INT UNSIGNED, u64 BIGINT UNSIGNED, r REAL, d DOUBLE, \
         amount DECIMAL(12, 2), ok BOOLEAN, day DATE, at TIMESTAMP, at_ms TIMESTAMP(3), at_us TIMESTAMP(6), \
         at_s TIMESTAMP(0), at_tz TIMESTAMP WITH TIME ZONE) WITH (shard_key = 'id,Kind', shards = 3, replicas = 2, \
         sync_mode = 'delay_mode_distributed', delay_max_ms = 250, delay_max_rows = 5000, delay_max_bytes = 100000)",
    );
    let shown = |rank: usize| {
        let rows = c.sql(rank, "SHOW CREATE TABLE \"Events\"");
        assert_eq!(rows.len(), 1, "{rows:?}");
        // One CSV field holding commas and doubled quotes.
        let field = rows[0].join(",");
        field.trim_matches('"').replace("\"\"", "\"")
    };
    let statement = shown(1);
    assert!(
        statement.starts_with("CREATE TABLE \"Events\" (id BIGINT, \"order\" INT, \"Kind\" VARCHAR"),
        "{statement}"
    );
    let describe = c.sql(0, "DESCRIBE \"Events\"");
    let settings = "SELECT shard_key, shards, replicas, sync_mode, delay_max_ms, delay_max_rows, delay_max_bytes \
                    FROM system.tables WHERE name = 'Events'";
    let options = c.sql(0, settings);
    c.sql(0, "DROP TABLE \"Events\"");
    c.sql(1, &statement);
    assert_eq!(c.sql(0, "DESCRIBE \"Events\""), describe);
    assert_eq!(c.sql(0, settings), options);
    assert_eq!(shown(0), statement);
    assert!(c.sql_err(0, "SHOW CREATE TABLE nope").contains("unknown table nope"));
    // Unquoted names are lowercased, as queries resolve them: the table is `sales`, and the
    // shard key given in another case names the lowercased column.
    c.sql(0, "CREATE TABLE Sales (Id BIGINT, Amount DOUBLE) WITH (shard_key = 'Id')");
    c.sql(1, "INSERT INTO SALES VALUES (1, 2.5)");
    c.sql(0, "SYSTEM FLUSH DISTRIBUTED Sales");
    assert_eq!(c.sql(1, "SELECT count(*) FROM sales"), vec![vec!["1"]]);
    assert_eq!(c.sql(0, "SELECT name, shard_key FROM system.tables WHERE name = 'sales'"), vec![vec!["sales", "id"]]);
    c.sql(0, "TRUNCATE TABLE SaLeS");
    c.sql(0, "DROP TABLE SALES");
    assert!(c.sql(0, "SHOW TABLES").concat().iter().all(|t| t != "sales"));
}

/// A time with finer digits than its column keeps its instant's start on every path: a
/// TIMESTAMP value, INSERT ... SELECT and text alike (a TIMESTAMP before 1970 moved forward, to
/// 1970-01-01 00:00:00, on the typed paths).
#[test]
fn finer_times_keep_their_instants_start_on_every_insert_path() {
    let c = Cluster::start(2);
    c.sql(0, "CREATE TABLE tp (id BIGINT, t0 TIMESTAMP(0), t3 TIMESTAMP(3)) WITH (shard_key = 'id')");
    c.sql(0, "CREATE TABLE src (id BIGINT, t TIMESTAMP) WITH (shard_key = 'id')");
    c.sql(1, "INSERT INTO src VALUES (3, TIMESTAMP '1969-12-31 23:59:59.5')");
    c.sql(
        1,
        "INSERT INTO tp VALUES (1, '1969-12-31 23:59:59.5', '1969-12-31 23:59:59.9999'), \
         (2, TIMESTAMP '1969-12-31 23:59:59.5', TIMESTAMP '1969-12-31 23:59:59.9999')",
    );
    c.sql(0, "INSERT INTO tp SELECT id, t, t FROM src");
    assert_eq!(
        c.sql(0, "SELECT id, t0, t3 FROM tp ORDER BY id"),
        [
            ["1", "1969-12-31T23:59:59", "1969-12-31T23:59:59.999"],
            ["2", "1969-12-31T23:59:59", "1969-12-31T23:59:59.999"],
            ["3", "1969-12-31T23:59:59", "1969-12-31T23:59:59.500"],
        ]
    );
}

#[test]
fn a_down_node_queue_grows_then_drains() {
    let mut c = Cluster::start(3);
    c.sql(
        0,
        "CREATE TABLE q (id BIGINT) WITH (shard_key = 'id', replicas = 2, sync_mode = 'delay_mode_distributed', \
              delay_max_ms = 50)",
    );
    c.procs[2].kill9();
    let start = std::time::Instant::now();
    let mut sent = 0i64;
    let mut seen_growth = Vec::new();
    // 30 s down, inserting all along through the two live nodes.
    while start.elapsed() < Duration::from_secs(30) {
        let r = (sent / 100 % 2) as usize;
        c.sql(r, &format!("INSERT INTO q SELECT value FROM generate_series({sent}, {})", sent + 99));
        sent += 100;
        let pending: i64 = c
            .sql(0, "SELECT coalesce(sum(pending_rows), 0), coalesce(max(retries), 0) FROM system.sync_queues WHERE destination = 2")
            .first()
            .and_then(|row| row.first())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        seen_growth.push(pending);
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(seen_growth.windows(2).filter(|w| w[1] > w[0]).count() > 10, "queue did not grow: {seen_growth:?}");
    let queue = c.sql(0, "SELECT destination, retries, last_error FROM system.sync_queues WHERE destination = 2");
    assert!(!queue.is_empty(), "no queue for the down node");
    assert!(queue.iter().any(|row| row[1] != "0" && !row[2].is_empty()), "no retries or last error shown: {queue:?}");
    // DDL while rank 2 is down reaches it when it restarts.
    c.sql(1, "CREATE TABLE created_while_down (k BIGINT) WITH (shard_key = 'k')");
    c.restart(2);
    assert_eq!(c.sql(2, "SHOW TABLES"), vec![vec!["created_while_down".to_string()], vec!["q".to_string()]]);
    c.sql(2, "INSERT INTO created_while_down VALUES (1), (2), (3)");
    c.sql(0, "SYSTEM FLUSH DISTRIBUTED q");
    assert!(c.sql(0, "SELECT * FROM system.sync_queues").is_empty(), "queues did not drain");
    assert_eq!(one(c.sql(2, "SELECT count(*), count(DISTINCT id) FROM q")), vec![sent.to_string(), sent.to_string()]);
    let shards = c.sql(1, "SELECT shard, min(rows), max(rows) FROM system.shards WHERE \"table\" = 'q' GROUP BY shard");
    for s in &shards {
        assert_eq!(s[1], s[2], "replicas differ after catching up: {s:?}");
    }
}

#[test]
fn crash_soak_with_five_kills_loses_and_doubles_nothing() {
    let mut cmd = shardwise();
    cmd.args(["bench", "crash", "--kills", "5", "--kill-interval-ms", "800", "--max-down-ms", "500"]);
    let out = run_with_timeout(cmd, Duration::from_secs(240));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "crash soak failed:\n{stdout}\n{stderr}");
    let summary: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or("")).expect("summary line");
    assert_eq!(summary["violations"], 0, "{summary}");
    assert_eq!(summary["kills"], 5, "{summary}");
    assert!(summary["acked_rows"].as_u64().unwrap_or(0) > 0, "nothing was written: {summary}");
}

#[test]
fn immediate_quorum_and_hinted_handoff() {
    let mut c = Cluster::start(3);
    c.sql(0, "CREATE TABLE im (id BIGINT) WITH (shard_key = 'id', replicas = 2)");
    c.procs[2].kill9();
    // Every shard but one has a replica on rank 2: with the default quorum (all replicas) the
    // insert fails, says what is short, and gives the insert id to retry with.
    let err = c.sql_err(0, "INSERT INTO im SELECT value FROM generate_series(1, 300) SETTINGS insert_id = 'q-1'");
    assert!(err.contains("unavailable") && err.contains("quorum 2") && err.contains("q-1"), "{err}");
    // With insert_quorum = 1 the same insert (same id) completes exactly once; rank 2's pieces wait
    // in rank 0's queue.
    c.sql(0, "INSERT INTO im SELECT value FROM generate_series(1, 300) SETTINGS insert_id = 'q-1', insert_quorum = 1");
    assert_eq!(
        one(c.sql(1, "SELECT count(*), count(DISTINCT id) FROM im")),
        vec!["300".to_string(), "300".to_string()]
    );
    // Rank 2's own queues are not known while it is down: one row says so (NULL figures).
    // (Down, or not answering if the membership has not marked it down yet.)
    let queued = c.sql(
        0,
        "SELECT rank, destination, pending_rows > 0, problem LIKE 'rank 2 %so its queues are unknown%' \
         FROM system.sync_queues",
    );
    let expected = [["0", "2", "true", ""], ["2", "", "", "true"]];
    assert_eq!(queued, expected.map(|r| r.map(String::from).to_vec()).to_vec(), "hinted handoff queue");
    c.restart(2);
    c.sql(1, "SYSTEM FLUSH DISTRIBUTED im");
    assert!(c.sql(0, "SELECT * FROM system.sync_queues").is_empty());
    for s in c.sql(2, "SELECT shard, min(rows), max(rows) FROM system.shards GROUP BY shard") {
        assert_eq!(s[1], s[2], "replicas differ after the handoff: {s:?}");
    }
    assert_eq!(one(c.sql(2, "SELECT count(*), sum(id) FROM im")), vec!["300".to_string(), "45150".to_string()]);
}

#[test]
fn a_failed_insert_of_many_chunks_leaves_no_replica_behind() {
    let mut c = Cluster::start(3);
    c.sql(0, "CREATE TABLE mc (id BIGINT) WITH (shard_key = 'id', replicas = 2)");
    // Three chunks of up to 262 144 rows, two written at a time; rank 2 dies just before, so the
    // membership still counts it: chunk 0 fails, chunk 1 is already writing beside it.
    c.procs[2].kill9();
    let insert = "INSERT INTO mc SELECT value FROM generate_series(1, 600000) SETTINGS insert_id = 'mc-1'";
    let err = c.sql_err(1, insert);
    assert!(err.contains("chunk 0 failed") && err.contains("mc-1"), "{err}");
    c.restart(2);
    for rank in 0..3 {
        c.sql(rank, "SYSTEM FLUSH DISTRIBUTED mc");
    }
    // Whatever was stored is on every replica of its shard: a read does not depend on the node.
    let replicas = "SELECT shard, min(rows), max(rows) FROM system.shards WHERE \"table\" = 'mc' GROUP BY shard";
    for s in c.sql(0, replicas) {
        assert_eq!(s[1], s[2], "replicas differ after a failed insert: {s:?}");
    }
    let counts: Vec<Vec<String>> = (0..3).map(|rank| one(c.sql(rank, "SELECT count(*) FROM mc"))).collect();
    assert!(counts.iter().all(|n| *n == counts[0]), "{counts:?}");
    // The retry with the same id completes it exactly once.
    c.sql(0, insert);
    for rank in 0..3 {
        assert_eq!(one(c.sql(rank, "SELECT count(*), count(DISTINCT id) FROM mc")), vec!["600000", "600000"]);
    }
}

#[test]
fn a_full_outbox_makes_inserts_wait_then_fail_clearly() {
    let dir = tempdir();
    let port = free_port();
    let mut procs: Vec<Proc> = (0..2)
        .map(|r| {
            let mut cmd = node_cmd(r, 2, port, &rank_dir(dir.path(), r));
            cmd.args(["--outbox-max-bytes", "200000", "--outbox-full-wait-ms", "500"]);
            Proc::spawn(cmd)
        })
        .collect();
    let addrs: Vec<String> =
        procs.iter_mut().map(|p| flight_addr(&p.wait_for_line("listening rank=", Duration::from_secs(30)))).collect();
    sql_csv(
        &addrs[0],
        "CREATE TABLE f (id BIGINT, pad VARCHAR) WITH (shard_key = 'id', replicas = 2, \
                        sync_mode = 'delay_mode_distributed')",
    )
    .unwrap();
    // With every node up, delay settings far larger than the outbox do not make inserts wait:
    // past half of outbox_max_bytes the senders ship whatever the settings say.
    sql_csv(
        &addrs[0],
        "CREATE TABLE slow (id BIGINT, pad VARCHAR) WITH (shard_key = 'id', replicas = 2, \
         sync_mode = 'delay_mode_distributed', delay_max_ms = 3600000, delay_max_rows = 100000000, \
         delay_max_bytes = 1000000000)",
    )
    .unwrap();
    for i in 0..30 {
        let sql = format!(
            "INSERT INTO slow SELECT value, repeat('x', 100) FROM generate_series({}, {})",
            i * 200,
            i * 200 + 199
        );
        sql_csv(&addrs[0], &sql).unwrap_or_else(|e| panic!("insert {i} into slow: {e}"));
    }
    procs[1].kill9();
    let mut accepted = 0;
    let err = loop {
        let sql = format!(
            "INSERT INTO f SELECT value, repeat('x', 100) FROM generate_series({}, {})",
            accepted * 200,
            accepted * 200 + 199
        );
        match sql_csv(&addrs[0], &sql) {
            Ok(_) => accepted += 1,
            Err(e) => break e,
        }
        assert!(accepted < 100, "the outbox never filled");
    };
    assert!(accepted > 0, "{err}");
    assert!(
        err.contains("is full") && err.contains("outbox_max_bytes") && err.contains("outbox_full_wait_ms"),
        "{err}"
    );
    assert!(err.contains("pending for: rank 1 "), "the error names the destination that holds the rows: {err}");
    assert!(err.contains("nothing of the insert was stored") && !err.contains("may already be stored"), "{err}");
    // Nothing of the refused insert was kept: only the accepted ones are queued.
    let queued =
        sql_csv(&addrs[0], "SELECT sum(pending_rows) FROM system.sync_queues WHERE destination = 1 AND table = 'f'")
            .unwrap();
    assert_eq!(queued, vec![vec![(accepted * 200).to_string()]]);
    // The node says so on /health: degraded, naming the destination that holds the rows.
    let http = sql_csv(&addrs[0], "SELECT http_addr FROM system.nodes WHERE rank = 0").unwrap().remove(0).remove(0);
    let reply = health(&http);
    assert!(reply.starts_with("HTTP/1.1 200") && reply.contains("\"status\":\"degraded\""), "{reply}");
    assert!(reply.contains("--outbox-max-bytes") && reply.contains("rank 1 "), "{reply}");
}

/// A statement sent to any node after a TRUNCATE returned sees the new generation: an INSERT
/// through another node right after it was acknowledged into the old generation, then thrown
/// away with it (the master answered DDL once the change was sent, not once the nodes had it).
#[test]
fn an_insert_through_another_node_after_truncate_returned_is_kept() {
    use arrow_flight::sql::client::FlightSqlServiceClient;
    use futures::TryStreamExt;
    use tonic::transport::{Channel, Endpoint};

    async fn connect(addr: &str) -> FlightSqlServiceClient<Channel> {
        let channel = Endpoint::from_shared(format!("http://{addr}")).expect("uri").connect().await.expect("connect");
        FlightSqlServiceClient::new(channel)
    }
    async fn run(client: &mut FlightSqlServiceClient<Channel>, sql: &str) -> Vec<Vec<String>> {
        let info = client.execute(sql.to_string(), None).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
        let mut rows = Vec::new();
        for endpoint in info.endpoint {
            let ticket = endpoint.ticket.expect("ticket");
            let batches: Vec<arrow::array::RecordBatch> =
                client.do_get(ticket).await.expect("do_get").try_collect().await.expect("rows");
            for batch in batches {
                for row in 0..batch.num_rows() {
                    rows.push(
                        batch
                            .columns()
                            .iter()
                            .map(|c| arrow::util::display::array_value_to_string(c, row).expect("text"))
                            .collect(),
                    );
                }
            }
        }
        rows
    }

    let c = Cluster::start(3);
    c.sql(
        0,
        "CREATE TABLE trd (id BIGINT) WITH (shard_key = 'id', replicas = 2, sync_mode = 'delay_mode_distributed', \
         delay_max_ms = 50)",
    );
    c.sql(0, "CREATE TABLE tri (id BIGINT) WITH (shard_key = 'id', replicas = 2)");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let (mut master, mut worker, mut other) =
            (connect(&c.addrs[0]).await, connect(&c.addrs[2]).await, connect(&c.addrs[1]).await);
        for table in ["trd", "tri"] {
            for i in 0..30 {
                // TRUNCATE through the master or through a worker, the INSERT through another node.
                let truncating = if i % 2 == 0 { &mut master } else { &mut other };
                run(truncating, &format!("TRUNCATE TABLE {table}")).await;
                run(&mut worker, &format!("INSERT INTO {table} VALUES ({i})")).await;
                run(&mut master, &format!("SYSTEM FLUSH DISTRIBUTED {table}")).await;
                let rows = run(&mut master, &format!("SELECT id FROM {table}")).await;
                assert_eq!(rows, [[i.to_string()]], "{table}, iteration {i}: the acknowledged insert is gone");
            }
        }
    });
}

/// A replica whose WAL is found damaged when its node restarts misses rows it acknowledged: it
/// is not read (each query reads another replica), and `system.shards` says why. It was served
/// as the whole shard: counts short by the rows after the damage, through every node that chose it.
#[test]
fn a_replica_with_a_damaged_wal_is_not_read() {
    fn wal_segments(dir: &std::path::Path, found: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                wal_segments(&path, found);
            } else if path.parent().is_some_and(|p| p.ends_with("wal")) && path.extension().is_some_and(|e| e == "log")
            {
                found.push(path);
            }
        }
    }
    let mut c = Cluster::start(3);
    c.sql(0, "CREATE TABLE dmg (id BIGINT) WITH (shard_key = 'id', replicas = 2)");
    for i in 0..20 {
        c.sql(i % 3, &format!("INSERT INTO dmg SELECT value FROM generate_series({}, {})", i * 50, i * 50 + 49));
    }
    let want = vec!["1000".to_string(), (0..1000).sum::<i64>().to_string()];
    assert_eq!(one(c.sql(2, "SELECT count(*), sum(id) FROM dmg")), want);
    c.procs[2].kill9();
    let mut segments = Vec::new();
    wal_segments(&c.data_dir(2).join("tables"), &mut segments);
    assert!(!segments.is_empty(), "rank 2 holds WAL segments");
    for segment in &segments {
        // A bit of the first record: everything after it in the log is lost to recovery.
        let mut bytes = std::fs::read(segment).expect("read segment");
        if bytes.len() > 200 {
            bytes[100] ^= 0x10;
            std::fs::write(segment, &bytes).expect("write segment");
        }
    }
    c.restart(2);
    for rank in 0..3 {
        assert_eq!(one(c.sql(rank, "SELECT count(*), sum(id) FROM dmg")), want, "through rank {rank}");
    }
    let problems = c.sql(
        0,
        "SELECT rank, substr(problem, 1, 34) FROM system.shards WHERE \"table\" = 'dmg' AND problem IS NOT NULL",
    );
    assert!(!problems.is_empty(), "system.shards names the damaged replicas");
    for row in &problems {
        assert_eq!(row[0], "2", "{problems:?}");
        assert_eq!(row[1], "damaged: its WAL was found damaged", "{problems:?}");
    }
    // The node says so on /health too (200: its other replicas and queries are served).
    let http = one(c.sql(0, "SELECT http_addr FROM system.nodes WHERE rank = 2")).remove(0);
    let reply = health(&http);
    assert!(reply.starts_with("HTTP/1.1 200") && reply.contains("\"status\":\"degraded\""), "{reply}");
    assert!(reply.contains("table dmg shard"), "{reply}");

    // Records removed from a WAL while its node was stopped cleanly, at a record's boundary or
    // not, would look like the end of the log (or a crash's torn tail): the node's clean stop
    // recorded where each log ended, so the cut is found and the replica kept out of reads.
    // (Before, rank 1 opened its replicas short and served them.) A clean stop and start with
    // nothing removed finds nothing.
    c.sql(0, "CREATE TABLE cut (id BIGINT) WITH (shard_key = 'id', replicas = 2)");
    for i in 0..20 {
        c.sql(i % 2, &format!("INSERT INTO cut SELECT value FROM generate_series({}, {})", i * 50, i * 50 + 49));
    }
    let ids = one(c.sql(0, "SELECT id, generation FROM system.tables WHERE name = 'cut'"));
    let cut_dir = c.data_dir(1).join("tables").join(format!("t{}-g{}", ids[0], ids[1]));
    let problems_of_cut =
        "SELECT rank, substr(problem, 1, 34) FROM system.shards WHERE \"table\" = 'cut' AND problem IS NOT NULL";
    for tamper in [false, true] {
        c.procs[1].signal("TERM");
        let (code, out) = c.procs[1].wait_exit(Duration::from_secs(30));
        assert_eq!(code, Some(0), "{out}");
        let mut segments = Vec::new();
        wal_segments(&cut_dir, &mut segments);
        assert!(!segments.is_empty(), "rank 1 holds WAL segments of cut");
        if tamper {
            for segment in &segments {
                let len = std::fs::metadata(segment).expect("segment").len();
                let file = std::fs::OpenOptions::new().write(true).open(segment).expect("open segment");
                file.set_len(len / 2).expect("cut the segment");
            }
        }
        c.restart(1);
        for rank in 0..3 {
            assert_eq!(one(c.sql(rank, "SELECT count(*), sum(id) FROM cut")), want, "through rank {rank}");
        }
        let problems = eventually(Duration::from_secs(10), "rank 1's replicas opened", || {
            let opened = "SELECT count(*) FROM system.shards WHERE \"table\" = 'cut' AND rank = 1 \
                          AND (rows IS NOT NULL OR problem IS NOT NULL)";
            (one(c.sql(0, opened))[0] == "2").then(|| c.sql(0, problems_of_cut))
        });
        if tamper {
            assert_eq!(problems.len(), 2, "both of rank 1's replicas: {problems:?}");
            for row in &problems {
                assert_eq!(row, &["1", "damaged: its WAL was found damaged"], "{problems:?}");
            }
        } else {
            assert!(problems.is_empty(), "a clean stop and start: {problems:?}");
        }
    }
}

#[test]
fn a_broken_replica_holds_back_only_its_own_tables_delayed_rows() {
    // Rank 1's replicas of two tables cannot be opened (their MANIFESTs are garbage): the delayed
    // rows of those tables wait for them, each with its own error; those of another table in the
    // same shipments go in.
    let mut c = Cluster::start(2);
    let options = "WITH (shard_key = 'id', shards = 1, replicas = 2, sync_mode = 'delay_mode_distributed')";
    let tables = ["broken", "other", "fine"];
    for table in tables {
        c.sql(0, &format!("CREATE TABLE {table} (id BIGINT) {options}"));
        c.sql(0, &format!("INSERT INTO {table} SELECT value FROM generate_series(1, 100)"));
        c.sql(0, &format!("OPTIMIZE TABLE {table}"));
    }
    let manifest = |c: &Cluster, table: &str| {
        let row = one(c.sql(0, &format!("SELECT id, generation FROM system.tables WHERE name = '{table}'")));
        c.data_dir(1).join(format!("tables/t{}-g{}/shard-0/MANIFEST", row[0], row[1]))
    };
    let damaged = [manifest(&c, "broken"), manifest(&c, "other")];
    c.procs[1].kill9();
    let kept: Vec<Vec<u8>> =
        damaged.iter().map(|m| std::fs::read(m).expect("rank 1's replica has a MANIFEST")).collect();
    for m in &damaged {
        std::fs::write(m, b"not a manifest").expect("damage it");
    }
    c.restart(1);
    // Interleaved inserts through rank 0: each shipment to rank 1 holds items of every table.
    for i in 1..=5 {
        for table in tables {
            c.sql(
                0,
                &format!("INSERT INTO {table} SELECT value FROM generate_series({}, {})", i * 100 + 1, i * 100 + 100),
            );
        }
    }
    c.sql(0, "SYSTEM FLUSH DISTRIBUTED fine SETTINGS flush_timeout_ms = 20000");
    for table in ["broken", "other"] {
        let err = c.sql_err(0, &format!("SYSTEM FLUSH DISTRIBUTED {table} SETTINGS flush_timeout_ms = 2000"));
        assert!(err.contains("rank 1") && err.contains(&format!("table {table} shard 0")), "{err}");
        let sql = format!("SELECT last_error FROM system.sync_queues WHERE \"table\" = '{table}' AND destination = 1");
        let errors = c.sql(0, &sql);
        assert!(
            !errors.is_empty() && errors.iter().flatten().all(|e| e.contains(&format!("table {table} shard 0"))),
            "{errors:?}"
        );
        // With how long ago it was: the sender retries the held rows every few seconds at most.
        let sql = format!(
            "SELECT count(*) FROM system.sync_queues WHERE \"table\" = '{table}' AND destination = 1 \
             AND last_error_age_ms BETWEEN 0 AND 60000"
        );
        assert_eq!(c.sql(0, &sql), [[errors.len().to_string()]]);
    }
    // system.shards and /health name the replicas that cannot be opened, and only them.
    let shards =
        c.sql(0, "SELECT \"table\", rows, substr(problem, 1, 17) FROM system.shards WHERE rank = 1 ORDER BY 1");
    let want = [["broken", "", "cannot be opened:"], ["fine", "600", ""], ["other", "", "cannot be opened:"]];
    assert_eq!(shards, want.map(|r| r.map(String::from).to_vec()).to_vec());
    let http = one(c.sql(0, "SELECT http_addr FROM system.nodes WHERE rank = 1")).remove(0);
    let reply = health(&http);
    assert!(reply.starts_with("HTTP/1.1 503") && reply.contains("table broken shard 0: cannot be opened"), "{reply}");
    // Repaired: the held rows go in, once.
    c.procs[1].kill9();
    for (m, bytes) in damaged.iter().zip(kept) {
        std::fs::write(m, bytes).expect("repair");
    }
    c.restart(1);
    c.sql(0, "SYSTEM FLUSH DISTRIBUTED broken SETTINGS flush_timeout_ms = 30000");
    c.sql(0, "SYSTEM FLUSH DISTRIBUTED other SETTINGS flush_timeout_ms = 30000");
    // Each node reads its own replica first (`load_balancing = 'nearest'`), and each holds all.
    for rank in 0..2 {
        for table in tables {
            let sql = format!("SELECT count(*), count(DISTINCT id), sum(id) FROM {table}");
            assert_eq!(one(c.sql(rank, &sql)), ["600", "600", "180300"], "{table} through rank {rank}");
        }
    }
    let rows = c.sql(1, "SELECT \"table\", rank, rows FROM system.shards ORDER BY \"table\", rank");
    let want = [
        ["broken", "0", "600"],
        ["broken", "1", "600"],
        ["fine", "0", "600"],
        ["fine", "1", "600"],
        ["other", "0", "600"],
        ["other", "1", "600"],
    ];
    assert_eq!(rows, want.map(|r| r.map(String::from).to_vec()).to_vec());
}

/// An `INSERT ... SELECT` is bound to the table it was planned against: while its `SELECT` runs,
/// the table dropped and created again under its name makes it fail (the new table gets
/// nothing), and the table renamed has it write under the new name. Before, the first wrote every
/// row into the new table and the second failed with `unknown table`.
#[test]
fn an_insert_select_keeps_to_its_table_through_drop_and_rename() {
    let cluster = Cluster::start(3);
    cluster.sql(0, "CREATE TABLE src (id BIGINT, v BIGINT) WITH (shard_key = 'id')");
    cluster.sql(0, "INSERT INTO src SELECT value, value FROM generate_series(1, 200000)");
    // A SELECT of 1.6 M rows: seconds on a debug build, time enough for the DDL beside it.
    let insert = |table: &str| {
        let mut c = shardwise();
        c.args(["sql", "--connect", &cluster.addrs[0], "--format", "csv", "-e"])
            .arg(format!("INSERT INTO {table} SELECT s.id * 100 + g.value, s.v FROM src s, generate_series(1, 8) g"));
        Proc::spawn(c)
    };
    let create =
        |table: &str| format!("CREATE TABLE {table} (id BIGINT, v BIGINT) WITH (shard_key = 'id', replicas = 2)");
    let still_running = |p: &mut Proc, what: &str| {
        assert!(
            p.child.try_wait().expect("try_wait").is_none(),
            "the INSERT ended before {what}: the test needs a slower SELECT"
        );
    };

    cluster.sql(0, &create("x"));
    let mut running = insert("x");
    std::thread::sleep(Duration::from_millis(500));
    cluster.sql(1, "DROP TABLE x");
    cluster.sql(1, &create("x"));
    still_running(&mut running, "the DROP and CREATE");
    let (code, out) = running.wait_exit(Duration::from_secs(120));
    assert_ne!(code, Some(0), "{out}");
    assert!(
        out.contains("table x was dropped, or dropped and created again, or truncated, while this insert ran"),
        "{out}"
    );
    for rank in 0..3 {
        assert_eq!(one(cluster.sql(rank, "SELECT count(*) FROM x")), ["0"], "rank {rank}: the new x got rows");
    }

    cluster.sql(0, &create("r"));
    let mut running = insert("r");
    std::thread::sleep(Duration::from_millis(500));
    cluster.sql(2, "RENAME TABLE r TO r2");
    still_running(&mut running, "the RENAME");
    let (code, out) = running.wait_exit(Duration::from_secs(120));
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(one(cluster.sql(1, "SELECT count(*), count(DISTINCT id) FROM r2")), ["1600000", "1600000"]);
}

/// Queries racing `TRUNCATE TABLE` see the table before or after it, or fail saying it was
/// truncated under them; never as a node that was unavailable (whose hint, to skip its shard,
/// would answer without rows) nor with a storage error about its removed files.
#[test]
fn queries_racing_truncate_fail_only_saying_so() {
    let cluster = Cluster::start(3);
    cluster.sql(0, "CREATE TABLE st (id BIGINT, v BIGINT) WITH (shard_key = 'id', replicas = 2)");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|rank| {
            let (addr, stop) = (cluster.addrs[rank].clone(), std::sync::Arc::clone(&stop));
            std::thread::spawn(move || {
                let (mut answered, mut failed) = (0, Vec::new());
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    match sql_csv(&addr, "SELECT v % 10, count(*) FROM st GROUP BY 1") {
                        Ok(_) => answered += 1,
                        Err(e) => failed.push(e),
                    }
                }
                (answered, failed)
            })
        })
        .collect();
    for round in 0..12 {
        cluster.sql(2, &format!("INSERT INTO st SELECT value, value FROM generate_series(1, {})", 1000 + round));
        cluster.sql(round % 3, "TRUNCATE TABLE st");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for reader in readers {
        let (answered, failed) = reader.join().expect("reader");
        eprintln!("a reader: {answered} answered, {} failed", failed.len());
        assert!(answered > 0, "no query answered: {failed:?}");
        for e in failed {
            // As the query ran, or (caught earlier) as it was planned.
            assert!(e.contains("was dropped or truncated while the query") && e.contains("run it again"), "{e}");
            assert!(!e.contains("skip_unavailable_shards"), "{e}");
        }
    }
}

/// A worker paused (SIGSTOP) past `down_after_ms` while its table is dropped and created again
/// takes inserts right after it resumes into the new table: it brings its catalog up to date
/// with the master's first. Before, such an insert was acknowledged into the dropped table and
/// its rows thrown away with it (3 times of 3, found by race testing).
#[test]
fn a_resumed_worker_inserts_into_the_table_as_it_is_now() {
    let mut c = Cluster::start(3);
    let create = "CREATE TABLE d (id BIGINT) WITH (shard_key = 'id', replicas = 2, \
                  sync_mode = 'delay_mode_distributed', delay_max_ms = 50)";
    c.sql(0, create);
    c.sql(1, "INSERT INTO d VALUES (1), (2)");
    c.procs[1].signal("STOP");
    eventually(Duration::from_secs(10), "paused rank 1 down", || {
        let rows = sql_csv(&c.addrs[0], "SELECT state FROM system.nodes WHERE rank = 1").ok()?;
        (rows.first()?.first()? == "down").then_some(())
    });
    c.sql(0, "DROP TABLE d");
    c.sql(0, create);
    c.procs[1].signal("CONT");
    c.sql(1, "INSERT INTO d SELECT value FROM generate_series(100, 149)");
    c.sql(1, "SYSTEM FLUSH DISTRIBUTED d");
    for rank in 0..3 {
        assert_eq!(one(c.sql(rank, "SELECT count(*), min(id) FROM d")), ["50", "100"], "rank {rank}");
    }
    c.procs[1].drain(Duration::from_millis(100));
}

/// A shard replica that failed on a write error (here: its directory replaced by a file, so its
/// flush cannot create a part; a full disk fails it the same way) takes writes again once the
/// disk works, without a restart: the node reopens it every `store_reopen_interval_ms` (10 s).
/// Before, it stayed failed until the node restarted, though space had been freed.
#[test]
fn a_failed_replica_is_reopened_once_its_disk_works() {
    let c = Cluster::start(2);
    c.sql(0, "CREATE TABLE ro (id BIGINT) WITH (shard_key = 'id', shards = 1)");
    c.sql(1, "INSERT INTO ro SELECT value FROM generate_series(1, 100)");
    let ids = one(c.sql(0, "SELECT id, generation FROM system.tables WHERE name = 'ro'"));
    let dir = c.data_dir(0).join("tables").join(format!("t{}-g{}", ids[0], ids[1])).join("shard-0");
    let moved = dir.with_file_name("shard-0.moved");
    std::fs::rename(&dir, &moved).expect("move the store away");
    std::fs::write(&dir, b"not a directory").expect("a file in its place");
    let err = c.sql_err(1, "OPTIMIZE TABLE ro");
    assert!(err.contains("rank 0"), "{err}");
    let problem = one(c.sql(0, "SELECT problem FROM system.shards WHERE \"table\" = 'ro'")).remove(0);
    assert!(problem.contains("it failed"), "{problem}");
    let refused = c.sql_err(1, "INSERT INTO ro VALUES (1000)");
    assert!(refused.contains("unavailable"), "{refused}");
    std::fs::remove_file(&dir).expect("remove the file");
    std::fs::rename(&moved, &dir).expect("move the store back");
    eventually(Duration::from_secs(30), "the replica takes writes again", || {
        sql_csv(&c.addrs[1], "INSERT INTO ro SELECT value FROM generate_series(101, 200)").ok()
    });
    assert_eq!(one(c.sql(1, "SELECT count(*), sum(id) FROM ro")), ["200", &(1..=200).sum::<i64>().to_string()]);
    assert_eq!(
        c.sql(0, "SELECT problem FROM system.shards WHERE \"table\" = 'ro' AND problem IS NOT NULL"),
        Vec::<Vec<String>>::new()
    );
    c.sql(1, "OPTIMIZE TABLE ro");
}
