//! Running idemgate the way a service manager or an orchestrator does
//! (docs/deploying.md, "Under systemd" and "A container image"):
//!
//! - the probes: `/livez` answers while the process serves, draining
//!   included; `/readyz` says 503 `draining` from the moment a shutdown
//!   starts, while the request in flight still finishes;
//! - `/readyz` answers within a second whatever the store does: 503
//!   `store-unavailable` when it does not answer within 900 ms;
//! - `idemgate healthcheck` exits 0 only when `/readyz` says ready
//!   (`{"status":"ready"}`, not any 200), plain or over TLS (a certificate
//!   checked against `--server-name` when given), refuses an `--admin`
//!   with a query, a fragment or a password, and gives up within its bound
//!   on a silent listener;
//! - systemd's notify protocol, received on a `NOTIFY_SOCKET` of the
//!   test's own: `READY=1` once serving, `RELOADING=1` (with
//!   `MONOTONIC_USEC`) and `READY=1` around a SIGHUP with the reload's
//!   result in `STATUS=`, `STOPPING=1` at SIGTERM, `WATCHDOG=1` when
//!   `WATCHDOG_USEC` asks for it; a socket named `@name` is in the
//!   abstract namespace, and an empty `NOTIFY_SOCKET` is none;
//! - `contrib/idemgate.service` passes `systemd-analyze verify`;
//! - the `Containerfile`'s image, built with buildah, runs its own
//!   binary from its own filesystem under `chroot` (`.ci/build-image`).

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common::*;

/// `GET path` on the admin listener, over a new connection.
async fn probe(admin: std::net::SocketAddr, path: &str) -> Response {
    send(admin, "GET", path, &[], bytes::Bytes::new()).await
}

/// A shutdown held open by a write in flight: the write's client task and
/// the shutdown's, the upstream holding its answer until `release_one`.
async fn drain_around_a_write(
    gw: &mut TestGateway,
) -> (
    tokio::task::JoinHandle<Response>,
    tokio::task::JoinHandle<()>,
) {
    let addr = gw.addr();
    gw.upstream.script(Scripted::Hold);
    let in_flight =
        tokio::spawn(async move { write(addr, "/scripted", Some("drain-1"), r#"{"n":1}"#).await });
    gw.upstream.wait_for_writes(1).await;
    (in_flight, gw.begin_shutdown())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_answers_within_a_second_when_the_store_does_not() {
    let gw = spawn_gateway("").await;
    // The store's writer waits out its 5 s busy timeout behind this lock.
    let lock = WriteLock::take(&gw).await;
    let within = Duration::from_millis(1500);
    let ready = try_send(
        gw.admin_addr(),
        "GET",
        "/readyz",
        &[],
        bytes::Bytes::new(),
        within,
    )
    .await
    .unwrap_or_else(|e| panic!("/readyz did not answer within {within:?}: {e:?}"));
    ready.assert_problem_mentioning(503, "store-unavailable", "did not answer within");
    lock.release().await;
    let ready = probe(gw.admin_addr(), "/readyz").await;
    assert_eq!(ready.status, 200, "ready again once the store answers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_says_draining_from_the_start_of_a_shutdown_and_livez_stays_up() {
    let mut gw = spawn_gateway("").await;
    let admin = gw.admin_addr();
    for path in ["/livez", "/healthz", "/readyz"] {
        assert_eq!(probe(admin, path).await.status, 200, "{path} before");
    }
    let (in_flight, shutdown) = drain_around_a_write(&mut gw).await;
    let draining = eventually("/readyz to say draining", || async {
        let ready = probe(admin, "/readyz").await;
        (ready.status == 503).then_some(ready)
    })
    .await;
    draining.assert_problem(503, "draining");
    // Still alive, still draining: the write in flight holds the shutdown.
    assert_eq!(probe(admin, "/livez").await.status, 200, "/livez draining");
    assert!(
        !shutdown.is_finished(),
        "shutdown ended before the upstream answered"
    );

    gw.upstream.release_one();
    shutdown.await.expect("shutdown task");
    assert_fresh_created(&in_flight.await.expect("client task"));
    // The admin listener closed last.
    assert!(
        tokio::net::TcpStream::connect(admin).await.is_err(),
        "the admin listener still accepts after the shutdown"
    );
}

/// `idemgate healthcheck` with `args`: (exit 0, stdout, stderr).
async fn healthcheck(args: &[&str]) -> (bool, String, String) {
    let mut cmd = binary();
    cmd.arg("healthcheck").args(args);
    let (status, stdout, stderr) = run_to_exit(cmd).await;
    (status.success(), stdout, stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthcheck_exits_zero_only_while_readyz_says_ready() {
    let mut gw = spawn_gateway("").await;
    let url = format!("http://{}", gw.admin_addr());
    let (ready, stdout, stderr) = healthcheck(&["--admin", &url]).await;
    assert!(ready, "{stderr}");
    assert!(stdout.starts_with("ready: "), "{stdout}");

    // Draining: /readyz says 503, and so does the exit code.
    let (in_flight, shutdown) = drain_around_a_write(&mut gw).await;
    let stderr = eventually("healthcheck to fail while draining", || async {
        let (ready, _, stderr) = healthcheck(&["--admin", &url]).await;
        (!ready).then_some(stderr)
    })
    .await;
    assert!(
        stderr.contains("503") && stderr.contains("draining"),
        "{stderr}"
    );
    gw.upstream.release_one();
    shutdown.await.expect("shutdown task");
    assert_fresh_created(&in_flight.await.expect("client task"));

    // Nothing listening any more: refused, not ready.
    let (ready, _, stderr) = healthcheck(&["--admin", &url]).await;
    assert!(!ready && stderr.contains("no answer"), "{stderr}");
}

/// `TOKIO_WORKER_THREADS` is read as configuration.md says by every
/// command, not only `serve`: `0` is one thread and what is not a number
/// the default. Left to tokio, either panicked (exit 101), so a
/// container's healthcheck failed while its gateway served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthcheck_takes_any_tokio_worker_threads() {
    let gw = spawn_gateway("").await;
    let url = format!("http://{}", gw.admin_addr());
    for threads in ["0", "abc", "", "2"] {
        let mut cmd = binary();
        cmd.env("TOKIO_WORKER_THREADS", threads)
            .args(["healthcheck", "--admin", &url]);
        let (status, stdout, stderr) = run_to_exit(cmd).await;
        assert!(
            status.success(),
            "TOKIO_WORKER_THREADS={threads:?}: {status}\n{stderr}"
        );
        assert!(stdout.starts_with("ready: "), "{stdout}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthcheck_gives_up_on_a_silent_listener_within_its_timeout() {
    // Accepts connections (the kernel does) and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", silent.local_addr().expect("addr"));
    let (ready, _, stderr) = healthcheck(&["--admin", &url, "--timeout", "200ms"]).await;
    assert!(!ready, "a silent listener was taken as ready");
    assert!(stderr.contains("no whole answer within 200ms"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthcheck_never_prints_a_password_in_its_url() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = silent.local_addr().expect("addr");
    let url = format!("http://ops:s3cretpw@{addr}");
    let (ready, stdout, stderr) = healthcheck(&["--admin", &url, "--timeout", "200ms"]).await;
    assert!(!ready);
    assert!(
        !stderr.contains("s3cretpw") && !stdout.contains("s3cretpw"),
        "{stderr}"
    );
    // Refused, nothing sends it: shown masked, user and all.
    assert!(
        stderr.contains(&format!("http://***@{addr}")) && stderr.contains("no user or password"),
        "{stderr}"
    );
}

/// An `--admin` with a query or a fragment had `/readyz` appended inside
/// it, so it asked `GET /`: the console page, a 200 whatever the store
/// did, taken as ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthcheck_refuses_an_admin_url_with_a_query_or_a_fragment() {
    let gw = spawn_gateway("").await;
    // /readyz says 503 while the store's writer waits behind this lock.
    let lock = WriteLock::take(&gw).await;
    let admin = gw.admin_addr();
    let (ready, _, stderr) = healthcheck(&["--admin", &format!("http://{admin}")]).await;
    assert!(!ready && stderr.contains("store-unavailable"), "{stderr}");
    for (url, refusal) in [
        (format!("http://{admin}/?probe=1"), "no query"),
        (format!("http://{admin}/#x"), "no fragment"),
    ] {
        let (ready, stdout, stderr) = healthcheck(&["--admin", &url]).await;
        assert!(!ready, "{url} was taken as ready: {stdout}");
        assert!(
            stderr.starts_with("not ready: --admin ") && stderr.contains(refusal),
            "{stderr}"
        );
    }
    lock.release().await;
}

/// A listener that answers every request on it `200 OK` with `body`
/// (a proxy's page, another service on the port).
async fn answering_200(body: &'static str) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).await.unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(answer.as_bytes()).await;
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthcheck_takes_only_the_readiness_answer_as_ready() {
    let page = "<!doctype html><title>welcome</title>";
    let url = format!("http://{}", answering_200(page).await);
    let (ready, stdout, stderr) = healthcheck(&["--admin", &url]).await;
    assert!(
        !ready,
        "a 200 that is not /readyz's was taken as ready: {stdout}"
    );
    assert!(
        stderr.contains("not the readiness answer") && stderr.contains(page),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthcheck_reads_the_admin_listener_from_the_config_and_speaks_its_tls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let served = AdminOverTls::start(dir.path(), |ca, dir| ca.server_cert(dir, "admin")).await;
    let (bound, ca) = (served.bound(), served.ca());

    let (ready, stdout, stderr) = healthcheck(&["--config", bound, "--ca", ca]).await;
    assert!(ready, "{stderr}");
    assert!(stdout.contains("ready"), "{stdout}");
    // Without the operators' CA the certificate is not trusted.
    let (ready, _, stderr) = healthcheck(&["--config", bound]).await;
    assert!(!ready, "an untrusted certificate was accepted");
    assert!(stderr.contains("https://"), "{stderr}");
}

/// A certificate that names only the DNS name clients know the listener
/// by never matched the loopback address the healthcheck asks on, and
/// nothing could say which name to check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthcheck_and_keys_check_the_certificate_against_the_server_name_given() {
    let dir = tempfile::tempdir().expect("tempdir");
    let served = AdminOverTls::start(dir.path(), |ca, dir| {
        ca.server_cert_for(dir, "admin", &["gw.example.com"])
    })
    .await;
    let (bound, ca) = (served.bound(), served.ca());
    let gateway = &served.gateway;
    let admin = format!("https://{}", gateway.admin);

    // Checked against the address asked: not a name the certificate holds.
    let (ready, _, stderr) = healthcheck(&["--config", bound, "--ca", ca]).await;
    assert!(!ready && stderr.contains("not valid for name"), "{stderr}");
    let name = ["--server-name", "gw.example.com"];
    for target in [["--config", bound], ["--admin", &admin]] {
        let (ready, stdout, stderr) =
            healthcheck(&[&target[..], &["--ca", ca], &name].concat()).await;
        assert!(ready, "{target:?}: {stderr}");
        assert!(
            stdout.starts_with(r#"ready: {"status":"ready"}"#),
            "{stdout}"
        );
    }
    let other = [
        "--admin",
        &admin,
        "--ca",
        ca,
        "--server-name",
        "other.example.com",
    ];
    let (ready, _, stderr) = healthcheck(&other).await;
    assert!(!ready && stderr.contains("not valid for name"), "{stderr}");
    // A plain listener has no certificate to check the name against.
    let plain = format!("http://{}", gateway.admin);
    let (ready, _, stderr) =
        healthcheck(&["--admin", &plain, "--server-name", "gw.example.com"]).await;
    assert!(!ready && stderr.contains("--server-name"), "{stderr}");

    // `idemgate keys` checks the certificate as the healthcheck does.
    let keys = |admin: &str, name: &[&str]| {
        let mut cmd = binary();
        cmd.args(["keys", "list", "--admin", admin, "--ca", ca])
            .args(name)
            .env("IDEMGATE_ADMIN_TOKEN", "not-the-gateways");
        run_to_exit(cmd)
    };
    let (_, _, stderr) = keys(&admin, &[]).await;
    assert!(stderr.contains("not valid for name"), "{stderr}");
    let (_, _, stderr) = keys(&admin, &name).await;
    assert!(stderr.contains("401"), "the API answered: {stderr}");
    let (_, _, stderr) = keys(&plain, &name).await;
    assert!(stderr.contains("--server-name"), "{stderr}");
}

/// A reload reads only the listeners' certificates again: an edited
/// config file was left for the operator to believe applied, logged as
/// nothing ("no TLS listener: nothing to reload").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_says_the_config_file_changed_and_whether_it_would_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let upstream = FakeUpstream::start().await;
    let toml = gateway_toml_with(
        &dir.path().join("idemgate.db"),
        &upstream.url(),
        &Setup::route(""),
    );
    let config = write_config(dir.path(), "idemgate.toml", &toml);
    let gateway = BinaryGateway::start(&config, &dir.path().join("gw.log")).await;
    // The file as it was, then edited, then broken: each reload's lines
    // are written before the next signal is handled, so once the last is
    // logged every earlier one is.
    gateway.signal("HUP");
    gateway.wait_for_log("nothing to reload").await;
    let edited = toml.replace("[[routes]]", "# an operator's edit\n[[routes]]");
    write_config(dir.path(), "idemgate.toml", &edited);
    gateway.signal("HUP");
    gateway.wait_for_log("restart to apply it").await;
    write_config(dir.path(), "idemgate.toml", "[[routes]\n");
    gateway.signal("HUP");
    let logged = gateway.wait_for_log("would not start").await;
    let edits = logged.matches("changed since the start: a reload").count();
    assert_eq!(edits, 1, "the unchanged file is no change: {logged}");
    assert_eq!(logged.matches("would not start").count(), 1, "{logged}");
    // Still serving as started.
    let written = write(gateway.proxy, "/x", Some("after-reloads"), r#"{"n":1}"#).await;
    assert_eq!(written.status, 201, "{:?}", written.body);
    // A file that reads, but whose start the store refuses (a route renamed
    // over a held operation), is not one a restart applies: said so.
    let held = write(gateway.proxy, "/status/502", Some("held"), r#"{"n":2}"#).await;
    assert_eq!(held.status, 502, "{:?}", held.body);
    let renamed = toml.replace("name = \"api\"", "name = \"api-v2\"");
    assert_ne!(renamed, toml);
    write_config(dir.path(), "idemgate.toml", &renamed);
    gateway.signal("HUP");
    let logged = gateway
        .wait_for_log("would not start over the operations the store holds")
        .await;
    assert!(
        logged.contains("route `api` is no longer configured"),
        "{logged}"
    );
}

/// A SIGHUP that came while the config file was still being read (a
/// supervisor's reload racing the start) ended the process: the signal's
/// default then. The signals are taken over first; the start goes on and
/// the SIGHUP is a reload like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sighup_while_the_config_is_read_is_a_reload_not_the_end() {
    let dir = tempfile::tempdir().expect("tempdir");
    let toml = gateway_toml(
        &dir.path().join("idemgate.db"),
        "http://127.0.0.1:9",
        "/",
        "",
    );
    // A pipe for a config file: the start waits in its read until the
    // test writes, and the test knows when the process is there.
    let fifo = dir.path().join("fifo.toml");
    let made = child_status(Command::new("mkfifo").arg(&fifo)).expect("run mkfifo");
    assert!(made.success(), "mkfifo failed");
    let mut cmd = binary();
    cmd.arg("serve").arg("--config").arg(&fifo);
    let stderr = dir.path().join("gw.log");
    let started = tokio::spawn({
        let stderr = stderr.clone();
        async move { spawn_until_first_line(cmd, &stderr).await }
    });
    let fed = tokio::task::spawn_blocking(move || {
        use std::io::Write as _;
        // Opening a pipe to write returns once the process opened it to
        // read: it is past its start's first steps, reading the file.
        let mut pipe = std::fs::OpenOptions::new()
            .write(true)
            .open(&fifo)
            .expect("open the pipe");
        let hup = child_status(Command::new("pkill").arg("-HUP").arg("-f").arg(&fifo))
            .expect("run pkill");
        assert!(hup.success(), "no process read the pipe");
        // The start reads the file again (what it started from, then the
        // config): a plain file by then, put in the pipe's place while the
        // first read holds the pipe.
        let plain = fifo.with_extension("plain");
        std::fs::write(&plain, &toml).expect("write the config");
        std::fs::rename(&plain, &fifo).expect("replace the pipe");
        pipe.write_all(toml.as_bytes()).expect("write the config");
    });
    tokio::time::timeout(WAIT, fed)
        .await
        .expect("the start read the config")
        .expect("fed");
    let (mut child, _stdout, line) = started.await.expect("started");
    assert!(line.starts_with("listening"), "{line}");
    let logged = within_wait(|| async {
        let logged = read_to_string(&stderr);
        logged.contains("nothing to reload").then_some(logged)
    })
    .await;
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        logged.is_some(),
        "the SIGHUP was not a reload: {}",
        read_to_string(&stderr)
    );
}

/// systemd's end of the notify protocol: a datagram socket of the test's
/// own, named to the gateway in `NOTIFY_SOCKET`.
struct NotifySocket {
    socket: tokio::net::UnixDatagram,
    /// What `NOTIFY_SOCKET` says: a path, or `@` and an abstract name.
    name: OsString,
    /// Where the path is, removed with the socket.
    _dir: Option<tempfile::TempDir>,
}

impl NotifySocket {
    fn bind() -> NotifySocket {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("notify.sock");
        let socket = tokio::net::UnixDatagram::bind(&path).expect("bind the notify socket");
        NotifySocket {
            socket,
            name: path.into_os_string(),
            _dir: Some(dir),
        }
    }

    /// A socket in Linux's abstract namespace, named `@name` in
    /// `NOTIFY_SOCKET` as sd_notify(3) writes it (how systemd names its
    /// own to a unit).
    fn bind_abstract() -> NotifySocket {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("idemgate-test-{}", uuid::Uuid::now_v7().simple());
        let address = std::os::unix::net::SocketAddr::from_abstract_name(&name).expect("a name");
        let socket = std::os::unix::net::UnixDatagram::bind_addr(&address).expect("bind");
        socket.set_nonblocking(true).expect("non-blocking");
        NotifySocket {
            socket: tokio::net::UnixDatagram::from_std(socket).expect("a tokio socket"),
            name: format!("@{name}").into(),
            _dir: None,
        }
    }

    /// `idemgate serve --config config` told to notify here.
    fn serve(&self, config: &Path) -> Command {
        let mut cmd = binary();
        cmd.arg("serve")
            .arg("--config")
            .arg(config)
            .env("NOTIFY_SOCKET", &self.name)
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID");
        cmd
    }

    /// The next datagram's lines (`KEY=value`), within [`WAIT`].
    async fn next(&self) -> Vec<String> {
        let mut buffer = vec![0; 64 * 1024];
        let n = tokio::time::timeout(WAIT, self.socket.recv(&mut buffer))
            .await
            .expect("a notification within WAIT")
            .expect("recv");
        let text = std::str::from_utf8(&buffer[..n]).expect("notifications are UTF-8");
        text.lines().map(str::to_owned).collect()
    }

    /// Datagrams until one that `wanted` takes (at most 1000, each within [`WAIT`]).
    async fn until(&self, what: &str, wanted: impl Fn(&[String]) -> bool) -> Vec<String> {
        for _ in 0..1000 {
            let lines = self.next().await;
            if wanted(&lines) {
                return lines;
            }
        }
        panic!("no notification {what} among 1000");
    }
}

/// The value of `KEY=` in a datagram's lines.
fn field<'a>(lines: &'a [String], key: &str) -> Option<&'a str> {
    lines
        .iter()
        .find_map(|line| line.strip_prefix(key)?.strip_prefix('='))
}

/// CLOCK_BOOTTIME in µs (`/proc/uptime`): CLOCK_MONOTONIC's value on a
/// machine that has not been suspended, to within a second.
fn boot_time_usec() -> f64 {
    let uptime = std::fs::read_to_string("/proc/uptime").expect("/proc/uptime");
    let seconds: f64 = uptime
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .expect("uptime seconds");
    seconds * 1e6
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemd_hears_ready_then_each_reload_with_its_outcome_then_stopping() {
    let upstream = FakeUpstream::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new(dir.path(), "ca");
    ca.server_cert(dir.path(), "proxy");
    let toml = gateway_toml_with(
        &dir.path().join("idemgate.db"),
        &upstream.url(),
        &Setup::route("").server("tls_cert = \"proxy.crt\"\ntls_key = \"proxy.key\"\n"),
    );
    let config = write_config(dir.path(), "idemgate.toml", &toml);
    let notify = NotifySocket::bind();
    let started = boot_time_usec();
    let gateway = BinaryGateway::spawn(notify.serve(&config), &dir.path().join("gw.log")).await;

    let starting = notify.next().await;
    assert_eq!(starting.len(), 1, "{starting:?}");
    let store = format!(
        "STATUS=opening and migrating the store sqlite://{}",
        dir.path().join("idemgate.db").display()
    );
    assert_eq!(starting[0], store);
    let serving = format!(
        "serving proxy on {}, admin on {}",
        gateway.proxy, gateway.admin
    );
    assert_eq!(
        notify.next().await,
        [
            "READY=1".to_string(),
            format!("STATUS={serving}; 0 operations held")
        ]
    );

    // A lost response: the status counts it.
    let mut client = TlsClient::connect(gateway.proxy, ca.client_config(None))
        .await
        .expect("TLS connection");
    client
        .write("/drop", "lost-1", r#"{"n":1}"#)
        .await
        .assert_operation_problem(502, "outcome-unknown", "unknown");

    gateway.signal("HUP");
    let reloading = notify.next().await;
    assert_eq!(reloading[0], "RELOADING=1", "{reloading:?}");
    let usec: f64 = field(&reloading, "MONOTONIC_USEC")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no MONOTONIC_USEC: {reloading:?}"));
    // Between the spawn and now on CLOCK_MONOTONIC in µs (give or take
    // /proc/uptime's lag): not another clock, not another unit.
    let slack = 5e6;
    assert!(
        started - slack <= usec && usec <= boot_time_usec() + slack,
        "MONOTONIC_USEC={usec} is not CLOCK_MONOTONIC's µs (spawned at {started})"
    );
    assert_eq!(
        notify.next().await,
        [
            "READY=1".to_string(),
            format!("STATUS=reloaded; {serving}; 1 operation held")
        ]
    );

    // A reload that fails says so, and the gateway is ready again.
    std::fs::write(dir.path().join("proxy.crt"), "not a certificate").expect("garble");
    gateway.signal("HUP");
    assert_eq!(notify.next().await[0], "RELOADING=1");
    let failed = notify.next().await;
    assert_eq!(failed[0], "READY=1", "{failed:?}");
    let status = field(&failed, "STATUS").unwrap_or_default();
    assert!(
        status.starts_with("reload failed, the previous certificate stays: ")
            && status.contains("proxy.crt")
            && status.ends_with(&format!("{serving}; 1 operation held")),
        "{status}"
    );

    gateway.signal("TERM");
    let stopping = notify.next().await;
    assert_eq!(stopping[0], "STOPPING=1", "{stopping:?}");
    assert!(
        field(&stopping, "STATUS").is_some_and(|s| s.starts_with("draining")),
        "{stopping:?}"
    );
}

/// A config of one route to nowhere, its store in `dir`: for what happens
/// before any request.
fn plain_config(dir: &Path) -> std::path::PathBuf {
    let store = dir.join("idemgate.db");
    let toml = gateway_toml(&store, "http://127.0.0.1:9", "/", "");
    write_config(dir, "idemgate.toml", &toml)
}

/// `NOTIFY_SOCKET=@name` is a socket in the abstract namespace
/// (sd_notify(3)), not a file named `@name`: it hears the gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemd_is_heard_on_an_abstract_notify_socket() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = plain_config(dir.path());
    let notify = NotifySocket::bind_abstract();
    let gateway = BinaryGateway::spawn(notify.serve(&config), &dir.path().join("gw.log")).await;
    let ready = notify.until("READY=1", |lines| lines[0] == "READY=1").await;
    assert!(
        field(&ready, "STATUS").is_some_and(|s| s.starts_with("serving")),
        "{ready:?}"
    );
    assert!(
        !gateway.stderr().contains("cannot notify"),
        "{}",
        gateway.stderr()
    );
}

/// An empty `NOTIFY_SOCKET` names no service manager, as an unset one:
/// nothing is sent, and nothing is logged about it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_notify_socket_is_no_service_manager() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = plain_config(dir.path());
    let mut serve = binary();
    serve
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .env("NOTIFY_SOCKET", "");
    let gateway = BinaryGateway::spawn(serve, &dir.path().join("gw.log")).await;
    // Logged after the first notification was sent (`STATUS=` while the
    // store opens), by the same writer, in order.
    let logged = gateway.wait_for_log("listening").await;
    assert!(!logged.contains("cannot notify"), "{logged}");
}

/// A `NOTIFY_SOCKET` path with no socket there was warned of at every
/// notification (every watchdog ping, for the life of the process), and
/// a socket bound there later got them: it names none, said once at
/// start, and counts as unset, as the docs say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notify_socket_naming_no_socket_is_said_once_and_unset() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = plain_config(dir.path());
    let path = dir.path().join("later.sock");
    let mut serve = binary();
    serve
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .env("NOTIFY_SOCKET", &path);
    let gateway = BinaryGateway::spawn(serve, &dir.path().join("gw.log")).await;
    gateway.wait_for_log("listening").await;
    // A socket there now hears nothing: not the reload's RELOADING=1,
    // sent before its outcome is logged.
    let socket = std::os::unix::net::UnixDatagram::bind(&path).expect("bind");
    socket.set_nonblocking(true).expect("nonblocking");
    gateway.signal("HUP");
    let logged = gateway.wait_for_log("nothing to reload").await;
    let mut buffer = [0u8; 512];
    let heard = socket.recv(&mut buffer);
    assert!(
        heard.is_err(),
        "heard {:?}",
        heard.map(|n| String::from_utf8_lossy(&buffer[..n]).into_owned())
    );
    assert_eq!(
        logged.matches("NOTIFY_SOCKET names no socket").count(),
        1,
        "{logged}"
    );
    assert!(!logged.contains("cannot notify"), "{logged}");
}

/// The same for an abstract name (`@name`), which cannot be looked at
/// before a send: nobody hearing the first notification, it was warned of
/// at every one, and a socket bound later got them (recheck).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abstract_notify_socket_nobody_hears_is_said_once_and_unset() {
    use std::os::linux::net::SocketAddrExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = plain_config(dir.path());
    let name = format!("idemgate-nobody-{}", uuid::Uuid::now_v7().simple());
    let mut serve = binary();
    serve
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .env("NOTIFY_SOCKET", format!("@{name}"));
    let gateway = BinaryGateway::spawn(serve, &dir.path().join("gw.log")).await;
    gateway.wait_for_log("listening").await;
    let address = std::os::unix::net::SocketAddr::from_abstract_name(&name).expect("a name");
    let socket = std::os::unix::net::UnixDatagram::bind_addr(&address).expect("bind");
    socket.set_nonblocking(true).expect("nonblocking");
    gateway.signal("HUP");
    let logged = gateway.wait_for_log("nothing to reload").await;
    let mut buffer = [0u8; 512];
    assert!(socket.recv(&mut buffer).is_err(), "a later socket heard it");
    assert_eq!(logged.matches("names no socket").count(), 1, "{logged}");
    assert!(!logged.contains("cannot notify"), "{logged}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemd_watchdog_is_pinged_only_while_the_store_takes_writes() {
    let upstream = FakeUpstream::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("idemgate.db");
    let config = write_config(
        dir.path(),
        "idemgate.toml",
        &gateway_toml(&store, &upstream.url(), "/", ""),
    );
    let notify = NotifySocket::bind();
    let mut serve = notify.serve(&config);
    // WatchdogSec=200ms: a ping every 100 ms.
    serve.env("WATCHDOG_USEC", "200000");
    let _gateway = BinaryGateway::spawn(serve, &dir.path().join("gw.log")).await;
    notify.until("READY=1", |lines| lines[0] == "READY=1").await;
    notify
        .until("WATCHDOG=1", |lines| {
            lines.iter().any(|l| l == "WATCHDOG=1")
        })
        .await;

    // The store's writer cannot commit: the status says so, without a ping.
    let lock = WriteLock::on(&store).await;
    let wedged = notify
        .until("saying the store does not answer", |lines| {
            field(lines, "STATUS").is_some_and(|s| s.contains("the store does not answer"))
        })
        .await;
    assert!(
        !wedged.iter().any(|l| l == "WATCHDOG=1"),
        "pinged while wedged: {wedged:?}"
    );
    lock.release().await;
    let back = notify
        .until("saying it serves again", |lines| {
            field(lines, "STATUS").is_some_and(|s| s.starts_with("serving"))
        })
        .await;
    assert_eq!(back[0], "WATCHDOG=1", "{back:?}");
}

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

#[test]
#[ignore = "needs systemd-analyze (.ci/run runs it)"]
fn the_systemd_unit_passes_systemd_analyze_verify() {
    // The unit as shipped, but for where the binary is: verify insists that
    // ExecStart's program exists.
    let unit = std::fs::read_to_string(Path::new(ROOT).join("contrib/idemgate.service"))
        .expect("contrib/idemgate.service");
    for needed in [
        "Type=notify\n",
        "ExecReload=",
        "WatchdogSec=",
        "DynamicUser=yes\n",
        "StateDirectory=idemgate\n",
        "ProtectSystem=strict\n",
        "NoNewPrivileges=yes\n",
        "SystemCallFilter=@system-service\n",
        "CapabilityBoundingSet=\n",
    ] {
        assert!(unit.contains(needed), "the unit lacks {needed:?}");
    }
    let shipped = "ExecStart=/usr/local/bin/idemgate ";
    assert!(unit.contains(shipped), "ExecStart moved");
    let dir = tempfile::tempdir().expect("tempdir");
    let here = dir.path().join("idemgate.service");
    let exec = format!("ExecStart={} ", env!("CARGO_BIN_EXE_idemgate"));
    std::fs::write(&here, unit.replace(shipped, &exec)).expect("write the unit");
    let out = child_output(Command::new("systemd-analyze").arg("verify").arg(&here))
        .expect("systemd-analyze runs (Debian package systemd)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Any warning (an unknown directive, a bad value) is a finding too.
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify:\n{stderr}"
    );
}

/// Runs the image's binary under `chroot rootfs` as its user, with a clean
/// environment but `env`.
fn in_image(rootfs: &Path, env: &[(&str, &str)], args: &[&str]) -> Command {
    let mut cmd = Command::new("/usr/sbin/chroot");
    cmd.arg("--userspec=10001:10001")
        .arg(rootfs)
        .arg("/usr/local/bin/idemgate")
        .args(args)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .envs(env.iter().copied());
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, buildah and debootstrap (.ci/run installs them)"]
async fn the_container_image_serves_from_its_own_filesystem() {
    use std::os::unix::fs::MetadataExt;
    let root = std::fs::metadata("/proc/self").expect("/proc/self").uid() == 0;
    assert!(root, "the image check needs root (debootstrap, chroot)");
    for tool in ["/usr/bin/buildah", "/usr/sbin/debootstrap"] {
        require_installed(Path::new(tool), "apt-get install buildah debootstrap");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let rootfs = dir.path().join("rootfs");
    std::fs::create_dir(&rootfs).expect("rootfs dir");
    let mut build = Command::new(Path::new(ROOT).join(".ci/container-image"));
    build.arg(env!("CARGO_BIN_EXE_idemgate")).arg(&rootfs);
    // The first run makes the base with debootstrap; later ones reuse it.
    let (status, _, stderr) = run_to_exit_within(build, Duration::from_secs(900)).await;
    assert!(status.success(), ".ci/container-image failed:\n{stderr}");

    // What the image says about itself.
    let inspect: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.path().join("rootfs.json")).expect("the image's configuration"),
    )
    .expect("buildah inspect is JSON");
    let config = &inspect["Docker"]["config"];
    assert_eq!(config["User"], "10001:10001");
    assert!(
        config["Volumes"].get("/var/lib/idemgate").is_some(),
        "{config}"
    );
    for port in ["8080/tcp", "9090/tcp"] {
        assert!(
            config["ExposedPorts"].get(port).is_some(),
            "{port}: {config}"
        );
    }
    let healthcheck = serde_json::json!([
        "CMD",
        "idemgate",
        "healthcheck",
        "--config",
        "/etc/idemgate/idemgate.toml"
    ]);
    assert_eq!(config["Healthcheck"]["Test"], healthcheck);
    let labels = &config["Labels"];
    assert_eq!(labels["org.opencontainers.image.title"], "idemgate");
    assert_eq!(
        labels["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );
    for label in ["revision", "created", "licenses", "base.name"] {
        let value = labels[format!("org.opencontainers.image.{label}")].as_str();
        assert!(
            value.is_some_and(|v| !v.is_empty() && v != "unknown"),
            "{label}: {labels}"
        );
    }

    // Its binary, from its own filesystem, as its own user.
    let (status, stdout, stderr) = run_to_exit(in_image(&rootfs, &[], &["--version"])).await;
    assert!(status.success(), "{stderr}");
    assert_eq!(
        stdout.trim(),
        concat!("idemgate ", env!("CARGO_PKG_VERSION"))
    );
    let config_file = "/etc/idemgate/idemgate.toml";
    let (status, stdout, stderr) =
        run_to_exit(in_image(&rootfs, &[], &["check-config", config_file])).await;
    assert!(
        status.success() && stdout.trim() == "ok",
        "{stdout}{stderr}"
    );

    // A short `serve` of the image's own config, on loopback ports of its own.
    let key = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    let serve = in_image(
        &rootfs,
        &[("IDEMGATE_STORE_KEY", key)],
        &[
            "serve",
            "--config",
            config_file,
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ],
    );
    let gateway = BinaryGateway::spawn(serve, &dir.path().join("serve.log")).await;
    let ready = probe(gateway.admin, "/readyz").await;
    assert_eq!(ready.status, 200, "{:?}", ready.body);
    // The image's HEALTHCHECK command, from inside.
    let admin = format!("http://{}", gateway.admin);
    let (status, _, stderr) =
        run_to_exit(in_image(&rootfs, &[], &["healthcheck", "--admin", &admin])).await;
    assert!(status.success(), "{stderr}");
    // The store is in the volume, the image user's.
    let store = std::fs::metadata(rootfs.join("var/lib/idemgate/idemgate.db"))
        .expect("the store in the volume");
    assert_eq!(store.uid(), 10001);
}

/// A gateway (the real binary) whose admin listener speaks TLS with the
/// certificate `identity` issues from an operators' CA, and a copy of its
/// config naming the admin port it bound.
struct AdminOverTls {
    gateway: BinaryGateway,
    bound: std::path::PathBuf,
    ca: std::path::PathBuf,
    _upstream: FakeUpstream,
}

impl AdminOverTls {
    async fn start(dir: &Path, identity: impl FnOnce(&TestCa, &Path) -> PemPair) -> AdminOverTls {
        let upstream = FakeUpstream::start().await;
        let operators = TestCa::new(dir, "operators-ca");
        let identity = identity(&operators, dir);
        let tls = format!(
            "admin_tls_cert = \"{}\"\nadmin_tls_key = \"{}\"\n",
            identity.cert.display(),
            identity.key.display()
        );
        let toml = gateway_toml_with(
            &dir.join("idemgate.db"),
            &upstream.url(),
            &Setup::route("").server(&tls),
        );
        let config = write_config(dir, "idemgate.toml", &toml);
        let gateway = BinaryGateway::start(&config, &dir.join("gateway.log")).await;
        // The file says port 0; the one bound is the gateway's.
        let bound = toml.replace(
            "admin_listen = \"127.0.0.1:0\"",
            &format!("admin_listen = \"{}\"", gateway.admin),
        );
        AdminOverTls {
            gateway,
            bound: write_config(dir, "bound.toml", &bound),
            ca: operators.pem.clone(),
            _upstream: upstream,
        }
    }

    /// The config naming the bound admin port.
    fn bound(&self) -> &str {
        self.bound.to_str().expect("utf-8 path")
    }

    /// The operators' CA certificate.
    fn ca(&self) -> &str {
        self.ca.to_str().expect("utf-8 path")
    }
}
