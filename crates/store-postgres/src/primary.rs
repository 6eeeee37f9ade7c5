//! The server the store writes to: the primary among those its URL names
//! (`config::postgres_options`), followed across a promotion without a
//! restart.
//!
//! Invariants:
//! - no statement runs on a server in recovery (a standby) or one that
//!   refuses writes: each connection of the store's pools is checked once,
//!   right after it is made ([`check`]), and one that fails the check is
//!   closed unused while the pool tries again, within its acquire timeout.
//!   A server goes into recovery only through a restart, which breaks its
//!   connections, so a connection checked once stays on a primary. This
//!   holds for one stable address that moves to another server as well;
//! - the pools connect to one server at a time, the current primary. A
//!   sign that it is gone (a connection-level error, a refused check, a
//!   failed lease renewal) wakes the follower ([`Primary::follow`]), which
//!   asks every server at once, each within [`PROBE_TIMEOUT`], keeps the
//!   current one if it is still writable and otherwise points every pool
//!   at the first writable one in the URL's order. While none is, it asks
//!   again, at most [`SEARCH_EVERY`] apart, until one is or the store
//!   closes. A call waiting for a connection meanwhile gets one on the new
//!   primary (the pool reads its target again on each try) or fails when
//!   its acquire timeout passes (503, nothing claimed);
//! - the requests pay nothing per statement for this: the check is one
//!   round trip per new connection, and the follower works beside them.
//!
//! Connections already open to a former primary stay in their pool until
//! they break; two writable servers at once (a former primary back as a
//! primary beside the promoted one) is the operator's to prevent.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions, Connection};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::url::PostgresServers;
use idemgate_store::StoreError;

/// This module's log target (`idemgate_store`'s crate docs, "Log targets").
const TARGET: &str = "idemgate::store::postgres::primary";

/// How long a server may take to connect and answer the check before it
/// counts as unreachable.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The longest pause between two searches while no server is writable;
/// the first comes sooner, and searches never follow each other closer
/// than [`SEARCH_FIRST`].
const SEARCH_EVERY: Duration = Duration::from_secs(1);
const SEARCH_FIRST: Duration = Duration::from_millis(100);

/// Startup parameters of a pool's sessions (`synchronous_commit`, say),
/// whichever server it connects to.
pub type Session = &'static [(&'static str, &'static str)];

/// The servers, which one the pools connect to, and the pools that follow
/// it; cheap to clone.
#[derive(Clone)]
pub(crate) struct Primary(Arc<Inner>);

struct Inner {
    servers: Vec<PgConnectOptions>,
    /// Index into `servers` of the one the pools connect to.
    current: AtomicUsize,
    /// Each pool with its sessions' parameters.
    pools: Mutex<Vec<(PgPool, Session)>>,
    /// Wakes the follower; a pool's connection check holds it too (not
    /// the pools, which hold the check).
    wake: Arc<Notify>,
}

/// Why a server is not one the store writes to.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NotPrimary {
    #[error("in recovery (a standby)")]
    InRecovery,
    #[error("read-only (transaction_read_only is on)")]
    ReadOnly,
    #[error("{0}")]
    Unreachable(#[from] sqlx::Error),
    #[error("no answer within {}", humantime::format_duration(PROBE_TIMEOUT))]
    Silent,
}

impl Primary {
    /// The primary among `servers`, asked at once: the first writable one
    /// in their order. `store` (redacted) names the URL in the error when
    /// none is.
    pub async fn find(servers: PostgresServers, store: String) -> Result<Self, StoreError> {
        let servers = servers.servers().to_vec();
        let current = search(&servers, None)
            .await
            .map_err(|reason| StoreError::Open { store, reason })?;
        Ok(Primary(Arc::new(Inner {
            servers,
            current: AtomicUsize::new(current),
            pools: Mutex::new(Vec::new()),
            wake: Arc::new(Notify::new()),
        })))
    }

    /// A pool made with `options`, its sessions started with `session`,
    /// connecting lazily to the current primary and from now on to
    /// whichever server [`Primary::follow`] finds, each connection checked
    /// ([`check`]) before any use.
    pub fn pool(&self, options: PgPoolOptions, session: Session) -> PgPool {
        let wake = self.0.wake.clone();
        let pool = options
            .after_connect(move |conn, _| {
                let wake = wake.clone();
                Box::pin(async move {
                    check(conn).await.map_err(|refused| {
                        wake.notify_one();
                        sqlx::Error::Configuration(refused.into())
                    })
                })
            })
            .connect_lazy_with(self.current().clone().options(session.iter().copied()));
        self.pools().push((pool.clone(), session));
        pool
    }

    /// Follows the primary until `stop`: see the module doc. With one
    /// server there is nothing to switch to, and nothing to run.
    pub fn follow(&self, stop: CancellationToken) {
        if self.0.servers.len() > 1 {
            tokio::spawn(follow(self.clone(), stop));
        }
    }

    /// Wakes the follower if `error` says the connection to the primary
    /// broke or could not be made.
    pub(crate) fn suspect(&self, error: &StoreError) {
        if breaks_connection(error) {
            self.wake();
        }
    }

    /// Wakes the follower: the primary may be gone.
    pub fn wake(&self) {
        self.0.wake.notify_one();
    }

    fn current(&self) -> &PgConnectOptions {
        &self.0.servers[self.0.current.load(Ordering::SeqCst)]
    }

    fn pools(&self) -> std::sync::MutexGuard<'_, Vec<(PgPool, Session)>> {
        self.0.pools.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Points every pool at `servers[index]`.
    fn point_at(&self, index: usize) {
        let was = self.0.current.swap(index, Ordering::SeqCst);
        if was == index {
            return;
        }
        let server = &self.0.servers[index];
        for (pool, session) in self.pools().iter() {
            pool.set_connect_options(server.clone().options(session.iter().copied()));
        }
        tracing::warn!(target: TARGET,
            primary = %name(server),
            was = %name(&self.0.servers[was]),
            "the store's primary moved; new connections go to it"
        );
    }
}

/// Whether the server at the other end of `conn` takes writes: not in
/// recovery and not read-only (libpq's `read-write` and `primary` at
/// once). One round trip.
async fn check(conn: &mut PgConnection) -> Result<(), NotPrimary> {
    let (in_recovery, read_only): (bool, bool) = sqlx::query_as(
        "SELECT pg_is_in_recovery(), current_setting('transaction_read_only') = 'on'",
    )
    .fetch_one(conn)
    .await?;
    match (in_recovery, read_only) {
        (true, _) => Err(NotPrimary::InRecovery),
        (false, true) => Err(NotPrimary::ReadOnly),
        (false, false) => Ok(()),
    }
}

/// Connects to `server` and checks it, within [`PROBE_TIMEOUT`].
async fn probe(server: PgConnectOptions) -> Result<(), NotPrimary> {
    let asked = async {
        let mut conn = server.connect().await?;
        let checked = check(&mut conn).await;
        // The answer is in; how the connection ends does not change it.
        let _ = conn.close().await;
        checked
    };
    tokio::time::timeout(PROBE_TIMEOUT, asked)
        .await
        .unwrap_or(Err(NotPrimary::Silent))
}

/// Asks every server at once: `current` if it is writable, else the first
/// writable one in order, else every server's reason.
async fn search(servers: &[PgConnectOptions], current: Option<usize>) -> Result<usize, String> {
    let mut asked = tokio::task::JoinSet::new();
    for (index, server) in servers.iter().enumerate() {
        let server = server.clone();
        asked.spawn(async move { (index, probe(server).await) });
    }
    let mut answers: Vec<Option<Result<(), NotPrimary>>> = servers.iter().map(|_| None).collect();
    while let Some(joined) = asked.join_next().await {
        match joined {
            Ok((index, answer)) => answers[index] = Some(answer),
            Err(panicked) => {
                tracing::error!(target: TARGET, %panicked, "a probe of a store server failed")
            }
        }
    }
    let writable: Vec<bool> = answers.iter().map(|a| matches!(a, Some(Ok(())))).collect();
    if let Some(chosen) = choose(&writable, current) {
        return Ok(chosen);
    }
    let reasons: Vec<String> = servers
        .iter()
        .zip(&answers)
        .map(|(server, answer)| match answer {
            Some(Err(reason)) => format!("{}: {reason}", name(server)),
            _ => format!("{}: not asked", name(server)),
        })
        .collect();
    Err(match servers.len() {
        1 => reasons.concat(),
        _ => format!("no primary among the servers: {}", reasons.join("; ")),
    })
}

/// Of the servers `writable` says take writes: `current` if it does, else
/// the first.
fn choose(writable: &[bool], current: Option<usize>) -> Option<usize> {
    let takes_writes = |index: &usize| writable.get(*index) == Some(&true);
    current
        .filter(takes_writes)
        .or_else(|| (0..writable.len()).find(takes_writes))
}

/// The follower: on each wake, searches until it finds a writable server
/// (see the module doc); ends at `stop`.
async fn follow(primary: Primary, stop: CancellationToken) {
    let mut wait = SEARCH_FIRST;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = primary.0.wake.notified() => {}
        }
        let mut told = false;
        loop {
            let current = primary.0.current.load(Ordering::SeqCst);
            match search(&primary.0.servers, Some(current)).await {
                Ok(index) => {
                    primary.point_at(index);
                    if told {
                        tracing::warn!(target: TARGET, primary = %name(primary.current()), "the store has a primary again");
                    }
                    break;
                }
                Err(reasons) if !std::mem::replace(&mut told, true) => {
                    tracing::error!(target: TARGET, %reasons, "the store has no primary: writes get 503 until one is found");
                }
                Err(_) => {}
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            wait = (wait * 2).min(SEARCH_EVERY);
        }
        // A burst of failures wakes one search, not one each.
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(SEARCH_FIRST) => {}
        }
        wait = SEARCH_FIRST;
    }
}

/// Whether `error` says a connection broke or could not be made, or the
/// server stopped taking writes (SQLSTATE classes 08 and 57, and 25006).
fn breaks_connection(error: &StoreError) -> bool {
    let StoreError::Unavailable(error) = error else {
        return false;
    };
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(error) => error.code().is_some_and(|code| {
            code.starts_with("08") || code.starts_with("57") || code == "25006"
        }),
        _ => false,
    }
}

/// `host:port` (or the socket) of `server`, for logs: never the password.
fn name(server: &PgConnectOptions) -> String {
    match server.get_socket() {
        Some(socket) => socket.display().to_string(),
        None => format!("{}:{}", server.get_host(), server.get_port()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_current_primary_is_kept_while_it_takes_writes_else_the_first_that_does() {
        assert_eq!(choose(&[true, true], Some(1)), Some(1));
        assert_eq!(choose(&[true, true], None), Some(0));
        assert_eq!(choose(&[false, true, true], Some(0)), Some(1));
        assert_eq!(choose(&[false, false], Some(1)), None);
        assert_eq!(choose(&[], None), None);
    }

    #[test]
    fn only_a_connection_that_broke_or_could_not_be_made_wakes_the_search() {
        let broken = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        for error in [sqlx::Error::Io(broken), sqlx::Error::PoolTimedOut] {
            assert!(breaks_connection(&StoreError::Unavailable(error)));
        }
        for error in [
            StoreError::Unavailable(sqlx::Error::RowNotFound),
            StoreError::Unavailable(sqlx::Error::PoolClosed),
            StoreError::Busy("the store's queue is full".into()),
            StoreError::Closed,
        ] {
            assert!(!breaks_connection(&error), "{error}");
        }
    }
}
