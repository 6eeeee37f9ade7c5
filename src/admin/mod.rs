//! The admin listener (`admin_listen`), kept apart from the proxy so
//! operators' tools never share a port with automations.
//!
//! Routes:
//! - `GET /healthz` — 200 while the process serves (no token, no payload data);
//! - `GET /readyz` — 200 when the store answers, 503 `store-unavailable` otherwise.
//!
//! Anything else is 404 `no-route`.

use std::sync::Arc;

use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Method, Request, Response, StatusCode};

use crate::body::{ProxyBody, full};
use crate::store::Store;

/// Answers one admin request.
pub async fn handle<B>(store: Arc<dyn Store>, request: Request<B>) -> Response<ProxyBody> {
    match (request.method(), request.uri().path()) {
        (&Method::GET, "/healthz") => json(StatusCode::OK, r#"{"status":"ok"}"#),
        (&Method::GET, "/readyz") => match store.ping().await {
            Ok(()) => json(StatusCode::OK, r#"{"status":"ready"}"#),
            Err(source) => crate::problem::ProxyError::StoreUnavailable { source }.into_response(),
        },
        _ => crate::problem::ProxyError::NoRoute {
            path: request.uri().path().to_string(),
        }
        .into_response(),
    }
}

fn json(status: StatusCode, body: &'static str) -> Response<ProxyBody> {
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
