//! Writes that carry no key, and duplicates that arrive while the first is
//! still in flight.
//!
//! - `key = "derive"` with `derive_from`: the named body fields are the
//!   operation (a changed body is 422, a body lacking them 400 `missing-key`);
//!   without it, identical requests are one operation while the earlier one
//!   was last updated within `derive_window` (by the store's clock), except
//!   that an `unknown` or `in_progress` one always matches.
//! - `in_progress = "wait"`: duplicates wait for the first attempt and get
//!   its replay, 409 when `wait_timeout` runs out; when the first attempt is
//!   released (429), every waiter gets that 429 and sends nothing: the
//!   client's next retry is the next attempt.
//! - `in_progress = "reject"` (default): a duplicate is refused at once.

use std::time::{Duration, Instant};

use crate::common::*;
use http::StatusCode;
use idemgate_model::clock::ManualClock;

const EVENT: &str = r#"{"event_id":"evt-1","title":"from the CRM"}"#;
const ORDER: &str = r#"{"sku":"apple","qty":3}"#;
const DERIVE_FROM_EVENT: &str = "key = \"derive\"\nderive_from = [\"/event_id\"]";
const DERIVE_WINDOW: Duration = Duration::from_secs(600);

/// The `derived-<64 hex>` key a response announces.
fn derived_key(resp: &Response) -> String {
    let key = resp
        .header("idempotency-key")
        .unwrap_or_else(|| panic!("no idempotency-key header; status {}", resp.status));
    let hex = key
        .strip_prefix("derived-")
        .unwrap_or_else(|| panic!("not a derived key: {key}"));
    assert_eq!(hex.len(), 64, "SHA-256 hex: {key}");
    assert!(
        hex.chars().all(|c| c.is_ascii_hexdigit()),
        "SHA-256 hex: {key}"
    );
    key.to_owned()
}

/// A derive route without `derive_from` on a manual clock.
async fn derive_by_fingerprint(route_extra: &str) -> (TestGateway, std::sync::Arc<ManualClock>) {
    let clock = ManualClock::new();
    let route = format!("key = \"derive\"\nderive_window = \"10m\"\n{route_extra}");
    let gw = spawn_gateway_with(Setup::route(&route).clock(clock.clone())).await;
    (gw, clock)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_event_id_is_one_operation_with_its_derived_key() {
    let gw = spawn_gateway(DERIVE_FROM_EVENT).await;

    let first = write(gw.addr(), "/events", None, EVENT).await;
    assert_fresh_created(&first);
    let key = derived_key(&first);
    assert_eq!(
        gw.upstream.requests()[0].header("idempotency-key"),
        Some(key.as_str()),
        "the upstream gets the derived key"
    );

    let reserialised = r#"{ "title": "from the CRM", "event_id": "evt-1" }"#;
    let retry = write(gw.addr(), "/events", None, reserialised).await;
    assert_replay_of(&retry, &first);
    assert_eq!(derived_key(&retry), key, "a replay announces the key too");

    // The client may also retry with the key it learned.
    let keyed = write(gw.addr(), "/events", Some(&key), EVENT).await;
    assert_replay_of(&keyed, &first);
    assert_eq!(gw.upstream.writes(), 1);

    // Another event, or the same event in another scope, is another operation.
    let other_event = write(gw.addr(), "/events", None, r#"{"event_id":"evt-2"}"#).await;
    assert_fresh_created(&other_event);
    assert_ne!(derived_key(&other_event), key);
    let other_scope = write_as(gw.addr(), "/events", None, Some(BOB), EVENT).await;
    assert_fresh_created(&other_scope);
    assert_ne!(derived_key(&other_scope), key);
    assert_eq!(gw.upstream.writes(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_event_id_with_a_changed_body_is_key_reused() {
    let gw = spawn_gateway(DERIVE_FROM_EVENT).await;
    let first = write(gw.addr(), "/events", None, EVENT).await;
    assert_fresh_created(&first);

    let changed = write(
        gw.addr(),
        "/events",
        None,
        r#"{"event_id":"evt-1","title":"edited in the CRM"}"#,
    )
    .await;

    changed.assert_operation_problem(422, "key-reused", "completed");
    assert_eq!(derived_key(&changed), derived_key(&first));
    assert_eq!(gw.upstream.writes(), 1, "nothing sent");
    assert_eq!(gw.upstream.requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_lacking_the_derive_field_is_missing_key() {
    let gw = spawn_gateway(DERIVE_FROM_EVENT).await;

    for body in [
        r#"{"title":"no event id"}"#,
        r#"{"event_id":null,"title":"null event id"}"#,
        "event_id=evt-1",
    ] {
        let resp = write(gw.addr(), "/events", None, body).await;
        resp.assert_problem(400, "missing-key");
        assert!(
            resp.header("idempotency-key").is_none(),
            "no key was derived from {body}"
        );
    }
    assert!(gw.upstream.requests().is_empty(), "nothing sent upstream");
}

/// A body that parses as JSON but says it is not (`text/plain`, a form)
/// had a key derived from its fields, while the fingerprint compared it
/// byte for byte; the docs call it "not JSON", 400 `missing-key`. It is,
/// and the problem names the fields the key is derived from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_whose_media_type_is_not_json_derives_no_key() {
    let gw = spawn_gateway(DERIVE_FROM_EVENT).await;
    for media_type in ["text/plain", "application/x-www-form-urlencoded"] {
        let headers = [("content-type", media_type), ("authorization", ALICE)];
        let resp = send(gw.addr(), "POST", "/events", &headers, EVENT).await;
        let problem = resp.assert_problem(400, "missing-key");
        assert!(resp.header("idempotency-key").is_none(), "{media_type}");
        let detail = problem["detail"].as_str().unwrap_or_default();
        assert!(
            detail.contains("/event_id") && detail.contains("Content-Type"),
            "{detail}"
        );
    }
    let lacking = write(gw.addr(), "/events", None, r#"{"title":"none"}"#).await;
    let problem = lacking.assert_problem(400, "missing-key");
    let detail = problem["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("/event_id"), "{detail}");
    assert!(gw.upstream.requests().is_empty(), "nothing sent upstream");
}

/// A keyless retry whose body carries a number a double cannot hold (a
/// 64-bit id, hashed as sent) and a timestamp the route ignores is one
/// operation: the ignored field is masked, not counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ignored_field_beside_a_64_bit_id_is_still_ignored() {
    let (gw, _clock) = derive_by_fingerprint("ignore_fields = [\"/sent_at\"]").await;
    let order =
        |sent_at: u32| format!(r#"{{"account":1234567890123456789,"qty":3,"sent_at":{sent_at}}}"#);
    let first = write(gw.addr(), "/orders", None, &order(1)).await;
    assert_eq!(assert_fresh_created(&first), 1);
    let retry = write(gw.addr(), "/orders", None, &order(2)).await;
    assert_replay_of(&retry, &first);
    assert_eq!(derived_key(&retry), derived_key(&first));
    let other = r#"{"account":1234567890123456788,"qty":3,"sent_at":2}"#;
    assert_fresh_created(&write(gw.addr(), "/orders", None, other).await);
    assert_eq!(gw.upstream.writes(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_requests_are_one_operation_within_the_derive_window() {
    let (gw, clock) = derive_by_fingerprint("").await;

    let first = write(gw.addr(), "/orders", None, ORDER).await;
    assert_eq!(assert_fresh_created(&first), 1);
    let key = derived_key(&first);
    let retry = write(gw.addr(), "/orders", None, ORDER).await;
    assert_replay_of(&retry, &first);

    // Replays do not refresh the window: it counts from the last update.
    clock.advance(DERIVE_WINDOW - Duration::from_secs(60));
    let late_retry = write(gw.addr(), "/orders", None, ORDER).await;
    assert_replay_of(&late_retry, &first);
    assert_eq!(gw.upstream.writes(), 1);

    clock.advance(Duration::from_secs(120));
    let next_day = write(gw.addr(), "/orders", None, ORDER).await;
    assert_eq!(
        assert_fresh_created(&next_day),
        2,
        "past the window an identical request is a new write"
    );
    assert_eq!(
        derived_key(&next_day),
        key,
        "the new operation takes the key"
    );
    let retry_of_new = write(gw.addr(), "/orders", None, ORDER).await;
    assert_replay_of(&retry_of_new, &next_day);
    assert_eq!(gw.upstream.writes(), 2);

    // A different request is another operation at any time.
    let other = write(gw.addr(), "/orders", None, r#"{"sku":"pear","qty":1}"#).await;
    assert_fresh_created(&other);
    assert_ne!(derived_key(&other), key);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_and_in_progress_derived_operations_match_after_the_window() {
    let (gw, clock) = derive_by_fingerprint("upstream_timeout = \"700ms\"").await;

    // In progress while the window passes: still the same operation.
    let addr = gw.addr();
    let slow = tokio::spawn(async move { write(addr, "/slow?ms=400", None, ORDER).await });
    gw.upstream.wait_for_requests(1).await;
    clock.advance(DERIVE_WINDOW + Duration::from_secs(60));
    let during = write(gw.addr(), "/slow?ms=400", None, ORDER).await;
    during.assert_operation_problem(409, "request-in-progress", "in_progress");
    assert_fresh_created(&slow.await.expect("client task"));
    assert_eq!(gw.upstream.writes(), 1);

    // Unknown (timed out after the upstream committed): never superseded.
    let held = write(gw.addr(), "/hold", None, ORDER).await;
    held.assert_operation_problem(504, "outcome-unknown", "unknown");
    let key = derived_key(&held);
    clock.advance(DERIVE_WINDOW + Duration::from_secs(60));
    let retry = write(gw.addr(), "/hold", None, ORDER).await;
    assert_held_unknown(&retry);
    assert_eq!(derived_key(&retry), key);
    assert_eq!(gw.upstream.writes(), 2, "the unknown write was not re-sent");
    assert_eq!(gw.upstream.write_requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_duplicates_get_the_first_ones_response() {
    let gw = spawn_gateway(r#"in_progress = "wait""#).await;

    let responses = concurrent_writes(gw.addr(), 4, "/slow?ms=400", "wait-1", ORDER).await;

    let original = assert_one_fresh_rest_replayed(&responses);
    assert_eq!(gw.upstream.writes(), 1, "exactly one upstream write");
    assert_eq!(gw.upstream.requests().len(), 1);
    let after = write(gw.addr(), "/slow?ms=400", Some("wait-1"), ORDER).await;
    assert_replay_of(&after, original);
}

/// The store's write calls (claims, records, other writes) so far.
async fn store_calls(gw: &TestGateway) -> f64 {
    let text = scrape_metrics(gw.admin_addr()).await;
    metric(&text, r#"idemgate_store_batch_calls_sum{batch="write"}"#).unwrap_or(0.0)
}

/// A write its duplicates waited on is in the replay cache once recorded:
/// the waiters and the next retry are answered without a store call. A
/// write nobody repeated is not cached: its first retry asks the store (a
/// claim that finds it), and the retry after that is answered from the
/// cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replay_cache_holds_what_was_asked_for_again() {
    let gw = spawn_gateway_with(Setup::route(r#"in_progress = "wait""#).admin()).await;
    let before = store_calls(&gw).await;
    let calls = || async { store_calls(&gw).await - before };

    let responses = concurrent_writes(gw.addr(), 4, "/slow?ms=400", "waited", ORDER).await;
    let original = assert_one_fresh_rest_replayed(&responses);
    let after = write(gw.addr(), "/slow?ms=400", Some("waited"), ORDER).await;
    assert_replay_of(&after, original);
    assert_eq!(calls().await, 2.0, "one claim, one record");

    let alone = write(gw.addr(), "/orders", Some("alone"), ORDER).await;
    assert_fresh_created(&alone);
    assert_eq!(calls().await, 4.0);
    let retry = || write(gw.addr(), "/orders", Some("alone"), ORDER);
    assert_replay_of(&retry().await, &alone);
    assert_eq!(calls().await, 5.0, "the first retry's claim");
    assert_replay_of(&retry().await, &alone);
    assert_eq!(calls().await, 5.0, "the next one from the cache");
    assert_eq!(gw.upstream.writes(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_gets_409_when_wait_timeout_runs_out() {
    let gw = spawn_gateway("in_progress = \"wait\"\nwait_timeout = \"300ms\"").await;
    let addr = gw.addr();
    // The first write's answer is held until the waiter has its own.
    gw.upstream.script(Scripted::Hold);
    let first = tokio::spawn(async move { write(addr, "/scripted", Some("wait-2"), ORDER).await });
    gw.upstream.wait_for_requests(1).await;

    let started = Instant::now();
    let waiter = write(gw.addr(), "/scripted", Some("wait-2"), ORDER).await;
    let waited = started.elapsed();

    // Refused while the first write is still held: at its wait_timeout.
    waiter.assert_operation_problem(409, "request-in-progress", "in_progress");
    assert!(
        waited >= Duration::from_millis(250),
        "the duplicate was refused after {waited:?}: it did not wait"
    );
    assert!(!first.is_finished(), "the first write was answered");
    gw.upstream.release_one();
    let original = first.await.expect("client task");
    assert_fresh_created(&original);
    gw.assert_retry_replays(("/scripted", "wait-2", ORDER), &original, 1)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_first_attempt_answers_its_waiters_with_the_same_429() {
    let gw = spawn_gateway_with(Setup::route(r#"in_progress = "wait""#).admin()).await;
    let path = "/once/429?ms=500";
    let addr = gw.addr();
    let first = tokio::spawn(async move { write(addr, path, Some("wait-3"), ORDER).await });
    gw.upstream.wait_for_requests(1).await;

    let waiters = concurrent_writes(gw.addr(), 3, path, "wait-3", ORDER).await;
    let first = first.await.expect("client task");

    for resp in waiters.iter().chain([&first]) {
        assert_eq!(resp.status, StatusCode::TOO_MANY_REQUESTS, "passed through");
        assert!(!resp.is_replay());
        assert_eq!(resp.json()["upstream_status"], 429);
        assert_eq!(resp.header("retry-after"), Some("1"));
    }
    assert_eq!(
        gw.upstream.write_requests().len(),
        1,
        "the waiters sent nothing"
    );
    assert_eq!(gw.operation("wait-3").await["attempts"], 1);

    // The client's next retry is the next attempt, and then replays.
    let next = write(gw.addr(), path, Some("wait-3"), ORDER).await;
    assert_fresh_created(&next);
    assert_eq!(gw.operation("wait-3").await["attempts"], 2);
    let after = write(gw.addr(), path, Some("wait-3"), ORDER).await;
    assert_replay_of(&after, &next);
    assert_eq!(gw.upstream.writes(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_in_reject_mode_is_refused_at_once() {
    let gw = spawn_gateway("").await;
    let addr = gw.addr();
    // The first write's answer is held until the duplicate has its own.
    gw.upstream.script(Scripted::Hold);
    let first = tokio::spawn(async move { write(addr, "/scripted", Some("rej-1"), ORDER).await });
    gw.upstream.wait_for_requests(1).await;

    let duplicate = write(gw.addr(), "/scripted", Some("rej-1"), ORDER).await;

    duplicate.assert_operation_problem(409, "request-in-progress", "in_progress");
    assert!(duplicate.header("retry-after").is_some(), "Retry-After");
    assert!(
        !first.is_finished(),
        "reject mode answered only once the first write was"
    );
    gw.upstream.release_one();
    let original = first.await.expect("client task");
    assert_fresh_created(&original);
    assert_eq!(gw.upstream.writes(), 1, "never a second write");
    assert_eq!(gw.upstream.requests().len(), 1);
}
