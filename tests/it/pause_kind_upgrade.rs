//! Migration 0008 (who paused a route: a column of its own, no longer the
//! prefix of the reason) on a store written before it. An older gateway's
//! store holds a latch's pause and an operator's, stored the old way; the
//! store of today, opened on it, migrates it and tells them apart as the
//! prefix rule did, on both backends.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use idemgate::config::Durability;
use idemgate_model::clock::{Clock, ManualClock};
use idemgate_store::{Maintenance, Operators, PausedBy, RoutePause, StoreError};
use idemgate_store_postgres::{PostgresSettings, PostgresStore};
use idemgate_store_sqlite::SqliteStore;
use sqlx::Connection;
use sqlx::migrate::Migrator;
use sqlx::sqlite::SqliteConnectOptions;

/// The pauses an older gateway stored, without `paused_by`.
const OLD_PAUSES: &str = "INSERT INTO route_pauses (route, reason, updated_at) VALUES
    ('api', 'pause_after_unknown: 3 operations unknown', 1),
    ('ops', 'maintenance', 2)";

/// A folder with `backend`'s migrations before 0008, as an older gateway
/// had them embedded (same files, so the same checksums).
fn migrations_before_pause_kind(backend: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("crates/store-{backend}"))
        .join("migrations");
    let mut copied = 0;
    for entry in std::fs::read_dir(&source).expect("the migrations folder") {
        let path = entry.expect("a migration").path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if name.as_str() < "0008" {
            std::fs::copy(&path, dir.path().join(&name)).expect("copy a migration");
            copied += 1;
        }
    }
    assert!(
        copied >= 5,
        "{backend}: only {copied} migrations before 0008"
    );
    dir
}

/// Migrates `$conn` as an older gateway of `$backend` did, stores its
/// pauses the old way and closes it (a macro: the two backends'
/// connections share no trait that both `Migrator::run` and a query take).
macro_rules! write_old_store {
    ($conn:expr, $backend:literal) => {{
        let mut conn = $conn;
        let old = migrations_before_pause_kind($backend);
        let migrator = Migrator::new(old.path()).await.expect("old migrations");
        migrator
            .run(&mut conn)
            .await
            .expect("the old migrations run");
        sqlx::query(OLD_PAUSES)
            .execute(&mut conn)
            .await
            .expect("old pauses");
        conn.close().await.expect("close the old store");
    }};
}

/// The upgraded store says of the old pauses who paused each, as the
/// prefix rule did.
async fn says_who_paused(opened: Result<impl Operators + Maintenance, StoreError>) {
    let store = opened.expect("the store of today opens the old one");
    let expected = vec![
        RoutePause {
            route: "api".into(),
            reason: "pause_after_unknown: 3 operations unknown".into(),
            by: PausedBy::Latch,
        },
        RoutePause {
            route: "ops".into(),
            reason: "maintenance".into(),
            by: PausedBy::Operator,
        },
    ];
    assert_eq!(store.pauses().await.unwrap(), expected);
    store.close().await;
}

fn clock() -> Arc<dyn Clock> {
    ManualClock::new()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_store_with_old_pauses_keeps_who_paused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("old.db");
    let options = SqliteConnectOptions::new()
        .filename(&file)
        .create_if_missing(true)
        .foreign_keys(false);
    let conn = sqlx::SqliteConnection::connect_with(&options).await;
    write_old_store!(conn.expect("open the old store"), "sqlite");

    let (durability, owner) = (Durability::Normal, "gw-1".to_string());
    let opened = SqliteStore::open(&file, durability, owner, clock(), test_store_keys());
    says_who_paused(opened.await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL at 127.0.0.1:5432 (.ci/run runs it)"]
async fn a_postgres_store_with_old_pauses_keeps_who_paused() {
    let schema = PgSchema::create().await;
    let conn = sqlx::PgConnection::connect(&schema.url).await;
    write_old_store!(conn.expect("connect to the schema"), "postgres");

    let (lease, owner) = (Duration::from_secs(10), "gw-1".to_string());
    let opened = PostgresStore::open(
        &schema.url,
        PostgresSettings {
            durability: Durability::Normal,
            lease,
            require_synchronous_standby: false,
        },
        owner,
        clock(),
        test_store_keys(),
    );
    says_who_paused(opened.await).await;
}
