//! The documents stay true to the repository and to the code
//! (docs/testing.md). Nothing here touches the network.
//!
//! - Every relative link in the documents resolves to a file, and every
//!   `#anchor` to a heading of it (GitHub's slugs); every repository path a
//!   document names in backticks exists.
//! - Every section a document or a code comment cites by name (a page, then
//!   a quoted section title) is a heading or a bold or italic lead-in of
//!   that page, and every `ARCHITECTURE.md §N` is one of its sections.
//! - The configuration reference (docs/configuration.md, "Every key") has a
//!   row for exactly the keys the loader accepts (read from the loader's
//!   own "unknown field, expected one of" answer), each written default
//!   changes nothing when written into a file (so a default changed in the
//!   code alone fails here), and each key said to be required is.
//! - `config/idemgate.toml` shows every key, and each value it shows where
//!   a key has a default is that default; SECURITY.md's limits table agrees.
//! - Every `idemgate …` command line in the documents' code blocks parses
//!   with the real command line, and every command and flag it has is
//!   named in the documents (each command in operating.md's table).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use clap::Parser;
use idemgate::config::Config;
use idemgate_tools::cli::Cli;

/// Fails with every finding at once, and when fewer than `at_least`
/// things were read at all: a check that read nothing proves nothing.
fn verdict(checked: usize, at_least: usize, read: &str, heading: &str, findings: &[String]) {
    assert!(checked > at_least, "only {checked} {read}");
    assert!(findings.is_empty(), "{heading}:\n{}", findings.join("\n"));
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The documents checked, relative to the repository root.
fn documents() -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = [
        "README.md",
        "ARCHITECTURE.md",
        "SECURITY.md",
        "benches/README.md",
        "fuzz/README.md",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/ exists")
        .map(|entry| entry.expect("docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .map(|path| {
            path.strip_prefix(root())
                .expect("under the root")
                .to_path_buf()
        })
        .collect();
    pages.sort();
    assert!(pages.len() >= 5, "docs/ has its pages: {pages:?}");
    docs.extend(pages);
    docs
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

// ---------------------------------------------------------------------------
// Markdown, as far as these checks need it.

/// The text outside fenced code blocks, line by line (fence lines blank),
/// so line numbers stay those of the file.
fn prose(text: &str) -> String {
    let mut fenced = false;
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

/// The lines inside fenced code blocks, each with its block's language.
fn fenced_lines(text: &str) -> Vec<(String, String)> {
    let mut language = None;
    let mut out = Vec::new();
    for line in text.lines() {
        match (line.trim_start().strip_prefix("```"), &language) {
            (Some(info), None) => language = Some(info.trim().to_string()),
            (Some(_), Some(_)) => language = None,
            (None, Some(lang)) => out.push((lang.clone(), line.to_string())),
            (None, None) => {}
        }
    }
    out
}

/// `text` with its code spans removed, and the spans.
fn split_code_spans(text: &str) -> (String, Vec<String>) {
    let mut outside = String::with_capacity(text.len());
    let mut spans = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find('`') {
        outside.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after.find('`') {
            Some(close) => {
                spans.push(after[..close].replace('\n', " "));
                rest = &after[close + 1..];
            }
            None => {
                rest = after;
            }
        }
    }
    outside.push_str(rest);
    (outside, spans)
}

/// The headings' texts, in order.
fn headings(text: &str) -> Vec<String> {
    prose(text)
        .lines()
        .filter_map(|line| {
            let hashes = line.bytes().take_while(|b| *b == b'#').count();
            (1..=6)
                .contains(&hashes)
                .then(|| line[hashes..].to_string())
        })
        .filter(|rest| rest.starts_with(' '))
        .map(|rest| rest.trim().to_string())
        .collect()
}

/// GitHub's anchor for a heading: lower case, letters, digits, `-` and `_`
/// kept, spaces made `-`, everything else dropped.
fn slug(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .flat_map(char::to_lowercase)
        .collect()
}

/// Every anchor a page has; a repeated heading's gets `-1`, `-2`, ….
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for heading in headings(text) {
        let base = slug(&heading);
        let n = seen.entry(base.clone()).or_default();
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// The targets of inline links and images, `[text](target)`, outside code.
fn link_targets(text: &str) -> Vec<String> {
    let (outside, _) = split_code_spans(&prose(text));
    outside
        .match_indices("](")
        .filter_map(|(at, _)| {
            let rest = &outside[at + 2..];
            let end = rest.find([')', ' ', '\n'])?;
            (rest.as_bytes()[end] == b')').then(|| rest[..end].to_string())
        })
        .collect()
}

#[test]
fn the_markdown_reader_reads_what_github_shows() {
    assert_eq!(
        slug("`compare_nginx.sh`: idemgate beside nginx under wrk"),
        "compare_nginxsh-idemgate-beside-nginx-under-wrk"
    );
    assert_eq!(slug("1. The life of a write"), "1-the-life-of-a-write");
    assert_eq!(
        slug("What each failure becomes, and what the client should do"),
        "what-each-failure-becomes-and-what-the-client-should-do"
    );
    let page = "# A\n```sh\n# not a heading [x](nowhere.md)\n```\n## A\n[t](b.md#c) `[u](v.md)` ![i](p.png)\n";
    assert_eq!(headings(page), ["A", "A"]);
    assert_eq!(
        anchors(page),
        BTreeSet::from(["a".to_string(), "a-1".to_string()])
    );
    assert_eq!(link_targets(page), ["b.md#c", "p.png"]);
    assert_eq!(
        fenced_lines(page),
        [(
            "sh".to_string(),
            "# not a heading [x](nowhere.md)".to_string()
        )]
    );
}

// ---------------------------------------------------------------------------
// Links, paths and cited sections.

#[test]
fn every_relative_link_resolves_to_a_file_and_a_heading() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = read(&doc);
        let dir = doc.parent().unwrap_or(Path::new(""));
        for target in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (file, anchor) = match target.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (target.as_str(), None),
            };
            let path = if file.is_empty() {
                doc.clone()
            } else {
                dir.join(file)
            };
            if !root().join(&path).exists() {
                broken.push(format!("{}: {target}: no such file", doc.display()));
                continue;
            }
            if let Some(anchor) = anchor
                && path.extension().is_some_and(|e| e == "md")
                && !anchors(&read(&path)).contains(anchor)
            {
                broken.push(format!(
                    "{}: {target}: {} has no heading #{anchor}",
                    doc.display(),
                    path.display()
                ));
            }
        }
    }
    verdict(checked, 50, "links read", "broken links", &broken);
}

/// Where a backticked name is a path of this repository.
fn repository_path(span: &str) -> Option<&str> {
    const TOP: [&str; 10] = [
        "src/",
        "crates/",
        "tests/",
        "benches/",
        "config/",
        "contrib/",
        "migrations/",
        "fuzz/",
        "docs/",
        ".ci/",
    ];
    let pathlike = !span.is_empty()
        && span
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_./-".contains(&b));
    let named = TOP.iter().any(|top| span.starts_with(top))
        || (span.contains('/') && span.ends_with(".rs") && !span.starts_with('/'));
    (pathlike && named).then_some(span)
}

#[test]
fn every_repository_path_a_document_names_exists() {
    let mut missing = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let (_, spans) = split_code_spans(&prose(&read(&doc)));
        for path in spans.iter().filter_map(|s| repository_path(s)) {
            checked += 1;
            // Module paths (`pipeline/claim.rs`) are a crate's, under its
            // src/; what .gitignore names is made by running something.
            if !root().join(path).exists()
                && !crate_sources().iter().any(|src| src.join(path).exists())
                && !ignored(Path::new(path))
            {
                missing.push(format!("{}: `{path}`", doc.display()));
            }
        }
    }
    verdict(
        checked,
        50,
        "paths read",
        "paths named that do not exist",
        &missing,
    );
}

/// The src/ folders of the binary and of each crate of the workspace.
fn crate_sources() -> Vec<PathBuf> {
    let crates = std::fs::read_dir(root().join("crates")).expect("crates/");
    let mut sources = vec![root().join("src")];
    sources.extend(crates.map(|entry| entry.expect("a directory entry").path().join("src")));
    sources
}

/// Whether a `.gitignore` of the repository (at the root or in one of
/// `path`'s directories) names `path` or a directory it is in, so that a
/// clone does not hold it until something is run.
fn ignored(path: &Path) -> bool {
    let dirs = path.ancestors().skip(1);
    dirs.into_iter().any(|dir| {
        let Ok(rules) = std::fs::read_to_string(root().join(dir).join(".gitignore")) else {
            return false;
        };
        let below = path.strip_prefix(dir).expect("an ancestor");
        rules
            .lines()
            .map(str::trim)
            .filter(|rule| !rule.is_empty() && !rule.starts_with('#'))
            .any(|rule| match rule.trim_start_matches('/') {
                anchored if rule.contains('/') => below.starts_with(anchored.trim_end_matches('/')),
                name => below.iter().any(|part| part == name),
            })
    })
}

/// The comments of the repository's code and config files, each comment
/// block joined into one line, with where it starts.
fn comment_blocks() -> Vec<(String, String)> {
    let mut files = Vec::new();
    for dir in ["src", "tests", "benches", "config", "contrib", "fuzz"] {
        collect_files(&root().join(dir), &mut files);
    }
    let mut blocks = Vec::new();
    for file in files {
        let Some(ext) = file.extension().and_then(|e| e.to_str()) else {
            continue;
        };
        let markers: &[&str] = match ext {
            "rs" => &["//!", "///", "//"],
            "toml" | "yml" | "sh" | "py" => &["#"],
            _ => continue,
        };
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let name = file.strip_prefix(root()).unwrap_or(&file).display();
        let mut block = String::new();
        let mut start = 0;
        for (n, line) in text.lines().enumerate() {
            let trimmed = line.trim_start();
            match markers.iter().find(|m| trimmed.starts_with(**m)) {
                Some(marker) => {
                    if block.is_empty() {
                        start = n + 1;
                    }
                    block.push(' ');
                    block.push_str(trimmed[marker.len()..].trim());
                }
                None if !block.is_empty() => {
                    blocks.push((format!("{name}:{start}"), std::mem::take(&mut block)));
                }
                None => {}
            }
        }
        if !block.is_empty() {
            blocks.push((format!("{name}:{start}"), block));
        }
    }
    blocks
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if name == "target" || name == "node_modules" || name == ".venv" {
            continue;
        }
        if path.is_dir() {
            collect_files(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// The pages a citation may name, as written, and their files.
const PAGES: [(&str, &str); 5] = [
    ("ARCHITECTURE.md", "ARCHITECTURE.md"),
    ("SECURITY.md", "SECURITY.md"),
    ("benches/README.md", "benches/README.md"),
    ("fuzz/README.md", "fuzz/README.md"),
    ("README", "README.md"),
];

/// The page a citation at `text`'s start names, and what follows it.
fn cited_page(text: &str) -> Option<(PathBuf, &str)> {
    if let Some(rest) = text.strip_prefix("docs/") {
        let end = rest.find(".md")?;
        let name = &rest[..end];
        let ok = !name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'-');
        return ok.then(|| (PathBuf::from(format!("docs/{name}.md")), &rest[end + 3..]));
    }
    PAGES.iter().find_map(|(written, file)| {
        let rest = text.strip_prefix(written)?;
        let rest = if *written == "README" {
            rest.strip_prefix(".md").unwrap_or(rest)
        } else {
            rest
        };
        Some((PathBuf::from(file), rest))
    })
}

/// Every (page, section) cited in `text`: a page, then `§N` and/or a quoted
/// or emphasised title, with at most a comma, a backtick or a space
/// between.
fn citations(text: &str) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    for (at, _) in text.char_indices() {
        if at > 0 && !text[..at].ends_with([' ', '(', '[', '`', '"']) {
            continue;
        }
        let Some((page, rest)) = cited_page(&text[at..]) else {
            continue;
        };
        let mut rest = rest.trim_start_matches(['`', ']']);
        if let Some(after) = rest.strip_prefix(" §") {
            let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
            if !digits.is_empty() {
                out.push((page.clone(), format!("§{digits}")));
            }
            rest = &after[digits.len()..];
        }
        let rest = rest.trim_start_matches([',', ' ', '(']);
        for quote in ['"', '*'] {
            if let Some(title) = rest.strip_prefix(quote)
                && let Some(end) = title.find(quote)
                && end <= 80
            {
                let title = title[..end]
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ");
                out.push((page.clone(), title));
            }
        }
    }
    out
}

/// Whether `page` has `section`: a heading that starts with it, a bold or
/// italic lead-in that does, or for `§N` a heading `N. …`.
fn has_section(page: &str, section: &str) -> bool {
    let plain = |s: &str| s.replace(['`', '*'], "").to_lowercase();
    let wanted = plain(section);
    if let Some(number) = section.strip_prefix('§') {
        let prefix = format!("{number}. ");
        return headings(page).iter().any(|h| h.starts_with(&prefix));
    }
    headings(page).iter().any(|h| plain(h).starts_with(&wanted))
        || page
            .to_lowercase()
            .replace('`', "")
            .contains(&format!("*{wanted}"))
}

#[test]
fn every_cited_section_exists() {
    let mut sources: Vec<(String, String)> = documents()
        .iter()
        .map(|doc| {
            let text = prose(&read(doc)).replace('\n', " ");
            (doc.display().to_string(), text)
        })
        .collect();
    sources.extend(comment_blocks());
    let mut wrong = Vec::new();
    let mut checked = 0;
    for (source, text) in &sources {
        for (page, section) in citations(text) {
            checked += 1;
            let Ok(body) = std::fs::read_to_string(root().join(&page)) else {
                wrong.push(format!(
                    "{source}: cites {}, which does not exist",
                    page.display()
                ));
                continue;
            };
            if !has_section(&body, &section) {
                wrong.push(format!(
                    "{source}: cites {} \"{section}\", which has no such section",
                    page.display()
                ));
            }
        }
    }
    verdict(
        checked,
        40,
        "citations read",
        "citations of missing sections",
        &wrong,
    );
}

#[test]
fn the_citation_reader_finds_pages_and_titles() {
    let text = "(ARCHITECTURE.md §4, \"Counts\") and [docs/operating.md, \"Alerts\"](x) \
                (README \"The states\"; SECURITY.md, *The operator console*) READMEs";
    let found: Vec<(String, String)> = citations(text)
        .into_iter()
        .map(|(page, section)| (page.display().to_string(), section))
        .collect();
    let expected = [
        ("ARCHITECTURE.md", "§4"),
        ("ARCHITECTURE.md", "Counts"),
        ("docs/operating.md", "Alerts"),
        ("README.md", "The states"),
        ("SECURITY.md", "The operator console"),
    ];
    assert_eq!(found, expected.map(|(p, s)| (p.to_string(), s.to_string())),);
    assert!(has_section("## 4. The store\n", "§4"));
    assert!(has_section("- *Fencing: nothing is sent*\n", "Fencing"));
    assert!(!has_section("## Counts\n", "Alerts"));
}

// ---------------------------------------------------------------------------
// The configuration reference against the loader.

/// What docs/configuration.md says a key's default is.
#[derive(Debug, Clone, PartialEq)]
enum Documented {
    /// Written in TOML, as it would be in the file.
    Value(toml::Value),
    /// Unset unless given: the feature is off.
    None,
    /// The entry needs it.
    Required,
}

/// The keys of the reference's table, in order, with their defaults.
fn reference() -> Vec<(String, Documented)> {
    let text = read(Path::new("docs/configuration.md"));
    let mut lines = text
        .lines()
        .skip_while(|l| *l != "| key | default | meaning |");
    assert!(
        lines.next().is_some(),
        "docs/configuration.md has its table"
    );
    let mut keys = Vec::new();
    for row in lines.skip(1).take_while(|l| l.starts_with('|')) {
        let cells: Vec<&str> = row.trim_matches('|').splitn(3, " | ").collect();
        let [key_cell, default_cell, _] = cells[..] else {
            panic!("docs/configuration.md: a row without three cells: {row}");
        };
        let default = match default_cell.trim() {
            "none" => Documented::None,
            "required" => Documented::Required,
            written => {
                let literal = written
                    .strip_prefix('`')
                    .and_then(|w| w.strip_suffix('`'))
                    .unwrap_or_else(|| panic!("{row}: a default is none, required or `TOML`"));
                Documented::Value(toml_value(literal).unwrap_or_else(|e| {
                    panic!("{row}: the default `{literal}` is not a TOML value: {e}")
                }))
            }
        };
        let (_, names) = split_code_spans(key_cell);
        assert!(!names.is_empty(), "{row}: no key");
        for name in names {
            keys.push((name, default.clone()));
        }
    }
    assert!(keys.len() > 50, "only {} keys read", keys.len());
    keys
}

fn toml_value(literal: &str) -> Result<toml::Value, toml::de::Error> {
    let mut table: toml::Table = toml::from_str(&format!("v = {literal}"))?;
    Ok(table.remove("v").expect("the value just parsed"))
}

/// A key as the reference writes it (`routes[].reconcile.url`): the
/// table it is in (`routes.reconcile`) and its name (`url`).
fn place(key: &str) -> (String, String) {
    let (table, name) = key.rsplit_once('.').unwrap_or(("", key));
    (table.replace("[]", ""), name.to_string())
}

/// The smallest config the loader takes: one route.
fn minimal() -> toml::Table {
    toml::from_str("[[routes]]\nname = \"api\"\nupstream = \"http://127.0.0.1:9\"\n")
        .expect("the minimal config parses")
}

/// The table `table_path` (`routes.reconcile`) of `config`, made if absent;
/// arrays of tables (`routes`, `alerts`) are entered at their first entry.
fn table_at<'a>(config: &'a mut toml::Table, table_path: &str) -> &'a mut toml::Table {
    let mut table = config;
    for part in table_path.split('.').filter(|p| !p.is_empty()) {
        let entry = table.entry(part.to_string()).or_insert_with(|| {
            if part == "routes" || part == "alerts" {
                toml::Value::Array(vec![toml::Value::Table(toml::Table::new())])
            } else {
                toml::Value::Table(toml::Table::new())
            }
        });
        table = match entry {
            toml::Value::Array(entries) => entries[0].as_table_mut().expect("an array of tables"),
            toml::Value::Table(inner) => inner,
            other => panic!("{part} is {other}, not a table"),
        };
    }
    table
}

fn set(config: &mut toml::Table, key: &str, value: toml::Value) {
    let (table, name) = place(key);
    table_at(config, &table).insert(name, value);
}

/// What a key needs beside it to be taken at all. A key added to the code
/// that needs others fails `each_default_is_the_codes` until it is here.
fn context(key: &str) -> toml::Table {
    let mut config = minimal();
    let text = toml::Value::from;
    if key == "store.lease" {
        set(
            &mut config,
            "store.url",
            text("postgres://idemgate@127.0.0.1/idemgate"),
        );
    }
    if key == "routes[].quota_window" {
        set(
            &mut config,
            "routes[].quota_operations",
            toml::Value::Integer(1),
        );
    }
    if key.starts_with("routes[].reconcile.") {
        set(
            &mut config,
            "routes[].reconcile.url",
            text("http://127.0.0.1:9/tasks/{key}"),
        );
    }
    if key == "routes[].mcp.reconcile.confirm_arguments" {
        // A confirm call confirms an absence.
        for (key, value) in [
            ("absent_json_pointer", "/structuredContent/tasks"),
            ("count_json_pointer", "/structuredContent/tasks"),
            ("confirm_tool", "list_tasks"),
            ("confirm_absent_json_pointer", "/structuredContent/tasks"),
        ] {
            set(
                &mut config,
                &format!("routes[].mcp.reconcile.{key}"),
                text(value),
            );
        }
    }
    if key.starts_with("alerts[].") {
        set(&mut config, "alerts[].url", text("http://127.0.0.1:9/hook"));
    }
    if key.starts_with("routes[].mcp") || key.starts_with("routes.mcp.") {
        set(&mut config, "routes[].profile", text("mcp"));
    }
    if key.starts_with("routes[].mcp.reconcile.") || key.starts_with("routes.mcp.reconcile.") {
        set(
            &mut config,
            "routes[].mcp.reconcile.tool",
            text("find_task"),
        );
        set(
            &mut config,
            "routes[].mcp.reconcile.tools",
            toml::Value::Array(vec![text("create_task")]),
        );
    }
    config
}

fn load(config: &toml::Table) -> Result<Config, String> {
    let text = toml::to_string(config).expect("a table serialises");
    Config::from_toml_str(&text, "docs-check").map_err(|e| e.to_string())
}

/// The keys the loader accepts in `table_path`, read from its refusal of
/// a key it does not know ("unknown field `…`, expected one of …").
fn accepted(table_path: &str) -> BTreeSet<String> {
    let mut config = context(&format!("{table_path}.probe"));
    let probe = "docs_check_unknown_key";
    table_at(&mut config, table_path).insert(probe.into(), toml::Value::Integer(1));
    let error = load(&config).expect_err("an unknown key is refused");
    let expected = error
        .split_once(&format!("unknown field `{probe}`, expected "))
        .unwrap_or_else(|| panic!("{table_path}: not a refusal naming the fields: {error}"))
        .1;
    let list = expected.lines().next().unwrap_or_default();
    let (_, names) = split_code_spans(list);
    assert!(!names.is_empty(), "{table_path}: no field names in {error}");
    names.into_iter().collect()
}

/// Every key the loader accepts, written as the reference writes them.
fn accepted_keys() -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    for (table_path, written) in [
        ("server", "server."),
        ("store", "store."),
        ("routes", "routes[]."),
        ("routes.reconcile", "routes[].reconcile."),
        ("routes.mcp", "routes[].mcp."),
        ("routes.mcp.reconcile", "routes[].mcp.reconcile."),
        ("alerts", "alerts[]."),
    ] {
        for name in accepted(table_path) {
            keys.insert(format!("{written}{name}"));
        }
    }
    let sections = accepted("");
    assert_eq!(
        sections,
        BTreeSet::from(["server", "store", "routes", "alerts"].map(String::from)),
        "the file's top-level tables"
    );
    keys
}

#[test]
fn the_reference_documents_exactly_the_keys_the_loader_accepts() {
    let documented: BTreeSet<String> = reference().into_iter().map(|(key, _)| key).collect();
    let accepted = accepted_keys();
    let undocumented: Vec<_> = accepted.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&accepted).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "docs/configuration.md is missing {undocumented:?} and documents keys the loader refuses: {unknown:?}"
    );
}

#[test]
fn each_default_is_the_codes() {
    let mut wrong = Vec::new();
    let mut checked = 0;
    for (key, default) in reference() {
        let base = context(&key);
        let without = load(&base).unwrap_or_else(|e| panic!("{key}: the context is refused: {e}"));
        match default {
            Documented::Value(value) => {
                let mut config = base.clone();
                set(&mut config, &key, value.clone());
                match load(&config) {
                    // Debug shows every field of the validated config.
                    Ok(with) if format!("{with:?}") == format!("{without:?}") => checked += 1,
                    Ok(_) => wrong.push(format!(
                        "{key}: the code's default is not {value}, as docs/configuration.md says"
                    )),
                    Err(error) => wrong.push(format!(
                        "{key} = {value} is refused ({error}); if it needs other keys, add them to context()"
                    )),
                }
            }
            Documented::Required => {
                let mut config = base.clone();
                let (table, name) = place(&key);
                assert!(
                    table_at(&mut config, &table).remove(&name).is_some(),
                    "{key}: context() must give required keys"
                );
                match load(&config) {
                    Err(error) if error.contains(&name) => checked += 1,
                    Err(error) => wrong.push(format!(
                        "{key}: refused without it, but not for it: {error}"
                    )),
                    Ok(_) => wrong.push(format!("{key}: said to be required, but not needed")),
                }
            }
            Documented::None => {}
        }
    }
    verdict(
        checked,
        40,
        "defaults checked",
        "docs/configuration.md disagrees with the code",
        &wrong,
    );
}

/// Which table a line of the example config opens, if it is a header
/// (set or commented out).
fn header(line: &str) -> Option<&str> {
    let inner = line
        .strip_prefix("[[")
        .and_then(|l| l.strip_suffix("]]"))
        .or_else(|| line.strip_prefix('[').and_then(|l| l.strip_suffix(']')))?;
    inner
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b == b'.' || b == b'_')
        .then_some(inner)
}

/// The keys config/idemgate.toml shows, set or commented out, as the
/// reference writes them, with the value shown and whether it is in the
/// part of the file that shows defaults (not the second route).
fn example_keys(accepted: &BTreeSet<String>) -> Vec<(String, toml::Value, bool)> {
    let text = read(Path::new("config/idemgate.toml"));
    let mut table = String::new();
    let mut routes = 0;
    let mut shown = Vec::new();
    for line in text.lines() {
        let commented = line.trim_start().starts_with('#');
        let line = line.trim_start().trim_start_matches('#').trim();
        if let Some(opened) = header(line) {
            table = opened.to_string();
            routes += usize::from(opened == "routes");
            if let Some((array, inner)) = opened.split_once('.') {
                // A sub-table's header shows its key: `[routes.reconcile]`.
                let shown_table = toml::Value::Table(toml::Table::new());
                shown.push((format!("{array}[].{inner}"), shown_table, false));
            }
            continue;
        }
        let Ok(parsed) = toml::from_str::<toml::Table>(line) else {
            continue;
        };
        let Some((name, value)) = parsed.into_iter().next() else {
            continue;
        };
        let key = match table.split_once('.') {
            Some((array, inner)) => format!("{array}[].{inner}.{name}"),
            None if table == "routes" || table == "alerts" => format!("{table}[].{name}"),
            None => format!("{table}.{name}"),
        };
        if commented && !accepted.contains(&key) {
            continue; // prose that happens to read as TOML
        }
        let shows_defaults = !table.starts_with("routes") || routes == 1;
        shown.push((key, value, shows_defaults));
    }
    shown
}

#[test]
fn the_example_config_shows_every_key_at_its_default() {
    let path = root().join("config/idemgate.toml");
    Config::load(&path).unwrap_or_else(|e| panic!("config/idemgate.toml is refused: {e}"));
    let accepted = accepted_keys();
    let reference: BTreeMap<String, Documented> = reference().into_iter().collect();
    let shown = example_keys(&accepted);
    let mut wrong = Vec::new();
    let mut checked = 0;
    for (key, value, shows_defaults) in &shown {
        match reference.get(key) {
            None => wrong.push(format!("{key}: not in docs/configuration.md")),
            Some(Documented::Value(default)) if *shows_defaults => {
                checked += 1;
                if value != default {
                    wrong.push(format!(
                        "{key} = {value}, but its default is {default} (docs/configuration.md)"
                    ));
                }
            }
            Some(_) => {}
        }
    }
    let shown_keys: BTreeSet<&String> = shown.iter().map(|(key, ..)| key).collect();
    for key in &accepted {
        if !shown_keys.contains(key) {
            wrong.push(format!("{key}: not shown"));
        }
    }
    verdict(
        checked,
        40,
        "values checked",
        "config/idemgate.toml",
        &wrong,
    );
}

#[test]
fn the_security_limits_agree_with_the_reference() {
    let reference: BTreeMap<String, Documented> = reference().into_iter().collect();
    let text = read(Path::new("SECURITY.md"));
    let mut lines = text
        .lines()
        .skip_while(|l| !l.starts_with("| limit | default |"));
    assert!(lines.next().is_some(), "SECURITY.md has its limits table");
    let mut wrong = Vec::new();
    let mut checked = 0;
    for row in lines.skip(1).take_while(|l| l.starts_with('|')) {
        let cells: Vec<&str> = row.trim_matches('|').split(" | ").collect();
        let (_, keys) = split_code_spans(cells[0]);
        let [key] = &keys[..] else { continue };
        let Some(documented) = reference.get(key) else {
            continue;
        };
        checked += 1;
        let (_, values) = split_code_spans(cells[1]);
        let stated = match values.first() {
            Some(value) => Documented::Value(
                toml_value(value).unwrap_or_else(|_| toml::Value::String(value.clone())),
            ),
            None if cells[1].trim() == "none" => Documented::None,
            None => Documented::Required,
        };
        if stated != *documented {
            wrong.push(format!(
                "{key}: SECURITY.md says {}, docs/configuration.md {documented:?}",
                cells[1].trim()
            ));
        }
    }
    verdict(
        checked,
        15,
        "limits read",
        "SECURITY.md, \"Limits\"",
        &wrong,
    );
}

// ---------------------------------------------------------------------------
// Command lines.

/// Splits a shell line into words: quotes kept together, `#` comments and
/// a leading `$ ` prompt dropped.
fn words(line: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut word: Option<String> = None;
    let mut quote = None;
    for c in line.trim().trim_start_matches("$ ").chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.get_or_insert_default().push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                word.get_or_insert_default();
            }
            (None, '#') if word.is_none() => break,
            (None, c) if c.is_whitespace() => out.extend(word.take()),
            (None, c) => word.get_or_insert_default().push(c),
        }
    }
    out.extend(word);
    quote.is_none().then_some(out)
}

#[test]
fn every_command_line_shown_parses() {
    let mut wrong = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let lines = fenced_lines(&read(&doc));
        let mut joined = Vec::new();
        let mut pending = String::new();
        for (language, line) in lines {
            // A command: a line of a shell block, or one after a `$ ` prompt.
            let shell = matches!(language.as_str(), "sh" | "bash" | "shell");
            if !shell && !line.starts_with("$ ") && pending.is_empty() {
                continue;
            }
            match line.trim_end().strip_suffix('\\') {
                Some(head) => pending.push_str(head),
                None => joined.push(std::mem::take(&mut pending) + &line),
            }
        }
        for line in joined {
            let Some(words) = words(&line) else { continue };
            let args: Vec<&str> = match words.iter().map(String::as_str).collect::<Vec<_>>()[..] {
                ["cargo", "run", "--release", "--", ref rest @ ..] => rest.to_vec(),
                ["idemgate", ref rest @ ..] => rest.to_vec(),
                _ => continue,
            };
            // Placeholders (`…`, `$(…)`) are not arguments to check.
            if args.is_empty() || args.iter().any(|a| a.contains('…') || a.contains("$(")) {
                continue;
            }
            checked += 1;
            let argv = std::iter::once("idemgate").chain(args.iter().copied());
            if let Err(error) = Cli::try_parse_from(argv) {
                wrong.push(format!(
                    "{}: `{}`: {}",
                    doc.display(),
                    line.trim(),
                    error.kind()
                ));
            }
        }
    }
    verdict(
        checked,
        10,
        "command lines read",
        "command lines the CLI refuses",
        &wrong,
    );
}

/// Every command and every long flag of the command line (what `idemgate
/// <command> --help` lists) is named in the documents: each command in
/// operating.md's "The command line" as `idemgate NAME`, each flag
/// somewhere as `--flag`.
#[test]
fn every_command_and_flag_is_documented() {
    use clap::CommandFactory;
    let all: String = documents().iter().map(|doc| read(doc)).collect();
    let operating = read(Path::new("docs/operating.md"));
    let table = operating
        .split("\n## The command line\n")
        .nth(1)
        .expect("operating.md has \"The command line\"");
    let named = |text: &str, word: &str| {
        text.match_indices(word).any(|(at, _)| {
            let next = text[at + word.len()..].chars().next();
            !next.is_some_and(|c| c.is_alphanumeric() || c == '-' || c == '_')
        })
    };
    let (mut checked, mut missing) = (0, Vec::new());
    let mut commands = vec![(String::new(), Cli::command())];
    while let Some((path, command)) = commands.pop() {
        for arg in command.get_arguments().filter(|arg| !arg.is_hide_set()) {
            let Some(long) = arg.get_long().filter(|l| !["help", "version"].contains(l)) else {
                continue;
            };
            checked += 1;
            if !named(&all, &format!("--{long}")) {
                missing.push(format!("`idemgate{path} --{long}`"));
            }
        }
        for sub in command.get_subcommands() {
            let path = format!("{path} {}", sub.get_name());
            if path.matches(' ').count() == 1 && !named(table, &format!("`idemgate{path}")) {
                missing.push(format!("`idemgate{path}` in operating.md's command table"));
            }
            commands.push((path, sub.clone()));
        }
    }
    verdict(
        checked,
        40,
        "flags read",
        "commands or flags no document names",
        &missing,
    );
}
