//! TLS for the tests: [`TestCa`] makes a CA and the certificates it signs at
//! test time (no key is checked in), written as PEM files; [`TlsClient`] is
//! one kept-alive HTTP/1.1 connection over TLS that trusts a given CA.

use super::*;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::TlsConnector;

/// A certificate authority made for one test.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    /// The CA certificate as a PEM file, for `upstream_ca` and clients.
    pub pem: PathBuf,
}

/// A certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct PemPair {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The certificate as issued (the file may be replaced since).
    issued: CertificateDer<'static>,
}

impl PemPair {
    /// The certificate as issued, to compare with what a peer presented.
    pub fn der(&self) -> CertificateDer<'static> {
        self.issued.clone()
    }

    fn load(&self) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        let chain = CertificateDer::pem_file_iter(&self.cert)
            .expect("certificate file")
            .collect::<Result<Vec<_>, _>>()
            .expect("certificate PEM");
        let key = PrivateKeyDer::from_pem_file(&self.key).expect("key PEM");
        (chain, key)
    }
}

impl PemPair {
    /// `cert` and `key` written to `dir/<name>.crt` and `dir/<name>.key`.
    fn write(dir: &Path, name: &str, cert: &rcgen::Certificate, key: &KeyPair) -> PemPair {
        let pair = PemPair {
            cert: dir.join(format!("{name}.crt")),
            key: dir.join(format!("{name}.key")),
            issued: cert.der().clone(),
        };
        std::fs::write(&pair.cert, cert.pem()).expect("write certificate");
        std::fs::write(&pair.key, key.serialize_pem()).expect("write key");
        pair
    }
}

/// A leaf certificate's parameters: `name` as its common name, `names` as
/// its subject alternative names, for `usage`.
fn leaf_params(
    name: &str,
    names: Vec<String>,
    usage: ExtendedKeyUsagePurpose,
) -> CertificateParams {
    let mut params = CertificateParams::new(names).expect("leaf params");
    params.distinguished_name.push(DnType::CommonName, name);
    params.extended_key_usages = vec![usage];
    params
}

/// A self-signed server certificate for `127.0.0.1`, written like
/// [`TestCa::server_cert`]; with `ca`, marked a CA (`basicConstraints
/// CA:TRUE`), as `openssl req -x509` makes one unless told otherwise.
pub fn self_signed_server_cert(dir: &Path, name: &str, ca: bool) -> PemPair {
    let mut params = leaf_params(
        name,
        vec!["127.0.0.1".into()],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    if ca {
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    }
    let key = KeyPair::generate().expect("key");
    let cert = params.self_signed(&key).expect("self-signed certificate");
    PemPair::write(dir, name, &cert, &key)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl TestCa {
    /// A new CA named `name`; its certificate is written to `dir/<name>.pem`.
    pub fn new(dir: &Path, name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("CA key");
        let issuer = CertifiedIssuer::self_signed(params, key).expect("CA certificate");
        let pem = dir.join(format!("{name}.pem"));
        std::fs::write(&pem, issuer.pem()).expect("write CA");
        TestCa { issuer, pem }
    }

    /// A server certificate for `127.0.0.1` and `localhost`, written to
    /// `dir/<name>.crt` and `dir/<name>.key`.
    pub fn server_cert(&self, dir: &Path, name: &str) -> PemPair {
        self.issue(
            dir,
            name,
            vec!["127.0.0.1".into(), "localhost".into()],
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// A server certificate for `names` only (e.g. a DNS name a client
    /// is told to check, not the address it connects to), written like
    /// [`TestCa::server_cert`].
    pub fn server_cert_for(&self, dir: &Path, name: &str, names: &[&str]) -> PemPair {
        let names = names.iter().map(|n| n.to_string()).collect();
        self.issue(dir, name, names, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// Like [`TestCa::server_cert`], valid only during 2020: expired.
    pub fn expired_server_cert(&self, dir: &Path, name: &str) -> PemPair {
        let mut params = leaf_params(
            name,
            vec!["127.0.0.1".into(), "localhost".into()],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        let key = KeyPair::generate().expect("leaf key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("leaf certificate");
        PemPair::write(dir, name, &cert, &key)
    }

    /// A client certificate (mTLS), written like [`TestCa::server_cert`].
    pub fn client_cert(&self, dir: &Path, name: &str) -> PemPair {
        self.issue(dir, name, vec![], ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn issue(
        &self,
        dir: &Path,
        name: &str,
        names: Vec<String>,
        usage: ExtendedKeyUsagePurpose,
    ) -> PemPair {
        let key = KeyPair::generate().expect("leaf key");
        let cert = leaf_params(name, names, usage)
            .signed_by(&key, &self.issuer)
            .expect("leaf certificate");
        PemPair::write(dir, name, &cert, &key)
    }

    fn roots(&self) -> RootCertStore {
        let mut roots = RootCertStore::empty();
        roots
            .add(self.issuer.der().clone())
            .expect("CA is a trust root");
        roots
    }

    /// A client configuration that trusts this CA only; presents `identity`
    /// if given.
    pub fn client_config(&self, identity: Option<&PemPair>) -> ClientConfig {
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(self.roots());
        match identity {
            None => builder.with_no_client_auth(),
            Some(pair) => {
                let (chain, key) = pair.load();
                builder
                    .with_client_auth_cert(chain, key)
                    .expect("client certificate")
            }
        }
    }

    /// A server configuration presenting `identity` that requires a client
    /// certificate signed by this CA.
    pub fn server_requiring_clients(&self, identity: &PemPair) -> Arc<ServerConfig> {
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(self.roots()), provider())
                .build()
                .expect("client verifier");
        let (chain, key) = identity.load();
        let config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .expect("server certificate");
        Arc::new(config)
    }
}

/// A server configuration presenting `identity`, no client certificates.
pub fn server_config(identity: &PemPair) -> Arc<ServerConfig> {
    let (chain, key) = identity.load();
    let config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("server certificate");
    Arc::new(config)
}

/// The `[server]` lines for a TLS proxy listener with `pair`.
pub fn tls_listener_lines(pair: &PemPair) -> String {
    format!(
        "tls_cert = \"{}\"\ntls_key = \"{}\"\n",
        pair.cert.display(),
        pair.key.display()
    )
}

/// One HTTP/1.1 connection over TLS, kept open between requests.
pub struct TlsClient {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    /// The leaf certificate the server presented in the handshake.
    pub peer_certificate: CertificateDer<'static>,
}

impl TlsClient {
    /// Connects to `addr` (a server for `127.0.0.1`) trusting `config`'s
    /// roots; `Err` when the connection or the handshake fails.
    pub async fn connect(addr: SocketAddr, config: ClientConfig) -> Result<TlsClient, String> {
        let connect = async {
            let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
            let name = ServerName::try_from("127.0.0.1").expect("server name");
            let tls = TlsConnector::from(Arc::new(config))
                .connect(name, tcp)
                .await
                .map_err(|e| format!("handshake: {e}"))?;
            let peer_certificate = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .expect("the server presented a certificate")
                .clone()
                .into_owned();
            let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(connection);
            Ok(TlsClient {
                sender,
                peer_certificate,
            })
        };
        tokio::time::timeout(WAIT, connect)
            .await
            .unwrap_or_else(|_| Err("connect timed out".into()))
    }

    /// Sends one request on this connection and reads the whole response.
    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Response {
        let request = build_request(method, path, headers, body).expect("request");
        let exchange = async {
            self.sender
                .ready()
                .await
                .map_err(|e| Exchange::Failed(e.to_string()))?;
            let response = self
                .sender
                .send_request(request)
                .await
                .map_err(|e| Exchange::Failed(format!("{e:?}")))?;
            read_whole(response).await
        };
        match tokio::time::timeout(WAIT, exchange).await {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => panic!("{method} {path} over TLS failed: {e:?}"),
            Err(_) => panic!("{method} {path} over TLS timed out"),
        }
    }

    /// A JSON POST as [`ALICE`] with `key`, like [`write`].
    pub async fn write(&mut self, path: &str, key: &str, body: &str) -> Response {
        let headers = [
            ("content-type", "application/json"),
            ("idempotency-key", key),
            ("authorization", ALICE),
        ];
        self.send("POST", path, &headers, body.to_owned()).await
    }
}
