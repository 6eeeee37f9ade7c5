//! The `claim` phase: one store transaction decides what a write gets — it is
//! sent (new, or a `not_attempted` one's next attempt), replayed, or refused —
//! and, on a `wait` route, a duplicate of a request still in flight waits for
//! its outcome instead of being refused.
//!
//! Invariants:
//! - nothing goes upstream unless this process durably holds the claim; a
//!   store that cannot commit means 503 `store-unavailable` and nothing sent;
//! - one request per identity (route, scope, key) at a time asks the store
//!   to claim it (single flight): duplicates that arrive meanwhile wait for
//!   that one answer instead of queueing their own transactions, which is
//!   what keeps a retry storm cheap. An entry in the in-flight map exists
//!   only while this process is claiming or holds an unsettled attempt, so
//!   its presence proves `in_progress` and duplicates are answered from it
//!   (409, 422, or a wait); its absence proves nothing, and the store is
//!   asked. A waiter whose attempt ended `not_attempted` gets that
//!   attempt's answer ([`Released`]) and sends nothing — the client's next
//!   retry is the next attempt; any other waiter looks again;
//! - a duplicate of an attempt claimed through another replica waits by
//!   reading the store, never by claiming ([`wait_elsewhere`]): when that
//!   attempt ends `not_attempted` it gets 503 `attempt-not-made` and sends
//!   nothing, as a waiter in this process would; the route's `max_waiters`
//!   bounds both kinds of waiter;
//! - every answer comes from the operation the store holds now for the
//!   identity ([`NewOperation::outdates`] decides what "now" excludes): the
//!   replay cache mirrors what the store said under the identity's guard,
//!   and a claim that starts an attempt forgets it first;
//! - a [`Hold`] (a paused route, a scope over its quota) asks the store what
//!   it holds without claiming: an existing operation answers for itself,
//!   and only a write that would be sent is refused (503 `route-paused`,
//!   429 `quota-exceeded`);
//! - no map guard is held across an `.await`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use http::Response;
use tokio::sync::watch;
use tokio::time::{Instant, timeout_at};

use crate::body::ProxyBody;
use crate::config::{InProgressMode, Route};
use crate::pipeline::Write;
use crate::pipeline::error::{OperationRef, ProxyError};
use crate::pipeline::fingerprint::ExactDigest;
use crate::pipeline::key::IdempotencyKey;
use crate::pipeline::quota::QuotaSpent;
use crate::pipeline::record::Released;
use crate::pipeline::replay::{self, ReplayCache};
use crate::traces::{self, Step};
use idemgate_model::operation::{Fingerprint, Operation, State};
use idemgate_store::{Claim, ClaimResult, NewOperation, RequestPath, StoreError};

/// How often a waiter looks again at an operation in progress that is not
/// in this process's map (another gateway's).
const POLL: Duration = Duration::from_millis(25);

/// The longest a duplicate waits for the store's answer to the request
/// claiming its identity; the store's own acquire timeout is 5 s.
const CLAIM_WAIT: Duration = Duration::from_secs(10);

/// Why no write may be sent now, though existing operations still answer
/// for themselves.
#[derive(Debug, Clone, Copy)]
pub enum Hold {
    /// The route is paused (by an operator, or its `unknown` latch).
    Paused,
    /// The scope has used its quota for this window.
    OverQuota(QuotaSpent),
}

impl Hold {
    /// The answer to a write this hold keeps from being sent.
    fn refusal(self, route: &Route, operation: Option<OperationRef>) -> ProxyError {
        match self {
            Hold::Paused => ProxyError::RoutePaused {
                route: route.name.clone(),
                reason: "paused until an operator resumes it".into(),
                operation,
            },
            Hold::OverQuota(spent) => ProxyError::QuotaExceeded {
                route: route.name.clone(),
                spent,
                operation,
            },
        }
    }
}

/// What the claim decided.
pub enum Claimed {
    /// This process owns the attempt: forward it, and drop the guard once
    /// its outcome is recorded.
    Send(Claim, InFlightGuard),
    /// The operation exists and answers for itself (a replay).
    Answer(Response<ProxyBody>),
    /// The same request's operation is `unknown`: held, unless a reconcile
    /// probe can settle it now.
    Held(Box<Operation>),
}

/// Identities this process is claiming or has attempts in flight for.
#[derive(Default)]
pub struct InFlight {
    entries: DashMap<String, Arc<Entry>>,
    /// Per identity, this process's duplicates waiting for an attempt
    /// claimed through another replica ([`wait_elsewhere`]).
    elsewhere: DashMap<String, usize>,
}

/// A place among an identity's duplicates waiting for another replica's
/// attempt; dropping it frees the place.
struct WaitingElsewhere<'a> {
    in_flight: &'a InFlight,
    identity: &'a str,
}

impl Drop for WaitingElsewhere<'_> {
    fn drop(&mut self) {
        self.in_flight
            .elsewhere
            .remove_if_mut(self.identity, |_, waiting| {
                *waiting -= 1;
                *waiting == 0
            });
    }
}

/// Where an identity's entry stands.
#[derive(Debug, Clone)]
enum Phase {
    /// One request is asking the store.
    Claiming,
    /// Claimed: the attempt for this operation is in flight.
    InFlight(String),
    /// Gone: settled, or the store answered with an existing operation.
    Done,
    /// The attempt of this operation (id) ended `not_attempted`: its
    /// waiters get its answer.
    Released(Arc<(String, Released)>),
}

impl Phase {
    fn is_over(&self) -> bool {
        matches!(self, Phase::Done | Phase::Released(_))
    }
}

struct Entry {
    fingerprint: Fingerprint,
    phase: watch::Sender<Phase>,
    waiters: AtomicUsize,
    /// Another request of the identity arrived while this one held it: its
    /// outcome is wanted again, so the attempt puts it in the replay cache.
    duplicated: AtomicBool,
}

/// Held by the request that entered an identity: while it claims, then by
/// the attempt's task until its outcome is recorded. Dropping it (also when
/// the client hangs up mid-claim, or the task dies) frees the identity and
/// wakes everyone waiting on it.
pub struct InFlightGuard {
    in_flight: Arc<InFlight>,
    identity: String,
    entry: Arc<Entry>,
}

impl InFlightGuard {
    /// Whether a duplicate of this request arrived while it held the
    /// identity (and may retry, or is waiting, for its outcome).
    pub fn duplicated(&self) -> bool {
        self.entry.duplicated.load(Ordering::SeqCst)
    }

    fn promote(&self, operation_id: &str) {
        self.entry
            .phase
            .send_replace(Phase::InFlight(operation_id.to_string()));
    }

    /// Frees the identity, handing the released attempt's answer to the
    /// duplicates waiting on it.
    pub fn release(self, operation_id: &str, answer: Released) {
        // Out of the map first: a request that comes after this is the
        // client's next retry, not a waiter, and claims the next attempt.
        self.in_flight
            .entries
            .remove_if(&self.identity, |_, e| Arc::ptr_eq(e, &self.entry));
        let released = Arc::new((operation_id.to_string(), answer));
        self.entry.phase.send_replace(Phase::Released(released));
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        // Only our own entry: a waiter may already have entered the next one.
        self.in_flight
            .entries
            .remove_if(&self.identity, |_, e| Arc::ptr_eq(e, &self.entry));
        self.entry.phase.send_if_modified(|phase| {
            let over = phase.is_over();
            if !over {
                *phase = Phase::Done;
            }
            !over
        });
    }
}

/// The key of an operation's identity in the in-flight map and the replay
/// cache.
pub fn identity(route: &str, scope: &str, key: &str) -> String {
    // Pushed, not `format!`ed: every write makes one (~1,200 instructions
    // through `core::fmt`).
    let mut identity = String::with_capacity(route.len() + scope.len() + key.len() + 2);
    for (i, part) in [route, scope, key].into_iter().enumerate() {
        if i > 0 {
            identity.push('\0');
        }
        identity.push_str(part);
    }
    identity
}

impl InFlight {
    /// A place to wait for another replica's attempt at `identity`,
    /// unless `max` duplicates of this process wait so already.
    fn wait_elsewhere<'a>(&'a self, identity: &'a str, max: usize) -> Option<WaitingElsewhere<'a>> {
        let mut waiting = self.elsewhere.entry(identity.to_string()).or_insert(0);
        // At `max` (at least 1) the entry is others': none is left at 0.
        if *waiting >= max {
            return None;
        }
        *waiting += 1;
        Some(WaitingElsewhere {
            in_flight: self,
            identity,
        })
    }

    /// Enters `new`'s identity to claim it, or returns the entry of the
    /// request already there (cloned out: no map guard outlives this call),
    /// marked as duplicated.
    fn enter(
        self: &Arc<Self>,
        identity: &str,
        new: &NewOperation,
    ) -> Result<InFlightGuard, Arc<Entry>> {
        let identity = identity.to_string();
        match self.entries.entry(identity.clone()) {
            dashmap::Entry::Occupied(found) => {
                let entry = found.get().clone();
                entry.duplicated.store(true, Ordering::SeqCst);
                Err(entry)
            }
            dashmap::Entry::Vacant(vacant) => {
                let entry = Arc::new(Entry {
                    fingerprint: new.fingerprint.clone(),
                    phase: watch::channel(Phase::Claiming).0,
                    waiters: AtomicUsize::new(0),
                    duplicated: AtomicBool::new(false),
                });
                vacant.insert(entry.clone());
                Ok(InFlightGuard {
                    in_flight: self.clone(),
                    identity,
                    entry,
                })
            }
        }
    }
}

/// Where a claim's answer comes from: the store, and this process's own
/// view of it.
pub(super) struct Sources<'a> {
    /// [`RequestPath::claim`], or under a [`Hold`] [`RequestPath::current`].
    pub(super) store: &'a dyn RequestPath,
    /// The identities this process is claiming or sending.
    pub(super) in_flight: &'a Arc<InFlight>,
    /// The replay cache: asked again by a request that waited, and told
    /// what the store said.
    pub(super) cache: &'a ReplayCache,
}

/// Claims `new`, the operation `write` would become (its caller found no
/// answer in the replay cache), or answers it from the in-flight map, the
/// store, or — after a wait — the replay cache (completed operations
/// updated after the write's `valid_after`); on a `wait` route a duplicate
/// of an attempt in flight waits up to `wait_timeout`. Under a [`Hold`]
/// nothing is claimed. A replay the store answers is cached under the
/// write's exact digest.
pub(super) async fn claim(
    sources: &Sources<'_>,
    route: &Route,
    write: &Write,
    new: &Arc<NewOperation>,
    hold: Option<Hold>,
) -> Result<Claimed, ProxyError> {
    let deadline = Instant::now() + route.wait_timeout;
    let waits = route.in_progress == InProgressMode::Wait;
    let (identity, cache) = (write.identity.as_str(), sources.cache);
    // The caller asked the cache just before; a request that waited asks
    // it again each time it wakes, since what it waited on may be replayed.
    let mut woke = false;
    loop {
        if woke && let Some(answer) = cache.answer(identity, &new.fingerprint, write.valid_after) {
            return answer.map(Claimed::Answer);
        }
        woke = true;
        let entry = match sources.in_flight.enter(identity, new) {
            Ok(guard) => {
                match claim_in_store(sources, route, new, write.exact, hold, guard).await? {
                    Stored::Decided(claimed) => return Ok(claimed),
                    Stored::Elsewhere(waited) => {
                        wait_elsewhere(sources, route, new, (identity, &waited), deadline).await?;
                        continue;
                    }
                }
            }
            Err(entry) => entry,
        };
        let mut phase = entry.phase.subscribe();
        let claimed = timeout_at(
            Instant::now() + CLAIM_WAIT,
            phase.wait_for(|p| !matches!(p, Phase::Claiming)),
        )
        .await
        .map(|seen| seen.map(|p| p.clone()));
        let operation_id = match claimed {
            Ok(Ok(Phase::InFlight(id))) => id,
            Ok(Ok(Phase::Released(released))) => {
                return answer_released(&entry, new, &released);
            }
            Ok(_) => continue,
            Err(_) => {
                return Err(ProxyError::StoreUnavailable {
                    source: StoreError::Busy("a claim took too long".into()),
                });
            }
        };
        let operation = OperationRef {
            id: operation_id,
            state: State::InProgress,
        };
        if entry.fingerprint != new.fingerprint {
            return Err(ProxyError::KeyReused { operation });
        }
        if !waits {
            return Err(ProxyError::InProgress { operation });
        }
        // The route's `max_waiters`: more are refused at once (409), so a
        // retry storm cannot pile up unbounded tasks behind one slow request.
        if entry.waiters.fetch_add(1, Ordering::SeqCst) >= route.max_waiters {
            entry.waiters.fetch_sub(1, Ordering::SeqCst);
            return Err(ProxyError::InProgress { operation });
        }
        let settled = timeout_at(deadline, phase.wait_for(Phase::is_over))
            .await
            .map(|seen| seen.map(|p| p.clone()));
        entry.waiters.fetch_sub(1, Ordering::SeqCst);
        match settled {
            Ok(Ok(Phase::Released(released))) => {
                return answer_released(&entry, new, &released);
            }
            Ok(_) => {}
            Err(_) => return Err(ProxyError::InProgress { operation }),
        }
    }
}

/// A duplicate of an attempt that ended `not_attempted` gets its answer;
/// another payload under the key is a reused key, as always.
fn answer_released(
    entry: &Entry,
    new: &NewOperation,
    (operation_id, answer): &(String, Released),
) -> Result<Claimed, ProxyError> {
    if entry.fingerprint != new.fingerprint {
        return Err(ProxyError::KeyReused {
            operation: OperationRef {
                id: operation_id.clone(),
                state: State::NotAttempted,
            },
        });
    }
    answer.answer(operation_id).map(Claimed::Answer)
}

/// Waits, as a duplicate, for the attempt `waited` is in — in progress
/// but not in this process's map: claimed through another replica — to
/// end, reading the store every [`POLL`] and never claiming, so that no
/// waiter sends the next attempt: if it ended `not_attempted` (or a later
/// attempt began, which only follows one that did), 503
/// `attempt-not-made`, nothing sent, since its own answer is in the other
/// replica's memory only. At most the route's `max_waiters` of this
/// process wait so per identity; more get 409 `request-in-progress` at
/// once, as all do at `deadline`. `Ok` when the attempt ended otherwise,
/// or the operation is no longer the identity's: the caller asks again,
/// and the store answers.
async fn wait_elsewhere(
    sources: &Sources<'_>,
    route: &Route,
    new: &NewOperation,
    (identity, waited): (&str, &Operation),
    deadline: Instant,
) -> Result<(), ProxyError> {
    let in_progress = || ProxyError::InProgress {
        operation: OperationRef::from(waited),
    };
    let Some(_waiting) = sources
        .in_flight
        .wait_elsewhere(identity, route.max_waiters)
    else {
        return Err(in_progress());
    };
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(in_progress());
        }
        tokio::time::sleep(POLL.min(deadline - now)).await;
        let current = sources
            .store
            .current(new)
            .await
            .map_err(ProxyError::store)?;
        let Some(operation) = current.filter(|operation| operation.id == waited.id) else {
            return Ok(());
        };
        let same_attempt = operation.attempt == waited.attempt;
        match operation.state {
            State::InProgress if same_attempt => {}
            State::NotAttempted if same_attempt => {
                return Err(not_made(&operation.id, Some(operation.evidence)));
            }
            // The store describes the later attempt now, not that one.
            _ if operation.attempt > waited.attempt => return Err(not_made(&operation.id, None)),
            _ => return Ok(()),
        }
    }
}

/// 503 `attempt-not-made` about operation `id`, in the state the attempt
/// waited for ended in (a later one may have begun since), with the
/// store's `evidence` for that attempt when it still describes it.
fn not_made(id: &str, evidence: Option<String>) -> ProxyError {
    ProxyError::AttemptNotMade {
        operation: OperationRef {
            id: id.to_string(),
            state: State::NotAttempted,
        },
        evidence,
    }
}

/// What the store said to the request that entered the identity.
enum Stored {
    Decided(Claimed),
    /// A wait-mode request should wait for this operation's attempt: in
    /// progress, but not in this process's map (another gateway's, or it
    /// settled a moment ago).
    Elsewhere(Box<Operation>),
}

async fn claim_in_store(
    sources: &Sources<'_>,
    route: &Route,
    new: &Arc<NewOperation>,
    exact: ExactDigest,
    hold: Option<Hold>,
    guard: InFlightGuard,
) -> Result<Stored, ProxyError> {
    let (store, cache) = (sources.store, sources.cache);
    let unavailable = ProxyError::store;
    let found = match hold {
        Some(hold) => match store.current(new).await.map_err(unavailable)? {
            Some(operation) if !new.would_send(&operation) => {
                ClaimResult::Existing(Box::new(operation))
            }
            operation => {
                return Err(hold.refusal(route, operation.as_ref().map(OperationRef::from)));
            }
        },
        None => traces::child(Step::StoreClaim, store.claim(new))
            .await
            .map_err(unavailable)?,
    };
    let operation = match found {
        ClaimResult::Claimed(claim) => {
            // A new attempt: whatever was cached is no longer current.
            cache.forget(&guard.identity);
            guard.promote(&claim.operation_id);
            return Ok(Stored::Decided(Claimed::Send(claim, guard)));
        }
        ClaimResult::Existing(operation) => operation,
        // Not this identity's: nothing is cached or mirrored for it.
        ClaimResult::HeldTwin(twin) => {
            return Err(ProxyError::PossibleDuplicate {
                operation: OperationRef::from(twin.as_ref()),
                first_keyless: IdempotencyKey::names_a_derived_key(&twin.key, route.profile),
            });
        }
    };
    let same = operation.fingerprint == new.fingerprint;
    // Still under the guard, so no claim of this identity can come between.
    // A byte-for-byte copy of this request is the same request: its next
    // retry is answered before its fingerprint is computed.
    cache.mirror(&guard.identity, &operation, same.then_some(exact));
    // Not ours to send: free the identity for the duplicates right away.
    drop(guard);
    if same && operation.state == State::Unknown {
        return Ok(Stored::Decided(Claimed::Held(operation)));
    }
    if route.in_progress == InProgressMode::Wait && same && operation.state == State::InProgress {
        return Ok(Stored::Elsewhere(operation));
    }
    replay::answer_existing(&operation, &new.fingerprint)
        .map(|response| Stored::Decided(Claimed::Answer(response)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, KeyMode};
    use crate::pipeline::quota::Used;
    use idemgate_model::operation::RequestSummary;

    fn new_op(fingerprint: &str) -> NewOperation {
        NewOperation {
            route: "api".into(),
            scope: "s".into(),
            key: "k".into(),
            fingerprint: Fingerprint::from_stored(fingerprint.into()),
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

    fn phase(entry: &Entry) -> Phase {
        entry.phase.borrow().clone()
    }

    #[test]
    fn one_request_enters_an_identity_and_the_others_see_its_entry() {
        let in_flight = Arc::new(InFlight::default());
        let new = new_op("fp");
        let guard = in_flight.enter("id", &new).ok().expect("the first enters");
        assert!(!guard.duplicated(), "alone so far");
        let seen = in_flight
            .enter("id", &new_op("other"))
            .err()
            .expect("taken");
        assert!(Arc::ptr_eq(&seen, &guard.entry));
        // Its outcome is wanted again: the attempt will cache it.
        assert!(guard.duplicated());
        // The entry carries the first request's fingerprint: a duplicate
        // with another payload is told the key was reused.
        assert_eq!(seen.fingerprint, new.fingerprint);
        assert!(matches!(phase(&seen), Phase::Claiming));
        guard.promote("op-1");
        assert!(matches!(phase(&seen), Phase::InFlight(id) if id == "op-1"));
        drop(guard);
        assert!(matches!(phase(&seen), Phase::Done));
        assert!(in_flight.entries.is_empty(), "dropping frees the identity");
        assert!(
            in_flight.enter("id", &new).is_ok(),
            "and the next may enter"
        );
    }

    #[test]
    fn max_waiters_bound_the_duplicates_waiting_for_another_replica() {
        let in_flight = InFlight::default();
        let first = in_flight.wait_elsewhere("id", 2).expect("a place");
        let second = in_flight.wait_elsewhere("id", 2).expect("a place");
        assert!(in_flight.wait_elsewhere("id", 2).is_none(), "past max");
        assert!(
            in_flight.wait_elsewhere("other", 2).is_some(),
            "per identity"
        );
        drop(first);
        let third = in_flight.wait_elsewhere("id", 2).expect("a freed place");
        drop((second, third));
        assert!(in_flight.elsewhere.is_empty(), "no count left behind");
    }

    #[test]
    fn an_identity_joins_route_scope_and_key_with_nul() {
        assert_eq!(identity("api", "ab12", "key-1"), "api\0ab12\0key-1");
        assert_eq!(identity("", "", ""), "\0\0");
    }

    #[test]
    fn a_released_attempt_hands_its_answer_to_the_waiters_and_frees_the_identity() {
        let in_flight = Arc::new(InFlight::default());
        let guard = in_flight.enter("id", &new_op("fp")).ok().unwrap();
        let entry = guard.entry.clone();
        guard.promote("op-1");
        let answer = Released::Unreachable {
            reason: "refused".into(),
        };
        guard.release("op-1", answer);
        assert!(in_flight.entries.is_empty());
        let Phase::Released(released) = phase(&entry) else {
            panic!("waiters see no answer");
        };
        assert_eq!(released.0, "op-1");
        // Same payload: the released attempt's answer, nothing sent.
        let same = answer_released(&entry, &new_op("fp"), &released);
        let problem = same.err().expect("an unreachable upstream").problem();
        assert_eq!(
            (problem.status, problem.state),
            (502, Some("not_attempted"))
        );
        // Another payload under the key: reused, as always.
        let other = answer_released(&entry, &new_op("other"), &released);
        assert_eq!(other.err().unwrap().problem().status, 422);
    }

    #[test]
    fn an_old_guard_never_frees_the_entry_of_the_next_request() {
        let in_flight = Arc::new(InFlight::default());
        let first = in_flight.enter("id", &new_op("fp")).ok().unwrap();
        let first_entry = first.entry.clone();
        // The first request's entry is gone (released), and the next
        // retry entered the identity anew...
        in_flight.entries.remove("id");
        let second = in_flight.enter("id", &new_op("fp")).ok().unwrap();
        // ...then the first guard goes: the second entry stays.
        drop(first);
        assert!(matches!(phase(&first_entry), Phase::Done));
        assert!(Arc::ptr_eq(
            &in_flight.entries.get("id").unwrap(),
            &second.entry
        ));
        assert!(matches!(phase(&second.entry), Phase::Claiming));
    }

    #[test]
    fn a_hold_refuses_with_the_route_and_the_operation_it_found() {
        let config = Config::single_route("http://127.0.0.1:9", KeyMode::Require).unwrap();
        let route = &config.routes[0];
        let found = OperationRef {
            id: "op-1".into(),
            state: State::NotAttempted,
        };
        let paused = Hold::Paused.refusal(route, Some(found.clone())).problem();
        assert_eq!(
            (paused.status, paused.operation_id.as_deref()),
            (503, Some("op-1"))
        );
        assert!(
            paused.detail.contains("`default` is paused"),
            "{}",
            paused.detail
        );
        let spent = QuotaSpent {
            used: Used::Operations(5),
            window: Duration::from_secs(60),
            retry_after: 30,
        };
        let over = Hold::OverQuota(spent).refusal(route, None).problem();
        assert_eq!((over.status, over.retry_after), (429, Some(30)));
        assert!(over.operation_id.is_none());
    }
}
