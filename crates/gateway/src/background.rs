//! The one shape of the background loops (the retention sweep, the
//! replicas' watch, the alert deliverer's poll): a pass every period until
//! stopped, the period named by the caller (`server::Pace`: tests shorten
//! it). It names none of them: they import it (tests/it/layout.rs).
//!
//! A loop is `while background::tick(period, &stop).await { pass }`: the
//! first pass runs one period after the start, each next one a period
//! after the last ended. `stop` ends the wait between passes at once but
//! never cuts a pass short: a pass that must end sooner (between two
//! batches, say) watches `stop` itself, so no store statement is dropped
//! halfway unless its loop says so.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Waits `period`: `true` when it is time for the next pass, `false` as
/// soon as `stop` is cancelled (before or during the wait).
pub async fn tick(period: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        // Checked first: a loop stopped during its pass ends at once.
        biased;
        _ = stop.cancelled() => false,
        _ = tokio::time::sleep(period) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_pass_runs_every_period_and_none_after_stop() {
        let stop = CancellationToken::new();
        let started = tokio::time::Instant::now();
        let mut passes = Vec::new();
        // Bounded: a tick that missed the stop would run on.
        while passes.len() < 10 && tick(Duration::from_secs(10), &stop).await {
            passes.push(started.elapsed().as_secs());
            if passes.len() == 3 {
                stop.cancel();
            }
        }
        assert_eq!(passes, [10, 20, 30], "one a period, none after stop");
    }

    #[tokio::test(start_paused = true)]
    async fn stop_ends_the_wait_at_once() {
        let stop = CancellationToken::new();
        let started = tokio::time::Instant::now();
        let waiting = tick(Duration::from_secs(3600), &stop);
        let stopping = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            stop.cancel();
        };
        let (next, ()) = tokio::join!(waiting, stopping);
        assert!(!next, "no pass after stop");
        assert_eq!(started.elapsed(), Duration::from_secs(1));
    }
}
