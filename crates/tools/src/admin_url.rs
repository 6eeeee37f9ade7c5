//! `--admin`, the admin listener's base URL that `idemgate keys` and
//! `idemgate healthcheck` both take, read by the one parser so that what
//! one command refuses the other refuses too.
//!
//! A base is `http://` or `https://`, a host, and perhaps a path (an admin
//! API behind a reverse proxy under a prefix); each command appends its own
//! path to it (`/readyz`, `/admin/keys/…`). Refused, each with a reason
//! ([`Refusal`]):
//!
//! - a query or a fragment: the command's path would land inside it, and
//!   the request would ask the base itself (the console page, always 200)
//!   rather than the endpoint meant;
//! - userinfo (`user:password@`): nothing sends it (`keys` authenticates
//!   with the token named by `--token-env`, `/readyz` takes none), so a
//!   password there would only be left in shell history and process
//!   listings while the user believes it is in use. The refusal shows the
//!   URL with its userinfo masked, never a part of it.
//!
//! So an [`AdminUrl`] holds no secret, and every message may show it.

use std::fmt;
use std::net::SocketAddr;

use http::Uri;

/// A checked admin base URL, without a trailing `/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminUrl {
    base: String,
}

/// Why an `--admin` value is not a base URL; the value is shown masked.
#[derive(Debug, thiserror::Error)]
#[error("--admin {shown}: {refusal}")]
pub struct AdminUrlError {
    shown: String,
    refusal: Refusal,
}

impl AdminUrlError {
    /// What was wrong with the URL.
    pub fn refusal(&self) -> Refusal {
        self.refusal
    }
}

/// What an admin base URL may not be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("not a URL; expected e.g. http://127.0.0.1:9090")]
    NotAUrl,
    #[error("expected an http:// or https:// URL")]
    Scheme,
    #[error("no host")]
    NoHost,
    #[error("a base URL takes no query: each command appends its own path")]
    Query,
    #[error("a base URL takes no fragment: each command appends its own path")]
    Fragment,
    #[error(
        "a base URL takes no user or password: nothing sends them (`keys` sends the token named by --token-env, /readyz needs none); leave them out of the command line"
    )]
    Userinfo,
}

impl AdminUrl {
    /// `url` checked as a base (module doc); a path is kept.
    pub fn parse(url: &str) -> Result<AdminUrl, AdminUrlError> {
        let refuse = |refusal| AdminUrlError {
            shown: masked(url),
            refusal,
        };
        // `Uri` drops a fragment without a word: look for one first.
        if url.contains('#') {
            return Err(refuse(Refusal::Fragment));
        }
        let uri: Uri = url.parse().map_err(|_| refuse(Refusal::NotAUrl))?;
        let scheme = match uri.scheme_str() {
            Some(scheme @ ("http" | "https")) => scheme,
            _ => return Err(refuse(Refusal::Scheme)),
        };
        let authority = uri.authority().ok_or_else(|| refuse(Refusal::NoHost))?;
        if authority.as_str().contains('@') {
            return Err(refuse(Refusal::Userinfo));
        }
        if authority.host().is_empty() {
            return Err(refuse(Refusal::NoHost));
        }
        if uri.query().is_some() {
            return Err(refuse(Refusal::Query));
        }
        let path = uri.path().trim_end_matches('/');
        Ok(AdminUrl {
            base: format!("{scheme}://{authority}{path}"),
        })
    }

    /// The listener bound at `addr`, over https when `tls`.
    pub fn listener(addr: SocketAddr, tls: bool) -> AdminUrl {
        let scheme = if tls { "https" } else { "http" };
        AdminUrl {
            base: format!("{scheme}://{addr}"),
        }
    }

    /// The URL of `path` (which starts with `/`) under this base.
    pub fn join(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Whether it is asked over TLS.
    pub fn is_https(&self) -> bool {
        self.base.starts_with("https://")
    }
}

impl fmt::Display for AdminUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.base)
    }
}

/// `url` with everything from the start of its authority to its last `@`
/// replaced by `***`, and what follows a `?` or `#` after that (a token
/// in a query is as secret). The value may not parse, so where its
/// userinfo ends is a guess: masking to the last `@` can hide a little
/// more than the userinfo, never less.
fn masked(url: &str) -> String {
    let start = url.find("://").map_or(0, |at| at + 3);
    let shown = match url[start..].rfind('@') {
        Some(at) => format!("{}***{}", &url[..start], &url[start + at..]),
        None => url.to_string(),
    };
    match shown.find(['?', '#']) {
        Some(at) => format!("{}***", &shown[..=at]),
        None => shown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(url: &str) -> Refusal {
        AdminUrl::parse(url).expect_err(url).refusal()
    }

    #[test]
    fn a_base_keeps_its_path_without_the_trailing_slash() {
        let base = |url: &str| AdminUrl::parse(url).unwrap().to_string();
        assert_eq!(base("http://127.0.0.1:9090/"), "http://127.0.0.1:9090");
        assert_eq!(base("http://127.0.0.1:9090"), "http://127.0.0.1:9090");
        assert_eq!(
            base("https://gw.example.com/ops/"),
            "https://gw.example.com/ops"
        );
        assert_eq!(base("http://[::1]:9090"), "http://[::1]:9090");
        let under = AdminUrl::parse("https://gw.example.com/ops/").unwrap();
        assert_eq!(under.join("/readyz"), "https://gw.example.com/ops/readyz");
        assert!(under.is_https());
        let plain = AdminUrl::listener("127.0.0.1:9090".parse().unwrap(), false);
        assert_eq!(plain.join("/readyz"), "http://127.0.0.1:9090/readyz");
        assert!(!plain.is_https());
    }

    #[test]
    fn what_a_base_cannot_be_is_refused_with_its_reason() {
        assert_eq!(refusal("127.0.0.1:9090"), Refusal::Scheme);
        assert_eq!(refusal("ftp://h"), Refusal::Scheme);
        assert_eq!(refusal("not a url"), Refusal::NotAUrl);
        assert_eq!(refusal("http:///readyz"), Refusal::NotAUrl);
        // Appended to, these asked `GET /`: the console page, a 200.
        assert_eq!(refusal("http://127.0.0.1:9090/?probe=1"), Refusal::Query);
        assert_eq!(refusal("http://127.0.0.1:9090?"), Refusal::Query);
        assert_eq!(refusal("http://127.0.0.1:9090/#x"), Refusal::Fragment);
        assert_eq!(refusal("http://127.0.0.1:9090#x"), Refusal::Fragment);
        assert_eq!(refusal("http://ops:pw@127.0.0.1:9090"), Refusal::Userinfo);
        assert_eq!(refusal("http://token@127.0.0.1:9090"), Refusal::Userinfo);
    }

    #[test]
    fn a_refusal_never_shows_userinfo_nor_a_query() {
        for (url, shown) in [
            ("http://ops:S3CRET@127.0.0.1:1", "http://***@127.0.0.1:1"),
            ("http://S3CRET@127.0.0.1:1/a", "http://***@127.0.0.1:1/a"),
            // Not a URL at all: masked all the same.
            ("ops:S3CRET@127.0.0.1:1", "***@127.0.0.1:1"),
            ("http://ops:S3/CRET@h:1 x", "http://***@h:1 x"),
            ("http://ops:S3@CRET@h/#x", "http://***@h/#***"),
            ("http://h:1/?token=S3CRET", "http://h:1/?***"),
        ] {
            let error = AdminUrl::parse(url).expect_err(url).to_string();
            assert!(!error.contains("S3"), "{error}");
            assert!(error.starts_with(&format!("--admin {shown}: ")), "{error}");
        }
    }
}
