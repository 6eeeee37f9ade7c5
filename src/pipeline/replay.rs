//! The `replay` phase: answering a key whose operation already exists,
//! without sending anything upstream.
//!
//! Invariant: a replay is the stored status, the stored end-to-end headers
//! (order and duplicates kept) and the stored body byte for byte, with
//! `Content-Length` recomputed and `Idempotent-Replayed: true` added.

use http::header::{CONTENT_LENGTH, HeaderName, HeaderValue};
use http::{Response, StatusCode};

use crate::body::{ProxyBody, full};
use crate::metrics::{OperationId, Outcome};
use crate::pipeline::fingerprint::Fingerprint;
use crate::problem::{OperationRef, ProxyError};
use crate::store::{Operation, State, StoredResponse};

pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// What a request gets for an operation it did not claim.
pub fn answer_existing(
    operation: &Operation,
    fingerprint: &Fingerprint,
) -> Result<Response<ProxyBody>, ProxyError> {
    let reference = OperationRef::from(operation);
    if operation.fingerprint != *fingerprint {
        return Err(ProxyError::KeyReused {
            operation: reference,
        });
    }
    match (operation.state, &operation.response) {
        (State::Completed, Some(stored)) if stored.body.is_some() => {
            let mut response = respond(stored);
            response
                .extensions_mut()
                .insert(OperationId(operation.id.clone()));
            Ok(response)
        }
        (State::Completed, Some(_)) => Err(ProxyError::ResponseNotStored {
            operation: reference,
        }),
        (State::Unknown, _) => Err(ProxyError::OutcomeUnknown {
            operation: reference,
            status: StatusCode::CONFLICT,
            detail: format!(
                "the outcome of this operation is unknown ({}): it may have happened, so nothing is sent until it is reconciled or an operator resolves it",
                operation.evidence
            ),
        }),
        // In progress, a not_attempted one another request just took, or a
        // completed one with no response: all settle soon.
        _ => Err(ProxyError::InProgress {
            operation: reference,
        }),
    }
}

/// A stored response as a replay: nothing was sent upstream.
pub fn respond(stored: &StoredResponse) -> Response<ProxyBody> {
    let body = stored.body.clone().unwrap_or_default();
    let mut response = Response::new(full(body));
    *response.status_mut() = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    let headers = response.headers_mut();
    for (name, value) in &stored.headers {
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) else {
            continue;
        };
        if name != CONTENT_LENGTH {
            headers.append(name, value);
        }
    }
    headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    response.extensions_mut().insert(Outcome::replayed);
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn operation(state: State, body: Option<&[u8]>) -> Operation {
        Operation {
            id: "op".into(),
            route: "r".into(),
            key: "k".into(),
            fingerprint: Fingerprint::from_stored("f".into()),
            state,
            attempt: 1,
            evidence: "response".into(),
            response: Some(StoredResponse {
                status: 201,
                headers: vec![
                    ("x-a".into(), b"1".to_vec()),
                    ("content-length".into(), b"999".to_vec()),
                    ("x-a".into(), b"2".to_vec()),
                ],
                body: body.map(<[u8]>::to_vec),
            }),
            request: crate::store::RequestSummary {
                method: "POST".into(),
                path: "/".into(),
                content_type: None,
                body_size: 0,
                body_sha256: String::new(),
                body: None,
            },
            superseded: false,
            created_at: 0,
            updated_at: 0,
        }
    }

    #[tokio::test]
    async fn replays_status_headers_and_bytes() {
        let fp = Fingerprint::from_stored("f".into());
        let response =
            answer_existing(&operation(State::Completed, Some(b"{\"id\":1}")), &fp).unwrap();
        assert_eq!(response.status(), 201);
        assert_eq!(response.headers()[IDEMPOTENT_REPLAYED], "true");
        let values: Vec<_> = response.headers().get_all("x-a").iter().collect();
        assert_eq!(values, ["1", "2"]);
        assert!(!response.headers().contains_key(CONTENT_LENGTH));
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"{\"id\":1}");
    }

    #[test]
    fn other_states_are_refused() {
        let fp = Fingerprint::from_stored("f".into());
        let status = |op: &Operation, fp: &Fingerprint| {
            answer_existing(op, fp).unwrap_err().problem().status
        };
        assert_eq!(status(&operation(State::Completed, None), &fp), 409);
        assert_eq!(status(&operation(State::Unknown, None), &fp), 409);
        assert_eq!(status(&operation(State::InProgress, None), &fp), 409);
        let other = Fingerprint::from_stored("g".into());
        assert_eq!(status(&operation(State::Completed, Some(b"")), &other), 422);
    }
}
