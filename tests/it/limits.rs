//! Limits and bad input: an over-limit request body is refused with 413
//! before anything is sent (declared or chunked, and before `100 Continue`),
//! a chunked body within the limit is forwarded with a Content-Length, a
//! response too large to store is delivered once and never re-sent, and
//! garbage or oversized request heads never take the gateway down, and a
//! body that never finishes is cut off with 408.

use crate::common::*;
use http::StatusCode;

const LIMITS: &str = r#"max_body = "1KiB"
max_stored_response = "1KiB""#;

fn auth_header() -> String {
    format!("authorization: {ALICE}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_over_limit_with_content_length_is_413_and_not_sent() {
    let gw = spawn_gateway(LIMITS).await;
    let body = format!(r#"{{"blob":"{}"}}"#, "x".repeat(4096));

    let resp = write(gw.addr(), "/upload", Some("big-1"), &body).await;

    resp.assert_problem(413, "body-too-large");
    assert!(gw.upstream.requests().is_empty(), "nothing sent upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_at_limit_is_forwarded() {
    let gw = spawn_gateway(LIMITS).await;
    let body = format!(r#"{{"blob":"{}"}}"#, "x".repeat(1024 - 11));
    assert_eq!(body.len(), 1024);

    let resp = write(gw.addr(), "/upload", Some("fits-1"), &body).await;

    assert_fresh_created(&resp);
    assert_eq!(gw.upstream.requests()[0].body, body.as_bytes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_body_over_limit_is_413_and_not_sent() {
    let gw = spawn_gateway(LIMITS).await;
    let head = raw_post_head(
        "/upload",
        &[
            "content-type: application/json",
            "idempotency-key: big-chunked-1",
            &auth_header(),
            "transfer-encoding: chunked",
        ],
    );
    let mut request = head.into_bytes();
    request.extend(chunked(
        format!(r#"{{"blob":"{}"}}"#, "x".repeat(4096)).as_bytes(),
    ));

    let resp = raw_exchange(gw.addr(), &request).await.expect("a response");

    assert_eq!(resp.status, 413, "head: {}", resp.head);
    assert!(
        resp.head.contains("application/problem+json"),
        "head: {}",
        resp.head
    );
    assert!(
        String::from_utf8_lossy(&resp.body).contains("urn:idemgate:problem:body-too-large"),
        "body: {}",
        String::from_utf8_lossy(&resp.body)
    );
    assert!(gw.upstream.requests().is_empty(), "nothing sent upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_body_within_limit_is_forwarded_with_content_length() {
    let gw = spawn_gateway(LIMITS).await;
    let body = r#"{"sku":"apple"}"#;
    let head = raw_post_head(
        "/upload",
        &[
            "content-type: application/json",
            "idempotency-key: chunked-1",
            &auth_header(),
            "transfer-encoding: chunked",
        ],
    );
    let mut request = head.into_bytes();
    request.extend(chunked(body.as_bytes()));

    let resp = raw_exchange(gw.addr(), &request).await.expect("a response");

    assert_eq!(resp.status, 201, "head: {}", resp.head);
    let sent = gw.upstream.requests();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].body, body.as_bytes());
    assert_eq!(
        sent[0].header("content-length"),
        Some(body.len().to_string().as_str())
    );
    assert_eq!(sent[0].header("transfer-encoding"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_declared_body_is_refused_before_100_continue() {
    let gw = spawn_gateway(LIMITS).await;
    let head = raw_post_head(
        "/upload",
        &[
            "content-type: application/json",
            "idempotency-key: expect-1",
            &auth_header(),
            "expect: 100-continue",
            "content-length: 1000000",
        ],
    );

    // Only the head: a client that expects 100 Continue waits for it.
    let resp = raw_exchange(gw.addr(), head.as_bytes())
        .await
        .expect("a response");

    assert_eq!(resp.status, 413, "head: {}", resp.head);
    assert!(
        resp.interim.is_empty(),
        "sent {:?} before refusing",
        resp.interim
    );
    assert!(gw.upstream.requests().is_empty(), "nothing sent upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_response_is_delivered_once_then_response_not_stored() {
    let gw = spawn_gateway(LIMITS).await;
    let size = 64 * 1024;

    let first = write(
        gw.addr(),
        &format!("/big?bytes={size}"),
        Some("report-1"),
        "{}",
    )
    .await;

    assert_eq!(first.status, StatusCode::OK);
    assert!(!first.is_replay());
    assert_eq!(
        first.body.len(),
        size,
        "the first client gets the whole body"
    );
    assert!(first.body == big_body(size), "body bytes intact");

    let retry = write(
        gw.addr(),
        &format!("/big?bytes={size}"),
        Some("report-1"),
        "{}",
    )
    .await;

    retry.assert_operation_problem(409, "response-not-stored", "completed");
    assert_eq!(gw.upstream.writes(), 1, "nothing re-sent");
    assert_eq!(gw.upstream.requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_at_stored_limit_is_replayed() {
    let gw = spawn_gateway(LIMITS).await;

    let first = write(gw.addr(), "/big?bytes=1024", Some("small-1"), "{}").await;
    let retry = write(gw.addr(), "/big?bytes=1024", Some("small-1"), "{}").await;

    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(retry.status, StatusCode::OK);
    assert!(retry.is_replay());
    assert_eq!(retry.body, first.body);
    assert_eq!(gw.upstream.writes(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_request_lines_do_not_kill_the_gateway() {
    let gw = spawn_gateway("").await;
    let garbage: [&[u8]; 6] = [
        b"\x00\xff\xfe garbage \x01\r\n\r\n",
        b"GET\r\n\r\n",
        b"GET / HTTP/9.9\r\n\r\n",
        b"POST /x HTTP/1.1\r\nhost: a\r\ncontent-length: -5\r\n\r\n",
        b"POST /x HTTP/1.1\r\nhost: a\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
        b"GET / HTTP/1.1\r\nbad header without colon\r\n\r\n",
    ];

    for request in garbage {
        if let Some(resp) = raw_exchange(gw.addr(), request).await {
            // 505 is hyper's answer to an unknown HTTP version.
            assert!(
                (400..500).contains(&resp.status) || resp.status == 505,
                "{:?} got {}",
                String::from_utf8_lossy(request),
                resp.head
            );
        }
    }

    assert!(
        gw.upstream.write_requests().is_empty(),
        "garbage reached the upstream"
    );
    assert_still_serving(&gw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_request_head_is_431_and_does_not_kill_the_gateway() {
    let gw = spawn_gateway("").await;
    let mut head = String::from("GET / HTTP/1.1\r\nhost: a\r\n");
    for i in 0..40 {
        head.push_str(&format!("x-filler-{i}: {}\r\n", "v".repeat(2000)));
    }
    head.push_str("\r\n");

    // The gateway may reset the connection before we read its answer; if
    // one arrives it must be 431.
    if let Some(resp) = raw_exchange(gw.addr(), head.as_bytes()).await {
        assert_eq!(resp.status, 431, "head: {}", resp.head);
    }

    assert!(
        gw.upstream.requests().is_empty(),
        "oversized head was proxied"
    );
    assert_still_serving(&gw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_aborted_connections_do_not_kill_the_gateway() {
    let gw = spawn_gateway("").await;

    for _ in 0..50 {
        let stream = tokio::net::TcpStream::connect(gw.addr())
            .await
            .expect("connect");
        drop(stream);
    }
    for _ in 0..20 {
        use tokio::io::AsyncWriteExt;
        let mut stream = tokio::net::TcpStream::connect(gw.addr())
            .await
            .expect("connect");
        let _ = stream
            .write_all(b"POST /x HTTP/1.1\r\nhost: a\r\ncontent-le")
            .await;
    }

    assert_still_serving(&gw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_never_finishes_is_408_and_not_sent() {
    let gw = spawn_gateway(r#"upstream_timeout = "400ms""#).await;
    // Announces 100 bytes, sends 10 and then waits: a slow-loris body.
    let head = format!(
        "POST /slow-client HTTP/1.1\r\nhost: a\r\n{}\r\nidempotency-key: trickle-1\r\n\
         content-type: application/json\r\ncontent-length: 100\r\n\r\n{{\"a\":\"bcd\"",
        auth_header()
    );
    let resp = raw_exchange(gw.addr(), head.as_bytes())
        .await
        .expect("the gateway answers instead of waiting forever");

    assert_eq!(resp.status, 408, "head: {}", resp.head);
    assert!(resp.head.contains("application/problem+json"));
    let body = String::from_utf8_lossy(&resp.body);
    assert!(body.contains("urn:idemgate:problem:body-timeout"), "{body}");
    // The timer that ended it is the route's upstream_timeout.
    assert!(body.contains("did not arrive within 400ms"), "{body}");
    assert!(gw.upstream.requests().is_empty(), "nothing sent upstream");
    assert_still_serving(&gw).await;
}
