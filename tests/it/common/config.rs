//! Gateway configs for tests: [`Setup`] and the TOML it writes.

use super::*;

/// A complete config for one route `api` at `path_prefix` → `upstream_url`,
/// with `route_extra` (TOML lines) appended to the route table.
pub fn gateway_toml(
    store: &Path,
    upstream_url: &str,
    path_prefix: &str,
    route_extra: &str,
) -> String {
    gateway_toml_with(
        store,
        upstream_url,
        &Setup::route(route_extra).at(path_prefix),
    )
}

/// Like [`gateway_toml`], with every part [`Setup`] can add.
pub fn gateway_toml_with(store: &Path, upstream_url: &str, setup: &Setup) -> String {
    format!(
        r#"[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
{server_extra}

[store]
url = "{store_url}"
durability = "{durability}"
{scope_key}{store_extra}

[[routes]]
name = "api"
path_prefix = "{path_prefix}"
upstream = "{upstream_url}"
{route_extra}
"#,
        store_url = setup
            .store_url
            .clone()
            .unwrap_or_else(|| format!("sqlite://{}", store.display())),
        path_prefix = setup.path_prefix,
        durability = setup.durability,
        scope_key = setup
            .scope_key_file
            .as_ref()
            .map(|file| format!("scope_key_file = \"{}\"\n", file.display()))
            .unwrap_or_default(),
        server_extra = setup.server,
        store_extra = setup.store,
        route_extra = setup.route,
    )
}

pub fn parse_config(toml: &str) -> Config {
    Config::from_toml_str(toml, "test.toml")
        .unwrap_or_else(|e| panic!("test config rejected: {e}\n{toml}"))
}

/// What a test gateway is made of beyond the defaults.
#[derive(Clone)]
pub struct Setup {
    pub path_prefix: String,
    /// TOML lines for the route table (a `[routes.reconcile]` table last).
    pub route: String,
    /// TOML lines for `[store]`.
    pub store: String,
    /// `store.durability`: `normal` (a test's machine need not survive a
    /// power loss) unless [`Setup::durable`].
    pub durability: &'static str,
    /// The store's URL; a SQLite file in the test's directory when `None`.
    pub store_url: Option<String>,
    /// `store.scope_key_file`: the schema's, on PostgreSQL.
    pub scope_key_file: Option<PathBuf>,
    /// TOML lines for `[server]`.
    pub server: String,
    /// The route's upstream; the fake upstream's URL when `None`.
    pub upstream_url: Option<String>,
    /// The clock the gateway (and its store) reads; the system's when `None`.
    pub clock: Option<Arc<dyn Clock>>,
    /// The admin token, handed over through `StartOptions`; none when `None`.
    pub admin_token: Option<String>,
    /// Environment variables (store keys) handed over through `StartOptions`.
    pub env: HashMap<String, String>,
    /// How often the background tasks run; a deployment's pace unless
    /// [`Setup::quick`].
    pub pace: Pace,
}

/// The background tasks' pace for tests that wait on them: a sweep, a look
/// at the peers and an alert poll (with endpoints or without) every 50 ms;
/// refused connections kept as long as in a deployment.
pub const QUICK: Pace = Pace {
    sweep: Some(Duration::from_millis(50)),
    watch: Duration::from_millis(50),
    alert_poll: Duration::from_millis(50),
    alert_idle: Duration::from_millis(50),
    refusal: idemgate::server::REFUSAL_TIME,
};

impl Setup {
    /// A catch-all route with `route_extra` lines.
    pub fn route(route_extra: &str) -> Setup {
        Setup {
            path_prefix: "/".into(),
            route: route_extra.into(),
            store: String::new(),
            durability: "normal",
            store_url: None,
            scope_key_file: None,
            server: String::new(),
            upstream_url: None,
            clock: None,
            admin_token: None,
            env: HashMap::new(),
            pace: Pace::default(),
        }
    }

    pub fn at(mut self, path_prefix: &str) -> Setup {
        self.path_prefix = path_prefix.into();
        self
    }

    pub fn store(mut self, lines: &str) -> Setup {
        self.store = lines.into();
        self
    }

    /// `store.durability = "full"`.
    pub fn durable(mut self) -> Setup {
        self.durability = "full";
        self
    }

    /// The shared store in `schema` instead of a SQLite file.
    pub fn postgres(self, schema: &PgSchema) -> Setup {
        self.shared_store(&schema.url, &schema.scope_key_file)
    }

    /// The shared store at `url`, with the scope key in `scope_key_file`.
    pub fn shared_store(mut self, url: &str, scope_key_file: &Path) -> Setup {
        self.store_url = Some(url.into());
        self.scope_key_file = Some(scope_key_file.into());
        self
    }

    pub fn server(mut self, lines: &str) -> Setup {
        self.server = lines.into();
        self
    }

    pub fn upstream_url(mut self, url: impl Into<String>) -> Setup {
        self.upstream_url = Some(url.into());
        self
    }

    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Setup {
        self.clock = Some(clock);
        self
    }

    /// The variable `name` set to `value` for the gateway (not the process).
    pub fn env(mut self, name: &str, value: &str) -> Setup {
        self.env.insert(name.into(), value.into());
        self
    }

    /// Background tasks at the [`QUICK`] pace, for tests that wait for
    /// their passes ([`next_full_pass`]).
    pub fn quick(mut self) -> Setup {
        self.pace = QUICK;
        self
    }

    /// An admin token of its own, for [`TestGateway::operation`].
    pub fn admin(mut self) -> Setup {
        self.admin_token = Some(format!("test-admin-{}", uuid::Uuid::now_v7().simple()));
        self
    }
}
