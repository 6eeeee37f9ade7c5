//! The time the store keeps: every timestamp idemgate writes and every
//! window it measures (retention, `derive_window`) reads one [`Clock`], so
//! tests can move time instead of waiting for it; beside it, a monotonic
//! reading for how long something has lasted in this process, which no
//! step of the wall clock moves (a test can step one without the other).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, and a monotonic reading beside it.
pub trait Clock: Send + Sync {
    fn now_millis(&self) -> i64;

    /// Milliseconds on a clock no step moves (NTP, a resumed VM, an
    /// operator): for how long something lasts in this process, never a
    /// time to store. Its zero is arbitrary.
    fn monotonic_millis(&self) -> i64;
}

/// The system's wall clock, and its monotonic one.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_millis(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }

    fn monotonic_millis(&self) -> i64 {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        let since = START.get_or_init(Instant::now).elapsed();
        i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
    }
}

/// A clock that starts at the system time and moves only when told to.
#[derive(Debug)]
pub struct ManualClock {
    wall: AtomicI64,
    monotonic: AtomicI64,
}

impl ManualClock {
    pub fn new() -> Arc<Self> {
        Arc::new(ManualClock {
            wall: AtomicI64::new(SystemClock.now_millis()),
            monotonic: AtomicI64::new(0),
        })
    }

    /// Time passes: both readings move on.
    pub fn advance(&self, by: Duration) {
        let millis = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.wall.fetch_add(millis, Ordering::SeqCst);
        self.monotonic.fetch_add(millis, Ordering::SeqCst);
    }

    /// The wall clock is stepped forward, as NTP or a resumed VM steps it:
    /// no time passes.
    pub fn step(&self, by: Duration) {
        let millis = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.wall.fetch_add(millis, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_millis(&self) -> i64 {
        self.wall.load(Ordering::SeqCst)
    }

    fn monotonic_millis(&self) -> i64 {
        self.monotonic.load(Ordering::SeqCst)
    }
}

/// The last millisecond RFC 3339 can write (9999-12-31T23:59:59.999Z).
const LAST_RFC3339_MILLIS: u64 = 253_402_300_800_000 - 1;

/// A store timestamp as RFC 3339 UTC with milliseconds. The gateway never
/// stores one outside 1970–9999, but a store edited by hand or damaged may
/// hold any number: one before 1970 is written as 1970's first moment, one
/// past 9999 as its last, so that reading it never fails.
pub fn rfc3339(millis: i64) -> String {
    let millis = u64::try_from(millis).unwrap_or(0).min(LAST_RFC3339_MILLIS);
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(millis)).to_string()
}

/// A duration in the store's unit.
pub fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_796_000_000_123), "2026-11-30T00:53:20.123Z");
    }

    #[test]
    fn a_timestamp_outside_rfc3339s_years_is_written_at_its_nearest_end() {
        assert_eq!(rfc3339(-1), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(253_402_300_799_999), "9999-12-31T23:59:59.999Z");
        assert_eq!(rfc3339(253_402_300_800_000), "9999-12-31T23:59:59.999Z");
        assert_eq!(rfc3339(i64::MAX), "9999-12-31T23:59:59.999Z");
    }

    #[test]
    fn manual_clocks_move_when_told() {
        let clock = ManualClock::new();
        let before = clock.now_millis();
        clock.advance(Duration::from_secs(2));
        assert_eq!(clock.now_millis() - before, 2000);
    }
}
