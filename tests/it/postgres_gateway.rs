//! The gateway on the PostgreSQL store, in process: the key scenarios of
//! the SQLite suites (first write, replay, reused key, a duplicate in
//! progress, wait mode, a lost response, an operator's resolution) through
//! the real gateway, and then two gateways on one schema — replicas —
//! answering each other's keys. Each test has a schema of its own
//! ([`PgSchema`]); they are `#[ignore]`d, and `.ci/run` runs them.
//! The multi-process scenarios (a replica killed, a restart) are in
//! `tests/it/replicas.rs`.
//!
//! A replica whose database link drops with a write upstream records the
//! outcome once the link is back; by then its peer may have held the
//! attempt (`replica-lost`): the late-response rule applies as to a
//! record refused at once, measured from when the response came.

use std::time::Duration;

use crate::common::*;
use http::StatusCode;

const ORDER: &str = r#"{"order":"o-1","amount":250}"#;

/// A gateway with the admin API on `schema`, `route` lines added, its
/// background tasks at the [`QUICK`] pace.
async fn gateway(schema: &PgSchema, route: &str) -> TestGateway {
    spawn_gateway_with(setup(schema, route)).await
}

fn setup(schema: &PgSchema, route: &str) -> Setup {
    Setup::route(route).postgres(schema).quick().admin()
}

/// A second gateway as `setup` says, on the same upstream as `first`: a
/// replica.
async fn replica_of(first: &TestGateway, setup: Setup) -> TestGateway {
    spawn_gateway_with(setup.upstream_url(first.upstream.url())).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn first_write_replay_and_reused_key() {
    let schema = PgSchema::create().await;
    let mut gw = gateway(&schema, "").await;
    let first = write(gw.addr(), "/orders", Some("k-1"), ORDER).await;
    assert_fresh_created(&first);
    let retry = write(gw.addr(), "/orders", Some("k-1"), ORDER).await;
    assert_replay_of(&retry, &first);
    let other = write(gw.addr(), "/orders", Some("k-1"), r#"{"order":"o-2"}"#).await;
    other.assert_operation_problem(422, "key-reused", "completed");
    assert_eq!(gw.upstream.writes(), 1);

    let op = gw.operation("k-1").await;
    assert_eq!(op["state"], "completed");
    let kinds: Vec<_> = op["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].clone())
        .collect();
    assert_eq!(kinds, ["claimed", "sent", "response"]);
    // What survives a restart is the shared store's.
    gw.restart().await;
    assert_replay_of(
        &write(gw.addr(), "/orders", Some("k-1"), ORDER).await,
        &first,
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn a_duplicate_in_progress_is_409_or_waits() {
    let schema = PgSchema::create().await;
    let mut gw = gateway(&schema, "").await;
    let slow = tokio::spawn({
        let addr = gw.addr();
        async move { write(addr, "/slow?ms=600", Some("k-slow"), ORDER).await }
    });
    gw.upstream.wait_for_writes(1).await;
    let duplicate = write(gw.addr(), "/slow?ms=600", Some("k-slow"), ORDER).await;
    duplicate.assert_operation_problem(409, "request-in-progress", "in_progress");
    assert_fresh_created(&slow.await.unwrap());
    gw.shutdown().await;

    let mut waiting = gateway(&schema, "in_progress = \"wait\"").await;
    let answers = concurrent_writes(waiting.addr(), 8, "/slow?ms=300", "k-wait", ORDER).await;
    assert_one_fresh_rest_replayed(&answers);
    assert_eq!(waiting.upstream.writes(), 1);
    waiting.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn a_lost_response_is_held_until_an_operator_resolves_it() {
    let schema = PgSchema::create().await;
    let mut gw = gateway(&schema, "").await;
    let lost = write(gw.addr(), "/drop", Some("k-lost"), ORDER).await;
    lost.assert_operation_problem(502, "outcome-unknown", "unknown");
    assert_held_unknown(&write(gw.addr(), "/drop", Some("k-lost"), ORDER).await);
    assert_eq!(gw.upstream.writes(), 1, "never re-sent");

    let op = gw.operation("k-lost").await;
    let id = op["id"].as_str().unwrap().to_string();
    let resolution = serde_json::json!({
        "outcome": "completed",
        "operator": "ann",
        "response": {"status": 201, "headers": {"x-order": "o-9"}, "body": {"id": 7}},
    });
    gw.resolved(&id, &resolution).await;
    let retry = write(gw.addr(), "/drop", Some("k-lost"), ORDER).await;
    assert!(retry.is_replay());
    assert_eq!(&retry.body[..], br#"{"id":7}"#);
    assert_eq!(gw.upstream.writes(), 1);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn replicas_answer_each_others_keys() {
    let schema = PgSchema::create().await;
    let route = "in_progress = \"wait\"";
    let mut a = gateway(&schema, route).await;
    let mut b = replica_of(&a, setup(&schema, route)).await;

    let first = write(a.addr(), "/orders", Some("k-1"), ORDER).await;
    assert_fresh_created(&first);
    assert_replay_of(
        &write(b.addr(), "/orders", Some("k-1"), ORDER).await,
        &first,
    );
    // A client asks either replica what became of its operation.
    let status = send(
        b.addr(),
        "GET",
        "/.idemgate/operations/k-1",
        &[("authorization", ALICE)],
        bytes::Bytes::new(),
    )
    .await;
    assert_eq!(status.status, StatusCode::OK, "{:?}", status.body);
    assert_eq!(status.json()["state"], "completed");
    let reused = write(b.addr(), "/orders", Some("k-1"), r#"{"order":"x"}"#).await;
    reused.assert_operation_problem(422, "key-reused", "completed");

    // Wait mode across replicas: B's duplicate waits for A's attempt.
    let slow = tokio::spawn({
        let addr = a.addr();
        async move { write(addr, "/slow?ms=700", Some("k-2"), ORDER).await }
    });
    a.upstream.wait_for_writes(2).await;
    let waited = write(b.addr(), "/slow?ms=700", Some("k-2"), ORDER).await;
    let original = slow.await.unwrap();
    assert_fresh_created(&original);
    assert_replay_of(&waited, &original);
    assert_eq!(a.upstream.writes(), 2);

    // A pause set through A holds on B from its next look at the store.
    let paused = a
        .admin(
            "POST",
            "/admin/routes/api/pause",
            r#"{"reason":"incident"}"#,
        )
        .await;
    assert_eq!(paused.status, StatusCode::OK, "{:?}", paused.body);
    next_full_pass(b.admin_addr(), "replicas").await;
    let refused = write(b.addr(), "/orders", Some("k-3"), ORDER).await;
    refused.assert_problem(503, "route-paused");
    // An operation that exists still answers for itself.
    assert!(
        write(b.addr(), "/orders", Some("k-1"), ORDER)
            .await
            .is_replay()
    );
    let resumed = b.admin("POST", "/admin/routes/api/resume", "").await;
    assert_eq!(resumed.status, StatusCode::OK);
    next_full_pass(a.admin_addr(), "replicas").await;
    assert_fresh_created(&write(a.addr(), "/orders", Some("k-3"), ORDER).await);
    assert_eq!(a.upstream.writes(), 3);
    a.shutdown().await;
    b.shutdown().await;
}

/// The operations table locked by another session (a migration, `VACUUM
/// FULL`, an operator's `LOCK TABLE`): every claim waits, then is 503,
/// while `/readyz` said ready, since it read the lease's table only. A
/// load balancer kept sending every write to a gateway refusing them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn readyz_is_503_while_a_table_a_claim_writes_is_locked() {
    let schema = PgSchema::create().await;
    let mut gw = gateway(&schema, "").await;
    let ready =
        || async { send(gw.admin_addr(), "GET", "/readyz", &[], bytes::Bytes::new()).await };
    assert_eq!(ready().await.status, StatusCode::OK);
    let mut lock = <sqlx::PgConnection as sqlx::Connection>::connect(&postgres_url())
        .await
        .unwrap();
    // Every table a claim writes (the recheck found `events` and
    // `operation_counts` missed), and a SHARE lock as a CREATE INDEX takes.
    for (table, mode) in [
        ("operations", "ACCESS EXCLUSIVE"),
        ("events", "SHARE"),
        ("operation_counts", "ACCESS EXCLUSIVE"),
    ] {
        let exclusive = format!("BEGIN; LOCK TABLE {}.{table} IN {mode} MODE", schema.name);
        sqlx::raw_sql(&exclusive).execute(&mut lock).await.unwrap();
        let locked = ready().await;
        assert_eq!(
            locked.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{table}: {:?}",
            locked.body
        );
        sqlx::raw_sql("ROLLBACK").execute(&mut lock).await.unwrap();
        assert_eq!(ready().await.status, StatusCode::OK, "{table}");
    }
    assert_fresh_created(&write(gw.addr(), "/orders", Some("k-1"), ORDER).await);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn a_replica_that_cannot_reach_the_store_refuses_writes() {
    let schema = PgSchema::create().await;
    let mut gw = gateway(&schema, "").await;
    // The schema's tables go away under the gateway: every statement fails.
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&postgres_url())
        .await
        .unwrap();
    sqlx::query(&format!(
        "ALTER SCHEMA {} RENAME TO {}_gone",
        schema.name, schema.name
    ))
    .execute(&mut conn)
    .await
    .unwrap();
    let refused = write(gw.addr(), "/orders", Some("k-1"), ORDER).await;
    refused.assert_problem(503, "store-unavailable");
    assert_eq!(gw.upstream.writes(), 0, "nothing sent without a claim");
    let ready = send(gw.admin_addr(), "GET", "/readyz", &[], bytes::Bytes::new()).await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);
    sqlx::query(&format!(
        "ALTER SCHEMA {}_gone RENAME TO {}",
        schema.name, schema.name
    ))
    .execute(&mut conn)
    .await
    .unwrap();
    assert_fresh_created(&write(gw.addr(), "/orders", Some("k-1"), ORDER).await);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn a_replica_never_replays_what_a_peer_superseded() {
    let schema = PgSchema::create().await;
    let route = "key = \"derive\"\nderive_window = \"1s\"";
    // One clock for both replicas, moved by the test.
    let clock = idemgate_model::clock::ManualClock::new();
    let mut a = spawn_gateway_with(setup(&schema, route).clock(clock.clone())).await;
    let mut b = replica_of(&a, setup(&schema, route).clock(clock.clone())).await;
    let first = write(a.addr(), "/orders", None, ORDER).await;
    assert_eq!(assert_fresh_created(&first), 1);
    let key = first
        .header("idempotency-key")
        .expect("derived key")
        .to_string();
    assert_replay_of(&write(a.addr(), "/orders", None, ORDER).await, &first);

    // After the window the same request is a new operation, made on B.
    clock.advance(Duration::from_millis(1200));
    let second = write(b.addr(), "/orders", None, ORDER).await;
    assert_eq!(assert_fresh_created(&second), 2);
    // A answers the key with the operation the store holds now.
    assert_replay_of(
        &write(a.addr(), "/orders", Some(&key), ORDER).await,
        &second,
    );
    assert_eq!(a.upstream.writes(), 2);
    a.shutdown().await;
    b.shutdown().await;
}

/// `store.require_synchronous_standby` on a server without one (the
/// suite's: no `synchronous_standby_names`): every write is refused,
/// nothing sent, `/readyz` is 503 saying why, and the stats and
/// metrics show the replication read. Without it, the same server serves,
/// and shows the same reading.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn writes_wait_for_a_synchronous_standby_when_one_is_required() {
    let schema = PgSchema::create().await;
    let gw = spawn_gateway_with(
        setup(&schema, "")
            .durable()
            .store("require_synchronous_standby = true"),
    )
    .await;
    let refused = write(gw.addr(), "/orders", Some("k-1"), ORDER).await;
    refused.assert_problem(503, "store-unavailable");
    assert_eq!(gw.upstream.write_requests().len(), 0, "nothing sent");
    let ready = admin_call(gw.admin_addr(), "GET", "/readyz", None, "").await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);
    let said = String::from_utf8_lossy(&ready.body);
    assert!(
        said.contains("writes are refused: the store's server has no synchronous_standby_names"),
        "{ready:?}"
    );
    assert!(!said.contains("busy"), "{ready:?}");
    let stats = gw.admin("GET", "/admin/stats", "").await.json();
    assert_eq!(
        stats["replication"],
        serde_json::json!({
            "in_recovery": false,
            "synchronous_standby_names": "",
            "synchronous_standbys": 0,
            "synchronous_standby_required": true,
        })
    );
    let token = gw.admin_token().to_string();
    let metrics = admin_call(gw.admin_addr(), "GET", "/metrics", Some(&token), "").await;
    let text = String::from_utf8_lossy(&metrics.body);
    for series in [
        "idemgate_store_in_recovery 0",
        "idemgate_store_synchronous_standbys 0",
        "idemgate_store_synchronous_standby_required 1",
    ] {
        assert!(text.lines().any(|l| l == series), "{series} in:\n{text}");
    }

    let served = gateway(&schema, "").await;
    let first = write(served.addr(), "/orders", Some("k-2"), ORDER).await;
    assert_fresh_created(&first);
    let stats = served.admin("GET", "/admin/stats", "").await.json();
    assert_eq!(stats["replication"]["synchronous_standby_required"], false);
    assert_eq!(stats["replication"]["in_recovery"], false);
    // What the store holds is still answered where writes are refused.
    assert_replay_of(
        &write(gw.addr(), "/orders", Some("k-2"), ORDER).await,
        &first,
    );
    let reused = write(gw.addr(), "/orders", Some("k-2"), r#"{"order":"o-9"}"#).await;
    reused.assert_operation_problem(422, "key-reused", "completed");
    assert_eq!(gw.upstream.write_requests().len(), 0, "nothing sent");
}

/// A claim whose answer never came (here: the database held it behind a
/// table lock past the batch's bound, and committed it afterwards) is
/// found out and released: the client heard 503, nothing was sent, and
/// its retry is sent once — never `in_progress` under this replica's live
/// lease with nobody working on it (409 forever, before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn a_claim_committed_after_its_answer_was_lost_is_released() {
    use sqlx::Connection;
    let schema = PgSchema::create().await;
    let gw = gateway(&schema, "").await;
    let mut lock = sqlx::PgConnection::connect(&schema.url)
        .await
        .expect("connect");
    let mut held = lock.begin().await.expect("begin");
    sqlx::query("LOCK TABLE operations IN EXCLUSIVE MODE")
        .execute(&mut *held)
        .await
        .expect("lock");
    let lost = write(gw.addr(), "/orders", Some("k-lost"), ORDER).await;
    lost.assert_problem(503, "store-unavailable");
    // The gateway's first look for the claim waits behind the lock too;
    // cancelled there, it must look again, on its backoff.
    let mut watcher = sqlx::PgConnection::connect(&schema.url)
        .await
        .expect("connect");
    let watching = tokio::sync::Mutex::new(&mut watcher);
    eventually("the first look to wait behind the lock", || async {
        let cancelled: Vec<bool> = sqlx::query_scalar(
            "SELECT pg_cancel_backend(pid) FROM pg_stat_activity
             WHERE wait_event_type = 'Lock' AND query LIKE '%claim-unanswered%'",
        )
        .fetch_all(&mut **watching.lock().await)
        .await
        .expect("pg_stat_activity");
        cancelled.contains(&true).then_some(())
    })
    .await;
    held.commit().await.expect("unlock");
    // The claim commits once the lock is gone: until then there is none.
    // A retry that finds it before the look does hears 503 and wakes the
    // look — never 409 `request-in-progress`, which says an attempt is in
    // flight (one of its own, until the look's next try, before).
    let committed: String = eventually("the claim to commit", || async {
        sqlx::query_scalar("SELECT state FROM operations WHERE idem_key = 'k-lost'")
            .fetch_optional(&mut **watching.lock().await)
            .await
            .expect("operations")
    })
    .await;
    if committed == "in_progress" {
        let early = write(gw.addr(), "/orders", Some("k-lost"), ORDER).await;
        if early.status != StatusCode::CREATED {
            early.assert_problem(503, "store-unavailable");
        }
    }
    if gw.upstream.writes() == 0 {
        let released = eventually("the claim to be released", || async {
            let operation = gw.try_operation("k-lost").await?;
            (operation["state"] == "not_attempted").then_some(operation)
        })
        .await;
        assert_eq!(released["evidence"], "claim-unanswered", "{released}");
        assert_fresh_created(&write(gw.addr(), "/orders", Some("k-lost"), ORDER).await);
    }
    assert_eq!(gw.upstream.writes(), 1);
    let operation = gw.operation("k-lost").await;
    let kinds: Vec<_> = operation["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["kind"].as_str().unwrap_or_default())
        .collect();
    assert!(kinds.contains(&"claim-unanswered"), "{operation}");
}

/// `url` (the test server's, or a schema's in it) through the relay on
/// 127.0.0.1:`port`.
fn through_relay(url: &str, port: u16) -> String {
    let (user, rest) = url.split_once('@').expect("a user in the URL");
    let (_, path) = rest.split_once('/').expect("a database in the URL");
    format!("{user}@127.0.0.1:{port}/{path}")
}

/// The port of the test server's URL.
fn server_port(url: &str) -> u16 {
    let (_, rest) = url.split_once('@').expect("a user in the URL");
    let (authority, _) = rest.split_once('/').expect("a database in the URL");
    let (_, port) = authority.rsplit_once(':').unwrap_or(("", "5432"));
    port.parse().expect("a port")
}

/// A released answer (503) that could be recorded only once the database
/// link came back still goes to the duplicates waiting on its attempt, as
/// one recorded at once does: they send nothing (docs/requests.md,
/// "Waiting duplicates": an upstream that asked to back off sees one
/// attempt per client retry, not one per waiter).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn waiters_of_a_release_recorded_late_get_it_and_send_nothing() {
    let schema = PgSchema::create().await;
    let server = server_port(&postgres_url());
    let link = TcpRelay::start(server).await;
    let gw = spawn_gateway_with(
        Setup::route("in_progress = \"wait\"\nwait_timeout = \"12s\"")
            .shared_store(
                &through_relay(&schema.url, link.port()),
                &schema.scope_key_file,
            )
            .admin(),
    )
    .await;
    let path = "/slow-then/503?ms=600";
    let first = tokio::spawn({
        let addr = gw.addr();
        async move { write(addr, path, Some("k-released"), ORDER).await }
    });
    gw.upstream.wait_for_requests(1).await;
    let nowhere = closed_port().await;
    link.move_to(nowhere.port());
    // A duplicate while the attempt is in flight waits on it.
    let waiter = tokio::spawn({
        let addr = gw.addr();
        async move { write(addr, path, Some("k-released"), ORDER).await }
    });
    let first = first.await.expect("first write");
    first.assert_problem(503, "store-unavailable");
    link.move_to(server);
    let waiter = waiter.await.expect("the waiter");
    assert_eq!(waiter.status, StatusCode::SERVICE_UNAVAILABLE, "{waiter:?}");
    assert_eq!(
        gw.upstream.write_requests().len(),
        1,
        "the waiter sent nothing of its own"
    );
    let op = gw.operation("k-released").await;
    assert_eq!(op["state"], "not_attempted", "{op}");
}

/// A's database link drops while its write is upstream. The response
/// comes and cannot be recorded (its client hears 503); B marks the
/// attempt `replica-lost` once A's lease runs out; the link comes back
/// more than `late_window` after the mark. The response came within
/// `late_window` of the mark, so A's late record settles the operation
/// `completed` (`late-response`), as a record refused at once does: what
/// docs/replicas.md, "A client hears what the store holds", says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn a_response_recorded_once_the_link_is_back_settles_what_a_peer_held() {
    let schema = PgSchema::create().await;
    let server = server_port(&postgres_url());
    let link = TcpRelay::start(server).await;
    let route = "late_window = \"2s\"";
    let lease = "lease = \"1s\"";
    let a_setup = Setup::route(route)
        .shared_store(
            &through_relay(&schema.url, link.port()),
            &schema.scope_key_file,
        )
        .store(lease)
        .quick()
        .admin();
    let mut a = spawn_gateway_with(a_setup).await;
    let mut b = replica_of(&a, setup(&schema, route).store(lease)).await;

    let first = tokio::spawn({
        let addr = a.addr();
        async move { write(addr, "/slow?ms=1000", Some("k-cut"), ORDER).await }
    });
    a.upstream.wait_for_requests(1).await;
    let nowhere = closed_port().await;
    link.move_to(nowhere.port());
    let first = first.await.expect("first write");
    first.assert_problem(503, "store-unavailable");

    let held = eventually("B to hold A's attempt", || async {
        let op = b.try_operation("k-cut").await?;
        (op["state"] == "unknown").then_some(op)
    })
    .await;
    assert_eq!(held["evidence"], "replica-lost", "{held}");
    let marked: i64 = sqlx::query_scalar(&format!(
        "SELECT updated_at FROM {}.operations WHERE idem_key = 'k-cut'",
        schema.name
    ))
    .fetch_one(&mut admin_connection().await)
    .await
    .expect("the marked operation");
    // Back later than the window after the mark: only when the response
    // came decides.
    system_clock_past(marked + 2_500).await;
    link.move_to(server);

    // A's record lands (stale: its events are kept), then the rule.
    eventually("A's late record", || async {
        let op = b.try_operation("k-cut").await?;
        (!events_of(&op, "response").is_empty()).then_some(())
    })
    .await;
    let settled = within_wait(|| async {
        let op = b.try_operation("k-cut").await?;
        (op["state"] != "unknown").then_some(op)
    })
    .await;
    let settled = match settled {
        Some(op) => op,
        None => b.operation("k-cut").await,
    };
    assert_eq!(
        (&settled["state"], &settled["evidence"]),
        (&"completed".into(), &"late-response".into()),
        "{settled}"
    );
    let late = events_of(&settled, "late-response");
    assert_eq!(late.len(), 1, "{settled}");
    assert_eq!(late[0]["held_as"], "replica-lost");
    let retry = write(b.addr(), "/slow?ms=1000", Some("k-cut"), ORDER).await;
    assert!(retry.is_replay(), "{:?}", retry.body);
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(a.upstream.writes(), 1);
    a.shutdown().await;
    b.shutdown().await;
}
