//! The client protocols against real nodes, driven by the clients people use: `psql` and
//! psycopg over the PostgreSQL protocol, `curl` over HTTP, the status page in headless Chromium,
//! and configured users (made by `shardwise passwd`) on all of them. `scripts/test` installs the
//! clients when they are missing; a test names what is missing rather than passing without it.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use crate::support::*;

const T: Duration = Duration::from_secs(60);

/// A program the tests drive; fails the test, saying how to get it, when it is not installed.
fn tool(env: &str, default: &str, install: &str) -> Command {
    let program = std::env::var(env).unwrap_or_else(|_| default.to_string());
    let found = Command::new(&program).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status();
    assert!(found.is_ok_and(|s| s.success()), "{program} is not installed ({install}; or set {env})");
    Command::new(program)
}

fn psql(pg: &str, user: &str, database: &str) -> Command {
    let (host, port) = pg.rsplit_once(':').expect("host:port");
    let mut c = tool("SHARDWISE_TEST_PSQL", "psql", "scripts/test installs postgresql-client");
    c.args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-v", "VERBOSITY=verbose"])
        .arg(format!("host={host} port={port} user={user} dbname={database} connect_timeout=10"))
        .env_remove("PGPASSWORD");
    c
}

fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The venv `scripts/test` makes with psycopg, when it exists; else `python3`.
fn default_python() -> String {
    let venv = std::env::var("HOME").map(|h| format!("{h}/.cache/shardwise-venv/bin/python")).unwrap_or_default();
    if Path::new(&venv).exists() { venv } else { "python3".to_string() }
}

fn python() -> Command {
    let default = default_python();
    let mut c = tool("SHARDWISE_TEST_PYTHON", &default, "scripts/test makes a venv with psycopg");
    let probe = c.args(["-c", "import psycopg"]).output().expect("run python");
    assert!(
        probe.status.success(),
        "psycopg is not importable ({}): run scripts/test, which installs it, or set SHARDWISE_TEST_PYTHON",
        String::from_utf8_lossy(&probe.stderr)
    );
    tool("SHARDWISE_TEST_PYTHON", &default, "")
}

fn curl(args: &[&str]) -> (u16, String) {
    let mut c = tool("SHARDWISE_TEST_CURL", "curl", "apt-get install curl");
    c.args(["-s", "-S", "--max-time", "30", "-o", "-", "-w", "\n%{http_code}"]).args(args);
    let out = run_with_timeout(c, T);
    let (stdout, stderr) = text(&out);
    let (body, code) = stdout.rsplit_once('\n').unwrap_or_else(|| panic!("curl printed no status: {stderr}"));
    (code.trim().parse().unwrap_or_else(|_| panic!("status {code:?}: {stderr}")), body.to_string())
}

/// A two-node cluster; returns the nodes and their listening lines.
fn two_nodes(dir: &Path, config: Option<&Path>) -> (Vec<Proc>, Vec<String>) {
    let port = free_port();
    let mut nodes: Vec<Proc> = (0..2)
        .map(|rank| {
            let mut c = node_cmd(rank, 2, port, &rank_dir(dir, rank));
            if let Some(config) = config {
                c.arg("--config").arg(config);
            }
            Proc::spawn(c)
        })
        .collect();
    let lines = (0..2).map(|r| nodes[r].wait_for_line(&format!("listening rank={r}"), T)).collect();
    (nodes, lines)
}

#[test]
fn psql_and_psycopg_end_to_end() {
    let dir = tempdir();
    let (_nodes, lines) = two_nodes(dir.path(), None);
    let pg0 = listening_addr(&lines[0], "pg");
    let pg1 = listening_addr(&lines[1], "pg");

    // DDL and inserts through node 1, queries through node 0.
    let mut c = psql(&pg1, "default", "shardwise");
    c.args(["-c", "CREATE TABLE sales (id BIGINT, region VARCHAR, amount DOUBLE, day DATE) WITH (shard_key = 'id')"])
        .args(["-c", "INSERT INTO sales VALUES (1, 'eu', 10.5, '2024-01-01'), (2, 'us', 20, '2024-01-02'), (3, 'eu', NULL, NULL)"]);
    let (stdout, stderr) = text(&run_with_timeout(c, T));
    assert_eq!(stdout, "CREATE TABLE\nINSERT 0 3\n", "{stderr}");

    // psql's catalog commands read pg_catalog: `\dt` lists the table, `\d sales` its columns,
    // `\dt+` also its size and description (unknown here: NULL, not a made-up 0).
    let mut c = psql(&pg0, "default", "shardwise");
    c.args(["-c", "\\dt", "-c", "\\d sales", "-c", "\\dt+"]);
    let (stdout, stderr) = text(&run_with_timeout(c, T));
    let described = "public|sales|table|postgres\nid|bigint|||\nregion|text|||\namount|double precision|||\nday|date|||\n\
                     public|sales|table|postgres|permanent|||\n";
    assert_eq!(stdout, described, "{stderr}");
    // And the other describe commands (ON_ERROR_STOP: each must run): `\d+` (its options are an
    // `ARRAY(subquery)`), `\du` (another), `\df`, `\dT`, `\dconfig` and `\l+`, whose unknowns
    // (sizes) are NULL.
    let mut c = psql(&pg0, "default", "shardwise");
    c.args(["-c", "\\d+ sales", "-c", "\\du", "-c", "\\df", "-c", "\\dT", "-c", "\\dconfig", "-c", "\\l+"]);
    let (stdout, stderr) = text(&run_with_timeout(c, T));
    assert!(stdout.starts_with("id|bigint||||plain|||\nregion|text||||extended|||\n"), "{stdout}{stderr}");
    assert!(stdout.contains("\nshardwise|postgres|UTF-8|"), "{stdout}{stderr}");

    let mut c = psql(&pg0, "default", "shardwise");
    c.args(["-c", "SELECT region, count(*), sum(amount) FROM sales GROUP BY region ORDER BY region"]);
    let out = run_with_timeout(c, T);
    assert_eq!(text(&out).0, "eu|2|10.5\nus|1|20\n", "{}", text(&out).1);
    // Columns are named as PostgreSQL names them (DataFusion's were `count(*)`, `Utf8("x")`), and a
    // column named `count` is a row, not an INSERT's row count (it was answered with no rows).
    let mut c = psql(&pg0, "default", "shardwise");
    c.args(["-P", "tuples_only=off", "-P", "footer=off"])
        .args([
            "-c",
            "SELECT count(*), sum(amount), 'x', CAST(1 AS INT), region FROM sales WHERE id = 1 GROUP BY region",
        ])
        .args(["-c", "SELECT count(*) AS count FROM sales"]);
    let out = run_with_timeout(c, T);
    assert_eq!(text(&out).0, "count|sum|?column?|int4|region\n1|10.5|x|1|eu\ncount\n3\n", "{}", text(&out).1);
    // Lists are PostgreSQL arrays, NULL elements and quoting included.
    let mut c = psql(&pg0, "default", "shardwise");
    c.args(["-c", "SELECT array_agg(amount ORDER BY id), array_agg(region ORDER BY id) FROM sales"])
        .args(["-c", "SELECT make_array('a,b', NULL, '')"])
        // Described with the type the rows have after type coercion (Int64 before it).
        .args(["-c", "SELECT CASE WHEN id > 1 THEN 1 ELSE CAST(0.5 AS DECIMAL(3, 1)) END FROM sales ORDER BY id"])
        // A decimal of 38 digits (pgwire's own numeric holds 28).
        .args(["-c", "SELECT CAST('-1234567890123456789012345678.0123456789' AS DECIMAL(38, 10))"]);
    let out = run_with_timeout(c, T);
    let want = "{10.5,20,NULL}|{eu,us,eu}\n{\"a,b\",NULL,\"\"}\n0.5\n1.0\n1.0\n\
                -1234567890123456789012345678.0123456789\n";
    assert_eq!(text(&out).0, want, "{}", text(&out).1);

    // A multi-statement query stops at its first error, with the SQLSTATE.
    let mut c = psql(&pg0, "default", "shardwise");
    c.args(["-c", "SELECT 1; SELECT * FROM nosuch; SELECT 3"]);
    let out = run_with_timeout(c, T);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stdout, "1\n");
    assert!(stderr.contains("42P01") && stderr.contains("nosuch"), "{stderr}");

    // SQL-level PREPARE is refused with a pointer to the drivers' prepared statements (it was
    // kept in the node's one context, shared by every connection); DEALLOCATE is accepted.
    let mut c = psql(&pg0, "default", "shardwise");
    c.args(["-c", "DEALLOCATE p1"]).args(["-c", "PREPARE p1 AS SELECT 1"]);
    let out = run_with_timeout(c, T);
    let stderr = text(&out).1;
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("driver's prepared statements") && !stderr.contains("DEALLOCATE"), "{stderr}");

    // Cursors over the simple protocol: FETCH and MOVE forward; COMMIT closes a cursor declared
    // without hold.
    let mut c = psql(&pg0, "default", "shardwise");
    for sql in [
        "BEGIN",
        "DECLARE c CURSOR FOR SELECT id FROM sales ORDER BY id",
        "FETCH 1 FROM c",
        "MOVE 1 IN c",
        "FETCH ALL FROM c",
        "DECLARE h CURSOR WITH HOLD FOR SELECT 7",
        "COMMIT",
        "FETCH h",
        "FETCH c",
    ] {
        c.args(["-c", sql]);
    }
    let out = run_with_timeout(c, T);
    let (stdout, stderr) = text(&out);
    assert_eq!(stdout, "BEGIN\nDECLARE CURSOR\n1\nMOVE 1\n3\nDECLARE CURSOR\nCOMMIT\n7\n", "{stderr}");
    assert!(stderr.contains("34000") && stderr.contains("cursor \"c\" does not exist"), "{stderr}");

    // DISCARD ALL (PgBouncer's reset query) closes the session's cursors and resets its
    // settings; DISCARD TEMP has nothing to discard.
    let mut c = psql(&pg0, "default", "shardwise");
    c.args(["-v", "ON_ERROR_STOP=0"]);
    for sql in [
        "SET statement_timeout = '2s'",
        "DECLARE h CURSOR WITH HOLD FOR SELECT 7",
        "DISCARD ALL",
        "SHOW statement_timeout",
        "DISCARD TEMP",
        "FETCH h",
    ] {
        c.args(["-c", sql]);
    }
    let (stdout, stderr) = text(&run_with_timeout(c, T));
    assert_eq!(stdout, "SET\nDECLARE CURSOR\nDISCARD ALL\n0\nDISCARD TEMP\n", "{stderr}");
    assert!(stderr.contains("cursor \"h\" does not exist"), "{stderr}");

    // psql's \copy to a file: COPY ... TO STDOUT, CSV with a header or PostgreSQL's text format.
    let csv = dir.path().join("sales.csv");
    let txt = dir.path().join("sales.txt");
    let mut c = psql(&pg0, "default", "shardwise");
    c.args([
        "-c",
        &format!("\\copy (SELECT id, region, amount FROM sales ORDER BY id) TO '{}' CSV HEADER", csv.display()),
    ])
    .args(["-c", &format!("\\copy sales (id, day) TO '{}'", txt.display())])
    .args(["-c", "COPY sales TO '/tmp/server-side-file'"]);
    let out = run_with_timeout(c, T);
    let (stdout, stderr) = text(&out);
    assert!(stdout.starts_with("COPY 3\nCOPY 3\n") && stderr.contains("server files"), "{stdout} {stderr}");
    assert_eq!(std::fs::read_to_string(&csv).unwrap(), "id,region,amount\n1,eu,10.5\n2,us,20\n3,eu,\n");
    let mut lines: Vec<String> = std::fs::read_to_string(&txt).unwrap().lines().map(String::from).collect();
    lines.sort();
    assert_eq!(lines, ["1\t2024-01-01", "2\t2024-01-02", "3\t\\N"]);
    // A copy whose rows fail part-way ends with the error (an ErrorResponse in the copy, as
    // PostgreSQL sends), not with CopyFail, which psql took for a protocol error; the
    // connection goes on.
    let mut c = psql(&pg0, "default", "shardwise");
    let failing = "SELECT 10 / (150000 - value) AS x FROM generate_series(1, 200000) AS g(value)";
    c.args(["-v", "ON_ERROR_STOP=0", "-c", &format!("\\copy ({failing}) TO '{}'", txt.display())])
        .args(["-c", "SELECT 1 AS after"]);
    let (stdout, stderr) = text(&run_with_timeout(c, T));
    assert!(stderr.contains("division by zero") && !stderr.contains("unexpected response"), "{stderr}");
    assert!(stdout.ends_with("1\n"), "{stdout} {stderr}");
    // ... and back: \copy from a file (COPY ... FROM STDIN), checked whole before it is stored.
    std::fs::write(&csv, "id,region,amount\n7,\"asia, east\",1.5\n8,,\n").unwrap();
    std::fs::write(&txt, "9\tbad\tnot a number\n").unwrap();
    let mut c = psql(&pg1, "default", "shardwise");
    c.args(["-c", "CREATE TABLE imports (id BIGINT, region VARCHAR, amount DOUBLE) WITH (shard_key = 'id')"])
        .args(["-c", &format!("\\copy imports FROM '{}' CSV HEADER", csv.display())])
        .args(["-c", &format!("\\copy imports (id, region, amount) FROM '{}'", txt.display())]);
    let (stdout, stderr) = text(&run_with_timeout(c, T));
    assert!(
        stdout.starts_with("CREATE TABLE\nCOPY 2\n") && stderr.contains("line 1, column amount"),
        "{stdout} {stderr}"
    );
    let mut c = psql(&pg0, "default", "shardwise");
    c.args(["-c", "SELECT id, region, amount FROM imports ORDER BY id"]);
    assert_eq!(text(&run_with_timeout(c, T)).0, "7|asia, east|1.5\n8||\n");
    // In a CSV file of one column a blank line is a NULL (a quoted empty field an empty string),
    // as PostgreSQL reads it and as COPY TO writes it: the round trip keeps both.
    std::fs::write(&csv, "v\nx\n\n\"\"\n").unwrap();
    let mut c = psql(&pg0, "default", "shardwise");
    c.args(["-c", "CREATE TABLE one (v VARCHAR) WITH (shard_key = 'v')"])
        .args(["-c", &format!("\\copy one FROM '{}' CSV HEADER", csv.display())])
        .args(["-c", &format!("\\copy (SELECT v FROM one ORDER BY v NULLS FIRST) TO '{}' CSV HEADER", txt.display())])
        .args(["-c", "SELECT count(*), count(v), count(*) FILTER (WHERE v = '') FROM one"]);
    let (stdout, stderr) = text(&run_with_timeout(c, T));
    assert_eq!(stdout, "CREATE TABLE\nCOPY 3\nCOPY 3\n3|2|1\n", "{stderr}");
    assert_eq!(std::fs::read_to_string(&txt).unwrap(), "v\n\n\"\"\nx\n");
    // A COPY named by its insert_id (psql passes what follows \copy's options through), run
    // twice: stored once.
    std::fs::write(&csv, "v\nretried\n").unwrap();
    let copy = format!("\\copy one FROM '{}' CSV HEADER SETTINGS insert_id = 'copy-1'", csv.display());
    let mut c = psql(&pg1, "default", "shardwise");
    c.args(["-c", &copy]).args(["-c", &copy]).args(["-c", "SELECT count(*) FROM one WHERE v = 'retried'"]);
    let (stdout, stderr) = text(&run_with_timeout(c, T));
    assert_eq!(stdout, "COPY 1\nCOPY 1\n1\n", "{stderr}");

    // Wrong database and unknown user: FATAL errors at connect.
    let out = run_with_timeout(psql(&pg0, "default", "postgres"), T);
    assert!(text(&out).1.contains("database \"postgres\" does not exist"), "{}", text(&out).1);
    let out = run_with_timeout(psql(&pg0, "bob", "shardwise"), T);
    assert!(text(&out).1.contains("unknown user \"bob\""), "{}", text(&out).1);

    // A decimal column is described with its precision and scale (it was plain `numeric`).
    let mut c = psql(&pg1, "default", "shardwise");
    c.args(["-c", "CREATE TABLE prices (id BIGINT, price DECIMAL(12, 2)) WITH (shard_key = 'id')"])
        .args(["-c", "\\d prices"]);
    let (stdout, stderr) = text(&run_with_timeout(c, T));
    assert_eq!(stdout, "CREATE TABLE\nid|bigint|||\nprice|numeric(12,2)|||\n", "{stderr}");

    // psycopg: the extended protocol, server-side parameters, prepared statements (after five
    // runs), binary results, transactions that are accepted and errors as exceptions.
    let (host, port) = pg0.rsplit_once(':').unwrap();
    let script = format!(
        r#"
import datetime, decimal, psycopg
conn = psycopg.connect(host="{host}", port={port}, user="default", dbname="shardwise")
cur = conn.cursor()
cur.execute("INSERT INTO sales VALUES (%s, %s, %s, %s)", (4, "it's; DROP TABLE sales", 1.25, datetime.date(2024, 2, 29)))
assert cur.rowcount == 1, cur.rowcount
conn.commit()
for i in range(7):
    cur.execute("SELECT count(*) FROM sales WHERE id > %s", (i,))
    assert cur.fetchone()[0] == max(0, 4 - i)
cur.execute("SELECT id, region, amount, day FROM sales WHERE region = %s", ("it's; DROP TABLE sales",))
assert cur.fetchall() == [(4, "it's; DROP TABLE sales", 1.25, datetime.date(2024, 2, 29))]
cur.execute("SELECT id, region FROM sales ORDER BY id LIMIT %s", (2,))
assert cur.fetchall() == [(1, "eu"), (2, "us")]
b = conn.cursor(binary=True)
b.execute("SELECT id, amount, day, CAST(12.5 AS DECIMAL(10, 2)) AS d, id > 2 AS big FROM sales ORDER BY id")
rows = b.fetchall()
assert rows[0] == (1, 10.5, datetime.date(2024, 1, 1), decimal.Decimal("12.50"), False), rows[0]
assert len(rows) == 4
b.execute("SELECT CAST('-1234567890123456789012345678.0123456789' AS DECIMAL(38, 10)), CAST(10000 AS DECIMAL(10, 2))")
assert b.fetchone() == (decimal.Decimal("-1234567890123456789012345678.0123456789"), decimal.Decimal("10000.00"))
b.execute("SELECT CASE WHEN id > 1 THEN 1 ELSE CAST(0.5 AS DECIMAL(3, 1)) END FROM sales ORDER BY id")
assert [r[0] for r in b.fetchall()] == [decimal.Decimal("0.5")] + [decimal.Decimal("1.0")] * 3
for c in (cur, b):
    c.execute("SELECT array_agg(id ORDER BY id), array_agg(day ORDER BY id), make_array('x', NULL) FROM sales")
    lists = c.fetchone()
    want = ([1, 2, 3, 4], [datetime.date(2024, 1, 1), datetime.date(2024, 1, 2), None, datetime.date(2024, 2, 29)], ["x", None])
    assert lists == want, lists
# NUMERIC parameters keep every digit, sent as text (psycopg's default, exponents included) or
# in binary (%b); pgwire's 96-bit decimal rounded past 28 digits and refused `1E-7`.
D = decimal.Decimal
for mark in ("%s", "%b"):
    cur.execute(f"SELECT CAST({{mark}} AS DECIMAL(38, 10)), {{mark}}, {{mark}}",
                (D("1234567890123456789012345678.0123456789"), D("0.0000001"), D("1E+5")))
    assert cur.fetchone() == (D("1234567890123456789012345678.0123456789"), D("1E-7"), D("100000")), mark
try:
    cur.execute("SELECT %s", (D("NaN"),))
    raise SystemExit("a NaN decimal was taken")
except psycopg.Error as e:
    assert "which a DECIMAL cannot hold" in str(e), str(e)
conn.rollback()
# Parameters psycopg sends in binary (bytes, uuid, time) and lists (as arrays: `= ANY(%s)`).
import uuid
cur.execute("SELECT count(*) FROM sales WHERE id = ANY(%s)", ([1, 3, 99],))
assert cur.fetchone()[0] == 2
cur.execute("SELECT count(*) FROM sales WHERE region = ANY(%s)", (["eu", "nowhere"],))
assert cur.fetchone()[0] == 2
# The empty string and the text NULL in a list are themselves, not NULL; so are quotes and commas.
cur.execute("SELECT %s = ANY(%s), 'NULL' = ANY(%s), 'x' = ANY(%s), ' s ' = ANY(%s), %s = ANY(%s)",
            ("", ["", "a"], ["NULL"], [None, "x"], ['q"u', "a,b", " s "], "\\", ["\\"]))
assert cur.fetchone() == (True, True, True, True, True), "list parameters"
# PostgreSQL's array literals, in SQL as psycopg's client-side binding writes lists.
cur.execute("SELECT 'a' = ANY('{{a,b}}'::text[]), cardinality('{{a,\"\",NULL}}'::text[]), CAST('{{1,2}}' AS INT[])")
assert cur.fetchone() == (True, 3, [1, 2]), "array literals"
try:
    cur.execute("SELECT '{{a'::text[]")
    raise SystemExit("a malformed array literal was read")
except psycopg.Error as e:
    assert "malformed array literal" in str(e), str(e)
conn.rollback()
cur.execute("SELECT length(%s), %s, CAST(%s AS VARCHAR)", (b"h\x00i", datetime.time(12, 30, 1), uuid.UUID(int=1)))
assert cur.fetchone() == (3, datetime.time(12, 30, 1), "00000000-0000-0000-0000-000000000001")
# Intervals: a timedelta (psycopg sends it in binary), PostgreSQL's interval text and ISO 8601's.
cur.execute("SELECT %s, %s + INTERVAL '1 hour', INTERVAL '1 day 02:00:00', '04:05:06.5'::interval, "
            "CAST('P1DT2H' AS INTERVAL), INTERVAL '3 days ago'",
            (datetime.timedelta(days=1, seconds=1.5), datetime.timedelta(minutes=-90)))
got = cur.fetchone()
td = datetime.timedelta
assert got == (td(days=1, seconds=1.5), td(minutes=-30), td(days=1, hours=2), td(hours=4, minutes=5, seconds=6.5),
               td(days=1, hours=2), td(days=-3)), got
try:
    cur.execute("SELECT nope FROM sales")
    raise SystemExit("no error")
except psycopg.Error as e:
    assert e.sqlstate == "42703", e.sqlstate
conn.rollback()
with psycopg.connect(host="{host}", port={port}, user="default", dbname="shardwise", autocommit=True) as auto:
    auto.execute("SET distributed_group_by_no_merge = 1")
    n = auto.execute("SELECT count(*) FROM sales").fetchall()
    assert len(n) == 2, n  # one partial count per shard: the session setting holds
# A cancel request (psql's Ctrl-C; psycopg's conn.cancel()) stops the running statement with
# 57014 and leaves the connection usable.
import threading, time
slow = psycopg.connect(host="{host}", port={port}, user="default", dbname="shardwise", autocommit=True)
threading.Timer(0.5, slow.cancel).start()
started = time.time()
try:
    slow.execute("SELECT count(*) FROM generate_series(1, 100000000000)")
    raise SystemExit("the statement was not cancelled")
except psycopg.errors.QueryCanceled:
    pass
assert time.time() - started < 15, time.time() - started
assert slow.execute("SELECT 7").fetchone() == (7,)
slow.close()
# A timeout given in the startup packet's options (libpq's `options`, SQLAlchemy's connect_args)
# applies, as `SET` would; a setting `SET` refuses refuses the connection.
timed = psycopg.connect(host="{host}", port={port}, user="default", dbname="shardwise", autocommit=True,
                        options="-c statement_timeout=300 -c application_name=tests")
started = time.time()
try:
    timed.execute("SELECT count(*) FROM generate_series(1, 100000000000)")
    raise SystemExit("the startup option's timeout did not apply")
except psycopg.errors.QueryCanceled:
    pass
assert time.time() - started < 15, time.time() - started
# SHOW and current_setting answer PostgreSQL's name in its units.
assert timed.execute("SHOW statement_timeout").fetchall() == [("300ms",)]
timed.execute("SET statement_timeout = '2s'")
assert timed.execute("SELECT current_setting('statement_timeout')").fetchone() == ("2s",)
timed.close()
try:
    psycopg.connect(host="{host}", port={port}, user="default", dbname="shardwise", options="-c no_such_setting=1")
    raise SystemExit("an unknown startup setting was taken")
except psycopg.OperationalError as e:
    assert "startup option no_such_setting=1" in str(e), str(e)
# The extended protocol streams: the first rows of an endless result arrive at once (they were
# collected whole before the first was sent), and closing the connection stops the statement.
endless = psycopg.connect(host="{host}", port={port}, user="default", dbname="shardwise", autocommit=True)
started = time.time()
head = []
for row in endless.cursor().stream("SELECT value FROM generate_series(1, 100000000000)"):
    head.append(row[0])
    if len(head) == 3:
        break
assert head == [1, 2, 3] and time.time() - started < 15, (head, time.time() - started)
endless.close()
with psycopg.connect(host="{host}", port={port}, user="default", dbname="shardwise", autocommit=True) as watch:
    for _ in range(150):
        states = [r[0] for r in watch.execute("SELECT state FROM system.queries WHERE query LIKE 'SELECT value FROM generate_series%'").fetchall()]
        if states == ["cancelled"]:
            break
        time.sleep(0.1)
    assert states == ["cancelled"], states
# What drivers and SQLAlchemy ask when they connect: PostgreSQL's version and parameters, and
# nested transactions (savepoints), which are accepted as BEGIN is.
with psycopg.connect(host="{host}", port={port}, user="default", dbname="shardwise") as tx:
    assert tx.execute("SELECT version()").fetchone()[0].startswith("PostgreSQL 16.6 on ")
    assert tx.execute("SHOW transaction isolation level").fetchone() == ("read committed",)
    with tx.transaction():
        with tx.transaction():
            assert tx.execute("SELECT count(*) FROM sales").fetchone() == (4,)
# Server-side cursors: psycopg's named cursors (DECLARE, Describe of the cursor's portal, FETCH
# FORWARD n, CLOSE), in text and binary, held past a commit, and SQLAlchemy's stream_results.
with psycopg.connect(host="{host}", port={port}, user="default", dbname="shardwise") as cc:
    with cc.cursor(name="by_id") as cur:
        cur.itersize = 2
        cur.execute("SELECT id, region FROM sales WHERE id < %s ORDER BY id", (4,))
        assert [d.name for d in cur.description] == ["id", "region"], cur.description
        first = cur.fetchone()
        rest = list(cur)
        assert (first, rest) == ((1, "eu"), [(2, "us"), (3, "eu")]), (first, rest)
    with cc.cursor(name="binary", binary=True) as cur:
        cur.execute("SELECT id, amount FROM sales ORDER BY id LIMIT 2")
        rows = cur.fetchall()
        assert rows == [(1, 10.5), (2, 20.0)], rows
    with cc.cursor(name="held", withhold=True) as cur:
        cur.execute("SELECT count(*) FROM sales")
        cc.commit()
        rows = cur.fetchall()
        assert rows == [(4,)], rows
    # A FETCH whose query fails leaves the cursor failed: no later FETCH answers rows.
    cc.execute("DECLARE f CURSOR WITH HOLD FOR SELECT 10 / (id - 2) FROM sales")
    try:
        cc.execute("FETCH ALL FROM f")
        raise SystemExit("a failing cursor query answered")
    except psycopg.errors.DivisionByZero as e:
        assert "division by zero" in str(e), e
    cc.rollback()
    try:
        cc.execute("FETCH ALL FROM f")
        raise SystemExit("a failed cursor answered again")
    except psycopg.errors.InvalidCursorState as e:
        assert "failed in an earlier FETCH" in str(e), e
    cc.rollback()
    cc.execute("CLOSE f")
    try:
        with cc.cursor(name="bad") as cur:
            cur.execute("SELECT nosuch FROM sales")
        raise SystemExit("a cursor over a bad query was declared")
    except psycopg.errors.UndefinedColumn as e:
        assert "nosuch" in str(e), e
import sqlalchemy
engine = sqlalchemy.create_engine("postgresql+psycopg://default@{host}:{port}/shardwise")
with engine.connect() as sa:
    assert sa.execute(sqlalchemy.text("SELECT count(*) FROM sales WHERE id > :n"), {{"n": 1}}).scalar() == 3
    streamed = sa.execution_options(stream_results=True, max_row_buffer=2).execute(sqlalchemy.text("SELECT id FROM sales ORDER BY id"))
    sizes = [len(p) for p in streamed.partitions(3)]
    assert sizes == [3, 1], sizes
    inspector = sqlalchemy.inspect(sa)
    assert "sales" in inspector.get_table_names(), inspector.get_table_names()
    # Reflection, as pandas.read_sql_table and schema browsers use it: columns with their types,
    # and no keys, indexes or constraints (shardwise has none).
    columns = [(c["name"], str(c["type"]), c["nullable"], c["default"]) for c in inspector.get_columns("sales")]
    assert columns == [("id", "BIGINT", True, None), ("region", "TEXT", True, None),
                       ("amount", "DOUBLE PRECISION", True, None), ("day", "DATE", True, None)], columns
    prices = [(c["name"], str(c["type"])) for c in inspector.get_columns("prices")]
    assert prices == [("id", "BIGINT"), ("price", "NUMERIC(12, 2)")], prices
    assert inspector.get_pk_constraint("sales")["constrained_columns"] == []
    assert inspector.get_indexes("sales") == []
    assert inspector.get_unique_constraints("sales") == []
    assert inspector.get_foreign_keys("sales") == []
    table = sqlalchemy.Table("sales", sqlalchemy.MetaData(), autoload_with=sa)
    counted = sa.execute(sqlalchemy.select(sqlalchemy.func.count()).select_from(table)).scalar()
    assert counted == sa.execute(sqlalchemy.text("SELECT count(*) FROM sales")).scalar() > 0, counted
try:
    psycopg.connect(host="{host}", port={port}, user="default", dbname="other")
    raise SystemExit("connected to another database")
except psycopg.OperationalError as e:
    assert "does not exist" in str(e), e
# A binary array parameter claiming 2^31 elements in 20 bytes is refused (the node asked for
# 32 GiB and aborted), and the node goes on.
import socket, struct
def message(kind, body):
    return kind + struct.pack(">I", len(body) + 4) + body
def read_message(sock):
    head = b""
    while len(head) < 5:
        head += sock.recv(5 - len(head))
    body, size = b"", struct.unpack(">I", head[1:])[0] - 4
    while len(body) < size:
        body += sock.recv(size - len(body))
    return head[:1], body
raw = socket.create_connection(("{host}", {port}), timeout=20)
startup = b"user\0default\0database\0shardwise\0\0"
raw.sendall(struct.pack(">II", 8 + len(startup), 196608) + startup)
while read_message(raw)[0] != b"Z":
    pass
claim = struct.pack(">iiiii", 1, 0, 20, 0x7FFFFFFF, 1)
raw.sendall(message(b"P", b"\0SELECT $1\0" + struct.pack(">hI", 1, 1016))
            + message(b"B", b"\0\0" + struct.pack(">hh", 1, 1) + struct.pack(">hi", 1, len(claim)) + claim + struct.pack(">h", 0))
            + message(b"E", b"\0\0\0\0\0") + message(b"S", b""))
answers = []
while not answers or answers[-1][0] != b"Z":
    answers.append(read_message(raw))
errors = [body for kind, body in answers if kind == b"E"]
assert len(errors) == 1 and b"claims 2147483647 elements" in errors[0], answers
raw.close()
# asyncpg declares no parameter types: it encodes each value (in binary) by the type the
# statement's description names, which shardwise infers as PostgreSQL does.
import asyncio, asyncpg
async def with_asyncpg():
    c = await asyncpg.connect(host="{host}", port={port}, user="default", database="shardwise")
    assert await c.fetchval("SELECT $1::bigint + 1", 41) == 42
    rows = await c.fetch("SELECT id, region FROM sales WHERE id > $1 AND region <> $2 ORDER BY id", 1, "nowhere")
    assert [r["id"] for r in rows] == [2, 3, 4], rows
    await c.execute("INSERT INTO prices (id, price) VALUES ($1, $2)", 77, decimal.Decimal("12.25"))
    statement = await c.prepare("SELECT price FROM prices WHERE id = $1")
    assert await statement.fetchval(77) == decimal.Decimal("12.25")
    assert await c.fetchval("SELECT $1", "text by default") == "text by default"
    await c.close()
    # A pool resets a connection it takes back (pg_advisory_unlock_all(), CLOSE ALL,
    # UNLISTEN *, RESET ALL).
    pool = await asyncpg.create_pool(host="{host}", port={port}, user="default", database="shardwise", min_size=1, max_size=1)
    for _ in range(2):
        async with pool.acquire() as pooled:
            assert await pooled.fetchval("SELECT count(*) FROM sales WHERE id >= $1", 1) == 4
    await pool.close()
asyncio.run(with_asyncpg())
print("ok")
"#
    );
    let mut c = python();
    c.args(["-c", &script]);
    let out = run_with_timeout(c, T);
    let (stdout, stderr) = text(&out);
    assert_eq!(stdout.trim(), "ok", "{stderr}");
}

/// `shardwise passwd` for `alice`, through standard input.
fn verifier_line(user: &str, password: &str) -> String {
    let mut c = shardwise();
    c.args(["passwd", user]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().expect("spawn passwd");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(format!("{password}\n").as_bytes()).expect("write password");
    }
    let out = child.wait_with_output().expect("passwd");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(line.starts_with(&format!("{user} = \"SCRAM-SHA-256$4096:")), "{line}");
    assert!(!line.contains(password));
    line
}

#[test]
fn configured_users_on_every_protocol() {
    let dir = tempdir();
    let config = dir.path().join("node.toml");
    std::fs::write(&config, format!("[users]\n{}\n", verifier_line("alice", "s3cret pass"))).unwrap();
    let (_nodes, lines) = two_nodes(dir.path(), Some(&config));
    let pg = listening_addr(&lines[0], "pg");
    let http = listening_addr(&lines[1], "http");
    let flight = flight_addr(&lines[1]);

    // PostgreSQL: SCRAM-SHA-256.
    let mut c = psql(&pg, "alice", "shardwise");
    c.env("PGPASSWORD", "s3cret pass").args(["-c", "SELECT 40 + 2"]);
    let out = run_with_timeout(c, T);
    assert_eq!(text(&out).0, "42\n", "{}", text(&out).1);
    let mut c = psql(&pg, "alice", "shardwise");
    c.env("PGPASSWORD", "wrong").args(["-c", "SELECT 1"]);
    let out = run_with_timeout(c, T);
    // PostgreSQL's words, lower case: tools match on them.
    assert!(text(&out).1.contains("FATAL:  password authentication failed for user \"alice\""), "{}", text(&out).1);
    let mut c = psql(&pg, "default", "shardwise");
    c.env("PGPASSWORD", "x").args(["-c", "SELECT 1"]);
    assert!(!run_with_timeout(c, T).status.success(), "default no longer exists");
    // An unknown user goes through the same exchange and gets the same answer as a wrong
    // password (it was refused before any salt, which told who exists).
    let mut c = psql(&pg, "mallory", "shardwise");
    c.env("PGPASSWORD", "wrong").args(["-c", "SELECT 1"]);
    let out = run_with_timeout(c, T);
    assert!(text(&out).1.contains("authentication failed for user \"mallory\""), "{}", text(&out).1);

    // HTTP: Basic.
    let url = format!("http://{http}/query");
    let (code, body) =
        curl(&["-u", "alice:s3cret pass", "--data-binary", "SELECT 42 AS a", "-H", "Content-Type: text/plain", &url]);
    assert_eq!((code, body.as_str()), (200, "{\"a\":42}\n"));
    let (code, body) = curl(&["--data-binary", "SELECT 1", "-H", "Content-Type: text/plain", &url]);
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("credentials required"), "{body}");
    let (code, _) = curl(&["-u", "alice:nope", "--data-binary", "SELECT 1", "-H", "Content-Type: text/plain", &url]);
    assert_eq!(code, 401);

    // Flight SQL: `shardwise sql`.
    let mut c = shardwise();
    c.args(["sql", "--connect", &flight, "--user", "alice", "--password", "s3cret pass", "--format", "csv"])
        .args(["-e", "SELECT 7 AS seven"]);
    assert_eq!(text(&run_with_timeout(c, T)).0, "seven\n7\n");
    let mut c = shardwise();
    c.args(["sql", "--connect", &flight, "-e", "SELECT 1"]);
    let out = run_with_timeout(c, T);
    assert!(!out.status.success());
    assert!(text(&out).1.contains("password authentication failed for user \"default\""), "{}", text(&out).1);
}

#[test]
fn every_http_route_with_curl() {
    let dir = tempdir();
    let mut node = Proc::spawn(node_cmd(0, 1, free_port(), &rank_dir(dir.path(), 0)));
    let line = node.wait_for_line("listening rank=0", T);
    let base = format!("http://{}", listening_addr(&line, "http"));
    let query = format!("{base}/query");
    let sql_body = ["-H", "Content-Type: application/sql", "--data-binary"];

    let q = "SELECT * FROM (VALUES (1, 'a'), (2, NULL)) AS t(n, s) ORDER BY n";
    let (code, body) = curl(&[&sql_body[..], &[q, &query]].concat());
    assert_eq!((code, body.as_str()), (200, "{\"n\":1,\"s\":\"a\"}\n{\"n\":2,\"s\":null}\n"));
    let (code, body) = curl(&[&sql_body[..], &[q, &format!("{query}?format=csv")]].concat());
    assert_eq!((code, body.as_str()), (200, "n,s\n1,a\n2,\n"));
    // As setting names are, the parameter and its value are read in any case.
    let (code, body) = curl(&[&sql_body[..], &[q, &format!("{query}?FORMAT=CSV")]].concat());
    assert_eq!((code, body.as_str()), (200, "n,s\n1,a\n2,\n"));
    let (code, body) = curl(&["-H", "Accept: text/csv", "-H", "Content-Type: text/plain", "--data-binary", q, &query]);
    assert_eq!((code, body.as_str()), (200, "n,s\n1,a\n2,\n"));
    // A FORMAT clause wins over ?format= (ClickHouse's CSV has no header row).
    let (code, body) = curl(&[&sql_body[..], &[&format!("{q} FORMAT CSV"), &format!("{query}?format=json")]].concat());
    assert_eq!((code, body.as_str()), (200, "1,a\n2,\n"));
    let with_settings = format!("{q} FORMAT JSONEachRow SETTINGS max_memory_usage = 0");
    let (code, body) = curl(&[&sql_body[..], &[&with_settings, &format!("{query}?format=csv")]].concat());
    assert_eq!((code, body.as_str()), (200, "{\"n\":1,\"s\":\"a\"}\n{\"n\":2,\"s\":null}\n"));
    // TabSeparated, ClickHouse's default: escapes and \N read back by an INSERT ... FORMAT TSV.
    let tabs = "SELECT * FROM (VALUES (1, 'a\tb'), (2, NULL)) AS t(n, s) ORDER BY n";
    let (code, body) = curl(&[&sql_body[..], &[&format!("{tabs} FORMAT TSVWithNames"), &query]].concat());
    assert_eq!((code, body.as_str()), (200, "n\ts\n1\ta\\tb\n2\t\\N\n"));
    let (code, body) = curl(&[&sql_body[..], &[tabs, &format!("{query}?format=tsv")]].concat());
    assert_eq!((code, body.as_str()), (200, "n\ts\n1\ta\\tb\n2\t\\N\n"));
    let (code, body) = curl(&[&sql_body[..], &["SELECT 1 FORMAT Pretty", &query]].concat());
    assert!(code == 400 && body.contains("FORMAT Pretty"), "{code} {body}");
    // ClickHouse's forms: POST /, and GET /?query= for a query that only reads.
    let (code, body) = curl(&[&sql_body[..], &["SELECT 41 + 1 AS x FORMAT CSV", &format!("{base}/")]].concat());
    assert_eq!((code, body.as_str()), (200, "42\n"));
    let (code, body) = curl(&[&format!("{base}/?query=SELECT%2042%20AS%20x%20FORMAT%20CSV")]);
    assert_eq!((code, body.as_str()), (200, "42\n"));
    let (code, body) =
        curl(&[&format!("{base}/?query=CREATE%20TABLE%20g%20(k%20BIGINT)%20WITH%20(shard_key%3D%27k%27)")]);
    assert!(code == 405 && body.contains("a GET runs only statements that read"), "{code} {body}");
    let (code, body) =
        curl(&[&format!("{base}/?query=SELECT%20count(*)%20FROM%20system.tables%20WHERE%20name%3D%27g%27")]);
    assert_eq!((code, body.as_str()), (200, "{\"count(*)\":0}\n"), "the GET created nothing");
    // REPAIR TABLE answers rows but changes replicas: not through a GET either (CHECK TABLE is).
    let (code, body) = curl(&[&format!("{base}/?query=REPAIR%20TABLE%20g")]);
    assert!(code == 405 && body.contains("a GET runs only statements that read"), "{code} {body}");
    // Lists and structs as JSON (CSV has no nested values); an empty string quoted, NULL empty,
    // so the two read back apart.
    let nested = "SELECT [1, NULL] AS l, named_struct('a', 1) AS s, '' AS e, CAST(NULL AS VARCHAR) AS n";
    let (code, body) = curl(&[&sql_body[..], &[nested, &format!("{query}?format=csv")]].concat());
    assert_eq!((code, body.as_str()), (200, "l,s,e,n\n\"[1,null]\",\"{\"\"a\"\":1}\",\"\",\n"));

    // JSON with settings: mode 1 over one node's shard still answers.
    let json = r#"{"sql": "SELECT 1 AS one", "settings": {"max_execution_time_ms": 5000}}"#;
    let (code, body) = curl(&["-H", "Content-Type: application/json", "--data-binary", json, &query]);
    assert_eq!((code, body.as_str()), (200, "{\"one\":1}\n"));
    // A key given twice is refused (serde_json ran the last one).
    let twice = r#"{"sql": "SELECT 1 AS one", "sql": "SELECT 2 AS two"}"#;
    let (code, body) = curl(&["-H", "Content-Type: application/json", "--data-binary", twice, &query]);
    assert!(code == 400 && body.contains("gives \\\"sql\\\" twice"), "{code} {body}");

    // Settings in the URL, as ClickHouse takes them; the body's and a SETTINGS clause's win.
    let changed = "SELECT name, value FROM system.settings WHERE changed ORDER BY name FORMAT CSV";
    let url = format!("{query}?max_memory_usage=123456789&max_execution_time_ms=5000");
    let (code, body) = curl(&[&sql_body[..], &[changed, &url]].concat());
    assert_eq!((code, body.as_str()), (200, "max_execution_time_ms,5000\nmax_memory_usage,123456789\n"));
    let json = format!(r#"{{"sql": "{changed}", "settings": {{"max_memory_usage": 777777777}}}}"#);
    let (code, body) = curl(&["-H", "Content-Type: application/json", "--data-binary", &json, &url]);
    assert_eq!((code, body.as_str()), (200, "max_execution_time_ms,5000\nmax_memory_usage,777777777\n"));
    let clause = changed.replace(" FORMAT CSV", " SETTINGS max_memory_usage = 99999999 FORMAT CSV");
    let (code, body) = curl(&[&sql_body[..], &[&clause, &url]].concat());
    assert_eq!((code, body.as_str()), (200, "max_execution_time_ms,5000\nmax_memory_usage,99999999\n"));

    // A request is one statement: its insert_id may come from the URL or the JSON settings, and
    // a retried request is applied once.
    let (code, body) =
        curl(&[&sql_body[..], &["CREATE TABLE retried (k BIGINT) WITH (shard_key = 'k')", &query]].concat());
    assert_eq!(code, 200, "{body}");
    for _ in 0..2 {
        let insert = "INSERT INTO retried VALUES (1), (2), (3)";
        let (code, body) = curl(&[&sql_body[..], &[insert, &format!("{query}?insert_id=http-1")]].concat());
        assert_eq!(code, 200, "{body}");
        let json = r#"{"sql": "INSERT INTO retried VALUES (4)", "settings": {"insert_id": "http-2"}}"#;
        let (code, body) = curl(&["-H", "Content-Type: application/json", "--data-binary", json, &query]);
        assert_eq!(code, 200, "{body}");
    }
    let (code, body) =
        curl(&[&sql_body[..], &["SELECT count(*) AS n, sum(k) AS s FROM retried FORMAT CSV", &query]].concat());
    assert_eq!((code, body.as_str()), (200, "4,10\n"));

    // Rows after an INSERT ... FORMAT, as ClickHouse's HTTP interface takes them: in the body
    // after the statement, or as the body of ?query=, with a header line for WithNames.
    let (code, body) = curl(
        &[&sql_body[..], &["CREATE TABLE posted (id BIGINT, name VARCHAR, d DATE) WITH (shard_key = 'id')", &query]]
            .concat(),
    );
    assert_eq!(code, 200, "{body}");
    let rows = "INSERT INTO posted FORMAT CSV\n1,a,2024-01-01\n2,\"b,c\",\n";
    let (code, body) = curl(&[&sql_body[..], &[rows, &query]].concat());
    assert_eq!((code, body.as_str()), (200, "{\"count\":2}\n"));
    // Recorded in the query log, as a SQL INSERT is.
    let logged = "SELECT state FROM system.queries WHERE query LIKE 'INSERT INTO posted FORMAT%' FORMAT CSV";
    let (code, body) = curl(&[&sql_body[..], &[logged, &query]].concat());
    assert_eq!((code, body.as_str()), (200, "finished\n"));
    let file = dir.path().join("rows.tsv");
    std::fs::write(&file, "name\tid\nd\t3\n\\N\t4\n").unwrap();
    let statement = "INSERT%20INTO%20posted%20SETTINGS%20insert_id%20%3D%20%27tsv-1%27%20FORMAT%20TSVWithNames";
    for _ in 0..2 {
        let (code, body) =
            curl(&["--data-binary", &format!("@{}", file.display()), &format!("{query}?query={statement}&format=csv")]);
        assert_eq!((code, body.as_str()), (200, "count\n2\n"));
    }
    // ?query= alone is the SQL, as ClickHouse takes it; a JSON body beside it would be a second.
    let (code, body) = curl(&["-X", "POST", &format!("{query}?query=SELECT%2041%20%2B%201%20AS%20a")]);
    assert_eq!((code, body.as_str()), (200, "{\"a\":42}\n"));
    let json = r#"{"sql": "SELECT 1"}"#;
    let (code, body) =
        curl(&["-H", "Content-Type: application/json", "--data-binary", json, &format!("{query}?query=SELECT%202")]);
    assert!(code == 400 && body.contains("a JSON body would be another"), "{code} {body}");
    // A bad value names its line and column, and nothing is stored.
    let (code, body) =
        curl(&[&sql_body[..], &["INSERT INTO posted FORMAT CSV\n5,e,2024-01-01\n6,f,someday\n", &query]].concat());
    assert!(
        code == 400 && body.contains("INSERT INTO posted line 2, column d: \\\"someday\\\" is not a Date32"),
        "{code} {body}"
    );
    let (code, body) = curl(&[&sql_body[..], &["INSERT INTO posted FORMAT Parquet\nPAR1", &query]].concat());
    assert!(code == 400 && body.contains("FORMAT Parquet: the body is not Parquet"), "{code} {body}");
    let (code, body) = curl(&[&sql_body[..], &["INSERT INTO posted FORMAT Values (1)", &query]].concat());
    assert!(code == 400 && body.contains("not a format shardwise reads"), "{code} {body}");
    // JSONEachRow: keys name columns, a missing key is NULL, an unknown one an error.
    let json_rows =
        "INSERT INTO posted FORMAT JSONEachRow\n{\"id\": 7, \"name\": \"g\", \"d\": \"2024-02-03\"}\n{\"id\": 8}\n";
    let (code, body) = curl(&[&sql_body[..], &[json_rows, &query]].concat());
    assert_eq!((code, body.as_str()), (200, "{\"count\":2}\n"));
    let (code, body) =
        curl(&[&sql_body[..], &["INSERT INTO posted FORMAT JSONEachRow\n{\"id\": 9}\n{\"nope\": 1}", &query]].concat());
    assert!(code == 400 && body.contains("line 2: no column \\\"nope\\\" in posted"), "{code} {body}");
    let listed = "SELECT id, name, d FROM posted ORDER BY id FORMAT CSV";
    let (code, body) = curl(&[&sql_body[..], &[listed, &query]].concat());
    assert_eq!((code, body.as_str()), (200, "1,a,2024-01-01\n2,\"b,c\",\n3,d,\n4,,\n7,g,2024-02-03\n8,,\n"));
    // A query that fails after some of its batches came (rows from one node, then a division by
    // zero on the other) answers with the error's status, whatever the format: the answer is
    // held until it ends or passes HTTP_RESPONSE_BUFFER_BYTES.
    let create = "CREATE TABLE zdiv (g BIGINT) WITH (shard_key = 'g')";
    assert_eq!(curl(&[&sql_body[..], &[create, &query]].concat()).0, 200);
    let fill = "INSERT INTO zdiv SELECT value FROM generate_series(1, 2000)";
    assert_eq!(curl(&[&sql_body[..], &[fill, &query]].concat()).0, 200);
    for format in ["csv", "tsv", "json", "arrow"] {
        for _ in 0..3 {
            let failing = "SELECT g, 100 / (g - 1500) FROM zdiv";
            let (code, body) = curl(&[&sql_body[..], &[failing, &format!("{query}?format={format}")]].concat());
            assert!(code == 400 && body.contains("division by zero"), "{format}: {code} {body}");
        }
    }
    // A REAL out of range (or too close to zero to be one) is refused as an INSERT refuses it; a
    // DECIMAL with an exponent, as JSON writers send it, is read.
    let create = "CREATE TABLE nums (id BIGINT, r REAL, m DECIMAL(10, 3)) WITH (shard_key = 'id')";
    assert_eq!(curl(&[&sql_body[..], &[create, &query]].concat()).0, 200);
    for (rows, needle) in [
        (
            "INSERT INTO nums FORMAT CSV\n1,1.5,1\n2,3.5e38,1\n",
            "line 2, column r: \\\"3.5e38\\\" is not a Float32 (it is beyond",
        ),
        ("INSERT INTO nums FORMAT TSV\n1\t1e-50\t1\n", "\\\"1e-50\\\" is not a Float32 (it is too close to zero"),
        // Beyond a DOUBLE's range too (it was stored as an infinity).
        ("INSERT INTO nums FORMAT CSV\n3,1e400,1\n", "\\\"1e400\\\" is not a Float32 (it is beyond"),
        ("INSERT INTO nums FORMAT JSONEachRow\n{\"id\": 1, \"r\": -3.5e38}\n", "it is beyond the type's range"),
    ] {
        let (code, body) = curl(&[&sql_body[..], &[rows, &query]].concat());
        assert!(code == 400 && body.contains(needle), "{rows}: {code} {body}");
    }
    let rows =
        "INSERT INTO nums FORMAT JSONEachRow\n{\"id\": 1, \"r\": 3.25e38, \"m\": 1.5e-2}\n{\"id\": 2, \"m\": 2E2}\n";
    assert_eq!(curl(&[&sql_body[..], &[rows, &query]].concat()), (200, "{\"count\":2}\n".to_string()));
    let listed = "SELECT id, r, m FROM nums ORDER BY id FORMAT CSV";
    assert_eq!(curl(&[&sql_body[..], &[listed, &query]].concat()), (200, "1,3.25e38,0.015\n2,,200.000\n".to_string()));

    // A query named by the client, as ClickHouse's query_id, found by that name.
    let (code, body) =
        curl(&[&sql_body[..], &["SELECT 41 + 1 AS answer", &format!("{query}?query_id=http-q-1")]].concat());
    assert_eq!(code, 200, "{body}");
    let logged = "SELECT state FROM system.queries WHERE query_id = 'http-q-1' FORMAT CSV";
    // The record ends when the answer's stream is dropped, just after its last byte went out.
    let mut seen = curl(&[&sql_body[..], &[logged, &query]].concat());
    for _ in 0..50 {
        if seen.1 == "finished\n" {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        seen = curl(&[&sql_body[..], &[logged, &query]].concat());
    }
    assert_eq!((seen.0, seen.1.as_str()), (200, "finished\n"));

    // Arrow IPC, decoded here.
    let arrow_file = dir.path().join("answer.arrows");
    let mut c = tool("SHARDWISE_TEST_CURL", "curl", "apt-get install curl");
    c.args(["-s", "--max-time", "30", "-H", "Accept: application/vnd.apache.arrow.stream"])
        .args(["-H", "Content-Type: text/plain", "--data-binary", q, "-o"])
        .arg(&arrow_file)
        .arg(&query);
    assert!(run_with_timeout(c, T).status.success());
    let reader = arrow::ipc::reader::StreamReader::try_new(std::fs::File::open(&arrow_file).unwrap(), None).unwrap();
    let batches: Vec<_> = reader.collect::<Result<_, _>>().unwrap();
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 2);
    assert_eq!(batches[0].schema().field(0).name(), "n");

    // Typed rows: an answer in ArrowStream put back as the body of ?query=, and a Parquet
    // file after the statement in the body (binary after text), its INT32 cast to BIGINT.
    let arrow_rows = dir.path().join("rows.arrows");
    let mut c = tool("SHARDWISE_TEST_CURL", "curl", "apt-get install curl");
    c.args(["-s", "--max-time", "30", "-H", "Content-Type: text/plain", "--data-binary"])
        .arg("SELECT id + 100 AS id, name FROM posted WHERE id < 3 FORMAT ArrowStream")
        .arg("-o")
        .arg(&arrow_rows)
        .arg(&query);
    assert!(run_with_timeout(c, T).status.success());
    let insert = "INSERT%20INTO%20posted%20FORMAT%20ArrowStream";
    // `curl -T` sends the file with PUT.
    let (code, body) = curl(&["-T", &arrow_rows.display().to_string(), &format!("{query}?query={insert}")]);
    assert_eq!((code, body.as_str()), (200, "{\"count\":2}\n"));
    let schema = Arc::new(arrow::datatypes::Schema::new(vec![
        arrow::datatypes::Field::new("id", arrow::datatypes::DataType::Int32, false),
        arrow::datatypes::Field::new("name", arrow::datatypes::DataType::Utf8, true),
    ]));
    let batch = arrow::record_batch::RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            Arc::new(arrow::array::Int32Array::from(vec![200, 201])),
            Arc::new(arrow::array::StringArray::from(vec![Some("p"), None])),
        ],
    )
    .unwrap();
    let mut parquet_body = b"INSERT INTO posted (name, id) FORMAT Parquet\n".to_vec();
    let mut writer = datafusion::parquet::arrow::ArrowWriter::try_new(&mut parquet_body, schema, None).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    let parquet_file = dir.path().join("rows.parquet.sql");
    std::fs::write(&parquet_file, &parquet_body).unwrap();
    // Sent twice under one insert_id (a retry): stored once.
    for _ in 0..2 {
        let url = format!("{query}?insert_id=pq-1");
        let (code, body) = curl(&["--data-binary", &format!("@{}", parquet_file.display()), &url]);
        assert_eq!((code, body.as_str()), (200, "{\"count\":2}\n"));
    }
    let typed = "SELECT id, name, d FROM posted WHERE id >= 100 ORDER BY id FORMAT CSV";
    let (code, body) = curl(&[&sql_body[..], &[typed, &query]].concat());
    assert_eq!((code, body.as_str()), (200, "101,a,\n102,\"b,c\",\n200,p,\n201,,\n"));

    // What `curl --data-binary` sends by default (a form content type) is taken as SQL, as
    // ClickHouse takes it.
    let (code, body) = curl(&["--data-binary", "SELECT 40 + 2 AS n FORMAT CSV", &query]);
    assert_eq!((code, body.as_str()), (200, "42\n"));

    // Refusals, each a 4xx with a JSON body.
    let big = dir.path().join("big.sql");
    std::fs::write(&big, format!("SELECT 1 -- {}", "x".repeat(17 << 20))).unwrap();
    let big = format!("@{}", big.display());
    let cases: Vec<(Vec<&str>, u16, &str)> = vec![
        (vec!["-H", "Content-Type: text/plain", "--data-binary", &big], 413, "HTTP_MAX_BODY_BYTES"),
        (vec!["-F", "sql=SELECT 1"], 415, "multipart"),
        // Failing when it runs, before its first row: the status says so (not 200 and no body).
        (vec!["-H", "Content-Type: text/plain", "--data-binary", "SELECT 1 / 0"], 400, "division by zero"),
        (vec!["-H", "Origin: http://evil.example", "--data-binary", "SELECT 1"], 403, "other sites"),
        (
            vec!["-H", "Content-Type: text/plain", "-H", "Accept: image/png", "--data-binary", "SELECT 1"],
            406,
            "image/png",
        ),
        (vec!["-H", "Content-Type: application/json", "--data-binary", "{\"sql\": 1}"], 400, "\"sql\""),
        (vec!["-H", "Content-Type: application/json", "--data-binary", "{oops"], 400, "not JSON"),
        // A misspelt key or URL parameter is refused, not ignored.
        (
            vec!["-H", "Content-Type: application/json", "--data-binary", r#"{"sql": "SELECT 1", "setting": {}}"#],
            400,
            "\"setting\", which this API does not take",
        ),
        (vec!["-H", "Content-Type: text/plain", "--data-binary", "SELEC 1"], 400, "error"),
        (vec!["-H", "Content-Type: text/plain", "--data-binary", "SELECT * FROM nosuch"], 400, "nosuch"),
        (
            vec!["-H", "Content-Type: text/plain", "-H", "Origin: http://evil.example", "--data-binary", "SELECT 1"],
            403,
            "other sites",
        ),
        (vec!["-H", "Content-Type: text/plain", "--data-binary", "SELECT 1", "-u", "default:x"], 401, "wrong password"),
    ];
    for (args, want, says) in cases {
        let (code, body) = curl(&[&args[..], &[&query]].concat());
        assert_eq!(code, want, "{args:?}: {body}");
        let parsed: serde_json::Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{body}: {e}"));
        assert!(parsed["error"].as_str().unwrap_or("").contains(says), "{args:?}: {body}");
    }
    for (params, says) in
        [("distributed_group_by_no_merge=abc", "distributed_group_by_no_merge"), ("nosuch_setting=1", "nosuch_setting")]
    {
        let (code, body) = curl(&[&sql_body[..], &["SELECT 1", &format!("{query}?{params}")]].concat());
        assert_eq!(code, 400, "{params}: {body}");
        let parsed: serde_json::Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{body}: {e}"));
        let error = parsed["error"].as_str().unwrap_or("");
        assert!(error.starts_with("URL parameters") && error.contains(says), "{params}: {body}");
    }

    let (code, body) = curl(&[&format!("{base}/health")]);
    assert_eq!((code, body.as_str()), (200, "{\"rank\":0,\"status\":\"ok\"}"));
    let (code, body) = curl(&[&format!("{base}/metrics")]);
    assert_eq!(code, 200);
    assert!(body.contains("# TYPE shardwise_queries_total counter"), "{body}");
    assert!(body.contains("shardwise_node_up{rank=\"0\",role=\"master\"} 1"), "{body}");
    // A scrape's own statements are not queries the node ran for its clients: scraping again
    // leaves the count where it was (each scrape added two).
    let finished = |body: &str| {
        body.lines().find(|l| l.starts_with("shardwise_queries_total{state=\"finished\"}")).map(str::to_string)
    };
    let (_, again) = curl(&[&format!("{base}/metrics")]);
    assert_eq!(finished(&again), finished(&body), "{again}");
    let (code, body) = curl(&[&format!("{base}/")]);
    assert_eq!(code, 200);
    assert!(body.contains("<title>shardwise status</title>"), "{body}");
    // Unknown paths and methods answer with the same JSON error body.
    for (args, want, says) in [
        (vec![format!("{base}/nosuch")], 404, "no such path: GET /nosuch"),
        (vec![query.clone()], 405, "/query does not take GET"),
    ] {
        let (code, body) = curl(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(code, want, "{args:?}: {body}");
        let parsed: serde_json::Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{body}: {e}"));
        assert!(parsed["error"].as_str().unwrap_or("").contains(says), "{args:?}: {body}");
    }
}

#[test]
fn status_page_in_headless_chromium() {
    let dir = tempdir();
    let (_nodes, lines) = two_nodes(dir.path(), None);
    let flight = flight_addr(&lines[0]);
    sql_csv(&flight, "CREATE TABLE page_events (id BIGINT, kind VARCHAR) WITH (shard_key = 'id', replicas = 2)")
        .unwrap();
    sql_csv(&flight, "INSERT INTO page_events VALUES (1, 'click'), (2, 'view'), (3, 'view')").unwrap();
    let url = format!("http://{}/", listening_addr(&lines[1], "http"));

    let profile = dir.path().join("chromium-profile");
    let mut c = tool("SHARDWISE_TEST_CHROMIUM", "chromium", "scripts/test installs Debian's chromium");
    c.args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(["--virtual-time-budget=5000", "--dump-dom", &url]);
    let out = run_with_timeout(c, Duration::from_secs(120));
    let (dom, stderr) = text(&out);
    assert!(dom.contains("data-loaded=\"true\""), "the page's script did not finish: {dom}\n{stderr}");
    // Both nodes, by their addresses, and their state.
    let nodes = section(&dom, "nodes-table");
    for line in &lines {
        assert!(nodes.contains(&listening_addr(line, "pg")), "{nodes}");
    }
    assert_eq!(nodes.matches("<td class=\"good\">up</td>").count(), 2, "{nodes}");
    // The table, its placement (2 shards x 2 replicas) and no errors.
    assert!(section(&dom, "tables-table").contains("page_events"), "{dom}");
    assert_eq!(section(&dom, "shards-table").matches("page_events").count(), 4, "{dom}");
    assert!(dom.contains("<div id=\"error\"></div>"), "{dom}");
}

/// The HTML of the `<table id=ID>` in `dom`.
fn section<'a>(dom: &'a str, id: &str) -> &'a str {
    let start = dom.find(&format!("<table id=\"{id}\"")).unwrap_or_else(|| panic!("no table {id} in {dom}"));
    let end = dom[start..].find("</table>").map_or(dom.len(), |e| start + e);
    &dom[start..end]
}

/// psql's `\copy ... FROM pstdin` while its data is still coming: the COPY is `running` in
/// `system.queries` from its start (it holds its data until the end), and `KILL QUERY` stops it,
/// nothing stored, the client told why.
#[test]
fn a_copy_whose_data_is_arriving_is_shown_and_can_be_killed() {
    use std::io::Write;

    let dir = tempdir();
    let (_nodes, lines) = two_nodes(dir.path(), None);
    let pg0 = listening_addr(&lines[0], "pg");
    let sql = |statement: &str| {
        let mut c = psql(&pg0, "default", "shardwise");
        c.args(["-c", statement]);
        let out = run_with_timeout(c, T);
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{statement}: {stderr}");
        stdout.trim().to_string()
    };
    sql("CREATE TABLE cp (id BIGINT) WITH (shard_key = 'id')");
    // A `\copy cp FROM pstdin` that has sent `first` and waits for the rest of its data.
    let copy_begun = |first: &[u8]| {
        let mut c = psql(&pg0, "default", "shardwise");
        c.args(["-c", "\\copy cp FROM pstdin"]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut c = c.spawn().expect("psql");
        let mut data = c.stdin.take().expect("stdin");
        data.write_all(first).expect("write");
        data.flush().expect("flush");
        (c, data)
    };
    let (copying, data) = copy_begun(b"1\n2\n3\n");
    let running = "SELECT query_id FROM system.queries WHERE query = 'COPY cp FROM STDIN' AND state = 'running'";
    let id = eventually(T, "the COPY to be shown as running", || Some(sql(running)).filter(|id| !id.is_empty()));
    sql(&format!("KILL QUERY WHERE query_id = '{id}'"));
    drop(data);
    let out = copying.wait_with_output().expect("psql ends");
    let (_, stderr) = text(&out);
    assert!(
        !out.status.success() && stderr.contains("KILL QUERY") && stderr.contains("nothing was stored"),
        "{stderr}"
    );
    assert_eq!(sql(&format!("SELECT state FROM system.queries WHERE query_id = '{id}'")), "killed");
    assert_eq!(sql("SELECT count(*) FROM cp"), "0");
    // A COPY that is not stopped is recorded as it ends, under the same entry.
    let mut c = psql(&pg0, "default", "shardwise");
    c.args(["-c", "\\copy cp FROM pstdin"]).stdin(Stdio::piped());
    let mut c = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("psql");
    c.stdin.take().expect("stdin").write_all(b"4\n5\n").expect("write");
    let out = c.wait_with_output().expect("psql ends");
    assert!(out.status.success(), "{}", text(&out).1);
    let finished = "SELECT count(*) FROM system.queries WHERE query = 'COPY cp FROM STDIN' AND state = 'finished'";
    assert_eq!((sql(finished).as_str(), sql("SELECT count(*) FROM cp").as_str()), ("1", "2"));

    // The rows go to the table the COPY began on (whose columns the client was told): renamed
    // while they arrive, they follow it; dropped and made again, the COPY fails, storing nothing.
    // They used to go to whatever table had the name when the data ended.
    let copy_around = |ddl: &[&str]| {
        let (c, mut data) = copy_begun(b"10\n11\n");
        let running = "SELECT count(*) FROM system.queries WHERE query = 'COPY cp FROM STDIN' AND state = 'running'";
        eventually(T, "the COPY to be running", || (sql(running) == "1").then_some(()));
        for statement in ddl {
            sql(statement);
        }
        data.write_all(b"12\n").expect("write");
        drop(data);
        c.wait_with_output().expect("psql ends")
    };
    let out = copy_around(&["RENAME TABLE cp TO cp_old", "CREATE TABLE cp (id BIGINT) WITH (shard_key = 'id')"]);
    assert!(out.status.success(), "{}", text(&out).1);
    assert_eq!((sql("SELECT count(*) FROM cp_old").as_str(), sql("SELECT count(*) FROM cp").as_str()), ("5", "0"));
    let out = copy_around(&["DROP TABLE cp", "CREATE TABLE cp (id BIGINT) WITH (shard_key = 'id')"]);
    let (_, stderr) = text(&out);
    assert!(!out.status.success() && stderr.contains("dropped, or dropped and created again"), "{stderr}");
    assert_eq!(sql("SELECT count(*) FROM cp"), "0");
}
