//! The PostgreSQL store over TLS, as a managed service serves it: a
//! [`PostgresFront`] stands in front of the test server, speaking only TLS
//! with a certificate of a CA made for the test (or none at all), whatever
//! the test server itself offers.
//!
//! - `idemgate migrate` and a gateway on `sslmode=verify-full` with that CA
//!   as `sslrootcert` prepare the schema, claim, record and replay a
//!   write, every connection through the TLS server (it counts their
//!   handshakes and hangs up on a client that starts in clear).
//! - A URL asking for TLS that cannot be had does not start a gateway,
//!   saying why: `require` against a server without TLS, `verify-full`
//!   (or `require` with `sslrootcert`, as libpq reads it) against a
//!   certificate another CA signed.
//!
//! What `check-config` refuses of the TLS settings (what the driver cannot
//! do) is in `config_and_cli.rs`, with the other URLs it and `serve` read.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::common::*;
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

const ORDER: &str = r#"{"order":"o-1","amount":250}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn a_gateway_keeps_its_store_over_verified_tls() {
    let pki = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new(pki.path(), "pg-ca");
    let server = PostgresFront::tls_only(&ca.server_cert(pki.path(), "pg")).await;
    let schema = PgSchema::create().await;
    let url = server.url_into(&schema, &verify_full(&ca));

    let mut migrate = binary();
    migrate.args(["migrate", "--store", &url]);
    let (status, stdout, stderr) = run_to_exit(migrate).await;
    assert!(status.success(), "migrate over TLS: {stdout}{stderr}");
    let migrated = server.handshakes();
    assert!(migrated > 0, "migrate connected through the TLS server");

    let setup = Setup::route("")
        .shared_store(&url, &schema.scope_key_file)
        .admin();
    let mut gw = spawn_gateway_with(setup).await;
    let first = write(gw.addr(), "/orders", Some("k-tls"), ORDER).await;
    assert_fresh_created(&first);
    assert_replay_of(
        &write(gw.addr(), "/orders", Some("k-tls"), ORDER).await,
        &first,
    );
    assert_eq!(gw.upstream.writes(), 1);
    let op = gw.operation("k-tls").await;
    assert_eq!(op["state"], "completed", "{op}");
    assert!(
        server.handshakes() > migrated,
        "the gateway connected through the TLS server"
    );
    gw.shutdown().await;

    // What the gateway recorded is in the test server's schema.
    let mut conn = admin_connection().await;
    let recorded: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM {}.operations WHERE state = 'completed'",
        schema.name
    ))
    .fetch_one(&mut conn)
    .await
    .expect("count operations");
    assert_eq!(recorded, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn tls_that_cannot_be_had_stops_the_start_saying_why() {
    let pki = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new(pki.path(), "pg-ca");
    let other = TestCa::new(pki.path(), "other-ca");
    let server = PostgresFront::tls_only(&ca.server_cert(pki.path(), "pg")).await;
    let schema = PgSchema::create().await;

    let plain = PostgresFront::without_tls().await;
    let refused = refused_at_start(&plain.url_into(&schema, "sslmode=require"), &schema).await;
    assert!(
        refused.contains("cannot open the store") && refused.contains("does not support TLS"),
        "{refused}"
    );

    // A certificate the named CA did not sign is not trusted.
    let untrusted = server.url_into(&schema, &verify_full(&other));
    let refused = refused_at_start(&untrusted, &schema).await;
    assert!(
        refused.contains("cannot open the store") && refused.contains("UnknownIssuer"),
        "{refused}"
    );
    // `require` with a root certificate verifies it, as libpq's does.
    let require = verify_full(&other).replace("verify-full", "require");
    let refused = refused_at_start(&server.url_into(&schema, &require), &schema).await;
    assert!(refused.contains("UnknownIssuer"), "{refused}");
    assert_eq!(server.handshakes(), 0, "no handshake completed");
}

/// The query that asks for TLS verified against `ca`'s certificate, the
/// server's name checked.
fn verify_full(ca: &TestCa) -> String {
    let file = ca.pem.display().to_string();
    format!(
        "sslmode=verify-full&sslrootcert={}",
        utf8_percent_encode(&file, NON_ALPHANUMERIC)
    )
}

/// Why a gateway on the store at `url` (with `schema`'s scope key) does
/// not start.
async fn refused_at_start(url: &str, schema: &PgSchema) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let setup = Setup::route("").shared_store(url, &schema.scope_key_file);
    let toml = gateway_toml_with(
        &dir.path().join("unused.db"),
        "http://upstream.example",
        &setup,
    );
    let start = idemgate::server::Gateway::start(parse_config(&toml));
    match tokio::time::timeout(WAIT, start).await {
        Ok(Err(refused)) => refused.to_string(),
        Ok(Ok(gateway)) => {
            gateway.shutdown().await;
            panic!("a gateway started on {url}")
        }
        Err(_) => panic!("the start on {url} did not end"),
    }
}

/// What a client sends first to ask for TLS (the protocol's SSLRequest):
/// length 8, then the code 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

/// A PostgreSQL server on a port of 127.0.0.1 that offers TLS as the test
/// says, whatever the test server behind it offers: it answers a client's
/// SSLRequest and relays the rest to the test server in clear.
struct PostgresFront {
    port: u16,
    /// Handshakes completed: connections that reached the server over TLS.
    handshakes: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

/// What a [`PostgresFront`] answers an SSLRequest.
#[derive(Clone)]
enum Offers {
    /// `S`, then the handshake with this certificate; a client that
    /// starts in clear is hung up on.
    TlsOnly(tokio_rustls::TlsAcceptor),
    /// `N`, as a server with `ssl = off`; the client goes on in clear.
    NoTls,
}

impl PostgresFront {
    /// A server that speaks only TLS, presenting `identity`.
    async fn tls_only(identity: &PemPair) -> PostgresFront {
        let acceptor = tokio_rustls::TlsAcceptor::from(server_config(identity));
        PostgresFront::start(Offers::TlsOnly(acceptor)).await
    }

    /// A server that speaks no TLS.
    async fn without_tls() -> PostgresFront {
        PostgresFront::start(Offers::NoTls).await
    }

    async fn start(offers: Offers) -> PostgresFront {
        let test_server: sqlx::postgres::PgConnectOptions =
            postgres_url().parse().expect("the test server's URL");
        let behind = (test_server.get_host().to_string(), test_server.get_port());
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let handshakes = Arc::new(AtomicUsize::new(0));
        let counted = handshakes.clone();
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let (offers, behind, counted) = (offers.clone(), behind.clone(), counted.clone());
                connections.spawn(async move {
                    let _ = relay(client, offers, behind, &counted).await;
                });
                while connections.try_join_next().is_some() {}
            }
        });
        PostgresFront {
            port,
            handshakes,
            task,
        }
    }

    fn handshakes(&self) -> usize {
        self.handshakes.load(Ordering::SeqCst)
    }

    /// `schema`'s URL with this server in place of the test server
    /// (127.0.0.1, which the certificate names) and `tls` added.
    fn url_into(&self, schema: &PgSchema, tls: &str) -> String {
        let (scheme, rest) = schema.url.split_once("://").expect("a URL");
        let (authority, tail) = rest.split_at(rest.find('/').expect("a database"));
        let user = authority.rfind('@').map_or("", |at| &authority[..=at]);
        format!("{scheme}://{user}127.0.0.1:{}{tail}&{tls}", self.port)
    }
}

impl Drop for PostgresFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves one `client` as `offers` says, relaying to the test server at
/// `behind` until either side ends; a completed handshake is `counted`.
async fn relay(
    mut client: TcpStream,
    offers: Offers,
    behind: (String, u16),
    counted: &AtomicUsize,
) -> std::io::Result<()> {
    // A startup message is longer: these 8 bytes are an SSLRequest or
    // the start of another message.
    let mut first = [0; 8];
    client.read_exact(&mut first).await?;
    let asks_tls = first == SSL_REQUEST;
    let mut server = TcpStream::connect(behind).await?;
    match offers {
        Offers::TlsOnly(acceptor) if asks_tls => {
            client.write_all(b"S").await?;
            let mut tls = acceptor.accept(client).await?;
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::io::copy_bidirectional(&mut tls, &mut server).await?;
        }
        Offers::TlsOnly(_) => {}
        Offers::NoTls => {
            match asks_tls {
                true => client.write_all(b"N").await?,
                false => server.write_all(&first).await?,
            }
            tokio::io::copy_bidirectional(&mut client, &mut server).await?;
        }
    }
    Ok(())
}
