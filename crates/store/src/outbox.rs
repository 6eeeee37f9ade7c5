//! The alert outbox as the store hands it out (the tables and the triggers
//! that fill them are in the migrations): an alert is a row the database
//! wrote in the transaction of the state change it reports; a delivery is
//! that alert for one endpoint, taken by one deliverer at a time under a
//! lease, and settled once: delivered, due again later, or given up.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};

use super::{AccessPath, Param};

/// Operations an aging pass reports per threshold, at most: a backlog
/// (the first pass over a store full of held work, or a new threshold) is
/// reported over the passes that follow, and each stays short.
pub const AGED_PER_PASS: i64 = 1000;

/// A backend's aging statements as [`AccessPath`]s: `end` finds a pass's
/// last operation, `insert` adds its alerts; both read the window through
/// `operations_state_updated`, bounded by `updated_at` as the plan writes
/// it (`bound`). The parameters are the backends' own order.
pub fn aged_access_paths(end: &str, insert: &str, bound: &'static str) -> Vec<AccessPath> {
    let window = [Param::Int(0), Param::text(""), Param::Int(1_000)];
    let after_end = [Param::Int(AGED_PER_PASS - 1)];
    let after_insert = [
        Param::Int(500),
        Param::text("k"),
        Param::Int(2_000),
        Param::Int(600_000),
    ];
    [
        ("aged, end of pass", end, &after_end[..]),
        ("aged, insert", insert, &after_insert[..]),
    ]
    .into_iter()
    .map(|(name, sql, rest)| AccessPath {
        name: name.into(),
        sql: sql.into(),
        index: "operations_state_updated",
        bound: Some(bound),
        params: window.iter().chain(rest).cloned().collect(),
    })
    .collect()
}

/// An endpoint's interest in one kind of alert, as the store matches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertSubscription {
    /// The endpoint's id (a hash of its URL: the store never holds URLs).
    pub endpoint: String,
    /// `operation-unknown`, `route-paused` or `unknown-aged`.
    pub event: &'static str,
    /// `unknown-aged`: after how long (ms); 0 for the others.
    pub aged_after: i64,
}

/// What happened, as recorded when it happened: never payloads or
/// credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alert {
    pub event: String,
    /// ms since the Unix epoch.
    pub at: i64,
    pub route: String,
    pub operation_id: Option<String>,
    pub key: Option<String>,
    pub state: Option<String>,
    /// The operation's evidence, or the pause's reason.
    pub evidence: String,
}

/// One alert due at one endpoint, leased to the deliverer that took it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertDelivery {
    pub alert_id: i64,
    pub endpoint: String,
    /// Tries before this one.
    pub attempts: u32,
    pub alert: Alert,
}

/// How a delivery attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AlertOutcome {
    Delivered,
    /// Failed; due again at `next_at` (ms).
    Retry {
        next_at: i64,
        error: String,
    },
    /// Failed for good (too old, or its endpoint is gone).
    GaveUp {
        error: String,
    },
}

impl AlertPoll {
    /// The distinct `unknown-aged` thresholds (ms) to look for this poll:
    /// none unless it is `aging`.
    pub fn aged_thresholds(&self) -> Vec<i64> {
        let mut thresholds: Vec<i64> = self
            .subscriptions
            .iter()
            .filter(|s| self.aging && s.event == "unknown-aged")
            .map(|s| s.aged_after)
            .collect();
        thresholds.sort_unstable();
        thresholds.dedup();
        thresholds
    }

    /// Where an aging pass for `aged_after` starts, from its stored
    /// `cursor`: the cursor, unless it is past `now` — only a clock stepped
    /// back since it was stored (or a fast one that stored it) puts it
    /// there, and left so, every operation that became `unknown` until the
    /// clock caught up with it would never be reported aged. Then the pass
    /// starts `aged_after` before what can have aged by now, and `true`
    /// says the cursor is to be set back there (what it passes over again
    /// is still reported once per operation and threshold).
    pub fn aged_scan_from(
        cursor: Option<(i64, String)>,
        now: i64,
        aged_after: i64,
    ) -> ((i64, String), bool) {
        match cursor {
            Some((at, _)) if at > now => {
                let back = now.saturating_sub(aged_after.saturating_mul(2));
                ((back, String::new()), true)
            }
            Some(cursor) => (cursor, false),
            None => ((i64::MIN, String::new()), false),
        }
    }

    /// How many more of `endpoint`'s deliveries may be handed out.
    pub fn room_of(&self, endpoint: &str) -> u32 {
        self.room.get(endpoint).copied().unwrap_or(self.limit)
    }
}

impl AlertOutcome {
    /// The delivery's `next_at`, `done_at`, `outcome` and `last_error` once
    /// settled so at `now`.
    pub fn columns(&self, now: i64) -> (i64, Option<i64>, Option<&'static str>, Option<&str>) {
        match self {
            AlertOutcome::Delivered => (now, Some(now), Some("delivered"), None),
            AlertOutcome::Retry { next_at, error } => (*next_at, None, None, Some(error)),
            AlertOutcome::GaveUp { error } => (now, Some(now), Some("gave-up"), Some(error)),
        }
    }
}

/// What [`Outbox::take_alerts`](crate::Outbox::take_alerts) does in one
/// transaction.
#[derive(Debug, Clone)]
pub struct AlertPoll {
    /// The polling gateway's: what it delivers to.
    pub subscriptions: Vec<AlertSubscription>,
    /// Whether to look for operations newly past an `unknown-aged`
    /// threshold (those that crossed it since the last pass, at most a
    /// thousand per threshold).
    pub aging: bool,
    /// ms: now, for aging and what is due.
    pub now: i64,
    /// Taken deliveries are not due again before this (ms), unless settled.
    pub lease_until: i64,
    /// Deliveries taken, at most.
    pub limit: u32,
    /// How many more of its deliveries each endpoint may be handed (its
    /// posts in flight, subtracted from the most one endpoint may have),
    /// so a hung webhook cannot take the room the others need. An
    /// endpoint not named here may be handed up to `limit`.
    pub room: BTreeMap<String, u32>,
    /// Alerts older than this (ms), with every delivery done, are dropped.
    pub forget_before: i64,
    /// How many alerts a poll looks at to drop finished ones: the next
    /// after the store's [`ForgetCursor`].
    pub forget_window: u32,
}

/// Where a store's dropping of finished alerts stands. Each poll looks at
/// the [`AlertPoll::forget_window`] alerts after it, oldest first, and the
/// cursor moves past them, back to the first past the last: a poll's cost
/// does not grow with the alerts kept (those of operations still held,
/// or not yet delivered), which a poll that looked for finished alerts
/// among all of them paid (~70 ms of SQLite's writer every poll with
/// 30,000 held operations reported aged). In memory: a restart starts
/// from the first alert.
#[derive(Debug, Default)]
pub struct ForgetCursor(AtomicI64);

impl ForgetCursor {
    /// The last alert id looked at by the previous poll (0: none).
    pub fn after(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }

    /// A poll looked at `seen` alerts, the last of them `last`: the next
    /// starts past it, or from the first if that was the last.
    pub fn looked_at(&self, last: Option<i64>, seen: i64, window: u32) {
        let next = match last {
            Some(last) if seen >= i64::from(window) => last,
            _ => 0,
        };
        self.0.store(next, Ordering::Relaxed);
    }
}
