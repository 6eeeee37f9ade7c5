//! The `claim` phase: one store transaction decides what a write gets — it is
//! sent (new, or a `not_attempted` one's next attempt), replayed, or refused —
//! and, on a `wait` route, a duplicate of a request still in flight waits for
//! its outcome instead of being refused.
//!
//! Invariants:
//! - nothing goes upstream unless this process durably holds the claim; a
//!   store that cannot commit means 503 `store-unavailable` and nothing sent;
//! - the in-flight map holds only attempts this process claimed and has not
//!   yet settled, so its presence proves `in_progress` and duplicates are
//!   answered from it without a store transaction; its absence proves
//!   nothing, and the store is asked. A waiter that wakes asks again, so
//!   when the first attempt ends `not_attempted`, the store's
//!   compare-and-set lets exactly one waiter take the next attempt;
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
use crate::pipeline::fingerprint::Fingerprint;
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

/// Attempts in flight in this process, by operation identity (route, scope,
/// key): duplicates are answered from here without a store transaction —
/// 409, 422, or a wait — which is what keeps a retry storm cheap. An
/// identity that is absent here is always looked up in the store.
#[derive(Default)]
pub struct InFlight {
    attempts: DashMap<String, Arc<Attempt>>,
}

struct Attempt {
    operation_id: String,
    fingerprint: Fingerprint,
    settled: watch::Sender<bool>,
    waiters: AtomicUsize,
}

impl Attempt {
    fn reference(&self) -> OperationRef {
        OperationRef {
            id: self.operation_id.clone(),
            state: State::InProgress,
        }
    }
}

/// Registered while an attempt is in flight; dropping it (after the outcome
/// is recorded, or if the task dies) wakes the waiters.
pub struct InFlightGuard {
    in_flight: Arc<InFlight>,
    identity: String,
    attempt: Arc<Attempt>,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        // Only our own entry: a waiter may already have claimed the next attempt.
        self.in_flight
            .attempts
            .remove_if(&self.identity, |_, a| Arc::ptr_eq(a, &self.attempt));
        self.attempt.settled.send_replace(true);
    }
}

enum Waited {
    /// Settled (or worth another look): ask again.
    LookAgain,
    TimedOut,
    TooManyWaiters,
}

/// The in-flight map's key for an operation's identity.
fn identity(new: &NewOperation) -> String {
    format!("{}\0{}\0{}", new.route, new.scope, new.key)
}

impl InFlight {
    /// Registers an attempt this process just claimed for `new`.
    pub fn begin(self: &Arc<Self>, claim: &Claim, new: &NewOperation) -> InFlightGuard {
        let attempt = Arc::new(Attempt {
            operation_id: claim.operation_id.clone(),
            fingerprint: new.fingerprint.clone(),
            settled: watch::channel(false).0,
            waiters: AtomicUsize::new(0),
        });
        let identity = identity(new);
        self.attempts.insert(identity.clone(), attempt.clone());
        InFlightGuard {
            in_flight: self.clone(),
            identity,
            attempt,
        }
    }

    /// The attempt in flight for `identity`, cloned out so that no map
    /// guard outlives this call.
    fn get(&self, identity: &str) -> Option<Arc<Attempt>> {
        self.attempts.get(identity).map(|a| a.clone())
    }

    /// Waits for `attempt` to settle, or, without one, a short while before
    /// the caller looks again.
    async fn wait(attempt: Option<Arc<Attempt>>, deadline: Instant) -> Waited {
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

/// Claims `new`, or answers it from the in-flight map or the store; on a
/// `wait` route a duplicate of an attempt in flight waits up to
/// `wait_timeout`.
pub async fn claim(
    store: &dyn Store,
    in_flight: &InFlight,
    route: &Route,
    new: &NewOperation,
) -> Result<Claimed, ProxyError> {
    let deadline = Instant::now() + route.wait_timeout;
    let identity = identity(new);
    let waits = route.in_progress == InProgressMode::Wait;
    loop {
        let in_progress = if let Some(attempt) = in_flight.get(&identity) {
            if attempt.fingerprint != new.fingerprint {
                return Err(ProxyError::KeyReused {
                    operation: attempt.reference(),
                });
            }
            if !waits {
                return Err(ProxyError::InProgress {
                    operation: attempt.reference(),
                });
            }
            attempt.reference()
        } else {
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
            if !(waits && same && operation.state == State::InProgress) {
                return replay::answer_existing(&operation, &new.fingerprint).map(Claimed::Answer);
            }
            OperationRef::from(operation.as_ref())
        };
        match InFlight::wait(in_flight.get(&identity), deadline).await {
            Waited::LookAgain => continue,
            Waited::TimedOut | Waited::TooManyWaiters => {
                return Err(ProxyError::InProgress {
                    operation: in_progress,
                });
            }
        }
    }
}
