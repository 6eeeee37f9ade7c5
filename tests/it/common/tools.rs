//! Tools installed outside cargo that some tests drive (client SDKs,
//! Schemathesis): where one is missing, its test says why and skips —
//! except under CI, where it fails, so a missing install step shows.

use super::*;

/// Whether this is CI's run (`CI` set and not empty).
pub fn under_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty())
}

/// `true` when `installed` exists. Otherwise, under CI, panics naming
/// `install`, the command that installs it; elsewhere says on stderr that
/// `test` is skipped and why, and returns `false`.
pub fn installed_or_skip(installed: &Path, test: &str, install: &str) -> bool {
    if installed.exists() {
        return true;
    }
    let reason = format!(
        "{} is missing; install it with {install} (.ci/run does)",
        installed.display()
    );
    assert!(!under_ci(), "{reason}");
    eprintln!("skipping {test}: {reason}");
    false
}
