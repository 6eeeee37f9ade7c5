//! The `replay` phase: answering a key whose operation already exists,
//! without sending anything upstream.
//!
//! Invariant: a replay is the stored status, the stored end-to-end headers
//! (order and duplicates kept) and the stored body byte for byte, with
//! `Content-Length` recomputed and `Idempotent-Replayed: true` added.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use dashmap::DashMap;
use http::header::{CONTENT_LENGTH, HeaderName, HeaderValue};
use http::{Response, StatusCode};

use crate::body::{ProxyBody, full};
use crate::metrics::{OperationId, Outcome};
use crate::pipeline::error::{OperationRef, ProxyError};
use crate::pipeline::fingerprint::ExactDigest;
use crate::problem::UnknownSince;
use idemgate_model::operation::{Fingerprint, Operation, State, StoredResponse};

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
            since: UnknownSince::Earlier,
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
    let mut response = rebuild(stored);
    mark_replayed(response.headers_mut());
    response.extensions_mut().insert(Outcome::replayed);
    response
}

fn mark_replayed(headers: &mut http::HeaderMap) {
    headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
}

/// A stored response as an HTTP response: its status, its headers in
/// order, its body, `Content-Length` left for hyper to recompute.
pub fn rebuild(stored: &StoredResponse) -> Response<ProxyBody> {
    let body = stored.body.clone().unwrap_or_default();
    let mut response = Response::new(full(body));
    *response.status_mut() = status_of(stored);
    *response.headers_mut() = headers_of(stored);
    response
}

fn status_of(stored: &StoredResponse) -> StatusCode {
    StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK)
}

/// A stored response's headers in order, `Content-Length` left out, with
/// room for the replay marker.
fn headers_of(stored: &StoredResponse) -> http::HeaderMap {
    let mut headers = http::HeaderMap::with_capacity(stored.headers.len() + 1);
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
    headers
}

/// The most memory the replay cache holds, as [`Cached::size`] counts it;
/// older entries go first. With a million operations stored, the
/// gateway's resident memory stays near 100 MiB.
pub const CACHE_BYTES: usize = 32 * 1024 * 1024;

/// What an entry costs beyond its bytes of key, headers and body: the
/// entry and its `Arc`, the map's slot and the eviction queue's, the
/// operation id and fingerprint strings, the header map's table. Measured,
/// not exact: a million `idemgate bench --populate` writes keep the
/// process within its bound only with these counted.
const ENTRY_OVERHEAD: usize = 640;
const HEADER_OVERHEAD: usize = 64;

/// Completed operations' responses by identity, so a replay needs no store
/// read.
///
/// An operation enters once it is asked for again: a duplicate arrived
/// while it was in flight (its attempt puts the response here for it), or
/// a retry was answered from the store (mirrored, with that retry's exact
/// digest). A first write nobody repeats never enters: most are never
/// retried, and caching each of them made every first write pay for an
/// entry and, once the cache was full, for evicting a cold one.
///
/// Invariant: an entry is the operation the store holds now for its
/// identity, or nothing. `completed` is final but for three things:
/// retention deletes the operation and `derive_window` outdates it (every
/// look-up checks both against the store's clock), and a claim supersedes
/// it — so every claim that starts an attempt [`forget`](Self::forget)s the
/// identity, and an entry is only written by the request holding the
/// identity's in-flight guard (the claim's single flight), so no write can
/// land after the claim that made it stale. Absence proves nothing: the
/// store is asked.
pub struct ReplayCache {
    entries: DashMap<String, Arc<Cached>>,
    /// Insertion order for eviction. std Mutex: never held across `.await`.
    order: Mutex<VecDeque<(String, Arc<Cached>)>>,
    bytes: AtomicUsize,
    max_bytes: usize,
}

/// A cached replay, built once: status, headers (the replay marker
/// included) and body, so answering it copies no bytes and parses no names.
struct Cached {
    operation_id: String,
    fingerprint: Fingerprint,
    /// The request that made the operation, exactly as sent, when known (not
    /// for an entry mirrored from the store).
    exact: Option<ExactDigest>,
    status: StatusCode,
    headers: http::HeaderMap,
    body: bytes::Bytes,
    updated_at: i64,
}

impl Cached {
    /// The memory this entry keeps alive, its key in the map and in the
    /// eviction queue included.
    fn size(&self, identity: &str) -> usize {
        ENTRY_OVERHEAD
            + 2 * identity.len()
            + self.body.len()
            + self
                .headers
                .iter()
                .map(|(n, v)| HEADER_OVERHEAD + n.as_str().len() + v.len())
                .sum::<usize>()
    }

    fn respond(&self) -> Response<ProxyBody> {
        let mut response = Response::new(full(self.body.clone()));
        *response.status_mut() = self.status;
        *response.headers_mut() = self.headers.clone();
        response.extensions_mut().insert(Outcome::replayed);
        response
            .extensions_mut()
            .insert(OperationId(self.operation_id.clone()));
        response
    }
}

impl Default for ReplayCache {
    fn default() -> Self {
        Self::with_capacity(CACHE_BYTES)
    }
}

impl ReplayCache {
    pub fn with_capacity(max_bytes: usize) -> Self {
        ReplayCache {
            entries: DashMap::new(),
            order: Mutex::new(VecDeque::new()),
            bytes: AtomicUsize::new(0),
            max_bytes,
        }
    }

    /// Mirrors the operation the store holds now for `identity`: kept when
    /// it is completed with a stored body, forgotten otherwise. `exact` is
    /// the digest of a request the operation replays for, when one asked.
    pub fn mirror(&self, identity: &str, operation: &Operation, exact: Option<ExactDigest>) {
        match (operation.state, &operation.response) {
            (State::Completed, Some(response)) => self.insert(
                identity,
                &operation.id,
                (&operation.fingerprint, exact),
                response,
                operation.updated_at,
            ),
            _ => self.forget(identity),
        }
    }

    /// Drops `identity`'s entry: its operation is no longer the current one.
    pub fn forget(&self, identity: &str) {
        self.entries.remove(identity);
    }

    /// Keeps a response just recorded as `completed`, with the fingerprint
    /// of the request that made it (and that request's exact digest, when
    /// known). `updated_at` must not be later than the store's own, so the
    /// cache never outlives it.
    pub fn insert(
        &self,
        identity: &str,
        operation_id: &str,
        (fingerprint, exact): (&Fingerprint, Option<ExactDigest>),
        response: &StoredResponse,
        updated_at: i64,
    ) {
        if response.body.is_none() {
            return self.forget(identity);
        }
        // What `respond` would answer, built without a response (and a
        // second copy of the body) to take it apart again.
        let mut headers = headers_of(response);
        mark_replayed(&mut headers);
        let cached = Arc::new(Cached {
            operation_id: operation_id.to_string(),
            fingerprint: fingerprint.clone(),
            exact,
            status: status_of(response),
            headers,
            body: bytes::Bytes::from(response.body.clone().unwrap_or_default()),
            updated_at,
        });
        let size = cached.size(identity);
        if size > self.max_bytes {
            return self.forget(identity);
        }
        self.entries.insert(identity.to_string(), cached.clone());
        let Ok(mut order) = self.order.lock() else {
            return;
        };
        // The bound is on what the queue holds, replaced and forgotten
        // entries included, since it keeps them alive until they are popped.
        self.bytes.fetch_add(size, Ordering::SeqCst);
        order.push_back((identity.to_string(), cached));
        while self.bytes.load(Ordering::SeqCst) > self.max_bytes {
            let Some((oldest, entry)) = order.pop_front() else {
                break;
            };
            self.bytes.fetch_sub(entry.size(&oldest), Ordering::SeqCst);
            // Only if it is still that entry: a newer one keeps its place.
            self.entries
                .remove_if(&oldest, |_, current| Arc::ptr_eq(current, &entry));
        }
    }

    /// The replay for `identity` if a completed operation updated after
    /// `valid_after` (ms, the store's clock) is cached and was made by a
    /// request with this exact digest: a retry sent byte for byte is
    /// answered before its fingerprint is computed. `None` says nothing
    /// (another spelling of the same payload, a changed one, no entry):
    /// ask [`answer`](Self::answer) with the fingerprint.
    pub fn answer_exact(
        &self,
        identity: &str,
        exact: &ExactDigest,
        valid_after: i64,
    ) -> Option<Response<ProxyBody>> {
        let cached = self.entries.get(identity).map(|c| c.clone())?;
        (cached.updated_at >= valid_after && cached.exact.as_ref() == Some(exact))
            .then(|| cached.respond())
    }

    /// The answer for `identity` if a completed operation updated after
    /// `valid_after` (ms, the store's clock) is cached: its replay, or 422
    /// when `fingerprint` differs.
    pub fn answer(
        &self,
        identity: &str,
        fingerprint: &Fingerprint,
        valid_after: i64,
    ) -> Option<Result<Response<ProxyBody>, ProxyError>> {
        let cached = self.entries.get(identity).map(|c| c.clone())?;
        if cached.updated_at < valid_after {
            return None;
        }
        let operation = OperationRef {
            id: cached.operation_id.clone(),
            state: State::Completed,
        };
        if cached.fingerprint != *fingerprint {
            return Some(Err(ProxyError::KeyReused { operation }));
        }
        Some(Ok(cached.respond()))
    }
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
            owner: None,
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
            request: idemgate_model::operation::RequestSummary {
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

    /// A replay answered from the store is cached under the retry's exact
    /// digest: its next byte-for-byte copy needs no fingerprint.
    #[test]
    fn a_mirrored_entry_answers_the_exact_request_it_answered() {
        let exact = |body: &[u8]| {
            ExactDigest::compute(&crate::pipeline::fingerprint::FingerprintInput {
                method: &http::Method::POST,
                path_and_query: "/t",
                headers: &http::HeaderMap::new(),
                fingerprint_headers: &[],
                ignore_fields: &[],
                body_as_sent: false,
                body,
            })
        };
        let cache = ReplayCache::default();
        let op = operation(State::Completed, Some(b"{}"));
        cache.mirror("id", &op, None);
        assert!(cache.answer_exact("id", &exact(b"a"), 0).is_none());
        cache.mirror("id", &op, Some(exact(b"a")));
        assert!(cache.answer_exact("id", &exact(b"a"), 0).is_some());
        assert!(cache.answer_exact("id", &exact(b"b"), 0).is_none());
    }

    #[tokio::test]
    async fn the_cache_replays_only_what_is_still_valid() {
        let cache = ReplayCache::default();
        let fp = Fingerprint::from_stored("f".into());
        let mut op = operation(State::Completed, Some(b"{\"id\":1}"));
        op.updated_at = 1_000;
        cache.mirror("id-1", &op, None);
        let replay = cache.answer("id-1", &fp, 0).unwrap().unwrap();
        assert_eq!(replay.headers()[IDEMPOTENT_REPLAYED], "true");
        // The cached replay is the one built from the store.
        let built = respond(op.response.as_ref().unwrap());
        assert_eq!(replay.status(), built.status());
        assert_eq!(replay.headers(), built.headers());
        let body = replay.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"{\"id\":1}");
        // Another fingerprint is a reused key; an expired entry is not answered.
        let other = Fingerprint::from_stored("g".into());
        let reused = cache.answer("id-1", &other, 0).unwrap().unwrap_err();
        assert_eq!(reused.problem().status, 422);
        assert!(cache.answer("id-1", &fp, 1_001).is_none());
        assert!(cache.answer("id-2", &fp, 0).is_none());
        // Only completed operations with a stored body are kept.
        cache.mirror("id-3", &operation(State::Unknown, Some(b"x")), None);
        cache.mirror("id-4", &operation(State::Completed, None), None);
        assert!(cache.answer("id-3", &fp, 0).is_none());
        assert!(cache.answer("id-4", &fp, 0).is_none());
    }

    #[test]
    fn the_cache_evicts_the_oldest_past_its_capacity() {
        let fp = Fingerprint::from_stored("f".into());
        let body = vec![b'x'; 100];
        let probe = ReplayCache::default();
        probe.mirror("k0", &operation(State::Completed, Some(&body)), None);
        let one = probe.bytes.load(Ordering::SeqCst);
        assert!(
            one > ENTRY_OVERHEAD + 100,
            "an entry counts more than its body"
        );
        let capacity = 3 * one + one / 2;
        let cache = ReplayCache::with_capacity(capacity);
        for i in 0..5 {
            cache.mirror(
                &format!("k{i}"),
                &operation(State::Completed, Some(&body)),
                None,
            );
        }
        assert!(
            cache.answer("k0", &fp, 0).is_none(),
            "the oldest went first"
        );
        assert!(cache.answer("k4", &fp, 0).is_some());
        assert!(cache.bytes.load(Ordering::SeqCst) <= capacity);
        // Re-inserting a key replaces its entry; the bound still holds.
        cache.mirror("k4", &operation(State::Completed, Some(&body)), None);
        assert!(cache.bytes.load(Ordering::SeqCst) <= capacity);
        assert!(cache.answer("k4", &fp, 0).is_some());
    }
}
