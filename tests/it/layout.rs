//! The floor plan has no loops. Between crates Cargo keeps it (a crate
//! cannot depend on one that depends on it); inside a crate this test does:
//! in every folder of `crates/*/src` (the crate root included), no two of
//! its modules (`X.rs` or `X/`) reach each other through paths
//! (`crate::…::X`, or `super::X` from a sibling), so each can be changed
//! alone (ARCHITECTURE.md §1, "The floor plan"). A path counts wherever it
//! is written — a `use`, an expression, a doc link — except in a unit test
//! module (`#[cfg(test)] mod tests { … }`, to the end of its file), which
//! may reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each module of one folder and the modules of that folder it names.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// Every dependency given by path, in every manifest of the repository
/// (the workspace's, each crate's, and fuzz/'s, a workspace of its own
/// that no `cargo test` builds), names the package found at that path: a
/// crate renamed or moved breaks a manifest here, not at the next fuzzing
/// run.
#[test]
fn every_path_dependency_names_the_package_at_its_path() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut manifests = vec![root.join("Cargo.toml"), root.join("fuzz/Cargo.toml")];
    for entry in std::fs::read_dir(root.join("crates")).expect("crates/") {
        manifests.push(entry.expect("a directory entry").path().join("Cargo.toml"));
    }
    let (mut checked, mut wrong) = (0, Vec::new());
    for manifest in &manifests {
        let text = std::fs::read_to_string(manifest).expect("a manifest");
        let parsed: toml::Table = text.parse().expect("a manifest in TOML");
        let workspace = parsed.get("workspace").and_then(|w| w.as_table());
        let tables = ["dependencies", "dev-dependencies", "build-dependencies"]
            .iter()
            .filter_map(|name| parsed.get(*name))
            .chain(workspace.and_then(|w| w.get("dependencies")));
        for table in tables.filter_map(|t| t.as_table()) {
            for (name, spec) in table {
                let Some(path) = spec.get("path").and_then(|p| p.as_str()) else {
                    continue;
                };
                checked += 1;
                let wanted = spec.get("package").and_then(|p| p.as_str()).unwrap_or(name);
                let at = manifest
                    .parent()
                    .expect("a folder")
                    .join(path)
                    .join("Cargo.toml");
                let found = std::fs::read_to_string(&at)
                    .ok()
                    .and_then(|text| text.parse::<toml::Table>().ok())
                    .and_then(|m| Some(m.get("package")?.get("name")?.as_str()?.to_string()));
                if found.as_deref() != Some(wanted) {
                    wrong.push(format!(
                        "{}: `{name}` at {path} finds {found:?}",
                        manifest.display()
                    ));
                }
            }
        }
    }
    assert!(checked >= 10, "only {checked} path dependencies read");
    assert!(
        wrong.is_empty(),
        "path dependencies that name another package:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_modules_of_each_folder_import_each_other_one_way() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates");
    let mut folders = 0;
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&crates).expect("crates/") {
        let src = entry.expect("a directory entry").path().join("src");
        for folder in folders_of(&src) {
            folders += 1;
            let graph = graph_of(&src, &folder);
            for cycle in cycles(&graph) {
                found.push(format!("{}: {}", folder.display(), cycle.join(" <-> ")));
            }
        }
    }
    assert!(folders > 10, "no folders read under {}", crates.display());
    assert!(
        found.is_empty(),
        "modules that import each other (make the arrows go one way):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_reader_sees_every_kind_of_path() {
    let text = "use crate::a::X;\n/// [`crate::b`]\nuse crate::{c, d::{e, f}, self};\n\
                let x = crate::g::h(); notcrate::z;\n#[cfg(test)]\nmod tests {\n use crate::t;\n}";
    let names: Vec<&str> = named_modules(text, "crate::").into_iter().collect();
    assert_eq!(names, ["a", "b", "c", "d", "g", "self"]);
    let nested = "use super::{load::Counters, plan};\nuse crate::bench::report::X;\n";
    let names: Vec<&str> = named_modules(nested, "super::").into_iter().collect();
    assert_eq!(names, ["load", "plan"]);
    let names: Vec<&str> = named_modules(nested, "crate::bench::")
        .into_iter()
        .collect();
    assert_eq!(names, ["report"]);
    let graph = Graph::from([
        ("a".into(), ["b".into()].into()),
        ("b".into(), ["c".into()].into()),
        ("c".into(), ["a".into()].into()),
        ("d".into(), ["a".into()].into()),
    ]);
    assert_eq!(cycles(&graph), [["a", "b", "c"]]);
}

/// `src` and every folder under it that holds Rust files.
fn folders_of(src: &Path) -> BTreeSet<PathBuf> {
    let mut folders: BTreeSet<PathBuf> = rust_files(src)
        .iter()
        .filter_map(|file| file.parent().map(Path::to_path_buf))
        .collect();
    folders.insert(src.to_path_buf());
    folders
}

/// The graph of `folder`'s modules (`mod.rs`, `lib.rs` and `main.rs` aside:
/// they are the folder's parent, not one of its modules).
fn graph_of(src: &Path, folder: &Path) -> Graph {
    let within = folder.strip_prefix(src).expect("under src");
    let mut prefix = String::from("crate::");
    for segment in within.components() {
        prefix.push_str(&segment.as_os_str().to_string_lossy());
        prefix.push_str("::");
    }
    let mut graph = Graph::new();
    for file in rust_files(folder) {
        let relative = file.strip_prefix(folder).expect("under its folder");
        let first = relative.components().next().expect("a path");
        let first = first.as_os_str().to_string_lossy();
        let module = first.strip_suffix(".rs").unwrap_or(&first).to_string();
        if ["mod", "lib", "main"].contains(&module.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("a readable source file");
        let mut named: BTreeSet<String> = named_modules(&text, &prefix)
            .into_iter()
            .map(String::from)
            .collect();
        // `super::` from `folder/X.rs` or `folder/X/mod.rs` is this folder.
        let depth = relative.components().count();
        let sibling = depth == 1 || (depth == 2 && relative.ends_with("mod.rs"));
        if sibling {
            named.extend(
                named_modules(&text, "super::")
                    .into_iter()
                    .map(String::from),
            );
        }
        graph.entry(module).or_default().extend(named);
    }
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for (module, named) in &mut graph {
        named.retain(|name| name != module && modules.contains(name));
    }
    graph
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).expect("a readable directory") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
    files
}

/// The first segment after `prefix` (`crate::`, `crate::pipeline::`,
/// `super::`) of every path in `text` before its unit test module, and of
/// every item of a `prefix{…}` group.
fn named_modules<'t>(text: &'t str, prefix: &str) -> BTreeSet<&'t str> {
    let text = &text[..unit_tests_start(text).unwrap_or(text.len())];
    let mut named = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().next_back();
        let after = &rest[at + prefix.len()..];
        rest = after;
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        match after.strip_prefix('{') {
            Some(group) => named.extend(group_items(group)),
            None => named.extend(ident(after)),
        }
    }
    named
}

/// Where `#[cfg(test)] mod tests {` starts, if the file has one.
fn unit_tests_start(text: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(at) = text[from..].find("#[cfg(test)]") {
        let start = from + at;
        let rest = text[start + "#[cfg(test)]".len()..].trim_start();
        if let Some(rest) = rest.strip_prefix("mod tests")
            && rest.trim_start().starts_with('{')
        {
            return Some(start);
        }
        from = start + 1;
    }
    None
}

/// The leading names of a group's top-level items, up to its closing brace.
fn group_items(group: &str) -> Vec<&str> {
    let (mut items, mut depth, mut item_start) = (Vec::new(), 0, Some(0));
    for (at, c) in group.char_indices() {
        if let Some(start) = item_start.take() {
            items.extend(ident(group[start..].trim_start()));
        }
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => item_start = Some(at + 1),
            _ => {}
        }
    }
    items
}

/// The module name `text` starts with, if it starts with one.
fn ident(text: &str) -> Option<&str> {
    let end = text
        .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
        .unwrap_or(text.len());
    let name = &text[..end];
    name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        .then_some(name)
}

/// The strongly connected components of more than one module (Tarjan),
/// each sorted.
fn cycles(graph: &Graph) -> Vec<Vec<&str>> {
    struct Walk<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        components: Vec<Vec<&'g str>>,
    }
    impl<'g> Walk<'g> {
        fn visit(&mut self, module: &'g str) {
            let index = self.index.len();
            self.index.insert(module, index);
            self.low.insert(module, index);
            self.stack.push(module);
            for next in self.graph.get(module).into_iter().flatten() {
                let next = next.as_str();
                if !self.index.contains_key(next) {
                    self.visit(next);
                    let low = self.low[module].min(self.low[next]);
                    self.low.insert(module, low);
                } else if self.stack.contains(&next) {
                    let low = self.low[module].min(self.index[next]);
                    self.low.insert(module, low);
                }
            }
            if self.low[module] == index {
                let at = self
                    .stack
                    .iter()
                    .rposition(|&m| m == module)
                    .expect("on the stack");
                let mut component = self.stack.split_off(at);
                if component.len() > 1 {
                    component.sort_unstable();
                    self.components.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        components: Vec::new(),
    };
    for module in graph.keys() {
        if !walk.index.contains_key(module.as_str()) {
            walk.visit(module);
        }
    }
    walk.components
}
