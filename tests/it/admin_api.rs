//! The admin API and the client status lookup (docs/operating.md; docs/requests.md,
//! "After a lost response"), against in-process gateways:
//!
//! 1. every `/admin/*` route is 401 problem+json without the exact bearer
//!    token, also when no token is configured; an admin listener off
//!    loopback without a token refuses to start;
//! 2. an `unknown` operation is listed, shown with its timeline, and no
//!    credential appears in anything the API answers;
//! 3. resolutions: completed with and without a response (none with a
//!    body its status cannot carry), `not_attempted` (the retry is
//!    forwarded once), 409 for settled and live operations,
//!    and a resolution racing client retries never lets two through;
//! 4. pause and resume (stored across a restart), stats, pagination;
//! 5. `GET /.idemgate/operations/{key}` is scoped to the caller, and `HEAD`
//!    answers as `GET` without the body;
//! 6. `/metrics` counters, and every route of the OpenAPI document answers a
//!    status the document lists.
//!
//! Tokens are handed to the gateway through `StartOptions`, never through
//! the (process-global) environment.

use std::collections::BTreeSet;

use crate::common::*;
use bytes::Bytes;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const ORDER: &str = r#"{"sku":"A-1","qty":2}"#;

/// A route whose held writes an operator may resolve `not_attempted` at
/// once: its late window is over a millisecond after the attempt
/// (`not_attempted_waits_until_the_attempt_can_no_longer_land` tests the
/// wait).
const SETTLED_AT_ONCE: &str = "upstream_timeout = \"300ms\"\nlate_window = \"1ms\"";

fn new_token() -> String {
    format!("adm-{}", uuid::Uuid::now_v7().simple())
}

/// An admin client for one gateway.
struct AdminApi {
    addr: std::net::SocketAddr,
    token: String,
}

impl AdminApi {
    async fn get(&self, path: &str) -> Response {
        admin_call(self.addr, "GET", path, Some(&self.token), "").await
    }

    async fn post(&self, path: &str, body: &str) -> Response {
        admin_call(self.addr, "POST", path, Some(&self.token), body).await
    }

    /// GET that must answer 200 JSON.
    async fn get_json(&self, path: &str) -> Value {
        let resp = self.get(path).await;
        assert_eq!(
            resp.status,
            200,
            "GET {path}: {}",
            String::from_utf8_lossy(&resp.body)
        );
        assert_eq!(resp.header("content-type"), Some("application/json"));
        resp.json()
    }

    /// The one operation with `key`, as `GET /admin/keys?key=` lists it.
    async fn summary(&self, key: &str) -> Value {
        let page = self.get_json(&format!("/admin/keys?key={key}")).await;
        let items = page["items"].as_array().expect("items");
        assert_eq!(items.len(), 1, "operations with key {key}: {page}");
        items[0].clone()
    }

    async fn id_of(&self, key: &str) -> String {
        self.summary(key).await["id"]
            .as_str()
            .expect("id")
            .to_owned()
    }

    async fn show(&self, id: &str) -> Value {
        self.get_json(&format!("/admin/keys/{id}")).await
    }

    async fn resolve(&self, id: &str, resolution: &Value) -> Response {
        self.post(
            &format!("/admin/keys/{id}/resolve"),
            &resolution.to_string(),
        )
        .await
    }

    /// A resolution that must be taken (200): the operation it answers.
    async fn resolved(&self, id: &str, resolution: &Value) -> Value {
        taken(&self.resolve(id, resolution).await, resolution)
    }
}

async fn gateway(route_extra: &str) -> (TestGateway, AdminApi) {
    let token = new_token();
    let mut setup = Setup::route(route_extra);
    setup.admin_token = Some(token.clone());
    let gw = spawn_gateway_with(setup).await;
    let admin = AdminApi {
        addr: gw.admin_addr(),
        token,
    };
    (gw, admin)
}

/// The names of a JSON object's fields.
fn field_names(object: &Value) -> BTreeSet<&str> {
    let fields = object.as_object().expect("a JSON object");
    fields.keys().map(String::as_str).collect()
}

fn kinds(op: &Value) -> Vec<String> {
    op["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["kind"].as_str().expect("kind").to_owned())
        .collect()
}

/// Asserts `wanted` appear in `kinds` in this order (others may be between).
fn assert_in_order(kinds: &[String], wanted: &[&str]) {
    let mut rest = kinds.iter();
    for want in wanted {
        assert!(
            rest.any(|k| k == want),
            "timeline {kinds:?} lacks {wanted:?} in order (at {want})"
        );
    }
}

fn is_rfc3339_utc(text: &Value) -> bool {
    text.as_str()
        .is_some_and(|t| t.ends_with('Z') && humantime::parse_rfc3339(t).is_ok())
}

/// Writes to `/hold` (never answered) as [`ALICE`] until the 300 ms
/// upstream timeout makes the operation `unknown`; returns its id.
async fn unknown_operation(gw: &TestGateway, admin: &AdminApi, key: &str) -> String {
    let lost = write(gw.addr(), "/hold", Some(key), ORDER).await;
    lost.assert_operation_problem(504, "outcome-unknown", "unknown");
    admin.id_of(key).await
}

/// Every `/admin/*` route with a concrete path and a body it accepts.
fn admin_routes(id: &str) -> Vec<(&'static str, String, String)> {
    let resolution = json!({"outcome": "not_attempted", "operator": "ann"}).to_string();
    vec![
        ("GET", "/admin/keys".into(), String::new()),
        ("GET", "/admin/keys?state=unknown".into(), String::new()),
        ("GET", format!("/admin/keys/{id}"), String::new()),
        ("POST", format!("/admin/keys/{id}/resolve"), resolution),
        ("GET", "/admin/stats".into(), String::new()),
        ("POST", "/admin/routes/api/pause".into(), String::new()),
        ("POST", "/admin/routes/api/resume".into(), String::new()),
        ("GET", "/admin/openapi.json".into(), String::new()),
        ("GET", "/admin/no-such-thing".into(), String::new()),
    ]
}

fn assert_unauthorized(resp: &Response, what: &str) {
    assert_eq!(
        resp.status,
        401,
        "{what}: {}",
        String::from_utf8_lossy(&resp.body)
    );
    resp.assert_problem(401, "unauthorized");
    assert_eq!(resp.header("www-authenticate"), Some("Bearer"), "{what}");
}

// ------------------------------------------------------------------ auth

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_admin_route_needs_the_exact_bearer_token() {
    let (gw, admin) = gateway(SETTLED_AT_ONCE).await;
    let id = unknown_operation(&gw, &admin, "auth-1").await;
    let token = admin.token.clone();
    let wrong = [
        None,
        Some("Bearer wrong".to_owned()),
        Some(format!("Bearer {token}x")),
        Some(format!("Bearer {}", &token[..token.len() - 1])),
        Some(format!("Basic {token}")),
        Some(token.clone()),
        Some("Bearer ".to_owned()),
    ];
    for (method, path, body) in admin_routes(&id) {
        for authorization in &wrong {
            let mut headers = vec![("content-type", "application/json")];
            if let Some(auth) = authorization {
                headers.push(("authorization", auth.as_str()));
            }
            let resp = send(admin.addr, method, &path, &headers, body.clone()).await;
            assert_unauthorized(&resp, &format!("{method} {path} with {authorization:?}"));
        }
    }
    // Nothing the refused calls asked for happened.
    let op = admin.show(&id).await;
    assert_eq!(op["state"], "unknown", "{op}");
    assert!(!kinds(&op).contains(&"resolved".to_owned()));
    let fresh = write(gw.addr(), "/orders", Some("auth-2"), ORDER).await;
    assert_fresh_created(&fresh);

    // The right token gets past the check on every route.
    for (method, path, body) in admin_routes(&id) {
        let resp = admin_call(admin.addr, method, &path, Some(&token), &body).await;
        let expected = if path.ends_with("no-such-thing") {
            404
        } else {
            200
        };
        assert_eq!(
            resp.status,
            expected,
            "{method} {path}: {}",
            String::from_utf8_lossy(&resp.body)
        );
    }
    // Two `Authorization` lines are ambiguous, whichever comes first.
    let right = format!("Bearer {token}");
    for pair in [
        [right.as_str(), "Bearer wrong"],
        ["Bearer wrong", right.as_str()],
        [right.as_str(), right.as_str()],
    ] {
        let headers = [("authorization", pair[0]), ("authorization", pair[1])];
        let resp = send(admin.addr, "GET", "/admin/stats", &headers, Bytes::new()).await;
        let problem = resp.assert_problem(400, "ambiguous-credentials");
        assert!(!problem.to_string().contains(&token), "{problem}");
    }
    // The unauthenticated routes need no token.
    for path in ["/healthz", "/readyz", "/metrics"] {
        let resp = send(admin.addr, "GET", path, &[], Bytes::new()).await;
        assert_eq!(resp.status, 200, "{path}");
    }
}

/// The answers that carry operations' keys, paths, bodies and timelines
/// had no `Cache-Control` (the console's static files, which hold none,
/// did): a browser or a proxy in front of the console could keep them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_admin_answer_is_kept_by_a_cache_or_sniffed() {
    let (gw, admin) = gateway(SETTLED_AT_ONCE).await;
    let id = unknown_operation(&gw, &admin, "cache-1").await;
    let refused = admin_call(admin.addr, "GET", "/admin/keys", None, "").await;
    let answers = [
        admin.get("/admin/keys").await,
        admin.get(&format!("/admin/keys/{id}")).await,
        admin.get("/admin/stats").await,
        admin.get("/metrics").await,
        admin.get("/admin/keys/no-such-id").await,
        refused,
    ];
    for answer in answers {
        assert_eq!(
            answer.header("cache-control"),
            Some("no-store"),
            "{answer:?}"
        );
        assert_eq!(answer.header("x-content-type-options"), Some("nosniff"));
    }
}

/// The console's list asked every row's whole detail, stored request body
/// and all (up to `max_body` each, escaped up to six times over), to
/// show its evidence: a page of held writes cost the gateway and the
/// operator's tab a gigabyte. `?body=omit` leaves the body out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detail_asked_without_its_body_leaves_the_body_out() {
    let (gw, admin) = gateway(&format!("{SETTLED_AT_ONCE}\nstore_request_body = true")).await;
    let id = unknown_operation(&gw, &admin, "omit-1").await;
    let whole = admin.get_json(&format!("/admin/keys/{id}")).await;
    assert!(whole["request"]["body"].is_string(), "{whole}");
    let omitted = admin.get_json(&format!("/admin/keys/{id}?body=omit")).await;
    assert!(omitted["request"].get("body").is_none(), "{omitted}");
    assert_eq!(
        omitted["request"]["body_size"],
        whole["request"]["body_size"]
    );
    assert_eq!(omitted["evidence"], whole["evidence"]);
    assert_eq!(omitted["next_action"], whole["next_action"]);
    for wrong in ["?body=all", "?limit=1", "?body=omit&body=omit"] {
        let refused = admin.get(&format!("/admin/keys/{id}{wrong}")).await;
        refused.assert_problem(400, "invalid-request");
    }
}

/// A stored body that is not UTF-8 (a Latin-1 form, a gzip body) was
/// shown as text with its bytes replaced by U+FFFD, beside the SHA-256 of
/// the bytes sent: something the client never sent, with no sign of it.
/// It is given as its bytes, in base64.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_body_that_is_not_utf8_is_shown_as_its_bytes() {
    use base64::Engine as _;
    let (gw, admin) = gateway(&format!("{SETTLED_AT_ONCE}\nstore_request_body = true")).await;
    let latin1: &[u8] = b"name=Jos\xe9&city=K\xf6ln";
    let headers = [
        (
            "content-type",
            "application/x-www-form-urlencoded; charset=iso-8859-1",
        ),
        ("idempotency-key", "latin-1"),
        ("authorization", ALICE),
    ];
    let lost = send(gw.addr(), "POST", "/hold", &headers, latin1.to_vec()).await;
    lost.assert_operation_problem(504, "outcome-unknown", "unknown");
    let id = admin.id_of("latin-1").await;
    let shown = admin.get_json(&format!("/admin/keys/{id}")).await;
    assert!(shown["request"].get("body").is_none(), "{shown}");
    let encoded = shown["request"]["body_base64"].as_str().expect("base64");
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .expect("base64");
    assert_eq!(decoded, latin1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_configured_token_every_admin_call_is_401() {
    // A variable nobody sets: no token at all.
    let variable = format!("IDEMGATE_TEST_UNSET_{}", uuid::Uuid::now_v7().simple());
    let setup = Setup::route("").server(&format!("admin_token_env = \"{variable}\""));
    let gw = spawn_gateway_with(setup).await;
    let created = write(gw.addr(), "/orders", Some("noauth-1"), ORDER).await;
    assert_fresh_created(&created);
    for (method, path, body) in admin_routes("00000000-0000-7000-8000-000000000000") {
        for authorization in [None, Some("Bearer "), Some("Bearer anything")] {
            let mut headers = vec![("content-type", "application/json")];
            if let Some(auth) = authorization {
                headers.push(("authorization", auth));
            }
            let resp = send(gw.admin_addr(), method, &path, &headers, body.clone()).await;
            // Told apart from a wrong token, naming what to set (the
            // console shows this).
            resp.assert_problem(401, "admin-token-unset");
            assert_eq!(resp.header("www-authenticate"), Some("Bearer"));
            let detail = resp.json()["detail"].as_str().unwrap_or("").to_owned();
            assert!(
                detail.contains(&variable) && detail.contains("server.admin_token_env"),
                "{method} {path}: {detail}"
            );
        }
    }
    let health = send(gw.admin_addr(), "GET", "/healthz", &[], Bytes::new()).await;
    assert_eq!(health.status, 200);
}

/// A config (store in `dir`) whose admin token variable is one of its
/// own, set by nobody: (variable, TOML).
fn token_variable_config(dir: &std::path::Path) -> (String, String) {
    let variable = format!("IDEMGATE_TEST_TOKEN_{}", uuid::Uuid::now_v7().simple());
    let setup = Setup::route("").server(&format!("admin_token_env = \"{variable}\""));
    let toml = gateway_toml_with(&dir.join("idemgate.db"), "http://127.0.0.1:9", &setup);
    (variable, toml)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exposed_admin_listener_without_a_token_refuses_to_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (variable, toml) = token_variable_config(dir.path());
    let exposed = toml.replace(
        "admin_listen = \"127.0.0.1:0\"",
        "admin_listen = \"0.0.0.0:0\"",
    );
    assert_ne!(exposed, toml, "the template's admin_listen line changed");
    let started = tokio::time::timeout(
        WAIT,
        idemgate::server::Gateway::start(parse_config(&exposed)),
    )
    .await
    .expect("start timed out");
    let error = match started {
        Ok(gateway) => {
            gateway.shutdown().await;
            panic!("a gateway started with an exposed admin listener and no token");
        }
        Err(error) => error,
    };
    assert!(
        matches!(error, idemgate::server::StartError::ExposedAdmin(_)),
        "{error:?}"
    );
    let text = error.to_string();
    assert!(
        text.contains("admin_listen") && text.contains(&variable),
        "the error names neither admin_listen nor {variable}: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_token_with_surrounding_whitespace_refuses_to_start() {
    // The real binary, so the token comes from the environment as in
    // production; a loopback admin listener does not make it acceptable.
    let dir = tempfile::tempdir().expect("tempdir");
    let (variable, toml) = token_variable_config(dir.path());
    let config = write_config(dir.path(), "idemgate.toml", &toml);
    for token in ["s3cret-token\n", " s3cret-token", "   "] {
        let mut cmd = binary();
        cmd.arg("serve").arg("--config").arg(&config);
        cmd.env(&variable, token);
        let (status, stdout, stderr) = run_to_exit(cmd).await;
        assert!(!status.success(), "started with {token:?}: {stdout}");
        assert!(
            stderr.contains(&variable) && stderr.contains("whitespace"),
            "the refusal names neither {variable} nor the fault: {stderr}"
        );
        assert!(!stderr.contains("s3cret"), "the token leaked: {stderr}");
    }
}

// ------------------------------------------------------- unknown, shown

/// A write carrying a credential in every place one can hide: the
/// Authorization header, a second scope header, a path parameter and the
/// query string.
async fn send_with_secrets(gw: &TestGateway) -> Response {
    send(
        gw.addr(),
        "POST",
        "/hold;jsessionid=session-secret-5?api_key=query-secret-77",
        &[
            ("content-type", "application/json"),
            ("authorization", ALICE),
            ("x-account", "acct-secret-42"),
            ("idempotency-key", "held-1"),
        ],
        ORDER,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_operation_is_listed_and_shown_without_credentials() {
    let (gw, admin) =
        gateway("upstream_timeout = \"300ms\"\nscope_headers = [\"authorization\", \"x-account\"]")
            .await;
    let secrets = [
        "alice-token",
        "acct-secret-42",
        "query-secret-77",
        "session-secret-5",
        admin.token.as_str(),
    ];
    let lost = send_with_secrets(&gw).await;
    lost.assert_operation_problem(504, "outcome-unknown", "unknown");
    // A completed one alongside, so the state filter has something to leave out.
    assert_fresh_created(&write(gw.addr(), "/orders", Some("done-1"), ORDER).await);

    let list = admin.get("/admin/keys?state=unknown").await;
    assert_eq!(list.status, 200);
    let page = list.json();
    let items = page["items"].as_array().expect("items");
    assert_eq!(items.len(), 1, "{page}");
    let summary = &items[0];
    let fields = field_names(summary);
    assert_eq!(
        fields,
        BTreeSet::from([
            "id",
            "route",
            "key",
            "state",
            "attempts",
            "created_at",
            "updated_at"
        ]),
        "{summary}"
    );
    assert_eq!(summary["route"], "api");
    assert_eq!(summary["key"], "held-1");
    assert_eq!(summary["state"], "unknown");
    assert_eq!(summary["attempts"], 1);
    assert!(is_rfc3339_utc(&summary["created_at"]), "{summary}");
    assert!(is_rfc3339_utc(&summary["updated_at"]), "{summary}");
    assert_eq!(page["next_cursor"], Value::Null);
    let id = summary["id"].as_str().expect("id").to_owned();

    // Filters: state, exact key, route.
    let completed = admin.get_json("/admin/keys?state=completed").await;
    let keys: Vec<&Value> = completed["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| &i["key"])
        .collect();
    assert_eq!(keys, [&json!("done-1")], "{completed}");
    let partial = admin.get_json("/admin/keys?key=held").await;
    assert_eq!(partial["items"], json!([]), "key= matches exactly");
    // In the header's quoted form too, as a status lookup takes it (an
    // operator pasting the header's value found nothing).
    let quoted = admin.get_json("/admin/keys?key=%22done-1%22").await;
    assert_eq!(quoted["items"][0]["key"], "done-1", "{quoted}");
    let other_route = admin.get_json("/admin/keys?route=other").await;
    assert_eq!(other_route["items"], json!([]));

    let shown = admin.get(&format!("/admin/keys/{id}")).await;
    assert_eq!(shown.status, 200);
    let op = shown.json();
    assert_eq!(op["id"], id.as_str());
    assert_eq!(op["state"], "unknown");
    assert_eq!(op["key"], "held-1");
    assert!(
        op["evidence"].as_str().is_some_and(|e| !e.is_empty()),
        "{op}"
    );
    assert!(
        op["next_action"]
            .as_str()
            .is_some_and(|a| a.contains("held-1")),
        "{op}"
    );
    assert_eq!(op["request"]["method"], "POST");
    assert_eq!(
        op["request"]["path"], "/hold",
        "no parameter, no query: {op}"
    );
    assert_eq!(op["request"]["content_type"], "application/json");
    assert_eq!(op["request"]["body_size"], ORDER.len());
    assert_eq!(
        op["request"]["body_sha256"],
        hex::encode(Sha256::digest(ORDER))
    );
    assert!(op["request"].get("body").is_none(), "body not stored: {op}");
    assert_eq!(op["response"], Value::Null);
    assert_in_order(&kinds(&op), &["claimed", "sent", "timeout"]);
    for event in op["events"].as_array().expect("events") {
        assert!(is_rfc3339_utc(&event["at"]), "{event}");
    }

    // No credential anywhere the API answers.
    let stats = admin.get("/admin/stats").await;
    let metrics = send(admin.addr, "GET", "/metrics", &[], Bytes::new()).await;
    for (what, resp) in [
        ("list", &list),
        ("show", &shown),
        ("stats", &stats),
        ("metrics", &metrics),
    ] {
        let text = String::from_utf8_lossy(&resp.body);
        for secret in secrets {
            assert!(!text.contains(secret), "{what} shows {secret}: {text}");
        }
    }
    // Held: a retry is not sent.
    let retry = send_with_secrets(&gw).await;
    assert_held_unknown(&retry);
    assert_eq!(gw.upstream.writes(), 2);
}

// ------------------------------------------------------------ resolve

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolved_completed_with_a_response_replays_exactly_that_response() {
    let (gw, admin) = gateway("upstream_timeout = \"300ms\"").await;
    let id = unknown_operation(&gw, &admin, "res-1").await;
    let resolution = json!({
        "outcome": "completed",
        "operator": "ann",
        "note": "found it in the ledger",
        "reference": "T-1",
        "response": {
            "status": 201,
            "headers": {"x-order": "o-9", "x-tag": ["a", "b"]},
            "body": {"id": 1},
        },
    });
    let op = admin.resolved(&id, &resolution).await;
    assert_eq!(op["state"], "completed");
    assert_eq!(op["evidence"], "operator");
    assert_eq!(op["response"]["status"], 201);
    let events = op["events"].as_array().expect("events");
    let last = events.last().expect("an event");
    assert_eq!(last["kind"], "resolved", "{op}");
    assert_eq!(last["detail"]["operator"], "ann");
    assert_eq!(last["detail"]["reference"], "T-1");
    assert_eq!(last["detail"]["outcome"], "completed");

    let requests_before = gw.upstream.write_requests().len();
    for _ in 0..2 {
        let retry = write(gw.addr(), "/hold", Some("res-1"), ORDER).await;
        assert!(retry.is_replay(), "{retry:?}");
        assert_eq!(retry.status, 201);
        assert_eq!(&retry.body[..], br#"{"id":1}"#);
        assert_eq!(retry.header("x-order"), Some("o-9"));
        assert_eq!(retry.header_all("x-tag"), ["a", "b"]);
        assert_eq!(retry.header("content-type"), Some("application/json"));
    }
    assert_eq!(gw.upstream.write_requests().len(), requests_before);
    assert_eq!(gw.upstream.writes(), 1, "only the original write");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolved_completed_without_a_response_replays_who_resolved_it() {
    let (gw, admin) = gateway("upstream_timeout = \"300ms\"").await;
    let id = unknown_operation(&gw, &admin, "res-2").await;
    let resolution = json!({"outcome": "completed", "operator": "ann", "reference": "T-2"});
    admin.resolved(&id, &resolution).await;
    let retry = write(gw.addr(), "/hold", Some("res-2"), ORDER).await;
    assert!(retry.is_replay(), "{retry:?}");
    assert_eq!(retry.status, 200);
    assert_eq!(
        retry.json(),
        json!({"resolved_by": "ann", "reference": "T-2"})
    );
    assert_eq!(gw.upstream.write_requests().len(), 1);
}

/// A tool `result` is an MCP tool call's answer: an HTTP route's write
/// held unknown refuses it (409, the operation's route rules it out),
/// since its clients would be replayed a JSON-RPC message; nothing is
/// settled, and a `response` is then taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_routes_operation_refuses_a_tool_result() {
    let (gw, admin) = gateway("upstream_timeout = \"300ms\"").await;
    let id = unknown_operation(&gw, &admin, "res-tool").await;
    let tool = json!({"outcome": "completed", "operator": "ann",
                      "result": {"content": [{"type": "text", "text": "done"}], "isError": false}});
    let refused = admin
        .post(&format!("/admin/keys/{id}/resolve"), &tool.to_string())
        .await;
    let problem = refused.assert_problem(409, "wrong-answer-kind");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("takes a `response`")),
        "{problem}"
    );
    assert_eq!(
        admin.show(&id).await["state"],
        "unknown",
        "nothing resolved"
    );
    let http = json!({"outcome": "completed", "operator": "ann",
                      "response": {"status": 201, "body": "done"}});
    admin.resolved(&id, &http).await;
    let retry = write(gw.addr(), "/hold", Some("res-tool"), ORDER).await;
    assert!(retry.is_replay(), "{retry:?}");
    assert_eq!(retry.status, 201);
    assert_eq!(&retry.body[..], b"done");
    assert_eq!(gw.upstream.writes(), 1, "only the original write");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolution_status_may_be_any_integral_number_but_not_a_fraction() {
    let (gw, admin) = gateway("upstream_timeout = \"300ms\"").await;
    let id = unknown_operation(&gw, &admin, "res-float").await;
    // JSON Schema's `integer` is any number with a zero fraction; OpenAPI
    // clients (and fuzzers) send 276.0.
    let with_status = |status: &str| {
        format!(
            r#"{{"outcome":"completed","operator":"ann","response":{{"status":{status},"body":"ok"}}}}"#
        )
    };
    let refused = admin
        .post(&format!("/admin/keys/{id}/resolve"), &with_status("276.5"))
        .await;
    let problem = refused.assert_problem(400, "invalid-resolution");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("276.5") && d.contains("whole number")),
        "{problem}"
    );
    assert_eq!(
        admin.show(&id).await["state"],
        "unknown",
        "nothing resolved"
    );

    let resolved = admin
        .post(&format!("/admin/keys/{id}/resolve"), &with_status("276.0"))
        .await;
    assert_eq!(
        resolved.status,
        200,
        "{}",
        String::from_utf8_lossy(&resolved.body)
    );
    assert_eq!(resolved.json()["response"]["status"], 276);
    let retry = write(gw.addr(), "/hold", Some("res-float"), ORDER).await;
    assert!(retry.is_replay(), "{retry:?}");
    assert_eq!(retry.status, 276);
    assert_eq!(&retry.body[..], b"ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolution_whose_status_has_no_content_takes_no_body() {
    let (gw, admin) = gateway("upstream_timeout = \"300ms\"").await;
    let id = unknown_operation(&gw, &admin, "res-empty").await;
    // RFC 9110: 204 and 304 cannot carry content, a 205 must not; a
    // replay would send the status without the body.
    for status in [204, 205, 304] {
        let with_body = json!({
            "outcome": "completed",
            "operator": "ann",
            "response": {"status": status, "body": {"id": 1}},
        });
        let refused = admin.resolve(&id, &with_body).await;
        let problem = refused.assert_problem(400, "invalid-resolution");
        assert!(
            problem["detail"]
                .as_str()
                .is_some_and(|d| d.contains(&status.to_string()) && d.contains("no content")),
            "{problem}"
        );
        assert_eq!(admin.show(&id).await["state"], "unknown", "{status}");
    }

    let without = json!({
        "outcome": "completed",
        "operator": "ann",
        "response": {"status": 204, "headers": {"x-order": "o-9"}, "body": ""},
    });
    admin.resolved(&id, &without).await;
    let retry = write(gw.addr(), "/hold", Some("res-empty"), ORDER).await;
    assert!(retry.is_replay(), "{retry:?}");
    assert_eq!(retry.status, 204);
    assert!(retry.body.is_empty());
    assert_eq!(retry.header("x-order"), Some("o-9"));
    assert_eq!(gw.upstream.writes(), 1, "only the original write");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolution_keeps_to_its_routes_max_stored_response() {
    let (gw, admin) = gateway("upstream_timeout = \"300ms\"\nmax_stored_response = \"64\"").await;
    let id = unknown_operation(&gw, &admin, "res-large").await;
    // The store keeps no upstream answer over the route's bound; an
    // operator's is held to it too.
    let large = json!({
        "outcome": "completed",
        "operator": "ann",
        "response": {"status": 201, "body": "x".repeat(65)},
    });
    let refused = admin.resolve(&id, &large).await;
    let problem = refused.assert_problem(400, "invalid-resolution");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("max_stored_response") && d.contains("65")),
        "{problem}"
    );
    assert_eq!(admin.show(&id).await["state"], "unknown");

    let fits = json!({
        "outcome": "completed",
        "operator": "ann",
        "response": {"status": 201, "body": "x".repeat(64)},
    });
    admin.resolved(&id, &fits).await;
    let retry = write(gw.addr(), "/hold", Some("res-large"), ORDER).await;
    assert!(retry.is_replay(), "{retry:?}");
    assert_eq!(retry.body.len(), 64);
    assert_eq!(gw.upstream.writes(), 1, "only the original write");
}

/// While a held attempt may still land at the destination (the route's
/// `late_window` after it was last on its way), a destination that shows
/// nothing is no proof: `not_attempted` is refused 409
/// `attempt-may-still-land` with `Retry-After`, and the retry is held, not
/// sent a second time; `completed` is taken. Once the window is over,
/// `not_attempted` is taken and the retry is the next attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_attempted_waits_until_the_attempt_can_no_longer_land() {
    let (gw, admin) = gateway("upstream_timeout = \"300ms\"\nlate_window = \"3s\"").await;
    let id = unknown_operation(&gw, &admin, "res-early").await;
    let not_attempted = json!({"outcome": "not_attempted", "operator": "ann"});
    let refused = admin.resolve(&id, &not_attempted).await;
    let problem = refused.assert_problem(409, "attempt-may-still-land");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("late_window")),
        "{problem}"
    );
    let wait: u64 = refused
        .header("retry-after")
        .and_then(|s| s.parse().ok())
        .expect("Retry-After in seconds");
    assert!((1..=4).contains(&wait), "Retry-After: {wait}");
    let shown = admin.show(&id).await;
    assert_eq!(shown["state"], "unknown");
    assert!(
        shown["next_action"]
            .as_str()
            .is_some_and(|a| a.contains("may still land")),
        "{shown}"
    );
    let held = write(gw.addr(), "/hold", Some("res-early"), ORDER).await;
    held.assert_operation_problem(409, "outcome-unknown", "unknown");
    assert_eq!(gw.upstream.writes(), 1, "nothing sent a second time");

    eventually(
        "not_attempted taken once the late window is over",
        || async { (admin.resolve(&id, &not_attempted).await.status == 200).then_some(()) },
    )
    .await;
    assert_eq!(admin.show(&id).await["state"], "not_attempted");

    // `completed` needs no wait: it lets nothing through.
    let other = unknown_operation(&gw, &admin, "res-early-2").await;
    admin
        .resolved(&other, &json!({"outcome": "completed", "operator": "ann"}))
        .await;
}

/// A route or key left empty, as a form sends its blank fields and
/// operating.md spells the call, is not given: `route=` and `key=` filter
/// nothing out (they emptied the page). (An empty `cursor` stays refused:
/// `a_cursor_the_api_never_gave_is_refused`; `state` and `limit` by their
/// types.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_list_parameters_are_not_given() {
    let (gw, admin) = gateway("upstream_timeout = \"300ms\"").await;
    let id = unknown_operation(&gw, &admin, "blank-1").await;
    let page = admin
        .get_json("/admin/keys?state=unknown&route=&key=")
        .await;
    let ids: Vec<&str> = page["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|item| item["id"].as_str())
        .collect();
    assert_eq!(ids, [id.as_str()], "{page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolution_lengths_count_characters_not_bytes() {
    let (gw, admin) = gateway("upstream_timeout = \"300ms\"").await;
    let id = unknown_operation(&gw, &admin, "res-chars").await;
    let path = format!("/admin/keys/{id}/resolve");
    // JSON Schema's maxLength counts characters: 200 of them are a valid
    // operator, whatever their UTF-8 length; 201 are not.
    let too_long = json!({"outcome": "completed", "operator": "é".repeat(201)});
    admin
        .post(&path, &too_long.to_string())
        .await
        .assert_problem(400, "invalid-resolution");
    let at_the_limits = json!({
        "outcome": "completed",
        "operator": "é".repeat(200),
        "note": "ü".repeat(4000),
        "reference": "ß".repeat(400),
    });
    let resolved = admin.post(&path, &at_the_limits.to_string()).await;
    assert_eq!(
        resolved.status,
        200,
        "{}",
        String::from_utf8_lossy(&resolved.body)
    );
    assert_eq!(resolved.json()["state"], "completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolution_in_an_array_is_refused() {
    let (gw, admin) = gateway("upstream_timeout = \"300ms\"").await;
    let id = unknown_operation(&gw, &admin, "res-array").await;
    // The members in order, without their names, are not a resolution,
    // nor a response.
    for body in [
        r#"["not_attempted", "ann", null, null, null]"#,
        r#"{"outcome": "completed", "operator": "ann", "response": [201, {}, "ok"]}"#,
    ] {
        let refused = admin.post(&format!("/admin/keys/{id}/resolve"), body).await;
        refused.assert_problem(400, "invalid-resolution");
        assert_eq!(admin.show(&id).await["state"], "unknown", "{body}");
    }
}

/// A resolution names the attempt its operator checked: one decided on a
/// page that showed attempt 1, taken after a retry was let through and
/// lost again as attempt 2, is refused 409 `operation-changed` naming
/// attempt 2 (never checked: it may have landed), and nothing is let
/// through a third time; one naming attempt 2 is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolution_decided_on_an_earlier_attempt_is_refused() {
    let (gw, admin) = gateway(SETTLED_AT_ONCE).await;
    let id = unknown_operation(&gw, &admin, "stale-1").await;
    let on_attempt =
        |attempt: u32| json!({"outcome": "not_attempted", "operator": "ann", "attempt": attempt});
    admin.resolved(&id, &on_attempt(1)).await;
    let lost = write(gw.addr(), "/hold", Some("stale-1"), ORDER).await;
    lost.assert_operation_problem(504, "outcome-unknown", "unknown");
    assert_eq!(admin.show(&id).await["attempts"], 2);

    let stale = admin.resolve(&id, &on_attempt(1)).await;
    let problem = stale.assert_problem(409, "operation-changed");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("attempt 2")),
        "{problem}"
    );
    let held = write(gw.addr(), "/hold", Some("stale-1"), ORDER).await;
    held.assert_operation_problem(409, "outcome-unknown", "unknown");
    assert_eq!(gw.upstream.writes(), 2, "attempt 3 never sent");

    // 2.0 is the integer 2, as JSON Schema reads it.
    let whole = json!({"outcome": "not_attempted", "operator": "ann", "attempt": 2.0});
    admin.resolved(&id, &whole).await;
    assert_eq!(admin.show(&id).await["state"], "not_attempted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settled_and_missing_operations_are_not_resolvable() {
    let (gw, admin) = gateway("").await;
    assert_fresh_created(&write(gw.addr(), "/orders", Some("set-1"), ORDER).await);
    let id = admin.id_of("set-1").await;
    let refused = admin
        .resolve(&id, &json!({"outcome": "not_attempted", "operator": "ann"}))
        .await;
    refused.assert_problem(409, "not-resolvable");
    let op = admin.show(&id).await;
    assert_eq!(op["state"], "completed");
    assert_eq!(op["evidence"], "response");
    assert!(!kinds(&op).contains(&"resolved".to_owned()), "{op}");
    let replay = write(gw.addr(), "/orders", Some("set-1"), ORDER).await;
    assert!(replay.is_replay());

    let missing = admin
        .resolve(
            "00000000-0000-7000-8000-000000000000",
            &json!({"outcome": "completed", "operator": "ann"}),
        )
        .await;
    missing.assert_problem(404, "unknown-operation");
    let bad = admin
        .resolve(&id, &json!({"outcome": "maybe", "operator": "ann"}))
        .await;
    bad.assert_problem(400, "invalid-resolution");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_in_progress_operation_is_not_resolvable() {
    let (gw, admin) = gateway("").await;
    let addr = gw.addr();
    let in_flight =
        tokio::spawn(async move { write(addr, "/slow?ms=1500", Some("live-1"), ORDER).await });
    gw.upstream.wait_for_writes(1).await;
    let page = admin.get_json("/admin/keys?state=in_progress").await;
    assert_eq!(page["items"][0]["key"], "live-1", "{page}");
    let id = page["items"][0]["id"].as_str().expect("id").to_owned();
    // Either way: in flight at a live gateway, not a wait for the late
    // window (whose advice, "completed now", would be refused too).
    for resolution in [
        json!({"outcome": "completed", "operator": "ann", "response": {"status": 200}}),
        json!({"outcome": "not_attempted", "operator": "ann"}),
    ] {
        let refused = admin.resolve(&id, &resolution).await;
        let problem = refused.assert_problem(409, "not-resolvable");
        assert!(
            problem["detail"]
                .as_str()
                .is_some_and(|d| d.contains("in_progress")),
            "{problem}"
        );
    }
    let answered = tokio::time::timeout(WAIT, in_flight)
        .await
        .expect("write timed out")
        .expect("write task");
    assert_fresh_created(&answered);
    let op = admin.show(&id).await;
    assert_eq!(op["state"], "completed");
    assert_eq!(op["evidence"], "response", "{op}");
    assert!(!kinds(&op).contains(&"resolved".to_owned()), "{op}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_response_after_a_resolution_is_an_event_and_counted() {
    let (gw, admin) = gateway("upstream_timeout = \"300ms\"\nlate_window = \"10s\"").await;
    // Times out after 300 ms; the upstream answers at 1500 ms.
    let lost = write(gw.addr(), "/slow?ms=1500", Some("late-1"), ORDER).await;
    lost.assert_operation_problem(504, "outcome-unknown", "unknown");
    let id = admin.id_of("late-1").await;
    let resolution = json!({
        "outcome": "completed",
        "operator": "ann",
        "response": {"status": 200, "body": "settled by ann"},
    });
    admin.resolved(&id, &resolution).await;

    let op = eventually("a late response event", || async {
        let op = admin.show(&id).await;
        kinds(&op)
            .iter()
            .any(|k| k.starts_with("late"))
            .then_some(op)
    })
    .await;
    // The operator's decision stands.
    assert_eq!(op["state"], "completed", "{op}");
    assert_eq!(op["evidence"], "operator", "{op}");
    assert_eq!(op["response"]["status"], 200, "{op}");
    let retry = write(gw.addr(), "/slow?ms=1500", Some("late-1"), ORDER).await;
    assert!(retry.is_replay());
    assert_eq!(&retry.body[..], b"settled by ann");
    assert_eq!(gw.upstream.writes(), 1);

    // A late response that cannot settle its operation is
    // counted in idemgate_late_responses_total.
    let metrics = send(admin.addr, "GET", "/metrics", &[], Bytes::new()).await;
    let text = String::from_utf8_lossy(&metrics.body);
    assert_eq!(
        metric(&text, r#"idemgate_late_responses_total{route="api"}"#),
        Some(1.0),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolved_not_attempted_lets_the_retry_through_once() {
    let (gw, admin) = gateway(SETTLED_AT_ONCE).await;
    // The first write per key is refused with 504 before the upstream commits.
    let lost = write(gw.addr(), "/once/504", Some("na-1"), ORDER).await;
    assert_eq!(lost.status, 504);
    let id = admin.id_of("na-1").await;
    assert_eq!(admin.show(&id).await["state"], "unknown");
    assert_held_unknown(&write(gw.addr(), "/once/504", Some("na-1"), ORDER).await);

    let resolution =
        json!({"outcome": "not_attempted", "operator": "ann", "note": "not in the ledger"});
    let resolved = admin.resolved(&id, &resolution).await;
    assert_eq!(resolved["state"], "not_attempted");

    let retry = write(gw.addr(), "/once/504", Some("na-1"), ORDER).await;
    let fresh = assert_fresh_created(&retry);
    assert_eq!(gw.upstream.writes(), 1);
    assert_eq!(gw.upstream.write_requests().len(), 2);
    let op = admin.show(&id).await;
    assert_eq!(op["state"], "completed", "{op}");
    assert_eq!(op["attempts"], 2, "{op}");
    assert_in_order(&kinds(&op), &["claimed", "resolved", "claimed", "response"]);

    let again = write(gw.addr(), "/once/504", Some("na-1"), ORDER).await;
    assert_replay_of(&again, &retry);
    assert_eq!(again.json()["id"], fresh);
    assert_eq!(gw.upstream.write_requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolution_racing_client_retries_lets_at_most_one_through() {
    let (gw, admin) = gateway(SETTLED_AT_ONCE).await;
    let admin = std::sync::Arc::new(admin);
    let mut orders_seen = [0usize; 2];
    for round in 0..30 {
        let key = format!("race-{round}");
        let lost = write(gw.addr(), "/once/504", Some(&key), ORDER).await;
        assert_eq!(lost.status, 504, "round {round}");
        let id = admin.id_of(&key).await;
        let requests_before = gw.upstream.write_requests().len();

        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(3));
        let resolver = {
            let (admin, barrier, id) = (admin.clone(), barrier.clone(), id.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                admin
                    .resolve(&id, &json!({"outcome": "not_attempted", "operator": "ann"}))
                    .await
            })
        };
        let retries: Vec<_> = (0..2)
            .map(|_| {
                let (barrier, key, addr) = (barrier.clone(), key.clone(), gw.addr());
                tokio::spawn(async move {
                    barrier.wait().await;
                    write(addr, "/once/504", Some(&key), ORDER).await
                })
            })
            .collect();
        let resolved = resolver.await.expect("resolver");
        let mut answers = Vec::new();
        for retry in retries {
            answers.push(retry.await.expect("retry"));
        }
        // Nothing but the resolution can move an unknown operation.
        assert_eq!(
            resolved.status,
            200,
            "round {round}: {}",
            String::from_utf8_lossy(&resolved.body)
        );
        let forwarded: Vec<&Response> = answers
            .iter()
            .filter(|r| r.status == 201 && !r.is_replay())
            .collect();
        assert!(forwarded.len() <= 1, "round {round}: two retries forwarded");
        for answer in &answers {
            let problem = if answer.status == 409 {
                answer.json()["type"].as_str().unwrap_or("").to_owned()
            } else {
                String::new()
            };
            let ok = answer.status == 201
                || [
                    "urn:idemgate:problem:outcome-unknown",
                    "urn:idemgate:problem:request-in-progress",
                ]
                .contains(&problem.as_str());
            assert!(
                ok,
                "round {round}: {} {}",
                answer.status,
                String::from_utf8_lossy(&answer.body)
            );
            if answer.is_replay() {
                assert!(!forwarded.is_empty(), "round {round}: a replay of nothing");
                assert_replay_of(answer, forwarded[0]);
            }
        }
        let sent = gw.upstream.write_requests().len() - requests_before;
        assert_eq!(sent, forwarded.len(), "round {round}: upstream requests");
        let op = admin.show(&id).await;
        if forwarded.is_empty() {
            assert_eq!(op["state"], "not_attempted", "round {round}: {op}");
            assert_eq!(op["attempts"], 1, "round {round}");
            // The next retry is the one forwarded.
            assert_fresh_created(&write(gw.addr(), "/once/504", Some(&key), ORDER).await);
            orders_seen[0] += 1;
        } else {
            assert_eq!(op["state"], "completed", "round {round}: {op}");
            assert_eq!(op["attempts"], 2, "round {round}");
            orders_seen[1] += 1;
        }
        let after = write(gw.addr(), "/once/504", Some(&key), ORDER).await;
        assert!(after.is_replay(), "round {round}: {after:?}");
        // Per key: the refused first request and exactly one committed one.
        let for_key = gw
            .upstream
            .write_requests()
            .iter()
            .filter(|r| r.header("idempotency-key") == Some(key.as_str()))
            .count();
        assert_eq!(for_key, 2, "round {round}: upstream requests for {key}");
    }
    assert_eq!(gw.upstream.writes(), 30, "one committed write per round");
    // Both orders should show up over 30 rounds (not asserted: timing).
    eprintln!(
        "rounds where both racing retries were held: {}, where one was forwarded: {}",
        orders_seen[0], orders_seen[1]
    );
}

// ----------------------------------------------------- routes and stats

/// On the paused route a new write (`p-new`) is refused 503 and the
/// completed one (`p-done`) still replays as `done`.
async fn assert_paused(gw: &TestGateway, done: &Response) {
    write(gw.addr(), "/orders", Some("p-new"), ORDER)
        .await
        .assert_problem(503, "route-paused");
    let replay = write(gw.addr(), "/orders", Some("p-done"), ORDER).await;
    assert_replay_of(&replay, done);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_route_refuses_new_writes_replays_completed_and_stays_paused() {
    let (mut gw, admin) = gateway("").await;
    let done = write(gw.addr(), "/orders", Some("p-done"), ORDER).await;
    assert_fresh_created(&done);

    let paused = admin
        .post("/admin/routes/api/pause", r#"{"reason":"maintenance"}"#)
        .await;
    assert_eq!(paused.status, 200);
    assert_eq!(
        paused.json(),
        json!({"route": "api", "paused": true, "reason": "maintenance"})
    );
    admin
        .post("/admin/routes/nope/pause", "")
        .await
        .assert_problem(404, "no-route");

    assert_paused(&gw, &done).await;
    assert_eq!(gw.upstream.write_requests().len(), 1);
    assert_eq!(
        admin.get_json("/admin/stats").await["paused_routes"],
        json!(["api"])
    );

    // Stored: a new process on the same store is still paused.
    gw.restart().await;
    let admin = AdminApi {
        addr: gw.admin_addr(),
        token: admin.token.clone(),
    };
    assert_paused(&gw, &done).await;
    let stats = admin.get_json("/admin/stats").await;
    assert_eq!(stats["paused_routes"], json!(["api"]));
    assert_eq!(
        stats["routes"],
        json!([{"name": "api", "configured": true, "path_prefix": "/", "paused": true,
                "reason": "maintenance", "paused_by": "operator"}])
    );
    assert_eq!(gw.upstream.write_requests().len(), 1);

    let resumed = admin.post("/admin/routes/api/resume", "").await;
    assert_eq!(resumed.status, 200);
    assert_eq!(
        resumed.json(),
        json!({"route": "api", "paused": false, "reason": null})
    );
    assert_fresh_created(&write(gw.addr(), "/orders", Some("p-new"), ORDER).await);
    assert_eq!(gw.upstream.writes(), 2);
    assert_eq!(
        admin.get_json("/admin/stats").await["paused_routes"],
        json!([])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_body_other_than_a_reason_is_refused() {
    let (_gw, admin) = gateway("").await;
    // A misspelt member or a reason that is not text would otherwise be
    // dropped without a word, and the route paused for no stated reason.
    for body in [
        r#"{"": []}"#,
        r#"{"reson": "typo"}"#,
        r#"{"reason": 5}"#,
        r#"["maintenance"]"#,
        r#""maintenance""#,
        // Stored, shown and sent in every alert: bounded, one line.
        &format!(r#"{{"reason": "{}"}}"#, "r".repeat(401)),
        r#"{"reason": "line\nbreak"}"#,
        r#"{"reason": "esc\u001b[31m"}"#,
    ] {
        let refused = admin.post("/admin/routes/api/pause", body).await;
        refused.assert_problem(400, "invalid-request");
        assert_eq!(
            admin.get_json("/admin/stats").await["paused_routes"],
            json!([]),
            "{body} paused the route"
        );
    }
    for (body, reason) in [
        (r#"{"reason": null}"#, "paused by an operator"),
        (r#"{}"#, "paused by an operator"),
        (r#"{"reason": "maintenance"}"#, "maintenance"),
    ] {
        let paused = admin.post("/admin/routes/api/pause", body).await;
        assert_eq!(paused.status, 200, "{body}");
        assert_eq!(paused.json()["reason"], reason, "{body}");
    }
    // A resume has nowhere to keep a reason: refused, not dropped.
    admin
        .post("/admin/routes/api/resume", r#"{"reason": "all clear"}"#)
        .await
        .assert_problem(400, "invalid-request");
    for body in ["", "{}", r#"{"reason": null}"#] {
        let resumed = admin.post("/admin/routes/api/resume", body).await;
        assert_eq!(resumed.status, 200, "{body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_say_which_routes_the_latch_paused() {
    let (gw, admin) = gateway("pause_after_unknown = 1").await;
    let route = |stats: &Value| stats["routes"][0].clone();
    let before = admin.get_json("/admin/stats").await;
    assert_eq!(
        route(&before),
        json!({"name": "api", "configured": true, "path_prefix": "/", "paused": false,
               "reason": null, "paused_by": null})
    );
    let lost = write(gw.addr(), "/drop", Some("latch-1"), ORDER).await;
    lost.assert_operation_problem(502, "outcome-unknown", "unknown");
    let after = admin.get_json("/admin/stats").await;
    assert_eq!(route(&after)["paused"], true, "{after}");
    assert_eq!(route(&after)["paused_by"], "latch", "{after}");
    assert_eq!(
        route(&after)["reason"],
        "pause_after_unknown: 1 operations unknown"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_count_operations_by_state_and_route() {
    let (gw, admin) = gateway("upstream_timeout = \"300ms\"").await;
    let empty = admin.get_json("/admin/stats").await;
    let zeros = json!({"in_progress": 0, "completed": 0, "unknown": 0, "not_attempted": 0});
    assert_eq!(empty["operations"], zeros, "{empty}");
    assert_eq!(empty["by_route"], json!({}));
    assert_eq!(empty["oldest_unknown_age_seconds"], Value::Null);
    assert_eq!(empty["paused_routes"], json!([]));

    assert_fresh_created(&write(gw.addr(), "/orders", Some("s-1"), ORDER).await);
    assert_fresh_created(&write(gw.addr(), "/orders", Some("s-2"), ORDER).await);
    unknown_operation(&gw, &admin, "s-3").await;
    let released = write(gw.addr(), "/status/503", Some("s-4"), ORDER).await;
    assert_eq!(released.status, 503);

    let stats = admin.get_json("/admin/stats").await;
    let counts = json!({"in_progress": 0, "completed": 2, "unknown": 1, "not_attempted": 1});
    assert_eq!(stats["operations"], counts, "{stats}");
    assert_eq!(stats["by_route"], json!({ "api": counts }), "{stats}");
    let age = stats["oldest_unknown_age_seconds"]
        .as_f64()
        .expect("an unknown operation has an age");
    assert!((0.0..60.0).contains(&age), "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_walk_every_operation_once_newest_first() {
    let (gw, admin) = gateway("").await;
    let keys: Vec<String> = (0..5).map(|i| format!("page-{i}")).collect();
    for key in &keys {
        assert_fresh_created(&write(gw.addr(), "/orders", Some(key), ORDER).await);
    }
    let mut seen = Vec::new();
    let mut sizes = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..10 {
        let path = match &cursor {
            None => "/admin/keys?limit=2".to_owned(),
            Some(c) => format!("/admin/keys?limit=2&cursor={c}"),
        };
        let page = admin.get_json(&path).await;
        let items = page["items"].as_array().expect("items").clone();
        assert!(items.len() <= 2, "{page}");
        sizes.push(items.len());
        seen.extend(items);
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    let seen_keys: Vec<&str> = seen.iter().map(|i| i["key"].as_str().unwrap()).collect();
    let newest_first: Vec<&str> = keys.iter().rev().map(String::as_str).collect();
    assert_eq!(seen_keys, newest_first, "pages of sizes {sizes:?}");
    let ids: BTreeSet<&str> = seen.iter().map(|i| i["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), keys.len(), "ids repeat");
    let created: Vec<&str> = seen
        .iter()
        .map(|i| i["created_at"].as_str().unwrap())
        .collect();
    assert!(
        created.windows(2).all(|w| w[0] >= w[1]),
        "not newest first: {created:?}"
    );

    for bad in [
        "limit=0",
        "limit=501",
        "limit=x",
        "state=lost",
        "colour=red",
        // Given twice: which one a filter took would be a guess.
        "state=unknown&state=completed",
        "limit=1&limit=2",
    ] {
        admin
            .get(&format!("/admin/keys?{bad}"))
            .await
            .assert_problem(400, "invalid-request");
    }
    admin
        .get("/admin/keys/00000000-0000-7000-8000-000000000000")
        .await
        .assert_problem(404, "unknown-operation");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_the_api_never_gave_is_refused() {
    let (gw, admin) = gateway("").await;
    for key in ["cur-1", "cur-2"] {
        assert_fresh_created(&write(gw.addr(), "/orders", Some(key), ORDER).await);
    }
    let first = admin.get_json("/admin/keys?limit=1").await;
    let next = first["next_cursor"]
        .as_str()
        .expect("a next page")
        .to_owned();

    // Other UUID forms name the same id but are not the form it is given in.
    let braced = format!("%7B{next}%7D");
    let bare: String = next.chars().filter(|c| *c != '-').collect();
    for cursor in [
        "garbage",
        "",
        "1",
        "%27%20OR%201%3D1",
        &next[..next.len() - 1],
        &braced,
        &bare,
    ] {
        let path = format!("/admin/keys?cursor={cursor}");
        let resp = admin_call(admin.addr, "GET", &path, Some(&admin.token), "").await;
        resp.assert_problem_mentioning(400, "invalid-cursor", "next_cursor");
    }
    // The cursor given back, in either case, pages on.
    for cursor in [next.clone(), next.to_ascii_uppercase()] {
        let page = admin
            .get_json(&format!("/admin/keys?cursor={cursor}"))
            .await;
        let keys: Vec<&str> = page["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|i| i["key"].as_str().expect("key"))
            .collect();
        assert_eq!(keys, ["cur-1"], "{cursor}: {page}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_request_body_is_shown_only_when_the_route_stores_it() {
    let (gw, admin) = gateway("store_request_body = true").await;
    assert_fresh_created(&write(gw.addr(), "/orders", Some("body-1"), ORDER).await);
    let op = admin.show(&admin.id_of("body-1").await).await;
    assert_eq!(op["request"]["body"], ORDER, "{op}");
    assert_eq!(op["response"], json!({"status": 201, "body_stored": true}));
    // A plain write's timeline, whether its events were stored or are
    // proven by the row itself.
    assert_eq!(kinds(&op), ["claimed", "sent", "response"], "{op}");
    let events = op["events"].as_array().expect("events");
    assert_eq!(events[0]["detail"]["attempt"], 1, "{op}");
    assert_eq!(events[1]["detail"]["tries"], 1, "{op}");
    assert_eq!(events[1]["detail"]["bytes"], ORDER.len(), "{op}");
    assert_eq!(events[2]["detail"]["status"], 201, "{op}");
}

// ------------------------------------------------------- client lookup

/// `GET /.idemgate/operations/{key}` (`key` as it goes in the path) as
/// the client with `authorization`.
async fn lookup(gw: &TestGateway, key: &str, authorization: &str) -> Response {
    let path = format!("/.idemgate/operations/{key}");
    send(
        gw.addr(),
        "GET",
        &path,
        &[("authorization", authorization)],
        Bytes::new(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_look_up_only_their_own_operations() {
    let (gw, admin) = gateway("").await;
    assert_fresh_created(&write(gw.addr(), "/orders", Some("look-1"), ORDER).await);
    let id = admin.id_of("look-1").await;

    let mine = lookup(&gw, "look-1", ALICE).await;
    assert_eq!(mine.status, 200, "{}", String::from_utf8_lossy(&mine.body));
    assert!(!mine.is_replay());
    let found = mine.json();
    let fields = field_names(&found);
    assert_eq!(
        fields,
        BTreeSet::from(["operation_id", "route", "state", "attempts", "updated_at"]),
        "{found}"
    );
    assert_eq!(found["operation_id"], id.as_str());
    assert_eq!(found["route"], "api");
    assert_eq!(found["state"], "completed");
    assert_eq!(found["attempts"], 1);
    assert!(is_rfc3339_utc(&found["updated_at"]), "{found}");

    for (authorization, key) in [(BOB, "look-1"), (ALICE, "look-2")] {
        let other = lookup(&gw, key, authorization).await;
        other.assert_problem(404, "unknown-operation");
    }
    assert_eq!(
        gw.upstream.requests().len(),
        1,
        "lookups never reach the upstream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_answers_head_as_get_without_a_body() {
    let (gw, _admin) = gateway("").await;
    assert_fresh_created(&write(gw.addr(), "/orders", Some("head-1"), ORDER).await);
    let get = lookup(&gw, "head-1", ALICE).await;
    assert_eq!(get.status, 200);

    let head = |key: &'static str, authorization: &'static str| {
        let path = format!("/.idemgate/operations/{key}");
        let addr = gw.addr();
        async move {
            let headers = [("authorization", authorization)];
            send(addr, "HEAD", &path, &headers, Bytes::new()).await
        }
    };
    let found = head("head-1", ALICE).await;
    assert_eq!(found.status, 200, "{:?}", found.headers);
    assert!(found.body.is_empty());
    assert_eq!(found.header("content-type"), get.header("content-type"));
    assert_eq!(
        found.header("content-length"),
        Some(get.body.len().to_string().as_str())
    );
    // Another scope's key: 404 as for GET, no body either.
    let other = head("head-1", BOB).await;
    assert_eq!(other.status, 404);
    assert!(other.body.is_empty());
    assert_eq!(
        other.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(gw.upstream.requests().len(), 1, "lookups stay in idemgate");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_takes_the_key_in_either_header_form() {
    let (gw, admin) = gateway("").await;
    // Keys written as sf-strings: `k1`, and `a"b` with an escaped quote.
    assert_fresh_created(&write(gw.addr(), "/orders", Some(r#""k1""#), ORDER).await);
    assert_fresh_created(&write(gw.addr(), "/orders", Some(r#""a\"b""#), ORDER).await);
    let k1 = admin.id_of("k1").await;
    let escaped = admin.id_of("a%22b").await;

    // Every spelling the header accepts, percent-encoded in the path (or
    // not: a client may send the quotes as they are), names one operation.
    for (spelling, id) in [
        ("k1", &k1),
        ("%22k1%22", &k1),
        (r#""k1""#, &k1),
        ("a%22b", &escaped),
        ("%22a%5C%22b%22", &escaped),
    ] {
        let found = lookup(&gw, spelling, ALICE).await;
        assert_eq!(
            found.status,
            200,
            "{spelling}: {}",
            String::from_utf8_lossy(&found.body)
        );
        assert_eq!(found.json()["operation_id"], id.as_str(), "{spelling}");
    }
    // A malformed sf-string is refused, as the header would be.
    let malformed = lookup(&gw, "%22k1", ALICE).await;
    malformed.assert_problem(400, "invalid-key");
}

/// `GET /.idemgate/operations/{key}{query}` with `headers` beside
/// Alice's authorization.
async fn lookup_with(
    gw: &TestGateway,
    key: &str,
    query: &str,
    headers: &[(&str, &str)],
) -> Response {
    let path = format!("/.idemgate/operations/{key}{query}");
    let mut all = vec![("authorization", ALICE)];
    all.extend_from_slice(headers);
    send(gw.addr(), "GET", &path, &all, Bytes::new()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oasis_lookup_finds_the_write_of_the_client_id_it_sends() {
    let (gw, admin) = gateway(r#"profile = "oasis""#).await;
    let now = httpdate::fmt_http_date(std::time::SystemTime::now());
    let written = send(
        gw.addr(),
        "POST",
        "/orders",
        &[
            ("content-type", "application/json"),
            ("authorization", ALICE),
            ("repeatability-request-id", "req-1"),
            ("repeatability-first-sent", &now),
            ("repeatability-client-id", "client-a"),
        ],
        ORDER.to_owned(),
    )
    .await;
    assert_fresh_created(&written);
    let id = admin.id_of("req-1").await;

    // The client id is part of the write's scope, so of the lookup's.
    let mine = lookup_with(&gw, "req-1", "", &[("repeatability-client-id", "client-a")]).await;
    assert_eq!(mine.status, 200, "{}", String::from_utf8_lossy(&mine.body));
    assert_eq!(mine.json()["operation_id"], id.as_str());
    for other in [&[][..], &[("repeatability-client-id", "client-b")][..]] {
        lookup_with(&gw, "req-1", "", other)
            .await
            .assert_problem(404, "unknown-operation");
    }
    assert_eq!(gw.upstream.writes(), 1);
}

/// A Stripe write made for a connected account is found by a lookup that
/// names the account as the write did, in the same header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stripe_lookup_finds_the_write_of_the_account_it_names() {
    let (gw, admin) = gateway(r#"profile = "stripe""#).await;
    let written = send(
        gw.addr(),
        "POST",
        "/orders",
        &[
            ("content-type", "application/json"),
            ("authorization", ALICE),
            ("idempotency-key", "k-ctx"),
            ("stripe-context", "acct_1"),
        ],
        ORDER.to_owned(),
    )
    .await;
    assert_fresh_created(&written);
    let id = admin.id_of("k-ctx").await;

    let mine = lookup_with(&gw, "k-ctx", "", &[("stripe-context", "acct_1")]).await;
    assert_eq!(mine.status, 200, "{}", String::from_utf8_lossy(&mine.body));
    assert_eq!(mine.json()["operation_id"], id.as_str());
    let others = [
        &[][..],
        &[("stripe-context", "acct_2")][..],
        &[("stripe-account", "acct_1")][..],
    ];
    for other in others {
        lookup_with(&gw, "k-ctx", "", other)
            .await
            .assert_problem(404, "unknown-operation");
    }
    assert_eq!(gw.upstream.writes(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acp_lookup_finds_the_write_on_the_path_it_names() {
    let (gw, admin) = gateway(r#"profile = "acp""#).await;
    let written = write(
        gw.addr(),
        "/orders/cs_1/complete?via=agent",
        Some("k-acp"),
        ORDER,
    )
    .await;
    assert_fresh_created(&written);
    let id = admin.id_of("k-acp").await;

    // The endpoint is part of an ACP key's scope: named as the write's
    // path (without its query), in any spelling of its normal form.
    for query in [
        "?path=/orders/cs_1/complete",
        "?path=%2Forders%2Fcs_1%2F.%2Fcomplete",
        "?x=1&path=//orders/cs_1/complete",
    ] {
        let found = lookup_with(&gw, "k-acp", query, &[]).await;
        assert_eq!(
            found.status,
            200,
            "{query}: {}",
            String::from_utf8_lossy(&found.body)
        );
        assert_eq!(found.json()["operation_id"], id.as_str(), "{query}");
    }
    for query in [
        "",
        "?path=/orders/cs_2/complete",
        "?path=/orders/cs_1/complete?via=agent",
    ] {
        lookup_with(&gw, "k-acp", query, &[])
            .await
            .assert_problem(404, "unknown-operation");
    }
    lookup_with(&gw, "k-acp", "?path=orders", &[])
        .await
        .assert_problem(400, "invalid-path");
    assert_eq!(gw.upstream.writes(), 1);
}

// ------------------------------------------------------------- metrics

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_forwarded_and_replayed_writes() {
    let (gw, admin) = gateway("").await;
    let forwarded = r#"idemgate_requests_total{route="api",outcome="forwarded"}"#;
    let replayed = r#"idemgate_requests_total{route="api",outcome="replayed"}"#;
    let scrape = || async {
        let resp = send(admin.addr, "GET", "/metrics", &[], Bytes::new()).await;
        assert_eq!(resp.status, 200);
        assert!(
            resp.header("content-type")
                .is_some_and(|c| c.starts_with("application/openmetrics-text")),
            "{:?}",
            resp.header("content-type")
        );
        String::from_utf8(resp.body.to_vec()).expect("utf-8")
    };
    let before = scrape().await;
    assert_eq!(metric(&before, forwarded).unwrap_or(0.0), 0.0, "{before}");

    let first = write(gw.addr(), "/orders", Some("m-1"), ORDER).await;
    assert_fresh_created(&first);
    let after_write = scrape().await;
    assert_eq!(metric(&after_write, forwarded), Some(1.0), "{after_write}");
    assert_eq!(metric(&after_write, replayed).unwrap_or(0.0), 0.0);

    assert_replay_of(
        &write(gw.addr(), "/orders", Some("m-1"), ORDER).await,
        &first,
    );
    let after_replay = scrape().await;
    assert_eq!(
        metric(&after_replay, forwarded),
        Some(1.0),
        "{after_replay}"
    );
    assert_eq!(metric(&after_replay, replayed), Some(1.0), "{after_replay}");
    assert_eq!(
        metric(
            &after_replay,
            r#"idemgate_operations{route="api",state="completed"}"#
        ),
        Some(1.0),
        "{after_replay}"
    );

    let mut samples = 0;
    for line in after_replay.lines().filter(|l| !l.is_empty()) {
        match line.strip_prefix("# ") {
            Some(comment) => {
                let mut words = comment.split_whitespace();
                if matches!(words.next(), Some("HELP" | "TYPE" | "UNIT")) {
                    let name = words.next().unwrap_or("");
                    assert!(name.starts_with("idemgate_"), "{line}");
                }
            }
            None => {
                samples += 1;
                assert!(line.starts_with("idemgate_"), "{line}");
            }
        }
        assert!(!line.contains("alice-token"), "{line}");
    }
    assert!(samples > 0, "{after_replay}");
}

// ------------------------------------------------------------- OpenAPI

/// `{"$ref": "#/components/…"}` → the object it names.
fn deref<'a>(doc: &'a Value, value: &'a Value) -> &'a Value {
    match value.get("$ref").and_then(Value::as_str) {
        Some(reference) => {
            let pointer = reference.strip_prefix('#').expect("a local $ref");
            doc.pointer(pointer)
                .unwrap_or_else(|| panic!("dangling $ref {reference}"))
        }
        None => value,
    }
}

/// Asserts `resp` to `method path` has a status the document lists for
/// that operation, with a content type listed for that status.
fn assert_documented(doc: &Value, operation: &Value, method: &str, path: &str, resp: &Response) {
    let status = resp.status.as_u16().to_string();
    let responses = operation["responses"].as_object().expect("responses");
    let listed = responses.get(&status).unwrap_or_else(|| {
        panic!(
            "{method} {path} answered {status}, the document lists {:?}: {}",
            responses.keys().collect::<Vec<_>>(),
            String::from_utf8_lossy(&resp.body)
        )
    });
    let actual = resp.header("content-type").unwrap_or("");
    if let Some(content) = deref(doc, listed)["content"].as_object() {
        assert!(
            content.keys().any(|c| actual.starts_with(c.as_str())),
            "{method} {path} {status}: content-type {actual:?}, documented {:?}",
            content.keys().collect::<Vec<_>>()
        );
    }
    if actual.starts_with("application/problem+json") {
        let body = resp.json();
        let required = doc["components"]["schemas"]["Problem"]["required"]
            .as_array()
            .expect("the Problem schema lists its required members");
        for member in required {
            let member = member.as_str().expect("member name");
            assert!(
                body.get(member).is_some(),
                "{method} {path} {status}: no `{member}` in {body}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_in_the_openapi_document_answers_a_status_it_lists() {
    let (gw, admin) = gateway("upstream_timeout = \"300ms\"").await;
    let unknown_id = unknown_operation(&gw, &admin, "oa-1").await;
    assert_fresh_created(&write(gw.addr(), "/orders", Some("oa-2"), ORDER).await);
    let completed_id = admin.id_of("oa-2").await;

    let served = admin.get("/admin/openapi.json").await;
    assert_eq!(served.status, 200);
    let doc = served.json();
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().expect("paths");
    let mut called = 0;
    for (template, item) in paths {
        for (method, operation) in item.as_object().expect("path item") {
            let method = method.to_ascii_uppercase();
            if !["GET", "POST", "PUT", "PATCH", "DELETE"].contains(&method.as_str()) {
                continue;
            }
            let concrete = |id: &str| template.replace("{id}", id).replace("{name}", "api");
            let path = concrete(&unknown_id);
            assert!(!path.contains('{'), "unknown path parameter in {template}");
            let body = if template.ends_with("/resolve") {
                json!({"outcome": "completed", "operator": "ann", "response": {"status": 201, "body": {"id": 1}}})
                    .to_string()
            } else if template.ends_with("/pause") {
                r#"{"reason":"openapi test"}"#.to_owned()
            } else {
                String::new()
            };
            let resp = admin_call(admin.addr, &method, &path, Some(&admin.token), &body).await;
            assert!(
                resp.status.is_success(),
                "{method} {path}: {} {}",
                resp.status,
                String::from_utf8_lossy(&resp.body)
            );
            assert_documented(&doc, operation, &method, &path, &resp);
            called += 1;

            // Without a token: 401, listed, unless the operation needs none.
            let open = operation.get("security") == Some(&json!([]));
            let anonymous = admin_call(admin.addr, &method, &path, None, &body).await;
            if open {
                assert!(
                    anonymous.status.is_success(),
                    "{method} {path} needs no token"
                );
            } else {
                assert_unauthorized(&anonymous, &format!("{method} {path}"));
                let right = format!("Bearer {}", admin.token);
                let twice = [("authorization", right.as_str()); 2];
                let ambiguous = send(admin.addr, &method, &path, &twice, body.clone()).await;
                ambiguous.assert_problem(400, "ambiguous-credentials");
                assert_documented(&doc, operation, &method, &path, &ambiguous);
            }
            assert_documented(&doc, operation, &method, &path, &anonymous);

            // Failures the document promises to describe.
            if template.contains("{id}") {
                let missing = concrete("00000000-0000-7000-8000-000000000000");
                let resp =
                    admin_call(admin.addr, &method, &missing, Some(&admin.token), &body).await;
                resp.assert_problem(404, "unknown-operation");
                assert_documented(&doc, operation, &method, &missing, &resp);
            }
            if template.ends_with("/resolve") {
                let settled = concrete(&completed_id);
                let resp =
                    admin_call(admin.addr, &method, &settled, Some(&admin.token), &body).await;
                resp.assert_problem(409, "not-resolvable");
                assert_documented(&doc, operation, &method, &settled, &resp);
                let invalid = r#"{"outcome":"completed"}"#;
                let resp =
                    admin_call(admin.addr, &method, &path, Some(&admin.token), invalid).await;
                resp.assert_problem(400, "invalid-resolution");
                assert_documented(&doc, operation, &method, &path, &resp);
            }
            if template.contains("{name}") {
                let missing = template.replace("{name}", "no-such-route");
                let resp =
                    admin_call(admin.addr, &method, &missing, Some(&admin.token), &body).await;
                resp.assert_problem(404, "no-route");
                assert_documented(&doc, operation, &method, &missing, &resp);
            }
            if template == "/admin/keys" {
                for (bad, name) in [
                    ("/admin/keys?limit=0", "invalid-request"),
                    ("/admin/keys?cursor=garbage", "invalid-cursor"),
                ] {
                    let resp = admin_call(admin.addr, &method, bad, Some(&admin.token), "").await;
                    resp.assert_problem(400, name);
                    assert_documented(&doc, operation, &method, bad, &resp);
                }
            }
        }
    }
    assert!(called >= 10, "only {called} operations in the document");
    // The resolve call above settled the unknown operation for real.
    let retry = write(gw.addr(), "/hold", Some("oa-1"), ORDER).await;
    assert!(retry.is_replay(), "{retry:?}");
    assert_eq!(retry.status, 201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_admin_bodies_get_a_status_the_openapi_document_lists() {
    let (gw, admin) = gateway("upstream_timeout = \"300ms\"").await;
    let id = unknown_operation(&gw, &admin, "oa-bad").await;
    let doc: Value = serde_json::from_str(idemgate::admin::OPENAPI).expect("OpenAPI JSON");
    for (template, path) in [
        (
            "/admin/keys/{id}/resolve",
            format!("/admin/keys/{id}/resolve"),
        ),
        (
            "/admin/routes/{name}/pause",
            "/admin/routes/api/pause".to_owned(),
        ),
        (
            "/admin/routes/{name}/resume",
            "/admin/routes/api/resume".to_owned(),
        ),
    ] {
        let operation = &doc["paths"][template]["post"];
        assert!(operation.is_object(), "{template} not in the document");
        let resp = admin.post(&path, "this is not JSON").await;
        assert_eq!(
            resp.status,
            400,
            "{path}: {}",
            String::from_utf8_lossy(&resp.body)
        );
        assert_documented(&doc, operation, "POST", &path, &resp);
    }
}
