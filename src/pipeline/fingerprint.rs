//! The `fingerprint` phase: what makes two requests with one key "the same
//! operation". A key reused with a different fingerprint is refused (422).
//!
//! The fingerprint is a SHA-256 over the method, the path and query, the
//! route's `fingerprint_headers` and the body. A JSON body is canonicalised
//! (RFC 8785, after removing `ignore_fields`) so re-serialising the same
//! payload is not a change; any other body, or JSON that does not parse, is
//! hashed as sent. Every part is length-prefixed, so no two different requests
//! can run together into the same bytes.

use http::header::{CONTENT_TYPE, HeaderName};
use http::{HeaderMap, Method};
use sha2::{Digest, Sha256};

use crate::canonical_json;

/// A request's fingerprint, hex-encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint(String);

/// What the fingerprint is computed over.
pub struct FingerprintInput<'a> {
    pub method: &'a Method,
    pub path_and_query: &'a str,
    pub headers: &'a HeaderMap,
    pub fingerprint_headers: &'a [HeaderName],
    pub ignore_fields: &'a [String],
    pub body: &'a [u8],
}

impl Fingerprint {
    pub fn compute(input: &FingerprintInput<'_>) -> Self {
        let mut hasher = Sha256::new();
        let mut part = |bytes: &[u8]| {
            hasher.update((bytes.len() as u64).to_be_bytes());
            hasher.update(bytes);
        };
        part(b"idemgate-fingerprint-v1");
        part(input.method.as_str().as_bytes());
        part(input.path_and_query.as_bytes());
        for name in input.fingerprint_headers {
            part(name.as_str().as_bytes());
            let values: Vec<_> = input.headers.get_all(name).iter().collect();
            part(&(values.len() as u64).to_be_bytes());
            for value in values {
                part(value.as_bytes());
            }
        }
        match canonical_body(input) {
            Some(canonical) => {
                part(b"json");
                part(&canonical);
            }
            None => {
                part(b"raw");
                part(input.body);
            }
        }
        Fingerprint(hex::encode(hasher.finalize()))
    }

    /// A fingerprint read back from the store.
    pub fn from_stored(hex: String) -> Self {
        Fingerprint(hex)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The canonical JSON of a JSON body, or `None` for any other body.
fn canonical_body(input: &FingerprintInput<'_>) -> Option<Vec<u8>> {
    if !is_json(input.headers) {
        return None;
    }
    let mut value: serde_json::Value = serde_json::from_slice(input.body).ok()?;
    for pointer in input.ignore_fields {
        canonical_json::remove_pointer(&mut value, pointer);
    }
    Some(canonical_json::canonicalize(&value))
}

/// `application/json` or any `+json` media type, parameters ignored.
pub fn is_json(headers: &HeaderMap) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;
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
        Fingerprint::compute(&FingerprintInput {
            method: &method,
            path_and_query: path,
            headers: &headers,
            fingerprint_headers: &[CONTENT_TYPE],
            ignore_fields: &ignore,
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
    fn ignored_fields_do_not_count() {
        let a = fp(
            Method::POST,
            "/t",
            JSON,
            &["/nonce", "/meta/sent_at"],
            r#"{"a":1,"nonce":"x","meta":{"sent_at":1}}"#,
        );
        let b = fp(
            Method::POST,
            "/t",
            JSON,
            &["/nonce", "/meta/sent_at"],
            r#"{"a":1,"nonce":"y","meta":{"sent_at":2}}"#,
        );
        assert_eq!(a, b);
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
