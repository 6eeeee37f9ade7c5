//! `idemgate mock-upstream`: a small, deliberately non-idempotent API to try
//! idemgate against and to benchmark it, with faults chosen by path.
//!
//! Every write (any method but GET and HEAD) that reaches its commit point
//! is counted as an effect, like a real API that creates a task each time:
//!
//! | path | behaviour |
//! |---|---|
//! | `/slow?ms=N` | commit, wait N ms (at most 60 s), answer 201 |
//! | `/drop` | commit, then close the connection without answering |
//! | `/hang` | commit, then never answer |
//! | `/truncate` | commit, announce a body and close after part of it |
//! | `/status/{code}` | answer `code` without committing (a refusal) |
//! | `/once-429/…` | the first write per `Idempotency-Key` gets 429 uncommitted; later ones commit |
//! | `/mcp`, `/mcp/{fault}` | a small MCP server (below) |
//! | anything else | commit, answer 201 `{"id": n, "path": …}` |
//!
//! The behaviour is chosen by the end of the path (`/orders/drop` drops too),
//! so one mock can stand behind several routes.
//!
//! A POST to a path ending in `/mcp` is a JSON-RPC message to a stateless
//! MCP server over Streamable HTTP, answered as JSON: `initialize`, `ping`,
//! `tools/list` (`create_task`, which commits an effect and declares an
//! `outputSchema`, its `structuredContent` `{"id": n}`; `comment_task`,
//! which commits an effect; and the read-only `count_tasks`, whose
//! `structuredContent` is `{"tasks": n}`, the tasks created: comments are
//! no tasks), `tools/call`; a notification gets 202. After `/mcp/` comes a
//! fault for the writing tools' calls, as above: `/mcp/drop` commits and
//! drops the connection, `/mcp/slow?ms=N` waits, `/mcp/{code}` answers
//! that HTTP status without running the tool (a proxy before it failing),
//! and `/mcp/lose-once` drops the first call per `Idempotency-Key` without
//! committing it (a call lost on its way: a probe finds it absent), later
//! ones commit.
//!
//! `GET /_effects` answers `{"writes": n, "keys": m}`, m the distinct
//! `Idempotency-Key`s writes were committed under: `writes == keys` means
//! every write carried a key and no key was written twice (`idemgate bench`
//! checks it). `GET /_effects/{key}` answers 200 with the effect committed
//! under that `Idempotency-Key`, 404 when none was. Other GETs answer 200
//! `{"ok": true}`.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use idemgate::body::{BoxError, CutShort, ProxyBody, full, stream};

/// The longest `/slow` wait, so a typo cannot hold a connection for hours.
const MAX_SLOW: Duration = Duration::from_secs(60);

#[derive(Default)]
struct Effects {
    writes: u64,
    /// Of the writes, the MCP server's tasks created (`count_tasks`).
    tasks: u64,
    /// Effect id by the `Idempotency-Key` it was committed under.
    by_key: HashMap<String, u64>,
    /// Keys that already got their one 429 on `/once-429`.
    refused_once: HashSet<String>,
}

/// A running mock API.
pub struct MockUpstream {
    addr: SocketAddr,
    effects: Arc<Mutex<Effects>>,
    stop: CancellationToken,
    serving: JoinHandle<()>,
}

impl MockUpstream {
    /// Binds `addr` (port 0 for any free port) and serves until [`MockUpstream::stop`].
    pub async fn start(addr: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let effects = Arc::new(Mutex::new(Effects::default()));
        let stop = CancellationToken::new();
        let serving = tokio::spawn(serve(listener, effects.clone(), stop.clone()));
        Ok(MockUpstream {
            addr,
            effects,
            stop,
            serving,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Writes committed so far.
    pub fn writes(&self) -> u64 {
        self.effects.lock().map_or(0, |e| e.writes)
    }

    /// Stops accepting and drops open connections.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.serving.await;
    }
}

async fn serve(listener: TcpListener, effects: Arc<Mutex<Effects>>, stop: CancellationToken) {
    loop {
        let (stream, _) = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(_) => continue,
            },
        };
        let effects = effects.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| respond(effects.clone(), request));
            let connection = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = connection => {}
            }
        });
    }
}

/// `Err` makes hyper close the connection without an answer (`/drop`).
async fn respond(
    effects: Arc<Mutex<Effects>>,
    request: Request<Incoming>,
) -> Result<Response<ProxyBody>, BoxError> {
    let path = request.uri().path().to_string();
    let query = request.uri().query().unwrap_or("").to_string();
    if request.method() == Method::GET || request.method() == Method::HEAD {
        return Ok(read(&effects, &path));
    }
    let key = request
        .headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    if let Some(fault) = mcp_fault(&path) {
        return mcp::respond(&effects, request, key, fault, &query).await;
    }
    if let Some((_, code)) = path.rsplit_once("/status/") {
        let status = code.parse().ok().and_then(|c| StatusCode::from_u16(c).ok());
        return Ok(match status {
            Some(status) => json_response(status, json!({ "status": status.as_u16() })),
            None => json_response(StatusCode::BAD_REQUEST, json!({ "error": "bad status" })),
        });
    }
    if path.contains("/once-429") && refuse_once(&effects, key.as_deref().unwrap_or(&path)) {
        let mut response = json_response(
            StatusCode::TOO_MANY_REQUESTS,
            json!({ "error": "slow down" }),
        );
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from_static("1"));
        return Ok(response);
    }
    let id = commit(&effects, key);
    let created = json!({ "id": id, "path": path });
    match path.rsplit('/').next().unwrap_or("") {
        "drop" => Err("dropped after commit".into()),
        "hang" => std::future::pending().await,
        "truncate" => {
            let part = Bytes::from_static(b"{\"id\":");
            let mut response = Response::new(stream(CutShort::new(part)));
            *response.status_mut() = StatusCode::CREATED;
            response
                .headers_mut()
                .insert(CONTENT_LENGTH, HeaderValue::from_static("100"));
            Ok(response)
        }
        "slow" => {
            tokio::time::sleep(slow(&query)).await;
            Ok(json_response(StatusCode::CREATED, created))
        }
        _ => Ok(json_response(StatusCode::CREATED, created)),
    }
}

/// The fault of an MCP endpoint's path (`""` for `/mcp` itself), or
/// `None` when the path is no MCP endpoint.
fn mcp_fault(path: &str) -> Option<&str> {
    if path.ends_with("/mcp") {
        return Some("");
    }
    let (endpoint, fault) = path.rsplit_once('/')?;
    endpoint.ends_with("/mcp").then_some(fault)
}

/// What the mock's MCP server answers.
mod mcp {
    use super::*;
    use http_body_util::{BodyExt, Limited};
    use serde_json::Value;

    /// The most a JSON-RPC message may hold here.
    const MAX_MESSAGE: usize = 1 << 20;

    pub(super) async fn respond(
        effects: &Mutex<Effects>,
        request: Request<Incoming>,
        key: Option<String>,
        fault: &str,
        query: &str,
    ) -> Result<Response<ProxyBody>, BoxError> {
        let modern = request
            .headers()
            .get("mcp-protocol-version")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v >= "2026-07-28");
        let body = Limited::new(request.into_body(), MAX_MESSAGE)
            .collect()
            .await?
            .to_bytes();
        let Ok(message) = serde_json::from_slice::<Value>(&body) else {
            return Ok(error(
                StatusCode::BAD_REQUEST,
                Value::Null,
                -32700,
                "Parse error",
            ));
        };
        let Some(id) = message.get("id").cloned() else {
            // A notification, or a client's answer: taken.
            let mut accepted = Response::new(full(Bytes::new()));
            *accepted.status_mut() = StatusCode::ACCEPTED;
            return Ok(accepted);
        };
        let method = message["method"].as_str().unwrap_or_default();
        let mut result = match method {
            "initialize" => json!({
                "protocolVersion": message["params"]["protocolVersion"].as_str().unwrap_or("2025-11-25"),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "idemgate-mock", "version": env!("CARGO_PKG_VERSION")},
            }),
            "ping" => json!({}),
            "tools/list" => json!({"tools": [
                {"name": "create_task", "description": "Create a task (not idempotent).",
                 "inputSchema": {"type": "object", "properties": {"title": {"type": "string"}}},
                 "outputSchema": {"type": "object", "properties": {"id": {"type": "integer"}},
                                  "required": ["id"]},
                 "annotations": {"readOnlyHint": false}},
                {"name": "count_tasks", "description": "How many tasks exist.",
                 "inputSchema": {"type": "object"},
                 "annotations": {"readOnlyHint": true}},
                {"name": "comment_task", "description": "Comment on a task (not idempotent).",
                 "inputSchema": {"type": "object", "properties": {
                     "title": {"type": "string"}, "text": {"type": "string"}}},
                 "annotations": {"readOnlyHint": false}},
            ]}),
            "tools/call" => match message["params"]["name"].as_str() {
                Some(tool @ ("create_task" | "comment_task")) => {
                    if let Ok(status) = fault.parse::<StatusCode>() {
                        return Ok(json_response(status, json!({ "status": status.as_u16() })));
                    }
                    if fault == "lose-once"
                        && refuse_once(effects, key.as_deref().unwrap_or_default())
                    {
                        return Err("dropped before commit".into());
                    }
                    let id = commit(effects, key);
                    if tool == "create_task"
                        && let Ok(mut effects) = effects.lock()
                    {
                        effects.tasks += 1;
                    }
                    match fault {
                        "drop" => return Err("dropped after commit".into()),
                        "hang" => std::future::pending().await,
                        "slow" => tokio::time::sleep(slow(query)).await,
                        _ => {}
                    }
                    if tool == "create_task" {
                        let mut created = text(&format!("created task {id}"));
                        created["structuredContent"] = json!({ "id": id });
                        created
                    } else {
                        text(&format!("commented ({id})"))
                    }
                }
                Some("count_tasks") => {
                    let tasks = effects.lock().map_or(0, |e| e.tasks);
                    let mut counted = text(&format!("{tasks} tasks"));
                    counted["structuredContent"] = json!({ "tasks": tasks });
                    counted
                }
                _ => return Ok(error(StatusCode::OK, id, -32602, "Unknown tool")),
            },
            _ => return Ok(error(StatusCode::NOT_FOUND, id, -32601, "Method not found")),
        };
        if modern {
            result["resultType"] = Value::from("complete");
        }
        Ok(json_response(
            StatusCode::OK,
            json!({"jsonrpc": "2.0", "id": id, "result": result}),
        ))
    }

    fn text(text: &str) -> Value {
        json!({"content": [{"type": "text", "text": text}], "isError": false})
    }

    fn error(status: StatusCode, id: Value, code: i64, message: &str) -> Response<ProxyBody> {
        json_response(
            status,
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}),
        )
    }
}

/// `/slow`'s wait: `ms=N` from the query, at most [`MAX_SLOW`].
fn slow(query: &str) -> Duration {
    let ms = query
        .split('&')
        .find_map(|pair| pair.strip_prefix("ms="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Duration::from_millis(ms).min(MAX_SLOW)
}

fn commit(effects: &Mutex<Effects>, key: Option<String>) -> u64 {
    let Ok(mut effects) = effects.lock() else {
        return 0;
    };
    effects.writes += 1;
    let id = effects.writes;
    if let Some(key) = key {
        effects.by_key.insert(key, id);
    }
    id
}

fn refuse_once(effects: &Mutex<Effects>, key: &str) -> bool {
    effects
        .lock()
        .is_ok_and(|mut e| e.refused_once.insert(key.to_string()))
}

fn read(effects: &Mutex<Effects>, path: &str) -> Response<ProxyBody> {
    let Ok(effects) = effects.lock() else {
        return json_response(StatusCode::INTERNAL_SERVER_ERROR, json!({}));
    };
    match path.strip_prefix("/_effects") {
        Some("") => json_response(
            StatusCode::OK,
            json!({ "writes": effects.writes, "keys": effects.by_key.len() }),
        ),
        Some(rest) => match effects.by_key.get(rest.trim_start_matches('/')) {
            Some(id) => json_response(StatusCode::OK, json!({ "id": id })),
            None => json_response(StatusCode::NOT_FOUND, json!({ "error": "no such effect" })),
        },
        None => json_response(StatusCode::OK, json!({ "ok": true })),
    }
}

fn json_response(status: StatusCode, body: serde_json::Value) -> Response<ProxyBody> {
    let mut response = Response::new(full(body.to_string()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
