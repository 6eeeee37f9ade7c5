//! The `fingerprint` phase: what makes two requests with one key "the same
//! operation". A key reused with a different fingerprint is refused (422).
//!
//! The fingerprint is a SHA-256 over the method, the path and query, the
//! route's `fingerprint_headers` and the body. A JSON body is canonicalised
//! (RFC 8785, after removing `ignore_fields`) so re-serialising the same
//! payload is not a change; any other body, JSON that does not parse, or JSON
//! that the canonical form would not keep apart from another payload (see
//! `canonical_json`; its `ignore_fields` values still masked) is hashed as
//! sent — and so is every body on a route
//! whose profile compares bodies as sent (`ucp`: UCP matches payloads by
//! the SHA-256 of the raw bytes). So two requests whose bodies differ
//! outside `ignore_fields` never share a fingerprint, and every part is length-prefixed, so no two
//! different requests can run together into the same bytes.

use std::borrow::Cow;

use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use http::{HeaderMap, Method};
use sha2::{Digest, Sha256};

use idemgate_model::canonical_json::{self, NotExact};
use idemgate_model::operation::Fingerprint;

/// What the fingerprint is computed over.
pub struct FingerprintInput<'a> {
    pub method: &'a Method,
    pub path_and_query: &'a str,
    pub headers: &'a HeaderMap,
    pub fingerprint_headers: &'a [HeaderName],
    pub ignore_fields: &'a [String],
    /// The body is compared as sent, even JSON ([`crate::profile::Wire`]).
    pub body_as_sent: bool,
    pub body: &'a [u8],
}

/// A request's fingerprint. The type is the operation model's
/// ([`Fingerprint`]), below the store that keeps it; computing one is this
/// phase's.
pub fn compute(input: &FingerprintInput<'_>) -> Fingerprint {
    let mut hasher = Sha256::new();
    hash_request_head(&mut hasher, b"idemgate-fingerprint-v1", input);
    let (tag, bytes): (&[u8], Cow<'_, [u8]>) = match body(input) {
        Body::Canonical(canonical) => (b"json", Cow::Owned(canonical)),
        Body::Raw(raw) => (b"raw", raw),
        Body::Masked(masked) => (b"json-masked", Cow::Owned(masked)),
    };
    part(&mut hasher, tag);
    part(&mut hasher, &bytes);
    Fingerprint::from_stored(digest_hex(hasher))
}

/// A body as the fingerprint takes it.
enum Body<'a> {
    /// JSON in its canonical form, `ignore_fields` removed.
    Canonical(Vec<u8>),
    /// Bytes as sent.
    Raw(Cow<'a, [u8]>),
    /// JSON that is not exact, as sent but with the values of its
    /// `ignore_fields` written `null` ([`canonical_json::mask_raw`]).
    Masked(Vec<u8>),
}

/// A request exactly as sent: a SHA-256 over every input of its
/// fingerprint, the body as sent and the `Content-Type` that decides
/// whether it is read as JSON. On one route (one `ignore_fields`), two
/// requests with the same exact digest have the same fingerprint, so a
/// retry sent byte for byte is recognised as the same request without
/// parsing its JSON: the replay fast path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExactDigest([u8; 32]);

impl ExactDigest {
    /// The exact digest of a request whose fingerprint already says all
    /// that makes it the same (an MCP tool call: its tool and arguments,
    /// never its JSON-RPC id), so the replay cache's fast path takes it.
    pub fn of(fingerprint: &Fingerprint) -> Self {
        let mut hasher = Sha256::new();
        part(&mut hasher, b"idemgate-exact-of-fingerprint");
        part(&mut hasher, fingerprint.as_str().as_bytes());
        ExactDigest(hasher.finalize().into())
    }

    pub fn compute(input: &FingerprintInput<'_>) -> Self {
        let mut hasher = Sha256::new();
        hash_request_head(&mut hasher, b"idemgate-exact-v1", input);
        hash_values(&mut hasher, input.headers, &CONTENT_TYPE, as_sent);
        part(&mut hasher, input.body);
        ExactDigest(hasher.finalize().into())
    }
}

/// One length-prefixed part, so no two different requests run together
/// into the same bytes.
fn part(hasher: &mut Sha256, bytes: &[u8]) {
    hasher.update((bytes.len() as u64).to_be_bytes());
    hasher.update(bytes);
}

/// A domain tag, the method, the path and query, and each of the route's
/// fingerprint headers with all its values.
fn hash_request_head(hasher: &mut Sha256, tag: &[u8], input: &FingerprintInput<'_>) {
    part(hasher, tag);
    part(hasher, input.method.as_str().as_bytes());
    part(hasher, input.path_and_query.as_bytes());
    for name in input.fingerprint_headers {
        // A `Content-Type` in its normal form: a retry that spells its
        // media type otherwise sends the same request.
        let form = if name == CONTENT_TYPE {
            media_type
        } else {
            as_sent
        };
        hash_values(hasher, input.headers, name, form);
    }
}

/// A header's name, how many values it has, and each value in `form`.
fn hash_values(
    hasher: &mut Sha256,
    headers: &HeaderMap,
    name: &HeaderName,
    form: fn(&HeaderValue) -> Cow<'_, [u8]>,
) {
    part(hasher, name.as_str().as_bytes());
    let values = headers.get_all(name);
    part(hasher, &(values.iter().count() as u64).to_be_bytes());
    for value in values {
        part(hasher, &form(value));
    }
}

fn as_sent(value: &HeaderValue) -> Cow<'_, [u8]> {
    Cow::Borrowed(value.as_bytes())
}

/// A media type in its [normal form](media_type_normal); bytes that are
/// not text, as sent.
fn media_type(value: &HeaderValue) -> Cow<'_, [u8]> {
    match value.to_str() {
        Ok(text) => match media_type_normal(text) {
            Cow::Borrowed(text) => Cow::Borrowed(text.as_bytes()),
            Cow::Owned(text) => Cow::Owned(text.into_bytes()),
        },
        Err(_) => as_sent(value),
    }
}

/// A media type as RFC 9110 §8.3.1 compares it: type, subtype and
/// parameter names in any case, whitespace around the parts, a `charset`
/// in any case or quoted; and a `charset=utf-8` on JSON, which has no
/// other (RFC 8259 §11), is none. Written `type/subtype; name=value`, so
/// a value already so spelled is unchanged.
fn media_type_normal(value: &str) -> Cow<'_, str> {
    // The common spelling (`application/json`) as it is, unallocated.
    let plain = |b: u8| !(b == b';' || b.is_ascii_whitespace() || b.is_ascii_uppercase());
    if value.bytes().all(plain) {
        return Cow::Borrowed(value);
    }
    let mut parts = value.split(';');
    let media_type = parts.next().unwrap_or("").trim().to_ascii_lowercase();
    let json = media_type == "application/json" || media_type.ends_with("+json");
    let mut normal = media_type;
    for parameter in parts {
        let (name, text) = parameter.split_once('=').unwrap_or((parameter, ""));
        let name = name.trim().to_ascii_lowercase();
        let mut text = text.trim().to_string();
        if name.is_empty() {
            continue;
        }
        if name == "charset" {
            text = text.trim_matches('"').to_ascii_lowercase();
            if json && text == "utf-8" {
                continue;
            }
        }
        normal.push_str("; ");
        normal.push_str(&name);
        normal.push('=');
        normal.push_str(&text);
    }
    if normal == value {
        Cow::Borrowed(value)
    } else {
        Cow::Owned(normal)
    }
}

/// The canonical JSON of a JSON body, `ignore_fields` removed; any other
/// body as sent. JSON that canonicalising could make equal to another
/// payload (a member named twice, a lone surrogate, a number a double
/// cannot hold) is hashed as sent — but for its `ignore_fields`' values,
/// masked first: a field the route ignores (a timestamp beside a 64-bit
/// id) is still ignored, and a body whose only inexact number was in an
/// ignored field is canonical, as it is when that number was exact.
fn body<'a>(input: &FingerprintInput<'a>) -> Body<'a> {
    if input.body_as_sent || !is_json(input.headers) {
        return Body::Raw(Cow::Borrowed(input.body));
    }
    let canonical = |mut value| {
        for pointer in input.ignore_fields {
            canonical_json::remove_pointer(&mut value, pointer);
        }
        Body::Canonical(canonical_json::canonicalize(&value))
    };
    match canonical_json::parse_exact(input.body) {
        Ok(value) => canonical(value),
        Err(NotExact::Syntax) => Body::Raw(Cow::Borrowed(input.body)),
        Err(_) => match canonical_json::mask_raw(input.body, input.ignore_fields) {
            None => Body::Raw(Cow::Borrowed(input.body)),
            Some(masked) => match canonical_json::parse_exact(&masked) {
                Ok(value) => canonical(value),
                Err(_) => Body::Masked(masked),
            },
        },
    }
}

/// `application/json` or any `+json` media type, parameters ignored.
pub(crate) fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let media_type = value
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    media_type == "application/json" || media_type.ends_with("+json")
}

/// A SHA-256 as lower-case hex.
pub(crate) fn digest_hex(hasher: Sha256) -> String {
    idemgate_model::hex_text::of(&hasher.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_media_type_is_compared_as_rfc_9110_compares_it() {
        let same = [
            ("application/json", "application/json"),
            ("Application/JSON", "application/json"),
            ("application/json; charset=utf-8", "application/json"),
            ("application/json;charset=\"UTF-8\"", "application/json"),
            ("text/plain; charset=UTF-8", "text/plain; charset=utf-8"),
            ("text/plain;Charset=utf-8 ", "text/plain; charset=utf-8"),
            (
                "multipart/form-data; boundary=AbC",
                "multipart/form-data; boundary=AbC",
            ),
        ];
        for (sent, normal) in same {
            assert_eq!(media_type_normal(sent), normal, "{sent}");
        }
        // Still apart: another charset, another boundary, another type.
        assert_ne!(
            media_type_normal("application/json; charset=utf-16"),
            media_type_normal("application/json")
        );
        assert_ne!(
            media_type_normal("multipart/form-data; boundary=abc"),
            media_type_normal("multipart/form-data; boundary=ABC")
        );
        assert_ne!(
            media_type_normal("text/plain"),
            media_type_normal("text/html")
        );
    }
    use crate::pipeline::key::IdempotencyKey;
    use http::HeaderValue;

    fn fp(
        method: Method,
        path: &str,
        content_type: Option<&str>,
        ignore: &[&str],
        body: &str,
    ) -> Fingerprint {
        let mut headers = HeaderMap::new();
        if let Some(ct) = content_type {
            headers.insert(CONTENT_TYPE, HeaderValue::from_str(ct).unwrap());
        }
        let ignore: Vec<String> = ignore.iter().map(|s| s.to_string()).collect();
        compute(&FingerprintInput {
            method: &method,
            path_and_query: path,
            headers: &headers,
            fingerprint_headers: &[CONTENT_TYPE],
            ignore_fields: &ignore,
            body_as_sent: false,
            body: body.as_bytes(),
        })
    }

    const JSON: Option<&str> = Some("application/json");

    #[test]
    fn reserialised_json_is_the_same_operation() {
        let a = fp(Method::POST, "/t", JSON, &[], r#"{"a":1,"b":[true]}"#);
        assert_eq!(
            a,
            fp(
                Method::POST,
                "/t",
                JSON,
                &[],
                "{ \"b\": [ true ], \"a\": 1.0 }"
            )
        );
        assert_eq!(a.as_str().len(), 64);
    }

    #[test]
    fn every_part_counts() {
        let base = fp(Method::POST, "/t", JSON, &[], r#"{"a":1}"#);
        assert_ne!(base, fp(Method::PATCH, "/t", JSON, &[], r#"{"a":1}"#));
        assert_ne!(base, fp(Method::POST, "/t?x=1", JSON, &[], r#"{"a":1}"#));
        assert_ne!(base, fp(Method::POST, "/t", JSON, &[], r#"{"a":2}"#));
        assert_ne!(
            base,
            fp(
                Method::POST,
                "/t",
                Some("application/vnd.x+json; charset=utf-8"),
                &[],
                r#"{"a":1}"#
            )
        );
    }

    #[test]
    fn a_body_compared_as_sent_is_its_bytes() {
        let as_sent = |body: &str| {
            let headers = HeaderMap::from_iter([(
                CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )]);
            compute(&FingerprintInput {
                method: &Method::PUT,
                path_and_query: "/checkout-sessions/c-1",
                headers: &headers,
                fingerprint_headers: &[],
                ignore_fields: &[],
                body_as_sent: true,
                body: body.as_bytes(),
            })
        };
        assert_eq!(as_sent(r#"{"a":1,"b":2}"#), as_sent(r#"{"a":1,"b":2}"#));
        assert_ne!(as_sent(r#"{"a":1,"b":2}"#), as_sent(r#"{"b":2,"a":1}"#));
        assert_ne!(as_sent(r#"{"a":1}"#), as_sent(r#"{"a":1.0}"#));
    }

    #[test]
    fn ignored_fields_do_not_count() {
        let ignoring = |body| fp(Method::POST, "/t", JSON, &["/nonce", "/meta/sent_at"], body);
        assert_eq!(
            ignoring(r#"{"a":1,"nonce":"x","meta":{"sent_at":1}}"#),
            ignoring(r#"{"a":1,"nonce":"y","meta":{"sent_at":2}}"#)
        );
        assert_ne!(
            ignoring(r#"{"a":1,"nonce":"x"}"#),
            ignoring(r#"{"a":2,"nonce":"x"}"#)
        );
    }

    #[test]
    fn other_bodies_are_hashed_raw() {
        let a = fp(Method::POST, "/t", Some("text/plain"), &[], r#"{"a":1}"#);
        assert_ne!(
            a,
            fp(Method::POST, "/t", Some("text/plain"), &[], r#"{ "a":1}"#)
        );
        // Invalid JSON under a JSON media type is hashed raw too, not refused.
        let broken = fp(Method::POST, "/t", JSON, &[], "{");
        assert_ne!(broken, fp(Method::POST, "/t", JSON, &[], "{ "));
    }

    /// Two bodies that must be two operations, and two that must be one.
    fn assert_apart(a: &str, b: &str) {
        assert_ne!(
            fp(Method::POST, "/t", JSON, &[], a),
            fp(Method::POST, "/t", JSON, &[], b),
            "{a} vs {b}"
        );
    }
    fn assert_one(a: &str, b: &str) {
        assert_eq!(
            fp(Method::POST, "/t", JSON, &[], a),
            fp(Method::POST, "/t", JSON, &[], b),
            "{a} vs {b}"
        );
    }

    #[test]
    fn numbers_binary64_cannot_hold_are_not_merged() {
        // 2^53 + 1 and 2^53 are one double.
        assert_apart(
            r#"{"account":9007199254740993}"#,
            r#"{"account":9007199254740992}"#,
        );
        // Two 20-digit ids.
        assert_apart(
            r#"{"id":12345678901234567890}"#,
            r#"{"id":12345678901234567891}"#,
        );
        assert_apart(
            r#"{"id":12345678901234567890}"#,
            r#"{"id":12345678901234567000}"#,
        );
        // A decimal with more digits than its double keeps.
        assert_apart("[0.30000000000000001]", "[0.3]");
        assert_apart("[333333333.33333329]", "[333333333.3333333]");
        // Out of range both ways: no double at all, or a zero that was not 0.
        assert_apart("[1e400]", "[1e401]");
        assert_apart("[1e-400]", "[0]");
    }

    /// Hashed as sent, such a body still leaves out the route's ignored
    /// fields (a keyless client's timestamp beside a 64-bit id must not
    /// make its retry a second write); any other change is a change.
    #[test]
    fn a_body_hashed_as_sent_still_ignores_its_ignored_fields() {
        let sent = |body: &str| fp(Method::POST, "/t", JSON, &["/nonce", "/meta/at"], body);
        let with = |id: &str, nonce: &str, at: &str| {
            sent(&format!(
                r#"{{"id":{id},"nonce":{nonce},"meta":{{"at":{at},"n":1}}}}"#
            ))
        };
        let big = "12345678901234567890";
        assert_eq!(with(big, "1", "\"x\""), with(big, "[2, {}]", "3"));
        assert_ne!(with(big, "1", "2"), with("12345678901234567891", "1", "2"));
        // Not merged with the canonical form, nor with one another's shape.
        assert_ne!(with(big, "1", "2"), with("1", "1", "2"));
        assert_ne!(
            sent(r#"{"id":12345678901234567890,"nonce":1}"#),
            sent(r#"{"id":12345678901234567890 ,"nonce":1}"#)
        );
        // A name given twice on the way masks nothing: the upstream may
        // read either.
        let twice = |nonce: &str| sent(&format!(r#"{{"a":1e400,"nonce":{nonce},"nonce":0}}"#));
        assert_ne!(twice("1"), twice("2"));
        // JSON that does not parse is bytes, ignored fields and all.
        assert_ne!(sent(r#"{"nonce":1,"#), sent(r#"{"nonce":2,"#));
        // An ignored field that alone was inexact leaves a canonical body,
        // as one whose number a double holds does (nanoseconds from a
        // millisecond clock: the first is a double's, the second not).
        let at = |nanos: &str| sent(&format!(r#"{{"qty":3,"nonce":{nanos}}}"#));
        assert_eq!(at("1733570000124000000"), at("1733570000123000000"));
        assert_eq!(
            at("1733570000123000000"),
            sent(r#"{ "nonce": 1, "qty": 3 }"#)
        );
        // Masked JSON is not bytes that happen to read the same.
        let masked = with(big, "1", "2");
        let text = format!(r#"{{"id":{big},"nonce":null,"meta":{{"at":null,"n":1}}}}"#);
        let plain = fp(
            Method::POST,
            "/t",
            Some("text/plain"),
            &["/nonce", "/meta/at"],
            &text,
        );
        assert_ne!(masked, plain);
    }

    #[test]
    fn duplicate_member_names_are_not_merged() {
        assert_apart(r#"{"a":1,"a":2}"#, r#"{"a":2}"#);
        assert_apart(r#"{"a":1,"\u0061":2}"#, r#"{"a":2}"#);
        assert_apart(r#"{"x":[{"b":0,"a":1,"a":2}]}"#, r#"{"x":[{"b":0,"a":2}]}"#);
        // The same duplicate sent again is the same bytes: one operation.
        assert_one(r#"{"a":1,"a":2}"#, r#"{"a":1,"a":2}"#);
    }

    #[test]
    fn lone_surrogates_are_not_merged() {
        assert_apart(r#"["\ud800"]"#, r#"["\ud801"]"#);
        assert_apart(r#"{"\udc00":1}"#, r#"{"\udc01":1}"#);
        assert_apart(r#"["\ud800"]"#, r#"["\ufffd"]"#);
        // A pair is one character, whichever way it is written.
        assert_one(r#"["\ud83d\ude00"]"#, "[\"\u{1F600}\"]");
    }

    #[test]
    fn exact_values_written_differently_are_one_operation() {
        assert_one("[1]", "[1.0]");
        assert_one("[1]", "[1e0]");
        assert_one("[0.1]", "[1e-1]");
        assert_one("[0.1]", "[0.10]");
        assert_one("[0]", "[-0]");
        assert_one("[9007199254740992]", "[9007199254740992.0]");
        assert_one("[1e21]", "[1000000000000000000000]");
        assert_one("[12345678901234567000]", "[1.2345678901234567e19]");
        assert_one(r#"{"s":"A"}"#, r#"{"\u0073":"\u0041"}"#);
    }

    #[test]
    fn exact_json_fingerprints_are_unchanged() {
        // Stored fingerprints must still match after an upgrade: pinned.
        let canonical = fp(
            Method::POST,
            "/t",
            JSON,
            &["/nonce"],
            r#"{"b":[1.0,0.1,"\u0041"],"a":null,"nonce":7}"#,
        );
        assert_eq!(
            canonical.as_str(),
            "f8bf799f45becd53f8537155d4e9d725e8225d7861707c62d459daa4475712ca"
        );
    }

    fn exact(content_type: Option<&str>, body: &str) -> ExactDigest {
        let mut headers = HeaderMap::new();
        if let Some(ct) = content_type {
            headers.insert(CONTENT_TYPE, HeaderValue::from_str(ct).unwrap());
        }
        ExactDigest::compute(&FingerprintInput {
            method: &Method::POST,
            path_and_query: "/t",
            headers: &headers,
            fingerprint_headers: &[],
            ignore_fields: &[],
            body_as_sent: false,
            body: body.as_bytes(),
        })
    }

    #[test]
    fn the_exact_digest_is_the_request_as_sent() {
        let body = r#"{"a":1,"b":2}"#;
        assert_eq!(exact(JSON, body), exact(JSON, body));
        // The same payload spelled otherwise is one fingerprint but not one
        // exact digest: the replay cache then asks the fingerprint.
        assert_ne!(exact(JSON, body), exact(JSON, r#"{"b":2,"a":1}"#));
        // The media type decides how the body is fingerprinted, so it counts.
        assert_ne!(exact(JSON, body), exact(Some("text/plain"), body));
        assert_ne!(exact(JSON, body), exact(None, body));
    }

    /// A JSON value as the property test knows it: numbers as exact
    /// decimals, strings as UTF-16 code units (so a lone surrogate is one
    /// too), objects as members in order (so a name may repeat).
    #[derive(Clone, Debug)]
    enum Json {
        Null,
        Bool(bool),
        Number(Decimal),
        String(Vec<u16>),
        Array(Vec<Json>),
        Object(Vec<(Vec<u16>, Json)>),
    }

    /// `(-1)^negative × digits × 10^exponent`; `digits` has no leading or
    /// trailing zero (none at all: zero, unsigned). `exact`: known, by how it
    /// was made, to be a double's shortest form (`false`: not, or unknown).
    #[derive(Clone, Debug)]
    struct Decimal {
        negative: bool,
        digits: String,
        exponent: i32,
        exact: bool,
    }

    impl Decimal {
        fn new(negative: bool, digits: &str, exponent: i32, exact: bool) -> Decimal {
            let kept = digits.trim_start_matches('0');
            let trimmed = kept.trim_end_matches('0');
            let exponent = exponent + (kept.len() - trimmed.len()) as i32;
            let zero = trimmed.is_empty();
            Decimal {
                negative: negative && !zero,
                digits: trimmed.to_owned(),
                exponent: if zero { 0 } else { exponent },
                exact,
            }
        }

        /// Rust's shortest round-trip form of `double` (not the code under
        /// test's); zero for a NaN or an infinity, which JSON cannot write.
        fn of_double(double: f64) -> Decimal {
            if !double.is_finite() {
                return Decimal::new(false, "", 0, true);
            }
            let text = format!("{double:e}");
            let (mantissa, exponent) = text.split_once('e').unwrap();
            let negative = mantissa.starts_with('-');
            let mantissa = mantissa.trim_start_matches('-');
            let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
            let exponent: i32 = exponent.parse().unwrap();
            let digits = format!("{whole}{fraction}");
            Decimal::new(negative, &digits, exponent - fraction.len() as i32, true)
        }

        fn same(&self, other: &Decimal) -> bool {
            (self.negative, &self.digits, self.exponent)
                == (other.negative, &other.digits, other.exponent)
        }
    }

    impl Json {
        /// Whether `self` and `other` are one exact JSON value: objects
        /// without a repeated name compare as maps, others member by member.
        fn same(&self, other: &Json) -> bool {
            match (self, other) {
                (Json::Null, Json::Null) => true,
                (Json::Bool(a), Json::Bool(b)) => a == b,
                (Json::Number(a), Json::Number(b)) => a.same(b),
                (Json::String(a), Json::String(b)) => a == b,
                (Json::Array(a), Json::Array(b)) => {
                    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.same(y))
                }
                (Json::Object(a), Json::Object(b)) => {
                    a.len() == b.len()
                        && compared_in_order(a)
                            .into_iter()
                            .zip(compared_in_order(b))
                            .all(|(x, y)| x.0 == y.0 && x.1.same(&y.1))
                }
                _ => false,
            }
        }

        /// I-JSON whose every number is known exact.
        fn is_exact(&self) -> bool {
            match self {
                Json::Null | Json::Bool(_) => true,
                Json::Number(n) => n.exact,
                Json::String(units) => !has_lone_surrogate(units),
                Json::Array(items) => items.iter().all(Json::is_exact),
                Json::Object(members) => {
                    !repeats_a_name(members)
                        && members
                            .iter()
                            .all(|(name, value)| !has_lone_surrogate(name) && value.is_exact())
                }
            }
        }
    }

    /// Members by name when no name repeats (order does not matter), else
    /// as sent (a parser may keep the first or the last).
    fn compared_in_order(members: &[(Vec<u16>, Json)]) -> Vec<&(Vec<u16>, Json)> {
        let mut order: Vec<_> = members.iter().collect();
        if !repeats_a_name(members) {
            order.sort_by(|x, y| x.0.cmp(&y.0));
        }
        order
    }

    fn repeats_a_name(members: &[(Vec<u16>, Json)]) -> bool {
        let mut names: Vec<_> = members.iter().map(|(name, _)| name).collect();
        names.sort();
        names.windows(2).any(|pair| pair[0] == pair[1])
    }

    fn has_lone_surrogate(units: &[u16]) -> bool {
        char::decode_utf16(units.iter().copied()).any(|c| c.is_err())
    }

    /// Numbers near one another as doubles, or not doubles at all.
    const TRICKY_NUMBERS: [(&str, i32, bool); 10] = [
        ("9007199254740992", 0, true),
        ("9007199254740993", 0, false),
        ("12345678901234567", 3, true),
        ("12345678901234567890", 0, false),
        ("3", -1, true),
        ("30000000000000001", -17, false),
        ("1", 400, false),
        ("1", -400, false),
        ("1", 0, true),
        ("", 0, true),
    ];

    fn random_number(rng: &mut fastrand::Rng) -> Decimal {
        let long = |rng: &mut fastrand::Rng, lengths: std::ops::Range<usize>| -> String {
            // First and last digit non-zero: that many significant digits.
            let len = rng.usize(lengths);
            let mut digits: String = (0..len).map(|_| rng.digit(10)).collect();
            digits.replace_range(0..1, &rng.char('1'..='9').to_string());
            digits.replace_range(len - 1.., &rng.char('1'..='9').to_string());
            digits
        };
        match rng.u8(0..5) {
            0 => Decimal::of_double(f64::from_bits(rng.u64(..))),
            1 => Decimal::of_double(rng.f64() * 10f64.powi(rng.i32(-30..30))),
            // Beyond what a double's shortest form (17 digits) can write.
            2 => Decimal::new(rng.bool(), &long(rng, 18..24), 0, false),
            3 => {
                let exponent = rng.i32(-40..10);
                Decimal::new(rng.bool(), &long(rng, 18..30), exponent, false)
            }
            _ => {
                let (digits, exponent, exact) = TRICKY_NUMBERS[rng.usize(..TRICKY_NUMBERS.len())];
                Decimal::new(rng.bool(), digits, exponent, exact)
            }
        }
    }

    /// A few code units: names and strings collide often, and include
    /// escapes, pairs, lone surrogates and U+FFFD (what a lone one becomes).
    fn random_units(rng: &mut fastrand::Rng, max: usize) -> Vec<u16> {
        let pool: [&[u16]; 10] = [
            &[0x41],
            &[0x61],
            &[0x22],
            &[0x5c],
            &[0x0a],
            &[0xe9],
            &[0xfffd],
            &[0xd83d, 0xde00],
            &[0xd800],
            &[0xdc00],
        ];
        (0..rng.usize(0..=max))
            .flat_map(|_| pool[rng.usize(..pool.len())].iter().copied())
            .collect()
    }

    fn random_json(rng: &mut fastrand::Rng, depth: u32) -> Json {
        match rng.u8(0..if depth == 0 { 4 } else { 6 }) {
            0 => [Json::Null, Json::Bool(true), Json::Bool(false)][rng.usize(0..3)].clone(),
            1 | 2 => Json::Number(random_number(rng)),
            3 => Json::String(random_units(rng, 4)),
            4 => Json::Array(
                (0..rng.usize(0..4))
                    .map(|_| random_json(rng, depth - 1))
                    .collect(),
            ),
            _ => Json::Object(
                (0..rng.usize(0..4))
                    .map(|_| (random_units(rng, 1), random_json(rng, depth - 1)))
                    .collect(),
            ),
        }
    }

    /// `value` with one small change somewhere (or, rarely, none).
    fn mutated(rng: &mut fastrand::Rng, value: &Json) -> Json {
        let mut value = value.clone();
        match &mut value {
            Json::Number(n) => match rng.u8(0..3) {
                0 => {
                    *n = Decimal::new(n.negative, &format!("{}1", n.digits), n.exponent - 1, false)
                }
                1 => *n = Decimal::new(n.negative, &n.digits.clone(), n.exponent + 1, false),
                _ => *n = random_number(rng),
            },
            Json::String(units) => match units.pop() {
                Some(0xd800 | 0xdc00) => units.push(0xfffd),
                _ => units.extend(random_units(rng, 1)),
            },
            Json::Array(items) if !items.is_empty() => {
                let at = rng.usize(..items.len());
                items[at] = mutated(rng, &items[at]);
            }
            Json::Object(members) if !members.is_empty() => {
                let at = rng.usize(..members.len());
                match rng.u8(0..3) {
                    // The same name again, with another value: a duplicate.
                    0 => {
                        let name = members[at].0.clone();
                        members.push((name, random_json(rng, 1)));
                    }
                    1 => {
                        members.remove(at);
                    }
                    _ => members[at].1 = mutated(rng, &members[at].1),
                }
            }
            _ => value = random_json(rng, 2),
        }
        value
    }

    /// One of the many JSON texts of `value`: whitespace, member order
    /// (when no name repeats), escapes and number forms chosen at random.
    fn render(rng: &mut fastrand::Rng, value: &Json, out: &mut String) {
        match value {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Number(n) => render_number(rng, n, out),
            Json::String(units) => render_string(rng, units, out),
            Json::Array(items) => render_list(rng, "[]", items.iter(), out, render),
            Json::Object(members) => {
                let mut order: Vec<_> = members.iter().collect();
                if !repeats_a_name(members) {
                    rng.shuffle(&mut order);
                }
                render_list(rng, "{}", order, out, |rng, (name, member), out| {
                    render_string(rng, name, out);
                    space(rng, out);
                    out.push(':');
                    space(rng, out);
                    render(rng, member, out);
                });
            }
        }
    }

    fn space(rng: &mut fastrand::Rng, out: &mut String) {
        out.push_str(["", " ", "\n  ", "\t\r\n"][rng.usize(..4)]);
    }

    /// `brackets` around the items `each` renders, with commas and spaces.
    fn render_list<T>(
        rng: &mut fastrand::Rng,
        brackets: &str,
        items: impl IntoIterator<Item = T>,
        out: &mut String,
        mut each: impl FnMut(&mut fastrand::Rng, T, &mut String),
    ) {
        let (open, close) = brackets.split_at(1);
        out.push_str(open);
        for (i, item) in items.into_iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            space(rng, out);
            each(rng, item, out);
            space(rng, out);
        }
        out.push_str(close);
    }

    fn render_number(rng: &mut fastrand::Rng, n: &Decimal, out: &mut String) {
        if n.negative || (n.digits.is_empty() && rng.bool()) {
            out.push('-');
        }
        // Zeros after the digits: the same value.
        let padding = "0".repeat(rng.usize(0..3));
        let digits = if n.digits.is_empty() { "0" } else { &n.digits };
        let len = digits.len() as i32;
        match rng.u8(0..3) {
            // d.ddd e±x
            0 => {
                let e = ["e", "E", "e+", "E+"][rng.usize(..4)];
                let exponent = n.exponent + len - 1;
                let e = if exponent < 0 { "e" } else { e };
                let fraction = format!("{}{padding}", &digits[1..]);
                let point = if fraction.is_empty() { "" } else { "." };
                out.push_str(&format!("{}{point}{fraction}{e}{exponent}", &digits[..1]));
            }
            // ddd e±x
            1 => out.push_str(&format!("{digits}e{}", n.exponent)),
            // Positional, when it is not absurdly long.
            _ if n.exponent.abs() < 400 => {
                let point = len + n.exponent;
                if n.exponent >= 0 {
                    out.push_str(digits);
                    out.push_str(&"0".repeat(n.exponent as usize));
                } else if point > 0 {
                    let (whole, fraction) = digits.split_at(point as usize);
                    out.push_str(&format!("{whole}.{fraction}{padding}"));
                } else {
                    out.push_str(&format!(
                        "0.{}{digits}{padding}",
                        "0".repeat(-point as usize)
                    ));
                }
            }
            _ => out.push_str(&format!("{digits}e{}", n.exponent)),
        }
    }

    fn render_string(rng: &mut fastrand::Rng, units: &[u16], out: &mut String) {
        let escaped = |rng: &mut fastrand::Rng, unit: u16| {
            if rng.bool() {
                format!("\\u{unit:04x}")
            } else {
                format!("\\u{unit:04X}")
            }
        };
        out.push('"');
        for c in char::decode_utf16(units.iter().copied()) {
            match c {
                Err(lone) => out.push_str(&escaped(rng, lone.unpaired_surrogate())),
                Ok(c) if rng.u8(0..3) == 0 => {
                    let mut buffer = [0u16; 2];
                    for unit in c.encode_utf16(&mut buffer) {
                        out.push_str(&escaped(rng, *unit));
                    }
                }
                Ok('"') => out.push_str("\\\""),
                Ok('\\') => out.push_str("\\\\"),
                Ok('\n') => out.push_str("\\n"),
                Ok(c) => out.push(c),
            }
        }
        out.push('"');
    }

    #[test]
    fn property_different_values_never_share_a_fingerprint() {
        let mut rng = fastrand::Rng::with_seed(7493);
        let pointers = ["/v".to_string()];
        let scope = crate::pipeline::key::Scope::from_headers(
            &HeaderMap::new(),
            &[],
            true,
            &idemgate_store::scope_key::ScopeKey::new(&[0; 32], "test"),
        )
        .unwrap();
        let (mut merged, mut apart) = (0, 0);
        for _ in 0..3000 {
            let a = random_json(&mut rng, 3);
            let b = match rng.u8(0..3) {
                0 => a.clone(),
                1 => mutated(&mut rng, &a),
                _ => random_json(&mut rng, 3),
            };
            let [text_a, text_b] = [&a, &b].map(|value| {
                let mut text = String::new();
                render(&mut rng, value, &mut text);
                text
            });
            // The fingerprint of the body, and the key derived from it as a field.
            let [ours, theirs] = [&text_a, &text_b].map(|text| {
                let field = format!(r#"{{"v":{text}}}"#);
                (
                    fp(Method::POST, "/t", JSON, &[], text),
                    IdempotencyKey::derive_from_body(&scope, &pointers, field.as_bytes()),
                )
            });
            if !a.same(&b) {
                apart += 1;
                assert!(
                    ours.0 != theirs.0 && ours.1 != theirs.1,
                    "merged: {text_a} / {text_b}"
                );
            } else if a.is_exact() {
                merged += 1;
                assert_eq!(ours, theirs, "{text_a} / {text_b}");
            }
        }
        // Both sides of the property were exercised.
        assert!(
            merged > 300 && apart > 1500,
            "{merged} merged, {apart} apart"
        );
    }

    #[test]
    fn json_media_types() {
        let with = |ct: &str| {
            let mut h = HeaderMap::new();
            h.insert(CONTENT_TYPE, HeaderValue::from_str(ct).unwrap());
            is_json(&h)
        };
        assert!(with("application/json"));
        assert!(with("Application/JSON; charset=utf-8"));
        assert!(with("application/problem+json"));
        assert!(!with("text/json-ish"));
        assert!(!is_json(&HeaderMap::new()));
    }
}
