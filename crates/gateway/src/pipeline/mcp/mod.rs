//! The `mcp` profile: Model Context Protocol tool calls over Streamable
//! HTTP, as protected writes of the same pipeline (docs/mcp.md).
//!
//! An MCP endpoint takes every JSON-RPC message as a POST to one path. A
//! POST whose body is a `tools/call` request of a protected tool is a
//! write: keyed, fingerprinted, claimed and recorded like any other
//! ([`call`], [`identity`]); everything else — `initialize`, notifications,
//! `tools/list`, resources, prompts, a read-only tool, GET and DELETE on
//! the endpoint — is streamed through unchanged. The upstream's answer (a
//! JSON body or an event stream) is reduced to the JSON-RPC response for
//! the call's id ([`outcome`]), and every answer to a protected call —
//! first, replayed, or the gateway's own — is a JSON-RPC response under
//! the id of the request being answered ([`answer`]).
//!
//! Here, the route's side of the pipeline's dispatch: a POST read whole
//! and classified ([`Proxy::handle_mcp`]), a protected call's context made
//! and handed to phases 5 to 7 as any write's ([`Proxy::mcp_write`]), and
//! a session's DELETE held back while its calls run
//! ([`Proxy::end_session_later`]).
//!
//! Invariants, beside the pipeline's own (claimed before anything is sent,
//! recorded before the client hears, a lost answer held `unknown`):
//! - a call's identity is its scope, route, tool and key, never its
//!   JSON-RPC id nor a session id, so an agent's retry (a new id, perhaps
//!   a new session) is the same operation;
//! - a POST whose body is no JSON the gateway reads is refused as
//!   JSON-RPC answers a parse error (400, `-32700`, id null), with nothing
//!   sent: it cannot be told from a tool call;
//! - a request whose `Mcp-Method`/`Mcp-Name` headers disagree with its
//!   body is refused as the 2026-07-28 revision says (400, `-32020`), with
//!   nothing sent, before it is classified;
//! - a stored answer is a JSON-RPC response; whoever reads it back
//!   answers under its own request's id.

pub mod answer;
pub mod call;
pub mod cancel;
pub mod identity;
pub mod outcome;
pub mod relay;
pub mod tools;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, request};
use hyper::body::Incoming;
use tokio::sync::oneshot;

use crate::body::ProxyBody;
use crate::metrics::Outcome;
use crate::pipeline::budget::Reservation;
use crate::pipeline::error::ProxyError;
use crate::pipeline::fingerprint::ExactDigest;
use crate::pipeline::forward::{self, Peer};
use crate::pipeline::key::Scope;
use crate::pipeline::{ActiveRoute, Payload, Proxy, read_body};
use crate::profile::Profile;
use idemgate_model::clock;
use idemgate_model::operation::State;
use idemgate_store::{ListFilter, MARKED_IN_FLIGHT, StoreError};

/// Who sent a protected call, as the request's reading found it: its scope
/// (or why it has none) and the caller its cancellations name.
struct Sender {
    scope: Result<Scope, ProxyError>,
    caller: cancel::Caller,
}

impl Proxy {
    /// A POST to an MCP route: read whole, then a protected tool call is a
    /// write whose every answer is a JSON-RPC response, and anything else
    /// is sent on as it came (a `tools/list` answer read for its tools'
    /// annotations on the way back).
    pub(super) async fn handle_mcp(
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
        // The caller's scope: whose calls a cancellation without a session
        // names, whose listings tell what a call is, and a protected call's
        // own (none refuses it as a write).
        let scope = self.scope_of(route, &parts);
        let digest = scope.as_ref().map(|s| s.as_str()).unwrap_or_default();
        let tools = route.mcp.clone().unwrap_or_default();
        let endpoint = tools::listed_at(&parts.uri, &route.path_prefix, digest);
        let caller = cancel::Caller::of(&parts.headers, digest.to_string());
        match active.calls.cancelling(&caller, &body) {
            cancel::Cancelling::Nothing => {}
            cancel::Cancelling::Alone => return answer::accepted(),
            cancel::Cancelling::InBatch => {
                return answer::refused(call::Refusal {
                    id: serde_json::Value::Null,
                    code: call::code::INVALID_REQUEST,
                    message: "a cancellation of a protected call in flight is taken one per \
                              request: send it alone, not in a batch"
                        .into(),
                });
            }
        }
        let known = (&active.learned, endpoint.as_str());
        match call::classify(&parts.headers, &body, &tools, known) {
            call::Classified::Refused(refusal) => answer::refused(refusal),
            call::Classified::Protected(call) => {
                let sender = Sender { scope, caller };
                Box::pin(self.mcp_call(active, (parts, sender), (body, reservation), peer, call))
                    .await
            }
            call::Classified::PassThrough { listing } => {
                drop(reservation);
                let mut parts = parts;
                if listing {
                    // Read for its tools' annotations on the way back.
                    forward::ask_for_identity(&mut parts.headers);
                }
                let request = Request::from_parts(parts, crate::body::full(body));
                let pass = forward::pass_through(&active.client, route, request, &peer);
                match Box::pin(pass).await {
                    Ok(response) if listing => tools::read_listing(response, route, known).await,
                    Ok(response) => response,
                    Err(error) => error.into_response(),
                }
            }
        }
    }

    /// Looks at each MCP route's newest held calls for one marked `unknown`
    /// with its attempt in flight ([`MARKED_IN_FLIGHT`]: a restart, a stop
    /// past its grace, a lost peer) lately enough that it may still run at
    /// its server — `upstream_timeout` and `late_window` from the mark (its
    /// owner sends nothing after it): until then the route keeps back what would stop it
    /// there ([`cancel::InFlightCalls::recovered`]). At start, and on a
    /// shared store each time the replicas are looked after.
    pub(crate) async fn follow_marked_calls(&self) -> Result<(), StoreError> {
        /// Newest held calls looked at per route.
        const NEWEST: u32 = 100;
        let operators = &self.shared.operators;
        let now = self.shared.clock.now_millis();
        for active in self
            .routes
            .iter()
            .filter(|a| a.route.profile == Profile::Mcp)
        {
            let route = &active.route;
            let running = clock::millis(route.upstream_timeout + route.late_window);
            let filter = ListFilter {
                state: Some(State::Unknown),
                route: Some(route.name.clone()),
                key: None,
                before: None,
                limit: NEWEST,
            };
            let mut latest = None;
            for summary in operators.list(&filter).await? {
                if summary.updated_at.saturating_add(running) <= now {
                    continue;
                }
                let Some((operation, _)) = operators.get(&summary.id).await? else {
                    continue;
                };
                if MARKED_IN_FLIGHT.contains(&operation.evidence.as_str()) {
                    latest = latest.max(Some(operation.updated_at));
                }
            }
            let left = latest.map(|at| at.saturating_add(running).saturating_sub(now));
            if let Some(left) = left.filter(|left| *left > 0) {
                active
                    .calls
                    .recovered(Duration::from_millis(left.unsigned_abs()));
            }
        }
        Ok(())
    }

    /// An MCP session's DELETE while its protected calls are in flight:
    /// answered at once, and sent on once they have ended (or after the
    /// route's `upstream_timeout` and `late_window`), so that the server
    /// does not cancel them ([`cancel`]); one per session.
    pub(super) fn end_session_later(
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
    /// streamed from that first event on ([`relay`]), its response
    /// last, once recorded.
    async fn mcp_call(
        self: &Arc<Self>,
        active: &Arc<ActiveRoute>,
        request: (request::Parts, Sender),
        body: (Bytes, Reservation),
        peer: Peer,
        call: call::Call,
    ) -> Response<ProxyBody> {
        let (relay, relayed) = match call.accepts_stream {
            true => {
                let (relay, relayed) = relay::Relay::new(active.route.max_stored_response);
                (Some(relay), Some(relayed))
            }
            false => (None, None),
        };
        let (this, route, called) = (self.clone(), active.clone(), call.clone());
        let mut write = Box::pin(async move {
            this.mcp_write(&route, request, body, peer, &called, relay)
                .await
        });
        let Some(mut relayed) = relayed else {
            return answer::finish(write.await, &call).await;
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
                        response.extensions_mut().insert(outcome::Relayed(early));
                    }
                    response
                });
                return answer::finish(answered, &call).await;
            }
        };
        let (tail, tail_rx) = oneshot::channel();
        self.tasks.spawn(async move {
            let answered = write.await;
            drop(tail.send(answer::finish_streamed(answered, &call).await));
        });
        answer::streamed(relay::Streamed::new(first, relayed, tail_rx))
    }

    /// A protected tool call as a write: its scope, key and fingerprint
    /// ([`identity`]) make its context, then phases 5 to 7 as for any
    /// route.
    async fn mcp_write(
        self: &Arc<Self>,
        active: &Arc<ActiveRoute>,
        (mut parts, sender): (request::Parts, Sender),
        body: (Bytes, Reservation),
        peer: Peer,
        call: &call::Call,
        relay: Option<relay::Relay>,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let route = &active.route;
        let Sender { scope, caller } = sender;
        let scope = scope?;
        let request = (&parts.uri, &parts.headers);
        let identified = identity::identify(call, request, &body.0, route, &scope)?;
        let sent = identified.source == identity::KeySource::Sent;
        let named = self.name(route, &scope, identified.key, sent);
        let exact = ExactDigest::of(&identified.fingerprint);
        let now = self.shared.clock.now_millis();
        let write = self.identify(route, named, scope, (identified.fingerprint, exact), now);
        // Its answer is read as JSON-RPC ([`outcome`]): in no coding.
        forward::ask_for_identity(&mut parts.headers);
        let call = Some(active.calls.track(caller, &call.id, relay));
        let payload = Payload {
            parts,
            body,
            peer,
            call,
        };
        self.replay_or_send(active, write, payload).await
    }
}
