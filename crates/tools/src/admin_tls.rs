//! `--ca` and `--server-name`, how `idemgate keys` and `idemgate
//! healthcheck` check an https admin listener's certificate, and the
//! client both make of them, so that one command's check is the other's.
//!
//! The certificate is checked against the public roots and `--ca`, and
//! against `--server-name` instead of the host asked when given: a
//! listener asked on loopback may hold a certificate that names only its
//! DNS name. A name for a plain http listener is refused: the check it
//! asks for would silently not happen.

use std::path::PathBuf;
use std::time::Duration;

use http_body::Body;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use rustls::pki_types::{InvalidDnsNameError, ServerName};

use crate::admin_url::AdminUrl;
use idemgate::config::ClientTls;
use idemgate::http_client;
use idemgate::tls::TlsError;

/// How an https admin listener's certificate is checked.
#[derive(Debug, Clone, clap::Args)]
pub struct AdminTls {
    /// A PEM file of extra trust roots for an https admin listener whose
    /// certificate a private CA signed (`server.admin_tls_cert`).
    #[arg(long, global = true)]
    ca: Option<PathBuf>,
    /// The name the https admin listener's certificate is checked against,
    /// when it is not the host asked (e.g. a certificate for
    /// gw.example.com, asked on 127.0.0.1).
    #[arg(long, global = true, value_parser = server_name)]
    server_name: Option<ServerName<'static>>,
}

/// Why no client of the admin listener could be made.
#[derive(Debug, thiserror::Error)]
pub enum AdminTlsError {
    #[error("--ca: {0}")]
    Ca(#[from] TlsError),
    #[error("--server-name: {url} is not https; the name is what a certificate is checked against")]
    ServerNameWithoutTls { url: AdminUrl },
}

impl AdminTls {
    /// A client of `admin`, connecting within `connect_timeout`.
    pub fn client<B>(
        &self,
        admin: &AdminUrl,
        connect_timeout: Duration,
    ) -> Result<Client<HttpsConnector<HttpConnector>, B>, AdminTlsError>
    where
        B: Body + Send,
        B::Data: Send,
    {
        if self.server_name.is_some() && !admin.is_https() {
            return Err(AdminTlsError::ServerNameWithoutTls { url: admin.clone() });
        }
        let tls = ClientTls {
            ca: self.ca.clone(),
            identity: None,
        }
        .client_config(None)?;
        let name = self.server_name.clone();
        Ok(http_client::client_with(connect_timeout, tls, name))
    }
}

/// `--server-name`: a DNS name or an IP address, as a certificate names it.
fn server_name(name: &str) -> Result<ServerName<'static>, InvalidDnsNameError> {
    ServerName::try_from(name.to_string())
}
