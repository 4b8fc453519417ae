//! Flight SQL sessions, one per client TCP connection: what `SET` changed lasts as long as the
//! connection, as it does over the PostgreSQL protocol, and other connections never see it.
//!
//! Each accepted connection gets an id, unique for the life of the process (never reused, unlike
//! the peer's address and port). tonic hands the id to every call on the connection (its
//! connect info, in the request's extensions), and dropping the connection's socket drops its
//! session.
//!
//! The gRPC endpoints (Flight SQL, and the data plane between nodes, which keeps no sessions)
//! take their connections from here, under two limits. Without them, about 20 000 connections
//! that never sent a byte (no credentials needed) stayed open, used up the node's file
//! descriptors, and shut out every client and peer (a replicated insert failed on `Too many
//! open files`):
//! - at most [`GRPC_MAX_CONNECTIONS`] open at once per endpoint: past it, a new connection waits
//!   in the kernel's backlog until one closes;
//! - a connection must send HTTP/2's connection preface and the header of its first frame
//!   ([`GRPC_HANDSHAKE_BYTES`]) within [`GRPC_HANDSHAKE_TIMEOUT_MS`] (one byte was enough at
//!   first, and 1 030 connections that sent one byte each held every place for good);
//! - a connection must make a call whose credentials are accepted ([`admit`], from the
//!   endpoints' interceptors) within [`GRPC_LOGIN_TIMEOUT_MS`] of opening (PostgreSQL's
//!   `authentication_timeout`): a client that sent the handshake and answered the server's pings
//!   held its place for good without ever logging in, so 1024 of them shut every client out.
//!
//! After that the server pings a connection over HTTP/2 (`crate::http2`), and one that does not
//! answer is closed, so a live client's connection (and its session's `SET`s) lasts as long as
//! the client keeps it, however idle.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use std::future::Future;
use std::time::Duration;

use futures::Stream;
use shardwise_query::Session;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::transport::server::Connected;

/// Connections one gRPC endpoint of a node keeps open at once.
pub const GRPC_MAX_CONNECTIONS: usize = 1024;
/// How long a new gRPC connection may take to send its first [`GRPC_HANDSHAKE_BYTES`].
pub const GRPC_HANDSHAKE_TIMEOUT_MS: u64 = 10_000;
/// HTTP/2's connection preface (24 bytes) and a frame header (9): what every client sends first.
pub const GRPC_HANDSHAKE_BYTES: usize = 24 + 9;
/// How long a new gRPC connection may take to make its first call with accepted credentials.
pub const GRPC_LOGIN_TIMEOUT_MS: u64 = 60_000;

/// What tonic attaches to each call: which connection it came on.
#[derive(Debug, Clone)]
pub struct ConnectionInfo {
    pub id: u64,
    pub remote: Option<SocketAddr>,
    /// Set once a call on the connection has had its credentials accepted ([`admit`]).
    admitted: Arc<AtomicBool>,
}

/// Notes that `request`'s credentials were accepted, so its connection is not closed for want
/// of a login (see the module doc). Calls from in-process transports carry no connection.
pub fn admit<T>(request: &tonic::Request<T>) {
    if let Some(info) = request.extensions().get::<ConnectionInfo>() {
        info.admitted.store(true, Ordering::Relaxed);
    }
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

/// An accepted connection that ends its session when it is dropped, and gives its place under
/// the endpoint's cap back.
pub struct TrackedConnection {
    io: TcpStream,
    info: ConnectionInfo,
    sessions: Arc<Sessions>,
    _open: OwnedSemaphorePermit,
    /// Until the connection is admitted: when it is closed if the handshake's bytes have not
    /// arrived, or (once they have) if no call has been admitted.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    /// When the connection opened, and how long it may take to be admitted.
    opened: tokio::time::Instant,
    login_timeout: Duration,
    /// Bytes received so far, counted up to [`GRPC_HANDSHAKE_BYTES`].
    received: usize,
}

impl Drop for TrackedConnection {
    fn drop(&mut self) {
        self.sessions.close(self.info.id);
    }
}

impl Connected for TrackedConnection {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> ConnectionInfo {
        self.info.clone()
    }
}

impl AsyncRead for TrackedConnection {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.io).poll_read(cx, buf);
        let this = &mut *self;
        let Some(deadline) = this.deadline.as_mut() else { return read };
        let handshaken = this.received >= GRPC_HANDSHAKE_BYTES;
        if handshaken && this.info.admitted.load(Ordering::Relaxed) {
            this.deadline = None;
            return read;
        }
        match read {
            Poll::Ready(Ok(())) => {
                this.received += buf.filled().len() - before;
                if !handshaken && this.received >= GRPC_HANDSHAKE_BYTES {
                    deadline.as_mut().reset(this.opened + this.login_timeout);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if deadline.as_mut().poll(cx).is_ready() => {
                let why = if handshaken {
                    if this.info.admitted.load(Ordering::Relaxed) {
                        this.deadline = None;
                        return Poll::Pending;
                    }
                    format!(
                        "no call with accepted credentials within {} ms of connecting",
                        this.login_timeout.as_millis()
                    )
                } else {
                    format!("no HTTP/2 handshake within {GRPC_HANDSHAKE_TIMEOUT_MS} ms of connecting")
                };
                Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, why)))
            }
            other => other,
        }
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

/// `TcpListener` that accepts a connection only while fewer than its cap are open (the HTTP
/// endpoint's, and each gRPC endpoint's): past the cap a new connection waits in the kernel's
/// backlog until one closes, and the node warns once per episode.
pub struct CappedListener {
    inner: TcpListener,
    open: Arc<Semaphore>,
    max_connections: usize,
    /// The endpoint's name, for the warning.
    endpoint: &'static str,
    /// Whether the cap was reached since it was last logged (one warning per episode).
    warned: bool,
}

impl CappedListener {
    pub fn new(inner: TcpListener, max_connections: usize, endpoint: &'static str) -> Self {
        let open = Arc::new(Semaphore::new(max_connections));
        CappedListener { inner, open, max_connections, endpoint, warned: false }
    }

    /// The next connection, once fewer than the cap are open, with its place under the cap: the
    /// connection counts until the permit is dropped.
    pub async fn accept(&mut self) -> (TcpStream, OwnedSemaphorePermit) {
        let permit = match Arc::clone(&self.open).try_acquire_owned() {
            Ok(permit) => {
                self.warned = false;
                permit
            }
            Err(_) => {
                if !self.warned {
                    let (endpoint, max) = (self.endpoint, self.max_connections);
                    tracing::warn!("{endpoint} endpoint: {max} connections open; new ones wait");
                    self.warned = true;
                }
                // The semaphore is never closed, so this waits for a connection to end.
                match Arc::clone(&self.open).acquire_owned().await {
                    Ok(permit) => permit,
                    Err(_) => std::future::pending().await,
                }
            }
        };
        // axum's accept of a `TcpListener`: errors such as running out of descriptors are
        // logged and waited out, never returned.
        let (stream, _) = axum::serve::Listener::accept(&mut self.inner).await;
        (stream, permit)
    }
}

/// Accepted connections, each with an id and Nagle's algorithm off (tonic sets `TCP_NODELAY`
/// only on sockets it accepts itself, and small replies held back until the peer's delayed ACK
/// would cost 40 ms a call): at most `max_connections` open at once, each closed if it has not
/// sent its handshake within `timeouts.0`, or made a call with accepted credentials within
/// `timeouts.1` (see the module doc).
pub fn tracked(
    listener: TcpListener,
    sessions: Arc<Sessions>,
    max_connections: usize,
    (handshake_timeout, login_timeout): (Duration, Duration),
) -> impl Stream<Item = io::Result<TrackedConnection>> {
    let listener = CappedListener::new(listener, max_connections, "gRPC");
    futures::stream::unfold((listener, sessions), move |(mut listener, sessions)| async move {
        let (io, open) = listener.accept().await;
        if let Err(e) = io.set_nodelay(true) {
            tracing::debug!("cannot set TCP_NODELAY: {e}");
        }
        let id = sessions.next_id.fetch_add(1, Ordering::Relaxed);
        let info = ConnectionInfo { id, remote: io.peer_addr().ok(), admitted: Arc::default() };
        let opened = tokio::time::Instant::now();
        let deadline = Some(Box::pin(tokio::time::sleep_until(opened + handshake_timeout)));
        let sessions_of = Arc::clone(&sessions);
        let connection = TrackedConnection {
            io,
            info,
            sessions: sessions_of,
            _open: open,
            deadline,
            opened,
            login_timeout,
            received: 0,
        };
        Some((Ok(connection), (listener, sessions)))
    })
}

/// [`tracked`] with the gRPC endpoints' limits.
pub fn tracked_grpc(
    listener: TcpListener,
    sessions: Arc<Sessions>,
) -> impl Stream<Item = io::Result<TrackedConnection>> {
    let timeouts = (Duration::from_millis(GRPC_HANDSHAKE_TIMEOUT_MS), Duration::from_millis(GRPC_LOGIN_TIMEOUT_MS));
    tracked(listener, sessions, GRPC_MAX_CONNECTIONS, timeouts)
}

/// The connection a call came on, if the transport says.
pub fn connection_id<T>(request: &tonic::Request<T>) -> Option<u64> {
    request.extensions().get::<ConnectionInfo>().map(|c| c.id)
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use futures::StreamExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// Past the cap a connection is not served until an open one closes.
    #[tokio::test]
    async fn a_connection_past_the_cap_waits_for_one_to_close() {
        let inner = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = inner.local_addr().expect("addr");
        let mut listener = CappedListener::new(inner, 2, "http");
        let _clients: Vec<TcpStream> =
            futures::future::join_all((0..3).map(|_| TcpStream::connect(addr))).await.into_iter().flatten().collect();
        // A connection and its place under the cap, kept together as the server keeps them.
        let first = listener.accept().await;
        let _second = listener.accept().await;
        let third = tokio::time::timeout(std::time::Duration::from_millis(200), listener.accept()).await;
        assert!(third.is_err(), "a third connection was accepted past a cap of 2");
        drop(first);
        let third = tokio::time::timeout(std::time::Duration::from_secs(5), listener.accept()).await;
        assert!(third.is_ok(), "the third connection was not accepted once one closed");
    }

    #[tokio::test]
    async fn the_cap_holds_and_a_connection_without_a_handshake_is_closed() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let timeouts = (Duration::from_millis(300), Duration::from_secs(60));
        let mut accepted = Box::pin(tracked(listener, Arc::default(), 1, timeouts));
        // It sends one byte, not the handshake's 33.
        let mut one_byte = TcpStream::connect(addr).await.unwrap();
        one_byte.write_all(b"P").await.unwrap();
        let mut first = accepted.next().await.unwrap().unwrap();
        assert_eq!(first.read(&mut [0u8; 8]).await.unwrap(), 1);
        // Past the cap of one: not accepted while the first is open.
        let mut client = TcpStream::connect(addr).await.unwrap();
        assert!(tokio::time::timeout(Duration::from_millis(200), accepted.next()).await.is_err());
        // Its next read fails when the handshake timeout has passed.
        let started = Instant::now();
        let err = first.read(&mut [0u8; 8]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        assert!(started.elapsed() < Duration::from_secs(2));
        drop(first);
        // Its place goes to the waiting one, which sends the handshake (in two pieces): it is not
        // timed out after that.
        let mut second = tokio::time::timeout(Duration::from_secs(2), accepted.next()).await.unwrap().unwrap().unwrap();
        let handshake = [7u8; GRPC_HANDSHAKE_BYTES];
        client.write_all(&handshake[..10]).await.unwrap();
        assert_eq!(second.read(&mut [0u8; 64]).await.unwrap(), 10);
        client.write_all(&handshake[10..]).await.unwrap();
        assert_eq!(second.read(&mut [0u8; 64]).await.unwrap(), GRPC_HANDSHAKE_BYTES - 10);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let idle = tokio::time::timeout(Duration::from_millis(200), second.read(&mut [0u8; 8])).await;
        assert!(idle.is_err(), "a connection that has sent is left open however idle: {idle:?}");
    }

    /// A connection that has sent its handshake but had no call admitted is closed when the
    /// login timeout (counted from its opening) has passed; one with an admitted call is not.
    #[tokio::test]
    async fn a_connection_that_never_logs_in_is_closed() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let timeouts = (Duration::from_millis(300), Duration::from_millis(600));
        let mut accepted = Box::pin(tracked(listener, Arc::default(), 8, timeouts));
        let handshake = [7u8; GRPC_HANDSHAKE_BYTES];
        let mut clients = Vec::new();
        let mut served = Vec::new();
        for _ in 0..2 {
            let mut client = TcpStream::connect(addr).await.unwrap();
            client.write_all(&handshake).await.unwrap();
            clients.push(client);
            let mut connection = accepted.next().await.unwrap().unwrap();
            assert_eq!(connection.read(&mut [0u8; 64]).await.unwrap(), GRPC_HANDSHAKE_BYTES);
            served.push(connection);
        }
        let started = Instant::now();
        // The second makes a call that is admitted.
        let mut call = tonic::Request::new(());
        call.extensions_mut().insert(served[1].connect_info());
        admit(&call);
        let err = served[0].read(&mut [0u8; 8]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        assert!(err.to_string().contains("no call with accepted credentials within 600 ms"), "{err}");
        let waited = started.elapsed();
        assert!(waited > Duration::from_millis(400) && waited < Duration::from_secs(3), "{waited:?}");
        let idle = tokio::time::timeout(Duration::from_millis(800), served[1].read(&mut [0u8; 8])).await;
        assert!(idle.is_err(), "an admitted connection is left open however idle: {idle:?}");
        clients[1].write_all(b"more").await.unwrap();
        assert_eq!(served[1].read(&mut [0u8; 8]).await.unwrap(), 4);
    }

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
