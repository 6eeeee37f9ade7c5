//! The `[store]` table as the gateway runs on it: where operations are
//! kept, how hard each commit is pushed to disk, the lease and the keys'
//! sources (docs/configuration.md, `[store]`).
//!
//! Invariant: a [`StoreUrl`] that parsed names a store a backend can open:
//! a SQLite file (never `:memory:`), or a PostgreSQL URL whose options
//! [`postgres_options`] reads.

use std::path::PathBuf;
use std::time::Duration;

use idemgate_store::Durability;
use idemgate_store_postgres::{postgres_options, redact_url};

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
    /// PostgreSQL: writes are refused unless the server is a primary with
    /// a synchronous standby streaming (docs/replicas.md, "Failover").
    pub(crate) require_synchronous_standby: bool,
    /// The environment variable holding the key (32 bytes, base64) that
    /// seals stored payloads; `None`: stored in clear.
    pub encryption_key_env: Option<String>,
    /// The variable holding the key payloads were sealed with before a
    /// rotation: read only, until `idemgate rekey` has sealed them again.
    pub(crate) previous_key_env: Option<String>,
    /// The variable holding the scope key (32 bytes, base64); before
    /// `scope_key_file`.
    pub(crate) scope_key_env: Option<String>,
    /// The file holding the scope key; SQLite's default is
    /// `<store file>.scope-key`, created at first start.
    pub(crate) scope_key_file: Option<PathBuf>,
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
            // `sqlite:///` or `sqlite://dir/`: a directory, which SQLite
            // cannot open as its file.
            Some(p) if p.ends_with('/') => Err(format!(
                "the sqlite URL names a directory ({p}), not a file: name the file, e.g. sqlite:///var/lib/idemgate/idemgate.db"
            )),
            Some(p) if p.contains('?') => {
                Err("sqlite URL options are not supported; use the [store] fields".into())
            }
            Some(p) if p.starts_with(":memory:") => Err(
                "an in-memory store would forget every operation on restart; name a file".into(),
            ),
            Some(p) => Ok(StoreUrl::Sqlite(PathBuf::from(p))),
            None if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                postgres_options(url)?;
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
