//! A `ucp` route (docs/profiles.md, `ucp`) as the official UCP conformance
//! suite's idempotency tests use a business: its three conflict cases —
//! a create, an update (PUT) and a complete whose key comes back with a
//! changed body — are 409 `key_reused` with nothing sent, after the
//! unchanged duplicate was replayed; each with the headers UCP platforms
//! send (`UCP-Agent`, `Request-Id`, a signature, no `Authorization`), and
//! the destination counting exactly one write per key.
//!
//! Beside them: a body compared byte for byte (the same values
//! re-serialised are a changed body), a retry with a new `Request-Id` and
//! signature replayed, the key and the body forwarded as signed, and keys
//! that are per platform (`UCP-Agent`) and per operation (the path).

use crate::common::*;

const UCP: &str = "profile = \"ucp\"";
const PLATFORM: &str = "profile=\"https://platform.example/.well-known/ucp\"";

/// A UCP platform's request headers, as the conformance suite sends them:
/// its profile, a signature, the key and a request id.
fn platform_headers<'a>(key: &'a str, request_id: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("content-type", "application/json"),
        ("ucp-agent", PLATFORM),
        ("request-signature", "test"),
        ("idempotency-key", key),
        ("request-id", request_id),
    ]
}

async fn ucp_write(gw: &TestGateway, method: &str, path: &str, key: &str, body: &str) -> Response {
    send(
        gw.addr(),
        method,
        path,
        &platform_headers(key, "5b0d7f1e-6c1a-4f7e-9a51-2d5f0c1b7a10"),
        body.to_owned(),
    )
    .await
}

/// One of the conformance suite's conflict cases: `body` under `key`, the
/// same again (replayed: its status and body), then `changed` under the
/// same key: 409 `key_reused`, and the destination wrote once.
async fn conflict_case(
    gw: &TestGateway,
    method: &str,
    path: &str,
    (key, body, changed): (&str, &str, &str),
) -> Response {
    let before = gw.upstream.writes();
    let first = ucp_write(gw, method, path, key, body).await;
    assert!(first.status.is_success(), "{}", first.status);
    let duplicate = ucp_write(gw, method, path, key, body).await;
    assert_eq!(duplicate.status, first.status);
    assert_eq!(duplicate.json(), first.json(), "the duplicate is a replay");
    let conflict = ucp_write(gw, method, path, key, changed).await;
    assert_eq!(
        conflict.status,
        409,
        "{}",
        String::from_utf8_lossy(&conflict.body)
    );
    assert_eq!(conflict.header("content-type"), Some("application/json"));
    let error = conflict.json();
    assert_eq!(error["code"], "key_reused", "{error}");
    assert!(
        error["content"]
            .as_str()
            .is_some_and(|c| c.contains("Idempotency-Key")),
        "{error}"
    );
    assert_eq!(
        gw.upstream.writes() - before,
        1,
        "one write at the destination"
    );
    first
}

const CREATE: &str =
    r#"{"currency":"USD","line_items":[{"item":{"id":"bouquet_roses"},"quantity":1}]}"#;

/// A checkout created through the gateway: its id.
async fn created_checkout(gw: &TestGateway) -> u64 {
    let created = ucp_write(gw, "POST", "/checkout-sessions", &new_key(), CREATE).await;
    assert_fresh_created(&created)
}

fn new_key() -> String {
    uuid::Uuid::now_v7().to_string()
}

#[tokio::test]
async fn a_create_whose_key_comes_back_with_another_body_is_409() {
    let gw = spawn_gateway(UCP).await;
    let other_currency = CREATE.replace("USD", "EUR");
    conflict_case(
        &gw,
        "POST",
        "/checkout-sessions",
        (&new_key(), CREATE, &other_currency),
    )
    .await;
}

#[tokio::test]
async fn an_update_whose_key_comes_back_with_another_body_is_409() {
    let gw = spawn_gateway(UCP).await;
    let id = created_checkout(&gw).await;
    let update = |quantity: u8| {
        format!(
            r#"{{"id":"{id}","currency":"USD","line_items":[{{"id":"li_1","item":{{"id":"bouquet_roses"}},"quantity":{quantity}}}]}}"#
        )
    };
    let path = format!("/checkout-sessions/{id}");
    conflict_case(&gw, "PUT", &path, (&new_key(), &update(2), &update(3))).await;
    // Protected as a write: the destination saw one PUT, not two.
    let puts = gw.upstream.write_requests();
    assert_eq!(puts.iter().filter(|r| r.method == "PUT").count(), 1);
}

#[tokio::test]
async fn a_complete_whose_key_comes_back_with_another_body_is_409() {
    let gw = spawn_gateway(UCP).await;
    let id = created_checkout(&gw).await;
    let payment = |token: &str| {
        format!(
            r#"{{"payment_data":{{"id":"instr_1","handler_id":"mock_payment_handler","type":"card","credential":{{"type":"token","token":"{token}"}}}},"risk_signals":{{}}}}"#
        )
    };
    let path = format!("/checkout-sessions/{id}/complete");
    let (success, different) = (payment("success_token"), payment("different_token"));
    conflict_case(&gw, "POST", &path, (&new_key(), &success, &different)).await;
}

/// UCP matches payloads by the SHA-256 of the raw body: the same values
/// in another order are another body (an `idemgate` route replays them).
#[tokio::test]
async fn the_same_values_reserialised_are_another_body() {
    let reordered =
        r#"{"line_items":[{"item":{"id":"bouquet_roses"},"quantity":1}],"currency":"USD"}"#;
    let gw = spawn_gateway(UCP).await;
    let key = new_key();
    assert_fresh_created(&ucp_write(&gw, "POST", "/checkout-sessions", &key, CREATE).await);
    let again = ucp_write(&gw, "POST", "/checkout-sessions", &key, reordered).await;
    assert_eq!(again.status, 409);
    assert_eq!(again.json()["code"], "key_reused");
    assert_eq!(gw.upstream.writes(), 1);

    let idemgate = spawn_gateway("scope_headers = [\"ucp-agent\"]").await;
    assert_fresh_created(&ucp_write(&idemgate, "POST", "/checkout-sessions", &key, CREATE).await);
    let again = ucp_write(&idemgate, "POST", "/checkout-sessions", &key, reordered).await;
    assert!(again.is_replay(), "{}", again.status);
}

/// A retry that carries a new `Request-Id` and a new signature is the same
/// request; the destination gets the key, the signature and the body as
/// the platform sent them.
#[tokio::test]
async fn a_retry_with_a_new_request_id_and_signature_is_replayed() {
    let gw = spawn_gateway(UCP).await;
    let key = new_key();
    let signed = |request_id, signature| {
        let mut headers = platform_headers(&key, request_id);
        headers.push(("signature", signature));
        headers
    };
    let path = "/checkout-sessions";
    let first = send(
        gw.addr(),
        "POST",
        path,
        &signed("r-1", "sig1=:AAAA:"),
        CREATE,
    )
    .await;
    assert_fresh_created(&first);
    let retry = send(
        gw.addr(),
        "POST",
        path,
        &signed("r-2", "sig1=:BBBB:"),
        CREATE,
    )
    .await;
    assert_replay_of(&retry, &first);
    let received = gw.upstream.write_requests();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].body, CREATE.as_bytes(), "the body as signed");
    assert_eq!(received[0].header("idempotency-key"), Some(key.as_str()));
    assert_eq!(received[0].header("signature"), Some("sig1=:AAAA:"));
    assert_eq!(received[0].header("ucp-agent"), Some(PLATFORM));
}

/// A platform's keys are unique per operation type (UCP signatures.md):
/// one key on two endpoints, or from two platforms, is two writes. A
/// write without a key is refused in UCP's error shape, nothing sent.
#[tokio::test]
async fn keys_are_per_platform_and_per_operation() {
    let gw = spawn_gateway(UCP).await;
    let key = new_key();
    let cancel = ucp_write(&gw, "POST", "/checkout-sessions/7/cancel", &key, "").await;
    let complete = ucp_write(&gw, "POST", "/checkout-sessions/7/complete", &key, "").await;
    assert_fresh_created(&cancel);
    assert_fresh_created(&complete);
    let mut other = platform_headers(&key, "r-3");
    other[1] = (
        "ucp-agent",
        "profile=\"https://other.example/.well-known/ucp\"",
    );
    let theirs = send(gw.addr(), "POST", "/checkout-sessions/7/cancel", &other, "").await;
    assert_fresh_created(&theirs);
    assert_eq!(gw.upstream.writes(), 3);

    let keyless = send(
        gw.addr(),
        "POST",
        "/checkout-sessions",
        &[
            ("content-type", "application/json"),
            ("ucp-agent", PLATFORM),
        ],
        CREATE,
    )
    .await;
    assert_eq!(keyless.status, 400);
    assert_eq!(keyless.json()["code"], "missing_key");
    assert_eq!(gw.upstream.writes(), 3, "nothing sent");
}
