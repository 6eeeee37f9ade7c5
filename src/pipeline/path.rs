//! Phase 0, before `route`: the request path in normal form (RFC 3986
//! §6.2.2), so that one resource has one spelling.
//!
//! Invariant: nothing routes, fingerprints or forwards a path that is not in
//! normal form. [`normalize`] runs once, at the top of `Proxy::handle`, and
//! rewrites the request's URI in place; every later phase — the reserved
//! `/.idemgate/` prefix, route selection, the fingerprint, the stored request
//! summary and the upstream's request line — reads that one normalized path.
//! Without it `/./api/echo`, `/%61pi/echo` or `/x/../api/echo` would slip
//! past a route at `/api` to a less protective one, while the upstream
//! (resolving them) performed the same write.
//!
//! The normal form, in this order:
//! 1. percent-encoded unreserved characters (`A–Z a–z 0–9 - . _ ~`) are
//!    decoded (`%61` → `a`, `%2E` → `.`); every other percent-encoding is
//!    kept, with upper-case hex digits (`%2f` → `%2F`): a reserved character
//!    stays data, `%2F` is never a `/`;
//! 2. dot-segments are removed (§5.2.4) — after step 1, so `%2E%2E` is a
//!    `..` too, as it is to an upstream that decodes before it resolves.
//!
//! The query is kept as sent. A path that cannot be normalized — one that
//! does not start with `/` (`*`, an authority) or has a `%` not followed by
//! two hex digits — is refused ([`PathError`], 400 `invalid-path`).

use std::borrow::Cow;

use http::Uri;
use http::uri::PathAndQuery;

/// Why a request path cannot be normalized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("the request path must start with `/`")]
    NotAbsolute,
    #[error("the request path has a `%` not followed by two hex digits (at byte {at})")]
    BadPercentEncoding { at: usize },
    #[error("the normalized request path is not a valid request target")]
    Unrepresentable,
}

/// Rewrites `uri`'s path into normal form, keeping its query (and scheme and
/// authority, for an absolute-form request).
pub fn normalize(uri: &mut Uri) -> Result<(), PathError> {
    let Cow::Owned(path) = normal_form(uri.path())? else {
        return Ok(());
    };
    let path_and_query = match uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path,
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query =
        Some(PathAndQuery::try_from(path_and_query).map_err(|_| PathError::Unrepresentable)?);
    *uri = Uri::from_parts(parts).map_err(|_| PathError::Unrepresentable)?;
    Ok(())
}

/// `path` in normal form; borrowed when it already is.
pub fn normal_form(path: &str) -> Result<Cow<'_, str>, PathError> {
    if !path.starts_with('/') {
        return Err(PathError::NotAbsolute);
    }
    let decoded = normalize_percent_encodings(path)?;
    let has_dot_segment = decoded.split('/').any(|s| s == "." || s == "..");
    if !has_dot_segment {
        return Ok(decoded);
    }
    Ok(Cow::Owned(remove_dot_segments(&decoded)))
}

/// Step 1: unreserved characters decoded, other encodings upper-cased.
fn normalize_percent_encodings(path: &str) -> Result<Cow<'_, str>, PathError> {
    let bytes = path.as_bytes();
    let Some(first) = bytes.iter().position(|&b| b == b'%') else {
        return Ok(Cow::Borrowed(path));
    };
    let mut out = String::with_capacity(path.len());
    out.push_str(&path[..first]);
    let mut i = first;
    while i < bytes.len() {
        if bytes[i] != b'%' {
            // Copy up to the next `%` whole: the path is valid UTF-8 and
            // `%` is ASCII, so the slice ends on a character boundary.
            let next = bytes[i..]
                .iter()
                .position(|&b| b == b'%')
                .map_or(bytes.len(), |n| i + n);
            out.push_str(&path[i..next]);
            i = next;
            continue;
        }
        let hex = |at: usize| bytes.get(at).and_then(|&b| (b as char).to_digit(16));
        let (Some(high), Some(low)) = (hex(i + 1), hex(i + 2)) else {
            return Err(PathError::BadPercentEncoding { at: i });
        };
        let byte = (high * 16 + low) as u8;
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            const HEX: &[u8; 16] = b"0123456789ABCDEF";
            out.extend([
                '%',
                HEX[usize::from(byte >> 4)].into(),
                HEX[usize::from(byte & 0xF)].into(),
            ]);
        }
        i += 3;
    }
    // Already normal (upper-case, reserved only): the URI need not change.
    Ok(if out == path {
        Cow::Borrowed(path)
    } else {
        Cow::Owned(out)
    })
}

/// Step 2, RFC 3986 §5.2.4 for an absolute path: `.` segments vanish, `..`
/// removes the segment before it (never above the root), and a path that
/// ended in a dot-segment still ends in `/`. Empty segments are kept.
fn remove_dot_segments(path: &str) -> String {
    let mut kept: Vec<&str> = Vec::new();
    let segments: Vec<&str> = path[1..].split('/').collect();
    let last = segments.len() - 1;
    for (n, segment) in segments.into_iter().enumerate() {
        match segment {
            "." => {}
            ".." => {
                kept.pop();
            }
            segment => kept.push(segment),
        }
        if n == last && matches!(segment, "." | "..") {
            kept.push("");
        }
    }
    format!("/{}", kept.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn normal(path: &str) -> String {
        normal_form(path)
            .unwrap_or_else(|e| panic!("{path}: {e}"))
            .into_owned()
    }

    /// RFC 3986 §5.4.1 and §5.4.2: the references resolved against
    /// `http://a/b/c/d;p?q`, as the merged paths `remove_dot_segments` gets.
    #[test]
    fn dot_segments_are_removed_as_rfc_3986_resolves_them() {
        let examples = [
            ("/b/c/g", "/b/c/g"),
            ("/b/c/./g", "/b/c/g"),
            ("/b/c/g/", "/b/c/g/"),
            ("/g", "/g"),
            ("/b/c/.", "/b/c/"),
            ("/b/c/./", "/b/c/"),
            ("/b/c/..", "/b/"),
            ("/b/c/../", "/b/"),
            ("/b/c/../g", "/b/g"),
            ("/b/c/../..", "/"),
            ("/b/c/../../", "/"),
            ("/b/c/../../g", "/g"),
            // §5.4.2, abnormal examples
            ("/b/c/../../../g", "/g"),
            ("/b/c/../../../../g", "/g"),
            ("/./g", "/g"),
            ("/../g", "/g"),
            ("/b/c/g.", "/b/c/g."),
            ("/b/c/.g", "/b/c/.g"),
            ("/b/c/g..", "/b/c/g.."),
            ("/b/c/..g", "/b/c/..g"),
            ("/b/c/./../g", "/b/g"),
            ("/b/c/./g/.", "/b/c/g/"),
            ("/b/c/g/./h", "/b/c/g/h"),
            ("/b/c/g/../h", "/b/c/h"),
            ("/b/c/g;x=1/./y", "/b/c/g;x=1/y"),
            ("/b/c/g;x=1/../y", "/b/c/y"),
            // §5.2.4's own example
            ("/a/b/c/./../../g", "/a/g"),
        ];
        for (merged, expected) in examples {
            assert_eq!(normal(merged), expected, "{merged}");
        }
    }

    #[test]
    fn edge_paths_keep_their_shape() {
        assert_eq!(normal("/"), "/");
        assert_eq!(normal("/."), "/");
        assert_eq!(normal("/.."), "/");
        assert_eq!(normal("/a//b"), "/a//b");
        assert_eq!(normal("/a//.."), "/a/");
        assert_eq!(normal("/api/../v1/x"), "/v1/x");
        assert_eq!(normal("/x/../api/echo"), "/api/echo");
    }

    #[test]
    fn unreserved_encodings_are_decoded_and_the_rest_upper_cased() {
        assert_eq!(normal("/%61pi/echo"), "/api/echo");
        assert_eq!(normal("/%41%7a%30%2d%5F%7e"), "/Az0-_~");
        assert_eq!(normal("/a%2fb"), "/a%2Fb", "an encoded `/` is data");
        assert_eq!(normal("/a%3f%23%25%20"), "/a%3F%23%25%20");
        assert_eq!(normal("/caf%c3%a9"), "/caf%C3%A9");
        // Decoded dots are dot-segments, as to an upstream that decodes first.
        assert_eq!(normal("/api/%2E%2e/v1"), "/v1");
        assert_eq!(normal("/%2E/api"), "/api");
        assert_eq!(normal("/a.%2E"), "/a..");
    }

    #[test]
    fn a_path_in_normal_form_is_borrowed() {
        for path in ["/", "/api/echo", "/a/.b/c..", "/a%2Fb"] {
            assert!(matches!(normal_form(path), Ok(Cow::Borrowed(_))), "{path}");
        }
    }

    #[test]
    fn paths_that_cannot_be_normalized_are_refused() {
        assert_eq!(normal_form(""), Err(PathError::NotAbsolute));
        assert_eq!(normal_form("*"), Err(PathError::NotAbsolute));
        assert_eq!(normal_form("api/echo"), Err(PathError::NotAbsolute));
        let bad = |path| matches!(normal_form(path), Err(PathError::BadPercentEncoding { .. }));
        for path in ["/%zz", "/%4", "/a%", "/%%41", "/%4g"] {
            assert!(bad(path), "{path}");
        }
    }

    #[test]
    fn the_uri_keeps_its_query_and_origin() {
        let mut uri: Uri = "/%61pi/./echo?a=%2e&b=../x".parse().unwrap();
        normalize(&mut uri).unwrap();
        assert_eq!(uri, "/api/echo?a=%2e&b=../x");
        let mut absolute: Uri = "http://h:1/x/../y?q".parse().unwrap();
        normalize(&mut absolute).unwrap();
        assert_eq!(absolute, "http://h:1/y?q");
        let mut bad: Uri = "/%zz".parse().unwrap();
        assert_eq!(
            normalize(&mut bad),
            Err(PathError::BadPercentEncoding { at: 1 })
        );
    }
}
