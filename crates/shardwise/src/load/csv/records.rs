//! The record scanner of the CSV reader: where each record of the file is.
//!
//! `csv_core` is the tokenizer inside Arrow's CSV reader; run here with the same (default)
//! settings over the same bytes, it finds the records exactly as Arrow will: each record's bytes,
//! the line it starts on (counted as a text editor counts) and its number of fields. It reads the
//! file a chunk at a time and keeps only the bytes of records not yet decoded.

use std::io::Read;

use csv_core::{ReadFieldResult, Reader as Tokenizer};

use crate::load::progress::Progress;

/// Bytes read from the file at a time.
const READ_CHUNK_BYTES: usize = 1 << 20;
/// Output buffer of the tokenizer; the scanner only counts fields, so the output is dropped.
const SCRATCH_BYTES: usize = 4096;
/// A UTF-8 byte order mark, skipped at the start of the file.
const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// One record: its bytes in the buffer (`start..end`, with any blank lines before it; `content`
/// is its first byte), the line it starts on and its number of fields.
#[derive(Debug, Clone, Copy)]
pub struct Record {
    pub start: usize,
    pub content: usize,
    pub end: usize,
    pub line: u64,
    pub fields: usize,
}

/// The file's bytes, read a chunk at a time, and the records found in them.
pub struct Records<R> {
    input: R,
    /// Bytes from the first record not yet decoded to the last byte read.
    pub buf: Vec<u8>,
    /// How much of `buf` the tokenizer has consumed.
    scanned: usize,
    eof: bool,
    bom_checked: bool,
    tokenizer: Tokenizer,
    scratch: Vec<u8>,
    fields: usize,
    lines: LineCounter,
}

impl<R: Read> Records<R> {
    pub fn new(input: R) -> Self {
        Records {
            input,
            buf: Vec::new(),
            scanned: 0,
            eof: false,
            bom_checked: false,
            tokenizer: Tokenizer::new(),
            scratch: vec![0; SCRATCH_BYTES],
            fields: 0,
            lines: LineCounter::starting_at(1),
        }
    }

    /// The next record, or `None` at the end of the file.
    pub fn next(&mut self, progress: &Progress) -> std::io::Result<Option<Record>> {
        let start = self.scanned;
        loop {
            if (self.scanned == self.buf.len() || !self.bom_checked) && !self.eof {
                self.fill(progress)?;
                continue;
            }
            // Empty input (only at the end of the file, by the fill above) tells the tokenizer so.
            let at_end = self.scanned == self.buf.len();
            let (result, consumed, _) = self.tokenizer.read_field(&self.buf[self.scanned..], &mut self.scratch);
            self.scanned += consumed;
            match result {
                // Not expected after the end was signalled; stops rather than asks again.
                ReadFieldResult::InputEmpty if at_end => return Ok(None),
                ReadFieldResult::InputEmpty | ReadFieldResult::OutputFull => {}
                ReadFieldResult::Field { record_end } => {
                    self.fields += 1;
                    if record_end {
                        return Ok(Some(self.finish_record(start)));
                    }
                }
                ReadFieldResult::End => return Ok(None),
            }
        }
    }

    fn finish_record(&mut self, start: usize) -> Record {
        let bytes = &self.buf[start..self.scanned];
        let blank = bytes.iter().take_while(|&&b| b == b'\r' || b == b'\n').count();
        self.lines.advance(&bytes[..blank]);
        let line = self.lines.current();
        self.lines.advance(&bytes[blank..]);
        let fields = std::mem::take(&mut self.fields);
        Record { start, content: start + blank, end: self.scanned, line, fields }
    }

    fn fill(&mut self, progress: &Progress) -> std::io::Result<()> {
        let old = self.buf.len();
        self.buf.resize(old + READ_CHUNK_BYTES, 0);
        let read = loop {
            match self.input.read(&mut self.buf[old..]) {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.buf.truncate(old);
                    return Err(e);
                }
            }
        };
        self.buf.truncate(old + read);
        self.eof = read == 0;
        progress.advance(read as u64, 0);
        if !self.bom_checked && (self.buf.len() >= UTF8_BOM.len() || self.eof) {
            self.bom_checked = true;
            if self.buf.starts_with(UTF8_BOM) {
                self.buf.drain(..UTF8_BOM.len());
            }
        }
        Ok(())
    }
}

impl<R> Records<R> {
    /// Drops the bytes before `end` (decoded records); later offsets move down by `end`.
    pub fn discard_through(&mut self, end: usize) {
        self.buf.drain(..end);
        self.scanned -= end;
    }

    /// The line of byte `offset`, which lies in `record`.
    pub fn line_at(&self, record: &Record, offset: usize) -> u64 {
        let mut lines = LineCounter::starting_at(record.line);
        lines.advance(&self.buf[record.content..offset]);
        lines.current()
    }

    /// The record's bytes from its first field on.
    pub fn record_bytes(&self, record: &Record) -> &[u8] {
        &self.buf[record.content..record.end]
    }
}

/// Counts lines as a text editor does: `\n`, `\r\n` and a lone `\r` each end one.
#[derive(Debug, Clone, Copy)]
struct LineCounter {
    line: u64,
    after_cr: bool,
}

impl LineCounter {
    fn starting_at(line: u64) -> Self {
        LineCounter { line, after_cr: false }
    }

    fn advance(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if b == b'\n' {
                self.line += 1;
                self.after_cr = false;
            } else {
                self.line += u64::from(self.after_cr);
                self.after_cr = b == b'\r';
            }
        }
    }

    /// The line the next byte is on.
    fn current(&self) -> u64 {
        self.line + u64::from(self.after_cr)
    }
}

/// One field of a record: where it starts in the record's bytes, and its unquoted value.
pub struct RawField {
    pub start: usize,
    pub value: Vec<u8>,
}

/// Splits one record's bytes into fields with the tokenizer (for the header and for errors).
pub fn split_fields(record: &[u8]) -> Vec<RawField> {
    let mut tokenizer = Tokenizer::new();
    let mut out = [0u8; SCRATCH_BYTES];
    let (mut fields, mut value, mut pos, mut start) = (Vec::new(), Vec::new(), 0, 0);
    loop {
        let (result, consumed, written) = tokenizer.read_field(&record[pos..], &mut out);
        value.extend_from_slice(&out[..written]);
        pos += consumed;
        match result {
            ReadFieldResult::InputEmpty | ReadFieldResult::OutputFull => {}
            ReadFieldResult::Field { record_end } => {
                fields.push(RawField { start, value: std::mem::take(&mut value) });
                start = pos;
                if record_end {
                    return fields;
                }
            }
            ReadFieldResult::End => return fields,
        }
    }
}
