//! What time and shutdown do to operations:
//!
//! - retention: the sweep deletes a `completed` operation once the store's
//!   clock is `retention` past its last update (its key then starts a new
//!   operation), but never an `unknown` one;
//! - graceful shutdown: listeners close at once, a request in flight still
//!   gets its response, and it is replayed after a restart; one still in
//!   flight when `shutdown_grace` runs out is `unknown` after the restart;
//!   a keep-alive connection with nothing in progress is closed at once.

use std::time::Duration;

use crate::common::*;
use idemgate_model::clock::ManualClock;

const ORDER: &str = r#"{"sku":"apple","qty":3}"#;
/// The retention, on a manual clock; the sweeps run at the [`QUICK`] pace.
const RETENTION: Duration = Duration::from_secs(100);

async fn with_retention(route_extra: &str) -> (TestGateway, std::sync::Arc<ManualClock>) {
    let clock = ManualClock::new();
    let setup = Setup::route(route_extra)
        .store("retention = \"100s\"")
        .clock(clock.clone())
        .quick()
        .admin();
    (spawn_gateway_with(setup).await, clock)
}

/// Retries `key` until it is forwarded anew (the sweep deleted its
/// operation) and returns that fresh answer; panics after a few sweeps.
async fn retry_until_swept(gw: &TestGateway, key: &str) -> Response {
    let fresh = write_until(
        gw.addr(),
        "/orders",
        key,
        ORDER,
        Duration::from_secs(5),
        |r| !r.is_replay(),
    )
    .await;
    assert_fresh_created(&fresh);
    fresh
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_operation_expires_after_retention_by_the_store_clock() {
    let (gw, clock) = with_retention("").await;
    let first = write(gw.addr(), "/orders", Some("ret-1"), ORDER).await;
    assert_eq!(assert_fresh_created(&first), 1);

    // A whole sweep runs while the store's clock is just short of the
    // retention.
    clock.advance(RETENTION - Duration::from_secs(1));
    next_full_pass(gw.admin_addr(), "retention").await;
    let kept = write(gw.addr(), "/orders", Some("ret-1"), ORDER).await;
    assert_replay_of(&kept, &first);

    clock.advance(Duration::from_secs(2));
    let fresh = retry_until_swept(&gw, "ret-1").await;

    assert_eq!(fresh.json()["id"], 2, "forwarded anew");
    assert_eq!(gw.upstream.writes(), 2);
    let retry = write(gw.addr(), "/orders", Some("ret-1"), ORDER).await;
    assert_replay_of(&retry, &fresh);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_operation_is_never_swept() {
    let (gw, clock) = with_retention("upstream_timeout = \"300ms\"").await;
    let held = write(gw.addr(), "/hold", Some("ret-held"), ORDER).await;
    held.assert_operation_problem(504, "outcome-unknown", "unknown");
    let control = write(gw.addr(), "/orders", Some("ret-control"), ORDER).await;
    assert_fresh_created(&control);

    clock.advance(RETENTION + Duration::from_secs(1));
    // The completed control operation going proves a sweep ran past the cutoff.
    retry_until_swept(&gw, "ret-control").await;

    let retry = write(gw.addr(), "/hold", Some("ret-held"), ORDER).await;
    assert_held_unknown(&retry);
    assert_eq!(gw.operation("ret-held").await["state"], "unknown");
    assert_eq!(
        gw.upstream
            .write_requests()
            .iter()
            .filter(|r| r.uri == "/hold")
            .count(),
        1,
        "the unknown write was never re-sent"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_the_request_in_flight_finish_and_it_is_replayed_after_restart() {
    let mut gw = spawn_gateway("").await;
    let addr = gw.addr();
    // The upstream holds its answer until the test lets it go.
    gw.upstream.script(Scripted::Hold);
    let in_flight =
        tokio::spawn(async move { write(addr, "/scripted", Some("sd-1"), ORDER).await });
    gw.upstream.wait_for_writes(1).await;

    let shutdown = gw.begin_shutdown();
    // New connections are refused while the old one drains.
    eventually(
        "the proxy to refuse connections during shutdown",
        || async {
            tokio::net::TcpStream::connect(addr)
                .await
                .is_err()
                .then_some(())
        },
    )
    .await;
    assert!(
        !in_flight.is_finished(),
        "the request ended before the upstream answered"
    );
    assert!(
        !shutdown.is_finished(),
        "shutdown returned before the upstream answered"
    );
    gw.upstream.release_one();
    shutdown.await.expect("shutdown task");

    let original = tokio::time::timeout(WAIT, in_flight)
        .await
        .expect("the request in flight got no answer")
        .expect("client task");
    assert_fresh_created(&original);

    gw.start_again().await;
    gw.assert_retry_replays(("/scripted", "sd-1", ORDER), &original, 1)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_still_in_flight_after_the_grace_is_unknown_after_restart() {
    let setup = Setup::route("upstream_timeout = \"10s\"").server("shutdown_grace = \"300ms\"");
    let mut gw = spawn_gateway_with(setup).await;
    let addr = gw.addr();
    let in_flight = tokio::spawn(async move { write(addr, "/hold", Some("sd-2"), ORDER).await });
    gw.upstream.wait_for_writes(1).await;

    // Within WAIT (15 s), which the default grace (30 s) would outlast:
    // the configured grace ended it.
    gw.shutdown().await;
    in_flight.abort();

    gw.start_again().await;
    let retry = write(gw.addr(), "/hold", Some("sd-2"), ORDER).await;
    assert_held_unknown(&retry);
    assert_eq!(gw.upstream.writes(), 1, "never re-sent");
    assert_eq!(gw.upstream.write_requests().len(), 1);
}

/// A keep-alive connection with no request in progress is closed as soon
/// as a shutdown starts: neither `header_read_timeout` nor
/// `shutdown_grace` (both far past the test's bound) is waited out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_an_idle_keep_alive_connection_at_once() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let mut gw = spawn_gateway_with(
        Setup::route("").server("header_read_timeout = \"300s\"\nshutdown_grace = \"300s\""),
    )
    .await;
    let mut connection = tokio::net::TcpStream::connect(gw.addr())
        .await
        .expect("connect");
    connection
        .write_all(b"GET /orders/1 HTTP/1.1\r\nhost: gateway\r\n\r\n")
        .await
        .expect("send");
    // The answer's head, read until the connection has said something.
    let mut answer = vec![0; 4096];
    let read = connection.read(&mut answer).await.expect("answer");
    assert!(
        answer[..read].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer[..read])
    );

    let shutdown = gw.begin_shutdown();
    // Whatever is left of the answer, then the end of the connection.
    let closed = tokio::time::timeout(WAIT, async {
        loop {
            match connection.read(&mut answer).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the idle connection was left open");
    shutdown.await.expect("shutdown task");
}

/// Connections spread over worker threads (a runtime each) are served, and
/// the gateway drains them when it shuts down.
#[tokio::test]
async fn a_gateway_on_workers_serves_and_shuts_down() {
    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use idemgate::config::Config;
    use idemgate::server::{Gateway, StartOptions};
    use idemgate::workers::Workers;
    use idemgate_tools::mock_upstream::MockUpstream;

    let dir = tempfile::tempdir().unwrap();
    let mock = MockUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
         [store]\nurl = \"sqlite://{}\"\n\
         [[routes]]\nname = \"api\"\npath_prefix = \"/\"\nupstream = \"http://{}\"\n",
        dir.path().join("idemgate.db").display(),
        mock.addr()
    );
    let workers = Workers::start(2).unwrap();
    let options = StartOptions {
        workers: workers.handles().to_vec(),
        ..StartOptions::default()
    };
    let config = Config::from_toml_str(&toml, "test").unwrap();
    let gateway = Gateway::start_with(config, options).await.unwrap();
    let url = format!("http://{}/tasks", gateway.addr());
    for n in 0..6 {
        // A client each: a connection each, spread over the workers.
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>();
        for attempt in 0..2 {
            let request = http::Request::post(&url)
                .header("authorization", "Bearer t")
                .header("idempotency-key", format!("k{n}"))
                .header("content-type", "application/json")
                .body(Full::from("{}"))
                .unwrap();
            let response = client.request(request).await.unwrap();
            let replayed = response.headers().contains_key("idempotent-replayed");
            assert_eq!(response.status(), 201, "write {n}, attempt {attempt}");
            assert_eq!(replayed, attempt == 1);
            response.into_body().collect().await.unwrap();
        }
    }
    assert_eq!(mock.writes(), 6, "one upstream write per key");
    tokio::time::timeout(std::time::Duration::from_secs(10), gateway.shutdown())
        .await
        .expect("shut down within its grace");
    drop(workers);
    mock.stop().await;
}
