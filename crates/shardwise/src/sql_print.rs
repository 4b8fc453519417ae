//! Printing a statement's result as it arrives. CSV, JSON lines and Arrow IPC are written batch by
//! batch, so `shardwise sql --format csv -e 'SELECT ...' > file` holds one batch at a time, not
//! the whole answer, and a reader that stops (`| head`) ends the query: the failed write drops
//! the stream, which cancels it on the server. A table needs every row for its column widths,
//! so it is printed at the end.

use std::io::Write;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow::ipc::writer::StreamWriter;
use arrow_flight::FlightInfo;
use arrow_flight::sql::client::FlightSqlServiceClient;
use tonic::transport::Channel;

use shardwise_server::csv_text::TextFormat;

use crate::cmd_sql::{OutputFormat, fetch, fetch_each, render};

/// Prints the rows `info` points at in `format`; returns how many there were.
pub(crate) async fn print_result(
    client: &mut FlightSqlServiceClient<Channel>,
    info: FlightInfo,
    format: OutputFormat,
) -> Result<usize, String> {
    if format == OutputFormat::Table {
        let (schema, batches) = fetch(client, info).await?;
        let mut out = Vec::new();
        render(&schema, &batches, format, &mut out).map_err(|e| e.to_string())?;
        write_out(&out)?;
        return Ok(batches.iter().map(RecordBatch::num_rows).sum());
    }
    let mut printer = Printer { format, started: None, arrow: None, rows: 0 };
    let schema = fetch_each(client, info, |batch| printer.batch(&batch)).await?;
    // A result without rows still prints its header.
    printer.start(&schema)?;
    printer.finish()
}

/// The state of one result being printed.
struct Printer {
    format: OutputFormat,
    /// The result's columns, once known (its header is printed then).
    started: Option<SchemaRef>,
    /// The Arrow IPC stream's writer, over a buffer emptied to standard output after each write.
    arrow: Option<StreamWriter<Vec<u8>>>,
    rows: usize,
}

impl Printer {
    /// Prints what comes before the rows (a CSV or TabSeparated header, an Arrow stream's
    /// schema), once.
    fn start(&mut self, schema: &SchemaRef) -> Result<(), String> {
        if self.started.is_some() {
            return Ok(());
        }
        self.started = Some(schema.clone());
        if schema.fields().is_empty() {
            return Ok(());
        }
        match self.format {
            OutputFormat::Csv | OutputFormat::Tsv => {
                let mut out = Vec::new();
                let text = self.format.text().map_or(TextFormat::Csv, |(text, _)| text);
                shardwise_server::csv_text::write_header_as(text, schema, &mut out);
                write_out(&out)
            }
            OutputFormat::ArrowStream => {
                let writer = StreamWriter::try_new(Vec::new(), schema).map_err(|e| e.to_string())?;
                self.arrow = Some(writer);
                self.flush_arrow()
            }
            _ => Ok(()),
        }
    }

    fn batch(&mut self, batch: &RecordBatch) -> Result<(), String> {
        self.start(&batch.schema())?;
        self.rows += batch.num_rows();
        let Some(schema) = self.started.clone().filter(|s| !s.fields().is_empty()) else {
            return Ok(());
        };
        match self.format {
            OutputFormat::ArrowStream => {
                if let Some(writer) = self.arrow.as_mut() {
                    writer.write(batch).map_err(|e| e.to_string())?;
                }
                self.flush_arrow()
            }
            format => {
                let rows_only = match format {
                    OutputFormat::Csv => OutputFormat::CsvNoHeader,
                    OutputFormat::Tsv => OutputFormat::TsvNoHeader,
                    other => other,
                };
                let mut out = Vec::new();
                render(&schema, std::slice::from_ref(batch), rows_only, &mut out).map_err(|e| e.to_string())?;
                write_out(&out)
            }
        }
    }

    fn finish(mut self) -> Result<usize, String> {
        if let Some(mut writer) = self.arrow.take() {
            writer.finish().map_err(|e| e.to_string())?;
            write_out(writer.get_ref())?;
        }
        Ok(self.rows)
    }

    /// Writes what the Arrow writer has buffered, and empties its buffer.
    fn flush_arrow(&mut self) -> Result<(), String> {
        match self.arrow.as_mut() {
            Some(writer) => {
                let bytes = std::mem::take(writer.get_mut());
                write_out(&bytes)
            }
            None => Ok(()),
        }
    }
}

fn write_out(bytes: &[u8]) -> Result<(), String> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(bytes).and_then(|()| stdout.flush()).map_err(|e| format!("cannot write the result: {e}"))
}
