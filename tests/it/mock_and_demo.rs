//! The mock API (`idemgate mock-upstream`, in process and as the real
//! binary) does what its fault paths promise, and `idemgate demo` tells its
//! tour and exits 0.
//!
//! The mock's promises, checked against it directly (no gateway) unless noted:
//! `/slow?ms=N` commits and answers 201 after N ms; `/drop` commits and
//! closes without answering; `/hang` commits and never answers; `/truncate`
//! commits, sends its head and part of the body it announces, and closes;
//! `/status/{code}` answers `code` without
//! committing; `/once-429/…` refuses the first write per key (429,
//! uncommitted); `GET /_effects` counts writes, `GET /_effects/{key}` finds
//! the write committed under a key; `/mcp` answers JSON-RPC as a small MCP
//! server whose `create_task` and `comment_task` commit (`count_tasks`
//! counting the tasks alone), `/mcp/drop` committing and closing,
//! `/mcp/{code}` answering `code` without committing.
//!
//! No in-process gateway restarts here: this binary spawns children.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::common::*;
use bytes::Bytes;
use http::StatusCode;
use idemgate_tools::mock_upstream::MockUpstream;

async fn start_mock() -> MockUpstream {
    MockUpstream::start(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("mock starts")
}

/// POST `path` straight to the mock, with `key` if any, allowing `within`.
async fn post(
    mock: SocketAddr,
    path: &str,
    key: Option<&str>,
    within: Duration,
) -> Result<Response, Exchange> {
    let mut headers = vec![("content-type", "application/json")];
    if let Some(key) = key {
        headers.push(("idempotency-key", key));
    }
    try_send(mock, "POST", path, &headers, r#"{"title":"t"}"#, within).await
}

/// What a raw client of the mock reads for a POST of `path` under `key`,
/// head and all, until the mock closes the connection (or resets it:
/// what came before is kept).
async fn read_until_closed(mock: SocketAddr, path: &str, key: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(mock).await.expect("connect");
    let body = r#"{"title":"t"}"#;
    let request = format!(
        "POST {path} HTTP/1.1\r\nhost: mock\r\nidempotency-key: {key}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream
        .write_all(request.as_bytes())
        .await
        .expect("request written");
    let mut read = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(WAIT, stream.read(&mut chunk))
            .await
            .expect("the mock closes the connection");
        match n {
            Ok(0) | Err(_) => break,
            Ok(n) => read.extend_from_slice(&chunk[..n]),
        }
    }
    String::from_utf8_lossy(&read).into_owned()
}

async fn get_json(mock: SocketAddr, path: &str) -> (StatusCode, serde_json::Value) {
    let resp = send(mock, "GET", path, &[], Bytes::new()).await;
    (resp.status, resp.json())
}

async fn effects(mock: SocketAddr) -> u64 {
    let (status, body) = get_json(mock, "/_effects").await;
    assert_eq!(status, StatusCode::OK);
    body["writes"].as_u64().expect("writes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_counts_writes_and_finds_them_by_key() {
    let mock = start_mock().await;
    let addr = mock.addr();

    let created = post(addr, "/tasks", Some("k-1"), WAIT)
        .await
        .expect("answer");
    assert_eq!(created.status, StatusCode::CREATED);
    assert_eq!(created.json()["id"], 1);
    assert_eq!(created.json()["path"], "/tasks");
    post(addr, "/tasks", None, WAIT).await.expect("answer");

    assert_eq!(effects(addr).await, 2);
    assert_eq!(mock.writes(), 2);
    assert_eq!(
        get_json(addr, "/_effects/k-1").await,
        (StatusCode::OK, serde_json::json!({ "id": 1 }))
    );
    assert_eq!(
        get_json(addr, "/_effects/k-9").await.0,
        StatusCode::NOT_FOUND
    );
    let other = get_json(addr, "/anything").await;
    assert_eq!(other, (StatusCode::OK, serde_json::json!({ "ok": true })));
    assert_eq!(mock.writes(), 2, "reads are not writes");
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_slow_commits_then_answers_late() {
    let mock = start_mock().await;

    let started = Instant::now();
    let slow = post(mock.addr(), "/slow?ms=300", Some("s-1"), WAIT)
        .await
        .expect("answer");

    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(slow.status, StatusCode::CREATED);
    assert_eq!(mock.writes(), 1);
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_lost_answer_paths_commit_without_a_whole_response() {
    let mock = start_mock().await;
    let addr = mock.addr();

    let dropped = post(addr, "/drop", Some("d-1"), WAIT).await;
    assert!(
        matches!(dropped, Err(Exchange::Failed(_))),
        "/drop: {dropped:?}"
    );
    assert_eq!(mock.writes(), 1, "/drop committed");

    let hung = post(addr, "/hang", Some("h-1"), Duration::from_millis(500)).await;
    assert!(matches!(hung, Err(Exchange::TimedOut)), "/hang: {hung:?}");
    assert_eq!(mock.writes(), 2, "/hang committed");

    let cut = post(addr, "/truncate", Some("t-1"), WAIT).await;
    assert!(
        matches!(cut, Err(Exchange::Failed(_))),
        "/truncate: {cut:?}"
    );
    assert_eq!(mock.writes(), 3, "/truncate committed");
    // A cut body, not a dropped connection: the head and part of the
    // announced body reach the client before the close.
    let raw = read_until_closed(addr, "/truncate", "t-2").await;
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    assert!(head.starts_with("HTTP/1.1 201 "), "/truncate: {raw:?}");
    assert!(
        head.to_ascii_lowercase()
            .contains("\r\ncontent-length: 100"),
        "/truncate: {raw:?}"
    );
    assert!(
        !body.is_empty() && body.len() < 100,
        "part of the body: {raw:?}"
    );
    assert_eq!(mock.writes(), 4, "/truncate committed");

    for key in ["d-1", "h-1", "t-1", "t-2"] {
        assert_eq!(
            get_json(addr, &format!("/_effects/{key}")).await.0,
            StatusCode::OK,
            "{key}"
        );
    }
    // stop() also ends the hung connection.
    tokio::time::timeout(WAIT, mock.stop())
        .await
        .expect("mock stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_refusals_commit_nothing() {
    let mock = start_mock().await;
    let addr = mock.addr();

    for code in [503u16, 429, 502] {
        let resp = post(addr, &format!("/status/{code}"), Some("r-1"), WAIT)
            .await
            .expect("answer");
        assert_eq!(resp.status.as_u16(), code);
    }
    assert_eq!(mock.writes(), 0);

    let refused = post(addr, "/once-429/tasks", Some("o-1"), WAIT)
        .await
        .expect("answer");
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(refused.header("retry-after").is_some());
    assert_eq!(mock.writes(), 0, "the 429 committed nothing");
    assert_eq!(
        get_json(addr, "/_effects/o-1").await.0,
        StatusCode::NOT_FOUND
    );

    let accepted = post(addr, "/once-429/tasks", Some("o-1"), WAIT)
        .await
        .expect("answer");
    assert_eq!(accepted.status, StatusCode::CREATED);
    let other_key = post(addr, "/once-429/tasks", Some("o-2"), WAIT)
        .await
        .expect("answer");
    assert_eq!(
        other_key.status,
        StatusCode::TOO_MANY_REQUESTS,
        "once per key"
    );
    assert_eq!(mock.writes(), 1);
    assert_eq!(effects(addr).await, 1);
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_binary_behind_a_gateway_holds_a_dropped_write() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mock = BinaryMock::start(&dir.path().join("mock.log")).await;
    let setup = Setup::route("").upstream_url(format!("http://{}", mock.addr));
    let gw = spawn_gateway_with(setup).await;

    let created = write(gw.addr(), "/tasks", Some("bin-1"), r#"{"title":"a"}"#).await;
    assert_eq!(created.status, StatusCode::CREATED);
    assert_replay_of(
        &write(gw.addr(), "/tasks", Some("bin-1"), r#"{"title":"a"}"#).await,
        &created,
    );

    let lost = write(gw.addr(), "/drop", Some("bin-2"), r#"{"title":"b"}"#).await;
    lost.assert_operation_problem(502, "outcome-unknown", "unknown");
    assert_held_unknown(&write(gw.addr(), "/drop", Some("bin-2"), r#"{"title":"b"}"#).await);

    assert_eq!(
        effects(mock.addr).await,
        2,
        "each write reached the mock once"
    );
    let (status, body) = get_json(mock.addr, "/_effects/bin-2").await;
    assert_eq!(
        (status, body["id"].as_u64()),
        (StatusCode::OK, Some(2)),
        "the dropped write happened"
    );
}

/// `mock-upstream --listen` on a port in use said only "Address already
/// in use": which address, it did not say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_binary_on_a_busy_port_names_the_address() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = busy.local_addr().expect("addr").to_string();
    let mut cmd = binary();
    cmd.args(["mock-upstream", "--listen", &addr]);
    let (status, _, stderr) = run_to_exit(cmd).await;
    assert!(!status.success());
    assert!(
        stderr.contains(&format!("cannot listen on {addr}")),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_mcp_endpoint_answers_json_rpc_and_commits_tool_calls() {
    let mock = start_mock().await;
    let addr = mock.addr();
    let rpc = |path: &'static str, body: &'static str| async move {
        let headers = [("content-type", "application/json")];
        try_send(addr, "POST", path, &headers, body, WAIT).await
    };
    let listed = rpc("/mcp", r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#)
        .await
        .expect("answered");
    assert_eq!(
        listed.json()["result"]["tools"][1]["annotations"]["readOnlyHint"],
        true
    );
    let note = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    assert_eq!(rpc("/mcp", note).await.expect("answered").status, 202);
    let call = r#"{"jsonrpc":"2.0","id":"c1","method":"tools/call","params":{"name":"create_task","arguments":{}}}"#;
    let called = rpc("/agent/mcp", call).await.expect("answered").json();
    assert_eq!(called["id"], "c1");
    assert_eq!(called["result"]["content"][0]["text"], "created task 1");
    assert!(rpc("/agent/mcp/drop", call).await.is_err(), "dropped");
    assert_eq!(effects(mock.addr()).await, 2, "both calls committed");
    // A comment is an effect but no task; a proxy's 502 runs nothing.
    let comment = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"comment_task","arguments":{}}}"#;
    assert_eq!(
        rpc("/mcp", comment).await.expect("answered").json()["result"]["isError"],
        false
    );
    assert_eq!(
        rpc("/mcp/502", comment).await.expect("answered").status,
        502
    );
    assert_eq!(effects(mock.addr()).await, 3, "the comment once");
    let count = r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"count_tasks","arguments":{}}}"#;
    let counted = rpc("/mcp", count).await.expect("answered").json();
    assert_eq!(counted["result"]["structuredContent"]["tasks"], 2);
    let unknown = rpc("/mcp", r#"{"jsonrpc":"2.0","id":2,"method":"nope"}"#).await;
    assert_eq!(unknown.expect("answered").json()["error"]["code"], -32601);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_tells_its_tour_and_exits_0() {
    let mut demo = binary();
    demo.arg("demo");

    let (status, stdout, stderr) = run_to_exit(demo).await;

    assert!(
        status.success(),
        "demo exited {status}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("writes at the API: 4"), "stdout:\n{stdout}");
    assert!(
        stdout.contains(r#"id 3: "created task 6" (dev.idemgate/replayed: true)"#),
        "the agent's act: {stdout}"
    );
    let last = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default();
    assert!(
        last.starts_with("demo ok:"),
        "last line: {last:?}\nstdout:\n{stdout}"
    );
}
