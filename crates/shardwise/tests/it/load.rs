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
    // Each load is in the query log of the node it went through.
    let logged = "SELECT count(*) FROM system.queries \
                  WHERE query = 'INSERT INTO t (Flight SQL bulk ingest, insert_id \"L1\")' AND state = 'finished'";
    assert_eq!(c.sql(1, logged), vec![vec!["2"]]);
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
    // The name as written in CREATE TABLE (which SQL folded to `t`): pointed to the table.
    let out = load(&c.addrs[0], "T", &good, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("table \"T\" does not exist") && stderr.contains("load into t"), "{stderr}");

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

/// A row too large for any insert chunk of the table (25 MB with two replicas) fails the load
/// before anything is sent, naming the row: before, the segments ahead of it were stored and
/// the error advised a re-run that failed the same way.
#[test]
fn a_row_too_large_for_the_table_fails_the_load_before_anything_is_sent() {
    let c = Cluster::start(2);
    c.sql(0, "CREATE TABLE big (id BIGINT, s VARCHAR) WITH (shard_key = 'id', replicas = 2)");
    let dir = tempdir();
    let file = dir.path().join("huge.csv");
    let mut text = String::from("id,s\n1,small\n2,small\n3,");
    text.push_str(&"z".repeat(26 * 1024 * 1024));
    text.push_str("\n4,small\n");
    std::fs::write(&file, text).unwrap();
    let out = load(&c.addrs[1], "big", &file, &["--insert-id", "H1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("data row 3 holds") && stderr.contains("nothing was sent"), "{stderr}");
    assert_eq!(one(c.sql(0, "SELECT count(*) FROM big")), ["0"]);
}

/// A Flight SQL bulk ingest from a client that is not `shardwise load` (ADBC's `adbc_ingest`):
/// columns matched by name and cast to the table's types; ADBC's modes honoured (append adds,
/// create on an existing table and replace are refused, writing nothing).
#[test]
fn flight_sql_ingest_matches_columns_and_honours_modes() {
    use std::collections::HashMap;
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray};
    use arrow_flight::sql::client::FlightSqlServiceClient;
    use arrow_flight::sql::{CommandStatementIngest, TableDefinitionOptions, TableExistsOption, TableNotExistOption};

    let c = Cluster::start(2);
    c.sql(0, "CREATE TABLE ing (id BIGINT, name VARCHAR, small SMALLINT) WITH (shard_key = 'id')");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let ingest = |batch: RecordBatch, if_not_exist: TableNotExistOption, if_exists: TableExistsOption| {
        rt.block_on(async {
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", c.addrs[0]))
                .expect("endpoint")
                .connect()
                .await
                .expect("connect");
            let mut client = FlightSqlServiceClient::new(channel);
            let command = CommandStatementIngest {
                table_definition_options: Some(TableDefinitionOptions {
                    if_not_exist: if_not_exist.into(),
                    if_exists: if_exists.into(),
                }),
                table: "ing".into(),
                options: HashMap::new(),
                ..Default::default()
            };
            client.execute_ingest(command, futures::stream::iter([Ok(batch)])).await.map_err(|e| e.to_string())
        })
    };
    // int32 columns in another order, one column missing (NULL), names in another case.
    let batch = RecordBatch::try_from_iter([
        ("SMALL", Arc::new(Int32Array::from(vec![7, 8])) as ArrayRef),
        ("id", Arc::new(Int32Array::from(vec![1, 2])) as ArrayRef),
    ])
    .expect("batch");
    let append = (TableNotExistOption::Fail, TableExistsOption::Append);
    assert_eq!(ingest(batch.clone(), append.0, append.1), Ok(2));
    let create_append = (TableNotExistOption::Create, TableExistsOption::Append);
    assert_eq!(ingest(batch.clone(), create_append.0, create_append.1), Ok(2));
    let err = ingest(batch.clone(), TableNotExistOption::Create, TableExistsOption::Fail).expect_err("create");
    assert!(err.contains("the table exists"), "{err}");
    let err = ingest(batch.clone(), TableNotExistOption::Create, TableExistsOption::Replace).expect_err("replace");
    assert!(err.contains("TRUNCATE TABLE ing"), "{err}");
    // A value that does not fit its column names it, and nothing is written.
    let big = RecordBatch::try_from_iter([
        ("id", Arc::new(Int64Array::from(vec![3, 4])) as ArrayRef),
        ("small", Arc::new(Int64Array::from(vec![1, 70_000])) as ArrayRef),
        ("name", Arc::new(StringArray::from(vec!["a", "b"])) as ArrayRef),
    ])
    .expect("batch");
    let err = ingest(big, append.0, append.1).expect_err("overflow");
    // (The client's error text escapes the quotes around the name.)
    assert!(err.contains("small") && err.contains("Int16") && err.contains("nothing was written"), "{err}");
    let rows = c.sql(1, "SELECT count(*), sum(id), sum(small), count(name) FROM ing");
    assert_eq!(rows, vec![vec!["4", "6", "30", "0"]]);
}

/// A Flight SQL `DoPut` sent by hand, message by message, so a test can pause its stream: the
/// messages of `command` (a bulk ingest, a prepared statement's update) carrying `batches` (one
/// message per batch), and a task that sends what arrives on the returned sender to `addr` as
/// one `DoPut` and yields the row count answered.
type HandPut = (
    Vec<arrow_flight::FlightData>,
    tokio::sync::mpsc::Sender<arrow_flight::FlightData>,
    tokio::task::JoinHandle<Result<i64, String>>,
);

fn put_by_hand(
    rt: &tokio::runtime::Runtime,
    addr: &str,
    command: impl arrow_flight::sql::ProstMessageExt,
    batches: Vec<arrow::array::RecordBatch>,
) -> HandPut {
    use arrow_flight::encode::FlightDataEncoderBuilder;
    use arrow_flight::sql::client::FlightSqlServiceClient;
    use arrow_flight::{FlightData, FlightDescriptor};
    use futures::TryStreamExt;
    use prost::Message;

    let descriptor = FlightDescriptor::new_cmd(command.as_any().encode_to_vec());
    let messages: Vec<FlightData> = rt
        .block_on(
            FlightDataEncoderBuilder::new()
                .with_flight_descriptor(Some(descriptor))
                .with_max_flight_data_size(usize::MAX)
                .build(futures::stream::iter(batches.into_iter().map(Ok)))
                .try_collect(),
        )
        .expect("encoded");
    let (tx, rx) = tokio::sync::mpsc::channel::<FlightData>(4);
    let addr = addr.to_string();
    let put = rt.spawn(async move {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| e.to_string())?
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        let mut client = FlightSqlServiceClient::new(channel);
        let stream = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
        let mut reply = client.do_put(stream).await.map_err(|e| e.to_string())?;
        let first = reply.message().await.map_err(|e| e.to_string())?.ok_or("no reply")?;
        Ok::<i64, String>(
            arrow_flight::sql::DoPutUpdateResult::decode(&*first.app_metadata).map_err(|e| e.to_string())?.record_count,
        )
    });
    (messages, tx, put)
}

/// A streamed load stores its segments as they arrive; a DROP and CREATE of its table in the
/// middle must fail the load, not send its first segments to the old table and the rest to the
/// new one while reporting success.
#[test]
fn a_load_spanning_a_drop_and_create_fails_instead_of_splitting() {
    use std::collections::HashMap;
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Int64Array, RecordBatch};
    use arrow_flight::FlightData;
    use arrow_flight::sql::CommandStatementIngest;

    let c = Cluster::start(2);
    let create = "CREATE TABLE span (id BIGINT) WITH (shard_key = 'id')";
    c.sql(0, create);
    let segment = shardwise_server::ingest::INGEST_SEGMENT_ROWS as i64;
    let batch = |from: i64, to: i64| {
        RecordBatch::try_from_iter([("id", Arc::new(Int64Array::from_iter_values(from..to)) as ArrayRef)])
            .expect("batch")
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let command = CommandStatementIngest {
        table: "span".into(),
        options: HashMap::from([("insert_id".into(), "span-1".into()), ("commit".into(), "marker".into())]),
        ..Default::default()
    };
    // One message per batch: the schema, a whole first segment, then the rest with the marker.
    let batches = vec![batch(0, segment), batch(segment, segment + 10)];
    let (mut messages, tx, put) = put_by_hand(&rt, &c.addrs[0], command, batches);
    assert_eq!(messages.len(), 3);
    let last = messages.pop().expect("last");
    let last = FlightData { app_metadata: format!("shardwise-commit rows={}", segment + 10).into(), ..last };
    for message in messages {
        tx.blocking_send(message).expect("send");
    }
    // The first segment is stored (the table is `immediate`); then the table is replaced.
    eventually(Duration::from_secs(30), "the first segment to be stored", || {
        (one(c.sql(1, "SELECT count(*) FROM span")) == [segment.to_string()]).then_some(())
    });
    c.sql(0, "DROP TABLE span");
    c.sql(0, create);
    tx.blocking_send(last).expect("send");
    drop(tx);
    let outcome = rt.block_on(put).expect("join");
    let err = outcome.expect_err("the load must fail");
    assert!(err.contains("dropped and created again") && err.contains("span-1"), "{err}");
    assert_eq!(one(c.sql(1, "SELECT count(*) FROM span")), ["0"]);
}

/// Replicas hold a shard's rows in different orders (a load's chunks reach each replica in its own
/// order), and a shard of fewer shards than threads is read in slices by row position: every
/// `load_balancing` must give the answer of one replica, never slices of two (wrong sums before).
#[test]
fn every_load_balancing_reads_a_sliced_shard_from_one_replica() {
    let c = Cluster::start(3);
    c.sql(0, "CREATE TABLE lb (k BIGINT, s BIGINT) WITH (shard_key = 'k', shards = 1, replicas = 3)");
    let dir = tempdir();
    let csv = dir.path().join("lb.csv");
    let mut text = String::from("k,s\n");
    let (mut x, mut sum) = (12_345u64, 0i64);
    for _ in 0..300_000 {
        // xorshift: keys and values in no order, so that row positions matter.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let s = (x % 60_001) as i64 - 30_000;
        sum += s;
        text.push_str(&format!("{},{s}\n", x % 1_000_000));
    }
    std::fs::write(&csv, text).unwrap();
    let out = load(&c.addrs[0], "lb", &csv, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let want = vec![vec!["300000".to_string(), sum.to_string()]];
    for balancing in ["nearest", "in_order", "round_robin", "random"] {
        for rank in 0..3 {
            let sql = format!("SELECT count(*), sum(s) FROM lb SETTINGS load_balancing = '{balancing}'");
            assert_eq!(c.sql(rank, &sql), want, "{balancing} through rank {rank}");
        }
    }
}

/// An ingest without a commit marker holds its rows until its stream ends: while its client
/// keeps the stream open it is shown as running in `system.queries`, and `KILL QUERY` stops it
/// with nothing written (before, it was invisible until it ended, and nothing could stop it).
#[test]
fn a_held_open_ingest_is_shown_and_can_be_killed() {
    use std::collections::HashMap;
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Int64Array, RecordBatch};
    use arrow_flight::sql::CommandStatementIngest;

    let c = Cluster::start(2);
    c.sql(0, "CREATE TABLE held (id BIGINT) WITH (shard_key = 'id')");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let command = CommandStatementIngest {
        table: "held".into(),
        options: HashMap::from([("insert_id".into(), "held-1".into()), ("query_id".into(), "held-q".into())]),
        ..Default::default()
    };
    let batch = RecordBatch::try_from_iter([("id", Arc::new(Int64Array::from_iter_values(0..1000)) as ArrayRef)])
        .expect("batch");
    let (messages, tx, put) = put_by_hand(&rt, &c.addrs[0], command, vec![batch]);
    for message in messages {
        tx.blocking_send(message).expect("send");
    }
    // (`c.sql` splits its rows at commas, and the statement's text has one.)
    let running = "SELECT state FROM system.queries WHERE query_id = 'held-q' \
                   AND query = 'INSERT INTO held (Flight SQL bulk ingest, insert_id \"held-1\")'";
    eventually(Duration::from_secs(30), "the held ingest to be shown as running", || {
        (c.sql(0, running) == [["running"]]).then_some(())
    });
    c.sql(0, "KILL QUERY WHERE query_id = 'held-q'");
    let outcome = rt.block_on(async { tokio::time::timeout(Duration::from_secs(30), put).await }).expect("ended");
    let err = outcome.expect("join").expect_err("a killed ingest fails");
    assert!(err.contains("KILL QUERY") && err.contains("nothing was written"), "{err}");
    assert_eq!(one(c.sql(0, running))[0], "killed");
    drop(tx);
    assert_eq!(one(c.sql(1, "SELECT count(*) FROM held")), ["0"]);
    // An ingest refused before its rows (no such table) is recorded too, as a failed statement is.
    let command = CommandStatementIngest {
        table: "nope".into(),
        options: HashMap::from([("query_id".into(), "nope-q".into())]),
        ..Default::default()
    };
    let batch = RecordBatch::try_from_iter([("id", Arc::new(Int64Array::from(vec![1])) as ArrayRef)]).expect("batch");
    let (messages, tx, put) = put_by_hand(&rt, &c.addrs[0], command, vec![batch]);
    for message in messages {
        // The node may refuse at the first message and end the call before the rest is sent.
        if tx.blocking_send(message).is_err() {
            break;
        }
    }
    drop(tx);
    let err = rt.block_on(put).expect("join").expect_err("no such table");
    assert!(err.contains("nope"), "{err}");
    assert_eq!(c.sql(0, "SELECT state FROM system.queries WHERE query_id = 'nope-q'"), [["failed"]]);
}

/// An `executemany` of `INSERT ... VALUES (?, ...)` (ADBC's and JDBC's prepared statement with
/// rows of parameters) is stored from its Arrow columns, as one insert: values exact (NaN, a
/// 19-digit integer), columns matched by the statement, casts checked, and a bad value anywhere
/// refused with nothing written. A statement with an expression around a placeholder still runs.
#[test]
fn an_executemany_insert_is_stored_from_its_columns() {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
    use arrow_flight::sql::CommandPreparedStatementUpdate;

    let c = Cluster::start(2);
    c.sql(0, "CREATE TABLE em (id BIGINT, name VARCHAR, x DOUBLE, small SMALLINT) WITH (shard_key = 'id')");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    // As ADBC sends it: the rows of parameters on the update's own `DoPut`.
    let many = |sql: &str, params: RecordBatch| {
        let command = CommandPreparedStatementUpdate { prepared_statement_handle: sql.to_string().into() };
        let (messages, tx, put) = put_by_hand(&rt, &c.addrs[0], command, vec![params]);
        for message in messages {
            tx.blocking_send(message).expect("send");
        }
        drop(tx);
        rt.block_on(put).expect("join")
    };
    let rows = 50_000i64;
    let params = RecordBatch::try_from_iter([
        ("a", Arc::new(StringArray::from_iter_values((0..rows).map(|i| format!("n{i}")))) as ArrayRef),
        ("b", Arc::new(Int64Array::from_iter_values((0..rows).map(|i| i + 1_000_000_000_000_000_000))) as ArrayRef),
        ("c", Arc::new(Float64Array::from_iter_values((0..rows).map(|i| if i == 0 { f64::NAN } else { 0.5 })))),
    ])
    .expect("batch");
    // The parameters in another order than the statement's columns, `small` not named (NULL).
    let stored = many("INSERT INTO em (name, id, x) VALUES ($1, $2, $3)", params.clone());
    assert_eq!(stored, Ok(rows));
    let check =
        "SELECT count(*), count(DISTINCT name), min(id), count(small), sum(CASE WHEN isnan(x) THEN 1 END) FROM em";
    let want = vec![rows.to_string(), rows.to_string(), "1000000000000000000".into(), "0".into(), "1".into()];
    assert_eq!(one(c.sql(1, check)), want);
    let logged = "SELECT count(*) FROM system.queries WHERE query LIKE 'INSERT INTO em (name%(50000 rows of bound parameters)' \
                  AND state = 'finished'";
    assert_eq!(c.sql(0, logged), vec![vec!["1"]]);
    // One value that does not fit (70 000 for a SMALLINT) refuses every row.
    let bad = RecordBatch::try_from_iter([
        ("p", Arc::new(Int64Array::from(vec![1, 2, 3])) as ArrayRef),
        ("q", Arc::new(Int64Array::from(vec![1, 70_000, 3])) as ArrayRef),
    ])
    .expect("batch");
    let err = many("INSERT INTO em (id, small) VALUES (?, ?)", bad.clone()).expect_err("out of range");
    assert!(err.contains("small") && err.contains("nothing was written"), "{err}");
    // An expression around a placeholder takes the SQL path, row by row spliced.
    assert_eq!(many("INSERT INTO em (id, small) VALUES (? + 10, ? % 1000)", bad.clone()), Ok(3));
    assert_eq!(one(c.sql(1, "SELECT count(*), sum(small) FROM em")), [(rows + 3).to_string(), "4".to_string()]);
    // A trailing SETTINGS clause applies to the one insert of all the rows, on either path: an
    // insert_id makes a retry a no-op. (Before, such a statement ran once per row, each run with
    // the same insert_id, and every row after the first of each shard was dropped as a retry.)
    let ids = |from: i64| {
        RecordBatch::try_from_iter([("p", Arc::new(Int64Array::from_iter_values(from..from + 1000)) as ArrayRef)])
            .expect("batch")
    };
    for sql in [
        "INSERT INTO em (id) VALUES (?) SETTINGS insert_id = 'em-direct'",
        "INSERT INTO em (id) VALUES (? + 0) SETTINGS insert_id = 'em-spliced', insert_quorum = 1",
    ] {
        let from = if sql.contains("direct") { 10_000_000 } else { 20_000_000 };
        assert_eq!(many(sql, ids(from)), Ok(1000), "{sql}");
        // A retry answers as the insert did, and stores nothing again (the count below).
        assert_eq!(many(sql, ids(from)), Ok(1000), "the retry of {sql}");
    }
    assert_eq!(one(c.sql(1, "SELECT count(*) FROM em")), [(rows + 2003).to_string()]);
    // A statement that runs once per row cannot carry one insert_id for all of them.
    let err = many("UPDATE em SET small = 1 WHERE id = ? SETTINGS insert_id = 'x'", ids(0)).expect_err("refused");
    assert!(err.contains("runs once per row") && err.contains("nothing was run"), "{err}");
}
