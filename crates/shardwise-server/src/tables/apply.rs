//! The receiver's side: apply shipped piece sets to this node's shard stores, durably, once.
//!
//! A ship request holds piece sets in the sender's order. Each piece becomes a store [`Piece`]
//! with the sender's outbox identity and sequence number (high-water-mark dedup) and the
//! insert's `insert_id/chunk` key (dedup across senders and retries). All pieces for one store
//! are applied in one call, which is one WAL fsync; the request is acknowledged only after every
//! store has returned.
//!
//! Data for a table incarnation this node does not know yet (the catalog is still on its way)
//! waits for the catalog version the sender had; data for an incarnation that has been dropped
//! or truncated since is discarded, and counts as delivered.
//!
//! A delayed shipment holds items of many tables. When a store here cannot take its pieces (its
//! files are damaged, its disk was full), only the items with a piece for that store are
//! refused, each named in the reply ([`ShipOutcome::refused`]); the other items go in and are
//! acknowledged. One broken replica of one table then holds back that table's delayed rows to
//! this node, not every table's. The pieces a refused item had for healthy stores are applied
//! too, and dropped as duplicates when it comes again. A store that failed takes none of the
//! later pieces of the same shipment, so each store still applies its pieces in order. An
//! `immediate` write (no origin) is all or nothing, as its caller handles the failure.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use shardwise_query::QueryError;
use shardwise_storage::{ApplyOutcome, CatalogEntry, Piece};

use super::{SharedStore, StoreKey, TablesNode, blocking, lock, storage_error};
use crate::codec::{PieceSet, ShipRequest};

/// What a receiver did with a shipment: the rows it newly applied, and the items it refused.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShipOutcome {
    /// Rows newly applied (duplicates and discarded stale data excluded).
    pub rows: u64,
    /// Items of a delayed shipment that a store here could not take: to be sent again.
    pub refused: Vec<RefusedItem>,
}

/// An item a receiver refused, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedItem {
    /// The item's outbox sequence number.
    pub seq: u64,
    /// The error of the store that refused it, naming the table and shard.
    pub error: String,
}

/// A reply as a receiver writes it: the bare row count when nothing was refused (what every
/// version of the reply held), else the whole outcome.
#[derive(Deserialize)]
#[serde(untagged)]
enum ShipReply {
    Rows(u64),
    Outcome(ShipOutcome),
}

impl ShipOutcome {
    pub fn encode(&self) -> Result<Vec<u8>, serde_json::Error> {
        match self.refused.is_empty() {
            true => serde_json::to_vec(&self.rows),
            false => serde_json::to_vec(self),
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        Ok(match serde_json::from_slice(bytes)? {
            ShipReply::Rows(rows) => ShipOutcome { rows, refused: Vec::new() },
            ShipReply::Outcome(outcome) => outcome,
        })
    }
}

/// The pieces of a shipment gathered by store, and what was refused on the way.
#[derive(Default)]
struct Gathered {
    by_store: BTreeMap<StoreKey, (SharedStore, Vec<Piece>)>,
    /// Stores that could not be opened, with the error.
    failed: BTreeMap<StoreKey, String>,
    /// Refused items: seq and the first error.
    refused: BTreeMap<u64, String>,
}

impl TablesNode {
    /// Sends a ship request to `rank` (or applies it here).
    pub(crate) async fn deliver(&self, rank: u32, req: ShipRequest) -> Result<ShipOutcome, QueryError> {
        if rank == self.rank { self.apply_ship(req).await } else { self.peers.ship(rank, &req).await }
    }

    /// Applies a ship request to the local stores (see the module doc for what is refused).
    ///
    /// A delayed shipment (it has an origin) holds a second's worth of piece sets, hundreds of
    /// them: decoding them takes tens of milliseconds of CPU, so it runs on the background
    /// threads, not on a runtime worker that request handlers are queued behind.
    pub async fn apply_ship(&self, req: ShipRequest) -> Result<ShipOutcome, QueryError> {
        let ShipRequest { origin, items } = req;
        let decode = move || {
            items
                .iter()
                .map(|item| {
                    PieceSet::decode(&item.payload)
                        .map(|set| (item.seq, set))
                        .map_err(|e| QueryError::Rejected(e.to_string()))
                })
                .collect::<Result<Vec<_>, QueryError>>()
        };
        let sets = if origin.is_some() { self.background.blocking(decode).await? } else { decode()? };
        self.apply_sets_refusing(origin, sets).await
    }

    /// Applies piece sets, all or nothing as far as the caller knows (an `immediate` write):
    /// the rows newly applied, or the first error.
    pub(crate) async fn apply_sets(
        &self,
        origin: Option<String>,
        sets: Vec<(Option<u64>, PieceSet)>,
    ) -> Result<u64, QueryError> {
        let outcome = self.apply_sets_refusing(origin, sets).await?;
        match outcome.refused.into_iter().next() {
            None => Ok(outcome.rows),
            Some(refused) => Err(QueryError::Storage(refused.error)),
        }
    }

    /// Applies piece sets (each with its outbox sequence number, if any) from `origin`. Items of
    /// a delayed shipment (an origin, and every item a seq) that a store cannot take are refused
    /// in the outcome; otherwise a store's error is the error.
    async fn apply_sets_refusing(
        &self,
        origin: Option<String>,
        sets: Vec<(Option<u64>, PieceSet)>,
    ) -> Result<ShipOutcome, QueryError> {
        let may_refuse = origin.is_some() && sets.iter().all(|(seq, _)| seq.is_some());
        let mut gathered = Gathered::default();
        // Consecutive sets are mostly of one table: its entry is looked up once per run of them
        // (and again when the catalog changes, so each set sees the catalog of its turn).
        let mut last: Option<((u64, u64, u64), Option<CatalogEntry>)> = None;
        // Table names by incarnation, for errors.
        let mut names: BTreeMap<(u64, u64), String> = BTreeMap::new();
        for (seq, set) in sets {
            let h = &set.header;
            let (mut version, mut catalog) = self.catalog_now();
            if version < h.catalog_version {
                (version, catalog) = self.catalog_at_least(h.catalog_version).await;
                if version < h.catalog_version {
                    return Err(QueryError::Unavailable(format!(
                        "rank {} has catalog version {version}, the data needs {}; it has not reached this node yet",
                        self.rank, h.catalog_version
                    )));
                }
            }
            let wanted = (version, h.table_id, h.generation);
            let entry = match &last {
                Some((key, entry)) if *key == wanted => entry,
                _ => {
                    let found = catalog.by_id(h.table_id).filter(|e| e.generation == h.generation).cloned();
                    &last.insert((wanted, found)).1
                }
            };
            let Some(entry) = entry else {
                tracing::debug!(table = %h.table, "discarding shipped rows of a dropped or truncated table");
                continue;
            };
            names.entry((entry.id, entry.generation)).or_insert_with(|| entry.def.name.clone());
            let key = set.header.piece_key();
            for (shard, batch) in h.shards.iter().zip(set.batches) {
                let piece = Piece {
                    origin: origin.clone(),
                    seq,
                    insert_id: Some(key.clone()),
                    verified_placement: true,
                    batch,
                };
                let store_key = (entry.id, entry.generation, *shard);
                if let Some(error) = gathered.failed.get(&store_key) {
                    let error = error.clone();
                    gathered.refused.entry(seq.unwrap_or_default()).or_insert(error);
                    continue;
                }
                match gathered.by_store.get_mut(&store_key) {
                    Some((_, pieces)) => pieces.push(piece),
                    None => match self.store(entry, *shard).await {
                        Ok(store) => {
                            gathered.by_store.insert(store_key, (store, vec![piece]));
                        }
                        Err(e) if may_refuse => {
                            let error = format!("table {} shard {shard} on rank {}: {e}", entry.def.name, self.rank);
                            gathered.refused.entry(seq.unwrap_or_default()).or_insert_with(|| error.clone());
                            gathered.failed.insert(store_key, error);
                        }
                        Err(e) => return Err(e),
                    },
                }
            }
        }
        // A delayed shipment (it has an origin) is background work; an `immediate` insert's
        // replica write is waited for by its client.
        let background = origin.is_some();
        let applies = gathered.by_store.into_iter().map(|((id, generation, shard), (store, pieces))| {
            let table =
                names.get(&(id, generation)).cloned().unwrap_or_else(|| format!("id {id} generation {generation}"));
            async move {
                let seqs: Vec<u64> = pieces.iter().filter_map(|p| p.seq).collect();
                let apply = move || {
                    let outcomes = lock(&store)
                        .apply(&pieces)
                        .map_err(|e| storage_error(format!("table {table} shard {shard}: {e}")))?;
                    Ok(outcomes
                        .iter()
                        .map(|o| match o {
                            ApplyOutcome::Applied { rows } => *rows,
                            ApplyOutcome::Duplicate => 0,
                        })
                        .sum::<u64>())
                };
                let result = if background { self.background.blocking(apply).await } else { blocking(apply).await };
                (seqs, result)
            }
        });
        let mut rows = 0;
        for (seqs, result) in futures::future::join_all(applies).await {
            match result {
                Ok(applied) => rows += applied,
                Err(e) if may_refuse => {
                    for seq in seqs {
                        gathered.refused.entry(seq).or_insert_with(|| e.to_string());
                    }
                }
                Err(e) => return Err(e),
            }
        }
        let refused = gathered.refused.into_iter().map(|(seq, error)| RefusedItem { seq, error }).collect();
        Ok(ShipOutcome { rows, refused })
    }
}
