//! Unit tests of [`super`].
use super::*;
use arrow::datatypes::TimeUnit;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("user", DataType::Utf8, true),
        Field::new("amount", DataType::Decimal128(18, 2), true),
        Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())), true),
    ]))
}

fn opts(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn build(pairs: &[(&str, &str)], world_size: u32) -> Result<TableDef, StorageError> {
    TableDef::from_options("t", schema(), &opts(pairs), world_size)
}

#[test]
fn defaults() {
    let def = build(&[("shard_key", "id")], 3).unwrap();
    assert_eq!(def.shard_key, vec!["id"]);
    assert_eq!(def.shards, 3);
    assert_eq!(def.replicas, 1);
    assert_eq!(def.sync_mode, SyncMode::Immediate);
    assert_eq!(def.delay, DelaySettings { delay_max_ms: 1000, delay_max_rows: 100_000, delay_max_bytes: 16 << 20 });
    assert_eq!(def.placement, PlacementVersion::XxHash64V1);
    assert_eq!(def.shard_key_indices().unwrap(), vec![0]);
}

#[test]
fn every_option() {
    let def = build(
        &[
            ("SHARD_KEY", " user , id "),
            ("shards", "8"),
            ("replicas", "2"),
            ("sync_mode", "Delay_Mode_Distributed"),
            ("delay_max_ms", "50"),
            ("delay_max_rows", "10"),
            ("delay_max_bytes", "4096"),
        ],
        3,
    )
    .unwrap();
    assert_eq!(def.shard_key, vec!["user", "id"]);
    assert_eq!(def.shard_key_indices().unwrap(), vec![1, 0]);
    assert_eq!((def.shards, def.replicas), (8, 2));
    assert_eq!(def.sync_mode, SyncMode::DelayModeDistributed);
    assert_eq!(def.delay, DelaySettings { delay_max_ms: 50, delay_max_rows: 10, delay_max_bytes: 4096 });
}

#[test]
fn sync_mode_parse_and_display() {
    for mode in [SyncMode::Immediate, SyncMode::DelayModeDistributed] {
        assert_eq!(mode.as_str().parse::<SyncMode>().unwrap(), mode);
        assert_eq!(mode.to_string().to_uppercase().parse::<SyncMode>().unwrap(), mode);
    }
    let err = "async".parse::<SyncMode>().unwrap_err().to_string();
    assert!(err.contains("async") && err.contains("'immediate', 'delay_mode_distributed'"), "{err}");
}

#[test]
fn unknown_option_lists_accepted_keys() {
    let err = build(&[("shard_key", "id"), ("shard", "4")], 3).unwrap_err();
    assert!(matches!(&err, StorageError::UnknownTableOption { key, .. } if key == "shard"), "{err}");
    assert!(err.to_string().contains(TABLE_OPTIONS), "{err}");
}

#[test]
fn duplicate_option() {
    let err = build(&[("shard_key", "id"), ("Shards", "4"), ("shards", "5")], 3).unwrap_err();
    assert!(matches!(&err, StorageError::DuplicateTableOption { key, .. } if key == "shards"), "{err}");
    assert!(err.to_string().contains(TABLE_OPTIONS), "{err}");
}

#[test]
fn bad_numbers() {
    for (key, value) in [
        ("shards", "four"),
        ("shards", "-1"),
        ("shards", "0"),
        ("shards", "4097"),
        ("shards", "99999999999"),
        ("replicas", "0"),
        ("replicas", "x"),
        ("delay_max_ms", "0"),
        ("delay_max_ms", "1.5"),
        ("delay_max_ms", "3600001"),
        ("delay_max_rows", "0"),
        ("delay_max_rows", "100000001"),
        ("delay_max_bytes", "0"),
        ("delay_max_bytes", "16MiB"),
        ("delay_max_bytes", "1073741825"),
    ] {
        let err = build(&[("shard_key", "id"), (key, value)], 3).unwrap_err();
        assert!(matches!(&err, StorageError::InvalidOption { name, .. } if *name == key), "{key}={value}: {err}");
        let msg = err.to_string();
        assert!(msg.contains(value) && msg.contains("integer from"), "{msg}");
    }
}

#[test]
fn bad_sync_mode() {
    let err = build(&[("shard_key", "id"), ("sync_mode", "eventually")], 3).unwrap_err();
    assert!(matches!(&err, StorageError::InvalidOption { name: "sync_mode", .. }), "{err}");
    assert!(err.to_string().contains("delay_mode_distributed"));
}

#[test]
fn replicas_above_world_size() {
    let err = build(&[("shard_key", "id"), ("replicas", "4")], 3).unwrap_err();
    assert!(matches!(&err, StorageError::InvalidOption { name: "replicas", .. }), "{err}");
    assert!(err.to_string().contains("world size (3)"), "{err}");
    // The same definition is fine on a bigger cluster, and validate re-checks it.
    let def = build(&[("shard_key", "id"), ("replicas", "4")], 4).unwrap();
    assert!(def.validate(3).is_err());
    assert!(def.validate(4).is_ok());
}

#[test]
fn world_size_zero() {
    let err = build(&[("shard_key", "id")], 0).unwrap_err();
    assert!(matches!(&err, StorageError::InvalidOption { name: "world_size", .. }), "{err}");
}

#[test]
fn shard_key_errors() {
    let err = build(&[("shards", "2")], 3).unwrap_err();
    assert!(matches!(&err, StorageError::MissingShardKey { .. }), "{err}");
    assert!(err.to_string().contains("has no shard_key") && err.to_string().contains("WITH (shard_key = "), "{err}");

    let err = build(&[("shard_key", "nope")], 3).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(&err, StorageError::InvalidShardKey { .. }), "{msg}");
    assert!(msg.contains("\"nope\" is not a column") && msg.contains("id, user, amount, ts"), "{msg}");

    let err = build(&[("shard_key", "id,user,id")], 3).unwrap_err();
    assert!(err.to_string().contains("\"id\" appears more than once"), "{err}");

    for value in ["", " ", "id,", ",id", "id,,user"] {
        let err = build(&[("shard_key", value)], 3).unwrap_err();
        assert!(err.to_string().contains("empty column name"), "{value:?}: {err}");
    }

    // Names no column in any case.
    let err = build(&[("shard_key", "IDX")], 3).unwrap_err();
    assert!(err.to_string().contains("\"IDX\" is not a column"), "{err}");
}

/// Every supported column type, with several decimal scales, time units and zones.
fn supported_types() -> Vec<DataType> {
    vec![
        DataType::Int8,
        DataType::Int16,
        DataType::Int32,
        DataType::Int64,
        DataType::UInt8,
        DataType::UInt16,
        DataType::UInt32,
        DataType::UInt64,
        DataType::Float32,
        DataType::Float64,
        DataType::Decimal128(38, 10),
        DataType::Decimal128(38, -2),
        DataType::Boolean,
        DataType::Utf8,
        DataType::Date32,
        DataType::Timestamp(TimeUnit::Second, None),
        DataType::Timestamp(TimeUnit::Microsecond, Some("+05:30".into())),
        DataType::Timestamp(TimeUnit::Nanosecond, Some("America/New_York".into())),
        DataType::Timestamp(TimeUnit::Nanosecond, Some("Europe/Paris".into())),
    ]
}

#[test]
fn supported_and_unsupported_types() {
    for dt in supported_types() {
        check_column_type("c", &dt).unwrap();
    }
    for dt in [DataType::Float16, DataType::LargeUtf8, DataType::Utf8View, DataType::Binary, DataType::Date64] {
        let err = check_column_type("c", &dt).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("\"c\"") && msg.contains(&dt.to_string()) && msg.contains("Decimal128"), "{msg}");
    }
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("blob", DataType::Binary, true),
    ]));
    let err = TableDef::from_options("t", schema, &opts(&[("shard_key", "id")]), 1).unwrap_err();
    assert!(matches!(&err, StorageError::UnsupportedColumnType { column, .. } if column == "blob"), "{err}");
}

#[test]
fn column_errors() {
    let not_null = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
    let err = TableDef::from_options("t", not_null, &opts(&[("shard_key", "id")]), 1).unwrap_err();
    assert!(matches!(&err, StorageError::NonNullableColumn { column, .. } if column == "id"), "{err}");

    let dup =
        Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true), Field::new("id", DataType::Utf8, true)]));
    let err = TableDef::from_options("t", dup, &opts(&[("shard_key", "id")]), 1).unwrap_err();
    assert!(err.to_string().contains("\"id\" appears more than once"), "{err}");

    let empty = Arc::new(Schema::empty());
    let err = TableDef::from_options("t", empty, &opts(&[("shard_key", "id")]), 1).unwrap_err();
    assert!(err.to_string().contains("no columns"), "{err}");

    let wide = Arc::new(Schema::new(
        (0..=MAX_COLUMNS).map(|i| Field::new(format!("c{i}"), DataType::Int32, true)).collect::<Vec<_>>(),
    ));
    let err = TableDef::from_options("t", wide, &opts(&[("shard_key", "c0")]), 1).unwrap_err();
    assert!(err.to_string().contains("1025 columns"), "{err}");

    let long = Arc::new(Schema::new(vec![Field::new("x".repeat(MAX_NAME_BYTES + 1), DataType::Int64, true)]));
    let err = TableDef::from_options("t", long, &opts(&[("shard_key", "id")]), 1).unwrap_err();
    assert!(matches!(err, StorageError::InvalidColumns { .. }), "{err}");
}

#[test]
fn table_names() {
    for ok in ["t", "_t", "Orders_2024", &"a".repeat(MAX_NAME_BYTES)] {
        TableDef::from_options(ok, schema(), &opts(&[("shard_key", "id")]), 1).unwrap();
    }
    for bad in ["", "1t", "a-b", "a b", "a.b", "é", "../x", &"a".repeat(MAX_NAME_BYTES + 1)] {
        let err = TableDef::from_options(bad, schema(), &opts(&[("shard_key", "id")]), 1).unwrap_err();
        assert!(matches!(&err, StorageError::InvalidTableName { name, .. } if name == bad), "{err}");
    }
}

#[test]
fn replica_ranks_wrap_around() {
    let def = build(&[("shard_key", "id"), ("shards", "5"), ("replicas", "3")], 4).unwrap();
    assert_eq!(def.replica_ranks(0, 4), vec![0, 1, 2]);
    assert_eq!(def.replica_ranks(2, 4), vec![2, 3, 0]);
    assert_eq!(def.replica_ranks(4, 4), vec![0, 1, 2]);
    assert_eq!(def.replica_ranks(5, 4), Vec::<u32>::new());
    assert_eq!(def.replica_ranks(0, 0), Vec::<u32>::new());
    // A shrunk cluster never gets the same rank twice.
    assert_eq!(def.replica_ranks(1, 2), vec![1, 0]);
    let big = build(&[("shard_key", "id"), ("shards", "4096")], 1).unwrap();
    assert_eq!(big.replica_ranks(4095, u32::MAX), vec![4095]);
}

#[test]
fn json_round_trip() {
    let def = build(
        &[("shard_key", "user,ts"), ("shards", "7"), ("replicas", "2"), ("sync_mode", "delay_mode_distributed")],
        3,
    )
    .unwrap();
    let json = serde_json::to_string_pretty(&def).unwrap();
    assert!(json.contains("\"type\": \"Decimal128(18, 2)\""), "{json}");
    assert!(json.contains("\"placement\": \"xxhash64-v1\""), "{json}");
    assert!(json.contains("\"sync_mode\": \"delay_mode_distributed\""), "{json}");
    let back: TableDef = serde_json::from_str(&json).unwrap();
    assert_eq!(back, def);

    // Every supported type survives the trip through its type name.
    let all = Arc::new(Schema::new(
        supported_types()
            .into_iter()
            .enumerate()
            .map(|(i, dt)| Field::new(format!("c{i}"), dt, true))
            .collect::<Vec<_>>(),
    ));
    let def = TableDef::from_options("all_types", all, &opts(&[("shard_key", "c0,c12,c16")]), 2).unwrap();
    let back: TableDef = serde_json::from_str(&serde_json::to_string(&def).unwrap()).unwrap();
    assert_eq!(back, def);
}

#[test]
fn json_rejects_bad_catalog_entries() {
    let def = build(&[("shard_key", "id")], 3).unwrap();
    let json = serde_json::to_value(&def).unwrap();

    let mut bad_type = json.clone();
    bad_type["columns"][0]["type"] = "Int65".into();
    let err = serde_json::from_value::<TableDef>(bad_type).unwrap_err().to_string();
    assert!(err.contains("Int65") && err.contains("\"id\""), "{err}");

    let mut unsupported = json.clone();
    unsupported["columns"][0]["type"] = "Binary".into();
    let err = serde_json::from_value::<TableDef>(unsupported).unwrap_err().to_string();
    assert!(err.contains("unsupported type Binary"), "{err}");

    let mut unknown_field = json.clone();
    unknown_field["owner"] = "me".into();
    assert!(serde_json::from_value::<TableDef>(unknown_field).is_err());

    let mut future_placement = json.clone();
    future_placement["placement"] = "xxhash64-v2".into();
    let err = serde_json::from_value::<TableDef>(future_placement).unwrap_err().to_string();
    assert!(err.contains("xxhash64-v2"), "{err}");

    let mut bad_key = json.clone();
    bad_key["shard_key"] = serde_json::json!(["missing"]);
    assert!(serde_json::from_value::<TableDef>(bad_key).is_err());

    let mut zero_shards = json;
    zero_shards["shards"] = 0.into();
    assert!(serde_json::from_value::<TableDef>(zero_shards).is_err());
}

#[test]
fn shard_key_names_unquoted_columns_in_any_case() {
    // `CREATE TABLE t (Id ...) WITH (shard_key = 'Id')`: the parser made the column `id`.
    assert_eq!(build(&[("shard_key", "ID,User")], 3).unwrap().shard_key, vec!["id", "user"]);
    // A column named with capitals (quoted in the DDL) is matched exactly, and only so.
    let schema = Arc::new(Schema::new(vec![Field::new("Id", DataType::Int64, true)]));
    let def = TableDef::from_options("t", Arc::clone(&schema), &opts(&[("shard_key", "Id")]), 3).unwrap();
    assert_eq!(def.shard_key, vec!["Id"]);
    let err = TableDef::from_options("t", schema, &opts(&[("shard_key", "id")]), 3).unwrap_err();
    assert!(err.to_string().contains("\"id\" is not a column"), "{err}");
}
