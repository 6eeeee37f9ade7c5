//! How an exchange ended decides what a retry may do — the rehearsal
//! scenarios of a write whose answer goes missing:
//!
//! 1. nothing reached the upstream (connect refused, TLS handshake failed):
//!    `not_attempted`, idemgate retries the connect itself, a client retry is
//!    a fresh attempt, and in the end exactly one write happened;
//! 2. the upstream committed but the answer was lost (closed, hung past the
//!    timeout, its own 502/504, body cut short, reset): `unknown`, retries
//!    get 409 `outcome-unknown` and nothing is sent again;
//! 3. (same key while the original runs: see `keyless_and_waiting.rs`);
//! 4. a two-step workflow retried after step 2 was refused (503) replays
//!    step 1 and re-attempts only step 2;
//! 5. a reconcile probe that finds the write settles the operation and its
//!    response is replayed; "not found" leaves it `unknown`;
//! 6. a late response within `late_window` settles the operation.
//!
//! Plus: 429 and 503 release the key, and the pause latch.

use std::time::Duration;

use crate::common::*;
use http::StatusCode;
use tokio::io::AsyncWriteExt;

const BODY: &str = r#"{"task":"write the report"}"#;

/// Writes `path` with a fresh key and checks its first answer with
/// `first`; then checks that two retries are held (409, nothing sent) and
/// that the upstream got exactly one write request.
async fn assert_lost_and_held(gw: &TestGateway, path: &str, first: impl Fn(&Response)) {
    let original = write(gw.addr(), path, Some("lost-1"), BODY).await;
    first(&original);
    for _ in 0..2 {
        assert_held_unknown(&write(gw.addr(), path, Some("lost-1"), BODY).await);
    }
    assert_eq!(gw.upstream.write_requests().len(), 1, "never re-sent");
    assert_eq!(gw.operation("lost-1").await["state"], "unknown");
}

/// A gateway with `route` lines (and the admin API) whose write to
/// `path` is lost and held ([`assert_lost_and_held`]), one write sent.
async fn lost_and_held_once(route: &str, path: &str, first: impl Fn(&Response)) -> TestGateway {
    let gw = spawn_gateway_with(Setup::route(route).admin()).await;
    assert_lost_and_held(&gw, path, first).await;
    assert_eq!(gw.upstream.writes(), 1);
    gw
}

/// The problem idemgate answers when it lost the response itself.
fn lost_with(status: u16) -> impl Fn(&Response) {
    move |resp| {
        resp.assert_operation_problem(status, "outcome-unknown", "unknown");
    }
}

/// The upstream's own `status`, passed through.
fn passed_through(status: u16) -> impl Fn(&Response) {
    move |resp| {
        assert_eq!(resp.status.as_u16(), status, "body: {:?}", resp.body);
        assert_eq!(
            resp.json()["upstream_status"],
            status,
            "the upstream's body"
        );
        assert!(!resp.is_replay());
    }
}

// ------------------------------------------------ 2: committed, answer lost

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_closed_after_commit_is_held() {
    let gw = lost_and_held_once("connect_retries = 2", "/drop", lost_with(502)).await;
    assert_eq!(
        gw.upstream.connections(),
        1,
        "no connect retry after writing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hang_past_the_upstream_timeout_is_504_and_held() {
    let gw = lost_and_held_once("upstream_timeout = \"300ms\"", "/hold", lost_with(504)).await;
    // The timeline shows the write leaving when it left, not with its
    // timeout 300 ms later (where an operator would look at the
    // destination's logs).
    let held = gw.operation("lost-1").await;
    let at = |kind: &str| {
        let events = held["events"].as_array().expect("events");
        let event = events.iter().find(|e| e["kind"] == kind).expect(kind);
        let at = humantime::parse_rfc3339(event["at"].as_str().expect("at")).expect("RFC 3339");
        let since = at
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970");
        since.as_millis() as i64
    };
    assert!(at("timeout") - at("sent") >= 300, "{held}");
    assert!(at("sent") >= at("claimed"), "{held}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_504_after_commit_is_passed_through_and_held() {
    lost_and_held_once("", "/commit-then/504", passed_through(504)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_502_after_commit_is_passed_through_and_held() {
    lost_and_held_once("", "/commit-then/502", passed_through(502)).await;
}

/// A response head longer than the gateway takes (its field of 500 KB) is
/// no answer, whichever connection brings it: on a fresh one hyper
/// refuses it, and on a reused one whose buffer took it whole in one read
/// the pool refuses it alike — held `unknown` (a 502) both times, never
/// stored and replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_head_too_large_is_held_on_any_connection() {
    let gw = spawn_gateway_with(Setup::route("").admin()).await;
    let huge = "/big-head?bytes=500000";
    // Whether hyper's buffer takes the head in one read is the host's
    // timing: ten rounds, so that it happens.
    for round in 0..10 {
        // A small answer first leaves the connection idle in the pool.
        let warm = write(gw.addr(), "/orders", Some(&format!("warm-{round}")), BODY).await;
        assert_fresh_created(&warm);
        let key = format!("head-{round}");
        let lost = write(gw.addr(), huge, Some(&key), BODY).await;
        lost.assert_operation_problem(502, "outcome-unknown", "unknown");
        assert_held_unknown(&write(gw.addr(), huge, Some(&key), BODY).await);
    }
    assert_eq!(gw.upstream.writes(), 20, "each sent once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_cut_short_is_502_and_held() {
    let gw = lost_and_held_once("", "/truncate", lost_with(502)).await;
    // Read as a cut body (6 bytes of the 100 announced), not as a
    // connection closed before any answer.
    let held = gw.operation("lost-1").await;
    let errors: Vec<&str> = held["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|event| event["detail"]["error"].as_str())
        .collect();
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("response body cut after 6 bytes")),
        "{held}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_after_the_request_is_unknown_and_never_retried() {
    let raw = RawUpstream::start(Breakage::ResetAfterRequest).await;
    let gw = spawn_gateway_with(Setup::route("connect_retries = 3").upstream_url(raw.url())).await;

    let first = write(gw.addr(), "/orders", Some("reset-1"), BODY).await;
    first.assert_operation_problem(502, "outcome-unknown", "unknown");
    assert_eq!(raw.requests(), 1, "the upstream read the whole request");
    assert_eq!(raw.connections(), 1, "written once: no connect retry");

    let retry = write(gw.addr(), "/orders", Some("reset-1"), BODY).await;
    assert_held_unknown(&retry);
    assert_eq!(raw.connections(), 1, "the retry sent nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_closed_at_accept_may_have_been_written_so_is_unknown() {
    // TCP connected: the request may be in the upstream's buffer. Only a
    // failed connect proves nothing was written.
    let raw = RawUpstream::start(Breakage::CloseAtOnce).await;
    let gw = spawn_gateway_with(Setup::route("connect_retries = 3").upstream_url(raw.url())).await;

    let first = write(gw.addr(), "/orders", Some("close-1"), BODY).await;
    first.assert_operation_problem(502, "outcome-unknown", "unknown");
    assert_eq!(raw.connections(), 1, "no connect retry once connected");
    assert_held_unknown(&write(gw.addr(), "/orders", Some("close-1"), BODY).await);
    assert_eq!(raw.connections(), 1);
}

// ------------------------------------------------ 1: nothing reached it

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connect_is_retried_by_the_gateway_until_the_upstream_is_up() {
    let port = closed_port().await;
    let setup = Setup::route("connect_retries = 8")
        .admin()
        .upstream_url(format!("http://{port}"));
    let gw = spawn_gateway_with(setup).await;
    let addr = gw.addr();
    let client = tokio::spawn(async move { write(addr, "/orders", Some("conn-1"), BODY).await });

    // Claimed, its first connect refused and a retry on its way: the
    // gateway counts each retry; the backoff (full jitter, 100 ms doubling,
    // 8 retries) leaves the upstream time to come up.
    let retries = r#"idemgate_upstream_connect_retries_total{route="api"}"#;
    eventually("a refused connect, tried again", || async {
        let text = scrape_metrics(gw.admin_addr()).await;
        (metric(&text, retries) >= Some(1.0)).then_some(())
    })
    .await;
    let upstream = FakeUpstream::start_on(port.release()).await;
    let first = client.await.expect("client task");

    assert_fresh_created(&first);
    assert_eq!(upstream.writes(), 1);
    assert_eq!(upstream.connections(), 1);
    let stored = gw.operation("conn-1").await;
    let tries = events_of(&stored, "sent")[0]["tries"]
        .as_u64()
        .expect("tries");
    assert!(
        tries >= 2,
        "sent on connect try {tries}: it was refused first"
    );
    assert_eq!(stored["attempts"], 1, "connect retries are one attempt");
    let retry = write(gw.addr(), "/orders", Some("conn-1"), BODY).await;
    assert_replay_of(&retry, &first);
    assert_eq!(upstream.writes(), 1, "exactly one write in the end");
}

/// A gateway whose upstream answers no connect ([`SilentPort`]) and
/// whose `connect_timeout` is longer than its `upstream_timeout`, no
/// connect retried: the write's first answer, and the port.
async fn connect_outlasting_the_upstream_timeout(key: &str) -> (TestGateway, SilentPort, Response) {
    let port = silent_port().await;
    let route = "upstream_timeout = \"300ms\"\nconnect_timeout = \"1500ms\"\nconnect_retries = 0";
    let setup = Setup::route(route)
        .admin()
        .upstream_url(format!("http://{}", port.addr()));
    let gw = spawn_gateway_with(setup).await;
    let first = write(gw.addr(), "/orders", Some(key), BODY).await;
    (gw, port, first)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_slower_than_the_upstream_timeout_is_not_attempted() {
    let (gw, port, first) = connect_outlasting_the_upstream_timeout("slow-1").await;
    first.assert_operation_problem(502, "upstream-unreachable", "not_attempted");
    let stored = gw.operation("slow-1").await;
    assert_eq!(stored["state"], "not_attempted");
    assert!(
        events_of(&stored, "sent").is_empty(),
        "nothing was handed over: {stored}"
    );
    assert_eq!(events_of(&stored, "connect-failed").len(), 1, "{stored}");

    let upstream = port.serve();
    let retry = write(gw.addr(), "/orders", Some("slow-1"), BODY).await;
    assert_fresh_created(&retry);
    assert_eq!(gw.operation("slow-1").await["attempts"], 2);
    assert_eq!(upstream.writes(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_still_connecting_when_its_client_is_answered_is_never_sent() {
    let (gw, port, _) = connect_outlasting_the_upstream_timeout("slow-2").await;
    // The upstream starts accepting once the client has its answer: the
    // connect that was under way then must not go on to write, and the
    // retry is the write.
    let upstream = port.serve();
    let retry = write(gw.addr(), "/orders", Some("slow-2"), BODY).await;
    assert_fresh_created(&retry);
    assert_eq!(
        upstream.write_requests().len(),
        1,
        "the retry's is the only write the upstream received"
    );
    let stored = gw.operation("slow-2").await;
    assert_eq!(events_of(&stored, "sent").len(), 1, "{stored}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_write_is_not_attempted_and_the_client_retry_is_attempt_2() {
    let port = closed_port().await;
    let setup = Setup::route("connect_retries = 1")
        .admin()
        .upstream_url(format!("http://{port}"));
    let gw = spawn_gateway_with(setup).await;

    let refused = write(gw.addr(), "/orders", Some("conn-2"), BODY).await;
    refused.assert_operation_problem(502, "upstream-unreachable", "not_attempted");
    // Nothing was sent, so a retry now is the next attempt: said so to an
    // SDK that retries a POST only when told to (azure-core).
    assert_eq!(refused.header("retry-after"), Some("1"));
    let stored = gw.operation("conn-2").await;
    assert_eq!(stored["state"], "not_attempted");
    assert_eq!(
        events_of(&stored, "connect-failed")[0]["tries"],
        2,
        "1 + connect_retries"
    );

    let upstream = FakeUpstream::start_on(port.release()).await;
    let retry = write(gw.addr(), "/orders", Some("conn-2"), BODY).await;
    assert_fresh_created(&retry);
    assert_eq!(gw.operation("conn-2").await["attempts"], 2);
    let again = write(gw.addr(), "/orders", Some("conn-2"), BODY).await;
    assert_replay_of(&again, &retry);
    assert_eq!(upstream.writes(), 1, "exactly one write in the end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_handshake_failure_is_not_attempted_and_retried() {
    // An https upstream that speaks plain HTTP: the handshake fails before
    // any byte of the request is written.
    let upstream = FakeUpstream::start().await;
    let url = format!("https://{}", upstream.addr());
    let gw = spawn_gateway_on(
        upstream,
        Setup::route("connect_retries = 2")
            .admin()
            .upstream_url(url),
    )
    .await;

    let first = write(gw.addr(), "/orders", Some("tls-1"), BODY).await;
    first.assert_operation_problem(502, "upstream-unreachable", "not_attempted");
    assert_eq!(
        gw.upstream.connections(),
        3,
        "1 + connect_retries handshakes"
    );
    assert_eq!(gw.operation("tls-1").await["state"], "not_attempted");

    let retry = write(gw.addr(), "/orders", Some("tls-1"), BODY).await;
    retry.assert_operation_problem(502, "upstream-unreachable", "not_attempted");
    assert_eq!(
        gw.upstream.connections(),
        6,
        "the client retry is a fresh attempt"
    );
    assert_eq!(gw.operation("tls-1").await["attempts"], 2);
    assert!(gw.upstream.requests().is_empty(), "no request got through");
    assert_eq!(gw.upstream.writes(), 0, "nothing committed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_to_a_listener_that_closes_is_retried_as_not_sent() {
    // The same closing listener as plain http above (1 connection, unknown):
    // over https the close comes before the request could be written.
    let raw = RawUpstream::start(Breakage::CloseAtOnce).await;
    let url = raw.url().replace("http://", "https://");
    let gw = spawn_gateway_with(
        Setup::route("connect_retries = 2")
            .admin()
            .upstream_url(url),
    )
    .await;

    let first = write(gw.addr(), "/orders", Some("tls-2"), BODY).await;
    first.assert_operation_problem(502, "upstream-unreachable", "not_attempted");
    assert_eq!(raw.connections(), 3, "1 + connect_retries");
}

// ------------------------------------------------ release statuses

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_429_and_503_release_the_key() {
    let gw = spawn_gateway_with(Setup::route("").admin()).await;

    for code in [429u16, 503] {
        let key = format!("rel-{code}");
        let path = format!("/once/{code}");
        let writes_before = gw.upstream.writes();

        let refused = write(gw.addr(), &path, Some(&key), BODY).await;
        passed_through(code)(&refused);
        assert!(
            refused.header("retry-after").is_some(),
            "upstream headers kept"
        );
        let stored = gw.operation(&key).await;
        assert_eq!(stored["state"], "not_attempted", "{code}");
        assert_eq!(
            gw.upstream.writes(),
            writes_before,
            "{code} committed nothing"
        );

        let retry = write(gw.addr(), &path, Some(&key), BODY).await;
        assert_fresh_created(&retry);
        assert_eq!(gw.operation(&key).await["attempts"], 2, "{code}: attempt 2");
        let again = write(gw.addr(), &path, Some(&key), BODY).await;
        assert_replay_of(&again, &retry);
        assert_eq!(gw.upstream.writes(), writes_before + 1, "{code}");
    }
    assert_eq!(gw.upstream.write_requests().len(), 4);
}

/// A release status whose body is larger than `max_stored_response` is
/// passed on without it, and without the headers that described it: an
/// empty body labelled JSON is one an SDK fails to parse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_status_too_large_to_keep_comes_without_its_body_and_its_type() {
    let gw = spawn_gateway_with(Setup::route("max_stored_response = \"8B\"")).await;
    let refused = write(gw.addr(), "/status/429", Some("rel-large"), BODY).await;
    assert_eq!(refused.status, 429, "{:?}", refused.body);
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert!(refused.body.is_empty(), "{:?}", refused.body);
    assert_eq!(
        refused.header("content-type"),
        None,
        "{:?}",
        refused.headers
    );
    assert_eq!(gw.upstream.writes(), 0);
}

/// A Stripe answer that says its request may be retried as it is
/// (`Stripe-Should-Retry: true`: no endpoint began, nothing was saved for
/// the key) releases the attempt whatever its status: the SDK's retry is
/// sent, not answered a stored copy that tells it to retry for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stripe_answer_that_says_retry_releases_the_key() {
    let conflict = RawUpstream::start(Breakage::Answers(STRIPE_LOCK_TIMEOUT)).await;
    let gw = spawn_gateway_with(
        Setup::route("profile = \"stripe\"")
            .upstream_url(conflict.url())
            .admin(),
    )
    .await;
    let refused = write(gw.addr(), "/orders", Some("k-lock"), BODY).await;
    assert_eq!(refused.status, 409, "{:?}", refused.body);
    assert_eq!(refused.header("stripe-should-retry"), Some("true"));
    assert!(!refused.is_replay());
    assert_eq!(gw.operation("k-lock").await["state"], "not_attempted");
    let retried = write(gw.addr(), "/orders", Some("k-lock"), BODY).await;
    assert_eq!(retried.status, 409, "{:?}", retried.body);
    assert!(!retried.is_replay(), "sent again, not replayed");
    assert_eq!(conflict.requests(), 2, "released: its retry is sent");
}

const STRIPE_LOCK_TIMEOUT: &[u8] = b"HTTP/1.1 409 Conflict\r\n\
content-type: application/json\r\nstripe-should-retry: true\r\nconnection: close\r\n\
content-length: 33\r\n\r\n\
{\"error\":{\"code\":\"lock_timeout\"}}";

// ------------------------------------------------ 4: a two-step workflow

/// Create (key `wf-create`), then notify (key `wf-notify`, refused with 503
/// the first time); stops after a failed step like a workflow tool.
async fn run_workflow(gw: &TestGateway) -> (Response, Option<Response>) {
    let created = write(gw.addr(), "/orders", Some("wf-create"), BODY).await;
    if !created.status.is_success() {
        return (created, None);
    }
    let notified = write(
        gw.addr(),
        "/once/503",
        Some("wf-notify"),
        r#"{"notify":"crm"}"#,
    )
    .await;
    (created, Some(notified))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_workflow_replays_step_1_and_reattempts_only_step_2() {
    let gw = spawn_gateway_with(Setup::route("").admin()).await;

    let (created, notified) = run_workflow(&gw).await;
    assert_fresh_created(&created);
    assert_eq!(
        notified.expect("step 2 ran").status,
        StatusCode::SERVICE_UNAVAILABLE
    );

    let (created_again, notified) = run_workflow(&gw).await;
    assert_replay_of(&created_again, &created);
    let notified = notified.expect("step 2 ran");
    assert_fresh_created(&notified);

    let (created_third, notified_third) = run_workflow(&gw).await;
    assert_replay_of(&created_third, &created);
    assert_replay_of(&notified_third.expect("step 2 ran"), &notified);

    let sent: Vec<String> = gw
        .upstream
        .write_requests()
        .into_iter()
        .map(|r| r.uri)
        .collect();
    assert_eq!(sent, ["/orders", "/once/503", "/once/503"]);
    assert_eq!(gw.upstream.writes(), 2, "one order, one notification");
}

// ------------------------------------------------ 5: reconcile probes

/// A gateway whose route probes `GET /lookup?key={key}` on its upstream.
async fn with_lookup_probe() -> TestGateway {
    spawn_probing("/lookup?key={key}", "found_json_pointer = \"/id\"").await
}

fn probes(gw: &TestGateway) -> Vec<Recorded> {
    gw.upstream
        .requests()
        .into_iter()
        .filter(|r| r.uri.starts_with("/lookup"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_that_finds_the_write_settles_it_and_is_replayed() {
    let gw = with_lookup_probe().await;
    let settled = lost_then_settled(gw.addr(), "/drop", "rec-1", BODY).await;

    assert_eq!(settled.status, StatusCode::OK, "the probe's status");
    assert!(settled.is_replay(), "idempotent-replayed: true");
    assert_eq!(
        settled.json(),
        serde_json::json!({ "id": 1 }),
        "the probe's body"
    );
    assert_eq!(settled.header("x-upstream-tag"), Some("lookup"));
    let again = write(gw.addr(), "/drop", Some("rec-1"), BODY).await;
    assert_eq!(again.status, StatusCode::OK);
    assert!(again.is_replay());
    assert_eq!(again.body, settled.body);

    assert_eq!(gw.upstream.writes(), 1, "nothing new written");
    assert_eq!(gw.upstream.write_requests().len(), 1);
    let probes = probes(&gw);
    assert!(!probes.is_empty());
    assert!(
        probes
            .iter()
            .all(|p| p.method == "GET" && p.uri == "/lookup?key=rec-1")
    );
    assert_eq!(
        probes[0].header("authorization"),
        Some(ALICE),
        "the caller's credentials"
    );
    let stored = gw.operation("rec-1").await;
    assert_eq!(stored["state"], "completed");
    assert_eq!(stored["evidence"], "reconciled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_that_finds_nothing_leaves_it_unknown() {
    let gw = with_lookup_probe().await;
    // The upstream answers 502 without committing: nothing to find.
    let lost = write(gw.addr(), "/status/502", Some("rec-2"), BODY).await;
    passed_through(502)(&lost);
    gw.upstream.wait_for_requests(2).await; // the write and the first probe

    let retry = write(gw.addr(), "/status/502", Some("rec-2"), BODY).await;

    assert_held_unknown(&retry);
    assert_eq!(gw.operation("rec-2").await["state"], "unknown");
    assert!(!probes(&gw).is_empty());
    assert_eq!(gw.upstream.write_requests().len(), 1, "not re-sent");
}

// ------------------------------------------------ 6: late responses

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_response_within_the_window_settles_the_operation() {
    let gw = spawn_gateway_with(
        Setup::route("upstream_timeout = \"500ms\"\nlate_window = \"5s\"").admin(),
    )
    .await;

    let timed_out = write(gw.addr(), "/slow?ms=1500", Some("late-1"), BODY).await;
    timed_out.assert_operation_problem(504, "outcome-unknown", "unknown");
    assert_held_unknown(&write(gw.addr(), "/slow?ms=1500", Some("late-1"), BODY).await);

    let replay = write_until(
        gw.addr(),
        "/slow?ms=1500",
        "late-1",
        BODY,
        Duration::from_secs(5),
        |r| r.status != StatusCode::CONFLICT,
    )
    .await;

    assert_eq!(replay.status, StatusCode::CREATED, "the late 201");
    assert!(replay.is_replay());
    assert_eq!(replay.json()["id"], 1);
    assert_eq!(gw.upstream.writes(), 1);
    assert_eq!(gw.upstream.requests().len(), 1);
    assert_eq!(gw.operation("late-1").await["evidence"], "late-response");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_after_the_late_window_does_not_settle() {
    let gw = spawn_gateway("upstream_timeout = \"300ms\"\nlate_window = \"300ms\"").await;

    let timed_out = write(gw.addr(), "/slow?ms=1200", Some("late-2"), BODY).await;
    timed_out.assert_operation_problem(504, "outcome-unknown", "unknown");
    // The gateway lets go of the exchange when the late window ends: the
    // connection ends, and with it any way for the answer to arrive.
    gw.upstream.wait_for_closed_connections(1).await;

    assert_held_unknown(&write(gw.addr(), "/slow?ms=1200", Some("late-2"), BODY).await);
    assert_eq!(gw.upstream.writes(), 1);
}

// ------------------------------------------------ the pause latch

const PAUSE_AFTER_2: &str = "pause_after_unknown = 2";

/// A completed operation `done-1`, then two unknown ones (`lost-1`, `lost-2`).
async fn two_unknown_after_one_completed(gw: &TestGateway) -> Response {
    let done = write(gw.addr(), "/orders", Some("done-1"), BODY).await;
    assert_fresh_created(&done);
    for key in ["lost-1", "lost-2"] {
        lose_one(gw, key).await;
    }
    done
}

async fn lose_one(gw: &TestGateway, key: &str) {
    let lost = write(gw.addr(), "/drop", Some(key), BODY).await;
    lost.assert_operation_problem(502, "outcome-unknown", "unknown");
}

fn assert_paused(resp: &Response) {
    resp.assert_problem(503, "route-paused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_pauses_once_enough_operations_are_unknown() {
    let gw = spawn_gateway_with(Setup::route(PAUSE_AFTER_2).admin()).await;
    let done = write(gw.addr(), "/orders", Some("done-1"), BODY).await;
    assert_fresh_created(&done);
    lose_one(&gw, "lost-1").await;
    // The next write is on its way (all but its last byte) while the second
    // write is lost; it completes only after the client learned of that.
    let mut next = tokio::net::TcpStream::connect(gw.addr())
        .await
        .expect("connect");
    let mut request = raw_write_head(
        "/orders",
        "application/json",
        "new-1",
        &[&format!("content-length: {}", BODY.len())],
    )
    .into_bytes();
    request.extend_from_slice(BODY.as_bytes());
    let last = request.pop().expect("a body");
    next.write_all(&request).await.expect("write head");
    lose_one(&gw, "lost-2").await;
    let sent_before = gw.upstream.requests().len();

    next.write_all(&[last]).await.expect("write last byte");
    let new_write = tokio::time::timeout(WAIT, read_response(&mut next))
        .await
        .expect("an answer in time")
        .expect("an answer");

    assert_eq!(
        new_write.status,
        503,
        "a write after the second unknown outcome: {}",
        String::from_utf8_lossy(&new_write.body)
    );
    assert!(String::from_utf8_lossy(&new_write.body).contains("urn:idemgate:problem:route-paused"));
    assert_eq!(gw.upstream.requests().len(), sent_before, "not sent");
    assert_paused(&write(gw.addr(), "/orders", Some("new-2"), BODY).await);
    assert_replay_of(
        &write(gw.addr(), "/orders", Some("done-1"), BODY).await,
        &done,
    );
    assert_eq!(gw.upstream.writes(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_survives_a_restart() {
    let mut gw = spawn_gateway_with(Setup::route(PAUSE_AFTER_2).admin()).await;
    let done = two_unknown_after_one_completed(&gw).await;
    // The latch tripped before the loss was answered; a held operation
    // still answers for itself on the paused route.
    assert_paused(&write(gw.addr(), "/orders", Some("new-0"), BODY).await);
    assert_held_unknown(&write(gw.addr(), "/drop", Some("lost-2"), BODY).await);
    let sent_before = gw.upstream.requests().len();

    // Restart with a threshold the unknown operations do not reach: only the
    // stored latch can keep the route paused.
    gw.shutdown().await;
    gw.toml = gw.toml.replace(PAUSE_AFTER_2, "pause_after_unknown = 100");
    gw.start_again().await;

    assert_paused(&write(gw.addr(), "/orders", Some("new-1"), BODY).await);
    assert_paused(&write(gw.addr(), "/orders", Some("new-2"), BODY).await);
    assert_replay_of(
        &write(gw.addr(), "/orders", Some("done-1"), BODY).await,
        &done,
    );
    assert_eq!(
        gw.upstream.requests().len(),
        sent_before,
        "nothing sent while paused"
    );
    assert_eq!(gw.upstream.writes(), 3);
}
