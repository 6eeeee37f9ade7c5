//! `idemgate keys list|show|resolve` (docs/operating.md, "Held work from the command line and the API"): the admin API from a
//! terminal, so an operator can find an `unknown` operation, read its
//! timeline and settle it without hand-writing HTTP requests.
//!
//! This module is only an HTTP client of a running gateway's admin
//! listener: it never opens the store, so it works against a remote
//! gateway and every resolution still goes through the one store
//! transaction that decides between it and a concurrent client retry.
//!
//! Invariants: the token is read from the environment variable named by
//! `--token-env` (never a flag, which would end up in shell history and
//! process listings), sent only in `Authorization`, and never printed;
//! `--json` prints the API's answer as it came (pretty-printed), and the
//! human form is rendered from that same answer; an API error
//! (problem+json) becomes [`KeysError::Api`], shown as
//! `<status> <name>: <detail>`. `--admin` is an [`AdminUrl`], which holds
//! no userinfo, so the URL every error names carries no password.

use std::fmt::Write as _;
use std::time::Duration;

use bytes::Bytes;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use http::{Method, Request, StatusCode};
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Map, Value, json};

use crate::admin_tls::{AdminTls, AdminTlsError};
use crate::admin_url::{AdminUrl, AdminUrlError};
use crate::cli::{Keys, KeysCommand, KeysList, KeysResolve};
use crate::terminal::printable;
use idemgate::admin::auth::{UnusableToken, token_fault};
use idemgate::http_client::{self, ExchangeError};
use idemgate::pipeline::key::url_component;

/// One admin call, connect to last byte; the admin API answers from the
/// store, so anything slower is a gateway in trouble, not a slow answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Larger than any page the API builds (500 summaries, or one operation
/// with its timeline and a stored request body).
const MAX_ANSWER: usize = 64 * 1024 * 1024;
/// Bytes of a non-problem error body worth showing.
const MAX_SHOWN_ERROR_BODY: usize = 300;
/// Why a `keys` command failed.
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    #[error(
        "the admin token variable {variable} is not set (or is empty): export the token the gateway reads from `server.admin_token_env`, or name another variable with --token-env"
    )]
    TokenUnset { variable: String },
    #[error("the admin token in {variable} cannot be sent in an HTTP header")]
    TokenInvalid { variable: String },
    #[error(transparent)]
    TokenUnusable(UnusableToken),
    #[error(transparent)]
    AdminUrl(#[from] AdminUrlError),
    #[error("cannot make a request of {url}: {reason}")]
    Request { url: String, reason: String },
    #[error("--header `{header}`: expected `name: value`")]
    Header { header: String },
    #[error("{flag} is not JSON: {source}")]
    NotJson {
        flag: &'static str,
        source: serde_json::Error,
    },
    #[error(transparent)]
    Tls(#[from] AdminTlsError),
    #[error("cannot reach the admin API at {url}: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("no answer from the admin API at {url} within {}s", REQUEST_TIMEOUT.as_secs())]
    Timeout { url: String },
    /// The API refused: its problem name (e.g. `not-resolvable`) and detail.
    #[error("{status} {name}: {detail}")]
    Api {
        status: u16,
        name: String,
        detail: String,
    },
    #[error(
        "the admin API answered {status} with something other than the JSON it documents: {reason}"
    )]
    Unexpected { status: u16, reason: String },
}

/// Runs one `keys` command; returns what to print on stdout.
pub async fn run(keys: &Keys) -> Result<String, KeysError> {
    // Local mistakes first: they need neither the token nor the gateway.
    let call = match &keys.command {
        KeysCommand::List(list) => (Method::GET, list_path(list), None),
        KeysCommand::Show { id } => (
            Method::GET,
            format!("/admin/keys/{}", url_component(id)),
            None,
        ),
        KeysCommand::Resolve(resolve) => (
            Method::POST,
            format!("/admin/keys/{}/resolve", url_component(&resolve.id)),
            Some(resolution(resolve)?),
        ),
    };
    let base = AdminUrl::parse(&keys.admin)?;
    let token = token_from_env(&keys.token_env)?;
    let api = AdminApi::new(base, &token, &keys.token_env, &keys.tls)?;
    let (method, path, body) = call;
    let answer = api.call(method, &path, body.as_ref()).await?;
    if keys.json {
        return Ok(pretty(&answer));
    }
    match &keys.command {
        KeysCommand::List(_) => render_list(&answer),
        KeysCommand::Show { .. } => render_operation(&answer),
        KeysCommand::Resolve(resolve) => {
            let block = render_operation(&answer)?;
            Ok(format!(
                "Resolved as {} by {}.\n\n{block}",
                resolve.outcome.as_str(),
                printable(&resolve.operator)
            ))
        }
    }
}

fn token_from_env(variable: &str) -> Result<String, KeysError> {
    let token = std::env::var(variable)
        .ok()
        .filter(|token| !token.is_empty())
        .ok_or_else(|| KeysError::TokenUnset {
            variable: variable.to_string(),
        })?;
    // The gateway refuses to start with such a token: say so here too,
    // rather than send one that can never match.
    match token_fault(&token) {
        None => Ok(token),
        Some(fault) => Err(KeysError::TokenUnusable(UnusableToken {
            variable: variable.to_string(),
            fault,
        })),
    }
}

/// `/admin/keys?…` with the filters given.
fn list_path(list: &KeysList) -> String {
    let limit = list.limit.map(|n| n.to_string());
    let params = [
        ("state", list.state.map(|s| s.as_str().to_string())),
        ("route", list.route.clone()),
        ("key", list.key.clone()),
        ("limit", limit),
        ("cursor", list.cursor.clone()),
    ];
    let query: Vec<String> = params
        .iter()
        .filter_map(|(name, value)| {
            value
                .as_ref()
                .map(|v| format!("{name}={}", url_component(v)))
        })
        .collect();
    if query.is_empty() {
        "/admin/keys".into()
    } else {
        format!("/admin/keys?{}", query.join("&"))
    }
}

/// The body of `POST /admin/keys/{id}/resolve` these flags describe. A
/// `response` is sent only with `--status` (clap enforces that the other
/// response flags need it), a tool `result` only with `--result` (never
/// with `--status`); the API judges the rest (e.g. a response on a
/// `not_attempted` resolution, a `result` for a route that is not `mcp`).
pub fn resolution(resolve: &KeysResolve) -> Result<Value, KeysError> {
    let mut body = json!({
        "outcome": resolve.outcome.as_str(),
        "operator": resolve.operator,
    });
    if let Some(note) = &resolve.note {
        body["note"] = json!(note);
    }
    if let Some(reference) = &resolve.reference {
        body["reference"] = json!(reference);
    }
    if let Some(attempt) = resolve.attempt {
        body["attempt"] = json!(attempt);
    }
    if let Some(result) = &resolve.result {
        body["result"] = serde_json::from_str(result).map_err(|source| KeysError::NotJson {
            flag: "--result",
            source,
        })?;
    }
    let Some(status) = resolve.status else {
        return Ok(body);
    };
    let mut headers = Map::new();
    for header in &resolve.headers {
        let (name, value) = parse_header(header)?;
        match headers.get_mut(&name) {
            None => {
                headers.insert(name, json!(value));
            }
            // A repeated name keeps every value, in order.
            Some(Value::Array(values)) => values.push(json!(value)),
            Some(first) => *first = json!([first.take(), value]),
        }
    }
    let mut response = json!({ "status": status });
    match (&resolve.body, &resolve.json_body) {
        (Some(text), _) => response["body"] = json!(text),
        (None, Some(text)) => {
            // Checked to be JSON, then sent as the text it is: the API
            // stores a string body verbatim, where a JSON value would be
            // stored as serde_json writes it again (`null` as no body, an
            // object's members sorted, a string unquoted).
            serde_json::from_str::<serde::de::IgnoredAny>(text).map_err(|source| {
                KeysError::NotJson {
                    flag: "--json-body",
                    source,
                }
            })?;
            if !headers.contains_key("content-type") {
                headers.insert("content-type".into(), json!("application/json"));
            }
            response["body"] = json!(text);
        }
        (None, None) => {}
    }
    if !headers.is_empty() {
        response["headers"] = Value::Object(headers);
    }
    body["response"] = response;
    Ok(body)
}

/// `name: value` → (lowercased name, trimmed value); the API checks the
/// name and value themselves.
fn parse_header(header: &str) -> Result<(String, String), KeysError> {
    let invalid = || KeysError::Header {
        header: header.to_string(),
    };
    let (name, value) = header.split_once(':').ok_or_else(invalid)?;
    let name = name.trim();
    if name.is_empty() || name.contains(char::is_whitespace) {
        return Err(invalid());
    }
    Ok((name.to_ascii_lowercase(), value.trim().to_string()))
}

/// A client of one admin listener.
struct AdminApi {
    base: AdminUrl,
    authorization: HeaderValue,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl AdminApi {
    fn new(
        base: AdminUrl,
        token: &str,
        variable: &str,
        tls: &AdminTls,
    ) -> Result<AdminApi, KeysError> {
        let mut authorization =
            HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                KeysError::TokenInvalid {
                    variable: variable.to_string(),
                }
            })?;
        authorization.set_sensitive(true);
        let client = tls.client(&base, CONNECT_TIMEOUT)?;
        Ok(AdminApi {
            base,
            authorization,
            client,
        })
    }

    /// One call; a 2xx JSON answer, or the API's problem as an error.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, KeysError> {
        let url = self.base.join(path);
        let mut request = Request::builder()
            .method(method)
            .uri(&url)
            .header(AUTHORIZATION, self.authorization.clone())
            .header(ACCEPT, "application/json");
        if body.is_some() {
            request = request.header(CONTENT_TYPE, "application/json");
        }
        let payload = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
        let request = request
            .body(Full::new(payload))
            .map_err(|e| KeysError::Request {
                url: url.clone(),
                reason: e.to_string(),
            })?;
        let (status, bytes) =
            http_client::exchange(&self.client, request, MAX_ANSWER, REQUEST_TIMEOUT)
                .await
                .map_err(|error| match error {
                    ExchangeError::Failed(reason) => KeysError::Unreachable {
                        url: url.clone(),
                        reason,
                    },
                    ExchangeError::Timeout => KeysError::Timeout { url: url.clone() },
                })?;
        if !status.is_success() {
            return Err(api_error(status, &bytes));
        }
        serde_json::from_slice(&bytes).map_err(|e| KeysError::Unexpected {
            status: status.as_u16(),
            reason: e.to_string(),
        })
    }
}

/// A non-2xx answer: the problem's name and detail, or, from something
/// that is not idemgate (a proxy in front of it), the status and the start
/// of the body.
fn api_error(status: StatusCode, body: &[u8]) -> KeysError {
    let problem = serde_json::from_slice::<Value>(body).ok();
    let problem_type = problem
        .as_ref()
        .and_then(|p| p.get("type"))
        .and_then(Value::as_str);
    if let (Some(problem), Some(problem_type)) = (&problem, problem_type) {
        let name = problem_type
            .strip_prefix("urn:idemgate:problem:")
            .unwrap_or(problem_type);
        let detail = ["detail", "title"]
            .iter()
            .find_map(|field| problem.get(*field).and_then(Value::as_str))
            .unwrap_or("");
        return KeysError::Api {
            status: status.as_u16(),
            name: printable(name),
            detail: printable(detail),
        };
    }
    let text = String::from_utf8_lossy(body);
    let mut detail: String = text.trim().chars().take(MAX_SHOWN_ERROR_BODY).collect();
    if detail.len() < text.trim().len() {
        detail.push('…');
    }
    KeysError::Api {
        status: status.as_u16(),
        name: status
            .canonical_reason()
            .unwrap_or("error")
            .to_ascii_lowercase()
            .replace(' ', "-"),
        detail: printable(&detail),
    }
}

fn pretty(value: &Value) -> String {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    text.push('\n');
    text
}

/// A field for a table cell or a block line: strings as they are, `-` for
/// a missing value, anything else as compact JSON.
fn field(value: &Value) -> String {
    match value {
        Value::String(text) => printable(text),
        Value::Null => "-".into(),
        other => printable(&other.to_string()),
    }
}

fn unexpected(reason: &str) -> KeysError {
    KeysError::Unexpected {
        status: 200,
        reason: reason.to_string(),
    }
}

/// `keys list`: an aligned table, newest first, and the cursor of the
/// next page.
fn render_list(page: &Value) -> Result<String, KeysError> {
    let items = page
        .get("items")
        .and_then(Value::as_array)
        .ok_or_else(|| unexpected("no `items` in the page"))?;
    let mut out = String::new();
    if items.is_empty() {
        out.push_str("No operations match.\n");
    } else {
        let mut rows =
            vec![["ID", "ROUTE", "KEY", "STATE", "ATTEMPTS", "UPDATED"].map(String::from)];
        rows.extend(items.iter().map(|item| {
            let mut row = ["id", "route", "key", "state", "attempts", "updated_at"]
                .map(|name| field(item.get(name).unwrap_or(&Value::Null)));
            // Listed first by the API: said so where the state is.
            if item.get("duplicated_at_destination") == Some(&Value::Bool(true)) {
                row[3].push_str(" (duplicated-at-destination)");
            }
            row
        }));
        out.push_str(&table(&rows));
    }
    if let Some(cursor) = page.get("next_cursor").and_then(Value::as_str) {
        let cursor = printable(cursor);
        let _ = writeln!(out, "\nnext cursor: {cursor}");
    }
    Ok(out)
}

/// Left-aligned columns two spaces apart, no trailing spaces.
fn table<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0; N];
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (cell, width) in row.iter().zip(widths) {
            let _ = write!(line, "{cell:<width$}  ");
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `keys show`: the operation as a block an operator reads top-down —
/// what it is, what proves its state, what to do, then its timeline.
fn render_operation(op: &Value) -> Result<String, KeysError> {
    if !op.is_object() || op.get("id").is_none() {
        return Err(unexpected("the answer is not an operation"));
    }
    let get = |name: &str| field(op.get(name).unwrap_or(&Value::Null));
    let mut lines: Vec<(&str, String)> = vec![
        ("operation", get("id")),
        (
            "route",
            format!("{} (profile {})", get("route"), get("profile")),
        ),
        ("key", get("key")),
        (
            "state",
            format!("{} (attempts: {})", get("state"), get("attempts")),
        ),
        ("created", get("created_at")),
        ("updated", get("updated_at")),
        ("evidence", get("evidence")),
    ];
    if op.get("superseded").and_then(Value::as_bool) == Some(true) {
        lines.push(("superseded", "yes: a newer operation took its key".into()));
    }
    lines.push(("next", get("next_action")));
    if let Some(destination) = op.get("destination_key") {
        let part = |name: &str| field(destination.get(name).unwrap_or(&Value::Null));
        lines.push((
            "destination key",
            format!("{} (sent in {})", part("value"), part("header")),
        ));
    }
    let request = op.get("request").unwrap_or(&Value::Null);
    let part = |name: &str| field(request.get(name).unwrap_or(&Value::Null));
    lines.push((
        "request",
        format!(
            "{} {}, content-type {}, {} bytes, sha256 {}",
            part("method"),
            part("path"),
            part("content_type"),
            part("body_size"),
            part("body_sha256"),
        ),
    ));
    if let Some(body) = request.get("body") {
        lines.push(("body", field(body)));
    } else if let Some(bytes) = request.get("body_base64") {
        lines.push(("body", format!("(not UTF-8, in base64) {}", field(bytes))));
    }
    let response = match op.get("response") {
        Some(Value::Object(response)) => {
            let status = field(response.get("status").unwrap_or(&Value::Null));
            match response.get("body_stored").and_then(Value::as_bool) {
                Some(false) => format!("{status} (body not stored: too large)"),
                _ => status,
            }
        }
        _ => "none".into(),
    };
    lines.push(("response", response));
    let width = lines
        .iter()
        .map(|(label, _)| label.len())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for (label, value) in &lines {
        let _ = writeln!(out, "{label:<width$}  {value}");
    }
    out.push_str("timeline\n");
    let events = op
        .get("events")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let rows: Vec<[String; 3]> = events
        .iter()
        .map(|event| {
            let detail = match event.get("detail") {
                None | Some(Value::Null) => String::new(),
                Some(Value::Object(map)) if map.is_empty() => String::new(),
                Some(detail) if event.get("kind") == Some(&Value::from("probe")) => {
                    printable(&probe_line(detail))
                }
                Some(detail) => printable(&detail.to_string()),
            };
            [
                field(event.get("at").unwrap_or(&Value::Null)),
                field(event.get("kind").unwrap_or(&Value::Null)),
                detail,
            ]
        })
        .collect();
    if rows.is_empty() {
        out.push_str("  (no events)\n");
    }
    for line in table(&rows).lines() {
        let _ = writeln!(out, "  {line}");
    }
    Ok(out)
}

/// A probe's question as the timeline names it (its `url`) made a line's
/// start: `GET URL`, or an MCP probe's `tools/call NAME` as it is (a POST).
pub(crate) fn probe_question(url: &str) -> String {
    if url.starts_with("tools/call ") {
        url.to_string()
    } else {
        format!("GET {url}")
    }
}

/// A probe's timeline entry as a line: each question and its answer, and
/// the verdict (`GET URL → 404; confirm GET URL → 200 [1], not absent →
/// undetermined (reason)`), after how many probes it stands for when it is
/// the latest of a run (`7 probes after the one above, the latest: …`);
/// an entry of another shape as its JSON.
fn probe_line(detail: &Value) -> String {
    let Some(verdict) = detail.get("verdict").and_then(Value::as_str) else {
        return detail.to_string();
    };
    let run = match detail.get("probes").and_then(Value::as_u64) {
        Some(n) if n > 1 => format!("{n} probes after the one above, the latest: "),
        _ => String::new(),
    };
    let answer = |asked: &Value| {
        let question = probe_question(&field(asked.get("url").unwrap_or(&Value::Null)));
        let said = match asked.get("error").and_then(Value::as_str) {
            Some(error) => format!("no answer ({error})"),
            None => field(asked.get("status").unwrap_or(&Value::Null)),
        };
        match asked.get("count").and_then(Value::as_u64) {
            Some(count) => format!("{question} → {said} [{count}]"),
            None => format!("{question} → {said}"),
        }
    };
    let mut line = run + &answer(detail);
    if let Some(confirm) = detail.get("confirm").filter(|c| c.is_object()) {
        let agrees = confirm.get("absent").and_then(Value::as_bool) == Some(true);
        let said = if agrees { "absent" } else { "not absent" };
        line.push_str(&format!("; confirm {}, {said}", answer(confirm)));
    }
    line.push_str(&format!(" → {verdict}"));
    if let Some(reason) = detail.get("reason").and_then(Value::as_str) {
        line.push_str(&format!(" ({reason})"));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::ResolveOutcome;

    #[test]
    fn a_probe_shows_its_questions_answers_and_verdict() {
        let detail = json!({
            "url": "http://api/lookup?key=k", "status": 404, "count": null, "error": null,
            "matched": false, "verdict": "undetermined",
            "reason": "the confirm request does not say absent",
            "confirm": {"url": "http://api/records?key=k", "status": 200, "count": null,
                        "error": null, "absent": false},
        });
        assert_eq!(
            probe_line(&detail),
            "GET http://api/lookup?key=k → 404; confirm GET http://api/records?key=k → 200, not absent → undetermined (the confirm request does not say absent)"
        );
        let timed_out = json!({"url": "tools/call find", "status": null, "error": "no answer within 1s",
                               "count": null, "verdict": "undetermined"});
        assert_eq!(
            probe_line(&timed_out),
            "tools/call find → no answer (no answer within 1s) → undetermined"
        );
        let latest = json!({"url": "http://api/lookup?key=k", "status": 404, "count": null,
                            "error": null, "verdict": "undetermined", "probes": 7});
        assert_eq!(
            probe_line(&latest),
            "7 probes after the one above, the latest: GET http://api/lookup?key=k → 404 → undetermined"
        );
    }

    fn resolve(status: Option<u16>) -> KeysResolve {
        KeysResolve {
            id: "op-1".into(),
            outcome: ResolveOutcome::Completed,
            operator: "ann".into(),
            note: None,
            reference: Some("T-1".into()),
            attempt: None,
            status,
            headers: Vec::new(),
            body: None,
            json_body: None,
            result: None,
        }
    }

    #[test]
    fn a_tool_result_is_sent_as_the_result() {
        let mut r = resolve(None);
        r.result = Some(r#"{"content":[],"structuredContent":{"id":4},"isError":false}"#.into());
        let body = resolution(&r).unwrap();
        assert_eq!(
            body["result"],
            json!({"content": [], "structuredContent": {"id": 4}, "isError": false})
        );
        assert!(body.get("response").is_none(), "{body}");
    }

    #[test]
    fn without_a_status_a_resolution_sends_no_response() {
        let body = resolution(&resolve(None)).unwrap();
        assert_eq!(
            body,
            json!({"outcome": "completed", "operator": "ann", "reference": "T-1"})
        );
    }

    #[test]
    fn an_attempt_is_sent_as_checked() {
        let mut r = resolve(None);
        r.attempt = Some(2);
        assert_eq!(resolution(&r).unwrap()["attempt"], 2);
    }

    #[test]
    fn response_flags_build_the_stored_response() {
        let mut r = resolve(Some(201));
        r.headers = vec![
            "X-Tag: a".into(),
            "x-tag:b".into(),
            "Location:  /orders/1 ".into(),
        ];
        r.json_body = Some(r#"{"id":1}"#.into());
        let body = resolution(&r).unwrap();
        assert_eq!(
            body["response"],
            json!({
                "status": 201,
                "headers": {
                    "x-tag": ["a", "b"],
                    "location": "/orders/1",
                    "content-type": "application/json",
                },
                "body": r#"{"id":1}"#,
            })
        );
        r.json_body = None;
        r.body = Some("plain text".into());
        assert_eq!(resolution(&r).unwrap()["response"]["body"], "plain text");
        // JSON is sent as the text typed, so stored as typed: a string
        // keeps its quotes, `null` is four letters, members keep their
        // order and a large number its digits.
        r.body = None;
        for typed in [r#""ok""#, "null", r#"{"b":1,"a":12345678901234567890}"#] {
            r.json_body = Some(typed.into());
            let response = &resolution(&r).unwrap()["response"];
            assert_eq!(response["body"], typed);
            assert_eq!(response["headers"]["content-type"], "application/json");
        }
    }

    #[test]
    fn bad_local_input_is_refused_before_any_call() {
        let mut r = resolve(Some(200));
        r.headers = vec!["no colon".into()];
        assert!(matches!(resolution(&r), Err(KeysError::Header { .. })));
        r.headers = vec!["bad name: v".into()];
        assert!(matches!(resolution(&r), Err(KeysError::Header { .. })));
        r.headers = Vec::new();
        r.json_body = Some("{oops".into());
        assert!(matches!(
            resolution(&r),
            Err(KeysError::NotJson {
                flag: "--json-body",
                ..
            })
        ));
        let mut r = resolve(None);
        r.result = Some("{oops".into());
        assert!(matches!(
            resolution(&r),
            Err(KeysError::NotJson {
                flag: "--result",
                ..
            })
        ));
    }

    #[test]
    fn list_filters_are_encoded() {
        let list = KeysList {
            state: Some(crate::cli::OperationState::NotAttempted),
            route: None,
            key: Some("a+b c&d".into()),
            limit: Some(2),
            cursor: None,
        };
        assert_eq!(
            list_path(&list),
            "/admin/keys?state=not_attempted&key=a%2Bb%20c%26d&limit=2"
        );
    }

    #[test]
    fn problems_become_status_name_and_detail() {
        let body = br#"{"type":"urn:idemgate:problem:not-resolvable","title":"Not resolvable","status":409,"detail":"operation x is completed"}"#;
        let error = api_error(StatusCode::CONFLICT, body);
        assert_eq!(
            error.to_string(),
            "409 not-resolvable: operation x is completed"
        );
        let error = api_error(StatusCode::BAD_GATEWAY, b"<html>upstream down</html>");
        assert_eq!(
            error.to_string(),
            "502 bad-gateway: <html>upstream down</html>"
        );
    }

    #[test]
    fn a_page_is_an_aligned_table_with_its_cursor() {
        let page = json!({
            "items": [
                {"id": "op-2", "route": "orders", "key": "k-22", "state": "unknown",
                 "attempts": 1, "updated_at": "2026-01-01T00:00:02.000Z"},
                {"id": "op-1", "route": "api", "key": "k\u{1b}[2J", "state": "completed",
                 "attempts": 12, "updated_at": "2026-01-01T00:00:01.000Z"},
            ],
            "next_cursor": "op-1",
        });
        let text = render_list(&page).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "ID    ROUTE   KEY         STATE      ATTEMPTS  UPDATED"
        );
        assert_eq!(
            lines[1],
            "op-2  orders  k-22        unknown    1         2026-01-01T00:00:02.000Z"
        );
        assert!(lines[2].starts_with(r"op-1  api     k\u{1b}[2J  completed  12"));
        assert!(text.contains("next cursor: op-1"), "{text}");
        assert!(!text.contains('\u{1b}'));
        let duplicated = json!({"items": [
            {"id": "op-3", "route": "orders", "key": "k-3", "state": "unknown", "attempts": 1,
             "created_at": "2026-01-01T00:00:00.000Z", "updated_at": "2026-01-01T00:00:00.000Z",
             "duplicated_at_destination": true},
        ], "next_cursor": null});
        assert!(
            render_list(&duplicated)
                .unwrap()
                .contains("op-3  orders  k-3  unknown (duplicated-at-destination)  1")
        );
        let empty = render_list(&json!({"items": [], "next_cursor": null})).unwrap();
        assert_eq!(empty, "No operations match.\n");
    }

    #[test]
    fn an_operation_is_a_block_with_its_timeline() {
        let op = json!({
            "id": "op-1", "route": "api", "key": "k-1", "state": "unknown", "attempts": 1,
            "created_at": "2026-01-01T00:00:00.000Z", "updated_at": "2026-01-01T00:00:01.000Z",
            "evidence": "timeout", "next_action": "Check the destination.", "superseded": false,
            "request": {"method": "POST", "path": "/orders", "content_type": "application/json",
                        "body_size": 12, "body_sha256": "ab12"},
            "response": null,
            "events": [
                {"at": "2026-01-01T00:00:00.000Z", "kind": "claimed", "detail": {"attempt": 1}},
                {"at": "2026-01-01T00:00:00.100Z", "kind": "sent", "detail": {}},
                {"at": "2026-01-01T00:00:01.000Z", "kind": "timeout", "detail": {"after_ms": 300}},
            ],
        });
        let text = render_operation(&op).unwrap();
        for line in [
            "operation  op-1",
            "state      unknown (attempts: 1)",
            "evidence   timeout",
            "next       Check the destination.",
            "request    POST /orders, content-type application/json, 12 bytes, sha256 ab12",
            "response   none",
            "timeline",
            r#"  2026-01-01T00:00:00.000Z  claimed  {"attempt":1}"#,
            "  2026-01-01T00:00:00.100Z  sent",
            r#"  2026-01-01T00:00:01.000Z  timeout  {"after_ms":300}"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} not in:\n{text}");
        }
        assert!(render_operation(&json!({"items": []})).is_err());
        assert!(!text.contains("destination key"));
        let mut keyed = op.clone();
        keyed["destination_key"] = json!({"header": "idempotency-key", "value": "op-1"});
        let text = render_operation(&keyed).unwrap();
        assert!(
            text.lines().any(|l| l.starts_with("destination key")
                && l.ends_with("op-1 (sent in idempotency-key)")),
            "{text}"
        );
    }
}
