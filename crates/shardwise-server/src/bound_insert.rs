//! The rows of parameters an `executemany` binds to `INSERT INTO t [(columns)] VALUES (?, ...)`,
//! stored as the Arrow columns they arrive in.
//!
//! ADBC and JDBC send an `executemany`'s rows as Arrow batches (`DoPut` on the prepared
//! statement). Spliced into SQL text, as other statements' values are (`crate::flight_params`),
//! a million rows took 83 s through ADBC (`bench/executemany.py`; 0.16 s as columns, BENCHMARKS.md,
//! "Prepared-statement inserts"). When the
//! statement's one row of values is its placeholders alone, each used once, each parameter
//! column is the column of the table it fills, so the rows go in as an ingest's do: matched to
//! the table's columns, cast with checks (a fraction for an integer column or a value out of a
//! column's range is refused, naming the column), columns the statement does not name NULL, and
//! stored as one insert under the session's settings, all or nothing. Any other statement (an
//! expression around a placeholder, a qualified table name, an unknown table or column) takes
//! the SQL path, whose planner gives it its usual errors.

use arrow::array::RecordBatch;
use arrow::datatypes::{Field, Schema};
use datafusion::sql::sqlparser::ast::{Expr, Ident, ObjectName, SetExpr, Statement, TableObject, Value};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;
use std::sync::Arc;

use shardwise_storage::Catalog;
use tonic::Status;

/// An insert whose rows of parameters can be stored as they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundInsert {
    /// The table, as the catalog names it.
    pub table: String,
    /// For each value of the row, the column it fills (the statement's columns, else the
    /// table's in order) and the parameter it is (0-based).
    pub targets: Vec<(String, usize)>,
}

/// What `sql` inserts, when it is `INSERT INTO t [(columns)] VALUES (p, ...)` with placeholders
/// alone, each used once, into a table and columns `catalog` has; `None` otherwise.
pub fn bound_insert(sql: &str, catalog: &Catalog) -> Option<BoundInsert> {
    let mut statements = Parser::parse_sql(&GenericDialect {}, sql).ok()?;
    let Some(Statement::Insert(insert)) = statements.pop().filter(|_| statements.is_empty()) else { return None };
    let plain = insert.or.is_none()
        && !insert.ignore
        && insert.table_alias.is_none()
        && !insert.overwrite
        && insert.assignments.is_empty()
        && insert.partitioned.is_none()
        && insert.after_columns.is_empty()
        && insert.on.is_none()
        && insert.returning.is_none()
        && insert.output.is_none()
        && !insert.replace_into
        && insert.settings.is_none()
        && insert.format_clause.is_none();
    let TableObject::TableName(name) = &insert.table else { return None };
    let query = insert.source.as_ref().filter(|_| plain)?;
    let simple_query = query.with.is_none()
        && query.order_by.is_none()
        && query.limit_clause.is_none()
        && query.fetch.is_none()
        && query.settings.is_none()
        && query.format_clause.is_none()
        && query.pipe_operators.is_empty();
    let SetExpr::Values(values) = query.body.as_ref() else { return None };
    let [row] = values.rows.as_slice() else { return None };
    if !simple_query {
        return None;
    }
    let parameters = placeholder_positions(row)?;
    let table = single_name(name)?;
    let entry = catalog.tables.get(&table)?;
    let schema = &entry.def.schema;
    let columns: Vec<String> = match insert.columns.as_slice() {
        [] if row.len() == schema.fields().len() => schema.fields().iter().map(|f| f.name().clone()).collect(),
        [] => return None,
        stated if stated.len() == row.len() => {
            let names: Option<Vec<String>> = stated.iter().map(single_name).collect();
            let names = names?;
            for (i, name) in names.iter().enumerate() {
                if schema.index_of(name).is_err() || names[..i].contains(name) {
                    return None;
                }
            }
            names
        }
        _ => return None,
    };
    Some(BoundInsert { table, targets: columns.into_iter().zip(parameters).collect() })
}

impl BoundInsert {
    /// `batch` of parameters (one column per parameter) as rows of the statement's columns, named
    /// after them, for `crate::ingest_schema::conform_as` to match and cast.
    pub fn rows(&self, batch: &RecordBatch) -> Result<RecordBatch, Status> {
        if batch.num_columns() != self.targets.len() {
            return Err(Status::invalid_argument(format!(
                "{} values were bound, the statement takes {}",
                batch.num_columns(),
                self.targets.len()
            )));
        }
        let fields: Vec<Field> = self
            .targets
            .iter()
            .map(|(name, parameter)| Field::new(name, batch.column(*parameter).data_type().clone(), true))
            .collect();
        let columns = self.targets.iter().map(|(_, parameter)| Arc::clone(batch.column(*parameter))).collect();
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
            .map_err(|e| Status::invalid_argument(format!("the bound parameters: {e}")))
    }
}

/// The parameter (0-based) each value of `row` is, when every value is a placeholder, all `?`
/// or all `$n`, each parameter once.
fn placeholder_positions(row: &[Expr]) -> Option<Vec<usize>> {
    let mut positions = Vec::with_capacity(row.len());
    let mut question_marks = 0;
    for (i, value) in row.iter().enumerate() {
        let Expr::Value(value) = value else { return None };
        let Value::Placeholder(text) = &value.value else { return None };
        let position = match text.as_str() {
            "?" => {
                question_marks += 1;
                i
            }
            numbered => numbered.strip_prefix('$')?.parse::<usize>().ok()?.checked_sub(1)?,
        };
        positions.push(position);
    }
    let mut sorted = positions.clone();
    sorted.sort_unstable();
    let each_once = sorted.iter().enumerate().all(|(i, &p)| i == p);
    (each_once && (question_marks == 0 || question_marks == row.len())).then_some(positions)
}

/// A one-part name as SQL folds it: unquoted lower-cased, quoted as written.
fn single_name(name: &ObjectName) -> Option<String> {
    let [part] = name.0.as_slice() else { return None };
    part.as_ident().map(folded)
}

fn folded(ident: &Ident) -> String {
    match ident.quote_style {
        None => ident.value.to_lowercase(),
        Some(_) => ident.value.clone(),
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{ArrayRef, Int64Array, StringArray};
    use arrow::datatypes::DataType;
    use shardwise_storage::{CatalogOp, TableDef};

    use super::*;

    fn catalog() -> Catalog {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("name", DataType::Utf8, true),
            Field::new("Big", DataType::Int32, true),
        ]));
        let def = TableDef::from_options("t", schema, &[("shard_key".into(), "id".into())], 2).unwrap();
        Catalog::default().apply(&CatalogOp::CreateTable { def, if_not_exists: false }, 2).unwrap().0
    }

    #[test]
    fn placeholders_alone_are_bound_as_columns_and_the_rest_take_the_sql_path() {
        let c = catalog();
        let target = |sql: &str| bound_insert(sql, &c).map(|b| (b.table, b.targets));
        let all = |names: &[&str], at: &[usize]| {
            Some(("t".to_string(), names.iter().map(|n| n.to_string()).zip(at.iter().copied()).collect::<Vec<_>>()))
        };
        assert_eq!(target("INSERT INTO t VALUES (?, ?, ?)"), all(&["id", "name", "Big"], &[0, 1, 2]));
        assert_eq!(target("insert into T (name, id) values ($2, $1);"), all(&["name", "id"], &[1, 0]));
        assert_eq!(target("INSERT INTO t (\"Big\") VALUES (?)"), all(&["Big"], &[0]));
        for other in [
            "INSERT INTO t VALUES (?, ?)",                // fewer values than columns
            "INSERT INTO t (id) VALUES (? + 1)",          // an expression
            "INSERT INTO t (id, name) VALUES ($1, $1)",   // a parameter twice
            "INSERT INTO t (id, name) VALUES (?, $2)",    // mixed styles
            "INSERT INTO t (id) VALUES (?), (?)",         // two rows
            "INSERT INTO t (Big) VALUES (?)",             // folds to a column that does not exist
            "INSERT INTO t (id, id) VALUES (?, ?)",       // a column twice
            "INSERT INTO nope (id) VALUES (?)",           // no such table
            "INSERT INTO public.t (id) VALUES (?)",       // qualified
            "INSERT INTO t (id) SELECT ?",                // not VALUES
            "INSERT INTO t (id) VALUES (?) RETURNING id", // more than an insert
            "SELECT ?",
            "INSERT INTO t (id) VALUES (?); SELECT 1",
        ] {
            assert_eq!(target(other), None, "{other}");
        }
        let insert = bound_insert("INSERT INTO t (name, id) VALUES ($2, $1)", &c).unwrap();
        let batch = RecordBatch::try_from_iter([
            ("p1", Arc::new(Int64Array::from(vec![7])) as ArrayRef),
            ("p2", Arc::new(StringArray::from(vec!["seven"])) as ArrayRef),
        ])
        .unwrap();
        let rows = insert.rows(&batch).unwrap();
        assert_eq!(rows.schema().field(0).name(), "name");
        assert_eq!(rows.column(1).as_any().downcast_ref::<Int64Array>().unwrap().value(0), 7);
        let one = RecordBatch::try_from_iter([("p1", Arc::new(Int64Array::from(vec![7])) as ArrayRef)]).unwrap();
        assert!(insert.rows(&one).unwrap_err().message().contains("1 values were bound, the statement takes 2"));
    }
}
