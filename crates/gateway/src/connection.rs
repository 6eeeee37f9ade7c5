//! One accepted connection, served as HTTP/1.1 or HTTP/2 with the
//! listener's limits.
//!
//! The version is the client's choice: HTTP/2 when the connection opens
//! with the HTTP/2 preface — prior knowledge on plain TCP, or after ALPN
//! `h2` under TLS (the listeners offer `h2` and `http/1.1`,
//! [`crate::tls`]) — and HTTP/1.1 otherwise; hyper-util's auto builder
//! reads the first bytes to tell.
//!
//! Invariants, both versions:
//! - a connection with no request in progress for `header_read_timeout`
//!   is closed: before its first bytes, while a head or an HTTP/2 header
//!   block trickles in, between HTTP/2 streams. HTTP/1.1 also has hyper's
//!   own `header_read_timeout` on every head, keep-alive ones included; an
//!   HTTP/2 connection is closed gracefully (GOAWAY: streams in progress
//!   finish, the client may retry the others on a new connection);
//! - a request head (HTTP/1.1's read buffer, HTTP/2's header list with its
//!   CONTINUATION frames, `SETTINGS_MAX_HEADER_LIST_SIZE`) is at most
//!   `max_header_bytes`; an HTTP/1.1 head has at most [`MAX_HEAD_FIELDS`]
//!   fields (hyper answers one with more a bare 431);
//! - from the moment a shutdown starts, a connection finishes what is in
//!   progress and closes; one with nothing in progress closes at once.
//!   The stop token and the idle timer are polled after a wake of their
//!   own (`Gate`), not at each of the connection's.
//!
//! HTTP/2 only (hyper's and the h2 crate's options, set here):
//! - at most `http2_max_concurrent_streams` streams at once
//!   (`SETTINGS_MAX_CONCURRENT_STREAMS`; one more is refused by h2 with
//!   `REFUSED_STREAM`);
//! - a stream the client resets (`RST_STREAM`) is a hang-up: whatever the
//!   pipeline began goes on (a write's attempt runs in a task of its own,
//!   [`crate::pipeline`]), and its handler runs to its end in a task of
//!   its own here, still counted among the connection's streams. So
//!   resetting streams frees no room for more work (the rapid reset
//!   attack, CVE-2023-44487): a stream that arrives while the
//!   connection's streams are all busy is answered 503 `overloaded`, and
//!   nothing is sent;
//! - streams reset before they were accepted ([`PENDING_ACCEPT_RESETS`])
//!   and streams the gateway had to reset for the client's protocol errors
//!   ([`LOCAL_ERROR_RESETS`]) are bounded: past either the connection is
//!   closed with GOAWAY;
//! - what one stream may queue for sending is [`SEND_BUFFER`]; what a
//!   client may send ahead is hyper's flow-control windows (1 MiB per
//!   connection); the bodies read are reserved from
//!   `buffered_body_budget` as HTTP/1.1's are;
//! - a PING every `header_read_timeout` must be answered within as long,
//!   or the connection is closed: a peer that vanished does not hold its
//!   streams.

use std::convert::Infallible;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use atomic_waker::AtomicWaker;
use http::{Request, Response, Version};
use hyper::body::Incoming;
use hyper::rt::{Read, Write};
use hyper::service::Service;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::either::Either;
use tokio_util::sync::CancellationToken;

use crate::body::ProxyBody;
use crate::config::ServerConfig;
use crate::pipeline::error::ProxyError;
use crate::pipeline::pool::MAX_HEAD_FIELDS;
use crate::write_stall::WriteStall;

/// Streams a client may reset before the gateway accepted them, at once;
/// more close the connection (GOAWAY `ENHANCE_YOUR_CALM`). h2's default.
pub(crate) const PENDING_ACCEPT_RESETS: usize = 20;

/// Streams the gateway may reset for a client's protocol errors on one
/// connection; more close it.
pub(crate) const LOCAL_ERROR_RESETS: usize = 256;

/// What one HTTP/2 stream may queue for sending before it waits for the
/// client to read (hyper's default, written down).
pub(crate) const SEND_BUFFER: usize = 400 * 1024;

/// How connections are served: the builder with every limit set.
pub(crate) struct Http {
    builder: auto::Builder<TokioExecutor>,
    /// With no request in progress this long, the connection is closed.
    idle: Duration,
    max_streams: usize,
}

impl Http {
    /// The listeners' connections, as `server` says.
    pub fn new(server: &ServerConfig) -> Http {
        let streams = server.http2_max_concurrent_streams;
        Http::build(server, server.header_read_timeout, true, streams)
    }

    /// A connection over the listener's cap, answered once within `within`.
    pub fn refusing(server: &ServerConfig, within: Duration) -> Http {
        Http::build(server, within, false, 1)
    }

    fn build(server: &ServerConfig, idle: Duration, keep_alive: bool, streams: u32) -> Http {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(idle)
            .max_buf_size(server.max_header_bytes)
            .max_headers(MAX_HEAD_FIELDS)
            // A client may shut down its write side once its request is
            // sent (tools and shell pipes do): an EOF on read is no reason
            // to drop the answer, least of all for a write already forwarded.
            // So a client gone mid-answer shows only when a write to it
            // fails; while the upstream is silent, the streamed body's idle
            // bound frees it (`body::IdleTimeout`, docs/requests.md,
            // "Streamed answers").
            .half_close(true)
            .keep_alive(keep_alive);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(streams)
            .max_header_list_size(u32::try_from(server.max_header_bytes).unwrap_or(u32::MAX))
            .max_pending_accept_reset_streams(PENDING_ACCEPT_RESETS)
            .max_local_error_reset_streams(LOCAL_ERROR_RESETS)
            .max_send_buf_size(SEND_BUFFER)
            .keep_alive_interval(idle)
            .keep_alive_timeout(idle);
        Http {
            builder,
            idle,
            max_streams: streams as usize,
        }
    }

    /// Serves `io` with `service` until the connection ends; from the
    /// moment `stop` is cancelled it finishes what is in progress and
    /// closes.
    pub async fn serve<I, S>(
        &self,
        io: I,
        service: S,
        stop: &CancellationToken,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>>
    where
        I: Read + Write + Unpin + Send + 'static,
        S: Service<Request<Incoming>, Response = Response<ProxyBody>, Error = Infallible>
            + Send
            + 'static,
        S::Future: Send + 'static,
    {
        let streams = Arc::new(Streams {
            slots: Arc::new(Semaphore::new(self.max_streams)),
            max: self.max_streams,
            http1: AtomicBool::new(false),
            quiet_since: Mutex::new(Instant::now()),
        });
        let counted = Counted {
            inner: service,
            streams: streams.clone(),
        };
        // A client that takes nothing of an answer for as long as it may
        // take to send a head is cut off, and the upstream streaming that
        // answer freed (`write_stall`).
        let io = WriteStall::new(io, self.idle);
        let mut connection = pin!(self.builder.serve_connection(io, counted));
        // The connection's own token, so that nothing polled here is shared
        // with the other workers' connections.
        let stop = stop.child_token();
        let mut stopped = pin!(stop.cancelled());
        let mut idle = pin!(tokio::time::sleep(self.idle));
        let (mut closing, mut watching) = (false, true);
        // The stop token and the idle timer are polled only after a wake of
        // their own (`Gate`), the connection at every wake: under load the
        // connection is woken for each read and write, and polling both
        // with it, as `select!` does, took ~2 % of a replay's CPU.
        let gate = Arc::new(Gate::default());
        let gate_waker = Waker::from(gate.clone());
        std::future::poll_fn(|cx| {
            loop {
                if let Poll::Ready(ended) = connection.as_mut().poll(cx) {
                    return Poll::Ready(ended);
                }
                gate.task.register(cx.waker());
                if !gate.fired.swap(false, Ordering::AcqRel) {
                    return Poll::Pending;
                }
                let mut own = Context::from_waker(&gate_waker);
                // The connection to be polled again: it has a shutdown to
                // start, or the timer was reset and must be polled to arm.
                let mut again = false;
                if !closing && stopped.as_mut().poll(&mut own).is_ready() {
                    closing = true;
                    connection.as_mut().graceful_shutdown();
                    again = true;
                }
                if watching && !closing && idle.as_mut().poll(&mut own).is_ready() {
                    match streams.quiet_until(self.idle) {
                        // hyper's own `header_read_timeout` from here on.
                        None => watching = false,
                        Some(deadline) if deadline <= Instant::now() => {
                            closing = true;
                            connection.as_mut().graceful_shutdown();
                            again = true;
                        }
                        Some(deadline) => {
                            idle.as_mut().reset(deadline);
                            gate.fired.store(true, Ordering::Release);
                            again = true;
                        }
                    }
                }
                if !again {
                    return Poll::Pending;
                }
            }
        })
        .await
    }
}

/// Wakes a connection's task for its stop token or its idle timer, and
/// says so: only then are they polled.
struct Gate {
    fired: AtomicBool,
    task: AtomicWaker,
}

impl Default for Gate {
    /// Fired: both are polled once at the start, to register.
    fn default() -> Self {
        Gate {
            fired: AtomicBool::new(true),
            task: AtomicWaker::new(),
        }
    }
}

impl Wake for Gate {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.fired.store(true, Ordering::Release);
        self.task.wake();
    }
}

/// A connection's HTTP/2 streams in progress.
struct Streams {
    /// One permit per stream whose handler runs (reset ones included).
    slots: Arc<Semaphore>,
    max: usize,
    /// The connection turned out to speak HTTP/1.1.
    http1: AtomicBool,
    /// When the last stream ended (or the connection opened). std Mutex:
    /// held to read or write an `Instant`, never across `.await`.
    quiet_since: Mutex<Instant>,
}

impl Streams {
    /// When the connection will have been quiet for `idle`, if it stays
    /// so; `None` on HTTP/1.1.
    fn quiet_until(&self, idle: Duration) -> Option<Instant> {
        if self.http1.load(Ordering::Relaxed) {
            return None;
        }
        if self.slots.available_permits() < self.max {
            return Some(Instant::now() + idle);
        }
        let since = *self
            .quiet_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Some(since + idle)
    }

    fn ended(&self) {
        *self
            .quiet_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }
}

/// The service that counts a connection's HTTP/2 streams ([`Streams`]).
struct Counted<S> {
    inner: S,
    streams: Arc<Streams>,
}

type Answer = Result<Response<ProxyBody>, Infallible>;

impl<S> Service<Request<Incoming>> for Counted<S>
where
    S: Service<Request<Incoming>, Response = Response<ProxyBody>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = Either<S::Future, Pin<Box<dyn Future<Output = Answer> + Send>>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        if request.version() != Version::HTTP_2 {
            self.streams.http1.store(true, Ordering::Relaxed);
            return Either::Left(self.inner.call(request));
        }
        let Ok(slot) = self.streams.slots.clone().try_acquire_owned() else {
            let busy = ProxyError::Overloaded {
                what: "streams of this HTTP/2 connection",
                operation: None,
            };
            return Either::Right(Box::pin(std::future::ready(Ok(busy.into_response()))));
        };
        let (handling, streams) = (self.inner.call(request), self.streams.clone());
        // Its own task: a reset stream drops the future hyper polls, not
        // the handler, which keeps its slot until it is done.
        let handler = tokio::spawn(async move {
            let answer = handling.await;
            streams.ended();
            drop(slot);
            answer
        });
        Either::Right(Box::pin(async move {
            handler.await.unwrap_or_else(|_| {
                let failed = ProxyError::Internal {
                    reason: "the stream's handler ended without an answer".into(),
                };
                Ok(failed.into_response())
            })
        }))
    }
}
