//! The store failing (docs/requests.md, "What each failure becomes"): another SQLite connection holds the
//! write lock past the store's 5 s busy timeout.
//! - Before sending: 503 `store-unavailable`, nothing reaches the upstream,
//!   and once the store is back the same key is forwarded exactly once.
//! - Reads (the admin API, the status lookup) answer while writes wait.
//! - After sending: the client gets 503 `store-unavailable` with the
//!   operation id, idemgate keeps recording in the background, and once the
//!   store is back the retry is a replay of the one write that happened.

use std::time::Duration;

use crate::common::*;

const TASK: &str = r#"{"task":"file the report"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_cannot_claim_sends_nothing() {
    let gw = spawn_gateway("").await;
    let lock = WriteLock::take(&gw).await;

    let refused = write(gw.addr(), "/tasks", Some("busy-1"), TASK).await;
    refused.assert_problem(503, "store-unavailable");
    assert!(refused.header("retry-after").is_some());
    assert!(gw.upstream.requests().is_empty(), "nothing was sent");

    lock.release().await;
    let sent = write(gw.addr(), "/tasks", Some("busy-1"), TASK).await;
    assert_fresh_created(&sent);
    assert_eq!(gw.upstream.writes(), 1);
    let again = write(gw.addr(), "/tasks", Some("busy-1"), TASK).await;
    assert_replay_of(&again, &sent);
    assert_eq!(gw.upstream.writes(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_the_store_refused_is_recorded_once_it_is_back() {
    let gw = spawn_gateway("").await;
    let addr = gw.addr();
    let first =
        tokio::spawn(async move { write(addr, "/slow?ms=600", Some("busy-2"), TASK).await });
    gw.upstream.wait_for_requests(1).await;
    // The claim is committed and the request is upstream: now the record
    // will find the store locked.
    let lock = WriteLock::take(&gw).await;

    let first = first.await.expect("first write");
    let problem = first.assert_problem(503, "store-unavailable");
    assert!(
        problem["operation_id"]
            .as_str()
            .is_some_and(|id| !id.is_empty()),
        "the client learns which operation: {problem}"
    );
    assert_eq!(gw.upstream.writes(), 1);

    lock.release().await;
    let replay = write_until(
        addr,
        "/slow?ms=600",
        "busy-2",
        TASK,
        Duration::from_secs(10),
        |r| r.is_replay(),
    )
    .await;
    assert_eq!(replay.status, 201, "the upstream's answer, recorded late");
    assert_eq!(gw.upstream.writes(), 1, "never sent twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_answer_while_a_write_waits_for_the_store() {
    let gw = spawn_gateway_with(Setup::route("").admin()).await;
    let done = write(gw.addr(), "/tasks", Some("read-1"), TASK).await;
    assert_fresh_created(&done);
    let lock = WriteLock::take(&gw).await;
    // A write queues on the writer, which waits for the lock.
    let addr = gw.addr();
    let waiting = tokio::spawn(async move { write(addr, "/tasks", Some("read-2"), TASK).await });
    // Reads do not wait for the writer (whose every transaction waits for
    // the lock): the operator's view and the status lookup answer while
    // the write is still waiting.
    let shown = gw.operation("read-1").await;
    assert_eq!(shown["state"], "completed");
    let status = send(
        gw.addr(),
        "GET",
        "/.idemgate/operations/read-1",
        &[("authorization", ALICE)],
        bytes::Bytes::new(),
    )
    .await;
    assert_eq!(status.status, http::StatusCode::OK, "{:?}", status.body);
    assert!(!waiting.is_finished(), "the reads came first");
    lock.release().await;
    assert_fresh_created(&waiting.await.expect("write task"));
}
