//! Flight SQL sessions, one per client TCP connection: what `SET` changed lasts as long as the
//! connection, as it does over the PostgreSQL protocol, and other connections never see it.
//!
//! Each accepted connection gets an id, unique for the life of the process (never reused, unlike
//! the peer's address and port). tonic hands the id to every call on the connection (its
//! connect info, in the request's extensions), and dropping the connection's socket drops its
//! session.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::{Stream, TryStreamExt};
use shardwise_query::Session;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::server::Connected;

/// What tonic attaches to each call: which connection it came on.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionInfo {
    pub id: u64,
    pub remote: Option<SocketAddr>,
}

/// The sessions of a node's live connections.
#[derive(Debug, Default)]
pub struct Sessions {
    next_id: AtomicU64,
    live: Mutex<HashMap<u64, Arc<Session>>>,
}

impl Sessions {
    /// The session of connection `id`, created on first use; a session of its own for a call
    /// that came without a connection id (in-process transports).
    pub fn session(&self, id: Option<u64>) -> Arc<Session> {
        match id {
            Some(id) => Arc::clone(self.lock().entry(id).or_default()),
            None => Arc::new(Session::new()),
        }
    }

    /// How many connections have a session.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when no connection has a session.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn close(&self, id: u64) {
        self.lock().remove(&id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Session>>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// An accepted connection that ends its session when it is dropped.
pub struct TrackedConnection {
    io: TcpStream,
    info: ConnectionInfo,
    sessions: Arc<Sessions>,
}

impl Drop for TrackedConnection {
    fn drop(&mut self) {
        self.sessions.close(self.info.id);
    }
}

impl Connected for TrackedConnection {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> ConnectionInfo {
        self.info
    }
}

impl AsyncRead for TrackedConnection {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for TrackedConnection {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Accepted connections, each with an id and Nagle's algorithm off (see [`crate::incoming`]).
pub fn tracked(listener: TcpListener, sessions: Arc<Sessions>) -> impl Stream<Item = io::Result<TrackedConnection>> {
    TcpListenerStream::new(listener).map_ok(move |io| {
        if let Err(e) = io.set_nodelay(true) {
            tracing::debug!("cannot set TCP_NODELAY: {e}");
        }
        let id = sessions.next_id.fetch_add(1, Ordering::Relaxed);
        let info = ConnectionInfo { id, remote: io.peer_addr().ok() };
        TrackedConnection { io, info, sessions: Arc::clone(&sessions) }
    })
}

/// The connection a call came on, if the transport says.
pub fn connection_id<T>(request: &tonic::Request<T>) -> Option<u64> {
    request.extensions().get::<ConnectionInfo>().map(|c| c.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_keeps_its_session_until_it_closes() {
        let sessions = Sessions::default();
        let a = sessions.session(Some(1));
        assert!(Arc::ptr_eq(&a, &sessions.session(Some(1))));
        assert!(!Arc::ptr_eq(&a, &sessions.session(Some(2))));
        assert!(!Arc::ptr_eq(&sessions.session(None), &sessions.session(None)));
        assert_eq!(sessions.len(), 2);
        sessions.close(1);
        assert!(!Arc::ptr_eq(&a, &sessions.session(Some(1))), "a new session after the close");
    }
}
