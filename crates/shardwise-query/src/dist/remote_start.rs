//! Lets a fragment's remote runs start before its local run takes the CPU.
//!
//! A local run's first poll computes until its scan yields (its input is in memory, always
//! ready), while a remote run's request is written by the node's network runtime, on another
//! thread. On a node with one core the request then waits for the scheduler to take that core
//! from the query thread: `perf sched` of a 2-node cluster, one core per node, answering
//! db-benchmark's q1 showed the other node starting its half 3 ms after this one, on a 24 ms
//! query. So a local run first waits, up to [`REMOTE_START_WAIT_MS`], until the remote runs of
//! the same fragment that are opening have their answer's headers, i.e. are running on their
//! node. It costs one round trip on loopback; the query could not end before the remote run
//! anyway.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

/// The longest a local run waits for its fragment's remote runs to start.
pub const REMOTE_START_WAIT_MS: u64 = 20;

/// Remote runs of one fragment that are opening (request sent, no answer yet).
#[derive(Debug, Default)]
pub struct RemoteStarts {
    opening: AtomicUsize,
    opened: Notify,
}

/// Held by a remote run while it opens; dropping it counts the run as started.
pub struct Opening(Arc<RemoteStarts>);

impl Drop for Opening {
    fn drop(&mut self) {
        self.0.opening.fetch_sub(1, Ordering::SeqCst);
        self.0.opened.notify_waiters();
    }
}

impl RemoteStarts {
    /// A remote run begins opening.
    pub fn enter(self: &Arc<Self>) -> Opening {
        self.opening.fetch_add(1, Ordering::SeqCst);
        Opening(Arc::clone(self))
    }

    /// Waits until no remote run is opening, or `limit` has passed.
    pub async fn wait(&self, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let opened = self.opened.notified();
            tokio::pin!(opened);
            // Registered before the check, so a run that starts between the two still wakes us.
            opened.as_mut().enable();
            if self.opening.load(Ordering::SeqCst) == 0 {
                return;
            }
            if tokio::time::timeout_at(deadline, opened).await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_local_run_waits_for_the_remote_runs_to_open_and_no_longer() {
        let starts = Arc::new(RemoteStarts::default());
        starts.wait(Duration::from_secs(5)).await; // none opening: at once
        let (a, b) = (starts.enter(), starts.enter());
        let waiter = {
            let starts = Arc::clone(&starts);
            tokio::spawn(async move { starts.wait(Duration::from_secs(5)).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(a);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "one remote run is still opening");
        drop(b);
        tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("woken").expect("task");
    }

    #[tokio::test]
    async fn a_remote_run_that_never_answers_holds_the_local_run_only_up_to_the_limit() {
        let starts = Arc::new(RemoteStarts::default());
        let _stuck = starts.enter();
        let started = std::time::Instant::now();
        starts.wait(Duration::from_millis(REMOTE_START_WAIT_MS)).await;
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(REMOTE_START_WAIT_MS), "{waited:?}");
        assert!(waited < Duration::from_secs(5), "{waited:?}");
    }
}
