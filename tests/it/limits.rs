//! Limits and bad input: an over-limit request body is refused with 413
//! before anything is sent (declared or chunked, and before `100 Continue`),
//! a chunked body within the limit is forwarded with a Content-Length, a
//! response too large to store is delivered once and never re-sent, and
//! garbage or oversized request heads never take the gateway down, and a
//! body that never finishes is cut off with 408. An HTTP/1.1 head of more
//! fields than hyper's default of 100 (up to 1024) is taken both ways: a
//! client's request is forwarded with all of them (more is a bare 431),
//! an upstream's answer completes its write and is replayed whole.

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

/// `count` header lines `x-field-{i}: {i}`, as a head's lines.
fn numbered_fields(count: usize) -> Vec<String> {
    (0..count).map(|i| format!("x-field-{i}: {i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_head_of_many_fields_is_taken_up_to_its_bound() {
    let gw = spawn_gateway("").await;
    let body = r#"{"sku":"fig"}"#;
    let mut lines = numbered_fields(110);
    lines.push(format!("content-length: {}", body.len()));
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    let request = raw_write_head("/orders", "application/json", "many-fields", &lines) + body;
    let taken = raw_exchange(gw.addr(), request.as_bytes())
        .await
        .expect("an answer");
    assert_eq!(taken.status, 201, "{}", taken.head);
    let sent = gw.upstream.write_requests();
    assert_eq!(sent.len(), 1);
    let forwarded = (0..110)
        .filter(|i| sent[0].header(&format!("x-field-{i}")) == Some(&i.to_string()))
        .count();
    assert_eq!(forwarded, 110, "{:?}", sent[0].headers);
    // Past the bound (1024 fields), hyper answers before the gateway reads
    // the head: a 431 without a problem body.
    let lines = numbered_fields(1100);
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    let request = raw_post_head("/orders", &lines);
    let refused = raw_exchange(gw.addr(), request.as_bytes())
        .await
        .expect("an answer");
    assert_eq!(refused.status, 431, "{}", refused.head);
    assert!(refused.body.is_empty(), "{:?}", refused.body);
    assert_eq!(gw.upstream.write_requests().len(), 1, "nothing more sent");
}

/// A 201 whose head has `count` `Set-Cookie` lines (a session's cookies
/// come to more than hyper's default of 100 fields).
fn answer_with_cookies(count: usize) -> &'static [u8] {
    let mut answer = String::from(
        "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: 2\r\n",
    );
    for i in 0..count {
        answer.push_str(&format!("set-cookie: c{i}=1\r\n"));
    }
    answer.push_str("\r\n{}");
    Box::leak(answer.into_bytes().into_boxed_slice())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_answer_of_many_fields_completes_its_write() {
    let raw = RawUpstream::start(Breakage::Answers(answer_with_cookies(110))).await;
    let gw = spawn_gateway_with(Setup::route("").upstream_url(raw.url())).await;
    let write = raw_write_head(
        "/orders",
        "application/json",
        "many-cookies",
        &["content-length: 2", "connection: close"],
    ) + "{}";
    let first = raw_exchange(gw.addr(), write.as_bytes())
        .await
        .expect("an answer");
    let replay = raw_exchange(gw.addr(), write.as_bytes())
        .await
        .expect("an answer");
    for (what, answer) in [("the write", &first), ("its replay", &replay)] {
        assert_eq!(answer.status, 201, "{what}: {}", answer.head);
        let cookies = answer.head.matches("\r\nset-cookie: c").count();
        assert_eq!(cookies, 110, "{what}: {}", answer.head);
    }
    assert!(
        replay.head.contains("idempotent-replayed: true"),
        "{}",
        replay.head
    );
    assert_eq!(raw.requests(), 1, "sent once");
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
