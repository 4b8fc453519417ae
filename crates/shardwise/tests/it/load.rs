//! `shardwise load` against real nodes: CSV with reordered columns, NULLs and a quoted multi-line
//! field; an idempotent re-run; a malformed file refused with its line and column and nothing
//! written; an unknown table; NDJSON and a header-only file.

use std::time::Duration;

use crate::support::*;
use crate::tables::{Cluster, one};

fn load(addr: &str, table: &str, file: &std::path::Path, extra: &[&str]) -> std::process::Output {
    let mut c = shardwise();
    c.args(["load", "--connect", addr, table]).arg(file).args(extra);
    run_with_timeout(c, Duration::from_secs(60))
}

#[test]
fn load_checks_everything_and_is_exactly_once() {
    let c = Cluster::start(2);
    c.sql(
        0,
        "CREATE TABLE t (id BIGINT, qty TINYINT, name VARCHAR, amount DECIMAL(10,2), ts TIMESTAMP) \
         WITH (shard_key = 'id', sync_mode = 'delay_mode_distributed', delay_max_ms = 20)",
    );
    let dir = tempdir();
    let good = dir.path().join("good.csv");
    std::fs::write(
        &good,
        "name,id,qty,amount,ts\n\"two\nlines\",1,5,1.50,2026-01-01T00:00:00\nb,2,,2.25,\nc,3,-7,,2026-01-02T03:04:05\n",
    )
    .unwrap();
    for _ in 0..2 {
        let out = load(&c.addrs[1], "t", &good, &["--insert-id", "L1"]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.starts_with("loaded 3 rows into t in "), "{stdout}");
    }
    c.sql(0, "SYSTEM FLUSH DISTRIBUTED t");
    assert_eq!(
        c.sql(0, "SELECT id, qty, replace(name, chr(10), '|'), amount, ts IS NULL FROM t ORDER BY id"),
        vec![
            vec!["1", "5", "two|lines", "1.50", "false"],
            vec!["2", "", "b", "2.25", "true"],
            vec!["3", "-7", "c", "", "false"],
        ]
    );

    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "id,qty\n10,1\n11,2\n12,300\n13,4\n").unwrap();
    let out = load(&c.addrs[0], "t", &bad, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("bad.csv line 4, column 2 \"qty\""), "{stderr}");
    assert!(stderr.contains("nothing was sent"), "{stderr}");

    let out = load(&c.addrs[0], "nope", &good, &[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope"));

    let json = dir.path().join("rows.ndjson");
    std::fs::write(&json, "{\"id\": 20, \"name\": \"j\"}\n{\"id\": 21, \"qty\": 3}\n").unwrap();
    let out = load(&c.addrs[0], "t", &json, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let empty = dir.path().join("empty.csv");
    std::fs::write(&empty, "id,qty\n").unwrap();
    let out = load(&c.addrs[0], "t", &empty, &[]);
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("loaded 0 rows"));

    c.sql(1, "SYSTEM FLUSH DISTRIBUTED t");
    assert_eq!(one(c.sql(1, "SELECT count(*), sum(id) FROM t")), vec!["5".to_string(), "47".to_string()]);
}
