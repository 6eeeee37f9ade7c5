//! The PostgreSQL store's promises between replicas, store by store on one
//! schema ([`PgSchema`]):
//!
//! - a replica whose lease ran out is dead: its `in_progress` operations
//!   become `unknown` (`replica-lost`), each exactly once however many live
//!   peers look, and an operator may then resolve them;
//! - a live peer's operations are never touched, nor resolvable;
//! - a replica that cannot renew stops claiming while the database still
//!   counts its lease (answering what the store holds), and claims again
//!   once it renews;
//! - one replica sweeps at a time, and a sweep never deletes an operation
//!   a claim takes for its next attempt meanwhile; a record of an
//!   operation a sweep deletes meanwhile is stale; replicas starting
//!   together migrate once.

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use idemgate::config::Durability;
use idemgate_model::clock::{Clock, SystemClock};
use idemgate_model::operation::{Event, Fingerprint, RequestSummary, Settlement, State};
use idemgate_store::{
    Claim, ClaimResult, Decision, Maintenance, NewOperation, Operators, Recorded, RequestPath,
    Resolved, Store, StoreError,
};
use idemgate_store_postgres::{PostgresSettings, PostgresStore};

const LEASE: Duration = Duration::from_secs(2);

async fn replica(schema: &PgSchema, owner: &str) -> PostgresStore {
    replica_at(schema.url.clone(), owner.to_string()).await
}

async fn replica_at(url: String, owner: String) -> PostgresStore {
    leased_replica_at(url, owner, LEASE).await
}

async fn leased_replica_at(url: String, owner: String, lease: Duration) -> PostgresStore {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    PostgresStore::open(
        &url,
        PostgresSettings {
            durability: Durability::Normal,
            lease,
            require_synchronous_standby: false,
        },
        owner.clone(),
        clock,
        test_store_keys(),
    )
    .await
    .unwrap_or_else(|e| panic!("open {owner}: {e}"))
}

fn new_op(key: &str) -> Arc<NewOperation> {
    Arc::new(NewOperation {
        route: "api".into(),
        scope: digest("s"),
        key: key.into(),
        fingerprint: Fingerprint::from_stored(digest("fp")),
        request: RequestSummary {
            method: "POST".into(),
            path: "/".into(),
            content_type: None,
            body_size: 0,
            body_sha256: digest(""),
            body: None,
        },
        fresh_after: None,
        refuse_held_twin: false,
    })
}

async fn claim_id(store: &dyn Store, key: &str) -> String {
    match store.claim(&new_op(key)).await.expect("claim") {
        ClaimResult::Claimed(claim) => claim.operation_id,
        ClaimResult::Existing(op) | ClaimResult::HeldTwin(op) => {
            panic!("{key} exists: {:?}", op.state)
        }
    }
}

fn operator() -> Event {
    Event {
        kind: "resolved",
        detail: serde_json::json!({ "operator": "ann" }),
    }
}

/// Claims `key` and records it `not_attempted` (a refused connection):
/// an operation a sweep may delete, and a claim take again.
async fn refused_op(store: &PostgresStore, key: &str) -> Claim {
    let ClaimResult::Claimed(claim) = store.claim(&new_op(key)).await.unwrap() else {
        panic!("{key} not claimed");
    };
    let refused = Settlement::NotAttempted {
        evidence: "connect-failed".into(),
    };
    let recorded = store.record(&claim, &refused, &[]).await.unwrap();
    assert_eq!(recorded, Recorded::Applied);
    claim
}

/// A connection of its own with a transaction open in `schema`, and its
/// backend's pid (for whom it blocks); the caller commits.
async fn transaction_in(schema: &PgSchema) -> (sqlx::PgConnection, i32) {
    let mut connection = admin_connection().await;
    sqlx::query("BEGIN").execute(&mut connection).await.unwrap();
    let take = format!("SET LOCAL search_path = {}", schema.name);
    sqlx::query(&take).execute(&mut connection).await.unwrap();
    let pid = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut connection)
        .await
        .unwrap();
    (connection, pid)
}

/// Waits until some session waits on backend `blocker`'s locks, or
/// `task` ended without waiting.
async fn blocked_on<T>(blocker: i32, task: &tokio::task::JoinHandle<T>, what: &str) {
    let observer = tokio::sync::Mutex::new(admin_connection().await);
    let watched = (&observer, task);
    eventually(what, || async move {
        let (observer, task) = watched;
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))",
        )
        .bind(blocker)
        .fetch_one(&mut *observer.lock().await)
        .await
        .unwrap();
        (waiting > 0 || task.is_finished()).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn a_lost_replicas_operations_become_unknown_exactly_once() {
    let schema = PgSchema::create().await;
    let lost = replica(&schema, "lost").await;
    let (b, c) = (replica(&schema, "b").await, replica(&schema, "c").await);
    let ids = [claim_id(&lost, "k1").await, claim_id(&lost, "k2").await];
    let mine = claim_id(&b, "k3").await;
    // Not yet: its lease runs.
    assert!(b.recover().await.unwrap().is_empty());
    let early = b
        .resolve(&ids[0], None, &Decision::NotAttempted, &operator())
        .await;
    assert!(matches!(
        early.unwrap(),
        Resolved::NotResolvable(State::InProgress)
    ));

    drop(lost); // stops renewing, as a killed process would
    let deadline = tokio::time::Instant::now() + LEASE * 3;
    let mut marked = Vec::new();
    while marked.len() < 2 && tokio::time::Instant::now() < deadline {
        // Two live peers look at once, again and again.
        let (by_b, by_c) = tokio::join!(b.recover(), c.recover());
        marked.extend(by_b.unwrap());
        marked.extend(by_c.unwrap());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for _ in 0..3 {
        marked.extend(b.recover().await.unwrap());
        marked.extend(c.recover().await.unwrap());
    }
    assert_eq!(marked, ["api", "api"], "each operation marked once");
    for id in &ids {
        let (op, events) = c.get(id).await.unwrap().unwrap();
        assert_eq!(
            (op.state, op.evidence.as_str()),
            (State::Unknown, "replica-lost")
        );
        let lost: Vec<_> = events.iter().filter(|e| e.kind == "owner-lost").collect();
        assert_eq!(lost.len(), 1);
        assert_eq!(lost[0].detail["owner"], "lost");
    }
    // Held, never claimed again; a live peer's own attempt is untouched.
    let retry = b.claim(&new_op("k1")).await.unwrap();
    assert!(matches!(retry, ClaimResult::Existing(op) if op.state == State::Unknown));
    let (op, _) = c.get(&mine).await.unwrap().unwrap();
    assert_eq!(op.state, State::InProgress);
    let live = c
        .resolve(&mine, None, &Decision::NotAttempted, &operator())
        .await;
    assert!(matches!(
        live.unwrap(),
        Resolved::NotResolvable(State::InProgress)
    ));
    let settled = c
        .resolve(&ids[1], None, &Decision::NotAttempted, &operator())
        .await;
    assert!(matches!(settled.unwrap(), Resolved::Done));
    b.close().await;
    c.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn a_replica_that_cannot_renew_stops_claiming_before_its_lease_ends() {
    let schema = PgSchema::create().await;
    let store = replica(&schema, "stuck").await;
    claim_id(&store, "before").await;
    // Renewals (writes to the replicas table) wait behind this lock; reads go on.
    let mut blocker = admin_connection().await;
    sqlx::query("BEGIN").execute(&mut blocker).await.unwrap();
    let lock = format!("LOCK TABLE {}.replicas IN EXCLUSIVE MODE", schema.name);
    sqlx::query(&lock).execute(&mut blocker).await.unwrap();

    let mut observer = admin_connection().await;
    let lease_runs = format!(
        "SELECT lease_until > clock_timestamp() FROM {}.replicas WHERE id = 'stuck'",
        schema.name
    );
    let deadline = tokio::time::Instant::now() + LEASE * 2;
    let refused_at_lease = loop {
        assert!(tokio::time::Instant::now() < deadline, "still claiming");
        let new = new_op(&format!("k-{}", uuid::Uuid::now_v7()));
        let claimed = tokio::time::timeout(Duration::from_millis(200), store.claim(&new)).await;
        if let Ok(Err(StoreError::WritesRefused(_))) = claimed {
            let runs: bool = sqlx::query_scalar(&lease_runs)
                .fetch_one(&mut observer)
                .await
                .unwrap();
            break runs;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        refused_at_lease,
        "claims stop while the database still counts the lease"
    );
    assert!(store.ping().await.is_err(), "not ready either");
    // What the store holds is still answered, nothing written: past its
    // lease (a renewal waiting for a synchronous standby gone away) the
    // replica refused replays, held operations and reused keys too.
    match store.claim(&new_op("before")).await {
        Ok(ClaimResult::Existing(held)) => assert_eq!(held.state, State::InProgress),
        other => panic!("the stored operation not answered: {other:?}"),
    }

    sqlx::query("ROLLBACK").execute(&mut blocker).await.unwrap();
    let deadline = tokio::time::Instant::now() + LEASE * 2;
    loop {
        match store.claim(&new_op("after")).await {
            Ok(ClaimResult::Claimed(_)) => break,
            Err(StoreError::WritesRefused(_)) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => panic!("no claim after renewing: {other:?}"),
        }
    }
    store.close().await;
}

/// A renewal that failed is tried again within a second: a replica whose
/// fence ran out while every connection to its database broke at once
/// holds it again within about a second of the database answering, not a
/// third of a lease later (a load balancer saw it ready, then not, then
/// ready). The lease is long, so that a third of it stands apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn a_replica_renews_soon_after_its_database_answers_again() {
    let schema = PgSchema::create().await;
    let (host, rest) = schema.url.split_once('@').expect("a user in the URL");
    let (address, path) = rest.split_once('/').expect("a database in the URL");
    let port: u16 = address.rsplit(':').next().unwrap().parse().expect("a port");
    let link = TcpRelay::start(port).await;
    let url = format!("{host}@127.0.0.1:{}/{path}", link.port());
    let lease = Duration::from_secs(30);
    let store = leased_replica_at(url, "linked".into(), lease).await;
    claim_id(&store, "before").await;
    // Every connection through the link now ends as soon as it is made.
    let breaking = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let breaks_at = breaking.local_addr().expect("address").port();
    let breaker = tokio::spawn(async move {
        while let Ok((connection, _)) = breaking.accept().await {
            drop(connection);
        }
    });
    link.move_to(breaks_at);
    let fence = store.fence();
    let deadline = tokio::time::Instant::now() + lease;
    while fence.holds() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the fence held past its lease"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    link.move_to(port);
    let back = tokio::time::Instant::now();
    while !fence.holds() {
        assert!(
            back.elapsed() < Duration::from_secs(3),
            "the fence was not renewed within 3 s of the database answering again"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(matches!(
        store.claim(&new_op("after")).await,
        Ok(ClaimResult::Claimed(_))
    ));
    breaker.abort();
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn one_replica_sweeps_at_a_time() {
    let schema = PgSchema::create().await;
    let store = replica(&schema, "a").await;
    for i in 0..3 {
        refused_op(&store, &format!("k{i}")).await;
    }
    let later = SystemClock.now_millis() + 1000;
    // Another replica's sweep holds the lock: this one deletes nothing.
    let (mut other, _) = transaction_in(&schema).await;
    let ours: bool = sqlx::query_scalar(
        "SELECT pg_try_advisory_xact_lock(hashtext(current_schema() || ':idemgate-sweep'))",
    )
    .fetch_one(&mut other)
    .await
    .unwrap();
    assert!(ours);
    assert_eq!(store.sweep(later, 100).await.unwrap(), 0);
    sqlx::query("COMMIT").execute(&mut other).await.unwrap();
    assert_eq!(store.sweep(later, 100).await.unwrap(), 3);
    store.close().await;
}

/// An old `not_attempted` operation that a claim takes for its next
/// attempt while a sweep looks at it: the claim's transaction is held
/// open (as a claim that is slow to commit would be), the sweep runs
/// beside it, and then the claim commits. The sweep leaves the
/// operation: deleted, the attempt about to be sent would have no row,
/// and a retry through a peer would find none and send it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn a_sweep_leaves_an_operation_a_claim_takes_meanwhile() {
    let schema = PgSchema::create().await;
    let store = Arc::new(replica(&schema, "a").await);
    let claim = refused_op(&store, "k").await;
    let later = SystemClock.now_millis() + 1000;

    // The next attempt's claim (the update `idemgate_claim_unless_twin`
    // makes), not committed yet.
    let (mut claiming, claimer) = transaction_in(&schema).await;
    let taken = sqlx::query(
        "UPDATE operations SET state = 'in_progress', attempt = attempt + 1, owner = 'a',
            evidence = 'claimed', updated_at = $2
         WHERE id = $1 AND state = 'not_attempted'",
    )
    .bind(&claim.operation_id)
    .bind(SystemClock.now_millis())
    .execute(&mut claiming)
    .await
    .unwrap();
    assert_eq!(taken.rows_affected(), 1);

    let sweeper = store.clone();
    let sweeping = tokio::spawn(async move { sweeper.sweep(later, 100).await });
    // The sweep passes the operation by, or waits on the claim's lock.
    blocked_on(
        claimer,
        &sweeping,
        "the sweep to pass by or wait on the claim",
    )
    .await;
    sqlx::query("COMMIT").execute(&mut claiming).await.unwrap();

    let swept = sweeping.await.expect("sweep task").unwrap();
    assert_eq!(swept, 0, "the operation is in progress");
    let (op, _) = store.get(&claim.operation_id).await.unwrap().expect("kept");
    assert_eq!((op.state, op.attempt), (State::InProgress, 2));
    store.close().await;
}

/// A stale record whose operation a sweep (a peer's) is deleting at that
/// moment: the record waits for the delete to commit and is stale, its
/// events dropped; they would break the events' foreign key, and with it
/// every record of the batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn a_record_of_an_operation_being_swept_is_stale() {
    let schema = PgSchema::create().await;
    let store = Arc::new(replica(&schema, "a").await);
    let claim = refused_op(&store, "k").await;

    let (mut sweeping, sweeper) = transaction_in(&schema).await;
    sqlx::query("DELETE FROM operations WHERE id = $1")
        .bind(&claim.operation_id)
        .execute(&mut sweeping)
        .await
        .unwrap();

    let recorder = store.clone();
    let late = claim.clone();
    let recording = tokio::spawn(async move {
        let lost = Settlement::Unknown {
            evidence: "timeout".into(),
        };
        let event = Event {
            kind: "timeout",
            detail: serde_json::json!({}),
        };
        recorder.record(&late, &lost, &[event]).await
    });
    blocked_on(
        sweeper,
        &recording,
        "the record to wait on the sweep, or end",
    )
    .await;
    sqlx::query("COMMIT").execute(&mut sweeping).await.unwrap();

    let recorded = recording.await.expect("record task");
    assert_eq!(recorded.unwrap(), Recorded::Stale);
    assert!(store.get(&claim.operation_id).await.unwrap().is_none());
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn replicas_starting_together_migrate_once() {
    let schema = PgSchema::create().await;
    let mut starting = tokio::task::JoinSet::new();
    for i in 0..4 {
        starting.spawn(replica_at(schema.url.clone(), format!("r{i}")));
    }
    let opened = starting.join_all().await;
    let mut conn = admin_connection().await;
    let applied: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM {}._sqlx_migrations",
        schema.name
    ))
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(applied, postgres_migrations(), "each applied once");
    for store in opened {
        store.close().await;
    }
}
