//! Clients asking what became of their own operation:
//! `GET /.idemgate/operations/{key}` on the proxy listener (and `HEAD`, the
//! same answer without its body: hyper sends none for a HEAD), `{key}`
//! percent-encoded in either form the `Idempotency-Key` header accepts
//! (bare, or the sf-string `"…"`).
//!
//! Invariant: a client only ever sees operations in its own scope — the
//! lookup hashes the caller's scope headers per route exactly as a write
//! would, narrowed as the route's profile narrows a write's (the client
//! or account headers sent, `Repeatability-Client-ID`, `Stripe-Account`,
//! `Stripe-Context`; the write's path named by `?path=`) —
//! and never payloads: id, route, state, attempts, last update. A caller
//! with none of any route's scope headers has no operations: 404.

use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use percent_encoding::percent_decode_str;
use serde_json::json;
use std::sync::Arc;

use crate::body::{ProxyBody, full};
use crate::metrics::{OperationId, Outcome};
use crate::pipeline::ActiveRoute;
use crate::pipeline::error::ProxyError;
use crate::pipeline::key::{IdempotencyKey, KeyError, Scope};
use crate::request_path::{self, PathError};
use idemgate_model::clock::rfc3339;
use idemgate_store::Operators;
use idemgate_store::scope_key::ScopeKey;

/// The path prefix idemgate reserves for itself on the proxy listener.
pub const PREFIX: &str = "/.idemgate/";

/// Whether `path` may be a lookup's, so that logs and traces leave it out:
/// under [`PREFIX`], or spelling it otherwise in a path with no normal
/// form (`/%2Eidemgate/operations/…`).
pub fn names_a_lookup(path: &str) -> bool {
    path.contains(PREFIX) || path.contains("idemgate/operations/")
}

/// A path under [`PREFIX`] as logs and traces write it: a lookup's key
/// left out (`/.idemgate/operations/{key}`), as no line or span carries a
/// key, and anything else under the prefix left out likewise.
pub fn logged_path(path: &str) -> &'static str {
    match path.split_once(PREFIX).map(|(_, rest)| rest) {
        Some(rest) if rest.starts_with("operations/") => "/.idemgate/operations/{key}",
        _ => "/.idemgate/{…}",
    }
}

/// Answers a request under [`PREFIX`].
pub async fn lookup<B>(
    store: &dyn Operators,
    routes: &[Arc<ActiveRoute>],
    scope_key: &ScopeKey,
    request: &Request<B>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let path = request.uri().path();
    let key = path
        .strip_prefix(PREFIX)
        .and_then(|rest| rest.strip_prefix("operations/"))
        .filter(|_| matches!(*request.method(), Method::GET | Method::HEAD))
        .ok_or_else(|| ProxyError::NoRoute {
            path: path.to_string(),
        })?;
    let key = percent_decode_str(key)
        .decode_utf8()
        .map_err(|_| ProxyError::InvalidKey(KeyError::BadCharacter))?;
    // Parsed exactly as the header is: `"k1"` and `k1` are one key.
    let key = IdempotencyKey::parse(&key)?;
    let written_at = written_path(request.uri().query())?;
    let scopes: Vec<(String, String)> = routes
        .iter()
        .filter_map(|active| {
            let route = &active.route;
            let wire = route.profile.wire();
            // A route whose profile scopes a key by its endpoint (ACP, UCP) is
            // searched only when the lookup names the write's path.
            let path = match (wire.scope_path, written_at.as_deref()) {
                (true, None) => return None,
                (true, Some(path)) => path,
                (false, _) => "",
            };
            let scope = Scope::from_headers(
                request.headers(),
                &route.scope_headers,
                route.allow_anonymous,
                scope_key,
            )?
            .narrowed(wire, path, request.headers(), scope_key);
            Some(scope.map(|scope| (route.name.clone(), scope.as_str().to_string())))
        })
        .collect::<Result<_, KeyError>>()?;
    let found = store
        .find_newest(&scopes, key.as_str())
        .await
        .map_err(ProxyError::store)?
        .ok_or(ProxyError::UnknownOperation)?;
    let body = json!({
        "operation_id": found.id,
        "route": found.route,
        "state": found.state.as_str(),
        "attempts": found.attempt,
        "updated_at": rfc3339(found.updated_at),
    });
    let mut response = Response::new(full(body.to_string()));
    *response.status_mut() = StatusCode::OK;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response.extensions_mut().insert(Outcome::lookup);
    response.extensions_mut().insert(OperationId(found.id));
    Ok(response)
}

/// The `path` query parameter: the path a write was sent to, which an
/// ACP or UCP route's scope holds (docs/requests.md, "Asking what became of a
/// write"), percent-decoded once (it is a query value) and put in normal
/// form, as the write's own path was before its scope was made.
fn written_path(query: Option<&str>) -> Result<Option<String>, ProxyError> {
    let Some(value) = query
        .into_iter()
        .flat_map(|query| query.split('&'))
        .find_map(|pair| pair.strip_prefix("path="))
    else {
        return Ok(None);
    };
    let decoded = percent_decode_str(value)
        .decode_utf8()
        .map_err(|_| ProxyError::InvalidPath(PathError::Unrepresentable))?;
    Ok(Some(request_path::normal_form(&decoded)?.into_owned()))
}
