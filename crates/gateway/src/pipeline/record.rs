//! The `record` phase: turning how an exchange ended into a settlement, and
//! committing it before the client sees the response.
//!
//! Invariants:
//! - the outcome is durable before the client learns it, so a client that
//!   retries after seeing a response always gets the same one replayed;
//! - a client hears only what the store holds: when recording loses its
//!   compare-and-set (a peer marked the attempt `replica-lost`, an
//!   operator resolved it), [`after_stale`] reads the operation and either
//!   settles it `completed` by the late-response rule or answers what a
//!   retry would get — never the response the store refused;
//! - an attempt is never left `in_progress` by a live process: if the store
//!   refuses the record, the client gets 503 and recording is retried in the
//!   background until it lands (or, at shutdown, left for the next start to
//!   mark `unknown`) — a record that lands stale then goes through
//!   [`after_stale`] as one refused at once; if the task itself dies,
//!   [`SettleGuard`] records `unknown`.

use std::sync::Arc;
use std::time::Duration;

use idemgate_model::clock;
use idemgate_model::operation::{Event, Fingerprint, Operation, Settlement, State, StoredResponse};
use idemgate_store::{Operators, RequestPath};

use http::Response;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::body::{Prefixed, ProxyBody, full, stream};
use crate::metrics::Outcome;
use crate::pipeline::error::{OperationRef, ProxyError};
use crate::pipeline::forward::{self, Exchange, LostCause};
use crate::pipeline::replay;
use crate::problem::UnknownSince;
use idemgate_model::backoff::Backoff;
use idemgate_store::{Claim, Decision, LEASE_LOST, LateEvidence, LateSource, Recorded, Resolved};

/// Between attempts to record an outcome the store refused: 200 ms
/// doubling up to 5 s, unjittered (one operation's own retries).
const RECORD_BACKOFF: Backoff =
    Backoff::doubling(Duration::from_millis(200), Duration::from_secs(5));

/// What the client gets once the settlement is recorded.
pub type Reply = Result<Response<ProxyBody>, ProxyError>;

/// How an exchange ended, ready to record: the settlement, its events, the
/// reply for the client, and for an attempt that ended `not_attempted`, the
/// answer its waiting duplicates get.
pub struct Settled {
    pub(crate) settlement: Settlement,
    pub(crate) events: Vec<Event>,
    pub(crate) reply: Reply,
    pub(crate) released: Option<Released>,
}

/// What the duplicates that waited on an attempt get when it ended
/// `not_attempted`: the same answer as the request that sent it, so an
/// upstream that asked clients to back off sees one attempt per retry, not
/// one per waiter.
#[derive(Debug, Clone)]
pub enum Released {
    /// A release status (429, 503): the upstream's own response.
    Refused(StoredResponse),
    /// No byte reached the upstream.
    Unreachable { reason: String },
    /// No connection to the upstream came free in time: nothing was sent.
    Busy,
}

impl Released {
    /// The answer for one waiter of `operation_id`'s attempt.
    pub fn answer(&self, operation_id: &str) -> Reply {
        match self {
            Released::Refused(response) => {
                let mut response = replay::rebuild(response);
                response.extensions_mut().insert(Outcome::released);
                Ok(response)
            }
            Released::Unreachable { reason } => Err(ProxyError::UpstreamUnreachable {
                operation: Some(OperationRef {
                    id: operation_id.to_string(),
                    state: State::NotAttempted,
                }),
                reason: reason.clone(),
            }),
            Released::Busy => Err(forward::overloaded(Some(OperationRef {
                id: operation_id.to_string(),
                state: State::NotAttempted,
            }))),
        }
    }
}

/// The settlement, its events, and the reply for an exchange that took
/// `tries` connection attempts to send `bytes` of body, `took` from when
/// it was handed over to its outcome: the `sent` event carries it
/// (`took_ms`), so the timeline shows when the write left, not when its
/// outcome was recorded (a timeout's is `upstream_timeout` later).
pub fn settle(
    claim: &Claim,
    exchange: Exchange,
    (tries, bytes): (u32, usize),
    took: std::time::Duration,
) -> Settled {
    let written = exchange.written();
    let released = match &exchange {
        Exchange::NotSent { reason, .. } => Some(Released::Unreachable {
            reason: reason.clone(),
        }),
        Exchange::Busy { .. } => Some(Released::Busy),
        Exchange::Released { head, body } => Some(Released::Refused(stored_response(
            head,
            Some(body.to_vec()),
        ))),
        _ => None,
    };
    let (settlement, mut events, reply) = classify(claim, exchange);
    if written {
        let took_ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
        let detail = json!({ "tries": tries, "bytes": bytes, "took_ms": took_ms });
        events.insert(
            0,
            Event {
                kind: "sent",
                detail,
            },
        );
    }
    let outcome = match settlement {
        Settlement::Completed { .. } => Outcome::forwarded,
        Settlement::NotAttempted { .. } => Outcome::released,
        Settlement::Unknown { .. } => Outcome::unknown,
    };
    let reply = reply.map(|mut response| {
        response.extensions_mut().insert(outcome);
        response
    });
    Settled {
        settlement,
        events,
        reply,
        released,
    }
}

fn classify(claim: &Claim, exchange: Exchange) -> (Settlement, Vec<Event>, Reply) {
    let operation = |state| OperationRef {
        id: claim.operation_id.clone(),
        state,
    };
    match exchange {
        Exchange::Fenced { attempts } => (
            Settlement::NotAttempted {
                evidence: LEASE_LOST.into(),
            },
            vec![Event {
                kind: LEASE_LOST,
                detail: json!({ "tries": attempts }),
            }],
            Err(ProxyError::LeaseLost {
                operation: operation(State::NotAttempted),
            }),
        ),
        Exchange::NotSent { attempts, reason } => (
            Settlement::NotAttempted {
                evidence: "connect-failed".into(),
            },
            vec![Event {
                kind: "connect-failed",
                detail: json!({ "tries": attempts, "error": reason }),
            }],
            Err(ProxyError::UpstreamUnreachable {
                operation: Some(operation(State::NotAttempted)),
                reason,
            }),
        ),
        Exchange::Busy { attempts, reason } => (
            Settlement::NotAttempted {
                evidence: "upstream-busy".into(),
            },
            vec![Event {
                kind: "upstream-busy",
                detail: json!({ "tries": attempts, "error": reason }),
            }],
            Err(forward::overloaded(Some(operation(State::NotAttempted)))),
        ),
        Exchange::Lost { cause, reason } => {
            let since = match cause {
                LostCause::Timeout => UnknownSince::Timeout,
                LostCause::Broken | LostCause::Failed => UnknownSince::Broken,
            };
            let detail = match cause {
                LostCause::Failed => format!(
                    "the request was sent and the upstream answered a failure that does not say whether it ran ({reason}); it may have happened, so retries are held until it is reconciled"
                ),
                _ => format!(
                    "the request was sent but no complete response came back ({reason}); it may have happened, so retries are held until it is reconciled"
                ),
            };
            (
                Settlement::Unknown {
                    evidence: cause.evidence().into(),
                },
                vec![Event {
                    kind: cause.evidence(),
                    detail: json!({ "error": reason }),
                }],
                Err(ProxyError::OutcomeUnknown {
                    operation: operation(State::Unknown),
                    since,
                    detail,
                }),
            )
        }
        Exchange::Classified { head, body } => {
            let status = head.status.as_u16();
            (
                Settlement::Unknown {
                    evidence: format!("upstream-{status}"),
                },
                vec![response_event(status)],
                Ok(Response::from_parts(head, stream(body))),
            )
        }
        Exchange::Released { head, body } => {
            let status = head.status.as_u16();
            (
                Settlement::NotAttempted {
                    evidence: format!("released-{status}"),
                },
                vec![response_event(status)],
                Ok(Response::from_parts(head, full(body))),
            )
        }
        Exchange::Complete { head, body } => {
            let stored = stored_response(&head, Some(body.to_vec()));
            let events = vec![Event {
                kind: "response",
                detail: json!({ "status": stored.status, "bytes": body.len() }),
            }];
            (
                Settlement::Completed { response: stored },
                events,
                Ok(Response::from_parts(head, full(body))),
            )
        }
        Exchange::Oversized { head, prefix, rest } => {
            let stored = stored_response(&head, None);
            let events = vec![Event {
                kind: "response",
                detail: json!({ "status": stored.status, "body_stored": false }),
            }];
            let body = stream(Prefixed::new(prefix, rest));
            (
                Settlement::Completed { response: stored },
                events,
                Ok(Response::from_parts(head, body)),
            )
        }
    }
}

fn response_event(status: u16) -> Event {
    Event {
        kind: "response",
        detail: json!({ "status": status }),
    }
}

/// A response as stored, from its head and, when it was small enough to
/// keep, its body: end-to-end headers (the caller stripped the hop-by-hop
/// ones, and `Trailer`: no trailer field is kept), lower-case names, order
/// and duplicates kept. A kept body's
/// `Content-Length` is not stored: the body's own length says it, and a
/// replay has hyper write it anew ([`crate::pipeline::replay::rebuild`]).
/// Without a body it is kept, as what the operator learns of its size.
pub fn stored_response(head: &http::response::Parts, body: Option<Vec<u8>>) -> StoredResponse {
    let headers = head
        .headers
        .iter()
        .filter(|(name, _)| body.is_none() || *name != http::header::CONTENT_LENGTH)
        .map(|(name, value)| (name.as_str().to_string(), value.as_bytes().to_vec()))
        .collect();
    StoredResponse {
        status: head.status.as_u16(),
        headers,
        body,
    }
}

/// What the client gets when the outcome was sent but could not be recorded
/// (recording goes on in the background: [`keep_recording`]).
pub fn unrecorded(claim: &Claim) -> ProxyError {
    ProxyError::StoreUnavailableAfterSend {
        operation: OperationRef {
            id: claim.operation_id.clone(),
            state: State::InProgress,
        },
    }
}

/// What the client of an attempt whose record lost its compare-and-set
/// hears ([`after_stale`]).
pub enum AfterStale {
    /// A peer had marked the attempt `unknown` and its response arrived
    /// within the route's `late_window`: the operation is now `completed`
    /// with that response (evidence `late-response`), which the client
    /// gets as a first answer.
    SettledLate,
    /// The store holds something else: `reply` is what a retry would get
    /// from it; `held` says the store still holds this very attempt
    /// `unknown`, so a probe or a late response may still settle it.
    Stored { reply: Reply, held: bool },
}

/// The one rule for an attempt whose [`RequestPath::record`] came back
/// [`Recorded::Stale`], whether at once or after retries
/// ([`keep_recording`]), for an outcome that came back at `arrived` (ms,
/// the store's clock): the client hears what the store holds. A completed
/// response that arrived within `late_window` of a peer's `unknown` mark
/// of this attempt (or before it) settles it by the late-response rule;
/// otherwise the outcome the store refused is kept in the timeline, as
/// evidence for the operator, and the client gets the store's answer.
pub async fn after_stale(
    (store, operators): (&dyn RequestPath, &dyn Operators),
    claim: &Claim,
    settlement: &Settlement,
    fingerprint: &Fingerprint,
    late_window: Duration,
    arrived: i64,
) -> AfterStale {
    let held_here = |op: &Operation| op.state == State::Unknown && op.attempt == claim.attempt;
    let mut current = match read_operation(operators, claim).await {
        Ok(operation) => operation,
        Err(reply) => return AfterStale::Stored { reply, held: false },
    };
    match settlement {
        Settlement::Completed { response }
            if held_here(&current)
                && arrived.saturating_sub(current.updated_at) <= clock::millis(late_window) =>
        {
            let late = LateEvidence {
                operation_id: claim.operation_id.clone(),
                source: LateSource::LateResponse {
                    attempt: claim.attempt,
                },
                response: response.clone(),
                event: Event {
                    kind: "late-response",
                    detail: json!({
                        "status": response.status,
                        "attempt": claim.attempt,
                        "held_as": current.evidence,
                    }),
                },
            };
            let settled = store.settle_held(&late).await;
            match settled {
                Ok(true) => return AfterStale::SettledLate,
                // Settled otherwise meanwhile (a probe, an operator), or
                // found more than once at the destination: an operator's.
                Ok(false) => match read_operation(operators, claim).await {
                    Ok(operation) => current = operation,
                    Err(reply) => return AfterStale::Stored { reply, held: false },
                },
                Err(error) => {
                    tracing::warn!(operation_id = %claim.operation_id, %error, "cannot settle a late response");
                    return AfterStale::Stored {
                        reply: Err(unrecorded(claim)),
                        held: false,
                    };
                }
            }
        }
        _ => {
            let event = Event {
                kind: "outcome-not-recorded",
                detail: json!({
                    "attempt": claim.attempt,
                    "state": settlement.state().as_str(),
                    "evidence": settlement.evidence(),
                    "status": settlement.response().map(|r| r.status),
                    "store_held": current.state.as_str(),
                }),
            };
            if let Err(error) = store.add_event(&claim.operation_id, &event).await {
                tracing::warn!(operation_id = %claim.operation_id, %error, "cannot record an event");
            }
        }
    }
    AfterStale::Stored {
        reply: replay::answer_existing(&current, fingerprint),
        held: held_here(&current),
    }
}

/// The operation `claim` is an attempt of, as the store holds it now; a
/// store that does not answer gets the client the answer for an outcome
/// not recorded yet.
async fn read_operation(store: &dyn Operators, claim: &Claim) -> Result<Operation, Reply> {
    match store.get(&claim.operation_id).await {
        Ok(Some((operation, _))) => Ok(operation),
        Ok(None) => {
            // Not swept (an operation in flight never is): the store was
            // dropped or restored from an older copy under the gateway.
            tracing::error!(operation_id = %claim.operation_id, attempt = claim.attempt, "the store no longer holds this operation, whose attempt was made: its outcome cannot be recorded, and a retry of its key would be a new write (was the store replaced under the gateway?)");
            Err(Err(unrecorded(claim)))
        }
        Err(error) => {
            tracing::warn!(operation_id = %claim.operation_id, %error, "cannot read an operation whose record was refused");
            Err(Err(unrecorded(claim)))
        }
    }
}

/// Retries recording a settlement the store refused, with backoff, until it
/// lands or `give_up` (the end of the shutdown grace): never leaves an
/// operation `in_progress` while this process lives.
pub async fn keep_recording(
    store: &dyn RequestPath,
    claim: &Claim,
    settlement: &Settlement,
    events: &[Event],
    give_up: &CancellationToken,
) -> Option<Recorded> {
    let mut retry = 0;
    loop {
        tokio::select! {
            _ = give_up.cancelled() => {
                tracing::error!(operation_id = %claim.operation_id, "outcome not recorded before shutdown; it becomes unknown at the next start");
                return None;
            }
            _ = tokio::time::sleep(RECORD_BACKOFF.delay(retry)) => {}
        }
        match store.record(claim, settlement, events).await {
            Ok(recorded) => return Some(recorded),
            Err(error) => {
                tracing::warn!(operation_id = %claim.operation_id, %error, "still cannot record the outcome")
            }
        }
        retry = retry.saturating_add(1);
    }
}

/// Settles a fenced attempt (nothing written) whose record lost its
/// compare-and-set: a peer held it `unknown` first, its owner's lease
/// having lapsed, while this replica, the owner, knows it sent nothing.
/// Taken only while the operation is still held at this attempt (not
/// since decided, nor retried).
pub async fn settle_fenced(operators: &dyn Operators, claim: &Claim, events: &[Event]) {
    let Some(event) = events.iter().find(|e| e.kind == LEASE_LOST) else {
        return;
    };
    let id = &claim.operation_id;
    match operators
        .resolve(id, Some(claim.attempt), &Decision::Fenced, event)
        .await
    {
        Ok(Resolved::Done) => {
            tracing::info!(operation_id = %id, "an attempt this replica never sent, held by a peer when its lease lapsed, is settled not_attempted");
        }
        Ok(_) => {}
        Err(error) => {
            tracing::warn!(operation_id = %id, %error, "cannot settle an attempt never sent; it stays held");
        }
    }
}

/// Marks a claimed attempt `unknown` if the task forwarding it ends without
/// recording an outcome (a panic): it may have been sent. Recorded as any
/// refused record is, until it lands: an operation is never left
/// `in_progress` by a live process.
pub struct SettleGuard {
    armed: Option<(Arc<dyn RequestPath>, Claim)>,
}

impl SettleGuard {
    pub fn new(store: Arc<dyn RequestPath>, claim: Claim) -> Self {
        SettleGuard {
            armed: Some((store, claim)),
        }
    }

    pub fn disarm(mut self) {
        self.armed = None;
    }
}

impl Drop for SettleGuard {
    fn drop(&mut self) {
        let Some((store, claim)) = self.armed.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let settlement = Settlement::Unknown { evidence: "forward-task-died".into() };
            let events = [Event { kind: "forward-task-died", detail: json!({}) }];
            if let Err(error) = store.record(&claim, &settlement, &events).await {
                tracing::error!(operation_id = %claim.operation_id, %error, "cannot yet mark an abandoned attempt unknown; trying again");
                // The process's end (the store's close) marks it otherwise.
                let never = CancellationToken::new();
                keep_recording(store.as_ref(), &claim, &settlement, &events, &never).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http::StatusCode;
    use idemgate_store::seal::Identity;

    fn claim() -> Claim {
        Claim {
            operation_id: "op-1".into(),
            attempt: 2,
            identity: Identity::of("api", "scope", "k", "fp"),
            route: "api".into(),
            key: "k".into(),
            row: None,
        }
    }

    /// The settlement's state and evidence, the events' kinds, and the
    /// reply's status with its outcome (or the problem's).
    fn summary(settled: &Settled) -> (State, String, Vec<&'static str>, u16, Option<Outcome>) {
        let (status, outcome) = match &settled.reply {
            Ok(response) => (
                response.status().as_u16(),
                response.extensions().get::<Outcome>().copied(),
            ),
            Err(error) => (error.problem().status, Some(error.outcome())),
        };
        (
            settled.settlement.state(),
            settled.settlement.evidence().to_string(),
            settled.events.iter().map(|e| e.kind).collect(),
            status,
            outcome,
        )
    }

    fn parts(status: u16) -> http::response::Parts {
        let mut parts = head(&[("content-type", "application/json")]);
        parts.status = StatusCode::from_u16(status).unwrap();
        parts
    }

    /// Each way an exchange ends: its settlement, its events, and what the
    /// client hears; a "sent" event exactly when a byte may have left.
    #[test]
    fn each_exchange_settles_as_its_rule_says() {
        use Outcome::{forwarded, rejected, released, unknown};
        use State::{Completed, NotAttempted, Unknown};
        let lost = |cause| Exchange::Lost {
            cause,
            reason: "gone".into(),
        };
        let not_sent = Exchange::NotSent {
            attempts: 3,
            reason: "refused".into(),
        };
        let refused = Exchange::Released {
            head: parts(503),
            body: Bytes::from_static(b"busy"),
        };
        let complete = Exchange::Complete {
            head: parts(201),
            body: Bytes::from_static(b"{\"id\":1}"),
        };
        let cases = [
            (
                not_sent,
                NotAttempted,
                "connect-failed",
                &["connect-failed"][..],
                502,
                released,
            ),
            (
                Exchange::Fenced { attempts: 1 },
                NotAttempted,
                "lease-lost",
                &["lease-lost"],
                503,
                rejected,
            ),
            (
                Exchange::Busy {
                    attempts: 1,
                    reason: "all in use".into(),
                },
                NotAttempted,
                "upstream-busy",
                &["upstream-busy"],
                503,
                released,
            ),
            (
                lost(LostCause::Timeout),
                Unknown,
                "timeout",
                &["sent", "timeout"],
                504,
                unknown,
            ),
            (
                lost(LostCause::Broken),
                Unknown,
                "reset",
                &["sent", "reset"],
                502,
                unknown,
            ),
            (
                refused,
                NotAttempted,
                "released-503",
                &["sent", "response"],
                503,
                released,
            ),
            (
                complete,
                Completed,
                "response",
                &["sent", "response"],
                201,
                forwarded,
            ),
        ];
        for (exchange, state, evidence, events, status, outcome) in cases {
            let settled = settle(&claim(), exchange, (3, 7), Duration::from_millis(1500));
            let expected = (
                state,
                evidence.to_string(),
                events.to_vec(),
                status,
                Some(outcome),
            );
            assert_eq!(summary(&settled), expected, "{evidence}");
            if events[0] == "sent" {
                let detail = json!({"tries": 3, "bytes": 7, "took_ms": 1500});
                assert_eq!(settled.events[0].detail, detail);
            }
        }
    }

    #[test]
    fn a_lost_response_is_a_problem_about_the_unknown_operation() {
        let lost = Exchange::Lost {
            cause: LostCause::Timeout,
            reason: "gone".into(),
        };
        let problem = settle(&claim(), lost, (1, 0), Duration::ZERO)
            .reply
            .unwrap_err()
            .problem();
        assert_eq!(
            (problem.operation_id.as_deref(), problem.state),
            (Some("op-1"), Some("unknown"))
        );
    }

    /// Waiters on an attempt that ended `not_attempted` get its answer and
    /// send nothing; a fenced attempt's look again (the replica that holds
    /// the lease now may send it), as do those of any other ending.
    #[test]
    fn waiters_get_the_answer_of_an_attempt_that_sent_nothing() {
        let not_sent = Exchange::NotSent {
            attempts: 3,
            reason: "refused".into(),
        };
        let settled = settle(&claim(), not_sent, (3, 0), Duration::ZERO);
        assert!(matches!(
            &settled.released,
            Some(Released::Unreachable { reason }) if reason == "refused"
        ));
        let refused = Exchange::Released {
            head: parts(503),
            body: Bytes::from_static(b"busy"),
        };
        let Some(Released::Refused(stored)) =
            settle(&claim(), refused, (1, 0), Duration::ZERO).released
        else {
            panic!("no answer for the waiters");
        };
        assert_eq!(
            (stored.status, stored.body.as_deref()),
            (503, Some(&b"busy"[..]))
        );
        let waiter = Released::Refused(stored).answer("op-1").unwrap();
        assert_eq!(
            (waiter.status(), waiter.extensions().get::<Outcome>()),
            (StatusCode::SERVICE_UNAVAILABLE, Some(&Outcome::released))
        );
        let busy = Exchange::Busy {
            attempts: 1,
            reason: "all in use".into(),
        };
        let released = settle(&claim(), busy, (1, 0), Duration::ZERO)
            .released
            .expect("an answer");
        let problem = released.answer("op-1").unwrap_err().problem();
        assert_eq!(
            (
                problem.status,
                problem.operation_id.as_deref(),
                problem.state
            ),
            (503, Some("op-1"), Some("not_attempted"))
        );
        let fenced = settle(
            &claim(),
            Exchange::Fenced { attempts: 1 },
            (1, 0),
            Duration::ZERO,
        );
        assert!(fenced.released.is_none());
        let lost = Exchange::Lost {
            cause: LostCause::Broken,
            reason: "gone".into(),
        };
        assert!(
            settle(&claim(), lost, (1, 0), Duration::ZERO)
                .released
                .is_none()
        );
    }

    #[test]
    fn an_outcome_not_recorded_is_503_about_the_attempt_in_progress() {
        let error = unrecorded(&claim());
        let problem = error.problem();
        assert_eq!((problem.status, problem.state), (503, Some("in_progress")));
        assert_eq!(error.outcome(), Outcome::unknown);
    }

    fn head(headers: &[(&str, &str)]) -> http::response::Parts {
        let mut response = http::Response::builder().status(201);
        for (name, value) in headers {
            response = response.header(*name, *value);
        }
        response.body(()).unwrap().into_parts().0
    }

    /// A kept body's `Content-Length` is its own length: not stored twice.
    /// Every other header is kept, in order, duplicates and all.
    #[test]
    fn a_kept_body_stores_no_content_length() {
        let head = head(&[("x-a", "1"), ("content-length", "2"), ("x-a", "2")]);
        let stored = stored_response(&head, Some(b"{}".to_vec()));
        assert_eq!(stored.status, 201);
        assert_eq!(
            stored.headers,
            [("x-a".into(), b"1".to_vec()), ("x-a".into(), b"2".to_vec())]
        );
        assert_eq!(stored.body.as_deref(), Some(&b"{}"[..]));
    }

    /// A body too large to keep leaves its `Content-Length` as the one
    /// record of its size.
    #[test]
    fn a_body_not_kept_keeps_its_content_length() {
        let head = head(&[("content-length", "9000000")]);
        let stored = stored_response(&head, None);
        assert_eq!(
            stored.headers,
            [("content-length".into(), b"9000000".to_vec())]
        );
        assert_eq!(stored.body, None);
    }
}
