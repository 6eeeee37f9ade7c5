//! An MCP route's probe questions: a call of a read-only tool, its
//! arguments filled from the held call ([`fill_template`]), as a stateless
//! 2026-07-28 request to the endpoint the held call went to. Its answer is
//! the tool's result; a result that is an error is no answer at all. A
//! result that proves the held call happened is not what its retries get
//! (it is another tool's): they get the gateway's own answer
//! ([`answer::settled`]).

use http::header::{ACCEPT, CONTENT_TYPE, HeaderValue};
use http::{HeaderMap, Request};
use http_body_util::BodyExt;
use serde_json::{Value, json};

use super::send;
use super::verdict::{Answer, Got};
use crate::body::full;
use crate::config::{ProbeKeys, Route, fill_template};
use crate::pipeline::forward::{self, ProbeClient};
use crate::pipeline::mcp::answer::{self, Proof};
use crate::pipeline::sse;
use crate::traces;
use idemgate_model::operation::{Operation, StoredResponse};

/// The MCP revision an MCP probe speaks: stateless, so it needs no session.
const PROBE_REVISION: &str = "2026-07-28";

/// One tool call and the held call it asks about.
pub struct Call<'a> {
    pub(crate) tool: &'a str,
    /// The arguments template.
    pub(crate) arguments: &'a str,
    pub(crate) held: &'a Operation,
    /// The operation's key (`<tool>/<key>`) and destination key.
    pub(crate) keys: ProbeKeys<'a>,
}

/// Calls the tool with `credentials`: its result, or why there is none,
/// and what retries of the held call get if it proves the call happened
/// ([`retries_answer`]).
pub async fn call(
    client: &ProbeClient,
    route: &Route,
    call: &Call<'_>,
    credentials: &HeaderMap,
) -> Answer {
    let answer = |status, got| Answer {
        asked: format!("tools/call {}", call.tool),
        status,
        got,
    };
    let sent: Value = call
        .held
        .request
        .body
        .as_deref()
        .and_then(|body| serde_json::from_slice(body).ok())
        .unwrap_or_default();
    // The operation's key is `<tool>/<key>`: the call's own key is after it.
    let key = call.keys.key;
    let keys = ProbeKeys {
        key: key.split_once('/').map_or(key, |(_, own)| own),
        ..call.keys
    };
    let arguments = match fill_template(call.arguments, keys, |name| {
        sent.pointer("/params/arguments")?.get(name).cloned()
    }) {
        Ok(arguments) => arguments,
        Err(e) => return answer(None, Err(e)),
    };
    let body = json!({
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": call.tool,
            "arguments": arguments,
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": PROBE_REVISION,
                "io.modelcontextprotocol/clientCapabilities": {},
            },
        },
    });
    let uri = match route.upstream.uri_for(&call.held.request.path) {
        Ok(uri) => uri,
        Err(e) => return answer(None, Err(e.to_string())),
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
        forward::ask_for_identity(headers);
        headers.insert(
            "mcp-protocol-version",
            HeaderValue::from_static(PROBE_REVISION),
        );
        headers.insert("mcp-method", HeaderValue::from_static("tools/call"));
        if let Ok(name) = HeaderValue::from_str(call.tool) {
            headers.insert("mcp-name", name);
        }
        traces::inject(headers);
    }
    let response = match send(client, request).await {
        Ok(response) => response,
        Err(error) => return answer(None, Err(error)),
    };
    let status = Some(response.status().as_u16());
    let streamed = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.trim_start().starts_with("text/event-stream"));
    let limited = http_body_util::Limited::new(response.into_body(), route.max_stored_response);
    let read = match limited.collect().await {
        Ok(read) => read.to_bytes(),
        Err(e) => return answer(status, Err(format!("probe answer unread: {e}"))),
    };
    let messages: Vec<Value> = if streamed {
        sse::messages(&read)
            .iter()
            .filter_map(|data| serde_json::from_str(data).ok())
            .collect()
    } else {
        serde_json::from_slice(&read).into_iter().collect()
    };
    let reply = messages
        .into_iter()
        .find(|m| m.get("id") == Some(&Value::from(1)));
    let Some(result) = reply.and_then(|mut m| m.get_mut("result").map(std::mem::take)) else {
        return answer(status, Err("no result for the probe's call".into()));
    };
    if result["isError"] == true {
        return answer(status, Err("the tool answered an error".into()));
    }
    let response = retries_answer(&result, call.tool, &call.held.id);
    answer(
        status,
        Ok(Got {
            json: Some(result),
            response,
        }),
    )
}

/// What retries of the held call get when `result` proves it happened:
/// the gateway's own answer, naming `tool` and carrying its result's
/// `content` — never the result itself, another tool's, whose
/// `structuredContent` the held call's tool's `outputSchema` would refuse.
fn retries_answer(result: &Value, tool: &str, operation: &str) -> StoredResponse {
    let content = result["content"].as_array().map_or(&[][..], Vec::as_slice);
    answer::settled(operation, &Proof::Found { tool, content })
}
