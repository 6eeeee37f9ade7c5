//! The alert outbox on SQLite: what [`Outbox::take_alerts`] and
//! [`Outbox::settle_alert`] run on the writer's connection, each inside the
//! writer's batch transaction (docs/operating.md, "Alerts").
//!
//! [`Outbox::take_alerts`]: idemgate_store::Outbox::take_alerts
//! [`Outbox::settle_alert`]: idemgate_store::Outbox::settle_alert

use rusqlite::{Connection, OptionalExtension, params};

use idemgate_store::backend::{AGED_PER_PASS, aged_access_paths};
use idemgate_store::{
    AccessPath, Alert, AlertDelivery, AlertOutcome, AlertPoll, AlertSubscription, StoreError,
};

/// Finished alerts dropped per poll, so one poll stays short.
const FORGET_PER_POLL: u32 = 500;

/// The `unknown` operations of the next aging window, in
/// `operations_state_updated`: after the cursor (?1 updated_at, ?2 id) and
/// `unknown` since ?3 at the latest. An operation's `updated_at` is when
/// it became `unknown`, since nothing else changes it while it is.
macro_rules! aged_window {
    () => {
        concat!(
            "FROM operations
         WHERE state = 'unknown' AND ",
            not_in_progress!(),
            " AND updated_at >= ?1 AND (updated_at, id) > (?1, ?2)
           AND updated_at <= ?3"
        )
    };
}

/// Where a threshold's (?1) scan stands.
const AGED_CURSOR: &str = "SELECT updated_at, id FROM alert_aged_scans WHERE aged_after = ?1";

/// The last operation of the next pass (the ?4th after the first), if the
/// window holds more than a pass.
const AGED_END: &str = concat!(
    "SELECT updated_at, id ",
    aged_window!(),
    " ORDER BY updated_at, id LIMIT 1 OFFSET ?4"
);

/// An `unknown-aged` alert at ?6 for threshold ?7 for each operation of the
/// window up to the pass's end (?4 updated_at, ?5 id); once per operation
/// and threshold (`alert_outbox_aged`).
const AGED_INSERT: &str = concat!(
    "INSERT INTO alert_outbox (event, at, route, operation_id, idem_key, state, evidence,
        aged_after)
     SELECT 'unknown-aged', ?6, route, id, idem_key, state, evidence, ?7 ",
    aged_window!(),
    " AND (updated_at, id) <= (?4, ?5) ON CONFLICT DO NOTHING"
);

/// Sets threshold ?1's cursor back to (?2, ?3) ([`AlertPoll::aged_scan_from`]).
const AGED_SET_BACK: &str =
    "UPDATE alert_aged_scans SET updated_at = ?2, id = ?3 WHERE aged_after = ?1";

/// Moves threshold ?1's cursor to (?2, ?3), never back.
const AGED_ADVANCE: &str = "INSERT INTO alert_aged_scans (aged_after, updated_at, id)
     VALUES (?1, ?2, ?3)
     ON CONFLICT (aged_after) DO UPDATE SET updated_at = excluded.updated_at, id = excluded.id
     WHERE (excluded.updated_at, excluded.id)
         > (alert_aged_scans.updated_at, alert_aged_scans.id)";

pub fn take_alerts(conn: &Connection, poll: &AlertPoll) -> Result<Vec<AlertDelivery>, StoreError> {
    for aged_after in poll.aged_thresholds() {
        add_aged(conn, poll.now, aged_after)?;
    }
    conn.prepare_cached(
        "INSERT INTO alert_deliveries (alert_id, endpoint, next_at)
         SELECT o.id, s.value ->> '$.endpoint', ?2
         FROM alert_outbox o JOIN json_each(?1) s
           ON o.event = s.value ->> '$.event'
          AND (o.event <> 'unknown-aged' OR o.aged_after = s.value ->> '$.aged_after')
         WHERE o.fanned_out = 0
         ON CONFLICT DO NOTHING",
    )?
    .execute(params![subscriptions_json(&poll.subscriptions), poll.now])?;
    conn.prepare_cached("UPDATE alert_outbox SET fanned_out = 1 WHERE fanned_out = 0")?
        .execute([])?;
    conn.prepare_cached(
        "DELETE FROM alert_outbox WHERE id IN (
            SELECT o.id FROM alert_outbox o
            WHERE o.at < ?1 AND o.fanned_out = 1
              AND NOT EXISTS (SELECT 1 FROM alert_deliveries d
                              WHERE d.alert_id = o.id AND d.done_at IS NULL)
              AND (o.event <> 'unknown-aged' OR NOT EXISTS (
                    SELECT 1 FROM operations p WHERE p.id = o.operation_id AND p.state = 'unknown'))
            LIMIT ?2)",
    )?
    .execute(params![poll.forget_before, FORGET_PER_POLL])?;
    let taken: Vec<(i64, String, u32)> = conn
        .prepare_cached(
            "UPDATE alert_deliveries SET next_at = ?2
             WHERE rowid IN (
                SELECT rowid FROM (
                    SELECT d.rowid, d.next_at,
                        row_number() OVER (PARTITION BY d.endpoint ORDER BY d.next_at, d.rowid)
                            AS nth,
                        coalesce(r.value, ?3) AS room
                    FROM alert_deliveries d LEFT JOIN json_each(?4) r ON r.key = d.endpoint
                    WHERE d.done_at IS NULL AND d.next_at <= ?1)
                WHERE nth <= room
                ORDER BY next_at LIMIT ?3)
             RETURNING alert_id, endpoint, attempts",
        )?
        .query_map(
            params![poll.now, poll.lease_until, poll.limit, room_json(poll)],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )?
        .collect::<Result<_, _>>()?;
    let mut deliveries = Vec::with_capacity(taken.len());
    for (alert_id, endpoint, attempts) in taken {
        if let Some(alert) = alert(conn, alert_id)? {
            deliveries.push(AlertDelivery {
                alert_id,
                endpoint,
                attempts,
                alert,
            });
        }
    }
    Ok(deliveries)
}

/// `poll`'s room per endpoint as the JSON object `take_alerts` reads.
fn room_json(poll: &AlertPoll) -> String {
    let room = poll
        .room
        .iter()
        .map(|(endpoint, room)| (endpoint.clone(), (*room).into()));
    serde_json::Value::Object(room.collect()).to_string()
}

/// One aging pass for threshold `aged_after`: the operations that became
/// `unknown` at `now - aged_after` at the latest and after the threshold's
/// cursor, up to [`AGED_PER_PASS`] of them, each reported once; then the
/// cursor moves past them. A pass reads only what crossed the threshold
/// since the last (and a backlog a pass at a time), never every `unknown`
/// operation.
fn add_aged(conn: &Connection, now: i64, aged_after: i64) -> Result<(), StoreError> {
    let latest = now - aged_after;
    let pair = |row: &rusqlite::Row| Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?));
    let cursor = conn
        .prepare_cached(AGED_CURSOR)?
        .query_row(params![aged_after], pair)
        .optional()?;
    let ((from, from_id), set_back) = AlertPoll::aged_scan_from(cursor, now, aged_after);
    if set_back {
        conn.prepare_cached(AGED_SET_BACK)?
            .execute(params![aged_after, from, from_id])?;
    }
    // `(latest + 1, "")` is past every operation at `latest`: every id is
    // longer than "".
    let (to, to_id) = conn
        .prepare_cached(AGED_END)?
        .query_row(params![from, from_id, latest, AGED_PER_PASS - 1], pair)
        .optional()?
        .unwrap_or((latest + 1, String::new()));
    conn.prepare_cached(AGED_INSERT)?
        .execute(params![from, from_id, latest, to, to_id, now, aged_after])?;
    conn.prepare_cached(AGED_ADVANCE)?
        .execute(params![aged_after, to, to_id])?;
    Ok(())
}

/// The aging pass's reads of `operations` ([`AccessPath`]).
pub(crate) fn access_paths() -> Vec<AccessPath> {
    aged_access_paths(AGED_END, AGED_INSERT, "updated_at>")
}

fn alert(conn: &Connection, id: i64) -> Result<Option<Alert>, StoreError> {
    Ok(conn
        .prepare_cached(
            "SELECT event, at, route, operation_id, idem_key, state, evidence
             FROM alert_outbox WHERE id = ?1",
        )?
        .query_row(params![id], |row| {
            Ok(Alert {
                event: row.get(0)?,
                at: row.get(1)?,
                route: row.get(2)?,
                operation_id: row.get(3)?,
                key: row.get(4)?,
                state: row.get(5)?,
                evidence: row.get(6)?,
            })
        })
        .optional()?)
}

pub fn settle_alert(
    conn: &Connection,
    delivery: &AlertDelivery,
    outcome: &AlertOutcome,
    now: i64,
) -> Result<(), StoreError> {
    let (next_at, done_at, result, error) = outcome.columns(now);
    conn.prepare_cached(
        "UPDATE alert_deliveries SET attempts = attempts + 1, next_at = ?1, done_at = ?2,
            outcome = ?3, last_error = ?4
         WHERE alert_id = ?5 AND endpoint = ?6 AND done_at IS NULL",
    )?
    .execute(params![
        next_at,
        done_at,
        result,
        error,
        delivery.alert_id,
        delivery.endpoint
    ])?;
    Ok(())
}

/// The subscriptions as a JSON array, for `json_each`.
fn subscriptions_json(subscriptions: &[AlertSubscription]) -> String {
    serde_json::Value::Array(
        subscriptions
            .iter()
            .map(|s| {
                serde_json::json!({
                    "endpoint": s.endpoint, "event": s.event, "aged_after": s.aged_after
                })
            })
            .collect(),
    )
    .to_string()
}
