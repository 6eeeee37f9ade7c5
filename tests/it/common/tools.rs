//! Tools installed outside cargo that some tests drive (client SDKs,
//! Schemathesis, promtool, Chromium): their tests are `#[ignore]`d, so
//! `cargo test` says they did not run; `cargo test -- --include-ignored`,
//! as `.ci/run` runs after installing them, runs them, and a missing tool
//! fails its test naming what installs it.

use super::*;

/// Panics unless `installed` exists, naming `install`, the command that
/// installs it.
pub fn require_installed(installed: &Path, install: &str) {
    assert!(
        installed.exists(),
        "{} is missing; install it with {install} (.ci/run does)",
        installed.display()
    );
}
