//! The record scanner of the CSV reader: where each record of the file is.
//!
//! It finds the records exactly as `csv_core`, the tokenizer inside Arrow's CSV reader, does with
//! the same (default) settings: each record's bytes, the line it starts on (counted as a text
//! editor counts) and its number of fields. It reads the file a chunk at a time and keeps only the
//! bytes of records not yet handed on ([`Records::take_through`]).
//!
//! The file's first record (the header) is found by `csv_core` itself, which does one thing more
//! at the start of its input: it skips a byte order mark. The rest, most of the file and the one
//! part of reading that cannot be parallel, are found by [`scan_record`], which does only what
//! finding a record needs: it skips quoted fields whole, counts the commas outside them (eight
//! bytes at a time), and stops at the first line break outside them. The tests check it against
//! `csv_core` on every short input over the bytes that matter.

use std::io::Read;

use csv_core::{ReadFieldResult, Reader as Tokenizer};

use crate::load::progress::Progress;

/// Bytes read from the file at a time (more while a record longer than that is incomplete).
const READ_CHUNK_BYTES: usize = 1 << 20;
/// Output buffer of the tokenizer; the scanner only counts fields, so the output is dropped.
const SCRATCH_BYTES: usize = 4096;
/// A UTF-8 byte order mark, skipped at the start of the file.
const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";
/// Bytes [`unquoted_run`] tests at once, as one `u64`.
const WORD_BYTES: usize = 8;

/// One record: its bytes in the buffer (`start..end`, with any blank lines before it; `content`
/// is its first byte), the line it starts on, its number of fields, and whether it may have a
/// quoted field (if not, each field is exactly the bytes between its commas).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub start: usize,
    pub content: usize,
    pub end: usize,
    pub line: u64,
    pub fields: usize,
    pub quoted: bool,
}

impl Record {
    /// The record's bytes from its first field on; `buf` is the buffer its offsets refer to.
    pub fn text<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        &buf[self.content..self.end]
    }

    /// The line of byte `offset` of `buf`, which lies in this record.
    pub fn line_at(&self, buf: &[u8], offset: usize) -> u64 {
        let mut lines = LineCounter::starting_at(self.line);
        lines.advance(&buf[self.content..offset]);
        lines.current()
    }
}

/// The file's bytes, read a chunk at a time, and the records found in them.
pub struct Records<R> {
    input: R,
    /// Bytes from the first record not yet handed on to the last byte read.
    buf: Vec<u8>,
    /// How much of `buf` holds found records.
    scanned: usize,
    eof: bool,
    bom_checked: bool,
    /// Whether the first record has been found (by `csv_core`; the rest by [`scan_record`]).
    first_found: bool,
    tokenizer: Tokenizer,
    scratch: Vec<u8>,
    fields: usize,
    lines: LineCounter,
    /// Whether a blank line after the header is a record (one empty field), as in a file of one
    /// column, where it is how a NULL is written; otherwise blank lines are skipped.
    blank_lines_are_records: bool,
    /// Whether the last record found ended in `\r`: a `\n` right after it ends the same line.
    after_cr: bool,
}

impl<R: Read> Records<R> {
    pub fn new(input: R) -> Self {
        Records {
            input,
            buf: Vec::new(),
            scanned: 0,
            eof: false,
            bom_checked: false,
            first_found: false,
            tokenizer: Tokenizer::new(),
            scratch: vec![0; SCRATCH_BYTES],
            fields: 0,
            lines: LineCounter::starting_at(1),
            blank_lines_are_records: false,
            after_cr: false,
        }
    }

    /// From now on a blank line is a record with one empty field (for a file of one column:
    /// PostgreSQL's `COPY` reads a NULL there, and shardwise's CSV answers write one so).
    pub fn keep_blank_lines(&mut self) {
        self.blank_lines_are_records = true;
    }

    /// The next record, or `None` at the end of the file.
    pub fn next(&mut self, progress: &Progress) -> std::io::Result<Option<Record>> {
        if !self.first_found {
            self.first_found = true;
            return self.next_tokenized(progress);
        }
        loop {
            let from = self.scanned;
            let scan = match self.blank_lines_are_records {
                true => scan_line(&self.buf, from, self.eof, self.after_cr),
                false => scan_record(&self.buf, from, self.eof),
            };
            match scan {
                Scan::Record { content, end, fields, quoted } => {
                    return Ok(Some(self.finish_record(self.scanned, content, end, fields, quoted)));
                }
                Scan::End => return Ok(None),
                // At least as much again as the incomplete record, so a long one is rescanned
                // a logarithmic number of times.
                Scan::Incomplete => self.fill(READ_CHUNK_BYTES.max(self.buf.len() - self.scanned), progress)?,
            }
        }
    }

    /// The next record as `csv_core` finds it, field by field.
    fn next_tokenized(&mut self, progress: &Progress) -> std::io::Result<Option<Record>> {
        let start = self.scanned;
        loop {
            if (self.scanned == self.buf.len() || !self.bom_checked) && !self.eof {
                self.fill(READ_CHUNK_BYTES, progress)?;
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
                        let end = self.scanned;
                        let blank = self.buf[start..end].iter().take_while(|&&b| is_line_break(b)).count();
                        let fields = std::mem::take(&mut self.fields);
                        return Ok(Some(self.finish_record(start, start + blank, end, fields, true)));
                    }
                }
                ReadFieldResult::End => return Ok(None),
            }
        }
    }

    /// The record from `start` (blank lines) and `content` (its first field) to `end`. Only a
    /// record with a `quoted` field can have a line break before its last byte.
    fn finish_record(&mut self, start: usize, content: usize, end: usize, fields: usize, quoted: bool) -> Record {
        self.lines.advance(&self.buf[start..content]);
        let line = self.lines.current();
        if quoted {
            self.lines.advance(&self.buf[content..end]);
        } else {
            self.lines.advance_text();
            self.lines.advance(&self.buf[end - 1..end]);
        }
        self.scanned = end;
        self.after_cr = self.buf[end - 1] == b'\r';
        Record { start, content, end, line, fields, quoted }
    }

    /// Reads up to `want` more bytes; fewer only at the end of the file.
    fn fill(&mut self, want: usize, progress: &Progress) -> std::io::Result<()> {
        self.buf.reserve(want);
        // Reads into the spare capacity, which is not zeroed first.
        let read = (&mut self.input).take(want as u64).read_to_end(&mut self.buf)?;
        self.eof = read < want;
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
    /// The bytes the records' offsets refer to.
    pub fn buf(&self) -> &[u8] {
        &self.buf
    }

    /// Hands over the bytes before `end` (the records found up to there) and keeps the rest; the
    /// offsets of records found later are counted from `end`.
    pub fn take_through(&mut self, end: usize) -> Vec<u8> {
        self.scanned -= end;
        if self.buf.len() - end <= end {
            // Usually: the rest is the smaller part, so it moves to a buffer of the same room.
            let mut rest = Vec::with_capacity(self.buf.capacity());
            rest.extend_from_slice(&self.buf[end..]);
            self.buf.truncate(end);
            std::mem::replace(&mut self.buf, rest)
        } else {
            let taken = self.buf[..end].to_vec();
            self.buf.drain(..end);
            taken
        }
    }
}

/// What [`scan_record`] found.
#[derive(Debug, PartialEq, Eq)]
enum Scan {
    /// A record: first field at `content`, up to `end` (after its line break, if it has one).
    Record { content: usize, end: usize, fields: usize, quoted: bool },
    /// Only blank lines (or nothing) before the end of the file.
    End,
    /// The record may go on past the bytes read so far.
    Incomplete,
}

/// Finds the record at `from` in `buf` as `csv_core` would, between records: blank lines are
/// skipped; a field that starts with `"` is quoted, up to a `"` not followed by another (`""` is a
/// quote in the value; a quote elsewhere is a plain byte); a comma outside quotes ends a field,
/// and a line break (`\r` or `\n`) outside quotes ends the record, which also ends at the end of
/// the file (`eof`), inside a quoted field or not.
fn scan_record(buf: &[u8], from: usize, eof: bool) -> Scan {
    let content = from + buf[from..].iter().take_while(|&&b| is_line_break(b)).count();
    if content == buf.len() {
        return if eof { Scan::End } else { Scan::Incomplete };
    }
    let (mut fields, mut at, mut quoted) = (1, content, false);
    loop {
        let (run, commas) = unquoted_run(&buf[at..]);
        fields += commas;
        at += run;
        let Some(&byte) = buf.get(at) else {
            return if eof { Scan::Record { content, end: at, fields, quoted } } else { Scan::Incomplete };
        };
        if byte != b'"' {
            return Scan::Record { content, end: at + 1, fields, quoted };
        }
        if at != content && buf[at - 1] != b',' {
            at += 1;
            continue;
        }
        quoted = true;
        match closing_quote(buf, at + 1, eof) {
            Some(close) => at = close + 1,
            None if eof => return Scan::Record { content, end: buf.len(), fields, quoted },
            None => return Scan::Incomplete,
        }
    }
}

/// [`scan_record`] where a blank line is a record of one empty field: a `\r\n` is one line
/// break, also when the `\r` ended the record before (`after_cr`).
fn scan_line(buf: &[u8], from: usize, eof: bool, after_cr: bool) -> Scan {
    let content = from + usize::from(after_cr && buf.get(from) == Some(&b'\n'));
    match buf.get(content) {
        None if eof => Scan::End,
        None => Scan::Incomplete,
        Some(&b) if is_line_break(b) => Scan::Record { content, end: content + 1, fields: 1, quoted: false },
        Some(_) => scan_record(buf, content, eof),
    }
}

/// What is wrong with a record's quotes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuoteError {
    /// The quoted field opening at this offset is never closed: its record runs to the end of
    /// the file, taking every line after the quote into that field.
    Unclosed(usize),
    /// Text follows the quote that closes a quoted field (at this offset, the byte after it), as
    /// in `"ab"c`: `csv_core` would read `abc`, DuckDB refuses it, and so does load.
    TextAfterClosingQuote(usize),
}

/// The first quoting error of `record` (one record's bytes, as found), if any: a quoted field
/// must be closed and then followed by a comma, a line break or the end of the record.
pub fn quote_error(record: &[u8]) -> Option<QuoteError> {
    let mut at = 0;
    loop {
        at += unquoted_run(&record[at..]).0;
        if record.get(at) != Some(&b'"') {
            return None; // the end of the record: a line break or its last byte
        }
        if at != 0 && record[at - 1] != b',' {
            at += 1; // a quote inside an unquoted field is a plain byte
            continue;
        }
        match closing_quote(record, at + 1, true) {
            Some(close) => match record.get(close + 1) {
                None | Some(b',' | b'\r' | b'\n') => at = close + 1,
                Some(_) => return Some(QuoteError::TextAfterClosingQuote(close + 1)),
            },
            None => return Some(QuoteError::Unclosed(at)),
        }
    }
}

/// The length of `bytes` before the first quote or line break, and the commas in it.
fn unquoted_run(bytes: &[u8]) -> (usize, usize) {
    let mut commas = 0;
    let mut words = bytes.chunks_exact(WORD_BYTES);
    for (index, word) in words.by_ref().enumerate() {
        let word = u64::from_le_bytes(word.try_into().unwrap_or_default());
        let (comma_bytes, stop_bytes) = (bytes_equal(word, b','), stop_bytes(word));
        if stop_bytes != 0 {
            // The first stop is the lowest byte: commas in the bytes below it.
            let below = (1u64 << stop_bytes.trailing_zeros()) - 1;
            let first = stop_bytes.trailing_zeros() as usize / 8;
            return (index * WORD_BYTES + first, commas + count_bytes(comma_bytes & below));
        }
        commas += count_bytes(comma_bytes);
    }
    let at = bytes.len() - words.remainder().len();
    for (index, &b) in words.remainder().iter().enumerate() {
        if b == b'"' || is_line_break(b) {
            return (at + index, commas);
        }
        commas += usize::from(b == b',');
    }
    (bytes.len(), commas)
}

/// The high bit of each byte of `word` (eight bytes, little-endian) that is `byte`, exactly: no
/// carry crosses from one byte to the next.
fn bytes_equal(word: u64, byte: u8) -> u64 {
    const ONES: u64 = u64::from_le_bytes([1; WORD_BYTES]);
    const LOW_BITS: u64 = u64::from_le_bytes([0x7F; WORD_BYTES]);
    let zero_where_equal = word ^ (ONES * u64::from(byte));
    !(((zero_where_equal & LOW_BITS) + LOW_BITS) | zero_where_equal | LOW_BITS)
}

/// [`bytes_equal`] for the bytes that stop an unquoted run: a quote or a line break.
fn stop_bytes(word: u64) -> u64 {
    bytes_equal(word, b'"') | bytes_equal(word, b'\r') | bytes_equal(word, b'\n')
}

/// The number of bytes a [`bytes_equal`] result marks.
fn count_bytes(marked: u64) -> usize {
    const ONES: u64 = u64::from_le_bytes([1; WORD_BYTES]);
    // Each byte 0 or 1; the multiplication sums them into the top byte.
    ((marked >> 7).wrapping_mul(ONES) >> 56) as usize
}

/// The quote at or after `from` that closes a quoted field: one not followed by another quote.
/// `None` when `buf` ends first (with a quote only the next byte can tell about, unless `eof`).
fn closing_quote(buf: &[u8], from: usize, eof: bool) -> Option<usize> {
    let mut at = from;
    loop {
        let quote = at + buf[at..].iter().position(|&b| b == b'"')?;
        match buf.get(quote + 1) {
            Some(b'"') => at = quote + 2,
            Some(_) => return Some(quote),
            None => return eof.then_some(quote),
        }
    }
}

fn is_line_break(b: u8) -> bool {
    b == b'\r' || b == b'\n'
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
                self.advance_text();
                self.after_cr = b == b'\r';
            }
        }
    }

    /// Past bytes that are not line breaks (at least one).
    fn advance_text(&mut self) {
        self.line += u64::from(self.after_cr);
        self.after_cr = false;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every record of `text`, found by the scanner, or by `csv_core` alone when `tokenized`;
    /// `quoted` is left out (`csv_core` does not say).
    fn records(text: &[u8], tokenized: bool) -> Vec<Record> {
        let mut found = records_quoted(text, tokenized);
        for record in &mut found {
            record.quoted = false;
        }
        found
    }

    fn records_quoted(text: &[u8], tokenized: bool) -> Vec<Record> {
        let (mut records, progress) = (Records::new(text), Progress::hidden());
        let mut found = Vec::new();
        loop {
            let next = if tokenized { records.next_tokenized(&progress) } else { records.next(&progress) };
            match next.expect("reading a slice") {
                Some(record) => found.push(record),
                None => return found,
            }
        }
    }

    /// Checks the scanner against `csv_core` on `body` after a first record ending in `\n` or
    /// `\r` (after which `csv_core` is in different states), and on each prefix of `body`, that
    /// it either asks for more bytes or finds what it finds with all of them.
    fn check(body: &[u8]) {
        for first in [&b"h\n"[..], b"h\r"] {
            let text = [first, body].concat();
            assert_eq!(records(&text, false), records(&text, true), "{:?}", String::from_utf8_lossy(&text));
            // A record the scanner finds unquoted has no quote at the start of a field.
            for record in records_quoted(&text, false).iter().filter(|r| !r.quoted) {
                let fields = split_fields(record.text(&text));
                assert!(fields.iter().all(|f| record.text(&text).get(f.start) != Some(&b'"')), "{text:?}");
            }
        }
        let whole = scan_record(body, 0, true);
        for cut in 0..body.len() {
            let partial = scan_record(&body[..cut], 0, false);
            assert!(partial == Scan::Incomplete || partial == whole, "{body:?} cut at {cut}: {partial:?} {whole:?}");
        }
    }

    #[test]
    fn finds_records_exactly_as_csv_core_on_every_short_input() {
        let alphabet = b"a,\"\r\n";
        for length in 0..=6u32 {
            for mut n in 0..alphabet.len().pow(length) {
                let mut body = Vec::new();
                for _ in 0..length {
                    body.push(alphabet[n % alphabet.len()]);
                    n /= alphabet.len();
                }
                check(&body);
            }
        }
    }

    #[test]
    fn finds_records_exactly_as_csv_core_on_longer_inputs() {
        // Long runs (past the scanner's blocks) of a few bytes, with the special ones rarer.
        let alphabet = b"abcdefgh,,,\"\r\n\xff";
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..3000 {
            let mut body = Vec::new();
            for _ in 0..state % 90 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                body.push(alphabet[(state % alphabet.len() as u64) as usize]);
            }
            check(&body);
        }
    }

    #[test]
    fn records_across_read_chunks() {
        // A quoted field with escaped quotes and line breaks longer than several read chunks.
        let big = "x\"\"\r\n".repeat(READ_CHUNK_BYTES);
        let text = format!("h\n1,2\n\"{big}\",3\n\"a\"b\"c,\r\n\n\r4,\"\"");
        let found = records(text.as_bytes(), false);
        assert_eq!(found, records(text.as_bytes(), true));
        assert_eq!(
            found.iter().map(|r| (r.line, r.fields)).collect::<Vec<_>>(),
            [(1, 1), (2, 2), (3, 2), (4 + READ_CHUNK_BYTES as u64, 2), (7 + READ_CHUNK_BYTES as u64, 2)]
        );
    }

    #[test]
    fn quote_errors_are_found() {
        use QuoteError::{TextAfterClosingQuote as After, Unclosed};
        for (record, expected) in [
            (&b"1,\"abc\n2,x\n"[..], Some(Unclosed(2))),
            (b"\"a", Some(Unclosed(0))),
            (b"1,\"ab\"\"", Some(Unclosed(2))),
            (b"1,\"a\",\"b", Some(Unclosed(6))),
            (b"\"ab\"c,1\n", Some(After(4))),
            (b"1,\"a\"\"b\"x", Some(After(8))),
            (b"1,\"a\" ,2", Some(After(5))),
            (b"\"a\"\"\"b", Some(After(5))),
            (b"\"a\"\"\"\"b", Some(Unclosed(0))),
            (b"1,\"a\"\n", None),
            (b"1,\"a\"\r\n", None),
            (b"1,\"a\"", None),
            (b"\"a\",\"b\"", None),
            (b"1,\"a\"\"b\",2\n", None),
            (b"1,a\"b\n", None),
            (b"1,a\"b\"c", None),
            (b"\"\"", None),
            (b"", None),
        ] {
            assert_eq!(quote_error(record), expected, "{:?}", String::from_utf8_lossy(record));
        }
        // As the scanner finds them: an unclosed quote takes the rest of the file into its record.
        let text = b"h,i\n1,\"a\n2,b\n";
        let found = records(text, false);
        assert_eq!(found.len(), 2);
        assert_eq!(quote_error(found[1].text(text)), Some(Unclosed(2)));
    }

    /// The records after a one-column header `h`, blank lines kept: (line, text) of each.
    fn lines_kept(text: &[u8]) -> Vec<(u64, String)> {
        let (mut records, progress) = (Records::new(text), Progress::hidden());
        let header = records.next(&progress).expect("read").expect("header");
        records.take_through(header.end);
        records.keep_blank_lines();
        let mut found = Vec::new();
        while let Some(record) = records.next(&progress).expect("read") {
            found.push((record.line, String::from_utf8_lossy(record.text(records.buf())).into_owned()));
        }
        found
    }

    #[test]
    fn blank_lines_are_records_when_kept() {
        let t = |line: u64, text: &str| (line, text.to_string());
        assert_eq!(lines_kept(b"h\n1\n\n2\n"), [t(2, "1\n"), t(3, "\n"), t(4, "2\n")]);
        // `\r\n` is one line break, also right after the header and across read chunks.
        assert_eq!(lines_kept(b"h\r\n\r\n1\r\n\r\n"), [t(2, "\r"), t(3, "1\r"), t(4, "\r")]);
        // A lone `\r` ends a line, as `\n` does; `\n\r` is two.
        assert_eq!(lines_kept(b"h\n\r\n\r2"), [t(2, "\r"), t(3, "\r"), t(4, "2")]);
        assert_eq!(lines_kept(b"h\n\"a\n\n\"\n\n"), [t(2, "\"a\n\n\"\n"), t(5, "\n")]);
        assert_eq!(lines_kept(b"h\n"), []);
        assert_eq!(lines_kept(b"h"), []);
        let long = format!("h\r\n{}\r\n\r\n", "x".repeat(READ_CHUNK_BYTES - 4));
        let found = lines_kept(long.as_bytes());
        assert_eq!((found.len(), found[1].clone()), (2, t(3, "\r")));
    }

    #[test]
    fn taking_records_keeps_the_rest() {
        let text = b"h\na,1\nb,2\nc,3\n";
        let (mut records, progress) = (Records::new(&text[..]), Progress::hidden());
        let header = records.next(&progress).expect("read").expect("header");
        assert_eq!(records.take_through(header.end), b"h\n");
        let first = records.next(&progress).expect("read").expect("a record");
        assert_eq!(first.text(records.buf()), b"a,1\n");
        assert_eq!(records.take_through(first.end), b"a,1\n");
        let (b, c) =
            (records.next(&progress).expect("read").expect("b"), records.next(&progress).expect("read").expect("c"));
        let taken = records.take_through(c.end);
        assert_eq!((b.text(&taken), c.text(&taken), c.line), (&b"b,2\n"[..], &b"c,3\n"[..], 4));
        assert_eq!(records.next(&progress).expect("read"), None);
    }
}
