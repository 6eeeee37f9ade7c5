//! `/admin/keys`: finding held operations, reading their timeline, and an
//! operator's resolution.
//!
//! Invariants: what is shown is never a credential (scopes are not shown;
//! the request's query string is not shown, since automations put API keys
//! there, nor its segments' `;parameters`, where session ids go; the
//! request body only when the route stores it), and a resolution
//! is one store transaction that a concurrent client retry cannot interleave
//! with.

use std::time::Duration;

use http::header::{HeaderName, HeaderValue};
use http::{Response, StatusCode};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use super::{Admin, AdminError, json_response};
use crate::body::ProxyBody;
use crate::config::Route;
use crate::pipeline::key::IdempotencyKey;
use crate::pipeline::mcp::answer::{self, Proof};
use crate::pipeline::reconcile;
use crate::profile::Profile;
use idemgate_model::clock::{self, rfc3339};
use idemgate_model::operation::{Event, Operation, State, StoredResponse};
use idemgate_store::{DUPLICATED, Decision, ListFilter, Resolved, StoredEvent, Summary};

const DEFAULT_LIMIT: u32 = 50;
const MAX_LIMIT: u32 = 500;

/// `GET /admin/keys?state=&route=&key=&limit=&cursor=`. A `route` or
/// `key` given empty is not given, as a form sends the fields left blank:
/// no route or key is empty, so `route=` filters nothing out rather than
/// everything. The others are refused empty, as the OpenAPI document's
/// types say: an empty `cursor` most of all, since a loop that sent the
/// last page's `next_cursor` (null) as empty would start over for ever.
pub async fn list(admin: &Admin, query: Option<&str>) -> Result<Response<ProxyBody>, AdminError> {
    let mut filter = ListFilter {
        limit: DEFAULT_LIMIT,
        ..ListFilter::default()
    };
    let given = form_pairs(query.unwrap_or(""))?;
    // One value each: which of two a filter took would be a guess.
    if let Some((name, _)) = given
        .iter()
        .enumerate()
        .find(|(i, (name, _))| given[..*i].iter().any(|(earlier, _)| earlier == name))
        .map(|(_, pair)| pair)
    {
        return Err(AdminError::BadRequest(format!(
            "parameter `{name}` given twice: give it once"
        )));
    }
    let blank = |(name, value): &(String, String)| {
        value.is_empty() && matches!(name.as_str(), "route" | "key")
    };
    for (name, value) in given.into_iter().filter(|pair| !blank(pair)) {
        match name.as_str() {
            "state" => {
                filter.state = Some(State::parse(&value).map_err(|_| {
                    AdminError::BadRequest(format!(
                        "state `{value}`: expected in_progress, completed, unknown or not_attempted"
                    ))
                })?)
            }
            "route" => filter.route = Some(value),
            "key" => filter.key = Some(bare_key(value)?),
            "cursor" => filter.before = Some(cursor(&value)?),
            "limit" => {
                filter.limit = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_LIMIT).contains(n))
                    .ok_or_else(|| {
                        AdminError::BadRequest(format!(
                            "limit `{value}`: expected 1 to {MAX_LIMIT}"
                        ))
                    })?
            }
            other => {
                return Err(AdminError::BadRequest(format!(
                    "unknown parameter `{other}`"
                )));
            }
        }
    }
    let mut page = admin.store.list(&filter).await?;
    let next_cursor = (page.len() == filter.limit as usize)
        .then(|| page.last().map(|s| s.id.clone()))
        .flatten();
    let first = duplicated_first(admin, &filter, &mut page).await?;
    let items: Vec<Value> = first.into_iter().chain(page.iter().map(summary)).collect();
    Ok(json_response(
        StatusCode::OK,
        &json!({ "items": items, "next_cursor": next_cursor }),
    ))
}

/// A `key` filter in either form the header accepts, as a status lookup
/// takes it: an sf-string `"…"` is its key (no stored key starts with
/// `"`, so it could match none); anything else as written.
fn bare_key(value: String) -> Result<String, AdminError> {
    if !value.starts_with('"') {
        return Ok(value);
    }
    IdempotencyKey::parse(&value)
        .map(|key| key.as_str().to_string())
        .map_err(|error| AdminError::BadRequest(format!("key `{value}`: {error}")))
}

/// The held list puts the operations a probe found more than once at the
/// destination first: on a list of `unknown` operations (not by key), they
/// lead its first page, marked `duplicated_at_destination`, and are taken
/// out of every page, so each is listed once.
async fn duplicated_first(
    admin: &Admin,
    filter: &ListFilter,
    page: &mut Vec<Summary>,
) -> Result<Vec<Value>, AdminError> {
    if filter.state != Some(State::Unknown) || filter.key.is_some() {
        return Ok(Vec::new());
    }
    let duplicated = admin
        .store
        .duplicated(filter.route.as_deref(), MAX_LIMIT)
        .await?;
    page.retain(|s| !duplicated.iter().any(|d| d.id == s.id));
    if filter.before.is_some() {
        return Ok(Vec::new());
    }
    Ok(duplicated
        .iter()
        .map(|s| {
            let mut item = summary(s);
            item["duplicated_at_destination"] = json!(true);
            item
        })
        .collect())
}

/// The operation id a `next_cursor` names, in the form ids are stored in.
/// Anything else would page from an arbitrary point of the id order (or
/// past every id: an empty page) and look like a true answer. Only the
/// hyphenated form (36 characters, either case) is one: the braced, URN and
/// bare-hex forms `uuid` also parses are not the OpenAPI `format: uuid`.
fn cursor(value: &str) -> Result<String, AdminError> {
    uuid::Uuid::try_parse(value)
        .ok()
        .filter(|_| value.len() == 36)
        .map(|id| id.hyphenated().to_string())
        .ok_or(AdminError::InvalidCursor)
}

/// `a=1&b=x%20y` as decoded pairs.
/// Until when (ms, the wall clock's `now` read) a held write's exchange
/// may still land: by the stored times, or longer by this process's
/// monotonic clock if it sent the exchange and the wall clock was stepped
/// forward since (`pipeline::landing`).
fn may_land_until(
    admin: &Admin,
    operation: &Operation,
    events: &[StoredEvent],
    route: &Route,
    now: i64,
) -> i64 {
    let stored = reconcile::may_land_until(operation, events, route);
    match admin.proxy.may_still_land(&operation.id) {
        // Over by the wall clock, not by the monotonic one: it was stepped.
        Some(left) if now >= stored => now.saturating_add(clock::millis(left)),
        _ => stored,
    }
}

fn form_pairs(query: &str) -> Result<Vec<(String, String)>, AdminError> {
    let decode = |text: &str| {
        percent_encoding::percent_decode_str(&text.replace('+', " "))
            .decode_utf8()
            .map(|s| s.into_owned())
            .map_err(|_| AdminError::BadRequest("the query is not UTF-8".into()))
    };
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            Ok((decode(name)?, decode(value)?))
        })
        .collect()
}

fn summary(s: &Summary) -> Value {
    json!({
        "id": s.id,
        "route": s.route,
        "key": s.key,
        "state": s.state.as_str(),
        "attempts": s.attempt,
        "created_at": rfc3339(s.created_at),
        "updated_at": rfc3339(s.updated_at),
    })
}

/// `GET /admin/keys/{id}`; with `?body=omit`, without the stored request
/// body (what the console's list asks: up to `max_body` each, escaped).
pub async fn show(
    admin: &Admin,
    id: &str,
    query: Option<&str>,
) -> Result<Response<ProxyBody>, AdminError> {
    let with_body = match form_pairs(query.unwrap_or(""))?.as_slice() {
        [] => true,
        [(name, value)] if name == "body" && value == "omit" => false,
        _ => {
            return Err(AdminError::BadRequest(
                "the only parameter is `body=omit`".into(),
            ));
        }
    };
    let (mut operation, events) = admin
        .store
        .get(id)
        .await?
        .ok_or(AdminError::NotFound("operation"))?;
    if !with_body {
        operation.request.body = None;
    }
    let route = admin
        .proxy
        .routes()
        .find(|route| route.name == operation.route);
    let destination = route.and_then(|route| route.destination_key.as_ref());
    let mut shown = detail(&operation, &events);
    // What a resolution of it takes: an MCP route's a tool `result`, the
    // others' an HTTP `response` (null: its route is no longer configured).
    shown["profile"] = json!(route.map(|route| route.profile.name()));
    if let Some(route) = route
        && operation.state == State::Unknown
        && operation.evidence != DUPLICATED
    {
        let held = Held::of(route.profile);
        let now = admin.clock.now_millis();
        let until = may_land_until(admin, &operation, &events, route, now);
        shown["next_action"] = json!(if now < until {
            format!(
                "Attempt {} may still land at the destination until {} (the route's late_window): until then a destination that shows nothing is no proof, and only a completed resolution is taken. Then check the destination for key `{}`: if the operation happened, resolve it as completed (optionally with {}); if it did not, as not_attempted so the client's next retry is forwarded. Until then {}.",
                operation.attempt,
                rfc3339(until),
                operation.key,
                held.completed_with,
                held.retries
            )
        } else {
            unknown_action(&operation.key, held)
        });
    }
    if let Some(destination) = destination {
        // The operation's id, on the header its route sends it in
        // (docs/requests.md, "A destination key").
        shown["destination_key"] = json!({
            "header": destination.header.as_str(),
            "value": operation.id,
        });
    }
    Ok(json_response(StatusCode::OK, &shown))
}

/// The operation as an operator reads it.
pub fn detail(op: &Operation, events: &[StoredEvent]) -> Value {
    let mut value = summary(&Summary {
        id: op.id.clone(),
        route: op.route.clone(),
        key: op.key.clone(),
        state: op.state,
        attempt: op.attempt,
        created_at: op.created_at,
        updated_at: op.updated_at,
    });
    let request = &op.request;
    let path = request.path.split('?').next().unwrap_or("");
    // As logs and traces show it: a segment's `;parameters` are where
    // servlet containers put session ids.
    let path = crate::request_path::without_parameters(path);
    let mut request_json = json!({
        "method": request.method,
        "path": path,
        "content_type": request.content_type,
        "body_size": request.body_size,
        "body_sha256": request.body_sha256,
    });
    // As sent: text when it is UTF-8, else its bytes in base64, never
    // text with its bytes replaced (which `body_sha256` would not match).
    if let Some(body) = &request.body {
        match std::str::from_utf8(body) {
            Ok(text) => request_json["body"] = json!(text),
            Err(_) => {
                use base64::Engine as _;
                let encoded = base64::engine::general_purpose::STANDARD.encode(body);
                request_json["body_base64"] = json!(encoded);
            }
        }
    }
    let extra = json!({
        "evidence": op.evidence,
        "next_action": next_action(op),
        "superseded": op.superseded,
        "request": request_json,
        "response": op.response.as_ref().map(|r| json!({
            "status": r.status,
            "body_stored": r.body.is_some(),
        })),
        "events": events.iter().map(|e| json!({
            "at": rfc3339(e.at),
            "kind": e.kind,
            "detail": e.detail,
        })).collect::<Vec<_>>(),
    });
    if let (Some(target), Value::Object(more)) = (value.as_object_mut(), extra) {
        target.extend(more);
    }
    value
}

/// How an `unknown` operation's route takes its answer and answers its
/// retries meanwhile: an MCP tool call's are tool results, not HTTP.
#[derive(Clone, Copy)]
struct Held {
    completed_with: &'static str,
    retries: &'static str,
}

impl Held {
    fn of(profile: Profile) -> Held {
        if profile == Profile::Mcp {
            Held {
                completed_with: "the tool `result` retries should get, with `structuredContent` if the tool declares an outputSchema (`idemgate keys resolve --result`)",
                retries: "retries get a tool result saying the call is held (outcome-unknown), and nothing is sent",
            }
        } else {
            Held {
                completed_with: "the response retries should get",
                retries: "retries get 409 outcome-unknown and nothing is sent",
            }
        }
    }
}

/// An `unknown` operation's next action, where `key` is held.
fn unknown_action(key: &str, held: Held) -> String {
    format!(
        "Check the destination for key `{key}`. If the operation happened, resolve it as completed (optionally with {}); if it did not, resolve it as not_attempted so the client's next retry is forwarded. Until then {}.",
        held.completed_with, held.retries
    )
}

/// What an operator should do next, per state (the states table, README
/// "The states", in words).
fn next_action(op: &Operation) -> String {
    match op.state {
        State::InProgress => format!(
            "In flight (attempt {}). Wait for it to settle; if its gateway died it becomes unknown at the next start.",
            op.attempt
        ),
        State::Completed if op.response.as_ref().is_some_and(|r| r.body.is_none()) => {
            "Nothing to do: it completed, but its response was too large to store, so retries get 409 response-not-stored.".into()
        }
        State::Completed => "Nothing to do: retries get the stored response replayed.".into(),
        State::Unknown if op.evidence == DUPLICATED => format!(
            "A reconcile probe found key `{}` at the destination more than once: it happened, twice or more, and its route is paused. Undo the duplicates at the destination, resolve it as completed (not_attempted is refused: a retry would make it once more), then resume the route.",
            op.key
        ),
        State::Unknown => unknown_action(&op.key, Held::of(Profile::Idemgate)),
        State::NotAttempted => format!(
            "Nothing reached the destination. The client's next retry with this key is forwarded as attempt {}.",
            op.attempt + 1
        ),
    }
}

/// An operator's resolution, read from the body of
/// `POST /admin/keys/{id}/resolve` and checked: what the store is asked to
/// settle the operation as, and the event recorded with it.
#[derive(Debug)]
pub struct Resolution {
    pub decision: Decision,
    pub event: Event,
    /// The attempt the operator checked, when the body names it: the
    /// resolution is taken only while the operation is still at it.
    pub attempt: Option<u32>,
    /// The kind of answer the body gave, if any: an MCP route's tool
    /// call takes a `result`, any other route's write a `response` (see
    /// [`check`]).
    answer: Option<AnswerKind>,
    operator: String,
    reference: Option<String>,
    outcome: String,
}

impl Resolution {
    /// Reads and checks a resolution body; a refusal says why (400).
    pub fn read(body: &[u8]) -> Result<Resolution, AdminError> {
        let body: ResolutionBody = super::json_object(body).map_err(|e| {
            AdminError::InvalidResolution(format!("the body is not a resolution: {e}"))
        })?;
        let decision = decision(&body)?;
        let event = Event {
            kind: "resolved",
            detail: json!({
                "outcome": body.outcome,
                "operator": body.operator,
                "note": body.note,
                "reference": body.reference,
            }),
        };
        Ok(Resolution {
            decision,
            event,
            attempt: body.attempt,
            answer: if body.result.is_some() {
                Some(AnswerKind::ToolResult)
            } else if body.response.is_some() {
                Some(AnswerKind::HttpResponse)
            } else {
                None
            },
            operator: body.operator,
            reference: body.reference,
            outcome: body.outcome,
        })
    }

    /// On an MCP route: a `completed` resolution that gives no `result`
    /// answers the call's retries with the gateway's own tool result
    /// ([`answer::settled`]), not the `{"resolved_by", "reference"}` body
    /// an HTTP route's retries get, which an SDK client would refuse for a
    /// tool that declares an `outputSchema`.
    fn answer_as_tool_call(&mut self, id: &str) {
        if self.answer.is_some() {
            return;
        }
        if let Decision::Completed { response } = &mut self.decision {
            let proof = Proof::Resolved {
                operator: &self.operator,
                reference: self.reference.as_deref(),
            };
            *response = answer::settled(id, &proof);
        }
    }
}

/// The answer a resolution gives retries: an HTTP route's `response`
/// or an MCP tool call's `result`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AnswerKind {
    HttpResponse,
    ToolResult,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolutionBody {
    outcome: String,
    operator: String,
    note: Option<String>,
    reference: Option<String>,
    /// The attempt the operator checked (the one the page showed); absent,
    /// whichever attempt the operation is at when the store takes it.
    #[serde(default, deserialize_with = "integral_attempt")]
    attempt: Option<u32>,
    #[serde(default, deserialize_with = "object_or_null")]
    response: Option<ResolutionResponse>,
    /// An MCP tool result (`{"content": [...], "isError": false}`) retries
    /// of a tool call get, as written; `null` is no result, and refused.
    #[serde(default, deserialize_with = "present")]
    result: Option<Box<RawValue>>,
}

/// A member that is there, even as `null` (which `Option` would read as
/// absent).
fn present<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(deserializer).map(Some)
}

/// The `response` of a resolution: an object or `null`, never the
/// members in order as an array (see [`super::json_object`]).
fn object_or_null<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<ResolutionResponse>, D::Error> {
    struct ObjectOrNull;
    impl<'de> serde::de::Visitor<'de> for ObjectOrNull {
        type Value = Option<ResolutionResponse>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object or null")
        }

        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            super::object(d).map(Some)
        }
    }
    deserializer.deserialize_option(ObjectOrNull)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolutionResponse {
    #[serde(deserialize_with = "integral_status")]
    status: u16,
    /// In the order written: a stored response keeps its headers' order
    /// (a map's order would differ from one reading of the body to the next).
    #[serde(default, deserialize_with = "in_order")]
    headers: Vec<(String, HeaderValues)>,
    /// A string is the body's text; any other JSON is the body, as written.
    body: Option<Box<RawValue>>,
}

/// A JSON object's members in the order they are written, repeats kept.
fn in_order<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<(String, HeaderValues)>, D::Error> {
    struct Members;
    impl<'de> serde::de::Visitor<'de> for Members {
        type Value = Vec<(String, HeaderValues)>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object of header names and values")
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Self::Value, A::Error> {
            let mut members = Vec::new();
            while let Some(member) = map.next_entry()? {
                members.push(member);
            }
            Ok(members)
        }
    }
    deserializer.deserialize_map(Members)
}

/// `number` as JSON Schema's `integer` reads it: any number whose
/// fraction is zero (`276` or `276.0`), so clients that send every number
/// as a float are understood; none for `276.5`, a negative or one past
/// `max`.
fn whole_number(number: &serde_json::Number, max: u64) -> Option<u64> {
    number
        .as_u64()
        .or_else(|| {
            number
                .as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= max as f64)
                .map(|f| f as u64)
        })
        .filter(|n| *n <= max)
}

/// A status, a [`whole_number`]; `276.5` is refused by name.
fn integral_status<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u16, D::Error> {
    let number = serde_json::Number::deserialize(deserializer)?;
    whole_number(&number, u64::from(u16::MAX))
        .and_then(|n| u16::try_from(n).ok())
        .ok_or_else(|| {
            serde::de::Error::custom(format!(
                "`status` must be a whole number from 200 to 599, not {number}"
            ))
        })
}

/// An attempt, a [`whole_number`]: `2` or `2.0`.
fn integral_attempt<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<u32>, D::Error> {
    let number = serde_json::Number::deserialize(deserializer)?;
    whole_number(&number, u64::from(u32::MAX))
        .and_then(|n| u32::try_from(n).ok())
        .filter(|&attempt| attempt >= 1)
        .map(Some)
        .ok_or_else(|| {
            serde::de::Error::custom(format!(
                "`attempt` must be a whole number from 1 to {}, not {number}",
                u32::MAX
            ))
        })
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum HeaderValues {
    One(String),
    Many(Vec<String>),
}

/// `POST /admin/keys/{id}/resolve`.
pub async fn resolve(
    admin: &Admin,
    id: &str,
    body: &[u8],
) -> Result<Response<ProxyBody>, AdminError> {
    let mut resolution = Resolution::read(body)?;
    check(admin, id, &mut resolution).await?;
    match admin
        .store
        .resolve(
            id,
            resolution.attempt,
            &resolution.decision,
            &resolution.event,
        )
        .await?
    {
        Resolved::Done => {
            tracing::info!(operation_id = %id, operator = ?resolution.operator, outcome = %resolution.outcome, "resolved by an operator");
            show(admin, id, None).await
        }
        Resolved::NotFound => Err(AdminError::NotFound("operation")),
        Resolved::FoundAtDestination => Err(AdminError::FoundAtDestination { id: id.to_string() }),
        Resolved::NotResolvable(state) => Err(AdminError::NotResolvable {
            id: id.to_string(),
            state: state.as_str(),
        }),
        Resolved::OtherAttempt { attempt, state } => Err(AdminError::OperationChanged {
            id: id.to_string(),
            decided: resolution.attempt.unwrap_or(attempt),
            attempt,
            state: state.as_str(),
        }),
    }
}

/// Refuses what the operation's route rules out, before the store is
/// asked: a completed resolution whose body is larger than the route's
/// `max_stored_response` (the store keeps no larger response from the
/// upstream, and an operator's is no exception), and a `not_attempted`
/// one while the held attempt may still land at the destination
/// ([`reconcile::may_land_until`]: the next attempt it would let through
/// could make the write twice). An operation whose route is no longer
/// configured is held to none of the route's checks (the answer's kind
/// below included); one that is gone is the store's 404.
/// First, a resolution decided on another attempt than the one held now
/// (the store checks it again in its transaction).
/// And the answer another kind of route takes (409 `wrong-answer-kind`),
/// and on an MCP route the gateway's own result for a `completed` one
/// given none ([`Resolution::answer_as_tool_call`]):
/// an HTTP `response` for an MCP route's tool call, which takes a
/// `result` (a stored status is kept, and one other than 200 would reach
/// the agent as an HTTP error carrying a success result); a tool `result`
/// for an HTTP route's write, whose clients would be replayed JSON-RPC.
async fn check(admin: &Admin, id: &str, resolution: &mut Resolution) -> Result<(), AdminError> {
    let Some((operation, events)) = admin.store.get(id).await? else {
        return Ok(());
    };
    if let Some(decided) = resolution.attempt
        && decided != operation.attempt
    {
        return Err(AdminError::OperationChanged {
            id: id.to_string(),
            decided,
            attempt: operation.attempt,
            state: operation.state.as_str(),
        });
    }
    let Some(route) = admin
        .proxy
        .routes()
        .find(|route| route.name == operation.route)
    else {
        return Ok(());
    };
    let mcp = route.profile == Profile::Mcp;
    match resolution.answer {
        Some(AnswerKind::HttpResponse) if mcp => {
            return Err(AdminError::WrongAnswerKind(format!(
                "an MCP tool call takes a `result` ({{\"content\": [...], \"structuredContent\": {{...}}, \"isError\": false}}; `idemgate keys resolve --result JSON`), or none, not an HTTP `response`: route `{}` answers its retries as JSON-RPC, and a stored status other than 200 would reach the agent as an HTTP error carrying a success",
                operation.route
            )));
        }
        Some(AnswerKind::ToolResult) if !mcp => {
            return Err(AdminError::WrongAnswerKind(format!(
                "route `{}` (profile {}) answers its retries over HTTP and takes a `response`, not an MCP tool `result`: its clients would be replayed a JSON-RPC message",
                operation.route,
                route.profile.name()
            )));
        }
        _ => {}
    }
    if mcp {
        resolution.answer_as_tool_call(id);
    }
    // In flight at a live gateway: the store's refusal, whatever the
    // decision, rather than a wait that would not make it resolvable.
    if operation.state == State::InProgress
        && let Some(owner) = &operation.owner
        && admin.store.owner_alive(owner).await?
    {
        return Err(AdminError::NotResolvable {
            id: id.to_string(),
            state: operation.state.as_str(),
        });
    }
    match &resolution.decision {
        Decision::Completed { response } => {
            let length = response.body.as_ref().map_or(0, Vec::len);
            if length > route.max_stored_response {
                let what = if mcp {
                    "the tool result, in the JSON-RPC message retries get,"
                } else {
                    "the response's body"
                };
                return Err(AdminError::InvalidResolution(format!(
                    "{what} is {length} bytes, more than route `{}`'s max_stored_response ({} bytes)",
                    operation.route, route.max_stored_response
                )));
            }
        }
        Decision::NotAttempted if operation.evidence == DUPLICATED => {
            return Err(AdminError::FoundAtDestination { id: id.to_string() });
        }
        Decision::NotAttempted if resolvable(&operation) => {
            let now = admin.clock.now_millis();
            let until = may_land_until(admin, &operation, &events, route, now);
            if now < until {
                return Err(AdminError::AttemptMayStillLand {
                    attempt: operation.attempt,
                    until,
                    wait: Duration::from_millis(u64::try_from(until - now).unwrap_or(0)),
                });
            }
            // Judged on this attempt: the store takes it only while the
            // operation is still at it (a retry let through meanwhile and
            // lost again may still land, and nobody judged that one).
            resolution.attempt.get_or_insert(operation.attempt);
        }
        // Never an operator's (`resolution` makes no other).
        Decision::NotAttempted | Decision::Fenced => {}
    }
    Ok(())
}

/// Whether the store could take a resolution of `operation` (its own
/// check, made again in the transaction): anything else is its 409
/// `not-resolvable`, which says more than a wait would.
fn resolvable(operation: &Operation) -> bool {
    matches!(operation.state, State::Unknown | State::InProgress)
}

fn decision(resolution: &ResolutionBody) -> Result<Decision, AdminError> {
    let invalid = |reason: &str| AdminError::InvalidResolution(reason.to_string());
    // Lengths in characters, as the OpenAPI document's maxLength counts
    // them, not in UTF-8 bytes.
    let longer =
        |text: &Option<String>, max: usize| text.as_ref().is_some_and(|t| t.chars().count() > max);
    let operator = &resolution.operator;
    if operator.trim().is_empty()
        || operator.chars().count() > 200
        || operator.chars().any(char::is_control)
    {
        return Err(invalid(
            "`operator` names who decided: 1 to 200 characters, not all white space, no control character",
        ));
    }
    if longer(&resolution.note, 4000) || longer(&resolution.reference, 400) {
        return Err(invalid(
            "`note` is at most 4000 characters, `reference` at most 400",
        ));
    }
    if let Some(result) = &resolution.result {
        return match (resolution.outcome.as_str(), &resolution.response) {
            ("completed", None) => Ok(Decision::Completed {
                response: tool_result(result)?,
            }),
            ("completed", Some(_)) => Err(invalid(
                "a resolution takes a `response` (an HTTP route's) or a `result` (an MCP tool call's), not both",
            )),
            _ => Err(invalid("only a completed resolution takes a `result`")),
        };
    }
    match (resolution.outcome.as_str(), &resolution.response) {
        ("not_attempted", None) => Ok(Decision::NotAttempted),
        ("not_attempted", Some(_)) => Err(invalid("a not_attempted resolution takes no `response`")),
        ("completed", Some(response)) => Ok(Decision::Completed {
            response: stored_response(response)?,
        }),
        ("completed", None) => Ok(Decision::Completed {
            response: StoredResponse {
                status: 200,
                headers: vec![("content-type".into(), b"application/json".to_vec())],
                body: Some(
                    json!({ "resolved_by": resolution.operator, "reference": resolution.reference })
                        .to_string()
                        .into_bytes(),
                ),
            },
        }),
        (other, _) => Err(AdminError::InvalidResolution(format!(
            "outcome `{other}`: expected completed or not_attempted"
        ))),
    }
}

/// The answer later retries of an MCP tool call get: the tool `result`
/// (an object whose `content` is an array of content objects, with
/// `isError` a boolean if given), stored as the JSON-RPC response each
/// retry gets under its own id (`pipeline::mcp::answer`).
fn tool_result(written: &RawValue) -> Result<StoredResponse, AdminError> {
    let invalid = |reason: &str| AdminError::InvalidResolution(reason.to_string());
    let result: Value = serde_json::from_str(written.get()).unwrap_or_default();
    let Value::Object(members) = &result else {
        return Err(invalid(
            "`result` is a tool result object: {\"content\": [...]}",
        ));
    };
    let Some(content) = members.get("content").and_then(Value::as_array) else {
        return Err(invalid("`result.content` is an array of content objects"));
    };
    if let Some((index, reason)) = content
        .iter()
        .enumerate()
        .find_map(|(index, block)| content_fault(block).map(|reason| (index, reason)))
    {
        return Err(AdminError::InvalidResolution(format!(
            "`result.content[{index}]` {reason}: MCP clients refuse such a result, and a completed operation cannot be resolved again"
        )));
    }
    if members.get("isError").is_some_and(|e| !e.is_boolean()) {
        return Err(invalid("`result.isError` is true or false"));
    }
    if members
        .get("structuredContent")
        .is_some_and(|s| !s.is_object())
    {
        return Err(invalid(
            "`result.structuredContent` is a JSON object (what the tool's outputSchema describes), or absent",
        ));
    }
    Ok(answer::stored(written))
}

/// What makes `block` no content block of the MCP schema (the fields each
/// `type` requires, as the SDKs check them), if anything.
fn content_fault(block: &Value) -> Option<String> {
    let Some(kind) = block.get("type").and_then(Value::as_str) else {
        return Some("is not a content object with a `type`".into());
    };
    let required: &[&str] = match kind {
        "text" => &["text"],
        "image" | "audio" => &["data", "mimeType"],
        "resource_link" => &["uri", "name"],
        "resource" => {
            let resource = block.get("resource");
            let uri = resource
                .and_then(|r| r.get("uri"))
                .is_some_and(Value::is_string);
            let body = resource.is_some_and(|r| {
                r.get("text").is_some_and(Value::is_string)
                    || r.get("blob").is_some_and(Value::is_string)
            });
            return (!uri || !body).then(|| {
                "of type `resource` needs `resource` with a string `uri` and `text` or `blob`"
                    .into()
            });
        }
        other => {
            return Some(format!(
                "has type `{other}`: expected text, image, audio, resource_link or resource"
            ));
        }
    };
    required
        .iter()
        .find(|field| !block.get(**field).is_some_and(Value::is_string))
        .map(|field| format!("of type `{kind}` needs a string `{field}`"))
}

/// Statuses whose responses have no content (RFC 9110 §15.3.5, §15.3.6,
/// §15.4.5): a replay sends them without a body.
const WITHOUT_CONTENT: [u16; 3] = [204, 205, 304];

/// The most header fields a resolution's response may have, and bytes in
/// all (`name: value` and its line end, each, the content type the body
/// brings included): well within what common clients read of a head
/// (Python's `http.client` takes 100 fields, Node.js 16 KiB), beside the
/// fields a replay adds (`Idempotent-Replayed`, `Content-Length`, `Date`,
/// a profile's own), so that no replay of a decision that can never be
/// taken back is one its clients refuse.
const MAX_RESPONSE_FIELDS: usize = 64;
const MAX_RESPONSE_HEAD_BYTES: usize = 8 * 1024;

/// The response later replays get, checked like a real one: a valid
/// status, end-to-end headers only, and no body for a status that cannot
/// carry one (a body accepted is a body replayed).
fn stored_response(response: &ResolutionResponse) -> Result<StoredResponse, AdminError> {
    let invalid = |reason: String| AdminError::InvalidResolution(reason);
    if !(200..=599).contains(&response.status) {
        return Err(invalid(format!(
            "status {} is not a final status",
            response.status
        )));
    }
    let mut headers = Vec::new();
    for (name, values) in &response.headers {
        let header = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| invalid(format!("`{name}` is not a header name")))?;
        let refused = [
            "connection",
            "keep-alive",
            "proxy-connection",
            "proxy-authenticate",
            "proxy-authorization",
            "te",
            "trailer",
            "transfer-encoding",
            "upgrade",
            "content-length",
        ];
        if refused.contains(&header.as_str()) {
            return Err(invalid(format!("`{name}` is set by idemgate, not stored")));
        }
        let values = match values {
            HeaderValues::One(value) => std::slice::from_ref(value),
            HeaderValues::Many(values) => values.as_slice(),
        };
        for value in values {
            if value.contains(['\r', '\n']) || HeaderValue::from_str(value).is_err() {
                return Err(invalid(format!(
                    "the value of `{name}` is not a valid header value"
                )));
            }
            headers.push((header.as_str().to_string(), value.as_bytes().to_vec()));
        }
    }
    let body = match &response.body {
        None => Vec::new(),
        Some(written) => match serde_json::from_str::<String>(written.get()) {
            Ok(text) => text.into_bytes(),
            Err(_) => {
                if !headers.iter().any(|(n, _)| n == "content-type") {
                    headers.push(("content-type".into(), b"application/json".to_vec()));
                }
                written.get().as_bytes().to_vec()
            }
        },
    };
    let head_bytes: usize = headers.iter().map(|(n, v)| n.len() + v.len() + 4).sum();
    if headers.len() > MAX_RESPONSE_FIELDS || head_bytes > MAX_RESPONSE_HEAD_BYTES {
        return Err(invalid(format!(
            "the response's headers are {} fields, {head_bytes} bytes: at most {MAX_RESPONSE_FIELDS} fields and {MAX_RESPONSE_HEAD_BYTES} bytes, what clients read in a replay",
            headers.len()
        )));
    }
    if !body.is_empty() && WITHOUT_CONTENT.contains(&response.status) {
        return Err(invalid(format!(
            "status {} has no content (RFC 9110), so a replay could not send this `body`: leave it out or empty",
            response.status
        )));
    }
    Ok(StoredResponse {
        status: response.status,
        headers,
        body: Some(body),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolution(text: &str) -> Result<Decision, AdminError> {
        Resolution::read(text.as_bytes()).map(|r| r.decision)
    }

    #[test]
    fn completed_without_a_response_replays_who_resolved_it() {
        let Decision::Completed { response } =
            resolution(r#"{"outcome":"completed","operator":"ann","reference":"T-1"}"#).unwrap()
        else {
            panic!("not completed");
        };
        assert_eq!(response.status, 200);
        let body: Value = serde_json::from_slice(response.body.as_deref().unwrap()).unwrap();
        assert_eq!(body, json!({ "resolved_by": "ann", "reference": "T-1" }));
    }

    /// A response's headers are bounded by what clients read in a replay:
    /// a resolution past them is refused, never stored for good.
    #[test]
    fn a_responses_headers_are_bounded() {
        let with = |headers: Value| {
            let text = json!({"outcome": "completed", "operator": "ann",
                              "response": {"status": 201, "headers": headers}});
            resolution(&text.to_string())
        };
        let many: serde_json::Map<String, Value> = (0..MAX_RESPONSE_FIELDS)
            .map(|i| (format!("x-h{i}"), Value::from("v")))
            .collect();
        assert!(with(Value::Object(many.clone())).is_ok());
        let mut more = many;
        more.insert("x-one-more".into(), Value::from("v"));
        assert!(matches!(
            with(Value::Object(more)),
            Err(AdminError::InvalidResolution(_))
        ));
        let long = json!({ "x-long": "v".repeat(MAX_RESPONSE_HEAD_BYTES) });
        assert!(matches!(with(long), Err(AdminError::InvalidResolution(_))));
        let repeated = json!({ "x-tag": vec!["v"; MAX_RESPONSE_FIELDS + 1] });
        assert!(matches!(
            with(repeated),
            Err(AdminError::InvalidResolution(_))
        ));
        // A JSON body brings its content type, which counts too.
        let full: serde_json::Map<String, Value> = (0..MAX_RESPONSE_FIELDS)
            .map(|i| (format!("x-h{i}"), Value::from("v")))
            .collect();
        let text = json!({"outcome": "completed", "operator": "ann",
                          "response": {"status": 201, "headers": full, "body": {"id": 1}}});
        assert!(matches!(
            resolution(&text.to_string()),
            Err(AdminError::InvalidResolution(_))
        ));
    }

    #[test]
    fn bodies_are_stored_verbatim_or_as_json() {
        let text = r#"{"outcome":"completed","operator":"ann","response":{"status":201,"headers":{"x-a":["1","2"]},"body":"plain"}}"#;
        let Decision::Completed { response } = resolution(text).unwrap() else {
            panic!("not completed");
        };
        assert_eq!(response.body.as_deref(), Some(&b"plain"[..]));
        assert_eq!(response.headers.len(), 2);
        // Headers keep the order the operator wrote them in.
        let text = r#"{"outcome":"completed","operator":"ann","response":{"status":201,"headers":{"x-c":"1","X-B":"2","x-a":["3","4"],"x-b":"5"}}}"#;
        let Decision::Completed { response } = resolution(text).unwrap() else {
            panic!("not completed");
        };
        let names: Vec<_> = response.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["x-c", "x-b", "x-a", "x-a", "x-b"]);
        let text =
            r#"{"outcome":"completed","operator":"ann","response":{"status":201,"body":{"id":7}}}"#;
        let Decision::Completed { response } = resolution(text).unwrap() else {
            panic!("not completed");
        };
        assert_eq!(response.body.as_deref(), Some(&br#"{"id":7}"#[..]));
        // As written: a number beyond a double's precision, members in
        // their order.
        let written = r#"{"z": 123456789012345678901234567890, "a": 0.10000000000000000555}"#;
        let text = format!(
            r#"{{"outcome":"completed","operator":"ann","response":{{"status":201,"body":{written}}}}}"#
        );
        let Decision::Completed { response } = resolution(&text).unwrap() else {
            panic!("not completed");
        };
        assert_eq!(response.body.as_deref(), Some(written.as_bytes()));
        assert!(
            response
                .headers
                .contains(&("content-type".into(), b"application/json".to_vec()))
        );
    }

    #[test]
    fn integral_statuses_are_read_whatever_their_spelling() {
        for spelling in ["276", "276.0", "2.76e2"] {
            let text = format!(
                r#"{{"outcome":"completed","operator":"ann","response":{{"status":{spelling}}}}}"#
            );
            let Decision::Completed { response } = resolution(&text).unwrap() else {
                panic!("not completed");
            };
            assert_eq!(response.status, 276, "{spelling}");
        }
        for spelling in ["276.5", "-201", "65536", "1e10", "\"201\""] {
            let text = format!(
                r#"{{"outcome":"completed","operator":"ann","response":{{"status":{spelling}}}}}"#
            );
            assert!(Resolution::read(text.as_bytes()).is_err(), "{spelling}");
        }
    }

    /// Attempts count from 1: an attempt 0 never was, so a resolution
    /// naming it is malformed (400), not one decided on an attempt the
    /// operation has since left (409 operation-changed).
    #[test]
    fn attempts_count_from_one() {
        let with = |attempt: &str| {
            let text =
                format!(r#"{{"outcome":"not_attempted","operator":"ann","attempt":{attempt}}}"#);
            Resolution::read(text.as_bytes()).map(|r| r.attempt)
        };
        assert!(matches!(with("0"), Err(AdminError::InvalidResolution(_))));
        assert!(matches!(with("0.0"), Err(AdminError::InvalidResolution(_))));
        assert_eq!(with("1").unwrap(), Some(1));
        assert_eq!(with("2.0").unwrap(), Some(2));
    }

    /// A tool result an MCP client would refuse is refused before it is
    /// stored for good: content blocks as the schema has them, and
    /// structured content an object.
    #[test]
    fn a_tool_result_is_one_mcp_clients_take() {
        let with = |result: &str| {
            let text = format!(r#"{{"outcome":"completed","operator":"ann","result":{result}}}"#);
            Resolution::read(text.as_bytes()).map(|_| ())
        };
        for taken in [
            r#"{"content":[]}"#,
            r#"{"content":[{"type":"text","text":"ok"}],"structuredContent":{"id":1}}"#,
            r#"{"content":[{"type":"image","data":"AA==","mimeType":"image/png"}]}"#,
            r#"{"content":[{"type":"resource_link","uri":"x:1","name":"n"}]}"#,
            r#"{"content":[{"type":"resource","resource":{"uri":"x:1","text":"t"}}],"isError":true}"#,
        ] {
            assert!(with(taken).is_ok(), "{taken}");
        }
        for refused in [
            r#"{"content":[{"type":"txt","text":"ok"}]}"#,
            r#"{"content":[{"type":"text"}]}"#,
            r#"{"content":[{"text":"ok"}]}"#,
            r#"{"content":[{"type":"image","data":"AA=="}]}"#,
            r#"{"content":[{"type":"resource","resource":{"uri":"x:1"}}]}"#,
            r#"{"content":[],"structuredContent":[1]}"#,
            r#"{"content":[],"structuredContent":"s"}"#,
            r#"{"content":[],"structuredContent":null}"#,
        ] {
            assert!(
                matches!(with(refused), Err(AdminError::InvalidResolution(_))),
                "{refused}"
            );
        }
    }

    /// A tool result is stored as written: a number beyond a double's
    /// precision is what the tool's client reads.
    #[test]
    fn a_tool_result_is_stored_as_written() {
        let result =
            r#"{"content": [], "structuredContent": {"id": 123456789012345678901234567890}}"#;
        let text = format!(r#"{{"outcome":"completed","operator":"ann","result":{result}}}"#);
        let Decision::Completed { response } = resolution(&text).unwrap() else {
            panic!("not completed");
        };
        let body = String::from_utf8(response.body.unwrap()).unwrap();
        assert!(body.contains(result), "{body}");
    }

    #[test]
    fn resolutions_are_objects_read_as_written() {
        // Objects only, the body and its response: never members by position.
        for text in [
            r#"["completed", "ann"]"#,
            r#"{"outcome":"completed","operator":"ann","response":[201]}"#,
            r#"{"outcome":"completed","operator":"ann"} x"#,
        ] {
            assert!(Resolution::read(text.as_bytes()).is_err(), "{text}");
        }
        let text = r#" {"outcome":"not_attempted","operator":"ann","response":null} "#;
        assert!(matches!(resolution(text), Ok(Decision::NotAttempted)));
    }

    #[test]
    fn bad_resolutions_are_refused() {
        for text in [
            r#"{"outcome":"maybe","operator":"ann"}"#,
            r#"{"outcome":"completed","operator":" "}"#,
            // A control character would split the log line that names the
            // operator, or drive the terminal that shows it.
            r#"{"outcome":"completed","operator":"eve\n2026-12-07T06:50:00Z access route=x"}"#,
            r#"{"outcome":"not_attempted","operator":"eve\u001b[31m"}"#,
            r#"{"outcome":"not_attempted","operator":"ann","response":{"status":200}}"#,
            r#"{"outcome":"completed","operator":"ann","response":{"status":99}}"#,
            r#"{"outcome":"completed","operator":"ann","response":{"status":204,"body":"x"}}"#,
            r#"{"outcome":"completed","operator":"ann","response":{"status":205,"body":{}}}"#,
            r#"{"outcome":"completed","operator":"ann","response":{"status":304,"body":[]}}"#,
            r#"{"outcome":"completed","operator":"ann","response":{"status":200,"headers":{"content-length":"3"}}}"#,
            r#"{"outcome":"completed","operator":"ann","response":{"status":200,"headers":{"transfer-encoding":"chunked"}}}"#,
            r#"{"outcome":"completed","operator":"ann","response":{"status":200,"headers":{"connection":"close"}}}"#,
            r#"{"outcome":"completed","operator":"ann","response":{"status":200,"headers":{"x-a":"1\r\nx-b: 2"}}}"#,
            r#"{"outcome":"completed","operator":"ann","response":{"status":200,"headers":{"bad name":"1"}}}"#,
        ] {
            assert!(
                matches!(resolution(text), Err(AdminError::InvalidResolution(_))),
                "{text}"
            );
        }
    }

    #[test]
    fn query_pairs_are_decoded() {
        let pairs = form_pairs("state=unknown&key=a%2Fb+c&&limit=5").unwrap();
        assert_eq!(
            pairs,
            vec![
                ("state".to_string(), "unknown".to_string()),
                ("key".to_string(), "a/b c".to_string()),
                ("limit".to_string(), "5".to_string()),
            ]
        );
    }
}
