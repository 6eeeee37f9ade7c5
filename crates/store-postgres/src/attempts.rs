//! This replica's attempts in flight, so that it can tell which of the
//! operations it owns `in_progress` no task of its own still works on:
//! after a failover without a synchronous standby, an attempt whose claim
//! reached the promoted server but whose record did not is such an
//! operation, under a lease that still runs (docs/replicas.md,
//! "Failover").
//!
//! Invariant: an attempt is covered from the moment its claim takes its
//! time until its outcome is recorded or its claim is known never to have
//! committed — by that time while the claim is out ([`Pending`]), by its
//! operation's id once claimed ([`Attempts::claimed`]) — and
//! [`Attempts::claimed_before`] is earlier than every covered time. A
//! claim takes its time under the same lock that reads that bound, so a
//! claim not covered when the bound is read is claimed at or after it
//! (less [`CLOCK_MARGIN_MILLIS`], for a clock that steps back): an operation of
//! this replica's, `in_progress`, claimed before the bound and not
//! covered by id is one nobody works on.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use idemgate_model::clock::Clock;

/// How far the wall clock may step back between two of its readings
/// without an attempt in flight being taken for one nobody works on.
const CLOCK_MARGIN_MILLIS: i64 = 1_000;

/// This replica's attempts between claim and record.
pub(crate) struct Attempts {
    clock: Arc<dyn Clock>,
    covered: Arc<Mutex<Covered>>,
}

#[derive(Default)]
struct Covered {
    next: u64,
    /// The claims out, by ticket: the time each claims at.
    pending: BTreeMap<u64, i64>,
    /// The operations claimed and not yet recorded, each with its attempts
    /// that are (one, unless a record is still being retried when the next
    /// attempt is claimed): by attempt, so that a late record of one never
    /// uncovers another.
    claimed: HashMap<String, BTreeSet<u32>>,
}

/// A claim out: covers its time until it is dropped or
/// [`Attempts::claimed`] takes it.
pub(crate) struct Pending {
    ticket: u64,
    /// The time the claim is made at (its row's `updated_at`).
    pub(crate) now: i64,
    covered: Arc<Mutex<Covered>>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        lock(&self.covered).pending.remove(&self.ticket);
    }
}

fn lock(covered: &Mutex<Covered>) -> MutexGuard<'_, Covered> {
    // A panic elsewhere under the lock leaves the maps consistent: each
    // change is one insert or remove.
    covered
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Attempts {
    pub(crate) fn new(clock: Arc<dyn Clock>) -> Self {
        Attempts {
            clock,
            covered: Arc::default(),
        }
    }

    /// A claim about to go out, at the clock's time now.
    pub(crate) fn claim(&self) -> Pending {
        let mut covered = lock(&self.covered);
        let now = self.clock.now_millis();
        covered.next += 1;
        let ticket = covered.next;
        covered.pending.insert(ticket, now);
        Pending {
            ticket,
            now,
            covered: self.covered.clone(),
        }
    }

    /// `pending` claimed `operation_id`'s `attempt`: covered by its id
    /// until [`Attempts::recorded`].
    pub(crate) fn claimed(&self, pending: Pending, operation_id: &str, attempt: u32) {
        let mut covered = lock(&self.covered);
        covered
            .claimed
            .entry(operation_id.to_string())
            .or_default()
            .insert(attempt);
        covered.pending.remove(&pending.ticket);
    }

    /// `operation_id`'s `attempt` was recorded (or found no longer its to
    /// record).
    pub(crate) fn recorded(&self, operation_id: &str, attempt: u32) {
        let mut covered = lock(&self.covered);
        if let Some(attempts) = covered.claimed.get_mut(operation_id) {
            attempts.remove(&attempt);
            if attempts.is_empty() {
                covered.claimed.remove(operation_id);
            }
        }
    }

    /// Whether an attempt of `operation_id`'s is claimed and not yet
    /// recorded.
    pub(crate) fn working_on(&self, operation_id: &str) -> bool {
        lock(&self.covered).claimed.contains_key(operation_id)
    }

    /// A time before every claim out and every claim still to come: an
    /// operation this replica claimed before it and is not
    /// [`Attempts::working_on`] is one nobody works on.
    pub(crate) fn claimed_before(&self) -> i64 {
        let covered = lock(&self.covered);
        let now = self.clock.now_millis();
        let oldest = covered.pending.values().copied().min().unwrap_or(now);
        oldest.min(now) - CLOCK_MARGIN_MILLIS
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idemgate_model::clock::ManualClock;
    use std::time::Duration;

    fn attempts() -> (Arc<ManualClock>, Attempts, i64) {
        let clock = ManualClock::new();
        let start = clock.now_millis();
        (clock.clone(), Attempts::new(clock), start)
    }

    #[test]
    fn a_claim_out_holds_the_bound_before_its_time() {
        let (clock, attempts, start) = attempts();
        let pending = attempts.claim();
        assert_eq!(pending.now, start);
        clock.advance(Duration::from_secs(60));
        assert_eq!(attempts.claimed_before(), start - CLOCK_MARGIN_MILLIS);
        drop(pending);
        let now = start + 60_000;
        assert_eq!(attempts.claimed_before(), now - CLOCK_MARGIN_MILLIS);
    }

    #[test]
    fn a_claimed_attempt_is_worked_on_until_its_own_record() {
        let (clock, attempts, start) = attempts();
        let first = attempts.claim();
        attempts.claimed(first, "op-1", 1);
        clock.advance(Duration::from_secs(5));
        // Claimed: the bound moves on, the id covers it.
        assert_eq!(
            attempts.claimed_before(),
            start + 5_000 - CLOCK_MARGIN_MILLIS
        );
        assert!(attempts.working_on("op-1"));
        // The next attempt claimed while the first's record is retried.
        let second = attempts.claim();
        attempts.claimed(second, "op-1", 2);
        attempts.recorded("op-1", 1);
        assert!(attempts.working_on("op-1"));
        // A stray record of the first (a task that died records it again)
        // never uncovers the second.
        attempts.recorded("op-1", 1);
        assert!(attempts.working_on("op-1"));
        attempts.recorded("op-1", 2);
        assert!(!attempts.working_on("op-1"));
    }
}
