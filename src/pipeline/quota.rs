//! Quotas per scope: a route may bound how many writes each scope (each
//! credential) gets sent upstream per window (`quota_operations` per
//! `quota_window`), so one runaway automation cannot spend the API's
//! capacity, or the store's, for everyone else.
//!
//! What counts is an attempt sent: a claim that starts one. Replays, held
//! operations, 409s and refusals never count, and a scope over its quota
//! still gets its existing operations answered for themselves (the claim
//! phase looks them up without claiming, as on a paused route); only a
//! write that would be sent gets 429 `quota-exceeded` with `Retry-After`
//! (the end of the window).
//!
//! Windows are fixed, start at a scope's first counted write, and are
//! measured on the gateway's clock; they are kept in memory, per process,
//! and begin anew at a restart. The check happens before the claim and the
//! count after it, so writes of one scope claimed at the same instant may
//! pass the quota by as many as were claimed together.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dashmap::DashMap;

use crate::clock;
use crate::config::Route;

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
}

/// The scope has used its quota (`operations` per `window`): seconds
/// until its window ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaSpent {
    pub operations: u32,
    pub window: Duration,
    pub retry_after: u32,
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
        if now >= window.ends || window.sent < quota.operations {
            return Ok(());
        }
        let seconds = (window.ends - now + 999) / 1000;
        Err(QuotaSpent {
            operations: quota.operations,
            window: quota.window,
            retry_after: u32::try_from(seconds).unwrap_or(u32::MAX).max(1),
        })
    }

    /// Counts an attempt sent for `scope` on `route` (`now` in ms).
    pub fn count(&self, route: &Route, scope: &str, now: i64) {
        let Some(quota) = &route.quota else {
            return;
        };
        let fresh = Window {
            ends: now + clock::millis(quota.window),
            sent: 0,
        };
        {
            // The map guard ends here, before `prune` walks the map.
            let mut window = self.windows.entry(key(route, scope)).or_insert(fresh);
            if now >= window.ends {
                *window = fresh;
            }
            window.sent = window.sent.saturating_add(1);
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
            quotas.count(&route, "alice", now);
        }
        assert_eq!(
            quotas.check(&route, "alice", 2_500),
            Err(QuotaSpent {
                operations: 2,
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
        quotas.count(&route, "alice", 10_000);
        quotas.count(&route, "alice", 10_001);
        assert!(quotas.check(&route, "alice", 10_002).is_err());
    }

    #[test]
    fn routes_without_a_quota_count_nothing() {
        let route = route_with("");
        let quotas = Quotas::default();
        for now in 0..10 {
            quotas.count(&route, "alice", now);
            assert_eq!(quotas.check(&route, "alice", now), Ok(()));
        }
        assert!(quotas.windows.is_empty());
    }

    #[test]
    fn ended_windows_are_pruned_once_the_map_grows() {
        let route = route_with("quota_operations = 1\nquota_window = \"1s\"\n");
        let quotas = Quotas::default();
        for scope in 0..PRUNE_FLOOR {
            quotas.count(&route, &scope.to_string(), 0);
        }
        assert_eq!(quotas.windows.len(), PRUNE_FLOOR, "not pruned yet");
        quotas.count(&route, "late", 5_000);
        assert_eq!(quotas.windows.len(), 1, "only the live window is kept");
    }
}
