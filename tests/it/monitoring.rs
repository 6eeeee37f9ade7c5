//! The monitoring that ships with idemgate (`contrib/`) stays true to it:
//! the Prometheus alerting rules pass `promtool check rules` and their own
//! unit tests (`promtool test rules`), and every metric the rules and the
//! Grafana dashboard query is one a real gateway exports on `/metrics`.
//!
//! promtool comes from Debian's `prometheus` package, which `.ci/run`
//! installs; the promtool test is `#[ignore]`d, like the PostgreSQL ones,
//! and `.ci/run` runs them (`--include-ignored`).
//!
//! `/metrics` never fails as a whole (docs/operating.md, "Watching: stats
//! and metrics"): while the store refuses or stalls — SQLite's write lock
//! held by another connection, a PostgreSQL schema gone or a table locked —
//! a scrape still answers 200 within a bound with every process counter and
//! `idemgate_store_up 0`, and without the gauges read from the store; once
//! the store is back, `idemgate_store_up 1` and the gauges return.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common::*;
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
#[ignore = "needs promtool (.ci/run runs it)"]
fn the_alerting_rules_pass_promtool() {
    let promtool = child_output(Command::new("promtool").arg("--version"));
    assert!(
        promtool.is_ok(),
        "promtool is missing (Debian package prometheus; .ci/run installs it)"
    );
    for args in [
        ["check", "rules", "prometheus-rules.yml"],
        ["test", "rules", "prometheus-rules.test.yml"],
    ] {
        let out = child_output(Command::new("promtool").args(args).current_dir(CONTRIB))
            .expect("promtool runs");
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A lost attempt counts as `unknown` once; its retries, answered 409
/// from the store with nothing sent, count as `conflict` — not as more
/// upstream failures, which `IdemgateUpstreamErrors` would take for an
/// upstream failing every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_retries_are_no_upstream_failures() {
    let gw = spawn_gateway_with(Setup::route("").admin()).await;
    write(gw.addr(), "/drop", Some("held-1"), "{}")
        .await
        .assert_operation_problem(502, "outcome-unknown", "unknown");
    for _ in 0..3 {
        assert_held_unknown(&write(gw.addr(), "/drop", Some("held-1"), "{}").await);
    }
    let metrics = scrape_metrics(gw.admin_addr()).await;
    let count = |outcome: &str| {
        metric(
            &metrics,
            &format!(r#"idemgate_requests_total{{route="api",outcome="{outcome}"}}"#),
        )
    };
    assert_eq!(count("unknown"), Some(1.0), "{metrics}");
    assert_eq!(count("conflict"), Some(3.0), "{metrics}");
    assert_eq!(gw.upstream.writes(), 1);
}

/// An upstream answering 500 to every write was seen by no metric: each
/// write is `forwarded` (its answer its outcome, replayed), and
/// `IdemgateUpstreamErrors` counts only released and held writes. The
/// upstream's answers are counted by status class; a replay, and a write
/// whose answer was lost, are none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstreams_answers_are_counted_by_status_class() {
    let gw = spawn_gateway_with(Setup::route("").admin()).await;
    for key in ["e-1", "e-2"] {
        let failed = write(gw.addr(), "/status/500", Some(key), "{}").await;
        assert_eq!(failed.status, 500);
    }
    assert!(
        write(gw.addr(), "/status/500", Some("e-1"), "{}")
            .await
            .is_replay()
    );
    assert_fresh_created(&write(gw.addr(), "/orders", Some("ok-1"), "{}").await);
    write(gw.addr(), "/drop", Some("lost-1"), "{}")
        .await
        .assert_operation_problem(502, "outcome-unknown", "unknown");
    let metrics = scrape_metrics(gw.admin_addr()).await;
    let count = |class: &str| {
        metric(
            &metrics,
            &format!(r#"idemgate_upstream_answers_total{{route="api",class="{class}"}}"#),
        )
    };
    assert_eq!(count("5xx"), Some(2.0), "{metrics}");
    assert_eq!(count("2xx"), Some(1.0), "{metrics}");
    assert_eq!(count("4xx"), Some(0.0), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_and_dashboard_query_only_exported_metrics() {
    // A gateway that has written, held an operation and paused a route,
    // so every family has samples (histogram buckets included) and the
    // pause gauge reads 1 somewhere.
    let gw = spawn_gateway_with(Setup::route("").admin()).await;
    assert_fresh_created(&write(gw.addr(), "/orders", Some("m-1"), "{}").await);
    write(gw.addr(), "/status/502", Some("m-2"), "{}").await;
    let paused = gw
        .admin("POST", "/admin/routes/api/pause", r#"{"reason":"test"}"#)
        .await;
    assert_eq!(paused.status, StatusCode::OK, "{:?}", paused.body);
    let scraped = admin_call(gw.admin_addr(), "GET", "/metrics", None, "").await;
    assert_eq!(scraped.status, StatusCode::OK);
    // The body is OpenMetrics (`# EOF`, a counter's family typed without
    // its `_total`), and says so: read as the Prometheus text format its
    // counters would be untyped.
    assert_eq!(
        scraped.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    assert!(String::from_utf8_lossy(&scraped.body).ends_with("# EOF\n"));
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

/// How long a scrape may take while the store stalls: the gateway's own
/// bound on its store read plus room for a loaded test machine, and well
/// under the store's 5 s busy timeout, which an answer that waited for the
/// store would take.
const SCRAPE_BOUND: Duration =
    idemgate::metrics::STORE_READ_BOUND.saturating_add(Duration::from_secs(2));

/// The gauges a scrape reads from the store.
const STORE_GAUGES: [&str; 3] = [
    "idemgate_operations",
    "idemgate_oldest_unknown_age_seconds",
    "idemgate_route_paused",
];

/// `GET /metrics`, which must answer 200 within [`SCRAPE_BOUND`].
async fn scrape_within_bound(admin: std::net::SocketAddr) -> String {
    let started = std::time::Instant::now();
    let scraped = try_send(
        admin,
        "GET",
        "/metrics",
        &[],
        bytes::Bytes::new(),
        SCRAPE_BOUND,
    )
    .await
    .unwrap_or_else(|e| panic!("GET /metrics within {SCRAPE_BOUND:?}: {e:?}"));
    assert_eq!(
        scraped.status,
        StatusCode::OK,
        "GET /metrics after {:?}: {:?}",
        started.elapsed(),
        scraped.body
    );
    String::from_utf8(scraped.body.to_vec()).expect("metrics are utf-8")
}

/// Scrapes until `ready` holds for one (each scrape within its bound),
/// for at most [`WAIT`]; that scrape's text.
async fn scrape_until(admin: std::net::SocketAddr, ready: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let text = scrape_within_bound(admin).await;
        if ready(&text) {
            return text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no scrape as expected within {WAIT:?}: {text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `series` (exactly as exposed) has `value` in a scrape's `text`.
fn assert_series(text: &str, series: &str, value: f64) {
    assert_eq!(metric(text, series), Some(value), "{series} in: {text}");
}

/// A scrape taken during an outage: the process counters, store down, and
/// nothing read from the store.
fn assert_scraped_without_store(text: &str) {
    assert_series(text, "idemgate_store_up", 0.0);
    let forwarded = r#"idemgate_requests_total{route="api",outcome="forwarded"}"#;
    assert_series(text, forwarded, 1.0);
    assert!(
        metric(text, r#"idemgate_store_errors_total{route="api"}"#).is_some(),
        "{text}"
    );
    assert!(text.contains("idemgate_store_batch_calls_count"), "{text}");
    let exported = exported_series(text);
    for gauge in STORE_GAUGES {
        assert!(
            !exported.contains(gauge),
            "{gauge} while the store is down: {text}"
        );
    }
}

/// A scrape with the store answering: store up, its gauges back.
fn assert_scraped_with_store(text: &str) {
    assert_series(text, "idemgate_store_up", 1.0);
    let completed = r#"idemgate_operations{route="api",state="completed"}"#;
    assert_series(text, completed, 1.0);
    assert!(
        metric(text, "idemgate_oldest_unknown_age_seconds").is_some(),
        "{text}"
    );
}

/// A gateway set up as `setup` says, with the admin API, that forwarded
/// one write and was scraped once with its store answering.
async fn gateway_with_one_write(setup: Setup) -> TestGateway {
    let gw = spawn_gateway_with(setup.admin()).await;
    assert_fresh_created(&write(gw.addr(), "/orders", Some("w-1"), "{}").await);
    assert_scraped_with_store(&scrape_within_bound(gw.admin_addr()).await);
    gw
}

/// A schema of its own and a gateway on it as [`gateway_with_one_write`]
/// makes one.
async fn postgres_gateway_with_one_write() -> (PgSchema, TestGateway) {
    let schema = PgSchema::create().await;
    let gw = gateway_with_one_write(Setup::route("").postgres(&schema)).await;
    (schema, gw)
}

/// A write refused during an outage is counted, and the count scraped
/// while the outage lasts: the series `IdemgateStoreErrors` alerts on.
async fn assert_store_errors_scraped(gw: &TestGateway) {
    write(gw.addr(), "/orders", Some("w-2"), "{}")
        .await
        .assert_problem(503, "store-unavailable");
    let text = scrape_within_bound(gw.admin_addr()).await;
    assert_scraped_without_store(&text);
    assert_series(&text, r#"idemgate_store_errors_total{route="api"}"#, 1.0);
}

/// After an outage: a scrape reads the store again (within [`WAIT`]), its
/// gauges back.
async fn assert_scraped_again_with_store(gw: &TestGateway) {
    let text = scrape_until(gw.admin_addr(), |text| {
        metric(text, "idemgate_store_up") == Some(1.0)
    })
    .await;
    assert_scraped_with_store(&text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_answer_in_full_while_sqlite_cannot_write() {
    let gw = gateway_with_one_write(Setup::route("")).await;
    let lock = WriteLock::take(&gw).await;
    // Writes fail (503 after the store's busy timeout) ...
    write(gw.addr(), "/orders", Some("w-2"), "{}")
        .await
        .assert_problem(503, "store-unavailable");
    // ... but the scrape reads on a connection of its own, which the
    // write lock does not stop: the store's gauges are there too.
    let text = scrape_within_bound(gw.admin_addr()).await;
    assert_scraped_with_store(&text);
    assert_series(&text, r#"idemgate_store_errors_total{route="api"}"#, 1.0);
    lock.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn metrics_answer_while_postgres_refuses() {
    let (schema, mut gw) = postgres_gateway_with_one_write().await;
    // The schema's tables go away under the gateway: every statement fails.
    let mut conn = admin_connection().await;
    let rename = |from: String, to: String| format!("ALTER SCHEMA {from} RENAME TO {to}");
    let gone = format!("{}_gone", schema.name);
    sqlx::query(&rename(schema.name.clone(), gone.clone()))
        .execute(&mut conn)
        .await
        .expect("rename the schema away");
    assert_store_errors_scraped(&gw).await;

    sqlx::query(&rename(gone, schema.name.clone()))
        .execute(&mut conn)
        .await
        .expect("rename the schema back");
    assert_scraped_again_with_store(&gw).await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn metrics_answer_while_postgres_stalls() {
    let (schema, mut gw) = postgres_gateway_with_one_write().await;
    // Another session holds the operations table: every read of it waits.
    let mut conn = admin_connection().await;
    sqlx::query("BEGIN")
        .execute(&mut conn)
        .await
        .expect("begin");
    sqlx::query(&format!(
        "LOCK TABLE {}.operations IN ACCESS EXCLUSIVE MODE",
        schema.name
    ))
    .execute(&mut conn)
    .await
    .expect("lock the operations table");
    assert_scraped_without_store(&scrape_within_bound(gw.admin_addr()).await);
    // A scrape while the first one's read still waits does not queue
    // another behind it, and answers as fast.
    assert_scraped_without_store(&scrape_within_bound(gw.admin_addr()).await);

    sqlx::query("ROLLBACK")
        .execute(&mut conn)
        .await
        .expect("release the lock");
    assert_scraped_again_with_store(&gw).await;
    gw.shutdown().await;
}
