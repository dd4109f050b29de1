//! What each reply tells the seat: the epoch it adopts (docs/fleet.md, step 5), the fleet's
//! view and the drain measured between two reads, and the heartbeat that keeps the seat
//! heard from within the grace.

use std::sync::Arc;

use tokio::time::Instant;

use super::super::policy::Refusal;
use super::state::SeatState;
use super::{FleetSeat, REJOINED_POLL};
use crate::admission::drain::Pair;
use crate::config::Fraction;
use crate::coordination::fleet::HEARTBEAT;
use crate::coordination::port::{ReadState, View};

impl FleetSeat {
    /// While in the fleet, be heard from within [`HEARTBEAT`] of the last reply, whatever
    /// call it answered, so a new epoch is learnt, and the carry reported, within the
    /// grace. The beat is due a heartbeat after that reply: on a fixed tick, a call made
    /// just after a tick would leave almost two heartbeats to the next. Cut off, it looks
    /// every [`REJOINED_POLL`] for the rejoin, after which it calls at once (it reports its
    /// carry to an epoch made while it was away). Ends with the seat.
    pub(super) async fn heartbeat(seat: std::sync::Weak<Self>) {
        let mut wait = HEARTBEAT;
        loop {
            tokio::time::sleep(wait).await;
            let Some(seat) = seat.upgrade() else { return };
            if seat.state.lock().mode.leaving() {
                return;
            }
            if !seat.fleet.joined() {
                wait = REJOINED_POLL;
                continue;
            }
            // Blocks whose use ended while this replica sent nothing more give back what they
            // did not hand out within a heartbeat, not a hold later when their leases end.
            let limit = seat.policy.load().limit;
            if seat.state.lock().give_back_spent(Instant::now(), limit) {
                if let Err(error) = seat.settle_pending().await {
                    seat.fall_back(&error);
                }
            }
            let since = seat.state.lock().last.map(|(_, seen)| seen.elapsed());
            match since {
                Some(since) if since < HEARTBEAT => wait = HEARTBEAT - since,
                _ => {
                    seat.beat().await;
                    wait = HEARTBEAT;
                }
            }
        }
    }

    async fn beat(self: &Arc<Self>) {
        let reply = self
            .fleet
            .ledger()
            .heartbeat(self.queue_ref(), self.caller())
            .await;
        match reply {
            Ok(view) => {
                self.see(view);
            }
            Err(error) => {
                self.fall_back(&error);
            }
        }
    }

    /// Process a reply's view. A new epoch drops the blocks and the outcomes of the old one
    /// (their sends are in the carry now), and the carry is reported at once: the grace
    /// counts on every live replica's within it.
    ///
    /// A view of an older epoch than the one adopted is ignored (false): replies are
    /// processed by the tasks that made the calls, so one the ledger answered before it lost
    /// its state can be processed after one of the new epoch. A ledger never answers a
    /// replica with an epoch below the one it named (it makes a new one above it), so
    /// older is always stale: adopting it would drop the current epoch's blocks and
    /// outcomes, and hand out units of a block the ledger no longer holds.
    pub(super) fn see(self: &Arc<Self>, view: View) -> bool {
        self.fleet.answered();
        let hold = self.terms().hold;
        let adopted = {
            let mut state = self.state.lock();
            if view.epoch.id < state.seen.id {
                return false;
            }
            let adopted = view.epoch.id != state.seen.id;
            if adopted {
                state.adopt(view.epoch, Instant::now(), hold);
            } else if view.epoch.version > state.seen.version {
                state.seen.version = view.epoch.version;
            }
            Self::see_view(&mut state, view, Instant::now());
            adopted && !state.mode.leaving()
        };
        if adopted {
            let seat = Arc::clone(self);
            self.runtime.spawn(async move { seat.beat().await });
            // The sends it recounted are settled into the new epoch.
            self.schedule_settle();
        }
        true
    }

    /// Record the view as seen now, and measure the drain between two good reads: the
    /// fleet's estimate of the older one as last seen here (its backlog plus every send
    /// the fleet stored since) minus the newer one's as first seen. Sends stored between
    /// the two sightings are missing from the first and counted in the second, so the
    /// drain is under-estimated by them (a longer `Retry-After`: the safe side).
    fn see_view(state: &mut SeatState, view: View, now: Instant) {
        state.last = Some((view, now));
        if view.replicas > 0 {
            state.fleet_size = view.replicas;
        }
        if let ReadState::Failed { standing: Some(_) } = view.read {
            // What the last good read and the counts since still say (contract section 2).
            state.estimate = view.standing_estimate().map(|estimate| (estimate, now));
        }
        let ReadState::Ok { backlog, .. } = view.read else {
            return;
        };
        if let Some(estimate) = view.estimate() {
            state.estimate = Some((estimate, now));
        }
        let estimate = backlog.saturating_add(view.since_read);
        let read_at = now.checked_sub(view.read_age).unwrap_or(now);
        match state.measured {
            Some((generation, _, at)) if generation == view.generation => {
                state.measured = Some((generation, estimate, at));
            }
            Some((generation, before, at)) if generation < view.generation => {
                if read_at > at {
                    state.drain.record(Pair {
                        before,
                        after: estimate,
                        read: backlog,
                        over: read_at - at,
                    });
                }
                state.measured = Some((view.generation, estimate, read_at));
            }
            // An older reply overtaken by a newer one: nothing new.
            Some((_, _, at)) if read_at <= at => {}
            _ => {
                state.drain.break_chain();
                state.measured = Some((view.generation, estimate, read_at));
            }
        }
    }

    /// With hysteresis on: refusing since the fleet said "full", and the estimate on the
    /// view last seen not yet back at or below the resume level.
    pub(super) fn still_refusing(&self, state: &mut SeatState, now: Instant) -> Option<Refusal> {
        let policy = self.policy.load();
        if !state.mode.refusing() || policy.resume_below >= Fraction::ONE {
            return None;
        }
        let (view, seen) = state.last?;
        let estimate = view.estimate()?;
        if estimate <= policy.resume_at() {
            state.mode.resume();
            return None;
        }
        let until = seen + policy.ttl.saturating_sub(view.read_age);
        state.full = Some(super::state::ToldFull {
            until,
            estimate,
            generation: view.generation,
        });
        Some(policy.queue_full(
            estimate,
            state.drain.rate(),
            until.saturating_duration_since(now),
        ))
    }

    /// The view last seen holds a read the TTL paces younger than the TTL (reads again at
    /// the ceiling freshen the depth, not the TTL's schedule).
    pub(super) fn fresh(&self, state: &SeatState, now: Instant) -> bool {
        state.last.is_some_and(|(view, seen)| {
            view.read != ReadState::Never && view.paced_age + (now - seen) < self.policy.load().ttl
        })
    }
}
