//! Child processes beside in-process stores. A forked child holds a copy
//! of every descriptor of this process until it execs (close-on-exec),
//! among them the `flock`ed database file of each SQLite store open here; a
//! store closed in process and opened again while such a child has not
//! exec'd yet finds itself still locked. All the tests share one process,
//! so a test that restarts its gateway runs beside tests that spawn
//! children.
//!
//! Hence every child is spawned here ([`spawn_child`], [`child_status`], [`child_output`];
//! clippy's `disallowed-methods` refuses `Command::spawn`, `status` and
//! `output` anywhere else): the fork holds [`FORKING`] shared until the
//! child has exec'd (`Command::spawn` returns only then). Whatever opens a
//! store this process may have closed first waits for the forks in flight
//! ([`forks_done`]): an in-process start, and every spawn too, since a
//! child (the CLI, `idemgate serve`) may open such a store itself.

use std::process::{ExitStatus, Output};
use std::sync::{PoisonError, RwLock};

use super::*;

/// Held shared by each fork until its child has exec'd.
static FORKING: RwLock<()> = RwLock::new(());

/// Returns once every child forked before the call has exec'd: no child
/// holds a lock this process let go of before the call.
pub fn forks_done() {
    drop(FORKING.write().unwrap_or_else(PoisonError::into_inner));
}

/// `cmd.spawn()`, after the forks in flight, holding off [`forks_done`]
/// until the child has exec'd.
#[allow(clippy::disallowed_methods)] // the one place children are spawned
pub fn spawn_child(cmd: &mut Command) -> std::io::Result<Child> {
    forks_done();
    let _forking = FORKING.read().unwrap_or_else(PoisonError::into_inner);
    cmd.spawn()
}

/// `cmd.status()` through [`spawn_child`].
pub fn child_status(cmd: &mut Command) -> std::io::Result<ExitStatus> {
    spawn_child(cmd)?.wait()
}

/// `cmd.output()` through [`spawn_child`]: stdin closed, stdout and stderr read.
pub fn child_output(cmd: &mut Command) -> std::io::Result<Output> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    spawn_child(cmd)?.wait_with_output()
}
