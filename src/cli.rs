//! The command line (DESIGN §5): `serve`, `check-config`, `migrate`,
//! `mock-upstream`, `demo`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

use crate::config::{Config, ConfigError, KeyMode, Overrides};

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
    /// Run a small non-idempotent API with faults by path, to try idemgate against.
    MockUpstream {
        #[arg(long, default_value = "127.0.0.1:7000")]
        listen: SocketAddr,
    },
    /// Walk through what idemgate does against the mock API, then exit.
    Demo,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, clap::Args)]
pub struct Serve {
    /// The TOML config file (DESIGN §6). Without it: one catch-all route to --upstream.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Proxy listener, overriding [server].listen.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Admin listener, overriding [server].admin_listen.
    #[arg(long)]
    pub admin_listen: Option<SocketAddr>,
    /// The store URL, overriding [store].url (default sqlite://idemgate.db).
    #[arg(long)]
    pub store: Option<String>,
    /// The API to protect, without a config file.
    #[arg(long)]
    pub upstream: Option<String>,
    /// How writes without an Idempotency-Key are handled, without a config file:
    /// require, assign or off.
    #[arg(long)]
    pub key_mode: Option<String>,
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

impl Serve {
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
