//! Every answer comes from the operation the store holds now for the
//! write's identity: never from a superseded one (derive window), a stale
//! cache entry, a snapshot taken before a probe settled it, or a pause
//! latch that a resume already cleared (a paused route answers `unknown`
//! and `in_progress` operations with their own state); and duplicates that
//! waited on an attempt the upstream refused get that refusal instead of
//! each sending.

use std::time::Duration;

use crate::common::*;
use http::StatusCode;
use idemgate_model::clock::ManualClock;
use serde_json::json;

const ORDER: &str = r#"{"sku":"apple","qty":3}"#;
const WINDOW: Duration = Duration::from_secs(2);
const PAST_WINDOW: Duration = Duration::from_millis(2500);

/// A derive route (no `derive_from`, 2 s window) on a manual clock, with
/// the admin API.
async fn derive_route(extra: &str) -> (TestGateway, std::sync::Arc<ManualClock>) {
    let clock = ManualClock::new();
    let route = format!("key = \"derive\"\nderive_window = \"2s\"\n{extra}");
    let gw = spawn_gateway_with(Setup::route(&route).clock(clock.clone()).admin()).await;
    (gw, clock)
}

fn announced_key(resp: &Response) -> String {
    resp.header("idempotency-key")
        .unwrap_or_else(|| panic!("no idempotency-key announced; status {}", resp.status))
        .to_owned()
}

/// Operation A completes; past the window the same keyless request starts
/// B under the same key. Returns A's response and the key.
async fn completed_then_superseded(
    gw: &TestGateway,
    clock: &ManualClock,
    fate_of_b: Scripted,
) -> (Response, String, Response) {
    let first = write(gw.addr(), "/scripted", None, ORDER).await;
    assert_eq!(assert_fresh_created(&first), 1);
    let key = announced_key(&first);
    clock.advance(PAST_WINDOW);
    gw.upstream.script(fate_of_b);
    let second = write(gw.addr(), "/scripted", None, ORDER).await;
    assert_eq!(announced_key(&second), key, "B takes the key");
    (first, key, second)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseded_operation_is_never_replayed_when_the_next_is_unknown() {
    let (gw, clock) = derive_route("").await;
    let (_, key, lost) = completed_then_superseded(&gw, &clock, Scripted::Drop).await;
    lost.assert_operation_problem(502, "outcome-unknown", "unknown");

    let keyless = write(gw.addr(), "/scripted", None, ORDER).await;
    assert_held_unknown(&keyless);
    let keyed = write(gw.addr(), "/scripted", Some(&key), ORDER).await;
    assert_held_unknown(&keyed);
    assert_eq!(gw.upstream.writes(), 2);

    // An operator settles B with another response: that is what replays.
    let id = gw.operation(&key).await["id"].as_str().unwrap().to_owned();
    let resolution = json!({
        "outcome": "completed", "operator": "ann",
        "response": {"status": 201, "body": {"id": "from-operator"}}
    });
    gw.resolved(&id, &resolution).await;
    for key in [None, Some(key.as_str())] {
        let replay = write(gw.addr(), "/scripted", key, ORDER).await;
        assert!(replay.is_replay());
        assert_eq!(replay.json()["id"], "from-operator");
    }
    assert_eq!(gw.upstream.writes(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseded_operation_is_never_replayed_while_the_next_is_in_flight() {
    let (gw, clock) = derive_route("").await;
    let first = write(gw.addr(), "/slow?ms=600", None, ORDER).await;
    assert_fresh_created(&first);
    let key = announced_key(&first);
    clock.advance(PAST_WINDOW);
    let addr = gw.addr();
    let second = tokio::spawn(async move { write(addr, "/slow?ms=600", None, ORDER).await });
    gw.upstream.wait_for_writes(2).await;

    let keyed = write(gw.addr(), "/slow?ms=600", Some(&key), ORDER).await;
    keyed.assert_operation_problem(409, "request-in-progress", "in_progress");
    let second = second.await.expect("client task");
    assert_eq!(assert_fresh_created(&second), 2);
    let keyed = write(gw.addr(), "/slow?ms=600", Some(&key), ORDER).await;
    assert_replay_of(&keyed, &second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseded_operation_is_never_replayed_when_the_next_was_refused() {
    let (gw, clock) = derive_route("").await;
    let (_, key, refused) = completed_then_superseded(&gw, &clock, Scripted::Refuse(503)).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);

    // B is not_attempted: the retry with the key is B's next attempt, the
    // same before and after a restart (the cache is no part of the answer).
    let keyed = write(gw.addr(), "/scripted", Some(&key), ORDER).await;
    assert_eq!(keyed.status, StatusCode::SERVICE_UNAVAILABLE, "sent again");
    assert_eq!(gw.upstream.write_requests().len(), 3);
    gw.upstream.script(Scripted::Create);
    let keyed = write(gw.addr(), "/scripted", Some(&key), ORDER).await;
    assert_eq!(assert_fresh_created(&keyed), 2);
    assert_eq!(gw.operation(&key).await["attempts"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_route_does_not_replay_an_operation_past_the_window() {
    let (gw, clock) = derive_route("").await;
    let first = write(gw.addr(), "/orders", None, ORDER).await;
    assert_fresh_created(&first);
    let within = write(gw.addr(), "/orders", None, ORDER).await;
    assert_replay_of(&within, &first);
    clock.advance(PAST_WINDOW);
    let paused = gw.admin("POST", "/admin/routes/api/pause", "").await;
    assert_eq!(paused.status, StatusCode::OK);

    let resp = write(gw.addr(), "/orders", None, ORDER).await;
    resp.assert_problem(503, "route-paused");
    assert_eq!(gw.upstream.writes(), 1, "nothing sent");
    // The operation still current for an explicit key still replays.
    let keyed = write(gw.addr(), "/orders", Some(&announced_key(&first)), ORDER).await;
    assert_replay_of(&keyed, &first);
    assert!(WINDOW < PAST_WINDOW);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_route_answers_held_operations_for_themselves() {
    let gw = spawn_gateway_with(Setup::route("").admin()).await;
    let lost = write(gw.addr(), "/drop", Some("held-1"), ORDER).await;
    lost.assert_operation_problem(502, "outcome-unknown", "unknown");
    let paused = gw.admin("POST", "/admin/routes/api/pause", "").await;
    assert_eq!(paused.status, StatusCode::OK);

    let retry = write(gw.addr(), "/drop", Some("held-1"), ORDER).await;
    assert_held_unknown(&retry);
    let changed = write(gw.addr(), "/drop", Some("held-1"), r#"{"sku":"pear"}"#).await;
    changed.assert_operation_problem(422, "key-reused", "unknown");
    let new = write(gw.addr(), "/drop", Some("held-2"), ORDER).await;
    new.assert_problem(503, "route-paused");
    assert_eq!(gw.upstream.writes(), 1);
}

/// A write in flight on `gw` (the upstream holds it 800 ms), the route
/// paused meanwhile; returns the first client's task.
async fn in_flight_then_paused(
    gw: &TestGateway,
    key: &'static str,
) -> tokio::task::JoinHandle<Response> {
    let addr = gw.addr();
    let first = tokio::spawn(async move { write(addr, "/slow?ms=800", Some(key), ORDER).await });
    gw.upstream.wait_for_writes(1).await;
    let paused = gw.admin("POST", "/admin/routes/api/pause", "").await;
    assert_eq!(paused.status, StatusCode::OK);
    first
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_route_answers_an_operation_in_flight_for_itself() {
    let gw = spawn_gateway_with(Setup::route("").admin()).await;
    let first = in_flight_then_paused(&gw, "flying-1").await;

    let retry = write(gw.addr(), "/slow?ms=800", Some("flying-1"), ORDER).await;
    retry.assert_operation_problem(409, "request-in-progress", "in_progress");
    let new = write(gw.addr(), "/slow?ms=800", Some("flying-2"), ORDER).await;
    new.assert_problem(503, "route-paused");

    let first = first.await.expect("client task");
    assert_fresh_created(&first);
    let after = write(gw.addr(), "/slow?ms=800", Some("flying-1"), ORDER).await;
    assert_replay_of(&after, &first);
    assert_eq!(gw.upstream.writes(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_wait_route_lets_a_duplicate_wait_for_the_write_in_flight() {
    let gw = spawn_gateway_with(Setup::route(r#"in_progress = "wait""#).admin()).await;
    let first = in_flight_then_paused(&gw, "flying-3").await;

    let waited = write(gw.addr(), "/slow?ms=800", Some("flying-3"), ORDER).await;
    let first = first.await.expect("client task");
    assert_fresh_created(&first);
    assert_replay_of(&waited, &first);
    assert_eq!(gw.upstream.writes(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_route_stays_resumed_across_a_restart() {
    let mut gw = spawn_gateway_with(Setup::route("pause_after_unknown = 2").admin()).await;
    for key in ["lost-1", "lost-2"] {
        let lost = write(gw.addr(), "/drop", Some(key), ORDER).await;
        lost.assert_operation_problem(502, "outcome-unknown", "unknown");
    }
    write(gw.addr(), "/orders", Some("while-paused"), ORDER)
        .await
        .assert_problem(503, "route-paused");
    let resumed = gw.admin("POST", "/admin/routes/api/resume", "").await;
    assert_eq!(resumed.status, StatusCode::OK);
    assert_fresh_created(&write(gw.addr(), "/orders", Some("after-resume"), ORDER).await);

    gw.restart().await;
    let after_restart = write(gw.addr(), "/orders", Some("after-restart"), ORDER).await;
    assert_fresh_created(&after_restart);

    // The next transition to unknown trips the latch again.
    let lost = write(gw.addr(), "/drop", Some("lost-3"), ORDER).await;
    lost.assert_operation_problem(502, "outcome-unknown", "unknown");
    write(gw.addr(), "/orders", Some("paused-again"), ORDER)
        .await
        .assert_problem(503, "route-paused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_a_refused_attempt_get_its_answer_and_send_nothing() {
    let gw = spawn_gateway_with(Setup::route(r#"in_progress = "wait""#).admin()).await;
    let responses = concurrent_writes(gw.addr(), 8, "/once/503?ms=400", "refused-1", ORDER).await;

    for resp in &responses {
        assert_eq!(
            resp.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{:?}",
            resp.body
        );
        assert_eq!(resp.header("retry-after"), Some("1"));
        assert_eq!(resp.json()["upstream_status"], 503);
        assert!(!resp.is_replay());
    }
    assert_eq!(
        gw.upstream.write_requests().len(),
        1,
        "one attempt, not one per waiter"
    );
    assert_eq!(gw.operation("refused-1").await["attempts"], 1);
    // The client's next retry is the next attempt.
    let retry = write(gw.addr(), "/once/503?ms=400", Some("refused-1"), ORDER).await;
    assert_fresh_created(&retry);
    assert_eq!(gw.operation("refused-1").await["attempts"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_an_unreachable_attempt_get_its_answer_and_send_nothing() {
    let upstream = FakeUpstream::start().await;
    let addr = upstream.addr();
    drop(upstream);
    let setup = Setup::route("in_progress = \"wait\"\nconnect_retries = 2")
        .upstream_url(format!("http://{addr}"))
        .admin();
    let gw = spawn_gateway_with(setup).await;
    let responses = concurrent_writes(gw.addr(), 6, "/orders", "unreachable-1", ORDER).await;

    for resp in &responses {
        resp.assert_operation_problem(502, "upstream-unreachable", "not_attempted");
    }
    let op = gw.operation("unreachable-1").await;
    assert_eq!(op["attempts"], 1, "{op}");
    assert_eq!(events_of(&op, "connect-failed").len(), 1, "{op}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_racing_the_follow_up_probe_answers_from_the_settled_operation() {
    let gw = spawn_probing("/lookup?ms=300&key={key}", "found_json_pointer = \"/id\"").await;
    let lost = write(gw.addr(), "/drop", Some("race-1"), ORDER).await;
    lost.assert_operation_problem(502, "outcome-unknown", "unknown");

    // The follow-up probe is running (300 ms): the retry waits for it.
    let retry = write(gw.addr(), "/drop", Some("race-1"), ORDER).await;
    assert_eq!(
        retry.status,
        StatusCode::OK,
        "{:?}",
        String::from_utf8_lossy(&retry.body)
    );
    assert!(retry.is_replay());
    assert_eq!(retry.json()["id"], 1);
    let op = gw.operation("race-1").await;
    assert_eq!(op["state"], "completed");
    assert_eq!(op["evidence"], "reconciled");
    assert_eq!(gw.upstream.writes(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unasked_101_is_no_final_response() {
    let raw = RawUpstream::start(Breakage::SwitchProtocols).await;
    let gw = spawn_gateway_with(Setup::route("").upstream_url(raw.url())).await;
    let first = write(gw.addr(), "/orders", Some("switch-1"), ORDER).await;
    first.assert_operation_problem(502, "outcome-unknown", "unknown");
    let retry = write(gw.addr(), "/orders", Some("switch-1"), ORDER).await;
    assert_held_unknown(&retry);
    assert_eq!(raw.requests(), 1, "never sent again");
}
