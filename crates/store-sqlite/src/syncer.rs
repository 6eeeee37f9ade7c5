//! The log's syncs, off the writer's thread (where this
//! sits among the SQLite store's parts: the layout in [`super`]'s docs).
//!
//! With `durability = "full"` the writer commits each batch with the WAL
//! sync SQLite asks for deferred (`crates/wal-buffer`): the frames are
//! written, the commit is published, and the batch's answers come here.
//! Two threads make the log durable: a free one covers every batch handed
//! over since the last sync began with one `fdatasync`, then answers what
//! that made durable, while the writer already commits the next batch,
//! which the other thread can begin to sync at once. The writer never
//! waits for the disk, and a commit's caller waits for about one sync.
//!
//! Invariants:
//! - durable before answered: a batch's answers leave only after an
//!   `fdatasync` of the log that began after its commit's frames were
//!   written (its own thread's or a later one's, whichever returns
//!   first), so no claim sends a byte upstream, and no client hears an
//!   outcome, before it is on disk;
//! - in order: batches are answered in the order they committed, each
//!   after every earlier one; a batch that wrote nothing (a claim that met
//!   a stored operation, a ping) still waits behind the syncs of the
//!   batches before it, since what it read may be theirs;
//! - a failed sync fails every batch not yet answered (a sync still
//!   running on the other thread included) and every call after it: once
//!   `fdatasync` has failed, what the kernel kept of the log is unknown,
//!   so the store takes no further work (503, readiness fails) until the
//!   gateway restarts and recovers what was in flight as `unknown`;
//! - reads wait for durability ([`Horizon`]): a read connection can see a
//!   commit before its sync, so a read answers only once every batch that
//!   may have committed before it ended is durable.

use std::collections::VecDeque;
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::JoinHandle;

use std::time::Instant;

use tokio::sync::watch;

use idemgate_store::{StoreBatches, StoreError};

/// This module's log target (`idemgate_store`'s crate docs, "Log targets").
const TARGET: &str = "idemgate::store::sqlite::syncer";

/// The log's syncs in the store's metrics: the calls one sync answered,
/// and how long the `fdatasync` took.
pub(crate) const SYNC: &str = "sync";

/// A committed batch's answers, given once the log holds it.
pub(crate) trait Batch: Send + 'static {
    /// The calls it answers.
    fn calls(&self) -> usize;
    /// Settles and delivers every answer: `failed` when the batch did not
    /// commit or its log could not be made durable.
    fn deliver(self: Box<Self>, failed: Option<&str>);
}

/// How far the log is durable, for the reads that must not get ahead of
/// it. Batches are numbered in the order they commit.
pub(crate) struct Horizon {
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
    pub(crate) fn synced(&self, batch: u64) {
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
    pub(crate) fn fail(&self, reason: String) {
        let _ = self.failure.set(reason);
        self.synced.send_replace(u64::MAX);
    }

    /// Why the log stopped being durable, if it has: the reason every
    /// call is failed with from then on.
    pub(crate) fn failure_reason(&self) -> Option<&str> {
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
/// stand-in in the tests that make it fail or hold it. Shared by the sync
/// threads, which may call it at once; `thread` names the caller.
pub(crate) trait SyncLog: Send + Sync + 'static {
    fn sync(&self, thread: usize) -> std::io::Result<()>;
}

/// The WAL file of the store at `path`, opened by each sync thread at its
/// first sync (the writer's connection creates it and keeps it for its
/// life, so the file opened is the one SQLite writes). Any descriptor of a
/// file syncs all of it, but each thread has its own: Linux reports a
/// writeback error once per open file, so two syncs running on one
/// descriptor could hear of one failed page write only once, and the
/// other would answer its batches as durable.
pub(crate) struct WalFile {
    path: PathBuf,
    files: [OnceLock<File>; SYNC_THREADS],
}

impl WalFile {
    pub fn of_store(store: &std::path::Path) -> WalFile {
        let mut path = store.as_os_str().to_owned();
        path.push("-wal");
        WalFile {
            path: path.into(),
            files: Default::default(),
        }
    }

    /// Sync thread `thread`'s descriptor, opened at its first use.
    fn file(&self, thread: usize) -> std::io::Result<&File> {
        let file = &self.files[thread];
        match file.get() {
            Some(opened) => Ok(opened),
            None => {
                let opened = File::open(&self.path)?;
                Ok(file.get_or_init(|| opened))
            }
        }
    }
}

impl SyncLog for Box<dyn SyncLog> {
    fn sync(&self, thread: usize) -> std::io::Result<()> {
        (**self).sync(thread)
    }
}

impl SyncLog for WalFile {
    fn sync(&self, thread: usize) -> std::io::Result<()> {
        self.file(thread)?.sync_data()
    }
}

/// How many syncs may run at once. A batch committed while a sync runs
/// begins its own at once on the other thread instead of waiting for the
/// running one to end and then for its own: a call waits for about one
/// sync rather than one and a half. Measured on 2 CPUs side by side with
/// one thread and with three (benches/README.md, "paired.sh: two builds
/// at the same time"): two pay, three do not.
const SYNC_THREADS: usize = 2;

/// The batches handed to the sync threads and not yet answered.
/// std Mutex: held only to push, take or look, never across a sync or an
/// answer.
#[derive(Default)]
struct Queue {
    state: Mutex<Waiting>,
    /// A batch was handed over, or covered (by a sync, or answered without
    /// one), or the queue closed.
    changed: Condvar,
}

/// Batches are counted in the order handed: the `n`th handed is batch
/// `n` here (not the horizon's commit number, which a batch that failed to
/// begin does not advance).
#[derive(Default)]
struct Waiting {
    /// Handed and not yet answerable, oldest first: the front is batch
    /// `answered + 1`.
    batches: VecDeque<Committed>,
    /// Batches handed so far.
    handed: u64,
    /// Batches through this one are covered by a sync that has begun (or
    /// need none).
    covered: u64,
    /// Batches through this one are durable: a sync that began after they
    /// were handed has returned.
    durable: u64,
    /// Batches taken to be answered so far.
    answered: u64,
    /// Taken to be answered, in order, each with whether the log had
    /// failed by then.
    answers: VecDeque<(Committed, bool)>,
    /// A thread is answering: it takes what the others add to `answers`.
    answering: bool,
    closed: bool,
}

impl Waiting {
    /// The batches a sync beginning now would cover for the first time:
    /// whether any owes one, and their calls.
    fn uncovered(&self) -> (bool, usize) {
        let from = usize::try_from(self.covered - self.answered).unwrap_or(usize::MAX);
        let new = self.batches.iter().skip(from);
        new.fold((false, 0), |(owed, calls), c| {
            (owed || c.owed, calls + c.batch.calls())
        })
    }

    /// Moves to `answers`, oldest first, every batch that may be answered
    /// now: each after all before it, once durable, or at once if it owes
    /// no sync (all before it are answered) or the log has failed.
    fn take_answerable(&mut self, failed: bool) {
        while let Some(front) = self.batches.front() {
            let durable = self.answered < self.durable;
            if !(failed || durable || !front.owed) {
                break;
            }
            self.answers
                .extend(self.batches.pop_front().map(|c| (c, failed)));
            self.answered += 1;
        }
        // A batch that owed nothing may be answered before any sync began.
        self.covered = self.covered.max(self.answered);
    }
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
pub(crate) struct Syncer {
    queue: Arc<Queue>,
    /// Empty once stopped.
    threads: Vec<JoinHandle<()>>,
}

impl Syncer {
    /// Starts the threads that sync `log` and answer in order; they count
    /// their syncs in `batches` (as `sync`).
    pub fn start(
        log: impl SyncLog,
        horizon: Arc<Horizon>,
        batches: StoreBatches,
    ) -> Result<Syncer, StoreError> {
        let log = Arc::new(log);
        let mut syncer = Syncer {
            queue: Arc::new(Queue::default()),
            threads: Vec::with_capacity(SYNC_THREADS),
        };
        for n in 0..SYNC_THREADS {
            let (log, queue, horizon, batches) = (
                log.clone(),
                syncer.queue.clone(),
                horizon.clone(),
                batches.clone(),
            );
            let thread = std::thread::Builder::new()
                .name(format!("idemgate-sync-{n}"))
                .spawn(move || sync_batches(n, &*log, &queue, &horizon, &batches))
                // Dropped, `syncer` closes the queue: the threads started end.
                .map_err(|e| StoreError::Failed(format!("cannot start a sync thread: {e}")))?;
            syncer.threads.push(thread);
        }
        Ok(syncer)
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
            // Only if the threads ended early, which `sync_batches` never
            // lets a batch cause: its callers hear that the store failed.
            drop(waiting);
            committed
                .batch
                .deliver(Some("the store's sync thread ended"));
            return;
        }
        waiting.batches.push_back(committed);
        waiting.handed += 1;
        drop(waiting);
        self.queue.changed.notify_all();
    }

    /// Returns once a sync has begun for every batch handed over, that is
    /// once the sync that will cover the writer's next batch can begin. A
    /// batch committed before that would wait for the same sync as the
    /// one already waiting, so the writer lets its queue fill meanwhile:
    /// one batch per sync, as large as the calls that came while the
    /// syncs before ran, and the shared pages (the table's last leaf, the
    /// index ends, the counts) written once per sync.
    pub(crate) fn wait_until_taken(&self) {
        let mut waiting = self.queue.lock();
        while waiting.covered < waiting.handed && !waiting.closed {
            waiting = self.queue.wait(waiting);
        }
    }

    /// Answers everything handed over, then ends the threads.
    pub fn stop(mut self) {
        self.queue.close();
        for thread in std::mem::take(&mut self.threads) {
            super::join(Some(thread), "sync");
        }
    }
}

impl Drop for Syncer {
    /// Dropped unstopped (a writer that never started): the threads
    /// answer what they hold and end by themselves.
    fn drop(&mut self) {
        self.queue.close();
    }
}

/// A thread: cover every batch handed over since the last sync began with
/// one sync, then answer whatever that made answerable, in order; repeat.
/// A sync covers every batch handed before it began, whichever thread
/// took them: `fdatasync` writes and waits for every page of the file
/// dirtied or being written before the call, so a later sync that returns
/// first makes an earlier thread's batches durable too, and they are
/// answered then.
fn sync_batches(
    thread: usize,
    log: &dyn SyncLog,
    queue: &Queue,
    horizon: &Horizon,
    batches: &StoreBatches,
) {
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
        while waiting.covered == waiting.handed && !waiting.closed {
            waiting = queue.wait(waiting);
        }
        if waiting.covered == waiting.handed {
            // Closed, and every batch left is covered by another thread's
            // sync, which answers it.
            return;
        }
        let (owed, calls) = waiting.uncovered();
        let covers = waiting.handed;
        waiting.covered = covers;
        drop(waiting);
        queue.changed.notify_all();
        let mut synced = false;
        if owed && horizon.failure_reason().is_none() {
            let started = Instant::now();
            let result = log.sync(thread);
            batches.observe(SYNC, calls, started.elapsed());
            match result {
                Ok(()) => synced = true,
                Err(error) => {
                    let reason = format!(
                        "the store's log could not be made durable ({error}); \
                         restart the gateway to recover"
                    );
                    tracing::error!(target: TARGET, %error, "fdatasync of the SQLite log failed: the store takes no more work");
                    horizon.fail(reason);
                }
            }
        }
        let mut waiting = queue.lock();
        if synced {
            waiting.durable = waiting.durable.max(covers);
        }
        waiting.take_answerable(horizon.failure_reason().is_some());
        // A batch that owed no sync, or met a failed log, may have been
        // covered just now without a sync: the writer may wait for that.
        queue.changed.notify_all();
        if waiting.answering {
            // The thread answering takes these after its own, in order.
            continue;
        }
        waiting.answering = true;
        let _answering = Answering(queue);
        loop {
            let answers = std::mem::take(&mut waiting.answers);
            if answers.is_empty() {
                break;
            }
            drop(waiting);
            answer(answers, horizon);
            waiting = queue.lock();
        }
        waiting.answering = false;
    }
}

/// Hands the answering over should an answer panic on the way: the thread
/// ends, and the other one answers what is left instead of leaving it to
/// a thread that is gone.
struct Answering<'a>(&'a Queue);

impl Drop for Answering<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.lock().answering = false;
        }
    }
}

/// Answers `answers` in order. The horizon first passes the last that
/// did not fail: durable, they are visible to reads before anyone hears.
fn answer(answers: VecDeque<(Committed, bool)>, horizon: &Horizon) {
    let durable = answers.iter().rev().find(|(_, log_failed)| !log_failed);
    if let Some((last, _)) = durable {
        horizon.synced(last.number);
    }
    for (c, log_failed) in answers {
        let failed = if log_failed {
            horizon.failure_reason()
        } else {
            c.failed.as_deref()
        };
        c.batch.deliver(failed);
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
        fn sync(&self, _: usize) -> std::io::Result<()> {
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

    /// A log whose every sync tells the test it began, with the handle
    /// that makes it return.
    struct Held(Mutex<mpsc::Sender<Release>>);

    impl SyncLog for Held {
        fn sync(&self, _: usize) -> std::io::Result<()> {
            let (release, released) = mpsc::channel();
            self.0
                .lock()
                .unwrap()
                .send(release)
                .map_err(std::io::Error::other)?;
            released.recv().map_err(std::io::Error::other)?
        }
    }

    /// Sync threads over a [`Held`] log, its horizon, and the syncs as
    /// they begin.
    fn held() -> (
        Syncer,
        Arc<Horizon>,
        mpsc::Receiver<mpsc::Sender<std::io::Result<()>>>,
    ) {
        let (began, syncs) = mpsc::channel();
        let (syncer, horizon) = started(Held(Mutex::new(began)));
        (syncer, horizon, syncs)
    }

    const WAIT: Duration = Duration::from_secs(30);

    /// A negative check: a wrong answer would come at once.
    const NONE_WITHIN: Duration = Duration::from_millis(50);

    type Release = mpsc::Sender<std::io::Result<()>>;

    /// Hands one batch owing a sync per thread; their syncs, held.
    fn every_thread_busy(
        syncer: &Syncer,
        horizon: &Horizon,
        log: &Log,
        told: &mpsc::Sender<(u64, Option<String>, usize)>,
        syncs: &mpsc::Receiver<Release>,
    ) -> Vec<Release> {
        (0..SYNC_THREADS)
            .map(|_| {
                hand(syncer, horizon, log, told, true);
                syncs.recv_timeout(WAIT).expect("a sync begins")
            })
            .collect()
    }

    /// A thread of the writer's waiting in `wait_until_taken`, and word
    /// once it returns; checked that it waits.
    fn writer_waiting(syncer: &Arc<Syncer>) -> (std::thread::JoinHandle<()>, mpsc::Receiver<()>) {
        let (free, freed) = mpsc::channel();
        let waiter = std::thread::spawn({
            let syncer = syncer.clone();
            move || {
                syncer.wait_until_taken();
                free.send(()).unwrap();
            }
        });
        assert!(
            freed.recv_timeout(NONE_WITHIN).is_err(),
            "free while a batch waits"
        );
        (waiter, freed)
    }

    #[test]
    fn the_writer_waits_while_a_batch_waits_for_a_free_sync() {
        let (syncer, horizon, syncs) = held();
        let syncer = Arc::new(syncer);
        let (log, (told, answers)) = (Log::default(), mpsc::channel());
        let mut running = every_thread_busy(&syncer, &horizon, &log, &told, &syncs);
        syncer.wait_until_taken();
        // Waits for a free thread, untaken.
        hand(&syncer, &horizon, &log, &told, true);
        let (waiter, freed) = writer_waiting(&syncer);
        running.remove(0).send(Ok(())).unwrap();
        freed
            .recv_timeout(WAIT)
            .expect("free once the batch is taken");
        running.push(syncs.recv_timeout(WAIT).expect("its sync begins"));
        for release in running {
            release.send(Ok(())).unwrap();
        }
        waiter.join().unwrap();
        Arc::into_inner(syncer).unwrap().stop();
        assert_eq!(answers.try_iter().count(), SYNC_THREADS + 1);
    }

    /// The writer waits for a batch that owes nothing while both syncs
    /// run; a sync returning (well or not) answers it without covering it
    /// by a sync of its own, and that frees the writer too.
    #[test]
    fn the_writer_is_freed_when_a_batch_is_answered_without_a_sync() {
        for outcome in [Ok(()), Err(std::io::Error::other("injected EIO"))] {
            let (syncer, horizon, syncs) = held();
            let syncer = Arc::new(syncer);
            let (log, (told, answers)) = (Log::default(), mpsc::channel());
            let mut running = every_thread_busy(&syncer, &horizon, &log, &told, &syncs);
            hand(&syncer, &horizon, &log, &told, false);
            let (waiter, freed) = writer_waiting(&syncer);
            running.pop().unwrap().send(outcome).unwrap();
            for _ in 0..=SYNC_THREADS {
                answers.recv_timeout(WAIT).expect("every batch answered");
            }
            freed
                .recv_timeout(WAIT)
                .expect("free once every batch is answered");
            for release in running {
                release.send(Ok(())).unwrap();
            }
            waiter.join().unwrap();
            Arc::into_inner(syncer).unwrap().stop();
        }
    }

    #[test]
    fn each_sync_thread_syncs_through_a_descriptor_of_its_own() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store.db");
        std::fs::write(dir.path().join("store.db-wal"), b"frames").unwrap();
        let wal = WalFile::of_store(&store);
        for thread in 0..SYNC_THREADS {
            wal.sync(thread).unwrap();
        }
        let descriptors: std::collections::HashSet<_> = wal
            .files
            .iter()
            .map(|file| file.get().expect("opened at its first sync").as_raw_fd())
            .collect();
        assert_eq!(descriptors.len(), SYNC_THREADS);
    }

    #[test]
    fn a_later_sync_that_returns_first_answers_the_batches_before_it_in_order() {
        let (syncer, horizon, syncs) = held();
        let (log, (told, answers)) = (Log::default(), mpsc::channel());
        let first = hand(&syncer, &horizon, &log, &told, true);
        let first_sync = syncs.recv_timeout(WAIT).unwrap();
        let second = hand(&syncer, &horizon, &log, &told, true);
        let second_sync = syncs.recv_timeout(WAIT).unwrap();
        // The second sync began after both batches were handed: it makes
        // both durable, whatever the first one does.
        second_sync.send(Ok(())).unwrap();
        let (number, failed, _) = answers.recv_timeout(WAIT).unwrap();
        assert_eq!((number, failed), (first, None));
        let (number, failed, _) = answers.recv_timeout(WAIT).unwrap();
        assert_eq!((number, failed), (second, None));
        assert_eq!(*horizon.synced.borrow(), second);
        first_sync.send(Ok(())).unwrap();
        syncer.stop();
        assert_eq!(answers.try_iter().count(), 0, "each batch is answered once");
        assert_eq!(*horizon.synced.borrow(), second);
    }

    #[test]
    fn a_batch_that_owes_no_sync_waits_for_the_sync_of_the_one_before() {
        let (syncer, horizon, syncs) = held();
        let (log, (told, answers)) = (Log::default(), mpsc::channel());
        let owing = hand(&syncer, &horizon, &log, &told, true);
        let sync = syncs.recv_timeout(WAIT).unwrap();
        let reading = hand(&syncer, &horizon, &log, &told, false);
        assert!(
            answers.recv_timeout(NONE_WITHIN).is_err(),
            "answered before the batch before it is durable"
        );
        assert!(syncs.try_recv().is_err(), "it begins no sync of its own");
        sync.send(Ok(())).unwrap();
        let order: Vec<_> = [answers.recv_timeout(WAIT), answers.recv_timeout(WAIT)]
            .into_iter()
            .map(|answer| answer.unwrap().0)
            .collect();
        assert_eq!(order, [owing, reading]);
        syncer.stop();
    }

    #[test]
    fn a_failed_sync_fails_the_batches_a_sync_still_running_covers() {
        let (syncer, horizon, syncs) = held();
        let (log, (told, answers)) = (Log::default(), mpsc::channel());
        hand(&syncer, &horizon, &log, &told, true);
        let first_sync = syncs.recv_timeout(WAIT).unwrap();
        hand(&syncer, &horizon, &log, &told, true);
        let second_sync = syncs.recv_timeout(WAIT).unwrap();
        second_sync
            .send(Err(std::io::Error::other("injected EIO")))
            .unwrap();
        for _ in 0..2 {
            let (_, failed, _) = answers.recv_timeout(WAIT).unwrap();
            assert!(
                failed
                    .as_deref()
                    .is_some_and(|f| f.contains("injected EIO")),
                "{failed:?}"
            );
        }
        // What the kernel kept is unknown: a sync that returns later
        // changes nothing.
        first_sync.send(Ok(())).unwrap();
        syncer.stop();
        assert_eq!(answers.try_iter().count(), 0);
        assert_eq!(
            *horizon.synced.borrow(),
            u64::MAX,
            "failed: reads wake, and fail"
        );
        assert!(horizon.failure().is_some());
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
