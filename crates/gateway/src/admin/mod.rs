//! The admin listener (`admin_listen`), kept apart from the proxy so
//! operators' tools never share a port with automations.
//!
//! Routes (JSON unless said otherwise):
//! - `GET /`, `GET /console.css`, `GET /console.js` — the operator console
//!   (`console.rs`): static files, no token; the page calls the routes below.
//! - `GET /livez` (and `GET /healthz`, its older name) — 200 while the
//!   process serves, draining included; no token, no payload data.
//! - `GET /readyz` — 200 when the store answers; 503 `store-unavailable`
//!   when it does not within 900 ms (whatever the store does, the probe
//!   answers within a second), and 503 `draining` from the moment a
//!   shutdown starts
//!   (the listener keeps answering until the proxy has drained, so a load
//!   balancer sees the gateway leave before its connections are refused);
//!   no token.
//! - `GET /metrics` — Prometheus text, every metric `idemgate_*`; no token;
//!   always 200: without the store, its gauges are left out and
//!   `idemgate_store_up` is 0.
//! - `GET /admin/keys?state=&route=&key=&limit=&cursor=` — operation
//!   summaries, newest first, `{"items": […], "next_cursor": …}`.
//! - `GET /admin/keys/{id}` — one operation with evidence, next action,
//!   request summary, response status and its event timeline.
//! - `POST /admin/keys/{id}/resolve` — an operator settles a held operation.
//! - `GET /admin/stats` — counts by state and route, oldest `unknown` age,
//!   every configured route with its pause (reason, and who set it), then
//!   every route no longer configured whose pause or operations the store
//!   still holds, marked `"configured": false`.
//! - `POST /admin/routes/{name}/pause`, `POST /admin/routes/{name}/resume`.
//! - `GET /admin/openapi.json` — the OpenAPI 3.1 description of these routes.
//!
//! Path segments are matched percent-decoded (`/admin/keys/%2E` is the id
//! `.`). Every `/admin/*` route needs `Authorization: Bearer <token>` ([`auth`]);
//! errors are problem+json ([`AdminError`]), and nothing here ever shows
//! credentials: scopes are hashes and are not shown at all.

pub mod auth;
mod console;
mod keys;

pub use keys::Resolution;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use percent_encoding::percent_decode_str;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::body::{ProxyBody, declared_length, full};
use crate::metrics::Metrics;
use crate::pipeline::Proxy;
use crate::problem::{Problem, ProblemKind};
use idemgate_model::clock::Clock;
use idemgate_model::operation::State;
use idemgate_store::{Store, StoreError};

/// Admin request bodies (a resolution with the response to replay) are
/// bounded like a stored response plus room for the envelope; a declared
/// length over it is refused before `100 Continue`.
const MAX_ADMIN_BODY: usize = 4 * 1024 * 1024;

/// The longest `/readyz` waits for the store before it answers 503.
const READY_WITHIN: Duration = Duration::from_millis(900);

/// What the admin handlers share.
pub struct Admin {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) proxy: Arc<Proxy>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) token: auth::AdminToken,
    /// How long a client may take to send a request body: the listener's
    /// `header_read_timeout`, since admin bodies are small.
    pub(crate) body_timeout: Duration,
    /// Cancelled when the gateway starts draining: `/readyz` says 503 from then on.
    pub(crate) draining: CancellationToken,
}

/// Why an admin request failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("a valid `Authorization: Bearer <token>` is required")]
    Unauthorized,
    #[error(
        "no admin token is configured: set the environment variable {variable} (named by `server.admin_token_env`) to a secret and restart idemgate"
    )]
    TokenUnset { variable: String },
    #[error("no such {0}")]
    NotFound(&'static str),
    #[error("no route named `{0}`")]
    NoRoute(String),
    #[error(
        "operation {id} is {state} and cannot be resolved: only unknown operations, or in-progress ones whose gateway died, can be"
    )]
    NotResolvable { id: String, state: &'static str },
    /// A `not_attempted` resolution while the held attempt's exchange may
    /// still land at the destination (its `late_window`): the next attempt
    /// it would let through could make the write twice.
    #[error(
        "attempt {attempt} may still land at the destination until {} (the route's late_window after it was last on its way): a destination that shows nothing yet may still make the write, and a retry let through now could make it twice. Resolve it as not_attempted after that time, or as completed now if it happened",
        idemgate_model::clock::rfc3339(*until)
    )]
    AttemptMayStillLand {
        attempt: u32,
        until: i64,
        /// From now to `until`, for `Retry-After`.
        wait: Duration,
    },
    /// A resolution decided on `decided` (its `attempt`) while the
    /// operation is at `attempt` now: a retry was let through since, and
    /// what the operator checked says nothing about the attempt now held.
    #[error(
        "operation {id} is at attempt {attempt} ({state}) now, not at attempt {decided} that the resolution was decided on: {}. Read it again and check attempt {attempt} at the destination before resolving it",
        if decided > attempt { "there has been no such attempt" } else { "a retry was forwarded since" }
    )]
    OperationChanged {
        id: String,
        decided: u32,
        attempt: u32,
        state: &'static str,
    },
    /// A `not_attempted` resolution of an operation a probe found at the
    /// destination more than once: it happened, and a retry let through
    /// would make it once more.
    #[error(
        "a reconcile probe found operation {id} at the destination more than once: it happened (twice or more), so it cannot be resolved as not_attempted, which would let a retry make it once more. Undo the duplicates at the destination, then resolve it as completed"
    )]
    FoundAtDestination { id: String },
    /// A resolution whose answer is not the kind the operation's route
    /// replays: an MCP tool call takes a tool `result`, any other route's
    /// write an HTTP `response` (or neither). 409, not 400: the body is
    /// valid, it is the operation that rules it out.
    #[error("{0}")]
    WrongAnswerKind(String),
    /// RFC 6750 §3.1: a request that "uses more than one method for
    /// including an access token" is malformed (400 `invalid_request`), not
    /// unauthenticated; and which line a proxy in front would pick is
    /// anyone's guess, so none is picked.
    #[error(
        "the request has {count} `Authorization` headers: send exactly one, `Authorization: Bearer <token>`"
    )]
    AmbiguousCredentials { count: usize },
    #[error(
        "`cursor` must be a `next_cursor` this API returned (an operation id), passed back unchanged"
    )]
    InvalidCursor,
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    InvalidResolution(String),
    #[error("the request body is larger than {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error("the request body did not arrive within {}", humantime::format_duration(*after))]
    BodyTimeout { after: Duration },
    #[error(
        "the gateway is shutting down: it finishes the requests it has and takes no new connections"
    )]
    Draining,
    #[error("{method} is not allowed here; this path accepts {allow}")]
    MethodNotAllowed { method: Method, allow: &'static str },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl AdminError {
    /// Which problem this error is (`ProblemKind` gives its status,
    /// name and title, the same as the proxy's for the same kind).
    pub(crate) fn kind(&self) -> ProblemKind {
        match self {
            AdminError::Unauthorized => ProblemKind::Unauthorized,
            AdminError::TokenUnset { .. } => ProblemKind::AdminTokenUnset,
            AdminError::NotFound(_) => ProblemKind::UnknownOperation,
            AdminError::NoRoute(_) => ProblemKind::NoRoute,
            AdminError::NotResolvable { .. } => ProblemKind::NotResolvable,
            AdminError::AttemptMayStillLand { .. } => ProblemKind::AttemptMayStillLand,
            AdminError::OperationChanged { .. } => ProblemKind::OperationChanged,
            AdminError::WrongAnswerKind(_) => ProblemKind::WrongAnswerKind,
            AdminError::FoundAtDestination { .. } => ProblemKind::FoundAtDestination,
            AdminError::AmbiguousCredentials { .. } => ProblemKind::AmbiguousCredentials,
            AdminError::InvalidCursor => ProblemKind::InvalidCursor,
            AdminError::BadRequest(_) => ProblemKind::InvalidRequest,
            AdminError::InvalidResolution(_) => ProblemKind::InvalidResolution,
            AdminError::BodyTooLarge { .. } => ProblemKind::BodyTooLarge,
            AdminError::BodyTimeout { .. } => ProblemKind::BodyTimeout,
            AdminError::MethodNotAllowed { .. } => ProblemKind::MethodNotAllowed,
            AdminError::Draining => ProblemKind::Draining,
            AdminError::Store(error) => ProblemKind::of_store(error),
        }
    }

    pub fn problem(&self) -> Problem {
        Problem::new(self.kind(), self.to_string())
    }

    fn into_response(self) -> Response<ProxyBody> {
        let mut response = self.problem().into_response();
        match &self {
            AdminError::Unauthorized | AdminError::TokenUnset { .. } => {
                response.headers_mut().insert(
                    http::header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer"),
                );
            }
            AdminError::AmbiguousCredentials { .. } => {
                response.headers_mut().insert(
                    http::header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer error=\"invalid_request\""),
                );
            }
            AdminError::AttemptMayStillLand { wait, .. } => {
                let seconds = wait.as_millis().div_ceil(1000).max(1);
                response
                    .headers_mut()
                    .insert(http::header::RETRY_AFTER, HeaderValue::from(seconds as u64));
            }
            // RFC 9110: a 405 lists the methods the path does accept.
            AdminError::MethodNotAllowed { allow, .. } => {
                response
                    .headers_mut()
                    .insert(http::header::ALLOW, HeaderValue::from_static(allow));
            }
            _ => {}
        }
        response
    }
}

/// Answers one admin request. Every answer, operations' data and errors
/// alike, is one no cache keeps (an operator's browser, a proxy in front
/// of the console) and no browser reads as another type.
pub async fn handle(admin: Arc<Admin>, request: Request<Incoming>) -> Response<ProxyBody> {
    let mut response = route(&admin, request)
        .await
        .unwrap_or_else(AdminError::into_response);
    let headers = response.headers_mut();
    headers
        .entry(http::header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    headers
        .entry(http::header::X_CONTENT_TYPE_OPTIONS)
        .or_insert(HeaderValue::from_static("nosniff"));
    response
}

/// An admin path, recognised apart from its method so that a wrong method
/// is answered with the one the path accepts (`Allow`).
enum Endpoint<'a> {
    Console(&'static console::Asset),
    Livez,
    Readyz,
    Metrics,
    ListKeys,
    ShowKey(&'a str),
    Resolve(&'a str),
    Stats,
    /// A route's name and `pause` or `resume`.
    Pause(&'a str, &'a str),
    OpenApi,
}

impl<'a> Endpoint<'a> {
    /// The endpoint that decoded `segments` name, if any.
    fn parse(segments: &[&'a str]) -> Option<Self> {
        if let [name] = segments
            && let Some(asset) = console::asset(name)
        {
            return Some(Endpoint::Console(asset));
        }
        Some(match segments {
            ["livez" | "healthz"] => Endpoint::Livez,
            ["readyz"] => Endpoint::Readyz,
            ["metrics"] => Endpoint::Metrics,
            ["admin", "keys"] => Endpoint::ListKeys,
            ["admin", "keys", id] => Endpoint::ShowKey(id),
            ["admin", "keys", id, "resolve"] => Endpoint::Resolve(id),
            ["admin", "stats"] => Endpoint::Stats,
            ["admin", "routes", name, action @ ("pause" | "resume")] => {
                Endpoint::Pause(name, action)
            }
            ["admin", "openapi.json"] => Endpoint::OpenApi,
            _ => return None,
        })
    }

    /// Whether this endpoint changes something (POST); the others read
    /// (GET, and HEAD alike: hyper sends no body for it).
    fn writes(&self) -> bool {
        matches!(self, Endpoint::Resolve(_) | Endpoint::Pause(..))
    }

    /// The methods this endpoint accepts, as `Allow` lists them.
    fn allow(&self) -> &'static str {
        if self.writes() { "POST" } else { "GET, HEAD" }
    }

    fn allows(&self, method: &Method) -> bool {
        if self.writes() {
            method == Method::POST
        } else {
            method == Method::GET || method == Method::HEAD
        }
    }
}

async fn route(
    admin: &Admin,
    request: Request<Incoming>,
) -> Result<Response<ProxyBody>, AdminError> {
    let path = request.uri().path().to_string();
    // Segments are matched decoded: `idemgate keys` (and any client)
    // percent-encodes an id as one URL component, `.` as `%2E` included. A
    // segment that is not UTF-8 once decoded names nothing that exists.
    let decoded: Vec<_> = path
        .trim_start_matches('/')
        .split('/')
        .map(|segment| percent_decode_str(segment).decode_utf8_lossy())
        .collect();
    let segments: Vec<&str> = decoded.iter().map(AsRef::as_ref).collect();
    // Probes and metrics are open; anything under `/admin/` needs the
    // token, even to learn that a path does not exist.
    if segments.first() == Some(&"admin") {
        admin.token.check(request.headers())?;
    }
    let endpoint = Endpoint::parse(&segments).ok_or_else(|| AdminError::NoRoute(path.clone()))?;
    if !endpoint.allows(request.method()) {
        return Err(AdminError::MethodNotAllowed {
            method: request.method().clone(),
            allow: endpoint.allow(),
        });
    }
    match endpoint {
        Endpoint::Console(asset) => Ok(console::response(asset)),
        Endpoint::Livez => Ok(alive()),
        Endpoint::Readyz => {
            if admin.draining.is_cancelled() {
                return Err(AdminError::Draining);
            }
            // A load balancer's probe has its own timeout, often a second:
            // a store that does not answer is a 503 within that, not a hang.
            let answered = tokio::time::timeout(READY_WITHIN, admin.store.ping()).await;
            answered.map_err(|_| {
                StoreError::Busy(format!(
                    "the store did not answer within {} ms",
                    READY_WITHIN.as_millis()
                ))
            })??;
            Ok(json_response(StatusCode::OK, &json!({ "status": "ready" })))
        }
        Endpoint::Metrics => {
            // Never a 503: without the store the counters still go out.
            let read = admin.metrics.read_store(admin.store.clone()).await;
            if let Err(why) = &read {
                tracing::warn!(error = %why, "/metrics: the store's gauges are left out");
            }
            let text = admin
                .metrics
                .render(read.as_ref().ok(), admin.clock.now_millis());
            let mut response = Response::new(full(text));
            response.headers_mut().insert(
                CONTENT_TYPE,
                // What prometheus-client writes (`# EOF`, counters typed
                // by their family name): labelled as the Prometheus text
                // format, its counters were read untyped.
                HeaderValue::from_static(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
            );
            Ok(response)
        }
        Endpoint::ListKeys => keys::list(admin, request.uri().query()).await,
        Endpoint::ShowKey(id) => keys::show(admin, id, request.uri().query()).await,
        Endpoint::Resolve(id) => {
            let body = read_body(request, admin.body_timeout).await?;
            keys::resolve(admin, id, &body).await
        }
        Endpoint::Stats => stats(admin).await,
        Endpoint::Pause(name, action) => {
            let body = read_body(request, admin.body_timeout).await?;
            pause(admin, name, action, &body).await
        }
        Endpoint::OpenApi => Ok(openapi()),
    }
}

/// The liveness probe's answer: the process serves.
pub(crate) fn alive() -> Response<ProxyBody> {
    json_response(StatusCode::OK, &json!({ "status": "ok" }))
}

/// Whether `request` is the liveness probe (`GET /livez`, or `/healthz`,
/// its older name), which the admin listener answers even over its
/// connection cap: a probe that failed there would restart a gateway that
/// is only busy.
pub(crate) fn is_liveness_probe<B>(request: &Request<B>) -> bool {
    matches!(*request.method(), Method::GET | Method::HEAD)
        && matches!(request.uri().path(), "/livez" | "/healthz")
}

/// A request's body, whole: at most [`MAX_ADMIN_BODY`] (a declared length
/// over it is refused unread) and within `timeout`.
async fn read_body(request: Request<Incoming>, timeout: Duration) -> Result<Bytes, AdminError> {
    let limit = MAX_ADMIN_BODY;
    if declared_length(request.headers()).is_some_and(|n| n > limit as u64) {
        return Err(AdminError::BodyTooLarge { limit });
    }
    let collected =
        tokio::time::timeout(timeout, Limited::new(request.into_body(), limit).collect())
            .await
            .map_err(|_| AdminError::BodyTimeout { after: timeout })?;
    match collected {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => {
            Err(AdminError::BodyTooLarge { limit })
        }
        Err(error) => Err(AdminError::BadRequest(format!(
            "the request body could not be read: {error}"
        ))),
    }
}

pub(crate) fn json_response(status: StatusCode, body: &Value) -> Response<ProxyBody> {
    let mut response = Response::new(full(body.to_string()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// A request body that must be a JSON object, as `T`. serde's derived
/// structs also read their members in order from an array
/// (`["completed", "ann"]`), which no client means.
pub(crate) fn json_object<T: serde::de::DeserializeOwned>(
    body: &[u8],
) -> Result<T, serde_json::Error> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let value = object(&mut deserializer)?;
    deserializer.end()?;
    Ok(value)
}

/// `T` read from a JSON object only, member by member as written: not
/// through a `serde_json::Map`, which would sort the members and keep one
/// of a repeated name (the headers of a resolution's response keep their
/// order and repeats).
pub(crate) fn object<'de, T, D>(deserializer: D) -> Result<T, D::Error>
where
    T: serde::Deserialize<'de>,
    D: serde::Deserializer<'de>,
{
    struct Object<T>(std::marker::PhantomData<T>);
    impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for Object<T> {
        type Value = T;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(self, members: A) -> Result<T, A::Error> {
            T::deserialize(serde::de::value::MapAccessDeserializer::new(members))
        }
    }
    deserializer.deserialize_map(Object(std::marker::PhantomData))
}

/// `GET /admin/stats`.
async fn stats(admin: &Admin) -> Result<Response<ProxyBody>, AdminError> {
    let stats = admin.store.stats().await?;
    let states = [
        State::InProgress,
        State::Completed,
        State::Unknown,
        State::NotAttempted,
    ];
    let zeros = || {
        states
            .iter()
            .map(|s| (s.as_str().to_string(), json!(0)))
            .collect::<serde_json::Map<_, _>>()
    };
    let mut totals = zeros();
    let mut by_route = serde_json::Map::new();
    for (route, state, count) in &stats.counts {
        let per_route = by_route
            .entry(route.clone())
            .or_insert_with(|| Value::Object(zeros()));
        per_route[state.as_str()] = json!(count);
        let total = totals[state.as_str()].as_u64().unwrap_or(0);
        totals[state.as_str()] = json!(total + count);
    }
    let now = admin.clock.now_millis();
    let oldest = stats
        .oldest_unknown_since
        .map(|since| (now - since).max(0) as f64 / 1000.0);
    let pauses = admin.store.pauses().await?;
    let paused: Vec<&str> = pauses.iter().map(|p| p.route.as_str()).collect();
    // A route's entry; `path_prefix` is `None` for one no longer configured.
    let entry = |name: &str, path_prefix: Option<&str>| {
        let pause = pauses.iter().find(|p| p.route == name);
        json!({
            "name": name,
            "configured": path_prefix.is_some(),
            "path_prefix": path_prefix,
            "paused": pause.is_some(),
            "reason": pause.map(|p| &p.reason),
            "paused_by": pause.map(|p| p.by.as_str()),
        })
    };
    // A route renamed or removed from the file keeps its pause (until it
    // is resumed under its old name) and its operations: listed too, or
    // the pause that `idemgate_route_paused` reports is shown nowhere.
    let unconfigured: BTreeSet<&str> = paused
        .iter()
        .copied()
        .chain(by_route.keys().map(String::as_str))
        .filter(|name| !admin.proxy.routes().any(|route| route.name == *name))
        .collect();
    let routes: Vec<Value> = admin
        .proxy
        .routes()
        .map(|route| entry(&route.name, Some(&route.path_prefix)))
        .chain(unconfigured.into_iter().map(|name| entry(name, None)))
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "operations": totals,
            "by_route": by_route,
            "oldest_unknown_age_seconds": oldest,
            "paused_routes": paused,
            "routes": routes,
            "replication": stats.replication.as_ref().map(|r| json!({
                "in_recovery": r.in_recovery,
                "synchronous_standby_names": r.synchronous_standby_names,
                "synchronous_standbys": r.synchronous_standbys,
                "synchronous_standby_required": r.required,
            })),
        }),
    ))
}

/// What a pause or resume may carry besides nothing. Anything else is
/// refused: a misspelt member would otherwise pause a route for no stated
/// reason without a word.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PauseBody {
    reason: Option<String>,
}

/// The longest pause reason, in characters: it is stored, shown on
/// `/admin/stats` and sent in every `route-paused` alert.
const MAX_REASON_CHARS: usize = 400;

/// `POST /admin/routes/{name}/pause|resume`, with an optional
/// `{"reason": "…"}` for a pause (a resume has nowhere to keep one, so it
/// is refused rather than dropped).
async fn pause(
    admin: &Admin,
    name: &str,
    action: &str,
    body: &[u8],
) -> Result<Response<ProxyBody>, AdminError> {
    let reason = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        json_object::<PauseBody>(body)
            .map_err(|e| AdminError::BadRequest(format!("the body is not {{\"reason\": …}}: {e}")))?
            .reason
    };
    if let Some(reason) = &reason {
        if action == "resume" {
            return Err(AdminError::BadRequest(
                "a resume takes no reason: send an empty body (or {})".into(),
            ));
        }
        if reason.chars().count() > MAX_REASON_CHARS || reason.chars().any(char::is_control) {
            return Err(AdminError::BadRequest(format!(
                "`reason` is at most {MAX_REASON_CHARS} characters, none a control character"
            )));
        }
    }
    let reason =
        (action == "pause").then(|| reason.unwrap_or_else(|| "paused by an operator".into()));
    if !admin.proxy.set_paused(name, reason.as_deref()).await? {
        return Err(AdminError::NoRoute(name.to_string()));
    }
    tracing::warn!(route = ?name, action, "route {action}d by an operator");
    Ok(json_response(
        StatusCode::OK,
        &json!({ "route": name, "paused": reason.is_some(), "reason": reason }),
    ))
}

/// `GET /admin/openapi.json`.
fn openapi() -> Response<ProxyBody> {
    let mut response = Response::new(full(OPENAPI));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// The OpenAPI 3.1 description of the admin API; a test calls every route
/// it lists, so it stays true.
pub const OPENAPI: &str = include_str!("openapi.json");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_operation_says_whether_the_attempt_ever_was() {
        let changed = |decided| {
            AdminError::OperationChanged {
                id: "a".into(),
                decided,
                attempt: 2,
                state: "unknown",
            }
            .to_string()
        };
        assert!(changed(1).contains("a retry was forwarded since"));
        assert!(changed(3).contains("there has been no such attempt"));
    }

    #[test]
    fn each_admin_error_maps_to_its_status_and_name() {
        let cases = [
            (AdminError::Unauthorized, 401, "unauthorized"),
            (
                AdminError::TokenUnset {
                    variable: "V".into(),
                },
                401,
                "admin-token-unset",
            ),
            (AdminError::NotFound("operation"), 404, "unknown-operation"),
            (AdminError::NoRoute("x".into()), 404, "no-route"),
            (
                AdminError::NotResolvable {
                    id: "a".into(),
                    state: "completed",
                },
                409,
                "not-resolvable",
            ),
            (
                AdminError::OperationChanged {
                    id: "a".into(),
                    decided: 1,
                    attempt: 2,
                    state: "unknown",
                },
                409,
                "operation-changed",
            ),
            (
                AdminError::WrongAnswerKind("x".into()),
                409,
                "wrong-answer-kind",
            ),
            (
                AdminError::FoundAtDestination { id: "a".into() },
                409,
                "found-at-destination",
            ),
            (AdminError::BadRequest("x".into()), 400, "invalid-request"),
            (
                AdminError::AmbiguousCredentials { count: 2 },
                400,
                "ambiguous-credentials",
            ),
            (AdminError::InvalidCursor, 400, "invalid-cursor"),
            (AdminError::BodyTooLarge { limit: 1 }, 413, "body-too-large"),
            (
                AdminError::BodyTimeout {
                    after: Duration::from_secs(1),
                },
                408,
                "body-timeout",
            ),
            (
                AdminError::InvalidResolution("x".into()),
                400,
                "invalid-resolution",
            ),
            (
                AdminError::MethodNotAllowed {
                    method: Method::PUT,
                    allow: "GET, HEAD",
                },
                405,
                "method-not-allowed",
            ),
            (
                AdminError::Store(StoreError::Corrupt("x".into())),
                503,
                "store-unavailable",
            ),
            (
                AdminError::Store(StoreError::Seal(idemgate_store::SealError::Unreadable {
                    operation: "op".into(),
                    field: "response_body",
                    reason: "altered".into(),
                })),
                500,
                "store-unreadable",
            ),
        ];
        for (error, status, name) in cases {
            let problem = error.problem();
            assert_eq!(problem.status, status, "{name}");
            assert_eq!(problem.problem_type, format!("urn:idemgate:problem:{name}"));
            assert_eq!(problem.detail, error.to_string(), "{name}");
            assert_eq!(problem.error.as_ref().unwrap().code, name);
            assert!(problem.operation_id.is_none() && problem.retry_after.is_none());
        }
    }

    #[test]
    fn admin_errors_answer_problem_json_with_their_challenge_or_allow() {
        let unauthorized = AdminError::Unauthorized.into_response();
        assert_eq!(unauthorized.status(), 401);
        assert_eq!(
            unauthorized.headers()[CONTENT_TYPE],
            "application/problem+json"
        );
        assert_eq!(
            unauthorized.headers()[http::header::WWW_AUTHENTICATE],
            "Bearer"
        );
        let wrong = AdminError::MethodNotAllowed {
            method: Method::PUT,
            allow: "POST",
        }
        .into_response();
        assert_eq!(wrong.status(), 405);
        assert_eq!(wrong.headers()[http::header::ALLOW], "POST");
        let down = AdminError::Store(StoreError::Closed).into_response();
        assert_eq!(down.status(), 503);
        assert!(down.headers().get(http::header::RETRY_AFTER).is_none());
    }

    #[test]
    fn the_openapi_document_is_json_and_lists_every_admin_route() {
        let doc: Value = serde_json::from_str(OPENAPI).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        let paths = doc["paths"].as_object().unwrap();
        for path in [
            "/admin/keys",
            "/admin/keys/{id}",
            "/admin/keys/{id}/resolve",
            "/admin/stats",
            "/admin/routes/{name}/pause",
            "/admin/routes/{name}/resume",
            "/admin/openapi.json",
            "/healthz",
            "/livez",
            "/readyz",
            "/metrics",
        ] {
            assert!(paths.contains_key(path), "{path}");
        }
    }

    #[test]
    fn every_link_in_the_openapi_document_names_an_operation_and_its_parameters() {
        let doc: Value = serde_json::from_str(OPENAPI).unwrap();
        let operations: Vec<&Value> = doc["paths"]
            .as_object()
            .unwrap()
            .values()
            .flat_map(|item| item.as_object().unwrap().values())
            .collect();
        let by_id = |id: &str| {
            operations
                .iter()
                .find(|op| op["operationId"] == id)
                .unwrap_or_else(|| panic!("no operation {id}"))
        };
        let mut links = 0;
        for operation in &operations {
            for response in operation["responses"].as_object().unwrap().values() {
                let Some(named) = response.get("links").and_then(Value::as_object) else {
                    continue;
                };
                for (name, link) in named {
                    let target = by_id(link["operationId"].as_str().unwrap());
                    for parameter in link["parameters"].as_object().unwrap().keys() {
                        let declared = target["parameters"]
                            .as_array()
                            .is_some_and(|ps| ps.iter().any(|p| p["name"] == parameter.as_str()));
                        assert!(declared, "link {name}: no parameter {parameter}");
                    }
                    links += 1;
                }
            }
        }
        assert!(links >= 4, "only {links} links");
    }
}
