//! Every answer to a protected tool call, as an MCP client reads it
//! (docs/mcp.md, "What the agent sees").
//!
//! Invariants:
//! - an answer is a JSON-RPC response under the id of the request being
//!   answered — a first answer, a replay stored under another request's
//!   id, a released attempt's answer to its waiters alike — as JSON, or as
//!   an event stream when the client takes only that, or when the
//!   upstream's notifications are relayed before it;
//! - a replay's result carries `_meta["dev.idemgate/replayed"] = true`
//!   (and the `Idempotent-Replayed: true` header), and under the modern
//!   revision every result carries the `resultType` it requires;
//! - the gateway's own answers are tool results a model reads (HTTP 200,
//!   `isError: true`, one text saying what happened and what not to do,
//!   and `_meta` naming the problem, the operation and its state), never
//!   JSON-RPC errors, which agents tend to retry; only a request refused
//!   before it is classified (a body that is no JSON, a header mismatch,
//!   a batch holding a call or cancelling one in flight) is a JSON-RPC
//!   error, as the specification says;
//! - a call settled `completed` without a result of its own tool (a
//!   reconcile probe found it, an operator resolved it without a
//!   `result`) is answered by the gateway ([`settled`]), never with
//!   another tool's result: `isError: true` and no `structuredContent`,
//!   the one shape every SDK client takes whatever `outputSchema` the tool
//!   declares (they check a result's structured content against it only
//!   when `isError` is not true);
//! - what the gateway does not change of an answer (all but its `id` and
//!   its result's `resultType` and `_meta`) is answered as the server
//!   wrote it, numbers beyond a double's precision included: a message is
//!   read only as far as [`Members`].

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::BodyExt;
use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use crate::body::{ProxyBody, full};
use crate::metrics::{OperationId, Outcome};
use crate::pipeline::error::ProxyError;
use crate::pipeline::mcp::call::{Call, Refusal};
use crate::pipeline::mcp::outcome::{Message, Relayed};
use crate::pipeline::sse;
use crate::profile::Profile;
use idemgate_model::operation::StoredResponse;

/// The `_meta` keys of the gateway's own.
pub mod meta {
    pub const REPLAYED: &str = "dev.idemgate/replayed";
    pub const PROBLEM: &str = "dev.idemgate/problem";
    pub const OPERATION_ID: &str = "dev.idemgate/operation-id";
    pub const STATE: &str = "dev.idemgate/state";
    pub const RECONCILED_BY: &str = "dev.idemgate/reconciled-by";
    pub const RESOLVED_BY: &str = "dev.idemgate/resolved-by";
}

/// The problem of a call settled without its own result ([`settled`]).
const COMPLETED_WITHOUT_RESULT: &str = "completed-without-result";

/// The answer to `call`, from what the write phases answered.
pub async fn finish(
    answered: Result<Response<ProxyBody>, ProxyError>,
    call: &Call,
) -> Response<ProxyBody> {
    let response = match answered {
        Ok(response) => response,
        Err(error) => return problem(error, call).await,
    };
    let outcome = response.extensions().get::<Outcome>().copied();
    if outcome == Some(Outcome::unknown) {
        // An upstream status held as unknown (502, 504), passed on as it
        // streamed: the call's answer is that it is held.
        let operation = response.extensions().get::<OperationId>().cloned();
        return held(operation, call);
    }
    let read = outcome == Some(Outcome::replayed)
        || outcome == Some(Outcome::released)
        || response.extensions().get::<Message>().is_some();
    if !read {
        // Too large to store: streamed as the upstream wrote it, under
        // this very request's id.
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = body.collect().await.map(|c| c.to_bytes()) else {
        let error = ProxyError::Internal {
            reason: "a stored answer could not be read".into(),
        };
        return problem(error, call).await;
    };
    let message = serde_json::from_slice::<Members>(&bytes)
        .ok()
        .filter(|m| m.contains_key("jsonrpc"));
    let replayed = outcome == Some(Outcome::replayed);
    let mut message = match message {
        Some(message) => message,
        // Stored otherwise (an operator's resolution with an HTTP
        // response): its text is the tool's result.
        None if replayed => {
            let text = String::from_utf8_lossy(&bytes);
            let result = json!({"content": [{"type": "text", "text": text}], "isError": false});
            Members::from([
                ("jsonrpc".into(), raw(&"2.0")),
                ("result".into(), raw(&result)),
            ])
        }
        // Not JSON-RPC (an upstream's 4xx page): as it came.
        None => return Response::from_parts(parts, full(bytes)),
    };
    message.insert("id".into(), call.id_as_sent.clone());
    let result = message.get("result");
    if let Some(mut result) = result.and_then(|r| serde_json::from_str::<Members>(r.get()).ok()) {
        if call.modern {
            result
                .entry("resultType".into())
                .or_insert_with(|| raw(&"complete"));
        }
        if replayed {
            let meta = result.get("_meta");
            let mut meta = meta
                .and_then(|m| serde_json::from_str::<Members>(m.get()).ok())
                .unwrap_or_default();
            meta.insert(meta::REPLAYED.into(), raw(&true));
            result.insert("_meta".into(), raw(&meta));
        }
        message.insert("result".into(), raw(&result));
    }
    let relayed = parts.extensions.remove::<Relayed>().unwrap_or_default();
    parts.headers.remove(CONTENT_LENGTH);
    render(parts, &message, &relayed.0, call)
}

/// The tail of an answer already streaming ([`super::relay::Streamed`]):
/// the answer as its last event, or the rest of one too large to store.
pub async fn finish_streamed(
    answered: Result<Response<ProxyBody>, ProxyError>,
    call: &Call,
) -> ProxyBody {
    let streaming = Call {
        accepts_json: false,
        accepts_stream: true,
        ..call.clone()
    };
    finish(answered, &streaming).await.into_body()
}

/// The answer to a call whose server relays events before its response:
/// an event stream, from the first relayed event on.
pub fn streamed(body: super::relay::Streamed) -> Response<ProxyBody> {
    let mut response = Response::new(crate::body::stream(body));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // Its outcome is recorded after this head is sent: the log and the
    // request counters see it as the first answer it mostly is.
    response.extensions_mut().insert(Outcome::forwarded);
    response
}

/// HTTP 400 with the JSON-RPC error a request refused before it was
/// classified gets.
pub fn refused(refusal: Refusal) -> Response<ProxyBody> {
    let body = json!({
        "jsonrpc": "2.0",
        "id": refusal.id,
        "error": {"code": refusal.code, "message": refusal.message},
    });
    let mut response = Response::new(full(serde_json::to_vec(&body).unwrap_or_default()));
    *response.status_mut() = StatusCode::BAD_REQUEST;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response.extensions_mut().insert(Outcome::rejected);
    response
}

/// 202 Accepted, no body: a notification the gateway took.
pub fn accepted() -> Response<ProxyBody> {
    let mut response = Response::new(full(Bytes::new()));
    *response.status_mut() = StatusCode::ACCEPTED;
    response.extensions_mut().insert(Outcome::rejected);
    response
}

/// A JSON object's members, each as the text it was written as.
type Members = BTreeMap<String, Box<RawValue>>;

/// `value` as JSON text.
fn raw(value: &impl Serialize) -> Box<RawValue> {
    // Values and maps of text serialize.
    serde_json::value::to_raw_value(value).unwrap_or_default()
}

/// A result as the request's revision requires it: `resultType` under
/// the modern one.
fn complete(result: &mut Map<String, Value>, call: &Call) {
    if call.modern && !result.contains_key("resultType") {
        result.insert("resultType".into(), Value::from("complete"));
    }
}

/// Adds `entries` to the result's `_meta` (made an object if it was none).
fn add_meta<'a>(
    result: &mut Map<String, Value>,
    entries: impl IntoIterator<Item = (&'a str, Value)>,
) {
    let mut meta = match result.remove("_meta") {
        Some(Value::Object(meta)) => meta,
        _ => Map::new(),
    };
    for (key, value) in entries {
        meta.insert(key.to_string(), value);
    }
    result.insert("_meta".into(), Value::Object(meta));
}

/// `message` as the client takes it: an event stream, after the relayed
/// notifications, when it takes one and there are some to relay (or it
/// takes nothing else); JSON otherwise. The status is `parts`' own: 200
/// for a result, the upstream's for a refusal it answered (a 400 with
/// `-32602`).
fn render(
    mut parts: http::response::Parts,
    message: &impl Serialize,
    relayed: &[Bytes],
    call: &Call,
) -> Response<ProxyBody> {
    let text = serde_json::to_vec(message).unwrap_or_default();
    let streamed = call.accepts_stream && (!relayed.is_empty() || !call.accepts_json);
    let body = if streamed {
        let mut out = Vec::new();
        for data in relayed.iter().map(|d| d.as_ref()).chain([text.as_slice()]) {
            out.extend_from_slice(&sse::event(data));
        }
        parts
            .headers
            .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        parts
            .headers
            .insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        Bytes::from(out)
    } else {
        parts
            .headers
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        Bytes::from(text)
    };
    Response::from_parts(parts, full(body))
}

/// The gateway's own answer to `call`, for `error`: a tool result with
/// `isError: true` (the module doc says why), carrying what the error's
/// problem carries (its outcome for the log, its operation, `Retry-After`).
async fn problem(error: ProxyError, call: &Call) -> Response<ProxyBody> {
    let first = match &error {
        ProxyError::PossibleDuplicate {
            first_keyless: true,
            ..
        } => First::Keyless,
        _ => First::Keyed,
    };
    let response = error.into_response_as(Profile::Mcp.wire());
    let (parts, body) = response.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let problem: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let name = problem["type"]
        .as_str()
        .and_then(|t| t.strip_prefix("urn:idemgate:problem:"))
        .unwrap_or("internal");
    let detail = problem["detail"].as_str().unwrap_or_default();
    let operation = problem["operation_id"].as_str();
    let about = About {
        operation,
        state: problem["state"].as_str(),
        first,
    };
    let message = own_result(call, name, detail, &about);
    let mut parts = parts;
    // A tool result, whatever the problem's own status.
    parts.status = StatusCode::OK;
    render(parts, &message, &[], call)
}

/// What a problem is about: its operation, the operation's state, and,
/// for a `possible-duplicate`, how the first call was keyed.
struct About<'a> {
    operation: Option<&'a str>,
    state: Option<&'a str>,
    first: First,
}

/// How the first of two identical calls named its operation: what its
/// retry must send to find it again.
#[derive(Clone, Copy, PartialEq, Eq)]
enum First {
    /// With a key (`_meta`, the header or the key argument).
    Keyed,
    /// With none: its key was derived from the tool and arguments.
    Keyless,
}

/// The gateway's own tool result for problem `name` about `about`, under
/// `call`'s id.
fn own_result(call: &Call, name: &str, detail: &str, about: &About<'_>) -> Members {
    let text = guidance(name, detail, about);
    let mut result = Map::new();
    result.insert("content".into(), json!([{"type": "text", "text": text}]));
    result.insert("isError".into(), Value::Bool(true));
    let about = [
        (meta::PROBLEM, Some(name)),
        (meta::OPERATION_ID, about.operation),
        (meta::STATE, about.state),
    ];
    add_meta(
        &mut result,
        about
            .into_iter()
            .filter_map(|(key, value)| Some((key, Value::from(value?)))),
    );
    complete(&mut result, call);
    Members::from([
        ("jsonrpc".into(), raw(&"2.0")),
        ("id".into(), call.id_as_sent.clone()),
        ("result".into(), raw(&result)),
    ])
}

/// The held answer to `call` for an operation `unknown` by an upstream
/// status.
fn held(operation: Option<OperationId>, call: &Call) -> Response<ProxyBody> {
    let about = About {
        operation: operation.as_ref().map(|o| o.0.as_str()),
        state: Some("unknown"),
        first: First::Keyed,
    };
    let message = own_result(call, "outcome-unknown", "", &about);
    let mut response = Response::new(full(Bytes::new()));
    response.extensions_mut().insert(Outcome::unknown);
    if let Some(operation) = operation {
        response.extensions_mut().insert(operation);
    }
    let (parts, _) = response.into_parts();
    render(parts, &message, &[], call)
}

/// How a call settled `completed` without its own result was proved to
/// have run.
pub enum Proof<'a> {
    /// The route's reconcile probe found its effect: the probe's tool, and
    /// the `content` of the probe's result (its `structuredContent` is
    /// that tool's, never this one's, and is left out).
    Found { tool: &'a str, content: &'a [Value] },
    /// An operator resolved it `completed` without a `result`.
    Resolved {
        operator: &'a str,
        reference: Option<&'a str>,
    },
}

/// What the retries of `operation`, settled `completed` by `proof`
/// without its own tool's result, get: the gateway's own tool result
/// saying that the action already ran and succeeded, must not be called
/// again, and that its output was lost. `isError: true` with no
/// `structuredContent`: an SDK client refuses a result that is not an
/// error and lacks the structured content the tool's `outputSchema` asks
/// for, and the gateway cannot know that schema for sure: what it reads
/// of `tools/list` is kept in memory only, and this answer is stored once
/// for every later retry (docs/mcp.md, "Settled without its result").
pub fn settled(operation: &str, proof: &Proof<'_>) -> StoredResponse {
    let (how, by) = match proof {
        Proof::Found { tool, content } => (
            format!(
                "the gateway's check with the read-only tool `{tool}` found its effect at the server{}",
                if content.is_empty() {
                    String::new()
                } else {
                    format!("; what `{tool}` answered follows")
                }
            ),
            (meta::RECONCILED_BY, *tool),
        ),
        Proof::Resolved {
            operator,
            reference,
        } => (
            format!(
                "an operator ({operator}) confirmed it{}",
                reference.map_or(String::new(), |r| format!(" (reference: {r})"))
            ),
            (meta::RESOLVED_BY, *operator),
        ),
    };
    let text = format!(
        "This action already happened and succeeded (operation {operation}): {how}. Its own \
         result was lost, so it cannot be shown. Do not call it again, not with another \
         idempotency key nor with other wording: that would do it a second time."
    );
    let mut content = vec![json!({"type": "text", "text": text})];
    if let Proof::Found { content: found, .. } = proof {
        content.extend(found.iter().cloned());
    }
    let mut result = Map::new();
    result.insert("content".into(), Value::Array(content));
    result.insert("isError".into(), Value::Bool(true));
    add_meta(
        &mut result,
        [
            (meta::PROBLEM, Value::from(COMPLETED_WITHOUT_RESULT)),
            (meta::OPERATION_ID, Value::from(operation)),
            (meta::STATE, Value::from("completed")),
            (by.0, Value::from(by.1)),
        ],
    );
    stored(&raw(&result))
}

/// A tool `result` as stored, as written: the JSON-RPC response each
/// retry gets under its own id ([`finish`]).
pub fn stored(result: &RawValue) -> StoredResponse {
    #[derive(Serialize)]
    struct Stored<'a> {
        jsonrpc: &'static str,
        id: (),
        result: &'a RawValue,
    }
    let body = Stored {
        jsonrpc: "2.0",
        id: (),
        result,
    };
    StoredResponse {
        status: 200,
        headers: vec![("content-type".into(), b"application/json".to_vec())],
        body: serde_json::to_vec(&body).ok(),
    }
}

/// What a model should read for problem `name` about `about`: what
/// happened, and what it must not do about it. Only a refusal before
/// anything was sent says the call was not made.
fn guidance(name: &str, detail: &str, about: &About<'_>) -> String {
    let state = about.state;
    let held_as = about
        .operation
        .map_or(String::new(), |id| format!(" (operation {id})"));
    let unknown = format!(
        "This action may already have happened: the tool was called, but its result was lost. \
         Do not call it again, not with another idempotency key nor with other wording: \
         it is held for an operator to review{held_as}. Calling this same tool with the same \
         arguments again returns its result once it is settled."
    );
    match (name, state) {
        ("possible-duplicate", _) if about.first == First::Keyless => format!(
            "An identical call of this tool made without an idempotency key is still running or \
             held as possibly done{held_as}, so this call was not made: it is almost certainly the \
             same action. Do not call it again with yet another key; call it again with the same \
             arguments and no idempotency key to get its result once it is settled."
        ),
        ("possible-duplicate", _) => format!(
            "An identical call of this tool under another idempotency key is still running or held \
             as possibly done{held_as}, so this call was not made: it is almost certainly the same \
             action. Do not call it again with yet another key, nor without one; call it with that \
             first key to get its result once it is settled."
        ),
        ("outcome-unknown", _) | (_, Some("unknown")) => unknown,
        ("request-in-progress", _) => format!(
            "This same call is still running{held_as}. Do not call it with another key or other \
             wording; call it again unchanged shortly to get its result."
        ),
        ("key-reused", _) => format!(
            "This idempotency key was already used for a call of this tool with other arguments{held_as}, \
             so this call was not made. A new action needs a new key; a retry of the earlier one \
             needs its own arguments."
        ),
        // The generic detail asks for a header, which a model cannot set.
        ("missing-key", _) => "The gateway did not make this call: calls of this tool need an \
             idempotency key, a new one for each new action and the same one for its retries. \
             Give it in the tool's key argument if it has one, or in the call's `_meta` as \
             `dev.idemgate/idempotency-key`."
            .to_string(),
        ("response-not-stored", _) => format!(
            "This action happened{held_as}, but its result was too large for the gateway to keep, \
             so it cannot be shown again. Do not call it again."
        ),
        // Sent, and its outcome not recorded yet (the store), or the
        // gateway failed after the call was claimed: it may have run.
        (_, Some("in_progress")) | ("internal", _) => format!(
            "This call may have reached the tool{held_as}, and its outcome is not known yet ({detail}). \
             Do not call it with another key or other wording; call it again unchanged shortly."
        ),
        _ => format!("The gateway did not make this call: {detail}."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::error::OperationRef;
    use crate::pipeline::mcp::call::as_raw;
    use crate::pipeline::replay;
    use idemgate_model::operation::State;

    fn call(modern: bool) -> Call {
        Call {
            id: Value::from("req-9"),
            id_as_sent: as_raw(&Value::from("req-9")),
            tool: "create_task".into(),
            meta_key: None,
            modern,
            accepts_json: true,
            accepts_stream: true,
        }
    }

    /// The problem of a call held `unknown`.
    fn held() -> ProxyError {
        ProxyError::OutcomeUnknown {
            operation: OperationRef {
                id: "op-1".into(),
                state: State::Unknown,
            },
            since: crate::problem::UnknownSince::Earlier,
            detail: "held".into(),
        }
    }

    async fn json_of(response: Response<ProxyBody>) -> (StatusCode, Value) {
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&body).unwrap())
    }

    fn stored(body: &str) -> idemgate_model::operation::StoredResponse {
        idemgate_model::operation::StoredResponse {
            status: 200,
            headers: vec![("content-type".into(), b"application/json".to_vec())],
            body: Some(body.as_bytes().to_vec()),
        }
    }

    #[tokio::test]
    async fn a_replay_answers_under_the_new_id_with_the_marker() {
        let response = replay::respond(&stored(
            r#"{"jsonrpc":"2.0","id":1,"result":{"content":[],"isError":false}}"#,
        ));
        for modern in [false, true] {
            let replayed = replay::respond(&stored(
                r#"{"jsonrpc":"2.0","id":1,"result":{"content":[],"isError":false}}"#,
            ));
            let (status, message) = json_of(finish(Ok(replayed), &call(modern)).await).await;
            assert_eq!(status, 200);
            assert_eq!(message["id"], "req-9");
            assert_eq!(message["result"]["_meta"][meta::REPLAYED], true);
            let result_type = message["result"].get("resultType");
            assert_eq!(result_type.is_some(), modern, "{message}");
        }
        assert_eq!(response.headers()[replay::IDEMPOTENT_REPLAYED], "true");
    }

    /// A tool's numbers beyond what a double holds, and its members'
    /// order and spacing inside the result, are answered as the server
    /// wrote them: first time and replayed.
    #[tokio::test]
    async fn a_result_is_answered_as_the_server_wrote_it() {
        let content = r#"{"id": 123456789012345678901234567890, "price": 0.10000000000000000555, "z": 1, "a": 2}"#;
        let answer = format!(
            r#"{{"jsonrpc":"2.0","id":1,"result":{{"content":[],"structuredContent":{content},"isError":false}}}}"#
        );
        let first = {
            let mut response = Response::new(full(answer.clone()));
            response.extensions_mut().insert(Message);
            response
        };
        let replayed = replay::respond(&stored(&answer));
        for (response, modern) in [(first, false), (replayed, true)] {
            let response = finish(Ok(response), &call(modern)).await;
            let body = response.into_body().collect().await.unwrap().to_bytes();
            let text = String::from_utf8(body.to_vec()).unwrap();
            assert!(text.contains(content), "{text}");
            let message: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(message["id"], "req-9");
            assert_eq!(
                message["result"].get("resultType").is_some(),
                modern,
                "{text}"
            );
        }
    }

    /// A replay, and the gateway's own answer, carry the id as the
    /// request spelled it, not as the double it reads as.
    #[tokio::test]
    async fn an_answer_carries_the_id_as_the_request_spelled_it() {
        for id in ["12345678901234567890123", "-0", "1e2"] {
            let call = Call {
                id: serde_json::from_str(id).unwrap(),
                id_as_sent: RawValue::from_string(id.into()).unwrap(),
                ..call(false)
            };
            let replayed = replay::respond(&stored(
                r#"{"jsonrpc":"2.0","id":1,"result":{"content":[],"isError":false}}"#,
            ));
            for answered in [Ok(replayed), Err(held())] {
                let response = finish(answered, &call).await;
                let body = response.into_body().collect().await.unwrap().to_bytes();
                let text = String::from_utf8(body.to_vec()).unwrap();
                assert!(text.contains(&format!(r#""id":{id}"#)), "{text}");
            }
        }
    }

    #[tokio::test]
    async fn the_gateways_own_answers_are_tool_results() {
        let (status, message) = json_of(finish(Err(held()), &call(true)).await).await;
        assert_eq!(status, 200, "a tool result, not the problem's 409");
        let result = &message["result"];
        assert_eq!(result["isError"], true);
        assert_eq!(result["resultType"], "complete");
        assert_eq!(result["_meta"][meta::PROBLEM], "outcome-unknown");
        assert_eq!(result["_meta"][meta::OPERATION_ID], "op-1");
        assert_eq!(result["_meta"][meta::STATE], "unknown");
        let text = result["content"][0]["text"].as_str().unwrap();
        assert!(text.contains("may already have happened"), "{text}");
    }

    #[test]
    fn only_a_refusal_before_sending_says_the_call_was_not_made() {
        let not_made = "The gateway did not make this call";
        let says = |name, state| {
            let about = About {
                operation: Some("op-1"),
                state,
                first: First::Keyed,
            };
            guidance(name, "why", &about)
        };
        assert!(says("route-paused", None).starts_with(not_made));
        // A model cannot set a header: the key goes in the call.
        let keyless = says("missing-key", None);
        assert!(keyless.starts_with(not_made), "{keyless}");
        assert!(
            keyless.contains("dev.idemgate/idempotency-key"),
            "{keyless}"
        );
        assert!(!keyless.contains("header"), "{keyless}");
        assert!(says("upstream-unreachable", Some("not_attempted")).starts_with(not_made));
        // Sent, or maybe sent: never "not made".
        for (name, state) in [
            ("store-unavailable", Some("in_progress")),
            ("internal", None),
            ("response-not-stored", Some("completed")),
            ("outcome-unknown", Some("unknown")),
            ("lease-lost", Some("unknown")),
            ("possible-duplicate", Some("unknown")),
        ] {
            let text = says(name, state);
            assert!(!text.contains(not_made), "{name}: {text}");
            assert!(text.contains("op-1"), "{name}: {text}");
        }
    }

    #[tokio::test]
    async fn an_upstream_refusal_keeps_its_status() {
        let mut refused = Response::new(full(
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"bad"}}"#,
        ));
        *refused.status_mut() = StatusCode::BAD_REQUEST;
        refused.extensions_mut().insert(Outcome::released);
        let (status, message) = json_of(finish(Ok(refused), &call(false)).await).await;
        assert_eq!(status, 400);
        assert_eq!(message["id"], "req-9");
        assert_eq!(message["error"]["code"], -32602);
    }

    #[tokio::test]
    async fn a_client_that_takes_only_a_stream_gets_one() {
        let replayed = replay::respond(&stored(
            r#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#,
        ));
        let streaming = Call {
            accepts_json: false,
            ..call(false)
        };
        let response = finish(Ok(replayed), &streaming).await;
        assert_eq!(response.headers()[CONTENT_TYPE], "text/event-stream");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let events = sse::messages(&body);
        assert_eq!(events.len(), 1);
        let message: Value = serde_json::from_str(&events[0]).unwrap();
        assert_eq!(message["id"], "req-9");
    }
}
