//! TLS: the proxy and admin listeners over TLS (each with its own
//! certificate), a SIGHUP that swaps the certificate without dropping open
//! connections (the real binary), https upstreams trusted through
//! `upstream_ca` and presenting a client certificate, and that a TLS
//! failure is `not_attempted`, never `unknown`. Every certificate is made
//! at test time by [`TestCa`].

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use bytes::Bytes;
use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const BODY: &str = r#"{"invoice":"inv-9","amount":120}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_listener_over_tls_forwards_once_and_replays() {
    let pki = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new(pki.path(), "clients-ca");
    let identity = ca.server_cert(pki.path(), "proxy");
    let gw = spawn_gateway_with(Setup::route("").server(&tls_listener_lines(&identity))).await;

    let mut client = TlsClient::connect(gw.addr(), ca.client_config(None))
        .await
        .expect("TLS connection");
    assert_eq!(client.peer_certificate, identity.der());
    let first = client.write("/invoices", "tls-1", BODY).await;
    assert_fresh_created(&first);
    // The same kept-alive connection: the retry is a replay.
    let again = client.write("/invoices", "tls-1", BODY).await;
    assert_replay_of(&again, &first);
    assert_eq!(gw.upstream.writes(), 1);
    let forwarded = &gw.upstream.write_requests()[0];
    assert_eq!(forwarded.header("x-forwarded-proto"), Some("https"));

    // The listener speaks TLS only: plain HTTP gets no answer.
    let plain = try_send(gw.addr(), "GET", "/x", &[], Bytes::new(), WAIT).await;
    assert!(plain.is_err(), "plain HTTP was served: {plain:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_closed_tls_client_still_gets_its_answer() {
    let pki = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new(pki.path(), "ca");
    let identity = ca.server_cert(pki.path(), "proxy");
    let gw = spawn_gateway_with(Setup::route("").server(&tls_listener_lines(&identity))).await;

    let tcp = TcpStream::connect(gw.addr()).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(ca.client_config(None)))
        .connect(name, tcp)
        .await
        .expect("handshake");
    let mut request = raw_write_head(
        "/invoices",
        "application/json",
        "half-1",
        &[&format!("content-length: {}", BODY.len())],
    )
    .into_bytes();
    request.extend_from_slice(BODY.as_bytes());
    tls.write_all(&request).await.expect("write");
    // close_notify, then the TCP write side is shut: the request is whole.
    tls.shutdown().await.expect("half-close");
    let mut answer = Vec::new();
    tokio::time::timeout(WAIT, tls.read_to_end(&mut answer))
        .await
        .expect("answer in time")
        .expect("read");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 201"), "{text}");
    assert_eq!(gw.upstream.writes(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_listener_has_its_own_certificate() {
    let pki = tempfile::tempdir().expect("tempdir");
    let operators = TestCa::new(pki.path(), "operators-ca");
    let admin_identity = operators.server_cert(pki.path(), "admin");
    let server = format!(
        "admin_tls_cert = \"{}\"\nadmin_tls_key = \"{}\"\n",
        admin_identity.cert.display(),
        admin_identity.key.display()
    );
    let gw = spawn_gateway_with(Setup::route("").server(&server).admin()).await;

    // The proxy listener stays plain.
    assert_fresh_created(&write(gw.addr(), "/invoices", Some("adm-1"), BODY).await);
    let mut admin = TlsClient::connect(gw.admin_addr(), operators.client_config(None))
        .await
        .expect("admin over TLS");
    assert_eq!(admin.peer_certificate, admin_identity.der());
    let health = admin.send("GET", "/healthz", &[], Bytes::new()).await;
    assert_eq!(health.status, StatusCode::OK);
    let bearer = format!("Bearer {}", gw.admin_token());
    let keys = admin
        .send(
            "GET",
            "/admin/keys?key=adm-1",
            &[("authorization", &bearer)],
            Bytes::new(),
        )
        .await;
    assert_eq!(keys.status, StatusCode::OK, "{:?}", keys.body);
    assert_eq!(keys.json()["items"][0]["state"], "completed");
    // Not plain HTTP.
    let plain = try_send(gw.admin_addr(), "GET", "/healthz", &[], Bytes::new(), WAIT).await;
    assert!(plain.is_err(), "plain HTTP was served: {plain:?}");

    // `idemgate keys` trusts the operators' CA with --ca, and only then.
    let keys = |ca: Option<&Path>| {
        let mut cmd = binary();
        cmd.args(["keys", "list", "--key", "adm-1", "--json", "--admin"])
            .arg(format!("https://{}", gw.admin_addr()))
            .args(["--token-env", "TLS_TEST_ADMIN_TOKEN"])
            .env("TLS_TEST_ADMIN_TOKEN", gw.admin_token());
        if let Some(ca) = ca {
            cmd.arg("--ca").arg(ca);
        }
        cmd
    };
    let (status, stdout, stderr) = run_to_exit(keys(Some(&operators.pem))).await;
    assert!(status.success(), "{stderr}");
    assert!(stdout.contains("\"completed\""), "{stdout}");
    let (status, _, stderr) = run_to_exit(keys(None)).await;
    assert!(!status.success());
    assert!(stderr.contains("certificate"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_handshake_holds_a_connection_slot_until_header_read_timeout() {
    let pki = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new(pki.path(), "ca");
    let identity = ca.server_cert(pki.path(), "proxy");
    let server = format!(
        "{}max_connections = 1\nheader_read_timeout = \"1s\"\n",
        tls_listener_lines(&identity)
    );
    let gw = spawn_gateway_with(Setup::route("").server(&server)).await;

    // Taken before connecting: the gateway's timer starts later, at accept.
    let connecting = std::time::Instant::now();
    let mut silent = TcpStream::connect(gw.addr()).await.expect("connect");
    // Accepted first (the listener accepts in order): the slot is the
    // silent connection's.
    let mut refused = TlsClient::connect(gw.addr(), ca.client_config(None))
        .await
        .expect("a refused connection still completes its handshake");
    refused
        .send("GET", "/x", &[], Bytes::new())
        .await
        .assert_problem(503, "overloaded");

    // The gateway cuts the silent client off, not before
    // header_read_timeout; the slot frees.
    let mut rest = Vec::new();
    tokio::time::timeout(WAIT, silent.read_to_end(&mut rest))
        .await
        .expect("the stalled handshake was never cut off")
        .ok();
    assert!(
        connecting.elapsed() >= Duration::from_secs(1),
        "cut off after {:?}, before header_read_timeout",
        connecting.elapsed()
    );
    eventually("the stalled handshake's slot to come free", || async {
        let mut client = TlsClient::connect(gw.addr(), ca.client_config(None))
            .await
            .ok()?;
        let response = client.send("GET", "/x", &[], Bytes::new()).await;
        (response.status == StatusCode::OK).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_swaps_the_certificate_and_keeps_open_connections() {
    let upstream = FakeUpstream::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new(dir.path(), "ca");
    let first = ca.server_cert(dir.path(), "proxy");
    // Relative paths: resolved against the config file's directory, not
    // the process's working directory.
    let toml = gateway_toml_with(
        &dir.path().join("idemgate.db"),
        &upstream.url(),
        &Setup::route("").server("tls_cert = \"proxy.crt\"\ntls_key = \"proxy.key\"\n"),
    );
    let config = write_config(dir.path(), "idemgate.toml", &toml);
    let gateway = BinaryGateway::start(&config, &dir.path().join("gateway.log")).await;

    let mut kept = TlsClient::connect(gateway.proxy, ca.client_config(None))
        .await
        .expect("TLS connection");
    assert_eq!(kept.peer_certificate, first.der());
    assert_fresh_created(&kept.write("/invoices", "hup-1", BODY).await);

    // New files in place (same paths), then SIGHUP.
    let second = ca.server_cert(dir.path(), "proxy");
    assert_ne!(first.der(), second.der());
    gateway.signal("HUP");
    let seen = within_wait(|| async {
        let client = TlsClient::connect(gateway.proxy, ca.client_config(None))
            .await
            .ok()?;
        (client.peer_certificate == second.der()).then_some(client)
    })
    .await;
    let mut fresh = seen.unwrap_or_else(|| {
        panic!(
            "new connections never saw the new certificate; log:\n{}",
            gateway.stderr()
        )
    });
    assert_fresh_created(&fresh.write("/invoices", "hup-2", BODY).await);
    // The connection opened before the reload was not dropped.
    let replay = kept.write("/invoices", "hup-1", BODY).await;
    assert!(replay.is_replay(), "{replay:?}");

    // A reload that fails keeps the certificate in use.
    std::fs::write(dir.path().join("proxy.crt"), "not a certificate").expect("garble");
    gateway.signal("HUP");
    let logged = gateway.wait_for_log("TLS certificate not reloaded").await;
    assert!(logged.contains("proxy.crt"), "{logged}");
    let after = TlsClient::connect(gateway.proxy, ca.client_config(None))
        .await
        .expect("still serving TLS");
    assert_eq!(after.peer_certificate, second.der());
    assert_eq!(upstream.writes(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_upstream_with_a_private_ca() {
    let pki = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new(pki.path(), "private-ca");
    let upstream = FakeUpstream::start_tls(server_config(&ca.server_cert(pki.path(), "api"))).await;
    let route = format!("upstream_ca = \"{}\"\n", ca.pem.display());
    let gw = spawn_gateway_on(upstream, Setup::route(&route)).await;

    let first = write(gw.addr(), "/invoices", Some("up-1"), BODY).await;
    assert_fresh_created(&first);
    assert_replay_of(
        &write(gw.addr(), "/invoices", Some("up-1"), BODY).await,
        &first,
    );
    let read = send(gw.addr(), "GET", "/invoices/1", &[], Bytes::new()).await;
    assert_eq!(read.status, StatusCode::OK);
    assert_eq!(gw.upstream.writes(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_upstream_is_not_attempted_and_sent_once_when_trusted() {
    let pki = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new(pki.path(), "private-ca");
    let upstream = FakeUpstream::start_tls(server_config(&ca.server_cert(pki.path(), "api"))).await;
    // No upstream_ca: only the public roots, which do not know this CA.
    let mut gw = spawn_gateway_on(upstream, Setup::route("connect_retries = 1\n").admin()).await;

    let refused = write(gw.addr(), "/invoices", Some("untrusted-1"), BODY).await;
    let problem = refused.assert_operation_problem(502, "upstream-unreachable", "not_attempted");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("certificate")),
        "{problem}"
    );
    let operation = gw.operation("untrusted-1").await;
    assert_eq!(operation["state"], "not_attempted", "{operation}");
    assert_eq!(operation["attempts"], 1, "{operation}");
    assert!(
        gw.upstream.connections() >= 2,
        "a retry per connect_retries"
    );
    assert_eq!(gw.upstream.requests().len(), 0);
    assert_eq!(gw.upstream.writes(), 0);

    // Trust the CA; the client's retry is the next attempt, sent once.
    gw.shutdown().await;
    gw.toml = gw.toml.replace(
        "connect_retries = 1\n",
        &format!(
            "connect_retries = 1\nupstream_ca = \"{}\"\n",
            ca.pem.display()
        ),
    );
    gw.start_again().await;
    let retry = write(gw.addr(), "/invoices", Some("untrusted-1"), BODY).await;
    assert_fresh_created(&retry);
    assert_eq!(gw.upstream.writes(), 1);
    let operation = gw.operation("untrusted-1").await;
    assert_eq!(operation["state"], "completed", "{operation}");
    assert_eq!(operation["attempts"], 2, "{operation}");
    assert!(
        events_of(&operation, "outcome_unknown").is_empty(),
        "{operation}"
    );
}

/// A route to an upstream whose certificate `servers` signed, presenting
/// `identity` when it asks for one.
fn mtls_route(servers: &TestCa, identity: &PemPair) -> String {
    format!(
        "upstream_ca = \"{}\"\nupstream_client_cert = \"{}\"\nupstream_client_key = \"{}\"\n",
        servers.pem.display(),
        identity.cert.display(),
        identity.key.display()
    )
}

/// The binary, to signal, with one `route` to `upstream`, its files in `dir`.
async fn reloading_gateway(dir: &Path, upstream: &FakeUpstream, route: &str) -> BinaryGateway {
    let toml = gateway_toml_with(
        &dir.join("idemgate.db"),
        &upstream.url(),
        &Setup::route(route),
    );
    let config = write_config(dir, "idemgate.toml", &toml);
    BinaryGateway::start(&config, &dir.join("gateway.log")).await
}

/// An upstream that requires client certificates signed by `clients`.
async fn mtls_upstream(pki: &Path, servers: &TestCa, clients: &TestCa) -> FakeUpstream {
    let identity = servers.server_cert(pki, "api");
    FakeUpstream::start_tls(clients.server_requiring_clients(&identity)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_requiring_client_certificates_accepts_the_gateways() {
    let pki = tempfile::tempdir().expect("tempdir");
    let servers = TestCa::new(pki.path(), "servers-ca");
    let clients = TestCa::new(pki.path(), "clients-ca");
    let upstream = mtls_upstream(pki.path(), &servers, &clients).await;
    let identity = clients.client_cert(pki.path(), "gateway");
    let gw = spawn_gateway_on(upstream, Setup::route(&mtls_route(&servers, &identity))).await;

    let first = write(gw.addr(), "/invoices", Some("mtls-1"), BODY).await;
    assert_fresh_created(&first);
    assert_replay_of(
        &write(gw.addr(), "/invoices", Some("mtls-1"), BODY).await,
        &first,
    );
    assert_eq!(gw.upstream.writes(), 1);
}

/// Upstream client certificates were read once, at start: one renewed in
/// place (short-lived certificates are) took a restart to present. A
/// SIGHUP reads them again, as it does the listeners'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_upstream_client_certificate() {
    let pki = tempfile::tempdir().expect("tempdir");
    let servers = TestCa::new(pki.path(), "servers-ca");
    let clients = TestCa::new(pki.path(), "clients-ca");
    let strangers = TestCa::new(pki.path(), "strangers-ca");
    let upstream = mtls_upstream(pki.path(), &servers, &clients).await;
    // A certificate the upstream no longer trusts...
    let identity = strangers.client_cert(pki.path(), "gateway");
    let gateway = reloading_gateway(pki.path(), &upstream, &mtls_route(&servers, &identity)).await;
    let refused = write(gateway.proxy, "/invoices", Some("renewed"), BODY).await;
    refused.assert_operation_problem(502, "upstream-unreachable", "not_attempted");
    // ...renewed in place by one it trusts, then SIGHUP.
    clients.client_cert(pki.path(), "gateway");
    gateway.signal("HUP");
    gateway
        .wait_for_log("upstream client certificate reloaded")
        .await;
    let sent = write(gateway.proxy, "/invoices", Some("renewed"), BODY).await;
    assert_fresh_created(&sent);
    assert_eq!(upstream.writes(), 1);
}

/// A reloaded client certificate is the one a new connection presents: a
/// resumed TLS session presents none, and the upstream goes on seeing the
/// certificate the session began with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_connection_after_a_reload_presents_the_new_client_certificate() {
    let pki = tempfile::tempdir().expect("tempdir");
    let servers = TestCa::new(pki.path(), "servers-ca");
    let clients = TestCa::new(pki.path(), "clients-ca");
    let upstream = mtls_upstream(pki.path(), &servers, &clients).await;
    let first = clients.client_cert(pki.path(), "gateway");
    let gateway = reloading_gateway(pki.path(), &upstream, &mtls_route(&servers, &first)).await;
    // Each write on a connection the upstream closes after it.
    assert_fresh_created(&write(gateway.proxy, "/close", Some("before"), BODY).await);
    let renewed = clients.client_cert(pki.path(), "gateway");
    assert_ne!(first.der(), renewed.der());
    gateway.signal("HUP");
    gateway
        .wait_for_log("upstream client certificate reloaded")
        .await;
    assert_fresh_created(&write(gateway.proxy, "/close", Some("after"), BODY).await);
    let presented: Vec<&str> = upstream
        .requests()
        .iter()
        .map(|r| match r.peer_certificate.as_deref() {
            Some(der) if der == first.der().as_ref() => "first",
            Some(der) if der == renewed.der().as_ref() => "renewed",
            Some(_) => "another",
            None => "none",
        })
        .collect();
    assert_eq!(presented, ["first", "renewed"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_refusing_the_gateways_certificate_is_not_attempted() {
    let pki = tempfile::tempdir().expect("tempdir");
    let servers = TestCa::new(pki.path(), "servers-ca");
    let clients = TestCa::new(pki.path(), "clients-ca");
    let strangers = TestCa::new(pki.path(), "strangers-ca");
    let upstream = mtls_upstream(pki.path(), &servers, &clients).await;
    let stranger = strangers.client_cert(pki.path(), "stranger");
    // Without a client certificate, then with one the upstream does not trust.
    let without = format!("upstream_ca = \"{}\"\n", servers.pem.display());
    let untrusted = format!(
        "{without}upstream_client_cert = \"{}\"\nupstream_client_key = \"{}\"\n",
        stranger.cert.display(),
        stranger.key.display()
    );
    let mut gw = spawn_gateway_on(upstream, Setup::route(&without).admin()).await;
    for (n, route) in [without.clone(), untrusted].iter().enumerate() {
        if n > 0 {
            gw.shutdown().await;
            gw.toml = gw.toml.replace(&without, route);
            gw.start_again().await;
        }
        let key = format!("mtls-refused-{n}");
        for _ in 0..2 {
            let refused = write(gw.addr(), "/invoices", Some(&key), BODY).await;
            refused.assert_operation_problem(502, "upstream-unreachable", "not_attempted");
        }
        let operation = gw.operation(&key).await;
        assert_eq!(operation["state"], "not_attempted", "{operation}");
        assert_eq!(operation["attempts"], 2, "{operation}");
        assert!(
            events_of(&operation, "outcome_unknown").is_empty(),
            "{operation}"
        );
    }
    assert_eq!(gw.upstream.requests().len(), 0);
    assert_eq!(gw.upstream.writes(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tls_files_are_refused_at_startup_naming_field_and_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new(dir.path(), "ca");
    let good = ca.server_cert(dir.path(), "good");
    let other = ca.server_cert(dir.path(), "other");
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "-----BEGIN CERTIFICATE-----\nnot base64!\n").expect("write");
    let missing = dir.path().join("missing.pem");
    let cases = [
        (
            format!(
                "tls_cert = \"{}\"\ntls_key = \"{}\"\n",
                missing.display(),
                good.key.display()
            ),
            "server.tls_cert",
            "missing.pem: cannot read",
        ),
        (
            format!(
                "tls_cert = \"{}\"\ntls_key = \"{}\"\n",
                garbage.display(),
                good.key.display()
            ),
            "server.tls_cert",
            "garbage.pem: not a PEM certificate file",
        ),
        (
            format!(
                "tls_cert = \"{}\"\ntls_key = \"{}\"\n",
                good.cert.display(),
                good.cert.display()
            ),
            "server.tls_key",
            "no PEM private key",
        ),
        (
            format!(
                "tls_cert = \"{}\"\ntls_key = \"{}\"\n",
                good.cert.display(),
                other.key.display()
            ),
            "server.tls_key",
            "cannot be used with the certificate",
        ),
        (
            format!("admin_tls_cert = \"{}\"\n", good.cert.display()),
            "server.admin_tls_key",
            "is required with `server.admin_tls_cert`",
        ),
    ];
    for (n, (server, field, reason)) in cases.iter().enumerate() {
        let toml = gateway_toml_with(
            &dir.path().join("idemgate.db"),
            "https://127.0.0.1:9",
            &Setup::route("").server(server),
        );
        let config = write_config(dir.path(), &format!("case-{n}.toml"), &toml);
        for command in ["check-config", "serve"] {
            let mut cmd = binary();
            match command {
                "serve" => cmd.arg("serve").arg("--config").arg(&config),
                _ => cmd.arg("check-config").arg(&config),
            };
            let (status, stdout, stderr) = run_to_exit(cmd).await;
            assert!(!status.success(), "{command} accepted case {n}: {stdout}");
            assert!(
                stderr.contains(&format!("field `{field}`")) && stderr.contains(reason),
                "{command}, case {n}: {stderr}"
            );
        }
    }
    // An upstream_ca that is no certificate, named by its route field.
    let toml = gateway_toml_with(
        &dir.path().join("idemgate.db"),
        "https://127.0.0.1:9",
        &Setup::route(&format!("upstream_ca = \"{}\"\n", good.key.display())),
    );
    let config = write_config(dir.path(), "ca.toml", &toml);
    let mut cmd = binary();
    cmd.arg("check-config").arg(&config);
    let (status, _, stderr) = run_to_exit(cmd).await;
    assert!(!status.success());
    assert!(
        stderr.contains("field `routes[0].upstream_ca`") && stderr.contains("good.key"),
        "{stderr}"
    );
}

/// `idemgate check-config` of `toml`, written to `dir`: (exit 0, stdout, stderr).
async fn check_config(dir: &Path, toml: &str) -> (bool, String, String) {
    let config = write_config(dir, "check.toml", toml);
    let mut cmd = binary();
    cmd.arg("check-config").arg(&config);
    let (status, stdout, stderr) = run_to_exit(cmd).await;
    (status.success(), stdout, stderr)
}

/// A self-signed upstream certificate made as `openssl req -x509` makes
/// one (a CA: `basicConstraints CA:TRUE`) is refused by webpki as the
/// upstream's own, whatever `upstream_ca` says: `check-config` warns of it
/// in those words, and a write's 502 says why in words too, not in
/// rustls's debug form. Made `CA:FALSE`, the same certificate is trusted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_self_signed_upstream_certificate_must_not_be_a_ca() {
    let pki = tempfile::tempdir().expect("tempdir");
    let as_ca = self_signed_server_cert(pki.path(), "as-ca", true);
    let upstream = FakeUpstream::start_tls(server_config(&as_ca)).await;
    let route = format!(
        "connect_retries = 0\nupstream_ca = \"{}\"\n",
        as_ca.cert.display()
    );
    let gw = spawn_gateway_on(upstream, Setup::route(&route)).await;

    let (ok, stdout, stderr) = check_config(pki.path(), &gw.toml).await;
    assert!(ok && stdout.trim() == "ok", "{stdout}{stderr}");
    assert!(
        stderr.starts_with("warning: field `routes[0].upstream_ca`: ")
            && stderr.contains("as-ca.crt")
            && stderr.contains("CA:TRUE")
            && stderr.contains("CA:FALSE"),
        "{stderr}"
    );

    let refused = write(gw.addr(), "/invoices", Some("self-ca-1"), BODY).await;
    let problem = refused.assert_operation_problem(502, "upstream-unreachable", "not_attempted");
    let detail = problem["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("is a CA certificate (CA:TRUE)") && !detail.contains("Other("),
        "{detail}"
    );
    assert_eq!(gw.upstream.writes(), 0);

    // The usual fix: the same kind of certificate, CA:FALSE.
    let plain = self_signed_server_cert(pki.path(), "plain", false);
    let upstream = FakeUpstream::start_tls(server_config(&plain)).await;
    let route = format!("upstream_ca = \"{}\"\n", plain.cert.display());
    let gw = spawn_gateway_on(upstream, Setup::route(&route)).await;
    let (ok, stdout, stderr) = check_config(pki.path(), &gw.toml).await;
    assert!(
        ok && stdout.trim() == "ok" && stderr.is_empty(),
        "{stdout}{stderr}"
    );
    assert_fresh_created(&write(gw.addr(), "/invoices", Some("self-1"), BODY).await);
    assert_eq!(gw.upstream.writes(), 1);
}

/// A listener certificate outside its validity period: a SIGHUP that
/// finds one refuses it as it refuses a garbled file (the good certificate
/// stays, the log says why); `check-config`, and a start, warn of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_certificate_is_refused_by_a_reload_and_warned_of_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new(dir.path(), "ca");
    let good = ca.server_cert(dir.path(), "proxy");
    let toml = gateway_toml_with(
        &dir.path().join("idemgate.db"),
        "http://127.0.0.1:9",
        &Setup::route("").server("tls_cert = \"proxy.crt\"\ntls_key = \"proxy.key\"\n"),
    );
    let config = write_config(dir.path(), "idemgate.toml", &toml);
    let gateway = BinaryGateway::start(&config, &dir.path().join("gateway.log")).await;

    ca.expired_server_cert(dir.path(), "proxy");
    let (ok, stdout, stderr) = check_config(dir.path(), &toml).await;
    assert!(ok && stdout.trim() == "ok", "{stdout}{stderr}");
    assert!(
        stderr.starts_with("warning: field `server.tls_cert`: ")
            && stderr.contains("proxy.crt")
            && stderr.contains("expired"),
        "{stderr}"
    );

    gateway.signal("HUP");
    let logged = gateway.wait_for_log("TLS certificate not reloaded").await;
    assert!(
        logged.contains("proxy.crt") && logged.contains("expired"),
        "{logged}"
    );
    assert!(!logged.contains("TLS certificate reloaded"), "{logged}");
    let after = TlsClient::connect(gateway.proxy, ca.client_config(None))
        .await
        .expect("still serving the good certificate");
    assert_eq!(after.peer_certificate, good.der());
    drop(gateway);

    // Started with it: serves (the admin listener with it), and says why
    // TLS clients will refuse the proxy's certificate.
    let restarted = BinaryGateway::start(&config, &dir.path().join("again.log")).await;
    let logged = restarted.wait_for_log("outside its validity period").await;
    assert!(logged.contains("proxy.crt"), "{logged}");
}
