//! [`ManyGroupsExec`] against DataFusion's own final aggregation on the same plan, for every key
//! type and aggregate it takes, with nulls in keys and values, beside the small-group partial
//! step, and handing over to DataFusion part-way (a key past its bits, the memory limit).

use std::sync::Arc;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::physical_plan::{ExecutionPlan, collect, displayable};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_proto::physical_plan::DefaultPhysicalExtensionCodec;

use super::{ManyGroupsExec, codec, rewrite};
use crate::settings::{Flag, ShardwiseSettings};
use crate::small_groups;
use crate::small_groups::tests::{BATCH_ROWS, ROWS, answer, table};

fn context_with(config: SessionConfig, memory_limit: Option<usize>) -> SessionContext {
    let mut runtime = RuntimeEnvBuilder::new();
    if let Some(bytes) = memory_limit {
        // The pool kind a node's queries get (`crate::memory_limit`): under a greedy pool one
        // partition's aggregation could take it all, and the other's spill fail for want of
        // the few kilobytes spilling needs (seen in CI).
        runtime = runtime.with_memory_pool(Arc::new(datafusion::execution::memory_pool::FairSpillPool::new(bytes)));
    }
    let ctx = SessionContext::new_with_config_rt(config, runtime.build_arc().expect("runtime"));
    ctx.register_table("t", table()).expect("register");
    ctx
}

fn context() -> SessionContext {
    context_with(SessionConfig::new().with_target_partitions(2).with_batch_size(BATCH_ROWS), None)
}

/// A fresh physical plan of `sql` (a plan's repartitioning runs once, so each run plans anew).
async fn plan(ctx: &SessionContext, sql: &str) -> Arc<dyn ExecutionPlan> {
    ctx.sql(sql).await.expect("sql").create_physical_plan().await.expect("plan")
}

fn uses_many_groups(plan: &Arc<dyn ExecutionPlan>) -> bool {
    displayable(plan.as_ref()).indent(true).to_string().contains("ManyGroupsExec")
}

/// The operator's metric `name`, summed over its partitions.
fn metric(plan: &Arc<dyn ExecutionPlan>, name: &str) -> usize {
    let mut rows = 0;
    plan.apply(|node| {
        if node.is::<ManyGroupsExec>() {
            rows += node.metrics().and_then(|m| m.sum_by_name(name)).map_or(0, |v| v.as_usize());
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .expect("walk");
    rows
}

/// The plan's `ManyGroupsExec` node.
fn many_groups_node(plan: &Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
    let mut found = None;
    plan.apply(|node| {
        if node.is::<ManyGroupsExec>() {
            found = Some(Arc::clone(node));
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .expect("walk");
    found.expect("a ManyGroupsExec")
}

fn handed_over(plan: &Arc<dyn ExecutionPlan>) -> usize {
    metric(plan, "handed_over_rows")
}

/// Every kind it merges; `sum(v_i32)` and `avg(v_i32)` read integers under DataFusion's widening
/// cast, and `avg(v_f)` divides sums of halves, exact in any order.
const AGGREGATES: &str = "count(*), count(v_i32), sum(v_i32), sum(v_i64), sum(v_f), avg(v_i32), avg(v_f), \
                          min(v_i32), max(v_i32), min(v_i64), max(v_i64)";

/// Runs `sql` with DataFusion's aggregation and with [`ManyGroupsExec`] (alone, and above the
/// small-group partial step); the answers must be equal.
async fn equals_datafusion(ctx: &SessionContext, sql: &str) {
    let expected = answer(ctx, plan(ctx, sql).await).await;
    assert!(expected.len() > 1000, "{sql}: {} groups", expected.len());
    let settings = ShardwiseSettings::default();
    let ours = rewrite(plan(ctx, sql).await, &settings).expect("rewrite");
    assert!(uses_many_groups(&ours), "{sql}: not rewritten");
    assert_eq!(answer(ctx, Arc::clone(&ours)).await, expected, "{sql}");
    assert_eq!(handed_over(&ours), 0, "{sql}");
    let small = small_groups::rewrite(plan(ctx, sql).await, &settings).expect("small");
    let both = rewrite(small, &settings).expect("rewrite");
    assert!(uses_many_groups(&both), "{sql}: not rewritten above the small-group step");
    assert_eq!(answer(ctx, both).await, expected, "{sql} above the small-group step");
}

#[tokio::test]
async fn every_key_type_and_aggregate_equals_datafusion() {
    let ctx = context();
    for keys in [
        "k_s, k_wide",
        "k_wide, k_s",
        "k_i8, k_wide, k_date",
        "k_u32, k_i8, k_date, k_s, k_wide",
        "arrow_cast(k_s, 'LargeUtf8'), k_wide, k_i8",
        "arrow_cast(k_s, 'Utf8View'), k_i8, k_u32, k_date, k_wide, v_i32",
    ] {
        equals_datafusion(&ctx, &format!("SELECT {keys}, {AGGREGATES} FROM t GROUP BY {keys}")).await;
    }
    // Grouping sets: the final step groups by the keys and the set's id, as by plain keys.
    let sets = "GROUPING SETS ((k_s, k_wide, k_i8), (k_s, k_wide), (k_wide))";
    equals_datafusion(&ctx, &format!("SELECT k_s, k_wide, k_i8, {AGGREGATES} FROM t GROUP BY {sets}")).await;
}

/// The table eight times over, `big` distinct in every row: 192 000 values, 96 000 in each of
/// the final step's two partitions.
const EIGHT_COPIES: &str = "SELECT k_i8, k_wide, k_u32, k_date, k_s, v_i32, v_i64, v_i64 + o * 1000000000000 AS big, \
                            o, v_f FROM t, (VALUES (0), (1), (2), (3), (4), (5), (6), (7)) AS copies(o)";

#[test]
fn merged_integer_sums_are_exact_in_range_and_an_error_past_it() {
    use super::merge::{Merge, MergeKind};
    use datafusion::arrow::array::{ArrayRef, Int64Array};
    let big = i64::MAX / 2 + 1;
    let mut merge = Merge::new(MergeKind::SumInt);
    let states: ArrayRef = Arc::new(Int64Array::from(vec![Some(big), Some(big), Some(big), None, Some(-big)]));
    merge.update(&[0, 0, 1, 2, 0], 3, &[states]).expect("merge");
    // Group 0 passed the range and came back (2^62 + 2^62 - 2^62); group 2 has no value.
    let values = merge.evaluate(0..3).expect("every total fits");
    let want: ArrayRef = Arc::new(Int64Array::from(vec![Some(big), Some(big), None]));
    assert_eq!(&values, &want);
    let more: ArrayRef = Arc::new(Int64Array::from(vec![Some(big)]));
    merge.update(&[0], 3, &[more]).expect("merge");
    let e = merge.evaluate(0..3).expect_err("group 0 is 2^63").to_string();
    assert!(e.contains("integer overflow in sum: a total is 9223372036854775808"), "{e}");
}

#[tokio::test]
async fn a_key_past_its_bits_hands_over_part_way() {
    // Eight keys get 16 bits each: `big` passes 65 536 values in each partition.
    let ctx = context();
    let keys = "k_i8, k_wide, k_u32, k_date, k_s, v_i32, big, o";
    let sql = format!("SELECT {keys}, count(*), sum(v_f), avg(v_f) FROM ({EIGHT_COPIES}) GROUP BY {keys}");
    let expected = answer(&ctx, plan(&ctx, &sql).await).await;
    assert_eq!(expected.len(), 8 * ROWS);
    let ours = rewrite(plan(&ctx, &sql).await, &ShardwiseSettings::default()).expect("rewrite");
    assert!(uses_many_groups(&ours));
    assert_eq!(answer(&ctx, Arc::clone(&ours)).await, expected);
    assert!(handed_over(&ours) > 0, "no hand-over: {}", displayable(ours.as_ref()).indent(true));
    // A boolean key is not one it takes.
    let sql = format!("SELECT k_s, v_f IS NULL, count(*) FROM ({EIGHT_COPIES}) GROUP BY k_s, v_f IS NULL");
    assert!(!uses_many_groups(&rewrite(plan(&ctx, &sql).await, &ShardwiseSettings::default()).expect("rewrite")));
}

#[tokio::test]
async fn past_the_memory_limit_it_hands_over_to_datafusion() {
    // 96 000 groups per partition with eleven aggregates: some 20 MB, over an 8 MiB limit.
    let config = SessionConfig::new().with_target_partitions(2).with_batch_size(BATCH_ROWS);
    let ctx = context_with(config, Some(8 << 20));
    let keys = "k_s, big, k_i8";
    let sql = format!("SELECT {keys}, {AGGREGATES} FROM ({EIGHT_COPIES}) GROUP BY {keys}");
    let unlimited = context();
    let expected = answer(&unlimited, plan(&unlimited, &sql).await).await;
    let ours = rewrite(plan(&ctx, &sql).await, &ShardwiseSettings::default()).expect("rewrite");
    assert!(uses_many_groups(&ours));
    assert_eq!(answer(&ctx, Arc::clone(&ours)).await, expected);
    assert!(handed_over(&ours) > 0, "no hand-over");
}

#[tokio::test]
async fn other_aggregates_keys_and_the_setting_keep_datafusions_aggregation() {
    let ctx = context();
    for sql in [
        "SELECT k_s, count(*) FROM t GROUP BY k_s",
        "SELECT k_s, k_wide, median(v_f) FROM t GROUP BY k_s, k_wide",
        "SELECT k_s, k_wide, array_agg(v_i32) FROM t GROUP BY k_s, k_wide",
        "SELECT k_s, k_wide, min(v_f) FROM t GROUP BY k_s, k_wide",
        "SELECT k_s, k_wide, sum(v_i32) FILTER (WHERE v_i32 > 0) FROM t GROUP BY k_s, k_wide",
        "SELECT v_f, k_s, count(*) FROM t GROUP BY v_f, k_s",
    ] {
        let plan = ctx.sql(sql).await.expect("sql").create_physical_plan().await.expect("plan");
        let ours = rewrite(Arc::clone(&plan), &ShardwiseSettings::default()).expect("rewrite");
        assert!(!uses_many_groups(&ours), "{sql}: rewritten");
    }
    let sql = "SELECT k_s, k_wide, count(*) FROM t GROUP BY k_s, k_wide";
    let plan = ctx.sql(sql).await.expect("sql").create_physical_plan().await.expect("plan");
    let off = ShardwiseSettings { many_groups_aggregation: Flag(false), ..Default::default() };
    assert!(!uses_many_groups(&rewrite(Arc::clone(&plan), &off).expect("rewrite")));
    assert!(uses_many_groups(&rewrite(plan, &ShardwiseSettings::default()).expect("rewrite")));
}

#[tokio::test]
async fn the_node_survives_encoding() {
    let ctx = context();
    let sql = format!("SELECT k_s, k_wide, {AGGREGATES} FROM t GROUP BY k_s, k_wide");
    let plan = ctx.sql(&sql).await.expect("sql").create_physical_plan().await.expect("plan");
    let ours = rewrite(Arc::clone(&plan), &ShardwiseSettings::default()).expect("rewrite");
    let node = many_groups_node(&ours);
    let bytes = codec::encode(&node, &DefaultPhysicalExtensionCodec {}).expect("encode").expect("ours");
    let input = Arc::clone(node.children()[0]);
    let back = codec::decode(&bytes, input, &ctx.task_ctx(), &DefaultPhysicalExtensionCodec {}).expect("decode");
    let shown = |p: &Arc<dyn ExecutionPlan>| displayable(p.as_ref()).indent(true).to_string();
    assert_eq!(shown(&back), shown(&node));
    for cut in [0, 5, bytes.len() / 2] {
        let input = Arc::clone(node.children()[0]);
        assert!(codec::decode(&bytes[..cut], input, &ctx.task_ctx(), &DefaultPhysicalExtensionCodec {}).is_err());
    }
}

#[tokio::test]
async fn small_buckets_leave_in_full_batches() {
    // About 19 000 groups in 2 partitions of 64 buckets each (some 150 groups a bucket): the
    // answer still comes in batches of `batch_size` rows, one short batch per partition.
    let ctx = context();
    let sql = "SELECT k_s, v_i32, count(*) FROM t GROUP BY k_s, v_i32";
    let ours = rewrite(plan(&ctx, sql).await, &ShardwiseSettings::default()).expect("rewrite");
    assert!(uses_many_groups(&ours));
    let batches = collect(ours, ctx.task_ctx()).await.expect("run");
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    let short = batches.iter().filter(|b| b.num_rows() < BATCH_ROWS).count();
    assert!(rows > 10 * BATCH_ROWS, "{rows} rows");
    assert!(short <= 2, "{short} short batches of {}", batches.len());
}

#[tokio::test]
async fn many_states_per_group_are_compacted_while_input_arrives() {
    // The partial step passes every row through (told to skip at once), so the final step gets
    // 1.2M states for 3 700 groups: its buckets are compacted as they fill, and the answer is
    // DataFusion's.
    let mut config = SessionConfig::new().with_target_partitions(2).with_batch_size(BATCH_ROWS);
    config.options_mut().execution.skip_partial_aggregation_probe_rows_threshold = 0;
    config.options_mut().execution.skip_partial_aggregation_probe_ratio_threshold = 0.0;
    let ctx = context_with(config, None);
    let sql = "SELECT value % 100 AS a, value % 37 AS b, count(*), sum(value), avg(CAST(value AS DOUBLE)), \
               min(value), max(value) FROM generate_series(1, 1200000) GROUP BY value % 100, value % 37";
    let expected = answer(&ctx, plan(&ctx, sql).await).await;
    assert_eq!(expected.len(), 3700);
    let ours = rewrite(plan(&ctx, sql).await, &ShardwiseSettings::default()).expect("rewrite");
    assert!(uses_many_groups(&ours));
    assert_eq!(answer(&ctx, Arc::clone(&ours)).await, expected);
    let compacted = metric(&ours, "compacted_rows");
    // Nearly every row merged away while the input came (the last rows of each bucket stay).
    assert!(compacted > 900_000, "{compacted} rows compacted");
}

#[tokio::test]
async fn its_memory_reservation_shrinks_as_buckets_are_answered() {
    // 96 000 groups per partition with eleven aggregates: megabytes of buckets at the input's end.
    let ctx = context();
    let keys = "k_s, big, k_i8";
    let sql = format!("SELECT {keys}, {AGGREGATES} FROM ({EIGHT_COPIES}) GROUP BY {keys}");
    let ours = rewrite(plan(&ctx, &sql).await, &ShardwiseSettings::default()).expect("rewrite");
    let node = many_groups_node(&ours);
    // One partition alone: every input batch is in before its first answer, so what the pool
    // holds changes afterwards only by what this partition releases.
    let pool = Arc::clone(&ctx.runtime_env().memory_pool);
    let mut stream = node.execute(0, ctx.task_ctx()).expect("execute");
    let (mut first, mut last, mut rows) = (None, 0, 0);
    while let Some(batch) = futures::StreamExt::next(&mut stream).await {
        rows += batch.expect("batch").num_rows();
        first.get_or_insert(pool.reserved());
        last = pool.reserved();
    }
    let first = first.expect("an answer");
    assert!(rows > 50_000, "{rows} rows");
    assert!(first > last + (2 << 20), "reserved {first} bytes at the first answer, {last} at the last");
}
