//! The SQLite backend: the default store, for one gateway process.
//!
//! Invariants:
//! - one process at a time: an exclusive `flock` on the database file
//!   itself (not on a file beside it, which an operator may delete as
//!   stale; every path to the file is one lock), held for the
//!   store's life and released by the kernel when the process dies, so every
//!   `in_progress` row found at open belongs to a dead owner and becomes
//!   `unknown` (`gateway-restarted`, [`Maintenance::recover`]) before the first
//!   request is served; a file replaced or removed under the process takes
//!   its lock with it, so the writer then fails every call (`placement`);
//! - one writer: a thread of its own owns the only connection that writes
//!   (`writer`), so transactions never race each other and a claim's
//!   look-up and insert are atomic; it commits the calls of every request
//!   waiting at a moment in one transaction (group commit);
//! - reads apart: lookups, lists, stats and pauses run on read-only
//!   connections (`reader`), each in one WAL snapshot, and never wait
//!   in the writer's queue; readiness (`ping`) is a write, since ready
//!   means a write can commit: it changes a `store_meta` row, so its
//!   commit must append to the log (a transaction that writes nothing
//!   commits on a full disk);
//! - WAL journal; `durability = "full"` answers a batch only once the log
//!   holding it is synced (one `fdatasync` over every batch committed
//!   before it, on a thread of its own: `syncer`), `"normal"` answers at
//!   the commit and survives a process crash but not a power loss; the
//!   log is copied into the database by a thread of its own
//!   (`checkpointer`), never by the writer.
//!
//! The store's promises, and where this backend stands among them, are in
//! ARCHITECTURE.md §4; this module and its submodules say how they are kept.
//!
//! # Layout
//!
//! The parts, each a module, in the order a write meets them, then reads:
//! - `writer`: the thread that owns the only connection that writes. It
//!   takes whatever calls are queued (up to 256), runs them in one
//!   `BEGIN IMMEDIATE … COMMIT`, and hands the batch on; a call that waited
//!   5 s is refused unrun, and a call that fails fails alone;
//! - `held`: that connection as the writer's calls see it, with the
//!   statements every first write runs held prepared;
//! - `statements`: the SQL, one function per store call; `transitions`:
//!   what a change to `operations` writes besides the row (the kept counts,
//!   the `unknown` alert); `outbox`: the alert outbox's statements;
//! - `syncer`: the two threads that make a committed batch's log durable
//!   and then answer its calls (each caller's oneshot), so the writer
//!   never waits for the disk nor wakes a caller;
//! - `checkpointer`: the thread that copies the log into the database, so
//!   the writer never checkpoints;
//! - `reader`: the read-only connections of every read that need not be
//!   atomic with a write.
//!
//! With `durability = "full"` the writer's connection opens through the
//! VFS of `crates/wal-buffer` (a crate apart because it needs `unsafe`):
//! SQLite's default VFS, except that a commit's WAL frames are held and
//! written in a few calls, not two per frame, when SQLite syncs the log,
//! and the sync itself is left to the `syncer`. `"normal"`, which does
//! not sync at each commit, opens through the default VFS. The batches and
//! their syncs show in the metrics as `batch="write"` and `batch="sync"`
//! (the calls each covered, and its duration).
//!
//! # Why rusqlite on a thread, not sqlx
//!
//! sqlx runs each statement as a round trip to a worker thread of its own,
//! whose futex and epoll hand-offs cost more than SQLite's own work here,
//! and a batch of per-row statements through it stays at several round
//! trips per request. A thread that owns a rusqlite connection runs the
//! same statements as plain function calls. rusqlite links the same
//! `libsqlite3-sys` as sqlx, so one SQLite is in the binary; sqlx keeps the
//! migrations and runs the PostgreSQL backend.
//!
//! # What a row costs
//!
//! A first write is one row insert (its claim) and one row update (its
//! record), each writing the row and the index entries it adds or moves,
//! and every page they dirty is a WAL frame at the commit. So the row and
//! its indexes carry only what they must (ARCHITECTURE.md §4, "Bytes per
//! operation"):
//! - the three SHA-256 digests (`scope`, `fingerprint`,
//!   `request_body_sha256`) are kept as their 32 bytes, not 64 hex
//!   characters (migration 0007), in the row and in the identity index
//!   every claim looks up; the store reads them back as the lower-case hex
//!   the rest of the gateway compares and binds, and makes their bytes on
//!   the request's task (`statements::ClaimDigests`);
//! - a new operation enters one large index at a random place (migration
//!   0011): every other index it enters leads with a value that grows
//!   (`id`) or one of a few (`state`, `route`), or holds only the few
//!   operations in flight or held (`operations_in_progress`,
//!   `operations_held_twins`), so a batch's new operations share those
//!   pages, while a random key dirties a page of its own, a 4 KiB frame.
//!   The identity index, `(idem_key, route,
//!   scope)`, leads with the key and also serves listing by key for the
//!   current operations; the superseded ones, which only derive mode makes
//!   and no first write enters, have a partial index of their own
//!   (`operations_superseded`). A unit test lists every index on
//!   `operations` with its leading column;
//! - the three indexes that hold `state` hold no `in_progress` operation
//!   (migration 0012): a claim enters only the small
//!   `operations_in_progress (id)`, and its record leaves it and enters
//!   each of the three once. SQLite reads a partial index only for a
//!   statement that states its condition, so every statement they serve
//!   spells it out (`not_in_progress!`);
//! - the state CHECK is a chain of equalities, not an `IN` list of more
//!   than two values, for which SQLite builds a temporary index on every
//!   insert and update (migration 0002; a unit test EXPLAINs the hot
//!   statements);
//! - the id stays a 36-character text: it is what the admin API, the events
//!   and the outbox name an operation by, and as 16 bytes it would save
//!   little across the table and the indexes that hold it, at the cost of
//!   a conversion at every boundary.
//!
//! The indexes every read is served by are listed in the module docs of
//! `crates/store/src/lib.rs` ("Access paths"). The counts by (route, state) are one
//! row each here: the writer is alone, so no row is ever contended
//! (`transitions`).
//!
//! # Migrations
//!
//! Migrations run through sqlx (`crates/store-sqlite/migrations`, embedded in the
//! binary) on a connection that is closed before the writer opens its own.

/// The condition of the three indexes that hold `state` (migration 0012):
/// they hold no `in_progress` operation, and SQLite reads a partial index
/// only for a statement that states its condition, so each statement they
/// serve repeats it. A macro, so that `concat!` takes it too.
macro_rules! not_in_progress {
    () => {
        "state <> 'in_progress'"
    };
}

mod checkpointer;
mod held;
mod outbox;
mod placement;
mod reader;
mod statements;
mod syncer;
mod transitions;
mod writer;

use std::fs::{File, TryLockError};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rusqlite::{Connection, OpenFlags};
use sqlx::ConnectOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};

use idemgate_model::clock::Clock;
use idemgate_model::operation::{Event, Operation, Settlement};
use idemgate_store::Durability;
use idemgate_store::Fence;
use idemgate_store::backend::ForgetCursor;
use idemgate_store::scope_key::ScopeKey;
use idemgate_store::seal::{CANARY_ROW, Canary, SEALED_ONLY_ROW, SEALED_ONLY_VALUE, Seal};
use idemgate_store::{
    AccessPath, AlertDelivery, AlertOutcome, AlertPoll, Claim, ClaimResult, Decision,
    GATEWAY_RESTARTED, GATEWAY_STOPPED, LateEvidence, ListFilter, Maintenance, NewOperation,
    Operators, Outbox, Probed, Recorded, RekeyBatch, RequestPath, Resolved, RoutePause, Stats,
    StoreError, StoreKeys, StoredEvent, Summary,
};
use reader::Readers;
use writer::{LogSyncs, QUEUE_TIMEOUT, Writer};

use idemgate_store::StoreBatches;

/// This module's log target (`idemgate_store`'s crate docs, "Log targets").
const TARGET: &str = "idemgate::store::sqlite";

pub struct SqliteStore {
    writer: Writer,
    /// Reads that need not be atomic with a write ([`reader`]).
    readers: Readers,
    /// The writer's batch sizes and commit times.
    batches: StoreBatches,
    /// This process's instance id, written as `owner` on every claim.
    owner: Arc<str>,
    /// The database file, locked ([`lock_database`]); `None` once closed.
    /// std Mutex: never held across `.await`.
    lock: Mutex<Option<File>>,
    clock: Arc<dyn Clock>,
    /// Seals payloads on the way in, opens them on the way out.
    seal: Seal,
    /// Holds from open to close: the file lock keeps every other process
    /// from taking this one's attempts.
    fence: Fence,
    /// Where dropping finished alerts stands.
    forget_cursor: Arc<ForgetCursor>,
}

impl SqliteStore {
    /// Applies the migrations to the store at `path` (created if missing),
    /// under its lock: `idemgate migrate`, which needs no keys.
    pub async fn migrate(path: &Path) -> Result<(), StoreError> {
        let store_name = format!("sqlite://{}", path.display());
        let _lock = lock_database(path, &store_name)?;
        migrate_file(path, &store_name).await
    }

    /// Locks, opens (creating it if needed) and migrates the store, checks
    /// that `keys` fit it (keying its scopes if it was written before),
    /// and starts its writer; what a dead owner left `in_progress` waits
    /// for [`Maintenance::recover`].
    pub async fn open(
        path: &Path,
        durability: Durability,
        owner: String,
        clock: Arc<dyn Clock>,
        keys: StoreKeys,
    ) -> Result<Self, StoreError> {
        let store_name = format!("sqlite://{}", path.display());
        let lock = lock_database(path, &store_name)?;
        let open_error = |reason: String| StoreError::Open {
            store: store_name.clone(),
            reason,
        };
        migrate_file(path, &store_name).await?;
        let conn = connect(path).map_err(|e| open_error(e.to_string()))?;
        let batches = StoreBatches::new(&[writer::BATCH, syncer::SYNC]);
        let log = LogSyncs {
            store: path.to_path_buf(),
            sync: (durability == Durability::Full)
                .then(|| Box::new(syncer::WalFile::of_store(path)) as Box<dyn syncer::SyncLog>),
            checkpoints: checkpointer::Thresholds::default(),
        };
        let writer = Writer::start(conn, batches.clone(), log)?;
        let readers = match Readers::open(path, writer.horizon()) {
            Ok(readers) => readers,
            Err(error) => {
                writer.stop().await;
                return Err(error);
            }
        };
        let mut store = SqliteStore {
            writer,
            readers,
            batches,
            owner: owner.into(),
            lock: Mutex::new(Some(lock)),
            clock,
            seal: keys.seal,
            fence: Fence::unshared(),
            forget_cursor: Arc::default(),
        };
        if let Err(error) = store.check_keys(keys.scope).await {
            store.writer.stop().await;
            return Err(error);
        }
        match store
            .writer
            .run(|db| statements::recount_if_untrusted(db))
            .await
        {
            Ok(true) => {
                tracing::warn!(target: TARGET, "operation counts were not known to be exact: recounted")
            }
            Ok(false) => {}
            Err(error) => {
                store.writer.stop().await;
                return Err(error);
            }
        }
        Ok(store)
    }

    /// Refuses keys that do not fit the store's canaries; marks a store
    /// sealed from now on with one, and sealed-only when it holds no
    /// operation yet (nothing in clear to keep reading); keys the scopes of
    /// a store written before scopes were keyed. One transaction.
    async fn check_keys(&mut self, scope: ScopeKey) -> Result<(), StoreError> {
        let seal = self.seal.clone();
        let (keyed, sealed_only) = self
            .writer
            .run(move |conn| {
                let stored = statements::meta(conn, CANARY_ROW)?;
                if seal.check_canary(stored.as_deref())? == Canary::Missing
                    && let Some(canary) = seal.canary()
                {
                    statements::set_meta(conn, CANARY_ROW, &canary)?;
                    if !statements::holds_operations(conn)? {
                        statements::set_meta(conn, SEALED_ONLY_ROW, SEALED_ONLY_VALUE)?;
                    }
                }
                let keyed = statements::key_scopes(conn, &scope)?;
                Ok((keyed, statements::meta(conn, SEALED_ONLY_ROW)?))
            })
            .await?;
        self.seal = self.seal.clone().sealed_only(sealed_only.as_deref());
        if let Some(keyed) = keyed {
            tracing::info!(target: TARGET, operations = keyed, "scopes are keyed from now on");
        }
        Ok(())
    }
}

/// The statements `tests/it/store_contract.rs` explains ([`AccessPath`]).
pub fn access_paths() -> Vec<AccessPath> {
    let mut paths = statements::access_paths();
    paths.extend(outbox::access_paths());
    paths
}

/// Runs the migrations on a connection of their own, closed before the
/// writer opens its connection.
async fn migrate_file(path: &Path, store_name: &str) -> Result<(), StoreError> {
    let open_error = |reason: String| StoreError::Open {
        store: store_name.to_string(),
        reason,
    };
    let mut migrations = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        // Off while migrating: a migration that rebuilds a table must not
        // cascade into the rows that reference it. The writer's
        // connection turns them on.
        .foreign_keys(false)
        .busy_timeout(QUEUE_TIMEOUT)
        .connect()
        .await
        .map_err(|e| open_error(e.to_string()))?;
    sqlx::migrate!("./migrations")
        .run(&mut migrations)
        .await
        .map_err(|e| open_error(format!("migration failed: {e}")))?;
    sqlx::Connection::close(migrations)
        .await
        .map_err(|e| open_error(e.to_string()))
}

/// The writer's connection: WAL, temporary data in memory (multi-row work
/// would otherwise create a temp file per statement), a busy timeout equal
/// to the writer's queue timeout.
///
/// Whatever the durability, it opens through `idemgate-wal-buffer`
/// (`crates/wal-buffer`), which writes a commit's WAL frames as one write
/// at its sync instead of two per frame, at `synchronous = FULL`, whose
/// syncs the writer defers ([`writer::LogSyncs`]): the log is
/// synced by [`syncer`] (`"full"`) or at the checkpoints alone
/// (`"normal"`), and checkpointed by [`checkpointer`], so this connection
/// never checkpoints by itself (`wal_autocheckpoint = 0`).
fn connect(path: &Path) -> Result<Connection, ConnectError> {
    let vfs = idemgate_wal_buffer::register()?;
    let conn = Connection::open_with_flags_and_vfs(path, OpenFlags::default(), vfs)?;
    conn.busy_timeout(QUEUE_TIMEOUT)?;
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA wal_autocheckpoint = 0;
         PRAGMA foreign_keys = ON; PRAGMA temp_store = MEMORY;",
    )?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

/// Waits for one of the store's threads (`name`) to end, if it ran.
fn join(thread: Option<std::thread::JoinHandle<()>>, name: &str) {
    if let Some(thread) = thread
        && thread.join().is_err()
    {
        tracing::error!(target: TARGET, "the SQLite {name} thread ended abnormally");
    }
}

/// Why the writer's connection did not open.
#[derive(Debug, thiserror::Error)]
enum ConnectError {
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    #[error(transparent)]
    Vfs(#[from] idemgate_wal_buffer::RegisterError),
}

/// The store's lock: an exclusive `flock` on the database file itself
/// (made empty if missing, as SQLite would make it), on a descriptor of
/// its own. Not on a file beside it: an empty `<file>.lock` looks stale,
/// and were it deleted a second process would lock a new one and take the
/// first's attempts for a dead owner's. Every path to the file (a
/// symlink to it or to a directory on its way, a hard link) opens the
/// same file, so they are one lock.
///
/// But one name only: SQLite keeps its write-ahead log beside the name it
/// opens (`<name>-wal`), so a file of two names (hard links) would be two
/// logs, and a gateway started through the other name after a crash would
/// not see what the last one committed, and would send its writes again.
/// Such a file is refused (a symlink is one name: SQLite follows it).
///
/// On Linux a `flock` and SQLite's own locks (`fcntl` byte ranges, on the
/// same file) never see each other, so SQLite's connections work under
/// it. Closing any descriptor of the file drops every `fcntl` lock this
/// process holds on it, SQLite's too: the lock is let go only at
/// [`Maintenance::close`], once the store's connections are closed.
fn lock_database(path: &Path, store_name: &str) -> Result<File, StoreError> {
    let open_error = |reason: String| StoreError::Open {
        store: store_name.to_string(),
        reason,
    };
    let file = File::options()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        // The owner's alone: it holds bodies, answers and keys, and SQLite
        // gives its log and shared-memory files the database's mode.
        .mode(0o600)
        .open(path)
        .map_err(|e| open_error(format!("cannot open it to lock it: {e}")))?;
    let resolved = || {
        let file = std::fs::canonicalize(path).unwrap_or_else(|_| PathBuf::from(path));
        file.display().to_string()
    };
    let names = file
        .metadata()
        .map_err(|e| open_error(format!("cannot read it: {e}")))?
        .nlink();
    if names > 1 {
        return Err(open_error(format!(
            "the file has {names} names (hard links): SQLite keeps its write-ahead log beside the name it is opened by, so a gateway started through another name would not see what the last one wrote, and would send those writes again; keep one name (a symlink is fine)"
        )));
    }
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(TryLockError::WouldBlock) => Err(StoreError::Locked {
            store: store_name.to_string(),
            lock: resolved(),
        }),
        Err(TryLockError::Error(e)) => Err(open_error(format!("cannot lock {}: {e}", resolved()))),
    }
}

#[async_trait]
impl RequestPath for SqliteStore {
    fn fence(&self) -> Fence {
        self.fence.clone()
    }

    async fn claim(&self, new: &Arc<NewOperation>) -> Result<ClaimResult, StoreError> {
        let (owner, now, new) = (self.owner.clone(), self.clock.now_millis(), new.clone());
        // Made here, on the request's task: the writer thread is shared.
        let (seal, digests) = (self.seal.clone(), statements::ClaimDigests::of(&new)?);
        self.writer
            .run(move |conn| statements::claim(conn, &seal, &owner, now, &new, &digests))
            .await
    }

    async fn record(
        &self,
        claim: &Claim,
        settlement: &Settlement,
        events: &[Event],
    ) -> Result<Recorded, StoreError> {
        let (owner, now) = (self.owner.clone(), self.clock.now_millis());
        // Sealed here, on the request's task: the writer thread is shared.
        let stored = (settlement.response()).map(|response| {
            (self.seal).stored_form(&claim.operation_id, &claim.identity, response)
        });
        let settlement = statements::SettledRow::from(settlement);
        let (claim, events) = (claim.clone(), events.to_vec());
        self.writer
            .run(move |conn| {
                let stored = stored.as_ref();
                statements::record(conn, &owner, now, &claim, &settlement, stored, &events)
            })
            .await
    }

    async fn current(&self, new: &NewOperation) -> Result<Option<Operation>, StoreError> {
        let (new, seal) = (new.clone(), self.seal.clone());
        self.readers
            .run(
                move |conn| Ok(statements::find(conn, &seal, &new)?.filter(|op| !new.outdates(op))),
            )
            .await
    }

    async fn add_event(&self, operation_id: &str, event: &Event) -> Result<(), StoreError> {
        let (now, id, event) = (
            self.clock.now_millis(),
            operation_id.to_string(),
            event.clone(),
        );
        self.writer
            .run(move |conn| statements::insert_event(conn, &id, now, &event))
            .await
    }

    async fn add_probe_event(&self, operation_id: &str, event: &Event) -> Result<(), StoreError> {
        let (now, id, event) = (
            self.clock.now_millis(),
            operation_id.to_string(),
            event.clone(),
        );
        self.writer
            .run(move |conn| statements::add_probe_event(conn, &id, now, &event))
            .await
    }

    async fn settle_held(&self, late: &LateEvidence) -> Result<bool, StoreError> {
        let (now, late, seal) = (self.clock.now_millis(), late.clone(), self.seal.clone());
        self.writer
            .run(move |conn| statements::settle_held(conn, &seal, now, &late))
            .await
    }

    async fn settle_probed(&self, probed: &Probed) -> Result<bool, StoreError> {
        let (now, probed) = (self.clock.now_millis(), probed.clone());
        self.writer
            .run(move |conn| statements::settle_probed(conn, now, &probed))
            .await
    }

    async fn trip_pause_latch(&self, route: &str, threshold: u32) -> Result<bool, StoreError> {
        let (now, route) = (self.clock.now_millis(), route.to_string());
        self.writer
            .run(move |conn| statements::trip_pause_latch(conn, now, &route, threshold))
            .await
    }
}

#[async_trait]
impl Operators for SqliteStore {
    async fn paused_routes(&self) -> Result<Vec<String>, StoreError> {
        self.readers.run(statements::paused_routes).await
    }

    async fn pauses(&self) -> Result<Vec<RoutePause>, StoreError> {
        self.readers.run(statements::pauses).await
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<Summary>, StoreError> {
        let filter = filter.clone();
        self.readers
            .run(move |conn| statements::list(conn, &filter))
            .await
    }

    async fn duplicated(
        &self,
        route: Option<&str>,
        limit: u32,
    ) -> Result<Vec<Summary>, StoreError> {
        let route = route.map(str::to_string);
        self.readers
            .run(move |conn| statements::duplicated(conn, route.as_deref(), limit))
            .await
    }

    /// This process alone writes the store, and what a dead one left
    /// `in_progress` is marked at open: only this process is alive.
    async fn owner_alive(&self, owner: &str) -> Result<bool, StoreError> {
        Ok(*owner == *self.owner)
    }

    async fn get(&self, id: &str) -> Result<Option<(Operation, Vec<StoredEvent>)>, StoreError> {
        let (id, seal) = (id.to_string(), self.seal.clone());
        self.readers
            .run(move |conn| statements::get(conn, &seal, &id))
            .await
    }

    async fn find_newest(
        &self,
        scopes: &[(String, String)],
        key: &str,
    ) -> Result<Option<Summary>, StoreError> {
        let (scopes, key) = (scopes.to_vec(), key.to_string());
        self.readers
            .run(move |conn| statements::find_newest(conn, &scopes, &key))
            .await
    }

    async fn resolve(
        &self,
        id: &str,
        attempt: Option<u32>,
        decision: &Decision,
        event: &Event,
    ) -> Result<Resolved, StoreError> {
        let (owner, now) = (self.owner.clone(), self.clock.now_millis());
        let (id, decision, event) = (id.to_string(), decision.clone(), event.clone());
        let seal = self.seal.clone();
        self.writer
            .run(move |conn| {
                let at = (now, id.as_str(), attempt);
                statements::resolve(conn, &seal, &owner, at, &decision, &event)
            })
            .await
    }

    async fn stats(&self) -> Result<Stats, StoreError> {
        self.readers.run(statements::stats).await
    }

    async fn set_paused(&self, route: &str, reason: Option<&str>) -> Result<(), StoreError> {
        let (now, route) = (self.clock.now_millis(), route.to_string());
        let reason = reason.map(str::to_string);
        self.writer
            .run(move |conn| statements::set_paused(conn, now, &route, reason.as_deref()))
            .await
    }
}

#[async_trait]
impl Outbox for SqliteStore {
    async fn take_alerts(&self, poll: &AlertPoll) -> Result<Vec<AlertDelivery>, StoreError> {
        let poll = poll.clone();
        let forget_cursor = Arc::clone(&self.forget_cursor);
        self.writer
            .run(move |conn| outbox::take_alerts(conn, &poll, &forget_cursor))
            .await
    }

    async fn settle_alert(
        &self,
        delivery: &AlertDelivery,
        outcome: &AlertOutcome,
        now: i64,
    ) -> Result<(), StoreError> {
        let (delivery, outcome) = (delivery.clone(), outcome.clone());
        self.writer
            .run(move |conn| outbox::settle_alert(conn, &delivery, &outcome, now))
            .await
    }
}

#[async_trait]
impl Maintenance for SqliteStore {
    fn batches(&self) -> &StoreBatches {
        &self.batches
    }

    async fn route_settings(&self) -> Result<Vec<(String, String)>, StoreError> {
        self.readers.run(statements::route_settings).await
    }

    async fn keep_route_settings(
        &self,
        settings: &[(String, Option<String>)],
    ) -> Result<(), StoreError> {
        let settings = settings.to_vec();
        self.writer
            .run(move |conn| statements::keep_route_settings(conn, &settings))
            .await
    }

    /// A write on the writer: ready means a write can commit, and reach
    /// the log ([`statements::readiness_write`]).
    async fn ping(&self) -> Result<(), StoreError> {
        self.writer
            .run(|conn| statements::readiness_write(conn))
            .await
    }

    async fn recover(&self) -> Result<Vec<String>, StoreError> {
        let now = self.clock.now_millis();
        let routes = self
            .writer
            .run(move |conn| {
                statements::mark_in_progress_unknown(conn, now, GATEWAY_RESTARTED, None)
            })
            .await?;
        if !routes.is_empty() {
            tracing::warn!(target: TARGET,
                count = routes.len(),
                "operations left in flight by a previous process are now unknown"
            );
        }
        Ok(routes)
    }

    async fn sweep(&self, cutoff: i64, limit: u32) -> Result<u64, StoreError> {
        self.writer
            .run(move |conn| statements::sweep(conn, cutoff, limit))
            .await
    }

    async fn rekey(&self, after: &str, limit: u32) -> Result<RekeyBatch, StoreError> {
        let (after, seal) = (after.to_string(), self.seal.clone());
        self.writer
            .run(move |conn| statements::rekey(conn, &seal, &after, limit))
            .await
    }

    async fn finish_rekey(&self) -> Result<(), StoreError> {
        let Some(canary) = self.seal.canary() else {
            return Ok(());
        };
        // The pass found nothing in clear or in format 1: the store is
        // sealed-only from now on.
        self.writer
            .run(move |conn| {
                statements::set_meta(conn, CANARY_ROW, &canary)?;
                statements::set_meta(conn, SEALED_ONLY_ROW, SEALED_ONLY_VALUE)
            })
            .await
    }

    async fn close(&self) {
        self.fence.close();
        let (owner, now) = (self.owner.clone(), self.clock.now_millis());
        let marked = self
            .writer
            .run(move |conn| {
                statements::mark_in_progress_unknown(conn, now, GATEWAY_STOPPED, Some(&owner))
            })
            .await;
        match marked {
            Ok(routes) if routes.is_empty() => {}
            Ok(routes) => tracing::warn!(target: TARGET,
                count = routes.len(),
                "operations still in flight at shutdown are now unknown"
            ),
            Err(error) => {
                tracing::error!(target: TARGET, %error, "cannot settle in-flight operations; they become unknown at the next start")
            }
        }
        self.writer.stop().await;
        // Before the lock: closing its descriptor drops this process's
        // `fcntl` locks on the file, which SQLite's connections hold.
        self.readers.close();
        // Dropping the file releases the flock for the next process.
        if let Ok(mut lock) = self.lock.lock() {
            lock.take();
        }
    }
}
