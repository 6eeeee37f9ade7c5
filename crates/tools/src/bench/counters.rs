//! What a run has done so far: the senders (`load.rs`) bump these
//! counters, the progress line (`progress.rs`) reads them.
//!
//! Invariant: every request of the plan is taken once (`next`), and counted
//! in `done` once, whatever became of it.

use std::sync::atomic::AtomicU64;

/// Counters the workers share with the progress line.
#[derive(Debug, Default)]
pub struct Counters {
    /// The next request of the plan to take.
    pub(super) next: AtomicU64,
    /// Requests answered (or failed) so far.
    pub(crate) done: AtomicU64,
    /// Answers that were not a 2xx.
    pub(crate) not_ok: AtomicU64,
}
