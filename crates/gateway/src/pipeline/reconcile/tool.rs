//! An MCP route's probe questions: a call of a read-only tool, its
//! arguments filled from the held call ([`fill_template`]), as a stateless
//! 2026-07-28 request to the endpoint the held call went to, or, if the
//! server refuses that, in a session of 2025-11-25 or the older revision
//! the server answers with. Its answer is
//! the tool's result; a result that is an error is no answer at all. A
//! result that proves the held call happened is not what its retries get
//! (it is another tool's): they get the gateway's own answer
//! ([`answer::settled`]).

use http::header::{ACCEPT, CONTENT_TYPE, HeaderValue};
use http::{HeaderMap, Request, Uri};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use std::time::Duration;

use super::send;
use super::verdict::{Answer, Got};
use crate::body::full;
use crate::config::{ProbeKeys, Route, fill_template};
use crate::pipeline::forward::{self, ProbeClient};
use crate::pipeline::mcp::answer::{self, Proof};
use crate::pipeline::mcp::identity;
use crate::pipeline::sse;
use crate::traces;
use idemgate_model::operation::{Operation, StoredResponse};

/// The MCP revision an MCP probe speaks first: stateless, so it needs no
/// session.
const PROBE_REVISION: &str = "2026-07-28";

/// The revision a probe asks for in a session, with a server that refuses
/// a stateless request: the server may answer with an older one it
/// speaks, which the probe then speaks (the call is the same in each).
const SESSION_REVISION: &str = "2025-11-25";

/// The JSON-RPC id of a probe's call.
const CALL_ID: i64 = 1;

/// The id of a session's `initialize`: not the call's, since a session
/// never reuses an id.
const INITIALIZE_ID: i64 = 0;

/// How long a session's end (its `DELETE`) may take, after the probe.
const SESSION_END: Duration = Duration::from_secs(5);

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
    let asked = || format!("tools/call {}", call.tool);
    let answer = |status, got| Answer {
        asked: asked(),
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
    let keys = ProbeKeys {
        key: identity::own_key(call.keys.key),
        ..call.keys
    };
    let arguments = match fill_template(call.arguments, keys, |name| {
        sent.pointer("/params/arguments")?.get(name).cloned()
    }) {
        Ok(arguments) => arguments,
        Err(e) => return Answer::not_asked(asked(), &e),
    };
    let uri = match route.upstream.uri_for(&call.held.request.path) {
        Ok(uri) => uri,
        Err(e) => return Answer::not_asked(asked(), &e.to_string()),
    };
    let ask = Asking {
        client,
        route,
        uri: &uri,
        credentials,
    };
    let stateless = ask
        .exchange(
            &Speaking::Stateless(call.tool),
            tool_call(call.tool, &arguments, true),
        )
        .await;
    // A server of an older revision only refuses a stateless request (400:
    // `Unsupported protocol version`, or `Missing session ID` from one
    // that keeps sessions; or an error for the call): ask again as its
    // clients do, in a session. Where no session could be opened, its
    // stateless answer is told.
    let refused = |e: &Exchanged| {
        e.status == 400 || reply(&e.messages, CALL_ID).is_some_and(|m| m.get("error").is_some())
    };
    let exchanged = match stateless {
        Ok(stateless) if refused(&stateless) => {
            let in_session = ask.in_session(call.tool, &arguments).await;
            in_session.unwrap_or(stateless)
        }
        Ok(exchanged) => exchanged,
        Err(error) => return answer(None, Err(error)),
    };
    let status = Some(exchanged.status);
    let result = reply(&exchanged.messages, CALL_ID)
        .and_then(|m| m.get("result"))
        .cloned();
    let Some(result) = result else {
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

/// The `tools/call` of `tool` with `arguments`; `stateless` carries the
/// revision and capabilities in its `_meta`, as 2026-07-28 asks.
fn tool_call(tool: &str, arguments: &Value, stateless: bool) -> Value {
    let mut call = json!({
        "jsonrpc": "2.0",
        "id": CALL_ID,
        "method": "tools/call",
        "params": { "name": tool, "arguments": arguments },
    });
    if stateless {
        call["params"]["_meta"] = json!({
            "io.modelcontextprotocol/protocolVersion": PROBE_REVISION,
            "io.modelcontextprotocol/clientCapabilities": {},
        });
    }
    call
}

/// The response to a probe's request `id` among `messages`.
fn reply(messages: &[Value], id: i64) -> Option<&Value> {
    messages
        .iter()
        .find(|m| m.get("id") == Some(&Value::from(id)))
}

/// How a probe's request speaks MCP.
enum Speaking<'a> {
    /// 2026-07-28, calling this tool (its `Mcp-Name`).
    Stateless(&'a str),
    /// Opening a session: no revision header yet.
    Opening,
    /// In a session of this revision, with the server's session id if it
    /// gave one.
    InSession(&'a str, Option<&'a HeaderValue>),
}

/// A probe's answer: its status, headers and JSON-RPC messages.
struct Exchanged {
    status: u16,
    headers: HeaderMap,
    messages: Vec<Value>,
}

/// Where and as whom a probe asks.
struct Asking<'a> {
    client: &'a ProbeClient,
    route: &'a Route,
    uri: &'a Uri,
    credentials: &'a HeaderMap,
}

impl Asking<'_> {
    /// The request's headers: the held call's credentials and what MCP
    /// asks of a client speaking as `speaking` says.
    fn headers(&self, speaking: &Speaking) -> HeaderMap {
        let mut headers = self.credentials.clone();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(
            ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        forward::ask_for_identity(&mut headers);
        match speaking {
            Speaking::Stateless(tool) => {
                headers.insert(
                    "mcp-protocol-version",
                    HeaderValue::from_static(PROBE_REVISION),
                );
                headers.insert("mcp-method", HeaderValue::from_static("tools/call"));
                if let Ok(name) = HeaderValue::from_str(tool) {
                    headers.insert("mcp-name", name);
                }
            }
            Speaking::Opening => {}
            Speaking::InSession(revision, session) => {
                if let Ok(revision) = HeaderValue::from_str(revision) {
                    headers.insert("mcp-protocol-version", revision);
                }
                if let Some(session) = session {
                    headers.insert("mcp-session-id", (*session).clone());
                }
            }
        }
        traces::inject(&mut headers);
        headers
    }

    /// POSTs `message` and reads the answer, JSON or an event stream, up
    /// to the route's `max_stored_response`.
    async fn exchange(&self, speaking: &Speaking<'_>, message: Value) -> Result<Exchanged, String> {
        let mut request = Request::post(self.uri.clone()).body(full(message.to_string()));
        if let Ok(request) = &mut request {
            *request.headers_mut() = self.headers(speaking);
        }
        let response = send(self.client, request).await?;
        let (parts, body) = response.into_parts();
        let streamed = parts
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.trim_start().starts_with("text/event-stream"));
        let limited = http_body_util::Limited::new(body, self.route.max_stored_response);
        let read = match limited.collect().await {
            Ok(read) => read.to_bytes(),
            Err(e) => return Err(format!("probe answer unread: {e}")),
        };
        let messages = if streamed {
            sse::messages(&read)
                .iter()
                .filter_map(|data| serde_json::from_str(data).ok())
                .collect()
        } else {
            serde_json::from_slice(&read).into_iter().collect()
        };
        Ok(Exchanged {
            status: parts.status.as_u16(),
            headers: parts.headers,
            messages,
        })
    }

    /// Calls `tool` as a client of [`SESSION_REVISION`] does: opens a
    /// session (`initialize`, `notifications/initialized`), calls, and
    /// ends the session the server gave, after the probe, never waiting
    /// for it.
    async fn in_session(&self, tool: &str, arguments: &Value) -> Result<Exchanged, String> {
        let initialize = json!({
            "jsonrpc": "2.0",
            "id": INITIALIZE_ID,
            "method": "initialize",
            "params": {
                "protocolVersion": SESSION_REVISION,
                "capabilities": {},
                "clientInfo": { "name": "idemgate-probe", "version": env!("CARGO_PKG_VERSION") },
            },
        });
        let opened = self.exchange(&Speaking::Opening, initialize).await?;
        let opening = reply(&opened.messages, INITIALIZE_ID);
        let Some(result) = opening.and_then(|m| m.get("result")) else {
            return Err(format!(
                "the server refused a stateless call and a session (HTTP {})",
                opened.status
            ));
        };
        let revision = result["protocolVersion"]
            .as_str()
            .unwrap_or(SESSION_REVISION)
            .to_owned();
        let session = opened.headers.get("mcp-session-id");
        let speaking = Speaking::InSession(&revision, session);
        let initialized = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
        let called = match self.exchange(&speaking, initialized).await {
            Ok(_) => {
                self.exchange(&speaking, tool_call(tool, arguments, false))
                    .await
            }
            Err(error) => Err(error),
        };
        // Ended whatever became of the call: the server keeps no session
        // of a probe's.
        if session.is_some() {
            let end = Request::delete(self.uri.clone()).body(full(""));
            let (client, headers) = (self.client.clone(), self.headers(&speaking));
            tokio::spawn(async move {
                let Ok(mut end) = end else { return };
                *end.headers_mut() = headers;
                let _ = tokio::time::timeout(SESSION_END, client.request(end)).await;
            });
        }
        called
    }
}

/// What retries of the held call get when `result` proves it happened:
/// the gateway's own answer, naming `tool` and carrying its result's
/// `content` — never the result itself, another tool's, whose
/// `structuredContent` the held call's tool's `outputSchema` would refuse.
fn retries_answer(result: &Value, tool: &str, operation: &str) -> StoredResponse {
    let content = result["content"].as_array().map_or(&[][..], Vec::as_slice);
    answer::settled(operation, &Proof::Found { tool, content })
}
