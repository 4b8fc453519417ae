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
