//! Parquet input: columns matched to the table's by name (a column the table does not have is an
//! error; a table column the file lacks is NULL) and cast to the table's types, a value that does
//! not fit (300 into an Int8 column, say) failing the load with its column and row.
//!
//! DataFusion's Parquet reader (`datafusion::parquet`) decodes the file; [`super::convert_column`]
//! casts; a [`BatchCoalescer`] makes the batches `batch_rows` long whatever the file's row groups.

use anyhow::{Context, anyhow, bail};
use arrow::array::{RecordBatch, new_null_array};
use arrow::compute::{BatchCoalescer, can_cast_types};
use arrow::datatypes::SchemaRef;
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use datafusion::parquet::file::reader::ChunkReader;

use super::progress::Progress;
use super::{assemble, convert_column, first_null, no_such_column, quote_short};

/// Reads Parquet from `input` (`size` bytes, named `label` in errors) into batches of `schema`.
pub fn read<T: ChunkReader + 'static>(
    input: T,
    size: u64,
    label: &str,
    schema: &SchemaRef,
    batch_rows: usize,
    progress: &Progress,
) -> anyhow::Result<Vec<RecordBatch>> {
    let builder = ParquetRecordBatchReaderBuilder::try_new(input)
        .with_context(|| format!("{label} is not a readable Parquet file"))?;
    let total_rows = u64::try_from(builder.metadata().file_metadata().num_rows()).unwrap_or(0);
    let file_schema = builder.schema().clone();
    let source = match_columns(&file_schema, schema, label)?;
    super::note_absent_columns(schema, &source, label, progress);
    let reader = builder
        .with_batch_size(batch_rows)
        .build()
        .with_context(|| format!("{label} is not a readable Parquet file"))?;
    let mut coalescer = BatchCoalescer::new(schema.clone(), batch_rows);
    let (mut batches, mut rows_before, mut bytes_done) = (Vec::new(), 0u64, 0u64);
    for batch in reader {
        let batch = batch.with_context(|| format!("{label}: cannot read the rows after row {rows_before}"))?;
        let converted = convert(&batch, &source, &file_schema, schema, rows_before, label)?;
        rows_before += batch.num_rows() as u64;
        coalescer.push_batch(converted).context("cannot assemble batches")?;
        while let Some(done) = coalescer.next_completed_batch() {
            batches.push(done);
        }
        // Parquet is compressed: bytes are estimated from the share of rows read.
        let bytes_now = size.saturating_mul(rows_before).checked_div(total_rows).unwrap_or(size);
        progress.advance(bytes_now.saturating_sub(bytes_done), batch.num_rows() as u64);
        bytes_done = bytes_now.max(bytes_done);
    }
    coalescer.finish_buffered_batch().context("cannot assemble batches")?;
    while let Some(done) = coalescer.next_completed_batch() {
        batches.push(done);
    }
    Ok(batches)
}

/// For each table column, the position of the file's column of that name, if any; checks that
/// every file column is a table column that its type can be cast to, and that no NOT NULL column
/// is missing.
fn match_columns(file_schema: &SchemaRef, schema: &SchemaRef, label: &str) -> anyhow::Result<Vec<Option<usize>>> {
    let mut source = vec![None; schema.fields().len()];
    for (position, file_field) in file_schema.fields().iter().enumerate() {
        let name = file_field.name();
        let at = format!("{label}, column {} (file column {})", quote_short(name), position + 1);
        let Ok(index) = schema.index_of(name) else {
            bail!("{at}: {}", no_such_column(schema, name));
        };
        if source[index].is_some() {
            bail!("{at}: the file has two columns of this name");
        }
        let (from, to) = (file_field.data_type(), schema.field(index).data_type());
        // Arrow casts a list to text as its debug form (`[1, 2]`): not a value to store.
        if from.is_nested() && !to.is_nested() {
            bail!(
                "{at}: the file's type {from} is nested (a list, struct, map or union), and the table's column \
                 holds one value ({to})"
            );
        }
        if !can_cast_types(from, to) {
            bail!("{at}: the file's type {from} cannot be converted to the table's type {to}");
        }
        source[index] = Some(position);
    }
    for (field, found) in schema.fields().iter().zip(&source) {
        if found.is_none() && !field.is_nullable() {
            bail!("{label}: no column {}, which the table requires (NOT NULL)", quote_short(field.name()));
        }
    }
    Ok(source)
}

/// Casts one batch of the file to the table's schema; errors name the row (1-based, in the file).
fn convert(
    batch: &RecordBatch,
    source: &[Option<usize>],
    file_schema: &SchemaRef,
    schema: &SchemaRef,
    rows_before: u64,
    label: &str,
) -> anyhow::Result<RecordBatch> {
    let mut columns = Vec::with_capacity(schema.fields().len());
    for (field, position) in schema.fields().iter().zip(source) {
        let Some(position) = *position else {
            columns.push(new_null_array(field.data_type(), batch.num_rows()));
            continue;
        };
        let name = format!("column {} (file column {})", quote_short(file_schema.field(position).name()), position + 1);
        let row_of = |row: usize| rows_before + row as u64 + 1;
        let column = convert_column(batch.column(position), field.data_type()).map_err(|bad| match bad.row {
            Some(row) => anyhow!("{label} row {}, {name}: {}", row_of(row), bad.message),
            None => anyhow!("{label}, {name}: {}", bad.message),
        })?;
        if !field.is_nullable()
            && let Some(row) = first_null(&column)
        {
            bail!("{label} row {}, {name}: NULL, but the column is NOT NULL", row_of(row));
        }
        columns.push(column);
    }
    assemble(schema, columns)
}
