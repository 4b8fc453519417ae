//! End-to-end tests: `serve_flight` on an ephemeral port, queried with the Rust Flight SQL
//! client as `shardwise sql`, ADBC and JDBC would.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::util::pretty::pretty_format_batches;
use arrow_flight::error::FlightError;
use arrow_flight::sql::SqlInfo;
use arrow_flight::sql::client::FlightSqlServiceClient;
use futures::TryStreamExt;
use shardwise_cluster::{BoxFuture, ClusterView, MemberInfo, NodeState, Role};
use shardwise_query::QueryEngine;
use tokio::sync::oneshot;
use tonic::transport::Channel;

use crate::serve_flight;
use crate::users::{Users, Verifier};

#[derive(Debug)]
pub(crate) struct TwoNodes;

impl ClusterView for TwoNodes {
    fn rank(&self) -> u32 {
        0
    }
    fn world_size(&self) -> u32 {
        2
    }
    fn members(&self) -> BoxFuture<'_, Vec<MemberInfo>> {
        Box::pin(async {
            (0..2)
                .map(|rank| MemberInfo {
                    rank,
                    node_id: format!("n{rank}"),
                    role: Role::for_rank(rank),
                    addrs: BTreeMap::new(),
                    state: NodeState::Up,
                    epoch: 1,
                    last_heartbeat_unix_ms: None,
                })
                .collect()
        })
    }
}

/// A running server and a way to stop it.
struct Running {
    addr: std::net::SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), crate::ServerError>>,
}

impl Running {
    async fn start() -> Running {
        Running::start_with(Users::default_only()).await
    }

    async fn start_with(users: Users) -> Running {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let engine = Arc::new(QueryEngine::new(Arc::new(TwoNodes)).expect("engine"));
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve_flight(listener, engine, Arc::new(users), async move {
            let _ = stopped.await;
        }));
        Running { addr, stop: Some(stop), task }
    }

    async fn client(&self) -> FlightSqlServiceClient<Channel> {
        let channel =
            Channel::from_shared(format!("http://{}", self.addr)).expect("uri").connect().await.expect("connect");
        FlightSqlServiceClient::new(channel)
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.await.expect("join").expect("serve");
    }
}

async fn query(client: &mut FlightSqlServiceClient<Channel>, sql: &str) -> Result<Vec<RecordBatch>, FlightError> {
    let info = client.execute(sql.to_string(), None).await?;
    let mut batches = Vec::new();
    for endpoint in info.endpoint {
        let Some(ticket) = endpoint.ticket else {
            continue;
        };
        let stream = client.do_get(ticket).await?;
        batches.extend(stream.try_collect::<Vec<_>>().await?);
    }
    Ok(batches)
}

fn status_of(e: FlightError) -> tonic::Status {
    match e {
        FlightError::Tonic(status) => *status,
        other => panic!("expected a status, got {other:?}"),
    }
}

#[tokio::test]
async fn query_over_flight_sql() {
    let server = Running::start().await;
    let mut client = server.client().await;
    client.handshake("default", "").await.expect("handshake");
    assert!(client.token().is_some());

    let batches = query(&mut client, "SELECT node_id, role FROM system.nodes ORDER BY rank").await.expect("query");
    let table = pretty_format_batches(&batches).expect("format").to_string();
    assert_eq!(
        table,
        "+---------+--------+\n| node_id | role   |\n+---------+--------+\n| n0      | master |\n| n1      | worker |\n+---------+--------+"
    );

    // A user error comes back as InvalidArgument with DataFusion's message.
    let status = status_of(query(&mut client, "SELECT nope FROM system.nodes").await.unwrap_err());
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("nope"), "{}", status.message());

    let status = status_of(
        query(&mut client, "CREATE EXTERNAL TABLE t STORED AS CSV LOCATION '/nonexistent'").await.unwrap_err(),
    );
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().starts_with("statement not supported: "), "{}", status.message());

    server.stop().await;
}

#[tokio::test]
async fn anonymous_update_prepared_and_sql_info() {
    let server = Running::start().await;
    let mut client = server.client().await;

    // No handshake at all is accepted while no users are configured.
    let affected =
        client.execute_update("SET datafusion.execution.batch_size = 100".to_string(), None).await.expect("set");
    assert_eq!(affected, 0);

    // An empty result still carries its schema.
    let info = client.execute("SELECT rank FROM system.nodes WHERE rank > 5".to_string(), None).await.expect("execute");
    let schema = info.clone().try_decode_schema().expect("schema");
    assert_eq!(schema.field(0).name(), "rank");
    let ticket = info.endpoint[0].ticket.clone().expect("ticket");
    let mut stream = client.do_get(ticket).await.expect("do_get");
    let rows: Vec<RecordBatch> = (&mut stream).try_collect().await.expect("rows");
    assert_eq!(rows.iter().map(RecordBatch::num_rows).sum::<usize>(), 0);
    assert_eq!(stream.schema().map(|s| s.field(0).name().clone()), Some("rank".into()));

    // Prepared statements: the handle is the SQL.
    let mut prepared =
        client.prepare("SELECT count(*) AS n FROM system.nodes".to_string(), None).await.expect("prepare");
    assert_eq!(prepared.dataset_schema().expect("schema").field(0).name(), "n");
    let info = prepared.execute().await.expect("execute prepared");
    let ticket = info.endpoint[0].ticket.clone().expect("ticket");
    let batches: Vec<RecordBatch> = client.do_get(ticket).await.expect("do_get").try_collect().await.expect("rows");
    assert!(pretty_format_batches(&batches).expect("fmt").to_string().contains("| 2 |"));
    prepared.close().await.expect("close");

    // With parameters (`?` as ADBC and JDBC write them, or `$n`): the values the client binds
    // are spliced in, and the statement's new handle runs them.
    let mut prepared = client.prepare("SELECT ? + 1 AS x, $2 AS s".to_string(), None).await.expect("prepare");
    // Bound twice: the second time (the client then holds the bound handle) with new values,
    // which must be the ones that run.
    for (number, text, expected) in [(41, "it's", "| 42 | it's |"), (-6, "x", "| -5 | x |")] {
        let values = RecordBatch::try_from_iter([
            ("a", std::sync::Arc::new(datafusion::arrow::array::Int64Array::from(vec![number])) as _),
            ("b", std::sync::Arc::new(datafusion::arrow::array::StringArray::from(vec![text])) as _),
        ])
        .expect("values");
        prepared.set_parameters(values).expect("bind");
        let info = prepared.execute().await.expect("execute bound");
        let ticket = info.endpoint[0].ticket.clone().expect("ticket");
        let batches: Vec<RecordBatch> = client.do_get(ticket).await.expect("do_get").try_collect().await.expect("rows");
        let shown = pretty_format_batches(&batches).expect("fmt").to_string();
        assert!(shown.contains(expected), "{shown}");
    }

    // Server description.
    let info = client.get_sql_info(vec![SqlInfo::FlightSqlServerName]).await.expect("sql info");
    let ticket = info.endpoint[0].ticket.clone().expect("ticket");
    let batches: Vec<RecordBatch> = client.do_get(ticket).await.expect("do_get").try_collect().await.expect("rows");
    let text = pretty_format_batches(&batches).expect("fmt").to_string();
    assert!(text.contains("shardwise"), "{text}");

    server.stop().await;
}

#[tokio::test]
async fn other_users_and_stale_tokens_are_refused() {
    let server = Running::start().await;
    let mut client = server.client().await;
    let err = client.handshake("admin", "secret").await.unwrap_err();
    assert!(err.to_string().contains("unknown user"), "{err}");

    client.set_token("not-issued-here".to_string());
    let status = status_of(query(&mut client, "SELECT 1").await.unwrap_err());
    assert_eq!(status.code(), tonic::Code::Unauthenticated);

    server.stop().await;
}

#[tokio::test]
async fn configured_users_log_in_with_their_password_only() {
    let config = std::collections::BTreeMap::from([("alice".to_string(), Verifier::generate("s3cret").to_string())]);
    let server = Running::start_with(Users::from_config(&config).expect("users")).await;

    let mut anonymous = server.client().await;
    let status = status_of(query(&mut anonymous, "SELECT 1").await.unwrap_err());
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    assert!(status.message().contains("credentials required"), "{}", status.message());

    let mut wrong = server.client().await;
    let err = wrong.handshake("alice", "guess").await.unwrap_err();
    let err = err.to_string();
    assert!(err.contains("password authentication failed for user") && err.contains("alice"), "{err}");
    let err = wrong.handshake("default", "").await.unwrap_err();
    let err = err.to_string();
    assert!(err.contains("password authentication failed for user") && err.contains("default"), "{err}");

    let mut alice = server.client().await;
    alice.handshake("alice", "s3cret").await.expect("alice logs in");
    let batches = query(&mut alice, "SELECT 41 + 1 AS answer").await.expect("query with the token");
    assert_eq!(batches[0].num_rows(), 1);

    server.stop().await;
}

#[tokio::test]
async fn statements_run_for_their_effect_run_when_submitted() {
    let server = Running::start().await;
    let mut client = server.client().await;
    // Submitted, never fetched: the SET holds anyway (ADBC's cursor.execute may never fetch).
    let info = client.execute("SET max_execution_time_ms = 4321".to_string(), None).await.expect("submit");
    let setting = "SELECT value FROM information_schema.df_settings WHERE name = 'max_execution_time_ms'";
    let batches = query(&mut client, setting).await.expect("read the setting");
    let text = pretty_format_batches(&batches).expect("format").to_string();
    assert!(text.contains("4321"), "{text}");
    // Its (empty) result can still be fetched once.
    let ticket = info.endpoint[0].ticket.clone().expect("ticket");
    let fetched: Vec<RecordBatch> =
        client.do_get(ticket.clone()).await.expect("do_get").try_collect().await.expect("rows");
    assert_eq!(fetched.iter().map(RecordBatch::num_rows).sum::<usize>(), 0);
    let again = client.do_get(ticket).await;
    let err = match again {
        Ok(stream) => stream.try_collect::<Vec<RecordBatch>>().await.map(|_| ()).unwrap_err(),
        Err(e) => e,
    };
    assert!(err.to_string().contains("fetched already"), "{err}");
    server.stop().await;
}

#[tokio::test]
async fn a_ticket_runs_the_plan_made_for_it_then_plans_again() {
    let server = Running::start().await;
    let mut client = server.client().await;
    let mut other = server.client().await;
    let sql = "SELECT value FROM information_schema.df_settings WHERE name = 'max_execution_time_ms'";
    query(&mut client, "SET max_execution_time_ms = 4321").await.expect("set");
    let mine = client.execute(sql.to_string(), None).await.expect("submit").endpoint[0].ticket.clone().expect("ticket");
    let theirs =
        client.execute(sql.to_string(), None).await.expect("submit").endpoint[0].ticket.clone().expect("ticket");
    query(&mut client, "SET max_execution_time_ms = 1234").await.expect("set again");
    async fn value(client: &mut FlightSqlServiceClient<Channel>, ticket: arrow_flight::Ticket) -> String {
        let batches: Vec<RecordBatch> = client.do_get(ticket).await.expect("do_get").try_collect().await.expect("rows");
        pretty_format_batches(&batches).expect("format").to_string()
    }
    // The first DoGet runs the plan GetFlightInfo made, in the session as it was then.
    assert!(value(&mut client, mine.clone()).await.contains("4321"));
    // The plan is taken: the same ticket again plans its SQL again, in the session as it is now.
    assert!(value(&mut client, mine).await.contains("1234"));
    // On another connection (another session), the ticket's SQL is planned in that session.
    let there = value(&mut other, theirs).await;
    assert!(!there.contains("4321") && !there.contains("1234"), "{there}");
    server.stop().await;
}

#[tokio::test]
async fn metadata_calls_list_what_queries_can_name() {
    use arrow_flight::sql::{CommandGetDbSchemas, CommandGetTables};
    let server = Running::start().await;
    let mut client = server.client().await;
    async fn rows(client: &mut FlightSqlServiceClient<Channel>, info: arrow_flight::FlightInfo) -> String {
        let ticket = info.endpoint[0].ticket.clone().expect("ticket");
        let batches: Vec<RecordBatch> = client.do_get(ticket).await.expect("do_get").try_collect().await.expect("rows");
        pretty_format_batches(&batches).expect("fmt").to_string()
    }

    let info = client.get_catalogs().await.expect("catalogs");
    assert!(rows(&mut client, info).await.contains("| shardwise "));
    let schemas = CommandGetDbSchemas { catalog: None, db_schema_filter_pattern: Some("sys%".into()) };
    let info = client.get_db_schemas(schemas).await.expect("schemas");
    let text = rows(&mut client, info).await;
    assert!(text.contains("| system ") && !text.contains("public"), "{text}");
    // information_schema, which DataFusion answers outside the catalog's schemas, with its views.
    let schemas = CommandGetDbSchemas { catalog: None, db_schema_filter_pattern: Some("info%".into()) };
    let info = client.get_db_schemas(schemas).await.expect("schemas");
    let text = rows(&mut client, info).await;
    assert!(text.contains("| information_schema "), "{text}");
    let tables = CommandGetTables {
        catalog: None,
        db_schema_filter_pattern: Some("information_schema".into()),
        table_name_filter_pattern: Some("col%".into()),
        table_types: vec![],
        include_schema: false,
    };
    let info = client.get_tables(tables).await.expect("tables");
    let text = rows(&mut client, info).await;
    assert!(text.contains("| information_schema ") && text.contains("| columns "), "{text}");
    // The system tables, filtered by pattern, with their Arrow schemas.
    let tables = CommandGetTables {
        catalog: None,
        db_schema_filter_pattern: Some("system".into()),
        table_name_filter_pattern: Some("node_".into()),
        table_types: vec![],
        include_schema: true,
    };
    let info = client.get_tables(tables).await.expect("tables");
    let ticket = info.endpoint[0].ticket.clone().expect("ticket");
    let batches: Vec<RecordBatch> = client.do_get(ticket).await.expect("do_get").try_collect().await.expect("rows");
    assert_eq!(batches.iter().map(RecordBatch::num_rows).sum::<usize>(), 1, "system.nodes only");
    let schema_bytes = batches[0].column_by_name("table_schema").expect("table_schema column");
    let bytes = schema_bytes.as_any().downcast_ref::<arrow::array::BinaryArray>().expect("binary").value(0);
    let schema = arrow::ipc::convert::try_schema_from_ipc_buffer(bytes).expect("schema");
    assert_eq!(schema.field(0).name(), "rank");
    let info = client.get_table_types().await.expect("types");
    let text = rows(&mut client, info).await;
    assert!(text.contains("| TABLE ") && text.contains("| VIEW "), "{text}");

    server.stop().await;
}

#[tokio::test]
async fn an_empty_upload_is_refused_in_words() {
    // What ADBC's bulk ingest of zero rows sends: a DoPut with no message at all.
    let server = Running::start().await;
    let channel =
        Channel::from_shared(format!("http://{}", server.addr)).expect("uri").connect().await.expect("connect");
    let mut raw = arrow_flight::flight_service_client::FlightServiceClient::new(channel);
    let err = raw.do_put(futures::stream::empty::<arrow_flight::FlightData>()).await.expect_err("an empty upload");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
    assert!(err.message().contains("the upload was empty") && err.message().contains("nothing was done"), "{err}");
    server.stop().await;
}
