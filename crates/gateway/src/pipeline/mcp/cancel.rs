//! A client that goes away does not cancel a protected call (docs/mcp.md,
//! "A client that goes away").
//!
//! Under 2025-11-25 a client that stops waiting (its timeout) sends
//! `notifications/cancelled` for the call's request id, and the server
//! stops the tool — perhaps halfway through its effect. For a protected
//! call in flight, the gateway takes that notification itself (202) and
//! sends nothing on: the call goes on upstream and into the store, so the
//! agent's retry gets its real result. Under 2026-07-28 the cancellation
//! is the client closing its stream, which never reaches the upstream:
//! the call runs in a task of its own.
//!
//! A 2025-11-25 client that is done ends its session with a DELETE, and
//! the server cancels what the session still runs: a DELETE of a session
//! with protected calls in flight is answered at once and sent on once
//! they have ended.
//!
//! Invariants: a cancellation is kept from the upstream only while the
//! call it names (by session and request id, a number by its value) is
//! in flight here, alone (taken) or in a batch (refused whole, as a batch
//! holding a call is); any other one is sent on. A session's DELETE is held
//! back only while one of its calls is in flight, and never past the
//! bound its caller sets.

use std::sync::Arc;

use std::time::Duration;

use dashmap::DashMap;
use http::HeaderMap;
use serde_json::Value;
use tokio::sync::Notify;

use crate::pipeline::forward::EventAnswer;
use crate::pipeline::mcp::call::id_key;
use crate::pipeline::mcp::relay::{CallEvents, Relay};

/// Protected calls in flight on a route, by session and request id.
#[derive(Debug, Default)]
pub struct InFlightCalls {
    calls: DashMap<(String, String), usize>,
    /// Told each time a call ends.
    ended: Notify,
    /// Sessions whose DELETE is held back: one each, however many come.
    ending: DashMap<String, ()>,
}

/// A call counted in flight until dropped.
#[derive(Debug)]
pub struct Tracked {
    calls: Arc<InFlightCalls>,
    key: (String, String),
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.calls.calls.remove_if_mut(&self.key, |_, count| {
            *count -= 1;
            *count == 0
        });
        self.calls.ended.notify_waiters();
    }
}

/// A protected call on its way: its request id, where what its server
/// sends before the response is relayed (when the client takes an event
/// stream), and its place in flight.
#[derive(Debug)]
pub struct Pending {
    pub(crate) id: Value,
    relay: Option<Relay>,
    _tracked: Tracked,
}

impl Pending {
    /// Whether the server already sent a message for this call before its
    /// response (relayed): it had begun on it.
    pub fn spoke(&self) -> bool {
        self.relay.as_ref().is_some_and(Relay::spoke)
    }

    /// How the call's answer is read when it is an event stream: for its
    /// response, the rest relayed.
    pub fn events(&self) -> Option<Box<dyn EventAnswer>> {
        let relay = self.relay.clone()?;
        Some(Box::new(CallEvents {
            id: self.id.clone(),
            relay,
        }))
    }
}

impl InFlightCalls {
    /// Counts the call `id` of the request with `headers` in flight, for as
    /// long as the returned [`Pending`] lives.
    pub fn track(
        self: &Arc<Self>,
        headers: &HeaderMap,
        id: &Value,
        relay: Option<Relay>,
    ) -> Pending {
        let key = (session(headers), id_key(id));
        *self.calls.entry(key.clone()).or_default() += 1;
        Pending {
            id: id.clone(),
            relay,
            _tracked: Tracked {
                calls: self.clone(),
                key,
            },
        }
    }

    /// What `body`, POSTed in the session of `headers`, is to the calls
    /// in flight there: a `notifications/cancelled` for one, alone or in
    /// a batch, or nothing to them.
    pub fn cancelling(&self, headers: &HeaderMap, body: &[u8]) -> Cancelling {
        let Ok(message) = serde_json::from_slice::<Value>(body) else {
            return Cancelling::Nothing;
        };
        let session = session(headers);
        match &message {
            Value::Array(batch) if batch.iter().any(|m| self.cancels(&session, m)) => {
                Cancelling::InBatch
            }
            message if self.cancels(&session, message) => Cancelling::Alone,
            _ => Cancelling::Nothing,
        }
    }

    /// Whether `message` is a `notifications/cancelled` for a call in
    /// flight in `session`.
    fn cancels(&self, session: &str, message: &Value) -> bool {
        if message.get("method").and_then(Value::as_str) != Some("notifications/cancelled") {
            return false;
        }
        let Some(id) = message.pointer("/params/requestId") else {
            return false;
        };
        self.calls.contains_key(&(session.to_string(), id_key(id)))
    }
}

/// What a POST is to the protected calls in flight
/// ([`InFlightCalls::cancelling`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancelling {
    /// It cancels none: sent on as it came.
    Nothing,
    /// A `notifications/cancelled` for one: the gateway takes it (202),
    /// and nothing is sent on.
    Alone,
    /// A batch holding one: refused whole, nothing sent. The revisions the
    /// route speaks have no batches (2025-06-18 removed them), so this is
    /// what a server of theirs may answer any batch; the call runs on.
    InBatch,
}

impl InFlightCalls {
    /// Whether the session of `headers` (a 2025-11-25 one) has a call in
    /// flight.
    pub fn session_busy(&self, headers: &HeaderMap) -> bool {
        let session = session(headers);
        !session.is_empty() && self.calls.iter().any(|entry| entry.key().0 == session)
    }

    /// Holds back the DELETE of the session of `headers`: `None` when one
    /// already is (this one is answered and dropped: the first goes on).
    pub fn hold_end(self: &Arc<Self>, headers: &HeaderMap) -> Option<HeldEnd> {
        let session = session(headers);
        match self.ending.entry(session.clone()) {
            dashmap::mapref::entry::Entry::Occupied(_) => None,
            dashmap::mapref::entry::Entry::Vacant(vacant) => {
                vacant.insert(());
                Some(HeldEnd {
                    calls: self.clone(),
                    session,
                })
            }
        }
    }

    /// Returns once the session of `headers` has no call in flight, or
    /// after `bound`.
    pub async fn session_idle(&self, headers: &HeaderMap, bound: Duration) {
        let wait = async {
            loop {
                let ended = self.ended.notified();
                if !self.session_busy(headers) {
                    return;
                }
                ended.await;
            }
        };
        let _ = tokio::time::timeout(bound, wait).await;
    }
}

/// A session's DELETE held back, until dropped.
#[derive(Debug)]
pub struct HeldEnd {
    calls: Arc<InFlightCalls>,
    session: String,
}

impl Drop for HeldEnd {
    fn drop(&mut self) {
        self.calls.ending.remove(&self.session);
    }
}

/// The request's 2025-11-25 session, `""` without one.
fn session(headers: &HeaderMap) -> String {
    headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_session(id: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("mcp-session-id", id.parse().unwrap());
        headers
    }

    const CANCEL_7: &[u8] =
        br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7}}"#;

    #[test]
    fn only_a_call_in_flight_keeps_its_cancellation() {
        let calls = Arc::new(InFlightCalls::default());
        let (a, b) = (in_session("a"), in_session("b"));
        let taken =
            |headers: &HeaderMap, body: &[u8]| calls.cancelling(headers, body) == Cancelling::Alone;
        assert!(!taken(&a, CANCEL_7));
        let first = calls.track(&a, &Value::from(7.0), None);
        let again = calls.track(&a, &Value::from(7), None);
        assert!(taken(&a, CANCEL_7));
        // Another session's request 7, or request "7", is another call.
        assert!(!taken(&b, CANCEL_7));
        let quoted =
            br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"7"}}"#;
        assert!(!taken(&a, quoted));
        drop(first);
        assert!(taken(&a, CANCEL_7));
        drop(again);
        assert!(!taken(&a, CANCEL_7));
    }

    #[test]
    fn a_batch_cancelling_a_call_in_flight_is_told_apart() {
        let calls = Arc::new(InFlightCalls::default());
        let a = in_session("a");
        let cancel = std::str::from_utf8(CANCEL_7).unwrap();
        let ping = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
        let batch = format!("[{ping},{cancel}]");
        assert_eq!(calls.cancelling(&a, batch.as_bytes()), Cancelling::Nothing);
        let _call = calls.track(&a, &Value::from(7), None);
        assert_eq!(calls.cancelling(&a, batch.as_bytes()), Cancelling::InBatch);
        let alone = format!("[{cancel}]");
        assert_eq!(calls.cancelling(&a, alone.as_bytes()), Cancelling::InBatch);
        assert_eq!(
            calls.cancelling(&in_session("b"), batch.as_bytes()),
            Cancelling::Nothing
        );
        let other = format!("[{ping}]");
        assert_eq!(calls.cancelling(&a, other.as_bytes()), Cancelling::Nothing);
    }

    #[test]
    fn one_delete_is_held_back_per_session() {
        let calls = Arc::new(InFlightCalls::default());
        let (a, b) = (in_session("a"), in_session("b"));
        let held = calls.hold_end(&a).expect("the first is held");
        assert!(calls.hold_end(&a).is_none(), "a second adds nothing");
        assert!(calls.hold_end(&b).is_some(), "another session's is its own");
        drop(held);
        assert!(calls.hold_end(&a).is_some());
    }
}
