//! `idemgate rehearse` against destinations that really listen, counting
//! what reached each: the mock API (deduplicates nothing, through the
//! real binaries), a destination that honours `Idempotency-Key`, one that
//! echoes what it was sent, ones whose answers alternate or all claim to
//! be replays, one with a reconcile probe, one that refuses every write,
//! ones that never answer, one over TLS, and a `--writes` bound too small for every case; and one
//! that refuses every connection, which nothing reaches.

use std::path::{Path, PathBuf};

use crate::common::*;
use idemgate_tools::cli::Rehearse;
use idemgate_tools::rehearse::report::Report;

const BODY: &str = r#"{"title":"rehearsal {key}"}"#;
const TOKEN_VAR: &str = "REHEARSE_TEST_TOKEN";
const TOKEN: &str = "Bearer rehearse-secret-7f3a";

/// A config file with one route `tasks` to `upstream`, `extra` lines in it.
fn config(dir: &Path, upstream: &str, extra: &str) -> PathBuf {
    write_config(
        dir,
        "rehearse.toml",
        &format!(
            "[[routes]]\nname = \"tasks\"\npath_prefix = \"/\"\nupstream = \"{upstream}\"\n{extra}\n"
        ),
    )
}

fn args(config: PathBuf, path: &str, writes: u64, check: bool) -> Rehearse {
    Rehearse {
        config,
        route: "tasks".into(),
        body: Some(BODY.into()),
        body_file: None,
        tool: None,
        arguments: "{}".into(),
        writes,
        path: Some(path.into()),
        method: None,
        header_env: vec![format!("authorization={TOKEN_VAR}")],
        check_destination: check,
        json: false,
    }
}

/// Runs it in process; the report and what it printed.
async fn rehearse(args: &Rehearse) -> (Report, String) {
    let env = |name: &str| (name == TOKEN_VAR).then(|| TOKEN.to_string());
    let mut out = Vec::new();
    let report = idemgate_tools::rehearse::run(args, &env, &mut out)
        .await
        .expect("the rehearsal runs");
    let text = String::from_utf8(out).expect("utf-8");
    assert!(
        !text.contains("rehearse-secret"),
        "credential printed:\n{text}"
    );
    (report, text)
}

/// A rehearsal of writes to `path` against a [`FakeUpstream`] of its
/// own, whose route has a reconcile probe if `probe`.
async fn rehearse_fake(
    path: &str,
    writes: u64,
    check: bool,
    probe: bool,
) -> (FakeUpstream, Report, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let upstream = FakeUpstream::start().await;
    let extra = match probe {
        true => format!(
            "[routes.reconcile]\nurl = \"{}/lookup?key={{key}}\"\nfound_json_pointer = \"/id\"\ntimeout = \"2s\"",
            upstream.url()
        ),
        false => String::new(),
    };
    let file = config(dir.path(), &upstream.url(), &extra);
    let (report, text) = rehearse(&args(file, path, writes, check)).await;
    (upstream, report, text)
}

/// What `--check-destination` read, and how the verdict line starts.
fn assert_verdict(report: &Report, deduplicates: Option<bool>, starts: &str) {
    let check = report.destination_check.as_ref().expect("checked");
    assert_eq!(check.deduplicates, deduplicates, "{}", report.verdict);
    assert!(report.verdict.starts_with(starts), "{}", report.verdict);
}

fn states(report: &Report, case: usize) -> Vec<&str> {
    report.cases[case]
        .operations
        .iter()
        .map(|held| held.state.as_str())
        .collect()
}

/// Each case sent what it needs, and every write carried the credential.
fn assert_sent_as_planned(report: &Report, upstream: &FakeUpstream, total: usize) {
    let sent: Vec<u64> = report.cases.iter().map(|case| case.sent).collect();
    assert_eq!(sent, [1, 1, 1, 2, 1][..report.cases.len()]);
    let writes = upstream.write_requests();
    assert_eq!(writes.len(), total, "writes that reached the destination");
    assert_eq!(report.writes_sent as usize, total);
    for write in &writes {
        assert_eq!(write.header("authorization"), Some(TOKEN));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mock_api_gets_every_case_and_the_verdict_that_it_does_not_deduplicate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mock = BinaryMock::start(&dir.path().join("mock.err")).await;
    let file = config(dir.path(), &format!("http://{}", mock.addr), "");
    let mut cmd = binary();
    cmd.args(["rehearse", "--config"])
        .arg(&file)
        .args(["--route", "tasks", "--path", "/tasks", "--body", BODY])
        .args(["--writes", "10", "--check-destination"])
        .args(["--header-env", &format!("authorization={TOKEN_VAR}")])
        .env(TOKEN_VAR, TOKEN);
    let (status, stdout, stderr) = run_to_exit(cmd).await;
    assert!(status.success(), "{stdout}\n{stderr}");
    assert!(stdout.starts_with("--writes 10: "), "{stdout}");
    assert!(!stdout.contains("rehearse-secret") && !stderr.contains("rehearse-secret"));
    for title in [
        "1. Interrupted before the destination accepts",
        "2. Accepted, response lost",
        "3. The same event again while the first is in flight",
        "4. A later step fails after the create succeeded",
        "5. Resumed after an operator recorded manual completion",
    ] {
        assert!(stdout.contains(title), "{title}:\n{stdout}");
    }
    assert_eq!(stdout.matches("ok: as expected").count(), 5, "{stdout}");
    assert!(
        stdout.contains("Verdict: the destination does not deduplicate on its own"),
        "{stdout}"
    );
    assert!(
        stdout.contains("10 writes reached the destination"),
        "{stdout}"
    );
    let effects = send(mock.addr, "GET", "/_effects", &[], bytes::Bytes::new()).await;
    assert_eq!(
        effects.json()["writes"],
        10,
        "6 by the cases, 4 by the check"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_that_honours_keys_gets_the_other_verdict() {
    let (upstream, report, text) = rehearse_fake("/dedup", 10, true, false).await;
    assert!(report.ok, "{text}");
    let deduplicates = "by its answers, the destination deduplicates on `idempotency-key` itself";
    assert_verdict(&report, Some(true), deduplicates);
    assert_sent_as_planned(&report, &upstream, 10);
    assert_eq!(upstream.writes(), 8, "the repeat created nothing");
    // Without a probe the lost responses stay held for an operator.
    assert_eq!(states(&report, 1), ["unknown"]);
    assert!(
        report.cases[1].operations[0]
            .next_action
            .contains("resolve it")
    );
    assert_eq!(states(&report, 3), ["completed", "unknown"]);
    assert_eq!(
        states(&report, 4),
        ["completed"],
        "resolved by the operator"
    );
    assert!(report.cases[4].notes[0].contains("/resolve"), "{text}");
}

/// A route with a destination key is checked on that key's header: a
/// destination deduplicating on it may have lost responses re-sent, and
/// the rehearsal itself re-sends nothing (`resend_unknown` on, the held
/// cases held, no write past the plan). On another header, the same
/// destination creates a second record, and the verdict says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_asks_on_the_destination_keys_header() {
    let dir = tempfile::tempdir().expect("tempdir");
    let upstream = FakeUpstream::start().await;
    let resending = "destination_key_header = \"Idempotency-Key\"\ndestination_key_window = \"24h\"\nresend_unknown = true";
    let file = config(dir.path(), &upstream.url(), resending);
    let (report, text) = rehearse(&args(file, "/dedup", 10, true)).await;
    assert!(report.ok, "{text}");
    assert_verdict(
        &report,
        Some(true),
        "by its answers, the destination deduplicates on `idempotency-key` itself",
    );
    assert!(
        report.verdict.contains("resend_unknown"),
        "{}",
        report.verdict
    );
    assert_sent_as_planned(&report, &upstream, 10);
    assert_eq!(states(&report, 1), ["unknown"], "not re-sent");

    let upstream = FakeUpstream::start().await;
    let own_header = "destination_key_header = \"X-Destination-Key\"";
    let file = config(dir.path(), &upstream.url(), own_header);
    let (report, text) = rehearse(&args(file, "/dedup", 10, true)).await;
    assert!(report.ok, "{text}");
    assert_verdict(
        &report,
        Some(false),
        "the destination does not deduplicate on its own (on `x-destination-key`)",
    );
    assert!(
        report.verdict.contains("leave `resend_unknown` off"),
        "{}",
        report.verdict
    );
    let checked = &upstream.write_requests()[6..];
    assert!(
        checked
            .iter()
            .all(|w| w.header("x-destination-key").is_some()),
        "the check's writes carry the key on the destination key's header"
    );
}

/// A destination whose every answer is alike (here 201 with one fixed
/// body) creates a record per write, repeat included: the same answer to
/// the repeat proves nothing, and the control key says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_answering_every_write_alike_is_not_called_deduplicating() {
    let (upstream, report, text) = rehearse_fake("/commit-then/201", 10, true, false).await;
    assert_eq!(report.destination_check.as_ref().unwrap().sent, 4, "{text}");
    let alike = "not told: the destination answered the same write under a control key alike";
    assert_verdict(&report, None, alike);
    assert_sent_as_planned(&report, &upstream, 10);
    assert_eq!(upstream.writes(), 10, "the repeats created a record each");
}

/// Destinations that make a record of every write whose answers could pass
/// for the first write's: answers of period 2 (two nodes in turn), where
/// the first repeat matches the first write by chance; and answers each
/// said to be a replay, the first and the control too. Each is told as
/// what it is: it does not deduplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_that_pass_for_a_replay_once_are_not_called_deduplicating() {
    for path in ["/alternate", "/says-replayed"] {
        let (upstream, report, text) = rehearse_fake(path, 10, true, false).await;
        let differ = "the destination does not deduplicate on its own";
        assert_verdict(&report, Some(false), differ);
        assert_sent_as_planned(&report, &upstream, 10);
        assert_eq!(
            upstream.writes(),
            10,
            "{path}: every write a record: {text}"
        );
    }
}

/// A destination that makes a record of every write and answers with the
/// body it was sent, under the docs' body that carries the key: the
/// control carries the very body of the key it is sent between, so all
/// three answers are alike and the repeat's proves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_echoing_the_body_is_not_called_deduplicating() {
    let (upstream, report, text) = rehearse_fake("/echo", 10, true, false).await;
    assert!(report.ok, "{text}");
    let alike = "not told: the destination answered the same write under a control key alike";
    assert_verdict(&report, None, alike);
    assert_eq!(upstream.writes(), 10, "the repeats created a record each");
    let checked = &upstream.write_requests()[6..];
    let keys: Vec<_> = checked
        .iter()
        .map(|w| w.header("idempotency-key"))
        .collect();
    assert!(
        keys[0] == keys[2] && keys[0] == keys[3] && keys[0] != keys[1],
        "{keys:?}"
    );
    assert!(
        checked.iter().all(|w| w.body == checked[0].body),
        "the control differs from the repeat in its key alone"
    );
}

/// A destination that refuses every connection: nothing reaches it, so
/// nothing counts against `--writes` and every case runs; none is judged
/// as expected, each says its writes could not reach the destination,
/// and no note tells of what did not happen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_refusing_connections_is_reached_by_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = closed_port().await;
    let file = config(dir.path(), &format!("http://{port}"), "connect_retries = 0");
    let (report, text) = rehearse(&args(file, "/tasks", 10, true)).await;
    assert!(!report.ok, "{text}");
    assert_eq!(report.writes_sent, 0, "{text}");
    assert!(
        text.contains("\n0 writes reached the destination (of --writes 10)."),
        "{text}"
    );
    assert!(!text.contains("STOPPED"), "{text}");
    assert_eq!(report.cases.len(), 5, "{text}");
    assert_eq!(text.matches("UNEXPECTED: see above").count(), 5, "{text}");
    for case in &report.cases {
        assert_eq!(case.sent, 0, "case {}: {text}", case.number);
        assert!(
            case.notes
                .iter()
                .any(|n| n.contains("could not reach the destination")),
            "case {}: {text}",
            case.number
        );
        for untrue in [
            "held (409",
            "answered from the store",
            "settled it",
            "should have",
        ] {
            assert!(
                !case.notes.iter().any(|n| n.contains(untrue)),
                "case {}, {untrue}: {text}",
                case.number
            );
        }
    }
    let check = report.destination_check.as_ref().expect("checked");
    assert_eq!((check.sent, check.deduplicates), (0, None), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_probe_the_lost_responses_are_settled_by_it_and_shown() {
    let (upstream, report, text) = rehearse_fake("/tasks", 6, false, true).await;
    assert!(report.ok, "{text}");
    assert!(
        report.verdict.starts_with("not checked"),
        "{}",
        report.verdict
    );
    assert_sent_as_planned(&report, &upstream, 6);
    for case in [1, 4] {
        let held = &report.cases[case].operations[0];
        assert_eq!(held.state, "completed", "{text}");
        assert_eq!(held.evidence.as_deref(), Some("reconciled"));
        assert_eq!(held.probes[0]["matched"], true);
    }
    // What the destination says it holds, for every case's keys.
    let holds: Vec<bool> = report
        .cases
        .iter()
        .flat_map(|case| &case.destination_holds)
        .map(|probe| probe["matched"] == true)
        .collect();
    assert_eq!(holds, [true; 6]);
    assert!(text.contains("   it holds    GET "), "{text}");
    let probes = upstream
        .requests()
        .iter()
        .filter(|r| r.uri.starts_with("/lookup"))
        .count();
    assert!(probes >= 6, "probes are reads and uncounted: {probes}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_refusing_every_write_is_said_so_and_never_retried_blindly() {
    let (upstream, report, text) = rehearse_fake("/status/403", 10, true, false).await;
    assert!(report.ok, "{text}");
    for case in &report.cases {
        assert_eq!(case.destination_answered, Some(403), "case {}", case.number);
    }
    assert!(text.matches("the last answered 403").count() == 5, "{text}");
    // Each case says so, also where the client never got the refusal.
    for case in &report.cases {
        assert!(
            case.notes
                .iter()
                .any(|n| n.starts_with("the destination answered 403: it refused the write; ")),
            "case {}: {text}",
            case.number
        );
    }
    assert!(
        report.cases[3]
            .notes
            .iter()
            .any(|n| n.starts_with("the destination answered 403: it refused the later step; ")),
        "{text}"
    );
    // A write the destination refused is never resolved as one that
    // happened: case 5's operator leaves it held, and its retry is held.
    let resumed = &text[text.find("\n5. ").expect("case 5")..];
    assert_eq!(states(&report, 4), ["unknown"], "{text}");
    assert!(
        resumed.contains("client's retry       → 409 outcome-unknown"),
        "{resumed}"
    );
    assert!(!resumed.contains("resolved it completed"), "{resumed}");
    assert!(resumed.contains("   ok: as expected"), "{resumed}");
    assert_sent_as_planned(&report, &upstream, 10);
    assert_eq!(upstream.writes(), 0);
    assert_verdict(&report, None, "not told: the destination refused");
}

/// A destination that releases every write (429, 503: `release_statuses`)
/// has each released and its retry forwarded, as the gateway should: every
/// case passes within the writes it needs, case 4 says its create was not
/// retried, and none says a refusal is kept. One that answers every write
/// 502 or 504 (`unknown_statuses`) has each held `unknown`, and the notes
/// say so, not that its answer is kept and replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_and_unknown_statuses_are_told_as_the_gateway_treats_them() {
    for (status, stored, said) in [
        (429, "not_attempted", "the client's next retry is forwarded"),
        (503, "not_attempted", "the client's next retry is forwarded"),
        (502, "unknown", "holds the write `unknown`"),
        (504, "unknown", "holds the write `unknown`"),
    ] {
        let path = format!("/status/{status}");
        let (upstream, report, text) = rehearse_fake(&path, 10, true, false).await;
        assert!(report.ok, "{status}: {text}");
        assert!(!text.contains("STOPPED"), "{status}: {text}");
        assert_sent_as_planned(&report, &upstream, 10);
        for case in [0, 2, 3] {
            let notes = &report.cases[case].notes;
            let answered = format!("the destination answered {status}: ");
            assert!(
                notes
                    .iter()
                    .any(|n| n.starts_with(&answered) && n.contains(said)),
                "{status}, case {}: {text}",
                case + 1
            );
            assert!(
                !notes.iter().any(|n| n.contains("gives it to every retry")),
                "{status}, case {}: {text}",
                case + 1
            );
        }
        assert_eq!(states(&report, 3)[0], stored, "{status}: {text}");
    }
}

/// A destination that gives no write an answer — it resets the
/// connection after the write (`/drop`), or never answers (`/hold`, past
/// `upstream_timeout`) — leaves nothing to withhold or hold: no case is
/// as expected, each says its writes got no answer, and case 5's operator
/// does not resolve `completed` a write nobody saw answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_that_never_answers_is_said_so_and_never_resolved() {
    for path in ["/drop", "/hold"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let upstream = FakeUpstream::start().await;
        let file = config(dir.path(), &upstream.url(), "upstream_timeout = \"1s\"");
        let (report, text) = rehearse(&args(file, path, 6, false)).await;
        assert!(!report.ok, "{path}: {text}");
        assert_eq!(report.cases.len(), 5, "{path}: {text}");
        assert_eq!(
            text.matches("UNEXPECTED: see above").count(),
            5,
            "{path}: {text}"
        );
        for case in &report.cases {
            assert_eq!(case.destination_answered, None, "{path}: {text}");
            assert!(
                case.notes
                    .iter()
                    .any(|n| n.contains("got no complete answer")),
                "{path}, case {}: {text}",
                case.number
            );
        }
        assert_eq!(states(&report, 4), ["unknown"], "{path}: {text}");
        assert!(!text.contains("resolved it completed"), "{path}: {text}");
        assert!(!text.contains("the destination answered"), "{path}: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_a_tls_upstream_the_cases_hold() {
    let pki = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new(pki.path(), "rehearse-ca");
    let upstream = FakeUpstream::start_tls(server_config(&ca.server_cert(pki.path(), "api"))).await;
    let extra = format!("upstream_ca = \"{}\"", ca.pem.display());
    let file = config(pki.path(), &upstream.url(), &extra);
    let (report, text) = rehearse(&args(file, "/tasks", 10, true)).await;
    assert!(report.ok, "{text}");
    assert!(report.destination.starts_with("https://"));
    assert_sent_as_planned(&report, &upstream, 10);
    assert_eq!(report.destination_check.unwrap().deduplicates, Some(false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_few_writes_stop_before_the_case_that_needs_more() {
    let dir = tempfile::tempdir().expect("tempdir");
    let upstream = FakeUpstream::start().await;
    let file = config(dir.path(), &upstream.url(), "");
    let (report, text) = rehearse(&args(file.clone(), "/tasks", 4, false)).await;
    assert!(text.starts_with("--writes 4: at most 4 writes"), "{text}");
    assert!(!report.ok);
    assert!(text.ends_with("rehearse stopped: not every case ran (see STOPPED above).\n"));
    assert_eq!(report.cases.len(), 3, "{text}");
    assert!(
        text.contains("STOPPED: case 4 needs 2 write(s) and 1 are left (--writes 4)"),
        "{text}"
    );
    assert_sent_as_planned(&report, &upstream, 3);

    // The check's four writes are kept out of the cases' share of the bound.
    let (report, text) = rehearse(&args(file.clone(), "/tasks", 9, true)).await;
    assert_eq!(report.cases.len(), 4, "{text}");
    assert!(report.destination_check.is_some());
    assert_eq!(upstream.write_requests().len(), 3 + 5 + 4);

    // No credential for the route's scope header: refused before anything is sent.
    let mut bare = args(file, "/tasks", 8, false);
    bare.header_env.clear();
    let env = |_: &str| None;
    let refused = idemgate_tools::rehearse::run(&bare, &env, Vec::new()).await;
    let error = refused.expect_err("refused").to_string();
    assert!(error.contains("--header-env authorization="), "{error}");
    assert_eq!(upstream.write_requests().len(), 3 + 5 + 4, "none more");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_for_an_mcp_route_and_bodies_for_the_others() {
    let dir = tempfile::tempdir().expect("tempdir");
    let upstream = FakeUpstream::start().await;
    let env = |name: &str| (name == TOKEN_VAR).then(|| TOKEN.to_string());
    // A body for an mcp route: refused, nothing sent.
    let mcp = config(dir.path(), &upstream.url(), "profile = \"mcp\"");
    let refused =
        idemgate_tools::rehearse::run(&args(mcp.clone(), "/", 9, false), &env, Vec::new()).await;
    let error = refused.expect_err("refused").to_string();
    assert!(error.contains("give --tool NAME"), "{error}");
    // Arguments that are no object: refused too.
    let mut calls = args(mcp, "/", 9, false);
    (calls.body, calls.tool, calls.arguments) = (None, Some("create_task".into()), "[1]".into());
    let refused = idemgate_tools::rehearse::run(&calls, &env, Vec::new()).await;
    assert!(
        refused
            .expect_err("refused")
            .to_string()
            .contains("--arguments is a JSON object")
    );
    // A tool for an HTTP route: refused.
    let http = config(dir.path(), &upstream.url(), "");
    let mut tool = args(http, "/tasks", 9, false);
    (tool.body, tool.tool) = (None, Some("create_task".into()));
    let refused = idemgate_tools::rehearse::run(&tool, &env, Vec::new()).await;
    assert!(
        refused
            .expect_err("refused")
            .to_string()
            .contains("give --body JSON")
    );
    assert!(upstream.write_requests().is_empty());
}
