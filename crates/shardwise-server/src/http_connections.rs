//! The HTTP endpoint's connections: how many are open, and how long one may sit idle.
//!
//! Why a cap: hyper keeps a connection that sends nothing open for as long as the client likes,
//! and the endpoint took every connection offered, so about 20 000 idle ones (no credentials
//! needed) used up the node's file descriptors, and the node stopped answering on every endpoint,
//! Flight SQL and PostgreSQL included, until they closed. With the cap, such a client fills the
//! HTTP endpoint only: past [`HTTP_MAX_CONNECTIONS`] a new connection waits in the kernel's
//! backlog until one closes, and the node's other endpoints keep their descriptors.
//!
//! Why a timeout: under the cap, 1024 connections that never send a request (or send its
//! headers a byte a minute) still shut every other HTTP client out. hyper ends a connection
//! whose request headers have not all arrived [`HTTP_HEADER_READ_TIMEOUT_MS`] after it began
//! waiting for them, which is also how long a keep-alive connection may sit idle between
//! requests (nginx's `client_header_timeout` and `keepalive_timeout`; ClickHouse's
//! `http_receive_timeout`), but only with a timer, which `axum::serve` does not give it; so the
//! connections are served here ([`serve`]). A request's body may not pause for longer than that
//! either ([`TimedBody`]): a request that declared 100 bytes and sent 6 held its connection open
//! for good, and 1024 of them shut every other client out. A request being answered is not
//! timed: a query may take as long as its settings allow.
//!
//! Why a send timeout: an answer the client stops reading holds its query, and the query holds
//! what it reads from other nodes (their streams' flow-control windows on the connection it
//! shares with every other query of this node); five unread `SELECT *` answers held every
//! cross-node query of their node for minutes. A connection whose socket takes no byte of the
//! answer for [`HTTP_SEND_TIMEOUT_MS`] is closed, and its query cancelled (after ClickHouse's
//! `http_send_timeout`, whose default its older sources set to 1800 s, `Core/Defines.h`; 30 s
//! here). A slow reader that keeps reading is never cut off.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame, SizeHint};

/// HTTP connections a node keeps open at once.
pub const HTTP_MAX_CONNECTIONS: usize = 1024;

/// How long a connection may take to send a request's headers, counted from when the node
/// starts waiting for them: on a new connection, or after the last answer on a kept-alive one;
/// and how long a request's body may pause ([`TimedBody`]).
pub const HTTP_HEADER_READ_TIMEOUT_MS: u64 = 30_000;

/// How long a connection's socket may take no byte of an answer before the connection is closed
/// and the answer's query cancelled.
pub const HTTP_SEND_TIMEOUT_MS: u64 = 30_000;

/// How long [`serve`]'s connections may wait for the client.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// For a request's headers, and between the pieces of its body ([`TimedBody`]).
    pub header_read: Duration,
    /// For the socket to take a byte of an answer.
    pub send: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            header_read: Duration::from_millis(HTTP_HEADER_READ_TIMEOUT_MS),
            send: Duration::from_millis(HTTP_SEND_TIMEOUT_MS),
        }
    }
}

/// Serves `app` on the connections `listener` accepts, each with `timeouts`, until `shutdown`
/// completes; then waits for the requests being answered (as `axum::serve`'s graceful shutdown
/// does).
pub async fn serve(
    mut listener: crate::connections::CappedListener,
    app: axum::Router,
    timeouts: Timeouts,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let header_read_timeout = timeouts.header_read;
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(header_read_timeout);
    let app =
        app.layer(axum::middleware::from_fn(move |request: axum::extract::Request, next: axum::middleware::Next| {
            next.run(request.map(|body| axum::body::Body::new(TimedBody::new(body, header_read_timeout))))
        }));
    let watcher = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, open) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let mut stream = tokio_io_timeout::TimeoutStream::new(stream);
        stream.set_write_timeout(Some(timeouts.send));
        let connection = http.serve_connection(hyper_util::rt::TokioIo::new(Box::pin(stream)), service);
        let connection = watcher.watch(connection);
        tokio::spawn(async move {
            // Its place under the cap, held until the connection ends.
            let _open = open;
            // A client that went away, or was timed out: nothing to answer, nothing to log above
            // debug (hyper logged a header timeout itself; a send timeout ends here).
            if let Err(e) = connection.await {
                tracing::debug!("http connection ended: {e}");
            }
        });
    }
    drop(listener);
    watcher.shutdown().await;
}

/// The slowest a request body may arrive, on average, beyond the first `idle` (Apache's
/// `mod_reqtimeout` `MinRate`): a body trickled a byte a second held its connection for good,
/// since each byte restarted the pause timer.
pub const HTTP_BODY_MIN_BYTES_PER_S: u64 = 500;

/// A request body that fails when nothing of it arrives for `idle` (counted from when the
/// request was taken up, then from each piece), or when it arrives slower than
/// [`HTTP_BODY_MIN_BYTES_PER_S`] on average after the first `idle`.
pub struct TimedBody {
    inner: axum::body::Body,
    idle: Duration,
    started: tokio::time::Instant,
    received_bytes: u64,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl TimedBody {
    pub fn new(inner: axum::body::Body, idle: Duration) -> Self {
        let started = tokio::time::Instant::now();
        TimedBody { inner, idle, started, received_bytes: 0, deadline: Box::pin(tokio::time::sleep(idle)) }
    }
}

impl HttpBody for TimedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => match this.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(axum::Error::new(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "the request body stopped arriving: nothing for {} ms, or under {HTTP_BODY_MIN_BYTES_PER_S} \
                         bytes a second",
                        this.idle.as_millis()
                    ),
                ))))),
                Poll::Pending => Poll::Pending,
            },
            ready => {
                if let Poll::Ready(Some(Ok(frame))) = &ready {
                    this.received_bytes += frame.data_ref().map_or(0, |d| d.len() as u64);
                }
                let paced = Duration::from_millis(this.received_bytes * 1000 / HTTP_BODY_MIN_BYTES_PER_S);
                let next = (tokio::time::Instant::now() + this.idle).min(this.started + this.idle + paced);
                this.deadline.as_mut().reset(next);
                ready
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    async fn serving(timeout_ms: u64) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let inner = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = inner.local_addr().expect("addr");
        let app = axum::Router::new().route(
            "/",
            axum::routing::get(|| async { "hello" }).post(|body: Bytes| async move { format!("{} bytes", body.len()) }),
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let timeout = std::time::Duration::from_millis(timeout_ms);
        let timeouts = Timeouts { header_read: timeout, send: timeout };
        tokio::spawn(serve(crate::connections::CappedListener::new(inner, 8, "http"), app, timeouts, async move {
            let _ = stopped.await;
        }));
        (addr, stop)
    }

    /// Set when the answer it is part of is dropped.
    struct Dropped(std::sync::Arc<std::sync::atomic::AtomicBool>);

    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// An answer its client stops reading is dropped (its query cancelled) and the connection
    /// closed after the send timeout; one its client reads slowly is sent whole.
    #[tokio::test]
    async fn an_answer_nobody_reads_is_given_up() {
        use futures::StreamExt;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        const ANSWER_BYTES: usize = 64 << 20;
        let inner = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = inner.local_addr().expect("addr");
        let dropped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&dropped);
        let app = axum::Router::new().route(
            "/",
            axum::routing::get(move || {
                let guard = Dropped(std::sync::Arc::clone(&flag));
                async move {
                    let chunks = futures::stream::iter(0..ANSWER_BYTES / 65536).map(move |_| {
                        let _held = &guard;
                        Ok::<_, std::io::Error>(Bytes::from(vec![b'x'; 65536]))
                    });
                    axum::body::Body::from_stream(chunks)
                }
            }),
        );
        let timeouts = Timeouts { header_read: Duration::from_secs(30), send: Duration::from_millis(300) };
        let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve(crate::connections::CappedListener::new(inner, 8, "http"), app, timeouts, async move {
            let _ = stopped.await;
        }));

        let mut unread = TcpStream::connect(addr).await.expect("connect");
        unread.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
        let given_up = tokio::time::timeout(Duration::from_secs(10), async {
            while !dropped.load(std::sync::atomic::Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        assert!(given_up.is_ok(), "the unread answer was still held after 10 s");
        // What the socket buffers held arrives, then the connection ends short of the answer.
        let mut got = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), unread.read_to_end(&mut got)).await;
        assert!(got.len() < ANSWER_BYTES, "{} bytes", got.len());

        // A reader that pauses for less than the timeout between reads gets it all.
        dropped.store(false, std::sync::atomic::Ordering::SeqCst);
        let mut slow = TcpStream::connect(addr).await.expect("connect");
        slow.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.expect("write");
        let mut total = 0usize;
        let mut buf = vec![0u8; 8 << 20];
        let mut reads = 0u32;
        loop {
            let n = slow.read(&mut buf).await.expect("read");
            if n == 0 {
                break;
            }
            total += n;
            reads += 1;
            if reads.is_multiple_of(4) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        assert!(total > ANSWER_BYTES, "{total} bytes");
    }

    /// Reads until the server closes the connection; what it sent.
    async fn read_to_close(stream: &mut TcpStream) -> String {
        use tokio::io::AsyncReadExt;
        let mut got = Vec::new();
        let read = tokio::time::timeout(std::time::Duration::from_secs(10), stream.read_to_end(&mut got)).await;
        assert!(read.is_ok(), "the server did not close the connection");
        String::from_utf8_lossy(&got).into_owned()
    }

    /// A body that stops arriving fails the request after the timeout (400, and the connection
    /// closes); one that arrives is read whole.
    #[tokio::test]
    async fn a_body_that_stops_arriving_is_timed_out() {
        use tokio::io::AsyncWriteExt;
        let (addr, _stop) = serving(300).await;
        let mut stalled = TcpStream::connect(addr).await.expect("connect");
        stalled.write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nsix by").await.expect("write");
        let started = std::time::Instant::now();
        let answered = read_to_close(&mut stalled).await;
        assert!(answered.starts_with("HTTP/1.1 400"), "{answered}");
        assert!(started.elapsed() >= std::time::Duration::from_millis(250), "timed out early");
        let mut client = TcpStream::connect(addr).await.expect("connect");
        client
            .write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\nConnection: close\r\n\r\nsix")
            .await
            .expect("write");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        client.write_all(b" by").await.expect("write");
        let answer = read_to_close(&mut client).await;
        assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("6 bytes"), "{answer}");
        // A body trickled a byte every 100 ms, never pausing for the timeout: too slow.
        let trickle = TcpStream::connect(addr).await.expect("connect");
        let (mut answer, mut body) = trickle.into_split();
        body.write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n").await.expect("write");
        let started = std::time::Instant::now();
        let writer = tokio::spawn(async move {
            for _ in 0..100 {
                if body.write_all(b"x").await.is_err() {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        });
        let mut got = Vec::new();
        use tokio::io::AsyncReadExt;
        let read = tokio::time::timeout(std::time::Duration::from_secs(5), answer.read_to_end(&mut got)).await;
        writer.abort();
        let answered = String::from_utf8_lossy(&got);
        assert!(read.is_ok() && answered.starts_with("HTTP/1.1 400"), "{answered}");
        // The 100 bytes would have taken 10 s.
        assert!(started.elapsed() < std::time::Duration::from_secs(3), "{:?}", started.elapsed());
    }

    /// A connection that sends nothing, or only part of its headers, is closed after the
    /// timeout; one that sends a request is answered.
    #[tokio::test]
    async fn silent_and_slow_connections_are_closed_and_requests_answered() {
        use tokio::io::AsyncWriteExt;
        let (addr, _stop) = serving(300).await;
        let mut silent = TcpStream::connect(addr).await.expect("connect");
        let mut slow = TcpStream::connect(addr).await.expect("connect");
        slow.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.expect("write");
        let started = std::time::Instant::now();
        assert_eq!(read_to_close(&mut silent).await, "");
        assert!(started.elapsed() >= std::time::Duration::from_millis(250), "closed before the timeout");
        // hyper answers a header timeout with 408 when the request had begun.
        let answered = read_to_close(&mut slow).await;
        assert!(answered.is_empty() || answered.starts_with("HTTP/1.1 408"), "{answered}");

        let mut client = TcpStream::connect(addr).await.expect("connect");
        client.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.expect("write");
        let answer = read_to_close(&mut client).await;
        assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("hello"), "{answer}");
    }

    /// A kept-alive connection is answered, then closed once idle for the timeout.
    #[tokio::test]
    async fn an_idle_kept_alive_connection_is_closed() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (addr, _stop) = serving(300).await;
        let mut client = TcpStream::connect(addr).await.expect("connect");
        client.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
        let mut buf = [0u8; 512];
        let n = client.read(&mut buf).await.expect("read");
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
        assert_eq!(read_to_close(&mut client).await, "");
    }

    /// Shutdown stops accepting and lets the open connections finish.
    #[tokio::test]
    async fn shutdown_stops_accepting() {
        let (addr, stop) = serving(30_000).await;
        let _ = stop.send(());
        let refused = tokio::time::timeout(std::time::Duration::from_secs(5), async {
            loop {
                if TcpStream::connect(addr).await.is_err() {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        })
        .await;
        assert!(refused.is_ok(), "still accepting after shutdown");
    }
}
