//! `idemgate healthcheck`: a running gateway's `/readyz` as an exit code,
//! for a container's `HEALTHCHECK` (the `Containerfile`) or a script that
//! waits for a gateway to come up.
//!
//! It asks the admin listener (the one that serves `/readyz`) named by
//! `--admin`, or by a config file's `admin_listen` (an unspecified address
//! such as `0.0.0.0` is asked on loopback; https when `admin_tls_cert` is
//! set, checked against the public roots and `--ca`). Ready is a 200; any
//! other status (503 `store-unavailable`, 503 `draining`), a refused
//! connection, a TLS failure or no whole answer within `--timeout` is not
//! ready. The answer read is bounded, and nothing needs the admin token.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Empty;

use crate::cli::Healthcheck;
use idemgate::config::{ClientTls, Config, ConfigError, redact_url};
use idemgate::http_client::{self, ExchangeError};
use idemgate::tls::TlsError;

/// The most of an answer read: `/readyz` says a line of JSON.
const MAX_ANSWER: usize = 64 * 1024;

/// Why the gateway is not known to be ready.
#[derive(Debug, thiserror::Error)]
pub enum NotReady {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("--ca: {0}")]
    Ca(#[from] TlsError),
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
}

/// Asks the gateway `check` names; `Ok` with its answer when it is ready.
pub async fn run(check: &Healthcheck) -> Result<String, NotReady> {
    let url = readyz_url(check)?;
    // What messages name: never a password in the URL's userinfo.
    let shown = redact_url(&url);
    let tls = ClientTls {
        ca: check.ca.clone(),
        identity: None,
    }
    .client_config()?;
    let client = http_client::client_with::<Empty<Bytes>>(check.timeout, tls);
    let request = Request::get(&url)
        .body(Empty::new())
        .map_err(|error| NotReady::Url {
            url: shown.clone(),
            reason: error.to_string(),
        })?;
    let (status, body) = http_client::exchange(&client, request, MAX_ANSWER, check.timeout)
        .await
        .map_err(|error| match error {
            ExchangeError::Failed(reason) => NotReady::Unreachable {
                url: shown.clone(),
                reason,
            },
            ExchangeError::Timeout => NotReady::Timeout {
                url: shown.clone(),
                within: check.timeout,
            },
        })?;
    let answer = String::from_utf8_lossy(&body).into_owned();
    if status != StatusCode::OK {
        return Err(NotReady::Status {
            url: shown,
            status,
            answer,
        });
    }
    Ok(answer)
}

/// `<admin>/readyz`, the admin listener from `--config` if given.
fn readyz_url(check: &Healthcheck) -> Result<String, NotReady> {
    let base = match &check.config {
        Some(file) => {
            let server = Config::load(file)?.server;
            let scheme = if server.admin_tls.is_some() {
                "https"
            } else {
                "http"
            };
            format!("{scheme}://{}", on_loopback(server.admin_listen))
        }
        None => check.admin.clone(),
    };
    Ok(format!("{}/readyz", base.trim_end_matches('/')))
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
}
