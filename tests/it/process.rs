//! The real `idemgate serve` process: a second process on the same store
//! (also through a symlink, and with the empty files beside the store
//! removed) exits non-zero naming the store, an operation in flight when the process
//! is SIGKILLed is `unknown` afterwards (409 `outcome-unknown`, never
//! re-sent), and a completed one is still replayed; a SIGTERM while the
//! process starts stops it (exit 0), not the signal's default.

use std::process::{Command, Stdio};

use crate::common::*;

const BODY: &str = r#"{"invoice":"inv-7","amount":250}"#;

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

    // The same store reached through a symlink to its file is the same
    // store: refused too.
    let linked = tempfile::tempdir().expect("tempdir");
    let alias = linked.path().join("alias.db");
    std::os::unix::fs::symlink(&store, &alias).expect("symlink");
    // Its scope key, as a deployment reaching it so would give it.
    let key = dir.path().join("idemgate.db.scope-key");
    std::fs::copy(&key, linked.path().join("alias.db.scope-key")).expect("scope key");
    let toml = gateway_toml(&alias, &upstream.url(), "/", "");
    let aliased = write_config(linked.path(), "idemgate.toml", &toml);
    let mut third = binary();
    third.arg("serve").arg("--config").arg(&aliased);
    let (status, stdout, stderr) = run_to_exit(third).await;
    assert!(
        !status.success(),
        "a process through a symlink exited {status}"
    );
    assert!(!stdout.contains("listening"), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("in use by another idemgate process"),
        "refused by the store's lock:\n{stderr}"
    );

    // The first process still serves.
    assert_fresh_created(&write(first.proxy, "/invoices", Some("inv-7"), BODY).await);
}

/// A new store's files hold bodies, answers and keys: they were made
/// 0644 under the usual umask, readable by every user of the host unless
/// a unit's `UMask` said otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_stores_files_are_its_owners_alone() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let upstream = FakeUpstream::start().await;
    let store = dir.path().join("idemgate.db");
    let toml = gateway_toml_with(&store, &upstream.url(), &Setup::route(""));
    let config = write_config(dir.path(), "idemgate.toml", &toml);
    let gateway = BinaryGateway::start(&config, &dir.path().join("gw.log")).await;
    assert_fresh_created(&write(gateway.proxy, "/invoices", Some("inv-mode"), BODY).await);
    for suffix in ["", "-wal", "-shm", ".scope-key"] {
        let file = format!("{}{suffix}", store.display());
        let mode = std::fs::metadata(&file).expect(&file).permissions().mode();
        assert_eq!(mode & 0o077, 0, "{file}: {:o}", mode & 0o777);
    }
}

/// A store file of two names (a hard link) is refused, by either name:
/// SQLite keeps its log beside the name it opens, so a gateway started
/// through the other name after a crash would not see what the last one
/// committed, and would send those writes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_file_of_two_names_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("idemgate.db");
    std::fs::write(&store, b"").expect("store file");
    let other = dir.path().join("other.db");
    std::fs::hard_link(&store, &other).expect("hard link");
    for name in [&store, &other] {
        let mut serve = binary();
        serve
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
            ])
            .args(["--upstream", "http://127.0.0.1:9"])
            .arg("--store")
            .arg(format!("sqlite://{}", name.display()));
        let (status, stdout, stderr) = run_to_exit(serve).await;
        assert!(!status.success(), "{}: exited {status}", name.display());
        assert!(!stdout.contains("listening"), "{stdout}");
        assert!(stderr.contains("2 names (hard links)"), "{stderr}");
    }
}

/// The lock is not a file beside the store: with the empty ones removed
/// (what an operator tidying up may take for stale; releases before this
/// one locked an empty `<file>.lock`, and a second process then started and
/// marked the first's write in flight `unknown`), a second process is
/// still refused, and the first's write in flight is its own to record.
/// A start that fails for another reason than the store (here the proxy's
/// port is taken) says what failed, and does not blame the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_failing_elsewhere_than_the_store_does_not_name_it() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("sqlite://{}", dir.path().join("idemgate.db").display());
    let mut serve = binary();
    serve
        .args([
            "serve",
            "--listen",
            &taken.local_addr().expect("addr").to_string(),
        ])
        .args(["--admin-listen", "127.0.0.1:0"])
        .args(["--upstream", "http://127.0.0.1:9", "--store", &store]);
    let (status, _, stderr) = run_to_exit(serve).await;
    assert!(!status.success());
    assert!(stderr.contains("cannot listen on"), "{stderr}");
    assert!(!stderr.contains("(store"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_is_refused_with_the_empty_files_beside_the_store_removed() {
    let upstream = FakeUpstream::start().await;
    upstream.script(Scripted::Hold);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = binary_config(dir.path(), &upstream);
    let first = BinaryGateway::start(&config, &dir.path().join("first.log")).await;
    let proxy = first.proxy;
    let in_flight =
        tokio::spawn(async move { write(proxy, "/scripted", Some("inv-8"), BODY).await });
    upstream.wait_for_writes(1).await;

    let store = dir.path().join("idemgate.db");
    for entry in std::fs::read_dir(dir.path()).expect("read dir").flatten() {
        let beside = entry.path() != store
            && entry
                .file_name()
                .to_string_lossy()
                .starts_with("idemgate.db");
        if beside && entry.metadata().is_ok_and(|m| m.len() == 0) {
            std::fs::remove_file(entry.path()).expect("remove");
        }
    }
    let mut second = binary();
    second.arg("serve").arg("--config").arg(&config);
    let (status, stdout, stderr) = run_to_exit(second).await;
    assert!(!status.success(), "second process exited {status}");
    assert!(!stdout.contains("listening"), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("in use by another idemgate process")
            && stderr.contains(store.to_str().expect("utf-8 path")),
        "{stderr}"
    );

    upstream.release_one();
    assert_fresh_created(&in_flight.await.expect("client task"));
    assert_eq!(upstream.writes(), 1);
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

/// A SIGTERM while the process starts (here, waiting on a PostgreSQL
/// server that accepts and never answers) stops it, exit 0, instead of
/// killing it before its handler is in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_while_it_starts_stops_it() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = silent.local_addr().expect("addr").port();
    let dir = tempfile::tempdir().expect("tempdir");
    let toml = format!(
        "[store]\nurl = \"postgres://idemgate@127.0.0.1:{port}/test\"\n\
         [[routes]]\nname = \"r\"\nupstream = \"http://127.0.0.1:9\"\n"
    );
    let config = write_config(dir.path(), "idemgate.toml", &toml);
    let log = dir.path().join("serve.log");
    let mut cmd = binary();
    cmd.arg("serve").arg("--config").arg(&config);
    // 32 bytes in base64, as a shared store needs.
    cmd.env("IDEMGATE_SCOPE_KEY", "A".repeat(43) + "=");
    let stderr = std::fs::File::create(&log).expect("stderr file");
    let mut child = spawn_child(
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr),
    )
    .expect("spawn");
    // The process is starting: it asks the store's server, which says nothing.
    let (_held, _) = tokio::time::timeout(WAIT, silent.accept())
        .await
        .expect("the process connects")
        .expect("accept");
    let kill = child_status(Command::new("kill").args(["-s", "TERM", &child.id().to_string()]));
    assert!(kill.expect("run kill").success());
    let status = within_wait(|| {
        let exited = child.try_wait().expect("wait");
        async move { exited }
    })
    .await
    .expect("the process exits");
    let logged = read_to_string(&log);
    assert_eq!(status.code(), Some(0), "{status:?}\n{logged}");
}
