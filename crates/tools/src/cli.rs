//! The command line (docs/operating.md, "The command line"): `serve`, `check-config`, `migrate`,
//! `rekey`, `keys`, `healthcheck`, `mock-upstream`, `demo`, `rehearse`, `bench`.
//!
//! Invariant: this module holds the arguments only. The modules that run a
//! command (`keys_cli`, `bench`, …) import its arguments from here, and
//! nothing here names them, so each command changes without this file.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

use crate::admin_tls::AdminTls;
use idemgate::config::{Config, ConfigError, Durability, KeyMode, Overrides, defaults};

#[derive(Debug, Parser)]
#[command(
    name = "idemgate",
    version,
    about = "An idempotency gateway: makes non-idempotent write APIs safe to retry"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway.
    Serve(Serve),
    /// Validate a config file and exit (0 and `ok` when it is valid).
    CheckConfig {
        /// The TOML file to check.
        file: PathBuf,
    },
    /// Create or upgrade the store's schema, then exit.
    Migrate {
        /// The store, e.g. sqlite://idemgate.db
        #[arg(long)]
        store: String,
    },
    /// Seal every stored payload again under store.encryption_key_env's key,
    /// so store.previous_key_env can be dropped (docs/deploying.md, "Sealed store").
    /// A SQLite store must not be in use by a gateway.
    Rekey {
        /// The gateway's TOML config file.
        #[arg(long)]
        config: PathBuf,
    },
    /// Find, read and settle operations through a running gateway's admin API.
    Keys(Keys),
    /// Ask a running gateway's admin listener whether it is ready (`GET
    /// /readyz`): exit 0 when it is, 1 when not or when no answer came in
    /// time (a container's HEALTHCHECK; docs/deploying.md, "A container image").
    Healthcheck(Healthcheck),
    /// Run a small non-idempotent API with faults by path, to try idemgate against.
    MockUpstream {
        #[arg(long, default_value = "127.0.0.1:7000")]
        listen: SocketAddr,
    },
    /// Walk through what idemgate does against the mock API, then exit.
    Demo,
    /// Run the interruption drill against one route's real destination
    /// with a gateway of its own (docs/rehearse.md); it writes real records.
    Rehearse(Rehearse),
    /// Drive a retry storm (K keys × R requests at concurrency C) through a
    /// gateway and check that the API saw exactly K writes (docs/performance.md, "Benchmarking").
    Bench(Bench),
    /// Alert webhooks (docs/operating.md, "Alerts").
    Alerts {
        #[command(subcommand)]
        command: AlertsCommand,
    },
    /// Run a profile's conformance cases against any endpoint and print
    /// which pass (docs/profiles.md, "Conformance"). It writes to the target.
    Conformance(Conformance),
}

#[derive(Debug, clap::Args)]
pub struct Conformance {
    /// The endpoint's base URL; each case appends its path (`/drop`, `/slow?ms=1500`, …).
    #[arg(long)]
    pub(crate) target: String,
    /// idemgate, ietf, stripe, acp, oasis or ucp.
    #[arg(long, default_value = "idemgate")]
    pub(crate) profile: String,
    /// Confirms that the target may be written to: every case sends writes.
    #[arg(long)]
    pub(crate) writes: bool,
}

#[derive(Debug, Subcommand)]
pub enum AlertsCommand {
    /// POST a sample alert to each `[[alerts]]` endpoint of a config and
    /// print what each answered (exit 1 if one did not take it).
    Test {
        /// The TOML config file.
        #[arg(long)]
        config: PathBuf,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, clap::Args)]
pub struct Serve {
    /// The TOML config file (docs/configuration.md, "Every key"). Without it: one catch-all route to --upstream.
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
    /// Proxy listener, overriding `server.listen`.
    #[arg(long)]
    pub(crate) listen: Option<SocketAddr>,
    /// Admin listener, overriding `server.admin_listen`.
    #[arg(long)]
    pub(crate) admin_listen: Option<SocketAddr>,
    /// The store URL, overriding `store.url` (default sqlite://idemgate.db).
    #[arg(long)]
    pub(crate) store: Option<String>,
    /// The API to protect, without a config file.
    #[arg(long)]
    pub(crate) upstream: Option<String>,
    /// How writes without an Idempotency-Key are handled, without a config file:
    /// require, derive, assign or off.
    #[arg(long)]
    pub(crate) key_mode: Option<String>,
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Start even where a route was renamed or removed, or its scope,
    /// derived-key or fingerprint settings changed, while the store holds
    /// operations held under the old ones: their retries will be new
    /// writes (docs/configuration.md, "Changing a route").
    #[arg(long)]
    pub accept_route_changes: bool,
}

impl Serve {
    /// The config file `--config` names, if any.
    pub fn config_file(&self) -> Option<&std::path::Path> {
        self.config.as_deref()
    }

    /// The configuration these flags describe: the file with overrides, or
    /// the single-route no-file mode.
    pub fn config(&self) -> Result<Config, ConfigError> {
        let flag_error = |field: &str, reason: &str| ConfigError::Invalid {
            source_name: "command line".into(),
            field: field.into(),
            reason: reason.into(),
        };
        let mut config = match (&self.config, &self.upstream) {
            (Some(_), Some(_)) => {
                return Err(flag_error(
                    "--upstream",
                    "only without --config; set the routes' upstream in the file",
                ));
            }
            (Some(_), None) if self.key_mode.is_some() => {
                return Err(flag_error(
                    "--key-mode",
                    "only without --config; set the routes' key in the file",
                ));
            }
            (Some(path), None) => Config::load(path)?,
            (None, Some(upstream)) => {
                let mode = self.key_mode.as_deref().unwrap_or("require");
                let key: KeyMode = mode
                    .parse()
                    .map_err(|reason: String| flag_error("--key-mode", &reason))?;
                Config::single_route(upstream, key)?
            }
            (None, None) => {
                return Err(flag_error(
                    "--config",
                    "give --config FILE, or --upstream URL to protect one API",
                ));
            }
        };
        config.apply(&Overrides {
            listen: self.listen,
            admin_listen: self.admin_listen,
            store_url: self.store.clone(),
        })?;
        Ok(config)
    }
}

/// `idemgate keys …`: the admin API from a terminal, run by `keys_cli`.
#[derive(Debug, clap::Args)]
pub struct Keys {
    /// The admin API's base URL (the gateway's `admin_listen`).
    #[arg(long, global = true, default_value = "http://127.0.0.1:9090")]
    pub(crate) admin: String,
    /// The environment variable holding the admin token (the gateway's
    /// `admin_token_env`). The token is never taken as a flag: flags end up
    /// in shell history and process listings.
    #[arg(long, global = true, default_value = defaults::server::ADMIN_TOKEN_ENV)]
    pub(crate) token_env: String,
    #[command(flatten)]
    pub(crate) tls: AdminTls,
    /// Print the API's JSON answer instead of the human-readable form.
    #[arg(long, global = true)]
    pub(crate) json: bool,
    #[command(subcommand)]
    pub(crate) command: KeysCommand,
}

/// `idemgate healthcheck`, run by `healthcheck`.
#[derive(Debug, clap::Args)]
pub struct Healthcheck {
    /// The admin listener's base URL (the gateway's `admin_listen`).
    #[arg(
        long,
        default_value = "http://127.0.0.1:9090",
        conflicts_with = "config"
    )]
    pub(crate) admin: String,
    /// Or the gateway's config file: its `admin_listen` (asked on loopback
    /// when it is an unspecified address such as 0.0.0.0), over https when
    /// `admin_tls_cert` is set.
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) tls: AdminTls,
    /// Give up (exit 1) when no whole answer came within this long.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub(crate) timeout: Duration,
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// List operations, newest first.
    List(KeysList),
    /// Show one operation: evidence, next action, request summary and timeline.
    Show {
        /// The operation id (the ID column of `keys list`).
        id: String,
    },
    /// Settle an operation whose outcome is unknown.
    Resolve(KeysResolve),
}

#[derive(Debug, clap::Args)]
pub struct KeysList {
    /// Only operations in this state.
    #[arg(long, value_enum)]
    pub(crate) state: Option<OperationState>,
    /// Only this route (its `name`).
    #[arg(long)]
    pub(crate) route: Option<String>,
    /// Only this exact idempotency key (bare, unquoted).
    #[arg(long)]
    pub(crate) key: Option<String>,
    /// At most this many (1 to 500; the API's default is 50).
    #[arg(long)]
    pub(crate) limit: Option<u32>,
    /// Continue after the previous page (its `next cursor`).
    #[arg(long)]
    pub(crate) cursor: Option<String>,
}

/// The states of an operation, spelled as the API spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OperationState {
    #[value(name = "in_progress")]
    InProgress,
    #[value(name = "completed")]
    Completed,
    #[value(name = "unknown")]
    Unknown,
    #[value(name = "not_attempted")]
    NotAttempted,
}

impl OperationState {
    pub fn as_str(self) -> &'static str {
        match self {
            OperationState::InProgress => "in_progress",
            OperationState::Completed => "completed",
            OperationState::Unknown => "unknown",
            OperationState::NotAttempted => "not_attempted",
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct KeysResolve {
    /// The operation id.
    pub(crate) id: String,
    /// completed: it happened (retries get the stored response); not_attempted:
    /// it did not (the next retry is forwarded).
    #[arg(long, value_enum)]
    pub(crate) outcome: ResolveOutcome,
    /// Who decided, recorded in the operation's timeline.
    #[arg(long)]
    pub(crate) operator: String,
    /// Why, in a sentence, recorded in the timeline.
    #[arg(long)]
    pub(crate) note: Option<String>,
    /// A ticket or the destination's own id for the write.
    #[arg(long)]
    pub(crate) reference: Option<String>,
    /// The attempt you checked at the destination (`keys show`'s
    /// attempts): the resolution is refused (409 operation-changed) if a
    /// retry has moved the operation to another attempt since.
    #[arg(long)]
    pub(crate) attempt: Option<u32>,
    /// The status later replays get (completed only). Without it, replays get
    /// 200 {"resolved_by", "reference"}. Not for an MCP tool call: see --result.
    #[arg(long, conflicts_with = "result")]
    pub(crate) status: Option<u16>,
    /// A header of the stored response, `name: value`; repeatable.
    #[arg(long = "header", value_name = "NAME: VALUE", requires = "status")]
    pub(crate) headers: Vec<String>,
    /// The stored response body, verbatim.
    #[arg(long, requires = "status", conflicts_with = "json_body")]
    pub(crate) body: Option<String>,
    /// The stored response body as JSON, replayed exactly as typed (with
    /// content-type: application/json unless a --header sets one).
    #[arg(long, value_name = "JSON", requires = "status")]
    pub(crate) json_body: Option<String>,
    /// An MCP tool call's result, the whole object its retries get
    /// (completed only): {"content": [...], "structuredContent": {...},
    /// "isError": false}, with structuredContent matching the tool's
    /// outputSchema when it declares one. Without it, retries get the
    /// gateway's own result saying the call already ran (docs/mcp.md).
    #[arg(long, value_name = "JSON")]
    pub(crate) result: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ResolveOutcome {
    #[value(name = "completed")]
    Completed,
    #[value(name = "not_attempted")]
    NotAttempted,
}

impl ResolveOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            ResolveOutcome::Completed => "completed",
            ResolveOutcome::NotAttempted => "not_attempted",
        }
    }
}

/// `idemgate rehearse …`, run by `rehearse` (docs/rehearse.md).
#[derive(Debug, clap::Args)]
pub struct Rehearse {
    /// The gateway's TOML config file, where the route is.
    #[arg(long)]
    pub config: PathBuf,
    /// The route to rehearse (its `name`): its upstream, TLS, key mode,
    /// probe and timeouts.
    #[arg(long)]
    pub route: String,
    /// The JSON body of each synthetic write; `{key}` in it becomes the
    /// write's own key.
    #[arg(long, value_name = "JSON", required_unless_present_any = ["body_file", "tool"])]
    pub body: Option<String>,
    /// The body from a file instead.
    #[arg(long, value_name = "FILE", conflicts_with = "body")]
    pub body_file: Option<PathBuf>,
    /// On an `mcp` route: the tool each synthetic write calls, instead of a
    /// body (docs/rehearse.md, "An MCP route").
    #[arg(long, value_name = "NAME", conflicts_with_all = ["body", "body_file"])]
    pub tool: Option<String>,
    /// With --tool: its arguments, a JSON object; `{key}` in it becomes the
    /// call's own key.
    #[arg(long, value_name = "JSON", requires = "tool", default_value = "{}")]
    pub arguments: String,
    /// The most writes that may reach the destination (required: they
    /// create real records). Printed first; the rehearsal stops before a
    /// case that would need more.
    #[arg(long, value_name = "N")]
    pub writes: u64,
    /// The path the writes go to (default: the route's path_prefix).
    #[arg(long)]
    pub path: Option<String>,
    /// The writes' method (default: POST, if the route protects it).
    #[arg(long)]
    pub method: Option<String>,
    /// A header every write carries, its value read from an environment
    /// variable, never printed: NAME=VARIABLE (repeatable). The route's
    /// scope headers (its credentials) come this way.
    #[arg(long = "header-env", value_name = "NAME=VARIABLE")]
    pub header_env: Vec<String>,
    /// Also send one write straight to the destination under a key, under
    /// a control key, then under the key twice more (4 writes) to find
    /// whether it deduplicates on its own: the verdict line.
    #[arg(long)]
    pub check_destination: bool,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// `idemgate bench …`, run by `bench`. Without `--target` it starts the
/// mock API and a gateway of its own; the flags that shape that gateway
/// (`--durability`, `--wait`) conflict with `--target`.
#[derive(Debug, clap::Args)]
pub struct Bench {
    /// A running gateway to drive instead of one of its own, e.g.
    /// http://127.0.0.1:8080/orders (default path /orders); repeatable: the
    /// requests are spread round-robin.
    #[arg(long, value_name = "URL")]
    pub(crate) target: Vec<String>,
    /// With --target: the upstream's write counter (the mock API's
    /// `GET /_effects`, e.g. http://127.0.0.1:7000/_effects). Without it the
    /// exactly-once check is skipped.
    #[arg(long, value_name = "URL", requires = "target")]
    pub(crate) upstream_effects: Option<String>,
    /// Distinct idempotency keys.
    #[arg(long, short = 'k', default_value_t = 1000, conflicts_with_all = ["requests", "duration", "populate"])]
    pub(crate) keys: u64,
    /// Requests per key: the first write and R-1 retries of it (1: first writes only).
    #[arg(long, short = 'r', default_value_t = 3, conflicts_with = "populate")]
    pub(crate) retries: u64,
    /// Requests in flight at once (connections in the keep-alive pool).
    #[arg(long, short = 'c', default_value_t = 64)]
    pub(crate) concurrency: usize,
    /// Run for this long (e.g. 10s), with new keys as needed, instead of K × R requests.
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with_all = ["requests", "populate"])]
    pub(crate) duration: Option<Duration>,
    /// Send this many requests (keys: N / R, rounded up) instead of K × R.
    #[arg(long, short = 'n', conflicts_with = "populate")]
    pub(crate) requests: Option<u64>,
    /// The own gateway's store durability.
    #[arg(long, value_enum, default_value = "full", conflicts_with = "target")]
    pub(crate) durability: BenchDurability,
    /// The size of each JSON request body in bytes.
    #[arg(long, default_value_t = 100)]
    pub(crate) body_bytes: usize,
    /// The fraction (0 to 1) of retries sent with a changed payload, which
    /// a gateway answers 422 `key-reused`.
    #[arg(long, default_value_t = 0.0, conflicts_with = "populate")]
    pub(crate) changed: f64,
    /// The own gateway holds duplicates until the first attempt ends
    /// (`in_progress = "wait"`) instead of answering 409 `request-in-progress`.
    #[arg(long, conflicts_with = "target")]
    pub(crate) wait: bool,
    /// The own gateway's store is sealed (`store.encryption_key_env`) with a
    /// key made for the run: what sealing costs.
    #[arg(long, conflicts_with = "target")]
    pub(crate) sealed: bool,
    /// Send 3 keys in 10 to the mock's fault paths: the write is committed,
    /// then the connection is dropped (`/drop`) or cut mid-body
    /// (`/truncate`), or the answer comes 50 ms late (`/slow`).
    #[arg(long, conflicts_with = "populate")]
    pub(crate) faults: bool,
    /// Run the same load against this URL too (a pass-through proxy, or
    /// `mock` for the own mock API directly) and print the ratios.
    #[arg(long, value_name = "URL|mock")]
    pub(crate) compare: Option<String>,
    /// Store N completed operations as fast as possible (first writes only)
    /// and print the rate, the store's size and the gateway's resident memory.
    #[arg(long, value_name = "N")]
    pub(crate) populate: Option<u64>,
    /// With --target --populate: the gateway's process id, for its resident memory.
    #[arg(long, requires_all = ["target", "populate"])]
    pub(crate) gateway_pid: Option<u32>,
    /// With --target --populate: the gateway's SQLite file, for its size.
    #[arg(long, requires_all = ["target", "populate"])]
    pub(crate) store_file: Option<PathBuf>,
    /// Print the report as one JSON object (no progress line).
    #[arg(long)]
    pub(crate) json: bool,
}

/// `--durability`: the store's `durability` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BenchDurability {
    Full,
    Normal,
}

impl BenchDurability {
    pub fn as_str(self) -> &'static str {
        match self {
            BenchDurability::Full => "full",
            BenchDurability::Normal => "normal",
        }
    }
}

impl From<BenchDurability> for Durability {
    fn from(durability: BenchDurability) -> Durability {
        match durability {
            BenchDurability::Full => Durability::Full,
            BenchDurability::Normal => Durability::Normal,
        }
    }
}
