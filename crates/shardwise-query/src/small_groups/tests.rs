//! [`SmallGroupsExec`] against DataFusion's own aggregation on the same plan, for every key type
//! and aggregate it takes, with nulls, keys outside any one window, and a `max_groups` small
//! enough that it hands over to DataFusion part-way.

use std::sync::Arc;

use datafusion::arrow::array::{
    Date32Array, Float64Array, Int8Array, Int32Array, Int64Array, StringArray, UInt32Array,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::common::tree_node::TreeNode;
use datafusion::datasource::MemTable;
use datafusion::physical_plan::{ExecutionPlan, collect, displayable};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_proto::physical_plan::DefaultPhysicalExtensionCodec;

use super::{SmallGroupsExec, codec, rewrite};
use crate::settings::{Flag, ShardwiseSettings};

pub(crate) const ROWS: usize = 24_000;
pub(crate) const BATCH_ROWS: usize = 1000;

/// Two partitions of `ROWS` rows: keys of every type this module takes (with nulls, and keys
/// no one window covers) and values of each type its aggregates read.
pub(crate) fn table() -> Arc<MemTable> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k_i8", DataType::Int8, true),
        Field::new("k_wide", DataType::Int64, true),
        Field::new("k_u32", DataType::UInt32, true),
        Field::new("k_date", DataType::Date32, true),
        Field::new("k_s", DataType::Utf8, true),
        Field::new("v_i32", DataType::Int32, true),
        Field::new("v_i64", DataType::Int64, true),
        Field::new("v_f", DataType::Float64, true),
    ]));
    let batch = |rows: std::ops::Range<usize>| {
        let null_every = |n: usize, i: usize| !i.is_multiple_of(n);
        let cols: Vec<Arc<dyn datafusion::arrow::array::Array>> = vec![
            Arc::new(Int8Array::from_iter(rows.clone().map(|i| null_every(37, i).then_some((i % 100) as i8 - 50)))),
            // 400 keys 10^10 apart: no window covers two of them.
            Arc::new(Int64Array::from_iter(
                rows.clone().map(|i| null_every(41, i).then_some((i % 400) as i64 * 10_000_000_000 - 3)),
            )),
            Arc::new(UInt32Array::from_iter(rows.clone().map(|i| Some(u32::MAX - (i % 50) as u32)))),
            Arc::new(Date32Array::from_iter(rows.clone().map(|i| Some(19_000 + (i % 60) as i32)))),
            Arc::new(StringArray::from_iter(
                rows.clone().map(|i| null_every(43, i).then(|| format!("key-{}", (i * 7) % 300))),
            )),
            Arc::new(Int32Array::from_iter(rows.clone().map(|i| null_every(5, i).then_some(i as i32 - 5000)))),
            Arc::new(Int64Array::from_iter(rows.clone().map(|i| Some(i as i64 * 1_000_003 - (1 << 40))))),
            // Halves: every sum is exact whatever the order of additions.
            Arc::new(Float64Array::from_iter(
                rows.clone().map(|i| null_every(7, i).then_some((i % 1000) as f64 * 0.5)),
            )),
        ];
        RecordBatch::try_new(Arc::clone(&schema), cols).expect("batch")
    };
    let partitions: Vec<Vec<RecordBatch>> = (0..2)
        .map(|p| (p * ROWS / 2..(p + 1) * ROWS / 2).step_by(BATCH_ROWS).map(|at| batch(at..at + BATCH_ROWS)).collect())
        .collect();
    Arc::new(MemTable::try_new(schema, partitions).expect("table"))
}

fn context() -> SessionContext {
    let ctx =
        SessionContext::new_with_config(SessionConfig::new().with_target_partitions(2).with_batch_size(BATCH_ROWS));
    ctx.register_table("t", table()).expect("register");
    ctx
}

/// The sorted rows of `plan`'s answer.
pub(crate) async fn answer(ctx: &SessionContext, plan: Arc<dyn ExecutionPlan>) -> Vec<String> {
    let batches = collect(plan, ctx.task_ctx()).await.expect("run");
    let text = pretty_format_batches(&batches).expect("format").to_string();
    let mut rows: Vec<String> = text.lines().filter(|l| l.starts_with('|')).skip(1).map(String::from).collect();
    rows.sort();
    rows
}

fn uses_small_groups(plan: &Arc<dyn ExecutionPlan>) -> bool {
    displayable(plan.as_ref()).indent(true).to_string().contains("SmallGroupsExec")
}

/// Every kind; `sum(v_i32)`, `avg(v_i32)`, `avg(v_i64 % 1000)`, `sum(CAST(v_i32 + 1 AS DOUBLE))`,
/// `var_pop(v_i32)` and `corr`'s second argument read integers under DataFusion's widening cast.
/// `corr` sums products of halves and integers under 2^53: exact in any order, so equal to the
/// last digit. Welford's variance divides, so a hand-over (which splits a group's rows between
/// two states) changes its last bits: rounded.
const AGGREGATES: &str = "count(*), count(v_i32), sum(v_i32), sum(v_i64), sum(v_f), avg(v_i32), avg(v_f), \
                          avg(v_i64 % 1000), sum(CAST(v_i32 + 1 AS DOUBLE)), min(v_i32), max(v_i32), min(v_i64), \
                          max(v_i64), corr(v_f, v_i32), median(v_f), median(v_i64), round(stddev(v_f), 6), \
                          round(var_pop(v_i32), 3), round(var(v_f), 6), round(stddev_pop(v_f), 6)";

/// Runs `sql` with DataFusion's aggregation and with [`SmallGroupsExec`] (roomy, then so tight a
/// `max_groups` that every partition hands over part-way); the answers must be equal.
async fn equals_datafusion(ctx: &SessionContext, sql: &str) {
    let plan = ctx.sql(sql).await.expect("sql").create_physical_plan().await.expect("plan");
    let expected = answer(ctx, Arc::clone(&plan)).await;
    assert!(expected.len() > 40, "{sql}: {} groups", expected.len());
    for max_groups in [65_536, 7] {
        let settings = ShardwiseSettings { small_group_aggregation_max_groups: max_groups, ..Default::default() };
        let ours = rewrite(Arc::clone(&plan), &settings).expect("rewrite");
        assert!(uses_small_groups(&ours), "{sql}: not rewritten");
        assert_eq!(answer(ctx, ours).await, expected, "{sql} with max_groups {max_groups}");
    }
}

#[tokio::test]
async fn every_key_type_and_aggregate_equals_datafusion() {
    let ctx = context();
    let keys =
        ["k_i8", "k_wide", "k_u32", "k_date", "k_s", "arrow_cast(k_s, 'LargeUtf8')", "arrow_cast(k_s, 'Utf8View')"];
    for key in keys {
        equals_datafusion(&ctx, &format!("SELECT {key} AS k, {AGGREGATES} FROM t GROUP BY {key}")).await;
    }
}

#[tokio::test]
async fn several_keys_equal_datafusion() {
    let ctx = context();
    // Strings and integers on either side of a pair, nulls in both, three and four keys chained,
    // and keys 10^10 apart (400 values) beside 300 strings.
    for keys in ["k_s, k_i8", "k_i8, k_s", "k_date, k_u32, k_s", "k_wide, k_s", "k_u32, k_i8, k_date, k_s"] {
        equals_datafusion(&ctx, &format!("SELECT {keys}, {AGGREGATES} FROM t GROUP BY {keys}")).await;
    }
}

#[tokio::test]
async fn other_aggregates_keys_and_the_setting_keep_datafusions_aggregation() {
    let ctx = context();
    for sql in [
        "SELECT k_s, median(v_f), count(DISTINCT v_i32) FROM t GROUP BY k_s",
        "SELECT k_s, approx_median(v_f) FROM t GROUP BY k_s",
        "SELECT k_s, var(v_f), var(DISTINCT v_f) FROM t GROUP BY k_s",
        "SELECT k_s, k_i8, k_u32, k_date, k_wide, sum(v_i64) FROM t GROUP BY k_s, k_i8, k_u32, k_date, k_wide",
        "SELECT v_f, count(*) FROM t GROUP BY v_f",
        "SELECT k_s, count(*) FILTER (WHERE v_i32 > 0) FROM t GROUP BY k_s",
        "SELECT k_s, min(v_f) FROM t GROUP BY k_s",
    ] {
        let plan = ctx.sql(sql).await.expect("sql").create_physical_plan().await.expect("plan");
        let ours = rewrite(Arc::clone(&plan), &ShardwiseSettings::default()).expect("rewrite");
        assert!(!uses_small_groups(&ours), "{sql}: rewritten");
    }
    let sql = "SELECT k_s, count(*) FROM t GROUP BY k_s";
    let plan = ctx.sql(sql).await.expect("sql").create_physical_plan().await.expect("plan");
    let off = ShardwiseSettings { small_group_aggregation: Flag(false), ..Default::default() };
    assert!(!uses_small_groups(&rewrite(Arc::clone(&plan), &off).expect("rewrite")));
    assert!(uses_small_groups(&rewrite(plan, &ShardwiseSettings::default()).expect("rewrite")));
}

#[tokio::test]
async fn the_node_survives_encoding() {
    let ctx = context();
    let sql = format!("SELECT k_s AS k, {AGGREGATES} FROM t GROUP BY k_s");
    let plan = ctx.sql(&sql).await.expect("sql").create_physical_plan().await.expect("plan");
    let settings = ShardwiseSettings { small_group_aggregation_max_groups: 123, ..Default::default() };
    let ours = rewrite(Arc::clone(&plan), &settings).expect("rewrite");
    let mut found = None;
    ours.apply(|node| {
        if node.is::<SmallGroupsExec>() {
            found = Some(Arc::clone(node));
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    })
    .expect("walk");
    let node = found.expect("a SmallGroupsExec");
    let bytes = codec::encode(&node, &DefaultPhysicalExtensionCodec {}).expect("encode").expect("ours");
    let input = Arc::clone(node.children()[0]);
    let back = codec::decode(&bytes, input, &ctx.task_ctx(), &DefaultPhysicalExtensionCodec {}).expect("decode");
    let shown = |p: &Arc<dyn ExecutionPlan>| displayable(p.as_ref()).indent(true).to_string();
    assert_eq!(shown(&back), shown(&node));
    assert!(shown(&back).contains("max_groups=123"));
    for cut in [0, 5, bytes.len() / 2] {
        let input = Arc::clone(node.children()[0]);
        assert!(codec::decode(&bytes[..cut], input, &ctx.task_ctx(), &DefaultPhysicalExtensionCodec {}).is_err());
    }
}

#[tokio::test]
async fn keys_that_are_nearly_all_distinct_go_to_datafusion_early() {
    // 2 x 150 000 rows, every key distinct: past HANDOVER_PROBE_ROWS rows each partition hands
    // its rest over, long before max_groups.
    let rows_per_partition = 150_000i64;
    let schema =
        Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false), Field::new("v", DataType::Int64, false)]));
    let partitions: Vec<Vec<RecordBatch>> = (0..2)
        .map(|p| {
            (0..rows_per_partition)
                .step_by(BATCH_ROWS)
                .map(|at| {
                    let ids = (p * rows_per_partition + at)..(p * rows_per_partition + at + BATCH_ROWS as i64);
                    let k = Int64Array::from_iter_values(ids.clone());
                    let v = Int64Array::from_iter_values(ids.map(|i| i % 7));
                    RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(k), Arc::new(v)]).expect("batch")
                })
                .collect()
        })
        .collect();
    let ctx = context();
    ctx.register_table("u", Arc::new(MemTable::try_new(schema, partitions).expect("table"))).expect("register");
    let sql = "SELECT count(*), sum(s), sum(k) FROM (SELECT k, sum(v) AS s FROM u GROUP BY k)";
    let plan = ctx.sql(sql).await.expect("sql").create_physical_plan().await.expect("plan");
    let expected = answer(&ctx, Arc::clone(&plan)).await;
    let ours = rewrite(plan, &ShardwiseSettings::default()).expect("rewrite");
    assert!(uses_small_groups(&ours));
    assert_eq!(answer(&ctx, Arc::clone(&ours)).await, expected);
    let mut handed_over = 0;
    ours.apply(|node| {
        if node.is::<SmallGroupsExec>() {
            handed_over = node.metrics().and_then(|m| m.sum_by_name("handed_over_rows")).map_or(0, |v| v.as_usize());
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    })
    .expect("walk");
    let limit = 2 * (rows_per_partition as usize - super::HANDOVER_PROBE_ROWS);
    assert!(handed_over > 0 && handed_over <= limit, "{handed_over} rows handed over");
}

/// Values without nulls in the first batches, then groups whose every value is null, and groups
/// that get their first value after only nulls: `sum`, `min` and `max` keep no per-row record
/// until the first null, so each of these must still come out as DataFusion's.
#[tokio::test]
async fn groups_whose_values_are_null_at_first_or_always_equal_datafusion() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Int64, true),
        Field::new("w", DataType::Float64, true),
    ]));
    let row = |j: usize| -> (i64, Option<i64>) {
        match j {
            0..4000 => ((j % 50) as i64, Some(j as i64 - 2000)),
            4000..8000 => {
                let k = 50 + (j % 30) as i64;
                (k, (k >= 65 && j % 2 == 1).then_some(j as i64))
            }
            _ => {
                let k = 60 + (j % 20) as i64;
                (k, (k < 63).then_some(-(j as i64)))
            }
        }
    };
    let batch = |rows: std::ops::Range<usize>| {
        let (k, v): (Vec<i64>, Vec<Option<i64>>) = rows.map(row).unzip();
        let w: Vec<Option<f64>> = v.iter().map(|v| v.map(|v| v as f64 * 0.5)).collect();
        let cols: Vec<Arc<dyn datafusion::arrow::array::Array>> =
            vec![Arc::new(Int64Array::from(k)), Arc::new(Int64Array::from(v)), Arc::new(Float64Array::from(w))];
        RecordBatch::try_new(Arc::clone(&schema), cols).expect("batch")
    };
    let partition = || (0..12_000).step_by(BATCH_ROWS).map(|at| batch(at..at + BATCH_ROWS)).collect::<Vec<_>>();
    let table = MemTable::try_new(Arc::clone(&schema), vec![partition(), partition()]).expect("table");
    let ctx = context();
    ctx.register_table("late", Arc::new(table)).expect("register");
    equals_datafusion(
        &ctx,
        "SELECT k, sum(v), min(v), max(v), sum(w), count(v), avg(v), count(*) FROM late GROUP BY k",
    )
    .await;
    equals_datafusion(&ctx, "SELECT k, sum(v), min(v), max(v), sum(w) FROM late GROUP BY k").await;
}
