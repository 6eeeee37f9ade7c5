//! The store `[store]` names: its keys read, then the SQLite or the
//! PostgreSQL backend opened or migrated. The one module that knows both
//! backends; everything above it holds the store interface's traits.

use std::sync::Arc;

use idemgate_model::clock::Clock;
use idemgate_store::scope_key::{ScopeKey, ScopeKeyError, ScopeKeySource, default_file};
use idemgate_store::{Seal, SealError, Store, StoreError, StoreKeys};
use idemgate_store_postgres::{PostgresSettings, PostgresStore};
use idemgate_store_sqlite::SqliteStore;

use crate::config::{StoreConfig, StoreUrl};

/// The payload keys `config` names, read through `lookup` (the
/// environment): none without `encryption_key_env`.
pub fn seal(
    config: &StoreConfig,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Seal, SealError> {
    Seal::from_env(
        config.encryption_key_env.as_deref(),
        config.previous_key_env.as_deref(),
        lookup,
    )
}

/// The scope key `config` names: `scope_key_env`, else `scope_key_file`,
/// else for SQLite `<store file>.scope-key` (created when missing), and for
/// PostgreSQL, whose replicas must share it, the variable
/// `IDEMGATE_SCOPE_KEY` (docs/deploying.md, "Keyed scope hashes").
pub fn scope_key(
    config: &StoreConfig,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<ScopeKey, ScopeKeyError> {
    let default;
    let source = match (&config.scope_key_env, &config.scope_key_file, &config.url) {
        (Some(env), _, _) => ScopeKeySource::Env(env),
        (None, Some(path), url) => ScopeKeySource::File {
            path,
            create: matches!(url, StoreUrl::Sqlite(_)),
        },
        (None, None, StoreUrl::Sqlite(db)) => {
            default = default_file(db);
            ScopeKeySource::File {
                path: &default,
                create: true,
            }
        }
        (None, None, StoreUrl::Postgres(_)) => ScopeKeySource::SharedDefault,
    };
    ScopeKey::load(source, lookup)
}

/// Opens the store `config` names as `owner`, with `keys`.
pub async fn open(
    config: &StoreConfig,
    owner: String,
    clock: Arc<dyn Clock>,
    keys: StoreKeys,
) -> Result<Arc<dyn Store>, StoreError> {
    Ok(match &config.url {
        StoreUrl::Sqlite(path) => {
            Arc::new(SqliteStore::open(path, config.durability, owner, clock, keys).await?)
        }
        StoreUrl::Postgres(url) => Arc::new(
            PostgresStore::open(
                url,
                PostgresSettings {
                    durability: config.durability,
                    lease: config.lease,
                    require_synchronous_standby: config.require_synchronous_standby,
                },
                owner,
                clock,
                keys,
            )
            .await?,
        ),
    })
}

/// Whether the store `url` names exists: a SQLite file that is there, a
/// PostgreSQL database that holds a store. Opening either makes one where
/// there is none; a command that must find one (`idemgate rekey`) asks
/// first.
pub async fn exists(url: &StoreUrl) -> Result<bool, StoreError> {
    match url {
        StoreUrl::Sqlite(path) => Ok(path.exists()),
        StoreUrl::Postgres(url) => PostgresStore::exists(url).await,
    }
}

/// Applies the migrations to the store `url` names (`idemgate migrate`).
pub async fn migrate(url: &StoreUrl) -> Result<(), StoreError> {
    match url {
        StoreUrl::Sqlite(path) => SqliteStore::migrate(path).await,
        StoreUrl::Postgres(url) => PostgresStore::migrate(url).await,
    }
}
