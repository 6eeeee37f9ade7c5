//! The log's syncs, off the writer thread (ARCHITECTURE.md §4, "The
//! writer and its batches").
//!
//! With `durability = "full"` the writer commits each batch with the WAL
//! sync SQLite asks for deferred (`crates/wal-buffer`): the frames are
//! written, the commit is published, and the batch's answers come here.
//! This thread makes the log durable with one `fdatasync` over every batch
//! handed to it before that sync began, then answers them, while the
//! writer already commits the next batch. The writer never waits for the
//! disk, and a commit's caller waits for one sync as before.
//!
//! Invariants:
//! - durable before answered: a batch's answers leave only after an
//!   `fdatasync` of the log that began after its commit's frames were
//!   written, so no claim sends a byte upstream, and no client hears an
//!   outcome, before it is on disk;
//! - in order: batches are answered in the order they committed, each
//!   after every earlier one; a batch that wrote nothing (a claim that met
//!   a stored operation, a ping) still waits behind the syncs of the
//!   batches before it, since what it read may be theirs;
//! - a failed sync fails its batches and every call after it: once
//!   `fdatasync` has failed, what the kernel kept of the log is unknown,
//!   so the store takes no further work (503, readiness fails) until the
//!   gateway restarts and recovers what was in flight as `unknown`;
//! - reads wait for durability ([`Horizon`]): a read connection can see a
//!   commit before its sync, so a read answers only once every batch that
//!   may have committed before it ended is durable.

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::JoinHandle;

use std::time::Instant;

use tokio::sync::watch;

use crate::store::{StoreBatches, StoreError};

/// The log's syncs in the store's metrics: the calls one sync answered,
/// and how long the `fdatasync` took.
pub const SYNC: &str = "sync";

/// A committed batch's answers, given once the log holds it.
pub trait Batch: Send + 'static {
    /// The calls it answers.
    fn calls(&self) -> usize;
    /// Settles and delivers every answer: `failed` when the batch did not
    /// commit or its log could not be made durable.
    fn deliver(self: Box<Self>, failed: Option<&str>);
}

/// How far the log is durable, for the reads that must not get ahead of
/// it. Batches are numbered in the order they commit.
pub struct Horizon {
    /// The last batch that began to commit (numbered before its `COMMIT`
    /// runs, so before any read can see it).
    committing: AtomicU64,
    /// The last batch whose log is durable.
    synced: watch::Sender<u64>,
    /// Why the log stopped being durable, once it has.
    failure: OnceLock<String>,
}

impl Horizon {
    pub fn new() -> Arc<Horizon> {
        Arc::new(Horizon {
            committing: AtomicU64::new(0),
            synced: watch::Sender::new(0),
            failure: OnceLock::new(),
        })
    }

    /// Numbers the batch about to commit (the writer, once its
    /// transaction holds the write lock and before its `COMMIT`).
    pub fn begin(&self) -> u64 {
        self.committing.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The last batch numbered.
    pub fn committing(&self) -> u64 {
        self.committing.load(Ordering::SeqCst)
    }

    /// Batches through `batch` are durable.
    pub fn synced(&self, batch: u64) {
        self.synced.send_if_modified(|synced| {
            let later = batch > *synced;
            if later {
                *synced = batch;
            }
            later
        });
    }

    /// The log can no longer be made durable: every read and write fails
    /// from now on.
    fn fail(&self, reason: String) {
        let _ = self.failure.set(reason);
        self.synced.send_replace(u64::MAX);
    }

    /// Why the log stopped being durable, if it has: the reason every
    /// call is failed with from then on.
    pub fn failure_reason(&self) -> Option<&str> {
        self.failure.get().map(String::as_str)
    }

    /// The same as the error a read fails with.
    pub fn failure(&self) -> Option<StoreError> {
        (self.failure_reason()).map(|reason| StoreError::Failed(reason.to_string()))
    }

    /// Waits until every batch that may have committed before now is
    /// durable. A read calls it after its snapshot was taken: a batch its
    /// snapshot holds began to commit before, so it is counted here.
    pub async fn durable(&self) -> Result<(), StoreError> {
        let seen = self.committing.load(Ordering::SeqCst);
        let mut synced = self.synced.subscribe();
        // The sender lives as long as `self`.
        let _ = synced.wait_for(|synced| *synced >= seen).await;
        self.failure().map_or(Ok(()), Err)
    }
}

/// One committed batch on its way to its callers.
struct Committed {
    number: u64,
    /// The commit deferred a sync of the log.
    owed: bool,
    /// Why the batch did not commit, if it did not.
    failed: Option<String>,
    batch: Box<dyn Batch>,
}

/// Makes a log durable: `fdatasync` of the WAL file in the gateway; a
/// stand-in in the tests that make it fail.
pub trait SyncLog: Send + 'static {
    fn sync(&mut self) -> std::io::Result<()>;
}

/// The WAL file of the store at `path`, opened at its first sync (the
/// writer's connection creates it and keeps it for its life, so the file
/// opened is the one SQLite writes). Any descriptor of a file syncs all of
/// it.
pub struct WalFile {
    path: PathBuf,
    file: Option<File>,
}

impl WalFile {
    pub fn of_store(store: &std::path::Path) -> WalFile {
        let mut path = store.as_os_str().to_owned();
        path.push("-wal");
        WalFile {
            path: path.into(),
            file: None,
        }
    }
}

impl SyncLog for Box<dyn SyncLog> {
    fn sync(&mut self) -> std::io::Result<()> {
        (**self).sync()
    }
}

impl SyncLog for WalFile {
    fn sync(&mut self) -> std::io::Result<()> {
        let file = match &mut self.file {
            Some(file) => file,
            None => self.file.insert(File::open(&self.path)?),
        };
        file.sync_data()
    }
}

/// The batches handed to the sync thread and not yet taken by it.
/// std Mutex: held only to push, take or look.
#[derive(Default)]
struct Queue {
    state: Mutex<Waiting>,
    /// A batch was handed over, or the waiting ones taken, or the queue
    /// closed.
    changed: Condvar,
}

#[derive(Default)]
struct Waiting {
    batches: Vec<Committed>,
    closed: bool,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, Waiting> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait<'a>(&self, waiting: MutexGuard<'a, Waiting>) -> MutexGuard<'a, Waiting> {
        self.changed
            .wait(waiting)
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn close(&self) {
        self.lock().closed = true;
        self.changed.notify_all();
    }
}

/// The handle the writer hands its committed batches to.
pub struct Syncer {
    queue: Arc<Queue>,
    /// `None` once stopped.
    thread: Option<JoinHandle<()>>,
}

impl Syncer {
    /// Starts the thread that syncs `log` and answers in order; it counts
    /// its syncs in `batches` (as `sync`).
    pub fn start(
        log: impl SyncLog,
        horizon: Arc<Horizon>,
        batches: StoreBatches,
    ) -> Result<Syncer, StoreError> {
        let queue = Arc::new(Queue::default());
        let taken = queue.clone();
        let thread = std::thread::Builder::new()
            .name("idemgate-sync".into())
            .spawn(move || sync_batches(log, &taken, &horizon, &batches))
            .map_err(|e| StoreError::Failed(format!("cannot start the sync thread: {e}")))?;
        Ok(Syncer {
            queue,
            thread: Some(thread),
        })
    }

    /// Hands over batch `number`, which owes a sync of the log if `owed`.
    pub fn hand(&self, number: u64, owed: bool, failed: Option<String>, batch: Box<dyn Batch>) {
        let committed = Committed {
            number,
            owed,
            failed,
            batch,
        };
        let mut waiting = self.queue.lock();
        if waiting.closed {
            // Only if the thread ended early, which `sync_batches` never
            // lets a batch cause: its callers hear that the store failed.
            drop(waiting);
            committed
                .batch
                .deliver(Some("the store's sync thread ended"));
            return;
        }
        waiting.batches.push(committed);
        drop(waiting);
        self.queue.changed.notify_all();
    }

    /// Returns once the thread has taken every batch handed to it, that
    /// is once the sync that will cover the writer's next batch can
    /// begin. A batch committed before that would wait for the same sync
    /// as the one already waiting, so the writer lets its queue fill
    /// meanwhile: one batch per sync, as large as the calls that came
    /// during the sync before, and the shared pages (the table's last
    /// leaf, the index ends, the counts) written once per sync.
    pub fn wait_until_taken(&self) {
        let mut waiting = self.queue.lock();
        while !waiting.batches.is_empty() && !waiting.closed {
            waiting = self.queue.wait(waiting);
        }
    }

    /// Answers everything handed over, then ends the thread.
    pub fn stop(mut self) {
        self.queue.close();
        super::join(self.thread.take(), "sync");
    }
}

impl Drop for Syncer {
    /// Dropped unstopped (a writer that never started): the thread
    /// answers what it holds and ends by itself.
    fn drop(&mut self) {
        self.queue.close();
    }
}

/// The thread: take every batch handed over, one sync for all of them,
/// answer them in order, repeat.
fn sync_batches(mut log: impl SyncLog, queue: &Queue, horizon: &Horizon, batches: &StoreBatches) {
    /// Closes the queue however the thread ends, so the writer never
    /// waits on it in vain.
    struct Closing<'a>(&'a Queue);
    impl Drop for Closing<'_> {
        fn drop(&mut self) {
            self.0.close();
        }
    }
    let _closing = Closing(queue);
    loop {
        let mut waiting = queue.lock();
        while waiting.batches.is_empty() && !waiting.closed {
            waiting = queue.wait(waiting);
        }
        let ready = std::mem::take(&mut waiting.batches);
        if ready.is_empty() {
            return;
        }
        drop(waiting);
        queue.changed.notify_all();
        if horizon.failure_reason().is_none() && ready.iter().any(|c| c.owed) {
            let started = Instant::now();
            let synced = log.sync();
            let calls = ready.iter().map(|c| c.batch.calls()).sum();
            batches.observe(SYNC, calls, started.elapsed());
            if let Err(error) = synced {
                let reason = format!(
                    "the store's log could not be made durable ({error}); \
                     restart the gateway to recover"
                );
                tracing::error!(%error, "fdatasync of the SQLite log failed: the store takes no more work");
                horizon.fail(reason);
            }
        }
        let failure = horizon.failure_reason();
        let last = ready.last().map_or(0, |c| c.number);
        for c in ready {
            let failed = failure.or(c.failed.as_deref());
            c.batch.deliver(failed);
        }
        if failure.is_none() {
            horizon.synced(last);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// A log whose syncs are counted, and fail once `fail` is set.
    #[derive(Clone, Default)]
    struct Log {
        syncs: Arc<Mutex<usize>>,
        fail: Arc<std::sync::atomic::AtomicBool>,
    }

    impl SyncLog for Log {
        fn sync(&mut self) -> std::io::Result<()> {
            *self.syncs.lock().unwrap() += 1;
            if self.fail.load(Ordering::SeqCst) {
                return Err(std::io::Error::other("injected EIO"));
            }
            Ok(())
        }
    }

    /// A batch that reports what it was told, and how many syncs the log
    /// had made by then.
    struct Told {
        log: Log,
        told: mpsc::Sender<(u64, Option<String>, usize)>,
        number: u64,
    }

    impl Batch for Told {
        fn calls(&self) -> usize {
            1
        }

        fn deliver(self: Box<Self>, failed: Option<&str>) {
            let syncs = *self.log.syncs.lock().unwrap();
            let _ = (self.told).send((self.number, failed.map(str::to_string), syncs));
        }
    }

    fn hand(
        syncer: &Syncer,
        horizon: &Horizon,
        log: &Log,
        told: &mpsc::Sender<(u64, Option<String>, usize)>,
        owed: bool,
    ) -> u64 {
        let number = horizon.begin();
        let batch = Told {
            log: log.clone(),
            told: told.clone(),
            number,
        };
        syncer.hand(number, owed, None, Box::new(batch));
        number
    }

    /// A sync thread over `log`, and its horizon.
    fn started(log: impl SyncLog) -> (Syncer, Arc<Horizon>) {
        let horizon = Horizon::new();
        let syncer = Syncer::start(log, horizon.clone(), StoreBatches::new(&[SYNC])).unwrap();
        (syncer, horizon)
    }

    #[test]
    fn a_batch_is_answered_after_a_sync_and_in_order() {
        let log = Log::default();
        let (syncer, horizon) = started(log.clone());
        let (told, answers) = mpsc::channel();
        let owing = hand(&syncer, &horizon, &log, &told, true);
        // A batch that wrote nothing still waits behind the one before.
        let reading = hand(&syncer, &horizon, &log, &told, false);
        syncer.stop();
        let answers: Vec<_> = answers.try_iter().collect();
        assert_eq!(answers.len(), 2);
        assert_eq!(answers[0].0, owing);
        assert_eq!(answers[1].0, reading);
        for (_, failed, syncs) in &answers {
            assert_eq!(failed, &None);
            assert!(*syncs >= 1, "answered only after the log was synced");
        }
        assert_eq!(*horizon.synced.borrow(), reading);
    }

    #[test]
    fn a_failed_sync_fails_its_batch_and_every_one_after() {
        let log = Log::default();
        let (syncer, horizon) = started(log.clone());
        let (told, answers) = mpsc::channel();
        log.fail.store(true, Ordering::SeqCst);
        hand(&syncer, &horizon, &log, &told, true);
        let (_, first, _) = answers.recv().unwrap();
        // The disk would take the next sync: no matter.
        log.fail.store(false, Ordering::SeqCst);
        hand(&syncer, &horizon, &log, &told, true);
        syncer.stop();
        let (_, second, _) = answers.recv().unwrap();
        for failed in [first, second] {
            assert!(
                failed
                    .as_deref()
                    .is_some_and(|f| f.contains("injected EIO")),
                "{failed:?}"
            );
        }
        assert_eq!(
            *log.syncs.lock().unwrap(),
            1,
            "no sync is tried after a failed one"
        );
        assert!(horizon.failure().is_some());
    }

    /// A log whose sync returns only when the test opens it.
    struct Gate(mpsc::Receiver<()>);

    impl SyncLog for Gate {
        fn sync(&mut self) -> std::io::Result<()> {
            self.0.recv().map_err(std::io::Error::other)
        }
    }

    #[test]
    fn the_writer_waits_while_a_batch_waits_for_the_next_sync() {
        let (open, gate) = mpsc::channel();
        let (syncer, horizon) = started(Gate(gate));
        let syncer = Arc::new(syncer);
        let (log, (told, answers)) = (Log::default(), mpsc::channel());
        // Taken: its sync waits at the gate.
        hand(&syncer, &horizon, &log, &told, true);
        syncer.wait_until_taken();
        // Waits for the next sync, untaken.
        hand(&syncer, &horizon, &log, &told, true);
        let (free, freed) = mpsc::channel();
        let waiter = std::thread::spawn({
            let syncer = syncer.clone();
            move || {
                syncer.wait_until_taken();
                free.send(()).unwrap();
            }
        });
        // A negative check: a wrong answer would come at once.
        assert!(
            freed.recv_timeout(Duration::from_millis(50)).is_err(),
            "free while a batch waits"
        );
        open.send(()).unwrap();
        freed
            .recv_timeout(Duration::from_secs(30))
            .expect("free once the batch is taken");
        open.send(()).unwrap();
        waiter.join().unwrap();
        Arc::into_inner(syncer).unwrap().stop();
        assert_eq!(answers.try_iter().count(), 2);
    }

    #[tokio::test]
    async fn a_read_waits_until_what_it_may_have_seen_is_durable() {
        let horizon = Horizon::new();
        let batch = horizon.begin();
        let read = tokio::spawn({
            let horizon = horizon.clone();
            async move { horizon.durable().await }
        });
        tokio::task::yield_now().await;
        assert!(!read.is_finished(), "batch {batch} is not durable yet");
        horizon.synced(batch);
        assert!(read.await.unwrap().is_ok());
        // Nothing committing: a read goes straight through.
        assert!(horizon.durable().await.is_ok());
    }

    #[tokio::test]
    async fn a_read_fails_once_the_log_cannot_be_made_durable() {
        let horizon = Horizon::new();
        horizon.begin();
        horizon.fail("injected".into());
        assert!(matches!(
            horizon.durable().await,
            Err(StoreError::Failed(_))
        ));
    }
}
