//! One client, one key, however the wire spells it: which requests are the
//! same client's same key (docs/requests.md, "The request's host";
//! docs/profiles.md, `oasis`; SECURITY.md, scopes).
//!
//! - The request's host: HTTP/2's `:authority` and HTTP/1.1's `Host` are
//!   one host, lower-cased and without the scheme's port, so a route
//!   scoped by `host` takes HTTP/2 writes and replays a write across
//!   versions; a stream whose `host` disagrees with its `:authority` is
//!   400 `invalid-host` with nothing sent, and an HTTP/1.1 absolute-form
//!   target names the host whatever `Host` says.
//! - OASIS `Repeatability-First-Sent` further ahead of the gateway's clock
//!   than `first_sent_skew` is 400 `invalid-key` (`rejected`), nothing
//!   sent; within it, and in each HTTP-date form, it is taken.
//! - OASIS answers name `Repeatability-Request-ID`, never the
//!   `Idempotency-Key` the route does not read.
//! - An empty or blank scope header is no credential: 400 `missing-scope`.
//!
//! Each over HTTP/1.1 with hyper's client; the `#[ignore]`d ones also over
//! both versions with curl (`--http1.1`, `--http2-prior-knowledge`) and,
//! for what curl cannot send, with the Python h2 client.

use std::time::{Duration, SystemTime};

use crate::common::*;

const BODY: &str = r#"{"title":"h2"}"#;
const HOST_SCOPED: &str = "scope_headers = [\"host\"]";
const OASIS: &str = "profile = \"oasis\"";

/// The two HTTP versions curl speaks to a plain listener.
const VERSIONS: [&str; 2] = ["--http1.1", "--http2-prior-knowledge"];

/// What curl got: the status, the head lines (lower-cased) and the body.
struct Answer {
    status: u16,
    head: Vec<String>,
    body: String,
}

impl Answer {
    fn has(&self, line: &str) -> bool {
        self.head.iter().any(|l| l.trim() == line)
    }
}

/// POSTs [`BODY`] to the gateway's `/tasks` with curl over `version`, with
/// `headers` (`Name: value`; `Name;` for an empty value).
async fn curl_write(version: &str, gw: &TestGateway, headers: &[&str]) -> Answer {
    curl_post(version, gw, &["--data", BODY], headers).await
}

/// A POST without a body, for what is refused before a body is read:
/// curl 7.88 may report an HTTP/2 stream that the gateway answered and
/// then reset (`NO_ERROR`, RFC 9113 §8.1) while its body was still on the
/// way as a framing error, whatever it was answered.
async fn curl_refused(version: &str, gw: &TestGateway, headers: &[&str]) -> Answer {
    curl_post(version, gw, &["-X", "POST"], headers).await
}

async fn curl_post(version: &str, gw: &TestGateway, body: &[&str], headers: &[&str]) -> Answer {
    let url = format!("http://{}/tasks", gw.addr());
    let mut args = vec![version, url.as_str()];
    args.extend(body);
    args.extend(["-H", "content-type: application/json"]);
    for header in headers {
        args.extend(["-H", header]);
    }
    let output = curl(&args).await;
    let head = head_lines(&output);
    let status = head[0]
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {output}"));
    let body = output
        .split_once("\r\n\r\n")
        .map_or("", |(_, body)| body)
        .to_string();
    Answer { status, head, body }
}

/// An HTTP-date `offset` from now (ahead when positive).
fn date_from_now(offset: i64) -> String {
    let now = SystemTime::now();
    let at = if offset >= 0 {
        now + Duration::from_secs(offset.unsigned_abs())
    } else {
        now - Duration::from_secs(offset.unsigned_abs())
    };
    httpdate::fmt_http_date(at)
}

// ------------------------------------------------------------ the host

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_host_spelled_otherwise_is_one_scope() {
    let gw = spawn_gateway(HOST_SCOPED).await;
    let addr = gw.addr();
    let with_host = |host: &'static str| async move {
        let headers = [
            ("content-type", "application/json"),
            ("idempotency-key", "host-1"),
            ("host", host),
        ];
        send(addr, "POST", "/tasks", &headers, BODY).await
    };
    let first = with_host("API.example").await;
    assert_fresh_created(&first);
    for spelled in ["api.example", "api.EXAMPLE:80", "api.example:"] {
        assert_replay_of(&with_host(spelled).await, &first);
    }
    // Another port is another host.
    assert_fresh_created(&with_host("api.example:8080").await);
    assert_eq!(gw.upstream.writes(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absolute_target_names_the_host_whatever_host_says() {
    let gw = spawn_gateway(HOST_SCOPED).await;
    // An HTTP/1.1 target in absolute form names the host; Host is ignored
    // (RFC 9112 §3.2.2), so both writes are one operation of api.example.
    let addr = gw.addr();
    let request = |host: &'static str| async move {
        let head = format!(
            "POST http://api.example/tasks HTTP/1.1\r\nhost: {host}\r\n\
             content-type: application/json\r\nidempotency-key: abs-1\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{BODY}",
            BODY.len()
        );
        raw_exchange(addr, head.as_bytes()).await
    };
    let first = request("other.example").await.expect("answered");
    assert_eq!(first.status, 201, "{}", first.head);
    let again = request("API.example:80").await.expect("answered");
    assert!(
        again.head.contains("idempotent-replayed: true"),
        "{}",
        again.head
    );
    assert_eq!(gw.upstream.writes(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs curl with HTTP2"]
async fn a_write_scoped_by_host_replays_across_http_versions() {
    let gw = spawn_gateway(HOST_SCOPED).await;
    // Over HTTP/2, curl sends `Host` as `:authority` and no `host` field.
    let first = curl_write(
        "--http1.1",
        &gw,
        &["Host: API.example:80", "Idempotency-Key: h-1"],
    )
    .await;
    assert_eq!(first.status, 201, "{}", first.body);
    let again = curl_write(
        "--http2-prior-knowledge",
        &gw,
        &["Host: api.example", "Idempotency-Key: h-1"],
    )
    .await;
    assert_eq!(again.status, 201, "{}", again.body);
    assert!(again.has("idempotent-replayed: true"), "{:?}", again.head);
    assert_eq!(again.body, first.body);
    // A write first made over HTTP/2 is replayed over HTTP/1.1.
    let h2 = curl_write(
        "--http2-prior-knowledge",
        &gw,
        &["Host: api.example", "Idempotency-Key: h-2"],
    )
    .await;
    assert_eq!(h2.status, 201, "{}", h2.body);
    let h1 = curl_write(
        "--http1.1",
        &gw,
        &["Host: api.example", "Idempotency-Key: h-2"],
    )
    .await;
    assert!(h1.has("idempotent-replayed: true"), "{:?}", h1.head);
    assert_eq!(gw.upstream.writes(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs tests/clients/.venv (h2)"]
async fn a_stream_whose_host_disagrees_with_its_authority_is_refused() {
    let gw = spawn_gateway(HOST_SCOPED).await;
    let port = gw.addr().port().to_string();
    let write = |headers: &str| {
        let headers = headers.to_string();
        let port = port.clone();
        async move {
            let report = run_client("h2_client.py", &["write", &port, &headers]).await;
            report["answers"][0].clone()
        }
    };
    let disagreeing = write(
        r#"{":authority": "api.example", "host": "other.example", "idempotency-key": "d-1"}"#,
    )
    .await;
    assert_eq!(disagreeing["status"], 400, "{disagreeing}");
    let body = disagreeing["body"].as_str().unwrap_or_default();
    assert!(body.contains("invalid-host"), "{body}");
    assert_eq!(gw.upstream.writes(), 0, "nothing is sent");
    // Agreeing, in another spelling: one write, then its replay.
    let agreeing = write(
        r#"{":authority": "api.example", "host": "API.example:80", "idempotency-key": "d-1"}"#,
    )
    .await;
    assert_eq!(agreeing["status"], 201, "{agreeing}");
    let alone = write(r#"{":authority": "api.example:80", "idempotency-key": "d-1"}"#).await;
    assert_eq!(alone["replayed"], "true", "{alone}");
    assert_eq!(gw.upstream.writes(), 1);
}

// ------------------------------------------- OASIS Repeatability-First-Sent

/// An OASIS write with request id `id` first sent at `first_sent`.
async fn oasis_write(gw: &TestGateway, id: &str, first_sent: &str) -> Response {
    oasis_write_with(gw, id, first_sent, &[]).await
}

/// [`oasis_write`] with `extra` headers after its own.
async fn oasis_write_with(
    gw: &TestGateway,
    id: &str,
    first_sent: &str,
    extra: &[(&str, &str)],
) -> Response {
    let mut headers = vec![
        ("content-type", "application/json"),
        ("authorization", ALICE),
        ("repeatability-request-id", id),
        ("repeatability-first-sent", first_sent),
    ];
    headers.extend_from_slice(extra);
    send(gw.addr(), "POST", "/tasks", &headers, BODY).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_sent_ahead_of_the_clock_is_refused_and_nothing_is_sent() {
    let gw = spawn_gateway(OASIS).await;
    // A client clock a day fast: taken, its operation would be deleted a
    // day before the time it sends stops looking recent, and its retry
    // would be sent again.
    let ahead = oasis_write(&gw, "r-ahead", &date_from_now(86_400)).await;
    ahead.assert_problem_mentioning(400, "invalid-key", "Repeatability-First-Sent");
    assert_eq!(ahead.header("repeatability-result"), Some("rejected"));
    assert_eq!(gw.upstream.writes(), 0);
    // Within the default skew (5m) a clock ahead is taken.
    assert_fresh_created(&oasis_write(&gw, "r-ahead", &date_from_now(60)).await);
    assert_eq!(gw.upstream.writes(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_skew_is_the_routes() {
    let gw = spawn_gateway(&format!("{OASIS}\nfirst_sent_skew = \"1s\"")).await;
    oasis_write(&gw, "r-1", &date_from_now(120))
        .await
        .assert_problem(400, "invalid-key");
    assert_fresh_created(&oasis_write(&gw, "r-1", &date_from_now(0)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_http_date_form_is_read() {
    // A window of a century behind, so that one fixed date is in it.
    let century = "first_sent_skew = \"1d\"";
    let setup = Setup::route(&format!("{OASIS}\n{century}")).store("retention = \"100y\"");
    let gw = spawn_gateway_with(setup).await;
    // One instant as RFC 9110 §5.6.7's three forms write it.
    for (id, form) in [
        ("r-1", "Tue, 01 Dec 2026 12:00:00 GMT"),
        ("r-2", "Tuesday, 01-Dec-26 12:00:00 GMT"),
        ("r-3", "Tue Dec  1 12:00:00 2026"),
    ] {
        assert_fresh_created(&oasis_write(&gw, id, form).await);
    }
    // Not an HTTP-date: refused, nothing sent.
    oasis_write(&gw, "r-4", "2026-12-01T12:00:00Z")
        .await
        .assert_problem(400, "invalid-key");
    assert_eq!(gw.upstream.writes(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs curl with HTTP2"]
async fn a_first_sent_ahead_is_refused_over_both_versions() {
    let gw = spawn_gateway(OASIS).await;
    let ahead = format!("Repeatability-First-Sent: {}", date_from_now(86_400));
    for version in VERSIONS {
        let answer = curl_refused(
            version,
            &gw,
            &[
                "Authorization: Bearer a",
                "Repeatability-Request-ID: r-1",
                &ahead,
            ],
        )
        .await;
        assert_eq!(answer.status, 400, "{version}: {}", answer.body);
        assert!(answer.body.contains("invalid-key"), "{}", answer.body);
        assert!(
            answer.has("repeatability-result: rejected"),
            "{:?}",
            answer.head
        );
    }
    assert_eq!(gw.upstream.writes(), 0);
}

// ------------------------------------------------- OASIS names its headers

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oasis_problems_name_the_headers_the_route_reads() {
    let gw = spawn_gateway(OASIS).await;
    let headers = [
        ("content-type", "application/json"),
        ("authorization", ALICE),
    ];
    let missing = send(gw.addr(), "POST", "/tasks", &headers, BODY).await;
    let body = missing.assert_problem(400, "missing-key");
    assert_names_only_the_oasis_header(&body.to_string());
    let now = date_from_now(0);
    let first = oasis_write(&gw, "r-1", &now).await;
    assert_fresh_created(&first);
    let changed = send(
        gw.addr(),
        "POST",
        "/tasks",
        &[
            ("content-type", "application/json"),
            ("authorization", ALICE),
            ("repeatability-request-id", "r-1"),
            ("repeatability-first-sent", &now),
        ],
        r#"{"title":"other"}"#,
    )
    .await;
    let body = changed.assert_problem(400, "key-reused");
    assert_names_only_the_oasis_header(&body.to_string());
}

/// OASIS `Repeatability-Client-ID` narrows the scope as a scope header
/// does: empty or blank it is no client id, so a retry that sends it empty
/// is the same client's (a replay, not a second write); and a request that
/// names two client ids, or two first-sent times, says nothing certain
/// about who sent it or when: 400 `invalid-key`, nothing sent.
#[tokio::test]
async fn oasis_client_ids_are_read_as_scope_headers_are() {
    let gw = spawn_gateway(OASIS).await;
    let now = date_from_now(0);
    let id = assert_fresh_created(&oasis_write(&gw, "c-1", &now).await);
    // OASIS marks no replay: the same answer, and one write upstream.
    let blank = oasis_write_with(&gw, "c-1", &now, &[("repeatability-client-id", "")]).await;
    assert_eq!(blank.json()["id"].as_u64(), Some(id), "{:?}", blank.body);
    assert_eq!(gw.upstream.writes(), 1, "an empty client id is none");

    let two = [
        ("repeatability-client-id", "alice"),
        ("repeatability-client-id", "bob"),
    ];
    let refused = oasis_write_with(&gw, "c-2", &now, &two).await;
    refused.assert_problem_mentioning(400, "invalid-key", "Repeatability-Client-ID");
    let dated_twice = [("repeatability-first-sent", "Sat, 31 Dec 2016 23:59:59 GMT")];
    let refused = oasis_write_with(&gw, "c-3", &now, &dated_twice).await;
    refused.assert_problem_mentioning(400, "invalid-key", "Repeatability-First-Sent");
    assert_eq!(gw.upstream.writes(), 1, "nothing sent");
}

/// An SDK that signs each try anew (Azure Communication Services' HMAC,
/// AWS's SigV4) sends another `Authorization` with each retry: hashed
/// whole, each try was a scope of its own, and the retry of a write whose
/// answer was lost was sent a second time. Its scope is the signer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_signed_anew_for_each_try_is_one_clients() {
    let gw = spawn_gateway(OASIS).await;
    let now = date_from_now(0);
    let acs = |signature: &str| {
        format!(
            "HMAC-SHA256 SignedHeaders=x-ms-date;host;x-ms-content-sha256&Signature={signature}"
        )
    };
    let try_signed = |signature: String, path: &'static str| {
        let gw = &gw;
        let now = now.clone();
        async move {
            let headers = [
                ("content-type", "application/json"),
                ("authorization", signature.as_str()),
                ("repeatability-request-id", "signed-1"),
                ("repeatability-first-sent", now.as_str()),
            ];
            send(gw.addr(), "POST", path, &headers, BODY).await
        }
    };
    let lost = try_signed(acs("Zmlyc3Q="), "/drop").await;
    lost.assert_problem(502, "outcome-unknown");
    let retry = try_signed(acs("c2Vjb25k"), "/drop").await;
    retry.assert_problem(409, "outcome-unknown");
    assert_eq!(retry.header("repeatability-result"), Some("accepted"));
    assert_eq!(gw.upstream.writes(), 1, "the retry was not sent");
    // SigV4, on a route of the gateway's own convention: re-signed the
    // next day, the retry is a replay; another access key, another scope.
    let idemgate = spawn_gateway("").await;
    let sigv4 = |key: &str, date: &str, signature: &str| {
        format!(
            "AWS4-HMAC-SHA256 Credential={key}/{date}/eu-west-1/sqs/aws4_request, \
             SignedHeaders=host;x-amz-date, Signature={signature}"
        )
    };
    let write = |authorization: String| {
        let idemgate = &idemgate;
        async move {
            let headers = [
                ("content-type", "application/json"),
                ("authorization", authorization.as_str()),
                ("idempotency-key", "signed-2"),
            ];
            send(idemgate.addr(), "POST", "/tasks", &headers, BODY).await
        }
    };
    let first = assert_fresh_created(&write(sigv4("AKIDA", "20261207", "aa")).await);
    let replay = write(sigv4("AKIDA", "20261208", "bb")).await;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(replay.json()["id"].as_u64(), Some(first));
    assert_fresh_created(&write(sigv4("AKIDB", "20261207", "aa")).await);
    assert_eq!(idemgate.upstream.writes(), 2);
}

/// An identical write under another request id, held back while the
/// first is held (`rotated_keys = "hold"`), was told `accepted`: nothing
/// was processed or recorded under its id, which OASIS calls `rejected`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oasis_write_held_back_as_a_possible_duplicate_is_rejected() {
    let gw = spawn_gateway(&format!("{OASIS}\nrotated_keys = \"hold\"")).await;
    let now = date_from_now(0);
    let write = |id: &'static str| {
        let (gw, now) = (&gw, now.clone());
        async move {
            let headers = [
                ("content-type", "application/json"),
                ("authorization", ALICE),
                ("repeatability-request-id", id),
                ("repeatability-first-sent", now.as_str()),
            ];
            send(gw.addr(), "POST", "/drop", &headers, BODY).await
        }
    };
    write("r-held").await.assert_problem(502, "outcome-unknown");
    let twin = write("r-rotated").await;
    twin.assert_problem(409, "possible-duplicate");
    assert_eq!(twin.header("repeatability-result"), Some("rejected"));
    assert_eq!(gw.upstream.writes(), 1);
}

fn assert_names_only_the_oasis_header(body: &str) {
    assert!(body.contains("Repeatability-Request-ID"), "{body}");
    assert!(!body.contains("Idempotency-Key"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs curl with HTTP2"]
async fn oasis_problems_name_its_headers_over_both_versions() {
    let gw = spawn_gateway(OASIS).await;
    for version in VERSIONS {
        let answer = curl_refused(version, &gw, &["Authorization: Bearer a"]).await;
        assert_eq!(answer.status, 400, "{version}: {}", answer.body);
        assert_names_only_the_oasis_header(&answer.body);
    }
}

// ----------------------------------------------- an empty credential

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_or_blank_credential_is_no_credential() {
    let gw = spawn_gateway("").await;
    for blank in ["", "   "] {
        let headers = [
            ("content-type", "application/json"),
            ("idempotency-key", "empty-1"),
            ("authorization", blank),
        ];
        send(gw.addr(), "POST", "/tasks", &headers, BODY)
            .await
            .assert_problem(400, "missing-scope");
    }
    assert_eq!(gw.upstream.writes(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs curl with HTTP2"]
async fn an_empty_credential_is_refused_over_both_versions() {
    let gw = spawn_gateway("").await;
    for version in VERSIONS {
        // `Name;` is curl's spelling of a header with an empty value.
        let answer = curl_refused(version, &gw, &["Authorization;", "Idempotency-Key: e-1"]).await;
        assert_eq!(answer.status, 400, "{version}: {}", answer.body);
        assert!(answer.body.contains("missing-scope"), "{}", answer.body);
    }
    assert_eq!(gw.upstream.writes(), 0);
}

/// An HTTP/2 client may split its cookie into crumbs, one field each (RFC
/// 9113 §8.2.3): they are one `Cookie`. A route scoped by `cookie` replays a
/// write made over HTTP/1.1 to its retry over HTTP/2 in crumbs, and the
/// upstream, which hears HTTP/1.1, gets one `Cookie` line.
#[tokio::test]
async fn http2_cookie_crumbs_are_one_cookie() {
    let gw = spawn_gateway("scope_headers = [\"cookie\"]").await;
    let json = ("content-type", "application/json");
    let first = send(
        gw.addr(),
        "POST",
        "/tasks",
        &[
            json,
            ("idempotency-key", "crumbs-1"),
            ("cookie", "theme=dark; session=abc"),
        ],
        BODY,
    )
    .await;
    assert_eq!(first.status, 201, "{:?}", first.body);
    let crumbs = [("cookie", "theme=dark"), ("cookie", "session=abc")];
    let retry = send_h2(
        gw.addr(),
        "POST",
        "/tasks",
        &[json, ("idempotency-key", "crumbs-1"), crumbs[0], crumbs[1]],
        BODY,
    )
    .await;
    assert!(retry.is_replay(), "{:?} {:?}", retry.status, retry.body);
    assert_eq!(gw.upstream.writes(), 1);

    let fresh = send_h2(
        gw.addr(),
        "POST",
        "/tasks",
        &[json, ("idempotency-key", "crumbs-2"), crumbs[0], crumbs[1]],
        BODY,
    )
    .await;
    assert_eq!(fresh.status, 201, "{:?}", fresh.body);
    let forwarded = &gw.upstream.write_requests()[1];
    let cookies: Vec<_> = forwarded.headers.get_all("cookie").iter().collect();
    assert_eq!(cookies, ["theme=dark; session=abc"]);
}

/// An HTTP/2 field value that starts or ends with whitespace makes the
/// request malformed (RFC 9113 §8.2.1), and no intermediary forwards one:
/// 400 `invalid-header`, nothing sent, on a write or a pass-through alike.
/// HTTP/1.1's parser drops that whitespace, so a write made there with it
/// is replayed to its retry sent without it over HTTP/2.
#[tokio::test]
async fn http2_field_values_with_whitespace_around_them_are_refused() {
    let gw = spawn_gateway("").await;
    let json = ("content-type", "application/json");
    let padded = ("authorization", "Bearer alice-token ");
    for key in ["ws-1", "ws-2"] {
        let refused = send_h2(
            gw.addr(),
            "POST",
            "/tasks",
            &[json, ("idempotency-key", key), padded],
            BODY,
        )
        .await;
        refused.assert_problem_mentioning(400, "invalid-header", "authorization");
    }
    let read = send_h2(gw.addr(), "GET", "/tasks", &[("x-note", "\tsee")], "").await;
    read.assert_problem(400, "invalid-header");
    assert!(gw.upstream.requests().is_empty(), "nothing sent");

    let first = send(
        gw.addr(),
        "POST",
        "/tasks",
        &[json, ("idempotency-key", "ws-1"), padded],
        BODY,
    )
    .await;
    assert_eq!(first.status, 201, "{:?}", first.body);
    let clean = send_h2(
        gw.addr(),
        "POST",
        "/tasks",
        &[json, ("idempotency-key", "ws-1"), ("authorization", ALICE)],
        BODY,
    )
    .await;
    assert!(clean.is_replay(), "{:?} {:?}", clean.status, clean.body);
    assert_eq!(gw.upstream.writes(), 1);
}
