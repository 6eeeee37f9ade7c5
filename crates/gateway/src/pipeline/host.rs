//! Phase 0, beside the path: the request's host, one spelling for both
//! HTTP versions.
//!
//! HTTP/2 carries the host in `:authority` (hyper puts it in the request's
//! URI) and rarely a `Host` header; HTTP/1.1 in `Host`, or in an
//! absolute-form target. What reads `host` — a route's `scope_headers` and
//! `fingerprint_headers` — must see one value for one host however it came,
//! or a write made over one version and retried over the other is a new
//! operation (a second write upstream) or no operation at all.
//!
//! Invariant: after [`normalize`], a request carries at most one `host`
//! header: its authority's host and port, lower-cased, without the port
//! its scheme implies (80 for `http`, 443 for `https`); and a request whose
//! `host` names another authority than its HTTP/2 `:authority` (RFC 9113
//! §8.3.1), that has several `Host` lines, that is HTTP/1.1 with no
//! `Host` line and no absolute-form target (RFC 9112 §3.2: a server MUST
//! answer it 400), or whose host is no `host[:port]`, is refused ([`HostError`], 400 `invalid-host`) before
//! anything reads it. An HTTP/1.1 absolute-form target's authority is the
//! host, whatever `Host` says (RFC 9112 §3.2.2), and an empty `Host` names
//! none.

use http::Request;
use http::header::{HOST, HeaderValue};
use http::uri::{Authority, Scheme};

/// Marks a request that came in on a TLS listener (`X-Forwarded-Proto: https`).
#[derive(Debug, Clone, Copy)]
pub struct ViaTls;

/// Why a request's host was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("several Host headers were sent; send one")]
    Several,
    #[error("an HTTP/1.1 request needs a Host header (RFC 9112 §3.2); nothing was sent")]
    Missing,
    #[error("the Host header is not a host[:port]")]
    Invalid,
    #[error("the request's host names a user (userinfo), which no request may carry")]
    UserInfo,
    #[error(
        "the Host header ({host}) names another host than the request's authority ({authority}); nothing was sent"
    )]
    Disagree { host: String, authority: String },
}

/// Brings the request's host into its one spelling, in place, as the
/// module doc says.
pub fn normalize<B>(request: &mut Request<B>) -> Result<(), HostError> {
    let tls = request.extensions().get::<ViaTls>().is_some();
    let scheme = match request.uri().scheme() {
        Some(scheme) => scheme.clone(),
        None if tls => Scheme::HTTPS,
        None => Scheme::HTTP,
    };
    let from_target = request
        .uri()
        .authority()
        .map(|authority| spelled(authority, &scheme))
        .transpose()?;
    let mut hosts = request.headers().get_all(HOST).iter();
    let missing = request.headers().get(HOST).is_none();
    let from_header = match (hosts.next(), hosts.next()) {
        (Some(_), Some(_)) => return Err(HostError::Several),
        // An empty Host names no authority (RFC 9112 §3.2).
        (Some(value), None) if value.is_empty() => None,
        (Some(value), None) => {
            let authority =
                Authority::try_from(value.as_bytes()).map_err(|_| HostError::Invalid)?;
            Some(spelled(&authority, &scheme)?)
        }
        (None, _) => None,
    };
    let http2 = request.version() == http::Version::HTTP_2;
    let host = match (from_target, from_header) {
        // HTTP/2: a `host` that names another authority makes the request
        // malformed (RFC 9113 §8.3.1).
        (Some(authority), Some(host)) if http2 && authority != host => {
            return Err(HostError::Disagree { host, authority });
        }
        // HTTP/1.1 in absolute form: the target's authority, Host ignored
        // (RFC 9112 §3.2.2).
        (Some(host), _) | (None, Some(host)) => host,
        (None, None) if request.version() == http::Version::HTTP_11 && missing => {
            return Err(HostError::Missing);
        }
        (None, None) => return Ok(()),
    };
    let value = HeaderValue::try_from(host).map_err(|_| HostError::Invalid)?;
    request.headers_mut().insert(HOST, value);
    Ok(())
}

/// `authority` as one host is spelled: lower-cased, without the port
/// `scheme` implies (nor an empty one: `host:` is `host`).
fn spelled(authority: &Authority, scheme: &Scheme) -> Result<String, HostError> {
    if authority.as_str().contains('@') {
        return Err(HostError::UserInfo);
    }
    // After the host only `:` and a port may come, the port a number.
    let after = &authority.as_str()[authority.host().len()..];
    let port_ok = match after.strip_prefix(':') {
        None => after.is_empty(),
        Some("") => true,
        Some(digits) => digits.bytes().all(|b| b.is_ascii_digit()) && digits.parse::<u16>().is_ok(),
    };
    if !port_ok {
        return Err(HostError::Invalid);
    }
    // `api.example.` is `api.example`: the root label spelled out.
    let host = authority.host().trim_end_matches('.').to_ascii_lowercase();
    let default = if *scheme == Scheme::HTTPS { 443 } else { 80 };
    Ok(match authority.port_u16() {
        Some(port) if port != default => format!("{host}:{port}"),
        _ => host,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Uri;

    /// The `host` a request to `uri` with `host` leaves [`normalize`] with.
    fn of(uri: &str, host: Option<&str>, tls: bool) -> Result<Option<String>, HostError> {
        let mut request = Request::builder().uri(uri.parse::<Uri>().unwrap());
        if let Some(host) = host {
            request = request.header(HOST, host);
        }
        let mut request = request.body(()).unwrap();
        if tls {
            request.extensions_mut().insert(ViaTls);
        }
        normalize(&mut request)?;
        Ok(request
            .headers()
            .get(HOST)
            .map(|v| v.to_str().unwrap().to_string()))
    }

    fn host(value: &str) -> Result<Option<String>, HostError> {
        Ok(Some(value.to_string()))
    }

    #[test]
    fn one_host_has_one_spelling_over_either_version() {
        // HTTP/1.1: `Host`; HTTP/2: `:authority` (in the URI).
        assert_eq!(of("/a", Some("API.Example"), false), host("api.example"));
        assert_eq!(of("http://API.example/a", None, false), host("api.example"));
        assert_eq!(of("/a", Some("api.example:80"), false), host("api.example"));
        assert_eq!(of("/a", Some("api.example:"), false), host("api.example"));
        assert_eq!(
            of("https://api.example:443/a", None, false),
            host("api.example")
        );
        assert_eq!(of("/a", Some("api.example:443"), true), host("api.example"));
        // A port that is not the scheme's stays.
        assert_eq!(
            of("/a", Some("api.example:443"), false),
            host("api.example:443")
        );
        assert_eq!(
            of("http://api.example:8080/a", None, false),
            host("api.example:8080")
        );
        assert_eq!(of("/a", Some("[::1]:80"), false), host("[::1]"));
        // An empty Host names none, and is left as it came.
        assert_eq!(of("/a", Some(""), false), host(""));
    }

    #[test]
    fn an_http11_request_without_host_is_refused() {
        assert_eq!(of("/a", None, false), Err(HostError::Missing));
        // HTTP/1.0 needs none, nor HTTP/2 (its `:authority`, when sent, is
        // in the URI).
        for version in [http::Version::HTTP_10, http::Version::HTTP_2] {
            let mut request = Request::builder()
                .version(version)
                .uri("/a")
                .body(())
                .unwrap();
            assert_eq!(normalize(&mut request), Ok(()), "{version:?}");
            assert!(request.headers().get(HOST).is_none());
        }
    }

    #[test]
    fn an_http2_host_that_disagrees_with_the_authority_is_refused() {
        let h2 = |host: &str| {
            let mut request = Request::builder()
                .version(http::Version::HTTP_2)
                .uri("http://api.example/a")
                .header(HOST, host)
                .body(())
                .unwrap();
            normalize(&mut request).map(|()| request.headers()[HOST].clone())
        };
        // The same host spelled otherwise agrees.
        assert_eq!(h2("API.example:80").unwrap(), "api.example");
        assert!(matches!(
            h2("other.example"),
            Err(HostError::Disagree { .. })
        ));
        assert!(matches!(
            h2("api.example:8080"),
            Err(HostError::Disagree { .. })
        ));
        // HTTP/1.1 in absolute form: the target names the host, Host is ignored.
        assert_eq!(
            of("http://api.example/a", Some("other.example"), false),
            host("api.example")
        );
    }

    #[test]
    fn malformed_hosts_are_refused() {
        assert_eq!(of("/a", Some("a b"), false), Err(HostError::Invalid));
        for bad_port in ["api.example:99999", "api.example:80x", "[::1]x"] {
            assert_eq!(
                of("/a", Some(bad_port), false),
                Err(HostError::Invalid),
                "{bad_port}"
            );
        }
        // An empty Host names no host (left as sent: a scope reads it as
        // absent); a trailing dot is the same host.
        assert_eq!(of("/a", Some(""), false), Ok(Some(String::new())));
        assert_eq!(of("/a", Some("API.example."), false), host("api.example"));
        assert_eq!(
            of("/a", Some("u:p@api.example"), false),
            Err(HostError::UserInfo)
        );
        assert_eq!(
            of("http://u@api.example/a", None, false),
            Err(HostError::UserInfo)
        );
        let mut request = Request::builder()
            .uri("/a")
            .header(HOST, "a.example")
            .header(HOST, "b.example")
            .body(())
            .unwrap();
        assert_eq!(normalize(&mut request), Err(HostError::Several));
    }
}
