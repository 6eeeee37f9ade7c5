//! `--check-destination`: one key sent twice straight to the destination,
//! past the gateway, with the route's TLS and the writes' headers, then a
//! control key once, to find whether the destination deduplicates on its
//! own — what the verdict line says this destination needs from the
//! gateway, and whether `resend_unknown` may re-send a lost response under
//! the destination key (the lost-response case re-sent: one record or
//! two). The control tells a repeat answered from the first write
//! apart from a destination that answers every write alike (a fixed
//! `{"ok":true}`): only an answer that differs for another key shows that
//! the repeat's was the first write's.
//!
//! Invariant: exactly [`CHECK_WRITES`] writes, each counted against
//! `--writes` whether or not it was answered; each bounded by the route's
//! `upstream_timeout` and its answer by `max_stored_response`.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Limited};
use serde::Serialize;

use super::text::shorten;
use super::{CHECK_WRITES, Plan, RehearseError};
use idemgate::body::full;
use idemgate::pipeline::forward::ProbeClient;
use idemgate::pipeline::key::IDEMPOTENCY_KEY;

/// What the destination did with one key sent twice.
#[derive(Debug, Serialize)]
pub struct DestinationCheck {
    pub(crate) key: String,
    /// The header the key went in: the route's `destination_key_header`,
    /// else its `forward_key_header`.
    pub(crate) key_header: String,
    /// Writes sent straight to the destination (always 3).
    pub sent: u64,
    /// Each answer, `STATUS BODY` on one line: the key's first write, its
    /// repeat, the control key's write.
    pub(crate) answers: Vec<String>,
    /// The control key, sent once after the repeat.
    pub(crate) control_key: String,
    /// `true`: it answered the repeat from the first; `false`: it created
    /// a second record; `null`: it could not be told.
    pub deduplicates: Option<bool>,
    pub(crate) verdict: String,
}

/// One answer, or why there was none.
struct Answered {
    status: StatusCode,
    replayed: bool,
    body: Bytes,
}

/// Sends the plan's write twice under one new key and once under a control
/// key, straight to the destination.
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
    let mut answers = Vec::new();
    for sent_under in [&key, &key, &control_key] {
        answers.push(send(plan, &client, &header, sent_under).await);
    }
    let lines = answers
        .iter()
        .map(|answer| match answer {
            Ok(a) => format!(
                "{} {}",
                a.status.as_u16(),
                shorten(&String::from_utf8_lossy(&a.body))
            ),
            Err(error) => format!("no complete answer: {error}"),
        })
        .collect();
    let (deduplicates, verdict) = verdict(&answers, &header);
    Ok(DestinationCheck {
        key,
        key_header: header.to_string(),
        sent: CHECK_WRITES,
        answers: lines,
        control_key,
        deduplicates,
        verdict,
    })
}

async fn send(
    plan: &Plan,
    client: &ProbeClient,
    header: &HeaderName,
    key: &str,
) -> Result<Answered, String> {
    let uri = plan
        .route
        .upstream
        .uri_for(&plan.path)
        .map_err(|e| e.to_string())?;
    let mut request = Request::builder()
        .method(plan.method.clone())
        .uri(uri)
        .body(full(plan.body_for(key)))
        .map_err(|e| e.to_string())?;
    let headers = request.headers_mut();
    headers.extend(plan.headers.clone());
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(
        header.clone(),
        HeaderValue::from_str(key).map_err(|e| e.to_string())?,
    );
    let route = &plan.route;
    let exchange = async {
        let response = client.request(request).await.map_err(|e| e.to_string())?;
        let status = response.status();
        let replayed = ["idempotent-replayed", "idempotency-replayed"]
            .iter()
            .any(|name| response.headers().get(*name).is_some_and(|v| v == "true"));
        let body = Limited::new(response.into_body(), route.max_stored_response)
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok(Answered {
            status,
            replayed,
            body,
        })
    };
    tokio::time::timeout(route.upstream_timeout, exchange)
        .await
        .map_err(|_| format!("none within {:?}", route.upstream_timeout))?
}

/// What the answers (the key's first, its repeat, the control key's) say
/// about the destination.
fn verdict(answers: &[Result<Answered, String>], header: &HeaderName) -> (Option<bool>, String) {
    let (first, second, control) = match answers {
        [Ok(first), Ok(second), Ok(control)] => (first, second, control),
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
    let alike = |a: &Answered, b: &Answered| a.status == b.status && a.body == b.body;
    let refused_repeat = matches!(second.status.as_u16(), 409 | 422);
    if alike(first, second) && alike(first, control) && !second.replayed {
        return (
            None,
            format!(
                "not told: the destination answers every write alike ({} with the same body for a new key too), so the same answer to the repeat does not show whether it created a second record; check what it holds for the key.",
                control.status.as_u16()
            ),
        );
    }
    if alike(first, second) || second.replayed || refused_repeat {
        return (
            Some(true),
            format!(
                "the destination deduplicates on `{header}` itself: it answered the repeat ({}) instead of creating a second record. The gateway still adds what it cannot: duplicates in flight answered, a changed payload refused, a lost response held as unknown — and with `destination_key_header = \"{header}\"`, `resend_unknown` may settle a lost response by sending it again within the key's retention.",
                second.status.as_u16()
            ),
        );
    }
    if second.status.is_success() {
        return (
            Some(false),
            format!(
                "the destination does not deduplicate on its own (on `{header}`): the same key twice got two different answers, so a blind retry would have created a second record. Send every retry through the gateway, and leave `resend_unknown` off."
            ),
        );
    }
    (
        None,
        format!(
            "not told: the destination answered the repeat {} (the first {}); check what it holds for the key.",
            second.status.as_u16(),
            first.status.as_u16()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(status: u16, body: &'static str, replayed: bool) -> Result<Answered, String> {
        Ok(Answered {
            status: StatusCode::from_u16(status).unwrap(),
            replayed,
            body: Bytes::from_static(body.as_bytes()),
        })
    }

    /// Each reading of the key's first answer, its repeat's and the
    /// control key's.
    #[test]
    fn the_verdict_reads_the_repeat_against_the_control() {
        let plain = |status, body| answered(status, body, false);
        let cases = [
            // Two records: a different answer for the repeat.
            (
                [plain(201, "1"), plain(201, "2"), plain(201, "3")],
                Some(false),
            ),
            // The first answer again, another for a new key.
            (
                [plain(201, "1"), plain(201, "1"), plain(201, "3")],
                Some(true),
            ),
            // Alike for every key: the answers prove nothing.
            ([plain(201, "ok"), plain(201, "ok"), plain(201, "ok")], None),
            // Said to be a replay, whatever the bodies.
            (
                [
                    plain(201, "ok"),
                    answered(201, "ok", true),
                    plain(201, "ok"),
                ],
                Some(true),
            ),
            (
                [plain(201, "1"), plain(409, "busy"), plain(201, "3")],
                Some(true),
            ),
            ([plain(403, "no"), plain(403, "no"), plain(403, "no")], None),
            ([plain(201, "1"), Err("none".into()), plain(201, "3")], None),
            ([plain(201, "1"), plain(500, "x"), plain(201, "3")], None),
        ];
        for (answers, expected) in cases {
            let (deduplicates, verdict) = verdict(&answers, &IDEMPOTENCY_KEY);
            assert_eq!(deduplicates, expected, "{verdict}");
        }
    }
}
