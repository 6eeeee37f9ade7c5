//! The claims this replica sent whose answers were lost, while it looks for
//! them ([`crate::release_unanswered`]): a retry that finds one of them
//! committed, `in_progress` under this replica with no attempt working on
//! it, knows it was never sent — it wakes the look, which releases it, and
//! hears 503 rather than 409 `request-in-progress` (no attempt is in
//! flight).
//!
//! Invariant: a claim is listed, by its identity and the time it wrote,
//! exactly while a look for it runs ([`Look`] unlists it when dropped).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use idemgate_store::NewOperation;
use tokio::sync::Notify;

/// A claim's identity — route, scope, key — and the time it wrote
/// (its row's `updated_at`).
type Claimed = (String, String, String, i64);

/// The looks running, each with what wakes it.
#[derive(Default)]
pub(crate) struct Unanswered {
    looking: Arc<Mutex<HashMap<Claimed, Arc<Notify>>>>,
}

/// One look for a claim: listed until dropped.
pub(crate) struct Look {
    claimed: Claimed,
    wake: Arc<Notify>,
    looking: Arc<Mutex<HashMap<Claimed, Arc<Notify>>>>,
}

fn lock<T>(map: &Mutex<T>) -> MutexGuard<'_, T> {
    // Each change under the lock is one insert or remove.
    map.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn claimed(new: &NewOperation, at: i64) -> Claimed {
    (new.route.clone(), new.scope.clone(), new.key.clone(), at)
}

impl Unanswered {
    /// Lists `new`'s claim, written at `at`, while the returned look runs.
    pub(crate) fn look(&self, new: &NewOperation, at: i64) -> Look {
        let claimed = claimed(new, at);
        let wake = Arc::new(Notify::new());
        // Two claims of one identity at one millisecond are one row: the
        // later look takes the entry, and either finding it releases it.
        lock(&self.looking).insert(claimed.clone(), wake.clone());
        Look {
            claimed,
            wake,
            looking: self.looking.clone(),
        }
    }

    /// Whether a look runs for `new`'s claim written at `at`; if so, it is
    /// woken to look now.
    pub(crate) fn wake(&self, new: &NewOperation, at: i64) -> bool {
        let looking = lock(&self.looking);
        if looking.is_empty() {
            return false;
        }
        looking
            .get(&claimed(new, at))
            .map(|wake| wake.notify_one())
            .is_some()
    }
}

impl Look {
    /// Sleeps `delay`, or less if a retry found the claim.
    pub(crate) async fn wait(&self, delay: Duration) {
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = self.wake.notified() => {}
        }
    }
}

impl Drop for Look {
    fn drop(&mut self) {
        let mut looking = lock(&self.looking);
        if looking
            .get(&self.claimed)
            .is_some_and(|wake| Arc::ptr_eq(wake, &self.wake))
        {
            looking.remove(&self.claimed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idemgate_model::operation::{Fingerprint, RequestSummary};

    fn new(key: &str) -> NewOperation {
        NewOperation {
            route: "orders".into(),
            scope: "0".repeat(64),
            key: key.into(),
            fingerprint: Fingerprint::from_stored("f".into()),
            request: RequestSummary {
                method: "POST".into(),
                path: "/orders".into(),
                content_type: None,
                body_size: 0,
                body_sha256: String::new(),
                body: None,
            },
            fresh_after: None,
            refuse_held_twin: false,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_that_finds_the_claim_wakes_its_look() {
        let unanswered = Unanswered::default();
        let look = unanswered.look(&new("k"), 7);
        assert!(!unanswered.wake(&new("k"), 8), "another claim's time");
        assert!(!unanswered.wake(&new("j"), 7), "another key");
        let start = tokio::time::Instant::now();
        assert!(unanswered.wake(&new("k"), 7));
        look.wait(Duration::from_secs(60)).await;
        assert_eq!(start.elapsed(), Duration::ZERO, "woken, not slept");
        drop(look);
        assert!(
            !unanswered.wake(&new("k"), 7),
            "unlisted once the look ends"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_earlier_look_ending_leaves_a_later_one_listed() {
        let unanswered = Unanswered::default();
        let first = unanswered.look(&new("k"), 7);
        let second = unanswered.look(&new("k"), 7);
        drop(first);
        assert!(unanswered.wake(&new("k"), 7));
        drop(second);
        assert!(!unanswered.wake(&new("k"), 7));
    }
}
