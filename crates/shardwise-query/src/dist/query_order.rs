//! The query's own ORDER BY and LIMIT, carried from the logical plan to the distributed planner
//! for `distributed_group_by_no_merge = 2`.
//!
//! Mode 2 runs the whole query on each shard, then the initiator orders the shards' rows by the
//! query's ORDER BY and applies its LIMIT / OFFSET. The physical plan does not always say what
//! that ORDER BY was: DataFusion drops a sort that an operator's output already satisfies (`ORDER
//! BY rn` over `row_number() OVER (ORDER BY count(*) DESC)` becomes "already sorted by
//! `count(*) DESC`"), and an ordering that is equivalent within one node is not across shards
//! (each shard numbers its own rows from 1). So [`QueryOrder::of`] reads the ORDER BY and LIMIT
//! from the logical plan, as the user wrote them, and the engine hands them to the planner in the
//! statement's configuration (an extension no `SET` can reach and no listing shows).

use std::any::Any;

use datafusion::common::config::{ConfigEntry, ConfigExtension, ConfigOptions, ExtensionOptions};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::logical_plan::{FetchType, SkipType};
use datafusion::logical_expr::{Expr, LogicalPlan};

/// One ORDER BY term, named as the column of the sort's input that it reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderKey {
    pub column: String,
    pub descending: bool,
    pub nulls_first: bool,
}

/// The outermost ORDER BY and LIMIT / OFFSET of a query.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueryOrder {
    /// Empty when the query has no ORDER BY.
    pub keys: Vec<OrderKey>,
    /// An ORDER BY term that is not a plain column (`ORDER BY a + b`), shown in errors.
    pub unresolved: Option<String>,
    pub skip: usize,
    pub fetch: Option<usize>,
}

impl ExtensionOptions for QueryOrder {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn cloned(&self) -> Box<dyn ExtensionOptions> {
        Box::new(self.clone())
    }

    fn set(&mut self, key: &str, _value: &str) -> Result<()> {
        Err(DataFusionError::Configuration(format!("{}.{key} is not a setting", Self::PREFIX)))
    }

    fn entries(&self) -> Vec<ConfigEntry> {
        Vec::new()
    }
}

impl ConfigExtension for QueryOrder {
    const PREFIX: &'static str = "shardwise_query_order";
}

impl QueryOrder {
    /// The ORDER BY and LIMIT of `plan` (through EXPLAIN and projections above them). Those of
    /// a subquery (below a `SubqueryAlias`) are the subquery's, which each shard applies to its
    /// own rows: they are not the query's.
    pub fn of(plan: &LogicalPlan) -> QueryOrder {
        let mut order = QueryOrder::default();
        let mut limit_seen = false;
        let mut node = plan;
        loop {
            match node {
                LogicalPlan::Explain(e) => node = e.plan.as_ref(),
                LogicalPlan::Analyze(a) => node = a.input.as_ref(),
                LogicalPlan::Projection(p) => node = p.input.as_ref(),
                LogicalPlan::Limit(limit) if !limit_seen => {
                    limit_seen = true;
                    if let Ok(SkipType::Literal(skip)) = limit.get_skip_type() {
                        order.skip = skip;
                    }
                    if let Ok(FetchType::Literal(fetch)) = limit.get_fetch_type() {
                        order.fetch = fetch;
                    }
                    node = limit.input.as_ref();
                }
                LogicalPlan::Sort(sort) => {
                    if !limit_seen {
                        order.fetch = sort.fetch;
                    }
                    let input = sort.input.schema();
                    for term in &sort.expr {
                        // A column of the sort's input, or a term computed below it under its
                        // own name (`ORDER BY count(*)` over the aggregation's `count(*)`).
                        let column = match term.expr.clone().unalias() {
                            Expr::Column(c) => Some(c.name),
                            other => Some(other.schema_name().to_string())
                                .filter(|name| input.fields().iter().any(|f| f.name() == name)),
                        };
                        match column {
                            Some(column) => order.keys.push(OrderKey {
                                column,
                                descending: !term.asc,
                                nulls_first: term.nulls_first,
                            }),
                            None => {
                                order.unresolved.get_or_insert_with(|| term.expr.to_string());
                            }
                        }
                    }
                    return order;
                }
                _ => return order,
            }
        }
    }

    /// Puts `self` in the statement's configuration, for the planner.
    pub fn install(self, options: &mut ConfigOptions) {
        options.extensions.insert(self);
    }

    /// What [`QueryOrder::install`] put in `options`, if anything.
    pub fn installed(options: &ConfigOptions) -> Option<&QueryOrder> {
        options.extensions.get::<QueryOrder>()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::datasource::MemTable;
    use datafusion::prelude::SessionContext;

    use super::*;

    async fn order_of(sql: &str) -> QueryOrder {
        let ctx = SessionContext::new();
        let schema =
            Arc::new(Schema::new(vec![Field::new("g", DataType::Utf8, true), Field::new("v", DataType::Int64, true)]));
        let table = MemTable::try_new(schema, vec![vec![]]).expect("an empty table");
        ctx.register_table("t", Arc::new(table)).expect("registered");
        QueryOrder::of(&ctx.state().create_logical_plan(sql).await.expect("planned"))
    }

    fn key(column: &str, descending: bool, nulls_first: bool) -> OrderKey {
        OrderKey { column: column.into(), descending, nulls_first }
    }

    #[tokio::test]
    async fn the_order_and_limit_as_written() {
        let sql = "SELECT g, count(*) c, row_number() OVER (ORDER BY count(*) DESC) rn FROM t GROUP BY g \
                   ORDER BY rn, g DESC LIMIT 3 OFFSET 2";
        let order = order_of(sql).await;
        assert_eq!(order.keys, vec![key("rn", false, false), key("g", true, true)]);
        assert_eq!((order.skip, order.fetch, order.unresolved), (2, Some(3), None));
        let order = order_of(&format!("EXPLAIN {sql}")).await;
        assert_eq!(order.keys.len(), 2);
    }

    #[tokio::test]
    async fn hidden_and_computed_terms() {
        // ORDER BY a column the SELECT list does not show: still a column of the sort's input.
        let order = order_of("SELECT g FROM t GROUP BY g ORDER BY count(*) DESC LIMIT 1").await;
        assert_eq!(order.keys, vec![key("count(Int64(1))", true, true)]);
        let order = order_of("SELECT g, v FROM t ORDER BY v + 1").await;
        assert!(order.keys.is_empty() && order.unresolved.is_some(), "{order:?}");
        assert_eq!(order_of("SELECT g FROM t LIMIT 5").await, QueryOrder { fetch: Some(5), ..Default::default() });
        // A subquery's ORDER BY and LIMIT are not the query's.
        let sub = "SELECT * FROM (SELECT g, count(*) c FROM t GROUP BY g ORDER BY c DESC LIMIT 3) z";
        assert_eq!(order_of(sub).await, QueryOrder::default());
        let order = order_of(&format!("{sub} ORDER BY g LIMIT 5")).await;
        assert_eq!((order.keys, order.fetch), (vec![key("g", false, false)], Some(5)));
    }
}
