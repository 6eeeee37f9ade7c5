//! The alert deliveries a deliverer has in flight (being posted, or
//! settled), and the bounds that keep a hung webhook from holding up the
//! others: each post may wait up to its 10 s bound, and meanwhile the
//! other endpoints' deliveries keep being taken and posted.
//!
//! - An endpoint with [`PER_ENDPOINT`] deliveries in flight is handed no
//!   more until one of them ends ([`InFlight::busy`]). One poll takes at
//!   most a batch, so an endpoint has fewer than `PER_ENDPOINT` and a
//!   batch in flight.
//! - All endpoints together have at most [`MAX`] ([`InFlight::room`]).
//! - A delivery is in flight from [`InFlight::start`] until its [`Ticket`]
//!   is dropped (settled, or its task aborted), and at most once: one the
//!   store hands out again while it is still in flight here (its lease ran
//!   out under a slow settle, or the clock jumped) is not posted twice.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use idemgate_store::AlertDelivery;

/// Deliveries in flight to one endpoint past which it is handed no more:
/// enough to keep up with a webhook that answers (a poll every 0.5 s),
/// few enough that a hung one holds a small share of [`MAX`].
pub(crate) const PER_ENDPOINT: usize = 8;
/// Deliveries in flight to all endpoints together, at most: connections
/// open at once for alerts.
pub(crate) const MAX: usize = 128;

/// A delivery as the store knows it: its alert and its endpoint.
type Key = (i64, String);

/// The deliveries in flight, shared by the deliverer and its posts' tasks.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    deliveries: Mutex<HashSet<Key>>,
}

/// A delivery in flight until this is dropped.
#[must_use = "the delivery is in flight only while its ticket lives"]
#[derive(Debug)]
pub(crate) struct Ticket {
    in_flight: Arc<InFlight>,
    key: Key,
}

impl InFlight {
    /// Puts `delivery` in flight; `None` when it already is.
    pub(crate) fn start(self: &Arc<Self>, delivery: &AlertDelivery) -> Option<Ticket> {
        let key = (delivery.alert_id, delivery.endpoint.clone());
        self.deliveries().insert(key.clone()).then(|| Ticket {
            in_flight: self.clone(),
            key,
        })
    }

    /// How many are in flight.
    pub(crate) fn len(&self) -> usize {
        self.deliveries().len()
    }

    /// How many more may be started.
    pub(crate) fn room(&self) -> usize {
        MAX.saturating_sub(self.len())
    }

    /// The endpoints with [`PER_ENDPOINT`] in flight: none of their
    /// deliveries are to be taken now.
    pub(crate) fn busy(&self) -> Vec<String> {
        let mut counts: HashMap<&str, usize> = HashMap::new();
        let deliveries = self.deliveries();
        for (_, endpoint) in deliveries.iter() {
            *counts.entry(endpoint.as_str()).or_default() += 1;
        }
        let mut busy: Vec<String> = counts
            .into_iter()
            .filter(|&(_, n)| n >= PER_ENDPOINT)
            .map(|(endpoint, _)| endpoint.to_string())
            .collect();
        busy.sort_unstable();
        busy
    }

    /// The set, whole whatever a task that panicked holding it left: each
    /// change is one insert or remove.
    fn deliveries(&self) -> MutexGuard<'_, HashSet<Key>> {
        self.deliveries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.in_flight.deliveries().remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idemgate_store::Alert;

    fn delivery(alert_id: i64, endpoint: &str) -> AlertDelivery {
        AlertDelivery {
            alert_id,
            endpoint: endpoint.into(),
            attempts: 0,
            alert: Alert {
                event: "operation-unknown".into(),
                at: 0,
                route: "api".into(),
                operation_id: None,
                key: None,
                state: None,
                evidence: String::new(),
            },
        }
    }

    #[test]
    fn an_endpoint_is_busy_with_per_endpoint_in_flight_and_free_once_one_ends() {
        let in_flight = Arc::new(InFlight::default());
        let mut hung: Vec<Ticket> = (0..PER_ENDPOINT as i64)
            .map(|id| in_flight.start(&delivery(id, "hung")).expect("started"))
            .collect();
        let _good = in_flight.start(&delivery(0, "good")).expect("started");
        assert_eq!(in_flight.busy(), ["hung"], "the good endpoint is not");
        assert_eq!(in_flight.len(), PER_ENDPOINT + 1);
        assert_eq!(in_flight.room(), MAX - PER_ENDPOINT - 1);
        hung.pop();
        assert!(in_flight.busy().is_empty(), "one ended: room for one more");
    }

    #[test]
    fn a_delivery_is_in_flight_once_until_its_ticket_is_dropped() {
        let in_flight = Arc::new(InFlight::default());
        let ticket = in_flight.start(&delivery(7, "a"));
        assert!(ticket.is_some());
        assert!(
            in_flight.start(&delivery(7, "a")).is_none(),
            "handed out again while in flight: not posted twice"
        );
        assert!(
            in_flight.start(&delivery(7, "b")).is_some(),
            "the same alert for another endpoint is another delivery"
        );
        drop(ticket);
        assert!(in_flight.start(&delivery(7, "a")).is_some());
    }
}
