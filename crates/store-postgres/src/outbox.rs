//! The alert outbox on PostgreSQL: what [`Outbox::take_alerts`] and
//! [`Outbox::settle_alert`] run, each in one transaction. Replicas share the
//! outbox, and their `[[alerts]]` may differ (a rollout that adds a webhook
//! reaches them one at a time), so no replica's own list decides what an
//! alert reaches (docs/operating.md, "Alerts"):
//!
//! - each poll first records the replica's subscriptions in
//!   `alert_subscriptions` (`seen_at`: the poll's time), a statement of its
//!   own so that peers never wait on the poll's transaction;
//! - fanning out marks each alert once (its row lock decides) and gives it
//!   a delivery for every subscription recorded at most [`SUBSCRIBED_FOR`]
//!   before the alert was raised, whichever replica recorded it. An alert
//!   committed after a subscription was recorded is fanned out by a
//!   statement that sees the subscription, so an endpoint hears of
//!   everything raised once a replica that has it has polled, and nothing
//!   from before (a new webhook is not sent the history);
//! - a replica takes only the due deliveries of its own endpoints (with
//!   `FOR UPDATE SKIP LOCKED` and a lease, so one replica delivers each at
//!   a time): another replica may have the others, and a replica without
//!   `[[alerts]]` takes none; fresh alerts' deliveries go before aged
//!   ones' (`aged`, set at fan-out), each kind read from
//!   `alert_deliveries_due` as a range that ends now, so deliveries
//!   waiting out a backoff are never read;
//! - an endpoint no replica has recorded for [`SUBSCRIBED_FOR`] gets no
//!   new deliveries, and the ones it was left, which no replica takes, no
//!   longer keep their alert: it is dropped as finished alerts are.
//!
//! [`Outbox::take_alerts`]: idemgate_store::Outbox::take_alerts
//! [`Outbox::settle_alert`]: idemgate_store::Outbox::settle_alert

use sqlx::{PgPool, Postgres, Row, Transaction};

use idemgate_store::backend::{AGED_PER_PASS, ForgetCursor, aged_access_paths};
use idemgate_store::{AccessPath, Alert, AlertDelivery, AlertOutcome, AlertPoll, StoreError};

/// How long after a replica last polled with a subscription it still
/// counts (ms): alerts raised that long after still reach its endpoint.
/// Far longer than a poll (0.5 s) and than a replica's restart, so a
/// rollout costs no endpoint an alert; short, since an endpoint taken out
/// of every replica's config (or out of a subscription's events) is sent
/// what is raised until then.
const SUBSCRIBED_FOR: i64 = 5 * 60 * 1000;

/// Records subscriptions ($1 endpoint, $2 event, $3 threshold) as polled
/// with at $4, never moving `seen_at` back.
const SUBSCRIBE: &str =
    "INSERT INTO alert_subscriptions AS s (endpoint, event, aged_after, seen_at)
     SELECT endpoint, event, aged_after, $4
     FROM unnest($1::text[], $2::text[], $3::bigint[]) AS n(endpoint, event, aged_after)
     ON CONFLICT (endpoint, event, aged_after) DO UPDATE SET seen_at = excluded.seen_at
     WHERE s.seen_at < excluded.seen_at";

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

/// Sets threshold $1's cursor back to ($2, $3) ([`AlertPoll::aged_scan_from`]).
const AGED_SET_BACK: &str =
    "UPDATE alert_aged_scans SET updated_at = $2, id = $3 WHERE aged_after = $1";

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
    let cursor: Option<(i64, String)> = sqlx::query_as(AGED_CURSOR)
        .bind(aged_after)
        .fetch_optional(&mut *tx)
        .await?;
    let ((from, from_id), set_back) = AlertPoll::aged_scan_from(cursor, now, aged_after);
    if set_back {
        sqlx::query(AGED_SET_BACK)
            .bind(aged_after)
            .bind(from)
            .bind(&from_id)
            .execute(&mut *tx)
            .await?;
    }
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

/// Drops the finished alerts among the poll's window ([`ForgetCursor`]):
/// older than `forget_before`, fanned out, with no delivery left that an
/// endpoint recorded lately would take, and an `unknown-aged` one only
/// once its operation is no longer `unknown` (the row is what reports it
/// once).
async fn forget(
    tx: &mut Transaction<'_, Postgres>,
    poll: &AlertPoll,
    cursor: &ForgetCursor,
) -> Result<(), StoreError> {
    let after = cursor.after();
    let (last, seen): (Option<i64>, i64) = sqlx::query_as(
        "SELECT max(id), count(*) FROM (
            SELECT id FROM alert_outbox WHERE id > $1 ORDER BY id LIMIT $2) w",
    )
    .bind(after)
    .bind(i64::from(poll.forget_window))
    .fetch_one(&mut **tx)
    .await?;
    if let Some(last) = last {
        sqlx::query(
            "DELETE FROM alert_outbox WHERE id IN (
                SELECT o.id FROM alert_outbox o
                WHERE o.id > $1 AND o.id <= $2 AND o.at < $3 AND o.fanned_out
                  AND NOT EXISTS (SELECT 1 FROM alert_deliveries d
                                  JOIN alert_subscriptions s
                                    ON s.endpoint = d.endpoint AND s.seen_at >= $4
                                  WHERE d.alert_id = o.id AND d.done_at IS NULL)
                  AND (o.event <> 'unknown-aged' OR NOT EXISTS (
                        SELECT 1 FROM operations p
                        WHERE p.id = o.operation_id AND p.state = 'unknown'))
                FOR UPDATE SKIP LOCKED)",
        )
        .bind(after)
        .bind(last)
        .bind(poll.forget_before)
        .bind(poll.now - SUBSCRIBED_FOR)
        .execute(&mut **tx)
        .await?;
    }
    cursor.looked_at(last, seen, poll.forget_window);
    Ok(())
}

pub async fn take_alerts(
    pool: &PgPool,
    poll: &AlertPoll,
    forget_cursor: &ForgetCursor,
) -> Result<Vec<AlertDelivery>, StoreError> {
    // Sorted and distinct: two replicas lock the rows they share in one
    // order, and one statement updates a row once.
    let mut subscriptions: Vec<(&str, &str, i64)> = poll
        .subscriptions
        .iter()
        .map(|s| (s.endpoint.as_str(), s.event, s.aged_after))
        .collect();
    subscriptions.sort_unstable();
    subscriptions.dedup();
    let mut endpoints: Vec<&str> = subscriptions.iter().map(|s| s.0).collect();
    endpoints.dedup();
    if !subscriptions.is_empty() {
        sqlx::query(SUBSCRIBE)
            .bind(subscriptions.iter().map(|s| s.0).collect::<Vec<_>>())
            .bind(subscriptions.iter().map(|s| s.1).collect::<Vec<_>>())
            .bind(subscriptions.iter().map(|s| s.2).collect::<Vec<_>>())
            .bind(poll.now)
            .execute(pool)
            .await?;
    }
    let mut tx = pool.begin().await?;
    for aged_after in poll.aged_thresholds() {
        add_aged(&mut tx, poll.now, aged_after).await?;
    }
    sqlx::query(
        "WITH fresh AS (
            UPDATE alert_outbox SET fanned_out = true WHERE NOT fanned_out
            RETURNING id, event, at, aged_after
         )
         INSERT INTO alert_deliveries (alert_id, endpoint, next_at, aged)
         SELECT f.id, s.endpoint, $1, f.event = 'unknown-aged'
         FROM fresh f
         JOIN alert_subscriptions s
           ON f.event = s.event AND (f.event <> 'unknown-aged' OR f.aged_after = s.aged_after)
          AND s.seen_at >= f.at - $2
         ON CONFLICT DO NOTHING",
    )
    .bind(poll.now)
    .bind(SUBSCRIBED_FOR)
    .execute(&mut *tx)
    .await?;
    forget(&mut tx, poll, forget_cursor).await?;
    let rows = sqlx::query(
        "WITH rooms AS (
            SELECT * FROM unnest($4::text[], $5::bigint[]) AS r (endpoint, room)
         ), fresh AS (
            SELECT d.alert_id, d.endpoint, d.aged, d.next_at FROM rooms r
            CROSS JOIN LATERAL (
                SELECT alert_id, endpoint, aged, next_at FROM alert_deliveries
                WHERE done_at IS NULL AND endpoint = r.endpoint AND NOT aged AND next_at <= $1
                ORDER BY next_at LIMIT r.room
                FOR UPDATE SKIP LOCKED) d
         ), reminders AS (
            SELECT d.alert_id, d.endpoint, d.aged, d.next_at FROM rooms r
            CROSS JOIN LATERAL (
                SELECT alert_id, endpoint, aged, next_at FROM alert_deliveries
                WHERE done_at IS NULL AND endpoint = r.endpoint AND aged AND next_at <= $1
                ORDER BY next_at
                LIMIT greatest(r.room - (SELECT count(*) FROM fresh f WHERE f.endpoint = r.endpoint), 0)
                FOR UPDATE SKIP LOCKED) d
         ), due AS (
            SELECT * FROM fresh UNION ALL SELECT * FROM reminders
            ORDER BY aged, next_at LIMIT $3
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
    .bind(&endpoints)
    .bind(
        endpoints
            .iter()
            .map(|e| i64::from(poll.room_of(e)))
            .collect::<Vec<_>>(),
    )
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
