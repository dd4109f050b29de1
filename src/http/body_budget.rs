//! A budget for request bodies held in memory at once (`SENDGATE_MAX_BUFFERED_BYTES`).
//!
//! The in-flight limit bounds sends at the broker, but a body is read (and held) before
//! that, and held until its send ends: without a budget, many slow clients uploading
//! large bodies at once could hold gigabytes. A send reserves its announced length (or the
//! largest allowed body when none is announced) before reading; when the budget is spent
//! it is refused `503 saturated` at once, never queued. Once read, a body keeps only its
//! own length reserved: a small body sent without a length must not hold the largest size
//! for the whole send.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub struct BodyBudget {
    bytes: Arc<Semaphore>,
    capacity: usize,
}

/// Bytes reserved for one body, given back when dropped.
pub struct BodyReservation(#[allow(dead_code)] Option<OwnedSemaphorePermit>);

impl BodyReservation {
    /// Give back all but `n` bytes: the body turned out smaller than reserved.
    pub fn shrink_to(&mut self, n: usize) {
        if let Some(permit) = &mut self.0 {
            let surplus = permit.num_permits().saturating_sub(n);
            if surplus > 0 {
                drop(permit.split(surplus));
            }
        }
    }
}

impl BodyBudget {
    pub fn new(bytes: usize) -> Self {
        let capacity = bytes.min(Semaphore::MAX_PERMITS);
        Self {
            bytes: Arc::new(Semaphore::new(capacity)),
            capacity,
        }
    }

    /// The whole budget: the most one reservation can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Reserve `n` bytes now, or `None` when they are not free.
    pub fn try_reserve(&self, n: usize) -> Option<BodyReservation> {
        if n == 0 {
            return Some(BodyReservation(None));
        }
        let n = u32::try_from(n).ok()?;
        self.bytes
            .clone()
            .try_acquire_many_owned(n)
            .ok()
            .map(|permit| BodyReservation(Some(permit)))
    }

    /// Bytes free now (for `/health/detailed` and tests).
    pub fn available(&self) -> usize {
        self.bytes.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_refused_past_the_budget_and_given_back_on_drop() {
        let budget = BodyBudget::new(1000);
        let a = budget.try_reserve(600).expect("room");
        assert!(budget.try_reserve(600).is_none(), "400 left");
        let b = budget.try_reserve(400).expect("exactly the rest");
        assert_eq!(budget.available(), 0);
        drop(a);
        assert_eq!(budget.available(), 600);
        drop(b);
        assert_eq!(budget.available(), 1000);
        assert!(
            budget.try_reserve(0).is_some(),
            "an empty body costs nothing"
        );
        assert!(
            budget.try_reserve(1001).is_none(),
            "never more than the whole"
        );
    }

    #[test]
    fn a_reservation_shrunk_to_its_body_gives_back_the_rest_and_the_body_on_drop() {
        let budget = BodyBudget::new(1000);
        let mut r = budget.try_reserve(1000).expect("room");
        r.shrink_to(12);
        assert_eq!(budget.available(), 988);
        r.shrink_to(500);
        assert_eq!(budget.available(), 988, "never grows");
        drop(r);
        assert_eq!(budget.available(), 1000);
        let mut empty = budget.try_reserve(0).expect("room");
        empty.shrink_to(0);
        assert_eq!(budget.available(), 1000);
    }
}
