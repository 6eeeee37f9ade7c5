//! Prometheus metrics (`GET /metrics` on the admin listener), every one named
//! `idemgate_*`, with a registry per gateway so two gateways in one process
//! never mix their counts.
//!
//! Counters and the latency histogram move on the request path; the
//! operation gauges are read from the store at scrape time, since the store
//! is the only truth about operations: from counts it keeps with every
//! write, so a scrape costs the same at any table size. No label carries payload data: route
//! names, outcomes and states only.
//!
//! Invariant: a scrape never fails as a whole. The process's own series
//! (kept in memory) are always exported; the gauges read from the store
//! are exported only when the store answered within [`STORE_READ_BOUND`],
//! and `idemgate_store_up` (1 or 0) says which. A store outage is when
//! operators need the counters most (`idemgate_store_errors_total`), so a
//! scrape must not share the store's fate. At most one store read is in
//! flight per gateway: a scrape that finds the last one still waiting on a
//! stalled store reports the store down at once instead of queuing another.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Metric, Registry};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use idemgate_model::operation::State;
use idemgate_store::Operators;
use idemgate_store::{Stats, StoreBatches, StoreError};

/// How long a scrape waits for the store's gauges before it answers
/// without them (`idemgate_store_up 0`). A healthy store answers these two
/// reads (a count over the operations table, the paused routes) in
/// milliseconds; one second leaves a loaded store room without being
/// mistaken for an outage, and keeps the
/// scrape far inside Prometheus's default 10 s `scrape_timeout`, so the
/// counters arrive while the store stalls.
pub const STORE_READ_BOUND: Duration = Duration::from_secs(1);

/// What a scrape reads from the store: operation counts and paused routes.
#[derive(Debug, Clone, Default)]
pub struct StoreGauges {
    pub(crate) stats: Stats,
    pub(crate) paused: Vec<String>,
}

/// Why a scrape exports no store gauges.
#[derive(Debug, thiserror::Error)]
pub enum StoreUnread {
    #[error(transparent)]
    Failed(#[from] StoreError),
    #[error(
        "the store did not answer within {}",
        humantime::format_duration(STORE_READ_BOUND)
    )]
    Late,
    #[error("the previous scrape's store read is still waiting for the store")]
    StillWaiting,
}

/// `metric`, registered in `registry` as `name` with `help`, to be kept
/// and moved.
fn registered<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// How an intercepted request ended, for metrics and the request log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
#[allow(non_camel_case_types)] // label values are written as they appear
pub enum Outcome {
    /// Sent upstream and completed.
    forwarded,
    /// Answered from the store.
    replayed,
    /// Another request with the key is in flight or held `unknown`, or it
    /// cannot be replayed: answered from what exists, nothing sent.
    conflict,
    /// The key was used for a different request.
    mismatch,
    /// Refused before anything was sent (bad input, paused, store down,
    /// a replica's lease lost).
    rejected,
    /// This attempt was sent, and its outcome is unknown.
    unknown,
    /// Nothing reached the upstream, or it released the key (429/503).
    released,
    /// Not a write this route intercepts: streamed through.
    proxied,
    /// A client asked how its operation stands (`/.idemgate/operations/…`).
    lookup,
}

impl Outcome {
    /// Every outcome, in declaration order (`outcome as usize` indexes it).
    pub const ALL: [Outcome; 9] = [
        Outcome::forwarded,
        Outcome::replayed,
        Outcome::conflict,
        Outcome::mismatch,
        Outcome::rejected,
        Outcome::unknown,
        Outcome::released,
        Outcome::proxied,
        Outcome::lookup,
    ];

    /// The outcome as its label and the request log write it.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::forwarded => "forwarded",
            Outcome::replayed => "replayed",
            Outcome::conflict => "conflict",
            Outcome::mismatch => "mismatch",
            Outcome::rejected => "rejected",
            Outcome::unknown => "unknown",
            Outcome::released => "released",
            Outcome::proxied => "proxied",
            Outcome::lookup => "lookup",
        }
    }
}

/// A background task of the gateway, for the count of its passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
#[allow(non_camel_case_types)] // label values are written as they appear
pub enum Task {
    /// The sweep that deletes expired operations.
    retention,
    /// The alert deliverer's poll of the outbox.
    alerts,
    /// A replica's look for lost peers and at the pauses, on a shared
    /// store.
    replicas,
}

/// Marks a response that says the store failed (503 `store-unavailable`),
/// for the store-errors counter.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StoreFailure;

/// The operation a response is about, carried as a response extension for
/// the request log.
#[derive(Debug, Clone)]
pub(crate) struct OperationId(pub String);

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    route: String,
    outcome: Outcome,
}

/// A write's answer from the upstream: its route and status class.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct AnswerLabels {
    route: String,
    class: &'static str,
}

/// The classes of a final answer's status, `upstream_answers`' label.
const ANSWER_CLASSES: [&str; 4] = ["2xx", "3xx", "4xx", "5xx"];

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RouteLabels {
    route: String,
}

impl RouteLabels {
    fn of(route: &str) -> Self {
        RouteLabels {
            route: route.to_string(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct VerdictLabels {
    route: String,
    verdict: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ListenerLabels {
    listener: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StateLabels {
    route: String,
    state: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DeliveryLabels {
    outcome: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TaskLabels {
    task: Task,
}

/// One route's series on the request path, looked up once: a request is
/// counted with one atomic add, with no label hashed, no `String` made and
/// no lock taken on the family's map, which both workers' requests
/// otherwise share (a cache line passed between the cores per request).
/// A request counter not created at start ([`Metrics::start_at_zero`]) is
/// created at its first request, as through [`Metrics::request`], so
/// `/metrics` lists the same series.
pub struct RouteSeries {
    route: String,
    requests: Family<RequestLabels, Counter>,
    by_outcome: [OnceLock<Counter>; Outcome::ALL.len()],
    upstream_seconds: Histogram,
    /// By [`ANSWER_CLASSES`].
    answers: [Counter; ANSWER_CLASSES.len()],
}

impl RouteSeries {
    pub fn request(&self, outcome: Outcome) {
        self.by_outcome[outcome as usize]
            .get_or_init(|| {
                self.requests
                    .get_or_create(&RequestLabels {
                        route: self.route.clone(),
                        outcome,
                    })
                    .clone()
            })
            .inc();
    }

    pub(crate) fn upstream_duration(&self, seconds: f64) {
        self.upstream_seconds.observe(seconds);
    }

    /// A write's final answer from the upstream, of `status`, whatever
    /// became of the write (a 503 released, a 502 held, a 500 completed).
    pub(crate) fn upstream_answer(&self, status: u16) {
        let class = usize::from(status / 100).checked_sub(2);
        if let Some(counter) = class.and_then(|class| self.answers.get(class)) {
            counter.inc();
        }
    }
}

pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    upstream_seconds: Family<RouteLabels, Histogram>,
    late_responses: Family<RouteLabels, Counter>,
    upstream_answers: Family<AnswerLabels, Counter>,
    probe_verdicts: Family<VerdictLabels, Counter>,
    connect_retries: Family<RouteLabels, Counter>,
    refused_connections: Family<ListenerLabels, Counter>,
    store_errors: Family<RouteLabels, Counter>,
    alert_deliveries: Family<DeliveryLabels, Counter>,
    background_passes: Family<TaskLabels, Counter>,
    /// Moved by the traces' exporter, which is handed a clone.
    trace_spans_dropped: Counter,
    /// Held by the one store read in flight, until the store answers (even
    /// past [`STORE_READ_BOUND`]); tokio's Mutex for `try_lock_owned`, which
    /// moves the guard into the read's task.
    store_read: Arc<tokio::sync::Mutex<()>>,
    /// The configured routes ([`Metrics::start_at_zero`]), whose store
    /// gauges each scrape that reads the store exports, at zero if need be.
    routes: std::sync::Mutex<Vec<String>>,
}

impl Metrics {
    /// The gateway's metrics, with its store's `batches`.
    pub fn new(batches: &StoreBatches) -> Self {
        let mut registry = Registry::with_prefix("idemgate");
        registry.register(
            "store_batch_calls",
            "Calls (claims, records, other writes) committed together in one store batch",
            batches.calls().clone(),
        );
        registry.register(
            "store_commit_duration_seconds",
            "Time to run and commit one store batch, fsync included",
            batches.seconds().clone(),
        );
        let requests = registered(
            &mut registry,
            "requests",
            "Intercepted and proxied requests by route and outcome",
            Family::default(),
        );
        let upstream_seconds = registered(
            &mut registry,
            "upstream_duration_seconds",
            "Time from handing a write to the upstream until its outcome",
            Family::<RouteLabels, Histogram>::new_with_constructor(|| {
                Histogram::new([
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                ])
            }),
        );
        let late_responses = registered(
            &mut registry,
            "late_responses",
            "Responses that arrived after their operation had left in_progress",
            Family::default(),
        );
        let upstream_answers = registered(
            &mut registry,
            "upstream_answers",
            "Writes' answers from the upstream by route and status class (2xx, 3xx, 4xx, 5xx), whatever became of the write: a 503 released, a 502 held, a 500 completed and replayed",
            Family::default(),
        );
        let probe_verdicts = registered(
            &mut registry,
            "probe_verdicts",
            "Reconcile probes of held operations by route and verdict: found, absent, duplicated (more than once at the destination), undetermined",
            Family::default(),
        );
        let connect_retries = registered(
            &mut registry,
            "upstream_connect_retries",
            "Writes' connects to the upstream that failed before anything was written and were tried again (connect_retries)",
            Family::default(),
        );
        let refused_connections = registered(
            &mut registry,
            "refused_connections",
            "Connections refused (503 overloaded, or closed) because their listener was at its cap, or reset unread because the process was out of file descriptors",
            Family::default(),
        );
        let store_errors = registered(
            &mut registry,
            "store_errors",
            "Requests answered 503 store-unavailable: the store failed or did not answer in time",
            Family::default(),
        );
        let alert_deliveries = registered(
            &mut registry,
            "alert_deliveries",
            "Alert webhook deliveries by outcome: delivered, failed (due again later), gave_up",
            Family::default(),
        );
        let background_passes = registered(
            &mut registry,
            "background_passes",
            "Passes of the background tasks that ran to their end without a store error, by task: retention (the sweep), alerts (a poll of the outbox), replicas (a look for lost peers and at the pauses, on a shared store)",
            Family::default(),
        );
        let trace_spans_dropped = Counter::default();
        registry.register(
            "trace_spans_dropped",
            "Trace spans never exported: the export queue (OTEL_BSP_MAX_QUEUE_SIZE) was full, or the collector refused or did not answer their batch",
            trace_spans_dropped.clone(),
        );
        Metrics {
            registry,
            requests,
            upstream_seconds,
            late_responses,
            upstream_answers,
            probe_verdicts,
            connect_retries,
            refused_connections,
            store_errors,
            alert_deliveries,
            background_passes,
            trace_spans_dropped,
            store_read: Arc::default(),
            routes: std::sync::Mutex::default(),
        }
    }

    /// Creates at zero every series whose labels are known at start (each
    /// route's, each listener's), so they are exported — and `rate()` over
    /// them works — before their first event.
    pub(crate) fn start_at_zero<'a>(&self, routes: impl IntoIterator<Item = &'a str>) {
        let mut known = self.routes.lock().unwrap_or_else(|e| e.into_inner());
        for route in routes {
            if !known.iter().any(|k| k == route) {
                known.push(route.to_string());
            }
            let labels = RouteLabels::of(route);
            // Creating the child is the point; its guard is dropped at once.
            drop(self.upstream_seconds.get_or_create(&labels));
            drop(self.late_responses.get_or_create(&labels));
            drop(self.connect_retries.get_or_create(&labels));
            drop(self.store_errors.get_or_create(&labels));
            for class in ANSWER_CLASSES {
                let route = route.to_string();
                drop(
                    self.upstream_answers
                        .get_or_create(&AnswerLabels { route, class }),
                );
            }
            for outcome in Outcome::ALL {
                let route = route.to_string();
                drop(
                    self.requests
                        .get_or_create(&RequestLabels { route, outcome }),
                );
            }
        }
        for outcome in ["delivered", "failed", "gave_up"] {
            drop(
                self.alert_deliveries
                    .get_or_create(&DeliveryLabels { outcome }),
            );
        }
        for listener in ["proxy", "admin"] {
            drop(
                self.refused_connections
                    .get_or_create(&ListenerLabels { listener }),
            );
        }
        for task in [Task::retention, Task::alerts, Task::replicas] {
            drop(self.background_passes.get_or_create(&TaskLabels { task }));
        }
    }

    /// Where the traces' exporter counts the spans it could not export.
    pub(crate) fn trace_spans_dropped(&self) -> Counter {
        self.trace_spans_dropped.clone()
    }

    /// `route`'s request counters and upstream histogram, for the request
    /// path to count through without a look-up per request.
    pub(crate) fn route_series(&self, route: &str) -> RouteSeries {
        RouteSeries {
            route: route.to_string(),
            requests: self.requests.clone(),
            by_outcome: Default::default(),
            upstream_seconds: self
                .upstream_seconds
                .get_or_create(&RouteLabels::of(route))
                .clone(),
            answers: ANSWER_CLASSES.map(|class| {
                let route = route.to_string();
                self.upstream_answers
                    .get_or_create(&AnswerLabels { route, class })
                    .clone()
            }),
        }
    }

    /// A request on no route (or one counted without its [`RouteSeries`]).
    pub fn request(&self, route: &str, outcome: Outcome) {
        self.requests
            .get_or_create(&RequestLabels {
                route: route.to_string(),
                outcome,
            })
            .inc();
    }

    pub fn late_response(&self, route: &str) {
        self.late_responses
            .get_or_create(&RouteLabels::of(route))
            .inc();
    }

    /// A probe of one of `route`'s held operations concluded `verdict`
    /// (`found`, `absent`, `duplicated`, `undetermined`).
    pub(crate) fn probe_verdict(&self, route: &str, verdict: &'static str) {
        self.probe_verdicts
            .get_or_create(&VerdictLabels {
                route: route.to_string(),
                verdict,
            })
            .inc();
    }

    /// A write's connect to `route`'s upstream failed unwritten and is
    /// tried again.
    pub(crate) fn connect_retry(&self, route: &str) {
        self.connect_retries
            .get_or_create(&RouteLabels::of(route))
            .inc();
    }

    /// A connection refused on `listener` (`proxy` or `admin`) at its cap,
    /// or out of file descriptors.
    pub(crate) fn refused_connection(&self, listener: &'static str) {
        self.refused_connections
            .get_or_create(&ListenerLabels { listener })
            .inc();
    }

    /// One alert delivery attempt ended so (`delivered`, `failed`,
    /// `gave_up`).
    pub(crate) fn alert_delivery(&self, outcome: &'static str) {
        self.alert_deliveries
            .get_or_create(&DeliveryLabels { outcome })
            .inc();
    }

    /// A pass of `task` ran to its end without a store error.
    pub(crate) fn background_pass(&self, task: Task) {
        self.background_passes
            .get_or_create(&TaskLabels { task })
            .inc();
    }

    /// A request on `route` answered 503 `store-unavailable`.
    pub(crate) fn store_error(&self, route: &str) {
        self.store_errors
            .get_or_create(&RouteLabels::of(route))
            .inc();
    }

    /// Reads the store's gauges for a scrape, within [`STORE_READ_BOUND`].
    pub(crate) async fn read_store(
        &self,
        store: Arc<dyn Operators>,
    ) -> Result<StoreGauges, StoreUnread> {
        let slot = Arc::clone(&self.store_read)
            .try_lock_owned()
            .map_err(|_| StoreUnread::StillWaiting)?;
        // A task of its own, not awaited in place: a read cut off by the
        // bound runs on to its end instead of being dropped mid-statement
        // (which would leave a pooled PostgreSQL connection to be drained
        // and a job in the SQLite writer's queue), holding the slot so no
        // second read piles up behind it.
        let read = tokio::spawn(async move {
            let _slot = slot;
            let (stats, paused) = tokio::try_join!(store.stats(), store.paused_routes())?;
            Ok::<_, StoreError>(StoreGauges { stats, paused })
        });
        match tokio::time::timeout(STORE_READ_BOUND, read).await {
            Err(_) => Err(StoreUnread::Late),
            Ok(Err(ended)) => Err(StoreError::Failed(format!("the read ended: {ended}")).into()),
            Ok(Ok(read)) => Ok(read?),
        }
    }

    /// The Prometheus text exposition as of `now` (ms): every process
    /// series, `idemgate_store_up`, and the operation and pause gauges when
    /// `store` holds what was read from the store.
    pub fn render(&self, store: Option<&StoreGauges>, now: i64) -> String {
        let mut text = String::new();
        let encoded = prometheus_client::encoding::text::encode_registry(&mut text, &self.registry)
            .and_then(|()| {
                let routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
                prometheus_client::encoding::text::encode_registry(
                    &mut text,
                    &store_registry(store, &routes, now),
                )
            })
            .and_then(|()| prometheus_client::encoding::text::encode_eof(&mut text));
        if encoded.is_err() {
            text.clear();
        }
        text
    }
}

/// The series of one scrape read from the store, in a registry of their
/// own made per scrape: a gauge that was not read is absent rather than
/// stale, and concurrent scrapes never share them.
/// Each of `routes` (the configured ones) has its pause gauge and its
/// count in each state, at zero when the store holds none.
fn store_registry(store: Option<&StoreGauges>, routes: &[String], now: i64) -> Registry {
    let mut registry = Registry::with_prefix("idemgate");
    let up = Gauge::<i64, std::sync::atomic::AtomicI64>::default();
    up.set(i64::from(store.is_some()));
    registry.register(
        "store_up",
        "1 when this scrape read the store's gauges (operations, oldest unknown age, paused routes) within its bound, 0 when the store failed or did not answer and they are left out",
        up,
    );
    let Some(StoreGauges { stats, paused }) = store else {
        return registry;
    };
    let route_paused = Family::<RouteLabels, Gauge>::default();
    for route in routes {
        drop(route_paused.get_or_create(&RouteLabels {
            route: route.clone(),
        }));
    }
    for route in paused {
        route_paused
            .get_or_create(&RouteLabels {
                route: route.clone(),
            })
            .set(1);
    }
    registry.register(
        "route_paused",
        "1 for each route the store holds paused (by an operator or the pause latch)",
        route_paused,
    );
    let operations = Family::<StateLabels, Gauge>::default();
    for route in routes {
        for state in State::ALL {
            drop(operations.get_or_create(&StateLabels {
                route: route.clone(),
                state: state.as_str().to_string(),
            }));
        }
    }
    for (route, state, count) in &stats.counts {
        operations
            .get_or_create(&StateLabels {
                route: route.clone(),
                state: state.as_str().to_string(),
            })
            .set(i64::try_from(*count).unwrap_or(i64::MAX));
    }
    registry.register(
        "operations",
        "Stored operations by route and state",
        operations,
    );
    let oldest_unknown_seconds = Gauge::<f64, AtomicU64>::default();
    oldest_unknown_seconds.set(
        stats
            .oldest_unknown_since
            .map_or(0.0, |since| (now - since).max(0) as f64 / 1000.0),
    );
    registry.register(
        "oldest_unknown_age_seconds",
        "How long the longest-held operation whose outcome is unknown has been unknown (0 when none)",
        oldest_unknown_seconds,
    );
    if let Some(replication) = &stats.replication {
        let flag = |on: bool| {
            let gauge = Gauge::<i64, std::sync::atomic::AtomicI64>::default();
            gauge.set(i64::from(on));
            gauge
        };
        registry.register(
            "store_in_recovery",
            "PostgreSQL: 1 when the server this replica writes to is in recovery (a standby, where nothing commits)",
            flag(replication.in_recovery),
        );
        let standbys = Gauge::<i64, std::sync::atomic::AtomicI64>::default();
        standbys.set(i64::from(replication.synchronous_standbys));
        registry.register(
            "store_synchronous_standbys",
            "PostgreSQL: synchronous standbys streaming from the server this replica writes to",
            standbys,
        );
        registry.register(
            "store_synchronous_standby_required",
            "PostgreSQL: 1 when writes are refused without a synchronous standby (store.require_synchronous_standby)",
            flag(replication.required),
        );
    }
    registry
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_routes_series_counts_where_a_look_up_counts() {
        let metrics = Metrics::new(&StoreBatches::new(&["write"]));
        let series = metrics.route_series("api");
        series.request(Outcome::replayed);
        series.request(Outcome::replayed);
        metrics.request("api", Outcome::replayed);
        metrics.request("other", Outcome::forwarded);
        series.upstream_duration(0.5);
        metrics.route_series("api").upstream_duration(0.25);
        let text = metrics.render(None, 0);
        for counted in [
            r#"idemgate_requests_total{route="api",outcome="replayed"} 3"#,
            r#"idemgate_requests_total{route="other",outcome="forwarded"} 1"#,
            r#"idemgate_upstream_duration_seconds_count{route="api"} 2"#,
            r#"idemgate_upstream_duration_seconds_sum{route="api"} 0.75"#,
        ] {
            assert!(text.contains(counted), "{counted} not in {text}");
        }
        // A counter appears at its first request, not before.
        assert!(
            !text.contains(r#"route="api",outcome="forwarded""#),
            "{text}"
        );
    }

    #[test]
    fn an_outcome_is_named_as_its_debug_writes_it_and_indexes_all() {
        for (index, outcome) in Outcome::ALL.into_iter().enumerate() {
            assert_eq!(outcome.name(), format!("{outcome:?}"));
            assert_eq!(outcome as usize, index);
        }
    }

    #[test]
    fn renders_counters_and_gauges() {
        let batches = StoreBatches::new(&["write"]);
        let metrics = Metrics::new(&batches);
        batches.observe("write", 3, Duration::from_micros(700));
        metrics.request("api", Outcome::forwarded);
        metrics.request("api", Outcome::forwarded);
        metrics.request("api", Outcome::replayed);
        metrics.route_series("api").upstream_duration(0.02);
        metrics.late_response("api");
        metrics.refused_connection("admin");
        metrics.store_error("api");
        metrics.start_at_zero(["api"]);
        metrics.background_pass(Task::alerts);
        let read = StoreGauges {
            stats: Stats {
                counts: vec![("api".into(), State::Unknown, 3)],
                oldest_unknown_since: Some(1_000),
                replication: None,
            },
            paused: vec!["api".into()],
        };
        let text = metrics.render(Some(&read), 11_000);
        assert!(
            text.contains(r#"idemgate_requests_total{route="api",outcome="forwarded"} 2"#),
            "{text}"
        );
        assert!(text.contains(r#"idemgate_requests_total{route="api",outcome="replayed"} 1"#));
        assert!(text.contains(r#"idemgate_upstream_duration_seconds_count{route="api"} 1"#));
        assert!(text.contains(r#"idemgate_late_responses_total{route="api"} 1"#));
        assert!(text.contains(r#"idemgate_refused_connections_total{listener="admin"} 1"#));
        assert!(text.contains(r#"idemgate_operations{route="api",state="unknown"} 3"#));
        assert!(text.contains(r#"idemgate_store_errors_total{route="api"} 1"#));
        assert!(text.contains(r#"idemgate_background_passes_total{task="alerts"} 1"#));
        assert!(text.contains(r#"idemgate_background_passes_total{task="retention"} 0"#));
        assert!(text.contains(r#"idemgate_route_paused{route="api"} 1"#));
        // Another configured route: not paused, nothing stored, yet there.
        metrics.start_at_zero(["other"]);
        let text = metrics.render(Some(&read), 11_000);
        assert!(
            text.contains(r#"idemgate_route_paused{route="other"} 0"#),
            "{text}"
        );
        assert!(text.contains(r#"idemgate_operations{route="other",state="completed"} 0"#));
        // Each of its outcomes, so that the first `unknown` after a start
        // is an increase to the shipped rules (a series born at 1 is none).
        for outcome in Outcome::ALL {
            let zero =
                format!(r#"idemgate_requests_total{{route="other",outcome="{outcome:?}"}} 0"#);
            assert!(text.contains(&zero), "{zero} not in {text}");
        }
        assert!(text.contains(r#"idemgate_operations{route="api",state="completed"} 0"#));
        assert!(text.contains("idemgate_oldest_unknown_age_seconds 10.0"));
        assert!(text.contains("idemgate_store_up 1\n"), "{text}");
        metrics.trace_spans_dropped().inc_by(2);
        let text = metrics.render(Some(&read), 11_000);
        assert!(
            text.contains("idemgate_trace_spans_dropped_total 2\n"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert!(text.contains(r#"idemgate_store_batch_calls_sum{batch="write"} 3.0"#));
        assert!(
            text.contains(
                r#"idemgate_store_commit_duration_seconds_bucket{le="0.001",batch="write"} 1"#
            ),
            "{text}"
        );
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            assert!(line.starts_with("idemgate_"), "{line}");
        }
    }

    #[test]
    fn renders_counters_without_the_store() {
        let metrics = Metrics::new(&StoreBatches::new(&["write"]));
        metrics.start_at_zero(["api"]);
        metrics.store_error("api");
        let text = metrics.render(None, 11_000);
        assert!(
            text.contains(r#"idemgate_store_errors_total{route="api"} 1"#),
            "{text}"
        );
        assert!(text.contains("idemgate_store_up 0\n"), "{text}");
        for absent in ["operations", "route_paused", "oldest_unknown_age_seconds"] {
            assert!(!text.contains(&format!("idemgate_{absent}")), "{text}");
        }
        assert_eq!(text.matches("# EOF").count(), 1, "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
