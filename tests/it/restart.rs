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
    gw.assert_retry_replays(("/invoices", "inv-7", BODY), &first, 1)
        .await;
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

/// A store as an earlier release left it (`as_before` puts it back, the
/// gateway stopped) keeps every operation and every event through the
/// migrations at the next start: the completed write is replayed, the held
/// one is still held with its whole timeline (a sealed value would not
/// open if its identity changed), and nothing more reaches the upstream.
async fn operations_survive_the_upgrade(as_before: impl FnOnce(&std::path::Path)) -> TestGateway {
    let mut gw = spawn_gateway_with(Setup::route("").admin()).await;
    let first = write(gw.addr(), "/invoices", Some("inv-7"), BODY).await;
    assert_fresh_created(&first);
    write(gw.addr(), "/status/502", Some("lost-1"), BODY).await;
    let held = gw.operation("lost-1").await;
    assert_eq!(held["state"], "unknown");
    assert!(held["events"].as_array().unwrap().len() >= 2, "{held}");
    gw.shutdown().await;

    as_before(&gw.store_path);
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
    gw
}

/// The rebuild of the state CHECK (migration 0002).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_and_events_survive_the_state_check_rebuild() {
    operations_survive_the_upgrade(|store| {
        digests_as_before_0007(store);
        schema_as_before_0002(store);
    })
    .await;
}

/// The digests kept as bytes (migration 0007): hex text before, 32 bytes
/// after, the identity found by them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_survive_the_digests_becoming_bytes() {
    let gw = operations_survive_the_upgrade(|store| {
        digests_as_before_0007(store);
        let conn = rusqlite::Connection::open(store).unwrap();
        let fingerprint: String = conn
            .query_row("SELECT fingerprint FROM operations LIMIT 1", [], |row| {
                row.get(0)
            })
            .unwrap();
        assert_eq!(fingerprint.len(), 64, "hex, as before 0007: {fingerprint}");
    })
    .await;
    let conn = rusqlite::Connection::open(&gw.store_path).unwrap();
    let lengths: Vec<(i64, i64, i64)> = conn
        .prepare("SELECT length(scope), length(fingerprint), length(request_body_sha256) FROM operations")
        .unwrap()
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(lengths, [(32, 32, 32), (32, 32, 32)], "bytes again");
}

/// Puts the `operations` table back as migration 0001 made it (the CHECK
/// with an IN list) and forgets that 0002 ran: the store as the previous
/// release left it (after [`digests_as_before_0007`], which undoes what
/// came after 0007 and names its columns).
fn schema_as_before_0002(store: &std::path::Path) {
    let conn = rusqlite::Connection::open(store).unwrap();
    let created = include_str!("../../crates/store-sqlite/migrations/0001_operations.sql");
    let table = &created[created.find("CREATE TABLE operations").unwrap()..];
    let table = &table[..table.find(") STRICT;").unwrap() + ") STRICT;".len()];
    assert!(table.contains("state IN ("), "0001's CHECK has an IN list");
    let table = table.replace("CREATE TABLE operations", "CREATE TABLE operations_0001");
    conn.execute_batch(&format!(
        "PRAGMA foreign_keys = OFF;
         BEGIN;
         {table}
         INSERT INTO operations_0001 ({COLUMNS}) SELECT {COLUMNS} FROM operations;
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

/// The columns of `operations` from migration 0001 on.
const COLUMNS: &str = "id, route, scope, idem_key, fingerprint, state, attempt, owner, evidence,
    request_method, request_path, request_content_type, request_body_size, request_body_sha256,
    request_body, response_status, response_headers, response_body, created_at, updated_at,
    superseded_at";

/// The identity index with the key first (migration 0011): the list by
/// key (which `operation()` reads) finds what it found before, from the
/// indexes that replaced `operations_key_id`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_survive_the_identity_index_rebuild() {
    let gw = operations_survive_the_upgrade(|store| {
        identity_as_before_0011(store);
        assert!(index_names(store).contains(&"operations_key_id".to_string()));
    })
    .await;
    assert_eq!(
        index_names(&gw.store_path),
        [
            "operations_duplicated",
            "operations_held_twins",
            "operations_identity",
            "operations_in_progress",
            "operations_route_state_id",
            "operations_state_id",
            "operations_state_updated",
            "operations_superseded",
        ]
    );
}

/// The state indexes without `in_progress` operations (migration 0012):
/// the held operation is listed by state and by route as before, and no
/// index that holds `state` keeps an operation in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_survive_the_state_indexes_becoming_partial() {
    let gw = operations_survive_the_upgrade(|store| {
        state_indexes_as_before_0012(store);
        assert!(!index_names(store).contains(&"operations_in_progress".to_string()));
    })
    .await;
    assert!(index_names(&gw.store_path).contains(&"operations_in_progress".to_string()));
    let conn = rusqlite::Connection::open(&gw.store_path).unwrap();
    let partial: Vec<(String, bool)> = conn
        .prepare(
            "SELECT name, partial FROM pragma_index_list('operations')
             WHERE name IN ('operations_state_id', 'operations_route_state_id',
                            'operations_state_updated') ORDER BY name",
        )
        .unwrap()
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(partial.iter().all(|(_, partial)| *partial), "{partial:?}");
    for path in [
        "/admin/keys?state=unknown",
        "/admin/keys?route=api&state=unknown",
    ] {
        let listed = gw.admin("GET", path, "").await;
        let items = listed.json()["items"].as_array().unwrap().clone();
        assert_eq!(items.len(), 1, "{path}: {items:?}");
        assert_eq!(items[0]["key"], "lost-1", "{path}");
    }
}

/// The index of the operations in flight or held (migration 0013, the
/// rotated-key guard's): built at the upgrade with the held operation in
/// it, and the statement the guard runs reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_survive_the_held_twins_index() {
    let gw = operations_survive_the_upgrade(|store| {
        held_twins_as_before_0013(store);
        assert!(!index_names(store).contains(&"operations_held_twins".to_string()));
    })
    .await;
    let conn = rusqlite::Connection::open(&gw.store_path).unwrap();
    let held: Vec<String> = conn
        .prepare(
            "SELECT idem_key FROM operations INDEXED BY operations_held_twins
             WHERE state IN ('in_progress', 'unknown')",
        )
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(held, ["lost-1"]);
}

/// Drops the index of the operations in flight or held, which names the
/// columns the earlier schemas change, and forgets that 0013 ran.
fn held_twins_as_before_0013(store: &std::path::Path) {
    undone(store, 13, "DROP INDEX operations_held_twins;");
}

/// Puts the three state indexes back as the release before migration 0012
/// had them (every operation in each, none of its own for those in
/// flight), and forgets that 0012 ran.
fn state_indexes_as_before_0012(store: &std::path::Path) {
    undone(
        store,
        12,
        "DROP INDEX operations_in_progress;
         DROP INDEX operations_state_id;
         DROP INDEX operations_route_state_id;
         DROP INDEX operations_state_updated;
         CREATE INDEX operations_state_id ON operations (state, id);
         CREATE INDEX operations_route_state_id ON operations (route, state, id);
         CREATE INDEX operations_state_updated ON operations (state, updated_at);",
    );
}

/// Runs `sql` on the stopped gateway's store and forgets that migration
/// `version` ran, in one transaction: the next start runs it again.
fn undone(store: &std::path::Path, version: u32, sql: &str) {
    let conn = rusqlite::Connection::open(store).unwrap();
    conn.execute_batch(&format!(
        "BEGIN; {sql} DELETE FROM _sqlx_migrations WHERE version = {version}; COMMIT;"
    ))
    .unwrap();
}

/// The indexes on `operations` that the migrations made, by name.
fn index_names(store: &std::path::Path) -> Vec<String> {
    let conn = rusqlite::Connection::open(store).unwrap();
    conn.prepare(
        "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'operations'
            AND name NOT LIKE 'sqlite_%' ORDER BY name",
    )
    .unwrap()
    .query_map([], |row| row.get(0))
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}

/// Puts the identity index back as the release before migration 0011 had
/// it (route first, `operations_key_id` beside it), and forgets that 0011
/// ran.
fn identity_as_before_0011(store: &std::path::Path) {
    undone(
        store,
        11,
        "DROP INDEX operations_identity;
         DROP INDEX operations_superseded;
         CREATE UNIQUE INDEX operations_identity ON operations (route, scope, idem_key)
            WHERE superseded_at IS NULL;
         CREATE INDEX operations_key_id ON operations (idem_key, id);",
    );
}

/// Puts the digests back as hex text, as the release before migration
/// 0007 kept them (before 0011 too), and forgets that 0007 ran.
fn digests_as_before_0007(store: &std::path::Path) {
    held_twins_as_before_0013(store);
    identity_as_before_0011(store);
    let conn = rusqlite::Connection::open(store).unwrap();
    let mut sql = String::from("BEGIN; DROP INDEX operations_identity;");
    for column in ["scope", "fingerprint", "request_body_sha256"] {
        sql += &format!(
            "ALTER TABLE operations ADD COLUMN {column}_hex TEXT NOT NULL DEFAULT '';
             UPDATE operations SET {column}_hex = lower(hex({column}));
             ALTER TABLE operations DROP COLUMN {column};
             ALTER TABLE operations RENAME COLUMN {column}_hex TO {column};"
        );
    }
    sql += "CREATE UNIQUE INDEX operations_identity ON operations (route, scope, idem_key)
                WHERE superseded_at IS NULL;
            DELETE FROM _sqlx_migrations WHERE version = 7;
            COMMIT;";
    conn.execute_batch(&sql).unwrap();
}

/// A route's identity settings are kept in the store: a start that would
/// leave operations held under the old ones unfound — scope headers
/// reordered, a route renamed — is refused, saying what changed and what
/// it holds (their retries would be new writes: sent again, before); the
/// previous settings start, and the held write is still held; the
/// operator may accept the change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_would_leave_held_operations_unfound_is_refused() {
    const SCOPED: &str = "scope_headers = [\"authorization\", \"x-tenant\"]";
    let mut gw = spawn_gateway_with(Setup::route(SCOPED).admin()).await;
    let done = write(gw.addr(), "/invoices", Some("done"), BODY).await;
    assert_fresh_created(&done);
    let lost = write(gw.addr(), "/status/502", Some("lost"), BODY).await;
    assert_eq!(lost.status, 502, "held unknown: {:?}", lost.body);
    gw.shutdown().await;
    let before = gw.toml.clone();
    let reordered = before.replace(SCOPED, "scope_headers = [\"x-tenant\", \"authorization\"]");
    let renamed = before.replace("name = \"api\"", "name = \"api-v2\"");
    for (changed, says) in [
        (&reordered, "route `api`: its identity settings changed"),
        (&renamed, "route `api` is no longer configured"),
    ] {
        gw.toml = changed.clone();
        let refused = gw.try_start().await.err().expect("refused").to_string();
        assert!(refused.contains(says), "{refused}");
        assert!(
            refused.contains("1 held") && refused.contains("1 settled"),
            "{refused}"
        );
        assert!(refused.contains("--accept-route-changes"), "{refused}");
    }
    gw.toml = before;
    gw.start_again().await;
    write(gw.addr(), "/status/502", Some("lost"), BODY)
        .await
        .assert_operation_problem(409, "outcome-unknown", "unknown");
    gw.assert_retry_replays(("/invoices", "done", BODY), &done, 1)
        .await;
    gw.shutdown().await;
    gw.toml = reordered;
    gw.accept_route_changes = true;
    gw.start_again().await;
    // Accepted: the new settings are kept, and the next start takes them.
    gw.shutdown().await;
    gw.accept_route_changes = false;
    gw.start_again().await;
}

/// A start whose routes send a held operation's path to another route —
/// a route with a longer prefix added, or its own prefix changed — left
/// it unfound: the retry was that route's new write, sent again. Refused
/// like a renamed route, naming the route that takes the path; accepted,
/// the retry is indeed a new write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_routes_a_held_operation_elsewhere_is_refused() {
    let mut gw = spawn_gateway_with(Setup::route("").admin()).await;
    let lost = write(gw.addr(), "/status/502", Some("lost"), BODY).await;
    assert_eq!(lost.status, 502, "held unknown: {:?}", lost.body);
    let done = write(gw.addr(), "/invoices", Some("done"), BODY).await;
    assert_fresh_created(&done);
    gw.shutdown().await;
    let before = gw.toml.clone();
    let upstream = format!("upstream = \"{}\"\n", gw.upstream.url());
    let added =
        format!("{before}\n[[routes]]\nname = \"status\"\npath_prefix = \"/status\"\n{upstream}");
    let moved = before.replace("path_prefix = \"/\"", "path_prefix = \"/invoices\"");
    assert_ne!(moved, before, "the route's prefix is written out");
    for (changed, says) in [
        (&added, "paths route `status` takes now"),
        (&moved, "paths no route takes now"),
    ] {
        gw.toml = changed.clone();
        let refused = gw.try_start().await.err().expect("refused").to_string();
        assert!(
            refused.contains("route `api`: operations held"),
            "{refused}"
        );
        assert!(refused.contains(says), "{refused}");
        assert!(refused.contains("1 held"), "{refused}");
    }
    // The settled write stays found under the new route: no refusal for it.
    gw.toml = added;
    gw.accept_route_changes = true;
    gw.start_again().await;
    let retry = write(gw.addr(), "/status/502", Some("lost"), BODY).await;
    assert_eq!(
        retry.status, 502,
        "a new write on `status`: {:?}",
        retry.body
    );
    let sent = gw.upstream.requests();
    let lost_sent = sent.iter().filter(|r| r.uri == "/status/502").count();
    assert_eq!(lost_sent, 2, "accepted: the held write sent again");
}

/// A route paused and then renamed stays paused in the store, reported
/// for good (on `/admin/stats` with its pause, marked no longer
/// configured), until it is resumed under its old name; it cannot be
/// paused again (404 `no-route`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_left_by_a_renamed_route_can_be_resumed() {
    let mut gw = spawn_gateway_with(Setup::route("").admin()).await;
    let paused = gw.admin("POST", "/admin/routes/api/pause", "").await;
    assert_eq!(paused.status, 200, "{:?}", paused.body);
    gw.shutdown().await;
    gw.toml = gw.toml.replace("name = \"api\"", "name = \"api-v2\"");
    gw.start_again().await;
    let stats = gw.admin("GET", "/admin/stats", "").await.json();
    assert_eq!(
        stats["paused_routes"],
        serde_json::json!(["api"]),
        "{stats}"
    );
    // Listed with its pause, after the configured routes and marked so,
    // as the console shows it.
    assert_eq!(
        stats["routes"],
        serde_json::json!([
            {"name": "api-v2", "configured": true, "path_prefix": "/", "paused": false,
             "reason": null, "paused_by": null},
            {"name": "api", "configured": false, "path_prefix": null, "paused": true,
             "reason": "paused by an operator", "paused_by": "operator"},
        ]),
        "{stats}"
    );
    gw.admin("POST", "/admin/routes/api/pause", "")
        .await
        .assert_problem(404, "no-route");
    let resumed = gw.admin("POST", "/admin/routes/api/resume", "").await;
    assert_eq!(resumed.status, 200, "{:?}", resumed.body);
    let stats = gw.admin("GET", "/admin/stats", "").await.json();
    assert_eq!(stats["paused_routes"], serde_json::json!([]), "{stats}");
    assert_eq!(stats["routes"][1], serde_json::Value::Null, "{stats}");
    gw.admin("POST", "/admin/routes/api/resume", "")
        .await
        .assert_problem(404, "no-route");
}

/// What does not change an operation's identity does not refuse a start:
/// `ignore_fields` in another order, or named twice; and a route renamed
/// (accepted) and then put back as it was finds its held write again.
/// Both were refused (the second advising what it then refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_keeps_identities_is_not_refused() {
    const IGNORED: &str = "ignore_fields = [\"/t\", \"/z\"]";
    let mut gw = spawn_gateway_with(Setup::route(IGNORED).admin()).await;
    let lost = write(gw.addr(), "/status/502", Some("lost"), BODY).await;
    assert_eq!(lost.status, 502, "held unknown: {:?}", lost.body);
    gw.shutdown().await;
    let first = gw.toml.clone();
    gw.toml = first.replace(IGNORED, "ignore_fields = [\"/z\", \"/t\", \"/t\"]");
    gw.start_again().await;
    gw.shutdown().await;
    gw.toml = first.replace("name = \"api\"", "name = \"api-v2\"");
    gw.accept_route_changes = true;
    gw.start_again().await;
    gw.shutdown().await;
    gw.accept_route_changes = false;
    gw.toml = first;
    gw.start_again().await;
    write(gw.addr(), "/status/502", Some("lost"), BODY)
        .await
        .assert_operation_problem(409, "outcome-unknown", "unknown");
    assert_eq!(gw.upstream.writes(), 0);
}
