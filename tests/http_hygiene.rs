//! HTTP hygiene on both listeners, as clients and tools probing them see it:
//!
//! - a client that shuts down its write side right after a complete
//!   request still reads the answer, and the write is sent exactly once;
//! - every 405 on the admin listener names the methods its path accepts
//!   in `Allow` (RFC 9110 §15.5.6).

mod common;

use bytes::Bytes;
use common::*;
use http::StatusCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_half_closes_after_its_write_still_gets_the_answer() {
    let gw = spawn_gateway("").await;
    let body = r#"{"sku":"apple"}"#;
    let mut request = raw_post_head(
        "/slow?ms=300",
        &[
            "content-type: application/json",
            "idempotency-key: half-closed-1",
            &format!("authorization: {ALICE}"),
            &format!("content-length: {}", body.len()),
        ],
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
    ("/healthz", "GET", "POST"),
    ("/readyz", "GET", "POST"),
    ("/metrics", "GET", "DELETE"),
    ("/admin/keys", "GET", "POST"),
    ("/admin/keys/some-id", "GET", "PUT"),
    ("/admin/keys/some-id/resolve", "POST", "GET"),
    ("/admin/stats", "GET", "PATCH"),
    ("/admin/routes/api/pause", "POST", "GET"),
    ("/admin/routes/api/resume", "POST", "DELETE"),
    ("/admin/openapi.json", "GET", "POST"),
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
        resp.assert_problem(405, "method-not-allowed");
        assert_eq!(resp.header("allow"), Some(allowed), "{refused} {path}");
    }
}
