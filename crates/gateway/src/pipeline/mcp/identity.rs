//! A protected tool call's identity and fingerprint (docs/mcp.md,
//! "Which calls are one").
//!
//! Invariants:
//! - the key is taken, in this order, from `params._meta`
//!   (`dev.idemgate/idempotency-key`), the `Idempotency-Key` header, the
//!   route's `key_argument`, or derived from the tool and its arguments;
//!   a `_meta` key is a string or an integer (its decimal text), and any
//!   other value there is refused, never read as no key (it is left out
//!   of the fingerprint, so calls told apart by it alone would merge);
//!   the operation's key is `<tool>/<key>`, so one key names one operation
//!   per tool;
//! - the fingerprint is the tool, the endpoint below the route's prefix
//!   (its path and query, when there is one: one route may front several
//!   servers, `/mcp/jira` and `/mcp/github`, or carry a credential in the
//!   query), and the canonical JSON of its arguments:
//!   never the JSON-RPC id, `_meta`, a session, a continuation
//!   (`inputResponses`, `requestState`) nor the key argument when it
//!   holds key text or `null`, wherever the call's key came from (a key
//!   is no part of the call: a retry that carries its key elsewhere, or
//!   none, is the same call, as the rotated-key guard must see it; `null`
//!   is no key, as an absent one: a model that sends an optional key as
//!   `null` on one try and leaves it out on the next makes one call);
//!   absent, `null` and `{}` arguments are one; arguments canonical JSON
//!   would merge with others are hashed as sent.

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::config::{KeyMode, Route};
use crate::pipeline::error::ProxyError;
use crate::pipeline::fingerprint::digest_hex;
use crate::pipeline::key::{IdempotencyKey, KeyError, MAX_KEY_CHARS, Scope, url_component};
use crate::pipeline::mcp::call::Call;
use idemgate_model::canonical_json;
use idemgate_model::operation::Fingerprint;

/// Where the arguments are in a `tools/call` request.
const ARGUMENTS: &str = "/params/arguments";

/// Where a call's `_meta` key is, as a refusal names it.
const META_AT: &str = "params._meta[\"dev.idemgate/idempotency-key\"]";

/// The same, as an RFC 6901 pointer.
const META_POINTER: &str = "/params/_meta/dev.idemgate~1idempotency-key";

/// Where a call's key came from, and so whether the gateway made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// `params._meta`, the header, or the key argument.
    Sent,
    /// Derived from the tool and its arguments.
    Derived,
}

/// A call's operation: its key as stored (`<tool>/<key>`), where the key
/// came from, and its fingerprint.
#[derive(Debug, Clone)]
pub struct Identified {
    pub(crate) key: IdempotencyKey,
    pub(crate) source: KeySource,
    pub(crate) fingerprint: Fingerprint,
}

/// The call's key and fingerprint, in `scope`, for a request to `uri`.
pub fn identify(
    call: &Call,
    (uri, headers): (&http::Uri, &http::HeaderMap),
    body: &[u8],
    route: &Route,
    scope: &Scope,
) -> Result<Identified, ProxyError> {
    let key_argument = route.mcp.as_ref().and_then(|m| m.key_argument.as_deref());
    let sent = match &call.meta_key {
        // Any other value is refused, never read as no key: the key is not
        // in the fingerprint, so calls told apart only by it would merge.
        Some(value) => {
            let text = key_text(value).ok_or(KeyError::NotTextNorInteger { at: META_AT })?;
            Some(IdempotencyKey::new(&text)?)
        }
        None => match IdempotencyKey::from_headers(headers)? {
            Some(key) => Some(key),
            None => {
                let text = key_argument.and_then(|name| argument_text(body, name));
                text.map(|t| IdempotencyKey::new(&t)).transpose()?
            }
        },
    };
    let endpoint = endpoint(uri, &route.path_prefix);
    let fingerprint = fingerprint(call, &endpoint, body, key_argument);
    let (key, source) = match sent {
        Some(key) => (key, KeySource::Sent),
        None if route.key == KeyMode::Derive => (
            IdempotencyKey::derive_from_fingerprint(scope, &fingerprint),
            KeySource::Derived,
        ),
        None => return Err(ProxyError::MissingKey),
    };
    let tool = url_component(&call.tool);
    let stored = format!("{tool}/{}", key.as_str());
    let key = IdempotencyKey::new(&stored).map_err(|_| KeyError::TooLongBesideTool {
        room: MAX_KEY_CHARS.saturating_sub(tool.len() + 1),
    })?;
    Ok(Identified {
        key,
        source,
        fingerprint,
    })
}

/// Whether a call's `body` brought the server its key `own` bare, in its
/// `_meta` or in the route's key argument: a key that came in the HTTP
/// header, or was derived, reached the server only in
/// `forward_key_header`, as `<tool>/<key>`.
pub fn carries_key(body: &[u8], own: &str, key_argument: Option<&str>) -> bool {
    let meta = canonical_json::raw_at(body, META_POINTER)
        .and_then(|raw| canonical_json::parse_exact(raw).ok())
        .and_then(|value| key_text(&value));
    let argument = key_argument.and_then(|name| argument_text(body, name));
    meta.as_deref() == Some(own) || argument.as_deref() == Some(own)
}

/// The tool of the operation stored under `key` on an MCP route
/// (`<tool>/<key>`, the tool percent-encoded).
pub fn tool_of(key: &str) -> Option<String> {
    let (tool, _) = key.split_once('/')?;
    let decoded = percent_encoding::percent_decode_str(tool)
        .decode_utf8()
        .ok()?;
    Some(decoded.into_owned())
}

/// The call's own key of the operation stored under `key` on an MCP route
/// (`<tool>/<key>`): what is after the tool.
pub fn own_key(key: &str) -> &str {
    key.split_once('/').map_or(key, |(_, own)| own)
}

/// What of `uri` (normalized) lies below the route's `prefix`: the rest of
/// its path and its query (`?…`), empty for a call to the prefix itself.
fn endpoint(uri: &http::Uri, prefix: &str) -> String {
    let path = uri.path();
    let below = path.strip_prefix(prefix).unwrap_or(path);
    match uri.query() {
        Some(query) => format!("{below}?{query}"),
        None => below.to_string(),
    }
}

/// The call's fingerprint: its tool, its `endpoint` below the route's
/// prefix when there is one (none leaves the fingerprint of a call to the
/// prefix as it was before endpoints counted), and its arguments as RFC
/// 8785 canonical JSON, arguments absent, `null` and `{}` alike, without
/// the key argument (`name`) when it holds key text or is `null`, whether
/// or not the call's key came from it: a key is no part of the call, and
/// a `null` key argument is no key, as an absent one.
fn fingerprint(
    call: &Call,
    endpoint: &str,
    body: &[u8],
    key_argument: Option<&str>,
) -> Fingerprint {
    let mut hasher = Sha256::new();
    part(&mut hasher, b"idemgate-mcp-v1");
    part(&mut hasher, call.tool.as_bytes());
    if !endpoint.is_empty() {
        part(&mut hasher, b"endpoint");
        part(&mut hasher, endpoint.as_bytes());
    }
    let raw = canonical_json::raw_at(body, ARGUMENTS).unwrap_or(b"{}");
    match canonical_json::parse_exact(raw) {
        Ok(mut arguments) => {
            if arguments.is_null() {
                arguments = Value::Object(serde_json::Map::new());
            }
            if let Some(name) = key_argument {
                let pointer = pointer_to(name);
                let value = arguments.pointer(&pointer);
                if value.is_some_and(|v| v.is_null() || key_text(v).is_some()) {
                    canonical_json::remove_pointer(&mut arguments, &pointer);
                }
            }
            part(&mut hasher, b"json");
            part(&mut hasher, &canonical_json::canonicalize(&arguments));
        }
        Err(_) => {
            part(&mut hasher, b"raw");
            part(&mut hasher, raw);
        }
    }
    Fingerprint::from_stored(digest_hex(hasher))
}

/// The argument `name` as key text ([`key_text`]); anything else is no
/// key, and the argument stays in the fingerprint unless it is `null`.
fn argument_text(body: &[u8], name: &str) -> Option<String> {
    let raw = canonical_json::raw_at(body, &format!("{ARGUMENTS}{}", pointer_to(name)))?;
    key_text(&canonical_json::parse_exact(raw).ok()?)
}

/// A JSON value as key text: a string as it is, an integer in decimal,
/// spelled with a fraction or an exponent too (`7.0`, `7e0`: the integer 7
/// to RFC 8785 and to a server reading it as a number), up to 2^53, past
/// which a double no longer holds every integer.
fn key_text(value: &Value) -> Option<String> {
    /// 2^53.
    const EXACT: f64 = 9_007_199_254_740_992.0;
    match value {
        Value::String(text) => Some(text.clone()),
        Value::Number(n) if n.is_i64() || n.is_u64() => Some(n.to_string()),
        Value::Number(n) => {
            let float = n.as_f64()?;
            #[allow(clippy::cast_possible_truncation)] // integral, within ±2^53
            (float.fract() == 0.0 && float.abs() <= EXACT).then(|| (float as i64).to_string())
        }
        _ => None,
    }
}

/// The RFC 6901 pointer to member `name`.
fn pointer_to(name: &str) -> String {
    format!("/{}", name.replace('~', "~0").replace('/', "~1"))
}

fn part(hasher: &mut Sha256, bytes: &[u8]) {
    hasher.update((bytes.len() as u64).to_be_bytes());
    hasher.update(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::McpTools;
    use idemgate_store::scope_key::ScopeKey;

    fn route(key_argument: Option<&str>) -> Route {
        let toml = r#"
            [[routes]]
            name = "mcp"
            profile = "mcp"
            upstream = "http://127.0.0.1:9"
        "#;
        let mut route = crate::config::Config::from_toml_str(toml, "t.toml")
            .unwrap()
            .routes
            .remove(0);
        route.mcp = Some(McpTools {
            key_argument: key_argument.map(str::to_string),
            ..McpTools::default()
        });
        route
    }

    fn call(meta_key: Option<&str>) -> Call {
        Call {
            id: 1.into(),
            id_as_sent: crate::pipeline::mcp::call::as_raw(&1.into()),
            tool: "create_task".into(),
            meta_key: meta_key.map(Value::from),
            modern: false,
            accepts_json: true,
            accepts_stream: true,
        }
    }

    fn scope() -> Scope {
        let mut headers = http::HeaderMap::new();
        headers.insert("authorization", "Bearer a".parse().unwrap());
        let names = [http::header::AUTHORIZATION];
        Scope::from_headers(&headers, &names, false, &ScopeKey::new(&[1; 32], "t")).unwrap()
    }

    fn body(arguments: &str) -> Vec<u8> {
        format!(r#"{{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{{"name":"create_task","arguments":{arguments},"_meta":{{"progressToken":3}}}}}}"#).into_bytes()
    }

    fn identify_as(
        call: &Call,
        headers: &[(&'static str, &str)],
        arguments: &str,
        route: &Route,
    ) -> Identified {
        let mut map = http::HeaderMap::new();
        for (name, value) in headers {
            map.insert(*name, value.parse().unwrap());
        }
        identify(
            call,
            (&to_prefix(), &map),
            &body(arguments),
            route,
            &scope(),
        )
        .unwrap()
    }

    /// A call to the route's prefix itself.
    fn to_prefix() -> http::Uri {
        http::Uri::from_static("/")
    }

    #[test]
    fn the_key_comes_from_meta_then_the_header_then_the_argument() {
        let route = route(Some("request_id"));
        let args = r#"{"title":"a","request_id":"r-1"}"#;
        let header = [("idempotency-key", "h-1")];
        let meta = identify_as(&call(Some("m-1")), &header, args, &route);
        assert_eq!(meta.key.as_str(), "create_task/m-1");
        let from_header = identify_as(&call(None), &header, args, &route);
        assert_eq!(from_header.key.as_str(), "create_task/h-1");
        let from_argument = identify_as(&call(None), &[], args, &route);
        assert_eq!(from_argument.key.as_str(), "create_task/r-1");
        assert_eq!(from_argument.source, KeySource::Sent);
        // The key argument is no part of the call, wherever its key came
        // from: another request id with the same title is the same call,
        // and so is the call keyed by `_meta` or the header beside it (the
        // rotated-key guard holds a retry keyed elsewhere).
        let other_id = identify_as(
            &call(None),
            &[],
            r#"{"request_id":"r-2","title":"a"}"#,
            &route,
        );
        assert_eq!(other_id.fingerprint, from_argument.fingerprint);
        assert_eq!(meta.fingerprint, from_argument.fingerprint);
        assert_eq!(from_header.fingerprint, from_argument.fingerprint);
        let without = identify_as(&call(Some("m-1")), &[], r#"{"title":"a"}"#, &route);
        assert_eq!(without.fingerprint, from_argument.fingerprint);
    }

    #[test]
    fn a_call_carries_its_key_in_its_meta_or_its_key_argument_only() {
        let body = |meta: &str, argument: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"t","arguments":{{"request_id":{argument}}}{meta}}}}}"#
            )
        };
        let meta = r#","_meta":{"dev.idemgate/idempotency-key":"k-1"}"#;
        assert!(carries_key(body(meta, "null").as_bytes(), "k-1", None));
        assert!(carries_key(
            body("", "\"k-1\"").as_bytes(),
            "k-1",
            Some("request_id")
        ));
        assert!(carries_key(
            body("", "1001.0").as_bytes(),
            "1001",
            Some("request_id")
        ));
        assert!(!carries_key(body("", "\"k-1\"").as_bytes(), "k-1", None));
        assert!(!carries_key(
            body("", "\"other\"").as_bytes(),
            "k-1",
            Some("request_id")
        ));
        assert!(!carries_key(b"", "k-1", Some("request_id")));
    }

    #[test]
    fn a_meta_key_is_a_string_or_an_integer() {
        let route = route(None);
        let with = |key: Value| Call {
            meta_key: Some(key),
            ..call(None)
        };
        let number = identify_as(&with(Value::from(1001)), &[], "{}", &route);
        assert_eq!(number.key.as_str(), "create_task/1001");
        assert_eq!(number.source, KeySource::Sent);
        let negative = identify_as(&with(Value::from(-7)), &[], "{}", &route);
        assert_eq!(negative.key.as_str(), "create_task/-7");
        for other in [
            Value::from(1001.5),
            Value::Bool(true),
            Value::Null,
            serde_json::json!({"k": 1}),
        ] {
            let refused = identify(
                &with(other.clone()),
                (&to_prefix(), &http::HeaderMap::new()),
                &body("{}"),
                &route,
                &scope(),
            );
            assert!(
                matches!(
                    refused,
                    Err(ProxyError::InvalidKey(KeyError::NotTextNorInteger { .. }))
                ),
                "{other}: {refused:?}"
            );
        }
    }

    /// `7.0` is the integer 7 to the server: it was no key, so a retry
    /// spelled so was sent again, twice at once while the first ran.
    #[test]
    fn an_integer_key_spelled_with_a_fraction_or_an_exponent_is_that_integer() {
        let route = route(Some("request_id"));
        let as_integer = identify_as(&call(None), &[], r#"{"title":"a","request_id":7}"#, &route);
        assert_eq!(as_integer.key.as_str(), "create_task/7");
        for spelled in ["7.0", "7e0", "0.7e1", "7.000"] {
            let args = format!(r#"{{"title":"a","request_id":{spelled}}}"#);
            let other = identify_as(&call(None), &[], &args, &route);
            assert_eq!(
                (other.key.as_str(), &other.fingerprint),
                (as_integer.key.as_str(), &as_integer.fingerprint),
                "{spelled}"
            );
        }
        let meta = Call {
            meta_key: Some(serde_json::json!(-3.0)),
            ..call(None)
        };
        assert_eq!(
            identify_as(&meta, &[], "{}", &route).key.as_str(),
            "create_task/-3"
        );
        // A fraction, or an integer past 2^53 spelled as a double, is no key.
        for no_key in ["7.5", "1e300", "9007199254740994.0"] {
            let args = format!(r#"{{"title":"a","request_id":{no_key}}}"#);
            let other = identify_as(&call(None), &[], &args, &route);
            assert_eq!(other.source, KeySource::Derived, "{no_key}");
        }
    }

    #[test]
    fn a_keyless_call_is_derived_from_its_tool_and_arguments() {
        let route = route(None);
        let a = identify_as(&call(None), &[], r#"{"title":"a","n":1}"#, &route);
        assert_eq!(a.source, KeySource::Derived);
        // Key order, `1.0` for `1`, the id and `_meta` do not count.
        let same = identify_as(&call(None), &[], r#"{"n":1.0,"title":"a"}"#, &route);
        assert_eq!(
            (same.key.as_str(), &same.fingerprint),
            (a.key.as_str(), &a.fingerprint)
        );
        let other = identify_as(&call(None), &[], r#"{"title":"b","n":1}"#, &route);
        assert_ne!(other.key, a.key);
        assert!(a.key.as_str().starts_with("create_task/derived-"));
    }

    #[test]
    fn a_null_key_argument_is_as_absent() {
        let route = route(Some("request_id"));
        let absent = identify_as(&call(None), &[], r#"{"title":"a"}"#, &route);
        let null = identify_as(
            &call(None),
            &[],
            r#"{"title":"a","request_id":null}"#,
            &route,
        );
        assert_eq!(null.source, KeySource::Derived);
        assert_eq!(
            (null.key.as_str(), &null.fingerprint),
            (absent.key.as_str(), &absent.fingerprint)
        );
        // A keyed retry is the same call under another key.
        let keyed = identify_as(
            &call(None),
            &[],
            r#"{"title":"a","request_id":"x1"}"#,
            &route,
        );
        assert_eq!(keyed.fingerprint, absent.fingerprint);
        // Beside a `_meta` key too: the argument is no part of the call.
        let meta = call(Some("m-1"));
        let with_null = identify_as(&meta, &[], r#"{"title":"a","request_id":null}"#, &route);
        let without = identify_as(&meta, &[], r#"{"title":"a"}"#, &route);
        assert_eq!(with_null.fingerprint, without.fingerprint);
        // Of another type it is no key, and tells calls apart.
        let other = identify_as(
            &call(None),
            &[],
            r#"{"title":"a","request_id":true}"#,
            &route,
        );
        assert_ne!(other.fingerprint, absent.fingerprint);
    }

    /// The endpoint below the route's prefix is part of the call: one
    /// route fronting `/mcp/jira` and `/mcp/github`, or taking a
    /// credential in the query, makes the same call to each a call of its
    /// own; a call to the prefix itself has no endpoint part.
    #[test]
    fn the_endpoint_below_the_prefix_is_part_of_the_call() {
        let mut route = route(None);
        route.path_prefix = "/mcp".into();
        let at = |uri: &'static str| {
            let uri = http::Uri::from_static(uri);
            let map = http::HeaderMap::new();
            identify(&call(None), (&uri, &map), &body("{}"), &route, &scope()).unwrap()
        };
        let prefix = at("/mcp");
        let jira = at("/mcp/jira");
        let github = at("/mcp/github");
        let tenant_a = at("/mcp/jira?tenant=a");
        let tenant_b = at("/mcp/jira?tenant=b");
        let all = [&prefix, &jira, &github, &tenant_a, &tenant_b];
        for (i, one) in all.iter().enumerate() {
            for other in &all[i + 1..] {
                assert_ne!(one.fingerprint, other.fingerprint);
                assert_ne!(one.key, other.key, "derived from the fingerprint");
            }
        }
        assert_eq!(at("/mcp/jira").fingerprint, jira.fingerprint);
        assert_eq!(endpoint(&http::Uri::from_static("/mcp"), "/mcp"), "");
    }

    #[test]
    fn absent_null_and_empty_arguments_are_one() {
        let route = route(None);
        let without =
            br#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"create_task"}}"#;
        let absent = identify(
            &call(None),
            (&to_prefix(), &http::HeaderMap::new()),
            without,
            &route,
            &scope(),
        )
        .unwrap();
        for arguments in ["null", "{}"] {
            let other = identify_as(&call(None), &[], arguments, &route);
            assert_eq!(
                (other.key.as_str(), &other.fingerprint),
                (absent.key.as_str(), &absent.fingerprint),
                "{arguments}"
            );
        }
    }

    #[test]
    fn a_key_too_long_beside_its_tool_names_the_room_left() {
        let route = route(None);
        // `create_task/` takes 12 of the 255 characters: 243 are left.
        let fits = "k".repeat(243);
        let key = identify_as(&call(Some(&fits)), &[], "{}", &route).key;
        assert_eq!(key.as_str().len(), 255);
        let long = "k".repeat(244);
        let Err(ProxyError::InvalidKey(error)) = identify(
            &call(Some(&long)),
            (&to_prefix(), &http::HeaderMap::new()),
            &body("{}"),
            &route,
            &scope(),
        ) else {
            panic!("a 244-character key beside `create_task` was taken");
        };
        let said = error.describe("key");
        assert!(said.contains("243 characters"), "{said}");
    }
}
