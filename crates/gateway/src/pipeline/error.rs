//! The pipeline's error: everything a phase may answer instead of an
//! upstream response, and which problem each is, rendered as the RFC 9457
//! body of [`crate::problem`].
//!
//! Invariant: the problem follows from the [`ProxyError`] variant alone,
//! through one exhaustive match to its [`ProblemKind`] (whose status, name
//! and title are [`crate::problem`]'s one mapping), unit tested per
//! variant. Problems about an operation carry its `operation_id` and
//! `state`; none carries credentials or payloads.

use http::Response;

use crate::body::ProxyBody;
use crate::metrics::{OperationId, Outcome, StoreFailure};
use crate::pipeline::fields::FieldError;
use crate::pipeline::host::HostError;
use crate::pipeline::key::KeyError;
use crate::pipeline::method::MethodError;
use crate::pipeline::quota::QuotaSpent;
use crate::problem::{Problem, ProblemKind, UnknownSince};
use crate::profile::{Profile, Wire};
use crate::request_path::PathError;
use crate::traces;
use idemgate_model::operation::{Operation, State};
use idemgate_store::StoreError;

/// The operation a problem is about.
#[derive(Debug, Clone)]
pub struct OperationRef {
    pub(crate) id: String,
    pub(crate) state: State,
}

impl From<&Operation> for OperationRef {
    fn from(op: &Operation) -> Self {
        OperationRef {
            id: op.id.clone(),
            state: op.state,
        }
    }
}

/// An error idemgate answers itself instead of an upstream response.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("no route matches {path}")]
    NoRoute { path: String },
    /// A call for the admin API, with its token, sent to the proxy
    /// listener: refused, so the token never reaches an upstream.
    #[error(
        "this request carries the gateway's admin token: the admin API answers on the admin listener (server.admin_listen), not this one; nothing was sent upstream"
    )]
    MisdirectedAdminCall,
    #[error(transparent)]
    InvalidPath(#[from] PathError),
    #[error(transparent)]
    InvalidHost(#[from] HostError),
    #[error(transparent)]
    InvalidHeader(#[from] FieldError),
    #[error(transparent)]
    UnsupportedMethod(#[from] MethodError),
    #[error("the request head is larger than {limit} bytes")]
    HeadersTooLarge { limit: usize },
    #[error("no operation with this key in your scope")]
    UnknownOperation,
    #[error("{}", missing_key(Profile::Idemgate.wire().key_name))]
    MissingKey,
    /// A keyless write on a `derive_from` route whose key could not be
    /// derived: 400 `missing-key`, saying which fields it is derived from.
    #[error(
        "this write carries no key, and its key is derived from {fields} of a JSON body: {why}; nothing was sent"
    )]
    KeyNotDerived { fields: String, why: &'static str },
    #[error(transparent)]
    InvalidKey(#[from] KeyError),
    #[error("this write carries none of the scope headers ({headers})")]
    MissingScope { headers: String },
    #[error(
        "this request was first sent at {first_sent}, longer ago than the {} a request is tracked for (store.retention less the route's first_sent_skew): whether it already happened cannot be told, so it is not sent",
        humantime::format_duration(*tracked)
    )]
    FirstSentTooOld {
        first_sent: String,
        tracked: std::time::Duration,
    },
    #[error("the request body is larger than {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error("the request body did not arrive within {}", humantime::format_duration(*after))]
    BodyTimeout { after: std::time::Duration },
    #[error("the request body could not be read: {reason}")]
    BodyRead { reason: String },
    #[error("{}", key_reused(Profile::Idemgate.wire().key_name))]
    KeyReused { operation: OperationRef },
    #[error("{}", in_progress(Profile::Idemgate.wire().key_name))]
    InProgress { operation: OperationRef },
    #[error("{}", possible_duplicate(operation, *first_keyless))]
    PossibleDuplicate {
        operation: OperationRef,
        /// The first request sent no key (its key was derived): a retry
        /// finds its operation by sending none, not by a key it never had.
        first_keyless: bool,
    },
    #[error("{detail}")]
    OutcomeUnknown {
        operation: OperationRef,
        since: UnknownSince,
        detail: String,
    },
    #[error(
        "the operation completed, but its response was too large to store and cannot be replayed"
    )]
    ResponseNotStored { operation: OperationRef },
    /// A duplicate that waited, on one replica, for an attempt claimed
    /// through another, which ended `not_attempted`: that attempt's own
    /// answer is in the other replica's memory only.
    #[error(
        "the attempt this request waited for, claimed through another gateway, was not made{}; nothing was sent for this request either: retry with the same key, later if the upstream asked clients to back off",
        evidence.as_ref().map(|e| format!(" ({e})")).unwrap_or_default()
    )]
    AttemptNotMade {
        operation: OperationRef,
        /// What the store says of that attempt (`released-429`,
        /// `connect-failed`, …), when it still describes it.
        evidence: Option<String>,
    },
    #[error("route `{route}` is paused ({reason}); completed operations are still replayed")]
    RoutePaused {
        route: String,
        reason: String,
        operation: Option<OperationRef>,
    },
    #[error("the operation store is unavailable; nothing was sent upstream")]
    StoreUnavailable { source: StoreError },
    #[error("{source}; nothing was sent upstream, and it is never replayed")]
    StoreUnreadable { source: StoreError },
    #[error("the outcome was sent upstream but could not be recorded yet; do not assume it failed")]
    StoreUnavailableAfterSend { operation: OperationRef },
    #[error(
        "this gateway could no longer prove that the operation is its own (its store lease ran low, or it is shutting down), so nothing was sent upstream; retry, through any replica, once the store answers"
    )]
    LeaseLost { operation: OperationRef },
    #[error("the upstream could not be reached; nothing was sent ({reason})")]
    UpstreamUnreachable {
        operation: Option<OperationRef>,
        reason: String,
    },
    #[error("the upstream did not answer in time")]
    UpstreamTimeout,
    #[error("the upstream exchange failed: {reason}")]
    UpstreamFailed { reason: String },
    #[error(
        "this scope has {} on route `{route}` within {}; nothing was sent, retry after the window ends",
        spent.used,
        humantime::format_duration(spent.window)
    )]
    QuotaExceeded {
        route: String,
        spent: QuotaSpent,
        operation: Option<OperationRef>,
    },
    /// About the `operation` a write claimed and then could not send (it
    /// is `not_attempted`), if it got that far.
    #[error("the gateway is at its limit of {what}; nothing was sent, retry shortly")]
    Overloaded {
        what: &'static str,
        operation: Option<OperationRef>,
    },
    #[error("the request could not be handled: {reason}")]
    Internal { reason: String },
}

fn missing_key(key: &str) -> String {
    let article = if key.starts_with(['A', 'E', 'I', 'O', 'U', 'a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    };
    format!("this write needs {article} {key} header")
}

fn key_reused(key: &str) -> String {
    format!("this {key} was used for a different request")
}

fn in_progress(key: &str) -> String {
    format!("a request with this {key} is still in progress")
}

fn possible_duplicate(operation: &OperationRef, first_keyless: bool) -> String {
    let retry = if first_keyless {
        "that request was sent without a key: retry without one"
    } else {
        "retry with that request's key"
    };
    format!(
        "an identical request under another key is still in progress or held as unknown (operation {}): this one is most likely the same action, so nothing was sent; {retry}",
        operation.id
    )
}

impl ProxyError {
    /// The problem's detail, naming the key header `key` where it is about
    /// the key: the header the route's profile reads, never one it ignores.
    fn detail(&self, key: &str) -> String {
        match self {
            ProxyError::MissingKey => missing_key(key),
            ProxyError::InvalidKey(error) => error.describe(key),
            ProxyError::KeyReused { .. } => key_reused(key),
            ProxyError::InProgress { .. } => in_progress(key),
            other => other.to_string(),
        }
    }

    /// Which problem this error is, and the operation it is about.
    fn kind(&self) -> (ProblemKind, Option<&OperationRef>) {
        use ProxyError::*;
        match self {
            NoRoute { .. } => (ProblemKind::NoRoute, None),
            MisdirectedAdminCall => (ProblemKind::MisdirectedAdminCall, None),
            InvalidPath(_) => (ProblemKind::InvalidPath, None),
            InvalidHost(_) => (ProblemKind::InvalidHost, None),
            InvalidHeader(FieldError::Padded { .. }) => (ProblemKind::InvalidHeader, None),
            InvalidHeader(FieldError::Coded { .. }) => {
                (ProblemKind::UnsupportedTransferCoding, None)
            }
            UnsupportedMethod(_) => (ProblemKind::UnsupportedMethod, None),
            HeadersTooLarge { .. } => (ProblemKind::HeadersTooLarge, None),
            UnknownOperation => (ProblemKind::UnknownOperation, None),
            MissingKey | KeyNotDerived { .. } => (ProblemKind::MissingKey, None),
            InvalidKey(_) => (ProblemKind::InvalidKey, None),
            MissingScope { .. } => (ProblemKind::MissingScope, None),
            FirstSentTooOld { .. } => (ProblemKind::FirstSentTooOld, None),
            BodyTooLarge { .. } => (ProblemKind::BodyTooLarge, None),
            BodyTimeout { .. } => (ProblemKind::BodyTimeout, None),
            BodyRead { .. } => (ProblemKind::InvalidBody, None),
            KeyReused { operation } => (ProblemKind::KeyReused, Some(operation)),
            InProgress { operation } => (ProblemKind::RequestInProgress, Some(operation)),
            PossibleDuplicate { operation, .. } => {
                (ProblemKind::PossibleDuplicate, Some(operation))
            }
            OutcomeUnknown {
                operation, since, ..
            } => (ProblemKind::OutcomeUnknown(*since), Some(operation)),
            ResponseNotStored { operation } => (ProblemKind::ResponseNotStored, Some(operation)),
            AttemptNotMade { operation, .. } => (ProblemKind::AttemptNotMade, Some(operation)),
            RoutePaused { operation, .. } => (ProblemKind::RoutePaused, operation.as_ref()),
            StoreUnavailable { .. } => (ProblemKind::StoreUnavailable, None),
            StoreUnreadable { .. } => (ProblemKind::StoreUnreadable, None),
            StoreUnavailableAfterSend { operation } => {
                (ProblemKind::StoreUnavailable, Some(operation))
            }
            LeaseLost { operation } => (ProblemKind::LeaseLost, Some(operation)),
            UpstreamUnreachable { operation, .. } => {
                (ProblemKind::UpstreamUnreachable, operation.as_ref())
            }
            UpstreamTimeout => (ProblemKind::UpstreamTimeout, None),
            UpstreamFailed { .. } => (ProblemKind::UpstreamFailed, None),
            QuotaExceeded { operation, .. } => (ProblemKind::QuotaExceeded, operation.as_ref()),
            Overloaded { operation, .. } => (ProblemKind::Overloaded, operation.as_ref()),
            Internal { .. } => (ProblemKind::Internal, None),
        }
    }

    /// The problem body as idemgate's own profile words it (what the
    /// tests compare; requests are answered through their route's wire).
    #[cfg(test)]
    pub(crate) fn problem(&self) -> Problem {
        self.problem_as(Profile::Idemgate.wire())
    }

    /// The problem body: its kind's status, name and title
    /// ([`ProblemKind`]), the operation it is about, how long to wait, and
    /// a detail naming the key header as `wire`'s profile reads it.
    fn problem_as(&self, wire: &Wire) -> Problem {
        use ProxyError::*;
        let (kind, operation) = self.kind();
        let retry_after = match self {
            // In a second: the attempt in flight may be over, the load
            // lower; nothing was sent for an unreachable upstream, so a
            // retry then is the next attempt.
            InProgress { .. } | Overloaded { .. } | UpstreamUnreachable { .. } => Some(1),
            QuotaExceeded { spent, .. } => Some(spent.retry_after),
            StoreUnavailable { .. } | StoreUnavailableAfterSend { .. } | LeaseLost { .. } => {
                Some(2)
            }
            _ => None,
        };
        Problem {
            operation_id: operation.map(|op| op.id.clone()),
            state: operation.map(|op| op.state.as_str()),
            retry_after,
            ..Problem::new(kind, self.detail(wire.key_name))
        }
    }

    /// A store call that failed, as the problem its [`ProblemKind::of_store`]
    /// says: unreadable (500, never replayed) or unavailable (503).
    pub fn store(source: StoreError) -> Self {
        match ProblemKind::of_store(&source) {
            ProblemKind::StoreUnreadable => ProxyError::StoreUnreadable { source },
            _ => ProxyError::StoreUnavailable { source },
        }
    }

    /// How a request that ends in this error counts in metrics and logs.
    pub fn outcome(&self) -> Outcome {
        use ProxyError::*;
        match self {
            KeyReused { .. } => Outcome::mismatch,
            // A retry of a held operation is told what the store holds:
            // nothing went upstream, so it is no upstream failure (the
            // attempt that lost its answer counted as `unknown`).
            InProgress { .. }
            | ResponseNotStored { .. }
            | PossibleDuplicate { .. }
            | OutcomeUnknown {
                since: UnknownSince::Earlier,
                ..
            } => Outcome::conflict,
            OutcomeUnknown { .. } | StoreUnavailableAfterSend { .. } => Outcome::unknown,
            UpstreamUnreachable {
                operation: Some(_), ..
            }
            | AttemptNotMade { .. }
            | Overloaded {
                operation: Some(_), ..
            } => Outcome::released,
            UpstreamUnreachable {
                operation: None, ..
            }
            | UpstreamTimeout
            | UpstreamFailed { .. } => Outcome::proxied,
            // Nothing was sent: the replica could not prove its lease.
            LeaseLost { .. }
            | NoRoute { .. }
            | MisdirectedAdminCall
            | InvalidPath(_)
            | InvalidHost(_)
            | InvalidHeader(_)
            | UnsupportedMethod(_)
            | UnknownOperation
            | HeadersTooLarge { .. }
            | MissingKey
            | KeyNotDerived { .. }
            | InvalidKey(_)
            | MissingScope { .. }
            | FirstSentTooOld { .. }
            | BodyTooLarge { .. }
            | BodyRead { .. }
            | BodyTimeout { .. }
            | RoutePaused { .. }
            | StoreUnavailable { .. }
            | StoreUnreadable { .. }
            | Overloaded {
                operation: None, ..
            }
            | QuotaExceeded { .. }
            | Internal { .. } => Outcome::rejected,
        }
    }

    /// The problem response as idemgate's own profile answers it.
    pub fn into_response(self) -> Response<ProxyBody> {
        self.into_response_as(Profile::Idemgate.wire())
    }

    /// The problem response as `wire`'s profile answers it, carrying its
    /// [`Outcome`] and [`OperationId`] as extensions for the request log.
    pub fn into_response_as(self, wire: &Wire) -> Response<ProxyBody> {
        if let (_, Some(operation)) = self.kind() {
            traces::note_state(operation.state.as_str());
        }
        let outcome = self.outcome();
        let store_failed = matches!(
            self,
            ProxyError::StoreUnavailable { .. }
                | ProxyError::StoreUnavailableAfterSend { .. }
                | ProxyError::LeaseLost { .. }
        );
        let problem = self.problem_as(wire);
        let operation = problem.operation_id.clone();
        let mut response = problem.into_response_as(wire);
        response.extensions_mut().insert(outcome);
        if store_failed {
            response.extensions_mut().insert(StoreFailure);
        }
        if let Some(id) = operation {
            response.extensions_mut().insert(OperationId(id));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::quota::Used;
    use http::header::{CONTENT_TYPE, RETRY_AFTER};

    fn op(state: State) -> OperationRef {
        OperationRef {
            id: "op-1".into(),
            state,
        }
    }

    fn check(error: ProxyError, status: u16, name: &str) -> Problem {
        let problem = error.problem();
        assert_eq!(problem.status, status, "{name}");
        assert_eq!(problem.problem_type, format!("urn:idemgate:problem:{name}"));
        assert_eq!(problem.kind.name(), name);
        assert!(!problem.detail.is_empty());
        assert_error_envelope(&problem, name);
        problem
    }

    /// The `error` member names the problem and repeats its detail.
    fn assert_error_envelope(problem: &Problem, name: &str) {
        let json = serde_json::to_value(problem).unwrap();
        assert_eq!(
            json["error"],
            serde_json::json!({
                "type": "idempotency_error",
                "code": name,
                "message": problem.detail,
            }),
            "{json}"
        );
    }

    #[test]
    fn each_error_maps_to_its_status_and_name() {
        check(ProxyError::NoRoute { path: "/x".into() }, 404, "no-route");
        let bad_path = PathError::BadPercentEncoding { at: 1 };
        check(ProxyError::InvalidPath(bad_path), 400, "invalid-path");
        check(
            ProxyError::InvalidHost(HostError::Several),
            400,
            "invalid-host",
        );
        check(ProxyError::MissingKey, 400, "missing-key");
        let slow = ProxyError::BodyTimeout {
            after: std::time::Duration::from_secs(1),
        };
        check(slow, 408, "body-timeout");
        check(ProxyError::UnknownOperation, 404, "unknown-operation");
        check(
            ProxyError::HeadersTooLarge { limit: 1 },
            431,
            "headers-too-large",
        );
        check(
            ProxyError::InvalidKey(KeyError::Several),
            400,
            "invalid-key",
        );
        check(
            ProxyError::MissingScope {
                headers: "authorization".into(),
            },
            400,
            "missing-scope",
        );
        check(ProxyError::BodyTooLarge { limit: 1 }, 413, "body-too-large");
        let old = ProxyError::FirstSentTooOld {
            first_sent: "Tue, 01 Dec 2026 10:00:00 GMT".into(),
            tracked: std::time::Duration::from_secs(60),
        };
        check(old, 412, "first-sent-too-old");
        check(
            ProxyError::BodyRead {
                reason: "reset".into(),
            },
            400,
            "invalid-body",
        );
        check(
            ProxyError::KeyReused {
                operation: op(State::Completed),
            },
            422,
            "key-reused",
        );
        let p = check(
            ProxyError::InProgress {
                operation: op(State::InProgress),
            },
            409,
            "request-in-progress",
        );
        assert_eq!(p.retry_after, Some(1));
        for (since, status) in [
            (UnknownSince::Earlier, 409),
            (UnknownSince::Broken, 502),
            (UnknownSince::Timeout, 504),
        ] {
            let error = ProxyError::OutcomeUnknown {
                operation: op(State::Unknown),
                since,
                detail: "held".into(),
            };
            check(error, status, "outcome-unknown");
        }
        check(
            ProxyError::ResponseNotStored {
                operation: op(State::Completed),
            },
            409,
            "response-not-stored",
        );
        let paused = ProxyError::RoutePaused {
            route: "r".into(),
            reason: "operator".into(),
            operation: None,
        };
        check(paused, 503, "route-paused");
        let store = StoreError::Corrupt("x".into());
        check(ProxyError::store(store), 503, "store-unavailable");
        let unreadable = StoreError::Seal(idemgate_store::SealError::Unreadable {
            operation: "op".into(),
            field: "response_body",
            reason: "altered".into(),
        });
        check(ProxyError::store(unreadable), 500, "store-unreadable");
        check(
            ProxyError::StoreUnavailableAfterSend {
                operation: op(State::InProgress),
            },
            503,
            "store-unavailable",
        );
        let lease = check(
            ProxyError::LeaseLost {
                operation: op(State::InProgress),
            },
            503,
            "lease-lost",
        );
        assert_eq!(lease.retry_after, Some(2));
        assert_eq!(lease.operation_id.as_deref(), Some("op-1"));
        let not_made = check(
            ProxyError::AttemptNotMade {
                operation: op(State::NotAttempted),
                evidence: Some("released-429".into()),
            },
            503,
            "attempt-not-made",
        );
        // The upstream's Retry-After is not stored: none is made up.
        assert_eq!(not_made.retry_after, None);
        assert!(
            not_made.detail.contains("(released-429)"),
            "{}",
            not_made.detail
        );
        let unreachable = check(
            ProxyError::UpstreamUnreachable {
                operation: None,
                reason: "refused".into(),
            },
            502,
            "upstream-unreachable",
        );
        assert_eq!(unreachable.retry_after, Some(1), "nothing sent: retry now");
        check(ProxyError::UpstreamTimeout, 504, "upstream-timeout");
        check(
            ProxyError::UpstreamFailed {
                reason: "reset".into(),
            },
            502,
            "upstream-failed",
        );
        let overloaded = check(
            ProxyError::Overloaded {
                what: "open connections",
                operation: None,
            },
            503,
            "overloaded",
        );
        assert_eq!(overloaded.retry_after, Some(1));
        let quota = check(
            ProxyError::QuotaExceeded {
                route: "api".into(),
                spent: QuotaSpent {
                    used: Used::Operations(10),
                    window: std::time::Duration::from_secs(60),
                    retry_after: 42,
                },
                operation: None,
            },
            429,
            "quota-exceeded",
        );
        assert_eq!(quota.retry_after, Some(42));
        check(ProxyError::Internal { reason: "x".into() }, 500, "internal");
    }

    #[test]
    fn operation_problems_carry_id_and_state() {
        let problem = ProxyError::KeyReused {
            operation: op(State::Unknown),
        }
        .problem();
        let json = serde_json::to_value(&problem).unwrap();
        assert_eq!(json["operation_id"], "op-1");
        assert_eq!(json["state"], "unknown");
        assert_eq!(
            json["title"],
            "Idempotency-Key reused with a different request"
        );
        let plain = serde_json::to_value(ProxyError::MissingKey.problem()).unwrap();
        assert!(plain.get("operation_id").is_none() && plain.get("state").is_none());
    }

    #[test]
    fn an_operation_problem_keeps_rfc_9457_and_adds_the_error_member() {
        let held = ProxyError::OutcomeUnknown {
            operation: op(State::Unknown),
            since: UnknownSince::Earlier,
            detail: "the outcome is unknown".into(),
        };
        let body = serde_json::to_value(held.problem()).unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "type": "urn:idemgate:problem:outcome-unknown",
                "title": "Outcome unknown",
                "status": 409,
                "detail": "the outcome is unknown",
                "operation_id": "op-1",
                "state": "unknown",
                "error": {
                    "type": "idempotency_error",
                    "code": "outcome-unknown",
                    "message": "the outcome is unknown",
                },
            })
        );
    }

    #[test]
    fn responses_are_problem_json() {
        let response = ProxyError::InProgress {
            operation: op(State::InProgress),
        }
        .into_response();
        assert_eq!(response.status(), 409);
        assert_eq!(response.headers()[CONTENT_TYPE], "application/problem+json");
        assert_eq!(response.headers()[RETRY_AFTER], "1");
    }
}
