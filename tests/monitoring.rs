//! The monitoring that ships with idemgate (`contrib/`) stays true to it:
//! the Prometheus alerting rules pass `promtool check rules` and their own
//! unit tests (`promtool test rules`), and every metric the rules and the
//! Grafana dashboard query is one a real gateway exports on `/metrics`.
//!
//! promtool comes from Debian's `prometheus` package, which `.ci/run`
//! installs; without it the promtool test says why on stderr and skips —
//! except under CI (`CI` set), where it fails.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use common::*;
use http::StatusCode;

const CONTRIB: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/contrib");

/// Every `idemgate_…` name in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("idemgate_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        names.insert(name);
    }
    names
}

/// The series names an exposition offers for queries: every name in it,
/// and for each `# TYPE` the names Prometheus gives its samples (a counter
/// without samples yet still offers `_total`).
fn exported_series(exposition: &str) -> BTreeSet<String> {
    let mut names = metric_names(exposition);
    for line in exposition.lines() {
        let mut words = line.strip_prefix("# TYPE ").unwrap_or("").split(' ');
        let suffixes: &[&str] = match (words.next(), words.next()) {
            (Some(_), Some("counter")) => &["_total"],
            (Some(_), Some("histogram")) => &["_bucket", "_count", "_sum"],
            _ => &[],
        };
        let family = line
            .trim_start_matches("# TYPE ")
            .split(' ')
            .next()
            .unwrap_or("");
        names.extend(suffixes.iter().map(|suffix| format!("{family}{suffix}")));
    }
    names
}

#[test]
fn the_alerting_rules_pass_promtool() {
    let promtool = Command::new("promtool").arg("--version").output();
    if promtool.is_err() {
        assert!(
            !under_ci(),
            "promtool is required under CI (Debian package prometheus)"
        );
        eprintln!("skipped: promtool not found (Debian package prometheus)");
        return;
    }
    for args in [
        ["check", "rules", "prometheus-rules.yml"],
        ["test", "rules", "prometheus-rules.test.yml"],
    ] {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(CONTRIB)
            .output()
            .expect("promtool runs");
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_and_dashboard_query_only_exported_metrics() {
    // A gateway that has written, held an operation and paused a route,
    // so every family has samples (histogram buckets included).
    let gw = spawn_gateway_with(Setup::route("").admin()).await;
    assert_fresh_created(&write(gw.addr(), "/orders", Some("m-1"), "{}").await);
    write(gw.addr(), "/status/502", Some("m-2"), "{}").await;
    let paused = gw
        .admin("POST", "/admin/routes/api/pause", r#"{"reason":"test"}"#)
        .await;
    assert_eq!(paused.status, StatusCode::OK, "{:?}", paused.body);
    let scraped = admin_call(gw.admin_addr(), "GET", "/metrics", None, "").await;
    assert_eq!(scraped.status, StatusCode::OK);
    let exported = exported_series(&String::from_utf8_lossy(&scraped.body));
    assert!(exported.contains("idemgate_route_paused"), "{exported:?}");
    assert!(
        exported.contains("idemgate_store_commit_duration_seconds_bucket"),
        "{exported:?}"
    );

    let dashboard = std::fs::read_to_string(Path::new(CONTRIB).join("grafana-dashboard.json"))
        .expect("dashboard");
    let parsed: serde_json::Value = serde_json::from_str(&dashboard).expect("valid JSON");
    let exprs: Vec<&str> = parsed["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|panel| panel["targets"].as_array().expect("targets"))
        .map(|target| target["expr"].as_str().expect("expr"))
        .collect();
    assert!(exprs.len() >= 8, "{exprs:?}");
    let rules =
        std::fs::read_to_string(Path::new(CONTRIB).join("prometheus-rules.yml")).expect("rules");
    for (file, text) in [
        ("grafana-dashboard.json", exprs.join("\n")),
        ("prometheus-rules.yml", rules),
    ] {
        let queried = metric_names(&text);
        assert!(!queried.is_empty(), "{file} queries no idemgate metric");
        let missing: Vec<_> = queried.difference(&exported).collect();
        assert!(
            missing.is_empty(),
            "{file} queries {missing:?}, not exported"
        );
    }
}
