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
//! The rule that replaces the triggers' "no statement can forget": every
//! statement in this folder that inserts or deletes an operation or
//! changes its state or route calls [`moved`] with what it changed, in the
//! same call (so the same transaction and savepoint). The store contract
//! (`tests/it/store_contract.rs`) checks the counts against `count(*)` and
//! the outbox after every kind of change; a hand edit of a store with the
//! `sqlite3` shell should delete the `operation-counts` row of `store_meta`,
//! so that the next open recounts.

use rusqlite::{Connection, params};

use crate::operation::State;
use crate::store::StoreError;

/// The operation a change is about, as the alert needs it.
#[derive(Debug, Clone, Copy)]
pub struct Row<'a> {
    pub id: &'a str,
    pub route: &'a str,
    pub key: &'a str,
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

/// Counts `n` operations of `route` that moved from state `from` (`None`:
/// inserted) to `to` (`None`: deleted).
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
    if let Some(from) = from {
        add(conn, route, from, -n)?;
    }
    if let Some(to) = to {
        add(conn, route, to, n)?;
    }
    Ok(())
}

fn add(conn: &Connection, route: &str, state: State, n: i64) -> Result<(), StoreError> {
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
