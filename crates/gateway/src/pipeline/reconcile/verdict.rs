//! What one answer to a probe's question says, by the route's rules
//! (docs/requests.md, "Probe verdicts"): a pure function of the answer.
//!
//! Invariants:
//! - *absent* comes only from a rule the route configured ([`Absence`]),
//!   over an answer that came back whole: a question with no answer (not
//!   sent, cut, too large, past its timeout) or a tool's error is never
//!   absent, nor found;
//! - a JSON pointer proves absence only where its value is present and
//!   empty (`[]`, `0`, `null`): a missing member proves nothing, since an
//!   error body of another shape lacks it too;
//! - *more than once* outranks *found*: a count above 1 at the found
//!   status is a duplicate whatever else the answer holds.

use serde_json::{Value, json};

use crate::config::Absence;
use idemgate_model::operation::StoredResponse;

/// One answer to one probe question.
pub struct Answer {
    /// The question as the timeline shows it: the URL (with `{body:…}`
    /// placeholders as configured, never the body's fields) or
    /// `tools/call NAME`; never a credential.
    pub(crate) asked: String,
    /// The HTTP status, if an answer came.
    pub(crate) status: Option<u16>,
    /// What came back, or why nothing usable did.
    pub(crate) got: Result<Got, String>,
}

/// A whole answer.
pub struct Got {
    /// Its JSON (an HTTP body, or a tool's result); `None`: not JSON.
    pub(crate) json: Option<Value>,
    /// What later replays get if it proves the write happened.
    pub(crate) response: StoredResponse,
}

/// The rules an answer is read by.
pub struct Rules<'a> {
    /// `None`: any status (a tool's result, whose errors are no answer).
    pub(crate) found_status: Option<u16>,
    pub(crate) found_json_pointer: Option<&'a str>,
    /// Where a found answer holds the write's own object, which replays
    /// get instead of the whole answer; `None`: the whole answer.
    pub(crate) result_json_pointer: Option<&'a str>,
    pub(crate) absent: Option<&'a Absence>,
    pub(crate) count_json_pointer: Option<&'a str>,
}

/// What an answer says about the held write.
pub enum Verdict {
    /// It happened, once: this is what replays get.
    Found(StoredResponse),
    /// It is not at the destination.
    Absent,
    /// It is there this many times.
    Duplicated(u64),
    /// No proof either way, and why.
    Undetermined(String),
}

impl Verdict {
    /// As the timeline, the metrics and the traces name it.
    pub fn name(&self) -> &'static str {
        match self {
            Verdict::Found(_) => "found",
            Verdict::Absent => "absent",
            Verdict::Duplicated(_) => "duplicated",
            Verdict::Undetermined(_) => "undetermined",
        }
    }
}

/// What begins the error of a question never asked (its placeholders could
/// not be filled): an answer that never went out.
const NOT_ASKED: &str = "not asked: ";

impl Answer {
    /// A question that could not be asked, for `reason`: nothing went out.
    pub(crate) fn not_asked(asked: String, reason: &str) -> Answer {
        Answer {
            asked,
            status: None,
            got: Err(format!("{NOT_ASKED}{reason}")),
        }
    }

    /// Whether the question went out (a probe the metrics count).
    pub(crate) fn went_out(&self) -> bool {
        !matches!(&self.got, Err(error) if error.starts_with(NOT_ASKED))
    }

    /// The value at `pointer` in the answer's JSON, if it came whole.
    fn at(&self, pointer: &str) -> Option<&Value> {
        let got = self.got.as_ref().ok()?;
        got.json.as_ref()?.pointer(pointer)
    }

    /// How many records the answer counts at `pointer`: an array's length,
    /// or a whole number however it is spelled (`2`, `2.0`, `2e0`; one past
    /// 2^64 counts as that many). `None` without a count there.
    pub fn count(&self, pointer: Option<&str>) -> Option<u64> {
        self.counted(pointer).ok().flatten()
    }

    /// [`Answer::count`], or why the member at `pointer` is no count (a
    /// fraction, a negative number, a string): an answer that says how
    /// many in no way the gateway can read proves nothing.
    fn counted(&self, pointer: Option<&str>) -> Result<Option<u64>, String> {
        let Some(pointer) = pointer else {
            return Ok(None);
        };
        let Some(value) = self.at(pointer).filter(|value| !value.is_null()) else {
            return Ok(None);
        };
        if let Some(items) = value.as_array() {
            return Ok(Some(items.len() as u64));
        }
        match value.as_f64() {
            Some(n) if n >= 0.0 && n.fract() == 0.0 => Ok(Some(if n >= u64::MAX as f64 {
                u64::MAX
            } else {
                n as u64
            })),
            _ => Err(format!(
                "the count at {pointer} is not an array nor a whole number"
            )),
        }
    }

    /// Whether the answer says absent by `absence`.
    pub(crate) fn says_absent(&self, absence: &Absence) -> bool {
        self.got.is_ok()
            && absence
                .status
                .is_none_or(|status| self.status == Some(status))
            && absence
                .json_pointer
                .as_deref()
                .is_none_or(|pointer| self.at(pointer).is_some_and(is_empty))
    }

    /// The answer as the timeline shows it: never its body.
    pub fn shown(&self, count: Option<u64>) -> Value {
        json!({
            "url": self.asked,
            "status": self.status,
            "count": count,
            "error": self.got.as_ref().err(),
        })
    }
}

/// What `answer` says by `rules`.
pub fn classify(answer: &Answer, rules: &Rules) -> Verdict {
    let got = match &answer.got {
        Ok(got) => got,
        Err(error) => return Verdict::Undetermined(error.clone()),
    };
    let absent = rules
        .absent
        .is_some_and(|absent| answer.says_absent(absent));
    let at_found_status = rules
        .found_status
        .is_none_or(|status| answer.status == Some(status));
    if at_found_status {
        let count = match answer.counted(rules.count_json_pointer) {
            Ok(count) => count,
            Err(reason) => return Verdict::Undetermined(reason),
        };
        if let Some(n) = count.filter(|n| *n > 1) {
            return Verdict::Duplicated(n);
        }
        let missing = rules
            .found_json_pointer
            .filter(|pointer| answer.at(pointer).is_none_or(Value::is_null));
        if let (Some(pointer), false) = (missing, absent) {
            return Verdict::Undetermined(format!(
                "{}nothing at found_json_pointer `{pointer}`: neither found nor absent by the route's rules",
                answer
                    .status
                    .map(|s| format!("status {s}, but "))
                    .unwrap_or_default()
            ));
        }
        if missing.is_none() && count != Some(0) {
            if absent {
                // Rules that read one answer both ways prove nothing.
                return Verdict::Undetermined(
                    "the answer is both found and absent by the route's rules".into(),
                );
            }
            return match rules.result_json_pointer {
                None => Verdict::Found(got.response.clone()),
                Some(pointer) => match answer.at(pointer).filter(|v| !v.is_null()) {
                    Some(result) => Verdict::Found(result_response(&got.response, result)),
                    // A found write with nothing to answer its retries
                    // with is an operator's: the whole answer (a list) is
                    // what the route said retries must not get.
                    None => Verdict::Undetermined(format!(
                        "found, but nothing at result_json_pointer `{pointer}` to answer retries with"
                    )),
                },
            };
        }
    }
    if absent {
        return Verdict::Absent;
    }
    Verdict::Undetermined(match answer.status {
        Some(status) => format!("status {status}: neither found nor absent by the route's rules"),
        None => "neither found nor absent by the route's rules".into(),
    })
}

/// The answer a found write's retries get when its probe's answer holds
/// the write's object at `result_json_pointer`: that object, as JSON, at
/// the answer's status, with its headers but those that described the
/// whole body (its type, length, coding, digest or version).
fn result_response(answer: &StoredResponse, result: &Value) -> StoredResponse {
    let describes_body = |name: &str| {
        let name = name.to_ascii_lowercase();
        name.starts_with("content-")
            || ["etag", "digest", "repr-digest", "last-modified"].contains(&name.as_str())
    };
    let mut headers: Vec<(String, Vec<u8>)> = answer
        .headers
        .iter()
        .filter(|(name, _)| !describes_body(name))
        .cloned()
        .collect();
    headers.push(("content-type".into(), b"application/json".to_vec()));
    StoredResponse {
        status: answer.status,
        headers,
        body: Some(result.to_string().into_bytes()),
    }
}

/// An empty answer at a pointer: `[]`, `0` or `null`.
fn is_empty(value: &Value) -> bool {
    value.is_null() || value.as_array().is_some_and(Vec::is_empty) || value.as_f64() == Some(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, body: Value) -> Answer {
        Answer {
            asked: "http://api/x".into(),
            status: Some(status),
            got: Ok(Got {
                json: Some(body),
                response: StoredResponse {
                    status,
                    headers: Vec::new(),
                    body: Some(Vec::new()),
                },
            }),
        }
    }

    fn rules(absent: Option<&Absence>) -> Rules<'_> {
        Rules {
            found_status: Some(200),
            found_json_pointer: Some("/data/0"),
            result_json_pointer: None,
            absent,
            count_json_pointer: Some("/data"),
        }
    }

    /// A found write's object, where `result_json_pointer` says it is:
    /// replays get it alone, as JSON, with no header that described the
    /// whole answer; found with nothing there, it is an operator's.
    #[test]
    fn a_result_pointer_answers_with_the_writes_object() {
        let mut found = answer(200, json!({"object": "list", "data": [{"id": "cus_1"}]}));
        if let Ok(got) = &mut found.got {
            got.response.headers = vec![
                (
                    "Content-Type".into(),
                    b"application/json; charset=utf-8".to_vec(),
                ),
                ("Content-Length".into(), b"44".to_vec()),
                ("ETag".into(), b"\"v1\"".to_vec()),
                ("Request-Id".into(), b"req_9".to_vec()),
            ];
        }
        let rules = |result| Rules {
            found_status: Some(200),
            found_json_pointer: Some("/data/0/id"),
            result_json_pointer: result,
            absent: None,
            count_json_pointer: Some("/data"),
        };
        let Verdict::Found(response) = classify(&found, &rules(Some("/data/0"))) else {
            panic!("found");
        };
        assert_eq!(response.status, 200);
        assert_eq!(response.body.as_deref(), Some(&br#"{"id":"cus_1"}"#[..]));
        let names: Vec<&str> = response.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["Request-Id", "content-type"]);
        assert!(matches!(
            classify(&found, &rules(Some("/data/1"))),
            Verdict::Undetermined(reason) if reason.contains("result_json_pointer")
        ));
        let Verdict::Found(whole) = classify(&found, &rules(None)) else {
            panic!("found");
        };
        assert_eq!(whole.headers.len(), 4, "the whole answer, as it came");
    }

    fn list(status: Option<u16>) -> Absence {
        Absence {
            status,
            json_pointer: Some("/data".into()),
        }
    }

    #[test]
    fn a_list_reads_as_found_absent_or_duplicated() {
        let absence = list(Some(200));
        let rules = rules(Some(&absence));
        let verdict = |body| classify(&answer(200, body), &rules).name();
        assert_eq!(verdict(json!({"data": [{"id": 1}]})), "found");
        assert_eq!(verdict(json!({"data": []})), "absent");
        assert_eq!(
            verdict(json!({"data": [{"id": 1}, {"id": 2}]})),
            "duplicated"
        );
        // A missing member proves nothing.
        assert_eq!(verdict(json!({"error": "x"})), "undetermined");
        assert_eq!(verdict(json!({"data": null})), "absent");
    }

    /// A count is a whole number however it is spelled; a member that is
    /// none (a fraction, a negative number, text) proves nothing, never a
    /// single record.
    #[test]
    fn a_count_is_read_however_it_is_spelled() {
        let rules = Rules {
            found_status: Some(200),
            found_json_pointer: Some("/data/0"),
            result_json_pointer: None,
            absent: None,
            count_json_pointer: Some("/count"),
        };
        let verdict = |count: Value| {
            let body = json!({"data": [{"id": 1}], "count": count});
            classify(&answer(200, body), &rules).name()
        };
        for twice in [
            json!(2),
            json!(2.0),
            json!(2e0),
            json!(18446744073709551617.0),
        ] {
            assert_eq!(verdict(twice.clone()), "duplicated", "{twice}");
        }
        assert_eq!(verdict(json!(1.0)), "found");
        for unreadable in [json!(1.5), json!(-1), json!("2")] {
            assert_eq!(verdict(unreadable.clone()), "undetermined", "{unreadable}");
        }
        assert_ne!(verdict(json!(0.0)), "found", "none counted");
    }

    /// A tool's result with no pointer for what is found: any result is
    /// found, so an empty list the absence rule reads is neither.
    #[test]
    fn an_answer_read_both_ways_is_undetermined() {
        let absence = list(None);
        let rules = Rules {
            found_status: None,
            found_json_pointer: None,
            result_json_pointer: None,
            absent: Some(&absence),
            count_json_pointer: None,
        };
        let verdict = |body| classify(&answer(200, body), &rules).name();
        assert_eq!(verdict(json!({"data": []})), "undetermined");
        assert_eq!(verdict(json!({"data": [{"id": 1}]})), "found");
    }

    /// An answer at the found status without the found pointer's member
    /// says which member it lacks.
    #[test]
    fn an_answer_without_the_found_pointer_names_it() {
        let rules = rules(None);
        let Verdict::Undetermined(why) = classify(&answer(200, json!({"data": []})), &rules) else {
            panic!("not undetermined");
        };
        assert_eq!(
            why,
            "status 200, but nothing at found_json_pointer `/data/0`: neither found nor absent by the route's rules"
        );
    }

    #[test]
    fn without_rules_for_absence_nothing_is_absent() {
        let rules = rules(None);
        let verdict = classify(&answer(200, json!({"data": []})), &rules);
        assert_eq!(verdict.name(), "undetermined");
        let not_found = classify(&answer(404, json!({})), &rules);
        assert_eq!(not_found.name(), "undetermined");
    }

    #[test]
    fn a_status_rule_and_a_pointer_rule_must_both_hold() {
        let absence = Absence {
            status: Some(404),
            json_pointer: Some("/count".into()),
        };
        assert!(answer(404, json!({"count": 0})).says_absent(&absence));
        assert!(!answer(404, json!({"count": 1})).says_absent(&absence));
        assert!(!answer(200, json!({"count": 0})).says_absent(&absence));
    }

    #[test]
    fn no_answer_is_never_absent() {
        let absence = Absence {
            status: None,
            json_pointer: None,
        };
        let timed_out = Answer {
            asked: "http://api/x".into(),
            status: None,
            got: Err("no answer within 1s".into()),
        };
        assert!(!timed_out.says_absent(&absence));
        let rules = Rules {
            absent: Some(&absence),
            ..rules(None)
        };
        assert_eq!(classify(&timed_out, &rules).name(), "undetermined");
    }
}
