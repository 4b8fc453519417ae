//! The PostgreSQL wire protocol on every node (the pgwire crate), so `psql`, psycopg and other
//! PostgreSQL drivers connect to database `shardwise` and run the same SQL as over Flight SQL,
//! with the same users.
//!
//! Each accepted connection gets its own handlers and its own [`Session`]: what `SET` changes
//! lasts for the connection. pgwire reads the connection's messages only once [`framing`] has
//! checked each against its declared length. The simple query protocol runs each `;`-separated statement in turn
//! and stops at the first error, as PostgreSQL does; the extended protocol (what drivers use)
//! plans a statement when it is parsed, so a bad statement fails at `Parse` and `Describe` knows
//! its columns. Results stream: rows reach the client as the plan produces them.
//!
//! What PostgreSQL clients send that shardwise has no use for is accepted and does nothing:
//! `BEGIN`/`COMMIT`/`ROLLBACK` (shardwise has no transactions: every statement applies on its
//! own, and `ROLLBACK` undoes nothing), savepoints and `SET` of PostgreSQL client parameters such as
//! `extra_float_digits` or `application_name`. Bind parameters (`$1`) become literals
//! ([`params`]).

mod cancel;
pub(crate) mod copy;
pub(crate) mod copy_csv;
pub(crate) mod copy_in;
mod copy_out;
mod cursor;
mod encode;
mod errors;
mod execute;
mod float;
pub(crate) mod framing;
mod numeric;
mod params;
mod show;
mod startup;
mod startup_options;

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
use futures::{Sink, SinkExt, StreamExt, TryStreamExt, future, stream};
use pgwire::api::copy::CopyHandler;
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{CopyResponse, DescribePortalResponse, FieldInfo, QueryResponse, Response, Tag};
use pgwire::api::stmt::QueryParser;
use pgwire::api::store::PortalStore;
use pgwire::api::{ClientInfo, ClientPortalStore, PgWireServerHandlers, Type};
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::PgWireBackendMessage;
use pgwire::messages::copy::{CopyData, CopyDone, CopyFail};
use shardwise_query::sql_split::split_statements;
use shardwise_query::{QueryEngine, QueryError, Session};
use tokio::net::TcpListener;

use crate::users::Users;
pub use errors::pg_error;
use errors::syntax_error;

/// The one database a node serves.
pub const PG_DATABASE: &str = shardwise_query::engine::CATALOG;

/// PostgreSQL client parameters a `SET` may name that shardwise accepts and ignores: drivers set
/// them on connect (JDBC sets `extra_float_digits`, many set `application_name`).
const IGNORED_CLIENT_PARAMETERS: &[&str] = &[
    "application_name",
    "client_encoding",
    "client_min_messages",
    "datestyle",
    "extra_float_digits",
    "intervalstyle",
    "search_path",
    "standard_conforming_strings",
    "time",
    "timezone",
    "bytea_output",
    "lc_messages",
    "lc_monetary",
    "lc_numeric",
    "lc_time",
    "default_transaction_isolation",
    "session",
    // What a `pg_dump` script sets before its statements (shardwise takes no locks a statement
    // waits on for long, has no transactions to sit idle in, no functions, XML or row security,
    // and one storage), and `synchronous_commit` (an acknowledged row is always durable).
    "lock_timeout",
    "idle_in_transaction_session_timeout",
    "idle_session_timeout",
    "check_function_bodies",
    "xmloption",
    "row_security",
    "default_tablespace",
    "default_table_access_method",
    "synchronous_commit",
];

/// Serves the PostgreSQL protocol on `listener` until `shutdown` completes. Connections in
/// progress end with the process.
pub async fn serve(
    listener: TcpListener,
    engine: Arc<QueryEngine>,
    users: Arc<Users>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), crate::ServerError> {
    serve_capped(listener, engine, users, shutdown, PG_MAX_CONNECTIONS).await
}

/// [`serve`] with at most `max_connections` open at once.
async fn serve_capped(
    listener: TcpListener,
    engine: Arc<QueryEngine>,
    users: Arc<Users>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    max_connections: usize,
) -> Result<(), crate::ServerError> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "postgres endpoint listening");
    }
    let startup = Arc::new(startup::Startup::new(users));
    tokio::pin!(shutdown);
    let open = Arc::new(tokio::sync::Semaphore::new(max_connections));
    let mut listener = listener;
    loop {
        // axum's accept, as the other endpoints': errors such as running out of descriptors are
        // logged and waited out (a second at a time), never a spin.
        let (socket, peer) = tokio::select! {
            () = &mut shutdown => return Ok(()),
            accepted = axum::serve::Listener::accept(&mut listener) => accepted,
        };
        if let Err(e) = socket.set_nodelay(true) {
            tracing::debug!("cannot set TCP_NODELAY: {e}");
        }
        if let Err(e) = keep_alive(&socket) {
            tracing::debug!("cannot set TCP keep-alive: {e}");
        }
        // Past the cap the client is told so and the connection closes, as PostgreSQL does.
        let Ok(place) = Arc::clone(&open).try_acquire_owned() else {
            tracing::debug!(%peer, "postgres endpoint: {max_connections} connections open; refused one");
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                let mut socket = socket;
                let message = format!("sorry, too many clients already ({max_connections}, PG_MAX_CONNECTIONS)");
                let _ = socket.write_all(&framing::fatal_error("53300", &message)).await;
                let _ = socket.shutdown().await;
            });
            continue;
        };
        let counter = Arc::new(tokio::sync::watch::Sender::new(0));
        let handlers = Connection::new(Arc::clone(&engine), Arc::clone(&startup), Arc::clone(&counter));
        tokio::spawn(async move {
            let _place = place;
            let Some(socket) = answer_cluster_preamble(socket).await else { return };
            // A client that goes away cancels its running statement (see `cancel::hangups`).
            let fd = std::os::fd::AsRawFd::as_raw_fd(&socket);
            // pgwire reads the client's messages only once they are checked (see `framing`).
            let (relayed, pgwire_end) = match tokio::net::UnixStream::pair() {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::warn!(%peer, "postgres endpoint: cannot make a socket pair for a connection: {e}");
                    return;
                }
            };
            let served = async {
                let (ended, ()) = tokio::join!(
                    pgwire::tokio::process_socket_unix(pgwire_end, handlers),
                    framing::relay(
                        socket,
                        relayed,
                        (
                            Duration::from_millis(framing::PG_SEND_TIMEOUT_MS),
                            Duration::from_millis(framing::PG_RECEIVE_TIMEOUT_MS)
                        ),
                    )
                );
                ended
            };
            tokio::select! {
                ended = served => {
                    if let Err(e) = ended {
                        tracing::debug!(%peer, "postgres connection ended: {e}");
                    }
                }
                () = cancel::hangups(fd, counter) => {
                    tracing::debug!(%peer, "postgres client went away; its statement is stopped");
                }
            }
        });
    }
}

/// PostgreSQL connections a node keeps open at once (PostgreSQL's `max_connections`); one more
/// is refused with `53300 sorry, too many clients already`.
pub const PG_MAX_CONNECTIONS: usize = 1024;

/// How long a PostgreSQL connection may carry nothing before the kernel probes its client
/// (TCP keep-alive, as PostgreSQL turns on for its clients): a client whose host vanished (a
/// laptop closed, a network cut, a NAT that forgot it) never says goodbye, and would hold one of
/// the [`PG_MAX_CONNECTIONS`] places for the node's life.
pub const PG_TCP_KEEPALIVE_IDLE_MS: u64 = 60_000;
/// Time between two unanswered keep-alive probes.
pub const PG_TCP_KEEPALIVE_INTERVAL_MS: u64 = 10_000;
/// Unanswered probes after which the connection is closed (so a dead client is let go about
/// 2 minutes after it went quiet).
pub const PG_TCP_KEEPALIVE_PROBES: u32 = 6;

/// Turns TCP keep-alive on for an accepted connection ([`PG_TCP_KEEPALIVE_IDLE_MS`]).
fn keep_alive(socket: &tokio::net::TcpStream) -> std::io::Result<()> {
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(Duration::from_millis(PG_TCP_KEEPALIVE_IDLE_MS))
        .with_interval(Duration::from_millis(PG_TCP_KEEPALIVE_INTERVAL_MS))
        .with_retries(PG_TCP_KEEPALIVE_PROBES);
    socket2::SockRef::from(socket).set_tcp_keepalive(&keepalive)
}

/// Longest wait for a connection's first bytes before it is handed to pgwire regardless.
const FIRST_BYTES_WAIT_MS: u64 = 10_000;

/// `socket`, unless its first bytes are a cluster node's preamble (a node given this port as
/// the master's): then the node is told so, and the connection closes (`None`). A PostgreSQL
/// client's startup message begins with its length, whose first byte is 0; the bytes are only
/// peeked at, so pgwire reads them as sent.
async fn answer_cluster_preamble(mut socket: tokio::net::TcpStream) -> Option<tokio::net::TcpStream> {
    use tokio::io::AsyncWriteExt;
    let mut first = [0u8; 8];
    let wait = std::time::Duration::from_millis(FIRST_BYTES_WAIT_MS);
    match tokio::time::timeout(wait, socket.peek(&mut first)).await {
        Ok(Ok(n)) if shardwise_cluster::wire::is_cluster_preamble(&first[..n]) => {
            tracing::warn!(
                "postgres endpoint: a cluster node connected here; it was told this is not the master's port"
            );
            let _ = socket.write_all(&shardwise_cluster::wire::client_endpoint_answer(b"pg")).await;
            let _ = socket.shutdown().await;
            None
        }
        _ => Some(socket),
    }
}

/// The handlers of one client connection.
struct Connection {
    handler: Arc<Handler>,
    startup: Arc<startup::Startup>,
}

impl Connection {
    fn new(
        engine: Arc<QueryEngine>,
        startup: Arc<startup::Startup>,
        counter: Arc<tokio::sync::watch::Sender<u64>>,
    ) -> Connection {
        let session = Arc::new(Session::new());
        let cancels = startup.cancels();
        let handler = Handler {
            engine,
            session,
            copy_in: Default::default(),
            cancels,
            counter,
            cancel: Default::default(),
            cursors: Default::default(),
        };
        Connection { handler: Arc::new(handler), startup }
    }
}

impl PgWireServerHandlers for Connection {
    fn simple_query_handler(&self) -> Arc<impl SimpleQueryHandler> {
        Arc::clone(&self.handler)
    }

    fn extended_query_handler(&self) -> Arc<impl ExtendedQueryHandler> {
        Arc::clone(&self.handler)
    }

    fn startup_handler(&self) -> Arc<impl pgwire::api::auth::StartupHandler> {
        Arc::new(startup_options::ConnectionStartup {
            shared: Arc::clone(&self.startup),
            handler: Arc::clone(&self.handler),
        })
    }

    fn copy_handler(&self) -> Arc<impl CopyHandler> {
        Arc::clone(&self.handler)
    }

    fn cancel_handler(&self) -> Arc<impl pgwire::api::cancel::CancelHandler> {
        Arc::new(cancel::CancelRequests(self.startup.cancels()))
    }
}

/// Runs statements in the connection's session.
struct Handler {
    engine: Arc<QueryEngine>,
    session: Arc<Session>,
    /// The `COPY ... FROM STDIN` whose data is arriving, if any.
    copy_in: std::sync::Mutex<Option<copy_in::PendingCopyIn>>,
    /// The node's cancel counters, and this connection's, registered at its first statement.
    cancels: Arc<cancel::Cancels>,
    /// This connection's cancel counter: a cancel request and the client going away move it.
    counter: Arc<tokio::sync::watch::Sender<u64>>,
    cancel: std::sync::OnceLock<cancel::Registration>,
    /// The connection's open cursors ([`cursor`]); shared with its statement parser.
    cursors: Arc<std::sync::Mutex<cursor::Cursors>>,
}

impl Handler {
    /// What a cancel request for this connection moves, for the statement about to run.
    fn cancel_signal<C: ClientInfo>(&self, client: &C) -> Option<tokio::sync::watch::Receiver<u64>> {
        let (pid, secret_key) = client.pid_and_secret_key();
        Some(self.cancel.get_or_init(|| self.cancels.register(pid, &secret_key, Arc::clone(&self.counter))).signal())
    }
}

/// A statement of the extended protocol: its SQL and, once planned, its result columns.
#[derive(Debug, Clone)]
pub struct Statement {
    sql: String,
    /// The result columns; `None` for statements the engine does not run.
    schema: Option<SchemaRef>,
    /// True when the SQL has bind parameters (`$1`).
    parameters: bool,
    /// The parameters' types as planning inferred them (`id > $1`: the column's), for the
    /// clients that declare none (asyncpg); text where nothing says.
    parameter_types: Vec<Type>,
}

/// What a statement is, as far as the protocol cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Begin,
    Commit,
    Rollback,
    /// `SET` of a PostgreSQL client parameter.
    IgnoredSet,
    /// `SAVEPOINT`, `RELEASE [SAVEPOINT]`, `ROLLBACK TO [SAVEPOINT]` (psycopg 3 nests its
    /// transactions with them): accepted and no-ops, as `BEGIN` and `ROLLBACK` are.
    Savepoint,
    /// `DEALLOCATE [PREPARE] name | ALL` (psycopg sends it on rollback).
    Deallocate,
    /// `UNLISTEN channel | *` (asyncpg's pool sends it when it takes a connection back).
    Unlisten,
    /// `DISCARD ALL | PLANS | SEQUENCES | TEMP` (PgBouncer's reset query).
    Discard,
    /// `COPY ... TO STDOUT` or `FROM STDIN` ([`copy`]; psql's `\copy`).
    Copy,
    /// `DECLARE`, `FETCH`, `MOVE`, `CLOSE` ([`cursor`]).
    Cursor,
    /// Anything the engine runs.
    Sql,
}

/// The statement's first two words, upper-cased (for the kind and the command tag).
fn leading_words(sql: &str) -> Vec<String> {
    words(sql, 2)
}

/// The statement's first `n` words (names, keywords; other tokens as empty words), upper-cased.
fn words(sql: &str, n: usize) -> Vec<String> {
    let dialect = GenericDialect {};
    let tokens = Tokenizer::new(&dialect, sql).tokenize().unwrap_or_default();
    tokens
        .iter()
        .filter_map(|t| match t {
            Token::Word(w) => Some(w.value.to_ascii_uppercase()),
            Token::Whitespace(_) => None,
            _ => Some(String::new()),
        })
        .take(n)
        .collect()
}

/// Forgets the statement a `DEALLOCATE` names; `ALL` forgets nothing (a statement parsed again
/// under its name replaces it, and all go with the connection).
fn deallocate<S: PortalStore>(store: &S, sql: &str) {
    let dialect = GenericDialect {};
    let tokens = Tokenizer::new(&dialect, sql).tokenize().unwrap_or_default();
    let names: Vec<&str> = tokens
        .iter()
        .filter_map(|t| match t {
            Token::Word(w) => Some(w.value.as_str()),
            _ => None,
        })
        .filter(|w| !w.eq_ignore_ascii_case("DEALLOCATE") && !w.eq_ignore_ascii_case("PREPARE"))
        .collect();
    if let [name] = names[..]
        && !name.eq_ignore_ascii_case("ALL")
    {
        store.rm_statement(name);
    }
}

fn kind_of(sql: &str) -> Kind {
    let words = leading_words(sql);
    let first = words.first().map(String::as_str).unwrap_or("");
    let second = words.get(1).map(|w| w.to_ascii_lowercase()).unwrap_or_default();
    match first {
        "BEGIN" | "START" => Kind::Begin,
        "COMMIT" | "END" => Kind::Commit,
        "ROLLBACK" if second == "to" => Kind::Savepoint,
        "ROLLBACK" | "ABORT" => Kind::Rollback,
        "SAVEPOINT" | "RELEASE" => Kind::Savepoint,
        "DEALLOCATE" => Kind::Deallocate,
        "COPY" => Kind::Copy,
        "DECLARE" | "FETCH" | "MOVE" | "CLOSE" => Kind::Cursor,
        "SET" if IGNORED_CLIENT_PARAMETERS.contains(&second.as_str()) => Kind::IgnoredSet,
        "UNLISTEN" => Kind::Unlisten,
        "DISCARD" => Kind::Discard,
        _ => Kind::Sql,
    }
}

/// `SAVEPOINT`, `RELEASE` or `ROLLBACK`: PostgreSQL's tag for a savepoint statement.
fn savepoint_tag(sql: &str) -> String {
    leading_words(sql).into_iter().next().unwrap_or_default()
}

/// The command tag PostgreSQL sends for a statement without rows: `CREATE TABLE`, `SET`, ...
fn command_tag(sql: &str) -> String {
    let words = leading_words(sql);
    match words.first().map(String::as_str) {
        Some(first @ ("CREATE" | "DROP" | "TRUNCATE" | "ALTER")) => {
            format!("{first} {}", words.get(1).map(String::as_str).unwrap_or(""))
        }
        Some(first) if !first.is_empty() => first.to_string(),
        _ => "OK".to_string(),
    }
}

/// True when `sql` holds a bind parameter (`$1`).
fn has_parameters(sql: &str) -> bool {
    let dialect = GenericDialect {};
    let tokens = Tokenizer::new(&dialect, sql).tokenize().unwrap_or_default();
    tokens.iter().any(|t| matches!(t, Token::Placeholder(_)))
}

/// DataFusion reports DML as one `count: UInt64` column.
fn affected_rows(batches: &[RecordBatch]) -> usize {
    batches
        .iter()
        .filter_map(|b| b.column(0).as_any().downcast_ref::<datafusion::arrow::array::UInt64Array>())
        .map(|counts| counts.iter().flatten().sum::<u64>())
        .sum::<u64>() as usize
}

impl Handler {
    /// `COPY ... TO STDOUT` streams the query's rows; `COPY t FROM STDIN` checks the table and
    /// its columns, then waits for the data ([`CopyHandler`] below).
    async fn copy(&self, sql: &str) -> PgWireResult<Response> {
        match copy::parse(sql)?.ok_or_else(|| syntax_error("expected COPY ... TO STDOUT or FROM STDIN".into()))? {
            copy::Copy::Out { query, format } => {
                let planned = self.engine.plan_to_run(&query, &self.session).await.map_err(pg_error)?;
                let columns = planned.schema().fields().len();
                let results = self.engine.execute(planned).await.map_err(pg_error)?;
                Ok(Response::CopyOut(CopyResponse::new(0, columns, format.data(results))))
            }
            copy::Copy::In { table, columns, format, settings } => {
                // A bad setting fails the COPY before the client sends its data.
                self.engine.session_with(&settings).map_err(pg_error)?;
                let (schema, indices) = copy_in::target_columns(&self.engine, &self.session, &table, &columns, "COPY")
                    .await
                    .map_err(pg_error)?;
                let width = indices.len();
                // Shown in `system.queries` while its data arrives, and counted toward
                // MAX_CONCURRENT_QUERIES: the data is held until its end.
                let query_id = self.engine.query_id_of(&self.session, &settings);
                let running =
                    self.engine.begin_statement(&format!("COPY {table} FROM STDIN"), query_id).map_err(pg_error)?;
                let incarnation = self.engine.incarnation_of(&table);
                let pending = copy_in::PendingCopyIn::new(table, schema, indices, format, settings)
                    .running(running)
                    .bound_to(incarnation);
                *self.copy_in.lock().unwrap_or_else(|p| p.into_inner()) = Some(pending);
                Ok(Response::CopyIn(CopyResponse::new(0, width, stream::empty())))
            }
        }
    }

    /// A `COPY ... TO STDOUT` sent here ([`copy_out::send`]); `None` for another statement.
    async fn copy_out_here<C>(&self, client: &mut C, sql: &str) -> PgWireResult<Option<Response>>
    where
        C: Sink<PgWireBackendMessage> + Unpin,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if kind_of(sql) != Kind::Copy {
            return Ok(None);
        }
        let Some(copy::Copy::Out { query, format }) = copy::parse(sql)? else { return Ok(None) };
        let planned = self.engine.plan_to_run(&query, &self.session).await.map_err(pg_error)?;
        let columns = planned.schema().fields().len();
        let results = self.engine.execute(planned).await.map_err(pg_error)?;
        let tag = copy_out::send(client, columns, format.data(results)).await?;
        Ok(Some(Response::Execution(tag)))
    }

    /// A setting of the startup packet's `options` ([`startup_options`]), applied as `SET`
    /// applies it; PostgreSQL's client parameters that `SET` ignores are ignored.
    async fn apply_startup_setting(&self, name: &str, value: &str) -> Result<(), QueryError> {
        if IGNORED_CLIENT_PARAMETERS.contains(&name.to_ascii_lowercase().as_str()) {
            return Ok(());
        }
        let sql = format!("SET {name} = {}", shardwise_query::sql_text::string_literal(value));
        let planned = self.engine.plan(&sql, &self.session).await?;
        let _: Vec<RecordBatch> = self.engine.execute(planned).await?.try_collect().await?;
        Ok(())
    }

    fn take_copy_in(&self) -> Option<copy_in::PendingCopyIn> {
        self.copy_in.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Plans a statement of the extended protocol for its result columns. A statement with
    /// parameters is planned with NULL for each (typed as the client declared), which gives its
    /// columns without its values.
    async fn plan(&self, sql: &str, declared: &[Option<Type>]) -> PgWireResult<Statement> {
        if kind_of(sql) == Kind::Cursor {
            let schema = match cursor::parse(sql) {
                Some(Ok(command)) => self.cursor_schema(&command),
                Some(Err(message)) => return Err(syntax_error(message)),
                None => None,
            };
            return Ok(Statement { sql: sql.to_string(), schema, parameters: false, parameter_types: Vec::new() });
        }
        if kind_of(sql) != Kind::Sql {
            return Ok(Statement {
                sql: sql.to_string(),
                schema: None,
                parameters: false,
                parameter_types: Vec::new(),
            });
        }
        let rewritten = show::rewrite(sql).or_else(|| shardwise_query::pg_catalog::rewrite(sql));
        let sql = rewritten.as_deref().unwrap_or(sql);
        if has_parameters(sql) {
            let nulls: Vec<String> = (0..params::count(sql)?)
                .map(|i| params::null_of(declared.get(i).cloned().flatten().as_ref()))
                .collect();
            let schema = match self.engine.plan(&params::splice(sql, &nulls)?, &self.session).await {
                Ok(planned) => Some(planned.postgres_schema()),
                Err(_) => None,
            };
            // Planned once more, with its placeholders, only when the client left a type out.
            let all_declared = (0..nulls.len()).all(|i| declared.get(i).is_some_and(Option::is_some));
            let inferred = match all_declared {
                true => vec![None; nulls.len()],
                false => match self.engine.plan(sql, &self.session).await {
                    Ok(planned) => planned.parameter_types(nulls.len()),
                    Err(_) => vec![None; nulls.len()],
                },
            };
            let parameter_types = inferred
                .iter()
                .enumerate()
                .map(|(i, t)| match declared.get(i).cloned().flatten() {
                    Some(ty) => ty,
                    None => t.as_ref().map_or(Type::TEXT, encode::parameter_type),
                })
                .collect();
            return Ok(Statement { sql: sql.to_string(), schema, parameters: true, parameter_types });
        }
        let planned = self.engine.plan_to_run(sql, &self.session).await.map_err(pg_error)?;
        Ok(Statement {
            sql: sql.to_string(),
            schema: Some(planned.postgres_schema()),
            parameters: false,
            parameter_types: Vec::new(),
        })
    }

    /// [`Handler::run`], with the connection: cursor statements use its portals, and the end
    /// of a transaction closes its cursors declared without hold.
    async fn run_with<C>(
        &self,
        client: &C,
        sql: &str,
        format: &Format,
        stream: bool,
        cancel: Option<tokio::sync::watch::Receiver<u64>>,
    ) -> PgWireResult<Response>
    where
        C: ClientPortalStore + Sync,
        C::PortalStore: PortalStore,
    {
        match kind_of(sql) {
            Kind::Commit | Kind::Rollback => self.end_transaction(client),
            Kind::Cursor => {
                return match cursor::parse(sql) {
                    Some(Ok(command)) => self.cursor(client, command, format, cancel).await,
                    Some(Err(message)) => Err(syntax_error(message)),
                    None => Err(syntax_error(format!("not a cursor statement: {sql}"))),
                };
            }
            // PgBouncer's reset query (its default `server_reset_query`): the session's cursors
            // closed and its settings back to their defaults, as a new connection has them.
            Kind::Discard => {
                let words = leading_words(sql);
                return match words.get(1).map(String::as_str) {
                    Some("ALL") => {
                        if let Some(Ok(close_all)) = cursor::parse("CLOSE ALL") {
                            self.cursor(client, close_all, format, cancel.clone()).await?;
                        }
                        self.run("RESET ALL", format, false, cancel).await?;
                        Ok(Response::Execution(Tag::new("DISCARD ALL")))
                    }
                    // No plans, sequences or temporary tables are kept: nothing to discard.
                    Some(what @ ("PLANS" | "SEQUENCES" | "TEMP" | "TEMPORARY")) => {
                        Ok(Response::Execution(Tag::new(&format!("DISCARD {what}"))))
                    }
                    _ => Err(syntax_error(format!("expected DISCARD ALL, PLANS, SEQUENCES or TEMP: {sql}"))),
                };
            }
            _ => {}
        }
        self.run(sql, format, stream, cancel).await
    }

    /// Runs one statement. Rows stream when `stream` is set; otherwise the statement runs to
    /// completion here (statements that follow it in the same simple query see its effect).
    async fn run(
        &self,
        sql: &str,
        format: &Format,
        stream: bool,
        cancel: Option<tokio::sync::watch::Receiver<u64>>,
    ) -> PgWireResult<Response> {
        match kind_of(sql) {
            Kind::Begin => return Ok(Response::TransactionStart(Tag::new("BEGIN"))),
            Kind::Commit => return Ok(Response::TransactionEnd(Tag::new("COMMIT"))),
            Kind::Rollback => return Ok(Response::TransactionEnd(Tag::new("ROLLBACK"))),
            Kind::IgnoredSet => return Ok(Response::Execution(Tag::new("SET"))),
            // Nothing can be listened to (LISTEN is refused), so there is nothing to stop.
            Kind::Unlisten => return Ok(Response::Execution(Tag::new("UNLISTEN"))),
            Kind::Savepoint => return Ok(Response::Execution(Tag::new(&savepoint_tag(sql)))),
            Kind::Deallocate => return Ok(Response::Execution(Tag::new("DEALLOCATE"))),
            Kind::Copy => return self.copy(sql).await,
            Kind::Cursor | Kind::Discard => {
                return Err(syntax_error("a cursor statement or DISCARD needs its connection's portals".into()));
            }
            Kind::Sql => {}
        }
        // psql's `\d` and schema browsers read pg_catalog in PostgreSQL's own dialect; drivers
        // ask for PostgreSQL's parameters.
        let rewritten = show::rewrite(sql).or_else(|| shardwise_query::pg_catalog::rewrite(sql));
        let sql = rewritten.as_deref().unwrap_or(sql);
        let planned = self.engine.plan_to_run(sql, &self.session).await.map_err(pg_error)?;
        let schema = planned.postgres_schema();
        let results = self.engine.execute(planned).await.map_err(pg_error)?;
        let rows_of = |batch: Result<RecordBatch, datafusion::error::DataFusionError>| match batch {
            Ok(batch) => Ok(batch),
            Err(e) => Err(pg_error(QueryError::from(e))),
        };
        let results = cancel::cancellable(results.map(rows_of), cancel);
        if schema.fields().is_empty() {
            let batches: Vec<RecordBatch> = results.try_collect().await?;
            let tag = command_tag(sql);
            return Ok(Response::Execution(if tag == "INSERT" {
                Tag::new("INSERT").with_oid(0).with_rows(affected_rows(&batches))
            } else {
                Tag::new(&tag)
            }));
        }
        let mut response = encoded(results, &schema, format);
        if stream {
            return Ok(Response::Query(response));
        }
        let fields = Arc::clone(&response.row_schema);
        let collected: Vec<_> = response.data_rows().try_collect().await?;
        Ok(Response::Query(QueryResponse::new(fields, stream::iter(collected.into_iter().map(Ok)))))
    }

    /// Starts a query that returns rows (a cursor's, at its first `FETCH`, rewritten for
    /// PostgreSQL's catalog at its `DECLARE`): its rows, streamed.
    async fn query_rows(
        &self,
        sql: &str,
        format: &Format,
        cancel: Option<tokio::sync::watch::Receiver<u64>>,
    ) -> PgWireResult<QueryResponse> {
        let planned = self.engine.plan_to_run(sql, &self.session).await.map_err(pg_error)?;
        let schema = planned.postgres_schema();
        let results = self.engine.execute(planned).await.map_err(pg_error)?;
        let results =
            cancel::cancellable(results.map(|batch| batch.map_err(|e| pg_error(QueryError::from(e)))), cancel);
        Ok(encoded(results, &schema, format))
    }
}

/// A query's batches as PostgreSQL rows in `format`, encoded as they arrive.
fn encoded(
    results: impl futures::Stream<Item = PgWireResult<RecordBatch>> + Send + 'static,
    schema: &SchemaRef,
    format: &Format,
) -> QueryResponse {
    let fields: Arc<Vec<FieldInfo>> = Arc::new(encode::fields(schema, format));
    let row_fields = Arc::clone(&fields);
    let rows = results.and_then(move |batch| {
        future::ready(encode::rows(&batch, &row_fields).map(|rows| stream::iter(rows.into_iter().map(Ok))))
    });
    QueryResponse::new(fields, rows.try_flatten())
}

#[async_trait]
impl CopyHandler for Handler {
    async fn on_copy_data<C>(&self, _client: &mut C, copy_data: CopyData) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if let Some(pending) = self.copy_in.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            pending.push(&copy_data.data);
        }
        Ok(())
    }

    /// The data is complete: checked whole, then inserted; `COPY n` names the rows stored.
    async fn on_copy_done<C>(&self, client: &mut C, _done: CopyDone) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let mut pending =
            self.take_copy_in().ok_or_else(|| syntax_error("COPY data without a COPY FROM STDIN".into()))?;
        let batch = match pending.batch() {
            Ok(batch) => batch,
            Err(e) => {
                if let Some(running) = pending.running.take() {
                    running.end(Err(e.to_string()));
                }
                return Err(pg_error(e));
            }
        };
        let sql = format!("COPY {} FROM STDIN", pending.table);
        let recorded = match pending.running.take() {
            Some(running) => shardwise_query::engine::Recorded::Running(running),
            None => shardwise_query::engine::Recorded::Ended(&sql),
        };
        let rows = self
            .engine
            .insert_batches_as(
                &pending.table,
                vec![batch],
                &self.session,
                &pending.settings,
                recorded,
                pending.incarnation,
            )
            .await
            .map_err(pg_error)?;
        let tag = Tag::new("COPY").with_rows(usize::try_from(rows).unwrap_or(usize::MAX));
        client.send(PgWireBackendMessage::CommandComplete(tag.into())).await?;
        Ok(())
    }

    async fn on_copy_fail<C>(&self, _client: &mut C, fail: CopyFail) -> PgWireError
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let pending = self.take_copy_in();
        let table = pending.as_ref().map(|p| p.table.clone()).unwrap_or_default();
        let e = QueryError::Rejected(format!("COPY {table} stopped by the client, nothing stored: {}", fail.message));
        if let Some(running) = pending.and_then(|mut p| p.running.take()) {
            running.end(Err(e.to_string()));
        }
        pg_error(e)
    }
}

#[async_trait]
impl SimpleQueryHandler for Handler {
    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let statements = split_statements(query);
        let last = statements.len().saturating_sub(1);
        let mut responses = Vec::with_capacity(statements.len());
        for (i, statement) in statements.into_iter().enumerate() {
            let outcome = match statement {
                Ok(statement) => {
                    if kind_of(&statement.text) == Kind::Deallocate {
                        deallocate(client.portal_store(), &statement.text);
                    }
                    // A COPY TO first in the query streams here; after other statements (whose
                    // answers pgwire sends once this returns) it goes through pgwire.
                    let here = match responses.is_empty() {
                        true => self.copy_out_here(client, &statement.text).await,
                        false => Ok(None),
                    };
                    match here {
                        Ok(Some(response)) => Ok(response),
                        Err(e) => Err(e),
                        Ok(None) => {
                            let signal = self.cancel_signal(client);
                            self.run_with(client, &statement.text, &encode::text_format(), i == last, signal).await
                        }
                    }
                }
                Err(e) => Err(syntax_error(format!("line {}: {}", e.line, e.message))),
            };
            match outcome {
                Ok(response) => responses.push(response),
                // PostgreSQL stops a multi-statement query at its first error.
                Err(e) => {
                    responses.push(Response::Error(Box::new(e.into())));
                    break;
                }
            }
        }
        Ok(responses)
    }
}

#[async_trait]
impl QueryParser for Handler {
    type Statement = Statement;

    async fn parse_sql<C>(&self, _client: &C, sql: &str, types: &[Option<Type>]) -> PgWireResult<Option<Statement>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        let mut statements = split_statements(sql);
        if statements.len() > 1 {
            return Err(syntax_error("cannot insert multiple commands into a prepared statement".to_string()));
        }
        match statements.pop() {
            None => Ok(None),
            Some(Err(e)) => Err(syntax_error(format!("line {}: {}", e.line, e.message))),
            Some(Ok(statement)) => self.plan(&statement.text, types).await.map(Some),
        }
    }

    fn get_parameter_types(&self, stmt: &Statement) -> PgWireResult<Vec<Type>> {
        Ok(stmt.parameter_types.clone())
    }

    fn get_result_schema(&self, stmt: &Statement, column_format: Option<&Format>) -> PgWireResult<Vec<FieldInfo>> {
        let format = column_format.cloned().unwrap_or(Format::UnifiedBinary);
        Ok(match &stmt.schema {
            Some(schema) if !schema.fields().is_empty() => encode::fields(schema, &format),
            _ => Vec::new(),
        })
    }
}

#[async_trait]
impl ExtendedQueryHandler for Handler {
    type Statement = Statement;
    type QueryParser = Handler;

    fn query_parser(&self) -> Arc<Handler> {
        // The parser only plans: it never runs a statement, so it needs no cancel counter.
        Arc::new(Handler {
            engine: Arc::clone(&self.engine),
            session: Arc::clone(&self.session),
            copy_in: Default::default(),
            cancels: Arc::clone(&self.cancels),
            counter: Arc::clone(&self.counter),
            cancel: Default::default(),
            cursors: Arc::clone(&self.cursors),
        })
    }

    /// Streamed when the portal runs to completion ([`execute`]).
    async fn on_execute<C>(&self, client: &mut C, message: pgwire::messages::extendedquery::Execute) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        execute::execute(self, client, message).await
    }

    async fn do_query<C>(&self, client: &mut C, portal: &Portal<Statement>, _max_rows: usize) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if kind_of(&portal.statement.statement.sql) == Kind::Deallocate {
            deallocate(client.portal_store(), &portal.statement.statement.sql);
        }
        if let Some(response) = self.copy_out_here(client, &portal.statement.statement.sql).await? {
            return Ok(response);
        }
        if portal.statement.statement.parameters || portal.parameter_len() > 0 {
            let sql = params::bind(portal)?;
            let signal = self.cancel_signal(client);
            return self.run_with(client, &sql, &portal.result_column_format, true, signal).await;
        }
        let signal = self.cancel_signal(client);
        self.run_with(client, &portal.statement.statement.sql, &portal.result_column_format, true, signal).await
    }

    /// The columns of a bound statement: with parameters, planned with their values.
    async fn do_describe_portal<C>(
        &self,
        _client: &mut C,
        portal: &Portal<Statement>,
    ) -> PgWireResult<DescribePortalResponse>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let statement = &portal.statement.statement;
        let format = &portal.result_column_format;
        if !statement.parameters {
            return Ok(DescribePortalResponse::new(self.get_result_schema(statement, Some(format))?));
        }
        let sql = params::bind(portal)?;
        let planned = self.engine.plan(&sql, &self.session).await.map_err(pg_error)?;
        let bound =
            Statement { sql, schema: Some(planned.postgres_schema()), parameters: false, parameter_types: Vec::new() };
        Ok(DescribePortalResponse::new(self.get_result_schema(&bound, Some(format))?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection to a fresh listener, and the listener's side of it.
    async fn connected() -> (tokio::net::TcpStream, tokio::net::TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bound");
        let client = tokio::net::TcpStream::connect(listener.local_addr().expect("an address"));
        let (client, accepted) = tokio::join!(client, listener.accept());
        (client.expect("connected"), accepted.expect("accepted").0)
    }

    /// Past the cap a client is refused with PostgreSQL's error, and one of the open ones
    /// closing makes room.
    #[tokio::test]
    async fn past_the_cap_a_client_is_told_too_many_clients() {
        use tokio::io::AsyncReadExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let engine = Arc::new(QueryEngine::new(Arc::new(crate::tests::TwoNodes)).expect("engine"));
        let users = Arc::new(Users::default_only());
        tokio::spawn(serve_capped(listener, engine, users, std::future::pending(), 1));
        let first = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let mut second = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let mut answer = Vec::new();
        tokio::time::timeout(std::time::Duration::from_secs(5), second.read_to_end(&mut answer))
            .await
            .expect("answered at once")
            .expect("read");
        let text = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with(b"E") && text.contains("53300") && text.contains("too many clients"), "{text}");
        drop(first);
        // The first one's place is given back when its connection ends.
        let refused = async {
            loop {
                let mut third = tokio::net::TcpStream::connect(addr).await.expect("connect");
                let mut byte = [0u8; 1];
                match tokio::time::timeout(std::time::Duration::from_millis(300), third.read(&mut byte)).await {
                    Err(_) => return, // kept open, waiting for a startup packet
                    Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
                }
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(10), refused).await.expect("a place freed");
    }

    #[tokio::test]
    async fn a_cluster_node_is_told_this_is_not_the_masters_port() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut node, server) = connected().await;
        node.write_all(b"SHRDWS\0\x02").await.expect("sent");
        assert!(answer_cluster_preamble(server).await.is_none());
        let mut answer = Vec::new();
        node.read_to_end(&mut answer).await.expect("answered, then closed");
        assert_eq!(answer, shardwise_cluster::wire::client_endpoint_answer(b"pg"));

        // A PostgreSQL client's bytes are left for pgwire to read.
        let (mut client, server) = connected().await;
        client.write_all(&[0, 0, 0, 8, 4, 210, 22, 47]).await.expect("sent");
        let mut server = answer_cluster_preamble(server).await.expect("kept");
        let mut first = [0u8; 8];
        server.read_exact(&mut first).await.expect("read");
        assert_eq!(first, [0, 0, 0, 8, 4, 210, 22, 47]);
    }

    #[test]
    fn kinds_and_tags() {
        assert_eq!(kind_of("begin"), Kind::Begin);
        assert_eq!(kind_of("START TRANSACTION"), Kind::Begin);
        assert_eq!(kind_of("commit"), Kind::Commit);
        assert_eq!(kind_of("ROLLBACK"), Kind::Rollback);
        assert_eq!(kind_of("SAVEPOINT \"_pg3_1\""), Kind::Savepoint);
        assert_eq!(kind_of("release savepoint \"_pg3_1\""), Kind::Savepoint);
        assert_eq!(kind_of("ROLLBACK TO SAVEPOINT s"), Kind::Savepoint);
        assert_eq!(savepoint_tag("release s"), "RELEASE");
        assert_eq!(kind_of("SET extra_float_digits = 3"), Kind::IgnoredSet);
        assert_eq!(kind_of("SET application_name = 'psql'"), Kind::IgnoredSet);
        assert_eq!(kind_of("SET lock_timeout = 0"), Kind::IgnoredSet);
        assert_eq!(kind_of("SET idle_in_transaction_session_timeout = 0"), Kind::IgnoredSet);
        assert_eq!(kind_of("SET max_execution_time_ms = 10"), Kind::Sql);
        assert_eq!(kind_of("SELECT 1"), Kind::Sql);
        assert_eq!(kind_of("DEALLOCATE ALL"), Kind::Deallocate);
        assert_eq!(command_tag("create table t (a int)"), "CREATE TABLE");
        assert_eq!(command_tag("DROP TABLE IF EXISTS t"), "DROP TABLE");
        assert_eq!(command_tag("insert into t values (1)"), "INSERT");
        assert_eq!(command_tag("SYSTEM FLUSH DISTRIBUTED t"), "SYSTEM");
        assert!(has_parameters("SELECT * FROM t WHERE a = $1"));
        assert!(!has_parameters("SELECT '$1' AS a"));
    }
}
