//! `idemgate rehearse` (docs/rehearse.md): the interruption drill, run
//! against the user's own destination. A throw-away store and an
//! in-process gateway built from one route of the user's config (its
//! upstream, TLS, key mode, probe and timeouts) take synthetic writes, one
//! key per case, while the gateway's [`Drill`] breaks them on purpose:
//! `cases` runs the five cases, `destination` asks the destination
//! itself whether it deduplicates, [`report`] says what happened, for a
//! person or (`--json`) a pipeline.
//!
//! Invariants:
//! - the faults live in this gateway only: `serve` builds no [`Drill`]
//!   and no config key can ask for one;
//! - at most `--writes` requests that may write reach the destination:
//!   the number is printed first, a case that would need more than is
//!   left is not run, and the drill refuses any write past the bound;
//!   a write counts once a byte of it may have reached the destination,
//!   so one whose connection failed spends nothing; reconcile probes are
//!   reads and are not counted;
//! - the credentials the writes carry come from the environment
//!   (`--header-env NAME=VAR`) and are never printed: the report names
//!   the variable, never its value.

mod cases;
mod destination;
pub mod report;
mod text;

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Method};

use crate::cli::Rehearse;
use crate::gateway_client::{CallError, GatewayClient};
use idemgate::config::{Config, ConfigError, Durability, KeyMode, Overrides, Route};
use idemgate::pipeline::drill::Drill;
use idemgate::pipeline::forward::{self, ProbeClient};
use idemgate::pipeline::key::url_component;
use idemgate::profile::Profile;
use idemgate::server::{Gateway, StartError, StartOptions};
use idemgate::tls::TlsError;
use report::Report;

/// Why a rehearsal could not run (a case that behaved otherwise than
/// expected is no error: the report says so).
#[derive(Debug, thiserror::Error)]
pub enum RehearseError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("no route named `{name}` in the config (its routes: {known})")]
    NoSuchRoute { name: String, known: String },
    #[error("route `{0}` has key = \"off\": it protects no write, so there is nothing to rehearse")]
    KeyOff(String),
    #[error("{0}")]
    Usage(String),
    #[error("cannot read the body: {0}")]
    Io(#[from] std::io::Error),
    #[error("cannot start the rehearsal's gateway: {0}")]
    Start(#[from] StartError),
    #[error("the route's upstream TLS: {0}")]
    Tls(#[from] TlsError),
    #[error("a request to the rehearsal's gateway failed: {0}")]
    Call(#[from] CallError),
}

/// Writes each case sends to the destination, in order.
pub(crate) const CASE_WRITES: [u64; 5] = [1, 1, 1, 2, 1];

/// Writes `--check-destination` sends straight to the destination: one
/// write under a key, under a control key, then under the key again
/// [`REPEATS`](destination::REPEATS) times.
pub(crate) const CHECK_WRITES: u64 = 2 + destination::REPEATS as u64;

/// Runs the rehearsal `args` describes, reading environment variables
/// through `env`, printing the report to `out` (as JSON with `--json`).
pub async fn run(
    args: &Rehearse,
    env: &dyn Fn(&str) -> Option<String>,
    mut out: impl Write,
) -> Result<Report, RehearseError> {
    let plan = Plan::new(args, env)?;
    if !args.json {
        report::preamble(&mut out, &plan)?;
    }
    let dir = std::env::temp_dir().join(format!("idemgate-rehearse-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir)?;
    let result = rehearse(&plan, &dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    let report = result?;
    report::write(&mut out, &report, args.json)?;
    Ok(report)
}

/// What a rehearsal does, checked before anything is sent.
pub struct Plan {
    /// The user's route, as the rehearsal's gateway runs it.
    pub(crate) route: Route,
    pub(crate) method: Method,
    pub(crate) path: String,
    /// The body each write carries; `{key}` becomes the case's key.
    pub(crate) body: String,
    /// Sent with every write; values never shown.
    pub(crate) headers: HeaderMap,
    /// `NAME=VAR` of each header, as the report names them.
    pub(crate) header_sources: Vec<String>,
    pub(crate) writes: u64,
    pub(crate) check_destination: bool,
    /// On an MCP route, the tool each write calls.
    pub(crate) tool: Option<String>,
}

impl Plan {
    fn new(args: &Rehearse, env: &dyn Fn(&str) -> Option<String>) -> Result<Plan, RehearseError> {
        let config = Config::load(&args.config)?;
        let route = config
            .routes
            .iter()
            .find(|route| route.name == args.route)
            .cloned()
            .ok_or_else(|| RehearseError::NoSuchRoute {
                name: args.route.clone(),
                known: config
                    .routes
                    .iter()
                    .map(|r| r.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        if route.key == KeyMode::Off {
            return Err(RehearseError::KeyOff(route.name));
        }
        let usage = |text: String| RehearseError::Usage(text);
        let method = match &args.method {
            Some(method) => method
                .parse::<Method>()
                .map_err(|e| usage(format!("--method: {e}")))?,
            None if route.methods.contains(&Method::POST) => Method::POST,
            None => route.methods.first().cloned().unwrap_or(Method::POST),
        };
        if !route.intercepts(&method) {
            return Err(usage(format!(
                "--method {method}: route `{}` does not protect it (its methods: {})",
                route.name,
                route
                    .methods
                    .iter()
                    .map(Method::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let mcp = route.profile == Profile::Mcp;
        let (body, call_headers) = match (&args.body, &args.body_file, &args.tool) {
            (Some(body), None, None) if !mcp => (body.clone(), HeaderMap::new()),
            (None, Some(file), None) if !mcp => (std::fs::read_to_string(file)?, HeaderMap::new()),
            (None, None, Some(tool)) if mcp => mcp_call(tool, &args.arguments).map_err(usage)?,
            _ if mcp => {
                return Err(usage(format!(
                    "route `{}` is an mcp route: give --tool NAME (and --arguments JSON), not a body",
                    route.name
                )));
            }
            _ => return Err(usage("give --body JSON or --body-file FILE".into())),
        };
        if serde_json::from_str::<serde_json::Value>(&body).is_err() {
            return Err(usage("the body is not JSON".into()));
        }
        let path = args
            .path
            .clone()
            .unwrap_or_else(|| route.path_prefix.clone());
        if !path.starts_with('/') {
            return Err(usage(format!("--path {path}: give a path starting with /")));
        }
        let (mut headers, header_sources) = headers_from_env(&args.header_env, env)?;
        headers.extend(call_headers);
        for name in &route.scope_headers {
            if !headers.contains_key(name) && !route.allow_anonymous {
                return Err(usage(format!(
                    "route `{}` scopes writes by `{name}` (its credentials): pass --header-env {name}=VARIABLE, the variable holding its value",
                    route.name
                )));
            }
        }
        Ok(Plan {
            route,
            method,
            path,
            body,
            headers,
            header_sources,
            writes: args.writes,
            check_destination: args.check_destination,
            tool: args.tool.clone().filter(|_| mcp),
        })
    }

    /// Writes the whole rehearsal needs.
    pub fn needs(&self) -> u64 {
        CASE_WRITES.iter().sum::<u64>() + self.check_writes()
    }

    pub(crate) fn check_writes(&self) -> u64 {
        if self.check_destination {
            CHECK_WRITES
        } else {
            0
        }
    }

    /// The key the operation for a write under `key` is stored with: on an
    /// MCP route, `<tool>/<key>` (docs/mcp.md, "Which calls are one"),
    /// URL-component encoded for the admin API's query.
    pub(crate) fn stored_key(&self, key: &str) -> String {
        match &self.tool {
            Some(tool) => url_component(&format!("{}/{key}", url_component(tool))),
            None => url_component(key),
        }
    }

    /// The route's probe for the rehearsed writes, as the report names
    /// it: an HTTP route's URL template, or an MCP route's probe tool when
    /// it is for the rehearsed tool (it proves no other's writes).
    pub(crate) fn probe(&self) -> Option<String> {
        if let Some(reconcile) = &self.route.reconcile {
            return Some(reconcile.url.clone());
        }
        self.tool_probe()
            .map(|probe| format!("tools/call {}", probe.tool))
    }

    /// How long the route's probe for the rehearsed writes may take.
    pub(crate) fn probe_timeout(&self) -> Option<std::time::Duration> {
        match &self.route.reconcile {
            Some(reconcile) => Some(reconcile.timeout),
            None => self.tool_probe().map(|probe| probe.timeout),
        }
    }

    /// An MCP route's probe tool, when it proves the rehearsed tool's
    /// writes.
    fn tool_probe(&self) -> Option<&idemgate::config::McpReconcile> {
        let probe = self.route.mcp.as_ref()?.reconcile.as_ref()?;
        probe.proves(self.tool.as_deref()?).then_some(probe)
    }

    /// A 409 answer of the gateway's own, `problem`, as the client gets
    /// it: on an MCP route a tool result (HTTP 200) saying it.
    pub(crate) fn conflict(&self, problem: &str) -> String {
        match self.tool {
            Some(_) => format!("a tool result saying {problem}"),
            None => format!("409 {problem}"),
        }
    }

    /// The body for `key`.
    pub(crate) fn body_for(&self, key: &str) -> String {
        self.body.replace("{key}", key)
    }

    /// A client of the route's upstream with its TLS, for probes and the
    /// destination check.
    pub(crate) fn upstream_client(&self) -> Result<ProbeClient, TlsError> {
        let identity = forward::identity(&self.route)?;
        forward::probe_client(&self.route, identity.as_ref())
    }
}

/// An MCP route's synthetic write: one `tools/call` of `tool` with
/// `arguments` (`{key}` in them the case's key), as a 2026-07-28 client
/// sends it — stateless, so it needs no session — and the request-metadata
/// headers that revision requires. Every call carries JSON-RPC id 1: an
/// id is never part of a call's identity, and one id keeps two answers
/// comparable.
fn mcp_call(tool: &str, arguments: &str) -> Result<(String, HeaderMap), String> {
    let arguments: serde_json::Value =
        serde_json::from_str(arguments).map_err(|e| format!("--arguments is not JSON: {e}"))?;
    if !arguments.is_object() {
        return Err("--arguments is a JSON object".into());
    }
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": tool,
            "arguments": arguments,
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": MCP_REVISION,
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/clientInfo": {
                    "name": "idemgate-rehearse",
                    "version": env!("CARGO_PKG_VERSION"),
                },
            },
        },
    });
    let name = HeaderValue::from_str(tool)
        .map_err(|_| format!("--tool {tool}: not a name a header can carry"))?;
    let mut headers = HeaderMap::new();
    headers.insert(
        "mcp-protocol-version",
        HeaderValue::from_static(MCP_REVISION),
    );
    headers.insert("mcp-method", HeaderValue::from_static("tools/call"));
    headers.insert("mcp-name", name);
    headers.insert(
        http::header::ACCEPT,
        HeaderValue::from_static("application/json, text/event-stream"),
    );
    Ok((body.to_string(), headers))
}

/// The MCP revision a rehearsal's calls speak.
const MCP_REVISION: &str = "2026-07-28";

/// `NAME=VAR` pairs read from the environment.
fn headers_from_env(
    pairs: &[String],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(HeaderMap, Vec<String>), RehearseError> {
    let mut headers = HeaderMap::new();
    let mut sources = Vec::new();
    for pair in pairs {
        let usage = |why: &str| RehearseError::Usage(format!("--header-env {pair}: {why}"));
        let (name, variable) = pair
            .split_once('=')
            .ok_or_else(|| usage("expected NAME=VARIABLE"))?;
        let name = HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|_| usage("not a header name"))?;
        let value = env(variable).ok_or_else(|| usage(&format!("{variable} is not set")))?;
        let value = HeaderValue::from_str(&value)
            .map_err(|_| usage(&format!("{variable} does not hold a header value")))?;
        headers.append(name.clone(), value);
        sources.push(format!("{name} from ${variable}"));
    }
    Ok((headers, sources))
}

/// Starts the rehearsal's gateway in `dir` and runs the cases and the
/// destination check.
async fn rehearse(plan: &Plan, dir: &Path) -> Result<Report, RehearseError> {
    let config = gateway_config(plan, dir)?;
    let drill = Arc::new(Drill::new(plan.writes.saturating_sub(plan.check_writes())));
    let admin_token = uuid::Uuid::now_v7().simple().to_string();
    let options = StartOptions {
        admin_token: Some(admin_token.clone()),
        drill: Some(drill.clone()),
        ..StartOptions::default()
    };
    let gateway = Gateway::start_with(config, options).await?;
    let client = GatewayClient::new(
        gateway.addr(),
        gateway.admin_addr(),
        admin_token,
        plan.headers.clone(),
    );
    let result = cases::run_all(plan, &client, &drill).await;
    gateway.shutdown().await;
    let mut report = result?;
    if plan.check_destination {
        let left = plan.writes.saturating_sub(report.writes_sent);
        if left < CHECK_WRITES {
            report.stop(format!(
                "--check-destination needs {CHECK_WRITES} writes and {left} of --writes {} are left: not sent",
                plan.writes
            ));
        } else {
            let check = destination::check(plan).await?;
            report.writes_sent += check.sent;
            report.destination_check = Some(check);
        }
    }
    report.conclude(plan);
    Ok(report)
}

/// The user's config cut down to the one route, on free loopback ports,
/// with a throw-away store and nothing that reaches beyond the rehearsal:
/// no alerts, no pause latch (its own held cases would trip it), no quota,
/// no re-sends (`resend_unknown`: writes the drill would not count, and
/// the held cases must stay held for what they show).
fn gateway_config(plan: &Plan, dir: &Path) -> Result<Config, ConfigError> {
    let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut route = plan.route.clone();
    route.pause_after_unknown = 0;
    route.quota = None;
    if let Some(destination) = &mut route.destination_key {
        destination.resend_unknown = false;
    }
    let mut config = Config::single_route(&route.upstream.origin.to_string(), route.key)?;
    config.apply(&Overrides {
        listen: Some(loopback),
        admin_listen: Some(loopback),
        store_url: Some(format!("sqlite://{}", dir.join("rehearse.db").display())),
    })?;
    config.store.durability = Durability::Normal;
    config.routes = vec![route];
    Ok(config)
}
