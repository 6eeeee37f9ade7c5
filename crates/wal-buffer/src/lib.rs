//! A SQLite VFS that holds a transaction's WAL writes and hands them to
//! the file as one write when the transaction syncs.
//!
//! SQLite appends each page a commit dirtied to the write-ahead log as a
//! frame, and writes each frame with two `pwrite` calls: its 24-byte header,
//! then its page. A group commit of a dozen first writes dirties a few
//! dozen pages, so the writer thread of idemgate's SQLite store entered the
//! kernel ~8 times a first write for these alone (`strace -c -f`), more
//! than every other system call of the request together. The bytes are the
//! same whichever way they are written; the calls are not.
//!
//! The VFS registered here is the process's default VFS (`unix`) with one
//! change: a file opened as a WAL keeps what it is asked to write in memory
//! while each write continues the last one (or lands inside what is held),
//! and writes it out, in calls of up to 128 KiB (the most the default VFS
//! writes at once: 31 frames of a 4 KiB page), before anything that must
//! see it:
//! `xSync`, `xRead`, `xTruncate`, `xFileSize`, `xFileControl`, `xClose`,
//! or a write elsewhere in the file. Every other file (the database, the
//! journal, temporary files) is the default VFS's own, untouched, and so
//! are its locks and the shared-memory wal-index, which live on the
//! database file.
//!
//! # When it is correct
//!
//! Other connections learn of a commit from the wal-index, which SQLite
//! updates right after writing the commit's frames. With
//! `PRAGMA synchronous = FULL` (or `EXTRA`) in WAL mode SQLite syncs the
//! log between the two, so the held frames reach the file before any other
//! connection can look for them. With `NORMAL` it does not sync, and
//! another connection could read a frame still held here: **open only
//! connections that sync every commit with this VFS.** (A frame written
//! after the sync would break the same rule: SQLite writes one only when
//! the device lacks `SQLITE_IOCAP_POWERSAFE_OVERWRITE` and it pads a
//! commit to a sector; on such a device this VFS writes through.)
//!
//! A process that dies holding frames loses a commit that had not synced,
//! which is a commit that had not happened: no caller was told it had.
//!
//! # Deferred syncs
//!
//! A thread may run its transactions inside [`deferring_syncs`]: then a
//! sync that SQLite asks of a WAL file on that thread writes out what is
//! held, as always, but leaves the `fsync` to the caller, who is told that
//! one is owed ([`Deferred::owed`]) and where the log ends
//! ([`Deferred::log_end`]). SQLite goes on as if the log were synced: it
//! publishes the commit to the other connections, whose reads see frames
//! that are written but not yet durable. So the caller must make the log
//! durable (an `fdatasync` of the WAL file, on any descriptor of it)
//! before it tells anyone of the commit, must not let a checkpoint copy a
//! frame into the database before that frame is durable (a connection
//! that syncs its checkpoints, such as one with `synchronous = NORMAL`,
//! syncs the log before it copies anything), and must not checkpoint on
//! the deferring connection. A sync after a write of the log's header
//! (the first write of a log SQLite has just restarted) is never
//! deferred: SQLite syncs a new header before the frames that follow it,
//! so that a frame of the old log can never be read as one of the new
//! (SQLite's own comment in `sqlite3WalFrames`).

#![deny(unsafe_op_in_unsafe_fn)]

use std::cell::Cell;
use std::ffi::{CStr, c_int, c_void};
use std::fmt;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::{mem, ptr, slice};

use libsqlite3_sys as ffi;

/// The VFS's name, as `sqlite3_open_v2` (and rusqlite's
/// `Connection::open_with_flags_and_vfs`) take it.
pub const NAME: &str = "idemgate-wal-buffer";
const NAME_C: &CStr = c"idemgate-wal-buffer";

/// What a WAL file holds before it writes anyway, so that a transaction
/// of any size is never held whole in memory. The gateway's commits are
/// far smaller: under 64 connections of first writes, 28 frames (~115
/// KiB) a commit on average (benches/README.md, "One write per commit").
const LIMIT: usize = 4 << 20;

/// The most the default (unix) VFS writes in one call: it asserts that a
/// write is at most 0x1ffff bytes, and masks the length to that in a
/// release build. 31 frames of a 4 KiB page.
pub(crate) const CHUNK: usize = 0x1ffff;

/// The WAL file's header: a sync after a write into it is never deferred.
const WAL_HEADER: i64 = 32;

thread_local! {
    /// Whether this thread's WAL syncs are deferred ([`deferring_syncs`]).
    static DEFERRING: Cell<bool> = const { Cell::new(false) };
    /// What the syncs this thread deferred left to do.
    static DEFERRED: Cell<Deferred> = const { Cell::new(Deferred::NONE) };
}

/// What the WAL syncs deferred by one [`deferring_syncs`] call left to the
/// caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deferred {
    /// A sync was deferred: the log holds written frames that are not yet
    /// durable.
    pub owed: bool,
    /// Where the log ended at the last write handed to the file (its size
    /// in use, from the header on), if any was.
    pub log_end: Option<u64>,
}

impl Deferred {
    const NONE: Deferred = Deferred {
        owed: false,
        log_end: None,
    };
}

/// Runs `transactions` with this thread's WAL syncs deferred (the module
/// doc says what the caller then owes), and returns their result with what
/// was deferred. Not reentrant: a nested call ends the deferral early.
pub fn deferring_syncs<R>(transactions: impl FnOnce() -> R) -> (R, Deferred) {
    /// Ends the deferral even if `transactions` unwinds.
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            DEFERRING.with(|d| d.set(false));
        }
    }
    DEFERRED.with(|d| d.set(Deferred::NONE));
    DEFERRING.with(|d| d.set(true));
    let reset = Reset;
    let result = transactions();
    drop(reset);
    (result, DEFERRED.with(|d| d.replace(Deferred::NONE)))
}

/// Notes where the log ends after a write handed to the file on a
/// deferring thread.
fn note_log_end(end: i64) {
    if DEFERRING.with(Cell::get) {
        DEFERRED.with(|d| {
            d.set(Deferred {
                log_end: u64::try_from(end).ok(),
                ..d.get()
            })
        });
    }
}

/// The default VFS this one wraps, set before registration: the only way
/// to this VFS's `xOpen` is a connection opened after it.
static DEFAULT: AtomicPtr<ffi::sqlite3_vfs> = AtomicPtr::new(ptr::null_mut());

/// Why the VFS could not be registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegisterError {
    /// SQLite has no default VFS to wrap.
    NoDefault,
    /// `sqlite3_vfs_register` failed with this result code.
    Sqlite(c_int),
}

impl fmt::Display for RegisterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegisterError::NoDefault => write!(f, "SQLite VFS {NAME}: SQLite has no default VFS"),
            RegisterError::Sqlite(code) => {
                write!(
                    f,
                    "SQLite VFS {NAME}: registration failed (SQLite code {code})"
                )
            }
        }
    }
}

impl std::error::Error for RegisterError {}

/// Registers the VFS, once per process (later calls return the first
/// call's result), and returns its name. It is never the default: only a
/// connection opened with its name uses it.
pub fn register() -> Result<&'static str, RegisterError> {
    static REGISTERED: OnceLock<Result<(), RegisterError>> = OnceLock::new();
    (*REGISTERED.get_or_init(install)).map(|()| NAME)
}

fn install() -> Result<(), RegisterError> {
    // SAFETY: sqlite3_vfs_find initialises SQLite if needed and returns a
    // VFS that lives as long as the process (SQLite never frees one).
    let default = unsafe { ffi::sqlite3_vfs_find(ptr::null()) };
    if default.is_null() {
        return Err(RegisterError::NoDefault);
    }
    DEFAULT.store(default, Ordering::Release);
    // The default's own functions, with its `pAppData` (unix's `xOpen`
    // finds its locking style there), except `xOpen`, and a file large
    // enough for a WAL file's header before the default's own file.
    // SAFETY: `default` is valid (above); the struct is plain data.
    let mut vfs = unsafe { *default };
    vfs.szOsFile += HEADER as c_int;
    vfs.zName = NAME_C.as_ptr();
    vfs.pNext = ptr::null_mut();
    vfs.xOpen = Some(open);
    let vfs: &'static mut ffi::sqlite3_vfs = Box::leak(Box::new(vfs));
    // SAFETY: `vfs` lives for the rest of the process, as SQLite requires.
    match unsafe { ffi::sqlite3_vfs_register(vfs, 0) } {
        ffi::SQLITE_OK => Ok(()),
        code => Err(RegisterError::Sqlite(code)),
    }
}

/// A WAL file: what SQLite sees (`base`, first), then the default VFS's
/// own file, `HEADER` bytes in.
#[repr(C)]
struct WalFile {
    base: ffi::sqlite3_file,
    /// The default VFS's file, within the same allocation.
    real: *mut ffi::sqlite3_file,
    /// Bytes asked for and not yet written, from offset `at`.
    held: Vec<u8>,
    at: i64,
    /// False on a device without powersafe overwrite: every write goes
    /// straight through (see the module doc).
    holds: bool,
    /// The log's header was written and not synced since: the next sync
    /// is not deferred.
    header_unsynced: bool,
}

const HEADER: usize = mem::size_of::<WalFile>().next_multiple_of(16);

/// A WAL file's methods (version 1: SQLite maps shared memory and memory
/// maps only through the database file, never through its log).
static WAL_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 1,
    xClose: Some(close),
    xRead: Some(read),
    xWrite: Some(write),
    xTruncate: Some(truncate),
    xSync: Some(sync),
    xFileSize: Some(file_size),
    xLock: Some(lock),
    xUnlock: Some(unlock),
    xCheckReservedLock: Some(check_reserved_lock),
    xFileControl: Some(file_control),
    xSectorSize: Some(sector_size),
    xDeviceCharacteristics: Some(device_characteristics),
    xShmMap: None,
    xShmLock: None,
    xShmBarrier: None,
    xShmUnmap: None,
    xFetch: None,
    xUnfetch: None,
};

unsafe extern "C" fn open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let default = DEFAULT.load(Ordering::Acquire);
    // SAFETY: set before registration, and valid for the process's life.
    let Some(default_open) = (unsafe { (*default).xOpen }) else {
        return ffi::SQLITE_ERROR;
    };
    if flags & ffi::SQLITE_OPEN_WAL == 0 {
        // SAFETY: `file` has room for the default's file (szOsFile is larger).
        return unsafe { default_open(default, name, file, flags, out_flags) };
    }
    // SAFETY: the allocation is HEADER + the default's szOsFile bytes,
    // aligned for any type (SQLite allocates it with sqlite3_malloc).
    let real = unsafe { file.cast::<u8>().add(HEADER) }.cast::<ffi::sqlite3_file>();
    let rc = unsafe { default_open(default, name, real, flags, out_flags) };
    if rc != ffi::SQLITE_OK {
        // SQLite closes a file whose open failed only if its methods are
        // set: ours are not, so close the default's if it set its own.
        // SAFETY: `real` is what the default's xOpen was given.
        unsafe {
            if let Some(close) = (*real).pMethods.as_ref().and_then(|m| m.xClose) {
                close(real);
            }
            (*file).pMethods = ptr::null();
        }
        return rc;
    }
    // SAFETY: `real` was just opened by the default VFS.
    let characteristics =
        unsafe { call(real, |m| m.xDeviceCharacteristics).map_or(0, |f| f(real)) };
    let wal = WalFile {
        base: ffi::sqlite3_file {
            pMethods: &WAL_METHODS,
        },
        real,
        held: Vec::new(),
        at: 0,
        holds: characteristics & ffi::SQLITE_IOCAP_POWERSAFE_OVERWRITE != 0,
        header_unsynced: false,
    };
    // SAFETY: the first HEADER bytes of `file` are ours, uninitialised.
    unsafe { ptr::write(file.cast::<WalFile>(), wal) };
    ffi::SQLITE_OK
}

/// The default VFS's method `pick` of its file `real`.
///
/// # Safety
/// `real` is an open file of the default VFS.
unsafe fn call<F>(
    real: *mut ffi::sqlite3_file,
    pick: impl Fn(&ffi::sqlite3_io_methods) -> Option<F>,
) -> Option<F> {
    // SAFETY: an open file's methods are set (the caller's contract).
    unsafe { (*real).pMethods.as_ref() }.and_then(pick)
}

/// # Safety
/// `file` is a WAL file opened by [`open`] and not yet closed.
unsafe fn wal<'a>(file: *mut ffi::sqlite3_file) -> &'a mut WalFile {
    // SAFETY: the caller's contract; SQLite calls a file's methods from
    // one thread at a time (its connection's mutex).
    unsafe { &mut *file.cast::<WalFile>() }
}

impl WalFile {
    /// Writes what is held, in as few calls as the default VFS takes.
    fn flush(&mut self) -> c_int {
        let mut rc = ffi::SQLITE_OK;
        for (i, chunk) in self.held.chunks(CHUNK).enumerate() {
            #[cfg(test)]
            tests::WRITES.with(|n| n.set(n.get() + 1));
            let at = self.at + (i * CHUNK) as i64;
            // SAFETY: `real` is open while `self` is; `chunk` is its
            // length (< 128 KiB) of readable bytes.
            rc = unsafe {
                match call(self.real, |m| m.xWrite) {
                    Some(write) => {
                        write(self.real, chunk.as_ptr().cast(), chunk.len() as c_int, at)
                    }
                    None => ffi::SQLITE_IOERR_WRITE,
                }
            };
            if rc != ffi::SQLITE_OK {
                break;
            }
        }
        if rc == ffi::SQLITE_OK && !self.held.is_empty() {
            note_log_end(self.end());
        }
        // Cleared whatever the result: a failed write fails the call that
        // needed it (a sync, so the commit), and SQLite writes the
        // transaction's frames again if it tries again.
        self.held.clear();
        rc
    }

    fn end(&self) -> i64 {
        self.at + self.held.len() as i64
    }
}

/// Writes what is held, then runs the default's method.
macro_rules! flushed {
    ($file:ident, $method:ident $(, $arg:ident)*) => {{
        // SAFETY: SQLite calls this method on a WAL file `open` set up.
        let wal = unsafe { wal($file) };
        let rc = wal.flush();
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        // SAFETY: `real` is open while the WAL file is.
        unsafe {
            match call(wal.real, |m| m.$method) {
                Some(method) => method(wal.real $(, $arg)*),
                None => ffi::SQLITE_IOERR,
            }
        }
    }};
}

/// Runs the default's method, which needs nothing written first.
macro_rules! passed {
    ($file:ident, $method:ident, $missing:expr $(, $arg:ident)*) => {{
        // SAFETY: as in `flushed!`.
        let wal = unsafe { wal($file) };
        unsafe {
            match call(wal.real, |m| m.$method) {
                Some(method) => method(wal.real $(, $arg)*),
                None => $missing,
            }
        }
    }};
}

unsafe extern "C" fn close(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: SQLite closes a file once, after its last other call.
    let wal = unsafe { wal(file) };
    let flushed = wal.flush();
    // SAFETY: `real` is open until here.
    let closed =
        unsafe { call(wal.real, |m| m.xClose).map_or(ffi::SQLITE_OK, |close| close(wal.real)) };
    // SAFETY: written by `open`, dropped once; SQLite frees the memory.
    unsafe { ptr::drop_in_place(file.cast::<WalFile>()) };
    if flushed != ffi::SQLITE_OK {
        flushed
    } else {
        closed
    }
}

unsafe extern "C" fn read(
    file: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    flushed!(file, xRead, buf, amount, offset)
}

unsafe extern "C" fn write(
    file: *mut ffi::sqlite3_file,
    data: *const c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: SQLite calls this method on a WAL file `open` set up.
    let wal = unsafe { wal(file) };
    if offset < WAL_HEADER {
        wal.header_unsynced = true;
    }
    if !wal.holds || amount <= 0 {
        // SAFETY: `real` is open while the WAL file is.
        let rc = unsafe {
            match call(wal.real, |m| m.xWrite) {
                Some(write) => write(wal.real, data, amount, offset),
                None => ffi::SQLITE_IOERR_WRITE,
            }
        };
        if rc == ffi::SQLITE_OK {
            note_log_end(offset + i64::from(amount.max(0)));
        }
        return rc;
    }
    // SAFETY: SQLite passes `amount` readable bytes at `data`.
    let bytes = unsafe { slice::from_raw_parts(data.cast::<u8>(), amount as usize) };
    let end = offset + i64::from(amount);
    if !wal.held.is_empty() && offset >= wal.at && end <= wal.end() {
        // A frame this transaction wrote, written again (SQLite rewrites
        // a page it spilled to the log earlier in the transaction).
        let from = (offset - wal.at) as usize;
        wal.held[from..from + bytes.len()].copy_from_slice(bytes);
        return ffi::SQLITE_OK;
    }
    if wal.held.is_empty() || offset != wal.end() || wal.held.len() + bytes.len() > LIMIT {
        let rc = wal.flush();
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        wal.at = offset;
    }
    wal.held.extend_from_slice(bytes);
    ffi::SQLITE_OK
}

unsafe extern "C" fn truncate(file: *mut ffi::sqlite3_file, size: ffi::sqlite3_int64) -> c_int {
    flushed!(file, xTruncate, size)
}

unsafe extern "C" fn sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    // SAFETY: SQLite calls this method on a WAL file `open` set up.
    let wal = unsafe { wal(file) };
    let rc = wal.flush();
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    if !wal.header_unsynced && DEFERRING.with(Cell::get) {
        DEFERRED.with(|d| {
            d.set(Deferred {
                owed: true,
                ..d.get()
            })
        });
        #[cfg(test)]
        tests::DEFERRED_SYNCS.with(|n| n.set(n.get() + 1));
        return ffi::SQLITE_OK;
    }
    #[cfg(test)]
    tests::SYNCS.with(|n| n.set(n.get() + 1));
    // SAFETY: `real` is open while the WAL file is.
    let rc = unsafe {
        match call(wal.real, |m| m.xSync) {
            Some(sync) => sync(wal.real, flags),
            None => ffi::SQLITE_IOERR_FSYNC,
        }
    };
    if rc == ffi::SQLITE_OK {
        wal.header_unsynced = false;
    }
    rc
}

unsafe extern "C" fn file_size(
    file: *mut ffi::sqlite3_file,
    size: *mut ffi::sqlite3_int64,
) -> c_int {
    flushed!(file, xFileSize, size)
}

unsafe extern "C" fn file_control(
    file: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    flushed!(file, xFileControl, op, arg)
}

unsafe extern "C" fn lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    passed!(file, xLock, ffi::SQLITE_IOERR_LOCK, level)
}

unsafe extern "C" fn unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    passed!(file, xUnlock, ffi::SQLITE_IOERR_UNLOCK, level)
}

unsafe extern "C" fn check_reserved_lock(file: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    passed!(
        file,
        xCheckReservedLock,
        ffi::SQLITE_IOERR_CHECKRESERVEDLOCK,
        out
    )
}

unsafe extern "C" fn sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    passed!(file, xSectorSize, 4096)
}

unsafe extern "C" fn device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    passed!(file, xDeviceCharacteristics, 0)
}

#[cfg(test)]
mod tests;
