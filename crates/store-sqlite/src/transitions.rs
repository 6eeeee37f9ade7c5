//! What a change to the `operations` table writes besides the row, in the
//! same transaction: the kept counts by route and state
//! (`operation_counts`, ARCHITECTURE.md §4 "Counts") and, when an operation
//! becomes `unknown`, its `operation-unknown` alert in the outbox
//! (docs/operating.md, "Alerts").
//!
//! Until migration 0010 SQLite's own triggers did both. A trigger on a
//! table makes every statement on it one that SQLite protects with a
//! statement journal (it may write several rows, then fail): each page the
//! statement touches is copied aside first, in chunks allocated per
//! statement. For a first write, whose claim and record touch a dozen
//! pages of the row's B-trees, that was ~58,000 of the writer thread's
//! ~207,000 instructions (callgrind, benches/README.md). The statements
//! write the same rows themselves, through this module, and none of them
//! needs a statement journal.
//!
//! Within a writer batch the count changes wait in [`Deferred`] and are
//! written once, summed by (route, state), just before the batch commits:
//! a batch of a dozen first writes changes two or three count rows, not
//! three statements a write. A job whose savepoint is rolled back takes
//! its changes back with it; a batch that does not commit writes none.
//! Outside a batch (a test calling a statement on a bare connection) each
//! change is written at once.
//!
//! The rule that replaces the triggers' "no statement can forget": every
//! statement in this folder that inserts or deletes an operation or
//! changes its state or route calls [`moved`] with what it changed, in the
//! same call (so the same transaction and savepoint). The store contract
//! (`tests/it/store_contract.rs`) checks the counts against `count(*)` and
//! the outbox after every kind of change; a hand edit of a store with the
//! `sqlite3` shell should delete the `operation-counts` row of `store_meta`,
//! so that the next open recounts.

use std::cell::RefCell;

use rusqlite::{Connection, params};

use idemgate_model::operation::State;
use idemgate_store::{Claim, StoreError};

/// The operation a change is about, as the alert needs it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Row<'a> {
    pub(crate) id: &'a str,
    pub(crate) route: &'a str,
    pub(crate) key: &'a str,
}

impl<'a> From<&'a Claim> for Row<'a> {
    fn from(claim: &'a Claim) -> Self {
        Row {
            id: &claim.operation_id,
            route: &claim.route,
            key: &claim.key,
        }
    }
}

/// Adds ?3 to the (?1 route, ?2 state) count. A plain update: an upsert
/// would try the insert first and cost about half as much again, for a row
/// that is missing once per route and state.
const ADD: &str = "UPDATE operation_counts SET n = n + ?3 WHERE route = ?1 AND state = ?2";

/// A (route, state) count's first row. Only after [`ADD`] found none: the
/// writer is alone, so nothing adds it in between.
const FIRST: &str = "INSERT INTO operation_counts (route, state, n) VALUES (?1, ?2, ?3)";

/// An `operation-unknown` alert, as migration 0004's trigger wrote it.
const UNKNOWN_ALERT: &str =
    "INSERT INTO alert_outbox (event, at, route, operation_id, idem_key, state, evidence)
     VALUES ('operation-unknown', ?1, ?2, ?3, ?4, 'unknown', ?5)";

/// A `duplicated-at-destination` alert (a probe found the write more than
/// once); the operation stays `unknown`.
const DUPLICATED_ALERT: &str =
    "INSERT INTO alert_outbox (event, at, route, operation_id, idem_key, state, evidence)
     VALUES ('duplicated-at-destination', ?1, ?2, ?3, ?4, ?5, 'duplicated-at-destination')";

/// A count change waiting for its batch's commit.
enum Pending {
    Add(String, State, i64),
    /// The counts were recounted from the table: the changes before this
    /// one are in the recount already.
    Recounted,
}

thread_local! {
    /// The pending changes of the batch the writer runs on this thread;
    /// `None` outside a batch. Only [`Deferred`] sets and clears it.
    static PENDING: RefCell<Option<Vec<Pending>>> = const { RefCell::new(None) };
}

/// A writer batch's count changes, from its `BEGIN` to its `COMMIT`; on
/// drop (a batch that fails or is rolled back) they are forgotten.
pub(crate) struct Deferred(());

impl Deferred {
    /// The batch starts: count changes wait from here.
    pub fn begin() -> Deferred {
        PENDING.with(|pending| *pending.borrow_mut() = Some(Vec::new()));
        Deferred(())
    }

    /// Where the changes stand, for [`Deferred::undo_to`].
    pub fn mark(&self) -> usize {
        PENDING.with(|pending| pending.borrow().as_ref().map_or(0, Vec::len))
    }

    /// Forgets the changes since `mark`: their job was rolled back.
    pub(crate) fn undo_to(&self, mark: usize) {
        PENDING.with(|pending| {
            if let Some(changes) = pending.borrow_mut().as_mut() {
                changes.truncate(mark);
            }
        });
    }

    /// Writes the changes, summed by (route, state), and forgets them:
    /// the last statements before the batch's `COMMIT`.
    pub fn write(&self, conn: &Connection) -> rusqlite::Result<()> {
        let changes = PENDING.with(|pending| {
            pending
                .borrow_mut()
                .as_mut()
                .map(std::mem::take)
                .unwrap_or_default()
        });
        let after_recount = changes
            .iter()
            .rposition(|change| matches!(change, Pending::Recounted))
            .map_or(0, |at| at + 1);
        let mut sums: Vec<(String, State, i64)> = Vec::new();
        for change in changes.into_iter().skip(after_recount) {
            let Pending::Add(route, state, n) = change else {
                continue;
            };
            match sums.iter_mut().find(|(r, s, _)| *r == route && *s == state) {
                Some((_, _, sum)) => *sum += n,
                None => sums.push((route, state, n)),
            }
        }
        for (route, state, n) in sums.iter().filter(|(_, _, n)| *n != 0) {
            add(conn, route, *state, *n)?;
        }
        Ok(())
    }
}

impl Drop for Deferred {
    fn drop(&mut self) {
        PENDING.with(|pending| *pending.borrow_mut() = None);
    }
}

/// Counts `n` operations of `route` that moved from state `from` (`None`:
/// inserted) to `to` (`None`: deleted): at the batch's commit, or at once
/// outside a batch.
pub fn counted(
    conn: &Connection,
    route: &str,
    from: Option<State>,
    to: Option<State>,
    n: i64,
) -> Result<(), StoreError> {
    if from == to || n == 0 {
        return Ok(());
    }
    let changes = [(from, -n), (to, n)];
    let deferred = PENDING.with(|pending| match pending.borrow_mut().as_mut() {
        Some(pending) => {
            for (state, n) in changes {
                if let Some(state) = state {
                    pending.push(Pending::Add(route.to_string(), state, n));
                }
            }
            true
        }
        None => false,
    });
    if !deferred {
        for (state, n) in changes {
            if let Some(state) = state {
                add(conn, route, state, n)?;
            }
        }
    }
    Ok(())
}

/// The counts were just recounted from the table, in this transaction:
/// the changes waiting so far are in them.
pub fn recounted() {
    PENDING.with(|pending| {
        if let Some(changes) = pending.borrow_mut().as_mut() {
            changes.push(Pending::Recounted);
        }
    });
}

fn add(conn: &Connection, route: &str, state: State, n: i64) -> rusqlite::Result<()> {
    let values = params![route, state.as_str(), n];
    if conn.prepare_cached(ADD)?.execute(values)? == 0 {
        conn.prepare_cached(FIRST)?.execute(values)?;
    }
    Ok(())
}

/// One operation moved from `from` to `to` at `at` with `evidence`: its
/// counts, and its alert when it became `unknown`.
pub fn moved(
    conn: &Connection,
    row: Row,
    from: Option<State>,
    to: Option<State>,
    at: i64,
    evidence: &str,
) -> Result<(), StoreError> {
    counted(conn, row.route, from, to, 1)?;
    if to == Some(State::Unknown) && from != Some(State::Unknown) {
        conn.prepare_cached(UNKNOWN_ALERT)?
            .execute(params![at, row.route, row.id, row.key, evidence])?;
    }
    Ok(())
}

/// A probe found an operation (in `state`: `unknown`, or `completed` by
/// its late response meanwhile) more than once at the destination, at
/// `at`: its alert (its state, and so its counts, stay).
pub fn duplicated(conn: &Connection, row: Row, state: &str, at: i64) -> Result<(), StoreError> {
    conn.prepare_cached(DUPLICATED_ALERT)?
        .execute(params![at, row.route, row.id, row.key, state])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts_table() -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE operation_counts (route TEXT NOT NULL, state TEXT NOT NULL,
                n INTEGER NOT NULL, PRIMARY KEY (route, state)) STRICT, WITHOUT ROWID",
        )
        .unwrap();
        conn
    }

    fn counts(conn: &Connection) -> Vec<(String, String, i64)> {
        conn.prepare("SELECT route, state, n FROM operation_counts ORDER BY route, state")
            .unwrap()
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    fn row(route: &str, state: &str, n: i64) -> (String, String, i64) {
        (route.into(), state.into(), n)
    }

    /// In a batch, changes wait for the commit and are written summed; a
    /// rolled-back job's are forgotten; outside a batch they are written
    /// at once.
    #[test]
    fn a_batch_writes_its_count_changes_once_summed() {
        let conn = counts_table();
        let (claimed, done, held) = (
            Some(State::InProgress),
            Some(State::Completed),
            Some(State::Unknown),
        );
        {
            let batch = Deferred::begin();
            counted(&conn, "api", None, claimed, 1).unwrap();
            counted(&conn, "api", None, claimed, 1).unwrap();
            counted(&conn, "api", claimed, done, 1).unwrap();
            assert_eq!(counts(&conn), [], "nothing before the commit");
            let mark = batch.mark();
            counted(&conn, "api", claimed, held, 1).unwrap();
            batch.undo_to(mark);
            batch.write(&conn).unwrap();
        }
        assert_eq!(
            counts(&conn),
            [row("api", "completed", 1), row("api", "in_progress", 1)]
        );
        counted(&conn, "api", claimed, held, 1).unwrap();
        assert_eq!(
            counts(&conn),
            [
                row("api", "completed", 1),
                row("api", "in_progress", 0),
                row("api", "unknown", 1)
            ],
            "outside a batch, at once"
        );
    }

    /// A batch that does not reach its commit writes nothing of its
    /// changes, and the next batch starts from none.
    #[test]
    fn a_batch_dropped_before_its_commit_writes_nothing() {
        let conn = counts_table();
        {
            let _batch = Deferred::begin();
            counted(&conn, "api", None, Some(State::InProgress), 1).unwrap();
        }
        let batch = Deferred::begin();
        batch.write(&conn).unwrap();
        assert_eq!(counts(&conn), []);
    }

    /// The changes made before a recount in the same batch are in the
    /// recount; only those after it are added to it.
    #[test]
    fn a_recount_takes_in_the_changes_before_it() {
        let conn = counts_table();
        let batch = Deferred::begin();
        counted(&conn, "api", None, Some(State::Completed), 5).unwrap();
        conn.execute_batch("INSERT INTO operation_counts VALUES ('api', 'completed', 5)")
            .unwrap();
        recounted();
        counted(&conn, "api", None, Some(State::Completed), 1).unwrap();
        batch.write(&conn).unwrap();
        assert_eq!(counts(&conn), [row("api", "completed", 6)]);
    }
}
