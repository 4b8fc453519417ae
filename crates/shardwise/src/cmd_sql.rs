//! `shardwise sql`: run SQL against a node over Arrow Flight SQL, the same protocol ADBC and JDBC
//! clients use, and print the results as a table, CSV or JSON lines.
//!
//! Statements come from `-e`, from `-f FILE`, or from standard input. Scripts are split into
//! statements client-side with the SQL tokenizer DataFusion uses (so `;` inside strings and
//! comments is not a separator) and run in order; the first failure stops the script and names
//! the statement and the line it starts on.

use std::error::Error as StdError;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use base64::Engine as _;
use arrow::array::RecordBatch;
use arrow::datatypes::{Schema, SchemaRef};
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_flight::{FlightInfo, HandshakeRequest};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::tokenizer::{Location, Token, TokenWithSpan, Tokenizer};
use futures::TryStreamExt;
use tonic::transport::{Channel, Endpoint};

/// Largest gRPC message the client accepts (matches the server's limit).
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// How results are printed.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    /// Aligned text table with a header.
    Table,
    /// CSV with a header row; NULL is an empty field.
    Csv,
    /// One JSON object per row and line.
    Json,
}

#[derive(clap::Args, Debug)]
pub struct SqlArgs {
    /// Node's Flight SQL address, host:port.
    #[arg(long, env = "SHARDWISE_CONNECT", default_value = "127.0.0.1:50051")]
    pub connect: String,
    /// Run these statements (separated by `;`) and exit.
    #[arg(short = 'e', long = "execute", conflicts_with = "file")]
    pub execute: Option<String>,
    /// Run the statements in this file, in order, stopping at the first error.
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub format: OutputFormat,
    /// Give up connecting after this many milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub connect_timeout_ms: u64,
    /// User name.
    #[arg(long, env = "SHARDWISE_USER", default_value = "default")]
    pub user: String,
    /// Password.
    #[arg(
        long,
        env = "SHARDWISE_PASSWORD",
        default_value = "",
        hide_env_values = true
    )]
    pub password: String,
}

pub async fn run(args: SqlArgs) -> anyhow::Result<()> {
    let (source, label) = match (&args.execute, &args.file) {
        (Some(sql), _) => (sql.clone(), None),
        (None, Some(path)) => {
            let text = tokio::fs::read_to_string(path)
                .await
                .with_context(|| format!("cannot read {}", path.display()))?;
            (text, Some(path.display().to_string()))
        }
        (None, None) => (read_stdin().await?, Some("stdin".to_string())),
    };
    let pieces = split_statements(&source);
    if pieces.is_empty() {
        return Ok(());
    }
    let single = pieces.len() == 1 && label.is_none();
    let timeout = Duration::from_millis(args.connect_timeout_ms);
    let mut client = connect(&args.connect, &args.user, &args.password, timeout).await?;
    for (index, piece) in pieces.iter().enumerate() {
        let outcome = match piece {
            Ok(statement) => run_statement(&mut client, &statement.text, args.format).await,
            Err(e) => Err(e.message.clone()),
        };
        let Err(message) = outcome else { continue };
        if single {
            bail!("{message}");
        }
        let line = match piece {
            Ok(statement) => statement.line,
            Err(e) => e.line,
        };
        let place = match &label {
            Some(label) => format!("{label} line {line}"),
            None => format!("line {line}"),
        };
        bail!("statement {} ({place}): {message}", index + 1);
    }
    Ok(())
}

async fn read_stdin() -> anyhow::Result<String> {
    use std::io::{IsTerminal, Read};
    if std::io::stdin().is_terminal() {
        eprintln!("reading SQL from standard input; end with Ctrl-D");
    }
    // Blocking read on a blocking thread (tokio's async stdin is not enabled in this build).
    tokio::task::spawn_blocking(|| {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).map(|_| text)
    })
    .await
    .context("standard input reader stopped")?
    .context("cannot read standard input")
}

/// A connected, authenticated Flight SQL client (also used by `demo`).
pub struct SqlClient {
    inner: FlightSqlServiceClient<Channel>,
}

impl SqlClient {
    /// Connects to `addr` (`host:port` or a URI) and logs in.
    pub async fn connect(addr: &str, user: &str, password: &str, timeout: Duration) -> anyhow::Result<SqlClient> {
        connect(addr, user, password, timeout).await.map(|inner| SqlClient { inner })
    }

    /// Runs one statement and prints its result in `format`.
    pub async fn print(&mut self, sql: &str, format: OutputFormat) -> anyhow::Result<()> {
        run_statement(&mut self.inner, sql, format).await.map_err(|m| anyhow!("{m}"))
    }
}

/// Connects and authenticates.
async fn connect(addr: &str, user: &str, password: &str, timeout: Duration) -> anyhow::Result<FlightSqlServiceClient<Channel>> {
    let uri = if addr.contains("://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    };
    let endpoint = Endpoint::from_shared(uri)
        .map_err(|e| anyhow!("invalid address {addr:?}: {}", error_chain(&e)))?
        .connect_timeout(timeout);
    let channel = match tokio::time::timeout(timeout, endpoint.connect()).await {
        Ok(Ok(channel)) => channel,
        Ok(Err(e)) => bail!("could not connect to {addr}: {}", error_chain(&e)),
        Err(_) => bail!("could not connect to {addr}: timed out after {} ms", timeout.as_millis()),
    };
    let inner = FlightServiceClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES);
    let mut client = FlightSqlServiceClient::new_from_inner(inner);
    handshake(&mut client, user, password)
        .await
        .map_err(|message| anyhow!("could not log in to {addr} as {user:?}: {message}"))?;
    Ok(client)
}

/// Basic-auth handshake; keeps the bearer token the server returns. Done here rather than with
/// `FlightSqlServiceClient::handshake`, which flattens the server's status into a debug string.
async fn handshake(
    client: &mut FlightSqlServiceClient<Channel>,
    user: &str,
    password: &str,
) -> Result<(), String> {
    let credentials = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let header = format!("Basic {credentials}")
        .parse()
        .map_err(|_| "user name or password cannot be sent in a header".to_string())?;
    let hello = HandshakeRequest {
        protocol_version: 0,
        payload: Default::default(),
    };
    let mut request = tonic::Request::new(futures::stream::iter([hello]));
    request.metadata_mut().insert("authorization", header);
    let response = client
        .inner_mut()
        .handshake(request)
        .await
        .map_err(|s| status_message(&s))?;
    let token = response
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string);
    let mut replies = response.into_inner();
    while replies
        .message()
        .await
        .map_err(|s| status_message(&s))?
        .is_some()
    {}
    if let Some(token) = token {
        client.set_token(token);
    }
    Ok(())
}

/// Runs one statement and prints its result; `Err` carries the server's message.
async fn run_statement(
    client: &mut FlightSqlServiceClient<Channel>,
    sql: &str,
    format: OutputFormat,
) -> Result<(), String> {
    let info = client
        .execute(sql.to_string(), None)
        .await
        .map_err(flight_message)?;
    let (schema, batches) = fetch(client, info).await.map_err(flight_message)?;
    let mut out = Vec::new();
    render(&schema, &batches, format, &mut out).map_err(|e| e.to_string())?;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(&out)
        .and_then(|()| stdout.flush())
        .map_err(|e| format!("cannot write the result: {e}"))
}

/// Redeems every endpoint's ticket, in order.
async fn fetch(
    client: &mut FlightSqlServiceClient<Channel>,
    info: FlightInfo,
) -> Result<(SchemaRef, Vec<RecordBatch>), FlightError> {
    let mut schema: Option<SchemaRef> = None;
    if !info.schema.is_empty() {
        schema = Some(std::sync::Arc::new(info.clone().try_decode_schema()?));
    }
    let mut batches = Vec::new();
    for endpoint in info.endpoint {
        let Some(ticket) = endpoint.ticket else {
            continue;
        };
        let mut stream = client.do_get(ticket).await?;
        while let Some(batch) = stream.try_next().await? {
            batches.push(batch);
        }
        if let Some(s) = stream.schema() {
            schema = Some(s.clone());
        }
    }
    let schema = schema
        .or_else(|| batches.first().map(RecordBatch::schema))
        .unwrap_or_else(|| std::sync::Arc::new(Schema::empty()));
    Ok((schema, batches))
}

/// Writes a result in the chosen format. Results without columns (`SET ...`) print nothing.
fn render(
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
            let table =
                arrow::util::pretty::pretty_format_batches_with_schema(schema.clone(), batches)?;
            writeln!(out, "{table}")?;
        }
        OutputFormat::Csv => {
            let mut writer = arrow::csv::WriterBuilder::new()
                .with_header(true)
                .with_null(String::new())
                .build(out);
            if batches.is_empty() {
                writer.write(&RecordBatch::new_empty(schema.clone()))?;
            }
            for batch in batches {
                writer.write(batch)?;
            }
        }
        OutputFormat::Json => {
            let mut writer = arrow::json::WriterBuilder::new()
                .with_explicit_nulls(true)
                .build::<_, arrow::json::writer::LineDelimited>(out);
            for batch in batches {
                writer.write(batch)?;
            }
            writer.finish()?;
        }
    }
    Ok(())
}

/// What a user should read for a failed call: the server's status message, not its debug form.
fn flight_message(e: FlightError) -> String {
    match e {
        FlightError::Tonic(status) => status_message(&status),
        FlightError::Arrow(e) => e.to_string(),
        other => other.to_string(),
    }
}

fn status_message(status: &tonic::Status) -> String {
    let mut message = status.message().to_string();
    if message.is_empty() {
        message = format!("{:?}", status.code());
    }
    if let Some(source) = status.source() {
        message = format!("{message}: {}", error_chain(source));
    }
    message
}

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

/// One statement of a script, without its terminating `;`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqlStatement {
    pub text: String,
    /// 1-based line of the statement's first token (leading comments excluded).
    pub line: u64,
}

/// A script that cannot be tokenized (unterminated string or comment, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitError {
    /// Line where the failing statement starts.
    pub line: u64,
    pub message: String,
}

/// Splits a script into statements on `;` outside strings, quoted identifiers and comments.
/// Pieces holding only whitespace and comments are dropped. When the script cannot be tokenized,
/// the statements before the bad one are returned followed by one `Err`.
pub fn split_statements(src: &str) -> Vec<Result<SqlStatement, SplitError>> {
    let dialect = GenericDialect {};
    let mut tokens: Vec<TokenWithSpan> = Vec::new();
    let failure = Tokenizer::new(&dialect, src)
        .tokenize_with_location_into_buf(&mut tokens)
        .err();
    let lines = LineStarts::new(src);
    let mut out = Vec::new();
    let mut first: Option<Location> = None;
    for token in &tokens {
        match token.token {
            Token::SemiColon => {
                if let Some(start) = first.take() {
                    let end = lines.offset(token.span.start);
                    out.push(Ok(statement(src, lines.offset(start), end, start.line)));
                }
            }
            Token::Whitespace(_) | Token::EOF => {}
            _ => {
                if first.is_none() {
                    first = Some(token.span.start);
                }
            }
        }
    }
    match failure {
        None => {
            if let Some(start) = first {
                out.push(Ok(statement(
                    src,
                    lines.offset(start),
                    src.len(),
                    start.line,
                )));
            }
        }
        Some(e) => out.push(Err(SplitError {
            line: first.map_or(e.location.line, |start| start.line),
            message: e.to_string(),
        })),
    }
    out
}

fn statement(src: &str, start: usize, end: usize, line: u64) -> SqlStatement {
    let text = src
        .get(start..end.max(start))
        .unwrap_or_default()
        .trim_end();
    SqlStatement {
        text: text.to_string(),
        line,
    }
}

/// Maps the tokenizer's (line, column) locations, both 1-based and counted in characters, to
/// byte offsets.
struct LineStarts<'a> {
    src: &'a str,
    starts: Vec<usize>,
}

impl<'a> LineStarts<'a> {
    fn new(src: &'a str) -> Self {
        let mut starts = vec![0];
        starts.extend(src.match_indices('\n').map(|(i, _)| i + 1));
        LineStarts { src, starts }
    }

    fn offset(&self, location: Location) -> usize {
        let line = usize::try_from(location.line.saturating_sub(1)).unwrap_or(usize::MAX);
        let Some(&line_start) = self.starts.get(line) else {
            return self.src.len();
        };
        let column = usize::try_from(location.column.saturating_sub(1)).unwrap_or(usize::MAX);
        self.src[line_start..]
            .char_indices()
            .nth(column)
            .map_or(self.src.len(), |(i, _)| line_start + i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(pieces: Vec<Result<SqlStatement, SplitError>>) -> Vec<(String, u64)> {
        pieces
            .into_iter()
            .map(|p| match p {
                Ok(s) => (s.text, s.line),
                Err(e) => panic!("unexpected split error: {e:?}"),
            })
            .collect()
    }

    #[test]
    fn splits_on_top_level_semicolons() {
        let got = ok(split_statements("SELECT 1; SELECT 2;\nSELECT 3"));
        assert_eq!(
            got,
            [
                ("SELECT 1".to_string(), 1),
                ("SELECT 2".to_string(), 1),
                ("SELECT 3".to_string(), 2)
            ]
        );
    }

    #[test]
    fn semicolons_in_strings_identifiers_and_comments_do_not_split() {
        let src = "SELECT 'a;b', \"c;d\" -- e;f\n FROM t /* g;\n h */ WHERE x = ';';\nSELECT 2";
        let got = ok(split_statements(src));
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(
            got[0].0,
            "SELECT 'a;b', \"c;d\" -- e;f\n FROM t /* g;\n h */ WHERE x = ';'"
        );
        assert_eq!(got[1], ("SELECT 2".to_string(), 4));
    }

    #[test]
    fn empty_and_comment_only_pieces_are_dropped() {
        assert!(split_statements("").is_empty());
        assert!(split_statements("  \n ;;\n -- nothing\n/* here */ ;").is_empty());
        let got = ok(split_statements(";;SELECT 1;;"));
        assert_eq!(got, [("SELECT 1".to_string(), 1)]);
    }

    #[test]
    fn line_numbers_skip_leading_comments_and_blank_lines() {
        let src = "-- header\n\nSELECT 1;\n\n  -- about two\n  SELECT\n 2;";
        let got = ok(split_statements(src));
        assert_eq!(
            got,
            [("SELECT 1".to_string(), 3), ("SELECT\n 2".to_string(), 6)]
        );
    }

    #[test]
    fn multibyte_text_keeps_its_bytes() {
        let got = ok(split_statements("SELECT 'héllo; wörld' AS é; SELECT 'ü'"));
        assert_eq!(
            got,
            [
                ("SELECT 'héllo; wörld' AS é".to_string(), 1),
                ("SELECT 'ü'".to_string(), 1)
            ]
        );
    }

    #[test]
    fn tokenizer_errors_come_after_the_good_statements() {
        let got = split_statements("SELECT 1;\nSELECT 'unterminated;\nSELECT 3;");
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(
            got[0],
            Ok(SqlStatement {
                text: "SELECT 1".into(),
                line: 1
            })
        );
        let Err(e) = &got[1] else {
            panic!("expected an error: {got:?}")
        };
        assert_eq!(e.line, 2);
        assert!(e.message.contains("Unterminated"), "{}", e.message);
    }

    fn rendered(batches: &[RecordBatch], schema: SchemaRef, format: OutputFormat) -> String {
        let mut out = Vec::new();
        render(&schema, batches, format, &mut out).expect("render");
        String::from_utf8(out).expect("utf8")
    }

    fn sample() -> (SchemaRef, RecordBatch) {
        use arrow::array::{Int64Array, StringArray};
        let batch = RecordBatch::try_from_iter([
            (
                "n",
                std::sync::Arc::new(Int64Array::from(vec![Some(1), None])) as _,
            ),
            (
                "s",
                std::sync::Arc::new(StringArray::from(vec![None, Some("x")])) as _,
            ),
        ])
        .expect("batch");
        (batch.schema(), batch)
    }

    #[test]
    fn renders_csv_with_header_and_empty_nulls() {
        let (schema, batch) = sample();
        assert_eq!(
            rendered(&[batch], schema.clone(), OutputFormat::Csv),
            "n,s\n1,\n,x\n"
        );
        assert_eq!(rendered(&[], schema, OutputFormat::Csv), "n,s\n");
    }

    #[test]
    fn renders_json_lines() {
        let (schema, batch) = sample();
        assert_eq!(
            rendered(&[batch], schema, OutputFormat::Json),
            "{\"n\":1,\"s\":null}\n{\"n\":null,\"s\":\"x\"}\n"
        );
    }

    #[test]
    fn renders_a_header_for_an_empty_table() {
        let (schema, _) = sample();
        let text = rendered(&[], schema, OutputFormat::Table);
        assert!(text.contains("| n | s |"), "{text}");
    }

    #[test]
    fn column_less_results_print_nothing() {
        let schema = std::sync::Arc::new(Schema::empty());
        assert_eq!(rendered(&[], schema, OutputFormat::Table), "");
    }
}
