//! The routes' identity settings across starts. An operation is found by
//! its route's name, its scope and its key, and matched by its fingerprint:
//! a start that renames a route, or changes how its scopes, derived keys or
//! fingerprints are made ([`Route::identity_settings`]), leaves the
//! operations stored before unfound — a retry of one is a new write, sent
//! again, or a key reused (422).
//!
//! Invariant: a start proceeds over operations held (`unknown` or
//! `in_progress`) under settings that changed, or under a route gone since
//! a start that kept its settings, only when the operator said so
//! (`serve --accept-route-changes`); the settings the store keeps are the
//! last start's. Settled operations under changed settings are warned
//! about, not refused: they age out with retention.

use std::collections::HashMap;

use idemgate_model::operation::State;
use idemgate_store::{Store, StoreError};

use crate::config::Route;

/// This module's log target.
const TARGET: &str = "idemgate::route_settings";

/// A start that would leave held operations unfound.
#[derive(Debug, thiserror::Error)]
#[error(
    "{}\nA retry of a held operation would not find it, and would be sent again. Settle them first (start with the previous [[routes]]; the console, or `idemgate keys list --state unknown`), or start with --accept-route-changes",
    .changes.join("\n")
)]
pub struct HeldUnderChangedRoutes {
    /// One line per route: what changed, and how many operations it holds.
    changes: Vec<String>,
}

/// A route's operations in the store, held and settled.
#[derive(Default, Clone, Copy)]
struct Held {
    held: u64,
    settled: u64,
}

/// Compares `routes`' identity settings with those the store kept at the
/// last start and keeps the new ones; refuses (unless `accept`) a start
/// that would leave held operations unfound, and warns of settled ones.
pub(crate) async fn check(
    store: &dyn Store,
    routes: &[Route],
    accept: bool,
) -> Result<(), StartRefused> {
    let kept: HashMap<String, String> = store.route_settings().await?.into_iter().collect();
    let stored = stored_by_route(store).await?;
    let mut refused = Vec::new();
    let mut keep = Vec::new();
    for route in routes {
        let now = route.identity_settings();
        let before = kept.get(&route.name);
        if let Some(before) = before.filter(|before| **before != now) {
            let ops = stored.get(&route.name).copied().unwrap_or_default();
            let change = format!(
                "route `{}`: its identity settings changed, from {before} to {now}",
                route.name
            );
            weigh(change, ops, accept, &mut refused);
        }
        if before != Some(&now) {
            keep.push((route.name.clone(), Some(now)));
        }
    }
    for gone in kept
        .keys()
        .filter(|name| !routes.iter().any(|r| &r.name == *name))
    {
        let ops = stored.get(gone).copied().unwrap_or_default();
        let change = format!("route `{gone}` is no longer configured (renamed, or removed)");
        weigh(change, ops, accept, &mut refused);
        keep.push((gone.clone(), None));
    }
    if !refused.is_empty() {
        return Err(HeldUnderChangedRoutes { changes: refused }.into());
    }
    if !keep.is_empty() {
        store.keep_route_settings(&keep).await?;
    }
    Ok(())
}

/// Adds `change` to `refused` when it leaves held operations unfound and
/// the operator did not accept it; warns of it otherwise, if it leaves any.
fn weigh(change: String, ops: Held, accept: bool, refused: &mut Vec<String>) {
    let counts = format!(
        "{} held (unknown or in_progress), {} settled",
        ops.held, ops.settled
    );
    if ops.held > 0 && !accept {
        refused.push(format!("{change}; the store holds {counts} under it"));
    } else if ops.held + ops.settled > 0 {
        tracing::warn!(target: TARGET, "{change}; its operations stored before ({counts}) will not be found by their retries, which are new writes");
    }
}

/// The store's operations by route.
async fn stored_by_route(store: &dyn Store) -> Result<HashMap<String, Held>, StoreError> {
    let mut by_route: HashMap<String, Held> = HashMap::new();
    for (route, state, n) in store.stats().await?.counts {
        let ops = by_route.entry(route).or_default();
        match state {
            State::Unknown | State::InProgress => ops.held += n,
            State::Completed | State::NotAttempted => ops.settled += n,
        }
    }
    Ok(by_route)
}

/// Why [`check`] refused a start.
#[derive(Debug, thiserror::Error)]
pub enum StartRefused {
    #[error(transparent)]
    Held(#[from] HeldUnderChangedRoutes),
    #[error(transparent)]
    Store(#[from] StoreError),
}
