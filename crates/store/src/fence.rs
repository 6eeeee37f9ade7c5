//! The send fence: whether this process may still write the attempts it
//! claimed to their upstreams (ARCHITECTURE.md §4, "Fencing").
//!
//! A claim makes this process the owner of an attempt, but ownership can
//! end while the attempt is still on its way: on a shared store a peer
//! marks the attempts of a replica whose lease ran out `unknown`
//! (`replica-lost`), an operator may resolve them, and a retry through the
//! peer may send the next attempt. If the old owner then sent its own,
//! the upstream would see the write twice. So the owner checks the fence
//! right before a request is written (before every connect try, and again
//! once a new connection is up, just before hyper writes to it), and a
//! fence that does not hold sends nothing.
//!
//! Invariant: [`Fence::holds`] is true only while the store's own record
//! of this process's ownership provably runs, judged on this process's
//! monotonic clock and never on a clock another machine keeps:
//! - a shared store (PostgreSQL): until four fifths of the lease after the
//!   *start* of the last renewal the database confirmed. The database
//!   counts the lease from a moment after that start, so peers cannot see
//!   it expire before a fifth of the lease past the fence's deadline: that
//!   fifth is the margin a process paused between the check and the write
//!   may overrun before it could write after a peer took over;
//! - any store: until [`Fence::close`], which the store calls before it
//!   marks this process's attempts `gateway-stopped` at shutdown.
//!
//! SQLite needs no lease: the store's file lock is held for the life of
//! the process, so no other process can take over an attempt while its
//! owner lives; only the close applies there.
//!
//! Holding *now* is not enough: a lease that lapsed and was renewed while
//! an attempt slept between two connect tries would hold again, though a
//! peer may have marked the attempt lost meanwhile. So an attempt checks a
//! [`Permit`] taken before its claim: it holds only while the fence holds
//! and has not lapsed since. A lapse is noticed when the next renewal is
//! confirmed after the fence's deadline, and counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Shared by a store and everything that sends for its claims; cheap to
/// clone.
#[derive(Clone)]
pub struct Fence(Arc<Inner>);

struct Inner {
    /// `None`: no lease (a store this process alone holds).
    lease: Option<Lease>,
    /// Set when the store starts closing.
    closed: AtomicBool,
}

/// The lease as this process sees it, on its monotonic clock.
struct Lease {
    length: Duration,
    base: Instant,
    /// The fence holds until `base` + this many ms; 0 until the first
    /// confirmed renewal.
    holds_until: AtomicU64,
    /// Renewals confirmed after the fence had stopped holding.
    lapses: AtomicU64,
}

/// The fence as it was when a claim was made: see the module doc.
#[derive(Clone, Debug)]
pub struct Permit {
    fence: Fence,
    lapses: u64,
}

impl Permit {
    /// Whether the fence holds and has not lapsed since this was taken.
    pub fn holds(&self) -> bool {
        self.fence.holds() && self.fence.lapses() == self.lapses
    }
}

impl Fence {
    /// A fence for a store no other process can take attempts from.
    pub fn unshared() -> Self {
        Fence(Arc::new(Inner {
            lease: None,
            closed: AtomicBool::new(false),
        }))
    }

    /// A fence for a lease of `length`, held from its first
    /// [`Fence::renewed`] on.
    pub fn leased(length: Duration) -> Self {
        Fence(Arc::new(Inner {
            lease: Some(Lease {
                length,
                base: Instant::now(),
                holds_until: AtomicU64::new(0),
                lapses: AtomicU64::new(0),
            }),
            closed: AtomicBool::new(false),
        }))
    }

    /// A renewal sent at `sent` was confirmed: the database's lease ends no
    /// earlier than `sent + length`, the fence at four fifths of that.
    /// Renewals are confirmed one at a time (one task renews), so the check
    /// for a lapse and the extension do not race.
    pub fn renewed(&self, sent: Instant) {
        if let Some(lease) = &self.0.lease {
            if lease.ms(Instant::now()) >= lease.holds_until.load(Ordering::SeqCst) {
                lease.lapses.fetch_add(1, Ordering::SeqCst);
            }
            let until = sent + lease.length * 4 / 5;
            lease
                .holds_until
                .fetch_max(lease.ms(until), Ordering::SeqCst);
        }
    }

    /// The fence now, for a claim about to be made.
    pub fn permit(&self) -> Permit {
        Permit {
            fence: self.clone(),
            lapses: self.lapses(),
        }
    }

    fn lapses(&self) -> u64 {
        self.0
            .lease
            .as_ref()
            .map_or(0, |lease| lease.lapses.load(Ordering::SeqCst))
    }

    /// Whether this process may write a claimed attempt now; also whether
    /// it may claim.
    pub fn holds(&self) -> bool {
        if self.0.closed.load(Ordering::SeqCst) {
            return false;
        }
        match &self.0.lease {
            None => true,
            Some(lease) => lease.ms(Instant::now()) < lease.holds_until.load(Ordering::SeqCst),
        }
    }

    /// From now on the fence never holds: the store is closing.
    pub fn close(&self) {
        self.0.closed.store(true, Ordering::SeqCst);
    }
}

impl Lease {
    fn ms(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_millis()).unwrap_or(u64::MAX)
    }
}

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fence")
            .field("leased", &self.0.lease.is_some())
            .field("holds", &self.holds())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unshared_fence_holds_until_its_store_closes() {
        let fence = Fence::unshared();
        assert!(fence.holds());
        let clone = fence.clone();
        fence.close();
        assert!(!clone.holds());
    }

    #[test]
    fn a_lease_holds_only_after_a_confirmed_renewal_and_for_four_fifths_of_it() {
        let fence = Fence::leased(Duration::from_secs(10));
        assert!(!fence.holds(), "no renewal confirmed yet");
        fence.renewed(Instant::now());
        assert!(fence.holds());
        // A renewal sent long ago proves nothing now, and never shortens a
        // later one.
        let fence = Fence::leased(Duration::from_millis(1000));
        let long_ago = Instant::now()
            .checked_sub(Duration::from_millis(900))
            .expect("the machine has been up for a second");
        fence.renewed(long_ago);
        assert!(!fence.holds(), "past four fifths of the lease");
        fence.renewed(Instant::now());
        assert!(fence.holds());
        fence.renewed(long_ago);
        assert!(
            fence.holds(),
            "an older renewal does not move the deadline back"
        );
        fence.close();
        assert!(!fence.holds());
    }

    #[test]
    fn a_permit_does_not_survive_a_lapse_that_a_renewal_ended() {
        let fence = Fence::leased(Duration::from_millis(1000));
        fence.renewed(Instant::now());
        let permit = fence.permit();
        assert!(permit.holds());
        // Renewed while it still held: the permit goes on.
        fence.renewed(Instant::now());
        assert!(permit.holds());
        // A renewal confirmed only after the deadline passed: the fence
        // holds again, a permit taken before the lapse does not.
        let lapsed = Fence::leased(Duration::from_millis(1000));
        let before = lapsed.permit();
        let long_ago = Instant::now()
            .checked_sub(Duration::from_millis(900))
            .expect("the machine has been up for a second");
        lapsed.renewed(long_ago);
        let stale = lapsed.permit();
        lapsed.renewed(Instant::now());
        assert!(lapsed.holds());
        assert!(!before.holds() && !stale.holds());
        assert!(lapsed.permit().holds());
        // A store that holds its file lock never lapses, until it closes.
        let unshared = Fence::unshared();
        let permit = unshared.permit();
        assert!(permit.holds());
        unshared.close();
        assert!(!permit.holds());
    }
}
