//! The `claim` phase: one store transaction decides what a write gets — it is
//! sent (new, or a `not_attempted` one's next attempt), replayed, or refused —
//! and, on a `wait` route, a duplicate of a request still in flight waits for
//! its outcome instead of being refused.
//!
//! Invariants:
//! - nothing goes upstream unless this process durably holds the claim; a
//!   store that cannot commit means 503 `store-unavailable` and nothing sent;
//! - the in-flight map only coordinates waiting: a waiter that wakes asks the
//!   store again, so the store stays the only truth. When the first attempt
//!   ends `not_attempted`, the store's compare-and-set lets exactly one waiter
//!   take the next attempt; the others wait for that one;
//! - no map guard is held across an `.await`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use http::Response;
use tokio::sync::watch;
use tokio::time::{Instant, timeout_at};

use crate::body::ProxyBody;
use crate::config::{InProgressMode, Route};
use crate::pipeline::replay;
use crate::problem::{OperationRef, ProxyError};
use crate::store::{Claim, ClaimResult, NewOperation, Operation, State, Store};

/// Waiters per operation beyond this are refused at once (409), so a retry
/// storm cannot pile up unbounded tasks behind one slow request.
pub const MAX_WAITERS: usize = 256;

/// How often a waiter looks again at an operation whose attempt it cannot
/// subscribe to (claimed an instant ago, not yet registered).
const POLL: Duration = Duration::from_millis(25);

/// What the claim decided.
pub enum Claimed {
    /// This process owns the attempt: forward it.
    Send(Claim),
    /// The operation exists and answers for itself (a replay).
    Answer(Response<ProxyBody>),
    /// The same request's operation is `unknown`: held, unless a reconcile
    /// probe can settle it now.
    Held(Box<Operation>),
}

/// Attempts in flight in this process, for duplicates to wait on.
#[derive(Default)]
pub struct InFlight {
    attempts: DashMap<String, Arc<Attempt>>,
}

struct Attempt {
    settled: watch::Sender<bool>,
    waiters: AtomicUsize,
}

/// Registered while an attempt is in flight; dropping it (after the outcome
/// is recorded, or if the task dies) wakes the waiters.
pub struct InFlightGuard {
    in_flight: Arc<InFlight>,
    operation_id: String,
    attempt: Arc<Attempt>,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        // Only our own entry: a waiter may already have claimed the next attempt.
        self.in_flight
            .attempts
            .remove_if(&self.operation_id, |_, a| Arc::ptr_eq(a, &self.attempt));
        self.attempt.settled.send_replace(true);
    }
}

enum Waited {
    /// Settled (or worth another look): ask the store again.
    LookAgain,
    TimedOut,
    TooManyWaiters,
}

impl InFlight {
    /// Registers an attempt this process just claimed.
    pub fn begin(self: &Arc<Self>, claim: &Claim) -> InFlightGuard {
        let attempt = Arc::new(Attempt {
            settled: watch::channel(false).0,
            waiters: AtomicUsize::new(0),
        });
        self.attempts
            .insert(claim.operation_id.clone(), attempt.clone());
        InFlightGuard {
            in_flight: self.clone(),
            operation_id: claim.operation_id.clone(),
            attempt,
        }
    }

    async fn wait(&self, operation_id: &str, deadline: Instant) -> Waited {
        // Clone the entry out so the map guard is released before awaiting.
        let attempt = self.attempts.get(operation_id).map(|a| a.clone());
        let Some(attempt) = attempt else {
            let next = (Instant::now() + POLL).min(deadline);
            tokio::time::sleep_until(next).await;
            return if next >= deadline {
                Waited::TimedOut
            } else {
                Waited::LookAgain
            };
        };
        if attempt.waiters.fetch_add(1, Ordering::SeqCst) >= MAX_WAITERS {
            attempt.waiters.fetch_sub(1, Ordering::SeqCst);
            return Waited::TooManyWaiters;
        }
        let mut settled = attempt.settled.subscribe();
        let outcome = timeout_at(deadline, settled.wait_for(|done| *done)).await;
        attempt.waiters.fetch_sub(1, Ordering::SeqCst);
        match outcome {
            Ok(_) => Waited::LookAgain,
            Err(_) => Waited::TimedOut,
        }
    }
}

/// Claims `new`, or answers it from the store; on a `wait` route a
/// duplicate of an attempt in flight waits up to `wait_timeout`.
pub async fn claim(
    store: &dyn Store,
    in_flight: &InFlight,
    route: &Route,
    new: &NewOperation,
) -> Result<Claimed, ProxyError> {
    let deadline = Instant::now() + route.wait_timeout;
    loop {
        let found = store
            .claim(new)
            .await
            .map_err(|source| ProxyError::StoreUnavailable { source })?;
        let operation = match found {
            ClaimResult::Claimed(claim) => return Ok(Claimed::Send(claim)),
            ClaimResult::Existing(operation) => operation,
        };
        let same = operation.fingerprint == new.fingerprint;
        if same && operation.state == State::Unknown {
            return Ok(Claimed::Held(operation));
        }
        let waits = route.in_progress == InProgressMode::Wait
            && operation.state == State::InProgress
            && same;
        if !waits {
            return replay::answer_existing(&operation, &new.fingerprint).map(Claimed::Answer);
        }
        match in_flight.wait(&operation.id, deadline).await {
            Waited::LookAgain => continue,
            Waited::TimedOut | Waited::TooManyWaiters => {
                return Err(ProxyError::InProgress {
                    operation: OperationRef::from(operation.as_ref()),
                });
            }
        }
    }
}
