//! The fake upstreams: [`FakeUpstream`] records every request and counts
//! committed writes; [`RawUpstream`] breaks every connection on purpose.

use super::*;

/// One request as the upstream received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: Method,
    pub version: http::Version,
    /// Path and query, as sent on the request line.
    pub uri: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The client certificate its TLS connection was made with, if any.
    pub peer_certificate: Option<Vec<u8>>,
}

/// A TLS connection's client certificate, handed to each of its requests.
#[derive(Clone)]
struct PeerCertificate(Vec<u8>);

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
    /// How many accepted connections have ended, to wait on.
    closed: watch::Sender<usize>,
    /// Upstream id of the write committed under each `Idempotency-Key`.
    by_key: Mutex<HashMap<String, usize>>,
    /// Every write committed under each `Idempotency-Key`, in order.
    records: Mutex<HashMap<String, Vec<usize>>>,
    /// Keys that already got their one refusal on `/once/{code}`.
    refused_once: Mutex<HashSet<String>>,
    /// What a write to `/scripted` does now ([`FakeUpstream::script`]).
    scripted: Mutex<Scripted>,
    /// One permit per held answer let go ([`Scripted::Hold`]); fair, so
    /// the first held is the first let go.
    held: tokio::sync::Semaphore,
    /// Paths that behave as another path ([`FakeUpstream::start_aliased`]).
    aliases: HashMap<String, String>,
}

/// What a write to `/scripted` does, switched by the test between writes,
/// so that identical requests can meet different fates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scripted {
    /// Commit and answer like the default path.
    Create,
    /// Commit, then close the connection without an answer (a lost response).
    Drop,
    /// Answer this status without committing (a refusal).
    Refuse(u16),
    /// Commit, then hold the answer until the test lets it go
    /// ([`FakeUpstream::release_one`], first held first), then answer
    /// like the default path: a response that comes as late as the test
    /// wants.
    Hold,
}

/// The most header fields a head the gateway takes may have (its
/// `MAX_HEAD_FIELDS`, docs/requests.md), and so what the fake upstream
/// takes, to see every field the gateway forwards.
pub const MAX_HEAD_FIELDS: usize = 1024;

/// A recording HTTP/1.1 (or HTTP/2) upstream; stops serving when dropped.
pub struct FakeUpstream {
    addr: SocketAddr,
    /// Serving over TLS (`https://` URLs).
    tls: bool,
    state: Arc<UpstreamState>,
    accept: tokio::task::JoinHandle<()>,
}

impl FakeUpstream {
    pub async fn start() -> FakeUpstream {
        FakeUpstream::start_on(SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    /// Serves on `addr`: a port that was refused a moment ago comes alive.
    pub async fn start_on(addr: SocketAddr) -> FakeUpstream {
        FakeUpstream::serve(addr, HashMap::new(), None).await
    }

    /// Like [`FakeUpstream::start`], speaking HTTP/2 only (hyper's server,
    /// prior knowledge): an HTTP/1.1 request gets no answer.
    pub async fn start_http2() -> FakeUpstream {
        FakeUpstream::serve_as(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            HashMap::new(),
            None,
            true,
        )
        .await
    }

    /// Like [`FakeUpstream::start`], over TLS as `config` says (a TLS
    /// handshake that fails is a counted connection that sees no request;
    /// HTTP/2 when `config` offers `h2` by ALPN and the client picks it).
    pub async fn start_tls(config: Arc<rustls::ServerConfig>) -> FakeUpstream {
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        FakeUpstream::serve(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            HashMap::new(),
            Some(acceptor),
        )
        .await
    }

    /// Like [`FakeUpstream::start`], with each `(path, behaves_as)` pair
    /// answering requests to `path` as `behaves_as` would (for clients whose
    /// paths are fixed, e.g. an SDK's `/v1/customers` that should `/drop`).
    pub async fn start_aliased(aliases: &[(&str, &str)]) -> FakeUpstream {
        let aliases = aliases
            .iter()
            .map(|(path, behaves_as)| (path.to_string(), behaves_as.to_string()))
            .collect();
        FakeUpstream::serve(SocketAddr::from(([127, 0, 0, 1], 0)), aliases, None).await
    }

    async fn serve(
        addr: SocketAddr,
        aliases: HashMap<String, String>,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> FakeUpstream {
        FakeUpstream::serve_as(addr, aliases, tls, false).await
    }

    async fn serve_as(
        addr: SocketAddr,
        aliases: HashMap<String, String>,
        tls: Option<tokio_rustls::TlsAcceptor>,
        http2: bool,
    ) -> FakeUpstream {
        let listener = TcpListener::bind(addr).await.expect("bind upstream");
        FakeUpstream::serve_on(listener, aliases, tls, http2)
    }

    /// Serves on `listener`, bound and listening already: one whose
    /// connections waited unaccepted until now ([`SilentPort::serve`]).
    pub fn accepting(listener: TcpListener) -> FakeUpstream {
        FakeUpstream::serve_on(listener, HashMap::new(), None, false)
    }

    fn serve_on(
        listener: TcpListener,
        aliases: HashMap<String, String>,
        tls: Option<tokio_rustls::TlsAcceptor>,
        http2: bool,
    ) -> FakeUpstream {
        let addr = listener.local_addr().expect("upstream addr");
        let serves_tls = tls.is_some();
        let state = Arc::new(UpstreamState {
            requests: Mutex::new(Vec::new()),
            received: watch::channel(0).0,
            writes: watch::channel(0).0,
            connections: AtomicUsize::new(0),
            closed: watch::channel(0).0,
            by_key: Mutex::new(HashMap::new()),
            records: Mutex::new(HashMap::new()),
            refused_once: Mutex::new(HashSet::new()),
            scripted: Mutex::new(Scripted::Create),
            held: tokio::sync::Semaphore::new(0),
            aliases,
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
                let tls = tls.clone();
                connections.spawn(async move {
                    let closed = state.closed.clone();
                    let service = service_fn(move |req| handle(state.clone(), req));
                    let mut http = hyper::server::conn::http1::Builder::new();
                    http.max_headers(MAX_HEAD_FIELDS);
                    match tls {
                        None if http2 => {
                            let http =
                                hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                            let _ = http.serve_connection(TokioIo::new(stream), service).await;
                        }
                        None => {
                            let _ = http.serve_connection(TokioIo::new(stream), service).await;
                        }
                        Some(acceptor) => {
                            let Ok(stream) = acceptor.accept(stream).await else {
                                closed.send_modify(|n| *n += 1);
                                return;
                            };
                            let peer = stream.get_ref().1.peer_certificates().and_then(|chain| {
                                chain.first().map(|c| PeerCertificate(c.to_vec()))
                            });
                            let service = service_fn(move |mut req: Request<Incoming>| {
                                if let Some(peer) = &peer {
                                    req.extensions_mut().insert(peer.clone());
                                }
                                hyper::service::Service::call(&service, req)
                            });
                            // HTTP/2 when the config offered it by ALPN and the client chose it.
                            if stream.get_ref().1.alpn_protocol() == Some(b"h2") {
                                let http =
                                    hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                                let _ = http.serve_connection(TokioIo::new(stream), service).await;
                            } else {
                                let _ = http.serve_connection(TokioIo::new(stream), service).await;
                            }
                        }
                    }
                    closed.send_modify(|n| *n += 1);
                });
                while connections.try_join_next().is_some() {}
            }
        });
        FakeUpstream {
            addr,
            tls: serves_tls,
            state,
            accept,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// What writes to `/scripted` recorded from now on do.
    pub fn script(&self, scripted: Scripted) {
        *self.state.scripted.lock().expect("scripted lock") = scripted;
    }

    /// Lets the first answer still held ([`Scripted::Hold`]) go.
    pub fn release_one(&self) {
        self.state.held.add_permits(1);
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
        count_reaches(&self.state.writes, n, "writes committed").await;
    }

    /// Waits until at least `n` of the connections it accepted have ended
    /// (closed by either side; a connection the peer closes ends even
    /// while its request is being handled); panics after [`WAIT`].
    pub async fn wait_for_closed_connections(&self, n: usize) {
        count_reaches(&self.state.closed, n, "connections ended").await;
    }

    /// Waits until at least `n` requests (of any kind) arrived; panics after [`WAIT`].
    pub async fn wait_for_requests(&self, n: usize) {
        count_reaches(&self.state.received, n, "requests received").await;
    }
}

impl Drop for FakeUpstream {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Waits until `count` is at least `n`; panics after [`WAIT`], saying how
/// many `what` there were.
async fn count_reaches(count: &watch::Sender<usize>, n: usize, what: &str) {
    let mut rx = count.subscribe();
    let reached = tokio::time::timeout(WAIT, rx.wait_for(|c| *c >= n)).await;
    assert!(
        reached.is_ok(),
        "the upstream saw {} {what}, expected {n}",
        *count.borrow()
    );
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
    // A write's fate is the script's when it is recorded: a test that saw
    // it arrive may change the script for the next ones.
    let scripted = *state.scripted.lock().expect("scripted lock");
    {
        let mut requests = state.requests.lock().expect("requests lock");
        requests.push(Recorded {
            method: parts.method.clone(),
            version: parts.version,
            uri,
            headers: parts.headers.clone(),
            body,
            peer_certificate: parts
                .extensions
                .get::<PeerCertificate>()
                .map(|p| p.0.clone()),
        });
        state.received.send_replace(requests.len());
    }
    // Read as servlet containers read it: a segment's `;parameters` (a
    // session id) are not part of what it names.
    let path = parts.uri.path();
    let path = path.split_once(';').map_or(path, |(named, _)| named);
    let path = state.aliases.get(path).map_or(path, String::as_str);

    if is_read(&parts.method) {
        if path == "/lookup" {
            // `?ms=N`: a slow lookup, for probes that race a retry.
            let delay = query_number(&parts.uri, "ms").unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(delay)).await;
            return Ok(lookup(&state, query_value(&parts.uri, "key")));
        }
        if path == "/records" {
            // `?ms=N`: a slow list.
            let delay = query_number(&parts.uri, "ms").unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(delay)).await;
            return Ok(records(&state, query_value(&parts.uri, "key")));
        }
        if path == "/lagging" {
            return Ok(lagging());
        }
        if let Some(segment) = path.strip_prefix("/tasks/") {
            return Ok(task(&state, segment));
        }
        let id = state.requests.lock().expect("requests lock").len();
        return Ok(json_response(StatusCode::OK, id, received));
    }

    if let Some(code) = path.strip_prefix("/status/") {
        return Ok(status_response(code));
    }
    if let ("/scripted", Scripted::Refuse(code)) = (path, scripted) {
        return Ok(status_response(&code.to_string()));
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

    if matches!(path, "/dedup" | "/dedup-lost" | "/dedup-busy") {
        let first = key
            .as_ref()
            .and_then(|k| state.by_key.lock().expect("by_key lock").get(k).copied());
        if first.is_some() && path == "/dedup-busy" {
            // Still working on the first request under the key, as
            // Stripe's answer says.
            return Ok(status_response("409"));
        }
        if let Some(id) = first {
            // An upstream that honours Idempotency-Key: the repeat gets
            // the first write's answer and nothing is committed.
            return Ok(json_response(StatusCode::CREATED, id, received));
        }
    }
    // Commit point: from here on the upstream has "done" the write.
    let mut id = 0;
    state.writes.send_modify(|w| {
        *w += 1;
        id = *w;
    });
    if let Some(key) = key {
        let mut records = state.records.lock().expect("records lock");
        records.entry(key.clone()).or_default().push(id);
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
        // A 201 whose head carries a field of `bytes` bytes.
        "/big-head" => {
            let n = query_number(&parts.uri, "bytes").unwrap_or(4096) as usize;
            let mut response = json_response(StatusCode::CREATED, id, received);
            let value = http::HeaderValue::from_str(&"h".repeat(n)).expect("a header value");
            response.headers_mut().insert("x-big", value);
            Ok(response)
        }
        "/mcp-events" => Ok(event_stream(&received, &parts.headers)),
        // Every write a record, answered by one of two nodes in turn: an
        // answer of period 2 that tells no record from another.
        "/alternate" => Ok(json_response(StatusCode::ACCEPTED, id % 2, Value::Null)),
        // Every write a record, each answer said to be a replay.
        "/says-replayed" => {
            let mut response = json_response(StatusCode::CREATED, id, received);
            let replayed = http::HeaderValue::from_static("true");
            response
                .headers_mut()
                .insert("idempotent-replayed", replayed);
            Ok(response)
        }
        // Every write a record, answered with the body it carried: an
        // answer that tells nothing of the record it made.
        "/echo" => Ok(echo(&received)),
        // Created, and the connection closed after it: the next request
        // needs a new one.
        "/close" => {
            let mut response = json_response(StatusCode::CREATED, id, received);
            let close = http::HeaderValue::from_static("close");
            response
                .headers_mut()
                .insert(http::header::CONNECTION, close);
            Ok(response)
        }
        "/drop" | "/dedup-lost" | "/dedup-busy" => Err("dropped after commit".into()),
        "/scripted" if scripted == Scripted::Drop => Err("dropped after commit".into()),
        "/scripted" if scripted == Scripted::Hold => {
            state
                .held
                .acquire()
                .await
                .expect("held semaphore open")
                .forget();
            Ok(json_response(StatusCode::CREATED, id, received))
        }
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
            // `/slow-then/503?ms=N`: that status, N ms after the request.
            if let Some(code) = path.strip_prefix("/slow-then/") {
                let ms = query_number(&parts.uri, "ms").unwrap_or(300);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                return Ok(status_response(code));
            }
            tokio::time::sleep(delay).await;
            let mut response = json_response(StatusCode::CREATED, id, received);
            // A request's `x-echo` comes back as `x-echo-tag` (a stored
            // response header whose value the test chose).
            if let Some(value) = parts.headers.get("x-echo") {
                response.headers_mut().insert("x-echo-tag", value.clone());
            }
            Ok(response)
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

/// `GET /records?key=K`: every write committed under `K`, as a list
/// (`{"data": [{"id": n}, …]}`, empty when there is none): a consistent
/// index that shows a write held twice.
fn records(state: &UpstreamState, key: Option<&str>) -> hyper::Response<UpstreamBody> {
    let ids = key
        .and_then(|k| state.records.lock().expect("records lock").get(k).cloned())
        .unwrap_or_default();
    let data: Vec<Value> = ids.into_iter().map(|id| json!({ "id": id })).collect();
    let body = json!({ "data": data });
    hyper::Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(boxed(Full::new(Bytes::from(body.to_string()))))
        .expect("response")
}

/// `GET /lagging?key=K`: a by-key lookup on an index that has not caught
/// up with any write: 404 whatever was committed.
fn lagging() -> hyper::Response<UpstreamBody> {
    hyper::Response::builder()
        .status(StatusCode::NOT_FOUND)
        .header("content-type", "application/json")
        .body(boxed(Full::new(Bytes::from_static(
            br#"{"error": "no such write (yet)"}"#,
        ))))
        .expect("response")
}

/// `GET /tasks/{key}` as an upstream that resolves dot-segments answers it:
/// `/tasks/.` and `/tasks/..` name the collection (200 `{"data": [{"id": 1}]}`);
/// any other segment is percent-decoded and names the write committed under
/// that key (200 `{"id": n}`), 404 when there is none.
fn task(state: &UpstreamState, segment: &str) -> hyper::Response<UpstreamBody> {
    let (status, body) = if matches!(segment, "." | "..") {
        (StatusCode::OK, json!({ "data": [{ "id": 1 }] }))
    } else {
        let key = percent_encoding::percent_decode_str(segment).decode_utf8_lossy();
        match state.by_key.lock().expect("by_key lock").get(key.as_ref()) {
            Some(id) => (StatusCode::OK, json!({ "id": id })),
            None => (StatusCode::NOT_FOUND, json!({ "error": "no such task" })),
        }
    };
    hyper::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(boxed(Full::new(Bytes::from(body.to_string()))))
        .expect("response")
}

/// `POST /mcp-events`: an MCP server answering a JSON-RPC request on an
/// event stream: the events its `params.arguments.events` lists, byte for
/// byte, `{id}` in each replaced by the request's id as JSON; gzipped when
/// the request's `Accept-Encoding` takes gzip, as a server behind a
/// compressing middleware answers.
fn event_stream(received: &Value, headers: &HeaderMap) -> hyper::Response<UpstreamBody> {
    let id = received["id"].to_string();
    let events: String = received["params"]["arguments"]["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|event| event.replace("{id}", &id))
        .collect();
    let takes_gzip = headers
        .get_all("accept-encoding")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|coding| coding.trim().starts_with("gzip"));
    let response = hyper::Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/event-stream");
    let (response, body) = match takes_gzip {
        true => (
            response.header("content-encoding", "gzip"),
            gzip(events.as_bytes()),
        ),
        false => (response, events.into_bytes()),
    };
    response
        .body(boxed(Full::new(Bytes::from(body))))
        .expect("response")
}

/// `bytes` as gzip (RFC 1952) of stored deflate blocks (RFC 1951
/// §3.2.4): what a compressing server sends, without a compressor.
fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
    let mut blocks = bytes.chunks(usize::from(u16::MAX)).peekable();
    if blocks.peek().is_none() {
        out.extend_from_slice(&[1, 0, 0, 0xff, 0xff]);
    }
    while let Some(block) = blocks.next() {
        out.push(u8::from(blocks.peek().is_none()));
        let len = u16::try_from(block.len()).expect("a stored block");
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(block);
    }
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    out.extend_from_slice(&(!crc).to_le_bytes());
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out
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

/// 201 with `received` as the body.
fn echo(received: &Value) -> hyper::Response<UpstreamBody> {
    hyper::Response::builder()
        .status(StatusCode::CREATED)
        .header("content-type", "application/json")
        .body(boxed(Full::new(Bytes::from(received.to_string()))))
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

/// How a [`RawUpstream`] breaks (or drags out) each connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Breakage {
    /// Accept, then close at once without reading.
    CloseAtOnce,
    /// Read the whole request head and body, then reset (RST).
    ResetAfterRequest,
    /// Read the whole request, answer `101 Switching Protocols` (to a
    /// request that asked for no upgrade), then close.
    SwitchProtocols,
    /// Read the whole request, write these bytes as the answer, then close.
    Answers(&'static [u8]),
    /// Read the whole request, write these bytes (a head and part of its
    /// body, or nothing), then send nothing more and keep the connection
    /// open until the gateway closes it ([`RawUpstream::closed`]).
    Stalls(&'static [u8]),
    /// Read the whole request, write `head`, then `chunk` `count` times,
    /// one every `every`: an answer that keeps coming, slowly.
    Trickles {
        head: &'static [u8],
        chunk: &'static [u8],
        count: usize,
        every: Duration,
    },
}

/// A TCP listener that counts connections and breaks each one.
pub struct RawUpstream {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    /// Complete requests read (head and declared body).
    requests: Arc<AtomicUsize>,
    /// Stalled connections the gateway closed.
    closed: Arc<AtomicUsize>,
    accept: tokio::task::JoinHandle<()>,
}

impl RawUpstream {
    pub async fn start(breakage: Breakage) -> RawUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind raw");
        let addr = listener.local_addr().expect("raw addr");
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(AtomicUsize::new(0));
        let (conns, reqs, ended) = (connections.clone(), requests.clone(), closed.clone());
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
                let (reqs, ended) = (reqs.clone(), ended.clone());
                open.spawn(async move {
                    let read = tokio::time::timeout(WAIT, read_request(&mut stream)).await;
                    if matches!(read, Ok(true)) {
                        reqs.fetch_add(1, Ordering::SeqCst);
                    }
                    let answer: &[u8] = match breakage {
                        Breakage::SwitchProtocols => b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n",
                        Breakage::Answers(bytes) => bytes,
                        Breakage::Stalls(bytes) => {
                            let _ = stream.write_all(bytes).await;
                            // Whatever the gateway sends is read and
                            // ignored, until it closes the connection.
                            let mut sink = [0u8; 4096];
                            while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
                            ended.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                        Breakage::Trickles {
                            head,
                            chunk,
                            count,
                            every,
                        } => {
                            let _ = stream.write_all(head).await;
                            for _ in 0..count {
                                tokio::time::sleep(every).await;
                                if stream.write_all(chunk).await.is_err() {
                                    return;
                                }
                            }
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            return;
                        }
                        Breakage::CloseAtOnce | Breakage::ResetAfterRequest => b"",
                    };
                    if !answer.is_empty() {
                        let _ = stream.write_all(answer).await;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        return;
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
            closed,
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

    /// [`Breakage::Stalls`] connections the gateway has closed.
    pub fn closed(&self) -> usize {
        self.closed.load(Ordering::SeqCst)
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
