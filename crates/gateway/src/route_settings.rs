//! The routes' identity settings across starts. An operation is found by
//! its route's name, its scope and its key, and matched by its fingerprint:
//! a start that renames a route, or changes how its scopes, keys or
//! fingerprints are made, or which of its writes it protects
//! ([`Route::identity_settings`]), leaves the operations stored before
//! unfound — a retry of one is a new write, sent again, or a key reused
//! (422).
//!
//! A start that routes a held operation's path to another route (a
//! `path_prefix` changed, or a route with a longer one added) leaves it
//! unfound too: its retry is that route's new write.
//!
//! Invariant: a start proceeds over operations held `unknown` under
//! settings that changed, under a route no longer configured, or at a path
//! another route now takes, only when
//! the operator said so (`serve --accept-route-changes`); the settings the
//! store keeps are those of the last start that served, a route no longer
//! configured kept marked [`NO_LONGER_CONFIGURED`], with its last
//! settings, while it has operations: put back as it was, it is no
//! change.
//! Settled operations under changed settings are warned about, not
//! refused: they age out with retention. `in_progress` ones are not
//! counted: on a shared store they are peers' writes in flight, answered
//! within milliseconds, and this process's own are `unknown` by now.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use idemgate_model::operation::State;
use idemgate_store::{ListFilter, Store, StoreError};

use crate::config::Route;
use crate::pipeline::route;

/// This module's log target.
const TARGET: &str = "idemgate::route_settings";

/// What the store keeps before the last settings of a route that had
/// operations and is no longer configured (none, for a route a store
/// written before it kept settings held operations under).
const NO_LONGER_CONFIGURED: &str = "(no longer configured) ";

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

/// Why a start is refused here.
#[derive(Debug, thiserror::Error)]
pub enum StartRefused {
    /// Held operations would be left unfound.
    #[error(transparent)]
    Held(#[from] HeldUnderChangedRoutes),
    /// The store could not be read.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Who asks [`check`]: a start, which logs what it accepts over settled
/// operations, or a reload asking whether an edited file would start,
/// which logs nothing (nothing changes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Start,
    Reload,
}

/// The settings to keep once the start can no longer fail ([`check`]).
#[must_use = "the settings are kept only by Keep::keep"]
pub(crate) struct Keep(Vec<(String, Option<String>)>);

impl Keep {
    /// Keeps the settings of the start that now serves.
    pub(crate) async fn keep(self, store: &dyn Store) -> Result<(), StoreError> {
        match self.0.is_empty() {
            true => Ok(()),
            false => store.keep_route_settings(&self.0).await,
        }
    }
}

/// A route's operations in the store.
#[derive(Default, Clone, Copy)]
struct RouteCounts {
    /// `unknown`: waiting for a retry, a probe or an operator.
    held: u64,
    /// `completed` or `not_attempted`: a retry is replayed or sent.
    settled: u64,
}

/// Compares `routes`' identity settings with those the store kept at the
/// last start; refuses (unless `accept`) a start that would leave held
/// operations unfound, and warns of settled ones. What to keep, once the
/// start serves.
pub(crate) async fn check(
    store: &dyn Store,
    routes: &[Route],
    accept: bool,
    mode: Mode,
) -> Result<Keep, StartRefused> {
    let kept: HashMap<String, String> = store.route_settings().await?.into_iter().collect();
    let stored = stored_by_route(store).await?;
    let counts = |route: &str| stored.get(route).copied().unwrap_or_default();
    let mut refused = Vec::new();
    let mut keep = Vec::new();
    for route in routes {
        let now = route.identity_settings();
        let stored_as = kept.get(&route.name).map(String::as_str);
        // A route put back as it was before it went is no change.
        let before = stored_as.map(|kept| kept.strip_prefix(NO_LONGER_CONFIGURED).unwrap_or(kept));
        if let Some(before) = before.filter(|before| *before != now) {
            let change = format!(
                "route `{}`: its identity settings changed, from {before} to {now}",
                route.name
            );
            weigh(change, counts(&route.name), (accept, mode), &mut refused);
        }
        if stored_as != Some(&now) {
            keep.push((route.name.clone(), Some(now)));
        }
    }
    // Gone: kept at a start and no longer configured, or holding
    // operations the store kept no settings for (written before it did).
    let gone: BTreeSet<&String> = kept
        .keys()
        .chain(stored.keys())
        .filter(|name| !routes.iter().any(|route| &route.name == *name))
        .collect();
    for name in gone {
        let ops = counts(name);
        let last = kept.get(name).map(String::as_str);
        let marked = last.is_some_and(|last| last.starts_with(NO_LONGER_CONFIGURED));
        if !marked {
            let change = format!("route `{name}` is no longer configured (renamed, or removed)");
            weigh(change, ops, (accept, mode), &mut refused);
        }
        let gone_for_good = ops.held + ops.settled == 0;
        match (gone_for_good, marked) {
            (true, _) if last.is_some() => keep.push((name.clone(), None)),
            (false, false) => {
                let mark = format!("{NO_LONGER_CONFIGURED}{}", last.unwrap_or_default());
                keep.push((name.clone(), Some(mark)));
            }
            _ => {}
        }
    }
    for ((from, to), held) in rerouted_held(store, routes, &stored).await? {
        let now = match to {
            Some(to) => format!("route `{to}` takes"),
            None => "no route takes".into(),
        };
        let change = format!(
            "route `{from}`: operations held under it are at paths {now} now (a path_prefix changed, or a route was added)"
        );
        let ops = RouteCounts { held, settled: 0 };
        weigh(change, ops, (accept, mode), &mut refused);
    }
    if !refused.is_empty() {
        return Err(HeldUnderChangedRoutes { changes: refused }.into());
    }
    Ok(Keep(keep))
}

/// How many operations held `unknown` under each configured route that
/// holds some are at paths `routes` now send to another route (or none),
/// by their route and the one that takes them.
async fn rerouted_held(
    store: &dyn Store,
    routes: &[Route],
    stored: &HashMap<String, RouteCounts>,
) -> Result<BTreeMap<(String, Option<String>), u64>, StoreError> {
    /// Held operations read per page.
    const PAGE: u32 = 500;
    let mut rerouted = BTreeMap::new();
    let holding = routes
        .iter()
        .filter(|r| stored.get(&r.name).is_some_and(|ops| ops.held > 0));
    for held_on in holding {
        let mut filter = ListFilter {
            state: Some(State::Unknown),
            route: Some(held_on.name.clone()),
            key: None,
            before: None,
            limit: PAGE,
        };
        loop {
            let page = store.list(&filter).await?;
            for summary in &page {
                let Some((operation, _)) = store.get(&summary.id).await? else {
                    continue;
                };
                let path = operation.request.path.split('?').next().unwrap_or_default();
                let takes = route::select(routes, path, |r| r).map(|r| &r.name);
                if takes != Some(&held_on.name) {
                    let moved = (held_on.name.clone(), takes.cloned());
                    *rerouted.entry(moved).or_default() += 1;
                }
            }
            match page.last() {
                Some(last) if page.len() == PAGE as usize => filter.before = Some(last.id.clone()),
                _ => break,
            }
        }
    }
    Ok(rerouted)
}

/// Adds `change` to `refused` when it leaves held operations unfound and
/// the operator did not accept it; at a start, warns of it otherwise, if it
/// leaves any.
fn weigh(
    change: String,
    ops: RouteCounts,
    (accept, mode): (bool, Mode),
    refused: &mut Vec<String>,
) {
    let counts = format!("{} held unknown, {} settled", ops.held, ops.settled);
    if ops.held > 0 && !accept {
        refused.push(format!("{change}; the store holds {counts} under it"));
    } else if ops.held + ops.settled > 0 && mode == Mode::Start {
        tracing::warn!(target: TARGET, "{change}; its operations stored before ({counts}) will not be found by their retries, which are new writes");
    }
}

/// The store's operations by route.
async fn stored_by_route(store: &dyn Store) -> Result<HashMap<String, RouteCounts>, StoreError> {
    let mut by_route: HashMap<String, RouteCounts> = HashMap::new();
    for (route, state, n) in store.stats().await?.counts {
        let ops = by_route.entry(route).or_default();
        match state {
            State::Unknown => ops.held += n,
            State::Completed | State::NotAttempted => ops.settled += n,
            State::InProgress => {}
        }
    }
    Ok(by_route)
}
