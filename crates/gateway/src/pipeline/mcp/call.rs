//! What an MCP POST asks: a protected tool call, something to pass
//! through, or a request refused before anything is sent.
//!
//! Invariants: a body that is no JSON the gateway reads (serde_json's: no
//! byte order mark, no lone surrogate escape, no number past a double's
//! range) is refused as a parse error, since it may be a tool call that a
//! laxer parser, the server's, would run unprotected; only a single
//! JSON-RPC request (with an id) whose method is
//! `tools/call` for a protected tool is a [`Call`]; a body that names a
//! member the classification reads (`method`, `id`, `params.name`) twice
//! is refused, since the server may read the other one; a batch holding a
//! `tools/call` is refused, since its calls could not be told apart; the
//! request-metadata headers of 2026-07-28 (`Mcp-Method`, `Mcp-Name`) agree
//! with the body or the request is refused (`-32020`).

use base64::Engine;
use http::HeaderMap;
use http::header::ACCEPT;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::config::McpTools;
use crate::pipeline::mcp::tools::Learned;
use idemgate_model::canonical_json;

/// The revision that made the request-metadata headers required, and a
/// result's `resultType`: requests at it or later are "modern".
pub const MODERN: &str = "2026-07-28";

/// The `_meta` key a client may carry a call's idempotency key in.
pub const META_KEY: &str = "dev.idemgate/idempotency-key";

/// JSON-RPC's and MCP's error codes the gateway answers or reads.
pub mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const HEADER_MISMATCH: i64 = -32020;
    pub const MISSING_CAPABILITY: i64 = -32021;
    pub const UNSUPPORTED_VERSION: i64 = -32022;
    pub const URL_ELICITATION_REQUIRED: i64 = -32042;
}

/// A protected `tools/call`, as the rest of the write needs it.
#[derive(Debug, Clone)]
pub struct Call {
    /// The JSON-RPC id of this request, as a value to match answers and
    /// cancellations by ([`id_key`]).
    pub(crate) id: Value,
    /// The id as the request spelled it: every answer to it carries it so
    /// (`12345678901234567890123`, not the double it reads as).
    pub(crate) id_as_sent: Box<RawValue>,
    pub(crate) tool: String,
    /// The value of `params._meta["dev.idemgate/idempotency-key"]`, if
    /// any, as sent: `identity` reads it as the key, or refuses it.
    pub(crate) meta_key: Option<Value>,
    /// The request speaks [`MODERN`] or later (`MCP-Protocol-Version`).
    pub(crate) modern: bool,
    /// The client's `Accept` takes `application/json` (or anything).
    pub(crate) accepts_json: bool,
    /// The client's `Accept` takes `text/event-stream`.
    pub(crate) accepts_stream: bool,
}

/// `id` as JSON text.
pub(crate) fn as_raw(id: &Value) -> Box<RawValue> {
    // A value read from JSON serializes.
    serde_json::value::to_raw_value(id).unwrap_or_default()
}

/// A JSON-RPC id as one text per id: a number by its value (`7`, `7.0`
/// and `7e0` are one JSON number, and a server that reads ids as doubles
/// echoes any of them as `7`), a string as itself.
pub fn id_key(id: &Value) -> String {
    match id.as_f64() {
        // Below 1e38 an integral double is an i128 exactly.
        Some(number) if id.is_f64() && number.fract() == 0.0 && number.abs() < 1e38 => {
            (number as i128).to_string()
        }
        _ => id.to_string(),
    }
}

/// What a POST to an MCP route is.
#[derive(Debug)]
pub enum Classified {
    /// Not a protected call: sent on as it came; `listing` when it asks
    /// for the server's tools, whose answer says which are read-only.
    PassThrough { listing: bool },
    /// A protected tool call.
    Protected(Call),
    /// Refused, nothing sent: the JSON-RPC error to answer with HTTP 400.
    Refused(Refusal),
}

/// A request refused before it is classified: HTTP 400 with a JSON-RPC
/// error, as the Streamable HTTP transport answers input a server cannot
/// accept (and the 2026-07-28 revision a header mismatch).
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub(crate) id: Value,
    pub(crate) code: i64,
    pub(crate) message: String,
}

/// Sent on, not a listing.
const PASS: Classified = Classified::PassThrough { listing: false };

/// Classifies a POST's `body` with its `headers` for a route whose tools
/// are `tools`, with what the server at `endpoint` (below the route's
/// prefix) said in its `tools/list` (`learned`).
pub fn classify(
    headers: &HeaderMap,
    body: &[u8],
    tools: &McpTools,
    (learned, endpoint): (&Learned, &str),
) -> Classified {
    let message = match serde_json::from_slice::<Value>(body) {
        Ok(message) => message,
        // JSON-RPC 2.0 §5.1: no id could be read, so it is null.
        Err(error) => {
            return Classified::Refused(Refusal {
                id: Value::Null,
                code: code::PARSE_ERROR,
                message: format!("Parse error: {error}"),
            });
        }
    };
    let object = match &message {
        Value::Object(object) => object,
        Value::Array(batch) => {
            let calls = batch
                .iter()
                .any(|m| m.get("method").and_then(Value::as_str) == Some("tools/call"));
            if calls {
                return Classified::Refused(Refusal {
                    id: Value::Null,
                    code: code::INVALID_REQUEST,
                    message:
                        "a tool call is protected one per request: send it alone, not in a batch"
                            .into(),
                });
            }
            return PASS;
        }
        _ => return PASS,
    };
    let id = object.get("id").cloned().unwrap_or(Value::Null);
    let Some(method) = object.get("method").and_then(Value::as_str) else {
        return PASS;
    };
    if let Err(refusal) = headers_agree(headers, object, method) {
        return Classified::Refused(Refusal { id, ..refusal });
    }
    if method != "tools/call" {
        let listing = method == "tools/list" && object.contains_key("id");
        return Classified::PassThrough { listing };
    }
    // A call the gateway cannot protect is never sent on: a lenient server
    // would run it, unprotected, as often as it came.
    // An integer is written as one: the Python SDK's server reads `1.5`,
    // and `7.0` or `7e0` too, as no id at all, a notification it never
    // answers, which would be held `unknown` though nothing ran.
    let written_as_integer = canonical_json::raw_at(body, "/id")
        .is_some_and(|raw| !raw.iter().any(|b| matches!(b, b'.' | b'e' | b'E')));
    let request_id = id.is_string() || (id.is_number() && written_as_integer);
    if !request_id {
        return Classified::Refused(Refusal {
            id: Value::Null,
            code: code::INVALID_REQUEST,
            message: "a tools/call is a request: its `id` is a string or an integer written as \
                      one (never null, a fraction, `7.0` or `7e0`, nor absent as in a \
                      notification)"
                .into(),
        });
    }
    let name = object
        .get("params")
        .and_then(|p| p.get("name"))
        .and_then(Value::as_str);
    let Some(tool) = name else {
        return Classified::Refused(Refusal {
            id,
            code: code::INVALID_PARAMS,
            message: "a tools/call names its tool in `params.name`, a string".into(),
        });
    };
    let arguments = object
        .get("params")
        .is_some_and(|p| p.get("arguments").is_some());
    let read = ["/method", "/id", "/params/name", "/params/arguments"];
    for member in &read[..if arguments { 4 } else { 3 }] {
        if canonical_json::raw_at(body, member).is_none() {
            return Classified::Refused(Refusal {
                id,
                code: code::INVALID_REQUEST,
                message: format!("the request names `{member}` twice"),
            });
        }
    }
    let read_only = tools.read_only.iter().any(|t| t == tool) || learned.read_only(endpoint, tool);
    let protected = tools.protected.iter().any(|t| t == tool) || !read_only;
    if !protected {
        return PASS;
    }
    let modern = protocol_version(headers).is_some_and(|v| v >= MODERN);
    if modern && let Err(refusal) = modern_headers_present(headers) {
        return Classified::Refused(Refusal { id, ..refusal });
    }
    let meta_key = object
        .get("params")
        .and_then(|p| p.get("_meta"))
        .and_then(|m| m.get(META_KEY))
        .cloned();
    let (accepts_json, accepts_stream) = accepts(headers);
    // Read above: `/id` names one value, of a JSON text.
    let as_sent = canonical_json::raw_at(body, "/id").and_then(|id| std::str::from_utf8(id).ok());
    let id_as_sent = as_sent.and_then(|id| RawValue::from_string(id.to_string()).ok());
    Classified::Protected(Call {
        id_as_sent: id_as_sent.unwrap_or_else(|| as_raw(&id)),
        id,
        tool: tool.to_string(),
        meta_key,
        modern,
        accepts_json,
        accepts_stream,
    })
}

/// The request's `MCP-Protocol-Version`, if it sends one.
fn protocol_version(headers: &HeaderMap) -> Option<&str> {
    headers.get("mcp-protocol-version")?.to_str().ok()
}

/// What the client's `Accept` takes: JSON, an event stream. No `Accept`
/// (or `*/*`) takes both.
fn accepts(headers: &HeaderMap) -> (bool, bool) {
    let mut any = headers.get_all(ACCEPT).iter().peekable();
    if any.peek().is_none() {
        return (true, true);
    }
    let (mut json, mut stream) = (false, false);
    for value in any {
        for range in value.to_str().unwrap_or_default().split(',') {
            let media = range.split(';').next().unwrap_or_default().trim();
            let media = media.to_ascii_lowercase();
            json |= matches!(media.as_str(), "application/json" | "application/*" | "*/*");
            stream |= matches!(media.as_str(), "text/event-stream" | "text/*" | "*/*");
        }
    }
    (json, stream)
}

/// `Mcp-Method` and `Mcp-Name`, when sent, name what the body does
/// (2026-07-28, "Server Validation"): the method, and the tool, prompt,
/// resource or task.
fn headers_agree(
    headers: &HeaderMap,
    object: &serde_json::Map<String, Value>,
    method: &str,
) -> Result<(), Refusal> {
    if let Some(sent) = headers.get("mcp-method") {
        let sent = header_text(sent)?;
        if sent != method {
            return Err(mismatch("Mcp-Method", &sent, method));
        }
    }
    if let Some(sent) = headers.get("mcp-name") {
        let field = match method {
            "tools/call" | "prompts/get" => "name",
            "resources/read" => "uri",
            "tasks/get" | "tasks/update" | "tasks/cancel" => "taskId",
            _ => return Ok(()),
        };
        let named = object
            .get("params")
            .and_then(|p| p.get(field))
            .and_then(Value::as_str)
            .unwrap_or_default();
        let sent = header_text(sent)?;
        if sent != named {
            return Err(mismatch("Mcp-Name", &sent, named));
        }
    }
    Ok(())
}

/// A modern request names its method and tool in headers: the gateway,
/// which may answer it itself, refuses one without them as the server
/// would.
fn modern_headers_present(headers: &HeaderMap) -> Result<(), Refusal> {
    for name in ["Mcp-Method", "Mcp-Name"] {
        if !headers.contains_key(name) {
            return Err(Refusal {
                id: Value::Null,
                code: code::HEADER_MISMATCH,
                message: format!("Header mismatch: the required {name} header is missing"),
            });
        }
    }
    Ok(())
}

/// A request-metadata header's value, `=?base64?…?=` decoded.
fn header_text(value: &http::HeaderValue) -> Result<String, Refusal> {
    let invalid = || Refusal {
        id: Value::Null,
        code: code::HEADER_MISMATCH,
        message: "Header mismatch: a request-metadata header is not valid text".into(),
    };
    let text = value.to_str().map_err(|_| invalid())?;
    match text
        .strip_prefix("=?base64?")
        .and_then(|t| t.strip_suffix("?="))
    {
        Some(encoded) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .map_err(|_| invalid())?;
            String::from_utf8(bytes).map_err(|_| invalid())
        }
        None => Ok(text.to_string()),
    }
}

fn mismatch(header: &str, sent: &str, body: &str) -> Refusal {
    Refusal {
        id: Value::Null,
        code: code::HEADER_MISMATCH,
        message: format!(
            "Header mismatch: {header} header value '{sent}' does not match body value '{body}'"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn tools() -> McpTools {
        McpTools {
            read_only: vec!["list_tasks".into()],
            protected: vec!["search".into()],
            ..McpTools::default()
        }
    }

    fn classify_as(headers: &[(&'static str, &str)], body: &str) -> Classified {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(*name, HeaderValue::from_str(value).unwrap());
        }
        let learned = Learned::default();
        learned.note_list(
            "",
            br#"{"jsonrpc":"2.0","id":1,"result":{"tools":[
            {"name":"search","annotations":{"readOnlyHint":true}},
            {"name":"lookup","annotations":{"readOnlyHint":true}}]}}"#,
        );
        classify(&map, body.as_bytes(), &tools(), (&learned, ""))
    }

    fn call_of(tool: &str) -> String {
        format!(
            r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"{tool}","arguments":{{}}}}}}"#
        )
    }

    /// Answers carried the id re-typed (`1.2345678901234568e+22`,
    /// `-0.0`, `100.0`): a client matching ids exactly never matched.
    #[test]
    fn a_calls_id_is_kept_as_the_request_spelled_it() {
        for id in ["12345678901234567890123", "-0", r#""req-\u0041""#] {
            let body = call_of("create_task").replace(r#""id":7"#, &format!(r#""id": {id}"#));
            let Classified::Protected(protected) = classify_as(&[], &body) else {
                panic!("{id}: a tool call is protected");
            };
            assert_eq!(protected.id_as_sent.get(), id);
        }
        // A fraction, or an integer not written as one, is refused: never
        // sent to be read as a notification and left unanswered.
        for id in ["1.5", "0.5", "-7.25", "7e-1", "7.0", "1e2", "70E-1"] {
            let body = call_of("create_task").replace(r#""id":7"#, &format!(r#""id": {id}"#));
            let Classified::Refused(refusal) = classify_as(&[], &body) else {
                panic!("{id}: refused");
            };
            assert_eq!(refusal.code, code::INVALID_REQUEST, "{id}");
        }
    }

    #[test]
    fn only_a_protected_tools_call_is_a_call() {
        let Classified::Protected(protected) = classify_as(&[], &call_of("create_task")) else {
            panic!("a tool call is protected");
        };
        assert_eq!(
            (protected.id, protected.tool.as_str()),
            (Value::from(7), "create_task")
        );
        // Read-only by the route, or by the server's annotation.
        assert!(matches!(
            classify_as(&[], &call_of("list_tasks")),
            Classified::PassThrough { .. }
        ));
        assert!(matches!(
            classify_as(&[], &call_of("lookup")),
            Classified::PassThrough { .. }
        ));
        // `protected_tools` overrides an annotation, which is untrusted.
        assert!(matches!(
            classify_as(&[], &call_of("search")),
            Classified::Protected(_)
        ));
        for other in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#,
        ] {
            assert!(
                matches!(classify_as(&[], other), Classified::PassThrough { .. }),
                "{other}"
            );
        }
    }

    /// A tools/call the gateway cannot protect (no id a response could
    /// answer, no tool named) is refused, never sent on for a lenient
    /// server to run unprotected.
    #[test]
    fn a_call_that_cannot_be_protected_is_refused() {
        for (call, code) in [
            (
                r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"create_task"}}"#,
                code::INVALID_REQUEST,
            ),
            (
                r#"{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"create_task"}}"#,
                code::INVALID_REQUEST,
            ),
            (
                r#"{"jsonrpc":"2.0","id":true,"method":"tools/call","params":{"name":"create_task"}}"#,
                code::INVALID_REQUEST,
            ),
            (
                r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":["create_task"]}}"#,
                code::INVALID_PARAMS,
            ),
            (
                r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{}}"#,
                code::INVALID_PARAMS,
            ),
        ] {
            let Classified::Refused(refusal) = classify_as(&[], call) else {
                panic!("{call} was not refused");
            };
            assert_eq!(refusal.code, code, "{call}");
        }
    }

    #[test]
    fn what_could_be_read_two_ways_is_refused() {
        let batch = format!("[{}]", call_of("create_task"));
        let Classified::Refused(refusal) = classify_as(&[], &batch) else {
            panic!("a batch with a call");
        };
        assert_eq!(refusal.code, code::INVALID_REQUEST);
        let twice = r#"{"jsonrpc":"2.0","id":7,"method":"ping","method":"tools/call","params":{"name":"create_task"}}"#;
        assert!(matches!(classify_as(&[], twice), Classified::Refused(_)));
        let arguments_twice = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"create_task","arguments":{"a":1},"arguments":{"a":2}}}"#;
        assert!(matches!(
            classify_as(&[], arguments_twice),
            Classified::Refused(_)
        ));
    }

    #[test]
    fn a_number_is_one_id_however_it_is_written() {
        let key = |text: &str| id_key(&serde_json::from_str(text).unwrap());
        for same in ["7.0", "7e0", "0.7e1", "70e-1"] {
            assert_eq!(key(same), key("7"), "{same}");
        }
        assert_eq!(key("-0"), key("0"));
        assert_eq!(key("1e2"), key("100"));
        assert_eq!(key("18446744073709551615.0"), key("18446744073709551616"));
        assert_ne!(key("7.5"), key("7"));
        assert_ne!(key(r#""7""#), key("7"));
        assert_ne!(key("1e300"), key("1"));
    }

    #[test]
    fn a_body_that_is_no_json_is_a_parse_error() {
        let bom = format!("\u{feff}{}", call_of("create_task"));
        let surrogate = call_of("create_task").replace("{}", r#"{"t":"\ud83d"}"#);
        let huge = call_of("create_task").replace("{}", r#"{"n":1e400}"#);
        for body in ["not json", "", &bom, &surrogate, &huge] {
            let Classified::Refused(refusal) = classify_as(&[], body) else {
                panic!("{body}");
            };
            assert_eq!((refusal.code, refusal.id), (code::PARSE_ERROR, Value::Null));
        }
    }

    #[test]
    fn request_metadata_headers_must_agree_with_the_body() {
        let body = call_of("create_task");
        let refused = |headers: &[(&'static str, &str)]| match classify_as(headers, &body) {
            Classified::Refused(r) => Some(r),
            _ => None,
        };
        let mismatch =
            refused(&[("mcp-method", "tools/call"), ("mcp-name", "delete_all")]).unwrap();
        assert_eq!(
            (mismatch.code, mismatch.id),
            (code::HEADER_MISMATCH, Value::from(7))
        );
        assert!(refused(&[("mcp-method", "tools/list")]).is_some());
        assert!(refused(&[("mcp-method", "tools/call"), ("mcp-name", "create_task")]).is_none());
        // Base64-encoded values are compared decoded.
        let encoded = "=?base64?Y3JlYXRlX3Rhc2s=?=";
        assert!(refused(&[("mcp-method", "tools/call"), ("mcp-name", encoded)]).is_none());
        // A modern request without them is refused; an older one is not.
        let modern = [("mcp-protocol-version", MODERN)];
        assert_eq!(refused(&modern).unwrap().code, code::HEADER_MISMATCH);
        assert!(refused(&[("mcp-protocol-version", "2025-11-25")]).is_none());
    }

    #[test]
    fn accept_decides_what_an_answer_may_be() {
        let call_with =
            |accept: &str| match classify_as(&[("accept", accept)], &call_of("create_task")) {
                Classified::Protected(call) => (call.accepts_json, call.accepts_stream),
                other => panic!("{other:?}"),
            };
        assert_eq!(
            call_with("application/json, text/event-stream"),
            (true, true)
        );
        assert_eq!(call_with("text/event-stream"), (false, true));
        assert_eq!(call_with("*/*"), (true, true));
    }
}
