//! One claimed attempt, run in a task of its own so that a client that hangs
//! up never cancels the upstream call nor leaves the operation `in_progress`
//! (ARCHITECTURE.md §1): forward, record, answer — and when the outcome is
//! lost, what comes after (docs/requests.md, "After a lost response"):
//!
//! 1. the route's pause latch is checked (`pause_after_unknown`), before the
//!    client is answered;
//! 2. the reconcile probe, if the route has one, runs once right away;
//! 3. the exchange is kept open for `late_window`: a late response settles
//!    the operation `completed` (evidence `late-response`) if it is still
//!    `unknown` and no probe found it more than once at the destination
//!    (then it is an operator's to settle), and is kept as an event either
//!    way;
//! 4. on a route with `resend_unknown`, the request is sent again as it was
//!    sent, under the same destination key (docs/requests.md, "A
//!    destination key"): at most `RESEND_TRIES` tries on the shared
//!    backoff, each only while the operation is still `unknown`, the route
//!    is not paused and the try can end within the destination key's
//!    window; an answer that would have completed the attempt settles it
//!    `completed` (evidence `resent`), anything else is an event.
//!
//! Steps 2 to 4 stop when the gateway starts shutting down: they only ever
//! upgrade what is held, so cutting them short loses no evidence. Step 4
//! needs the request with its credentials, which live in this task only: an
//! operation held by a restart or a lost replica is never re-sent.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use http::HeaderMap;
use serde_json::json;
use tokio::sync::oneshot;

use crate::config::DestinationKey;
use crate::metrics::OperationId;
use crate::pipeline::claim::InFlightGuard;
use crate::pipeline::forward::{self, Exchange, Late, WriteRequest};
use crate::pipeline::mcp;
use crate::pipeline::quota::StoredCharge;
use crate::pipeline::record::{self, AfterStale, Released, Reply, SettleGuard, Settled};
use crate::pipeline::{ActiveRoute, Shared, Write};
use crate::traces::{self, Step};
use idemgate_model::backoff::Backoff;
use idemgate_model::clock;
use idemgate_model::operation::{Event, Settlement, State, StoredResponse};
use idemgate_store::{Claim, DUPLICATED, LateEvidence, LateSource, Permit, Recorded};

/// Re-sends of an `unknown` operation under its destination key, at most.
const RESEND_TRIES: u32 = 6;

/// The wait before each re-send: the first within two seconds, then a
/// ceiling doubling up to a minute, fully jittered so that the operations
/// an outage held are not re-sent together.
const RESEND_BACKOFF: Backoff =
    Backoff::full_jitter(Duration::from_secs(2), Duration::from_secs(60));

/// One attempt, for its task: what is its own, and the proxy's shared
/// parts (the store, the replay cache, the clock, shutdown's tokens…)
/// held once, not copied.
pub struct Attempt {
    /// The proxy's: `stopping` (cancelled when shutdown starts) ends the
    /// probing and the listening late; `give_up` (the grace is over) the
    /// record retries.
    pub(super) shared: Arc<Shared>,
    pub(super) active: Arc<ActiveRoute>,
    pub(super) claim: Claim,
    /// The store's fence as it was before the claim: nothing is sent once
    /// it stops holding, nor after it lapsed, even if it holds again.
    pub(super) permit: Permit,
    /// The triggering request's credential headers, for a reconcile probe;
    /// in memory only.
    pub(super) credentials: HeaderMap,
    pub(super) request: WriteRequest,
    /// Dropped once the outcome is recorded, to wake waiting duplicates.
    pub(super) in_flight: Option<InFlightGuard>,
    /// The write's context: its key (for a probe), and its identity,
    /// fingerprint and exact digest (where a completed response goes in
    /// the replay cache, and what a stale record answers).
    pub(super) write: Write,
    /// Where the response it stores is counted, on a route with a byte
    /// quota.
    pub(super) quota: Option<StoredCharge>,
    /// An MCP tool call, counted in flight while this attempt runs: the
    /// upstream's answer settles it as JSON-RPC says for its id
    /// ([`mcp::outcome::settle`]).
    pub(super) call: Option<mcp::cancel::Pending>,
}

impl Attempt {
    /// Forwards, records, answers through `reply`, then follows up a loss.
    pub async fn run(mut self, reply: oneshot::Sender<Reply>) {
        let guard = SettleGuard::new(self.shared.store.clone(), self.claim.clone());
        let route = &self.active.route;
        let started = Instant::now();
        // Boxed: the exchange's futures are kilobytes, and would make the
        // whole attempt's future as large.
        let send = forward::send_write(
            &self.active.writes,
            route,
            &self.request,
            &self.permit,
            &self.shared.metrics,
            self.call.as_ref().and_then(mcp::cancel::Pending::events),
        );
        let exchange = async {
            let sent = match &self.active.drill {
                Some(drill) => Box::pin(drill.run(send)).await,
                None => Box::pin(send).await,
            };
            let (how, status) = sent.exchange.summary();
            traces::upstream_ended(sent.tries, how, status);
            sent
        };
        let mut sent = traces::child(Step::Upstream, exchange).await;
        // What the upstream said over HTTP, before an MCP call's reading.
        if let (_, Some(status)) = sent.exchange.summary() {
            self.active.series.upstream_answer(status);
        }
        if let Some(call) = &self.call {
            sent.exchange = mcp::outcome::settle(sent.exchange, &call.id, call.spoke());
        }
        self.active
            .series
            .upstream_duration(started.elapsed().as_secs_f64());

        let fenced = matches!(sent.exchange, Exchange::Fenced { .. });
        let Settled {
            settlement,
            events,
            reply: response,
            released,
        } = record::settle(
            &self.claim,
            sent.exchange,
            (sent.tries, self.request.body_len()),
            started.elapsed(),
        );
        let held = matches!(settlement, Settlement::Unknown { .. });
        traces::note_attempt(self.claim.attempt, settlement.state().as_str());
        // Not later than the store's own update time, so the cache never
        // outlives the stored operation.
        let recorded_at = self.shared.clock.now_millis();
        // The client may have hung up; the outcome is recorded regardless.
        let operation_id = OperationId(self.claim.operation_id.clone());
        let deliver = |response: Reply| {
            let response = response.map(|mut response| {
                response.extensions_mut().insert(operation_id);
                response
            });
            drop(reply.send(response));
        };
        if fenced {
            // Nothing was sent, whatever the store says later: the client
            // hears so at once, and the record (`not_attempted`, a
            // compare-and-set) goes on while the store is slow, as the
            // lease trouble suggests. Lost to a peer's `replica-lost`, it
            // settles what the peer held.
            deliver(response);
            drop(self.in_flight.take());
            let recorded = Box::pin(self.keep_recording(&settlement, &events)).await;
            if let Some(Recorded::Stale) = recorded {
                let operators = self.shared.operators.as_ref();
                Box::pin(record::settle_fenced(operators, &self.claim, &events)).await;
            }
            guard.disarm();
            return;
        }
        // Whether the store holds this attempt `unknown` once recorded, so
        // that a probe or a late response may settle it.
        let recorded = self.shared.store.record(&self.claim, &settlement, &events);
        let follow = match traces::child(Step::StoreRecord, recorded).await {
            Ok(Recorded::Applied) => {
                // The latch trips before the client hears of the loss, so
                // no write sent after that answer can slip past it.
                if held {
                    Box::pin(self.trip_pause_latch()).await;
                }
                self.hand_over(&settlement, released, recorded_at);
                deliver(response);
                held
            }
            Ok(Recorded::Stale) => {
                tracing::warn!(operation_id = %self.claim.operation_id, "the operation changed while its attempt was in flight");
                match Box::pin(self.after_stale(&settlement, recorded_at)).await {
                    AfterStale::SettledLate => {
                        deliver(response);
                        false
                    }
                    AfterStale::Stored { reply, held: still } => {
                        deliver(reply);
                        held && still
                    }
                }
            }
            Err(error) => {
                tracing::error!(operation_id = %self.claim.operation_id, %error, "cannot record the outcome; retrying");
                deliver(Err(record::unrecorded(&self.claim)));
                match Box::pin(self.keep_recording(&settlement, &events)).await {
                    // Recorded late, handed over as if at once: a released
                    // answer to the waiters (who send nothing), a
                    // completion to the cache and the quota.
                    Some(Recorded::Applied) => {
                        if held {
                            Box::pin(self.trip_pause_latch()).await;
                        }
                        self.hand_over(&settlement, released, recorded_at);
                        held
                    }
                    // Its client heard 503 already; what the store holds
                    // still follows the one rule, with the window measured
                    // from when the response came, not from when the
                    // store answered again.
                    Some(Recorded::Stale) => {
                        match Box::pin(self.after_stale(&settlement, recorded_at)).await {
                            AfterStale::SettledLate => false,
                            AfterStale::Stored { held: still, .. } => held && still,
                        }
                    }
                    None => false,
                }
            }
        };
        guard.disarm();
        // The paths after a loss are boxed (rare, and their futures large):
        // inline, every attempt's future would be their size.
        if follow {
            Box::pin(self.follow_up(sent.late)).await;
        }
    }

    /// [`record::after_stale`] for this attempt's `settlement`, whose
    /// outcome came back at `arrived` (ms): the late-response window is
    /// measured from then, however long the record took to be refused. A
    /// late settlement is handed over as a recorded completion is.
    async fn after_stale(&mut self, settlement: &Settlement, arrived: i64) -> AfterStale {
        let after = record::after_stale(
            (self.shared.store.as_ref(), self.shared.operators.as_ref()),
            &self.claim,
            settlement,
            &self.write.fingerprint,
            self.active.route.late_window,
            arrived,
        )
        .await;
        if let AfterStale::SettledLate = after {
            tracing::info!(operation_id = %self.claim.operation_id, "a response that came after a peer held the operation settled it");
            self.hand_over(settlement, None, arrived);
        }
        after
    }

    /// Records `settlement` in the background of a client already
    /// answered ([`record::keep_recording`]).
    async fn keep_recording(&self, settlement: &Settlement, events: &[Event]) -> Option<Recorded> {
        record::keep_recording(
            self.shared.store.as_ref(),
            &self.claim,
            settlement,
            events,
            &self.shared.shutdown.give_up,
        )
        .await
    }

    /// What the duplicates of this attempt see once its outcome is
    /// recorded, while the in-flight guard still holds the identity: a
    /// completed response goes to the replay cache if a duplicate came
    /// meanwhile (a later retry is answered from the store, and cached
    /// then); a released attempt's answer goes to its waiters, who send
    /// nothing.
    fn hand_over(&mut self, settlement: &Settlement, released: Option<Released>, recorded_at: i64) {
        if let Settlement::Completed { response } = settlement {
            if let Some(quota) = &self.quota {
                quota.count(&self.active.route, response, recorded_at);
            }
            if self
                .in_flight
                .as_ref()
                .is_some_and(InFlightGuard::duplicated)
            {
                self.shared.replays.insert(
                    &self.write.identity,
                    &self.claim.operation_id,
                    (&self.write.fingerprint, Some(self.write.exact)),
                    response,
                    recorded_at,
                );
            }
        }
        if let (Some(released), Some(guard)) = (released, self.in_flight.take()) {
            guard.release(&self.claim.operation_id, released);
        }
    }

    async fn follow_up(mut self, late: Option<Late>) {
        // Waiters see the operation `unknown` now; a probe or a late response
        // may still settle it for their next retry.
        drop(self.in_flight.take());
        let route = &self.active.route;
        let clock = self.shared.clock.as_ref();
        self.shared
            .landing
            .may_land_for(&self.claim.operation_id, route.late_window, clock);
        // When the loss was, by both clocks: a re-send's window is judged
        // on the monotonic one from here.
        let lost_at = (clock.monotonic_millis(), clock.now_millis());
        let ctx = self.shared.probe_ctx();
        let probe = self.shared.reconciler.reconcile(
            &ctx,
            &self.active,
            &self.claim.operation_id,
            self.write.key.as_str(),
            &self.credentials,
        );
        let late = async {
            if let Some(late) = late
                && let Ok(exchange) = tokio::time::timeout(route.late_window, late).await
            {
                traces::child(Step::LateResponse, self.record_late(exchange)).await;
            }
        };
        let resend = async {
            if let Some(destination) = &route.destination_key
                && destination.resend_unknown
            {
                self.resend_unknown(destination, lost_at).await;
            }
        };
        tokio::select! {
            _ = self.shared.shutdown.stopping.cancelled() => {}
            _ = async { tokio::join!(probe, late, resend) } => {}
        }
    }

    /// Step 4: the request sent again under its destination key until an
    /// answer settles the operation, it is settled otherwise, the tries run
    /// out or the next try could end past the destination key's window.
    async fn resend_unknown(&self, destination: &DestinationKey, lost_at: (i64, i64)) {
        let Some(window) = destination.window else {
            return;
        };
        let (store, route) = (self.shared.store.as_ref(), &self.active.route);
        let id = &self.claim.operation_id;
        // The window's end by the monotonic clock too, from what the wall
        // clock left of it at the loss: a clock stepped back since would
        // otherwise stretch it by the step.
        let window_ms = clock::millis(window);
        let mut window_left = None;
        for n in 0..RESEND_TRIES {
            tokio::time::sleep(RESEND_BACKOFF.delay(n)).await;
            let held = match self.shared.operators.get(id).await {
                Ok(Some((operation, _))) => operation,
                Ok(None) => return,
                Err(error) => {
                    tracing::warn!(operation_id = %id, %error, "cannot read a held operation before re-sending it");
                    continue;
                }
            };
            // Settled, or found more than once: a destination that did not
            // deduplicate is sent nothing more.
            if held.state != State::Unknown || held.evidence == DUPLICATED {
                return;
            }
            let writing = forward::longest_write(route);
            let ends_by = self.shared.clock.now_millis() + clock::millis(writing);
            let left = *window_left.get_or_insert_with(|| {
                let end = held.created_at.saturating_add(window_ms);
                end.saturating_sub(lost_at.1)
            });
            let since = self.shared.clock.monotonic_millis() - lost_at.0;
            let past = since.saturating_add(clock::millis(writing)) > left;
            if past || ends_by > held.created_at.saturating_add(window_ms) {
                let detail = json!({ "skipped": "past the destination key's window" });
                return self.add_event(&resend_event(n, detail)).await;
            }
            if self.active.paused.load(Ordering::SeqCst) {
                let detail = json!({ "skipped": "the route is paused" });
                self.add_event(&resend_event(n, detail)).await;
                continue;
            }
            // On the timeline before anything is sent: a probe meanwhile
            // counts the write as on its way from here (reconcile's
            // `last_sent`), so it never takes a re-send in flight for an
            // absence.
            self.add_event(&resend_event(n, json!({ "sending": true })))
                .await;
            let clock = self.shared.clock.as_ref();
            let window = writing + route.late_window;
            self.shared.landing.may_land_for(id, window, clock);
            let sent = forward::send_write(
                &self.active.writes,
                route,
                &self.request,
                &self.permit,
                &self.shared.metrics,
                None,
            )
            .await;
            let fenced = matches!(sent.exchange, Exchange::Fenced { .. });
            let response = match resend_arrival(self.answered(sent.exchange)) {
                LateArrival::Settles(response) => response,
                LateArrival::Evidence { detail, .. } => {
                    self.add_event(&resend_event(n, detail)).await;
                    if fenced {
                        return;
                    }
                    continue;
                }
            };
            let detail = json!({ "status": response.status, "settles": true });
            let resent = LateEvidence {
                operation_id: id.clone(),
                source: LateSource::Resent,
                event: resend_event(n, detail),
                response,
            };
            match store.settle_held(&resent).await {
                Ok(settled) => {
                    tracing::info!(operation_id = %id, settled, "a re-send under the destination key was answered");
                    if settled && let Some(quota) = &self.quota {
                        let now = self.shared.clock.now_millis();
                        quota.count(route, &resent.response, now);
                    }
                    return;
                }
                Err(error) => {
                    tracing::warn!(operation_id = %id, %error, "cannot record a re-send's answer")
                }
            }
        }
    }

    /// An exchange as this attempt's protocol reads it: an MCP tool call's
    /// by what JSON-RPC says for its id.
    fn answered(&self, exchange: Exchange) -> Exchange {
        match &self.call {
            Some(call) => mcp::outcome::settle(exchange, &call.id, call.spoke()),
            None => exchange,
        }
    }

    async fn trip_pause_latch(&self) {
        let route = &self.active.route;
        if route.pause_after_unknown == 0 {
            return;
        }
        match self
            .shared
            .store
            .trip_pause_latch(&route.name, route.pause_after_unknown)
            .await
        {
            Ok(true) if !self.active.paused.swap(true, Ordering::SeqCst) => {
                tracing::warn!(route = %route.name, threshold = route.pause_after_unknown, "route paused: too many operations unknown");
                let event = Event {
                    kind: "route-paused",
                    detail: json!({ "route": route.name, "unknown_at_least": route.pause_after_unknown }),
                };
                self.add_event(&event).await;
            }
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(route = %route.name, %error, "cannot check the pause latch")
            }
        }
    }

    /// A response that came after the operation was held.
    async fn record_late(&self, exchange: Exchange) {
        let response = match late_arrival(self.answered(exchange)) {
            LateArrival::Settles(response) => response,
            LateArrival::Evidence { detail, counted } => {
                if counted {
                    self.shared.metrics.late_response(&self.active.route.name);
                }
                let event = Event {
                    kind: "late-response",
                    detail,
                };
                return self.add_event(&event).await;
            }
        };
        let late = LateEvidence {
            operation_id: self.claim.operation_id.clone(),
            source: LateSource::LateResponse {
                attempt: self.claim.attempt,
            },
            event: Event {
                kind: "late-response",
                detail: json!({ "status": response.status, "attempt": self.claim.attempt }),
            },
            response,
        };
        match self.shared.store.settle_held(&late).await {
            Ok(true) => {
                traces::late_ended(true);
                if let Some(quota) = &self.quota {
                    quota.count(
                        &self.active.route,
                        &late.response,
                        self.shared.clock.now_millis(),
                    );
                }
                tracing::info!(operation_id = %self.claim.operation_id, "a late response settled an unknown operation")
            }
            Ok(false) => {
                traces::late_ended(false);
                self.shared.metrics.late_response(&self.active.route.name);
                tracing::info!(operation_id = %self.claim.operation_id, "a late response came after the operation was settled, or found more than once at the destination; kept as an event")
            }
            Err(error) => {
                tracing::warn!(operation_id = %self.claim.operation_id, %error, "cannot record a late response")
            }
        }
    }

    async fn add_event(&self, event: &Event) {
        if let Err(error) = self
            .shared
            .store
            .add_event(&self.claim.operation_id, event)
            .await
        {
            tracing::warn!(operation_id = %self.claim.operation_id, %error, "cannot record an event");
        }
    }
}

/// What an exchange that ended after its operation was held can do.
#[derive(Debug)]
enum LateArrival {
    /// A whole response (its body kept, or too large to keep): it settles
    /// the operation `completed` if the store still holds this attempt
    /// `unknown`.
    Settles(StoredResponse),
    /// Kept in the timeline only; `counted`: a response did come (a
    /// `late_response` in the metrics), if not one that settles.
    Evidence {
        detail: serde_json::Value,
        counted: bool,
    },
}

/// The one rule for a late exchange: only a response of the kind that
/// would have completed the attempt settles it; a status that releases or
/// holds a write proves nothing about the held one.
fn late_arrival(exchange: Exchange) -> LateArrival {
    match exchange {
        Exchange::Complete { head, body } => {
            LateArrival::Settles(record::stored_response(&head, Some(body.to_vec())))
        }
        Exchange::Oversized { head, .. } => {
            LateArrival::Settles(record::stored_response(&head, None))
        }
        Exchange::Classified { head, .. } | Exchange::Released { head, .. } => {
            LateArrival::Evidence {
                detail: json!({ "status": head.status.as_u16(), "settles": false }),
                counted: true,
            }
        }
        Exchange::Fenced { .. } => LateArrival::Evidence {
            detail: json!({ "error": "not written: this gateway no longer held its lease" }),
            counted: false,
        },
        Exchange::Lost { reason, .. }
        | Exchange::NotSent { reason, .. }
        | Exchange::Busy { reason, .. } => LateArrival::Evidence {
            detail: json!({ "error": reason }),
            counted: false,
        },
    }
}

/// A re-send's answer: as a late one's ([`late_arrival`]), except that a
/// 409 or a 425 settles nothing — the destination saying it is still
/// working on the first request under the key, as Stripe's does.
fn resend_arrival(exchange: Exchange) -> LateArrival {
    match late_arrival(exchange) {
        LateArrival::Settles(response) if matches!(response.status, 409 | 425) => {
            LateArrival::Evidence {
                detail: json!({ "status": response.status, "settles": false }),
                counted: false,
            }
        }
        arrival => arrival,
    }
}

/// The timeline entry of re-send `n` (0-based), with what came of it.
fn resend_event(n: u32, mut detail: serde_json::Value) -> Event {
    if let Some(members) = detail.as_object_mut() {
        members.insert("try".into(), json!(n + 1));
    }
    Event {
        kind: "resend",
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::forward::LostCause;
    use bytes::Bytes;

    fn head(status: u16) -> http::response::Parts {
        let response = http::Response::builder().status(status).header("x-a", "1");
        response.body(()).unwrap().into_parts().0
    }

    fn evidence(exchange: Exchange) -> (serde_json::Value, bool) {
        match late_arrival(exchange) {
            LateArrival::Evidence { detail, counted } => (detail, counted),
            settles => panic!("{settles:?} settles"),
        }
    }

    #[test]
    fn a_late_whole_response_settles_with_what_it_said() {
        let late = Exchange::Complete {
            head: head(201),
            body: Bytes::from_static(b"{}"),
        };
        let LateArrival::Settles(response) = late_arrival(late) else {
            panic!("a whole response does not settle");
        };
        assert_eq!(response.status, 201);
        assert_eq!(response.headers, [("x-a".into(), b"1".to_vec())]);
        assert_eq!(response.body.as_deref(), Some(&b"{}"[..]));
    }

    #[test]
    fn a_late_release_status_is_counted_but_settles_nothing() {
        let late = Exchange::Released {
            head: head(503),
            body: Bytes::new(),
        };
        assert_eq!(
            evidence(late),
            (json!({ "status": 503, "settles": false }), true)
        );
    }

    #[test]
    fn a_late_failure_is_evidence_only() {
        let lost = Exchange::Lost {
            cause: LostCause::Broken,
            reason: "reset".into(),
        };
        assert_eq!(evidence(lost), (json!({ "error": "reset" }), false));
        let not_sent = Exchange::NotSent {
            attempts: 1,
            reason: "refused".into(),
        };
        assert_eq!(evidence(not_sent), (json!({ "error": "refused" }), false));
        let (detail, counted) = evidence(Exchange::Fenced { attempts: 1 });
        assert!(!counted && detail["error"].as_str().unwrap().contains("lease"));
    }
}
