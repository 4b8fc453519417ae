//! `shardwise load`: bulk-load a CSV, NDJSON or Parquet file into a table through a node's Arrow
//! Flight SQL endpoint, exactly once.
//!
//! The table's schema comes from the server (the result schema of `SELECT * FROM "t" LIMIT 0`).
//! The whole file is read and checked against it ([`crate::load`]) before anything is sent, so a
//! malformed row fails the load with its line and column and leaves the table alone. The rows then
//! go in one Flight SQL `CommandStatementIngest` call with an insert id (printed before anything
//! is sent), the last message carrying a commit marker with the row count; the server stores the
//! rows in segments as they arrive (see `shardwise_server::ingest`) and acknowledges once the
//! marker has arrived and every segment is durable. Each segment is stored at most once per
//! insert id, so after an error that leaves the outcome unknown (a lost connection, a timeout, a
//! crash of this client) the same rows are sent again under the same id, and a failed load re-run
//! with `--insert-id` completes exactly once.

use std::collections::HashMap;
use std::error::Error as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use arrow::array::RecordBatch;
use arrow_flight::error::FlightError;
use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_flight::sql::{CommandStatementIngest, TableDefinitionOptions, TableExistsOption, TableNotExistOption};
use futures::Stream;
use tonic::Code;
use tonic::transport::Channel;

use crate::cmd_sql::{connect, flight_message, status_message};
use crate::load::client::table_schema;
use crate::load::progress::{Progress, per_second};
use crate::load::{self, Format};

/// Most rows per batch `--batch-rows` accepts: the readers size buffers by it.
const MAX_BATCH_ROWS: u32 = 1 << 24;
/// Wait before the first retry; doubled for each further one, up to [`RETRY_MAX_DELAY_MS`].
const RETRY_FIRST_DELAY_MS: u64 = 500;
const RETRY_MAX_DELAY_MS: u64 = 8_000;
/// `CommandStatementIngest` option keys the server reads.
const INSERT_ID_OPTION: &str = "insert_id";
/// With `commit = marker` the server stores the rows while they arrive and acknowledges the load
/// only once the stream's last message carries `shardwise-commit rows=N` (see
/// `shardwise_server::ingest`); a stream cut short is finished by a retry with the same insert id.
const COMMIT_OPTION: &str = "commit";
const COMMIT_MARKER_PREFIX: &str = "shardwise-commit rows=";
const BYTES_PER_MIB: f64 = 1024.0 * 1024.0;

#[derive(clap::Args, Debug)]
pub struct LoadArgs {
    /// Table to load into: its name as the server stores it (case-sensitive, and `CREATE TABLE
    /// Trips` stores `trips`; dots are part of the name).
    pub table: String,
    /// File to load: CSV with a header row, Parquet, or NDJSON (one JSON object per line).
    pub file: PathBuf,
    /// Node's Flight SQL address, host:port.
    #[arg(long, env = "SHARDWISE_CONNECT", default_value = crate::cmd_sql::DEFAULT_CONNECT)]
    pub connect: String,
    /// File format [default: from the extension: .csv, .parquet, or .ndjson, .jsonl and .json, all
    /// read as newline-delimited JSON].
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// Idempotency key of this load [default: a new random UUID]. The server applies a load at
    /// most once per insert id, so re-running a failed load with the id it printed completes it
    /// exactly once.
    #[arg(long, value_parser = parse_insert_id)]
    pub insert_id: Option<String>,
    /// User name.
    #[arg(long, env = "SHARDWISE_USER", default_value = "default")]
    pub user: String,
    /// Password.
    #[arg(long, env = "SHARDWISE_PASSWORD", default_value = "", hide_env_values = true)]
    pub password: String,
    /// Rows per record batch read and sent.
    #[arg(long, default_value = "65536", value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_BATCH_ROWS)))]
    pub batch_rows: u32,
    /// Do not draw the progress bar (it is drawn on standard error, and only when that is a terminal).
    #[arg(long)]
    pub no_progress: bool,
    /// Retries after an error that may be transient (server unavailable, timeout, lost
    /// connection), with backoff, under the same insert id.
    #[arg(long, default_value_t = 3)]
    pub retries: u32,
    /// Give up connecting (and logging in) after this many milliseconds; a node that stops
    /// answering later is found by HTTP/2 pings within 15 s.
    #[arg(long, default_value_t = 10_000)]
    pub connect_timeout_ms: u64,
}

/// `--insert-id`: refused here as the server would refuse it (1 to 256 bytes), before the file
/// is read.
fn parse_insert_id(value: &str) -> Result<String, String> {
    shardwise_server::tables::check_insert_id(value).map(|()| value.to_string())
}

/// A failed load, and whether any rows may have reached the server.
struct Failure {
    error: anyhow::Error,
    sent: bool,
    /// The server refused the rows for what they are (a row too large for the table, say), so
    /// sending the same file again fails the same way.
    refused: bool,
}

impl Failure {
    fn before_sending(error: anyhow::Error) -> Failure {
        Failure { error, sent: false, refused: false }
    }

    /// The error as printed: the cause, then what became of the table. When rows may have been
    /// sent, also the insert id and how to finish the load; when nothing was sent there is
    /// nothing to finish, and any re-run (with or without the id) is a first load.
    fn into_error(self, insert_id: &str) -> anyhow::Error {
        if self.sent && self.refused {
            anyhow!(
                "{:#}\nthe server refused these rows, so sending the same file again fails the same way; rows \
                 sent before them may be stored (insert id {insert_id}): correct the file and re-run with \
                 --insert-id {insert_id}, which stores each row once as long as the rows before the refused \
                 ones are unchanged",
                self.error
            )
        } else if self.sent {
            anyhow!(
                "{:#}\nthe server may have stored some or all of the rows (insert id {insert_id}); \
                 re-running with --insert-id {insert_id} completes the load exactly once",
                self.error
            )
        } else {
            anyhow!("{:#}\nnothing was sent; the table is unchanged", self.error)
        }
    }
}

pub async fn run(args: LoadArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let insert_id = args.insert_id.clone().unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    // Before anything is sent: after a crash of this client part-way through the send, the same
    // command with --insert-id completes the load exactly once.
    eprintln!("loading {} into {} with insert id {insert_id}", args.file.display(), args.table);
    let progress = Progress::new(!args.no_progress);
    let outcome = load(&args, &insert_id, &progress).await;
    progress.finish();
    let (rows, file_bytes, read) = outcome.map_err(|failure| failure.into_error(&insert_id))?;
    let elapsed = started.elapsed();
    println!(
        "{}; read and checked in {:.2} s, sent and stored in {:.2} s",
        summary(rows, &args.table, elapsed, file_bytes),
        read.as_secs_f64(),
        elapsed.saturating_sub(read).as_secs_f64()
    );
    if let Some(id) = &args.insert_id {
        // The count is of the rows sent and acknowledged: a part stored before under this id is
        // not stored again, which is what a retry wants, and what a new file under an old id
        // does not.
        eprintln!(
            "with --insert-id {id}: any part of this load stored before under the same id was not stored again \
             (give each different load an id of its own)"
        );
    }
    Ok(())
}

/// Reads, checks and sends the file; the rows loaded, the file's size, and the time from the
/// start until the file was read and checked.
async fn load(args: &LoadArgs, insert_id: &str, progress: &Progress) -> Result<(u64, u64, Duration), Failure> {
    let started = Instant::now();
    let format = match args.format {
        Some(format) => format,
        None => Format::from_path(&args.file).map_err(Failure::before_sending)?,
    };
    let file_bytes = std::fs::metadata(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))
        .map_err(Failure::before_sending)?
        .len();
    let timeout = Duration::from_millis(args.connect_timeout_ms);
    let mut client =
        connect(&args.connect, &args.user, &args.password, timeout).await.map_err(Failure::before_sending)?;
    let schema = table_schema(&mut client, &args.connect, &args.table).await.map_err(Failure::before_sending)?;
    let (path, reader_schema, reader_progress) = (args.file.clone(), schema.clone(), progress.clone());
    let batch_rows = usize::try_from(args.batch_rows).unwrap_or(usize::MAX);
    let mut batches = tokio::task::spawn_blocking(move || {
        load::read_file(&path, format, &reader_schema, batch_rows, &reader_progress)
    })
    .await
    .context("the file reader stopped unexpectedly")
    .and_then(|read| read)
    .map_err(Failure::before_sending)?;
    let rows: u64 = batches.iter().map(|b| b.num_rows() as u64).sum();
    // A row no insert chunk of the table can hold fails the load now, not after the segments
    // before it were stored.
    if let Some((limit, replicas)) = load::client::row_max_bytes(&mut client, &args.table).await
        && let Some((row, size)) = first_row_over(&batches, limit)
    {
        return Err(Failure::before_sending(anyhow!(
            "{}: data row {row} holds {size} bytes, more than one insert chunk of table {} may hold ({limit} bytes: \
             one WAL record of at most {} bytes carries every replica's copy, and the table has {replicas}); \
             shorten that row or split it",
            args.file.display(),
            args.table,
            shardwise_storage::WAL_RECORD_MAX_BYTES
        )));
    }
    let read = started.elapsed();
    if batches.is_empty() {
        // The server learns the schema (and the call its descriptor) from the first batch.
        batches.push(RecordBatch::new_empty(schema));
    }
    let ingest = Ingest { args, insert_id, rows, batches };
    ingest.send_with_retries(client, progress).await?;
    Ok((rows, file_bytes, read))
}

/// The first row (1-based, over all batches) whose bytes, as the server counts them for chunks,
/// are more than `limit`, with its size.
fn first_row_over(batches: &[RecordBatch], limit: usize) -> Option<(u64, usize)> {
    let mut before = 0u64;
    for batch in batches {
        // Most batches are far below the limit in all: not sized row by row.
        if shardwise_storage::chunk_size::batch_bytes(batch) > limit {
            let sizes = shardwise_storage::chunk_size::row_sizes(batch);
            if let Some((i, size)) = sizes.into_iter().enumerate().find(|(_, size)| *size > limit) {
                return Some((before + i as u64 + 1, size));
            }
        }
        before += batch.num_rows() as u64;
    }
    None
}

/// `loaded N rows into TABLE in S s (R rows/s, M MiB/s)` (`1 row` for one), rates over the whole run.
fn summary(rows: u64, table: &str, elapsed: Duration, file_bytes: u64) -> String {
    let seconds = elapsed.as_secs_f64();
    let mib_per_second = if seconds > 0.0 { file_bytes as f64 / BYTES_PER_MIB / seconds } else { 0.0 };
    let noun = if rows == 1 { "row" } else { "rows" };
    format!(
        "loaded {rows} {noun} into {table} in {seconds:.2} s ({} rows/s, {mib_per_second:.1} MiB/s)",
        per_second(rows, elapsed)
    )
}

/// One load's ingest call, repeated on transient errors.
struct Ingest<'a> {
    args: &'a LoadArgs,
    insert_id: &'a str,
    rows: u64,
    batches: Vec<RecordBatch>,
}

/// A failed ingest attempt; `transient` when retrying may succeed.
struct AttemptError {
    error: anyhow::Error,
    transient: bool,
    /// The server refused the rows as they are (`InvalidArgument`).
    refused: bool,
}

impl Ingest<'_> {
    async fn send_with_retries(
        &self,
        client: FlightSqlServiceClient<Channel>,
        progress: &Progress,
    ) -> Result<(), Failure> {
        let mut client = Some(client);
        let mut retries_done = 0;
        loop {
            let Err(failed) = self.attempt(&mut client, progress).await else { return Ok(()) };
            if !failed.transient || retries_done >= self.args.retries {
                return Err(Failure { error: failed.error, sent: true, refused: failed.refused });
            }
            retries_done += 1;
            let delay = retry_delay(retries_done);
            progress.note(&format!(
                "load: {:#}; retry {retries_done} of {} in {:.1} s (insert id {})",
                failed.error,
                self.args.retries,
                delay.as_secs_f64(),
                self.insert_id
            ));
            tokio::time::sleep(delay).await;
        }
    }

    /// One ingest call, on `client` or (after a transient error dropped it) a new connection.
    async fn attempt(
        &self,
        client: &mut Option<FlightSqlServiceClient<Channel>>,
        progress: &Progress,
    ) -> Result<(), AttemptError> {
        let args = self.args;
        let connected = match client.take() {
            Some(connected) => connected,
            None => connect(&args.connect, &args.user, &args.password, Duration::from_millis(args.connect_timeout_ms))
                .await
                .map_err(|error| AttemptError { error, transient: true, refused: false })?,
        };
        let total_bytes = self.batches.iter().map(|b| b.get_array_memory_size() as u64).sum();
        progress.start_phase("sending", total_bytes);
        let (command, stream) = (self.command(), batch_stream(&self.batches, progress.clone()));
        // On its own task: arrow-flight unwraps the server's reply, and a panic there must still
        // end in the insert id message.
        let rows = self.rows;
        let call = tokio::spawn(ingest_with_marker(connected, command, stream, rows));
        let (connected, result) = call.await.map_err(|e| AttemptError {
            error: anyhow!("the server's reply to the ingest call could not be read: {e}"),
            transient: false,
            refused: false,
        })?;
        let inserted = result.map_err(|e| AttemptError {
            transient: is_transient(&e),
            refused: matches!(&e, FlightError::Tonic(status) if status.code() == Code::InvalidArgument),
            error: ingest_error(e, &args.connect),
        })?;
        *client = Some(connected);
        if u64::try_from(inserted).ok() != Some(self.rows) {
            let error = anyhow!("the server reported {inserted} rows inserted, but {} were sent", self.rows);
            return Err(AttemptError { error, transient: false, refused: false });
        }
        Ok(())
    }

    fn command(&self) -> CommandStatementIngest {
        CommandStatementIngest {
            table_definition_options: Some(TableDefinitionOptions {
                if_not_exist: TableNotExistOption::Fail.into(),
                if_exists: TableExistsOption::Append.into(),
            }),
            table: self.args.table.clone(),
            schema: None,
            catalog: None,
            temporary: false,
            transaction_id: None,
            options: HashMap::from([
                (INSERT_ID_OPTION.to_string(), self.insert_id.to_string()),
                (COMMIT_OPTION.to_string(), "marker".to_string()),
            ]),
        }
    }
}

/// Sends `batches` as a Flight SQL ingest whose last message carries the commit marker for `rows`
/// rows; returns the row count the server reports. An error in the batch stream ends the stream
/// without the marker, so the server writes nothing.
async fn ingest_with_marker(
    mut client: FlightSqlServiceClient<Channel>,
    command: CommandStatementIngest,
    batches: impl Stream<Item = Result<RecordBatch, FlightError>> + Send + 'static,
    rows: u64,
) -> (FlightSqlServiceClient<Channel>, Result<i64, FlightError>) {
    let batches: BatchStream = Box::pin(batches);
    let result = send_with_marker(&mut client, command, batches, rows).await;
    (client, result)
}

async fn send_with_marker(
    client: &mut FlightSqlServiceClient<Channel>,
    command: CommandStatementIngest,
    batches: BatchStream,
    rows: u64,
) -> Result<i64, FlightError> {
    use arrow_flight::FlightDescriptor;
    use arrow_flight::encode::FlightDataEncoderBuilder;
    use arrow_flight::sql::{DoPutUpdateResult, ProstMessageExt};
    use futures::StreamExt;
    use prost::Message;

    let descriptor = FlightDescriptor::new_cmd(command.as_any().encode_to_vec());
    let encoded: EncodedStream =
        Box::pin(FlightDataEncoderBuilder::new().with_flight_descriptor(Some(descriptor)).build(batches));
    let (error_tx, mut error_rx) = tokio::sync::oneshot::channel::<FlightError>();
    let marker = bytes::Bytes::from(format!("{COMMIT_MARKER_PREFIX}{rows}"));
    let data = WithMarker { encoded: encoded.fuse(), ahead: None, error_tx: Some(error_tx), marker, done: false };
    let reply = client.do_put(data).await;
    if let Ok(e) = error_rx.try_recv() {
        return Err(e);
    }
    let mut reply = reply?;
    let first = reply.message().await.map_err(|s| FlightError::Tonic(Box::new(s)))?;
    let first = first.ok_or_else(|| FlightError::ProtocolError("the server sent no ingest result".into()))?;
    let result = DoPutUpdateResult::decode(&*first.app_metadata)
        .map_err(|e| FlightError::DecodeError(format!("ingest result: {e}")))?;
    Ok(result.record_count)
}

type BatchStream = std::pin::Pin<Box<dyn Stream<Item = Result<RecordBatch, FlightError>> + Send>>;
type EncodedStream = std::pin::Pin<Box<dyn Stream<Item = Result<arrow_flight::FlightData, FlightError>> + Send>>;

/// The encoded messages with one message of look-ahead, so the last one can carry the commit
/// marker. An encoding error ends the stream without it (and is handed to the caller).
struct WithMarker {
    encoded: futures::stream::Fuse<EncodedStream>,
    ahead: Option<arrow_flight::FlightData>,
    error_tx: Option<tokio::sync::oneshot::Sender<FlightError>>,
    marker: bytes::Bytes,
    done: bool,
}

impl WithMarker {
    fn fail(&mut self, e: FlightError) -> std::task::Poll<Option<arrow_flight::FlightData>> {
        if let Some(tx) = self.error_tx.take() {
            let _ = tx.send(e);
        }
        self.done = true;
        std::task::Poll::Ready(None)
    }
}

impl Stream for WithMarker {
    type Item = arrow_flight::FlightData;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use futures::StreamExt;
        use std::task::Poll;
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if this.ahead.is_none() {
            match std::task::ready!(this.encoded.poll_next_unpin(cx)) {
                Some(Ok(message)) => this.ahead = Some(message),
                Some(Err(e)) => return this.fail(e),
                None => {
                    this.done = true;
                    return Poll::Ready(None);
                }
            }
        }
        match std::task::ready!(this.encoded.poll_next_unpin(cx)) {
            Some(Ok(next)) => Poll::Ready(this.ahead.replace(next)),
            None => {
                this.done = true;
                Poll::Ready(this.ahead.take().map(|mut last| {
                    last.app_metadata = this.marker.clone();
                    last
                }))
            }
            Some(Err(e)) => this.fail(e),
        }
    }
}

/// The batches (cheap copies: their arrays are shared) as the stream the ingest sends,
/// advancing the progress bar as they go.
fn batch_stream(
    batches: &[RecordBatch],
    progress: Progress,
) -> impl Stream<Item = Result<RecordBatch, FlightError>> + Send + 'static {
    let batches = batches.to_vec();
    futures::stream::iter(batches.into_iter().map(move |batch| {
        progress.advance(batch.get_array_memory_size() as u64, batch.num_rows() as u64);
        Ok(batch)
    }))
}

/// Backoff before retry `n` (1-based): 0.5 s, 1 s, 2 s, ... up to 8 s.
fn retry_delay(n: u32) -> Duration {
    let factor = 1u64.checked_shl(n.saturating_sub(1)).unwrap_or(u64::MAX);
    Duration::from_millis(RETRY_FIRST_DELAY_MS.saturating_mul(factor).min(RETRY_MAX_DELAY_MS))
}

/// Whether an ingest error may pass on retry (on a new connection, logged in again): the server
/// unavailable, a deadline, a session token the server no longer knows (it restarted after the
/// login; a wrong password fails before anything is sent), or a status made on this side of the
/// connection (it carries the transport error as its source; statuses the server sends carry none).
fn is_transient(e: &FlightError) -> bool {
    let FlightError::Tonic(status) = e else { return false };
    match status.code() {
        Code::Unavailable | Code::DeadlineExceeded | Code::Unauthenticated => true,
        Code::Unknown | Code::Internal | Code::Cancelled => status.source().is_some(),
        _ => false,
    }
}

fn ingest_error(e: FlightError, addr: &str) -> anyhow::Error {
    if let FlightError::Tonic(status) = &e
        && status.code() == Code::Unimplemented
    {
        return anyhow!(
            "{addr} does not accept bulk loads (Flight SQL CommandStatementIngest): {}",
            status_message(status)
        );
    }
    anyhow!("sending to {addr} failed: {}", flight_message(e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn summary_line() {
        let line = summary(1000, "t", Duration::from_secs(2), 4 * 1024 * 1024);
        assert_eq!(line, "loaded 1000 rows into t in 2.00 s (500 rows/s, 2.0 MiB/s)");
        assert!(summary(1, "t", Duration::from_secs(1), 10).starts_with("loaded 1 row into t in "));
        assert!(summary(0, "t", Duration::from_secs(1), 10).starts_with("loaded 0 rows into t in "));
    }

    #[test]
    fn insert_id_must_be_1_to_256_bytes() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            load: LoadArgs,
        }
        let parse = |id: &str| Cli::try_parse_from(["load", "t", "f.csv", "--insert-id", id]).map(|c| c.load.insert_id);
        assert_eq!(parse("L1").unwrap().as_deref(), Some("L1"));
        let empty = parse("").unwrap_err().to_string();
        assert!(empty.contains("insert_id is empty; give 1 to 256 bytes"), "{empty}");
        let long = parse(&"x".repeat(257)).unwrap_err().to_string();
        assert!(long.contains("insert_id must be 1 to 256 bytes, got 257 bytes"), "{long}");
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let delays: Vec<u64> = (1..=6).map(|n| retry_delay(n).as_millis() as u64).collect();
        assert_eq!(delays, [500, 1000, 2000, 4000, 8000, 8000]);
        assert_eq!(retry_delay(200).as_millis(), 8000);
    }

    #[test]
    fn transient_errors() {
        let status = |code| FlightError::Tonic(Box::new(tonic::Status::new(code, "x")));
        assert!(is_transient(&status(Code::Unavailable)));
        assert!(is_transient(&status(Code::DeadlineExceeded)));
        assert!(!is_transient(&status(Code::InvalidArgument)));
        assert!(is_transient(&status(Code::Unauthenticated)), "the server restarted since the login");
        assert!(!is_transient(&status(Code::Internal)));
        assert!(!is_transient(&status(Code::Unimplemented)));
        let mut reset = tonic::Status::new(Code::Unknown, "transport error");
        reset.set_source(Arc::new(std::io::Error::from(std::io::ErrorKind::ConnectionReset)));
        assert!(is_transient(&FlightError::Tonic(Box::new(reset))));
    }

    #[test]
    fn failure_messages_name_the_insert_id_only_when_rows_may_have_been_sent() {
        let refused =
            format!("{:#}", Failure { error: anyhow!("too big"), sent: true, refused: true }.into_error("abc"));
        assert!(refused.contains("fails the same way") && refused.contains("correct the file"), "{refused}");
        let sent = Failure { error: anyhow!("boom"), sent: true, refused: false }.into_error("abc");
        let text = format!("{sent:#}");
        assert!(text.contains("boom"), "{text}");
        assert!(text.contains("re-running with --insert-id abc completes the load exactly once"), "{text}");
        assert!(text.contains("may have stored some or all of the rows (insert id abc)"), "{text}");
        let unsent = format!("{:#}", Failure::before_sending(anyhow!("bad file")).into_error("abc"));
        assert_eq!(unsent, "bad file\nnothing was sent; the table is unchanged");
        assert!(!unsent.contains("--insert-id") && !unsent.contains("abc"), "{unsent}");
    }
}

/// The server side of a cut-off load, against an embedded cluster: what arrived before the cut may
/// be stored, the error names the insert id, and a retry with that id completes the load exactly
/// once.
#[cfg(test)]
mod stream_tests {
    use std::sync::Arc;

    use arrow::array::{Array, Int64Array};
    use arrow::datatypes::{DataType, Field, Schema};
    use arrow_flight::FlightDescriptor;
    use arrow_flight::encode::FlightDataEncoderBuilder;
    use arrow_flight::sql::ProstMessageExt;
    use futures::StreamExt;
    use prost::Message;

    use super::*;
    use crate::cmd_sql::SqlClient;
    use crate::embedded::EmbeddedCluster;

    /// More than one ingest segment (262 144 rows), not a whole number of them.
    const ROWS: i64 = 300_000;
    const BATCH_ROWS: i64 = 60_000;

    fn rows() -> Vec<RecordBatch> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("v", DataType::Int64, true),
        ]));
        (0..ROWS / BATCH_ROWS)
            .map(|b| {
                let ids = (b * BATCH_ROWS)..((b + 1) * BATCH_ROWS);
                let columns: Vec<Arc<dyn Array>> = vec![
                    Arc::new(Int64Array::from_iter_values(ids.clone())),
                    Arc::new(Int64Array::from_iter_values(ids.map(|i| 2 * i))),
                ];
                RecordBatch::try_new(Arc::clone(&schema), columns).expect("batch")
            })
            .collect()
    }

    fn command(insert_id: &str) -> CommandStatementIngest {
        CommandStatementIngest {
            table_definition_options: None,
            table: "s".into(),
            schema: None,
            catalog: None,
            temporary: false,
            transaction_id: None,
            options: HashMap::from([
                (INSERT_ID_OPTION.to_string(), insert_id.to_string()),
                (COMMIT_OPTION.to_string(), "marker".to_string()),
            ]),
        }
    }

    /// Sends every row but ends the stream without the commit marker, as a client that died
    /// after its last batch would; the server's error message.
    async fn send_without_marker(client: &mut FlightSqlServiceClient<Channel>, insert_id: &str) -> String {
        let descriptor = FlightDescriptor::new_cmd(command(insert_id).as_any().encode_to_vec());
        let batches = futures::stream::iter(rows().into_iter().map(Ok));
        let data = FlightDataEncoderBuilder::new()
            .with_flight_descriptor(Some(descriptor))
            .build(batches)
            .map(|message| message.expect("encode"));
        match client.do_put(data).await {
            Err(e) => flight_message(e),
            Ok(mut reply) => match reply.message().await {
                Err(status) => status.message().to_string(),
                Ok(_) => panic!("a stream without its commit marker was acknowledged"),
            },
        }
    }

    async fn count_and_sum(sql: &mut SqlClient) -> (i64, i64) {
        let batches = sql.query("SELECT count(*), sum(v) FROM s").await.expect("count");
        let column = |i: usize| batches[0].column(i).as_any().downcast_ref::<Int64Array>().expect("int").value(0);
        (column(0), column(1))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stream_ended_without_its_commit_marker_is_completed_by_a_retry_with_its_insert_id() {
        let dir = tempfile::tempdir().expect("temp dir");
        let cluster = EmbeddedCluster::start(2, dir.path()).await.expect("cluster");
        let addr = cluster.nodes[0].flight_addr.clone();
        let timeout = Duration::from_secs(10);
        let mut sql = SqlClient::connect(&addr, "default", "", timeout).await.expect("sql");
        sql.query("CREATE TABLE s (id BIGINT, v BIGINT) WITH (shard_key = 'id')").await.expect("create");

        let mut client = connect(&addr, "default", "", timeout).await.expect("connect");
        let error = send_without_marker(&mut client, "cut-1").await;
        assert!(error.contains("ended without its commit marker after 300000 rows"), "{error}");
        assert!(error.contains("--insert-id cut-1"), "{error}");
        // The first segment was complete before the stream ended, so it was stored; the rest
        // (less than a segment) waited for the marker and was not.
        let (stored, _) = count_and_sum(&mut sql).await;
        assert_eq!(stored, shardwise_server::ingest::INGEST_SEGMENT_ROWS as i64);

        let expected = (ROWS, (0..ROWS).map(|i| 2 * i).sum::<i64>());
        for _ in 0..2 {
            let batches = futures::stream::iter(rows().into_iter().map(Ok));
            let (back, inserted) = ingest_with_marker(client, command("cut-1"), batches, ROWS as u64).await;
            client = back;
            assert_eq!(inserted.expect("retry"), ROWS);
            assert_eq!(count_and_sum(&mut sql).await, expected, "every row exactly once");
        }
        cluster.shutdown().await;
    }
}
