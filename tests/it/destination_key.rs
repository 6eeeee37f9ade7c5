//! A destination key (docs/requests.md, "A destination key"): the
//! operation's id sent with every attempt in `destination_key_header`, in
//! the client key's place when both name one header; with
//! `resend_unknown`, a lost response is sent again under that key and the
//! destination's answer settles it — never past `destination_key_window`,
//! never while the route is paused; a probe asks by `{destination_key}`,
//! the key the destination got, and finds the write.

use crate::common::*;

const BODY: &str = r#"{"task":"write the report"}"#;

/// The destination key each write the upstream received carried in `header`.
fn sent_keys(gw: &TestGateway, header: &str) -> Vec<Option<String>> {
    gw.upstream
        .write_requests()
        .iter()
        .map(|r| {
            r.headers
                .get(header)
                .map(|v| v.to_str().unwrap().to_string())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_attempt_carries_the_operations_id_in_the_clients_keys_place() {
    let gw =
        spawn_gateway_with(Setup::route("destination_key_header = \"Idempotency-Key\"").admin())
            .await;
    // The first attempt is refused uncommitted (503: released), the next
    // one, the same operation, commits.
    let refused = write(gw.addr(), "/once/503", Some("client-key"), BODY).await;
    assert_eq!(refused.status, 503, "{refused:?}");
    assert_fresh_created(&write(gw.addr(), "/once/503", Some("client-key"), BODY).await);
    let operation = gw.operation("client-key").await;
    let id = operation["id"].as_str().unwrap().to_string();
    assert_eq!(
        operation["destination_key"],
        serde_json::json!({ "header": "idempotency-key", "value": id }),
        "operators see it"
    );
    assert_eq!(
        sent_keys(&gw, "idempotency-key"),
        [Some(id.clone()), Some(id)],
        "both attempts, one key, never the client's"
    );
    // Another operation, another destination key.
    assert_fresh_created(&write(gw.addr(), "/orders", Some("other-key"), BODY).await);
    let other = gw.operation("other-key").await;
    assert_eq!(
        sent_keys(&gw, "idempotency-key")[2].as_deref(),
        other["id"].as_str()
    );
    assert_ne!(other["id"], operation["id"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_of_its_own_beside_no_client_key() {
    let gw = spawn_gateway_with(
        Setup::route("destination_key_header = \"X-Destination-Key\"\nforward_key_header = \"\"")
            .admin(),
    )
    .await;
    assert_fresh_created(&write(gw.addr(), "/orders", Some("client-key"), BODY).await);
    let id = gw.operation("client-key").await["id"].clone();
    assert_eq!(
        sent_keys(&gw, "x-destination-key"),
        [id.as_str().map(str::to_string)]
    );
    assert_eq!(sent_keys(&gw, "idempotency-key"), [None], "no client key");
}

const RESENDING: &str = "destination_key_header = \"Idempotency-Key\"
destination_key_window = \"24h\"
resend_unknown = true";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_response_is_resent_and_settled_by_a_destination_that_deduplicates() {
    let gw = spawn_gateway_with(Setup::route(RESENDING).admin()).await;
    write(gw.addr(), "/dedup-lost", Some("k"), BODY)
        .await
        .assert_operation_problem(502, "outcome-unknown", "unknown");
    let settled = eventually("the re-send to settle the operation", || async {
        let operation = gw.operation("k").await;
        (operation["state"] == "completed").then_some(operation)
    })
    .await;
    assert_eq!(settled["evidence"], "resent");
    // Each try is on the timeline before it is sent, and with its answer.
    let resends = events_of(&settled, "resend");
    assert_eq!(resends.len(), 2, "{settled}");
    assert_eq!(resends[0]["sending"], true, "{settled}");
    assert_eq!(resends[1]["settles"], true, "{settled}");
    assert_eq!(gw.upstream.writes(), 1, "one record at the destination");
    let keys = sent_keys(&gw, "idempotency-key");
    assert_eq!(keys.len(), 2, "the write and its re-send");
    assert_eq!(keys[0], keys[1], "under one destination key");
    // Retries get what the destination answered the re-send: its record.
    let retry = write(gw.addr(), "/dedup-lost", Some("k"), BODY).await;
    assert_eq!(
        (retry.status.as_u16(), &retry.json()["id"]),
        (201, &serde_json::json!(1))
    );
    assert_eq!(gw.upstream.write_requests().len(), 2, "nothing more sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_resent_past_the_destination_keys_window() {
    // A try could end 30 s on (upstream_timeout): past a 1 s window.
    let setup = RESENDING.replace("\"24h\"", "\"1s\"");
    let gw = spawn_gateway_with(Setup::route(&setup).admin()).await;
    write(gw.addr(), "/dedup-lost", Some("k"), BODY)
        .await
        .assert_operation_problem(502, "outcome-unknown", "unknown");
    let skipped = eventually("the re-send to be skipped", || async {
        let operation = gw.operation("k").await;
        let resends = events_of(&operation, "resend");
        (!resends.is_empty()).then_some((operation, resends))
    })
    .await;
    assert_eq!(
        skipped.1[0]["skipped"], "past the destination key's window",
        "{}",
        skipped.0
    );
    assert_eq!(skipped.0["state"], "unknown", "still held");
    assert_eq!(gw.upstream.write_requests().len(), 1, "never re-sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_resent_while_the_route_is_paused() {
    // The loss itself trips the latch.
    let setup = format!("{RESENDING}\npause_after_unknown = 1");
    let gw = spawn_gateway_with(Setup::route(&setup).admin()).await;
    write(gw.addr(), "/dedup-lost", Some("k"), BODY)
        .await
        .assert_operation_problem(502, "outcome-unknown", "unknown");
    let skipped = eventually("a re-send skipped on the paused route", || async {
        let resends = events_of(&gw.operation("k").await, "resend");
        (!resends.is_empty()).then_some(resends)
    })
    .await;
    assert_eq!(skipped[0]["skipped"], "the route is paused");
    assert_eq!(gw.operation("k").await["state"], "unknown");
    assert_eq!(gw.upstream.write_requests().len(), 1, "never re-sent");
}

/// An operator (or a probe) releases a held write whose first request the
/// destination is in fact still working on: the next attempt, under the
/// same destination key, gets the destination's 409 "in progress". That is
/// no outcome: the operation is held again, never stored `completed` with
/// the 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_attempt_told_in_progress_by_the_destination_is_held_again() {
    let gw = spawn_gateway_with(
        Setup::route("destination_key_header = \"Idempotency-Key\"\nlate_window = \"1ms\"").admin(),
    )
    .await;
    write(gw.addr(), "/dedup-busy", Some("k"), BODY)
        .await
        .assert_operation_problem(502, "outcome-unknown", "unknown");
    let held = gw.operation("k").await;
    let id = held["id"].as_str().unwrap();
    gw.resolved(
        id,
        &serde_json::json!({"outcome": "not_attempted", "operator": "ann"}),
    )
    .await;
    let busy = write(gw.addr(), "/dedup-busy", Some("k"), BODY).await;
    assert_eq!(
        busy.status, 409,
        "the destination's answer, relayed: {busy:?}"
    );
    let operation = gw.operation("k").await;
    assert_eq!(
        (operation["state"].as_str(), operation["attempts"].as_u64()),
        (Some("unknown"), Some(2)),
        "{operation}"
    );
    assert_held_unknown(&write(gw.addr(), "/dedup-busy", Some("k"), BODY).await);
    assert_eq!(gw.upstream.writes(), 1, "one record");
}

/// The destination key takes the client key's place, so the destination
/// files the write under the operation's id: a probe asking by
/// `{destination_key}` finds the write whose response was lost, and the
/// retry is replayed. The route also says how the destination tells
/// absence, at once: a probe asking by a key the destination never got
/// would have released the write, and the retry written it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_asks_by_the_destination_key_and_finds_the_write() {
    let upstream = FakeUpstream::start().await;
    let route = format!(
        "destination_key_header = \"Idempotency-Key\"\nlate_window = \"1ms\"\n\
         [routes.reconcile]\nurl = \"{}/lookup?key={{destination_key}}\"\n\
         found_json_pointer = \"/id\"\nabsent_status = 404\nmin_age = \"1ms\"\n",
        upstream.url()
    );
    let gw = spawn_gateway_on(upstream, Setup::route(&route).admin()).await;
    write(gw.addr(), "/drop", Some("client-key"), BODY)
        .await
        .assert_operation_problem(502, "outcome-unknown", "unknown");
    let settled = eventually("the probe to settle the operation", || async {
        let operation = gw.operation("client-key").await;
        (operation["state"] != "unknown").then_some(operation)
    })
    .await;
    assert_eq!(
        (settled["state"].as_str(), settled["evidence"].as_str()),
        (Some("completed"), Some("reconciled")),
        "{settled}"
    );
    let id = settled["id"].as_str().unwrap();
    let probes = events_of(&settled, "probe");
    assert!(
        probes[0]["url"]
            .as_str()
            .is_some_and(|url| url.ends_with(&format!("/lookup?key={id}"))),
        "asked by the operation's id: {probes:?}"
    );
    let retry = write(gw.addr(), "/drop", Some("client-key"), BODY).await;
    assert!(retry.is_replay(), "{retry:?}");
    assert_eq!(retry.json()["id"], 1, "the probe's answer: the one record");
    assert_eq!(gw.upstream.writes(), 1, "one write at the destination");
}
