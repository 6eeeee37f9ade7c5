//! Checkpoints off the writer's thread (where this sits
//! among the SQLite store's parts: the layout in [`super`]'s docs).
//!
//! SQLite copies the log's pages into the database file (a checkpoint) on
//! the connection that commits, once the log holds 1,000 pages: reads of
//! the log, writes at random places of the database file and two fsyncs,
//! on the thread every first write waits for. The writer's connection
//! never checkpoints (`wal_autocheckpoint = 0`); this thread does, on a
//! connection of its own:
//! - a passive checkpoint each time the log has grown by
//!   [`Thresholds::passive`]: it copies what is committed without taking the
//!   write lock, so the writer goes on committing;
//! - after each, an `fdatasync` of the database file: SQLite syncs the
//!   database at the end of a checkpoint only when the checkpoint copied
//!   the whole log, which under steady writes only the writer's catch-up
//!   (below) does, and that sync would then write out every page copied
//!   since the log last restarted, tens of milliseconds with the writer
//!   waiting;
//! - once the log holds [`Thresholds::restart`], it asks the writer to catch
//!   up right after its passive checkpoint (`Checkpoints::catch_up`): the
//!   writer copies the little that came meanwhile itself, between two of
//!   its batches, so everything is copied and its next commit writes the
//!   log from its start again (SQLite restarts a log that is wholly
//!   copied and that no reader is still reading), and the log does not
//!   grow without bound. A `RESTART` checkpoint here would take the
//!   writer's lock instead, and the writer would wait for it in SQLite's
//!   busy handler, which sleeps milliseconds at a time.
//!
//! Invariants:
//! - a frame is copied into the database only once it is durable in the
//!   log: the connection runs at `synchronous = NORMAL`, so each checkpoint
//!   syncs the log before it copies anything, and the database file
//!   before the log may restart (the writer's own syncs are deferred,
//!   `crates/wal-buffer`);
//! - it is woken by the writer's commits, never by a clock: a store that
//!   takes no writes is not checkpointed, as SQLite's own checkpoints
//!   would not be;
//! - a checkpoint that fails or finds the store busy is logged and tried
//!   again at the next wake; the writer also catches up whenever the log
//!   outgrows four times [`Thresholds::restart`], should this thread fall
//!   behind.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::Connection;

use idemgate_store::StoreError;

/// This module's log target (`idemgate_store`'s crate docs, "Log targets").
const TARGET: &str = "idemgate::store::sqlite::checkpointer";

/// When the log is copied and restarted, in bytes of log.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Thresholds {
    /// The log's growth that wakes the checkpointer.
    pub(crate) passive: u64,
    /// A log this long is restarted after its passive checkpoint; one
    /// four times as long means the checkpointer has fallen behind (or
    /// keeps finding the store busy), and the writer catches up whatever
    /// it is told.
    pub(crate) restart: u64,
}

impl Default for Thresholds {
    /// SQLite's own interval (1,000 pages of 4 KiB); a restart each 64 MiB
    /// (a few a second under a storm of first writes, ~1–3 ms of the
    /// writer's time each, measured).
    fn default() -> Self {
        Thresholds {
            passive: 4 << 20,
            restart: 64 << 20,
        }
    }
}
/// How long the connection waits for a lock (a checkpoint takes no
/// writer's lock; this bounds the rare wait on another checkpoint).
const BUSY_WAIT: Duration = Duration::from_secs(1);

/// The writer's side: counts the log's growth and wakes the thread.
pub(crate) struct Checkpoints {
    thresholds: Thresholds,
    wake: Option<mpsc::SyncSender<u64>>,
    thread: Option<JoinHandle<()>>,
    /// Where the log ended at the last commit that wrote to it.
    log_end: u64,
    /// Bytes the log grew by since the thread was last woken.
    grown: u64,
    /// Set by the thread after a checkpoint of a long log: the writer is
    /// to copy the rest and so restart the log.
    catch_up: Arc<AtomicBool>,
}

impl Checkpoints {
    /// Starts the thread, with its own connection to the store at `path`.
    pub fn start(path: &Path, thresholds: Thresholds) -> Result<Checkpoints, StoreError> {
        let conn = connect(path)?;
        let database = File::open(path).map_err(|e| {
            StoreError::Failed(format!("cannot open {} to sync it: {e}", path.display()))
        })?;
        // One wake waiting is enough: it carries the log's latest end.
        let (wake, woken) = mpsc::sync_channel(1);
        let catch_up = Arc::new(AtomicBool::new(false));
        let asked = catch_up.clone();
        let thread = std::thread::Builder::new()
            .name("idemgate-ckpt".into())
            .spawn(move || checkpoint(&conn, &database, &woken, &asked, thresholds.restart))
            .map_err(|e| StoreError::Failed(format!("cannot start the checkpoint thread: {e}")))?;
        Ok(Checkpoints {
            thresholds,
            wake: Some(wake),
            thread: Some(thread),
            log_end: 0,
            grown: 0,
            catch_up,
        })
    }

    /// A commit left the log ending at `log_end`.
    pub fn logged(&mut self, log_end: u64) {
        // A log that restarted grew from its start.
        self.grown += log_end.checked_sub(self.log_end).unwrap_or(log_end);
        self.log_end = log_end;
        if self.grown >= self.thresholds.passive
            && let Some(wake) = &self.wake
        {
            // Full: the thread is still at work, and will read a later end
            // at its next wake.
            if wake.try_send(log_end).is_ok() {
                self.grown = 0;
            }
        }
    }

    /// Whether the writer is to copy the rest of the log now, between
    /// batches (with its syncs not deferred): asked by the thread after a
    /// checkpoint of a long log, or the log has outgrown what the thread
    /// keeps up with.
    pub(crate) fn catch_up(&self) -> bool {
        self.catch_up.swap(false, Ordering::Relaxed) || self.log_end >= 4 * self.thresholds.restart
    }

    /// Ends the thread after the checkpoint it may be running.
    pub fn stop(&mut self) {
        self.wake.take();
        super::join(self.thread.take(), "checkpoint");
    }
}

impl Drop for Checkpoints {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The thread: at each wake a passive checkpoint, and a long log handed
/// to the writer to finish.
fn checkpoint(
    conn: &Connection,
    database: &File,
    woken: &mpsc::Receiver<u64>,
    catch_up: &AtomicBool,
    restart: u64,
) {
    while let Ok(log_end) = woken.recv() {
        let copied = passive(conn).and_then(|()| {
            (database.sync_data()).map_err(|e| StoreError::Failed(format!("fdatasync: {e}")))
        });
        if let Err(error) = copied {
            tracing::warn!(target: TARGET, %error, "a checkpoint of the SQLite store failed; retried later");
            continue;
        }
        if log_end >= restart {
            catch_up.store(true, Ordering::Relaxed);
        }
    }
}

/// One passive checkpoint: copies what is committed, as far as no reader
/// still needs the log; an error if it was kept from finishing.
pub(crate) fn passive(conn: &Connection) -> Result<(), StoreError> {
    let busy: i64 = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| row.get(0))?;
    if busy != 0 {
        return Err(StoreError::Busy("a checkpoint found the store busy".into()));
    }
    Ok(())
}

/// The checkpointer's connection: the default VFS, syncs at each
/// checkpoint (`NORMAL`), a bounded wait for the write lock and readers.
fn connect(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(BUSY_WAIT)?;
    conn.execute_batch("PRAGMA synchronous = NORMAL;")?;
    Ok(conn)
}
