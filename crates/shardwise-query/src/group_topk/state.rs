//! The state of a top-K-per-group operator: for every distinct partition key, the K best rows
//! seen so far by the ORDER BY keys, in flat per-group arrays ([`super::flat`]) when K is small
//! and the keys fixed-width, else in a bounded heap per group.
//!
//! Cost per input row: the partition key is interned ([`super::keys`]: a table of its own for one
//! integer column, else DataFusion's aggregation hash table, the one `GROUP BY` uses), the ORDER BY
//! keys are encoded once per batch as comparable bytes ([`RowConverter`]), and a row is admitted
//! only if it beats the worst row its group holds. Admitted rows are copied out of their batch
//! once per batch (one `take`), so a 10M-row input keeps no reference to batches it no longer
//! needs; rows later pushed out of a heap are dropped when [`TopKState::compact`] gathers the
//! survivors.

use std::collections::BinaryHeap;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use datafusion::arrow::compute::{SortColumn, interleave_record_batch, lexsort_to_indices, take_record_batch};
use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::error::{DataFusionError, Result};
use datafusion::physical_expr::{LexOrdering, PhysicalExpr};

use super::PREFETCH_ROWS_AHEAD;
use super::fast_key::fast_keys;
use super::flat::{FLAT_MAX_K, FLAT_MAX_KEY_BYTES, FlatTopK, Offer, key_of};
use super::keys::GroupKeys;

/// Rows kept in stored batches beyond the live ones before they are compacted: at least this
/// many, and at least as many as are live (so compaction costs amortised O(1) per row).
pub const COMPACT_MIN_GARBAGE_ROWS: usize = 1 << 16;

/// One kept row: its ORDER BY key bytes and where the row is stored.
#[derive(Debug, PartialEq, Eq)]
struct Entry {
    key: Box<[u8]>,
    /// Index of the stored batch (high 32 bits) and row in it (low 32 bits).
    slot: u64,
}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key.cmp(&other.key)
    }
}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

fn slot(batch: usize, row: usize) -> u64 {
    ((batch as u64) << 32) | row as u64
}

fn unslot(slot: u64) -> (usize, usize) {
    ((slot >> 32) as usize, (slot & 0xffff_ffff) as usize)
}

/// Top `k` rows per partition key. See the module doc.
pub struct TopKState {
    k: usize,
    partition_exprs: Vec<Arc<dyn PhysicalExpr>>,
    order_exprs: LexOrdering,
    /// Partition keys first, then ORDER BY keys: the order rows are emitted in.
    output_ordering: LexOrdering,
    groups: GroupKeys,
    group_ids: Vec<usize>,
    order_rows: RowConverter,
    /// Per group: a max-heap on the key, so the worst kept row is on top (when `flat` is not
    /// used).
    heaps: Vec<BinaryHeap<Entry>>,
    /// Fixed-width ORDER BY keys (numbers, dates, booleans) and N up to [`FLAT_MAX_K`]: the kept
    /// rows in flat arrays instead. `Some(None)` until the first key gives the width.
    flat: Option<Option<FlatTopK>>,
    /// The current batch's flat keys (kept to reuse the allocation).
    flat_keys: Vec<u128>,
    stored: Vec<RecordBatch>,
    stored_rows: usize,
    live_rows: usize,
    key_bytes: usize,
    schema: SchemaRef,
}

impl TopKState {
    /// `ordering` is the partition keys (the first `partition_len` expressions) then the ORDER BY
    /// keys, over rows of `schema`.
    pub fn try_new(schema: SchemaRef, ordering: &LexOrdering, partition_len: usize, k: usize) -> Result<Self> {
        let partition_exprs: Vec<_> = ordering.iter().take(partition_len).map(|e| Arc::clone(&e.expr)).collect();
        let order: Vec<_> = ordering.iter().skip(partition_len).cloned().collect();
        let key_fields = partition_exprs
            .iter()
            .enumerate()
            .map(|(i, e)| Ok(Field::new(format!("k{i}"), e.data_type(&schema)?, true)))
            .collect::<Result<Vec<_>>>()?;
        let groups = GroupKeys::try_new(Arc::new(Schema::new(key_fields)))?;
        let sort_fields = order
            .iter()
            .map(|e| Ok(SortField::new_with_options(e.expr.data_type(&schema)?, e.options)))
            .collect::<Result<Vec<_>>>()?;
        let fixed_width = order.iter().all(|e| {
            e.expr
                .data_type(&schema)
                .is_ok_and(|t| t.is_primitive() || t == datafusion::arrow::datatypes::DataType::Boolean)
        });
        let order_rows = RowConverter::new(sort_fields)?;
        let order_exprs = LexOrdering::new(order.clone())
            .ok_or_else(|| DataFusionError::Internal("top-K per group without ORDER BY keys".into()))?;
        Ok(TopKState {
            k,
            partition_exprs,
            order_exprs,
            output_ordering: ordering.clone(),
            groups,
            group_ids: Vec::new(),
            order_rows,
            heaps: Vec::new(),
            flat: (fixed_width && k <= FLAT_MAX_K).then_some(None),
            flat_keys: Vec::new(),
            stored: Vec::new(),
            stored_rows: 0,
            live_rows: 0,
            key_bytes: 0,
            schema,
        })
    }

    /// Rows currently kept (at most `k` per group).
    pub fn live_rows(&self) -> usize {
        self.live_rows
    }

    /// Bytes this state holds: stored rows, keys, heaps and the hash table.
    pub fn size(&self) -> usize {
        let stored: usize = self.stored.iter().map(RecordBatch::get_array_memory_size).sum();
        let heaps = self.heaps.capacity() * std::mem::size_of::<BinaryHeap<Entry>>()
            + self.live_rows * std::mem::size_of::<Entry>();
        let flat = self.flat.as_ref().and_then(Option::as_ref).map_or(0, FlatTopK::size);
        stored + heaps + flat + self.key_bytes + self.groups.size() + self.group_ids.capacity() * 8
    }

    /// Offers every row of `batch`.
    pub fn insert(&mut self, batch: &RecordBatch) -> Result<()> {
        let rows = batch.num_rows();
        if rows == 0 || self.k == 0 {
            return Ok(());
        }
        let keys = evaluate(&self.partition_exprs, batch)?;
        self.groups.intern(&keys, &mut self.group_ids)?;
        let order_columns = evaluate(self.order_exprs.iter().map(|e| &e.expr), batch)?;
        let batch_index = self.stored.len();
        // One Int32/Int64/Float32/Float64 ORDER BY column: flat keys straight from the values.
        if let (Some(_), [column], [order]) = (&self.flat, order_columns.as_slice(), self.order_exprs.as_ref())
            && fast_keys(column, order.options, &mut self.flat_keys)
        {
            let width = 1 + column.data_type().primitive_width().unwrap_or(0);
            let taken = self.offer_flat(batch_index, width)?;
            return self.keep(batch, taken);
        }
        let order_rows = self.order_rows.convert_columns(&order_columns)?;
        // Keys too long for the flat layout (several wide columns): heaps, decided before any
        // row is kept.
        if matches!(self.flat, Some(None)) && order_rows.row(0).as_ref().len() > FLAT_MAX_KEY_BYTES {
            self.flat = None;
        }
        if self.flat.is_some() {
            let width = order_rows.row(0).as_ref().len();
            self.flat_keys.clear();
            for row in order_rows.iter() {
                if row.as_ref().len() != width {
                    return Err(DataFusionError::Internal(format!(
                        "top-N per group: fixed-width ORDER BY keys of {} and {width} bytes",
                        row.as_ref().len()
                    )));
                }
                self.flat_keys.push(key_of(row.as_ref()));
            }
            let taken = self.offer_flat(batch_index, width)?;
            return self.keep(batch, taken);
        }
        if self.heaps.len() < self.groups.len() {
            self.heaps.resize_with(self.groups.len(), BinaryHeap::new);
        }
        let mut taken: Vec<u32> = Vec::new();
        for (row, &group) in self.group_ids.iter().enumerate() {
            let key = order_rows.row(row);
            let key = key.as_ref();
            let heap = &mut self.heaps[group];
            if heap.len() >= self.k {
                match heap.peek() {
                    Some(worst) if key < worst.key.as_ref() => {}
                    _ => continue,
                }
            }
            let entry = Entry { key: key.into(), slot: slot(batch_index, taken.len()) };
            self.key_bytes += entry.key.len();
            taken.push(row as u32);
            heap.push(entry);
            if heap.len() > self.k {
                if let Some(out) = heap.pop() {
                    self.key_bytes -= out.key.len();
                }
            } else {
                self.live_rows += 1;
            }
        }
        self.keep(batch, taken)
    }

    /// Offers row `i` of batch `batch_index` with key `flat_keys[i]` (of `width` bytes) to the
    /// flat layout; the rows it kept.
    fn offer_flat(&mut self, batch_index: usize, width: usize) -> Result<Vec<u32>> {
        let Some(flat) = &mut self.flat else { return Ok(Vec::new()) };
        let flat = flat.get_or_insert_with(|| FlatTopK::new(self.k, width));
        if flat.width() != width {
            return Err(DataFusionError::Internal(format!(
                "top-N per group: a fixed-width ORDER BY key of {width} bytes, not {}",
                flat.width()
            )));
        }
        flat.ensure_groups(self.groups.len());
        let mut taken = Vec::new();
        for (row, (&group, &key)) in self.group_ids.iter().zip(&self.flat_keys).enumerate() {
            if let Some(&ahead) = self.group_ids.get(row + PREFETCH_ROWS_AHEAD) {
                flat.prefetch(ahead);
            }
            match flat.offer(group, key, slot(batch_index, taken.len())) {
                Offer::Rejected => continue,
                Offer::Added => self.live_rows += 1,
                Offer::Replaced => {}
            }
            taken.push(row as u32);
        }
        Ok(taken)
    }

    /// Stores the rows of `batch` that were `taken` (as the slots given to them say), and
    /// compacts when enough stored rows have been pushed out.
    fn keep(&mut self, batch: &RecordBatch, taken: Vec<u32>) -> Result<()> {
        if !taken.is_empty() {
            let kept = take_record_batch(batch, &UInt32Array::from(taken))?;
            self.stored_rows += kept.num_rows();
            self.stored.push(kept);
        }
        if self.stored_rows - self.live_rows >= COMPACT_MIN_GARBAGE_ROWS.max(self.live_rows) {
            self.compact()?;
        }
        Ok(())
    }

    /// Gathers the kept rows into one batch, dropping the rows heaps have pushed out.
    pub fn compact(&mut self) -> Result<()> {
        let mut indices = Vec::with_capacity(self.live_rows);
        if let Some(Some(flat)) = &mut self.flat {
            flat.for_each_slot(|s| {
                indices.push(unslot(*s));
                *s = slot(0, indices.len() - 1);
            });
        }
        for heap in &mut self.heaps {
            let mut entries = std::mem::take(heap).into_vec();
            for entry in &mut entries {
                indices.push(unslot(entry.slot));
                entry.slot = slot(0, indices.len() - 1);
            }
            *heap = BinaryHeap::from(entries);
        }
        let sources: Vec<&RecordBatch> = self.stored.iter().collect();
        let batch = match indices.is_empty() {
            true => RecordBatch::new_empty(Arc::clone(&self.schema)),
            false => interleave_record_batch(&sources, &indices)?,
        };
        self.stored_rows = batch.num_rows();
        self.stored = vec![batch];
        Ok(())
    }

    /// The kept rows, sorted by partition keys then ORDER BY keys (the order a window over them
    /// expects), as one batch.
    pub fn finish(mut self) -> Result<RecordBatch> {
        self.compact()?;
        let Some(batch) = self.stored.pop() else { return Ok(RecordBatch::new_empty(self.schema)) };
        if batch.num_rows() == 0 {
            return Ok(batch);
        }
        let columns = self
            .output_ordering
            .iter()
            .map(|e| {
                let values = e.expr.evaluate(&batch)?.into_array(batch.num_rows())?;
                Ok(SortColumn { values, options: Some(e.options) })
            })
            .collect::<Result<Vec<_>>>()?;
        let order = lexsort_to_indices(&columns, None)?;
        Ok(take_record_batch(&batch, &order)?)
    }
}

fn evaluate<'a>(
    exprs: impl IntoIterator<Item = &'a Arc<dyn PhysicalExpr>>,
    batch: &RecordBatch,
) -> Result<Vec<ArrayRef>> {
    exprs.into_iter().map(|e| e.evaluate(batch)?.into_array(batch.num_rows())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Float64Array, Int64Array};
    use datafusion::arrow::compute::SortOptions;
    use datafusion::arrow::datatypes::DataType;
    use datafusion::physical_expr::PhysicalSortExpr;
    use datafusion::physical_expr::expressions::{IsNullExpr, col};

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![Field::new("g", DataType::Int64, true), Field::new("v", DataType::Float64, true)]))
    }

    /// `(g, v)`; with `row_keys`, also `g IS NULL` after `v`: constant within a group, so the same
    /// order, but two ORDER BY columns take the flat layout through the row encoding instead of
    /// `fast_keys`.
    fn ordering(schema: &SchemaRef, descending: bool, row_keys: bool) -> LexOrdering {
        let g = PhysicalSortExpr::new_default(col("g", schema).expect("g"));
        let v =
            PhysicalSortExpr::new(col("v", schema).expect("v"), SortOptions { descending, nulls_first: descending });
        let mut exprs = vec![g, v];
        if row_keys {
            let is_null = Arc::new(IsNullExpr::new(col("g", schema).expect("g")));
            exprs.push(PhysicalSortExpr::new_default(is_null));
        }
        LexOrdering::new(exprs).expect("ordering")
    }

    fn batch(schema: &SchemaRef, g: Vec<Option<i64>>, v: Vec<Option<f64>>) -> RecordBatch {
        RecordBatch::try_new(Arc::clone(schema), vec![Arc::new(Int64Array::from(g)), Arc::new(Float64Array::from(v))])
            .expect("batch")
    }

    fn rows(batch: &RecordBatch) -> Vec<(Option<i64>, Option<f64>)> {
        let g = batch.column(0).as_any().downcast_ref::<Int64Array>().expect("g");
        let v = batch.column(1).as_any().downcast_ref::<Float64Array>().expect("v");
        (0..batch.num_rows()).map(|i| (g.is_valid(i).then(|| g.value(i)), v.is_valid(i).then(|| v.value(i)))).collect()
    }

    use datafusion::arrow::array::Array;

    /// The reference: sort everything by (g, v), keep the first k of each g.
    fn reference(all: &[(Option<i64>, Option<f64>)], k: usize, descending: bool) -> Vec<(Option<i64>, Option<f64>)> {
        let mut sorted = all.to_vec();
        let key = |v: Option<f64>| match v {
            None => (0u8, 0.0),
            Some(x) => (1, if descending { -x } else { x }),
        };
        sorted.sort_by(|a, b| {
            // Partition keys sort ascending with nulls first (SortOptions::default()).
            a.0.cmp(&b.0).then_with(|| {
                let (ka, kb) = (key(a.1), key(b.1));
                // Descending puts nulls first; ascending puts them last.
                let ka = if descending { ka } else { (1 - ka.0, ka.1) };
                let kb = if descending { kb } else { (1 - kb.0, kb.1) };
                ka.0.cmp(&kb.0).then(ka.1.total_cmp(&kb.1))
            })
        });
        let mut out = Vec::new();
        let mut run = 0;
        for (i, row) in sorted.iter().enumerate() {
            run = if i > 0 && sorted[i - 1].0 == row.0 { run + 1 } else { 0 };
            if run < k {
                out.push(*row);
            }
        }
        out
    }

    #[test]
    fn keeps_the_best_k_of_each_group_across_batches_and_compactions() {
        let schema = schema();
        let mut next = super::super::test_rng(7);
        let cases = [(1, true, 3), (2, true, 50), (3, false, 1000), (5, false, 7), (0, true, 4), (20, true, 30)];
        for ((k, descending, groups), row_keys) in cases.into_iter().flat_map(|c| [(c, false), (c, true)]) {
            let ordering = ordering(&schema, descending, row_keys);
            let mut state = TopKState::try_new(Arc::clone(&schema), &ordering, 1, k).expect("new");
            let mut all = Vec::new();
            for _ in 0..40 {
                let n = (next() % 5000) as usize;
                let g: Vec<Option<i64>> =
                    (0..n).map(|_| (!next().is_multiple_of(20)).then(|| (next() % groups) as i64)).collect();
                let v: Vec<Option<f64>> =
                    (0..n).map(|_| (!next().is_multiple_of(50)).then(|| (next() % 100_000) as f64 / 7.0)).collect();
                all.extend(g.iter().copied().zip(v.iter().copied()));
                state.insert(&batch(&schema, g, v)).expect("insert");
                assert!(state.live_rows() <= k * (groups as usize + 1));
            }
            let got = rows(&state.finish().expect("finish"));
            assert_eq!(
                got,
                reference(&all, k, descending),
                "k={k} descending={descending} groups={groups} row_keys={row_keys}"
            );
        }
    }
}
