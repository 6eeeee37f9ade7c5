//! The RFC 9457 problem body (`application/problem+json`, `type` =
//! `urn:idemgate:problem:<name>`) that every answer idemgate gives itself is
//! rendered as, on both listeners: the proxy's errors
//! (`pipeline::error::ProxyError`) and the admin API's.
//!
//! Invariant: every body is built by [`Problem::new`] and so carries the
//! `error` extension member ([`ErrorEnvelope`]) with the same name and
//! detail; which problem an error is gets decided by its own layer's one
//! mapping, never here. This module knows bodies, not errors, so it imports
//! neither the pipeline nor the admin API that render through it.

use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};
use serde::Serialize;

use crate::body::{ProxyBody, full};

/// An RFC 9457 problem body.
#[derive(Debug, Serialize)]
pub struct Problem {
    #[serde(rename = "type")]
    pub problem_type: String,
    pub title: &'static str,
    pub status: u16,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<&'static str>,
    /// An extension member (RFC 9457 §3.2) for Stripe-style SDKs, which
    /// raise only when a body carries an `error` object: without it
    /// stripe-node resolves a held 409 as if it were the created resource,
    /// and the automation believes a write happened whose outcome is unknown.
    pub error: ErrorEnvelope,
    /// Seconds for the `Retry-After` header, not a member of the body.
    #[serde(skip)]
    pub retry_after: Option<u32>,
}

/// The `error` member: `{"type": "idempotency_error", "code": <problem
/// name>, "message": <detail>}`, the envelope Stripe-style SDKs read.
#[derive(Debug, Serialize)]
pub struct ErrorEnvelope {
    /// Always [`ErrorEnvelope::TYPE`]: every problem idemgate answers is
    /// about whether (and how) a write may be sent, never about the
    /// upstream's own business errors, which pass through untouched.
    #[serde(rename = "type")]
    pub error_type: &'static str,
    /// The problem name, as in `urn:idemgate:problem:<name>`.
    pub code: String,
    /// The problem's `detail`.
    pub message: String,
}

impl ErrorEnvelope {
    /// The error type SDKs map to their idempotency error class.
    pub const TYPE: &'static str = "idempotency_error";
}

impl Problem {
    /// A problem that is not about an operation; the one constructor, so
    /// the `type`, `detail` and `error` members always agree.
    pub fn new(status: StatusCode, name: &str, title: &'static str, detail: String) -> Self {
        Problem {
            problem_type: format!("urn:idemgate:problem:{name}"),
            title,
            status: status.as_u16(),
            error: ErrorEnvelope {
                error_type: ErrorEnvelope::TYPE,
                code: name.to_string(),
                message: detail.clone(),
            },
            detail,
            operation_id: None,
            state: None,
            retry_after: None,
        }
    }

    pub fn into_response(self) -> Response<ProxyBody> {
        let body = serde_json::to_vec(&self).unwrap_or_default();
        let mut response = Response::new(full(body));
        *response.status_mut() =
            StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let headers = response.headers_mut();
        headers.insert(
            CONTENT_TYPE,
            http::HeaderValue::from_static("application/problem+json"),
        );
        if let Some(seconds) = self.retry_after {
            headers.insert(RETRY_AFTER, seconds.into());
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_body_keeps_rfc_9457_and_adds_the_error_member() {
        let problem = Problem::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "Unauthorized",
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
