//! What survives a restart, in process: completed operations are replayed
//! after a graceful shutdown and a new start on the same store, and one store
//! serves one gateway at a time, until that gateway shuts down.
//!
//! The tests that run the real binary live in `tests/process.rs`, not here:
//! a child spawned by a concurrent test inherits the store's lock fd between
//! fork and exec, so a restart in this process could briefly find the store
//! still locked.

mod common;

use common::*;

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
