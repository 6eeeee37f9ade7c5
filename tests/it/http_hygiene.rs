//! HTTP hygiene on both listeners, as clients and tools probing them see it:
//!
//! - a client that shuts down its write side right after a complete
//!   request still reads the answer, and the write is sent exactly once;
//! - every 405 on the admin listener names the methods its path accepts
//!   in `Allow` (RFC 9110 §15.5.6), and reads answer HEAD like GET;
//! - admin request bodies are bounded like the proxy's: a declared length
//!   over the limit is 413 before `100 Continue`, and a body that never
//!   finishes is 408 after `header_read_timeout`, the listener serving
//!   others meanwhile;
//! - a standard method spelled in another case (`post`, `Patch`) is that
//!   method, as most upstreams read it: protected, and sent upper-case;
//! - a passed-through request's body of unknown length (HTTP/1.1's
//!   chunked, HTTP/2's without `content-length`; sent on chunked) reaches
//!   the upstream whole, on a GET too;
//! - a transfer coding other than `chunked`, which the gateway would strip
//!   without decoding, is refused: a request's 501, nothing sent; an
//!   upstream's answer in one is no answer it can pass on (a write's is
//!   `unknown`, a pass-through's 502);
//! - an upstream's answer framed by both `Transfer-Encoding` and
//!   `Content-Length` reaches the client framed by its body alone (RFC
//!   9112 §6.3), written, replayed or passed through;
//! - an upstream's answer reaches the client with the gateway's status
//!   line (RFC 9110 §2.5): `HTTP/1.1` to an `HTTP/1.0` upstream's, the
//!   canonical reason phrase to one of the upstream's own, first answer,
//!   replay and pass-through alike;
//! - a write's answer is kept without its trailer fields, and neither it
//!   nor its replay announces any (`Trailer`);
//! - a passed-through request whose own body is malformed is the client's
//!   400 `invalid-body`, not a 502 blaming the upstream.

use crate::common::*;
use bytes::Bytes;
use http::StatusCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_half_closes_after_its_write_still_gets_the_answer() {
    let gw = spawn_gateway("").await;
    let body = r#"{"sku":"apple"}"#;
    let mut request = raw_write_head(
        "/slow?ms=300",
        "application/json",
        "half-closed-1",
        &[&format!("content-length: {}", body.len())],
    )
    .into_bytes();
    request.extend_from_slice(body.as_bytes());

    let resp = half_closed_exchange(gw.addr(), &request)
        .await
        .expect("an answer, not a closed connection");

    assert_eq!(resp.status, 201, "head: {}", resp.head);
    gw.upstream.wait_for_writes(1).await;
    assert_eq!(gw.upstream.writes(), 1, "sent exactly once");
    let retry = write(gw.addr(), "/slow?ms=300", Some("half-closed-1"), body).await;
    assert!(retry.is_replay(), "the outcome was recorded");
    assert_eq!(gw.upstream.writes(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_closed_admin_request_still_gets_the_answer() {
    let gw = spawn_gateway("").await;
    let request = b"GET /healthz HTTP/1.1\r\nhost: admin.test\r\n\r\n";
    let resp = half_closed_exchange(gw.admin_addr(), request)
        .await
        .expect("an answer, not a closed connection");

    assert_eq!(resp.status, 200, "head: {}", resp.head);
}

/// The methods each admin path accepts, and one it does not.
const ADMIN_PATHS: [(&str, &str, &str); 10] = [
    ("/healthz", "GET, HEAD", "POST"),
    ("/readyz", "GET, HEAD", "POST"),
    ("/metrics", "GET, HEAD", "DELETE"),
    ("/admin/keys", "GET, HEAD", "POST"),
    ("/admin/keys/some-id", "GET, HEAD", "PUT"),
    ("/admin/keys/some-id/resolve", "POST", "GET"),
    ("/admin/stats", "GET, HEAD", "PATCH"),
    ("/admin/routes/api/pause", "POST", "HEAD"),
    ("/admin/routes/api/resume", "POST", "DELETE"),
    ("/admin/openapi.json", "GET, HEAD", "POST"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_admin_405_names_the_allowed_methods() {
    let gw = spawn_gateway_with(Setup::route("").admin()).await;
    for (path, allowed, refused) in ADMIN_PATHS {
        let resp = if path.starts_with("/admin/") {
            gw.admin(refused, path, "").await
        } else {
            send(gw.admin_addr(), refused, path, &[], Bytes::new()).await
        };
        assert_eq!(
            resp.status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{refused} {path}: {:?}",
            resp.body
        );
        if refused != "HEAD" {
            resp.assert_problem(405, "method-not-allowed");
        }
        assert_eq!(resp.header("allow"), Some(allowed), "{refused} {path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_reads_answer_head_like_get_without_a_body() {
    let gw = spawn_gateway_with(Setup::route("").admin()).await;
    let get = gw.admin("GET", "/admin/stats", "").await;
    let head = gw.admin("HEAD", "/admin/stats", "").await;
    assert_eq!(head.status, StatusCode::OK);
    assert!(head.body.is_empty());
    assert_eq!(head.header("content-type"), get.header("content-type"));
    let health = send(gw.admin_addr(), "HEAD", "/healthz", &[], Bytes::new()).await;
    assert_eq!(health.status, StatusCode::OK);
}

/// A raw admin POST head to `path` with the admin token and `extra` lines.
fn admin_post_head(gw: &TestGateway, path: &str, extra: &[&str]) -> String {
    let authorization = format!("authorization: Bearer {}", gw.admin_token());
    let mut lines = vec![authorization.as_str(), "content-type: application/json"];
    lines.extend_from_slice(extra);
    raw_post_head(path, &lines)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_admin_body_is_refused_before_100_continue() {
    let gw = spawn_gateway_with(Setup::route("").admin()).await;
    let head = admin_post_head(
        &gw,
        "/admin/routes/api/pause",
        &["expect: 100-continue", "content-length: 100000000"],
    );

    let resp = raw_exchange(gw.admin_addr(), head.as_bytes())
        .await
        .expect("an answer");

    assert_eq!(resp.status, 413, "head: {}", resp.head);
    assert!(
        resp.interim.is_empty(),
        "asked for the body: {:?}",
        resp.interim
    );
    assert!(String::from_utf8_lossy(&resp.body).contains("urn:idemgate:problem:body-too-large"));
    let stats = gw.admin("GET", "/admin/stats", "").await;
    assert_eq!(stats.json()["paused_routes"], serde_json::json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_body_that_never_finishes_is_408() {
    let setup = Setup::route("")
        .server(r#"header_read_timeout = "500ms""#)
        .admin();
    let gw = spawn_gateway_with(setup).await;
    let mut request =
        admin_post_head(&gw, "/admin/routes/api/pause", &["content-length: 100"]).into_bytes();
    request.extend_from_slice(br#"{"reason":"#);
    let stalled = tokio::spawn({
        let addr = gw.admin_addr();
        async move { raw_exchange(addr, &request).await }
    });

    assert_still_serving(&gw).await;
    let resp = stalled
        .await
        .expect("client task")
        .expect("an answer instead of waiting forever");
    assert_eq!(resp.status, 408, "head: {}", resp.head);
    let body = String::from_utf8_lossy(&resp.body);
    assert!(body.contains("urn:idemgate:problem:body-timeout"), "{body}");
    // The timer that ended it is header_read_timeout's.
    assert!(body.contains("did not arrive within 500ms"), "{body}");
}

/// The body of [`framed_twice`]: to a client that trusts its
/// `Content-Length`, `{}` and then a whole forged response.
const SMUGGLED: &str = "{}HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Evil: 1\r\n\r\nEVIL!";

/// An answer with both `Transfer-Encoding: chunked` and a `Content-Length`
/// that disagrees: the chunks are the body (RFC 9112 §6.3), and the
/// `Content-Length` must not reach the client, or it would read the body
/// short and take the rest for the next answer on its connection.
fn framed_twice() -> &'static [u8] {
    let answer = format!(
        "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\
         transfer-encoding: chunked\r\n\r\n{:x}\r\n{SMUGGLED}\r\n0\r\n\r\n",
        SMUGGLED.len()
    );
    Box::leak(answer.into_bytes().into_boxed_slice())
}

/// A passed-through answer's trailer fields reach an HTTP/1.1 client that
/// takes them (`TE: trailers`): `Trailer`, which names them, is no
/// hop-by-hop field (RFC 9110 §6.6.2, §7.6.1), and HTTP/1.1 sends only the
/// trailer fields it names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passed_through_answer_keeps_its_trailers() {
    let raw = RawUpstream::start(Breakage::Answers(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-sum\r\n\r\n\
          5\r\nhello\r\n0\r\nx-sum: 42\r\n\r\n",
    ))
    .await;
    let gw = spawn_gateway_with(Setup::route("").upstream_url(raw.url())).await;
    let read = raw_post_head("/report", &["te: trailers"]).replace("POST", "GET");
    let answer = raw_exchange(gw.addr(), read.as_bytes())
        .await
        .expect("an answer");
    assert_eq!(answer.status, 200, "{}", answer.head);
    assert!(answer.head.contains("trailer: x-sum"), "{}", answer.head);
    let body = String::from_utf8_lossy(&answer.body);
    assert!(body.contains("x-sum: 42"), "{body:?}");
}

/// A write's answer is stored without its trailer fields, so neither it
/// nor its replay announces any (`Trailer`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writes_answer_announces_no_trailers() {
    let raw = RawUpstream::start(Breakage::Answers(
        b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ntrailer: x-sum\r\n\
          transfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nx-sum: 42\r\n\r\n",
    ))
    .await;
    let gw = spawn_gateway_with(Setup::route("").upstream_url(raw.url())).await;
    let write = raw_write_head(
        "/orders",
        "application/json",
        "trailers",
        &["content-length: 2", "te: trailers", "connection: close"],
    ) + "{}";
    for what in ["the write", "its replay"] {
        let answer = raw_exchange(gw.addr(), write.as_bytes())
            .await
            .expect("an answer");
        assert_eq!(answer.status, 201, "{what}: {}", answer.head);
        assert!(!answer.head.contains("trailer:"), "{what}: {}", answer.head);
        assert_eq!(answer.content(), b"{}", "{what}: {}", answer.head);
    }
    assert_eq!(raw.requests(), 1, "sent once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_framed_twice_reaches_the_client_framed_by_its_body() {
    let raw = RawUpstream::start(Breakage::Answers(framed_twice())).await;
    let gw = spawn_gateway_with(Setup::route("").upstream_url(raw.url())).await;
    let body = r#"{"sku":"apple"}"#;
    let mut write = raw_write_head(
        "/orders",
        "application/json",
        "framed-twice",
        &[&format!("content-length: {}", body.len())],
    )
    .into_bytes();
    write.extend_from_slice(body.as_bytes());
    // A GET: passed through, not intercepted.
    let read = raw_post_head("/orders", &[]).replace("POST", "GET");
    for (what, request) in [
        ("the write", write.clone()),
        ("its replay", write),
        ("a pass-through", read.into_bytes()),
    ] {
        let answer = raw_exchange(gw.addr(), &request).await.expect("an answer");
        assert!(
            !answer.head.contains("content-length: 2\r\n"),
            "{what}: {}",
            answer.head
        );
        assert_eq!(
            answer.content(),
            SMUGGLED.as_bytes(),
            "{what}: {}",
            answer.head
        );
    }
    assert_eq!(raw.requests(), 2, "the write once, the read once");
}

/// An answer in HTTP/1.0, its body framed by the connection's end.
const HTTP_10: &[u8] = b"HTTP/1.0 201 Created\r\ncontent-type: application/json\r\n\r\n{}";

/// An answer with a reason phrase of its own, to a status with none.
const OWN_PHRASE: &[u8] = b"HTTP/1.1 299 Fine Indeed\r\ncontent-length: 2\r\n\r\n{}";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_goes_on_with_the_gateways_status_line() {
    for (upstream, status_line) in [
        (HTTP_10, "http/1.1 201 created"),
        (OWN_PHRASE, "http/1.1 299 <none>"),
    ] {
        let raw = RawUpstream::start(Breakage::Answers(upstream)).await;
        let gw = spawn_gateway_with(Setup::route("").upstream_url(raw.url())).await;
        let write = raw_write_head(
            "/orders",
            "application/json",
            "status-line",
            &["content-length: 2", "connection: close"],
        ) + "{}";
        // A GET: passed through, not intercepted.
        let read = raw_post_head("/orders", &["connection: close"]).replace("POST", "GET");
        for (what, request) in [
            ("the write", &write),
            ("its replay", &write),
            ("a pass-through", &read),
        ] {
            let answer = raw_exchange(gw.addr(), request.as_bytes())
                .await
                .expect("an answer");
            assert_eq!(
                answer.head.lines().next(),
                Some(status_line),
                "{what}: {}",
                answer.head
            );
        }
        assert_eq!(raw.requests(), 2, "the write once, the read once");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_method_spelled_in_another_case_is_that_method() {
    let gw = spawn_gateway("").await;
    let body = r#"{"sku":"pear"}"#;
    let write = |method: &str, key: &str| {
        let head = raw_write_head(
            "/orders",
            "application/json",
            key,
            &[&format!("content-length: {}", body.len())],
        );
        let mut request = head.replacen("POST", method, 1).into_bytes();
        request.extend_from_slice(body.as_bytes());
        request
    };
    let first = raw_exchange(gw.addr(), &write("post", "cased-1"))
        .await
        .expect("an answer");
    assert_eq!(first.status, 201, "{}", first.head);
    for method in ["post", "Post", "POST"] {
        let retry = raw_exchange(gw.addr(), &write(method, "cased-1"))
            .await
            .expect("an answer");
        assert!(
            retry.head.contains("idempotent-replayed: true"),
            "{method}: {}",
            retry.head
        );
    }
    assert_eq!(gw.upstream.writes(), 1);
    assert_eq!(gw.upstream.write_requests()[0].method, http::Method::POST);
    // A method no standard names keeps its spelling.
    let other = raw_exchange(gw.addr(), &write("purge", "cased-2"))
        .await
        .expect("an answer");
    assert!(
        !other.head.contains("idempotent-replayed"),
        "{}",
        other.head
    );
    let sent = gw.upstream.requests();
    assert_eq!(sent.last().map(|r| r.method.as_str()), Some("purge"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_body_is_passed_through_whole_on_any_method() {
    let gw = spawn_gateway("").await;
    for method in ["GET", "DELETE", "OPTIONS"] {
        let mut request = raw_post_head("/search", &["transfer-encoding: chunked"])
            .replacen("POST", method, 1)
            .into_bytes();
        request.extend_from_slice(&chunked(br#"{"q":1}"#));
        let answer = raw_exchange(gw.addr(), &request).await.expect("an answer");
        assert!(answer.status < 500, "{method}: {}", answer.head);
        let sent = gw.upstream.requests();
        let last = sent.last().expect("passed through");
        assert_eq!(last.method.as_str(), method);
        assert_eq!(
            &last.body[..],
            br#"{"q":1}"#,
            "{method}: {:?}",
            last.headers
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_body_of_unknown_length_is_passed_through_whole() {
    let gw = spawn_gateway("").await;
    for method in ["GET", "DELETE", "OPTIONS"] {
        let answer = send_h2_unsized(gw.addr(), method, "/search", &[], r#"{"q":1}"#).await;
        assert!(answer.status.as_u16() < 500, "{method}: {answer:?}");
        let sent = gw.upstream.requests();
        let last = sent.last().expect("passed through");
        assert_eq!(last.method.as_str(), method);
        assert_eq!(
            &last.body[..],
            br#"{"q":1}"#,
            "{method}: {:?}",
            last.headers
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_in_a_transfer_coding_other_than_chunked_is_refused() {
    let gw = spawn_gateway("").await;
    for method in ["POST", "PUT"] {
        let mut request = raw_write_head(
            "/orders",
            "application/json",
            &format!("coded-{method}"),
            &["transfer-encoding: gzip, chunked"],
        )
        .replacen("POST", method, 1)
        .into_bytes();
        request.extend_from_slice(&chunked(b"\x1f\x8b not json"));
        let answer = raw_exchange(gw.addr(), &request).await.expect("an answer");
        assert_eq!(answer.status, 501, "{method}: {}", answer.head);
        assert!(
            String::from_utf8_lossy(&answer.body).contains("unsupported-transfer-coding"),
            "{method}: {:?}",
            answer.body
        );
    }
    assert!(gw.upstream.requests().is_empty(), "nothing sent");
}

/// `CONNECT` asks for a tunnel, which a reverse proxy does not make: in
/// any case it is refused, nothing sent (a 2xx passed back would have
/// become a tunnel, the answer lost to the client).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_is_refused_and_never_sent() {
    let gw = spawn_gateway("").await;
    for method in ["CONNECT", "connect"] {
        let request = format!(
            "{method} /orders/x HTTP/1.1\r\nhost: idemgate.test\r\nauthorization: {ALICE}\r\n\
             idempotency-key: tunnel-{method}\r\ncontent-length: 2\r\n\r\n{{}}"
        );
        let answer = raw_exchange(gw.addr(), request.as_bytes())
            .await
            .expect("an answer");
        assert_eq!(answer.status, 501, "{method}: {}", answer.head);
        assert!(
            String::from_utf8_lossy(&answer.body).contains("unsupported-method"),
            "{method}: {:?}",
            answer.body
        );
    }
    assert!(gw.upstream.requests().is_empty(), "nothing sent");
}

const GZIP_CODED: &[u8] = b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\n\
transfer-encoding: gzip, chunked\r\n\r\n4\r\n\x1f\x8b\x08\x00\r\n0\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_in_a_transfer_coding_other_than_chunked_is_not_passed_on() {
    let raw = RawUpstream::start(Breakage::Answers(GZIP_CODED)).await;
    let gw = spawn_gateway_with(Setup::route("").upstream_url(raw.url())).await;
    let lost = write(gw.addr(), "/orders", Some("coded-answer"), "{}").await;
    lost.assert_operation_problem(502, "outcome-unknown", "unknown");
    let read = send(gw.addr(), "GET", "/orders", &[], "").await;
    assert_eq!(read.status, 502, "{:?}", read.body);
    // A status that says nothing was done is taken in any coding.
    let refused = RawUpstream::start(Breakage::Answers(GZIP_CODED_503)).await;
    let gw = spawn_gateway_with(Setup::route("").upstream_url(refused.url())).await;
    let released = write(gw.addr(), "/orders", Some("coded-503"), "{}").await;
    assert_eq!(released.status, 503, "{:?}", released.body);
    let again = write(gw.addr(), "/orders", Some("coded-503"), "{}").await;
    assert_eq!(again.status, 503, "{:?}", again.body);
    assert_eq!(refused.requests(), 2, "released: its retry is sent");
}

const GZIP_CODED_503: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
transfer-encoding: gzip, chunked\r\n\r\n4\r\n\x1f\x8b\x08\x00\r\n0\r\n\r\n";

/// A chunk-size line hyper cannot read, on a request passed through: the
/// exchange failed on the client's body, and the client heard 502
/// `upstream-failed`, sent to look at a healthy upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passed_through_body_that_is_malformed_is_the_clients_400() {
    let gw = spawn_gateway("methods = [\"POST\"]\n").await;
    let head = raw_post_head(
        "/upload",
        &["content-type: text/plain", "transfer-encoding: chunked"],
    )
    .replace("POST", "PUT");
    let request = format!("{head}5\r\nhello\r\nzz\r\nmore\r\n0\r\n\r\n");
    let answer = raw_exchange(gw.addr(), request.as_bytes())
        .await
        .expect("an answer");
    assert_eq!(answer.status, 400, "{}", answer.head);
    let body = String::from_utf8_lossy(&answer.body);
    assert!(body.contains("invalid-body"), "{body}");
}
