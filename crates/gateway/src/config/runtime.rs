//! The validated configuration the gateway runs on: what each part of
//! the gateway reads, with the reason for a field written on it.
//!
//! Invariant: every value here went through `config::validate`, the only
//! code that builds these from the file (the no-file mode included). TLS
//! files are named here, not read: they are read at start
//! (`tls::read`), and by `idemgate check-config` the same way.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use http::header::HeaderName;
use http::{Method, Uri};

use super::StoreConfig;
use crate::profile::Profile;

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub server: ServerConfig,
    pub store: StoreConfig,
    pub routes: Vec<Route>,
    /// `[[alerts]]`: webhooks told about held work.
    pub(crate) alerts: Vec<AlertConfig>,
}

/// One validated `[[alerts]]` entry: a webhook and what it is told.
#[derive(Debug, Clone)]
pub struct AlertConfig {
    /// http or https; POSTed to as given.
    pub(crate) url: Uri,
    /// The environment variable holding the signing secret, if any.
    pub(crate) secret_env: Option<String>,
    pub(crate) events: Vec<AlertEvent>,
    /// `unknown-aged`: an operation `unknown` for this long.
    pub(crate) aged_after: Duration,
    /// A delivery still failing this long after its event is dropped.
    pub(crate) give_up_after: Duration,
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
    /// A probe found an operation more than once at the destination.
    DuplicatedAtDestination,
}

impl AlertEvent {
    pub const ALL: [AlertEvent; 4] = [
        AlertEvent::OperationUnknown,
        AlertEvent::RoutePaused,
        AlertEvent::UnknownAged,
        AlertEvent::DuplicatedAtDestination,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AlertEvent::OperationUnknown => "operation-unknown",
            AlertEvent::RoutePaused => "route-paused",
            AlertEvent::UnknownAged => "unknown-aged",
            AlertEvent::DuplicatedAtDestination => "duplicated-at-destination",
        }
    }
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    /// The environment variable holding the admin API's bearer token.
    pub(crate) admin_token_env: String,
    /// The proxy listener's certificate and key: TLS when set.
    pub(crate) tls: Option<CertPair>,
    /// The admin listener's, set apart: operators may use another CA.
    pub admin_tls: Option<CertPair>,
    /// The operator console as operators open it (behind a proxy, or on a
    /// host name), ending in `/`: what alerts link to; `None`: the admin
    /// listener's own address.
    pub(crate) console_url: Option<String>,
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
    /// HTTP/2 streams one client connection may have in progress, those it
    /// reset whose work goes on included; one more is refused (h2's
    /// `REFUSED_STREAM`, or 503 `overloaded` while reset ones run).
    pub(crate) http2_max_concurrent_streams: u32,
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

/// What a write under its own key gets while an identical one (same
/// route, scope and fingerprint) under another key is `in_progress` or
/// `unknown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RotatedKeys {
    /// 409 `possible-duplicate` naming the first operation; nothing sent.
    Hold,
    /// Sent as the new write its key says it is.
    Off,
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

/// A destination key (docs/requests.md, "A destination key"): the
/// operation's id, sent in `header` with every attempt of the operation,
/// so that a destination that deduplicates on it refuses a second record
/// whatever the gateway does.
#[derive(Debug, Clone)]
pub struct DestinationKey {
    pub header: HeaderName,
    /// How long the destination documents that it keeps a key; `None`: not
    /// given (then nothing is re-sent).
    pub(crate) window: Option<Duration>,
    /// Re-send an operation held `unknown`, under the same key, within
    /// `window` (always set when this is).
    pub resend_unknown: bool,
}

/// A route's reconcile probe (docs/requests.md, "After a lost response"): a read-only GET to the route's
/// own upstream that may prove an `unknown` operation happened, or (with
/// its [`Verdicts`]) that it did not, or that it happened more than once.
#[derive(Debug, Clone)]
pub struct Reconcile {
    /// A URL template (`url_pieces`): `{key}` where the client's bare key
    /// goes, `{destination_key}` the operation's destination key,
    /// `{body:/pointer}` a field of the stored request body (each
    /// URL-component encoded); on the route's own upstream origin,
    /// placeholders only in the path or the query, and no fragment; only
    /// the keys the route sends the destination (`config::validate`).
    pub url: String,
    pub found_status: u16,
    /// When set, the probe's JSON body must have a non-null value here.
    pub(crate) found_json_pointer: Option<String>,
    /// When set, what a found answer holds here (the write's object in a
    /// list or search result) is what retries get, not the whole answer.
    pub(crate) result_json_pointer: Option<String>,
    /// Absence, more than once; a confirm request is another GET.
    pub(crate) verdicts: Verdicts<String>,
    pub timeout: Duration,
}

/// What a probe may conclude beside "found" (docs/requests.md, "Probe
/// verdicts"): absent, only from the rules set here, only once the attempt
/// is `min_age` old and, with `confirm`, only when its answer says absent
/// too; found more than once, from `count_json_pointer`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdicts<Q> {
    /// `None`: no answer is ever taken for absence.
    pub(crate) absent: Option<Absence>,
    /// An array (its length) or a number: more than 1 is a duplicate.
    pub(crate) count_json_pointer: Option<String>,
    /// Measured from when the attempt became `unknown`.
    pub(crate) min_age: Duration,
    /// A second question whose answer must say absent too.
    pub(crate) confirm: Option<Confirm<Q>>,
}

/// When an answer says the write is not at the destination: its status
/// is `status`, and the value at `json_pointer` is an empty array, `0` or
/// `null` (present: a missing member proves nothing); each when set, at
/// least one set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Absence {
    pub(crate) status: Option<u16>,
    pub(crate) json_pointer: Option<String>,
}

/// A confirm request: the `question` (a URL template, or a tool call) and
/// when its answer says absent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confirm<Q> {
    pub(crate) question: Q,
    pub(crate) absent: Absence,
}

/// A call of a read-only MCP tool: its name and arguments template
/// (`fill_template`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub(crate) tool: String,
    pub(crate) arguments: String,
}

/// What a probe's key placeholders stand for: the two keys a held
/// operation may be known by at its destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeKeys<'a> {
    /// `{key}`: the client's key (in a probe tool's arguments, the MCP
    /// call's own, without its tool), which the destination gets in
    /// `forward_key_header` or a key header its profile passes on.
    pub key: &'a str,
    /// `{destination_key}`: the operation's id, which the destination
    /// gets in `destination_key_header` (only a route with one asks by it).
    pub destination_key: &'a str,
}

/// One piece of a probe URL template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Piece<'a> {
    Text(&'a str),
    /// `{key}`.
    Key,
    /// `{destination_key}`.
    DestinationKey,
    /// `{body:/pointer}`: the pointer.
    Body(&'a str),
}

/// The placeholders of a probe URL template, as its errors name them.
const URL_PLACEHOLDERS: &str = "{key}, {destination_key} and {body:/pointer}";

/// The pieces of a probe URL template, left to right; `Err` says which
/// `{…}` is not a placeholder (`{key}`, `{destination_key}`,
/// `{body:/pointer}`).
pub(crate) fn url_pieces(template: &str) -> Result<Vec<Piece<'_>>, String> {
    let mut pieces = Vec::new();
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        if start > 0 {
            pieces.push(Piece::Text(&rest[..start]));
        }
        let after = &rest[start..];
        let end = after.find('}').ok_or(format!(
            "a `{{` without its closing `}}`: placeholders are {URL_PLACEHOLDERS}"
        ))?;
        let placeholder = &after[1..end];
        pieces.push(match placeholder.strip_prefix("body:") {
            None if placeholder == "key" => Piece::Key,
            None if placeholder == "destination_key" => Piece::DestinationKey,
            Some(pointer) if pointer.starts_with('/') && !pointer.contains('{') => {
                Piece::Body(pointer)
            }
            _ => {
                return Err(format!(
                    "`{{{placeholder}}}` is not a placeholder: they are {URL_PLACEHOLDERS}"
                ));
            }
        });
        rest = &after[end + 1..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest));
    }
    Ok(pieces)
}

/// A route's quota per scope: at most `operations` writes sent upstream
/// and at most `stored_bytes` added to the store per `window` for each
/// scope (at least one of the two is set).
#[derive(Debug, Clone)]
pub struct Quota {
    pub(crate) operations: Option<u32>,
    pub(crate) stored_bytes: Option<u64>,
    pub window: Duration,
}

/// The origin a route forwards to: scheme and authority only.
#[derive(Debug, Clone)]
pub struct Upstream {
    pub(crate) scheme: http::uri::Scheme,
    pub(crate) authority: http::uri::Authority,
    /// `scheme://authority/`, what the route's connections connect to.
    pub origin: Uri,
    /// The `Host` header the upstream gets.
    pub(crate) host: http::HeaderValue,
}

impl Upstream {
    /// An upstream: the origin only.
    pub(super) fn parse(url: &str) -> Result<Self, String> {
        let uri = Self::uri(url)?;
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(
                "give the origin only (scheme://host[:port]); each request's own path is forwarded"
                    .into(),
            );
        }
        Self::parse_any(url)
    }

    fn uri(url: &str) -> Result<Uri, String> {
        // The URL parser's own word for this is "empty string".
        if let Some((_, rest)) = url.split_once("://")
            && rest.split(['/', '?', '#']).next() == Some("")
        {
            return Err("the URL has no host".into());
        }
        url.parse().map_err(|e| format!("not a URL: {e}"))
    }

    /// The origin of any http(s) URL.
    pub(super) fn parse_any(url: &str) -> Result<Self, String> {
        let uri = Self::uri(url)?;
        let scheme = uri.scheme().cloned().ok_or("the URL has no scheme")?;
        if scheme != http::uri::Scheme::HTTP && scheme != http::uri::Scheme::HTTPS {
            return Err(format!("scheme `{scheme}` is not http or https"));
        }
        let authority = uri.authority().cloned().ok_or("the URL has no host")?;
        if authority.as_str().contains('@') {
            return Err(
                "credentials in the URL are not allowed: its host is logged and shown".into(),
            );
        }
        // The `http` crate reads a port it cannot hold (`:99999`), or an
        // empty one, as none: the scheme's default port would be dialled.
        let after_host = authority.as_str().rsplit(']').next().unwrap_or_default();
        if after_host.contains(':') && authority.port_u16().is_none_or(|port| port == 0) {
            return Err(format!(
                "port `{}` is not a port: a number from 1 to 65535, or none for the scheme's",
                after_host.rsplit(':').next().unwrap_or_default()
            ));
        }
        let origin = Uri::builder()
            .scheme(scheme.clone())
            .authority(authority.clone())
            .path_and_query("/")
            .build()
            .map_err(|e| format!("not a URL: {e}"))?;
        let host = http::HeaderValue::from_str(authority.as_str())
            .map_err(|e| format!("the host is not a header value: {e}"))?;
        Ok(Upstream {
            scheme,
            authority,
            origin,
            host,
        })
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
    /// The conventions the route speaks on the wire (docs/profiles.md).
    pub profile: Profile,
    /// In normal form, read alike by every upstream (`request_path::prefix`),
    /// as the request paths it is matched against are.
    pub path_prefix: String,
    pub upstream: Upstream,
    /// Extra trust roots and a client certificate for an https upstream.
    pub(crate) upstream_tls: ClientTls,
    /// HTTP/2 to the upstream: with prior knowledge for `http://`, offered
    /// by ALPN beside HTTP/1.1 for `https://`; HTTP/1.1 only when `false`.
    pub(crate) upstream_http2: bool,
    pub methods: Vec<Method>,
    pub key: KeyMode,
    /// JSON pointers naming the business action (derive mode).
    pub(crate) derive_from: Vec<String>,
    /// Derive mode without `derive_from`: how long an identical request is
    /// the same operation after the earlier one's last update.
    pub derive_window: Duration,
    pub scope_headers: Vec<HeaderName>,
    pub allow_anonymous: bool,
    pub(crate) fingerprint_headers: Vec<HeaderName>,
    pub(crate) ignore_fields: Vec<String>,
    /// `None` when the file sets it to the empty string: the key is not forwarded.
    pub forward_key_header: Option<HeaderName>,
    /// The key the gateway sends the destination with every attempt, when
    /// the route names a header for it.
    pub destination_key: Option<DestinationKey>,
    pub in_progress: InProgressMode,
    pub(crate) rotated_keys: RotatedKeys,
    pub wait_timeout: Duration,
    /// `wait` mode: duplicates waiting on one operation at once; more get
    /// 409 `request-in-progress` at once.
    pub max_waiters: usize,
    /// Writes sent per scope and window; `None`: no quota.
    pub quota: Option<Quota>,
    /// After `upstream_timeout`, how long the exchange is kept open for a
    /// late response that settles an `unknown` operation.
    pub late_window: Duration,
    /// How far ahead of the gateway's clock a first-sent time (OASIS
    /// `Repeatability-First-Sent`) may be: a client clock that runs
    /// further ahead would push its request out of the tracking window
    /// and have a retry sent again once the operation is deleted.
    pub(crate) first_sent_skew: Duration,
    /// Pause the route when this many of its operations are `unknown`; 0 = never.
    pub pause_after_unknown: u32,
    pub reconcile: Option<Reconcile>,
    /// `profile = "mcp"` routes only: which tools are protected and where
    /// a call's key may be.
    pub mcp: Option<McpTools>,
    pub connect_timeout: Duration,
    /// Connections to the upstream open at once, in use or idle, across
    /// the route's pools and threads; a request that finds them all in use
    /// waits `connect_timeout` for one, then gets 503 `overloaded`.
    pub max_upstream_connections: usize,
    pub upstream_timeout: Duration,
    pub connect_retries: u32,
    pub release_statuses: Vec<u16>,
    pub unknown_statuses: Vec<u16>,
    pub max_body: usize,
    pub max_stored_response: usize,
    pub(crate) store_request_body: bool,
}

impl Route {
    /// The settings that decide which stored operation a request is — its
    /// scope, its key, its fingerprint — and which writes are protected at
    /// all, as text an operator can read: kept in the store at each start,
    /// so that a start that changes them while operations are stored under
    /// the old ones is noticed (`route_settings`). The route's name is the
    /// rest of that identity.
    pub(crate) fn identity_settings(&self) -> String {
        // Sets, as what reads them takes them: in any order, once.
        let set = |items: &mut dyn Iterator<Item = &str>| {
            let set: std::collections::BTreeSet<&str> = items.collect();
            format!("{set:?}")
        };
        let methods = set(&mut self.methods.iter().map(Method::as_str));
        let mut text = format!(
            "profile = {:?}, key = {:?}, methods = {methods}, scope_headers = {:?}",
            self.profile.wire().name,
            self.key,
            self.scope_headers
                .iter()
                .map(HeaderName::as_str)
                .collect::<Vec<_>>(),
        );
        match &self.mcp {
            // A call's fingerprint is its tool, its endpoint below the
            // prefix and its arguments but the key's.
            Some(mcp) => text.push_str(&format!(
                ", path_prefix = {:?}, mcp.key_argument = {:?}, mcp.protected = {}, mcp.read_only = {}",
                self.path_prefix,
                mcp.key_argument,
                set(&mut mcp.protected.iter().map(String::as_str)),
                set(&mut mcp.read_only.iter().map(String::as_str)),
            )),
            None => text.push_str(&format!(
                ", fingerprint_headers = {:?}, ignore_fields = {}, derive_from = {:?}",
                self.fingerprint_headers
                    .iter()
                    .map(HeaderName::as_str)
                    .collect::<Vec<_>>(),
                set(&mut self.ignore_fields.iter().map(String::as_str)),
                self.derive_from,
            )),
        }
        text
    }

    /// Whether a request with this method is a write this route protects.
    pub fn intercepts(&self, method: &Method) -> bool {
        self.key != KeyMode::Off && self.methods.contains(method)
    }

    /// Whether any held operation of this route may be proved by a probe:
    /// an HTTP route's `[routes.reconcile]`, an MCP route's read-only tool
    /// (which proves a call of the tools it names only).
    pub fn has_probe(&self) -> bool {
        self.reconcile.is_some() || self.mcp.as_ref().is_some_and(|m| m.reconcile.is_some())
    }
}

/// An MCP route's `[routes.mcp]`: which `tools/call`s are protected
/// writes. Every tool is, unless it is read-only — named here, or
/// annotated `readOnlyHint: true` by the server's own `tools/list` — and
/// a tool named in `protected` is whatever its annotation says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct McpTools {
    pub(crate) read_only: Vec<String>,
    pub(crate) protected: Vec<String>,
    /// The argument that carries a call's key, when the tool has one.
    pub(crate) key_argument: Option<String>,
    /// The read-only tool that may prove a held call happened.
    pub reconcile: Option<McpReconcile>,
}

/// A probe's arguments from a template (a tool's `reconcile.arguments`)
/// for a held call known by `keys` whose arguments `argument` gives by
/// name: each string of the template that is `{argument:NAME}` becomes
/// that argument's value, and `{key}`, `{destination_key}` or
/// `{argument:NAME}` within a longer string its text.
pub(crate) fn fill_template(
    template: &str,
    keys: ProbeKeys<'_>,
    argument: impl Fn(&str) -> Option<serde_json::Value>,
) -> Result<serde_json::Value, String> {
    fn fill(
        value: &mut serde_json::Value,
        keys: ProbeKeys<'_>,
        argument: &dyn Fn(&str) -> Option<serde_json::Value>,
    ) -> Result<(), String> {
        use serde_json::Value;
        match value {
            Value::String(text) => {
                let whole = text
                    .strip_prefix("{argument:")
                    .and_then(|rest| rest.strip_suffix('}'))
                    .filter(|name| !name.contains('{') && !name.contains('}'));
                if let Some(name) = whole {
                    *value =
                        argument(name).ok_or(format!("the held call has no argument `{name}`"))?;
                    return Ok(());
                }
                // Left to right, each placeholder of the template once: what
                // an argument holds is never read as a placeholder.
                let mut out = String::with_capacity(text.len());
                let mut rest = text.as_str();
                while let Some(start) = rest.find('{') {
                    out.push_str(&rest[..start]);
                    let after = &rest[start..];
                    if let Some(tail) = after.strip_prefix("{key}") {
                        out.push_str(keys.key);
                        rest = tail;
                    } else if let Some(tail) = after.strip_prefix("{destination_key}") {
                        out.push_str(keys.destination_key);
                        rest = tail;
                    } else if let Some(tail) = after.strip_prefix("{argument:") {
                        let end = tail
                            .find('}')
                            .ok_or("an {argument:NAME} without its closing brace")?;
                        let name = &tail[..end];
                        let found = argument(name)
                            .ok_or(format!("the held call has no argument `{name}`"))?;
                        match found {
                            Value::String(text) => out.push_str(&text),
                            other => out.push_str(&other.to_string()),
                        }
                        rest = &tail[end + 1..];
                    } else {
                        out.push('{');
                        rest = &after[1..];
                    }
                }
                out.push_str(rest);
                *text = out;
            }
            Value::Array(items) => {
                for item in items {
                    fill(item, keys, argument)?;
                }
            }
            Value::Object(members) => {
                for member in members.values_mut() {
                    fill(member, keys, argument)?;
                }
            }
            _ => {}
        }
        Ok(())
    }
    let mut value: serde_json::Value =
        serde_json::from_str(template).map_err(|e| format!("is not JSON: {e}"))?;
    fill(&mut value, keys, &argument)?;
    Ok(value)
}

/// An MCP route's reconcile probe: a call of a read-only `tool` with
/// `arguments`, a JSON object template (`{key}`: the held call's key;
/// `{destination_key}`: its destination key, only on a route with one;
/// `{argument:NAME}`: its argument NAME, from the stored request body).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpReconcile {
    pub tool: String,
    /// The tools whose writes the probe proves: a held call of any other
    /// is never probed (what the probe finds says nothing of it).
    pub(crate) tools: Vec<String>,
    pub(crate) arguments: String,
    /// The result must have a non-null value here too (after `isError` is
    /// not true).
    pub(crate) found_json_pointer: Option<String>,
    /// Absence and counts over the tool's result (never a status); a
    /// confirm request is another call.
    pub(crate) verdicts: Verdicts<ToolCall>,
    pub timeout: Duration,
}

impl McpReconcile {
    /// Whether the probe may settle a held call of `tool`: one of `tools`.
    pub fn proves(&self, tool: &str) -> bool {
        self.tools.iter().any(|t| t == tool)
    }

    /// Whether its call or its confirm call asks by `{key}`, the held
    /// call's own key.
    pub(crate) fn asks_by_key(&self) -> bool {
        let confirm = self.verdicts.confirm.as_ref();
        std::iter::once(&self.arguments)
            .chain(confirm.map(|c| &c.question.arguments))
            .any(|arguments| arguments.contains("{key}"))
    }
}

/// What an upstream connection trusts and presents.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTls {
    /// Extra trust roots (PEM), beside the public ones.
    pub ca: Option<PathBuf>,
    /// The client certificate and key (PEM) for upstreams that ask (mTLS).
    pub identity: Option<CertPair>,
}

/// A certificate chain file and its key file, both PEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertPair {
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
}
