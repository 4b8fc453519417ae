//! A sharded table's definition: what the catalog stores for each table and every node needs to
//! place, store and ship its rows.
//!
//! A table is a schema (every column nullable, of a type shardwise can store and place), a
//! `shard_key` (columns), a shard count, a replica count, a sync mode with its batching settings,
//! and the placement function it was created with. Shard `s` lives on ranks `(s + r) mod N` for
//! `r = 0..replicas`, where `N` is the cluster's world size.
//!
//! [`TableDef::from_options`] builds a definition from the `WITH (...)` options of
//! `CREATE TABLE`, validating everything; [`TableDef::validate`] re-checks one (for example after
//! reading it from the catalog, or when the world size is known). The JSON form (serde) writes the
//! schema as a list of `{name, type}` with arrow's type names (`"Int64"`,
//! `"Timestamp(Millisecond, Some(\"UTC\"))"`...), since the catalog is persisted as JSON; reading
//! it rejects unknown fields, so a catalog written by a newer shardwise is refused rather than
//! half understood.

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use serde::{Deserialize, Serialize};

use crate::error::StorageError;
use crate::placement::PlacementVersion;

/// The most shards a table may have.
pub const MAX_SHARDS: u32 = 4096;
/// The most columns a table may have.
pub const MAX_COLUMNS: usize = 1024;
/// The longest table or column name, in bytes.
pub const MAX_NAME_BYTES: usize = 128;

/// Default `delay_max_ms`: how long a `delay_mode_distributed` sender may hold rows before shipping.
pub const DELAY_MAX_MS_DEFAULT: u64 = 1000;
/// Default `delay_max_rows`: how many rows a sender gathers before shipping.
pub const DELAY_MAX_ROWS_DEFAULT: u64 = 100_000;
/// Default `delay_max_bytes`: how many bytes a sender gathers before shipping.
pub const DELAY_MAX_BYTES_DEFAULT: u64 = 16 * 1024 * 1024;
/// The largest allowed `delay_max_ms` (one hour: a longer lag is a misconfiguration).
pub const DELAY_MAX_MS_LIMIT: u64 = 60 * 60 * 1000;
/// The largest allowed `delay_max_rows`.
pub const DELAY_MAX_ROWS_LIMIT: u64 = 100_000_000;
/// The largest allowed `delay_max_bytes` (1 GiB: a shipped batch is held in memory).
pub const DELAY_MAX_BYTES_LIMIT: u64 = 1024 * 1024 * 1024;

/// The table options [`TableDef::from_options`] accepts, for error messages.
pub const TABLE_OPTIONS: &str = "shard_key, shards, replicas, sync_mode, delay_max_ms, delay_max_rows, delay_max_bytes";

/// The column types a table may have, for error messages.
pub const SUPPORTED_COLUMN_TYPES: &str = "Int8, Int16, Int32, Int64, UInt8, UInt16, UInt32, UInt64, Float32, Float64, \
     Decimal128(p, s), Boolean, Utf8, Date32, Timestamp(unit[, tz])";

const TABLE_NAME_EXPECTED: &str = "1 to 128 bytes of ASCII letters, digits and '_', not starting with a digit";

/// How a table's inserts reach its shard replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SyncMode {
    /// The initiator writes each piece to its replicas and acknowledges once `insert_quorum` of
    /// them have it durable.
    #[default]
    Immediate,
    /// The initiator makes the batch durable in its local outbox and acknowledges at once;
    /// background senders ship it, exactly once.
    DelayModeDistributed,
}

impl SyncMode {
    const ACCEPTED: &'static str = "'immediate', 'delay_mode_distributed'";

    /// The SQL spelling of the mode.
    pub fn as_str(self) -> &'static str {
        match self {
            SyncMode::Immediate => "immediate",
            SyncMode::DelayModeDistributed => "delay_mode_distributed",
        }
    }
}

impl fmt::Display for SyncMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SyncMode {
    type Err = StorageError;

    /// Parses `immediate` or `delay_mode_distributed`, ignoring ASCII case and surrounding spaces.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("immediate") {
            Ok(SyncMode::Immediate)
        } else if t.eq_ignore_ascii_case("delay_mode_distributed") {
            Ok(SyncMode::DelayModeDistributed)
        } else {
            Err(StorageError::InvalidOption {
                name: "sync_mode",
                value: s.to_string(),
                expected: format!("one of {}", Self::ACCEPTED),
            })
        }
    }
}

/// When a `delay_mode_distributed` sender ships what it has gathered: after `delay_max_ms`, or
/// once it holds `delay_max_rows` rows or `delay_max_bytes` bytes, whichever comes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DelaySettings {
    pub delay_max_ms: u64,
    pub delay_max_rows: u64,
    pub delay_max_bytes: u64,
}

impl Default for DelaySettings {
    fn default() -> Self {
        DelaySettings {
            delay_max_ms: DELAY_MAX_MS_DEFAULT,
            delay_max_rows: DELAY_MAX_ROWS_DEFAULT,
            delay_max_bytes: DELAY_MAX_BYTES_DEFAULT,
        }
    }
}

impl DelaySettings {
    /// Checks that each setting is in `1..=` its limit.
    pub fn validate(&self) -> Result<(), StorageError> {
        check_range("delay_max_ms", self.delay_max_ms, 1, DELAY_MAX_MS_LIMIT, "DELAY_MAX_MS_LIMIT")?;
        check_range("delay_max_rows", self.delay_max_rows, 1, DELAY_MAX_ROWS_LIMIT, "DELAY_MAX_ROWS_LIMIT")?;
        check_range("delay_max_bytes", self.delay_max_bytes, 1, DELAY_MAX_BYTES_LIMIT, "DELAY_MAX_BYTES_LIMIT")
    }
}

fn check_range(name: &'static str, value: u64, min: u64, max: u64, max_name: &str) -> Result<(), StorageError> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(StorageError::InvalidOption {
            name,
            value: value.to_string(),
            expected: format!("an integer from {min} to {max} ({max_name})"),
        })
    }
}

/// A sharded table's definition, as the catalog stores it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "TableDefRepr", try_from = "TableDefRepr")]
pub struct TableDef {
    pub name: String,
    /// Every field nullable, each of a supported type ([`check_column_type`]).
    pub schema: SchemaRef,
    /// Column names, in order: non-empty, each a column of the schema, none repeated.
    pub shard_key: Vec<String>,
    /// `1..=MAX_SHARDS`.
    pub shards: u32,
    /// `1..=world size`.
    pub replicas: u32,
    pub sync_mode: SyncMode,
    pub delay: DelaySettings,
    /// The placement function this table's rows were placed with.
    pub placement: PlacementVersion,
}

impl TableDef {
    /// Builds and validates a table from `CREATE TABLE name (schema) WITH (options)`.
    ///
    /// Accepted option keys (ASCII case-insensitive, each at most once): `shard_key` (`'a,b'`,
    /// required), `shards` (default: `world_size`), `replicas` (default 1), `sync_mode`
    /// (`immediate`, the default, or `delay_mode_distributed`), `delay_max_ms`, `delay_max_rows`,
    /// `delay_max_bytes` (defaults [`DelaySettings::default`]). The schema is stored in canonical
    /// form: field metadata and schema metadata are dropped.
    pub fn from_options(
        name: impl Into<String>,
        schema: SchemaRef,
        options: &[(String, String)],
        world_size: u32,
    ) -> Result<TableDef, StorageError> {
        let name = name.into();
        check_world_size(world_size)?;
        let mut seen: HashSet<String> = HashSet::new();
        let mut shard_key: Option<Vec<String>> = None;
        let mut shards = world_size;
        let mut replicas = 1;
        let mut sync_mode = SyncMode::default();
        let mut delay = DelaySettings::default();
        for (raw_key, value) in options {
            let key = raw_key.trim().to_ascii_lowercase();
            if !seen.insert(key.clone()) {
                return Err(StorageError::DuplicateTableOption { key: raw_key.clone(), accepted: TABLE_OPTIONS });
            }
            match key.as_str() {
                "shard_key" => shard_key = Some(key_columns_as_named(&schema, parse_shard_key(&name, value)?)),
                "shards" => {
                    shards = parse_u32("shards", value, &format!("an integer from 1 to {MAX_SHARDS} (MAX_SHARDS)"))?
                }
                "replicas" => {
                    replicas =
                        parse_u32("replicas", value, &format!("an integer from 1 to the world size ({world_size})"))?
                }
                "sync_mode" => sync_mode = value.parse()?,
                "delay_max_ms" => delay.delay_max_ms = parse_u64("delay_max_ms", value, DELAY_MAX_MS_LIMIT)?,
                "delay_max_rows" => delay.delay_max_rows = parse_u64("delay_max_rows", value, DELAY_MAX_ROWS_LIMIT)?,
                "delay_max_bytes" => {
                    delay.delay_max_bytes = parse_u64("delay_max_bytes", value, DELAY_MAX_BYTES_LIMIT)?
                }
                _ => return Err(StorageError::UnknownTableOption { key: raw_key.clone(), accepted: TABLE_OPTIONS }),
            }
        }
        let shard_key = shard_key.ok_or_else(|| StorageError::MissingShardKey { table: name.clone() })?;
        let schema = Arc::new(Schema::new(
            schema
                .fields()
                .iter()
                .map(|f| Field::new(f.name(), f.data_type().clone(), f.is_nullable()))
                .collect::<Vec<_>>(),
        ));
        let def = TableDef {
            name,
            schema,
            shard_key,
            shards,
            replicas,
            sync_mode,
            delay,
            placement: PlacementVersion::CURRENT,
        };
        def.validate(world_size)?;
        Ok(def)
    }

    /// Checks everything about the definition, including that `replicas` fits `world_size`.
    pub fn validate(&self, world_size: u32) -> Result<(), StorageError> {
        self.validate_definition()?;
        check_world_size(world_size)?;
        if self.replicas > world_size {
            return Err(StorageError::InvalidOption {
                name: "replicas",
                value: self.replicas.to_string(),
                expected: format!(
                    "an integer from 1 to the world size ({world_size}): each replica needs its own node"
                ),
            });
        }
        Ok(())
    }

    /// Everything [`TableDef::validate`] checks that does not depend on the cluster's size.
    fn validate_definition(&self) -> Result<(), StorageError> {
        check_table_name(&self.name)?;
        self.check_columns()?;
        self.check_shard_key()?;
        check_range("shards", u64::from(self.shards), 1, u64::from(MAX_SHARDS), "MAX_SHARDS")?;
        if self.replicas == 0 {
            return Err(StorageError::InvalidOption {
                name: "replicas",
                value: "0".to_string(),
                expected: "an integer from 1 to the world size".to_string(),
            });
        }
        self.delay.validate()
    }

    fn check_columns(&self) -> Result<(), StorageError> {
        let fields = self.schema.fields();
        let columns_error = |problem: String| StorageError::InvalidColumns {
            table: self.name.clone(),
            problem,
            expected: format!(
                "1 to {MAX_COLUMNS} (MAX_COLUMNS) columns with distinct names of 1 to {MAX_NAME_BYTES} bytes"
            ),
        };
        if fields.is_empty() {
            return Err(columns_error("the table has no columns".to_string()));
        }
        if fields.len() > MAX_COLUMNS {
            return Err(columns_error(format!("the table has {} columns", fields.len())));
        }
        let mut names = HashSet::with_capacity(fields.len());
        for field in fields {
            let name = field.name();
            if name.is_empty() || name.len() > MAX_NAME_BYTES {
                return Err(columns_error(format!("column name {name:?} is {} bytes long", name.len())));
            }
            if !names.insert(name.as_str()) {
                return Err(columns_error(format!("column {name:?} appears more than once")));
            }
            if !field.is_nullable() {
                return Err(StorageError::NonNullableColumn { table: self.name.clone(), column: name.clone() });
            }
            check_column_type(name, field.data_type())?;
        }
        Ok(())
    }

    fn check_shard_key(&self) -> Result<(), StorageError> {
        let key_error = |problem: String| StorageError::InvalidShardKey {
            table: self.name.clone(),
            shard_key: self.shard_key.join(","),
            problem,
            expected: format!("one or more distinct columns of the table ({})", self.column_list()),
        };
        if self.shard_key.is_empty() {
            return Err(key_error("it names no column".to_string()));
        }
        let mut seen = HashSet::with_capacity(self.shard_key.len());
        for column in &self.shard_key {
            if self.schema.index_of(column).is_err() {
                return Err(key_error(format!("{column:?} is not a column of the table")));
            }
            if !seen.insert(column.as_str()) {
                return Err(key_error(format!("{column:?} appears more than once")));
            }
        }
        Ok(())
    }

    fn column_list(&self) -> String {
        self.schema.fields().iter().map(|f| f.name().as_str()).collect::<Vec<_>>().join(", ")
    }

    /// The indices in the schema of the shard key columns, in shard key order: what
    /// [`crate::placement::shard_of_rows`] takes for a batch with the table's schema.
    pub fn shard_key_indices(&self) -> Result<Vec<usize>, StorageError> {
        self.check_shard_key()?;
        self.shard_key
            .iter()
            .map(|column| {
                self.schema.index_of(column).map_err(|_| StorageError::InvalidShardKey {
                    table: self.name.clone(),
                    shard_key: self.shard_key.join(","),
                    problem: format!("{column:?} is not a column of the table"),
                    expected: format!("columns of the table ({})", self.column_list()),
                })
            })
            .collect()
    }

    /// The ranks that hold `shard`: `(shard + r) mod world_size` for `r = 0..replicas`, the first
    /// being the shard's primary. Empty if `shard` is not a shard of the table or `world_size` is
    /// 0; never more than `world_size` ranks, so the ranks are distinct.
    pub fn replica_ranks(&self, shard: u32, world_size: u32) -> Vec<u32> {
        if world_size == 0 || shard >= self.shards {
            return Vec::new();
        }
        let n = u64::from(world_size);
        (0..self.replicas.min(world_size))
            // The remainder is below world_size, so it fits a u32.
            .map(|r| ((u64::from(shard) + u64::from(r)) % n) as u32)
            .collect()
    }
}

/// Checks that a column of type `data_type` can be stored and placed; the error names the column.
pub fn check_column_type(name: &str, data_type: &DataType) -> Result<(), StorageError> {
    match data_type {
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64
        | DataType::Float32
        | DataType::Float64
        | DataType::Decimal128(_, _)
        | DataType::Boolean
        | DataType::Utf8
        | DataType::Date32
        | DataType::Timestamp(_, _) => Ok(()),
        other => Err(StorageError::UnsupportedColumnType {
            column: name.to_string(),
            data_type: other.to_string(),
            supported: SUPPORTED_COLUMN_TYPES,
        }),
    }
}

fn check_world_size(world_size: u32) -> Result<(), StorageError> {
    if world_size == 0 {
        return Err(StorageError::InvalidOption {
            name: "world_size",
            value: "0".to_string(),
            expected: "at least 1 node".to_string(),
        });
    }
    Ok(())
}

pub(crate) fn check_table_name(name: &str) -> Result<(), StorageError> {
    let mut chars = name.chars();
    let valid_start = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let valid_rest = chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if valid_start && valid_rest && name.len() <= MAX_NAME_BYTES {
        Ok(())
    } else {
        Err(StorageError::InvalidTableName { name: name.to_string(), expected: TABLE_NAME_EXPECTED.to_string() })
    }
}

fn parse_shard_key(table: &str, value: &str) -> Result<Vec<String>, StorageError> {
    let columns: Vec<String> = value.split(',').map(|c| c.trim().to_string()).collect();
    if columns.iter().any(String::is_empty) {
        return Err(StorageError::InvalidShardKey {
            table: table.to_string(),
            shard_key: value.to_string(),
            problem: "it has an empty column name".to_string(),
            expected: "a comma-separated list of column names, e.g. 'a' or 'a,b'".to_string(),
        });
    }
    Ok(columns)
}

/// Shard-key names as the table's columns are named. The SQL parser lowercases unquoted column
/// names (`CREATE TABLE t (Id INT)` makes a column `id`), so `shard_key = 'Id'` names `id`, unless
/// a column is named `Id` exactly (it was quoted).
fn key_columns_as_named(schema: &Schema, columns: Vec<String>) -> Vec<String> {
    columns
        .into_iter()
        .map(|column| {
            let lower = column.to_ascii_lowercase();
            match schema.index_of(&column).is_err() && schema.index_of(&lower).is_ok() {
                true => lower,
                false => column,
            }
        })
        .collect()
}

fn parse_u64(name: &'static str, value: &str, max: u64) -> Result<u64, StorageError> {
    let expected = || format!("an integer from 1 to {max}");
    let parsed: u64 = value.trim().parse().map_err(|_| StorageError::InvalidOption {
        name,
        value: value.to_string(),
        expected: expected(),
    })?;
    if parsed == 0 || parsed > max {
        return Err(StorageError::InvalidOption { name, value: value.to_string(), expected: expected() });
    }
    Ok(parsed)
}

/// Parses a `u32`; the range is checked by [`TableDef::validate`].
fn parse_u32(name: &'static str, value: &str, expected: &str) -> Result<u32, StorageError> {
    value.trim().parse().map_err(|_| StorageError::InvalidOption {
        name,
        value: value.to_string(),
        expected: expected.to_string(),
    })
}

/// The JSON form of a [`TableDef`]: the schema as a list of `{name, type}`.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TableDefRepr {
    name: String,
    columns: Vec<ColumnRepr>,
    shard_key: Vec<String>,
    shards: u32,
    replicas: u32,
    sync_mode: SyncMode,
    delay: DelaySettings,
    placement: PlacementVersion,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ColumnRepr {
    name: String,
    /// Arrow's `Display` of the data type, read back with `DataType::from_str`.
    #[serde(rename = "type")]
    data_type: String,
}

impl From<TableDef> for TableDefRepr {
    fn from(def: TableDef) -> Self {
        TableDefRepr {
            columns: def
                .schema
                .fields()
                .iter()
                .map(|f| ColumnRepr { name: f.name().clone(), data_type: f.data_type().to_string() })
                .collect(),
            name: def.name,
            shard_key: def.shard_key,
            shards: def.shards,
            replicas: def.replicas,
            sync_mode: def.sync_mode,
            delay: def.delay,
            placement: def.placement,
        }
    }
}

impl TryFrom<TableDefRepr> for TableDef {
    type Error = StorageError;

    /// Rebuilds the definition (every column nullable) and checks everything that does not depend
    /// on the world size.
    fn try_from(repr: TableDefRepr) -> Result<Self, Self::Error> {
        let fields = repr
            .columns
            .iter()
            .map(|c| {
                let data_type = DataType::from_str(&c.data_type).map_err(|e| StorageError::UnsupportedColumnType {
                    column: c.name.clone(),
                    data_type: format!("{:?} (not an Arrow type name: {e})", c.data_type),
                    supported: SUPPORTED_COLUMN_TYPES,
                })?;
                Ok(Field::new(&c.name, data_type, true))
            })
            .collect::<Result<Vec<_>, StorageError>>()?;
        let def = TableDef {
            name: repr.name,
            schema: Arc::new(Schema::new(fields)),
            shard_key: repr.shard_key,
            shards: repr.shards,
            replicas: repr.replicas,
            sync_mode: repr.sync_mode,
            delay: repr.delay,
            placement: repr.placement,
        };
        def.validate_definition()?;
        Ok(def)
    }
}

#[cfg(test)]
mod tests;
