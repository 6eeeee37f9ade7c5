//! OpenTelemetry traces (docs/deploying.md, "Traces"): a span per request
//! on the proxy listener and a child for each step of idemgate's own work
//! the request waited on, exported over OTLP HTTP/protobuf; off unless an
//! `OTEL_*` endpoint is set ([`settings`]).
//!
//! The tree of one write ([`Step`] names the children):
//!
//! ```text
//! idemgate.request            (server; the client's traceparent is its parent)
//! ├── idemgate.claim          the claim phase, waits on duplicates included
//! │   └── idemgate.store.claim    the wait for the store's commit of the claim
//! ├── idemgate.upstream       (client; connect retries as events; its
//! │                            context is the traceparent the upstream gets)
//! ├── idemgate.store.record   the wait for the commit of the outcome
//! ├── idemgate.probe          (client) a reconcile probe
//! └── idemgate.late_response  a response recorded after the loss, later
//! ```
//!
//! Invariants:
//! - a request's attributes never carry a key, a credential, a header
//!   value or a body: the key appears only as a hash keyed with the scope key
//!   (`ScopeKey::trace_label`);
//!   the probe's URL (which holds the key) is never recorded;
//! - off, a span point costs one relaxed load and a branch ([`ACTIVE`]),
//!   and `traceparent` goes upstream as the client sent it; on, the
//!   upstream gets idemgate's own span as the parent;
//! - the collector never slows or fails a request ([`export`]).
//!
//! Why the OpenTelemetry API directly, not `tracing` spans bridged by
//! tracing-opentelemetry: `tracing` spans would cost every request the
//! registry's span bookkeeping whether or not traces are on, and the
//! subscriber is global to the process, where tests run gateways with and
//! without traces side by side. Here each gateway owns its tracer
//! provider, and a request's context travels with its futures
//! ([`Traced`]), so nothing is paid when traces are off.

pub mod export;
pub mod settings;

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Duration;

use http::{HeaderMap, Method};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider,
};
use prometheus_client::metrics::counter::Counter;
use tokio::runtime::Handle;

use export::{Collector, Counted, Gate, Queue};
use settings::{Root, Sampling, TraceSettings};

/// Set once any gateway in the process traces: until then every span
/// point is this load and a branch.
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// How long a shutdown waits for the last spans to be exported.
const SHUTDOWN_BOUND: Duration = Duration::from_secs(5);

/// Why the traces could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    // Each says its cause, which is therefore not also its source (an
    // error chain would say it twice).
    #[error("traces: {0}")]
    Setting(settings::TraceSettingError),
    #[error("traces: the OTLP exporter: {0}")]
    Exporter(String),
    #[error("traces: the collector's TLS: {0}")]
    Tls(rustls::Error),
}

impl From<settings::TraceSettingError> for TraceError {
    fn from(error: settings::TraceSettingError) -> Self {
        TraceError::Setting(error)
    }
}

impl From<rustls::Error> for TraceError {
    fn from(error: rustls::Error) -> Self {
        TraceError::Tls(error)
    }
}

/// A gateway's traces: its tracer and the provider that exports its spans.
pub struct Tracing {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

/// The children of a request span, in the order a write meets them.
#[derive(Debug, Clone, Copy)]
pub enum Step {
    /// The claim phase, waits for duplicates in flight included.
    Claim,
    /// One claim's wait for the store's commit (a group commit on SQLite).
    StoreClaim,
    /// The wait for the commit of the attempt's outcome.
    StoreRecord,
    /// The exchange with the upstream, connect retries included.
    Upstream,
    /// A reconcile probe.
    Probe,
    /// A response that came after its loss was recorded.
    LateResponse,
}

impl Step {
    pub fn name(self) -> &'static str {
        match self {
            Step::Claim => "idemgate.claim",
            Step::StoreClaim => "idemgate.store.claim",
            Step::StoreRecord => "idemgate.store.record",
            Step::Upstream => "idemgate.upstream",
            Step::Probe => "idemgate.probe",
            Step::LateResponse => "idemgate.late_response",
        }
    }

    fn kind(self) -> SpanKind {
        match self {
            Step::Upstream | Step::Probe => SpanKind::Client,
            _ => SpanKind::Internal,
        }
    }
}

/// The request span's name.
pub(crate) const REQUEST: &str = "idemgate.request";

/// What a request span learns from deep in the pipeline, written on it
/// once when it ends (an attribute set twice would be exported twice).
#[derive(Default)]
struct Notes {
    state: Option<&'static str>,
    attempt: Option<u32>,
    key: Option<String>,
}

/// Kept in a request's context: the tracer its children come from, and
/// its notes.
struct RequestTrace {
    tracer: SdkTracer,
    /// std Mutex: held only to write a field, never across an await.
    notes: Mutex<Notes>,
}

impl Tracing {
    /// The traces `settings` ask for, exporting from a thread of the SDK's
    /// through `runtime`; spans never exported are counted in `dropped`.
    pub fn start(
        settings: &TraceSettings,
        runtime: Handle,
        dropped: Counter,
    ) -> Result<Tracing, TraceError> {
        let collector = Collector::new(runtime, settings.timeout)?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(collector)
            .with_endpoint(settings.endpoint.clone())
            .with_protocol(Protocol::HttpBinary)
            .with_timeout(settings.timeout)
            .with_headers(settings.headers.iter().cloned().collect())
            .build()
            .map_err(|e| TraceError::Exporter(e.to_string()))?;
        let queue = Queue::new(dropped);
        let batches = BatchConfigBuilder::default()
            .with_max_queue_size(settings.max_queue)
            .with_max_export_batch_size(settings.max_batch)
            .with_scheduled_delay(settings.schedule_delay)
            .build();
        let processor = BatchSpanProcessor::new(Counted::new(exporter, queue.clone()), batches);
        let resource = Resource::builder_empty()
            .with_attributes(
                settings
                    .resource
                    .iter()
                    .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
            )
            .with_service_name(settings.service_name.clone())
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(Gate::new(processor, queue, settings.max_queue))
            .with_sampler(sampler(settings.sampling))
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("idemgate");
        ACTIVE.store(true, Ordering::Relaxed);
        Ok(Tracing { provider, tracer })
    }

    /// The context of a request's span, a child of the client's
    /// `traceparent` (and `tracestate`) if it sent one; run the request
    /// [`within`] it, which ends it with the response.
    pub fn request(&self, method: &Method, headers: &HeaderMap) -> Context {
        let parent = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
        let span = self
            .tracer
            .span_builder(REQUEST)
            .with_kind(SpanKind::Server)
            .with_attributes([KeyValue::new(
                "http.request.method",
                method.as_str().to_string(),
            )])
            .start_with_context(&self.tracer, &parent);
        parent.with_span(span).with_value(RequestTrace {
            tracer: self.tracer.clone(),
            notes: Mutex::default(),
        })
    }

    /// Exports what is waiting and stops, within [`SHUTDOWN_BOUND`]: the
    /// SDK's shutdown blocks, so it runs on the blocking pool.
    pub async fn shutdown(&self) {
        let provider = self.provider.clone();
        let stopped =
            tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(SHUTDOWN_BOUND));
        match tokio::time::timeout(SHUTDOWN_BOUND, stopped).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(error))) => {
                tracing::warn!(%error, "traces: the last spans were not exported")
            }
            Ok(Err(_)) | Err(_) => tracing::warn!("traces: the exporter did not stop in time"),
        }
    }
}

fn sampler(sampling: Sampling) -> Sampler {
    let root = |root| match root {
        Root::AlwaysOn => Sampler::AlwaysOn,
        Root::AlwaysOff => Sampler::AlwaysOff,
        Root::Ratio(ratio) => Sampler::TraceIdRatioBased(ratio),
    };
    match sampling {
        Sampling::AlwaysOn => Sampler::AlwaysOn,
        Sampling::AlwaysOff => Sampler::AlwaysOff,
        Sampling::Ratio(ratio) => Sampler::TraceIdRatioBased(ratio),
        Sampling::ParentBased(first) => Sampler::ParentBased(Box::new(root(first))),
    }
}

/// `f` of the current context, when it belongs to a traced request.
fn with_request<T>(f: impl FnOnce(&Context, &RequestTrace) -> T) -> Option<T> {
    if !ACTIVE.load(Ordering::Relaxed) {
        return None;
    }
    Context::map_current(|cx| cx.get::<RequestTrace>().map(|request| f(cx, request)))
}

/// `f` of the current span, when it is a traced request's and recording.
fn on_span(f: impl FnOnce(&opentelemetry::trace::SpanRef<'_>)) {
    with_request(|cx, _| {
        let span = cx.span();
        if span.is_recording() {
            f(&span);
        }
    });
}

/// `f` of the request's notes, when the current context is a traced request's.
fn note(f: impl FnOnce(&mut Notes)) {
    with_request(|_, request| {
        let mut notes = request.notes.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut notes);
    });
}

/// `future` run in the request context `cx`, which it ends with the
/// request's span.
pub fn within<F: Future>(cx: Context, future: F) -> Traced<F> {
    Traced {
        future,
        cx: Some(cx),
        ends: true,
    }
}

/// `future` (a task being spawned) run in the current request's context,
/// if any: the task's steps are the request's children.
pub(crate) fn in_current<F: Future>(future: F) -> Traced<F> {
    Traced {
        future,
        cx: with_request(|cx, _| cx.clone()),
        ends: false,
    }
}

/// `future` as the `step` of the current request, a child of the current
/// span when it is sampled (an unsampled request has no children; a
/// sampled one may have some after it ended: a probe, a late response).
pub fn child<F: Future>(step: Step, future: F) -> Traced<F> {
    let cx = with_request(|cx, request| {
        cx.span().span_context().is_sampled().then(|| {
            let span = request
                .tracer
                .span_builder(step.name())
                .with_kind(step.kind())
                .start_with_context(&request.tracer, cx);
            cx.with_span(span)
        })
    });
    Traced {
        future,
        cx: cx.flatten(),
        ends: true,
    }
}

pin_project_lite::pin_project! {
    /// A future polled in a request's context; one that [`child`] or
    /// [`within`] made ends its span when it is ready (or dropped).
    pub struct Traced<F> {
        #[pin]
        future: F,
        cx: Option<Context>,
        ends: bool,
    }

    impl<F> PinnedDrop for Traced<F> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(cx) = this.cx.take() && *this.ends {
                cx.span().end();
            }
        }
    }
}

impl<F: Future> Future for Traced<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, task: &mut std::task::Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let Some(cx) = this.cx.as_ref() else {
            return this.future.poll(task);
        };
        let attached = cx.clone().attach();
        let poll = this.future.poll(task);
        drop(attached);
        if poll.is_ready()
            && let Some(cx) = this.cx.take()
            && *this.ends
        {
            cx.span().end();
        }
        poll
    }
}

/// Writes the current span's context as the `traceparent` (and
/// `tracestate`) of a request idemgate sends, replacing the client's; off,
/// the client's are left as they came.
pub(crate) fn inject(headers: &mut HeaderMap) {
    with_request(|cx, _| {
        headers.remove("traceparent");
        headers.remove("tracestate");
        TraceContextPropagator::new().inject_context(cx, &mut HeaderInjector(headers));
    });
}

/// The key of the current request, as a keyed hash (`hash` is called
/// only when traced).
pub(crate) fn note_key(hash: impl FnOnce() -> String) {
    note(|notes| notes.key = Some(hash()));
}

/// The state of the current request's operation, as it answered.
pub(crate) fn note_state(state: &'static str) {
    note(|notes| notes.state = Some(state));
}

/// The attempt the current request made, and the state it left.
pub(crate) fn note_attempt(attempt: u32, state: &'static str) {
    note(|notes| {
        notes.attempt = Some(attempt);
        notes.state = Some(state);
    });
}

/// How a request was answered.
pub struct Answer<'a, O> {
    /// Its route's name, empty when it had none.
    pub(crate) route: &'a str,
    /// Its path in normal form.
    pub(crate) path: &'a str,
    pub(crate) outcome: O,
    pub(crate) status: u16,
    pub(crate) operation_id: Option<&'a str>,
    /// Answered from a stored response.
    pub(crate) replayed: bool,
}

/// How the current request was answered, written on its span with what
/// the pipeline noted.
pub fn answered<O: std::fmt::Debug>(answer: Answer<'_, O>) {
    let Answer {
        route,
        path,
        outcome,
        status,
        operation_id,
        replayed,
    } = answer;
    with_request(|cx, request| {
        let span = cx.span();
        if !span.is_recording() {
            return;
        }
        let notes = std::mem::take(&mut *request.notes.lock().unwrap_or_else(|e| e.into_inner()));
        let mut attributes = vec![
            KeyValue::new("idemgate.route", route.to_string()),
            KeyValue::new("url.path", path.to_string()),
            KeyValue::new("idemgate.outcome", format!("{outcome:?}")),
            KeyValue::new("http.response.status_code", i64::from(status)),
            KeyValue::new("idemgate.replayed", replayed),
        ];
        if let Some(id) = operation_id {
            attributes.push(KeyValue::new("idemgate.operation.id", id.to_string()));
        }
        let state = notes.state.or(replayed.then_some("completed"));
        if let Some(state) = state {
            attributes.push(KeyValue::new("idemgate.operation.state", state));
        }
        if let Some(attempt) = notes.attempt {
            attributes.push(KeyValue::new(
                "idemgate.operation.attempt",
                i64::from(attempt),
            ));
        }
        if let Some(key) = notes.key {
            attributes.push(KeyValue::new("idemgate.key.hash", key));
        }
        span.set_attributes(attributes);
        if status >= 500 {
            span.set_status(Status::error(format!("answered {status}")));
        }
    });
}

/// A connect retry of the current upstream exchange (`reason`, an error
/// chain, is made only when traced).
pub(crate) fn connect_retry(retry: u32, reason: impl FnOnce() -> String) {
    on_span(|span| {
        span.add_event(
            "connect.retry",
            vec![
                KeyValue::new("idemgate.upstream.try", i64::from(retry)),
                KeyValue::new("error.message", reason()),
            ],
        );
    });
}

/// How the current upstream exchange ended: after `tries` tries, as
/// `exchange` (`complete`, `lost`, …), with the upstream's `status` if a
/// response came.
pub(crate) fn upstream_ended(tries: u32, exchange: &'static str, status: Option<u16>) {
    on_span(|span| {
        span.set_attribute(KeyValue::new("idemgate.upstream.tries", i64::from(tries)));
        span.set_attribute(KeyValue::new("idemgate.upstream.exchange", exchange));
        if let Some(status) = status {
            span.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(status),
            ));
        }
        if matches!(exchange, "lost" | "not_sent" | "fenced") {
            span.set_status(Status::error(exchange));
        }
    });
}

/// What the current probe concluded: its `verdict` (`found`, `absent`,
/// `duplicated`, `undetermined`; `matched` when found), and the status its
/// first question got if any.
pub(crate) fn probe_ended(verdict: &'static str, status: Option<u16>) {
    on_span(|span| {
        span.set_attribute(KeyValue::new("idemgate.probe.matched", verdict == "found"));
        span.set_attribute(KeyValue::new("idemgate.probe.verdict", verdict));
        if let Some(status) = status {
            span.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(status),
            ));
        }
    });
}

/// Whether a late response settled its operation.
pub(crate) fn late_ended(settled: bool) {
    on_span(|span| span.set_attribute(KeyValue::new("idemgate.late.settled", settled)));
}
