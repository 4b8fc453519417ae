//! `OPTIMIZE TABLE t [FINAL]`, ClickHouse's "merge now": every replica of every shard of `t`, on
//! every node that holds one, writes its memory buffer as a part (so a restart replays none of
//! its WAL) and merges its small parts into one, or with `FINAL` all of its parts
//! ([`shardwise_storage::ShardStore::optimize`]). The background maintenance does the same when
//! limits are reached; this is for when the user wants it done now, e.g. after a bulk load.
//!
//! The initiator asks each node holding a replica at once (`DoAction("optimize")`) and waits for
//! all, up to `optimize_timeout_ms`. Every replica it reaches is optimized whatever happens to
//! the others, and optimizing twice does no harm, so a failure names what was not done and a
//! retry finishes it.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shardwise_cluster::NodeState;
use shardwise_query::QueryError;
use shardwise_storage::OptimizeOutcome;

use super::stats::PeerShare;
use super::{TablesNode, lock, storage_error};

/// An optimize request between nodes: one table incarnation, as the initiator's catalog names it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptimizeRequest {
    pub table_id: u64,
    pub generation: u64,
    /// `FINAL`: merge every part, not only the small ones.
    pub all_parts: bool,
    /// The catalog version the initiator saw the table in.
    pub catalog_version: u64,
}

/// What a node did to its replicas of the table.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct OptimizeReply {
    pub replicas: Vec<OptimizedReplica>,
}

/// One replica's outcome.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OptimizedReplica {
    pub shard: u32,
    pub flushed_rows: u64,
    pub merged_parts: u64,
    pub parts: u64,
}

impl TablesNode {
    /// Optimizes this node's replicas of the table `req` names, one after another on the
    /// background threads (each holds its store's lock while it writes, as maintenance does).
    pub async fn optimize_local(&self, req: &OptimizeRequest) -> Result<OptimizeReply, QueryError> {
        let entry = self.incarnation_at(req.table_id, req.generation, req.catalog_version).await?;
        let mut reply = OptimizeReply::default();
        let dropped = || {
            QueryError::Rejected(format!("table {} was dropped or truncated while it was optimized", entry.def.name))
        };
        for shard in 0..entry.def.shards {
            if !entry.def.replica_ranks(shard, self.world_size).contains(&self.rank) {
                continue;
            }
            // Not for a table dropped meanwhile: opening its store would make its directory again.
            if !self.is_live(req.table_id, req.generation) {
                return Err(dropped());
            }
            let store = self.store(&entry, shard).await?;
            let all_parts = req.all_parts;
            let name = entry.def.name.clone();
            let outcome: OptimizeOutcome = self
                .background
                .blocking(move || {
                    lock(&store)
                        .optimize(all_parts)
                        .map_err(|e| storage_error(format!("table {name} shard {shard}: {e}")))
                })
                .await
                .map_err(|e| if self.is_live(req.table_id, req.generation) { e } else { dropped() })?;
            reply.replicas.push(OptimizedReplica {
                shard,
                flushed_rows: outcome.flushed_rows,
                merged_parts: outcome.merged_parts as u64,
                parts: outcome.parts as u64,
            });
        }
        Ok(reply)
    }

    /// `OPTIMIZE TABLE`: every node holding a replica of `table` optimizes it; fails naming
    /// each node that did not finish within `timeout` (the others' replicas are optimized).
    pub(crate) async fn optimize_cluster(
        &self,
        table: &str,
        all_parts: bool,
        timeout: Duration,
    ) -> Result<(), QueryError> {
        let (catalog_version, entry) = self.entry(table)?;
        let req = OptimizeRequest { table_id: entry.id, generation: entry.generation, all_parts, catalog_version };
        let body = serde_json::to_vec(&req).map_err(storage_error)?;
        let ranks: BTreeSet<u32> =
            (0..entry.def.shards).flat_map(|s| entry.def.replica_ranks(s, self.world_size)).collect();
        let members = self.cluster.members().await;
        let down: Vec<u32> = members.iter().filter(|m| m.state == NodeState::Down).map(|m| m.rank).collect();
        let calls = ranks.into_iter().map(|rank| {
            let (body, req) = (body.clone(), &req);
            let known_down = down.contains(&rank);
            async move {
                let share = PeerShare {
                    kind: "optimize",
                    body,
                    timeout,
                    setting: "optimize_timeout_ms",
                    known_down,
                    if_down: ": its replicas were not optimized; run OPTIMIZE again once it is up",
                    unknown: ", so whether its replicas were merged is unknown",
                };
                let result = self.share_on::<OptimizeReply>(rank, share, self.optimize_local(req)).await.map(|_| ());
                result.map_err(|e| (rank, e))
            }
        });
        let failed: Vec<(u32, QueryError)> =
            futures::future::join_all(calls).await.into_iter().filter_map(Result::err).collect();
        if failed.is_empty() {
            return Ok(());
        }
        if !self.is_live(entry.id, entry.generation) {
            return Err(QueryError::Rejected(format!(
                "OPTIMIZE TABLE {table}: the table was dropped or truncated while it was optimized"
            )));
        }
        let reasons: Vec<String> = failed.iter().map(|(rank, e)| format!("rank {rank}: {e}")).collect();
        Err(QueryError::Unavailable(format!(
            "OPTIMIZE TABLE {table}: the replicas on {} were not optimized, or not yet ({}); the other nodes' \
             were, and running it again finishes the job",
            match failed.len() {
                1 => format!("rank {}", failed[0].0),
                _ => format!("ranks {}", failed.iter().map(|(r, _)| r.to_string()).collect::<Vec<_>>().join(", ")),
            },
            reasons.join("; ")
        )))
    }
}
