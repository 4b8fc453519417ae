//! A window that names another (`OVER (w ORDER BY x)`, `WINDOW w2 AS (w1 ROWS ...)`) copies the
//! named window's clauses, as PostgreSQL and DuckDB do.
//!
//! Why: DataFusion resolves `OVER w` but reads `OVER (w ...)` as if the name were not there:
//! `sum(v) OVER (w ORDER BY id)` with `WINDOW w AS (PARTITION BY g)` summed over all rows, no
//! error.
//!
//! How: [`copy_named_windows`], a pass over the parsed statement, resolves each SELECT's named
//! windows in order (one may name an earlier one) and writes into every window that names one
//! its `PARTITION BY`, its `ORDER BY` unless the window has its own, and its frame unless the
//! window has its own (the SQL standard's rules for a window that names another).

use std::collections::HashMap;
use std::ops::ControlFlow;

use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{
    Expr, NamedWindowExpr, Query, SetExpr, VisitMut, VisitorMut, WindowSpec, WindowType,
};

/// Rewrites `statement` (see the module doc).
pub fn copy_named_windows(statement: &mut DfStatement) {
    crate::repeated_items::visit_statement_mut(statement, &mut EachQuery);
}

struct EachQuery;

impl VisitorMut for EachQuery {
    type Break = ();

    fn pre_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
        let windows = match query.body.as_mut() {
            SetExpr::Select(select) if !select.named_window.is_empty() => {
                let windows = resolved(&mut select.named_window);
                let mut copier = CopyInto { windows: &windows };
                for item in select.projection.iter_mut() {
                    let _ = item.visit(&mut copier);
                }
                if let Some(qualify) = select.qualify.as_mut() {
                    let _ = qualify.visit(&mut copier);
                }
                windows
            }
            _ => return ControlFlow::Continue(()),
        };
        if let Some(order_by) = query.order_by.as_mut() {
            let _ = order_by.visit(&mut CopyInto { windows: &windows });
        }
        ControlFlow::Continue(())
    }
}

/// The named windows of a SELECT by name, each written out in full; the definitions rewritten
/// so too (DataFusion then finds them whole).
fn resolved(definitions: &mut [datafusion::sql::sqlparser::ast::NamedWindowDefinition]) -> HashMap<String, WindowSpec> {
    let mut windows: HashMap<String, WindowSpec> = HashMap::new();
    for definition in definitions.iter_mut() {
        let name = definition.0.value.clone();
        let spec = match &mut definition.1 {
            NamedWindowExpr::WindowSpec(spec) => {
                copy_from(spec, &windows);
                spec.clone()
            }
            NamedWindowExpr::NamedWindow(other) => match windows.get(&other.value) {
                Some(spec) => spec.clone(),
                None => continue,
            },
        };
        windows.insert(name, spec);
    }
    windows
}

/// `spec` with the clauses of the window it names (if it names one that is defined).
fn copy_from(spec: &mut WindowSpec, windows: &HashMap<String, WindowSpec>) {
    let Some(name) = &spec.window_name else { return };
    let Some(named) = windows.get(&name.value) else { return };
    if spec.partition_by.is_empty() {
        spec.partition_by = named.partition_by.clone();
    }
    if spec.order_by.is_empty() {
        spec.order_by = named.order_by.clone();
    }
    if spec.window_frame.is_none() {
        spec.window_frame = named.window_frame.clone();
    }
    spec.window_name = None;
}

/// Rewrites each `OVER (name ...)` below it from `windows`.
struct CopyInto<'a> {
    windows: &'a HashMap<String, WindowSpec>,
}

impl VisitorMut for CopyInto<'_> {
    type Break = ();

    fn pre_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        if let Expr::Function(function) = expr
            && let Some(WindowType::WindowSpec(spec)) = function.over.as_mut()
        {
            copy_from(spec, self.windows);
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    fn rewritten(sql: &str) -> String {
        crate::sql_ast::rewritten_by(sql, copy_named_windows)
    }

    #[test]
    fn a_window_naming_another_gets_its_clauses() {
        let sql = rewritten("SELECT sum(v) OVER (w ORDER BY id) FROM t WINDOW w AS (PARTITION BY g)");
        assert!(sql.contains("OVER (PARTITION BY g ORDER BY id)"), "{sql}");
        let sql = rewritten(
            "SELECT sum(v) OVER (w ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) FROM t \
             WINDOW w0 AS (PARTITION BY g), w AS (w0 ORDER BY id)",
        );
        assert!(sql.contains("OVER (PARTITION BY g ORDER BY id ROWS BETWEEN 1 PRECEDING AND CURRENT ROW)"), "{sql}");
        // `OVER w` is DataFusion's to resolve, and a window naming nothing known stays as written.
        let sql = rewritten("SELECT sum(v) OVER w, sum(v) OVER (x ORDER BY id) FROM t WINDOW w AS (PARTITION BY g)");
        assert!(sql.contains("OVER w,") && sql.contains("OVER (x ORDER BY id)"), "{sql}");
    }
}
