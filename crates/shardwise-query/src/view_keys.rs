//! String GROUP BY keys are grouped as `Utf8View`, not as the `Utf8` the tables store.
//!
//! Why: DataFusion interns `Utf8View` keys of up to 12 bytes (db-benchmark's `id1`..`id3`, most
//! codes and short names) by comparing one 16-byte view, where `Utf8` keys go through an offset
//! and a byte comparison per probe: with many distinct keys, each probe is a cache miss less.
//! Making the views ([`crate::to_utf8view`]) was 28% of the node's CPU in a profile of
//! `GROUP BY id1` (100 values), whose keys are in cache anyway. So a key is converted when its
//! column has at least `string_group_keys_as_views_min_distinct` (10 000) distinct values,
//! estimated from the same in-memory sample as the shuffle's group estimate, in the same cache
//! ([`GroupEstimates`], reused for [`GROUP_ESTIMATE_TTL_MS`]). On db-benchmark's data (1e7 rows, one node, 2 threads, A/B of
//! the setting in one run) `GROUP BY id3` (100 000 values; q3, q7) took 19-38% less time; q1
//! (100 values) is not converted; q10 (10 million groups, one of its keys converted and cast
//! back) stayed within noise. Tables keep storing `Utf8`: the WAL, the parts and the answers are
//! unchanged.
//!
//! How: a logical optimizer rule. Such a key is grouped by `to_utf8view(key)` under the key's own
//! qualified name, and a projection above the aggregation casts the groups back, so every plan
//! node above sees exactly the schema it was planned with. The conversions change a string's
//! representation, never its value, so equal keys stay equal and the distributed planner sees
//! through them ([`strip_string_casts`]). Keys that are not plain columns of a sharded table
//! (expressions, other tables) are left alone unless the minimum is 0.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::common::tree_node::Transformed;
use datafusion::common::{Column, Result};
use datafusion::datasource::source_as_provider;
use datafusion::logical_expr::expr::Alias;
use datafusion::logical_expr::{Aggregate, Expr, LogicalPlan, Projection, ScalarUDF, TableScan, cast};
use datafusion::optimizer::optimizer::ApplyOrder;
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::ScalarFunctionExpr;
use datafusion::physical_expr::expressions::CastExpr;

#[cfg(doc)]
use crate::dist::estimate::GROUP_ESTIMATE_TTL_MS;
use crate::dist::estimate::{GroupEstimates, Sampled};
use crate::settings;
use crate::sharded_table::ShardedTable;
use crate::to_utf8view::{TO_UTF8VIEW, to_utf8view_udf};

/// The rule. See the module doc.
#[derive(Debug)]
pub struct ViewKeysRule {
    to_utf8view: Arc<ScalarUDF>,
    /// Sharded tables' estimated distinct values; without it only
    /// `string_group_keys_as_views_min_distinct = 0` converts keys.
    estimates: Option<Arc<GroupEstimates>>,
}

impl Default for ViewKeysRule {
    fn default() -> Self {
        ViewKeysRule { to_utf8view: to_utf8view_udf(), estimates: None }
    }
}

impl ViewKeysRule {
    /// The rule, taking the distinct values of sharded tables' key columns from `estimates`.
    pub fn new(estimates: Arc<GroupEstimates>) -> Self {
        ViewKeysRule { estimates: Some(estimates), ..Self::default() }
    }

    /// Whether group key `expr` (of `input`) is grouped as a view: a plain column of a sharded
    /// table with at least `min_distinct` values estimated (any key when `min_distinct` is 0).
    fn worth_a_view(&self, expr: &Expr, input: &LogicalPlan, min_distinct: u64) -> bool {
        if min_distinct == 0 {
            return true;
        }
        let Expr::Column(column) = expr else { return false };
        let Some((scan, name)) = traced_scan_column(input, column) else { return false };
        let Ok(provider) = source_as_provider(&scan.source) else { return false };
        let Some(table) = provider.downcast_ref::<ShardedTable>() else { return false };
        let (table_id, generation) = table.incarnation();
        self.distinct_estimate(table_id, generation, name).is_some_and(|d| d >= min_distinct)
    }

    fn distinct_estimate(&self, table_id: u64, generation: u64, column: String) -> Option<u64> {
        match self.estimates.as_ref()?.estimate(table_id, generation, &[column]).ok()? {
            Sampled::Estimate(e) => Some(e.groups),
            Sampled::NoLocalShard | Sampled::Empty | Sampled::MissingColumn => None,
        }
    }
}

fn is_plain_string(data_type: &DataType) -> bool {
    matches!(data_type, DataType::Utf8 | DataType::LargeUtf8)
}

fn is_string(data_type: &DataType) -> bool {
    is_plain_string(data_type) || *data_type == DataType::Utf8View
}

/// The table scan and column name that `column` of `plan` reads unchanged, through filters,
/// projections and subquery aliases.
fn traced_scan_column<'a>(plan: &'a LogicalPlan, column: &Column) -> Option<(&'a TableScan, String)> {
    let index = plan.schema().index_of_column(column).ok()?;
    match plan {
        LogicalPlan::TableScan(scan) => Some((scan, scan.projected_schema.field(index).name().clone())),
        LogicalPlan::Filter(filter) => traced_scan_column(&filter.input, column),
        LogicalPlan::SubqueryAlias(alias) => {
            let (qualifier, field) = alias.input.schema().qualified_field(index);
            traced_scan_column(&alias.input, &Column::new(qualifier.cloned(), field.name()))
        }
        LogicalPlan::Projection(projection) => match projection.expr.get(index)? {
            Expr::Column(inner) => traced_scan_column(&projection.input, inner),
            Expr::Alias(alias) => match alias.expr.as_ref() {
                Expr::Column(inner) => traced_scan_column(&projection.input, inner),
                _ => None,
            },
            _ => None,
        },
        _ => None,
    }
}

impl OptimizerRule for ViewKeysRule {
    fn name(&self) -> &str {
        "shardwise_view_keys"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::BottomUp)
    }

    fn rewrite(&self, plan: LogicalPlan, config: &dyn OptimizerConfig) -> Result<Transformed<LogicalPlan>> {
        let LogicalPlan::Aggregate(aggregate) = &plan else { return Ok(Transformed::no(plan)) };
        let settings = settings::current(&config.options());
        if !settings.string_group_keys_as_views.0 {
            return Ok(Transformed::no(plan));
        }
        if aggregate.group_expr.iter().any(|e| matches!(e, Expr::GroupingSet(_))) {
            return Ok(Transformed::no(plan));
        }
        let schema = Arc::clone(&aggregate.schema);
        let min_distinct = settings.string_group_keys_as_views_min_distinct;
        let converted: Vec<bool> = aggregate
            .group_expr
            .iter()
            .enumerate()
            .map(|(i, expr)| {
                is_plain_string(schema.field(i).data_type()) && self.worth_a_view(expr, &aggregate.input, min_distinct)
            })
            .collect();
        if !converted.contains(&true) {
            return Ok(Transformed::no(plan));
        }
        let is_converted = |i: usize| converted.get(i).copied().unwrap_or(false);
        let group_expr = aggregate
            .group_expr
            .iter()
            .enumerate()
            .map(|(i, expr)| {
                if !is_converted(i) {
                    return expr.clone();
                }
                let (qualifier, field) = schema.qualified_field(i);
                let view = self.to_utf8view.call(vec![expr.clone().unalias()]);
                Expr::Alias(Alias::new(view, qualifier.cloned(), field.name()))
            })
            .collect();
        let grouped = Aggregate::try_new(Arc::clone(&aggregate.input), group_expr, aggregate.aggr_expr.clone())?;
        // Restores the aggregation's schema: the same qualified names, the original types.
        let restore = schema
            .iter()
            .enumerate()
            .map(|(i, (qualifier, field))| {
                let column = Expr::Column(Column::new(qualifier.cloned(), field.name()));
                if !is_converted(i) {
                    return column;
                }
                let back = cast(column, field.data_type().clone());
                Expr::Alias(Alias::new(back, qualifier.cloned(), field.name()))
            })
            .collect();
        let projection = Projection::try_new(restore, Arc::new(LogicalPlan::Aggregate(grouped)))?;
        Ok(Transformed::yes(LogicalPlan::Projection(projection)))
    }
}

/// `expr` without the conversions between string types around it: casts between `Utf8`,
/// `LargeUtf8` and `Utf8View`, and [`TO_UTF8VIEW`] (which [`ViewKeysRule`] adds); `input` is the
/// schema `expr` reads. They keep the value, and so equality and the shard a key belongs to.
pub fn strip_string_casts<'a>(mut expr: &'a Arc<dyn PhysicalExpr>, input: &Schema) -> &'a Arc<dyn PhysicalExpr> {
    loop {
        let inner = if let Some(cast) = expr.downcast_ref::<CastExpr>() {
            Some(cast.expr()).filter(|_| is_string(cast.cast_type()))
        } else if let Some(function) = expr.downcast_ref::<ScalarFunctionExpr>() {
            match function.args() {
                [arg] if function.name() == TO_UTF8VIEW => Some(arg),
                _ => None,
            }
        } else {
            None
        };
        match inner {
            Some(inner) if inner.data_type(input).is_ok_and(|t| is_string(&t)) => expr = inner,
            _ => return expr,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{ArrayRef, Int64Array, LargeStringArray, RecordBatch, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::arrow::util::pretty::pretty_format_batches;
    use datafusion::datasource::MemTable;
    use datafusion::execution::SessionStateBuilder;
    use datafusion::prelude::{SessionConfig, SessionContext};

    use super::ViewKeysRule;
    use crate::settings::ShardwiseSettings;

    /// `s`: short strings with nulls; `l`: long `LargeUtf8` strings; `n`: integers.
    fn context(with_rule: bool) -> SessionContext {
        let rows = 3000;
        let s: StringArray = (0..rows).map(|i| (i % 7 != 0).then(|| format!("k{}", i % 23))).collect();
        let l: LargeStringArray =
            (0..rows).map(|i| Some(format!("a long key of more than twelve bytes {}", i % 5))).collect();
        let n = Int64Array::from_iter_values((0..rows).map(|i| i % 4));
        let schema = Arc::new(Schema::new(vec![
            Field::new("s", DataType::Utf8, true),
            Field::new("l", DataType::LargeUtf8, true),
            Field::new("n", DataType::Int64, false),
        ]));
        let columns: Vec<ArrayRef> = vec![Arc::new(s), Arc::new(l), Arc::new(n)];
        let batch = RecordBatch::try_new(Arc::clone(&schema), columns).expect("batch");
        let (a, b) = (batch.slice(0, 1000), batch.slice(1000, 2000));
        let table = MemTable::try_new(schema, vec![vec![a], vec![b]]).expect("table");
        let config = SessionConfig::new().with_target_partitions(2).with_option_extension(ShardwiseSettings::default());
        let mut state = SessionStateBuilder::new().with_config(config).with_default_features();
        if with_rule {
            state = state.with_optimizer_rule(Arc::new(ViewKeysRule::default()));
        }
        let ctx = SessionContext::new_with_state(state.build());
        // No sharded table here to estimate from: every string key.
        ctx.state_ref()
            .write()
            .config_mut()
            .options_mut()
            .set("shardwise.string_group_keys_as_views_min_distinct", "0")
            .expect("set");
        ctx.register_table("t", Arc::new(table)).expect("register");
        ctx
    }

    async fn run(ctx: &SessionContext, sql: &str) -> (Arc<Schema>, String) {
        let df = ctx.sql(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
        let schema = Arc::new(df.schema().as_arrow().clone());
        let batches = df.collect().await.unwrap_or_else(|e| panic!("{sql}: {e}"));
        (schema, pretty_format_batches(&batches).expect("format").to_string())
    }

    const QUERIES: &[&str] = &[
        "SELECT s, count(*), sum(n) FROM t GROUP BY s ORDER BY s",
        "SELECT l, s, n, count(*) FROM t GROUP BY l, s, n ORDER BY l, s, n",
        "SELECT t.s AS key, max(l) FROM t GROUP BY t.s ORDER BY key NULLS FIRST",
        "SELECT s, count(*) FROM t GROUP BY s HAVING s > 'k2' AND count(*) > 10 ORDER BY s",
        "SELECT DISTINCT s FROM t ORDER BY s",
        "SELECT upper(s), count(DISTINCT l) FROM t GROUP BY upper(s) ORDER BY 1",
        "SELECT s, n, count(*) FROM t GROUP BY ROLLUP(s, n) ORDER BY s, n",
        "SELECT c, count(*) FROM (SELECT s, count(*) AS c FROM t GROUP BY s) GROUP BY c ORDER BY c",
        "SELECT s, sum(n), rank() OVER (ORDER BY s) FROM t GROUP BY s ORDER BY s",
        "SELECT a.s, a.c, b.c FROM (SELECT s, count(*) AS c FROM t GROUP BY s) a \
         JOIN (SELECT s, sum(n) AS c FROM t GROUP BY s) b ON a.s = b.s ORDER BY a.s",
    ];

    #[tokio::test]
    async fn answers_and_types_are_those_without_the_rule() {
        let (plain, viewed) = (context(false), context(true));
        for sql in QUERIES {
            assert_eq!(run(&viewed, sql).await, run(&plain, sql).await, "{sql}");
        }
    }

    #[tokio::test]
    async fn string_keys_are_grouped_as_views_and_cast_back() {
        let ctx = context(true);
        let explain = |sql: &str| format!("EXPLAIN {sql}");
        let (_, plan) = run(&ctx, &explain("SELECT s, l, count(*) FROM t GROUP BY s, l")).await;
        assert!(plan.contains("to_utf8view(t.s) AS s") && plan.contains("to_utf8view(t.l) AS l"), "{plan}");
        assert!(plan.contains("CAST(t.s AS Utf8) AS s") && plan.contains("CAST(t.l AS LargeUtf8) AS l"), "{plan}");
        // Integer keys and grouping sets are left alone.
        let (_, plan) = run(&ctx, &explain("SELECT n, count(*) FROM t GROUP BY n")).await;
        assert!(!plan.contains("Utf8View") && !plan.contains("to_utf8view"), "{plan}");
        let (_, plan) = run(&ctx, &explain("SELECT s, count(*) FROM t GROUP BY CUBE(s)")).await;
        assert!(!plan.contains("Utf8View") && !plan.contains("to_utf8view"), "{plan}");
        // The setting turns it off.
        run(&ctx, "SET shardwise.string_group_keys_as_views = false").await;
        let (_, plan) = run(&ctx, &explain("SELECT s, count(*) FROM t GROUP BY s")).await;
        assert!(!plan.contains("Utf8View") && !plan.contains("to_utf8view"), "{plan}");
    }
}
