//! The one backoff: how long to wait before retry `n` of something that
//! failed. The wait's ceiling doubles from `base` with each retry up to
//! `cap`; with full jitter the wait is a uniform draw from `[0, ceiling]`,
//! so many callers that failed together do not retry together.
//!
//! Its callers, each with its own numbers on a named constant:
//! connect retries (`pipeline/forward.rs`, full jitter), alert deliveries
//! (`alerts/deliverer.rs`, full jitter), re-sends of a held operation under
//! its destination key (`pipeline/attempt.rs`, full jitter), outcomes the
//! store refused to record (`pipeline/record.rs`, none: one operation's own
//! retries, never in step with another's), the spacing of one held
//! operation's probes (`pipeline/reconcile/mod.rs`, none: read back from
//! its timeline, so it must be the same number every time) and looks for
//! claims whose answer was lost (`crates/store-postgres/src/lib.rs`, full
//! jitter: a failed batch's calls look together otherwise).
//!
//! Invariant, for every `n`: `0 <= delay(n) <= ceiling(n) <= cap`, the
//! ceiling never shrinks as `n` grows, and nothing overflows.

use std::time::Duration;

/// A retry delay: a ceiling doubling from `base` up to `cap`, jittered or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    jitter: Jitter,
}

/// Whether the wait is the ceiling itself or drawn below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Jitter {
    /// The wait is the ceiling.
    None,
    /// A uniform draw from `[0, ceiling]` ("full jitter").
    Full,
}

impl Backoff {
    /// Full jitter below a ceiling doubling from `base` up to `cap`.
    pub const fn full_jitter(base: Duration, cap: Duration) -> Backoff {
        Backoff {
            base,
            cap,
            jitter: Jitter::Full,
        }
    }

    /// The ceiling itself: `base`, doubling up to `cap`.
    pub const fn doubling(base: Duration, cap: Duration) -> Backoff {
        Backoff {
            base,
            cap,
            jitter: Jitter::None,
        }
    }

    /// The longest wait before retry `n` (0-based): `min(cap, base * 2^n)`.
    pub fn ceiling(&self, n: u32) -> Duration {
        // 2^31 times any base past a second is past any cap worth having;
        // saturating, so no `n` overflows.
        self.base
            .saturating_mul(2u32.saturating_pow(n.min(31)))
            .min(self.cap)
    }

    /// The wait before retry `n` (0-based).
    pub fn delay(&self, n: u32) -> Duration {
        self.delay_at(n, fastrand::f64())
    }

    /// The wait before retry `n` for a draw `unit` in `[0, 1]`.
    fn delay_at(&self, n: u32, unit: f64) -> Duration {
        let ceiling = self.ceiling(n);
        match self.jitter {
            Jitter::None => ceiling,
            // In f64 a ceiling may round up past itself (and `Duration::MAX`
            // past what a Duration holds): the draw is kept under it.
            Jitter::Full => {
                Duration::try_from_secs_f64(ceiling.as_secs_f64() * unit.clamp(0.0, 1.0))
                    .map_or(ceiling, |wait| wait.min(ceiling))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bases and caps from a millisecond to past any real one, the
    /// callers' own among them, cap below base included.
    fn backoffs() -> Vec<Backoff> {
        let durations = [
            Duration::ZERO,
            Duration::from_millis(1),
            Duration::from_millis(100),
            Duration::from_millis(200),
            Duration::from_secs(1),
            Duration::from_secs(2),
            Duration::from_secs(5),
            Duration::from_secs(600),
            Duration::MAX,
        ];
        let mut all = Vec::new();
        for base in durations {
            for cap in durations {
                all.push(Backoff::full_jitter(base, cap));
                all.push(Backoff::doubling(base, cap));
            }
        }
        all
    }

    /// Every retry number up to 70 (past any doubling's saturation), and
    /// the largest ones.
    fn retries() -> impl Iterator<Item = u32> + Clone {
        (0..=70).chain([u32::MAX / 2, u32::MAX - 1, u32::MAX])
    }

    /// Each backoff with each retry number, and its ceiling there.
    fn cases() -> impl Iterator<Item = (Backoff, u32, Duration)> {
        let all = backoffs().into_iter();
        all.flat_map(|b| retries().map(move |n| (b, n, b.ceiling(n))))
    }

    #[test]
    fn every_wait_lies_between_zero_and_the_ceiling_and_the_ceiling_under_the_cap() {
        let mut rng = fastrand::Rng::with_seed(19);
        for (backoff, n, ceiling) in cases() {
            assert!(ceiling <= backoff.cap, "{backoff:?} n={n}");
            let units = [0.0, 1.0, 0.5, f64::EPSILON, 1.0 - f64::EPSILON];
            let draws = units.into_iter().chain((0..16).map(|_| rng.f64()));
            for unit in draws {
                let wait = backoff.delay_at(n, unit);
                assert!(wait <= ceiling, "{backoff:?} n={n} unit={unit}");
            }
            assert!(backoff.delay(n) <= ceiling, "{backoff:?} n={n}");
        }
    }

    #[test]
    fn the_ceiling_starts_at_the_base_never_shrinks_and_reaches_the_cap() {
        for backoff in backoffs() {
            assert_eq!(backoff.ceiling(0), backoff.base.min(backoff.cap));
            let mut last = Duration::ZERO;
            for n in retries() {
                let ceiling = backoff.ceiling(n);
                assert!(ceiling >= last, "{backoff:?} shrank at n={n}");
                last = ceiling;
            }
            // A cap past 2^31 bases (`Duration::MAX`) is never reached.
            if !backoff.base.is_zero() && backoff.cap < Duration::MAX {
                assert_eq!(last, backoff.cap, "{backoff:?} never reaches its cap");
            }
        }
    }

    #[test]
    fn without_jitter_the_wait_is_the_ceiling_and_with_it_spreads_below() {
        let mut rng = fastrand::Rng::with_seed(19);
        for (backoff, n, ceiling) in cases() {
            let waits: Vec<Duration> = (0..64).map(|_| backoff.delay_at(n, rng.f64())).collect();
            let (below, above) = (
                waits.iter().any(|w| *w < ceiling / 2),
                waits.iter().any(|w| *w > ceiling / 2),
            );
            match backoff.jitter {
                Jitter::None => assert!(waits.iter().all(|w| *w == ceiling)),
                // Below the middle and above it, for any ceiling worth
                // drawing under (a nanosecond's has no middle).
                Jitter::Full if ceiling > Duration::from_micros(1) => {
                    assert!(below && above, "{backoff:?} n={n}: {waits:?}");
                }
                Jitter::Full => {}
            }
        }
    }
}
