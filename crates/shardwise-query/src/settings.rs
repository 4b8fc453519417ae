//! shardwise's own query settings, and the two ways a user sets them, as in ClickHouse:
//! `SET name = value` for the session and a trailing `SETTINGS name = value, ...` clause for one
//! statement.
//!
//! The settings live in DataFusion's configuration as an extension under the `shardwise.`
//! prefix, so DataFusion's own `SET`, `SHOW` and option validation work on them. Users may write
//! the bare name (`SET insert_quorum = 1`); [`qualify_set`] adds the prefix for known names.
//! A `SETTINGS` clause may also name DataFusion options (`datafusion.execution.batch_size`).

use datafusion::common::config::{ConfigExtension, ConfigOptions};
use datafusion::common::extensions_options;
use datafusion::error::DataFusionError;
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::tokenizer::{Token, TokenWithSpan, Tokenizer, Whitespace};

use crate::error::QueryError;

extensions_options! {
    /// shardwise's settings (see docs/sql.md).
    pub struct ShardwiseSettings {
        /// Idempotency key of an INSERT (1 to 256 bytes): a retry with the same id is applied
        /// exactly once. Unset, each insert gets a new one.
        pub insert_id: Option<String>, default = None
        /// The id the query gets in `system.queries` (and for `KILL QUERY`), chosen by the
        /// client as ClickHouse's `query_id` is; 1 to 128 bytes, not that of a query running
        /// on this node. Unset, the node makes one up (a UUID).
        pub query_id: Option<String>, default = None
        /// `immediate` tables: replicas of each shard that must have an insert durable before it
        /// is acknowledged; 0 means all replicas.
        pub insert_quorum: u64, default = 0
        /// ClickHouse's setting (alias `insert_distributed_sync`): 1 makes an INSERT into a
        /// `delay_mode_distributed` table write each shard's replicas before it is acknowledged,
        /// as `immediate` does (`insert_quorum` applies), instead of queueing it in the outbox.
        pub distributed_foreground_insert: Flag, default = Flag(false)
        /// How long `SYSTEM FLUSH DISTRIBUTED` waits for the sync queues to drain.
        pub flush_timeout_ms: u64, default = 60_000
        /// How long `OPTIMIZE TABLE` waits for every node to write and merge its replicas.
        pub optimize_timeout_ms: u64, default = 600_000
        /// ClickHouse's setting: 1 makes `CHECK TABLE` answer one row, `result` (1 when every
        /// replica of every shard was read and agrees with the shard's other replicas); 0 answers
        /// one row per replica, with its rows, checksum, `is_passed` and `message`.
        pub check_query_single_value_result: Flag, default = Flag(true)
        /// How long `CHECK TABLE` waits for each node to read and checksum its replicas.
        pub check_timeout_ms: u64, default = 600_000
        /// How long each step of `REPAIR TABLE` may take on each node: delivering the table's
        /// queued rows, reading the replicas, copying one replica to another.
        pub repair_timeout_ms: PositiveMs, default = PositiveMs::default()
        /// The rank whose replicas `REPAIR TABLE` rebuilds from the other replicas of their
        /// shards even where no majority shows them different (two replicas that differ): the
        /// node whose disk was replaced or whose table files were lost.
        pub repair_rebuild_rank: Option<u64>, default = None
        /// ClickHouse's setting: 0 merges partial aggregates on the initiator; 1 runs the whole
        /// query on every shard and concatenates; 2 does as 1, then ORDER BY and LIMIT on the
        /// initiator. Other non-zero values act as 1.
        pub distributed_group_by_no_merge: u64, default = 0
        /// When the GROUP BY keys include every shard-key column of a table whose placement is
        /// verified, aggregate completely on the shards (exact: groups cannot span shards).
        pub optimize_distributed_group_by_sharding_key: Flag, default = Flag(true)
        /// Where partial aggregates are merged: `initiator`, `shuffle` (by group-key hash, on the
        /// other nodes), or `auto` (shuffle when more than `shuffle_min_groups` groups are
        /// estimated). A non-zero `distributed_group_by_no_merge` takes precedence.
        pub distributed_aggregation: DistributedAggregation, default = DistributedAggregation::Auto
        /// ClickHouse's setting: a WHERE that pins every shard-key column to a few values
        /// (`k = 1`, `k IN (1, 2)`) reads only the shards those values are placed on.
        pub optimize_skip_unused_shards: Flag, default = Flag(true)
        /// `distributed_aggregation = 'auto'` shuffles above this many estimated groups.
        pub shuffle_min_groups: u64, default = 1_000_000
        /// Which replica of a shard runs its fragment: `nearest` (this node first), `in_order`,
        /// `random` or `round_robin`.
        pub load_balancing: LoadBalancing, default = LoadBalancing::Nearest
        /// Stop a query that runs longer than this (0: no limit), with every fragment it started.
        pub max_execution_time_ms: u64, default = 0
        /// 1: answer from the shards that can be reached, with a warning naming the others.
        pub skip_unavailable_shards: Flag, default = Flag(false)
        /// Most bytes of memory one query may take on each node (0: no limit); operators that
        /// can spill to disk do so, the others fail the query.
        pub max_memory_usage: u64, default = 0
        /// Group `Utf8` keys as `Utf8View` (faster interning of short strings) and cast the groups
        /// back; 0 groups them as stored.
        pub string_group_keys_as_views: Flag, default = Flag(true)
        /// `string_group_keys_as_views` applies to a key column of a sharded table with at least
        /// this many distinct values (estimated from a sample); 0: every string key.
        pub string_group_keys_as_views_min_distinct: u64, default = 10_000
        /// Partial aggregation by one to four integer or string keys with only count, sum, avg,
        /// min, max, corr, the variances and median by direct indexing instead of DataFusion's
        /// hash table; 0 uses DataFusion's.
        pub small_group_aggregation: Flag, default = Flag(true)
        /// `small_group_aggregation` runs for at most this many groups per partition (string
        /// keys: at most 4096); past it, the rest of the partition goes to DataFusion's
        /// aggregation.
        pub small_group_aggregation_max_groups: u64, default = 1_048_576
        /// Final aggregation by two to eight integer or string keys with only count, sum, avg,
        /// min and max through packed key ids cut into radix buckets instead of DataFusion's
        /// group table; 0 uses DataFusion's.
        pub many_groups_aggregation: Flag, default = Flag(true)
        /// ClickHouse's setting: the deepest chain of operators (`a OR b OR ...`) or of set
        /// operations (`... UNION ALL ...`) a statement may have; deeper ones are refused
        /// before planning, which recurses once per level.
        pub max_ast_depth: u64, default = 1000
    }
}

impl ConfigExtension for ShardwiseSettings {
    const PREFIX: &'static str = "shardwise";
}

/// The settings a user may name without the `shardwise.` prefix.
pub const SETTING_NAMES: &[&str] = &[
    "insert_id",
    "query_id",
    "insert_quorum",
    "distributed_foreground_insert",
    "flush_timeout_ms",
    "optimize_timeout_ms",
    "check_query_single_value_result",
    "check_timeout_ms",
    "repair_timeout_ms",
    "repair_rebuild_rank",
    "distributed_group_by_no_merge",
    "optimize_distributed_group_by_sharding_key",
    "optimize_skip_unused_shards",
    "distributed_aggregation",
    "shuffle_min_groups",
    "load_balancing",
    "skip_unavailable_shards",
    "max_execution_time_ms",
    "max_memory_usage",
    "string_group_keys_as_views",
    "string_group_keys_as_views_min_distinct",
    "small_group_aggregation",
    "small_group_aggregation_max_groups",
    "many_groups_aggregation",
    "max_ast_depth",
];

/// Makes a `FromStr + Display + Default` type a DataFusion config field: `SET` parses the value
/// (its error names the accepted values) and `SHOW` displays it.
macro_rules! parsed_config_field {
    ($name:ident) => {
        impl datafusion::common::config::ConfigField for $name {
            fn visit<V: datafusion::common::config::Visit>(&self, v: &mut V, key: &str, description: &'static str) {
                v.some(key, self, description)
            }

            fn set(&mut self, _key: &str, value: &str) -> datafusion::error::Result<()> {
                *self = value.parse()?;
                Ok(())
            }

            fn reset(&mut self, _key: &str) -> datafusion::error::Result<()> {
                *self = Self::default();
                Ok(())
            }
        }
    };
}

/// Defines a setting whose value is one of a few words: parsing lists the accepted words.
macro_rules! word_setting {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $word:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
        pub enum $name {
            #[default]
            $($(#[$vdoc])* $variant),+
        }

        impl $name {
            /// The accepted values, as users write them.
            pub const WORDS: &'static [&'static str] = &[$($word),+];

            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $word),+ }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = datafusion::error::DataFusionError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s.trim().to_ascii_lowercase().as_str() {
                    $($word => Ok($name::$variant),)+
                    other => Err(datafusion::error::DataFusionError::Configuration(format!(
                        "{other:?} is not one of {}", Self::WORDS.join(", ")
                    ))),
                }
            }
        }

        parsed_config_field!($name);
    };
}

/// An on/off setting written as ClickHouse users do: `1`/`0` (or `true`/`false`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Flag(pub bool);

impl std::fmt::Display for Flag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0 { "1" } else { "0" })
    }
}

impl std::str::FromStr for Flag {
    type Err = datafusion::error::DataFusionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "1" | "true" => Ok(Flag(true)),
            "0" | "false" => Ok(Flag(false)),
            other => Err(datafusion::error::DataFusionError::Configuration(format!(
                "{other:?} is not one of 0, 1, true, false"
            ))),
        }
    }
}

parsed_config_field!(Flag);

/// A duration in milliseconds that must be at least 1: a step that is given no time at all
/// cannot succeed, so 0 is refused when it is set rather than when the statement runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PositiveMs(pub u64);

/// Ten minutes, as the other step timeouts (`check_timeout_ms`, `optimize_timeout_ms`).
impl Default for PositiveMs {
    fn default() -> Self {
        PositiveMs(600_000)
    }
}

impl PositiveMs {
    pub fn duration(self) -> std::time::Duration {
        std::time::Duration::from_millis(self.0)
    }
}

impl std::fmt::Display for PositiveMs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl std::str::FromStr for PositiveMs {
    type Err = datafusion::error::DataFusionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().parse::<u64>() {
            Ok(ms) if ms >= 1 => Ok(PositiveMs(ms)),
            _ => Err(datafusion::error::DataFusionError::Configuration(format!(
                "expected a whole number of milliseconds from 1 to {}",
                u64::MAX
            ))),
        }
    }
}

parsed_config_field!(PositiveMs);

word_setting! {
    /// `distributed_aggregation`.
    DistributedAggregation {
        /// Merge every partial aggregate on the initiator.
        Initiator = "initiator",
        /// Repartition partial aggregates by group-key hash and merge on the other nodes.
        Shuffle = "shuffle",
        /// Shuffle when more than `shuffle_min_groups` groups are estimated, else `initiator`.
        Auto = "auto",
    }
}

word_setting! {
    /// `load_balancing`: the order in which a shard's replicas are tried.
    LoadBalancing {
        /// The replica on this node first, then the others in replica order.
        Nearest = "nearest",
        /// Replica 0 first, then 1, ...
        InOrder = "in_order",
        /// A random replica first.
        Random = "random",
        /// Each query starts one replica further than the previous one.
        RoundRobin = "round_robin",
    }
}

/// The settings in effect for a statement.
pub fn current(options: &ConfigOptions) -> ShardwiseSettings {
    options.extensions.get::<ShardwiseSettings>().cloned().unwrap_or_default()
}

/// Other names of settings, as ClickHouse keeps its old names: `(alias, setting)`.
/// `statement_timeout`, PostgreSQL's, which drivers and ORMs set, is `max_execution_time_ms`
/// (its value may carry PostgreSQL's units: [`postgres_milliseconds`]).
pub const SETTING_ALIASES: &[(&str, &str)] =
    &[("insert_distributed_sync", "distributed_foreground_insert"), ("statement_timeout", "max_execution_time_ms")];

/// The aliases whose values are PostgreSQL durations (a number of milliseconds, or with a unit).
const DURATION_ALIASES: &[&str] = &["statement_timeout"];

/// A PostgreSQL duration setting's value in milliseconds: `5000`, `'5000'`, `'5s'`, `'1.5min'`,
/// `'250ms'`, `'2h'`, `'1d'` (PostgreSQL's units; a bare number is milliseconds); `None` when it is
/// none of these.
pub fn postgres_milliseconds(value: &str) -> Option<u64> {
    let value = value.trim().trim_matches('\'').trim();
    let split = value.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let number: f64 = number.parse().ok()?;
    let per_unit = match unit.trim() {
        "" | "ms" => 1.0,
        "s" => 1_000.0,
        "min" => 60_000.0,
        "h" => 3_600_000.0,
        "d" => 86_400_000.0,
        "us" => 0.001,
        _ => return None,
    };
    let ms = (number * per_unit).round();
    (ms.is_finite() && ms >= 0.0 && ms < u64::MAX as f64).then_some(ms as u64)
}

/// The setting a name (lower case) stands for: itself, or the setting it is an alias of.
fn canonical(lower: &str) -> &str {
    SETTING_ALIASES.iter().find(|(alias, _)| *alias == lower).map_or(lower, |(_, name)| name)
}

/// The full option key for a setting name as the user wrote it.
pub fn option_key(name: &str) -> String {
    let lower = name.to_ascii_lowercase();
    let name = canonical(&lower);
    if SETTING_NAMES.contains(&name) { format!("{}.{name}", ShardwiseSettings::PREFIX) } else { lower }
}

/// Applies `name = value` pairs to `options`, naming the setting on error: for a known setting
/// what values it accepts, for an unknown name the names of shardwise's settings.
pub fn apply(options: &mut ConfigOptions, pairs: &[(String, String)]) -> Result<(), QueryError> {
    for (name, value) in pairs {
        let key = option_key(name);
        if let Err(e) = options.set(&key, value) {
            let shown = name_as_written(name);
            let reason = if is_known(options, &key) {
                bad_value(&e)
            } else {
                format!("no such setting; shardwise settings: {}", SETTING_NAMES.join(", "))
            };
            return Err(QueryError::BadSetting(format!("{shown} = {value}: {reason}")));
        }
    }
    Ok(())
}

/// The name as the user wrote it: without the `shardwise.` prefix `SET` adds to a shardwise
/// setting ([`qualify_set`]).
fn name_as_written(name: &str) -> &str {
    match name.split_once('.') {
        Some((prefix, rest))
            if prefix.eq_ignore_ascii_case(ShardwiseSettings::PREFIX)
                && SETTING_NAMES.contains(&canonical(&rest.to_ascii_lowercase())) =>
        {
            rest
        }
        _ => name,
    }
}

/// Whether option `key` names a setting (shardwise's or DataFusion's).
fn is_known(options: &ConfigOptions, key: &str) -> bool {
    let shardwise = key.strip_prefix(ShardwiseSettings::PREFIX).and_then(|rest| rest.strip_prefix('.'));
    match shardwise {
        Some(name) => SETTING_NAMES.contains(&name),
        None => options.entries().iter().any(|entry| entry.key == key),
    }
}

/// Why a known setting refused a value, and what it accepts: the word settings' own message
/// (`"x" is not one of ...`), the range of a numeric one, or else DataFusion's message.
fn bad_value(e: &DataFusionError) -> String {
    if let Some(message) = configuration_message(e) {
        return message.to_string();
    }
    match parsed_type(e).and_then(accepted_numbers) {
        Some(accepted) => format!("expected {accepted}"),
        None => e.strip_backtrace(),
    }
}

/// The message of the configuration error inside `e`, if it is one (a word setting's or a
/// flag's `FromStr` error).
fn configuration_message(e: &DataFusionError) -> Option<&str> {
    match e {
        DataFusionError::Configuration(message) => Some(message),
        DataFusionError::Context(_, inner) => configuration_message(inner),
        _ => None,
    }
}

/// The type DataFusion failed to parse the value as (its `Error parsing 'v' as T` context).
fn parsed_type(e: &DataFusionError) -> Option<&str> {
    match e {
        DataFusionError::Context(message, inner) => message
            .strip_prefix("Error parsing '")
            .and_then(|rest| rest.rsplit_once("' as "))
            .map(|(_, type_name)| type_name)
            .or_else(|| parsed_type(inner)),
        _ => None,
    }
}

/// The values a numeric type accepts, in words.
fn accepted_numbers(type_name: &str) -> Option<String> {
    let whole = |min: i128, max: u128| format!("a whole number from {min} to {max}");
    Some(match type_name {
        "u8" => whole(0, u8::MAX.into()),
        "u16" => whole(0, u16::MAX.into()),
        "u32" => whole(0, u32::MAX.into()),
        "u64" => whole(0, u64::MAX.into()),
        "usize" => whole(0, usize::MAX as u128),
        "i8" => whole(i8::MIN.into(), i8::MAX as u128),
        "i16" => whole(i16::MIN.into(), i16::MAX as u128),
        "i32" => whole(i32::MIN.into(), i32::MAX as u128),
        "i64" => whole(i64::MIN.into(), i64::MAX as u128),
        "isize" => whole(isize::MIN as i128, isize::MAX as u128),
        "f32" | "f64" => "a number".to_string(),
        "bool" => "true or false".to_string(),
        _ => return None,
    })
}

pub(crate) fn tokens(sql: &str) -> Result<Vec<TokenWithSpan>, QueryError> {
    Tokenizer::new(&GenericDialect {}, sql)
        .tokenize_with_location()
        .map_err(|e| QueryError::BadSetting(format!("cannot read the statement: {e}")))
}

pub(crate) fn significant(tokens: &[TokenWithSpan]) -> Vec<&TokenWithSpan> {
    tokens.iter().filter(|t| !matches!(t.token, Token::Whitespace(_) | Token::EOF)).collect()
}

/// The tokens of one statement that say something (no whitespace, comments or `;`): what the
/// text-level recognisers of statements no parser knows read.
pub(crate) fn statement_tokens(sql: &str) -> Result<Vec<Token>, QueryError> {
    let all = tokens(sql)?;
    Ok(significant(&all).into_iter().map(|t| t.token.clone()).filter(|t| *t != Token::SemiColon).collect())
}

/// The unquoted word at `i` of `tokens`, lowercased.
pub(crate) fn word_at(tokens: &[Token], i: usize) -> Option<String> {
    match tokens.get(i) {
        Some(Token::Word(w)) if w.quote_style.is_none() => Some(w.value.to_ascii_lowercase()),
        _ => None,
    }
}

/// Byte offset in `sql` of a 1-based (line, column) location, columns counted in characters.
pub(crate) fn byte_offset(sql: &str, line: u64, column: u64) -> usize {
    let mut offset = 0;
    for (i, text) in sql.split_inclusive('\n').enumerate() {
        if i as u64 + 1 == line {
            return offset
                + text.char_indices().nth(column.saturating_sub(1) as usize).map(|(b, _)| b).unwrap_or(text.len());
        }
        offset += text.len();
    }
    sql.len()
}

/// Splits a trailing `SETTINGS a = 1, b = 'x'` clause off `sql`. Returns the statement without it
/// and the pairs in order.
///
/// `SETTINGS` starts the clause only where a setting name and `=` follow it, outside parentheses
/// and not as part of a qualified name: `FROM system.settings`, a column or table named
/// `settings` and `SHOW SETTINGS` are left to the SQL parser.
pub fn split_settings_clause(sql: &str) -> Result<(String, Vec<(String, String)>), QueryError> {
    if !crate::sql_text::mentions(sql, "settings") {
        return Ok((sql.to_string(), Vec::new()));
    }
    let all = tokens(sql)?;
    let toks = significant(&all);
    let mut depth = 0i32;
    let mut at = None;
    for (i, t) in toks.iter().enumerate() {
        match &t.token {
            Token::LParen => depth += 1,
            Token::RParen => depth -= 1,
            Token::Word(w)
                if w.keyword == Keyword::SETTINGS && w.quote_style.is_none() && starts_settings_clause(&toks, i) =>
            {
                // ClickHouse applies a subquery's SETTINGS to that subquery; shardwise's apply to
                // the statement, so one inside parentheses would be silently ignored.
                if depth != 0 {
                    return Err(QueryError::BadSetting(
                        "SETTINGS inside a subquery: settings apply to the whole statement here; give them once, \
                         at the end of the statement"
                            .into(),
                    ));
                }
                at = Some(i);
                break;
            }
            _ => {}
        }
    }
    let Some(at) = at else { return Ok((sql.to_string(), Vec::new())) };
    let mut rest: &[&TokenWithSpan] = &toks[at + 1..];
    if let Some(last) = rest.last()
        && last.token == Token::SemiColon
    {
        rest = &rest[..rest.len() - 1];
    }
    let mut pairs = Vec::new();
    for item in rest.split(|t| t.token == Token::Comma) {
        pairs.push(setting_pair(item)?);
    }
    let start = toks[at].span.start;
    let body = sql[..byte_offset(sql, start.line, start.column)].trim_end().to_string();
    Ok((body, pairs))
}

/// True when the `SETTINGS` word at `toks[at]` is followed by a (possibly dotted) name and `=`,
/// and is not itself part of a dotted name.
pub(crate) fn starts_settings_clause(toks: &[&TokenWithSpan], at: usize) -> bool {
    if at > 0 && toks[at - 1].token == Token::Period {
        return false;
    }
    let mut i = at + 1;
    loop {
        if !matches!(toks.get(i).map(|t| &t.token), Some(Token::Word(_))) {
            return false;
        }
        match toks.get(i + 1).map(|t| &t.token) {
            Some(Token::Period) => i += 2,
            Some(Token::Eq) => return true,
            _ => return false,
        }
    }
}

/// One `name = value` item of a SETTINGS clause: the name may be dotted
/// (`datafusion.execution.batch_size`), the value a number (with its sign), a quoted string or a
/// word.
fn setting_pair(item: &[&TokenWithSpan]) -> Result<(String, String), QueryError> {
    let clause_error = |why: String| {
        QueryError::BadSetting(format!("SETTINGS clause: {why}; expected SETTINGS name = value[, name = value ...]"))
    };
    let Some(eq) = item.iter().position(|t| t.token == Token::Eq) else {
        return Err(clause_error("each setting is name = value".into()));
    };
    let (name_tokens, value_tokens) = (&item[..eq], &item[eq + 1..]);
    let mut name = String::new();
    for (i, t) in name_tokens.iter().enumerate() {
        match (&t.token, i % 2) {
            (Token::Word(w), 0) => name.push_str(&w.value),
            (Token::Period, 1) => name.push('.'),
            (other, _) => return Err(clause_error(format!("{other} cannot be part of a setting name"))),
        }
    }
    if name.is_empty() || name.ends_with('.') {
        return Err(clause_error("a setting name is expected before '='".into()));
    }
    let value = match value_tokens {
        [] => return Err(clause_error(format!("{name} has no value after '='"))),
        // `SETTINGS a = 1 LIMIT 5`: a clause after SETTINGS, which must come last.
        [_, after, ..] if matches!(&after.token, Token::Word(w) if w.keyword != Keyword::NoKeyword) => {
            return Err(clause_error(format!(
                "{} follows the value of {name}, but SETTINGS must be the statement's last clause",
                after.token
            )));
        }
        [one] => match &one.token {
            Token::Number(n, _) => n.clone(),
            Token::SingleQuotedString(s) => s.clone(),
            Token::Word(w) => w.value.clone(),
            other => return Err(clause_error(format!("{other} is not a value (for {name})"))),
        },
        [sign, number] => match (&sign.token, &number.token) {
            (Token::Minus, Token::Number(n, _)) => format!("-{n}"),
            (Token::Plus, Token::Number(n, _)) => n.clone(),
            _ => return Err(clause_error(format!("the value of {name} is one number, string or word"))),
        },
        _ => return Err(clause_error(format!("the value of {name} is one number, string or word"))),
    };
    Ok((name, value))
}

/// `SET insert_quorum = 1` becomes `SET shardwise.insert_quorum = 1`; other statements are
/// returned unchanged.
pub fn qualify_set(sql: &str) -> Result<String, QueryError> {
    if !crate::sql_text::mentions(sql, "set") && !crate::sql_text::mentions(sql, "show") {
        return Ok(sql.to_string());
    }
    let all = tokens(sql)?;
    let toks = significant(&all);
    let is_set = matches!(toks.first().map(|t| &t.token),
        Some(Token::Word(w)) if w.keyword == Keyword::SET || w.keyword == Keyword::RESET);
    let is_show = matches!(toks.first().map(|t| &t.token), Some(Token::Word(w)) if w.keyword == Keyword::SHOW);
    // `SHOW statement_timeout` shows the setting an alias stands for.
    if let (true, Some(t)) = (is_show, toks.get(1))
        && let Token::Word(w) = &t.token
        && w.quote_style.is_none()
        && let lower = w.value.to_ascii_lowercase()
        && canonical(&lower) != lower
    {
        let at = byte_offset(sql, t.span.start.line, t.span.start.column);
        return Ok(format!("{}{}{}", &sql[..at], canonical(&lower), &sql[at + w.value.len()..]));
    }
    if let (true, Some(t)) = (is_set, toks.get(1))
        && let Token::Word(w) = &t.token
        && w.quote_style.is_none()
        && let lower = w.value.to_ascii_lowercase()
        && SETTING_NAMES.contains(&canonical(&lower))
    {
        let at = byte_offset(sql, t.span.start.line, t.span.start.column);
        if DURATION_ALIASES.contains(&lower.as_str()) {
            return duration_set(sql, at, &w.value, &lower);
        }
        // The name as written (its case kept), or the setting an alias stands for.
        let name = if canonical(&lower) == lower { w.value.as_str() } else { canonical(&lower) };
        let rest = &sql[at + w.value.len()..];
        return Ok(format!("{}{}.{name}{rest}", &sql[..at], ShardwiseSettings::PREFIX));
    }
    Ok(sql.to_string())
}

/// `SET statement_timeout = '5s'` (or `TO`, or `RESET statement_timeout`) as the SET of the
/// setting it stands for, in milliseconds; `name` starts at byte `at` of `sql`.
fn duration_set(sql: &str, at: usize, name: &str, lower: &str) -> Result<String, QueryError> {
    let head = &sql[..at];
    let target = format!("{}.{}", ShardwiseSettings::PREFIX, canonical(lower));
    let rest = sql[at + name.len()..].trim().trim_end_matches(';').trim();
    if rest.is_empty() {
        return Ok(format!("{head}{target}"));
    }
    let written = rest
        .strip_prefix('=')
        .or_else(|| rest.get(..2).filter(|to| to.eq_ignore_ascii_case("to")).map(|_| &rest[2..]))
        .map(str::trim)
        .unwrap_or(rest);
    let value = if written.eq_ignore_ascii_case("default") { Some(0) } else { postgres_milliseconds(written) };
    match value {
        Some(ms) => Ok(format!("{head}{target} = {ms}")),
        None => Err(QueryError::BadSetting(format!(
            "{name} = {written}: expected milliseconds, or a number with a unit (ms, s, min, h, d), as in \
             PostgreSQL; it sets max_execution_time_ms"
        ))),
    }
}

/// The statement's first keyword-ish words, lowercased (for recognising statements
/// DataFusion's parser does not know, such as `SYSTEM FLUSH DISTRIBUTED t`).
pub fn leading_words(sql: &str, n: usize) -> Result<Vec<String>, QueryError> {
    let all = tokens(sql)?;
    Ok(all
        .iter()
        .filter(|t| !matches!(t.token, Token::Whitespace(Whitespace::Space | Whitespace::Newline | Whitespace::Tab)))
        .filter(|t| !matches!(t.token, Token::Whitespace(_) | Token::EOF | Token::SemiColon))
        .take(n)
        .map(|t| match &t.token {
            Token::Word(w) if w.quote_style.is_none() => w.value.to_ascii_lowercase(),
            Token::Word(w) => w.value.clone(),
            other => other.to_string(),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_clause_is_split_off() {
        let (body, pairs) = split_settings_clause(
            "INSERT INTO t VALUES (1, 'SETTINGS') SETTINGS insert_id = 'a-1', insert_quorum = 2;",
        )
        .unwrap();
        assert_eq!(body, "INSERT INTO t VALUES (1, 'SETTINGS')");
        assert_eq!(pairs, vec![("insert_id".into(), "a-1".into()), ("insert_quorum".into(), "2".into())]);
        let (body, pairs) = split_settings_clause("SELECT 1").unwrap();
        assert_eq!((body.as_str(), pairs.len()), ("SELECT 1", 0));
        let (body, _) = split_settings_clause("SELECT 'é'\nFROM t SETTINGS a = 1").unwrap();
        assert_eq!(body, "SELECT 'é'\nFROM t");
    }

    #[test]
    fn bad_settings_clause_is_an_error() {
        for sql in [
            "SELECT 1 SETTINGS a = ",
            "SELECT 1 SETTINGS a = 1 b = 2",
            "SELECT 1 SETTINGS a = 1, b",
            "SELECT 1 SETTINGS a = (1)",
            "SELECT 1 SETTINGS a = - 'x'",
        ] {
            let err = split_settings_clause(sql).unwrap_err();
            assert!(err.to_string().contains("SETTINGS clause"), "{sql}: {err}");
        }
        let err = split_settings_clause("SELECT * FROM t SETTINGS insert_id = 'zz' LIMIT 1").unwrap_err();
        assert!(err.to_string().contains("LIMIT follows the value of insert_id, but SETTINGS must be"), "{err}");
        let err =
            split_settings_clause("SELECT count(*) FROM (SELECT g FROM t GROUP BY g SETTINGS a = 1) z").unwrap_err();
        assert!(err.to_string().contains("SETTINGS inside a subquery"), "{err}");
        // A column named settings in a subquery is not a clause.
        assert!(split_settings_clause("SELECT * FROM (SELECT settings FROM t) z SETTINGS a = 1").is_ok());
    }

    #[test]
    fn settings_clause_takes_dotted_names_and_signed_numbers() {
        let (body, pairs) =
            split_settings_clause("SELECT 1 SETTINGS datafusion.execution.batch_size = 1024, x = -1, y = +2").unwrap();
        assert_eq!(body, "SELECT 1");
        let expected = [("datafusion.execution.batch_size", "1024"), ("x", "-1"), ("y", "2")];
        assert_eq!(pairs, expected.map(|(a, b)| (a.to_string(), b.to_string())));
    }

    #[test]
    fn the_word_settings_elsewhere_is_not_a_clause() {
        for sql in [
            "SELECT name FROM system.settings LIMIT 3",
            "SHOW SETTINGS",
            "SELECT 1 AS settings",
            "SELECT 1 settings",
            "CREATE TABLE settings (a INT)",
            "SELECT * FROM settings WHERE settings = 1",
            "SELECT * FROM settings s ORDER BY 1",
            "SELECT 1 SETTINGS a",
        ] {
            let (body, pairs) = split_settings_clause(sql).unwrap();
            assert_eq!((body.as_str(), pairs.len()), (sql, 0), "{sql}");
        }
        let (body, pairs) = split_settings_clause("SELECT * FROM system.settings SETTINGS a = 1").unwrap();
        assert_eq!((body.as_str(), pairs.len()), ("SELECT * FROM system.settings", 1));
    }

    #[test]
    fn set_is_qualified_for_known_names_only() {
        assert_eq!(qualify_set("SET insert_quorum = 1").unwrap(), "SET shardwise.insert_quorum = 1");
        assert_eq!(qualify_set("set Insert_Quorum TO 1").unwrap(), "set shardwise.Insert_Quorum TO 1");
        assert_eq!(qualify_set("SET datafusion.x = 1").unwrap(), "SET datafusion.x = 1");
        assert_eq!(
            qualify_set("SET insert_distributed_sync = 1").unwrap(),
            "SET shardwise.distributed_foreground_insert = 1"
        );
        assert_eq!(option_key("Insert_Distributed_Sync"), "shardwise.distributed_foreground_insert");
        assert_eq!(qualify_set("SELECT 1").unwrap(), "SELECT 1");
    }

    #[test]
    fn statement_timeout_is_max_execution_time_in_postgres_units() {
        let target = "shardwise.max_execution_time_ms";
        assert_eq!(qualify_set("SET statement_timeout = 5000").unwrap(), format!("SET {target} = 5000"));
        assert_eq!(qualify_set("SET statement_timeout TO '5s';").unwrap(), format!("SET {target} = 5000"));
        assert_eq!(qualify_set("set statement_timeout = '1.5min'").unwrap(), format!("set {target} = 90000"));
        assert_eq!(qualify_set("SET statement_timeout = '250ms'").unwrap(), format!("SET {target} = 250"));
        assert_eq!(qualify_set("SET statement_timeout = 0").unwrap(), format!("SET {target} = 0"));
        assert_eq!(qualify_set("SET statement_timeout TO DEFAULT").unwrap(), format!("SET {target} = 0"));
        assert_eq!(qualify_set("RESET statement_timeout").unwrap(), format!("RESET {target}"));
        let err = qualify_set("SET statement_timeout = '5 parsecs'").unwrap_err().to_string();
        assert!(err.contains("statement_timeout = '5 parsecs'") && err.contains("max_execution_time_ms"), "{err}");
        assert_eq!(postgres_milliseconds("2h"), Some(7_200_000));
        assert_eq!(postgres_milliseconds("-1"), None);
        assert_eq!(option_key("statement_timeout"), target);
        assert_eq!(qualify_set("SHOW statement_timeout").unwrap(), "SHOW max_execution_time_ms");
    }

    #[test]
    fn apply_names_the_setting() {
        let mut extensions = datafusion::common::config::Extensions::new();
        extensions.insert(ShardwiseSettings::default());
        let mut options = ConfigOptions::new().with_extensions(extensions);
        apply(&mut options, &[("insert_quorum".into(), "2".into())]).unwrap();
        assert_eq!(current(&options).insert_quorum, 2);
        let err = apply(&mut options, &[("insert_quorum".into(), "many".into())]).unwrap_err();
        assert!(err.to_string().contains("insert_quorum = many"), "{err}");
        let err = apply(&mut options, &[("no_such".into(), "1".into())]).unwrap_err();
        assert!(err.to_string().contains("no_such"), "{err}");
    }

    fn options() -> ConfigOptions {
        let mut extensions = datafusion::common::config::Extensions::new();
        extensions.insert(ShardwiseSettings::default());
        ConfigOptions::new().with_extensions(extensions)
    }

    fn apply_error(name: &str, value: &str) -> String {
        match apply(&mut options(), &[(name.into(), value.into())]) {
            Ok(()) => panic!("{name} = {value} was accepted"),
            Err(QueryError::BadSetting(message)) => message,
            Err(other) => panic!("{name} = {value}: not a BadSetting: {other}"),
        }
    }

    #[test]
    fn a_bad_value_says_what_is_accepted_and_lists_no_names() {
        assert_eq!(
            apply_error("distributed_group_by_no_merge", "-1"),
            "distributed_group_by_no_merge = -1: expected a whole number from 0 to 18446744073709551615"
        );
        assert_eq!(
            apply_error("load_balancing", "bogus"),
            "load_balancing = bogus: \"bogus\" is not one of nearest, in_order, random, round_robin"
        );
        assert_eq!(
            apply_error("skip_unavailable_shards", "yes"),
            "skip_unavailable_shards = yes: \"yes\" is not one of 0, 1, true, false"
        );
        // A step timeout refuses 0 and text alike, saying it starts at 1.
        for value in ["0", "abc", "-5"] {
            assert_eq!(
                apply_error("repair_timeout_ms", value),
                format!("repair_timeout_ms = {value}: expected a whole number of milliseconds from 1 to {}", u64::MAX)
            );
        }
        let batch_size = apply_error("datafusion.execution.batch_size", "x");
        assert_eq!(
            batch_size,
            format!("datafusion.execution.batch_size = x: expected a whole number from 0 to {}", usize::MAX)
        );
        // Every shardwise setting that can refuse a value says what it accepts, never the names.
        for name in SETTING_NAMES.iter().filter(|name| !["insert_id", "query_id"].contains(name)) {
            let message = apply_error(name, "bogus");
            assert!(message.contains("expected a whole number") || message.contains("is not one of"), "{message}");
            assert!(!message.contains("shardwise settings"), "{message}");
        }
    }

    #[test]
    fn an_unknown_name_lists_the_settings() {
        let message = apply_error("no_such", "1");
        assert!(message.starts_with("no_such = 1: no such setting; shardwise settings: insert_id, "), "{message}");
        assert!(message.ends_with("max_ast_depth"), "{message}");
        let message = apply_error("datafusion.execution.no_such", "1");
        assert!(message.contains("no such setting"), "{message}");
    }

    #[test]
    fn set_errors_show_the_name_as_written() {
        // `SET load_balancing = 'bogus'` arrives as shardwise.load_balancing (see qualify_set).
        let qualified = qualify_set("SET Load_Balancing = 'bogus'").unwrap();
        assert_eq!(qualified, "SET shardwise.Load_Balancing = 'bogus'");
        let message = apply_error("shardwise.Load_Balancing", "bogus");
        assert!(message.starts_with("Load_Balancing = bogus: "), "{message}");
        assert_eq!(name_as_written("shardwise.no_such"), "shardwise.no_such");
        assert_eq!(name_as_written("datafusion.execution.batch_size"), "datafusion.execution.batch_size");
    }

    #[test]
    fn leading_words_skip_space() {
        assert_eq!(
            leading_words("  system FLUSH\n distributed t;", 4).unwrap(),
            ["system", "flush", "distributed", "t"]
        );
    }
}
