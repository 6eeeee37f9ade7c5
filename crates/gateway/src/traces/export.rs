//! Where ended spans go: the SDK's batch processor (a thread of its own)
//! hands them to the OTLP HTTP/protobuf exporter, which posts through
//! [`Collector`], the gateway's own hyper client.
//!
//! Invariants:
//! - a request never waits for the collector: ending a span is a
//!   non-blocking hand-over to a bounded queue (`OTEL_BSP_MAX_QUEUE_SIZE`),
//!   and a span that finds it full is dropped;
//! - every span that is not exported is counted
//!   (`idemgate_trace_spans_dropped_total`): [`Gate`] counts the spans in the
//!   queue itself (the SDK keeps its own count private) and refuses those
//!   past its size, so the SDK's queue, of the same size, never drops one
//!   uncounted; [`Counted`] counts the batches the collector refused or did
//!   not answer within `OTEL_EXPORTER_OTLP_TIMEOUT`;
//! - one export is bounded end to end (connect, send, the answer's body,
//!   which is read up to [`MAX_ANSWER`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use opentelemetry::Context;
use opentelemetry_http::{HttpClient, HttpError};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{BatchSpanProcessor, Span, SpanData, SpanExporter, SpanProcessor};
use prometheus_client::metrics::counter::Counter;
use tokio::runtime::Handle;

/// The most of a collector's answer that is read (it is a small protobuf
/// message, or an error's text).
const MAX_ANSWER: usize = 64 * 1024;

/// The OTLP exporter's HTTP client: the gateway's hyper client, driven on
/// the gateway's runtime (the batch processor's thread has none).
#[derive(Debug, Clone)]
pub(crate) struct Collector {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    runtime: Handle,
    /// One export's bound, from connect to the answer's last byte.
    timeout: Duration,
}

/// Why an export was not answered.
#[derive(Debug, thiserror::Error)]
enum CollectorError {
    #[error("the collector did not answer within {0:?}")]
    Late(Duration),
    #[error("the export task ended: {0}")]
    Ended(#[from] tokio::task::JoinError),
}

impl Collector {
    pub fn new(runtime: Handle, timeout: Duration) -> Result<Self, rustls::Error> {
        Ok(Collector {
            client: crate::http_client::webpki_client(timeout)?,
            runtime,
            timeout,
        })
    }
}

#[async_trait::async_trait]
impl HttpClient for Collector {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (client, timeout) = (self.client.clone(), self.timeout);
        let exchange = async move {
            let response = client.request(request.map(Full::new)).await?;
            let (head, body) = response.into_parts();
            let body = Limited::new(body, MAX_ANSWER).collect().await?.to_bytes();
            Ok::<_, HttpError>(Response::from_parts(head, body))
        };
        let exchange = self
            .runtime
            .spawn(async move { tokio::time::timeout(timeout, exchange).await });
        match exchange.await {
            Ok(Ok(answered)) => answered,
            Ok(Err(_)) => Err(Box::new(CollectorError::Late(timeout))),
            Err(ended) => Err(Box::new(CollectorError::from(ended))),
        }
    }
}

/// The spans between their end and their export, shared by [`Gate`] and
/// [`Counted`].
#[derive(Debug, Clone)]
pub struct Queue {
    waiting: Arc<AtomicUsize>,
    dropped: Counter,
}

impl Queue {
    /// `dropped` is where the spans never exported are counted.
    pub fn new(dropped: Counter) -> Self {
        Queue {
            waiting: Arc::default(),
            dropped,
        }
    }
}

/// The batch processor, behind a bound of its own that counts what it
/// refuses.
#[derive(Debug)]
pub(crate) struct Gate {
    inner: BatchSpanProcessor,
    queue: Queue,
    capacity: usize,
    /// After shutdown the SDK drops what it is given, uncounted.
    closed: AtomicBool,
}

impl Gate {
    /// `inner`'s queue must hold `capacity` spans.
    pub fn new(inner: BatchSpanProcessor, queue: Queue, capacity: usize) -> Self {
        Gate {
            inner,
            queue,
            capacity,
            closed: AtomicBool::new(false),
        }
    }
}

impl SpanProcessor for Gate {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        let waiting = self.queue.waiting.fetch_add(1, Ordering::AcqRel);
        if waiting >= self.capacity || self.closed.load(Ordering::Acquire) {
            self.queue.waiting.fetch_sub(1, Ordering::AcqRel);
            self.queue.dropped.inc();
            return;
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.closed.store(true, Ordering::Release);
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The OTLP exporter, counting the spans of every batch it could not
/// deliver; a batch leaves the [`Queue`] as it is handed over. The first
/// failure after a success is logged, and the first success after it: one
/// line per outage, not one per batch.
#[derive(Debug)]
pub(crate) struct Counted<E> {
    inner: E,
    queue: Queue,
    failing: AtomicBool,
}

impl<E> Counted<E> {
    pub fn new(inner: E, queue: Queue) -> Self {
        Counted {
            inner,
            queue,
            failing: AtomicBool::new(false),
        }
    }
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        self.queue.waiting.fetch_sub(spans, Ordering::AcqRel);
        let exported = self.inner.export(batch).await;
        match &exported {
            Err(error) => {
                self.queue.dropped.inc_by(spans as u64);
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(%error, "traces: the collector did not take a batch; spans are dropped (idemgate_trace_spans_dropped_total) until it does");
                }
            }
            Ok(()) if self.failing.swap(false, Ordering::Relaxed) => {
                tracing::info!("traces: the collector takes batches again");
            }
            Ok(()) => {}
        }
        exported
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}
