//! Configuration: the TOML file as written (`Raw*` types, `deny_unknown_fields`)
//! kept apart from the validated runtime [`Config`] the gateway runs on.
//!
//! Invariant: a `Config` value is always valid. Every unknown field and bad
//! value is rejected here with the file, the field and the reason, never
//! silently ignored (docs/configuration.md, "Every key").

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::header::HeaderName;
use http::{Method, Uri};
use serde::Deserialize;
use tokio::sync::Semaphore;

use crate::tls::{self, CertPair, ClientTls};

/// Why a configuration was refused. Each variant names the source (file path or
/// `<inline>`), so an operator knows what to edit.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{source_name}: cannot read: {error}")]
    Read {
        source_name: String,
        error: std::io::Error,
    },
    #[error("{source_name}: {message}")]
    Parse {
        source_name: String,
        message: String,
    },
    #[error("{source_name}: field `{field}`: {reason}")]
    Invalid {
        source_name: String,
        field: String,
        reason: String,
    },
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub server: ServerConfig,
    pub store: StoreConfig,
    pub routes: Vec<Route>,
    /// `[[alerts]]`: webhooks told about held work.
    pub alerts: Vec<AlertConfig>,
}

/// One validated `[[alerts]]` entry: a webhook and what it is told.
#[derive(Debug, Clone)]
pub struct AlertConfig {
    /// http or https; POSTed to as given.
    pub url: Uri,
    /// The environment variable holding the signing secret, if any.
    pub secret_env: Option<String>,
    pub events: Vec<AlertEvent>,
    /// `unknown-aged`: an operation `unknown` for this long.
    pub aged_after: Duration,
    /// A delivery still failing this long after its event is dropped.
    pub give_up_after: Duration,
}

/// What an alert reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlertEvent {
    /// An operation became `unknown`.
    OperationUnknown,
    /// A route was paused (by an operator or its latch).
    RoutePaused,
    /// An operation has been `unknown` for `aged_after`.
    UnknownAged,
}

impl AlertEvent {
    pub const ALL: [AlertEvent; 3] = [
        AlertEvent::OperationUnknown,
        AlertEvent::RoutePaused,
        AlertEvent::UnknownAged,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AlertEvent::OperationUnknown => "operation-unknown",
            AlertEvent::RoutePaused => "route-paused",
            AlertEvent::UnknownAged => "unknown-aged",
        }
    }
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    /// The environment variable holding the admin API's bearer token.
    pub admin_token_env: String,
    /// The proxy listener's certificate and key: TLS when set.
    pub tls: Option<CertPair>,
    /// The admin listener's, set apart: operators may use another CA.
    pub admin_tls: Option<CertPair>,
    /// Slow or silent clients are cut off after this long without a full head.
    pub header_read_timeout: Duration,
    /// hyper's read buffer bound; larger request heads get 431.
    pub max_header_bytes: usize,
    pub shutdown_grace: Duration,
    /// Open connections on the proxy listener; more are answered 503
    /// `overloaded` and closed at once, so a flood of idle or slow
    /// connections cannot take every file descriptor and task.
    pub max_connections: usize,
    /// The same bound for the admin listener, kept apart so that a flood
    /// on one listener never locks operators out of the other.
    pub admin_max_connections: usize,
    /// What the request bodies of all writes being read or held may take
    /// together; a write that would need more is 503 `overloaded`.
    pub buffered_body_budget: usize,
}

#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub url: StoreUrl,
    pub durability: Durability,
    /// `completed` and `not_attempted` operations are deleted this long after
    /// their last update; `unknown` ones never expire on their own.
    pub retention: Duration,
    /// PostgreSQL: how long a replica that stopped renewing still counts as
    /// alive (the database's clock); its operations in flight become
    /// `unknown` after that.
    pub lease: Duration,
    /// The environment variable holding the key (32 bytes, base64) that
    /// seals stored payloads; `None`: stored in clear.
    pub encryption_key_env: Option<String>,
    /// The variable holding the key payloads were sealed with before a
    /// rotation: read only, until `idemgate rekey` has sealed them again.
    pub previous_key_env: Option<String>,
    /// The variable holding the scope key (32 bytes, base64); before
    /// `scope_key_file`.
    pub scope_key_env: Option<String>,
    /// The file holding the scope key; SQLite's default is
    /// `<store file>.scope-key`, created at first start.
    pub scope_key_file: Option<PathBuf>,
}

/// Where operations are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    Sqlite(PathBuf),
    /// `postgres://…` or `postgresql://…`, as given (sqlx reads its options).
    Postgres(String),
}

impl StoreUrl {
    /// Parses `sqlite://PATH` (or `sqlite:PATH`), where `sqlite:///abs/path.db`
    /// is absolute, or a `postgres://` URL.
    pub fn parse(url: &str) -> Result<Self, String> {
        let path = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"));
        match path {
            Some("") => Err("the sqlite URL names no file".into()),
            Some(p) if p.contains('?') => {
                Err("sqlite URL options are not supported; use the [store] fields".into())
            }
            Some(p) if p.starts_with(":memory:") => Err(
                "an in-memory store would forget every operation on restart; name a file".into(),
            ),
            Some(p) => Ok(StoreUrl::Sqlite(PathBuf::from(p))),
            None if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                Ok(StoreUrl::Postgres(url.to_string()))
            }
            None => Err("expected sqlite://FILE or postgres://…".into()),
        }
    }
}

impl std::fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreUrl::Sqlite(path) => write!(f, "sqlite://{}", path.display()),
            StoreUrl::Postgres(url) => f.write_str(&redact_url(url)),
        }
    }
}

/// `url` with its password (if any) replaced by `***`, for messages and logs.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => match rest[..at].split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***{}", &rest[at..]),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

/// How hard each commit is pushed to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// fsync every commit: survives a power loss.
    Full,
    /// Survives a process crash, not a power loss.
    Normal,
}

/// Where a write's `Idempotency-Key` comes from when the client sends none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyMode {
    Require,
    Derive,
    Assign,
    Off,
}

/// What a request gets while the first one with its key is still running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InProgressMode {
    /// 409 `request-in-progress` with `Retry-After`.
    Reject,
    /// Wait (up to `wait_timeout`) for the first attempt's outcome.
    Wait,
}

impl std::str::FromStr for KeyMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "require" => Ok(KeyMode::Require),
            "derive" => Ok(KeyMode::Derive),
            "assign" => Ok(KeyMode::Assign),
            "off" => Ok(KeyMode::Off),
            other => Err(format!(
                "unknown key mode `{other}`: expected require, derive, assign or off"
            )),
        }
    }
}

/// A route's reconcile probe (docs/requests.md, "After a lost response"): a read-only GET to the route's
/// own upstream that may prove an `unknown` operation happened.
#[derive(Debug, Clone)]
pub struct Reconcile {
    /// The URL with `{key}` where the bare key goes (URL-component encoded):
    /// on the route's own upstream origin, `{key}` only in the path or the
    /// query, and no fragment.
    pub url: String,
    pub found_status: u16,
    /// When set, the probe's JSON body must have a non-null value here.
    pub found_json_pointer: Option<String>,
    pub timeout: Duration,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReconcile {
    url: String,
    found_status: Option<u16>,
    found_json_pointer: Option<String>,
    timeout: Option<String>,
}

/// A route's quota per scope: at most `operations` writes sent upstream
/// and at most `stored_bytes` added to the store per `window` for each
/// scope (at least one of the two is set).
#[derive(Debug, Clone)]
pub struct Quota {
    pub operations: Option<u32>,
    pub stored_bytes: Option<u64>,
    pub window: Duration,
}

/// The origin a route forwards to: scheme and authority only.
#[derive(Debug, Clone)]
pub struct Upstream {
    pub scheme: http::uri::Scheme,
    pub authority: http::uri::Authority,
}

impl Upstream {
    /// An upstream: the origin only.
    fn parse(url: &str) -> Result<Self, String> {
        let uri: Uri = url.parse().map_err(|e| format!("not a URL: {e}"))?;
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(
                "give the origin only (scheme://host[:port]); each request's own path is forwarded"
                    .into(),
            );
        }
        Self::parse_any(url)
    }

    /// The origin of any http(s) URL.
    fn parse_any(url: &str) -> Result<Self, String> {
        let uri: Uri = url.parse().map_err(|e| format!("not a URL: {e}"))?;
        let scheme = uri.scheme().cloned().ok_or("the URL has no scheme")?;
        if scheme != http::uri::Scheme::HTTP && scheme != http::uri::Scheme::HTTPS {
            return Err(format!("scheme `{scheme}` is not http or https"));
        }
        let authority = uri.authority().cloned().ok_or("the URL has no host")?;
        if authority.as_str().contains('@') {
            return Err("credentials in the upstream URL are not allowed".into());
        }
        Ok(Upstream { scheme, authority })
    }

    /// The upstream URI for a request's path and query.
    pub fn uri_for(&self, path_and_query: &str) -> Result<Uri, http::Error> {
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(path_and_query)
            .build()
    }
}

/// One validated `[[routes]]` entry.
#[derive(Debug, Clone)]
pub struct Route {
    pub name: String,
    pub path_prefix: String,
    pub upstream: Upstream,
    /// Extra trust roots and a client certificate for an https upstream.
    pub upstream_tls: ClientTls,
    pub methods: Vec<Method>,
    pub key: KeyMode,
    /// JSON pointers naming the business action (derive mode).
    pub derive_from: Vec<String>,
    /// Derive mode without `derive_from`: how long an identical request is
    /// the same operation after the earlier one's last update.
    pub derive_window: Duration,
    pub scope_headers: Vec<HeaderName>,
    pub allow_anonymous: bool,
    pub fingerprint_headers: Vec<HeaderName>,
    pub ignore_fields: Vec<String>,
    /// `None` when the file sets it to the empty string: the key is not forwarded.
    pub forward_key_header: Option<HeaderName>,
    pub in_progress: InProgressMode,
    pub wait_timeout: Duration,
    /// `wait` mode: duplicates waiting on one operation at once; more get
    /// 409 `request-in-progress` at once.
    pub max_waiters: usize,
    /// Writes sent per scope and window; `None`: no quota.
    pub quota: Option<Quota>,
    /// After `upstream_timeout`, how long the exchange is kept open for a
    /// late response that settles an `unknown` operation.
    pub late_window: Duration,
    /// Pause the route when this many of its operations are `unknown`; 0 = never.
    pub pause_after_unknown: u32,
    pub reconcile: Option<Reconcile>,
    pub connect_timeout: Duration,
    pub upstream_timeout: Duration,
    pub connect_retries: u32,
    pub release_statuses: Vec<u16>,
    pub unknown_statuses: Vec<u16>,
    pub max_body: usize,
    pub max_stored_response: usize,
    pub store_request_body: bool,
}

impl Route {
    /// Whether a request with this method is a write this route protects.
    pub fn intercepts(&self, method: &Method) -> bool {
        self.key != KeyMode::Off && self.methods.contains(method)
    }
}

// ---------------------------------------------------------------------------
// The file as written.

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    server: RawServer,
    #[serde(default)]
    store: RawStore,
    #[serde(default)]
    routes: Vec<RawRoute>,
    #[serde(default)]
    alerts: Vec<RawAlert>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAlert {
    url: Option<String>,
    secret_env: Option<String>,
    events: Option<Vec<String>>,
    aged_after: Option<String>,
    give_up_after: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    listen: Option<String>,
    admin_listen: Option<String>,
    admin_token_env: Option<String>,
    tls_cert: Option<String>,
    tls_key: Option<String>,
    admin_tls_cert: Option<String>,
    admin_tls_key: Option<String>,
    header_read_timeout: Option<String>,
    max_header_bytes: Option<String>,
    shutdown_grace: Option<String>,
    max_connections: Option<usize>,
    admin_max_connections: Option<usize>,
    buffered_body_budget: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
    url: Option<String>,
    durability: Option<String>,
    retention: Option<String>,
    encryption_key_env: Option<String>,
    previous_key_env: Option<String>,
    scope_key_env: Option<String>,
    scope_key_file: Option<String>,
    lease: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    name: Option<String>,
    path_prefix: Option<String>,
    upstream: Option<String>,
    upstream_ca: Option<String>,
    upstream_client_cert: Option<String>,
    upstream_client_key: Option<String>,
    methods: Option<Vec<String>>,
    key: Option<String>,
    derive_from: Option<Vec<String>>,
    derive_window: Option<String>,
    scope_headers: Option<Vec<String>>,
    allow_anonymous: Option<bool>,
    fingerprint_headers: Option<Vec<String>>,
    ignore_fields: Option<Vec<String>>,
    forward_key_header: Option<String>,
    in_progress: Option<String>,
    wait_timeout: Option<String>,
    max_waiters: Option<usize>,
    quota_operations: Option<u32>,
    quota_stored_bytes: Option<String>,
    quota_window: Option<String>,
    connect_timeout: Option<String>,
    upstream_timeout: Option<String>,
    late_window: Option<String>,
    connect_retries: Option<u32>,
    release_statuses: Option<Vec<u16>>,
    unknown_statuses: Option<Vec<u16>>,
    max_body: Option<String>,
    max_stored_response: Option<String>,
    store_request_body: Option<bool>,
    pause_after_unknown: Option<u32>,
    reconcile: Option<RawReconcile>,
}

/// Command-line values that override the file's `[server]` and `[store]`.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub listen: Option<SocketAddr>,
    pub admin_listen: Option<SocketAddr>,
    pub store_url: Option<String>,
}

impl Config {
    /// Reads and validates a config file. Relative TLS file paths in it are
    /// relative to its directory.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let source_name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            source_name: source_name.clone(),
            error,
        })?;
        let base = path.parent().unwrap_or(Path::new(""));
        Self::parse(&text, &source_name, base)
    }

    /// Parses and validates TOML text; `source_name` names it in errors.
    /// Relative TLS file paths are relative to the working directory.
    pub fn from_toml_str(text: &str, source_name: &str) -> Result<Config, ConfigError> {
        Self::parse(text, source_name, Path::new(""))
    }

    fn parse(text: &str, source_name: &str, base: &Path) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            source_name: source_name.to_string(),
            message: e.to_string().trim_end().to_string(),
        })?;
        Validator { source_name, base }.config(raw)
    }

    /// The no-file mode: one catch-all route to `upstream`.
    pub fn single_route(upstream: &str, key: KeyMode) -> Result<Config, ConfigError> {
        let raw = RawConfig {
            routes: vec![RawRoute {
                name: Some("default".into()),
                path_prefix: Some("/".into()),
                upstream: Some(upstream.into()),
                ..RawRoute::default()
            }],
            ..RawConfig::default()
        };
        let mut config = Validator {
            source_name: "--upstream",
            base: Path::new(""),
        }
        .config(raw)?;
        config.routes[0].key = key;
        Ok(config)
    }

    /// Applies command-line overrides, validating them like file values.
    pub fn apply(&mut self, overrides: &Overrides) -> Result<(), ConfigError> {
        if let Some(listen) = overrides.listen {
            self.server.listen = listen;
        }
        if let Some(admin) = overrides.admin_listen {
            self.server.admin_listen = admin;
        }
        if let Some(url) = &overrides.store_url {
            self.store.url = StoreUrl::parse(url).map_err(|reason| ConfigError::Invalid {
                source_name: "--store".into(),
                field: "store.url".into(),
                reason,
            })?;
        }
        Ok(())
    }
}

/// The longest duration a field takes. Every duration is a deadline
/// somewhere (an `Instant`, or the store's milliseconds since 1970): one
/// of 300 million years overflowed the store's clock (a quota window that
/// ended before it began: no quota), one of 500 billion an `Instant` (a
/// panic in the request that waited).
const MAX_DURATION: Duration = Duration::from_secs(100 * 31_557_600);

struct Validator<'a> {
    source_name: &'a str,
    /// What relative file paths are relative to: the config file's directory.
    base: &'a Path,
}

impl Validator<'_> {
    fn invalid(&self, field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            source_name: self.source_name.to_string(),
            field: field.into(),
            reason: reason.into(),
        }
    }

    fn file(&self, path: &str) -> PathBuf {
        self.base.join(path)
    }

    /// A certificate file and its key file, both or neither, checked to be
    /// readable PEM that belong together.
    fn cert_pair(
        &self,
        (cert_field, cert): (String, Option<String>),
        (key_field, key): (String, Option<String>),
    ) -> Result<Option<CertPair>, ConfigError> {
        let pair = match (cert, key) {
            (None, None) => return Ok(None),
            (Some(cert), Some(key)) => CertPair {
                cert: self.file(&cert),
                key: self.file(&key),
            },
            (Some(_), None) => {
                return Err(self.invalid(key_field, format!("is required with `{cert_field}`")));
            }
            (None, Some(_)) => {
                return Err(self.invalid(cert_field, format!("is required with `{key_field}`")));
            }
        };
        let chain = tls::certificates(&pair.cert)
            .map_err(|error| self.invalid(&cert_field, error.to_string()))?;
        let key = tls::private_key(&pair.key)
            .map_err(|error| self.invalid(&key_field, error.to_string()))?;
        tls::pair_up(chain, key, (&pair.cert, &pair.key))
            .map_err(|error| self.invalid(key_field, error.to_string()))?;
        Ok(Some(pair))
    }

    fn duration(
        &self,
        field: &str,
        value: Option<&str>,
        default: &str,
    ) -> Result<Duration, ConfigError> {
        let text = value.unwrap_or(default);
        let parsed = humantime::parse_duration(text).map_err(|e| {
            self.invalid(
                field,
                format!("`{text}` is not a duration ({e}); e.g. \"500ms\", \"10s\", \"24h\""),
            )
        })?;
        if parsed.is_zero() {
            return Err(self.invalid(field, "must be greater than zero"));
        }
        if parsed > MAX_DURATION {
            return Err(self.invalid(field, "must be at most 100y"));
        }
        Ok(parsed)
    }

    fn size(&self, field: &str, value: Option<&str>, default: &str) -> Result<usize, ConfigError> {
        let text = value.unwrap_or(default);
        let parsed: bytesize::ByteSize = text.parse().map_err(|e| {
            self.invalid(
                field,
                format!("`{text}` is not a size ({e}); e.g. \"64KiB\", \"10MiB\""),
            )
        })?;
        usize::try_from(parsed.as_u64())
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| self.invalid(field, "must be greater than zero"))
    }

    fn count(
        &self,
        field: &str,
        value: Option<usize>,
        default: usize,
    ) -> Result<usize, ConfigError> {
        match value.unwrap_or(default) {
            0 => Err(self.invalid(field, "must be greater than zero")),
            n => Ok(n),
        }
    }

    /// A listener's connection cap: a count a semaphore can hold.
    fn connection_cap(
        &self,
        field: &str,
        value: Option<usize>,
        default: usize,
    ) -> Result<usize, ConfigError> {
        match self.count(field, value, default)? {
            n if n > Semaphore::MAX_PERMITS => {
                Err(self.invalid(field, format!("must be at most {}", Semaphore::MAX_PERMITS)))
            }
            n => Ok(n),
        }
    }

    fn addr(
        &self,
        field: &str,
        value: Option<&str>,
        default: &str,
    ) -> Result<SocketAddr, ConfigError> {
        let text = value.unwrap_or(default);
        text.parse().map_err(|_| {
            self.invalid(
                field,
                format!("`{text}` is not IP:PORT, e.g. \"127.0.0.1:8080\""),
            )
        })
    }

    fn headers(
        &self,
        field: &str,
        names: Option<Vec<String>>,
        default: &[&str],
    ) -> Result<Vec<HeaderName>, ConfigError> {
        let names = names.unwrap_or_else(|| default.iter().map(|s| s.to_string()).collect());
        names
            .iter()
            .map(|n| {
                HeaderName::from_bytes(n.as_bytes())
                    .map_err(|_| self.invalid(field, format!("`{n}` is not a header name")))
            })
            .collect()
    }

    fn config(&self, raw: RawConfig) -> Result<Config, ConfigError> {
        let server = self.server(raw.server)?;
        let store = self.store(raw.store)?;
        if raw.routes.is_empty() {
            return Err(self.invalid("routes", "at least one [[routes]] entry is needed"));
        }
        let mut routes = Vec::with_capacity(raw.routes.len());
        for (i, raw_route) in raw.routes.into_iter().enumerate() {
            let route = self.route(i, raw_route)?;
            if routes.iter().any(|r: &Route| r.name == route.name) {
                return Err(self.invalid(
                    format!("routes[{i}].name"),
                    format!("route name `{}` is used twice", route.name),
                ));
            }
            if routes
                .iter()
                .any(|r: &Route| r.path_prefix == route.path_prefix)
            {
                return Err(self.invalid(
                    format!("routes[{i}].path_prefix"),
                    format!("path_prefix `{}` is used twice", route.path_prefix),
                ));
            }
            routes.push(route);
        }
        let alerts = raw
            .alerts
            .into_iter()
            .enumerate()
            .map(|(i, alert)| self.alert(i, alert))
            .collect::<Result<_, _>>()?;
        Ok(Config {
            server,
            store,
            routes,
            alerts,
        })
    }

    fn alert(&self, i: usize, raw: RawAlert) -> Result<AlertConfig, ConfigError> {
        let field = |name: &str| format!("alerts[{i}].{name}");
        let text = raw
            .url
            .ok_or_else(|| self.invalid(field("url"), "is required"))?;
        Upstream::parse_any(&text).map_err(|reason| self.invalid(field("url"), reason))?;
        let url: Uri = text
            .parse()
            .map_err(|e| self.invalid(field("url"), format!("not a URL: {e}")))?;
        if let Some(variable) = &raw.secret_env
            && (variable.is_empty() || variable.contains(['=', '\0']))
        {
            return Err(self.invalid(field("secret_env"), "must name an environment variable"));
        }
        let events = match raw.events {
            None => AlertEvent::ALL.to_vec(),
            Some(names) if names.is_empty() => {
                return Err(self.invalid(field("events"), "name at least one event"));
            }
            Some(names) => names
                .iter()
                .map(|name| {
                    AlertEvent::ALL
                        .into_iter()
                        .find(|event| event.as_str() == name)
                        .ok_or_else(|| {
                            self.invalid(
                                field("events"),
                                format!(
                                    "`{name}`: expected operation-unknown, route-paused or unknown-aged"
                                ),
                            )
                        })
                })
                .collect::<Result<_, _>>()?,
        };
        Ok(AlertConfig {
            url,
            secret_env: raw.secret_env,
            events,
            aged_after: self.duration(&field("aged_after"), raw.aged_after.as_deref(), "1h")?,
            give_up_after: self.duration(
                &field("give_up_after"),
                raw.give_up_after.as_deref(),
                "24h",
            )?,
        })
    }

    fn server(&self, raw: RawServer) -> Result<ServerConfig, ConfigError> {
        let admin_token_env = raw
            .admin_token_env
            .unwrap_or_else(|| "IDEMGATE_ADMIN_TOKEN".into());
        if admin_token_env.is_empty() || admin_token_env.contains(['=', '\0']) {
            return Err(self.invalid(
                "server.admin_token_env",
                "must name an environment variable",
            ));
        }
        let tls = self.cert_pair(
            ("server.tls_cert".into(), raw.tls_cert),
            ("server.tls_key".into(), raw.tls_key),
        )?;
        let admin_tls = self.cert_pair(
            ("server.admin_tls_cert".into(), raw.admin_tls_cert),
            ("server.admin_tls_key".into(), raw.admin_tls_key),
        )?;
        let max_header_bytes = self.size(
            "server.max_header_bytes",
            raw.max_header_bytes.as_deref(),
            "64KiB",
        )?;
        if max_header_bytes < 8192 {
            return Err(self.invalid(
                "server.max_header_bytes",
                "must be at least 8KiB (hyper's smallest read buffer)",
            ));
        }
        Ok(ServerConfig {
            listen: self.addr("server.listen", raw.listen.as_deref(), "127.0.0.1:8080")?,
            admin_listen: self.addr(
                "server.admin_listen",
                raw.admin_listen.as_deref(),
                "127.0.0.1:9090",
            )?,
            admin_token_env,
            tls,
            admin_tls,
            header_read_timeout: self.duration(
                "server.header_read_timeout",
                raw.header_read_timeout.as_deref(),
                "10s",
            )?,
            max_header_bytes,
            shutdown_grace: self.duration(
                "server.shutdown_grace",
                raw.shutdown_grace.as_deref(),
                "30s",
            )?,
            max_connections: self.connection_cap(
                "server.max_connections",
                raw.max_connections,
                4096,
            )?,
            admin_max_connections: self.connection_cap(
                "server.admin_max_connections",
                raw.admin_max_connections,
                64,
            )?,
            buffered_body_budget: self.size(
                "server.buffered_body_budget",
                raw.buffered_body_budget.as_deref(),
                "256MiB",
            )?,
        })
    }

    fn store(&self, raw: RawStore) -> Result<StoreConfig, ConfigError> {
        let variable = |field: &str, name: Option<String>| match name {
            Some(name) if name.is_empty() || name.contains(['=', '\0']) => Err(self.invalid(
                field,
                "must name an environment variable (not empty, no `=`)",
            )),
            name => Ok(name),
        };
        let encryption_key_env = variable("store.encryption_key_env", raw.encryption_key_env)?;
        let previous_key_env = variable("store.previous_key_env", raw.previous_key_env)?;
        if previous_key_env.is_some() && encryption_key_env.is_none() {
            return Err(self.invalid(
                "store.previous_key_env",
                "only with store.encryption_key_env, the key that seals from now on",
            ));
        }
        let scope_key_env = variable("store.scope_key_env", raw.scope_key_env)?;
        if scope_key_env.is_some() && raw.scope_key_file.is_some() {
            return Err(self.invalid(
                "store.scope_key_file",
                "give store.scope_key_env or store.scope_key_file, not both",
            ));
        }
        if raw.scope_key_file.as_deref() == Some("") {
            return Err(self.invalid("store.scope_key_file", "names no file"));
        }
        if previous_key_env.is_some() && previous_key_env == encryption_key_env {
            return Err(self.invalid(
                "store.previous_key_env",
                "names the same variable as store.encryption_key_env",
            ));
        }
        let url = StoreUrl::parse(raw.url.as_deref().unwrap_or("sqlite://idemgate.db"))
            .map_err(|reason| self.invalid("store.url", reason))?;
        if matches!(url, StoreUrl::Sqlite(_)) && raw.lease.is_some() {
            return Err(self.invalid(
                "store.lease",
                "only a postgres:// store is shared by replicas that hold leases; remove the field",
            ));
        }
        let lease = self.duration("store.lease", raw.lease.as_deref(), "10s")?;
        if lease < Duration::from_secs(1) {
            return Err(self.invalid("store.lease", "must be at least 1s"));
        }
        let durability = match raw.durability.as_deref().unwrap_or("full") {
            "full" => Durability::Full,
            "normal" => Durability::Normal,
            other => {
                return Err(self.invalid(
                    "store.durability",
                    format!("`{other}`: expected full or normal"),
                ));
            }
        };
        Ok(StoreConfig {
            url,
            durability,
            retention: self.duration("store.retention", raw.retention.as_deref(), "24h")?,
            lease,
            encryption_key_env,
            previous_key_env,
            scope_key_env,
            scope_key_file: raw.scope_key_file.map(PathBuf::from),
        })
    }

    fn route(&self, i: usize, mut raw: RawRoute) -> Result<Route, ConfigError> {
        let field = |name: &str| format!("routes[{i}].{name}");

        let name = raw
            .name
            .ok_or_else(|| self.invalid(field("name"), "is required"))?;
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(self.invalid(field("name"), "use letters, digits, `-` and `_` only"));
        }
        let path_prefix = raw.path_prefix.unwrap_or_else(|| "/".into());
        if !path_prefix.starts_with('/') || path_prefix.contains(['?', '#']) {
            return Err(self.invalid(field("path_prefix"), "must be a path starting with `/`"));
        }
        let upstream_text = raw
            .upstream
            .ok_or_else(|| self.invalid(field("upstream"), "is required"))?;
        let upstream = Upstream::parse(&upstream_text)
            .map_err(|reason| self.invalid(field("upstream"), reason))?;
        let upstream_tls = self.upstream_tls(
            &field,
            &upstream,
            raw.upstream_ca.take(),
            (
                raw.upstream_client_cert.take(),
                raw.upstream_client_key.take(),
            ),
        )?;

        let methods =
            raw.methods
                .unwrap_or_else(|| vec!["POST".into(), "PATCH".into()])
                .iter()
                .map(|m| {
                    let method = Method::from_bytes(m.as_bytes()).map_err(|_| {
                        self.invalid(field("methods"), format!("`{m}` is not a method"))
                    })?;
                    if m.to_ascii_uppercase() != *m {
                        return Err(self
                            .invalid(field("methods"), format!("`{m}`: methods are upper case")));
                    }
                    if method.is_safe() {
                        return Err(self.invalid(
                            field("methods"),
                            format!("`{m}` is a safe method, never a write"),
                        ));
                    }
                    Ok(method)
                })
                .collect::<Result<Vec<_>, _>>()?;
        let key = raw
            .key
            .as_deref()
            .unwrap_or("require")
            .parse()
            .map_err(|reason: String| self.invalid(field("key"), reason))?;
        let scope_headers = self.headers(
            &field("scope_headers"),
            raw.scope_headers,
            &["authorization"],
        )?;
        let allow_anonymous = raw.allow_anonymous.unwrap_or(false);
        if scope_headers.is_empty() && !allow_anonymous {
            return Err(self.invalid(
                field("scope_headers"),
                "is empty: set allow_anonymous = true to share keys between all clients",
            ));
        }
        let ignore_fields = self.pointers(&field("ignore_fields"), raw.ignore_fields)?;
        let derive_from = self.pointers(&field("derive_from"), raw.derive_from)?;
        if !derive_from.is_empty() && key != KeyMode::Derive {
            return Err(self.invalid(field("derive_from"), "only with key = \"derive\""));
        }
        let reconcile = raw
            .reconcile
            .map(|r| self.reconcile(&field("reconcile"), r, &upstream))
            .transpose()?;
        let in_progress = match raw.in_progress.as_deref().unwrap_or("reject") {
            "reject" => InProgressMode::Reject,
            "wait" => InProgressMode::Wait,
            other => {
                return Err(self.invalid(
                    field("in_progress"),
                    format!("`{other}`: expected reject or wait"),
                ));
            }
        };
        let forward_key_header = match raw
            .forward_key_header
            .as_deref()
            .unwrap_or("Idempotency-Key")
        {
            "" => None,
            name => Some(HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                self.invalid(
                    field("forward_key_header"),
                    format!("`{name}` is not a header name"),
                )
            })?),
        };
        let release_statuses = self.statuses(
            &field("release_statuses"),
            raw.release_statuses,
            &[429, 503],
        )?;
        let unknown_statuses = self.statuses(
            &field("unknown_statuses"),
            raw.unknown_statuses,
            &[502, 504],
        )?;
        if let Some(both) = release_statuses
            .iter()
            .find(|s| unknown_statuses.contains(s))
        {
            return Err(self.invalid(
                field("unknown_statuses"),
                format!("{both} is also a release status"),
            ));
        }
        let connect_retries = raw.connect_retries.unwrap_or(2);
        if connect_retries > 10 {
            return Err(self.invalid(field("connect_retries"), "at most 10"));
        }
        Ok(Route {
            name,
            path_prefix,
            upstream,
            upstream_tls,
            methods,
            key,
            scope_headers,
            allow_anonymous,
            fingerprint_headers: self.headers(
                &field("fingerprint_headers"),
                raw.fingerprint_headers,
                &["content-type"],
            )?,
            ignore_fields,
            forward_key_header,
            derive_from,
            derive_window: self.duration(
                &field("derive_window"),
                raw.derive_window.as_deref(),
                "10m",
            )?,
            in_progress,
            late_window: self.duration(&field("late_window"), raw.late_window.as_deref(), "60s")?,
            pause_after_unknown: raw.pause_after_unknown.unwrap_or(100),
            reconcile,
            wait_timeout: self.duration(
                &field("wait_timeout"),
                raw.wait_timeout.as_deref(),
                "10s",
            )?,
            max_waiters: self.count(&field("max_waiters"), raw.max_waiters, 256)?,
            quota: self.quota(
                &field,
                raw.quota_operations,
                raw.quota_stored_bytes.as_deref(),
                raw.quota_window.as_deref(),
            )?,
            connect_timeout: self.duration(
                &field("connect_timeout"),
                raw.connect_timeout.as_deref(),
                "5s",
            )?,
            upstream_timeout: self.duration(
                &field("upstream_timeout"),
                raw.upstream_timeout.as_deref(),
                "30s",
            )?,
            connect_retries,
            release_statuses,
            unknown_statuses,
            max_body: self.size(&field("max_body"), raw.max_body.as_deref(), "10MiB")?,
            max_stored_response: self.size(
                &field("max_stored_response"),
                raw.max_stored_response.as_deref(),
                "1MiB",
            )?,
            store_request_body: raw.store_request_body.unwrap_or(false),
        })
    }

    /// `upstream_ca` and the client certificate: https upstreams only; the
    /// files are read now, as they will be at start.
    fn upstream_tls(
        &self,
        field: &dyn Fn(&str) -> String,
        upstream: &Upstream,
        ca: Option<String>,
        (cert, key): (Option<String>, Option<String>),
    ) -> Result<ClientTls, ConfigError> {
        if upstream.scheme != http::uri::Scheme::HTTPS {
            let set = [
                ("upstream_ca", &ca),
                ("upstream_client_cert", &cert),
                ("upstream_client_key", &key),
            ];
            if let Some((name, _)) = set.iter().find(|(_, value)| value.is_some()) {
                return Err(self.invalid(field(name), "only for an https:// upstream"));
            }
        }
        let ca = ca.map(|path| self.file(&path));
        if let Some(ca) = &ca {
            tls::roots(Some(ca))
                .map_err(|error| self.invalid(field("upstream_ca"), error.to_string()))?;
        }
        let identity = self.cert_pair(
            (field("upstream_client_cert"), cert),
            (field("upstream_client_key"), key),
        )?;
        Ok(ClientTls { ca, identity })
    }

    fn quota(
        &self,
        field: &dyn Fn(&str) -> String,
        operations: Option<u32>,
        stored_bytes: Option<&str>,
        window: Option<&str>,
    ) -> Result<Option<Quota>, ConfigError> {
        if operations == Some(0) {
            return Err(self.invalid(
                field("quota_operations"),
                "must be greater than zero; leave it out for no quota",
            ));
        }
        let stored_bytes = match stored_bytes {
            Some(text) => Some(self.size(&field("quota_stored_bytes"), Some(text), "")? as u64),
            None => None,
        };
        if operations.is_none() && stored_bytes.is_none() {
            return match window {
                None => Ok(None),
                Some(_) => Err(self.invalid(
                    field("quota_window"),
                    "only with quota_operations or quota_stored_bytes (per scope and window)",
                )),
            };
        }
        Ok(Some(Quota {
            operations,
            stored_bytes,
            window: self.duration(&field("quota_window"), window, "1m")?,
        }))
    }

    fn reconcile(
        &self,
        field: &str,
        raw: RawReconcile,
        upstream: &Upstream,
    ) -> Result<Reconcile, ConfigError> {
        let url_field = format!("{field}.url");
        // A fragment is never sent: `{key}` there would make every probe ask
        // the same question, and settle unrelated operations with one answer.
        if raw.url.contains('#') {
            return Err(self.invalid(
                url_field,
                "a probe URL takes no fragment (`#…`): it is never sent, so the probe could not name the key; put {key} in the path or the query",
            ));
        }
        let probe = Upstream::parse_any(&raw.url.replace("{key}", "k"))
            .map_err(|reason| self.invalid(&url_field, reason))?;
        // The key goes where it names a resource: the path or the query.
        let after_scheme = raw.url.split_once("://").map_or("", |(_, rest)| rest);
        let (authority, path_and_query) =
            after_scheme.split_at(after_scheme.find(['/', '?']).unwrap_or(after_scheme.len()));
        if authority.contains("{key}") || !path_and_query.contains("{key}") {
            return Err(self.invalid(
                url_field,
                "must contain {key} in its path or query (only there), where the key goes",
            ));
        }
        if probe.scheme != upstream.scheme || probe.authority != upstream.authority {
            return Err(self.invalid(
                url_field,
                format!(
                    "probes go to the route's own upstream origin ({}://{})",
                    upstream.scheme, upstream.authority
                ),
            ));
        }
        let found_status = raw.found_status.unwrap_or(200);
        if !(100..=599).contains(&found_status) {
            return Err(self.invalid(
                format!("{field}.found_status"),
                format!("{found_status} is not a status"),
            ));
        }
        if let Some(pointer) = &raw.found_json_pointer
            && !pointer.starts_with('/')
        {
            return Err(self.invalid(
                format!("{field}.found_json_pointer"),
                format!("`{pointer}` is not a JSON pointer (e.g. \"/data/0/id\")"),
            ));
        }
        Ok(Reconcile {
            url: raw.url,
            found_status,
            found_json_pointer: raw.found_json_pointer,
            timeout: self.duration(&format!("{field}.timeout"), raw.timeout.as_deref(), "5s")?,
        })
    }

    fn pointers(
        &self,
        field: &str,
        value: Option<Vec<String>>,
    ) -> Result<Vec<String>, ConfigError> {
        let pointers = value.unwrap_or_default();
        for pointer in &pointers {
            if !pointer.starts_with('/') {
                return Err(self.invalid(
                    field,
                    format!("`{pointer}` is not a JSON pointer (e.g. \"/event_id\")"),
                ));
            }
        }
        Ok(pointers)
    }

    fn statuses(
        &self,
        field: &str,
        value: Option<Vec<u16>>,
        default: &[u16],
    ) -> Result<Vec<u16>, ConfigError> {
        let statuses = value.unwrap_or_else(|| default.to_vec());
        for status in &statuses {
            if !(400..=599).contains(status) {
                return Err(self.invalid(
                    field,
                    format!("{status}: only 4xx and 5xx statuses can release or hold an operation"),
                ));
            }
        }
        Ok(statuses)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = "[[routes]]\nname = \"api\"\nupstream = \"http://127.0.0.1:9\"\n";

    fn error_of(text: &str) -> String {
        Config::from_toml_str(text, "test.toml")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn defaults_follow_the_design() {
        let config = Config::from_toml_str(MINIMAL, "test.toml").unwrap();
        assert_eq!(config.server.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(config.server.admin_listen.to_string(), "127.0.0.1:9090");
        assert_eq!(config.store.url, StoreUrl::Sqlite("idemgate.db".into()));
        assert_eq!(config.store.durability, Durability::Full);
        assert_eq!(config.server.max_connections, 4096);
        assert_eq!(config.server.admin_max_connections, 64);
        assert_eq!(config.server.buffered_body_budget, 256 * 1024 * 1024);
        let route = &config.routes[0];
        assert_eq!(route.methods, vec![Method::POST, Method::PATCH]);
        assert_eq!(route.key, KeyMode::Require);
        assert_eq!(route.scope_headers, vec![http::header::AUTHORIZATION]);
        assert_eq!(
            route.forward_key_header.as_ref().map(|h| h.as_str()),
            Some("idempotency-key")
        );
        assert_eq!(route.max_body, 10 * 1024 * 1024);
        assert_eq!(route.max_stored_response, 1024 * 1024);
        assert_eq!(route.release_statuses, vec![429, 503]);
        assert_eq!(route.unknown_statuses, vec![502, 504]);
        assert_eq!(route.upstream_timeout, Duration::from_secs(30));
        assert_eq!(route.late_window, Duration::from_secs(60));
        assert_eq!(route.pause_after_unknown, 100);
        assert!(route.reconcile.is_none());
    }

    #[test]
    fn unknown_fields_are_rejected_with_the_file() {
        let err = error_of(&format!("{MINIMAL}colour = \"blue\"\n"));
        assert!(err.starts_with("test.toml:"), "{err}");
        assert!(err.contains("colour"), "{err}");
    }

    #[test]
    fn bad_values_name_field_and_reason() {
        let err = error_of(&format!("{MINIMAL}max_body = \"lots\"\n"));
        assert!(
            err.contains("routes[0].max_body") && err.contains("not a size"),
            "{err}"
        );
        let err = error_of(&format!("{MINIMAL}upstream_timeout = \"0s\"\n"));
        assert!(err.contains("routes[0].upstream_timeout"), "{err}");
        let err = error_of(&format!("{MINIMAL}key = \"sometimes\"\n"));
        assert!(
            err.contains("routes[0].key") && err.contains("sometimes"),
            "{err}"
        );
        let err = error_of(&format!("{MINIMAL}methods = [\"GET\"]\n"));
        assert!(err.contains("safe method"), "{err}");
        let err = error_of(&format!("{MINIMAL}scope_headers = []\n"));
        assert!(err.contains("allow_anonymous"), "{err}");
        let err = error_of(&format!("{MINIMAL}release_statuses = [200]\n"));
        assert!(err.contains("release_statuses"), "{err}");
        let err = error_of(&format!("{MINIMAL}unknown_statuses = [429]\n"));
        assert!(err.contains("also a release status"), "{err}");
        let err = error_of(&format!("{MINIMAL}ignore_fields = [\"nonce\"]\n"));
        assert!(err.contains("JSON pointer"), "{err}");
        let err = error_of("[server]\nlisten = \"localhost\"\n");
        assert!(err.contains("server.listen"), "{err}");
        let err = error_of(&format!("[server]\nmax_connections = 0\n{MINIMAL}"));
        assert!(err.contains("server.max_connections"), "{err}");
    }

    #[test]
    fn values_the_gateway_cannot_run_on_are_refused() {
        // A quota window past the store's clock, a wait past an `Instant`.
        let err = error_of(&format!(
            "{MINIMAL}quota_operations = 1\nquota_window = \"300000000y\"\n"
        ));
        assert!(
            err.contains("routes[0].quota_window") && err.contains("at most 100y"),
            "{err}"
        );
        let err = error_of(&format!("{MINIMAL}wait_timeout = \"500000000000y\"\n"));
        assert!(err.contains("routes[0].wait_timeout"), "{err}");
        let config = Config::from_toml_str(
            &format!("[store]\nretention = \"100y\"\n{MINIMAL}"),
            "test.toml",
        );
        assert!(config.is_ok());
        // More connections than a semaphore holds.
        let err = error_of(&format!(
            "[server]\nadmin_max_connections = 9223372036854775807\n{MINIMAL}"
        ));
        assert!(err.contains("server.admin_max_connections"), "{err}");
    }

    #[test]
    fn upstream_must_be_an_origin() {
        let with = |u: &str| error_of(&format!("[[routes]]\nname = \"a\"\nupstream = \"{u}\"\n"));
        assert!(with("ftp://x").contains("not http or https"));
        assert!(with("http://x/v1").contains("origin only"));
        assert!(with("http://user:pw@x").contains("credentials"));
        assert!(with("x").contains("routes[0].upstream"));
    }

    #[test]
    fn routes_need_unique_names_and_prefixes() {
        let twice = format!("{MINIMAL}{MINIMAL}");
        assert!(error_of(&twice).contains("used twice"));
        assert!(error_of("[server]\n").contains("at least one"));
    }

    #[test]
    fn alerts_are_validated_with_their_defaults() {
        let alert = |lines: &str| format!("{MINIMAL}[[alerts]]\n{lines}\n");
        let config = Config::from_toml_str(&alert("url = \"https://h.example/x\""), "t").unwrap();
        let endpoint = &config.alerts[0];
        assert_eq!(endpoint.events, AlertEvent::ALL);
        assert_eq!(endpoint.aged_after, Duration::from_secs(3600));
        assert_eq!(endpoint.give_up_after, Duration::from_secs(86_400));
        assert!(endpoint.secret_env.is_none());
        assert!(error_of(&alert("events = [\"route-paused\"]")).contains("alerts[0].url"));
        assert!(error_of(&alert("url = \"ftp://h/x\"")).contains("not http or https"));
        assert!(
            error_of(&alert("url = \"https://h/x\"\nevents = [\"deleted\"]"))
                .contains("`deleted`: expected operation-unknown")
        );
        assert!(error_of(&alert("url = \"https://h/x\"\nevents = []")).contains("at least one"));
        assert!(error_of(&alert("url = \"https://h/x\"\naged_after = \"0s\"")).contains("greater"));
        assert!(
            error_of(&alert("url = \"https://h/x\"\nsecret_env = \"\""))
                .contains("environment variable")
        );
        assert!(error_of(&alert("url = \"https://h/x\"\nretries = 3")).contains("unknown field"));
    }

    #[test]
    fn store_keys_are_named_by_variables() {
        let with = |lines: &str| format!("[store]\n{lines}{MINIMAL}");
        let store = Config::from_toml_str(
            &with("encryption_key_env = \"K1\"\nprevious_key_env = \"K0\"\n"),
            "t",
        )
        .unwrap()
        .store;
        assert_eq!(store.encryption_key_env.as_deref(), Some("K1"));
        assert_eq!(store.previous_key_env.as_deref(), Some("K0"));
        assert!(error_of(&with("previous_key_env = \"K0\"\n")).contains("only with"));
        assert!(error_of(&with("encryption_key_env = \"\"\n")).contains("environment variable"));
        let same = with("encryption_key_env = \"K\"\nprevious_key_env = \"K\"\n");
        assert!(error_of(&same).contains("same variable"));
    }

    #[test]
    fn tls_files_come_in_pairs_and_only_for_https() {
        let err = error_of(&format!("[server]\ntls_cert = \"c.pem\"\n{MINIMAL}"));
        assert!(
            err.contains("`server.tls_key`: is required with `server.tls_cert`"),
            "{err}"
        );
        let err = error_of(&format!("[server]\nadmin_tls_key = \"k.pem\"\n{MINIMAL}"));
        assert!(
            err.contains("`server.admin_tls_cert`: is required"),
            "{err}"
        );
        let err = error_of(&format!("{MINIMAL}upstream_ca = \"ca.pem\"\n"));
        assert!(
            err.contains("routes[0].upstream_ca") && err.contains("only for an https://"),
            "{err}"
        );
        let https = "[[routes]]\nname = \"api\"\nupstream = \"https://127.0.0.1:9\"\n";
        let err = error_of(&format!("{https}upstream_ca = \"/nonexistent/ca.pem\"\n"));
        assert!(
            err.contains("`routes[0].upstream_ca`: /nonexistent/ca.pem: cannot read"),
            "{err}"
        );
        let err = error_of(&format!("{https}upstream_client_cert = \"c.pem\"\n"));
        assert!(err.contains("routes[0].upstream_client_key"), "{err}");
    }

    #[test]
    fn derive_and_wait_values_are_checked() {
        assert!(error_of(&format!("{MINIMAL}derive_from = [\"/id\"]\n")).contains("only with key"));
        assert!(
            error_of(&format!("{MINIMAL}in_progress = \"later\"\n")).contains("reject or wait")
        );
        assert!(
            error_of(&format!(
                "{MINIMAL}key = \"derive\"\nderive_from = [\"id\"]\n"
            ))
            .contains("JSON pointer")
        );
        let text = format!(
            "{MINIMAL}key = \"derive\"\nderive_from = [\"/event_id\"]\nin_progress = \"wait\"\n"
        );
        let route = &Config::from_toml_str(&text, "t").unwrap().routes[0];
        assert_eq!(route.key, KeyMode::Derive);
        assert_eq!(route.in_progress, InProgressMode::Wait);
        assert_eq!(route.derive_window, Duration::from_secs(600));
        assert_eq!(route.wait_timeout, Duration::from_secs(10));
        assert_eq!(route.max_waiters, 256);
        assert!(route.quota.is_none());
        let text = format!("{MINIMAL}quota_operations = 100\n");
        let quota = Config::from_toml_str(&text, "t").unwrap().routes[0]
            .quota
            .clone()
            .unwrap();
        assert_eq!(
            (quota.operations, quota.stored_bytes, quota.window),
            (Some(100), None, Duration::from_secs(60))
        );
        let text = format!("{MINIMAL}quota_stored_bytes = \"5MiB\"\nquota_window = \"1h\"\n");
        let quota = Config::from_toml_str(&text, "t").unwrap().routes[0]
            .quota
            .clone()
            .unwrap();
        assert_eq!(
            (quota.operations, quota.stored_bytes, quota.window),
            (None, Some(5 << 20), Duration::from_secs(3600))
        );
        assert!(error_of(&format!("{MINIMAL}quota_window = \"1h\"\n")).contains("only with"));
        assert!(error_of(&format!("{MINIMAL}quota_operations = 0\n")).contains("greater"));
        assert!(error_of(&format!("{MINIMAL}quota_stored_bytes = \"0B\"\n")).contains("greater"));
        assert!(
            error_of(&format!("{MINIMAL}quota_stored_bytes = \"lots\"\n")).contains("not a size")
        );
    }

    #[test]
    fn reconcile_probes_stay_on_the_upstream_origin() {
        let with = |table: &str| {
            let text = format!(
                "[[routes]]\nname = \"a\"\nupstream = \"http://api:8000\"\n[routes.reconcile]\n{table}"
            );
            Config::from_toml_str(&text, "t")
        };
        let probe = with("url = \"http://api:8000/v1/orders?idempotency_key={key}\"\nfound_json_pointer = \"/data/0/id\"\n")
            .unwrap()
            .routes[0]
            .reconcile
            .clone()
            .unwrap();
        assert_eq!(probe.found_status, 200);
        assert_eq!(probe.timeout, Duration::from_secs(5));
        let err = |table: &str| with(table).unwrap_err().to_string();
        assert!(err("url = \"http://other:8000/x/{key}\"\n").contains("own upstream origin"));
        assert!(err("url = \"https://api:8000/x/{key}\"\n").contains("own upstream origin"));
        assert!(err("url = \"http://api:8000/x\"\n").contains("{key}"));
        assert!(
            err("url = \"http://api:8000/{key}\"\nfound_json_pointer = \"id\"\n")
                .contains("JSON pointer")
        );
        assert!(err("url = \"http://api:8000/{key}\"\nmethod = \"POST\"\n").contains("method"));
    }

    #[test]
    fn reconcile_keys_go_in_the_path_or_the_query_only() {
        let with = |url: &str| {
            let text = format!(
                "[[routes]]\nname = \"a\"\nupstream = \"http://api:8000\"\n[routes.reconcile]\nurl = \"{url}\"\n"
            );
            Config::from_toml_str(&text, "t.toml").map(|c| c.routes[0].reconcile.clone())
        };
        for url in [
            "http://api:8000/v1/tasks/{key}",
            "http://api:8000/v1/tasks?key={key}",
            "http://api:8000/{key}/x?again={key}",
            "http://api:8000?key={key}",
        ] {
            assert!(with(url).is_ok(), "{url}");
        }
        let err = |url: &str| match with(url) {
            Ok(_) => panic!("accepted {url}"),
            Err(e) => e.to_string(),
        };
        let fragment = err("http://api:8000/v1/probe-list?tenant=1#{key}");
        assert!(
            fragment.starts_with("t.toml: field `routes[0].reconcile.url`")
                && fragment.contains("fragment"),
            "{fragment}"
        );
        // A fragment is refused even beside a key in the path.
        assert!(err("http://api:8000/v1/{key}#top").contains("fragment"));
        assert!(err("http://api:8000/v1/{key}#").contains("fragment"));
        // In the authority, `{key}` would pick the host (here it would even
        // pass the origin check, the upstream's host being `k`).
        let text = "[[routes]]\nname = \"a\"\nupstream = \"http://k:8000\"\n[routes.reconcile]\nurl = \"http://{key}:8000/x\"\n";
        let host = Config::from_toml_str(text, "t.toml")
            .unwrap_err()
            .to_string();
        assert!(host.contains("path or query"), "{host}");
        assert!(err("http://api:8000/x").contains("path or query"));
    }

    #[test]
    fn store_urls() {
        assert_eq!(
            StoreUrl::parse("sqlite:///tmp/a.db"),
            Ok(StoreUrl::Sqlite("/tmp/a.db".into()))
        );
        assert_eq!(
            StoreUrl::parse("sqlite:a.db"),
            Ok(StoreUrl::Sqlite("a.db".into()))
        );
        assert!(StoreUrl::parse("sqlite://").is_err());
        assert!(StoreUrl::parse("sqlite::memory:").is_err());
        assert!(StoreUrl::parse("mysql://x").is_err());
        assert_eq!(
            StoreUrl::parse("postgresql://db/x"),
            Ok(StoreUrl::Postgres("postgresql://db/x".into()))
        );
    }

    #[test]
    fn postgres_stores_take_a_lease_and_hide_passwords() {
        let config = Config::from_toml_str(
            &format!("[store]\nurl = \"postgres://gw:s3cret@db:5432/x?sslmode=require\"\nlease = \"4s\"\n{MINIMAL}"),
            "t",
        )
        .unwrap();
        assert_eq!(config.store.lease, Duration::from_secs(4));
        assert_eq!(
            config.store.url.to_string(),
            "postgres://gw:***@db:5432/x?sslmode=require"
        );
        let default = Config::from_toml_str(
            &format!("[store]\nurl = \"postgres://db/x\"\n{MINIMAL}"),
            "t",
        );
        assert_eq!(default.unwrap().store.lease, Duration::from_secs(10));
        assert_eq!(redact_url("postgres://gw@db/x"), "postgres://gw@db/x");
        let short = format!("[store]\nurl = \"postgres://db/x\"\nlease = \"500ms\"\n{MINIMAL}");
        assert!(error_of(&short).contains("at least 1s"));
        let sqlite = format!("[store]\nlease = \"10s\"\n{MINIMAL}");
        assert!(
            error_of(&sqlite).contains("only a postgres"),
            "{}",
            error_of(&sqlite)
        );
    }

    #[test]
    fn overrides_replace_file_values() {
        let mut config = Config::from_toml_str(MINIMAL, "t").unwrap();
        config
            .apply(&Overrides {
                listen: Some("127.0.0.1:1".parse().unwrap()),
                admin_listen: None,
                store_url: Some("sqlite:///tmp/o.db".into()),
            })
            .unwrap();
        assert_eq!(config.server.listen.port(), 1);
        assert_eq!(config.store.url, StoreUrl::Sqlite("/tmp/o.db".into()));
        let bad = Overrides {
            store_url: Some("nope".into()),
            ..Overrides::default()
        };
        assert!(
            config
                .apply(&bad)
                .unwrap_err()
                .to_string()
                .contains("--store")
        );
    }
}
