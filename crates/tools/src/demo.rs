//! `idemgate demo`: a newcomer's tour. Starts the mock API and a gateway on
//! free loopback ports with a throw-away store, walks through what idemgate
//! does — printing each step, what the client got and how many writes
//! reached the API — and exits.
//!
//! Each step checks what it shows: if idemgate ever behaved otherwise, the
//! demo fails with [`DemoError::Unexpected`] instead of printing a wrong story.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use http::{HeaderMap, HeaderValue, Method, StatusCode};

use crate::gateway_client::{Answer, CallError, GatewayClient, join_all};
use crate::mock_upstream::MockUpstream;
use idemgate::config::Config;
use idemgate::server::{Gateway, StartError, StartOptions};

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("cannot start: {0}")]
    Io(#[from] std::io::Error),
    #[error("cannot start the gateway: {0}")]
    Start(#[from] StartError),
    #[error("the demo config is invalid: {0}")]
    Config(#[from] idemgate::config::ConfigError),
    #[error("a request failed: {0}")]
    Request(#[from] CallError),
    #[error("step {step}: expected {expected}, got {got}")]
    Unexpected {
        step: u32,
        expected: String,
        got: String,
    },
}

struct Tour<W> {
    out: W,
    client: GatewayClient,
    mock: MockUpstream,
    requests: u64,
}

const TOKEN: &str = "Bearer demo-token";

impl<W: Write> Tour<W> {
    /// A keyed POST of `body` to `path`, counted.
    async fn post(&mut self, path: &str, key: &str, body: &str) -> Result<Answer, DemoError> {
        self.send(Method::POST, path, Some(key), body).await
    }

    /// A request through the gateway, counted.
    async fn send(
        &mut self,
        method: Method,
        path: &str,
        key: Option<&str>,
        body: &str,
    ) -> Result<Answer, DemoError> {
        self.requests += 1;
        Ok(self.client.send(method, path, key, body).await?)
    }

    /// An operator's call to the admin API.
    async fn admin(&mut self, method: Method, path: &str, body: &str) -> Result<Answer, DemoError> {
        Ok(self.client.admin(method, path, body).await?)
    }

    /// An operator's resolution of operation `id`.
    async fn resolve(&mut self, id: &str, resolution: &str) -> Result<Answer, DemoError> {
        let path = format!("/admin/keys/{id}/resolve");
        self.admin(Method::POST, &path, resolution).await
    }

    fn say(&mut self, text: &str) -> Result<(), DemoError> {
        writeln!(self.out, "{text}")?;
        Ok(())
    }

    /// Prints what the client got and the API's write count, and checks both.
    fn show(
        &mut self,
        step: u32,
        got: &str,
        ok: bool,
        expected: &str,
        writes: u64,
    ) -> Result<(), DemoError> {
        let counted = self.mock.writes();
        writeln!(self.out, "   → {got}\n   writes at the API: {counted}")?;
        if !ok {
            return Err(DemoError::Unexpected {
                step,
                expected: expected.into(),
                got: got.into(),
            });
        }
        if counted != writes {
            return Err(DemoError::Unexpected {
                step,
                expected: format!("{writes} writes at the API"),
                got: format!("{counted}"),
            });
        }
        Ok(())
    }
}

/// Runs the tour, printing to `out`.
pub async fn run(out: impl Write) -> Result<(), DemoError> {
    let dir = std::env::temp_dir().join(format!("idemgate-demo-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir)?;
    let result = tour(out, &dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn tour(out: impl Write, dir: &std::path::Path) -> Result<(), DemoError> {
    let mock = MockUpstream::start(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    let store: PathBuf = dir.join("demo.db");
    let config = Config::from_toml_str(
        &format!(
            r#"
            [server]
            listen = "127.0.0.1:0"
            admin_listen = "127.0.0.1:0"
            [store]
            url = "sqlite://{store}"
            [[routes]]
            name = "tasks"
            path_prefix = "/"
            upstream = "http://{mock}"
            [[routes]]
            name = "orders"
            path_prefix = "/orders"
            upstream = "http://{mock}"
            [routes.reconcile]
            url = "http://{mock}/_effects/{{key}}"
            found_json_pointer = "/id"
            [[routes]]
            name = "events"
            path_prefix = "/events"
            upstream = "http://{mock}"
            key = "derive"
            derive_from = ["/event_id"]
            [[routes]]
            name = "agent"
            profile = "mcp"
            path_prefix = "/agent"
            upstream = "http://{mock}"
            "#,
            store = store.display(),
            mock = mock.addr(),
        ),
        "demo",
    )?;
    let admin_token = uuid::Uuid::now_v7().simple().to_string();
    let options = StartOptions {
        admin_token: Some(admin_token.clone()),
        ..StartOptions::default()
    };
    let gateway = Gateway::start_with(config, options).await?;
    let mut headers = HeaderMap::new();
    headers.insert("authorization", HeaderValue::from_static(TOKEN));
    let mut tour = Tour {
        out,
        client: GatewayClient::new(gateway.addr(), gateway.admin_addr(), admin_token, headers),
        mock,
        requests: 0,
    };
    let result = steps(&mut tour).await;
    gateway.shutdown().await;
    tour.mock.stop().await;
    result
}

async fn steps<W: Write>(t: &mut Tour<W>) -> Result<(), DemoError> {
    t.say(&format!(
        "idemgate demo: a gateway on {} in front of a mock API on {}.\n\
         The mock is not idempotent: every write it receives creates something.\n",
        t.client.gateway(),
        t.mock.addr()
    ))?;

    t.say("1. A first write: POST /tasks with Idempotency-Key: demo-1")?;
    let first = t
        .post("/tasks", "demo-1", r#"{"title":"write the report"}"#)
        .await?;
    let ok = first.status == StatusCode::CREATED;
    t.show(1, &first.summary(), ok, "201", 1)?;

    t.say("\n2. Its response was lost, so the client retries the same request")?;
    let again = t
        .post("/tasks", "demo-1", r#"{ "title": "write the report" }"#)
        .await?;
    let ok = again.replayed && again.body == first.body && again.status == first.status;
    let got = format!(
        "{} (Idempotent-Replayed: {})",
        again.summary(),
        again.replayed
    );
    t.show(2, &got, ok, "the same 201, replayed", 1)?;
    t.say("   The stored response was replayed byte for byte; the JSON was re-serialised\n   with other spacing, and it is still the same request.")?;

    t.say("\n3. The same key with a changed payload (a bug in the client)")?;
    let changed = t
        .post("/tasks", "demo-1", r#"{"title":"something else"}"#)
        .await?;
    let ok = changed.status == StatusCode::UNPROCESSABLE_ENTITY;
    t.show(3, &changed.summary(), ok, "422 key-reused", 1)?;

    t.say("\n4. 20 concurrent duplicates of a slow write (a retry storm, key demo-2)")?;
    let storm = (0..20).map(|_| {
        let client = t.client.clone();
        async move {
            let answer = client
                .post("/slow?ms=400", "demo-2", r#"{"title":"slow"}"#)
                .await?;
            Ok::<_, DemoError>(answer.status)
        }
    });
    let statuses: Vec<StatusCode> = join_all(storm).await?;
    t.requests += 20;
    let created = statuses
        .iter()
        .filter(|s| **s == StatusCode::CREATED)
        .count();
    let conflicts = statuses
        .iter()
        .filter(|s| **s == StatusCode::CONFLICT)
        .count();
    let got = format!("{created} × 201, {conflicts} × 409 request-in-progress");
    let ok = created >= 1 && created + conflicts == 20;
    t.show(4, &got, ok, "one forwarded, the rest 409 or replayed", 2)?;

    t.say("\n5. A client that sends no key retries the same event (the /events route\n   derives the key from the body's /event_id)")?;
    let event = r#"{"event_id":"evt-981","title":"from the CRM"}"#;
    let first_event = t.send(Method::POST, "/events", None, event).await?;
    let retry_event = t.send(Method::POST, "/events", None, event).await?;
    let got = format!(
        "{} with Idempotency-Key: {}…, then {} replayed: {}",
        first_event.summary(),
        first_event
            .key
            .as_deref()
            .map_or("-", |k| &k[..k.len().min(24)]),
        retry_event.status.as_u16(),
        retry_event.replayed
    );
    let ok = first_event.status == StatusCode::CREATED
        && retry_event.replayed
        && first_event.key == retry_event.key;
    t.show(5, &got, ok, "201, then the same 201 replayed", 3)?;

    t.say("\n6. A lost response: the API commits the write, then drops the connection\n   (POST /drop, key demo-3)")?;
    let lost = t.post("/drop", "demo-3", r#"{"title":"maybe"}"#).await?;
    let retry = t.post("/drop", "demo-3", r#"{"title":"maybe"}"#).await?;
    let got = format!("{}, retry {}", lost.summary(), retry.summary());
    let ok = lost.status == StatusCode::BAD_GATEWAY && retry.status == StatusCode::CONFLICT;
    t.show(
        6,
        &got,
        ok,
        "502 outcome-unknown, then 409 outcome-unknown",
        4,
    )?;
    t.say("   The write may have happened, so idemgate holds it as `unknown` and never\n   re-sends it blindly; an operator or a reconcile probe settles it.")?;

    reconciled(t).await?;
    resolved_by_an_operator(t).await?;
    agent_tool_call(t).await?;

    let (requests, writes) = (t.requests, t.mock.writes());
    t.say(&format!(
        "\ndemo ok: {requests} requests, {writes} writes at the API: each intended write happened once."
    ))
}

/// Step 7: a lost response settled by the route's reconcile probe.
async fn reconciled<W: Write>(t: &mut Tour<W>) -> Result<(), DemoError> {
    t.say("\n7. Another lost response, on /orders, whose route has a reconcile probe\n   (GET /_effects/{key} on the API): POST /orders/drop, key demo-4")?;
    let lost = t.post("/orders/drop", "demo-4", r#"{"sku":"A-1"}"#).await?;
    t.say(&format!("   → {}", lost.summary()))?;
    // The probe runs right away; the client can ask how its operation stands.
    t.requests += 1;
    let state = t.client.state_until("demo-4", "completed", 100).await?;
    t.say(&format!(
        "   GET /.idemgate/operations/demo-4 → state {state}"
    ))?;
    let retry = t.post("/orders/drop", "demo-4", r#"{"sku":"A-1"}"#).await?;
    let got = format!(
        "retry {} (Idempotent-Replayed: {})",
        retry.summary(),
        retry.replayed
    );
    let ok = state == "completed" && retry.replayed && retry.status == StatusCode::OK;
    t.show(7, &got, ok, "completed by the probe, the retry replayed", 5)?;
    t.say("   The probe found the order at the API, so the operation is completed with\n   the probe's answer as its response: no operator needed, no second order.")
}

/// Step 8: an operator settles the operation step 6 left unknown.
async fn resolved_by_an_operator<W: Write>(t: &mut Tour<W>) -> Result<(), DemoError> {
    t.say("\n8. An operator settles the held operation from step 6 through the admin API")?;
    let listed = t
        .admin(Method::GET, "/admin/keys?state=unknown&key=demo-3", "")
        .await?;
    let id = serde_json::from_str::<serde_json::Value>(&listed.body)
        .ok()
        .and_then(|v| v["items"][0]["id"].as_str().map(str::to_string))
        .ok_or_else(|| DemoError::Unexpected {
            step: 8,
            expected: "demo-3 listed as unknown".into(),
            got: listed.body.clone(),
        })?;
    t.say(&format!(
        "   GET /admin/keys?state=unknown → {id} (key demo-3)"
    ))?;
    let resolution = r#"{"outcome":"completed","operator":"demo-operator","reference":"task 4 exists at the API"}"#;
    let resolved = t.resolve(&id, resolution).await?;
    t.say(&format!(
        "   POST /admin/keys/{id}/resolve {resolution} → {}",
        resolved.status.as_u16()
    ))?;
    let retry = t.post("/drop", "demo-3", r#"{"title":"maybe"}"#).await?;
    let got = format!(
        "retry {} (Idempotent-Replayed: {})",
        retry.summary(),
        retry.replayed
    );
    let ok = resolved.status == StatusCode::OK && retry.replayed;
    t.show(8, &got, ok, "the operator's resolution replayed", 5)
}

/// Step 9: an AI agent's MCP tool call whose answer is lost, held, and
/// settled by an operator with the tool result its retries then get.
async fn agent_tool_call<W: Write>(t: &mut Tour<W>) -> Result<(), DemoError> {
    t.say("\n9. An AI agent calls a tool on an MCP server through the `agent` route\n   (profile mcp). The server creates the task, then the connection drops:\n   tools/call create_task, _meta key agent-1, JSON-RPC id 1 (POST /agent/mcp/drop)")?;
    let call = |id: u32| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"create_task","arguments":{{"title":"book the venue"}},"_meta":{{"dev.idemgate/idempotency-key":"agent-1"}}}}}}"#
        )
    };
    let lost = tool_result(
        t.send(Method::POST, "/agent/mcp/drop", None, &call(1))
            .await?,
    );
    let retry = tool_result(
        t.send(Method::POST, "/agent/mcp/drop", None, &call(2))
            .await?,
    );
    let got = format!(
        "id {}: isError {}, {}; the agent's retry, id {}: {}",
        lost.id, lost.is_error, lost.problem, retry.id, retry.problem
    );
    let ok = lost.id == 1
        && lost.is_error
        && lost.problem == "outcome-unknown"
        && retry.id == 2
        && retry.problem == "outcome-unknown";
    t.show(9, &got, ok, "two outcome-unknown tool results", 6)?;
    t.say("   The agent reads a tool result, not an error to retry: \"This action may already\n   have happened … Do not call it again, not with another idempotency key nor\n   with other wording\". Nothing was sent again.")?;
    let resolution = r#"{"outcome":"completed","operator":"demo-operator","result":{"content":[{"type":"text","text":"created task 6"}],"isError":false}}"#;
    let id = lost.operation.clone();
    let resolved = t.resolve(&id, resolution).await?;
    t.say(&format!(
        "   An operator checks the API and resolves it with the tool result:\n   POST /admin/keys/{id}/resolve → {}",
        resolved.status.as_u16()
    ))?;
    let settled = tool_result(
        t.send(Method::POST, "/agent/mcp/drop", None, &call(3))
            .await?,
    );
    let got = format!(
        "id {}: \"{}\" (dev.idemgate/replayed: {})",
        settled.id, settled.text, settled.replayed
    );
    let ok = settled.id == 3 && settled.text == "created task 6" && settled.replayed;
    t.show(9, &got, ok, "the resolved result, under the new id", 6)
}

/// What an MCP client reads of a tool call's answer.
struct ToolResult {
    id: u64,
    is_error: bool,
    text: String,
    problem: String,
    operation: String,
    replayed: bool,
}

fn tool_result(answer: Answer) -> ToolResult {
    let message: serde_json::Value = serde_json::from_str(&answer.body).unwrap_or_default();
    let result = &message["result"];
    let meta = &result["_meta"];
    let text = |value: &serde_json::Value| value.as_str().unwrap_or_default().to_string();
    ToolResult {
        id: message["id"].as_u64().unwrap_or_default(),
        is_error: result["isError"] == true,
        text: text(&result["content"][0]["text"]),
        problem: text(&meta["dev.idemgate/problem"]),
        operation: text(&meta["dev.idemgate/operation-id"]),
        replayed: meta["dev.idemgate/replayed"] == true,
    }
}
