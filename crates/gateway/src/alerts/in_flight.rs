//! The alert deliveries a deliverer has in flight (being posted, or
//! settled), and the bounds that keep a hung webhook from holding up the
//! others: each post may wait up to its 10 s bound, and meanwhile the
//! other endpoints' deliveries keep being taken and posted.
//!
//! - An endpoint is handed no more than [`PER_ENDPOINT`] less its
//!   deliveries in flight ([`InFlight::room_per_endpoint`]), so it never
//!   has more than `PER_ENDPOINT` in flight.
//! - All endpoints together have at most [`MAX`] ([`InFlight::room`]).
//! - A delivery is in flight from [`InFlight::start`] until its [`Ticket`]
//!   is dropped (settled, or its task aborted), and at most once: one the
//!   store hands out again while it is still in flight here (its lease ran
//!   out under a slow settle, or the clock jumped) is not posted twice.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use idemgate_store::AlertDelivery;

/// Deliveries in flight to one endpoint past which it is handed no more:
/// a poll's whole batch, so a webhook that answers is kept up with at 64 a
/// second (an incident's backlog drains in minutes), while a hung one
/// holds a quarter of [`MAX`] at most.
pub(crate) const PER_ENDPOINT: usize = 32;
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

    /// How many more deliveries each of `endpoints` may be handed:
    /// [`PER_ENDPOINT`] less those in flight to it.
    pub(crate) fn room_per_endpoint<'a>(
        &self,
        endpoints: impl IntoIterator<Item = &'a str>,
    ) -> BTreeMap<String, u32> {
        let mut room: BTreeMap<String, usize> = endpoints
            .into_iter()
            .map(|endpoint| (endpoint.to_string(), PER_ENDPOINT))
            .collect();
        for (_, endpoint) in self.deliveries().iter() {
            if let Some(left) = room.get_mut(endpoint.as_str()) {
                *left = left.saturating_sub(1);
            }
        }
        room.into_iter()
            .map(|(endpoint, left)| (endpoint, u32::try_from(left).unwrap_or(0)))
            .collect()
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
    fn an_endpoint_has_room_for_per_endpoint_less_its_in_flight() {
        let in_flight = Arc::new(InFlight::default());
        let mut hung: Vec<Ticket> = (0..PER_ENDPOINT as i64 - 1)
            .map(|id| in_flight.start(&delivery(id, "hung")).expect("started"))
            .collect();
        let _good = in_flight.start(&delivery(0, "good")).expect("started");
        let _gone = in_flight.start(&delivery(0, "gone")).expect("started");
        let room = |in_flight: &InFlight| in_flight.room_per_endpoint(["good", "hung", "idle"]);
        let all = PER_ENDPOINT as u32;
        let expected = [("good", all - 1), ("hung", 1), ("idle", all)];
        assert_eq!(
            room(&in_flight),
            expected.map(|(e, n)| (e.to_string(), n)).into()
        );
        hung.push(in_flight.start(&delivery(99, "hung")).expect("started"));
        assert_eq!(room(&in_flight)["hung"], 0, "full");
        assert_eq!(in_flight.len(), PER_ENDPOINT + 2);
        assert_eq!(in_flight.room(), MAX - PER_ENDPOINT - 2);
        hung.pop();
        assert_eq!(room(&in_flight)["hung"], 1, "one ended: room for one more");
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
