//! Exactly once across a PostgreSQL failover (docs/replicas.md,
//! "Failover"): a primary and a standby of the test's own ([`PgPair`]),
//! the replication link 20 ms each way ([`TcpRelay::start_delayed`]), a
//! gateway on both (`store.require_synchronous_standby = true`) under
//! writers that keep writing new keys while the primary is killed and the
//! standby promoted. With synchronous replication no claim or record the
//! gateway heard of is lost: every key told 201 is replayed afterwards,
//! and no key reaches the API twice. With asynchronous replication the
//! gateway refuses to write at all, so nothing can be lost or sent twice;
//! without that setting, a record lost with the old primary leaves its
//! operation held `unknown`, never `in_progress` under a live gateway.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;

const ORDER: &str = r#"{"order":"o-1","amount":250}"#;

/// Writers at once, and the keys each may write at most.
const WRITERS: usize = 8;
const KEYS_EACH: usize = 400;

/// 20 ms each way: a standby in another zone.
const LINK_DELAY: Duration = Duration::from_millis(20);

/// What each key got, first time.
type Answers = Arc<Mutex<Vec<(String, Response)>>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL 15 cluster tools (pg_createcluster, pg_basebackup) (.ci/run runs it)"]
async fn synchronous_replication_loses_nothing_across_a_failover() {
    let pair = PgPair::create("test").await;
    let link = TcpRelay::start_delayed(pair.primary.port, LINK_DELAY).await;
    pair.replicate_through(link.port(), true).await;
    let gw = spawn_gateway_with(required(&pair)).await;

    let (stop, answers) = (Arc::new(AtomicBool::new(false)), Answers::default());
    let writers = write_new_keys(gw.addr(), &stop, &answers);
    eventually("writes to be served on the first primary", || async {
        (created(&answers) >= 40).then_some(())
    })
    .await;
    pair.primary.stop_immediately().await;
    pair.promote().await;
    // The promoted server has no synchronous standby of its own: writes
    // are refused there, and what it holds is answered.
    let refused_on_the_new_primary = eventually("the gateway to follow the promotion", || async {
        let ready = admin_call(gw.admin_addr(), "GET", "/readyz", None, "").await;
        String::from_utf8_lossy(&ready.body)
            .contains("synchronous_standby_names")
            .then_some(())
    });
    refused_on_the_new_primary.await;
    stop.store(true, Ordering::SeqCst);
    for writer in writers {
        writer.await.expect("writer");
    }

    let answered = std::mem::take(&mut *answers.lock().unwrap());
    // Every key written once more after the failover: a key told 201 gets
    // it replayed, and none reaches the API a second time.
    let told_created: Vec<&(String, Response)> =
        answered.iter().filter(|(_, r)| r.status == 201).collect();
    assert!(told_created.len() >= 40, "{} created", told_created.len());
    for (key, first) in &told_created {
        let retry = write(gw.addr(), "/orders", Some(key), ORDER).await;
        assert_replay_of(&retry, first);
    }
    let writes = writes_by_key(&gw);
    let twice: Vec<_> = writes.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "keys written more than once: {twice:?}");
    for (key, _) in &told_created {
        assert_eq!(writes.get(key), Some(&1), "{key} was told 201");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL 15 cluster tools (pg_createcluster, pg_basebackup) (.ci/run runs it)"]
async fn asynchronous_replication_is_refused_before_and_after_a_failover() {
    let pair = PgPair::create("test").await;
    let link = TcpRelay::start_delayed(pair.primary.port, LINK_DELAY).await;
    pair.replicate_through(link.port(), false).await;
    let gw = spawn_gateway_with(required(&pair)).await;
    let refused = write(gw.addr(), "/orders", Some("k-1"), ORDER).await;
    refused.assert_problem(503, "store-unavailable");
    pair.primary.stop_immediately().await;
    pair.promote().await;
    let after = write_until(gw.addr(), "/orders", "k-1", ORDER, WAIT, |r| {
        r.status == 503
    })
    .await;
    after.assert_problem(503, "store-unavailable");
    assert_eq!(gw.upstream.write_requests().len(), 0, "nothing ever sent");
}

/// A gateway on both servers that writes only with a synchronous standby.
fn required(pair: &PgPair) -> Setup {
    Setup::route("")
        .shared_store(&pair.url("test"), &pair.scope_key_file)
        .durable()
        .store("require_synchronous_standby = true")
        .admin()
}

/// [`WRITERS`] tasks writing new keys until `stop`, each key once; what
/// each got goes to `answers`.
fn write_new_keys(
    addr: SocketAddr,
    stop: &Arc<AtomicBool>,
    answers: &Answers,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..WRITERS)
        .map(|writer| {
            let (stop, answers) = (stop.clone(), answers.clone());
            tokio::spawn(async move {
                for i in 0..KEYS_EACH {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let key = format!("w{writer}-{i}");
                    let answer = write(addr, "/orders", Some(&key), ORDER).await;
                    answers.lock().unwrap().push((key, answer));
                }
            })
        })
        .collect()
}

fn created(answers: &Answers) -> usize {
    let answers = answers.lock().unwrap();
    answers.iter().filter(|(_, r)| r.status == 201).count()
}

/// A primary and its standby replicating through a relay the test can cut
/// ([`cut`]), synchronously or not.
async fn linked_pair(synchronous: bool) -> (PgPair, TcpRelay) {
    let pair = PgPair::create("test").await;
    let link = TcpRelay::start(pair.primary.port).await;
    pair.replicate_through(link.port(), synchronous).await;
    (pair, link)
}

/// The standby loses its link to the primary: the relay leads to a port
/// nothing listens on.
async fn cut(link: &TcpRelay) {
    let nowhere = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    link.move_to(nowhere.local_addr().expect("address").port());
    drop(nowhere);
}

/// The writes that reached the API, by the key they carried.
fn writes_by_key(gw: &TestGateway) -> HashMap<String, usize> {
    let mut writes: HashMap<String, usize> = HashMap::new();
    for request in gw.upstream.write_requests() {
        let key = request.header("idempotency-key").unwrap_or("").to_string();
        *writes.entry(key).or_default() += 1;
    }
    writes
}

/// A claim whose commit waits for the synchronous standby past the batch's
/// bound is answered 503, and is invisible until the standby is back: the
/// gateway keeps looking for it and, once it committed, releases it
/// (`claim-unanswered`), so the retry is sent once — never `in_progress`
/// under a live lease with nobody working on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL 15 cluster tools (pg_createcluster, pg_basebackup) (.ci/run runs it)"]
async fn a_claim_that_commits_once_the_standby_is_back_is_released() {
    let (pair, link) = linked_pair(true).await;
    // Commits wait for the standby (the server's setting); writes are not
    // refused without one, so the claim goes out and waits.
    let setup = Setup::route("")
        .shared_store(&pair.url("test"), &pair.scope_key_file)
        .durable()
        .admin();
    let gw = spawn_gateway_with(setup).await;
    assert_fresh_created(&write(gw.addr(), "/orders", Some("k-1"), ORDER).await);
    // The standby loses its link: nothing commits until it is back.
    cut(&link).await;
    let lost = write(gw.addr(), "/orders", Some("k-lost"), ORDER).await;
    lost.assert_problem(503, "store-unavailable");
    assert!(
        gw.try_operation("k-lost").await.is_none(),
        "not committed yet"
    );
    // The gateway's first look for the claim finds nothing (the claim is
    // not committed): only then is the standby back.
    let watcher = tokio::sync::Mutex::new(pair.primary.connect("test").await);
    let watching = &watcher;
    eventually("the gateway's first look for the claim", || async move {
        let looked: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE pid <> pg_backend_pid() AND state = 'idle'
               AND query LIKE '%claim-unanswered%'",
        )
        .fetch_one(&mut *watching.lock().await)
        .await
        .expect("pg_stat_activity");
        (looked > 0).then_some(())
    })
    .await;
    link.move_to(pair.primary.port);
    // The looks go on a fully jittered backoff whose ceiling doubles up to
    // a minute (crates/store-postgres/src/lib.rs, `RELEASE_BACKOFF`): a
    // claim that commits late, once the standby has caught up, is found
    // at the next look, which may be up to a minute away.
    let released = eventually_within(
        "the claim to commit and be released",
        Duration::from_secs(75),
        || async {
            let operation = gw.try_operation("k-lost").await?;
            (operation["state"] == "not_attempted").then_some(operation)
        },
    )
    .await;
    assert_eq!(released["evidence"], "claim-unanswered", "{released}");
    assert_fresh_created(&write(gw.addr(), "/orders", Some("k-lost"), ORDER).await);
    assert_eq!(writes_by_key(&gw).get("k-lost"), Some(&1));
}

/// A failover without a synchronous standby (docs/replicas.md,
/// "Failover"): a write whose claim reached the standby but whose record
/// did not is `in_progress` on the promoted server under a gateway whose
/// lease runs on there. The gateway holds it `unknown` (`record-lost`)
/// within a few of its looks, so retries hear `outcome-unknown` and an
/// operator can settle it — while a write it still has in flight across
/// the same failover is left alone and recorded when its answer comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL 15 cluster tools (pg_createcluster, pg_basebackup) (.ci/run runs it)"]
async fn a_record_lost_in_an_asynchronous_failover_is_held_unknown() {
    let (pair, link) = linked_pair(false).await;
    let setup = Setup::route("upstream_timeout = \"60s\"")
        .shared_store(&pair.url("test"), &pair.scope_key_file)
        .durable()
        .admin();
    let gw = spawn_gateway_with(setup).await;
    gw.upstream.script(Scripted::Hold);
    let addr = gw.addr();
    let lost = tokio::spawn(async move { write(addr, "/scripted", Some("k-lost"), ORDER).await });
    gw.upstream.wait_for_writes(1).await;
    let live = tokio::spawn(async move { write(addr, "/scripted", Some("k-live"), ORDER).await });
    gw.upstream.wait_for_writes(2).await;
    // Both claims reach the standby; then the link is cut, so k-lost's
    // record commits on the primary alone.
    pair.wait_replayed().await;
    cut(&link).await;
    gw.upstream.release_one();
    let told = lost.await.expect("client task");
    assert_fresh_created(&told);
    pair.primary.stop_immediately().await;
    pair.promote().await;

    let held = write_until(gw.addr(), "/scripted", "k-lost", ORDER, WAIT, |r| {
        r.status == 409 && r.json()["state"] == "unknown"
    })
    .await;
    assert_held_unknown(&held);
    let op = gw.operation("k-lost").await;
    assert_eq!(op["evidence"], "record-lost", "{op}");
    let in_flight = gw.operation("k-live").await;
    assert_eq!(in_flight["state"], "in_progress", "{in_flight}");

    // The operator settles the lost record from the destination's word.
    let id = op["id"].as_str().expect("id");
    gw.resolved(
        id,
        &serde_json::json!({"outcome": "completed", "operator": "ann", "reference": "T-9",
            "response": {"status": 201, "body": {"id": "o-1"}}}),
    )
    .await;

    // The write in flight (its client gave up waiting: the gateway goes
    // on) is answered, recorded on the promoted server and replayed from
    // it.
    live.abort();
    gw.upstream.release_one();
    let recorded = eventually("the write in flight to be recorded", || async {
        let op = gw.operation("k-live").await;
        (op["state"] != "in_progress").then_some(op)
    })
    .await;
    assert_eq!(recorded["state"], "completed", "{recorded}");
    let retry = write(gw.addr(), "/scripted", Some("k-live"), ORDER).await;
    assert_eq!(retry.status, 201);
    assert!(retry.is_replay(), "a replay");
    assert_eq!(gw.upstream.writes(), 2, "nothing sent twice");
}
