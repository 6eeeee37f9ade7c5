//! The PostgreSQL backend: one store shared by several gateway replicas
//! behind a load balancer (ARCHITECTURE.md §4).
//!
//! Invariants:
//! - every statement runs on the primary among the servers the URL names,
//!   followed across a promotion without a restart (`primary`);
//! - the claim is one statement (`idemgate_claim`, in the migrations) on
//!   the unique (route, scope, key) among operations not superseded: two
//!   replicas racing for an identity meet in the index, and the loser reads
//!   the winner's row; every state change is a compare-and-set on (id,
//!   state, attempt, owner), one statement each;
//! - each replica holds a lease in the `replicas` table, renewed every
//!   third of `store.lease` and measured by the database's clock. An owner
//!   whose lease ran out is dead: a live replica marks its `in_progress`
//!   operations `unknown` (`replica-lost`), each once (the update is the
//!   compare-and-set), and never touches a live peer's; an operator may
//!   resolve an `in_progress` operation only when its owner is dead;
//! - a replica's own `in_progress` operation that none of its attempts
//!   works on (its record was lost with a failed-over server, its claim
//!   not) is marked `unknown` (`record-lost`) by that replica
//!   ([`mod@attempts`]), so none stays `in_progress` under a live lease;
//! - a replica that could not renew stops claiming (503) at four fifths of
//!   its lease, counted on its own monotonic clock from *before* the last
//!   renewal was sent, so it stops before the database can see its lease
//!   expire; the claim statement also refuses an owner whose lease ran out
//!   by the database's clock. An attempt already in flight when its lease
//!   runs out may be marked lost by a peer: its record then loses its
//!   compare-and-set and its client hears what the store holds
//!   (`after_stale` in `pipeline/record.rs`); an attempt not yet written
//!   when the lease runs low is never written ([`Fence`]);
//! - what peers may change is read, not cached: the replay cache is off on
//!   a shared store (a peer may supersede what it would mirror), and the
//!   paused routes are re-read every second (`replicas.rs`);
//! - a duplicate waiting (wait mode) for another replica's attempt polls
//!   the store (the claim phase's bounded poll) instead of LISTEN/NOTIFY:
//!   a notification would need a dedicated connection per replica and a
//!   fallback poll anyway for a missed one, and the wait is bounded by
//!   `wait_timeout`, so the poll is the whole mechanism;
//! - retention sweeps take a transaction-scoped advisory lock, so one
//!   replica sweeps at a time;
//! - the claims and records of the requests waiting at a moment go as one
//!   statement each (`batch`): group commit, one round trip per batch.
//!
//! Migrations (`crates/store-postgres/migrations`, embedded) run at open and by
//! `idemgate migrate`; sqlx's migrator holds a session advisory lock
//! while it runs, so replicas starting together apply them once.
//!
//! # Counts
//!
//! The counts by (route, state) (ARCHITECTURE.md §4, "Counts") are kept by
//! triggers on `operations`, so every statement is covered, whichever
//! replica runs it. An updated row stays locked until its transaction
//! commits, so one row per (route, state) would queue every replica's batch
//! behind every other batch of the route, and two batches touching two
//! states in opposite orders would deadlock. So the rows are sharded by the
//! writing backend's pid (`slot`): a pid is one live backend, which runs
//! one transaction at a time, so no two transactions share a row. `stats`
//! sums the slots after folding the rows no transaction holds into slot 0
//! (`FOR UPDATE SKIP LOCKED`: it never waits on a writer), which keeps the
//! rows about one per (route, state) and backend that wrote since the last
//! read. A recount at open runs under a lock on `operation_counts` that
//! holds the replicas' writes until it commits, so none falls between the
//! count and the mark.
//!
//! # Plans
//!
//! An index serves a statement only if the planner chooses it, and before a
//! table has statistics (just filled, not yet analysed) the planner
//! guesses: with only `operations_key_id` to serve it, the status lookup's
//! superseded branch ([`Operators::find_newest`], run even when the
//! current operation answered) is planned as that index intersected with
//! every operation of the route, and grows with the store.
//! `operations_superseded` (migration 0009), an index of the superseded
//! operations alone by identity, serves that branch whole, costs a first
//! write nothing (only derive mode supersedes), and no guess makes another
//! index cheaper.
//! `a_status_lookup_reads_a_few_pages_before_statistics_on_postgres`
//! (`tests/it/store_contract.rs`) loads 100,000 operations with autovacuum
//! off and fails if the lookup reads 40 pages or more. The indexes every
//! read is served by are listed in the module docs of `crates/store/src/lib.rs`
//! ("Access paths").

mod attempts;
mod batch;
mod outbox;
mod primary;
mod replication;
mod statements;
mod unanswered;
mod url;

pub use url::{PostgresServers, postgres_options, redact_url};

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sqlx::postgres::{PgPool, PgPoolOptions};
use tokio_util::sync::CancellationToken;

use attempts::{Attempts, Pending};
use batch::{BATCH_TIMEOUT, Batcher, QUEUE_TIMEOUT};
use idemgate_model::backoff::Backoff;
use idemgate_model::clock::{self, Clock};
use idemgate_model::operation::{Event, Operation, Settlement, State};
use idemgate_store::Durability;
use idemgate_store::Fence;
use idemgate_store::StoreBatches;
use idemgate_store::backend::ForgetCursor;
use idemgate_store::scope_key::ScopeKey;
use idemgate_store::seal::{CANARY_ROW, Canary, SEALED_ONLY_ROW, SEALED_ONLY_VALUE, Seal};
use idemgate_store::{
    AlertDelivery, AlertOutcome, AlertPoll, Claim, ClaimResult, Decision, GATEWAY_STOPPED,
    LateEvidence, ListFilter, Maintenance, NewOperation, Operators, Outbox, Probed, REPLICA_LOST,
    Recorded, RekeyBatch, RequestPath, Resolved, RoutePause, Stats, StoreError, StoreKeys,
    StoredEvent, Summary,
};
use primary::{Primary, Session};
use replication::Replication;
use statements::{ClaimCall, Owners, RecordCall};
use unanswered::{Look, Unanswered};

/// This module's log target (`idemgate_store`'s crate docs, "Log targets").
const TARGET: &str = "idemgate::store::postgres";

/// The statements `tests/it/store_contract.rs` explains.
pub fn access_paths() -> Vec<idemgate_store::AccessPath> {
    let mut paths = statements::access_paths();
    paths.extend(outbox::access_paths());
    paths
}

/// Connections per replica: enough for the requests' statements to
/// overlap, few enough that many replicas fit under `max_connections`.
const POOL: u32 = 16;

/// How long a call waits for a free connection before the store counts as
/// unavailable (503): as long as a call may wait for its batch.
const ACQUIRE_TIMEOUT: Duration = QUEUE_TIMEOUT;

pub struct PostgresStore {
    pool: PgPool,
    /// The requests' claims, one statement per batch ([`batch`]); a
    /// claim whose operation does not open fails alone.
    claims: Batcher<ClaimCall, Result<ClaimResult, StoreError>>,
    /// The requests' records, likewise.
    records: Batcher<RecordCall, Recorded>,
    /// Both batchers' sizes and commit times.
    batches: StoreBatches,
    /// This replica's instance id, written as `owner` on every claim.
    owner: Arc<str>,
    /// Its attempts between claim and record, to tell those it no longer
    /// works on ([`Maintenance::recover`]).
    attempts: Attempts,
    /// Its claims whose answers were lost, while it looks for them.
    unanswered: Unanswered,
    /// The lease as this process sees it: claims and sends stop when it
    /// no longer provably runs.
    fence: Fence,
    clock: Arc<dyn Clock>,
    /// Stops the lease renewal at close.
    renewal: CancellationToken,
    /// Seals payloads on the way in, opens them on the way out.
    seal: Seal,
    /// The server's replication as the lease renewals last read it.
    replication: Arc<Replication>,
    /// The server the pools connect to ([`mod@primary`]).
    primary: Primary,
    /// Where dropping finished alerts stands.
    forget_cursor: ForgetCursor,
}

/// How a replica uses its PostgreSQL store, from `[store]`.
#[derive(Debug, Clone, Copy)]
pub struct PostgresSettings {
    pub durability: Durability,
    pub lease: Duration,
    pub require_synchronous_standby: bool,
}

/// The primary among the servers `url` names.
async fn primary(url: &str) -> Result<Primary, StoreError> {
    let store = crate::url::redact_url(url);
    let servers = crate::url::postgres_options(url).map_err(|reason| StoreError::Open {
        store: store.clone(),
        reason,
    })?;
    Primary::find(servers, store).await
}

/// The sessions of a pool: with the durability asked for; a commit waits
/// for the synchronous standby when one is required, whatever the
/// server's own default.
fn commits(durability: Durability, synchronous_standby: bool) -> Session {
    match (durability, synchronous_standby) {
        (_, true) => &[("synchronous_commit", "on")],
        (Durability::Full, false) => &[],
        // A commit is acknowledged before it is flushed on the server.
        (Durability::Normal, false) => &[("synchronous_commit", "off")],
    }
}

async fn run_migrations(pool: &PgPool, url: &str) -> Result<(), StoreError> {
    sqlx::migrate!("./migrations")
        .run(pool)
        .await
        .map_err(|e| StoreError::Open {
            store: crate::url::redact_url(url),
            reason: format!("migration failed: {e}"),
        })
}

impl PostgresStore {
    /// Applies the migrations to the database `url` names.
    pub async fn migrate(url: &str) -> Result<(), StoreError> {
        let pool = primary(url).await?.pool(
            PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(ACQUIRE_TIMEOUT),
            &[],
        );
        let migrated = run_migrations(&pool, url).await;
        pool.close().await;
        migrated
    }

    /// Whether the database `url` names holds a store (its schema on the
    /// search path): [`open`](Self::open) makes one where there is none,
    /// so a command that must find one (`idemgate rekey`) asks first.
    pub async fn exists(url: &str) -> Result<bool, StoreError> {
        let pool = primary(url).await?.pool(
            PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(ACQUIRE_TIMEOUT),
            &[],
        );
        let found = statements::store_exists(&pool).await;
        pool.close().await;
        found
    }

    /// Connects, migrates, checks that `keys` fit the store (keying its
    /// scopes if it was written before),
    /// registers this replica (`owner`) with a lease of `lease` and keeps
    /// renewing it until [`Maintenance::close`].
    pub async fn open(
        url: &str,
        settings: PostgresSettings,
        owner: String,
        clock: Arc<dyn Clock>,
        keys: StoreKeys,
    ) -> Result<Self, StoreError> {
        let PostgresSettings {
            durability,
            lease,
            require_synchronous_standby,
        } = settings;
        let primary = primary(url).await?;
        let pool = primary.pool(
            PgPoolOptions::new()
                .max_connections(POOL)
                .acquire_timeout(ACQUIRE_TIMEOUT),
            commits(durability, require_synchronous_standby),
        );
        run_migrations(&pool, url).await?;
        let seal = match check_keys(&pool, keys.seal, &keys.scope).await {
            Ok(seal) => seal,
            Err(error) => {
                pool.close().await;
                return Err(error);
            }
        };
        match statements::recount_if_untrusted(&pool).await {
            Ok(true) => {
                tracing::warn!(target: TARGET, "operation counts were not known to be exact: recounted")
            }
            Ok(false) => {}
            Err(error) => {
                pool.close().await;
                return Err(error);
            }
        }
        let fence = Fence::leased(lease);
        let sent = Instant::now();
        statements::renew_lease(&pool, &owner, clock::millis(lease)).await?;
        fence.renewed(sent);
        let replication = Arc::new(Replication::new(require_synchronous_standby, lease));
        replication.read(&pool).await?;
        let owner: Arc<str> = owner.into();
        let renewal = CancellationToken::new();
        // A connection of its own: a renewal never queues for a connection
        // behind the requests' statements, whose load must not cost the
        // lease (and so every send, through the fence). Always durable, and
        // waiting for the synchronous standby where one is required: a
        // renewal a failover lost would end the lease sooner than the fence
        // counts on.
        let lease_link = primary.pool(
            PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(lease * 4 / 5),
            commits(Durability::Full, require_synchronous_standby),
        );
        tokio::spawn(renew(
            (lease_link, primary.clone()),
            owner.clone(),
            (lease, fence.clone(), replication.clone()),
            renewal.clone(),
        ));
        primary.follow(renewal.clone());
        let batches = StoreBatches::new(&["claim", "record"]);
        let claims = Batcher::start(BATCH_TIMEOUT, ("claim", batches.clone()), {
            let link = (pool.clone(), primary.clone());
            let (owner, seal) = (owner.clone(), seal.clone());
            move |calls: Vec<ClaimCall>| {
                let ((pool, primary), owner, seal) = (link.clone(), owner.clone(), seal.clone());
                async move {
                    let claimed = statements::claim(&pool, &seal, &owner, &calls).await;
                    claimed.inspect_err(|error| primary.suspect(error))
                }
            }
        });
        let records = Batcher::start(BATCH_TIMEOUT, ("record", batches.clone()), {
            let link = (pool.clone(), primary.clone());
            let (owner, seal) = (owner.clone(), seal.clone());
            move |calls: Vec<RecordCall>| {
                let ((pool, primary), owner, seal) = (link.clone(), owner.clone(), seal.clone());
                async move {
                    let recorded = statements::record(&pool, &seal, &owner, &calls).await;
                    recorded.inspect_err(|error| primary.suspect(error))
                }
            }
        });
        Ok(PostgresStore {
            pool,
            claims,
            records,
            batches,
            owner,
            attempts: Attempts::new(clock.clone()),
            unanswered: Unanswered::default(),
            fence,
            clock,
            renewal,
            seal,
            replication,
            primary,
            forget_cursor: ForgetCursor::default(),
        })
    }
}

/// Refuses keys that do not fit the store's canaries; marks a store sealed
/// from now on with one (the first of replicas starting together wins,
/// and the others are checked against its canary), and sealed-only when
/// it holds no operation yet; keys the scopes of a store written before
/// scopes were keyed. The seal to use: sealed-only as the store says,
/// read once here (a rekey that finishes meanwhile takes effect at each
/// replica's next start).
async fn check_keys(pool: &PgPool, seal: Seal, scope: &ScopeKey) -> Result<Seal, StoreError> {
    if let Some(keyed) = statements::key_scopes(pool, scope).await? {
        tracing::info!(target: TARGET, operations = keyed, "scopes are keyed from now on");
    }
    let stored = statements::meta(pool, CANARY_ROW).await?;
    if seal.check_canary(stored.as_deref())? == Canary::Missing
        && let Some(canary) = seal.canary()
    {
        statements::set_meta(pool, CANARY_ROW, &canary, false).await?;
        let stored = statements::meta(pool, CANARY_ROW).await?;
        seal.check_canary(stored.as_deref())?;
        if !statements::holds_operations(pool).await? {
            statements::set_meta(pool, SEALED_ONLY_ROW, SEALED_ONLY_VALUE, false).await?;
        }
    }
    let sealed_only = statements::meta(pool, SEALED_ONLY_ROW).await?;
    Ok(seal.sealed_only(sealed_only.as_deref()))
}

/// Renews the lease every third of its length until `stop`: each renewal
/// starts a third of a lease after the previous one started, however long
/// that one took — or [`RENEW_RETRY`] after one that failed, so that a
/// replica whose fence ran low serves again within about that of its
/// database answering — and is given up once it could no longer extend
/// the fence (four fifths of a lease after it started); meanwhile claims
/// and sends stop once the last good one is too old ([`Fence::holds`]). Each good
/// renewal reads the server's replication too ([`Replication`]). `pool` is
/// the lease's own connection, closed when renewing stops; a renewal that
/// fails wakes the search for the `primary`.
async fn renew(
    (pool, primary): (PgPool, Primary),
    owner: Arc<str>,
    (lease, fence, replication): (Duration, Fence, Arc<Replication>),
    stop: CancellationToken,
) {
    let every = lease / 3;
    let mut next = tokio::time::Instant::now() + every;
    let mut failing = false;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return pool.close().await,
            _ = tokio::time::sleep_until(next) => {}
        }
        let sent = Instant::now();
        next = tokio::time::Instant::now() + every;
        let renewed = tokio::time::timeout(
            lease * 4 / 5,
            statements::renew_lease(&pool, &owner, clock::millis(lease)),
        )
        .await;
        match renewed {
            Ok(Ok(())) => {
                fence.renewed(sent);
                if std::mem::take(&mut failing) {
                    tracing::info!(target: TARGET, "replica lease renewed again; claiming resumes");
                }
                let read = tokio::time::timeout(lease / 3, replication.read(&pool)).await;
                if let Ok(Err(error)) = read {
                    tracing::warn!(target: TARGET, %error, "cannot read the store's replication");
                }
            }
            Ok(Err(error)) => {
                failing = true;
                next = next.min(tokio::time::Instant::now() + RENEW_RETRY);
                primary.suspect(&error);
                tracing::error!(target: TARGET, %error, "cannot renew this replica's lease; writes get 503 once it runs low");
            }
            Err(_) => {
                failing = true;
                next = next.min(tokio::time::Instant::now() + RENEW_RETRY);
                primary.wake();
                tracing::error!(target: TARGET,
                    "renewing this replica's lease timed out; writes get 503 once it runs low"
                );
            }
        }
    }
}

/// Why writes are refused once the fence lapsed. A renewal is a commit:
/// on a server that requires a synchronous standby, it waits for one.
const LEASE_NOT_RENEWED: &str = "this replica could not renew its lease in the store (a renewal commits, and waits for a synchronous standby where the server requires one)";

/// How soon a renewal that failed is tried again (unless a third of the
/// lease comes sooner).
const RENEW_RETRY: Duration = Duration::from_secs(1);

/// Finds out what became of a claim whose answer was lost, and releases it
/// if it committed ([`statements::release_unanswered_claim`]): its client
/// heard 503 and nothing was sent, so no operation is left `in_progress`
/// under this replica's live lease with nobody working on it. The claim
/// may commit late (a statement behind a lock, a commit waiting for the
/// synchronous standby), so finding nothing is no answer: it looks again
/// on the backoff, fully jittered so that the calls of one failed batch do
/// not look together, each look bounded like a batch, until the tries run
/// out. A replica whose lease runs out meanwhile has its operations held
/// `replica-lost` by a peer instead.
async fn release_unanswered(
    pool: PgPool,
    owner: Arc<str>,
    new: Arc<NewOperation>,
    (pending, look, clock): (Pending, Look, Arc<dyn Clock>),
) {
    let claimed_at = pending.now;
    let mut unreachable = false;
    for n in 0..RELEASE_TRIES {
        look.wait(RELEASE_BACKOFF.delay(n)).await;
        let now = clock.now_millis();
        let release = statements::release_unanswered_claim(&pool, &owner, &new, (claimed_at, now));
        match tokio::time::timeout(BATCH_TIMEOUT, release).await {
            Ok(Ok(Some(id))) => {
                return tracing::warn!(target: TARGET, operation_id = %id, "a claim whose answer was lost had committed: released as not_attempted, nothing was sent");
            }
            Ok(Ok(None)) => unreachable = false,
            Ok(Err(error)) => {
                unreachable = true;
                tracing::warn!(target: TARGET, %error, "cannot yet find out what became of a claim whose answer was lost")
            }
            Err(_) => unreachable = true,
        }
    }
    if unreachable {
        tracing::error!(target: TARGET, key = %new.key, route = %new.route, "could not find out what became of a claim whose answer was lost; if it committed, it reads in_progress until this replica stops or its lease runs out");
    }
}

/// Looks of [`release_unanswered`]: with [`RELEASE_BACKOFF`], up to about
/// six minutes in all, three on average.
const RELEASE_TRIES: u32 = 12;

/// The waits between them: below a ceiling from 500 ms, doubling up to a
/// minute.
const RELEASE_BACKOFF: Backoff =
    Backoff::full_jitter(Duration::from_millis(500), Duration::from_secs(60));

impl PostgresStore {
    /// Whether `held`, found by `new`'s claim, is a claim of this
    /// replica's whose answer was lost ([`mod@unanswered`]): never sent, and
    /// its look woken to release it.
    fn never_sent(&self, new: &NewOperation, held: &Operation) -> bool {
        held.state == State::InProgress
            && held.fingerprint == new.fingerprint
            && held.owner.as_deref() == Some(&*self.owner)
            && !self.attempts.working_on(&held.id)
            && self.unanswered.wake(new, held.updated_at)
    }

    /// Marks `unknown` (`record-lost`) this replica's `in_progress`
    /// operations that no attempt of its own works on ([`mod@attempts`]);
    /// the routes of those marked.
    async fn mark_orphans(&self, now: i64) -> Result<Vec<String>, StoreError> {
        let claimed_before = self.attempts.claimed_before();
        let mut ids = statements::own_in_progress(&self.pool, &self.owner, claimed_before).await?;
        ids.retain(|id| !self.attempts.working_on(id));
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let orphaned = Owners::Orphaned {
            this: &self.owner,
            ids: &ids,
            claimed_before,
        };
        statements::mark_in_progress_unknown(&self.pool, now, "record-lost", orphaned).await
    }
}

/// A store dropped without [`Maintenance::close`] stops renewing: to its peers
/// this replica is as good as dead once the lease runs out.
impl Drop for PostgresStore {
    fn drop(&mut self) {
        self.renewal.cancel();
    }
}

#[async_trait]
impl RequestPath for PostgresStore {
    async fn claim(&self, new: &Arc<NewOperation>) -> Result<ClaimResult, StoreError> {
        let refusal = if self.fence.holds() {
            self.replication.refusal()
        } else {
            Some(LEASE_NOT_RENEWED.to_string())
        };
        if let Some(reason) = refusal {
            // Nothing is written, but what the store holds is answered: a
            // replay, a held operation, a reused key. Also past the lease:
            // a renewal that waits for a synchronous standby gone away
            // lets the fence lapse, and a read sends nothing.
            return match self.current(new).await? {
                Some(held) if !new.would_send(&held) => Ok(ClaimResult::Existing(Box::new(held))),
                _ => Err(StoreError::WritesRefused(reason)),
            };
        }
        let pending = self.attempts.claim();
        let call = ClaimCall {
            now: pending.now,
            new: new.clone(),
        };
        let claimed = self.claims.call(call).await;
        match &claimed {
            // Covered until it is found, or given up on.
            Err(StoreError::Unanswered(_)) => {
                let look = self.unanswered.look(new, pending.now);
                drop(tokio::spawn(release_unanswered(
                    self.pool.clone(),
                    self.owner.clone(),
                    new.clone(),
                    (pending, look, self.clock.clone()),
                )))
            }
            Ok(Ok(ClaimResult::Claimed(claim))) => {
                self.attempts
                    .claimed(pending, &claim.operation_id, claim.attempt);
            }
            Ok(Ok(ClaimResult::Existing(held))) if self.never_sent(new, held) => {
                return Err(StoreError::Busy(
                    "a claim of this key whose answer was lost is being released; nothing was sent"
                        .into(),
                ));
            }
            _ => {}
        }
        claimed?
    }

    async fn record(
        &self,
        claim: &Claim,
        settlement: &Settlement,
        events: &[Event],
    ) -> Result<Recorded, StoreError> {
        let call = RecordCall {
            now: self.clock.now_millis(),
            claim: claim.clone(),
            settlement: settlement.clone(),
            events: events.to_vec(),
        };
        let recorded = self.records.call(call).await;
        if recorded.is_ok() {
            self.attempts.recorded(&claim.operation_id, claim.attempt);
        }
        recorded
    }

    async fn current(&self, new: &NewOperation) -> Result<Option<Operation>, StoreError> {
        Ok(statements::find(&self.pool, &self.seal, new)
            .await?
            .filter(|op| !new.outdates(op)))
    }

    fn fence(&self) -> Fence {
        self.fence.clone()
    }

    fn shared(&self) -> bool {
        true
    }

    async fn add_event(&self, operation_id: &str, event: &Event) -> Result<(), StoreError> {
        let now = self.clock.now_millis();
        statements::insert_event(&self.pool, operation_id, now, event).await
    }

    async fn add_probe_event(&self, operation_id: &str, event: &Event) -> Result<(), StoreError> {
        let now = self.clock.now_millis();
        statements::add_probe_event(&self.pool, operation_id, now, event).await
    }

    async fn settle_held(&self, late: &LateEvidence) -> Result<bool, StoreError> {
        let now = self.clock.now_millis();
        statements::settle_held(&self.pool, &self.seal, now, late).await
    }

    async fn settle_probed(&self, probed: &Probed) -> Result<bool, StoreError> {
        let now = self.clock.now_millis();
        statements::settle_probed(&self.pool, now, probed).await
    }

    async fn trip_pause_latch(&self, route: &str, threshold: u32) -> Result<bool, StoreError> {
        let now = self.clock.now_millis();
        statements::trip_pause_latch(&self.pool, now, route, threshold).await
    }
}

#[async_trait]
impl Operators for PostgresStore {
    async fn paused_routes(&self) -> Result<Vec<String>, StoreError> {
        statements::paused_routes(&self.pool).await
    }

    async fn pauses(&self) -> Result<Vec<RoutePause>, StoreError> {
        statements::pauses(&self.pool).await
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<Summary>, StoreError> {
        statements::list(&self.pool, filter).await
    }

    async fn duplicated(
        &self,
        route: Option<&str>,
        limit: u32,
    ) -> Result<Vec<Summary>, StoreError> {
        statements::duplicated(&self.pool, route, limit).await
    }

    async fn get(&self, id: &str) -> Result<Option<(Operation, Vec<StoredEvent>)>, StoreError> {
        statements::get(&self.pool, &self.seal, id).await
    }

    async fn owner_alive(&self, owner: &str) -> Result<bool, StoreError> {
        statements::lease_runs(&self.pool, owner).await
    }

    async fn find_newest(
        &self,
        scopes: &[(String, String)],
        key: &str,
    ) -> Result<Option<Summary>, StoreError> {
        statements::find_newest(&self.pool, scopes, key).await
    }

    async fn resolve(
        &self,
        id: &str,
        attempt: Option<u32>,
        decision: &Decision,
        event: &Event,
    ) -> Result<Resolved, StoreError> {
        let now = self.clock.now_millis();
        let at = (now, id, attempt);
        statements::resolve(&self.pool, &self.seal, at, decision, event).await
    }

    async fn stats(&self) -> Result<Stats, StoreError> {
        let mut stats = statements::stats(&self.pool).await?;
        stats.replication = self.replication.state();
        Ok(stats)
    }

    async fn set_paused(&self, route: &str, reason: Option<&str>) -> Result<(), StoreError> {
        let now = self.clock.now_millis();
        statements::set_paused(&self.pool, now, route, reason).await
    }
}

#[async_trait]
impl Outbox for PostgresStore {
    async fn take_alerts(&self, poll: &AlertPoll) -> Result<Vec<AlertDelivery>, StoreError> {
        outbox::take_alerts(&self.pool, poll, &self.forget_cursor).await
    }

    async fn settle_alert(
        &self,
        delivery: &AlertDelivery,
        outcome: &AlertOutcome,
        now: i64,
    ) -> Result<(), StoreError> {
        outbox::settle_alert(&self.pool, delivery, outcome, now).await
    }
}

#[async_trait]
impl Maintenance for PostgresStore {
    /// Marks the `in_progress` operations of replicas whose lease ran out
    /// (by the database's clock); safe at any time, and run periodically
    /// by every replica, since a peer may die at any moment.
    async fn recover(&self) -> Result<Vec<String>, StoreError> {
        let lost = Owners::Lost { by: &self.owner };
        let now = self.clock.now_millis();
        let mut routes = statements::mark_in_progress_unknown(&self.pool, now, REPLICA_LOST, lost)
            .await
            .inspect_err(|error| self.primary.suspect(error))?;
        if !routes.is_empty() {
            tracing::warn!(target: TARGET,
                count = routes.len(),
                "operations left in flight by a lost replica are now unknown"
            );
        }
        // What was marked above is the caller's either way (its routes'
        // latches): a failure here is logged, and looked at again next pass.
        let orphaned = match self.mark_orphans(now).await {
            Ok(orphaned) => orphaned,
            Err(error) => {
                self.primary.suspect(&error);
                tracing::warn!(target: TARGET, %error, "cannot look for operations this replica no longer works on; trying again");
                Vec::new()
            }
        };
        if !orphaned.is_empty() {
            tracing::warn!(target: TARGET,
                count = orphaned.len(),
                "operations this replica claimed and no longer works on are now unknown: their records were lost, as in a failover without a synchronous standby"
            );
        }
        routes.extend(orphaned);
        Ok(routes)
    }

    fn batches(&self) -> &StoreBatches {
        &self.batches
    }

    async fn sweep(&self, cutoff: i64, limit: u32) -> Result<u64, StoreError> {
        statements::sweep(&self.pool, cutoff, limit).await
    }

    async fn rekey(&self, after: &str, limit: u32) -> Result<RekeyBatch, StoreError> {
        statements::rekey(&self.pool, &self.seal, after, limit).await
    }

    async fn finish_rekey(&self) -> Result<(), StoreError> {
        let Some(canary) = self.seal.canary() else {
            return Ok(());
        };
        // The pass found nothing in clear or in format 1: the store is
        // sealed-only from now on.
        statements::set_meta(&self.pool, CANARY_ROW, &canary, true).await?;
        statements::set_meta(&self.pool, SEALED_ONLY_ROW, SEALED_ONLY_VALUE, true).await
    }

    async fn route_settings(&self) -> Result<Vec<(String, String)>, StoreError> {
        statements::route_settings(&self.pool).await
    }

    async fn keep_route_settings(
        &self,
        settings: &[(String, Option<String>)],
    ) -> Result<(), StoreError> {
        statements::keep_route_settings(&self.pool, settings).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let runs = statements::lease_runs(&self.pool, &self.owner).await?;
        if !runs || !self.fence.holds() {
            return Err(StoreError::WritesRefused(LEASE_NOT_RENEWED.into()));
        }
        statements::operations_writable(&self.pool).await?;
        match self.replication.refusal() {
            Some(reason) => Err(StoreError::WritesRefused(reason)),
            None => Ok(()),
        }
    }

    async fn close(&self) {
        self.fence.close();
        self.renewal.cancel();
        let now = self.clock.now_millis();
        let this = Owners::This(&self.owner);
        match statements::mark_in_progress_unknown(&self.pool, now, GATEWAY_STOPPED, this).await {
            Ok(routes) if routes.is_empty() => {}
            Ok(routes) => tracing::warn!(target: TARGET,
                count = routes.len(),
                "operations still in flight at shutdown are now unknown"
            ),
            Err(error) => {
                tracing::error!(target: TARGET, %error, "cannot settle in-flight operations; they become unknown once this replica's lease runs out")
            }
        }
        if let Err(error) = statements::end_lease(&self.pool, &self.owner).await {
            tracing::warn!(target: TARGET, %error, "cannot end this replica's lease; it runs out on its own");
        }
        self.pool.close().await;
    }
}
