//! Progress lines on stderr while a benchmark runs: one when each step starts, and a status
//! line at most every few seconds from inside long steps, so a run of several minutes is never
//! silent. Stdout keeps only the report.

use std::io::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often a long step may print a status line.
const STATUS_EVERY: Duration = Duration::from_secs(5);

#[derive(Debug)]
struct Inner {
    started: Instant,
    last_line: Mutex<Instant>,
    quiet: bool,
}

/// Where a benchmark reports progress. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Progress(Arc<Inner>);

impl Progress {
    /// Progress on stderr.
    pub fn stderr() -> Self {
        Self::new(false)
    }

    /// No progress at all (tests).
    pub fn quiet() -> Self {
        Self::new(true)
    }

    fn new(quiet: bool) -> Self {
        let now = Instant::now();
        Self(Arc::new(Inner {
            started: now,
            last_line: Mutex::new(now),
            quiet,
        }))
    }

    fn print(&self, bench: &str, line: &str) {
        if self.0.quiet {
            return;
        }
        if let Ok(mut last) = self.0.last_line.lock() {
            *last = Instant::now();
        }
        let at = self.0.started.elapsed().as_secs_f64();
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "[{at:>7.1} s] {bench}: {line}");
    }

    /// A step starts.
    pub fn step(&self, bench: &str, what: impl AsRef<str>) {
        self.print(bench, what.as_ref());
    }

    /// A status line from inside a long step, printed only when nothing was printed for a few
    /// seconds; `status` is only called then.
    pub fn tick(&self, bench: &str, status: impl FnOnce() -> String) {
        if self.0.quiet {
            return;
        }
        let due = self
            .0
            .last_line
            .lock()
            .map(|last| last.elapsed() >= STATUS_EVERY)
            .unwrap_or(false);
        if due {
            self.print(bench, &status());
        }
    }
}
