//! CSV: types, header matching, NULLs, line counting, and every malformed input.

use super::*;

#[test]
fn reads_every_supported_type() {
    let text = "\
i8,i16,i32,i64,u8,u16,u32,u64,f32,f64,dec,ok,s,day,ts_us,ts_ns,ts_us_utc,ts_ns_utc
-128,-32768,-2147483648,-9223372036854775808,0,0,0,0,1.5,-2.25,-12345678.91,true,\"a, \"\"quoted\"\" one\",2024-02-29,2024-01-31 12:00:00.123456,2024-01-31T12:00:00.123456789,2024-01-31T12:00:00Z,2024-01-31T14:00:00+02:00
127,32767,2147483647,9223372036854775807,255,65535,4294967295,18446744073709551615,3.4e38,1e308,0.05,false,é,1970-01-01,1970-01-01T00:00:00,1677-09-22T00:00:00,1970-01-01 00:00:00,2262-04-11T00:00:00
,,,,,,,,,,,,,,,,,
";
    let batches = read_csv(text.as_bytes(), &all_types(), 10).expect("read");
    assert_eq!(rows(&batches), [3]);
    assert_eq!(batches[0].schema(), all_types());
    let shown = table(&batches);
    for expected in [
        "| -128 | -32768 | -2147483648 | -9223372036854775808 | 0   | 0     | 0          | 0                    | 1.5",
        "| 127  | 32767  | 2147483647  | 9223372036854775807  | 255 | 65535 | 4294967295 | 18446744073709551615 | 3.4e38",
        "-12345678.91 | true  | a, \"quoted\" one | 2024-02-29 | 2024-01-31T12:00:00.123456 | 2024-01-31T12:00:00.123456789 | 2024-01-31T12:00:00Z | 2024-01-31T12:00:00Z",
        "| 0.05         | false | é",
    ] {
        assert!(shown.contains(expected), "missing {expected:?} in\n{shown}");
    }
    let last = batches[0].slice(2, 1);
    assert!(last.columns().iter().all(|c| c.null_count() == 1), "empty fields are NULL");
}

#[test]
fn a_quoted_empty_field_is_an_empty_string_in_a_text_column() {
    // As PostgreSQL and DuckDB read it, and as shardwise's CSV answers write an empty string; an
    // unquoted empty field is NULL, and so is "" in a column of another type.
    let text = "id,qty,name\n1,\"\",\"\"\n2,,\n3,\"7\",\"x\"\n";
    let batches = read_csv(text.as_bytes(), &small(), 10).expect("read");
    let names = batches[0].column(2).as_any().downcast_ref::<arrow::array::StringArray>().expect("text");
    assert_eq!(names.iter().collect::<Vec<_>>(), vec![Some(""), None, Some("x")]);
    assert_eq!(batches[0].column(1).null_count(), 2);
}

#[test]
fn matches_the_header_by_name_in_any_order() {
    let text = "name,id\nann,1\n,2\n";
    let batches = read_csv(text.as_bytes(), &small(), 10).expect("read");
    assert_eq!(
        table(&batches),
        "+----+-----+------+\n\
         | id | qty | name |\n\
         +----+-----+------+\n\
         | 1  |     | ann  |\n\
         | 2  |     |      |\n\
         +----+-----+------+"
    );
    assert_eq!(batches[0].column(1).null_count(), 2, "a column the file lacks is NULL");
    assert_eq!(batches[0].column(2).null_count(), 1, "an empty field is NULL");
}

#[test]
fn splits_into_batches_of_batch_rows() {
    let text = "id\n1\n2\n3\n4\n5\n";
    assert_eq!(rows(&read_csv(text.as_bytes(), &small(), 2).expect("read")), [2, 2, 1]);
    assert_eq!(rows(&read_csv(text.as_bytes(), &small(), 5).expect("read")), [5]);
    assert_eq!(rows(&read_csv(b"id\n1\n2", &small(), 2).expect("no final newline")), [2]);
}

#[test]
fn header_only_loads_no_rows() {
    for text in ["id,qty\n", "id,qty", "\u{feff}id,qty\r\n", "id", "\n\nid\n", "id\r\n"] {
        let batches = read_csv(text.as_bytes(), &small(), 2).expect(text);
        assert_eq!(rows(&batches).iter().sum::<usize>(), 0, "{text:?}");
    }
}

#[test]
fn a_file_without_a_header_row_is_an_error() {
    // A 0-byte file used to load 0 rows as if it had been a header-only one.
    for text in ["", "\n\n", "\r\n", "\u{feff}"] {
        assert_eq!(csv_error(text, &small()), "data.csv is empty: it has no header row naming the columns", "{text:?}");
    }
}

#[test]
fn an_unclosed_quote_is_named_as_such() {
    // The quote opened on line 3 takes the rest of the file into one field.
    let text = "id,qty,name\n1,2,a\n2,\"3,b\n3,4,c\n";
    assert_eq!(
        csv_error(text, &small()),
        "data.csv line 3, column 2 \"qty\": a quoted field is not closed (it runs to the end of the file)"
    );
    // Even when the field count happens to match, rather than loading the rest of the file as
    // one value.
    let text = "id,qty,name\n1,2,\"a\n2,3,b\n";
    assert_eq!(
        csv_error(text, &small()),
        "data.csv line 2, column 3 \"name\": a quoted field is not closed (it runs to the end of the file)"
    );
    // An escaped quote does not close a field; an earlier bad row is still reported first.
    let text = "id,qty,name\n1,2\n2,3,\"b\"\"\n";
    assert!(csv_error(text, &small()).starts_with("data.csv line 2: 2 fields"));
    let text = "id,qty,name\n2,3,\"b\"\"\n";
    assert!(csv_error(text, &small()).ends_with("a quoted field is not closed (it runs to the end of the file)"));
    // In the header.
    let text = "id,\"qty\n1,2\n";
    assert_eq!(
        csv_error(text, &small()),
        "data.csv line 1 (the header), column 2: a quoted field is not closed (it runs to the end of the file)"
    );
    // A closed quoted field with line breaks is fine.
    let batches = read_csv(b"id,name\n1,\"a\nb\"\n2,\"\"\"\"\n", &small(), 2).expect("read");
    assert_eq!(rows(&batches), [2]);
}

#[test]
fn a_blank_line_in_a_file_of_one_column_is_a_null() {
    // How PostgreSQL's COPY reads it and shardwise's CSV answers write it; in a file of more
    // columns a blank line is skipped, as before.
    let one = schema(&[("name", DataType::Utf8, true), ("n", DataType::Int64, true)]);
    let text = "name\nx\n\n\"\"\r\n\r\n\"a\n\nb\"\n\ny\n\n";
    for batch_rows in [1, 2, 10] {
        let batches = read_csv(text.as_bytes(), &one, batch_rows).expect("read");
        let names: Vec<Option<String>> = batches
            .iter()
            .flat_map(|b| {
                let strings = b.column(0).as_any().downcast_ref::<arrow::array::StringArray>().expect("text");
                strings.iter().map(|v| v.map(str::to_string)).collect::<Vec<_>>()
            })
            .collect();
        let expected = [Some("x"), None, Some(""), None, Some("a\n\nb"), None, Some("y"), None];
        assert_eq!(names, expected.map(|v| v.map(str::to_string)), "batches of {batch_rows}");
    }
    let batches = read_csv(b"n\n1\n\n\"\"\n3", &one, 10).expect("read");
    assert_eq!((rows(&batches), batches[0].column(1).null_count()), (vec![4], 2));
    // A blank line where the one column is NOT NULL says so, with its line.
    assert_eq!(
        csv_error("id\n1\n\n2\n", &small()),
        "data.csv line 3, column 1 \"id\": empty, but the column is NOT NULL"
    );
    // With two columns blank lines are still skipped.
    assert_eq!(rows(&read_csv(b"id,qty\n1,2\n\n\n3,4\n\n", &small(), 10).expect("read")), [2]);
}

#[test]
fn text_after_a_closing_quote_is_an_error() {
    // csv_core reads `"ab"c` as `abc`; DuckDB refuses it, as load does, naming the place.
    assert_eq!(
        csv_error("id,qty,name\n1,2,x\n2,3,\"ab\"c\n", &small()),
        "data.csv line 3, column 3 \"name\": text after the closing quote of a quoted field (a quote inside a quoted field is written twice: \"\")"
    );
    assert!(
        csv_error("id,qty,name\n1,\"2\" ,x\n", &small()).starts_with("data.csv line 2, column 2 \"qty\": text after")
    );
    assert!(csv_error("id,\"qty\"x\n", &small()).starts_with("data.csv line 1 (the header), column 2: text after"));
    assert!(
        csv_error("name\n\"a\nb\"c\n", &schema(&[("name", DataType::Utf8, true)]))
            .starts_with("data.csv line 3, column 1")
    );
    // A quote inside an unquoted field is a plain character, and `""` inside a quoted one a quote.
    let batches = read_csv(b"id,name\n1,5\" screen\n2,\"say \"\"hi\"\"\"\n", &small(), 10).expect("read");
    let names = batches[0].column(2).as_any().downcast_ref::<arrow::array::StringArray>().expect("text");
    assert_eq!(names.iter().collect::<Vec<_>>(), [Some("5\" screen"), Some("say \"hi\"")]);
}

#[test]
fn tiny_files_without_a_final_line_break() {
    // Shorter than a byte order mark: the reader reads until it can tell.
    assert_eq!(
        csv_error("i\n", &small()).lines().next(),
        Some(
            "data.csv line 1 (the header), column 1 \"i\": the table has no such column; its columns are \"id\", \"qty\", \"name\""
        )
    );
    assert_eq!(
        csv_error("ix", &small())
            .lines()
            .next()
            .map(|l| l.starts_with("data.csv line 1 (the header), column 1 \"ix\"")),
        Some(true)
    );
    let schema = schema(&[("a", DataType::Int8, true)]);
    assert_eq!(rows(&read_csv(b"a\n1", &schema, 2).expect("read")), [1]);
}

#[test]
fn skips_a_byte_order_mark() {
    let batches = read_csv("\u{feff}id,name\n7,x\n".as_bytes(), &small(), 2).expect("read");
    assert_eq!(rows(&batches), [1]);
}

#[test]
fn unknown_header_column_is_named() {
    let err = csv_error("id,Name,colour\n1,a,red\n", &small());
    assert_eq!(
        err,
        "data.csv line 1 (the header), column 2 \"Name\": the table has no such column (did you mean \"name\"? \
         names are case-sensitive); its columns are \"id\", \"qty\", \"name\""
    );
    let err = csv_error("id,colour\n1,red\n", &small());
    assert!(
        err.starts_with("data.csv line 1 (the header), column 2 \"colour\": the table has no such column;"),
        "{err}"
    );
}

#[test]
fn duplicate_header_column() {
    let err = csv_error("id,qty,id\n1,2,3\n", &small());
    assert_eq!(err, "data.csv line 1 (the header): column \"id\" appears twice (columns 1 and 3)");
}

#[test]
fn not_null_column_missing_from_the_header() {
    let err = csv_error("name\nx\n", &small());
    assert_eq!(err, "data.csv line 1 (the header): no column \"id\", which the table requires (NOT NULL)");
}

#[test]
fn empty_value_in_a_not_null_column() {
    let err = csv_error("id,name\n1,a\n2,b\n,c\n", &small());
    assert_eq!(err, "data.csv line 4, column 1 \"id\": empty, but the column is NOT NULL");
}

#[test]
fn wrong_number_of_fields() {
    let err = csv_error("id,qty,name\n1,2,a\n2,3\n", &small());
    assert_eq!(err, "data.csv line 3: 2 fields, but the header (line 1) has 3: column 3 \"name\" is missing");
    let err = csv_error("id,qty,name\n1,2,a,extra\n", &small());
    assert_eq!(err, "data.csv line 2: 4 fields, but the header (line 1) has 3: field 4 has no column");
}

#[test]
fn invalid_utf8_names_line_and_column() {
    let err = csv_error_bytes(b"id,name\n1,ok\n2,caf\xe9\n", &small());
    assert_eq!(err, "data.csv line 3, column 2 \"name\": not valid UTF-8");
    let err = csv_error_bytes(b"id,n\xffme\n1,ok\n", &small());
    assert_eq!(err, "data.csv line 1 (the header), column 2: the name is not valid UTF-8");
}

#[test]
fn integer_overflow_is_an_error_not_a_wrap_or_null() {
    let err = csv_error("id,qty\n1,127\n2,-128\n3,300\n", &small());
    assert_eq!(err, "data.csv line 4, column 2 \"qty\": \"300\" is out of range for Int8 (-128 to 127)");
    let cases = [
        ("u8", "-1", "\"-1\" is out of range for UInt8 (0 to 255)"),
        ("u8", "256", "\"256\" is out of range for UInt8 (0 to 255)"),
        ("i16", "32768", "\"32768\" is out of range for Int16 (-32768 to 32767)"),
        ("i32", "-2147483649", "\"-2147483649\" is out of range for Int32 (-2147483648 to 2147483647)"),
        (
            "i64",
            "9223372036854775808",
            "\"9223372036854775808\" is out of range for Int64 (-9223372036854775808 to 9223372036854775807)",
        ),
        (
            "u64",
            "18446744073709551616",
            "\"18446744073709551616\" is out of range for UInt64 (0 to 18446744073709551615)",
        ),
    ];
    for (column, value, message) in cases {
        let err = csv_error(&format!("{column}\n{value}\n"), &all_types());
        assert_eq!(err, format!("data.csv line 2, column 1 \"{column}\": {message}"));
    }
}

/// Arrow's own typed CSV parser also rejects overflow (it does not wrap or write NULL); load uses
/// the same parser through the cast kernel.
#[test]
fn arrow_csv_rejects_integer_overflow_too() {
    let schema = schema(&[("qty", DataType::Int8, true)]);
    let mut reader =
        arrow::csv::ReaderBuilder::new(schema).with_header(true).build("qty\n300\n".as_bytes()).expect("reader");
    let err = reader.next().expect("a result").expect_err("300 does not fit Int8").to_string();
    assert!(err.contains("'300' as type 'Int8'"), "{err}");
}

#[test]
fn wrong_types_are_named_with_the_value() {
    let cases = [
        ("i32", "abc", "\"abc\" is not an integer (column type Int32)"),
        ("i32", "1.5", "\"1.5\" is not an integer (column type Int32)"),
        ("f64", "1.2.3", "\"1.2.3\" is not a number (column type Float64)"),
        ("f32", "1e39", "\"1e39\" is out of range for Float32"),
        ("f32", "1e-50", "\"1e-50\" is too close to zero for Float32 (it would be 0)"),
        ("f64", "-1e-400", "\"-1e-400\" is too close to zero for Float64 (it would be 0)"),
        ("ok", "maybe", "\"maybe\" is not a boolean (column type Boolean: true or false)"),
        ("day", "2024-13-01", "\"2024-13-01\" is not a date (column type Date32: YYYY-MM-DD)"),
        ("day", "2023-02-29", "\"2023-02-29\" is not a date (column type Date32: YYYY-MM-DD)"),
        (
            "ts_us",
            "yesterday",
            "\"yesterday\" is not a timestamp (column type Timestamp(µs); e.g. 2024-01-31 12:00:00 or 2024-01-31T12:00:00Z)",
        ),
        ("ts_ns", "2300-01-01T00:00:00", "\"2300-01-01T00:00:00\" is out of range for Timestamp(ns)"),
        ("dec", "12.3.4", "\"12.3.4\" is not a decimal number (column type Decimal128(10, 2))"),
        (
            "dec",
            "123456789.5",
            "\"123456789.5\" does not fit Decimal128(10, 2) (at most 8 digits before the decimal point, once rounded to 2 decimals)",
        ),
        (
            "dec",
            "1e9",
            "\"1e9\" does not fit Decimal128(10, 2) (at most 8 digits before the decimal point, once rounded to 2 decimals)",
        ),
        // Eight digits before the point, but nine once rounded.
        (
            "dec",
            "99999999.995",
            "\"99999999.995\" does not fit Decimal128(10, 2) (at most 8 digits before the decimal point, once rounded to 2 decimals)",
        ),
        ("dec", "1e2x", "\"1e2x\" is not a decimal number (column type Decimal128(10, 2))"),
    ];
    for (column, value, message) in cases {
        let err = csv_error(&format!("{column}\n{value}\n"), &all_types());
        assert_eq!(err, format!("data.csv line 2, column 1 \"{column}\": {message}"), "{column} {value}");
    }
}

#[test]
fn infinity_spelled_out_is_a_float() {
    let batches = read_csv(b"f32,f64\ninf,-Infinity\n", &all_types(), 2).expect("read");
    assert_eq!(batches[0].column(8).null_count(), 0);
}

/// A number for a timestamp is seconds since 1970, a fraction a part of one.
#[test]
fn numbers_for_timestamps_are_seconds() {
    let batches = read_csv(b"ts_us\n1700000000.5\n-1\n2024-01-31 12:00:00\n", &all_types(), 5).expect("read");
    let shown = table(&batches);
    for expected in ["2023-11-14T22:13:20.500", "1969-12-31T23:59:59", "2024-01-31T12:00:00"] {
        assert!(shown.contains(expected), "missing {expected} in\n{shown}");
    }
}

/// A time without seconds is read as an INSERT reads it (PostgreSQL's COPY and DuckDB take it).
#[test]
fn a_time_without_seconds_is_a_timestamp() {
    let batches = read_csv(
        b"ts_us
2024-01-03 10:00
2024-01-03T11:30
",
        &all_types(),
        5,
    )
    .expect("read");
    let shown = table(&batches);
    for expected in ["2024-01-03T10:00:00", "2024-01-03T11:30:00"] {
        assert!(shown.contains(expected), "missing {expected} in\n{shown}");
    }
}

/// Zeros stay zeros (only a number other than zero that would become 0 is refused), and a
/// DECIMAL may be written with an exponent, as JSON writers write small numbers.
#[test]
fn zeros_and_decimals_with_exponents() {
    let batches = read_csv(b"f32,f64,dec\n0,-0.0e5,1.25e1\n0e-50,0,-5E-2\n", &all_types(), 2).expect("read");
    let shown = table(&batches);
    assert!(shown.contains("| 12.50 ") && shown.contains("| -0.05 "), "{shown}");
}

#[test]
fn long_values_are_cut_in_errors() {
    let long = "x".repeat(100);
    let err = csv_error(&format!("i8\n{long}\n"), &all_types());
    let shown = format!("\"{}\"... (100 characters)", "x".repeat(40));
    assert_eq!(err, format!("data.csv line 2, column 1 \"i8\": {shown} is not an integer (column type Int8)"));
}

#[test]
fn lines_count_quoted_line_breaks_crlf_and_blank_lines() {
    // Line 2's record spans lines 2-4; line 5 is blank; the bad value is on line 7.
    let text = "id,name,qty\r\n1,\"two\r\nline\r\nname\",1\r\n\r\n2,b,2\r\n3,c,999\r\n";
    let err = csv_error(text, &small());
    assert_eq!(err, "data.csv line 7, column 3 \"qty\": \"999\" is out of range for Int8 (-128 to 127)");
    let cr_only = "id,qty\r1,2\r2,x\r";
    assert_eq!(
        csv_error(cr_only, &small()),
        "data.csv line 3, column 2 \"qty\": \"x\" is not an integer (column type Int8)"
    );
    let ok = read_csv(b"id,name\r\n1,\"a\r\nb\"\r\n\r\n2,c\r\n", &small(), 1).expect("read");
    assert_eq!(rows(&ok), [1, 1]);
    use arrow::array::AsArray;
    assert_eq!(ok[0].column(2).as_string::<i32>().value(0), "a\r\nb");
}

#[test]
fn a_bad_field_on_a_later_line_of_its_record_names_that_line() {
    let text = "name,qty,id\n\"first\nsecond\",oops,1\n";
    let err = csv_error(text, &small());
    assert_eq!(err, "data.csv line 3, column 2 \"qty\": \"oops\" is not an integer (column type Int8)");
}

#[test]
fn errors_after_the_first_batch_name_the_right_line() {
    let text = "id,qty\n1,1\n2,2\n3,3\n4,4\n5,500\n";
    let err = csv_error(text, &small());
    assert_eq!(err, "data.csv line 6, column 2 \"qty\": \"500\" is out of range for Int8 (-128 to 127)");
}

#[test]
fn reads_across_read_chunks() {
    // More than one 1 MiB chunk, a quoted field straddling chunk boundaries.
    let mut text = String::from("id,name\n");
    let big = "y".repeat(3 << 20);
    text.push_str(&format!("1,\"{big}\"\n"));
    for i in 2..=20_000 {
        text.push_str(&format!("{i},n{i}\n"));
    }
    text.push_str("20001,\"bad\nline\",\n");
    let err = csv_error(&text, &small());
    assert_eq!(err, "data.csv line 20002: 3 fields, but the header (line 1) has 2: field 3 has no column");
    let good = &text[..text.len() - "20001,\"bad\nline\",\n".len()];
    let batches = read_csv(good.as_bytes(), &small(), 4096).expect("read");
    assert_eq!(rows(&batches).iter().sum::<usize>(), 20_000);
}

/// Makes row N bad.
type BadRow = fn(usize) -> Vec<u8>;

/// `id,qty,name` rows `1,1,n1` ... with the rows in `bad` (0-based) made bad as `make_bad` says.
fn rows_with_bad(rows: usize, bad: &[usize], make_bad: impl Fn(usize) -> Vec<u8>) -> Vec<u8> {
    let mut text = b"id,qty,name\n".to_vec();
    for row in 0..rows {
        match bad.contains(&row) {
            true => text.extend(make_bad(row)),
            false => text.extend(format!("{row},{},n{row}\n", row % 100).into_bytes()),
        }
    }
    text
}

#[test]
fn the_first_bad_row_of_many_batches_is_the_error() {
    // Bad rows in many batches of 7 rows; later batches are converted while earlier ones still
    // are, so any of them may fail first, but the error is the first row's.
    let bad = [1234, 1250, 1717, 2500, 2990];
    let kinds: [(BadRow, &str); 5] = [
        (
            |row| format!("{row},300,x\n").into_bytes(),
            "column 2 \"qty\": \"300\" is out of range for Int8 (-128 to 127)",
        ),
        (
            |row| format!("{row},1\n").into_bytes(),
            "2 fields, but the header (line 1) has 3: column 3 \"name\" is missing",
        ),
        (
            |row| format!("{row},1,caf\u{e9}\n").into_bytes().into_iter().filter(|&b| b != 0xA9).collect(),
            "column 3 \"name\": not valid UTF-8",
        ),
        (|_| b",1,x\n".to_vec(), "column 1 \"id\": empty, but the column is NOT NULL"),
        (
            |row| format!("{row},\"1\n0\",x\n").into_bytes(),
            "column 2 \"qty\": \"1\\n0\" is not an integer (column type Int8)",
        ),
    ];
    for (first_kind, (_, message)) in kinds.iter().enumerate() {
        // The first bad row has this kind; the later ones every other kind in turn.
        let make_bad = |row: usize| {
            let index = bad.iter().position(|&b| b == row).unwrap_or(0);
            kinds[(first_kind + index) % kinds.len()].0(row)
        };
        let text = rows_with_bad(3000, &bad, make_bad);
        let expected = match message.starts_with("2 fields") {
            true => format!("data.csv line 1236: {message}"),
            false => format!("data.csv line 1236, {message}"),
        };
        for workers in [1, 2, 4, 8] {
            let err =
                csv::read_on(workers, &text[..], "data.csv", &small(), 7, &Progress::hidden()).expect_err("bad rows");
            assert_eq!(format!("{err:#}"), expected, "{workers} workers");
        }
    }
}

#[test]
fn one_worker_and_several_give_the_same_batches() {
    // Quoted fields (with commas, quotes and line breaks), CRLF, blank lines, empty values.
    let mut text = String::from("name,qty,id\r\n");
    for row in 0..5000 {
        let name = match row % 6 {
            0 => format!("\"n, {row}\""),
            1 => format!("\"say \"\"{row}\"\"\r\nagain\""),
            2 => String::new(),
            3 => format!("caf\u{e9}{row}"),
            4 => format!("a\"b{row}"),
            _ => format!("n{row}"),
        };
        let qty = if row % 5 == 0 { String::new() } else { (row % 200 - 100).to_string() };
        text.push_str(&format!("{name},{qty},{row}\r\n"));
        if row % 97 == 0 {
            text.push_str("\r\n\n");
        }
    }
    for batch_rows in [1, 7, 1000, 10_000] {
        let read =
            |workers| csv::read_on(workers, text.as_bytes(), "data.csv", &small(), batch_rows, &Progress::hidden());
        let one = read(1).expect("read");
        assert_eq!(rows(&one).iter().sum::<usize>(), 5000);
        for workers in [2, 3, 8] {
            assert!(read(workers).expect("read") == one, "{workers} workers, batches of {batch_rows}");
        }
    }
}

#[test]
fn nullable_columns_missing_from_the_header_are_named_in_a_note() {
    use crate::load::absent_columns_note;
    let note = absent_columns_note(&small(), &[Some(0), None, None], "data.csv");
    assert_eq!(note.as_deref(), Some("note: data.csv has no columns \"qty\", \"name\": every row gets NULL there"));
    let note = absent_columns_note(&small(), &[Some(0), Some(2), None], "data.csv");
    assert_eq!(note.as_deref(), Some("note: data.csv has no column \"name\": every row gets NULL there"));
    assert_eq!(absent_columns_note(&small(), &[Some(0), Some(1), Some(2)], "data.csv"), None);
    let batches = read_csv(b"id\n1\n", &small(), 10).expect("nullable columns may be absent");
    assert!(table(&batches).contains("| 1  |     |      |"), "{}", table(&batches));
}
