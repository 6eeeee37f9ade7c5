//! In-process gateways on a per-test SQLite file: [`TestGateway`].

use super::*;

/// An in-process gateway on its own SQLite file, with its fake upstream.
pub struct TestGateway {
    gateway: Option<Gateway>,
    pub upstream: FakeUpstream,
    pub toml: String,
    pub store_path: PathBuf,
    clock: Option<Arc<dyn Clock>>,
    admin_token: Option<String>,
    pace: Pace,
    /// What the gateway reads before its environment (store keys); a test
    /// may change it (and `toml`) between a shutdown and a start.
    pub env: HashMap<String, String>,
    /// `serve --accept-route-changes` at the next start.
    pub accept_route_changes: bool,
    /// Holds the store's directory, removed after the gateway above is
    /// dropped (the last field).
    _dir: TempDir,
}

/// A gateway with one catch-all route; `route_extra` adds route fields.
pub async fn spawn_gateway(route_extra: &str) -> TestGateway {
    spawn_gateway_at("/", route_extra).await
}

/// Like [`spawn_gateway`] with the route at `path_prefix`.
pub async fn spawn_gateway_at(path_prefix: &str, route_extra: &str) -> TestGateway {
    spawn_gateway_with(Setup::route(route_extra).at(path_prefix)).await
}

/// A gateway made as `setup` says, in front of a new fake upstream.
pub async fn spawn_gateway_with(setup: Setup) -> TestGateway {
    spawn_gateway_on(FakeUpstream::start().await, setup).await
}

/// A gateway (with the admin API) whose route probes `GET <upstream><probe>`
/// after a lost response, `probe` a path and query with `{key}` in it;
/// `matching` adds lines to the `[routes.reconcile]` table (e.g. a
/// `found_json_pointer`).
pub async fn spawn_probing(probe: &str, matching: &str) -> TestGateway {
    let upstream = FakeUpstream::start().await;
    let route = format!(
        "[routes.reconcile]\nurl = \"{}{probe}\"\nfound_status = 200\ntimeout = \"2s\"\n{matching}",
        upstream.url()
    );
    spawn_gateway_on(upstream, Setup::route(&route).admin()).await
}

/// A gateway made as `setup` says, in front of `upstream` (unless
/// `setup.upstream_url` points elsewhere).
pub async fn spawn_gateway_on(upstream: FakeUpstream, setup: Setup) -> TestGateway {
    let dir = tempfile::tempdir().expect("tempdir");
    let store_path = dir.path().join("idemgate.db");
    let url = setup.upstream_url.clone().unwrap_or_else(|| upstream.url());
    let toml = gateway_toml_with(&store_path, &url, &setup);
    let mut gateway = TestGateway {
        gateway: None,
        upstream,
        toml,
        store_path,
        clock: setup.clock,
        admin_token: setup.admin_token,
        pace: setup.pace,
        env: setup.env,
        accept_route_changes: false,
        _dir: dir,
    };
    gateway.start_again().await;
    gateway
}

impl TestGateway {
    pub fn gateway(&self) -> &Gateway {
        self.gateway.as_ref().expect("gateway running")
    }

    pub fn addr(&self) -> SocketAddr {
        self.gateway().addr()
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.gateway().admin_addr()
    }

    /// Graceful shutdown; the store lock is released when this returns.
    pub async fn shutdown(&mut self) {
        let gateway = self.gateway.take().expect("gateway running");
        tokio::time::timeout(WAIT, gateway.shutdown())
            .await
            .expect("gateway shutdown timed out");
    }

    /// Starts a graceful shutdown in the background; await the handle for
    /// its end (bounded by [`WAIT`]).
    pub fn begin_shutdown(&mut self) -> tokio::task::JoinHandle<()> {
        let gateway = self.gateway.take().expect("gateway running");
        tokio::spawn(async move {
            tokio::time::timeout(WAIT, gateway.shutdown())
                .await
                .expect("gateway shutdown timed out");
        })
    }

    /// Shuts down and starts a new gateway on the same store and config.
    pub async fn restart(&mut self) {
        self.shutdown().await;
        self.start_again().await;
    }

    /// Starts a new gateway on this one's store and config, after a
    /// [`TestGateway::shutdown`].
    pub async fn start_again(&mut self) {
        assert!(self.gateway.is_none(), "the gateway is still running");
        let started = self.try_start().await;
        self.gateway = Some(started.unwrap_or_else(|e| panic!("gateway failed to start: {e}")));
    }

    /// A `Gateway::start` on this gateway's store, config and environment,
    /// after a [`TestGateway::shutdown`]; its error when it refuses.
    pub async fn try_start(&self) -> Result<Gateway, idemgate::server::StartError> {
        // No child forked before the last shutdown still holds the store's lock.
        forks_done();
        let options = idemgate::server::StartOptions {
            clock: self
                .clock
                .clone()
                .unwrap_or_else(|| Arc::new(idemgate_model::clock::SystemClock)),
            admin_token: self.admin_token.clone(),
            env: self.env.clone(),
            pace: self.pace,
            accept_route_changes: self.accept_route_changes,
            ..Default::default()
        };
        tokio::time::timeout(WAIT, Gateway::start_with(parse_config(&self.toml), options))
            .await
            .expect("gateway start timed out")
    }

    /// A second `Gateway::start` on this gateway's config (same store).
    pub async fn try_start_another(&self) -> Result<Gateway, idemgate::server::StartError> {
        tokio::time::timeout(WAIT, Gateway::start(parse_config(&self.toml)))
            .await
            .expect("second gateway start timed out")
    }

    /// This gateway's admin token (see [`Setup::admin`]), for raw calls.
    pub fn admin_token(&self) -> &str {
        self.admin_token
            .as_deref()
            .expect("admin_token() needs a gateway set up with Setup::admin()")
    }

    /// One admin API call with this gateway's token (see [`Setup::admin`]).
    pub async fn admin(&self, method: &str, path: &str, body: &str) -> Response {
        let token = self
            .admin_token
            .as_deref()
            .expect("admin() needs a gateway set up with Setup::admin()");
        admin_call(self.admin_addr(), method, path, Some(token), body).await
    }

    /// The same write as `original` again (`path`, `key`, `body`): the
    /// answer is its replay, and the upstream has seen `writes` writes.
    pub async fn assert_retry_replays(
        &self,
        (path, key, body): (&str, &str, &str),
        original: &Response,
        writes: usize,
    ) {
        let retry = write(self.addr(), path, Some(key), body).await;
        assert_replay_of(&retry, original);
        assert_eq!(self.upstream.writes(), writes, "writes the upstream saw");
    }

    /// `POST /admin/keys/{id}/resolve` with `resolution`.
    pub async fn resolve(&self, id: &str, resolution: &Value) -> Response {
        let path = format!("/admin/keys/{id}/resolve");
        self.admin("POST", &path, &resolution.to_string()).await
    }

    /// [`TestGateway::resolve`] that must be taken (200): the operation it
    /// answers.
    pub async fn resolved(&self, id: &str, resolution: &Value) -> Value {
        taken(&self.resolve(id, resolution).await, resolution)
    }

    /// The newest operation with `key`, as `GET /admin/keys/{id}` shows it:
    /// `state`, `attempts`, `evidence`, `events` (`kind`, `detail`), …
    pub async fn operation(&self, key: &str) -> Value {
        self.try_operation(key)
            .await
            .unwrap_or_else(|| panic!("no operation with key {key}"))
    }

    /// [`TestGateway::operation`], or `None` while the store holds none
    /// with `key`.
    pub async fn try_operation(&self, key: &str) -> Option<Value> {
        let token = self
            .admin_token
            .as_deref()
            .expect("operation() needs a gateway set up with Setup::admin()");
        try_operation_at(self.admin_addr(), token, key).await
    }
}

/// The answer to `resolution`, which must have been taken (200): the
/// operation it answers.
pub fn taken(resolved: &Response, resolution: &Value) -> Value {
    let body = String::from_utf8_lossy(&resolved.body);
    assert_eq!(resolved.status, 200, "{resolution} refused: {body}");
    resolved.json()
}

/// The newest operation with `key`, as the admin API at `admin` shows it
/// to `token`.
pub async fn operation_at(admin: SocketAddr, token: &str, key: &str) -> Value {
    try_operation_at(admin, token, key)
        .await
        .unwrap_or_else(|| panic!("no operation with key {key}"))
}

/// [`operation_at`], or `None` while there is none with `key`.
async fn try_operation_at(admin: SocketAddr, token: &str, key: &str) -> Option<Value> {
    let list = admin_call(
        admin,
        "GET",
        &format!("/admin/keys?key={key}"),
        Some(token),
        "",
    )
    .await;
    assert_eq!(list.status, StatusCode::OK, "admin list: {:?}", list.body);
    let id = list.json()["items"][0]["id"].as_str()?.to_owned();
    let shown = admin_call(admin, "GET", &format!("/admin/keys/{id}"), Some(token), "").await;
    assert_eq!(shown.status, StatusCode::OK, "admin show: {:?}", shown.body);
    Some(shown.json())
}

/// The `detail` of each event of `kind` in an operation's timeline.
pub fn events_of(operation: &Value, kind: &str) -> Vec<Value> {
    operation["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["kind"] == kind)
        .map(|e| e["detail"].clone())
        .collect()
}

/// A second connection to the gateway's SQLite file holding the write lock
/// until it is released: the store's writer cannot begin a transaction, so
/// every store call (reads too) waits out its 5 s busy timeout.
pub struct WriteLock(sqlx::SqliteConnection);

impl WriteLock {
    pub async fn take(gw: &TestGateway) -> Self {
        Self::on(&gw.store_path).await
    }

    /// The write lock of the SQLite file at `store` (a gateway process's).
    pub async fn on(store: &Path) -> Self {
        let url = format!("sqlite://{}", store.display());
        let mut conn = <sqlx::SqliteConnection as sqlx::Connection>::connect(&url)
            .await
            .expect("second connection");
        sqlx::query("BEGIN EXCLUSIVE")
            .execute(&mut conn)
            .await
            .expect("write lock");
        WriteLock(conn)
    }

    pub async fn release(mut self) {
        sqlx::query("ROLLBACK")
            .execute(&mut self.0)
            .await
            .expect("release");
    }
}
