//! No credential at rest or in the logs: the real binary serves writes,
//! replays, a reused key, a lost response with its reconcile probe, client
//! lookups, admin calls and a proxied read, all carrying a bearer token,
//! at the most verbose log level in both log formats; then the store's
//! files (database, WAL, shared memory — read as a SIGKILL leaves
//! them, before any checkpoint) and everything it logged are searched for
//! the token and the admin token, which must appear nowhere. The upstream
//! must have received the token, so the search is not vacuous.

use std::path::Path;

use crate::common::*;
use bytes::Bytes;
use http::StatusCode;

const ORDER: &str = r#"{"sku":"apple"}"#;
const ADMIN_TOKEN: &str = "admin-secret-7f3a9c1e5b2d";
const CLIENT_TOKEN: &str = "client-secret-4e8b2a6d0c9f";

/// Drives every kind of exchange through a gateway, as [`CLIENT_TOKEN`].
async fn traffic(proxy: std::net::SocketAddr, admin: std::net::SocketAddr, round: &str) {
    let authorization = format!("Bearer {CLIENT_TOKEN}");
    let auth = Some(authorization.as_str());
    let key = format!("secret-{round}");
    let first = write_as(proxy, "/orders", Some(&key), auth, ORDER).await;
    assert_fresh_created(&first);
    let replay = write_as(proxy, "/orders", Some(&key), auth, ORDER).await;
    assert!(replay.is_replay());
    write_as(proxy, "/orders", Some(&key), auth, r#"{"sku":"pear"}"#)
        .await
        .assert_problem(422, "key-reused");
    let lost_key = format!("lost-{round}");
    let lost = write_as(proxy, "/drop", Some(&lost_key), auth, ORDER).await;
    assert_eq!(lost.status, StatusCode::BAD_GATEWAY);
    // The probe (with the request's credentials) settles it, now or on
    // this retry, which runs it again if it is still held.
    let retry = write_as(proxy, "/drop", Some(&lost_key), auth, ORDER).await;
    assert!(
        retry.is_replay() || retry.status == StatusCode::CONFLICT,
        "{retry:?}"
    );
    let lookup = send(
        proxy,
        "GET",
        &format!("/.idemgate/operations/{key}"),
        &[("authorization", &authorization)],
        Bytes::new(),
    )
    .await;
    assert_eq!(lookup.status, StatusCode::OK);
    let read = send(
        proxy,
        "GET",
        "/orders/1",
        &[("authorization", &authorization)],
        Bytes::new(),
    )
    .await;
    assert_eq!(read.status, StatusCode::OK);
    let listed = admin_call(admin, "GET", "/admin/keys", Some(ADMIN_TOKEN), "").await;
    assert_eq!(listed.status, StatusCode::OK);
    let id = listed.json()["items"][0]["id"]
        .as_str()
        .expect("an operation")
        .to_owned();
    let shown = admin_call(
        admin,
        "GET",
        &format!("/admin/keys/{id}"),
        Some(ADMIN_TOKEN),
        "",
    )
    .await;
    assert_eq!(shown.status, StatusCode::OK);
    let wrong = admin_call(admin, "GET", "/admin/stats", Some(CLIENT_TOKEN), "").await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
}

/// Runs the real binary on `setup`'s store (a SQLite file in `dir` unless
/// it names PostgreSQL) once per log format, drives [`traffic`] through
/// it, kills it as a crash would, and returns what it logged, each log by
/// name. Checks that the credential did reach the upstream and a probe ran.
async fn serve_traffic(dir: &Path, setup: Setup) -> Vec<(String, Vec<u8>)> {
    let upstream = FakeUpstream::start().await;
    let store = dir.join("idemgate.db");
    let probe = format!(
        "[routes.reconcile]\nurl = \"{}/lookup?key={{key}}\"\ntimeout = \"2s\"\n",
        upstream.url()
    );
    let toml = gateway_toml_with(
        &store,
        &upstream.url(),
        &Setup {
            route: probe,
            ..setup
        },
    );
    let config = write_config(dir, "idemgate.toml", &toml);

    let mut logs = Vec::new();
    for format in ["text", "json"] {
        let log = dir.join(format!("serve-{format}.log"));
        let mut cmd = binary();
        cmd.arg("serve")
            .arg("--config")
            .arg(&config)
            .args(["--log-format", format])
            .env("IDEMGATE_ADMIN_TOKEN", ADMIN_TOKEN)
            .env("RUST_LOG", "trace");
        let mut gateway = BinaryGateway::spawn(cmd, &log).await;
        traffic(gateway.proxy, gateway.admin, format).await;
        // Log lines wait in memory up to a flush tick, and go out in order:
        // once a last request's line is out, so is every line before it.
        let last = format!("/flushed-{format}");
        send(gateway.proxy, "GET", &last, &[], Bytes::new()).await;
        gateway.wait_for_log(&last).await;
        // As a crash leaves them: the WAL not checkpointed into the database.
        gateway.kill();
        logs.push((
            format!("serve-{format}.log"),
            std::fs::read(&log).expect("log"),
        ));
    }

    let sent = upstream.requests();
    assert!(
        sent.iter()
            .any(|r| r.header("authorization") == Some(&format!("Bearer {CLIENT_TOKEN}"))),
        "the upstream got the credential"
    );
    assert!(
        sent.iter().any(|r| r.uri.starts_with("/lookup")),
        "a probe ran"
    );
    assert!(
        logs.iter().all(|(_, text)| text.len() > 1000),
        "the logs are not empty"
    );
    let logged = |needle: &str| {
        logs.iter()
            .all(|(_, b)| find(b, needle.as_bytes()).is_some())
    };
    assert!(logged("/orders"), "paths are logged");
    logs
}

/// Neither token appears in any of `searched`; the keys do (so the search
/// sees what is stored in clear).
fn assert_no_secrets(searched: &[(String, Vec<u8>)], stored: &[(String, Vec<u8>)]) {
    let in_store = |needle: &str| {
        stored
            .iter()
            .any(|(_, b)| find(b, needle.as_bytes()).is_some())
    };
    assert!(
        in_store("secret-text") && in_store("secret-json"),
        "keys are stored"
    );
    for (name, bytes) in searched.iter().chain(stored) {
        for secret in [CLIENT_TOKEN, ADMIN_TOKEN] {
            assert!(
                find(bytes, secret.as_bytes()).is_none(),
                "{secret} found in {name}"
            );
            assert!(
                find(bytes, hex::encode(secret).as_bytes()).is_none(),
                "{secret} found hex-encoded in {name}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_never_reach_the_store_files_or_the_logs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let logs = serve_traffic(dir.path(), Setup::route("")).await;
    let stored = files_starting_with(dir.path(), "idemgate.db");
    assert!(
        stored.iter().any(|(name, _)| name.ends_with("-wal")),
        "{:?}",
        stored.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    assert_no_secrets(&logs, &stored);
}

/// The same on a PostgreSQL store: every row of every table in the test's
/// schema, as text (a `bytea` column reads as hex, so the hex of each
/// token is searched too), and what the gateway logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn credentials_never_reach_the_postgres_store_or_the_logs() {
    let schema = PgSchema::create().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let logs = serve_traffic(dir.path(), Setup::route("").postgres(&schema)).await;

    let stored = schema.dump().await;
    assert_no_secrets(&logs, &stored);
}
