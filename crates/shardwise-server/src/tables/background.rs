//! Background storage work at a lower CPU priority than the requests a node serves.
//!
//! A `delay_mode_distributed` insert is acknowledged once it is in the outbox; what follows is
//! background work: applying the shipped batches to shard stores (on this node and on the
//! receivers), and each store's maintenance (writing parts, compacting). That work comes in
//! bursts of milliseconds of CPU (decoding, WAL writes, part encoding), and on a node with few
//! cores an insert whose fsync completes during such a burst waits a scheduler slice before it
//! can answer. Here it runs on threads of their own whose nice value is raised by
//! [`BACKGROUND_THREAD_NICE`], so the scheduler runs a waking request thread first. Locks the two
//! share (a shard store's) are held for short, bounded steps, as before.
//!
//! The senders of delayed shipments run here too, on the one worker thread of this runtime, with
//! connections of their own to the other nodes (`Peers::ship`): encoding a shipment of a few MB,
//! writing it into a socket, and the kernel's loopback or network work that comes with it then
//! never occupy a worker of the runtime that answers inserts and queries.
//!
//! Work that a client waits for (an `immediate` insert's replica writes) stays at normal priority.

use shardwise_query::QueryError;
use tokio::runtime::{Handle, Runtime};

/// How much the background threads' nice value is raised (Linux; 0 is normal, 19 the lowest
/// priority). At 10 a busy background thread gets about a tenth of a CPU that a normal thread
/// also wants, and all of an idle one.
pub const BACKGROUND_THREAD_NICE: i32 = 10;

/// Worker threads of the background runtime (the senders' tasks and their connections); the
/// heavy steps go to its blocking threads.
pub const BACKGROUND_WORKER_THREADS: usize = 1;

/// See the module doc.
pub(crate) struct BackgroundPool {
    runtime: Option<Runtime>,
}

impl std::fmt::Debug for BackgroundPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackgroundPool").finish_non_exhaustive()
    }
}

impl BackgroundPool {
    pub(crate) fn new() -> Result<Self, QueryError> {
        // One worker for the senders' tasks; blocking threads are started on demand (and
        // lowered) as any runtime's are.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(BACKGROUND_WORKER_THREADS)
            .thread_name("shardwise-bg")
            .on_thread_start(lower_this_thread_priority)
            .enable_all()
            .build()
            .map_err(|e| QueryError::Storage(format!("cannot start the background storage runtime: {e}")))?;
        Ok(BackgroundPool { runtime: Some(runtime) })
    }

    fn handle(&self) -> Result<&Handle, QueryError> {
        self.runtime.as_ref().map(Runtime::handle).ok_or_else(|| QueryError::Storage("the node is stopping".into()))
    }

    /// Runs `task` on the background runtime's worker.
    pub(crate) fn spawn<F>(&self, task: F) -> Result<(), QueryError>
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.handle()?.spawn(task);
        Ok(())
    }

    /// Runs blocking `work` on a background thread and waits for it.
    pub(crate) async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> Result<T, QueryError> + Send + 'static,
    ) -> Result<T, QueryError> {
        self.handle()?
            .spawn_blocking(work)
            .await
            .map_err(|e| QueryError::Storage(format!("background storage task failed: {e}")))?
    }
}

impl Drop for BackgroundPool {
    fn drop(&mut self) {
        // Dropping a runtime from inside another one blocks, which tokio forbids. The last
        // owner may even be one of this runtime's own tasks (a sender holding the node when
        // the node stops): then the runtime is let go from a thread of its own.
        if let Some(runtime) = self.runtime.take() {
            let inside = Handle::try_current().is_ok_and(|h| h.id() == runtime.handle().id());
            if inside {
                let _ = std::thread::Builder::new().name("shardwise-bg-stop".into()).spawn(move || {
                    runtime.shutdown_background();
                });
            } else {
                runtime.shutdown_background();
            }
        }
    }
}

/// Raises the calling thread's nice value by [`BACKGROUND_THREAD_NICE`]. Failing is harmless
/// (the work runs at normal priority) and only logged.
fn lower_this_thread_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid and setpriority take and return plain integers and touch no memory;
        // on Linux the nice value is per thread, and PRIO_PROCESS with a thread id sets that
        // thread's.
        let result = unsafe {
            let tid = libc::gettid();
            let current = libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t);
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, (current + BACKGROUND_THREAD_NICE).min(19))
        };
        if result != 0 {
            tracing::debug!("cannot lower a background thread's priority: {}", std::io::Error::last_os_error());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[cfg(target_os = "linux")]
    fn nice_of_this_thread() -> i32 {
        // SAFETY: as above, plain integers only.
        unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn background_work_runs_at_a_lower_priority_and_returns_its_result() {
        let pool = BackgroundPool::new().expect("pool");
        let blocking = pool.blocking(|| Ok(nice_of_this_thread())).await.expect("blocking");
        let here = nice_of_this_thread();
        assert_eq!(blocking, (here + BACKGROUND_THREAD_NICE).min(19));
        let failed = pool.blocking(|| Err::<(), _>(QueryError::Storage("disk gone".into()))).await;
        assert!(failed.expect_err("error passes through").to_string().contains("disk gone"));
        drop(pool); // from inside a runtime: must not panic
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn tasks_run_on_the_lowered_worker_and_the_pool_can_be_dropped_by_one_of_them() {
        let pool = Arc::new(BackgroundPool::new().expect("pool"));
        let (tx, rx) = tokio::sync::oneshot::channel();
        let held = Arc::clone(&pool);
        pool.spawn(async move {
            let nice = nice_of_this_thread();
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            // The task now holds the last reference: the pool is dropped on its own worker.
            let _ = tx.send(nice);
            drop(held);
        })
        .expect("spawn");
        let here = nice_of_this_thread();
        drop(pool);
        let nice = rx.await.expect("the task ran");
        assert_eq!(nice, (here + BACKGROUND_THREAD_NICE).min(19));
    }
}
