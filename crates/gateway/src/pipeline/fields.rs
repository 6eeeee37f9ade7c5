//! Phase 0, beside the path and the host: a request's fields as the
//! gateway can pass them on — an HTTP/2 request's as HTTP/1.1 would have
//! brought them, and a body in no transfer coding hyper cannot undo.
//!
//! HTTP/1.1's parser drops the whitespace around a field value, and a
//! client sends its cookie on one `Cookie` line (most do); an HTTP/2 client sends
//! values as they are and may split its cookie into crumbs, one field each
//! (RFC 9113 §8.2.3). What reads fields — a route's `scope_headers` and
//! `fingerprint_headers`, the key, the upstream, which hears HTTP/1.1 —
//! must see one value for one request however it came, or a write made
//! over one version and retried over the other is a new operation (a
//! second write upstream).
//!
//! Invariant: after [`normalize`], a request carries at most one `cookie`
//! field, its crumbs (HTTP/2) or lines (HTTP/1.1, which RFC 6265 forbids
//! but clients send) joined with `"; "` in the order sent; and an
//! HTTP/2 request with a field value that starts or ends with a space or a
//! tab, which RFC 9113 §8.2.1 makes malformed and no intermediary may
//! forward, is refused ([`FieldError::Padded`], 400 `invalid-header`)
//! before anything reads it. An HTTP/1.1 request's other fields are left
//! as they came, and one whose body is in a transfer coding other than `chunked`, which
//! hyper does not undo and the upstream would get still coded: refused
//! ([`FieldError::Coded`], 501 `unsupported-transfer-coding`).

use http::header::{self, COOKIE, HeaderValue};
use http::{HeaderMap, Request, Version};

/// Why a request's fields were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FieldError {
    #[error(
        "the value of the `{name}` header starts or ends with whitespace, which makes an HTTP/2 request malformed (RFC 9113 §8.2.1); nothing was sent"
    )]
    Padded { name: String },
    #[error(
        "the request body is in the transfer coding `{coding}`, which the gateway does not decode (send it chunked, or with a Content-Length); nothing was sent"
    )]
    Coded { coding: String },
}

/// Brings an HTTP/2 request's fields into HTTP/1.1's form, in place, and
/// refuses what cannot be passed on, as the module doc says.
pub fn normalize<B>(request: &mut Request<B>) -> Result<(), FieldError> {
    if request.version() != Version::HTTP_2 {
        if let Some(coding) = foreign_coding(request.headers()) {
            return Err(FieldError::Coded { coding });
        }
        join_cookies(request.headers_mut());
        return Ok(());
    }
    let headers = request.headers_mut();
    if let Some((name, _)) = headers.iter().find(|(_, value)| padded(value)) {
        return Err(FieldError::Padded {
            name: name.as_str().to_string(),
        });
    }
    join_cookies(headers);
    Ok(())
}

/// Several `cookie` fields made one, joined with `"; "` in the order sent,
/// the blank ones left out: a blank value is no cookie (a scope reads it
/// as none), and joined in it would make `a=1; ; b=2` another scope than
/// `a=1; b=2`, and blank lines alone a cookie. Only blank ones: none.
fn join_cookies(headers: &mut HeaderMap) {
    let mut fields = headers.get_all(COOKIE).iter();
    let (Some(_), Some(_)) = (fields.next(), fields.next()) else {
        return;
    };
    let blank = |value: &&[u8]| value.iter().all(|b| matches!(b, b' ' | b'\t'));
    let crumbs: Vec<&[u8]> = headers
        .get_all(COOKIE)
        .iter()
        .map(HeaderValue::as_bytes)
        .filter(|value| !blank(value))
        .collect();
    // Made of valid values and "; ", it is always a valid value.
    match HeaderValue::from_bytes(&crumbs.join(&b"; "[..])) {
        Ok(cookie) if !crumbs.is_empty() => {
            headers.insert(COOKIE, cookie);
        }
        _ => {
            headers.remove(COOKIE);
        }
    }
}

/// A transfer coding a message's `Transfer-Encoding` names that hyper does
/// not undo, if any: one other than `chunked` (and `identity`, which
/// changes nothing), or `chunked` a second time. hyper undoes one
/// `chunked` only, and the header goes as hop-by-hop, so a body in another
/// coding (`gzip, chunked`) would be passed on still coded, with nothing
/// saying so: such a message is refused instead (RFC 9112 §6.1: 501 for a
/// request). Empty list elements are skipped (RFC 9110 §5.6.1).
pub(crate) fn foreign_coding(headers: &HeaderMap) -> Option<String> {
    let codings = || {
        headers
            .get_all(header::TRANSFER_ENCODING)
            .iter()
            .flat_map(|value| value.to_str().unwrap_or("?").split(','))
            .map(|coding| coding.split(';').next().unwrap_or_default().trim())
            .filter(|coding| !coding.is_empty() && !coding.eq_ignore_ascii_case("identity"))
    };
    let chunked = |coding: &&str| coding.eq_ignore_ascii_case("chunked");
    if let Some(coding) = codings().find(|coding| !chunked(coding)) {
        return Some(coding.to_ascii_lowercase());
    }
    (codings().filter(chunked).count() > 1).then(|| "chunked, chunked".to_string())
}

/// Whether a value starts or ends with a space or a tab.
fn padded(value: &HeaderValue) -> bool {
    let bytes = value.as_bytes();
    let blank = |b: Option<&u8>| matches!(b, Some(b' ' | b'\t'));
    blank(bytes.first()) || blank(bytes.last())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_coding_hyper_does_not_undo_is_named() {
        let coding = |values: &[&str]| {
            let mut headers = HeaderMap::new();
            for value in values {
                headers.append(header::TRANSFER_ENCODING, value.parse().unwrap());
            }
            foreign_coding(&headers)
        };
        for undone in [
            &["chunked"][..],
            &["identity"],
            &[", chunked"],
            &["identity, chunked"],
            &["Chunked"],
            &[],
        ] {
            assert_eq!(coding(undone), None, "{undone:?}");
        }
        assert_eq!(coding(&["gzip, chunked"]), Some("gzip".into()));
        assert_eq!(coding(&["GZIP;q=1, chunked"]), Some("gzip".into()));
        assert!(coding(&["chunked, chunked"]).is_some());
        assert!(coding(&["chunked", "chunked"]).is_some());
    }

    fn request(version: Version, fields: &[(&str, &str)]) -> Request<()> {
        let mut request = Request::builder().version(version);
        for (name, value) in fields {
            request = request.header(*name, *value);
        }
        request.body(()).unwrap()
    }

    fn cookies(request: &Request<()>) -> Vec<&str> {
        let all = request.headers().get_all(COOKIE).iter();
        all.map(|v| v.to_str().unwrap()).collect()
    }

    #[test]
    fn http2_cookie_crumbs_become_one_cookie_in_their_order() {
        let crumbs = [("cookie", "b=2"), ("x-other", "y"), ("cookie", "a=1")];
        let mut h2 = request(Version::HTTP_2, &crumbs);
        normalize(&mut h2).unwrap();
        assert_eq!(cookies(&h2), ["b=2; a=1"]);
        assert_eq!(h2.headers()["x-other"], "y");
        let mut one = request(Version::HTTP_2, &[("cookie", "a=1; b=2")]);
        normalize(&mut one).unwrap();
        assert_eq!(cookies(&one), ["a=1; b=2"]);
        // Two HTTP/1.1 lines likewise: a write sent so and retried over
        // HTTP/2 with the same cookie in crumbs was another scope.
        let mut h1 = request(Version::HTTP_11, &crumbs);
        normalize(&mut h1).unwrap();
        assert_eq!(cookies(&h1), ["b=2; a=1"]);
        // Blank ones are no cookie: left out, and alone, none at all.
        let with_blank = [("cookie", "a=1"), ("cookie", ""), ("cookie", "b=2")];
        for version in [Version::HTTP_11, Version::HTTP_2] {
            let mut sent = request(version, &with_blank);
            normalize(&mut sent).unwrap();
            assert_eq!(cookies(&sent), ["a=1; b=2"], "{version:?}");
            let mut blank = request(version, &[("cookie", ""), ("cookie", "")]);
            normalize(&mut blank).unwrap();
            assert!(cookies(&blank).is_empty(), "{version:?}");
        }
    }

    #[test]
    fn http2_values_with_whitespace_around_them_are_refused() {
        for value in ["Bearer a ", " Bearer a", "\tBearer a", "Bearer a\t", " "] {
            let mut h2 = request(Version::HTTP_2, &[("authorization", value)]);
            let refused = normalize(&mut h2).unwrap_err();
            assert!(refused.to_string().contains("`authorization`"), "{refused}");
        }
        for value in ["Bearer a", "", "a b"] {
            let mut h2 = request(Version::HTTP_2, &[("authorization", value)]);
            assert_eq!(normalize(&mut h2), Ok(()), "{value:?}");
        }
        let mut h1 = request(Version::HTTP_11, &[("authorization", "Bearer a ")]);
        assert_eq!(normalize(&mut h1), Ok(()));
    }
}
