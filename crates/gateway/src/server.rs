//! Listeners, the accept loops and graceful shutdown.
//!
//! [`Gateway::start`] reads the TLS files the configuration names
//! ([`tls::read`]), opens the store (taking its lock), binds the proxy and
//! admin listeners and serves until [`Gateway::shutdown`]: the proxy stops
//! accepting, its connections finish and forward tasks record their
//! outcomes within `shutdown_grace`, then the admin listener stops (it
//! answers throughout, `/readyz` 503 `draining`), then the store closes,
//! which releases it for the next process. Whatever could not be recorded
//! is still `in_progress` in the store and becomes `unknown` at the next
//! start.
//!
//! Each listener holds at most its configured number of connections
//! (`max_connections`, `admin_max_connections`, counted apart); a
//! connection over the cap has its request answered 503 `overloaded` and
//! is closed, and those refusals are bounded in number and time too. Over
//! the admin listener's cap the liveness probe is still answered 200: the
//! process that answers it is alive, only busy, and a restart would cut
//! every write in flight. A process out of file descriptors refuses a new
//! connection as it comes (`accept`).
//!
//! A listener with a certificate (`tls_cert`, `admin_tls_cert`) speaks TLS
//! only: the handshake runs in the connection's task, holding its place
//! under the cap, and must end within `header_read_timeout`, like a request
//! head. [`Gateway::reload_tls`] swaps the certificates for new handshakes.
//! Each connection is then served as HTTP/1.1 or HTTP/2, as the client
//! speaks, with the listener's limits (`connection`).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout_at};
use tokio_rustls::TlsAcceptor;
use tokio_util::either::Either;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::accept::Acceptor;
use crate::access_log::AccessLog;
use crate::admin::auth::{AdminToken, ExposedAdmin, UnusableToken};
use crate::admin::{self, Admin};
use crate::alerts::deliverer::Deliverer;
use crate::alerts::in_flight::InFlight;
use crate::alerts::{self, AlertError, Endpoint, Poster};
use crate::config::{Config, Route, ServerConfig};
use crate::connection::Http;
use crate::metrics::Metrics;
use crate::pipeline::drill::Drill;
use crate::pipeline::error::ProxyError;
use crate::pipeline::forward::Peer;
use crate::pipeline::host::ViaTls;
use crate::pipeline::{Proxy, Shutdown};
use crate::route_settings::{self, Mode, StartRefused};
use crate::tls::{FieldError, Reloadable, ServerTls, TlsError};
use crate::traces::settings::TraceSettings;
use crate::traces::{TraceError, Tracing};
use crate::{replicas, retention, stores, tls};
use idemgate_model::clock::{Clock, SystemClock};
use idemgate_store::scope_key::{ScopeKey, ScopeKeyError};
use idemgate_store::{SealError, Store, StoreError, StoreKeys};

/// Why the gateway did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    StoreKeys(#[from] SealError),
    #[error(transparent)]
    ScopeKey(#[from] ScopeKeyError),
    #[error("cannot listen on {addr} ({field}): {error}")]
    Bind {
        field: &'static str,
        addr: SocketAddr,
        error: std::io::Error,
    },
    #[error(transparent)]
    ExposedAdmin(#[from] ExposedAdmin),
    #[error(transparent)]
    UnusableAdminToken(#[from] UnusableToken),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    TlsFile(#[from] FieldError),
    #[error(transparent)]
    Alerts(#[from] AlertError),
    #[error(transparent)]
    Traces(#[from] TraceError),
    #[error(transparent)]
    RouteSettings(#[from] route_settings::StartRefused),
}

/// A running gateway.
pub struct Gateway {
    addr: SocketAddr,
    admin_addr: SocketAddr,
    shutdown: CancellationToken,
    serving: JoinHandle<()>,
    /// The listeners that speak TLS, for [`Gateway::reload_tls`].
    tls: Vec<Arc<ServerTls>>,
    /// The routes' upstream client certificates, by route name, likewise.
    upstream_identities: Vec<(String, Reloadable)>,
    /// For [`Gateway::health`].
    store: Arc<dyn Store>,
}

/// What [`Gateway::health`] found: the store took a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Health {
    /// Operations held `unknown`, waiting for a probe or an operator.
    pub(crate) held: u64,
}

/// What an embedding program (the demo, tests) may set beyond the config.
pub struct StartOptions {
    /// The clock the store and the time windows read.
    pub clock: Arc<dyn Clock>,
    /// The admin token itself, instead of reading `admin_token_env`.
    pub admin_token: Option<String>,
    /// Variables read before the process environment for the store's
    /// keys (the environment is global to a process; tests run many
    /// gateways in one).
    pub env: HashMap<String, String>,
    /// How often the background tasks run.
    pub pace: Pace,
    /// The runtimes the proxy listener's connections are spread over, one
    /// after another (each connection stays on its runtime); none: the
    /// runtime the gateway was started on ([`crate::workers`]).
    pub workers: Vec<Handle>,
    /// Faults injected into every route's writes, for `idemgate rehearse`'s
    /// own gateway; no config key can set one, and `serve` never does.
    pub drill: Option<Arc<Drill>>,
    /// Where each proxied request's line goes (`serve`'s stderr, when
    /// `RUST_LOG` lets them through); none: not written.
    pub access_log: Option<AccessLog>,
    /// Start even where a route's identity settings changed while the
    /// store holds operations held under the old ones
    /// (`serve --accept-route-changes`, [`route_settings`]).
    pub accept_route_changes: bool,
}

/// How often the background tasks run: the defaults suit a deployment;
/// tests shorten them instead of waiting for the wall clock. Each task
/// counts its passes (`idemgate_background_passes_total{task}`).
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// Between two retention sweeps; `None`: `retention::interval` of
    /// `store.retention`.
    pub sweep: Option<Duration>,
    /// Between two looks at the peers and the pauses, on a shared store
    /// (`replicas::WATCH_EVERY`).
    pub watch: Duration,
    /// Between two polls of the alert outbox while endpoints are
    /// configured (`alerts::deliverer::POLL`).
    pub alert_poll: Duration,
    /// Between two polls without endpoints, which only tidy the outbox
    /// (`alerts::deliverer::IDLE_POLL`).
    pub alert_idle: Duration,
    /// The longest a connection over its listener's cap is kept to read
    /// its request head and be answered 503 ([`REFUSAL_TIME`]).
    pub refusal: Duration,
}

impl Default for Pace {
    fn default() -> Self {
        Pace {
            sweep: None,
            watch: replicas::WATCH_EVERY,
            alert_poll: alerts::deliverer::POLL,
            alert_idle: alerts::deliverer::IDLE_POLL,
            refusal: REFUSAL_TIME,
        }
    }
}

impl StartOptions {
    /// The value of the environment variable `name`, [`StartOptions::env`] first.
    pub fn var(&self, name: &str) -> Option<String> {
        self.env
            .get(name)
            .cloned()
            .or_else(|| std::env::var(name).ok())
    }
}

impl Default for StartOptions {
    fn default() -> Self {
        StartOptions {
            clock: Arc::new(SystemClock),
            admin_token: None,
            env: HashMap::new(),
            pace: Pace::default(),
            workers: Vec::new(),
            drill: None,
            access_log: None,
            accept_route_changes: false,
        }
    }
}

impl Gateway {
    /// Opens the store and starts serving.
    pub async fn start(config: Config) -> Result<Gateway, StartError> {
        Self::start_with(config, StartOptions::default()).await
    }

    /// [`Gateway::start`] with [`StartOptions`].
    pub async fn start_with(config: Config, options: StartOptions) -> Result<Gateway, StartError> {
        // First: a file that cannot be used is refused before anything is
        // created or locked.
        let listeners = tls::read(&config)?;
        for warning in listeners.warnings() {
            tracing::warn!("{warning}");
        }
        for warning in config.warnings() {
            tracing::warn!("{warning}");
        }
        let clock = options.clock.clone();
        let lookup = |name: &str| options.var(name);
        let trace_settings = TraceSettings::from_env(&lookup).map_err(TraceError::from)?;
        let keys = StoreKeys {
            seal: stores::seal(&config.store, &lookup)?,
            scope: stores::scope_key(&config.store, &lookup)?,
        };
        let owner = uuid::Uuid::now_v7().to_string();
        let scope_key = keys.scope.clone();
        let store = stores::open(&config.store, owner, clock.clone(), keys).await?;
        let serving = Self::serve(
            config,
            listeners,
            store.clone(),
            scope_key,
            trace_settings,
            options,
        );
        match serving.await {
            Ok(gateway) => Ok(gateway),
            Err(error) => {
                store.close().await;
                Err(error)
            }
        }
    }

    async fn serve(
        config: Config,
        listeners: tls::Listeners,
        store: Arc<dyn Store>,
        scope_key: ScopeKey,
        trace_settings: Option<TraceSettings>,
        options: StartOptions,
    ) -> Result<Gateway, StartError> {
        let (clock, pace) = (options.clock, options.pace);
        let (workers, drill) = (options.workers, options.drill);
        let (access_log, accept_route_changes) = (options.access_log, options.accept_route_changes);
        let server = config.server.clone();
        let token = match options.admin_token {
            Some(token) => AdminToken::new(token, &server.admin_token_env),
            None => AdminToken::from_env(&server.admin_token_env),
        }?;
        token.check_exposure(server.admin_listen, &server.admin_token_env)?;
        token.check_length(server.max_header_bytes)?;
        let proxy_tls = listeners.proxy.map(Arc::new);
        let admin_tls = listeners.admin.map(Arc::new);
        let alert_endpoints = Endpoint::all(&config.alerts)?;
        let poster = Poster::new()?;
        let bind = |field, addr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|error| StartError::Bind { field, addr, error })
        };
        let proxy_listener = bind("server.listen", server.listen).await?;
        let admin_listener = bind("server.admin_listen", server.admin_listen).await?;
        let addr = proxy_listener
            .local_addr()
            .map_err(|error| StartError::Bind {
                field: "server.listen",
                addr: server.listen,
                error,
            })?;
        let admin_addr = admin_listener
            .local_addr()
            .map_err(|error| StartError::Bind {
                field: "server.admin_listen",
                addr: server.admin_listen,
                error,
            })?;
        let shutdown = CancellationToken::new();
        // Cancelled only once the grace period is over: outcomes the store
        // refused are retried until then.
        let give_up = CancellationToken::new();
        // The latch trips on transitions to `unknown`, and the recovery is
        // one; a restart that marks nothing leaves an operator's resume alone.
        replicas::recover(store.as_ref(), &config.routes).await?;
        let settings = route_settings::check(
            store.as_ref(),
            &config.routes,
            accept_route_changes,
            Mode::Start,
        )
        .await?;
        let paused = store.paused_routes().await?;
        let metrics = Arc::new(Metrics::new(store.batches()));
        metrics.start_at_zero(config.routes.iter().map(|route| route.name.as_str()));
        let traces = match &trace_settings {
            Some(settings) => Some(Arc::new(Tracing::start(
                settings,
                Handle::current(),
                metrics.trace_spans_dropped(),
            )?)),
            None => None,
        };
        let proxy_cap = ConnectionCap::new("proxy", server.max_connections, pace.refusal, &metrics);
        let admin_cap = ConnectionCap::new(
            "admin",
            server.admin_max_connections,
            pace.refusal,
            &metrics,
        );
        let proxy = Proxy::new(
            &config,
            store.clone(),
            scope_key,
            clock.clone(),
            metrics.clone(),
            Shutdown {
                stopping: shutdown.clone(),
                give_up: give_up.clone(),
            },
            drill,
        )?
        .traced(traces.clone())
        .logged(access_log)
        .guarding(token.digest());
        proxy.follow_pauses(&paused);
        proxy.follow_marked_calls().await?;
        let upstream_identities = proxy.upstream_identities();
        let proxy = Arc::new(proxy);
        // The start can no longer fail: these settings now serve.
        settings.keep(store.as_ref()).await?;
        let admin = Arc::new(Admin {
            store: store.clone(),
            proxy: proxy.clone(),
            metrics: metrics.clone(),
            clock: clock.clone(),
            token,
            body_timeout: server.header_read_timeout,
            draining: shutdown.clone(),
        });
        let proxy_service = {
            let proxy = proxy.clone();
            let via_tls = proxy_tls.is_some();
            move |peer: SocketAddr| {
                let proxy = proxy.clone();
                let peer = Peer::new(peer);
                service_fn(move |mut request: http::Request<_>| {
                    let (proxy, peer) = (proxy.clone(), peer.clone());
                    if via_tls {
                        request.extensions_mut().insert(ViaTls);
                    }
                    async move { Ok::<_, Infallible>(proxy.handle(request, peer).await) }
                })
            }
        };
        let admin_service = move |_peer: SocketAddr| {
            let admin = admin.clone();
            service_fn(move |request| {
                let admin = admin.clone();
                async move { Ok::<_, Infallible>(crate::admin::handle(admin, request).await) }
            })
        };
        let stop_accepting = CancellationToken::new();
        // Alerts go on while the proxy drains: a write lost then is alerted.
        let stop_alerts = CancellationToken::new();
        // The admin listener stops last, after the proxy drained.
        let stop_admin = CancellationToken::new();
        let sweep = tokio::spawn(retention::run(
            store.clone(),
            clock.clone(),
            config.store.retention,
            pace.sweep
                .unwrap_or_else(|| retention::interval(config.store.retention)),
            metrics.clone(),
            stop_accepting.clone(),
        ));
        let console = alerts::console_base(&config.server, admin_addr);
        // What the alerts' task is posting: what a stop abandons, if any.
        let alert_posts = Arc::new(InFlight::default());
        let alerts = tokio::spawn(
            Arc::new(Deliverer {
                store: store.clone(),
                endpoints: alert_endpoints,
                poster,
                clock,
                metrics: metrics.clone(),
                console,
                in_flight: alert_posts.clone(),
            })
            .run(pace.alert_poll, pace.alert_idle, stop_alerts.clone()),
        );
        let watch = tokio::spawn({
            let (store, proxy, routes) = (store.clone(), proxy.clone(), config.routes.clone());
            let (metrics, stop) = (metrics.clone(), stop_accepting.clone());
            async move {
                if store.shared() {
                    replicas::watch(store, proxy, routes, pace.watch, metrics, stop).await;
                }
            }
        });
        let proxy_loop = tokio::spawn(accept_loop(
            proxy_listener,
            proxy_tls.as_ref().map(|tls| tls.acceptor().clone()),
            server.clone(),
            proxy_cap,
            proxy_service,
            Spread::over(workers),
            stop_accepting.clone(),
        ));
        let admin_loop = tokio::spawn(accept_loop(
            admin_listener,
            admin_tls.as_ref().map(|tls| tls.acceptor().clone()),
            server.clone(),
            admin_cap,
            admin_service,
            Spread::over(Vec::new()),
            stop_admin.clone(),
        ));
        let serving = tokio::spawn({
            let (shutdown, store, traces) = (shutdown.clone(), store.clone(), traces.clone());
            async move {
                shutdown.cancelled().await;
                let deadline = Instant::now() + server.shutdown_grace;
                stop_accepting.cancel();
                for task in [proxy_loop, sweep, watch] {
                    let _ = task.await;
                }
                // Connections are drained; forward tasks get the rest of the grace to record.
                proxy.tasks().close();
                if timeout_at(deadline, proxy.tasks().wait()).await.is_err() {
                    tracing::warn!("forward tasks still running at the end of the grace period");
                }
                // The alerts' last pass, within what is left of the grace.
                stop_alerts.cancel();
                let alerts_abort = alerts.abort_handle();
                if timeout_at(deadline, alerts).await.is_err() {
                    // Counted before the abort ends them. None (the grace
                    // spent on the drain, or no endpoints): nothing was
                    // being delivered, whatever the task was doing.
                    let posting = alert_posts.len();
                    alerts_abort.abort();
                    if posting > 0 {
                        tracing::warn!(
                            posting,
                            "alerts still being delivered at the end of the grace period: they are sent after the next start"
                        );
                    }
                }
                give_up.cancel();
                if let Some(traces) = &traces {
                    traces.shutdown().await;
                }
                stop_admin.cancel();
                let _ = admin_loop.await;
                store.close().await;
            }
        });
        tracing::info!(
            %addr,
            %admin_addr,
            proxy_tls = proxy_tls.is_some(),
            admin_tls = admin_tls.is_some(),
            traces = traces.is_some(),
            "listening"
        );
        Ok(Gateway {
            addr,
            admin_addr,
            shutdown,
            serving,
            tls: proxy_tls.into_iter().chain(admin_tls).collect(),
            upstream_identities,
            store,
        })
    }

    /// Why a start with `routes` would be refused over what the store holds
    /// now (`accept`: with `--accept-route-changes`), if it would: a
    /// reload's word on an edited config file. Nothing is kept or logged;
    /// a store that cannot be read in [`REFUSAL_CHECK`] says so.
    pub async fn refusal_of(&self, routes: &[Route], accept: bool) -> Option<String> {
        let check = route_settings::check(self.store.as_ref(), routes, accept, Mode::Reload);
        match tokio::time::timeout(REFUSAL_CHECK, check).await {
            Ok(Ok(_)) => None,
            Ok(Err(StartRefused::Held(held))) => Some(held.to_string()),
            Ok(Err(StartRefused::Store(error))) => Some(format!(
                "the store could not be read to tell whether it would start: {error}"
            )),
            Err(_) => Some(format!(
                "the store did not answer within {REFUSAL_CHECK:?} to tell whether it would start"
            )),
        }
    }

    /// Reads every TLS listener's certificate and key again, and every
    /// route's upstream client certificate (SIGHUP): new handshakes get
    /// the new certificate, open connections keep theirs. One whose files
    /// do not load keeps the certificate it has; each outcome is logged,
    /// and the first failure returned.
    pub fn reload_tls(&self) -> Result<(), TlsError> {
        if self.tls.is_empty() && self.upstream_identities.is_empty() {
            tracing::info!("no TLS listener and no upstream client certificate: nothing to reload");
        }
        let mut first_error = None;
        for tls in &self.tls {
            let listener = tls.listener();
            match tls.reload() {
                Ok(()) => tracing::info!(listener, "TLS certificate reloaded"),
                Err(error) => {
                    tracing::error!(listener, %error, "TLS certificate not reloaded; the previous one stays in use");
                    first_error.get_or_insert(error);
                }
            }
        }
        for (route, identity) in &self.upstream_identities {
            match identity.reload() {
                Ok(()) => tracing::info!(route, "upstream client certificate reloaded"),
                Err(error) => {
                    tracing::error!(route, %error, "upstream client certificate not reloaded; the previous one stays in use");
                    first_error.get_or_insert(error);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Whether the gateway can take a write: the store's writer commits
    /// (as `/readyz` asks it), and how many operations are held.
    pub async fn health(&self) -> Result<Health, StoreError> {
        self.store.ping().await?;
        let stats = self.store.stats().await?;
        let held = stats
            .counts
            .iter()
            .filter(|(_, state, _)| *state == idemgate_model::operation::State::Unknown)
            .map(|(_, _, count)| count)
            .sum();
        Ok(Health { held })
    }

    /// The proxy listener's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The admin listener's address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// Stops accepting, drains within `shutdown_grace`, closes the store.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        if let Err(error) = self.serving.await {
            tracing::error!(%error, "the server task failed");
        }
    }
}

/// How long a reload waits for the store to tell whether an edited
/// config file would start ([`Gateway::refusal_of`]): a signal's handling
/// is not held up by a slow store.
const REFUSAL_CHECK: Duration = Duration::from_secs(5);

/// Connections over a listener's cap that are being answered 503, at most:
/// each holds a read buffer for one request head, and for at most
/// [`Pace::refusal`]. Past this a connection is closed as it is accepted.
const REFUSING: usize = 64;

/// The longest a connection over the cap is kept to read its request head
/// and be answered, unless [`Pace::refusal`] says otherwise.
pub const REFUSAL_TIME: Duration = Duration::from_secs(2);

/// A listener's bound on open connections.
struct ConnectionCap {
    /// `proxy` or `admin`, for the metric.
    listener: &'static str,
    /// One permit per open connection, held by its task.
    open: Arc<Semaphore>,
    /// One permit per connection being refused ([`REFUSING`]).
    refusing: Arc<Semaphore>,
    /// How long a refused connection is kept at most ([`Pace::refusal`]).
    refusal: Duration,
    /// Whether a refused connection's liveness probe is answered 200 (the
    /// admin listener's).
    answers_liveness: bool,
    metrics: Arc<Metrics>,
}

impl ConnectionCap {
    fn new(listener: &'static str, max: usize, refusal: Duration, metrics: &Arc<Metrics>) -> Self {
        ConnectionCap {
            listener,
            open: Arc::new(Semaphore::new(max)),
            refusing: Arc::new(Semaphore::new(REFUSING)),
            refusal,
            answers_liveness: listener == "admin",
            metrics: metrics.clone(),
        }
    }

    /// Answers a connection over the cap: its first request gets 503
    /// `overloaded` (an HTTP client sees an answer, not a broken
    /// connection) and the connection is closed. Refusals are bounded in
    /// number and time themselves; past [`REFUSING`] the connection is
    /// closed at once. Either way nothing is sent, so a retry is safe.
    fn refuse(&self, stream: TcpStream, tls: Option<TlsAcceptor>, server: &ServerConfig) {
        self.metrics.refused_connection(self.listener);
        let Ok(permit) = self.refusing.clone().try_acquire_owned() else {
            return;
        };
        let refusal_time = self.refusal;
        let refusal = Refusal {
            answers_liveness: self.answers_liveness,
        };
        let http = Http::refusing(server, refusal_time);
        tokio::spawn(async move {
            let _ = tokio::time::timeout(refusal_time, async {
                if let Some(stream) = open(stream, tls.as_ref(), refusal_time).await {
                    let never = CancellationToken::new();
                    let _ = http.serve(TokioIo::new(stream), refusal, &never).await;
                }
            })
            .await;
            drop(permit);
        });
    }
}

/// The service of a connection over the cap: 503 `overloaded` to
/// anything but, on the admin listener, the liveness probe.
struct Refusal {
    answers_liveness: bool,
}

impl hyper::service::Service<http::Request<hyper::body::Incoming>> for Refusal {
    type Response = http::Response<crate::body::ProxyBody>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn call(&self, request: http::Request<hyper::body::Incoming>) -> Self::Future {
        if self.answers_liveness && admin::is_liveness_probe(&request) {
            return std::future::ready(Ok(admin::alive()));
        }
        let overloaded = ProxyError::Overloaded {
            what: "open connections",
            operation: None,
        };
        std::future::ready(Ok(overloaded.into_response()))
    }
}

/// Where accepted connections are served: on the accept loop's runtime,
/// or on the next of the workers' runtimes in turn.
struct Spread {
    workers: Vec<Handle>,
    next: usize,
}

impl Spread {
    fn over(workers: Vec<Handle>) -> Spread {
        Spread { workers, next: 0 }
    }

    /// Runs `serve` for the connection `stream` where it goes; `serve`
    /// gets the stream registered with that runtime's I/O driver.
    fn serve<F, Fut>(&mut self, stream: TcpStream, serve: F)
    where
        F: FnOnce(TcpStream) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        if self.workers.is_empty() {
            tokio::spawn(serve(stream));
            return;
        }
        let worker = &self.workers[self.next % self.workers.len()];
        self.next = self.next.wrapping_add(1);
        // Out of this runtime's driver, into the worker's, on the worker.
        match stream.into_std() {
            Ok(stream) => {
                worker.spawn(async move {
                    match TcpStream::from_std(stream) {
                        Ok(stream) => serve(stream).await,
                        Err(error) => tracing::warn!(%error, "cannot hand a connection over"),
                    }
                });
            }
            Err(error) => tracing::warn!(%error, "cannot hand a connection over"),
        }
    }
}

/// Accepts connections until shutdown, then waits up to `shutdown_grace` for
/// the open ones to finish their requests. At most `cap` connections are
/// open at once; more are refused ([`ConnectionCap::refuse`]).
async fn accept_loop<F, S>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    server: ServerConfig,
    cap: ConnectionCap,
    service: F,
    mut spread: Spread,
    stop: CancellationToken,
) where
    F: Fn(SocketAddr) -> S + Send + 'static,
    S: hyper::service::Service<
            http::Request<hyper::body::Incoming>,
            Response = http::Response<crate::body::ProxyBody>,
            Error = Infallible,
        > + Send
        + 'static,
    S::Future: Send + 'static,
{
    let http = Arc::new(Http::new(&server));
    // Cancelled when accepting stops: each connection finishes what it has
    // in progress and closes; the tracker waits for them.
    let closing = CancellationToken::new();
    let connections = TaskTracker::new();
    let mut acceptor = Acceptor::new(listener, cap.listener, cap.metrics.clone());
    loop {
        let (stream, peer) = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = acceptor.accept() => accepted,
        };
        let Ok(permit) = cap.open.clone().try_acquire_owned() else {
            tracing::debug!(%peer, listener = cap.listener, "connection refused: listener at its cap");
            cap.refuse(stream, tls.clone(), &server);
            continue;
        };
        let _ = stream.set_nodelay(true);
        // Tracked from before the handshake: shutdown waits for it (bounded
        // by `header_read_timeout`), and a connection that completes it late
        // is told to close at once.
        let tracked = connections.token();
        let (http, service, tls) = (http.clone(), service(peer), tls.clone());
        let closing = closing.clone();
        let handshake_within = server.header_read_timeout;
        spread.serve(stream, move |stream| async move {
            if let Some(stream) = open(stream, tls.as_ref(), handshake_within).await {
                let served = http.serve(TokioIo::new(stream), service, &closing).await;
                if let Err(error) = served {
                    tracing::debug!(%peer, %error, "connection ended with an error");
                }
            }
            drop(permit);
            drop(tracked);
        });
    }
    drop(acceptor);
    let deadline = Instant::now() + server.shutdown_grace;
    closing.cancel();
    connections.close();
    if timeout_at(deadline, connections.wait()).await.is_err() {
        tracing::warn!("connections still open at the end of the grace period");
    }
}

/// An accepted connection as HTTP reads it: plain TCP, or TLS over it.
type Stream = Either<TcpStream, tokio_rustls::server::TlsStream<TcpStream>>;

/// The connection ready for HTTP: on a TLS listener, after a handshake that
/// ended within `within` (a client that stalls it is cut off as one that
/// stalls its request head is); `None` when it failed.
async fn open(stream: TcpStream, tls: Option<&TlsAcceptor>, within: Duration) -> Option<Stream> {
    let Some(acceptor) = tls else {
        return Some(Either::Left(stream));
    };
    let peer = stream.peer_addr().ok();
    match tokio::time::timeout(within, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => Some(Either::Right(stream)),
        Ok(Err(error)) => {
            tracing::debug!(?peer, %error, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(?peer, "TLS handshake not done in time");
            None
        }
    }
}
