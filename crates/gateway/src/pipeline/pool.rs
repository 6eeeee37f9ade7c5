//! The connections to one route's upstream: HTTP/1.1 over hyper's
//! `client::conn`, each driven by the task of the request that uses it,
//! and kept while idle for the thread that made it; or, on a route with
//! `upstream_http2`, one HTTP/2 connection per thread that all its
//! requests share.
//!
//! hyper-util's pooled client runs every connection as a task of its own
//! and hands it each request through a channel, so a request and its
//! response cross between two tasks, and with a runtime per thread a
//! connection made on one thread served requests from another, every socket
//! event a wake-up across threads (slower and costlier side by side:
//! benches/README.md, "paired.sh"). Here the request's own task polls the
//! connection: while it waits for the response head ([`Pool::send_on`]) and
//! while the response body is read ([`PooledBody`]). Once the body has
//! ended the connection goes back to the idle list of the thread it was
//! used on, ready for that thread's next request.
//!
//! A request goes out in two steps, so that its caller can tell "still
//! connecting" from "handed over" and time each on its own clock:
//! [`Pool::establish`] has a connection up and ready (a new one within the
//! route's `connect_timeout`, TCP, TLS and the HTTP/2 preface included:
//! hyper's handshake does not wait for the server's SETTINGS),
//! writing nothing; [`Pool::send_on`] hands the request to it and waits for
//! the response head. A write's `upstream_timeout` runs from the second
//! (`forward::send_write`), so a slow connect is a connect failure, never a
//! lost answer, and what goes on listening after the timeout only ever
//! reads the answer to what was handed over. [`Pool::send`] does both, for
//! requests timed as a whole.
//!
//! Invariants:
//! - an error tells whether the request may have been written:
//!   [`SendError::Connect`] only when no byte of it was — no connection
//!   came up (refused, DNS, `connect_timeout`, a TLS handshake broken off,
//!   the fence), or a new connection closed before hyper took the request
//!   (hyper hands an untaken request back);
//! - a request is handed over again only when hyper handed it back
//!   untaken from a reused connection that closed meanwhile (the
//!   keep-alive race, [`Handback::Untaken`]), and then on another
//!   connection, established anew;
//! - an idle connection is used again only on the thread it went idle on
//!   (its socket is registered with that thread's I/O driver when each
//!   thread runs a runtime of its own), after [`IDLE_TIMEOUT`] it is
//!   closed, and at most [`MAX_IDLE`] wait per thread;
//! - a response body dropped before its end closes its connection: a
//!   connection is only reused from a known state;
//! - every connection open, in use or idle, either version, holds one of
//!   its route's [`Slots`] (`routes[].max_upstream_connections`, counted
//!   across the route's two pools and every thread) until it closes. A
//!   request takes what it sends on before its exchange's clock starts
//!   ([`Pool::ticket`]): this thread's idle (or HTTP/2) connection, or a
//!   slot for a new one — one an idle connection of any thread gives up,
//!   or one that comes free within the route's `connect_timeout`; past
//!   that it gets [`SendError::Busy`], nothing written. So HTTP/2 clients'
//!   streams, each its own upstream exchange, cannot open connections
//!   (and file descriptors) past the bound.
//!
//! HTTP/2 (prior knowledge on `http://`, ALPN `h2` on `https://`; an
//! https upstream that picks `http/1.1` gets the connections above)
//! multiplexes, so its connection cannot be driven by one request: it runs
//! as a task of its own on the thread that made it, and each request of
//! that thread sends on a clone of its handle. [`SendError::Refused`] only
//! when the upstream proved it did not process the request: it reset the
//! stream with `REFUSED_STREAM`, or sent a GOAWAY whose last stream id is
//! below the request's (RFC 9113 §8.7); h2 fails exactly those streams
//! with the remote GOAWAY, those at or below it only later, with the
//! connection's end. Any other failure after the request was handed over
//! may have reached the upstream. A handle idle for [`IDLE_TIMEOUT`] is
//! dropped, and its connection closes once its last stream has ended.

use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::{Context, Poll};
use std::thread::ThreadId;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, Connection, SendRequest};
use hyper::client::conn::http2;
use hyper_util::client::legacy::connect::Connection as _;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};
use tokio::time::Instant;
use tower_service::Service;

use crate::body::{BoxError, ProxyBody, h2_cause};
use crate::pipeline::connector::{UpstreamConnector, WriteFirst};

/// Idle connections are closed after this; upstreams commonly close at 60 s+.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The most idle connections kept per thread; more are closed as they go idle.
pub const MAX_IDLE: usize = 256;

/// Idle connections that closed meanwhile tried before a new connection
/// is made, at most: each hands its request back untaken.
const STALE_TRIES: usize = 8;

/// The largest response head taken from an upstream, either version: what
/// hyper's HTTP/1.1 client reads at most (its read buffer). hyper refuses
/// a longer head only when it comes in more than one read, so one that a
/// reused connection's grown buffer took whole is refused here alike
/// ([`SendError::HeadTooLarge`]).
const MAX_RESPONSE_HEAD: u32 = 8192 + 4096 * 100;

/// The most fields an HTTP/1.1 head may have: a response from an upstream
/// (here, and reconcile probes' answers) and a request from a client (the
/// listeners, `connection.rs`). hyper's default, 100, is a count real
/// heads pass (a session's `Set-Cookie` lines), and an HTTP/2 head is
/// bounded by its bytes alone; those bound both versions' heads apart
/// ([`MAX_RESPONSE_HEAD`], `server.max_header_bytes`).
pub(crate) const MAX_HEAD_FIELDS: usize = 1024;

/// Why a request got no response head.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// Nothing of the request was written: no connection came up, or a new
    /// one closed before hyper took the request.
    #[error("cannot connect to the upstream")]
    Connect(#[source] BoxError),
    /// The HTTP/2 upstream refused the stream unprocessed (`REFUSED_STREAM`,
    /// or a GOAWAY below it): it may be sent again.
    #[error("the upstream refused the request unprocessed")]
    Refused(#[source] hyper::Error),
    /// The exchange failed after hyper took the request: it may have been
    /// written.
    #[error(transparent)]
    Exchange(#[from] hyper::Error),
    /// The response head is longer than [`MAX_RESPONSE_HEAD`]: the request
    /// was written, and its answer is none the gateway takes.
    #[error("the upstream's response head is {bytes} bytes, more than {MAX_RESPONSE_HEAD}")]
    HeadTooLarge { bytes: usize },
    /// Every connection the route may hold open ([`Slots`]) stayed in use
    /// for as long as a request waits for one: nothing was written.
    #[error(
        "all {max} connections the route may hold open to its upstream were in use for {}",
        humantime::format_duration(*waited)
    )]
    Busy { max: usize, waited: Duration },
}

/// The connections one route may hold open to its upstream at once
/// (`routes[].max_upstream_connections`), in use or idle, across its
/// pools (pass-through and writes) and threads: a slot each.
pub struct Slots {
    open: Arc<Semaphore>,
    max: usize,
    /// How long a request waits for a slot when every one is taken: the
    /// route's `connect_timeout`, what it would wait for a new connection.
    wait: Duration,
    /// The pools holding slots, whose idle connections give theirs up to a
    /// request that needs one. std Mutex: never held across `.await`.
    pools: Mutex<Vec<Weak<Pool>>>,
}

impl Slots {
    /// `max` slots (at most `Semaphore::MAX_PERMITS`, as config checks), a
    /// request waiting at most `wait` for one.
    pub fn new(max: usize, wait: Duration) -> Arc<Slots> {
        Arc::new(Slots {
            open: Arc::new(Semaphore::new(max)),
            max,
            wait,
            pools: Mutex::default(),
        })
    }

    /// A slot for a new connection: a free one, one an idle connection
    /// gives up (the oldest of a pool), or one that comes free within
    /// `wait`.
    async fn take(&self) -> Result<OwnedSemaphorePermit, SendError> {
        loop {
            match self.open.clone().try_acquire_owned() {
                Ok(slot) => return Ok(slot),
                Err(TryAcquireError::NoPermits) if self.close_an_idle() => continue,
                Err(_) => break,
            }
        }
        match tokio::time::timeout(self.wait, self.open.clone().acquire_owned()).await {
            Ok(Ok(slot)) => Ok(slot),
            _ => Err(SendError::Busy {
                max: self.max,
                waited: self.wait,
            }),
        }
    }

    /// Closes the oldest idle connection of the first pool that has one
    /// (any thread's): `false` when none is idle.
    fn close_an_idle(&self) -> bool {
        let pools: Vec<Arc<Pool>> = {
            let mut pools = self.pools.lock().unwrap_or_else(PoisonError::into_inner);
            pools.retain(|pool| pool.strong_count() > 0);
            pools.iter().filter_map(Weak::upgrade).collect()
        };
        pools.iter().any(|pool| pool.take_oldest_idle().is_some())
    }
}

/// What a request sends on, taken before its exchange's clock starts
/// ([`Pool::ticket`]), so that the wait for a slot is never taken for the
/// upstream's silence.
pub struct Ticket {
    checkout: Checkout,
    /// Connections that handed this request back untaken so far.
    stale: usize,
}

enum Checkout {
    /// This thread's HTTP/2 connection.
    Shared(http2::SendRequest<ProxyBody>),
    /// An idle connection of this thread (it may have closed meanwhile).
    Idle(Box<Conn>),
    /// A slot for a new connection.
    New(OwnedSemaphorePermit),
    /// Not chosen yet (after a connection handed the request back): as
    /// [`Pool::next`] chooses, on the slot the closed connection freed if
    /// it held one.
    Next(Option<OwnedSemaphorePermit>),
}

/// A connection up and ready to take a request, nothing written on it
/// yet ([`Pool::establish`]).
pub struct Connected {
    link: Link,
    /// Made for this request, not reused.
    new: bool,
    /// As its [`Ticket`]'s.
    stale: usize,
}

/// Why a request handed to a connection ([`Pool::send_on`]) got no
/// response head.
pub enum Handback {
    /// A reused connection closed before hyper took the request: nothing
    /// of it was written, and it may go on another.
    Untaken(Box<Untaken>),
    Failed(SendError),
}

/// A request a connection handed back untaken, and what to send it on
/// next.
pub struct Untaken {
    pub request: Request<ProxyBody>,
    pub next: Ticket,
}

/// A new connection that did not come up within the route's
/// `connect_timeout`, the TLS handshake and the HTTP/2 preface included.
#[derive(Debug, thiserror::Error)]
#[error("no connection within connect_timeout ({})", humantime::format_duration(*.0))]
struct ConnectTimedOut(Duration);

/// The connections to one upstream origin.
pub struct Pool {
    connector: UpstreamConnector,
    /// The route's slots, one for each connection open.
    slots: Arc<Slots>,
    /// The upstream's origin, what the connector connects to.
    origin: Uri,
    /// HTTP/2 when the upstream takes it (`upstream_http2`).
    http2: bool,
    /// How long a new connection may take to come up: the route's.
    connect_timeout: Duration,
    /// Idle connections by the thread they went idle on, newest last.
    /// std Mutex: never held across `.await`.
    idle: Mutex<HashMap<ThreadId, Vec<Idle>>>,
    /// Each thread's HTTP/2 connection. std Mutex: never held across `.await`.
    shared: Mutex<HashMap<ThreadId, Shared>>,
}

/// A thread's HTTP/2 connection: the handle its requests clone, and when
/// one last did.
struct Shared {
    sender: http2::SendRequest<ProxyBody>,
    used: Instant,
}

/// A connection: HTTP/1.1, for one request at a time, or HTTP/2.
enum Link {
    One(Box<Conn>),
    Shared(http2::SendRequest<ProxyBody>),
}

/// How an exchange on an HTTP/2 connection failed.
enum SharedFailed {
    /// hyper handed the request back unsent (the connection had closed);
    /// boxed: rare, and a request head is large.
    Untaken(Box<Request<ProxyBody>>),
    Failed(SendError),
}

struct Idle {
    conn: Box<Conn>,
    since: Instant,
}

/// One upstream connection: hyper's handle to send on and the connection
/// itself, which whoever uses it polls. Boxed where it is kept: its I/O
/// state is kilobytes (TLS included), and a request's future holding it
/// inline would be copied whole wherever the future moves.
struct Conn {
    sender: SendRequest<ProxyBody>,
    /// `None` once it has completed (closed or failed): dropped then, so
    /// that a request queued on it comes back (hyper hands an untaken one
    /// back, and fails one it took) instead of waiting on a connection
    /// nobody polls.
    connection: Option<Connection<WriteFirst, ProxyBody>>,
    /// Its route's slot, given back when it is dropped.
    slot: OwnedSemaphorePermit,
}

impl Conn {
    /// Lets hyper read and write what it can on this connection.
    fn drive(&mut self, cx: &mut Context<'_>) {
        let Some(connection) = &mut self.connection else {
            return;
        };
        if let Poll::Ready(result) = Pin::new(connection).poll(cx) {
            self.connection = None;
            if let Err(error) = result {
                tracing::debug!(%error, "upstream connection ended with an error");
            }
        }
    }

    fn reusable(&self) -> bool {
        self.connection.is_some() && !self.sender.is_closed()
    }

    /// Closes the connection, keeping its slot for another.
    fn into_slot(self: Box<Self>) -> OwnedSemaphorePermit {
        let Conn { slot, .. } = *self;
        slot
    }
}

thread_local! {
    /// `thread::current().id()` without cloning the current thread's handle.
    static THREAD: ThreadId = std::thread::current().id();
}

impl Pool {
    /// A pool of connections to `origin` made by `connector` within
    /// `connect_timeout`, each holding one of `slots`; idle ones are closed in the background after
    /// [`IDLE_TIMEOUT`] (when made inside a runtime).
    pub fn new(
        connector: UpstreamConnector,
        origin: Uri,
        http2: bool,
        connect_timeout: Duration,
        slots: Arc<Slots>,
    ) -> Arc<Pool> {
        let pool = Arc::new(Pool {
            connector,
            slots: slots.clone(),
            origin,
            http2,
            connect_timeout,
            idle: Mutex::default(),
            shared: Mutex::default(),
        });
        let mut pools = slots.pools.lock().unwrap_or_else(PoisonError::into_inner);
        pools.push(Arc::downgrade(&pool));
        drop(pools);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(close_expired(Arc::downgrade(&pool)));
        }
        pool
    }

    /// What the next request of this thread sends on: its HTTP/2
    /// connection, its newest idle connection, or a slot for a new one
    /// ([`Slots`]); [`SendError::Busy`] when none comes within the wait.
    pub async fn ticket(&self) -> Result<Ticket, SendError> {
        let checkout = self.next(0, None).await?;
        Ok(Ticket { checkout, stale: 0 })
    }

    /// What to send on after `stale` connections handed a request back:
    /// this thread's HTTP/2 or idle connection while tries are left, or a
    /// new one, on `slot` when one was freed for it.
    async fn next(
        &self,
        stale: usize,
        slot: Option<OwnedSemaphorePermit>,
    ) -> Result<Checkout, SendError> {
        if stale < STALE_TRIES {
            if self.http2
                && let Some(sender) = self.take_shared()
            {
                return Ok(Checkout::Shared(sender));
            }
            if let Some(conn) = self.take_idle() {
                return Ok(Checkout::Idle(conn));
            }
        }
        match slot {
            Some(slot) => Ok(Checkout::New(slot)),
            None => Ok(Checkout::New(self.slots.take().await?)),
        }
    }

    /// Sends `request` (its URI in origin form) on what `ticket` holds, or
    /// on another of this thread's connections, or a new one, if that one
    /// closed meanwhile; returns the response head; the body drives the
    /// connection on and returns it to the pool at its end.
    pub async fn send(
        self: &Arc<Self>,
        mut request: Request<ProxyBody>,
        mut ticket: Ticket,
    ) -> Result<Response<PooledBody>, SendError> {
        loop {
            let connected = self.establish(ticket).await?;
            match self.send_on(connected, request).await {
                Ok(response) => return Ok(response),
                Err(Handback::Untaken(untaken)) => {
                    (request, ticket) = (untaken.request, untaken.next)
                }
                Err(Handback::Failed(error)) => return Err(error),
            }
        }
    }

    /// The connection `ticket` holds, up and ready to take a request:
    /// this thread's HTTP/2 connection, an idle one still open (one the
    /// upstream closed meanwhile makes way for the next), or a new one on
    /// the ticket's slot, made within `connect_timeout`. Nothing of a
    /// request is written here: every error is [`SendError::Connect`] or
    /// [`SendError::Busy`].
    pub async fn establish(&self, ticket: Ticket) -> Result<Connected, SendError> {
        let Ticket {
            mut checkout,
            mut stale,
        } = ticket;
        loop {
            checkout = match checkout {
                Checkout::Next(slot) => self.next(stale, slot).await?,
                Checkout::Shared(sender) => {
                    let link = Link::Shared(sender);
                    return Ok(Connected {
                        link,
                        new: false,
                        stale,
                    });
                }
                Checkout::Idle(mut conn) => {
                    // An upstream that closed it meanwhile shows now.
                    poll_fn(|cx| {
                        conn.drive(cx);
                        Poll::Ready(())
                    })
                    .await;
                    if conn.reusable() {
                        let link = Link::One(conn);
                        return Ok(Connected {
                            link,
                            new: false,
                            stale,
                        });
                    }
                    stale += 1;
                    Checkout::Next(Some(conn.into_slot()))
                }
                // Another request of this thread made its HTTP/2
                // connection while this one waited: one is enough.
                Checkout::New(slot)
                    if self.http2
                        && stale < STALE_TRIES
                        && let Some(sender) = self.take_shared() =>
                {
                    drop(slot);
                    Checkout::Shared(sender)
                }
                Checkout::New(slot) => {
                    // Boxed: the connect's futures hold the new socket inline.
                    let connecting = Box::pin(self.connect(slot));
                    let link = match tokio::time::timeout(self.connect_timeout, connecting).await {
                        Ok(made) => made?,
                        Err(_) => {
                            let waited = ConnectTimedOut(self.connect_timeout);
                            return Err(SendError::Connect(waited.into()));
                        }
                    };
                    return Ok(Connected {
                        link,
                        new: true,
                        stale,
                    });
                }
            }
        }
    }

    /// Hands `request` to `connected` and waits for the response head:
    /// from here on what fails may have been written, but for
    /// [`Handback::Untaken`] (a connection that closed before taking it)
    /// and what [`SendError`] says was not.
    pub async fn send_on(
        self: &Arc<Self>,
        connected: Connected,
        request: Request<ProxyBody>,
    ) -> Result<Response<PooledBody>, Handback> {
        let Connected { link, new, stale } = connected;
        // A new connection that closed before taking it is a connect that
        // failed; a reused one makes way for the next (the keep-alive race).
        let untaken = |request, slot| {
            if new {
                let closed = "the new connection closed before the request was sent";
                return Handback::Failed(SendError::Connect(closed.into()));
            }
            let next = Ticket {
                checkout: Checkout::Next(slot),
                stale: stale + 1,
            };
            Handback::Untaken(Box::new(Untaken { request, next }))
        };
        let mut conn = match link {
            Link::Shared(sender) => {
                return match self.send_shared(sender, request).await {
                    Ok(response) => Ok(response),
                    Err(SharedFailed::Untaken(request)) => Err(untaken(*request, None)),
                    Err(SharedFailed::Failed(error)) => Err(Handback::Failed(error)),
                };
            }
            Link::One(conn) => conn,
        };
        let mut response = std::pin::pin!(conn.sender.try_send_request(request));
        let sent = poll_fn(|cx| {
            conn.drive(cx);
            response.as_mut().poll(cx)
        })
        .await;
        match sent {
            Ok(response) => {
                let bytes = head_bytes(&response);
                if bytes > MAX_RESPONSE_HEAD as usize {
                    // The connection goes with `conn`: the rest of this
                    // answer is never read.
                    return Err(Handback::Failed(SendError::HeadTooLarge { bytes }));
                }
                let pool = Arc::downgrade(self);
                Ok(response.map(|body| PooledBody {
                    body,
                    conn: Some(conn),
                    pool,
                }))
            }
            Err(mut error) => match error.take_message() {
                Some(request) => Err(untaken(request, Some(conn.into_slot()))),
                None => Err(Handback::Failed(SendError::Exchange(error.into_error()))),
            },
        }
    }

    /// A new connection on `slot`, through the connector (TCP, TLS, the
    /// fence): an HTTP/2 one becomes this thread's shared connection.
    async fn connect(&self, slot: OwnedSemaphorePermit) -> Result<Link, SendError> {
        let mut connector = self.connector.clone();
        poll_fn(|cx| connector.poll_ready(cx))
            .await
            .map_err(SendError::Connect)?;
        let io = connector
            .call(self.origin.clone())
            .await
            .map_err(SendError::Connect)?;
        let prior_knowledge = self.origin.scheme() == Some(&http::uri::Scheme::HTTP);
        if self.http2 && (prior_knowledge || io.connected().is_negotiated_h2()) {
            let (sender, connection) = http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .max_header_list_size(MAX_RESPONSE_HEAD)
                .handshake(io)
                .await
                .map_err(|error| SendError::Connect(error.into()))?;
            // On this thread's runtime, like the requests that share it;
            // the slot is the connection's until it ends.
            tokio::spawn(async move {
                let _slot = slot;
                if let Err(error) = connection.await {
                    tracing::debug!(%error, "upstream HTTP/2 connection ended with an error");
                }
            });
            let thread = THREAD.with(|id| *id);
            let shared = Shared {
                sender: sender.clone(),
                used: Instant::now(),
            };
            self.shared().insert(thread, shared);
            return Ok(Link::Shared(sender));
        }
        let (sender, connection) = http1::Builder::new()
            .max_headers(MAX_HEAD_FIELDS)
            .handshake(io)
            .await
            .map_err(|error| SendError::Connect(error.into()))?;
        Ok(Link::One(Box::new(Conn {
            sender,
            connection: Some(connection),
            slot,
        })))
    }

    fn shared(&self) -> MutexGuard<'_, HashMap<ThreadId, Shared>> {
        // A panic while holding it left at worst a handle that is dropped.
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// This thread's HTTP/2 connection, while it takes requests.
    fn take_shared(&self) -> Option<http2::SendRequest<ProxyBody>> {
        let thread = THREAD.with(|id| *id);
        let mut shared = self.shared();
        let entry = shared.get_mut(&thread)?;
        if entry.sender.is_closed() {
            shared.remove(&thread);
            return None;
        }
        entry.used = Instant::now();
        Some(entry.sender.clone())
    }

    /// Sends `request` on an HTTP/2 connection, its target in absolute form
    /// (`:scheme` and `:authority`, never a `Host` header: RFC 9113 §8.3.1).
    async fn send_shared(
        &self,
        mut sender: http2::SendRequest<ProxyBody>,
        mut request: Request<ProxyBody>,
    ) -> Result<Response<PooledBody>, SharedFailed> {
        let mut target = http::uri::Parts::from(self.origin.clone());
        target.path_and_query = request.uri().path_and_query().cloned();
        if let Ok(uri) = Uri::from_parts(target) {
            *request.uri_mut() = uri;
        }
        let headers = request.headers_mut();
        headers.remove(http::header::HOST);
        // HTTP/2 frames the body itself; the header is not allowed there.
        headers.remove(http::header::TRANSFER_ENCODING);
        *request.version_mut() = http::Version::HTTP_2;
        match sender.try_send_request(request).await {
            Ok(response) => Ok(response.map(|body| PooledBody {
                body,
                conn: None,
                pool: Weak::new(),
            })),
            Err(mut error) => match error.take_message() {
                Some(untaken) => {
                    self.shared().remove(&THREAD.with(|id| *id));
                    Err(SharedFailed::Untaken(Box::new(untaken)))
                }
                None => {
                    let error = error.into_error();
                    Err(SharedFailed::Failed(if unprocessed(&error) {
                        SendError::Refused(error)
                    } else {
                        SendError::Exchange(error)
                    }))
                }
            },
        }
    }

    fn idle(&self) -> MutexGuard<'_, HashMap<ThreadId, Vec<Idle>>> {
        // A panic while holding it left at worst a list short of a connection.
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// This thread's newest idle connection that is not past its time.
    fn take_idle(&self) -> Option<Box<Conn>> {
        let thread = THREAD.with(|id| *id);
        let mut expired = Vec::new();
        let taken = {
            let mut idle = self.idle();
            let list = idle.get_mut(&thread)?;
            let mut taken = None;
            while let Some(Idle { conn, since }) = list.pop() {
                if since.elapsed() < IDLE_TIMEOUT {
                    taken = Some(conn);
                    break;
                }
                // Newest last: the rest are older still.
                expired = std::mem::take(list);
                expired.push(Idle { conn, since });
            }
            taken
        };
        drop(expired);
        taken
    }

    /// The oldest idle connection of any thread, taken out (to be closed).
    fn take_oldest_idle(&self) -> Option<Box<Conn>> {
        let mut idle = self.idle();
        let (thread, _) = idle
            .iter()
            .filter_map(|(thread, list)| Some((*thread, list.first()?.since)))
            .min_by_key(|(_, since)| *since)?;
        let list = idle.get_mut(&thread)?;
        let Idle { conn, .. } = list.remove(0);
        if list.is_empty() {
            idle.remove(&thread);
        }
        Some(conn)
    }

    /// Keeps a connection whose exchange ended cleanly for this thread.
    fn put(&self, conn: Box<Conn>) {
        if !conn.reusable() {
            return;
        }
        let thread = THREAD.with(|id| *id);
        let mut idle = self.idle();
        let list = idle.entry(thread).or_default();
        if list.len() < MAX_IDLE {
            list.push(Idle {
                conn,
                since: Instant::now(),
            });
        }
    }

    /// Closes every idle connection past [`IDLE_TIMEOUT`], and drops the
    /// HTTP/2 handles no request used for as long.
    fn close_expired(&self) {
        let unused: Vec<Shared> = {
            let mut shared = self.shared();
            let threads: Vec<ThreadId> = shared
                .iter()
                .filter(|(_, s)| s.used.elapsed() >= IDLE_TIMEOUT || s.sender.is_closed())
                .map(|(thread, _)| *thread)
                .collect();
            threads.iter().filter_map(|t| shared.remove(t)).collect()
        };
        drop(unused);
        let mut expired = Vec::new();
        {
            let mut idle = self.idle();
            for list in idle.values_mut() {
                let keep = list
                    .iter()
                    .position(|idle| idle.since.elapsed() < IDLE_TIMEOUT)
                    .unwrap_or(list.len());
                expired.extend(list.drain(..keep));
            }
            idle.retain(|_, list| !list.is_empty());
        }
        drop(expired);
    }
}

/// About what an HTTP/1.1 response head takes on the wire: its status line
/// and each field's `name: value` line.
fn head_bytes<B>(response: &Response<B>) -> usize {
    "HTTP/1.1 200 \r\n\r\n".len()
        + response
            .headers()
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len() + ": \r\n".len())
            .sum::<usize>()
}

/// Whether an HTTP/2 exchange failed in a way that proves the upstream did
/// not process the request (module doc): the stream reset by the upstream
/// with `REFUSED_STREAM`, or failed by its GOAWAY.
fn unprocessed(error: &hyper::Error) -> bool {
    h2_cause(error).is_some_and(|h2| {
        h2.is_remote()
            && ((h2.is_reset() && h2.reason() == Some(h2::Reason::REFUSED_STREAM))
                || h2.is_go_away())
    })
}

/// Closes idle connections past their time every half [`IDLE_TIMEOUT`],
/// for as long as the pool exists.
async fn close_expired(pool: Weak<Pool>) {
    loop {
        tokio::time::sleep(IDLE_TIMEOUT / 2).await;
        match pool.upgrade() {
            Some(pool) => pool.close_expired(),
            None => return,
        }
    }
}

/// A response body from the upstream that drives its connection while it
/// is read, and returns the connection to its pool once it has ended.
pub struct PooledBody {
    body: Incoming,
    /// `None` once returned (or closed).
    conn: Option<Box<Conn>>,
    pool: Weak<Pool>,
}

impl PooledBody {
    /// The connection goes back to the pool if the body has `ended`, and
    /// is closed otherwise.
    fn release(&mut self, ended: bool) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        if ended && let Some(pool) = self.pool.upgrade() {
            pool.put(conn);
        }
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        if let Some(conn) = &mut this.conn {
            conn.drive(cx);
        }
        let frame = Pin::new(&mut this.body).poll_frame(cx);
        // A reader that trusts `is_end_stream` does not poll for the end.
        if matches!(frame, Poll::Ready(None)) || this.body.is_end_stream() {
            this.release(true);
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for PooledBody {
    fn drop(&mut self) {
        // A body with nothing to read (no content, or a reader that saw
        // `is_end_stream`) is done without a poll.
        let ended = self.body.is_end_stream();
        self.release(ended);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::BodyExt;
    use hyper_rustls::HttpsConnectorBuilder;
    use hyper_util::client::legacy::connect::HttpConnector;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tokio::sync::{mpsc, oneshot};

    use crate::body::full;

    /// How the test upstream treats a connection after each response.
    #[derive(Clone, Copy)]
    enum After {
        KeepOpen,
        /// Closes it when the test says so (`Upstream::close`), as an
        /// upstream's idle timeout does.
        CloseWhenTold,
    }

    /// A raw HTTP/1.1 upstream on 127.0.0.1: answers every request (a head
    /// without a body) with `body`, counting connections.
    struct Upstream {
        origin: Uri,
        connections: Arc<AtomicUsize>,
        /// Connections answered and waiting to be closed (`CloseWhenTold`).
        answered: mpsc::UnboundedReceiver<oneshot::Sender<oneshot::Sender<()>>>,
    }

    impl Upstream {
        /// Closes the connection that answered last, once it has.
        async fn close(&mut self) {
            let close = tokio::time::timeout(Duration::from_secs(5), self.answered.recv())
                .await
                .expect("a connection answered")
                .expect("the upstream runs");
            let (closed_tx, closed) = oneshot::channel();
            let _ = close.send(closed_tx);
            let _ = tokio::time::timeout(Duration::from_secs(5), closed).await;
        }
    }

    async fn upstream(after: After, body: &'static [u8], chunked: bool) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = format!("http://{}/", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let (answered_tx, answered) = mpsc::unbounded_channel();
        let counted = connections.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                let answered_tx = answered_tx.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    loop {
                        let Ok(n) = socket.read(&mut buf).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        head.extend_from_slice(&buf[..n]);
                        while let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                            head.drain(..end + 4);
                            let response = if chunked {
                                let mut r =
                                    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                                        .to_vec();
                                r.extend(format!("{:x}\r\n", body.len()).bytes());
                                r.extend_from_slice(body);
                                r.extend_from_slice(b"\r\n0\r\n\r\n");
                                r
                            } else {
                                let mut r = format!(
                                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n",
                                    body.len()
                                )
                                .into_bytes();
                                r.extend_from_slice(body);
                                r
                            };
                            if socket.write_all(&response).await.is_err() {
                                return;
                            }
                            if let After::CloseWhenTold = after {
                                let (close, told) = oneshot::channel::<oneshot::Sender<()>>();
                                let _ = answered_tx.send(close);
                                if let Ok(closed) = told.await {
                                    drop(socket);
                                    let _ = closed.send(());
                                }
                                return;
                            }
                        }
                    }
                });
            }
        });
        Upstream {
            origin,
            connections,
            answered,
        }
    }

    fn pool(origin: &Uri) -> Arc<Pool> {
        pool_on(origin, Slots::new(MAX_IDLE * 4, Duration::from_secs(5)))
    }

    fn pool_on(origin: &Uri, slots: Arc<Slots>) -> Arc<Pool> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        let https = HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Pool::new(
            UpstreamConnector { https, fence: None },
            origin.clone(),
            false,
            Duration::from_secs(5),
            slots,
        )
    }

    /// Sends `request` on `pool` (its ticket first).
    async fn send(
        pool: &Arc<Pool>,
        request: Request<ProxyBody>,
    ) -> Result<Response<PooledBody>, SendError> {
        let ticket = pool.ticket().await?;
        pool.send(request, ticket).await
    }

    fn get() -> Request<ProxyBody> {
        Request::get("/x")
            .header("host", "upstream")
            .body(full(""))
            .unwrap()
    }

    async fn read_all(pool: &Arc<Pool>) -> Bytes {
        let response = tokio::time::timeout(Duration::from_secs(5), send(pool, get()))
            .await
            .expect("answered in time")
            .expect("sent");
        response.into_body().collect().await.unwrap().to_bytes()
    }

    #[tokio::test]
    async fn a_connection_is_used_again_once_its_body_has_ended() {
        for chunked in [false, true] {
            let upstream = upstream(After::KeepOpen, b"{\"id\":1}", chunked).await;
            let pool = pool(&upstream.origin);
            for _ in 0..5 {
                assert_eq!(read_all(&pool).await, "{\"id\":1}".as_bytes());
            }
            assert_eq!(
                upstream.connections.load(Ordering::SeqCst),
                1,
                "chunked: {chunked}"
            );
        }
    }

    #[tokio::test]
    async fn a_body_without_content_goes_back_without_a_poll() {
        let upstream = upstream(After::KeepOpen, b"", false).await;
        let pool = pool(&upstream.origin);
        for _ in 0..3 {
            let response = send(&pool, get()).await.unwrap();
            assert!(response.body().is_end_stream());
            drop(response);
        }
        assert_eq!(upstream.connections.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_body_dropped_before_its_end_closes_its_connection() {
        let upstream = upstream(After::KeepOpen, &[b'x'; 64 * 1024], false).await;
        let pool = pool(&upstream.origin);
        let mut body = send(&pool, get()).await.unwrap().into_body();
        let first = body.frame().await.unwrap().unwrap();
        assert!(first.data_ref().is_some_and(|d| d.len() < 64 * 1024));
        drop(body);
        assert_eq!(read_all(&pool).await.len(), 64 * 1024);
        assert_eq!(upstream.connections.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn an_idle_connection_the_upstream_closed_is_not_written_to() {
        let mut upstream = upstream(After::CloseWhenTold, b"ok", false).await;
        let pool = pool(&upstream.origin);
        for round in 1..=3 {
            assert_eq!(read_all(&pool).await, "ok".as_bytes());
            // Idle in the pool by now; then the upstream closes it.
            upstream.close().await;
            assert_eq!(upstream.connections.load(Ordering::SeqCst), round);
        }
    }

    #[test]
    fn idle_connections_stay_with_the_thread_they_were_used_on() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let upstream = runtime.block_on(upstream(After::KeepOpen, b"ok", false));
        let pool = runtime.block_on(async { pool(&upstream.origin) });
        std::thread::scope(|scope| {
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let pool = pool.clone();
                    scope.spawn(move || {
                        let own = tokio::runtime::Builder::new_current_thread()
                            .enable_all()
                            .build()
                            .unwrap();
                        own.block_on(async {
                            for _ in 0..4 {
                                read_all(&pool).await;
                            }
                        });
                    })
                })
                .collect();
            // The upstream runs on the first runtime, until both are done.
            runtime.block_on(async {
                let deadline = Instant::now() + Duration::from_secs(30);
                while !threads.iter().all(|t| t.is_finished()) && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            });
        });
        assert_eq!(upstream.connections.load(Ordering::SeqCst), 2);
        assert_eq!(pool.idle().len(), 2, "one idle list per thread");
    }

    #[tokio::test]
    async fn connections_past_the_routes_slots_wait_then_are_refused_unwritten() {
        let upstream = upstream(After::KeepOpen, &[b'x'; 64 * 1024], false).await;
        let slots = Slots::new(1, Duration::from_millis(200));
        let (reads, writes) = (
            pool_on(&upstream.origin, slots.clone()),
            pool_on(&upstream.origin, slots),
        );
        // A body not read to its end keeps its connection, and its slot.
        let held = send(&reads, get()).await.unwrap();
        for pool in [&reads, &writes] {
            let busy = send(pool, get()).await.err().expect("no slot");
            assert!(matches!(busy, SendError::Busy { max: 1, .. }), "{busy}");
        }
        assert_eq!(upstream.connections.load(Ordering::SeqCst), 1);
        // A slot that comes free within the wait is taken.
        let waiting = tokio::spawn({
            let writes = writes.clone();
            async move { read_all(&writes).await }
        });
        // One turn of this (single-threaded) runtime: it waits by now.
        tokio::task::yield_now().await;
        drop(held);
        assert_eq!(waiting.await.unwrap().len(), 64 * 1024);
        assert_eq!(upstream.connections.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn an_idle_connection_gives_its_slot_up_to_another_pool() {
        let upstream = upstream(After::KeepOpen, b"ok", false).await;
        let slots = Slots::new(1, Duration::from_millis(200));
        let (reads, writes) = (
            pool_on(&upstream.origin, slots.clone()),
            pool_on(&upstream.origin, slots),
        );
        assert_eq!(read_all(&reads).await, "ok".as_bytes());
        assert_eq!(reads.idle().len(), 1, "idle, holding the one slot");
        assert_eq!(read_all(&writes).await, "ok".as_bytes());
        assert!(reads.idle().is_empty(), "closed for the other pool's slot");
        assert_eq!(upstream.connections.load(Ordering::SeqCst), 2);
    }
}
