//! How many groups an aggregation will have, estimated from a sample of the table's rows: what
//! `distributed_aggregation = 'auto'` compares with `shuffle_min_groups`.
//!
//! The sample is the first [`AUTO_SAMPLE_ROWS`] rows of the shards the planning node holds (in
//! memory, no I/O). With `d` distinct keys in a sample of a table of `N` rows, of which `f1` keys
//! appear once and `f2` twice, the estimate is Chao's (A. Chao, "Nonparametric estimation of the
//! number of classes in a population", Scand. J. Statistics 1984): `d + f1² / (2 f2)` (with
//! `f2 = 0`: `d + f1 (f1 - 1) / 2`), kept between `d` and `N`. It is exact when the sample is the
//! whole table or every key was seen more than once, and when nearly every sampled key is new it
//! says "about as many groups as rows", which is what matters here: the decision needs the order
//! of magnitude. (GEE, `sqrt(N / n) f1 + d - f1`, was tried first: it put 1e6 groups in 1.5e6
//! rows at 3e5.) The keys are assumed to be spread over the shards alike (a shard key that is part
//! of the GROUP BY is handled before any estimate, by the automatic no-merge).
//!
//! Sampling and hashing 65 536 rows was 12% of a node's CPU in a loop of 2-node `EXPLAIN`s of
//! db-benchmark's q1 (about 0.6 ms a query), so [`GroupEstimates`] keeps an
//! estimate for [`GROUP_ESTIMATE_TTL_MS`] and both its users (the automatic shuffle and
//! [`crate::view_keys`]) share it. A stale estimate only picks another exact plan.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::hash_utils::create_hashes;
use datafusion::error::Result;
use datafusion::physical_plan::joins::SeededRandomState;
use hashbrown::HashTable;

use crate::access::TableAccess;

/// Rows of the planning node's shards the estimate looks at.
pub const AUTO_SAMPLE_ROWS: usize = 65_536;

/// How long an estimate is reused before the table is sampled again.
pub const GROUP_ESTIMATE_TTL_MS: u64 = 10_000;

/// Estimates kept at most; past it the cache starts over.
const GROUP_ESTIMATE_CACHE_ENTRIES: usize = 1024;

const ESTIMATE_HASH_SEED: u64 = 0x4553_5449_4d41_5445;

/// Rows of a table, and how many rows the table has in all (estimated from the shards sampled).
#[derive(Debug, Clone)]
pub struct TableSample {
    pub batches: Vec<RecordBatch>,
    pub table_rows: u64,
}

/// What the estimate saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupEstimate {
    pub groups: u64,
    pub sampled_rows: u64,
    pub distinct_in_sample: u64,
}

/// What sampling a table for some columns found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sampled {
    Estimate(GroupEstimate),
    /// This node holds no shard of the table.
    NoLocalShard,
    /// The table's shards on this node are empty.
    Empty,
    /// A column is not in the sample.
    MissingColumn,
}

/// `(table_id, generation, columns)`.
type EstimateKey = (u64, u64, Vec<String>);

/// Group estimates of sharded tables, each reused for [`GROUP_ESTIMATE_TTL_MS`] (module doc).
pub struct GroupEstimates {
    access: Arc<dyn TableAccess>,
    entries: Mutex<HashMap<EstimateKey, (Instant, Sampled)>>,
}

impl std::fmt::Debug for GroupEstimates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupEstimates").finish_non_exhaustive()
    }
}

impl GroupEstimates {
    /// Estimates over the shards `access` holds on this node.
    pub fn new(access: Arc<dyn TableAccess>) -> Self {
        GroupEstimates { access, entries: Mutex::default() }
    }

    /// The estimated groups of `columns` (names) of table incarnation `(table_id, generation)`:
    /// the cached one if it is younger than [`GROUP_ESTIMATE_TTL_MS`], else from a new sample.
    /// Only estimates are kept: finding that there is nothing to estimate from costs no hashing.
    pub fn estimate(&self, table_id: u64, generation: u64, columns: &[String]) -> Result<Sampled> {
        let key = (table_id, generation, columns.to_vec());
        let ttl = Duration::from_millis(GROUP_ESTIMATE_TTL_MS);
        if let Some((at, sampled)) = self.lock().get(&key).copied()
            && at.elapsed() < ttl
        {
            return Ok(sampled);
        }
        // Sampled without the lock: other planners are not held up (two may sample at once).
        let sampled = self.sample(table_id, generation, columns)?;
        if !matches!(sampled, Sampled::Estimate(_)) {
            // Cheap to find again, and a table being opened or loaded has rows a moment later.
            return Ok(sampled);
        }
        let mut entries = self.lock();
        if entries.len() >= GROUP_ESTIMATE_CACHE_ENTRIES {
            entries.clear();
        }
        entries.insert(key, (Instant::now(), sampled));
        Ok(sampled)
    }

    fn sample(&self, table_id: u64, generation: u64, columns: &[String]) -> Result<Sampled> {
        let Some(sample) = self.access.sample(table_id, generation, AUTO_SAMPLE_ROWS) else {
            return Ok(Sampled::NoLocalShard);
        };
        let Some(schema) = sample.batches.first().map(|b| b.schema()) else {
            return Ok(Sampled::Empty);
        };
        let indices: Option<Vec<usize>> = columns.iter().map(|n| schema.index_of(n).ok()).collect();
        match indices {
            Some(indices) => Ok(Sampled::Estimate(estimate_groups(&sample, &indices)?)),
            None => Ok(Sampled::MissingColumn),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<EstimateKey, (Instant, Sampled)>> {
        self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The estimated number of distinct values of `columns` (indices into the sample's schema).
pub fn estimate_groups(sample: &TableSample, columns: &[usize]) -> Result<GroupEstimate> {
    let state = SeededRandomState::with_seed(ESTIMATE_HASH_SEED);
    // Keyed by the rows' hashes, which are already well mixed: the table takes them as they are
    // (a std HashMap would hash each again with SipHash, most of the estimate's time).
    let mut counts: HashTable<(u64, u32)> = HashTable::new();
    let mut sampled: u64 = 0;
    let mut hashes = Vec::new();
    for batch in &sample.batches {
        let arrays: Vec<_> = columns.iter().filter_map(|i| batch.columns().get(*i).cloned()).collect();
        hashes.clear();
        hashes.resize(batch.num_rows(), 0);
        create_hashes(&arrays, state.random_state(), &mut hashes)?;
        for &h in &hashes {
            counts.entry(h, |&(k, _)| k == h, |&(k, _)| k).or_insert((h, 0)).into_mut().1 += 1;
        }
        sampled += batch.num_rows() as u64;
    }
    let distinct = counts.len() as u64;
    let once = counts.iter().filter(|(_, c)| *c == 1).count() as f64;
    let twice = counts.iter().filter(|(_, c)| *c == 2).count() as f64;
    let table_rows = sample.table_rows.max(sampled);
    let groups = if sampled == 0 || table_rows == sampled {
        distinct
    } else {
        let unseen = if twice > 0.0 { once * once / (2.0 * twice) } else { once * (once - 1.0).max(0.0) / 2.0 };
        (distinct as f64 + unseen).min(table_rows as f64) as u64
    }
    .clamp(distinct, table_rows);
    Ok(GroupEstimate { groups, sampled_rows: sampled, distinct_in_sample: distinct })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn sample(keys: impl Iterator<Item = i64>, table_rows: u64) -> TableSample {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, true)]));
        let batch = RecordBatch::try_new(schema, vec![Arc::new(keys.collect::<Int64Array>())]).expect("batch");
        TableSample { batches: vec![batch], table_rows }
    }

    #[test]
    fn a_whole_table_is_counted_exactly() {
        let e = estimate_groups(&sample((0..1000).map(|i| i % 37), 1000), &[0]).expect("estimate");
        assert_eq!((e.groups, e.sampled_rows, e.distinct_in_sample), (37, 1000, 37));
    }

    #[test]
    fn few_groups_stay_few_and_unique_keys_scale_to_the_table() {
        // 100 groups, each seen many times: the estimate stays at 100 for any table size.
        let few = estimate_groups(&sample((0..65_536).map(|i| i % 100), 10_000_000), &[0]).expect("estimate");
        assert_eq!(few.groups, 100);
        // Every sampled key new: about as many groups as the table has rows.
        let unique = estimate_groups(&sample(0..10_000, 1_000_000), &[0]).expect("estimate");
        assert_eq!(unique.groups, 1_000_000);
        // Each key seen about 0.65 times on average (1e5 keys, 100 rows each, 65 536 sampled of
        // 1e7): within 10% of 1e5.
        let splitmix = |i: u64| {
            let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        let keys = (0..65_536u64).map(|i| (splitmix(i) % 100_000) as i64);
        let poisson = estimate_groups(&sample(keys, 10_000_000), &[0]).expect("estimate");
        assert!((90_000..=110_000).contains(&poisson.groups), "{poisson:?}");
    }

    #[test]
    fn an_estimate_is_sampled_once_and_then_reused() {
        use std::sync::atomic::Ordering;

        use crate::dist::test_access::OneShard;

        let k = sample((0..1000).map(|i| i % 37), 1000).batches;
        let shard = Arc::new(OneShard::new(k));
        let estimates = GroupEstimates::new(Arc::clone(&shard) as Arc<dyn TableAccess>);
        let columns = ["k".to_string()];
        let first = estimates.estimate(1, 1, &columns).expect("estimate");
        assert!(matches!(first, Sampled::Estimate(e) if e.groups == 37), "{first:?}");
        assert_eq!(estimates.estimate(1, 1, &columns).expect("estimate"), first);
        assert_eq!(shard.samples_taken.load(Ordering::Relaxed), 1);
        // Another incarnation of the table (after TRUNCATE or DROP and CREATE) or another column
        // set is sampled afresh.
        estimates.estimate(1, 2, &columns).expect("estimate");
        let missing = estimates.estimate(1, 1, &["nope".to_string()]).expect("estimate");
        assert_eq!(missing, Sampled::MissingColumn);
        assert_eq!(estimates.estimate(1, 1, &["nope".to_string()]).expect("estimate"), missing);
        assert_eq!(shard.samples_taken.load(Ordering::Relaxed), 4);
    }
}
