//! String GROUP BY keys are grouped as `Utf8View`, not as the `Utf8` the tables store.
//!
//! Why: DataFusion interns `Utf8View` keys of up to 12 bytes (db-benchmark's `id1`..`id3`, most
//! codes and short names) by comparing one 16-byte view, where `Utf8` keys go through an offset
//! and a byte comparison per probe. On the db-benchmark data (1e7 rows, one node, 2 threads, the
//! A/B in BENCHMARKS.md) `GROUP BY id3` (100 000 groups, q3 and q7) took 30% less time; with 100
//! groups the cast costs about what it saves; q10's 10 million groups cost 6% more (the groups
//! are cast back). Tables keep storing `Utf8` (the WAL, parts and answers are unchanged).
//!
//! How: a logical optimizer rule. An aggregation whose group key is `Utf8` or `LargeUtf8` groups by
//! `CAST(key AS Utf8View)` under the key's own qualified name, and a projection above it casts the
//! (few) groups back, so every plan node above sees exactly the schema it was planned with. The
//! casts change a string's representation, never its value, so equal keys stay equal and the
//! distributed planner sees through them ([`strip_string_casts`]).

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::common::tree_node::Transformed;
use datafusion::common::{Column, Result};
use datafusion::logical_expr::expr::Alias;
use datafusion::logical_expr::{Aggregate, Expr, LogicalPlan, Projection, cast};
use datafusion::optimizer::optimizer::ApplyOrder;
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::CastExpr;

use crate::settings;

/// The rule. See the module doc.
#[derive(Debug, Default)]
pub struct ViewKeysRule;

fn is_plain_string(data_type: &DataType) -> bool {
    matches!(data_type, DataType::Utf8 | DataType::LargeUtf8)
}

fn is_string(data_type: &DataType) -> bool {
    is_plain_string(data_type) || *data_type == DataType::Utf8View
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
        if !settings::current(&config.options()).string_group_keys_as_views.0 {
            return Ok(Transformed::no(plan));
        }
        if aggregate.group_expr.iter().any(|e| matches!(e, Expr::GroupingSet(_))) {
            return Ok(Transformed::no(plan));
        }
        let keys = aggregate.group_expr.len();
        let schema = Arc::clone(&aggregate.schema);
        let is_converted = |i: usize| i < keys && is_plain_string(schema.field(i).data_type());
        if !(0..keys).any(is_converted) {
            return Ok(Transformed::no(plan));
        }
        let group_expr = aggregate
            .group_expr
            .iter()
            .enumerate()
            .map(|(i, expr)| {
                if !is_converted(i) {
                    return expr.clone();
                }
                let (qualifier, field) = schema.qualified_field(i);
                let view = cast(expr.clone().unalias(), DataType::Utf8View);
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

/// `expr` without the casts between string types (`Utf8`, `LargeUtf8`, `Utf8View`) around it, such
/// as those [`ViewKeysRule`] adds; `input` is the schema `expr` reads. Such a cast keeps the
/// value, and so equality and the shard a key belongs to.
pub fn strip_string_casts<'a>(mut expr: &'a Arc<dyn PhysicalExpr>, input: &Schema) -> &'a Arc<dyn PhysicalExpr> {
    while let Some(cast) = expr.downcast_ref::<CastExpr>()
        && is_string(cast.cast_type())
        && cast.expr().data_type(input).is_ok_and(|t| is_string(&t))
    {
        expr = cast.expr();
    }
    expr
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
            state = state.with_optimizer_rule(Arc::new(ViewKeysRule));
        }
        let ctx = SessionContext::new_with_state(state.build());
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
        assert!(plan.contains("CAST(t.s AS Utf8View) AS s") && plan.contains("CAST(t.l AS Utf8View) AS l"), "{plan}");
        assert!(plan.contains("CAST(t.s AS Utf8) AS s") && plan.contains("CAST(t.l AS LargeUtf8) AS l"), "{plan}");
        // Integer keys and grouping sets are left alone.
        let (_, plan) = run(&ctx, &explain("SELECT n, count(*) FROM t GROUP BY n")).await;
        assert!(!plan.contains("Utf8View"), "{plan}");
        let (_, plan) = run(&ctx, &explain("SELECT s, count(*) FROM t GROUP BY CUBE(s)")).await;
        assert!(!plan.contains("Utf8View"), "{plan}");
        // The setting turns it off.
        run(&ctx, "SET shardwise.string_group_keys_as_views = false").await;
        let (_, plan) = run(&ctx, &explain("SELECT s, count(*) FROM t GROUP BY s")).await;
        assert!(!plan.contains("Utf8View"), "{plan}");
    }
}
