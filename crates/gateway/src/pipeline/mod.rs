//! The life of a request, as phases in a fixed order, one module each:
//!
//! 0. `path` (`crate::request_path`, below the pipeline, since the config
//!    keeps route prefixes in the same form): the request path in normal
//!    form (RFC 3986 §6.2.2), rewritten
//!    in place, so everything after it — the reserved `/.idemgate/` prefix
//!    (`status`), routing, the fingerprint and the upstream's request line —
//!    sees one spelling; a path that has none → 400 `invalid-path`. `host`:
//!    the host likewise, one `host` header from `:authority` or `Host`
//!    whichever version brought it; a `Host` that disagrees with the
//!    authority → 400 `invalid-host`. `method`: a standard method in any
//!    case upper-case (`post` is `POST`); `CONNECT` → 501
//!    `unsupported-method`. `fields`: an HTTP/2 request's cookie
//!    crumbs joined into one `Cookie`; a value with whitespace around it
//!    → 400 `invalid-header`; a body in a transfer coding other than
//!    `chunked` → 501 `unsupported-transfer-coding`.
//! 1. `route`: longest `path_prefix`; none → 404 `no-route`; a path that
//!    another upstream's reading puts on another route — `;` stripped,
//!    `%2F` decoded, its letters in another case, a `/` added at its end
//!    (`route::Spellings`) — → 400 `invalid-path`. A method the route
//!    names, in any case, is spelled as it names it; one the route does
//!    not intercept is streamed through (`forward::pass_through`),
//!    unchanged but for its normalized path and hop-by-hop headers.
//! 2. [`key`]: the `Idempotency-Key` the client sent, if any (within its
//!    first-sent window, on a profile that dates requests: `wire`), and
//!    the scope.
//! 3. body: read whole, bounded by `max_body` (413 before `100 Continue`)
//!    and by the bodies' shared `budget` (503 `overloaded`); an HTTP/2
//!    stream reset before its whole body came → 400 `invalid-body`.
//! 4. [`fingerprint`]: the digest of the request exactly as sent, then what
//!    makes a retry "the same request"; a write that sent no key is given
//!    one from them (assigned, or derived). The write's context, `Write`,
//!    is then whole: built once, read by reference by every phase after.
//! 5. `replay` from the cache: a completed operation the cache holds for
//!    the write's identity answers at once, with no task and no store call.
//!    A retry sent byte for byte under the client's key is looked up
//!    between the two digests of phase 4, so that the most common retry
//!    is answered before its JSON is parsed; any other write once its
//!    fingerprint is known.
//! 6. `claim`: one store transaction decides: send, replay what the store
//!    holds (`replay::answer_existing`), or refuse; a paused route or a
//!    scope over its `quota` only looks up what exists. A duplicate of a
//!    claim in flight waits for it and asks the cache again when it wakes.
//!    An `unknown` operation on a route with a probe is probed first
//!    ([`reconcile`], unless it was probed lately) and claimed again: one
//!    the probe finds absent is sent by this request.
//! 7. [`forward`] + `record` (`attempt`): in the task the claim runs in,
//!    so a client that hangs up never cancels the upstream call nor leaves
//!    the operation `in_progress`; upstream connections are made by
//!    `connector` and driven, from `pool`, by the request that uses
//!    them; after a lost response a route's [`reconcile`] probe may prove it
//!    happened; in `idemgate rehearse`'s own gateway alone, a [`drill`]
//!    breaks exchanges on purpose.
//!
//! An MCP route's POSTs are JSON-RPC messages (`mcp`), read whole (phase 3)
//! first: a protected tool call's scope, key and fingerprint (phases 2
//! and 4) come from its headers and its message, then phases 5 to 7 as
//! above; anything else is streamed through.
//!
//! Invariants: a write's identity — its key, scope, their joined name, its
//! fingerprint and exact digest — is computed once, in its context, and
//! every phase after phase 4 reads it there, so no two phases can disagree
//! on which operation a write is; each phase calls the store through the
//! narrow trait that holds its calls ([`RequestPath`]; [`Operators`] for
//! what it reads as operators do), never the whole [`Store`].
//!
//! Errors from any phase are `ProxyError`s (`error`), mapped to a problem
//! in one place and rendered as an RFC 9457 body (`crate::problem`).

pub(crate) mod attempt;
pub(crate) mod budget;
pub(crate) mod claim;
pub(crate) mod connector;
pub mod drill;
pub(crate) mod error;
pub(crate) mod fields;
pub mod fingerprint;
pub mod forward;
pub(crate) mod host;
pub mod key;
pub(crate) mod landing;
pub(crate) mod mcp;
pub(crate) mod method;
pub(crate) mod pool;
pub(crate) mod quota;
pub mod reconcile;
pub(crate) mod record;
pub(crate) mod replay;
pub(crate) mod route;
pub(crate) mod signer;
pub mod sse;
pub(crate) mod status;
pub(crate) mod wire;

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{HeaderMap, Method, Request, Response, request};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use sha2::{Digest, Sha256};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::access_log::{AccessLine, AccessLog};
use crate::bearer::TokenDigest;
use crate::body::{BoxError, ClientBody, ProxyBody, declared_length, stream};
use crate::config::{Config, KeyMode, RotatedKeys, Route};
use crate::metrics::{Metrics, OperationId, Outcome, RouteSeries, StoreFailure};
use crate::profile::{Profile, Wire};
use crate::request_path;
use crate::tls::{Reloadable, TlsError};
use crate::traces::{self, Step, Tracing};
use attempt::Attempt;
use budget::{BodyBudget, BudgetSpent, Reservation};
use claim::{Claimed, Hold, InFlight};
use error::ProxyError;
use fingerprint::{ExactDigest, FingerprintInput};
use forward::{Peer, ProbeClient, WriteRequest};
use idemgate_model::clock::{self, Clock};
use idemgate_model::operation::{Event, Fingerprint, RequestSummary, Settlement};
use idemgate_store::scope_key::ScopeKey;
use idemgate_store::{Claim, NewOperation, Operators, RequestPath, Store, StoreError};
use key::{IDEMPOTENCY_KEY, IdempotencyKey, Scope};
use pool::Pool;
use quota::{Quotas, StoredCharge};
use reconcile::{FOUND_BY_PROBE, Reconciler};
use replay::ReplayCache;

/// A configured route with its upstream connections.
pub struct ActiveRoute {
    route: Arc<Route>,
    /// Pass-through requests.
    client: Arc<Pool>,
    /// Claimed writes: its connections are checked against the store's
    /// fence before anything is written to them. A pool of its own, so a
    /// replica that lost its lease still passes reads through; the
    /// connections both pools may hold open are counted together
    /// (`max_upstream_connections`).
    writes: Arc<Pool>,
    /// Reconcile probes.
    probes: ProbeClient,
    /// The client certificate its upstream connections present, if any.
    identity: Option<Reloadable>,
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
    /// Whether a path spelled otherwise than a route's prefix may be read
    /// as it (`route::select_unambiguous`).
    spellings: route::Spellings,
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
    /// The admin token, refused on an `/admin/` call here instead of
    /// forwarded; `None`: there is none.
    admin_token: Option<TokenDigest>,
}

/// The proxy's parts that every request and every attempt uses, made once
/// at start and held behind one `Arc`.
struct Shared {
    /// The store as a write's phases call it: claims, records, settlements.
    store: Arc<dyn RequestPath>,
    /// The same store, for what the request path reads as operators do:
    /// a held operation with its timeline (a probe, a re-send, a record
    /// that lost its compare-and-set), a client's status lookup, a pause.
    operators: Arc<dyn Operators>,
    /// The probes running, so an operation is probed once at a time.
    reconciler: Reconciler,
    /// The held writes whose exchange may still land, by the monotonic
    /// clock.
    landing: landing::Landing,
    metrics: Arc<Metrics>,
    clock: Arc<dyn Clock>,
    /// Completed responses, so most replays need no store read.
    replays: ReplayCache,
    /// Writes sent and bytes stored per scope, for routes with a quota.
    quotas: Arc<Quotas>,
    shutdown: Shutdown,
}

impl Shared {
    /// What a reconcile probe needs beside its route, as of now.
    fn probe_ctx(&self) -> reconcile::Ctx<'_> {
        reconcile::Ctx {
            store: self.store.as_ref(),
            operators: self.operators.as_ref(),
            metrics: &self.metrics,
            now: self.clock.now_millis(),
            landing: &self.landing,
            clock: self.clock.as_ref(),
        }
    }
}

/// How shutdown reaches the writes in flight.
pub struct Shutdown {
    /// Cancelled when shutdown starts: stop follow-ups of lost responses.
    pub(crate) stopping: CancellationToken,
    /// Cancelled at the end of the shutdown grace: stop retrying records.
    pub(crate) give_up: CancellationToken,
}

impl Proxy {
    /// The proxy for `config`, every route running until it follows the
    /// pauses the store holds (`Proxy::follow_pauses`); `scope_key` the
    /// key its scopes are stored with, `drill` the faults a rehearsal
    /// injects (none for `serve`).
    pub fn new(
        config: &Config,
        store: Arc<dyn Store>,
        scope_key: ScopeKey,
        clock: Arc<dyn Clock>,
        metrics: Arc<Metrics>,
        shutdown: Shutdown,
        drill: Option<Arc<drill::Drill>>,
    ) -> Result<Self, TlsError> {
        let routes: Vec<Arc<ActiveRoute>> = config
            .routes
            .iter()
            .map(|route| {
                let slots = forward::slots(route);
                let identity = forward::identity(route)?;
                Ok(Arc::new(ActiveRoute {
                    route: Arc::new(route.clone()),
                    client: forward::pool(route, None, &slots, identity.as_ref())?,
                    writes: forward::pool(route, Some(store.fence()), &slots, identity.as_ref())?,
                    probes: forward::probe_client(route, identity.as_ref())?,
                    identity,
                    paused: AtomicBool::new(false),
                    drill: drill.clone(),
                    series: metrics.route_series(&route.name),
                    learned: mcp::tools::Learned::default(),
                    calls: Arc::default(),
                }))
            })
            .collect::<Result<_, TlsError>>()?;
        let shared_store = store.shared();
        Ok(Proxy {
            spellings: route::Spellings::of(routes.iter().map(|r| r.route.path_prefix.as_str())),
            routes,
            shared: Arc::new(Shared {
                store: store.clone(),
                operators: store,
                reconciler: Reconciler::default(),
                landing: landing::Landing::default(),
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
                shutdown,
            }),
            in_flight: Arc::default(),
            retention: config.store.retention,
            tasks: TaskTracker::new(),
            max_header_bytes: config.server.max_header_bytes,
            body_budget: BodyBudget::new(config.server.buffered_body_budget),
            scope_key,
            traces: None,
            access_log: None,
            admin_token: None,
        })
    }

    /// The routes' client certificates, by route name, for a reload
    /// (`Gateway::reload_tls`).
    pub fn upstream_identities(&self) -> Vec<(String, Reloadable)> {
        let with_one = self.routes.iter().filter_map(|active| {
            let identity = active.identity.clone()?;
            Some((active.route.name.clone(), identity))
        });
        with_one.collect()
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

    /// The proxy, refusing an `/admin/` call that carries `admin_token`
    /// (a tool or a console given the wrong port) instead of forwarding
    /// the token upstream.
    pub(crate) fn guarding(mut self, admin_token: Option<TokenDigest>) -> Self {
        self.admin_token = admin_token;
        self
    }

    /// Whether the request is a call for the admin API that carries its
    /// token, however framed: only paths with an `/admin` segment are
    /// looked at (the admin API's, below any prefix a tool was given, in
    /// any case or encoding), so a request elsewhere costs a scan of its
    /// path.
    fn misdirected_admin_call(&self, path: &str, headers: &http::HeaderMap) -> bool {
        self.admin_token.is_some_and(|token| {
            names_admin(path)
                && headers
                    .get_all(http::header::AUTHORIZATION)
                    .iter()
                    .any(|field| token.carried_by(field))
        })
    }

    /// Pauses (with `reason`) or resumes a route, stored first; `false` when
    /// there is no such route. A route no longer configured (renamed or
    /// removed since it was paused) may still be resumed: its pause, left
    /// in the store, would be reported for good.
    pub async fn set_paused(&self, name: &str, reason: Option<&str>) -> Result<bool, StoreError> {
        let Some(active) = self.routes.iter().find(|a| a.route.name == name) else {
            let operators = &self.shared.operators;
            if reason.is_some() || !operators.paused_routes().await?.iter().any(|r| r == name) {
                return Ok(false);
            }
            operators.set_paused(name, None).await?;
            return Ok(true);
        };
        self.shared.operators.set_paused(name, reason).await?;
        active.paused.store(reason.is_some(), Ordering::SeqCst);
        Ok(true)
    }

    /// How much longer a held write this process sent may still land at
    /// the destination, by the monotonic clock ([`landing`]).
    pub(crate) fn may_still_land(&self, operation_id: &str) -> Option<std::time::Duration> {
        self.shared
            .landing
            .left(operation_id, self.shared.clock.as_ref())
    }

    /// The configured routes, in the config file's order.
    pub fn routes(&self) -> impl Iterator<Item = &Route> {
        self.routes.iter().map(|active| active.route.as_ref())
    }

    /// Follows the routes the store holds paused (set through a peer
    /// replica, or its latch).
    pub(crate) fn follow_pauses(&self, paused: &[String]) {
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
        // Phase 0, once: from here on a standard method is upper-case.
        method::normalize(&mut request);
        let tunnel = method::refuse_tunnel(request.method());
        // The head as sent, before its path is normalized.
        let head_bytes = head_size(&request);
        // Phase 0, once: from here on the request's path is in normal form.
        let normalized = request_path::normalize(request.uri_mut());
        let host = host::normalize(&mut request);
        let fields = fields::normalize(&mut request);
        let path = request.uri().path().to_string();
        let reserved = normalized.is_ok() && path.starts_with(status::PREFIX);
        // What logs and traces write: never a lookup's key, even in a
        // path that could not be normalized (its `.` still encoded), nor
        // a segment's parameters.
        let logged = if status::names_a_lookup(&path) {
            Cow::Borrowed(status::logged_path(&path))
        } else {
            request_path::without_parameters(&path)
        };
        let routed = normalized.and_then(|()| {
            if reserved {
                return Ok(None);
            }
            route::select_unambiguous(&self.routes, self.spellings, &path, |active| &active.route)
                .map(Option::<&Arc<ActiveRoute>>::cloned)
        });
        let active = routed.as_ref().ok().cloned().flatten();
        if let Some(active) = &active {
            // Phase 1, once: from here on a method the route names is
            // spelled as it names it.
            method::normalize_for(&active.route.methods, &mut request);
        }
        let method = request.method().clone();
        let answered = if head_bytes > self.max_header_bytes {
            Err(ProxyError::HeadersTooLarge {
                limit: self.max_header_bytes,
            })
        } else if let Err(error) = tunnel {
            Err(error.into())
        } else if self.misdirected_admin_call(&path, request.headers()) {
            Err(ProxyError::MisdirectedAdminCall)
        } else if let Err(error) = routed {
            Err(error.into())
        } else if let Err(error) = host {
            Err(error.into())
        } else if let Err(error) = fields {
            Err(error.into())
        } else if reserved {
            status::lookup(
                self.shared.operators.as_ref(),
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
                let version = request.version();
                let request = request.map(|body| stream(ClientBody::new(body, version)));
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
            path: &logged,
            outcome,
            status: response.status().as_u16(),
            operation_id,
            replayed: outcome == Outcome::replayed,
        });
        if let Some(access_log) = &self.access_log {
            access_log.write(&AccessLine {
                route,
                method: &method,
                path: &logged,
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

    /// Phases 2 to 4 for a write the route intercepts — key and scope,
    /// body, fingerprint — with phase 5's look-up by exact digest between
    /// the two digests; then phases 5 to 7. A key the gateway made is
    /// announced on whatever answer the write gets.
    async fn write_answer(
        self: &Arc<Self>,
        active: &Arc<ActiveRoute>,
        request: Request<Incoming>,
        peer: Peer,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let route = &active.route;
        let sent_key = self.sent_key(route, request.headers())?;
        let (parts, body) = request.into_parts();
        let scope = self.scope_of(route, &parts)?;
        // Goes with the body to the attempt, which may hold it longest.
        let body = read_body(&parts, body, route, &self.body_budget).await?;
        let now = self.shared.clock.now_millis();
        let exact = digest_of(route, &parts, &body.0, ExactDigest::compute).await?;
        let sent = sent_key.map(|key| self.name(route, &scope, key, true));
        if let Some(replay) = self.replay_exact(sent.as_ref(), &exact, now) {
            return Ok(replay);
        }
        let fingerprint = digest_of(route, &parts, &body.0, fingerprint::compute).await?;
        let named = match sent {
            Some(named) => named,
            None => {
                let key = made_key(route, &scope, &fingerprint, (&parts.headers, &body.0))?;
                self.name(route, &scope, key, false)
            }
        };
        let write = self.identify(route, named, scope, (fingerprint, exact), now);
        let made = (!write.key_sent).then(|| write.key.clone());
        let payload = Payload {
            parts,
            body,
            peer,
            call: None,
        };
        let answered = self.replay_or_send(active, write, payload).await;
        let response =
            answered.unwrap_or_else(|error| error.into_response_as(route.profile.wire()));
        Ok(announce(response, route.profile.wire(), made.as_ref()))
    }

    /// Phase 2, the key: the one the client sent, if any. Refused when the
    /// route requires one and none came, or when the profile dates its
    /// requests and this one's first-sent time is outside the window.
    fn sent_key(
        &self,
        route: &Route,
        headers: &HeaderMap,
    ) -> Result<Option<IdempotencyKey>, ProxyError> {
        let wire = route.profile.wire();
        let sent = IdempotencyKey::from_wire(headers, wire)?;
        if sent.is_none() && route.key == KeyMode::Require {
            return Err(ProxyError::MissingKey);
        }
        if sent.is_some() {
            let now = self.shared.clock.now_millis();
            let window = wire::FirstSentWindow {
                retention: self.retention,
                skew: route.first_sent_skew,
            };
            wire::check_first_sent(wire, headers, now, window)?;
        }
        Ok(sent)
    }

    /// Phase 2, the scope of a write on `route`: its scope headers,
    /// narrowed as its profile says.
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
        let wire = route.profile.wire();
        Ok(scope.narrowed(wire, parts.uri.path(), &parts.headers, &self.scope_key)?)
    }

    /// `key` with the identity it names on `route` in `scope` ([`Named`]),
    /// once per write; `sent`: the client sent it.
    fn name(&self, route: &Route, scope: &Scope, key: IdempotencyKey, sent: bool) -> Named {
        let identity = claim::identity(&route.name, scope.as_str(), key.as_str());
        traces::note_key(|| self.scope_key.trace_label(&identity));
        Named {
            key,
            sent,
            identity,
        }
    }

    /// The end of phase 4: the write's context, built once its key and
    /// fingerprint are known. `now` (ms, the store's clock) is read once,
    /// when the body is whole.
    fn identify(
        &self,
        route: &Route,
        named: Named,
        scope: Scope,
        (fingerprint, exact): (Fingerprint, ExactDigest),
        now: i64,
    ) -> Write {
        let Named {
            key,
            sent,
            identity,
        } = named;
        // An identical request is the same derived operation only within the window.
        let fresh_after = (!sent && route.key == KeyMode::Derive && route.derive_from.is_empty())
            .then(|| now - clock::millis(route.derive_window));
        // Completed operations the store may have deleted (retention) or
        // superseded (derive window) are never answered from the cache.
        let valid_after = self
            .retained_after(now)
            .max(fresh_after.unwrap_or(i64::MIN));
        Write {
            key,
            key_sent: sent,
            scope,
            identity,
            fingerprint,
            exact,
            valid_after,
            fresh_after,
        }
    }

    /// What the store may still hold at `now` (ms): operations updated
    /// after this.
    fn retained_after(&self, now: i64) -> i64 {
        now - clock::millis(self.retention)
    }

    /// Phase 5, early: most retries are sent byte for byte under the key
    /// the client sent, and are answered here, from the cache, before
    /// their JSON is parsed for the fingerprint.
    fn replay_exact(
        &self,
        sent: Option<&Named>,
        exact: &ExactDigest,
        now: i64,
    ) -> Option<Response<ProxyBody>> {
        let named = sent?;
        let replays = &self.shared.replays;
        replays.answer_exact(&named.identity, exact, self.retained_after(now))
    }

    /// Phase 5, then 6 and 7: other replays (the same payload spelled
    /// otherwise, or cached from the store) are answered from the cache,
    /// without a task or a store call; the rest are claimed and sent.
    async fn replay_or_send(
        self: &Arc<Self>,
        active: &Arc<ActiveRoute>,
        write: Write,
        payload: Payload,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let replays = &self.shared.replays;
        let cached = replays.answer(&write.identity, &write.fingerprint, write.valid_after);
        match cached {
            Some(answer) => answer,
            None => self.spawn_write(active, write, payload).await,
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
        payload: Payload,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let (reply_tx, reply_rx) = oneshot::channel();
        let (this, active) = (self.clone(), active.clone());
        // Each phase's future boxed: inline, the task's future was ~18 KiB,
        // copied whole into the task as it was spawned.
        self.tasks.spawn(traces::in_current(async move {
            match Box::pin(this.claim(&active, write, payload)).await {
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

    /// Phase 6: the claim decides whether the write is sent (the attempt,
    /// phase 7, which owns the write's context from then on) or answered
    /// from the store. A held operation is probed once (unless its latest
    /// probe was too recent: the spacing is the reconciler's), then claimed
    /// again: whatever settled it meanwhile (this probe, the one that was
    /// running, a late response, an operator) answers, and one the probe
    /// released (`not_attempted`) is this request's to send.
    async fn claim(
        &self,
        active: &Arc<ActiveRoute>,
        write: Write,
        payload: Payload,
    ) -> Result<Next, ProxyError> {
        let route = &active.route;
        let new = Arc::new(write.new_operation(route, &payload.parts, &payload.body.0));
        let credentials = reconcile::credentials(&payload.parts.headers, route);
        // Taken before the claim is sent: a lease that lapses from here on
        // voids it, even once renewed (a peer may have taken over).
        let permit = self.shared.store.fence().permit();
        let (mut probed, mut found) = (false, false);
        let (claim, in_flight) = loop {
            match self.claim_once(active, &write, &new).await? {
                Claimed::Send(claim, guard) if found => {
                    drop(guard);
                    return self.hold_found(&claim, &write).await;
                }
                Claimed::Send(claim, guard) => break (claim, guard),
                Claimed::Answer(response) => return Ok(Next::Answer(response)),
                Claimed::Held(operation)
                    if probed || !reconcile::probes(route, write.key.as_str()) =>
                {
                    return replay::answer_existing(&operation, &write.fingerprint)
                        .map(Next::Answer);
                }
                Claimed::Held(operation) => {
                    probed = true;
                    let ctx = self.shared.probe_ctx();
                    let key = write.key.as_str();
                    // Boxed: rare, and its future would make every claim's as large.
                    found = Box::pin(self.shared.reconciler.reconcile(
                        &ctx,
                        active,
                        &operation.id,
                        key,
                        &credentials,
                    ))
                    .await;
                }
            }
        };
        let Payload {
            parts,
            body,
            peer,
            call,
        } = payload;
        let request = WriteRequest::new(route, parts, body, (write.key.as_str(), &claim), &peer)?;
        Ok(Next::Send(Box::new(Attempt {
            shared: self.shared.clone(),
            active: active.clone(),
            in_flight: Some(in_flight),
            request,
            claim,
            permit,
            credentials,
            quota: StoredCharge::new(&self.shared.quotas, route, write.scope.as_str()),
            call,
            write,
        })))
    }

    /// An attempt claimed right after this request's probe found its write
    /// at the destination (an operator's `not_attempted` landed while the
    /// probe ran, and the probe's finding could not settle it): never sent,
    /// it is held `unknown` (`found-at-destination`), for the next probe or
    /// an operator to settle as what it is, and the client is told so.
    async fn hold_found(&self, claim: &Claim, write: &Write) -> Result<Next, ProxyError> {
        let settlement = Settlement::Unknown {
            evidence: FOUND_BY_PROBE.into(),
        };
        let event = Event {
            kind: FOUND_BY_PROBE,
            detail: serde_json::json!({ "attempt": claim.attempt, "sent": false }),
        };
        let store = self.shared.store.as_ref();
        record::keep_recording(
            store,
            claim,
            &settlement,
            &[event],
            &CancellationToken::new(),
        )
        .await;
        tracing::warn!(operation_id = %claim.operation_id, "a probe found the write at the destination as an operator resolved it not_attempted: held again, not sent");
        let held = self.shared.operators.get(&claim.operation_id).await;
        let held = held.map_err(ProxyError::store)?;
        match held {
            Some((operation, _)) => {
                replay::answer_existing(&operation, &write.fingerprint).map(Next::Answer)
            }
            None => Err(ProxyError::UnknownOperation),
        }
    }

    /// One claim of `new` (sent, answered, or held), under the route's
    /// pause and the scope's quota as they stand now; a claim that sends
    /// is counted against the quota.
    async fn claim_once(
        &self,
        active: &ActiveRoute,
        write: &Write,
        new: &Arc<NewOperation>,
    ) -> Result<Claimed, ProxyError> {
        let route = &active.route;
        let sources = claim::Sources {
            store: self.shared.store.as_ref(),
            in_flight: &self.in_flight,
            cache: &self.shared.replays,
        };
        let hold = self.hold(active, write.scope.as_str());
        let claimed = claim::claim(&sources, route, write, new, hold);
        let claimed = traces::child(Step::Claim, claimed).await?;
        if matches!(claimed, Claimed::Send(..)) {
            let request_bytes = new.request.body.as_ref().map_or(0, Vec::len);
            let now = self.shared.clock.now_millis();
            let scope = write.scope.as_str();
            self.shared.quotas.count(route, scope, request_bytes, now);
        }
        Ok(claimed)
    }

    /// Why no write may be sent on `active` for `scope` now, if any: the
    /// route is paused, or the scope has used its quota.
    fn hold(&self, active: &ActiveRoute, scope: &str) -> Option<Hold> {
        if active.paused.load(Ordering::SeqCst) {
            return Some(Hold::Paused);
        }
        let now = self.shared.clock.now_millis();
        let spent = self.shared.quotas.check(&active.route, scope, now).err();
        spent.map(Hold::OverQuota)
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

/// A write's context, as pingora's `CTX`: who the write is, built once
/// when its key and fingerprint are known (the end of phase 4), then read
/// by reference by every phase after — the replay cache, the claim, and
/// the attempt, which owns it once claimed.
struct Write {
    key: IdempotencyKey,
    /// The client sent the key; otherwise the gateway made it (assigned
    /// or derived) and the answer says it.
    key_sent: bool,
    scope: Scope,
    /// Route, scope and key joined ([`claim::identity`]): the write's name
    /// in the in-flight map and the replay cache.
    identity: String,
    fingerprint: Fingerprint,
    /// The request exactly as sent, kept with its response for replays.
    exact: ExactDigest,
    /// Cached completed operations updated before this (ms, the store's
    /// clock) are not answered.
    valid_after: i64,
    /// A key derived from the fingerprint alone names the same operation
    /// only within the route's `derive_window`: where the window starts
    /// ([`NewOperation::fresh_after`]).
    fresh_after: Option<i64>,
}

impl Write {
    /// The operation this write would become, as the claim stores it:
    /// made once the cache has no answer, since it hashes the body.
    fn new_operation(&self, route: &Route, parts: &request::Parts, body: &[u8]) -> NewOperation {
        NewOperation {
            route: route.name.clone(),
            scope: self.scope.as_str().to_string(),
            key: self.key.as_str().to_string(),
            fingerprint: self.fingerprint.clone(),
            request: request_summary(route, parts, body),
            fresh_after: self.fresh_after,
            // Whoever named the key: a keyless retry of a keyed write
            // (a model that drops an optional key) is a twin too, and so
            // is an assigned key's write, new by construction as it is.
            refuse_held_twin: route.rotated_keys == RotatedKeys::Hold,
        }
    }
}

/// A write's key and the identity it names ([`claim::identity`]), made
/// once per write as soon as the key is known: a key the client sent
/// before the fingerprint, since the cache's look-up by exact digest
/// needs it; a key the gateway makes from the fingerprint, after it.
struct Named {
    key: IdempotencyKey,
    /// The client sent it.
    sent: bool,
    identity: String,
}

/// What a claimed write sends: its head, its body (and the body's bytes in
/// the shared budget), the client's address for the forwarded headers.
struct Payload {
    parts: request::Parts,
    body: (Bytes, Reservation),
    peer: Peer,
    /// An MCP tool call, in flight: its upstream answer is read as
    /// JSON-RPC for its id ([`mcp::outcome`]).
    call: Option<mcp::cancel::Pending>,
}

/// What the store keeps of a write's request.
fn request_summary(route: &Route, parts: &request::Parts, body: &[u8]) -> RequestSummary {
    let path_and_query = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    RequestSummary {
        method: parts.method.to_string(),
        path: path_and_query.to_string(),
        content_type: parts
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
        body_size: body.len() as u64,
        body_sha256: fingerprint::digest_hex(Sha256::new_with_prefix(body)),
        body: route.store_request_body.then(|| body.to_vec()),
    }
}

/// `response` with the key the gateway `made`, if it made one: the key
/// the client must retry with, whatever the answer.
fn announce(
    mut response: Response<ProxyBody>,
    wire: &Wire,
    made: Option<&IdempotencyKey>,
) -> Response<ProxyBody> {
    if let Some(key) = made
        && let Ok(value) = HeaderValue::from_str(&wire.spelled_key(key.as_str()))
    {
        response.headers_mut().insert(IDEMPOTENCY_KEY, value);
    }
    response
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

/// Whether `path` has a segment `admin` (in any case), ended by `/`, `;`,
/// an encoded `/` or the path's end: where an admin API call lands,
/// below whatever prefix.
fn names_admin(path: &str) -> bool {
    let bytes = path.as_bytes();
    path.match_indices('/').any(|(at, _)| {
        let rest = &bytes[at..];
        rest.len() >= 6
            && rest[..6].eq_ignore_ascii_case(b"/admin")
            && match &rest[6..] {
                [] | [b'/' | b';', ..] => true,
                [b'%', b'2', f, ..] => f.eq_ignore_ascii_case(&b'f'),
                _ => false,
            }
    })
}

/// The key for a write that sent none: assigned, or derived from the
/// request — from `derive_from`'s fields only in a body the fingerprint
/// reads as JSON too (its media type says so), so that the fields which
/// make it one action are compared as the fingerprint compares it.
fn made_key(
    route: &Route,
    scope: &Scope,
    fingerprint: &Fingerprint,
    (headers, body): (&http::HeaderMap, &[u8]),
) -> Result<IdempotencyKey, ProxyError> {
    let not_derived = |why| ProxyError::KeyNotDerived {
        fields: route.derive_from.join(", "),
        why,
    };
    match route.key {
        KeyMode::Assign => Ok(IdempotencyKey::assign()),
        KeyMode::Derive if route.derive_from.is_empty() => {
            Ok(IdempotencyKey::derive_from_fingerprint(scope, fingerprint))
        }
        KeyMode::Derive if !fingerprint::is_json(headers) => Err(not_derived(
            "its Content-Type is not application/json or a +json type",
        )),
        KeyMode::Derive => IdempotencyKey::derive_from_body(scope, &route.derive_from, body)
            .ok_or_else(|| {
                not_derived("the body is not JSON, lacks one of them, holds one as null, or names a member on the way twice")
            }),
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
        operation: None,
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
                // hyper ends the body of a stream the client reset with
                // `NO_ERROR` as if it had ended; h2 still says it did not
                // (no END_STREAM came). Cut short, it is not the write
                // the client sent, with or without a declared length.
                let ended =
                    parts.version != http::Version::HTTP_2 || http_body::Body::is_end_stream(&body);
                if declared.is_some() || !ended {
                    return Err(cut_short(size, declared).into());
                }
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
        if parts.version == http::Version::HTTP_2 && declared.is_some() {
            stream_ends(&mut body).await?;
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

/// Why a body that stopped after `size` bytes, of `declared` if it said,
/// is not read whole.
fn cut_short(size: usize, declared: Option<u64>) -> String {
    let of = declared.map_or(String::new(), |declared| format!(" of {declared}"));
    format!("the stream was reset before its body ended ({size}{of} bytes came)")
}

/// Waits for the end of an HTTP/2 request stream whose declared length has
/// arrived: it must end there (RFC 9113 §8.1.1), and one that brings more
/// DATA is malformed — never forwarded cut to its length, a write other
/// than the one sent. Trailers and empty DATA are no more content; a reset
/// by the client once the whole body is in is a hang-up, the body whole.
async fn stream_ends<B>(body: &mut B) -> Result<(), BoxError>
where
    B: http_body::Body<Data = Bytes, Error = BoxError> + Unpin,
{
    while !body.is_end_stream() {
        match body.frame().await {
            None => break,
            Some(Ok(frame)) if frame.data_ref().is_none_or(Bytes::is_empty) => {}
            Some(Ok(_)) => {
                return Err("the stream brought more DATA than its content-length".into());
            }
            Some(Err(error)) => {
                let cause: &(dyn std::error::Error + 'static) = &*error;
                if crate::body::h2_cause(cause).is_some_and(|h2| h2.is_remote() && h2.is_reset()) {
                    break;
                }
                return Err(error);
            }
        }
    }
    Ok(())
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
