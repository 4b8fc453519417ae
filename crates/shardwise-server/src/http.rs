//! The HTTP API of a node (axum), for scripts, dashboards and `curl`, in the spirit of
//! ClickHouse's HTTP interface:
//! - `POST /query` (or `PUT`, which `curl -T FILE` sends): the SQL as the body (`Content-Type:
//!   application/sql` or `text/plain`), or JSON `{"sql": "...", "settings": {"name": "value",
//!   ...}}` (`application/json`). Form content types are refused (415): a browser sends them
//!   cross-site without asking. The answer is JSON (one object per row and line), CSV or
//!   TabSeparated (with a header row) or an Arrow IPC stream, chosen by a trailing `FORMAT CSV |
//!   CSVWithNames | TSV | TSVWithNames | JSONEachRow | ArrowStream` clause, else by
//!   `?format=json|csv|tsv|arrow`, else by `Accept`; anything else is 406. Rows are sent as the
//!   query produces them. The SQL may instead be in `?query=`, as ClickHouse takes it; and after
//!   an `INSERT INTO t ... FORMAT CSV` (or TSV, their `WithNames` forms, JSONEachRow, Parquet,
//!   ArrowStream, Arrow) come the rows, in the body after the statement or as the body of
//!   `?query=` (`crate::http_insert`).
//! - `POST /` is `POST /query`, and `GET /?query=SELECT ...` runs a query that only reads (as
//!   ClickHouse runs a GET read-only; anything else is a 405), so ClickHouse's `curl` habits
//!   work; `GET /` without `query` is the status page.
//! - `GET /health`: 200 and this node's rank while it serves.
//! - `GET /metrics`: Prometheus text: queries by state, rows and bytes, running queries, node
//!   states and sync queues (pending rows and lag).
//!
//! Users are those of Flight SQL (`auth`): HTTP Basic, or none for `default`. Every error is a
//! status with a JSON body `{"error": "...", "kind": "..."}`. Each request is a session of its
//! own: settings come from the URL (`?distributed_group_by_no_merge=1`, as ClickHouse takes
//! them; every parameter but `format` and `query` is a setting), then the JSON body's `"settings"`, then a
//! `SETTINGS` clause, each over the one before; not from an earlier request. An unknown setting,
//! a bad value or a JSON key other than `sql` and `settings` is a 400, never ignored.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::execution::SendableRecordBatchStream;
use futures::StreamExt;
use shardwise_query::error::Stopped;
use shardwise_query::format_clause::{ClauseFormat, split_format_clause};
use shardwise_query::{QueryEngine, QueryError, Session};
use tokio::net::TcpListener;

use crate::auth::{self, Credentials};
use crate::csv_text::TextFormat;
use crate::users::Users;

/// The status page, served at `/`.
const STATUS_PAGE_HTML: &str = include_str!("status.html");

/// Largest request body accepted (the SQL, or the JSON around it).
pub const HTTP_MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// Media type of an Arrow IPC stream.
const ARROW_STREAM: &str = "application/vnd.apache.arrow.stream";

#[derive(Clone)]
struct Http {
    engine: Arc<QueryEngine>,
    users: Arc<Users>,
}

/// Serves the HTTP API on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    engine: Arc<QueryEngine>,
    users: Arc<Users>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), crate::ServerError> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "http endpoint listening");
    }
    let routes = Router::new()
        .route("/", get(root).post(query).put(query))
        .route("/query", post(query).put(query))
        .route("/health", get(health))
        .route("/metrics", get(metrics));
    let app = with_json_fallbacks(routes)
        .layer(axum::extract::DefaultBodyLimit::max(HTTP_MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn(refuse_declared_oversize))
        .with_state(Http { engine, users });
    use crate::http_connections::{HTTP_MAX_CONNECTIONS, Timeouts};
    let listener = crate::connections::CappedListener::new(listener, HTTP_MAX_CONNECTIONS, "http");
    crate::http_connections::serve(listener, app, Timeouts::default(), shutdown).await;
    Ok(())
}

/// The paths the API serves, for the 404 answer.
const PATHS: &str = "POST (or PUT) /query (or /), GET /?query= (queries that only read), GET /health, GET /metrics \
                     and GET / (the status page)";

/// `routes` answering an unknown path (404) or a known path with another method (405) as every
/// other error is answered, with a JSON body (axum's own answers have an empty one).
fn with_json_fallbacks<S: Clone + Send + Sync + 'static>(routes: Router<S>) -> Router<S> {
    routes.fallback(no_such_path).method_not_allowed_fallback(method_not_allowed)
}

async fn no_such_path(method: axum::http::Method, uri: axum::http::Uri) -> Failure {
    let message = format!("no such path: {method} {}; this API serves {PATHS}", uri.path());
    Failure::new(StatusCode::NOT_FOUND, "not_found", message)
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Failure {
    let message = format!("{} does not take {method}; this API serves {PATHS}", uri.path());
    Failure::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", message)
}

/// An error answer: a status and `{"error": ..., "kind": ...}`.
struct Failure {
    status: StatusCode,
    kind: &'static str,
    message: String,
}

impl Failure {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Failure {
        Failure { status, kind, message: message.into() }
    }
}

impl From<QueryError> for Failure {
    fn from(e: QueryError) -> Failure {
        match &e {
            QueryError::Unavailable(_) => Failure::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", e.to_string()),
            // Stopped, not wrong: the same query may run another time (ClickHouse answers 500).
            _ if e.stopped() == Some(Stopped::TimedOut) => {
                Failure::new(StatusCode::GATEWAY_TIMEOUT, "timeout", e.to_string())
            }
            _ if e.stopped() == Some(Stopped::Killed) => {
                Failure::new(StatusCode::INTERNAL_SERVER_ERROR, "killed", e.to_string())
            }
            _ if e.is_user_error() => Failure::new(StatusCode::BAD_REQUEST, "invalid", e.to_string()),
            _ => Failure::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()),
        }
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.message, "kind": self.kind }).to_string();
        let mut response = (self.status, [(header::CONTENT_TYPE, "application/json")], body).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Basic realm=\"shardwise\""));
        }
        response
    }
}

fn authorize(users: &Users, headers: &HeaderMap) -> Result<(), Failure> {
    let unauthorized = |m: String| Failure::new(StatusCode::UNAUTHORIZED, "unauthenticated", m);
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return users.check_anonymous().map_err(|e| unauthorized(e.to_string()));
    };
    let value = value.to_str().map_err(|_| unauthorized("the Authorization header is not ASCII".into()))?;
    match auth::parse_authorization(value).map_err(|s| unauthorized(s.message().to_string()))? {
        Credentials::Anonymous => users.check_anonymous().map_err(|e| unauthorized(e.to_string())),
        Credentials::Basic { user, password } => {
            users.check_password(&user, &password).map_err(|e| unauthorized(e.to_string()))
        }
        Credentials::Bearer(_) => Err(unauthorized("HTTP takes Basic authentication, not a bearer token".into())),
    }
}

/// Refuses a request a browser sent from another site's page. `text/plain` bodies need no CORS
/// preflight, so without this any web page could post SQL to a node on the reader's machine;
/// browsers always name the page's origin on such requests, and it must be this node.
fn same_origin(headers: &HeaderMap) -> Result<(), Failure> {
    let Some(origin) = headers.get(header::ORIGIN) else { return Ok(()) };
    let origin = origin.to_str().unwrap_or("");
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
    let origin_host = origin.split_once("://").map(|(_, rest)| rest).unwrap_or("");
    if host.is_empty() || !origin_host.eq_ignore_ascii_case(host) {
        return Err(Failure::new(
            StatusCode::FORBIDDEN,
            "cross_origin",
            format!("requests from pages of other sites are refused (Origin {origin:?}, Host {host:?})"),
        ));
    }
    // A page of another site whose name its DNS then points at this node ("DNS rebinding")
    // sends its own name as both: a browser must reach the node by a name that is this node's.
    if !names_this_machine(host) {
        return Err(Failure::new(
            StatusCode::FORBIDDEN,
            "cross_origin",
            format!(
                "a browser's request must reach the node by an IP address, localhost or this machine's \
                 name ({}), not {host:?}: a page of another site whose name points here is refused",
                machine_name().unwrap_or("unknown")
            ),
        ));
    }
    Ok(())
}

/// Whether `host` (a `Host` header: a name or address, perhaps with a port) is an IP address,
/// `localhost` (or a name under it), or this machine's host name.
fn names_this_machine(host: &str) -> bool {
    if host.starts_with('[') {
        return true; // an IPv6 address
    }
    let name = host.rsplit_once(':').map_or(host, |(name, port)| match port.parse::<u16>() {
        Ok(_) => name,
        Err(_) => host,
    });
    let name = name.trim_end_matches('.');
    name.parse::<std::net::Ipv4Addr>().is_ok()
        || name.eq_ignore_ascii_case("localhost")
        || name.to_ascii_lowercase().ends_with(".localhost")
        || machine_name().is_some_and(|machine| name.eq_ignore_ascii_case(machine))
}

/// This machine's host name (`gethostname`), read once.
fn machine_name() -> Option<&'static str> {
    static NAME: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        nix::unistd::gethostname().ok().and_then(|name| name.into_string().ok()).filter(|n| !n.is_empty())
    })
    .as_deref()
}

/// The live status page (`status.html`): its script polls `POST /query` for the system tables.
async fn status_page(State(http): State<Http>, headers: HeaderMap) -> Result<Response, Failure> {
    authorize(&http.users, &headers)?;
    let headers = [
        (header::CONTENT_TYPE, "text/html; charset=utf-8"),
        (header::CACHE_CONTROL, "no-store"),
        (header::X_FRAME_OPTIONS, "DENY"),
    ];
    Ok((headers, STATUS_PAGE_HTML).into_response())
}

/// How the answer is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    JsonLines,
    Csv,
    /// TabSeparated.
    Tsv,
    Arrow,
}

impl Format {
    /// The text format of a CSV or TabSeparated answer.
    fn text(self) -> Option<TextFormat> {
        match self {
            Format::Csv => Some(TextFormat::Csv),
            Format::Tsv => Some(TextFormat::Tsv),
            Format::JsonLines | Format::Arrow => None,
        }
    }

    fn content_type(self) -> &'static str {
        match self {
            Format::JsonLines => "application/x-ndjson",
            Format::Csv => "text/csv; charset=utf-8",
            Format::Tsv => "text/tab-separated-values; charset=utf-8",
            Format::Arrow => ARROW_STREAM,
        }
    }
}

/// `?format=` first, else the first media type of `Accept` this API writes.
fn choose_format(param: Option<&String>, accept: Option<&HeaderValue>) -> Result<Format, Failure> {
    if let Some(name) = param {
        return match name.to_ascii_lowercase().as_str() {
            "json" => Ok(Format::JsonLines),
            "csv" => Ok(Format::Csv),
            "tsv" => Ok(Format::Tsv),
            "arrow" => Ok(Format::Arrow),
            other => Err(Failure::new(
                StatusCode::BAD_REQUEST,
                "invalid",
                format!("format={other:?} is not one of json, csv, tsv, arrow"),
            )),
        };
    }
    let Some(accept) = accept.and_then(|a| a.to_str().ok()) else { return Ok(Format::JsonLines) };
    for media in accept.split(',').map(|m| m.split(';').next().unwrap_or("").trim().to_ascii_lowercase()) {
        match media.as_str() {
            "application/json" | "application/x-ndjson" | "application/jsonl" | "*/*" | "application/*" => {
                return Ok(Format::JsonLines);
            }
            "text/csv" | "text/*" => return Ok(Format::Csv),
            "text/tab-separated-values" => return Ok(Format::Tsv),
            ARROW_STREAM => return Ok(Format::Arrow),
            _ => {}
        }
    }
    Err(Failure::new(
        StatusCode::NOT_ACCEPTABLE,
        "not_acceptable",
        format!(
            "cannot answer as {accept:?}; accepted: application/json, text/csv, text/tab-separated-values, \
             {ARROW_STREAM}"
        ),
    ))
}

/// The keys a JSON request body may have.
const JSON_BODY_KEYS: [&str; 2] = ["sql", "settings"];

/// The URL parameter that chooses the answer's format; every other one but [`QUERY_PARAM`] is a
/// setting.
const FORMAT_PARAM: &str = "format";

/// The URL parameter that gives the SQL, as ClickHouse's does; the body then follows it (the rows
/// of an `INSERT ... FORMAT`, `crate::http_insert`).
const QUERY_PARAM: &str = "query";

/// The settings a request's URL gives, in a fixed order (by name).
fn url_settings(params: &HashMap<String, String>) -> Vec<(String, String)> {
    let mut settings: Vec<(String, String)> = params
        .iter()
        .filter(|(name, _)| !name.eq_ignore_ascii_case(FORMAT_PARAM) && !name.eq_ignore_ascii_case(QUERY_PARAM))
        .map(|(n, v)| (n.clone(), v.clone()))
        .collect();
    settings.sort();
    settings
}

/// The statement (the SQL, and for an `INSERT ... FORMAT` the rows after it, which may be
/// binary) and settings of a request body, by its content type.
fn parse_body(headers: &HeaderMap, body: &Bytes) -> Result<(Bytes, Vec<(String, String)>), Failure> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or("").trim().to_ascii_lowercase())
        .unwrap_or_default();
    match content_type.as_str() {
        // `curl --data-binary "SELECT 1"` sends its body as a form: taken as SQL, as ClickHouse
        // takes it. A browser's cross-site form post is refused by `same_origin` before this.
        "application/sql" | "text/plain" | "application/x-www-form-urlencoded" | "" => Ok((body.clone(), Vec::new())),
        "application/json" => {
            let value: serde_json::Value = serde_json::from_slice(body)
                .map_err(|e| Failure::new(StatusCode::BAD_REQUEST, "invalid", format!("the body is not JSON: {e}")))?;
            // serde_json keeps the last of a key given twice: `{"sql": "SELECT 1", "sql": "DROP
            // TABLE t"}` ran the second, where a proxy or a log that read the first saw the first.
            if let Some(key) = shardwise_query::json_keys::key_given_twice(body) {
                return Err(Failure::new(
                    StatusCode::BAD_REQUEST,
                    "invalid",
                    format!("the JSON body gives {key:?} twice"),
                ));
            }
            if let Some(key) = value.as_object().and_then(|o| o.keys().find(|k| !JSON_BODY_KEYS.contains(&k.as_str())))
            {
                return Err(Failure::new(
                    StatusCode::BAD_REQUEST,
                    "invalid",
                    format!(
                        "the JSON body has {key:?}, which this API does not take; it takes \"sql\" and \"settings\""
                    ),
                ));
            }
            let sql = value.get("sql").and_then(|s| s.as_str()).ok_or_else(|| {
                Failure::new(StatusCode::BAD_REQUEST, "invalid", "the JSON body needs \"sql\": a string")
            })?;
            let mut settings = Vec::new();
            match value.get("settings") {
                None | Some(serde_json::Value::Null) => {}
                Some(serde_json::Value::Object(map)) => {
                    for (name, v) in map {
                        let v = match v {
                            serde_json::Value::String(s) => s.clone(),
                            serde_json::Value::Number(n) => n.to_string(),
                            serde_json::Value::Bool(b) => u8::from(*b).to_string(),
                            other => {
                                return Err(Failure::new(
                                    StatusCode::BAD_REQUEST,
                                    "invalid",
                                    format!("setting {name}: {other} is not a string, number or boolean"),
                                ));
                            }
                        };
                        settings.push((name.clone(), v));
                    }
                }
                Some(_) => {
                    return Err(Failure::new(StatusCode::BAD_REQUEST, "invalid", "\"settings\" must be an object"));
                }
            }
            Ok((Bytes::from(sql.to_string()), settings))
        }
        "multipart/form-data" => Err(Failure::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "multipart form bodies are refused; send the SQL as application/sql, text/plain or application/json",
        )),
        other => Err(Failure::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!("Content-Type {other:?}: send application/sql, text/plain or application/json"),
        )),
    }
}

/// A request whose `Content-Length` is over the limit is refused before its body is read: no
/// `100 Continue` goes out, so a client that waits for one (curl, for bodies over 1 MiB) gets the
/// 413 instead of a connection closed in the middle of its upload.
async fn refuse_declared_oversize(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let declared = request
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|bytes| bytes > HTTP_MAX_BODY_BYTES as u64) {
        return oversize().into_response();
    }
    next.run(request).await
}

fn oversize() -> Failure {
    Failure::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        format!(
            "the request body is over {HTTP_MAX_BODY_BYTES} bytes (HTTP_MAX_BODY_BYTES); load bulk data with \
             `shardwise load` or Flight SQL bulk ingest"
        ),
    )
}

/// axum's refusal of a body (over the size limit, unreadable) as the API's JSON error.
fn body_failure(rejection: BytesRejection) -> Failure {
    match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => oversize(),
        status => Failure::new(status, "bad_request", rejection.body_text()),
    }
}

/// `GET /`: with `?query=`, the query, which may only read (ClickHouse runs a GET read-only);
/// without, the status page.
async fn root(
    state: State<Http>,
    params: Result<Query<HashMap<String, String>>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, Failure> {
    let has_query = params.as_ref().is_ok_and(|Query(p)| p.keys().any(|name| name.eq_ignore_ascii_case(QUERY_PARAM)));
    match has_query {
        true => run(state, params, headers, Ok(Bytes::new()), Access::ReadOnly).await,
        false => status_page(state, headers).await,
    }
}

/// `POST /query` (or `PUT`, or `/`).
async fn query(
    state: State<Http>,
    params: Result<Query<HashMap<String, String>>, QueryRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Failure> {
    run(state, params, headers, body, Access::ReadWrite).await
}

/// Whether a request may run statements that change something.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// A GET: queries only (a link followed, or prefetched, changes nothing).
    ReadOnly,
    ReadWrite,
}

fn read_only_refusal() -> Failure {
    Failure::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "read_only",
        "a GET runs only statements that read; send one that changes something with POST /query",
    )
}

async fn run(
    State(http): State<Http>,
    params: Result<Query<HashMap<String, String>>, QueryRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
    access: Access,
) -> Result<Response, Failure> {
    same_origin(&headers)?;
    authorize(&http.users, &headers)?;
    let Query(params) = params.map_err(|r| Failure::new(r.status(), "bad_request", r.body_text()))?;
    let body = body.map_err(body_failure)?;
    let query_param = params.iter().find(|(name, _)| name.eq_ignore_ascii_case(QUERY_PARAM)).map(|(_, v)| v);
    let (statement, body_settings) = match query_param {
        Some(sql) => (with_body(sql, &headers, &body)?, Vec::new()),
        None => parse_body(&headers, &body)?,
    };
    let mut settings = url_settings(&params);
    http.engine.session_with(&settings).map_err(|e| {
        let mut failure = Failure::from(e);
        failure.message = format!(
            "URL parameters (every one but {FORMAT_PARAM} and {QUERY_PARAM} is a setting): {}",
            failure.message
        );
        failure
    })?;
    settings.extend(body_settings);
    if let Some(insert) = crate::http_insert::parse(&statement)? {
        if access == Access::ReadOnly {
            return Err(read_only_refusal());
        }
        let param = params.iter().find(|(name, _)| name.eq_ignore_ascii_case(FORMAT_PARAM)).map(|(_, v)| v);
        let format = choose_format(param, headers.get(header::ACCEPT))?;
        let stored = crate::http_insert::store(&http.engine, insert, &settings).await?;
        let encoder = Encoder::new(format, stored.schema());
        let body = Body::from_stream(encode(stored, encoder));
        return Ok(([(header::CONTENT_TYPE, format.content_type())], body).into_response());
    }
    let sql = String::from_utf8(statement.to_vec())
        .map_err(|e| Failure::new(StatusCode::BAD_REQUEST, "invalid", format!("the body is not UTF-8: {e}")))?;
    // A FORMAT clause wins over `?format=` and `Accept`, as in ClickHouse.
    let (sql, clause) = split_format_clause(&sql)?;
    let (format, csv_header) = match clause {
        Some(ClauseFormat::Csv { header }) => (Format::Csv, header),
        Some(ClauseFormat::Tsv { header }) => (Format::Tsv, header),
        Some(ClauseFormat::JsonEachRow) => (Format::JsonLines, true),
        Some(ClauseFormat::ArrowStream) => (Format::Arrow, true),
        Some(ClauseFormat::Pretty) => {
            return Err(Failure::new(
                StatusCode::BAD_REQUEST,
                "invalid",
                "FORMAT Pretty: the HTTP API writes CSV, CSVWithNames, TabSeparated (TSV), TabSeparatedWithNames \
                 (TSVWithNames), JSONEachRow or ArrowStream; Pretty is shardwise sql's",
            ));
        }
        None => {
            let param = params.iter().find(|(name, _)| name.eq_ignore_ascii_case(FORMAT_PARAM)).map(|(_, v)| v);
            (choose_format(param, headers.get(header::ACCEPT))?, true)
        }
    };
    let session: Arc<Session> = http.engine.session_with(&settings)?;
    let planned = http.engine.plan_to_run(&sql, &session).await?;
    if access == Access::ReadOnly && planned.runs_for_effect() {
        return Err(read_only_refusal());
    }
    let mut stream = http.engine.execute(planned).await?;
    // The status goes out with the first bytes: hold the answer until it ends or its encoding
    // reaches HTTP_RESPONSE_BUFFER_BYTES, so that a query failing before then (a division by
    // zero in a later batch, an unreachable shard, the time limit) answers with its error's
    // status and JSON body, not 200 and a body cut short (or, when the batches before the error
    // encoded to nothing, no reply at all).
    let mut encoder = Encoder::new(format, stream.schema());
    // Without a header row, as if it had been written.
    encoder.header_written = !csv_header;
    let mut held = Vec::new();
    let mut ended = false;
    while held.len() < HTTP_RESPONSE_BUFFER_BYTES {
        match stream.next().await {
            Some(Ok(batch)) => held.extend_from_slice(
                &encoder.batch(&batch).map_err(|e| QueryError::from(datafusion::error::DataFusionError::from(e)))?,
            ),
            Some(Err(e)) => return Err(QueryError::from(e).into()),
            None => {
                ended = true;
                break;
            }
        }
    }
    let first = futures::stream::iter([Ok::<Bytes, std::io::Error>(Bytes::from(held))]);
    let body = match ended {
        true => Body::from_stream(first.chain(futures::stream::iter(encoder.finish().map(Ok)))),
        false => Body::from_stream(first.chain(encode(stream, encoder))),
    };
    Ok(([(header::CONTENT_TYPE, format.content_type())], body).into_response())
}

/// `?query=SQL` with a body: the SQL, then the body on the next line (the rows of an `INSERT ...
/// FORMAT`, binary for `Parquet`, or the rest of the statement, as ClickHouse joins them),
/// whatever its content type but JSON, which would be a second place for the SQL.
fn with_body(sql: &str, headers: &HeaderMap, body: &Bytes) -> Result<Bytes, Failure> {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().to_ascii_lowercase().starts_with("application/json"));
    if json {
        return Err(Failure::new(
            StatusCode::BAD_REQUEST,
            "invalid",
            format!("the SQL is in ?{QUERY_PARAM}= and a JSON body would be another; send the rows as text"),
        ));
    }
    if body.is_empty() {
        return Ok(Bytes::from(sql.to_string()));
    }
    let mut joined = Vec::with_capacity(sql.len() + 1 + body.len());
    joined.extend_from_slice(sql.as_bytes());
    joined.push(b'\n');
    joined.extend_from_slice(body);
    Ok(Bytes::from(joined))
}

/// How much of an answer's encoding is held before its status is sent: an error while it is
/// held is the answer (4xx/5xx with the error), an error after it ends the body early.
pub const HTTP_RESPONSE_BUFFER_BYTES: usize = 1024 * 1024;

/// The rest of the answer's bytes, batch by batch, after what was held. An error ends the body
/// early (the status has been sent): the client sees the transfer cut short; the error is
/// logged.
fn encode(
    stream: SendableRecordBatchStream,
    encoder: Encoder,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send {
    futures::stream::unfold((stream, Some(encoder)), |(mut stream, encoder)| async move {
        let mut encoder = encoder?;
        match stream.next().await {
            Some(Ok(batch)) => {
                let bytes = encoder.batch(&batch).map_err(std::io::Error::other);
                Some((bytes, (stream, Some(encoder))))
            }
            Some(Err(e)) => {
                tracing::warn!("HTTP query failed part-way: {e}");
                Some((Err(std::io::Error::other(e.to_string())), (stream, None)))
            }
            None => encoder.finish().map(|bytes| (Ok(bytes), (stream, None))),
        }
    })
}

/// Writes batches in one format, keeping what must persist between them.
struct Encoder {
    format: Format,
    schema: SchemaRef,
    header_written: bool,
    arrow: Option<datafusion::arrow::ipc::writer::StreamWriter<Vec<u8>>>,
}

impl Encoder {
    fn new(format: Format, schema: SchemaRef) -> Encoder {
        Encoder { format, schema, header_written: false, arrow: None }
    }

    fn batch(&mut self, batch: &RecordBatch) -> Result<Bytes, datafusion::arrow::error::ArrowError> {
        let mut out = Vec::new();
        match self.format {
            Format::JsonLines => {
                crate::json_lines::write(&mut out, [batch])?;
            }
            Format::Csv | Format::Tsv => {
                let text = self.format.text().unwrap_or(TextFormat::Csv);
                if !self.header_written {
                    crate::csv_text::write_header_as(text, &self.schema, &mut out);
                    self.header_written = true;
                }
                crate::csv_text::write_rows_as(text, batch, &mut out)?;
            }
            Format::Arrow => {
                let writer = self.arrow_writer()?;
                writer.write(batch)?;
                out = std::mem::take(writer.get_mut());
            }
        }
        Ok(Bytes::from(out))
    }

    fn arrow_writer(
        &mut self,
    ) -> Result<&mut datafusion::arrow::ipc::writer::StreamWriter<Vec<u8>>, datafusion::arrow::error::ArrowError> {
        if self.arrow.is_none() {
            self.arrow = Some(datafusion::arrow::ipc::writer::StreamWriter::try_new(Vec::new(), &self.schema)?);
        }
        self.arrow.as_mut().ok_or_else(|| datafusion::arrow::error::ArrowError::IpcError("no writer".into()))
    }

    /// What ends the answer: a CSV or TabSeparated header when there were no rows, the Arrow
    /// stream's end.
    fn finish(mut self) -> Option<Bytes> {
        match self.format {
            Format::JsonLines => None,
            Format::Csv | Format::Tsv if self.header_written => None,
            Format::Csv | Format::Tsv => {
                let mut out = Vec::new();
                crate::csv_text::write_header_as(self.format.text().unwrap_or(TextFormat::Csv), &self.schema, &mut out);
                Some(Bytes::from(out))
            }
            Format::Arrow => {
                let writer = self.arrow_writer().ok()?;
                writer.finish().ok()?;
                Some(Bytes::from(std::mem::take(writer.get_mut())))
            }
        }
    }
}

/// `ok`; `degraded` (200) when a shard replica here is not read (its WAL was found damaged:
/// queries read other replicas), or its start cut a whole last WAL record that failed its
/// checksum (`ShardStore::warning`); `failing` (503) when one failed (an I/O error such as a full
/// disk): it takes no writes until it is reopened (retried every `store_reopen_interval_ms`), so a
/// load balancer should send none here meanwhile.
async fn health(State(http): State<Http>) -> Response {
    let tables = http.engine.tables();
    let rank = tables.as_ref().map(|t| t.local_rank());
    let (failed, problems) = tables.map(|t| t.replica_problems()).unwrap_or_default();
    let (status, code) = match (failed, problems.is_empty()) {
        (true, _) => ("failing", StatusCode::SERVICE_UNAVAILABLE),
        (false, false) => ("degraded", StatusCode::OK),
        (false, true) => ("ok", StatusCode::OK),
    };
    let mut body = serde_json::json!({ "status": status, "rank": rank });
    if !problems.is_empty() {
        body["problems"] = serde_json::json!(problems);
    }
    (code, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

async fn metrics(State(http): State<Http>, headers: HeaderMap) -> Result<Response, Failure> {
    authorize(&http.users, &headers)?;
    let (totals, running) = http.engine.query_totals();
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, rows: Vec<(String, u64)>| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, value) in rows {
            let _ = writeln!(out, "{name}{labels} {value}");
        }
    };
    let by_state = totals.by_state.iter().map(|(s, n)| (format!("{{state=\"{s}\"}}"), *n)).collect();
    metric("shardwise_queries_total", "counter", "Queries this node ran as initiator, by how they ended.", by_state);
    metric(
        "shardwise_queries_running",
        "gauge",
        "Queries running on this node as initiator.",
        vec![(String::new(), running as u64)],
    );
    metric(
        "shardwise_query_result_rows_total",
        "counter",
        "Rows answered to clients.",
        vec![(String::new(), totals.result_rows)],
    );
    metric(
        "shardwise_query_rows_moved_total",
        "counter",
        "Rows query fragments sent to this node.",
        vec![(String::new(), totals.rows_moved)],
    );
    metric(
        "shardwise_query_bytes_moved_total",
        "counter",
        "Bytes query fragments sent to this node.",
        vec![(String::new(), totals.bytes_moved)],
    );
    let nodes = rows(&http.engine, "SELECT rank, role, state FROM system.nodes ORDER BY rank").await?;
    let up =
        nodes.iter().map(|r| (format!("{{rank=\"{}\",role=\"{}\"}}", r[0], r[1]), u64::from(r[2] == "up"))).collect();
    metric("shardwise_node_up", "gauge", "1 when the node is up, as this node sees the cluster.", up);
    if http.engine.tables().is_some() {
        let queues = rows(
            &http.engine,
            "SELECT rank, \"table\", destination, pending_rows, coalesce(oldest_pending_age_ms, 0) \
             FROM system.sync_queues WHERE problem IS NULL",
        )
        .await?;
        let label = |r: &Vec<String>| format!("{{rank=\"{}\",table=\"{}\",destination=\"{}\"}}", r[0], r[1], r[2]);
        let pending = queues.iter().map(|r| (label(r), r[3].parse().unwrap_or(0))).collect();
        metric("shardwise_sync_pending_rows", "gauge", "Rows waiting in a node's outbox, by destination.", pending);
        let lag = queues.iter().map(|r| (label(r), r[4].parse().unwrap_or(0))).collect();
        metric("shardwise_sync_lag_ms", "gauge", "Age of the oldest row waiting in a node's outbox.", lag);
    }
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response())
}

/// Every row of `sql` as strings.
async fn rows(engine: &QueryEngine, sql: &str) -> Result<Vec<Vec<String>>, Failure> {
    let planned = engine.plan(sql, &Arc::new(Session::unrecorded())).await?;
    let mut stream = engine.execute(planned).await?;
    let mut out = Vec::new();
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(QueryError::from)?;
        for row in 0..batch.num_rows() {
            let cells = batch
                .columns()
                .iter()
                .map(|c| datafusion::arrow::util::display::array_value_to_string(c, row).unwrap_or_default())
                .collect();
            out.push(cells);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_query_is_not_a_bad_request() {
        let status = |m: &str| Failure::from(QueryError::Rejected(m.into())).status;
        let timed_out = "the query ran longer than max_execution_time_ms = 10 and was stopped";
        assert_eq!(status(timed_out), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(Failure::from(QueryError::Rejected(timed_out.into())).kind, "timeout");
        assert_eq!(status("the query was stopped by KILL QUERY"), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(Failure::from(QueryError::Rejected("the query was stopped by KILL QUERY".into())).kind, "killed");
        assert_eq!(status("unknown table option \"x\""), StatusCode::BAD_REQUEST);
    }

    /// A browser's request must name this machine: a rebound name of another site is refused.
    #[test]
    fn browser_requests_must_name_this_machine() {
        let request = |host: &str, origin: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::HOST, HeaderValue::from_str(host).unwrap());
            headers.insert(header::ORIGIN, HeaderValue::from_str(origin).unwrap());
            same_origin(&headers).map_err(|f| f.message)
        };
        assert!(request("127.0.0.1:8123", "http://127.0.0.1:8123").is_ok());
        assert!(request("[::1]:8123", "http://[::1]:8123").is_ok());
        assert!(request("localhost:8123", "http://localhost:8123").is_ok());
        if let Some(machine) = machine_name() {
            assert!(request(&format!("{machine}:8123"), &format!("http://{machine}:8123")).is_ok());
        }
        let rebound = request("evil.example:8123", "http://evil.example:8123").unwrap_err();
        assert!(rebound.contains("must reach the node by an IP address"), "{rebound}");
        assert!(request("127.0.0.1:8123", "http://evil.example").unwrap_err().contains("other sites"));
        // Without an Origin (curl, scripts) any Host is taken.
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("evil.example"));
        assert!(same_origin(&headers).is_ok());
    }

    /// The raw HTTP/1.1 answer of `router` to `method path`.
    async fn answer(router: Router, method: &str, path: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move { axum::serve(listener, router).await });
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let request =
            format!("{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.expect("send");
        let mut out = String::new();
        stream.read_to_string(&mut out).await.expect("read");
        server.abort();
        out
    }

    /// The status line and the body, parsed as JSON.
    fn status_and_json(answer: &str) -> (String, serde_json::Value) {
        let (head, body) = answer.split_once("\r\n\r\n").expect("head and body");
        assert!(head.to_ascii_lowercase().contains("content-type: application/json"), "{head}");
        let body = serde_json::from_str(body).unwrap_or_else(|e| panic!("{body:?}: {e}"));
        (head.lines().next().unwrap_or("").to_string(), body)
    }

    #[tokio::test]
    async fn unknown_paths_and_methods_get_a_json_error() {
        let router = with_json_fallbacks(Router::new().route("/query", post(|| async { "rows" })));
        let (status, body) = status_and_json(&answer(router.clone(), "GET", "/nosuch").await);
        assert_eq!(status, "HTTP/1.1 404 Not Found");
        assert_eq!(body["kind"], "not_found");
        let error = body["error"].as_str().unwrap_or("");
        assert!(error.starts_with("no such path: GET /nosuch; this API serves POST (or PUT) /query"), "{error}");
        let (status, body) = status_and_json(&answer(router.clone(), "GET", "/query").await);
        assert_eq!(status, "HTTP/1.1 405 Method Not Allowed");
        assert_eq!(body["kind"], "method_not_allowed");
        assert!(body["error"].as_str().unwrap_or("").starts_with("/query does not take GET"), "{body}");
        assert!(answer(router, "POST", "/query").await.ends_with("rows"));
    }

    #[test]
    fn the_format_comes_from_the_parameter_then_accept() {
        let accept = |v: &'static str| Some(HeaderValue::from_static(v));
        assert_eq!(choose_format(None, None).ok(), Some(Format::JsonLines));
        assert_eq!(
            choose_format(Some(&"csv".to_string()), accept("application/json").as_ref()).ok(),
            Some(Format::Csv)
        );
        assert_eq!(choose_format(None, accept("text/html, text/csv;q=0.9").as_ref()).ok(), Some(Format::Csv));
        assert_eq!(choose_format(None, accept(ARROW_STREAM).as_ref()).ok(), Some(Format::Arrow));
        assert_eq!(
            choose_format(None, accept("image/png").as_ref()).err().map(|f| f.status),
            Some(StatusCode::NOT_ACCEPTABLE)
        );
        assert_eq!(
            choose_format(Some(&"xml".to_string()), None).err().map(|f| f.status),
            Some(StatusCode::BAD_REQUEST)
        );
    }

    #[test]
    fn bodies_are_read_by_content_type() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let body = Bytes::from_static(
            br#"{"sql": "SELECT 1", "settings": {"max_memory_usage": 5, "skip_unavailable_shards": true}}"#,
        );
        let (sql, settings) = parse_body(&headers, &body).ok().expect("json body");
        assert_eq!(sql, "SELECT 1");
        assert_eq!(
            settings,
            vec![("max_memory_usage".into(), "5".into()), ("skip_unavailable_shards".into(), "1".into())]
        );
        // What `curl --data-binary` sends: the body is the SQL.
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-www-form-urlencoded"));
        let (sql, _) = parse_body(&headers, &Bytes::from_static(b"SELECT 2")).ok().expect("curl's default body");
        assert_eq!(sql, "SELECT 2");
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("multipart/form-data; boundary=x"));
        assert_eq!(parse_body(&headers, &body).err().map(|f| f.status), Some(StatusCode::UNSUPPORTED_MEDIA_TYPE));
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let bad = Bytes::from_static(b"{not json");
        assert_eq!(parse_body(&headers, &bad).err().map(|f| f.status), Some(StatusCode::BAD_REQUEST));
    }
}
