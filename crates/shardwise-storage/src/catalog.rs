//! The table catalog: which tables exist, with which definitions, and under which identity.
//!
//! The catalog is one value kept durably by the master and replicated to every node (the cluster
//! crate's replicated metadata carries it as JSON). This module is the pure part: the value, the
//! operations DDL turns into, and [`Catalog::apply`], which checks an operation and returns the
//! next catalog or says why not. Nothing here does I/O, so the master can apply operations
//! serially and every node can reason about the same value.
//!
//! Identity: a table gets a fresh `id` when created, and its `generation` grows on every
//! `TRUNCATE`. Shard stores live in directories named by `(id, generation)`, and every shipped
//! piece of data carries both, so data addressed to a dropped or truncated incarnation of a table
//! is recognised and discarded instead of landing in a new table of the same name.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::StorageError;
use crate::table::TableDef;

/// One table of the catalog.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CatalogEntry {
    /// Unique for the life of the cluster: never reused, even after a DROP.
    pub id: u64,
    /// 0 when created; +1 on every TRUNCATE.
    pub generation: u64,
    pub def: TableDef,
}

/// Every table of the cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Catalog {
    /// Tables by name.
    pub tables: BTreeMap<String, CatalogEntry>,
    /// The id the next created table gets.
    pub next_table_id: u64,
}

/// A change to the catalog, as DDL produces it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum CatalogOp {
    CreateTable {
        def: TableDef,
        if_not_exists: bool,
    },
    /// With `id`, only the incarnation of that id: a table that took the name since (after a
    /// rename, or a drop and create) is left alone.
    DropTable {
        name: String,
        if_exists: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<u64>,
    },
    TruncateTable {
        name: String,
    },
    /// `RENAME TABLE a TO b, c TO d` (and `ALTER TABLE a RENAME TO b`): applied in order, all or
    /// none, so `a TO tmp, b TO a, tmp TO b` swaps two tables. A table keeps its id and
    /// generation, so its data, queued rows and running inserts follow it. With `if_exists`, a
    /// missing first name makes the whole operation a no-op (PostgreSQL's `ALTER TABLE IF EXISTS`).
    RenameTables {
        renames: Vec<(String, String)>,
        if_exists: bool,
    },
    /// `EXCHANGE TABLES a AND b` (ClickHouse's): the two names trade tables, at once.
    ExchangeTables {
        a: String,
        b: String,
    },
}

/// What an applied operation did, for the statement's reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CatalogChange {
    Created,
    /// `IF NOT EXISTS` / `IF EXISTS` made the operation a no-op.
    Unchanged,
    Dropped,
    Truncated,
    Renamed,
}

impl Catalog {
    /// Reads a catalog from the replicated JSON state; `null` (nothing ever proposed) is empty.
    pub fn from_json(state: &serde_json::Value) -> Result<Catalog, StorageError> {
        if state.is_null() {
            return Ok(Catalog::default());
        }
        serde_json::from_value(state.clone())
            .map_err(|e| StorageError::CatalogFormat { problem: format!("cannot read the catalog: {e}") })
    }

    /// The catalog as replicated JSON.
    pub fn to_json(&self) -> Result<serde_json::Value, StorageError> {
        serde_json::to_value(self)
            .map_err(|e| StorageError::CatalogFormat { problem: format!("cannot write the catalog: {e}") })
    }

    /// Checks `op` and returns the catalog after it, with what it changed. `world_size` is the
    /// cluster's, to re-check a new table's replica count.
    pub fn apply(&self, op: &CatalogOp, world_size: u32) -> Result<(Catalog, CatalogChange), StorageError> {
        let mut next = self.clone();
        let change = match op {
            CatalogOp::CreateTable { def, if_not_exists } => {
                def.validate(world_size)?;
                if self.tables.contains_key(&def.name) {
                    if *if_not_exists {
                        return Ok((next, CatalogChange::Unchanged));
                    }
                    return Err(StorageError::TableExists { name: def.name.clone() });
                }
                let id = next.next_table_id;
                next.next_table_id = id
                    .checked_add(1)
                    .ok_or_else(|| StorageError::CatalogFormat { problem: "table ids exhausted".to_string() })?;
                next.tables.insert(def.name.clone(), CatalogEntry { id, generation: 0, def: def.clone() });
                CatalogChange::Created
            }
            CatalogOp::DropTable { name, if_exists, id } => match next.tables.get(name) {
                Some(entry) if id.is_none_or(|id| id == entry.id) => {
                    next.tables.remove(name);
                    CatalogChange::Dropped
                }
                _ if *if_exists => CatalogChange::Unchanged,
                _ => return Err(self.unknown_table(name)),
            },
            CatalogOp::TruncateTable { name } => match next.tables.get_mut(name) {
                Some(entry) => {
                    entry.generation += 1;
                    CatalogChange::Truncated
                }
                None => return Err(self.unknown_table(name)),
            },
            CatalogOp::RenameTables { renames, if_exists } => {
                if *if_exists && renames.first().is_some_and(|(from, _)| !self.tables.contains_key(from)) {
                    return Ok((next, CatalogChange::Unchanged));
                }
                for (from, to) in renames {
                    crate::table::check_table_name(to)?;
                    let Some(mut entry) = next.tables.remove(from) else { return Err(next.unknown_table(from)) };
                    if from == to {
                        return Err(StorageError::RenameToItself { name: to.clone() });
                    }
                    if next.tables.contains_key(to) {
                        return Err(StorageError::RenameTargetExists { from: from.clone(), to: to.clone() });
                    }
                    entry.def.name = to.clone();
                    next.tables.insert(to.clone(), entry);
                }
                CatalogChange::Renamed
            }
            CatalogOp::ExchangeTables { a, b } => {
                if let Some(missing) = [a, b].into_iter().find(|name| !self.tables.contains_key(*name)) {
                    return Err(self.unknown_table(missing));
                }
                if a == b {
                    return Err(StorageError::RenameToItself { name: a.clone() });
                }
                let (Some(mut first), Some(mut second)) = (next.tables.remove(a), next.tables.remove(b)) else {
                    return Err(self.unknown_table(a));
                };
                first.def.name = b.clone();
                second.def.name = a.clone();
                next.tables.insert(b.clone(), first);
                next.tables.insert(a.clone(), second);
                CatalogChange::Renamed
            }
        };
        Ok((next, change))
    }

    /// The error for a table name the catalog does not have, listing the ones it has.
    pub fn unknown_table(&self, name: &str) -> StorageError {
        let known: Vec<&str> = self.tables.keys().map(String::as_str).collect();
        StorageError::UnknownTable {
            name: name.to_string(),
            known: if known.is_empty() { "none".to_string() } else { known.join(", ") },
        }
    }

    /// The entry with this id, if the table still exists.
    pub fn by_id(&self, id: u64) -> Option<&CatalogEntry> {
        self.tables.values().find(|e| e.id == id)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn def(name: &str) -> TableDef {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, true)]));
        TableDef::from_options(name, schema, &[("shard_key".into(), "k".into())], 3).unwrap()
    }

    #[test]
    fn create_drop_truncate() {
        let c = Catalog::default();
        let (c, ch) = c.apply(&CatalogOp::CreateTable { def: def("t"), if_not_exists: false }, 3).unwrap();
        assert_eq!(ch, CatalogChange::Created);
        assert_eq!(c.tables["t"].id, 0);
        let err = c.apply(&CatalogOp::CreateTable { def: def("t"), if_not_exists: false }, 3).unwrap_err();
        assert!(err.to_string().contains("already exists"), "{err}");
        let (c2, ch) = c.apply(&CatalogOp::CreateTable { def: def("t"), if_not_exists: true }, 3).unwrap();
        assert_eq!((ch, &c2), (CatalogChange::Unchanged, &c));
        let (c, _) = c.apply(&CatalogOp::TruncateTable { name: "t".into() }, 3).unwrap();
        assert_eq!(c.tables["t"].generation, 1);
        // A drop of another incarnation of the name leaves the table.
        let (c2, ch) = c.apply(&CatalogOp::DropTable { name: "t".into(), if_exists: true, id: Some(7) }, 3).unwrap();
        assert_eq!((ch, &c2), (CatalogChange::Unchanged, &c));
        let (c, ch) = c.apply(&CatalogOp::DropTable { name: "t".into(), if_exists: false, id: Some(0) }, 3).unwrap();
        assert_eq!(ch, CatalogChange::Dropped);
        let err = c.apply(&CatalogOp::DropTable { name: "t".into(), if_exists: false, id: None }, 3).unwrap_err();
        assert!(err.to_string().contains("unknown table \"t\""), "{err}");
        let (c, _) = c.apply(&CatalogOp::CreateTable { def: def("t"), if_not_exists: false }, 3).unwrap();
        assert_eq!(c.tables["t"].id, 1, "ids are never reused");
    }

    #[test]
    fn renames_keep_the_identity_and_apply_in_order_all_or_none() {
        let create = |c: &Catalog, name: &str| {
            c.apply(&CatalogOp::CreateTable { def: def(name), if_not_exists: false }, 3).unwrap().0
        };
        let c = create(&create(&Catalog::default(), "a"), "b");
        let rename = |pairs: &[(&str, &str)], if_exists: bool| CatalogOp::RenameTables {
            renames: pairs.iter().map(|(f, t)| (f.to_string(), t.to_string())).collect(),
            if_exists,
        };
        // A swap through a third name.
        let (swapped, ch) = c.apply(&rename(&[("a", "tmp"), ("b", "a"), ("tmp", "b")], false), 3).unwrap();
        assert_eq!(ch, CatalogChange::Renamed);
        assert_eq!((swapped.tables["a"].id, swapped.tables["b"].id), (1, 0));
        assert_eq!((swapped.tables["a"].def.name.as_str(), swapped.tables.len()), ("a", 2));
        // A target that exists, a missing source, or a bad name fails the whole statement.
        let err = c.apply(&rename(&[("a", "c"), ("b", "c")], false), 3).unwrap_err();
        assert!(err.to_string().contains("cannot rename table \"b\" to \"c\": a table \"c\" already exists"), "{err}");
        let err = c.apply(&rename(&[("x", "b")], false), 3).unwrap_err();
        assert!(err.to_string().contains("unknown table \"x\""), "{err}");
        let err = c.apply(&rename(&[("a", "c"), ("x", "d")], false), 3).unwrap_err();
        assert!(err.to_string().contains("unknown table \"x\""), "{err}");
        let err = c.apply(&rename(&[("a", "a")], false), 3).unwrap_err();
        assert!(err.to_string().contains("it is called \"a\" already"), "{err}");
        let err = c.apply(&rename(&[("a", "no-dash")], false), 3).unwrap_err();
        assert!(err.to_string().contains("no-dash"), "{err}");
        let (same, ch) = c.apply(&rename(&[("x", "y")], true), 3).unwrap();
        assert_eq!((ch, &same), (CatalogChange::Unchanged, &c));
        // An exchange trades the two tables' names.
        let exchange = CatalogOp::ExchangeTables { a: "a".into(), b: "b".into() };
        let (traded, _) = c.apply(&exchange, 3).unwrap();
        assert_eq!((traded.tables["a"].id, traded.tables["b"].id, traded.tables["a"].def.name.as_str()), (1, 0, "a"));
        let err = c.apply(&CatalogOp::ExchangeTables { a: "a".into(), b: "x".into() }, 3).unwrap_err();
        assert!(err.to_string().contains("unknown table \"x\""), "{err}");
        let err = c.apply(&CatalogOp::ExchangeTables { a: "a".into(), b: "a".into() }, 3).unwrap_err();
        assert!(err.to_string().contains("it is called \"a\" already"), "{err}");
        // The operation as replicated JSON, and the drop's id only when given.
        let json = serde_json::to_value(rename(&[("a", "b")], false)).unwrap();
        assert_eq!(json, serde_json::json!({"op": "rename_tables", "renames": [["a", "b"]], "if_exists": false}));
        let drop = serde_json::json!({"op": "drop_table", "name": "t", "if_exists": true});
        let op: CatalogOp = serde_json::from_value(drop.clone()).unwrap();
        assert_eq!(serde_json::to_value(&op).unwrap(), drop);
    }

    #[test]
    fn replicas_are_rechecked_against_the_world_size() {
        let mut d = def("t");
        d.replicas = 3;
        let err = Catalog::default().apply(&CatalogOp::CreateTable { def: d, if_not_exists: false }, 2).unwrap_err();
        assert!(err.to_string().contains("replicas"), "{err}");
    }

    #[test]
    fn json_round_trip_and_null() {
        assert_eq!(Catalog::from_json(&serde_json::Value::Null).unwrap(), Catalog::default());
        let (c, _) =
            Catalog::default().apply(&CatalogOp::CreateTable { def: def("t"), if_not_exists: false }, 3).unwrap();
        assert_eq!(Catalog::from_json(&c.to_json().unwrap()).unwrap(), c);
        let err = Catalog::from_json(&serde_json::json!({"tables": 5})).unwrap_err();
        assert!(err.to_string().contains("cannot read the catalog"), "{err}");
    }
}
