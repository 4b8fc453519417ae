//! A cap on the HTTP endpoint's open connections.
//!
//! Why: hyper keeps a connection that sends nothing open for as long as the client likes, and
//! the endpoint took every connection offered, so about 20 000 idle ones (no credentials needed)
//! used up the node's file descriptors, and the node stopped answering on every endpoint,
//! Flight SQL and PostgreSQL included, until they closed. With the cap, such a client fills the
//! HTTP endpoint only: past [`HTTP_MAX_CONNECTIONS`] a new connection waits in the kernel's
//! backlog until one closes, and the node's other endpoints keep their descriptors.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::serve::Listener;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// HTTP connections a node keeps open at once.
pub const HTTP_MAX_CONNECTIONS: usize = 1024;

/// `TcpListener` that accepts a connection only while fewer than its cap are open.
pub struct CappedListener {
    inner: TcpListener,
    open: Arc<Semaphore>,
    /// Whether the cap was reached since it was last logged (one warning per episode).
    warned: bool,
}

impl CappedListener {
    pub fn new(inner: TcpListener, max_connections: usize) -> Self {
        CappedListener { inner, open: Arc::new(Semaphore::new(max_connections)), warned: false }
    }
}

impl Listener for CappedListener {
    type Io = CappedStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let permit = match Arc::clone(&self.open).try_acquire_owned() {
            Ok(permit) => {
                self.warned = false;
                permit
            }
            Err(_) => {
                if !self.warned {
                    tracing::warn!(
                        "http endpoint: {HTTP_MAX_CONNECTIONS} connections open (HTTP_MAX_CONNECTIONS); new ones wait"
                    );
                    self.warned = true;
                }
                // The semaphore is never closed, so this waits for a connection to end.
                match Arc::clone(&self.open).acquire_owned().await {
                    Ok(permit) => permit,
                    Err(_) => std::future::pending().await,
                }
            }
        };
        let (stream, addr) = Listener::accept(&mut self.inner).await;
        (CappedStream { stream, _open: permit }, addr)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// An accepted connection, holding its place under the cap until it is dropped.
pub struct CappedStream {
    stream: TcpStream,
    _open: OwnedSemaphorePermit,
}

impl AsyncRead for CappedStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for CappedStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Past the cap a connection is not served until an open one closes.
    #[tokio::test]
    async fn a_connection_past_the_cap_waits_for_one_to_close() {
        let inner = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = inner.local_addr().expect("addr");
        let mut listener = CappedListener::new(inner, 2);
        let _clients: Vec<TcpStream> =
            futures::future::join_all((0..3).map(|_| TcpStream::connect(addr))).await.into_iter().flatten().collect();
        let first = listener.accept().await.0;
        let _second = listener.accept().await.0;
        let third = tokio::time::timeout(std::time::Duration::from_millis(200), listener.accept()).await;
        assert!(third.is_err(), "a third connection was accepted past a cap of 2");
        drop(first);
        let third = tokio::time::timeout(std::time::Duration::from_secs(5), listener.accept()).await;
        assert!(third.is_ok(), "the third connection was not accepted once one closed");
    }
}
