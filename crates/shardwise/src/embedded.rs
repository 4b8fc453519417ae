//! An embedded cluster: N nodes in this process, on loopback, running the same code as separate
//! `shardwise node` processes (rendezvous over TCP, data plane and Flight SQL endpoints). Used by
//! `demo` and `local`.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use shardwise_cluster::{Detected, InitOptions, LaunchSource, Node, Timeouts};
use shardwise_server::users::Users;
use shardwise_server::{CatalogMachine, Listeners, Ports, ServiceOptions, Services, StorageSettings};

/// Refuses a node count outside `1..=max`.
pub fn check_nodes(nodes: u32, max: u32) -> anyhow::Result<()> {
    if nodes == 0 || nodes > max {
        anyhow::bail!("--nodes {nodes} is out of range: expected 1..={max}");
    }
    Ok(())
}

/// The data dir given (created if missing), or a temporary one, removed when the returned guard
/// drops.
pub fn data_dir_or_temp(given: Option<&Path>) -> anyhow::Result<(Option<tempfile::TempDir>, std::path::PathBuf)> {
    let (guard, dir) = match given {
        Some(dir) => (None, dir.to_path_buf()),
        None => {
            let tmp = tempfile::tempdir().context("cannot create a temporary data dir")?;
            let dir = tmp.path().to_path_buf();
            (Some(tmp), dir)
        }
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok((guard, dir))
}

/// One running node of an embedded cluster.
pub struct EmbeddedNode {
    pub node: Node,
    pub flight_addr: String,
    pub services: Services,
}

/// N nodes started together in this process.
pub struct EmbeddedCluster {
    pub nodes: Vec<EmbeddedNode>,
}

impl EmbeddedCluster {
    /// Starts `n` nodes with data dirs `data_dir/rank-R`, joined through a real rendezvous on
    /// 127.0.0.1. No secret: every node is in this process.
    pub async fn start(n: u32, data_dir: &Path) -> anyhow::Result<EmbeddedCluster> {
        let port = crate::ports::free_port("127.0.0.1")?;
        let mut joins = Vec::new();
        for rank in 0..n {
            let node_dir = data_dir.join(format!("rank-{rank}"));
            let opts = InitOptions {
                detected: Detected {
                    source: LaunchSource::Flags,
                    rank,
                    world_size: n,
                    local_rank: Some(rank),
                    local_world_size: Some(n),
                    master_addr: "127.0.0.1".into(),
                    master_port: port,
                    run_id: None,
                    warnings: Vec::new(),
                },
                data_dir: node_dir.clone(),
                secret: None,
                insecure: true,
                run_id: None,
                timeouts: Timeouts::default(),
                embedded: true,
                metadata_machine: Some(Arc::new(CatalogMachine { world_size: n })),
                replace_node: None,
            };
            let prepared = shardwise_cluster::prepare(opts)?;
            let listeners =
                Listeners::bind("127.0.0.1", Ports::default()).await.context("cannot bind the node's ports")?;
            let addrs = listeners.addrs("127.0.0.1")?;
            let flight_addr = addrs.get("flight").cloned().unwrap_or_default();
            joins.push(tokio::spawn(async move {
                let node = prepared.join(addrs).await?;
                anyhow::Ok((node, listeners, flight_addr, node_dir))
            }));
        }
        let mut nodes = Vec::new();
        for j in joins {
            let (node, listeners, flight_addr, node_dir) = j.await.context("node task failed")??;
            let opts = ServiceOptions {
                data_dir: node_dir,
                secret: None,
                settings: StorageSettings::default(),
                users: Arc::new(Users::default_only()),
            };
            let services = Services::start(&node, listeners, opts).await?;
            nodes.push(EmbeddedNode { node, flight_addr, services });
        }
        Ok(EmbeddedCluster { nodes })
    }

    /// Stops every node: workers leave first, then the master.
    pub async fn shutdown(self) {
        for n in self.nodes.into_iter().rev() {
            n.services.stop().await;
            n.node.shutdown().await;
        }
    }
}
