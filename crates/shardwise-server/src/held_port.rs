//! A node's port, listened on from the moment it is bound, and not served until the node has
//! joined.
//!
//! Why: a node binds its ports before the rendezvous (their addresses are part of its hello),
//! and joins up to `join_timeout_ms` later. Bound without listening, two nodes on one machine
//! given the same port (`--data-port` in a shared config file) both bound it, both joined, and
//! the second to listen exited after the cluster had formed around it. Listening at once makes
//! the second bind fail, naming the port, before anything is joined. Until the node serves, a
//! client that comes early is told so at once, in its protocol where it has one, as PostgreSQL
//! does while it starts: the HTTP port answers `503` with `{"status":"joining"}` (so an HTTP
//! readiness check fails), the PostgreSQL port a `FATAL` error with SQLSTATE `57P03` ("cannot
//! connect now"), and the gRPC ports (Flight SQL, data plane) close the connection (a client
//! sees it reset, and retries). A check that only opens a TCP connection sees the port open, as
//! it does PostgreSQL's while it starts: check `/health` instead.

use std::net::SocketAddr;

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{Semaphore, oneshot};
use tokio::task::JoinHandle;

/// Connections the kernel holds for a port before the node accepts them (`listen`'s backlog).
pub const LISTEN_BACKLOG: u32 = 1024;

/// How long a held port waits after a failed accept before the next.
pub const ACCEPT_ERROR_PAUSE_MS: u64 = 50;

/// How long an early client is given to send what its answer needs (an HTTP request, a
/// PostgreSQL startup message) before its connection is closed.
pub const EARLY_CLIENT_TIMEOUT_MS: u64 = 2_000;

/// Early clients answered at once per port; beyond that, closed without an answer.
pub const EARLY_CLIENTS_MAX: usize = 32;

/// Most bytes read from an early client (a request head, a startup message).
const EARLY_READ_MAX_BYTES: usize = 16 * 1024;

/// What a held port tells a client that comes before the node serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EarlyAnswer {
    /// Nothing: the connection is closed (gRPC clients see it reset, and retry).
    Close,
    /// `503 Service Unavailable`, `{"status":"joining"}`.
    Http,
    /// A `FATAL` error, SQLSTATE `57P03`, after the startup message (declining SSL first).
    Postgres,
}

/// What an early client is told.
const JOINING: &str = "this shardwise node is joining its cluster and serves nothing yet; try again shortly";

/// See the module doc.
#[derive(Debug)]
pub struct HeldPort {
    local: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<TcpListener>,
}

impl HeldPort {
    /// Listens on the bound `socket`, answering every connection with `early` until
    /// [`HeldPort::serve`].
    pub fn hold(socket: TcpSocket, early: EarlyAnswer) -> std::io::Result<HeldPort> {
        let listener = socket.listen(LISTEN_BACKLOG)?;
        let local = listener.local_addr()?;
        let (stop, mut stopped) = oneshot::channel::<()>();
        let answering = Arc::new(Semaphore::new(EARLY_CLIENTS_MAX));
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    // Asked to serve, or dropped (the node did not start): the listener goes
                    // back, or is closed with this task.
                    _ = &mut stopped => return listener,
                    // Not serving yet: answered at once, or closed when too many wait for
                    // their answer. An error (out of file descriptors) is waited out briefly
                    // rather than retried in a busy loop.
                    accepted = listener.accept() => match accepted {
                        // Nothing to say: closed here, without a task.
                        Ok((stream, _)) if early == EarlyAnswer::Close => drop(stream),
                        Ok((stream, _)) => {
                            if let Ok(permit) = Arc::clone(&answering).try_acquire_owned() {
                                tokio::spawn(async move {
                                    let limit = Duration::from_millis(EARLY_CLIENT_TIMEOUT_MS);
                                    let _ = tokio::time::timeout(limit, answer_early(stream, early)).await;
                                    drop(permit);
                                });
                            }
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(ACCEPT_ERROR_PAUSE_MS)).await,
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

/// Tells an early client that the node serves nothing yet, in its protocol.
async fn answer_early(mut stream: TcpStream, early: EarlyAnswer) -> std::io::Result<()> {
    match early {
        // Closed by the accept loop; kept for completeness of the match.
        EarlyAnswer::Close => return Ok(()),
        EarlyAnswer::Http => {
            read_request_head(&mut stream).await?;
            let body = serde_json::json!({ "status": "joining", "detail": JOINING }).to_string();
            let head = format!(
                "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                 Connection: close\r\nRetry-After: 1\r\n\r\n",
                body.len()
            );
            stream.write_all(head.as_bytes()).await?;
            stream.write_all(body.as_bytes()).await?;
        }
        EarlyAnswer::Postgres => {
            read_startup(&mut stream).await?;
            stream.write_all(&crate::pg::framing::fatal_error("57P03", JOINING)).await?;
        }
    }
    stream.shutdown().await
}

/// Reads an HTTP request's head (to its blank line, or [`EARLY_READ_MAX_BYTES`]): answered
/// before it is read, a client may see its connection reset instead of the answer.
async fn read_request_head(stream: &mut TcpStream) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while head.len() < EARLY_READ_MAX_BYTES && !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    Ok(())
}

/// PostgreSQL's codes of the requests a client may send before its startup message.
const PG_SSL_REQUEST: u32 = 80_877_103;
const PG_GSSENC_REQUEST: u32 = 80_877_104;

/// Reads a PostgreSQL client's startup message, declining SSL and GSS encryption first (`N`),
/// as a server does.
async fn read_startup(stream: &mut TcpStream) -> std::io::Result<()> {
    loop {
        let len = stream.read_u32().await? as usize;
        let code = stream.read_u32().await?;
        let rest = len.saturating_sub(8).min(EARLY_READ_MAX_BYTES);
        let mut skip = vec![0u8; rest];
        stream.read_exact(&mut skip).await?;
        match code {
            PG_SSL_REQUEST | PG_GSSENC_REQUEST => stream.write_all(b"N").await?,
            _ => return Ok(()),
        }
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
        let held = HeldPort::hold(bound(), EarlyAnswer::Close)?;
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
    async fn early_http_and_postgres_clients_are_told_the_node_is_joining() -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt;
        let http = HeldPort::hold(bound(), EarlyAnswer::Http)?;
        let mut client = tokio::net::TcpStream::connect(http.local_addr()).await?;
        client.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").await?;
        let mut answer = String::new();
        client.read_to_string(&mut answer).await?;
        assert!(answer.starts_with("HTTP/1.1 503") && answer.contains(r#""status":"joining""#), "{answer}");
        let pg = HeldPort::hold(bound(), EarlyAnswer::Postgres)?;
        let mut client = tokio::net::TcpStream::connect(pg.local_addr()).await?;
        // SSLRequest, declined; then a startup message (protocol 3.0, user=u).
        client.write_all(&[0, 0, 0, 8, 4, 210, 22, 47]).await?;
        let mut declined = [0u8; 1];
        client.read_exact(&mut declined).await?;
        assert_eq!(&declined, b"N");
        let params = b"user\0u\0\0";
        let mut startup = ((8 + params.len()) as u32).to_be_bytes().to_vec();
        startup.extend_from_slice(&196_608u32.to_be_bytes());
        startup.extend_from_slice(params);
        client.write_all(&startup).await?;
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await?;
        assert_eq!(answer.first(), Some(&b'E'));
        let text = String::from_utf8_lossy(&answer);
        assert!(text.contains("57P03") && text.contains("joining its cluster"), "{text}");
        Ok(())
    }

    #[tokio::test]
    async fn a_port_held_by_one_node_cannot_be_taken_by_another() -> std::io::Result<()> {
        let held = HeldPort::hold(bound(), EarlyAnswer::Close)?;
        let again = TcpSocket::new_v4()?;
        again.set_reuseaddr(true)?;
        let taken = again.bind(held.local_addr()).and_then(|()| again.listen(LISTEN_BACKLOG).map(drop));
        assert_eq!(taken.map_err(|e| e.kind()), Err(std::io::ErrorKind::AddrInUse));
        Ok(())
    }
}
