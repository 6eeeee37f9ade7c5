//! Schemathesis, unmodified, against the admin API of a real gateway
//! (in-process on `127.0.0.1:0`, a real SQLite file) that holds real
//! operations in the states a fake upstream brings about: `completed`
//! through the proxy, `unknown` (the upstream committed the write and
//! closed the connection unanswered), `not_attempted` (a released 503).
//!
//! It loads the OpenAPI document the admin listener serves and runs every
//! phase — examples, coverage, fuzzing, and stateful, which follows the
//! document's links (list → show → resolve, list → pause → resume) on the
//! operations listed — with every check, and must report no failure. Its
//! NDJSON report shows that each phase generated cases and that the
//! stateful phase did resolve a real operation; the upstream must see no
//! write from any of it.
//!
//! The run is bounded: a fixed seed (so CI runs what a developer reruns),
//! `--max-examples` per operation and phase, a request timeout, and the
//! process killed past [`RUN`]. Schemathesis is pinned in
//! `tests/schemathesis/requirements.txt`; `.ci/run` installs it into
//! `tests/schemathesis/.venv`. The test is `#[ignore]`d; `.ci/run` runs it
//! (`--include-ignored`), and without Schemathesis it fails.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::*;
use serde_json::Value;

/// The bound on one Schemathesis run (about 20 s on an idle 2-core
/// machine; room for a loaded one).
const RUN: Duration = Duration::from_secs(480);

/// Test cases per operation in each generating phase.
const MAX_EXAMPLES: &str = "100";

/// Schemathesis' seed: fixed, so a failure in CI reproduces locally.
const SEED: &str = "20261201";

const PHASES: [&str; 4] = ["examples", "coverage", "fuzzing", "stateful"];

const ORDER: &str = r#"{"sku":"A-1","qty":2}"#;

fn venv() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/schemathesis/.venv")
}

/// A gateway with two routes (`api`, and `tasks`, the name the document's
/// examples use) whose store holds operations in every state a retry can
/// meet but `in_progress` (a live one would hold a connection open).
async fn gateway_with_operations() -> TestGateway {
    let upstream = FakeUpstream::start().await;
    let tasks = format!(
        "[[routes]]\nname = \"tasks\"\npath_prefix = \"/tasks\"\nupstream = \"{}\"\n",
        upstream.url()
    );
    let gw = spawn_gateway_on(upstream, Setup::route(&tasks).admin()).await;
    for n in 0..4 {
        let created = write(gw.addr(), "/orders", Some(&format!("done-{n}")), ORDER).await;
        assert_eq!(created.status, 201, "{created:?}");
        let task = write(gw.addr(), "/tasks", Some(&format!("task-{n}")), ORDER).await;
        assert_eq!(task.status, 201, "{task:?}");
    }
    // Enough held operations that the stateful phase still finds some
    // after the earlier phases resolved theirs (fewer than the route's
    // `pause_after_unknown`, 100, though nothing here depends on it).
    for n in 0..90 {
        let lost = write(gw.addr(), "/drop", Some(&format!("lost-{n}")), ORDER).await;
        lost.assert_operation_problem(502, "outcome-unknown", "unknown");
    }
    for n in 0..3 {
        let released = write(
            gw.addr(),
            "/status/503",
            Some(&format!("released-{n}")),
            ORDER,
        )
        .await;
        assert_eq!(released.status, 503, "{released:?}");
        assert_eq!(
            gw.operation(&format!("released-{n}")).await["state"],
            "not_attempted"
        );
    }
    gw
}

/// What the NDJSON event stream says about the run: test cases per phase,
/// and how many calls of each `METHOD path-template` got each status, per
/// phase.
#[derive(Debug, Default)]
struct Report {
    cases: BTreeMap<String, usize>,
    calls: BTreeMap<(String, String, u64), usize>,
}

impl Report {
    /// Whether `call` answered `status` in `phase`.
    fn answered(&self, phase: &str, call: &str, status: u64) -> bool {
        self.calls
            .contains_key(&(phase.to_owned(), call.to_owned(), status))
    }
}

fn read_report(path: &Path) -> Report {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no NDJSON report at {}: {e}", path.display()));
    let mut report = Report::default();
    for line in text.lines() {
        let event: Value = serde_json::from_str(line).expect("an NDJSON event");
        let Some(scenario) = event.get("ScenarioFinished") else {
            continue;
        };
        let phase = scenario["phase"].as_str().expect("phase").to_owned();
        let recorder = &scenario["recorder"];
        let Some(cases) = recorder["cases"].as_object() else {
            continue;
        };
        *report.cases.entry(phase.clone()).or_default() += cases.len();
        for (id, case) in cases {
            let status = recorder["interactions"][id]["response"]["status_code"].as_u64();
            let call =
                format!("{} {}", case["value"]["method"], case["value"]["path"]).replace('"', "");
            if let Some(status) = status {
                *report
                    .calls
                    .entry((phase.clone(), call, status))
                    .or_default() += 1;
            }
        }
    }
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Schemathesis in tests/schemathesis (.ci/run runs it)"]
async fn schemathesis_finds_nothing_in_the_admin_api() {
    let schemathesis = venv().join("bin/schemathesis");
    let install = "`python3 -m venv .venv && .venv/bin/pip install -r requirements.txt` \
                   in tests/schemathesis";
    require_installed(&schemathesis, install);
    let gw = gateway_with_operations().await;
    let writes_before = gw.upstream.writes();
    // Its working directory holds its crash cache and the report.
    let work = tempfile::tempdir().expect("tempdir");
    let report_path = work.path().join("events.ndjson");

    let mut cmd = Command::new(&schemathesis);
    cmd.current_dir(work.path())
        .arg("run")
        .arg(format!("http://{}/admin/openapi.json", gw.admin_addr()))
        .arg("--header")
        .arg(format!("Authorization: Bearer {}", gw.admin_token()))
        .args(["--phases", &PHASES.join(",")])
        .args(["--checks", "all"])
        .args(["--max-examples", MAX_EXAMPLES])
        .args(["--seed", SEED])
        // One worker: with two threads, hypothesis describing its filters
        // parses source in both at once, and CPython 3.11's AST recursion
        // count is shared between them ("AST constructor recursion depth
        // mismatch", a runtime error in the tool, not a finding).
        .args(["--workers", "1"])
        .args(["--request-timeout", "10"])
        .args(["--generation-database", "none"])
        .args(["--report", "ndjson"])
        .arg("--report-ndjson-path")
        .arg(&report_path)
        .arg("--no-color");
    let (status, stdout, stderr) = run_to_exit_within(cmd, RUN).await;
    assert!(
        status.success(),
        "schemathesis failed ({status}); stdout:\n{stdout}\nstderr:\n{stderr}"
    );

    let report = read_report(&report_path);
    let version = stdout.lines().next().unwrap_or_default();
    eprintln!("{version}: test cases per phase {:?}", report.cases);
    let stateful: Vec<_> = report
        .calls
        .iter()
        .filter(|((phase, ..), _)| phase == "stateful")
        .map(|((_, call, status), n)| format!("{call} {status}: {n}"))
        .collect();
    eprintln!("stateful calls by status: {stateful:?}");
    for phase in PHASES {
        assert!(
            report.cases.get(phase).is_some_and(|n| *n > 0),
            "phase {phase} generated no test case: {:?}\n{stdout}",
            report.cases
        );
    }
    // The stateful phase reached real operations through the links.
    for call in [
        "GET /admin/keys/{id}",
        "POST /admin/keys/{id}/resolve",
        "POST /admin/routes/{name}/pause",
    ] {
        assert!(
            report.answered("stateful", call, 200),
            "no stateful {call} answered 200: {:?}",
            report.calls
        );
    }
    assert_eq!(
        gw.upstream.writes(),
        writes_before,
        "the admin API sent a write upstream"
    );
}
