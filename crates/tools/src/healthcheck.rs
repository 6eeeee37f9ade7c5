//! `idemgate healthcheck`: a running gateway's `/readyz` as an exit code,
//! for a container's `HEALTHCHECK` (the `Containerfile`) or a script that
//! waits for a gateway to come up.
//!
//! It asks the admin listener (the one that serves `/readyz`) named by
//! `--admin` (an [`AdminUrl`], read as `keys` reads it), or by a config
//! file's `admin_listen` (an unspecified address such as `0.0.0.0` is asked
//! on loopback; https when `admin_tls_cert` is set). Over https the
//! certificate is checked as [`AdminTls`](crate::admin_tls) says.
//!
//! Ready is a 200 whose body is `/readyz`'s own `{"status":"ready"}`: a
//! 200 with another body is some other page (a proxy's, the console's),
//! which proves nothing about the store. Any other status (503
//! `store-unavailable`, 503 `draining`), a refused connection, a TLS
//! failure or no whole answer within `--timeout` is not ready. The answer
//! read is bounded, and nothing needs the admin token.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Empty;
use serde::Deserialize;

use crate::admin_tls::AdminTlsError;
use crate::admin_url::{AdminUrl, AdminUrlError};
use crate::cli::Healthcheck;
use crate::terminal::printable;
use idemgate::config::{Config, ConfigError};
use idemgate::http_client::{self, ExchangeError};

/// The most of an answer read: `/readyz` says a line of JSON.
const MAX_ANSWER: usize = 64 * 1024;
/// The most of an answer a message shows: enough to tell a problem's
/// detail or a page's title, not a page.
const MAX_SHOWN_ANSWER: usize = 300;

/// Why the gateway is not known to be ready.
#[derive(Debug, thiserror::Error)]
pub enum NotReady {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    AdminUrl(#[from] AdminUrlError),
    #[error(transparent)]
    Tls(#[from] AdminTlsError),
    #[error("{url}: not a URL: {reason}")]
    Url { url: String, reason: String },
    #[error("{url}: no answer: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("{url}: no whole answer within {}", humantime::format_duration(*within))]
    Timeout { url: String, within: Duration },
    #[error("{url}: {status}: {answer}")]
    Status {
        url: String,
        status: StatusCode,
        answer: String,
    },
    #[error(r#"{url}: 200 but not the readiness answer {{"status":"ready"}}: {answer}"#)]
    NotReadiness { url: String, answer: String },
}

/// Asks the gateway `check` names; `Ok` with its answer when it is ready.
pub async fn run(check: &Healthcheck) -> Result<String, NotReady> {
    let admin = admin_listener(check)?;
    let client = check.tls.client::<Empty<Bytes>>(&admin, check.timeout)?;
    let url = admin.join("/readyz");
    let request = Request::get(&url)
        .body(Empty::new())
        .map_err(|error| NotReady::Url {
            url: url.clone(),
            reason: error.to_string(),
        })?;
    let (status, body) = http_client::exchange(&client, request, MAX_ANSWER, check.timeout)
        .await
        .map_err(|error| match error {
            ExchangeError::Failed(reason) => NotReady::Unreachable {
                url: url.clone(),
                reason,
            },
            ExchangeError::Timeout => NotReady::Timeout {
                url: url.clone(),
                within: check.timeout,
            },
        })?;
    judge(url, status, &body)
}

/// The admin listener: `--config`'s if given, else `--admin`.
fn admin_listener(check: &Healthcheck) -> Result<AdminUrl, NotReady> {
    match &check.config {
        Some(file) => {
            let server = Config::load(file)?.server;
            Ok(AdminUrl::listener(
                on_loopback(server.admin_listen),
                server.admin_tls.is_some(),
            ))
        }
        None => Ok(AdminUrl::parse(&check.admin)?),
    }
}

/// `/readyz`'s answer when the gateway is ready.
#[derive(Deserialize)]
struct Readiness {
    status: String,
}

/// Ready only on a 200 that is `/readyz` saying so; the answer as text.
fn judge(url: String, status: StatusCode, body: &[u8]) -> Result<String, NotReady> {
    let answer = String::from_utf8_lossy(body).into_owned();
    if status != StatusCode::OK {
        return Err(NotReady::Status {
            url,
            status,
            answer: excerpt(&answer),
        });
    }
    let ready = serde_json::from_slice::<Readiness>(body).is_ok_and(|said| said.status == "ready");
    if !ready {
        return Err(NotReady::NotReadiness {
            url,
            answer: excerpt(&answer),
        });
    }
    Ok(answer)
}

/// The start of `answer`, on one line and safe to print: a page may be
/// long, and its bytes are not the terminal's to obey.
fn excerpt(answer: &str) -> String {
    let answer = answer.trim();
    let start: String = answer.chars().take(MAX_SHOWN_ANSWER).collect();
    let mut shown = printable(&start);
    if start.len() < answer.len() {
        shown.push('…');
    }
    shown
}

/// `addr`, with an unspecified IP (listening on every interface) replaced
/// by the loopback address of its family, where this host reaches it.
fn on_loopback(addr: SocketAddr) -> SocketAddr {
    let ip = match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, addr.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unspecified_listen_address_is_asked_on_loopback() {
        let ask = |addr: &str| on_loopback(addr.parse().unwrap()).to_string();
        assert_eq!(ask("0.0.0.0:9090"), "127.0.0.1:9090");
        assert_eq!(ask("[::]:9090"), "[::1]:9090");
        assert_eq!(ask("10.0.0.7:9090"), "10.0.0.7:9090");
    }

    #[test]
    fn only_the_readiness_answer_is_ready() {
        let url = || "http://127.0.0.1:9090/readyz".to_string();
        let ready = judge(url(), StatusCode::OK, br#"{"status":"ready"}"#);
        assert_eq!(ready.unwrap(), r#"{"status":"ready"}"#);
        // What `GET /` answers: the console page, a 200.
        let page = b"<!doctype html>\n<title>idemgate console</title>";
        for body in [
            &page[..],
            br#"{"status":"ok"}"#,
            br#"{"status":"draining"}"#,
            b"",
        ] {
            let error = judge(url(), StatusCode::OK, body).expect_err("not ready");
            assert!(matches!(error, NotReady::NotReadiness { .. }), "{error}");
        }
        let error = judge(url(), StatusCode::OK, page).unwrap_err().to_string();
        assert!(error.contains(r"<!doctype html>\n<title>"), "{error}");
        let draining = br#"{"type":"urn:idemgate:problem:draining","status":503}"#;
        let error = judge(url(), StatusCode::SERVICE_UNAVAILABLE, draining).unwrap_err();
        assert!(matches!(error, NotReady::Status { .. }), "{error}");
    }

    #[test]
    fn a_long_answer_is_shown_cut() {
        let shown = excerpt(&"x".repeat(MAX_SHOWN_ANSWER + 1));
        assert_eq!(shown, format!("{}…", "x".repeat(MAX_SHOWN_ANSWER)));
        assert_eq!(excerpt(" short\n"), "short");
    }
}
