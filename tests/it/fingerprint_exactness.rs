//! Two different JSON payloads are never one operation. A JSON body is
//! canonicalised only when it is I-JSON whose every number is written exactly
//! as the canonical form writes it; a big integer that binary64 cannot hold
//! (9007199254740993, a 20-digit id) or a body with duplicate member names is
//! fingerprinted as sent, so reusing its key with any other body is 422
//! `key-reused`, and the identical body is still a replay.

use crate::common::*;

/// Sends `first` then `second` with one key: the first is written, the
/// second refused as a reused key, and the first sent again is replayed.
async fn assert_not_merged(first: &str, second: &str) {
    let gw = spawn_gateway("").await;

    let created = write(gw.addr(), "/accounts", Some("k-1"), first).await;
    assert_fresh_created(&created);
    let changed = write(gw.addr(), "/accounts", Some("k-1"), second).await;
    changed.assert_operation_problem(422, "key-reused", "completed");
    let again = write(gw.addr(), "/accounts", Some("k-1"), first).await;
    assert_replay_of(&again, &created);

    assert_eq!(gw.upstream.writes(), 1, "{first} then {second}");
    assert_eq!(gw.upstream.requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn integers_one_double_apart_are_different_payloads() {
    // 2^53 + 1 rounds to 2^53 as a double.
    assert_not_merged(
        r#"{"account": 9007199254740993}"#,
        r#"{"account": 9007199254740992}"#,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_digit_ids_are_different_payloads() {
    assert_not_merged(
        r#"{"account": 12345678901234567890}"#,
        r#"{"account": 12345678901234567891}"#,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_member_is_a_different_payload() {
    // An upstream that keeps the first member reads `"a": 1`.
    assert_not_merged(r#"{"a": 1, "a": 2}"#, r#"{"a": 2}"#).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn derive_from_a_twenty_digit_id_keeps_ids_apart() {
    let gw = spawn_gateway("key = \"derive\"\nderive_from = [\"/event_id\"]").await;

    let mut responses = Vec::new();
    for id in [
        "12345678901234567890",
        "12345678901234567891",
        "12345678901234567890",
    ] {
        let body = format!(r#"{{"event_id":{id}}}"#);
        responses.push(write(gw.addr(), "/events", None, &body).await);
    }
    let [first, other, again] = &responses[..] else {
        unreachable!("three writes")
    };

    assert_fresh_created(first);
    assert_fresh_created(other);
    assert_ne!(
        first.header("idempotency-key"),
        other.header("idempotency-key")
    );
    assert_replay_of(again, first);
    assert_eq!(gw.upstream.writes(), 2);
}

/// A retry sent byte for byte is answered from the replay cache before its
/// JSON is parsed. The same bytes under another `Content-Type` are another
/// request (hashed raw, not as JSON): 422, never the JSON request's replay,
/// even on a route whose fingerprint headers leave `Content-Type` out;
/// another spelling of the same JSON is still its replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_bytes_under_another_media_type_are_another_request() {
    let gw = spawn_gateway("fingerprint_headers = []").await;
    let body = r#"{"account":"acc-1","amount":5}"#;
    let as_media_type = |media_type: &'static str, body: &'static str| {
        let addr = gw.addr();
        async move {
            let headers = [
                ("content-type", media_type),
                ("idempotency-key", "k-1"),
                ("authorization", ALICE),
            ];
            send(addr, "POST", "/accounts", &headers, body).await
        }
    };

    let created = as_media_type("application/json", body).await;
    assert_fresh_created(&created);
    assert_replay_of(&as_media_type("application/json", body).await, &created);
    as_media_type("text/plain", body)
        .await
        .assert_operation_problem(422, "key-reused", "completed");
    let respelled = r#"{ "amount": 5, "account": "acc-1" }"#;
    assert_replay_of(
        &as_media_type("application/json", respelled).await,
        &created,
    );

    assert_eq!(gw.upstream.requests().len(), 1);
}

/// A retry whose `Content-Type` spells the same media type otherwise (in
/// another case, with `charset=utf-8` on JSON, which has no other) was a
/// "different request", 422 `key-reused`, and a client minting a new key
/// for it would send the write twice. Media types compare as RFC 9110
/// says; another charset or another type is still another request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_spelling_its_media_type_otherwise_is_the_same_request() {
    let gw = spawn_gateway("").await;
    let body = r#"{"sku":"a-1"}"#;
    let with = |content_type: &'static str| {
        [
            ("content-type", content_type),
            ("idempotency-key", "k-media"),
            ("authorization", ALICE),
        ]
    };
    let created = send(
        gw.addr(),
        "POST",
        "/orders",
        &with("application/json"),
        body,
    )
    .await;
    assert_fresh_created(&created);
    for same in [
        "application/json; charset=utf-8",
        "Application/JSON",
        "application/json;charset=\"UTF-8\"",
    ] {
        let retried = send(gw.addr(), "POST", "/orders", &with(same), body).await;
        assert_replay_of(&retried, &created);
    }
    for other in ["application/json; charset=utf-16", "text/plain"] {
        let refused = send(gw.addr(), "POST", "/orders", &with(other), body).await;
        refused.assert_operation_problem(422, "key-reused", "completed");
    }
    assert_eq!(gw.upstream.writes(), 1);
}
