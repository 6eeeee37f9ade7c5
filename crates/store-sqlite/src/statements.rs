//! The SQL of the SQLite store, one function per store call, each run by
//! the writer thread inside its batch's transaction (and, when the batch
//! is run again after a failure, its own savepoint). Statements are prepared once per connection
//! (`prepare_cached`) and reused by every batch; the two every first write
//! runs, the claim's insert and the record's update, are held by the
//! writer's connection itself ([`Db::prepared`]), which finds them without
//! hashing their text.
//!
//! Every state change is a compare-and-set on (id, state, attempt, owner):
//! a stale writer changes no row and learns it from the row count.
//!
//! Longer than the house's ~800 lines on purpose: it is all of this
//! backend's SQL in one room, one function per store call, so the dialect
//! is read (and compared with `postgres/statements.rs`, the same calls in
//! the other dialect) in one place; splitting it by caller would scatter
//! the statements that must change together when the schema does.

use std::borrow::Cow;

use rusqlite::{Connection, OptionalExtension, Row, params};

use super::held::Db;
use super::transitions::{self, Row as Changed};
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

/// The columns [`operation_from_row`] reads. The digests are stored as
/// their bytes (migration 0007) and read back as the lower-case hex the
/// rest of the gateway compares and binds (`unhex(?)` binds them; the
/// claim's insert binds their bytes, [`digest_bytes`]).
const OPERATION_COLUMNS: &str = "id, route, idem_key, state, attempt, created_at, updated_at,
    owner, lower(hex(fingerprint)) AS fingerprint, evidence, response_status, response_headers,
    response_body, request_method, request_path, request_content_type, request_body_size,
    lower(hex(request_body_sha256)) AS request_body_sha256, request_body, superseded_at";

/// A row's scope digest, as hex.
const SCOPE: &str = "lower(hex(scope)) AS scope";

/// The columns [`identity_from_row`] reads.
const IDENTITY_COLUMNS: &str =
    "route, lower(hex(scope)) AS scope, idem_key, lower(hex(fingerprint)) AS fingerprint";

/// A new operation, claimed for its first attempt, unless an operation
/// that is not superseded holds its identity. Every first write runs it.
const INSERT_CLAIMED: &str =
    "INSERT INTO operations (id, route, scope, idem_key, fingerprint, state, attempt, owner,
            evidence, request_method, request_path, request_content_type, request_body_size,
            request_body_sha256, request_body, created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, 'in_progress', 1, ?6, 'claimed', ?7, ?8, ?9,
            ?10, ?11, ?12, ?13, ?13)
         ON CONFLICT (idem_key, route, scope) WHERE superseded_at IS NULL DO NOTHING";

/// A claimed attempt's outcome, as a compare-and-set on the row whose id
/// follows: what [`RECORD`] and [`RECORD_BY_ROW`] share.
macro_rules! record {
    ($row:literal) => {
        concat!(
            "UPDATE operations SET state = ?1, evidence = ?2, response_status = ?3,
                response_headers = ?4, response_body = ?5, updated_at = ?6
             WHERE ",
            $row,
            "id = ?7 AND state = 'in_progress' AND attempt = ?8 AND owner = ?9"
        )
    };
}

/// A claimed attempt's outcome, as a compare-and-set, its row found by id.
const RECORD: &str = record!("");

/// [`RECORD`] with the row found by the rowid its claim's insert gave it
/// (`?10`, [`Claim::row`]): every write that was sent runs it. It seeks no
/// index, where `id = ?` first seeks the index of the ids (UUIDs as text).
/// The id is compared still: a rowid that no longer names the claim's row
/// (SQLite renumbers rows only in a VACUUM, which the gateway never runs)
/// matches nothing, and the record is tried again by id ([`record()`]).
const RECORD_BY_ROW: &str = record!("rowid = ?10 AND ");

/// What a claim's statements bind that is made from `new` alone: its
/// sealed identity and its digests as the bytes a row keeps. Made by the
/// caller on the request's task ([`ClaimDigests::of`]), so that the writer
/// thread, which every first write waits on, does not.
pub(crate) struct ClaimDigests {
    /// `new.identity()`.
    identity: Identity,
    scope: [u8; 32],
    fingerprint: [u8; 32],
    body_sha256: [u8; 32],
}

impl ClaimDigests {
    pub fn of(new: &NewOperation) -> Result<ClaimDigests, StoreError> {
        Ok(ClaimDigests {
            identity: new.identity(),
            scope: digest_bytes(&new.scope)?,
            fingerprint: digest_bytes(new.fingerprint.as_str())?,
            body_sha256: digest_bytes(&new.request.body_sha256)?,
        })
    }
}

/// Claims `new`'s identity when it is new, outdated or `not_attempted` with
/// the same fingerprint; otherwise answers with the operation that holds it.
/// A new identity — every first write — costs one statement: the insert is
/// tried first and only a conflict looks the holder up; under the
/// rotated-key guard, one look-up of a held twin before it, and a twin
/// found refuses the claim unless the identity has an operation of its
/// own. `digests` are `new`'s ([`ClaimDigests::of`]).
pub fn claim(
    db: &Db,
    seal: &Seal,
    owner: &str,
    now: i64,
    new: &NewOperation,
    digests: &ClaimDigests,
) -> Result<ClaimResult, StoreError> {
    let identity = digests.identity;
    // A key's own operation answers for it, unless the answer would be to
    // send it again (`not_attempted`, the same payload; or outdated by the
    // derive window): then a twin in flight or held holds it back as it
    // holds back a new key.
    if new.refuse_held_twin
        && let Some(twin) = held_twin(db, seal, new, digests)?
        && find(db, seal, new)?.is_none_or(|own| new.would_send(&own) || new.outdates(&own))
    {
        return Ok(ClaimResult::HeldTwin(Box::new(twin)));
    }
    // The row's creation is the first attempt's claim (see `timeline`).
    if let Some(claim) = insert(db, seal, owner, now, new, digests)? {
        return Ok(ClaimResult::Claimed(claim));
    }
    let held = || StoreError::Failed("an identity is taken by no operation".into());
    let operation = find(db, seal, new)?.ok_or_else(held)?;
    let claim = if new.outdates(&operation) {
        db.prepare_cached("UPDATE operations SET superseded_at = ?1 WHERE id = ?2")?
            .execute(params![now, operation.id])?;
        let event = Event {
            kind: "superseded",
            detail: serde_json::json!({ "reason": "derive-window" }),
        };
        insert_event(db, &operation.id, now, &event)?;
        return Ok(ClaimResult::Claimed(
            insert(db, seal, owner, now, new, digests)?.ok_or_else(held)?,
        ));
    } else if operation.state == State::NotAttempted && operation.fingerprint == new.fingerprint {
        let attempt = operation.attempt + 1;
        let taken = db
            .prepare_cached(
                "UPDATE operations SET state = 'in_progress', attempt = ?1, owner = ?2,
                    evidence = 'claimed', updated_at = ?3
                 WHERE id = ?4 AND state = 'not_attempted' AND attempt = ?5",
            )?
            .execute(params![
                attempt,
                owner,
                now,
                operation.id,
                operation.attempt
            ])?;
        if taken == 0 {
            return Ok(ClaimResult::Existing(Box::new(operation)));
        }
        let claim = Claim {
            operation_id: operation.id,
            attempt,
            identity,
            route: new.route.clone(),
            key: new.key.clone(),
            row: None,
        };
        let (from, to) = (Some(State::NotAttempted), Some(State::InProgress));
        transitions::moved(db, (&claim).into(), from, to, now, "claimed")?;
        claim
    } else {
        return Ok(ClaimResult::Existing(Box::new(operation)));
    };
    let event = Event {
        kind: "claimed",
        detail: serde_json::json!({ "attempt": claim.attempt, "owner": owner }),
    };
    insert_event(db, &claim.operation_id, now, &event)?;
    Ok(ClaimResult::Claimed(claim))
}

/// The stored operation for `new`'s identity that is not superseded.
pub fn find(
    conn: &Connection,
    seal: &Seal,
    new: &NewOperation,
) -> Result<Option<Operation>, StoreError> {
    let mut statement = conn.prepare_cached(&format!(
        "SELECT {OPERATION_COLUMNS} FROM operations
         WHERE route = ?1 AND scope = unhex(?2) AND idem_key = ?3 AND superseded_at IS NULL"
    ))?;
    let found = statement
        .query_row(params![new.route, new.scope, new.key], |row| {
            operation_from_row(row, seal, &new.scope)
        })
        .optional()?;
    found.transpose()
}

/// The rotated-key guard's look-up ([`NewOperation::refuse_held_twin`]):
/// an operation under another key of `new`'s route and scope, with its
/// fingerprint, in flight or held. One seek in the index of those
/// operations alone (migration 0013), on the writer, in the claim's own
/// transaction: no claim can come between the look-up and its answer.
fn held_twin(
    db: &Db,
    seal: &Seal,
    new: &NewOperation,
    digests: &ClaimDigests,
) -> Result<Option<Operation>, StoreError> {
    let found = db
        .prepare_cached(&held_twin_sql())?
        .query_row(
            params![
                new.route,
                &digests.scope[..],
                &digests.fingerprint[..],
                new.key
            ],
            |row| operation_from_row(row, seal, &new.scope),
        )
        .optional()?;
    found.transpose()
}

/// States the condition of `operations_held_twins`, which SQLite reads
/// only for a statement that does.
fn held_twin_sql() -> String {
    format!(
        "SELECT {OPERATION_COLUMNS} FROM operations
         WHERE state IN ('in_progress', 'unknown')
           AND route = ?1 AND scope = ?2 AND fingerprint = ?3 AND idem_key <> ?4
         LIMIT 1"
    )
}

/// Inserts a new operation, claimed for its first attempt, unless an
/// operation that is not superseded holds its identity (`None`).
fn insert(
    db: &Db,
    seal: &Seal,
    owner: &str,
    now: i64,
    new: &NewOperation,
    digests: &ClaimDigests,
) -> Result<Option<Claim>, StoreError> {
    let (id, identity) = (new_id(), digests.identity);
    let request = &new.request;
    let inserted = db.prepared(INSERT_CLAIMED)?.execute(params![
        id,
        new.route,
        &digests.scope[..],
        new.key,
        &digests.fingerprint[..],
        owner,
        request.method,
        request.path,
        request.content_type,
        request.body_size as i64,
        &digests.body_sha256[..],
        seal.request_body(&id, &identity, request.body.as_deref()),
        now,
    ])?;
    if inserted == 0 {
        return Ok(None);
    }
    let claim = Claim {
        operation_id: id,
        attempt: 1,
        identity,
        route: new.route.clone(),
        key: new.key.clone(),
        row: Some(db.last_insert_rowid()),
    };
    transitions::moved(
        db,
        (&claim).into(),
        None,
        Some(State::InProgress),
        now,
        "claimed",
    )?;
    Ok(Some(claim))
}

/// A digest the gateway holds as hex, as the 32 bytes a row keeps
/// (migration 0007). Decoded in Rust, not by SQL's `unhex`: every first
/// write's three digests cost SQLite ~4,000 instructions as function calls
/// on bound text (callgrind), and off the writer thread
/// ([`ClaimDigests`]).
fn digest_bytes(hex: &str) -> Result<[u8; 32], StoreError> {
    let mut bytes = [0; 32];
    hex::decode_to_slice(hex, &mut bytes)
        .map_err(|e| StoreError::Failed(format!("a digest is not 32 bytes as hex: {e}")))?;
    Ok(bytes)
}

/// What a settlement writes in the row's own columns. Its response goes
/// apart, sealed ([`StoredForm`]), so the call queued for the writer
/// carries no copy of the response's headers and body.
pub(crate) struct SettledRow {
    state: State,
    evidence: Cow<'static, str>,
    status: Option<u16>,
}

impl From<&Settlement> for SettledRow {
    fn from(settlement: &Settlement) -> Self {
        SettledRow {
            state: settlement.state(),
            evidence: match settlement {
                // The one evidence of a response, and the happy path's.
                Settlement::Completed { .. } => Cow::Borrowed("response"),
                _ => Cow::Owned(settlement.evidence().to_string()),
            },
            status: settlement.response().map(|r| r.status),
        }
    }
}

/// Settles a claimed attempt with its events, as one compare-and-set.
/// `stored` is the settlement's response as it is written
/// ([`Seal::stored_form`], made before the call was queued).
pub fn record(
    db: &Db,
    owner: &str,
    now: i64,
    claim: &Claim,
    settlement: &SettledRow,
    stored: Option<&StoredForm>,
    events: &[Event],
) -> Result<Recorded, StoreError> {
    // By the claim's rowid when it has one, else by id.
    let update = |row: Option<i64>| {
        let mut statement = db.prepared(match row {
            Some(_) => RECORD_BY_ROW,
            None => RECORD,
        })?;
        let values = params![
            settlement.state.as_str(),
            settlement.evidence,
            settlement.status.map(i64::from),
            stored.map(|s| s.headers.as_str()),
            stored.and_then(|s| s.body.as_deref()),
            now,
            claim.operation_id,
            claim.attempt,
            owner,
        ];
        for (index, value) in values.iter().enumerate() {
            statement.raw_bind_parameter(index + 1, value)?;
        }
        if let Some(row) = row {
            statement.raw_bind_parameter(10, row)?;
        }
        statement.raw_execute()
    };
    let updated = match claim.row.map(|row| update(Some(row))).transpose()? {
        Some(0) | None => update(None)?,
        Some(updated) => updated,
    };
    if updated == 1 {
        let (from, to) = (Some(State::InProgress), Some(settlement.state));
        transitions::moved(db, claim.into(), from, to, now, &settlement.evidence)?;
    }
    // A stale record keeps its evidence as events, unless its operation
    // is gone (swept once settled otherwise): then they have nowhere to
    // go, and the record is stale all the same. An applied plain response
    // is proven by the row itself.
    let keep = match updated {
        0 => operation_exists(db, &claim.operation_id)?,
        _ => !is_implied_by_record(settlement.state, events),
    };
    if keep {
        for event in events {
            insert_event(db, &claim.operation_id, now, event)?;
        }
    }
    Ok(if updated == 1 {
        Recorded::Applied
    } else {
        Recorded::Stale
    })
}

/// `in_progress` → `unknown` with `evidence`, for one owner or for all;
/// the routes of the operations marked, one entry per operation.
pub(crate) fn mark_in_progress_unknown(
    conn: &Connection,
    now: i64,
    evidence: &str,
    owner: Option<&str>,
) -> Result<Vec<String>, StoreError> {
    let marked: Vec<(String, Option<String>, String, String)> = conn
        .prepare_cached(
            "UPDATE operations SET state = 'unknown', evidence = ?1, updated_at = ?2
             WHERE state = 'in_progress' AND (?3 IS NULL OR owner = ?3)
             RETURNING id, owner, route, idem_key",
        )?
        .query_map(params![evidence, now, owner], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
        })?
        .collect::<Result<_, _>>()?;
    for (id, owner, route, key) in &marked {
        let changed = Changed { id, route, key };
        let (from, to) = (Some(State::InProgress), Some(State::Unknown));
        transitions::moved(conn, changed, from, to, now, evidence)?;
        let event = Event {
            kind: "owner-lost",
            detail: serde_json::json!({ "reason": evidence, "owner": owner }),
        };
        insert_event(conn, id, now, &event)?;
    }
    Ok(marked.into_iter().map(|(_, _, route, _)| route).collect())
}

pub(crate) fn insert_event(
    conn: &Connection,
    operation_id: &str,
    at: i64,
    event: &Event,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO events (operation_id, at, kind, detail) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![
        operation_id,
        at,
        event.kind,
        event.detail.to_string()
    ])?;
    Ok(())
}

/// A probe's event that settled nothing, in place of the latest of a run
/// of probes with its verdict (`RequestPath::add_probe_event`): when the
/// operation's two latest events are such probes, the latest takes this
/// one's time and detail, its `probes` (`idemgate_store::PROBES`) one
/// more than it stood for; otherwise the event is appended.
pub fn add_probe_event(
    conn: &Connection,
    operation_id: &str,
    at: i64,
    event: &Event,
) -> Result<(), StoreError> {
    let verdict = event.detail["verdict"].as_str();
    let folded = conn
        .prepare_cached(
            "UPDATE events SET at = ?2,
                detail = json_set(?3, '$.probes', coalesce(json_extract(detail, '$.probes'), 1) + 1)
             WHERE id = (SELECT max(id) FROM events WHERE operation_id = ?1)
               AND ?4 IS NOT NULL
               AND (SELECT count(*) FROM (
                        SELECT kind, detail FROM events WHERE operation_id = ?1
                        ORDER BY id DESC LIMIT 2)
                    WHERE kind = ?5 AND json_extract(detail, '$.verdict') = ?4) = 2",
        )?
        .execute(params![
            operation_id,
            at,
            event.detail.to_string(),
            verdict,
            event.kind
        ])?;
    if folded == 0 {
        insert_event(conn, operation_id, at, event)?;
    }
    Ok(())
}

/// `unknown` → `completed` with evidence that came after the fact, unless
/// a probe found the write more than once at the destination (an
/// operator's to settle); the event is kept either way (when the operation
/// exists).
pub fn settle_held(
    conn: &Connection,
    seal: &Seal,
    now: i64,
    late: &LateEvidence,
) -> Result<bool, StoreError> {
    let LateEvidence {
        operation_id,
        response,
        ..
    } = late;
    let evidence = late.source.evidence();
    let Some(row) = stored_row(conn, operation_id)? else {
        return Ok(false);
    };
    let stored = seal.stored_form(operation_id, &row.identity, response);
    let updated = conn
        .prepare_cached(
            "UPDATE operations SET state = 'completed', evidence = ?1, response_status = ?2,
                response_headers = ?3, response_body = ?4, updated_at = ?5
             WHERE id = ?6 AND state = 'unknown' AND (?7 IS NULL OR attempt = ?7)
                AND evidence <> ?8",
        )?
        .execute(params![
            evidence,
            i64::from(response.status),
            stored.headers,
            stored.body,
            now,
            operation_id,
            late.source.attempt(),
            DUPLICATED,
        ])?;
    if updated == 1 {
        let (from, to) = (Some(State::Unknown), Some(State::Completed));
        transitions::moved(conn, row.changed(operation_id), from, to, now, evidence)?;
    }
    insert_event(conn, operation_id, now, &late.event)?;
    Ok(updated == 1)
}

/// A probe's finding about an operation still `unknown` at the probed
/// attempt and not found more than once before ([`Finding`]); the event is
/// kept either way (when the operation exists).
pub fn settle_probed(conn: &Connection, now: i64, probed: &Probed) -> Result<bool, StoreError> {
    let Probed {
        operation_id: id,
        attempt,
        finding,
        event,
    } = probed;
    let Some(row) = stored_row(conn, id)? else {
        return Ok(false);
    };
    let evidence = finding.evidence();
    let applied = match finding {
        Finding::Absent => {
            let updated = conn
                .prepare_cached(
                    "UPDATE operations SET state = 'not_attempted', evidence = ?1, updated_at = ?2
                     WHERE id = ?3 AND state = 'unknown' AND attempt = ?4 AND evidence <> ?5",
                )?
                .execute(params![evidence, now, id, attempt, DUPLICATED])?;
            if updated == 1 {
                let (from, to) = (Some(State::Unknown), Some(State::NotAttempted));
                transitions::moved(conn, row.changed(id), from, to, now, evidence)?;
            }
            updated == 1
        }
        Finding::Duplicated => {
            // `updated_at` stays: an `unknown` operation's is when it
            // became unknown (the stats' oldest, a probe's minimum age).
            // One its late response completed while the probe asked is at
            // the destination twice all the same: paused and alerted too,
            // its state (and response) kept.
            let state: Option<String> = conn
                .prepare_cached(
                    "UPDATE operations SET evidence = ?1
                     WHERE id = ?2 AND state IN ('unknown', 'completed') AND attempt = ?3
                       AND evidence <> ?1
                     RETURNING state",
                )?
                .query_row(params![evidence, id, attempt], |r| r.get(0))
                .optional()?;
            if let Some(state) = &state {
                transitions::duplicated(conn, row.changed(id), state, now)?;
                conn.prepare_cached(
                    "INSERT INTO route_pauses (route, reason, paused_by, updated_at)
                     VALUES (?1, 'a probe found operation ' || ?2 || ' more than once at the destination', 'probe', ?3)
                     ON CONFLICT (route) DO NOTHING",
                )?
                .execute(params![row.route, id, now])?;
            }
            state.is_some()
        }
    };
    insert_event(conn, id, now, event)?;
    Ok(applied)
}

/// Pauses `route` if at least `threshold` of its operations are `unknown`,
/// saying how many are; whether it is paused afterwards.
pub fn trip_pause_latch(
    conn: &Connection,
    now: i64,
    route: &str,
    threshold: u32,
) -> Result<bool, StoreError> {
    conn.prepare_cached(concat!(
        "INSERT INTO route_pauses (route, reason, paused_by, updated_at)
         SELECT ?1, 'pause_after_unknown: ' || held || ' operations unknown', 'latch', ?3
         FROM (SELECT count(*) AS held FROM operations WHERE route = ?1 AND state = 'unknown' AND ",
        not_in_progress!(),
        ") WHERE held >= ?2 ON CONFLICT (route) DO NOTHING"
    ))?
    .execute(params![route, threshold, now])?;
    let paused = conn
        .prepare_cached("SELECT 1 FROM route_pauses WHERE route = ?1")?
        .query_row(params![route], |_| Ok(()))
        .optional()?;
    Ok(paused.is_some())
}

pub fn paused_routes(conn: &Connection) -> Result<Vec<String>, StoreError> {
    Ok(conn
        .prepare_cached("SELECT route FROM route_pauses ORDER BY route")?
        .query_map([], |row| row.get(0))?
        .collect::<Result<_, _>>()?)
}

pub fn pauses(conn: &Connection) -> Result<Vec<RoutePause>, StoreError> {
    conn.prepare_cached("SELECT route, reason, paused_by FROM route_pauses ORDER BY route")?
        .query_map([], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get::<_, String>(2)?))
        })?
        .map(|row| {
            let (route, reason, by) = row?;
            Ok(RoutePause {
                route,
                reason,
                by: PausedBy::parse(&by)?,
            })
        })
        .collect()
}

pub fn set_paused(
    conn: &Connection,
    now: i64,
    route: &str,
    reason: Option<&str>,
) -> Result<(), StoreError> {
    match reason {
        Some(reason) => conn
            .prepare_cached(
                "INSERT INTO route_pauses (route, reason, paused_by, updated_at)
                 VALUES (?1, ?2, 'operator', ?3)
                 ON CONFLICT (route) DO UPDATE SET reason = excluded.reason,
                    paused_by = excluded.paused_by, updated_at = excluded.updated_at",
            )?
            .execute(params![route, reason, now])?,
        None => conn
            .prepare_cached("DELETE FROM route_pauses WHERE route = ?1")?
            .execute(params![route])?,
    };
    Ok(())
}

/// The operations `filter` selects, newest first, by its access path's
/// own statement ([`list_sql`]).
pub fn list(conn: &Connection, filter: &ListFilter) -> Result<Vec<Summary>, StoreError> {
    let mut statement = conn.prepare_cached(&list_sql(filter))?;
    let rows = statement.query_map(list_params(filter), summary_from_row)?;
    rows.map(|row| row?).collect()
}

/// [`duplicated`]'s statement: ?1 a route or NULL, ?2 a limit.
fn duplicated_sql() -> String {
    format!(
        "SELECT {SUMMARY_COLUMNS} FROM operations INDEXED BY operations_duplicated
         WHERE state = 'unknown' AND evidence = '{DUPLICATED}' AND (?1 IS NULL OR route = ?1)
         ORDER BY id DESC LIMIT ?2"
    )
}

/// The `unknown` operations found more than once at the destination, on
/// `route` or any, newest first.
pub fn duplicated(
    conn: &Connection,
    route: Option<&str>,
    limit: u32,
) -> Result<Vec<Summary>, StoreError> {
    let mut statement = conn.prepare_cached(&duplicated_sql())?;
    let rows = statement.query_map(params![route, limit], summary_from_row)?;
    rows.map(|row| row?).collect()
}

/// The statement of `filter`'s access path ([`ListPath`]), each a range of
/// one index read backwards from the cursor, so a page costs its rows
/// however many operations are stored. Every statement takes the same
/// parameters ([`list_params`]), using those it needs: ?1 state, ?2 route,
/// ?3 key, ?4 the cursor (a next page only), ?5 the limit.
fn list_sql(filter: &ListFilter) -> String {
    let page = if filter.before.is_some() {
        " AND id < ?4"
    } else {
        ""
    };
    let newest = |range: &str| {
        format!(
            "SELECT {SUMMARY_COLUMNS} FROM operations WHERE {range}{page}
             ORDER BY id DESC LIMIT ?5"
        )
    };
    // Ranges that each end at the limit on their own, merged in id order.
    let merged = |ranges: Vec<String>| {
        let ranges: Vec<String> = ranges
            .iter()
            .map(|range| format!("SELECT * FROM ({})", newest(range)))
            .collect();
        format!("{} ORDER BY id DESC LIMIT ?5", ranges.join(" UNION ALL "))
    };
    // `in_progress` operations have an index of their own (migration
    // 0012), by id: few, the ones in flight, so a route is filtered from
    // its rows.
    let in_flight = filter.state == Some(State::InProgress);
    let in_flight_on_route = format!("{IN_PROGRESS} AND route = ?2");
    match filter.path() {
        ListPath::All => newest("true"),
        ListPath::State if in_flight => newest(IN_PROGRESS),
        ListPath::State => newest(concat!("state = ?1 AND ", not_in_progress!())),
        ListPath::RouteState if in_flight => newest(&in_flight_on_route),
        ListPath::RouteState => newest(concat!(
            "route = ?2 AND state = ?1 AND ",
            not_in_progress!()
        )),
        // One range per state.
        ListPath::Route => merged(
            State::ALL
                .iter()
                .map(|state| match state {
                    State::InProgress => in_flight_on_route.clone(),
                    settled => format!(
                        "route = ?2 AND state = '{}' AND {}",
                        settled.as_str(),
                        not_in_progress!()
                    ),
                })
                .collect(),
        ),
        // The key's current operations (one per route and scope, by the
        // identity index) and its superseded ones (by their own index).
        ListPath::Key => merged(
            ["superseded_at IS NULL", "superseded_at IS NOT NULL"]
                .map(|which| {
                    format!(
                        "idem_key = ?3 AND {which}
                         AND (?1 IS NULL OR state = ?1) AND (?2 IS NULL OR route = ?2)"
                    )
                })
                .into(),
        ),
    }
}

/// The condition of `operations_in_progress`, the operations in flight.
const IN_PROGRESS: &str = "state = 'in_progress'";

/// [`list_sql`]'s parameters.
fn list_params(filter: &ListFilter) -> [Param; 5] {
    [
        filter.state.map(State::as_str).into(),
        filter.route.as_deref().into(),
        filter.key.as_deref().into(),
        filter.before.as_deref().into(),
        Param::Int(i64::from(filter.limit)),
    ]
}

/// [`get`]'s operation: ?1 its id.
fn get_sql() -> String {
    format!("SELECT {OPERATION_COLUMNS}, {SCOPE} FROM operations WHERE id = ?1")
}

pub fn get(
    conn: &Connection,
    seal: &Seal,
    id: &str,
) -> Result<Option<(Operation, Vec<StoredEvent>)>, StoreError> {
    let found = conn
        .prepare_cached(&get_sql())?
        .query_row(params![id], |row| {
            operation_from_row(row, seal, &row.get::<_, String>("scope")?)
        })
        .optional()?;
    let Some(operation) = found.transpose()? else {
        return Ok(None);
    };
    let events: Vec<StoredEvent> = conn
        .prepare_cached("SELECT at, kind, detail FROM events WHERE operation_id = ?1 ORDER BY id")?
        .query_map(params![id], |row| {
            let detail: String = row.get(2)?;
            Ok(StoredEvent {
                at: row.get(0)?,
                kind: row.get(1)?,
                detail: serde_json::from_str(&detail).unwrap_or(serde_json::Value::Null),
            })
        })?
        .collect::<Result<_, _>>()?;
    let events = timeline(&operation, events);
    Ok(Some((operation, events)))
}

/// The newest operation with `key` under any of the (route, scope) pairs:
/// under each pair, the current one (by the identity index) when there
/// is one, since it took the identity after every one it superseded;
/// otherwise the newest superseded one (by `operations_superseded`).
pub fn find_newest(
    conn: &Connection,
    scopes: &[(String, String)],
    key: &str,
) -> Result<Option<Summary>, StoreError> {
    let mut current = conn.prepare_cached(&find_newest_sql(false))?;
    let mut superseded = conn.prepare_cached(&find_newest_sql(true))?;
    let mut newest: Option<Summary> = None;
    for (route, scope) in scopes {
        let pair = params![route, scope, key];
        let found = match current.query_row(pair, summary_from_row).optional()? {
            None => superseded.query_row(pair, summary_from_row).optional()?,
            found => found,
        };
        if let Some(found) = found.transpose()?
            && newest.as_ref().is_none_or(|n| found.id > n.id)
        {
            newest = Some(found);
        }
    }
    Ok(newest)
}

/// [`find_newest`]'s look-up under one (?1 route, ?2 scope) pair of ?3
/// key: the current operation, or the newest `superseded` one.
fn find_newest_sql(superseded: bool) -> String {
    let which = if superseded {
        "superseded_at IS NOT NULL ORDER BY id DESC LIMIT 1"
    } else {
        "superseded_at IS NULL"
    };
    format!(
        "SELECT {SUMMARY_COLUMNS} FROM operations
         WHERE idem_key = ?3 AND route = ?1 AND scope = unhex(?2) AND {which}"
    )
}

/// An operator's decision, allowed from `unknown` or from `in_progress`
/// whose owner is not this process (so is dead: one process per store),
/// and, given (`at`'s third), only at the attempt the operator checked.
pub fn resolve(
    conn: &Connection,
    seal: &Seal,
    owner: &str,
    (now, id, attempt): (i64, &str, Option<u32>),
    decision: &Decision,
    event: &Event,
) -> Result<Resolved, StoreError> {
    let (state, response) = decision.outcome();
    let Some(row) = stored_row(conn, id)? else {
        return Ok(Resolved::NotFound);
    };
    // Nothing writes between this read and the update: this call holds
    // the writer.
    if attempt.is_some_and(|a| a != row.attempt) {
        return Ok(Resolved::OtherAttempt {
            attempt: row.attempt,
            state: row.state,
        });
    }
    if state == State::NotAttempted && row.state == State::Unknown && row.evidence == DUPLICATED {
        return Ok(Resolved::FoundAtDestination);
    }
    let stored = response.map(|r| seal.stored_form(id, &row.identity, r));
    let updated = conn
        .prepare_cached(
            "UPDATE operations SET state = ?1, evidence = ?9, response_status = ?2,
                response_headers = ?3, response_body = ?4, updated_at = ?5
             WHERE id = ?6
               AND (state = 'unknown' OR (state = 'in_progress' AND owner IS NOT ?7))
               AND (?8 IS NULL OR attempt = ?8)",
        )?
        .execute(params![
            state.as_str(),
            response.map(|r| i64::from(r.status)),
            stored.as_ref().map(|s| s.headers.as_str()),
            stored.as_ref().and_then(|s| s.body.as_deref()),
            now,
            id,
            owner,
            attempt,
            decision.evidence(),
        ])?;
    if updated == 0 {
        // Nothing wrote since the read: this call holds the writer.
        return Ok(Resolved::NotResolvable(row.state));
    }
    // The row's state before the update is the one read above, for the
    // same reason.
    transitions::moved(
        conn,
        row.changed(id),
        Some(row.state),
        Some(state),
        now,
        "operator",
    )?;
    insert_event(conn, id, now, event)?;
    Ok(Resolved::Done)
}

/// Counts from `operation_counts`, which every write keeps in its own
/// transaction ([`transitions`]); the oldest `unknown` operation from
/// the `(state, updated_at)` index. Neither reads more as the table grows.
pub fn stats(conn: &Connection) -> Result<Stats, StoreError> {
    let counts = conn
        .prepare_cached(
            "SELECT route, state, n FROM operation_counts WHERE n <> 0 ORDER BY route, state",
        )?
        .query_map([], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, i64>(2)?,
            ))
        })?
        .map(|row| {
            let (route, state, n) = row?;
            Ok((route, State::parse(&state)?, operation_count(n)?))
        })
        .collect::<Result<_, StoreError>>()?;
    let oldest_unknown_since = conn
        .prepare_cached(OLDEST_UNKNOWN)?
        .query_row([], |row| row.get(0))?;
    Ok(Stats {
        counts,
        oldest_unknown_since,
        replication: None,
    })
}

/// Served by `operations_state_updated` alone (see the test below).
const OLDEST_UNKNOWN: &str = concat!(
    "SELECT min(updated_at) FROM operations WHERE state = 'unknown' AND ",
    not_in_progress!()
);

/// Recounts `operation_counts` from the table, unless [`COUNTS_ROW`]
/// says they are exact: whether it recounted. Run by the writer at open,
/// so nothing writes between the count and the mark.
pub(crate) fn recount_if_untrusted(conn: &Connection) -> Result<bool, StoreError> {
    if meta(conn, COUNTS_ROW)?.as_deref() == Some(COUNTS_EXACT) {
        return Ok(false);
    }
    conn.prepare_cached("DELETE FROM operation_counts")?
        .execute([])?;
    conn.prepare_cached(
        "INSERT INTO operation_counts (route, state, n)
         SELECT route, state, count(*) FROM operations GROUP BY route, state",
    )?
    .execute([])?;
    transitions::recounted();
    set_meta(conn, COUNTS_ROW, COUNTS_EXACT)?;
    Ok(true)
}

/// Deletes up to `limit` (at most [`SWEEP_LIMIT`]) settled operations
/// last updated before `cutoff`, found by `operations_state_updated`.
pub fn sweep(conn: &Connection, cutoff: i64, limit: u32) -> Result<u64, StoreError> {
    let swept: Vec<(String, String, String)> = conn
        .prepare_cached(SWEEP)?
        .query_map(params![cutoff, limit.min(SWEEP_LIMIT)], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
        })?
        .collect::<Result<_, _>>()?;
    let mut delete = conn.prepare_cached("DELETE FROM operations WHERE id = ?1")?;
    let mut by_route_state: Vec<((&str, &str), i64)> = Vec::new();
    for (id, route, state) in &swept {
        delete.execute(params![id])?;
        match by_route_state
            .iter_mut()
            .find(|(at, _)| *at == (route.as_str(), state.as_str()))
        {
            Some((_, n)) => *n += 1,
            None => by_route_state.push(((route, state), 1)),
        }
    }
    for ((route, state), n) in by_route_state {
        transitions::counted(conn, route, Some(State::parse(state)?), None, n)?;
    }
    Ok(swept.len() as u64)
}

/// What [`sweep`] deletes: ?1 the cutoff, ?2 the limit.
const SWEEP: &str = concat!(
    "SELECT id, route, state FROM operations
        WHERE state IN ('completed', 'not_attempted') AND ",
    not_in_progress!(),
    " AND updated_at < ?1 LIMIT ?2"
);

/// The statements of the admin API, the console and retention, with
/// sample parameters ([`AccessPath`]); the alerts' are the outbox's.
pub(crate) fn access_paths() -> Vec<AccessPath> {
    let pair = || vec![Param::text("api"), Param::text("scope"), Param::text("k")];
    let mut paths: Vec<AccessPath> = ListFilter::samples()
        .into_iter()
        .map(|(name, filter)| AccessPath {
            name,
            sql: list_sql(&filter),
            index: list_index(&filter),
            bound: filter.before.is_some().then_some("id<"),
            params: list_params(&filter).into(),
        })
        .collect();
    paths.extend([
        AccessPath {
            name: "get".into(),
            sql: get_sql(),
            index: "sqlite_autoindex_operations_1",
            bound: None,
            params: vec![Param::text("01900000-0000-7000-8000-000000000000")],
        },
        AccessPath {
            name: "find_newest, current".into(),
            sql: find_newest_sql(false),
            index: "operations_identity",
            bound: None,
            params: pair(),
        },
        AccessPath {
            name: "find_newest, superseded".into(),
            sql: find_newest_sql(true),
            index: "operations_superseded",
            bound: None,
            params: pair(),
        },
        AccessPath {
            name: "sweep".into(),
            sql: SWEEP.into(),
            index: "operations_state_updated",
            bound: Some("updated_at<"),
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
                Param::text(&"0".repeat(64)),
                Param::text(&"1".repeat(64)),
                Param::text("k"),
            ],
        },
    ]);
    paths
}

/// The index that serves `filter`'s path in SQLite's names.
fn list_index(filter: &ListFilter) -> &'static str {
    let in_flight = filter.state == Some(State::InProgress);
    match filter.path() {
        ListPath::All => "sqlite_autoindex_operations_1",
        ListPath::State | ListPath::RouteState if in_flight => "operations_in_progress",
        ListPath::State => "operations_state_id",
        ListPath::RouteState | ListPath::Route => "operations_route_state_id",
        // The superseded range is the one a next page bounds; the current
        // one is the identity index's, the only other index that leads
        // with the key (`a_new_key_enters_one_large_index_at_a_random_place`).
        ListPath::Key => "operations_superseded",
    }
}

/// The value of the store's meta row `name`.
pub fn meta(conn: &Connection, name: &str) -> Result<Option<String>, StoreError> {
    Ok(conn
        .prepare_cached("SELECT value FROM store_meta WHERE name = ?1")?
        .query_row(params![name], |row| row.get(0))
        .optional()?)
}

/// Whether the store holds any operation.
pub(crate) fn holds_operations(conn: &Connection) -> Result<bool, StoreError> {
    Ok(conn
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM operations)")?
        .query_row([], |row| row.get(0))?)
}

pub(crate) fn set_meta(conn: &Connection, name: &str, value: &str) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO store_meta (name, value) VALUES (?1, ?2)
         ON CONFLICT (name) DO UPDATE SET value = excluded.value",
    )?
    .execute(params![name, value])?;
    Ok(())
}

/// The routes' identity settings kept in `store_meta`, by route name.
pub(crate) fn route_settings(conn: &Connection) -> Result<Vec<(String, String)>, StoreError> {
    let mut statement = conn.prepare_cached(
        "SELECT substr(name, length(?1) + 1), value FROM store_meta
         WHERE substr(name, 1, length(?1)) = ?1",
    )?;
    let rows = statement.query_map(params![ROUTE_SETTINGS_ROW], |row| {
        Ok((row.get(0)?, row.get(1)?))
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Keeps each route's identity settings, or forgets them (`None`).
pub(crate) fn keep_route_settings(
    conn: &Connection,
    settings: &[(String, Option<String>)],
) -> Result<(), StoreError> {
    for (route, kept) in settings {
        let name = format!("{ROUTE_SETTINGS_ROW}{route}");
        match kept {
            Some(value) => set_meta(conn, &name, value)?,
            None => {
                conn.prepare_cached("DELETE FROM store_meta WHERE name = ?1")?
                    .execute(params![name])?;
            }
        }
    }
    Ok(())
}

/// The `store_meta` row [`readiness_write`] counts in.
const READINESS_ROW: &str = "readiness-writes";

/// Readiness (`Maintenance::ping`): a write that must reach the log. A
/// transaction that writes nothing commits even when the disk is full or
/// the log cannot grow, while every claim fails; this one dirties a page,
/// so its commit appends a frame to the log, and the writer answers it
/// only once that frame is as durable as any write's. It counts, so the
/// row changes every time: SQLite writes nothing for an update that
/// leaves a row as it was.
pub(crate) fn readiness_write(conn: &Connection) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO store_meta (name, value) VALUES (?1, '1')
         ON CONFLICT (name) DO UPDATE SET value = CAST(CAST(value AS INTEGER) + 1 AS TEXT)",
    )?
    .execute(params![READINESS_ROW])?;
    Ok(())
}

/// Keys the scopes of a store written before scopes were keyed, and
/// keeps `key`'s canary: the number of operations keyed then, `None` when
/// the store was keyed already with `key`; an error for another key.
pub(crate) fn key_scopes(conn: &Connection, key: &ScopeKey) -> Result<Option<u64>, StoreError> {
    match meta(conn, scope_key::CANARY_ROW)? {
        Some(canary) if canary == key.canary() => return Ok(None),
        Some(_) => return Err(key.wrong().into()),
        None => {}
    }
    let scopes: Vec<(String, String)> = conn
        .prepare_cached(&format!("SELECT id, {SCOPE} FROM operations"))?
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let mut update =
        conn.prepare_cached("UPDATE operations SET scope = unhex(?1) WHERE id = ?2")?;
    for (id, scope) in &scopes {
        update.execute(params![key.keyed(scope), id])?;
    }
    set_meta(conn, scope_key::CANARY_ROW, &key.canary())?;
    Ok(Some(scopes.len() as u64))
}

/// Seals again, under the current key, the payloads of up to `limit`
/// operations after `after` (by id) that are plain or under another key;
/// each update is a compare-and-set on the values it read.
pub fn rekey(
    conn: &Connection,
    seal: &Seal,
    after: &str,
    limit: u32,
) -> Result<RekeyBatch, StoreError> {
    let rows: Vec<(String, Identity, Option<i64>, Payloads)> = conn
        .prepare_cached(&format!(
            "SELECT id, {IDENTITY_COLUMNS}, response_status, request_body, response_headers,
                response_body
             FROM operations WHERE id > ?1 ORDER BY id LIMIT ?2"
        ))?
        .query_map(params![after, limit], |row| {
            Ok((
                row.get("id")?,
                identity_from_row(row)?,
                row.get("response_status")?,
                Payloads {
                    response_status: None,
                    request_body: row.get("request_body")?,
                    response_headers: row.get("response_headers")?,
                    response_body: row.get("response_body")?,
                },
            ))
        })?
        .collect::<Result<_, _>>()?;
    let mut resealed = 0;
    for (id, identity, status, stored) in &rows {
        let stored = &Payloads {
            response_status: status.map(status_of).transpose()?,
            ..stored.clone()
        };
        let Some(new) = seal.reseal(id, identity, stored)? else {
            continue;
        };
        resealed += conn
            .prepare_cached(
                "UPDATE operations SET request_body = ?1, response_headers = ?2, response_body = ?3
                 WHERE id = ?4 AND request_body IS ?5 AND response_headers IS ?6
                   AND response_body IS ?7",
            )?
            .execute(params![
                new.request_body,
                new.response_headers,
                new.response_body,
                id,
                stored.request_body,
                stored.response_headers,
                stored.response_body,
            ])? as u64;
    }
    Ok(RekeyBatch {
        last: rows.last().map(|(id, ..)| id.clone()),
        operations: rows.len() as u64,
        resealed,
    })
}

/// A row of [`OPERATION_COLUMNS`]; the outer `Result` is SQLite's, the
/// inner one says whether the values make sense.
/// Sealed payloads are opened here: a value that does not open fails the
/// row, never passes as bytes.
///
/// `scope` is the row's: the claim's and `find`'s queries select by it.
fn operation_from_row(
    row: &Row,
    seal: &Seal,
    scope: &str,
) -> rusqlite::Result<Result<Operation, StoreError>> {
    let status: Option<i64> = row.get("response_status")?;
    let headers: Option<String> = row.get("response_headers")?;
    let body: Option<Vec<u8>> = row.get("response_body")?;
    let body_size: i64 = row.get("request_body_size")?;
    let superseded_at: Option<i64> = row.get("superseded_at")?;
    let fingerprint: String = row.get("fingerprint")?;
    let evidence: String = row.get("evidence")?;
    let owner: Option<String> = row.get("owner")?;
    let request = RequestSummary {
        method: row.get("request_method")?,
        path: row.get("request_path")?,
        content_type: row.get("request_content_type")?,
        body_size: u64::try_from(body_size).unwrap_or(0),
        body_sha256: row.get("request_body_sha256")?,
        body: row.get("request_body")?,
    };
    let summary = summary_from_row(row)?;
    Ok((|| {
        let summary = summary?;
        let id = &summary.id;
        let identity = Identity::of(&summary.route, scope, &summary.key, &fingerprint);
        let response = match status {
            Some(status) => Some(seal.open_response(
                id,
                &identity,
                status_of(status)?,
                headers.as_deref(),
                body,
            )?),
            None => None,
        };
        let request = RequestSummary {
            body: seal.open_request_body(id, &identity, request.body)?,
            ..request
        };
        Ok(Operation {
            id: summary.id,
            route: summary.route,
            key: summary.key,
            fingerprint: Fingerprint::from_stored(fingerprint),
            state: summary.state,
            attempt: summary.attempt,
            owner,
            evidence,
            response,
            request,
            superseded: superseded_at.is_some(),
            created_at: summary.created_at,
            updated_at: summary.updated_at,
        })
    })())
}

/// A stored `response_status`.
fn status_of(status: i64) -> Result<u16, StoreError> {
    u16::try_from(status).map_err(|_| StoreError::Corrupt(format!("status {status}")))
}

/// What a change to a stored operation needs to know of it first.
struct StoredRow {
    /// What its sealed values are bound to.
    identity: Identity,
    route: String,
    key: String,
    state: State,
    attempt: u32,
    evidence: String,
}

impl StoredRow {
    fn changed<'a>(&'a self, id: &'a str) -> Changed<'a> {
        Changed {
            id,
            route: &self.route,
            key: &self.key,
        }
    }
}

/// Operation `id` as [`StoredRow`]; `None` when there is no such operation.
/// Whether operation `id` is stored.
fn operation_exists(conn: &Connection, id: &str) -> Result<bool, StoreError> {
    Ok(conn
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM operations WHERE id = ?1)")?
        .query_row(params![id], |row| row.get(0))?)
}

fn stored_row(conn: &Connection, id: &str) -> Result<Option<StoredRow>, StoreError> {
    let row = conn
        .prepare_cached(&format!(
            "SELECT {IDENTITY_COLUMNS}, state, attempt, evidence FROM operations WHERE id = ?1"
        ))?
        .query_row(params![id], |row| {
            Ok((
                identity_from_row(row)?,
                row.get::<_, String>("route")?,
                row.get::<_, String>("idem_key")?,
                row.get::<_, String>("state")?,
                row.get::<_, i64>("attempt")?,
                row.get::<_, String>("evidence")?,
            ))
        })
        .optional()?;
    row.map(|(identity, route, key, state, attempt, evidence)| {
        Ok(StoredRow {
            identity,
            route,
            key,
            state: State::parse(&state)?,
            attempt: u32::try_from(attempt)
                .map_err(|_| StoreError::Corrupt(format!("attempt {attempt}")))?,
            evidence,
        })
    })
    .transpose()
}

fn identity_from_row(row: &Row) -> rusqlite::Result<Identity> {
    let text = |column: &str| row.get::<_, String>(column);
    Ok(Identity::of(
        &text("route")?,
        &text("scope")?,
        &text("idem_key")?,
        &text("fingerprint")?,
    ))
}

fn summary_from_row(row: &Row) -> rusqlite::Result<Result<Summary, StoreError>> {
    let attempt: i64 = row.get("attempt")?;
    let state: String = row.get("state")?;
    let (id, route, key): (String, String, String) =
        (row.get("id")?, row.get("route")?, row.get("idem_key")?);
    let (created_at, updated_at) = (row.get("created_at")?, row.get("updated_at")?);
    Ok((|| {
        Ok(Summary {
            id,
            route,
            key,
            state: State::parse(&state)?,
            attempt: u32::try_from(attempt)
                .map_err(|_| StoreError::Corrupt(format!("attempt {attempt}")))?,
            created_at,
            updated_at,
        })
    })())
}

#[cfg(test)]
mod tests {
    use rusqlite::Connection;

    /// Migrations 0001 to 0004: the schema before the kept counts.
    fn before_counts() -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        for sql in [
            include_str!("../migrations/0001_operations.sql"),
            include_str!("../migrations/0002_state_check_without_in_list.sql"),
            include_str!("../migrations/0003_store_meta.sql"),
            include_str!("../migrations/0004_alert_outbox.sql"),
        ] {
            conn.execute_batch(sql).unwrap();
        }
        conn
    }

    const COUNTS_MIGRATION: &str = include_str!("../migrations/0005_operation_counts.sql");

    const DIGESTS_MIGRATION: &str = include_str!("../migrations/0007_digests_as_bytes.sql");

    const PAUSE_KIND_MIGRATION: &str = include_str!("../migrations/0008_pause_kind.sql");

    /// Migrations 0001 to 0007: the schema before the pause kind.
    fn before_pause_kind() -> Connection {
        let conn = before_counts();
        for sql in [
            COUNTS_MIGRATION,
            include_str!("../migrations/0006_access_paths.sql"),
            DIGESTS_MIGRATION,
        ] {
            conn.execute_batch(sql).unwrap();
        }
        conn
    }

    /// Every migration: the schema a store has.
    fn migrated() -> Connection {
        let conn = before_pause_kind();
        conn.execute_batch(PAUSE_KIND_MIGRATION).unwrap();
        for migration in [
            include_str!("../migrations/0010_transitions_without_triggers.sql"),
            include_str!("../migrations/0011_identity_key_first.sql"),
            include_str!("../migrations/0012_state_indexes_without_in_progress.sql"),
            include_str!("../migrations/0013_held_twins.sql"),
        ] {
            conn.execute_batch(migration).unwrap();
        }
        conn
    }

    /// Migration 0008 keeps who paused each route stored before it, when
    /// only the latch's reason prefix told: afterwards the column says it,
    /// and an operator's reason that merely looks like the latch's is an
    /// operator's pause (the prefix rule called it the latch's).
    #[test]
    fn the_pause_kind_migration_keeps_who_paused() {
        use super::{PausedBy, RoutePause, pauses, set_paused, trip_pause_latch};
        let conn = before_pause_kind();
        conn.execute_batch(
            "INSERT INTO route_pauses (route, reason, updated_at) VALUES
                ('api', 'pause_after_unknown: 3 operations unknown', 1),
                ('ops', 'maintenance', 2);",
        )
        .unwrap();
        conn.execute_batch(PAUSE_KIND_MIGRATION).unwrap();
        let pause = |route: &str, reason: &str, by| RoutePause {
            route: route.into(),
            reason: reason.into(),
            by,
        };
        assert_eq!(
            pauses(&conn).unwrap(),
            [
                pause(
                    "api",
                    "pause_after_unknown: 3 operations unknown",
                    PausedBy::Latch
                ),
                pause("ops", "maintenance", PausedBy::Operator),
            ]
        );
        // An operator's pause over the latch's is the operator's; one whose
        // reason copies the latch's words is still the operator's.
        set_paused(&conn, 3, "api", Some("looked at it")).unwrap();
        set_paused(
            &conn,
            4,
            "ops",
            Some("pause_after_unknown: 9 operations unknown"),
        )
        .unwrap();
        let by: Vec<_> = pauses(&conn).unwrap().iter().map(|p| p.by).collect();
        assert_eq!(by, [PausedBy::Operator, PausedBy::Operator]);
        // The latch does not take over a pause already there.
        assert!(trip_pause_latch(&conn, 5, "api", 0).unwrap());
        assert_eq!(pauses(&conn).unwrap()[0].by, PausedBy::Operator);
        set_paused(&conn, 6, "api", None).unwrap();
        assert!(trip_pause_latch(&conn, 7, "api", 0).unwrap());
        assert_eq!(pauses(&conn).unwrap()[0].by, PausedBy::Latch);
    }

    /// Inserts an operation as the schema before 0007 kept it: digests as
    /// hex text.
    fn insert_hex(conn: &Connection, id: &str, scope: &str, fingerprint: &str) {
        conn.execute(
            "INSERT INTO operations (id, route, scope, idem_key, fingerprint, state, attempt,
                evidence, request_method, request_path, request_body_size,
                request_body_sha256, created_at, updated_at)
             VALUES (?1, 'api', ?2, ?1, ?3, 'completed', 1, 'e', 'POST', '/', 0, ?3, 1, 1)",
            rusqlite::params![id, scope, fingerprint],
        )
        .unwrap();
    }

    /// Migration 0007 keeps each digest as the bytes its hex spelled, so
    /// the store's `lower(hex(...))` reads back exactly what was written.
    #[test]
    fn the_digests_migration_keeps_each_digest_as_its_bytes() {
        let conn = before_counts();
        conn.execute_batch(COUNTS_MIGRATION).unwrap();
        let (scope, fingerprint) = ("ab".repeat(32), "0f".repeat(32));
        insert_hex(&conn, "1", &scope, &fingerprint);
        conn.execute_batch(DIGESTS_MIGRATION).unwrap();
        let (bytes, read): (Vec<u8>, String) = conn
            .query_row(
                &format!("SELECT scope, {} FROM operations", super::SCOPE),
                [],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .unwrap();
        assert_eq!(bytes, [0xab; 32]);
        assert_eq!(read, scope);
        let identity: (String, String) = conn
            .query_row(
                &format!("SELECT {} FROM operations", super::IDENTITY_COLUMNS),
                [],
                |row| Ok((row.get("scope")?, row.get("fingerprint")?)),
            )
            .unwrap();
        assert_eq!(identity, (scope, fingerprint));
        let stats = super::stats(&conn).unwrap();
        assert_eq!(stats.counts.len(), 1, "the counts stay exact");
    }

    /// A digest that is not hex fails the migration rather than becoming
    /// a digest its operation no longer matches.
    #[test]
    fn the_digests_migration_refuses_what_is_not_hex() {
        let conn = before_counts();
        conn.execute_batch(COUNTS_MIGRATION).unwrap();
        insert_hex(&conn, "1", "not hex", &"0f".repeat(32));
        let error = conn
            .execute_batch(&format!("BEGIN; {DIGESTS_MIGRATION} COMMIT;"))
            .unwrap_err();
        assert!(error.to_string().contains("NOT NULL"), "{error}");
    }

    /// Migration 0005 counts the operations stored before it once, and
    /// marks the counts exact.
    #[test]
    fn the_counts_migration_counts_what_is_stored() {
        let conn = before_counts();
        for (id, route, state) in [
            ("1", "api", "completed"),
            ("2", "api", "completed"),
            ("3", "api", "unknown"),
            ("4", "billing", "completed"),
        ] {
            conn.execute(
                "INSERT INTO operations (id, route, scope, idem_key, fingerprint, state, attempt,
                    evidence, request_method, request_path, request_body_size,
                    request_body_sha256, created_at, updated_at)
                 VALUES (?1, ?2, 's', ?1, 'f', ?3, 1, 'e', 'POST', '/', 0, '', 1, 1)",
                rusqlite::params![id, route, state],
            )
            .unwrap();
        }
        conn.execute_batch(COUNTS_MIGRATION).unwrap();
        let stats = super::stats(&conn).unwrap();
        let counts: Vec<_> = stats
            .counts
            .iter()
            .map(|(route, state, n)| (route.as_str(), state.as_str(), *n))
            .collect();
        assert_eq!(
            counts,
            [
                ("api", "completed", 2),
                ("api", "unknown", 1),
                ("billing", "completed", 1)
            ]
        );
        assert!(!super::recount_if_untrusted(&conn).unwrap(), "marked exact");
    }

    /// No trigger is left on `operations` (migration 0010): one would make
    /// SQLite keep a statement journal for every claim and record again
    /// (`transitions`). The counts and the alerts are the statements' own.
    #[test]
    fn no_trigger_fires_on_operations() {
        let conn = migrated();
        let triggers: Vec<String> = conn
            .prepare(
                "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'operations'",
            )
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(triggers, Vec::<String>::new());
    }

    /// A first write enters one large index at a random place, the
    /// identity index that leads with its key (migration 0011); the others
    /// lead with a value that grows (`id`) or one of a few (`state`,
    /// `route`), so a batch's new operations share their pages, or hold
    /// only the operations in flight or held (`operations_held_twins`,
    /// migration 0013: a few pages however large the store). The superseded
    /// ones have an index of their own, which no first write enters; the
    /// three that hold `state` take no `in_progress` operation, which has
    /// its own (migration 0012): a claim enters the primary key's index,
    /// the identity index, the one of the operations in flight and the one
    /// of those in flight or held.
    #[test]
    fn a_new_key_enters_one_large_index_at_a_random_place() {
        let conn = migrated();
        let indexes: Vec<(String, String, bool)> = conn
            .prepare(
                "SELECT list.name, info.name, list.partial
                 FROM pragma_index_list('operations') AS list,
                      pragma_index_info(list.name) AS info
                 WHERE info.seqno = 0 ORDER BY list.name",
            )
            .unwrap()
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let indexes: Vec<(&str, &str, bool)> = indexes
            .iter()
            .map(|(name, first, partial)| (name.as_str(), first.as_str(), *partial))
            .collect();
        assert_eq!(
            indexes,
            [
                ("operations_held_twins", "route", true),
                ("operations_identity", "idem_key", true),
                ("operations_in_progress", "id", true),
                ("operations_route_state_id", "route", true),
                ("operations_state_id", "state", true),
                ("operations_state_updated", "state", true),
                ("operations_superseded", "idem_key", true),
                ("sqlite_autoindex_operations_1", "id", false),
            ]
        );
    }

    /// The steps of `sql`'s query plan, its parameters all NULL.
    fn query_plan(conn: &Connection, sql: &str) -> Vec<String> {
        let mut explain = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let unbound = vec![rusqlite::types::Null; explain.parameter_count()];
        explain
            .query_map(rusqlite::params_from_iter(unbound), |row| row.get(3))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    /// The oldest unknown operation is read from `operations_state_updated`
    /// alone, never from the table's rows.
    #[test]
    fn the_oldest_unknown_is_read_from_the_state_index() {
        let conn = migrated();
        let plan = query_plan(&conn, super::OLDEST_UNKNOWN);
        assert_eq!(
            plan,
            ["SEARCH operations USING COVERING INDEX operations_state_updated (state=?)"]
        );
    }

    /// A first write's record finds its row by the rowid its claim gave it,
    /// without seeking the index of the ids.
    #[test]
    fn a_first_writes_record_seeks_no_index() {
        let conn = migrated();
        let plan = query_plan(&conn, super::RECORD_BY_ROW);
        assert_eq!(
            plan,
            ["SEARCH operations USING INTEGER PRIMARY KEY (rowid=?)"]
        );
    }

    /// The statements every first write runs, on the schema the migrations
    /// make, build no temporary b-tree: SQLite would build one per row for
    /// an IN list of more than two values in a CHECK, which once cost a
    /// third of the writer's work.
    #[test]
    fn hot_statements_build_no_temporary_index() {
        let conn = migrated();
        for sql in [super::INSERT_CLAIMED, super::RECORD_BY_ROW, super::RECORD] {
            let mut explain = conn.prepare(&format!("EXPLAIN {sql}")).unwrap();
            let unbound = vec![rusqlite::types::Null; explain.parameter_count()];
            let opcodes: Vec<String> = explain
                .query_map(rusqlite::params_from_iter(unbound), |row| row.get(1))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            assert!(
                !opcodes.iter().any(|op| op == "OpenEphemeral"),
                "{sql}: {opcodes:?}"
            );
        }
    }
}
