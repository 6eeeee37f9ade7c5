//! The properties the fuzz targets check, one function per target, each
//! taking the raw input. A broken property panics. The same functions run
//! the kept crash inputs under `cargo test` on stable
//! (`tests/it/fuzz_regressions.rs`), so a fixed bug stays fixed; this file
//! depends on nothing but idemgate and the crates it already uses.

use std::time::{Duration, Instant};

use http::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode};
use serde_json::Value;

use idemgate::admin::Resolution;
use idemgate::config::Config;
use idemgate::pipeline::fingerprint::{self, ExactDigest, FingerprintInput};
use idemgate::pipeline::key::{IDEMPOTENCY_KEY, IdempotencyKey, Scope, url_component};
use idemgate_model::canonical_json::{self, NotExact};
use idemgate_model::clock::{self, Clock, SystemClock};
use idemgate_model::operation::Fingerprint;
use idemgate_store::Decision;
use idemgate_store::scope_key::ScopeKey;

/// `Idempotency-Key` parsing. Input: a header value's bytes.
///
/// The header and a status lookup's path read one key alike; a key is 1–255
/// characters 0x21–0x7E; its sf-string form and its bare form (what is
/// forwarded upstream) both read back as that key; its URL component is one
/// segment, never a dot-segment, and decodes back to it.
pub fn key(data: &[u8]) {
    let from_header = HeaderValue::from_bytes(data).ok().map(|value| {
        let mut headers = HeaderMap::new();
        headers.insert(IDEMPOTENCY_KEY, value);
        IdempotencyKey::from_headers(&headers)
    });
    let Ok(text) = std::str::from_utf8(data) else {
        assert!(
            !matches!(from_header, Some(Ok(_))),
            "a key that is not UTF-8 was accepted"
        );
        return;
    };
    let parsed = IdempotencyKey::parse(text);
    if let Some(from_header) = from_header {
        assert_eq!(
            from_header.ok().flatten(),
            parsed.clone().ok(),
            "the header and the path read {text:?} apart"
        );
    }
    let Ok(key) = parsed else {
        return;
    };
    let bare = key.as_str();
    assert!(
        (1..=255).contains(&bare.len()) && bare.bytes().all(|b| (0x21..=0x7e).contains(&b)),
        "{bare:?} is not a key"
    );
    assert_eq!(IdempotencyKey::new(bare).as_ref(), Ok(&key));
    assert_eq!(
        IdempotencyKey::parse(&sf_string(bare)).as_ref(),
        Ok(&key),
        "the sf-string form of {bare:?}"
    );
    assert_eq!(
        IdempotencyKey::parse(bare).as_ref(),
        Ok(&key),
        "the bare form of {bare:?} (as forwarded upstream) reads as another key"
    );
    let component = url_component(bare);
    assert!(
        component
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_~%".contains(&b)),
        "{component}"
    );
    assert!(component != "." && component != "..");
    let decoded = percent_encoding::percent_decode_str(&component).decode_utf8();
    assert_eq!(decoded.as_deref().ok(), Some(bare));
}

/// RFC 8941 sf-string: quotes around, `"` and `\` escaped.
fn sf_string(bare: &str) -> String {
    let escaped = bare.replace('\\', r"\\").replace('"', "\\\"");
    format!("\"{escaped}\"")
}

/// Canonical JSON, the fingerprint and derived keys. Input: two JSON texts
/// and an RFC 6901 pointer, separated by NUL bytes (which no JSON text
/// holds): `a \0 b \0 pointer`.
///
/// For each text: `check_exact` and `parse_exact` agree, and agree with
/// serde_json on what is JSON; an exact text's canonical form is exact
/// again and canonicalises to itself. For the pointer: `raw_at` names what
/// serde_json's pointer names, and `remove_pointer` removes nothing when
/// the pointer names nothing. For the pair: exact texts canonicalise (and
/// fingerprint) alike exactly when they are one JSON value, any other pair
/// fingerprints alike only when byte for byte equal, and keys derived from
/// the pointer's value are equal exactly when the values are one.
pub fn canonical_json(data: &[u8]) {
    let mut parts = data.splitn(3, |&b| b == 0);
    let a = parts.next().unwrap_or_default();
    let b = parts.next().unwrap_or_default();
    let pointer = parts
        .next()
        .and_then(|p| std::str::from_utf8(p).ok())
        .unwrap_or("");
    let exact_a = exact_text(a, pointer);
    let exact_b = exact_text(b, pointer);

    let one_value = match (&exact_a, &exact_b) {
        (Some(x), Some(y)) => {
            let same = same_json(x, y);
            assert_eq!(
                canonical_json::canonicalize(x) == canonical_json::canonicalize(y),
                same,
                "{x} / {y}"
            );
            same
        }
        _ => false,
    };
    let same_request = one_value || a == b;
    assert_eq!(
        fingerprint(a, &[]) == fingerprint(b, &[]),
        same_request,
        "fingerprints of {:?} / {:?}",
        String::from_utf8_lossy(a),
        String::from_utf8_lossy(b)
    );
    assert_eq!(exact_digest(a) == exact_digest(b), a == b);
    if let (Some(x), Some(y)) = (&exact_a, &exact_b)
        && pointer.starts_with('/')
    {
        let ignore = [pointer.to_string()];
        let (mut x, mut y) = (x.clone(), y.clone());
        canonical_json::remove_pointer(&mut x, pointer);
        canonical_json::remove_pointer(&mut y, pointer);
        assert_eq!(
            fingerprint(a, &ignore) == fingerprint(b, &ignore),
            same_json(&x, &y),
            "ignoring {pointer}: {x} / {y}"
        );
    }
    derived_keys(a, b, pointer, &exact_a, &exact_b);
}

/// The checks on one text; its value when it is exact.
fn exact_text(text: &[u8], pointer: &str) -> Option<Value> {
    let checked = canonical_json::check_exact(text);
    let parsed = canonical_json::parse_exact(text);
    assert_eq!(checked, parsed.as_ref().map(|_| ()).map_err(|e| *e));
    let serde = serde_json::from_slice::<Value>(text);
    match checked {
        Ok(()) => assert!(serde.is_ok(), "exact, yet serde_json refuses it"),
        Err(NotExact::Syntax) => assert!(serde.is_err(), "serde_json reads what is not JSON"),
        Err(_) => {}
    }
    let value = parsed.ok()?;
    let canonical = canonical_json::canonicalize(&value);
    let again = canonical_json::parse_exact(&canonical)
        .unwrap_or_else(|e| panic!("the canonical form {value} is not exact: {e:?}"));
    assert_eq!(canonical_json::canonicalize(&again), canonical);
    assert!(same_json(&again, &value));

    let at = canonical_json::raw_at(text, pointer).map(|raw| {
        canonical_json::parse_exact(raw)
            .unwrap_or_else(|e| panic!("raw_at({pointer}) is not exact: {e:?}"))
    });
    let expected = value.pointer(pointer);
    assert_eq!(
        at.is_some(),
        expected.is_some(),
        "raw_at and serde_json disagree on {pointer}"
    );
    if let (Some(at), Some(expected)) = (&at, expected) {
        assert!(same_json(at, expected), "{pointer}: {at} vs {expected}");
    }
    if expected.is_none() {
        let mut removed = value.clone();
        canonical_json::remove_pointer(&mut removed, pointer);
        assert_eq!(
            removed, value,
            "{pointer} names nothing, yet removed something"
        );
    }
    Some(value)
}

/// One JSON value: numbers by the double they name, objects as maps.
fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(name, v)| y.get(name).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

fn input<'a>(headers: &'a HeaderMap, ignore: &'a [String], body: &'a [u8]) -> FingerprintInput<'a> {
    FingerprintInput {
        method: &Method::POST,
        path_and_query: "/t",
        headers,
        fingerprint_headers: &[],
        ignore_fields: ignore,
        body_as_sent: false,
        body,
    }
}

fn json_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers
}

fn fingerprint(body: &[u8], ignore: &[String]) -> Fingerprint {
    fingerprint::compute(&input(&json_headers(), ignore, body))
}

fn exact_digest(body: &[u8]) -> ExactDigest {
    ExactDigest::compute(&input(&json_headers(), &[], body))
}

/// Keys derived from the value `pointer` names: well formed, and, for
/// exact bodies, equal exactly when the values are one.
fn derived_keys(a: &[u8], b: &[u8], pointer: &str, x: &Option<Value>, y: &Option<Value>) {
    if !pointer.starts_with('/') {
        return;
    }
    let scope_key = ScopeKey::new(&[7; 32], "fuzz");
    let scope =
        Scope::from_headers(&HeaderMap::new(), &[], true, &scope_key).expect("anonymous scope");
    let pointers = [pointer.to_string()];
    let key_a = IdempotencyKey::derive_from_body(&scope, &pointers, a);
    let key_b = IdempotencyKey::derive_from_body(&scope, &pointers, b);
    for key in [&key_a, &key_b].into_iter().flatten() {
        assert_eq!(IdempotencyKey::new(key.as_str()).as_ref(), Ok(key));
    }
    fn field<'v>(value: &'v Value, pointer: &str) -> Option<&'v Value> {
        value.pointer(pointer).filter(|v| !v.is_null())
    }
    if let Some(x) = x {
        assert_eq!(
            key_a.is_some(),
            field(x, pointer).is_some(),
            "{pointer} in {x}"
        );
    }
    let fields = [x, y].map(|value| value.as_ref().and_then(|v| field(v, pointer)));
    if let [Some(fx), Some(fy)] = fields {
        assert_eq!(key_a == key_b, same_json(fx, fy), "{pointer}: {fx} / {fy}");
    }
}

/// Config parsing from TOML text. Input: the file's bytes.
///
/// A refusal names the file; an accepted `Config` is one the gateway can
/// run: at least one route, names and prefixes unique, every duration
/// above zero and usable as a deadline from now (an `Instant`, and the
/// store's milliseconds), connection caps a semaphore can hold, statuses
/// where they belong.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let config = match Config::from_toml_str(text, "fuzz.toml") {
        Ok(config) => config,
        Err(error) => {
            assert!(error.to_string().starts_with("fuzz.toml: "), "{error}");
            return;
        }
    };
    let server = &config.server;
    let store = &config.store;
    let mut durations = vec![
        server.header_read_timeout,
        server.shutdown_grace,
        store.retention,
        store.lease,
    ];
    for cap in [server.max_connections, server.admin_max_connections] {
        assert!(
            (1..=tokio::sync::Semaphore::MAX_PERMITS).contains(&cap),
            "connection cap {cap}"
        );
    }
    assert!(server.max_header_bytes >= 8192);
    assert!(server.buffered_body_budget > 0);
    assert!(!config.routes.is_empty());
    for (i, route) in config.routes.iter().enumerate() {
        for other in &config.routes[..i] {
            assert_ne!(route.name, other.name);
            assert_ne!(route.path_prefix, other.path_prefix);
        }
        assert!(route.path_prefix.starts_with('/'));
        assert!(route.upstream.uri_for("/").is_ok(), "{route:?}");
        for status in route.release_statuses.iter().chain(&route.unknown_statuses) {
            assert!((400..=599).contains(status));
        }
        assert!(
            !route
                .release_statuses
                .iter()
                .any(|s| route.unknown_statuses.contains(s))
        );
        assert!(route.max_waiters > 0 && route.max_body > 0 && route.max_stored_response > 0);
        assert!(route.connect_retries <= 10);
        durations.extend([
            route.derive_window,
            route.wait_timeout,
            route.late_window,
            route.connect_timeout,
            route.upstream_timeout,
        ]);
        durations.extend(route.quota.as_ref().map(|q| q.window));
        if let Some(reconcile) = &route.reconcile {
            assert!((100..=599).contains(&reconcile.found_status));
            assert!(reconcile.url.contains("{key}") && !reconcile.url.contains('#'));
            durations.push(reconcile.timeout);
        }
    }
    let (now, now_millis) = (Instant::now(), SystemClock.now_millis());
    for duration in durations {
        assert!(duration > Duration::ZERO);
        assert!(
            now.checked_add(duration).is_some()
                && now_millis.checked_add(clock::millis(duration)).is_some(),
            "{duration:?} cannot be a deadline"
        );
    }
}

/// The admin resolution body. Input: the body's bytes.
///
/// An accepted resolution settles as `completed` with a response a replay
/// can send (a final status, end-to-end headers that are valid, a body,
/// empty for a status whose responses have no content: 204, 205, 304, RFC
/// 9110 §15.3.5, §15.3.6, §15.4.5) or as `not_attempted`, and reading one
/// body twice decides alike.
pub fn resolution(data: &[u8]) {
    let Ok(resolution) = Resolution::read(data) else {
        return;
    };
    let again = Resolution::read(data).expect("read once, refused the second time");
    assert_eq!(
        format!("{:?}", resolution.decision),
        format!("{:?}", again.decision),
        "one body, two decisions"
    );
    assert_eq!(resolution.event.kind, "resolved");
    let Decision::Completed { response } = &resolution.decision else {
        return;
    };
    assert!(
        (200..=599).contains(&response.status),
        "{}",
        response.status
    );
    let mut replay =
        http::Response::builder().status(StatusCode::from_u16(response.status).expect("a status"));
    for (name, value) in &response.headers {
        let header = HeaderName::from_bytes(name.as_bytes()).expect("a header name");
        assert_eq!(header.as_str(), name, "names are kept lower case");
        assert!(
            !matches!(
                name.as_str(),
                "connection"
                    | "keep-alive"
                    | "proxy-connection"
                    | "proxy-authenticate"
                    | "proxy-authorization"
                    | "te"
                    | "trailer"
                    | "transfer-encoding"
                    | "upgrade"
                    | "content-length"
            ),
            "{name} is idemgate's to set"
        );
        assert!(!value.contains(&b'\r') && !value.contains(&b'\n'));
        replay = replay.header(
            header,
            HeaderValue::from_bytes(value).expect("a header value"),
        );
    }
    let body = response
        .body
        .as_deref()
        .expect("a resolution's body is stored");
    assert!(
        body.is_empty() || !matches!(response.status, 204 | 205 | 304),
        "status {} has no content: a replay would drop the body",
        response.status
    );
    replay.body(()).expect("a replayable response");
}
