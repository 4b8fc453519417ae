//! The table catalog as the cluster's replicated metadata: the master applies DDL with
//! [`CatalogMachine`], which reads the catalog from the replicated JSON, applies the operation
//! ([`Catalog::apply`]) and returns the new catalog, or the user's error message.

use serde_json::Value;
use shardwise_cluster::MetadataMachine;
use shardwise_storage::{Catalog, CatalogOp};

/// DDL on the master.
#[derive(Debug, Clone)]
pub struct CatalogMachine {
    pub world_size: u32,
}

impl MetadataMachine for CatalogMachine {
    fn apply(&self, state: &Value, op: &Value) -> Result<Value, String> {
        let catalog = Catalog::from_json(state).map_err(|e| e.to_string())?;
        let op: CatalogOp = serde_json::from_value(op.clone()).map_err(|e| format!("unreadable DDL operation: {e}"))?;
        let (next, _) = catalog.apply(&op, self.world_size).map_err(|e| e.to_string())?;
        next.to_json().map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_with_the_catalog_message() {
        let m = CatalogMachine { world_size: 2 };
        let op = serde_json::json!({"op": "drop_table", "name": "t", "if_exists": false});
        let err = m.apply(&Value::Null, &op).unwrap_err();
        assert!(err.contains("unknown table \"t\""), "{err}");
        let err = m.apply(&Value::Null, &serde_json::json!({"op": "nope"})).unwrap_err();
        assert!(err.contains("unreadable DDL operation"), "{err}");
        let op = serde_json::json!({"op": "drop_table", "name": "t", "if_exists": true});
        assert!(m.apply(&Value::Null, &op).is_ok());
    }
}
