//! Every answer idemgate gives itself, on both listeners, as an RFC 9457
//! problem body (`application/problem+json`, `type` =
//! `urn:idemgate:problem:<name>`): the proxy's errors
//! (`pipeline::error::ProxyError`) and the admin API's (`admin::AdminError`).
//!
//! Invariants:
//! - Which status, name and title a problem has follows from its
//!   [`ProblemKind`] alone, through exhaustive matches here
//!   ([`ProblemKind::status`], [`ProblemKind::name`]), unit tested per kind. Each listener's error
//!   type only says which kind it is ([`ProblemKind::of_store`] is the one
//!   500/503 split of a failed store call, for both).
//! - Every body is built by [`Problem::new`] and so carries the `error`
//!   extension member ([`ErrorEnvelope`]) with the same name and detail;
//!   a route's profile ([`crate::profile`]) may answer it with another
//!   status, code or body shape ([`Problem::into_response_as`]), never
//!   another detail.
//!
//! This module knows kinds and bodies, not the errors behind them, so it
//! imports neither the pipeline nor the admin API that render through it.

use http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http::{Response, StatusCode};
use serde::Serialize;

use crate::body::{ProxyBody, full};
use crate::profile::{BodyShape, Profile, REPEATABILITY_RESULT, Wire};
use idemgate_store::StoreError;

/// Every problem idemgate answers, on either listener; one name each
/// (`urn:idemgate:problem:<name>`), the same on both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProblemKind {
    // Refused before anything was claimed: the request itself is wrong.
    NoRoute,
    /// A call for the admin API, with its token, on the proxy listener.
    MisdirectedAdminCall,
    InvalidPath,
    InvalidHost,
    InvalidHeader,
    UnsupportedTransferCoding,
    UnsupportedMethod,
    HeadersTooLarge,
    UnknownOperation,
    MissingKey,
    InvalidKey,
    MissingScope,
    /// OASIS: the request was first sent longer ago than operations are kept.
    FirstSentTooOld,
    BodyTooLarge,
    BodyTimeout,
    InvalidBody,
    // About the operation a key already has.
    KeyReused,
    RequestInProgress,
    /// An identical request under another key is in progress or held.
    PossibleDuplicate,
    OutcomeUnknown(UnknownSince),
    ResponseNotStored,
    /// A waiter's attempt, claimed through another replica, ended
    /// `not_attempted`.
    AttemptNotMade,
    RoutePaused,
    QuotaExceeded,
    // The gateway or what it depends on.
    StoreUnavailable,
    StoreUnreadable,
    LeaseLost,
    UpstreamUnreachable,
    UpstreamTimeout,
    UpstreamFailed,
    Overloaded,
    Draining,
    Internal,
    // The admin API's own.
    Unauthorized,
    AdminTokenUnset,
    NotResolvable,
    /// An operator's `not_attempted` while the held attempt may still land.
    AttemptMayStillLand,
    /// An operator's resolution decided on an attempt the operation has
    /// since left (a retry was let through and held again).
    OperationChanged,
    /// An operator's resolution giving the answer another kind of route
    /// takes: an HTTP `response` for an MCP tool call, a tool `result`
    /// for an HTTP route's write.
    WrongAnswerKind,
    /// A `not_attempted` resolution of an operation a probe found at the
    /// destination more than once.
    FoundAtDestination,
    AmbiguousCredentials,
    InvalidCursor,
    InvalidRequest,
    InvalidResolution,
    MethodNotAllowed,
}

/// Why an operation's outcome is unknown, which picks the status of its
/// `outcome-unknown` answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnknownSince {
    /// It was already unknown when this request came: 409, a conflict
    /// like the other held keys.
    Earlier,
    /// This very attempt's response did not come in time: 504.
    Timeout,
    /// This very attempt's connection broke before a whole response: 502.
    Broken,
}

impl ProblemKind {
    /// The status: one exhaustive match, grouped by status so that what
    /// shares one reads together (the 500/503 split among them).
    pub fn status(self) -> StatusCode {
        use ProblemKind::*;
        match self {
            InvalidPath | InvalidHost | InvalidHeader | MissingKey | InvalidKey | MissingScope
            | InvalidBody => StatusCode::BAD_REQUEST,
            AmbiguousCredentials | InvalidCursor | InvalidRequest | InvalidResolution => {
                StatusCode::BAD_REQUEST
            }
            Unauthorized | AdminTokenUnset => StatusCode::UNAUTHORIZED,
            FirstSentTooOld => StatusCode::PRECONDITION_FAILED,
            NoRoute | UnknownOperation => StatusCode::NOT_FOUND,
            MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            MisdirectedAdminCall => StatusCode::MISDIRECTED_REQUEST,
            BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            RequestInProgress | ResponseNotStored | NotResolvable | AttemptMayStillLand
            | OperationChanged | WrongAnswerKind | FoundAtDestination | PossibleDuplicate => {
                StatusCode::CONFLICT
            }
            OutcomeUnknown(UnknownSince::Earlier) => StatusCode::CONFLICT,
            BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            QuotaExceeded => StatusCode::TOO_MANY_REQUESTS,
            HeadersTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            UnsupportedTransferCoding | UnsupportedMethod => StatusCode::NOT_IMPLEMENTED,
            // The gateway's own failures: 500 when retrying cannot help...
            StoreUnreadable | Internal => StatusCode::INTERNAL_SERVER_ERROR,
            // ...502/504 about the upstream, 503 when a retry soon may pass.
            UpstreamUnreachable | UpstreamFailed => StatusCode::BAD_GATEWAY,
            OutcomeUnknown(UnknownSince::Broken) => StatusCode::BAD_GATEWAY,
            UpstreamTimeout | OutcomeUnknown(UnknownSince::Timeout) => StatusCode::GATEWAY_TIMEOUT,
            StoreUnavailable | LeaseLost | RoutePaused | Overloaded | Draining | AttemptNotMade => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        }
    }

    /// The problem name (as in `urn:idemgate:problem:<name>`) and title:
    /// one exhaustive match.
    fn name_and_title(self) -> (&'static str, &'static str) {
        use ProblemKind::*;
        match self {
            NoRoute => ("no-route", "No route"),
            MisdirectedAdminCall => (
                "misdirected-admin-call",
                "Admin API call on the proxy listener",
            ),
            InvalidPath => ("invalid-path", "Invalid request path"),
            InvalidHost => ("invalid-host", "Invalid request host"),
            InvalidHeader => ("invalid-header", "Malformed request header"),
            UnsupportedTransferCoding => (
                "unsupported-transfer-coding",
                "Transfer coding not supported",
            ),
            UnsupportedMethod => ("unsupported-method", "Method not supported"),
            HeadersTooLarge => ("headers-too-large", "Request head too large"),
            UnknownOperation => ("unknown-operation", "Unknown operation"),
            MissingKey => ("missing-key", "Idempotency-Key required"),
            InvalidKey => ("invalid-key", "Invalid Idempotency-Key"),
            MissingScope => ("missing-scope", "Scope headers required"),
            FirstSentTooOld => ("first-sent-too-old", "Request first sent too long ago"),
            BodyTooLarge => ("body-too-large", "Request body too large"),
            BodyTimeout => ("body-timeout", "Request body too slow"),
            InvalidBody => ("invalid-body", "Request body unreadable"),
            KeyReused => (
                "key-reused",
                "Idempotency-Key reused with a different request",
            ),
            RequestInProgress => ("request-in-progress", "Request in progress"),
            PossibleDuplicate => ("possible-duplicate", "Possible duplicate"),
            OutcomeUnknown(_) => ("outcome-unknown", "Outcome unknown"),
            ResponseNotStored => ("response-not-stored", "Response not stored"),
            AttemptNotMade => ("attempt-not-made", "Attempt not made"),
            RoutePaused => ("route-paused", "Route paused"),
            QuotaExceeded => ("quota-exceeded", "Quota exceeded"),
            StoreUnavailable => ("store-unavailable", "Store unavailable"),
            StoreUnreadable => ("store-unreadable", "Stored operation unreadable"),
            LeaseLost => ("lease-lost", "Gateway lease lost"),
            UpstreamUnreachable => ("upstream-unreachable", "Upstream unreachable"),
            UpstreamTimeout => ("upstream-timeout", "Upstream timeout"),
            UpstreamFailed => ("upstream-failed", "Upstream failed"),
            Overloaded => ("overloaded", "Overloaded"),
            Draining => ("draining", "Shutting down"),
            Internal => ("internal", "Internal error"),
            Unauthorized => ("unauthorized", "Unauthorized"),
            AdminTokenUnset => ("admin-token-unset", "No admin token configured"),
            NotResolvable => ("not-resolvable", "Not resolvable"),
            AttemptMayStillLand => ("attempt-may-still-land", "Attempt may still land"),
            OperationChanged => ("operation-changed", "Operation changed"),
            WrongAnswerKind => ("wrong-answer-kind", "Wrong kind of answer"),
            FoundAtDestination => ("found-at-destination", "Found at the destination"),
            AmbiguousCredentials => ("ambiguous-credentials", "Ambiguous credentials"),
            InvalidCursor => ("invalid-cursor", "Invalid cursor"),
            InvalidRequest => ("invalid-request", "Invalid request"),
            InvalidResolution => ("invalid-resolution", "Invalid resolution"),
            MethodNotAllowed => ("method-not-allowed", "Method not allowed"),
        }
    }

    /// The problem name, as in `urn:idemgate:problem:<name>`.
    pub fn name(self) -> &'static str {
        self.name_and_title().0
    }

    pub fn title(self) -> &'static str {
        self.name_and_title().1
    }

    /// A store call that failed: 500 `store-unreadable` when the store
    /// answered but holds a value that must not be used (a sealed payload
    /// that does not open), else 503 `store-unavailable`, worth a retry.
    pub(crate) fn of_store(error: &StoreError) -> Self {
        if error.is_unreadable() {
            ProblemKind::StoreUnreadable
        } else {
            ProblemKind::StoreUnavailable
        }
    }
}

/// An RFC 9457 problem body.
#[derive(Debug, Serialize)]
pub struct Problem {
    /// Which problem: what a route's profile decides its answer by.
    #[serde(skip)]
    pub(crate) kind: ProblemKind,
    #[serde(rename = "type")]
    pub(crate) problem_type: String,
    pub(crate) title: &'static str,
    pub(crate) status: u16,
    pub(crate) detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) operation_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) state: Option<&'static str>,
    /// An extension member (RFC 9457 §3.2) for Stripe-style SDKs, which
    /// raise only when a body carries an `error` object: without it
    /// stripe-node resolves a held 409 as if it were the created resource,
    /// and the automation believes a write happened whose outcome is unknown.
    /// `None` only under a profile whose bodies have no such member (`ietf`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<ErrorEnvelope>,
    /// Seconds for the `Retry-After` header, not a member of the body.
    #[serde(skip)]
    pub(crate) retry_after: Option<u32>,
}

/// The `error` member: `{"type": "idempotency_error", "code": <problem
/// name>, "message": <detail>}`, the envelope Stripe-style SDKs read.
#[derive(Debug, Serialize)]
pub struct ErrorEnvelope {
    /// [`ErrorEnvelope::TYPE`] unless a profile says otherwise: every
    /// problem idemgate answers is about whether (and how) a write may be
    /// sent, never about the upstream's own business errors, which pass
    /// through untouched.
    #[serde(rename = "type")]
    pub(crate) error_type: &'static str,
    /// The problem name, as in `urn:idemgate:problem:<name>`, unless a
    /// profile names it otherwise.
    pub(crate) code: String,
    /// The problem's `detail`.
    pub(crate) message: String,
}

impl ErrorEnvelope {
    /// The error type SDKs map to their idempotency error class.
    pub const TYPE: &'static str = "idempotency_error";
}

impl Problem {
    /// A problem that is not about an operation; the one constructor, so
    /// the `type`, `title`, `status`, `detail` and `error` members always
    /// agree with `kind`.
    pub fn new(kind: ProblemKind, detail: String) -> Self {
        let name = kind.name();
        Problem {
            kind,
            problem_type: format!("urn:idemgate:problem:{name}"),
            title: kind.title(),
            status: kind.status().as_u16(),
            error: Some(ErrorEnvelope {
                error_type: ErrorEnvelope::TYPE,
                code: name.to_string(),
                message: detail.clone(),
            }),
            detail,
            operation_id: None,
            state: None,
            retry_after: None,
        }
    }

    /// The answer as idemgate's own profile renders it.
    pub(crate) fn into_response(self) -> Response<ProxyBody> {
        self.into_response_as(Profile::Idemgate.wire())
    }

    /// The answer as `wire`'s profile renders it (docs/profiles.md): its
    /// status, body shape, error code and headers; the problem's detail,
    /// operation and state whatever the shape.
    pub(crate) fn into_response_as(mut self, wire: &Wire) -> Response<ProxyBody> {
        let decided = wire.decide(self.kind.name(), self.status);
        let retry_after = decided.retry_after.or(self.retry_after);
        // Refused outright, or about no operation of its own (a rotated
        // key's refusal names the identical operation held, another id's):
        // not taken as repeatable.
        let rejected = matches!(
            self.kind,
            ProblemKind::KeyReused | ProblemKind::PossibleDuplicate
        ) || self.operation_id.is_none();
        let envelope = || {
            serde_json::json!({
                "type": decided.error_type,
                "code": decided.code,
                "message": self.detail,
            })
        };
        let (content_type, body) = match wire.body {
            BodyShape::Problem { error_member } => {
                self.status = decided.status;
                self.title = decided.title.unwrap_or(self.title);
                self.error = error_member.then(|| ErrorEnvelope {
                    error_type: decided.error_type,
                    code: decided.code.clone(),
                    message: self.detail.clone(),
                });
                ("application/problem+json", serde_json::to_vec(&self))
            }
            BodyShape::StripeError => (
                "application/json",
                serde_json::to_vec(&serde_json::json!({ "error": envelope() })),
            ),
            BodyShape::Flat => ("application/json", serde_json::to_vec(&envelope())),
            BodyShape::CodeContent => (
                "application/json",
                serde_json::to_vec(&serde_json::json!({
                    "code": decided.code,
                    "content": self.detail,
                })),
            ),
        };
        let mut response = Response::new(full(body.unwrap_or_default()));
        *response.status_mut() =
            StatusCode::from_u16(decided.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        if let Some(seconds) = retry_after {
            headers.insert(RETRY_AFTER, seconds.into());
        }
        for (name, value) in decided.headers {
            headers.insert(*name, HeaderValue::from_static(value));
        }
        if wire.repeatability_result {
            let result = if rejected { "rejected" } else { "accepted" };
            headers.insert(REPEATABILITY_RESULT, HeaderValue::from_static(result));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    use ProblemKind::*;

    /// Every kind and what it must answer, written out apart from the
    /// mapping (each [`UnknownSince`] once).
    const CASES: [(ProblemKind, u16, &str); 47] = [
        (NoRoute, 404, "no-route"),
        (MisdirectedAdminCall, 421, "misdirected-admin-call"),
        (InvalidPath, 400, "invalid-path"),
        (InvalidHost, 400, "invalid-host"),
        (InvalidHeader, 400, "invalid-header"),
        (
            UnsupportedTransferCoding,
            501,
            "unsupported-transfer-coding",
        ),
        (UnsupportedMethod, 501, "unsupported-method"),
        (HeadersTooLarge, 431, "headers-too-large"),
        (UnknownOperation, 404, "unknown-operation"),
        (MissingKey, 400, "missing-key"),
        (InvalidKey, 400, "invalid-key"),
        (MissingScope, 400, "missing-scope"),
        (FirstSentTooOld, 412, "first-sent-too-old"),
        (BodyTooLarge, 413, "body-too-large"),
        (BodyTimeout, 408, "body-timeout"),
        (InvalidBody, 400, "invalid-body"),
        (KeyReused, 422, "key-reused"),
        (RequestInProgress, 409, "request-in-progress"),
        (PossibleDuplicate, 409, "possible-duplicate"),
        (
            OutcomeUnknown(UnknownSince::Earlier),
            409,
            "outcome-unknown",
        ),
        (
            OutcomeUnknown(UnknownSince::Timeout),
            504,
            "outcome-unknown",
        ),
        (OutcomeUnknown(UnknownSince::Broken), 502, "outcome-unknown"),
        (ResponseNotStored, 409, "response-not-stored"),
        (AttemptNotMade, 503, "attempt-not-made"),
        (RoutePaused, 503, "route-paused"),
        (QuotaExceeded, 429, "quota-exceeded"),
        (StoreUnavailable, 503, "store-unavailable"),
        (StoreUnreadable, 500, "store-unreadable"),
        (LeaseLost, 503, "lease-lost"),
        (UpstreamUnreachable, 502, "upstream-unreachable"),
        (UpstreamTimeout, 504, "upstream-timeout"),
        (UpstreamFailed, 502, "upstream-failed"),
        (Overloaded, 503, "overloaded"),
        (Draining, 503, "draining"),
        (Internal, 500, "internal"),
        (Unauthorized, 401, "unauthorized"),
        (AdminTokenUnset, 401, "admin-token-unset"),
        (NotResolvable, 409, "not-resolvable"),
        (AttemptMayStillLand, 409, "attempt-may-still-land"),
        (OperationChanged, 409, "operation-changed"),
        (WrongAnswerKind, 409, "wrong-answer-kind"),
        (FoundAtDestination, 409, "found-at-destination"),
        (AmbiguousCredentials, 400, "ambiguous-credentials"),
        (InvalidCursor, 400, "invalid-cursor"),
        (InvalidRequest, 400, "invalid-request"),
        (InvalidResolution, 400, "invalid-resolution"),
        (MethodNotAllowed, 405, "method-not-allowed"),
    ];

    #[tokio::test]
    async fn each_kind_answers_its_status_and_type_as_problem_json() {
        for (kind, status, name) in CASES {
            assert_eq!(kind.status().as_u16(), status, "{kind:?}");
            assert_eq!(kind.name(), name, "{kind:?}");
            assert!(!kind.title().is_empty(), "{kind:?}");
            let response = Problem::new(kind, "why".into()).into_response();
            assert_eq!(response.status().as_u16(), status, "{kind:?}");
            assert_eq!(
                response.headers()[CONTENT_TYPE],
                "application/problem+json",
                "{kind:?}"
            );
            let body = response.into_body().collect().await.unwrap().to_bytes();
            let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(
                json,
                serde_json::json!({
                    "type": format!("urn:idemgate:problem:{name}"),
                    "title": kind.title(),
                    "status": status,
                    "detail": "why",
                    "error": {"type": "idempotency_error", "code": name, "message": "why"},
                }),
                "{kind:?}"
            );
        }
    }

    #[test]
    fn only_outcome_unknown_shares_its_name_and_every_kind_is_listed_once() {
        for (i, (a, ..)) in CASES.iter().enumerate() {
            for (b, ..) in &CASES[i + 1..] {
                assert_ne!(a, b, "listed twice");
                let both_unknown = matches!((a, b), (OutcomeUnknown(_), OutcomeUnknown(_)));
                assert_eq!(a.name() == b.name(), both_unknown, "{a:?} {b:?}");
            }
        }
    }

    #[test]
    fn a_store_failure_is_503_unless_the_store_holds_what_must_not_be_used() {
        let down = StoreError::Busy("x".into());
        assert_eq!(ProblemKind::of_store(&down), ProblemKind::StoreUnavailable);
        let corrupt = StoreError::Corrupt("x".into());
        assert_eq!(
            ProblemKind::of_store(&corrupt),
            ProblemKind::StoreUnavailable
        );
        let unreadable = StoreError::Seal(idemgate_store::SealError::Unreadable {
            operation: "op".into(),
            field: "response_body",
            reason: "altered".into(),
        });
        assert_eq!(
            ProblemKind::of_store(&unreadable),
            ProblemKind::StoreUnreadable
        );
    }

    #[test]
    fn a_retry_after_is_a_header_not_a_member() {
        let problem = Problem {
            retry_after: Some(7),
            ..Problem::new(ProblemKind::Overloaded, "busy".into())
        };
        let response = problem.into_response();
        assert_eq!(response.headers()[RETRY_AFTER], "7");
    }

    #[test]
    fn every_body_keeps_rfc_9457_and_adds_the_error_member() {
        let problem = Problem::new(
            ProblemKind::Unauthorized,
            "a bearer token is required".into(),
        );
        assert_eq!(
            serde_json::to_value(&problem).unwrap(),
            serde_json::json!({
                "type": "urn:idemgate:problem:unauthorized",
                "title": "Unauthorized",
                "status": 401,
                "detail": "a bearer token is required",
                "error": {
                    "type": "idempotency_error",
                    "code": "unauthorized",
                    "message": "a bearer token is required",
                },
            })
        );
    }
}
