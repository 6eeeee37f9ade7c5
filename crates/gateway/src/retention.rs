//! Retention: a background sweep deletes `completed` and `not_attempted`
//! operations `retention` after their last update. `unknown` operations never
//! expire on their own: they wait for an operator.
//!
//! The sweep deletes in bounded batches ([`BATCH`], within the store's
//! [`SWEEP_LIMIT`]: one transaction, on SQLite one writer job, each) and
//! pauses between them, so the writer's other jobs run between two batches
//! and a sweep never stalls requests (ARCHITECTURE.md §4, "Access paths").
//!
//! It sweeps every [`interval`] of the retention unless its caller names
//! another period (tests do, instead of waiting for the wall clock); each
//! sweep that ends without a store error is counted
//! (`idemgate_background_passes_total{task="retention"}`), so a test can
//! tell that one ran before asserting that something was kept.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::background;
use crate::metrics::{Metrics, Task};
use idemgate_model::clock::{self, Clock};
use idemgate_store::Maintenance;
use idemgate_store::SWEEP_LIMIT;

/// Operations deleted per transaction.
pub(crate) const BATCH: u32 = 500;
const _: () = assert!(BATCH <= SWEEP_LIMIT);
/// The pause between two batches of one sweep, for requests to get the writer.
const BETWEEN_BATCHES: Duration = Duration::from_millis(20);

/// How often to sweep: a hundredth of the retention, between 1 s and 60 s.
pub fn interval(retention: Duration) -> Duration {
    (retention / 100).clamp(Duration::from_secs(1), Duration::from_secs(60))
}

/// Sweeps every `every` until `stop`, deleting what `clock` says is
/// `retention` old.
pub async fn run(
    store: Arc<dyn Maintenance>,
    clock: Arc<dyn Clock>,
    retention: Duration,
    every: Duration,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    while background::tick(every, &stop).await {
        let cutoff = clock.now_millis() - clock::millis(retention);
        let mut deleted = 0;
        loop {
            match store.sweep(cutoff, BATCH).await {
                Ok(count) => {
                    deleted += count;
                    if count < u64::from(BATCH) {
                        metrics.background_pass(Task::retention);
                        break;
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "retention sweep failed; trying again later");
                    break;
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(BETWEEN_BATCHES) => {}
            }
        }
        if deleted > 0 {
            tracing::info!(deleted, "expired operations deleted");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_follows_retention_within_bounds() {
        assert_eq!(
            interval(Duration::from_secs(24 * 3600)),
            Duration::from_secs(60)
        );
        assert_eq!(interval(Duration::from_secs(300)), Duration::from_secs(3));
        assert_eq!(interval(Duration::from_secs(10)), Duration::from_secs(1));
    }
}
