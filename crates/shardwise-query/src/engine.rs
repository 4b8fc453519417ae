//! [`QueryEngine`]: turns SQL text into a checked plan, and a plan into a stream of batches.
//!
//! Planning and execution are separate steps because the wire protocols need the result schema
//! before any row exists (Flight SQL's `GetFlightInfo`, pgwire's `Describe`). Planning therefore
//! never runs anything: DataFusion's `SessionContext::sql` would execute DDL while planning, so
//! this uses `SessionState::create_logical_plan` and refuses DDL/DML before the plan can run.

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{MemorySchemaProvider, SchemaProvider};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::{SQLOptions, SessionConfig, SessionContext};
use shardwise_cluster::ClusterView;

use crate::error::QueryError;
use crate::system_tables::{NODES_TABLE, NodesTable, SYSTEM_SCHEMA};

/// A statement that has been parsed, planned and checked, ready to execute.
#[derive(Debug, Clone)]
pub struct Planned {
    plan: LogicalPlan,
}

impl Planned {
    /// The Arrow schema of the statement's result (empty for statements such as `SET`).
    pub fn schema(&self) -> SchemaRef {
        Arc::clone(self.plan.schema().inner())
    }

    /// The DataFusion logical plan (for `EXPLAIN`-like tooling and tests).
    pub fn logical_plan(&self) -> &LogicalPlan {
        &self.plan
    }
}

/// The SQL session layer of one node: one DataFusion context with the `system` schema.
pub struct QueryEngine {
    ctx: SessionContext,
}

impl std::fmt::Debug for QueryEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueryEngine").field("session_id", &self.ctx.session_id()).finish_non_exhaustive()
    }
}

impl QueryEngine {
    /// Builds the engine and registers `system.nodes`, backed by `cluster`.
    pub fn new(cluster: Arc<dyn ClusterView>) -> Result<Self, QueryError> {
        let config = SessionConfig::new().with_information_schema(true);
        let ctx = SessionContext::new_with_config(config);
        let catalog_name = ctx.state().config_options().catalog.default_catalog.clone();
        let catalog = ctx.catalog(&catalog_name).ok_or_else(|| {
            QueryError::Internal(datafusion::error::DataFusionError::Internal(format!(
                "default catalog {catalog_name:?} is missing"
            )))
        })?;
        let system = Arc::new(MemorySchemaProvider::new());
        system
            .register_table(NODES_TABLE.to_string(), Arc::new(NodesTable::new(cluster)))
            .map_err(QueryError::Internal)?;
        catalog.register_schema(SYSTEM_SCHEMA, system).map_err(QueryError::Internal)?;
        Ok(QueryEngine { ctx })
    }

    /// What statements may run: queries and session statements (`SET`), but not DataFusion's own
    /// DDL and DML (`CREATE EXTERNAL TABLE`, `COPY`, `INSERT`), which would bypass shardwise.
    fn sql_options() -> SQLOptions {
        SQLOptions::new().with_allow_ddl(false).with_allow_dml(false).with_allow_statements(true)
    }

    /// Parses and plans one statement without executing anything.
    pub async fn plan(&self, sql: &str) -> Result<Planned, QueryError> {
        let plan = self.ctx.state().create_logical_plan(sql).await?;
        Self::sql_options()
            .verify_plan(&plan)
            .map_err(|e| QueryError::Unsupported(describe_refusal(&e.find_root().message())))?;
        Ok(Planned { plan })
    }

    /// Executes a planned statement; rows arrive on the returned stream (which can still fail,
    /// with errors `QueryError::from` classifies).
    pub async fn execute(&self, planned: Planned) -> Result<SendableRecordBatchStream, QueryError> {
        let frame = self.ctx.execute_logical_plan(planned.plan).await?;
        Ok(frame.execute_stream().await?)
    }
}

/// Rewrites DataFusion's "DDL not supported: CreateExternalTable" as
/// "CreateExternalTable (DDL)", to follow the "statement not supported: " prefix.
fn describe_refusal(message: &str) -> String {
    match message.split_once(" not supported: ") {
        Some((kind, what)) => format!("{what} ({kind})"),
        None => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_is_rephrased() {
        assert_eq!(describe_refusal("DDL not supported: CreateExternalTable"), "CreateExternalTable (DDL)");
        assert_eq!(describe_refusal("something else"), "something else");
    }
}
