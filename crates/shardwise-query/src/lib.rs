//! shardwise-query: the SQL session layer shared by every front end (Flight SQL now, pgwire and
//! HTTP later).
//!
//! A [`QueryEngine`] owns the DataFusion context, knows the `system` tables, decides which
//! statements may run, runs shardwise's own statements (DDL, flush) through [`TableAccess`], and
//! classifies failures as the user's or the server's ([`QueryError`]).

pub mod access;
pub mod age;
pub mod any_nulls;
pub mod array_literals;
pub mod ast_limits;
pub mod cast_names;
pub mod check_table;
pub mod checked_integers;
pub mod checked_sum;
pub mod clickhouse_functions;
pub mod clickhouse_statements;
pub mod coalesce_types;
pub mod correlated_windows;
pub mod date_intervals;
pub mod date_range;
pub mod ddl;
pub mod decimal_check;
pub mod dist;
pub mod distinct_zero;
pub mod empty_grouping_sets;
pub mod engine;
pub mod error;
mod expression_rules;
pub mod fetch_clause;
pub mod float_min_max;
pub mod format_clause;
pub mod fractional_seconds;
pub mod group_by_modifiers;
pub mod group_topk;
pub mod guarded_operands;
pub mod information_schema_positions;
pub mod insert_exact;
pub mod insert_select;
pub mod insert_values;
pub mod integer_timestamps;
pub mod interval_order;
pub mod interval_scaling;
pub mod interval_text;
pub mod json_keys;
pub mod like_escape;
pub mod limit_by;
pub mod many_groups;
pub mod memory_limit;
pub mod named_windows;
pub mod natural_joins;
pub mod numbered_subqueries;
pub mod numeric_coercion;
pub mod numeric_literals;
pub mod pad_limits;
pub mod parameter_types;
pub mod pg_arrays;
pub mod pg_catalog;
pub mod pg_catalog_tables;
pub mod pg_functions;
pub mod pg_json;
pub mod pg_settings;
pub mod pg_vectors;
pub mod placeholders;
pub mod postgres_names;
pub mod postgres_operators;
pub mod postgres_text;
pub mod predicate_subqueries;
pub mod query_log;
pub mod query_runtime;
pub mod rank_types;
pub mod recursive_terms;
pub mod regexp_replacement;
pub mod repeat_limits;
pub mod repeated_items;
pub mod resident_memory;
pub mod rounding_casts;
pub mod scalar_subqueries;
pub mod server_memory;
pub mod session;
pub mod set_operations;
pub mod set_returning;
pub mod settings;
pub mod sharded_table;
pub mod show_create;
pub mod similar_to;
pub mod skip_unused_shards;
pub mod small_groups;
mod sql_ast;
pub mod sql_split;
pub mod sql_text;
pub mod stop;
pub mod system_settings;
pub mod system_storage;
pub mod system_tables;
pub mod table_listing;
pub mod text_values;
pub mod time_floor;
pub mod time_literals;
pub mod to_utf8view;
pub mod tuples;
mod udaf_wrapper;
mod udf_wrapper;
pub mod unplanned_clauses;
pub mod using_joins;
pub mod view_keys;

pub use access::{
    FragmentOutcome, FragmentReport, InsertOptions, RemoteRows, ReplicaCheckRow, ReplicaRepairRow, ShardData,
    ShardReplicaRow, SyncQueueRow, TableAccess,
};
pub use engine::{Planned, QueryEngine};
pub use error::QueryError;
pub use session::Session;
pub use settings::ShardwiseSettings;

#[cfg(test)]
mod tests;
