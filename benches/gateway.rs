//! End-to-end benchmarks over real loopback sockets, all in one process and
//! one run so the numbers sit side by side:
//!
//! - `passthrough/*`: a pooled hyper client straight to the upstream — the
//!   floor any proxy adds to;
//! - `gateway_get/streamed`: a GET through the gateway (not intercepted,
//!   streamed through untouched);
//! - `first_write/{normal,full}`: a POST with a new key each iteration —
//!   claim (one commit), forward, record (one commit) — per store durability;
//! - `replay/{normal,full}`: the same key again after the first; answered from
//!   the store, nothing sent upstream (checked after the run);
//! - `retry_storm_64/*`: 64 concurrent identical POSTs with one key, timed
//!   until the last response is in; `direct` sends them straight to the
//!   upstream (64 writes), `gateway_{normal,full}` through idemgate with the
//!   default `in_progress = "reject"` (one 201, the rest 409 or replays),
//!   `gateway_wait` with `in_progress = "wait"` (every client gets the 201);
//!   after the run it asserts the upstream saw exactly one write per storm.
//!
//! Client, gateway and upstream share one tokio runtime (two workers), so on
//! a two-core machine they compete for the same CPUs, as a sidecar would.
//! Traffic stays on 127.0.0.1, every port is 0, every wait is bounded.
//!
//! `cargo bench --bench gateway`

use std::cell::RefCell;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, SamplingMode, criterion_group, criterion_main};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use idemgate::config::Config;
use idemgate::server::Gateway;
use sha2::{Digest, Sha256};
use tempfile::TempDir;
use tokio::net::TcpListener;
use tokio::runtime::Runtime;
use tokio::task::JoinSet;

/// Upper bound for any single request, start or shutdown.
const WAIT: Duration = Duration::from_secs(15);
/// Concurrent identical requests in one retry storm.
const STORM: usize = 64;
const WRITE_PATH: &str = "/v1/orders";
const READ_PATH: &str = "/v1/orders/1";
const BODY: &str =
    r#"{"amount":1000,"currency":"eur","description":"bench order","customer":"cus_42"}"#;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

// ---------------------------------------------------------------- upstream

/// A tiny HTTP/1.1 upstream: answers every request 201 with a small JSON
/// body and counts writes (anything but GET/HEAD). Stops when dropped.
struct Upstream {
    addr: SocketAddr,
    writes: Arc<AtomicUsize>,
    accept: tokio::task::JoinHandle<()>,
}

impl Upstream {
    async fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("upstream addr");
        let writes = Arc::new(AtomicUsize::new(0));
        let counter = writes.clone();
        let accept = tokio::spawn(async move {
            // Connections live inside this task's JoinSet: aborting it on
            // drop closes them all.
            let mut connections = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let counter = counter.clone();
                connections.spawn(async move {
                    let service = service_fn(move |req| answer(counter.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
                while connections.try_join_next().is_some() {}
            }
        });
        Upstream {
            addr,
            writes,
            accept,
        }
    }

    fn writes(&self) -> usize {
        self.writes.load(Ordering::SeqCst)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn answer(
    writes: Arc<AtomicUsize>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let is_write = !matches!(*req.method(), Method::GET | Method::HEAD);
    // Read the whole body, as a real API would before acting.
    let _ = req.into_body().collect().await;
    let id = if is_write {
        writes.fetch_add(1, Ordering::SeqCst) + 1
    } else {
        0
    };
    let body = format!(r#"{{"id":"ord_{id}","status":"created","amount":1000}}"#);
    Ok(Response::builder()
        .status(StatusCode::CREATED)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("response"))
}

// ----------------------------------------------------------------- gateway

/// An in-process gateway on its own SQLite file.
struct TestGateway {
    gateway: Gateway,
    // Dropped after the gateway has shut down (see `shutdown`).
    _dir: TempDir,
}

impl TestGateway {
    /// `route_extra`: TOML lines appended to the route table.
    async fn start(upstream: SocketAddr, durability: &str, route_extra: &str) -> TestGateway {
        let dir = tempfile::tempdir().expect("tempdir");
        let toml = format!(
            r#"[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[store]
url = "sqlite://{store}"
durability = "{durability}"

[[routes]]
name = "api"
path_prefix = "/"
upstream = "http://{upstream}"
{route_extra}
"#,
            store = dir.path().join("idemgate.db").display(),
        );
        let config = Config::from_toml_str(&toml, "bench.toml")
            .unwrap_or_else(|e| panic!("bench config rejected: {e}\n{toml}"));
        let gateway = tokio::time::timeout(WAIT, Gateway::start(config))
            .await
            .expect("gateway start timed out")
            .unwrap_or_else(|e| panic!("gateway failed to start: {e}"));
        TestGateway { gateway, _dir: dir }
    }

    fn addr(&self) -> SocketAddr {
        self.gateway.addr()
    }

    async fn shutdown(self) {
        tokio::time::timeout(WAIT, self.gateway.shutdown())
            .await
            .expect("gateway shutdown timed out");
    }
}

// ------------------------------------------------------------------ client

/// A pooled keep-alive client, as an SDK would hold one.
fn client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new()).build(connector)
}

fn post(addr: SocketAddr, key: &str) -> Request<Full<Bytes>> {
    Request::builder()
        .method(Method::POST)
        .uri(format!("http://{addr}{WRITE_PATH}"))
        .header("content-type", "application/json")
        .header("authorization", "Bearer bench-token")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(BODY.as_bytes())))
        .expect("request")
}

fn get(addr: SocketAddr) -> Request<Full<Bytes>> {
    Request::builder()
        .method(Method::GET)
        .uri(format!("http://{addr}{READ_PATH}"))
        .body(Full::new(Bytes::new()))
        .expect("request")
}

/// A response as the client saw it.
struct Reply {
    status: StatusCode,
    replayed: bool,
    body: Bytes,
}

impl Reply {
    fn is_fresh_created(&self) -> bool {
        self.status == StatusCode::CREATED && !self.replayed
    }

    fn is_replayed_created(&self) -> bool {
        self.status == StatusCode::CREATED && self.replayed
    }

    fn describe(&self) -> String {
        format!(
            "{} replayed={} {}",
            self.status,
            self.replayed,
            String::from_utf8_lossy(&self.body)
        )
    }
}

/// Sends `req` and reads the whole response; panics after [`WAIT`].
async fn exchange(client: &HttpClient, req: Request<Full<Bytes>>) -> Reply {
    let round_trip = async {
        let resp = client.request(req).await.expect("request failed");
        let replayed = resp
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .expect("response body")
            .to_bytes();
        Reply {
            status,
            replayed,
            body,
        }
    };
    tokio::time::timeout(WAIT, round_trip)
        .await
        .expect("request timed out")
}

/// A key no earlier request in this run used. It starts with 16 hex digits
/// of a digest of its number, so keys land at random places in the store's
/// identity index as SDKs' UUIDs do (a counter's keys would share a few
/// index pages and understate a first write's cost).
fn fresh_key(label: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let digest = Sha256::digest(n.to_be_bytes());
    let spread = u64::from_be_bytes(digest[..8].try_into().expect("8 bytes"));
    format!("{spread:016x}-{label}-{n}")
}

// ------------------------------------------------------------------ storms

/// How the clients of a set of storms were answered.
#[derive(Default, Debug)]
struct StormTally {
    storms: usize,
    fresh: usize,
    replayed: usize,
    in_progress: usize,
}

/// Sends [`STORM`] identical POSTs with `key` at once; returns when all are
/// answered.
async fn storm(client: &HttpClient, addr: SocketAddr, key: &str) -> Vec<Reply> {
    let mut set = JoinSet::new();
    for _ in 0..STORM {
        let client = client.clone();
        let req = post(addr, key);
        set.spawn(async move { exchange(&client, req).await });
    }
    let mut replies = Vec::with_capacity(STORM);
    while let Some(reply) = set.join_next().await {
        replies.push(reply.expect("storm request task"));
    }
    replies
}

/// Times storms through the gateway at `addr`, tallying the answers outside
/// the timing.
fn bench_gateway_storm(
    group: &mut BenchmarkGroup<'_, WallTime>,
    rt: &Runtime,
    name: &str,
    client: &HttpClient,
    addr: SocketAddr,
) -> StormTally {
    // RefCell: the routine's futures run one at a time on criterion's thread.
    let tally = RefCell::new(StormTally::default());
    group.bench_function(name, |b| {
        b.to_async(rt).iter_custom(|iters| {
            let tally = &tally;
            async move {
                let mut elapsed = Duration::ZERO;
                for _ in 0..iters {
                    let key = fresh_key(name);
                    let start = Instant::now();
                    let replies = storm(client, addr, &key).await;
                    elapsed += start.elapsed();
                    tally.borrow_mut().add(&replies);
                }
                elapsed
            }
        })
    });
    tally.into_inner()
}

impl StormTally {
    /// Counts one storm's answers; panics unless exactly one is a fresh 201
    /// and every other is a replay or a 409 `request-in-progress`.
    fn add(&mut self, replies: &[Reply]) {
        self.storms += 1;
        let mut fresh = 0;
        for reply in replies {
            if reply.is_fresh_created() {
                fresh += 1;
            } else if reply.is_replayed_created() {
                self.replayed += 1;
            } else if reply.status == StatusCode::CONFLICT
                && reply
                    .body
                    .windows(b"request-in-progress".len())
                    .any(|w| w == b"request-in-progress")
            {
                self.in_progress += 1;
            } else {
                panic!("unexpected storm answer: {}", reply.describe());
            }
        }
        assert_eq!(fresh, 1, "exactly one client of a storm gets the fresh 201");
        self.fresh += fresh;
    }
}

// ------------------------------------------------------------------ benches

fn end_to_end(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let (upstream, normal, full, wait) = rt.block_on(async {
        let upstream = Upstream::start().await;
        let normal = TestGateway::start(upstream.addr, "normal", "").await;
        let full = TestGateway::start(upstream.addr, "full", "").await;
        let wait = TestGateway::start(upstream.addr, "normal", r#"in_progress = "wait""#).await;
        (upstream, normal, full, wait)
    });
    let client = client();
    let direct = upstream.addr;

    // (a) Pass-through baseline, and the streamed GET through the gateway.
    let mut group = c.benchmark_group("passthrough");
    group.bench_function("direct_post", |b| {
        b.to_async(&rt).iter(|| async {
            let reply = exchange(&client, post(direct, "direct")).await;
            assert!(reply.is_fresh_created(), "{}", reply.describe());
        })
    });
    group.bench_function("direct_get", |b| {
        b.to_async(&rt).iter(|| async {
            let reply = exchange(&client, get(direct)).await;
            assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.describe());
        })
    });
    group.finish();

    let mut group = c.benchmark_group("gateway_get");
    let writes_before = upstream.writes();
    group.bench_function("streamed", |b| {
        b.to_async(&rt).iter(|| async {
            let reply = exchange(&client, get(normal.addr())).await;
            assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.describe());
        })
    });
    group.finish();
    assert_eq!(upstream.writes(), writes_before, "GETs are not writes");

    // (b) First write: a new key each iteration, per durability.
    let mut group = c.benchmark_group("first_write");
    for (name, gateway) in [("normal", &normal), ("full", &full)] {
        let sent = AtomicUsize::new(0);
        let writes_before = upstream.writes();
        group.bench_function(name, |b| {
            b.to_async(&rt).iter(|| async {
                let key = fresh_key(name);
                let reply = exchange(&client, post(gateway.addr(), &key)).await;
                assert!(reply.is_fresh_created(), "{}", reply.describe());
                sent.fetch_add(1, Ordering::Relaxed);
            })
        });
        assert_eq!(
            upstream.writes() - writes_before,
            sent.load(Ordering::Relaxed),
            "first_write/{name}: one upstream write per new key"
        );
    }
    group.finish();

    // (c) Replay: the same key again after the first; nothing goes upstream.
    let mut group = c.benchmark_group("replay");
    for (name, gateway) in [("normal", &normal), ("full", &full)] {
        let key = fresh_key("replay");
        let first = rt.block_on(exchange(&client, post(gateway.addr(), &key)));
        assert!(first.is_fresh_created(), "{}", first.describe());
        let writes_before = upstream.writes();
        group.bench_function(name, |b| {
            b.to_async(&rt).iter(|| async {
                let reply = exchange(&client, post(gateway.addr(), &key)).await;
                assert!(reply.is_replayed_created(), "{}", reply.describe());
                assert_eq!(reply.body, first.body, "replayed body");
            })
        });
        assert_eq!(
            upstream.writes(),
            writes_before,
            "replay/{name}: nothing sent upstream"
        );
    }
    group.finish();

    // (d) Retry storm: 64 identical concurrent requests, one key.
    let mut group = c.benchmark_group("retry_storm_64");
    // A storm takes milliseconds: flat sampling keeps the iteration count
    // (and the run time) bounded.
    group.sampling_mode(SamplingMode::Flat);
    group.sample_size(20);
    let writes_before = upstream.writes();
    let direct_storms = AtomicUsize::new(0);
    group.bench_function("direct", |b| {
        b.to_async(&rt).iter(|| async {
            let replies = storm(&client, direct, "direct-storm").await;
            assert!(replies.iter().all(Reply::is_fresh_created));
            direct_storms.fetch_add(1, Ordering::Relaxed);
        })
    });
    let direct_storms = direct_storms.load(Ordering::Relaxed);
    assert_eq!(
        upstream.writes() - writes_before,
        direct_storms * STORM,
        "without the gateway every request of a storm is a write"
    );
    for (name, gateway) in [
        ("gateway_normal", &normal),
        ("gateway_full", &full),
        ("gateway_wait", &wait),
    ] {
        let writes_before = upstream.writes();
        let tally = bench_gateway_storm(&mut group, &rt, name, &client, gateway.addr());
        let writes = upstream.writes() - writes_before;
        // Outside the timing: exactly one upstream write per storm.
        assert_eq!(
            writes, tally.storms,
            "{name}: {tally:?}, upstream writes {writes}"
        );
        assert_eq!(
            tally.fresh + tally.replayed + tally.in_progress,
            tally.storms * STORM,
            "{name}: every request answered"
        );
        if name == "gateway_wait" {
            assert_eq!(
                tally.in_progress, 0,
                "{name}: waiters get the outcome, not 409"
            );
        }
        eprintln!(
            "retry_storm_64/{name}: {} storms, {} upstream writes; answers: {} fresh 201, \
             {} replayed 201, {} 409 request-in-progress",
            tally.storms, writes, tally.fresh, tally.replayed, tally.in_progress
        );
    }
    eprintln!(
        "retry_storm_64/direct: {direct_storms} storms, {} upstream writes",
        direct_storms * STORM
    );
    group.finish();

    drop(client);
    rt.block_on(async {
        normal.shutdown().await;
        full.shutdown().await;
        wait.shutdown().await;
    });
    drop(upstream);
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .sample_size(30);
    targets = end_to_end
}
criterion_main!(benches);
