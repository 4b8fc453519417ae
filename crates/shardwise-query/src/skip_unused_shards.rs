//! `optimize_skip_unused_shards` (ClickHouse's setting): a query whose WHERE pins every shard-key
//! column to a few values (`id = 42`, `id IN (1, 2, 3)`, `a = 1 AND b IN ('x', 'y')`, or ORs of
//! such equalities) reads only the shards those key values are placed on, instead of all.
//!
//! The shards come from the table's own placement function ([`PlacementVersion`]) applied to the
//! values, exactly as an insert places a row with that key, so a skipped shard holds no row the
//! WHERE could keep. That holds only where every row sits on the shard its key gives it, which
//! shardwise's routing records (`verified_placement`): a pruned scan asks the replicas it reads
//! to refuse if theirs is not verified, as the automatic no-merge GROUP BY does. The filter
//! itself still runs on the rows read: pruning only leaves out shards.
//!
//! A value pins a column only when its type is the column's own (after DataFusion's coercion,
//! `k = 5` on an `INT` column compares with an `Int32` 5); a comparison through a cast, a NULL,
//! or more than [`MAX_PINNED_KEYS`] key combinations pins nothing and every shard is read.

use datafusion::arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use datafusion::arrow::compute::take;
use datafusion::arrow::datatypes::{Field, Schema};
use datafusion::common::ScalarValue;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::expr::InList;
use datafusion::logical_expr::{BinaryExpr, Expr, Operator};
use shardwise_storage::TableDef;
use std::sync::Arc;

/// Most combinations of pinned key values (the product of each key column's value count) the
/// planner places; past it, every shard is read.
pub const MAX_PINNED_KEYS: usize = 4096;

/// True when `filter` could pin a shard-key column of `def` (so DataFusion should hand it to the
/// scan).
pub fn could_pin(filter: &Expr, def: &TableDef) -> bool {
    def.shard_key.iter().any(|column| values_of(filter, column).is_some())
}

/// The shards `filters` (a conjunction) leave rows on, ascending, when they pin every shard-key
/// column; `None` when they do not (every shard must be read).
pub fn pinned_shards(def: &TableDef, filters: &[Expr]) -> Result<Option<Vec<u32>>> {
    let mut per_column: Vec<Vec<ScalarValue>> = Vec::with_capacity(def.shard_key.len());
    for column in &def.shard_key {
        let field = def.schema.field_with_name(column)?;
        // The fewest values any conjunct allows (each is a superset of the rows kept).
        let Some(values) = filters.iter().filter_map(|f| values_of(f, column)).min_by_key(Vec::len) else {
            return Ok(None);
        };
        if values.iter().any(|v| v.is_null() || v.data_type() != *field.data_type()) {
            return Ok(None);
        }
        per_column.push(values);
    }
    let combinations = per_column.iter().try_fold(1usize, |n, v| n.checked_mul(v.len()));
    match combinations {
        Some(n) if n <= MAX_PINNED_KEYS => {}
        _ => return Ok(None),
    }
    let batch = key_combinations(def, &per_column)?;
    let key_indices: Vec<usize> = (0..batch.num_columns()).collect();
    let mut shards = def
        .placement
        .shard_of_rows(&batch, &key_indices, def.shards)
        .map_err(|e| DataFusionError::External(Box::new(e)))?;
    shards.sort_unstable();
    shards.dedup();
    Ok(Some(shards))
}

/// Every combination of the key columns' values, one row each, in the key's column order.
fn key_combinations(def: &TableDef, per_column: &[Vec<ScalarValue>]) -> Result<RecordBatch> {
    let rows: usize = per_column.iter().map(Vec::len).product();
    let mut fields = Vec::with_capacity(per_column.len());
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(per_column.len());
    // Row r takes value (r / stride) % len of each column: the columns vary like digits.
    let mut stride = 1usize;
    for (column, values) in def.shard_key.iter().zip(per_column) {
        let field = def.schema.field_with_name(column)?;
        let distinct = ScalarValue::iter_to_array(values.iter().cloned())?;
        let picks: UInt32Array = (0..rows).map(|r| ((r / stride) % values.len()) as u32).collect();
        columns.push(take(&distinct, &picks, None)?);
        fields.push(Field::new(column, field.data_type().clone(), true));
        stride *= values.len();
    }
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?)
}

/// The values `expr` restricts `column` to, when it does: `column = v`, `column IN (v, ...)`,
/// an OR of such, or an AND with such a side.
fn values_of(expr: &Expr, column: &str) -> Option<Vec<ScalarValue>> {
    match expr {
        Expr::BinaryExpr(BinaryExpr { left, op: Operator::Eq, right }) => match (left.as_ref(), right.as_ref()) {
            (Expr::Column(c), Expr::Literal(v, _)) | (Expr::Literal(v, _), Expr::Column(c)) if c.name == column => {
                Some(vec![v.clone()])
            }
            _ => None,
        },
        Expr::InList(InList { expr, list, negated: false }) => match expr.as_ref() {
            Expr::Column(c) if c.name == column => list
                .iter()
                .map(|item| match item {
                    Expr::Literal(v, _) => Some(v.clone()),
                    _ => None,
                })
                .collect(),
            _ => None,
        },
        Expr::BinaryExpr(BinaryExpr { left, op: Operator::Or, right }) => {
            let mut values = values_of(left, column)?;
            values.extend(values_of(right, column)?);
            Some(values)
        }
        Expr::BinaryExpr(BinaryExpr { left, op: Operator::And, right }) => {
            match (values_of(left, column), values_of(right, column)) {
                (Some(a), Some(b)) => Some(if a.len() <= b.len() { a } else { b }),
                (a, b) => a.or(b),
            }
        }
        _ => None,
    }
    .map(|mut values| {
        values.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
        values.dedup();
        values
    })
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::datatypes::DataType;
    use datafusion::logical_expr::{col, lit};
    use shardwise_storage::{PlacementVersion, SyncMode};

    use super::*;

    fn table(shard_key: &[&str]) -> TableDef {
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, true),
            Field::new("b", DataType::Utf8, true),
            Field::new("v", DataType::Float64, true),
        ]));
        TableDef {
            name: "t".into(),
            schema,
            shard_key: shard_key.iter().map(|s| s.to_string()).collect(),
            shards: 16,
            replicas: 1,
            sync_mode: SyncMode::Immediate,
            delay: Default::default(),
            placement: PlacementVersion::XxHash64V1,
        }
    }

    /// The shard an insert would place the row (a, b) on.
    fn shard_of(def: &TableDef, a: i64, b: &str) -> u32 {
        let batch = RecordBatch::try_from_iter([
            ("a", Arc::new(datafusion::arrow::array::Int64Array::from(vec![a])) as ArrayRef),
            ("b", Arc::new(datafusion::arrow::array::StringArray::from(vec![b])) as ArrayRef),
        ])
        .unwrap();
        let key: Vec<usize> = def.shard_key.iter().map(|k| if k == "a" { 0 } else { 1 }).collect();
        def.placement.shard_of_rows(&batch, &key, def.shards).unwrap()[0]
    }

    #[test]
    fn equalities_on_the_key_pin_the_shards_inserts_place_them_on() {
        let def = table(&["a"]);
        // 42 goes to shard 1 of 16 (the golden value in the placement spec).
        assert_eq!(pinned_shards(&def, &[col("a").eq(lit(42i64))]).unwrap(), Some(vec![1]));
        let mut want: Vec<u32> = [1i64, 2, 3].iter().map(|&a| shard_of(&def, a, "")).collect();
        want.sort_unstable();
        want.dedup();
        let in_list = col("a").in_list(vec![lit(3i64), lit(1i64), lit(2i64)], false);
        assert_eq!(pinned_shards(&def, &[in_list]).unwrap(), Some(want.clone()));
        let ors = col("a").eq(lit(1i64)).or(col("a").eq(lit(2i64))).or(lit(3i64).eq(col("a")));
        assert_eq!(pinned_shards(&def, &[ors, col("v").gt(lit(0.5))]).unwrap(), Some(want));
    }

    #[test]
    fn every_key_column_must_be_pinned() {
        let def = table(&["a", "b"]);
        assert_eq!(pinned_shards(&def, &[col("a").eq(lit(1i64))]).unwrap(), None);
        let both = [col("a").eq(lit(1i64)), col("b").in_list(vec![lit("x"), lit("y")], false)];
        let mut want = vec![shard_of(&def, 1, "x"), shard_of(&def, 1, "y")];
        want.sort_unstable();
        want.dedup();
        assert_eq!(pinned_shards(&def, &both).unwrap(), Some(want));
    }

    #[test]
    fn anything_else_pins_nothing() {
        let def = table(&["a"]);
        for filter in [
            col("a").gt(lit(1i64)),
            col("a").eq(lit(1i32)),
            col("a").eq(lit(ScalarValue::Int64(None))),
            col("a").in_list(vec![lit(1i64)], true),
            col("a").eq(lit(1i64)).or(col("v").eq(lit(1.0))),
            col("v").eq(lit(1.0)),
        ] {
            assert_eq!(pinned_shards(&def, std::slice::from_ref(&filter)).unwrap(), None, "{filter}");
        }
        let many = col("a").in_list((0..=MAX_PINNED_KEYS as i64).map(lit).collect(), false);
        assert_eq!(pinned_shards(&def, &[many]).unwrap(), None);
        assert!(could_pin(&col("a").eq(lit(1i64)), &def) && !could_pin(&col("v").eq(lit(1.0)), &def));
    }
}
