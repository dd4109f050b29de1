//! One admitted send's place under the ceiling, held until the send ends and then settled
//! with whoever admitted it: the fleet's seat, or the local gate (alone by design, or a
//! replica cut off and failing open, whose seat counted the send in its window already).

use std::sync::Arc;

use tokio::time::Instant;

use super::claims::{ClaimKey, Claims};
use super::fleet::{FleetSeat, Held};
use super::local::LocalGate;
use super::policy::BacklogEffect;

/// Who admitted a send, so its end is told to the same.
pub(super) enum Decider {
    Local(Arc<LocalGate>),
    Fleet(Arc<FleetSeat>, Held),
    /// The replica's own gate, cut off from the fleet and failing open: the seat counted it
    /// in its window already.
    Alone(Arc<LocalGate>),
}

/// One admitted send's place under the ceiling (or a batch's, one unit per entry). Finish
/// it with the send's outcome; if it is dropped unfinished (the request was cancelled
/// mid-send) every unit counts as [`BacklogEffect::Unknown`], the safe side.
pub struct Reservation {
    decider: Decider,
    units: u64,
    counted_at: Instant,
    finished: bool,
    /// The place it was admitted on (`claims.rs`), claimed once the send is stored or may
    /// have been; kept when nothing was stored, for the retry.
    claim: Option<(Arc<Claims>, ClaimKey)>,
}

impl Reservation {
    /// `units` admitted by `decider` now.
    pub(super) fn new(decider: Decider, units: u64) -> Self {
        Self::counted_since(decider, units, Instant::now())
    }

    /// `units` admitted by `decider`, counted under the ceiling since `counted_at`.
    pub(super) fn counted_since(decider: Decider, units: u64, counted_at: Instant) -> Self {
        Self {
            decider,
            units,
            counted_at,
            finished: false,
            claim: None,
        }
    }

    /// Admitted on the place promised to `key`.
    pub(super) fn claiming(mut self, claims: Arc<Claims>, key: ClaimKey) -> Self {
        self.claim = Some((claims, key));
        self
    }

    /// The send ended, `stored` or not: a place it was admitted on is claimed if stored.
    fn settle_claim(&mut self, stored: bool) {
        if let (true, Some((claims, key))) = (stored, self.claim.take()) {
            claims.claimed(Some(key));
        }
    }

    /// When the ceiling began counting this send: its deadline counts from here
    /// (docs/fleet.md, A2: a send counted at `a` is stored by `a + D` or never).
    pub fn counted_at(&self) -> Instant {
        self.counted_at
    }

    /// How many sends it holds.
    pub fn units(&self) -> u64 {
        self.units
    }

    /// Every unit ended with `outcome`.
    pub fn finish(mut self, outcome: BacklogEffect) {
        self.finished = true;
        self.settle_claim(outcome != BacklogEffect::NotStored);
        for _ in 0..self.units {
            self.settle(outcome);
        }
    }

    /// A batch ended: one outcome per unit. Units without one (fewer outcomes than units)
    /// count as [`BacklogEffect::Unknown`].
    pub fn finish_each(mut self, outcomes: impl IntoIterator<Item = BacklogEffect>) {
        self.finished = true;
        let mut left = self.units;
        let mut stored = false;
        for outcome in outcomes.into_iter().take(self.units as usize) {
            self.settle(outcome);
            stored |= outcome != BacklogEffect::NotStored;
            left -= 1;
        }
        self.settle_claim(stored || left > 0);
        for _ in 0..left {
            self.settle(BacklogEffect::Unknown);
        }
    }

    fn settle(&self, outcome: BacklogEffect) {
        match &self.decider {
            Decider::Fleet(seat, held) => seat.finish(*held, outcome),
            Decider::Local(local) | Decider::Alone(local) => local.finish(outcome),
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.finished {
            self.settle_claim(true);
            for _ in 0..self.units {
                self.settle(BacklogEffect::Unknown);
            }
        }
    }
}
