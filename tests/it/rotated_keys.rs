//! A retry that mints a new key (`rotated_keys`, docs/requests.md "A
//! rotated key"): with `hold`, while an operation is `in_progress` or
//! `unknown`, an identical write (same route, scope and fingerprint)
//! under another key is 409 `possible-duplicate` naming it, nothing sent;
//! once it completed, another key is a new write — a key the gateway
//! derives or assigns a keyless retry too. Off (an HTTP route's default),
//! another key is always a new write.

use crate::common::*;

const BODY: &str = r#"{"task":"write the report"}"#;

/// Asserts `resp` is the refusal naming `first`'s operation in `state`.
fn assert_names(resp: &Response, first: &serde_json::Value, state: &str) {
    let body = resp.assert_operation_problem(409, "possible-duplicate", state);
    assert_eq!(body["operation_id"], first["id"], "names the first: {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_key_while_the_first_is_unknown_is_not_sent() {
    let gw = spawn_gateway_with(Setup::route("rotated_keys = \"hold\"").admin()).await;
    write(gw.addr(), "/drop", Some("first"), BODY)
        .await
        .assert_operation_problem(502, "outcome-unknown", "unknown");
    let first = gw.operation("first").await;
    for key in ["second", "third", "second"] {
        assert_names(
            &write(gw.addr(), "/drop", Some(key), BODY).await,
            &first,
            "unknown",
        );
    }
    assert_eq!(gw.upstream.writes(), 1, "nothing sent under the new keys");
    // Another body, another path or the first key are not twins.
    let other = write(gw.addr(), "/drop", Some("other"), r#"{"task":"another"}"#).await;
    other.assert_operation_problem(502, "outcome-unknown", "unknown");
    assert_held_unknown(&write(gw.addr(), "/drop", Some("first"), BODY).await);
    assert_fresh_created(&write(gw.addr(), "/orders", Some("elsewhere"), BODY).await);
    assert_eq!(gw.upstream.writes(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_key_while_the_first_runs_waits_for_it_then_is_sent() {
    let gw = spawn_gateway_with(Setup::route("rotated_keys = \"hold\"").admin()).await;
    gw.upstream.script(Scripted::Hold);
    let addr = gw.addr();
    let running = tokio::spawn(async move { write(addr, "/scripted", Some("first"), BODY).await });
    gw.upstream.wait_for_writes(1).await;
    let first = gw.operation("first").await;
    assert_eq!(first["state"], "in_progress");
    assert_names(
        &write(gw.addr(), "/scripted", Some("second"), BODY).await,
        &first,
        "in_progress",
    );
    gw.upstream.release_one();
    assert_fresh_created(&running.await.expect("first write"));
    // Completed: a new key is a new write, as the caller may mean it.
    gw.upstream.script(Scripted::Create);
    assert_fresh_created(&write(gw.addr(), "/scripted", Some("second"), BODY).await);
    assert_eq!(gw.upstream.writes(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn off_an_http_route_sends_a_rotated_key_as_a_new_write() {
    let gw = spawn_gateway_with(Setup::route("").admin()).await;
    write(gw.addr(), "/drop", Some("first"), BODY)
        .await
        .assert_operation_problem(502, "outcome-unknown", "unknown");
    write(gw.addr(), "/drop", Some("second"), BODY)
        .await
        .assert_operation_problem(502, "outcome-unknown", "unknown");
    assert_eq!(gw.upstream.writes(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyless_retry_is_a_rotated_key_whether_derived_or_assigned() {
    for mode in ["derive", "assign"] {
        let route = format!("key = \"{mode}\"\nrotated_keys = \"hold\"");
        let gw = spawn_gateway_with(Setup::route(&route).admin()).await;
        write(gw.addr(), "/drop", Some("first"), BODY)
            .await
            .assert_operation_problem(502, "outcome-unknown", "unknown");
        let first = gw.operation("first").await;
        // The client dropped its key on the retry: the gateway's key for
        // it is another key of the same write.
        let keyless = write(gw.addr(), "/drop", None, BODY).await;
        assert_names(&keyless, &first, "unknown");
        let detail = keyless.json()["detail"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            detail.contains("retry with that request's key"),
            "{mode}: {detail}"
        );
        assert_eq!(
            gw.upstream.writes(),
            1,
            "{mode}: nothing sent for the retry"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_key_of_a_keyless_write_is_told_to_send_none() {
    let gw =
        spawn_gateway_with(Setup::route("key = \"derive\"\nrotated_keys = \"hold\"").admin()).await;
    let lost = write(gw.addr(), "/drop", None, BODY).await;
    let first = lost.assert_operation_problem(502, "outcome-unknown", "unknown");
    let keyed = write(gw.addr(), "/drop", Some("second"), BODY).await;
    let refused = keyed.assert_operation_problem(409, "possible-duplicate", "unknown");
    assert_eq!(refused["operation_id"], first["operation_id"]);
    let detail = refused["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("sent without a key: retry without one"),
        "{detail}"
    );
    // Without one, the retry finds the first: held.
    assert_held_unknown(&write(gw.addr(), "/drop", None, BODY).await);
    assert_eq!(gw.upstream.writes(), 1);
}
