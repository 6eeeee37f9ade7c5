//! The floor plan has no loops: no two top-level modules of the crate
//! (`src/X.rs` or `src/X/`) reach each other through `crate::X` paths, so
//! each can be changed alone (ARCHITECTURE.md §1, "The floor plan"). A path counts wherever
//! it is written — a `use`, an expression, a doc link — except in a unit
//! test module (`#[cfg(test)] mod tests { … }`, to the end of its file),
//! which may reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module and the top-level modules it names.
type Graph = BTreeMap<String, BTreeSet<String>>;

#[test]
fn top_level_modules_import_each_other_one_way() {
    let graph = graph_of(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(graph.len() > 10, "no modules read: {graph:?}");
    let cycles: Vec<String> = cycles(&graph)
        .iter()
        .map(|cycle| format!("cycle: {}", cycle.join(" <-> ")))
        .collect();
    assert!(
        cycles.is_empty(),
        "top-level modules that import each other (make the arrows go one way):\n{}",
        cycles.join("\n")
    );
}

#[test]
fn the_reader_sees_every_kind_of_path() {
    let text = "use crate::a::X;\n/// [`crate::b`]\nuse crate::{c, d::{e, f}, self};\n\
                let x = crate::g::h(); notcrate::z;\n#[cfg(test)]\nmod tests {\n use crate::t;\n}";
    let names: Vec<&str> = named_modules(text).into_iter().collect();
    assert_eq!(names, ["a", "b", "c", "d", "g", "self"]);
    let graph = Graph::from([
        ("a".into(), ["b".into()].into()),
        ("b".into(), ["c".into()].into()),
        ("c".into(), ["a".into()].into()),
        ("d".into(), ["a".into()].into()),
    ]);
    assert_eq!(cycles(&graph), [["a", "b", "c"]]);
}

/// The graph of `src`'s top-level modules (`main` and `lib` aside).
fn graph_of(src: &Path) -> Graph {
    let mut graph = Graph::new();
    for file in rust_files(src) {
        let relative = file.strip_prefix(src).expect("under src");
        let first = relative.components().next().expect("a path");
        let first = first.as_os_str().to_string_lossy();
        let top = first.strip_suffix(".rs").unwrap_or(&first).to_string();
        if top == "main" || top == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("a readable source file");
        let named = named_modules(&text);
        graph
            .entry(top)
            .or_default()
            .extend(named.into_iter().map(String::from));
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

/// The first segment of every `crate::` path in `text` before its unit
/// test module, and of every item of a `crate::{…}` group.
fn named_modules(text: &str) -> BTreeSet<&str> {
    let text = &text[..unit_tests_start(text).unwrap_or(text.len())];
    let mut named = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        let after = &rest[at + "crate::".len()..];
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
