//! The one check of the file: [`Validator`] turns the `Raw*` types of
//! [`super::file`] into the runtime types of [`super::runtime`], filling
//! each key left out from [`super::defaults`].
//!
//! Invariant: every bad value is refused with the field and the reason
//! (docs/configuration.md, "Every key"), and nothing that passes here can
//! make the gateway fail later for its form (a duration an `Instant`
//! cannot hold, more connections than a semaphore counts). Files are named
//! here, never read: a TLS file that cannot be used is refused at start,
//! naming its field (`tls::read`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::header::HeaderName;
use http::{Method, Uri};
use tokio::sync::Semaphore;

use super::defaults::{alert, mcp_reconcile, reconcile, route, server, store};
use super::file::{
    RawAlert, RawConfig, RawMcp, RawMcpReconcile, RawReconcile, RawRoute, RawServer, RawStore,
};
use super::runtime::{
    Absence, AlertConfig, AlertEvent, CertPair, ClientTls, Config, Confirm, DestinationKey,
    InProgressMode, KeyMode, McpReconcile, McpTools, Piece, ProbeKeys, Quota, Reconcile,
    RotatedKeys, Route, ServerConfig, ToolCall, Upstream, Verdicts,
};
use super::{ConfigError, Durability, StoreConfig, StoreUrl};
use crate::profile::{Profile, Wire};
use crate::request_path;
use idemgate_store::scope_key;

/// Headers no key may be sent in ([`Validator::key_header`]): framing and
/// hop-by-hop fields, the host, what describes the body, credentials, and
/// the forwarding fields the gateway writes itself.
const NOT_A_KEY_HEADER: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
    "expect",
    "content-type",
    "content-encoding",
    "authorization",
    "proxy-authorization",
    "cookie",
    "forwarded",
    "via",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
];

/// The first of `route`'s `fingerprint_headers` that is a credential
/// ([`CREDENTIALS`], or one of its `scope_headers`): the fingerprint is a
/// bare SHA-256 kept in clear, so a guess at it could be confirmed from a
/// copy of the store, where a scope header is kept keyed.
pub(super) fn credential_in_fingerprint(route: &Route) -> Option<&HeaderName> {
    route
        .fingerprint_headers
        .iter()
        .find(|name| CREDENTIALS.contains(&name.as_str()) || route.scope_headers.contains(name))
}

/// Whether a route's MCP probe reads absence asking by `{key}` where no
/// absence can be believed: the call's own key reached the server only if
/// the call carried it, which without kept bodies cannot be told
/// (`pipeline::reconcile`, "key_unseen").
pub(super) fn absence_by_an_unprovable_key(route: &Route) -> bool {
    let Some(probe) = route.mcp.as_ref().and_then(|m| m.reconcile.as_ref()) else {
        return false;
    };
    probe.verdicts.absent.is_some() && probe.asks_by_key() && !route.store_request_body
}

/// The pointer of a route's HTTP probe that reads its answer as a list
/// (a count, or an index in its found pointer) where no
/// `result_json_pointer` says which part is the write: a found write's
/// retries would get the whole list as its response.
pub(super) fn list_replayed_whole(route: &Route) -> Option<&str> {
    let probe = route.reconcile.as_ref()?;
    if probe.result_json_pointer.is_some() {
        return None;
    }
    let indexed = |pointer: &&String| {
        let mut segments = pointer.split('/');
        segments.any(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
    };
    let found = probe.found_json_pointer.as_ref().filter(indexed);
    found
        .or(probe.verdicts.count_json_pointer.as_ref())
        .map(String::as_str)
}

/// Headers that carry a credential wherever they are sent.
const CREDENTIALS: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "cookie",
    "x-api-key",
    "api-key",
];

/// The longest duration a field takes. Every duration is a deadline
/// somewhere (an `Instant`, or the store's milliseconds since 1970): one
/// of 300 million years overflowed the store's clock (a quota window that
/// ended before it began: no quota), one of 500 billion an `Instant` (a
/// panic in the request that waited).
const MAX_DURATION: Duration = Duration::from_secs(100 * 31_557_600);

/// The most HTTP/2 streams a connection may be allowed: each may hold a
/// handler, a body and an upstream exchange.
const MAX_HTTP2_STREAMS: u32 = 10_000;

/// An MCP route's lists of tools, as its probe is checked against them.
#[derive(Clone, Copy)]
struct McpToolLists<'a> {
    /// `read_only_tools`: never held.
    read_only: &'a [String],
    /// `protected_tools`: held whatever the server says, so never a probe.
    protected: &'a [String],
}

/// What a route's probes may ask a held operation by: the keys its
/// destination got, and the request body if the store keeps it.
struct Askable {
    /// Why the destination never gets the client's key (`{key}`); `None`
    /// when it does.
    no_client_key: Option<String>,
    /// The destination gets the operation's id (`{destination_key}`).
    destination_key: bool,
    /// `store_request_body`: `{body:…}` and `{argument:…}` have a body to read.
    keeps_bodies: bool,
}

impl Askable {
    /// A route's: the client's key reaches the destination in
    /// `forward_key_header`, unless the destination key takes that header,
    /// or in a key header the profile passes on as sent (OASIS
    /// `Repeatability-Request-ID`) that the destination key does not take.
    fn of(
        wire: &Wire,
        forward: Option<&HeaderName>,
        destination: Option<&DestinationKey>,
        keeps_bodies: bool,
    ) -> Askable {
        let taken = destination.map(|d| d.header.as_str());
        let in_its_place = |name: &str| {
            format!("destination_key_header puts the operation's id in `{name}`, in its place")
        };
        let (mut sent, mut not_sent) = (false, Vec::new());
        match forward {
            None => not_sent.push("forward_key_header = \"\" sends none".to_string()),
            Some(name) if Some(name.as_str()) == taken => {
                not_sent.push(in_its_place(name.as_str()))
            }
            Some(_) => sent = true,
        }
        for name in wire.key_headers {
            // The client's `Idempotency-Key` is never passed on: the
            // gateway writes its own (`pipeline::forward::WriteRequest`).
            if *name == "idempotency-key" {
                continue;
            }
            if Some(*name) == taken {
                not_sent.push(in_its_place(name));
            } else {
                sent = true;
            }
        }
        Askable {
            no_client_key: (!sent).then(|| not_sent.join("; ")),
            destination_key: destination.is_some(),
            keeps_bodies,
        }
    }
}

pub(super) struct Validator<'a> {
    pub(super) source_name: &'a str,
    /// What relative file paths are relative to: the config file's directory.
    pub(super) base: &'a Path,
}

/// `server.console_url` as alerts append an operation's fragment to it:
/// an http or https URL with no query or fragment, ending in `/`.
fn console_base_url(text: &str) -> Result<String, String> {
    Upstream::parse_any(text)?;
    if text.contains(['?', '#']) {
        return Err("must have no query or fragment: alerts add `#/op/ID` to it".into());
    }
    Ok(match text.ends_with('/') {
        true => text.to_string(),
        false => format!("{text}/"),
    })
}

/// Why the two listeners cannot both bind, if they cannot: one port on one
/// address, or on a wildcard beside another (the second bind fails).
pub(super) fn listeners_clash(listen: SocketAddr, admin_listen: SocketAddr) -> Option<String> {
    let overlap = listen.ip() == admin_listen.ip()
        || listen.ip().is_unspecified()
        || admin_listen.ip().is_unspecified();
    (listen.port() == admin_listen.port() && listen.port() != 0 && overlap).then(|| {
        format!(
            "is {admin_listen}, the proxy's own address (server.listen): give each listener its own"
        )
    })
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

    /// A certificate file and its key file, both or neither. Only named
    /// here: they are read at start (`tls::read`).
    fn cert_pair(
        &self,
        (cert_field, cert): (String, Option<String>),
        (key_field, key): (String, Option<String>),
    ) -> Result<Option<CertPair>, ConfigError> {
        match (cert, key) {
            (None, None) => Ok(None),
            (Some(cert), Some(key)) => Ok(Some(CertPair {
                cert: self.file(&cert),
                key: self.file(&key),
            })),
            (Some(_), None) => {
                Err(self.invalid(key_field, format!("is required with `{cert_field}`")))
            }
            (None, Some(_)) => {
                Err(self.invalid(cert_field, format!("is required with `{key_field}`")))
            }
        }
    }

    /// `value`, or `default` when the file leaves it out, read by `parse`;
    /// a refusal says what was given and what `what` looks like.
    fn parsed<T, E: std::fmt::Display>(
        &self,
        field: &str,
        (value, default): (Option<&str>, &str),
        (what, examples): (&str, &str),
        parse: impl FnOnce(&str) -> Result<T, E>,
    ) -> Result<T, ConfigError> {
        let text = value.unwrap_or(default);
        parse(text).map_err(|e| {
            self.invalid(
                field,
                format!("`{text}` is not {what} ({e}); e.g. {examples}"),
            )
        })
    }

    fn duration(
        &self,
        field: &str,
        value: Option<&str>,
        default: &str,
    ) -> Result<Duration, ConfigError> {
        let parsed = self.parsed(
            field,
            (value, default),
            ("a duration", "\"500ms\", \"10s\", \"24h\""),
            humantime::parse_duration,
        )?;
        if parsed.is_zero() {
            return Err(self.invalid(field, "must be greater than zero"));
        }
        if parsed > MAX_DURATION {
            return Err(self.invalid(field, "must be at most 100y"));
        }
        Ok(parsed)
    }

    fn size(&self, field: &str, value: Option<&str>, default: &str) -> Result<usize, ConfigError> {
        let parsed = self.parsed(
            field,
            (value, default),
            ("a size", "\"64KiB\", \"10MiB\""),
            str::parse::<bytesize::ByteSize>,
        )?;
        usize::try_from(parsed.as_u64())
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| self.invalid(field, "must be greater than zero"))
    }

    /// One of a field's named values (`options`, in the order the error
    /// names them), `default` when the file has none.
    fn choice<T: Copy>(
        &self,
        field: &str,
        value: Option<&str>,
        default: &str,
        options: &[(&str, T)],
    ) -> Result<T, ConfigError> {
        let written = value.unwrap_or(default);
        if let Some((_, chosen)) = options.iter().find(|(name, _)| *name == written) {
            return Ok(*chosen);
        }
        let names: Vec<&str> = options.iter().map(|(name, _)| *name).collect();
        let expected = match names.split_last() {
            Some((last, [])) => (*last).to_string(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        };
        Err(self.invalid(field, format!("`{written}`: expected {expected}")))
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

    /// A connection cap (a listener's, a route's upstream's): a count a
    /// semaphore can hold.
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
        self.parsed(
            field,
            (value, default),
            ("IP:PORT", "\"127.0.0.1:8080\""),
            str::parse::<SocketAddr>,
        )
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

    pub(super) fn config(&self, raw: RawConfig) -> Result<Config, ConfigError> {
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
            // In another case, or with a `/` at its end, it is one prefix
            // to an upstream that reads paths so, and the paths one of the
            // two routes would take are refused as ambiguous
            // (`pipeline::route`): it would serve nothing.
            let spelled = |prefix: &str| {
                let trimmed = prefix.strip_suffix('/').filter(|p| !p.is_empty());
                trimmed.unwrap_or(prefix).to_ascii_lowercase()
            };
            let same_prefix = |r: &&Route| spelled(&r.path_prefix) == spelled(&route.path_prefix);
            if let Some(other) = routes.iter().find(same_prefix) {
                let reason = match other.path_prefix == route.path_prefix {
                    true => format!("path_prefix `{}` is used twice", route.path_prefix),
                    false => format!(
                        "path_prefix `{}` is `{}` (route `{}`) in another case or with a `/` at its end, which many upstreams read as one path: give the two routes prefixes that differ in more than that",
                        route.path_prefix, other.path_prefix, other.name
                    ),
                };
                return Err(self.invalid(format!("routes[{i}].path_prefix"), reason));
            }
            if route.max_body > server.buffered_body_budget {
                return Err(self.invalid(
                    format!("routes[{i}].max_body"),
                    format!(
                        "is {} bytes, more than server.buffered_body_budget ({} bytes), which every body being read must fit in: a write that large would be told to retry shortly, for ever",
                        route.max_body, server.buffered_body_budget
                    ),
                ));
            }
            let reads_first_sent = route.profile.wire().first_sent.is_some();
            if reads_first_sent && route.first_sent_skew >= store.retention {
                return Err(self.invalid(
                    format!("routes[{i}].first_sent_skew"),
                    format!(
                        "is {}, not less than store.retention ({}): a request first sent that far ahead would be tracked for no time at all",
                        humantime::format_duration(route.first_sent_skew),
                        humantime::format_duration(store.retention),
                    ),
                ));
            }
            let windowed = route.key == KeyMode::Derive && route.derive_from.is_empty();
            if windowed && route.derive_window > store.retention {
                return Err(self.invalid(
                    format!("routes[{i}].derive_window"),
                    format!(
                        "is {}, longer than store.retention ({}): an operation deleted before its window ends could not make an identical request a replay, and it would be sent again",
                        humantime::format_duration(route.derive_window),
                        humantime::format_duration(store.retention),
                    ),
                ));
            }
            let floor = route.profile.wire().retention_floor;
            if let Some(floor) = floor.filter(|floor| store.retention < *floor) {
                return Err(self.invalid(
                    "store.retention",
                    format!(
                        "is {}, but route `{}` speaks the `{}` profile, which needs operations kept for at least {}h",
                        humantime::format_duration(store.retention),
                        route.name,
                        route.profile.name(),
                        floor.as_secs() / 3600,
                    ),
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
                                    "`{name}`: expected operation-unknown, route-paused, unknown-aged or duplicated-at-destination"
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
            aged_after: self.duration(
                &field("aged_after"),
                raw.aged_after.as_deref(),
                alert::AGED_AFTER,
            )?,
            give_up_after: self.duration(
                &field("give_up_after"),
                raw.give_up_after.as_deref(),
                alert::GIVE_UP_AFTER,
            )?,
        })
    }

    fn server(&self, raw: RawServer) -> Result<ServerConfig, ConfigError> {
        let admin_token_env = raw
            .admin_token_env
            .unwrap_or_else(|| server::ADMIN_TOKEN_ENV.into());
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
            server::MAX_HEADER_BYTES,
        )?;
        if max_header_bytes < 8192 {
            return Err(self.invalid(
                "server.max_header_bytes",
                "must be at least 8KiB (hyper's smallest read buffer)",
            ));
        }
        let listen = self.addr("server.listen", raw.listen.as_deref(), server::LISTEN)?;
        let admin_listen = self.addr(
            "server.admin_listen",
            raw.admin_listen.as_deref(),
            server::ADMIN_LISTEN,
        )?;
        if let Some(reason) = listeners_clash(listen, admin_listen) {
            return Err(self.invalid("server.admin_listen", reason));
        }
        let console_url = raw
            .console_url
            .map(|url| {
                console_base_url(&url).map_err(|reason| self.invalid("server.console_url", reason))
            })
            .transpose()?;
        Ok(ServerConfig {
            listen,
            admin_listen,
            admin_token_env,
            tls,
            admin_tls,
            console_url,
            header_read_timeout: self.duration(
                "server.header_read_timeout",
                raw.header_read_timeout.as_deref(),
                server::HEADER_READ_TIMEOUT,
            )?,
            max_header_bytes,
            shutdown_grace: self.duration(
                "server.shutdown_grace",
                raw.shutdown_grace.as_deref(),
                server::SHUTDOWN_GRACE,
            )?,
            max_connections: self.connection_cap(
                "server.max_connections",
                raw.max_connections,
                server::MAX_CONNECTIONS,
            )?,
            admin_max_connections: self.connection_cap(
                "server.admin_max_connections",
                raw.admin_max_connections,
                server::ADMIN_MAX_CONNECTIONS,
            )?,
            buffered_body_budget: self.size(
                "server.buffered_body_budget",
                raw.buffered_body_budget.as_deref(),
                server::BUFFERED_BODY_BUDGET,
            )?,
            http2_max_concurrent_streams: match raw.http2_max_concurrent_streams {
                None => server::HTTP2_MAX_CONCURRENT_STREAMS,
                Some(n @ 1..=MAX_HTTP2_STREAMS) => n,
                Some(_) => {
                    return Err(self.invalid(
                        "server.http2_max_concurrent_streams",
                        format!("must be from 1 to {MAX_HTTP2_STREAMS}"),
                    ));
                }
            },
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
        let url = StoreUrl::parse(raw.url.as_deref().unwrap_or(store::URL))
            .map_err(|reason| self.invalid("store.url", reason))?;
        // The variable the scope key is read from, the shared store's
        // default included.
        let scope_variable = match (&scope_key_env, &raw.scope_key_file, &url) {
            (Some(env), _, _) => Some(env.as_str()),
            (None, None, StoreUrl::Postgres(_)) => Some(scope_key::DEFAULT_POSTGRES_ENV),
            _ => None,
        };
        let sealing = [
            ("encryption_key_env", &encryption_key_env),
            ("previous_key_env", &previous_key_env),
        ];
        if let Some((field, _)) = sealing
            .iter()
            .find(|(_, name)| scope_variable.is_some() && name.as_deref() == scope_variable)
        {
            let by = match scope_key_env {
                Some(_) => "store.scope_key_env",
                None => "a postgres:// store's default",
            };
            return Err(self.invalid(
                format!("store.{field}"),
                format!(
                    "names {}, the variable the scope key is read from ({by}): one key for both, a rotation of the sealing key would change the scope key with it, and every stored scope would match no request; move the same value into a variable of its own for the scope key (a new value would leave every stored scope matching no request too)",
                    scope_variable.unwrap_or_default()
                ),
            ));
        }
        if matches!(url, StoreUrl::Sqlite(_)) && raw.lease.is_some() {
            return Err(self.invalid(
                "store.lease",
                "only a postgres:// store is shared by replicas that hold leases; remove the field",
            ));
        }
        let lease = self.duration("store.lease", raw.lease.as_deref(), store::LEASE)?;
        if lease < Duration::from_secs(1) {
            return Err(self.invalid("store.lease", "must be at least 1s"));
        }
        let durability = self.choice(
            "store.durability",
            raw.durability.as_deref(),
            store::DURABILITY,
            &[("full", Durability::Full), ("normal", Durability::Normal)],
        )?;
        let require_synchronous_standby = raw
            .require_synchronous_standby
            .unwrap_or(store::REQUIRE_SYNCHRONOUS_STANDBY);
        if require_synchronous_standby && matches!(url, StoreUrl::Sqlite(_)) {
            return Err(self.invalid(
                "store.require_synchronous_standby",
                "only a postgres:// store has standbys",
            ));
        }
        if require_synchronous_standby && durability == Durability::Normal {
            return Err(self.invalid(
                "store.require_synchronous_standby",
                "durability = \"normal\" sets synchronous_commit = off, which does not wait for the standby: use durability = \"full\"",
            ));
        }
        Ok(StoreConfig {
            url,
            durability,
            require_synchronous_standby,
            retention: self.duration(
                "store.retention",
                raw.retention.as_deref(),
                store::RETENTION,
            )?,
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
        let path_prefix = raw.path_prefix.unwrap_or_else(|| route::PATH_PREFIX.into());
        if !path_prefix.starts_with('/') || path_prefix.contains(['?', '#']) {
            return Err(self.invalid(field("path_prefix"), "must be a path starting with `/`"));
        }
        let path_prefix = request_path::prefix(&path_prefix)
            .map_err(|error| self.invalid(field("path_prefix"), error.to_string()))?;
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

        let profile: Profile = raw
            .profile
            .as_deref()
            .unwrap_or(route::PROFILE)
            .parse()
            .map_err(|reason: String| self.invalid(field("profile"), reason))?;
        let wire = profile.wire();
        let methods_default = wire.methods.unwrap_or(route::METHODS);
        let methods =
            raw.methods
                .clone()
                .unwrap_or_else(|| methods_default.iter().map(|m| m.to_string()).collect())
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
                    if method == Method::CONNECT {
                        return Err(self.invalid(
                            field("methods"),
                            "`CONNECT` asks for a tunnel, which the gateway refuses: never a write",
                        ));
                    }
                    Ok(method)
                })
                .collect::<Result<Vec<_>, _>>()?;
        let mcp = profile == Profile::Mcp;
        if mcp && raw.methods.is_some() {
            return Err(self.invalid(
                field("methods"),
                "an mcp route protects tools/call, which is always a POST: leave methods out",
            ));
        }
        let key_default = if mcp { route::MCP_KEY } else { route::KEY };
        let key = raw
            .key
            .as_deref()
            .unwrap_or(key_default)
            .parse()
            .map_err(|reason: String| self.invalid(field("key"), reason))?;
        if mcp && key == KeyMode::Assign {
            return Err(self.invalid(
                field("key"),
                "an mcp route cannot assign keys: an agent never sees one to retry with; use derive or require",
            ));
        }
        let scope_headers = self.headers(
            &field("scope_headers"),
            raw.scope_headers,
            wire.scope_headers.unwrap_or(route::SCOPE_HEADERS),
        )?;
        let allow_anonymous = raw.allow_anonymous.unwrap_or(route::ALLOW_ANONYMOUS);
        if scope_headers.is_empty() && !allow_anonymous {
            return Err(self.invalid(
                field("scope_headers"),
                "is empty: set allow_anonymous = true to share keys between all clients",
            ));
        }
        let ignore_fields = self.pointers(&field("ignore_fields"), raw.ignore_fields)?;
        if wire.body_as_sent && !ignore_fields.is_empty() {
            return Err(self.invalid(
                field("ignore_fields"),
                format!(
                    "the `{}` profile compares a body byte for byte, so no field of it can be ignored",
                    profile.name()
                ),
            ));
        }
        let derive_from = self.pointers(&field("derive_from"), raw.derive_from)?;
        if !derive_from.is_empty() && key != KeyMode::Derive {
            return Err(self.invalid(field("derive_from"), "only with key = \"derive\""));
        }
        if mcp && !derive_from.is_empty() {
            return Err(self.invalid(
                field("derive_from"),
                "an mcp route derives a keyless call's key from its tool and arguments; name a key argument in [routes.mcp] key_argument instead",
            ));
        }
        let (in_progress_default, rotated_keys_default) = if mcp {
            (route::MCP_IN_PROGRESS, route::MCP_ROTATED_KEYS)
        } else {
            (route::IN_PROGRESS, route::ROTATED_KEYS)
        };
        let in_progress = self.choice(
            &field("in_progress"),
            raw.in_progress.as_deref(),
            in_progress_default,
            &[
                ("reject", InProgressMode::Reject),
                ("wait", InProgressMode::Wait),
            ],
        )?;
        let rotated_keys = self.choice(
            &field("rotated_keys"),
            raw.rotated_keys.as_deref(),
            rotated_keys_default,
            &[("hold", RotatedKeys::Hold), ("off", RotatedKeys::Off)],
        )?;
        // What the key headers may not take: the route's scope headers and
        // the headers its profile reads beside the key (Stripe's account
        // and context, OASIS's client id and first-sent time), which the
        // destination reads as the profile does.
        let read_headers: Vec<HeaderName> = scope_headers
            .iter()
            .cloned()
            .chain(
                wire.narrowing_headers
                    .iter()
                    .chain(wire.first_sent.iter())
                    .filter_map(|name| HeaderName::from_bytes(name.as_bytes()).ok()),
            )
            .collect();
        let forward_key_header = self.key_header(
            &field("forward_key_header"),
            raw.forward_key_header
                .as_deref()
                .unwrap_or(route::FORWARD_KEY_HEADER),
            &read_headers,
        )?;
        let destination_key = self.destination_key(
            &field,
            &read_headers,
            raw.destination_key_header.as_deref(),
            raw.destination_key_window.as_deref(),
            raw.resend_unknown,
        )?;
        // A signed header reaches the destination as the client sent it:
        // the client's key goes on under its own name, and the destination
        // key takes a header of its own.
        let signed = |name: &str| wire.signed_headers.contains(&name);
        if let Some(key) = wire.key_headers.iter().find(|name| signed(name))
            && forward_key_header.as_ref().map(HeaderName::as_str) != Some(key)
        {
            return Err(self.invalid(
                field("forward_key_header"),
                format!(
                    "the `{}` profile forwards `{key}` as the client signed it, under its own name",
                    profile.name()
                ),
            ));
        }
        if let Some(destination) = &destination_key
            && signed(destination.header.as_str())
        {
            return Err(self.invalid(
                field("destination_key_header"),
                format!(
                    "the `{}` profile forwards `{}` as the client signed it: name a header of the destination key's own",
                    profile.name(),
                    destination.header
                ),
            ));
        }
        let askable = Askable::of(
            wire,
            forward_key_header.as_ref(),
            destination_key.as_ref(),
            raw.store_request_body.unwrap_or(route::STORE_REQUEST_BODY),
        );
        let mcp_tools = match (mcp, raw.mcp) {
            (true, raw) => {
                Some(self.mcp_tools(&field("mcp"), raw.unwrap_or_default(), &askable)?)
            }
            (false, None) => None,
            (false, Some(_)) => {
                return Err(self.invalid(field("mcp"), "only on a route with profile = \"mcp\""));
            }
        };
        // An MCP tool call is proved by a tool of the server's own
        // (`[routes.mcp.reconcile]`); an HTTP probe's answer would reach
        // the agent as the tool's result.
        if mcp && raw.reconcile.is_some() {
            return Err(self.invalid(
                field("reconcile"),
                "not on a route with profile = \"mcp\": a held tool call is probed by a tool of the server's, [routes.mcp.reconcile] (docs/mcp.md)",
            ));
        }
        let reconcile = raw
            .reconcile
            .map(|r| self.reconcile(&field("reconcile"), r, &upstream, &askable))
            .transpose()?;
        let unknown_statuses = self.statuses(
            &field("unknown_statuses"),
            raw.unknown_statuses,
            route::UNKNOWN_STATUSES,
        )?;
        // A profile that never stores a 5xx (ACP §6.5) releases every one
        // the route does not hold as `unknown`.
        let release_default: Vec<u16> = if wire.release_5xx {
            let five_xx = (500..=599).filter(|s| !unknown_statuses.contains(s));
            std::iter::once(429).chain(five_xx).collect()
        } else {
            route::RELEASE_STATUSES.to_vec()
        };
        let release_statuses = self.statuses(
            &field("release_statuses"),
            raw.release_statuses,
            &release_default,
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
        let connect_retries = raw.connect_retries.unwrap_or(route::CONNECT_RETRIES);
        if connect_retries > 10 {
            return Err(self.invalid(field("connect_retries"), "at most 10"));
        }
        let fingerprint_headers = self.headers(
            &field("fingerprint_headers"),
            raw.fingerprint_headers,
            wire.fingerprint_headers
                .unwrap_or(route::FINGERPRINT_HEADERS),
        )?;
        Ok(Route {
            name,
            profile,
            path_prefix,
            upstream,
            upstream_tls,
            upstream_http2: raw.upstream_http2.unwrap_or(route::UPSTREAM_HTTP2),
            methods,
            key,
            scope_headers,
            allow_anonymous,
            fingerprint_headers,
            ignore_fields,
            forward_key_header,
            destination_key,
            derive_from,
            derive_window: self.duration(
                &field("derive_window"),
                raw.derive_window.as_deref(),
                route::DERIVE_WINDOW,
            )?,
            in_progress,
            rotated_keys,
            late_window: self.duration(
                &field("late_window"),
                raw.late_window.as_deref(),
                route::LATE_WINDOW,
            )?,
            first_sent_skew: self.duration(
                &field("first_sent_skew"),
                raw.first_sent_skew.as_deref(),
                route::FIRST_SENT_SKEW,
            )?,
            pause_after_unknown: raw
                .pause_after_unknown
                .unwrap_or(route::PAUSE_AFTER_UNKNOWN),
            reconcile,
            mcp: mcp_tools,
            wait_timeout: self.duration(
                &field("wait_timeout"),
                raw.wait_timeout.as_deref(),
                route::WAIT_TIMEOUT,
            )?,
            max_waiters: self.count(&field("max_waiters"), raw.max_waiters, route::MAX_WAITERS)?,
            quota: self.quota(
                &field,
                raw.quota_operations,
                raw.quota_stored_bytes.as_deref(),
                raw.quota_window.as_deref(),
            )?,
            connect_timeout: self.duration(
                &field("connect_timeout"),
                raw.connect_timeout.as_deref(),
                route::CONNECT_TIMEOUT,
            )?,
            max_upstream_connections: self.connection_cap(
                &field("max_upstream_connections"),
                raw.max_upstream_connections,
                route::MAX_UPSTREAM_CONNECTIONS,
            )?,
            upstream_timeout: self.duration(
                &field("upstream_timeout"),
                raw.upstream_timeout.as_deref(),
                route::UPSTREAM_TIMEOUT,
            )?,
            connect_retries,
            release_statuses,
            unknown_statuses,
            max_body: self.size(&field("max_body"), raw.max_body.as_deref(), route::MAX_BODY)?,
            max_stored_response: self.size(
                &field("max_stored_response"),
                raw.max_stored_response.as_deref(),
                route::MAX_STORED_RESPONSE,
            )?,
            store_request_body: raw.store_request_body.unwrap_or(route::STORE_REQUEST_BODY),
        })
    }

    /// A header a key is sent to the destination in (`forward_key_header`,
    /// `destination_key_header`): none when empty. Never one that frames,
    /// routes or describes the request, or carries its credentials or the
    /// gateway's own forwarding fields, nor one of `read_headers` (the
    /// route's scope headers, and those its profile reads beside the key): the key would replace it, and the
    /// destination get another request than the one sent — or, for a
    /// header the gateway writes after it, never get the key.
    fn key_header(
        &self,
        field: &str,
        name: &str,
        read_headers: &[HeaderName],
    ) -> Result<Option<HeaderName>, ConfigError> {
        if name.is_empty() {
            return Ok(None);
        }
        let header = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| self.invalid(field, format!("`{name}` is not a header name")))?;
        if NOT_A_KEY_HEADER.contains(&header.as_str()) || read_headers.contains(&header) {
            return Err(self.invalid(
                field,
                format!(
                    "`{name}` frames, routes, describes or authenticates the request (or scopes the route's keys): the key would take its place; name a header of the key's own"
                ),
            ));
        }
        Ok(Some(header))
    }

    /// `destination_key_header`, `destination_key_window` and
    /// `resend_unknown`: the window only with a header, a re-send only
    /// within a window.
    fn destination_key(
        &self,
        field: &dyn Fn(&str) -> String,
        read_headers: &[HeaderName],
        header: Option<&str>,
        window: Option<&str>,
        resend_unknown: Option<bool>,
    ) -> Result<Option<DestinationKey>, ConfigError> {
        let resend_unknown = resend_unknown.unwrap_or(route::RESEND_UNKNOWN);
        let header = self.key_header(
            &field("destination_key_header"),
            header.unwrap_or(route::DESTINATION_KEY_HEADER),
            read_headers,
        )?;
        let Some(header) = header else {
            if window.is_some() {
                return Err(self.invalid(
                    field("destination_key_window"),
                    "only with destination_key_header",
                ));
            }
            if resend_unknown {
                return Err(self.invalid(
                    field("resend_unknown"),
                    "only with destination_key_header: a re-send without a key the destination deduplicates on could write twice",
                ));
            }
            return Ok(None);
        };
        let window = window
            .map(|w| self.duration(&field("destination_key_window"), Some(w), ""))
            .transpose()?;
        if resend_unknown && window.is_none() {
            return Err(self.invalid(
                field("destination_key_window"),
                "is required with resend_unknown: the destination's documented retention of its keys, past which nothing is re-sent",
            ));
        }
        Ok(Some(DestinationKey {
            header,
            window,
            resend_unknown,
        }))
    }

    /// `upstream_ca` and the client certificate: https upstreams only; the
    /// files are read at start (`tls::read`).
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
            window: self.duration(&field("quota_window"), window, route::QUOTA_WINDOW)?,
        }))
    }

    /// `[routes.mcp]`: tool names as the server lists them; a tool both
    /// read-only and protected is refused, as it cannot be both.
    fn mcp_tools(
        &self,
        field: &str,
        raw: RawMcp,
        askable: &Askable,
    ) -> Result<McpTools, ConfigError> {
        let read_only = raw.read_only_tools.unwrap_or_default();
        let protected = raw.protected_tools.unwrap_or_default();
        if let Some(both) = read_only.iter().find(|t| protected.contains(t)) {
            return Err(self.invalid(
                format!("{field}.protected_tools"),
                format!("`{both}` is also in read_only_tools"),
            ));
        }
        if let Some(empty) = read_only.iter().chain(&protected).find(|t| t.is_empty()) {
            return Err(self.invalid(
                format!("{field}.read_only_tools"),
                format!("`{empty}` is not a tool name"),
            ));
        }
        let key_argument = match raw.key_argument {
            Some(name) if name.is_empty() => {
                return Err(self.invalid(format!("{field}.key_argument"), "is empty"));
            }
            other => other,
        };
        let reconcile = raw
            .reconcile
            .map(|probe| {
                let tools = McpToolLists {
                    read_only: &read_only,
                    protected: &protected,
                };
                self.mcp_reconcile(&format!("{field}.reconcile"), probe, tools, askable)
            })
            .transpose()?;
        Ok(McpTools {
            read_only,
            protected,
            key_argument,
            reconcile,
        })
    }

    /// `[routes.mcp.reconcile]`: a read-only tool, arguments that are a
    /// JSON object once filled, `{argument:…}` only where bodies are kept;
    /// the same for a confirm call; the tools whose writes it proves.
    fn mcp_reconcile(
        &self,
        field: &str,
        raw: RawMcpReconcile,
        lists: McpToolLists<'_>,
        askable: &Askable,
    ) -> Result<McpReconcile, ConfigError> {
        let protected = lists.protected;
        let call = self.tool_call(
            (&format!("{field}.tool"), &format!("{field}.arguments")),
            raw.tool,
            raw.arguments,
            protected,
            askable,
        )?;
        let tools = self.proved_tools(&format!("{field}.tools"), raw.tools, &call.tool, lists)?;
        let found_json_pointer = self.pointer(
            &format!("{field}.found_json_pointer"),
            raw.found_json_pointer,
        )?;
        let absent = self
            .pointer(
                &format!("{field}.absent_json_pointer"),
                raw.absent_json_pointer,
            )?
            .map(|pointer| Absence {
                status: None,
                json_pointer: Some(pointer),
            });
        let confirm_pointer = self.pointer(
            &format!("{field}.confirm_absent_json_pointer"),
            raw.confirm_absent_json_pointer,
        )?;
        let confirm = match (raw.confirm_tool, confirm_pointer) {
            (None, None) if raw.confirm_arguments.is_none() => None,
            (Some(tool), Some(pointer)) => Some(Confirm {
                question: self.tool_call(
                    (
                        &format!("{field}.confirm_tool"),
                        &format!("{field}.confirm_arguments"),
                    ),
                    tool,
                    raw.confirm_arguments,
                    protected,
                    askable,
                )?,
                absent: Absence {
                    status: None,
                    json_pointer: Some(pointer),
                },
            }),
            (Some(_), None) => {
                return Err(self.invalid(
                    format!("{field}.confirm_absent_json_pointer"),
                    "a confirm call needs it: where its result says absent",
                ));
            }
            (None, _) => {
                return Err(self.invalid(
                    format!("{field}.confirm_tool"),
                    "the confirm_* keys need the confirm call's tool",
                ));
            }
        };
        // Any result that is no error is found unless a pointer says
        // where the write is, or how many there are.
        if absent.is_some() && found_json_pointer.is_none() && raw.count_json_pointer.is_none() {
            return Err(self.invalid(
                format!("{field}.found_json_pointer"),
                "with absence told by the result, every result would be found: say where a found result holds the write (found_json_pointer or count_json_pointer)",
            ));
        }
        Ok(McpReconcile {
            tool: call.tool,
            tools,
            arguments: call.arguments,
            found_json_pointer,
            verdicts: self.verdicts(field, absent, raw.count_json_pointer, raw.min_age, confirm)?,
            timeout: self.duration(
                &format!("{field}.timeout"),
                raw.timeout.as_deref(),
                reconcile::TIMEOUT,
            )?,
        })
    }

    /// The tools whose writes an MCP probe proves: named, since what it
    /// finds for one tool's writes says nothing of another's; each a tool
    /// whose calls are held (not read-only), and not the probe's own.
    fn proved_tools(
        &self,
        field: &str,
        tools: Option<Vec<String>>,
        probe: &str,
        lists: McpToolLists<'_>,
    ) -> Result<Vec<String>, ConfigError> {
        let tools = tools.filter(|t| !t.is_empty()).ok_or_else(|| {
            self.invalid(
                field,
                "is required: the tools whose writes the probe proves (a probe for one tool's writes says nothing of another's, so a held call of a tool not named here is never probed)",
            )
        })?;
        for tool in &tools {
            let refused = if tool.is_empty() {
                "is not a tool name"
            } else if lists.read_only.contains(tool) {
                "is in read_only_tools: its calls are never held, and so never probed"
            } else if tool == probe {
                "is the probe's own tool, which only reads"
            } else {
                continue;
            };
            return Err(self.invalid(field, format!("`{tool}` {refused}")));
        }
        Ok(tools)
    }

    /// A read-only tool's call: not a protected tool, arguments a JSON
    /// object once filled, `{argument:…}` only where bodies are kept,
    /// `{destination_key}` only where the route sends one. `{key}` is
    /// the call's own, which reaches the server in the call itself when
    /// it came in `_meta` or a key argument, so it is not refused here.
    fn tool_call(
        &self,
        (tool_field, arguments_field): (&str, &str),
        tool: String,
        arguments: Option<String>,
        protected: &[String],
        askable: &Askable,
    ) -> Result<ToolCall, ConfigError> {
        if tool.is_empty() {
            return Err(self.invalid(tool_field, "is empty"));
        }
        if protected.contains(&tool) {
            return Err(self.invalid(
                tool_field,
                format!("`{tool}` is in protected_tools: a probe only reads"),
            ));
        }
        let arguments = arguments.unwrap_or_else(|| mcp_reconcile::ARGUMENTS.to_string());
        let keys = ProbeKeys {
            key: "k",
            destination_key: "d",
        };
        let filled =
            super::runtime::fill_template(&arguments, keys, |_| Some(serde_json::Value::from("v")))
                .map_err(|reason| self.invalid(arguments_field, reason))?;
        if !filled.is_object() {
            return Err(self.invalid(arguments_field, "must be a JSON object once filled"));
        }
        let asks = (false, arguments.contains("{destination_key}"));
        self.asks_by_keys_sent(arguments_field, asks, askable)?;
        if arguments.contains("{argument:") && !askable.keeps_bodies {
            return Err(self.invalid(
                arguments_field,
                "{argument:…} reads the held call's arguments, which the route keeps only with store_request_body = true",
            ));
        }
        Ok(ToolCall { tool, arguments })
    }

    /// The verdicts' shared keys: a count pointer, `min_age`, and a
    /// confirm request only beside rules for absence.
    fn verdicts<Q>(
        &self,
        field: &str,
        absent: Option<Absence>,
        count_json_pointer: Option<String>,
        min_age: Option<String>,
        confirm: Option<Confirm<Q>>,
    ) -> Result<Verdicts<Q>, ConfigError> {
        if confirm.is_some() && absent.is_none() {
            return Err(self.invalid(
                format!("{field}.absent_json_pointer"),
                "a confirm request only confirms an absence: give the rules for one",
            ));
        }
        Ok(Verdicts {
            absent,
            count_json_pointer: self
                .pointer(&format!("{field}.count_json_pointer"), count_json_pointer)?,
            min_age: self.duration(
                &format!("{field}.min_age"),
                min_age.as_deref(),
                reconcile::MIN_AGE,
            )?,
            confirm,
        })
    }

    fn reconcile(
        &self,
        field: &str,
        raw: RawReconcile,
        upstream: &Upstream,
        askable: &Askable,
    ) -> Result<Reconcile, ConfigError> {
        self.probe_url(&format!("{field}.url"), &raw.url, upstream, askable)?;
        let found_status = self.status(
            &format!("{field}.found_status"),
            raw.found_status.unwrap_or(reconcile::FOUND_STATUS),
        )?;
        let found_json_pointer = self.pointer(
            &format!("{field}.found_json_pointer"),
            raw.found_json_pointer,
        )?;
        let result_json_pointer = self.pointer(
            &format!("{field}.result_json_pointer"),
            raw.result_json_pointer,
        )?;
        let absent = self.absence(
            &format!("{field}.absent_status"),
            raw.absent_status,
            &format!("{field}.absent_json_pointer"),
            raw.absent_json_pointer,
            found_status,
        )?;
        if let Some(absent) = &absent
            && absent.status == Some(found_status)
            && found_json_pointer.is_none()
        {
            return Err(self.invalid(
                format!("{field}.found_json_pointer"),
                format!(
                    "with absence told at status {found_status}, every such answer would be found: say where a found answer holds the write"
                ),
            ));
        }
        let confirm_absent = self.absence(
            &format!("{field}.confirm_absent_status"),
            raw.confirm_absent_status,
            &format!("{field}.confirm_absent_json_pointer"),
            raw.confirm_absent_json_pointer,
            reconcile::FOUND_STATUS,
        )?;
        let confirm = match (raw.confirm_url, confirm_absent) {
            (None, None) => None,
            (Some(url), Some(absent)) => {
                self.probe_url(&format!("{field}.confirm_url"), &url, upstream, askable)?;
                Some(Confirm {
                    question: url,
                    absent,
                })
            }
            (Some(_), None) => {
                return Err(self.invalid(
                    format!("{field}.confirm_absent_status"),
                    "a confirm request needs confirm_absent_status or confirm_absent_json_pointer: when its answer says absent",
                ));
            }
            (None, Some(_)) => {
                return Err(self.invalid(
                    format!("{field}.confirm_url"),
                    "the confirm_* keys need the confirm request's URL",
                ));
            }
        };
        Ok(Reconcile {
            url: raw.url,
            found_status,
            found_json_pointer,
            result_json_pointer,
            verdicts: self.verdicts(field, absent, raw.count_json_pointer, raw.min_age, confirm)?,
            timeout: self.duration(
                &format!("{field}.timeout"),
                raw.timeout.as_deref(),
                reconcile::TIMEOUT,
            )?,
        })
    }

    /// A probe's URL template: on the route's own upstream origin, its
    /// placeholders ([`super::runtime::url_pieces`]) only in the path or the
    /// query (at least one there), no fragment, each key one the route
    /// sends the destination, and `{body:…}` only where bodies are kept.
    fn probe_url(
        &self,
        url_field: &str,
        url: &str,
        upstream: &Upstream,
        askable: &Askable,
    ) -> Result<(), ConfigError> {
        // A fragment is never sent: `{key}` there would make every probe ask
        // the same question, and settle unrelated operations with one answer.
        if url.contains('#') {
            return Err(self.invalid(
                url_field,
                "a probe URL takes no fragment (`#…`): it is never sent, so the probe could not name the key; put {key} in the path or the query",
            ));
        }
        let pieces =
            super::runtime::url_pieces(url).map_err(|reason| self.invalid(url_field, reason))?;
        let sample: String = pieces
            .iter()
            .map(|piece| match piece {
                Piece::Text(text) => *text,
                Piece::Key | Piece::DestinationKey | Piece::Body(_) => "k",
            })
            .collect();
        let probe =
            Upstream::parse_any(&sample).map_err(|reason| self.invalid(url_field, reason))?;
        // Placeholders go where they name a resource: the path or the query.
        let after_scheme = url.split_once("://").map_or("", |(_, rest)| rest);
        let (authority, path_and_query) =
            after_scheme.split_at(after_scheme.find(['/', '?']).unwrap_or(after_scheme.len()));
        if authority.contains('{') || !path_and_query.contains('{') {
            return Err(self.invalid(
                url_field,
                "must contain {key}, {destination_key} or {body:/pointer} in its path or query (only there), where the key goes",
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
        let asks = (
            pieces.contains(&Piece::Key),
            pieces.contains(&Piece::DestinationKey),
        );
        self.asks_by_keys_sent(url_field, asks, askable)?;
        if pieces.iter().any(|p| matches!(p, Piece::Body(_))) && !askable.keeps_bodies {
            return Err(self.invalid(
                url_field,
                "{body:…} reads the stored request body, which the route keeps only with store_request_body = true",
            ));
        }
        Ok(())
    }

    /// A probe that asks by `{key}` and/or `{destination_key}` (`asks`)
    /// asks by keys the destination got: a key it never got finds nothing,
    /// and with rules for absence that nothing would release the write to
    /// be sent again.
    fn asks_by_keys_sent(
        &self,
        field: &str,
        (key, destination_key): (bool, bool),
        askable: &Askable,
    ) -> Result<(), ConfigError> {
        if destination_key && !askable.destination_key {
            return Err(self.invalid(
                field,
                "{destination_key} is the operation's id as destination_key_header sends it, and this route sends none: set destination_key_header, or ask by {key}",
            ));
        }
        if key && let Some(why) = &askable.no_client_key {
            return Err(self.invalid(
                field,
                format!(
                    "{{key}} is the client's key, which this route never sends the destination ({why}): ask by {{destination_key}}, the operation's id (sent with destination_key_header), or by {{body:/pointer}}"
                ),
            ));
        }
        Ok(())
    }

    /// When an answer says absent: `status` and/or `json_pointer`; the
    /// pointer alone is read from answers with `status_with_pointer`.
    fn absence(
        &self,
        status_field: &str,
        status: Option<u16>,
        pointer_field: &str,
        pointer: Option<String>,
        status_with_pointer: u16,
    ) -> Result<Option<Absence>, ConfigError> {
        let pointer = self.pointer(pointer_field, pointer)?;
        let status = status.map(|s| self.status(status_field, s)).transpose()?;
        // An error or a redirect (never followed) is no answer about the
        // write: taken for absence, the write would be sent again.
        if let Some(status) = status.filter(|s| !(200..300).contains(s) && !(400..500).contains(s))
        {
            return Err(self.invalid(
                status_field,
                format!(
                    "{status} says nothing of the write (only a 2xx or a 4xx can say it is absent)"
                ),
            ));
        }
        Ok(match (status, pointer) {
            (None, None) => None,
            (status, json_pointer) => Some(Absence {
                status: status.or(Some(status_with_pointer)),
                json_pointer,
            }),
        })
    }

    fn status(&self, field: &str, status: u16) -> Result<u16, ConfigError> {
        if !(100..=599).contains(&status) {
            return Err(self.invalid(field, format!("{status} is not a status")));
        }
        Ok(status)
    }

    fn pointer(&self, field: &str, pointer: Option<String>) -> Result<Option<String>, ConfigError> {
        if let Some(pointer) = &pointer
            && !pointer.starts_with('/')
        {
            return Err(self.invalid(
                field,
                format!("`{pointer}` is not a JSON pointer (e.g. \"/data/0/id\")"),
            ));
        }
        Ok(pointer)
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
