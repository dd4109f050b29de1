//! A send in the fleet (docs/fleet.md, steps 1 and 2): a unit of a block this replica holds,
//! else one reservation after another, each reply acted on by the step of the protocol that
//! names it; and the next block reserved ahead, far from the ceiling.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::MutexGuard;
use tokio::time::Instant;

use super::super::policy::{CapacityPolicy, Refusal, Unknown};
use super::state::{Block, Held, SeatState, ToldFull, BLOCK_WANT, SHARE_DIVISOR};
use super::{FleetAnswer, FleetSeat, ASKS, USE_BLOCK_FOR};
use crate::config::Fraction;
use crate::coordination::port::{Ask, LedgerError, ReadState, ReserveAnswer, View};

/// One reservation's result: decided, or ask again (with the answer should no ask remain).
pub(super) enum Step {
    Done(FleetAnswer),
    Again(FleetAnswer),
}

/// What a send finds before it reserves.
enum Before {
    /// Decided from what the seat holds: a unit of a block, or the fleet's "full" still
    /// in force.
    Decided(FleetAnswer),
    /// To reserve: whether the fleet's read is fresh, whether this send starts the read
    /// ahead, and whether spent blocks gave units back (to settle first).
    Reserve {
        fresh: bool,
        ahead: bool,
        released: bool,
    },
}

/// A reservation's reply, with what the seat acts on it by.
struct Reply {
    turn: u64,
    /// When it was asked for: its block is handed out for [`USE_BLOCK_FOR`] from here,
    /// which is before its lease began in Redis.
    asked: Instant,
    /// When the reply came.
    answered: Instant,
    view: View,
    /// The policy in force when it was asked.
    policy: Arc<CapacityPolicy>,
    /// The sends it is for (a batch's entries).
    units: u64,
    /// Other reservations of this replica out when it was asked (its divisor was split).
    others: u64,
}

impl Reply {
    /// Processed past the block's use (a paused process, a starved runtime).
    fn late(&self) -> bool {
        self.answered >= self.asked + USE_BLOCK_FOR
    }

    /// Ask again; should no ask remain, the depth is unknown at the view's streak.
    fn ask_again(&self) -> Step {
        Step::Again(FleetAnswer::Refuse(Refusal::CapacityUnknown {
            consecutive_failures: self.view.streak,
            cause: Unknown::Ledger,
        }))
    }

    /// What is left of the TTL of the read the view holds.
    fn ttl_left(&self) -> Duration {
        self.policy.ttl.saturating_sub(self.view.read_age)
    }
}

impl FleetSeat {
    /// Decide one send against the fleet's ceiling (docs/fleet.md, steps 1 and 2).
    pub async fn admit(self: &Arc<Self>) -> FleetAnswer {
        self.admit_units(1).await
    }

    /// [`Self::admit`] for `units` sends at once (a batch): all admitted under one
    /// [`Held`] (a block's units, or one reservation of exactly `units`: docs/fleet.md, a
    /// batch), or none, the refusal saying how many would be (`room`). Refused at the
    /// ceiling, the send starts a read at the ceiling when one is due (an admitted one
    /// does when it ends: [`Self::finish`]).
    pub async fn admit_units(self: &Arc<Self>, units: u64) -> FleetAnswer {
        let answer = self.decide_units(units.max(1)).await;
        if matches!(answer, FleetAnswer::Refuse(Refusal::QueueFull { .. })) {
            self.read_at_ceiling_if_due();
        }
        answer
    }

    async fn decide_units(self: &Arc<Self>, units: u64) -> FleetAnswer {
        let (fresh, ahead, released) = match self.before_reserving(units) {
            Before::Decided(answer) => return answer,
            Before::Reserve {
                fresh,
                ahead,
                released,
            } => (fresh, ahead, released),
        };
        if released {
            if let Err(error) = self.settle_pending().await {
                self.fall_back(&error);
            }
        }
        self.schedule_settle();
        // Whether this send made a read that counted in the fleet's streak: one send adds at
        // most one failed read to it (contract section 2), however many asks it takes.
        let mut counted = false;
        if !fresh {
            match self.refresh(true, true).await {
                Ok(read) => counted = read,
                Err(error) => {
                    if self.fall_back(&error) {
                        return FleetAnswer::CutOff;
                    }
                }
            }
        }
        self.spawn_ahead(ahead);
        if let Some(refusal) = self.still_refusing(&mut self.state.lock(), Instant::now()) {
            return FleetAnswer::Refuse(refusal);
        }
        let mut answer = FleetAnswer::Refuse(Refusal::CapacityUnknown {
            consecutive_failures: 0,
            cause: Unknown::Ledger,
        });
        for _ in 0..ASKS {
            match self.reserve_once(&mut counted, units).await {
                Step::Done(decided) => return decided,
                Step::Again(unanswered) => answer = unanswered,
            }
        }
        answer
    }

    /// Step 2 before any call: a live block's units are counted fleet-wide until its lease
    /// ends, whatever the age of the read it was granted on, so they are used first; else
    /// the fleet's "full" on the read last seen answers until it ends. Either way the read
    /// ahead (and the next block) is started when due.
    fn before_reserving(self: &Arc<Self>, units: u64) -> Before {
        let now = Instant::now();
        let mut state = self.state.lock();
        if state.mode.leaving() {
            return Before::Decided(FleetAnswer::Refuse(Refusal::Stopped));
        }
        let age = state.last.map(|(view, seen)| view.paced_age + (now - seen));
        let fresh = self.fresh(&state, now);
        let limit = self.policy.load().limit;
        if let Some(held) = state.take_units(now, self.alone_span(), limit, units) {
            let ahead = self.ahead_due(&mut state, age, now);
            let next_block = state.next_block_due(now, limit);
            drop(state);
            self.spawn_ahead(ahead);
            self.spawn_next_block(next_block);
            return Before::Decided(FleetAnswer::Admit(held));
        }
        let generation = state.last.map(|(view, _)| view.generation);
        if let Some(full) = state
            .full
            .filter(|full| now < full.until && Some(full.generation) == generation)
        {
            let ahead = self.ahead_due(&mut state, age, now);
            let rate = state.drain.rate();
            drop(state);
            self.spawn_ahead(ahead);
            return Before::Decided(FleetAnswer::Refuse(self.policy.load().queue_full(
                full.estimate,
                rate,
                full.until - now,
            )));
        }
        let ahead = fresh && self.ahead_due(&mut state, age, now);
        // Before this send reserves.
        let released = state.give_back_spent(now, self.policy.load().limit);
        Before::Reserve {
            fresh,
            ahead,
            released,
        }
    }

    /// Step 1's terms for `units` sends: a single send asks for a block it takes one unit
    /// of (a share of the room), a batch for exactly its size (divisor 1: all of the room
    /// if need be, never more). A send that asks while `others` of this replica's
    /// reservations are out asks for a share `others + 1` times smaller: sends asking at
    /// once (a grace's end frees them all) would each take an eighth of what the last left,
    /// and the replica would hold most of the room unused while the others' sends are
    /// refused.
    fn ask<'a>(&self, block_id: &'a str, units: u64, limit: u64, others: u64) -> Ask<'a> {
        let (want, divisor) = if units == 1 {
            (BLOCK_WANT, SHARE_DIVISOR.saturating_mul(others + 1))
        } else {
            (units, 1)
        };
        Ask {
            block_id,
            want,
            limit,
            divisor,
            lease: USE_BLOCK_FOR + self.terms().hold,
        }
    }

    /// One reservation (step 1), and what its reply means for these `units` sends
    /// (`counted`: see [`FleetSeat::admit_units`]), each answer taken by the step that
    /// names it.
    async fn reserve_once(self: &Arc<Self>, counted: &mut bool, units: u64) -> Step {
        let out = self.outstanding.start();
        let asked = Instant::now();
        let (turn, block_id) = self.next_turn();
        let policy = self.policy.load_full();
        let ask = self.ask(&block_id, units, policy.limit, out.others());
        let reply = self
            .fleet
            .ledger()
            .reserve(self.queue_ref(), self.caller(), ask)
            .await;
        let answered = Instant::now();
        let (answer, view) = match reply {
            Ok(reply) => reply,
            Err(error) => return self.unanswered(&error),
        };
        let reply = Reply {
            turn,
            asked,
            answered,
            view,
            policy,
            units,
            others: out.others(),
        };
        if reply.late() {
            return self.release_late(&reply, answer);
        }
        if !self.see(view) {
            // Answered by a ledger of an epoch this seat already saw replaced: a grant's
            // block is not in the current one, so it is not used (nothing to give back: the
            // state that held it is gone).
            return reply.ask_again();
        }
        match answer {
            ReserveAnswer::Unread => {
                drop(out);
                self.read_first(counted, &reply.policy).await
            }
            ReserveAnswer::Recovering => {
                drop(out);
                self.wait_out_grace(&reply).await
            }
            // Step 1: the caller named another epoch; `see` adopted the reply's.
            ReserveAnswer::NewEpoch => reply.ask_again(),
            ReserveAnswer::Granted { granted } => self.use_grant(&reply, granted),
            ReserveAnswer::Full { estimate } => self.told_full(&reply, estimate),
            ReserveAnswer::Disabled => match self.still_current(&reply, None) {
                Ok(_) => Step::Done(FleetAnswer::Refuse(Refusal::QueueDisabled)),
                Err(instead) => instead,
            },
            ReserveAnswer::Unknown => self.read_failed(&reply),
        }
    }

    /// Step 6: the call failed. Asked again once: a slow answer is not a partition (what
    /// the call may have reserved comes back when its lease ends); the second failure in a
    /// row cuts the replica off.
    fn unanswered(&self, error: &LedgerError) -> Step {
        if self.fall_back(error) {
            return Step::Done(FleetAnswer::CutOff);
        }
        Step::Again(FleetAnswer::Refuse(Refusal::CapacityUnknown {
            consecutive_failures: 0,
            cause: Unknown::Ledger,
        }))
    }

    /// Step 2, a late reply (A2): past its use, a grant's first unit would go to a send
    /// whose deadline starts now, which the block's lease (counted from before the ask) may
    /// not outlive. Given back, never used, and the replica is cut off. Earlier, the send
    /// is stored by `asked + USE_BLOCK_FOR + D`, within the lease.
    fn release_late(self: &Arc<Self>, reply: &Reply, answer: ReserveAnswer) -> Step {
        if let ReserveAnswer::Granted { granted } = answer {
            self.state
                .lock()
                .give_back(reply.view.epoch.id, reply.turn, granted);
        }
        self.schedule_settle();
        self.fleet.fall_back(&LedgerError::Timeout);
        self.state.lock().last = None;
        Step::Done(FleetAnswer::CutOff)
    }

    /// Step 4 first: the epoch holds no read young enough. A send that waited out a grace
    /// finds the read it made too old: the one it makes again is still its one read (not
    /// counted twice in the streak).
    async fn read_first(self: &Arc<Self>, counted: &mut bool, policy: &CapacityPolicy) -> Step {
        match self.refresh(true, !*counted).await {
            Ok(read) => *counted |= read,
            Err(error) => {
                if self.fall_back(&error) {
                    return Step::Done(FleetAnswer::CutOff);
                }
            }
        }
        Step::Again(self.unread_answer(policy))
    }

    /// Step 5: a new epoch grants nothing within its grace; asked again once it is over.
    async fn wait_out_grace(&self, reply: &Reply) -> Step {
        tokio::time::sleep(reply.view.grace_left.min(self.terms().grace)).await;
        reply.ask_again()
    }

    /// The seat's state, to act on a reply of the epoch it is in. Else what to do instead:
    /// ask again if another call's reply adopted a newer epoch since this one was seen (the
    /// lock was let go in between: a grant's block is not in the current state), or, when
    /// leaving, give the `grant` back and refuse.
    fn still_current(
        &self,
        reply: &Reply,
        grant: Option<u64>,
    ) -> Result<MutexGuard<'_, SeatState>, Step> {
        let mut state = self.state.lock();
        let epoch = reply.view.epoch.id;
        if state.seen.id != epoch {
            return Err(reply.ask_again());
        }
        if state.mode.leaving() {
            if let Some(granted) = grant {
                state.give_back(epoch, reply.turn, granted);
            }
            return Err(Step::Done(FleetAnswer::Refuse(Refusal::Stopped)));
        }
        Ok(state)
    }

    /// Step 2: use a grant. Not under a ceiling lowered while the call was out (given back,
    /// asked again), nor for a batch it is short of (given back, refused with the room it
    /// showed); else these sends take their units and the rest is a block to hand out
    /// until `asked +` [`USE_BLOCK_FOR`].
    fn use_grant(self: &Arc<Self>, reply: &Reply, granted: u64) -> Step {
        let mut state = match self.still_current(reply, Some(granted)) {
            Ok(state) => state,
            Err(instead) => return instead,
        };
        let (epoch, turn, limit) = (reply.view.epoch.id, reply.turn, reply.policy.limit);
        if self.policy.load().limit < limit {
            // Lowered while the call was out: not room under the ceiling in force.
            state.give_back(epoch, turn, granted);
            drop(state);
            self.schedule_settle();
            return reply.ask_again();
        }
        if granted < reply.units {
            // Less room than the batch: none of it is used (given back), and the refusal
            // says how much there was.
            state.give_back(epoch, turn, granted);
            let rate = state.drain.rate();
            drop(state);
            self.schedule_settle();
            let refusal =
                reply
                    .policy
                    .queue_full(limit.saturating_sub(granted), rate, reply.ttl_left());
            return Step::Done(FleetAnswer::Refuse(refusal.with_room(granted)));
        }
        let bucket =
            state
                .window
                .record_units(reply.answered, epoch, self.alone_span(), reply.units);
        if reply.units == 1 {
            state.note_grant(granted, limit, reply.others > 0);
        }
        let rest = granted.saturating_sub(reply.units);
        if rest > 0 {
            state.blocks.push_back(Block {
                epoch,
                turn,
                left: rest,
                use_until: reply.asked + USE_BLOCK_FOR,
                limit,
            });
        }
        Step::Done(FleetAnswer::Admit(Held::Block {
            epoch,
            turn,
            bucket,
        }))
    }

    /// Step 1 found no room. The refusal is cached at most a block's use (headroom others
    /// hold unused comes back within that), and the seat turns refusing. A unit of a block
    /// this replica holds, which another send's grant left while this one's call was out,
    /// still admits the send: it is counted in the estimate that said full.
    fn told_full(&self, reply: &Reply, estimate: u64) -> Step {
        let mut state = match self.still_current(reply, None) {
            Ok(state) => state,
            Err(instead) => return instead,
        };
        let ttl_left = reply.ttl_left();
        state.full = Some(ToldFull {
            until: reply.answered + ttl_left.min(USE_BLOCK_FOR),
            estimate,
            generation: reply.view.generation,
        });
        state.mode.told_full();
        state.whole_under = None;
        let limit = self.policy.load().limit;
        if let Some(held) = state.take_units(Instant::now(), self.alone_span(), limit, reply.units)
        {
            return Step::Done(FleetAnswer::Admit(held));
        }
        let refusal = reply
            .policy
            .queue_full(estimate, state.drain.rate(), ttl_left);
        Step::Done(FleetAnswer::Refuse(refusal))
    }

    /// The fleet's last read failed: refused at the streak on a fail-closed gate, else
    /// admitted open, in no block, and counted in the carry until settled. While the streak
    /// builds on a fail-closed gate, open only as far as what is known allows (see
    /// [`Self::open_bound`]).
    fn read_failed(&self, reply: &Reply) -> Step {
        let mut state = match self.still_current(reply, None) {
            Ok(state) => state,
            Err(instead) => return instead,
        };
        let epoch = reply.view.epoch.id;
        if let Some(refusal) = Self::open_bound(&mut state, reply) {
            return Step::Done(FleetAnswer::Refuse(refusal));
        }
        let bucket =
            state
                .window
                .record_units(reply.answered, epoch, self.alone_span(), reply.units);
        *state.open.entry(epoch).or_default() += reply.units;
        Step::Done(FleetAnswer::Admit(Held::Open { epoch, bucket }))
    }

    /// A fail-closed gate's refusal of sends with the fleet's read failed (contract section
    /// 2): at the streak; else past what is known, the epoch's last good read (none: the
    /// fleet's estimate this replica last knew, from before Redis lost the queue, or an
    /// empty queue) with every send the fleet counted since, and this replica's open sends
    /// weighed by the fleet's size (the others' not yet reported are bounded the same way
    /// on their replicas); past the resume level while refusing, as with a good read.
    fn open_bound(state: &mut SeatState, reply: &Reply) -> Option<Refusal> {
        let (policy, view) = (&reply.policy, &reply.view);
        if !policy.fail_closed {
            return None;
        }
        let unknown = Refusal::CapacityUnknown {
            consecutive_failures: view.streak,
            cause: Unknown::AdminPlane,
        };
        if view.streak >= policy.streak_threshold {
            return Some(unknown);
        }
        let known = match view.read {
            ReadState::Failed { standing: Some(_) } => Some(0),
            _ => state.estimate.map(|(estimate, _)| estimate),
        };
        let open = state.open.get(&view.epoch.id).copied().unwrap_or(0);
        let weight = view.replicas.max(state.fleet_size).max(1);
        let estimate = view
            .standing_estimate()
            .unwrap_or(0)
            .saturating_add(known.unwrap_or(0))
            .saturating_add(open.saturating_mul(weight));
        let refusing = state.mode.refusing()
            && policy.resume_below < Fraction::ONE
            && estimate > policy.resume_at();
        if !refusing && estimate.saturating_add(reply.units.saturating_mul(weight)) <= policy.limit
        {
            return None;
        }
        if known.is_none() {
            return Some(unknown);
        }
        if estimate >= policy.limit {
            state.mode.told_full();
        }
        let room = match refusing {
            true => 0,
            false => policy.limit.saturating_sub(estimate) / weight,
        };
        let full = policy.queue_full(estimate, state.drain.rate(), reply.ttl_left());
        Some(full.with_room(room))
    }

    /// No read could be made for the fleet (no replica published one in time): the depth
    /// is unknown, and the gate decides as for a failed read, never admitting past a
    /// fail-closed gate.
    fn unread_answer(&self, policy: &CapacityPolicy) -> FleetAnswer {
        let streak = self.state.lock().last.map_or(0, |(view, _)| view.streak);
        if policy.fail_closed {
            return FleetAnswer::Refuse(Refusal::CapacityUnknown {
                consecutive_failures: streak,
                cause: Unknown::AdminPlane,
            });
        }
        FleetAnswer::CutOff
    }

    pub(super) fn spawn_next_block(self: &Arc<Self>, due: bool) {
        if !due {
            return;
        }
        let seat = Arc::clone(self);
        self.runtime.spawn(async move {
            seat.reserve_next_block().await;
            seat.state.lock().running.next_block = false;
        });
    }

    /// Step 1's reservation, made for no send: a grant becomes a block whose every unit is
    /// left to hand out, under the rules of a send's (used only before `asked +`
    /// [`USE_BLOCK_FOR`] and under the ceiling it was granted at; given back if processed
    /// later or while leaving; dropped if of an epoch already replaced). Any other answer
    /// is left to the next send that finds no unit: it asks itself, and acts on it.
    async fn reserve_next_block(self: &Arc<Self>) {
        let _turn = self.next_block_turn.lock().await;
        if self.state.lock().mode.leaving() {
            return;
        }
        let out = self.outstanding.start();
        let asked = Instant::now();
        let (turn, block_id) = self.next_turn();
        let limit = self.policy.load().limit;
        let ask = self.ask(&block_id, 1, limit, out.others());
        let reply = self
            .fleet
            .ledger()
            .reserve(self.queue_ref(), self.caller(), ask)
            .await;
        let (answer, view) = match reply {
            Ok(reply) => reply,
            Err(error) => {
                self.fall_back(&error);
                return;
            }
        };
        let granted = match answer {
            ReserveAnswer::Granted { granted } => granted,
            _ => 0,
        };
        let epoch = view.epoch.id;
        if Instant::now() >= asked + USE_BLOCK_FOR {
            if granted > 0 {
                self.state.lock().give_back(epoch, turn, granted);
                self.schedule_settle();
            }
            return;
        }
        if !self.see(view) {
            return;
        }
        let mut state = self.state.lock();
        if state.seen.id != epoch {
            return;
        }
        if state.mode.leaving() {
            state.give_back(epoch, turn, granted);
            return;
        }
        state.note_grant(granted, limit, out.others() > 0);
        if granted > 0 {
            state.blocks.push_back(Block {
                epoch,
                turn,
                left: granted,
                use_until: asked + USE_BLOCK_FOR,
                limit,
            });
        }
    }
}
