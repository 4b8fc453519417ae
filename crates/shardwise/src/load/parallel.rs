//! Checking and converting a file's batches on several threads, with the results (and the first
//! error) exactly as reading it in one go would give.
//!
//! A reader splits its file into jobs on the calling thread, in file order: only that needs to be
//! sequential (a CSV record may span lines, so where one starts depends on all before it). Each
//! job, the bytes of one batch's rows and where they are in the file, is checked and converted
//! into a record batch by one of the worker threads. [`in_order`] returns the batches in file
//! order, and, when jobs fail, the error of the first failing one, the one a sequential read would
//! have stopped at; no job after a failed one is started.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, SyncSender, channel, sync_channel};
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::bail;

/// The worker threads to use: one per core (the splitting thread mostly waits for them).
pub fn workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Where `produce` hands its jobs: straight to a free worker (the producer waits for one), so at
/// most one job per worker, plus the one being handed on, is in memory at once.
pub struct Jobs<'a, J> {
    sender: SyncSender<(usize, J)>,
    pushed: usize,
    failed_at: &'a AtomicUsize,
}

impl<J> Jobs<'_, J> {
    /// Hands on `job`, the next in file order. `false` when a job has already failed (or the workers
    /// are gone): nothing more will be converted, so the producer should stop.
    pub fn push(&mut self, job: J) -> bool {
        if self.failed_at.load(Ordering::Relaxed) != usize::MAX {
            return false;
        }
        if self.sender.send((self.pushed, job)).is_err() {
            return false;
        }
        self.pushed += 1;
        true
    }
}

/// Runs `produce` on the calling thread and `work` on each job it pushes, on `workers` threads (at
/// least one); the results in push order. The error is the first in that order: a job's, or that
/// of `produce` itself, which comes after every job it pushed.
pub fn in_order<J, T, P, W>(workers: usize, produce: P, work: W) -> anyhow::Result<Vec<T>>
where
    J: Send,
    T: Send,
    P: FnOnce(&mut Jobs<'_, J>) -> anyhow::Result<()>,
    W: Fn(J) -> anyhow::Result<T> + Sync,
{
    let workers = workers.max(1);
    let failed_at = AtomicUsize::new(usize::MAX);
    let (job_sender, job_receiver) = sync_channel::<(usize, J)>(0);
    let (result_sender, results) = channel::<(usize, anyhow::Result<T>)>();
    // Shared by the workers only: when they are all gone (a panic), `push` fails instead of blocking.
    let job_receiver = Arc::new(Mutex::new(job_receiver));
    let (produced, pushed) = std::thread::scope(|scope| {
        for _ in 0..workers {
            let (jobs, results, work, failed_at) = (job_receiver.clone(), result_sender.clone(), &work, &failed_at);
            scope.spawn(move || run_jobs(&jobs, &results, work, failed_at));
        }
        drop((job_receiver, result_sender));
        let mut jobs = Jobs { sender: job_sender, pushed: 0, failed_at: &failed_at };
        let produced = produce(&mut jobs);
        (produced, jobs.pushed)
        // `jobs` (the sender) is dropped here, so the workers stop once they are done.
    });
    let mut slots: Vec<Option<anyhow::Result<T>>> = (0..pushed).map(|_| None).collect();
    for (index, result) in results.try_iter() {
        slots[index] = Some(result);
    }
    let mut done = Vec::with_capacity(pushed);
    for (index, slot) in slots.into_iter().enumerate() {
        match slot {
            Some(result) => done.push(result?),
            None => bail!("internal error (a bug in shardwise load): batch {} was never converted", index + 1),
        }
    }
    produced?;
    Ok(done)
}

/// A worker: takes jobs until there are none, skipping those after a failed one.
fn run_jobs<J, T>(
    jobs: &Mutex<Receiver<(usize, J)>>,
    results: &Sender<(usize, anyhow::Result<T>)>,
    work: &(impl Fn(J) -> anyhow::Result<T> + Sync),
    failed_at: &AtomicUsize,
) {
    loop {
        let next = jobs.lock().unwrap_or_else(PoisonError::into_inner).recv();
        let Ok((index, job)) = next else { return };
        if index > failed_at.load(Ordering::Relaxed) {
            continue;
        }
        let result = work(job);
        if result.is_err() {
            failed_at.fetch_min(index, Ordering::Relaxed);
        }
        if results.send((index, result)).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Jobs 0..count through `in_order`; a job fails when `fails` says so.
    fn run(workers: usize, count: usize, fails: impl Fn(usize) -> bool + Sync) -> anyhow::Result<Vec<usize>> {
        in_order(
            workers,
            |jobs| {
                for job in 0..count {
                    if !jobs.push(job) {
                        break;
                    }
                }
                Ok(())
            },
            |job| {
                // Later jobs finish first, so the order comes from the indexes, not from timing.
                std::thread::sleep(std::time::Duration::from_micros(((count - job) % 7 * 50) as u64));
                if fails(job) { bail!("job {job} failed") } else { Ok(job * 10) }
            },
        )
    }

    #[test]
    fn results_come_in_push_order() {
        for workers in [1, 2, 5] {
            let done = run(workers, 100, |_| false).expect("no job fails");
            assert_eq!(done, (0..100).map(|j| j * 10).collect::<Vec<_>>());
        }
        assert_eq!(run(3, 0, |_| false).expect("no jobs"), Vec::<usize>::new());
    }

    #[test]
    fn the_first_failing_job_is_the_error() {
        for workers in [1, 2, 5] {
            let err = run(workers, 100, |job| job == 37 || job == 41 || job == 90).expect_err("fails");
            assert_eq!(err.to_string(), "job 37 failed");
        }
    }

    #[test]
    fn the_producer_error_comes_after_its_jobs() {
        let produce_then_fail = |fail_job: Option<usize>| {
            in_order(
                2,
                |jobs| {
                    for job in 0..10 {
                        jobs.push(job);
                    }
                    bail!("cannot read")
                },
                |job: usize| if Some(job) == fail_job { bail!("job {job} failed") } else { Ok(job) },
            )
        };
        assert_eq!(produce_then_fail(None).expect_err("fails").to_string(), "cannot read");
        assert_eq!(produce_then_fail(Some(9)).expect_err("fails").to_string(), "job 9 failed");
    }

    #[test]
    fn production_stops_after_a_failure() {
        let pushed = AtomicUsize::new(0);
        let outcome = in_order(
            2,
            |jobs| {
                for job in 0..1_000_000usize {
                    if !jobs.push(job) {
                        break;
                    }
                    pushed.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            },
            |job| if job == 3 { bail!("job 3 failed") } else { Ok(job) },
        );
        assert_eq!(outcome.expect_err("fails").to_string(), "job 3 failed");
        assert!(pushed.load(Ordering::Relaxed) < 1_000_000, "the producer stopped early");
    }
}
