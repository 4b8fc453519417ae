//! `information_schema.columns.ordinal_position` counted from 1, as the SQL standard and
//! PostgreSQL count it.
//!
//! Why: DataFusion's `information_schema.columns` numbers a table's columns from 0, so a client
//! that reads a table's layout there (JDBC tools, ORMs that read `ordinal_position` to order
//! columns, `WHERE ordinal_position = 1` for the first column) was one off, with no error.
//!
//! How: [`OrdinalFromOne`], an analyzer rule, puts a projection over every scan of that table
//! that gives `ordinal_position + 1` under its name and qualifier, every other column as it is.

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{Column, ScalarValue};
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder, lit};
use datafusion::optimizer::AnalyzerRule;

/// The analyzer rule (see the module doc).
#[derive(Debug, Default)]
pub struct OrdinalFromOne;

impl AnalyzerRule for OrdinalFromOne {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        plan.transform_up_with_subqueries(|node| {
            let LogicalPlan::TableScan(scan) = &node else { return Ok(Transformed::no(node)) };
            if scan.table_name.table() != "columns" || scan.table_name.schema() != Some("information_schema") {
                return Ok(Transformed::no(node));
            }
            let schema = std::sync::Arc::clone(node.schema());
            let columns = schema
                .iter()
                .map(|(qualifier, field)| {
                    let column = Expr::Column(Column::new(qualifier.cloned(), field.name()));
                    if field.name() == "ordinal_position" {
                        let one = ScalarValue::from(1u64).cast_to(field.data_type())?;
                        Ok((column + lit(one)).alias_qualified(qualifier.cloned(), field.name()))
                    } else {
                        Ok(column)
                    }
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(Transformed::yes(LogicalPlanBuilder::from(node).project(columns)?.build()?))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "shardwise_information_schema_ordinal_from_one"
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use datafusion::arrow::util::pretty::pretty_format_batches;
    use datafusion::prelude::{SessionConfig, SessionContext};

    #[tokio::test]
    async fn the_first_column_is_1() -> Result<()> {
        let ctx = SessionContext::new_with_config(SessionConfig::new().with_information_schema(true));
        ctx.add_analyzer_rule(Arc::new(OrdinalFromOne));
        ctx.sql("CREATE TABLE t (a INT, b INT)").await?.collect().await?;
        let sql = "SELECT column_name, ordinal_position FROM information_schema.columns \
                   WHERE table_name = 't' ORDER BY ordinal_position";
        let out = pretty_format_batches(&ctx.sql(sql).await?.collect().await?)?.to_string();
        assert!(out.contains("| a           | 1                |") && out.contains("| b           | 2 "), "{out}");
        let sql = "SELECT column_name FROM information_schema.columns WHERE table_name = 't' AND ordinal_position = 1";
        let out = pretty_format_batches(&ctx.sql(sql).await?.collect().await?)?.to_string();
        assert!(out.contains("| a ") && !out.contains("| b "), "{out}");
        Ok(())
    }
}
