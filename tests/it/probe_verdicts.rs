//! Probe verdicts (docs/requests.md, "Probe verdicts"), against fake
//! destinations that behave each way:
//!
//! - a by-key lookup that is consistent: its 404 is *absent* once the
//!   operation is `min_age` old, which releases it (`not_attempted`,
//!   evidence `reconciled-absent`), and the retry that probed is sent,
//!   once — also when several retries race the probe; before `min_age`
//!   the same 404 holds it;
//! - a lookup whose answer settles nothing, retried without pause: probed
//!   again only a second after the latest probe, then two, doubling up to
//!   a minute, across a restart too, and the timeline keeps the first and
//!   the latest of the probes in a row;
//! - a lookup on an index that lags, with a confirm request on one that
//!   does not: the write that happened stays held (the confirm disagrees),
//!   the one that did not is released (both say absent), each answer on
//!   the timeline;
//! - a destination that holds the record twice: `duplicated-at-destination`,
//!   an alert, the route paused, and the operation first in the held list;
//!   the write's own response, arriving late, is kept on the timeline and
//!   counted, and the operation stays held until an operator settles it;
//! - a confirm request that hangs past the probe's timeout is never
//!   absent: the operation stays held;
//! - an `mcp` route's probe tool reads by the same rules: a count of 0 is
//!   absent, and the retried call is sent once; a held call of a tool the
//!   probe is not for is never probed (a task found proves no comment, nor
//!   does none found disprove one).
//!
//! `/metrics` counts each verdict by route.

use crate::common::*;
use http::StatusCode;
use idemgate_model::clock::ManualClock;
use idemgate_tools::mock_upstream::MockUpstream;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

const BODY: &str = r#"{"title":"t"}"#;

/// A gateway (admin API on) whose route `api` has `[routes.reconcile]`
/// with `reconcile`'s lines, `{up}` standing for the upstream's URL, and
/// `more` after it (other tables). Its late window is a millisecond: an
/// absence is believed only once it is over too, and these writes' lost
/// answers never come late.
async fn probing(reconcile: &str, more: &str) -> TestGateway {
    probing_with(reconcile, more, |setup| setup).await
}

/// [`probing`] on `clock`, which moves only when the test moves it: a
/// retry probes again once the test has moved it past the spacing (a
/// second after the first probe), and `min_age` counts on it too.
async fn probing_on(clock: &Arc<ManualClock>, reconcile: &str, more: &str) -> TestGateway {
    probing_with(reconcile, more, |setup| setup.clock(clock.clone())).await
}

/// [`probing`] with `setup` changed as the test needs.
async fn probing_with(
    reconcile: &str,
    more: &str,
    setup: impl FnOnce(Setup) -> Setup,
) -> TestGateway {
    let upstream = FakeUpstream::start().await;
    let route = format!(
        "late_window = \"1ms\"\n[routes.reconcile]\n{}\n{more}",
        reconcile.replace("{up}", &upstream.url())
    );
    spawn_gateway_on(upstream, setup(Setup::route(&route).admin())).await
}

/// Writes to `/scripted` under `key` while the upstream refuses with 502
/// without committing: the operation is `unknown` (until a probe says
/// otherwise), and nothing happened.
async fn lost_uncommitted(gw: &TestGateway, key: &str) {
    gw.upstream.script(Scripted::Refuse(502));
    let lost = write(gw.addr(), "/scripted", Some(key), BODY).await;
    assert_eq!(lost.status, StatusCode::BAD_GATEWAY, "passed through");
    gw.upstream.script(Scripted::Create);
}

/// Retries `key` on `/scripted` every 100 ms while it is held (409
/// `outcome-unknown`), for at most 5 s: the first other answer.
async fn retried_while_held(gw: &TestGateway, key: &str) -> Response {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let retry = write(gw.addr(), "/scripted", Some(key), BODY).await;
        if retry.status != StatusCode::CONFLICT {
            return retry;
        }
        assert_held_unknown(&retry);
        assert!(
            tokio::time::Instant::now() < deadline,
            "still held after 5 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the probe that follows a lost response is on `key`'s
/// timeline, so that a retry then runs a probe of its own.
async fn first_probe_done(gw: &TestGateway, key: &str) {
    eventually("the first probe", || async {
        (!probe_events(gw, key).await.is_empty()).then_some(())
    })
    .await;
}

/// Each probe's timeline entry, in order.
async fn probe_events(gw: &TestGateway, key: &str) -> Vec<Value> {
    events_of(&gw.operation(key).await, "probe")
}

/// What `/metrics` counts of `verdict` on route `api`.
async fn verdicts_counted(gw: &TestGateway, verdict: &str) -> f64 {
    let text = scrape_metrics(gw.admin_addr()).await;
    let series = format!("idemgate_probe_verdicts_total{{route=\"api\",verdict=\"{verdict}\"}}");
    metric(&text, &series).unwrap_or(0.0)
}

/// A probe whose URL the key cannot be put in (`..`, a path's own
/// segment) goes out to no one: it is on the timeline, but it was counted
/// as an `undetermined` verdict, once per retry, though no probe was made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_that_could_not_be_asked_is_no_verdict() {
    let gw = probing(
        "url = \"{up}/lookup/{key}\"\nfound_json_pointer = \"/id\"",
        "",
    )
    .await;
    lost_uncommitted(&gw, "..").await;
    for _ in 0..2 {
        assert_held_unknown(&write(gw.addr(), "/scripted", Some(".."), BODY).await);
    }
    let held = gw.operation("..").await;
    let probes = events_of(&held, "probe");
    assert!(!probes.is_empty(), "{held}");
    assert!(
        probes.iter().all(|p| p["error"]
            .as_str()
            .unwrap_or_default()
            .starts_with("not asked")),
        "{probes:?}"
    );
    assert!(
        gw.upstream
            .requests()
            .iter()
            .all(|r| r.method == http::Method::POST)
    );
    assert_eq!(verdicts_counted(&gw, "undetermined").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consistent_lookup_releases_an_absent_write_and_the_retry_is_sent_once() {
    let upstream = FakeUpstream::start().await;
    // `min_age` at its default, a minute, on a clock the test moves.
    let route = format!(
        "[routes.reconcile]\nurl = \"{}/lookup?key={{key}}\"\nfound_json_pointer = \"/id\"\n\
         absent_status = 404\n",
        upstream.url()
    );
    let clock = ManualClock::new();
    let setup = Setup::route(&route).clock(clock.clone()).admin();
    let gw = spawn_gateway_on(upstream, setup).await;
    lost_uncommitted(&gw, "absent-1").await;
    first_probe_done(&gw, "absent-1").await;
    // Absent, but younger than a minute: held.
    clock.advance(Duration::from_secs(59));
    assert_held_unknown(&write(gw.addr(), "/scripted", Some("absent-1"), BODY).await);

    clock.advance(Duration::from_secs(2));
    let sent = write(gw.addr(), "/scripted", Some("absent-1"), BODY).await;

    assert_fresh_created(&sent);
    assert_eq!(gw.upstream.writes(), 1, "one write committed");
    let to_scripted = gw
        .upstream
        .write_requests()
        .iter()
        .filter(|r| r.uri == "/scripted")
        .count();
    assert_eq!(to_scripted, 2, "the refused attempt and the released one");
    let stored = gw.operation("absent-1").await;
    assert_eq!(stored["state"], "completed");
    assert_eq!(stored["attempts"], 2);
    let probes = events_of(&stored, "probe");
    let verdicts: Vec<&Value> = probes.iter().map(|p| &p["verdict"]).collect();
    assert_eq!(
        verdicts,
        ["undetermined", "undetermined", "absent"],
        "{probes:?}"
    );
    assert!(
        probes[..2].iter().all(|p| p["reason"]
            .as_str()
            .is_some_and(|r| r.contains("min_age and the late window (1m)"))),
        "too young to be believed: {probes:?}"
    );
    let released = &probes[2];
    assert_eq!(released["status"], 404);
    assert_eq!(
        released["url"],
        format!("{}/lookup?key=absent-1", gw.upstream.url())
    );
    assert_eq!(verdicts_counted(&gw, "absent").await, 1.0);
    assert_eq!(verdicts_counted(&gw, "undetermined").await, 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_that_race_the_probe_that_releases_the_write_send_it_once() {
    let upstream = FakeUpstream::start().await;
    // The lookup takes 300 ms: the retries arrive while one of them
    // probes, and wait for it.
    let route = format!(
        "in_progress = \"wait\"\n[routes.reconcile]\nurl = \"{}/lookup?key={{key}}&ms=300\"\n\
         found_json_pointer = \"/id\"\nabsent_status = 404\nmin_age = \"1m\"\n",
        upstream.url()
    );
    let clock = ManualClock::new();
    let setup = Setup::route(&route).clock(clock.clone()).admin();
    let gw = spawn_gateway_on(upstream, setup).await;
    lost_uncommitted(&gw, "race-1").await;
    // The probe after the loss finds it absent, too young to believe.
    first_probe_done(&gw, "race-1").await;
    clock.advance(Duration::from_secs(61));

    let retries = concurrent_writes(gw.addr(), 5, "/scripted", "race-1", BODY).await;

    assert_one_fresh_rest_replayed(&retries);
    assert_eq!(gw.upstream.writes(), 1, "sent once");
    let stored = gw.operation("race-1").await;
    assert_eq!(stored["attempts"], 2);
    let verdicts: Vec<Value> = events_of(&stored, "probe")
        .iter()
        .map(|p| p["verdict"].clone())
        .collect();
    assert_eq!(verdicts, ["undetermined", "absent"], "one probe per race");
}

/// The lookups `gw`'s probes sent its upstream.
fn lookups(gw: &TestGateway) -> usize {
    let requests = gw.upstream.requests();
    requests
        .iter()
        .filter(|r| r.uri.starts_with("/lookup"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_of_a_held_write_are_probed_spaced_and_its_timeline_stays_short() {
    let upstream = FakeUpstream::start().await;
    // A lookup that never settles anything: its 404 proves nothing without
    // rules for absence, so every answer is undetermined.
    let route = format!(
        "[routes.reconcile]\nurl = \"{}/lookup?key={{key}}\"\nfound_json_pointer = \"/id\"\n",
        upstream.url()
    );
    let clock = ManualClock::new();
    let setup = Setup::route(&route).clock(clock.clone()).admin();
    let mut gw = spawn_gateway_on(upstream, setup).await;
    lost_uncommitted(&gw, "spaced-1").await;
    first_probe_done(&gw, "spaced-1").await;
    let retry = || write(gw.addr(), "/scripted", Some("spaced-1"), BODY);

    // A client that retries on 409 without pause: answered from the store.
    for _ in 0..200 {
        assert_held_unknown(&retry().await);
    }
    assert_eq!(lookups(&gw), 1, "the probe after the loss only");
    // The spacing is on the timeline: a restarted gateway (or a replica)
    // keeps it.
    gw.restart().await;
    let retry = || write(gw.addr(), "/scripted", Some("spaced-1"), BODY);
    assert_held_unknown(&retry().await);
    assert_eq!(lookups(&gw), 1, "not probed after a restart either");
    // A second after the first probe, the next; two seconds after that
    // one, the third.
    clock.advance(Duration::from_millis(999));
    assert_held_unknown(&retry().await);
    assert_eq!(lookups(&gw), 1, "within a second of the first");
    clock.advance(Duration::from_millis(1));
    assert_held_unknown(&retry().await);
    assert_eq!(lookups(&gw), 2, "a second after the first");
    clock.advance(Duration::from_millis(1_999));
    assert_held_unknown(&retry().await);
    assert_eq!(lookups(&gw), 2, "within two seconds of the second");
    clock.advance(Duration::from_millis(1));
    assert_held_unknown(&retry().await);
    assert_eq!(lookups(&gw), 3, "two seconds after the second");
    // The spacing doubles up to a minute: a retry every minute is probed
    // each time, and ten retries in that minute once.
    for _ in 0..20 {
        clock.advance(Duration::from_secs(60));
        for _ in 0..10 {
            assert_held_unknown(&retry().await);
        }
    }
    assert_eq!(lookups(&gw), 23, "one probe a minute");

    // Of 23 undetermined probes in a row the timeline keeps the first and
    // the latest, which counts the ones it stands for.
    let probes = probe_events(&gw, "spaced-1").await;
    assert_eq!(probes.len(), 2, "{probes:?}");
    assert!(
        probes.iter().all(|p| p["verdict"] == "undetermined"),
        "{probes:?}"
    );
    assert_eq!(probes[0].get("probes"), None, "{probes:?}");
    assert_eq!(probes[1]["probes"], 22, "{probes:?}");
    let stored = gw.operation("spaced-1").await;
    // Timestamps of one format and length: their text sorts as they do.
    let probed_at: Vec<&str> = stored["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["kind"] == "probe")
        .filter_map(|e| e["at"].as_str())
        .collect();
    assert!(
        probed_at[0] < probed_at[1],
        "the latest is the latest: {probed_at:?}"
    );
    assert_eq!(
        verdicts_counted(&gw, "undetermined").await,
        22.0,
        "since the restart"
    );
    assert_eq!(gw.upstream.writes(), 0);
}

/// A lookup on a lagging index (always 404), confirmed by a list that is
/// consistent.
const LAGGING: &str = "url = \"{up}/lagging?key={key}\"\nabsent_status = 404\nmin_age = \"1ms\"\n\
    confirm_url = \"{up}/records?key={key}\"\nconfirm_absent_json_pointer = \"/data\"";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_lookup_that_the_confirm_request_contradicts_stays_held() {
    let clock = ManualClock::new();
    let gw = probing_on(&clock, LAGGING, "").await;
    // The write commits; its response is lost.
    let lost = write(gw.addr(), "/drop", Some("lag-1"), BODY).await;
    lost.assert_operation_problem(502, "outcome-unknown", "unknown");
    first_probe_done(&gw, "lag-1").await;
    clock.advance(Duration::from_secs(1));

    let retry = write(gw.addr(), "/drop", Some("lag-1"), BODY).await;

    assert_held_unknown(&retry);
    assert_eq!(gw.upstream.writes(), 1, "not sent again");
    let stored = gw.operation("lag-1").await;
    assert_eq!(stored["state"], "unknown");
    let probes = events_of(&stored, "probe");
    assert!(
        probes.iter().all(|p| p["verdict"] == "undetermined"),
        "{probes:?}"
    );
    // The retry's probe is past `min_age` (the first one was not: the
    // clock had not moved) and asks the confirm request.
    let confirmed: Vec<&Value> = probes.iter().filter(|p| p["confirm"].is_object()).collect();
    assert!(!confirmed.is_empty(), "{probes:?}");
    for probe in confirmed {
        assert_eq!(probe["status"], 404, "the lookup said absent: {probe}");
        let confirm = &probe["confirm"];
        assert_eq!(
            confirm["url"],
            format!("{}/records?key=lag-1", gw.upstream.url())
        );
        assert_eq!(
            (&confirm["status"], &confirm["absent"]),
            (&200.into(), &false.into())
        );
    }
    assert_eq!(verdicts_counted(&gw, "absent").await, 0.0);
}

/// The late window is judged on the wall clock from the stored times; a
/// clock stepped forward past it (NTP, a resumed VM) while the lost
/// write's exchange could still land had a probe's absence believed, and
/// an operator's `not_attempted` taken: the write was sent again. The
/// gateway that sent it knows by its monotonic clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_stepped_forward_does_not_cut_the_late_window_short() {
    let clock = ManualClock::new();
    let upstream = FakeUpstream::start().await;
    let route = format!(
        "late_window = \"60s\"\n[routes.reconcile]\nurl = \"{}/lagging?key={{key}}\"\n\
         absent_status = 404\nmin_age = \"1ms\"\n",
        upstream.url()
    );
    let setup = Setup::route(&route).admin().clock(clock.clone());
    let gw = spawn_gateway_on(upstream, setup).await;
    let lost = write(gw.addr(), "/drop", Some("stepped-1"), BODY).await;
    lost.assert_operation_problem(502, "outcome-unknown", "unknown");
    first_probe_done(&gw, "stepped-1").await;

    // The wall clock stepped past the late window; no time passed.
    clock.step(Duration::from_secs(70));
    let retry = write(gw.addr(), "/drop", Some("stepped-1"), BODY).await;
    assert_held_unknown(&retry);
    assert_eq!(gw.upstream.writes(), 1, "not sent again");
    let probes = probe_events(&gw, "stepped-1").await;
    let last = probes.last().expect("probed");
    assert_eq!(last["verdict"], "undetermined", "{probes:?}");
    let reason = last["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("monotonic clock"), "{last}");

    let id = gw.operation("stepped-1").await["id"]
        .as_str()
        .expect("id")
        .to_string();
    let not_attempted = json!({"outcome": "not_attempted", "operator": "ann"});
    let refused = gw.resolve(&id, &not_attempted).await;
    refused.assert_problem(409, "attempt-may-still-land");
    let wait: u64 = refused
        .header("retry-after")
        .and_then(|s| s.parse().ok())
        .expect("Retry-After in seconds");
    assert!((1..=61).contains(&wait), "Retry-After: {wait}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_lookup_that_the_confirm_request_agrees_with_releases() {
    let gw = probing(LAGGING, "").await;
    lost_uncommitted(&gw, "lag-2").await;

    let sent = retried_while_held(&gw, "lag-2").await;

    assert_fresh_created(&sent);
    assert_eq!(gw.upstream.writes(), 1);
    let stored = gw.operation("lag-2").await;
    assert_eq!(stored["state"], "completed");
    let absent: Vec<Value> = events_of(&stored, "probe")
        .into_iter()
        .filter(|p| p["verdict"] == "absent")
        .collect();
    assert_eq!(absent.len(), 1, "{absent:?}");
    assert_eq!(absent[0]["confirm"]["absent"], true);
    assert_eq!(absent[0]["confirm"]["count"], Value::Null);
}

/// A probe that asks a list or a search (the only lookup Stripe's API
/// has) finds the write inside its answer: retries got the whole list as
/// the created object, which stripe-python returned as a `ListObject`
/// with no `id`. With `result_json_pointer` they get the write's object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_found_in_a_list_is_answered_with_its_own_object() {
    let gw = probing(
        "url = \"{up}/records?key={key}\"\nfound_json_pointer = \"/data/0/id\"\n\
         count_json_pointer = \"/data\"\nresult_json_pointer = \"/data/0\"",
        "",
    )
    .await;
    gw.upstream.script(Scripted::Drop);
    let lost = write(gw.addr(), "/scripted", Some("listed-1"), BODY).await;
    assert_eq!(lost.status, StatusCode::BAD_GATEWAY, "{:?}", lost.body);
    let found = retried_while_held(&gw, "listed-1").await;
    assert!(found.is_replay(), "{:?} {:?}", found.status, found.body);
    assert_eq!(found.status, StatusCode::OK);
    assert_eq!(found.json(), json!({"id": 1}), "the write's object alone");
    assert_eq!(found.header("content-type"), Some("application/json"));
    let again = write(gw.addr(), "/scripted", Some("listed-1"), BODY).await;
    assert_eq!(again.body, found.body);
    assert_eq!(gw.upstream.writes(), 1);
    let stored = gw.operation("listed-1").await;
    assert_eq!(stored["evidence"], "reconciled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_held_twice_at_the_destination_is_alerted_pauses_the_route_and_is_listed_first() {
    let receiver = FakeUpstream::start().await;
    let clock = ManualClock::new();
    let gw = probing_on(
        &clock,
        "url = \"{up}/records?key={key}\"\nfound_json_pointer = \"/data/0\"\n\
         count_json_pointer = \"/data\"",
        &format!(
            "[[alerts]]\nurl = \"{}/scripted\"\nevents = [\"duplicated-at-destination\"]",
            receiver.url()
        ),
    )
    .await;
    // Two held operations, `dup-1` the older; nothing is at the
    // destination under either yet.
    lost_uncommitted(&gw, "dup-1").await;
    lost_uncommitted(&gw, "later-1").await;
    for key in ["dup-1", "later-1"] {
        first_probe_done(&gw, key).await;
    }
    // Then the destination holds `dup-1` twice (written past the gateway).
    for _ in 0..2 {
        let direct = send(
            gw.upstream.addr(),
            "POST",
            "/orders",
            &[("idempotency-key", "dup-1")],
            BODY,
        )
        .await;
        assert_eq!(direct.status, StatusCode::CREATED);
    }
    // Past the spacing: the retry probes again.
    clock.advance(Duration::from_secs(1));

    let retry = write(gw.addr(), "/scripted", Some("dup-1"), BODY).await;

    assert_held_unknown(&retry);
    let stored = gw.operation("dup-1").await;
    assert_eq!(
        (&stored["state"], &stored["evidence"]),
        (&"unknown".into(), &"duplicated-at-destination".into())
    );
    let duplicated = events_of(&stored, "probe")
        .into_iter()
        .find(|p| p["verdict"] == "duplicated")
        .expect("the probe that found it twice");
    assert_eq!(duplicated["count"], 2);
    // The alert.
    receiver.wait_for_writes(1).await;
    let alert: Value = serde_json::from_slice(&receiver.requests()[0].body).expect("JSON");
    assert_eq!(alert["event"], "duplicated-at-destination");
    assert_eq!(alert["operation_id"], stored["id"]);
    // The route is paused, by the probe: a new write is refused.
    let routes = gw.admin("GET", "/admin/stats", "").await.json();
    let api = &routes["routes"][0];
    assert_eq!(
        (&api["paused"], &api["paused_by"]),
        (&true.into(), &"probe".into()),
        "{routes}"
    );
    write(gw.addr(), "/orders", Some("new-1"), BODY)
        .await
        .assert_problem(503, "route-paused");
    // First in the held list, though older.
    let held = gw
        .admin("GET", "/admin/keys?state=unknown", "")
        .await
        .json();
    let keys: Vec<&str> = held["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|item| item["key"].as_str())
        .collect();
    assert_eq!(keys, ["dup-1", "later-1"], "{held}");
    assert_eq!(held["items"][0]["duplicated_at_destination"], true);
    assert_eq!(verdicts_counted(&gw, "duplicated").await, 1.0);
    assert_eq!(gw.upstream.writes(), 2, "nothing sent through the gateway");

    // Later probes settle nothing (an operator's to settle): the run of
    // them after the finding keeps the finding and the latest.
    for _ in 0..3 {
        clock.advance(Duration::from_secs(60));
        assert_held_unknown(&write(gw.addr(), "/scripted", Some("dup-1"), BODY).await);
    }
    let kept: Vec<(Value, Value)> = probe_events(&gw, "dup-1")
        .await
        .iter()
        .map(|p| (p["verdict"].clone(), p["probes"].clone()))
        .collect();
    let entry = |verdict: &str, probes: Value| (Value::from(verdict), probes);
    assert_eq!(
        kept,
        [
            entry("undetermined", Value::Null),
            entry("duplicated", Value::Null),
            entry("duplicated", 3.into()),
        ],
        "the finding, then the latest of three more"
    );
    assert_eq!(verdicts_counted(&gw, "duplicated").await, 4.0);

    // An operator settles it as what it is: it happened. Resolved
    // not_attempted, the next retry would make it once more.
    let stored = gw.operation("dup-1").await;
    let next = stored["next_action"].as_str().expect("next action");
    assert!(
        next.contains("more than once") && next.contains("not_attempted is refused"),
        "{next}"
    );
    let id = stored["id"].as_str().expect("id");
    gw.resolve(id, &json!({"outcome": "not_attempted", "operator": "ann"}))
        .await
        .assert_problem(409, "found-at-destination");
    gw.resolved(id, &json!({"outcome": "completed", "operator": "ann"}))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_response_leaves_a_write_held_twice_at_the_destination_to_an_operator() {
    let upstream = FakeUpstream::start().await;
    // The write's answer can come after `upstream_timeout`, well within
    // `late_window`.
    let route = format!(
        "upstream_timeout = \"300ms\"\nlate_window = \"30s\"\n[routes.reconcile]\n\
         url = \"{}/records?key={{key}}\"\nfound_json_pointer = \"/data/0\"\n\
         count_json_pointer = \"/data\"\n",
        upstream.url()
    );
    let gw = spawn_gateway_on(upstream, Setup::route(&route).admin()).await;
    // The destination holds one record under the key already (written
    // past the gateway); the gateway's write makes it two, its answer held.
    let direct = send(
        gw.upstream.addr(),
        "POST",
        "/orders",
        &[("idempotency-key", "late-dup")],
        BODY,
    )
    .await;
    assert_eq!(direct.status, StatusCode::CREATED);
    gw.upstream.script(Scripted::Hold);
    let lost = write(gw.addr(), "/scripted", Some("late-dup"), BODY).await;
    lost.assert_operation_problem(504, "outcome-unknown", "unknown");
    first_probe_done(&gw, "late-dup").await;
    assert_eq!(
        gw.operation("late-dup").await["evidence"],
        "duplicated-at-destination"
    );

    gw.upstream.release_one();

    let stored = eventually("the late response on the timeline", || async {
        let stored = gw.operation("late-dup").await;
        (!events_of(&stored, "late-response").is_empty()).then_some(stored)
    })
    .await;
    assert_eq!(
        (&stored["state"], &stored["evidence"]),
        (&"unknown".into(), &"duplicated-at-destination".into()),
        "{stored}"
    );
    assert_eq!(events_of(&stored, "late-response")[0]["status"], 201);
    let text = scrape_metrics(gw.admin_addr()).await;
    assert_eq!(
        metric(&text, r#"idemgate_late_responses_total{route="api"}"#),
        Some(1.0),
        "{text}"
    );
    assert_held_unknown(&write(gw.addr(), "/scripted", Some("late-dup"), BODY).await);
    let held = gw
        .admin("GET", "/admin/keys?state=unknown", "")
        .await
        .json();
    assert_eq!(held["items"][0]["key"], "late-dup", "{held}");
    assert_eq!(held["items"][0]["duplicated_at_destination"], true);

    // An operator settles it; retries get what they decided.
    let id = stored["id"].as_str().expect("id");
    let resolution = serde_json::json!({
        "outcome": "completed",
        "operator": "ann",
        "reference": "kept record 1, refunded record 2",
        "response": {"status": 201, "body": {"id": 1}},
    });
    gw.resolved(id, &resolution).await;
    let retry = write(gw.addr(), "/scripted", Some("late-dup"), BODY).await;
    assert!(retry.is_replay(), "{retry:?}");
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(retry.json(), serde_json::json!({"id": 1}));
    assert_eq!(gw.upstream.writes(), 2, "nothing sent again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirm_request_past_its_timeout_is_never_absent() {
    let clock = ManualClock::new();
    let gw = probing_on(
        &clock,
        "url = \"{up}/lookup?key={key}\"\nfound_json_pointer = \"/id\"\nabsent_status = 404\n\
         min_age = \"1ms\"\nconfirm_url = \"{up}/records?key={key}&ms=5000\"\n\
         confirm_absent_json_pointer = \"/data\"\ntimeout = \"300ms\"",
        "",
    )
    .await;
    lost_uncommitted(&gw, "hang-1").await;
    first_probe_done(&gw, "hang-1").await;
    // Past the spacing, and the first probe's `min_age`.
    clock.advance(Duration::from_secs(1));

    let retry = write(gw.addr(), "/scripted", Some("hang-1"), BODY).await;

    assert_held_unknown(&retry);
    let probes = probe_events(&gw, "hang-1").await;
    assert!(
        probes.iter().all(|p| p["verdict"] == "undetermined"),
        "{probes:?}"
    );
    let confirmed: Vec<&Value> = probes.iter().filter(|p| p["confirm"].is_object()).collect();
    assert!(!confirmed.is_empty(), "{probes:?}");
    for probe in confirmed {
        assert_eq!(probe["status"], 404, "the lookup said absent");
        assert!(
            probe["confirm"]["error"]
                .as_str()
                .is_some_and(|e| e.contains("no answer within 300ms")),
            "{probe}"
        );
        assert_eq!(probe["confirm"]["absent"], false);
    }
    assert_eq!(gw.operation("hang-1").await["state"], "unknown");
    assert_eq!(gw.upstream.writes(), 0);
    assert_eq!(verdicts_counted(&gw, "absent").await, 0.0);
}

/// A `tools/call` of `tool` for the task `title` as a 2026-07-28 client
/// sends it, to `path` through the gateway at `addr`, under `key`.
async fn call_tool(addr: SocketAddr, path: &str, tool: &str, title: &str, key: &str) -> Response {
    let body = serde_json::json!({
        "jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {
            "name": tool,
            "arguments": {"title": title},
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {},
            },
        },
    });
    let headers = [
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("authorization", ALICE),
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", tool),
        ("idempotency-key", key),
    ];
    send(addr, "POST", path, &headers, body.to_string()).await
}

/// A `tools/call` of `create_task` for the task `probed`.
async fn create_task(addr: SocketAddr, path: &str, key: &str) -> Response {
    call_tool(addr, path, "create_task", "probed", key).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_probe_tool_that_counts_nothing_releases_the_call_and_it_is_sent_once() {
    let mock = MockUpstream::start(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("mock starts");
    let route = "profile = \"mcp\"\nlate_window = \"1ms\"\n[routes.mcp.reconcile]\ntool = \"count_tasks\"\n\
        tools = [\"create_task\"]\nabsent_json_pointer = \"/structuredContent/tasks\"\n\
        count_json_pointer = \"/structuredContent/tasks\"\nmin_age = \"1s\"\n";
    let setup = Setup::route(route)
        .at("/mcp")
        .upstream_url(format!("http://{}", mock.addr()))
        .admin();
    let gw = spawn_gateway_with(setup).await;
    // Lost on its way: never committed.
    let lost = create_task(gw.addr(), "/mcp/lose-once", "mcp-1").await;
    assert_eq!(lost.json()["result"]["isError"], true, "{:?}", lost.json());
    assert_eq!(mock.writes(), 0);

    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let sent = loop {
        let retry = create_task(gw.addr(), "/mcp/lose-once", "mcp-1").await;
        if retry.json()["result"]["isError"] == false {
            break retry;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still held after 5 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    assert_eq!(
        sent.json()["result"]["content"][0]["text"],
        "created task 1",
        "{:?}",
        sent.json()
    );
    assert_eq!(mock.writes(), 1, "sent once");
    let stored = gw.operation("create_task/mcp-1").await;
    assert_eq!(stored["state"], "completed");
    let probes = events_of(&stored, "probe");
    assert_eq!(
        probes.last().expect("probes")["verdict"],
        "absent",
        "{probes:?}"
    );
    assert_eq!(
        probes.last().expect("probes")["url"],
        "tools/call count_tasks"
    );
    assert_eq!(probes.last().expect("probes")["count"], 0);
    mock.stop().await;
}

/// A probe tool asked by `{key}`, the call's own key bare, as a server
/// that knows calls by a key argument got it. A call keyed in its HTTP
/// header (or derived) never brought the server that key — only
/// `<tool>/<key>` in `Idempotency-Key` — so the server's "none" said
/// nothing of it: the call was released and, if it had run, run again.
/// Its absence is believed only for a call whose kept body carried the
/// key (`_meta`, or the key argument).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_probe_by_the_calls_own_key_believes_absence_only_where_the_call_carried_it() {
    let mock = MockUpstream::start(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("mock starts");
    let route = "profile = \"mcp\"\nlate_window = \"1ms\"\nstore_request_body = true\n\
        [routes.mcp.reconcile]\ntool = \"count_tasks\"\ntools = [\"create_task\"]\n\
        arguments = '{\"request_id\": \"{key}\"}'\n\
        absent_json_pointer = \"/structuredContent/tasks\"\n\
        count_json_pointer = \"/structuredContent/tasks\"\nmin_age = \"1s\"\n";
    let clock = ManualClock::new();
    let gw = mock_mcp_gateway(&mock, route, &clock).await;
    // Keyed in its header: the server never got `hdr-1` bare.
    let lost = call_tool(gw.addr(), "/mcp/lose-once", "create_task", "T1", "hdr-1").await;
    assert_eq!(own_meta(&lost, "problem"), "outcome-unknown");
    // Past min_age and the probes' spacing (from the probe at the loss),
    // a retry's probe reads absent by the count, and is not believed.
    let probes = |key: &'static str| {
        let gw = &gw;
        async move { events_of(&gw.operation(key).await, "probe") }
    };
    eventually("the probe at the loss", || async {
        (!probes("create_task/hdr-1").await.is_empty()).then_some(())
    })
    .await;
    clock.advance(Duration::from_secs(120));
    let retry = call_tool(gw.addr(), "/mcp/lose-once", "create_task", "T1", "hdr-1").await;
    assert_eq!(own_meta(&retry, "problem"), "outcome-unknown", "still held");
    let probe = eventually("the retry's probe", || async {
        let latest = probes("create_task/hdr-1").await.last().cloned()?;
        let reason = latest["reason"].as_str().unwrap_or_default();
        (!reason.contains("unknown for")).then_some(latest)
    })
    .await;
    assert_eq!(probe["verdict"], "undetermined", "{probe}");
    assert!(
        probe["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("own key"),
        "{probe}"
    );
    let again = call_tool(gw.addr(), "/mcp/lose-once", "create_task", "T1", "hdr-1").await;
    assert_eq!(own_meta(&again, "problem"), "outcome-unknown", "still held");
    assert_eq!(mock.writes(), 0, "never sent again");

    // Keyed in its `_meta`: the server got it bare, and its none is believed.
    let meta_keyed = |id: u64| {
        let body = serde_json::json!({
            "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {
                "name": "create_task",
                "arguments": {"title": "T2"},
                "_meta": {"dev.idemgate/idempotency-key": "meta-1"},
            },
        });
        let headers = [
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
            ("authorization", ALICE),
            ("mcp-protocol-version", "2025-11-25"),
        ];
        let addr = gw.addr();
        async move { send(addr, "POST", "/mcp/lose-once", &headers, body.to_string()).await }
    };
    assert_eq!(own_meta(&meta_keyed(1).await, "problem"), "outcome-unknown");
    eventually("the probe at the loss", || async {
        (!probes("create_task/meta-1").await.is_empty()).then_some(())
    })
    .await;
    clock.advance(Duration::from_secs(120));
    // A retry probes; one after its conclusion is sent.
    let sent = eventually("the call released and sent", || async {
        let retry = meta_keyed(2).await;
        (retry.json()["result"]["isError"] == false).then_some(retry)
    })
    .await;
    assert_eq!(
        sent.json()["result"]["content"][0]["text"],
        "created task 1"
    );
    assert_eq!(mock.writes(), 1, "released, and sent once");
    mock.stop().await;
}

/// A gateway (admin API on, `clock` its clock) whose `mcp` route `route`
/// at `/mcp` fronts `mock`'s MCP server.
async fn mock_mcp_gateway(
    mock: &MockUpstream,
    route: &str,
    clock: &Arc<ManualClock>,
) -> TestGateway {
    let setup = Setup::route(route)
        .at("/mcp")
        .upstream_url(format!("http://{}", mock.addr()))
        .clock(clock.clone())
        .admin();
    spawn_gateway_with(setup).await
}

/// The gateway's `_meta` entry `name` (`problem`, `state`) in a tool
/// result answered as JSON.
fn own_meta(answer: &Response, name: &str) -> Value {
    answer.json()["result"]["_meta"][format!("dev.idemgate/{name}")].clone()
}

/// A probe for one tool's writes says nothing of another's: the mock's
/// `count_tasks` counts tasks, not comments. So a held `comment_task` is
/// never probed — neither settled `completed` because a task exists (its
/// comment refused before it ran), nor released because none does (its
/// comment made, its answer lost) — while a held `create_task` still is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_probe_settles_only_the_calls_of_the_tools_it_is_for() {
    let mock = MockUpstream::start(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("mock starts");
    let route = "profile = \"mcp\"\nlate_window = \"1ms\"\n[routes.mcp.reconcile]\ntool = \"count_tasks\"\n\
        tools = [\"create_task\"]\nabsent_json_pointer = \"/structuredContent/tasks\"\n\
        count_json_pointer = \"/structuredContent/tasks\"\nmin_age = \"1s\"\n";
    let clock = ManualClock::new();
    let gw = mock_mcp_gateway(&mock, route, &clock).await;
    let held = |answer: &Response| {
        assert_eq!(
            own_meta(answer, "problem"),
            "outcome-unknown",
            "{:?}",
            answer.json()
        );
    };

    // The comment made, its answer lost; no task exists.
    held(&call_tool(gw.addr(), "/mcp/drop", "comment_task", "TB", "c-b").await);
    for _ in 0..2 {
        // Past min_age and each probe's spacing: absence would be believed.
        clock.advance(Duration::from_secs(120));
        held(&call_tool(gw.addr(), "/mcp/drop", "comment_task", "TB", "c-b").await);
    }
    assert_eq!(mock.writes(), 1, "one comment on TB");

    // A call of a tool the probe is for: the task made, its answer lost,
    // found by the probe, and answered as the gateway answers a call
    // settled without its own result (docs/mcp.md).
    held(&call_tool(gw.addr(), "/mcp/drop", "create_task", "TA", "t-a").await);
    let settled = call_tool(gw.addr(), "/mcp/drop", "create_task", "TA", "t-a").await;
    let result = &settled.json()["result"];
    assert_eq!(
        own_meta(&settled, "problem"),
        "completed-without-result",
        "{result}"
    );
    assert_eq!(result["_meta"]["dev.idemgate/reconciled-by"], "count_tasks");
    assert_eq!(gw.operation("create_task/t-a").await["state"], "completed");

    // The comment refused with 502 before the tool ran; task TA exists.
    held(&call_tool(gw.addr(), "/mcp/502", "comment_task", "TA", "c-a").await);
    clock.advance(Duration::from_secs(120));
    let retry = call_tool(gw.addr(), "/mcp/502", "comment_task", "TA", "c-a").await;
    held(&retry);
    assert_eq!(own_meta(&retry, "state"), "unknown");
    assert_eq!(
        mock.writes(),
        2,
        "the comment on TB and the task TA, no more"
    );
    for key in ["comment_task/c-b", "comment_task/c-a"] {
        let stored = gw.operation(key).await;
        assert_eq!(stored["state"], "unknown", "{key}");
        assert!(events_of(&stored, "probe").is_empty(), "{key}: {stored}");
    }
    mock.stop().await;
}

/// A retry's probe finds the write while an operator resolves it
/// `not_attempted` (the late window past): the store then lets the retry
/// claim the next attempt, but the probe saw the write at the destination,
/// so it is held `unknown` (`found-at-destination`), never sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_a_probe_finds_is_not_sent_again_past_an_operators_not_attempted() {
    let gw = probing_with(
        "url = \"{up}/records?key={key}&ms=1500\"\nfound_json_pointer = \"/data/0\"",
        "",
        |setup| setup,
    )
    .await;
    gw.upstream.script(Scripted::Drop);
    let lost = write(gw.addr(), "/scripted", Some("found-1"), BODY).await;
    assert_eq!(lost.status, StatusCode::BAD_GATEWAY);
    gw.upstream.script(Scripted::Create);
    assert_eq!(gw.upstream.writes(), 1, "committed at the destination");
    let addr = gw.addr();
    let retry = tokio::spawn(async move { write(addr, "/scripted", Some("found-1"), BODY).await });
    // The write, then the probe's lookup (the loss's own probe, which the
    // retry waits for, whichever began it).
    gw.upstream.wait_for_requests(2).await;
    // The probe is asking; the operator decides it was not made.
    let id = gw.operation("found-1").await["id"]
        .as_str()
        .expect("id")
        .to_string();
    gw.resolved(&id, &json!({"outcome": "not_attempted", "operator": "ann"}))
        .await;
    let answered = retry.await.expect("client task");
    assert_held_unknown(&answered);
    assert_eq!(gw.upstream.writes(), 1, "never sent again");
    let op = gw.operation("found-1").await;
    assert_eq!(
        (&op["state"], &op["evidence"]),
        (&"unknown".into(), &"found-at-destination".into()),
        "{op}"
    );
}
