//! `REPAIR TABLE` on real node processes: damaged replicas are rebuilt from the others; replicas
//! whose files were lost (two replicas that differ, no majority) only when their rank is named;
//! and a rebuild while writers insert into both sync modes keeps every acknowledged row exactly
//! once on every replica.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use crate::support::*;
use crate::tables::{Cluster, one};

/// `REPAIR TABLE`'s answer, one `[shard, replica, rank, action, source_rank, rows, message...]`
/// per replica.
fn repair(c: &Cluster, rank: usize, sql: &str) -> Vec<Vec<String>> {
    let rows = c.sql(rank, sql);
    assert!(rows.iter().all(|r| r.len() >= 7), "{rows:?}");
    rows
}

/// The replicas `rows` say were rebuilt: (shard, rank, source rank).
fn rebuilt(rows: &[Vec<String>]) -> Vec<(String, String, String)> {
    rows.iter().filter(|r| r[3] == "rebuilt").map(|r| (r[0].clone(), r[2].clone(), r[4].clone())).collect()
}

/// Flips a bit early in every WAL segment of the table directories under `dir`.
fn damage_wals(dir: &std::path::Path) -> usize {
    let mut damaged = 0;
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            damaged += damage_wals(&path);
        } else if path.parent().is_some_and(|p| p.ends_with("wal")) && path.extension().is_some_and(|e| e == "log") {
            let mut bytes = std::fs::read(&path).expect("read segment");
            if bytes.len() > 200 {
                bytes[100] ^= 0x10;
                std::fs::write(&path, &bytes).expect("write segment");
                damaged += 1;
            }
        }
    }
    damaged
}

#[test]
fn repair_table_rebuilds_damaged_and_lost_replicas_exactly_once() {
    let mut c = Cluster::start(3);
    c.sql(
        0,
        "CREATE TABLE rp (id BIGINT, v VARCHAR) WITH (shard_key = 'id', replicas = 2, \
         sync_mode = 'delay_mode_distributed', delay_max_ms = 50)",
    );
    c.sql(0, "CREATE TABLE rpi (id BIGINT, v VARCHAR) WITH (shard_key = 'id', replicas = 2)");
    for i in 0..10 {
        for table in ["rp", "rpi"] {
            let (first, last) = (i * 100, i * 100 + 99);
            c.sql(
                i as usize % 3,
                &format!("INSERT INTO {table} SELECT value, 'v' || value FROM generate_series({first}, {last})"),
            );
        }
    }
    c.sql(0, "SYSTEM FLUSH DISTRIBUTED rp");
    let counts = |c: &Cluster, table: &str, total: i64| {
        for rank in 0..3 {
            let got = one(c.sql(rank, &format!("SELECT count(*), count(DISTINCT id) FROM {table}")));
            assert_eq!(got, [total.to_string(), total.to_string()], "{table} through rank {rank}");
        }
    };
    // Nothing to do: every replica passes, and is said to.
    let rows = repair(&c, 1, "REPAIR TABLE rp");
    assert_eq!(rows.len(), 6, "{rows:?}");
    assert!(rows.iter().all(|r| r[3] == "none" && r[4].is_empty()), "{rows:?}");

    // Rank 2's WALs damaged: its replicas are kept out of reads, and rebuilt from the others.
    let ids = one(c.sql(0, "SELECT id, generation FROM system.tables WHERE name = 'rp'"));
    let table_dir = |c: &Cluster, rank: u32| c.data_dir(rank).join("tables").join(format!("t{}-g{}", ids[0], ids[1]));
    c.procs[2].kill9();
    assert!(damage_wals(&table_dir(&c, 2)) > 0, "rank 2 holds WAL segments of rp");
    c.restart(2);
    assert_eq!(c.sql(0, "CHECK TABLE rp"), [["0"]]);
    let rows = repair(&c, 0, "REPAIR TABLE rp");
    let mut done = rebuilt(&rows);
    done.sort();
    assert_eq!(done.len(), 2, "{rows:?}");
    for (shard, rank, source) in &done {
        assert_eq!(rank, "2", "{rows:?}");
        assert!(source != "2" && !source.is_empty(), "{rows:?}");
        let message = rows.iter().find(|r| &r[0] == shard && r[2] == "2").map(|r| r[6..].join(","));
        assert!(message.is_some_and(|m| m.contains("was: ")), "{rows:?}");
    }
    assert_eq!(c.sql(1, "CHECK TABLE rp"), [["1"]]);
    let problems = "SELECT count(*) FROM system.shards WHERE \"table\" = 'rp' AND problem IS NOT NULL";
    assert_eq!(one(c.sql(2, problems)), ["0"]);
    counts(&c, "rp", 1000);
    // The rebuilt replicas are what rank 2 opens after a restart too.
    c.procs[2].kill9();
    c.restart(2);
    assert_eq!(c.sql(2, "CHECK TABLE rp"), [["1"]]);

    // Rank 0's files of one replica removed while it runs (its memory still holds the rows): a
    // rebuild that cannot finish (a directory stands where the swap moves the old replica)
    // leaves the replica as it was, served from memory, not reopened from what is left of its
    // files; the next REPAIR rebuilds it.
    let shard_dir = std::fs::read_dir(table_dir(&c, 0)).expect("rank 0's replicas").next().expect("one").expect("dir");
    std::fs::remove_dir_all(shard_dir.path()).expect("remove a replica of rank 0");
    let in_the_way = shard_dir.path().with_extension("replaced");
    std::fs::create_dir_all(in_the_way.join("x")).expect("a directory in the way");
    let rows = repair(&c, 1, "REPAIR TABLE rp");
    let _ = std::fs::remove_dir_all(&in_the_way);
    let tried: Vec<&Vec<String>> = rows.iter().filter(|r| r[2] == "0" && r[3] == "failed").collect();
    assert_eq!(tried.len(), 1, "{rows:?}");
    // Through rank 0, `nearest` (the default) reads rank 0's replicas.
    assert_eq!(one(c.sql(0, "SELECT count(*) FROM rp")), ["1000"], "rank 0's replica still serves its rows");
    let err = c.sql_err(1, "REPAIR TABLE rp SETTINGS repair_timeout_ms = 0");
    assert!(err.contains("repair_timeout_ms = 0") && err.contains("from 1"), "{err}");
    let rows = repair(&c, 1, "REPAIR TABLE rp");
    assert_eq!(rebuilt(&rows).len(), 1, "{rows:?}");
    assert_eq!(c.sql(0, "CHECK TABLE rp"), [["1"]]);

    // A flipped byte in the middle of the last record of a WAL of rank 1: its recovery cuts the
    // record (whole, but failing its checksum: a torn write or damage) and the replica opens
    // without its rows. The check calls it suspect, and REPAIR rebuilds it from its partner
    // without being told which rank to trust.
    c.sql(0, "CREATE TABLE rs (id BIGINT, v VARCHAR) WITH (shard_key = 'id', replicas = 2)");
    c.sql(2, "INSERT INTO rs SELECT value, 'v' || value FROM generate_series(1, 3000)");
    let ids_s = one(c.sql(0, "SELECT id, generation FROM system.tables WHERE name = 'rs'"));
    c.procs[1].kill9();
    let rs_dir = c.data_dir(1).join("tables").join(format!("t{}-g{}", ids_s[0], ids_s[1]));
    let shard = std::fs::read_dir(&rs_dir).expect("rank 1's replicas of rs").next().expect("one").expect("dir");
    let segment = std::fs::read_dir(shard.path().join("wal")).expect("its WAL").flatten().map(|e| e.path());
    let segment = segment.max_by_key(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)).expect("a segment");
    let mut bytes = std::fs::read(&segment).expect("read the segment");
    let middle = bytes.iter().rposition(|b| *b != 0).expect("a record") / 2 + 64;
    bytes[middle] ^= 0xff;
    std::fs::write(&segment, &bytes).expect("write the segment");
    c.restart(1);
    let rows = eventually(Duration::from_secs(10), "rank 1's replica read", || {
        let rows = c.sql(0, "CHECK TABLE rs SETTINGS check_query_single_value_result = 0");
        rows.iter().any(|r| r[6..].join(",").contains("suspect")).then_some(rows)
    });
    assert!(rows.iter().any(|r| r[2] == "1" && r[5] == "false"), "{rows:?}");
    let rows = repair(&c, 0, "REPAIR TABLE rs");
    let done = rebuilt(&rows);
    assert_eq!(done.len(), 1, "{rows:?}");
    assert_eq!(done[0].1, "1", "{rows:?}");
    assert_eq!(c.sql(2, "CHECK TABLE rs"), [["1"]]);
    counts(&c, "rs", 3000);

    // Rank 1 loses its table files (a replaced disk): its replicas come back empty, and with two
    // replicas nothing says which of a pair is right. Left as they are, unless rank 1 is named.
    c.procs[1].kill9();
    std::fs::remove_dir_all(table_dir(&c, 1)).expect("remove rank 1's replicas");
    c.restart(1);
    let rows = repair(&c, 0, "REPAIR TABLE rp");
    assert!(rebuilt(&rows).is_empty(), "{rows:?}");
    let left: Vec<&Vec<String>> = rows.iter().filter(|r| r[3] == "left").collect();
    assert_eq!(left.len(), 4, "rank 1's two replicas and their partners: {rows:?}");
    assert!(left.iter().all(|r| r[6..].join(",").contains("repair_rebuild_rank")), "{rows:?}");
    assert_eq!(c.sql(0, "CHECK TABLE rp"), [["0"]]);
    let err = c.sql_err(0, "REPAIR TABLE rp SETTINGS repair_rebuild_rank = 9");
    assert!(err.contains("repair_rebuild_rank = 9: the cluster's ranks are 0 to 2"), "{err}");
    let err = c.sql_err(0, "REPAIR TABLE nosuch");
    assert!(err.contains("nosuch"), "{err}");
    let err = c.sql_err(0, "REPAIR TABLE rp PARTITION 1");
    assert!(err.contains("expected REPAIR TABLE <table>"), "{err}");
    let rows = repair(&c, 2, "REPAIR TABLE rp SETTINGS repair_rebuild_rank = 1");
    let done = rebuilt(&rows);
    assert_eq!(done.len(), 2, "{rows:?}");
    assert!(done.iter().all(|(_, rank, _)| rank == "1"), "{rows:?}");
    // Their partners were the copies: kept, and said so.
    let kept: Vec<&Vec<String>> =
        rows.iter().filter(|r| r[6..].join(",").contains("kept: the copy for rank 1")).collect();
    assert_eq!(kept.len(), 2, "{rows:?}");
    assert!(kept.iter().all(|r| r[3] == "none"), "{rows:?}");
    assert!(rows.iter().all(|r| r[3] != "failed"), "{rows:?}");
    assert_eq!(c.sql(0, "CHECK TABLE rp"), [["1"]]);
    counts(&c, "rp", 1000);

    // Rank 2 loses both tables' files again; they are rebuilt while writers insert through
    // ranks 0 and 1, into the delayed table and into the immediate one with a quorum of one
    // (a fenced replica's pieces are handed off). Every acknowledged row is then on every
    // replica once.
    let ids_i = one(c.sql(0, "SELECT id, generation FROM system.tables WHERE name = 'rpi'"));
    c.procs[2].kill9();
    std::fs::remove_dir_all(table_dir(&c, 2)).expect("remove rank 2's rp");
    std::fs::remove_dir_all(c.data_dir(2).join("tables").join(format!("t{}-g{}", ids_i[0], ids_i[1])))
        .expect("remove rank 2's rpi");
    c.restart(2);
    let stop = AtomicBool::new(false);
    let next_id = AtomicI64::new(1_000_000);
    let acked = AtomicI64::new(0);
    std::thread::scope(|scope| {
        for writer in 0..2usize {
            let (addr, stop, next_id, acked) = (c.addrs[writer].clone(), &stop, &next_id, &acked);
            scope.spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let first = next_id.fetch_add(5, Ordering::SeqCst);
                    let values: Vec<String> = (first..first + 5).map(|id| format!("({id}, 'w')")).collect();
                    let values = values.join(", ");
                    let sql = format!(
                        "INSERT INTO rp VALUES {values}; INSERT INTO rpi VALUES {values} SETTINGS insert_quorum = 1"
                    );
                    sql_csv(&addr, &sql).unwrap_or_else(|e| panic!("writer {writer}: {e}"));
                    acked.fetch_add(5, Ordering::SeqCst);
                }
            });
        }
        std::thread::sleep(Duration::from_millis(300));
        for table in ["rp", "rpi"] {
            let rows = repair(&c, 0, &format!("REPAIR TABLE {table} SETTINGS repair_rebuild_rank = 2"));
            let done = rebuilt(&rows);
            assert_eq!(done.len(), 2, "{table}: {rows:?}");
            assert!(done.iter().all(|(_, rank, _)| rank == "2"), "{table}: {rows:?}");
        }
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, Ordering::SeqCst);
    });
    let written = acked.load(Ordering::SeqCst);
    assert!(written > 0, "the writers inserted while the replicas were rebuilt");
    c.sql(0, "SYSTEM FLUSH DISTRIBUTED rp");
    c.sql(0, "SYSTEM FLUSH DISTRIBUTED rpi");
    for table in ["rp", "rpi"] {
        let check = eventually(Duration::from_secs(30), "held-back rows delivered", || {
            let rows = c.sql(1, &format!("CHECK TABLE {table}"));
            (rows == [["1"]]).then_some(rows)
        });
        assert_eq!(check, [["1"]]);
        counts(&c, table, 1000 + written);
    }

    // A node that does not answer: the repair stops within its timeout, naming it; and as soon
    // as the membership takes it for down, not at the end of the default ten minutes.
    c.procs[2].signal("STOP");
    let started = std::time::Instant::now();
    let err = c.sql_err(0, "REPAIR TABLE rp SETTINGS repair_timeout_ms = 500");
    assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());
    assert!(err.contains("rank 2") && (err.contains("repair_timeout_ms") || err.contains("went down")), "{err}");
    c.procs[2].signal("CONT");
    c.sql(0, "SYSTEM FLUSH DISTRIBUTED rp");
    c.procs[2].signal("STOP");
    let started = std::time::Instant::now();
    let err = c.sql_err(0, "REPAIR TABLE rp");
    assert!(started.elapsed() < Duration::from_secs(30), "{:?}: {err}", started.elapsed());
    assert!(err.contains("rank 2") && err.contains("down"), "{err}");
    c.procs[2].signal("CONT");
    c.procs[2].drain(Duration::from_millis(100));
}

/// The statements that may take long (a flush waiting for a stopped node here) run as queries
/// do: listed in `system.queries` while they run, stopped by `KILL QUERY` or at
/// `max_execution_time_ms`, their end recorded.
#[test]
fn long_commands_are_listed_killable_and_bounded() {
    let c = Cluster::start(3);
    c.sql(0, "CREATE TABLE fk (id BIGINT) WITH (shard_key = 'id', replicas = 2, sync_mode = 'delay_mode_distributed')");
    c.procs[2].signal("STOP");
    c.sql(1, "INSERT INTO fk SELECT value FROM generate_series(1, 100)");
    let state = |id: &str| c.sql(1, &format!("SELECT state FROM system.queries WHERE query_id = '{id}'"));
    std::thread::scope(|scope| {
        let addr = c.addrs[1].clone();
        let flush = scope.spawn(move || sql_csv(&addr, "SYSTEM FLUSH DISTRIBUTED fk SETTINGS query_id = 'fl-1'"));
        eventually(Duration::from_secs(10), "the flush listed as running", || {
            (state("fl-1") == [["running"]]).then_some(())
        });
        c.sql(1, "KILL QUERY WHERE query_id = 'fl-1'");
        let err = flush.join().expect("flush thread").expect_err("a killed flush fails");
        assert!(err.contains("stopped by KILL QUERY") && err.contains("still delivered in the background"), "{err}");
    });
    assert_eq!(state("fl-1"), [["killed"]]);
    let started = std::time::Instant::now();
    let err = c.sql_err(1, "SYSTEM FLUSH DISTRIBUTED fk SETTINGS max_execution_time_ms = 300, query_id = 'fl-2'");
    assert!(err.contains("ran longer than max_execution_time_ms = 300"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    assert_eq!(state("fl-2"), [["timed_out"]]);
    c.procs[2].signal("CONT");
    c.sql(1, "SYSTEM FLUSH DISTRIBUTED fk SETTINGS query_id = 'fl-3'");
    assert_eq!(state("fl-3"), [["finished"]]);
    let rows = c.sql(1, "CHECK TABLE fk SETTINGS query_id = 'ck-1'");
    assert_eq!(rows, [["1"]]);
    assert_eq!(c.sql(1, "SELECT state, result_rows FROM system.queries WHERE query_id = 'ck-1'"), [["finished", "1"]]);
}
