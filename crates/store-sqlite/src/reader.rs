//! The SQLite readers: read-only connections of their own, so that no read
//! (a status lookup, the admin API and console, a `/metrics` scrape, the
//! replica-free pause re-read) ever waits in the writer's queue or holds
//! its transaction open (ARCHITECTURE.md §4, "Reads and writes").
//!
//! Invariants:
//! - a reader never writes: its connections are opened read-only and
//!   `query_only`; every write, and every read that must be atomic with a
//!   write (the claim's own look-up), stays on the writer;
//! - a read is one WAL snapshot: each call runs in one deferred
//!   transaction, so it sees every batch that committed before its first
//!   statement and nothing of a later one. The writer answers its callers
//!   only after their batch committed, so anything a client or an operator
//!   was told about is visible to every read that starts afterwards; a
//!   read can miss only a batch still committing as it starts — the same
//!   answer a moment earlier, never an outcome that did not happen;
//! - a read answers only with what is durable: the writer's commits are
//!   visible before their log is synced ([`super::syncer`]), so a read
//!   that found its answer waits until every batch that may have
//!   committed before it ended is durable (at most one sync, and nothing
//!   when no write is in flight);
//! - at most [`READERS`] reads run at once, each on the blocking pool; a
//!   read that cannot start within the writer's queue timeout is refused
//!   (503), like a write.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OpenFlags};
use tokio::sync::Semaphore;

use super::syncer::Horizon;
use super::writer::QUEUE_TIMEOUT;
use idemgate_store::StoreError;

/// Reads at once: as many as this machine has cores to spare for them is
/// plenty (a read is microseconds once its pages are cached); more would
/// only hold more page caches.
const READERS: usize = 4;

pub(crate) struct Readers {
    path: PathBuf,
    /// Connections not in use. std Mutex: held only to push or pop.
    idle: Mutex<Vec<Connection>>,
    /// One per read running; a read takes an idle connection or opens one.
    running: Arc<Semaphore>,
    /// How far the log is durable: a read answers only with what is.
    horizon: Arc<Horizon>,
}

impl Readers {
    /// Readers of the store at `path`, which the writer has opened (in WAL
    /// mode) already; the first connection is opened here, to fail early.
    pub fn open(path: &Path, horizon: Arc<Horizon>) -> Result<Self, StoreError> {
        let first = connect(path)?;
        Ok(Readers {
            path: path.to_path_buf(),
            idle: Mutex::new(vec![first]),
            running: Arc::new(Semaphore::new(READERS)),
            horizon,
        })
    }

    /// Closes the connections not in use (a read after this opens one).
    pub fn close(&self) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.clear();
        }
    }

    /// Runs `read` in one snapshot on a reader connection.
    pub async fn run<T, F>(&self, read: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let busy = || StoreError::Busy("every store reader is busy".into());
        let permit = tokio::time::timeout(QUEUE_TIMEOUT, self.running.clone().acquire_owned())
            .await
            .map_err(|_| busy())?
            .map_err(|_| busy())?;
        let idle = self.idle.lock().ok().and_then(|mut idle| idle.pop());
        let conn = match idle {
            Some(conn) => conn,
            None => connect(&self.path)?,
        };
        let ran = tokio::task::spawn_blocking(move || {
            let result = snapshot(&conn, read);
            (result, conn)
        })
        .await;
        drop(permit);
        match ran {
            Ok((result, conn)) => {
                if let Ok(mut idle) = self.idle.lock() {
                    idle.push(conn);
                }
                let result = result?;
                // After the snapshot: whatever it held began to commit
                // before this.
                self.horizon.durable().await?;
                Ok(result)
            }
            // A read that panicked takes its connection with it; the next
            // read opens another.
            Err(error) => Err(StoreError::Corrupt(format!("a store read failed: {error}"))),
        }
    }
}

/// `read` inside one deferred transaction: one snapshot for all its
/// statements.
fn snapshot<T>(
    conn: &Connection,
    read: impl FnOnce(&Connection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    conn.execute_batch("BEGIN DEFERRED")?;
    let result = read(conn);
    // Ending a read-only transaction cannot lose anything.
    conn.execute_batch("COMMIT")?;
    result
}

/// A read-only connection: it cannot write even by mistake, and never
/// takes the write lock a writer would wait on.
fn connect(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(QUEUE_TIMEOUT)?;
    conn.execute_batch("PRAGMA query_only = 1; PRAGMA temp_store = MEMORY;")?;
    conn.set_prepared_statement_cache_capacity(32);
    Ok(conn)
}
