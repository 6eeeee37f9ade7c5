//! HTTP/2 on both sides of the gateway.
//!
//! Clients: `curl --http2-prior-knowledge` on plain TCP and `curl --http2`
//! under TLS (ALPN `h2`) get replays with `Idempotent-Replayed: true` and
//! no connection-specific header; a Python h2 client
//! (`tests/clients/h2_client.py`) sends concurrent same-key streams on one
//! connection (one upstream write), resets a write's stream (a hang-up: the
//! write goes on and is recorded), and the hostile cases — a flood of
//! streams past the limit, a rapid reset storm (CVE-2023-44487), a
//! SETTINGS flood, a header block growing without end in CONTINUATION
//! frames — each bounded, with the gateway answering another client
//! meanwhile; and a connection that opens no stream, or sends nothing at
//! all, is closed after `header_read_timeout`. An h2 client in the test
//! itself (the h2 crate: never ignored) resets a write's stream with
//! `NO_ERROR` before its whole body came: refused, nothing sent, with or
//! without a `content-length`.
//!
//! Upstreams: a route with `upstream_http2` writes over one multiplexed
//! connection to hyper's HTTP/2 server (writes counted), and how an h2
//! upstream ends a stream is classified exactly: `REFUSED_STREAM` or a
//! GOAWAY below the stream is `not_attempted`, a reset or GOAWAY after the
//! upstream may have processed it is `unknown`.
//!
//! The client tests need curl and the Python venv of `tests/clients`
//! (`.ci/run` installs it) and are `#[ignore]`d for a plain `cargo test`.

use crate::common::*;
use bytes::Bytes;
use http::StatusCode;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const BODY: &str = r#"{"title":"h2"}"#;

/// Headers no HTTP/2 message may carry (RFC 9113 §8.2.2).
const CONNECTION_SPECIFIC: [&str; 5] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
];

fn assert_no_connection_headers(head: &[String]) {
    for name in CONNECTION_SPECIFIC {
        assert!(
            !head.iter().any(|l| l.starts_with(&format!("{name}:"))),
            "an HTTP/2 response carried `{name}`: {head:?}"
        );
    }
}

fn curl_write_args<'a>(url: &'a str, key: &'a str) -> Vec<&'a str> {
    vec![
        url,
        "-H",
        "content-type: application/json",
        "-H",
        "authorization: Bearer alice-token",
        "-H",
        key,
        "--data",
        BODY,
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs curl with HTTP2"]
async fn curl_with_prior_knowledge_gets_a_replay() {
    let gw = spawn_gateway("").await;
    let url = format!("http://{}/tasks", gw.addr());
    let mut args = vec!["--http2-prior-knowledge"];
    args.extend(curl_write_args(&url, "idempotency-key: h2-curl-1"));
    let first = curl(&args).await;
    let head = head_lines(&first);
    assert_eq!(head[0].trim(), "http/2 201", "{first}");
    assert!(!head.iter().any(|l| l.starts_with("idempotent-replayed")));
    let again = curl(&args).await;
    let replayed = head_lines(&again);
    assert_eq!(replayed[0].trim(), "http/2 201", "{again}");
    assert!(
        replayed.contains(&"idempotent-replayed: true".to_string()),
        "{again}"
    );
    assert_no_connection_headers(&head);
    assert_no_connection_headers(&replayed);
    assert_eq!(
        first.lines().last(),
        again.lines().last(),
        "the same body replayed"
    );
    assert_eq!(gw.upstream.writes(), 1);
    // `:authority` became the upstream's Host; the upstream hears HTTP/1.1.
    let forwarded = &gw.upstream.write_requests()[0];
    assert_eq!(forwarded.version, http::Version::HTTP_11);
    assert_eq!(
        forwarded.header("host"),
        Some(gw.upstream.addr().to_string().as_str())
    );
    // HTTP/1.1 on the same listener still works.
    let plain = write(gw.addr(), "/tasks", Some("h2-curl-1"), BODY).await;
    assert!(plain.is_replay(), "{:?}", plain.headers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs curl with HTTP2"]
async fn a_tls_listener_offers_h2_by_alpn() {
    let pki = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new(pki.path(), "ca");
    let identity = ca.server_cert(pki.path(), "proxy");
    let gw = spawn_gateway_with(Setup::route("").server(&tls_listener_lines(&identity))).await;
    let url = format!("https://127.0.0.1:{}/tasks", gw.addr().port());
    let ca_file = ca.pem.display().to_string();
    let mut args = vec!["--http2", "--cacert", &ca_file];
    args.extend(curl_write_args(&url, "idempotency-key: h2-tls-1"));
    let first = curl(&args).await;
    assert_eq!(head_lines(&first)[0].trim(), "http/2 201", "{first}");
    let again = curl(&args).await;
    let head = head_lines(&again);
    assert!(
        head.contains(&"idempotent-replayed: true".to_string()),
        "{again}"
    );
    assert_no_connection_headers(&head);
    assert_eq!(gw.upstream.writes(), 1);
    assert_eq!(
        gw.upstream.write_requests()[0].header("x-forwarded-proto"),
        Some("https")
    );
    // A client that offers only HTTP/1.1 gets it.
    let mut h1 = vec!["--http1.1", "--cacert", &ca_file];
    h1.extend(curl_write_args(&url, "idempotency-key: h2-tls-1"));
    let old = curl(&h1).await;
    assert!(head_lines(&old)[0].starts_with("http/1.1 201"), "{old}");
}

/// Runs `h2_client.py` with `args` and returns its JSON report.
async fn h2_client(args: &[&str]) -> Value {
    run_client("h2_client.py", args).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs tests/clients/.venv (h2)"]
async fn concurrent_same_key_streams_on_one_connection_write_once() {
    let gw = spawn_gateway("in_progress = \"wait\"").await;
    let port = gw.addr().port().to_string();
    let report = h2_client(&["same-key", &port, "20", "h2-same"]).await;
    let answers = report["answers"].as_array().expect("answers");
    assert_eq!(answers.len(), 20);
    let fresh = answers.iter().filter(|a| a["replayed"].is_null()).count();
    for answer in answers {
        assert_eq!(answer["status"], 201, "{answer}");
        let names = answer["header_names"].as_array().expect("names");
        for name in CONNECTION_SPECIFIC {
            assert!(!names.iter().any(|n| n == name), "{answer}");
        }
        assert_eq!(answer["body"], answers[0]["body"]);
    }
    assert_eq!(fresh, 1, "one answer is the write's, the rest replays");
    assert_eq!(gw.upstream.writes(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs tests/clients/.venv (h2)"]
async fn a_reset_stream_is_a_hang_up_the_write_goes_on() {
    let gw = spawn_gateway("in_progress = \"wait\"").await;
    let port = gw.addr().port().to_string();
    let report = h2_client(&["reset", &port, "h2-reset"]).await;
    assert_eq!(report["closed"], false, "{report}");
    assert_eq!(report["answers"], 0, "the reset stream got no answer");
    gw.upstream.wait_for_writes(1).await;
    // The write was recorded: the retry (it waits for the attempt) is its replay.
    let retry = write(gw.addr(), "/slow?ms=300", Some("h2-reset"), BODY).await;
    assert!(
        retry.is_replay(),
        "{} {:?}",
        retry.status,
        String::from_utf8_lossy(&retry.body)
    );
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(gw.upstream.writes(), 1);
}

/// A stream whose DATA runs past its `content-length` (the declared bytes
/// in a first frame, more in a second) is malformed (RFC 9113 §8.1.1):
/// refused or reset, and nothing sent — not the write cut to its declared
/// length, which is not the one the client sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs tests/clients/.venv (h2)"]
async fn more_data_than_the_content_length_sends_nothing() {
    let gw = spawn_gateway("").await;
    let port = gw.addr().port().to_string();
    let report = h2_client(&["split-length", &port, "h2-split"]).await;
    assert!(
        report["reset"] == true || report["status"] == 400,
        "{report}"
    );
    assert_eq!(gw.upstream.writes(), 0, "{report}");
}

/// A stream the client resets with `NO_ERROR` before its whole body came
/// (which hyper reads as the body's end) is refused 400 `invalid-body`
/// with nothing sent, whether or not a `content-length` said how much was
/// to come: a write cut short is not the one the client sent. Its retry
/// with the whole body under the same key is then the first write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_reset_before_its_whole_body_sends_nothing() {
    let gw = spawn_gateway("").await;
    let refused = r#"idemgate_requests_total{route="api",outcome="rejected"}"#;
    for (n, declared) in [true, false].into_iter().enumerate() {
        let key = format!("h2-cut-{n}");
        reset_mid_body(gw.addr(), "POST", &key, declared).await;
        // The stream's end: refused and counted, or sent.
        eventually("the reset stream handled", || async {
            let counted = metric(&scrape_metrics(gw.admin_addr()).await, refused);
            (counted.unwrap_or(0.0) > n as f64 || gw.upstream.writes() > n).then_some(())
        })
        .await;
        let sent = gw.upstream.write_requests();
        assert_eq!(
            sent.len(),
            n,
            "content-length declared: {declared}: {sent:?}"
        );
        assert_fresh_created(&write(gw.addr(), "/h2-cut", Some(&key), BODY).await);
        assert_eq!(gw.upstream.write_requests()[n].body, BODY, "the whole body");
    }
}

/// A request the route does not intercept, its stream reset the same
/// way without a `content-length`, reached the upstream as a whole
/// request of the part that came (hyper's chunked end after it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_passed_through_reset_before_its_whole_body_is_not_sent_whole() {
    let gw = spawn_gateway("methods = [\"POST\"]\n").await;
    reset_mid_body(gw.addr(), "PUT", "h2-cut-pass", false).await;
    // Refused and counted, or sent on: the upstream may have seen the
    // request's head before its body failed, or nothing.
    let refused = r#"idemgate_requests_total{route="api",outcome="rejected"}"#;
    let requests = eventually("the reset stream handled", || async {
        let counted = metric(&scrape_metrics(gw.admin_addr()).await, refused);
        let requests = gw.upstream.requests();
        (counted.unwrap_or(0.0) > 0.0 || !requests.is_empty()).then_some(requests)
    })
    .await;
    let cut = &BODY.as_bytes()[..5];
    assert!(
        requests.iter().all(|r| r.body.as_ref() != cut),
        "the part that came, taken as whole: {requests:?}"
    );
}

/// `method /h2-cut` with `key` on an h2 connection of its own: the first
/// bytes of [`BODY`] as DATA (its whole length in `content-length` if
/// `declared`), then `RST_STREAM(NO_ERROR)`.
async fn reset_mid_body(addr: std::net::SocketAddr, method: &str, key: &str, declared: bool) {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (client, mut connection) = h2::client::handshake(tcp).await.expect("h2 handshake");
    let mut ping = connection.ping_pong().expect("the connection's pings");
    tokio::spawn(connection);
    let mut client = client.ready().await.expect("a stream");
    let mut request = http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}/h2-cut"))
        .header("content-type", "application/json")
        .header("authorization", ALICE)
        .header("idempotency-key", key);
    if declared {
        request = request.header("content-length", BODY.len());
    }
    let (_answer, mut stream) = client
        .send_request(request.body(()).expect("request"), false)
        .expect("HEADERS");
    stream
        .send_data(Bytes::from_static(&BODY.as_bytes()[..5]), false)
        .expect("DATA");
    // h2 drops what it has not written of a stream it resets: a PING
    // answered says the DATA queued before it went out, and another one
    // that the reset did.
    ping.ping(h2::Ping::opaque()).await.expect("a pong");
    stream.send_reset(h2::Reason::NO_ERROR);
    ping.ping(h2::Ping::opaque()).await.expect("a pong");
}

/// `[server]` lines: at most `streams` HTTP/2 streams per connection.
fn streams(streams: u32) -> String {
    format!("http2_max_concurrent_streams = {streams}\n")
}

/// A gateway allowing 5 streams per connection, and the report of
/// `h2_client.py command <its port> args…`.
async fn hostile(command: &str, args: &[&str]) -> (TestGateway, Value) {
    let gw = spawn_gateway_with(Setup::route("").server(&streams(5))).await;
    let port = gw.addr().port().to_string();
    let report = h2_client(&[&[command, port.as_str()], args].concat()).await;
    (gw, report)
}

/// Another client, on a connection of its own, is answered.
async fn another_client_is_answered(gw: &TestGateway) {
    let read = send(gw.addr(), "GET", "/health-of-upstream", &[], Bytes::new()).await;
    assert_eq!(read.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs tests/clients/.venv (h2)"]
async fn a_flood_of_streams_past_the_limit_is_refused() {
    let (gw, report) = hostile("stream-flood", &["200"]).await;
    another_client_is_answered(&gw).await;
    // Five streams at a time: those past the limit were refused by h2
    // (REFUSED_STREAM), the five taken were written once each.
    assert_eq!(report["ended"], 200, "{report}");
    assert_eq!(report["refused"], 195, "{report}");
    assert_eq!(report["statuses"]["201"], 5, "{report}");
    assert_eq!(gw.upstream.writes(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs tests/clients/.venv (h2)"]
async fn a_rapid_reset_storm_closes_the_connection() {
    let (gw, report) = hostile("rapid-reset", &["2000"]).await;
    another_client_is_answered(&gw).await;
    // h2 closes a connection past 20 streams reset before they were
    // accepted (GOAWAY ENHANCE_YOUR_CALM), long before the 2000.
    assert_eq!(report["closed"], true, "{report}");
    assert!(report["sent"].as_u64().expect("sent") < 2000, "{report}");
    assert!(gw.upstream.writes() <= 5, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs tests/clients/.venv (h2)"]
async fn streams_reset_once_accepted_start_no_more_work_than_the_limit() {
    let (gw, report) = hostile("reset-accepted", &["40"]).await;
    assert_eq!(report["closed"], false, "{report}");
    // The reset streams' writes go on (hang-ups) and hold their slots: five
    // reached the upstream, and the streams after them were answered 503
    // at once (those h2 saw reset before they were accepted never began).
    gw.upstream.wait_for_writes(5).await;
    let busy = report["statuses"]["503"].as_u64().unwrap_or(0);
    assert!(busy > 0 && busy <= 35, "{report}");
    another_client_is_answered(&gw).await;
    assert_eq!(gw.upstream.writes(), 5, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs tests/clients/.venv (h2)"]
async fn a_settings_flood_is_held_back_by_its_own_acks() {
    let gw = spawn_gateway("").await;
    let port = gw.addr().port().to_string();
    let flood = {
        let port = port.clone();
        tokio::spawn(async move { h2_client(&["settings-flood", &port, "5000000"]).await })
    };
    another_client_is_answered(&gw).await;
    let report = tokio::time::timeout(CLIENT_RUN, flood)
        .await
        .expect("the flood ended")
        .expect("the client ran");
    // Each SETTINGS asks for an ACK the client never reads: the gateway
    // stops reading once it cannot send them (h2 holds one pending ACK),
    // so the client is stopped long before its 5 million frames (75 MB).
    assert_eq!(report["stopped"], true, "{report}");
    assert!(
        report["sent"].as_u64().expect("sent") < 5_000_000,
        "{report}"
    );
    another_client_is_answered(&gw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs tests/clients/.venv (h2)"]
async fn a_header_block_without_end_is_cut_off() {
    let gw = spawn_gateway("").await;
    let port = gw.addr().port().to_string();
    let report = h2_client(&["continuation-flood", &port]).await;
    // Cut off past 64 KiB of headers (the default `max_header_bytes`) and
    // h2's cap on CONTINUATION frames: what the client got to send is that
    // and the sockets' buffers, far below the 64 MiB it would send.
    let sent = report["sent_bytes"].as_u64().expect("sent_bytes");
    assert!(sent < 16 * 1024 * 1024, "{sent} bytes taken: {report}");
    assert!(
        report["closed"] == true || !report["goaway"].is_null(),
        "{report}"
    );
    assert_eq!(gw.upstream.writes(), 0);
    another_client_is_answered(&gw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs tests/clients/.venv (h2)"]
async fn a_connection_with_no_stream_is_closed_after_header_read_timeout() {
    let gw = spawn_gateway_with(Setup::route("").server("header_read_timeout = \"500ms\"\n")).await;
    let port = gw.addr().port().to_string();
    // PINGs answered, so only the idle bound can end it: GOAWAY NO_ERROR,
    // well before the client's own 10 s socket timeout.
    let report = h2_client(&["idle", &port]).await;
    assert_eq!(report["goaway"], 0, "{report}");
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed_after_header_read_timeout() {
    let gw = spawn_gateway_with(Setup::route("").server("header_read_timeout = \"200ms\"\n")).await;
    // Neither an HTTP/1.1 head nor the HTTP/2 preface: the version is
    // never known, and the connection is closed all the same.
    let mut silent = tokio::net::TcpStream::connect(gw.addr())
        .await
        .expect("connect");
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(WAIT, silent.read(&mut byte)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "still open: {read:?}"
    );
    // Nor one that sent the preface's first byte and stalled.
    let mut stalled = tokio::net::TcpStream::connect(gw.addr())
        .await
        .expect("connect");
    stalled.write_all(b"P").await.expect("write");
    let read = tokio::time::timeout(WAIT, stalled.read(&mut byte)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "still open: {read:?}"
    );
}

#[tokio::test]
async fn a_route_writes_to_an_http2_upstream_over_one_connection() {
    let upstream = FakeUpstream::start_http2().await;
    let gw = spawn_gateway_on(upstream, Setup::route("upstream_http2 = true")).await;
    let first = write(gw.addr(), "/tasks", Some("up-h2-1"), BODY).await;
    assert_fresh_created(&first);
    let again = write(gw.addr(), "/tasks", Some("up-h2-1"), BODY).await;
    assert_replay_of(&again, &first);
    let mut writes = tokio::task::JoinSet::new();
    for i in 0..8 {
        let addr = gw.addr();
        writes.spawn(async move {
            let key = format!("up-h2-{i}x");
            write(addr, "/slow?ms=100", Some(&key), BODY).await
        });
    }
    while let Some(response) = writes.join_next().await {
        assert_eq!(response.expect("the write ran").status, StatusCode::CREATED);
    }
    assert_eq!(gw.upstream.writes(), 9);
    // One thread here: one multiplexed connection for every write, the
    // first one's, though eight were in flight at once.
    assert_eq!(gw.upstream.connections(), 1);
    let forwarded = &gw.upstream.write_requests()[0];
    assert_eq!(forwarded.version, http::Version::HTTP_2);
    assert_eq!(forwarded.header("idempotency-key"), Some("up-h2-1"));
    // Pass-through reads have a pool of their own, over HTTP/2 too.
    for _ in 0..3 {
        let read = send(gw.addr(), "GET", "/tasks", &[], Bytes::new()).await;
        assert_eq!(read.status, StatusCode::OK);
    }
    assert_eq!(gw.upstream.connections(), 2);
    let reads = gw.upstream.requests();
    assert!(reads.iter().all(|r| r.version == http::Version::HTTP_2));
    // `:authority` is the upstream's; no Host header beside it.
    assert!(reads.iter().all(|r| r.header("host").is_none()));
}

#[tokio::test]
async fn an_https_upstream_is_spoken_to_in_http2_when_it_picks_h2_by_alpn() {
    let pki = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new(pki.path(), "private-ca");
    let identity = ca.server_cert(pki.path(), "api");
    let route = format!(
        "upstream_ca = \"{}\"\nupstream_http2 = true\n",
        ca.pem.display()
    );
    for (offered, spoken) in [
        (
            vec![b"h2".to_vec(), b"http/1.1".to_vec()],
            http::Version::HTTP_2,
        ),
        // An upstream that offers HTTP/1.1 only gets HTTP/1.1.
        (vec![b"http/1.1".to_vec()], http::Version::HTTP_11),
    ] {
        let mut config = (*server_config(&identity)).clone();
        config.alpn_protocols = offered;
        let upstream = FakeUpstream::start_tls(std::sync::Arc::new(config)).await;
        let gw = spawn_gateway_on(upstream, Setup::route(&route)).await;
        let first = write(gw.addr(), "/invoices", Some("alpn-1"), BODY).await;
        assert_fresh_created(&first);
        let again = write(gw.addr(), "/invoices", Some("alpn-1"), BODY).await;
        assert_replay_of(&again, &first);
        let second = write(gw.addr(), "/invoices", Some("alpn-2"), BODY).await;
        assert_fresh_created(&second);
        assert_eq!(gw.upstream.writes(), 2);
        assert_eq!(
            gw.upstream.connections(),
            1,
            "{spoken:?}: one connection, kept"
        );
        let versions: Vec<_> = gw.upstream.requests().iter().map(|r| r.version).collect();
        assert_eq!(versions, [spoken, spoken], "{spoken:?}");
    }
}

/// How [`raw_h2_upstream`] ends the first stream it is sent.
#[derive(Debug, Clone, Copy)]
enum Ending {
    /// `RST_STREAM` with `REFUSED_STREAM`: provably unprocessed.
    Refused,
    /// GOAWAY with last stream id 0, below the request's.
    GoAwayBelow,
    /// GOAWAY naming the request's stream (it may have been processed), then close.
    GoAwayAt,
    /// `RST_STREAM` with `INTERNAL_ERROR` after reading the request.
    Reset,
}

/// An HTTP/2 upstream written by hand (frames over TCP) that ends each
/// connection's first request as `ending` says; counts the requests it saw.
async fn raw_h2_upstream(
    ending: Ending,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let seen = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let counted = counted.clone();
            tokio::spawn(async move {
                let _ = socket.write_all(&frame(4, 0, 0, &[])).await;
                let mut buffer = Vec::new();
                let mut chunk = [0u8; 16384];
                // The preface, then frames, until a HEADERS frame.
                let stream = loop {
                    if let Some(stream) = first_headers(&buffer) {
                        break stream;
                    }
                    match tokio::time::timeout(WAIT, socket.read(&mut chunk)).await {
                        Ok(Ok(n)) if n > 0 => buffer.extend_from_slice(&chunk[..n]),
                        _ => return,
                    }
                };
                counted.fetch_add(1, Ordering::SeqCst);
                let reply = match ending {
                    Ending::Refused => frame(3, 0, stream, &7u32.to_be_bytes()),
                    Ending::Reset => frame(3, 0, stream, &2u32.to_be_bytes()),
                    Ending::GoAwayBelow => frame(7, 0, 0, &[0u8; 8]),
                    Ending::GoAwayAt => {
                        let mut payload = stream.to_be_bytes().to_vec();
                        payload.extend_from_slice(&0u32.to_be_bytes());
                        frame(7, 0, 0, &payload)
                    }
                };
                let _ = socket.write_all(&reply).await;
                if matches!(ending, Ending::GoAwayAt) {
                    return;
                }
                // Kept open until the gateway is done with it.
                while let Ok(Ok(n)) = tokio::time::timeout(WAIT, socket.read(&mut chunk)).await {
                    if n == 0 {
                        break;
                    }
                }
            });
        }
    });
    (url, seen)
}

/// One HTTP/2 frame.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let length = (payload.len() as u32).to_be_bytes();
    let mut frame = vec![length[1], length[2], length[3], kind, flags];
    frame.extend_from_slice(&stream.to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// The stream id of the first HEADERS frame in `buffer` (after the client
/// preface), once it is there whole.
fn first_headers(buffer: &[u8]) -> Option<u32> {
    const PREFACE: usize = 24;
    let mut at = PREFACE;
    while buffer.len() >= at + 9 {
        let length = u32::from_be_bytes([0, buffer[at], buffer[at + 1], buffer[at + 2]]) as usize;
        let kind = buffer[at + 3];
        let stream = u32::from_be_bytes([
            buffer[at + 5],
            buffer[at + 6],
            buffer[at + 7],
            buffer[at + 8],
        ]) & 0x7fff_ffff;
        if buffer.len() < at + 9 + length {
            return None;
        }
        if kind == 1 {
            return Some(stream);
        }
        at += 9 + length;
    }
    None
}

/// A gateway whose route writes over HTTP/2 to a [`raw_h2_upstream`] ending
/// streams as `ending` says, never retrying: one write's outcome, as the
/// admin API shows it.
async fn outcome_of(ending: Ending) -> (Response, Value, usize) {
    let (url, seen) = raw_h2_upstream(ending).await;
    let setup =
        Setup::route("upstream_http2 = true\nconnect_retries = 0\nupstream_timeout = \"5s\"")
            .upstream_url(url)
            .admin();
    let gw = spawn_gateway_with(setup).await;
    let response = write(gw.addr(), "/tasks", Some("raw-h2"), BODY).await;
    let operation = gw.operation("raw-h2").await;
    let requests = seen.load(std::sync::atomic::Ordering::SeqCst);
    (response, operation, requests)
}

#[tokio::test]
async fn how_an_http2_upstream_ended_a_stream_decides_not_attempted_or_unknown() {
    let cases = [
        (Ending::Refused, "not_attempted", "upstream-unreachable"),
        (Ending::GoAwayBelow, "not_attempted", "upstream-unreachable"),
        (Ending::Reset, "unknown", "outcome-unknown"),
        (Ending::GoAwayAt, "unknown", "outcome-unknown"),
    ];
    for (ending, state, problem) in cases {
        let (response, operation, requests) = outcome_of(ending).await;
        assert_eq!(requests, 1, "{ending:?}");
        assert_eq!(operation["state"], state, "{ending:?}: {operation}");
        assert_eq!(response.status, StatusCode::BAD_GATEWAY, "{ending:?}");
        let body = String::from_utf8_lossy(&response.body);
        assert!(body.contains(problem), "{ending:?}: {body}");
    }
}
