//! The alert outbox on SQLite: what [`Store::take_alerts`] and
//! [`Store::settle_alert`] run on the writer's connection, each inside the
//! writer's batch transaction (README "Alerts").
//!
//! [`Store::take_alerts`]: crate::store::Store::take_alerts
//! [`Store::settle_alert`]: crate::store::Store::settle_alert

use rusqlite::{Connection, OptionalExtension, params};

use crate::store::{Alert, AlertDelivery, AlertOutcome, AlertPoll, AlertSubscription, StoreError};

/// Finished alerts dropped per poll, so one poll stays short.
const FORGET_PER_POLL: u32 = 500;

pub fn take_alerts(conn: &Connection, poll: &AlertPoll) -> Result<Vec<AlertDelivery>, StoreError> {
    let thresholds = poll.aged_thresholds();
    for aged_after in thresholds {
        conn.prepare_cached(
            "INSERT INTO alert_outbox
                (event, at, route, operation_id, idem_key, state, evidence, aged_after)
             SELECT 'unknown-aged', ?1, route, id, idem_key, state, evidence, ?2
             FROM operations WHERE state = 'unknown' AND created_at <= ?1 - ?2
             ON CONFLICT DO NOTHING",
        )?
        .execute(params![poll.now, aged_after])?;
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
             WHERE rowid IN (SELECT rowid FROM alert_deliveries
                             WHERE done_at IS NULL AND next_at <= ?1
                             ORDER BY next_at LIMIT ?3)
             RETURNING alert_id, endpoint, attempts",
        )?
        .query_map(params![poll.now, poll.lease_until, poll.limit], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
        })?
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
