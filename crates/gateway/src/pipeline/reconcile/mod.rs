//! Reconcile probes (docs/requests.md, "After a lost response" and "Probe
//! verdicts"): read-only questions to the route's own upstream — a GET
//! (`http`), or on an MCP route a call of a read-only tool (`tool`,
//! docs/mcp.md, "Reconcile") — whose answers, read by the route's rules
//! (`verdict`), may settle an `unknown` operation.
//!
//! Invariants:
//! - four verdicts: *found* settles the operation `completed` (evidence
//!   `reconciled`) with the probe's response as what later replays get
//!   (on an MCP route the gateway's own answer naming the probe, `tool`);
//!   *absent* settles it `not_attempted` (evidence `reconciled-absent`) so
//!   the next request is sent; *more than once* keeps it `unknown` with
//!   evidence `duplicated-at-destination`, raises an alert and pauses the
//!   route; anything else leaves it `unknown`;
//! - absence only from configured rules, after min age, confirmed: an
//!   answer is taken for absence only by the route's `absent_*` rules, only
//!   once `min_age`, and the route's `late_window` (while it runs the first
//!   exchange may still land), have passed since the write was last on its
//!   way (`last_sent`: when the operation became `unknown`, after its
//!   attempt was sent, or the latest a re-send begun could still be
//!   writing), and, with a confirm request, only when that answer says
//!   absent too. A question with no answer — not sent,
//!   cut, past its timeout — is never absent;
//! - each settlement is a compare-and-set from `unknown` (an absence at the
//!   probed attempt), never of an operation found more than once (only an
//!   operator settles that), and each probe's questions and answers are on
//!   the timeline whatever it concluded (never a body, nor a credential);
//! - the probe carries the credential headers of the request that
//!   triggered it, held in memory only for the probe's duration, never
//!   stored;
//! - at most one probe per operation is in flight, each question bounded by
//!   the probe's `timeout`; a request that would probe while one is running
//!   waits for that one instead (bounded by the probe's questions' bounds),
//!   so that either way it can answer from what the probe left in the
//!   store;
//! - probes of one operation are spaced ([`SPACING`], growing with each
//!   probe in a row): a request that comes sooner after the operation's
//!   latest probe is not probed, and answers from the store. The spacing
//!   is read from the timeline (the latest probe's time, and how many came
//!   in a row since another event), so replicas and restarts keep it, and
//!   a client that retries without pause costs its destination a probe per
//!   spacing's ceiling at most;
//! - a run of probes in a row that settle nothing keeps two timeline
//!   entries, its first and its latest, which counts the probes it stands
//!   for (`RequestPath::add_probe_event`), so retries never grow a held
//!   operation's timeline without bound;
//! - an MCP route's probe asks only about a held call of a tool it is
//!   for (its `tools`): what it finds of one tool's writes says nothing
//!   of another's;
//! - a probe asks about its own operation and nothing else:
//!   `http::url` is the one place a probe URL is built;
//! - a probe asks by keys its destination got: `{key}` only where the
//!   route sends it the client's key, `{destination_key}` (the operation's
//!   id) only where it sends a destination key (checked at load, see
//!   `config`), since a key the destination never saw finds nothing and,
//!   with rules for absence, would release the write to be sent again; an
//!   MCP call's own key reached its server only if the call carried it,
//!   so a tool probe asking by `{key}` believes an absence only for a
//!   call whose kept body shows that (checked at each probe,
//!   `Probe::key_unseen`).

pub(crate) mod http;
pub(crate) mod tool;
pub(crate) mod verdict;

use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ::http::header::{AUTHORIZATION, HOST, HeaderName};
use ::http::{HeaderMap, Request};
use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::config::{Absence, McpReconcile, ProbeKeys, Reconcile, Route};
use crate::metrics::Metrics;
use crate::pipeline::ActiveRoute;
use crate::pipeline::forward::{self, ProbeClient};
use crate::pipeline::landing::Landing;
use crate::pipeline::mcp::identity;
use crate::traces::{self, Step};
use idemgate_model::backoff::Backoff;
use idemgate_model::clock::{self, Clock};
use idemgate_model::operation::{Event, Operation, State};
use idemgate_store::{
    DUPLICATED, Finding, LateEvidence, LateSource, MARKED_IN_FLIGHT, Operators, Probed,
    RequestPath, StoredEvent,
};
use verdict::{Answer, Rules, Verdict, classify};

/// How long after an operation's latest probe the next may be sent, by how
/// many came in a row (since another event on its timeline): a second
/// after the first, doubling with each one after it up to a minute. A
/// retry before then answers from the store. Long enough that a client
/// retrying on 409 in a loop costs the destination a GET a minute at most
/// per held operation; short enough that a write the destination shows
/// (or an absence `min_age` lets the probe believe) settles the next retry
/// within a minute of it.
const SPACING: Backoff = Backoff::doubling(Duration::from_secs(1), Duration::from_secs(60));

/// The probes in flight in this process, by operation id; each probe's
/// receiver lets a request that comes meanwhile wait for it to end, and
/// learn whether it found the write at the destination.
#[derive(Default)]
pub(crate) struct Reconciler {
    running: DashMap<String, watch::Receiver<bool>>,
}

/// Held while a probe runs: dropping it removes the operation from the
/// running set and (dropping the sender) wakes whoever waits on it, who
/// reads what it sent: whether the probe found the write.
struct Running<'a> {
    reconciler: &'a Reconciler,
    operation_id: &'a str,
    done: watch::Sender<bool>,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.reconciler.running.remove(self.operation_id);
    }
}

/// What a probe needs beside the route: the store, the clock's now, the
/// metrics.
pub(crate) struct Ctx<'a> {
    /// Where the probe's conclusion is written.
    pub(crate) store: &'a dyn RequestPath,
    /// Where the held operation and its timeline are read.
    pub(crate) operators: &'a dyn Operators,
    pub(crate) metrics: &'a Metrics,
    /// Now (ms), for the minimum age.
    pub(crate) now: i64,
    /// The held writes this process sent that may still land, and the
    /// clock they are timed on.
    pub(crate) landing: &'a Landing,
    pub(crate) clock: &'a dyn Clock,
}

/// A route's probe, HTTP or MCP.
#[derive(Clone, Copy)]
enum Probe<'a> {
    Http(&'a Reconcile),
    Tool(&'a McpReconcile),
}

impl<'a> Probe<'a> {
    /// The route's probe for the operation stored under `key`. An MCP
    /// route's proves the writes of its `tools` only: a held call of any
    /// other tool has none, and stays held for an operator.
    fn of(route: &'a Route, key: &str) -> Option<Self> {
        let tool = route.mcp.as_ref().and_then(|m| m.reconcile.as_ref());
        match (route.reconcile.as_ref(), tool) {
            (Some(reconcile), _) => Some(Probe::Http(reconcile)),
            (None, Some(probe)) => identity::tool_of(key)
                .is_some_and(|tool| probe.proves(&tool))
                .then_some(Probe::Tool(probe)),
            (None, None) => None,
        }
    }

    fn timeout(self) -> Duration {
        match self {
            Probe::Http(r) => r.timeout,
            Probe::Tool(t) => t.timeout,
        }
    }

    /// The longest a probe runs: each of its questions within `timeout`.
    fn bound(self) -> Duration {
        let confirms = match self {
            Probe::Http(r) => r.verdicts.confirm.is_some(),
            Probe::Tool(t) => t.verdicts.confirm.is_some(),
        };
        self.timeout() * (1 + u32::from(confirms))
    }

    fn min_age(self) -> Duration {
        match self {
            Probe::Http(r) => r.verdicts.min_age,
            Probe::Tool(t) => t.verdicts.min_age,
        }
    }

    fn rules(self) -> Rules<'a> {
        match self {
            Probe::Http(r) => Rules {
                found_status: Some(r.found_status),
                found_json_pointer: r.found_json_pointer.as_deref(),
                result_json_pointer: r.result_json_pointer.as_deref(),
                absent: r.verdicts.absent.as_ref(),
                count_json_pointer: r.verdicts.count_json_pointer.as_deref(),
            },
            Probe::Tool(t) => Rules {
                found_status: None,
                found_json_pointer: t.found_json_pointer.as_deref(),
                result_json_pointer: None,
                absent: t.verdicts.absent.as_ref(),
                count_json_pointer: t.verdicts.count_json_pointer.as_deref(),
            },
        }
    }

    /// The confirm request's question (its URL template, or its tool and
    /// arguments) and its rule for absence.
    fn confirm(self) -> Option<(Question<'a>, &'a Absence)> {
        match self {
            Probe::Http(r) => {
                let confirm = r.verdicts.confirm.as_ref()?;
                Some((Question::Url(&confirm.question), &confirm.absent))
            }
            Probe::Tool(t) => {
                let confirm = t.verdicts.confirm.as_ref()?;
                let call = &confirm.question;
                Some((Question::Tool(&call.tool, &call.arguments), &confirm.absent))
            }
        }
    }

    /// Why an absence this probe reads says nothing of `held`: a tool
    /// probe that asks by `{key}`, the call's own key, which reached the
    /// server only if the call brought it in its body (`_meta` or the key
    /// argument), as its kept body shows; not asked, the server may well
    /// not know the call by it. (`{key}` fills in the key bare, as a server
    /// that knows calls by a key argument got it.)
    fn key_unseen(self, route: &Route, held: &Held<'_>) -> Option<String> {
        let Probe::Tool(probe) = self else {
            return None;
        };
        if !probe.asks_by_key() {
            return None;
        }
        let own = identity::own_key(held.key);
        let key_argument = route.mcp.as_ref().and_then(|m| m.key_argument.as_deref());
        match held.operation.request.body.as_deref() {
            Some(body) if identity::carries_key(body, own, key_argument) => None,
            Some(_) => Some(
                "absent, but asked by the call's own key, which the call never brought the server: it came in the HTTP header or was derived, and the server got it only as `<tool>/<key>` in forward_key_header".into(),
            ),
            None => Some(
                "absent, but asked by the call's own key, which the server got bare only if the call carried it (in _meta or its key argument): the route keeps no bodies (store_request_body), so that cannot be told".into(),
            ),
        }
    }

    fn question(self) -> Question<'a> {
        match self {
            Probe::Http(r) => Question::Url(&r.url),
            Probe::Tool(t) => Question::Tool(&t.tool, &t.arguments),
        }
    }
}

/// One question a probe asks.
#[derive(Clone, Copy)]
enum Question<'a> {
    /// A GET to this URL template.
    Url(&'a str),
    /// A call of this tool with these arguments.
    Tool(&'a str, &'a str),
}

/// The held operation a probe asks about, and what it asks with.
struct Held<'a> {
    operation: &'a Operation,
    /// When (ms) the write could last have been on its way ([`last_sent`]):
    /// what `min_age` counts from.
    since: i64,
    /// How much longer, by the monotonic clock, an exchange this process
    /// sent may land ([`Landing`]): whatever the wall clock says.
    landing: Option<Duration>,
    /// The operation's key (an MCP call's is `<tool>/<key>`).
    key: &'a str,
    credentials: &'a HeaderMap,
}

impl Held<'_> {
    /// The keys the held operation may be known by at its destination:
    /// its key, and its id (what `destination_key_header` sends).
    fn keys(&self) -> ProbeKeys<'_> {
        ProbeKeys {
            key: self.key,
            destination_key: &self.operation.id,
        }
    }
}

impl Question<'_> {
    /// Asks the question about `held`, within `timeout`.
    async fn ask(
        self,
        client: &ProbeClient,
        route: &Route,
        held: &Held<'_>,
        timeout: Duration,
    ) -> Answer {
        match self {
            Question::Url(template) => {
                let body = held.operation.request.body.as_deref();
                match http::url(template, held.keys(), body) {
                    Ok(url) => {
                        let asked = url.shown.clone();
                        let answer = http::get(client, route, &url, held.credentials);
                        within(timeout, &asked, answer).await
                    }
                    Err(reason) => Answer::not_asked(template.to_string(), &reason),
                }
            }
            Question::Tool(name, arguments) => {
                let call = tool::Call {
                    tool: name,
                    arguments,
                    held: held.operation,
                    keys: held.keys(),
                };
                let asked = format!("tools/call {name}");
                let answer = tool::call(client, route, &call, held.credentials);
                within(timeout, &asked, answer).await
            }
        }
    }
}

/// A probe's conclusion with what the timeline shows of it.
struct Concluded {
    verdict: Verdict,
    detail: Value,
    /// Whether the probe's question went out: one that could not be asked
    /// is on the timeline, but counts as no probe in the metrics.
    went_out: bool,
}

/// The evidence of an attempt claimed right after its request's probe
/// found the write at the destination, held instead of sent
/// (`Proxy::hold_found`).
pub(crate) const FOUND_BY_PROBE: &str = "found-at-destination";

impl Reconciler {
    /// Probes for a held operation and settles it by the verdict; the
    /// probe is on its timeline either way. When a probe for the operation
    /// is already running, waits for it to end instead. Either way the
    /// caller then reads the store, which holds whatever the probe (or
    /// anything else) settled. Whether this call's own probe found the
    /// write at the destination (once or more): if the store lets the
    /// caller claim it all the same (an operator resolved it
    /// `not_attempted` while the probe ran), its write must not be sent.
    pub async fn reconcile(
        &self,
        ctx: &Ctx<'_>,
        active: &ActiveRoute,
        operation_id: &str,
        key: &str,
        credentials: &HeaderMap,
    ) -> bool {
        let route = &active.route;
        let Some(probe) = Probe::of(route, key) else {
            return false;
        };
        let done = match self.running.entry(operation_id.to_string()) {
            Entry::Occupied(running) => Err(running.get().clone()),
            Entry::Vacant(vacant) => {
                let (done, running) = watch::channel(false);
                vacant.insert(running);
                Ok(done)
            }
        };
        let done = match done {
            Ok(done) => done,
            Err(mut running) => {
                // `changed` ends when the running probe says what it found,
                // or drops its sender.
                let _ = tokio::time::timeout(probe.bound(), running.changed()).await;
                return *running.borrow();
            }
        };
        let running = Running {
            reconciler: self,
            operation_id,
            done,
        };
        let (held, events) = match ctx.operators.get(operation_id).await {
            Ok(Some((operation, events))) if operation.state == State::Unknown => {
                (operation, events)
            }
            // Settled meanwhile, or gone: nothing to ask.
            Ok(_) => return false,
            Err(error) => {
                tracing::warn!(%operation_id, %error, "cannot read a held operation to probe it");
                return false;
            }
        };
        if probed_lately(&events, ctx.now) {
            // Probed lately: the store holds what that probe concluded.
            return false;
        }
        let asking = Held {
            operation: &held,
            since: last_sent(&held, &events, Writing::of(route)),
            landing: ctx.landing.left(operation_id, ctx.clock),
            key,
            credentials,
        };
        let concluded = traces::child(Step::Probe, async {
            let concluded = conclude(ctx.now, probe, &active.probes, route, &asking).await;
            traces::probe_ended(
                concluded.verdict.name(),
                concluded.detail["status"]
                    .as_u64()
                    .and_then(|s| u16::try_from(s).ok()),
            );
            concluded
        })
        .await;
        if concluded.went_out {
            ctx.metrics
                .probe_verdict(&route.name, concluded.verdict.name());
        }
        let found = matches!(
            concluded.verdict,
            Verdict::Found(_) | Verdict::Duplicated(_)
        );
        settle(ctx.store, active, &held, concluded).await;
        running.done.send_replace(found);
        found
    }
}

/// Asks `probe`'s question about `held` and, for an absence old enough,
/// its confirm question: the verdict, and the timeline's detail of both.
async fn conclude(
    now: i64,
    probe: Probe<'_>,
    client: &ProbeClient,
    route: &Route,
    held: &Held<'_>,
) -> Concluded {
    let timeout = probe.timeout();
    let rules = probe.rules();
    let answer = probe.question().ask(client, route, held, timeout).await;
    let went_out = answer.went_out();
    let mut verdict = classify(&answer, &rules);
    let mut detail = answer.shown(answer.count(rules.count_json_pointer));
    if matches!(verdict, Verdict::Absent) {
        let age = Duration::from_millis(u64::try_from(now - held.since).unwrap_or(0));
        // While the late window runs, the first exchange may still land.
        let min_age = probe.min_age().max(route.late_window);
        if age < min_age {
            let seconds =
                |d: Duration| humantime::format_duration(Duration::from_secs(d.as_secs()));
            let on_its_way = u64::try_from(held.since - now)
                .ok()
                .filter(|left| *left > 0);
            verdict = Verdict::Undetermined(match on_its_way {
                // In progress, or marked unknown with its attempt in flight.
                Some(left) => format!(
                    "absent, but its attempt may still be on its way for {}: absence is believed min_age and the late window ({}) after that",
                    seconds(Duration::from_millis(left)),
                    seconds(min_age)
                ),
                None => format!(
                    "absent, but unknown for {} only: absence is believed after min_age and the late window ({})",
                    seconds(age),
                    seconds(min_age)
                ),
            });
        } else if let Some(reason) = probe.key_unseen(route, held) {
            verdict = Verdict::Undetermined(reason);
        } else if let Some(left) = held.landing {
            verdict = Verdict::Undetermined(format!(
                "absent, but the exchange this gateway sent may still land for {} by its monotonic clock (the wall clock says the late window has passed: it was stepped)",
                humantime::format_duration(Duration::from_secs(left.as_secs().max(1)))
            ));
        } else if let Some((question, absence)) = probe.confirm() {
            let confirmed = question.ask(client, route, held, timeout).await;
            let agrees = confirmed.says_absent(absence);
            let mut shown = confirmed.shown(None);
            shown["absent"] = json!(agrees);
            detail["confirm"] = shown;
            if !agrees {
                verdict = Verdict::Undetermined("the confirm request does not say absent".into());
            }
        }
    }
    detail["matched"] = json!(matches!(verdict, Verdict::Found(_)));
    detail["verdict"] = json!(verdict.name());
    if let Verdict::Undetermined(reason) = &verdict {
        detail["reason"] = json!(reason);
    }
    Concluded {
        verdict,
        detail,
        went_out,
    }
}

/// Until when (ms) a held write's exchange may still land at the
/// destination: [`last_sent`] and the route's `late_window` after it. No
/// absence is believed before — a probe's (which also waits its `min_age`)
/// nor an operator's `not_attempted`.
pub(crate) fn may_land_until(operation: &Operation, events: &[StoredEvent], route: &Route) -> i64 {
    last_sent(operation, events, Writing::of(route))
        .saturating_add(clock::millis(route.late_window))
}

/// How long a write may be on its way to the destination.
#[derive(Debug, Clone, Copy)]
struct Writing {
    /// From its claim: its connects, then its exchange
    /// ([`forward::longest_write`]).
    from_claim: Duration,
    /// From the last moment it could have been handed over: its exchange
    /// (`upstream_timeout`).
    from_hand_over: Duration,
}

impl Writing {
    fn of(route: &Route) -> Writing {
        Writing {
            from_claim: forward::longest_write(route),
            from_hand_over: route.upstream_timeout,
        }
    }
}

/// When a held write could last have been on its way to the destination:
/// when the operation became `unknown` (its last update, which comes after
/// its attempt ended) — or, `in_progress` (its gateway died), its claim
/// plus the most its attempt may take; marked `unknown` with its attempt
/// in flight ([`MARKED_IN_FLIGHT`]: its owner dead, stopped or fenced, so
/// sending nothing after the mark), the mark plus the exchange it may have
/// handed over before — or the latest a re-send under its destination key
/// could still be writing: each re-send's `sending` event (written before
/// it is sent; a skipped try's and a try's result are none) plus the most
/// its attempt may take.
fn last_sent(operation: &Operation, events: &[StoredEvent], writing: Writing) -> i64 {
    let (from_claim, from_hand_over) = (
        clock::millis(writing.from_claim),
        clock::millis(writing.from_hand_over),
    );
    let last = if operation.state == State::InProgress {
        operation.updated_at.saturating_add(from_claim)
    } else if MARKED_IN_FLIGHT.contains(&operation.evidence.as_str()) {
        operation.updated_at.saturating_add(from_hand_over)
    } else {
        operation.updated_at
    };
    events
        .iter()
        .filter(|event| event.kind == "resend" && event.detail["sending"] == true)
        .map(|event| event.at.saturating_add(from_claim))
        .fold(last, i64::max)
}

/// Whether the operation whose timeline is `events` was probed too lately
/// at `now` for another probe ([`next_probe_at`]): not when the next is
/// due further off than the longest spacing, which only a clock stepped
/// back since the latest probe makes so (it would hold the probes back by
/// the step).
fn probed_lately(events: &[StoredEvent], now: i64) -> bool {
    let longest = clock::millis(SPACING.ceiling(u32::MAX));
    next_probe_at(events).is_some_and(|due| now < due && due - now <= longest)
}

/// When (ms) the next probe of an operation whose timeline is `events` may
/// be sent ([`SPACING`]): `None` when no probe came since its latest other
/// event (a new loss, a claim, a re-send, an operator's note), so the
/// probe after a loss is never held back.
fn next_probe_at(events: &[StoredEvent]) -> Option<i64> {
    let latest = events.last().filter(|event| event.kind == "probe")?;
    let in_a_row = events
        .iter()
        .rev()
        .take_while(|event| event.kind == "probe")
        .fold(0u64, |n, probe| n.saturating_add(probe.probes()));
    let after = u32::try_from(in_a_row.saturating_sub(1)).unwrap_or(u32::MAX);
    Some(
        latest
            .at
            .saturating_add(clock::millis(SPACING.ceiling(after))),
    )
}

/// Writes what the probe concluded: a settlement, or its event alone.
async fn settle(
    store: &dyn RequestPath,
    active: &ActiveRoute,
    held: &Operation,
    concluded: Concluded,
) {
    let event = Event {
        kind: "probe",
        detail: concluded.detail,
    };
    let operation_id = held.id.clone();
    let probed = |finding| Probed {
        operation_id: operation_id.clone(),
        attempt: held.attempt,
        finding,
        event: event.clone(),
    };
    let written = match concluded.verdict {
        // Found more than once before: an operator's to settle, so this
        // probe settles nothing, whatever it says.
        _ if held.evidence == DUPLICATED => store.add_probe_event(&operation_id, &event).await,
        Verdict::Found(response) => {
            let late = LateEvidence {
                operation_id: operation_id.clone(),
                source: LateSource::Reconciled,
                response,
                event,
            };
            store.settle_held(&late).await.map(drop)
        }
        Verdict::Absent => store
            .settle_probed(&probed(Finding::Absent))
            .await
            .map(drop),
        Verdict::Duplicated(count) => {
            let reported = store.settle_probed(&probed(Finding::Duplicated)).await;
            if let Ok(true) = reported {
                active.paused.store(true, Ordering::SeqCst);
                tracing::error!(route = %active.route.name, %operation_id, count, "a probe found the write more than once at the destination: route paused");
            }
            reported.map(drop)
        }
        Verdict::Undetermined(_) => store.add_probe_event(&operation_id, &event).await,
    };
    if let Err(error) = written {
        tracing::warn!(%operation_id, %error, "cannot record a probe's result");
    }
}

/// Asks the route's probe about the operation known by `keys` once and
/// stores nothing: what the destination says it holds (`idemgate
/// rehearse`, docs/rehearse.md), as a probe's timeline entry shows it.
/// `None` without an HTTP probe.
pub async fn ask(
    client: &ProbeClient,
    route: &Route,
    keys: ProbeKeys<'_>,
    credentials: &HeaderMap,
) -> Option<Value> {
    let reconcile = route.reconcile.as_ref()?;
    let probe = Probe::Http(reconcile);
    let rules = probe.rules();
    let url = http::url(&reconcile.url, keys, None).ok()?;
    let asked = url.shown.clone();
    let answer = within(
        reconcile.timeout,
        &asked,
        http::get(client, route, &url, credentials),
    )
    .await;
    let verdict = classify(&answer, &rules);
    let mut detail = answer.shown(answer.count(rules.count_json_pointer));
    detail["matched"] = json!(matches!(verdict, Verdict::Found(_)));
    detail["verdict"] = json!(verdict.name());
    Some(detail)
}

/// `question`'s answer, or none when it has no answer within `timeout`:
/// a question past its timeout is never absent.
async fn within(timeout: Duration, asked: &str, question: impl Future<Output = Answer>) -> Answer {
    tokio::time::timeout(timeout, question)
        .await
        .unwrap_or_else(|_| Answer {
            asked: asked.to_string(),
            status: None,
            got: Err(format!(
                "no answer within {}",
                humantime::format_duration(timeout)
            )),
        })
}

/// Whether the operation stored under `key` on `route` has a probe.
pub(crate) fn probes(route: &Route, key: &str) -> bool {
    Probe::of(route, key).is_some()
}

/// A probe's request sent: its response, or why not.
async fn send(
    client: &ProbeClient,
    request: Result<Request<crate::body::ProxyBody>, ::http::Error>,
) -> Result<::http::Response<hyper::body::Incoming>, String> {
    let request = request.map_err(|e| e.to_string())?;
    client.request(request).await.map_err(|e| e.to_string())
}

/// Keeps only the headers a probe may carry: `authorization` and the
/// route's scope headers but `host`. A probe asks the host its URL names,
/// as a write is sent with the upstream's: the client's `Host` (the
/// gateway's own name) would ask a server that serves by name for
/// another site, whose 404 would read as the write's absence.
pub fn credentials(headers: &HeaderMap, route: &Route) -> HeaderMap {
    let mut kept = HeaderMap::new();
    if !route.has_probe() {
        // No probe will ever present them.
        return kept;
    }
    let mut names: Vec<&HeaderName> = std::iter::once(&AUTHORIZATION)
        .chain(&route.scope_headers)
        .filter(|name| **name != HOST)
        .collect();
    names.sort_by_key(|n| n.as_str());
    names.dedup();
    for name in names {
        for value in headers.get_all(name) {
            kept.append(name.clone(), value.clone());
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;
    use idemgate_model::operation::{Fingerprint, RequestSummary};

    fn event(at: i64, kind: &str) -> StoredEvent {
        StoredEvent {
            at,
            kind: kind.into(),
            detail: Value::Null,
        }
    }

    /// A route scoped by `host` sent the client's `Host` on its probes: a
    /// server serving by name answered 404 for the gateway's name, and the
    /// write was taken for absent and sent again.
    #[test]
    fn a_probe_carries_the_credentials_but_never_the_clients_host() {
        let text = "[[routes]]\nname = \"a\"\nupstream = \"http://api:8000\"\n\
                    scope_headers = [\"authorization\", \"host\", \"x-tenant\"]\n\
                    [routes.reconcile]\nurl = \"http://api:8000/v1/orders/{key}\"\n\
                    found_json_pointer = \"/id\"\n";
        let config = crate::config::Config::from_toml_str(text, "t").unwrap();
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("authorization", "Bearer t1"),
            ("host", "gateway.example"),
            ("x-tenant", "t-9"),
            ("cookie", "c=1"),
        ] {
            headers.insert(name, value.parse().unwrap());
        }
        let kept = credentials(&headers, &config.routes[0]);
        let names: Vec<&str> = kept.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["authorization", "x-tenant"]);
    }

    #[test]
    fn probes_are_spaced_by_how_many_came_in_a_row() {
        // The latest of a run, standing for `n` probes.
        let folded = |at, n: u64| StoredEvent {
            at,
            kind: "probe".into(),
            detail: json!({ "verdict": "undetermined", "probes": n }),
        };
        let lost = event(2_000, "timeout");
        // No probe since the loss: the probe after it goes at once.
        assert_eq!(
            next_probe_at(&[event(1_000, "claimed"), lost.clone()]),
            None
        );
        // A second after the first, two after the second.
        let first = event(3_000, "probe");
        assert_eq!(next_probe_at(&[lost.clone(), first.clone()]), Some(4_000));
        let second = [lost.clone(), first.clone(), event(4_500, "probe")];
        assert_eq!(next_probe_at(&second), Some(6_500));
        // Six in a row, the latest standing for five: 32 s after it.
        let six = [lost.clone(), first.clone(), folded(40_000, 5)];
        assert_eq!(next_probe_at(&six), Some(72_000));
        // Never more than a minute.
        let many = [lost.clone(), first.clone(), folded(900_000, 10_000)];
        assert_eq!(next_probe_at(&many), Some(960_000));
        let all = [first.clone(), folded(900_000, u64::MAX)];
        assert_eq!(next_probe_at(&all), Some(960_000));
        // Another event since (a re-send, a new loss): at once again.
        let resent = [first.clone(), folded(9_000, 3), event(9_500, "resend")];
        assert_eq!(next_probe_at(&resent), None);
        // Due at 4 s: held back at 3.5 s; with the clock stepped back an
        // hour since the latest probe, due in an hour, which holds nothing
        // back.
        let probed = [lost, first];
        assert!(probed_lately(&probed, 3_500));
        assert!(!probed_lately(&probed, 4_000));
        assert!(!probed_lately(&probed, 4_000 - 3_600_000));
    }

    #[test]
    fn min_age_counts_from_the_last_time_the_write_was_on_its_way() {
        let held = Operation {
            id: "op".into(),
            route: "api".into(),
            key: "k".into(),
            fingerprint: Fingerprint::from_stored("fp".into()),
            state: State::Unknown,
            attempt: 1,
            owner: None,
            evidence: "timeout".into(),
            response: None,
            request: RequestSummary {
                method: "POST".into(),
                path: "/x".into(),
                content_type: None,
                body_size: 0,
                body_sha256: String::new(),
                body: None,
            },
            superseded: false,
            created_at: 1_000,
            updated_at: 2_000,
        };
        // Became unknown at 2 s; probes and other events are no send.
        let quiet = [event(1_000, "claimed"), event(2_500, "probe")];
        let writing = Writing {
            from_claim: Duration::from_secs(30),
            from_hand_over: Duration::from_secs(10),
        };
        assert_eq!(last_sent(&held, &quiet, writing), 2_000);
        // A re-send under the destination key began at 7 s: it may be
        // writing until 37 s; a try skipped at 20 s, and the first's
        // result at 9 s, sent nothing.
        let sending = StoredEvent {
            detail: json!({ "sending": true, "try": 1 }),
            ..event(7_000, "resend")
        };
        let skipped = StoredEvent {
            detail: json!({ "skipped": "the route is paused", "try": 2 }),
            ..event(20_000, "resend")
        };
        let result = StoredEvent {
            detail: json!({ "status": 500, "try": 1 }),
            ..event(9_000, "resend")
        };
        let resent = [
            event(2_000, "timeout"),
            sending,
            result,
            event(9_000, "probe"),
            skipped,
        ];
        assert_eq!(last_sent(&held, &resent, writing), 37_000);
        // Marked unknown by a restart, a stop or a lost lease at 2 s: the
        // exchange it may have handed over before may be writing until
        // 12 s (a probe's 404 at 2.4 s released it); nothing is sent after.
        for evidence in ["gateway-restarted", "gateway-stopped", "replica-lost"] {
            let marked = Operation {
                evidence: evidence.into(),
                ..held.clone()
            };
            assert_eq!(last_sent(&marked, &quiet, writing), 12_000, "{evidence}");
        }
        // In flight when its gateway died, claimed at 2 s: its attempt may
        // be writing for as long as one may take.
        let in_flight = Operation {
            state: State::InProgress,
            ..held
        };
        assert_eq!(last_sent(&in_flight, &quiet, writing), 32_000);
    }
}
