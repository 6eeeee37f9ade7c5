//! The held writes this process sent whose exchange may still land at the
//! destination, by the monotonic clock ([`Clock::monotonic_millis`]). The
//! late window is also judged on the wall clock, from the stored times,
//! which is all another replica or a later start has; but a clock stepped
//! forward within it (NTP, a resumed VM) would have an absence believed
//! while the write may still arrive, and the write sent again.
//!
//! Invariant: an operation is listed from its loss (or a re-send of it)
//! until `late_window` (and, for a re-send, its longest write) has passed
//! on the monotonic clock, and every judgement of absence this process
//! makes — a probe's, an operator's `not_attempted` — asks it beside the
//! wall-clock bound.

use std::time::Duration;

use dashmap::DashMap;
use idemgate_model::clock::{self, Clock};

/// Entries past which expired ones are dropped on the next listing.
const TIDY_PAST: usize = 1024;

/// Operation ids, and until when (monotonic ms) their exchange may land.
#[derive(Default)]
pub(crate) struct Landing {
    until: DashMap<String, i64>,
}

impl Landing {
    /// `id`'s exchange may land for `window` from now (or longer, if
    /// listed so already).
    pub(crate) fn may_land_for(&self, id: &str, window: Duration, clock: &dyn Clock) {
        let now = clock.monotonic_millis();
        if self.until.len() > TIDY_PAST {
            self.until.retain(|_, until| *until > now);
        }
        let until = now.saturating_add(clock::millis(window));
        self.until
            .entry(id.to_string())
            .and_modify(|listed| *listed = (*listed).max(until))
            .or_insert(until);
    }

    /// How much longer `id`'s exchange may land; `None` when it may no
    /// longer, or this process sent none.
    pub(crate) fn left(&self, id: &str, clock: &dyn Clock) -> Option<Duration> {
        let until = *self.until.get(id)?;
        let left = until.saturating_sub(clock.monotonic_millis());
        if left <= 0 {
            self.until.remove_if(id, |_, listed| *listed == until);
            return None;
        }
        Some(Duration::from_millis(u64::try_from(left).unwrap_or(0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idemgate_model::clock::ManualClock;

    #[test]
    fn an_exchange_may_land_for_its_window_whatever_the_wall_clock_says() {
        let (landing, clock) = (Landing::default(), ManualClock::new());
        let clock = clock.as_ref();
        assert_eq!(landing.left("op", clock), None, "never sent here");
        landing.may_land_for("op", Duration::from_secs(60), clock);
        clock.step(Duration::from_secs(3600));
        assert_eq!(landing.left("op", clock), Some(Duration::from_secs(60)));
        clock.advance(Duration::from_secs(50));
        assert_eq!(landing.left("op", clock), Some(Duration::from_secs(10)));
        // A re-send's window runs from its own sending.
        landing.may_land_for("op", Duration::from_secs(30), clock);
        landing.may_land_for("op", Duration::from_secs(5), clock);
        assert_eq!(landing.left("op", clock), Some(Duration::from_secs(30)));
        clock.advance(Duration::from_secs(30));
        assert_eq!(landing.left("op", clock), None);
        assert!(landing.until.is_empty(), "dropped once past");
    }
}
