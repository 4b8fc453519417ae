//! A worker whose whole data dir was lost, replaced by a node on an empty one
//! (`shardwise node --replace-node <id>`): refused without the flag, admitted with it, its
//! replicas fenced until rebuilt (reads through it never answer from its empty replicas), then
//! rebuilt by the node itself while a writer keeps inserting; the lost node, back, is refused.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::support::*;
use crate::tables::{Cluster, one};

#[test]
fn a_node_on_an_empty_data_dir_takes_a_lost_nodes_rank_and_rebuilds_its_replicas() {
    let mut c = Cluster::start(3);
    c.sql(
        0,
        "CREATE TABLE d (id BIGINT, v BIGINT) WITH (shard_key = 'id', replicas = 2, \
         sync_mode = 'delay_mode_distributed', delay_max_ms = 100)",
    );
    c.sql(0, "CREATE TABLE i (id BIGINT, v BIGINT) WITH (shard_key = 'id', replicas = 2)");
    c.sql(0, "CREATE TABLE solo (id BIGINT) WITH (shard_key = 'id')");
    for table in ["d", "i", "solo"] {
        c.sql(
            1,
            &format!(
                "INSERT INTO {table} SELECT value{} FROM generate_series(1, 3000)",
                match table {
                    "solo" => "",
                    _ => ", value * 2",
                }
            ),
        );
    }
    c.sql(0, "SYSTEM FLUSH DISTRIBUTED d");
    let old = one(c.sql(0, "SELECT node_id FROM system.nodes WHERE rank = 2"))[0].clone();
    let solo_on_2: u64 = one(c.sql(2, "SELECT sum(rows) FROM system.shards WHERE \"table\" = 'solo' AND rank = 2"))[0]
        .parse()
        .expect("rows");
    assert!(solo_on_2 > 0);

    // Rank 2's disk is gone.
    c.procs[2].kill9();
    std::fs::remove_dir_all(c.data_dir(2)).expect("remove rank 2's data dir");
    let (code, out) = c.spawn_node(2, &[]).wait_exit(Duration::from_secs(40));
    assert_ne!(code, Some(0));
    assert!(out.contains(&format!("--replace-node {old}")), "{out}");
    std::fs::remove_dir_all(c.data_dir(2)).expect("remove the refused data dir");

    // A writer into the delayed table all along, counting what was acknowledged.
    let stop = AtomicBool::new(false);
    let acked = AtomicU64::new(0);
    /// Stops the writer however the scope ends (a failed assertion must not leave it running,
    /// which would hold the scope open for ever).
    struct StopOnDrop<'a>(&'a AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    std::thread::scope(|scope| {
        let _stop_writer = StopOnDrop(&stop);
        let addr = c.addrs[0].clone();
        let (stop, acked) = (&stop, &acked);
        scope.spawn(move || {
            let mut next = 100_000i64;
            while !stop.load(Ordering::SeqCst) {
                let rows: Vec<String> = (next..next + 20).map(|id| format!("({id}, 0)")).collect();
                if sql_csv(&addr, &format!("INSERT INTO d VALUES {}", rows.join(", "))).is_ok() {
                    acked.fetch_add(20, Ordering::SeqCst);
                }
                next += 20;
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        // Rank 1 stopped: a rebuild needs every node (their queued rows delivered first), so
        // rank 2's replicas await theirs, and its /health says so, until rank 1 is back.
        c.procs[1].signal("STOP");
        c.restart_with(2, &["--replace-node", &old]);
        let listening = c.procs[2].seen.iter().find(|l| l.contains("listening rank=")).cloned().expect("listening");
        let health = health(&listening_addr(&listening, "http"));
        c.procs[1].signal("CONT");
        assert!(health.contains("degraded") && health.contains("await their rebuild"), "{health}");
        // Until its replicas are rebuilt, reads through rank 2 come from the other replicas:
        // never fewer rows than were there (its own replicas are empty).
        eventually(Duration::from_secs(60), "rank 2's replicas rebuilt", || {
            let counted = sql_csv(&c.addrs[2], "SELECT count(*) FROM i").ok().map(one);
            if let Some(row) = &counted {
                assert_eq!(row, &["3000".to_string()], "a read through rank 2 while it rebuilds");
            }
            let check = sql_csv(&c.addrs[0], "CHECK TABLE i").ok()?;
            let awaiting = std::fs::read(c.data_dir(2).join("tables/AWAITING_REBUILD.json")).ok()?;
            let awaiting = String::from_utf8_lossy(&awaiting).to_string();
            (check == [["1"]] && awaiting.contains("\"replicas\": []")).then_some(())
        });
    });
    c.sql(2, "SYSTEM FLUSH DISTRIBUTED d");
    let acked = acked.load(Ordering::SeqCst);
    let want = (3000 + acked).to_string();
    for r in 0..3 {
        for table in ["d", "i"] {
            let expected = if table == "d" { want.clone() } else { "3000".to_string() };
            let got = one(c.sql(
                r,
                &format!("SELECT count(*), count(DISTINCT id) FROM {table} SETTINGS load_balancing = 'in_order'"),
            ));
            assert_eq!(got, [expected.clone(), expected], "{table} through rank {r}");
        }
    }
    assert_eq!(c.sql(0, "CHECK TABLE d"), [["1"]]);
    assert_eq!(c.sql(0, "CHECK TABLE i"), [["1"]]);
    // The shard only rank 2 held is lost with its disk; the others are all there.
    assert_eq!(one(c.sql(0, "SELECT count(*) FROM solo")), [(3000 - solo_on_2).to_string()]);
    // Restarted with the same command line, it is itself; the lost node's id is refused.
    c.procs[2].kill9();
    c.restart_with(2, &["--replace-node", &old]);
    assert_eq!(one(c.sql(2, "SELECT count(*) FROM i")), ["3000"]);
}

/// A node whose disk died often hangs rather than exits, holding its connection to the master:
/// stopped (SIGSTOP) here. Its replacement is admitted once the membership takes it for down,
/// and the stopped process is fenced out.
#[test]
fn a_hung_node_is_replaced_once_the_membership_takes_it_for_down() {
    let mut c = Cluster::start(3);
    c.sql(0, "CREATE TABLE i (id BIGINT) WITH (shard_key = 'id', replicas = 2)");
    c.sql(0, "INSERT INTO i SELECT value FROM generate_series(1, 1000)");
    let old = one(c.sql(0, "SELECT node_id FROM system.nodes WHERE rank = 2"))[0].clone();
    c.procs[2].signal("STOP");
    eventually(Duration::from_secs(20), "rank 2 taken for down", || {
        (one(c.sql(0, "SELECT state FROM system.nodes WHERE rank = 2"))[0] == "down").then_some(())
    });
    let new_dir = c.data_dir(2).with_extension("new");
    let mut p = c.spawn_node_in(2, &new_dir, &["--replace-node", &old]);
    c.addrs[2] = flight_addr(&p.wait_for_line("listening rank=", Duration::from_secs(30)));
    c.procs[2] = p;
    eventually(Duration::from_secs(60), "rank 2's replicas rebuilt", || {
        let check = sql_csv(&c.addrs[0], "CHECK TABLE i").ok()?;
        let through_2 = sql_csv(&c.addrs[2], "SELECT count(*) FROM i").ok()?;
        (check == [["1"]] && through_2 == [["1000"]]).then_some(())
    });
    let id = one(c.sql(0, "SELECT node_id FROM system.nodes WHERE rank = 2"))[0].clone();
    assert_ne!(id, old);
}

/// Two workers lost at once, each replaced: the shard both held has nothing to be rebuilt from.
/// Its rows are lost, and said so; the replicas of every other shard are rebuilt, and the
/// table serves again (it did not stay out of service, retrying for ever).
#[test]
fn two_workers_lost_at_once_lose_only_the_shard_both_held_and_say_so() {
    let mut c = Cluster::start(3);
    c.sql(0, "CREATE TABLE i (id BIGINT) WITH (shard_key = 'id', replicas = 2)");
    c.sql(0, "INSERT INTO i SELECT value FROM generate_series(1, 3000)");
    // Shard s lives on ranks s and s + 1: shard 1 on ranks 1 and 2 only.
    let shard_1: u64 = one(c.sql(0, "SELECT min(rows) FROM system.shards WHERE \"table\" = 'i' AND shard = 1"))[0]
        .parse()
        .expect("rows");
    assert!(shard_1 > 0);
    let ids = c.sql(0, "SELECT node_id FROM system.nodes WHERE rank > 0 ORDER BY rank");
    for rank in [1, 2] {
        c.procs[rank].kill9();
        std::fs::remove_dir_all(c.data_dir(rank as u32)).expect("remove the data dir");
    }
    c.restart_with(1, &["--replace-node", &ids[0][0]]);
    c.restart_with(2, &["--replace-node", &ids[1][0]]);
    let left = (3000 - shard_1).to_string();
    eventually(Duration::from_secs(60), "every replica rebuilt or let go", || {
        let check = sql_csv(&c.addrs[0], "CHECK TABLE i").ok()?;
        let counts: Vec<_> = (0..3).filter_map(|r| sql_csv(&c.addrs[r], "SELECT count(*) FROM i").ok()).collect();
        (check == [["1"]] && counts.len() == 3 && counts.iter().all(|n| n == &[[left.clone()]])).then_some(())
    });
    // Each replacement said so (the one that found it second let its replica go too, rather
    // than copy the first one's, which is no copy of the shard's history).
    let said: Vec<String> = [1, 2]
        .iter()
        .flat_map(|r| {
            c.procs[*r].drain(Duration::from_millis(200));
            c.procs[*r].seen.iter().filter(|l| l.contains("its rows are lost")).cloned().collect::<Vec<_>>()
        })
        .collect();
    assert!(said.iter().any(|l| l.contains("shard=1")), "{said:?}");
}

/// The master's data dir lost: a node on an empty one, given `--replace-node` and the run id,
/// takes rank 0 once every worker has rejoined (one of them restarted meanwhile, so its catalog
/// comes from the copy it keeps on disk), serves the catalog it took from them, rebuilds its own
/// replicas, and takes new tables and rows.
#[test]
fn a_master_on_an_empty_data_dir_takes_the_lost_masters_rank_and_catalog() {
    let mut c = Cluster::start(3);
    c.sql(
        1,
        "CREATE TABLE d (id BIGINT, v BIGINT) WITH (shard_key = 'id', replicas = 2, \
         sync_mode = 'delay_mode_distributed', delay_max_ms = 100)",
    );
    c.sql(1, "CREATE TABLE i (id BIGINT, v BIGINT) WITH (shard_key = 'id', replicas = 2)");
    c.sql(1, "CREATE TABLE solo (id BIGINT) WITH (shard_key = 'id')");
    for table in ["d", "i"] {
        c.sql(1, &format!("INSERT INTO {table} SELECT value, value * 2 FROM generate_series(1, 3000)"));
    }
    c.sql(1, "INSERT INTO solo SELECT value FROM generate_series(1, 3000)");
    c.sql(1, "SYSTEM FLUSH DISTRIBUTED d");
    let old = one(c.sql(1, "SELECT node_id FROM system.nodes WHERE rank = 0"))[0].clone();
    let solo_on_0: u64 = one(c.sql(0, "SELECT sum(rows) FROM system.shards WHERE \"table\" = 'solo' AND rank = 0"))[0]
        .parse()
        .expect("rows");
    assert!(solo_on_0 > 0);
    let run_id = run_id(&c);

    // Rank 0's disk is gone, and rank 2 restarts while there is no master.
    c.procs[0].kill9();
    std::fs::remove_dir_all(c.data_dir(0)).expect("remove rank 0's data dir");
    c.procs[2].kill9();
    let mut rank2 = c.spawn_node(2, &[]);
    let (code, out) = c.spawn_node(0, &["--replace-node", &old]).wait_exit(Duration::from_secs(40));
    assert_ne!(code, Some(0));
    assert!(out.contains("--run-id"), "{out}");
    c.restart_with(0, &["--replace-node", &old, "--run-id", &run_id]);
    c.addrs[2] = flight_addr(&rank2.wait_for_line("listening rank=", Duration::from_secs(60)));
    c.procs[2] = rank2;

    eventually(Duration::from_secs(60), "rank 0's replicas rebuilt", || {
        let counted = sql_csv(&c.addrs[0], "SELECT count(*) FROM i").ok().map(one);
        if let Some(row) = &counted {
            assert_eq!(row, &["3000".to_string()], "a read through rank 0 while it rebuilds");
        }
        let check = sql_csv(&c.addrs[0], "CHECK TABLE i").ok()?;
        let awaiting = std::fs::read(c.data_dir(0).join("tables/AWAITING_REBUILD.json")).ok()?;
        let awaiting = String::from_utf8_lossy(&awaiting).to_string();
        (check == [["1"]] && awaiting.contains("\"replicas\": []")).then_some(())
    });
    assert_eq!(c.sql(0, "CHECK TABLE d"), [["1"]]);
    // New tables and rows, through the new master and a worker.
    c.sql(0, "CREATE TABLE later (id BIGINT) WITH (shard_key = 'id', replicas = 2)");
    c.sql(2, "INSERT INTO later SELECT value FROM generate_series(1, 500)");
    c.sql(0, "INSERT INTO d SELECT value, 0 FROM generate_series(3001, 4000)");
    c.sql(0, "SYSTEM FLUSH DISTRIBUTED d");
    for r in 0..3 {
        for (table, rows) in [("d", "4000"), ("i", "3000"), ("later", "500")] {
            let got = one(c.sql(
                r,
                &format!("SELECT count(*), count(DISTINCT id) FROM {table} SETTINGS load_balancing = 'in_order'"),
            ));
            assert_eq!(got, [rows, rows], "{table} through rank {r}");
        }
    }
    // The shard only the lost master held is lost with its disk.
    assert_eq!(one(c.sql(1, "SELECT count(*) FROM solo")), [(3000 - solo_on_0).to_string()]);
    let id = one(c.sql(2, "SELECT node_id FROM system.nodes WHERE rank = 0"))[0].clone();
    assert_ne!(id, old);
}

/// A worker that took a lost node's rank (`--replace-node`) and has served since, still running
/// when the master's data dir is lost in turn: it rejoins the replacement master as the member
/// it now is. It used to claim its start's replacement on every rejoin, and once another rank
/// had told the new master that rank 2 belongs to the new node, the claim was refused for ever
/// and the cluster never re-formed.
#[test]
fn a_replacement_worker_rejoins_a_replacement_master_as_a_member() {
    let mut c = Cluster::start(3);
    c.sql(1, "CREATE TABLE i (id BIGINT, v BIGINT) WITH (shard_key = 'id', replicas = 2)");
    c.sql(1, "INSERT INTO i SELECT value, value FROM generate_series(1, 900)");
    let ids = c.sql(1, "SELECT node_id FROM system.nodes ORDER BY rank");
    let run_id = run_id(&c);
    c.procs[2].kill9();
    std::fs::remove_dir_all(c.data_dir(2)).expect("remove rank 2's data dir");
    c.restart_with(2, &["--replace-node", &ids[2][0]]);
    c.procs[2].wait_for_line("every replica of the data dir this node replaced is rebuilt", Duration::from_secs(90));
    // Rank 1 too, so that its data dir records rank 2's new node as the one it last saw there.
    c.procs[1].kill9();
    std::fs::remove_dir_all(c.data_dir(1)).expect("remove rank 1's data dir");
    c.restart_with(1, &["--replace-node", &ids[1][0]]);
    c.procs[1].wait_for_line("every replica of the data dir this node replaced is rebuilt", Duration::from_secs(90));
    // The master's disk goes too; rank 2 is held back so that rank 1 rejoins the new master first.
    c.procs[2].signal("STOP");
    c.procs[0].kill9();
    std::fs::remove_dir_all(c.data_dir(0)).expect("remove rank 0's data dir");
    let mut master = c.spawn_node(0, &["--replace-node", &ids[0][0], "--run-id", &run_id]);
    master.wait_for_line("waiting for 1 of 3 ranks to rejoin", Duration::from_secs(60));
    c.procs[2].signal("CONT");
    master.wait_for_line("replaced the lost master: every rank rejoined", Duration::from_secs(60));
    c.addrs[0] = flight_addr(&master.wait_for_line("listening rank=", Duration::from_secs(60)));
    c.procs[0] = master;
    for r in 0..3 {
        eventually(Duration::from_secs(60), "the new master's replicas rebuilt", || {
            let got = sql_csv(&c.addrs[r], "SELECT count(*), count(DISTINCT id) FROM i").ok()?;
            (got == [["900", "900"]]).then_some(())
        });
    }
}

/// The lost master had shipped its queued rows to one replica of a shard and not yet to the
/// other (rank 1 was down): after the replacement, the shard's surviving replicas are made the
/// same from the one that holds the most rows, and every node answers alike.
#[test]
fn replicas_the_lost_masters_queue_reached_in_part_are_made_the_same() {
    let mut c = Cluster::start(3);
    c.sql(
        0,
        "CREATE TABLE t (id BIGINT, v BIGINT) WITH (shard_key = 'id', replicas = 2, \
         sync_mode = 'delay_mode_distributed', delay_max_ms = 50)",
    );
    let old = one(c.sql(1, "SELECT node_id FROM system.nodes WHERE rank = 0"))[0].clone();
    let run_id = run_id(&c);
    c.procs[1].kill9();
    c.sql(0, "INSERT INTO t SELECT value, value FROM generate_series(1, 600)");
    // Delivered to rank 2, still queued for rank 1.
    eventually(Duration::from_secs(20), "rank 0's rows delivered to rank 2", || {
        let pending =
            sql_csv(&c.addrs[0], "SELECT coalesce(sum(pending_rows), 0) FROM system.sync_queues WHERE destination = 2")
                .ok()?;
        (pending == [["0"]]).then_some(())
    });
    let on_2: u64 = one(c.sql(2, "SELECT sum(rows) FROM system.shards WHERE \"table\" = 't' AND rank = 2"))[0]
        .parse()
        .expect("rows");
    assert!(on_2 > 0 && on_2 < 600, "{on_2}");
    c.procs[0].kill9();
    std::fs::remove_dir_all(c.data_dir(0)).expect("remove rank 0's data dir");
    let mut rank1 = c.spawn_node(1, &[]);
    c.restart_with(0, &["--replace-node", &old, "--run-id", &run_id]);
    c.addrs[1] = flight_addr(&rank1.wait_for_line("listening rank=", Duration::from_secs(60)));
    c.procs[1] = rank1;
    c.procs[0].wait_for_line("every replica of the data dir this node replaced is rebuilt", Duration::from_secs(90));
    // Shards 1 and 2 held what rank 2 had; shard 0's rows lived only on the lost master (its
    // replica, and its queue for rank 1).
    for r in 0..3 {
        let got = one(c.sql(r, "SELECT count(*), count(DISTINCT id) FROM t"));
        assert_eq!(got, [on_2.to_string(), on_2.to_string()], "through rank {r}");
    }
    assert_eq!(c.sql(1, "CHECK TABLE t"), [["1"]]);
}

/// Rank 2's disk lost, then the master's before rank 2 was replaced: shard 2's replicas (ranks 2
/// and 0) were both on lost dirs, and the rows rank 1 took meanwhile are only in its queue for
/// rank 2. Both replacements let their replica go empty; the one released first takes new rows
/// at once, and must not be copied over the other (whose high-water mark would then drop the
/// older queued rows as duplicates): the other is released too, takes its queued rows, and the
/// fuller replica is then copied over the first. Every acknowledged row survives.
#[test]
fn rows_queued_for_a_shard_whose_every_replica_was_lost_reach_both_new_replicas() {
    let mut c = Cluster::start(3);
    c.sql(
        0,
        "CREATE TABLE t (id BIGINT, v BIGINT) WITH (shard_key = 'id', replicas = 2, \
         sync_mode = 'delay_mode_distributed', delay_max_ms = 50)",
    );
    let ids = c.sql(1, "SELECT node_id FROM system.nodes ORDER BY rank");
    let run_id = run_id(&c);
    c.procs[2].kill9();
    std::fs::remove_dir_all(c.data_dir(2)).expect("remove rank 2's data dir");
    c.sql(1, "INSERT INTO t SELECT value, value FROM generate_series(1, 600)");
    // Delivered to the master, still queued for rank 2.
    eventually(Duration::from_secs(20), "rank 1's rows delivered to rank 0", || {
        let pending =
            sql_csv(&c.addrs[1], "SELECT coalesce(sum(pending_rows), 0) FROM system.sync_queues WHERE destination = 0")
                .ok()?;
        (pending == [["0"]]).then_some(())
    });
    c.procs[0].kill9();
    std::fs::remove_dir_all(c.data_dir(0)).expect("remove rank 0's data dir");
    let mut rank2 = c.spawn_node(2, &["--replace-node", &ids[2][0]]);
    c.restart_with(0, &["--replace-node", &ids[0][0], "--run-id", &run_id]);
    c.addrs[2] = flight_addr(&rank2.wait_for_line("listening rank=", Duration::from_secs(60)));
    c.procs[2] = rank2;
    // New rows while the replacements rebuild (refused until the new master has every rank).
    let mut acked = 600;
    for batch in 0..20 {
        let first = 1000 + batch * 50;
        let insert = format!(
            "INSERT INTO t SELECT value, value FROM generate_series({first}, {}) SETTINGS insert_id = 'b{batch}'",
            first + 49
        );
        eventually(Duration::from_secs(60), "an insert through rank 1", || sql_csv(&c.addrs[1], &insert).ok());
        acked += 50;
        std::thread::sleep(Duration::from_millis(100));
    }
    for r in [0, 2] {
        c.procs[r]
            .wait_for_line("every replica of the data dir this node replaced is rebuilt", Duration::from_secs(120));
    }
    // Rank 2 may have joined while the new master was still taking the catalog: its replicas
    // to rebuild are those of the catalog taken, not of the empty one it was welcomed with.
    let noted = c.procs[2].wait_for_line("this node took the rank of a lost data dir", Duration::from_secs(1));
    assert!(noted.contains("replicas=2"), "{noted}");
    c.sql(1, "SYSTEM FLUSH DISTRIBUTED t");
    let want = vec![vec![acked.to_string(), acked.to_string()]];
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let counts: Vec<_> =
            (0..3).map(|r| sql_csv(&c.addrs[r], "SELECT count(*), count(DISTINCT id) FROM t").ok()).collect();
        let check = sql_csv(&c.addrs[1], "CHECK TABLE t").ok();
        if counts.iter().all(|rows| rows.as_ref() == Some(&want)) && check == Some(vec![vec!["1".to_string()]]) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "want {want:?} through every node: {counts:?}, check {check:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The cluster's run id, as rank 1's `cluster.json` records it (what a replacement master is
/// given with `--run-id`).
fn run_id(c: &Cluster) -> String {
    let cluster_json = std::fs::read_to_string(c.data_dir(1).join("cluster.json")).expect("rank 1's cluster.json");
    cluster_json.split('"').nth(3).expect("the run id in cluster.json").to_string()
}
