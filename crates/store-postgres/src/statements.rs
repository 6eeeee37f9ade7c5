//! The SQL of the PostgreSQL store, one function per store call. Queries
//! are checked at run time (no database at build time); sqlx prepares each
//! once per connection and reuses it.
//!
//! Every state change is a compare-and-set on (id, state, attempt, owner),
//! written as one statement (data-modifying CTEs), so it needs no
//! transaction of its own and costs one round trip.
//!
//! Longer than the house's ~800 lines on purpose: it is all of this
//! backend's SQL in one room, one function per store call, so the dialect
//! is read (and compared with `sqlite/statements.rs`, the same calls in the
//! other dialect) in one place; splitting it by caller would scatter the
//! statements that must change together when the schema does.

use std::borrow::Cow;
use std::sync::Arc;

use sqlx::Row;
use sqlx::postgres::{PgPool, PgRow};

use idemgate_model::operation::{Event, Fingerprint, Operation, RequestSummary, Settlement, State};
use idemgate_store::backend::{
    COUNTS_EXACT, COUNTS_ROW, ROUTE_SETTINGS_ROW, SUMMARY_COLUMNS, is_implied_by_record, new_id,
    operation_count,
};
use idemgate_store::scope_key::{self, ScopeKey};
use idemgate_store::seal::{Identity, Payloads, Seal, StoredForm};
use idemgate_store::{
    AccessPath, Claim, ClaimResult, DUPLICATED, Decision, Finding, LateEvidence, ListFilter,
    ListPath, NewOperation, Param, PausedBy, Probed, Recorded, RekeyBatch, Resolved, RoutePause,
    SWEEP_LIMIT, Stats, StoreError, StoredEvent, Summary, timeline,
};

/// The columns [`operation_from_row`] reads.
const OPERATION_COLUMNS: &str = "id, route, idem_key, state, attempt, created_at, updated_at,
    owner, fingerprint, evidence, response_status, response_headers, response_body, request_method,
    request_path, request_content_type, request_body_size, request_body_sha256, request_body,
    superseded_at";

/// An owner is alive while its lease, in the database's clock, runs.
const OWNER_ALIVE: &str = "EXISTS (SELECT 1 FROM replicas r
    WHERE r.id = operations.owner AND r.lease_until > clock_timestamp())";

/// A claim waiting for its batch: the write, and when it came (the
/// gateway's clock).
pub(crate) struct ClaimCall {
    pub(crate) now: i64,
    pub(crate) new: Arc<NewOperation>,
}

/// Claims each of `calls` for `owner` in one statement, through the
/// `idemgate_claim_unless_twin` function of the migrations (atomic on the
/// unique identity; the rotated-key guard's look-up in the same
/// statement), one row per call. The rows go in (route, scope, key) order,
/// so replicas whose batches overlap take their row locks in one order and
/// never deadlock; the results come back in the calls' order. An
/// operation whose sealed payload does not open fails its own call only.
pub async fn claim(
    pool: &PgPool,
    seal: &Seal,
    owner: &str,
    calls: &[ClaimCall],
) -> Result<Vec<Result<ClaimResult, StoreError>>, StoreError> {
    let mut order: Vec<usize> = (0..calls.len()).collect();
    order.sort_by_key(|&i| {
        let new = &calls[i].new;
        (&new.route, &new.scope, &new.key)
    });
    let column = |f: &dyn Fn(&ClaimCall) -> String| -> Vec<String> {
        order.iter().map(|&i| f(&calls[i])).collect()
    };
    let ords: Vec<i32> = order.iter().map(|&i| int(i)).collect();
    let nows: Vec<i64> = order.iter().map(|&i| calls[i].now).collect();
    let fresh_after: Vec<Option<i64>> = order.iter().map(|&i| calls[i].new.fresh_after).collect();
    let refuse_twin: Vec<bool> = order
        .iter()
        .map(|&i| calls[i].new.refuse_held_twin)
        .collect();
    let content_types: Vec<Option<String>> = order
        .iter()
        .map(|&i| calls[i].new.request.content_type.clone())
        .collect();
    let body_sizes: Vec<i64> = order
        .iter()
        .map(|&i| i64::try_from(calls[i].new.request.body_size).unwrap_or(i64::MAX))
        .collect();
    let ids = column(&|_| new_id());
    let bodies: Vec<Option<Vec<u8>>> = order
        .iter()
        .zip(&ids)
        .map(|(&i, id)| {
            let new = &calls[i].new;
            (seal.request_body(id, &new.identity(), new.request.body.as_deref()))
                .map(Cow::into_owned)
        })
        .collect();
    let rows = sqlx::query(
        "SELECT n.ord, c.*
         FROM unnest($2::int[], $3::bigint[], $4::bigint[], $5::text[], $6::text[], $7::text[],
                     $8::text[], $9::text[], $10::text[], $11::text[], $12::text[], $13::bigint[],
                     $14::text[], $15::bytea[], $16::bool[])
              AS n(ord, now, fresh_after, new_id, route, scope, idem_key, fingerprint, method,
                   path, content_type, body_size, body_sha256, body, refuse_twin)
         CROSS JOIN LATERAL idemgate_claim_unless_twin(n.refuse_twin, $1, n.now, n.fresh_after,
              n.new_id, n.route, n.scope, n.idem_key, n.fingerprint, n.method, n.path,
              n.content_type, n.body_size, n.body_sha256, n.body) AS c",
    )
    .bind(owner)
    .bind(&ords)
    .bind(&nows)
    .bind(&fresh_after)
    .bind(&ids)
    .bind(column(&|c| c.new.route.clone()))
    .bind(column(&|c| c.new.scope.clone()))
    .bind(column(&|c| c.new.key.clone()))
    .bind(column(&|c| c.new.fingerprint.as_str().to_string()))
    .bind(column(&|c| c.new.request.method.clone()))
    .bind(column(&|c| c.new.request.path.clone()))
    .bind(&content_types)
    .bind(&body_sizes)
    .bind(column(&|c| c.new.request.body_sha256.clone()))
    .bind(&bodies)
    .bind(&refuse_twin)
    .fetch_all(pool)
    .await?;
    let mut results: Vec<Option<Result<ClaimResult, StoreError>>> =
        calls.iter().map(|_| None).collect();
    for row in &rows {
        let ord: i32 = row.try_get("ord")?;
        let claimed: bool = row.try_get("claimed")?;
        let Some(i) = usize::try_from(ord).ok().filter(|&i| i < calls.len()) else {
            continue;
        };
        // The row holds the call's identity, or, refused by the guard, its
        // twin's under another key.
        let new = &calls[i].new;
        let result = operation_from_row(row, seal, &new.scope).map(|operation| {
            if !claimed && operation.key != new.key {
                ClaimResult::HeldTwin(Box::new(operation))
            } else if claimed {
                ClaimResult::Claimed(Claim {
                    operation_id: operation.id,
                    attempt: operation.attempt,
                    identity: new.identity(),
                    route: new.route.clone(),
                    key: new.key.clone(),
                    row: None,
                })
            } else {
                ClaimResult::Existing(Box::new(operation))
            }
        });
        results[i] = Some(result);
    }
    results
        .into_iter()
        .map(|r| r.ok_or_else(|| StoreError::Failed("a claim of the batch went unanswered".into())))
        .collect()
}

/// The stored operation for `new`'s identity that is not superseded.
pub async fn find(
    pool: &PgPool,
    seal: &Seal,
    new: &NewOperation,
) -> Result<Option<Operation>, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT {OPERATION_COLUMNS} FROM operations
         WHERE route = $1 AND scope = $2 AND idem_key = $3 AND superseded_at IS NULL"
    ))
    .bind(&new.route)
    .bind(&new.scope)
    .bind(&new.key)
    .fetch_optional(pool)
    .await?;
    row.as_ref()
        .map(|row| operation_from_row(row, seal, &new.scope))
        .transpose()
}

/// The rotated-key guard's look-up inside `idemgate_claim_unless_twin`
/// (migration 0013), as the access-path catalogue checks it: the index of
/// the operations in flight or held.
fn held_twin_sql() -> String {
    format!(
        "SELECT {OPERATION_COLUMNS} FROM operations
         WHERE route = $1 AND scope = $2 AND fingerprint = $3
           AND state IN ('in_progress', 'unknown') AND idem_key <> $4
         LIMIT 1"
    )
}

/// A claim this replica made whose answer was lost
/// ([`StoreError::Unanswered`]): if it committed, nothing was sent for it,
/// so it becomes `not_attempted` (evidence `claim-unanswered`) and the
/// next retry is sent. Found by its identity, its owner and the time the
/// claim wrote (`claimed_at`), so no later claim is taken for it. The id
/// released, if any.
pub(crate) async fn release_unanswered_claim(
    pool: &PgPool,
    owner: &str,
    new: &NewOperation,
    (claimed_at, now): (i64, i64),
) -> Result<Option<String>, StoreError> {
    let released = sqlx::query_scalar(
        "WITH released AS (
            UPDATE operations SET state = 'not_attempted', evidence = 'claim-unanswered',
                updated_at = $6
            WHERE route = $1 AND scope = $2 AND idem_key = $3 AND superseded_at IS NULL
              AND state = 'in_progress' AND owner = $4 AND updated_at = $5
            RETURNING id, attempt
         ), kept AS (
            INSERT INTO events (operation_id, at, kind, detail)
            SELECT id, $6, 'claim-unanswered', json_build_object('attempt', attempt)::text
            FROM released
         )
         SELECT id FROM released",
    )
    .bind(&new.route)
    .bind(&new.scope)
    .bind(&new.key)
    .bind(owner)
    .bind(claimed_at)
    .bind(now)
    .fetch_optional(pool)
    .await?;
    Ok(released)
}

/// An attempt number or a batch position as an INTEGER column holds it.
fn int(n: impl TryInto<i32>) -> i32 {
    n.try_into().unwrap_or(i32::MAX)
}

/// A record waiting for its batch.
pub(crate) struct RecordCall {
    pub(crate) now: i64,
    pub(crate) claim: Claim,
    pub(crate) settlement: Settlement,
    pub(crate) events: Vec<Event>,
}

/// Settles each of `calls` with its events, each as one compare-and-set
/// on (id, state, attempt, owner), all in one statement (ordered by id,
/// for one lock order across replicas); whether each applied, in the
/// calls' order. A stale record keeps its evidence as events; an applied
/// plain response is proven by the row itself.
///
/// A stale record's operation may be gone (swept, once settled otherwise
/// and old): its events go nowhere, and it is stale like any other. They
/// would break the events' foreign key, and with it the statement, so the
/// whole batch: every other call's record. So events go only to the
/// operations updated here (locked by the update) and to the stale ones
/// found and locked (`stale`, `FOR KEY SHARE`: a sweep deleting one
/// meanwhile is waited for, and the row then passed by; a sweep passes
/// by the rows locked here). The lock is taken only on rows this
/// statement did not update: a row locked after its own update in the
/// same statement would be skipped.
pub async fn record(
    pool: &PgPool,
    seal: &Seal,
    owner: &str,
    calls: &[RecordCall],
) -> Result<Vec<Recorded>, StoreError> {
    let mut order: Vec<usize> = (0..calls.len()).collect();
    order.sort_by_key(|&i| &calls[i].claim.operation_id);
    let ordered = || order.iter().map(|&i| (i, &calls[i]));
    let response = |c: &RecordCall| c.settlement.response().cloned();
    let forms: Vec<Option<StoredForm>> = ordered()
        .map(|(_, c)| {
            let claim = &c.claim;
            (c.settlement.response())
                .map(|r| seal.stored_form(&claim.operation_id, &claim.identity, r))
        })
        .collect();
    let (mut event_ords, mut kinds, mut details) = (Vec::new(), Vec::new(), Vec::new());
    for (i, call) in ordered() {
        for event in &call.events {
            event_ords.push(int(i));
            kinds.push(event.kind);
            details.push(event.detail.to_string());
        }
    }
    let rows = sqlx::query(
        "WITH input AS (
            SELECT * FROM unnest($2::int[], $3::text[], $4::int[], $5::text[], $6::text[],
                                 $7::int[], $8::text[], $9::bytea[], $10::bigint[], $11::bool[])
                AS i(ord, id, attempt, state, evidence, status, headers, body, now, implied)
         ), updated AS (
            UPDATE operations o SET state = i.state, evidence = i.evidence,
                response_status = i.status, response_headers = i.headers,
                response_body = i.body, updated_at = i.now
            FROM input i
            WHERE o.id = i.id AND o.state = 'in_progress' AND o.attempt = i.attempt
              AND o.owner = $1
            RETURNING i.ord, o.id
         ), stale AS (
            SELECT o.id FROM operations o
            WHERE o.id IN (SELECT id FROM input) AND o.id NOT IN (SELECT id FROM updated)
            FOR KEY SHARE
         ), kept AS (
            INSERT INTO events (operation_id, at, kind, detail)
            SELECT i.id, i.now, e.kind, e.detail
            FROM unnest($12::int[], $13::text[], $14::text[]) WITH ORDINALITY
                AS e(ord, kind, detail, seq)
            JOIN input i ON i.ord = e.ord
            WHERE (i.id IN (SELECT id FROM updated) OR i.id IN (SELECT id FROM stale))
              AND (NOT i.implied OR i.ord NOT IN (SELECT ord FROM updated))
            ORDER BY e.seq
         )
         SELECT i.ord, i.ord IN (SELECT ord FROM updated) AS applied FROM input i",
    )
    .bind(owner)
    .bind(ordered().map(|(i, _)| int(i)).collect::<Vec<_>>())
    .bind(
        ordered()
            .map(|(_, c)| c.claim.operation_id.clone())
            .collect::<Vec<_>>(),
    )
    .bind(
        ordered()
            .map(|(_, c)| int(c.claim.attempt))
            .collect::<Vec<_>>(),
    )
    .bind(
        ordered()
            .map(|(_, c)| c.settlement.state().as_str())
            .collect::<Vec<_>>(),
    )
    .bind(
        ordered()
            .map(|(_, c)| c.settlement.evidence().to_string())
            .collect::<Vec<_>>(),
    )
    .bind(
        ordered()
            .map(|(_, c)| response(c).map(|r| i32::from(r.status)))
            .collect::<Vec<_>>(),
    )
    .bind(
        (forms.iter())
            .map(|f| f.as_ref().map(|f| f.headers.clone()))
            .collect::<Vec<_>>(),
    )
    .bind(
        (forms.iter())
            .map(|f| f.as_ref().and_then(|f| f.body.clone()))
            .collect::<Vec<_>>(),
    )
    .bind(ordered().map(|(_, c)| c.now).collect::<Vec<_>>())
    .bind(
        ordered()
            .map(|(_, c)| is_implied_by_record(c.settlement.state(), &c.events))
            .collect::<Vec<_>>(),
    )
    .bind(&event_ords)
    .bind(&kinds)
    .bind(&details)
    .fetch_all(pool)
    .await?;
    let mut results = vec![None; calls.len()];
    for row in &rows {
        let ord: i32 = row.try_get("ord")?;
        let applied: bool = row.try_get("applied")?;
        if let Some(slot) = usize::try_from(ord).ok().and_then(|i| results.get_mut(i)) {
            *slot = Some(if applied {
                Recorded::Applied
            } else {
                Recorded::Stale
            });
        }
    }
    results
        .into_iter()
        .map(|r| {
            r.ok_or_else(|| StoreError::Failed("a record of the batch went unanswered".into()))
        })
        .collect()
}

/// Whose `in_progress` operations [`mark_in_progress_unknown`] takes.
pub(crate) enum Owners<'a> {
    /// This replica's own, at shutdown.
    This(&'a str),
    /// Every owner without a running lease, by a replica whose own lease runs.
    Lost { by: &'a str },
    /// Those of `ids` this replica claimed before `claimed_before` and
    /// still holds: attempts it no longer works on (`attempts`).
    Orphaned {
        this: &'a str,
        ids: &'a [String],
        claimed_before: i64,
    },
}

/// The ids of this replica's `in_progress` operations claimed before
/// `claimed_before` (served by `operations_in_progress_owner`).
pub(crate) async fn own_in_progress(
    pool: &PgPool,
    owner: &str,
    claimed_before: i64,
) -> Result<Vec<String>, StoreError> {
    let ids = sqlx::query_scalar(
        "SELECT id FROM operations
         WHERE state = 'in_progress' AND owner = $1 AND updated_at < $2",
    )
    .bind(owner)
    .bind(claimed_before)
    .fetch_all(pool)
    .await?;
    Ok(ids)
}

/// `in_progress` → `unknown` with `evidence`, each operation once (the
/// update is the compare-and-set); the routes of the operations marked,
/// one entry per operation.
pub(crate) async fn mark_in_progress_unknown(
    pool: &PgPool,
    now: i64,
    evidence: &str,
    owners: Owners<'_>,
) -> Result<Vec<String>, StoreError> {
    let (whose, replica, event) = match &owners {
        Owners::This(owner) => ("owner = $3".to_string(), *owner, "owner-lost"),
        Owners::Lost { by } => (
            format!(
                "owner IS DISTINCT FROM $3 AND NOT {OWNER_ALIVE}
                 AND EXISTS (SELECT 1 FROM replicas r
                    WHERE r.id = $3 AND r.lease_until > clock_timestamp())"
            ),
            *by,
            "owner-lost",
        ),
        // The claim's time is the compare-and-set: a later attempt of the
        // same operation is claimed after it.
        Owners::Orphaned { this, .. } => (
            "owner = $3 AND id = ANY($4) AND updated_at < $5".to_string(),
            *this,
            "record-lost",
        ),
    };
    let sql = format!(
        "WITH marked AS (
            UPDATE operations SET state = 'unknown', evidence = $1, updated_at = $2
            WHERE state = 'in_progress' AND {whose}
            RETURNING id, owner, route
         ), kept AS (
            INSERT INTO events (operation_id, at, kind, detail)
            SELECT id, $2, '{event}', json_build_object('reason', $1::text, 'owner', owner)::text
            FROM marked
         )
         SELECT route FROM marked"
    );
    let mut query = sqlx::query_scalar(&sql)
        .bind(evidence)
        .bind(now)
        .bind(replica);
    if let Owners::Orphaned {
        ids,
        claimed_before,
        ..
    } = owners
    {
        query = query.bind(ids).bind(claimed_before);
    }
    let routes = query.fetch_all(pool).await?;
    Ok(routes)
}

pub(crate) async fn insert_event(
    pool: &PgPool,
    operation_id: &str,
    at: i64,
    event: &Event,
) -> Result<(), StoreError> {
    sqlx::query("INSERT INTO events (operation_id, at, kind, detail) VALUES ($1, $2, $3, $4)")
        .bind(operation_id)
        .bind(at)
        .bind(event.kind)
        .bind(event.detail.to_string())
        .execute(pool)
        .await?;
    Ok(())
}

/// A probe's event that settled nothing, in place of the latest of a run
/// of probes with its verdict (`RequestPath::add_probe_event`): when the
/// operation's two latest events are such probes, the latest takes this
/// one's time and detail, its `probes` (`idemgate_store::PROBES`) one
/// more than it stood for; otherwise the event is appended. One statement;
/// two replicas that fold at once both count (the second update reads the
/// row the first left).
pub async fn add_probe_event(
    pool: &PgPool,
    operation_id: &str,
    at: i64,
    event: &Event,
) -> Result<(), StoreError> {
    sqlx::query(
        "WITH latest AS (
            SELECT id, kind, detail::jsonb ->> 'verdict' AS verdict FROM events
            WHERE operation_id = $1 ORDER BY id DESC LIMIT 2
         ), run AS (
            SELECT max(id) AS id FROM latest
            HAVING count(*) = 2 AND bool_and(coalesce(kind = $5 AND verdict = $4, false))
         ), folded AS (
            UPDATE events e SET at = $2,
                detail = jsonb_set($3::jsonb, '{probes}',
                    to_jsonb(coalesce((e.detail::jsonb ->> 'probes')::bigint, 1) + 1))::text
            FROM run WHERE e.id = run.id
            RETURNING e.id
         )
         INSERT INTO events (operation_id, at, kind, detail)
         SELECT $1, $2, $5, $3 WHERE NOT EXISTS (SELECT 1 FROM folded)",
    )
    .bind(operation_id)
    .bind(at)
    .bind(event.detail.to_string())
    .bind(event.detail["verdict"].as_str())
    .bind(event.kind)
    .execute(pool)
    .await?;
    Ok(())
}

/// `unknown` → `completed` with evidence that came after the fact, unless
/// a probe found the write more than once at the destination (an
/// operator's to settle); the event is kept either way (when the operation
/// exists).
pub async fn settle_held(
    pool: &PgPool,
    seal: &Seal,
    now: i64,
    late: &LateEvidence,
) -> Result<bool, StoreError> {
    let LateEvidence {
        operation_id,
        response,
        event,
        ..
    } = late;
    let Some(identity) = identity(pool, operation_id).await? else {
        return Ok(false);
    };
    let stored = seal.stored_form(operation_id, &identity, response);
    let updated: i64 = sqlx::query_scalar(
        "WITH updated AS (
            UPDATE operations SET state = 'completed', evidence = $1, response_status = $2,
                response_headers = $3, response_body = $4, updated_at = $5
            WHERE id = $6 AND state = 'unknown' AND ($7::integer IS NULL OR attempt = $7)
                AND evidence <> $10
            RETURNING id
         ), kept AS (
            INSERT INTO events (operation_id, at, kind, detail) VALUES ($6, $5, $8, $9)
         )
         SELECT count(*) FROM updated",
    )
    .bind(late.source.evidence())
    .bind(i32::from(response.status))
    .bind(stored.headers)
    .bind(stored.body)
    .bind(now)
    .bind(operation_id)
    .bind(late.source.attempt().map(int))
    .bind(event.kind)
    .bind(event.detail.to_string())
    .bind(DUPLICATED)
    .fetch_one(pool)
    .await?;
    Ok(updated == 1)
}

/// A probe's finding about an operation still `unknown` at the probed
/// attempt and not found more than once before ([`Finding`]); the event is
/// kept either way (when the operation exists). One statement: the change,
/// and for a duplicate its alert and its route's pause, apply together or
/// not at all.
pub async fn settle_probed(pool: &PgPool, now: i64, probed: &Probed) -> Result<bool, StoreError> {
    let Probed {
        operation_id: id,
        attempt,
        finding,
        event,
    } = probed;
    if identity(pool, id).await?.is_none() {
        return Ok(false);
    }
    let sql = match finding {
        Finding::Absent => {
            "WITH updated AS (
                UPDATE operations SET state = 'not_attempted', evidence = $1, updated_at = $2
                WHERE id = $3 AND state = 'unknown' AND attempt = $4 AND evidence <> $7
                RETURNING id
             ), kept AS (
                INSERT INTO events (operation_id, at, kind, detail) VALUES ($3, $2, $5, $6)
             )
             SELECT count(*) FROM updated"
        }
        // `updated_at` stays: an `unknown` operation's is when it became
        // unknown (the stats' oldest, a probe's minimum age).
        // One its late response completed while the probe asked is at the
        // destination twice all the same: paused and alerted too, its
        // state (and response) kept.
        Finding::Duplicated => {
            "WITH updated AS (
                UPDATE operations SET evidence = $1
                WHERE id = $3 AND state IN ('unknown', 'completed') AND attempt = $4
                  AND evidence <> $7
                RETURNING id, route, idem_key, state
             ), alerted AS (
                INSERT INTO alert_outbox (event, at, route, operation_id, idem_key, state, evidence)
                SELECT $1, $2, route, id, idem_key, state, $1 FROM updated
             ), paused AS (
                INSERT INTO route_pauses (route, reason, paused_by, updated_at)
                SELECT route, 'a probe found operation ' || id || ' more than once at the destination',
                    'probe', $2
                FROM updated
                ON CONFLICT (route) DO NOTHING
             ), kept AS (
                INSERT INTO events (operation_id, at, kind, detail) VALUES ($3, $2, $5, $6)
             )
             SELECT count(*) FROM updated"
        }
    };
    let updated: i64 = sqlx::query_scalar(sql)
        .bind(finding.evidence())
        .bind(now)
        .bind(id)
        .bind(int(*attempt))
        .bind(event.kind)
        .bind(event.detail.to_string())
        .bind(DUPLICATED)
        .fetch_one(pool)
        .await?;
    Ok(updated == 1)
}

/// Pauses `route` if at least `threshold` of its operations are `unknown`,
/// saying how many are; whether it is paused afterwards.
pub async fn trip_pause_latch(
    pool: &PgPool,
    now: i64,
    route: &str,
    threshold: u32,
) -> Result<bool, StoreError> {
    sqlx::query(
        "INSERT INTO route_pauses (route, reason, paused_by, updated_at)
         SELECT $1, 'pause_after_unknown: ' || held || ' operations unknown', 'latch', $3
         FROM (SELECT count(*) AS held FROM operations WHERE route = $1 AND state = 'unknown') c
         WHERE held >= $2
         ON CONFLICT (route) DO NOTHING",
    )
    .bind(route)
    .bind(i64::from(threshold))
    .bind(now)
    .execute(pool)
    .await?;
    let paused: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM route_pauses WHERE route = $1)")
            .bind(route)
            .fetch_one(pool)
            .await?;
    Ok(paused)
}

pub async fn paused_routes(pool: &PgPool) -> Result<Vec<String>, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT route FROM route_pauses ORDER BY route")
            .fetch_all(pool)
            .await?,
    )
}

pub async fn pauses(pool: &PgPool) -> Result<Vec<RoutePause>, StoreError> {
    let rows: Vec<(String, String, String)> =
        sqlx::query_as("SELECT route, reason, paused_by FROM route_pauses ORDER BY route")
            .fetch_all(pool)
            .await?;
    rows.into_iter()
        .map(|(route, reason, by)| {
            Ok(RoutePause {
                route,
                reason,
                by: PausedBy::parse(&by)?,
            })
        })
        .collect()
}

pub async fn set_paused(
    pool: &PgPool,
    now: i64,
    route: &str,
    reason: Option<&str>,
) -> Result<(), StoreError> {
    let query = match reason {
        Some(reason) => sqlx::query(
            "INSERT INTO route_pauses (route, reason, paused_by, updated_at)
             VALUES ($1, $2, 'operator', $3)
             ON CONFLICT (route) DO UPDATE SET reason = excluded.reason,
                paused_by = excluded.paused_by, updated_at = excluded.updated_at",
        )
        .bind(route)
        .bind(reason)
        .bind(now),
        None => sqlx::query("DELETE FROM route_pauses WHERE route = $1").bind(route),
    };
    query.execute(pool).await?;
    Ok(())
}

/// The operations `filter` selects, newest first, by its access path's
/// own statement ([`list_statement`]).
pub async fn list(pool: &PgPool, filter: &ListFilter) -> Result<Vec<Summary>, StoreError> {
    let (sql, params) = list_statement(filter);
    let rows = bound(sqlx::query(&sql), &params).fetch_all(pool).await?;
    rows.iter().map(summary_from_row).collect()
}

/// [`duplicated`]'s statement: $1 a route or NULL, $2 a limit.
fn duplicated_sql() -> String {
    format!(
        "SELECT {SUMMARY_COLUMNS} FROM operations
         WHERE state = 'unknown' AND evidence = '{DUPLICATED}' AND ($1::text IS NULL OR route = $1)
         ORDER BY id DESC LIMIT $2"
    )
}

/// The `unknown` operations found more than once at the destination, on
/// `route` or any, newest first.
pub async fn duplicated(
    pool: &PgPool,
    route: Option<&str>,
    limit: u32,
) -> Result<Vec<Summary>, StoreError> {
    let rows = sqlx::query(&duplicated_sql())
        .bind(route)
        .bind(i64::from(limit))
        .fetch_all(pool)
        .await?;
    rows.iter().map(summary_from_row).collect()
}

/// The statement of `filter`'s access path ([`ListPath`]) and its
/// parameters: each a range of one index read backwards from the cursor,
/// so a page costs its rows however many operations are stored.
fn list_statement(filter: &ListFilter) -> (String, Vec<Param>) {
    let mut params = Vec::new();
    // Only the parameters a statement names: PostgreSQL types each one.
    let mut param = |value: Param| {
        params.push(value);
        format!("${}", params.len())
    };
    let state = filter.state.map(State::as_str);
    let (route, key) = (filter.route.as_deref(), filter.key.as_deref());
    let ranges = match filter.path() {
        ListPath::All => vec!["true".to_string()],
        ListPath::State => vec![format!("state = {}", param(state.into()))],
        ListPath::RouteState => {
            let route = param(route.into());
            vec![format!(
                "route = {route} AND state = {}",
                param(state.into())
            )]
        }
        // One range per state, merged in id order.
        ListPath::Route => {
            let route = param(route.into());
            State::ALL
                .iter()
                .map(|s| format!("route = {route} AND state = '{}'", s.as_str()))
                .collect()
        }
        ListPath::Key => {
            let (key, state, route) = (param(key.into()), param(state.into()), param(route.into()));
            vec![format!(
                "idem_key = {key} AND ({state}::text IS NULL OR state = {state})
                   AND ({route}::text IS NULL OR route = {route})"
            )]
        }
    };
    let page = match &filter.before {
        Some(before) => format!(" AND id < {}", param(Param::text(before))),
        None => String::new(),
    };
    let limit = param(Param::Int(i64::from(filter.limit)));
    let newest = |range: &String| {
        format!(
            "SELECT {SUMMARY_COLUMNS} FROM operations WHERE {range}{page}
             ORDER BY id DESC LIMIT {limit}"
        )
    };
    let sql = match &ranges[..] {
        [range] => newest(range),
        // Each range ends at the limit on its own, however the planner
        // joins them.
        ranges => {
            let ranges: Vec<String> = ranges.iter().map(|r| format!("({})", newest(r))).collect();
            format!(
                "{} ORDER BY id DESC LIMIT {limit}",
                ranges.join(" UNION ALL ")
            )
        }
    };
    (sql, params)
}

/// `query` with `params` bound in order.
fn bound<'q>(
    mut query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    params: &'q [Param],
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    for param in params {
        query = match param {
            Param::Null => query.bind(None::<&str>),
            Param::Int(n) => query.bind(*n),
            Param::Text(text) => query.bind(text.as_str()),
            Param::Texts(texts) => query.bind(texts),
        };
    }
    query
}

/// [`get`]'s operation: $1 its id.
fn get_sql() -> String {
    format!("SELECT {OPERATION_COLUMNS}, scope FROM operations WHERE id = $1")
}

pub async fn get(
    pool: &PgPool,
    seal: &Seal,
    id: &str,
) -> Result<Option<(Operation, Vec<StoredEvent>)>, StoreError> {
    let row = sqlx::query(&get_sql())
        .bind(id)
        .fetch_optional(pool)
        .await?;
    let found = row.as_ref().map(|row| {
        let scope: String = row.try_get("scope")?;
        operation_from_row(row, seal, &scope)
    });
    let Some(operation) = found.transpose()? else {
        return Ok(None);
    };
    let events =
        sqlx::query("SELECT at, kind, detail FROM events WHERE operation_id = $1 ORDER BY id")
            .bind(id)
            .fetch_all(pool)
            .await?
            .iter()
            .map(|row| {
                let detail: String = row.try_get("detail")?;
                Ok(StoredEvent {
                    at: row.try_get("at")?,
                    kind: row.try_get("kind")?,
                    detail: serde_json::from_str(&detail).unwrap_or(serde_json::Value::Null),
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
    let events = timeline(&operation, events);
    Ok(Some((operation, events)))
}

/// The newest operation with `key` under any of the (route, scope) pairs:
/// the newest current one (by the identity index), since each took its
/// identity after every one it superseded; only under pairs without one,
/// the newest superseded one (by `operations_superseded`, migration 0009).
pub async fn find_newest(
    pool: &PgPool,
    scopes: &[(String, String)],
    key: &str,
) -> Result<Option<Summary>, StoreError> {
    let (routes, scopes): (Vec<&str>, Vec<&str>) = scopes
        .iter()
        .map(|(route, scope)| (route.as_str(), scope.as_str()))
        .unzip();
    let row = sqlx::query(&find_newest_sql())
        .bind(&routes)
        .bind(&scopes)
        .bind(key)
        .fetch_optional(pool)
        .await?;
    row.as_ref().map(summary_from_row).transpose()
}

/// [`find_newest`]'s statement: the pairs ($1 routes, $2 scopes) of $3 key.
fn find_newest_sql() -> String {
    format!(
        "WITH pairs AS (SELECT * FROM unnest($1::text[], $2::text[]) AS p(route, scope)),
         current AS (
            SELECT o.* FROM pairs p CROSS JOIN LATERAL (
                SELECT * FROM operations o
                WHERE o.route = p.route AND o.scope = p.scope AND o.idem_key = $3
                  AND o.superseded_at IS NULL
                LIMIT 1 -- one at most (the identity is unique): looked up per pair
            ) o
         )
         SELECT {SUMMARY_COLUMNS} FROM (
            SELECT * FROM current
            UNION ALL
            SELECT o.* FROM pairs p CROSS JOIN LATERAL (
                SELECT * FROM operations o
                WHERE o.route = p.route AND o.scope = p.scope AND o.idem_key = $3
                  AND o.superseded_at IS NOT NULL
                ORDER BY o.id DESC LIMIT 1
            ) o
            WHERE NOT EXISTS (SELECT 1 FROM current c
                              WHERE c.route = p.route AND c.scope = p.scope)
         ) found
         ORDER BY id DESC LIMIT 1"
    )
}

/// An operator's decision, allowed from `unknown` or from `in_progress`
/// whose owner's lease has run out, and, given (`at`'s third), only at
/// the attempt the operator checked: one compare-and-set, so a retry's
/// claim of the next attempt between the operator's read and this write
/// makes it [`Resolved::OtherAttempt`].
pub async fn resolve(
    pool: &PgPool,
    seal: &Seal,
    (now, id, attempt): (i64, &str, Option<u32>),
    decision: &Decision,
    event: &Event,
) -> Result<Resolved, StoreError> {
    let (state, response) = decision.outcome();
    let Some(identity) = identity(pool, id).await? else {
        return Ok(Resolved::NotFound);
    };
    let stored = response.map(|r| seal.stored_form(id, &identity, r));
    let updated: i64 = sqlx::query_scalar(&format!(
        "WITH updated AS (
            UPDATE operations SET state = $1, evidence = $11, response_status = $2,
                response_headers = $3, response_body = $4, updated_at = $5
            WHERE id = $6 AND (state = 'unknown' OR (state = 'in_progress' AND NOT {OWNER_ALIVE}))
              AND ($9::integer IS NULL OR attempt = $9)
              AND NOT ($10 AND evidence = '{DUPLICATED}')
            RETURNING id
         ), kept AS (
            INSERT INTO events (operation_id, at, kind, detail)
            SELECT id, $5, $7, $8 FROM updated
         )
         SELECT count(*) FROM updated"
    ))
    .bind(state.as_str())
    .bind(response.map(|r| i32::from(r.status)))
    .bind(stored.as_ref().map(|s| s.headers.clone()))
    .bind(stored.and_then(|s| s.body))
    .bind(now)
    .bind(id)
    .bind(event.kind)
    .bind(event.detail.to_string())
    .bind(attempt.map(|a| i32::try_from(a).unwrap_or(i32::MAX)))
    .bind(state == State::NotAttempted)
    .bind(decision.evidence())
    .fetch_one(pool)
    .await?;
    if updated == 1 {
        return Ok(Resolved::Done);
    }
    let now_at: Option<(String, i32, String)> =
        sqlx::query_as("SELECT state, attempt, evidence FROM operations WHERE id = $1")
            .bind(id)
            .fetch_optional(pool)
            .await?;
    let Some((state_now, current, evidence)) = now_at else {
        return Ok(Resolved::NotFound);
    };
    if state == State::NotAttempted && state_now == "unknown" && evidence == DUPLICATED {
        return Ok(Resolved::FoundAtDestination);
    }
    let state = state_now;
    let state = State::parse(&state)?;
    let current =
        u32::try_from(current).map_err(|_| StoreError::Corrupt(format!("attempt {current}")))?;
    Ok(match attempt {
        Some(given) if given != current => Resolved::OtherAttempt {
            attempt: current,
            state,
        },
        _ => Resolved::NotResolvable(state),
    })
}

/// Counts from `operation_counts`, which the triggers of migration 0005
/// keep in every write's transaction, one row per writing backend (its
/// comment says why); the oldest `unknown` operation from the `(state,
/// updated_at)` index. Neither reads more as the table grows.
///
/// First folds the backends' rows into slot 0, skipping those a running
/// transaction holds, so the rows summed stay about one per (route, state)
/// and backend that wrote since the last read. The fold never waits on a
/// writer; folds racing on other replicas take the slot-0 rows in one
/// order, so they only queue behind each other.
pub async fn stats(pool: &PgPool) -> Result<Stats, StoreError> {
    sqlx::query(
        "WITH folded AS (
            DELETE FROM operation_counts c
            WHERE (c.route, c.state, c.slot) IN (
                SELECT route, state, slot FROM operation_counts WHERE slot <> 0
                FOR UPDATE SKIP LOCKED)
            RETURNING c.route, c.state, c.n
         )
         INSERT INTO operation_counts AS c (route, state, slot, n)
         SELECT route, state, 0, sum(n) FROM folded GROUP BY route, state ORDER BY route, state
         ON CONFLICT (route, state, slot) DO UPDATE SET n = c.n + excluded.n",
    )
    .execute(pool)
    .await?;
    let counts = sqlx::query(
        "SELECT route, state, sum(n)::bigint AS n FROM operation_counts GROUP BY route, state
         HAVING sum(n) <> 0 ORDER BY route, state",
    )
    .fetch_all(pool)
    .await?
    .iter()
    .map(|row| {
        let state: String = row.try_get("state")?;
        Ok((
            row.try_get("route")?,
            State::parse(&state)?,
            operation_count(row.try_get("n")?)?,
        ))
    })
    .collect::<Result<_, StoreError>>()?;
    let oldest_unknown_since =
        sqlx::query_scalar("SELECT min(updated_at) FROM operations WHERE state = 'unknown'")
            .fetch_one(pool)
            .await?;
    Ok(Stats {
        counts,
        oldest_unknown_since,
        replication: None,
    })
}

/// Recounts `operation_counts` from the table, unless [`COUNTS_ROW`]
/// says they are exact: whether it recounted. The table lock stops every
/// replica's counting triggers, and so their writes, until the recount
/// commits (it waits for the writes begun before it), so no write falls
/// between the count and the mark; replicas opening together recount
/// once.
pub(crate) async fn recount_if_untrusted(pool: &PgPool) -> Result<bool, StoreError> {
    if meta(pool, COUNTS_ROW).await?.as_deref() == Some(COUNTS_EXACT) {
        return Ok(false);
    }
    let mut tx = pool.begin().await?;
    sqlx::query("LOCK TABLE operation_counts IN EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await?;
    let trusted: Option<String> =
        sqlx::query_scalar("SELECT value FROM store_meta WHERE name = $1")
            .bind(COUNTS_ROW)
            .fetch_optional(&mut *tx)
            .await?;
    if trusted.as_deref() == Some(COUNTS_EXACT) {
        return Ok(false);
    }
    sqlx::query("DELETE FROM operation_counts")
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "INSERT INTO operation_counts (route, state, slot, n)
         SELECT route, state, 0, count(*) FROM operations GROUP BY route, state",
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO store_meta (name, value) VALUES ($1, $2)
         ON CONFLICT (name) DO UPDATE SET value = excluded.value",
    )
    .bind(COUNTS_ROW)
    .bind(COUNTS_EXACT)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(true)
}

/// Deletes up to `limit` (at most [`SWEEP_LIMIT`]) settled operations
/// last updated before `cutoff`, found by `operations_state_updated`,
/// none that a claim is taking meanwhile ([`SWEEP`]); unless another
/// replica is sweeping: one sweeper at a time, by a transaction-scoped
/// advisory lock named after this store's schema (so stores in other
/// schemas of the database do not wait on each other).
pub async fn sweep(pool: &PgPool, cutoff: i64, limit: u32) -> Result<u64, StoreError> {
    let mut tx = pool.begin().await?;
    let ours: bool = sqlx::query_scalar(SWEEP_LOCK).fetch_one(&mut *tx).await?;
    if !ours {
        return Ok(0);
    }
    let deleted = sqlx::query(SWEEP)
        .bind(cutoff)
        .bind(i64::from(limit.min(SWEEP_LIMIT)))
        .execute(&mut *tx)
        .await?
        .rows_affected();
    tx.commit().await?;
    Ok(deleted)
}

/// [`sweep`]'s statement: $1 the cutoff, $2 the limit.
///
/// A claim may take a `not_attempted` operation for its next attempt
/// while the sweep looks at it; deleted then, the attempt being sent
/// would have no row, and a retry through a peer would send it again.
/// Under READ COMMITTED a row that changed under a statement is checked
/// again against that statement's own conditions only, never a
/// subquery's: so the conditions are repeated on the deleted row. A row a
/// claim (or a record's events) holds is passed by, left for the next
/// sweep (`SKIP LOCKED`), so a sweep never waits on a request. The rows
/// are locked once, in a CTE (`MATERIALIZED`: run once): a locking
/// subquery run again for each row deleted would skip the rows deleted
/// already and take as many more, past the limit.
const SWEEP: &str = "WITH swept AS MATERIALIZED (
        SELECT id FROM operations
        WHERE state IN ('completed', 'not_attempted') AND updated_at < $1
        LIMIT $2 FOR UPDATE SKIP LOCKED)
    DELETE FROM operations WHERE id IN (SELECT id FROM swept)
      AND state IN ('completed', 'not_attempted') AND updated_at < $1";

/// The statements of the admin API, the console and retention, with
/// sample parameters ([`AccessPath`]); the alerts' are the outbox's.
pub(crate) fn access_paths() -> Vec<AccessPath> {
    let mut paths: Vec<AccessPath> = ListFilter::samples()
        .into_iter()
        .map(|(name, filter)| {
            let (sql, params) = list_statement(&filter);
            AccessPath {
                name,
                sql,
                index: list_index(filter.path()),
                bound: filter.before.is_some().then_some("id < "),
                params,
            }
        })
        .collect();
    let texts = |text: &str| Param::Texts(vec![text.to_string()]);
    let pairs = vec![texts("api"), texts("scope"), Param::text("k")];
    paths.extend([
        AccessPath {
            name: "get".into(),
            sql: get_sql(),
            index: "operations_pkey",
            bound: None,
            params: vec![Param::text("01900000-0000-7000-8000-000000000000")],
        },
        AccessPath {
            name: "find_newest, current".into(),
            sql: find_newest_sql(),
            index: "operations_identity",
            bound: None,
            params: pairs.clone(),
        },
        AccessPath {
            name: "find_newest, superseded".into(),
            sql: find_newest_sql(),
            index: "operations_superseded",
            bound: None,
            params: pairs,
        },
        AccessPath {
            name: "sweep".into(),
            sql: SWEEP.into(),
            index: "operations_state_updated",
            bound: Some("updated_at < "),
            params: vec![Param::Int(1_000), Param::Int(i64::from(SWEEP_LIMIT))],
        },
        AccessPath {
            name: "duplicated".into(),
            sql: duplicated_sql(),
            index: "operations_duplicated",
            bound: None,
            params: vec![Param::text("api"), Param::Int(50)],
        },
        AccessPath {
            name: "held_twin".into(),
            sql: held_twin_sql(),
            index: "operations_held_twins",
            bound: None,
            params: vec![
                Param::text("api"),
                Param::text("scope"),
                Param::text("fp"),
                Param::text("k"),
            ],
        },
    ]);
    paths
}

/// The index that serves `path` in PostgreSQL's names.
fn list_index(path: ListPath) -> &'static str {
    match path {
        ListPath::All => "operations_pkey",
        ListPath::State => "operations_state_id",
        ListPath::RouteState | ListPath::Route => "operations_route_state_id",
        ListPath::Key => "operations_key_id",
    }
}

/// Taken by the replica that sweeps, until its transaction ends.
const SWEEP_LOCK: &str =
    "SELECT pg_try_advisory_xact_lock(hashtext(current_schema() || ':idemgate-sweep'))";

/// Registers `replica`, or renews its lease: `lease` from now in the
/// database's clock.
pub(crate) async fn renew_lease(
    pool: &PgPool,
    replica: &str,
    lease_ms: i64,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO replicas (id, lease_until)
         VALUES ($1, clock_timestamp() + $2 * interval '1 millisecond')
         ON CONFLICT (id) DO UPDATE SET lease_until = excluded.lease_until",
    )
    .bind(replica)
    .bind(lease_ms)
    .execute(pool)
    .await?;
    Ok(())
}

/// Whether `replica`'s lease runs now, by the database's clock.
pub async fn lease_runs(pool: &PgPool, replica: &str) -> Result<bool, StoreError> {
    let runs: Option<bool> =
        sqlx::query_scalar("SELECT lease_until > clock_timestamp() FROM replicas WHERE id = $1")
            .bind(replica)
            .fetch_optional(pool)
            .await?;
    Ok(runs == Some(true))
}

/// Whether a claim could take its locks now: the lock an `INSERT` takes
/// on each table a claim writes (the operation, its event, its count),
/// within half a second (readiness is asked with 900 ms to answer), in a
/// transaction rolled back. A table locked by another session (a
/// migration, `VACUUM FULL`, a `CREATE INDEX`, an operator's `LOCK
/// TABLE`) fails it, as it stalls every claim; a lease check reads
/// another table and would not see it.
pub async fn operations_writable(pool: &PgPool) -> Result<(), StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query("SET LOCAL lock_timeout = '500ms'")
        .execute(&mut *tx)
        .await?;
    sqlx::query("LOCK TABLE operations, events, operation_counts IN ROW EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await?;
    tx.rollback().await?;
    Ok(())
}

/// Ends `replica`'s lease, and forgets replicas whose lease ran out long
/// ago and that own nothing in flight.
pub(crate) async fn end_lease(pool: &PgPool, replica: &str) -> Result<(), StoreError> {
    sqlx::query(
        "DELETE FROM replicas r WHERE r.id = $1
            OR (r.lease_until < clock_timestamp() - interval '1 day'
                AND NOT EXISTS (SELECT 1 FROM operations o
                    WHERE o.state = 'in_progress' AND o.owner = r.id))",
    )
    .bind(replica)
    .execute(pool)
    .await?;
    Ok(())
}

/// The value of the store's meta row `name`.
pub async fn meta(pool: &PgPool, name: &str) -> Result<Option<String>, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT value FROM store_meta WHERE name = $1")
            .bind(name)
            .fetch_optional(pool)
            .await?,
    )
}

/// The routes' identity settings kept in `store_meta`, by route name.
pub(crate) async fn route_settings(pool: &PgPool) -> Result<Vec<(String, String)>, StoreError> {
    Ok(sqlx::query_as(
        "SELECT substr(name, length($1) + 1), value FROM store_meta
         WHERE starts_with(name, $1)",
    )
    .bind(ROUTE_SETTINGS_ROW)
    .fetch_all(pool)
    .await?)
}

/// Keeps each route's identity settings, or forgets them (`None`), in one
/// transaction.
pub(crate) async fn keep_route_settings(
    pool: &PgPool,
    settings: &[(String, Option<String>)],
) -> Result<(), StoreError> {
    let mut tx = pool.begin().await?;
    for (route, kept) in settings {
        let name = format!("{ROUTE_SETTINGS_ROW}{route}");
        let statement = match kept {
            Some(value) => sqlx::query(
                "INSERT INTO store_meta (name, value) VALUES ($1, $2)
                 ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            )
            .bind(name)
            .bind(value),
            None => sqlx::query("DELETE FROM store_meta WHERE name = $1").bind(name),
        };
        statement.execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Whether the store holds any operation.
pub(crate) async fn holds_operations(pool: &PgPool) -> Result<bool, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM operations)")
            .fetch_one(pool)
            .await?,
    )
}

/// Sets the meta row `name`; `replace = false` keeps a value a peer wrote
/// first.
pub(crate) async fn set_meta(
    pool: &PgPool,
    name: &str,
    value: &str,
    replace: bool,
) -> Result<(), StoreError> {
    let conflict = if replace {
        "DO UPDATE SET value = excluded.value"
    } else {
        "DO NOTHING"
    };
    sqlx::query(&format!(
        "INSERT INTO store_meta (name, value) VALUES ($1, $2) ON CONFLICT (name) {conflict}"
    ))
    .bind(name)
    .bind(value)
    .execute(pool)
    .await?;
    Ok(())
}

/// Keys the scopes of a store written before scopes were keyed, and
/// keeps `key`'s canary, in one transaction under an advisory lock (so
/// replicas starting together key them once): the number of operations
/// keyed then, `None` when the store was keyed already with `key`; an
/// error for another key.
pub(crate) async fn key_scopes(pool: &PgPool, key: &ScopeKey) -> Result<Option<u64>, StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query(
        "SELECT pg_advisory_xact_lock(hashtext(current_schema() || ':idemgate-scope-key'))",
    )
    .execute(&mut *tx)
    .await?;
    let canary: Option<String> = sqlx::query_scalar("SELECT value FROM store_meta WHERE name = $1")
        .bind(scope_key::CANARY_ROW)
        .fetch_optional(&mut *tx)
        .await?;
    match canary {
        Some(canary) if canary == key.canary() => return Ok(None),
        Some(_) => return Err(key.wrong().into()),
        None => {}
    }
    let rows = sqlx::query("SELECT id, scope FROM operations")
        .fetch_all(&mut *tx)
        .await?;
    let mut ids = Vec::with_capacity(rows.len());
    let mut scopes = Vec::with_capacity(rows.len());
    for row in &rows {
        ids.push(row.try_get::<String, _>("id")?);
        scopes.push(key.keyed(&row.try_get::<String, _>("scope")?));
    }
    sqlx::query(
        "UPDATE operations o SET scope = n.scope
         FROM unnest($1::text[], $2::text[]) AS n(id, scope) WHERE o.id = n.id",
    )
    .bind(&ids)
    .bind(&scopes)
    .execute(&mut *tx)
    .await?;
    sqlx::query("INSERT INTO store_meta (name, value) VALUES ($1, $2)")
        .bind(scope_key::CANARY_ROW)
        .bind(key.canary())
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(Some(ids.len() as u64))
}

/// Seals again, under the current key, the payloads of up to `limit`
/// operations after `after` (by id) that are plain or under another key;
/// each update is a compare-and-set on the values it read, so a replica
/// that wrote meanwhile (under the current key) keeps its values.
pub async fn rekey(
    pool: &PgPool,
    seal: &Seal,
    after: &str,
    limit: u32,
) -> Result<RekeyBatch, StoreError> {
    let rows = sqlx::query(
        "SELECT id, route, scope, idem_key, fingerprint, response_status, request_body,
            response_headers, response_body
         FROM operations WHERE id > $1 ORDER BY id LIMIT $2",
    )
    .bind(after)
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await?;
    let mut batch = RekeyBatch::default();
    for row in &rows {
        let id: String = row.try_get("id")?;
        let status: Option<i32> = row.try_get("response_status")?;
        let stored = Payloads {
            response_status: status.map(status_of).transpose()?,
            request_body: row.try_get("request_body")?,
            response_headers: row.try_get("response_headers")?,
            response_body: row.try_get("response_body")?,
        };
        if let Some(new) = seal.reseal(&id, &identity_from_row(row)?, &stored)? {
            batch.resealed += sqlx::query(
                "UPDATE operations SET request_body = $1, response_headers = $2,
                    response_body = $3
                 WHERE id = $4 AND request_body IS NOT DISTINCT FROM $5
                   AND response_headers IS NOT DISTINCT FROM $6
                   AND response_body IS NOT DISTINCT FROM $7",
            )
            .bind(&new.request_body)
            .bind(&new.response_headers)
            .bind(&new.response_body)
            .bind(&id)
            .bind(&stored.request_body)
            .bind(&stored.response_headers)
            .bind(&stored.response_body)
            .execute(pool)
            .await?
            .rows_affected();
        }
        batch.last = Some(id);
        batch.operations += 1;
    }
    Ok(batch)
}

/// A row of [`OPERATION_COLUMNS`]. Sealed payloads are opened here: a
/// value that does not open fails the row, never passes as bytes.
/// `scope` is the row's (the claim's rows do not carry it).
fn operation_from_row(row: &PgRow, seal: &Seal, scope: &str) -> Result<Operation, StoreError> {
    let summary = summary_from_row(row)?;
    let id = &summary.id;
    let fingerprint: String = row.try_get("fingerprint")?;
    let identity = Identity::of(&summary.route, scope, &summary.key, &fingerprint);
    let status: Option<i32> = row.try_get("response_status")?;
    let headers: Option<String> = row.try_get("response_headers")?;
    let body_size: i64 = row.try_get("request_body_size")?;
    let superseded_at: Option<i64> = row.try_get("superseded_at")?;
    let response = match status {
        Some(status) => Some(seal.open_response(
            id,
            &identity,
            status_of(status)?,
            headers.as_deref(),
            row.try_get("response_body")?,
        )?),
        None => None,
    };
    let request_body = seal.open_request_body(id, &identity, row.try_get("request_body")?)?;
    Ok(Operation {
        id: summary.id,
        route: summary.route,
        key: summary.key,
        fingerprint: Fingerprint::from_stored(fingerprint),
        state: summary.state,
        attempt: summary.attempt,
        owner: row.try_get("owner")?,
        evidence: row.try_get("evidence")?,
        response,
        request: RequestSummary {
            method: row.try_get("request_method")?,
            path: row.try_get("request_path")?,
            content_type: row.try_get("request_content_type")?,
            body_size: u64::try_from(body_size).unwrap_or(0),
            body_sha256: row.try_get("request_body_sha256")?,
            body: request_body,
        },
        superseded: superseded_at.is_some(),
        created_at: summary.created_at,
        updated_at: summary.updated_at,
    })
}

/// A stored `response_status`.
fn status_of(status: i32) -> Result<u16, StoreError> {
    u16::try_from(status).map_err(|_| StoreError::Corrupt(format!("status {status}")))
}

/// The identity the sealed values of operation `id` are bound to; `None`
/// when there is no such operation.
async fn identity(pool: &PgPool, id: &str) -> Result<Option<Identity>, StoreError> {
    let row =
        sqlx::query("SELECT route, scope, idem_key, fingerprint FROM operations WHERE id = $1")
            .bind(id)
            .fetch_optional(pool)
            .await?;
    row.as_ref().map(identity_from_row).transpose()
}

fn identity_from_row(row: &PgRow) -> Result<Identity, StoreError> {
    let text = |column: &str| row.try_get::<String, _>(column);
    Ok(Identity::of(
        &text("route")?,
        &text("scope")?,
        &text("idem_key")?,
        &text("fingerprint")?,
    ))
}

fn summary_from_row(row: &PgRow) -> Result<Summary, StoreError> {
    let attempt: i32 = row.try_get("attempt")?;
    let state: String = row.try_get("state")?;
    Ok(Summary {
        id: row.try_get("id")?,
        route: row.try_get("route")?,
        key: row.try_get("idem_key")?,
        state: State::parse(&state)?,
        attempt: u32::try_from(attempt)
            .map_err(|_| StoreError::Corrupt(format!("attempt {attempt}")))?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

/// Whether a store is there: its `operations` table on the search path.
pub(crate) async fn store_exists(pool: &PgPool) -> Result<bool, StoreError> {
    let found: bool = sqlx::query_scalar("SELECT to_regclass('operations') IS NOT NULL")
        .fetch_one(pool)
        .await?;
    Ok(found)
}
