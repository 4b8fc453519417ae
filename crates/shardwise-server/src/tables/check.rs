//! `CHECK TABLE t`'s cluster half: every node reads and checksums its replicas of `t`
//! (`shardwise_storage::content_checksum`, on the background threads) and says how many of `t`'s
//! rows its outbox still holds for each destination; the initiator gathers the answers and
//! `shardwise_query::check_table` compares the replicas shard by shard.
//!
//! Every node is asked at once (`DoAction("check")`), not only those holding replicas: any node
//! may hold queued rows of the table. A node that does not answer within `check_timeout_ms` plus
//! a second (this one included), or that the membership lists as down (not asked), has its
//! replicas reported as not read, with why ([`TablesNode::share_on`]). So does a replica whose
//! files were removed from under its running node
//! ([`shardwise_storage::ShardStore::missing_files`]): its node still holds its rows in memory,
//! but would not find them at its next start.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shardwise_cluster::NodeState;
use shardwise_query::QueryError;
use shardwise_query::ReplicaCheckRow;
use shardwise_query::check_table::{ReplicaRead, compare};
use shardwise_storage::{CatalogEntry, ContentChecksum, content_checksum};

use super::stats::PeerShare;
use super::{TablesNode, lock, lock_from_runtime, outbox_key_incarnation, storage_error};

/// A check request between nodes: one table incarnation, as the initiator's catalog names it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckRequest {
    pub table_id: u64,
    pub generation: u64,
    /// The catalog version the initiator saw the table in.
    pub catalog_version: u64,
}

/// A node's replicas of the table, and its queued rows of it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CheckReply {
    /// By shard: the replica's content, or why it could not be read.
    pub replicas: BTreeMap<u32, Result<ContentChecksum, String>>,
    /// By destination rank: the table's rows in this node's outbox.
    pub queued_rows: BTreeMap<u32, u64>,
    /// By shard: what the replica's last opening found suspect though it is read (the WAL's
    /// last record cut for failing its checksum: `ShardStore::warning`).
    #[serde(default)]
    pub warnings: BTreeMap<u32, String>,
}

impl TablesNode {
    /// Reads and checksums this node's replicas of the table `req` names.
    pub async fn check_local(&self, req: &CheckRequest) -> Result<CheckReply, QueryError> {
        let entry = self.incarnation_at(req.table_id, req.generation, req.catalog_version).await?;
        let mut reply = CheckReply::default();
        for ((key, dest), q) in lock_from_runtime(&self.outbox).stats() {
            if outbox_key_incarnation(&key) == Some((req.table_id, req.generation)) {
                *reply.queued_rows.entry(dest).or_default() += q.pending_rows;
            }
        }
        for shard in 0..entry.def.shards {
            if !entry.def.replica_ranks(shard, self.world_size).contains(&self.rank) {
                continue;
            }
            // Not for a table dropped meanwhile: opening its store would make its directory again.
            if !self.is_live(req.table_id, req.generation) {
                return Err(QueryError::Rejected(format!(
                    "table {} was dropped or truncated while it was checked",
                    entry.def.name
                )));
            }
            let content = self.replica_content(&entry, shard).await;
            let content = content.map(|(content, warning)| {
                reply.warnings.extend(warning.map(|w| (shard, format!("rank {}: {w}", self.rank))));
                content
            });
            reply.replicas.insert(shard, content.map_err(|why| format!("rank {}: {why}", self.rank)));
        }
        Ok(reply)
    }

    /// This node's replica of `shard`: its content and what its opening found suspect, or why
    /// it cannot be read.
    async fn replica_content(
        &self,
        entry: &CatalogEntry,
        shard: u32,
    ) -> Result<(ContentChecksum, Option<String>), String> {
        let store = self.store(entry, shard).await.map_err(|e| format!("its replica cannot be opened: {e}"))?;
        // Not a source while another replica of the shard awaits a rebuild (`replaced.rs`).
        if let Some(why) = self.awaiting.released_why((entry.id, entry.generation, shard)) {
            return Err(why);
        }
        let batches = {
            let guard = lock(&store);
            if let Some(why) = guard.unreadable() {
                return Err(why);
            }
            let missing = guard.missing_files().map_err(|e| format!("its files cannot be listed: {e}"))?;
            if !missing.is_empty() {
                return Err(format!(
                    "files of its replica are gone from {} ({}): removed while the node runs, whose memory still \
                     holds their rows; it would not find them at its next start",
                    guard.dir().display(),
                    missing.join(", ")
                ));
            }
            (guard.snapshot(), guard.warning())
        };
        let (batches, warning) = batches;
        let name = entry.def.name.clone();
        let summed = self.background.blocking(move || {
            content_checksum(&batches).map_err(|e| storage_error(format!("table {name} shard {shard}: {e}")))
        });
        summed.await.map(|content| (content, warning)).map_err(|e| e.to_string())
    }

    /// `CHECK TABLE`: every node's replicas of `table` read and compared, each node given
    /// `timeout`.
    pub(crate) async fn check_cluster(
        &self,
        table: &str,
        timeout: Duration,
    ) -> Result<Vec<ReplicaCheckRow>, QueryError> {
        let (catalog_version, entry) = self.entry(table)?;
        let req = CheckRequest { table_id: entry.id, generation: entry.generation, catalog_version };
        let body = serde_json::to_vec(&req).map_err(storage_error)?;
        let members = self.cluster.members().await;
        let down: Vec<u32> = members.iter().filter(|m| m.state == NodeState::Down).map(|m| m.rank).collect();
        let calls = (0..self.world_size).map(|rank| {
            let (body, req) = (body.clone(), &req);
            let known_down = down.contains(&rank);
            async move {
                let share = PeerShare {
                    kind: "check",
                    body,
                    timeout,
                    setting: "check_timeout_ms",
                    known_down,
                    if_down: ", so its replicas were not read",
                    unknown: ", so its replicas were not read",
                };
                let reply = self.share_on::<CheckReply>(rank, share, self.check_local(req)).await;
                (rank, reply)
            }
        });
        let replies: BTreeMap<u32, Result<CheckReply, QueryError>> =
            futures::future::join_all(calls).await.into_iter().collect();
        if !self.is_live(entry.id, entry.generation) {
            return Err(QueryError::Rejected(format!(
                "CHECK TABLE {table}: the table was dropped or truncated while it was checked"
            )));
        }
        let mut queued_rows: BTreeMap<u32, u64> = BTreeMap::new();
        for reply in replies.values().flatten() {
            for (dest, rows) in &reply.queued_rows {
                *queued_rows.entry(*dest).or_default() += rows;
            }
        }
        let mut reads = Vec::new();
        for shard in 0..entry.def.shards {
            for (replica, rank) in entry.def.replica_ranks(shard, self.world_size).into_iter().enumerate() {
                let warning = match replies.get(&rank) {
                    Some(Ok(reply)) => reply.warnings.get(&shard).cloned(),
                    _ => None,
                };
                let (content, replica_fault) = match replies.get(&rank) {
                    Some(Ok(reply)) => match reply.replicas.get(&shard) {
                        Some(content) => (content.clone(), content.is_err()),
                        None => (
                            Err(format!("rank {rank} did not report its replica (its catalog places it elsewhere)")),
                            false,
                        ),
                    },
                    Some(Err(e)) => (Err(e.to_string()), false),
                    None => (Err(format!("rank {rank} was not asked")), false),
                };
                reads.push(ReplicaRead { shard, replica: replica as u32, rank, content, replica_fault, warning });
            }
        }
        Ok(compare(table, reads, &queued_rows))
    }
}
