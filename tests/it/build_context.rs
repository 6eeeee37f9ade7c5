//! The `Containerfile`'s `build` stage compiles what `.containerignore`
//! lets into the build context (docs/deploying.md, "How the image gets its
//! binary"), and that is the whole workspace. Read as podman and docker
//! read it (a line's pattern matches a path or a directory it is in, `*`
//! and `?` within a name, `**` across names; the last line that matches
//! decides, `!` letting back in), the files let through are copied into a
//! directory of their own, where
//!
//! - cargo reads the workspace offline, with the same members and the same
//!   library, binary, build-script and bench targets as in the repository
//!   (a member or a bench left out fails here, not in a `podman build`);
//! - every file a source embeds (`include_str!`, `include_bytes!`) and
//!   every directory of migrations (`sqlx::migrate!`) is there.
//!
//! No container is built: the `build` stage needs a registry this
//! project's CI does not reach (docs/deploying.md).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::common::run_to_exit;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One line of `.containerignore`: its pattern's names, and whether it
/// lets in (`!`) or keeps out.
struct Rule {
    names: Vec<String>,
    lets_in: bool,
}

fn rules() -> Vec<Rule> {
    let text = std::fs::read_to_string(root().join(".containerignore")).expect(".containerignore");
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            let (lets_in, pattern) = match line.strip_prefix('!') {
                Some(pattern) => (true, pattern.trim()),
                None => (false, line),
            };
            assert!(
                !pattern.contains(['[', '\\']),
                "{line}: character classes and escapes are not read here"
            );
            Rule {
                names: pattern
                    .trim_matches('/')
                    .split('/')
                    .filter(|name| !name.is_empty() && *name != ".")
                    .map(str::to_string)
                    .collect(),
                lets_in,
            }
        })
        .collect()
}

/// Whether `pattern`'s names match `path`'s, all of them.
fn matches(pattern: &[String], path: &[&str]) -> bool {
    match (pattern.split_first(), path.split_first()) {
        (Some((any, rest)), _) if any == "**" => {
            matches(rest, path) || (!path.is_empty() && matches(pattern, &path[1..]))
        }
        (Some((name, rest)), Some((part, others))) => {
            matches_name(name.as_bytes(), part.as_bytes()) && matches(rest, others)
        }
        (None, None) => true,
        _ => false,
    }
}

/// One name against a pattern of `*` (any run of characters) and `?` (one).
fn matches_name(pattern: &[u8], name: &[u8]) -> bool {
    match (pattern.split_first(), name.split_first()) {
        (Some((b'*', rest)), _) => {
            matches_name(rest, name) || (!name.is_empty() && matches_name(pattern, &name[1..]))
        }
        (Some((b'?', rest)), Some((_, others))) => matches_name(rest, others),
        (Some((p, rest)), Some((n, others))) => p == n && matches_name(rest, others),
        (None, None) => true,
        _ => false,
    }
}

/// Whether the context holds `path`: the last rule matching it or a
/// directory it is in decides.
fn sent(rules: &[Rule], path: &[&str]) -> bool {
    let mut sent = true;
    for rule in rules {
        if (1..=path.len()).any(|n| matches(&rule.names, &path[..n])) {
            sent = rule.lets_in;
        }
    }
    sent
}

/// Whether a directory may hold something sent: it is sent, or a rule
/// that lets in could match below it.
fn worth_reading(rules: &[Rule], dir: &[&str]) -> bool {
    sent(rules, dir)
        || rules
            .iter()
            .any(|rule| rule.lets_in && matches_below(&rule.names, dir))
}

/// Whether `pattern` could match a path below `dir`.
fn matches_below(pattern: &[String], dir: &[&str]) -> bool {
    match (pattern.split_first(), dir.split_first()) {
        (Some((any, _)), _) if any == "**" => true,
        (Some((name, rest)), Some((part, others))) => {
            matches_name(name.as_bytes(), part.as_bytes()) && matches_below(rest, others)
        }
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// Copies the files under `dir` (relative to the root) that the context
/// holds into `into`.
fn copy_sent(rules: &[Rule], dir: &Path, into: &Path, copied: &mut usize) {
    let entries = std::fs::read_dir(root().join(dir)).expect("a directory");
    for entry in entries {
        let entry = entry.expect("a directory entry");
        let path = dir.join(entry.file_name());
        let names: Vec<&str> = path.iter().map(|n| n.to_str().expect("utf-8")).collect();
        if entry.file_type().expect("a file type").is_dir() {
            if worth_reading(rules, &names) {
                copy_sent(rules, &path, into, copied);
            }
        } else if sent(rules, &names) {
            std::fs::create_dir_all(into.join(dir)).expect("mkdir");
            std::fs::copy(entry.path(), into.join(&path)).expect("copy");
            *copied += 1;
        }
    }
}

/// `cargo metadata` of the workspace at `dir`, offline: each package's
/// name and its targets but tests and examples (the `build` stage builds
/// neither), paths relative to `dir`.
async fn workspace(dir: &Path) -> Result<BTreeSet<String>, String> {
    let mut cargo = Command::new(env!("CARGO"));
    cargo
        .args([
            "metadata",
            "--no-deps",
            "--offline",
            "--format-version",
            "1",
        ])
        .arg("--manifest-path")
        .arg(dir.join("Cargo.toml"));
    let (status, stdout, stderr) = run_to_exit(cargo).await;
    if !status.success() {
        return Err(stderr);
    }
    let metadata: Value = serde_json::from_str(&stdout).expect("metadata is JSON");
    let canonical = dir.canonicalize().expect("canonical");
    let mut found = BTreeSet::new();
    for package in metadata["packages"].as_array().expect("packages") {
        found.insert(format!("package {}", package["name"]));
        for target in package["targets"].as_array().expect("targets") {
            let kinds: Vec<&str> = target["kind"]
                .as_array()
                .expect("kinds")
                .iter()
                .filter_map(Value::as_str)
                .collect();
            if kinds.iter().any(|k| *k == "test" || *k == "example") {
                continue;
            }
            let source = Path::new(target["src_path"].as_str().expect("src_path"));
            let source = source
                .strip_prefix(dir)
                .or_else(|_| source.strip_prefix(&canonical))
                .unwrap_or(source);
            found.insert(format!(
                "{kinds:?} {} at {}",
                target["name"],
                source.display()
            ));
        }
    }
    Ok(found)
}

/// The files `text` (a source at `file`, in the crate at `manifest_dir`)
/// embeds or migrates from.
fn embedded(text: &str, file: &Path, manifest_dir: &Path) -> Vec<PathBuf> {
    let from_file = ["include_str!(\"", "include_bytes!(\""];
    let mut found = Vec::new();
    for (macro_call, base) in from_file
        .iter()
        .map(|m| (*m, file.parent().expect("a folder")))
        .chain([("migrate!(\"", manifest_dir)])
    {
        for (at, _) in text.match_indices(macro_call) {
            let rest = &text[at + macro_call.len()..];
            let named = &rest[..rest.find('"').expect("a closing quote")];
            found.push(base.join(named));
        }
    }
    found
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a directory").flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_build_context_holds_the_whole_workspace() {
    let rules = rules();
    let context = tempfile::tempdir().expect("tempdir");
    let mut copied = 0;
    copy_sent(&rules, Path::new(""), context.path(), &mut copied);

    let repository = workspace(&root())
        .await
        .expect("the repository's workspace");
    let sent = workspace(context.path())
        .await
        .unwrap_or_else(|e| panic!("cargo cannot read the build context's workspace:\n{e}"));
    let left_out: Vec<_> = repository.difference(&sent).collect();
    assert!(
        left_out.is_empty(),
        "left out of the context: {left_out:#?}"
    );

    let mut missing = Vec::new();
    let mut sources = Vec::new();
    rust_files(context.path(), &mut sources);
    for source in &sources {
        let text = std::fs::read_to_string(source).expect("a source");
        let manifest_dir = source
            .ancestors()
            .find(|dir| dir.join("Cargo.toml").is_file())
            .expect("in a crate");
        for needed in embedded(&text, source, manifest_dir) {
            if !needed.exists() {
                missing.push(
                    needed
                        .strip_prefix(context.path())
                        .unwrap_or(&needed)
                        .display()
                        .to_string(),
                );
            }
        }
    }
    assert!(
        copied > 20 && sources.len() > 20,
        "only {copied} files let through, {} sources",
        sources.len()
    );
    assert!(missing.is_empty(), "embedded but left out: {missing:#?}");
}

#[test]
fn the_rules_are_read_as_podman_reads_them() {
    let rule = |line: &str| Rule {
        names: line
            .trim_start_matches('!')
            .split('/')
            .map(str::to_string)
            .collect(),
        lets_in: line.starts_with('!'),
    };
    let rules = [
        rule("*"),
        rule("!src"),
        rule("!benches/*.rs"),
        rule("!a/**/z"),
    ];
    let sent = |path: &str| sent(&rules, &path.split('/').collect::<Vec<_>>());
    assert!(sent("src/main.rs") && sent("src/deep/mod.rs"));
    assert!(sent("benches/gateway.rs") && !sent("benches/README.md"));
    assert!(!sent("Cargo.toml") && !sent("crates/model/Cargo.toml"));
    assert!(sent("a/z") && sent("a/b/c/z") && !sent("a/b/y"));
    assert!(worth_reading(&rules, &["benches"]) && worth_reading(&rules, &["a", "b"]));
    assert!(!worth_reading(&rules, &["crates"]) && !worth_reading(&rules, &["benches", "x"]));
}
