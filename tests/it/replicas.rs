//! Replicas as real processes: two `idemgate serve` binaries on one
//! PostgreSQL schema ([`PgSchema`]) in front of one fake upstream.
//!
//! - 32 concurrent duplicates of each of 200 keys, split across both
//!   replicas: exactly one upstream write per key;
//! - wait mode across replicas: a duplicate on one waits for the other's
//!   attempt and replays it; if that attempt is refused (429) the
//!   waiters get 503 `attempt-not-made` and send nothing; `max_waiters`
//!   of them wait, more get 409 at once;
//! - a replica SIGKILLed mid-request: once its lease runs out the other
//!   reports the operation `unknown` (`replica-lost`) and never re-sends
//!   it; restarted with the same config, the replica rejoins;
//! - a replica whose lease ran low while it retried a connect sends
//!   nothing (503 `lease-lost`), even after its peer marked the operation
//!   lost, an operator resolved it and the retry went through the peer;
//! - a replica frozen (SIGSTOP) with a write upstream, marked lost by its
//!   peer: its client hears what the store holds — the late response
//!   settles the operation within `late_window`, else 409 `outcome-unknown`;
//! - retention sweeps wait for the replica that holds the sweep lock;
//! - `idemgate migrate` run by several at once prepares the schema once.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use crate::common::*;
use http::StatusCode;
use tokio::task::JoinSet;

const BODY: &str = r#"{"order":"o-1","amount":250}"#;
const ADMIN_TOKEN: &str = "replicas-test-admin-token";

/// A lease short enough for a test to wait out, for the tests about lost
/// replicas.
const SHORT_LEASE: &str = "lease = \"1s\"";
/// The default lease, for tests that lose no replica: a loaded machine
/// never costs them a lease.
const LEASE: &str = "";

/// Two replicas' config: the shared schema, `store` lines (with the
/// lease), `route` lines.
fn replica_config(
    dir: &Path,
    schema: &PgSchema,
    upstream_url: &str,
    route: &str,
    store: &str,
) -> std::path::PathBuf {
    let setup = Setup::route(route)
        .postgres(schema)
        .store(store)
        .server("admin_token_env = \"IDEMGATE_REPLICAS_TEST_TOKEN\"");
    let toml = gateway_toml_with(&dir.join("unused.db"), upstream_url, &setup);
    write_config(dir, "replica.toml", &toml)
}

async fn start_replica(config: &Path, log: &Path) -> BinaryGateway {
    let mut cmd = binary();
    cmd.arg("serve")
        .arg("--config")
        .arg(config)
        .env("IDEMGATE_REPLICAS_TEST_TOKEN", ADMIN_TOKEN);
    BinaryGateway::spawn(cmd, log).await
}

/// Two replicas on a schema of their own, and what they share.
struct Replicas {
    a: BinaryGateway,
    b: BinaryGateway,
    upstream: FakeUpstream,
    config: std::path::PathBuf,
    dir: tempfile::TempDir,
    // Last: dropped after the processes are killed.
    schema: PgSchema,
}

impl Replicas {
    /// With the default lease; [`Replicas::start_with`] names one.
    async fn start(route: &str) -> Replicas {
        Replicas::start_with(route, LEASE).await
    }

    /// Like [`Replicas::start`], with `store` lines.
    async fn start_with(route: &str, store: &str) -> Replicas {
        let schema = PgSchema::create().await;
        let upstream = FakeUpstream::start().await;
        let dir = tempfile::tempdir().expect("tempdir");
        let config = replica_config(dir.path(), &schema, &upstream.url(), route, store);
        let a = start_replica(&config, &dir.path().join("a.log")).await;
        let b = start_replica(&config, &dir.path().join("b.log")).await;
        Replicas {
            a,
            b,
            upstream,
            config,
            dir,
            schema,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn duplicates_across_replicas_reach_the_upstream_once_per_key() {
    let replicas = Replicas::start("").await;
    let (upstream, a, b) = (&replicas.upstream, replicas.a, replicas.b);

    const KEYS: usize = 200;
    const DUPLICATES: usize = 32;
    // Eight keys at a time: 256 requests in flight, every key's 32 at once.
    let mut fresh: HashMap<String, usize> = HashMap::new();
    for wave in 0..KEYS / 8 {
        let mut requests = JoinSet::new();
        for k in 0..8 {
            let key = format!("key-{}", wave * 8 + k);
            for d in 0..DUPLICATES {
                let addr = if d % 2 == 0 { a.proxy } else { b.proxy };
                let key = key.clone();
                requests.spawn(async move {
                    let resp = write(addr, "/orders?ms=20", Some(&key), BODY).await;
                    (key, resp)
                });
            }
        }
        while let Some(done) = requests.join_next().await {
            let (key, resp) = done.expect("request task");
            match resp.status.as_u16() {
                201 if !resp.is_replay() => *fresh.entry(key).or_default() += 1,
                201 => {}
                409 => {
                    resp.assert_operation_problem(409, "request-in-progress", "in_progress");
                }
                other => panic!("{key}: {other} {:?}", resp.body),
            }
        }
    }
    assert_eq!(fresh.len(), KEYS, "every key had its fresh answer");
    assert!(fresh.values().all(|n| *n == 1), "one fresh answer per key");
    let mut writes: HashMap<String, usize> = HashMap::new();
    for request in upstream.write_requests() {
        let key = request
            .header("idempotency-key")
            .expect("key forwarded")
            .to_string();
        *writes.entry(key).or_default() += 1;
    }
    assert_eq!(writes.len(), KEYS);
    assert!(
        writes.values().all(|n| *n == 1),
        "exactly one upstream write per key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn a_duplicate_waits_for_the_other_replicas_attempt() {
    let replicas = Replicas::start("in_progress = \"wait\"").await;
    let (upstream, a, b) = (&replicas.upstream, replicas.a, replicas.b);

    let proxy = a.proxy;
    let original =
        tokio::spawn(async move { write(proxy, "/slow?ms=800", Some("w-1"), BODY).await });
    upstream.wait_for_writes(1).await;
    let mut waiting = JoinSet::new();
    for _ in 0..4 {
        let proxy = b.proxy;
        waiting.spawn(async move { write(proxy, "/slow?ms=800", Some("w-1"), BODY).await });
    }
    let original = original.await.unwrap();
    assert_fresh_created(&original);
    for waited in waiting.join_all().await {
        assert_replay_of(&waited, &original);
    }
    assert_eq!(upstream.writes(), 1);
}

/// A write to `path` through replica `a`, and once the upstream has it,
/// `duplicates` of it through replica `b`, waiting: the original's answer
/// and theirs.
async fn waited_on_through_the_other_replica(
    replicas: &Replicas,
    path: &'static str,
    duplicates: usize,
) -> (Response, Vec<Response>) {
    let proxy = replicas.a.proxy;
    let original = tokio::spawn(async move { write(proxy, path, Some("w-2"), BODY).await });
    replicas.upstream.wait_for_requests(1).await;
    let mut waiting = JoinSet::new();
    for _ in 0..duplicates {
        let proxy = replicas.b.proxy;
        waiting.spawn(async move { write(proxy, path, Some("w-2"), BODY).await });
    }
    let original = original.await.unwrap();
    (original, waiting.join_all().await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn waiters_on_the_other_replicas_refused_attempt_send_nothing() {
    let replicas = Replicas::start("in_progress = \"wait\"").await;
    // The upstream refuses the first write under the key (429, nothing
    // done) after a moment; it would take the next.
    let (original, waited) =
        waited_on_through_the_other_replica(&replicas, "/once/429?ms=800", 4).await;
    assert_eq!(original.status, StatusCode::TOO_MANY_REQUESTS);
    for waiter in &waited {
        let problem = waiter.assert_operation_problem(503, "attempt-not-made", "not_attempted");
        assert!(
            problem["detail"].as_str().unwrap().contains("released-429"),
            "{problem}"
        );
    }
    assert_eq!(
        replicas.upstream.write_requests().len(),
        1,
        "one attempt for the client, none for its waiters"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn waiters_on_the_other_replica_are_bounded_by_max_waiters() {
    let replicas = Replicas::start("in_progress = \"wait\"\nmax_waiters = 2").await;
    let (original, waited) =
        waited_on_through_the_other_replica(&replicas, "/slow?ms=1500", 5).await;
    assert_fresh_created(&original);
    let (replayed, refused): (Vec<_>, Vec<_>) = waited.iter().partition(|r| r.is_replay());
    assert_eq!(replayed.len(), 2, "max_waiters waited");
    for waiter in replayed {
        assert_replay_of(waiter, &original);
    }
    for waiter in refused {
        waiter.assert_operation_problem(409, "request-in-progress", "in_progress");
    }
    assert_eq!(replicas.upstream.writes(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn a_killed_replicas_request_is_unknown_and_the_replica_rejoins() {
    let replicas = Replicas::start_with("", SHORT_LEASE).await;
    let (upstream, mut a, b) = (&replicas.upstream, replicas.a, replicas.b);
    let done = write(a.proxy, "/orders", Some("done-1"), BODY).await;
    assert_fresh_created(&done);

    // The upstream commits and holds the request; A dies with it in flight.
    let proxy = a.proxy;
    let in_flight = tokio::spawn(async move { write(proxy, "/hold", Some("held-1"), BODY).await });
    upstream.wait_for_writes(2).await;
    a.kill();
    in_flight.abort();

    // B: in progress while A's lease may still run, then unknown.
    let held = write_until(b.proxy, "/hold", "held-1", BODY, WAIT, |r| {
        r.status == StatusCode::CONFLICT && r.json()["state"] == "unknown"
    })
    .await;
    held.assert_operation_problem(409, "outcome-unknown", "unknown");
    let op = operation_at(b.admin, ADMIN_TOKEN, "held-1").await;
    assert_eq!(op["state"], "unknown");
    assert_eq!(op["evidence"], "replica-lost");
    assert_eq!(events_of(&op, "owner-lost").len(), 1, "{op}");
    assert_held_unknown(&write(b.proxy, "/hold", Some("held-1"), BODY).await);
    assert_eq!(upstream.writes(), 2, "never re-sent");

    // Restarted with the same config, A rejoins and shares everything.
    let log = replicas.dir.path().join("a-again.log");
    let a = start_replica(&replicas.config, &log).await;
    assert_replay_of(
        &write(a.proxy, "/orders", Some("done-1"), BODY).await,
        &done,
    );
    assert_held_unknown(&write(a.proxy, "/hold", Some("held-1"), BODY).await);
    let fresh = write(a.proxy, "/orders", Some("after-1"), BODY).await;
    assert_fresh_created(&fresh);
    assert_replay_of(
        &write(b.proxy, "/orders", Some("after-1"), BODY).await,
        &fresh,
    );
    let ready = send(a.admin, "GET", "/readyz", &[], bytes::Bytes::new()).await;
    assert_eq!(ready.status, StatusCode::OK);
    assert_eq!(upstream.writes(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn migrate_run_by_several_at_once_prepares_the_schema_once() {
    let schema = PgSchema::create().await;
    let mut runs = JoinSet::new();
    for _ in 0..3 {
        let mut cmd = binary();
        cmd.args(["migrate", "--store", &schema.url]);
        runs.spawn(run_to_exit(cmd));
    }
    for (status, stdout, stderr) in runs.join_all().await {
        assert!(status.success(), "{stderr}");
        assert!(stdout.starts_with("migrated postgres://"), "{stdout}");
    }
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&postgres_url())
        .await
        .expect("connect");
    let applied: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM {}._sqlx_migrations WHERE success",
        schema.name
    ))
    .fetch_one(&mut conn)
    .await
    .expect("migrations table");
    assert_eq!(applied, postgres_migrations(), "each applied once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn replicas_sweep_only_while_no_one_else_does() {
    let replicas = Replicas::start_with("", "retention = \"1s\"").await;
    // Held here as a sweeping replica holds it.
    let mut sweeping = <sqlx::PgConnection as sqlx::Connection>::connect(&postgres_url())
        .await
        .expect("connect");
    let lock = "SELECT pg_advisory_lock(hashtext($1 || ':idemgate-sweep'))";
    sqlx::query(lock)
        .bind(&replicas.schema.name)
        .execute(&mut sweeping)
        .await
        .expect("sweep lock");
    for i in 0..10 {
        let proxy = if i % 2 == 0 {
            replicas.a.proxy
        } else {
            replicas.b.proxy
        };
        assert_fresh_created(&write(proxy, "/orders", Some(&format!("old-{i}")), BODY).await);
    }
    let count = format!("SELECT count(*) FROM {}.operations", replicas.schema.name);
    // All expired once their clock is 1 s past the newest; then a whole
    // sweep of each replica, which finds the lock held and waits.
    let newest: i64 = sqlx::query_scalar(&format!(
        "SELECT max(updated_at) FROM {}.operations",
        replicas.schema.name
    ))
    .fetch_one(&mut sweeping)
    .await
    .unwrap();
    system_clock_past(newest + 1000).await;
    tokio::join!(
        next_full_pass(replicas.a.admin, "retention"),
        next_full_pass(replicas.b.admin, "retention"),
    );
    let kept: i64 = sqlx::query_scalar(&count)
        .fetch_one(&mut sweeping)
        .await
        .unwrap();
    assert_eq!(kept, 10, "no replica swept while another held the lock");

    let unlock = "SELECT pg_advisory_unlock(hashtext($1 || ':idemgate-sweep'))";
    sqlx::query(unlock)
        .bind(&replicas.schema.name)
        .execute(&mut sweeping)
        .await
        .expect("unlock");
    let sweeping = tokio::sync::Mutex::new(sweeping);
    eventually("the expired operations to be swept", || async {
        let left: i64 = sqlx::query_scalar(&count)
            .fetch_one(&mut *sweeping.lock().await)
            .await
            .unwrap();
        (left == 0).then_some(())
    })
    .await;
}

/// A connection to the test database, for what a test does to the store
/// behind the replicas' backs.
async fn database() -> sqlx::PgConnection {
    use sqlx::Connection;
    sqlx::PgConnection::connect(&postgres_url())
        .await
        .expect("connect to the test database")
}

/// Polls `key`'s operation through the admin API at `admin` (once there
/// is one) until `done`.
async fn operation_until(
    admin: std::net::SocketAddr,
    key: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let path = format!("/admin/keys?key={key}");
        let listed = admin_call(admin, "GET", &path, Some(ADMIN_TOKEN), "").await;
        if listed.status == StatusCode::OK && listed.json()["items"][0].is_object() {
            let op = operation_at(admin, ADMIN_TOKEN, key).await;
            if done(&op) {
                return op;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{key} still {:?}",
            listed.body
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn a_replica_past_its_lease_sends_nothing() {
    let schema = PgSchema::create().await;
    // The upstream refuses connections at first: A keeps retrying.
    let port = closed_port().await;
    // A late window of a millisecond: the operator below may resolve the
    // held write `not_attempted` as soon as B holds it.
    let route = "connect_retries = 10\nlate_window = \"1ms\"\nupstream_timeout = \"1s\"";
    let (_dir, a, b, first, claimed) =
        claimed_through_a(&schema, &format!("http://{port}"), route, "fenced-1").await;
    let id = claimed["id"].as_str().expect("id").to_string();

    let mut stall = stall_lease_of(&schema, "fenced-1").await;

    // Past A's lease: held (B marks it `replica-lost`) or settled by A
    // itself as never sent (before B's mark, or after it once fenced);
    // an operator who finds nothing at the destination resolves a held
    // one `not_attempted`, as docs/replicas.md says.
    let settled = operation_until(b.admin, "fenced-1", |op| op["state"] != "in_progress").await;
    if settled["state"] == "unknown" {
        assert_eq!(settled["evidence"], "replica-lost", "{settled}");
        let path = format!("/admin/keys/{id}/resolve");
        let resolve = || {
            admin_call(
                b.admin,
                "POST",
                &path,
                Some(ADMIN_TOKEN),
                r#"{"outcome": "not_attempted", "operator": "ann"}"#,
            )
        };
        let mut resolved = resolve().await;
        // An exchange A handed over before its lease lapsed may land for
        // `upstream_timeout` and the late window after B marked it: the
        // operator is told until when, and waits that out (the bound the
        // refusal's Retry-After gives, at most a few seconds here).
        if resolved.status == StatusCode::CONFLICT {
            let wait = resolved
                .header("retry-after")
                .and_then(|s| s.parse::<u64>().ok());
            let wait = wait.unwrap_or_else(|| panic!("told until when: {:?}", resolved.body));
            assert!(wait <= 5, "upstream_timeout and late_window: {wait} s");
            tokio::time::sleep(Duration::from_secs(wait) + Duration::from_millis(100)).await;
            resolved = resolve().await;
        }
        // Unless A, fenced meanwhile, settled it as never sent first.
        if resolved.status != StatusCode::OK {
            resolved.assert_problem(409, "not-resolvable");
            let op = operation_at(b.admin, ADMIN_TOKEN, "fenced-1").await;
            assert_eq!(
                (&op["state"], &op["evidence"]),
                (&"not_attempted".into(), &"lease-lost".into()),
                "{op}"
            );
        }
    } else {
        assert_eq!(
            (&settled["state"], &settled["evidence"]),
            (&"not_attempted".into(), &"lease-lost".into()),
            "{settled}"
        );
    }

    // The upstream comes up; the client's retry goes through B and sends
    // attempt 2, while A would still be retrying its connect.
    let upstream = FakeUpstream::start_on(port.release()).await;
    let retried = write_until(b.proxy, "/orders", "fenced-1", BODY, WAIT, |r| {
        r.status == StatusCode::CREATED
    })
    .await;
    assert_fresh_created(&retried);

    // A's own attempt ends without a byte sent: its client hears so.
    let first = tokio::time::timeout(WAIT * 2, first)
        .await
        .expect("A's attempt ends")
        .expect("request task");
    first.assert_operation_problem(503, "lease-lost", "not_attempted");
    assert_eq!(upstream.writes(), 1, "one write for one key");
    sqlx::query("ROLLBACK").execute(&mut stall).await.unwrap();

    // A renews again and serves; the key is a replay everywhere.
    let again = write_until(a.proxy, "/orders", "fenced-1", BODY, WAIT, |r| {
        r.status == StatusCode::CREATED
    })
    .await;
    assert_replay_of(&again, &retried);
    assert_eq!(upstream.writes(), 1);
    drop((a, b));
}

/// A replica fenced before writing a byte of its attempt, after its peer
/// held the attempt `unknown` (`replica-lost`): its client heard 503
/// `lease-lost`, `not_attempted`, while the store kept the peer's
/// `unknown` until an operator came. The owner, which knows it sent
/// nothing, settles it `not_attempted` (`lease-lost`): what its client
/// heard is what the store holds, and a retry is a new attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn a_fenced_replica_settles_what_its_peer_held_as_never_sent() {
    let schema = PgSchema::create().await;
    // A TLS upstream that takes connections and never answers their
    // handshake: A's connect lasts its whole connect_timeout, past its
    // lease and B's mark, and writes nothing.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = silent.local_addr().expect("addr").port();
    let accepting = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            open.push(socket);
        }
    });
    let url = format!("https://127.0.0.1:{port}");
    let route = "connect_timeout = \"4s\"\nconnect_retries = 1\nupstream_timeout = \"1s\"";
    let (_dir, a, b, first, _) = claimed_through_a(&schema, &url, route, "fenced-2").await;
    let stall = stall_lease_of(&schema, "fenced-2").await;
    let marked = operation_until(b.admin, "fenced-2", |op| op["state"] != "in_progress").await;
    assert_eq!(
        (&marked["state"], &marked["evidence"]),
        (&"unknown".into(), &"replica-lost".into()),
        "B holds it first: {marked}"
    );
    let first = tokio::time::timeout(WAIT * 2, first)
        .await
        .expect("A's attempt ends")
        .expect("request task");
    first.assert_operation_problem(503, "lease-lost", "not_attempted");
    let settled = operation_until(b.admin, "fenced-2", |op| op["state"] != "unknown").await;
    assert_eq!(
        (&settled["state"], &settled["evidence"]),
        (&"not_attempted".into(), &"lease-lost".into()),
        "{settled}"
    );
    drop(stall);
    accepting.abort();
    drop((a, b));
}

/// Replicas A and B on `schema` before `url` (with `route`'s settings and
/// a short lease), and a write of `key` through A, once B sees it
/// claimed: the dir their config is in, both, the write's task, and the
/// claimed operation as B shows it.
async fn claimed_through_a(
    schema: &PgSchema,
    url: &str,
    route: &str,
    key: &'static str,
) -> (
    tempfile::TempDir,
    BinaryGateway,
    BinaryGateway,
    tokio::task::JoinHandle<Response>,
    serde_json::Value,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = replica_config(dir.path(), schema, url, route, SHORT_LEASE);
    let a = start_replica(&config, &dir.path().join("a.log")).await;
    let b = start_replica(&config, &dir.path().join("b.log")).await;
    let proxy = a.proxy;
    let first = tokio::spawn(async move { write(proxy, "/orders", Some(key), BODY).await });
    let claimed = operation_until(b.admin, key, |op| op["state"] == "in_progress").await;
    (dir, a, b, first, claimed)
}

/// Stalls the database link of the replica that owns `key`'s operation:
/// its `replicas` row is held by the transaction returned, so it cannot
/// renew its lease, while everything else goes on; rolled back (or
/// dropped) to let it renew again.
async fn stall_lease_of(schema: &PgSchema, key: &str) -> sqlx::PgConnection {
    let mut stall = database().await;
    sqlx::query("BEGIN").execute(&mut stall).await.unwrap();
    let owner: String = sqlx::query_scalar(&format!(
        "SELECT owner FROM {}.operations WHERE idem_key = $1",
        schema.name
    ))
    .bind(key)
    .fetch_one(&mut stall)
    .await
    .unwrap();
    sqlx::query(&format!(
        "SELECT 1 FROM {}.replicas WHERE id = $1 FOR UPDATE",
        schema.name
    ))
    .bind(&owner)
    .execute(&mut stall)
    .await
    .unwrap();
    stall
}

/// A replica frozen (SIGSTOP) while `/slow` holds its write, until its
/// peer marks the operation lost; then, once the clock is `after` past the
/// mark, thawed.
async fn freeze_a_replica_mid_write(route: &str, after: Duration) -> (Response, Replicas) {
    let replicas = Replicas::start_with(route, SHORT_LEASE).await;
    let proxy = replicas.a.proxy;
    let first =
        tokio::spawn(async move { write(proxy, "/slow?ms=300", Some("frozen-1"), BODY).await });
    replicas.upstream.wait_for_writes(1).await;
    replicas.a.signal("STOP");
    operation_until(replicas.b.admin, "frozen-1", |op| op["state"] == "unknown").await;
    let marked: i64 = sqlx::query_scalar(&format!(
        "SELECT updated_at FROM {}.operations WHERE idem_key = 'frozen-1'",
        replicas.schema.name
    ))
    .fetch_one(&mut database().await)
    .await
    .expect("the marked operation");
    system_clock_past(marked + idemgate_model::clock::millis(after)).await;
    replicas.a.signal("CONT");
    let first = tokio::time::timeout(WAIT, first)
        .await
        .expect("A answers once thawed")
        .expect("request task");
    (first, replicas)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn a_frozen_replicas_late_response_settles_what_its_peer_held() {
    let (first, replicas) = freeze_a_replica_mid_write("", Duration::ZERO).await;
    // What A's client got is what the store holds: completed by the late
    // response, replayed through either replica.
    assert_fresh_created(&first);
    let op = operation_at(replicas.b.admin, ADMIN_TOKEN, "frozen-1").await;
    assert_eq!(
        (&op["state"], &op["evidence"]),
        (&"completed".into(), &"late-response".into()),
        "{op}"
    );
    // A serves again once it has renewed the lease it lost while frozen.
    eventually("the thawed replica ready again", || async {
        let ready = send(replicas.a.admin, "GET", "/readyz", &[], bytes::Bytes::new()).await;
        (ready.status == StatusCode::OK).then_some(())
    })
    .await;
    for proxy in [replicas.a.proxy, replicas.b.proxy] {
        assert_replay_of(
            &write(proxy, "/slow?ms=300", Some("frozen-1"), BODY).await,
            &first,
        );
    }
    assert_eq!(replicas.upstream.writes(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn a_frozen_replicas_response_past_the_late_window_is_not_told() {
    let late_window = Duration::from_secs(1);
    let frozen = freeze_a_replica_mid_write("late_window = \"1s\"", late_window).await;
    let (first, replicas) = frozen;
    // The store holds it unknown: so does what A's client hears.
    first.assert_operation_problem(409, "outcome-unknown", "unknown");
    let op = operation_at(replicas.b.admin, ADMIN_TOKEN, "frozen-1").await;
    assert_eq!(op["state"], "unknown", "{op}");
    let kept = events_of(&op, "outcome-not-recorded");
    assert_eq!(kept.len(), 1, "{op}");
    assert_eq!(kept[0]["status"], 201, "the operator sees what came back");
    assert_held_unknown(&write(replicas.b.proxy, "/slow?ms=300", Some("frozen-1"), BODY).await);
    assert_eq!(replicas.upstream.writes(), 1);
}
