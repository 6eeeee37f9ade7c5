//! Shared harness for the integration tests: fake upstream → idemgate → client.
//!
//! - [`FakeUpstream`]: a real HTTP/1.1 server on `127.0.0.1:0` that records
//!   every request and counts *committed writes* — non-GET requests whose
//!   handler got past its commit point, i.e. side effects the upstream would
//!   have performed. Paths choose the behaviour:
//!   - default: commit, wait `?ms=N` if given, answer 201 `{"id": n,
//!     "received": <body>}` with two `x-upstream-tag` headers (to check
//!     header order and duplicates);
//!   - `/slow?ms=N`: commit, sleep N ms, then answer like the default;
//!   - `/big?bytes=N`: commit, answer 200 with an N-byte body ([`big_body`]);
//!   - `/hold`: commit, then never answer (until the upstream is dropped);
//!   - `/drop`: commit, then close the connection without an answer;
//!   - `/truncate`: commit, announce a 100-byte body and stop after 6 bytes;
//!   - `/status/{code}`: answer `code` *without* committing (a refusal);
//!   - `/commit-then/{code}`: commit, then answer `code` (the write happened,
//!     the answer says otherwise: a 502/504 from a proxy in front of the API);
//!   - `/once/{code}[?ms=N]`: the first write per `Idempotency-Key` waits N
//!     ms and gets `code` uncommitted; later ones commit and wait N ms, then
//!     answer like the default.
//!
//!   GET and HEAD are recorded and answered 200 but never counted as writes,
//!   except `GET /lookup?key=K` (a reconcile probe's target): 200
//!   `{"id": n}` when a write was committed under `Idempotency-Key: K`, 404
//!   otherwise. Accepted TCP connections are counted too.
//! - [`RawUpstream`]: a TCP listener that counts connections and breaks each
//!   one on purpose (close at once, or reset after reading the request).
//! - [`TestGateway`]: an in-process gateway on a per-test SQLite file;
//!   [`Setup`] adds config lines, another upstream URL or a manual clock.
//! - [`BinaryGateway`]: the real `idemgate serve` process; [`BinaryMock`]:
//!   the real `idemgate mock-upstream`.
//! - [`send`] / [`write`]: one request through a fresh hyper client;
//!   [`try_send`] when the peer may break or stay silent.
//! - [`raw_exchange`]: raw TCP, for malformed or hand-framed requests.
//! - [`TestGateway::operation`]: an operation as the admin API shows it
//!   (state, attempts, evidence, timeline), for gateways set up with
//!   [`Setup::admin`].
//!
//! No fixed ports; every wait is bounded by [`WAIT`].
#![allow(dead_code)] // each test binary uses a different subset

use std::collections::{HashMap, HashSet};
use std::io::BufRead;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use idemgate::clock::Clock;
use idemgate::config::Config;
use idemgate::server::Gateway;
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Upper bound for any single wait in these tests.
pub const WAIT: Duration = Duration::from_secs(15);

/// The credential most tests write with (the default scope header).
pub const ALICE: &str = "Bearer alice-token";
pub const BOB: &str = "Bearer bob-token";

// ---------------------------------------------------------------- upstream

/// One request as the upstream received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: Method,
    /// Path and query, as sent on the request line.
    pub uri: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("ascii header"))
    }
}

struct UpstreamState {
    requests: Mutex<Vec<Recorded>>,
    /// How many requests were recorded, to wait on.
    received: watch::Sender<usize>,
    writes: watch::Sender<usize>,
    connections: AtomicUsize,
    /// Upstream id of the write committed under each `Idempotency-Key`.
    by_key: Mutex<HashMap<String, usize>>,
    /// Keys that already got their one refusal on `/once/{code}`.
    refused_once: Mutex<HashSet<String>>,
}

/// A recording HTTP/1.1 upstream; stops serving when dropped.
pub struct FakeUpstream {
    addr: SocketAddr,
    state: Arc<UpstreamState>,
    accept: tokio::task::JoinHandle<()>,
}

impl FakeUpstream {
    pub async fn start() -> FakeUpstream {
        FakeUpstream::start_on(SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    /// Serves on `addr`: a port that was refused a moment ago comes alive.
    pub async fn start_on(addr: SocketAddr) -> FakeUpstream {
        let listener = TcpListener::bind(addr).await.expect("bind upstream");
        let addr = listener.local_addr().expect("upstream addr");
        let state = Arc::new(UpstreamState {
            requests: Mutex::new(Vec::new()),
            received: watch::channel(0).0,
            writes: watch::channel(0).0,
            connections: AtomicUsize::new(0),
            by_key: Mutex::new(HashMap::new()),
            refused_once: Mutex::new(HashSet::new()),
        });
        let accept_state = state.clone();
        // The JoinSet lives inside the accept task: aborting that task drops
        // it, which aborts every connection, including held ones.
        let accept = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                accept_state.connections.fetch_add(1, Ordering::SeqCst);
                let state = accept_state.clone();
                connections.spawn(async move {
                    let service = service_fn(move |req| handle(state.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
                while connections.try_join_next().is_some() {}
            }
        });
        FakeUpstream {
            addr,
            state,
            accept,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Committed writes so far.
    pub fn writes(&self) -> usize {
        *self.state.writes.borrow()
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().expect("requests lock").clone()
    }

    /// Requests whose method is not GET/HEAD.
    pub fn write_requests(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| !is_read(&r.method))
            .collect()
    }

    /// Waits until at least `n` writes were committed; panics after [`WAIT`].
    pub async fn wait_for_writes(&self, n: usize) {
        let mut rx = self.state.writes.subscribe();
        tokio::time::timeout(WAIT, rx.wait_for(|w| *w >= n))
            .await
            .unwrap_or_else(|_| panic!("upstream saw {} writes, expected {n}", self.writes()))
            .expect("writes channel open");
    }

    /// Waits until at least `n` requests (of any kind) arrived; panics after [`WAIT`].
    pub async fn wait_for_requests(&self, n: usize) {
        let mut rx = self.state.received.subscribe();
        tokio::time::timeout(WAIT, rx.wait_for(|r| *r >= n))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "upstream received {} requests, expected {n}",
                    self.requests().len()
                )
            })
            .expect("received channel open");
    }
}

impl Drop for FakeUpstream {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

fn is_read(method: &Method) -> bool {
    method == Method::GET || method == Method::HEAD
}

/// The deterministic body `/big?bytes=N` answers with.
pub fn big_body(n: usize) -> Vec<u8> {
    (0..n).map(|i| b'a' + (i % 26) as u8).collect()
}

fn query_value<'a>(uri: &'a http::Uri, name: &str) -> Option<&'a str> {
    uri.query()?
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

fn query_number(uri: &http::Uri, name: &str) -> Option<u64> {
    query_value(uri, name).and_then(|v| v.parse().ok())
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type UpstreamBody = BoxBody<Bytes, BoxError>;

/// `Err` makes hyper close the connection without an answer (`/drop`).
async fn handle(
    state: Arc<UpstreamState>,
    req: Request<Incoming>,
) -> Result<hyper::Response<UpstreamBody>, BoxError> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let uri = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    let received = serde_json::from_slice::<Value>(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    let key = parts
        .headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    {
        let mut requests = state.requests.lock().expect("requests lock");
        requests.push(Recorded {
            method: parts.method.clone(),
            uri,
            headers: parts.headers.clone(),
            body,
        });
        state.received.send_replace(requests.len());
    }
    let path = parts.uri.path();

    if is_read(&parts.method) {
        if path == "/lookup" {
            return Ok(lookup(&state, query_value(&parts.uri, "key")));
        }
        let id = state.requests.lock().expect("requests lock").len();
        return Ok(json_response(StatusCode::OK, id, received));
    }

    if let Some(code) = path.strip_prefix("/status/") {
        return Ok(status_response(code));
    }
    let delay = Duration::from_millis(query_number(&parts.uri, "ms").unwrap_or(0));
    if let Some(code) = path.strip_prefix("/once/") {
        let first = state
            .refused_once
            .lock()
            .expect("refused lock")
            .insert(key.clone().unwrap_or_default());
        if first {
            tokio::time::sleep(delay).await;
            return Ok(status_response(code));
        }
    }

    // Commit point: from here on the upstream has "done" the write.
    let mut id = 0;
    state.writes.send_modify(|w| {
        *w += 1;
        id = *w;
    });
    if let Some(key) = key {
        state.by_key.lock().expect("by_key lock").insert(key, id);
    }

    match path {
        "/slow" => {
            let ms = query_number(&parts.uri, "ms").unwrap_or(300);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(json_response(StatusCode::CREATED, id, received))
        }
        "/big" => {
            let n = query_number(&parts.uri, "bytes").unwrap_or(4096) as usize;
            let mut resp = hyper::Response::new(boxed(Full::new(Bytes::from(big_body(n)))));
            *resp.status_mut() = StatusCode::OK;
            resp.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/octet-stream"),
            );
            Ok(resp)
        }
        "/hold" => std::future::pending().await,
        "/drop" => Err("dropped after commit".into()),
        "/truncate" => {
            let mut resp = hyper::Response::new(BoxBody::new(idemgate::body::CutShort::new(
                Bytes::from_static(b"{\"id\":"),
            )));
            *resp.status_mut() = StatusCode::CREATED;
            resp.headers_mut().insert(
                http::header::CONTENT_LENGTH,
                http::HeaderValue::from_static("100"),
            );
            Ok(resp)
        }
        _ => {
            if let Some(code) = path.strip_prefix("/commit-then/") {
                return Ok(status_response(code));
            }
            tokio::time::sleep(delay).await;
            Ok(json_response(StatusCode::CREATED, id, received))
        }
    }
}

/// `GET /lookup?key=K`: the write committed under `K`, if any.
fn lookup(state: &UpstreamState, key: Option<&str>) -> hyper::Response<UpstreamBody> {
    let found = key.and_then(|k| state.by_key.lock().expect("by_key lock").get(k).copied());
    let (status, body) = match found {
        Some(id) => (StatusCode::OK, json!({ "id": id })),
        None => (StatusCode::NOT_FOUND, json!({ "error": "no such write" })),
    };
    hyper::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .header("x-upstream-tag", "lookup")
        .body(boxed(Full::new(Bytes::from(body.to_string()))))
        .expect("response")
}

/// An answer with status `code` (a path segment) and a small JSON body.
fn status_response(code: &str) -> hyper::Response<UpstreamBody> {
    let status = code
        .parse()
        .ok()
        .and_then(|c| StatusCode::from_u16(c).ok())
        .unwrap_or_else(|| panic!("bad status in test path: {code}"));
    let body = json!({ "upstream_status": status.as_u16() }).to_string();
    hyper::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .header("retry-after", "1")
        .body(boxed(Full::new(Bytes::from(body))))
        .expect("response")
}

fn boxed(body: Full<Bytes>) -> UpstreamBody {
    body.map_err(|never| match never {}).boxed()
}

fn json_response(status: StatusCode, id: usize, received: Value) -> hyper::Response<UpstreamBody> {
    let body = serde_json::to_vec(&json!({ "id": id, "received": received })).expect("json");
    hyper::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .header("x-upstream-tag", "first")
        .header("x-upstream-tag", "second")
        .body(boxed(Full::new(Bytes::from(body))))
        .expect("response")
}

/// How a [`RawUpstream`] breaks each connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Breakage {
    /// Accept, then close at once without reading.
    CloseAtOnce,
    /// Read the whole request head and body, then reset (RST).
    ResetAfterRequest,
}

/// A TCP listener that counts connections and breaks each one.
pub struct RawUpstream {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    /// Complete requests read (head and declared body).
    requests: Arc<AtomicUsize>,
    accept: tokio::task::JoinHandle<()>,
}

impl RawUpstream {
    pub async fn start(breakage: Breakage) -> RawUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind raw");
        let addr = listener.local_addr().expect("raw addr");
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let (conns, reqs) = (connections.clone(), requests.clone());
        let accept = tokio::spawn(async move {
            let mut open = JoinSet::new();
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    continue;
                };
                conns.fetch_add(1, Ordering::SeqCst);
                if breakage == Breakage::CloseAtOnce {
                    drop(stream);
                    continue;
                }
                let reqs = reqs.clone();
                open.spawn(async move {
                    let read = tokio::time::timeout(WAIT, read_request(&mut stream)).await;
                    if matches!(read, Ok(true)) {
                        reqs.fetch_add(1, Ordering::SeqCst);
                    }
                    // Linger 0: closing sends RST instead of FIN, and so
                    // never blocks (what the deprecation warns about).
                    #[allow(deprecated)]
                    let _ = stream.set_linger(Some(Duration::ZERO));
                    drop(stream);
                });
                while open.try_join_next().is_some() {}
            }
        });
        RawUpstream {
            addr,
            connections,
            requests,
            accept,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for RawUpstream {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Reads one request head and its Content-Length body; `true` when whole.
async fn read_request(stream: &mut TcpStream) -> bool {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = find(&buf, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let length = head
                .lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(k, _)| k.trim() == "content-length")
                .and_then(|(_, v)| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + length {
                return true;
            }
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

// ------------------------------------------------------------------ config

/// A complete config for one route `api` at `path_prefix` → `upstream_url`,
/// with `route_extra` (TOML lines) appended to the route table.
pub fn gateway_toml(
    store: &Path,
    upstream_url: &str,
    path_prefix: &str,
    route_extra: &str,
) -> String {
    gateway_toml_with(
        store,
        upstream_url,
        &Setup::route(route_extra).at(path_prefix),
    )
}

/// Like [`gateway_toml`], with every part [`Setup`] can add.
pub fn gateway_toml_with(store: &Path, upstream_url: &str, setup: &Setup) -> String {
    format!(
        r#"[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
{server_extra}

[store]
url = "sqlite://{store}"
durability = "normal"
{store_extra}

[[routes]]
name = "api"
path_prefix = "{path_prefix}"
upstream = "{upstream_url}"
{route_extra}
"#,
        store = store.display(),
        path_prefix = setup.path_prefix,
        server_extra = setup.server,
        store_extra = setup.store,
        route_extra = setup.route,
    )
}

pub fn parse_config(toml: &str) -> Config {
    Config::from_toml_str(toml, "test.toml")
        .unwrap_or_else(|e| panic!("test config rejected: {e}\n{toml}"))
}

/// What a test gateway is made of beyond the defaults.
#[derive(Clone)]
pub struct Setup {
    pub path_prefix: String,
    /// TOML lines for the route table (a `[routes.reconcile]` table last).
    pub route: String,
    /// TOML lines for `[store]`.
    pub store: String,
    /// TOML lines for `[server]`.
    pub server: String,
    /// The route's upstream; the fake upstream's URL when `None`.
    pub upstream_url: Option<String>,
    /// The clock the gateway (and its store) reads; the system's when `None`.
    pub clock: Option<Arc<dyn Clock>>,
    /// The admin token, handed over through `StartOptions`; none when `None`.
    pub admin_token: Option<String>,
}

impl Setup {
    /// A catch-all route with `route_extra` lines.
    pub fn route(route_extra: &str) -> Setup {
        Setup {
            path_prefix: "/".into(),
            route: route_extra.into(),
            store: String::new(),
            server: String::new(),
            upstream_url: None,
            clock: None,
            admin_token: None,
        }
    }

    pub fn at(mut self, path_prefix: &str) -> Setup {
        self.path_prefix = path_prefix.into();
        self
    }

    pub fn store(mut self, lines: &str) -> Setup {
        self.store = lines.into();
        self
    }

    pub fn server(mut self, lines: &str) -> Setup {
        self.server = lines.into();
        self
    }

    pub fn upstream_url(mut self, url: impl Into<String>) -> Setup {
        self.upstream_url = Some(url.into());
        self
    }

    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Setup {
        self.clock = Some(clock);
        self
    }

    /// An admin token of its own, for [`TestGateway::operation`].
    pub fn admin(mut self) -> Setup {
        self.admin_token = Some(format!("test-admin-{}", uuid::Uuid::now_v7().simple()));
        self
    }
}

// ---------------------------------------------------------------- gateway

/// An in-process gateway on its own SQLite file, with its fake upstream.
pub struct TestGateway {
    gateway: Option<Gateway>,
    pub upstream: FakeUpstream,
    pub toml: String,
    pub store_path: PathBuf,
    clock: Option<Arc<dyn Clock>>,
    admin_token: Option<String>,
    // Last field: removed after the gateway above is dropped.
    pub dir: TempDir,
}

/// A gateway with one catch-all route; `route_extra` adds route fields.
pub async fn spawn_gateway(route_extra: &str) -> TestGateway {
    spawn_gateway_at("/", route_extra).await
}

/// Like [`spawn_gateway`] with the route at `path_prefix`.
pub async fn spawn_gateway_at(path_prefix: &str, route_extra: &str) -> TestGateway {
    spawn_gateway_with(Setup::route(route_extra).at(path_prefix)).await
}

/// A gateway made as `setup` says, in front of a new fake upstream.
pub async fn spawn_gateway_with(setup: Setup) -> TestGateway {
    spawn_gateway_on(FakeUpstream::start().await, setup).await
}

/// A gateway made as `setup` says, in front of `upstream` (unless
/// `setup.upstream_url` points elsewhere).
pub async fn spawn_gateway_on(upstream: FakeUpstream, setup: Setup) -> TestGateway {
    let dir = tempfile::tempdir().expect("tempdir");
    let store_path = dir.path().join("idemgate.db");
    let url = setup.upstream_url.clone().unwrap_or_else(|| upstream.url());
    let toml = gateway_toml_with(&store_path, &url, &setup);
    let gateway = start(&toml, setup.clock.clone(), setup.admin_token.clone()).await;
    TestGateway {
        gateway: Some(gateway),
        upstream,
        toml,
        store_path,
        clock: setup.clock,
        admin_token: setup.admin_token,
        dir,
    }
}

async fn start(toml: &str, clock: Option<Arc<dyn Clock>>, admin_token: Option<String>) -> Gateway {
    let options = idemgate::server::StartOptions {
        clock: clock.unwrap_or_else(|| Arc::new(idemgate::clock::SystemClock)),
        admin_token,
    };
    tokio::time::timeout(WAIT, Gateway::start_with(parse_config(toml), options))
        .await
        .expect("gateway start timed out")
        .unwrap_or_else(|e| panic!("gateway failed to start: {e}"))
}

impl TestGateway {
    pub fn gateway(&self) -> &Gateway {
        self.gateway.as_ref().expect("gateway running")
    }

    pub fn addr(&self) -> SocketAddr {
        self.gateway().addr()
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.gateway().admin_addr()
    }

    /// Graceful shutdown; the store lock is released when this returns.
    pub async fn shutdown(&mut self) {
        let gateway = self.gateway.take().expect("gateway running");
        tokio::time::timeout(WAIT, gateway.shutdown())
            .await
            .expect("gateway shutdown timed out");
    }

    /// Starts a graceful shutdown in the background; await the handle for
    /// its end (bounded by [`WAIT`]).
    pub fn begin_shutdown(&mut self) -> tokio::task::JoinHandle<()> {
        let gateway = self.gateway.take().expect("gateway running");
        tokio::spawn(async move {
            tokio::time::timeout(WAIT, gateway.shutdown())
                .await
                .expect("gateway shutdown timed out");
        })
    }

    /// Shuts down and starts a new gateway on the same store and config.
    pub async fn restart(&mut self) {
        self.shutdown().await;
        self.start_again().await;
    }

    /// Starts a new gateway on this one's store and config, after a
    /// [`TestGateway::shutdown`].
    pub async fn start_again(&mut self) {
        assert!(self.gateway.is_none(), "the gateway is still running");
        self.gateway = Some(start(&self.toml, self.clock.clone(), self.admin_token.clone()).await);
    }

    /// A second `Gateway::start` on this gateway's config (same store).
    pub async fn try_start_another(&self) -> Result<Gateway, idemgate::server::StartError> {
        tokio::time::timeout(WAIT, Gateway::start(parse_config(&self.toml)))
            .await
            .expect("second gateway start timed out")
    }

    /// The newest operation with `key`, as `GET /admin/keys/{id}` shows it:
    /// `state`, `attempts`, `evidence`, `events` (`kind`, `detail`), …
    pub async fn operation(&self, key: &str) -> Value {
        let token = self
            .admin_token
            .as_deref()
            .expect("operation() needs a gateway set up with Setup::admin()");
        let admin = self.admin_addr();
        let list = admin_call(
            admin,
            "GET",
            &format!("/admin/keys?key={key}"),
            Some(token),
            "",
        )
        .await;
        assert_eq!(list.status, StatusCode::OK, "admin list: {:?}", list.body);
        let id = list.json()["items"][0]["id"]
            .as_str()
            .unwrap_or_else(|| panic!("no operation with key {key}"))
            .to_owned();
        let shown = admin_call(admin, "GET", &format!("/admin/keys/{id}"), Some(token), "").await;
        assert_eq!(shown.status, StatusCode::OK, "admin show: {:?}", shown.body);
        shown.json()
    }
}

/// The `detail` of each event of `kind` in an operation's timeline.
pub fn events_of(operation: &Value, kind: &str) -> Vec<Value> {
    operation["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["kind"] == kind)
        .map(|e| e["detail"].clone())
        .collect()
}

// ----------------------------------------------------------------- binary

/// A running `idemgate serve` process; killed (SIGKILL) when dropped.
pub struct BinaryGateway {
    child: Child,
    // Kept open: the process must never see a closed stdout.
    _stdout: std::io::BufReader<std::process::ChildStdout>,
    pub proxy: SocketAddr,
    pub admin: SocketAddr,
    pub stderr_path: PathBuf,
}

pub fn binary() -> Command {
    Command::new(env!("CARGO_BIN_EXE_idemgate"))
}

/// Writes `toml` to `dir/name` and returns its path.
pub fn write_config(dir: &Path, name: &str, toml: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, toml).expect("write config");
    path
}

impl BinaryGateway {
    /// Starts `idemgate serve --config FILE`, stderr into `stderr_path`, and
    /// waits for its `listening proxy=… admin=…` line.
    pub async fn start(config: &Path, stderr_path: &Path) -> BinaryGateway {
        let mut cmd = binary();
        cmd.arg("serve").arg("--config").arg(config);
        BinaryGateway::spawn(cmd, stderr_path).await
    }

    /// Spawns `cmd` (an `idemgate serve …`), stderr into `stderr_path`, and
    /// waits for its `listening proxy=… admin=…` line.
    pub async fn spawn(cmd: Command, stderr_path: &Path) -> BinaryGateway {
        let (child, reader, line) = spawn_until_first_line(cmd, stderr_path).await;
        let (proxy, admin) = parse_listening_line(&line);
        BinaryGateway {
            child,
            _stdout: reader,
            proxy,
            admin,
            stderr_path: stderr_path.to_owned(),
        }
    }

    /// SIGKILL (what `Child::kill` sends on Unix) and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn stderr(&self) -> String {
        read_to_string(&self.stderr_path)
    }
}

impl Drop for BinaryGateway {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Spawns `cmd`, stderr into `stderr_path`, and waits (up to [`WAIT`]) for
/// the first line on its stdout; the reader stays open with the child.
async fn spawn_until_first_line(
    mut cmd: Command,
    stderr_path: &Path,
) -> (Child, std::io::BufReader<std::process::ChildStdout>, String) {
    let stderr = std::fs::File::create(stderr_path).expect("stderr file");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("spawn idemgate");
    let stdout = child.stdout.take().expect("stdout piped");
    let read = tokio::task::spawn_blocking(move || {
        let mut reader = std::io::BufReader::new(stdout);
        let mut line = String::new();
        let n = reader.read_line(&mut line).expect("read stdout");
        (reader, line, n)
    });
    let (reader, line, n) = match tokio::time::timeout(WAIT, read).await {
        Ok(joined) => joined.expect("stdout reader"),
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "no listening line within {WAIT:?}; stderr:\n{}",
                read_to_string(stderr_path)
            );
        }
    };
    if n == 0 {
        let status = child.wait().expect("wait");
        panic!(
            "idemgate exited ({status}) before listening; stderr:\n{}",
            read_to_string(stderr_path)
        );
    }
    (child, reader, line)
}

/// A running `idemgate mock-upstream` process; killed when dropped.
pub struct BinaryMock {
    child: Child,
    _stdout: std::io::BufReader<std::process::ChildStdout>,
    pub addr: SocketAddr,
}

impl BinaryMock {
    /// Starts `idemgate mock-upstream --listen 127.0.0.1:0` and waits for
    /// its `listening mock=ADDR` line.
    pub async fn start(stderr_path: &Path) -> BinaryMock {
        let mut cmd = binary();
        cmd.arg("mock-upstream").arg("--listen").arg("127.0.0.1:0");
        let (child, reader, line) = spawn_until_first_line(cmd, stderr_path).await;
        let addr = line
            .trim_end()
            .strip_prefix("listening mock=")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("mock startup line: {line:?}"));
        BinaryMock {
            child,
            _stdout: reader,
            addr,
        }
    }
}

impl Drop for BinaryMock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn read_to_string(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Parses `listening proxy=ADDR admin=ADDR`.
pub fn parse_listening_line(line: &str) -> (SocketAddr, SocketAddr) {
    let mut words = line.split_whitespace();
    assert_eq!(words.next(), Some("listening"), "startup line: {line:?}");
    let mut field = |prefix: &str| -> SocketAddr {
        words
            .next()
            .and_then(|w| w.strip_prefix(prefix))
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("startup line lacks {prefix}ADDR: {line:?}"))
    };
    let proxy = field("proxy=");
    let admin = field("admin=");
    assert_eq!(words.next(), None, "startup line has extra words: {line:?}");
    (proxy, admin)
}

/// Runs `cmd` to completion within [`WAIT`] (killing it otherwise) and
/// returns (exit status, stdout, stderr).
pub async fn run_to_exit(mut cmd: Command) -> (std::process::ExitStatus, String, String) {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn idemgate");
    let pid = child.id();
    let output = tokio::task::spawn_blocking(move || child.wait_with_output());
    match tokio::time::timeout(WAIT, output).await {
        Ok(out) => {
            let out = out.expect("join").expect("wait_with_output");
            (
                out.status,
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        }
        Err(_) => {
            // The child moved into the blocking task; kill it by its own pid.
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            panic!("idemgate (pid {pid}) still running after {WAIT:?}");
        }
    }
}

// ----------------------------------------------------------------- client

/// A response as the client saw it.
#[derive(Debug)]
pub struct Response {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("ascii header"))
    }

    pub fn header_all(&self, name: &str) -> Vec<&str> {
        self.headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str().expect("ascii header"))
            .collect()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {:?}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn is_replay(&self) -> bool {
        self.header("idempotent-replayed")
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    }

    /// Asserts an RFC 9457 problem named `name` with `status`; returns its body.
    pub fn assert_problem(&self, status: u16, name: &str) -> Value {
        let text = String::from_utf8_lossy(&self.body);
        assert_eq!(self.status.as_u16(), status, "status; body: {text}");
        let content_type = self.header("content-type").unwrap_or_default();
        assert!(
            content_type.starts_with("application/problem+json"),
            "content-type {content_type:?}; body: {text}"
        );
        let body = self.json();
        assert_eq!(
            body["type"],
            format!("urn:idemgate:problem:{name}"),
            "type; body: {text}"
        );
        assert_eq!(body["status"], status, "status member; body: {text}");
        assert!(
            body["title"].as_str().is_some_and(|t| !t.is_empty()),
            "title; body: {text}"
        );
        assert!(body["detail"].is_string(), "detail; body: {text}");
        body
    }

    /// Like [`Response::assert_problem`] for a problem about an operation:
    /// also checks `operation_id` and that `state` is `state`.
    pub fn assert_operation_problem(&self, status: u16, name: &str, state: &str) -> Value {
        let body = self.assert_problem(status, name);
        let id_present = match &body["operation_id"] {
            Value::String(s) => !s.is_empty(),
            Value::Number(_) => true,
            _ => false,
        };
        assert!(id_present, "operation_id; body: {body}");
        assert_eq!(body["state"], state, "state; body: {body}");
        body
    }
}

/// Sends one request over a fresh connection and reads the whole response.
pub async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Response {
    match try_send(addr, method, path, headers, body, WAIT).await {
        Ok(resp) => resp,
        Err(Exchange::Failed(e)) => panic!("request failed: {e}"),
        Err(Exchange::TimedOut) => panic!("{method} {path} timed out"),
    }
}

/// Why [`try_send`] got no whole response.
#[derive(Debug)]
pub enum Exchange {
    /// The connection failed, closed or broke (head or body).
    Failed(String),
    /// Nothing complete within the time allowed.
    TimedOut,
}

/// Like [`send`], but a broken or silent peer is an `Err`, not a panic.
pub async fn try_send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
    within: Duration,
) -> Result<Response, Exchange> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut req = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let req = req.body(Full::new(body.into())).expect("request");
    let exchange = async {
        let resp = client
            .request(req)
            .await
            .map_err(|e| Exchange::Failed(format!("{e:?}")))?;
        let (parts, body) = resp.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| Exchange::Failed(format!("body: {e:?}")))?
            .to_bytes();
        Ok(Response {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    };
    tokio::time::timeout(within, exchange)
        .await
        .unwrap_or(Err(Exchange::TimedOut))
}

/// POST `body` (JSON) to `path` as [`ALICE`] with `key`, if any.
pub async fn write(addr: SocketAddr, path: &str, key: Option<&str>, body: &str) -> Response {
    write_as(addr, path, key, Some(ALICE), body).await
}

/// POST `body` (JSON) to `path` with `key` and `authorization`, if any.
pub async fn write_as(
    addr: SocketAddr,
    path: &str,
    key: Option<&str>,
    authorization: Option<&str>,
    body: &str,
) -> Response {
    let mut headers = vec![("content-type", "application/json")];
    if let Some(key) = key {
        headers.push(("idempotency-key", key));
    }
    if let Some(auth) = authorization {
        headers.push(("authorization", auth));
    }
    send(addr, "POST", path, &headers, body.to_owned()).await
}

/// Asserts a fresh (not replayed) 201 from the default upstream path and
/// returns the upstream-assigned `id`.
pub fn assert_fresh_created(resp: &Response) -> u64 {
    assert_eq!(
        resp.status,
        StatusCode::CREATED,
        "body: {}",
        String::from_utf8_lossy(&resp.body)
    );
    assert!(
        !resp.is_replay(),
        "a first write must not be marked replayed"
    );
    resp.json()["id"].as_u64().expect("upstream id")
}

/// Asserts `replay` repeats `original`: same status, same end-to-end
/// upstream headers in order, identical body bytes, and the replay marker.
pub fn assert_replay_of(replay: &Response, original: &Response) {
    assert!(
        replay.is_replay(),
        "expected idempotent-replayed: true; got {} {:?} {}",
        replay.status,
        replay.headers,
        String::from_utf8_lossy(&replay.body)
    );
    assert_eq!(replay.status, original.status, "replayed status");
    assert_eq!(replay.body, original.body, "replayed body bytes");
    assert_eq!(
        replay.header_all("x-upstream-tag"),
        original.header_all("x-upstream-tag"),
        "replayed headers (duplicates, order)"
    );
    assert_eq!(
        replay.header("content-type"),
        original.header("content-type"),
        "replayed content-type"
    );
    if let Some(len) = replay.header("content-length") {
        assert_eq!(
            len,
            replay.body.len().to_string(),
            "replayed content-length"
        );
    }
}

/// Asserts 409 `outcome-unknown` about an `unknown` operation.
pub fn assert_held_unknown(resp: &Response) {
    resp.assert_operation_problem(409, "outcome-unknown", "unknown");
    assert!(!resp.is_replay(), "a held operation is not a replay");
}

/// Writes `body` to `path` with `key` as [`ALICE`] every 100 ms until
/// `done` holds for the answer; panics after `within`. Only for retries that
/// send nothing upstream until they succeed (replays and refusals).
pub async fn write_until(
    addr: SocketAddr,
    path: &str,
    key: &str,
    body: &str,
    within: Duration,
    done: impl Fn(&Response) -> bool,
) -> Response {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let resp = write(addr, path, Some(key), body).await;
        if done(&resp) {
            return resp;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still {} after {within:?}: {}",
            resp.status,
            String::from_utf8_lossy(&resp.body)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `n` clients write `body` to `path` with `key` at once (released together
/// by a barrier); their answers in completion order.
pub async fn concurrent_writes(
    addr: SocketAddr,
    n: usize,
    path: &str,
    key: &str,
    body: &str,
) -> Vec<Response> {
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let mut tasks = JoinSet::new();
    for _ in 0..n {
        let (barrier, path, key, body) = (
            barrier.clone(),
            path.to_owned(),
            key.to_owned(),
            body.to_owned(),
        );
        tasks.spawn(async move {
            barrier.wait().await;
            write(addr, &path, Some(&key), &body).await
        });
    }
    let mut responses = Vec::new();
    while let Some(resp) = tasks.join_next().await {
        responses.push(resp.expect("client task"));
    }
    responses
}

/// Asserts exactly one of `responses` is a fresh 201 and every other one
/// replays it; returns the fresh one.
pub fn assert_one_fresh_rest_replayed(responses: &[Response]) -> &Response {
    let fresh: Vec<&Response> = responses.iter().filter(|r| !r.is_replay()).collect();
    assert_eq!(
        fresh.len(),
        1,
        "expected one fresh answer, got {:?}",
        responses
            .iter()
            .map(|r| (r.status, r.is_replay()))
            .collect::<Vec<_>>()
    );
    let original = fresh[0];
    assert_fresh_created(original);
    for resp in responses {
        if !std::ptr::eq(resp, original) {
            assert_replay_of(resp, original);
        }
    }
    original
}

// -------------------------------------------------------------------- raw

/// A raw HTTP/1.1 response read off a socket.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    /// The head as text (status line and headers), lowercased.
    pub head: String,
    pub body: Vec<u8>,
    /// Interim 1xx status codes seen before the final response.
    pub interim: Vec<u16>,
}

/// Writes `request` to a new connection and reads one final response
/// (skipping 1xx). `None` when the peer closed or reset before a full head.
pub async fn raw_exchange(addr: SocketAddr, request: &[u8]) -> Option<RawResponse> {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let exchange = async {
        // A peer that refuses early may reset while we still write: keep
        // reading whatever it answered.
        let _ = stream.write_all(request).await;
        read_response(&mut stream).await
    };
    tokio::time::timeout(WAIT, exchange)
        .await
        .expect("raw exchange timed out")
}

/// Reads one final response from `stream` (skipping 1xx).
pub async fn read_response(stream: &mut TcpStream) -> Option<RawResponse> {
    let mut buf = Vec::new();
    let mut interim = Vec::new();
    loop {
        let head_end = loop {
            if let Some(i) = find(&buf, b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 8192];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        buf.drain(..head_end);
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line: {head:?}"));
        if (100..200).contains(&status) {
            interim.push(status);
            continue;
        }
        let length = head
            .lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim() == "content-length")
            .and_then(|(_, v)| v.trim().parse::<usize>().ok());
        let mut body = buf;
        let mut chunk = [0u8; 8192];
        loop {
            if length.is_some_and(|len| body.len() >= len) {
                break;
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => body.extend_from_slice(&chunk[..n]),
            }
        }
        return Some(RawResponse {
            status,
            head,
            body,
            interim,
        });
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A raw POST head (no body) with the given extra header lines.
pub fn raw_post_head(path: &str, extra_headers: &[&str]) -> String {
    let mut head = format!("POST {path} HTTP/1.1\r\nhost: idemgate.test\r\n");
    for line in extra_headers {
        head.push_str(line);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    head
}

/// Encodes `body` as one chunk plus the last chunk.
pub fn chunked(body: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", body.len()).into_bytes();
    out.extend_from_slice(body);
    out.extend_from_slice(b"\r\n0\r\n\r\n");
    out
}

/// An unused loopback port: bound, then released.
pub async fn closed_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    listener.local_addr().expect("addr")
}

/// Asserts the gateway still proxies a plain GET after some abuse.
pub async fn assert_still_serving(gw: &TestGateway) {
    let resp = send(gw.addr(), "GET", "/alive", &[], Bytes::new()).await;
    assert_eq!(resp.status, StatusCode::OK, "gateway stopped serving");
    let health = send(gw.admin_addr(), "GET", "/healthz", &[], Bytes::new()).await;
    assert_eq!(health.status, StatusCode::OK, "admin stopped serving");
}

// ------------------------------------------------------------------ admin

/// One admin API call with `Authorization: Bearer <token>` (none when
/// `token` is `None`); a non-empty `body` is sent as JSON.
pub async fn admin_call(
    admin: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> Response {
    let authorization = token.map(|t| format!("Bearer {t}"));
    let mut headers = Vec::new();
    if let Some(auth) = &authorization {
        headers.push(("authorization", auth.as_str()));
    }
    if !body.is_empty() {
        headers.push(("content-type", "application/json"));
    }
    send(admin, method, path, &headers, body.to_owned()).await
}
