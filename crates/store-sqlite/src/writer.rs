//! The SQLite writer: one OS thread owns the connection and commits the
//! work of every request waiting at that moment in one transaction —
//! group commit (ARCHITECTURE.md §4).
//!
//! Invariants:
//! - durable before answered: a job's reply is sent only after the
//!   transaction that holds it committed (one fsync per batch with
//!   `durability = "full"`), so no claim sends a byte upstream, and no
//!   client hears an outcome, before it is on disk;
//! - a job whose statements fail fails alone: the batch runs once without
//!   savepoints (the common case, and the cheap one: a savepoint copies
//!   every page its job touches to a sub-journal), and if any job failed it
//!   is rolled back whole and run again with a savepoint per job, so the
//!   failed job's writes are undone and the others' kept; a batch that
//!   cannot begin or commit fails every job in it, and none of their writes
//!   happened;
//! - a job whose deadline passed while it queued is refused unrun: a caller
//!   told "busy" never has its claim committed behind its back;
//! - jobs run in the order they were queued, so one request's calls (a
//!   claim, then its record) keep their order;
//! - each call's answer goes straight to its caller's oneshot, from the
//!   thread that settles its batch (a per-thread inbox that woke each
//!   caller's runtime once per batch measured no faster:
//!   benches/README.md, "paired.sh: two builds at the same time");
//! - the writer never waits for the disk: it commits with the log's sync
//!   deferred (`crates/wal-buffer`) and hands the batch to the
//!   [`Syncer`], which answers after one `fdatasync` over every batch
//!   before it (`durability = "full"`), or answers at once (`"normal"`);
//!   checkpoints run on a thread of their own ([`super::checkpointer`]);
//! - one batch per free sync: while a committed batch waits for a sync
//!   thread, the writer lets its queue fill instead of committing again
//!   ([`Syncer::wait_until_taken`]), since a batch committed then would
//!   only wait for the same sync. So a batch holds the calls that came
//!   while the syncs before it ran, and the pages every batch rewrites (the
//!   table's last leaf, the index ends, the count rows) are written once
//!   per sync, not once per smaller batch.
//!
//! Under load a call costs a share of one sync, not one of its own.

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use std::sync::Arc;

use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

use super::checkpointer::{self, Checkpoints, Thresholds};
use super::held::Db;
use super::placement::Placement;
use super::syncer::{self, Horizon, SyncLog, Syncer};
use super::transitions::Deferred;
use idemgate_store::StoreBatches;
use idemgate_store::StoreError;

/// This module's log target (`idemgate_store`'s crate docs, "Log targets").
const TARGET: &str = "idemgate::store::sqlite::writer";

/// The most jobs one transaction takes; more wait for the next one.
const MAX_BATCH: usize = 256;
/// The writer's batches in the store's metrics.
pub const BATCH: &str = "write";

/// Jobs queued beyond this make callers wait to queue (backpressure).
const QUEUE: usize = 4096;

/// How long a job may wait in the queue before it is refused unrun: the
/// store counts as busy (503) past this.
pub(crate) const QUEUE_TIMEOUT: Duration = Duration::from_secs(5);

/// One request's statements and where their result goes.
trait Work: Send {
    fn deadline(&self) -> Instant;
    /// Runs the statements, keeping their result (a second run replaces
    /// the first's); `false` when they failed.
    fn run(&mut self, db: &Db) -> bool;
    /// Settles the result: `failed` when the batch did not commit.
    fn settle(&mut self, failed: Option<&str>);
    /// Sends the settled result to the caller.
    fn deliver(self: Box<Self>);
}

struct Task<T, F> {
    deadline: Instant,
    /// `Fn`: a batch rolled back for another job's failure runs it again.
    statements: F,
    result: Option<Result<T, StoreError>>,
    reply: oneshot::Sender<Result<T, StoreError>>,
}

impl<T, F> Work for Task<T, F>
where
    T: Send,
    F: Fn(&Db) -> Result<T, StoreError> + Send,
{
    fn deadline(&self) -> Instant {
        self.deadline
    }

    fn run(&mut self, db: &Db) -> bool {
        let statements = &self.statements;
        // A panic fails this call alone (its writes are rolled back); the
        // thread, and every other caller, goes on.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| statements(db)))
            .unwrap_or_else(|_| Err(StoreError::Failed("a store call panicked".into())));
        let ok = result.is_ok();
        self.result = Some(result);
        ok
    }

    fn settle(&mut self, failed: Option<&str>) {
        self.result = Some(match (failed, self.result.take()) {
            (Some(reason), _) => Err(StoreError::Failed(reason.to_string())),
            (None, Some(result)) => result,
            (None, None) => Err(StoreError::Busy(format!(
                "the writer did not reach this request within {}",
                humantime::format_duration(QUEUE_TIMEOUT)
            ))),
        });
    }

    fn deliver(self: Box<Self>) {
        if let Some(result) = self.result {
            drop(self.reply.send(result));
        }
    }
}

enum Message {
    Job(Box<dyn Work>),
    /// Ends the thread once everything queued before it is done.
    Stop,
}

/// Who syncs the writer's log and copies it into the database. The
/// writer's connection defers its syncs (opened through
/// `crates/wal-buffer`) and never checkpoints (`wal_autocheckpoint = 0`).
pub(crate) struct LogSyncs {
    /// The store, for the checkpointer's connection.
    pub(crate) store: std::path::PathBuf,
    /// What answers wait for: a sync of the log (`"full"`:
    /// [`syncer::WalFile`]), or nothing (`None`, `"normal"`).
    pub(crate) sync: Option<Box<dyn SyncLog>>,
    /// When the checkpointer copies and restarts the log.
    pub(crate) checkpoints: Thresholds,
}

/// The handle requests use to queue work for the writer thread.
pub struct Writer {
    queue: mpsc::Sender<Message>,
    thread: std::sync::Mutex<Option<JoinHandle<()>>>,
    /// How far the log is durable, for the reads.
    horizon: Arc<Horizon>,
}

impl Writer {
    /// Starts the thread that owns `conn` (and those `log` asks for); it
    /// counts its batches in `batches` (as `write`, and the log's syncs as
    /// `sync`).
    pub fn start(
        conn: Connection,
        batches: StoreBatches,
        log: LogSyncs,
    ) -> Result<Writer, StoreError> {
        let horizon = Horizon::new();
        let after = AfterCommit::start(log, &horizon, &batches)?;
        let (queue, receiver) = mpsc::channel(QUEUE);
        let thread = std::thread::Builder::new()
            .name("idemgate-sqlite-writer".into())
            .spawn(move || write_batches(&conn, receiver, &batches, after))
            .map_err(|e| StoreError::Failed(format!("cannot start the writer thread: {e}")))?;
        Ok(Writer {
            queue,
            thread: std::sync::Mutex::new(Some(thread)),
            horizon,
        })
    }

    /// How far the log is durable: reads wait on it (the readers, `reader.rs`).
    pub(crate) fn horizon(&self) -> Arc<Horizon> {
        self.horizon.clone()
    }

    /// Runs `statements` in the next batch and returns their result once
    /// the batch committed.
    pub async fn run<T, F>(&self, statements: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: Fn(&Db) -> Result<T, StoreError> + Send + 'static,
    {
        let deadline = Instant::now() + QUEUE_TIMEOUT;
        let (reply, answer) = oneshot::channel();
        let task = Task {
            deadline,
            statements,
            result: None,
            reply,
        };
        let queued =
            tokio::time::timeout(QUEUE_TIMEOUT, self.queue.send(Message::Job(Box::new(task))));
        match queued.await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(StoreError::Closed),
            Err(_) => return Err(StoreError::Busy("the writer's queue is full".into())),
        }
        // The writer always answers: run, expired, or failed with its batch.
        answer.await.unwrap_or(Err(StoreError::Closed))
    }

    /// Lets the thread finish what is queued, then ends it.
    pub async fn stop(&self) {
        if self.queue.send(Message::Stop).await.is_err() {
            return;
        }
        let thread = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(thread) = thread {
            let joined = tokio::task::spawn_blocking(move || thread.join()).await;
            if !matches!(joined, Ok(Ok(()))) {
                tracing::error!(target: TARGET, "the SQLite writer thread ended abnormally");
            }
        }
    }
}

/// What follows a batch's commit: its answers, the log's sync, the
/// checkpoints.
struct AfterCommit {
    horizon: Arc<Horizon>,
    /// Whether the store's path still names the file written.
    placement: Placement,
    /// Answers after a sync of the log (`None`: at once).
    syncer: Option<Syncer>,
    checkpoints: Checkpoints,
}

impl AfterCommit {
    fn start(
        log: LogSyncs,
        horizon: &Arc<Horizon>,
        batches: &StoreBatches,
    ) -> Result<AfterCommit, StoreError> {
        // The checkpointer first: it stops when dropped, should the sync
        // threads fail to start; nothing fallible follows them.
        let placement = Placement::of(&log.store)
            .map_err(|e| StoreError::Failed(format!("cannot read the store file: {e}")))?;
        let checkpoints = Checkpoints::start(&log.store, log.checkpoints)?;
        let syncer = match log.sync {
            Some(sync) => Some(Syncer::start(sync, horizon.clone(), batches.clone())?),
            None => None,
        };
        Ok(AfterCommit {
            checkpoints,
            placement,
            horizon: horizon.clone(),
            syncer,
        })
    }

    /// Commits `batch` and sees to its answers.
    fn commit(&mut self, db: &Db, batch: &mut Vec<Box<dyn Work>>) -> Option<String> {
        if let Some(moved) = self.placement.moved(Instant::now()) {
            tracing::error!(target: TARGET, "{moved}");
            self.horizon.fail(moved);
        }
        if let Some(failure) = self.horizon.failure_reason() {
            // Unrun, with the reason a sync thread gave (and logged once).
            answer(batch, Some(failure));
            return None;
        }
        // Numbered once it holds the write lock (a batch waiting for the
        // lock holds no read back), before its COMMIT makes it visible.
        let horizon = &self.horizon;
        let mut number = horizon.committing();
        let (committed, deferred) = idemgate_wal_buffer::deferring_syncs(|| {
            commit(db, batch, &mut || number = horizon.begin())
        });
        let failed = committed.err().map(|e| e.to_string());
        if let Some(log_end) = deferred.log_end {
            self.checkpoints.logged(log_end);
        }
        if self.checkpoints.catch_up() {
            // Outside the deferral: SQLite syncs the log before it copies,
            // and the database after.
            if let Err(error) = checkpointer::passive(db) {
                tracing::debug!(target: TARGET, %error, "the writer's checkpoint did not finish; retried later");
            }
        }
        match &self.syncer {
            Some(syncer) => {
                let jobs = Jobs(std::mem::replace(batch, Vec::with_capacity(MAX_BATCH)));
                syncer.hand(number, deferred.owed, failed.clone(), Box::new(jobs));
            }
            None => {
                answer(batch, failed.as_deref());
                self.horizon.synced(number);
            }
        }
        failed
    }

    /// Returns once a batch committed now would not just wait for the
    /// same sync as one already waiting ([`Syncer::wait_until_taken`]).
    fn ready_for_next(&self) {
        if let Some(syncer) = &self.syncer {
            syncer.wait_until_taken();
        }
    }

    /// Answers everything committed, then ends the threads.
    fn stop(mut self) {
        if let Some(syncer) = self.syncer {
            syncer.stop();
        }
        self.checkpoints.stop();
    }
}

/// A committed batch's jobs, answered by the [`Syncer`].
struct Jobs(Vec<Box<dyn Work>>);

impl syncer::Batch for Jobs {
    fn calls(&self) -> usize {
        self.0.len()
    }

    fn deliver(mut self: Box<Self>, failed: Option<&str>) {
        answer(&mut self.0, failed);
    }
}

/// The thread: take whatever is queued, commit it as one transaction,
/// answer everyone in it, repeat.
fn write_batches(
    conn: &Connection,
    mut receiver: mpsc::Receiver<Message>,
    batches: &StoreBatches,
    mut after: AfterCommit,
) {
    let db = Db::new(conn);
    let mut batch: Vec<Box<dyn Work>> = Vec::with_capacity(MAX_BATCH);
    let mut stopping = false;
    while !stopping {
        match receiver.blocking_recv() {
            Some(Message::Job(job)) => batch.push(job),
            Some(Message::Stop) | None => break,
        }
        after.ready_for_next();
        while batch.len() < MAX_BATCH {
            match receiver.try_recv() {
                Ok(Message::Job(job)) => batch.push(job),
                Ok(Message::Stop) => {
                    stopping = true;
                    break;
                }
                Err(_) => break,
            }
        }
        let started = Instant::now();
        let calls = batch.len();
        let failed = after.commit(&db, &mut batch);
        batches.observe(BATCH, calls, started.elapsed());
        if let Some(error) = &failed {
            // Every caller hears 503. A COMMIT that failed in its fsync may
            // still be in the WAL: such a claim comes back `in_progress` at
            // the next start and is held as `unknown`, never sent twice.
            tracing::error!(target: TARGET, %error, calls, "a store batch did not commit");
        }
    }
    after.stop();
}

/// Settles every job of `batch` and sends each its answer.
fn answer(batch: &mut Vec<Box<dyn Work>>, failed: Option<&str>) {
    for mut job in batch.drain(..) {
        job.settle(failed);
        job.deliver();
    }
}

/// Runs `batch` in one transaction: first without savepoints; if a job
/// failed, the transaction is rolled back and run again with each job in
/// a savepoint of its own, so that job fails alone.
/// `begun` runs each time the transaction has begun (it holds the write
/// lock), before anything of it can be seen.
fn commit(
    db: &Db,
    batch: &mut [Box<dyn Work>],
    begun: &mut dyn FnMut(),
) -> Result<(), rusqlite::Error> {
    // One instant for both runs: they run the same jobs.
    let now = Instant::now();
    let result = run_once(db, batch, now, false, begun).and_then(|all_ran| {
        if all_ran {
            return Ok(());
        }
        db.prepare_cached("ROLLBACK")?.execute([])?;
        run_once(db, batch, now, true, begun).map(drop)
    });
    if result.is_err() && !db.is_autocommit() {
        // Nothing of this batch happened; the connection is clean for the next.
        let _ = db.execute_batch("ROLLBACK");
    }
    result
}

/// One transaction over the jobs whose deadline has not passed at `now`,
/// each in its own savepoint when `isolated`. Commits unless a job failed
/// without a savepoint to undo it alone: then the transaction is left open
/// for the caller to roll back, and the answer is `false`.
fn run_once(
    db: &Db,
    batch: &mut [Box<dyn Work>],
    now: Instant,
    isolated: bool,
    begun: &mut dyn FnMut(),
) -> Result<bool, rusqlite::Error> {
    db.prepared("BEGIN IMMEDIATE")?.execute([])?;
    begun();
    // The batch's count changes, written just before its commit.
    let counts = Deferred::begin();
    for job in batch.iter_mut().filter(|job| job.deadline() >= now) {
        if !isolated {
            if !job.run(db) {
                return Ok(false);
            }
            continue;
        }
        let mark = counts.mark();
        db.prepare_cached("SAVEPOINT job")?.execute([])?;
        if !job.run(db) {
            db.prepare_cached("ROLLBACK TO job")?.execute([])?;
            counts.undo_to(mark);
        }
        db.prepare_cached("RELEASE job")?.execute([])?;
    }
    // Failing, it fails the batch as a failed COMMIT would.
    counts.write(db)?;
    db.prepared("COMMIT")?.execute([])?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn table() -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (x INTEGER PRIMARY KEY)")
            .unwrap();
        conn
    }

    type Answer = oneshot::Receiver<Result<(), StoreError>>;

    /// A job inserting each of `xs`, with its answer.
    fn inserts(xs: &[i64], deadline: Instant) -> (Box<dyn Work>, Answer) {
        let xs = xs.to_vec();
        let (reply, answer) = oneshot::channel();
        let task = Task {
            deadline,
            statements: move |conn: &Db| {
                for &x in &xs {
                    conn.execute("INSERT INTO t (x) VALUES (?1)", [x])?;
                }
                Ok(())
            },
            result: None,
            reply,
        };
        (Box::new(task), answer)
    }

    fn rows(conn: &Connection) -> Vec<i64> {
        let mut statement = conn.prepare("SELECT x FROM t ORDER BY x").unwrap();
        statement
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    fn answered(mut answer: Answer) -> Result<(), StoreError> {
        answer.try_recv().expect("answered")
    }

    #[test]
    fn a_failing_job_rolls_back_alone() {
        let conn = table();
        let later = Instant::now() + QUEUE_TIMEOUT;
        let (first, a) = inserts(&[1], later);
        // Its second insert conflicts with the first job's row.
        let (second, b) = inserts(&[2, 1], later);
        let (third, c) = inserts(&[3], later);
        let mut batch = vec![first, second, third];
        commit(&Db::new(&conn), &mut batch, &mut || {}).unwrap();
        for mut job in batch {
            job.settle(None);
            job.deliver();
        }
        assert!(answered(a).is_ok());
        assert!(answered(b).is_err());
        assert!(answered(c).is_ok());
        assert_eq!(rows(&conn), [1, 3], "the failed job left nothing behind");
    }

    #[test]
    fn a_panicking_job_fails_alone() {
        let conn = table();
        let later = Instant::now() + QUEUE_TIMEOUT;
        let (first, a) = inserts(&[1], later);
        let (reply, b) = oneshot::channel::<Result<(), StoreError>>();
        let panicking = Task {
            deadline: later,
            statements: |conn: &Db| -> Result<(), StoreError> {
                conn.execute("INSERT INTO t (x) VALUES (2)", [])?;
                panic!("a bug in a store call");
            },
            result: None,
            reply,
        };
        let (third, c) = inserts(&[3], later);
        let mut batch: Vec<Box<dyn Work>> = vec![first, Box::new(panicking), third];
        commit(&Db::new(&conn), &mut batch, &mut || {}).unwrap();
        for mut job in batch {
            job.settle(None);
            job.deliver();
        }
        assert!(answered(a).is_ok());
        assert!(matches!(answered(b), Err(StoreError::Failed(_))));
        assert!(answered(c).is_ok());
        assert_eq!(rows(&conn), [1, 3]);
    }

    #[test]
    fn a_job_past_its_deadline_is_refused_unrun() {
        let conn = table();
        let (late, a) = inserts(&[1], Instant::now() - Duration::from_millis(1));
        let (timely, b) = inserts(&[2], Instant::now() + QUEUE_TIMEOUT);
        let mut batch = vec![late, timely];
        commit(&Db::new(&conn), &mut batch, &mut || {}).unwrap();
        for mut job in batch {
            job.settle(None);
            job.deliver();
        }
        assert!(matches!(answered(a), Err(StoreError::Busy(_))));
        assert!(answered(b).is_ok());
        assert_eq!(rows(&conn), [2]);
    }

    #[test]
    fn a_batch_that_cannot_begin_fails_every_job() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("locked.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (x INTEGER PRIMARY KEY)")
            .unwrap();
        conn.busy_timeout(Duration::from_millis(20)).unwrap();
        let other = Connection::open(&path).unwrap();
        other.execute_batch("BEGIN EXCLUSIVE").unwrap();

        let later = Instant::now() + QUEUE_TIMEOUT;
        let (first, a) = inserts(&[1], later);
        let (second, b) = inserts(&[2], later);
        let mut batch = vec![first, second];
        let failed = commit(&Db::new(&conn), &mut batch, &mut || {})
            .unwrap_err()
            .to_string();
        for mut job in batch {
            job.settle(Some(&failed));
            job.deliver();
        }
        assert!(matches!(answered(a), Err(StoreError::Failed(_))));
        assert!(matches!(answered(b), Err(StoreError::Failed(_))));
        other.execute_batch("ROLLBACK").unwrap();
        assert!(rows(&conn).is_empty());
        assert!(
            conn.is_autocommit(),
            "the connection is clean for the next batch"
        );
    }

    /// A store file with table `t`, and a writer on it whose answers wait
    /// for `sync`, checkpointed at `checkpoints`.
    fn writer_on_file(
        dir: &tempfile::TempDir,
        sync: Option<Box<dyn SyncLog>>,
        checkpoints: Thresholds,
    ) -> (Writer, std::path::PathBuf) {
        let path = dir.path().join("writer.db");
        let conn = crate::connect(&path).unwrap();
        conn.execute_batch("CREATE TABLE IF NOT EXISTS t (x INTEGER PRIMARY KEY, v BLOB)")
            .unwrap();
        let log = LogSyncs {
            store: path.clone(),
            sync,
            checkpoints,
        };
        let writer = Writer::start(conn, StoreBatches::new(&[]), log).unwrap();
        (writer, path)
    }

    /// `x` in `t`, as another connection reads it.
    fn stored(path: &std::path::Path, x: i64) -> bool {
        let reader = Connection::open(path).unwrap();
        reader
            .query_row("SELECT count(*) FROM t WHERE x = ?1", [x], |r| {
                r.get::<_, i64>(0)
            })
            .unwrap()
            == 1
    }

    async fn insert(writer: &Writer, x: i64) -> Result<(), StoreError> {
        writer
            .run(move |conn| {
                conn.execute("INSERT INTO t (x) VALUES (?1)", [x])?;
                Ok(())
            })
            .await
    }

    /// A log whose sync says when it is entered and returns when opened
    /// (one open returns one sync).
    struct Gate {
        entered: std::sync::mpsc::Sender<()>,
        open: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
    }

    impl SyncLog for Gate {
        fn sync(&self, _: usize) -> std::io::Result<()> {
            let _ = self.entered.send(());
            let open = self.open.lock().unwrap();
            open.recv().map_err(std::io::Error::other)
        }
    }

    /// A writer whose first call, inserting 1, has committed and waits at
    /// the gate of its sync; the gate's key.
    struct HeldAtSync {
        writer: Arc<Writer>,
        path: std::path::PathBuf,
        call: tokio::task::JoinHandle<Result<(), StoreError>>,
        open: std::sync::mpsc::Sender<()>,
    }

    async fn held_at_sync(dir: &tempfile::TempDir) -> HeldAtSync {
        let (entered, syncing) = std::sync::mpsc::channel();
        let (open, gate) = std::sync::mpsc::channel();
        let sync = Gate {
            entered,
            open: std::sync::Mutex::new(gate),
        };
        let (writer, path) = writer_on_file(dir, Some(Box::new(sync)), Thresholds::default());
        let writer = Arc::new(writer);
        let call = tokio::spawn({
            let writer = writer.clone();
            async move { insert(&writer, 1).await }
        });
        let syncing =
            tokio::task::spawn_blocking(move || syncing.recv_timeout(Duration::from_secs(30)));
        syncing
            .await
            .unwrap()
            .expect("the committed batch's log is synced");
        HeldAtSync {
            writer,
            path,
            call,
            open,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_is_answered_only_after_the_log_holding_it_is_synced() {
        let dir = tempfile::tempdir().unwrap();
        let held = held_at_sync(&dir).await;
        assert!(
            stored(&held.path, 1),
            "committed, and visible to other connections"
        );
        assert!(
            !held.call.is_finished(),
            "not answered before the sync returned"
        );
        held.open.send(()).unwrap();
        held.call.await.unwrap().unwrap();
        held.writer.stop().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_answers_only_once_what_it_saw_is_durable() {
        let dir = tempfile::tempdir().unwrap();
        let held = held_at_sync(&dir).await;
        let readers = crate::reader::Readers::open(&held.path, held.writer.horizon()).unwrap();
        // The read's snapshot holds the committed row; its answer waits.
        let read = readers
            .run(|conn| Ok(conn.query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0))?));
        tokio::pin!(read);
        let answered_early = tokio::time::timeout(Duration::from_millis(50), &mut read).await;
        assert!(
            answered_early.is_err(),
            "a read answered before the log was durable"
        );
        held.open.send(()).unwrap();
        assert_eq!(read.await.unwrap(), 1);
        held.call.await.unwrap().unwrap();
        held.writer.stop().await;
    }

    /// A log that cannot be synced.
    struct Broken;

    impl SyncLog for Broken {
        fn sync(&self, _: usize) -> std::io::Result<()> {
            Err(std::io::Error::other("injected EIO"))
        }
    }

    #[tokio::test]
    async fn a_failed_sync_fails_the_call_and_every_later_one_unrun() {
        let dir = tempfile::tempdir().unwrap();
        let (writer, path) = writer_on_file(&dir, Some(Box::new(Broken)), Thresholds::default());
        let first = insert(&writer, 1).await;
        assert!(
            matches!(&first, Err(StoreError::Failed(f)) if f.contains("injected EIO")),
            "{first:?}"
        );
        let later = insert(&writer, 2).await;
        assert!(
            matches!(&later, Err(StoreError::Failed(f)) if f.contains("injected EIO")),
            "{later:?}"
        );
        assert!(!stored(&path, 2), "a call after the failure is not run");
        assert!(writer.horizon().durable().await.is_err(), "reads fail too");
        writer.stop().await;
    }

    #[tokio::test]
    async fn the_log_is_copied_and_restarted_so_it_stays_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let thresholds = Thresholds {
            passive: 64 << 10,
            restart: 256 << 10,
        };
        let (writer, path) = writer_on_file(&dir, None, thresholds);
        // ~4 MiB of pages, a call a batch: sixteen times the restart size.
        for x in 0..1000_i64 {
            writer
                .run(move |conn| {
                    conn.execute("INSERT INTO t (x, v) VALUES (?1, zeroblob(4000))", [x])?;
                    Ok(())
                })
                .await
                .unwrap();
        }
        writer.stop().await;
        let wal = std::fs::metadata(path.with_extension("db-wal")).map_or(0, |m| m.len());
        // At most the writer's own bound (four restarts' worth) and the
        // batch that crossed it.
        assert!(
            wal <= 4 * thresholds.restart + (64 << 10),
            "the log grew to {wal} bytes"
        );
        let reader = Connection::open(&path).unwrap();
        let check: String = reader
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok");
        let rows: i64 = reader
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 1000);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_calls_are_each_answered_after_their_commit() {
        let dir = tempfile::tempdir().unwrap();
        let sync = syncer::WalFile::of_store(&dir.path().join("writer.db"));
        let (writer, _) = writer_on_file(&dir, Some(Box::new(sync)), Thresholds::default());
        let writer = Arc::new(writer);
        let mut calls = tokio::task::JoinSet::new();
        for x in 0..200_i64 {
            let writer = writer.clone();
            calls.spawn(async move { insert(&writer, x).await.map(|()| x) });
        }
        let mut seen = Vec::new();
        while let Some(result) = calls.join_next().await {
            seen.push(result.unwrap().unwrap());
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..200).collect::<Vec<_>>());
        let count = writer
            .run(|conn| Ok(conn.query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0))?))
            .await
            .unwrap();
        assert_eq!(count, 200);
        writer.stop().await;
        let after = writer.run(|_| Ok(())).await;
        assert!(matches!(after, Err(StoreError::Closed)));
    }
}
