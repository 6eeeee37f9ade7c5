//! What a rehearsal found, as a person reads it at a review and as the
//! JSON a pipeline reads (every field documented in docs/rehearse.md,
//! "The JSON report").
//!
//! Invariant: nothing here holds a credential; the headers the writes
//! carried are named by the variable they came from.

use std::io::Write;

use serde::Serialize;
use serde_json::Value;

use super::destination::DestinationCheck;
use super::text::{cut, shorten};
use super::{CHECK_WRITES, Plan};
use crate::gateway_client::Answer;
use crate::keys_cli::probe_question;

/// The whole rehearsal.
#[derive(Debug, Serialize)]
pub struct Report {
    /// `--writes`: the most requests that may write which reach the destination.
    pub(crate) writes_allowed: u64,
    /// What the cases and the destination check need together.
    pub(crate) writes_needed: u64,
    /// Requests that may write which reached the destination.
    pub writes_sent: u64,
    pub(crate) route: String,
    pub destination: String,
    pub(crate) method: String,
    pub(crate) path: String,
    /// The reconcile probe's URL template, or `tools/call NAME` for an
    /// MCP probe of the rehearsed tool, if the route has one.
    pub(crate) probe: Option<String>,
    /// The headers every write carried, as `name from $VARIABLE`.
    pub(crate) headers: Vec<String>,
    pub cases: Vec<Case>,
    /// Why the rehearsal stopped short, if it did.
    pub(crate) stopped: Option<String>,
    pub destination_check: Option<DestinationCheck>,
    /// What this destination needs from the gateway.
    pub verdict: String,
    /// Every case ran and behaved as expected.
    pub ok: bool,
}

/// One interruption case.
#[derive(Debug, Serialize)]
pub struct Case {
    pub number: u32,
    pub name: &'static str,
    pub(crate) title: &'static str,
    /// What the gateway did on purpose.
    pub(crate) fault: &'static str,
    pub(crate) expected: &'static str,
    /// What the client got, request by request.
    pub(crate) requests: Vec<Step>,
    /// What the store holds for each key, after the case.
    pub operations: Vec<Held>,
    /// Requests of this case that reached the destination.
    pub sent: u64,
    /// The status the destination answered the last write sent, whether
    /// or not the client got it.
    pub destination_answered: Option<u16>,
    /// What the route's probe says the destination holds for each key.
    pub destination_holds: Vec<Value>,
    /// What the case shows, in sentences.
    pub notes: Vec<String>,
    pub(crate) ok: bool,
}

/// One request of a case and what the client got.
#[derive(Debug, Serialize)]
pub struct Step {
    /// Which request: `first write`, `client's retry`, `duplicate 3`, …
    pub(crate) request: String,
    pub(crate) key: String,
    pub(crate) status: u16,
    /// The problem's name when idemgate answered itself.
    pub(crate) problem: Option<String>,
    pub(crate) replayed: bool,
    /// The body, shortened to one line.
    pub(crate) body: String,
}

impl Step {
    pub fn new(request: impl Into<String>, key: &str, answer: &Answer) -> Step {
        Step {
            request: request.into(),
            key: key.into(),
            status: answer.status.as_u16(),
            problem: answer.problem(),
            replayed: answer.replayed,
            body: shorten(&answer.body),
        }
    }

    /// `request → answer  (replayed)` in at most `width` characters: the
    /// answer is cut, never the marker.
    fn line(&self, width: usize) -> String {
        let start = format!("{:<20} → ", self.request);
        let marker = if self.replayed { "  (replayed)" } else { "" };
        let got = match &self.problem {
            Some(problem) => format!("{} {problem}", self.status),
            None => format!("{} {}", self.status, self.body),
        };
        let room = width.saturating_sub(start.chars().count() + marker.chars().count());
        format!("{start}{}{marker}", cut(&got, room))
    }
}

/// An operation as the admin API shows it to an operator.
#[derive(Debug, Serialize)]
pub struct Held {
    pub(crate) key: String,
    pub(crate) id: String,
    pub state: String,
    pub evidence: Option<String>,
    pub next_action: String,
    /// The status retries are replayed, when completed.
    pub(crate) response_status: Option<u16>,
    /// The gateway's own probes of it, from its timeline.
    pub probes: Vec<Value>,
}

impl Held {
    /// From `GET /admin/keys/{id}`.
    pub(crate) fn from_detail(key: &str, detail: &Value) -> Held {
        let text = |field: &str| detail[field].as_str().map(str::to_string);
        Held {
            key: key.into(),
            id: text("id").unwrap_or_default(),
            state: text("state").unwrap_or_default(),
            evidence: text("evidence"),
            next_action: text("next_action").unwrap_or_default(),
            response_status: detail["response"]["status"]
                .as_u64()
                .and_then(|s| u16::try_from(s).ok()),
            probes: detail["events"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|e| e["kind"] == "probe")
                .map(|e| e["detail"].clone())
                .collect(),
        }
    }
}

impl Report {
    /// Records why the rehearsal stopped short (the first reason stays).
    pub fn stop(&mut self, why: String) {
        self.stopped.get_or_insert(why);
    }

    /// Sets the verdict and whether everything behaved as expected.
    pub(crate) fn conclude(&mut self, plan: &Plan) {
        self.verdict = match &self.destination_check {
            Some(check) => check.verdict.clone(),
            None if plan.check_destination => {
                "not checked: --writes left too few for --check-destination.".into()
            }
            None => format!(
                "not checked: --check-destination sends one key three times and a control key once straight to the destination ({CHECK_WRITES} more writes) to find whether it deduplicates on its own."
            ),
        };
        self.ok = self.stopped.is_none()
            && self.cases.len() == super::CASE_WRITES.len()
            && self.cases.iter().all(|case| case.ok);
    }
}

/// The lines printed before anything is sent: what may reach the
/// destination, first.
pub(crate) fn preamble(out: &mut impl Write, plan: &Plan) -> std::io::Result<()> {
    let check = match plan.check_writes() {
        0 => String::new(),
        n => format!(", --check-destination {n} more"),
    };
    let cases = plan.needs() - plan.check_writes();
    wrap(
        out,
        "",
        &format!(
            "--writes {0}: at most {0} writes may reach the destination (the cases need {cases}{check}).",
            plan.writes
        ),
    )?;
    wrap(
        out,
        "",
        &format!(
            "idemgate rehearse: route `{}`, {} {} on {}, a throw-away store.",
            plan.route.name, plan.method, plan.path, plan.route.upstream.origin
        ),
    )?;
    match plan.probe() {
        Some(probe) if plan.route.reconcile.is_some() => wrap(
            out,
            "",
            &format!("Reconcile probe: GET {probe} (reads: not counted as writes)."),
        )?,
        Some(probe) => wrap(
            out,
            "",
            &format!("Reconcile probe: {probe} (a read-only tool: not counted as writes)."),
        )?,
        None => writeln!(out, "No reconcile probe: operators settle lost responses.")?,
    }
    if !plan.header_sources.is_empty() {
        wrap(
            out,
            "",
            &format!(
                "Every write carries {} (values not shown).",
                plan.header_sources.join(", ")
            ),
        )?;
    }
    Ok(())
}

/// The report: text for a person, or one JSON object.
pub fn write(out: &mut impl Write, report: &Report, json: bool) -> std::io::Result<()> {
    if json {
        serde_json::to_writer_pretty(&mut *out, report)?;
        return writeln!(out);
    }
    for case in &report.cases {
        write_case(out, case)?;
    }
    if let Some(stopped) = &report.stopped {
        writeln!(out)?;
        wrap(out, "STOPPED: ", &format!("{stopped}."))?;
    }
    if let Some(check) = &report.destination_check {
        writeln!(
            out,
            "\nStraight to the destination, one body: the key, a control key, the key twice:"
        )?;
        for (n, answer) in check.answers.iter().enumerate() {
            writeln!(out, "   {}. {answer}", n + 1)?;
        }
    }
    writeln!(
        out,
        "\n{} writes reached the destination (of --writes {}).",
        report.writes_sent, report.writes_allowed
    )?;
    wrap(out, "Verdict: ", &report.verdict)?;
    let end = if report.ok {
        "rehearse ok: every case behaved as expected."
    } else if report.stopped.is_some() {
        "rehearse stopped: not every case ran (see STOPPED above)."
    } else {
        "rehearse FAILED: a case did not behave as expected (see UNEXPECTED above)."
    };
    writeln!(out, "{end}")
}

fn write_case(out: &mut impl Write, case: &Case) -> std::io::Result<()> {
    writeln!(out, "\n{}. {}", case.number, case.title)?;
    line(out, "fault", case.fault)?;
    line(out, "expected", case.expected)?;
    for step in &case.requests {
        // One line each, cut to the width: a body does not wrap well.
        writeln!(out, "{:15}{}", "", step.line(WIDTH - 15))?;
    }
    for held in &case.operations {
        let evidence = held
            .evidence
            .as_deref()
            .map(|e| format!(" (evidence {e})"))
            .unwrap_or_default();
        line(
            out,
            "store",
            &format!("{}: {}{evidence}", held.key, held.state),
        )?;
        for probe in &held.probes {
            line(out, "probe", &probe_line(probe))?;
        }
        if held.state == "unknown" {
            line(out, "operator", &held.next_action)?;
        }
    }
    let answered = match case.destination_answered {
        Some(status) => format!(", the last answered {status}"),
        None if case.sent > 0 => ", the last got no complete answer".to_string(),
        None => String::new(),
    };
    let requests = if case.sent == 1 {
        "request"
    } else {
        "requests"
    };
    line(
        out,
        "destination",
        &format!("{} {requests} reached it{answered}", case.sent),
    )?;
    for holds in &case.destination_holds {
        line(out, "it holds", &probe_line(holds))?;
    }
    for note in &case.notes {
        line(out, "note", note)?;
    }
    let verdict = if case.ok {
        "ok: as expected"
    } else {
        "UNEXPECTED: see above"
    };
    writeln!(out, "   {verdict}")
}

/// The width report lines are wrapped at, for an 80-column terminal.
const WIDTH: usize = 78;

/// `   label       text`, the text wrapped under itself.
fn line(out: &mut impl Write, label: &str, text: &str) -> std::io::Result<()> {
    wrap(out, &format!("   {label:<12}"), text)
}

/// `prefix` then `text`, wrapped at [`WIDTH`], continued under its start.
fn wrap(out: &mut impl Write, prefix: &str, text: &str) -> std::io::Result<()> {
    let indent = " ".repeat(prefix.chars().count());
    let mut current = prefix.to_string();
    let mut empty = true;
    for word in text.split(' ') {
        if !empty && current.chars().count() + 1 + word.chars().count() > WIDTH {
            writeln!(out, "{current}")?;
            current.clone_from(&indent);
            empty = true;
        }
        if !empty {
            current.push(' ');
        }
        current.push_str(word);
        empty = false;
    }
    writeln!(out, "{current}")
}

/// `GET URL → 200, found` (or `tools/call NAME → …`) from a probe's event.
fn probe_line(probe: &Value) -> String {
    let url = probe["url"].as_str().unwrap_or("?");
    let status = probe["status"]
        .as_u64()
        .map_or("no answer".to_string(), |s| s.to_string());
    let matched = if probe["matched"] == true {
        "found"
    } else {
        "not found"
    };
    let error = probe["error"]
        .as_str()
        .map(|e| format!(" ({e})"))
        .unwrap_or_default();
    format!("{} → {status}, {matched}{error}", probe_question(url))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn case(requests: Vec<Step>) -> Case {
        Case {
            number: 4,
            name: "later-step-fails",
            title: "A later step fails after the create succeeded",
            fault: "a second write, its own key, has its response withheld",
            expected: "the first replayed, the second held; neither sent again",
            requests,
            operations: Vec::new(),
            sent: 2,
            destination_answered: Some(201),
            destination_holds: Vec::new(),
            notes: Vec::new(),
            ok: true,
        }
    }

    /// A long answer is cut to the line; its replay marker never is.
    #[test]
    fn a_long_replayed_answer_keeps_its_marker() {
        let step = |body: &str| Step {
            request: "create, retried".into(),
            key: "k".into(),
            status: 201,
            problem: None,
            replayed: true,
            body: body.into(),
        };
        let long = r#"{"id":163,"path":"/tasks","title":"rehearsal k"}"#;
        let mut out = Vec::new();
        write_case(&mut out, &case(vec![step(long), step("{}")])).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().filter(|l| l.contains("→")).collect();
        assert_eq!(lines.len(), 2, "{text}");
        for line in lines {
            assert!(line.ends_with("  (replayed)"), "{line}");
            assert!(line.chars().count() <= WIDTH, "{line}");
        }
        assert!(text.contains("→ 201 {\"id\":163,"), "{text}");
    }

    /// An MCP probe is a POSTed `tools/call`: no `GET` before it.
    #[test]
    fn a_tool_probe_is_named_as_the_call_it_is() {
        let tool = json!({"url": "tools/call find_task", "status": 200, "matched": false});
        assert_eq!(probe_line(&tool), "tools/call find_task → 200, not found");
        let http = json!({"url": "http://api/lookup?key=k", "status": 404, "matched": false});
        assert_eq!(
            probe_line(&http),
            "GET http://api/lookup?key=k → 404, not found"
        );
    }
}
