//! `idemgate bench`, the real binary: a small run against its own gateway
//! prints the documented JSON and the exactly-once verdict (exit 0), in
//! reject and wait mode and with faults; `--target` drives a running
//! gateway and reads the mock's counter through `--upstream-effects`, and
//! several `--target`s (replicas on one PostgreSQL store) round robin;
//! `--populate` reports the store's size and resident memory; a target that
//! writes every retry (the mock itself) fails the verdict with exit 1.
//!
//! Tiny runs, no timing asserted. No in-process gateway runs in this test
//! binary: every gateway is a child process.

use crate::common::*;
use serde_json::Value;

/// The small run every test starts from: 20 keys × 3 requests, 8 at a time.
const SMALL: [&str; 6] = ["--keys", "20", "--retries", "3", "--concurrency", "8"];

/// Runs `idemgate bench ARGS --json` and returns its exit code and report.
async fn bench(args: &[&str]) -> (i32, Value) {
    let mut cmd = binary();
    cmd.arg("bench").args(args).arg("--json");
    let (status, stdout, stderr) = run_to_exit(cmd).await;
    let report = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!("stdout is not one JSON object ({e}):\n{stdout}\nstderr:\n{stderr}")
    });
    (status.code().expect("exited"), report)
}

fn count(report: &Value, outcome: &str) -> u64 {
    report["outcomes"][outcome].as_u64().unwrap_or(0)
}

/// The documented fields, and outcomes that add up to the requests.
fn assert_shape(report: &Value) {
    for field in ["requests", "keys"] {
        assert!(report[field].is_u64(), "{field} in {report}");
    }
    for field in ["seconds", "throughput_rps"] {
        assert!(report[field].is_number(), "{field} in {report}");
    }
    for p in ["p50", "p90", "p99", "p999"] {
        assert!(
            report["latency_ms"][p].is_number(),
            "latency_ms.{p} in {report}"
        );
    }
    let outcomes = report["outcomes"].as_object().expect("outcomes object");
    let total: u64 = outcomes.values().map(|v| v.as_u64().expect("count")).sum();
    assert_eq!(Some(total), report["requests"].as_u64(), "{report}");
    assert!(report.get("upstream_writes").is_some(), "{report}");
    assert!(report.get("exactly_once").is_some(), "{report}");
}

/// Exit 0, the documented shape, and one upstream write per key.
fn assert_exactly_once(code: i32, report: &Value, keys: u64) {
    assert_eq!(code, 0, "{report}");
    assert_shape(report);
    assert_eq!(report["keys"], keys, "{report}");
    assert_eq!(report["upstream_writes"], keys, "{report}");
    assert_eq!(report["exactly_once"], true, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_run_reports_one_write_per_key() {
    let (code, report) = bench(&SMALL).await;
    assert_exactly_once(code, &report, 20);
    assert_eq!(report["requests"], 60);
    assert_eq!(report["upstream_keys"], 20);
    assert_eq!(count(&report, "fresh 201"), 20, "{report}");
    // Each retry is a replay or met its first write in flight.
    let retries = count(&report, "replayed 201") + count(&report, "409 request-in-progress");
    assert_eq!(retries, 40, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_wait_mode_every_retry_gets_the_201() {
    let (code, report) = bench(&[&SMALL[..], &["--wait", "--durability", "normal"]].concat()).await;
    assert_exactly_once(code, &report, 20);
    assert_eq!(count(&report, "fresh 201"), 20, "{report}");
    assert_eq!(count(&report, "replayed 201"), 40, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_faults_and_changed_payloads_each_key_is_still_written_once() {
    let (code, report) = bench(&[
        "--keys",
        "20",
        "--retries",
        "4",
        "--concurrency",
        "8",
        "--faults",
        "--changed",
        "0.5",
        "--compare",
        "mock",
    ])
    .await;
    assert_exactly_once(code, &report, 20);
    assert_eq!(report["upstream_keys"], 20);
    // Keys 0, 10 (dropped) and 1, 11 (truncated) went unknown: the one
    // request forwarded for each got 502, their retries 409 (or 422 for a
    // changed payload).
    assert_eq!(count(&report, "502 outcome-unknown"), 4, "{report}");
    assert!(count(&report, "422 key-reused") >= 1, "{report}");
    // The same load straight at the mock, for the ratio.
    let compare = &report["compare"];
    assert_eq!(compare["requests"], 80, "{report}");
    assert!(compare["throughput_ratio"].is_number(), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_gateway_is_checked_through_the_mocks_counter() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mock = BinaryMock::start(&dir.path().join("mock.log")).await;
    let store = format!("sqlite://{}", dir.path().join("idemgate.db").display());
    let mut serve = binary();
    serve
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(["--admin-listen", "127.0.0.1:0"])
        .args(["--upstream", &format!("http://{}", mock.addr)])
        .args(["--store", &store]);
    let gateway = BinaryGateway::spawn(serve, &dir.path().join("serve.log")).await;
    let target = format!("http://{}/orders", gateway.proxy);
    let effects = format!("http://{}/_effects", mock.addr);

    let (code, report) = bench(
        &[
            &SMALL[..],
            &["--target", &target, "--upstream-effects", &effects],
        ]
        .concat(),
    )
    .await;
    assert_exactly_once(code, &report, 20);
    assert_eq!(report["targets"][0], target.as_str());

    // Without a counter the verdict is not checked: null, exit 0.
    let (code, report) = bench(&[&SMALL[..], &["--target", &target]].concat()).await;
    assert_eq!(code, 0, "{report}");
    assert!(report["exactly_once"].is_null(), "{report}");
    assert!(report["upstream_writes"].is_null(), "{report}");

    // A target that never answers measured nothing: exit 1.
    let port = closed_port().await;
    let closed = format!("http://{port}/orders");
    let (code, report) = bench(&[&SMALL[..], &["--target", &closed]].concat()).await;
    assert_eq!(code, 1, "{report}");
    assert_eq!(count(&report, "transport error"), 60, "{report}");

    // So did a compared run that got no answer: no ratios, exit 1.
    let (code, report) =
        bench(&[&SMALL[..], &["--target", &target, "--compare", &closed]].concat()).await;
    assert_eq!(code, 1, "{report}");
    assert_eq!(count(&report["compare"], "transport error"), 60, "{report}");
    assert!(report["compare"]["throughput_ratio"].is_null(), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn two_replicas_are_loaded_round_robin_and_checked_once() {
    let schema = PgSchema::create().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mock = BinaryMock::start(&dir.path().join("mock.log")).await;
    let mut replicas = Vec::new();
    for name in ["a", "b"] {
        let mut serve = binary();
        serve
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(["--admin-listen", "127.0.0.1:0"])
            .args(["--upstream", &format!("http://{}", mock.addr)])
            .args(["--store", &schema.url])
            .env("IDEMGATE_SCOPE_KEY", &schema.scope_key);
        let log = dir.path().join(format!("{name}.log"));
        replicas.push(BinaryGateway::spawn(serve, &log).await);
    }
    let targets: Vec<String> = replicas
        .iter()
        .map(|r| format!("http://{}/orders", r.proxy))
        .collect();
    let effects = format!("http://{}/_effects", mock.addr);
    let args = [
        "--target",
        &targets[0],
        "--target",
        &targets[1],
        "--upstream-effects",
        &effects,
    ];
    let (code, report) = bench(&[&SMALL[..], &args].concat()).await;
    assert_eq!(code, 0, "{report}");
    assert_shape(&report);
    assert_eq!(report["exactly_once"], true, "{report}");
    assert_eq!(report["upstream_writes"], 20, "{report}");
    assert_eq!(report["targets"], serde_json::json!(targets), "{report}");
    for replica in &replicas {
        let metrics = scrape_metrics(replica.admin).await;
        let requests: f64 = metrics
            .lines()
            .filter(|l| l.starts_with("idemgate_requests_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        assert!(requests >= 20.0, "each replica took its share:\n{metrics}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn populate_reports_store_size_and_resident_memory() {
    let (code, report) = bench(&["--populate", "50", "--concurrency", "8"]).await;
    assert_exactly_once(code, &report, 50);
    assert_eq!(count(&report, "fresh 201"), 50, "{report}");
    let populate = &report["populate"];
    assert_eq!(populate["operations"], 50, "{report}");
    assert!(populate["rate_per_second"].is_number(), "{report}");
    assert!(
        populate["store_bytes"].as_u64().is_some_and(|b| b > 0),
        "{report}"
    );
    assert!(
        populate["resident_bytes"].as_u64().is_some_and(|b| b > 0),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_writes_every_retry_fails_the_verdict() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mock = BinaryMock::start(&dir.path().join("mock.log")).await;
    let target = format!("http://{}/orders", mock.addr);
    let effects = format!("http://{}/_effects", mock.addr);
    let extra = ["--target", &target, "--upstream-effects", &effects];
    let (code, report) = bench(&[&SMALL[..], &extra[..]].concat()).await;
    assert_eq!(code, 1, "{report}");
    assert_shape(&report);
    assert_eq!(report["exactly_once"], false);
    assert_eq!(report["upstream_writes"], 60);
    assert_eq!(report["upstream_keys"], 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contradictory_flags_are_refused_before_any_load() {
    let mut cmd = binary();
    cmd.args(["bench", "--target", "http://127.0.0.1:9/orders", "--wait"]);
    let (status, _, stderr) = run_to_exit(cmd).await;
    assert!(!status.success());
    assert!(stderr.contains("--wait"), "{stderr}");
    let mut cmd = binary();
    cmd.args(["bench", "--changed", "1.5"]);
    let (status, _, stderr) = run_to_exit(cmd).await;
    assert!(!status.success());
    assert!(stderr.contains("--changed"), "{stderr}");
}
