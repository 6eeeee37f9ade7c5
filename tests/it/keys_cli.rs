//! `idemgate keys list|show|resolve` against the real `idemgate serve`
//! process: an operation lost to a timeout is listed and shown with its
//! timeline, resolved from the command line, and the client's retry then
//! gets the stored response; a held MCP tool call is settled with
//! `--result`, the tool result its retries get; API errors are `error:
//! <status> <name>: <detail>` on stderr with a non-zero exit; `--json`
//! prints JSON; an `--admin` with a password is refused without showing it.
//!
//! The admin token reaches both processes through `Command::env` only.

use std::process::Command;

use crate::common::*;
use serde_json::{Value, json};

const ORDER: &str = r#"{"sku":"A-1","qty":2}"#;

/// A running gateway process with its own token variable.
struct Served {
    gateway: BinaryGateway,
    upstream: FakeUpstream,
    variable: String,
    token: String,
    _dir: tempfile::TempDir,
}

impl Served {
    async fn start() -> Served {
        let upstream = FakeUpstream::start().await;
        let dir = tempfile::tempdir().expect("tempdir");
        let unique = uuid::Uuid::now_v7().simple().to_string();
        let variable = format!("IDEMGATE_TEST_TOKEN_{unique}");
        let token = format!("cli-token-{unique}");
        // A late window short enough that `not_attempted` is taken at
        // once (`attempt-may-still-land` has its own test in admin_api).
        // And an `mcp` route at `/drop`, whose calls' answers are lost.
        let tools = format!(
            "\n[[routes]]\nname = \"tools\"\nprofile = \"mcp\"\npath_prefix = \"/drop\"\nupstream = \"{}\"\n",
            upstream.url()
        );
        let setup = Setup::route(&format!(
            "upstream_timeout = \"300ms\"\nlate_window = \"1ms\"\n{tools}"
        ))
        .server(&format!("admin_token_env = \"{variable}\""));
        let toml = gateway_toml_with(&dir.path().join("idemgate.db"), &upstream.url(), &setup);
        let config = write_config(dir.path(), "idemgate.toml", &toml);
        let mut cmd = binary();
        cmd.arg("serve")
            .arg("--config")
            .arg(&config)
            .env(&variable, &token);
        let gateway = BinaryGateway::spawn(cmd, &dir.path().join("serve.log")).await;
        Served {
            gateway,
            upstream,
            variable,
            token,
            _dir: dir,
        }
    }

    /// `idemgate keys ARGS --admin URL --token-env VAR` with the token set.
    fn keys(&self, args: &[&str]) -> Command {
        self.keys_with_token(args, Some(&self.token))
    }

    fn keys_with_token(&self, args: &[&str], token: Option<&str>) -> Command {
        let mut cmd = binary();
        cmd.arg("keys")
            .args(args)
            .arg("--admin")
            .arg(format!("http://{}", self.gateway.admin))
            .arg("--token-env")
            .arg(&self.variable);
        match token {
            Some(token) => cmd.env(&self.variable, token),
            None => cmd.env_remove(&self.variable),
        };
        cmd
    }

    /// Runs `keys ARGS`, which must succeed; its stdout.
    async fn ok(&self, args: &[&str]) -> String {
        let (status, stdout, stderr) = run_to_exit(self.keys(args)).await;
        assert!(
            status.success(),
            "keys {args:?} exited {status}\nstdout:\n{stdout}\nstderr:\n{stderr}\nserve log:\n{}",
            self.gateway.stderr()
        );
        stdout
    }

    /// Runs a `keys` command that must fail; its stderr.
    async fn fails(&self, cmd: Command) -> String {
        let (status, stdout, stderr) = run_to_exit(cmd).await;
        assert!(!status.success(), "exited 0; stdout:\n{stdout}");
        assert_eq!(stdout, "", "nothing on stdout when failing");
        stderr
    }

    /// An operation lost to the 300 ms timeout (`/hold` never answers).
    async fn lose(&self, key: &str) {
        let lost = write(self.gateway.proxy, "/hold", Some(key), ORDER).await;
        lost.assert_operation_problem(504, "outcome-unknown", "unknown");
    }

    /// A `tools/call` of `create_task` through the `mcp` route, under
    /// `key`: the first one's answer is lost (`/drop`).
    async fn call_tool(&self, key: &str) -> Response {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                          "params": {"name": "create_task", "arguments": {"title": "t"}}});
        let headers = [
            ("content-type", "application/json"),
            ("accept", "application/json"),
            ("authorization", ALICE),
            ("mcp-protocol-version", "2025-11-25"),
            ("idempotency-key", key),
        ];
        send(
            self.gateway.proxy,
            "POST",
            "/drop",
            &headers,
            body.to_string(),
        )
        .await
    }

    /// The id of the one operation with `key`, from `keys list --json`.
    async fn id_of(&self, key: &str) -> String {
        let page = parse_json(&self.ok(&["list", "--key", key, "--json"]).await);
        assert_eq!(page["items"].as_array().map(Vec::len), Some(1), "{page}");
        page["items"][0]["id"].as_str().expect("id").to_owned()
    }
}

/// `resolve ID --outcome OUTCOME --operator OPERATOR` and `more`.
fn resolve<'a>(id: &'a str, outcome: &'a str, operator: &'a str, more: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["resolve", id, "--outcome", outcome, "--operator", operator];
    args.extend_from_slice(more);
    args
}

fn parse_json(stdout: &str) -> Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{stdout}"))
}

/// The one stderr line `error: <status> <name>: …`.
fn assert_api_error(stderr: &str, status: u16, name: &str) {
    let prefix = format!("error: {status} {name}: ");
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with(&prefix) && l.len() > prefix.len()),
        "no `{prefix}<detail>` line in:\n{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_operation_is_listed_shown_resolved_and_then_replayed() {
    let served = Served::start().await;
    served.lose("cli-1").await;
    assert_fresh_created(&write(served.gateway.proxy, "/orders", Some("cli-2"), ORDER).await);

    // list: an aligned table, newest first.
    let table = served.ok(&["list"]).await;
    let lines: Vec<&str> = table.lines().collect();
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        header,
        ["ID", "ROUTE", "KEY", "STATE", "ATTEMPTS", "UPDATED"],
        "{table}"
    );
    let rows: Vec<Vec<&str>> = lines[1..]
        .iter()
        .take_while(|l| !l.is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 2, "{table}");
    assert_eq!(
        &rows[0][1..5],
        ["api", "cli-2", "completed", "1"],
        "{table}"
    );
    assert_eq!(&rows[1][1..5], ["api", "cli-1", "unknown", "1"], "{table}");
    let key_column = lines[0].find("KEY").expect("KEY column");
    for line in &lines[1..=2] {
        assert_eq!(
            &line[key_column..key_column + 4],
            "cli-",
            "aligned: {table}"
        );
    }
    let id = rows[1][0].to_owned();

    // --state filters; --json is the API's page.
    let unknown = served.ok(&["list", "--state", "unknown"]).await;
    assert!(
        unknown.contains(&id) && !unknown.contains("cli-2"),
        "{unknown}"
    );
    let page = parse_json(&served.ok(&["list", "--state", "unknown", "--json"]).await);
    assert_eq!(page["items"][0]["id"], id.as_str());
    assert_eq!(page["next_cursor"], Value::Null);
    // --limit 1: the next cursor is printed.
    let first = served.ok(&["list", "--limit", "1"]).await;
    assert!(first.contains("next cursor: "), "{first}");

    // show: a block and the timeline, one event per line.
    let block = served.ok(&["show", &id]).await;
    assert!(
        block
            .lines()
            .any(|l| l.starts_with("state") && l.contains("unknown")),
        "{block}"
    );
    assert!(block.contains("POST /hold"), "{block}");
    // The profile says how it is settled (a tool `result` for mcp).
    assert!(
        block
            .lines()
            .any(|l| l.starts_with("route") && l.contains("(profile idemgate)")),
        "{block}"
    );
    let timeline: Vec<&str> = block
        .lines()
        .skip_while(|l| *l != "timeline")
        .skip(1)
        .collect();
    let kinds: Vec<&str> = timeline
        .iter()
        .filter_map(|l| l.split_whitespace().nth(1))
        .collect();
    let wanted = ["claimed", "sent", "timeout"];
    let positions: Vec<usize> = wanted
        .iter()
        .map(|w| {
            kinds
                .iter()
                .position(|k| k == w)
                .unwrap_or_else(|| panic!("no {w} event in:\n{block}"))
        })
        .collect();
    assert!(positions.windows(2).all(|p| p[0] < p[1]), "{block}");
    assert!(
        !block.contains(&served.token) && !block.contains("alice-token"),
        "{block}"
    );
    let shown = parse_json(&served.ok(&["show", &id, "--json"]).await);
    assert_eq!(shown["state"], "unknown");
    assert!(shown["events"].as_array().is_some_and(|e| e.len() >= 3));

    // A resolution decided on an attempt the operation is not at: refused.
    let stale = served
        .fails(served.keys(&resolve(&id, "completed", "ann", &["--attempt", "2"])))
        .await;
    assert_api_error(&stale, 409, "operation-changed");

    // resolve with the response retries get, on the attempt checked.
    let resolved = served
        .ok(&resolve(
            &id,
            "completed",
            "ann",
            &[
                "--attempt",
                "1",
                "--status",
                "201",
                "--json-body",
                r#"{"id":1}"#,
            ],
        ))
        .await;
    assert!(
        resolved
            .lines()
            .any(|l| l.starts_with("state") && l.contains("completed")),
        "{resolved}"
    );
    assert!(resolved.contains("resolved"), "{resolved}");

    let retry = write(served.gateway.proxy, "/hold", Some("cli-1"), ORDER).await;
    assert!(retry.is_replay(), "{retry:?}");
    assert_eq!(retry.status, 201);
    assert_eq!(retry.json(), json!({"id": 1}));
    assert_eq!(retry.header("content-type"), Some("application/json"));
    assert_eq!(served.upstream.writes(), 2, "the retry was not sent");

    // A second resolution: the API's 409, on stderr.
    let again = served
        .fails(served.keys(&resolve(&id, "not_attempted", "ann", &[])))
        .await;
    assert_api_error(&again, 409, "not-resolvable");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolutions_from_the_command_line_take_every_form() {
    let served = Served::start().await;

    // Without --status: replays say who resolved it.
    served.lose("cli-a").await;
    let id = served.id_of("cli-a").await;
    let answer = parse_json(
        &served
            .ok(&resolve(
                &id,
                "completed",
                "bob",
                &[
                    "--reference",
                    "T-7",
                    "--note",
                    "seen in the ledger",
                    "--json",
                ],
            ))
            .await,
    );
    assert_eq!(answer["state"], "completed");
    let resolved = answer["events"]
        .as_array()
        .and_then(|e| e.last())
        .expect("events");
    assert_eq!(resolved["kind"], "resolved");
    assert_eq!(resolved["detail"]["note"], "seen in the ledger");
    let retry = write(served.gateway.proxy, "/hold", Some("cli-a"), ORDER).await;
    assert!(retry.is_replay());
    assert_eq!(retry.status, 200);
    assert_eq!(
        retry.json(),
        json!({"resolved_by": "bob", "reference": "T-7"})
    );

    // Headers and a verbatim body.
    served.lose("cli-b").await;
    let id = served.id_of("cli-b").await;
    served
        .ok(&resolve(
            &id,
            "completed",
            "ann",
            &[
                "--status",
                "202",
                "--header",
                "X-Tag: one",
                "--header",
                "x-tag: two",
                "--header",
                "content-type: text/plain",
                "--body",
                "accepted",
            ],
        ))
        .await;
    let retry = write(served.gateway.proxy, "/hold", Some("cli-b"), ORDER).await;
    assert!(retry.is_replay());
    assert_eq!(retry.status, 202);
    assert_eq!(&retry.body[..], b"accepted");
    assert_eq!(retry.header_all("x-tag"), ["one", "two"]);
    assert_eq!(retry.header("content-type"), Some("text/plain"));

    // not_attempted: the next retry is forwarded (and held again).
    served.lose("cli-c").await;
    let id = served.id_of("cli-c").await;
    let writes = served.upstream.writes();
    served.ok(&resolve(&id, "not_attempted", "ann", &[])).await;
    let retry = write(served.gateway.proxy, "/hold", Some("cli-c"), ORDER).await;
    retry.assert_operation_problem(504, "outcome-unknown", "unknown");
    assert_eq!(served.upstream.writes(), writes + 1, "forwarded once");
    let shown = parse_json(&served.ok(&["show", &id, "--json"]).await);
    assert_eq!(shown["attempts"], 2, "{shown}");

    // The API refuses a response on a not_attempted resolution.
    let refused = served
        .fails(served.keys(&resolve(&id, "not_attempted", "ann", &["--status", "200"])))
        .await;
    assert_api_error(&refused, 400, "invalid-resolution");
}

/// An MCP tool call is settled with `--result`, the whole tool result
/// its retries get (`structuredContent` included); a `--result` for an
/// HTTP route's write, and `--status` for a tool call, are refused as the
/// API refuses them, the latter naming `--result`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_is_settled_with_a_result() {
    let served = Served::start().await;
    let lost = served.call_tool("cli-tool").await;
    assert_eq!(lost.json()["result"]["isError"], true, "{:?}", lost.json());
    let id = served.id_of("create_task/cli-tool").await;
    let result = r#"{"content":[{"type":"text","text":"created task 9"}],"structuredContent":{"id":9},"isError":false}"#;

    let refused = served
        .fails(served.keys(&resolve(
            &id,
            "completed",
            "ann",
            &["--status", "200", "--json-body", "{}"],
        )))
        .await;
    assert_api_error(&refused, 409, "wrong-answer-kind");
    assert!(refused.contains("--result"), "{refused}");
    served.lose("cli-http").await;
    let http = served.id_of("cli-http").await;
    let refused = served
        .fails(served.keys(&resolve(&http, "completed", "ann", &["--result", result])))
        .await;
    assert_api_error(&refused, 409, "wrong-answer-kind");

    served
        .ok(&resolve(&id, "completed", "ann", &["--result", result]))
        .await;
    let retry = served.call_tool("cli-tool").await;
    let replayed = &retry.json()["result"];
    assert_eq!(
        replayed["content"][0]["text"], "created task 9",
        "{replayed}"
    );
    assert_eq!(replayed["structuredContent"], json!({"id": 9}));
    assert_eq!(replayed["isError"], false);
    assert_eq!(replayed["_meta"]["dev.idemgate/replayed"], true);
    assert_eq!(
        served.upstream.writes(),
        2,
        "the call and the HTTP write, once each"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_one_line_on_stderr_with_a_non_zero_exit() {
    let served = Served::start().await;

    let missing = served.fails(served.keys(&["show", "no-such-id"])).await;
    assert_api_error(&missing, 404, "unknown-operation");

    let wrong = served
        .fails(served.keys_with_token(&["list"], Some("not-the-token")))
        .await;
    assert_api_error(&wrong, 401, "unauthorized");
    assert!(!wrong.contains("not-the-token"), "{wrong}");

    let unset = served.fails(served.keys_with_token(&["list"], None)).await;
    assert!(
        unset.starts_with("error: ") && unset.contains(&served.variable),
        "{unset}"
    );

    // A token the gateway itself would refuse is never sent (the gateway
    // would only answer 401): the CLI says what is wrong with it.
    for padded in [format!("{}\n", served.token), format!(" {}", served.token)] {
        let refused = served
            .fails(served.keys_with_token(&["list"], Some(&padded)))
            .await;
        assert!(
            refused.starts_with("error: ")
                && refused.contains(&served.variable)
                && refused.contains("whitespace"),
            "{refused}"
        );
        assert!(!refused.contains(&served.token), "{refused}");
    }

    // Nobody listening.
    let closed = closed_port().await;
    let mut cmd = binary();
    cmd.args(["keys", "list", "--admin", &format!("http://{closed}")])
        .arg("--token-env")
        .arg(&served.variable)
        .env(&served.variable, &served.token);
    let unreachable = served.fails(cmd).await;
    assert!(
        unreachable.starts_with("error: cannot reach the admin API"),
        "{unreachable}"
    );

    let bad_header = served
        .fails(served.keys(&resolve(
            "x",
            "completed",
            "ann",
            &["--status", "200", "--header", "no-colon"],
        )))
        .await;
    assert!(bad_header.contains("--header"), "{bad_header}");
}

/// A password in `--admin` was printed in full by the error that said the
/// admin API could not be reached; it is refused, masked, before any call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_url_with_a_password_is_refused_without_showing_it() {
    let closed = closed_port().await;
    let variable = format!("IDEMGATE_TEST_TOKEN_{}", uuid::Uuid::now_v7().simple());
    for admin in [
        format!("http://ops:S3CRET-PW@{closed}"),
        format!("http://S3CRET-PW@{closed}/"),
    ] {
        let mut cmd = binary();
        cmd.args(["keys", "list", "--admin", &admin, "--token-env", &variable])
            .env(&variable, "a-token-that-is-set");
        let (status, stdout, stderr) = run_to_exit(cmd).await;
        assert!(!status.success(), "{admin}: {stdout}");
        assert!(
            !stderr.contains("S3CRET") && !stdout.contains("S3CRET"),
            "{stderr}"
        );
        assert!(
            stderr.starts_with(&format!("error: --admin http://***@{closed}"))
                && stderr.contains("no user or password"),
            "{stderr}"
        );
    }
}

/// `keys` given the proxy's port for the admin API's: the gateway
/// forwarded the call, admin token and all, to the upstream behind its
/// catch-all route. It refuses it (421 `misdirected-admin-call`, nothing
/// sent), and the CLI says so; a request at another path, or with
/// another token, is the upstream's as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_token_sent_to_the_proxy_listener_never_reaches_the_upstream() {
    let served = Served::start().await;
    let mut cmd = binary();
    cmd.args(["keys", "list", "--admin"])
        .arg(format!("http://{}", served.gateway.proxy))
        .arg("--token-env")
        .arg(&served.variable)
        .env(&served.variable, &served.token);
    let misdirected = served.fails(cmd).await;
    assert_api_error(&misdirected, 421, "misdirected-admin-call");
    assert!(misdirected.contains("admin listener"), "{misdirected}");
    // Below a prefix the tool was given (`--admin http://host/ops`).
    let mut prefixed = binary();
    prefixed
        .args(["keys", "list", "--admin"])
        .arg(format!("http://{}/ops", served.gateway.proxy))
        .arg("--token-env")
        .arg(&served.variable)
        .env(&served.variable, &served.token);
    assert_api_error(&served.fails(prefixed).await, 421, "misdirected-admin-call");
    // Any spelling of the scheme, the path or the framing, and a write as
    // well as a read (found by the recheck: a prefix, `/ADMIN`, `%2F`,
    // `;`, a tab, lines joined by a comma were forwarded).
    let token = &served.token;
    for (method, path, auth) in [
        ("POST", "/admin/keys", format!("bearer {token}")),
        ("GET", "/admin/keys", format!("BEARER {token}")),
        ("GET", "/ADMIN/keys", format!("Bearer {token}")),
        ("GET", "/admin%2Fkeys", format!("Bearer {token}")),
        ("GET", "/admin;x/keys", format!("Bearer {token}")),
        ("GET", "/admin", format!("Bearer {token}")),
        ("GET", "/gw/admin/stats", format!("Bearer\t{token}")),
        (
            "GET",
            "/admin/keys",
            format!("Bearer other, Bearer {token}"),
        ),
    ] {
        let headers = [
            ("authorization", auth.as_str()),
            ("idempotency-key", "k-misdirected"),
        ];
        let answer = send(served.gateway.proxy, method, path, &headers, "{}").await;
        answer.assert_problem(421, "misdirected-admin-call");
    }
    let sent_token = served.upstream.requests().iter().any(|r| {
        r.header("authorization")
            .is_some_and(|a| a.contains(&served.token))
    });
    assert!(!sent_token, "the admin token reached the upstream");
    // Another path, or another token at an /admin/ path: the upstream's.
    let own = format!("Bearer {}", served.token);
    for (path, auth) in [
        ("/admin/keys", "Bearer the-upstream-s-own"),
        ("/v1/keys", own.as_str()),
        ("/administrators", own.as_str()),
    ] {
        let headers = [("authorization", auth)];
        let answer = send(served.gateway.proxy, "GET", path, &headers, "").await;
        assert_eq!(answer.status, 200, "{path}: {:?}", answer.body);
    }
    assert_eq!(served.upstream.requests().len(), 3);
}

/// The operator's name went into the log line bare: a name holding
/// ` outcome=not_attempted operation_id=…` wrote fields of its own into
/// the audit line of who settled what. It is written quoted, escaped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_name_cannot_forge_fields_of_the_resolution_log_line() {
    let served = Served::start().await;
    served.lose("forge-1").await;
    let listed = parse_json(&served.ok(&["list", "--state", "unknown", "--json"]).await);
    let id = listed["items"][0]["id"].as_str().expect("an id").to_owned();
    let forged = "eve outcome=not_attempted operator=ann\u{202e}x";
    served.ok(&resolve(&id, "completed", forged, &[])).await;
    let logged = served.gateway.wait_for_log("resolved by an operator").await;
    let line = logged
        .lines()
        .find(|l| l.contains("resolved by an operator"))
        .expect("the line");
    assert!(
        line.contains(r#"operator="eve outcome=not_attempted operator=ann\u{202e}x""#),
        "{line}"
    );
    assert_eq!(
        line.matches("outcome=").count(),
        2,
        "one field, one quoted text: {line}"
    );
}
