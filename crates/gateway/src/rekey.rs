//! `idemgate rekey`: seals every stored payload again under the current
//! key, in the current format (docs/deploying.md, "Sealed store"), so that the
//! previous key, or none for a store sealed after it was first used, is
//! needed no more, and the store becomes sealed-only.
//!
//! Invariant: it rekeys a store that exists and creates none: a SQLite
//! file that is not there, or a PostgreSQL database without a store, is
//! refused before anything is opened or written (no database, no schema,
//! no scope-key file). The canary moves to the
//! current key, and the store is
//! marked sealed-only, only after a pass over every operation found
//! nothing left under another key, in format 1, or plain, so such a store
//! holds no payload that needs another key or is read in clear. In a
//! store that is sealed-only already, a value in clear is refused, not
//! sealed (it was planted). The pass goes in batches of `BATCH` operations in id
//! order, each update a compare-and-set, so a replica writing meanwhile
//! (under the current key) keeps its values.

use std::sync::Arc;

use crate::config::Config;
use crate::stores;
use idemgate_model::clock::SystemClock;
use idemgate_store::scope_key::ScopeKeyError;
use idemgate_store::{self as store, SealError, StoreError, StoreKeys};

/// Operations read and sealed again per store call.
const BATCH: u32 = 500;

#[derive(Debug, thiserror::Error)]
pub enum RekeyError {
    #[error(
        "there is no store at {0}: rekey seals an existing store again and creates none (check store.url)"
    )]
    NoStore(String),
    #[error("store.encryption_key_env is not set: there is no key to seal under")]
    NoKey,
    #[error(transparent)]
    Keys(#[from] SealError),
    #[error(transparent)]
    ScopeKey(#[from] ScopeKeyError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a rekey did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rekeyed {
    /// Operations looked at.
    pub operations: u64,
    /// Operations whose payloads were sealed again.
    pub resealed: u64,
}

/// Seals again every payload of the store `config` names under the key
/// in `store.encryption_key_env`, reading keys through `lookup`.
pub async fn run(
    config: &Config,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Rekeyed, RekeyError> {
    let seal = stores::seal(&config.store, lookup)?;
    if !seal.is_sealing() {
        return Err(RekeyError::NoKey);
    }
    // Before the scope key, which a SQLite store creates beside its file.
    if !stores::exists(&config.store.url).await? {
        return Err(RekeyError::NoStore(config.store.url.to_string()));
    }
    let keys = StoreKeys {
        seal,
        scope: stores::scope_key(&config.store, lookup)?,
    };
    let owner = format!("rekey-{}", uuid::Uuid::now_v7());
    let store = stores::open(&config.store, owner, Arc::new(SystemClock), keys).await?;
    let result = pass(store.as_ref()).await;
    store.close().await;
    result
}

async fn pass(store: &dyn store::Store) -> Result<Rekeyed, RekeyError> {
    let mut done = Rekeyed {
        operations: 0,
        resealed: 0,
    };
    let mut after = String::new();
    // Ends: every batch moves `after` forward over a finite set of ids.
    loop {
        let batch = store.rekey(&after, BATCH).await?;
        let Some(last) = batch.last else {
            break;
        };
        done.operations += batch.operations;
        done.resealed += batch.resealed;
        after = last;
    }
    store.finish_rekey().await?;
    Ok(done)
}
