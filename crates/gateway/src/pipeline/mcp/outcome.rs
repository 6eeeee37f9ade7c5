//! How an MCP server's answer to a protected call settles it: the
//! exchange the pipeline classified by HTTP status, read again as
//! JSON-RPC (docs/mcp.md, "Outcomes").
//!
//! Invariants:
//! - a call is `completed` only by the JSON-RPC response for its own id
//!   (a number by its value: `7` answers `7.0`) carrying a `result` — a
//!   tool result with `isError: true` too, since the tool ran — and what
//!   is stored is that response alone, without the notifications that
//!   came before it (they are relayed, never stored);
//! - it is released (`not_attempted`) only by an answer that says it never
//!   ran: a JSON-RPC error of the protocol's own refusals (parse, invalid
//!   request, unknown method, invalid params, header mismatch, missing
//!   capability, unsupported version, URL elicitation required) when the
//!   server sent no message for the call before it (an event that carries
//!   none, such as a priming event, is nothing; one that does counts
//!   whether or not it reads as JSON), an HTTP 4xx, or an
//!   `input_required` result (a multi-round-trip call's interim answer,
//!   not its outcome: its continuation is the same call, sent again);
//! - anything else after the call was sent — another JSON-RPC error, a
//!   5xx, a stream that ends without the response, an answer in a content
//!   coding (the call asks for none) — is `unknown`.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use serde_json::Value;

use crate::pipeline::forward::{Exchange, LostCause, content_coding};
use crate::pipeline::mcp::call::{code, id_key};
use crate::pipeline::sse;

/// The 2025-11-25 revision's session header.
const SESSION: &str = "mcp-session-id";

/// The notifications an upstream sent before its response, kept with the
/// first answer's head (never stored) for the client that asked.
#[derive(Debug, Clone, Default)]
pub struct Relayed(pub Vec<Bytes>);

/// Marks an answer whose body is one JSON-RPC response the gateway read:
/// `answer.rs` writes it under the answered request's id.
#[derive(Debug, Clone, Copy)]
pub struct Message;

/// `exchange`, the upstream's answer to the call with JSON-RPC id `id`,
/// settled as the module doc says; `spoke` when the server already sent
/// a message for the call (relayed as it came).
pub fn settle(exchange: Exchange, id: &Value, spoke: bool) -> Exchange {
    let (mut head, body) = match exchange {
        Exchange::Complete { head, body } => (head, body),
        // A 429 or 503: its waiters may be of other sessions.
        Exchange::Released { mut head, body } => {
            head.headers.remove(SESSION);
            return Exchange::Released { head, body };
        }
        other => return other,
    };
    let status = head.status.as_u16();
    match status {
        200..=299 => {}
        500..=599 => {
            return failed(format!("the MCP server answered HTTP {status}"));
        }
        // 1xx never reach here; 3xx and 4xx: the call was not taken. Its
        // waiters may be of other sessions: the session is not theirs.
        _ => {
            head.headers.remove(SESSION);
            return Exchange::Released { head, body };
        }
    }
    if let Some(coding) = content_coding(&head.headers) {
        // Asked for none (`forward::ask_for_identity`): its answer cannot
        // be read, and the call was made.
        return failed(format!(
            "the MCP server answered in the content coding `{coding}`, which the gateway does not decode"
        ));
    }
    let streamed = head
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.trim_start().starts_with("text/event-stream"));
    let messages: Vec<Bytes> = if streamed {
        sse::messages(&body).into_iter().map(Bytes::from).collect()
    } else {
        vec![body]
    };
    let mut relayed = Vec::new();
    let mut response = None;
    for text in messages {
        match serde_json::from_slice::<Value>(&text) {
            Ok(message) if answers(&message, id) => {
                response = Some((message, text));
                break;
            }
            // Any other message for the call, read or not: the server
            // spoke, as the relay counts it.
            _ => relayed.push(text),
        }
    }
    let Some((message, text)) = response else {
        return Exchange::Lost {
            cause: LostCause::Broken,
            reason: format!("the MCP server's answer ended without the response to request {id}"),
        };
    };
    // The response alone, as JSON: not the upstream's session, date or
    // framing, which a replay to another session must not carry.
    head.headers.clear();
    head.headers
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    head.extensions.insert(Message);
    let spoke = spoke || !relayed.is_empty();
    head.extensions.insert(Relayed(relayed));
    if let Some(error) = message.get("error") {
        let code = error.get("code").and_then(Value::as_i64).unwrap_or(0);
        // A server that sent a message for the call before its error had
        // begun on it: its refusal code no longer says it never ran.
        if never_ran(code) && !spoke {
            return Exchange::Released { head, body: text };
        }
        let said = error.get("message").and_then(Value::as_str).unwrap_or("");
        return failed(format!(
            "the MCP server answered JSON-RPC error {code}: {said}"
        ));
    }
    if message.pointer("/result/resultType") == Some(&Value::from("input_required")) {
        return Exchange::Released { head, body: text };
    }
    Exchange::Complete { head, body: text }
}

/// Whether `message` is the JSON-RPC response to the request with id `id`
/// (the same id by value: [`id_key`]).
pub fn answers(message: &Value, id: &Value) -> bool {
    (message.get("result").is_some() || message.get("error").is_some())
        && message
            .get("id")
            .is_some_and(|answered| id_key(answered) == id_key(id))
}

/// A JSON-RPC error that says the request was refused before any tool ran
/// (2025-11-25's "URL elicitation required" too: the tool waits for the
/// user's authorisation before it acts, and its retry is the way on).
fn never_ran(code: i64) -> bool {
    matches!(
        code,
        code::PARSE_ERROR
            | code::INVALID_REQUEST
            | code::METHOD_NOT_FOUND
            | code::INVALID_PARAMS
            | code::HEADER_MISMATCH
            | code::MISSING_CAPABILITY
            | code::UNSUPPORTED_VERSION
            | code::URL_ELICITATION_REQUIRED
    )
}

fn failed(reason: String) -> Exchange {
    Exchange::Lost {
        cause: LostCause::Failed,
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Response;

    fn answer(status: u16, content_type: &str, body: &str) -> Exchange {
        let response = Response::builder()
            .status(status)
            .header(CONTENT_TYPE, content_type)
            .header(SESSION, "s-1")
            .body(())
            .unwrap();
        let (head, ()) = response.into_parts();
        Exchange::Complete {
            head,
            body: Bytes::from(body.to_string()),
        }
    }

    fn settled(status: u16, content_type: &str, body: &str) -> Exchange {
        settle(answer(status, content_type, body), &Value::from(7), false)
    }

    const RESULT: &str = r#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"ok"}],"isError":false}}"#;

    #[test]
    fn a_result_for_the_call_completes_it_as_json() {
        let Exchange::Complete { head, body } = settled(200, "application/json", RESULT) else {
            panic!("completed");
        };
        assert_eq!(body, RESULT);
        assert_eq!(head.headers.len(), 1);
        assert_eq!(head.headers[CONTENT_TYPE], "application/json");
        assert!(head.extensions.get::<Message>().is_some());
    }

    #[test]
    fn a_stream_is_read_for_the_response_its_notifications_relayed() {
        let progress = r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}"#;
        let other = r#"{"jsonrpc":"2.0","id":8,"result":{}}"#;
        let stream =
            format!("event: message\ndata: {progress}\n\ndata: {other}\n\ndata: {RESULT}\n\n");
        let Exchange::Complete { head, body } = settled(200, "text/event-stream", &stream) else {
            panic!("completed");
        };
        assert_eq!(body, RESULT);
        let relayed = head.extensions.get::<Relayed>().unwrap();
        assert_eq!(relayed.0, vec![Bytes::from(progress), Bytes::from(other)]);
        // Cut before the response: unknown.
        let cut = format!("data: {progress}\n\n");
        assert!(matches!(
            settled(200, "text/event-stream", &cut),
            Exchange::Lost {
                cause: LostCause::Broken,
                ..
            }
        ));
    }

    #[test]
    fn an_answer_in_a_content_coding_is_held() {
        // A server that compresses though asked for `identity`: the call
        // was made, and what it answered cannot be read.
        let Exchange::Complete { mut head, body } = answer(200, "application/json", RESULT) else {
            panic!("an answer");
        };
        head.headers
            .insert("content-encoding", HeaderValue::from_static("gzip"));
        let coded = Exchange::Complete { head, body };
        let Exchange::Lost { cause, reason } = settle(coded, &Value::from(7), false) else {
            panic!("held");
        };
        assert_eq!(cause, LostCause::Failed);
        assert!(reason.contains("`gzip`"), "{reason}");
    }

    #[test]
    fn a_refusal_keeps_no_session_for_the_waiters_of_others() {
        let (head, ()) = Response::builder()
            .status(429)
            .header(SESSION, "s-1")
            .header("retry-after", "1")
            .body(())
            .unwrap()
            .into_parts();
        let released = Exchange::Released {
            head,
            body: Bytes::new(),
        };
        let Exchange::Released { head, .. } = settle(released, &Value::from(7), false) else {
            panic!("still released");
        };
        assert!(head.headers.get(SESSION).is_none());
        assert_eq!(head.headers["retry-after"], "1");
    }

    #[test]
    fn a_tool_error_result_is_an_outcome() {
        let tool_failed = r#"{"jsonrpc":"2.0","id":7,"result":{"content":[],"isError":true}}"#;
        assert!(matches!(
            settled(200, "application/json", tool_failed),
            Exchange::Complete { .. }
        ));
    }

    #[test]
    fn only_refusals_release_the_call() {
        for refused in [
            -32700, -32600, -32601, -32602, -32020, -32021, -32022, -32042,
        ] {
            let error = format!(
                r#"{{"jsonrpc":"2.0","id":7,"error":{{"code":{refused},"message":"no"}}}}"#
            );
            assert!(
                matches!(
                    settled(200, "application/json", &error),
                    Exchange::Released { .. }
                ),
                "{refused}"
            );
            assert!(matches!(
                settled(400, "application/json", &error),
                Exchange::Released { .. }
            ));
        }
        // Once the server spoke for the call, a refusal code is no proof.
        let late_refusal = r#"{"jsonrpc":"2.0","id":7,"error":{"code":-32602,"message":"no"}}"#;
        let spoken = settle(
            answer(200, "application/json", late_refusal),
            &Value::from(7),
            true,
        );
        assert!(matches!(
            spoken,
            Exchange::Lost {
                cause: LostCause::Failed,
                ..
            }
        ));
        // A priming event carries no message; anything else is the server
        // speaking, read or not.
        let primed = format!("id: ev-0\ndata: \n\nid: ev-1\ndata: {late_refusal}\n\n");
        assert!(matches!(
            settled(200, "text/event-stream", &primed),
            Exchange::Released { .. }
        ));
        let unread = format!("data: {{\"jsonrpc\n\ndata: {late_refusal}\n\n");
        assert!(matches!(
            settled(200, "text/event-stream", &unread),
            Exchange::Lost {
                cause: LostCause::Failed,
                ..
            }
        ));
        let interim = r#"{"jsonrpc":"2.0","id":7,"result":{"resultType":"input_required","requestState":"s"}}"#;
        assert!(matches!(
            settled(200, "application/json", interim),
            Exchange::Released { .. }
        ));
        for unknown in [
            r#"{"jsonrpc":"2.0","id":7,"error":{"code":-32603,"message":"boom"}}"#,
            r#"{"jsonrpc":"2.0","id":7,"error":{"code":-32000,"message":"server"}}"#,
        ] {
            assert!(matches!(
                settled(200, "application/json", unknown),
                Exchange::Lost {
                    cause: LostCause::Failed,
                    ..
                }
            ));
        }
        assert!(matches!(
            settled(500, "application/json", RESULT),
            Exchange::Lost {
                cause: LostCause::Failed,
                ..
            }
        ));
        // The same number written otherwise is the same id.
        let as_float = RESULT.replace(r#""id":7"#, r#""id":7.0"#);
        assert!(matches!(
            settled(200, "application/json", &as_float),
            Exchange::Complete { .. }
        ));
        // Another id's response is not this call's.
        let elsewhere = r#"{"jsonrpc":"2.0","id":8,"result":{}}"#;
        assert!(matches!(
            settled(200, "application/json", elsewhere),
            Exchange::Lost { .. }
        ));
    }
}
