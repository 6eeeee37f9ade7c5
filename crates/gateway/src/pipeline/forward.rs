//! The `forward` phase: the rewriting of a request for the upstream, the
//! exchange on the route's connections (`pool`), and the
//! classification of how an exchange ended.
//!
//! Invariants:
//! - hop-by-hop headers never cross idemgate in either direction; `Host` is
//!   the upstream's; `X-Forwarded-For`/`-Proto` say who asked;
//! - a response sent on is the gateway's own message: its status line is
//!   `HTTP/1.1` with the status's canonical reason phrase, a replay's
//!   alike, whatever version and phrase the upstream answered with;
//! - a write is re-sent by idemgate only when the client proves that no byte
//!   of it reached the upstream (a connect failure, a TLS handshake either
//!   side refused): [`Exchange::NotSent`]. One that found every connection
//!   its route may hold open in use ([`pool::Slots`]) is never written:
//!   [`Exchange::Busy`]. Every other failure may have reached the upstream
//!   and is [`Exchange::Lost`];
//! - a write's `upstream_timeout` runs from when the request is handed to
//!   a connection that is up ([`Pool::establish`], then
//!   [`Pool::send_on`]): a connect is bounded by `connect_timeout` alone,
//!   and one that fails or runs out is [`Exchange::NotSent`]. So nothing is
//!   written to the upstream after its client was answered that the
//!   outcome is unknown unless it was handed over before: the exchange
//!   read on after the timeout ([`Sent::late`]) never connects;
//! - a response is [`Exchange::Complete`] only when its whole body arrived;
//! - an answer streamed to the client ([`Streamed`]: passed through, or a
//!   write's not stored) is cut when the upstream sends nothing for
//!   `upstream_timeout`, so a silent upstream holds neither connection.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{HeaderMap, Request, Response, Uri, request};
use http_body::Body as _;
use http_body_util::{BodyExt, Limited};
use hyper_rustls::HttpsConnectorBuilder;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::time::{Instant, timeout_at};

use crate::body::{ClientBodyError, IdleTimeout, ProxyBody, full, stream};
use crate::config::Route;
use crate::metrics::{Metrics, Outcome};
use crate::pipeline::budget::Reservation;
use crate::pipeline::connector::{FenceDown, UpstreamConnector};
use crate::pipeline::error::{OperationRef, ProxyError};
use crate::pipeline::fields::foreign_coding;
use crate::pipeline::host::ViaTls;
use crate::pipeline::pool::{self, Handback, Pool, PooledBody, SendError, Slots};
use crate::pipeline::sse;
use crate::tls::error_chain;
use crate::tls::{Reloadable, TlsError};
use crate::traces;
use idemgate_model::backoff::Backoff;
use idemgate_store::{Claim, Fence, Permit};

/// The client of reconcile probes, whose URLs may name any host.
pub type ProbeClient = Client<UpstreamConnector, ProxyBody>;

/// Before connect retry `n`: full jitter under 100 ms doubling, up to 2 s.
pub(crate) const CONNECT_BACKOFF: Backoff =
    Backoff::full_jitter(Duration::from_millis(100), Duration::from_secs(2));

/// The connector for a route: plain http, or https via rustls trusting the
/// webpki roots and the route's `upstream_ca`, presenting its client
/// certificate if it has one. A TLS handshake runs inside the connector, so
/// its failure is a connect error: the request was not written. With a
/// `fence` (claimed writes), a connection that comes up after the fence
/// stopped holding is dropped unwritten. `identity` is the route's client
/// certificate ([`ClientTls::identity`](crate::config::ClientTls)), shared
/// by its connectors so that a reload reaches all of them.
fn connector(
    route: &Route,
    fence: Option<Fence>,
    identity: Option<&Reloadable>,
) -> Result<UpstreamConnector, TlsError> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(route.connect_timeout));
    let tls = HttpsConnectorBuilder::new()
        .with_tls_config(route.upstream_tls.client_config(identity)?)
        .https_or_http();
    // ALPN offers `h2` only on a route that speaks HTTP/2 to its upstream.
    let https = if route.upstream_http2 {
        tls.enable_all_versions().wrap_connector(http)
    } else {
        tls.enable_http1().wrap_connector(http)
    };
    Ok(UpstreamConnector { https, fence })
}

/// The connections to the route's upstream (pass-through requests, or
/// with the store's `fence`, claimed writes), each holding one of the
/// route's `slots`.
pub fn pool(
    route: &Route,
    fence: Option<Fence>,
    slots: &Arc<Slots>,
    identity: Option<&Reloadable>,
) -> Result<Arc<Pool>, TlsError> {
    Ok(Pool::new(
        connector(route, fence, identity)?,
        route.upstream.origin.clone(),
        route.upstream_http2,
        route.connect_timeout,
        slots.clone(),
    ))
}

/// The connections a route may hold open to its upstream at once, for
/// its [`pool`]s to share: a request that finds them all in use waits
/// `connect_timeout` for one.
pub fn slots(route: &Route) -> Arc<Slots> {
    Slots::new(route.max_upstream_connections, route.connect_timeout)
}

/// What a request that found every connection to its route's upstream in
/// use gets, nothing sent: 503 `overloaded`, about `operation` if any.
pub(crate) fn overloaded(operation: Option<OperationRef>) -> ProxyError {
    ProxyError::Overloaded {
        what: "connections to this route's upstream (max_upstream_connections)",
        operation,
    }
}

/// The client certificate the route's upstream connections present, read
/// from its files now; the same one for every connector of the route, so
/// that a reload reaches them all.
pub fn identity(route: &Route) -> Result<Option<Reloadable>, TlsError> {
    route.upstream_tls.identity()
}

/// A pooled HTTP/1.1 client with the route's TLS configuration, for its
/// reconcile probes.
pub fn probe_client(route: &Route, identity: Option<&Reloadable>) -> Result<ProbeClient, TlsError> {
    Ok(Client::builder(TokioExecutor::new())
        .pool_idle_timeout(pool::IDLE_TIMEOUT)
        .http1_max_headers(pool::MAX_HEAD_FIELDS)
        .build(connector(route, None, identity)?))
}

/// The hop-by-hop headers of RFC 9110 §7.6.1 (and the pre-standard
/// `Keep-Alive` and `Proxy-Connection`, and the proxy's own credentials),
/// in [`hop_by_hop_index`]'s order. Not `Trailer`: it names the trailer
/// fields a message carries end to end, and HTTP/1.1 sends only the
/// trailer fields it names.
static HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
];

/// Where `Transfer-Encoding` is in [`HOP_BY_HOP`].
const TRANSFER_ENCODING_AT: usize = 4;

/// Where a (lower-case) header name is in [`HOP_BY_HOP`]: a match on the
/// name, about three times quicker than comparing it with each entry.
fn hop_by_hop_index(name: &str) -> Option<usize> {
    Some(match name {
        "connection" => 0,
        "proxy-authenticate" => 1,
        "proxy-authorization" => 2,
        "te" => 3,
        "transfer-encoding" => TRANSFER_ENCODING_AT,
        "upgrade" => 5,
        "keep-alive" => 6,
        "proxy-connection" => 7,
        _ => return None,
    })
}

/// Removes hop-by-hop headers: the fixed RFC 9110 set and any the
/// `Connection` header names; and with `Transfer-Encoding`, which framed
/// the message and overrides it, a `Content-Length` it came with (RFC 9112
/// §6.3: a sender must remove it before forwarding; kept, it would frame
/// the body for the next hop by a length it does not have). One pass over
/// the names finds them; a head with none is not changed, and one whose
/// `Connection` names only hop-by-hop tokens (`keep-alive`, `close`), as
/// most do, is stripped without an allocation.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Bit i: HOP_BY_HOP[i] is present.
    let mut present = 0u16;
    for name in headers.keys() {
        if let Some(i) = hop_by_hop_index(name.as_str()) {
            present |= 1 << i;
        }
    }
    if present == 0 {
        return;
    }
    // Read before `Connection` goes with the fixed set.
    let mut named = Vec::new();
    let tokens = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim);
    for token in tokens {
        let fixed = HOP_BY_HOP
            .iter()
            .any(|h| h.as_str().eq_ignore_ascii_case(token));
        if token.is_empty() || fixed || !headers.contains_key(token) {
            continue;
        }
        if let Ok(name) = HeaderName::from_bytes(token.as_bytes()) {
            named.push(name);
        }
    }
    for (i, name) in HOP_BY_HOP.iter().enumerate() {
        if present & (1 << i) != 0 {
            headers.remove(name);
        }
    }
    if present & (1 << TRANSFER_ENCODING_AT) != 0 {
        headers.remove(header::CONTENT_LENGTH);
    }
    for name in named {
        headers.remove(name);
    }
}

/// The client end of a connection, with its `X-Forwarded-For` entry
/// written once for all the connection's requests.
#[derive(Clone)]
pub struct Peer {
    addr: SocketAddr,
    entry: HeaderValue,
}

impl Peer {
    pub fn new(addr: SocketAddr) -> Peer {
        let entry = HeaderValue::from_maybe_shared(Bytes::from(addr.ip().to_string()))
            .unwrap_or(HeaderValue::from_static("unknown"));
        Peer { addr, entry }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn ip(&self) -> IpAddr {
        self.addr.ip()
    }
}

/// Rewrites a request head, in place, as the upstream gets it, for writes
/// and pass-through alike. Its path is the request's as `Proxy::handle`
/// left it: normalized ([`crate::request_path`]), so the upstream
/// performs the write on the path that was routed and fingerprinted; the
/// request line is in origin form (the connection is the upstream's).
fn upstream_head(route: &Route, parts: &mut request::Parts, peer: &Peer) {
    if parts.uri.scheme().is_some() || parts.uri.authority().is_some() {
        let path_and_query = parts
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        parts.uri = Uri::from(path_and_query);
    }
    let headers = &mut parts.headers;
    strip_hop_by_hop(headers);
    headers.remove(header::EXPECT);
    headers.insert(header::HOST, route.upstream.host.clone());
    let forwarded = forwarded_for(headers, peer);
    headers.insert(X_FORWARDED_FOR, forwarded);
    let proto = match parts.extensions.get::<ViaTls>() {
        Some(ViaTls) => "https",
        None => "http",
    };
    headers.insert("x-forwarded-proto", HeaderValue::from_static(proto));
    // Traced, the upstream's parent is idemgate's span, not the client's.
    traces::inject(headers);
    // What hyper put there for idemgate is not the upstream's business.
    parts.extensions.clear();
    parts.version = http::Version::HTTP_11;
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// `X-Forwarded-For` with the peer appended. Repeated field lines are one
/// comma-separated list (RFC 9110 §5.3), so the peer goes after all of them
/// combined, in order; empty lines add nothing.
fn forwarded_for(headers: &HeaderMap, peer: &Peer) -> HeaderValue {
    let mut list = Vec::new();
    for value in headers.get_all(X_FORWARDED_FOR) {
        if !value.as_bytes().trim_ascii().is_empty() {
            list.extend_from_slice(value.as_bytes().trim_ascii());
            list.extend_from_slice(b", ");
        }
    }
    if list.is_empty() {
        return peer.entry.clone();
    }
    list.extend_from_slice(peer.entry.as_bytes());
    HeaderValue::from_maybe_shared(Bytes::from(list)).unwrap_or_else(|_| peer.entry.clone())
}

/// Makes an upstream's response head the gateway's own to send on (RFC
/// 9110 §2.5: an intermediary answers in its own HTTP version): hop-by-hop
/// fields stripped, the version the gateway's (an `HTTP/1.0` upstream's
/// would close an HTTP/1.1 client's connection after the answer), and
/// nothing hyper noted about the exchange kept — the upstream's reason
/// phrase among it, so the status line is the canonical one a replay has.
fn own_head(head: &mut http::response::Parts) {
    strip_hop_by_hop(&mut head.headers);
    head.version = http::Version::HTTP_11;
    head.extensions.clear();
}

/// Asks for an answer in no content coding (RFC 9110 §12.5.3), in place
/// of the codings the client takes, on a request whose answer the gateway
/// reads — an MCP tool call, a `tools/list`, a reconcile probe — since it
/// decodes none. Without an `Accept-Encoding` any coding is acceptable,
/// so the field is sent, not dropped.
pub(crate) fn ask_for_identity(headers: &mut HeaderMap) {
    headers.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
}

/// The content coding an answer is in (`Content-Encoding`), if any other
/// than `identity`: what the gateway cannot read.
pub(crate) fn content_coding(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .flat_map(|value| value.to_str().unwrap_or("?").split(','))
        .map(str::trim)
        .find(|coding| !coding.is_empty() && !coding.eq_ignore_ascii_case("identity"))
        .map(str::to_ascii_lowercase)
}

/// Streams a request the gateway does not intercept to the upstream and its
/// response back, unchanged but for hop-by-hop headers: the head within
/// `upstream_timeout` of having a connection to send it on (503
/// `overloaded` when none comes free in time), and the body as long as it
/// keeps coming, cut when the upstream sends nothing for as long
/// ([`Streamed`]).
pub(crate) async fn pass_through(
    pool: &Arc<Pool>,
    route: &Route,
    request: Request<ProxyBody>,
    peer: &Peer,
) -> Result<Response<ProxyBody>, ProxyError> {
    let (mut parts, body) = request.into_parts();
    upstream_head(route, &mut parts, peer);
    // A body of unknown length — HTTP/1.1's chunked, HTTP/2's without a
    // `content-length` (its HEADERS did not end the stream) — goes
    // chunked: on a GET, HEAD or CONNECT hyper would otherwise send none
    // of it. An HTTP/2 upstream frames it itself (`pool`).
    if !body.is_end_stream() && body.size_hint().exact().is_none() {
        let chunked = HeaderValue::from_static("chunked");
        parts.headers.insert(header::TRANSFER_ENCODING, chunked);
    }
    let upstream = Request::from_parts(parts, body);
    let ticket = pool.ticket().await.map_err(|_| overloaded(None))?;
    let sent = tokio::time::timeout(route.upstream_timeout, pool.send(upstream, ticket)).await;
    let response = match sent {
        Err(_) => return Err(ProxyError::UpstreamTimeout),
        Ok(Err(error)) => return Err(failed_pass_through(error)),
        Ok(Ok(response)) => response,
    };
    let (mut parts, body) = response.into_parts();
    if let Some(coding) = foreign_coding(&parts.headers) {
        return Err(ProxyError::UpstreamFailed {
            reason: format!(
                "the answer is in the transfer coding `{coding}`, which the gateway does not decode"
            ),
        });
    }
    own_head(&mut parts);
    let body = stream(IdleTimeout::new(body, route.upstream_timeout));
    let mut response = Response::from_parts(parts, body);
    response.extensions_mut().insert(Outcome::proxied);
    Ok(response)
}

/// What a passed-through request's failed exchange is to its client: its
/// own body's failure (400), no room for it, or the upstream's failure,
/// before a byte was written or after.
fn failed_pass_through(error: SendError) -> ProxyError {
    if let Some(failed) = ClientBodyError::under(&error) {
        return ProxyError::BodyRead {
            reason: failed.0.to_string(),
        };
    }
    match error {
        SendError::Busy { .. } => overloaded(None),
        error if not_written(&error) => ProxyError::UpstreamUnreachable {
            operation: None,
            reason: error_chain(&error),
        },
        error => ProxyError::UpstreamFailed {
            reason: error_chain(&error),
        },
    }
}

/// A buffered write on its way upstream.
pub(crate) struct WriteRequest {
    head: request::Parts,
    body: Bytes,
    /// A later attempt under a destination key: a 409 or a 425 is the
    /// destination still working on an earlier attempt under that key (as
    /// Stripe's says), no outcome, so the operation is held `unknown`.
    busy_is_unknown: bool,
    /// The body's bytes in the shared budget, returned with the request:
    /// the attempt may hold it after the client has its answer.
    _budget: Reservation,
}

impl WriteRequest {
    /// Rewrites a buffered write for `claim`'s attempt: the key in
    /// `forward_key_header`, the operation's id in the destination key's
    /// header (replacing the client's key when both name one header:
    /// docs/requests.md, "A destination key"), each bare but in an
    /// `Idempotency-Key` as the profile spells it there
    /// ([`crate::profile::Wire::spelled_key`]); the body sent with a
    /// Content-Length.
    pub fn new(
        route: &Route,
        mut head: request::Parts,
        (body, budget): (Bytes, Reservation),
        (key, claim): (&str, &Claim),
        peer: &Peer,
    ) -> Result<Self, ProxyError> {
        let operation_id = claim.operation_id.as_str();
        upstream_head(route, &mut head, peer);
        head.headers.remove(crate::pipeline::key::IDEMPOTENCY_KEY);
        let wire = route.profile.wire();
        let value = |name: &HeaderName, text: &str| {
            let spelled = if name == crate::pipeline::key::IDEMPOTENCY_KEY {
                wire.spelled_key(text)
            } else {
                text.into()
            };
            HeaderValue::from_str(&spelled).map_err(|e| ProxyError::Internal {
                reason: e.to_string(),
            })
        };
        if let Some(name) = &route.forward_key_header {
            head.headers.insert(name.clone(), value(name, key)?);
        }
        if let Some(destination) = &route.destination_key {
            let name = &destination.header;
            head.headers
                .insert(name.clone(), value(name, operation_id)?);
        }
        head.headers
            .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
        Ok(WriteRequest {
            head,
            body,
            busy_is_unknown: route.destination_key.is_some() && claim.attempt > 1,
            _budget: budget,
        })
    }

    pub(crate) fn body_len(&self) -> usize {
        self.body.len()
    }

    fn build(&self) -> Request<ProxyBody> {
        let mut request = Request::new(full(self.body.clone()));
        *request.method_mut() = self.head.method.clone();
        *request.uri_mut() = self.head.uri.clone();
        *request.version_mut() = self.head.version;
        *request.headers_mut() = self.head.headers.clone();
        // Sent in the upstream exchange's span, each try: its parent.
        traces::inject(request.headers_mut());
        request
    }
}

/// How an exchange for a write ended, by how far the request got.
pub enum Exchange {
    /// No byte was written after every connect retry.
    NotSent { attempts: u32, reason: String },
    /// No byte was written: before try `attempts` the store's fence no
    /// longer held, so this process may no longer own the operation.
    Fenced { attempts: u32 },
    /// No byte was written: for try `attempts`, every connection the route
    /// may hold open to its upstream stayed in use as long as it waits.
    Busy { attempts: u32, reason: String },
    /// Written (or maybe written) but no complete response came back.
    Lost { cause: LostCause, reason: String },
    /// A response whose status is one of the route's `unknown_statuses`
    /// (502, 504): the write may have happened; passed through as it streams.
    Classified {
        head: http::response::Parts,
        body: Streamed,
    },
    /// A response whose status is one of the route's `release_statuses`
    /// (429, 503): the upstream refused the write. Its body is read whole
    /// (up to `max_stored_response`; past that, or cut, it is dropped and
    /// the head alone answers), because every duplicate that waited on this
    /// attempt gets the same answer.
    Released {
        head: http::response::Parts,
        body: Bytes,
    },
    /// A full response within `max_stored_response`.
    Complete {
        head: http::response::Parts,
        body: Bytes,
    },
    /// The head arrived but the body is larger than `max_stored_response`:
    /// what was read so far, and the rest to stream.
    Oversized {
        head: http::response::Parts,
        prefix: Bytes,
        rest: Streamed,
    },
}

/// The rest of an upstream's answer, streamed to the client as it comes:
/// it fails when the upstream sends nothing for `upstream_timeout` (the
/// client's answer is cut, the upstream connection closed), however long
/// the whole takes.
pub type Streamed = IdleTimeout<PooledBody>;

impl Exchange {
    /// Whether a byte of the request may have reached the upstream: not
    /// for a request refused before a byte was written (a connect that
    /// failed, a lost fence, no connection free).
    pub(crate) fn written(&self) -> bool {
        !matches!(
            self,
            Exchange::NotSent { .. } | Exchange::Fenced { .. } | Exchange::Busy { .. }
        )
    }

    /// How far the request got, in a word, and the upstream's status if
    /// it answered (for traces).
    pub fn summary(&self) -> (&'static str, Option<u16>) {
        match self {
            Exchange::NotSent { .. } => ("not_sent", None),
            Exchange::Fenced { .. } => ("fenced", None),
            Exchange::Busy { .. } => ("busy", None),
            Exchange::Lost { .. } => ("lost", None),
            Exchange::Classified { head, .. } => ("classified", Some(head.status.as_u16())),
            Exchange::Released { head, .. } => ("released", Some(head.status.as_u16())),
            Exchange::Complete { head, .. } => ("complete", Some(head.status.as_u16())),
            Exchange::Oversized { head, .. } => ("oversized", Some(head.status.as_u16())),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostCause {
    /// `upstream_timeout` ran out (answered 504).
    Timeout,
    /// Reset, closed or truncated after writing (answered 502).
    Broken,
    /// Answered, but with a failure that does not say whether the write
    /// ran: an MCP server's JSON-RPC error other than those that say the
    /// call never started, or its 5xx (answered 502).
    Failed,
}

impl LostCause {
    pub fn evidence(self) -> &'static str {
        match self {
            LostCause::Timeout => "timeout",
            LostCause::Broken => "reset",
            LostCause::Failed => "error-answer",
        }
    }
}

/// The rest of an exchange that timed out: it resolves to how the exchange
/// ended after all, if the upstream answers late.
pub(crate) type Late = Pin<Box<dyn Future<Output = Exchange> + Send>>;

/// A write's exchange, and its continuation when it timed out.
pub struct Sent {
    pub(crate) exchange: Exchange,
    pub(crate) tries: u32,
    pub(crate) late: Option<Late>,
}

/// The longest [`send_write`] may be writing to the destination after it
/// began: every connect try's waits for a connection (a slot and a
/// connect, `connect_timeout` each) and the backoff between them, then
/// the exchange itself, bounded by `upstream_timeout` (a late response,
/// read on after that, is another matter: [`Sent::late`]).
pub(crate) fn longest_write(route: &Route) -> Duration {
    let retries = route.connect_retries;
    route.connect_timeout.saturating_mul(2 * (retries + 1))
        + CONNECT_BACKOFF.ceiling(retries).saturating_mul(retries)
        + route.upstream_timeout
}

/// Sends a write and reads its response, retrying only connect failures.
/// Each try first takes what it sends on ([`Pool::ticket`]; none within
/// the wait is [`Exchange::Busy`]), then has it up within
/// `connect_timeout` ([`Pool::establish`]; nothing is written before, so
/// a connect that fails or takes longer is a try that sent nothing), and
/// its `upstream_timeout` runs from when the request is handed to that
/// connection. Before every try `permit` must hold (the fence, unlapsed
/// since the claim), and every new connection must have come up with the
/// fence holding (`pool`'s connector), or nothing is written.
/// On `upstream_timeout` the exchange is not dropped: [`Sent::late`] goes on
/// listening, for the caller to bound by `late_window`; it only ever reads
/// the answer to what was handed over, and never connects nor sends.
/// With `answer`, a response that is an event stream is read event by
/// event ([`read_events`]): its answer kept, the rest handed over as it
/// comes.
pub(crate) async fn send_write(
    pool: &Arc<Pool>,
    route: &Arc<Route>,
    request: &WriteRequest,
    permit: &Permit,
    metrics: &Metrics,
    mut answer: Option<Box<dyn EventAnswer>>,
) -> Sent {
    let mut tries = 0;
    loop {
        tries += 1;
        let ended = |exchange, late| Sent {
            exchange,
            tries,
            late,
        };
        let error = match try_write(pool, route, request, (permit, tries), &mut answer).await {
            Ok((exchange, late)) => return ended(exchange, late),
            Err(TryFailed::Fenced) => return ended(Exchange::Fenced { attempts: tries }, None),
            Err(TryFailed::Send(error)) => error,
        };
        let reason = error_chain(&error);
        let exchange = match error {
            _ if fenced_off(&error) => Exchange::Fenced { attempts: tries },
            SendError::Busy { .. } => Exchange::Busy {
                attempts: tries,
                reason,
            },
            _ if not_written(&error) && tries <= route.connect_retries => {
                traces::connect_retry(tries, || reason);
                metrics.connect_retry(&route.name);
                tokio::time::sleep(CONNECT_BACKOFF.delay(tries - 1)).await;
                continue;
            }
            _ if not_written(&error) => Exchange::NotSent {
                attempts: tries,
                reason,
            },
            _ => lost(LostCause::Broken, reason),
        };
        return ended(exchange, None);
    }
}

/// Why a try of [`send_write`] got no response head.
enum TryFailed {
    /// The fence no longer held after the wait for a connection: nothing
    /// was written.
    Fenced,
    /// The pool's error, for `send_write` to read whether anything was
    /// written.
    Send(SendError),
}

/// Try `tries` of [`send_write`]: a connection, up within `connect_timeout`,
/// then the exchange on it within `upstream_timeout`, timed from when the
/// request is handed over; a reused connection that hands it back untaken
/// makes way for another, with a clock of its own.
async fn try_write(
    pool: &Arc<Pool>,
    route: &Arc<Route>,
    request: &WriteRequest,
    (permit, tries): (&Permit, u32),
    answer: &mut Option<Box<dyn EventAnswer>>,
) -> Result<(Exchange, Option<Late>), TryFailed> {
    let mut ticket = pool.ticket().await.map_err(TryFailed::Send)?;
    // After the wait for a connection, which may have been long.
    if !permit.holds() {
        return Err(TryFailed::Fenced);
    }
    let busy = request.busy_is_unknown;
    let mut upstream = request.build();
    loop {
        let connected = pool.establish(ticket).await.map_err(TryFailed::Send)?;
        let deadline = Instant::now() + route.upstream_timeout;
        let pool = pool.clone();
        let mut pending = Box::pin(async move { pool.send_on(connected, upstream).await });
        let response = match timeout_at(deadline, pending.as_mut()).await {
            Ok(Ok(response)) => response,
            Ok(Err(Handback::Untaken(untaken))) => {
                (upstream, ticket) = (untaken.request, untaken.next);
                continue;
            }
            Ok(Err(Handback::Failed(error))) => return Err(TryFailed::Send(error)),
            Err(_) => {
                let route = route.clone();
                let answer = answer.take();
                let late: Late = Box::pin(async move {
                    match pending.await {
                        Ok(response) => {
                            read_response(response, &route, (None, busy), answer)
                                .await
                                .0
                        }
                        Err(Handback::Untaken(_)) => Exchange::NotSent {
                            attempts: tries,
                            reason: "the connection closed before taking the request".into(),
                        },
                        Err(Handback::Failed(e)) => lost(LostCause::Broken, error_chain(&e)),
                    }
                });
                let timeout = lost(LostCause::Timeout, "no response head in time".into());
                return Ok((timeout, Some(late)));
            }
        };
        return Ok(read_response(response, route, (Some(deadline), busy), answer.take()).await);
    }
}

/// Whether a failed exchange proves that the request reached no upstream:
/// a connect failure (refused, DNS, `connect_timeout`, or a TLS handshake
/// that idemgate itself broke off: an untrusted or mismatched certificate),
/// an HTTP/2 stream the upstream refused unprocessed ([`SendError::Refused`]),
/// or a handshake the upstream refused. In TLS 1.3 a server checks the
/// client's certificate after the client's side of the handshake is done,
/// so its refusal (a handshake alert: `certificate_required`,
/// `bad_certificate`, `unknown_ca`, …) arrives while the response is
/// awaited; a server that refused the handshake never reads what follows
/// it, so the request reached no HTTP server. Any other failure may have.
/// ([`connector`](super::connector) makes sure the refusal reaches the
/// request itself.)
fn not_written(error: &SendError) -> bool {
    matches!(error, SendError::Connect(_) | SendError::Refused(_)) || handshake_refused(error)
}

/// Whether the connector dropped a new connection unwritten because the
/// fence stopped holding while it connected.
fn fenced_off(error: &SendError) -> bool {
    let causes: &(dyn std::error::Error + 'static) = error;
    matches!(error, SendError::Connect(_))
        && std::iter::successors(Some(causes), |e| e.source())
            .take(16)
            .any(|e| e.is::<FenceDown>())
}

/// A handshake alert from the upstream anywhere in `error`'s causes
/// (rustls's error travels inside an `io::Error`).
fn handshake_refused(error: &(dyn std::error::Error + 'static)) -> bool {
    use rustls::AlertDescription as Alert;
    std::iter::successors(Some(error), |e| e.source())
        .take(16)
        .filter_map(|e| {
            e.downcast_ref::<rustls::Error>().or_else(|| {
                e.downcast_ref::<std::io::Error>()?
                    .get_ref()?
                    .downcast_ref::<rustls::Error>()
            })
        })
        .any(|tls| {
            matches!(
                tls,
                rustls::Error::AlertReceived(
                    Alert::HandshakeFailure
                        | Alert::BadCertificate
                        | Alert::UnsupportedCertificate
                        | Alert::CertificateRevoked
                        | Alert::CertificateExpired
                        | Alert::CertificateUnknown
                        | Alert::UnknownCA
                        | Alert::AccessDenied
                        | Alert::CertificateRequired
                )
            )
        })
}

/// The next frame of `body`, by `deadline` if any (`Err` past it).
async fn next_frame(
    body: &mut PooledBody,
    deadline: Option<Instant>,
) -> Result<
    Option<Result<http_body::Frame<Bytes>, <PooledBody as http_body::Body>::Error>>,
    tokio::time::error::Elapsed,
> {
    match deadline {
        Some(deadline) => timeout_at(deadline, body.frame()).await,
        None => Ok(body.frame().await),
    }
}

/// Why an event stream's call is held: an event larger than it stores.
fn too_large(bytes: usize) -> String {
    format!("an event of the answer's stream is over max_stored_response ({bytes} bytes and more)")
}

/// An answer larger than `route` stores: what was read, and the rest.
fn oversized(
    route: &Route,
    head: http::response::Parts,
    prefix: Bytes,
    rest: PooledBody,
) -> Exchange {
    let rest = IdleTimeout::new(rest, route.upstream_timeout);
    Exchange::Oversized { head, prefix, rest }
}

fn lost(cause: LostCause, reason: String) -> Exchange {
    Exchange::Lost { cause, reason }
}

/// Reads a response head's body as far as the route needs, by `deadline` if
/// any. A body that times out comes back as `Lost` with its continuation.
async fn read_response(
    response: Response<PooledBody>,
    route: &Arc<Route>,
    (deadline, busy_is_unknown): (Option<Instant>, bool),
    answer: Option<Box<dyn EventAnswer>>,
) -> (Exchange, Option<Late>) {
    {
        let (mut head, body) = response.into_parts();
        let coded = foreign_coding(&head.headers);
        own_head(&mut head);
        // Kept and replayed without its trailer fields (a stored response
        // has none), a write's answer announces none.
        head.headers.remove(header::TRAILER);
        let status = head.status.as_u16();
        let unknown = route.unknown_statuses.contains(&status)
            || (busy_is_unknown && matches!(status, 409 | 425));
        // A success is what it says, whatever a header adds.
        let released = route.release_statuses.contains(&status)
            || (status >= 400
                && !unknown
                && route.profile.wire().says_retry_is_safe(&head.headers));
        if let Some(coding) = coded {
            // A status that says nothing was done says so in any coding:
            // released, its body (which cannot be passed on) left out.
            if released {
                without_its_body(&mut head.headers);
                return (
                    Exchange::Released {
                        head,
                        body: Bytes::new(),
                    },
                    None,
                );
            }
            // Any other answer cannot be passed on or stored: what it
            // said is not known here.
            let reason = format!(
                "the upstream answered in the transfer coding `{coding}`, which the gateway does not decode"
            );
            return (lost(LostCause::Broken, reason), None);
        }
        if head.status.is_informational() {
            // hyper hands a 101 to the caller; to a write that asked for no
            // upgrade it is no final answer, and the request was written.
            return (
                lost(
                    LostCause::Broken,
                    format!("the upstream answered {status}, which is not a final response"),
                ),
                None,
            );
        }
        if released {
            let body = read_released(&mut head, body, route, deadline).await;
            return (Exchange::Released { head, body }, None);
        }
        if unknown {
            let body = IdleTimeout::new(body, route.upstream_timeout);
            return (Exchange::Classified { head, body }, None);
        }
        let streamed = head
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.trim_start().starts_with("text/event-stream"));
        // An event stream in a content coding (asked for none) is not read
        // event by event: nothing of it is relayed, and its reader holds
        // it (the MCP outcome's reading).
        let readable = streamed && content_coding(&head.headers).is_none();
        if let (Some(answer), true) = (answer, readable) {
            return read_events(head, body, route, deadline, answer, sse::Events::default()).await;
        }
        let declared = head
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > route.max_stored_response as u64) {
            return (oversized(route, head, Bytes::new(), body), None);
        }
        read_body(head, BytesMut::new(), body, route, deadline).await
    }
}

/// What reads an event stream for a write's answer (an MCP tool call's
/// JSON-RPC response among the server's notifications and requests).
pub trait EventAnswer: Send + 'static {
    /// Takes one complete `event`, as sent: `Some` when it is the answer
    /// (to keep), `None` when it is not (the taker relays it).
    fn take(&mut self, event: Bytes) -> Option<Bytes>;
}

/// Reads an event stream by `deadline` until the event `answer` keeps: a
/// `Complete` exchange whose body is that event. A stream that ends
/// first completes empty (no answer in it); one that times out comes back
/// `Lost` with its continuation; an event past `max_stored_response`
/// (the answer, or one before it) is `Lost` too: what the call did cannot
/// be stored, so it is held. Boxed: its continuation is itself.
fn read_events(
    head: http::response::Parts,
    mut body: PooledBody,
    route: &Arc<Route>,
    deadline: Option<Instant>,
    mut answer: Box<dyn EventAnswer>,
    mut events: sse::Events,
) -> Pin<Box<dyn Future<Output = (Exchange, Option<Late>)> + Send + '_>> {
    Box::pin(async move {
        loop {
            let next = next_frame(&mut body, deadline).await;
            let frame = match next {
                Err(_) => {
                    let route = route.clone();
                    let late: Late = Box::pin(async move {
                        read_events(head, body, &route, None, answer, events)
                            .await
                            .0
                    });
                    let reason = "no answer in the event stream in time".to_string();
                    return (lost(LostCause::Timeout, reason), Some(late));
                }
                Ok(None) => {
                    let body = Bytes::new();
                    return (Exchange::Complete { head, body }, None);
                }
                Ok(Some(Err(e))) => {
                    let reason = format!("event stream cut: {}", error_chain(&e));
                    return (lost(LostCause::Broken, reason), None);
                }
                Ok(Some(Ok(frame))) => frame,
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            for event in events.push(&data) {
                // However the bytes were split: one rule for an event too large.
                if event.len() > route.max_stored_response {
                    return (lost(LostCause::Failed, too_large(event.len())), None);
                }
                if let Some(kept) = answer.take(event) {
                    return (Exchange::Complete { head, body: kept }, None);
                }
            }
            if events.pending() > route.max_stored_response {
                return (lost(LostCause::Failed, too_large(events.pending())), None);
            }
        }
    })
}

/// A release status's body, read whole by `deadline` and within
/// `max_stored_response`; empty when it is larger, cut or late
/// ([`without_its_body`]): the status and the other headers are what say
/// "back off".
async fn read_released(
    head: &mut http::response::Parts,
    body: PooledBody,
    route: &Route,
    deadline: Option<Instant>,
) -> Bytes {
    let collect = Limited::new(body, route.max_stored_response).collect();
    let read = match deadline {
        Some(deadline) => timeout_at(deadline, collect).await.ok(),
        None => Some(collect.await),
    };
    match read {
        Some(Ok(collected)) => collected.to_bytes(),
        _ => {
            without_its_body(&mut head.headers);
            Bytes::new()
        }
    }
}

/// Drops the headers that describe a body (its length, type, coding and
/// range) from an answer passed on without it: an SDK would parse the
/// empty body as what they say.
fn without_its_body(headers: &mut http::HeaderMap) {
    for described in [
        header::CONTENT_LENGTH,
        header::CONTENT_TYPE,
        header::CONTENT_ENCODING,
        header::CONTENT_RANGE,
    ] {
        headers.remove(described);
    }
}

/// Buffers a body up to `max_stored_response`. Boxed: its continuation
/// (after a timeout) is itself.
fn read_body(
    head: http::response::Parts,
    mut buffer: BytesMut,
    mut body: PooledBody,
    route: &Arc<Route>,
    deadline: Option<Instant>,
) -> Pin<Box<dyn Future<Output = (Exchange, Option<Late>)> + Send + '_>> {
    Box::pin(async move {
        loop {
            let next = next_frame(&mut body, deadline).await;
            match next {
                Err(_) => {
                    let reason = format!("response body incomplete after {} bytes", buffer.len());
                    let route = route.clone();
                    let late: Late =
                        Box::pin(
                            async move { read_body(head, buffer, body, &route, None).await.0 },
                        );
                    return (lost(LostCause::Timeout, reason), Some(late));
                }
                Ok(None) => {
                    return (
                        Exchange::Complete {
                            head,
                            body: buffer.freeze(),
                        },
                        None,
                    );
                }
                Ok(Some(Err(e))) => {
                    let reason = format!(
                        "response body cut after {} bytes: {}",
                        buffer.len(),
                        error_chain(&e)
                    );
                    return (lost(LostCause::Broken, reason), None);
                }
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        buffer.extend_from_slice(&data);
                        if buffer.len() > route.max_stored_response {
                            return (oversized(route, head, buffer.freeze(), body), None);
                        }
                    }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_handshake_alert_proves_the_request_unread() {
        use rustls::AlertDescription as Alert;
        use std::io::{Error, ErrorKind};
        // As rustls reports it through tokio-rustls: inside an io::Error.
        let alert = |a| Error::new(ErrorKind::InvalidData, rustls::Error::AlertReceived(a));
        assert!(handshake_refused(&alert(Alert::CertificateRequired)));
        assert!(handshake_refused(&alert(Alert::UnknownCA)));
        assert!(handshake_refused(&rustls::Error::AlertReceived(
            Alert::BadCertificate
        )));
        // Alerts that may come after the request was read, and plain resets.
        assert!(!handshake_refused(&alert(Alert::InternalError)));
        assert!(!handshake_refused(&alert(Alert::DecodeError)));
        assert!(!handshake_refused(&Error::from(ErrorKind::ConnectionReset)));
        assert!(!handshake_refused(&Error::new(
            ErrorKind::InvalidData,
            rustls::Error::DecryptError
        )));
    }

    #[test]
    fn forwarded_for_appends_the_peer_to_every_line_combined() {
        let peer = Peer::new(SocketAddr::from(([192, 0, 2, 9], 40000)));
        let mut headers = HeaderMap::new();
        assert_eq!(forwarded_for(&headers, &peer), "192.0.2.9");
        for line in ["10.0.0.1", " ", "10.0.0.2, 10.0.0.3 "] {
            headers.append(X_FORWARDED_FOR, HeaderValue::from_static(line));
        }
        assert_eq!(
            forwarded_for(&headers, &peer),
            "10.0.0.1, 10.0.0.2, 10.0.0.3, 192.0.2.9"
        );
        let v6 = Peer::new(SocketAddr::from(([0, 0, 0, 0, 0, 0, 0, 1], 40000)));
        assert_eq!(
            forwarded_for(&headers, &v6),
            "10.0.0.1, 10.0.0.2, 10.0.0.3, ::1"
        );
    }

    #[test]
    fn each_hop_by_hop_name_is_found_at_its_place() {
        for (i, name) in HOP_BY_HOP.iter().enumerate() {
            assert_eq!(hop_by_hop_index(name.as_str()), Some(i), "{name}");
        }
        assert_eq!(hop_by_hop_index("content-type"), None);
    }

    #[test]
    fn hop_by_hop_headers_are_removed() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret-hop"),
        );
        headers.insert("x-secret-hop", HeaderValue::from_static("1"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
        headers.insert(header::UPGRADE, HeaderValue::from_static("h2c"));
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.append(header::CONNECTION, HeaderValue::from_static(" X-Other-Hop"));
        headers.insert("x-other-hop", HeaderValue::from_static("2"));
        headers.append(header::TE, HeaderValue::from_static("gzip"));
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers.len(), 1, "{headers:?}");
        assert!(headers.contains_key(header::CONTENT_TYPE));

        let mut end_to_end = HeaderMap::new();
        end_to_end.insert(header::HOST, HeaderValue::from_static("a"));
        end_to_end.append("x-tag", HeaderValue::from_static("1"));
        end_to_end.append("x-tag", HeaderValue::from_static("2"));
        let before = end_to_end.clone();
        strip_hop_by_hop(&mut end_to_end);
        assert_eq!(end_to_end, before);
    }
}
