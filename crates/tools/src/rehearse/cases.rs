//! The five interruption cases, in order, each with its own synthetic key
//! (docs/rehearse.md, "The cases"). Each sends what a client would, lets
//! the gateway's [`Drill`] break the exchange, then reads what the client
//! got, what the store holds (through the admin API, as an operator
//! would), how many writes reached the destination and, on a route with a
//! probe, what the destination says it holds.
//!
//! A case's `ok` judges the gateway, never the destination: a destination
//! that refuses every write still gets each case right, and each case says
//! what the destination answered, and that it refused, also where the
//! client never got that answer (the lost responses of cases 2, 4 and 5);
//! a refused write is never resolved `completed`. A write that could not
//! reach it (its connection refused), or that it gave no complete answer
//! (a reset, a timeout), is no write it answered: the case is not as
//! expected, since it shows nothing of what it rehearses, and such a write
//! is never resolved `completed` either. A note
//! says only what happened: each is written when what it tells is what
//! the answers, the store and the drill show.

use std::future::Future;
use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::json;

use super::report::{Case, Held, Report, Step};
use super::{CASE_WRITES, Plan, RehearseError};
use crate::gateway_client::{Answer, CallError, GatewayClient, join_all};
use idemgate::config::{InProgressMode, ProbeKeys, Route};
use idemgate::pipeline::drill::{Drill, Fault};
use idemgate::pipeline::forward::ProbeClient;
use idemgate::pipeline::reconcile;

/// Concurrent duplicates sent in case 3.
const DUPLICATES: usize = 5;

/// On a route whose duplicates wait (`in_progress = "wait"`), how long
/// the held write stays held after the duplicates were sent, for them to
/// start waiting on it; they cannot be seen waiting from outside.
const WAITERS_SETTLE: Duration = Duration::from_millis(200);

/// Lookups 50 ms apart while a probe runs, beyond its own timeout.
const PROBE_LOOKUPS_EXTRA: u32 = 40;

/// One rehearsal's means: the plan, the gateway's two listeners, its
/// drill, and a client of the destination for probes.
struct Run<'a> {
    plan: &'a Plan,
    client: &'a GatewayClient,
    drill: &'a Drill,
    upstream: ProbeClient,
    /// Makes this run's keys its own.
    id: String,
}

/// Runs every case the `--writes` bound leaves room for.
pub(crate) async fn run_all(
    plan: &Plan,
    client: &GatewayClient,
    drill: &Drill,
) -> Result<Report, RehearseError> {
    let run = Run {
        plan,
        client,
        drill,
        upstream: plan.upstream_client()?,
        id: uuid::Uuid::now_v7().simple().to_string()[..12].to_string(),
    };
    let mut report = Report {
        writes_allowed: plan.writes,
        writes_needed: plan.needs(),
        writes_sent: 0,
        route: plan.route.name.clone(),
        destination: plan.route.upstream.origin.to_string(),
        method: plan.method.to_string(),
        path: plan.path.clone(),
        probe: plan.probe(),
        headers: plan.header_sources.clone(),
        cases: Vec::new(),
        stopped: None,
        destination_check: None,
        verdict: String::new(),
        ok: false,
    };
    let budget = plan.writes.saturating_sub(plan.check_writes());
    for (index, needs) in CASE_WRITES.iter().enumerate() {
        let number = index as u32 + 1;
        let left = budget.saturating_sub(drill.sent());
        if *needs > left {
            let kept = match plan.check_writes() {
                0 => String::new(),
                n => format!(", {n} kept for --check-destination"),
            };
            report.stop(format!(
                "case {number} needs {needs} write(s) and {left} are left (--writes {}{kept}): it was not run, nor any after it",
                plan.writes
            ));
            break;
        }
        let before = (drill.sent(), drill.forwarded(), drill.unanswered());
        drill.take_answered();
        let mut case = match number {
            1 => run.interrupted_before_accept().await?,
            2 => run.response_lost().await?,
            3 => run.duplicates_in_flight().await?,
            4 => run.later_step_fails().await?,
            _ => run.resumed_after_manual_completion().await?,
        };
        case.sent = drill.sent() - before.0;
        case.destination_answered = drill.take_answered();
        let unreached = drill.forwarded() - before.1 - case.sent;
        let unanswered = drill.unanswered() - before.2;
        judge_sent(&mut case, *needs, unreached, unanswered);
        run.destination_says(&mut case).await;
        report.cases.push(case);
    }
    report.writes_sent = drill.sent();
    Ok(report)
}

/// A case's fixed text, before it runs.
fn case(number: u32) -> Case {
    let (name, title, fault, expected) = match number {
        1 => (
            "interrupted-before-accept",
            "Interrupted before the destination accepts",
            "the gateway fails the connection before writing a byte",
            "not_attempted; the client's retry forwarded; one record",
        ),
        2 => (
            "response-lost",
            "Accepted, response lost",
            "the gateway sends the write, reads the destination's whole response and withholds it",
            "unknown; the retry held (nothing sent) until a probe or an operator settles it",
        ),
        3 => (
            "duplicates-in-flight",
            "The same event again while the first is in flight",
            "the gateway holds the write open while duplicates arrive",
            "one write sent; every duplicate told it is in progress or given its answer",
        ),
        4 => (
            "later-step-fails",
            "A later step fails after the create succeeded",
            "a second write, its own key, has its response withheld",
            "the first replayed (held after one of the route's unknown_statuses, not retried after one of its release_statuses), the second held; neither sent again",
        ),
        _ => (
            "resumed-after-manual-completion",
            "Resumed after an operator recorded manual completion",
            "the write's response is withheld; an operator resolves it completed",
            "the client's retry gets a replay (held, if the destination refused the write or gave it no answer); nothing sent",
        ),
    };
    Case {
        number,
        name,
        title,
        fault,
        expected,
        requests: Vec::new(),
        operations: Vec::new(),
        sent: 0,
        destination_answered: None,
        destination_holds: Vec::new(),
        notes: Vec::new(),
        ok: false,
    }
}

impl Run<'_> {
    fn key(&self, case: u32, part: &str) -> String {
        format!("rehearse-{}-{case}{part}", self.id)
    }

    /// The write of the case's `key`, as the client sends it.
    async fn write(&self, key: &str) -> Result<Answer, RehearseError> {
        self.owned_write(key).await
    }

    /// The write of `key`, owning what it needs, for a task of its own.
    fn owned_write(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Answer, RehearseError>> + Send + 'static {
        let (client, key) = (self.client.clone(), key.to_string());
        let (method, path, body) = (
            self.plan.method.clone(),
            self.plan.path.clone(),
            self.plan.body_for(&key),
        );
        async move { Ok(client.send(method, &path, Some(&key), &body).await?) }
    }

    /// What the store holds for `key`, as `GET /admin/keys/{id}` shows it.
    async fn held(&self, key: &str) -> Result<Held, RehearseError> {
        let stored = self.plan.stored_key(key);
        let listed = self
            .client
            .admin(Method::GET, &format!("/admin/keys?key={stored}"), "")
            .await?;
        let id = listed.json()["items"][0]["id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let detail = match id.as_str() {
            "" => {
                json!({ "state": "none", "next_action": "the store holds no operation for this key" })
            }
            id => self
                .client
                .admin(Method::GET, &format!("/admin/keys/{id}"), "")
                .await?
                .json(),
        };
        Ok(Held::from_detail(key, &detail))
    }

    /// After a lost response on a route with a probe: waits (bounded) for
    /// the gateway's probe to have run, then what the store holds.
    async fn held_after_probe(&self, key: &str) -> Result<Held, RehearseError> {
        let Some(timeout) = self.plan.probe_timeout() else {
            return self.held(key).await;
        };
        let lookups = (timeout.as_millis() / 50) as u32 + PROBE_LOOKUPS_EXTRA;
        let mut held = self.held(key).await?;
        for _ in 0..lookups {
            if !held.probes.is_empty() || held.state != "unknown" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            held = self.held(key).await?;
        }
        Ok(held)
    }

    /// The write of `key` with its response withheld, shown as `request`:
    /// what the client got, the status the destination answered the write
    /// (if it reached it), and what the store holds once the route's
    /// probe (if any) has run.
    async fn lose_response(
        &self,
        case: &mut Case,
        request: &str,
        key: &str,
    ) -> Result<(Answer, Option<u16>, Held), RehearseError> {
        self.drill.arm(Fault::LoseResponse);
        let sent = self.drill.sent();
        let lost = self.write(key).await?;
        let withheld = (self.drill.sent() > sent)
            .then(|| self.drill.answered())
            .flatten();
        case.requests.push(Step::new(request, key, &lost));
        let held = self.held_after_probe(key).await?;
        Ok((lost, withheld, held))
    }

    fn has_probe(&self) -> bool {
        self.plan.probe().is_some()
    }

    /// Case 1.
    async fn interrupted_before_accept(&self) -> Result<Case, RehearseError> {
        let mut case = case(1);
        let key = self.key(1, "");
        self.drill.arm(Fault::FailConnect);
        let first = self.write(&key).await?;
        case.requests.push(Step::new("first write", &key, &first));
        let between = self.held(&key).await?;
        let (sent, forwarded) = (self.drill.sent(), self.drill.forwarded());
        let retry = self.write(&key).await?;
        case.requests
            .push(Step::new("client's retry", &key, &retry));
        let after = self.held(&key).await?;
        case.ok = first.problem().as_deref() == Some("upstream-unreachable")
            && between.state == "not_attempted"
            && self.drill.sent() == sent + 1
            && retry.problem().is_none();
        let retry_forwarded = self.drill.forwarded() > forwarded;
        case.notes.push(match (between.state.as_str(), retry_forwarded) {
            ("not_attempted", true) => "after the failed connection the store held `not_attempted`: nothing had reached the destination, so the retry was forwarded".into(),
            ("not_attempted", false) => "after the failed connection the store held `not_attempted`: nothing had reached the destination, yet the retry was not forwarded".into(),
            (state, _) => format!("after the failed connection the store held `{state}`, not `not_attempted`"),
        });
        answered_note(&mut case, &retry, &self.plan.route);
        case.operations.push(after);
        Ok(case)
    }

    /// Case 2.
    async fn response_lost(&self) -> Result<Case, RehearseError> {
        let mut case = case(2);
        let key = self.key(2, "");
        let (lost, withheld, held) = self.lose_response(&mut case, "first write", &key).await?;
        let retry = self.write(&key).await?;
        case.requests
            .push(Step::new("client's retry", &key, &retry));
        let after = self.held(&key).await?;
        case.ok = lost.problem().as_deref() == Some("outcome-unknown")
            && (held.state == "unknown" || self.has_probe())
            && settled_or_held(&retry, &after);
        withheld_note(&mut case, "write", withheld, &after);
        if case.ok {
            let conflict = self.plan.conflict("outcome-unknown");
            case.notes.push(match after.state.as_str() {
                "completed" => "the route's probe found the write at the destination: the operation is completed with the probe's answer, and the retry got it replayed".into(),
                _ if withheld.is_some_and(refused) => format!("the retry was held ({conflict}) and not sent: an operator settles it, as `operator` says"),
                _ => format!("the write may have happened, so the retry was held ({conflict}) and not sent: an operator settles it, as `operator` says"),
            });
        }
        case.operations.push(after);
        Ok(case)
    }

    /// Case 3.
    async fn duplicates_in_flight(&self) -> Result<Case, RehearseError> {
        let mut case = case(3);
        let key = self.key(3, "");
        self.drill.arm(Fault::Hold);
        let first = tokio::spawn(self.owned_write(&key));
        let bound = self.plan.route.upstream_timeout + Duration::from_secs(5);
        let holding = tokio::time::timeout(bound, self.drill.holding()).await;
        let duplicates: Vec<_> = (0..DUPLICATES).map(|_| self.owned_write(&key)).collect();
        let duplicates = duplicates.into_iter();
        let answers = match self.plan.route.in_progress {
            InProgressMode::Reject => {
                let answers = join_all(duplicates).await;
                self.drill.release();
                answers?
            }
            InProgressMode::Wait => {
                let waiting = tokio::spawn(join_all(duplicates));
                tokio::time::sleep(WAITERS_SETTLE).await;
                self.drill.release();
                waiting.await.map_err(CallError::new)??
            }
        };
        let first = first.await.map_err(CallError::new)??;
        case.requests.push(Step::new("held write", &key, &first));
        let mut told = 0;
        for (n, answer) in answers.iter().enumerate() {
            case.requests
                .push(Step::new(format!("duplicate {}", n + 1), &key, answer));
            if answer.problem().as_deref() == Some("request-in-progress")
                || (answer.replayed && answer.repeats(&first))
            {
                told += 1;
            }
        }
        case.ok = holding.is_ok() && told == DUPLICATES;
        case.notes.push(format!(
            "{told} of {DUPLICATES} duplicates were answered by the gateway ({}, or the first write's answer replayed) without reaching the destination",
            self.plan.conflict("request-in-progress")
        ));
        answered_note(&mut case, &first, &self.plan.route);
        case.operations.push(self.held(&key).await?);
        Ok(case)
    }

    /// Case 4.
    async fn later_step_fails(&self) -> Result<Case, RehearseError> {
        let mut case = case(4);
        let (create, next) = (self.key(4, "-create"), self.key(4, "-next"));
        let created = self.write(&create).await?;
        case.requests.push(Step::new("create", &create, &created));
        answered_note(&mut case, &created, &self.plan.route);
        let create_stored = stored_after(&created, &self.plan.route);
        let (lost, withheld, held) = self.lose_response(&mut case, "later step", &next).await?;
        let forwarded = self.drill.forwarded();
        // A released create is retried as the next attempt, as case 1
        // shows: here that would be one more write, which this case does
        // not need.
        let create_again = match create_stored {
            Some("not_attempted") => None,
            _ => {
                let again = self.write(&create).await?;
                case.requests
                    .push(Step::new("create, retried", &create, &again));
                Some(again)
            }
        };
        let next_again = self.write(&next).await?;
        case.requests
            .push(Step::new("later step, retried", &next, &next_again));
        let (create_held, next_held) = (self.held(&create).await?, self.held(&next).await?);
        withheld_note(&mut case, "later step", withheld, &next_held);
        let create_ok = match (create_stored, &create_again) {
            (Some("completed"), Some(again)) => again.replayed && again.repeats(&created),
            (Some("unknown"), Some(again)) => settled_or_held(again, &create_held),
            (Some("not_attempted"), None) => create_held.state == "not_attempted",
            _ => false,
        };
        case.ok = create_ok
            && lost.problem().as_deref() == Some("outcome-unknown")
            && (held.state == "unknown" || self.has_probe())
            && settled_or_held(&next_again, &next_held)
            && self.drill.forwarded() == forwarded;
        if case.ok {
            let next = match next_held.state.as_str() {
                "completed" => "the later step's probe found it and it was replayed",
                _ => "the later step held",
            };
            case.notes.push(match create_stored {
                Some("not_attempted") => format!(
                    "the run retried: {next}, and not sent again; the create, which the destination released, was not retried here (its retry is forwarded as the next attempt, as in case 1: one more write)"
                ),
                Some("unknown") => format!(
                    "the whole run retried: the create held as its answer left it, {next}, and neither was sent again"
                ),
                _ => format!(
                    "the whole run retried: the create was answered from the store, {next}, and neither was sent again"
                ),
            });
        }
        case.operations.push(create_held);
        case.operations.push(next_held);
        Ok(case)
    }

    /// Case 5.
    async fn resumed_after_manual_completion(&self) -> Result<Case, RehearseError> {
        let mut case = case(5);
        let key = self.key(5, "");
        let (lost, withheld, held) = self.lose_response(&mut case, "first write", &key).await?;
        withheld_note(&mut case, "write", withheld, &held);
        // A write the destination refused did not happen, and one it gave
        // no answer may not have: resolved completed, its retries would be
        // told it did.
        let left_held = held.state == "unknown" && withheld.is_none_or(refused);
        let resolved = if left_held {
            let why = match withheld {
                Some(_) => "which would record a write the destination refused",
                None => {
                    "which would record a write the destination gave no answer to, and so may not have made"
                }
            };
            case.notes.push(format!("the rehearsal's operator does not resolve it completed, {why}, and leaves it held: resolving it not_attempted is refused until the route's late_window has passed, and would let the retry through as one more write"));
            false
        } else if held.state == "unknown" {
            let resolution = json!({
                "outcome": "completed",
                "operator": "idemgate rehearse",
                "reference": "rehearsal: the destination answered the withheld write",
            });
            let answer = self
                .client
                .admin(
                    Method::POST,
                    &format!("/admin/keys/{}/resolve", held.id),
                    &resolution.to_string(),
                )
                .await?;
            case.notes.push(format!(
                "an operator resolved it completed: POST /admin/keys/{}/resolve {resolution} → {}",
                held.id,
                answer.status.as_u16()
            ));
            answer.status == StatusCode::OK
        } else if !held.probes.is_empty() {
            case.notes.push(format!(
                "the route's probe settled it ({}) before an operator had to",
                held.state
            ));
            held.state == "completed"
        } else {
            case.notes.push(format!(
                "after the first write the store held `{}`, not `unknown`: there was nothing for an operator to resolve",
                held.state
            ));
            false
        };
        let forwarded = self.drill.forwarded();
        let retry = self.write(&key).await?;
        case.requests
            .push(Step::new("client's retry", &key, &retry));
        let retried_as_expected = if left_held {
            retry.problem().as_deref() == Some("outcome-unknown")
        } else {
            resolved && retry.replayed
        };
        case.ok = lost.problem().as_deref() == Some("outcome-unknown")
            && retried_as_expected
            && self.drill.forwarded() == forwarded;
        case.operations.push(self.held(&key).await?);
        Ok(case)
    }

    /// On a route with a probe: what the destination says it holds for
    /// each of the case's keys (reads, not counted as writes).
    async fn destination_says(&self, case: &mut Case) {
        for held in &case.operations {
            let keys = ProbeKeys {
                key: &held.key,
                destination_key: &held.id,
            };
            let asked =
                reconcile::ask(&self.upstream, &self.plan.route, keys, &self.plan.headers).await;
            if let Some(detail) = asked {
                case.destination_holds.push(detail);
            }
        }
    }
}

/// A case whose writes did not all reach the destination, `unreached` of
/// them forwarded but written nowhere, whose writes the destination did
/// not all answer, `unanswered` of them sent without a complete answer,
/// or that sent other than it needed, is wrong whatever else it did.
fn judge_sent(case: &mut Case, needs: u64, unreached: u64, unanswered: u64) {
    if unreached > 0 {
        case.ok = false;
        case.notes.push(format!(
            "{unreached} write(s) the gateway forwarded could not reach the destination (not a byte written; the answers above say why): the case shows nothing of what it rehearses"
        ));
    } else if unanswered > 0 {
        case.ok = false;
        case.notes.push(format!(
            "{unanswered} write(s) the gateway sent got no complete answer from the destination (the answers above say what the client got): there was no answer to deliver, withhold or hold on purpose, so the case shows nothing of what it rehearses"
        ));
    } else if case.sent != needs {
        case.ok = false;
        case.notes.push(format!(
            "{} write(s) reached the destination where {needs} should have",
            case.sent
        ));
    }
}

/// A retry of a held operation: replayed if it was settled meanwhile,
/// else held (`outcome-unknown`); never forwarded.
fn settled_or_held(retry: &Answer, after: &Held) -> bool {
    match after.state.as_str() {
        "completed" => retry.replayed,
        "unknown" => retry.problem().as_deref() == Some("outcome-unknown"),
        _ => false,
    }
}

/// Whether the destination's answer `status` refused the write.
fn refused(status: u16) -> bool {
    !(200..300).contains(&status)
}

/// Says that the destination refused `what`, a write whose answer
/// (`status`, if it reached the destination) the client never got: the
/// gateway could not read it, so it holds the operation as any lost
/// response; `held` is what the store holds for it.
fn withheld_note(case: &mut Case, what: &str, status: Option<u16>, held: &Held) {
    let Some(status) = status.filter(|status| refused(*status)) else {
        return;
    };
    let then = match held.state.as_str() {
        "unknown" => "so the gateway holds it `unknown`, as any lost response: an operator who finds no record of it at the destination resolves it not_attempted once the route's late_window has passed, and the client's next retry is forwarded".to_string(),
        state => format!("and the store holds `{state}`"),
    };
    case.notes.push(format!(
        "the destination answered {status}: it refused the {what}; the client never got that answer (withheld on purpose), {then}"
    ));
}

/// What the store holds once the client got `answer`, the destination's
/// own answer delivered as it gave it (docs/requests.md, "What each
/// failure becomes"): `not_attempted` after one of the route's
/// `release_statuses`, `unknown` after one of its `unknown_statuses`,
/// `completed` after any other; `None` for the gateway's own answer.
fn stored_after(answer: &Answer, route: &Route) -> Option<&'static str> {
    let status = answer.status.as_u16();
    if answer.problem().is_some() {
        None
    } else if route.release_statuses.contains(&status) {
        Some("not_attempted")
    } else if route.unknown_statuses.contains(&status) {
        Some("unknown")
    } else {
        Some("completed")
    }
}

/// Says what the destination's answer to a delivered write was, when it
/// refused it, and what the gateway made of it: a release status
/// (`not_attempted`, the next retry is forwarded), an unknown status
/// (`unknown`, retries held) or any other (kept and replayed).
fn answered_note(case: &mut Case, answer: &Answer, route: &Route) {
    let status = answer.status.as_u16();
    if !refused(status) {
        return;
    }
    let then = match stored_after(answer, route) {
        Some("not_attempted") => {
            "it refused the write, and said so; the gateway records not_attempted, so the client's next retry is forwarded"
        }
        Some("unknown") => {
            "the gateway passed it on and holds the write `unknown`, since such an answer (a proxy's, often) does not say whether the write happened: retries get 409 outcome-unknown until a probe or an operator settles it"
        }
        Some(_) => {
            "it refused the write; the gateway keeps that answer and gives it to every retry instead of sending the write again"
        }
        None => return,
    };
    case.notes
        .push(format!("the destination answered {status}: {then}"));
}
