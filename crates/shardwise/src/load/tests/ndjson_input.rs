//! NDJSON: types, keys in any order, NULLs, and every malformed input named by line and column.

use super::*;

#[test]
fn reads_every_supported_type() {
    let text = r#"{"i8":-128,"i16":-32768,"i32":-2147483648,"i64":-9223372036854775808,"u8":0,"u16":0,"u32":0,"u64":0,"f32":1.5,"f64":-2.25,"dec":-12345678.91,"ok":true,"s":"a \"quoted\" one","day":"2024-02-29","ts_us":"2024-01-31 12:00:00.123456","ts_ns":"2024-01-31T12:00:00.123456789","ts_us_utc":"2024-01-31T12:00:00Z","ts_ns_utc":"2024-01-31T14:00:00+02:00"}
{"ts_ns_utc":"2262-04-11T00:00:00","u64":18446744073709551615,"i8":127,"i16":32767,"i32":2147483647,"i64":9223372036854775807,"u8":255,"u16":65535,"u32":4294967295,"f32":3.4e38,"f64":1e308,"dec":0.05,"ok":false,"s":"é","day":"1970-01-01","ts_us":"1970-01-01T00:00:00","ts_ns":"1677-09-22T00:00:00","ts_us_utc":"1970-01-01 00:00:00"}
{}
{"i8":null,"s":null}
"#;
    let batches = read_ndjson(text.as_bytes(), &all_types(), 10).expect("read");
    assert_eq!(rows(&batches), [4]);
    assert_eq!(batches[0].schema(), all_types());
    let shown = table(&batches);
    for expected in [
        "| -128 | -32768 | -2147483648 | -9223372036854775808 | 0   | 0     | 0          | 0                    | 1.5",
        "| 127  | 32767  | 2147483647  | 9223372036854775807  | 255 | 65535 | 4294967295 | 18446744073709551615 | 3.4e38",
        "-12345678.91 | true  | a \"quoted\" one | 2024-02-29 | 2024-01-31T12:00:00.123456 | 2024-01-31T12:00:00.123456789 | 2024-01-31T12:00:00Z | 2024-01-31T12:00:00Z",
        "| 0.05         | false | é",
    ] {
        assert!(shown.contains(expected), "missing {expected:?} in\n{shown}");
    }
    for row in [2, 3] {
        let nulls = batches[0].slice(row, 1);
        assert!(nulls.columns().iter().all(|c| c.null_count() == 1), "missing keys and null are NULL");
    }
}

#[test]
fn numbers_and_booleans_in_a_text_column_keep_their_json_text() {
    let batches = read_ndjson(b"{\"id\":1,\"name\":12.50}\n{\"id\":2,\"name\":true}\n", &small(), 10).expect("read");
    use arrow::array::AsArray;
    let names = batches[0].column(2).as_string::<i32>();
    assert_eq!((names.value(0), names.value(1)), ("12.50", "true"));
}

#[test]
fn splits_into_batches_and_skips_blank_lines() {
    let text = "{\"id\":1}\n\n{\"id\":2}\r\n   \n{\"id\":3}\n{\"id\":4}\n{\"id\":5}";
    assert_eq!(rows(&read_ndjson(text.as_bytes(), &small(), 2).expect("read")), [2, 2, 1]);
    for empty in ["", "\n", "\u{feff}\n  \n"] {
        assert_eq!(rows(&read_ndjson(empty.as_bytes(), &small(), 2).expect(empty)), Vec::<usize>::new());
    }
    assert_eq!(rows(&read_ndjson("\u{feff}{\"id\":1}\n".as_bytes(), &small(), 2).expect("bom")), [1]);
}

#[test]
fn unknown_key_is_an_error_naming_the_line() {
    let err = ndjson_error("{\"id\":1}\n{\"id\":2}\n{\"id\":3,\"Qty\":4}\n", &small());
    assert_eq!(
        err,
        "data.ndjson line 3, key \"Qty\": the table has no such column (did you mean \"qty\"? names are \
         case-sensitive); its columns are \"id\", \"qty\", \"name\""
    );
}

/// A key given twice refuses the object (Arrow's decoder kept the last value).
#[test]
fn a_key_given_twice_is_an_error() {
    let err = ndjson_error("{\"id\":1}\n{\"id\":1,\"qty\":{\"a\":1,\"a\":2},\"id\":2}\n", &small());
    assert_eq!(err, "data.ndjson line 2, key \"id\": given twice in one object");
}

#[test]
fn syntax_errors_name_the_line() {
    let err = ndjson_error("{\"id\":1}\n{\"id\":tru}\n", &small());
    assert_eq!(err, "data.ndjson line 2: invalid JSON: Encountered unexpected '}' whilst parsing literal");
    let err = ndjson_error("{\"id\":1}\n{\"id\":\n2}\n", &small());
    assert_eq!(err, "data.ndjson line 2: the JSON value does not end on this line (each object must be on one line)");
    let err = ndjson_error("{\"id\":1} {\"id\":2}\n", &small());
    assert_eq!(err, "data.ndjson line 1: more than one JSON value on the line");
    // On the last line of a batch too.
    let err = ndjson_error("{\"id\":1}\n{\"id\":2} {\"id\":3}\n", &small());
    assert_eq!(err, "data.ndjson line 2: more than one JSON value on the line");
}

#[test]
fn a_line_that_is_not_an_object() {
    let err = ndjson_error("{\"id\":1}\n\n\"x\"\n", &small());
    assert_eq!(err, "data.ndjson line 3: expected a JSON object, found \"x\"");
}

#[test]
fn a_json_array_is_refused_with_the_way_to_convert_it() {
    let array = "a JSON array, where load reads newline-delimited JSON (one object per line); a file \
                 holding one array of objects converts with `jq -c '.[]' FILE > FILE.ndjson`";
    // Written out over several lines, and on one.
    let err = ndjson_error("[\n  {\"id\": 1},\n  {\"id\": 2}\n]\n", &small());
    assert_eq!(err, format!("data.ndjson line 1: {array}"));
    let err = ndjson_error("  [{\"id\": 1}, {\"id\": 2}]\n", &small());
    assert_eq!(err, format!("data.ndjson line 1: {array}"));
}

#[test]
fn invalid_utf8_names_the_line() {
    let err = match read_ndjson(b"{\"id\":1}\n{\"id\":2,\"name\":\"caf\xe9\"}\n", &small(), 2) {
        Ok(_) => panic!("expected an error"),
        Err(e) => format!("{e:#}"),
    };
    assert_eq!(err, "data.ndjson line 2, column \"name\" (table column 3): not valid UTF-8 (at byte 20 of the line)");
    let err = match read_ndjson(b"{\"id\":1,\"caf\xe9\":2}\n", &small(), 2) {
        Ok(_) => panic!("expected an error"),
        Err(e) => format!("{e:#}"),
    };
    assert_eq!(err, "data.ndjson line 1, key \"caf\u{fffd}\": not valid UTF-8 (at byte 13 of the line)");
}

#[test]
fn integer_overflow_and_fractions_are_errors() {
    let err = ndjson_error("{\"id\":1,\"qty\":127}\n{\"id\":2,\"qty\":300}\n", &small());
    assert_eq!(
        err,
        "data.ndjson line 2, column \"qty\" (table column 2): \"300\" is out of range for Int8 (-128 to 127)"
    );
    let err = ndjson_error("{\"id\":1.5}\n", &small());
    assert_eq!(
        err,
        "data.ndjson line 1, column \"id\" (table column 1): \"1.5\" is not an integer (column type Int64)"
    );
    let err = ndjson_error("{\"id\":1}\n{\"id\":\"abc\"}\n", &small());
    assert_eq!(
        err,
        "data.ndjson line 2, column \"id\" (table column 1): \"abc\" is not an integer (column type Int64)"
    );
    let err = ndjson_error("{\"id\":true}\n", &small());
    assert_eq!(
        err,
        "data.ndjson line 1, column \"id\" (table column 1): \"true\" is not an integer (column type Int64)"
    );
    let cases = [
        (
            "u64",
            "18446744073709551616",
            "\"18446744073709551616\" is out of range for UInt64 (0 to 18446744073709551615)",
        ),
        ("u8", "-1", "\"-1\" is out of range for UInt8 (0 to 255)"),
        ("f32", "1e39", "\"1e39\" is out of range for Float32"),
        (
            "dec",
            "123456789.5",
            "\"123456789.5\" does not fit Decimal128(10, 2) (at most 8 digits before the decimal point, once rounded to 2 decimals)",
        ),
    ];
    for (column, value, message) in cases {
        let err = ndjson_error(&format!("{{\"{column}\":{value}}}\n"), &all_types());
        let position = all_types().index_of(column).expect("column") + 1;
        assert_eq!(err, format!("data.ndjson line 1, column \"{column}\" (table column {position}): {message}"));
    }
}

#[test]
fn other_wrong_types_name_line_column_and_value() {
    // Line 5 is in the third batch (two lines a batch): the batch is decoded again to find it.
    let text = "{\"ok\":true}\n{\"ok\":false}\n{}\n{\"ok\":null}\n{\"ok\":3}\n";
    let err = ndjson_error(text, &all_types());
    assert_eq!(
        err,
        "data.ndjson line 5, column \"ok\" (table column 12): \"3\" is not a boolean (column type Boolean: true or false)"
    );
    let err = ndjson_error("{\"s\":\"x\"}\n{\"s\":{\"a\":1}}\n", &all_types());
    assert_eq!(
        err,
        "data.ndjson line 2, column \"s\" (table column 13): {\"a\":1} is not a valid Utf8 (expected string got {\"a\": 1})"
    );
    let err = ndjson_error("{\"day\":\"2024-13-01\"}\n", &all_types());
    assert_eq!(
        err,
        "data.ndjson line 1, column \"day\" (table column 14): \"2024-13-01\" is not a date (column type Date32: YYYY-MM-DD)"
    );
    let err = ndjson_error("{\"i8\":1,\"ts_us\":\"yesterday\"}\n", &all_types());
    assert_eq!(
        err,
        "data.ndjson line 1, column \"ts_us\" (table column 15): \"yesterday\" is not a timestamp (column type \
         Timestamp(µs); e.g. 2024-01-31 12:00:00 or 2024-01-31T12:00:00Z)"
    );
}

#[test]
fn missing_or_null_not_null_column() {
    let err = ndjson_error("{\"id\":1}\n{\"qty\":1}\n", &small());
    assert_eq!(err, "data.ndjson line 2, column \"id\" (table column 1): missing or null, but the column is NOT NULL");
    let err = ndjson_error("{\"id\":1}\n{\"id\":2}\n\n{\"id\":null}\n", &small());
    assert_eq!(err, "data.ndjson line 4, column \"id\" (table column 1): missing or null, but the column is NOT NULL");
}

#[test]
fn the_first_bad_line_of_many_batches_is_the_error() {
    let bad = [1234, 1250, 1717, 2500, 2990];
    let kinds: [(&str, &str); 4] = [
        ("{\"id\":1,\"qty\":300}", "column \"qty\" (table column 2): \"300\" is out of range for Int8 (-128 to 127)"),
        ("{\"id\":1", "the JSON value does not end on this line (each object must be on one line)"),
        (
            "{\"id\":1,\"colour\":2}",
            "key \"colour\": the table has no such column; its columns are \"id\", \"qty\", \"name\"",
        ),
        ("{\"qty\":1}", "column \"id\" (table column 1): missing or null, but the column is NOT NULL"),
    ];
    for (first_kind, (_, message)) in kinds.iter().enumerate() {
        let mut text = String::new();
        for row in 0..3000 {
            match bad.iter().position(|&b| b == row) {
                Some(index) => text.push_str(kinds[(first_kind + index) % kinds.len()].0),
                None => text.push_str(&format!("{{\"id\":{row},\"qty\":{}}}", row % 100)),
            }
            text.push('\n');
        }
        let expected = match message.starts_with("the JSON") {
            true => format!("data.ndjson line 1235: {message}"),
            false => format!("data.ndjson line 1235, {message}"),
        };
        for workers in [1, 2, 4, 8] {
            let err = ndjson::read_on(workers, text.as_bytes(), "data.ndjson", &small(), 7, &Progress::hidden())
                .expect_err("bad lines");
            assert_eq!(format!("{err:#}"), expected, "{workers} workers");
        }
    }
}

#[test]
fn one_worker_and_several_give_the_same_batches() {
    let mut text = String::from("\u{feff}");
    for row in 0..5000 {
        match row % 4 {
            0 => text.push_str(&format!("{{\"id\":{row},\"name\":\"caf\u{e9} {row}\"}}\r\n")),
            1 => text.push_str(&format!("{{\"qty\":{},\"id\":{row}}}\n  \n", row % 100)),
            2 => text.push_str(&format!("{{\"id\":{row},\"qty\":null,\"name\":12.5}}\n")),
            _ => text.push_str(&format!("{{\"id\":{row}}}\n")),
        }
    }
    for batch_rows in [1, 7, 1000, 10_000] {
        let read = |workers| {
            ndjson::read_on(workers, text.as_bytes(), "data.ndjson", &small(), batch_rows, &Progress::hidden())
        };
        let one = read(1).expect("read");
        assert_eq!(rows(&one).iter().sum::<usize>(), 5000);
        for workers in [2, 3, 8] {
            assert!(read(workers).expect("read") == one, "{workers} workers, batches of {batch_rows}");
        }
    }
}

#[test]
fn a_number_for_a_timestamp_is_seconds_since_1970() {
    // As `CAST(1700000000 AS TIMESTAMP)` reads it; Arrow's cast alone read nanoseconds.
    let ts = schema(&[("ts", DataType::Timestamp(TimeUnit::Nanosecond, None), true)]);
    let batches = read_ndjson(b"{\"ts\": 1700000000}\n{\"ts\": \"2024-01-31 12:00:00\"}\n", &ts, 10).expect("read");
    let shown = table(&batches);
    assert!(shown.contains("2023-11-14T22:13:20") && shown.contains("2024-01-31T12:00:00"), "{shown}");
}

#[test]
fn a_column_no_line_gives_is_named_in_a_note() {
    let batches = read_ndjson(b"{\"id\":1,\"qty\":2}\n{\"id\":2,\"qty\":null}\n", &small(), 1).expect("read");
    let note = super::ndjson::never_given_note(&small(), &batches, "data.ndjson");
    assert_eq!(
        note.as_deref(),
        Some("note: no line of data.ndjson gives column \"name\" a value: every row gets NULL there")
    );
    let batches = read_ndjson(b"{\"id\":1,\"name\":\"a\"}\n", &small(), 10).expect("read");
    let note = super::ndjson::never_given_note(&small(), &batches, "data.ndjson");
    assert_eq!(
        note.as_deref(),
        Some("note: no line of data.ndjson gives column \"qty\" a value: every row gets NULL there")
    );
    assert_eq!(super::ndjson::never_given_note(&small(), &[], "data.ndjson"), None);
}

#[test]
fn a_date_written_as_a_number_reads_as_the_csv_loader_reads_it() {
    let schema: SchemaRef = Arc::new(Schema::new(vec![Field::new("day", DataType::Date32, true)]));
    // Arrow's decoder would take 20240101 for days since 1970 (the year 57385).
    let batches = read_ndjson(b"{\"day\":20240101}\n{\"day\":\"2024-01-02\"}\n", &schema, 10).expect("read");
    use arrow::array::AsArray;
    let days = batches[0].column(0).as_primitive::<arrow::datatypes::Date32Type>();
    assert_eq!(days.values().to_vec(), vec![19_723, 19_724]);
    let err = ndjson_error("{\"day\":1}\n{\"day\":-99999999}\n", &schema);
    assert!(err.starts_with("data.ndjson line 1, column \"day\""), "{err}");
}

#[test]
fn booleans_as_words_or_numbers_load_as_from_a_csv() {
    let schema: SchemaRef = Arc::new(Schema::new(vec![Field::new("ok", DataType::Boolean, true)]));
    let batches =
        read_ndjson(b"{\"ok\":true}\n{\"ok\":\"false\"}\n{\"ok\":1}\n{\"ok\":null}\n", &schema, 10).expect("read");
    use arrow::array::AsArray;
    let oks = batches[0].column(0).as_boolean();
    assert_eq!(oks.iter().collect::<Vec<_>>(), vec![Some(true), Some(false), Some(true), None]);
}
