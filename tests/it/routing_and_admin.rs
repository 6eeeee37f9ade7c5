//! Routing and the admin listener: a path no route covers is 404 `no-route`
//! (for reads and writes), the longest prefix wins, an upstream that refuses
//! connections is 502 `upstream-unreachable` and leaves the key retryable,
//! and `/healthz` and `/readyz` answer on the admin listener.

use crate::common::*;
use bytes::Bytes;
use http::StatusCode;

const BODY: &str = r#"{"n":1}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_outside_every_route_is_404_no_route() {
    let gw = spawn_gateway_at("/api", "").await;

    let post = write(gw.addr(), "/other", Some("k-1"), BODY).await;
    let get = send(gw.addr(), "GET", "/other/thing", &[], Bytes::new()).await;

    post.assert_problem(404, "no-route");
    get.assert_problem(404, "no-route");
    assert!(gw.upstream.requests().is_empty(), "nothing sent upstream");

    let routed = write(gw.addr(), "/api/orders", Some("k-1"), BODY).await;
    assert_fresh_created(&routed);
    assert_eq!(gw.upstream.requests()[0].uri, "/api/orders");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn longest_prefix_wins() {
    // Two routes to two upstreams: "/" and "/api"; /api/x must go to the second.
    let catch_all = FakeUpstream::start().await;
    let api = FakeUpstream::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut toml = gateway_toml(&dir.path().join("idemgate.db"), &catch_all.url(), "/", "");
    toml.push_str(&format!(
        "\n[[routes]]\nname = \"api-v2\"\npath_prefix = \"/api\"\nupstream = \"{}\"\n",
        api.url()
    ));
    let gateway = idemgate::server::Gateway::start(parse_config(&toml))
        .await
        .expect("start");

    let resp = write(gateway.addr(), "/api/orders", Some("k-1"), BODY).await;
    assert_fresh_created(&resp);
    let other = write(gateway.addr(), "/orders", Some("k-2"), BODY).await;
    assert_fresh_created(&other);

    assert_eq!(api.writes(), 1, "/api/orders goes to the /api route");
    assert_eq!(catch_all.writes(), 1, "/orders goes to the / route");
    assert_eq!(api.requests()[0].uri, "/api/orders");
    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connection_is_502_upstream_unreachable_and_retryable() {
    let refusing = closed_port().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let toml = gateway_toml(
        &dir.path().join("idemgate.db"),
        &format!("http://{refusing}"),
        "/",
        "connect_retries = 1",
    );
    let gateway = idemgate::server::Gateway::start(parse_config(&toml))
        .await
        .expect("start");

    let first = write(gateway.addr(), "/orders", Some("k-1"), BODY).await;
    first.assert_problem(502, "upstream-unreachable");

    // not_attempted: a retry is a fresh attempt, not 409 and not 422.
    let retry = write(gateway.addr(), "/orders", Some("k-1"), BODY).await;
    retry.assert_problem(502, "upstream-unreachable");
    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_and_readyz_answer_on_the_admin_listener() {
    let gw = spawn_gateway("").await;

    let health = send(gw.admin_addr(), "GET", "/healthz", &[], Bytes::new()).await;
    let ready = send(gw.admin_addr(), "GET", "/readyz", &[], Bytes::new()).await;

    assert_eq!(health.status, StatusCode::OK);
    assert_eq!(ready.status, StatusCode::OK);
    assert_ne!(gw.admin_addr(), gw.addr(), "admin is a separate listener");
    assert!(
        gw.upstream.requests().is_empty(),
        "health checks are not proxied"
    );
}
