//! An embedded cluster: N nodes in this process, on loopback, running the same code as separate
//! `shardwise node` processes (rendezvous over TCP, Flight SQL endpoints). Used by `demo`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use shardwise_cluster::{Detected, InitOptions, LaunchSource, Node, Timeouts};
use shardwise_query::QueryEngine;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// One running node of an embedded cluster.
pub struct EmbeddedNode {
    pub node: Node,
    pub flight_addr: String,
    stop: oneshot::Sender<()>,
    server: JoinHandle<Result<(), shardwise_server::ServerError>>,
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
                data_dir: data_dir.join(format!("rank-{rank}")),
                secret: None,
                insecure: true,
                run_id: None,
                timeouts: Timeouts::default(),
                embedded: true,
            };
            let prepared = shardwise_cluster::prepare(opts)?;
            let listener = TcpListener::bind("127.0.0.1:0").await.context("cannot bind a Flight SQL port")?;
            let flight_addr = listener.local_addr()?.to_string();
            let addrs = BTreeMap::from([("flight".to_string(), flight_addr.clone())]);
            joins.push(tokio::spawn(async move {
                let node = prepared.join(addrs).await?;
                anyhow::Ok((node, listener, flight_addr))
            }));
        }
        let mut nodes = Vec::new();
        for j in joins {
            let (node, listener, flight_addr) = j.await.context("node task failed")??;
            let engine = Arc::new(QueryEngine::new(node.view())?);
            let (stop, stopped) = oneshot::channel::<()>();
            let server = tokio::spawn(shardwise_server::serve_flight(listener, engine, async move {
                let _ = stopped.await;
            }));
            nodes.push(EmbeddedNode { node, flight_addr, stop, server });
        }
        Ok(EmbeddedCluster { nodes })
    }

    /// Stops every node: workers leave first, then the master.
    pub async fn shutdown(self) {
        for n in self.nodes.into_iter().rev() {
            let _ = n.stop.send(());
            let _ = n.server.await;
            n.node.shutdown().await;
        }
    }
}
