//! The alert outbox on PostgreSQL: what [`Store::take_alerts`] and
//! [`Store::settle_alert`] run, each in one transaction. Replicas share the
//! outbox: fanning out marks each alert once (its row lock decides), and
//! due deliveries are taken with `FOR UPDATE SKIP LOCKED` and a lease, so
//! one replica delivers each at a time (README "Alerts").
//!
//! [`Store::take_alerts`]: crate::store::Store::take_alerts
//! [`Store::settle_alert`]: crate::store::Store::settle_alert

use sqlx::{PgPool, Row};

use crate::store::{Alert, AlertDelivery, AlertOutcome, AlertPoll, StoreError};

/// Finished alerts dropped per poll, so one poll stays short.
const FORGET_PER_POLL: i64 = 500;

pub async fn take_alerts(
    pool: &PgPool,
    poll: &AlertPoll,
) -> Result<Vec<AlertDelivery>, StoreError> {
    let mut tx = pool.begin().await?;
    let thresholds = poll.aged_thresholds();
    sqlx::query(
        "INSERT INTO alert_outbox
            (event, at, route, operation_id, idem_key, state, evidence, aged_after)
         SELECT 'unknown-aged', $1, o.route, o.id, o.idem_key, o.state, o.evidence, t.aged_after
         FROM unnest($2::bigint[]) AS t(aged_after)
         JOIN operations o ON o.state = 'unknown' AND o.created_at <= $1 - t.aged_after
         ON CONFLICT DO NOTHING",
    )
    .bind(poll.now)
    .bind(&thresholds)
    .execute(&mut *tx)
    .await?;
    let subscriptions = &poll.subscriptions;
    sqlx::query(
        "WITH fresh AS (
            UPDATE alert_outbox SET fanned_out = true WHERE NOT fanned_out
            RETURNING id, event, aged_after
         )
         INSERT INTO alert_deliveries (alert_id, endpoint, next_at)
         SELECT f.id, s.endpoint, $4
         FROM fresh f
         JOIN unnest($1::text[], $2::text[], $3::bigint[]) AS s(endpoint, event, aged_after)
           ON f.event = s.event AND (f.event <> 'unknown-aged' OR f.aged_after = s.aged_after)
         ON CONFLICT DO NOTHING",
    )
    .bind(
        subscriptions
            .iter()
            .map(|s| s.endpoint.clone())
            .collect::<Vec<_>>(),
    )
    .bind(subscriptions.iter().map(|s| s.event).collect::<Vec<_>>())
    .bind(
        subscriptions
            .iter()
            .map(|s| s.aged_after)
            .collect::<Vec<_>>(),
    )
    .bind(poll.now)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "DELETE FROM alert_outbox WHERE id IN (
            SELECT o.id FROM alert_outbox o
            WHERE o.at < $1 AND o.fanned_out
              AND NOT EXISTS (SELECT 1 FROM alert_deliveries d
                              WHERE d.alert_id = o.id AND d.done_at IS NULL)
              AND (o.event <> 'unknown-aged' OR NOT EXISTS (
                    SELECT 1 FROM operations p WHERE p.id = o.operation_id AND p.state = 'unknown'))
            LIMIT $2 FOR UPDATE SKIP LOCKED)",
    )
    .bind(poll.forget_before)
    .bind(FORGET_PER_POLL)
    .execute(&mut *tx)
    .await?;
    let rows = sqlx::query(
        "WITH due AS (
            SELECT alert_id, endpoint FROM alert_deliveries
            WHERE done_at IS NULL AND next_at <= $1
            ORDER BY next_at LIMIT $3
            FOR UPDATE SKIP LOCKED
         ), taken AS (
            UPDATE alert_deliveries d SET next_at = $2
            FROM due WHERE d.alert_id = due.alert_id AND d.endpoint = due.endpoint
            RETURNING d.alert_id, d.endpoint, d.attempts
         )
         SELECT t.alert_id, t.endpoint, t.attempts, o.event, o.at, o.route, o.operation_id,
                o.idem_key, o.state, o.evidence
         FROM taken t JOIN alert_outbox o ON o.id = t.alert_id",
    )
    .bind(poll.now)
    .bind(poll.lease_until)
    .bind(i64::from(poll.limit))
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    rows.iter()
        .map(|row| {
            let attempts: i32 = row.try_get("attempts")?;
            Ok(AlertDelivery {
                alert_id: row.try_get("alert_id")?,
                endpoint: row.try_get("endpoint")?,
                attempts: u32::try_from(attempts).unwrap_or(0),
                alert: Alert {
                    event: row.try_get("event")?,
                    at: row.try_get("at")?,
                    route: row.try_get("route")?,
                    operation_id: row.try_get("operation_id")?,
                    key: row.try_get("idem_key")?,
                    state: row.try_get("state")?,
                    evidence: row.try_get("evidence")?,
                },
            })
        })
        .collect()
}

pub async fn settle_alert(
    pool: &PgPool,
    delivery: &AlertDelivery,
    outcome: &AlertOutcome,
    now: i64,
) -> Result<(), StoreError> {
    let (next_at, done_at, result, error) = outcome.columns(now);
    sqlx::query(
        "UPDATE alert_deliveries SET attempts = attempts + 1, next_at = $1, done_at = $2,
            outcome = $3, last_error = $4
         WHERE alert_id = $5 AND endpoint = $6 AND done_at IS NULL",
    )
    .bind(next_at)
    .bind(done_at)
    .bind(result)
    .bind(error)
    .bind(delivery.alert_id)
    .bind(&delivery.endpoint)
    .execute(pool)
    .await?;
    Ok(())
}
