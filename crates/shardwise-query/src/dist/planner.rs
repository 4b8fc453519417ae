//! The distributed planner: a physical optimizer rule, run after all of DataFusion's, that cuts
//! the plan where data must leave the shards and puts a [`FragmentExec`] there.
//!
//! With `distributed_group_by_no_merge = 0` (the default) it walks up from each shard scan
//! through operators that keep partitions apart (filter, projection, partial aggregation,
//! per-partition sort and limit, batch coalescing). That chain is the fragment; everything above
//! it runs on the initiator: the final merge of partial aggregates, HAVING, ORDER BY, LIMIT,
//! joins, windows. The cut is exactly where DataFusion itself exchanges data between partitions,
//! so the result is the single-node result.
//!
//! Automatic no-merge (`optimize_distributed_group_by_sharding_key = 1`): when the GROUP BY keys
//! of an aggregation directly over a table include every shard-key column, no group spans two
//! shards, so the fragment extends through the exchange to the final aggregation and each shard
//! returns finished groups. Only for a table placed by a known placement function, and each
//! replica refuses to run such a fragment if it holds rows that did not arrive through that
//! placement.
//!
//! `distributed_group_by_no_merge = 1` (and values other than 0 and 2): the whole query runs on
//! each shard and the initiator concatenates. `= 2`: as 1, then the initiator merges by the
//! query's ORDER BY and applies LIMIT/OFFSET (shards get LIMIT offset+limit). Both need a query
//! that reads one distributed table, once.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::compute::SortOptions;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::error::{DataFusionError, Result};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::scalar_subquery::ScalarSubqueryExpr;
use datafusion::physical_expr::{LexOrdering, PhysicalExpr, PhysicalSortExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
#[allow(deprecated)] // DataFusion 55 no longer inserts it, but older plans and tests may hold it.
use datafusion::physical_plan::coalesce_batches::CoalesceBatchesExec;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::limit::{GlobalLimitExec, LocalLimitExec};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::partitioned_topk::PartitionedTopKExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::union::{InterleaveExec, UnionExec};
use datafusion::physical_plan::windows::{BoundedWindowAggExec, WindowAggExec};
use datafusion::physical_plan::{Distribution, ExecutionPlan, ExecutionPlanProperties, Partitioning};
use shardwise_cluster::ClusterView;

use super::codec::{LeafAssignment, ShardwiseCodec};
use super::estimate::{GroupEstimates, Sampled};
use super::fragment::{FragmentExec, Placement, Strategy, StrategyKind};
use super::query_order::{OrderKey, QueryOrder};
use super::scan::ShardScanExec;
use super::shuffle::{ShuffleReaderExec, ShuffleSource};
use crate::access::TableAccess;
use crate::group_topk::{GroupTopKExec, RowNumberExec, TopKStep};
use crate::many_groups;
use crate::settings::{self, DistributedAggregation, LoadBalancing, ShardwiseSettings};
use crate::small_groups;
use crate::view_keys::strip_string_casts;

/// From this many nodes on, the initiator of a shuffle merges no bucket (it only concatenates the
/// others' results); with fewer, every node merges one.
pub const SHUFFLE_INITIATOR_FREE_MIN_NODES: u32 = 3;

/// The rule. See the module doc.
#[derive(Debug)]
pub struct DistributeRule {
    access: Arc<dyn TableAccess>,
    cluster: Arc<dyn ClusterView>,
    /// What `distributed_aggregation = 'auto'` decides from.
    estimates: Arc<GroupEstimates>,
}

impl DistributeRule {
    pub fn new(access: Arc<dyn TableAccess>, cluster: Arc<dyn ClusterView>, estimates: Arc<GroupEstimates>) -> Self {
        DistributeRule { access, cluster, estimates }
    }
}

impl PhysicalOptimizerRule for DistributeRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        let mut scans = Vec::new();
        let mut distributed = false;
        plan.apply(|node| {
            if let Some(scan) = node.downcast_ref::<ShardScanExec>() {
                scans.push(scan.table().name.clone());
            }
            distributed |= node.is::<FragmentExec>();
            Ok(TreeNodeRecursion::Continue)
        })?;
        if scans.is_empty() || distributed {
            return Ok(plan);
        }
        let planner = Planner { rule: self, settings: settings::current(config) };
        match planner.settings.distributed_group_by_no_merge {
            0 => planner.merge_plan(plan),
            mode => planner.no_merge_plan(plan, mode, &scans, config),
        }
    }

    fn name(&self) -> &str {
        "shardwise_distribute"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

struct Planner<'a> {
    rule: &'a DistributeRule,
    settings: ShardwiseSettings,
}

/// A subtree of partition-local operators over one shard scan, not yet cut.
struct Chain {
    plan: Arc<dyn ExecutionPlan>,
    /// The chain contains a finished aggregation (automatic no-merge): it must see whole shards.
    whole_shard: bool,
    /// Why the automatic no-merge was or was not used, for the aggregation in the chain.
    auto_reason: Option<String>,
    has_aggregate: bool,
}

enum Sub {
    Done(Arc<dyn ExecutionPlan>),
    Chain(Chain),
}

/// `node` over `children`. An interleave (a union of inputs hash-partitioned alike) whose inputs
/// are no longer partitioned alike, now that fragments produce some of them, becomes a plain union;
/// the node above it restores the hash partitioning if it needs it (see `Planner::rewrite`).
fn with_children(
    node: Arc<dyn ExecutionPlan>,
    children: Vec<Arc<dyn ExecutionPlan>>,
) -> Result<Arc<dyn ExecutionPlan>> {
    if node.is::<InterleaveExec>() {
        let first = children.first().map(|c| c.output_partitioning().clone());
        let alike = children.iter().all(|c| Some(c.output_partitioning()) == first.as_ref())
            && matches!(first, Some(Partitioning::Hash(..)));
        if !alike {
            return UnionExec::try_new(children);
        }
    }
    replace_children_if_necessary(node, children)
}

/// `repartition`, which restores the hash partitioning `old` had, made to keep `old`'s ordering
/// too: the operators above were planned on it (a join keeps its probe side's order, and the
/// ORDER BY or window above it then sorts nothing itself). A plain repartition interleaves the
/// sorted streams of the fragment's shards, so rows came back out of order, or a window failed
/// on rows it had been told were sorted. Merged in order where the input is sorted; sorted again
/// within each partition where that is not enough.
fn restore_ordering(old: &Arc<dyn ExecutionPlan>, repartition: RepartitionExec) -> Result<Arc<dyn ExecutionPlan>> {
    let Some(ordering) = old.output_ordering().cloned() else { return Ok(Arc::new(repartition)) };
    let restored: Arc<dyn ExecutionPlan> = Arc::new(repartition.with_preserve_order());
    if restored.equivalence_properties().ordering_satisfy(ordering.clone())? {
        return Ok(restored);
    }
    Ok(Arc::new(SortExec::new(ordering, restored).with_preserve_partitioning(true)))
}

/// Identity of a plan node within one optimization pass.
fn node_id(plan: &Arc<dyn ExecutionPlan>) -> usize {
    Arc::as_ptr(plan) as *const () as usize
}

impl Planner<'_> {
    /// `distributed_group_by_no_merge = 0`.
    fn merge_plan(&self, plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
        let mut auto = AutoNoMerge::default();
        let choice = ShuffleChoice {
            mode: self.settings.distributed_aggregation,
            skip_unavailable_shards: self.settings.skip_unavailable_shards.0,
            min_groups: self.settings.shuffle_min_groups,
            world_size: self.rule.access.world_size(),
            estimates: self.rule.estimates.as_ref(),
        };
        auto.scan(&plan, self.settings.optimize_distributed_group_by_sharding_key.0, &choice)?;
        match self.rewrite(plan, &auto)? {
            Sub::Done(plan) => Ok(plan),
            Sub::Chain(chain) => self.wrap(chain),
        }
    }

    #[allow(deprecated)] // required_input_distribution: DataFusion 55 still derives the new API from it
    fn rewrite(&self, node: Arc<dyn ExecutionPlan>, auto: &AutoNoMerge) -> Result<Sub> {
        if node.is::<ShardScanExec>() {
            return Ok(Sub::Chain(Chain { plan: node, whole_shard: false, auto_reason: None, has_aggregate: false }));
        }
        let children: Vec<Arc<dyn ExecutionPlan>> = node.children().into_iter().cloned().collect();
        let mut subs = Vec::with_capacity(children.len());
        for child in &children {
            subs.push(self.rewrite(Arc::clone(child), auto)?);
        }
        if matches!(subs.as_slice(), [Sub::Chain(_)]) {
            let id = node_id(&node);
            let is_partial = node.downcast_ref::<AggregateExec>().is_some_and(|a| *a.mode() == AggregateMode::Partial);
            let role = auto.path.get(&id).copied();
            if role == Some(PathRole::ShuffleFinal) {
                return Ok(Sub::Done(self.shuffle(node, auto)?));
            }
            let whole_shard_below = matches!(subs.as_slice(), [Sub::Chain(c)] if c.whole_shard);
            // Not while partial aggregation states are on their way to a merge above.
            let open_aggregate = matches!(subs.as_slice(), [Sub::Chain(c)] if c.has_aggregate && !c.whole_shard);
            if role.is_none()
                && !is_partial
                && !open_aggregate
                && let Some(why) = self.colocated_repartition(&node, auto)?
            {
                let Some(Sub::Chain(chain)) = subs.pop() else { return unreachable_chain() };
                return Ok(Sub::Chain(Chain {
                    plan: node,
                    whole_shard: true,
                    auto_reason: Some(chain.auto_reason.unwrap_or(why)),
                    has_aggregate: chain.has_aggregate,
                }));
            }
            // Operators that need whole groups of rows together: on the shard only when the rows
            // below are partitioned by keys that include the shard key.
            let window_in_shard = whole_shard_below
                && (node.is::<BoundedWindowAggExec>()
                    || node.is::<WindowAggExec>()
                    || node.is::<PartitionedTopKExec>()
                    || node.downcast_ref::<GroupTopKExec>().is_some_and(|t| t.step() == TopKStep::Final)
                    || node.is::<RowNumberExec>());
            if is_partial || role.is_some() || is_partition_local(&node) || window_in_shard {
                let Some(Sub::Chain(chain)) = subs.pop() else { return unreachable_chain() };
                let finishes = role == Some(PathRole::NoMergeFinal);
                return Ok(Sub::Chain(Chain {
                    plan: node,
                    whole_shard: chain.whole_shard || finishes,
                    // A finished aggregation below names why its groups stay on the shard; a
                    // partial one above it would otherwise replace that with its own verdict.
                    auto_reason: match is_partial && !chain.whole_shard {
                        true => auto.reasons.get(&id).cloned(),
                        false => chain.auto_reason,
                    },
                    has_aggregate: chain.has_aggregate || is_partial,
                }));
            }
        }
        let mut changed = false;
        let mut new_children = Vec::with_capacity(subs.len());
        let required = node.required_input_distribution();
        for (i, sub) in subs.into_iter().enumerate() {
            let new_child = match sub {
                Sub::Done(plan) => plan,
                Sub::Chain(chain) => {
                    changed = true;
                    self.wrap(chain)?
                }
            };
            // A fragment's rows are placed by shard or bucket, not by DataFusion's hash: where
            // this node relies on that hash (a partitioned join, say), restore it. The fragment
            // may be under other operators (a shuffle's concatenation, a union that was an
            // interleave): whatever no longer has the partitioning the old child had.
            let new_child = match (required.get(i), children.get(i)) {
                (Some(Distribution::KeyPartitioned(exprs) | Distribution::HashPartitioned(exprs)), Some(old))
                    if new_child.output_partitioning() != old.output_partitioning() =>
                {
                    let n = old.output_partitioning().partition_count();
                    let repartition = RepartitionExec::try_new(new_child, Partitioning::Hash(exprs.clone(), n))?;
                    restore_ordering(old, repartition)?
                }
                // With one partition per node (one core), DataFusion plans a global aggregate or
                // sort straight over the scan; a fragment has a partition per shard or slice,
                // and this node would then answer once per partition.
                (Some(Distribution::SinglePartition), _) if new_child.output_partitioning().partition_count() > 1 => {
                    Arc::new(CoalescePartitionsExec::new(new_child))
                }
                _ => new_child,
            };
            new_children.push(new_child);
        }
        let changed = changed || new_children.iter().zip(&children).any(|(a, b)| !Arc::ptr_eq(a, b));
        Ok(Sub::Done(if changed { with_children(node, new_children)? } else { node }))
    }

    /// `Some(why)` when `node` repartitions rows by a hash of keys that include every shard-key
    /// column of the table below it: rows with equal keys are on one shard already, so the
    /// repartition (and what needs it, such as a window `PARTITION BY` those keys) can run on
    /// each shard. Same conditions as the automatic no-merge.
    fn colocated_repartition(&self, node: &Arc<dyn ExecutionPlan>, auto: &AutoNoMerge) -> Result<Option<String>> {
        let Some(repartition) = node.downcast_ref::<RepartitionExec>() else { return Ok(None) };
        let Partitioning::Hash(exprs, _) = repartition.partitioning() else { return Ok(None) };
        if !self.settings.optimize_distributed_group_by_sharding_key.0 {
            return Ok(None);
        }
        let input = repartition.input();
        let scan = find_scan(input)?;
        let keys: Vec<String> =
            exprs.iter().filter_map(|e| column_of(e, input).and_then(|c| auto.trace(input, c.index()))).collect();
        let table = scan.table();
        if table.shard_key.iter().all(|k| keys.contains(k)) {
            return Ok(Some(format!(
                "rows are partitioned by keys that include the shard key ({}) of {}",
                table.shard_key.join(", "),
                table.name
            )));
        }
        Ok(None)
    }

    /// Cuts a chain: it becomes a fragment run once per slice (or per shard).
    fn wrap(&self, chain: Chain) -> Result<Arc<dyn ExecutionPlan>> {
        let Chain { plan, whole_shard, auto_reason, has_aggregate } = chain;
        let scan = find_scan(&plan)?;
        let strategy = match (whole_shard, has_aggregate) {
            (true, _) => Strategy {
                kind: StrategyKind::NoMerge,
                reason: format!(
                    "automatic: {}; each shard computes its part completely, the initiator concatenates",
                    auto_reason.as_deref().unwrap_or("GROUP BY includes the shard key")
                ),
            },
            (false, true) => Strategy {
                kind: StrategyKind::InitiatorMerge,
                reason: match auto_reason {
                    Some(why) => format!("shards send partial aggregation states, the initiator merges them ({why})"),
                    None => "shards send partial aggregation states, the initiator merges them".into(),
                },
            },
            (false, false) => Strategy {
                kind: StrategyKind::InitiatorMerge,
                reason: "no aggregation next to the data: shards filter and project, the initiator runs the rest"
                    .into(),
            },
        };
        let (plan, targets) = if whole_shard {
            let plan = require_verified_placement(plan)?;
            (plan, scan.shards().into_iter().map(LeafAssignment::WholeShard).collect())
        } else {
            // All the slices of a shard in one target, so that they read one replica at one moment:
            // replicas order their rows differently, and a replica's rows move between reads, so
            // slices by position taken from two reads could skip rows and count others twice.
            let targets = scan
                .shards()
                .into_iter()
                .map(|shard| {
                    LeafAssignment::Slices(scan.parts().iter().filter(|p| p.shard == shard).copied().collect())
                })
                .collect();
            (plan, targets)
        };
        self.fragment(plan, &scan, targets, strategy)
    }

    /// Shuffle aggregation for the final aggregation `final_agg` (see `super::shuffle`).
    fn shuffle(&self, final_agg: Arc<dyn ExecutionPlan>, auto: &AutoNoMerge) -> Result<Arc<dyn ExecutionPlan>> {
        let mut partial = final_agg.children().first().map(|c| Arc::clone(c));
        while let Some(p) = partial.clone().filter(|p| !p.is::<AggregateExec>()) {
            partial = p.children().first().map(|c| Arc::clone(c));
        }
        let partial = partial.ok_or_else(|| DataFusionError::Internal("shuffle: no partial aggregation".into()))?;
        let key_columns = partial
            .downcast_ref::<AggregateExec>()
            .map(|a| a.group_expr().expr().len())
            .ok_or_else(|| DataFusionError::Internal("shuffle: no partial aggregation".into()))?;
        let scan = find_scan(&partial)?;
        let shards = self.placement(&scan)?;
        let access = Arc::clone(&self.rule.access);
        let stage1 = Arc::new(ShardwiseCodec::new(Arc::clone(&access)).encode_plan(Arc::clone(&partial))?);
        // The shards the scan reads (all, unless its WHERE pinned the shard key).
        let read = scan.shards();
        let sources = shards
            .replicas
            .iter()
            .enumerate()
            .filter(|(shard, _)| read.contains(&(*shard as u32)))
            .map(|(shard, replicas)| ShuffleSource { shard: shard as u32, replicas: replicas.clone() })
            .collect();
        // With SHUFFLE_INITIATOR_FREE_MIN_NODES nodes or more the initiator merges no bucket: it
        // only concatenates, so its memory does not grow with the number of groups.
        let world = self.rule.access.world_size().max(1);
        let me = self.rule.cluster.rank();
        let initiator_free = world >= SHUFFLE_INITIATOR_FREE_MIN_NODES;
        let mergers: Vec<u32> = (0..world).filter(|r| !initiator_free || *r != me).collect();
        let buckets = mergers.len() as u32;
        // Planned per execution (the engine plans every statement it runs), so the id is new
        // for every run of the query.
        let exchange_id = uuid::Uuid::new_v4().to_string();
        let reader = ShuffleReaderExec::new(
            exchange_id,
            stage1,
            sources,
            key_columns,
            None,
            buckets,
            partial.schema(),
            Arc::clone(&access),
        );
        let reader: Arc<dyn ExecutionPlan> = Arc::new(reader);
        let stage2 = final_agg
            .transform_up(|n| match Arc::ptr_eq(&n, &partial) {
                true => Ok(Transformed::yes(Arc::clone(&reader))),
                false => Ok(Transformed::no(n)),
            })?
            .data;
        // A bucket's merge by several keys with many groups, by packed key ids (`many_groups`).
        let stage2 = many_groups::rewrite(stage2, &self.settings)?;
        // Bucket b is merged by the b-th merger, or the next one if it is down; the initiator last.
        let replicas = (0..mergers.len())
            .map(|b| {
                let mut r = mergers.clone();
                r.rotate_left(b);
                if initiator_free {
                    r.push(me);
                }
                r
            })
            .collect();
        let placement = Placement {
            table: scan.table().clone(),
            replicas,
            load_balancing: LoadBalancing::InOrder,
            skip_unavailable_shards: false,
            unit: "bucket",
        };
        let strategy = Strategy {
            kind: StrategyKind::Shuffle,
            reason: format!(
                "distributed_aggregation = shuffle: each shard's partial states go by group-key hash to {buckets} \
                 node(s){}, each merges its bucket, the initiator concatenates ({})",
                if initiator_free { " other than the initiator" } else { "" },
                auto.reasons.get(&node_id(&partial)).map(String::as_str).unwrap_or("groups may span shards")
            ),
        };
        let targets = (0..buckets).map(LeafAssignment::Bucket).collect();
        let cluster = Arc::clone(&self.rule.cluster);
        Ok(Arc::new(FragmentExec::try_new(stage2, targets, placement, strategy, access, cluster)?))
    }

    fn fragment(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        scan: &ShardScanExec,
        targets: Vec<LeafAssignment>,
        strategy: Strategy,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let placement = self.placement(scan)?;
        let access = Arc::clone(&self.rule.access);
        let cluster = Arc::clone(&self.rule.cluster);
        // Partial aggregations by a key with few values, by direct indexing (`small_groups`).
        let plan = small_groups::rewrite(plan, &self.settings)?;
        // Final aggregations by several keys with many groups, by packed key ids (`many_groups`).
        let plan = many_groups::rewrite(plan, &self.settings)?;
        Ok(Arc::new(FragmentExec::try_new(plan, targets, placement, strategy, access, cluster)?))
    }

    fn placement(&self, scan: &ShardScanExec) -> Result<Placement> {
        let table = scan.table().clone();
        let catalog = self.rule.access.catalog();
        let entry = catalog.by_id(table.table_id).filter(|e| e.generation == table.generation).ok_or_else(|| {
            DataFusionError::Plan(format!(
                "table {} was dropped or truncated while the query was planned; run it again",
                table.name
            ))
        })?;
        let world_size = self.rule.access.world_size();
        let replicas = (0..table.shards).map(|s| entry.def.replica_ranks(s, world_size)).collect();
        Ok(Placement {
            table,
            replicas,
            load_balancing: self.settings.load_balancing,
            skip_unavailable_shards: self.settings.skip_unavailable_shards.0,
            unit: "shard",
        })
    }

    /// `distributed_group_by_no_merge` = 1, 2 or another non-zero value.
    fn no_merge_plan(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        mode: u64,
        scans: &[String],
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if scans.len() != 1 {
            let reads = match scans {
                [] => "reads no distributed table".to_string(),
                [first, rest @ ..] if rest.iter().all(|t| t == first) => {
                    format!("reads {first} {} times (a join, subquery or CTE over it)", scans.len())
                }
                _ => format!("reads {} distributed tables ({})", scans.len(), scans.join(", ")),
            };
            return Err(DataFusionError::Plan(format!(
                "distributed_group_by_no_merge = {mode} runs the whole query on each shard, which needs a query that \
                 reads one distributed table once; this one {reads}; use distributed_group_by_no_merge = 0"
            )));
        }
        let scan = find_scan(&plan)?;
        let targets: Vec<LeafAssignment> = (0..scan.table().shards).map(LeafAssignment::WholeShard).collect();
        if mode != 2 {
            let strategy = Strategy {
                kind: StrategyKind::NoMerge,
                reason: format!(
                    "distributed_group_by_no_merge = {mode}: each shard runs the complete query, the initiator \
                     concatenates (a key on several shards appears once per shard)"
                ),
            };
            let fragment = self.fragment(plan, &scan, targets, strategy)?;
            return Ok(Arc::new(CoalescePartitionsExec::new(fragment)));
        }
        let order = QueryOrder::installed(config).cloned().unwrap_or_default();
        if let Some(term) = &order.unresolved {
            return Err(DataFusionError::Plan(format!(
                "distributed_group_by_no_merge = 2 orders the shards' rows on the initiator by the ORDER BY, \
                 whose terms must be columns: {term} is an expression; name it in the SELECT list and order by \
                 that name"
            )));
        }
        let (skip, fetch) = (order.skip, order.fetch);
        let shard_fetch = fetch.map(|f| f.saturating_add(skip));
        // The cut: the highest node under the plan's top projections whose rows have every ORDER
        // BY column (a term the SELECT list does not show is below the last projection).
        let mut above = Vec::new();
        let mut cut = plan;
        let ordering = loop {
            if let Some(ordering) = merge_ordering(&order.keys, &cut) {
                break ordering;
            }
            let Some(projection) = cut.downcast_ref::<ProjectionExec>() else {
                return Err(DataFusionError::Plan(format!(
                    "distributed_group_by_no_merge = 2: the ORDER BY columns ({}) are not among the rows the \
                     shards return; use distributed_group_by_no_merge = 0",
                    order.keys.iter().map(|k| k.column.as_str()).collect::<Vec<_>>().join(", ")
                )));
            };
            let input = Arc::clone(projection.input());
            above.push(cut);
            cut = input;
        };
        // Each shard runs the query with LIMIT offset + limit and no OFFSET (a query without a
        // LIMIT of its own keeps any a subquery has).
        let shard_plan = match (skip, fetch) {
            (0, None) => cut,
            _ => widen_top_limit(cut, shard_fetch)?,
        };
        let reason = match &ordering {
            Some(_) => "distributed_group_by_no_merge = 2: each shard runs the complete query, the initiator merges \
                        the shard results by ORDER BY and applies LIMIT"
                .to_string(),
            None => "distributed_group_by_no_merge = 2: each shard runs the complete query; it has no ORDER BY, so \
                     the initiator concatenates and applies LIMIT"
                .to_string(),
        };
        let strategy = Strategy { kind: StrategyKind::NoMergeOrdered, reason };
        let fragment = self.fragment(shard_plan, &scan, targets, strategy)?;
        // Each shard's rows arrive in ORDER BY order (one partition per shard): a merge orders them all.
        let merged: Arc<dyn ExecutionPlan> = match ordering {
            Some(ordering) => Arc::new(SortPreservingMergeExec::new(ordering, fragment).with_fetch(shard_fetch)),
            None => Arc::new(CoalescePartitionsExec::new(fragment)),
        };
        let mut out: Arc<dyn ExecutionPlan> = match (skip, fetch) {
            (0, None) => merged,
            _ => Arc::new(GlobalLimitExec::new(merged, skip, fetch)),
        };
        for projection in above.into_iter().rev() {
            out = replace_children_if_necessary(projection, vec![out])?;
        }
        Ok(out)
    }
}

/// The ordering of `keys` over `node`'s columns: `Some(None)` when there are no keys, `None` when
/// some key is not exactly one of its columns.
fn merge_ordering(keys: &[OrderKey], node: &Arc<dyn ExecutionPlan>) -> Option<Option<LexOrdering>> {
    let schema = node.schema();
    let mut terms = Vec::with_capacity(keys.len());
    for key in keys {
        let mut matching = schema.fields().iter().enumerate().filter(|(_, f)| f.name() == &key.column);
        let (index, _) = matching.next()?;
        if matching.next().is_some() {
            return None;
        }
        let options = SortOptions { descending: key.descending, nulls_first: key.nulls_first };
        terms.push(PhysicalSortExpr::new(Arc::new(Column::new(&key.column, index)), options));
    }
    Some(LexOrdering::new(terms))
}

/// `plan` with the first LIMIT under its top projections (`GlobalLimitExec`) fetching `fetch`
/// rows from the start, for a shard: the initiator applies the OFFSET once over all shards.
fn widen_top_limit(plan: Arc<dyn ExecutionPlan>, fetch: Option<usize>) -> Result<Arc<dyn ExecutionPlan>> {
    if let Some(limit) = plan.downcast_ref::<GlobalLimitExec>() {
        return Ok(Arc::new(GlobalLimitExec::new(Arc::clone(limit.input()), 0, fetch)));
    }
    #[allow(deprecated)]
    let passes = plan.is::<ProjectionExec>() || plan.is::<CoalesceBatchesExec>() || plan.is::<CooperativeExec>();
    match (passes, plan.children().as_slice()) {
        (true, [child]) => {
            let child = widen_top_limit(Arc::clone(child), fetch)?;
            replace_children_if_necessary(plan, vec![child])
        }
        _ => Ok(plan),
    }
}

fn unreachable_chain<T>() -> Result<T> {
    Err(DataFusionError::Internal("distributed planner: a chain vanished".into()))
}

/// Operators that never mix rows of different partitions: they can run next to the data. An
/// expression that reads a scalar subquery (computed once, elsewhere in the plan) keeps its
/// operator on the initiator.
#[allow(deprecated)]
fn is_partition_local(node: &Arc<dyn ExecutionPlan>) -> bool {
    if reads_scalar_subquery(node) {
        return false;
    }
    node.is::<FilterExec>()
        || node.is::<ProjectionExec>()
        || node.is::<CoalesceBatchesExec>()
        || node.is::<CooperativeExec>()
        || node.is::<LocalLimitExec>()
        || node.downcast_ref::<GroupTopKExec>().is_some_and(|t| t.step() == TopKStep::Partial)
        || node.downcast_ref::<SortExec>().is_some_and(|s| s.preserve_partitioning())
}

fn reads_scalar_subquery(node: &Arc<dyn ExecutionPlan>) -> bool {
    let mut found = false;
    let _ = node.apply_expressions(&mut |expr| {
        expr.apply(|e| {
            found |= e.downcast_ref::<ScalarSubqueryExpr>().is_some();
            Ok(if found { TreeNodeRecursion::Stop } else { TreeNodeRecursion::Continue })
        })
    });
    found
}

/// The one shard scan at the bottom of a chain.
fn find_scan(plan: &Arc<dyn ExecutionPlan>) -> Result<ShardScanExec> {
    let mut found = None;
    plan.apply(|node| {
        if let Some(scan) = node.downcast_ref::<ShardScanExec>() {
            found = Some(scan.clone());
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    found.ok_or_else(|| DataFusionError::Internal("distributed planner: a fragment without a shard scan".into()))
}

fn require_verified_placement(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| match node.downcast_ref::<ShardScanExec>() {
        Some(scan) => {
            let scan = scan.clone().with_required_verified_placement(true);
            Ok(Transformed::yes(Arc::new(scan) as Arc<dyn ExecutionPlan>))
        }
        None => Ok(Transformed::no(node)),
    })
    .map(|t| t.data)
}

/// A node between a partial aggregation over a shard scan and its final aggregation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PathRole {
    /// Part of the exchange: the fragment extends through it.
    Exchange,
    /// The final aggregation of an automatic no-merge: the fragment's groups are finished.
    NoMergeFinal,
    /// The final aggregation of a shuffle: it runs on every node over its bucket.
    ShuffleFinal,
}

/// What `distributed_aggregation` asks for, and what `auto` needs to decide.
struct ShuffleChoice<'a> {
    mode: DistributedAggregation,
    /// `skip_unavailable_shards = 1`: a shuffle cannot answer without a shard (every node's
    /// merge needs every shard's bucket), so none is planned.
    skip_unavailable_shards: bool,
    min_groups: u64,
    world_size: u32,
    estimates: &'a GroupEstimates,
}

/// Which aggregations may finish on the shards (see the module doc), found before the rewrite.
#[derive(Default)]
struct AutoNoMerge {
    /// Exchange and final-aggregation nodes a fragment extends through, and what each is.
    path: HashMap<usize, PathRole>,
    /// Per partial aggregation over a shard scan: what the automatic no-merge decided, and why.
    reasons: HashMap<usize, String>,
}

impl AutoNoMerge {
    /// Visits `plan` children first, so a finished aggregation lower down is known when the one
    /// above it is considered.
    fn scan(&mut self, plan: &Arc<dyn ExecutionPlan>, enabled: bool, choice: &ShuffleChoice<'_>) -> Result<()> {
        for child in plan.children() {
            self.scan(child, enabled, choice)?;
        }
        let Some(agg) = plan.downcast_ref::<AggregateExec>() else { return Ok(()) };
        if !matches!(agg.mode(), AggregateMode::Final | AggregateMode::FinalPartitioned) {
            return Ok(());
        }
        // Down through the exchange to the partial aggregation.
        let mut exchange = vec![node_id(plan)];
        let mut below = Arc::clone(agg.input());
        while below.is::<RepartitionExec>() || below.is::<CoalescePartitionsExec>() || is_partition_local(&below) {
            exchange.push(node_id(&below));
            let Some(next) = below.children().first().map(|c| Arc::clone(c)) else { return Ok(()) };
            below = next;
        }
        let Some(partial) = below.downcast_ref::<AggregateExec>().filter(|a| *a.mode() == AggregateMode::Partial)
        else {
            return Ok(());
        };
        let partial_id = node_id(&below);
        let mut decision = self.decide(partial, enabled);
        let final_role = match &mut decision {
            Ok(_) => Some(PathRole::NoMergeFinal),
            // A global aggregate (no GROUP BY) has one group: nothing to spread, and every bucket
            // would answer with a row of its own.
            Err(why) if partial.group_expr().is_single() && !partial.group_expr().expr().is_empty() => {
                match self.scan_below(partial.input()) {
                    Some(scan) => {
                        let (shuffle, note) = self.wants_shuffle(partial, &scan, choice)?;
                        if let Some(note) = note {
                            why.push_str("; ");
                            why.push_str(&note);
                        }
                        shuffle.then_some(PathRole::ShuffleFinal)
                    }
                    None => None,
                }
            }
            Err(_) => None,
        };
        if let Some(final_role) = final_role {
            for id in &exchange {
                let role = if *id == node_id(plan) { final_role } else { PathRole::Exchange };
                self.path.insert(*id, role);
            }
        }
        self.reasons.insert(partial_id, decision.unwrap_or_else(|why| why));
        Ok(())
    }

    /// Whether the merge of `partial` (over `scan`) is shuffled, and what `auto` saw.
    fn wants_shuffle(
        &self,
        partial: &AggregateExec,
        scan: &ShardScanExec,
        choice: &ShuffleChoice<'_>,
    ) -> Result<(bool, Option<String>)> {
        match choice.mode {
            DistributedAggregation::Initiator => return Ok((false, None)),
            _ if choice.skip_unavailable_shards => {
                let why = "skip_unavailable_shards = 1: a shuffle needs every shard's rows on every node, so the \
                           initiator merges, answering without an unavailable shard";
                return Ok((false, Some(why.into())));
            }
            DistributedAggregation::Shuffle => return Ok((true, None)),
            DistributedAggregation::Auto => {}
        }
        let min = choice.min_groups;
        if choice.world_size < 2 {
            return Ok((false, Some("auto: one node, nothing to spread".into())));
        }
        let input = partial.input();
        let mut names = Vec::new();
        for (expr, _) in partial.group_expr().expr() {
            match column_of(expr, input).and_then(|c| self.trace(input, c.index())) {
                Some(name) => names.push(name),
                None => {
                    return Ok((false, Some("auto: groups of expressions are not estimated, merged here".into())));
                }
            }
        }
        let table = scan.table();
        let e = match choice.estimates.estimate(table.table_id, table.generation, &names)? {
            Sampled::Estimate(e) => e,
            Sampled::NoLocalShard => {
                return Ok((false, Some("auto: no shard of the table on this node to estimate from".into())));
            }
            Sampled::Empty => return Ok((false, Some("auto: the table is empty here, 0 groups estimated".into()))),
            Sampled::MissingColumn => {
                return Ok((false, Some("auto: the group columns are not in the sample".into())));
            }
        };
        let shuffle = e.groups > min;
        let verdict = if shuffle { ">" } else { "<=" };
        let note = format!(
            "auto: ~{} groups estimated from {} sampled rows ({} distinct) {verdict} shuffle_min_groups = {min}",
            e.groups, e.sampled_rows, e.distinct_in_sample
        );
        Ok((shuffle, Some(note)))
    }

    /// Ok(why it applies) or Err(why not).
    fn decide(&self, partial: &AggregateExec, enabled: bool) -> std::result::Result<String, String> {
        if !enabled {
            return Err("optimize_distributed_group_by_sharding_key = 0".into());
        }
        let group = partial.group_expr();
        if !group.is_single() {
            return Err("GROUPING SETS, ROLLUP and CUBE always merge on the initiator".into());
        }
        if group.expr().is_empty() {
            return Err("no GROUP BY".into());
        }
        let input = partial.input();
        let Some(scan) = self.scan_below(input) else {
            return Err("the aggregation is not directly over one distributed table".into());
        };
        let mut grouped = Vec::new();
        for (expr, _) in group.expr() {
            if let Some(column) = column_of(expr, input)
                && let Some(name) = self.trace(input, column.index())
            {
                grouped.push(name);
            }
        }
        let missing: Vec<&String> = scan.table().shard_key.iter().filter(|k| !grouped.contains(k)).collect();
        if !missing.is_empty() {
            let missing: Vec<&str> = missing.iter().map(|s| s.as_str()).collect();
            return Err(format!(
                "GROUP BY does not include shard-key column(s) {} of {}",
                missing.join(", "),
                scan.table().name
            ));
        }
        Ok(format!("GROUP BY includes the shard key ({}) of {}", scan.table().shard_key.join(", "), scan.table().name))
    }

    /// The shard scan under a chain of partition-local operators (or finished aggregations).
    fn scan_below(&self, plan: &Arc<dyn ExecutionPlan>) -> Option<ShardScanExec> {
        if let Some(scan) = plan.downcast_ref::<ShardScanExec>() {
            return Some(scan.clone());
        }
        let through = is_partition_local(plan)
            || self.path.contains_key(&node_id(plan))
            || plan.downcast_ref::<AggregateExec>().is_some_and(|a| *a.mode() == AggregateMode::Partial);
        match (through, plan.children().as_slice()) {
            (true, [child]) => self.scan_below(child),
            _ => None,
        }
    }

    /// The table column that output column `index` of `plan` is, if it is one unchanged.
    #[allow(deprecated)]
    fn trace(&self, plan: &Arc<dyn ExecutionPlan>, index: usize) -> Option<String> {
        if let Some(scan) = plan.downcast_ref::<ShardScanExec>() {
            return scan.output_column_names().get(index).cloned();
        }
        if let Some(projection) = plan.downcast_ref::<ProjectionExec>() {
            let expr = &projection.expr().get(index)?.expr;
            let column = column_of(expr, projection.input())?;
            return self.trace(projection.input(), column.index());
        }
        if let Some(filter) = plan.downcast_ref::<FilterExec>() {
            let index = match filter.projection() {
                Some(p) => *p.get(index)?,
                None => index,
            };
            return self.trace(filter.input(), index);
        }
        if let Some(agg) = plan.downcast_ref::<AggregateExec>() {
            // A group column of a finished (or partial) aggregation is its group expression.
            let (expr, _) = agg.group_expr().expr().get(index)?;
            let column = column_of(expr, agg.input())?;
            return self.trace(agg.input(), column.index());
        }
        let same_columns = plan.is::<CoalesceBatchesExec>()
            || plan.is::<CooperativeExec>()
            || plan.is::<RepartitionExec>()
            || plan.is::<CoalescePartitionsExec>()
            || plan.is::<LocalLimitExec>()
            || plan.is::<SortExec>()
            || plan.is::<GroupTopKExec>()
            || plan.is::<PartitionedTopKExec>();
        match (same_columns, plan.children().as_slice()) {
            (true, [child]) => self.trace(child, index),
            _ => None,
        }
    }
}

/// The input column `expr` is, seen through casts between string types (they keep the value; see
/// [`crate::view_keys`]).
fn column_of<'a>(expr: &'a Arc<dyn PhysicalExpr>, input: &Arc<dyn ExecutionPlan>) -> Option<&'a Column> {
    strip_string_casts(expr, &input.schema()).downcast_ref::<Column>()
}
