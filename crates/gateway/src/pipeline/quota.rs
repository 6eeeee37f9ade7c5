//! Quotas per scope: a route may bound how many writes each scope (each
//! credential) gets sent upstream per window (`quota_operations` per
//! `quota_window`) and how many bytes it adds to the store per window
//! (`quota_stored_bytes`), so one runaway automation cannot spend the API's
//! capacity, or the store's, for everyone else.
//!
//! What counts as an operation is an attempt sent: a claim that starts one.
//! What counts as stored bytes is what that attempt's operation keeps: its
//! request body when the route stores it, counted at the claim, and its
//! completed response (status line aside: headers and body), counted once
//! recorded. Replays, held operations, 409s and refusals never count, and a
//! scope over its quota still gets its existing operations answered for
//! themselves (the claim phase looks them up without claiming, as on a
//! paused route); only a write that would be sent gets 429 `quota-exceeded`
//! with `Retry-After` (the end of the window).
//!
//! Windows are fixed, start at a scope's first counted write, and are
//! measured on the gateway's clock; they are kept in memory, per process,
//! and begin anew at a restart. The check happens before the claim and the
//! count after it, so writes of one scope claimed at the same instant may
//! pass the quota by as many as were claimed together; and a response is
//! only measured once it came back, so the write that crosses the byte
//! quota is stored whole (refusing to store an answer already given would
//! lose it) and the next one is refused.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dashmap::DashMap;

use crate::config::Route;
use idemgate_model::clock;
use idemgate_model::operation::StoredResponse;

/// Quotas below this many tracked scopes are never pruned.
const PRUNE_FLOOR: usize = 1024;

/// The windows of every scope of every route with a quota.
pub struct Quotas {
    /// Per route and scope (`route\0scope`): its current window.
    windows: DashMap<String, Window>,
    /// Expired windows are dropped when the map grows past this.
    prune_at: AtomicUsize,
}

impl Default for Quotas {
    fn default() -> Self {
        Quotas {
            windows: DashMap::new(),
            prune_at: AtomicUsize::new(PRUNE_FLOOR),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Window {
    /// When it ends (ms, the gateway's clock).
    ends: i64,
    /// Attempts sent in it.
    sent: u32,
    /// Bytes its operations added to the store.
    stored: u64,
}

impl Window {
    /// Whether it is over at `now` for windows of `length`: ended, or
    /// ending further off than a window lasts (the clock was stepped back
    /// since it began, which would otherwise stretch it by the step).
    fn over(&self, now: i64, length: Duration) -> bool {
        now >= self.ends || self.ends - now > clock::millis(length)
    }
}

/// The scope has used its quota (`used` per `window`): seconds until its
/// window ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaSpent {
    pub(crate) used: Used,
    pub(crate) window: Duration,
    pub(crate) retry_after: u32,
}

/// Which of its quotas a scope has used up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Used {
    /// `quota_operations` writes sent.
    Operations(u32),
    /// At least `quota_stored_bytes` bytes stored.
    StoredBytes(u64),
}

impl fmt::Display for Used {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Used::Operations(1) => write!(f, "had 1 write sent"),
            Used::Operations(n) => write!(f, "had {n} writes sent"),
            Used::StoredBytes(n) => {
                write!(f, "stored its quota of {}", bytesize::ByteSize(*n))
            }
        }
    }
}

impl Quotas {
    /// Whether `scope` may have a write sent on `route` now (`now` in ms).
    pub fn check(&self, route: &Route, scope: &str, now: i64) -> Result<(), QuotaSpent> {
        let Some(quota) = &route.quota else {
            return Ok(());
        };
        let Some(window) = self.windows.get(&key(route, scope)).map(|w| *w) else {
            return Ok(());
        };
        if window.over(now, quota.window) {
            return Ok(());
        }
        let used = match (quota.operations, quota.stored_bytes) {
            (Some(limit), _) if window.sent >= limit => Used::Operations(limit),
            (_, Some(limit)) if window.stored >= limit => Used::StoredBytes(limit),
            _ => return Ok(()),
        };
        let seconds = (window.ends - now + 999) / 1000;
        Err(QuotaSpent {
            used,
            window: quota.window,
            retry_after: u32::try_from(seconds).unwrap_or(u32::MAX).max(1),
        })
    }

    /// Counts an attempt sent for `scope` on `route` that stored
    /// `request_bytes` of its request (`now` in ms).
    pub fn count(&self, route: &Route, scope: &str, request_bytes: usize, now: i64) {
        self.add(route, scope, now, 1, request_bytes);
    }

    /// Counts the `bytes` an attempt's response added to the store.
    pub fn count_stored(&self, route: &Route, scope: &str, bytes: usize, now: i64) {
        self.add(route, scope, now, 0, bytes);
    }

    fn add(&self, route: &Route, scope: &str, now: i64, sent: u32, bytes: usize) {
        let Some(quota) = &route.quota else {
            return;
        };
        let fresh = Window {
            ends: now + clock::millis(quota.window),
            sent: 0,
            stored: 0,
        };
        {
            // The map guard ends here, before `prune` walks the map.
            let mut window = self.windows.entry(key(route, scope)).or_insert(fresh);
            if window.over(now, quota.window) {
                *window = fresh;
            }
            window.sent = window.sent.saturating_add(sent);
            window.stored = window
                .stored
                .saturating_add(u64::try_from(bytes).unwrap_or(u64::MAX));
        }
        self.prune(now);
    }

    /// Drops windows that ended, once the map has grown past its mark, so
    /// scopes that stopped writing do not stay in memory.
    fn prune(&self, now: i64) {
        let len = self.windows.len();
        if len <= self.prune_at.load(Ordering::Relaxed) {
            return;
        }
        self.windows.retain(|_, w| now < w.ends);
        let kept = self.windows.len();
        self.prune_at
            .store(PRUNE_FLOOR.max(kept * 2), Ordering::Relaxed);
    }
}

/// Where an attempt counts the response it stores: its scope's window, on a
/// route with a byte quota.
pub struct StoredCharge {
    quotas: Arc<Quotas>,
    scope: String,
}

impl StoredCharge {
    /// The charge for an attempt of `scope` on `route`; `None` when the
    /// route has no byte quota, so nothing is kept for nothing to count.
    pub fn new(quotas: &Arc<Quotas>, route: &Route, scope: &str) -> Option<Self> {
        route
            .quota
            .as_ref()
            .and_then(|quota| quota.stored_bytes)
            .map(|_| StoredCharge {
                quotas: quotas.clone(),
                scope: scope.to_string(),
            })
    }

    /// Counts a response the store now keeps.
    pub fn count(&self, route: &Route, response: &StoredResponse, now: i64) {
        self.quotas
            .count_stored(route, &self.scope, response.stored_bytes(), now);
    }
}

fn key(route: &Route, scope: &str) -> String {
    format!("{}\0{scope}", route.name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn route_with(quota: &str) -> Route {
        let text =
            format!("[[routes]]\nname = \"api\"\nupstream = \"http://127.0.0.1:9\"\n{quota}");
        Config::from_toml_str(&text, "t").unwrap().routes.remove(0)
    }

    #[test]
    fn a_scope_gets_its_operations_per_window_and_then_the_rest_of_the_window() {
        let route = route_with("quota_operations = 2\nquota_window = \"10s\"\n");
        let quotas = Quotas::default();
        for now in [0, 1_000] {
            assert_eq!(quotas.check(&route, "alice", now), Ok(()));
            quotas.count(&route, "alice", 0, now);
        }
        assert_eq!(
            quotas.check(&route, "alice", 2_500),
            Err(QuotaSpent {
                used: Used::Operations(2),
                window: Duration::from_secs(10),
                retry_after: 8
            })
        );
        assert_eq!(quotas.check(&route, "bob", 2_500), Ok(()), "per scope");
        assert_eq!(
            quotas.check(&route, "alice", 10_000),
            Ok(()),
            "a new window"
        );
        quotas.count(&route, "alice", 0, 10_000);
        quotas.count(&route, "alice", 0, 10_001);
        assert!(quotas.check(&route, "alice", 10_002).is_err());
        // The clock stepped back an hour: the window ends no later than a
        // window lasts from now (it was told to retry after an hour).
        let stepped = 10_002 - 3_600_000;
        assert_eq!(quotas.check(&route, "alice", stepped), Ok(()));
        quotas.count(&route, "alice", 0, stepped);
        quotas.count(&route, "alice", 0, stepped + 1);
        let spent = quotas.check(&route, "alice", stepped + 2).unwrap_err();
        assert_eq!(spent.retry_after, 10);
    }

    #[test]
    fn a_scope_gets_its_stored_bytes_per_window_and_the_crossing_write_is_kept() {
        let route = route_with("quota_stored_bytes = \"1KiB\"\nquota_window = \"10s\"\n");
        let quotas = Quotas::default();
        quotas.count(&route, "alice", 300, 0);
        quotas.count_stored(&route, "alice", 700, 10);
        assert_eq!(quotas.check(&route, "alice", 20), Ok(()), "1000 < 1024");
        quotas.count(&route, "alice", 0, 20);
        quotas.count_stored(&route, "alice", 5_000, 30);
        assert_eq!(
            quotas.check(&route, "alice", 1_000),
            Err(QuotaSpent {
                used: Used::StoredBytes(1024),
                window: Duration::from_secs(10),
                retry_after: 9
            })
        );
        assert_eq!(quotas.check(&route, "bob", 1_000), Ok(()), "per scope");
        assert_eq!(
            quotas.check(&route, "alice", 10_000),
            Ok(()),
            "a new window"
        );
    }

    #[test]
    fn both_quotas_bind_and_the_message_names_the_one_used() {
        let route = route_with(
            "quota_operations = 5\nquota_stored_bytes = \"100B\"\nquota_window = \"1m\"\n",
        );
        let quotas = Quotas::default();
        quotas.count(&route, "alice", 0, 0);
        quotas.count_stored(&route, "alice", 100, 0);
        let spent = quotas.check(&route, "alice", 1).unwrap_err();
        assert_eq!(spent.used, Used::StoredBytes(100));
        assert_eq!(spent.used.to_string(), "stored its quota of 100 B");
        for now in 0..5 {
            quotas.count(&route, "bob", 0, now);
        }
        let spent = quotas.check(&route, "bob", 6).unwrap_err();
        assert_eq!(spent.used.to_string(), "had 5 writes sent");
        assert_eq!(Used::Operations(1).to_string(), "had 1 write sent");
    }

    #[test]
    fn routes_without_a_quota_count_nothing() {
        let route = route_with("");
        let quotas = Quotas::default();
        for now in 0..10 {
            quotas.count(&route, "alice", 100, now);
            quotas.count_stored(&route, "alice", 100, now);
            assert_eq!(quotas.check(&route, "alice", now), Ok(()));
        }
        assert!(quotas.windows.is_empty());
    }

    #[test]
    fn ended_windows_are_pruned_once_the_map_grows() {
        let route = route_with("quota_operations = 1\nquota_window = \"1s\"\n");
        let quotas = Quotas::default();
        for scope in 0..PRUNE_FLOOR {
            quotas.count(&route, &scope.to_string(), 0, 0);
        }
        assert_eq!(quotas.windows.len(), PRUNE_FLOOR, "not pruned yet");
        quotas.count(&route, "late", 0, 5_000);
        assert_eq!(quotas.windows.len(), 1, "only the live window is kept");
    }
}
