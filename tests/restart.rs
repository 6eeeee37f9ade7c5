//! What survives the gateway's own death: completed operations are replayed
//! after a restart on the same store, one store serves one gateway at a time
//! (in process and as separate processes), and an operation in flight when
//! the process is SIGKILLed is `unknown` afterwards — never re-sent.

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

/// A config file for the binary in `dir`, on `dir/idemgate.db`.
fn binary_config(dir: &std::path::Path, upstream: &FakeUpstream) -> std::path::PathBuf {
    let toml = gateway_toml(&dir.join("idemgate.db"), &upstream.url(), "/", "");
    write_config(dir, "idemgate.toml", &toml)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_process_on_same_store_exits_naming_the_store() {
    let upstream = FakeUpstream::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = binary_config(dir.path(), &upstream);
    let first = BinaryGateway::start(&config, &dir.path().join("first.log")).await;

    let mut second = binary();
    second.arg("serve").arg("--config").arg(&config);
    let (status, stdout, stderr) = run_to_exit(second).await;

    assert!(!status.success(), "second process exited {status}");
    assert!(
        !stdout.contains("listening"),
        "second process listened: {stdout}"
    );
    let store = dir.path().join("idemgate.db");
    assert!(
        stderr.contains(store.to_str().expect("utf-8 path")),
        "stderr does not name {}:\n{stderr}",
        store.display()
    );

    // The first process still serves.
    assert_fresh_created(&write(first.proxy, "/invoices", Some("inv-7"), BODY).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operation_in_flight_at_sigkill_is_unknown_after_restart() {
    let upstream = FakeUpstream::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = binary_config(dir.path(), &upstream);
    let mut first = BinaryGateway::start(&config, &dir.path().join("first.log")).await;

    // The upstream commits and then holds the request: the client never
    // gets an answer from this process.
    let proxy = first.proxy;
    let in_flight = tokio::spawn(async move { write(proxy, "/hold", Some("held-1"), BODY).await });
    upstream.wait_for_writes(1).await;
    first.kill();
    in_flight.abort(); // its connection died with the process

    let second = BinaryGateway::start(&config, &dir.path().join("second.log")).await;
    let retry = write(second.proxy, "/hold", Some("held-1"), BODY).await;

    retry.assert_operation_problem(409, "outcome-unknown", "unknown");
    let again = write(second.proxy, "/hold", Some("held-1"), BODY).await;
    again.assert_operation_problem(409, "outcome-unknown", "unknown");
    assert_eq!(upstream.writes(), 1, "never re-sent after the crash");
    assert_eq!(upstream.requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_operation_survives_sigkill() {
    let upstream = FakeUpstream::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = binary_config(dir.path(), &upstream);
    let mut first = BinaryGateway::start(&config, &dir.path().join("first.log")).await;
    let original = write(first.proxy, "/invoices", Some("inv-7"), BODY).await;
    assert_fresh_created(&original);

    first.kill();
    let second = BinaryGateway::start(&config, &dir.path().join("second.log")).await;
    let retry = write(second.proxy, "/invoices", Some("inv-7"), BODY).await;

    assert_replay_of(&retry, &original);
    assert_eq!(upstream.writes(), 1);
}
