//! Reads that gather from the whole cluster: a table scan (one replica of each shard),
//! `SYSTEM FLUSH DISTRIBUTED` (every node's queues for the table), `system.shards` and
//! `system.sync_queues` (every node's local view). Each has a local half, which the data plane
//! serves to the other nodes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use shardwise_cluster::NodeState;
use shardwise_query::{QueryError, ShardData, ShardReplicaRow, SyncQueueRow};

use super::insert::unix_ms;
use super::{TablesNode, lock, lock_from_runtime, outbox_key_entry, outbox_key_incarnation, outbox_key_table};

/// Which local shard replica a query fragment reads.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScanTicket {
    pub table_id: u64,
    pub generation: u64,
    pub shard: u32,
    /// The catalog version the reader planned with.
    pub catalog_version: u64,
}

/// One local shard replica's figures, for `system.shards`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LocalShardStats {
    pub table_id: u64,
    pub generation: u64,
    pub shard: u32,
    /// `None` when the replica cannot be opened (`problem` says why).
    pub rows: Option<u64>,
    pub bytes: Option<u64>,
    pub parts: Option<u64>,
    pub verified_placement: Option<bool>,
    /// Why the replica is not read, if it is not (`ShardStore::unreadable`, or why it cannot be
    /// opened).
    #[serde(default)]
    pub problem: Option<String>,
}

/// How long `system.shards` and `system.sync_queues` wait for another node's figures; the nodes
/// are asked at once, and those the membership knows to be down are not asked.
pub const PEER_STATS_TIMEOUT_MS: u64 = 5_000;

/// How much longer than a statement's own timeout (`flush_timeout_ms`, `optimize_timeout_ms`)
/// its initiator waits for another node's answer: that node stops at the same timeout, measured
/// from when the request reached it.
pub const PEER_REPLY_GRACE_MS: u64 = 1_000;

/// How [`TablesNode::share_on`] asks a node for its share of a statement.
pub(crate) struct PeerShare<'a> {
    /// The data plane action.
    pub kind: &'a str,
    pub body: Vec<u8>,
    /// The statement's timeout, and the setting that gave it (for messages).
    pub timeout: Duration,
    pub setting: &'a str,
    /// The membership lists the node as down.
    pub known_down: bool,
    /// What follows "rank N is down (so the membership says)".
    pub if_down: &'a str,
    /// What follows a "did not answer" or "had not finished": what is not known.
    pub unknown: &'a str,
}

/// A flush request between nodes: the table by name (for messages) and by the incarnation the
/// initiator resolved when the flush began, which the rows are waited for by.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FlushRequest {
    pub table: String,
    pub timeout_ms: u64,
    /// `(table id, generation)`; absent from an older node's request: then the name, resolved
    /// once by the node that waits.
    #[serde(default)]
    pub incarnation: Option<(u64, u64)>,
}

/// A node's answer to a flush request: what it still had pending for the table when its
/// `flush_timeout_ms` ran out, one line per destination; empty when it shipped everything.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct FlushReply {
    pub pending: Vec<String>,
}

impl FlushReply {
    /// The reply of `rank`; a malformed one is that node's fault, named as such.
    fn decode(rank: u32, body: &[u8]) -> Result<FlushReply, QueryError> {
        serde_json::from_slice(body)
            .map_err(|e| QueryError::Unavailable(format!("rank {rank} answered the flush with a malformed reply: {e}")))
    }

    pub fn encode(&self) -> Vec<u8> {
        // A struct of strings always serializes.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

impl TablesNode {
    /// This node's replica of a shard, with its placement flag, for a query fragment.
    pub(crate) async fn read_shard_data(&self, ticket: &ScanTicket) -> Result<ShardData, QueryError> {
        // A catalog newer than the initiator's without the table: it was dropped or truncated
        // after the version the query was planned with. Unavailable, not the statement's fault:
        // when that change came before the query began, the initiator is the one behind (a worker
        // cut off from the master plans with the catalog it has), and the same query through a
        // node with a current catalog answers. When it came while the query ran, the initiator
        // finds the table gone from its own catalog once its replicas fail, and says so.
        let (version, catalog) = self.catalog_at_least(ticket.catalog_version).await;
        let dropped = || {
            let error = match version > ticket.catalog_version {
                true => QueryError::Unavailable,
                false => QueryError::Rejected,
            };
            error(format!(
                "rank {}: table id {} generation {} is not in its catalog (version {version}; the query was planned \
                 with version {}): the table was dropped or truncated since. If that was before the query began, the \
                 node it was sent to has not received the change (it may have no connection to the master: see its \
                 /health): send it through another node, or again once that node has caught up",
                self.rank, ticket.table_id, ticket.generation, ticket.catalog_version
            ))
        };
        let entry =
            catalog.by_id(ticket.table_id).filter(|e| e.generation == ticket.generation).ok_or_else(dropped)?.clone();
        if !entry.def.replica_ranks(ticket.shard, self.world_size).contains(&self.rank) {
            return Err(QueryError::Unavailable(format!(
                "rank {} holds no replica of table {} shard {}",
                self.rank, entry.def.name, ticket.shard
            )));
        }
        // Its files removed under the read (`No such file or directory`): said as what happened.
        let store = match self.store(&entry, ticket.shard).await {
            Ok(store) => store,
            Err(_) if !self.is_live(ticket.table_id, ticket.generation) => return Err(dropped()),
            Err(e) => return Err(e),
        };
        let guard = lock(&store);
        if let Some(why) = guard.unreadable() {
            // Unavailable: the fragment is tried on another replica (or the shard skipped).
            return Err(QueryError::Unavailable(format!(
                "rank {}: its replica of table {} shard {} is not read: {why}",
                self.rank, entry.def.name, ticket.shard
            )));
        }
        Ok(ShardData { batches: guard.snapshot(), verified_placement: guard.stats().verified_placement })
    }

    /// Waits until this node's outbox has delivered every item it held for the table
    /// `incarnation` (`table` when not given: the one that has the name now) when the flush
    /// began, up to `timeout`; returns what is still pending then, one line per destination
    /// (empty: flushed).
    ///
    /// Items appended after the flush began are not waited for (ClickHouse's flush also sends
    /// the queue as it is): under writers that never pause, a flush that waited for an empty
    /// queue took as long as they left it none, or `flush_timeout_ms`. An insert acknowledged
    /// before the flush was sent was appended before it began, on every node.
    ///
    /// The table is waited for by the identity it had when the flush began, not looked up by
    /// name again: a `RENAME TABLE` while the flush waits (its rows follow the table) made the
    /// name resolve to nothing, and the flush answer done with rows still queued.
    pub async fn flush_local(
        &self,
        table: &str,
        incarnation: Option<(u64, u64)>,
        timeout: Duration,
    ) -> Result<FlushReply, QueryError> {
        // A timeout past what an Instant holds (`flush_timeout_ms = 18446744073709551615`): none.
        let deadline = Instant::now().checked_add(timeout);
        // Queued rows by the table's identity: some may have been queued under a name it had
        // before a rename (one queue per name), the same destination in each.
        let live = match incarnation {
            Some(incarnation) => Some(incarnation),
            None => self.entry(table).ok().map(|(_, e)| (e.id, e.generation)),
        };
        let began_at_seq = lock_from_runtime(&self.outbox).next_seq();
        loop {
            // By destination still holding an item from before the flush began: the rows pending
            // for it now, and the outbox key of a queue holding them.
            let mut pending: BTreeMap<u32, (u64, String)> = BTreeMap::new();
            {
                let outbox = lock_from_runtime(&self.outbox);
                for ((key, dest), q) in outbox.stats() {
                    if q.pending_items > 0 && live.is_some() && outbox_key_incarnation(&key) == live {
                        pending.entry(dest).or_insert_with(|| (0, key.clone())).0 += q.pending_rows;
                    }
                }
                let ours = |key: &str| outbox_key_incarnation(key) == live;
                pending.retain(|dest, _| outbox.any_pending_before(*dest, began_at_seq, ours));
            }
            if pending.is_empty() {
                return Ok(FlushReply::default());
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                let pending = pending
                    .iter()
                    .map(|(dest, (rows, key))| {
                        let last_error = self.senders.last_error_noted(*dest, key);
                        let last = last_error.map(|e| format!(" ({e})")).unwrap_or_default();
                        format!("rank {} -> rank {dest}: {rows} rows{last}", self.rank)
                    })
                    .collect();
                return Ok(FlushReply { pending });
            }
            self.senders.hurry_all();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub(crate) async fn flush_cluster(&self, table: &str, timeout: Duration) -> Result<(), QueryError> {
        let (_, entry) = self.entry(table)?;
        let incarnation = Some((entry.id, entry.generation));
        let request = FlushRequest { table: table.to_string(), timeout_ms: timeout.as_millis() as u64, incarnation };
        let body = serde_json::to_vec(&request).map_err(|e| QueryError::Storage(e.to_string()))?;
        let members = self.cluster.members().await;
        let down: Vec<u32> = members.iter().filter(|m| m.state == NodeState::Down).map(|m| m.rank).collect();
        let calls = (0..self.world_size).map(|rank| {
            let body = body.clone();
            let known_down = down.contains(&rank);
            async move {
                if rank == self.rank {
                    return self.flush_local(table, incarnation, timeout).await.map(|r| r.pending);
                }
                let unknown = format!(", so what it holds for {table} is unknown");
                let reply = self.ask_within(rank, "flush", body, timeout, "flush_timeout_ms", known_down, &unknown);
                FlushReply::decode(rank, &reply.await?).map(|r| r.pending)
            }
        });
        // Rows still pending when a node's wait ended, and nodes that could not be asked (or did
        // not answer): the second may come at once (a connection refused), not after the timeout.
        let (mut still, mut unasked) = (Vec::new(), Vec::new());
        for result in futures::future::join_all(calls).await {
            match result {
                Ok(pending) => still.extend(pending),
                Err(QueryError::Unavailable(m)) => unasked.push(m),
                Err(e) => unasked.push(e.to_string()),
            }
        }
        let mut said = Vec::new();
        if !still.is_empty() {
            said.push(format!(
                "did not finish within flush_timeout_ms = {} ms; still pending: {}",
                timeout.as_millis(),
                still.join("; ")
            ));
        }
        if !unasked.is_empty() {
            said.push(format!(
                "could not learn from every node whether its rows were delivered: {}",
                unasked.join("; ")
            ));
        }
        match said.is_empty() {
            true => Ok(()),
            false => {
                Err(QueryError::Unavailable(format!("SYSTEM FLUSH DISTRIBUTED {table} {}", said.join("; and it "))))
            }
        }
    }

    /// Asks `rank` for `kind` (a statement's share there, which that node bounds by `timeout`,
    /// the statement's `setting`), waiting [`PEER_REPLY_GRACE_MS`] longer: a node that cannot
    /// answer by then (stopped, hung, unreachable) is named as such rather than making the
    /// statement wait longer. One the membership takes for down is asked all the same (it may be
    /// back already: the membership learns that late), and named as down if it does not answer.
    /// `unknown` (", so ... is unknown") follows either name.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn ask_within(
        &self,
        rank: u32,
        kind: &str,
        body: Vec<u8>,
        timeout: Duration,
        setting: &str,
        known_down: bool,
        unknown: &str,
    ) -> Result<Vec<u8>, QueryError> {
        let wait = timeout + Duration::from_millis(PEER_REPLY_GRACE_MS);
        let call = self.peers.action(rank, kind, body, wait + Duration::from_millis(PEER_REPLY_GRACE_MS));
        match tokio::time::timeout(wait, call).await {
            Ok(Ok(reply)) => Ok(reply),
            Err(_) | Ok(Err(QueryError::Unavailable(_))) if known_down => {
                Err(QueryError::Unavailable(format!("rank {rank} is down (so the membership says){unknown}")))
            }
            // The data plane's pings went unanswered (`peer_keepalive_interval_ms`, `peer_keepalive_timeout_ms`): the node is
            // stopped or hung, as when the wait runs out, and said alike (not as HTTP/2's words).
            Ok(Err(QueryError::Unavailable(m))) if m.contains("keep-alive timed out") => {
                Err(QueryError::Unavailable(format!(
                    "rank {rank} did not answer (its connection's keep-alive pings went unanswered){unknown} (the \
                     node may be stopped or overloaded)"
                )))
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(QueryError::Unavailable(format!(
                "rank {rank} did not answer within {setting} + {PEER_REPLY_GRACE_MS} ms{unknown} (the node may be \
                 stopped or overloaded)"
            ))),
        }
    }

    /// A statement's share on `rank`, every node given the same wait (`share.timeout` plus
    /// [`PEER_REPLY_GRACE_MS`]): `local` when `rank` is this node; not asked, and named at once,
    /// when the membership lists it as down (a hung node would hold the statement until its
    /// connection gave up); else asked ([`Self::ask_within`]) and its JSON reply decoded.
    pub(crate) async fn share_on<T: serde::de::DeserializeOwned>(
        &self,
        rank: u32,
        share: PeerShare<'_>,
        local: impl std::future::Future<Output = Result<T, QueryError>>,
    ) -> Result<T, QueryError> {
        let PeerShare { kind, body, timeout, setting, known_down, if_down, unknown } = share;
        if rank == self.rank {
            let wait = timeout + Duration::from_millis(PEER_REPLY_GRACE_MS);
            return tokio::time::timeout(wait, local).await.unwrap_or_else(|_| {
                Err(QueryError::Unavailable(format!(
                    "rank {rank} had not finished within {setting} = {} ms + {PEER_REPLY_GRACE_MS} ms{unknown}",
                    timeout.as_millis()
                )))
            });
        }
        if known_down {
            return Err(QueryError::Unavailable(format!("rank {rank} is down (so the membership says){if_down}")));
        }
        let reply = self.ask_within(rank, kind, body, timeout, setting, known_down, unknown).await?;
        serde_json::from_slice(&reply)
            .map_err(|e| QueryError::Unavailable(format!("rank {rank} answered with a malformed reply: {e}")))
    }

    /// Figures of every shard replica stored here (opening stores of the catalog's tables).
    pub async fn local_shard_stats(&self) -> Result<Vec<LocalShardStats>, QueryError> {
        let (_, catalog) = self.catalog_now();
        let mut out = Vec::new();
        for entry in catalog.tables.values() {
            for shard in 0..entry.def.shards {
                if !entry.def.replica_ranks(shard, self.world_size).contains(&self.rank) {
                    continue;
                }
                let store = match self.store(entry, shard).await {
                    Ok(store) => store,
                    Err(e) => {
                        // Fenced (being rebuilt, or awaiting a rebuild): said as such, not as a
                        // replica that fails to open.
                        let problem = match self.fenced((entry.id, entry.generation, shard)) {
                            Some(why) => why,
                            None => format!("cannot be opened: {e}"),
                        };
                        out.push(LocalShardStats {
                            table_id: entry.id,
                            generation: entry.generation,
                            shard,
                            rows: None,
                            bytes: None,
                            parts: None,
                            verified_placement: None,
                            problem: Some(problem),
                        });
                        continue;
                    }
                };
                let (s, problem) = {
                    let guard = lock(&store);
                    (guard.stats(), guard.unreadable().or_else(|| guard.warning()))
                };
                out.push(LocalShardStats {
                    table_id: entry.id,
                    generation: entry.generation,
                    shard,
                    rows: Some(s.rows),
                    bytes: Some(s.bytes),
                    parts: Some(s.parts as u64),
                    verified_placement: Some(s.verified_placement),
                    problem,
                });
            }
        }
        Ok(out)
    }

    pub(crate) async fn shard_rows(&self) -> Result<Vec<ShardReplicaRow>, QueryError> {
        let (_, catalog) = self.catalog_now();
        let members = self.cluster.members().await;
        let mut by_rank: BTreeMap<u32, BTreeMap<(u64, u64, u32), LocalShardStats>> = BTreeMap::new();
        let mut unreachable: BTreeMap<u32, String> = BTreeMap::new();
        for (rank, stats) in self.ask_every_node(&members, "shards").await {
            let stats = match stats {
                None => self.local_shard_stats().await,
                Some(reply) => {
                    reply.and_then(|b| serde_json::from_slice(&b).map_err(|e| QueryError::Storage(e.to_string())))
                }
            };
            match stats {
                Ok(list) => {
                    let list: Vec<LocalShardStats> = list;
                    by_rank.insert(rank, list.into_iter().map(|s| ((s.table_id, s.generation, s.shard), s)).collect());
                }
                Err(e) => {
                    tracing::debug!(rank, "system.shards: rank not reachable: {e}");
                    unreachable.insert(rank, e.to_string());
                }
            }
        }
        let mut rows = Vec::new();
        for entry in catalog.tables.values() {
            for shard in 0..entry.def.shards {
                for (replica, rank) in entry.def.replica_ranks(shard, self.world_size).into_iter().enumerate() {
                    let s = by_rank.get(&rank).and_then(|m| m.get(&(entry.id, entry.generation, shard)));
                    let node_state =
                        members.iter().find(|m| m.rank == rank).map(|m| m.state.as_str()).unwrap_or("down");
                    rows.push(ShardReplicaRow {
                        table: entry.def.name.clone(),
                        shard,
                        replica: replica as u32,
                        rank,
                        node_state: node_state.to_string(),
                        rows: s.and_then(|s| s.rows),
                        bytes: s.and_then(|s| s.bytes),
                        parts: s.and_then(|s| s.parts),
                        verified_placement: s.and_then(|s| s.verified_placement),
                        placement: entry.def.placement.as_str().to_string(),
                        // A replica on a node that was not asked (down) or did not answer is not
                        // read either: said, with why.
                        problem: match (s, unreachable.get(&rank)) {
                            (Some(s), _) => s.problem.clone(),
                            (None, _) if node_state == "down" => Some(format!("rank {rank} is down")),
                            (None, Some(e)) => Some(format!("rank {rank} did not answer: {e}")),
                            (None, None) => None,
                        },
                    });
                }
            }
        }
        Ok(rows)
    }

    /// This node's sync queues, one row per table incarnation and destination, the table under
    /// its current name (rows queued before a rename are counted with the rest).
    pub fn local_queue_rows(&self) -> Vec<SyncQueueRow> {
        let now = unix_ms();
        let stats = lock_from_runtime(&self.outbox).stats();
        let (_, catalog) = self.catalog_now();
        // By (table incarnation, name, destination).
        type QueueKey = (Option<(u64, u64)>, String, u32);
        let mut rows: BTreeMap<QueueKey, SyncQueueRow> = BTreeMap::new();
        for ((key, dest), q) in stats {
            if q.pending_items == 0 {
                continue;
            }
            let table = outbox_key_entry(&catalog, &key).map_or(outbox_key_table(&key), |e| e.def.name.as_str());
            let oldest_pending_age_ms = q.oldest_pending_unix_ms.map(|t| now.saturating_sub(t));
            let row = rows.entry((outbox_key_incarnation(&key), table.to_string(), dest)).or_insert_with(|| {
                let status = self.senders.status(dest);
                let last_error = self.senders.last_error(dest, &key);
                let last_error_age_ms = status
                    .last_error_at
                    .filter(|_| last_error.is_some())
                    .map(|at| at.elapsed().as_millis().min(u128::from(u64::MAX)) as u64);
                SyncQueueRow {
                    rank: self.rank,
                    table: table.to_string(),
                    destination: dest,
                    pending_rows: 0,
                    pending_bytes: 0,
                    oldest_pending_age_ms,
                    retries: status.retries,
                    last_error,
                    last_error_age_ms,
                    problem: None,
                }
            });
            row.pending_rows += q.pending_rows;
            row.pending_bytes += q.pending_bytes;
            row.oldest_pending_age_ms = row.oldest_pending_age_ms.max(oldest_pending_age_ms);
        }
        rows.into_values().collect()
    }

    /// Every node's queues; a node that is down, or did not answer, gets one row that says so
    /// ([`SyncQueueRow::unknown`]).
    pub(crate) async fn queue_rows(&self) -> Result<Vec<SyncQueueRow>, QueryError> {
        let members = self.cluster.members().await;
        let mut rows = Vec::new();
        let mut answered = BTreeSet::new();
        for (rank, reply) in self.ask_every_node(&members, "sync_queues").await {
            answered.insert(rank);
            match reply {
                None => rows.extend(self.local_queue_rows()),
                Some(Ok(body)) => match serde_json::from_slice::<Vec<SyncQueueRow>>(&body) {
                    Ok(list) => rows.extend(list),
                    Err(e) => {
                        tracing::warn!(rank, "system.sync_queues: bad reply: {e}");
                        rows.push(SyncQueueRow::unknown(
                            rank,
                            format!("rank {rank} sent a reply that does not decode: {e}"),
                        ));
                    }
                },
                Some(Err(e)) => {
                    tracing::debug!(rank, "system.sync_queues: rank not reachable: {e}");
                    let problem = format!("rank {rank} did not answer, so its queues are unknown: {e}");
                    rows.push(SyncQueueRow::unknown(rank, problem));
                }
            }
        }
        // The nodes not asked: down in the membership.
        for rank in (0..self.world_size).filter(|r| !answered.contains(r)) {
            rows.push(SyncQueueRow::unknown(rank, format!("rank {rank} is down, so its queues are unknown")));
        }
        rows.sort_by_key(|r| r.rank);
        Ok(rows)
    }

    /// Each rank's answer to data plane `action`, asked of every other node at once, in rank
    /// order: `None` for this node (the caller reads its own figures), nothing for a node the
    /// membership knows to be down (a hung one would hold the read for the whole timeout).
    async fn ask_every_node(
        &self,
        members: &[shardwise_cluster::MemberInfo],
        action: &str,
    ) -> Vec<(u32, Option<Result<Vec<u8>, QueryError>>)> {
        let down = |rank: u32| members.iter().any(|m| m.rank == rank && m.state == shardwise_cluster::NodeState::Down);
        let asked = (0..self.world_size).filter(|&rank| rank == self.rank || !down(rank)).map(|rank| async move {
            match rank == self.rank {
                true => (rank, None),
                false => {
                    let timeout = Duration::from_millis(PEER_STATS_TIMEOUT_MS);
                    (rank, Some(self.peers.action(rank, action, Vec::new(), timeout).await))
                }
            }
        });
        futures::future::join_all(asked).await
    }
}
