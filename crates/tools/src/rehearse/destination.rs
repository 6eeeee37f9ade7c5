//! `--check-destination`: one write sent straight to the destination,
//! past the gateway, with the route's TLS and the writes' headers, under a
//! key, then the very same bytes under a control key, then under the key
//! twice more, to find whether the destination deduplicates on its own —
//! what the verdict line says this destination needs from the gateway,
//! and whether `resend_unknown` may re-send a lost response under the
//! destination key (the lost-response case re-sent: one record or two).
//!
//! The control differs from the repeats in its key alone, and is sent
//! between the first write and the repeats: only a control answered
//! otherwise than the first write (beyond the key it may echo) shows that
//! the destination's answers tell records apart, and so that a repeat's
//! answer, the same as the first's, was the first write's. Answers that
//! depend only on what was sent (an echo of the body) are alike for the
//! control too; answers that follow a clock, a counter or a round robin
//! cannot match the first's at two consecutive repeats while the
//! control's, before them, does not (period 2 gives the second repeat the
//! control's); a replay header counts only where neither the first answer
//! nor the control's carries one. Those are *not told* or *does not
//! deduplicate*, never *deduplicates*. An answer derived from the key
//! alone (an id computed from it) on a destination that deduplicates
//! nothing reads as deduplicating: answers cannot show it, and the verdict
//! says to check the destination's records (docs/rehearse.md, "The
//! verdict").
//!
//! Invariant: at most [`CHECK_WRITES`](super::CHECK_WRITES) writes, each
//! counted against `--writes` unless its connection failed before a byte
//! was written; each bounded by the route's `upstream_timeout` and its
//! answer by `max_stored_response`.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Limited};
use serde::Serialize;

use super::text::shorten;
use super::{Plan, RehearseError};
use idemgate::body::full;
use idemgate::pipeline::forward::ProbeClient;
use idemgate::pipeline::key::IDEMPOTENCY_KEY;

/// Repeats of the key after the control: two, so that an answer of
/// period 2 (a two-node round robin) cannot match the first at both.
pub(crate) const REPEATS: usize = 2;

/// What the destination did with one key sent three times.
#[derive(Debug, Serialize)]
pub struct DestinationCheck {
    pub(crate) key: String,
    /// The header the key went in: the route's `destination_key_header`,
    /// else its `forward_key_header`.
    pub(crate) key_header: String,
    /// Writes that reached the destination straight, or may have: 4 but
    /// for those whose connection failed before a byte was written.
    pub sent: u64,
    /// Each answer, `STATUS BODY` on one line: the key's first write, the
    /// control key's, the key's two repeats.
    pub(crate) answers: Vec<String>,
    /// The control key, sent once with the same body between the key's
    /// first write and its repeats.
    pub(crate) control_key: String,
    /// `true`: its answers say it answered the repeats from the first
    /// (its records have the last word); `false`: it created a second
    /// record; `null`: it could not be told.
    pub deduplicates: Option<bool>,
    pub(crate) verdict: String,
}

/// One answer.
struct Answered {
    status: StatusCode,
    replayed: bool,
    body: Bytes,
}

/// Why a write got no complete answer, and whether it may have reached
/// the destination all the same.
struct Unanswered {
    why: String,
    /// A byte of it may have been written: only a connection that failed
    /// (or a request that could not be made) shows that none was.
    sent: bool,
}

impl Unanswered {
    fn unsent(why: impl ToString) -> Unanswered {
        Unanswered {
            why: why.to_string(),
            sent: false,
        }
    }

    fn sent(why: impl ToString) -> Unanswered {
        Unanswered {
            why: why.to_string(),
            sent: true,
        }
    }
}

/// Sends the plan's write under one new key, the same bytes under a control
/// key, then under the key twice more, straight to the destination.
pub async fn check(plan: &Plan) -> Result<DestinationCheck, RehearseError> {
    let client = plan.upstream_client()?;
    let new_key = || format!("rehearse-check-{}", uuid::Uuid::now_v7().simple());
    let (key, control_key) = (new_key(), new_key());
    let route = &plan.route;
    let header = match (&route.destination_key, &route.forward_key_header) {
        (Some(destination), _) => destination.header.clone(),
        (None, Some(forwarded)) => forwarded.clone(),
        (None, None) => IDEMPOTENCY_KEY,
    };
    // One body for all four: the control differs in its key alone.
    let body = plan.body_for(&key);
    let mut answers = Vec::new();
    let order = [&key, &control_key]
        .into_iter()
        .chain(std::iter::repeat_n(&key, REPEATS));
    for sent_under in order {
        answers.push(send(plan, &client, &header, sent_under, &body).await);
    }
    let lines = answers
        .iter()
        .map(|answer| match answer {
            Ok(a) => format!(
                "{} {}",
                a.status.as_u16(),
                shorten(&String::from_utf8_lossy(&a.body))
            ),
            Err(error) => format!("no complete answer: {}", error.why),
        })
        .collect();
    let sent = answers
        .iter()
        .filter(|answer| answer.as_ref().map_or_else(|e| e.sent, |_| true))
        .count() as u64;
    let (deduplicates, verdict) = verdict(&answers, (&key, &control_key), &header);
    Ok(DestinationCheck {
        key,
        key_header: header.to_string(),
        sent,
        answers: lines,
        control_key,
        deduplicates,
        verdict,
    })
}

/// `body` under `key`, straight to the destination.
async fn send(
    plan: &Plan,
    client: &ProbeClient,
    header: &HeaderName,
    key: &str,
    body: &str,
) -> Result<Answered, Unanswered> {
    let uri = plan
        .route
        .upstream
        .uri_for(&plan.path)
        .map_err(Unanswered::unsent)?;
    let mut request = Request::builder()
        .method(plan.method.clone())
        .uri(uri)
        .body(full(body.to_string()))
        .map_err(Unanswered::unsent)?;
    let headers = request.headers_mut();
    headers.extend(plan.headers.clone());
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(
        header.clone(),
        HeaderValue::from_str(key).map_err(Unanswered::unsent)?,
    );
    let route = &plan.route;
    let exchange = async {
        let response = client.request(request).await.map_err(|e| {
            // A connect error (the TLS handshake included) wrote nothing.
            if e.is_connect() {
                Unanswered::unsent(e)
            } else {
                Unanswered::sent(e)
            }
        })?;
        let status = response.status();
        let replayed = ["idempotent-replayed", "idempotency-replayed"]
            .iter()
            .any(|name| response.headers().get(*name).is_some_and(|v| v == "true"));
        let body = Limited::new(response.into_body(), route.max_stored_response)
            .collect()
            .await
            .map_err(Unanswered::sent)?
            .to_bytes();
        Ok(Answered {
            status,
            replayed,
            body,
        })
    };
    tokio::time::timeout(route.upstream_timeout, exchange)
        .await
        .map_err(|_| Unanswered::sent(format!("none within {:?}", route.upstream_timeout)))?
}

/// What one repeat of the key shows of the first write's record.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reading {
    /// The first write's answer again.
    Same,
    /// Said to be a replay, where neither the first answer nor the
    /// control's said so.
    Replayed,
    /// Refused (409, 422): the key was taken.
    Refused,
    /// Another successful answer: a second record.
    Different,
    /// Another failure: it shows nothing.
    Failed,
}

impl Reading {
    fn of(repeat: &Answered, first: &Answered, replay_believed: bool) -> Reading {
        if repeat.replayed && replay_believed {
            Reading::Replayed
        } else if repeat.status.is_success() {
            match repeat.status == first.status && repeat.body == first.body {
                true => Reading::Same,
                false => Reading::Different,
            }
        } else if matches!(repeat.status.as_u16(), 409 | 422) {
            Reading::Refused
        } else {
            Reading::Failed
        }
    }

    fn said(self, repeat: &Answered) -> String {
        let status = repeat.status.as_u16();
        match self {
            Reading::Same => format!("{status}, the first answer again"),
            Reading::Replayed => format!("{status}, said to be a replay"),
            Reading::Refused => format!("{status}, the key refused"),
            Reading::Different | Reading::Failed => format!("{status}"),
        }
    }
}

/// What the answers (the key's first, the control key's, then the key's
/// repeats) say about the destination, `keys` the key and the control
/// key.
fn verdict(
    answers: &[Result<Answered, Unanswered>],
    (key, control_key): (&str, &str),
    header: &HeaderName,
) -> (Option<bool>, String) {
    let answered = answers
        .iter()
        .map(|answer| answer.as_ref().ok())
        .collect::<Option<Vec<_>>>();
    let (first, control, repeats) = match answered.as_deref() {
        Some([first, control, repeats @ ..]) if !repeats.is_empty() => (*first, *control, repeats),
        _ => {
            return (
                None,
                "not told: a write straight to the destination got no complete answer (see above)."
                    .into(),
            );
        }
    };
    if !first.status.is_success() {
        return (
            None,
            format!(
                "not told: the destination refused the write sent straight to it too ({}), so whether it deduplicates could not be seen.",
                first.status.as_u16()
            ),
        );
    }
    // A replay header on an answer that replays nothing (the first, the
    // control) says nothing of the repeats' either.
    let replay_believed = !first.replayed && !control.replayed;
    let readings: Vec<Reading> = repeats
        .iter()
        .map(|repeat| Reading::of(repeat, first, replay_believed))
        .collect();
    let statuses = repeats
        .iter()
        .map(|repeat| repeat.status.as_u16().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if readings.contains(&Reading::Different) {
        return (
            Some(false),
            format!(
                "the destination does not deduplicate on its own (on `{header}`): the same key got different answers, so a blind retry would have created a second record. Send every retry through the gateway, and leave `resend_unknown` off."
            ),
        );
    }
    let said = || {
        readings
            .iter()
            .zip(repeats)
            .map(|(reading, repeat)| reading.said(repeat))
            .collect::<Vec<_>>()
            .join("; ")
    };
    let deduplicates = |why: String| {
        (
            Some(true),
            format!(
                "by its answers, the destination deduplicates on `{header}` itself: {why}. Answers cannot tell this from a destination that makes a record of every write and derives its answer from the key alone (an id computed from it): before turning `resend_unknown` on, check that the destination holds one record for key `{key}`, sent {} times. The gateway still adds what it cannot: duplicates in flight answered, a changed payload refused, a lost response held as unknown — and with `destination_key_header = \"{header}\"`, `resend_unknown` may settle a lost response by sending it again within the key's retention.",
                repeats.len() + 1
            ),
        )
    };
    if readings.iter().all(|r| *r == Reading::Replayed) {
        return deduplicates(format!(
            "it answered each repeat of the key as a replay ({}), and neither its first answer nor the control's",
            said()
        ));
    }
    if !control.status.is_success() {
        return (
            None,
            format!(
                "not told: the destination answered the same write under a control key {}, not as a new write, so there is nothing to read its answers to the repeats ({statuses}) against; check what it holds for the key.",
                control.status.as_u16(),
            ),
        );
    }
    if readings.contains(&Reading::Failed) {
        return (
            None,
            format!(
                "not told: the destination answered the repeats {statuses} (the first {}); check what it holds for the key.",
                first.status.as_u16()
            ),
        );
    }
    // The control's answer with the control key read as the key: what a
    // second record's answer would be if answers told records apart only
    // by echoing the key they came under.
    let control_as_key = String::from_utf8_lossy(&control.body).replace(control_key, key);
    let control_alike = control.status == first.status && control_as_key.as_bytes() == first.body;
    if control_alike && readings.contains(&Reading::Same) {
        return (
            None,
            format!(
                "not told: the destination answered the same write under a control key alike ({} with the same body), so its answers tell no record from another, and the same answer to a repeat does not show whether it created a second record; check what it holds for the key.",
                control.status.as_u16()
            ),
        );
    }
    deduplicates(format!(
        "it answered each repeat of the key from its first write ({}), where the same write under a control key, sent between the first write and the repeats, was taken as a new write",
        said()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "rehearse-check-a";
    const CONTROL: &str = "rehearse-check-b";

    fn answered(status: u16, body: &str, replayed: bool) -> Result<Answered, Unanswered> {
        Ok(Answered {
            status: StatusCode::from_u16(status).unwrap(),
            replayed,
            body: Bytes::from(body.to_string()),
        })
    }

    /// Each reading of the key's first answer, the control key's (the same
    /// body) and the key's two repeats.
    #[test]
    fn the_verdict_reads_the_repeats_against_the_control() {
        let plain = |status, body| answered(status, body, false);
        let replay = |body| answered(201, body, true);
        let echoed = |key: &str| format!(r#"{{"key":"{key}"}}"#);
        let cases = [
            // Two records: a different answer for a repeat.
            (
                [
                    plain(201, "1"),
                    plain(201, "2"),
                    plain(201, "3"),
                    plain(201, "4"),
                ],
                Some(false),
            ),
            // The first answer again, another for the control before them.
            (
                [
                    plain(201, "1"),
                    plain(201, "2"),
                    plain(201, "1"),
                    plain(201, "1"),
                ],
                Some(true),
            ),
            // Answers of period 2 (a two-node round robin, an id that
            // alternates): the first repeat matches the first by chance,
            // the second cannot.
            (
                [
                    plain(202, "a"),
                    plain(202, "b"),
                    plain(202, "a"),
                    plain(202, "b"),
                ],
                Some(false),
            ),
            // Alike for every key (answers of the body alone, an echo of
            // it): the answers prove nothing.
            (
                [
                    plain(201, "ok"),
                    plain(201, "ok"),
                    plain(201, "ok"),
                    plain(201, "ok"),
                ],
                None,
            ),
            // Answers that differ by the key they came under, and by
            // nothing else: no record told from another.
            (
                [
                    plain(201, &echoed(KEY)),
                    plain(201, &echoed(CONTROL)),
                    plain(201, &echoed(KEY)),
                    plain(201, &echoed(KEY)),
                ],
                None,
            ),
            // Said to be a replay where the first and the control were not,
            // whatever the bodies.
            (
                [
                    plain(201, "ok"),
                    plain(201, "ok"),
                    replay("ok"),
                    replay("ok"),
                ],
                Some(true),
            ),
            // Said to be a replay on every answer, the control's too: the
            // header says nothing, the different bodies two records.
            (
                [replay("1"), replay("2"), replay("3"), replay("4")],
                Some(false),
            ),
            // The repeats refused, the same write under another key taken.
            (
                [
                    plain(201, "1"),
                    plain(201, "2"),
                    plain(409, "busy"),
                    plain(409, "busy"),
                ],
                Some(true),
            ),
            // Refused under another key too: the body is refused, not the
            // key; and a control refused shows nothing.
            (
                [
                    plain(201, "1"),
                    plain(409, "taken"),
                    plain(409, "taken"),
                    plain(409, "taken"),
                ],
                None,
            ),
            (
                [
                    plain(201, "1"),
                    plain(429, "later"),
                    plain(201, "1"),
                    plain(201, "1"),
                ],
                None,
            ),
            (
                [
                    plain(403, "no"),
                    plain(403, "no"),
                    plain(403, "no"),
                    plain(403, "no"),
                ],
                None,
            ),
            (
                [
                    plain(201, "1"),
                    Err(Unanswered::sent("none")),
                    plain(201, "3"),
                    plain(201, "4"),
                ],
                None,
            ),
            (
                [
                    plain(201, "1"),
                    plain(201, "2"),
                    plain(201, "1"),
                    plain(500, "x"),
                ],
                None,
            ),
        ];
        for (answers, expected) in cases {
            let (deduplicates, verdict) = verdict(&answers, (KEY, CONTROL), &IDEMPOTENCY_KEY);
            assert_eq!(deduplicates, expected, "{verdict}");
        }
    }

    /// An answer derived from the key alone reads as deduplicating: the
    /// verdict says that answers cannot tell, and to check the records.
    #[test]
    fn a_deduplicating_verdict_says_the_records_decide() {
        let plain = |body| answered(201, body, false);
        let answers = [plain("h1"), plain("h2"), plain("h1"), plain("h1")];
        let (deduplicates, verdict) = verdict(&answers, (KEY, CONTROL), &IDEMPOTENCY_KEY);
        assert_eq!(deduplicates, Some(true));
        assert!(verdict.starts_with("by its answers, "), "{verdict}");
        assert!(
            verdict.contains(&format!("holds one record for key `{KEY}`, sent 3 times")),
            "{verdict}"
        );
    }
}
