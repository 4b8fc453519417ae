//! Splits `COPY ... FROM STDIN CSV` data into records of fields that remember whether they were
//! quoted, which PostgreSQL's NULL rule needs: an unquoted field equal to the NULL string (empty
//! by default) is NULL, a quoted one never is (`""` is an empty string, `"NA"` the text `NA`
//! under `NULL 'NA'`).
//!
//! The fields are `csv_core`'s (the tokenizer under the `csv` crate and Arrow's CSV reader, which
//! `shardwise load` uses too), with PostgreSQL's default QUOTE and ESCAPE (`"`, doubled inside a
//! quoted field); `csv_core` does not say whether a field was quoted, so the field's first byte
//! in the input does. A blank line is a record of one empty unquoted field, as PostgreSQL reads
//! it (a NULL in a table of one column, "missing data" in a wider one). A quote left open swallows
//! the rest of the data: the last field then holds an odd number of quote characters, and the error names the line the
//! record starts on.

use csv_core::{ReadFieldResult, ReaderBuilder};

/// One field of a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub text: String,
    /// It began with a quote.
    pub quoted: bool,
}

/// One record: the line it starts on (1-based) and its fields.
pub type Record = (u64, Vec<Field>);

/// The records of `data`; an error (a quote never closed, a delimiter that is not one byte) names
/// what is wrong.
pub fn records(data: &str, delimiter: char) -> Result<Vec<Record>, String> {
    // One byte of UTF-8: an ASCII character (`'é'` would pass as a `u8` and match half of it).
    let delimiter = match delimiter.is_ascii() {
        true => delimiter as u8,
        false => return Err(format!("delimiter {delimiter:?}: CSV takes a one-byte delimiter")),
    };
    let input = data.as_bytes();
    let mut tokenizer = ReaderBuilder::new().delimiter(delimiter).build();
    let (mut out, mut records, mut fields) = (Vec::new(), Vec::new(), Vec::new());
    let mut value = vec![0u8; input.len().max(1)];
    let (mut pos, mut field_start, mut line_of) = (0usize, 0usize, LineCounter::default());
    let mut record_line = 1;
    loop {
        // The whole input at once; once it is used up, an empty input marks its end.
        let (result, consumed, written) = tokenizer.read_field(&input[pos..], &mut value);
        out.extend_from_slice(&value[..written]);
        pos += consumed;
        match result {
            ReadFieldResult::InputEmpty => {}
            // A field longer than the buffer continues into a larger one.
            ReadFieldResult::OutputFull => value.resize(value.len() * 2, 0),
            ReadFieldResult::Field { record_end } => {
                // The field starts after any blank lines csv_core skipped before its record.
                let start = if fields.is_empty() { skip_blank_lines(input, field_start) } else { field_start };
                if fields.is_empty() {
                    push_blank_lines(input, field_start, start, &mut line_of, &mut records);
                    record_line = line_of.line(input, start);
                }
                let quoted = input.get(start) == Some(&b'"');
                if pos == input.len() && quoted && input[start..pos].iter().filter(|&&b| b == b'"').count() % 2 == 1 {
                    return Err(format!("line {record_line}: a quoted field is not closed before the end of the data"));
                }
                let text = String::from_utf8(std::mem::take(&mut out)).map_err(|e| format!("not UTF-8: {e}"))?;
                fields.push(Field { text, quoted });
                field_start = pos;
                if record_end {
                    records.push((record_line, std::mem::take(&mut fields)));
                }
            }
            ReadFieldResult::End => {
                push_blank_lines(input, field_start, input.len(), &mut line_of, &mut records);
                return Ok(records);
            }
        }
    }
}

/// `at` moved past any line breaks (the blank lines before a record).
fn skip_blank_lines(input: &[u8], mut at: usize) -> usize {
    while matches!(input.get(at), Some(b'\n' | b'\r')) {
        at += 1;
    }
    at
}

/// A record of one empty unquoted field for each blank line in `input[from..to]` (only line
/// breaks). A `\n` right after the `\r` that ended the record before ends the same line.
fn push_blank_lines(input: &[u8], from: usize, to: usize, line_of: &mut LineCounter, records: &mut Vec<Record>) {
    let mut at = from;
    if at > 0 && input.get(at - 1) == Some(&b'\r') && input.get(at) == Some(&b'\n') {
        at += 1;
    }
    while at < to {
        let line = line_of.line(input, at);
        records.push((line, vec![Field { text: String::new(), quoted: false }]));
        at += if input[at] == b'\r' && input.get(at + 1) == Some(&b'\n') { 2 } else { 1 };
    }
}

/// Line numbers of byte offsets, for offsets that only grow.
#[derive(Default)]
struct LineCounter {
    offset: usize,
    newlines: u64,
}

impl LineCounter {
    /// The 1-based line of `input[at]`.
    fn line(&mut self, input: &[u8], at: usize) -> u64 {
        let at = at.min(input.len());
        if at > self.offset {
            self.newlines += input[self.offset..at].iter().filter(|&&b| b == b'\n').count() as u64;
            self.offset = at;
        }
        self.newlines + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(data: &str) -> Vec<(u64, Vec<(String, bool)>)> {
        records(data, ',')
            .unwrap()
            .into_iter()
            .map(|(line, fields)| (line, fields.into_iter().map(|f| (f.text, f.quoted)).collect()))
            .collect()
    }

    fn f(text: &str, quoted: bool) -> (String, bool) {
        (text.to_string(), quoted)
    }

    #[test]
    fn quoted_fields_keep_delimiters_quotes_and_newlines() {
        let got = texts("1,\"a,b\",\"say \"\"hi\"\"\"\r\n2,\"two\nlines\",x\n3,,\"\"");
        assert_eq!(
            got,
            vec![
                (1, vec![f("1", false), f("a,b", true), f("say \"hi\"", true)]),
                (2, vec![f("2", false), f("two\nlines", true), f("x", false)]),
                (4, vec![f("3", false), f("", false), f("", true)]),
            ]
        );
    }

    #[test]
    fn empty_lines_and_the_end_of_data() {
        assert_eq!(texts(""), Vec::<(u64, Vec<(String, bool)>)>::new());
        assert_eq!(texts("a\n"), vec![(1, vec![f("a", false)])]);
        // A blank line is a record of one empty unquoted field, as in PostgreSQL.
        assert_eq!(texts("a\n\nb"), vec![(1, vec![f("a", false)]), (2, vec![f("", false)]), (3, vec![f("b", false)])]);
        let blank = |line| (line, vec![f("", false)]);
        assert_eq!(texts("a\r\n\r\n\r\n"), vec![(1, vec![f("a", false)]), blank(2), blank(3)]);
        assert_eq!(texts("\n\"x\"\n\n"), vec![blank(1), (2, vec![f("x", true)]), blank(3)]);
        assert_eq!(texts("a\n"), vec![(1, vec![f("a", false)])]);
        assert_eq!(texts("\"\""), vec![(1, vec![f("", true)])]);
    }

    #[test]
    fn an_open_quote_names_its_line() {
        let err = records("1,a\n2,\"b\n3,c\n", ',').unwrap_err();
        assert_eq!(err, "line 2: a quoted field is not closed before the end of the data");
        // Text after a closing quote is kept (as PostgreSQL keeps it); a quote after that opens
        // another, which PostgreSQL also reports unterminated.
        assert_eq!(texts("\"ab\"c,d"), vec![(1, vec![f("abc", true), f("d", false)])]);
        assert!(records("x,\"ab\"c\"\n", ',').is_err());
        assert!(records("1,2", 'é').unwrap_err().contains("one-byte delimiter"));
    }

    #[test]
    fn other_delimiters() {
        let got = records("1|\"a|b\"|c", '|').unwrap();
        assert_eq!(got[0].1.iter().map(|f| f.text.as_str()).collect::<Vec<_>>(), ["1", "a|b", "c"]);
    }
}
