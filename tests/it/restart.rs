//! What survives a restart, in process: completed operations are replayed
//! after a graceful shutdown and a new start on the same store, and one store
//! serves one gateway at a time, until that gateway shuts down.
//! The real binary's restarts are in [`process`](super::process). A child
//! spawned by a concurrent test holds the store's lock between fork and
//! exec; the harness keeps restarts clear of that
//! ([`children`](crate::common::children)).

use crate::common::*;

const BODY: &str = r#"{"invoice":"inv-7","amount":250}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_operation_survives_restart() {
    let mut gw = spawn_gateway("").await;
    let first = write(gw.addr(), "/invoices", Some("inv-7"), BODY).await;
    assert_fresh_created(&first);

    gw.restart().await;
    let retry = write(gw.addr(), "/invoices", Some("inv-7"), BODY).await;

    assert_replay_of(&retry, &first);
    assert_eq!(gw.upstream.writes(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_gateway_on_same_store_is_refused_in_process() {
    let mut gw = spawn_gateway("").await;

    match gw.try_start_another().await {
        Ok(second) => {
            second.shutdown().await;
            panic!("a second gateway started on a locked store");
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
    // The first one is unaffected.
    assert_fresh_created(&write(gw.addr(), "/invoices", Some("inv-7"), BODY).await);

    // Shutdown releases the lock.
    gw.shutdown().await;
    let third = gw
        .try_start_another()
        .await
        .expect("store free after shutdown");
    third.shutdown().await;
}

/// A store written before the state CHECK was rebuilt (migration 0002)
/// keeps every operation and every event through the rebuild: the
/// completed write is replayed, the held one is still held with its whole
/// timeline, and nothing more reaches the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_and_events_survive_the_state_check_rebuild() {
    let mut gw = spawn_gateway_with(Setup::route("").admin()).await;
    let first = write(gw.addr(), "/invoices", Some("inv-7"), BODY).await;
    assert_fresh_created(&first);
    write(gw.addr(), "/status/502", Some("lost-1"), BODY).await;
    let held = gw.operation("lost-1").await;
    assert_eq!(held["state"], "unknown");
    assert!(held["events"].as_array().unwrap().len() >= 2, "{held}");
    gw.shutdown().await;

    schema_as_before_0002(&gw.store_path);
    gw.start_again().await;

    assert_replay_of(
        &write(gw.addr(), "/invoices", Some("inv-7"), BODY).await,
        &first,
    );
    assert_held_unknown(&write(gw.addr(), "/status/502", Some("lost-1"), BODY).await);
    assert_eq!(
        gw.operation("lost-1").await,
        held,
        "the same operation, events and all"
    );
    assert_eq!(gw.upstream.write_requests().len(), 2, "nothing re-sent");
}

/// Puts the `operations` table back as migration 0001 made it (the CHECK
/// with an IN list) and forgets that 0002 ran: the store as the previous
/// release left it.
fn schema_as_before_0002(store: &std::path::Path) {
    let conn = rusqlite::Connection::open(store).unwrap();
    let created = include_str!("../../migrations/sqlite/0001_operations.sql");
    let table = &created[created.find("CREATE TABLE operations").unwrap()..];
    let table = &table[..table.find(") STRICT;").unwrap() + ") STRICT;".len()];
    assert!(table.contains("state IN ("), "0001's CHECK has an IN list");
    let table = table.replace("CREATE TABLE operations", "CREATE TABLE operations_0001");
    conn.execute_batch(&format!(
        "PRAGMA foreign_keys = OFF;
         BEGIN;
         {table}
         INSERT INTO operations_0001 SELECT * FROM operations;
         DROP TABLE operations;
         ALTER TABLE operations_0001 RENAME TO operations;
         CREATE UNIQUE INDEX operations_identity ON operations (route, scope, idem_key)
            WHERE superseded_at IS NULL;
         CREATE INDEX operations_state_updated ON operations (state, updated_at);
         DELETE FROM _sqlx_migrations WHERE version = 2;
         COMMIT;"
    ))
    .unwrap();
}
