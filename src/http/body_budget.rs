//! A budget for request bodies held in memory at once (`SENDGATE_MAX_BUFFERED_BYTES`).
//!
//! The in-flight limit bounds sends at the broker, but a body is read (and held) before
//! that, and held until its send ends: without a budget, many slow clients uploading
//! large bodies at once could hold gigabytes. A send takes a permit for its announced
//! length (or the largest allowed body when none is announced) before reading; when the
//! budget is spent it is refused `503 saturated` at once, never queued. Once read, a body
//! keeps only its own length: a small body sent without a length must not hold the largest
//! size for the whole send.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub struct BodyBudget {
    bytes: Arc<Semaphore>,
    capacity: usize,
}

/// Bytes of the budget one body holds, given back when dropped.
pub struct BodyPermit(#[allow(dead_code)] Option<OwnedSemaphorePermit>);

impl BodyPermit {
    /// Give back all but `n` bytes: the body turned out smaller than asked for.
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

    /// The whole budget: the most one permit can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// A permit for `n` bytes now, or `None` when they are not free.
    pub fn try_acquire(&self, n: usize) -> Option<BodyPermit> {
        if n == 0 {
            return Some(BodyPermit(None));
        }
        let n = u32::try_from(n).ok()?;
        self.bytes
            .clone()
            .try_acquire_many_owned(n)
            .ok()
            .map(|permit| BodyPermit(Some(permit)))
    }

    /// Bytes free now (for `/health/detailed` and tests).
    pub fn available(&self) -> usize {
        self.bytes.available_permits()
    }
}

/// How much of the budget a request's body holds while it is in the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buffered {
    /// Its bytes: a single body goes to the broker as it was read.
    Once,
    /// Twice its bytes (at most the whole budget): a batch's bytes, and the copies of its
    /// messages on their way to the broker (the HTTP server's read-ahead while it arrives,
    /// the broker client's frames while it is published), each measured at most its size.
    Twice,
}

impl Buffered {
    /// The bytes of a `budget` a body of `bytes` holds.
    pub fn weigh(self, bytes: usize, budget: usize) -> usize {
        match self {
            Buffered::Once => bytes,
            Buffered::Twice => bytes.saturating_mul(2).min(budget),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_weighs_twice_its_bytes_at_most_the_whole_budget_a_single_body_once() {
        assert_eq!(Buffered::Once.weigh(600, 1000), 600);
        assert_eq!(Buffered::Twice.weigh(400, 1000), 800);
        assert_eq!(Buffered::Twice.weigh(600, 1000), 1000);
        assert_eq!(Buffered::Twice.weigh(usize::MAX, 1000), 1000);
        assert_eq!(Buffered::Twice.weigh(0, 1000), 0);
    }

    #[test]
    fn permits_are_refused_past_the_budget_and_given_back_on_drop() {
        let budget = BodyBudget::new(1000);
        let a = budget.try_acquire(600).expect("room");
        assert!(budget.try_acquire(600).is_none(), "400 left");
        let b = budget.try_acquire(400).expect("exactly the rest");
        assert_eq!(budget.available(), 0);
        drop(a);
        assert_eq!(budget.available(), 600);
        drop(b);
        assert_eq!(budget.available(), 1000);
        assert!(
            budget.try_acquire(0).is_some(),
            "an empty body costs nothing"
        );
        assert!(
            budget.try_acquire(1001).is_none(),
            "never more than the whole"
        );
    }

    #[test]
    fn a_permit_shrunk_to_its_body_gives_back_the_rest_and_the_body_on_drop() {
        let budget = BodyBudget::new(1000);
        let mut r = budget.try_acquire(1000).expect("room");
        r.shrink_to(12);
        assert_eq!(budget.available(), 988);
        r.shrink_to(500);
        assert_eq!(budget.available(), 988, "never grows");
        drop(r);
        assert_eq!(budget.available(), 1000);
        let mut empty = budget.try_acquire(0).expect("room");
        empty.shrink_to(0);
        assert_eq!(budget.available(), 1000);
    }
}
