//! Engine-level tests: planning, refusal of DataFusion DDL, and `system.nodes` over a fake
//! cluster.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::util::pretty::pretty_format_batches;
use futures::TryStreamExt;
use shardwise_cluster::{BoxFuture, ClusterView, MemberInfo, NodeState, Role};

use crate::{QueryEngine, QueryError, Session};

/// A three-node cluster whose rank 2 is down and has never sent a heartbeat.
#[derive(Debug)]
struct FakeCluster;

fn member(rank: u32, state: NodeState, heartbeat: Option<u64>) -> MemberInfo {
    let mut addrs = BTreeMap::new();
    addrs.insert("flight".to_string(), format!("10.0.0.{rank}:50051"));
    addrs.insert("data".to_string(), format!("10.0.0.{rank}:50052"));
    if rank == 0 {
        addrs.insert("pg".to_string(), "10.0.0.0:5432".to_string());
    }
    MemberInfo {
        rank,
        node_id: format!("node-{rank}"),
        role: Role::for_rank(rank),
        addrs,
        state,
        epoch: u64::from(rank) + 1,
        last_heartbeat_unix_ms: heartbeat,
    }
}

impl ClusterView for FakeCluster {
    fn rank(&self) -> u32 {
        0
    }
    fn world_size(&self) -> u32 {
        3
    }
    fn members(&self) -> BoxFuture<'_, Vec<MemberInfo>> {
        Box::pin(async {
            vec![
                member(0, NodeState::Up, Some(1_700_000_000_000)),
                member(1, NodeState::Up, Some(1_700_000_001_000)),
                member(2, NodeState::Down, None),
            ]
        })
    }
}

fn engine() -> QueryEngine {
    match QueryEngine::new(Arc::new(FakeCluster)) {
        Ok(engine) => engine,
        Err(e) => panic!("engine: {e}"),
    }
}

async fn run(engine: &QueryEngine, sql: &str) -> Result<Vec<RecordBatch>, QueryError> {
    run_in(engine, sql, &Arc::default()).await
}

async fn run_in(engine: &QueryEngine, sql: &str, session: &Arc<Session>) -> Result<Vec<RecordBatch>, QueryError> {
    let planned = engine.plan(sql, session).await?;
    let stream = engine.execute(planned).await?;
    Ok(stream.try_collect().await?)
}

fn pretty(batches: &[RecordBatch]) -> String {
    match pretty_format_batches(batches) {
        Ok(table) => table.to_string(),
        Err(e) => panic!("format: {e}"),
    }
}

#[tokio::test]
async fn select_one() {
    let engine = engine();
    let planned = engine.plan("SELECT 1 AS one", &Arc::default()).await.expect("plan");
    assert_eq!(planned.schema().field(0).name(), "one");
    let batches = run(&engine, "SELECT 1 AS one").await.expect("run");
    assert_eq!(pretty(&batches), "+-----+\n| one |\n+-----+\n| 1   |\n+-----+");
}

#[tokio::test]
async fn to_utf8view_is_a_sql_function() {
    let engine = engine();
    let sql = "SELECT to_utf8view('more than twelve bytes') AS v, arrow_typeof(to_utf8view(NULL)) AS t";
    let text = pretty(&run(&engine, sql).await.expect("run"));
    assert!(text.contains("| more than twelve bytes | Utf8View |"), "{text}");
}

#[tokio::test]
async fn unknown_column_is_a_user_error() {
    let err = engine().plan("SELECT nope FROM system.nodes", &Arc::default()).await.unwrap_err();
    assert!(err.is_user_error(), "{err:?}");
    assert!(err.to_string().contains("nope"), "{err}");
}

#[tokio::test]
async fn syntax_error_is_a_user_error() {
    let err = engine().plan("SELEC 1", &Arc::default()).await.unwrap_err();
    assert!(err.is_user_error(), "{err:?}");
}

#[tokio::test]
async fn create_external_table_is_refused_without_running() {
    let dir = std::env::temp_dir().join("shardwise-query-should-not-exist");
    let sql = format!("CREATE EXTERNAL TABLE t STORED AS CSV LOCATION '{}'", dir.display());
    let engine = engine();
    let err = engine.plan(&sql, &Arc::default()).await.unwrap_err();
    assert!(matches!(err, QueryError::Unsupported(_)), "{err:?}");
    assert!(err.is_user_error());
    assert!(err.to_string().starts_with("statement not supported: "), "{err}");
    // Planning did not register the table.
    let err = engine.plan("SELECT * FROM t", &Arc::default()).await.unwrap_err();
    assert!(err.to_string().contains("t"), "{err}");
}

#[tokio::test]
async fn insert_and_copy_are_refused() {
    let engine = engine();
    for sql in [
        "INSERT INTO system.nodes SELECT * FROM system.nodes",
        "COPY (SELECT 1) TO '/tmp/shardwise-query-copy.csv'",
        "CREATE VIEW v AS SELECT 1",
    ] {
        let err = engine.plan(sql, &Arc::default()).await.unwrap_err();
        assert!(matches!(err, QueryError::Unsupported(_)), "{sql}: {err:?}");
    }
}

#[tokio::test]
async fn set_is_allowed_and_takes_effect() {
    let engine = engine();
    let session = Arc::new(Session::new());
    let batches = run_in(&engine, "SET datafusion.execution.batch_size = 1234", &session).await.expect("set");
    assert!(batches.iter().all(|b| b.num_rows() == 0));
    let batches = run_in(
        &engine,
        "SELECT value FROM information_schema.df_settings \
         WHERE name = 'datafusion.execution.batch_size'",
        &session,
    )
    .await
    .expect("read back");
    assert!(pretty(&batches).contains("1234"), "{}", pretty(&batches));
}

#[tokio::test]
async fn system_nodes_lists_members() {
    let batches = run(&engine(), "SELECT * FROM system.nodes ORDER BY rank").await.expect("run");
    let expected = "\
+------+---------+--------+----------------+---------------+-----------+-------+-------+----------------------+----------------+
| rank | node_id | role   | flight_addr    | pg_addr       | http_addr | state | epoch | last_heartbeat       | data_addr      |
+------+---------+--------+----------------+---------------+-----------+-------+-------+----------------------+----------------+
| 0    | node-0  | master | 10.0.0.0:50051 | 10.0.0.0:5432 |           | up    | 1     | 2023-11-14T22:13:20Z | 10.0.0.0:50052 |
| 1    | node-1  | worker | 10.0.0.1:50051 |               |           | up    | 2     | 2023-11-14T22:13:21Z | 10.0.0.1:50052 |
| 2    | node-2  | worker | 10.0.0.2:50051 |               |           | down  | 3     |                      | 10.0.0.2:50052 |
+------+---------+--------+----------------+---------------+-----------+-------+-------+----------------------+----------------+";
    let got = pretty(&batches);
    // Compare cell contents, not column widths.
    let cells = |s: &str| -> Vec<Vec<String>> {
        s.lines().filter(|l| l.starts_with('|')).map(|l| l.split('|').map(|c| c.trim().to_string()).collect()).collect()
    };
    assert_eq!(cells(&got), cells(expected), "{got}");
}

#[tokio::test]
async fn system_nodes_projection_and_filter() {
    let engine = engine();
    let planned = engine
        .plan("SELECT node_id, state FROM system.nodes WHERE state <> 'up'", &Arc::default())
        .await
        .expect("plan");
    let schema = planned.schema();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["node_id", "state"]);
    let batches = run(&engine, "SELECT node_id, state FROM system.nodes WHERE state <> 'up'").await.expect("run");
    assert_eq!(
        pretty(&batches),
        "+---------+-------+\n| node_id | state |\n+---------+-------+\n| node-2  | down  |\n+---------+-------+"
    );
}

#[tokio::test]
async fn system_nodes_schema_types() {
    use datafusion::arrow::datatypes::{DataType, TimeUnit};
    let planned = engine().plan("SELECT * FROM system.nodes", &Arc::default()).await.expect("plan");
    let schema = planned.schema();
    assert_eq!(schema.fields().len(), 10);
    assert_eq!(schema.field(0).data_type(), &DataType::UInt32);
    assert_eq!(schema.field(7).data_type(), &DataType::UInt64);
    assert_eq!(schema.field(8).data_type(), &DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())));
    assert!(schema.field(3).is_nullable());
    assert!(schema.field(9).is_nullable());
    assert!(!schema.field(1).is_nullable());
}

#[tokio::test]
async fn set_changes_its_own_session_only() {
    let engine = engine();
    let (a, b) = (Arc::new(Session::new()), Arc::new(Session::new()));
    // information_schema lists shardwise's settings without their prefix.
    let show = "SELECT value FROM information_schema.df_settings WHERE name = 'max_memory_usage'";
    run_in(&engine, "SET max_memory_usage = 12345", &a).await.expect("set");
    assert!(pretty(&run_in(&engine, show, &a).await.expect("show a")).contains("12345"));
    assert!(!pretty(&run_in(&engine, show, &b).await.expect("show b")).contains("12345"));
    let err = run_in(&engine, "SET distributed_aggregation = 'sideways'", &a).await.expect_err("bad value");
    assert!(err.to_string().contains("shuffle"), "{err}");
    run_in(&engine, "RESET max_memory_usage", &a).await.expect("reset");
    assert!(!pretty(&run_in(&engine, show, &a).await.expect("show a")).contains("12345"));
}

#[tokio::test]
async fn system_settings_shows_the_querys_values_and_the_word_settings_is_a_name() {
    let engine = engine();
    let session = Arc::new(Session::new());
    // A fresh session has changed nothing.
    let changed = run_in(&engine, "SHOW CHANGED SETTINGS", &session).await.expect("show changed");
    assert_eq!(changed.iter().map(|b| b.num_rows()).sum::<usize>(), 0, "{}", pretty(&changed));
    let row = "SELECT name, value, changed FROM system.settings WHERE name = 'max_memory_usage'";
    assert!(
        pretty(&run_in(&engine, row, &session).await.expect("node value"))
            .contains("| max_memory_usage | 0     | false   |")
    );
    run_in(&engine, "SET max_memory_usage = 12345", &session).await.expect("set");
    let shown = pretty(&run_in(&engine, row, &session).await.expect("session value"));
    assert!(shown.contains("| 12345 | true"), "{shown}");
    let shown =
        pretty(&run_in(&engine, &format!("{row} SETTINGS max_memory_usage = 7"), &session).await.expect("clause"));
    assert!(shown.contains("| 7     | true"), "{shown}");
    let changed = pretty(&run_in(&engine, "SHOW CHANGED SETTINGS", &session).await.expect("show changed"));
    assert!(changed.contains("max_memory_usage") && !changed.contains("insert_quorum"), "{changed}");
    // With the node's default beside the value, as the docs say.
    assert!(changed.contains("| default ") && changed.contains("| 12345 | 0 "), "{changed}");
    let like = pretty(&run_in(&engine, "SHOW SETTINGS LIKE '%no_merge'", &session).await.expect("show like"));
    assert!(like.contains("distributed_group_by_no_merge") && like.contains("ClickHouse"), "{like}");
    // DataFusion's options, by their dotted names, in a SETTINGS clause too.
    let batch = "SELECT value FROM system.settings WHERE name = 'datafusion.execution.batch_size' \
                 SETTINGS datafusion.execution.batch_size = 1024";
    assert!(pretty(&run_in(&engine, batch, &session).await.expect("dotted")).contains("1024"));
    let err = run(&engine, "SELECT 1 SETTINGS max_execution_time_ms = -1").await.expect_err("negative");
    assert!(err.to_string().contains("max_execution_time_ms = -1"), "{err}");
    // `settings` as an alias is a name, not a clause.
    assert!(pretty(&run(&engine, "SELECT 1 AS settings").await.expect("alias")).contains("settings"));
}

#[tokio::test]
async fn is_distinct_from_binds_tighter_than_and() {
    let engine = engine();
    let shown = pretty(&run(&engine, "SELECT NULL IS DISTINCT FROM false AND false AS x").await.expect("answers"));
    assert!(shown.contains("| false |"), "{shown}");
    let sql =
        "SELECT count(*) AS n FROM (VALUES ('a', 1), ('b', 9)) v(s, k) WHERE s IS NOT DISTINCT FROM 'b' AND k > 5";
    assert!(pretty(&run(&engine, sql).await.expect("strings beside AND")).contains("| 1 |"));
    // `^` is the power, as in PostgreSQL and DuckDB.
    let shown = pretty(&run(&engine, "SELECT 2 ^ 3 AS p, 2.0 ^ 0.5 AS r").await.expect("power"));
    assert!(shown.contains("| 8.0 ") && shown.contains("1.414213562"), "{shown}");
    // PostgreSQL's names: mod, sign, variance, every.
    let sql =
        "SELECT mod(7, 3) AS m, sign(-2.5) AS s, variance(x) AS v, every(x > 0) AS e FROM (VALUES (1.0), (2.0)) t(x)";
    let shown = pretty(&run(&engine, sql).await.expect("postgres names"));
    assert!(shown.contains("| 1 | -1.0 | 0.5 | true |"), "{shown}");
    let sql = "SELECT to_char(TIMESTAMP '2023-07-04 19:58:55.5', 'YYYY-MM-DD HH24:MI:SS.MS \"at\" Dy') AS t, \
               to_char(DATE '2023-07-04', '%d/%m') AS c";
    let shown = pretty(&run(&engine, sql).await.expect("to_char"));
    assert!(shown.contains("| 2023-07-04 19:58:55.500 at Tue | 04/07 |"), "{shown}");
    let sql = "SELECT '10%' LIKE '10!%' ESCAPE '!' AS a, '100' LIKE '10!%' ESCAPE '!' AS b, \
               'a\\b' LIKE 'a\\b' ESCAPE '!' AS c, 'X_1' ILIKE 'x#_%' ESCAPE '#' AS d";
    let shown = pretty(&run(&engine, sql).await.expect("LIKE ESCAPE"));
    assert!(shown.contains("| true | false | true | true |"), "{shown}");
}

#[tokio::test]
async fn repeated_select_items_are_answered() {
    let engine = engine();
    let shown = pretty(&run(&engine, "SELECT 1, 1, NULL, NULL").await.expect("repeated"));
    assert!(shown.contains("| 1 | 1_2 | NULL | NULL_2 |"), "{shown}");
    let shown = pretty(&run(&engine, "SELECT x, x FROM (SELECT 5 AS x) t").await.expect("repeated column"));
    assert!(shown.contains("| 5 | 5   |"), "{shown}");
    // Different items DataFusion would name alike (`x` and `CAST(x AS DOUBLE)` are both `x` to
    // it): named by their text.
    let shown = pretty(
        &run(&engine, "SELECT x, CAST(x AS DOUBLE), x / 2 FROM (SELECT 5 AS x) t").await.expect("colliding names"),
    );
    assert!(shown.contains("| x | CAST(x AS DOUBLE) | x / 2 |") && shown.contains("| 5 | 5.0"), "{shown}");
    // A subquery whose one column has the name of an outer column (DataFusion names the item
    // after that column, ambiguous beside it), correlated or not.
    let sql = "SELECT t.x, (SELECT u.x FROM (SELECT 7 AS x) u) FROM (SELECT 5 AS x) t";
    let shown = pretty(&run(&engine, sql).await.expect("subquery named as a column"));
    assert!(shown.contains("| 5 | 7 "), "{shown}");
    let sql = "SELECT t.x, (SELECT max(u.x) AS x FROM (SELECT 5 AS x) u WHERE u.x = t.x) FROM (SELECT 5 AS x) t";
    let shown = pretty(&run(&engine, sql).await.expect("correlated subquery named as a column"));
    assert!(shown.contains("| 5 | 5 "), "{shown}");
    // Aggregates of a value and of a cast of it: DataFusion names a cast as its value, so they
    // collided inside the plan.
    let values = "(VALUES (9, 1.5), (10, -0.5), (10, 1.5)) v(id, f)";
    let sql = format!("SELECT max(id), max(id::text), count(DISTINCT f), count(DISTINCT f::text) FROM {values}");
    let shown = pretty(&run(&engine, &sql).await.expect("casts inside aggregates"));
    assert!(
        shown.contains("| max(id) | max(id::TEXT) |") && shown.contains("| 10      | 9             | 2"),
        "{shown}"
    );
    // A float's cast to text beside the float in GROUP BY: the analyzer's rewrite of the cast
    // (PostgreSQL's float text) keeps the cast's name, which is the float's.
    let sql = format!("SELECT f::text, count(*) FROM {values} GROUP BY f, f::text ORDER BY 1");
    let shown = pretty(&run(&engine, &sql).await.expect("a value and its cast to text grouped"));
    assert!(shown.contains("| -0.5    | 1        |") && shown.contains("| 1.5     | 2        |"), "{shown}");
}

#[tokio::test]
async fn a_format_clause_is_refused_where_the_client_formats_the_rows() {
    let engine = engine();
    let err = run(&engine, "SELECT 1 FORMAT CSV").await.expect_err("FORMAT over a typed protocol");
    assert!(err.to_string().contains("HTTP API"), "{err}");
    // A column named format is a name.
    assert!(pretty(&run(&engine, "SELECT 1 AS format").await.expect("name")).contains("format"));
}

#[tokio::test]
async fn pg_catalog_answers_psqls_describe_query() {
    let engine = engine();
    // What psql's `\d nodes` sends first, as the PostgreSQL endpoint rewrites it.
    let psql = "SELECT c.oid, n.nspname, c.relname FROM pg_catalog.pg_class c \
                LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
                WHERE c.relname OPERATOR(pg_catalog.~) '^(nodes)$' COLLATE pg_catalog.default \
                AND pg_catalog.pg_table_is_visible(c.oid) ORDER BY 2, 3";
    let sql = crate::pg_catalog::rewrite(psql).expect("rewritten");
    let out = pretty(&run(&engine, &sql).await.expect("planned and run"));
    assert!(out.contains("| system  | nodes   |"), "{out}");
    assert!(run(&engine, psql).await.is_err(), "DataFusion does not plan psql's dialect as written");
    // One database name everywhere: the catalog is the database PostgreSQL clients connect to.
    let db = pretty(&run(&engine, "SELECT current_database() AS db").await.expect("current_database"));
    assert!(db.contains(&format!("| {} |", crate::engine::CATALOG)), "{db}");
}

#[tokio::test]
async fn a_query_may_be_given_its_id() {
    let engine = engine();
    run(&engine, "SELECT 1 AS one SETTINGS query_id = 'report-7'").await.expect("runs");
    let logged = pretty(
        &run(&engine, "SELECT query_id, query FROM system.queries WHERE query_id = 'report-7'").await.expect("log"),
    );
    assert!(logged.contains("report-7") && logged.contains("SELECT 1 AS one"), "{logged}");
    let err = run(&engine, "SELECT 1 SETTINGS query_id = ''").await.expect_err("empty");
    assert!(err.to_string().contains("expected 1 to 128 bytes"), "{err}");
    let session = Arc::new(Session::new());
    let err = run_in(&engine, "SET query_id = 'x'", &session).await.expect_err("not for a session");
    assert!(err.to_string().contains("query_id names one query"), "{err}");
}

#[tokio::test]
async fn a_statement_that_fails_to_plan_is_logged_under_the_id_its_client_gave() {
    let engine = engine();
    let state_of = |id: &'static str| {
        let engine = &engine;
        async move {
            let sql = format!("SELECT state FROM system.queries WHERE query_id = '{id}'");
            pretty(&run(engine, &sql).await.expect("log"))
        }
    };
    let failed = engine.plan_to_run("SELECT no_such_column SETTINGS query_id = 'bad-1'", &Arc::default()).await;
    assert!(failed.is_err());
    assert!(state_of("bad-1").await.contains("failed"), "{}", state_of("bad-1").await);
    // An HTTP request's `?query_id=`: the settings of a one-statement session.
    let http = engine.session_with(&[("query_id".into(), "bad-2".into())]).expect("session");
    assert!(engine.plan_to_run("SELECT no_such_column", &http).await.is_err());
    assert!(state_of("bad-2").await.contains("failed"), "{}", state_of("bad-2").await);
    // A failure under the id of a running query leaves that query running and killable.
    let planned = engine.plan("SELECT 1 AS one SETTINGS query_id = 'busy-1'", &Arc::default()).await.expect("plan");
    let running = engine.execute(planned).await.expect("runs until read");
    assert!(engine.plan_to_run("SELECT no_such_column SETTINGS query_id = 'busy-1'", &Arc::default()).await.is_err());
    let states = state_of("busy-1").await;
    assert!(states.contains("running") && states.contains("failed"), "{states}");
    drop(running);
}

#[tokio::test]
async fn row_values_that_start_with_an_expression_are_answered() {
    // DataFusion planned `(x, y)` only when x was a column or a literal: `(-100, '')` was refused.
    let values = "(VALUES (5, 'x'), (-100, ''), (2, '')) v(a, b)";
    let sql = format!("SELECT count(*) AS n FROM {values} WHERE (a, b) IN ((-100, ''), (1 + 1, ''))");
    let shown = pretty(&run(&engine(), &sql).await.expect("row values"));
    assert!(shown.contains("| 2 |"), "{shown}");
    let sql = format!("SELECT count(*) AS n FROM {values} WHERE (a, b) = (-100, '')");
    let shown = pretty(&run(&engine(), &sql).await.expect("a row value compared"));
    assert!(shown.contains("| 1 |"), "{shown}");
}

#[tokio::test]
async fn show_tables_takes_a_schema_and_a_filter() {
    let engine = engine();
    let names = |batches: Vec<RecordBatch>| pretty(&batches);
    let system = names(run(&engine, "SHOW TABLES FROM system").await.expect("system"));
    assert!(system.contains("| nodes ") && system.contains("| settings ") && system.contains("| queries "), "{system}");
    let like = names(run(&engine, "SHOW TABLES IN system LIKE 'n%'").await.expect("like"));
    assert_eq!(like, "+-------+\n| name  |\n+-------+\n| nodes |\n+-------+");
    let limited = run(&engine, "SHOW TABLES FROM system WHERE name <> 'nodes' LIMIT 1").await.expect("where");
    assert_eq!(limited.iter().map(|b| b.num_rows()).sum::<usize>(), 1);
    let err = run(&engine, "SHOW TABLES FROM nosuch").await.expect_err("no such schema").to_string();
    assert!(err.contains("SHOW TABLES FROM nosuch: no such schema; there are") && err.contains("system"), "{err}");
    let err = run(&engine, "SHOW FULL TABLES").await.expect_err("FULL").to_string();
    assert!(err.contains("not TERSE, HISTORY, EXTENDED, FULL or EXTERNAL"), "{err}");
}

#[tokio::test]
async fn the_nodes_own_statements_are_not_recorded() {
    let engine = engine();
    let before = engine.query_totals().0.by_state;
    run_in(&engine, "SELECT rank FROM system.nodes", &Arc::new(Session::unrecorded())).await.expect("unrecorded");
    assert_eq!(engine.query_totals().0.by_state, before);
    run(&engine, "SELECT rank FROM system.nodes").await.expect("recorded");
    assert_ne!(engine.query_totals().0.by_state, before);
}

/// What a ClickHouse user types first (`crate::clickhouse_statements`) runs.
#[tokio::test]
async fn clickhouses_first_statements_run() {
    let engine = engine();
    let described = pretty(&run(&engine, "DESCRIBE TABLE system.nodes").await.expect("describe table"));
    assert_eq!(described, pretty(&run(&engine, "DESCRIBE system.nodes").await.expect("describe")));
    let databases = pretty(&run(&engine, "SHOW DATABASES").await.expect("show databases"));
    assert!(databases.contains("| system ") && databases.contains("| public "), "{databases}");
    run(&engine, "SHOW PROCESSLIST").await.expect("show processlist");
    let current = pretty(&run(&engine, "SELECT currentDatabase()").await.expect("currentDatabase"));
    assert!(current.contains("| public "), "{current}");
}
