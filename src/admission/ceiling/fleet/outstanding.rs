//! The reservations a replica has out at Redis for one queue, so that sends asking at once
//! split one share of the room between them (`reserve.rs` `ask`).

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Default)]
pub(super) struct Outstanding {
    out: AtomicU64,
}

/// One reservation out, until dropped.
pub(super) struct Out<'a> {
    of: &'a Outstanding,
    others: u64,
}

impl Outstanding {
    pub(super) fn start(&self) -> Out<'_> {
        let others = self.out.fetch_add(1, Ordering::SeqCst);
        Out { of: self, others }
    }
}

impl Out<'_> {
    /// How many other reservations of this replica were out when this one started.
    pub(super) fn others(&self) -> u64 {
        self.others
    }
}

impl Drop for Out<'_> {
    fn drop(&mut self) {
        self.of.out.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reservation_counts_the_others_out_when_it_started() {
        let outstanding = Outstanding::default();
        let first = outstanding.start();
        let second = outstanding.start();
        let third = outstanding.start();
        assert_eq!((first.others(), second.others(), third.others()), (0, 1, 2));
        drop(second);
        assert_eq!(outstanding.start().others(), 2, "one came back");
        drop((first, third));
        assert_eq!(outstanding.start().others(), 0, "all back");
    }
}
