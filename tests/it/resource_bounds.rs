//! Resource bounds: what one client (or a flood of them) can make the
//! gateway hold is bounded, the bound answers with a clear problem, and
//! the gateway keeps serving everyone else meanwhile:
//!
//! - open connections per listener (`server.max_connections`,
//!   `server.admin_max_connections`): the request of one more is answered
//!   503 `overloaded` and it is closed (but the admin listener's liveness
//!   probe, answered 200), the connections already open are still served,
//!   and the other listener is untouched; the refusals are
//!   bounded too (a flood past them is closed at once);
//! - request bodies held in memory, all writes together
//!   (`server.buffered_body_budget`): a write that would overdraw it is 503
//!   `overloaded` (a declared one before `100 Continue`), nothing is sent,
//!   small writes still pass, and the budget comes back once a body's
//!   attempt is over;
//! - duplicates waiting on one operation (`routes[].max_waiters`, `wait`
//!   mode): more are answered 409 `request-in-progress` at once, those
//!   within the cap get the replay, and other keys are served meanwhile;
//! - writes sent per scope and window (`routes[].quota_operations`,
//!   `quota_window`): beyond it a new write gets 429 `quota-exceeded` with
//!   `Retry-After` and nothing is sent, existing operations still answer
//!   for themselves, other scopes are served, and the next window opens;
//! - bytes stored per scope and window (`routes[].quota_stored_bytes`):
//!   the write whose response crosses it is kept whole, the next new write
//!   gets 429 `quota-exceeded`, and the store holds no more than that;
//! - an answer streamed to the client (passed through, or a write's too
//!   large to store, or one of its `unknown_statuses`) whose upstream goes
//!   silent (`routes[].upstream_timeout`, between two of its frames): it
//!   is cut short, never ended as if whole, and the client's connection
//!   and the upstream's are closed, a client that went away meanwhile
//!   included; one that keeps coming, however slowly, goes on;
//! - file descriptors: a process out of them refuses a new connection as
//!   it comes (reset unread), not left waiting in the kernel's backlog,
//!   and says so in its log once, then once more with how many it refused
//!   when accepting works again;
//! - connections open to a route's upstream
//!   (`routes[].max_upstream_connections`), whatever asks for them (here
//!   the streams of one HTTP/2 client connection): past it a request waits
//!   `connect_timeout` for one and is answered 503 `overloaded`, nothing
//!   sent (a write claimed meanwhile is `not_attempted`), and once they
//!   come free they are used again.
//!
//! Slow heads and slow bodies are bounded too (`tests/it/limits.rs`).

use std::net::SocketAddr;
use std::time::Duration;

use crate::common::*;
use bytes::Bytes;
use http::StatusCode;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

const ORDER: &str = r#"{"sku":"apple"}"#;

/// `n` connections to `addr`, opened and left idle (a keep-alive client
/// between its requests).
async fn hold_connections(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        held.push(TcpStream::connect(addr).await.expect("connect"));
    }
    held
}

/// Whether the peer has not closed `stream` (nothing to read yet).
fn still_open(stream: &TcpStream) -> bool {
    matches!(stream.try_read(&mut [0; 1]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// A new connection to `addr` has its request answered 503 `overloaded`,
/// to a raw client and to an HTTP client library alike.
async fn assert_refused(addr: SocketAddr) {
    assert_refused_at(addr, "/healthz").await;
}

/// [`assert_refused`], for a `GET` of `path`.
async fn assert_refused_at(addr: SocketAddr, path: &str) {
    let head = format!("GET {path} HTTP/1.1\r\nhost: a\r\n\r\n");
    let resp = raw_exchange(addr, head.as_bytes())
        .await
        .expect("a 503, not a bare close");
    assert_eq!(resp.status, 503, "head: {}", resp.head);
    assert!(
        resp.head.contains("application/problem+json"),
        "{}",
        resp.head
    );
    assert!(resp.head.contains("retry-after: 1"), "{}", resp.head);
    assert!(
        String::from_utf8_lossy(&resp.body).contains("urn:idemgate:problem:overloaded"),
        "{}",
        String::from_utf8_lossy(&resp.body)
    );
    let resp = send(addr, "GET", path, &[], Bytes::new()).await;
    resp.assert_problem(503, "overloaded");
}

/// Writes one request on a connection already open and reads its answer.
async fn write_on(stream: &mut TcpStream, key: &str) -> RawResponse {
    let mut request = raw_write_head(
        "/orders",
        "application/json",
        key,
        &[&format!("content-length: {}", ORDER.len())],
    )
    .into_bytes();
    request.extend_from_slice(ORDER.as_bytes());
    stream.write_all(&request).await.expect("write");
    tokio::time::timeout(WAIT, read_response(stream))
        .await
        .expect("an answer within the bound")
        .expect("an answer")
}

/// Polls `addr` with a plain GET until one is served (a slot came free).
async fn served_again(addr: SocketAddr, path: &str) {
    eventually(&format!("{addr}{path} served again"), || async {
        let attempt = try_send(addr, "GET", path, &[], Bytes::new(), WAIT).await;
        attempt
            .is_ok_and(|resp| resp.status == StatusCode::OK)
            .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_connections_beyond_the_cap_are_refused_while_others_are_served() {
    let setup = Setup::route("").server("max_connections = 3").admin();
    let gw = spawn_gateway_with(setup).await;
    let mut held = hold_connections(gw.addr(), 3).await;

    assert_refused(gw.addr()).await;
    assert_refused(gw.addr()).await;

    // The clients already connected are served, and so is the admin listener.
    let resp = write_on(&mut held[0], "capped-1").await;
    assert_eq!(resp.status, 201, "head: {}", resp.head);
    assert_eq!(gw.upstream.writes(), 1);
    let health = send(gw.admin_addr(), "GET", "/healthz", &[], Bytes::new()).await;
    assert_eq!(health.status, StatusCode::OK);
    let metrics = scrape_metrics(gw.admin_addr()).await;
    assert_eq!(
        metric(
            &metrics,
            r#"idemgate_refused_connections_total{listener="proxy"}"#
        ),
        Some(4.0),
        "{metrics}"
    );

    // A connection that closes frees its slot.
    drop(held.pop());
    served_again(gw.addr(), "/alive").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_over_the_cap_is_closed_at_once_once_refusals_are_busy() {
    let setup = Setup::route("").server("max_connections = 1");
    let gw = spawn_gateway_with(setup).await;
    let mut held = hold_connections(gw.addr(), 1).await;
    // Silent connections over the cap: each takes a refusal slot until
    // its head is late (64 slots, 2 s each).
    let silent = hold_connections(gw.addr(), 64).await;

    let mut flooded = TcpStream::connect(gw.addr()).await.expect("connect");
    let read = tokio::time::timeout(WAIT, read_response(&mut flooded))
        .await
        .expect("closed within the bound");
    assert!(read.is_none(), "closed without an answer: {read:?}");
    // Closed at once: while every silent connection, accepted before it,
    // still holds its slot (one it had taken would have kept it longer).
    assert!(
        silent.iter().all(still_open),
        "a silent connection was cut off before the flooded one"
    );

    // The connection inside the cap is served meanwhile; once the silent
    // ones time out (the gateway closes them), refusals answer again.
    assert_eq!(write_on(&mut held[0], "flooded-1").await.status, 201);
    for mut stream in silent {
        let mut rest = Vec::new();
        let read = tokio::time::timeout(WAIT, stream.read_to_end(&mut rest)).await;
        assert!(read.is_ok(), "a silent connection was never cut off");
    }
    eventually("a refusal slot to come free", || async {
        let refused = raw_exchange(gw.addr(), b"GET /healthz HTTP/1.1\r\nhost: a\r\n\r\n").await;
        refused.is_some_and(|resp| resp.status == 503).then_some(())
    })
    .await;
    assert_refused(gw.addr()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_connections_beyond_the_cap_leave_the_proxy_serving() {
    let setup = Setup::route("").server("admin_max_connections = 2");
    let gw = spawn_gateway_with(setup).await;
    let mut held = hold_connections(gw.admin_addr(), 2).await;

    assert_refused_at(gw.admin_addr(), "/readyz").await;
    assert_refused_at(gw.admin_addr(), "/metrics").await;
    // The liveness probe is answered all the same: the process is alive,
    // only busy, and a probe that failed would have it restarted.
    for path in ["/livez", "/healthz"] {
        let resp = raw_exchange(
            gw.admin_addr(),
            format!("GET {path} HTTP/1.1\r\nhost: a\r\n\r\n").as_bytes(),
        )
        .await
        .expect("an answer");
        assert_eq!(resp.status, 200, "{path}: {}", resp.head);
        let resp = send(gw.admin_addr(), "GET", path, &[], Bytes::new()).await;
        assert_eq!(resp.status, StatusCode::OK, "{path}");
    }

    let resp = write(gw.addr(), "/orders", Some("beside-admin-1"), ORDER).await;
    assert_fresh_created(&resp);
    drop(held.pop());
    served_again(gw.admin_addr(), "/metrics").await;
}

/// Opens a write that declares `length` bytes and expects `100 Continue`;
/// returns once the gateway asked for the body (its bytes are reserved),
/// without sending it.
async fn declared_and_stalled(addr: SocketAddr, key: &str, length: usize) -> TcpStream {
    let head = raw_write_head(
        "/orders",
        "application/octet-stream",
        key,
        &["expect: 100-continue", &format!("content-length: {length}")],
    );
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(head.as_bytes()).await.expect("write head");
    let mut seen = Vec::new();
    let mut chunk = [0u8; 1024];
    while find(&seen, b"\r\n\r\n").is_none() {
        let n = tokio::time::timeout(WAIT, tokio::io::AsyncReadExt::read(&mut stream, &mut chunk))
            .await
            .expect("100 Continue within the bound")
            .expect("read");
        assert!(n > 0, "closed before 100 Continue");
        seen.extend_from_slice(&chunk[..n]);
    }
    assert!(
        seen.starts_with(b"HTTP/1.1 100"),
        "{}",
        String::from_utf8_lossy(&seen)
    );
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_beyond_the_shared_budget_are_refused_while_others_pass() {
    // Each body may take the whole budget (check-config refuses a larger
    // max_body), not all of them at once.
    let setup = Setup::route(r#"max_body = "64KiB""#).server(r#"buffered_body_budget = "64KiB""#);
    let gw = spawn_gateway_with(setup).await;
    let big = 60 * 1024;
    let mut stalled = declared_and_stalled(gw.addr(), "budget-big", big).await;

    // A declared body that does not fit is refused before it is read.
    let head = raw_write_head(
        "/orders",
        "application/octet-stream",
        "budget-declared",
        &["expect: 100-continue", "content-length: 10240"],
    );
    let refused = raw_exchange(gw.addr(), head.as_bytes())
        .await
        .expect("an answer");
    assert_eq!(refused.status, 503, "head: {}", refused.head);
    assert!(refused.interim.is_empty(), "asked for the body first");
    assert!(String::from_utf8_lossy(&refused.body).contains("urn:idemgate:problem:overloaded"));
    // So is a chunked one, once it outgrows what is left.
    let mut chunked_request = raw_write_head(
        "/orders",
        "application/octet-stream",
        "budget-chunked",
        &["transfer-encoding: chunked"],
    )
    .into_bytes();
    chunked_request.extend(chunked(&vec![b'c'; 8 * 1024]));
    let refused = raw_exchange(gw.addr(), &chunked_request)
        .await
        .expect("an answer");
    assert_eq!(refused.status, 503, "head: {}", refused.head);
    assert!(String::from_utf8_lossy(&refused.body).contains("urn:idemgate:problem:overloaded"));
    // A small write fits in what is left.
    assert_fresh_created(&write(gw.addr(), "/orders", Some("budget-small"), ORDER).await);
    assert_eq!(gw.upstream.writes(), 1, "nothing refused was sent");

    // The stalled body arrives; once its write is answered the budget is back.
    stalled.write_all(&vec![b'b'; big]).await.expect("body");
    let resp = tokio::time::timeout(WAIT, read_response(&mut stalled))
        .await
        .expect("an answer within the bound")
        .expect("an answer");
    assert_eq!(resp.status, 201, "head: {}", resp.head);
    // The attempt lets go of the body just after the answer: a moment later
    // the refused chunked write fits.
    let retried = eventually("the budget to come back", || async {
        let resp = raw_exchange(gw.addr(), &chunked_request)
            .await
            .expect("an answer");
        (resp.status != 503).then_some(resp)
    })
    .await;
    assert_eq!(retried.status, 201, "head: {}", retried.head);
    assert_eq!(gw.upstream.writes(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_beyond_the_cap_are_answered_at_once_while_others_are_served() {
    let route = "in_progress = \"wait\"\nmax_waiters = 2\nwait_timeout = \"10s\"";
    let gw = spawn_gateway(route).await;
    let addr = gw.addr();
    let first =
        tokio::spawn(async move { write(addr, "/slow?ms=1500", Some("waited-1"), ORDER).await });
    gw.upstream.wait_for_writes(1).await;
    let duplicates = tokio::spawn(async move {
        concurrent_writes(addr, 6, "/slow?ms=1500", "waited-1", ORDER).await
    });

    // Another key is served while the duplicates wait.
    let other = write(gw.addr(), "/orders", Some("beside-waiters-1"), ORDER).await;
    assert_fresh_created(&other);

    let first = first.await.expect("client task");
    assert_fresh_created(&first);
    // In completion order: the refused ones did not wait for the write;
    // the waiters were woken by it, not by their wait_timeout (which
    // answers 409).
    let duplicates = duplicates.await.expect("client task");
    let (refused, replays) = duplicates.split_at(4);
    for resp in refused {
        resp.assert_operation_problem(409, "request-in-progress", "in_progress");
    }
    for replay in replays {
        assert_replay_of(replay, &first);
    }
    assert_eq!(gw.upstream.writes(), 2, "one write per key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_over_its_quota_gets_429_while_other_scopes_are_served() {
    let clock = idemgate_model::clock::ManualClock::new();
    let route = "quota_operations = 3\nquota_window = \"1m\"";
    let gw = spawn_gateway_with(Setup::route(route).clock(clock.clone())).await;
    // Three attempts sent: a lost one, a created one, one the upstream refused.
    let lost = write(gw.addr(), "/drop", Some("quota-lost"), ORDER).await;
    lost.assert_operation_problem(502, "outcome-unknown", "unknown");
    let first = write(gw.addr(), "/orders", Some("quota-1"), ORDER).await;
    assert_fresh_created(&first);
    let refused = write(gw.addr(), "/status/503", Some("quota-refused"), ORDER).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    clock.advance(Duration::from_secs(20));

    let over = write(gw.addr(), "/orders", Some("quota-3"), ORDER).await;
    over.assert_problem(429, "quota-exceeded");
    assert_eq!(over.header("retry-after"), Some("40"));
    // The refused one's next attempt would be sent: it waits too.
    let next = write(gw.addr(), "/status/503", Some("quota-refused"), ORDER).await;
    next.assert_operation_problem(429, "quota-exceeded", "not_attempted");
    // What exists answers for itself, and is not counted.
    assert_replay_of(
        &write(gw.addr(), "/orders", Some("quota-1"), ORDER).await,
        &first,
    );
    assert_held_unknown(&write(gw.addr(), "/drop", Some("quota-lost"), ORDER).await);
    write(gw.addr(), "/orders", Some("quota-1"), r#"{"sku":"pear"}"#)
        .await
        .assert_problem(422, "key-reused");
    // Another credential is another scope.
    assert_fresh_created(&write_as(gw.addr(), "/orders", Some("quota-3"), Some(BOB), ORDER).await);
    assert_eq!(gw.upstream.writes(), 3, "nothing over the quota was sent");
    assert_eq!(gw.upstream.write_requests().len(), 4);

    clock.advance(Duration::from_secs(41));
    assert_fresh_created(&write(gw.addr(), "/orders", Some("quota-3"), ORDER).await);
    assert_eq!(gw.upstream.writes(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_that_stored_its_bytes_gets_429_until_the_window_ends() {
    let clock = idemgate_model::clock::ManualClock::new();
    let route = "quota_stored_bytes = \"16KiB\"\nquota_window = \"1m\"";
    let gw = spawn_gateway_with(Setup::route(route).clock(clock.clone())).await;
    // 10 KiB stored, then 10 more: the crossing response is kept whole.
    let first = write(gw.addr(), "/big?bytes=10240", Some("bytes-1"), ORDER).await;
    assert_eq!(first.status, StatusCode::OK);
    let crossing = write(gw.addr(), "/big?bytes=10240", Some("bytes-2"), ORDER).await;
    assert_eq!(crossing.status, StatusCode::OK);
    assert_eq!(crossing.body.len(), 10240);
    assert_replay_of(
        &write(gw.addr(), "/big?bytes=10240", Some("bytes-2"), ORDER).await,
        &crossing,
    );
    clock.advance(Duration::from_secs(15));

    let over = write(gw.addr(), "/orders", Some("bytes-3"), ORDER).await;
    let problem = over.assert_problem(429, "quota-exceeded");
    assert_eq!(over.header("retry-after"), Some("45"));
    let detail = problem["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("stored its quota of 16.0 KiB"), "{detail}");
    assert_fresh_created(&write_as(gw.addr(), "/orders", Some("bytes-3"), Some(BOB), ORDER).await);
    assert_eq!(gw.upstream.writes(), 3, "nothing over the quota was sent");

    clock.advance(Duration::from_secs(46));
    assert_fresh_created(&write(gw.addr(), "/orders", Some("bytes-3"), ORDER).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_counts_against_the_budget_while_its_attempt_holds_it() {
    let route = "max_body = \"64KiB\"\nupstream_timeout = \"300ms\"\nlate_window = \"1500ms\"";
    let setup = Setup::route(route).server(r#"buffered_body_budget = "64KiB""#);
    let gw = spawn_gateway_with(setup).await;
    let big = vec![b'b'; 60 * 1024];
    let lost = send(
        gw.addr(),
        "POST",
        "/hold",
        &[
            ("content-type", "application/octet-stream"),
            ("idempotency-key", "budget-held"),
            ("authorization", ALICE),
        ],
        big,
    )
    .await;
    lost.assert_operation_problem(504, "outcome-unknown", "unknown");

    // The client has its answer, but the attempt still listens for a late
    // response with the body in hand: its bytes are still reserved.
    let body = "x".repeat(10 * 1024);
    let refused = write(gw.addr(), "/orders", Some("budget-after-held"), &body).await;
    refused.assert_problem(503, "overloaded");
    assert_eq!(gw.upstream.writes(), 1);

    let passed = eventually("the budget to come back after the late window", || async {
        let resp = write(gw.addr(), "/orders", Some("budget-after-held"), &body).await;
        (resp.status != StatusCode::SERVICE_UNAVAILABLE).then_some(resp)
    })
    .await;
    assert_fresh_created(&passed);
}

/// An answer that stops coming: a head announcing 1000 bytes, then ten.
const STALLED: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\ncontent-type: text/plain\r\n\r\n0123456789";

/// A GET of `path`: passed through (the route intercepts no GET).
fn get_head(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nhost: idemgate.test\r\n\r\n").into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passed_through_answer_that_stops_coming_is_cut_after_upstream_timeout() {
    let raw = RawUpstream::start(Breakage::Stalls(STALLED)).await;
    let setup = Setup::route(r#"upstream_timeout = "1s""#).upstream_url(raw.url());
    let gw = spawn_gateway_with(setup).await;

    // Within WAIT (much longer than the timeout): cut short of its length.
    let cut = raw_exchange(gw.addr(), &get_head("/files/1"))
        .await
        .expect("the head came");
    assert_eq!(cut.status, 200, "{}", cut.head);
    assert_eq!(cut.body, b"0123456789", "what came, and no more");
    eventually("the silent upstream's connection closed", || async {
        (raw.closed() == 1).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_gone_from_answers_that_stopped_coming_free_their_connections() {
    let raw = RawUpstream::start(Breakage::Stalls(STALLED)).await;
    let setup = Setup::route(r#"upstream_timeout = "1s""#)
        .upstream_url(raw.url())
        .server("max_connections = 2");
    let gw = spawn_gateway_with(setup).await;
    for _ in 0..2 {
        let mut client = TcpStream::connect(gw.addr()).await.expect("connect");
        client
            .write_all(&get_head("/files/1"))
            .await
            .expect("write");
        // The head and the first bytes, then the client hangs up mid-body.
        let mut read = Vec::new();
        while find(&read, b"0123456789").is_none() {
            let mut chunk = [0u8; 4096];
            let n = tokio::time::timeout(WAIT, client.read(&mut chunk))
                .await
                .expect("the first bytes in time")
                .expect("read");
            assert!(n > 0, "closed before the first bytes");
            read.extend_from_slice(&chunk[..n]);
        }
    }
    eventually("both silent upstream connections closed", || async {
        (raw.closed() == 2).then_some(())
    })
    .await;
    // Their connection slots are free again: the next client is served.
    let next = raw_exchange(gw.addr(), &get_head("/files/2"))
        .await
        .expect("an answer");
    assert_eq!(next.status, 200, "{}", next.head);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_answer_streamed_unstored_that_stops_coming_is_cut_too() {
    let oversized = format!(
        "HTTP/1.1 201 Created\r\ncontent-length: 100000\r\n\r\n{}",
        "x".repeat(2048)
    );
    let oversized: &'static [u8] = Box::leak(oversized.into_bytes().into_boxed_slice());
    let held: &[u8] = b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 1000\r\n\r\n0123456789";
    // Too large to store (streamed once), and an unknown status (streamed).
    for (answer, status, came) in [(oversized, 201, 2048), (held, 502, 10)] {
        let raw = RawUpstream::start(Breakage::Stalls(answer)).await;
        let route = "upstream_timeout = \"1s\"\nmax_stored_response = \"1KiB\"";
        let gw = spawn_gateway_with(Setup::route(route).upstream_url(raw.url())).await;
        let mut request = raw_write_head(
            "/orders",
            "application/json",
            &format!("stalled-{status}"),
            &[&format!("content-length: {}", ORDER.len())],
        )
        .into_bytes();
        request.extend_from_slice(ORDER.as_bytes());
        let cut = raw_exchange(gw.addr(), &request)
            .await
            .expect("the head came");
        assert_eq!(cut.status, status, "{}", cut.head);
        assert_eq!(cut.body.len(), came, "{status}: what came, and no more");
        eventually("the silent upstream's connection closed", || async {
            (raw.closed() == 1).then_some(())
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passed_through_answer_that_keeps_coming_outlasts_upstream_timeout() {
    // Eight bytes over two seconds, one every quarter: the whole answer
    // takes twice the timeout, no silence in it a quarter of it.
    let raw = RawUpstream::start(Breakage::Trickles {
        head: b"HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\n",
        chunk: b"x",
        count: 8,
        every: Duration::from_millis(250),
    })
    .await;
    let setup = Setup::route(r#"upstream_timeout = "1s""#).upstream_url(raw.url());
    let gw = spawn_gateway_with(setup).await;
    let whole = raw_exchange(gw.addr(), &get_head("/files/slow"))
        .await
        .expect("an answer");
    assert_eq!(whole.status, 200, "{}", whole.head);
    assert_eq!(whole.body, b"xxxxxxxx");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_of_http2_clients_hold_no_more_upstream_connections_than_the_route_may() {
    // An upstream that reads each request and never answers.
    let raw = RawUpstream::start(Breakage::Stalls(b"")).await;
    let route =
        "max_upstream_connections = 3\nconnect_timeout = \"300ms\"\nupstream_timeout = \"5s\"";
    let gw = spawn_gateway_with(Setup::route(route).upstream_url(raw.url()).admin()).await;
    // Ten streams of one HTTP/2 connection, each a GET passed through.
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let get = |n: usize| {
        let request = build_request("GET", &format!("http://{}/files/{n}", gw.addr()), &[], "");
        let (client, request) = (client.clone(), request.expect("request"));
        async move {
            let answer = client.request(request).await.expect("an answer");
            read_whole(answer).await.expect("a whole answer")
        }
    };
    let mut streams = JoinSet::new();
    for n in 0..10 {
        streams.spawn(get(n));
    }
    // Three get a connection (and wait for their answer); the seven others
    // wait connect_timeout for one, and are refused.
    for _ in 0..7 {
        let refused = tokio::time::timeout(WAIT, streams.join_next())
            .await
            .expect("seven refused within WAIT")
            .expect("a stream")
            .expect("its task");
        refused.assert_problem(503, "overloaded");
    }
    assert_eq!(raw.connections(), 3);

    // A write meanwhile shares the bound: claimed, then nothing sent.
    let busy = write(gw.addr(), "/orders", Some("no-connection"), ORDER).await;
    busy.assert_operation_problem(503, "overloaded", "not_attempted");
    assert_eq!((raw.connections(), raw.requests()), (3, 3), "nothing sent");
    let op = gw.operation("no-connection").await;
    assert_eq!(op["evidence"], "upstream-busy", "{op}");

    // The three end at upstream_timeout, and their connections close: the
    // next stream gets one of its own.
    for _ in 0..3 {
        let late = tokio::time::timeout(WAIT, streams.join_next())
            .await
            .expect("answered at upstream_timeout")
            .expect("a stream")
            .expect("its task");
        late.assert_problem(504, "upstream-timeout");
    }
    streams.spawn(get(10));
    eventually("a connection made for the next stream", || async {
        (raw.connections() == 4).then_some(())
    })
    .await;
}

/// A client that stops reading a streamed answer (a write's too large to
/// store) is cut off once it has taken nothing for `header_read_timeout`,
/// and the upstream connection streaming to it comes free: with one
/// allowed, the route's next write is served, never 503 `overloaded` for
/// as long as the reader likes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_frees_the_upstream_connection() {
    let setup = Setup::route("max_upstream_connections = 1\nconnect_timeout = \"300ms\"")
        .server("header_read_timeout = \"1s\"\n");
    let gw = spawn_gateway_with(setup).await;
    // Far more than the sockets between them buffer.
    let head = raw_write_head(
        "/big?bytes=48000000",
        "application/json",
        "big-1",
        &["content-length: 2"],
    );
    let mut stalled = tokio::net::TcpStream::connect(gw.addr())
        .await
        .expect("connect");
    stalled
        .write_all(format!("{head}{{}}").as_bytes())
        .await
        .expect("send");
    let mut first = [0u8; 1024];
    let read = stalled.read(&mut first).await.expect("the answer begins");
    assert!(read > 0);
    // It reads no more, and keeps its connection open.
    let served = eventually_within(
        "the next write to be served",
        Duration::from_secs(20),
        || async {
            let answer = write(
                gw.addr(),
                "/orders",
                Some(&uuid::Uuid::now_v7().to_string()),
                "{}",
            )
            .await;
            (answer.status == StatusCode::CREATED).then_some(answer)
        },
    )
    .await;
    assert_fresh_created(&served);
    drop(stalled);
}

/// `idemgate serve --config config` allowed `descriptors` open files
/// (`ulimit -n`), as a unit's `LimitNOFILE=` does.
fn serve_with_descriptors(config: &std::path::Path, descriptors: u32) -> std::process::Command {
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg(format!(
            "ulimit -n {descriptors} && exec \"$0\" serve --config \"$1\""
        ))
        .arg(env!("CARGO_BIN_EXE_idemgate"))
        .arg(config);
    cmd
}

/// A new connection's `GET /elsewhere` (no route: the gateway answers
/// 404 itself), kept open once answered; `None` when the gateway closed or
/// reset it unanswered (a reset may come before `connect` returns).
/// Panics when it is neither within [`WAIT`].
async fn answered_and_kept(addr: SocketAddr) -> Option<TcpStream> {
    let mut stream = match TcpStream::connect(addr).await {
        Ok(stream) => stream,
        Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => return None,
        Err(error) => panic!("connect: {error}"),
    };
    let exchange = async {
        let _ = stream
            .write_all(b"GET /elsewhere HTTP/1.1\r\nhost: a\r\n\r\n")
            .await;
        read_response(&mut stream).await
    };
    let answer = tokio::time::timeout(WAIT, exchange)
        .await
        .expect("neither answered nor refused: left waiting in the backlog");
    let response = answer?;
    assert_eq!(response.status, 404, "{}", response.head);
    Some(stream)
}

/// Out of file descriptors, a new connection is refused at once (closed
/// unanswered, as the client connects), not left waiting in the kernel's
/// backlog until one frees; that is logged once, and once more when
/// connections are accepted again, with how many were refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_a_connection_is_refused_at_once_and_logged_once() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let dir = tempfile::tempdir().expect("tempdir");
    let setup = Setup::route("")
        .at("/api")
        .server("header_read_timeout = \"60s\"\n");
    let toml = gateway_toml_with(
        &dir.path().join("idemgate.db"),
        "http://127.0.0.1:9",
        &setup,
    );
    let config = write_config(dir.path(), "idemgate.toml", &toml);
    let serve = serve_with_descriptors(&config, 64);
    let gateway = BinaryGateway::spawn(serve, &dir.path().join("gw.log")).await;

    let mut held = Vec::new();
    while let Some(stream) = answered_and_kept(gateway.proxy).await {
        held.push(stream);
        assert!(held.len() < 64, "64 connections held under `ulimit -n 64`");
    }
    let refused = AtomicUsize::new(1);
    for _ in 0..2 {
        let again = answered_and_kept(gateway.proxy).await;
        assert!(again.is_none(), "served while out of descriptors");
        refused.fetch_add(1, Ordering::Relaxed);
    }

    // Connections close: new ones are served, and once that has lasted
    // (a listener at its limit refuses and serves in turn), the log says
    // so.
    drop(held);
    let logged = eventually("connections accepted again, and so logged", || async {
        if answered_and_kept(gateway.proxy).await.is_none() {
            refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let logged = gateway.stderr();
        logged
            .contains("accepting connections again")
            .then_some(logged)
    })
    .await;
    assert_eq!(
        logged.matches("out of file descriptors").count(),
        1,
        "{logged}"
    );
    let counted = format!("refused={}", refused.load(Ordering::Relaxed));
    assert!(logged.contains(&counted), "{counted}: {logged}");
    let metrics = scrape_metrics(gateway.admin).await;
    let series = r#"idemgate_refused_connections_total{listener="proxy"}"#;
    let in_metrics = metric(&metrics, series);
    assert_eq!(
        in_metrics,
        Some(refused.load(Ordering::Relaxed) as f64),
        "{series}"
    );
}
