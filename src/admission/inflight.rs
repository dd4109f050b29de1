//! The in-flight limit: at most `SENDGATE_MAX_IN_FLIGHT` backend sends at once.
//!
//! A slot is an owned semaphore permit, so it is given back when the guard drops: on
//! success, error, deadline, a client that disconnects (the request future is dropped)
//! and unwinding from a panic alike. A full pool answers at once; nothing waits for a slot.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[derive(Clone)]
pub struct InFlight {
    slots: Arc<Semaphore>,
    max: usize,
}

/// A held slot; dropping it frees the slot.
pub struct Slot(#[allow(dead_code)] OwnedSemaphorePermit);

impl InFlight {
    pub fn new(max: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    pub fn try_acquire(&self) -> Option<Slot> {
        self.slots.clone().try_acquire_owned().ok().map(Slot)
    }

    /// Sends holding a slot now.
    pub fn current(&self) -> usize {
        self.max - self.slots.available_permits()
    }

    pub fn max(&self) -> usize {
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_pool_refuses_at_once_and_dropped_slots_come_back() {
        let pool = InFlight::new(2);
        let a = pool.try_acquire().unwrap();
        let b = pool.try_acquire().unwrap();
        assert!(pool.try_acquire().is_none());
        assert_eq!(pool.current(), 2);
        drop(a);
        assert_eq!(pool.current(), 1);
        let c = pool.try_acquire();
        assert!(c.is_some());
        drop((b, c));
        assert_eq!(pool.current(), 0);
    }

    #[test]
    fn a_panic_while_holding_a_slot_gives_it_back() {
        let pool = InFlight::new(1);
        let p = pool.clone();
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _slot = p.try_acquire().unwrap();
            panic!("boom");
        }));
        assert_eq!(pool.current(), 0);
    }
}
