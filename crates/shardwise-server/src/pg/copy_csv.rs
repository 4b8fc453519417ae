//! Splits `COPY ... FROM STDIN CSV` data into records of fields that remember whether they were
//! quoted, which PostgreSQL's NULL rule needs and the `csv` crate does not say: an unquoted field
//! equal to the NULL string (empty by default) is NULL, a quoted one never is (`""` is an empty
//! string, `"NA"` the text `NA` under `NULL 'NA'`).
//!
//! The grammar is PostgreSQL's CSV format with its default QUOTE and ESCAPE (`"`, doubled inside a
//! quoted field): fields split by the delimiter, records by `\n` or `\r\n` outside quotes, a quoted
//! field may hold delimiters and newlines. Text after a closing quote up to the next delimiter is
//! kept, as PostgreSQL keeps it. A quote left open at the end of the data is an error naming the
//! line it opened on.

/// One field of a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub text: String,
    /// It began with a quote.
    pub quoted: bool,
}

/// One record: the line it starts on (1-based) and its fields.
pub type Record = (u64, Vec<Field>);

/// The records of `data`; an error (a quote never closed) names its line.
pub fn records(data: &str, delimiter: char) -> Result<Vec<Record>, String> {
    let mut out = Vec::new();
    let (mut line, mut start_line) = (1u64, 1u64);
    let mut fields: Vec<Field> = Vec::new();
    let mut field = Field { text: String::new(), quoted: false };
    // Inside quotes; at the start of a field (a quote there opens one).
    let (mut in_quotes, mut at_start) = (false, true);
    let mut chars = data.chars().peekable();
    while let Some(c) = chars.next() {
        if in_quotes {
            match c {
                '"' if chars.peek() == Some(&'"') => {
                    chars.next();
                    field.text.push('"');
                }
                '"' => in_quotes = false,
                other => {
                    if other == '\n' {
                        line += 1;
                    }
                    field.text.push(other);
                }
            }
            continue;
        }
        match c {
            '"' if at_start => {
                (field.quoted, in_quotes, at_start) = (true, true, false);
            }
            c if c == delimiter => {
                fields.push(std::mem::replace(&mut field, Field { text: String::new(), quoted: false }));
                at_start = true;
            }
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' => {
                fields.push(std::mem::replace(&mut field, Field { text: String::new(), quoted: false }));
                out.push((start_line, std::mem::take(&mut fields)));
                line += 1;
                start_line = line;
                at_start = true;
            }
            other => {
                field.text.push(other);
                at_start = false;
            }
        }
    }
    if in_quotes {
        return Err(format!("line {start_line}: a quoted field is not closed before the end of the data"));
    }
    // A last record without its newline (nothing at all after the last newline is no record).
    if !fields.is_empty() || !field.text.is_empty() || field.quoted {
        fields.push(field);
        out.push((start_line, fields));
    }
    Ok(out)
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
        assert_eq!(texts("a\n\nb"), vec![(1, vec![f("a", false)]), (2, vec![f("", false)]), (3, vec![f("b", false)])]);
        assert_eq!(texts("\"\""), vec![(1, vec![f("", true)])]);
    }

    #[test]
    fn an_open_quote_names_its_line() {
        let err = records("1,a\n2,\"b\n3,c\n", ',').unwrap_err();
        assert_eq!(err, "line 2: a quoted field is not closed before the end of the data");
    }

    #[test]
    fn other_delimiters() {
        let got = records("1|\"a|b\"|c", '|').unwrap();
        assert_eq!(got[0].1.iter().map(|f| f.text.as_str()).collect::<Vec<_>>(), ["1", "a|b", "c"]);
    }
}
