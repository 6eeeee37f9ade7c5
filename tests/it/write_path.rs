//! The write path end to end: a keyed write is forwarded exactly once, its
//! retries are replayed byte for byte, the same payload re-serialised is the
//! same operation, a changed payload is refused, reads are plain proxying,
//! concurrent duplicates and a client hanging up never cause a second write,
//! and the forwarded request is rewritten as a proxy should.

use crate::common::*;
use bytes::Bytes;
use http::StatusCode;
use tokio::io::AsyncWriteExt;

const ORDER: &str = r#"{"sku":"apple","qty":3,"tags":["red","fresh"]}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_write_is_forwarded_once() {
    let gw = spawn_gateway("").await;

    let resp = write(gw.addr(), "/orders", Some("order-1"), ORDER).await;

    assert_fresh_created(&resp);
    assert_eq!(resp.json()["received"]["sku"], "apple");
    assert_eq!(gw.upstream.writes(), 1);
    let sent = gw.upstream.requests();
    assert_eq!(sent.len(), 1, "exactly one request upstream");
    assert_eq!(sent[0].method, "POST");
    assert_eq!(sent[0].uri, "/orders");
    assert_eq!(sent[0].body, ORDER.as_bytes(), "body forwarded unchanged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_is_replayed_with_marker_and_identical_bytes() {
    let gw = spawn_gateway("").await;

    let first = write(gw.addr(), "/orders", Some("order-1"), ORDER).await;
    assert_fresh_created(&first);
    let second = write(gw.addr(), "/orders", Some("order-1"), ORDER).await;
    let third = write(gw.addr(), "/orders", Some("order-1"), ORDER).await;

    assert_replay_of(&second, &first);
    assert_replay_of(&third, &first);
    assert_eq!(gw.upstream.writes(), 1, "replays send nothing upstream");
    assert_eq!(gw.upstream.requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserialised_json_is_the_same_operation() {
    let gw = spawn_gateway("").await;
    let reordered =
        "{\n  \"tags\": [ \"red\", \"fresh\" ],\n  \"qty\": 3,\n  \"sku\": \"apple\"\n}";

    let first = write(gw.addr(), "/orders", Some("order-1"), ORDER).await;
    assert_fresh_created(&first);
    let second = write(gw.addr(), "/orders", Some("order-1"), reordered).await;

    assert_replay_of(&second, &first);
    assert_eq!(gw.upstream.writes(), 1);
}

/// `first` with key `order-1` is sent; `second`, the same request
/// written otherwise, is its replay.
async fn assert_one_operation(gw: &TestGateway, first: &str, second: &str) {
    let sent = write(gw.addr(), "/orders", Some("order-1"), first).await;
    assert_fresh_created(&sent);
    let again = write(gw.addr(), "/orders", Some("order-1"), second).await;
    assert_replay_of(&again, &sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equal_json_numbers_and_escapes_are_the_same_operation() {
    // RFC 8785: numbers are compared as ECMAScript formats them, strings
    // after unescaping.
    let gw = spawn_gateway("").await;

    let first = r#"{"qty":100,"sku":"apple"}"#;
    assert_one_operation(&gw, first, r#"{"sku":"\u0061pple","qty":1e2}"#).await;
    assert_eq!(gw.upstream.writes(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_payload_is_key_reused_and_not_sent() {
    let gw = spawn_gateway("").await;

    let first = write(gw.addr(), "/orders", Some("order-1"), ORDER).await;
    assert_fresh_created(&first);
    let changed = ORDER.replace("\"qty\":3", "\"qty\":4");
    let second = write(gw.addr(), "/orders", Some("order-1"), &changed).await;

    second.assert_operation_problem(422, "key-reused", "completed");
    assert!(!second.is_replay());
    assert_eq!(gw.upstream.writes(), 1, "a reused key sends nothing");
    assert_eq!(gw.upstream.requests().len(), 1);

    // Same body to another path is another request, too.
    let other_path = write(gw.addr(), "/refunds", Some("order-1"), ORDER).await;
    other_path.assert_problem(422, "key-reused");
    assert_eq!(gw.upstream.writes(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_is_proxied_untouched_and_not_an_operation() {
    let gw = spawn_gateway("").await;

    // No key, no credentials: a read is plain proxying.
    let first = send(gw.addr(), "GET", "/orders?page=2", &[], Bytes::new()).await;
    let second = send(gw.addr(), "GET", "/orders?page=2", &[], Bytes::new()).await;

    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(second.status, StatusCode::OK);
    assert!(!first.is_replay() && !second.is_replay());
    assert_ne!(
        first.body, second.body,
        "the second GET was answered afresh"
    );
    let sent = gw.upstream.requests();
    assert_eq!(sent.len(), 2, "both GETs reached the upstream");
    assert!(
        sent.iter()
            .all(|r| r.method == "GET" && r.uri == "/orders?page=2")
    );

    // A GET carrying a key records no operation under that key: a write
    // with the key afterwards is a fresh operation, not a reuse or a replay.
    let keyed_get = send(
        gw.addr(),
        "GET",
        "/orders",
        &[("idempotency-key", "shared-key"), ("authorization", ALICE)],
        Bytes::new(),
    )
    .await;
    assert_eq!(keyed_get.status, StatusCode::OK);
    let post = write(gw.addr(), "/orders", Some("shared-key"), ORDER).await;
    assert_fresh_created(&post);
    assert_eq!(gw.upstream.writes(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_reach_upstream_once() {
    const CLIENTS: usize = 24;
    let gw = spawn_gateway("").await;
    let addr = gw.addr();
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(CLIENTS));

    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..CLIENTS {
        let barrier = barrier.clone();
        tasks.spawn(async move {
            barrier.wait().await;
            write(addr, "/slow?ms=300", Some("storm-1"), ORDER).await
        });
    }
    let mut responses = Vec::new();
    while let Some(resp) = tasks.join_next().await {
        responses.push(resp.expect("client task"));
    }

    assert_eq!(gw.upstream.writes(), 1, "exactly one upstream write");
    assert_eq!(gw.upstream.requests().len(), 1);
    let originals: Vec<_> = responses
        .iter()
        .filter(|r| r.status == StatusCode::CREATED && !r.is_replay())
        .collect();
    assert_eq!(originals.len(), 1, "exactly one client got the original");
    let original = originals[0];
    for resp in &responses {
        if std::ptr::eq(resp, original) {
            continue;
        }
        if resp.status == StatusCode::CONFLICT {
            resp.assert_operation_problem(409, "request-in-progress", "in_progress");
            assert!(
                resp.header("retry-after").is_some(),
                "request-in-progress carries Retry-After"
            );
        } else {
            assert_replay_of(resp, original);
        }
    }

    let after = write(addr, "/slow?ms=300", Some("storm-1"), ORDER).await;
    assert_replay_of(&after, original);
    assert_eq!(gw.upstream.writes(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_hanging_up_leaves_operation_settled() {
    let gw = spawn_gateway("").await;
    let head = raw_write_head(
        "/slow?ms=500",
        "application/json",
        "hangup-1",
        &[&format!("content-length: {}", ORDER.len())],
    );

    let mut stream = tokio::net::TcpStream::connect(gw.addr())
        .await
        .expect("connect");
    stream.write_all(head.as_bytes()).await.expect("write head");
    stream
        .write_all(ORDER.as_bytes())
        .await
        .expect("write body");
    gw.upstream.wait_for_writes(1).await;
    drop(stream); // hang up while the upstream is still working

    // Retry until the operation leaves in_progress.
    let retry = eventually("the operation to leave in_progress", || async {
        let resp = write(gw.addr(), "/slow?ms=500", Some("hangup-1"), ORDER).await;
        let in_progress =
            resp.status == StatusCode::CONFLICT && resp.json()["state"] == "in_progress";
        (!in_progress).then_some(resp)
    })
    .await;

    assert_eq!(
        retry.status,
        StatusCode::CREATED,
        "body: {}",
        String::from_utf8_lossy(&retry.body)
    );
    assert!(retry.is_replay(), "the retry is answered from the store");
    assert_eq!(retry.json()["id"], 1);
    assert_eq!(
        gw.upstream.writes(),
        1,
        "the hang-up caused no second write"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_request_is_rewritten_as_a_proxy() {
    let gw = spawn_gateway("").await;
    let head = raw_write_head(
        "/orders?src=test",
        "application/json",
        "\"fwd-1\"",
        &[
            "x-custom: kept",
            "connection: keep-alive, x-hop",
            "x-hop: dropped",
            "keep-alive: timeout=5",
            "te: trailers",
            "expect: 100-continue",
            &format!("content-length: {}", ORDER.len()),
        ],
    );
    let mut request = head.into_bytes();
    request.extend_from_slice(ORDER.as_bytes());

    let resp = raw_exchange(gw.addr(), &request).await.expect("a response");

    assert_eq!(resp.status, 201, "head: {}", resp.head);
    let sent = gw.upstream.requests();
    assert_eq!(sent.len(), 1);
    let up = &sent[0];
    assert_eq!(up.uri, "/orders?src=test");
    assert_eq!(up.body, ORDER.as_bytes());
    assert_eq!(up.header("idempotency-key"), Some("fwd-1"), "bare key");
    assert_eq!(
        up.header("host"),
        Some(gw.upstream.addr().to_string().as_str()),
        "host rewritten to the upstream's"
    );
    assert!(
        up.header("x-forwarded-for")
            .is_some_and(|v| v.contains("127.0.0.1")),
        "x-forwarded-for: {:?}",
        up.header("x-forwarded-for")
    );
    assert_eq!(up.header("x-forwarded-proto"), Some("http"));
    assert_eq!(
        up.header("authorization"),
        Some(ALICE),
        "credentials forwarded"
    );
    assert_eq!(up.header("x-custom"), Some("kept"));
    assert_eq!(up.header("content-type"), Some("application/json"));
    for hop in ["x-hop", "keep-alive", "te", "expect", "transfer-encoding"] {
        assert_eq!(up.header(hop), None, "{hop} must not be forwarded");
    }
    assert!(
        !up.header("connection")
            .unwrap_or_default()
            .contains("x-hop"),
        "client's connection header forwarded: {:?}",
        up.header("connection")
    );
    assert_eq!(up.headers.get_all("idempotency-key").iter().count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignored_fields_do_not_change_the_operation() {
    let gw = spawn_gateway(r#"ignore_fields = ["/nonce"]"#).await;

    let first = r#"{"sku":"apple","nonce":"n-1"}"#;
    assert_one_operation(&gw, first, r#"{"nonce":"n-2","sku":"apple"}"#).await;

    let changed = write(
        gw.addr(),
        "/orders",
        Some("order-1"),
        r#"{"sku":"pear","nonce":"n-1"}"#,
    )
    .await;
    changed.assert_problem(422, "key-reused");
    assert_eq!(gw.upstream.writes(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_payload_while_the_first_is_in_flight_is_key_reused() {
    let gw = spawn_gateway("").await;
    let addr = gw.addr();
    let first =
        tokio::spawn(async move { write(addr, "/slow?ms=600", Some("order-9"), ORDER).await });
    gw.upstream.wait_for_requests(1).await;

    let changed = ORDER.replace("\"qty\":3", "\"qty\":4");
    let reused = write(gw.addr(), "/slow?ms=600", Some("order-9"), &changed).await;
    reused.assert_operation_problem(422, "key-reused", "in_progress");
    let same = write(gw.addr(), "/slow?ms=600", Some("order-9"), ORDER).await;
    same.assert_operation_problem(409, "request-in-progress", "in_progress");

    assert_fresh_created(&first.await.expect("first write"));
    assert_eq!(gw.upstream.writes(), 1, "nothing but the first was sent");
    assert_eq!(gw.upstream.requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_reserialised_json_body_is_the_same_operation() {
    // Over 64 KiB, the fingerprint is computed off the async workers.
    let items: Vec<serde_json::Value> = (0..4000)
        .map(|i| serde_json::json!({ "sku": format!("item-{i}"), "qty": i, "price": i as f64 / 7.0 }))
        .collect();
    let compact = serde_json::json!({ "items": items }).to_string();
    let pretty = serde_json::to_string_pretty(&serde_json::json!({ "items": items })).unwrap();
    assert!(compact.len() > 128 * 1024 && pretty != compact);
    let gw = spawn_gateway("").await;

    let first = write(gw.addr(), "/orders", Some("bulk-1"), &compact).await;
    assert_fresh_created(&first);
    let again = write(gw.addr(), "/orders", Some("bulk-1"), &pretty).await;
    assert_replay_of(&again, &first);
    let changed = compact.replace("item-3999", "item-4000");
    let reused = write(gw.addr(), "/orders", Some("bulk-1"), &changed).await;
    reused.assert_problem(422, "key-reused");
    assert_eq!(gw.upstream.writes(), 1);
}
