//! TLS material: PEM files read into rustls types, the listeners' server
//! configurations with a certificate that can be swapped while they run, and
//! the upstream client configurations.
//!
//! The configuration only names these files ([`crate::config`]); they are
//! read here, at start ([`read`], before the store is opened) and by
//! `idemgate check-config` through the same call, so a file that cannot be
//! used is refused the same way by both, naming the field that names it,
//! and a file that loads but that a peer will refuse is warned of the same
//! way by both ([`Warning`], found by `preflight`).
//!
//! Invariants:
//! - a certificate a listener or an upstream connection presents was read
//!   whole and matches its key; a reload that fails (a missing, garbled or mismatched file, or a
//!   certificate outside its validity period, which every client would
//!   refuse) keeps the one in use, and a swap only changes what new
//!   handshakes get: open connections keep theirs;
//! - an upstream is trusted by the public (webpki) roots plus its route's
//!   `upstream_ca`, never by fewer checks: no verification is switched off;
//! - a server's certificate that rustls refused is said in words
//!   ([`error_chain`], `certificate_error`), in logs and in the 502 a
//!   client gets, never in rustls's Debug form.

mod certificate_error;
mod preflight;

pub use certificate_error::error_chain;

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use rustls::client::ResolvesClientCert;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, SignatureScheme};
use tokio_rustls::TlsAcceptor;

use crate::config::{CertPair, ClientTls, Config, Upstream};

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

fn read_file(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|error| TlsError::Read {
        path: path.to_path_buf(),
        error,
    })
}

/// A TLS file the configuration names that cannot be used, with the
/// field that names it.
#[derive(Debug, thiserror::Error)]
#[error("field `{field}`: {error}")]
pub struct FieldError {
    pub(crate) field: String,
    pub(crate) error: TlsError,
}

/// A TLS file the configuration names that loads, but that a peer will
/// refuse: reported at start and by `check-config`, not refused, since
/// what the peer will present or accept is not known until it does.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct Warning(FieldError);

/// The listeners' TLS, read whole at start.
pub struct Listeners {
    pub(crate) proxy: Option<ServerTls>,
    pub(crate) admin: Option<ServerTls>,
    warnings: Vec<Warning>,
}

impl Warning {
    fn new(field: &str, error: TlsError) -> Warning {
        let field = field.into();
        Warning(FieldError { field, error })
    }
}

impl Listeners {
    /// What the files hold that peers will refuse.
    pub fn warnings(&self) -> &[Warning] {
        &self.warnings
    }
}

/// Reads every TLS file `config` names and checks it as it will be used:
/// each listener's certificate and key (which must belong together), each
/// route's `upstream_ca` and client certificate. The routes' client
/// configurations are built again from the same files by their clients
/// (`pipeline::forward::client`), moments later in the same start.
pub fn read(config: &Config) -> Result<Listeners, FieldError> {
    // A certificate outside its validity period is a warning here, not an
    // error: there is no other to keep (a reload refuses it), refusing to
    // start would take the admin listener down with the proxy's, and a
    // host whose clock is not set yet at boot would refuse a good one.
    let mut warnings = Vec::new();
    let mut listener = |name, files: &Option<CertPair>, fields: (&str, &str)| {
        files
            .as_ref()
            .map(|files| {
                let certified = read_pair(files, (fields.0.into(), fields.1.into()))?;
                let dated = outside_validity(&certified, &files.cert);
                warnings.extend(dated.map(|error| Warning::new(fields.0, error)));
                ServerTls::new(name, files, certified).map_err(|error| FieldError {
                    field: fields.0.into(),
                    error,
                })
            })
            .transpose()
    };
    let server = &config.server;
    let proxy = listener("proxy", &server.tls, ("server.tls_cert", "server.tls_key"))?;
    let admin = listener(
        "admin",
        &server.admin_tls,
        ("server.admin_tls_cert", "server.admin_tls_key"),
    )?;
    for (i, route) in config.routes.iter().enumerate() {
        let field = |name: &str| format!("routes[{i}].{name}");
        if let Some(ca) = &route.upstream_tls.ca {
            roots(Some(ca)).map_err(|error| FieldError {
                field: field("upstream_ca"),
                error,
            })?;
            let refused = ca_as_upstream(ca, &route.upstream);
            warnings.extend(refused.map(|error| Warning::new(&field("upstream_ca"), error)));
        }
        if let Some(identity) = &route.upstream_tls.identity {
            let fields = (field("upstream_client_cert"), field("upstream_client_key"));
            let certified = read_pair(identity, fields.clone())?;
            let dated = outside_validity(&certified, &identity.cert);
            warnings.extend(dated.map(|error| Warning::new(&fields.0, error)));
        }
    }
    Ok(Listeners {
        proxy,
        admin,
        warnings,
    })
}

/// Why the upstream will be refused when it presents a certificate of
/// the `upstream_ca` file `ca` as its own: one named for its host that is
/// a CA certificate.
fn ca_as_upstream(ca: &Path, upstream: &Upstream) -> Option<TlsError> {
    // An IPv6 address is written in brackets in a URL, not in a certificate.
    let host = upstream
        .authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    let host = ServerName::try_from(host).ok()?;
    certificates(ca)
        .ok()?
        .iter()
        .find_map(|certificate| preflight::ca_named_for(certificate, &host))
        .map(|reason| TlsError::invalid(ca, reason))
}

/// Why `certified`'s certificate, read from `cert`, will be refused now:
/// it is outside its validity period.
fn outside_validity(certified: &CertifiedKey, cert: &Path) -> Option<TlsError> {
    let leaf = certified.end_entity_cert().ok()?;
    let why = preflight::outside_validity(leaf, UnixTime::now())?;
    let reason = format!("the certificate is outside its validity period: {why}");
    Some(TlsError::invalid(cert, reason))
}

/// A certificate chain and its key, read and checked to belong together;
/// an error names the certificate's field or the key's (a mismatch is the
/// key's).
fn read_pair(
    files: &CertPair,
    (cert_field, key_field): (String, String),
) -> Result<CertifiedKey, FieldError> {
    let named = |field: &String| {
        let field = field.clone();
        move |error| FieldError { field, error }
    };
    let chain = certificates(&files.cert).map_err(named(&cert_field))?;
    let key = private_key(&files.key).map_err(named(&key_field))?;
    pair_up(chain, key, (&files.cert, &files.key)).map_err(named(&key_field))
}

/// Every `CERTIFICATE` block of a PEM file, in order; at least one.
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let text = read_file(path)?;
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

/// The first private key of a PEM file (PKCS#8, PKCS#1 or SEC1),
/// unencrypted.
fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let text = read_file(path)?;
    PrivateKeyDer::from_pem_slice(&text).map_err(|e| match e {
        // The PEM reader skips a block it has no type for, and reads a
        // legacy encrypted one's headers as broken base64: either way what
        // it says would hide the cause.
        _ if encrypted(&text) => TlsError::invalid(
            path,
            "the private key is encrypted, which is not supported: decrypt it first \
             (`openssl pkey -in KEY -out PLAIN`) and keep the plain file readable by \
             the gateway's user only",
        ),
        pem::Error::NoItemsFound => TlsError::invalid(
            path,
            "no PEM private key block (PKCS#8, PKCS#1 or SEC1) in the file",
        ),
        // The decoder's words name one of the key's characters and where.
        pem::Error::Base64Decode(_) => TlsError::invalid(
            path,
            "not a PEM private key file: a block's base64 does not decode",
        ),
        e => TlsError::invalid(path, format!("not a PEM private key file: {e}")),
    })
}

/// Whether a PEM file holds an encrypted private key: PKCS#8's own
/// block, or a PKCS#1 or SEC1 block with OpenSSL's legacy encryption
/// header.
fn encrypted(text: &[u8]) -> bool {
    let holds = |needle: &[u8]| text.windows(needle.len()).any(|window| window == needle);
    holds(b"-----BEGIN ENCRYPTED PRIVATE KEY-----") || holds(b"Proc-Type: 4,ENCRYPTED")
}

/// A certificate chain (leaf first) and the key it certifies, checked to
/// belong together.
fn certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    pair_up(certificates(cert)?, private_key(key)?, (cert, key))
}

/// A chain read from `cert` and a key read from `key`, checked to belong
/// together (an error names the key file).
fn pair_up(
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
fn roots(ca: Option<&Path>) -> Result<RootCertStore, TlsError> {
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

impl ClientTls {
    /// The client certificate the route's upstream connections present,
    /// read from its files now (none without `upstream_client_cert`).
    pub fn identity(&self) -> Result<Option<Reloadable>, TlsError> {
        self.identity.as_ref().map(Reloadable::load).transpose()
    }

    /// The rustls client configuration: its trust roots read from the
    /// files now, presenting `identity` ([`ClientTls::identity`]) as it
    /// stands at each handshake.
    pub fn client_config(&self, identity: Option<&Reloadable>) -> Result<ClientConfig, TlsError> {
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots(self.ca.as_deref())?);
        Ok(match identity {
            None => builder.with_no_client_auth(),
            Some(identity) => {
                let mut config = builder.with_client_cert_resolver(identity.current.clone());
                // A resumed session presents no certificate, and the
                // server would go on seeing the one the session began
                // with: after a reload, every new connection presents
                // the certificate in use.
                config.resumption = rustls::client::Resumption::disabled();
                config
            }
        })
    }
}

/// A certificate and its key read from files, presented by new handshakes
/// until a reload reads them again: a listener's, or the client
/// certificate of a route's upstream connections. Its clones present and
/// reload one certificate.
#[derive(Debug, Clone)]
pub struct Reloadable {
    files: CertPair,
    current: Arc<CurrentCertificate>,
}

impl Reloadable {
    fn load(files: &CertPair) -> Result<Self, TlsError> {
        Ok(Reloadable::with(
            files,
            certified_key(&files.cert, &files.key)?,
        ))
    }

    fn with(files: &CertPair, certified: CertifiedKey) -> Self {
        Reloadable {
            files: files.clone(),
            current: Arc::new(CurrentCertificate(RwLock::new(Arc::new(certified)))),
        }
    }

    /// Reads the files again; new handshakes get the new certificate. On
    /// error the certificate in use stays: a certificate outside its
    /// validity period is one, since every peer would refuse it and the
    /// one in use serves them no worse.
    pub fn reload(&self) -> Result<(), TlsError> {
        let fresh = certified_key(&self.files.cert, &self.files.key)?;
        if let Some(error) = outside_validity(&fresh, &self.files.cert) {
            return Err(error);
        }
        *self
            .current
            .0
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(fresh);
        Ok(())
    }
}

/// A listener's TLS: its acceptor, and the files it reloads from.
pub struct ServerTls {
    /// `proxy` or `admin`, for logs.
    listener: &'static str,
    certificate: Reloadable,
    acceptor: TlsAcceptor,
}

impl ServerTls {
    /// The listener's configuration around the certificate read from
    /// `files` (which it reloads from): HTTP/2 and HTTP/1.1 offered by ALPN
    /// (`h2` first; `connection.rs` serves either), TLS 1.2 and 1.3,
    /// no client certificates.
    fn new(
        listener: &'static str,
        files: &CertPair,
        certified: CertifiedKey,
    ) -> Result<Self, TlsError> {
        let certificate = Reloadable::with(files, certified);
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(certificate.current.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(ServerTls {
            listener,
            certificate,
            acceptor: TlsAcceptor::from(Arc::new(config)),
        })
    }

    pub fn acceptor(&self) -> &TlsAcceptor {
        &self.acceptor
    }

    pub fn listener(&self) -> &'static str {
        self.listener
    }

    /// Reads the files again ([`Reloadable::reload`]).
    pub fn reload(&self) -> Result<(), TlsError> {
        self.certificate.reload()
    }
}

/// The certificate new handshakes get. std RwLock: held only to clone or
/// replace an `Arc`, never across `.await`.
#[derive(Debug)]
struct CurrentCertificate(RwLock<Arc<CertifiedKey>>);

impl CurrentCertificate {
    fn now(&self) -> Arc<CertifiedKey> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl ResolvesServerCert for CurrentCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.now())
    }
}

/// As rustls's `SingleCertAndKey` presents its one certificate to every
/// server that asks, whatever it names as its CAs.
impl ResolvesClientCert for CurrentCertificate {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _schemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.now())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Config {
        Config::from_toml_str(text, "t.toml").unwrap()
    }

    fn error_of(config: &Config) -> String {
        match read(config) {
            Ok(_) => panic!("read unusable TLS files"),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn a_file_that_cannot_be_read_is_named_by_the_field_naming_it() {
        let https = "[[routes]]\nname = \"api\"\nupstream = \"https://127.0.0.1:9\"\n";
        let cases = [
            (
                format!("{https}upstream_ca = \"/none/ca.pem\"\n"),
                "routes[0].upstream_ca",
                "/none/ca.pem",
            ),
            (
                format!(
                    "{https}upstream_client_cert = \"/none/c.pem\"\nupstream_client_key = \"k\"\n"
                ),
                "routes[0].upstream_client_cert",
                "/none/c.pem",
            ),
            (
                format!(
                    "[server]\nadmin_tls_cert = \"/none/a.pem\"\nadmin_tls_key = \"k\"\n{https}"
                ),
                "server.admin_tls_cert",
                "/none/a.pem",
            ),
        ];
        for (text, field, file) in cases {
            let err = error_of(&config(&text));
            let named = format!("field `{field}`: {file}: cannot read");
            assert!(err.starts_with(&named), "{err}");
        }
    }

    #[test]
    fn a_key_file_that_holds_no_key_is_named_by_the_key_field() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("cert.pem");
        let certified = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        std::fs::write(&cert, certified.cert.pem()).unwrap();
        let text = format!(
            "[server]\ntls_cert = \"{0}\"\ntls_key = \"{0}\"\n[[routes]]\nname = \"a\"\nupstream = \"http://127.0.0.1:9\"\n",
            cert.display()
        );
        let err = error_of(&config(&text));
        assert!(
            err.starts_with("field `server.tls_key`: ") && err.contains("no PEM private key"),
            "{err}"
        );
        let key = dir.path().join("key.pem");
        std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
        let good = text.replacen(
            &format!("tls_key = \"{}\"", cert.display()),
            &format!("tls_key = \"{}\"", key.display()),
            1,
        );
        let listeners = read(&config(&good)).unwrap();
        assert!(listeners.proxy.is_some() && listeners.admin.is_none());
    }

    /// The base64 decoder's words named one of the key's characters and
    /// where it was (`InvalidCharacter(33)`).
    #[test]
    fn a_garbled_key_is_said_to_be_without_its_characters() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key.pem");
        let garbled = "-----BEGIN PRIVATE KEY-----\nMIIEv!QIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\n";
        std::fs::write(&key, garbled).unwrap();
        let err = private_key(&key).unwrap_err().to_string();
        assert!(err.ends_with("a block's base64 does not decode"), "{err}");
        assert!(!err.contains("33") && !err.contains('!'), "{err}");
    }

    #[test]
    fn an_encrypted_key_is_said_to_be_encrypted() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key.pem");
        // The label or the header is what says so; what the block holds
        // is never read.
        let pkcs8 = "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIFHDBOBgkqhkiG9w0BBQ0wQTApBgkqhkiG9w0BBQwwHAQI\n-----END ENCRYPTED PRIVATE KEY-----\n";
        let legacy = "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,5FB270A6F1BE3B81E9DF3819CD2948E4\n\nMIIEpAIBAAKCAQEA\n-----END RSA PRIVATE KEY-----\n";
        for encrypted in [pkcs8, legacy] {
            std::fs::write(&key, encrypted).unwrap();
            let err = private_key(&key).unwrap_err().to_string();
            assert!(
                err.contains("the private key is encrypted") && err.contains("decrypt it first"),
                "{err}"
            );
        }
    }
}
