//! How the tables' code takes its mutexes and runs blocking storage calls from the async runtime.
//!
//! A shard store's and the outbox's mutexes are held across file writes and fsyncs, and the
//! runtime's workers also serve the network: a worker that blocks stalls the tasks queued behind
//! it. Three ways to block, by how long and how often:
//! - [`blocking`]: the blocking pool, for work of any length (applying shipments, flushes);
//! - [`lock_from_runtime`]: a short read under a mutex that an fsync may hold;
//! - [`run_locked_short`]: one short call under a mutex (an insert's outbox append and its
//!   fdatasync, about 0.2 ms), in place on the calling worker when the others can serve the rest,
//!   since handing the worker over for each small insert cost a quarter of the CPU the insert
//!   took on its node.

use std::sync::{Arc, Mutex, MutexGuard};

use shardwise_query::QueryError;

/// Locks a mutex even if a thread panicked while holding it (the data behind it stays valid:
/// stores and the outbox fail themselves on I/O errors rather than half-updating memory).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// [`lock`] for a task on the async runtime, of a mutex that may be held across an fsync (the
/// outbox's: an insert holds it through its append's `fdatasync`). Uncontended, it is
/// `try_lock`. Contended, the waiting worker first hands its other tasks to another thread
/// (`block_in_place`), so a sender or a `system.sync_queues` read waiting out an insert's fsync
/// does not stall the network tasks queued behind it on that worker. On a current-thread
/// runtime (tests) it waits in place, as [`lock`].
pub(crate) fn lock_from_runtime<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.try_lock() {
        Ok(guard) => guard,
        Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => {
            match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
                Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(|| lock(m)),
                _ => lock(m),
            }
        }
    }
}

/// Runs `f` on the value behind `m`, locked, for a short blocking call (an insert's outbox
/// append and its fdatasync). On a multi-thread runtime with at least two workers, when `m` is
/// free, in place on this worker: the worker's other tasks wait for the call (about 0.2 ms),
/// the other workers steal what they can, and no thread is woken. Handing the worker over
/// (`block_in_place`) for every small insert cost 0.44-0.50 ms of CPU per insert on the node
/// that took it against 0.33-0.36 in place (BENCHMARKS.md, "Insert latency"). When `m` is held,
/// its holder may be in an fsync of any length, so this worker is handed over before waiting;
/// since only the holder runs in place, at most one worker at a time is blocked without a
/// hand-over. With one worker it is always handed over, and on a current-thread runtime the
/// call goes to the blocking pool.
pub(crate) async fn run_locked_short<T: Send + 'static, R: Send + 'static>(
    m: &Arc<Mutex<T>>,
    f: impl FnOnce(&mut T) -> R + Send + 'static,
) -> Result<R, QueryError> {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return Ok(f(&mut lock(m)));
    };
    let flavor = handle.runtime_flavor();
    if may_run_in_place(&flavor, handle.metrics().num_workers()) {
        match m.try_lock() {
            Ok(mut guard) => return Ok(f(&mut guard)),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => return Ok(f(&mut poisoned.into_inner())),
            Err(std::sync::TryLockError::WouldBlock) => {}
        }
    }
    match flavor {
        tokio::runtime::RuntimeFlavor::MultiThread => Ok(tokio::task::block_in_place(|| f(&mut lock(m)))),
        _ => {
            let m = Arc::clone(m);
            blocking(move || Ok(f(&mut lock(&m)))).await
        }
    }
}

/// Whether a short call may block a worker of this runtime without handing it over: only when
/// other workers remain to serve the rest.
fn may_run_in_place(flavor: &tokio::runtime::RuntimeFlavor, workers: usize) -> bool {
    *flavor == tokio::runtime::RuntimeFlavor::MultiThread && workers >= 2
}

/// Runs blocking storage work on the blocking pool.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, QueryError> + Send + 'static,
) -> Result<T, QueryError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| QueryError::Storage(format!("storage task failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Holds `m` on a thread of its own for `hold`, returning once it is held.
    fn hold_elsewhere(m: &Arc<Mutex<u32>>, hold: Duration) -> std::thread::JoinHandle<()> {
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let m = Arc::clone(m);
        let holder = std::thread::spawn(move || {
            let _guard = lock(&m);
            let _ = held_tx.send(());
            std::thread::sleep(hold);
        });
        held_rx.recv().expect("the holder took the lock");
        holder
    }

    #[test]
    fn a_task_waiting_on_a_held_lock_does_not_stall_the_others() -> Result<(), Box<dyn std::error::Error>> {
        use std::sync::atomic::Ordering;
        // One worker: with a plain lock, the waiting task would stop the ticker on it.
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
        let m = Arc::new(Mutex::new(7u32));
        runtime.block_on(async {
            let (ticks, ticker) = ticker();
            let holder = hold_elsewhere(&m, Duration::from_millis(300));
            let before = ticks.load(Ordering::Relaxed);
            let waiter = Arc::clone(&m);
            let value = tokio::spawn(async move { *lock_from_runtime(&waiter) }).await?;
            let during = ticks.load(Ordering::Relaxed) - before;
            assert_eq!(value, 7);
            assert!(during >= 10, "the ticker ticked {during} times while a task waited 300 ms for the lock");
            // From the blocking pool (no worker to hand over) it waits in place.
            let holder2 = hold_elsewhere(&m, Duration::from_millis(20));
            let from_pool = Arc::clone(&m);
            assert_eq!(tokio::task::spawn_blocking(move || *lock_from_runtime(&from_pool)).await?, 7);
            ticker.abort();
            for h in [holder, holder2] {
                h.join().map_err(|_| "holder panicked")?;
            }
            Ok::<_, Box<dyn std::error::Error>>(())
        })?;
        // A current-thread runtime waits in place too.
        let single = tokio::runtime::Builder::new_current_thread().build()?;
        let holder = hold_elsewhere(&m, Duration::from_millis(20));
        assert_eq!(single.block_on(async { *lock_from_runtime(&m) }), 7);
        holder.join().map_err(|_| "holder panicked")?;
        Ok(())
    }

    /// Counts ticks of a task on the current runtime until aborted.
    fn ticker() -> (Arc<std::sync::atomic::AtomicU32>, tokio::task::JoinHandle<()>) {
        let ticks = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counter = Arc::clone(&ticks);
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(5)).await;
                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        });
        (ticks, task)
    }

    #[test]
    fn a_short_call_runs_in_place_only_when_other_workers_are_free() -> Result<(), Box<dyn std::error::Error>> {
        use std::sync::atomic::Ordering;
        let m = Arc::new(Mutex::new(7u32));
        use tokio::runtime::RuntimeFlavor::{CurrentThread, MultiThread};
        // In place only with other workers left to serve the rest.
        assert!(may_run_in_place(&MultiThread, 2));
        assert!(!may_run_in_place(&MultiThread, 1));
        assert!(!may_run_in_place(&CurrentThread, 1));
        // Two workers, the lock free: runs and answers.
        let two = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
        let free = Arc::clone(&m);
        let value =
            two.block_on(async move { tokio::spawn(async move { run_locked_short(&free, |v| *v).await }).await })??;
        assert_eq!(value, 7);
        // Two workers, the lock held 300 ms elsewhere: the call waits for it (its worker handed
        // over first) and the runtime keeps serving meanwhile.
        two.block_on(async {
            let (ticks, task) = ticker();
            let holder = hold_elsewhere(&m, Duration::from_millis(300));
            let before = ticks.load(Ordering::Relaxed);
            let waiter = Arc::clone(&m);
            let value = tokio::spawn(async move { run_locked_short(&waiter, |v| *v).await }).await??;
            let during = ticks.load(Ordering::Relaxed) - before;
            assert_eq!(value, 7);
            assert!(during >= 10, "the ticker ticked {during} times while a call waited 300 ms for the lock");
            task.abort();
            holder.join().map_err(|_| "holder panicked")?;
            Ok::<_, Box<dyn std::error::Error>>(())
        })?;
        // One worker, the lock free but the call slow (a stalled disk): handed over all the same.
        let one = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
        one.block_on(async {
            let (ticks, task) = ticker();
            let before = ticks.load(Ordering::Relaxed);
            let slow = Arc::clone(&m);
            let value = tokio::spawn(async move {
                run_locked_short(&slow, |v| {
                    std::thread::sleep(Duration::from_millis(300));
                    *v
                })
                .await
            })
            .await??;
            let during = ticks.load(Ordering::Relaxed) - before;
            assert_eq!(value, 7);
            assert!(during >= 10, "the ticker ticked {during} times during a 300 ms call on a one-worker runtime");
            task.abort();
            Ok::<_, Box<dyn std::error::Error>>(())
        })?;
        // A current-thread runtime: on the blocking pool; a poisoned lock is still usable.
        let single = tokio::runtime::Builder::new_current_thread().build()?;
        assert_eq!(single.block_on(run_locked_short(&m, |v| *v + 1))?, 8);
        let poison = Arc::clone(&m);
        let _ = std::thread::spawn(move || {
            let _guard = lock(&poison);
            panic!("poisoning the lock on purpose");
        })
        .join();
        assert!(m.is_poisoned());
        assert_eq!(
            two.block_on(async {
                tokio::spawn({
                    let m = Arc::clone(&m);
                    async move { run_locked_short(&m, |v| *v).await }
                })
                .await
            })??,
            7
        );
        Ok(())
    }
}
