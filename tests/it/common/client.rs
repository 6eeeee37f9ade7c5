//! Requests through a fresh hyper client, and assertions on what came back.

use super::*;
use hyper_util::client::legacy::connect::HttpConnector;

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
        // The extension member Stripe-style SDKs raise on.
        assert_eq!(
            body["error"],
            json!({"type": "idempotency_error", "code": name, "message": body["detail"]}),
            "error member; body: {text}"
        );
        body
    }

    /// Like [`Response::assert_problem`], and its `detail` mentions `part`.
    pub fn assert_problem_mentioning(&self, status: u16, name: &str, part: &str) -> Value {
        let problem = self.assert_problem(status, name);
        assert!(
            problem["detail"].as_str().is_some_and(|d| d.contains(part)),
            "detail lacks {part:?}: {problem}"
        );
        problem
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
    let sent = try_send(addr, method, path, headers, body, WAIT).await;
    whole(sent, method, path)
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
    let req =
        build_request(method, &format!("http://{addr}{path}"), headers, body).expect("request");
    exchange(client, req, within).await
}

/// Like [`send`], over HTTP/2 with prior knowledge: the path's authority
/// is `addr` (`:authority`), and each of `headers` is a field of its own,
/// as sent (a name given twice is two fields).
pub async fn send_h2(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Response {
    h2_exchange(addr, method, path, headers, body, |body| body).await
}

/// Like [`send_h2`], the body sent as one of unknown length: no
/// `content-length`, and a HEADERS frame that does not end the stream.
pub async fn send_h2_unsized(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Response {
    h2_exchange(addr, method, path, headers, body, Unsized).await
}

/// One HTTP/2 exchange, the body as `wrap` makes it.
async fn h2_exchange<B>(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
    wrap: impl FnOnce(Full<Bytes>) -> B,
) -> Response
where
    B: hyper::body::Body<Data = Bytes, Error = std::convert::Infallible> + Send + Unpin + 'static,
{
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<B>();
    let req = build_request(method, &format!("http://{addr}{path}"), headers, body)
        .expect("request")
        .map(wrap);
    whole(exchange(client, req, WAIT).await, method, path)
}

/// A body that does not say its length.
struct Unsized(Full<Bytes>);

impl hyper::body::Body for Unsized {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        std::pin::Pin::new(&mut self.get_mut().0).poll_frame(cx)
    }
}

/// The response of `method path`, or a panic saying why there was none.
fn whole(sent: Result<Response, Exchange>, method: &str, path: &str) -> Response {
    match sent {
        Ok(resp) => resp,
        Err(Exchange::Failed(e)) => panic!("{method} {path} failed: {e}"),
        Err(Exchange::TimedOut) => panic!("{method} {path} timed out"),
    }
}

/// One request on `client`, its whole response within `within`.
async fn exchange<B>(
    client: Client<HttpConnector, B>,
    req: Request<B>,
    within: Duration,
) -> Result<Response, Exchange>
where
    B: hyper::body::Body<Data = Bytes, Error = std::convert::Infallible> + Send + Unpin + 'static,
{
    let exchange = async {
        let resp = client
            .request(req)
            .await
            .map_err(|e| Exchange::Failed(format!("{e:?}")))?;
        read_whole(resp).await
    };
    tokio::time::timeout(within, exchange)
        .await
        .unwrap_or(Err(Exchange::TimedOut))
}

/// A request to `uri` (absolute, or a path with a `host` header added
/// unless `headers` name one).
pub fn build_request(
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Result<Request<Full<Bytes>>, http::Error> {
    let mut req = Request::builder().method(method).uri(uri);
    let names_host = headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host"));
    if uri.starts_with('/') && !names_host {
        req = req.header("host", "idemgate.test");
    }
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.body(Full::new(body.into()))
}

/// Reads a response's whole body.
pub async fn read_whole(resp: http::Response<Incoming>) -> Result<Response, Exchange> {
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

/// Writes `body` to `path` with `key`, whose response is lost (502
/// `outcome-unknown`), then retries it until it is held no more (a probe
/// settled it; a retry racing the first probe may still be held), for at
/// most 5 s: that answer.
pub async fn lost_then_settled(addr: SocketAddr, path: &str, key: &str, body: &str) -> Response {
    let lost = write(addr, path, Some(key), body).await;
    lost.assert_operation_problem(502, "outcome-unknown", "unknown");
    let settled = |r: &Response| r.status != StatusCode::CONFLICT;
    write_until(addr, path, key, body, Duration::from_secs(5), settled).await
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
