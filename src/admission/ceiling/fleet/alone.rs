//! A replica cut off from Redis (docs/fleet.md, step 6): what it may still admit, and the
//! bounds of the fail-open rule its own gate decides with.

use std::time::Duration;

use tokio::time::Instant;

use super::super::local::LocalBounds;
use super::super::policy::{Refusal, Unknown};
use super::super::window::ALONE;
use super::{AloneAnswer, Counted, FleetSeat, USE_BLOCK_FOR};

impl FleetSeat {
    /// How long an admission counts in the fail-open rule (docs/fleet.md, step 6): a hold
    /// until every read a reservation uses shows it, and a block's use and a hold more until
    /// what the reservations made meanwhile granted (which this replica's own read, all it
    /// has when cut off, cannot see) shows in that read. The longest span the window keeps.
    pub(super) fn alone_span(&self) -> Duration {
        self.terms().hold * 2 + USE_BLOCK_FOR
    }

    /// Cut off from Redis (docs/fleet.md, step 6): a unit of a block still in use, else
    /// with the gate on `503 capacity_unknown`, else the fail-open rule's bounds for the
    /// replica's own gate, with this send already counted in them: every admission of the
    /// replica's own in the alone span, weighed by the larger of the fleet's size it last
    /// saw and the most replicas it may run beside.
    pub fn alone(&self) -> AloneAnswer {
        self.alone_units(1)
    }

    /// [`Self::alone`] for `units` sends at once (a batch): one block's units, or all of
    /// them counted in the bounds.
    pub fn alone_units(&self, units: u64) -> AloneAnswer {
        let units = units.max(1);
        let now = Instant::now();
        let hold = self.terms().hold;
        let span = self.alone_span();
        let policy = self.policy.load();
        let mut state = self.state.lock();
        if state.mode.leaving() {
            return AloneAnswer::Refuse(Refusal::Stopped);
        }
        if let Some(held) = state.take_units(now, span, policy.limit, units) {
            return AloneAnswer::Admit(held);
        }
        if policy.fail_closed {
            return AloneAnswer::Refuse(Refusal::CapacityUnknown {
                consecutive_failures: state.last.map_or(0, |(view, _)| view.streak),
                cause: Unknown::Ledger,
            });
        }
        let mut bucket = state.window.record(now, ALONE, span);
        for _ in 1..units {
            bucket = state.window.record(now, ALONE, span);
        }
        let floor = state
            .estimate
            .filter(|(_, seen)| now < *seen + hold)
            .map_or(0, |(estimate, _)| estimate);
        AloneAnswer::Decide {
            bounds: LocalBounds {
                floor,
                replicas: state.fleet_size.max(self.fleet.max_replicas()),
                counted: state.window.recent(now, span),
            },
            counted: Counted {
                at: now,
                bucket,
                units,
            },
        }
    }

    /// The replica's own gate refused a send [`FleetSeat::alone`] counted.
    pub fn take_back_alone(&self, counted: Counted) {
        let mut state = self.state.lock();
        for _ in 0..counted.units {
            state.window.unrecord(ALONE, counted.bucket);
        }
    }
}
