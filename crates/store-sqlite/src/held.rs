//! The writer's connection as its jobs see it ([`Db`]): the connection
//! itself, and the few statements every first write runs, held prepared
//! for the thread's life by the writer.
//!
//! rusqlite's `prepare_cached` finds a statement by its SQL text: it trims
//! and hashes the text, copies it into a new key, and on the statement's
//! return hashes it again and resets and clears it. For the claim's insert
//! and the record's update, a few hundred bytes of SQL each, that came to
//! ~7,000 of the writer's ~111,000 instructions a first write (callgrind).
//! A held statement is found by its text's address, compared by content
//! only when the address differs (a constant may be copied into more than
//! one codegen unit), and is reset by the statement's own run.
//!
//! A statement that is asked for while it is in use (a job that runs one
//! inside another), or once every slot is taken, goes through
//! `prepare_cached` as any other: the same result, at its usual cost.

use std::cell::{Cell, RefCell, RefMut};
use std::ops::{Deref, DerefMut};

use rusqlite::{CachedStatement, Connection, Statement};

/// How many statements one connection holds: the hot ones, with room.
const SLOTS: usize = 6;

/// The writer's connection and its held statements.
pub(crate) struct Db<'c> {
    conn: &'c Connection,
    slots: [Slot<'c>; SLOTS],
}

/// One held statement, prepared at its first use.
struct Slot<'c> {
    sql: Cell<Option<&'static str>>,
    statement: RefCell<Option<Statement<'c>>>,
}

impl<'c> Db<'c> {
    /// Holds nothing yet: each statement is prepared at its first use, so
    /// this is made before the schema is known to be there.
    pub fn new(conn: &'c Connection) -> Db<'c> {
        Db {
            conn,
            slots: std::array::from_fn(|_| Slot {
                sql: Cell::new(None),
                statement: RefCell::new(None),
            }),
        }
    }

    /// `sql`, prepared: held from its first use on (see the module doc).
    pub fn prepared(&self, sql: &'static str) -> rusqlite::Result<Prepared<'_, 'c>> {
        let same = |held: &str| std::ptr::eq(held, sql) || held == sql;
        let slot = self
            .slots
            .iter()
            .find(|slot| slot.sql.get().is_some_and(same))
            .or_else(|| self.slots.iter().find(|slot| slot.sql.get().is_none()));
        let Some(slot) = slot else {
            return self.conn.prepare_cached(sql).map(Prepared::Cached);
        };
        let Ok(mut statement) = slot.statement.try_borrow_mut() else {
            return self.conn.prepare_cached(sql).map(Prepared::Cached);
        };
        let prepared = match statement.take() {
            Some(prepared) => prepared,
            None => {
                let prepared = self.conn.prepare(sql)?;
                slot.sql.set(Some(sql));
                prepared
            }
        };
        Ok(Prepared::Held(RefMut::map(statement, |held| {
            held.insert(prepared)
        })))
    }
}

impl<'c> Deref for Db<'c> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.conn
    }
}

/// A statement from [`Db::prepared`]: held by the connection, or from
/// rusqlite's cache.
pub(crate) enum Prepared<'a, 'c> {
    Held(RefMut<'a, Statement<'c>>),
    Cached(CachedStatement<'c>),
}

impl<'c> Deref for Prepared<'_, 'c> {
    type Target = Statement<'c>;

    fn deref(&self) -> &Statement<'c> {
        match self {
            Prepared::Held(statement) => statement,
            Prepared::Cached(statement) => statement,
        }
    }
}

impl DerefMut for Prepared<'_, '_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        match self {
            Prepared::Held(statement) => statement,
            Prepared::Cached(statement) => statement,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db_table() -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (x INTEGER)").unwrap();
        conn
    }

    const INSERT: &str = "INSERT INTO t (x) VALUES (?1)";
    const COUNT: &str = "SELECT count(*) FROM t";

    fn held(prepared: &Prepared) -> bool {
        matches!(prepared, Prepared::Held(_))
    }

    #[test]
    fn a_statement_is_held_and_reused() {
        let conn = db_table();
        let db = Db::new(&conn);
        for x in 0..3 {
            let mut insert = db.prepared(INSERT).unwrap();
            assert!(held(&insert));
            insert.execute([x]).unwrap();
        }
        // One slot for the insert, whichever copy of its text is asked for.
        let copy: &'static str = String::from(INSERT).leak();
        assert!(held(&db.prepared(copy).unwrap()));
        assert_eq!(db.slots.iter().filter(|s| s.sql.get().is_some()).count(), 1);
        let n: i64 = db
            .prepared(COUNT)
            .unwrap()
            .query_row([], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 3);
    }

    #[test]
    fn a_statement_in_use_is_prepared_again_from_the_cache() {
        let conn = db_table();
        let db = Db::new(&conn);
        let mut outer = db.prepared(INSERT).unwrap();
        let mut inner = db.prepared(INSERT).unwrap();
        assert!(held(&outer) && !held(&inner));
        inner.execute([1]).unwrap();
        outer.execute([2]).unwrap();
        drop((outer, inner));
        let n: i64 = conn.query_row(COUNT, [], |r| r.get(0)).unwrap();
        assert_eq!(n, 2);
    }

    #[test]
    fn past_the_slots_statements_come_from_the_cache() {
        let conn = db_table();
        let db = Db::new(&conn);
        let texts: Vec<&'static str> = (0..=SLOTS)
            .map(|i| &*format!("SELECT {i}").leak())
            .collect();
        for (i, sql) in texts.iter().enumerate() {
            let mut statement = db.prepared(sql).unwrap();
            assert_eq!(held(&statement), i < SLOTS, "statement {i}");
            let got: i64 = statement.query_row([], |r| r.get(0)).unwrap();
            assert_eq!(got, i as i64);
        }
    }

    #[test]
    fn a_statement_that_does_not_prepare_fails_and_holds_nothing() {
        let conn = db_table();
        let db = Db::new(&conn);
        assert!(db.prepared("SELECT * FROM missing").is_err());
        assert!(db.slots.iter().all(|s| s.sql.get().is_none()));
        // The table appears later: the same text now prepares and is held.
        conn.execute_batch("CREATE TABLE missing (y)").unwrap();
        assert!(held(&db.prepared("SELECT * FROM missing").unwrap()));
    }
}
