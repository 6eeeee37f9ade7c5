//! The SQLite backend: the default store, for one gateway process.
//!
//! Invariants:
//! - one process at a time: an exclusive `flock` on `<file>.lock`, held for the
//!   store's life and released by the kernel when the process dies, so every
//!   `in_progress` row found at open belongs to a dead owner and becomes
//!   `unknown` (`gateway-restarted`, [`Store::recover`]) before the first
//!   request is served;
//! - one writer: the pool has a single connection, so transactions never race
//!   each other and a claim's look-up and insert are atomic;
//! - WAL journal; `durability = "full"` fsyncs every commit, `"normal"`
//!   survives a process crash but not a power loss.

use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{Row, Sqlite, Transaction};

use super::{
    Claim, ClaimResult, Decision, Event, ListFilter, NewOperation, Operation, Recorded,
    RequestSummary, Resolved, Settlement, State, Stats, Store, StoreError, StoredEvent,
    StoredResponse, Summary, decode_headers, encode_headers,
};
use crate::clock::Clock;
use crate::config::Durability;
use crate::pipeline::fingerprint::Fingerprint;

/// How long a request waits for the writer before the store counts as busy (503).
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

pub struct SqliteStore {
    pool: SqlitePool,
    /// This process's instance id, written as `owner` on every claim.
    owner: String,
    /// The held lock file; `None` once closed. std Mutex: never held across `.await`.
    lock: Mutex<Option<File>>,
    clock: Arc<dyn Clock>,
}

impl SqliteStore {
    /// Locks, opens (creating it if needed) and migrates the store; what a
    /// dead owner left `in_progress` waits for [`Store::recover`].
    pub async fn open(
        path: &Path,
        durability: Durability,
        owner: String,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, StoreError> {
        let store_name = format!("sqlite://{}", path.display());
        let lock = lock_file(path, &store_name)?;
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(match durability {
                Durability::Full => SqliteSynchronous::Full,
                Durability::Normal => SqliteSynchronous::Normal,
            })
            .foreign_keys(true)
            .busy_timeout(ACQUIRE_TIMEOUT);
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options)
            .await
            .map_err(|e| StoreError::Open {
                store: store_name.clone(),
                reason: e.to_string(),
            })?;
        sqlx::migrate!("migrations/sqlite")
            .run(&pool)
            .await
            .map_err(|e| StoreError::Open {
                store: store_name.clone(),
                reason: format!("migration failed: {e}"),
            })?;
        Ok(SqliteStore {
            pool,
            owner,
            lock: Mutex::new(Some(lock)),
            clock,
        })
    }

    /// Inserts a new operation, claimed for its first attempt.
    async fn insert(
        &self,
        tx: &mut Transaction<'_, Sqlite>,
        new: &NewOperation,
        now: i64,
    ) -> Result<Claim, StoreError> {
        let id = uuid::Uuid::now_v7().to_string();
        let request = &new.request;
        sqlx::query(
            "INSERT INTO operations (id, route, scope, idem_key, fingerprint, state, attempt, owner, evidence,
                request_method, request_path, request_content_type, request_body_size, request_body_sha256,
                request_body, created_at, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, 'in_progress', 1, ?6, 'claimed', ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?13)",
        )
        .bind(&id)
        .bind(&new.route)
        .bind(&new.scope)
        .bind(&new.key)
        .bind(new.fingerprint.as_str())
        .bind(&self.owner)
        .bind(&request.method)
        .bind(&request.path)
        .bind(&request.content_type)
        .bind(request.body_size as i64)
        .bind(&request.body_sha256)
        .bind(&request.body)
        .bind(now)
        .execute(&mut **tx)
        .await?;
        Ok(Claim {
            operation_id: id,
            attempt: 1,
        })
    }

    /// `in_progress` → `unknown` with `evidence`, for one owner or for all;
    /// the routes of the operations marked, one entry per operation.
    async fn mark_in_progress_unknown(
        &self,
        evidence: &str,
        owner: Option<&str>,
    ) -> Result<Vec<String>, StoreError> {
        let now = self.clock.now_millis();
        let mut tx = self.pool.begin().await?;
        let ids: Vec<(String, Option<String>, String)> = sqlx::query_as(
            "UPDATE operations SET state = 'unknown', evidence = ?1, updated_at = ?2
             WHERE state = 'in_progress' AND (?3 IS NULL OR owner = ?3) RETURNING id, owner, route",
        )
        .bind(evidence)
        .bind(now)
        .bind(owner)
        .fetch_all(&mut *tx)
        .await?;
        for (id, owner, _) in &ids {
            let event = Event {
                kind: "owner-lost",
                detail: serde_json::json!({ "reason": evidence, "owner": owner }),
            };
            insert_event(&mut tx, id, now, &event).await?;
        }
        tx.commit().await?;
        Ok(ids.into_iter().map(|(_, _, route)| route).collect())
    }
}

fn lock_file(path: &Path, store_name: &str) -> Result<File, StoreError> {
    let mut lock_path = PathBuf::from(path);
    lock_path.as_mut_os_string().push(".lock");
    let lock_name = lock_path.display().to_string();
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| StoreError::Open {
            store: store_name.to_string(),
            reason: format!("lock file {lock_name}: {e}"),
        })?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(TryLockError::WouldBlock) => Err(StoreError::Locked {
            store: store_name.to_string(),
            lock: lock_name,
        }),
        Err(TryLockError::Error(e)) => Err(StoreError::Open {
            store: store_name.to_string(),
            reason: format!("lock file {lock_name}: {e}"),
        }),
    }
}

async fn insert_event(
    tx: &mut Transaction<'_, Sqlite>,
    operation_id: &str,
    at: i64,
    event: &Event,
) -> Result<(), StoreError> {
    sqlx::query("INSERT INTO events (operation_id, at, kind, detail) VALUES (?1, ?2, ?3, ?4)")
        .bind(operation_id)
        .bind(at)
        .bind(event.kind)
        .bind(event.detail.to_string())
        .execute(&mut **tx)
        .await?;
    Ok(())
}

fn operation_from_row(row: &SqliteRow) -> Result<Operation, StoreError> {
    let status: Option<i64> = row.try_get("response_status")?;
    let response = match status {
        Some(status) => {
            let headers: Option<String> = row.try_get("response_headers")?;
            Some(StoredResponse {
                status: u16::try_from(status)
                    .map_err(|_| StoreError::Corrupt(format!("status {status}")))?,
                headers: decode_headers(headers.as_deref().unwrap_or("[]"))?,
                body: row.try_get("response_body")?,
            })
        }
        None => None,
    };
    let summary = summary_from_row(row)?;
    let body_size: i64 = row.try_get("request_body_size")?;
    let superseded_at: Option<i64> = row.try_get("superseded_at")?;
    Ok(Operation {
        id: summary.id,
        route: summary.route,
        key: summary.key,
        fingerprint: Fingerprint::from_stored(row.try_get("fingerprint")?),
        state: summary.state,
        attempt: summary.attempt,
        evidence: row.try_get("evidence")?,
        response,
        request: RequestSummary {
            method: row.try_get("request_method")?,
            path: row.try_get("request_path")?,
            content_type: row.try_get("request_content_type")?,
            body_size: u64::try_from(body_size).unwrap_or(0),
            body_sha256: row.try_get("request_body_sha256")?,
            body: row.try_get("request_body")?,
        },
        superseded: superseded_at.is_some(),
        created_at: summary.created_at,
        updated_at: summary.updated_at,
    })
}

/// The columns [`summary_from_row`] reads.
const SUMMARY_COLUMNS: &str = "id, route, idem_key, state, attempt, created_at, updated_at";

fn summary_from_row(row: &SqliteRow) -> Result<Summary, StoreError> {
    let attempt: i64 = row.try_get("attempt")?;
    Ok(Summary {
        id: row.try_get("id")?,
        route: row.try_get("route")?,
        key: row.try_get("idem_key")?,
        state: State::parse(row.try_get("state")?)?,
        attempt: u32::try_from(attempt)
            .map_err(|_| StoreError::Corrupt(format!("attempt {attempt}")))?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

#[async_trait]
impl Store for SqliteStore {
    async fn claim(&self, new: &NewOperation) -> Result<ClaimResult, StoreError> {
        let now = self.clock.now_millis();
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(
            "SELECT * FROM operations
             WHERE route = ?1 AND scope = ?2 AND idem_key = ?3 AND superseded_at IS NULL",
        )
        .bind(&new.route)
        .bind(&new.scope)
        .bind(&new.key)
        .fetch_optional(&mut *tx)
        .await?;
        let existing = match row.as_ref().map(operation_from_row).transpose()? {
            Some(old) if new.outdates(&old) => {
                sqlx::query("UPDATE operations SET superseded_at = ?1 WHERE id = ?2")
                    .bind(now)
                    .bind(&old.id)
                    .execute(&mut *tx)
                    .await?;
                let event = Event {
                    kind: "superseded",
                    detail: serde_json::json!({ "reason": "derive-window" }),
                };
                insert_event(&mut tx, &old.id, now, &event).await?;
                None
            }
            other => other,
        };
        let claim = match existing {
            None => self.insert(&mut tx, new, now).await?,
            Some(operation)
                if operation.state == State::NotAttempted
                    && operation.fingerprint == new.fingerprint =>
            {
                let attempt = operation.attempt + 1;
                let taken = sqlx::query(
                    "UPDATE operations SET state = 'in_progress', attempt = ?1, owner = ?2, evidence = 'claimed',
                        updated_at = ?3
                     WHERE id = ?4 AND state = 'not_attempted' AND attempt = ?5",
                )
                .bind(attempt as i64)
                .bind(&self.owner)
                .bind(now)
                .bind(&operation.id)
                .bind(operation.attempt as i64)
                .execute(&mut *tx)
                .await?;
                if taken.rows_affected() == 0 {
                    return Ok(ClaimResult::Existing(Box::new(operation)));
                }
                Claim {
                    operation_id: operation.id,
                    attempt,
                }
            }
            Some(operation) => return Ok(ClaimResult::Existing(Box::new(operation))),
        };
        let event = Event {
            kind: "claimed",
            detail: serde_json::json!({ "attempt": claim.attempt, "owner": self.owner }),
        };
        insert_event(&mut tx, &claim.operation_id, now, &event).await?;
        tx.commit().await?;
        Ok(ClaimResult::Claimed(claim))
    }

    async fn record(
        &self,
        claim: &Claim,
        settlement: &Settlement,
        events: &[Event],
    ) -> Result<Recorded, StoreError> {
        let now = self.clock.now_millis();
        let response = match settlement {
            Settlement::Completed { response } => Some(response),
            _ => None,
        };
        let mut tx = self.pool.begin().await?;
        let updated = sqlx::query(
            "UPDATE operations SET state = ?1, evidence = ?2, response_status = ?3, response_headers = ?4,
                response_body = ?5, updated_at = ?6
             WHERE id = ?7 AND state = 'in_progress' AND attempt = ?8 AND owner = ?9",
        )
        .bind(settlement.state().as_str())
        .bind(settlement.evidence())
        .bind(response.map(|r| i64::from(r.status)))
        .bind(response.map(|r| encode_headers(&r.headers)))
        .bind(response.and_then(|r| r.body.as_deref()))
        .bind(now)
        .bind(&claim.operation_id)
        .bind(claim.attempt as i64)
        .bind(&self.owner)
        .execute(&mut *tx)
        .await?;
        for event in events {
            insert_event(&mut tx, &claim.operation_id, now, event).await?;
        }
        tx.commit().await?;
        Ok(if updated.rows_affected() == 1 {
            Recorded::Applied
        } else {
            Recorded::Stale
        })
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    async fn current(&self, new: &NewOperation) -> Result<Option<Operation>, StoreError> {
        let row = sqlx::query(
            "SELECT * FROM operations
             WHERE route = ?1 AND scope = ?2 AND idem_key = ?3 AND superseded_at IS NULL",
        )
        .bind(&new.route)
        .bind(&new.scope)
        .bind(&new.key)
        .fetch_optional(&self.pool)
        .await?;
        let found = row.as_ref().map(operation_from_row).transpose()?;
        Ok(found.filter(|operation| !new.outdates(operation)))
    }

    async fn recover(&self) -> Result<Vec<String>, StoreError> {
        let routes = self
            .mark_in_progress_unknown("gateway-restarted", None)
            .await?;
        if !routes.is_empty() {
            tracing::warn!(
                count = routes.len(),
                "operations left in flight by a previous process are now unknown"
            );
        }
        Ok(routes)
    }

    async fn add_event(&self, operation_id: &str, event: &Event) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        insert_event(&mut tx, operation_id, self.clock.now_millis(), event).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn settle_held(
        &self,
        operation_id: &str,
        attempt: Option<u32>,
        response: &StoredResponse,
        evidence: &str,
        event: &Event,
    ) -> Result<bool, StoreError> {
        let now = self.clock.now_millis();
        let mut tx = self.pool.begin().await?;
        let updated = sqlx::query(
            "UPDATE operations SET state = 'completed', evidence = ?1, response_status = ?2,
                response_headers = ?3, response_body = ?4, updated_at = ?5
             WHERE id = ?6 AND state = 'unknown' AND (?7 IS NULL OR attempt = ?7)",
        )
        .bind(evidence)
        .bind(i64::from(response.status))
        .bind(encode_headers(&response.headers))
        .bind(response.body.as_deref())
        .bind(now)
        .bind(operation_id)
        .bind(attempt.map(i64::from))
        .execute(&mut *tx)
        .await?;
        insert_event(&mut tx, operation_id, now, event).await?;
        tx.commit().await?;
        Ok(updated.rows_affected() == 1)
    }

    async fn trip_pause_latch(&self, route: &str, threshold: u32) -> Result<bool, StoreError> {
        let now = self.clock.now_millis();
        sqlx::query(
            "INSERT INTO route_pauses (route, reason, updated_at)
             SELECT ?1, 'pause_after_unknown: ' || ?2 || ' operations unknown', ?3
             WHERE (SELECT count(*) FROM operations WHERE route = ?1 AND state = 'unknown') >= ?2
             ON CONFLICT (route) DO NOTHING",
        )
        .bind(route)
        .bind(i64::from(threshold))
        .bind(now)
        .execute(&self.pool)
        .await?;
        let paused: Option<i64> = sqlx::query_scalar("SELECT 1 FROM route_pauses WHERE route = ?1")
            .bind(route)
            .fetch_optional(&self.pool)
            .await?;
        Ok(paused.is_some())
    }

    async fn paused_routes(&self) -> Result<Vec<String>, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT route FROM route_pauses ORDER BY route")
                .fetch_all(&self.pool)
                .await?,
        )
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<Summary>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {SUMMARY_COLUMNS} FROM operations
             WHERE (?1 IS NULL OR state = ?1) AND (?2 IS NULL OR route = ?2)
               AND (?3 IS NULL OR idem_key = ?3) AND (?4 IS NULL OR id < ?4)
             ORDER BY id DESC LIMIT ?5"
        ))
        .bind(filter.state.map(State::as_str))
        .bind(&filter.route)
        .bind(&filter.key)
        .bind(&filter.before)
        .bind(i64::from(filter.limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(summary_from_row).collect()
    }

    async fn get(&self, id: &str) -> Result<Option<(Operation, Vec<StoredEvent>)>, StoreError> {
        let Some(row) = sqlx::query("SELECT * FROM operations WHERE id = ?1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
        else {
            return Ok(None);
        };
        let events: Vec<(i64, String, String)> = sqlx::query_as(
            "SELECT at, kind, detail FROM events WHERE operation_id = ?1 ORDER BY id",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await?;
        let events = events
            .into_iter()
            .map(|(at, kind, detail)| StoredEvent {
                at,
                kind,
                detail: serde_json::from_str(&detail).unwrap_or(serde_json::Value::Null),
            })
            .collect();
        Ok(Some((operation_from_row(&row)?, events)))
    }

    async fn find_newest(
        &self,
        scopes: &[(String, String)],
        key: &str,
    ) -> Result<Option<Summary>, StoreError> {
        let mut newest: Option<Summary> = None;
        for (route, scope) in scopes {
            let row = sqlx::query(&format!(
                "SELECT {SUMMARY_COLUMNS} FROM operations
                 WHERE route = ?1 AND scope = ?2 AND idem_key = ?3 ORDER BY id DESC LIMIT 1"
            ))
            .bind(route)
            .bind(scope)
            .bind(key)
            .fetch_optional(&self.pool)
            .await?;
            if let Some(found) = row.as_ref().map(summary_from_row).transpose()?
                && newest.as_ref().is_none_or(|n| found.id > n.id)
            {
                newest = Some(found);
            }
        }
        Ok(newest)
    }

    async fn resolve(
        &self,
        id: &str,
        decision: &Decision,
        event: &Event,
    ) -> Result<Resolved, StoreError> {
        let now = self.clock.now_millis();
        let (state, response) = match decision {
            Decision::Completed { response } => (State::Completed, Some(response)),
            Decision::NotAttempted => (State::NotAttempted, None),
        };
        let mut tx = self.pool.begin().await?;
        let updated = sqlx::query(
            "UPDATE operations SET state = ?1, evidence = 'operator', response_status = ?2,
                response_headers = ?3, response_body = ?4, updated_at = ?5
             WHERE id = ?6 AND (state = 'unknown' OR (state = 'in_progress' AND owner IS NOT ?7))",
        )
        .bind(state.as_str())
        .bind(response.map(|r| i64::from(r.status)))
        .bind(response.map(|r| encode_headers(&r.headers)))
        .bind(response.and_then(|r| r.body.as_deref()))
        .bind(now)
        .bind(id)
        .bind(&self.owner)
        .execute(&mut *tx)
        .await?;
        if updated.rows_affected() == 1 {
            insert_event(&mut tx, id, now, event).await?;
        }
        let state: Option<String> =
            sqlx::query_scalar("SELECT state FROM operations WHERE id = ?1")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
        tx.commit().await?;
        Ok(match state {
            None => Resolved::NotFound,
            Some(_) if updated.rows_affected() == 1 => Resolved::Done,
            Some(state) => Resolved::NotResolvable(State::parse(&state)?),
        })
    }

    async fn stats(&self) -> Result<Stats, StoreError> {
        let counts: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT route, state, count(*) FROM operations GROUP BY route, state ORDER BY route, state",
        )
        .fetch_all(&self.pool)
        .await?;
        let oldest_unknown_created_at: Option<i64> =
            sqlx::query_scalar("SELECT min(created_at) FROM operations WHERE state = 'unknown'")
                .fetch_one(&self.pool)
                .await?;
        Ok(Stats {
            counts: counts
                .into_iter()
                .map(|(route, state, n)| {
                    Ok((route, State::parse(&state)?, u64::try_from(n).unwrap_or(0)))
                })
                .collect::<Result<_, StoreError>>()?,
            oldest_unknown_created_at,
        })
    }

    async fn set_paused(&self, route: &str, reason: Option<&str>) -> Result<(), StoreError> {
        match reason {
            Some(reason) => sqlx::query(
                "INSERT INTO route_pauses (route, reason, updated_at) VALUES (?1, ?2, ?3)
                 ON CONFLICT (route) DO UPDATE SET reason = excluded.reason, updated_at = excluded.updated_at",
            )
            .bind(route)
            .bind(reason)
            .bind(self.clock.now_millis())
            .execute(&self.pool)
            .await?,
            None => sqlx::query("DELETE FROM route_pauses WHERE route = ?1")
                .bind(route)
                .execute(&self.pool)
                .await?,
        };
        Ok(())
    }

    async fn sweep(&self, cutoff: i64, limit: u32) -> Result<u64, StoreError> {
        let deleted = sqlx::query(
            "DELETE FROM operations WHERE id IN (
                SELECT id FROM operations
                WHERE state IN ('completed', 'not_attempted') AND updated_at < ?1
                LIMIT ?2)",
        )
        .bind(cutoff)
        .bind(i64::from(limit))
        .execute(&self.pool)
        .await?;
        Ok(deleted.rows_affected())
    }

    async fn close(&self) {
        match self
            .mark_in_progress_unknown("gateway-stopped", Some(&self.owner))
            .await
        {
            Ok(routes) if routes.is_empty() => {}
            Ok(routes) => tracing::warn!(
                count = routes.len(),
                "operations still in flight at shutdown are now unknown"
            ),
            Err(error) => {
                tracing::error!(%error, "cannot settle in-flight operations; they become unknown at the next start")
            }
        }
        self.pool.close().await;
        // Dropping the file releases the flock for the next process.
        if let Ok(mut lock) = self.lock.lock() {
            lock.take();
        }
    }
}
