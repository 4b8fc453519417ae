//! `CHECK TABLE` on real node processes: replicas that agree pass; a replica whose files were
//! lost fails, and so does the replica it is compared with (two replicas, no majority); a node
//! that does not answer has its replicas reported as not read, and so does a running node whose
//! files were removed from under it.

use std::time::Duration;

use crate::tables::{Cluster, one};

/// The detailed answer, one `[shard, replica, rank, rows, checksum, is_passed, message...]` per
/// replica (the message is split at its commas).
fn detailed(c: &Cluster, rank: usize, extra: &str) -> Vec<Vec<String>> {
    c.sql(rank, &format!("CHECK TABLE ck SETTINGS check_query_single_value_result = 0{extra}"))
}

#[test]
fn check_table_compares_every_shards_replicas() {
    let mut c = Cluster::start(3);
    c.sql(0, "CREATE TABLE ck (id BIGINT, name VARCHAR) WITH (shard_key = 'id', replicas = 2)");
    c.sql(1, "INSERT INTO ck SELECT value, 'n' || value FROM generate_series(1, 300)");
    assert_eq!(c.sql(2, "CHECK TABLE ck"), [["1"]]);
    let rows = detailed(&c, 0, "");
    assert_eq!(rows.len(), 6, "{rows:?}");
    let total: u64 = rows.iter().map(|r| r[3].parse::<u64>().expect("rows")).sum();
    assert_eq!(total, 600, "every row on two replicas: {rows:?}");
    for pair in rows.chunks(2) {
        assert_eq!(pair[0][0], pair[1][0], "shard order: {rows:?}");
        assert_eq!(pair[0][4], pair[1][4], "a shard's replicas have one checksum: {rows:?}");
        assert!(pair.iter().all(|r| r[5] == "true"), "{rows:?}");
    }

    // Rank 2 loses its files of the table (a replaced disk): its replicas come back empty.
    let ids = one(c.sql(0, "SELECT id, generation FROM system.tables WHERE name = 'ck'"));
    c.procs[2].kill9();
    let dir = c.data_dir(2).join("tables").join(format!("t{}-g{}", ids[0], ids[1]));
    std::fs::remove_dir_all(&dir).expect("remove rank 2's replicas");
    c.restart(2);
    assert_eq!(c.sql(0, "CHECK TABLE ck"), [["0"]]);
    let rows = detailed(&c, 1, "");
    for r in &rows {
        let on_rank_2 = rows.iter().any(|o| o[0] == r[0] && o[2] == "2");
        // Two replicas that differ: neither passes, each names what the other has.
        assert_eq!(r[5], if on_rank_2 { "false" } else { "true" }, "{rows:?}");
        if on_rank_2 {
            let message = r[6..].join(",");
            assert!(message.contains("no majority"), "{message}");
            if r[2] != "2" {
                assert!(message.contains("rank 2 has 0 rows"), "{message}");
            }
        }
    }
    assert_eq!(rows.iter().filter(|r| r[2] == "2").map(|r| r[3].as_str()).collect::<Vec<_>>(), ["0", "0"]);

    // A node that does not answer: its replicas are not read, said as such, within the timeout.
    c.procs[2].signal("STOP");
    let started = std::time::Instant::now();
    let rows = detailed(&c, 0, ", check_timeout_ms = 500");
    assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());
    for r in rows.iter().filter(|r| r[2] == "2") {
        assert_eq!((r[3].as_str(), r[5].as_str()), ("", "false"), "{rows:?}");
        assert!(r[6..].join(",").contains("did not answer within check_timeout_ms"), "{rows:?}");
    }
    c.procs[2].signal("CONT");

    // Timeouts as long as a u64 of milliseconds holds are waits, not a panic in the gRPC layer.
    let huge = "18446744073709551615";
    c.sql(0, &format!("SYSTEM FLUSH DISTRIBUTED ck SETTINGS flush_timeout_ms = {huge}"));
    assert_eq!(c.sql(1, &format!("CHECK TABLE public.ck SETTINGS check_timeout_ms = {huge}")), [["0"]]);

    // Rank 0's WAL files of the table removed while it runs: its memory still holds the rows,
    // which it would not find at its next start; the check says so.
    let table_dir = c.data_dir(0).join("tables").join(format!("t{}-g{}", ids[0], ids[1]));
    for shard in std::fs::read_dir(&table_dir).expect("rank 0's replicas") {
        for segment in std::fs::read_dir(shard.expect("a replica").path().join("wal")).expect("its WAL") {
            std::fs::remove_file(segment.expect("a segment").path()).expect("remove a segment");
        }
    }
    let rows = detailed(&c, 1, "");
    for r in rows.iter().filter(|r| r[2] == "0") {
        assert_eq!(r[5], "false", "{rows:?}");
        assert!(r[6..].join(",").contains("files of its replica are gone"), "{rows:?}");
    }

    let err = c.sql_err(0, "CHECK TABLE nosuch");
    assert!(err.contains("nosuch"), "{err}");
    let err = c.sql_err(0, "CHECK TABLE");
    assert!(err.contains("expected CHECK TABLE <table>"), "{err}");
    c.procs[2].drain(Duration::from_millis(100));
}
