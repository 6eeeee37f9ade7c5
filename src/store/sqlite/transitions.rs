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

/// Adds `n` to a (route, state) count, making the row if there is none.
const COUNT: &str = "INSERT INTO operation_counts (route, state, n) VALUES (?1, ?2, ?3)
     ON CONFLICT (route, state) DO UPDATE SET n = n + excluded.n";

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
    let mut count = conn.prepare_cached(COUNT)?;
    if let Some(from) = from {
        count.execute(params![route, from.as_str(), -n])?;
    }
    if let Some(to) = to {
        count.execute(params![route, to.as_str(), n])?;
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
