//! The inputs with which the fuzzers (`fuzz/`, run with `cargo fuzz`) once
//! broke a property, run through the same property checks on stable, so
//! that a fixed bug stays fixed without libFuzzer. One directory per
//! target under `fuzz/regressions/`, one minimised input per file.

use std::path::Path;

#[path = "../../fuzz/checks.rs"]
mod checks;

/// Runs every kept input of `target` through `check`; each file is named
/// on stderr first, so a failure says which input it was.
fn replay(target: &str, check: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/regressions")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} holds no inputs", dir.display());
    for file in files {
        eprintln!("{}", file.display());
        check(&std::fs::read(&file).expect("a kept input"));
    }
}

#[test]
fn key() {
    replay("key", checks::key);
}

#[test]
fn canonical_json() {
    replay("canonical_json", checks::canonical_json);
}

#[test]
fn resolution() {
    replay("resolution", checks::resolution);
}

#[test]
fn config() {
    replay("config", checks::config);
}
