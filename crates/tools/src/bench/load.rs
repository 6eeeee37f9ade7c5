//! The load: C workers share one pooled keep-alive client (nodelay) and
//! take the [`Plan`]'s requests in order, each sent to the next target
//! round-robin; every answer is timed and named by its outcome.
//!
//! Invariant: the run is bounded in count (the plan's requests) and in time
//! (its duration, if any, and [`REQUEST_WAIT`] per request), and nothing is
//! sent anywhere but the given targets. Every request taken from the plan
//! is sent, so the requests sent are the plan's first `n`, and
//! [`Plan::keys_in`] counts their keys.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use http::header::{AUTHORIZATION, CONTENT_TYPE};
use http::{Request, Response, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::task::JoinSet;

use super::BenchError;
use super::counters::Counters;
use super::plan::{Plan, Shot};
use super::progress::Progress;

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A request still unanswered after this is counted as `timeout`: longer
/// than the gateway's default `wait_timeout` (10 s), so a waiting
/// duplicate gets its answer first.
pub(crate) const REQUEST_WAIT: Duration = Duration::from_secs(30);
/// Latencies are recorded in µs up to this; longer ones are clamped to it.
const LATENCY_MAX_US: u64 = 60_000_000;
/// Problem bodies are small; the name is all the bench reads of them.
const PROBLEM_MAX_BYTES: usize = 64 * 1024;
/// Sent on every request: gateways scope keys by it and refuse
/// anonymous writes by default.
const AUTHORIZATION_VALUE: &str = "Bearer idemgate-bench";

/// A keep-alive pool of `concurrency` connections per target, Nagle off:
/// small requests leave at once instead of waiting for an ACK.
pub fn client(concurrency: usize) -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(concurrency)
        .build(connector)
}

/// Where requests go: `http://host:port/path` (the path defaults to
/// `/orders`, the plan's fault paths are appended to it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    base: String,
}

impl Target {
    pub fn parse(url: &str) -> Result<Target, BenchError> {
        let bad = |reason: &str| BenchError::Target {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        let uri: Uri = url.parse().map_err(|_| bad("not a URL"))?;
        if uri.scheme_str() != Some("http") {
            return Err(bad(
                "only http:// targets (the bench speaks plain HTTP/1.1)",
            ));
        }
        let authority = uri.authority().ok_or_else(|| bad("no host"))?;
        if uri.query().is_some() {
            return Err(bad("no query string: the bench appends its own paths"));
        }
        let path = match uri.path().trim_end_matches('/') {
            "" => "/orders",
            path => path,
        };
        Ok(Target {
            base: format!("http://{authority}{path}"),
        })
    }

    pub fn url(&self) -> &str {
        &self.base
    }
}

/// What a run measured.
#[derive(Debug)]
pub struct Measured {
    pub(crate) requests: u64,
    /// Distinct keys among the requests sent.
    pub(crate) keys: u64,
    pub(crate) elapsed: Duration,
    /// Latency of every request, whatever its outcome, in µs.
    pub(crate) latency: Histogram<u64>,
    /// Requests by outcome name (see [`outcome`]).
    pub(crate) outcomes: BTreeMap<String, u64>,
}

/// Sends `plan` to `targets` and measures it.
pub async fn run(
    client: &HttpClient,
    targets: &[Target],
    plan: &Plan,
    progress: Progress,
) -> Result<Measured, BenchError> {
    let targets: Arc<[Target]> = targets.into();
    let plan = Arc::new(plan.clone());
    let counters = Arc::new(Counters::default());
    let started = Instant::now();
    let deadline = plan.duration.map(|d| started + d);
    let shown = progress.start(counters.clone(), plan.clone(), started);
    let mut workers = JoinSet::new();
    for _ in 0..plan.concurrency {
        let worker = Worker {
            client: client.clone(),
            targets: targets.clone(),
            plan: plan.clone(),
            counters: counters.clone(),
            deadline,
            latency: new_histogram()?,
            outcomes: HashMap::new(),
        };
        workers.spawn(worker.run());
    }
    let mut latency = new_histogram()?;
    let mut outcomes = BTreeMap::new();
    while let Some(joined) = workers.join_next().await {
        let (worker_latency, worker_outcomes) =
            joined.map_err(|e| BenchError::Worker(e.to_string()))?;
        latency
            .add(&worker_latency)
            .map_err(|e| BenchError::Worker(e.to_string()))?;
        for (name, count) in worker_outcomes {
            *outcomes.entry(name).or_insert(0) += count;
        }
    }
    let elapsed = started.elapsed();
    shown.finish().await;
    let requests = counters.next.load(Ordering::Relaxed).min(plan.requests);
    Ok(Measured {
        requests,
        keys: plan.keys_in(requests),
        elapsed,
        latency,
        outcomes,
    })
}

fn new_histogram() -> Result<Histogram<u64>, BenchError> {
    Histogram::new_with_bounds(1, LATENCY_MAX_US, 3).map_err(|e| BenchError::Worker(e.to_string()))
}

struct Worker {
    client: HttpClient,
    targets: Arc<[Target]>,
    plan: Arc<Plan>,
    counters: Arc<Counters>,
    deadline: Option<Instant>,
    latency: Histogram<u64>,
    outcomes: HashMap<String, u64>,
}

impl Worker {
    /// Takes requests until the plan or its time runs out.
    async fn run(mut self) -> (Histogram<u64>, HashMap<String, u64>) {
        loop {
            // The clock is read before a request is taken, so every request
            // taken is sent: the requests sent are a prefix of the plan.
            if self.deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
            let j = self.counters.next.fetch_add(1, Ordering::Relaxed);
            if j >= self.plan.requests {
                break;
            }
            let target = &self.targets[(j % self.targets.len() as u64) as usize];
            let sent = Instant::now();
            let outcome =
                tokio::time::timeout(REQUEST_WAIT, send(&self.client, target, self.plan.shot(j)))
                    .await
                    .unwrap_or_else(|_| Outcome::failed(TIMEOUT));
            let micros = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
            self.latency
                .saturating_record(micros.clamp(1, LATENCY_MAX_US));
            if !outcome.success {
                self.counters.not_ok.fetch_add(1, Ordering::Relaxed);
            }
            self.counters.done.fetch_add(1, Ordering::Relaxed);
            match self.outcomes.get_mut(&outcome.name) {
                Some(count) => *count += 1,
                None => {
                    self.outcomes.insert(outcome.name, 1);
                }
            }
        }
        (self.latency, self.outcomes)
    }
}

/// A request's outcome, named for the report.
struct Outcome {
    name: String,
    /// A 2xx: a fresh write or a replay.
    success: bool,
}

/// The outcome of a request that got no HTTP answer: no connection, or a
/// broken one.
pub(crate) const TRANSPORT_ERROR: &str = "transport error";
/// The outcome of a request that got no answer in time.
pub(crate) const TIMEOUT: &str = "timeout";

impl Outcome {
    fn failed(name: &str) -> Outcome {
        Outcome {
            name: name.to_string(),
            success: false,
        }
    }
}

/// Sends one request and names its outcome.
async fn send(client: &HttpClient, target: &Target, shot: Shot) -> Outcome {
    let request = Request::post(format!("{}{}", target.base, shot.suffix))
        .header(AUTHORIZATION, AUTHORIZATION_VALUE)
        .header("idempotency-key", shot.key)
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(shot.body));
    let request = match request {
        Ok(request) => request,
        Err(_) => return Outcome::failed("invalid request"),
    };
    match client.request(request).await {
        Ok(response) => outcome(response).await,
        Err(_) => Outcome::failed(TRANSPORT_ERROR),
    }
}

/// Names an answer: `fresh 201`, `replayed 201`, `409 request-in-progress`
/// (the problem's name, for idemgate's own answers), `404` (any other
/// answer), or `transport error` when the answer broke off.
async fn outcome(response: Response<Incoming>) -> Outcome {
    let status = response.status();
    let header = |name| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    };
    let replayed = header("idempotent-replayed") == "true";
    let problem = header(CONTENT_TYPE.as_str()).starts_with("application/problem+json");
    let code = status.as_u16();
    // Read to the end either way: only a fully read answer frees its
    // connection for the pool.
    let name = if problem {
        let Ok(body) = Limited::new(response.into_body(), PROBLEM_MAX_BYTES)
            .collect()
            .await
        else {
            return Outcome::failed(TRANSPORT_ERROR);
        };
        let value = serde_json::from_slice::<serde_json::Value>(&body.to_bytes()).ok();
        let name = value.as_ref().and_then(|v| {
            v["type"]
                .as_str()
                .and_then(|t| t.strip_prefix("urn:idemgate:problem:"))
        });
        match name {
            Some(name) => format!("{code} {name}"),
            None => code.to_string(),
        }
    } else {
        let mut body = response.into_body();
        while let Some(frame) = body.frame().await {
            if frame.is_err() {
                return Outcome::failed(TRANSPORT_ERROR);
            }
        }
        match (status.is_success(), replayed) {
            (true, true) => format!("replayed {code}"),
            (true, false) => format!("fresh {code}"),
            (false, _) => code.to_string(),
        }
    };
    Outcome {
        name,
        success: status.is_success(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_default_their_path_and_refuse_what_the_bench_cannot_send() {
        let url = |u: &str| Target::parse(u).map(|t| t.url().to_string());
        assert_eq!(
            url("http://127.0.0.1:8080").ok().as_deref(),
            Some("http://127.0.0.1:8080/orders")
        );
        assert_eq!(
            url("http://127.0.0.1:8080/v1/tasks/").ok().as_deref(),
            Some("http://127.0.0.1:8080/v1/tasks")
        );
        assert!(url("https://127.0.0.1:8443").is_err());
        assert!(url("http://127.0.0.1:8080/x?y=1").is_err());
        assert!(url("127.0.0.1:8080").is_err());
    }
}
