//! What this replica knows of the PostgreSQL server it writes to
//! (docs/replicas.md, "Failover"): whether it is in recovery (a standby),
//! and how many synchronous standbys stream from it. Read with every lease
//! renewal, on the lease's own connection, so the request path pays
//! nothing for it.
//!
//! Invariant: with `store.require_synchronous_standby`, [`Replication::refusal`]
//! refuses every claim unless the latest reading, taken no longer than
//! [`FRESH_FOR`] leases ago, saw the server out of recovery, with
//! `synchronous_standby_names` set and at least one synchronous standby
//! streaming: a commit on it then waits for a standby that a promotion can
//! turn into the next primary without losing it. A server in recovery
//! refuses claims whatever the setting (it also refuses every write).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::postgres::PgPool;

use idemgate_store::{ReplicationState, StoreError};

/// This module's log target (`idemgate_store`'s crate docs, "Log targets").
const TARGET: &str = "idemgate::store::postgres::replication";

/// A reading older than this many leases is none: the renewals that take
/// them have been failing, and the fence stops claims anyway.
const FRESH_FOR: u32 = 1;

/// The latest reading and what it allows; shared by the store and its
/// lease renewal.
pub(crate) struct Replication {
    required: bool,
    lease: Duration,
    latest: Mutex<Option<(Instant, ReplicationState)>>,
}

impl Replication {
    pub fn new(required: bool, lease: Duration) -> Self {
        Replication {
            required,
            lease,
            latest: Mutex::new(None),
        }
    }

    /// Reads the server's replication through `pool` and keeps it.
    pub async fn read(&self, pool: &PgPool) -> Result<(), StoreError> {
        let (in_recovery, names, standbys): (bool, String, i64) = sqlx::query_as(
            "SELECT pg_is_in_recovery(), current_setting('synchronous_standby_names'),
                (SELECT count(*) FROM pg_stat_replication
                 WHERE state = 'streaming' AND sync_state IN ('sync', 'quorum'))",
        )
        .fetch_one(pool)
        .await?;
        let state = ReplicationState {
            in_recovery,
            synchronous_standby_names: names,
            synchronous_standbys: u32::try_from(standbys).unwrap_or(u32::MAX),
            required: self.required,
        };
        if let Some(reason) = refusal_of(Some(&state), self.required) {
            let before = self.state();
            if before.is_none_or(|before| refusal_of(Some(&before), self.required).is_none()) {
                tracing::warn!(target: TARGET, %reason, "writes are refused");
            }
        }
        *self.slot() = Some((Instant::now(), state));
        Ok(())
    }

    /// The latest reading, if it is fresh.
    pub fn state(&self) -> Option<ReplicationState> {
        let latest = self.slot();
        latest
            .as_ref()
            .filter(|(at, _)| at.elapsed() <= self.lease * FRESH_FOR)
            .map(|(_, state)| state.clone())
    }

    /// Why a claim must be refused now, if it must.
    pub fn refusal(&self) -> Option<String> {
        refusal_of(self.state().as_ref(), self.required)
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<(Instant, ReplicationState)>> {
        self.latest
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The rule of the module doc, for a reading (`None`: no fresh one).
fn refusal_of(state: Option<&ReplicationState>, required: bool) -> Option<String> {
    match state {
        Some(state) if state.in_recovery => Some(
            "the store's server is in recovery (a standby): no write can commit there".into(),
        ),
        None if required => Some(
            "the store's replication has not been read lately (store.require_synchronous_standby)"
                .into(),
        ),
        Some(state) if required && state.synchronous_standby_names.is_empty() => Some(
            "the store's server has no synchronous_standby_names (store.require_synchronous_standby)"
                .into(),
        ),
        Some(state) if required && state.synchronous_standbys == 0 => Some(
            "no synchronous standby is streaming from the store's server (store.require_synchronous_standby)"
                .into(),
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(in_recovery: bool, names: &str, standbys: u32) -> ReplicationState {
        ReplicationState {
            in_recovery,
            synchronous_standby_names: names.into(),
            synchronous_standbys: standbys,
            required: true,
        }
    }

    #[test]
    fn writes_need_a_primary_and_when_required_a_streaming_synchronous_standby() {
        let safe = state(false, "standby1", 1);
        assert_eq!(refusal_of(Some(&safe), true), None);
        assert_eq!(refusal_of(Some(&state(false, "", 0)), false), None);
        assert_eq!(
            refusal_of(None, false),
            None,
            "not required: no reading needed"
        );
        for (reading, says) in [
            (Some(state(true, "standby1", 1)), "in recovery"),
            (None, "not been read"),
            (Some(state(false, "", 1)), "no synchronous_standby_names"),
            (
                Some(state(false, "standby1", 0)),
                "no synchronous standby is streaming",
            ),
        ] {
            let reason = refusal_of(reading.as_ref(), true).expect("refused");
            assert!(reason.contains(says), "{reason}");
        }
        let standby = refusal_of(Some(&state(true, "", 0)), false).expect("refused");
        assert!(standby.contains("in recovery"), "{standby}");
    }

    #[test]
    fn an_old_reading_is_none() {
        let replication = Replication::new(true, Duration::from_millis(1));
        *replication.slot() = Some((
            Instant::now() - Duration::from_millis(50),
            state(false, "s", 1),
        ));
        assert_eq!(replication.state(), None);
        assert!(replication.refusal().is_some());
    }
}
