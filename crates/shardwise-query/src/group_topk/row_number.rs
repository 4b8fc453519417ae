//! `row_number() OVER (PARTITION BY ..)` over rows that arrive sorted by their partition keys,
//! in one pass: the number restarts at 1 where the keys change.
//!
//! Why: above a final [`super::GroupTopKExec`] the window has at most N rows per key left to
//! number, but DataFusion's `BoundedWindowAggExec` keeps state per partition key (the key as
//! `ScalarValue`s in a map, a batch slice per key): on db-benchmark's q8, 200 000 rows over
//! 100 000 keys, it took 133 ms of CPU, more than half of what the top-N step took over all
//! 10 million rows. [`super::rule`] puts this operator in its place when the window's only
//! expression is that `row_number()`. The ORDER BY inside the window is already the order of
//! the rows within a key, so numbering follows the input order.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch, UInt64Array};
use datafusion::arrow::datatypes::{FieldRef, Schema, SchemaRef};
use datafusion::arrow::row::{OwnedRow, RowConverter, SortField};
use datafusion::common::tree_node::TreeNodeIterator;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet, RecordOutput};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties};
use futures::StreamExt;

/// Appends `field` (a `UInt64` row number per partition key) to rows sorted by `partition_by`.
#[derive(Debug)]
pub struct RowNumberExec {
    input: Arc<dyn ExecutionPlan>,
    partition_by: Vec<Arc<dyn PhysicalExpr>>,
    field: FieldRef,
    schema: SchemaRef,
    metrics: ExecutionPlanMetricsSet,
    cache: Arc<PlanProperties>,
}

impl RowNumberExec {
    pub fn try_new(
        input: Arc<dyn ExecutionPlan>,
        partition_by: Vec<Arc<dyn PhysicalExpr>>,
        field: FieldRef,
    ) -> Result<Self> {
        if partition_by.is_empty() {
            return Err(DataFusionError::Internal("RowNumberExec needs partition keys".into()));
        }
        let mut fields: Vec<FieldRef> = input.schema().fields().iter().cloned().collect();
        fields.push(Arc::clone(&field));
        let schema = Arc::new(Schema::new_with_metadata(fields, input.schema().metadata().clone()));
        // The input's columns keep their indices, so its orderings still hold.
        let orderings = input.equivalence_properties().oeq_class().iter().cloned().collect::<Vec<_>>();
        let eq = EquivalenceProperties::new_with_orderings(Arc::clone(&schema), orderings);
        let cache = Arc::new(PlanProperties::new(
            eq,
            input.output_partitioning().clone(),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Ok(RowNumberExec { input, partition_by, field, schema, metrics: ExecutionPlanMetricsSet::new(), cache })
    }

    pub fn partition_by(&self) -> &[Arc<dyn PhysicalExpr>] {
        &self.partition_by
    }

    pub fn field(&self) -> &FieldRef {
        &self.field
    }
}

impl DisplayAs for RowNumberExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys: Vec<String> = self.partition_by.iter().map(|e| e.to_string()).collect();
        write!(f, "RowNumberExec: partition=[{}], sorted input", keys.join(", "))
    }
}

impl ExecutionPlan for RowNumberExec {
    fn name(&self) -> &str {
        "RowNumberExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.cache
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<datafusion::common::tree_node::TreeNodeRecursion>,
    ) -> Result<datafusion::common::tree_node::TreeNodeRecursion> {
        self.partition_by.iter().apply_until_stop(f)
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        let [input] = <[_; 1]>::try_from(children)
            .map_err(|c| DataFusionError::Internal(format!("RowNumberExec takes one child, got {}", c.len())))?;
        Ok(Arc::new(RowNumberExec::try_new(input, self.partition_by.clone(), Arc::clone(&self.field))?))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let input_schema = self.input.schema();
        let fields = self
            .partition_by
            .iter()
            .map(|e| Ok(SortField::new(e.data_type(&input_schema)?)))
            .collect::<Result<Vec<_>>>()?;
        let mut numbering = Numbering { converter: RowConverter::new(fields)?, last: None, number: 0 };
        let (keys, schema) = (self.partition_by.clone(), Arc::clone(&self.schema));
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let out_schema = Arc::clone(&schema);
        let stream = input.map(move |batch| {
            let batch = batch?;
            let _timer = baseline.elapsed_compute().timer();
            let columns =
                keys.iter().map(|e| e.evaluate(&batch)?.into_array(batch.num_rows())).collect::<Result<Vec<_>>>()?;
            let numbers = numbering.number(&columns)?;
            let mut out: Vec<ArrayRef> = batch.columns().to_vec();
            out.push(Arc::new(numbers));
            let batch = RecordBatch::try_new(Arc::clone(&schema), out)?;
            Ok(batch.record_output(&baseline))
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(out_schema, stream)))
    }
}

/// One partition's numbering, carried from batch to batch.
struct Numbering {
    converter: RowConverter,
    /// The previous batch's last key.
    last: Option<OwnedRow>,
    /// The previous row's number.
    number: u64,
}

impl Numbering {
    fn number(&mut self, keys: &[ArrayRef]) -> Result<UInt64Array> {
        let rows = self.converter.convert_columns(keys)?;
        let mut numbers = Vec::with_capacity(rows.num_rows());
        for i in 0..rows.num_rows() {
            let same = match i {
                0 => self.last.as_ref().is_some_and(|last| last.row() == rows.row(0)),
                _ => rows.row(i - 1) == rows.row(i),
            };
            self.number = if same { self.number + 1 } else { 1 };
            numbers.push(self.number);
        }
        if rows.num_rows() > 0 {
            self.last = Some(rows.row(rows.num_rows() - 1).owned());
        }
        Ok(UInt64Array::from(numbers))
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Int64Array, StringArray};

    use super::*;

    #[test]
    fn numbers_restart_where_keys_change_even_across_batches() {
        let fields = vec![
            SortField::new(datafusion::arrow::datatypes::DataType::Int64),
            SortField::new(datafusion::arrow::datatypes::DataType::Utf8),
        ];
        let mut numbering = Numbering { converter: RowConverter::new(fields).unwrap(), last: None, number: 0 };
        let batch = |a: Vec<Option<i64>>, b: Vec<Option<&str>>| -> Vec<ArrayRef> {
            vec![Arc::new(Int64Array::from(a)), Arc::new(StringArray::from(b))]
        };
        let first = numbering
            .number(&batch(
                vec![None, None, Some(1), Some(1), Some(1)],
                vec![None, None, Some("a"), Some("a"), Some("b")],
            ))
            .unwrap();
        assert_eq!(first.values().to_vec(), [1, 2, 1, 2, 1]);
        // The key of the last row goes on into the next batch; an empty batch changes nothing.
        assert_eq!(numbering.number(&batch(vec![], vec![])).unwrap().len(), 0);
        let second = numbering.number(&batch(vec![Some(1), Some(2)], vec![Some("b"), Some("b")])).unwrap();
        assert_eq!(second.values().to_vec(), [2, 1]);
    }
}
