//! The live progress line on stderr: rewritten in place (`\r`) five times a
//! second on a terminal, a plain line every two seconds otherwise (logs,
//! CI), nothing with `--json`.
//!
//! Invariant: it only reads the workers' counters, and it stops when the
//! load does ([`Shown::finish`], or when dropped), so it never outlives the run.

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::counters::Counters;
use super::plan::Plan;

/// Where progress goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    Off,
    /// A terminal: one line rewritten in place.
    Live,
    /// Not a terminal: one line per tick.
    Lines,
}

impl Progress {
    /// `Off` for `--json`, else as stderr is.
    pub(crate) fn for_stderr(json: bool) -> Progress {
        match (json, std::io::stderr().is_terminal()) {
            (true, _) => Progress::Off,
            (false, true) => Progress::Live,
            (false, false) => Progress::Lines,
        }
    }

    fn tick(self) -> Duration {
        match self {
            Progress::Live => Duration::from_millis(200),
            _ => Duration::from_secs(2),
        }
    }

    /// Starts showing `counters` until [`Shown::finish`].
    pub fn start(self, counters: Arc<Counters>, plan: Arc<Plan>, started: Instant) -> Shown {
        let stop = CancellationToken::new();
        let showing = (self != Progress::Off).then(|| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut ticks = tokio::time::interval(self.tick());
                ticks.tick().await;
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = ticks.tick() => self.show(&line(&counters, &plan, started)),
                    }
                }
                if self == Progress::Live {
                    // Leave the terminal's line empty for the report.
                    self.show("");
                }
            })
        });
        Shown { stop, showing }
    }

    fn show(self, line: &str) {
        let mut err = std::io::stderr().lock();
        let _ = match self {
            Progress::Live => write!(err, "\r{line:<79}\r{line}"),
            _ => writeln!(err, "{line}"),
        };
        let _ = err.flush();
    }
}

/// A progress display that is running.
pub struct Shown {
    stop: CancellationToken,
    showing: Option<JoinHandle<()>>,
}

impl Shown {
    /// Stops the display and waits until its last line is out.
    pub async fn finish(mut self) {
        self.stop.cancel();
        if let Some(showing) = self.showing.take() {
            let _ = showing.await;
        }
    }
}

impl Drop for Shown {
    /// A run that fails before [`Shown::finish`] stops the display too.
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// `  3.2 s  12000/30000 requests  3750/s  12 not 2xx`, or
/// `  3.2/10 s  12000 requests  …` for a run of a given duration.
fn line(counters: &Counters, plan: &Plan, started: Instant) -> String {
    let seconds = started.elapsed().as_secs_f64();
    let done = counters.done.load(Ordering::Relaxed);
    let not_ok = counters.not_ok.load(Ordering::Relaxed);
    let rate = done as f64 / seconds.max(0.001);
    let (time, count) = match plan.duration {
        Some(d) => (
            format!("{seconds:.1}/{:.0} s", d.as_secs_f64()),
            done.to_string(),
        ),
        None => (
            format!("{seconds:.1} s"),
            format!("{done}/{}", plan.requests),
        ),
    };
    format!("{time:>8}  {count} requests  {rate:.0}/s  {not_ok} not 2xx")
}
