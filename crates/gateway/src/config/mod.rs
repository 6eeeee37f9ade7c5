//! Configuration: the TOML file → the validated [`Config`] the gateway
//! runs on, in three rooms along its seams:
//!
//! - `file`: the file as written (`Raw*` types, `deny_unknown_fields`);
//! - `validate`: the one check, filling what is left out from
//!   [`defaults`] (each default written once, as the file spells it);
//! - [`runtime`]: the validated types the rest of the gateway reads.
//!
//! The `[store]` table is `store`'s ([`StoreConfig`]); `durability` is the store
//! interface's own type, and the one reading of a `postgres://` URL that
//! `check-config` validates with and `serve` connects with is the
//! PostgreSQL backend's, both re-exported here beside the rest.
//!
//! Invariant: a `Config` value is always valid. Every unknown field and bad
//! value is refused with the file, the field and the reason, never
//! silently ignored (docs/configuration.md, "Every key"). Nothing here
//! reads a file but the configuration itself: the TLS files it names are
//! read at start (`tls::read`).

pub mod defaults;
mod file;
pub mod runtime;
mod store;
mod validate;

pub use idemgate_store::Durability;
pub use idemgate_store_postgres::redact_url;
pub use runtime::*;
pub use store::{StoreConfig, StoreUrl};

use std::net::SocketAddr;
use std::path::Path;

use http::Method;

use file::{RawConfig, RawRoute};
use validate::Validator;

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

/// Command-line values that override the file's `[server]` and `[store]`.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub listen: Option<SocketAddr>,
    pub admin_listen: Option<SocketAddr>,
    pub store_url: Option<String>,
}

/// The standard write `method` is a near miss of (`PSOT`, `PUTT`, `PACTH`):
/// its letters in another order, or one letter more, fewer or other. An
/// extension method (`PURGE`) is none.
fn misspelling_of(method: &Method) -> Option<&'static str> {
    const WRITES: [&str; 4] = ["POST", "PUT", "PATCH", "DELETE"];
    let sent = method.as_str().as_bytes();
    let sorted = |word: &[u8]| {
        let mut letters = word.to_vec();
        letters.sort_unstable();
        letters
    };
    let near = |write: &str| {
        let write = write.as_bytes();
        let one_edit = match sent.len().abs_diff(write.len()) {
            0 => sent.iter().zip(write).filter(|(a, b)| a != b).count() == 1,
            1 => {
                let (long, short) = if sent.len() > write.len() {
                    (sent, write)
                } else {
                    (write, sent)
                };
                (0..long.len()).any(|skip| {
                    long.iter()
                        .enumerate()
                        .filter(|(i, _)| *i != skip)
                        .map(|(_, b)| b)
                        .eq(short.iter())
                })
            }
            _ => false,
        };
        sent != write && (one_edit || sorted(sent) == sorted(write))
    };
    WRITES.into_iter().find(|write| near(write))
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
            message: parse_error(text, &e),
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

    /// What the config allows but should not be, said at start and by
    /// `check-config`: a credential in a route's `fingerprint_headers`,
    /// which a copy of the store would let a guess at be confirmed
    /// (refusing it would change the fingerprint of every request a store
    /// written before holds, so their retries would be new writes or
    /// `key-reused`); an MCP probe whose absence can never be believed; a
    /// probe that reads a list without `result_json_pointer`; `methods`
    /// empty or misspelled.
    pub fn warnings(&self) -> Vec<String> {
        let credentials = self.routes.iter().filter_map(|route| {
            let name = validate::credential_in_fingerprint(route)?;
            Some(format!(
                "routes `{}`: fingerprint_headers names `{name}`, a credential: the fingerprint is kept unkeyed, so a guess at it could be confirmed from a copy of the store; move it to scope_headers, which are kept keyed, once the route holds no operation a retry may still come for (the fingerprint changes with it)",
                route.name
            ))
        });
        let unprovable = self
            .routes
            .iter()
            .filter(|route| validate::absence_by_an_unprovable_key(route))
            .map(|route| {
                format!(
                    "routes `{}`: mcp.reconcile asks by {{key}} and reads absence, but the route keeps no bodies: a call's own key reached the server only if the call carried it (in _meta or its key argument), which cannot be told without store_request_body = true, so no absence will be believed",
                    route.name
                )
            });
        let lists = self.routes.iter().filter_map(|route| {
            let pointer = validate::list_replayed_whole(route)?;
            Some(format!(
                "routes `{}`: reconcile reads its answer as a list (`{pointer}`), and a found write's retries get that whole answer as the write's response, which an SDK reads as the object it created: set result_json_pointer to where the answer holds the write (`/data/0`, say)",
                route.name
            ))
        });
        let methods = self.routes.iter().filter_map(|route| {
            let name = &route.name;
            if route.methods.is_empty() {
                return Some(format!(
                    "routes `{name}`: methods is empty, so no write is protected (key = \"off\" says so, if that is meant)"
                ));
            }
            let misspelled: Vec<String> = (route.methods.iter())
                .filter_map(|m| Some(format!("{m} (for {})", misspelling_of(m)?)))
                .collect();
            (!misspelled.is_empty()).then(|| format!(
                "routes `{name}`: methods names {}, taken as extension methods: the writes of the method meant are not protected",
                misspelled.join(", ")
            ))
        });
        let server = &self.server;
        let console = (!self.alerts.is_empty()
            && server.console_url.is_none()
            && server.admin_listen.ip().is_unspecified())
        .then(|| format!(
            "server.admin_listen = {} names every interface and opens none, and alerts link to the console there: set server.console_url to the address operators open",
            server.admin_listen
        ));
        credentials
            .chain(unprovable)
            .chain(lists)
            .chain(methods)
            .chain(console)
            .collect()
    }

    /// Applies command-line overrides, validating them like file values.
    pub fn apply(&mut self, overrides: &Overrides) -> Result<(), ConfigError> {
        if let Some(listen) = overrides.listen {
            self.server.listen = listen;
        }
        if let Some(admin) = overrides.admin_listen {
            self.server.admin_listen = admin;
        }
        if let Some(reason) =
            validate::listeners_clash(self.server.listen, self.server.admin_listen)
        {
            return Err(ConfigError::Invalid {
                source_name: "--listen, --admin-listen".into(),
                field: "server.admin_listen".into(),
                reason,
            });
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

/// Where and why `text` is no config, naming the key its line sets but
/// never quoting the line, nor a string value the message quotes (`invalid
/// type: string "…"`): the parser's own message shows the line whole, and a
/// value may be a credential (a store URL's password).
fn parse_error(text: &str, error: &toml::de::Error) -> String {
    let message = without_strings(error.message().trim_end());
    let message = message.as_str();
    let Some(span) = error.span() else {
        return message.to_string();
    };
    let start = span.start.min(text.len());
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let line = text[..start].matches('\n').count() + 1;
    let column = text[line_start..start].chars().count() + 1;
    let key = text[line_start..]
        .lines()
        .next()
        .and_then(|line| line.split_once('='))
        .map(|(key, _)| key.trim())
        .filter(|key| !key.is_empty() && key.chars().count() <= 100 && !key.starts_with('#'));
    match key {
        Some(key) => format!("line {line}, column {column} (`{key}`): {message}"),
        None => format!("line {line}, column {column}: {message}"),
    }
}

/// `message` with every double-quoted string in it shown as `"…"` (names
/// the parser quotes with backticks stay).
fn without_strings(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut chars = message.chars();
    while let Some(c) = chars.next() {
        out.push(c);
        if c != '"' {
            continue;
        }
        out.push('…');
        let mut escaped = false;
        for inner in chars.by_ref() {
            match inner {
                '"' if !escaped => break,
                '\\' => escaped = !escaped,
                _ => escaped = false,
            }
        }
        out.push('"');
    }
    out
}

#[cfg(test)]
mod tests;
