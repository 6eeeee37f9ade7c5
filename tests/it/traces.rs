//! Traces (docs/deploying.md, "Traces"), as a collector receives them: an
//! OTLP/HTTP receiver of the test's own decodes every export with the
//! protocol's types, and the trees it got are checked — a first write and
//! its replay, a lost response settled by a probe, a late response — with
//! the client's `traceparent` as the root's parent and idemgate's upstream
//! span as the parent the upstream was told. No attribute carries the key
//! or the credential. Off (no endpoint), `traceparent` goes upstream as the
//! client sent it; a collector that refuses or hangs fails no request, and
//! the spans it loses are counted.

use crate::common::*;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::AnyValue;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

const BODY: &str = r#"{"task":"write the report"}"#;
const KEY: &str = "trace-key-7f3a";
/// The client's trace and its span, as its `traceparent` names them.
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";
/// The client spans of a write's first retry and of its next one.
const STORE_REPLAY_SPAN: &str = "00f067aa0ba902b8";
const CACHED_REPLAY_SPAN: &str = "00f067aa0ba902b9";

/// One span as received, with its resource's `service.name`.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    span: Span,
}

/// An OTLP/HTTP receiver on `127.0.0.1:0`: `POST /v1/traces` with an
/// `ExportTraceServiceRequest`, each span it holds sent on a channel.
struct Receiver {
    url: String,
    spans: mpsc::UnboundedReceiver<Received>,
    seen: Vec<Received>,
    _serving: tokio::task::JoinHandle<()>,
}

impl Receiver {
    async fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let (sender, spans) = mpsc::unbounded_channel();
        let serving = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let sender = sender.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request| receive(request, sender.clone()));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Receiver {
            url,
            spans,
            seen: Vec::new(),
            _serving: serving,
        }
    }

    /// Every span received once `done` holds of them all; panics naming
    /// `what` after [`WAIT`].
    async fn until(&mut self, what: &str, done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let spans: Vec<Span> = self.seen.iter().map(|r| r.span.clone()).collect();
            if done(&spans) {
                return spans;
            }
            match tokio::time::timeout_at(deadline, self.spans.recv()).await {
                Ok(Some(received)) => self.seen.push(received),
                _ => panic!("waited {WAIT:?} for {what}; received: {spans:#?}"),
            }
        }
    }
}

async fn receive(
    request: http::Request<hyper::body::Incoming>,
    sender: mpsc::UnboundedSender<Received>,
) -> Result<http::Response<Full<Bytes>>, hyper::Error> {
    assert_eq!(request.method(), "POST");
    assert_eq!(request.uri().path(), "/v1/traces");
    assert_eq!(
        request.headers()["content-type"],
        "application/x-protobuf",
        "OTLP HTTP/protobuf"
    );
    let body = request.into_body().collect().await?.to_bytes();
    let export = ExportTraceServiceRequest::decode(body).expect("an ExportTraceServiceRequest");
    for resource in export.resource_spans {
        let attributes = resource.resource.map(|r| r.attributes).unwrap_or_default();
        let service = text(&attributes, "service.name").unwrap_or_default();
        for scope in resource.scope_spans {
            for span in scope.spans {
                let _ = sender.send(Received {
                    service: service.clone(),
                    span,
                });
            }
        }
    }
    let answer = ExportTraceServiceResponse::default().encode_to_vec();
    Ok(http::Response::builder()
        .header("content-type", "application/x-protobuf")
        .body(Full::new(Bytes::from(answer)))
        .expect("response"))
}

/// An attribute's value as text (strings, integers and booleans).
fn text(attributes: &[KeyValue], key: &str) -> Option<String> {
    let value = attributes.iter().find(|kv| kv.key == key)?.value.as_ref()?;
    shown(value)
}

fn shown(value: &AnyValue) -> Option<String> {
    match value.value.as_ref()? {
        Value::StringValue(s) => Some(s.clone()),
        Value::IntValue(i) => Some(i.to_string()),
        Value::BoolValue(b) => Some(b.to_string()),
        Value::DoubleValue(d) => Some(d.to_string()),
        other => Some(format!("{other:?}")),
    }
}

fn attr(span: &Span, key: &str) -> Option<String> {
    text(&span.attributes, key)
}

/// Asserts each `(key, value)` attribute of `span`.
fn assert_attrs(span: &Span, expected: &[(&str, &str)]) {
    for (key, value) in expected {
        assert_eq!(
            attr(span, key).as_deref(),
            Some(*value),
            "{key} of {}",
            span.name
        );
    }
}

fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.name == name).collect()
}

fn children<'a>(spans: &'a [Span], parent: &Span) -> Vec<&'a Span> {
    spans
        .iter()
        .filter(|s| s.parent_span_id == parent.span_id)
        .collect()
}

fn child<'a>(spans: &'a [Span], parent: &Span, name: &str) -> &'a Span {
    let found: Vec<&Span> = children(spans, parent)
        .into_iter()
        .filter(|s| s.name == name)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one {name} under {}: {spans:#?}",
        parent.name
    );
    found[0]
}

/// The request span whose `idemgate.outcome` is `outcome`.
fn request<'a>(spans: &'a [Span], outcome: &str) -> &'a Span {
    let found: Vec<&Span> = named(spans, "idemgate.request")
        .into_iter()
        .filter(|s| attr(s, "idemgate.outcome").as_deref() == Some(outcome))
        .collect();
    assert_eq!(found.len(), 1, "one {outcome} request: {spans:#?}");
    found[0]
}

fn has_request(spans: &[Span], outcome: &str) -> bool {
    named(spans, "idemgate.request")
        .iter()
        .any(|s| attr(s, "idemgate.outcome").as_deref() == Some(outcome))
}

/// `traceparent` for `span` in the client's trace.
fn traceparent(span: &str) -> String {
    format!("00-{TRACE}-{span}-01")
}

/// The parent span a `traceparent` names, checking it is in the client's trace.
fn parent_named_by(traceparent: &str) -> String {
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    assert_eq!(parts[1], TRACE, "the upstream joined the client's trace");
    parts[2].to_string()
}

/// No attribute or event of any span carries the raw key, the
/// credential or the body.
fn assert_no_secrets(spans: &[Span]) {
    let credential = ALICE.trim_start_matches("Bearer ");
    for span in spans {
        let values = span
            .attributes
            .iter()
            .chain(span.events.iter().flat_map(|e| e.attributes.iter()))
            .filter_map(|kv| kv.value.as_ref().and_then(shown));
        for value in values {
            for secret in [KEY, credential, "write the report"] {
                assert!(
                    !value.contains(secret),
                    "{secret} in {}: {value}",
                    span.name
                );
            }
        }
    }
}

/// `setup` exporting to `receiver`, batches sent every 20 ms.
fn traced(setup: Setup, collector: &str) -> Setup {
    setup
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", collector)
        .env("OTEL_SERVICE_NAME", "gateway-under-test")
        .env("OTEL_BSP_SCHEDULE_DELAY", "20")
}

/// A write with [`KEY`] as [`ALICE`], with a `traceparent` naming `parent`.
async fn traced_write(gw: &TestGateway, path: &str, parent: &str) -> Response {
    let traceparent = traceparent(parent);
    let headers = [
        ("content-type", "application/json"),
        ("idempotency-key", KEY),
        ("authorization", ALICE),
        ("traceparent", traceparent.as_str()),
        ("tracestate", "vendor=opaque"),
    ];
    send(gw.addr(), "POST", path, &headers, BODY).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_write_and_its_replay_are_trees_in_the_clients_trace() {
    let mut receiver = Receiver::start().await;
    let gw = spawn_gateway_with(traced(Setup::route("").admin(), &receiver.url)).await;
    let first = traced_write(&gw, "/tasks", CLIENT_SPAN).await;
    assert_fresh_created(&first);
    let replay = traced_write(&gw, "/tasks", STORE_REPLAY_SPAN).await;
    assert!(replay.is_replay());
    let again = traced_write(&gw, "/tasks", CACHED_REPLAY_SPAN).await;
    assert!(again.is_replay());

    let spans = receiver
        .until("the write's tree and the two replays", |spans| {
            has_request(spans, "forwarded")
                && replayed(spans).len() == 2
                && [
                    "idemgate.claim",
                    "idemgate.store.claim",
                    "idemgate.upstream",
                    "idemgate.store.record",
                ]
                .iter()
                .all(|name| !named(spans, name).is_empty())
        })
        .await;
    assert!(
        receiver
            .seen
            .iter()
            .all(|r| r.service == "gateway-under-test"),
        "OTEL_SERVICE_NAME"
    );
    let root = request(&spans, "forwarded");
    assert_eq!(hex::encode(&root.trace_id), TRACE);
    assert_eq!(hex::encode(&root.parent_span_id), CLIENT_SPAN);
    assert_eq!(root.kind, SpanKind::Server as i32);
    assert_attrs(
        root,
        &[
            ("idemgate.route", "api"),
            ("http.request.method", "POST"),
            ("http.response.status_code", "201"),
            ("idemgate.operation.state", "completed"),
            ("idemgate.operation.attempt", "1"),
            ("idemgate.replayed", "false"),
        ],
    );
    let operation = gw.operation(KEY).await;
    assert_eq!(
        attr(root, "idemgate.operation.id").as_deref(),
        operation["id"].as_str()
    );
    let key_hash = attr(root, "idemgate.key.hash").expect("the key's hash");
    assert_eq!(key_hash.len(), 32, "{key_hash}");

    let claim = child(&spans, root, "idemgate.claim");
    child(&spans, claim, "idemgate.store.claim");
    let record = child(&spans, root, "idemgate.store.record");
    let upstream = child(&spans, root, "idemgate.upstream");
    assert!(claim.end_time_unix_nano <= upstream.start_time_unix_nano);
    assert!(upstream.end_time_unix_nano <= record.start_time_unix_nano);
    assert_eq!(upstream.kind, SpanKind::Client as i32);
    assert_attrs(
        upstream,
        &[
            ("idemgate.upstream.exchange", "complete"),
            ("idemgate.upstream.tries", "1"),
            ("http.response.status_code", "201"),
        ],
    );

    // The upstream was told idemgate's upstream span, in the client's trace,
    // with the client's tracestate.
    let sent = &gw.upstream.write_requests()[0];
    let told = sent.header("traceparent").expect("a traceparent upstream");
    assert_eq!(parent_named_by(told), hex::encode(&upstream.span_id));
    assert_eq!(sent.header("tracestate"), Some("vendor=opaque"));

    // The replays, each with the same key's hash. Nobody had asked for the
    // write again while it was in flight, so the first retry is answered
    // from the store (a claim that finds it, nothing upstream) and cached
    // then; the next one from the cache, with nothing below it.
    let replays = replayed(&spans);
    let by_parent = |parent: &str| {
        *replays
            .iter()
            .find(|s| hex::encode(&s.parent_span_id) == parent)
            .unwrap_or_else(|| panic!("a replay under {parent}: {spans:#?}"))
    };
    for replay in &replays {
        assert_attrs(
            replay,
            &[
                ("idemgate.replayed", "true"),
                ("idemgate.operation.state", "completed"),
            ],
        );
        assert_eq!(attr(replay, "idemgate.key.hash").as_ref(), Some(&key_hash));
    }
    let from_store = by_parent(STORE_REPLAY_SPAN);
    let claim = child(&spans, from_store, "idemgate.claim");
    child(&spans, claim, "idemgate.store.claim");
    assert_eq!(children(&spans, from_store).len(), 1, "{spans:#?}");
    let cached = by_parent(CACHED_REPLAY_SPAN);
    assert!(children(&spans, cached).is_empty(), "{spans:#?}");
    assert_no_secrets(&spans);
}

/// The requests answered as replays.
fn replayed(spans: &[Span]) -> Vec<&Span> {
    named(spans, "idemgate.request")
        .into_iter()
        .filter(|s| attr(s, "idemgate.outcome").as_deref() == Some("replayed"))
        .collect()
}

/// Writes `path`, whose response is lost (`status`, `outcome-unknown`),
/// and waits for its request's span and a `then` span.
async fn lost_write_then(
    receiver: &mut Receiver,
    gw: &TestGateway,
    path: &str,
    status: u16,
    then: &str,
) -> Vec<Span> {
    let lost = traced_write(gw, path, CLIENT_SPAN).await;
    lost.assert_operation_problem(status, "outcome-unknown", "unknown");
    let what = format!("the lost write's request span and {then}");
    receiver
        .until(&what, |spans| {
            has_request(spans, "unknown") && !named(spans, then).is_empty()
        })
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_response_and_the_probe_that_settles_it() {
    let mut receiver = Receiver::start().await;
    let upstream = FakeUpstream::start().await;
    let probe = format!(
        "[routes.reconcile]\nurl = \"{}/lookup?key={{key}}\"\nfound_status = 200\nfound_json_pointer = \"/id\"\ntimeout = \"2s\"",
        upstream.url()
    );
    let setup = traced(Setup::route(&probe).admin(), &receiver.url);
    let gw = spawn_gateway_on(upstream, setup).await;
    let spans = lost_write_then(&mut receiver, &gw, "/drop", 502, "idemgate.probe").await;
    let root = request(&spans, "unknown");
    assert_eq!(hex::encode(&root.parent_span_id), CLIENT_SPAN);
    assert_attrs(
        root,
        &[
            ("idemgate.operation.state", "unknown"),
            ("idemgate.operation.attempt", "1"),
            ("http.response.status_code", "502"),
        ],
    );
    let upstream = child(&spans, root, "idemgate.upstream");
    assert_attrs(upstream, &[("idemgate.upstream.exchange", "lost")]);
    child(&spans, root, "idemgate.store.record");

    // The probe runs after the client was answered, still in its trace.
    let probe = child(&spans, root, "idemgate.probe");
    assert_eq!(probe.kind, SpanKind::Client as i32);
    assert_attrs(probe, &[("idemgate.probe.matched", "true")]);
    assert!(probe.start_time_unix_nano >= upstream.end_time_unix_nano);
    let asked = gw
        .upstream
        .requests()
        .into_iter()
        .find(|r| r.uri.starts_with("/lookup"))
        .expect("the probe");
    let told = asked
        .header("traceparent")
        .expect("a traceparent on the probe");
    assert_eq!(parent_named_by(told), hex::encode(&probe.span_id));
    // The probe's URL holds the key: it is in no attribute.
    assert_no_secrets(&spans);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_response_settles_in_the_lost_writes_trace() {
    let mut receiver = Receiver::start().await;
    let route = "upstream_timeout = \"300ms\"\nlate_window = \"5s\"";
    let gw = spawn_gateway_with(traced(Setup::route(route), &receiver.url)).await;
    let late = "idemgate.late_response";
    let spans = lost_write_then(&mut receiver, &gw, "/slow?ms=1000", 504, late).await;
    let root = request(&spans, "unknown");
    let late = child(&spans, root, late);
    assert_attrs(late, &[("idemgate.late.settled", "true")]);
    assert!(late.start_time_unix_nano >= root.end_time_unix_nano);
}

#[tokio::test]
async fn off_the_clients_traceparent_goes_upstream_untouched() {
    let gw = spawn_gateway("").await;
    let first = traced_write(&gw, "/tasks", CLIENT_SPAN).await;
    assert_fresh_created(&first);
    let sent = &gw.upstream.write_requests()[0];
    assert_eq!(
        sent.header("traceparent"),
        Some(traceparent(CLIENT_SPAN).as_str())
    );
    assert_eq!(sent.header("tracestate"), Some("vendor=opaque"));
}

/// Writes `n` fresh keys through `gw`; each must be answered as if no
/// collector were configured.
async fn writes_answered(gw: &TestGateway, n: usize) {
    for i in 0..n {
        let resp = write(gw.addr(), "/tasks", Some(&format!("k-{i}")), BODY).await;
        assert_fresh_created(&resp);
    }
    assert_eq!(gw.upstream.writes(), n);
}

/// Waits until the gateway at `admin` counted a dropped span.
async fn dropped_spans_counted(admin: std::net::SocketAddr) -> f64 {
    eventually("a dropped span counted", || async move {
        let text = scrape_metrics(admin).await;
        metric(&text, "idemgate_trace_spans_dropped_total").filter(|n| *n > 0.0)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_refuses_fails_no_request_and_its_spans_are_counted() {
    let refused = {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        listener.local_addr().expect("addr")
    };
    let setup = traced(Setup::route(""), &format!("http://{refused}"));
    let gw = spawn_gateway_with(setup).await;
    let before = scrape_metrics(gw.admin_addr()).await;
    assert_eq!(
        metric(&before, "idemgate_trace_spans_dropped_total"),
        Some(0.0)
    );
    writes_answered(&gw, 5).await;
    dropped_spans_counted(gw.admin_addr()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_hangs_fails_no_request_and_the_full_queue_is_counted() {
    // Accepts, reads nothing, answers nothing: the first export waits (its
    // timeout is longer than the test) while the spans of the writes pile
    // up past the queue, so every drop counted here is the queue's.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let collector = format!("http://{}", listener.local_addr().expect("addr"));
    let hanging = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    let setup = traced(Setup::route(""), &collector)
        .env("OTEL_BSP_MAX_QUEUE_SIZE", "4")
        .env("OTEL_EXPORTER_OTLP_TIMEOUT", "60000");
    let mut gw = spawn_gateway_with(setup).await;
    writes_answered(&gw, 6).await;
    // Six writes end 30 spans: at most 4 in the export that hangs, 4 waiting.
    let dropped = dropped_spans_counted(gw.admin_addr()).await;
    assert!(dropped >= 1.0, "{dropped}");
    // Closed, the collector fails the export at once: the shutdown is quick.
    hanging.abort();
    gw.shutdown().await;
}

/// A trace setting the gateway cannot take stops its start, saying why
/// once (the reason was printed twice: as the message and as its cause).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_trace_setting_is_said_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let toml = gateway_toml(&dir.path().join("g.db"), "http://127.0.0.1:9", "/", "");
    let config = write_config(dir.path(), "idemgate.toml", &toml);
    let mut cmd = binary();
    cmd.arg("serve").arg("--config").arg(&config);
    cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", "notaurl");
    let (status, _, stderr) = run_to_exit(cmd).await;
    assert!(!status.success(), "started: {stderr}");
    assert_eq!(
        stderr.matches("OTEL_EXPORTER_OTLP_ENDPOINT").count(),
        1,
        "{stderr}"
    );
    assert!(stderr.contains("traces: "), "{stderr}");
}
