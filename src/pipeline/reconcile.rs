//! Reconcile probes (docs/requests.md, "After a lost response"): a read-only GET to the route's own
//! upstream that may prove an `unknown` operation happened, or on an MCP
//! route a call of a read-only tool (docs/mcp.md, "Reconcile").
//!
//! Invariants:
//! - a probe only ever *upgrades* an operation: a match settles it
//!   `completed` (evidence `reconciled`) with the probe's response as what
//!   later replays get; anything else — 404, another status, a timeout —
//!   leaves it `unknown`: "not found" is never proof that nothing happened;
//! - the probe carries the credential headers of the request that triggered
//!   it, held in memory only for the probe's duration, never stored;
//! - at most one probe per operation is in flight, each bounded by the
//!   route's `reconcile.timeout`; a request that would probe while one is
//!   running waits for that one instead (bounded the same), so that either
//!   way it can answer from what the probe left in the store;
//! - a probe asks about its own key and nothing else: [`url_for`] is the
//!   one place a probe URL is built from a key.

use std::future::Future;
use std::time::Duration;

use bytes::BytesMut;
use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderName, HeaderValue};
use http::{HeaderMap, Request};
use http_body_util::BodyExt;
use serde_json::json;
use tokio::sync::watch;

use crate::body::full;
use crate::config::{McpReconcile, Reconcile, Route};
use crate::operation::{Event, StoredResponse};
use crate::pipeline::forward::{ProbeClient, strip_hop_by_hop};
use crate::pipeline::key::url_component;
use crate::pipeline::sse;
use crate::store::{LateEvidence, LateSource, Store};
use crate::traces::{self, Step};

/// What a probe found.
pub enum ProbeResult {
    /// The upstream shows the operation happened; this is its response.
    Matched(StoredResponse),
    /// No proof either way.
    NotMatched {
        status: Option<u16>,
        error: Option<String>,
    },
}

impl ProbeResult {
    /// The timeline entry for this probe (never credentials or bodies).
    pub fn event(&self, url: &str) -> Event {
        let detail = match self {
            ProbeResult::Matched(response) => {
                json!({ "url": url, "status": response.status, "matched": true })
            }
            ProbeResult::NotMatched { status, error } => {
                json!({ "url": url, "status": status, "matched": false, "error": error })
            }
        };
        Event {
            kind: "probe",
            detail,
        }
    }
}

/// The probes in flight in this process, by operation id; each probe's
/// receiver lets a request that comes meanwhile wait for it to end.
#[derive(Default)]
pub struct Reconciler {
    running: DashMap<String, watch::Receiver<()>>,
}

/// Held while a probe runs: dropping it removes the operation from the
/// running set and (dropping the sender) wakes whoever waits on it.
struct Running<'a> {
    reconciler: &'a Reconciler,
    operation_id: &'a str,
    _done: watch::Sender<()>,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.reconciler.running.remove(self.operation_id);
    }
}

/// The probe URL for a key: the only place a key becomes part of a URL
/// for a probe; `None` when no URL can name the key's resource safely.
///
/// Invariant: the URL names the key's own resource and nothing else. The
/// configured URL has `{key}` only in its path or query and no fragment
/// (checked at load, see `config`); each `{key}` becomes the key as one
/// URL component, every byte but `A–Z a–z 0–9 - _ ~` percent-encoded, so no
/// key can add a segment, a query parameter or a fragment. A key that is a
/// dot-segment (`.`, `..`) is never put in a path at all: encoded as `%2E`
/// it is still resolved to the collection by any upstream (or proxy in
/// front of it) that normalizes per RFC 3986 §6.2.2 before resolving, and
/// a probe that may ask about the wrong resource is worse than none.
pub fn url_for(reconcile: &Reconcile, key: &str) -> Option<String> {
    let path = reconcile.url.split(['?', '#']).next().unwrap_or_default();
    if path.contains("{key}") && matches!(key, "." | "..") {
        return None;
    }
    Some(reconcile.url.replace("{key}", &url_component(key)))
}

impl Reconciler {
    /// Probes for a held operation and settles it `completed` (evidence
    /// `reconciled`) on a match; the probe is on its timeline either way.
    /// When a probe for the operation is already running, waits for it to
    /// end instead. Either way the caller then reads the store, which holds
    /// whatever the probe (or anything else) settled.
    pub async fn reconcile(
        &self,
        store: &dyn Store,
        client: &ProbeClient,
        route: &Route,
        operation_id: &str,
        key: &str,
        credentials: &HeaderMap,
    ) {
        let tool = route.mcp.as_ref().and_then(|m| m.reconcile.as_ref());
        let (reconcile, tool) = match (route.reconcile.as_ref(), tool) {
            (Some(reconcile), _) => (Some(reconcile), None),
            (None, Some(tool)) => (None, Some(tool)),
            (None, None) => return,
        };
        let timeout =
            reconcile.map_or_else(|| tool.map_or(Duration::ZERO, |t| t.timeout), |r| r.timeout);
        let url = match (reconcile, tool) {
            (Some(reconcile), _) => url_for(reconcile, key),
            (None, _) => Some(String::new()),
        };
        let Some(url) = url else {
            let event = Event {
                kind: "probe",
                detail: json!({ "skipped": "the key is a dot-segment: no probe URL can name its resource" }),
            };
            if let Err(error) = store.add_event(operation_id, &event).await {
                tracing::warn!(%operation_id, %error, "cannot record a skipped probe");
            }
            return;
        };
        let done = match self.running.entry(operation_id.to_string()) {
            Entry::Occupied(running) => Err(running.get().clone()),
            Entry::Vacant(vacant) => {
                let (done, running) = watch::channel(());
                vacant.insert(running);
                Ok(done)
            }
        };
        let done = match done {
            Ok(done) => done,
            Err(mut running) => {
                // `changed` ends when the running probe drops its sender.
                let _ = tokio::time::timeout(timeout, running.changed()).await;
                return;
            }
        };
        let _running = Running {
            reconciler: self,
            operation_id,
            _done: done,
        };
        let probe = async {
            let result = match (reconcile, tool) {
                (Some(reconcile), _) => {
                    let fetched = fetch(client, route, reconcile, &url, credentials);
                    within(timeout, fetched).await
                }
                (None, Some(tool)) => {
                    let called =
                        call_tool(store, client, route, tool, operation_id, key, credentials);
                    within(timeout, called).await
                }
                (None, None) => {
                    return ProbeResult::NotMatched {
                        status: None,
                        error: None,
                    };
                }
            };
            match &result {
                ProbeResult::Matched(response) => traces::probe_ended(true, Some(response.status)),
                ProbeResult::NotMatched { status, .. } => traces::probe_ended(false, *status),
            }
            result
        };
        let result = traces::child(Step::Probe, probe).await;
        let asked = match tool {
            Some(tool) => format!("tools/call {}", tool.tool),
            None => url,
        };
        let event = result.event(&asked);
        let written = match result {
            ProbeResult::Matched(response) => {
                let late = LateEvidence {
                    operation_id: operation_id.to_string(),
                    source: LateSource::Reconciled,
                    response,
                    event,
                };
                store.settle_held(&late).await.map(drop)
            }
            ProbeResult::NotMatched { .. } => store.add_event(operation_id, &event).await,
        };
        if let Err(error) = written {
            tracing::warn!(%operation_id, %error, "cannot record a probe's result");
        }
    }
}

/// Asks the route's probe about `key` once and stores nothing: what the
/// destination says it holds (`idemgate rehearse`, docs/rehearse.md).
/// `None` without a probe, or for a key no probe URL can name.
pub async fn ask(
    client: &ProbeClient,
    route: &Route,
    key: &str,
    credentials: &HeaderMap,
) -> Option<(String, ProbeResult)> {
    let reconcile = route.reconcile.as_ref()?;
    let url = url_for(reconcile, key)?;
    let result = within(
        reconcile.timeout,
        fetch(client, route, reconcile, &url, credentials),
    )
    .await;
    Some((url, result))
}

/// `probe`, or no match when it has no answer within `timeout`.
async fn within(timeout: Duration, probe: impl Future<Output = ProbeResult>) -> ProbeResult {
    tokio::time::timeout(timeout, probe)
        .await
        .unwrap_or_else(|_| ProbeResult::NotMatched {
            status: None,
            error: Some(format!(
                "no answer within {}",
                humantime::format_duration(timeout)
            )),
        })
}

async fn fetch(
    client: &ProbeClient,
    route: &Route,
    reconcile: &Reconcile,
    url: &str,
    credentials: &HeaderMap,
) -> ProbeResult {
    let not_matched = |status, error: String| ProbeResult::NotMatched {
        status,
        error: Some(error),
    };
    let mut request = Request::get(url).body(full(""));
    if let Ok(request) = &mut request {
        *request.headers_mut() = credentials.clone();
        request
            .headers_mut()
            .insert(ACCEPT, HeaderValue::from_static("application/json"));
        traces::inject(request.headers_mut());
    }
    let response = match send(client, request).await {
        Ok(response) => response,
        Err(not_sent) => return not_sent,
    };
    let (mut head, mut body) = response.into_parts();
    strip_hop_by_hop(&mut head.headers);
    let status = head.status.as_u16();
    let mut buffer = BytesMut::new();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Ok(data) = frame.into_data() {
                    buffer.extend_from_slice(&data);
                }
                if buffer.len() > route.max_stored_response {
                    return not_matched(Some(status), "probe response too large to store".into());
                }
            }
            Err(e) => return not_matched(Some(status), format!("probe response cut: {e}")),
        }
    }
    if status != reconcile.found_status {
        return not_matched(
            Some(status),
            format!("status {status} is not {}", reconcile.found_status),
        );
    }
    if let Some(pointer) = &reconcile.found_json_pointer {
        let found = serde_json::from_slice::<serde_json::Value>(&buffer)
            .ok()
            .is_some_and(|v| v.pointer(pointer).is_some_and(|v| !v.is_null()));
        if !found {
            return not_matched(Some(status), format!("nothing at {pointer}"));
        }
    }
    ProbeResult::Matched(crate::pipeline::record::stored_response(
        &head,
        Some(buffer.to_vec()),
    ))
}

/// An MCP route's probe: one call of its read-only tool, its arguments
/// filled from the held call ([`McpReconcile::arguments_for`]), as a
/// stateless 2026-07-28 request to the endpoint the held call went to. It
/// matches when the tool's result is no error and, with
/// `found_json_pointer`, holds a non-null value there; the result, marked
/// `dev.idemgate/reconciled-by`, is then what retries of the held call get.
async fn call_tool(
    store: &dyn Store,
    client: &ProbeClient,
    route: &Route,
    probe: &McpReconcile,
    operation_id: &str,
    key: &str,
    credentials: &HeaderMap,
) -> ProbeResult {
    let not_matched = |status, error: String| ProbeResult::NotMatched {
        status,
        error: Some(error),
    };
    let held = match store.get(operation_id).await {
        Ok(Some((operation, _))) => operation,
        Ok(None) => return not_matched(None, "the operation is gone".into()),
        Err(e) => return not_matched(None, format!("the store: {e}")),
    };
    let sent: serde_json::Value = held
        .request
        .body
        .as_deref()
        .and_then(|body| serde_json::from_slice(body).ok())
        .unwrap_or_default();
    // The operation's key is `<tool>/<key>`: the call's own key is after it.
    let call_key = key.split_once('/').map_or(key, |(_, own)| own);
    let arguments = match probe.arguments_for(call_key, |name| {
        sent.pointer("/params/arguments")?.get(name).cloned()
    }) {
        Ok(arguments) => arguments,
        Err(e) => return not_matched(None, e),
    };
    let body = json!({
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": probe.tool,
            "arguments": arguments,
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": PROBE_REVISION,
                "io.modelcontextprotocol/clientCapabilities": {},
            },
        },
    });
    let uri = match route.upstream.uri_for(&held.request.path) {
        Ok(uri) => uri,
        Err(e) => return not_matched(None, e.to_string()),
    };
    let mut request = Request::post(uri).body(full(body.to_string()));
    if let Ok(request) = &mut request {
        let headers = request.headers_mut();
        *headers = credentials.clone();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(
            ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        headers.insert(
            "mcp-protocol-version",
            HeaderValue::from_static(PROBE_REVISION),
        );
        headers.insert("mcp-method", HeaderValue::from_static("tools/call"));
        if let Ok(name) = HeaderValue::from_str(&probe.tool) {
            headers.insert("mcp-name", name);
        }
        traces::inject(headers);
    }
    let response = match send(client, request).await {
        Ok(response) => response,
        Err(not_sent) => return not_sent,
    };
    let status = response.status().as_u16();
    let streamed = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.trim_start().starts_with("text/event-stream"));
    let limited = http_body_util::Limited::new(response.into_body(), route.max_stored_response);
    let read = match limited.collect().await {
        Ok(read) => read.to_bytes(),
        Err(e) => return not_matched(Some(status), format!("probe answer unread: {e}")),
    };
    let messages: Vec<serde_json::Value> = if streamed {
        sse::messages(&read)
            .iter()
            .filter_map(|data| serde_json::from_str(data).ok())
            .collect()
    } else {
        serde_json::from_slice(&read).into_iter().collect()
    };
    let answer = messages
        .into_iter()
        .find(|m| m.get("id") == Some(&serde_json::Value::from(1)));
    let Some(mut result) = answer.and_then(|mut m| m.get_mut("result").map(std::mem::take)) else {
        return not_matched(Some(status), "no result for the probe's call".into());
    };
    if result["isError"] == true {
        return not_matched(Some(status), "the tool answered an error".into());
    }
    if let Some(pointer) = &probe.found_json_pointer
        && result.pointer(pointer).is_none_or(|v| v.is_null())
    {
        return not_matched(Some(status), format!("nothing at {pointer}"));
    }
    if let Some(members) = result.as_object_mut() {
        let meta = members.entry("_meta").or_insert_with(|| json!({}));
        if let Some(meta) = meta.as_object_mut() {
            meta.insert("dev.idemgate/reconciled-by".into(), json!(probe.tool));
        }
    }
    let stored = json!({"jsonrpc": "2.0", "id": null, "result": result});
    ProbeResult::Matched(StoredResponse {
        status: 200,
        headers: vec![("content-type".into(), b"application/json".to_vec())],
        body: Some(stored.to_string().into_bytes()),
    })
}

/// A probe's request sent: its response, or no match saying why not.
async fn send(
    client: &ProbeClient,
    request: Result<Request<crate::body::ProxyBody>, http::Error>,
) -> Result<http::Response<hyper::body::Incoming>, ProbeResult> {
    let not_sent = |error: String| ProbeResult::NotMatched {
        status: None,
        error: Some(error),
    };
    let request = request.map_err(|e| not_sent(e.to_string()))?;
    client
        .request(request)
        .await
        .map_err(|e| not_sent(e.to_string()))
}

/// The MCP revision an MCP probe speaks: stateless, so it needs no session.
const PROBE_REVISION: &str = "2026-07-28";

/// Keeps only the headers a probe may carry: `authorization` and the
/// route's scope headers.
pub fn credentials(headers: &HeaderMap, route: &Route) -> HeaderMap {
    let mut kept = HeaderMap::new();
    if !route.has_probe() {
        // No probe will ever present them.
        return kept;
    }
    let mut names: Vec<&HeaderName> = std::iter::once(&AUTHORIZATION)
        .chain(&route.scope_headers)
        .collect();
    names.sort_by_key(|n| n.as_str());
    names.dedup();
    for name in names {
        for value in headers.get_all(name) {
            kept.append(name.clone(), value.clone());
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn probe(url: &str) -> Reconcile {
        Reconcile {
            url: url.into(),
            found_status: 200,
            found_json_pointer: None,
            timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn keys_are_url_component_encoded() {
        let reconcile = probe("http://api/v1/orders?idempotency_key={key}");
        assert_eq!(
            url_for(&reconcile, "a/b?c=d&e f#~x").as_deref(),
            Some("http://api/v1/orders?idempotency_key=a%2Fb%3Fc%3Dd%26e%20f%23~x")
        );
    }

    #[test]
    fn dot_keys_are_never_dot_segments() {
        // In the path, no encoding is safe from an upstream that normalizes
        // `%2E` before resolving: no probe.
        let in_path = probe("http://api/v1/tasks/{key}?again={key}");
        assert_eq!(url_for(&in_path, ".."), None);
        assert_eq!(url_for(&in_path, "."), None);
        assert_eq!(
            url_for(&in_path, "a.b").as_deref(),
            Some("http://api/v1/tasks/a%2Eb?again=a%2Eb")
        );
        assert_eq!(
            url_for(&in_path, "...").as_deref(),
            Some("http://api/v1/tasks/%2E%2E%2E?again=%2E%2E%2E")
        );
        // In the query a dot key is only a value.
        let in_query = probe("http://api/v1/tasks?key={key}");
        assert_eq!(
            url_for(&in_query, "..").as_deref(),
            Some("http://api/v1/tasks?key=%2E%2E")
        );
    }
}
