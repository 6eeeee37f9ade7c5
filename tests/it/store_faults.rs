//! The store failing (docs/requests.md, "What each failure becomes"): another SQLite connection holds the
//! write lock past the store's 5 s busy timeout.
//! - Before sending: 503 `store-unavailable`, nothing reaches the upstream,
//!   and once the store is back the same key is forwarded exactly once.
//! - Reads (the admin API, the status lookup) answer while writes wait.
//! - After sending: the client gets 503 `store-unavailable` with the
//!   operation id, idemgate keeps recording in the background, and once the
//!   store is back the retry is a replay of the one write that happened.
//!
//! And the store's files refusing to grow (a full disk), in the real
//! `idemgate serve`: every write is 503 `store-unavailable`, and so are
//! `/readyz` and `idemgate healthcheck` (docs/operating.md, "Logs and
//! health checks": ready is "the store can take a write"), until the
//! files may grow again.

use std::process::Command;
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

/// Sets the soft limit on the size of the files process `pid` writes
/// (`RLIMIT_FSIZE`, with util-linux's `prlimit`): `"0"`, every write to a
/// file fails; `"unlimited"`, up to the hard limit, which stays as it was.
fn limit_file_size(pid: u32, soft: &str) {
    let status = child_status(
        Command::new("prlimit")
            .arg("--pid")
            .arg(pid.to_string())
            .arg(format!("--fsize={soft}:")),
    )
    .expect("run prlimit");
    assert!(status.success(), "prlimit --fsize={soft}: failed");
}

/// `idemgate healthcheck --admin http://ADDR`: whether it exited 0.
async fn healthcheck(admin: std::net::SocketAddr) -> bool {
    let mut cmd = binary();
    cmd.arg("healthcheck")
        .arg("--admin")
        .arg(format!("http://{admin}"));
    run_to_exit(cmd).await.0.success()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_ready_while_the_store_cannot_grow_its_files() {
    let upstream = FakeUpstream::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let toml = gateway_toml(&dir.path().join("idemgate.db"), &upstream.url(), "/", "");
    let config = write_config(dir.path(), "idemgate.toml", &toml);
    // Through `sh`, which leaves SIGXFSZ ignored across its `exec`: a
    // write past the limit then fails (EFBIG) as one on a full disk does
    // (ENOSPC), instead of killing the process. Reads go on.
    let mut cmd = Command::new("sh");
    cmd.args(["-c", r#"trap "" XFSZ; exec "$0" "$@""#])
        .arg(env!("CARGO_BIN_EXE_idemgate"))
        .arg("serve")
        .arg("--config")
        .arg(&config);
    let gw = BinaryGateway::spawn(cmd, &dir.path().join("gateway.log")).await;
    let ready = || async { send(gw.admin, "GET", "/readyz", &[], bytes::Bytes::new()).await };
    let done = write(gw.proxy, "/tasks", Some("full-1"), TASK).await;
    assert_fresh_created(&done);
    assert_eq!(ready().await.status, 200);
    assert!(healthcheck(gw.admin).await, "ready before");

    limit_file_size(gw.pid(), "0");
    let refused = write(gw.proxy, "/tasks", Some("full-2"), TASK).await;
    refused.assert_problem(503, "store-unavailable");
    assert_eq!(upstream.writes(), 1, "nothing was sent");
    // What the store held is still read.
    assert_replay_of(
        &write(gw.proxy, "/tasks", Some("full-1"), TASK).await,
        &done,
    );
    // Readiness is a write too: it fails as the writes do. (A transaction
    // that wrote nothing committed and said ready.)
    ready().await.assert_problem(503, "store-unavailable");
    assert!(!healthcheck(gw.admin).await, "ready while no write commits");

    limit_file_size(gw.pid(), "unlimited");
    eventually("/readyz to say ready again", || async {
        (ready().await.status == 200).then_some(())
    })
    .await;
    assert!(healthcheck(gw.admin).await, "ready after");
    assert_fresh_created(&write(gw.proxy, "/tasks", Some("full-2"), TASK).await);
    assert_eq!(upstream.writes(), 2);
}

/// A store file replaced under the running gateway (a restore moved over
/// it) took its lock with it: the gateway went on writing into a file no
/// longer at the path, said ready, and a second gateway could start on
/// the path, the same key then sent through each. Within a second of the
/// swap every write is refused, nothing sent, and `/readyz` says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_file_replaced_under_the_gateway_takes_no_more_writes() {
    swapped_under_the_gateway(
        |store| {
            let restored = store.with_extension("restored");
            std::fs::copy(store, &restored).expect("copy");
            std::fs::rename(&restored, store).expect("move over the store");
        },
        "was replaced under this process",
    )
    .await;
}

/// Its log (`-wal`) removed: the commits not yet copied into the file went
/// with it, and a retry after the restart of a write the gateway answered
/// was sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_log_removed_under_the_gateway_takes_no_more_writes() {
    swapped_under_the_gateway(
        |store| {
            let mut wal = store.as_os_str().to_owned();
            wal.push("-wal");
            std::fs::remove_file(wal).expect("remove the log");
        },
        "log",
    )
    .await;
}

/// A gateway whose store `swap` changes under it once it wrote: within a
/// second every write is refused, nothing sent, `/readyz` says so, and
/// its log says `said`.
async fn swapped_under_the_gateway(swap: impl FnOnce(&std::path::Path), said: &str) {
    let upstream = FakeUpstream::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("idemgate.db");
    let toml = gateway_toml(&store, &upstream.url(), "/", "");
    let config = write_config(dir.path(), "idemgate.toml", &toml);
    let gw = BinaryGateway::start(&config, &dir.path().join("gateway.log")).await;
    assert_fresh_created(&write(gw.proxy, "/tasks", Some("before"), TASK).await);

    swap(&store);
    let tries = std::sync::atomic::AtomicUsize::new(0);
    let refused = eventually("writes to be refused", || async {
        let n = tries.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let answer = write(gw.proxy, "/tasks", Some(&format!("after-{n}")), TASK).await;
        (answer.status == 503).then_some(answer)
    })
    .await;
    refused.assert_problem(503, "store-unavailable");
    let ready = send(gw.admin, "GET", "/readyz", &[], bytes::Bytes::new()).await;
    assert_eq!(ready.status, 503, "{:?}", ready.body);
    assert!(
        String::from_utf8_lossy(&ready.body).contains("under this process"),
        "{:?}",
        ready.body
    );
    // Each write before the refusal went to the old file: at most those.
    let sent = upstream.writes();
    let again = write(gw.proxy, "/tasks", Some("after-refused"), TASK).await;
    again.assert_problem(503, "store-unavailable");
    assert_eq!(upstream.writes(), sent, "nothing sent once refused");
    gw.wait_for_log(said).await;
}
