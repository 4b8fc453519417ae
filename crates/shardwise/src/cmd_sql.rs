//! `shardwise sql`: run SQL against a node over Arrow Flight SQL, the same protocol ADBC and JDBC
//! clients use, and print the results as a table, CSV or JSON lines.
//!
//! Without `-e` or `-f`, on a terminal, it is an interactive shell (`shell`). Otherwise
//! statements come from `-e`, from `-f FILE`, or from standard input. Scripts are split into
//! statements client-side with the SQL tokenizer DataFusion uses (so `;` inside strings and
//! comments is not a separator) and run in order; the first failure stops the script and names
//! the statement and the line it starts on (`crate::script_run`). A script from a file or a pipe
//! may also hold the shell's backslash commands (`crate::script`).

use std::error::Error as StdError;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail};
use arrow::array::RecordBatch;
use arrow::datatypes::{Schema, SchemaRef};
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_flight::{FlightInfo, HandshakeRequest};
use base64::Engine as _;
use futures::TryStreamExt;
use shardwise_query::format_clause::{ClauseFormat, split_format_clause};
use shardwise_server::csv_text::TextFormat;

use tonic::transport::{Channel, Endpoint};

/// Largest gRPC message the client accepts (matches the server's limit).
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// How often the client pings a connection, and how long a ping may go unanswered before the
/// connection and its call fail (a stopped node never answers, though it accepted the connection).
const CLIENT_KEEPALIVE_INTERVAL_MS: u64 = 5_000;
const CLIENT_KEEPALIVE_TIMEOUT_MS: u64 = 10_000;

/// How results are printed.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    /// Aligned text table with a header (text longer than 10 000 characters is cut, marked
    /// with `…`; csv and json print whole values).
    Table,
    /// CSV with a header row; NULL is an empty field.
    Csv,
    /// One JSON object per row and line.
    Json,
    /// TabSeparated with a header row; NULL is `\N`, tabs, line breaks and backslashes escaped.
    Tsv,
    /// CSV without a header row (ClickHouse's `FORMAT CSV`; only from a FORMAT clause).
    #[value(skip)]
    CsvNoHeader,
    /// TabSeparated without a header row (ClickHouse's `FORMAT TSV`; only from a FORMAT clause).
    #[value(skip)]
    TsvNoHeader,
    /// An Arrow IPC stream (ClickHouse's `FORMAT ArrowStream`; only from a FORMAT clause, and
    /// only when standard output is not a terminal).
    #[value(skip)]
    ArrowStream,
}

impl OutputFormat {
    /// How a statement's trailing `FORMAT name` clause asks its rows printed.
    fn of_clause(clause: ClauseFormat) -> Result<OutputFormat, String> {
        match clause {
            ClauseFormat::Csv { header: true } => Ok(OutputFormat::Csv),
            ClauseFormat::Csv { header: false } => Ok(OutputFormat::CsvNoHeader),
            ClauseFormat::Tsv { header: true } => Ok(OutputFormat::Tsv),
            ClauseFormat::Tsv { header: false } => Ok(OutputFormat::TsvNoHeader),
            ClauseFormat::JsonEachRow => Ok(OutputFormat::Json),
            ClauseFormat::Pretty => Ok(OutputFormat::Table),
            ClauseFormat::ArrowStream => Ok(OutputFormat::ArrowStream),
        }
    }

    /// The text format of a CSV or TabSeparated output, and whether it has a header row.
    pub(crate) fn text(self) -> Option<(TextFormat, bool)> {
        match self {
            OutputFormat::Csv => Some((TextFormat::Csv, true)),
            OutputFormat::CsvNoHeader => Some((TextFormat::Csv, false)),
            OutputFormat::Tsv => Some((TextFormat::Tsv, true)),
            OutputFormat::TsvNoHeader => Some((TextFormat::Tsv, false)),
            OutputFormat::Table | OutputFormat::Json | OutputFormat::ArrowStream => None,
        }
    }

    /// Refuses to write binary output (an Arrow IPC stream) to a terminal.
    fn check_destination(self, stdout_is_terminal: bool) -> Result<(), String> {
        if self == OutputFormat::ArrowStream && stdout_is_terminal {
            return Err("FORMAT ArrowStream writes binary Arrow IPC stream bytes, not to a terminal; \
                        redirect standard output to a file or a pipe"
                .to_string());
        }
        Ok(())
    }
}

/// Where statements come from and how results print (`sql` and `local`).
#[derive(clap::Args, Debug)]
pub struct ScriptArgs {
    /// Run these statements (separated by `;`) and exit. The aliases are psql's and DuckDB's
    /// (`-c`) and clickhouse-client's (`--query`).
    #[arg(short = 'e', long = "execute", visible_short_alias = 'c', visible_alias = "query", conflicts_with = "file")]
    pub execute: Option<String>,
    /// Run the statements in this file, in order, stopping at the first error (the shell's
    /// backslash commands, `\nodes` and the rest, may stand on lines of their own between them).
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Output format. A statement's trailing ClickHouse `FORMAT` clause (`CSV`, without a header,
    /// `CSVWithNames`, `TabSeparated` (`TSV`), `TSVWithNames`, `JSONEachRow`, `Pretty`, or
    /// `ArrowStream` when standard output is not a terminal) overrides it for that statement.
    #[arg(long, value_enum, default_value = "table")]
    pub format: OutputFormat,
    /// Run the interactive shell even when standard input is not a terminal (without `-e` or
    /// `-f`, the shell starts when it is one).
    #[arg(long, conflicts_with_all = ["execute", "file"])]
    pub interactive: bool,
}

impl ScriptArgs {
    /// True when the shell should run rather than a script.
    pub fn wants_shell(&self) -> bool {
        self.execute.is_none() && self.file.is_none() && (self.interactive || std::io::stdin().is_terminal())
    }
}

#[derive(clap::Args, Debug)]
pub struct SqlArgs {
    /// Node's Flight SQL address, host:port (the `flight=` address of its `listening` line).
    #[arg(long, env = "SHARDWISE_CONNECT", default_value = DEFAULT_CONNECT)]
    pub connect: String,
    #[command(flatten)]
    pub script: ScriptArgs,
    /// Give up connecting (and logging in) after this many milliseconds; a node that stops
    /// answering later is found by HTTP/2 pings within 15 s.
    #[arg(long, default_value_t = 10_000)]
    pub connect_timeout_ms: u64,
    /// User name.
    #[arg(long, env = "SHARDWISE_USER", default_value = "default")]
    pub user: String,
    /// Password.
    #[arg(long, env = "SHARDWISE_PASSWORD", default_value = "", hide_env_values = true)]
    pub password: String,
}

pub async fn run(args: SqlArgs) -> anyhow::Result<()> {
    let timeout = Duration::from_millis(args.connect_timeout_ms);
    let client = SqlClient::connect(&args.connect, &args.user, &args.password, timeout).await?;
    run_on(client, &args.connect, &args.script).await
}

/// The shell on `client` (see [`ScriptArgs::wants_shell`]), or the script.
pub async fn run_on(mut client: SqlClient, addr: &str, script: &ScriptArgs) -> anyhow::Result<()> {
    if script.wants_shell() {
        return crate::shell::run(&mut client, addr, script.format).await;
    }
    crate::script_run::run_script(client, &script.execute, &script.file, script.format).await
}

/// A connected, authenticated Flight SQL client (also used by `demo`).
pub struct SqlClient {
    inner: FlightSqlServiceClient<Channel>,
    /// For logging in again when the node restarted (its sessions, and so the token, are gone).
    user: String,
    password: String,
}

impl SqlClient {
    /// Connects to `addr` (`host:port` or a URI) and logs in.
    pub async fn connect(addr: &str, user: &str, password: &str, timeout: Duration) -> anyhow::Result<SqlClient> {
        let inner = connect(addr, user, password, timeout).await?;
        Ok(SqlClient { inner, user: user.to_string(), password: password.to_string() })
    }

    /// Runs one statement and returns its rows; `Err` carries the server's message.
    pub async fn query(&mut self, sql: &str) -> Result<Vec<RecordBatch>, String> {
        let info = self.inner.execute(sql.to_string(), None).await.map_err(flight_message)?;
        let (_, batches) = fetch(&mut self.inner, info).await?;
        Ok(batches)
    }

    /// Runs one statement and prints its result in `format`.
    pub async fn print(&mut self, sql: &str, format: OutputFormat) -> anyhow::Result<()> {
        run_statement(&mut self.inner, sql, format).await.map(|_| ()).map_err(|m| anyhow!("{m}"))
    }

    /// Runs one statement, prints its result in `format` and returns its row count. When the
    /// node restarted since the log-in (it refuses the session's token before it runs
    /// anything), logs in again, says so, and runs the statement then: a shell stays usable.
    pub async fn print_counted(&mut self, sql: &str, format: OutputFormat) -> Result<usize, String> {
        match run_statement(&mut self.inner, sql, format).await {
            Err(message) if message.contains(UNKNOWN_SESSION) => {
                handshake(&mut self.inner, &self.user, &self.password).await?;
                eprintln!("the node restarted: logged in again (settings made with SET are back to their defaults)");
                run_statement(&mut self.inner, sql, format).await
            }
            other => other,
        }
    }
}

/// Connects and authenticates (also used by `shardwise load`).
pub(crate) async fn connect(
    addr: &str,
    user: &str,
    password: &str,
    timeout: Duration,
) -> anyhow::Result<FlightSqlServiceClient<Channel>> {
    crate::port_probe::check_port(addr).map_err(|why| anyhow!(why))?;
    let uri = if addr.contains("://") { addr.to_string() } else { format!("http://{addr}") };
    let endpoint = Endpoint::from_shared(uri)
        .map_err(|e| anyhow!("invalid address {addr:?}: {}", error_chain(&e)))?
        .connect_timeout(timeout)
        // A node that is stopped or hung still accepts TCP connections and never answers: the
        // pings find it, so a call waiting on it fails instead of hanging.
        .http2_keep_alive_interval(Duration::from_millis(CLIENT_KEEPALIVE_INTERVAL_MS))
        .keep_alive_timeout(Duration::from_millis(CLIENT_KEEPALIVE_TIMEOUT_MS))
        .keep_alive_while_idle(true);
    let endpoint = shardwise_server::http2::client(endpoint);
    let channel = match tokio::time::timeout(timeout, endpoint.connect()).await {
        Ok(Ok(channel)) => channel,
        Ok(Err(e)) => match crate::port_probe::wrong_port_hint(addr).await {
            Some(hint) => bail!("could not connect to {addr}: {hint}"),
            None if addr == DEFAULT_CONNECT => bail!(
                "could not connect to {addr}, the default address: {}; nodes listen on the port their `listening` \
                 line shows as flight= (shardwise launch prints them): give --connect HOST:PORT or set \
                 SHARDWISE_CONNECT",
                error_chain(&e)
            ),
            None => bail!("could not connect to {addr}: {}", error_chain(&e)),
        },
        Err(_) => bail!("could not connect to {addr}: timed out after {} ms", timeout.as_millis()),
    };
    let inner = FlightServiceClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES);
    let mut client = FlightSqlServiceClient::new_from_inner(inner);
    // The log-in is the first call: a server that accepted the connection and never answers
    // (stopped, hung) fails it within the connect timeout too.
    match tokio::time::timeout(timeout, handshake(&mut client, user, password)).await {
        Ok(Ok(())) => Ok(client),
        Ok(Err(message)) => match crate::port_probe::wrong_port_hint(addr).await {
            Some(hint) => bail!("could not log in to {addr}: {hint}"),
            None => bail!("could not log in to {addr} as {user:?}: {message}"),
        },
        Err(_) => bail!(
            "could not connect to {addr}: it accepted the connection but did not answer within {} ms (a stopped or \
             hung node?)",
            timeout.as_millis()
        ),
    }
}

/// Basic-auth handshake; keeps the bearer token the server returns. Done here rather than with
/// `FlightSqlServiceClient::handshake`, which flattens the server's status into a debug string.
async fn handshake(client: &mut FlightSqlServiceClient<Channel>, user: &str, password: &str) -> Result<(), String> {
    let credentials = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let header = format!("Basic {credentials}")
        .parse()
        .map_err(|_| "user name or password cannot be sent in a header".to_string())?;
    let hello = HandshakeRequest { protocol_version: 0, payload: Default::default() };
    let mut request = tonic::Request::new(futures::stream::iter([hello]));
    request.metadata_mut().insert("authorization", header);
    let response = client.inner_mut().handshake(request).await.map_err(|s| status_message(&s))?;
    let token = response
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string);
    let mut replies = response.into_inner();
    while replies.message().await.map_err(|s| status_message(&s))?.is_some() {}
    if let Some(token) = token {
        client.set_token(token);
    }
    Ok(())
}

/// `--connect` when not given: where a node listens when started with `--flight-port 50051`.
pub const DEFAULT_CONNECT: &str = "127.0.0.1:50051";

/// What a node answers to a token of a session it does not have (it restarted since the log-in).
const UNKNOWN_SESSION: &str = "unknown session token";

/// Runs one statement and prints its result; `Err` carries the server's message. An error that
/// names [`UNKNOWN_SESSION`] comes only from the first call, before anything ran: a node that
/// restarts while the rows are fetched fails the fetch with another error.
async fn run_statement(
    client: &mut FlightSqlServiceClient<Channel>,
    sql: &str,
    format: OutputFormat,
) -> Result<usize, String> {
    // A trailing FORMAT clause is the client's to apply (the server refuses it).
    let (sql, clause) = split_format_clause(sql).map_err(|e| e.to_string())?;
    let format = clause.map(OutputFormat::of_clause).transpose()?.unwrap_or(format);
    format.check_destination(std::io::stdout().is_terminal())?;
    let info = client.execute(sql, None).await.map_err(flight_message)?;
    crate::sql_print::print_result(client, info, format).await.map_err(|message| {
        match message.contains(UNKNOWN_SESSION) {
            true => format!("the node restarted while the rows were read: {message}"),
            false => message,
        }
    })
}

/// Redeems every endpoint's ticket, in order, and hands each batch to `on_batch` as it arrives;
/// returns the result's schema (from the stream, else the `FlightInfo`, else the first batch).
pub(crate) async fn fetch_each(
    client: &mut FlightSqlServiceClient<Channel>,
    info: FlightInfo,
    mut on_batch: impl FnMut(RecordBatch) -> Result<(), String>,
) -> Result<SchemaRef, String> {
    let mut schema: Option<SchemaRef> = None;
    if !info.schema.is_empty() {
        schema = Some(std::sync::Arc::new(info.clone().try_decode_schema().map_err(|e| e.to_string())?));
    }
    let mut first_batch: Option<SchemaRef> = None;
    for endpoint in info.endpoint {
        let Some(ticket) = endpoint.ticket else {
            continue;
        };
        let mut stream = client.do_get(ticket).await.map_err(flight_message)?;
        while let Some(batch) = stream.try_next().await.map_err(flight_message)? {
            first_batch.get_or_insert_with(|| batch.schema());
            on_batch(batch)?;
        }
        if let Some(s) = stream.schema() {
            schema = Some(s.clone());
        }
    }
    Ok(schema.or(first_batch).unwrap_or_else(|| std::sync::Arc::new(Schema::empty())))
}

/// Every batch of the result `info` points at, and its schema.
pub(crate) async fn fetch(
    client: &mut FlightSqlServiceClient<Channel>,
    info: FlightInfo,
) -> Result<(SchemaRef, Vec<RecordBatch>), String> {
    let mut batches = Vec::new();
    let schema = fetch_each(client, info, |batch| {
        batches.push(batch);
        Ok(())
    })
    .await?;
    Ok((schema, batches))
}

/// Longest text value the table format shows whole: laying out a table takes time that grows
/// faster than the length of its longest value (a 20 MB value did not print in a minute).
const TABLE_MAX_TEXT_CHARS: usize = 10_000;

/// `batch` with each text value longer than [`TABLE_MAX_TEXT_CHARS`] cut there and ended by `…`.
fn cut_long_text(batch: &RecordBatch) -> Result<RecordBatch, arrow::error::ArrowError> {
    use arrow::array::{Array, ArrayRef, AsArray, StringArray};
    use arrow::datatypes::DataType;
    let too_long = |v: &str| v.len() > TABLE_MAX_TEXT_CHARS && v.chars().nth(TABLE_MAX_TEXT_CHARS).is_some();
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(batch.num_columns());
    let mut changed = false;
    for column in batch.columns() {
        let text = match column.data_type() {
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => arrow::compute::cast(column, &DataType::Utf8)?,
            _ => {
                columns.push(column.clone());
                continue;
            }
        };
        let strings = text.as_string::<i32>();
        if !strings.iter().flatten().any(too_long) {
            columns.push(column.clone());
            continue;
        }
        changed = true;
        let cut: StringArray = strings
            .iter()
            .map(|v| {
                v.map(|v| match too_long(v) {
                    true => format!("{}…", v.chars().take(TABLE_MAX_TEXT_CHARS).collect::<String>()),
                    false => v.to_string(),
                })
            })
            .collect();
        columns.push(std::sync::Arc::new(cut) as ArrayRef);
    }
    if !changed {
        return Ok(batch.clone());
    }
    let fields: Vec<arrow::datatypes::Field> = batch
        .schema()
        .fields()
        .iter()
        .zip(&columns)
        .map(|(f, c)| f.as_ref().clone().with_data_type(c.data_type().clone()))
        .collect();
    RecordBatch::try_new(std::sync::Arc::new(Schema::new(fields)), columns)
}

/// Writes a result in the chosen format. Results without columns (`SET ...`) print nothing.
pub(crate) fn render(
    schema: &SchemaRef,
    batches: &[RecordBatch],
    format: OutputFormat,
    out: &mut Vec<u8>,
) -> Result<(), arrow::error::ArrowError> {
    if schema.fields().is_empty() {
        return Ok(());
    }
    match format {
        OutputFormat::Table => {
            // NULL shown as NULL (as DuckDB and ClickHouse show it), not as an empty string.
            use arrow::util::display::FormatOptions;
            use arrow::util::pretty::{pretty_format_batches_with_options, pretty_format_batches_with_schema};
            match batches.iter().any(|b| b.num_rows() > 0) {
                true => {
                    let options = FormatOptions::default().with_display_error(true).with_null("NULL");
                    let shown = batches.iter().map(cut_long_text).collect::<Result<Vec<_>, _>>()?;
                    writeln!(out, "{}", pretty_format_batches_with_options(&shown, &options)?)?;
                }
                false => writeln!(out, "{}", pretty_format_batches_with_schema(schema.clone(), batches)?)?,
            }
        }
        OutputFormat::Csv | OutputFormat::CsvNoHeader | OutputFormat::Tsv | OutputFormat::TsvNoHeader => {
            let (text, header) = format.text().unwrap_or((TextFormat::Csv, true));
            if header {
                shardwise_server::csv_text::write_header_as(text, schema, out);
            }
            for batch in batches {
                shardwise_server::csv_text::write_rows_as(text, batch, out)?;
            }
        }
        OutputFormat::Json => shardwise_server::json_lines::write(out, batches)?,
        OutputFormat::ArrowStream => {
            let mut writer = arrow::ipc::writer::StreamWriter::try_new(out, schema)?;
            for batch in batches {
                writer.write(batch)?;
            }
            writer.finish()?;
        }
    }
    Ok(())
}

/// What a user should read for a failed call: the server's status message, not its debug form.
pub(crate) fn flight_message(e: FlightError) -> String {
    match e {
        FlightError::Tonic(status) => status_message(&status),
        FlightError::Arrow(e) => e.to_string(),
        other => other.to_string(),
    }
}

/// A status's message, then its source chain unless the message already says it.
pub(crate) fn status_message(status: &tonic::Status) -> String {
    let mut message = status.message().to_string();
    if message.is_empty() {
        message = format!("{:?}", status.code());
    }
    if let Some(source) = status.source() {
        let chain = error_chain(source);
        let first = source.to_string();
        message = if chain.starts_with(&message) {
            chain
        } else if message.ends_with(&first) {
            // The message already ends with the first cause (`h2 protocol error: error reading
            // a body from connection`): only what follows it.
            format!("{message}{}", &chain[first.len()..])
        } else {
            format!("{message}: {chain}")
        };
    }
    if LOST_CONNECTION.iter().any(|words| message.contains(words)) {
        message.push_str(&format!(
            " (the connection to the node was lost: it stopped or restarted, or did not answer keep-alive pings for \
             {} s)",
            (CLIENT_KEEPALIVE_INTERVAL_MS + CLIENT_KEEPALIVE_TIMEOUT_MS) / 1000
        ));
    }
    message
}

/// Words of a transport error that says the connection went away during a call.
const LOST_CONNECTION: [&str; 3] = ["error reading a body from connection", "broken pipe", "connection closed"];

/// `error: cause: cause...`, for errors (tonic's transport errors) whose Display alone is vague.
fn error_chain(e: &(dyn StdError + 'static)) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text = format!("{text}: {cause_text}");
        }
        next = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_connection_is_said_once_and_named() {
        #[derive(Debug)]
        struct E(&'static str, Option<Box<E>>);
        impl std::fmt::Display for E {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.0)
            }
        }
        impl StdError for E {
            fn source(&self) -> Option<&(dyn StdError + 'static)> {
                self.1.as_deref().map(|e| e as &(dyn StdError + 'static))
            }
        }
        let cause = E(
            "error reading a body from connection",
            Some(Box::new(E("stream closed because of a broken pipe", None))),
        );
        let mut status = tonic::Status::internal("h2 protocol error: error reading a body from connection");
        status.set_source(std::sync::Arc::new(cause));
        let message = status_message(&status);
        assert_eq!(
            message,
            "h2 protocol error: error reading a body from connection: stream closed because of a broken pipe (the \
             connection to the node was lost: it stopped or restarted, or did not answer keep-alive pings for 15 s)"
        );
    }

    fn rendered(batches: &[RecordBatch], schema: SchemaRef, format: OutputFormat) -> String {
        let mut out = Vec::new();
        render(&schema, batches, format, &mut out).expect("render");
        String::from_utf8(out).expect("utf8")
    }

    fn sample() -> (SchemaRef, RecordBatch) {
        use arrow::array::{Int64Array, StringArray};
        let batch = RecordBatch::try_from_iter([
            ("n", std::sync::Arc::new(Int64Array::from(vec![Some(1), None])) as _),
            ("s", std::sync::Arc::new(StringArray::from(vec![None, Some("x")])) as _),
        ])
        .expect("batch");
        (batch.schema(), batch)
    }

    #[test]
    fn a_table_cuts_very_long_text_and_csv_does_not() {
        use arrow::array::StringArray;
        let long = "é".repeat(5_000_000);
        let batch = RecordBatch::try_from_iter([(
            "s",
            std::sync::Arc::new(StringArray::from(vec![Some(long.as_str()), Some("short")])) as _,
        )])
        .expect("batch");
        let started = std::time::Instant::now();
        let table = rendered(std::slice::from_ref(&batch), batch.schema(), OutputFormat::Table);
        assert!(table.contains(&format!("{}…", "é".repeat(TABLE_MAX_TEXT_CHARS))) && table.contains("short"));
        assert!(!table.contains(&"é".repeat(TABLE_MAX_TEXT_CHARS + 1)));
        assert!(started.elapsed() < std::time::Duration::from_secs(20), "{:?}", started.elapsed());
        let csv = rendered(std::slice::from_ref(&batch), batch.schema(), OutputFormat::Csv);
        assert!(csv.contains(&long));
    }

    #[test]
    fn renders_csv_with_header_and_empty_nulls() {
        let (schema, batch) = sample();
        assert_eq!(rendered(&[batch], schema.clone(), OutputFormat::Csv), "n,s\n1,\n,x\n");
        assert_eq!(rendered(&[], schema.clone(), OutputFormat::Csv), "n,s\n");
        assert_eq!(rendered(&[], schema, OutputFormat::TsvNoHeader), "");
    }

    #[test]
    fn renders_json_lines() {
        let (schema, batch) = sample();
        assert_eq!(rendered(&[batch], schema, OutputFormat::Json), "{\"n\":1,\"s\":null}\n{\"n\":null,\"s\":\"x\"}\n");
    }

    #[test]
    fn renders_a_header_for_an_empty_table() {
        let (schema, _) = sample();
        let text = rendered(&[], schema, OutputFormat::Table);
        assert!(text.contains("| n | s |"), "{text}");
    }

    #[test]
    fn every_format_a_format_clause_names_is_written() {
        // The clause's error lists ArrowStream among the accepted formats; shardwise sql used to
        // refuse it.
        for name in ["CSV", "CSVWithNames", "TabSeparated", "TSVWithNames", "JSONEachRow", "ArrowStream", "Pretty"] {
            assert!(shardwise_query::format_clause::FORMAT_NAMES.contains(name), "{name}");
            let (_, clause) = split_format_clause(&format!("SELECT 1 FORMAT {name}")).expect("split");
            let clause = clause.expect("a format");
            assert!(OutputFormat::of_clause(clause).is_ok(), "{name}");
        }
    }

    #[test]
    fn renders_an_arrow_ipc_stream_but_not_to_a_terminal() {
        let (schema, batch) = sample();
        let mut out = Vec::new();
        render(&schema, std::slice::from_ref(&batch), OutputFormat::ArrowStream, &mut out).expect("render");
        let reader = arrow::ipc::reader::StreamReader::try_new(&out[..], None).expect("a stream");
        let back: Vec<RecordBatch> = reader.collect::<Result<_, _>>().expect("batches");
        assert_eq!(back, [batch]);
        let refused = OutputFormat::ArrowStream.check_destination(true).unwrap_err();
        assert!(refused.contains("not to a terminal"), "{refused}");
        assert!(OutputFormat::ArrowStream.check_destination(false).is_ok());
        assert!(OutputFormat::Csv.check_destination(true).is_ok());
    }

    #[test]
    fn column_less_results_print_nothing() {
        let schema = std::sync::Arc::new(Schema::empty());
        assert_eq!(rendered(&[], schema, OutputFormat::Table), "");
    }
}
