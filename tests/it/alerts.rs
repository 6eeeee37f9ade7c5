//! Alerts on held work: `[[alerts]]` webhooks hear of an operation that
//! became `unknown`, a paused route and an operation `unknown` for too
//! long, from the store's outbox, at least once:
//!
//! - a receiver that refuses the first deliveries gets the alert once it
//!   takes them, and no more after that; the payload names the operation
//!   and carries no request payload and no credential;
//! - a route paused by an operator is one alert with the reason;
//! - `unknown-aged` is reported once, after `aged_after` on the gateway's
//!   clock;
//! - on a PostgreSQL store too, and there across replicas whose
//!   `[[alerts]]` differ (as during a rollout that adds a webhook), one of
//!   them with none: every alert reaches every endpoint some replica has,
//!   once, and no replica gives up a delivery for an endpoint it lacks;
//! - the real binary, SIGKILLed between the state change and the alert's
//!   delivery, delivers it after a restart, signed
//!   (`X-Idemgate-Signature`, checked here with an HMAC of our own);
//! - a webhook that takes each POST and never answers delays no other
//!   webhook's alerts, nor their retries: deliveries do not wait on each
//!   other;
//! - an operation that becomes `unknown` while the gateway drains is
//!   alerted before it stops; a stop that ends its grace with a post in
//!   flight says so, and one with none in flight does not;
//! - `idemgate alerts test` says what each endpoint answered.

use std::time::Duration;

use crate::common::*;
use hmac::{Hmac, Mac};
use http::StatusCode;
use idemgate::alerts::deliverer::AGING;
use sha2::Sha256;

/// A request body with a marker no alert may carry.
const SECRET_BODY: &str = r#"{"card":"4242-marker-never-in-alerts"}"#;

/// Every request `receiver` recorded, once there are `n` (bounded).
async fn requests_reach(receiver: &FakeUpstream, n: usize) -> Vec<Recorded> {
    receiver.wait_for_requests(n).await;
    receiver.requests()
}

/// The route lines for an alert endpoint at `receiver`'s `/scripted`.
fn alerted(route: &str, receiver: &FakeUpstream, alert: &str) -> String {
    format!(
        "{route}\n[[alerts]]\nurl = \"{}/scripted\"\n{alert}",
        receiver.url()
    )
}

fn json_of(request: &Recorded) -> serde_json::Value {
    serde_json::from_slice(&request.body).expect("an alert is JSON")
}

async fn delivered_count(admin: std::net::SocketAddr) -> String {
    let scraped = admin_call(admin, "GET", "/metrics", None, "").await;
    let text = String::from_utf8_lossy(&scraped.body).to_string();
    text.lines()
        .find(|l| l.starts_with(r#"idemgate_alert_deliveries_total{outcome="delivered"}"#))
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_operation_is_alerted_until_a_receiver_takes_it() {
    let receiver = FakeUpstream::start().await;
    receiver.script(Scripted::Refuse(503));
    let route = alerted("", &receiver, "events = [\"operation-unknown\"]");
    let gw = spawn_gateway_with(Setup::route(&route).quick().admin()).await;

    let lost = write(gw.addr(), "/drop", Some("alert-1"), SECRET_BODY).await;
    lost.assert_operation_problem(502, "outcome-unknown", "unknown");
    let operation = gw.operation("alert-1").await;
    // Two refused deliveries, then the receiver takes the next one.
    requests_reach(&receiver, 2).await;
    receiver.script(Scripted::Create);
    receiver.wait_for_writes(1).await;
    let requests = requests_reach(&receiver, 3).await;
    for request in &requests {
        assert_eq!(request.method, http::Method::POST);
        assert_eq!(request.header("content-type"), Some("application/json"));
        assert!(
            request.header("x-idemgate-signature").is_none(),
            "no secret, no signature"
        );
        let text = String::from_utf8_lossy(&request.body);
        assert!(!text.contains("marker"), "a payload in an alert: {text}");
        assert!(
            !text.contains("alice-token"),
            "a credential in an alert: {text}"
        );
    }
    let alert = json_of(requests.last().expect("a delivery"));
    assert_eq!(alert["event"], "operation-unknown");
    assert_eq!(alert["route"], "api");
    assert_eq!(alert["key"], "alert-1");
    assert_eq!(alert["state"], "unknown");
    assert_eq!(alert["operation_id"], operation["id"]);
    assert!(alert["evidence"].as_str().is_some_and(|e| !e.is_empty()));
    assert!(
        alert["console_url"]
            .as_str()
            .is_some_and(|u| u.ends_with(&format!("#/op/{}", operation["id"].as_str().unwrap()))),
        "{alert}"
    );
    assert!(alert["at"].as_str().is_some_and(|at| at.ends_with('Z')));

    // Delivered is final: no more requests once a whole poll ran after
    // it, and the metrics say so.
    next_full_pass(gw.admin_addr(), "alerts").await;
    assert_eq!(
        receiver.requests().len(),
        3,
        "an alert delivered once is not sent again"
    );
    assert!(delivered_count(gw.admin_addr()).await.ends_with(" 1"));
    let scraped = admin_call(gw.admin_addr(), "GET", "/metrics", None, "").await;
    let text = String::from_utf8_lossy(&scraped.body);
    assert!(
        text.contains(r#"idemgate_alert_deliveries_total{outcome="failed"} 2"#),
        "{text}"
    );
    // A completed write is no alert.
    assert_fresh_created(&write(gw.addr(), "/orders", Some("alert-2"), "{}").await);
    next_full_pass(gw.admin_addr(), "alerts").await;
    assert_eq!(receiver.requests().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_route_is_one_alert_with_its_reason() {
    let receiver = FakeUpstream::start().await;
    let route = alerted("", &receiver, "events = [\"route-paused\"]");
    let gw = spawn_gateway_with(Setup::route(&route).quick().admin()).await;
    write(gw.addr(), "/drop", Some("paused-1"), "{}").await;
    let paused = gw
        .admin(
            "POST",
            "/admin/routes/api/pause",
            r#"{"reason":"upstream incident 42"}"#,
        )
        .await;
    assert_eq!(paused.status, StatusCode::OK);
    receiver.wait_for_writes(1).await;
    let alert = json_of(&requests_reach(&receiver, 1).await[0]);
    assert_eq!(alert["event"], "route-paused");
    assert_eq!(alert["route"], "api");
    assert!(
        alert["evidence"]
            .as_str()
            .is_some_and(|e| e.contains("upstream incident 42")),
        "{alert}"
    );
    assert!(alert["operation_id"].is_null());
    assert!(
        alert["console_url"]
            .as_str()
            .is_some_and(|u| u.ends_with("#/routes"))
    );
    next_full_pass(gw.admin_addr(), "alerts").await;
    assert_eq!(
        receiver.requests().len(),
        1,
        "the unknown operation was not subscribed to"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_unknown_past_aged_after_is_alerted_once() {
    let clock = idemgate_model::clock::ManualClock::new();
    let receiver = FakeUpstream::start().await;
    let route = alerted(
        "",
        &receiver,
        "events = [\"unknown-aged\"]\naged_after = \"10m\"",
    );
    let gw = spawn_gateway_with(Setup::route(&route).clock(clock.clone()).quick()).await;
    write(gw.addr(), "/drop", Some("aged-1"), "{}").await;
    // Time for another aging pass, but not for aged_after: the pass runs.
    clock.advance(AGING + Duration::from_secs(1));
    next_full_pass(gw.admin_addr(), "alerts").await;
    assert!(receiver.requests().is_empty(), "not aged yet");
    clock.advance(Duration::from_secs(601));
    receiver.wait_for_writes(1).await;
    let alert = json_of(&requests_reach(&receiver, 1).await[0]);
    assert_eq!(alert["event"], "unknown-aged");
    assert_eq!(alert["key"], "aged-1");
    clock.advance(Duration::from_secs(3600));
    next_full_pass(gw.admin_addr(), "alerts").await;
    assert_eq!(receiver.requests().len(), 1, "reported once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn alerts_are_delivered_from_a_postgresql_store() {
    let schema = PgSchema::create().await;
    let receiver = FakeUpstream::start().await;
    receiver.script(Scripted::Refuse(500));
    let route = alerted("pause_after_unknown = 1", &receiver, "");
    let gw = spawn_gateway_with(Setup::route(&route).postgres(&schema).quick()).await;
    write(gw.addr(), "/drop", Some("pg-alert"), SECRET_BODY).await;
    requests_reach(&receiver, 2).await;
    receiver.script(Scripted::Create);
    // operation-unknown, and the latch's route-paused.
    receiver.wait_for_writes(2).await;
    let mut events: Vec<String> = receiver
        .write_requests()
        .iter()
        .map(|r| json_of(r)["event"].as_str().unwrap_or_default().to_string())
        .collect();
    events.sort();
    events.dedup();
    assert_eq!(events, ["operation-unknown", "route-paused"]);
}

/// The keys of the alerts `receiver` was sent, sorted, repeats kept.
fn alerted_keys(receiver: &FakeUpstream) -> Vec<String> {
    let mut keys: Vec<String> = receiver
        .write_requests()
        .iter()
        .map(|r| json_of(r)["key"].as_str().unwrap_or_default().to_string())
        .collect();
    keys.sort();
    keys
}

/// Writes `key` through `gw`, its response lost: an `unknown` operation.
async fn lose(gw: &TestGateway, key: &str) {
    let lost = write(gw.addr(), "/drop", Some(key), "{}").await;
    lost.assert_operation_problem(502, "outcome-unknown", "unknown");
}

/// A webhook that reads each POST and never answers: the gateway's bound
/// on a post (10 s) ends each, closing its connection ([`RawUpstream::closed`]).
async fn hung_webhook() -> RawUpstream {
    RawUpstream::start(Breakage::Stalls(b"")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_webhook_delays_no_other_webhooks_alerts() {
    let (good, hung) = (FakeUpstream::start().await, hung_webhook().await);
    good.script(Scripted::Refuse(503));
    let events = "events = [\"operation-unknown\"]";
    let route = format!(
        "{}\n[[alerts]]\nurl = \"{}/hook\"\n{events}",
        alerted("", &good, events),
        hung.url()
    );
    let gw = spawn_gateway_with(Setup::route(&route).quick()).await;
    lose(&gw, "first").await;
    eventually("the hung webhook holding a post", || async {
        (hung.requests() == 1).then_some(())
    })
    .await;
    good.wait_for_requests(1).await;
    // Refused: due again within a second or two, while the hung post
    // lasts its 10 s; and a second alert comes due meanwhile.
    good.script(Scripted::Create);
    lose(&gw, "second").await;
    // The good webhook's count is read before the hung post's end: both
    // alerts in, and the hung post not yet ended, is the order asked for.
    let hung_ended_first = eventually("both alerts at the good webhook", || async {
        let delivered = good.writes() == 2;
        let hung_ended = hung.closed() > 0;
        (delivered || hung_ended).then_some(hung_ended)
    })
    .await;
    assert!(
        !hung_ended_first,
        "the good webhook's retry and next alert waited for the hung post: {} of 2 delivered",
        good.writes()
    );
    let mut keys = alerted_keys(&good);
    keys.dedup();
    assert_eq!(keys, ["first", "second"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn replicas_with_different_alerts_reach_every_endpoint_once() {
    let schema = PgSchema::create().await;
    let (first, second) = (FakeUpstream::start().await, FakeUpstream::start().await);
    // The second endpoint refuses at first: its deliveries come due again,
    // and only the replica that has it may take them.
    second.script(Scripted::Refuse(503));
    let events = "events = [\"operation-unknown\"]";
    let old = alerted("", &first, events);
    let new = format!("{old}\n{}", alerted("", &second, events));
    let setup = |route: &str| Setup::route(route).postgres(&schema).quick();
    // Mid-rollout: a replica with the old config, one without alerts, and
    // then one with the second webhook added, which hears nothing older.
    let (old_replica, bare) = (
        spawn_gateway_with(setup(&old)).await,
        spawn_gateway_with(setup("")).await,
    );
    // Once the old replica has recorded its endpoint, whichever fans out.
    next_full_pass(old_replica.admin_addr(), "alerts").await;
    lose(&old_replica, "before").await;
    first.wait_for_writes(1).await;
    let replicas = [old_replica, bare, spawn_gateway_with(setup(&new)).await];
    // Each has polled since (and so recorded its endpoints).
    for gw in &replicas {
        next_full_pass(gw.admin_addr(), "alerts").await;
    }

    let keys: Vec<String> = (0..9).map(|i| format!("rollout-{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        lose(&replicas[i % replicas.len()], key).await;
    }
    eventually("every alert tried at the second endpoint", || async {
        let mut tried = alerted_keys(&second);
        tried.dedup();
        (tried == keys).then_some(())
    })
    .await;
    second.script(Scripted::Create);
    first.wait_for_writes(1 + keys.len()).await;
    second.wait_for_writes(keys.len()).await;
    for gw in &replicas {
        next_full_pass(gw.admin_addr(), "alerts").await;
    }

    let mut everything = keys.clone();
    everything.insert(0, "before".to_string());
    assert_eq!(
        alerted_keys(&first),
        everything,
        "each alert once at the first"
    );
    assert_eq!(
        second.writes(),
        keys.len(),
        "each later alert once at the second"
    );
    for gw in &replicas {
        let scraped = scrape_metrics(gw.admin_addr()).await;
        let gave_up = metric(
            &scraped,
            r#"idemgate_alert_deliveries_total{outcome="gave_up"}"#,
        );
        assert_eq!(gave_up.unwrap_or(0.0), 0.0, "{scraped}");
    }
    let outcomes: Vec<(String, i64)> = sqlx::query_as(&format!(
        "SELECT coalesce(outcome, 'pending'), count(*) FROM {}.alert_deliveries GROUP BY 1",
        schema.name
    ))
    .fetch_all(&mut admin_connection().await)
    .await
    .expect("read the deliveries");
    let every = i64::try_from(everything.len() + keys.len()).expect("a count");
    assert_eq!(outcomes, [("delivered".to_string(), every)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_before_delivery_delivers_after_restart_signed() {
    let receiver = FakeUpstream::start().await;
    receiver.script(Scripted::Refuse(503));
    let upstream = FakeUpstream::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let route = alerted("", &receiver, "secret_env = \"IDEMGATE_TEST_HOOK_SECRET\"");
    let toml = gateway_toml(
        &dir.path().join("idemgate.db"),
        &upstream.url(),
        "/",
        &route,
    );
    let config = write_config(dir.path(), "idemgate.toml", &toml);
    let start = |log: &str| {
        let mut cmd = binary();
        cmd.arg("serve")
            .arg("--config")
            .arg(&config)
            .env("IDEMGATE_TEST_HOOK_SECRET", "whsec-test");
        let log = dir.path().join(log);
        async move { BinaryGateway::spawn(cmd, &log).await }
    };
    let mut first = start("first.log").await;
    write(first.proxy, "/drop", Some("killed-1"), "{}").await;
    requests_reach(&receiver, 1).await;
    // The refused delivery is settled (due again after a backoff) by the
    // end of the poll that posted it; killed before that, it would stay
    // leased for longer than this test waits.
    next_full_pass(first.admin, "alerts").await;
    first.kill();
    receiver.script(Scripted::Create);
    let _second = start("second.log").await;
    receiver.wait_for_writes(1).await;
    let delivered = receiver
        .write_requests()
        .pop()
        .expect("the delivered alert");
    assert_eq!(json_of(&delivered)["key"], "killed-1");
    let signature = delivered.header("x-idemgate-signature").expect("signed");
    let (t, v1) = signature
        .strip_prefix("t=")
        .and_then(|rest| rest.split_once(",v1="))
        .expect("t=…,v1=…");
    let mut mac = <Hmac<Sha256>>::new_from_slice(b"whsec-test").expect("key");
    mac.update(format!("{t}.").as_bytes());
    mac.update(&delivered.body);
    assert_eq!(v1, hex::encode(mac.finalize().into_bytes()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_test_says_what_each_endpoint_answered() {
    let receiver = FakeUpstream::start().await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let closed_addr = closed.local_addr().expect("addr");
    drop(closed);
    let dir = tempfile::tempdir().expect("tempdir");
    let route = format!(
        "[[alerts]]\nurl = \"{}/hooks?token=t0ken\"\n[[alerts]]\nurl = \"http://{closed_addr}/down\"\n",
        receiver.url()
    );
    let toml = gateway_toml(
        &dir.path().join("idemgate.db"),
        &receiver.url(),
        "/",
        &route,
    );
    let config = write_config(dir.path(), "idemgate.toml", &toml);
    let mut cmd = binary();
    cmd.args(["alerts", "test", "--config"]).arg(&config);
    let (status, stdout, stderr) = run_to_exit(cmd).await;
    assert!(!status.success(), "one endpoint is down: {stdout}{stderr}");
    // Each named by its place and origin: a webhook's path holds its token.
    assert!(
        stdout.contains(&format!("alerts[0] {}/…: delivered (201)", receiver.url())),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("alerts[1] http://{closed_addr}/…: not delivered")),
        "{stdout}"
    );
    assert!(
        !stdout.contains("/hooks") && !stdout.contains("/down"),
        "{stdout}"
    );
    assert!(
        !stdout.contains("t0ken"),
        "the URL's query is not printed: {stdout}"
    );
    let sample = json_of(&receiver.write_requests()[0]);
    assert_eq!(sample["event"], "test");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_link_the_console_over_https_when_the_admin_listener_has_a_certificate() {
    let receiver = FakeUpstream::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new(dir.path(), "ca");
    let admin = ca.server_cert(dir.path(), "admin");
    let server = format!(
        "admin_tls_cert = \"{}\"\nadmin_tls_key = \"{}\"\n",
        admin.cert.display(),
        admin.key.display()
    );
    let route = alerted("", &receiver, "events = [\"operation-unknown\"]");
    let gw = spawn_gateway_with(Setup::route(&route).server(&server)).await;
    write(gw.addr(), "/drop", Some("tls-alert"), "{}").await;
    receiver.wait_for_writes(1).await;
    let alert = json_of(&requests_reach(&receiver, 1).await[0]);
    let link = alert["console_url"].as_str().unwrap_or_default();
    assert!(
        link.starts_with(&format!("https://{}/#/op/", gw.admin_addr())),
        "{link}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_lost_while_draining_is_alerted_before_the_gateway_stops() {
    let receiver = FakeUpstream::start().await;
    receiver.script(Scripted::Create);
    let route = alerted(
        "upstream_timeout = \"1s\"",
        &receiver,
        "events = [\"operation-unknown\"]",
    );
    let setup = Setup::route(&route)
        .quick()
        .server("shutdown_grace = \"5s\"");
    let mut gw = spawn_gateway_with(setup).await;
    let addr = gw.addr();
    let lost = tokio::spawn(async move { write(addr, "/hold", Some("drained-1"), "{}").await });
    gw.upstream.wait_for_requests(1).await;
    // Draining from here: the write's answer never comes, and its
    // timeout makes it `unknown` while the gateway waits for it.
    gw.begin_shutdown().await.expect("shutdown");
    lost.await
        .expect("the write's answer")
        .assert_operation_problem(504, "outcome-unknown", "unknown");
    let alerts = receiver.requests();
    assert_eq!(alerts.len(), 1, "one alert, before the gateway stopped");
    let alert = json_of(&alerts[0]);
    assert_eq!(alert["event"], "operation-unknown");
    assert_eq!(alert["key"], "drained-1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_warns_of_alerts_still_being_delivered_only_when_one_is() {
    const UNDELIVERED: &str = "alerts still being delivered at the end of the grace period";
    let dir = tempfile::tempdir().expect("tempdir");
    let (upstream, hung) = (FakeUpstream::start().await, hung_webhook().await);
    let route = format!(
        "upstream_timeout = \"5s\"\n[[alerts]]\nurl = \"{}/hook\"\nevents = [\"operation-unknown\"]",
        hung.url()
    );
    let setup = Setup::route(&route).server("shutdown_grace = \"1s\"");
    let store = dir.path().join("idemgate.db");
    let toml = gateway_toml_with(&store, &upstream.url(), &setup);
    let config = write_config(dir.path(), "idemgate.toml", &toml);

    // A write the upstream holds past the grace takes all of it, and no
    // alert is being posted meanwhile.
    let mut gateway = BinaryGateway::start(&config, &dir.path().join("held.log")).await;
    let proxy = gateway.proxy;
    // Its answer never comes: the gateway stops first.
    let _held = tokio::spawn(async move {
        let headers = [
            ("content-type", "application/json"),
            ("idempotency-key", "held-1"),
            ("authorization", ALICE),
        ];
        try_send(proxy, "POST", "/hold", &headers, "{}", WAIT).await
    });
    upstream.wait_for_requests(1).await;
    gateway.signal("TERM");
    gateway.wait_for_exit().await;
    let logged = gateway.stderr();
    assert!(
        logged.contains("forward tasks still running at the end of the grace period"),
        "{logged}"
    );
    assert!(
        !logged.contains(UNDELIVERED),
        "nothing was being posted: {logged}"
    );

    // A post the hung webhook holds at the stop outlasts the grace.
    let mut gateway = BinaryGateway::start(&config, &dir.path().join("posting.log")).await;
    let lost = write(gateway.proxy, "/drop", Some("lost-1"), "{}").await;
    lost.assert_operation_problem(502, "outcome-unknown", "unknown");
    eventually("the hung webhook holding a post", || async {
        (hung.requests() >= 1).then_some(())
    })
    .await;
    gateway.signal("TERM");
    gateway.wait_for_exit().await;
    let logged = gateway.stderr();
    assert!(logged.contains(UNDELIVERED), "{logged}");
}
