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
//! Calls in flight when this process restarted, or on a peer replica
//! found lost, are no longer known here by session or id, but may still
//! be running at their servers: for as long as one may, every
//! cancellation on the route is taken and every DELETE held back
//! ([`InFlightCalls::recovered`]). A read-only call a client cancels then
//! runs to its end, which costs its server nothing it was not asked for.
//!
//! Invariants: a cancellation is kept from the upstream only while the
//! call it names (by its [`Caller`] and request id, as servers correlate
//! them) is in flight here, or while recovered calls may run, alone
//! (taken) or in a batch (refused whole, as a batch holding a call is);
//! any other one is sent on. A session's DELETE is held back only while
//! one of its calls is in flight, or recovered calls may run, and never
//! past the bound its caller sets.

use std::sync::{Arc, Mutex};

use std::time::Duration;

use dashmap::DashMap;
use http::HeaderMap;
use serde_json::Value;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::pipeline::forward::EventAnswer;
use crate::pipeline::mcp::call::id_key;
use crate::pipeline::mcp::relay::{CallEvents, Relay};

/// Whose calls a request's are: its 2025-11-25 session's, or without a
/// session its scope's (the keyed digest of the credentials it is sent
/// with), so that one client's cancellation never names another client's
/// call of the same request id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Caller {
    Session(String),
    Scope(String),
}

impl Caller {
    /// The caller of a request with `headers`, whose scope is `scope`
    /// (which names it when it has no session).
    pub fn of(headers: &HeaderMap, scope: String) -> Caller {
        match session(headers) {
            Some(session) => Caller::Session(session),
            None => Caller::Scope(scope),
        }
    }
}

/// Protected calls in flight on a route, by caller and request id.
#[derive(Debug, Default)]
pub struct InFlightCalls {
    calls: DashMap<(Caller, String), usize>,
    /// Told each time a call ends.
    ended: Notify,
    /// Sessions whose DELETE is held back: one each, however many come.
    ending: DashMap<String, ()>,
    /// Until when calls marked `unknown` in flight (a restart, a lost
    /// peer) may still run at their servers.
    recovered: Mutex<Option<Instant>>,
}

/// A call counted in flight until dropped.
#[derive(Debug)]
pub struct Tracked {
    calls: Arc<InFlightCalls>,
    key: (Caller, String),
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
    /// Counts `caller`'s call `id` in flight, for as long as the returned
    /// [`Pending`] lives.
    pub fn track(self: &Arc<Self>, caller: Caller, id: &Value, relay: Option<Relay>) -> Pending {
        let key = (caller, correlated(id));
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

    /// What `body`, POSTed by `caller`, is to its calls in flight: a
    /// `notifications/cancelled` for one, alone or in a batch, or nothing
    /// to them.
    pub fn cancelling(&self, caller: &Caller, body: &[u8]) -> Cancelling {
        let Ok(message) = serde_json::from_slice::<Value>(body) else {
            return Cancelling::Nothing;
        };
        match &message {
            Value::Array(batch) if batch.iter().any(|m| self.cancels(caller, m)) => {
                Cancelling::InBatch
            }
            message if self.cancels(caller, message) => Cancelling::Alone,
            _ => Cancelling::Nothing,
        }
    }

    /// Whether `message` is a `notifications/cancelled` for a call of
    /// `caller`'s in flight, or for any call while recovered ones may run.
    fn cancels(&self, caller: &Caller, message: &Value) -> bool {
        if message.get("method").and_then(Value::as_str) != Some("notifications/cancelled") {
            return false;
        }
        let Some(id) = message.pointer("/params/requestId") else {
            return false;
        };
        self.recovering().is_some() || self.calls.contains_key(&(caller.clone(), correlated(id)))
    }

    /// Calls of the route were marked `unknown` in flight and may run at
    /// their servers for `running` yet: until then, cancellations are
    /// taken and DELETEs held back.
    pub fn recovered(&self, running: Duration) {
        let until = Instant::now() + running;
        let mut recovered = self.recovered.lock().unwrap_or_else(|e| e.into_inner());
        *recovered = Some(recovered.map_or(until, |earlier| earlier.max(until)));
    }

    /// Until when recovered calls may still run, if they may now.
    fn recovering(&self) -> Option<Instant> {
        let recovered = self.recovered.lock().unwrap_or_else(|e| e.into_inner());
        recovered.filter(|until| *until > Instant::now())
    }
}

/// `id` as the servers a call may reach correlate it, the cancellation's
/// `requestId` with the call's: a number by its value ([`id_key`]), and a
/// string that reads as a number as that number — the Python SDK takes
/// `"7"` (and `" 07 "`, `"+7"`, `"7_0"` for 70: Python's `int`) for the
/// call `7`, and `"7"` for a call `"7"` by the same rule. Reading more
/// strings as one id than a server does only means a cancellation the
/// gateway takes itself (the call runs on); reading fewer sent one on.
fn correlated(id: &Value) -> String {
    let number = id.as_str().and_then(|text| {
        let loose: String = text.trim().chars().filter(|c| *c != '_').collect();
        loose.parse::<f64>().ok().filter(|n| n.is_finite())
    });
    match number {
        Some(number) => id_key(&Value::from(number)),
        None => id_key(id),
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
    /// flight, or may have one recovered.
    pub fn session_busy(&self, headers: &HeaderMap) -> bool {
        let Some(session) = session(headers) else {
            return false;
        };
        if self.recovering().is_some() {
            return true;
        }
        let caller = Caller::Session(session);
        self.calls.iter().any(|entry| entry.key().0 == caller)
    }

    /// Holds back the DELETE of the session of `headers`: `None` when one
    /// already is (this one is answered and dropped: the first goes on).
    pub fn hold_end(self: &Arc<Self>, headers: &HeaderMap) -> Option<HeldEnd> {
        let session = session(headers).unwrap_or_default();
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
                if let Some(until) = self.recovering() {
                    tokio::time::sleep_until(until).await;
                    continue;
                }
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

/// The request's 2025-11-25 session, if it names one.
fn session(headers: &HeaderMap) -> Option<String> {
    headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .filter(|session| !session.is_empty())
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_session(id: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("mcp-session-id", id.parse().unwrap());
        headers
    }

    fn session_of(id: &str) -> Caller {
        Caller::of(&in_session(id), "its scope".into())
    }

    const CANCEL_7: &[u8] =
        br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7}}"#;

    #[test]
    fn only_a_call_in_flight_keeps_its_cancellation() {
        let calls = Arc::new(InFlightCalls::default());
        let (a, b) = (session_of("a"), session_of("b"));
        let taken =
            |caller: &Caller, body: &[u8]| calls.cancelling(caller, body) == Cancelling::Alone;
        assert!(!taken(&a, CANCEL_7));
        let first = calls.track(a.clone(), &Value::from(7.0), None);
        let again = calls.track(a.clone(), &Value::from(7), None);
        assert!(taken(&a, CANCEL_7));
        // Another session's request 7 is another call.
        assert!(!taken(&b, CANCEL_7));
        drop(first);
        assert!(taken(&a, CANCEL_7));
        drop(again);
        assert!(!taken(&a, CANCEL_7));
    }

    /// The Python SDK's server takes `"7"` for request 7 (and the
    /// reverse): a cancellation spelled so stopped the call the gateway
    /// had been told it would take.
    #[test]
    fn a_cancellation_names_its_call_as_a_server_correlates_ids() {
        let calls = Arc::new(InFlightCalls::default());
        let a = session_of("a");
        let cancel = |id: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{id}}}}}"#
            )
        };
        let taken = |id: &str| calls.cancelling(&a, cancel(id).as_bytes()) == Cancelling::Alone;
        let number = calls.track(a.clone(), &Value::from(7), None);
        for same in ["7", "7.0", r#""7""#, r#"" 07 ""#, r#""+7""#, r#""7.0""#] {
            assert!(taken(same), "{same}");
        }
        for other in ["8", r#""7a""#, r#""x""#, "\"\"", r#""70""#] {
            assert!(!taken(other), "{other}");
        }
        drop(number);
        let text = calls.track(a.clone(), &Value::from("5"), None);
        assert!(taken("5") && taken(r#""5""#) && taken(r#""05""#));
        drop(text);
        let word = calls.track(a.clone(), &Value::from("req-1"), None);
        assert!(taken(r#""req-1""#) && !taken(r#""req-2""#));
        drop(word);
        assert!(!taken(r#""req-1""#));
    }

    /// Calls marked `unknown` in flight are not known by session or id:
    /// while they may run, every cancellation is taken and every DELETE
    /// waits; then neither is.
    #[tokio::test(start_paused = true)]
    async fn recovered_calls_keep_what_would_stop_them_while_they_may_run() {
        let calls = Arc::new(InFlightCalls::default());
        let (a, session) = (session_of("a"), in_session("a"));
        assert_eq!(calls.cancelling(&a, CANCEL_7), Cancelling::Nothing);
        assert!(!calls.session_busy(&session));
        calls.recovered(Duration::from_secs(90));
        calls.recovered(Duration::from_secs(30));
        assert_eq!(calls.cancelling(&a, CANCEL_7), Cancelling::Alone);
        assert!(calls.session_busy(&session));
        let start = Instant::now();
        calls.session_idle(&session, Duration::from_secs(600)).await;
        assert_eq!(start.elapsed(), Duration::from_secs(90), "the longer");
        assert_eq!(calls.cancelling(&a, CANCEL_7), Cancelling::Nothing);
        assert!(!calls.session_busy(&session));
    }

    #[test]
    fn a_batch_cancelling_a_call_in_flight_is_told_apart() {
        let calls = Arc::new(InFlightCalls::default());
        let a = session_of("a");
        let cancel = std::str::from_utf8(CANCEL_7).unwrap();
        let ping = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
        let batch = format!("[{ping},{cancel}]");
        assert_eq!(calls.cancelling(&a, batch.as_bytes()), Cancelling::Nothing);
        let _call = calls.track(a.clone(), &Value::from(7), None);
        assert_eq!(calls.cancelling(&a, batch.as_bytes()), Cancelling::InBatch);
        let alone = format!("[{cancel}]");
        assert_eq!(calls.cancelling(&a, alone.as_bytes()), Cancelling::InBatch);
        assert_eq!(
            calls.cancelling(&session_of("b"), batch.as_bytes()),
            Cancelling::Nothing
        );
        let other = format!("[{ping}]");
        assert_eq!(calls.cancelling(&a, other.as_bytes()), Cancelling::Nothing);
    }

    /// Without a session, a client's cancellation names its own calls
    /// only: another client's call of the same id runs on untouched, and
    /// its own is still taken.
    #[test]
    fn without_a_session_a_cancellation_names_its_scopes_calls() {
        let calls = Arc::new(InFlightCalls::default());
        let (alice, bob) = (
            Caller::of(&HeaderMap::new(), "scope-alice".into()),
            Caller::of(&HeaderMap::new(), "scope-bob".into()),
        );
        let _call = calls.track(alice.clone(), &Value::from(7), None);
        assert_eq!(calls.cancelling(&bob, CANCEL_7), Cancelling::Nothing);
        assert_eq!(calls.cancelling(&alice, CANCEL_7), Cancelling::Alone);
        assert!(!calls.session_busy(&HeaderMap::new()));
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
