//! A gateway follows its store's primary across a promotion without a
//! restart (docs/replicas.md, "Following a promotion"), on a store URL
//! naming a primary and its standby, and on one stable address that moves
//! from the one to the other: writes are served by the primary, refused
//! (503, nothing sent, the standby not even read, `/readyz` 503 within a
//! second) while no server takes writes — a standby behind the address
//! included — and served by the standby once it is promoted; afterwards
//! every key's retry is a replay, and no operation is left `in_progress`.
//! A replica whose lease lapses meanwhile is treated as any lost replica:
//! the peer that followed holds its write in flight `replica-lost`. The
//! clusters are the test's own ([`PgPair`]).

use crate::common::*;

const ORDER: &str = r#"{"order":"o-1","amount":250}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL 15 cluster tools (pg_createcluster, pg_basebackup) (.ci/run runs it)"]
async fn a_gateway_on_several_hosts_follows_a_promotion_without_a_restart() {
    let pair = PgPair::create("test").await;
    follows_a_promotion(&pair, &pair.url("test"), || {}).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL 15 cluster tools (pg_createcluster, pg_basebackup) (.ci/run runs it)"]
async fn a_gateway_on_an_address_that_moves_never_claims_on_the_standby() {
    let pair = PgPair::create("test").await;
    let address = TcpRelay::start(pair.primary.port).await;
    let url = format!("postgres://postgres@127.0.0.1:{}/test", address.port());
    // The address moves to the standby before it is promoted.
    follows_a_promotion(&pair, &url, || address.move_to(pair.standby.port)).await;
}

/// A replica left behind on the old primary (a URL naming it alone)
/// never renews its lease again: the peer that followed the promotion
/// holds its write in flight `unknown` (`replica-lost`) on the new
/// primary, where the leases moved with the data, and never sends it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL 15 cluster tools (pg_createcluster, pg_basebackup) (.ci/run runs it)"]
async fn a_replica_left_on_the_old_primary_is_lost_to_the_peer_that_followed() {
    let pair = PgPair::create("test").await;
    let lease = "lease = \"1s\"";
    let left = Setup::route("")
        .shared_store(&pair.primary.url("test"), &pair.scope_key_file)
        .store(lease);
    let left = spawn_gateway_with(left).await;
    let follower = Setup::route("")
        .shared_store(&pair.url("test"), &pair.scope_key_file)
        .store(lease)
        .upstream_url(left.upstream.url())
        .admin()
        .quick();
    let follower = spawn_gateway_with(follower).await;
    let addr = left.addr();
    let in_flight = tokio::spawn(async move { write(addr, "/hold", Some("k-held"), ORDER).await });
    left.upstream.wait_for_writes(1).await;
    pair.wait_replayed().await;
    pair.primary.stop_immediately().await;
    pair.promote().await;

    let held = write_until(follower.addr(), "/hold", "k-held", ORDER, WAIT, |r| {
        r.status == 409 && r.json()["state"] == "unknown"
    })
    .await;
    assert_held_unknown(&held);
    let op = follower.operation("k-held").await;
    assert_eq!(op["evidence"], "replica-lost", "{op}");
    assert_eq!(left.upstream.writes(), 1, "never sent again");
    in_flight.abort();
}

/// The scenario of the module doc on a gateway whose store is at `url`;
/// `killed` runs once the primary is dead.
async fn follows_a_promotion(pair: &PgPair, url: &str, killed: impl FnOnce()) {
    let setup = Setup::route("")
        .shared_store(url, &pair.scope_key_file)
        .admin();
    let mut gw = spawn_gateway_with(setup).await;
    let mut served = Vec::new();
    for key in ["k-1", "k-2", "k-3"] {
        let first = write(gw.addr(), "/orders", Some(key), ORDER).await;
        assert_fresh_created(&first);
        served.push((key, first));
    }
    // Nothing the gateway was told committed is lost with the primary.
    pair.wait_replayed().await;
    pair.primary.stop_immediately().await;
    killed();

    // No server takes writes: refused before anything is claimed or sent;
    // and no statement runs on the standby, not even an operator's read.
    let refused = write(gw.addr(), "/orders", Some("k-outage"), ORDER).await;
    refused.assert_problem(503, "store-unavailable");
    assert_eq!(gw.upstream.writes(), 3);
    let unread = gw.admin("GET", "/admin/keys?key=k-1", "").await;
    assert_eq!(unread.status, 503, "{:?}", unread.body);
    let asked = std::time::Instant::now();
    let ready = admin_call(gw.admin_addr(), "GET", "/readyz", None, "").await;
    assert_eq!(ready.status, 503, "{:?}", ready.body);
    assert!(
        asked.elapsed() <= std::time::Duration::from_secs(1),
        "{:?}",
        asked.elapsed()
    );

    pair.promote().await;
    let addr = gw.addr();
    let outage = eventually("writes served by the promoted standby", || async move {
        let answer = write(addr, "/orders", Some("k-outage"), ORDER).await;
        match answer.status.as_u16() {
            503 => None,
            // A claim whose answer the switch lost (its client heard 503)
            // reads `in_progress` until the replica finds it committed and
            // releases it, nothing sent (store-postgres, `release_unanswered`).
            409 if answer.json()["type"] == "urn:idemgate:problem:request-in-progress" => None,
            _ => Some(answer),
        }
    })
    .await;
    assert_fresh_created(&outage);
    served.push(("k-outage", outage));
    let after = write(gw.addr(), "/orders", Some("k-after"), ORDER).await;
    assert_fresh_created(&after);
    served.push(("k-after", after));

    // Every key once upstream, every retry a replay, nothing in flight.
    for (key, first) in &served {
        let retry = write(gw.addr(), "/orders", Some(key), ORDER).await;
        assert_replay_of(&retry, first);
    }
    assert_eq!(gw.upstream.writes(), served.len());
    let mut promoted = pair.standby.connect("test").await;
    let in_progress: i64 =
        sqlx::query_scalar("SELECT count(*) FROM operations WHERE state = 'in_progress'")
            .fetch_one(&mut promoted)
            .await
            .expect("count in-flight operations");
    assert_eq!(in_progress, 0);
    gw.shutdown().await;
}
