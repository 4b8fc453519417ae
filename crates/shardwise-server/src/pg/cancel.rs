//! PostgreSQL's cancel request: psql's Ctrl-C, psycopg's `conn.cancel()`, JDBC's
//! `Statement.cancel()`. The client opens a second connection and sends the process id and
//! secret key its first connection was given at startup.
//!
//! pgwire cancels a statement whose handler is still running (planning, a statement that runs
//! for its effect) through its connection manager; shardwise's rows stream to the client after
//! the handler returns, which pgwire's signal does not reach. So each connection also has a
//! cancel counter of its own, found by the same process id and secret key ([`Cancels`]): a
//! request bumps it, and a statement's row stream ([`cancellable`]) ends with `57014 canceling
//! statement due to user request` when it moves. Dropping the stream stops the query and every
//! fragment it started on other nodes, as a client that disconnects does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use async_trait::async_trait;
use futures::{Stream, StreamExt};
use pgwire::api::ConnectionManager;
use pgwire::api::cancel::CancelHandler;
use pgwire::error::PgWireResult;
use pgwire::messages::cancel::CancelRequest;
use pgwire::messages::startup::SecretKey;
use tokio::sync::watch;

use super::errors::error;

type Key = (i32, Vec<u8>);

/// The cancel counters of a node's connections, by process id and secret key.
#[derive(Debug)]
pub struct Cancels {
    counters: Mutex<HashMap<Key, Weak<watch::Sender<u64>>>>,
    /// pgwire's registry, for statements whose handler is still running.
    pgwire: Arc<ConnectionManager>,
}

impl Cancels {
    pub fn new(pgwire: Arc<ConnectionManager>) -> Cancels {
        Cancels { counters: Mutex::new(HashMap::new()), pgwire }
    }

    /// Registers a connection's `counter` (made when it was accepted, see [`hangups`]); it stays
    /// registered while the returned registration lives.
    pub fn register(
        self: &Arc<Self>,
        pid: i32,
        secret_key: &SecretKey,
        counter: Arc<watch::Sender<u64>>,
    ) -> Registration {
        let key = (pid, secret_key.to_bytes().to_vec());
        let mut counters = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        counters.retain(|_, c| c.strong_count() > 0);
        counters.insert(key, Arc::downgrade(&counter));
        Registration { counter }
    }
}

/// A connection's cancel counter.
#[derive(Debug)]
pub struct Registration {
    counter: Arc<watch::Sender<u64>>,
}

impl Registration {
    /// What the statement about to run watches: a cancel request from now on moves it.
    pub fn signal(&self) -> watch::Receiver<u64> {
        let mut signal = self.counter.subscribe();
        signal.borrow_and_update();
        signal
    }
}

/// The node's cancel handler.
#[derive(Debug)]
pub struct CancelRequests(pub Arc<Cancels>);

#[async_trait]
impl CancelHandler for CancelRequests {
    async fn on_cancel_request(&self, request: CancelRequest) {
        self.0.pgwire.cancel(request.pid, &request.secret_key).await;
        let key = (request.pid, request.secret_key.to_bytes().to_vec());
        let counter = self.0.counters.lock().unwrap_or_else(|p| p.into_inner()).get(&key).and_then(Weak::upgrade);
        match counter {
            Some(counter) => {
                counter.send_modify(|n| *n += 1);
            }
            None => tracing::debug!(pid = request.pid, "cancel request for no connection of this node"),
        }
    }
}

/// `rows`, ended by a `57014` error as soon as `signal` moves.
pub fn cancellable<T: Send + 'static>(
    rows: impl Stream<Item = PgWireResult<T>> + Send + 'static,
    signal: Option<watch::Receiver<u64>>,
) -> impl Stream<Item = PgWireResult<T>> + Send + 'static {
    futures::stream::unfold((rows.boxed(), signal, false), |(mut rows, mut signal, ended)| async move {
        if ended {
            return None;
        }
        loop {
            let Some(waiting) = signal.as_mut() else {
                return rows.next().await.map(|row| (row, (rows, None, false)));
            };
            tokio::select! {
                moved = waiting.changed() => match moved {
                    Ok(()) => {
                        let canceled = error("57014", "canceling statement due to user request".to_string());
                        return Some((Err(canceled), (rows, None, true)));
                    }
                    // The connection is gone: nothing can cancel this statement now.
                    Err(_) => signal = None,
                },
                row = rows.next() => return row.map(|row| (row, (rows, signal, false))),
            }
        }
    })
}

/// How often a connection's socket is looked at for a client that went away, in milliseconds.
pub const HANGUP_CHECK_MS: u64 = 250;

/// Bumps `counter` (the connection's cancel counter) once the client at the other end of `fd`
/// has closed its end (or the connection broke), then returns; checked every
/// [`HANGUP_CHECK_MS`] while a statement runs. Without it a statement that had not sent a row yet (a long aggregation)
/// ran on after its client was gone, until it wrote to the socket. Run beside the connection's
/// handling and dropped with it, so `fd` is never read after the connection closed it.
pub async fn hangups(fd: std::os::fd::RawFd, counter: Arc<watch::Sender<u64>>) {
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(HANGUP_CHECK_MS)).await;
        // Only while a statement watches the counter (its row stream holds a receiver): an idle
        // connection costs a timer, no system call.
        if counter.receiver_count() == 0 {
            continue;
        }
        let mut poll = libc::pollfd { fd, events: libc::POLLRDHUP, revents: 0 };
        // SAFETY: `poll` is a valid pollfd for the call; `fd` is the connection's open socket,
        // owned by the connection this future is dropped with (see the doc).
        let ready = unsafe { libc::poll(&mut poll, 1, 0) };
        if ready > 0 && poll.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0 {
            counter.send_modify(|n| *n += 1);
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_client_that_goes_away_moves_the_counter() -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let client = tokio::net::TcpStream::connect(listener.local_addr()?).await?;
        let (server, _) = listener.accept().await?;
        let counter = Arc::new(watch::Sender::new(0));
        let mut signal = counter.subscribe();
        let watcher = tokio::spawn(hangups(server.as_raw_fd(), Arc::clone(&counter)));
        // Connected: nothing moves.
        tokio::time::sleep(std::time::Duration::from_millis(3 * HANGUP_CHECK_MS)).await;
        assert!(!signal.has_changed().unwrap_or(true));
        drop(client);
        let moved = tokio::time::timeout(std::time::Duration::from_secs(5), signal.changed()).await;
        assert!(matches!(moved, Ok(Ok(()))), "the counter did not move");
        let _ = watcher.await;
        drop(server);
        Ok(())
    }

    #[tokio::test]
    async fn a_cancel_request_ends_the_rows_of_its_connection_with_57014() {
        let cancels = Arc::new(Cancels::new(Arc::new(ConnectionManager::new())));
        let mine = cancels.register(7, &SecretKey::I32(42), Arc::new(watch::Sender::new(0)));
        let other = cancels.register(8, &SecretKey::I32(43), Arc::new(watch::Sender::new(0)));
        let rows = futures::stream::iter(vec![Ok(1)]).chain(futures::stream::pending());
        let mut stream = Box::pin(cancellable(rows, Some(mine.signal())));
        let mut untouched = Box::pin(cancellable(futures::stream::iter(vec![Ok(1), Ok(2)]), Some(other.signal())));
        assert_eq!(stream.next().await.map(|r| r.ok()), Some(Some(1)));
        let handler = CancelRequests(Arc::clone(&cancels));
        // A wrong secret key cancels nothing.
        let watching = mine.signal();
        handler.on_cancel_request(CancelRequest::new(7, SecretKey::I32(0))).await;
        assert!(!watching.has_changed().unwrap_or(true), "a wrong key moved the counter");
        handler.on_cancel_request(CancelRequest::new(7, SecretKey::I32(42))).await;
        assert!(watching.has_changed().unwrap_or(false));
        match stream.next().await {
            Some(Err(pgwire::error::PgWireError::UserError(info))) => assert_eq!(info.code, "57014"),
            other => panic!("{other:?}"),
        }
        assert!(stream.next().await.is_none());
        assert_eq!(untouched.next().await.map(|r| r.ok()), Some(Some(1)));
        assert_eq!(untouched.next().await.map(|r| r.ok()), Some(Some(2)));
        // A signal taken after a request does not see it.
        let later = mine.signal();
        assert!(!later.has_changed().unwrap_or(true));
    }
}
