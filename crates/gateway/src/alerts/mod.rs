//! Alerts on held work (docs/operating.md, "Alerts"): webhooks told, without anyone
//! polling, that an operation became `unknown`, that a route was paused,
//! or that an operation has stayed `unknown` for `aged_after`.
//!
//! The store's outbox is the source: the database writes an alert in the
//! transaction of the state change it reports (migrations `*_alert_outbox`),
//! so it survives a crash the moment the change does. The [`deliverer`]
//! takes due deliveries from it off the proxy's path and POSTs them,
//! within the bounds [`in_flight`] keeps; this module holds what a
//! delivery is made of: the endpoints, the payload (never request or
//! response payloads, never credentials) and its signature,
//! `X-Idemgate-Signature: t=<unix>,v1=<hex HMAC-SHA256 of "<t>.<body>">`,
//! as Stripe signs its webhooks.

pub mod deliverer;
pub(crate) mod in_flight;

use std::time::Duration;

use bytes::Bytes;
use hmac::{Hmac, Mac};
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue, USER_AGENT};
use http::{Method, Request};
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::config::{AlertConfig, AlertEvent, Config, ServerConfig};
use crate::http_client;
use idemgate_model::clock::{Clock, SystemClock, rfc3339};
use idemgate_model::error_chain::error_chain;
use idemgate_store::{Alert, AlertSubscription};

/// The signature header.
pub(crate) const SIGNATURE: HeaderName = HeaderName::from_static("x-idemgate-signature");

/// How long one delivery may take, connect included.
const POST_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why alerts cannot start.
#[derive(Debug, thiserror::Error)]
pub enum AlertError {
    #[error(
        "alerts[{index}].secret_env names {variable}, which is not set or is empty; set it to the webhook's signing secret, or remove secret_env"
    )]
    SecretMissing { index: usize, variable: String },
    #[error("cannot set up TLS for alert webhooks: {0}")]
    Tls(#[from] rustls::Error),
}

/// One `[[alerts]]` endpoint, ready to post to.
#[derive(Debug, Clone)]
pub(crate) struct Endpoint {
    /// What the store knows it by: a hash of its URL (URLs of webhooks
    /// often carry a token, and the store never holds one).
    pub(crate) id: String,
    pub(crate) config: AlertConfig,
    secret: Option<Vec<u8>>,
}

impl Endpoint {
    /// The `index`th `[[alerts]]` entry, its secret read through `env`.
    pub fn new(
        index: usize,
        config: &AlertConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, AlertError> {
        let secret = match &config.secret_env {
            None => None,
            Some(variable) => Some(
                env(variable)
                    .filter(|value| !value.is_empty())
                    .ok_or_else(|| AlertError::SecretMissing {
                        index,
                        variable: variable.clone(),
                    })?
                    .into_bytes(),
            ),
        };
        let digest = Sha256::digest(config.url.to_string().as_bytes());
        Ok(Endpoint {
            id: hex::encode(&digest[..8]),
            config: config.clone(),
            secret,
        })
    }

    /// Every `[[alerts]]` entry of a config, secrets from the process's
    /// environment.
    pub fn all(configs: &[AlertConfig]) -> Result<Vec<Endpoint>, AlertError> {
        configs
            .iter()
            .enumerate()
            .map(|(i, config)| Endpoint::new(i, config, |name| std::env::var(name).ok()))
            .collect()
    }

    /// What the store matches alerts against for this endpoint.
    pub fn subscriptions(&self) -> impl Iterator<Item = AlertSubscription> + '_ {
        self.config.events.iter().map(|event| AlertSubscription {
            endpoint: self.id.clone(),
            event: event.as_str(),
            aged_after: match event {
                AlertEvent::UnknownAged => idemgate_model::clock::millis(self.config.aged_after),
                _ => 0,
            },
        })
    }

    /// The URL for logs and output: its origin only, with `/…` for a
    /// path — webhooks carry their tokens in the path (Slack's
    /// `/services/T…/B…/<token>`, Discord's) or the query.
    pub(crate) fn display_url(&self) -> String {
        let url = &self.config.url;
        format!(
            "{}://{}{}",
            url.scheme_str().unwrap_or("http"),
            url.authority().map_or("", |a| a.as_str()),
            if matches!(url.path(), "" | "/") {
                ""
            } else {
                "/…"
            }
        )
    }
}

/// The JSON body of an alert. `console` is the operator console's base URL.
pub fn payload(alert: &Alert, console: &str) -> Bytes {
    let console_url = match &alert.operation_id {
        Some(id) => format!("{console}#/op/{id}"),
        None => format!("{console}#/routes"),
    };
    Bytes::from(
        json!({
            "event": alert.event,
            "at": rfc3339(alert.at),
            "route": alert.route,
            "operation_id": alert.operation_id,
            "key": alert.key,
            "state": alert.state,
            "evidence": alert.evidence,
            "console_url": console_url,
        })
        .to_string(),
    )
}

/// `t=<unix>,v1=<hex HMAC-SHA256 of "<t>.<body>">`.
pub fn signature(secret: &[u8], unix: u64, body: &[u8]) -> String {
    let mut mac = <Hmac<Sha256>>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(unix.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("t={unix},v1={}", hex::encode(mac.finalize().into_bytes()))
}

/// Posts alerts.
#[derive(Clone)]
pub(crate) struct Poster {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl Poster {
    pub fn new() -> Result<Self, AlertError> {
        Ok(Poster {
            client: http_client::webpki_client(CONNECT_TIMEOUT)?,
        })
    }

    /// POSTs `body` to `endpoint`, signed at `unix` when it has a secret:
    /// the status when it is 2xx, else why not.
    pub async fn post(&self, endpoint: &Endpoint, body: Bytes, unix: u64) -> Result<u16, String> {
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(endpoint.config.url.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(USER_AGENT, concat!("idemgate/", env!("CARGO_PKG_VERSION")));
        if let Some(secret) = &endpoint.secret {
            let signed = HeaderValue::from_str(&signature(secret, unix, &body))
                .map_err(|e| e.to_string())?;
            request = request.header(SIGNATURE, signed);
        }
        let request = request.body(Full::new(body)).map_err(|e| e.to_string())?;
        let sent = tokio::time::timeout(POST_TIMEOUT, self.client.request(request)).await;
        let response = match sent {
            Err(_) => {
                return Err(format!(
                    "no answer within {}",
                    humantime::format_duration(POST_TIMEOUT)
                ));
            }
            Ok(Err(error)) => return Err(error_chain(&error)),
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        // The body is not read: a webhook's answer says nothing we keep.
        drop(response);
        if status.is_success() {
            Ok(status.as_u16())
        } else {
            Err(format!("answered {status}"))
        }
    }
}

/// `idemgate alerts test`: a sample alert POSTed to every endpoint of
/// `config`, one line per endpoint saying what it answered; and whether
/// all of them took it.
pub async fn test_endpoints(config: &Config) -> Result<(String, bool), AlertError> {
    let endpoints = Endpoint::all(&config.alerts)?;
    if endpoints.is_empty() {
        return Ok(("no [[alerts]] endpoints in this config\n".into(), true));
    }
    let poster = Poster::new()?;
    let now = SystemClock.now_millis();
    let body = payload(
        &sample(now),
        &console_base(&config.server, config.server.admin_listen),
    );
    let (mut report, mut all) = (String::new(), true);
    for (n, endpoint) in endpoints.iter().enumerate() {
        let unix = u64::try_from(now / 1000).unwrap_or(0);
        let named = format!("alerts[{n}] {}", endpoint.display_url());
        let line = match poster.post(endpoint, body.clone(), unix).await {
            Ok(status) => format!("{named}: delivered ({status})"),
            Err(error) => {
                all = false;
                format!("{named}: not delivered: {error}")
            }
        };
        report.push_str(&line);
        report.push('\n');
    }
    Ok((report, all))
}

/// A sample alert, for `idemgate alerts test`.
fn sample(now: i64) -> Alert {
    Alert {
        event: "test".into(),
        at: now,
        route: "(test)".into(),
        operation_id: None,
        key: None,
        state: None,
        evidence: "idemgate alerts test".into(),
    }
}

/// The console's base URL, as alerts link to it: `server.console_url`, or
/// the admin listener at `admin`, over https when `server` gives it a
/// certificate.
pub(crate) fn console_base(server: &ServerConfig, admin: std::net::SocketAddr) -> String {
    if let Some(url) = &server.console_url {
        return url.clone();
    }
    let scheme = if server.admin_tls.is_some() {
        "https"
    } else {
        "http"
    };
    format!("{scheme}://{admin}/")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn endpoint(extra: &str) -> AlertConfig {
        let text = format!(
            "[[routes]]\nname = \"api\"\nupstream = \"http://127.0.0.1:9\"\n[[alerts]]\nurl = \"https://hooks.example.com/x?token=s3cret\"\n{extra}"
        );
        Config::from_toml_str(&text, "t").unwrap().alerts.remove(0)
    }

    /// Alerts link to `server.console_url` where it is set: a wildcard
    /// admin listener's address opens nothing.
    #[test]
    fn the_console_is_linked_where_operators_open_it() {
        let config = |server: &str| {
            let text = format!(
                "[server]\nadmin_listen = \"0.0.0.0:9090\"\n{server}\n[[routes]]\nname = \"api\"\nupstream = \"http://127.0.0.1:9\"\n"
            );
            Config::from_toml_str(&text, "t")
        };
        let bound = "0.0.0.0:9090".parse().unwrap();
        let default = config("").unwrap();
        assert_eq!(console_base(&default.server, bound), "http://0.0.0.0:9090/");
        let named = config("console_url = \"https://ops.example.com/idemgate\"").unwrap();
        assert_eq!(
            console_base(&named.server, bound),
            "https://ops.example.com/idemgate/"
        );
        for wrong in [
            "ftp://ops.example.com/",
            "https://ops.example.com/?a=1",
            "/idemgate/",
        ] {
            let refused = config(&format!("console_url = \"{wrong}\"")).unwrap_err();
            assert!(
                refused.to_string().contains("server.console_url"),
                "{refused}"
            );
        }
    }

    #[test]
    fn the_signature_is_stripe_style_hmac_over_time_and_body() {
        // HMAC-SHA256("key", "1700000000.{}"), computed independently
        // (Python's hmac module).
        let signed = signature(b"key", 1_700_000_000, b"{}");
        assert_eq!(
            signed,
            "t=1700000000,v1=9d713ed406bb7076d4123f0dc2c39d2df5c654ed4b0cd56b52c8b4c940bd63ae"
        );
        assert_ne!(signed, signature(b"other", 1_700_000_000, b"{}"));
        assert_ne!(signed, signature(b"key", 1_700_000_001, b"{}"));
        assert_ne!(signed, signature(b"key", 1_700_000_000, b"{ }"));
    }

    #[test]
    fn endpoints_hide_their_url_and_need_their_secret() {
        let config = endpoint(
            "secret_env = \"HOOK_SECRET\"\nevents = [\"unknown-aged\"]\naged_after = \"2m\"",
        );
        let missing = Endpoint::new(3, &config, |_| None).unwrap_err();
        assert!(
            missing
                .to_string()
                .contains("alerts[3].secret_env names HOOK_SECRET")
        );
        let found = Endpoint::new(0, &config, |_| Some("s".into())).unwrap();
        assert_eq!(found.id.len(), 16);
        assert!(!found.id.contains("s3cret"));
        assert_eq!(found.display_url(), "https://hooks.example.com/…");
        let subscriptions: Vec<_> = found.subscriptions().collect();
        assert_eq!(subscriptions.len(), 1);
        assert_eq!(subscriptions[0].event, "unknown-aged");
        assert_eq!(subscriptions[0].aged_after, 120_000);
    }

    #[test]
    fn the_payload_names_the_operation_and_links_the_console() {
        let alert = Alert {
            event: "operation-unknown".into(),
            at: 0,
            route: "api".into(),
            operation_id: Some("op-1".into()),
            key: Some("k".into()),
            state: Some("unknown".into()),
            evidence: "timeout".into(),
        };
        let body: serde_json::Value =
            serde_json::from_slice(&payload(&alert, "http://a/")).unwrap();
        assert_eq!(body["at"], "1970-01-01T00:00:00.000Z");
        assert_eq!(body["console_url"], "http://a/#/op/op-1");
        assert_eq!(body.as_object().unwrap().len(), 8);
    }
}
