//! Phase 0, before `route`: the request path in normal form (RFC 3986
//! §6.2.2), so that one resource has one spelling.
//!
//! Invariant: nothing routes, fingerprints or forwards a path that is not in
//! normal form. [`normalize`] runs once, at the top of `Proxy::handle`, and
//! rewrites the request's URI in place; every later phase — the reserved
//! `/.idemgate/` prefix, route selection, the fingerprint, the stored request
//! summary and the upstream's request line — reads that one normalized path.
//! Without it `/./api/echo`, `/%61pi/echo`, `/x/../api/echo` or `//api/echo`
//! would slip past a route at `/api` to a less protective one, while the
//! upstream (resolving them) performed the same write.
//!
//! The normal form, in this order:
//! 1. percent-encoded unreserved characters (`A–Z a–z 0–9 - . _ ~`) are
//!    decoded (`%61` → `a`, `%2E` → `.`); every other percent-encoding is
//!    kept, with upper-case hex digits (`%2f` → `%2F`): a reserved character
//!    stays data, `%2F` is never a `/`; and a byte no path may hold as
//!    itself, which a lenient parser (hyper's among them) takes — a
//!    non-ASCII character's UTF-8, `"`, `{`, `}`, `|`… — is encoded, so
//!    `/café` and `/caf%C3%A9` are one path;
//! 2. empty segments are merged (`//` → `/`), as nginx's `merge_slashes` and
//!    most frameworks do before they route: an upstream that merges would
//!    perform `/o//prot/x` as `/o/prot/x`, so idemgate must route it there;
//!    and the upstream then receives the merged path, so one that does not
//!    merge never sees a second spelling either;
//! 3. dot-segments are removed (§5.2.4) — after steps 1 and 2, so `%2E%2E` is
//!    a `..` too and `/a//..` is `/`, as to an upstream that decodes and
//!    merges before it resolves.
//!
//! The query is kept as sent. A path that cannot be normalized — one that
//! does not start with `/` (`*`, an authority) or has a `%` not followed by
//! two hex digits — is refused ([`PathError`], 400 `invalid-path`).
//!
//! Two spellings have no one reading, so no normal form can settle them: a
//! `;` parameter in a segment (`/api;x/tasks` is `/api/tasks` to a servlet
//! container, `/api;x/tasks` to nginx) and an encoded delimiter — `%2F`,
//! `%3B`, or another character a segment may also hold as itself, such as
//! `%3A` or `%40` ([`is_delimiter`]): a `/`, `;`, `:` or `@` to an upstream
//! that decodes before it routes, data to one that does not; and
//! re-encoding or decoding it would change what a signed request signs.
//! They are kept as sent, and [`readings`] lists what other
//! upstreams make of them, so that route selection can refuse a path whose
//! route those readings would change (`route::select_unambiguous`);
//! [`endpoint`] reads them the widest way, so that a profile scoping keys
//! by endpoint takes every spelling of one for one.
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
    /// An upstream that strips `;` parameters, decodes encoded delimiters
    /// (`%2F`, `%3B`, `%3A`…), or routes without regard to case or to a
    /// trailing `/` would take the path for `reading`, on another route.
    #[error(
        "the request path belongs to another route when read as an upstream may read it ({reading}: `;` parameters stripped, encoded delimiters such as `%2F`, `%3B` or `%3A` decoded, letters in another case, or a `/` at the end); send that path instead"
    )]
    AnotherRouteWhenRead { reading: String },
    /// A route's prefix that upstreams read as another path: a request
    /// under it would be refused as [`PathError::AnotherRouteWhenRead`].
    #[error(
        "`{prefix}` is `{reading}` to an upstream that strips `;` parameters or decodes what a path may hold as itself (`%2F`, `%3B`, `%3A`, `%40`…): write the prefix as the path that upstream reads, or the route serves nothing"
    )]
    PrefixReadOtherwise { prefix: String, reading: String },
}

/// A route's `path_prefix` as the normal-form paths it is matched against
/// spell it (`/%61pi` is `/api`), refused when an upstream reads it as
/// another path ([`readings`]): each path under it would be, and route
/// selection would refuse them all.
pub(crate) fn prefix(prefix: &str) -> Result<String, PathError> {
    let normal = normal_form(prefix)?.into_owned();
    match readings(&normal).into_iter().next() {
        Some(reading) => Err(PathError::PrefixReadOtherwise {
            prefix: normal,
            reading,
        }),
        None => Ok(normal),
    }
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

/// `path` without its segments' parameters (`;jsessionid=…`, RFC 3986
/// §3.3), as logs and traces write it: servlet-style session ids, and
/// other credentials, travel there; borrowed when it has none.
pub(crate) fn without_parameters(path: &str) -> Cow<'_, str> {
    if !path.contains(';') {
        return Cow::Borrowed(path);
    }
    let segments: Vec<&str> = path
        .split('/')
        .map(|segment| segment.split_once(';').map_or(segment, |(kept, _)| kept))
        .collect();
    Cow::Owned(segments.join("/"))
}

/// `path` in normal form; borrowed when it already is.
pub fn normal_form(path: &str) -> Result<Cow<'_, str>, PathError> {
    if !path.starts_with('/') {
        return Err(PathError::NotAbsolute);
    }
    let decoded = normalize_percent_encodings(path)?;
    let merged = match merge_empty_segments(&decoded) {
        Some(merged) => Cow::Owned(merged),
        None => decoded,
    };
    // Most paths hold no `.` at all: one byte scan instead of a split.
    let has_dot_segment = merged.contains('.') && merged.split('/').any(|s| s == "." || s == "..");
    if !has_dot_segment {
        return Ok(merged);
    }
    Ok(Cow::Owned(remove_dot_segments(&merged)))
}

/// The normal forms other upstreams give the normal-form `path`, where they
/// differ from it: with its encoded delimiters ([`is_delimiter`]) decoded
/// (an upstream that decodes before it routes), with all but `%2F`
/// decoded (one that keeps an encoded slash as data: Apache's
/// `AllowEncodedSlashes NoDecode`, Tomcat's `passthrough`), with every
/// segment's `;` parameters stripped (a servlet container), and each
/// decoding stripped too. Empty for a path with neither spelling, as most
/// are; no reading twice.
pub fn readings(path: &str) -> Vec<String> {
    let decoded = decode_delimiters(path, Slash::Decoded);
    if decoded.is_none() && !path.contains(';') {
        return Vec::new();
    }
    let slash_kept = decode_delimiters(path, Slash::Kept);
    let decodings = [decoded, slash_kept].into_iter().flatten();
    let mut read: Vec<String> = decodings.collect();
    let stripped: Vec<String> = std::iter::once(path)
        .chain(read.iter().map(String::as_str))
        .filter(|p| p.contains(';'))
        .map(strip_parameters)
        .collect();
    read.extend(stripped);
    let mut readings: Vec<String> = Vec::with_capacity(read.len());
    for reading in read.into_iter().map(renormalized) {
        if reading != path && !readings.contains(&reading) {
            readings.push(reading);
        }
    }
    readings
}

/// The endpoint the normal-form `path` names, as a profile that scopes
/// keys by endpoint reads it (`Wire::scope_path`): the path as the
/// widest of its [`readings`] gives it — encoded delimiters decoded, then
/// every segment's `;` parameters stripped — with a trailing `/` dropped,
/// since some upstream reads each of those spellings as the same endpoint
/// (one that decodes before it routes, a servlet container, most
/// frameworks); a key reused across them is then one scope's, and its
/// changed path a `key-reused`, never a second write.
pub fn endpoint(path: &str) -> Cow<'_, str> {
    let decoded = decode_delimiters(path, Slash::Decoded);
    let with_parameters = decoded.as_deref().unwrap_or(path);
    let read = if with_parameters.contains(';') {
        Some(strip_parameters(with_parameters))
    } else {
        decoded
    };
    let read = read.map_or(Cow::Borrowed(path), |read| Cow::Owned(renormalized(read)));
    match read.strip_suffix('/').filter(|p| !p.is_empty()) {
        Some(trimmed) => Cow::Owned(trimmed.to_string()),
        None => read,
    }
}

/// Whether a path may hold `byte` as itself ([`AS_SENT`]) and spell it
/// encoded too, with another meaning to some upstream: the separators `/`
/// and `;`, the other sub-delims, `:` and `@` (RFC 3986's `pchar` less
/// the unreserved characters the normal form decodes). An upstream that
/// decodes its path before it routes or reads it (nginx's `location`,
/// Go's `URL.Path`, Express's and Django's parameters) takes `%3A` for
/// `:`, so `/cs%3A1` and `/cs:1` are one endpoint to it.
fn is_delimiter(byte: u8) -> bool {
    let unreserved = byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~');
    AS_SENT[usize::from(byte)] && !unreserved && byte != b'%'
}

/// Whether a decoding reads `%2F` as a `/` too.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Slash {
    Decoded,
    Kept,
}

/// The normal-form `path` with its encoded delimiters ([`is_delimiter`])
/// decoded, `%2F` as `slash` says, as an upstream that decodes before it
/// routes reads it (the normal form spells encodings upper-case, and
/// every `%` it holds starts one); `None` when it holds none.
fn decode_delimiters(path: &str, slash: Slash) -> Option<String> {
    let (mut read, mut copied) = (String::new(), 0);
    for (at, _) in path.match_indices('%') {
        let delimiter = path
            .get(at + 1..at + 3)
            .and_then(|hex| u8::from_str_radix(hex, 16).ok())
            .filter(|&byte| is_delimiter(byte) && (byte != b'/' || slash == Slash::Decoded));
        if let Some(byte) = delimiter {
            read.push_str(&path[copied..at]);
            read.push(char::from(byte));
            copied = at + 3;
        }
    }
    // A path starts with `/`: nothing decoded is nothing copied.
    if copied == 0 {
        return None;
    }
    read.push_str(&path[copied..]);
    Some(read)
}

/// A reading of a normal-form path in normal form again: decoding and
/// stripping leave it percent-normal, so only merging and dot-segments can
/// still change it.
fn renormalized(read: String) -> String {
    match normal_form(&read) {
        Ok(Cow::Owned(normal)) => normal,
        // Already normal; or refused, which a path that starts with `/`
        // and holds only valid encodings never is.
        Ok(Cow::Borrowed(_)) | Err(_) => read,
    }
}

/// `path` with each segment cut at its first `;`, as a servlet container
/// does before it routes (`/a;x/b;y=1` → `/a/b`).
fn strip_parameters(path: &str) -> String {
    path.split('/')
        .map(|segment| segment.split_once(';').map_or(segment, |(kept, _)| kept))
        .collect::<Vec<_>>()
        .join("/")
}

/// Step 2: runs of `/` as one; `None` when there are none.
fn merge_empty_segments(path: &str) -> Option<String> {
    if !path.as_bytes().windows(2).any(|pair| pair == b"//") {
        return None;
    }
    let mut out = String::with_capacity(path.len());
    for c in path.chars() {
        if !(c == '/' && out.ends_with('/')) {
            out.push(c);
        }
    }
    Some(out)
}

/// The bytes a path holds as themselves (RFC 3986 §3.3: `pchar` and `/`),
/// and `%`, which opens an encoding.
const AS_SENT: [bool; 256] = {
    let mut kept = [false; 256];
    let mut byte = 0;
    while byte < 256 {
        let b = byte as u8;
        kept[byte] = b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'-' | b'.' | b'_' | b'~' // unreserved
                    | b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'=' // sub-delims
                    | b':' | b'@' | b'/' | b'%'
            );
        byte += 1;
    }
    kept
};

/// Step 1: unreserved characters decoded, other encodings upper-cased, and
/// every byte a path may not hold as itself (a non-ASCII character's UTF-8
/// bytes, `"`, `{`, `}`…, which lenient parsers take) encoded.
fn normalize_percent_encodings(path: &str) -> Result<Cow<'_, str>, PathError> {
    let bytes = path.as_bytes();
    let Some(first) = bytes
        .iter()
        .position(|&b| b == b'%' || !AS_SENT[usize::from(b)])
    else {
        return Ok(Cow::Borrowed(path));
    };
    let mut out = String::with_capacity(path.len() + 8);
    // ASCII up to `first`: a character boundary.
    out.push_str(&path[..first]);
    let mut i = first;
    while i < bytes.len() {
        let byte = bytes[i];
        if byte != b'%' {
            if AS_SENT[usize::from(byte)] {
                out.push(char::from(byte));
            } else {
                push_encoded(&mut out, byte);
            }
            i += 1;
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
            push_encoded(&mut out, byte);
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

/// `%` and `byte` in two upper-case hex digits.
fn push_encoded(out: &mut String, byte: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.extend([
        '%',
        HEX[usize::from(byte >> 4)].into(),
        HEX[usize::from(byte & 0xF)].into(),
    ]);
}

/// Step 3, RFC 3986 §5.2.4 for an absolute path: `.` segments vanish, `..`
/// removes the segment before it (never above the root), and a path that
/// ended in a dot-segment still ends in `/`.
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

    #[test]
    fn parameters_are_left_out_of_what_is_logged() {
        assert!(matches!(without_parameters("/a/b"), Cow::Borrowed("/a/b")));
        assert_eq!(
            without_parameters("/app;jsessionid=S/orders;v=1/7"),
            "/app/orders/7"
        );
        assert_eq!(without_parameters("/a%3Bb/;x"), "/a%3Bb/");
    }

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
        assert_normal_forms(&examples);
    }

    fn assert_normal_forms(examples: &[(&str, &str)]) {
        for (path, expected) in examples {
            assert_eq!(normal(path), *expected, "{path}");
        }
    }

    #[test]
    fn edge_paths_keep_their_shape() {
        assert_eq!(normal("/"), "/");
        assert_eq!(normal("/."), "/");
        assert_eq!(normal("/.."), "/");
        assert_eq!(normal("/a//.."), "/");
        assert_eq!(normal("/a/b//"), "/a/b/");
        assert_eq!(normal("/api/../v1/x"), "/v1/x");
        assert_eq!(normal("/x/../api/echo"), "/api/echo");
    }

    #[test]
    fn characters_a_path_may_not_hold_are_percent_encoded() {
        // Non-ASCII (its UTF-8 bytes) and the ASCII outside RFC 3986's
        // pchar: one spelling for what clients send raw or encoded.
        assert_normal_forms(&[
            ("/caf\u{e9}/x", "/caf%C3%A9/x"),
            ("/caf%c3%a9/x", "/caf%C3%A9/x"),
            ("/a{b}/x", "/a%7Bb%7D/x"),
            ("/a\"b|c^d`e\\f<g>h", "/a%22b%7Cc%5Ed%60e%5Cf%3Cg%3Eh"),
            ("/%7bb%7d", "/%7Bb%7D"),
            // What a path may hold stays as sent.
            ("/a:b@c!$&'()*+,;=d-._~", "/a:b@c!$&'()*+,;=d-._~"),
        ]);
    }

    #[test]
    fn an_endpoint_is_its_path_without_parameters_or_a_trailing_slash() {
        assert_eq!(endpoint("/a/b"), "/a/b");
        assert_eq!(endpoint("/a/b/"), "/a/b");
        assert_eq!(endpoint("/a;x/b;y=1/"), "/a/b");
        assert_eq!(endpoint("/"), "/");
        assert_eq!(endpoint("/;x"), "/");
        // A `..` a stripped parameter leaves is a dot-segment, as it is
        // to the servlet container that strips it.
        assert_eq!(endpoint("/a/b/..;x/c"), "/a/c");
    }

    #[test]
    fn an_endpoint_reads_encoded_separators_as_an_upstream_that_decodes() {
        // Normal form upper-cases `%2f` and `%3b` before any endpoint is read.
        for (path, read) in [
            ("/a%2Fb/c", "/a/b/c"),
            ("/a/b%2F", "/a/b"),
            ("/a%3Bv=1/b", "/a/b"),
            ("/a/b%3B", "/a/b"),
            ("/a%2F%2Fb", "/a/b"),
            ("/a/x%2F..%2Fb", "/a/b"),
            ("/a;p%2Fq/b", "/a/q/b"),
        ] {
            assert_eq!(endpoint(path), read, "{path}");
            assert_eq!(endpoint(path), endpoint(read), "{path}");
        }
        assert!(matches!(endpoint("/a/b"), Cow::Borrowed(_)));
    }

    #[test]
    fn empty_segments_merge_before_dot_segments_are_removed() {
        // The last: encoded slashes are data, never merged.
        assert_normal_forms(&[
            ("//", "/"),
            ("/a//b", "/a/b"),
            ("//o/prot/create", "/o/prot/create"),
            ("/o///prot/create", "/o/prot/create"),
            ("/o/.//prot", "/o/prot"),
            ("/o/%2E%2E//prot", "/prot"),
            ("/a%2F%2Fb", "/a%2F%2Fb"),
        ]);
    }

    #[test]
    fn an_endpoint_reads_every_encoded_delimiter_as_itself() {
        for (path, read) in [
            ("/cs%3A1", "/cs:1"),
            ("/u/%40me/x", "/u/@me/x"),
            ("/a%21%24%26%27%28%29%2A%2B%2C%3D", "/a!$&'()*+,="),
            ("/a%3Ab%3Bc/d", "/a:b/d"),
        ] {
            assert_eq!(endpoint(path), read, "{path}");
            assert_eq!(endpoint(path), endpoint(read), "{path}");
        }
        // What a segment may not hold as itself stays encoded: decoding
        // `%25`, `%3F` or `%20` would make another path, not a spelling.
        for kept in ["/a%25b", "/a%3Fb", "/a%23b", "/a%20b", "/caf%C3%A9"] {
            assert!(matches!(endpoint(kept), Cow::Borrowed(_)), "{kept}");
            assert!(readings(kept).is_empty(), "{kept}");
        }
    }

    #[test]
    fn readings_list_what_stripping_and_decoding_upstreams_route_on() {
        let read = |path: &str| readings(path);
        assert!(read("/api/tasks").is_empty());
        assert_eq!(read("/api;x/tasks"), ["/api/tasks"]);
        assert_eq!(read("/api/..;/admin"), ["/admin"]);
        assert_eq!(read("/api/;x/tasks"), ["/api/tasks"]);
        assert_eq!(read("/o%2Fprot/x"), ["/o/prot/x"]);
        assert_eq!(read("/a/x%2F..%2Fb"), ["/a/b"]);
        assert_eq!(read("/a%3Bx/b"), ["/a;x/b", "/a/b"]);
        assert_eq!(read("/a;p%2Fq/b"), ["/a;p/q/b", "/a/b", "/a/q/b"]);
        assert_eq!(read("/v1/payments%3Acharge"), ["/v1/payments:charge"]);
        // An upstream that decodes all but `%2F` (Apache's NoDecode,
        // Tomcat's passthrough) reads a path no full decoding gives.
        let partly = "/v1/payments%3Acharge/a%2F..%2F..%2Fz";
        assert_eq!(
            read(partly),
            ["/v1/z", "/v1/payments:charge/a%2F..%2F..%2Fz"],
            "{partly}"
        );
        assert_eq!(read("/a%3Db;x/c"), ["/a=b;x/c", "/a%3Db/c", "/a=b/c"]);
        // A reading that is the path itself is no other reading.
        assert!(read("/a%2F").iter().all(|p| p != "/a%2F"));
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
        for path in ["/", "/api/echo", "/a/.b/c..", "/a%2Fb", "/a;b/c"] {
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
