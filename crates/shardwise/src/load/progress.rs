//! The progress bar of `shardwise load`: one phase reading the file, one sending it.
//!
//! It is drawn on standard error, and only when that is a terminal and `--no-progress` was not
//! given, so pipes and logs never see it; otherwise the bar is hidden and only notes print. The
//! bar counts bytes (of the file while reading, of the record batches while sending); its message
//! counts rows and their rate.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Layout of the bar: phase, bar, bytes done and total, byte rate, then the row message.
const TEMPLATE: &str =
    "{prefix:>7} [{bar:30}] {binary_bytes}/{binary_total_bytes} ({binary_bytes_per_sec}, eta {eta}) {msg}";

/// Redraws per second at most (indicatif's own limit is 20).
const REFRESH_PER_SECOND: u8 = 10;

/// A phase shows a row rate only once it has run this long: the first batches' rate, over a few
/// milliseconds, is noise (it was shown in the millions of rows per second).
const MIN_RATE_ELAPSED_MS: u64 = 500;

/// A progress bar shared by the reader thread and the sending stream (cheap to clone).
#[derive(Clone)]
pub struct Progress {
    bar: ProgressBar,
    rows: Arc<AtomicU64>,
    phase_started: Arc<Mutex<Instant>>,
}

impl Progress {
    /// A bar on standard error when `wanted` and standard error is a terminal; else a hidden one.
    pub fn new(wanted: bool) -> Progress {
        let bar = if wanted && std::io::stderr().is_terminal() {
            let target = ProgressDrawTarget::stderr_with_hz(REFRESH_PER_SECOND);
            let style = ProgressStyle::with_template(TEMPLATE)
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> ");
            ProgressBar::with_draw_target(Some(0), target).with_style(style)
        } else {
            ProgressBar::hidden()
        };
        Progress { bar, rows: Arc::new(AtomicU64::new(0)), phase_started: Arc::new(Mutex::new(Instant::now())) }
    }

    /// A bar that never draws.
    #[cfg(test)]
    pub fn hidden() -> Progress {
        Progress::new(false)
    }

    /// Starts a phase (`reading`, `sending`) of `total_bytes`, from zero bytes and rows.
    pub fn start_phase(&self, name: &'static str, total_bytes: u64) {
        self.bar.reset();
        self.bar.set_prefix(name);
        self.bar.set_length(total_bytes);
        self.rows.store(0, Ordering::Relaxed);
        if let Ok(mut started) = self.phase_started.lock() {
            *started = Instant::now();
        }
        self.bar.set_message("0 rows");
    }

    /// Records `bytes` more bytes and `rows` more rows done in the current phase.
    pub fn advance(&self, bytes: u64, rows: u64) {
        if self.bar.is_hidden() {
            return;
        }
        self.bar.inc(bytes);
        if rows > 0 {
            let total = self.rows.fetch_add(rows, Ordering::Relaxed) + rows;
            let elapsed = self.phase_started.lock().map(|s| s.elapsed()).unwrap_or(Duration::ZERO);
            self.bar.set_message(rows_message(total, elapsed));
        }
    }

    /// Prints a line above the bar (or plainly, when there is no bar).
    pub fn note(&self, line: &str) {
        self.bar.suspend(|| eprintln!("{line}"));
    }

    /// Removes the bar, so the summary line stands alone.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// The bar's message: rows so far, and their rate once the phase has run long enough to have one.
fn rows_message(rows: u64, elapsed: Duration) -> String {
    if elapsed < Duration::from_millis(MIN_RATE_ELAPSED_MS) {
        return format!("{rows} rows");
    }
    format!("{rows} rows ({} rows/s)", per_second(rows, elapsed))
}

/// `count` per second over `elapsed`, rounded; `count` itself for a phase too short to measure.
pub fn per_second(count: u64, elapsed: Duration) -> u64 {
    let seconds = elapsed.as_secs_f64();
    if seconds < 1e-6 {
        return count;
    }
    (count as f64 / seconds).round() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_rate_until_the_phase_has_run_a_while() {
        assert_eq!(rows_message(5000, Duration::from_millis(3)), "5000 rows");
        assert_eq!(rows_message(5000, Duration::from_secs(2)), "5000 rows (2500 rows/s)");
    }
}
