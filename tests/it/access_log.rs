//! The access log, from the real binary (crates/gateway/src/access_log.rs):
//! one line per request, in each `--log-format`, every field in its place
//! and form, and none under a filter that drops `idemgate::access`.

use std::path::Path;

use crate::common::*;
use bytes::Bytes;

const ORDER: &str = r#"{"sku":"apple"}"#;

/// The fields of a text access line, in order, after its timestamp and
/// the word `access`.
const FIELDS: [&str; 7] = [
    "route",
    "method",
    "path",
    "operation_id",
    "outcome",
    "status",
    "latency_ms",
];

/// The binary serving `upstream` in `format`, its stderr in `dir`, with
/// `RUST_LOG` as given (unset when `None`).
async fn serve(
    dir: &Path,
    upstream: &FakeUpstream,
    format: &str,
    rust_log: Option<&str>,
) -> BinaryGateway {
    let toml = gateway_toml(&dir.join("idemgate.db"), &upstream.url(), "/orders", "");
    let config = write_config(dir, "idemgate.toml", &toml);
    let mut cmd = binary();
    cmd.arg("serve")
        .arg("--config")
        .arg(&config)
        .args(["--log-format", format]);
    match rust_log {
        Some(filter) => cmd.env("RUST_LOG", filter),
        None => cmd.env_remove("RUST_LOG"),
    };
    BinaryGateway::spawn(cmd, &dir.join("serve.log")).await
}

/// A first write, its replay and a request no route takes; returns what was
/// logged once the last one's line is out.
async fn three_requests(gateway: &BinaryGateway) -> String {
    assert_fresh_created(&write(gateway.proxy, "/orders", Some("log-1"), ORDER).await);
    assert!(
        write(gateway.proxy, "/orders", Some("log-1"), ORDER)
            .await
            .is_replay()
    );
    send(gateway.proxy, "GET", "/elsewhere", &[], Bytes::new()).await;
    gateway.wait_for_log("/elsewhere").await
}

/// What the three requests' lines must say, in order: route, method, path,
/// whether an operation is named, outcome, status.
const EXPECTED: [(&str, &str, &str, bool, &str, u16); 3] = [
    ("api", "POST", "/orders", true, "forwarded", 201),
    ("api", "POST", "/orders", true, "replayed", 201),
    ("", "GET", "/elsewhere", false, "rejected", 404),
];

/// A line's latency: milliseconds with exactly three decimals, under 30 s.
fn assert_latency(written: &str, line: &str) {
    let (whole, fraction) = written.split_once('.').expect(line);
    assert!(
        !whole.is_empty()
            && whole.bytes().all(|b| b.is_ascii_digit())
            && fraction.len() == 3
            && fraction.bytes().all(|b| b.is_ascii_digit()),
        "{line}"
    );
    let latency: f64 = written.parse().expect(line);
    assert!((0.0..30_000.0).contains(&latency), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_request_writes_one_text_line_saying_how_it_ended() {
    let dir = tempfile::tempdir().expect("tempdir");
    let upstream = FakeUpstream::start().await;
    let mut gateway = serve(dir.path(), &upstream, "text", None).await;
    let logged = three_requests(&gateway).await;
    gateway.kill();

    // `2026-12-05T21:54:14.851484Z access route=api method=POST …`
    let lines: Vec<&str> = logged
        .lines()
        .filter(|line| line.get(27..35) == Some(" access "))
        .collect();
    assert_eq!(lines.len(), 3, "one line per request:\n{logged}");
    let mut operations = Vec::new();
    for (line, (route, method, path, operation, outcome, status)) in lines.iter().zip(EXPECTED) {
        let mut words = line.split(' ');
        let stamp = words.next().expect(line);
        assert!(
            stamp.len() == 27 && humantime::parse_rfc3339(stamp).is_ok(),
            "{line}"
        );
        assert_eq!(words.next(), Some("access"), "{line}");
        let fields: Vec<(&str, &str)> = words
            .map(|word| word.split_once('=').expect(line))
            .collect();
        let names: Vec<&str> = fields.iter().map(|(name, _)| *name).collect();
        let expected: Vec<&str> = FIELDS
            .into_iter()
            .filter(|name| operation || *name != "operation_id")
            .collect();
        assert_eq!(names, expected, "{line}");
        let value = |name: &str| fields.iter().find(|(n, _)| *n == name).expect(line).1;
        // An empty route is written quoted, as every value that cannot go bare.
        let route = if route.is_empty() { "\"\"" } else { route };
        assert_eq!(value("route"), route, "{line}");
        assert_eq!(value("method"), method, "{line}");
        assert_eq!(value("path"), path, "{line}");
        assert_eq!(value("outcome"), outcome, "{line}");
        assert_eq!(value("status"), status.to_string(), "{line}");
        assert_latency(value("latency_ms"), line);
        if operation {
            let id = value("operation_id");
            assert!(uuid::Uuid::parse_str(id).is_ok(), "{line}");
            operations.push(id);
        }
    }
    assert_eq!(
        operations[0], operations[1],
        "the replay names the operation it was answered from"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_request_writes_one_json_object_and_every_line_is_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    let upstream = FakeUpstream::start().await;
    let mut gateway = serve(dir.path(), &upstream, "json", None).await;
    let logged = three_requests(&gateway).await;
    gateway.kill();

    let objects: Vec<(&str, serde_json::Value)> = logged
        .lines()
        .map(|line| {
            let object = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
            (line, object)
        })
        .collect();
    let access: Vec<&(&str, serde_json::Value)> = objects
        .iter()
        .filter(|(_, object)| object["log"] == "access")
        .collect();
    assert_eq!(access.len(), 3, "one line per request:\n{logged}");
    for ((line, object), (route, method, path, operation, outcome, status)) in
        access.iter().zip(EXPECTED)
    {
        let expected: Vec<&str> = ["timestamp", "log"]
            .into_iter()
            .chain(FIELDS)
            .filter(|name| operation || *name != "operation_id")
            .collect();
        let members = object.as_object().expect("an object");
        assert_eq!(members.len(), expected.len(), "{line}");
        // In this order in the line itself (a parsed object may sort them).
        let at: Vec<usize> = expected
            .iter()
            .map(|name| line.find(&format!("\"{name}\":")).expect(line))
            .collect();
        assert!(at.is_sorted(), "{line}");
        let stamp = object["timestamp"].as_str().expect("a timestamp");
        assert!(humantime::parse_rfc3339(stamp).is_ok(), "{line}");
        assert_eq!(object["route"], route, "{object}");
        assert_eq!(object["method"], method, "{object}");
        assert_eq!(object["path"], path, "{object}");
        assert_eq!(object["outcome"], outcome, "{object}");
        assert_eq!(object["status"], status, "{object}");
        let latency = object["latency_ms"].as_f64().expect("a number");
        assert!((0.0..30_000.0).contains(&latency), "{object}");
        if operation {
            let id = object["operation_id"].as_str().expect("an id");
            assert!(uuid::Uuid::parse_str(id).is_ok(), "{object}");
        }
    }
    assert_eq!(
        access[0].1["operation_id"], access[1].1["operation_id"],
        "the replay names the operation it was answered from"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_that_drops_the_access_target_leaves_requests_unlogged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let upstream = FakeUpstream::start().await;
    let filter = "info,idemgate::access=off";
    let mut gateway = serve(dir.path(), &upstream, "text", Some(filter)).await;

    assert_fresh_created(&write(gateway.proxy, "/orders", Some("quiet-1"), ORDER).await);
    // Shutting down is logged at INFO under the target `idemgate`, which
    // the filter lets through: once it is out, a request line would be too.
    gateway.signal("TERM");
    let logged = gateway.wait_for_log("shutting down").await;
    gateway.kill();
    assert!(
        !logged
            .lines()
            .any(|line| line.get(27..35) == Some(" access ") || line.contains("path=/orders")),
        "{logged}"
    );
}

/// A status lookup names its key in its path: the line writes the path
/// with the key left out, as no line carries a key (SECURITY.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_lookup_is_logged_without_its_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let upstream = FakeUpstream::start().await;
    let mut gateway = serve(dir.path(), &upstream, "text", None).await;
    let key = "log-lookup-key-7f3a";
    assert_fresh_created(&write(gateway.proxy, "/orders", Some(key), ORDER).await);
    let found = send(
        gateway.proxy,
        "GET",
        &format!("/.idemgate/operations/{key}"),
        &[("authorization", ALICE)],
        Bytes::new(),
    )
    .await;
    assert_eq!(found.status, 200, "{:?}", found.body);
    // A lookup path that has no normal form (its `.` encoded, a bad `%`)
    // names its key too.
    let unread = send(
        gateway.proxy,
        "GET",
        &format!("/%2Eidemgate/operations/{key}%zz"),
        &[],
        Bytes::new(),
    )
    .await;
    assert_eq!(unread.status, 400, "{:?}", unread.body);
    // A segment's parameters (a servlet session id) are left out too.
    send(
        gateway.proxy,
        "GET",
        "/app;jsessionid=SESSION-7F3A/elsewhere;v=1",
        &[],
        Bytes::new(),
    )
    .await;
    let logged = gateway.wait_for_log("/elsewhere").await;
    gateway.kill();
    assert!(!logged.contains(key), "{logged}");
    assert!(!logged.contains("SESSION-7F3A"), "{logged}");
    assert!(logged.contains("path=/app/elsewhere "), "{logged}");
    assert!(
        logged.contains("path=/.idemgate/operations/{key}"),
        "{logged}"
    );
}
