//! An HTTP route's probe questions: a GET to the route's own upstream,
//! its URL filled from the held operation ([`url`]): its keys (the
//! client's, the destination key) and fields of its stored body.
//!
//! Invariant: [`url`] is the one place a probe URL is built. It names the
//! operation's own resource and nothing else: the configured template has
//! its placeholders only in its path or query and no fragment (checked at
//! load, see `config`); each placeholder becomes one URL component, every
//! byte but `A–Z a–z 0–9 - _ ~` percent-encoded, so no value can add a
//! segment, a query parameter or a fragment. A value that is a dot-segment
//! (`.`, `..`) is never put in a path at all: encoded as `%2E` it is still
//! resolved to the collection by any upstream (or proxy in front of it)
//! that normalizes per RFC 3986 §6.2.2 before resolving, and a probe that
//! may ask about the wrong resource is worse than none.

use bytes::BytesMut;
use http::header::{ACCEPT, HeaderValue};
use http::{HeaderMap, Request};
use http_body_util::BodyExt;
use serde_json::Value;

use super::send;
use super::verdict::{Answer, Got};
use crate::body::full;
use crate::config::{Piece, ProbeKeys, Route, url_pieces};
use crate::pipeline::forward::{self, ProbeClient, strip_hop_by_hop};
use crate::pipeline::key::url_component;
use crate::pipeline::record::stored_response;
use crate::traces;
use idemgate_model::canonical_json;

/// A probe URL, filled.
#[derive(Debug, PartialEq, Eq)]
pub struct Filled {
    /// What is sent.
    pub(crate) sent: String,
    /// What the timeline shows: `{body:…}` placeholders left as written,
    /// since the body's fields may be sealed in the store.
    pub(crate) shown: String,
}

/// `template` filled with `keys` and the fields of the stored request
/// `body` (JSON), each as written: a string's text, a number's or a
/// boolean's own spelling (an id past 2^64 is asked about as sent, never
/// as the double it would read as); `Err` says why no URL can name the
/// operation's resource.
pub fn url(template: &str, keys: ProbeKeys<'_>, body: Option<&[u8]>) -> Result<Filled, String> {
    let pieces = url_pieces(template)?;
    let room = template.len() + keys.key.len().max(keys.destination_key.len());
    let mut filled = Filled {
        sent: String::with_capacity(room),
        shown: String::with_capacity(room),
    };
    let mut in_path = true;
    for piece in pieces {
        let (value, shown) = match piece {
            Piece::Text(text) => {
                in_path &= !text.contains('?');
                filled.sent.push_str(text);
                filled.shown.push_str(text);
                continue;
            }
            Piece::Key => (keys.key.to_string(), None),
            Piece::DestinationKey => (keys.destination_key.to_string(), None),
            Piece::Body(pointer) => {
                let written = body
                    .and_then(|body| canonical_json::raw_at(body, pointer))
                    .ok_or(format!("the stored request body has no value at {pointer}"))?;
                let text = match serde_json::from_slice::<Value>(written) {
                    Ok(Value::String(text)) => text,
                    Ok(Value::Number(_) | Value::Bool(_)) => {
                        String::from_utf8_lossy(written).into_owned()
                    }
                    _ => {
                        return Err(format!(
                            "the stored request body's {pointer} is not a string, a number or a boolean"
                        ));
                    }
                };
                (text, Some(format!("{{body:{pointer}}}")))
            }
        };
        if in_path && matches!(value.as_str(), "." | "..") {
            return Err("a dot-segment: no probe URL can name its resource".into());
        }
        let encoded = url_component(&value);
        filled.shown.push_str(shown.as_deref().unwrap_or(&encoded));
        filled.sent.push_str(&encoded);
    }
    Ok(filled)
}

/// Asks `url` with a GET, with `credentials`: the answer, whole (bounded
/// by the route's `max_stored_response`), or why there is none.
pub async fn get(
    client: &ProbeClient,
    route: &Route,
    url: &Filled,
    credentials: &HeaderMap,
) -> Answer {
    let answer = |status, got| Answer {
        asked: url.shown.clone(),
        status,
        got,
    };
    let mut request = Request::get(&url.sent).body(full(""));
    if let Ok(request) = &mut request {
        *request.headers_mut() = credentials.clone();
        request
            .headers_mut()
            .insert(ACCEPT, HeaderValue::from_static("application/json"));
        forward::ask_for_identity(request.headers_mut());
        traces::inject(request.headers_mut());
    }
    let response = match send(client, request).await {
        Ok(response) => response,
        Err(error) => return answer(None, Err(error)),
    };
    let (mut head, mut body) = response.into_parts();
    strip_hop_by_hop(&mut head.headers);
    let status = Some(head.status.as_u16());
    let mut buffer = BytesMut::new();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Ok(data) = frame.into_data() {
                    buffer.extend_from_slice(&data);
                }
                if buffer.len() > route.max_stored_response {
                    return answer(status, Err("probe response too large to store".into()));
                }
            }
            Err(e) => return answer(status, Err(format!("probe response cut: {e}"))),
        }
    }
    let json = serde_json::from_slice(&buffer).ok();
    let response = stored_response(&head, Some(buffer.to_vec()));
    answer(status, Ok(Got { json, response }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Keys `key` and `op-1`.
    fn keys(key: &str) -> ProbeKeys<'_> {
        ProbeKeys {
            key,
            destination_key: "op-1",
        }
    }

    fn sent(template: &str, key: &str) -> Option<String> {
        url(template, keys(key), None)
            .ok()
            .map(|filled| filled.sent)
    }

    #[test]
    fn keys_are_url_component_encoded() {
        assert_eq!(
            sent(
                "http://api/v1/orders?idempotency_key={key}",
                "a/b?c=d&e f#~x"
            )
            .as_deref(),
            Some("http://api/v1/orders?idempotency_key=a%2Fb%3Fc%3Dd%26e%20f%23~x")
        );
    }

    #[test]
    fn each_key_goes_where_its_placeholder_is() {
        let filled = url(
            "http://api/v1/orders/{destination_key}?client={key}",
            keys("a b"),
            None,
        )
        .unwrap();
        assert_eq!(filled.sent, "http://api/v1/orders/op-1?client=a%20b");
        assert_eq!(filled.shown, filled.sent, "neither key is sealed");
    }

    #[test]
    fn dot_keys_are_never_dot_segments() {
        // In the path, no encoding is safe from an upstream that normalizes
        // `%2E` before resolving: no probe.
        let in_path = "http://api/v1/tasks/{key}?again={key}";
        assert_eq!(sent(in_path, ".."), None);
        assert_eq!(sent(in_path, "."), None);
        assert_eq!(
            sent(in_path, "a.b").as_deref(),
            Some("http://api/v1/tasks/a%2Eb?again=a%2Eb")
        );
        assert_eq!(
            sent(in_path, "...").as_deref(),
            Some("http://api/v1/tasks/%2E%2E%2E?again=%2E%2E%2E")
        );
        // In the query a dot key is only a value.
        assert_eq!(
            sent("http://api/v1/tasks?key={key}", "..").as_deref(),
            Some("http://api/v1/tasks?key=%2E%2E")
        );
    }

    #[test]
    fn body_fields_are_sent_but_not_shown() {
        let body = json!({"title": "a b", "n": 3, "nested": {"x": ".."}}).to_string();
        let body = body.as_bytes();
        let filled = url(
            "http://api/v1/orders?title={body:/title}&n={body:/n}&key={key}",
            keys("k"),
            Some(body),
        )
        .unwrap();
        assert_eq!(filled.sent, "http://api/v1/orders?title=a%20b&n=3&key=k");
        assert_eq!(
            filled.shown,
            "http://api/v1/orders?title={body:/title}&n={body:/n}&key=k"
        );
        // A field that is missing or not a scalar names nothing; a dot
        // field in the path is refused as a dot key is.
        assert!(url("http://api/x?t={body:/missing}", keys("k"), Some(body)).is_err());
        assert!(url("http://api/x?t={body:/nested}", keys("k"), Some(body)).is_err());
        assert!(url("http://api/x/{body:/nested/x}", keys("k"), Some(body)).is_err());
        assert!(url("http://api/x?t={body:/title}", keys("k"), None).is_err());
    }

    /// A number is asked about as written: one past what a double holds
    /// exactly would otherwise be asked rounded (`1.8446744073709552e19`),
    /// found absent, and its write sent again.
    #[test]
    fn a_body_number_is_asked_about_as_written() {
        for written in [
            "18446744073709551616",
            "-9223372036854775809",
            "1e3",
            "2.50",
        ] {
            let body = format!(r#"{{"ref": {written}, "ok": true}}"#);
            let filled = url(
                "http://api/x?ref={body:/ref}&ok={body:/ok}",
                keys("k"),
                Some(body.as_bytes()),
            )
            .unwrap();
            let expected = format!("http://api/x?ref={}&ok=true", url_component(written));
            assert_eq!(filled.sent, expected);
        }
    }
}
