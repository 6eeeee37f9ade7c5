//! Each test writes through the VFS on one connection and reads what it
//! wrote on another that uses the default VFS, as idemgate's read
//! connections do.

use std::cell::Cell;
use std::path::PathBuf;

use rusqlite::{Connection, OpenFlags, params};

thread_local! {
    /// Writes the VFS handed to the file on this thread.
    pub(super) static WRITES: Cell<usize> = const { Cell::new(0) };
    /// WAL syncs handed to the default VFS on this thread.
    pub(super) static SYNCS: Cell<usize> = const { Cell::new(0) };
    /// WAL syncs left to the caller on this thread.
    pub(super) static DEFERRED_SYNCS: Cell<usize> = const { Cell::new(0) };
}

fn writes() -> usize {
    WRITES.with(Cell::get)
}

/// (syncs made, syncs deferred) on this thread so far.
fn syncs() -> (usize, usize) {
    (SYNCS.with(Cell::get), DEFERRED_SYNCS.with(Cell::get))
}

/// A fresh database path of this test's own.
fn path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wal-buffer-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("db.sqlite")
}

fn writer(path: &PathBuf) -> Connection {
    let vfs = super::register().unwrap();
    let conn = Connection::open_with_flags_and_vfs(path, OpenFlags::default(), vfs).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;
         CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v BLOB NOT NULL);",
    )
    .unwrap();
    conn
}

/// A value that differs by row, so a frame written to the wrong place or
/// not at all shows.
fn value(id: i64, round: i64) -> Vec<u8> {
    (0..1000)
        .map(|i| ((id * 31 + i * 7 + round) % 251) as u8)
        .collect()
}

fn insert(conn: &Connection, ids: std::ops::Range<i64>, round: i64) {
    let mut insert = conn
        .prepare("INSERT OR REPLACE INTO t (id, v) VALUES (?1, ?2)")
        .unwrap();
    for id in ids {
        insert.execute(params![id, value(id, round)]).unwrap();
    }
}

/// What another connection, on the default VFS, reads.
fn read_back(path: &PathBuf) -> Vec<(i64, Vec<u8>)> {
    let reader = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let check: String = reader
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    let mut rows = reader.prepare("SELECT id, v FROM t ORDER BY id").unwrap();
    rows.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn expected(ids: std::ops::Range<i64>, round: impl Fn(i64) -> i64) -> Vec<(i64, Vec<u8>)> {
    ids.map(|id| (id, value(id, round(id)))).collect()
}

#[test]
fn a_commit_is_a_write_per_128_kib_not_two_per_frame() {
    let path = path("one-write");
    let conn = writer(&path);
    insert(&conn, 0..1, 0);
    let log = || {
        std::fs::metadata(path.with_extension("sqlite-wal"))
            .unwrap()
            .len() as usize
    };
    let (before, logged) = (writes(), log());
    conn.execute_batch("BEGIN").unwrap();
    insert(&conn, 1..200, 0);
    conn.execute_batch("COMMIT").unwrap();
    // ~50 frames, two writes each without the VFS; the most the default
    // VFS writes at once with it.
    let frames = (log() - logged) / (4096 + 24);
    assert!(frames >= 40, "{frames} frames");
    let calls = (log() - logged).div_ceil(super::CHUNK);
    assert_eq!(writes() - before, calls);
    assert_eq!(read_back(&path), expected(0..200, |_| 0));
}

#[test]
fn pages_spilled_mid_transaction_are_read_back_and_rewritten() {
    let path = path("spill");
    let conn = writer(&path);
    // A cache of a few pages: the transaction spills frames to the log,
    // reads them back, and writes some of them again before it commits.
    conn.execute_batch("PRAGMA cache_size = 4").unwrap();
    conn.execute_batch("BEGIN").unwrap();
    insert(&conn, 0..400, 0);
    insert(&conn, 0..400, 1);
    conn.execute_batch("COMMIT").unwrap();
    assert_eq!(read_back(&path), expected(0..400, |_| 1));
}

#[test]
fn a_rolled_back_transaction_leaves_nothing_and_the_next_commits() {
    let path = path("rollback");
    let conn = writer(&path);
    insert(&conn, 0..10, 0);
    conn.execute_batch("PRAGMA cache_size = 4; BEGIN").unwrap();
    insert(&conn, 10..300, 0);
    conn.execute_batch("ROLLBACK").unwrap();
    insert(&conn, 0..5, 2);
    assert_eq!(
        read_back(&path),
        expected(0..10, |id| if id < 5 { 2 } else { 0 })
    );
}

#[test]
fn the_log_restarts_after_a_checkpoint_and_survives_a_reopen() {
    let path = path("restart");
    let conn = writer(&path);
    insert(&conn, 0..100, 0);
    let _: (i64, i64, i64) = conn
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
        })
        .unwrap();
    // The next commit writes the log's header at its start again.
    insert(&conn, 50..150, 3);
    let want = expected(0..150, |id| if id < 50 { 0 } else { 3 });
    assert_eq!(read_back(&path), want);
    drop(conn);
    let conn = writer(&path);
    insert(&conn, 150..151, 0);
    let mut want = want;
    want.push((150, value(150, 0)));
    assert_eq!(read_back(&path), want);
}

#[test]
fn a_deferred_sync_writes_the_frames_out_and_leaves_the_fsync_to_the_caller() {
    let path = path("deferred");
    let conn = writer(&path);
    insert(&conn, 0..1, 0);
    let (synced, deferred) = syncs();
    let ((), owed) = super::deferring_syncs(|| insert(&conn, 1..50, 0));
    assert!(owed.owed, "{owed:?}");
    let log = std::fs::metadata(path.with_extension("sqlite-wal"))
        .unwrap()
        .len();
    assert_eq!(
        owed.log_end,
        Some(log),
        "the log ends where its last frame does"
    );
    assert_eq!(
        syncs(),
        (synced, deferred + 49),
        "no fsync, one deferral a commit"
    );
    // Another connection reads the commits: the frames are in the file.
    assert_eq!(read_back(&path), expected(0..50, |_| 0));
    // Outside the deferral a commit syncs again, and owes nothing after.
    insert(&conn, 50..51, 0);
    assert_eq!(syncs(), (synced + 1, deferred + 49));
    let ((), nothing) = super::deferring_syncs(|| ());
    assert_eq!(
        nothing,
        super::Deferred {
            owed: false,
            log_end: None
        }
    );
}

#[test]
fn a_sync_after_the_log_restarts_is_made_even_while_deferring() {
    let path = path("deferred-restart");
    let conn = writer(&path);
    insert(&conn, 0..100, 0);
    let _: i64 = conn
        .query_row("PRAGMA wal_checkpoint(RESTART)", [], |row| row.get(0))
        .unwrap();
    let (synced, deferred) = syncs();
    // The first commit after the restart writes a new header at the
    // log's start: SQLite syncs it before the frames, for real.
    let ((), owed) = super::deferring_syncs(|| insert(&conn, 100..101, 0));
    let (synced_after, deferred_after) = syncs();
    assert!(synced_after > synced, "the new header was synced");
    assert_eq!(
        deferred_after,
        deferred + 1,
        "the commit's own sync was deferred"
    );
    assert!(owed.owed);
    // The next commit continues the log: deferred alone.
    let ((), owed) = super::deferring_syncs(|| insert(&conn, 101..102, 0));
    assert!(owed.owed);
    assert_eq!(syncs(), (synced_after, deferred_after + 1));
    assert_eq!(read_back(&path), expected(0..102, |_| 0));
}

#[test]
fn registering_twice_names_the_same_vfs() {
    assert_eq!(super::register(), Ok(super::NAME));
    assert_eq!(super::register(), Ok(super::NAME));
}
