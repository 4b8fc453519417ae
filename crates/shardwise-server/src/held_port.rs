//! A node's port, listened on from the moment it is bound, and not served until the node has
//! joined.
//!
//! Why: a node binds its ports before the rendezvous (their addresses are part of its hello),
//! and joins up to `join_timeout_ms` later. Bound without listening, two nodes on one machine
//! given the same port (`--data-port` in a shared config file) both bound it, both joined, and
//! the second to listen exited after the cluster had formed around it. Listening at once makes
//! the second bind fail, naming the port, before anything is joined. Until the node serves, each
//! connection is accepted and closed at once: a client that comes early (psql, a health check)
//! is told no at once, as a refused connection would, instead of waiting on a port nobody
//! answers.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Connections the kernel holds for a port before the node accepts them (`listen`'s backlog).
pub const LISTEN_BACKLOG: u32 = 1024;

/// How long a held port waits after a failed accept before the next.
pub const ACCEPT_ERROR_PAUSE_MS: u64 = 50;

/// See the module doc.
#[derive(Debug)]
pub struct HeldPort {
    local: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<TcpListener>,
}

impl HeldPort {
    /// Listens on the bound `socket`, closing every connection until [`HeldPort::serve`].
    pub fn hold(socket: TcpSocket) -> std::io::Result<HeldPort> {
        let listener = socket.listen(LISTEN_BACKLOG)?;
        let local = listener.local_addr()?;
        let (stop, mut stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    // Asked to serve, or dropped (the node did not start): the listener goes
                    // back, or is closed with this task.
                    _ = &mut stopped => return listener,
                    // Not serving yet: closed at once. An error (out of file descriptors) is
                    // waited out briefly rather than retried in a busy loop.
                    accepted = listener.accept() => {
                        if accepted.is_err() {
                            tokio::time::sleep(std::time::Duration::from_millis(ACCEPT_ERROR_PAUSE_MS)).await;
                        }
                    }
                }
            }
        });
        Ok(HeldPort { local, stop, task })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The listener, for the service that now answers on it.
    pub async fn serve(self) -> std::io::Result<TcpListener> {
        let HeldPort { stop, task, .. } = self;
        let _ = stop.send(());
        task.await.map_err(|e| std::io::Error::other(format!("the task holding a port failed: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn bound() -> TcpSocket {
        let socket = TcpSocket::new_v4().expect("socket");
        socket.set_reuseaddr(true).expect("reuseaddr");
        socket.bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
        socket
    }

    #[tokio::test]
    async fn a_held_port_closes_early_connections_and_then_serves() -> std::io::Result<()> {
        let held = HeldPort::hold(bound())?;
        let addr = held.local_addr();
        let mut early = tokio::net::TcpStream::connect(addr).await?;
        let mut buf = [0u8; 1];
        // Closed by the holder: end of stream or a reset, never a wait.
        let read = tokio::time::timeout(std::time::Duration::from_secs(5), early.read(&mut buf)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
        let listener = held.serve().await?;
        let (_client, accepted) = tokio::join!(tokio::net::TcpStream::connect(addr), listener.accept());
        assert_eq!(accepted?.1.ip(), addr.ip());
        Ok(())
    }

    #[tokio::test]
    async fn a_port_held_by_one_node_cannot_be_taken_by_another() -> std::io::Result<()> {
        let held = HeldPort::hold(bound())?;
        let again = TcpSocket::new_v4()?;
        again.set_reuseaddr(true)?;
        let taken = again.bind(held.local_addr()).and_then(|()| again.listen(LISTEN_BACKLOG).map(drop));
        assert_eq!(taken.map_err(|e| e.kind()), Err(std::io::ErrorKind::AddrInUse));
        Ok(())
    }
}
