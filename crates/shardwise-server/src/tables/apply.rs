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

use std::collections::BTreeMap;

use shardwise_query::QueryError;
use shardwise_storage::{ApplyOutcome, CatalogEntry, Piece};

use super::{SharedStore, StoreKey, TablesNode, blocking, lock, storage_error};
use crate::codec::{PieceSet, ShipRequest};

impl TablesNode {
    /// Sends a ship request to `rank` (or applies it here); returns the rows applied.
    pub(crate) async fn deliver(&self, rank: u32, req: ShipRequest) -> Result<u64, QueryError> {
        if rank == self.rank { self.apply_ship(req).await } else { self.peers.ship(rank, &req).await }
    }

    /// Applies a ship request to the local stores. Returns the rows newly applied (duplicates
    /// and discarded stale data excluded).
    ///
    /// A delayed shipment (it has an origin) holds a second's worth of piece sets, hundreds of
    /// them: decoding them takes tens of milliseconds of CPU, so it runs on the background
    /// threads, not on a runtime worker that request handlers are queued behind.
    pub async fn apply_ship(&self, req: ShipRequest) -> Result<u64, QueryError> {
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
        self.apply_sets(origin, sets).await
    }

    /// Applies piece sets (each with its outbox sequence number, if any) from `origin`.
    pub(crate) async fn apply_sets(
        &self,
        origin: Option<String>,
        sets: Vec<(Option<u64>, PieceSet)>,
    ) -> Result<u64, QueryError> {
        let mut by_store: BTreeMap<StoreKey, (SharedStore, Vec<Piece>)> = BTreeMap::new();
        // Consecutive sets are mostly of one table: its entry is looked up once per run of them
        // (and again when the catalog changes, so each set sees the catalog of its turn).
        let mut last: Option<((u64, u64, u64), Option<CatalogEntry>)> = None;
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
                match by_store.get_mut(&store_key) {
                    Some((_, pieces)) => pieces.push(piece),
                    None => {
                        let store = self.store(entry, *shard).await?;
                        by_store.insert(store_key, (store, vec![piece]));
                    }
                }
            }
        }
        // A delayed shipment (it has an origin) is background work; an `immediate` insert's
        // replica write is waited for by its client.
        let background = origin.is_some();
        let applies = by_store.into_iter().map(|((id, generation, shard), (store, pieces))| async move {
            let apply = move || {
                let outcomes = lock(&store)
                    .apply(&pieces)
                    .map_err(|e| storage_error(format!("table id {id} generation {generation} shard {shard}: {e}")))?;
                Ok(outcomes
                    .iter()
                    .map(|o| match o {
                        ApplyOutcome::Applied { rows } => *rows,
                        ApplyOutcome::Duplicate => 0,
                    })
                    .sum::<u64>())
            };
            if background { self.background.blocking(apply).await } else { blocking(apply).await }
        });
        let mut rows = 0;
        for r in futures::future::join_all(applies).await {
            rows += r?;
        }
        Ok(rows)
    }
}
