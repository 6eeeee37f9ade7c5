//! The alert outbox on SQLite: what [`Outbox::take_alerts`] and
//! [`Outbox::settle_alert`] run on the writer's connection, each inside the
//! writer's batch transaction (docs/operating.md, "Alerts").
//!
//! [`Outbox::take_alerts`]: idemgate_store::Outbox::take_alerts
//! [`Outbox::settle_alert`]: idemgate_store::Outbox::settle_alert

use rusqlite::{Connection, OptionalExtension, params};

use idemgate_store::backend::{AGED_PER_PASS, ForgetCursor, aged_access_paths};
use idemgate_store::{
    AccessPath, Alert, AlertDelivery, AlertOutcome, AlertPoll, AlertSubscription, Param, StoreError,
};

/// The last of the (up to ?2) alerts after id ?1, and how many there are.
const FORGET_WINDOW: &str = "SELECT max(id), count(*) FROM (
     SELECT id FROM alert_outbox WHERE id > ?1 ORDER BY id LIMIT ?2)";

/// Drops the finished alerts with ids in (?1, ?2]: older than ?3, fanned
/// out, every delivery done, and an `unknown-aged` one only once its
/// operation is no longer `unknown` (the row is what reports it once).
const FORGET: &str = "DELETE FROM alert_outbox
     WHERE id > ?1 AND id <= ?2 AND at < ?3 AND fanned_out = 1
       AND NOT EXISTS (SELECT 1 FROM alert_deliveries d
                       WHERE d.alert_id = alert_outbox.id AND d.done_at IS NULL)
       AND (event <> 'unknown-aged' OR NOT EXISTS (
             SELECT 1 FROM operations p
             WHERE p.id = alert_outbox.operation_id AND p.state = 'unknown'))";

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

pub fn take_alerts(
    conn: &Connection,
    poll: &AlertPoll,
    forget_cursor: &ForgetCursor,
) -> Result<Vec<AlertDelivery>, StoreError> {
    for aged_after in poll.aged_thresholds() {
        add_aged(conn, poll.now, aged_after)?;
    }
    conn.prepare_cached(
        "INSERT INTO alert_deliveries (alert_id, endpoint, next_at, aged)
         SELECT o.id, s.value ->> '$.endpoint', ?2, o.event = 'unknown-aged'
         FROM alert_outbox o JOIN json_each(?1) s
           ON o.event = s.value ->> '$.event'
          AND (o.event <> 'unknown-aged' OR o.aged_after = s.value ->> '$.aged_after')
         WHERE o.fanned_out = 0
         ON CONFLICT DO NOTHING",
    )?
    .execute(params![subscriptions_json(&poll.subscriptions), poll.now])?;
    conn.prepare_cached("UPDATE alert_outbox SET fanned_out = 1 WHERE fanned_out = 0")?
        .execute([])?;
    forget(conn, poll, forget_cursor)?;
    let taken = take_due(conn, poll)?;
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

/// Drops the finished alerts among the poll's window ([`ForgetCursor`]).
fn forget(conn: &Connection, poll: &AlertPoll, cursor: &ForgetCursor) -> Result<(), StoreError> {
    let after = cursor.after();
    let (last, seen): (Option<i64>, i64) = conn
        .prepare_cached(FORGET_WINDOW)?
        .query_row(params![after, poll.forget_window], |row| {
            Ok((row.get(0)?, row.get(1)?))
        })?;
    if let Some(last) = last {
        conn.prepare_cached(FORGET)?
            .execute(params![after, last, poll.forget_before])?;
    }
    cursor.looked_at(last, seen, poll.forget_window);
    Ok(())
}

/// The endpoint after ?1 with deliveries not done (`alert_deliveries_due`).
const NEXT_ENDPOINT: &str = "SELECT endpoint FROM alert_deliveries
     WHERE done_at IS NULL AND endpoint > ?1 ORDER BY endpoint LIMIT 1";

/// Endpoint ?1's deliveries of one kind (?4: `aged`) due at ?2, the
/// earliest first, up to ?3 of them: a range of `alert_deliveries_due`
/// that ends at ?2, so the deliveries waiting out a backoff are never read.
const DUE_OF_ENDPOINT: &str = "SELECT rowid, aged, next_at FROM alert_deliveries
     WHERE done_at IS NULL AND endpoint = ?1 AND aged = ?4 AND next_at <= ?2
     ORDER BY next_at, rowid LIMIT ?3";

/// Leases delivery ?1 until ?2.
const LEASE: &str = "UPDATE alert_deliveries SET next_at = ?2 WHERE rowid = ?1
     RETURNING alert_id, endpoint, attempts";

/// Takes up to `poll.limit` deliveries due, each endpoint's up to its
/// room, fresh alerts' before aged ones' and each kind the earliest first,
/// and leases them. Each endpoint's are read from the index a kind at a
/// time, from the earliest to now and no further than its room, so a poll
/// costs the same over a backlog of any size, due or backing off (a
/// window numbering every due delivery took ~100 ms of the writer's time
/// a poll over 30,000 of them).
fn take_due(conn: &Connection, poll: &AlertPoll) -> Result<Vec<(i64, String, u32)>, StoreError> {
    let mut due: Vec<(bool, i64, i64)> = Vec::new();
    let mut endpoint = String::new();
    while let Some(next) = conn
        .prepare_cached(NEXT_ENDPOINT)?
        .query_row(params![endpoint], |row| row.get::<_, String>(0))
        .optional()?
    {
        endpoint = next;
        let mut room = poll.room_of(&endpoint).min(poll.limit);
        let mut of_endpoint = conn.prepare_cached(DUE_OF_ENDPOINT)?;
        for aged in [false, true] {
            let rows = of_endpoint.query_map(params![endpoint, poll.now, room, aged], |row| {
                Ok((row.get(1)?, row.get(2)?, row.get(0)?))
            })?;
            for row in rows {
                due.push(row?);
                room -= 1;
            }
        }
    }
    due.sort_unstable();
    due.truncate(poll.limit as usize);
    let mut lease = conn.prepare_cached(LEASE)?;
    due.iter()
        .map(|&(_, _, rowid)| {
            lease.query_row(params![rowid, poll.lease_until], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?))
            })
        })
        .collect::<Result<_, _>>()
        .map_err(StoreError::from)
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

/// The aging pass's reads of `operations`, and the take's of
/// `alert_deliveries`, bounded by now ([`AccessPath`]).
pub(crate) fn access_paths() -> Vec<AccessPath> {
    let mut paths = aged_access_paths(AGED_END, AGED_INSERT, "updated_at>");
    paths.push(AccessPath {
        name: "alert deliveries due, of one endpoint and kind".into(),
        sql: DUE_OF_ENDPOINT.into(),
        index: "alert_deliveries_due",
        bound: Some("next_at<"),
        params: vec![
            Param::text("a"),
            Param::Int(1_000),
            Param::Int(32),
            Param::Int(1),
        ],
    });
    paths
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
