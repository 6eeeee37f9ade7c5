//! The alert outbox on PostgreSQL: what [`Outbox::take_alerts`] and
//! [`Outbox::settle_alert`] run, each in one transaction. Replicas share the
//! outbox: fanning out marks each alert once (its row lock decides), and
//! due deliveries are taken with `FOR UPDATE SKIP LOCKED` and a lease, so
//! one replica delivers each at a time (docs/operating.md, "Alerts").
//!
//! [`Outbox::take_alerts`]: idemgate_store::Outbox::take_alerts
//! [`Outbox::settle_alert`]: idemgate_store::Outbox::settle_alert

use sqlx::{PgPool, Row};

use idemgate_store::backend::{AGED_PER_PASS, aged_access_paths};
use idemgate_store::{AccessPath, Alert, AlertDelivery, AlertOutcome, AlertPoll, StoreError};

/// Finished alerts dropped per poll, so one poll stays short.
const FORGET_PER_POLL: i64 = 500;

/// The `unknown` operations of the next aging window, in
/// `operations_state_updated`: after the cursor ($1 updated_at, $2 id) and
/// `unknown` since $3 at the latest. An operation's `updated_at` is when
/// it became `unknown`, since nothing else changes it while it is.
macro_rules! aged_window {
    () => {
        "FROM operations
         WHERE state = 'unknown' AND updated_at >= $1 AND (updated_at, id) > ($1, $2::text)
           AND updated_at <= $3"
    };
}

/// Where a threshold's ($1) scan stands.
const AGED_CURSOR: &str = "SELECT updated_at, id FROM alert_aged_scans WHERE aged_after = $1";

/// The last operation of the next pass (the $4th after the first), if the
/// window holds more than a pass.
const AGED_END: &str = concat!(
    "SELECT updated_at, id ",
    aged_window!(),
    " ORDER BY updated_at, id LIMIT 1 OFFSET $4"
);

/// An `unknown-aged` alert at $6 for threshold $7 for each operation of the
/// window up to the pass's end ($4 updated_at, $5 id); once per operation
/// and threshold (`alert_outbox_aged`).
const AGED_INSERT: &str = concat!(
    "INSERT INTO alert_outbox (event, at, route, operation_id, idem_key, state, evidence,
        aged_after)
     SELECT 'unknown-aged', $6, route, id, idem_key, state, evidence, $7 ",
    aged_window!(),
    " AND (updated_at, id) <= ($4, $5::text) ORDER BY updated_at ON CONFLICT DO NOTHING"
);

/// Moves threshold $1's cursor to ($2, $3), never back: replicas may pass
/// over one window at once (each alert is still added once).
const AGED_ADVANCE: &str = "INSERT INTO alert_aged_scans AS s (aged_after, updated_at, id)
     VALUES ($1, $2, $3)
     ON CONFLICT (aged_after) DO UPDATE SET updated_at = excluded.updated_at, id = excluded.id
     WHERE (excluded.updated_at, excluded.id) > (s.updated_at, s.id)";

/// One aging pass for threshold `aged_after`: the operations that became
/// `unknown` at `now - aged_after` at the latest and after the threshold's
/// cursor, up to [`AGED_PER_PASS`] of them, each reported once; then the
/// cursor moves past them. A pass reads only what crossed the threshold
/// since the last (and a backlog a pass at a time), never every `unknown`
/// operation. Replicas' clocks must agree to well within `aged_after`.
async fn add_aged(
    tx: &mut sqlx::PgConnection,
    now: i64,
    aged_after: i64,
) -> Result<(), StoreError> {
    let latest = now - aged_after;
    let (from, from_id): (i64, String) = sqlx::query_as(AGED_CURSOR)
        .bind(aged_after)
        .fetch_optional(&mut *tx)
        .await?
        .unwrap_or((i64::MIN, String::new()));
    // `(latest + 1, "")` is past every operation at `latest`: every id is
    // longer than "".
    let (to, to_id): (i64, String) = sqlx::query_as(AGED_END)
        .bind(from)
        .bind(&from_id)
        .bind(latest)
        .bind(AGED_PER_PASS - 1)
        .fetch_optional(&mut *tx)
        .await?
        .unwrap_or((latest + 1, String::new()));
    sqlx::query(AGED_INSERT)
        .bind(from)
        .bind(&from_id)
        .bind(latest)
        .bind(to)
        .bind(&to_id)
        .bind(now)
        .bind(aged_after)
        .execute(&mut *tx)
        .await?;
    sqlx::query(AGED_ADVANCE)
        .bind(aged_after)
        .bind(to)
        .bind(&to_id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// The aging pass's reads of `operations` ([`AccessPath`]).
pub(crate) fn access_paths() -> Vec<AccessPath> {
    aged_access_paths(AGED_END, AGED_INSERT, "updated_at >= ")
}

pub async fn take_alerts(
    pool: &PgPool,
    poll: &AlertPoll,
) -> Result<Vec<AlertDelivery>, StoreError> {
    let mut tx = pool.begin().await?;
    for aged_after in poll.aged_thresholds() {
        add_aged(&mut tx, poll.now, aged_after).await?;
    }
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
