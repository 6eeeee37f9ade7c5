//! The HTTP client for the gateway's own calls that are not proxied writes
//! (the `keys` CLI's admin calls, alert webhooks): HTTP/1.1, plain http or
//! https through rustls with the webpki roots (plus a private CA where the
//! caller gives one), a bounded connect. A certificate is checked against
//! the host connected to, or against a name the caller gives
//! ([`client_with`]).

use crate::tls::error_chain;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper_rustls::builderstates::WantsProtocols1;
use hyper_rustls::{FixedServerNameResolver, HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::ServerName;

/// A client whose connects give up after `connect_timeout`.
pub fn webpki_client<B>(
    connect_timeout: Duration,
) -> Result<Client<HttpsConnector<HttpConnector>, B>, rustls::Error>
where
    B: http_body::Body + Send,
    B::Data: Send,
{
    let tls = HttpsConnectorBuilder::new()
        .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())?;
    Ok(finish(tls.https_or_http(), connect_timeout))
}

/// Like [`webpki_client`], trusting what `tls` trusts (the `keys` CLI's
/// `--ca` for an admin listener behind a private CA); with `name`, every
/// certificate is checked against it whatever host is connected to
/// (`idemgate healthcheck --server-name`: an admin listener asked on
/// loopback whose certificate names only the DNS name clients know it
/// by).
pub fn client_with<B>(
    connect_timeout: Duration,
    tls: rustls::ClientConfig,
    name: Option<ServerName<'static>>,
) -> Client<HttpsConnector<HttpConnector>, B>
where
    B: http_body::Body + Send,
    B::Data: Send,
{
    let builder = HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    let builder = match name {
        Some(name) => builder.with_server_name_resolver(FixedServerNameResolver::new(name)),
        None => builder,
    };
    finish(builder, connect_timeout)
}

fn finish<B>(
    tls: HttpsConnectorBuilder<WantsProtocols1>,
    connect_timeout: Duration,
) -> Client<HttpsConnector<HttpConnector>, B>
where
    B: http_body::Body + Send,
    B::Data: Send,
{
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(connect_timeout));
    let https = tls.enable_http1().wrap_connector(http);
    Client::builder(TokioExecutor::new()).build(https)
}

/// Why [`exchange`] got no whole answer.
#[derive(Debug)]
pub enum ExchangeError {
    /// No connection, a broken one, a TLS failure, a body over the bound:
    /// the whole cause chain.
    Failed(String),
    /// Nothing whole within the time allowed.
    Timeout,
}

/// Sends `request` and reads its answer: the status and at most `max`
/// bytes of body, all within `within`.
pub async fn exchange<B>(
    client: &Client<HttpsConnector<HttpConnector>, B>,
    request: Request<B>,
    max: usize,
    within: Duration,
) -> Result<(StatusCode, Bytes), ExchangeError>
where
    B: http_body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let whole = async {
        let response = client
            .request(request)
            .await
            .map_err(|error| ExchangeError::Failed(error_chain(&error)))?;
        let status = response.status();
        let body = Limited::new(response.into_body(), max)
            .collect()
            .await
            .map_err(|error| ExchangeError::Failed(error_chain(error.as_ref())))?
            .to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout(within, whole)
        .await
        .unwrap_or(Err(ExchangeError::Timeout))
}
