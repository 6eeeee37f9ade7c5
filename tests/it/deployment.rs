//! Running idemgate the way a service manager or an orchestrator does
//! (docs/deploying.md, "Under systemd" and "A container image"):
//!
//! - the probes: `/livez` answers while the process serves, draining
//!   included; `/readyz` says 503 `draining` from the moment a shutdown
//!   starts, while the request in flight still finishes;
//! - `idemgate healthcheck` exits 0 only when `/readyz` says ready, plain
//!   or over TLS, and gives up within its bound on a silent listener;
//! - systemd's notify protocol, received on a `NOTIFY_SOCKET` of the
//!   test's own: `READY=1` once serving, `RELOADING=1` (with
//!   `MONOTONIC_USEC`) and `READY=1` around a SIGHUP with the reload's
//!   result in `STATUS=`, `STOPPING=1` at SIGTERM, `WATCHDOG=1` when
//!   `WATCHDOG_USEC` asks for it;
//! - `contrib/idemgate.service` passes `systemd-analyze verify`;
//! - the `Containerfile`'s image, built with buildah, runs its own
//!   binary from its own filesystem under `chroot` (`.ci/build-image`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::*;

/// `GET path` on the admin listener, over a new connection.
async fn probe(admin: std::net::SocketAddr, path: &str) -> Response {
    send(admin, "GET", path, &[], bytes::Bytes::new()).await
}

/// A shutdown held open by a write in flight: the write's client task and
/// the shutdown's, the upstream holding its answer until `release_one`.
async fn drain_around_a_write(
    gw: &mut TestGateway,
) -> (
    tokio::task::JoinHandle<Response>,
    tokio::task::JoinHandle<()>,
) {
    let addr = gw.addr();
    gw.upstream.script(Scripted::Hold);
    let in_flight =
        tokio::spawn(async move { write(addr, "/scripted", Some("drain-1"), r#"{"n":1}"#).await });
    gw.upstream.wait_for_writes(1).await;
    (in_flight, gw.begin_shutdown())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_says_draining_from_the_start_of_a_shutdown_and_livez_stays_up() {
    let mut gw = spawn_gateway("").await;
    let admin = gw.admin_addr();
    for path in ["/livez", "/healthz", "/readyz"] {
        assert_eq!(probe(admin, path).await.status, 200, "{path} before");
    }
    let (in_flight, shutdown) = drain_around_a_write(&mut gw).await;
    let draining = eventually("/readyz to say draining", || async {
        let ready = probe(admin, "/readyz").await;
        (ready.status == 503).then_some(ready)
    })
    .await;
    draining.assert_problem(503, "draining");
    // Still alive, still draining: the write in flight holds the shutdown.
    assert_eq!(probe(admin, "/livez").await.status, 200, "/livez draining");
    assert!(
        !shutdown.is_finished(),
        "shutdown ended before the upstream answered"
    );

    gw.upstream.release_one();
    shutdown.await.expect("shutdown task");
    assert_fresh_created(&in_flight.await.expect("client task"));
    // The admin listener closed last.
    assert!(
        tokio::net::TcpStream::connect(admin).await.is_err(),
        "the admin listener still accepts after the shutdown"
    );
}

/// `idemgate healthcheck` with `args`: (exit 0, stdout, stderr).
async fn healthcheck(args: &[&str]) -> (bool, String, String) {
    let mut cmd = binary();
    cmd.arg("healthcheck").args(args);
    let (status, stdout, stderr) = run_to_exit(cmd).await;
    (status.success(), stdout, stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthcheck_exits_zero_only_while_readyz_says_ready() {
    let mut gw = spawn_gateway("").await;
    let url = format!("http://{}", gw.admin_addr());
    let (ready, stdout, stderr) = healthcheck(&["--admin", &url]).await;
    assert!(ready, "{stderr}");
    assert!(stdout.starts_with("ready: "), "{stdout}");

    // Draining: /readyz says 503, and so does the exit code.
    let (in_flight, shutdown) = drain_around_a_write(&mut gw).await;
    let stderr = eventually("healthcheck to fail while draining", || async {
        let (ready, _, stderr) = healthcheck(&["--admin", &url]).await;
        (!ready).then_some(stderr)
    })
    .await;
    assert!(
        stderr.contains("503") && stderr.contains("draining"),
        "{stderr}"
    );
    gw.upstream.release_one();
    shutdown.await.expect("shutdown task");
    assert_fresh_created(&in_flight.await.expect("client task"));

    // Nothing listening any more: refused, not ready.
    let (ready, _, stderr) = healthcheck(&["--admin", &url]).await;
    assert!(!ready && stderr.contains("no answer"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthcheck_gives_up_on_a_silent_listener_within_its_timeout() {
    // Accepts connections (the kernel does) and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", silent.local_addr().expect("addr"));
    let (ready, _, stderr) = healthcheck(&["--admin", &url, "--timeout", "200ms"]).await;
    assert!(!ready, "a silent listener was taken as ready");
    assert!(stderr.contains("no whole answer within 200ms"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthcheck_reads_the_admin_listener_from_the_config_and_speaks_its_tls() {
    let upstream = FakeUpstream::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let operators = TestCa::new(dir.path(), "operators-ca");
    let identity = operators.server_cert(dir.path(), "admin");
    let tls = format!(
        "admin_tls_cert = \"{}\"\nadmin_tls_key = \"{}\"\n",
        identity.cert.display(),
        identity.key.display()
    );
    let toml = gateway_toml_with(
        &dir.path().join("idemgate.db"),
        &upstream.url(),
        &Setup::route("").server(&tls),
    );
    let config = write_config(dir.path(), "idemgate.toml", &toml);
    let gateway = BinaryGateway::start(&config, &dir.path().join("gateway.log")).await;
    // The file says port 0; the one bound is the gateway's.
    let bound = toml.replace(
        "admin_listen = \"127.0.0.1:0\"",
        &format!("admin_listen = \"{}\"", gateway.admin),
    );
    let bound = write_config(dir.path(), "bound.toml", &bound);
    let bound = bound.to_str().expect("utf-8 path");
    let ca = operators.pem.to_str().expect("utf-8 path");

    let (ready, stdout, stderr) = healthcheck(&["--config", bound, "--ca", ca]).await;
    assert!(ready, "{stderr}");
    assert!(stdout.contains("ready"), "{stdout}");
    // Without the operators' CA the certificate is not trusted.
    let (ready, _, stderr) = healthcheck(&["--config", bound]).await;
    assert!(!ready, "an untrusted certificate was accepted");
    assert!(stderr.contains("https://"), "{stderr}");
}
