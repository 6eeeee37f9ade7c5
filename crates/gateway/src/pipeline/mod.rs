//! The life of a request, as phases in a fixed order, one module each:
//!
//! 0. [`path`]: the request path in normal form (RFC 3986 §6.2.2), rewritten
//!    in place, so everything after it — the reserved `/.idemgate/` prefix
//!    ([`status`]), routing, the fingerprint and the upstream's request line —
//!    sees one spelling; a path that has none → 400 `invalid-path`. [`host`]:
//!    the host likewise, one `host` header from `:authority` or `Host`
//!    whichever version brought it; a `Host` that disagrees with the
//!    authority → 400 `invalid-host`.
//! 1. [`route`]: longest `path_prefix`; none → 404 `no-route`; a path that
//!    another upstream's reading (`;` stripped, `%2F` decoded) puts on another
//!    route → 400 `invalid-path`. A method the route does not intercept is
//!    streamed through ([`forward::pass_through`]), unchanged but for its
//!    normalized path and hop-by-hop headers.
//! 2. [`key`]: the `Idempotency-Key` (or an assigned one) and the scope.
//! 3. body: read whole, bounded by `max_body` (413 before `100 Continue`)
//!    and by the bodies' shared [`budget`] (503 `overloaded`).
//! 4. [`fingerprint`]: what makes a retry "the same request".
//! 5. [`claim`]: one store transaction decides: send, replay, or refuse; a
//!    paused route or a scope over its [`quota`] only looks up what exists.
//! 6. [`forward`] + [`record`]: in a task of their own, so a client that hangs
//!    up never cancels the upstream call nor leaves the operation `in_progress`;
//!    upstream connections are made by [`connector`] and driven, from
//!    [`pool`], by the request that uses them; after a lost response
//!    ([`attempt`]) a route's [`reconcile`] probe may prove it happened; in
//!    `idemgate rehearse`'s own gateway alone, a [`drill`] breaks exchanges
//!    on purpose.
//! 7. [`replay`]: what a key that already has an operation gets; an `unknown`
//!    one on a route with a probe is probed again first ([`reconcile`]), and
//!    one the probe finds absent is claimed again and sent by this request.
//!
//! Errors from any phase are [`ProxyError`]s ([`error`]), mapped to a problem
//! in one place and rendered as an RFC 9457 body ([`crate::problem`]).

pub mod attempt;
pub mod budget;
pub mod claim;
pub mod connector;
pub mod drill;
pub mod error;
pub mod fingerprint;
pub mod forward;
pub mod host;
pub mod key;
pub mod mcp;
pub mod path;
pub mod pool;
pub mod quota;
pub mod reconcile;
pub mod record;
pub mod replay;
pub mod route;
pub mod sse;
pub mod status;
pub mod wire;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Method, Request, Response, request};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use sha2::{Digest, Sha256};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::access_log::{AccessLine, AccessLog};
use crate::body::{BoxError, ProxyBody, declared_length};
use crate::config::{Config, KeyMode, RotatedKeys, Route};
use crate::metrics::{Metrics, OperationId, Outcome, RouteSeries, StoreFailure};
use crate::profile::Profile;
use crate::tls::TlsError;
use crate::traces::{self, Step, Tracing};
use attempt::Attempt;
use budget::{BodyBudget, BudgetSpent, Reservation};
use claim::{Claimed, Hold, InFlight};
use error::ProxyError;
use fingerprint::{ExactDigest, FingerprintInput};
use forward::{Peer, ProbeClient, WriteRequest};
use idemgate_model::clock::{self, Clock};
use idemgate_model::operation::{Fingerprint, RequestSummary};
use idemgate_store::scope_key::ScopeKey;
use idemgate_store::{NewOperation, Store, StoreError};
use key::{IDEMPOTENCY_KEY, IdempotencyKey, Scope};
use pool::Pool;
use quota::{Quotas, StoredCharge};
use reconcile::Reconciler;
use replay::ReplayCache;

/// A configured route with its upstream connections.
pub struct ActiveRoute {
    route: Arc<Route>,
    /// Pass-through requests.
    client: Arc<Pool>,
    /// Claimed writes: its connections are checked against the store's
    /// fence before anything is written to them. A pool of its own, so a
    /// replica that lost its lease still passes reads through.
    writes: Arc<Pool>,
    /// Reconcile probes.
    probes: ProbeClient,
    /// Mirrors the stored pause; the store is the truth across restarts.
    paused: AtomicBool,
    /// Faults injected into its writes: a rehearsal's gateway only.
    drill: Option<Arc<drill::Drill>>,
    /// Its request counters and upstream histogram.
    series: RouteSeries,
    /// An MCP route's: which tools its server lists as read-only.
    learned: mcp::tools::Learned,
    /// An MCP route's protected calls in flight, whose cancellations the
    /// gateway takes.
    calls: Arc<mcp::cancel::InFlightCalls>,
}

/// The proxy: routes, the store, and the forward tasks in flight.
pub struct Proxy {
    routes: Vec<Arc<ActiveRoute>>,
    /// What the requests and their attempts share: an [`Attempt`] holds
    /// this, not copies of its parts.
    shared: Arc<Shared>,
    in_flight: Arc<InFlight>,
    /// The store's retention: a cached replay is never older than this.
    retention: Duration,
    /// Forward tasks outlive their requests; shutdown waits for them.
    tasks: TaskTracker,
    /// hyper bounds its read buffer only roughly; this is the exact bound.
    max_header_bytes: usize,
    /// What all write bodies in memory may take together.
    body_budget: BodyBudget,
    /// What scopes are keyed with before they are stored or compared.
    scope_key: ScopeKey,
    /// The gateway's traces; `None` when they are off.
    traces: Option<Arc<Tracing>>,
    /// Where each request's line goes; `None`: not written.
    access_log: Option<AccessLog>,
}

/// The proxy's parts that every request and every attempt uses, made once
/// at start and held behind one `Arc`.
struct Shared {
    store: Arc<dyn Store>,
    /// The probes running, so an operation is probed once at a time.
    reconciler: Reconciler,
    metrics: Arc<Metrics>,
    clock: Arc<dyn Clock>,
    /// Completed responses, so most replays need no store read.
    replays: ReplayCache,
    /// Writes sent and bytes stored per scope, for routes with a quota.
    quotas: Arc<Quotas>,
    /// Cancelled when shutdown starts: stop follow-ups of lost responses.
    stopping: CancellationToken,
    /// Cancelled at the end of the shutdown grace: stop retrying records.
    give_up: CancellationToken,
}

impl Proxy {
    /// The proxy for `config`; `paused` names the routes the store holds
    /// paused, `scope_key` the key its scopes are stored with, `drill` the
    /// faults a rehearsal injects (none for `serve`).
    #[allow(clippy::too_many_arguments)] // what the proxy is made of, each distinct
    pub fn new(
        config: &Config,
        store: Arc<dyn Store>,
        scope_key: ScopeKey,
        clock: Arc<dyn Clock>,
        paused: &[String],
        metrics: Arc<Metrics>,
        stopping: CancellationToken,
        give_up: CancellationToken,
        drill: Option<Arc<drill::Drill>>,
    ) -> Result<Self, TlsError> {
        let routes = config
            .routes
            .iter()
            .map(|route| {
                Ok(Arc::new(ActiveRoute {
                    route: Arc::new(route.clone()),
                    client: forward::pool(route, None)?,
                    writes: forward::pool(route, Some(store.fence()))?,
                    probes: forward::probe_client(route)?,
                    paused: AtomicBool::new(paused.contains(&route.name)),
                    drill: drill.clone(),
                    series: metrics.route_series(&route.name),
                    learned: mcp::tools::Learned::default(),
                    calls: Arc::default(),
                }))
            })
            .collect::<Result<_, TlsError>>()?;
        let shared_store = store.shared();
        Ok(Proxy {
            routes,
            shared: Arc::new(Shared {
                store,
                reconciler: Reconciler::default(),
                metrics,
                clock,
                // Replicas sharing a store: a peer may change what a cached
                // replay mirrors (a newer operation of its identity), so
                // every answer is read from the store.
                replays: if shared_store {
                    ReplayCache::with_capacity(0)
                } else {
                    ReplayCache::default()
                },
                quotas: Arc::default(),
                stopping,
                give_up,
            }),
            in_flight: Arc::default(),
            retention: config.store.retention,
            tasks: TaskTracker::new(),
            max_header_bytes: config.server.max_header_bytes,
            body_budget: BodyBudget::new(config.server.buffered_body_budget),
            scope_key,
            traces: None,
            access_log: None,
        })
    }

    /// The proxy, each request traced with `traces` when some.
    pub fn traced(mut self, traces: Option<Arc<Tracing>>) -> Self {
        self.traces = traces;
        self
    }

    /// The proxy, each request's line written to `access_log` when some.
    pub fn logged(mut self, access_log: Option<AccessLog>) -> Self {
        self.access_log = access_log;
        self
    }

    /// Pauses (with `reason`) or resumes a route, stored first; `false` when
    /// there is no such route.
    pub async fn set_paused(&self, name: &str, reason: Option<&str>) -> Result<bool, StoreError> {
        let Some(active) = self.routes.iter().find(|a| a.route.name == name) else {
            return Ok(false);
        };
        self.shared.store.set_paused(name, reason).await?;
        active.paused.store(reason.is_some(), Ordering::SeqCst);
        Ok(true)
    }

    /// The configured routes, in the config file's order.
    pub fn routes(&self) -> impl Iterator<Item = &Route> {
        self.routes.iter().map(|active| active.route.as_ref())
    }

    /// Follows the routes the store holds paused (set through a peer
    /// replica, or its latch).
    pub fn follow_pauses(&self, paused: &[String]) {
        for active in &self.routes {
            let now = paused.contains(&active.route.name);
            active.paused.store(now, Ordering::SeqCst);
        }
    }

    /// The forward tasks, for shutdown to wait on.
    pub fn tasks(&self) -> &TaskTracker {
        &self.tasks
    }

    /// Handles one request, in a span of its own when traced.
    pub async fn handle(
        self: Arc<Self>,
        request: Request<Incoming>,
        peer: Peer,
    ) -> Response<ProxyBody> {
        let Some(traces) = &self.traces else {
            return self.serve(request, peer).await;
        };
        let cx = traces.request(request.method(), request.headers());
        traces::within(cx, self.serve(request, peer)).await
    }

    /// Every error becomes a problem response here, and every request is
    /// counted and logged once (never with credentials or payloads).
    async fn serve(
        self: Arc<Self>,
        mut request: Request<Incoming>,
        peer: Peer,
    ) -> Response<ProxyBody> {
        let started = Instant::now();
        let method = request.method().clone();
        // The head as sent, before its path is normalized.
        let head_bytes = head_size(&request);
        // Phase 0, once: from here on the request's path is in normal form.
        let normalized = path::normalize(request.uri_mut());
        let host = host::normalize(&mut request);
        let path = request.uri().path().to_string();
        let reserved = normalized.is_ok() && path.starts_with(status::PREFIX);
        let routed = normalized.and_then(|()| {
            if reserved {
                return Ok(None);
            }
            route::select_unambiguous(&self.routes, &path, |active| &active.route)
                .map(Option::<&Arc<ActiveRoute>>::cloned)
        });
        let active = routed.as_ref().ok().cloned().flatten();
        let answered = if head_bytes > self.max_header_bytes {
            Err(ProxyError::HeadersTooLarge {
                limit: self.max_header_bytes,
            })
        } else if let Err(error) = routed {
            Err(error.into())
        } else if let Err(error) = host {
            Err(error.into())
        } else if reserved {
            status::lookup(
                self.shared.store.as_ref(),
                &self.routes,
                &self.scope_key,
                &request,
            )
            .await
        } else if let Some(active) = &active {
            // Each path's future boxed: held inline, every request's future
            // would be as large as the largest path's (kilobytes), and
            // copied whole wherever it moves.
            if active.route.intercepts(request.method()) {
                Box::pin(self.handle_write(active, request, peer)).await
            } else if request.method() == Method::DELETE
                && active.calls.session_busy(request.headers())
            {
                Ok(self.end_session_later(active, request, peer))
            } else {
                let request = request.map(crate::body::stream);
                let pass = forward::pass_through(&active.client, &active.route, request, &peer);
                Box::pin(pass).await
            }
        } else {
            Err(ProxyError::NoRoute { path: path.clone() })
        };
        let response = answered.unwrap_or_else(ProxyError::into_response);
        let outcome = response
            .extensions()
            .get::<Outcome>()
            .copied()
            .unwrap_or(Outcome::rejected);
        let route = active.as_ref().map_or("", |a| a.route.name.as_str());
        match &active {
            Some(active) => active.series.request(outcome),
            None => self.shared.metrics.request(route, outcome),
        }
        if response.extensions().get::<StoreFailure>().is_some() {
            self.shared.metrics.store_error(route);
        }
        let operation_id = response
            .extensions()
            .get::<OperationId>()
            .map(|id| id.0.as_str());
        traces::answered(traces::Answer {
            route,
            path: &path,
            outcome,
            status: response.status().as_u16(),
            operation_id,
            replayed: outcome == Outcome::replayed,
        });
        if let Some(access_log) = &self.access_log {
            access_log.write(&AccessLine {
                route,
                method: &method,
                path: &path,
                operation_id,
                outcome,
                status: response.status().as_u16(),
                latency: started.elapsed(),
            });
        }
        response
    }

    /// A write the route intercepts, answered as the route's profile
    /// speaks (docs/profiles.md): its errors rendered, its headers echoed.
    /// An MCP route's POSTs are JSON-RPC messages, some of them tool calls
    /// ([`mcp`]).
    async fn handle_write(
        self: &Arc<Self>,
        active: &Arc<ActiveRoute>,
        request: Request<Incoming>,
        peer: Peer,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        if active.route.profile == Profile::Mcp {
            return Ok(Box::pin(self.handle_mcp(active, request, peer)).await);
        }
        let wire = active.route.profile.wire();
        let echoed = wire::Echoed::of(wire, request.headers());
        let answered = self.write_answer(active, request, peer).await;
        let mut response = answered.unwrap_or_else(|error| error.into_response_as(wire));
        echoed.apply(wire, &mut response);
        Ok(response)
    }

    /// A POST to an MCP route: read whole, then a protected tool call is a
    /// write whose every answer is a JSON-RPC response, and anything else
    /// is sent on as it came (a `tools/list` answer read for its tools'
    /// annotations on the way back).
    async fn handle_mcp(
        self: &Arc<Self>,
        active: &Arc<ActiveRoute>,
        request: Request<Incoming>,
        peer: Peer,
    ) -> Response<ProxyBody> {
        let route = &active.route;
        let (parts, body) = request.into_parts();
        let (body, reservation) = match read_body(&parts, body, route, &self.body_budget).await {
            Ok(read) => read,
            Err(error) => return error.into_response(),
        };
        if active.calls.absorbs(&parts.headers, &body) {
            return mcp::answer::accepted();
        }
        let tools = route.mcp.clone().unwrap_or_default();
        match mcp::call::classify(&parts.headers, &body, &tools, &active.learned) {
            mcp::call::Classified::Refused(refusal) => mcp::answer::refused(refusal),
            mcp::call::Classified::Protected(call) => {
                Box::pin(self.mcp_call(active, parts, (body, reservation), peer, call)).await
            }
            mcp::call::Classified::PassThrough { listing } => {
                drop(reservation);
                let request = Request::from_parts(parts, crate::body::full(body));
                let pass = forward::pass_through(&active.client, route, request, &peer);
                match Box::pin(pass).await {
                    Ok(response) if listing => {
                        mcp::tools::read_listing(response, route, &active.learned).await
                    }
                    Ok(response) => response,
                    Err(error) => error.into_response(),
                }
            }
        }
    }

    /// An MCP session's DELETE while its protected calls are in flight:
    /// answered at once, and sent on once they have ended (or after the
    /// route's `upstream_timeout` and `late_window`), so that the server
    /// does not cancel them ([`mcp::cancel`]); one per session.
    fn end_session_later(
        self: &Arc<Self>,
        active: &Arc<ActiveRoute>,
        request: Request<Incoming>,
        peer: Peer,
    ) -> Response<ProxyBody> {
        let active = active.clone();
        // One held back per session: a client repeating its DELETE adds
        // nothing to wait for.
        let Some(held) = active.calls.hold_end(request.headers()) else {
            let mut response = Response::new(crate::body::full(Bytes::new()));
            response.extensions_mut().insert(Outcome::proxied);
            return response;
        };
        self.tasks.spawn(async move {
            let _held = held;
            // As long as a call may run: its exchange, then a late answer.
            let bound = active.route.upstream_timeout + active.route.late_window;
            active.calls.session_idle(request.headers(), bound).await;
            let request = request.map(crate::body::stream);
            let sent = forward::pass_through(&active.client, &active.route, request, &peer);
            if let Err(error) = sent.await {
                tracing::warn!(route = %active.route.name, %error, "an MCP session's DELETE held back for its calls failed");
            }
        });
        let mut response = Response::new(crate::body::full(Bytes::new()));
        response.extensions_mut().insert(Outcome::proxied);
        response
    }

    /// A protected tool call, answered as JSON-RPC. When the client takes
    /// an event stream and the server sends something before its response
    /// (progress, a request the client must answer), the answer is
    /// streamed from that first event on ([`mcp::relay`]), its response
    /// last, once recorded.
    async fn mcp_call(
        self: &Arc<Self>,
        active: &Arc<ActiveRoute>,
        parts: request::Parts,
        body: (Bytes, Reservation),
        peer: Peer,
        call: mcp::call::Call,
    ) -> Response<ProxyBody> {
        let (relay, relayed) = match call.accepts_stream {
            true => {
                let (relay, relayed) = mcp::relay::Relay::new(active.route.max_stored_response);
                (Some(relay), Some(relayed))
            }
            false => (None, None),
        };
        let (this, route, called) = (self.clone(), active.clone(), call.clone());
        let mut write = Box::pin(async move {
            this.mcp_write(&route, parts, body, peer, &called, relay)
                .await
        });
        let Some(mut relayed) = relayed else {
            return mcp::answer::finish(write.await, &call).await;
        };
        // Whatever is relayed is sent before the response is recorded: if
        // both are ready, the relayed event is first.
        let first = tokio::select! {
            biased;
            Some(first) = relayed.recv() => first,
            answered = &mut write => {
                // An event relayed as the answer came is still the client's.
                let answered = answered.map(|mut response| {
                    let early: Vec<Bytes> = std::iter::from_fn(|| relayed.try_recv()).collect();
                    if !early.is_empty() {
                        response.extensions_mut().insert(mcp::outcome::Relayed(early));
                    }
                    response
                });
                return mcp::answer::finish(answered, &call).await;
            }
        };
        let (tail, tail_rx) = oneshot::channel();
        self.tasks.spawn(async move {
            let answered = write.await;
            drop(tail.send(mcp::answer::finish_streamed(answered, &call).await));
        });
        mcp::answer::streamed(mcp::relay::Streamed::new(first, relayed, tail_rx))
    }

    /// A protected tool call as a write: its scope, key and fingerprint
    /// ([`mcp::identity`]), then the write phases as for any route.
    async fn mcp_write(
        self: &Arc<Self>,
        active: &Arc<ActiveRoute>,
        parts: request::Parts,
        body: (Bytes, Reservation),
        peer: Peer,
        call: &mcp::call::Call,
        relay: Option<mcp::relay::Relay>,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let route = &active.route;
        let scope = self.scope_of(route, &parts)?;
        let identified = mcp::identity::identify(call, &parts.headers, &body.0, route, &scope)?;
        let parts_headers = parts.headers.clone();
        let exact = ExactDigest::of(&identified.fingerprint);
        let keyed = Keyed {
            key: identified.key.clone(),
            announced: identified.source == mcp::identity::KeySource::Derived,
            scope,
            fingerprint: identified.fingerprint,
            exact,
            parts,
            body,
            peer,
            call: Some(active.calls.track(&parts_headers, &call.id, relay)),
            rotation_guard: identified.source == mcp::identity::KeySource::Sent
                && route.rotated_keys == RotatedKeys::Hold,
        };
        self.write_keyed(active, keyed).await
    }

    /// The scope of a write on `route`: its scope headers, narrowed as its
    /// profile says.
    fn scope_of(&self, route: &Route, parts: &request::Parts) -> Result<Scope, ProxyError> {
        let scope = Scope::from_headers(
            &parts.headers,
            &route.scope_headers,
            route.allow_anonymous,
            &self.scope_key,
        )
        .ok_or_else(|| {
            let names: Vec<&str> = route.scope_headers.iter().map(|h| h.as_str()).collect();
            ProxyError::MissingScope {
                headers: names.join(", "),
            }
        })?;
        Ok(scope.narrowed(
            route.profile.wire(),
            parts.uri.path(),
            &parts.headers,
            &self.scope_key,
        ))
    }

    /// Phases 2–4 for a write the route intercepts: key and scope, body,
    /// fingerprint; then the write.
    async fn write_answer(
        self: &Arc<Self>,
        active: &Arc<ActiveRoute>,
        request: Request<Incoming>,
        peer: Peer,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let route = &active.route;
        let wire = route.profile.wire();
        let sent_key = IdempotencyKey::from_wire(request.headers(), wire)?;
        if sent_key.is_none() && route.key == KeyMode::Require {
            return Err(ProxyError::MissingKey);
        }
        if sent_key.is_some() {
            let now = self.shared.clock.now_millis();
            let window = wire::FirstSentWindow {
                retention: self.retention,
                skew: route.first_sent_skew,
            };
            wire::check_first_sent(wire, request.headers(), now, window)?;
        }
        let (parts, body) = request.into_parts();
        let scope = self.scope_of(route, &parts)?;
        // Goes with the body to the attempt, which may hold it longest.
        let (body, reservation) = read_body(&parts, body, route, &self.body_budget).await?;
        let retained_after = self.shared.clock.now_millis() - clock::millis(self.retention);
        let exact = digest_of(route, &parts, &body, ExactDigest::compute).await?;
        // Most retries are replays sent byte for byte: answered here, from
        // the cache, before their JSON is parsed for the fingerprint.
        if let Some(key) = &sent_key {
            let identity = claim::identity(&route.name, scope.as_str(), key.as_str());
            traces::note_key(|| self.scope_key.trace_label(&identity));
            if let Some(replay) =
                self.shared
                    .replays
                    .answer_exact(&identity, &exact, retained_after)
            {
                return Ok(replay);
            }
        }
        let fingerprint = digest_of(route, &parts, &body, fingerprint::compute).await?;
        let rotation_guard = sent_key.is_some() && route.rotated_keys == RotatedKeys::Hold;
        let (key, announced) = match sent_key {
            Some(key) => (key, false),
            None => (made_key(route, &scope, &fingerprint, &body)?, true),
        };
        let keyed = Keyed {
            key: key.clone(),
            announced,
            scope,
            fingerprint,
            exact,
            parts,
            body: (body, reservation),
            peer,
            call: None,
            rotation_guard,
        };
        let answered = self.write_keyed(active, keyed).await;
        let mut response = answered.unwrap_or_else(|error| error.into_response_as(wire));
        // A key the gateway made is the one the client must retry with,
        // whatever the answer.
        if announced && let Ok(value) = HeaderValue::from_str(key.as_str()) {
            response.headers_mut().insert(IDEMPOTENCY_KEY, value);
        }
        Ok(response)
    }

    /// Phase 5 on for a write whose key and fingerprint are known: the
    /// replay cache, else the claim and the attempt.
    async fn write_keyed(
        self: &Arc<Self>,
        active: &Arc<ActiveRoute>,
        keyed: Keyed,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let route = &active.route;
        let Keyed {
            key,
            announced,
            scope,
            fingerprint,
            exact,
            parts,
            body: (body, reservation),
            peer,
            call,
            rotation_guard,
        } = keyed;
        let path_and_query = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
        let now = self.shared.clock.now_millis();
        let retained_after = now - clock::millis(self.retention);
        // An identical request is the same derived operation only within the window.
        let fresh_after =
            (announced && route.key == KeyMode::Derive && route.derive_from.is_empty())
                .then(|| now - clock::millis(route.derive_window));
        // Completed operations the store may have deleted (retention) or
        // superseded (derive window) are never answered from the cache.
        let valid_after = retained_after.max(fresh_after.unwrap_or(i64::MIN));
        let identity = claim::identity(&route.name, scope.as_str(), key.as_str());
        traces::note_key(|| self.scope_key.trace_label(&identity));
        // Other replays (the same payload spelled otherwise, or cached from
        // the store) are answered here too, without a task or a store call
        // (the claim phase asks the cache again, for waiters).
        let cached = self
            .shared
            .replays
            .answer(&identity, &fingerprint, valid_after);
        match cached {
            Some(answer) => answer,
            None => {
                let new = Arc::new(NewOperation {
                    route: route.name.clone(),
                    scope: scope.as_str().to_string(),
                    key: key.as_str().to_string(),
                    fingerprint,
                    request: RequestSummary {
                        method: parts.method.to_string(),
                        path: path_and_query.to_string(),
                        content_type: parts
                            .headers
                            .get(CONTENT_TYPE)
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_string),
                        body_size: body.len() as u64,
                        body_sha256: fingerprint::digest_hex(Sha256::new_with_prefix(&body)),
                        body: route.store_request_body.then(|| body.to_vec()),
                    },
                    fresh_after,
                    refuse_held_twin: rotation_guard,
                });
                let write = Write {
                    key,
                    new,
                    exact,
                    identity,
                    valid_after,
                    parts,
                    body: (body, reservation),
                    peer,
                    call,
                };
                self.spawn_write(active, write).await
            }
        }
    }

    /// Runs a write in a task of its own from the claim on: a client that
    /// hangs up can no longer cancel it between the claim's commit and the
    /// attempt, which would leave the operation in_progress. The same task
    /// runs the attempt, which answers as soon as the outcome is recorded
    /// and goes on with what a lost response needs.
    async fn spawn_write(
        self: &Arc<Self>,
        active: &Arc<ActiveRoute>,
        write: Write,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let (reply_tx, reply_rx) = oneshot::channel();
        let (this, active) = (self.clone(), active.clone());
        // Each phase's future boxed: inline, the task's future was ~18 KiB,
        // copied whole into the task as it was spawned.
        self.tasks.spawn(traces::in_current(async move {
            match Box::pin(this.claim_write(&active, write)).await {
                Ok(Next::Send(attempt)) => Box::pin(attempt.run(reply_tx)).await,
                Ok(Next::Answer(response)) => drop(reply_tx.send(Ok(response))),
                Err(error) => drop(reply_tx.send(Err(error))),
            }
        }));
        reply_rx.await.unwrap_or_else(|_| {
            Err(ProxyError::Internal {
                reason: "the write task ended without a reply".into(),
            })
        })
    }

    /// Phase 5: the claim decides whether the write is sent (the attempt
    /// that forwards and records it) or answered from the store.
    async fn claim_write(
        &self,
        active: &Arc<ActiveRoute>,
        write: Write,
    ) -> Result<Next, ProxyError> {
        let route = &active.route;
        let Write {
            key,
            new,
            exact,
            identity,
            valid_after,
            parts,
            body,
            peer,
            call,
        } = write;
        let credentials = reconcile::credentials(&parts.headers, route);
        // Taken before the claim is sent: a lease that lapses from here on
        // voids it, even once renewed (a peer may have taken over).
        let permit = self.shared.store.fence().permit();
        // A held operation is probed once, then claimed again: whatever
        // settled it meanwhile (this probe, the one that was running, a late
        // response, an operator) answers, and one the probe released
        // (`not_attempted`) is this request's to send.
        let mut probed = false;
        let (claim, in_flight) = loop {
            let claimed = self
                .claim_once(active, &new, &identity, exact, valid_after)
                .await?;
            match claimed {
                Claimed::Send(claim, guard) => break (claim, guard),
                Claimed::Answer(response) => return Ok(Next::Answer(response)),
                Claimed::Held(operation) if probed || !route.has_probe() => {
                    return replay::answer_existing(&operation, &new.fingerprint).map(Next::Answer);
                }
                Claimed::Held(operation) => {
                    probed = true;
                    let ctx = reconcile::Ctx {
                        store: self.shared.store.as_ref(),
                        metrics: &self.shared.metrics,
                        now: self.shared.clock.now_millis(),
                    };
                    // Boxed: rare, and its future would make every claim's as large.
                    Box::pin(self.shared.reconciler.reconcile(
                        &ctx,
                        active,
                        &operation.id,
                        key.as_str(),
                        &credentials,
                    ))
                    .await;
                }
            }
        };
        Ok(Next::Send(Box::new(Attempt {
            shared: self.shared.clone(),
            active: active.clone(),
            in_flight: Some(in_flight),
            request: WriteRequest::new(route, parts, body, (key.as_str(), &claim), &peer)?,
            claim,
            permit,
            key: key.as_str().to_string(),
            credentials,
            identity,
            fingerprint: new.fingerprint.clone(),
            exact,
            quota: StoredCharge::new(&self.shared.quotas, route, &new.scope),
            call,
        })))
    }

    /// One claim of `new` (sent, answered, or held), under the route's
    /// pause and the scope's quota as they stand now; a claim that sends
    /// is counted against the quota.
    async fn claim_once(
        &self,
        active: &ActiveRoute,
        new: &Arc<NewOperation>,
        identity: &str,
        exact: ExactDigest,
        valid_after: i64,
    ) -> Result<Claimed, ProxyError> {
        let route = &active.route;
        let hold = if active.paused.load(Ordering::SeqCst) {
            Some(Hold::Paused)
        } else {
            let now = self.shared.clock.now_millis();
            self.shared
                .quotas
                .check(route, &new.scope, now)
                .err()
                .map(Hold::OverQuota)
        };
        let claimed = claim::claim(
            self.shared.store.as_ref(),
            &self.in_flight,
            &self.shared.replays,
            route,
            new,
            identity,
            exact,
            valid_after,
            hold,
        );
        let claimed = traces::child(Step::Claim, claimed).await?;
        if matches!(claimed, Claimed::Send(..)) {
            let request_bytes = new.request.body.as_ref().map_or(0, Vec::len);
            self.shared.quotas.count(
                route,
                &new.scope,
                request_bytes,
                self.shared.clock.now_millis(),
            );
        }
        Ok(claimed)
    }
}

/// What the claim phase decided for a write.
enum Next {
    /// Claimed: the attempt to run (boxed: it is large, and moved into
    /// the task's future).
    Send(Box<Attempt>),
    /// The answer from the store, the replay cache or a released attempt.
    Answer(Response<ProxyBody>),
}

/// A write past its fingerprint, on its way to the claim: the operation it
/// wants to become, its identity in the in-flight map and the replay cache,
/// and the request to forward.
struct Write {
    key: IdempotencyKey,
    new: Arc<NewOperation>,
    /// The request exactly as sent, kept with its response for replays.
    exact: ExactDigest,
    identity: String,
    /// Cached completed operations updated before this (ms) are not answered.
    valid_after: i64,
    parts: request::Parts,
    /// The body, and its bytes in the shared budget.
    body: (Bytes, Reservation),
    peer: Peer,
    /// An MCP tool call, in flight: its upstream answer is read as
    /// JSON-RPC for its id ([`mcp::outcome`]).
    call: Option<mcp::cancel::Pending>,
}

/// A write whose key and fingerprint are known, on its way to the replay
/// cache and the claim.
struct Keyed {
    key: IdempotencyKey,
    /// The gateway made the key (assigned or derived): the answer says it.
    announced: bool,
    scope: Scope,
    fingerprint: Fingerprint,
    exact: ExactDigest,
    parts: request::Parts,
    body: (Bytes, Reservation),
    peer: Peer,
    call: Option<mcp::cancel::Pending>,
    /// A request that sent its own key: refused when an identical one
    /// under another key is held, by the claim
    /// ([`NewOperation::refuse_held_twin`]).
    rotation_guard: bool,
}

/// Bodies larger than this are digested on the blocking pool: hashing and
/// RFC 8785 over a large body take milliseconds (about 1 ms per 64 KiB of
/// JSON), which must not stall the other requests on an async worker.
const INLINE_FINGERPRINT_BYTES: usize = 64 * 1024;

/// What the fingerprint (and the exact digest) is computed over.
fn fingerprint_input<'a>(
    route: &'a Route,
    parts: &'a request::Parts,
    body: &'a [u8],
) -> FingerprintInput<'a> {
    FingerprintInput {
        method: &parts.method,
        path_and_query: parts.uri.path_and_query().map_or("/", |pq| pq.as_str()),
        headers: &parts.headers,
        fingerprint_headers: &route.fingerprint_headers,
        ignore_fields: &route.ignore_fields,
        body_as_sent: route.profile.wire().body_as_sent,
        body,
    }
}

/// `digest` of the request ([`fingerprint::compute`] or
/// [`ExactDigest::compute`]), computed where the body's size says.
async fn digest_of<T: Send + 'static>(
    route: &Arc<Route>,
    parts: &request::Parts,
    body: &Bytes,
    digest: fn(&FingerprintInput<'_>) -> T,
) -> Result<T, ProxyError> {
    if body.len() <= INLINE_FINGERPRINT_BYTES {
        return Ok(digest(&fingerprint_input(route, parts, body)));
    }
    let (route, body) = (route.clone(), body.clone());
    let mut head = Request::new(());
    *head.method_mut() = parts.method.clone();
    *head.uri_mut() = parts.uri.clone();
    *head.headers_mut() = parts.headers.clone();
    let (head, ()) = head.into_parts();
    tokio::task::spawn_blocking(move || digest(&fingerprint_input(&route, &head, &body)))
        .await
        .map_err(|e| ProxyError::Internal {
            reason: format!("fingerprinting failed: {e}"),
        })
}

/// The key for a write that sent none: assigned, or derived from the request.
fn made_key(
    route: &Route,
    scope: &Scope,
    fingerprint: &Fingerprint,
    body: &[u8],
) -> Result<IdempotencyKey, ProxyError> {
    match route.key {
        KeyMode::Assign => Ok(IdempotencyKey::assign()),
        KeyMode::Derive if route.derive_from.is_empty() => {
            Ok(IdempotencyKey::derive_from_fingerprint(scope, fingerprint))
        }
        KeyMode::Derive => IdempotencyKey::derive_from_body(scope, &route.derive_from, body)
            .ok_or(ProxyError::MissingKey),
        KeyMode::Require | KeyMode::Off => Err(ProxyError::MissingKey),
    }
}

/// The size of a request head as sent: request line and header lines.
fn head_size<B>(request: &Request<B>) -> usize {
    let line =
        request.method().as_str().len() + target_len(request.uri()) + " HTTP/1.1\r\n".len() + 1;
    let headers: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    line + headers + 2
}

/// The length of the request target as `Uri`'s `Display` writes it,
/// without writing it.
fn target_len(uri: &http::Uri) -> usize {
    uri.scheme_str().map_or(0, |s| s.len() + "://".len())
        + uri.authority().map_or(0, |a| a.as_str().len())
        + uri.path().len()
        + uri.query().map_or(0, |q| "?".len() + q.len())
}

/// Reads a write's body whole, refusing more than the route's `max_body`,
/// more than is left of the shared [`BodyBudget`] (503 `overloaded`), and
/// a client that takes longer than its `upstream_timeout` to send it. A
/// declared Content-Length over either is refused before the body is
/// polled, so hyper never sends `100 Continue` for it. The reservation
/// comes back with the body: it is held as long as the body is.
async fn read_body(
    parts: &request::Parts,
    body: Incoming,
    route: &Route,
    budget: &BodyBudget,
) -> Result<(Bytes, Reservation), ProxyError> {
    let limit = route.max_body;
    let declared = declared_length(&parts.headers);
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ProxyError::BodyTooLarge { limit });
    }
    let overloaded = |_| ProxyError::Overloaded {
        what: "buffered request bodies",
    };
    let mut reservation = budget.reservation();
    // Within `limit`, so it fits a usize.
    reservation
        .grow_to(declared.unwrap_or(0) as usize)
        .map_err(overloaded)?;
    let read = async {
        let mut body = Limited::new(body, limit);
        let (mut chunks, mut size) = (Vec::new(), 0);
        // A body whose declared length has arrived is whole, and is not
        // polled for its end: an HTTP/2 client that sent it all and reset
        // the stream (a hang-up) would turn that poll into an error, and
        // the write it sent into none.
        while declared != Some(size as u64) {
            let Some(frame) = body.frame().await else {
                break;
            };
            if let Ok(data) = frame?.into_data() {
                size += data.len();
                reservation
                    .grow_to(size)
                    .map_err(|spent| Box::new(spent) as BoxError)?;
                chunks.push(data);
            }
        }
        // A body that came in one chunk (most do) is not copied.
        Ok::<_, BoxError>(match chunks.as_slice() {
            [one] => one.clone(),
            all => Bytes::from(all.concat()),
        })
    };
    let read = tokio::time::timeout(route.upstream_timeout, read)
        .await
        .map_err(|_| ProxyError::BodyTimeout {
            after: route.upstream_timeout,
        })?;
    match read {
        Ok(bytes) => Ok((bytes, reservation)),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => {
            Err(ProxyError::BodyTooLarge { limit })
        }
        Err(error) if error.is::<BudgetSpent>() => Err(overloaded(BudgetSpent)),
        Err(error) => Err(ProxyError::BodyRead {
            reason: error.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_length_is_that_of_the_written_target() {
        for target in [
            "/",
            "/a/b?c=d",
            "/a?",
            "*",
            "http://h",
            "http://h:8080/p?q",
            "https://user@h/",
            "h:443",
        ] {
            let uri: http::Uri = target.parse().unwrap();
            assert_eq!(target_len(&uri), uri.to_string().len(), "{target}");
        }
    }
}
