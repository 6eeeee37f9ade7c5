//! TLS material: PEM files read into rustls types, the listeners' server
//! configurations with a certificate that can be swapped while they run, and
//! the upstream client configurations.
//!
//! Invariants:
//! - a certificate a listener presents was read whole and matches its key; a
//!   reload that fails (a missing, garbled or mismatched file) keeps the one
//!   in use, and a swap only changes what new handshakes get: open
//!   connections keep theirs;
//! - an upstream is trusted by the public (webpki) roots plus its route's
//!   `upstream_ca`, never by fewer checks: no verification is switched off.

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls::{ClientConfig, RootCertStore};
use tokio_rustls::TlsAcceptor;

/// Why TLS material could not be used; names the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{}: cannot read: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{}: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
    #[error("cannot set up TLS: {0}")]
    Rustls(#[from] rustls::Error),
}

impl TlsError {
    fn invalid(path: &Path, reason: impl Into<String>) -> Self {
        TlsError::Invalid {
            path: path.to_path_buf(),
            reason: reason.into(),
        }
    }
}

/// The one crypto provider: ring, as everywhere else in the build.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|error| TlsError::Read {
        path: path.to_path_buf(),
        error,
    })
}

/// Every `CERTIFICATE` block of a PEM file, in order; at least one.
pub fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let text = read(path)?;
    let certificates = CertificateDer::pem_slice_iter(&text)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::invalid(path, format!("not a PEM certificate file: {e}")))?;
    if certificates.is_empty() {
        return Err(TlsError::invalid(
            path,
            "no PEM `CERTIFICATE` block in the file",
        ));
    }
    Ok(certificates)
}

/// The first private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let text = read(path)?;
    PrivateKeyDer::from_pem_slice(&text).map_err(|e| match e {
        pem::Error::NoItemsFound => TlsError::invalid(
            path,
            "no PEM private key block (PKCS#8, PKCS#1 or SEC1) in the file",
        ),
        e => TlsError::invalid(path, format!("not a PEM private key file: {e}")),
    })
}

/// A certificate chain (leaf first) and the key it certifies, checked to
/// belong together.
pub fn certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    pair_up(certificates(cert)?, private_key(key)?, (cert, key))
}

/// A chain read from `cert` and a key read from `key`, checked to belong
/// together (an error names the key file).
pub fn pair_up(
    chain: Vec<CertificateDer<'static>>,
    private: PrivateKeyDer<'static>,
    (cert, key): (&Path, &Path),
) -> Result<CertifiedKey, TlsError> {
    CertifiedKey::from_der(chain, private, &provider()).map_err(|e| {
        TlsError::invalid(
            key,
            format!(
                "cannot be used with the certificate {}: {e}",
                cert.display()
            ),
        )
    })
}

/// The public roots, plus every certificate of `ca` if given.
pub fn roots(ca: Option<&Path>) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    if let Some(ca) = ca {
        for certificate in certificates(ca)? {
            roots
                .add(certificate)
                .map_err(|e| TlsError::invalid(ca, format!("not a usable trust root: {e}")))?;
        }
    }
    Ok(roots)
}

/// What an upstream connection trusts and presents.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTls {
    /// Extra trust roots (PEM), beside the public ones.
    pub ca: Option<PathBuf>,
    /// The client certificate and key (PEM) for upstreams that ask (mTLS).
    pub identity: Option<CertPair>,
}

/// A certificate chain file and its key file, both PEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertPair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl ClientTls {
    /// The rustls client configuration, read from the files now.
    pub fn client_config(&self) -> Result<ClientConfig, TlsError> {
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots(self.ca.as_deref())?);
        Ok(match &self.identity {
            None => builder.with_no_client_auth(),
            Some(pair) => builder.with_client_cert_resolver(Arc::new(SingleCertAndKey::from(
                certified_key(&pair.cert, &pair.key)?,
            ))),
        })
    }
}

/// A listener's TLS: its acceptor, and the files it reloads from.
pub struct ServerTls {
    /// `proxy` or `admin`, for logs.
    listener: &'static str,
    files: CertPair,
    current: Arc<CurrentCertificate>,
    acceptor: TlsAcceptor,
}

impl ServerTls {
    /// Reads the certificate and key and builds the listener's configuration:
    /// HTTP/1.1 only (ALPN), TLS 1.2 and 1.3, no client certificates.
    pub fn load(listener: &'static str, files: &CertPair) -> Result<Self, TlsError> {
        let current = Arc::new(CurrentCertificate(RwLock::new(Arc::new(certified_key(
            &files.cert,
            &files.key,
        )?))));
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(current.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(ServerTls {
            listener,
            files: files.clone(),
            current,
            acceptor: TlsAcceptor::from(Arc::new(config)),
        })
    }

    pub fn acceptor(&self) -> &TlsAcceptor {
        &self.acceptor
    }

    pub fn listener(&self) -> &'static str {
        self.listener
    }

    /// Reads the files again; new handshakes get the new certificate. On
    /// error the certificate in use stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        let fresh = certified_key(&self.files.cert, &self.files.key)?;
        *self
            .current
            .0
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(fresh);
        Ok(())
    }
}

/// The certificate new handshakes get. std RwLock: held only to clone or
/// replace an `Arc`, never across `.await`.
#[derive(Debug)]
struct CurrentCertificate(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for CurrentCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.0
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        )
    }
}
