//! The budget for request bodies held in memory, shared by every route.
//!
//! A write's body is read whole before it is fingerprinted and sent, so
//! each write in flight holds up to its route's `max_body`; many slow or
//! large writes at once would grow memory without bound. Every byte of a
//! body being read is reserved here first (the whole declared
//! Content-Length at once, before `100 Continue`; a chunked body as its
//! chunks arrive), and the reservation is returned when the last holder of
//! the body lets go of it (the attempt, which may outlive the client's
//! answer, or the request when nothing is sent). A write that would overdraw `server.buffered_body_budget` is
//! refused with 503 `overloaded` and nothing is sent; the others go on.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The bytes all bodies being read or held may take together.
pub struct BodyBudget {
    /// One permit per byte.
    bytes: Arc<Semaphore>,
}

/// The budget is spent: the body needs more than is left.
#[derive(Debug, thiserror::Error)]
#[error("the budget for buffered request bodies is spent")]
pub struct BudgetSpent;

/// Bytes reserved for one body; returned to the budget when dropped.
pub struct Reservation {
    bytes: Arc<Semaphore>,
    held: Option<OwnedSemaphorePermit>,
}

impl BodyBudget {
    /// A budget of `total` bytes (capped at what a semaphore can count).
    pub fn new(total: usize) -> Self {
        BodyBudget {
            bytes: Arc::new(Semaphore::new(total.min(Semaphore::MAX_PERMITS))),
        }
    }

    /// An empty reservation, to grow as the body arrives.
    pub fn reservation(&self) -> Reservation {
        Reservation {
            bytes: self.bytes.clone(),
            held: None,
        }
    }
}

impl Reservation {
    /// How many bytes this reservation holds.
    pub fn size(&self) -> usize {
        self.held
            .as_ref()
            .map_or(0, OwnedSemaphorePermit::num_permits)
    }

    /// Grows the reservation to at least `size` bytes, without waiting:
    /// a body that does not fit now is refused, never queued.
    pub fn grow_to(&mut self, size: usize) -> Result<(), BudgetSpent> {
        let more = size.saturating_sub(self.size());
        if more == 0 {
            return Ok(());
        }
        let more = u32::try_from(more).map_err(|_| BudgetSpent)?;
        let permit = self
            .bytes
            .clone()
            .try_acquire_many_owned(more)
            .map_err(|_| BudgetSpent)?;
        match &mut self.held {
            Some(held) => held.merge(permit),
            None => self.held = Some(permit),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_share_the_budget_and_return_it_when_dropped() {
        let budget = BodyBudget::new(100);
        let mut first = budget.reservation();
        first.grow_to(60).unwrap();
        first.grow_to(40).unwrap();
        assert_eq!(first.size(), 60, "never shrinks");
        let mut second = budget.reservation();
        assert!(second.grow_to(41).is_err());
        second.grow_to(30).unwrap();
        second.grow_to(40).unwrap();
        assert_eq!(second.size(), 40);
        assert!(second.grow_to(41).is_err());
        drop(first);
        second.grow_to(100).unwrap();
        assert_eq!(second.size(), 100);
    }
}
