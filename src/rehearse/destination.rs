//! `--check-destination`: one key sent twice straight to the destination,
//! past the gateway, with the route's TLS and the writes' headers, to find
//! whether the destination deduplicates on its own — what the verdict line
//! says this destination needs from the gateway.
//!
//! Invariant: exactly two writes, both counted against `--writes` whether
//! or not they were answered; each bounded by the route's
//! `upstream_timeout` and its answer by `max_stored_response`.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Limited};
use serde::Serialize;

use super::report::shorten;
use super::{CHECK_WRITES, Plan, RehearseError};
use crate::body::full;
use crate::pipeline::forward::ProbeClient;
use crate::pipeline::key::IDEMPOTENCY_KEY;

/// What the destination did with one key sent twice.
#[derive(Debug, Serialize)]
pub struct DestinationCheck {
    pub key: String,
    /// The header the key went in: the route's `forward_key_header`.
    pub key_header: String,
    /// Writes sent straight to the destination (always 2).
    pub sent: u64,
    /// Each answer, `STATUS BODY` on one line.
    pub answers: Vec<String>,
    /// `true`: it answered the repeat from the first; `false`: it created
    /// a second record; `null`: it could not be told.
    pub deduplicates: Option<bool>,
    pub verdict: String,
}

/// One answer, or why there was none.
struct Answered {
    status: StatusCode,
    replayed: bool,
    body: Bytes,
}

/// Sends the plan's write twice under one new key, straight to the destination.
pub async fn check(plan: &Plan) -> Result<DestinationCheck, RehearseError> {
    let client = plan.upstream_client()?;
    let key = format!("rehearse-check-{}", uuid::Uuid::now_v7().simple());
    let header = plan
        .route
        .forward_key_header
        .clone()
        .unwrap_or(IDEMPOTENCY_KEY);
    let mut answers = Vec::new();
    for _ in 0..CHECK_WRITES {
        answers.push(send(plan, &client, &header, &key).await);
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

/// What the two answers say about the destination.
fn verdict(answers: &[Result<Answered, String>], header: &HeaderName) -> (Option<bool>, String) {
    let (first, second) = match answers {
        [Ok(first), Ok(second)] => (first, second),
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
    let same = second.status == first.status && second.body == first.body;
    let refused_repeat = matches!(second.status.as_u16(), 409 | 422);
    if same || second.replayed || refused_repeat {
        return (
            Some(true),
            format!(
                "the destination deduplicates on `{header}` itself: it answered the repeat ({}) instead of creating a second record. The gateway still adds what it cannot: a lost response held as unknown instead of guessed, duplicates in flight answered, a changed payload refused.",
                second.status.as_u16()
            ),
        );
    }
    if second.status.is_success() {
        return (
            Some(false),
            "the destination does not deduplicate on its own: the same key twice got two different answers, so a blind retry would have created a second record. Send every retry through the gateway.".into(),
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
