//! One queue's seat in the fleet (`SENDGATE_COORDINATION=redis`): the replica's side of
//! docs/fleet.md, over any [`LedgerPort`].
//!
//! - **One admin read per TTL, fleet-wide**: the replica that takes the read lease reads the
//!   admin plane and publishes; the others use it. The read is started ahead of expiry, so
//!   under traffic no send waits for it.
//! - **Exact at the ceiling, free far from it**: headroom comes in blocks (a share of what is
//!   left, shrinking to one near the ceiling) handed out locally for [`USE_BLOCK_FOR`] from
//!   when they were asked for; outcomes are settled in batches every [`SETTLE_EVERY`].
//! - **Epochs**: every reply names the ledger's epoch. A new one (Redis lost the queue's
//!   state) drops this seat's blocks; what it admitted with them, and alone, is its
//!   *carry* ([`Window`]), reported with every call until a read shows it.
//! - **Cut off**, the seat hands out what its blocks hold before their use ends, and then
//!   nothing: [`FleetSeat::alone`] says what the replica may do on its own.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use tokio::time::Instant;

use super::local::LocalBounds;
use super::policy::{BacklogEffect, CapacityPolicy, GateSnapshot, PolicyCell, Refusal};
use super::window::{Window, ALONE};
use crate::admission::drain::DrainEstimator;
use crate::backend::{Backend, DepthError};
use crate::config::Fraction;
use crate::coordination::fleet::{Fleet, HEARTBEAT, IDLE, MEMBER_FOR};
use crate::coordination::port::{
    Ask, Caller, Epoch, LedgerError, QueueRef, ReadOutcome, ReadState, ReserveAnswer, Settle,
    Terms, View,
};
use crate::domain::QueueName;

/// Most headroom one reservation asks for: far from the ceiling (room ≥ 8 × this), one
/// Redis call per this many sends.
const BLOCK_WANT: u64 = 128;
/// A block is at most this share of the room left (1/8), so replicas split the headroom
/// and blocks shrink to one send near the ceiling.
const SHARE_DIVISOR: u64 = 8;
/// Far from the ceiling (the last grant was a whole [`BLOCK_WANT`]), the next block is
/// asked for once fewer units than this are left, so sends neither wait for Redis nor
/// each ask at once when the block runs out. Near it, grants are smaller and nothing is
/// asked for ahead.
const NEXT_BLOCK_BELOW: u64 = BLOCK_WANT / 2;
/// How long a block's headroom is handed out, from when it was asked for.
pub const USE_BLOCK_FOR: Duration = Duration::from_millis(500);
/// Outcomes are settled in one call per this period (per queue, per replica).
const SETTLE_EVERY: Duration = Duration::from_millis(100);
/// A replica tries a read ahead at most this often while another replica holds the lease.
const AHEAD_RETRY: Duration = Duration::from_millis(10);
/// How often a replica waiting for another's read asks whether it was published.
const WAIT_POLL: Duration = Duration::from_millis(10);
/// The margin in the hold for what the other terms do not name (scheduling, rounding).
const HOLD_MARGIN: Duration = Duration::from_secs(1);
/// How often a cut-off seat looks whether its replica rejoined (an atomic read, no call).
const REJOINED_POLL: Duration = Duration::from_millis(10);
/// A reservation is asked again at most this many times for one send (a new epoch, a read
/// to make, a grace to wait out).
const ASKS: usize = 4;

/// What an admission through the fleet holds, with the epoch of the ledger that counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// A unit of block `turn`.
    Block { epoch: u64, turn: u64 },
    /// Nothing reserved: admitted fail-open (the fleet's read failed); a stored outcome is
    /// still counted.
    Open { epoch: u64 },
}

/// The fleet's answer for one send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FleetAnswer {
    Admit(Held),
    Refuse(Refusal),
    /// Redis did not answer in time (the replica is now cut off): see [`FleetSeat::alone`].
    CutOff,
}

/// What a replica cut off from the fleet may do for one send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AloneAnswer {
    /// A unit of a block it still holds, before the block's use ends.
    Admit(Held),
    Refuse(Refusal),
    /// Failing open: its own gate decides with these bounds. The send is already counted in
    /// them, in the window at `counted` (when its deadline starts, see
    /// [`FleetSeat::alone`]); [`FleetSeat::take_back_alone`] with it if the gate refuses.
    Decide {
        bounds: LocalBounds,
        counted: Counted,
    },
}

/// Where and when [`FleetSeat::alone`] counted a send it left to the replica's own gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counted {
    /// The instant it was counted from: the send's deadline counts from here, as the hold
    /// that keeps it counted does.
    pub at: Instant,
    /// The end of the window's bucket it is in, to take it back from.
    bucket: Instant,
    /// How many sends (a batch's entries) it counted.
    units: u64,
}

/// How a drained replica's seat left the fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Goodbye {
    Left,
    /// Never in the fleet: nothing of it in Redis, no call made.
    NeverJoined,
}

/// A block granted to this replica, being handed out.
struct Block {
    epoch: u64,
    turn: u64,
    left: u64,
    use_until: Instant,
    /// The ceiling it was granted under: once a lower one is in force it is not used.
    limit: u64,
}

struct SeatState {
    /// The ledger's `(epoch, version)` in the newest reply processed.
    seen: Epoch,
    /// Blocks being handed out, oldest first; bounded (a block leaves once used up or past
    /// its use, and a new one is asked for when none is usable, or ahead: see
    /// [`NEXT_BLOCK_BELOW`]).
    blocks: VecDeque<Block>,
    /// The ceiling the last grant was made under, if it was a whole [`BLOCK_WANT`] (far
    /// from that ceiling).
    whole_under: Option<u64>,
    /// A reservation for the next block is in flight (one at a time).
    next_block_asked: bool,
    turns: u64,
    /// The fleet's state as last seen, and when (local clock).
    last: Option<(View, Instant)>,
    /// The fleet's size and estimate as last seen with a good read, kept while cut off.
    fleet_size: u64,
    estimate: Option<(u64, Instant)>,
    /// Outcomes to settle, by `(epoch, block turn)` (turn 0: open sends): (stored, not).
    pending: BTreeMap<(u64, u64), (u64, u64)>,
    /// By epoch: sends admitted open (no block holds them) in flight, plus their stored
    /// outcomes not yet settled, i.e. `pending[(epoch, 0)].0` (docs/fleet.md, step 1: every
    /// admitted send is counted somewhere at every instant). Reported in the carry until a
    /// settle that took them succeeded; then `since_read` counts them.
    open: BTreeMap<u64, u64>,
    flush_scheduled: bool,
    window: Window,
    ahead_tried_at: Option<Instant>,
    ahead_running: bool,
    /// The read generation another replica's read was last waited for in vain.
    waited_out: Option<u64>,
    last_read_took: Duration,
    /// Admin-plane reads this replica made for the fleet: (ok, failed).
    own_reads: (u64, u64),
    failclosed_logged: Option<u64>,
    failclosed_unlogged: u64,
    /// The fleet said "full" on this read generation: refuse locally until then.
    /// `(until, estimate, generation)`.
    full: Option<(Instant, u64, u64)>,
    drain: DrainEstimator,
    /// `(generation, backlog + since_read as last seen, when it was read)`.
    measured: Option<(u64, u64, Instant)>,
    /// Told "full" and not yet back at the resume level (`SENDGATE_RESUME_BELOW` < 1).
    refusing: bool,
    /// Drained and leaving: nothing more is admitted, in the fleet or alone.
    leaving: bool,
}

impl SeatState {
    fn new(lag: Duration) -> Self {
        Self {
            seen: Epoch::NONE,
            blocks: VecDeque::new(),
            whole_under: None,
            next_block_asked: false,
            turns: 0,
            last: None,
            fleet_size: 1,
            estimate: None,
            pending: BTreeMap::new(),
            open: BTreeMap::new(),
            flush_scheduled: false,
            window: Window::default(),
            ahead_tried_at: None,
            ahead_running: false,
            waited_out: None,
            last_read_took: Duration::ZERO,
            own_reads: (0, 0),
            failclosed_logged: None,
            failclosed_unlogged: 0,
            full: None,
            drain: DrainEstimator::new(lag),
            measured: None,
            refusing: false,
            leaving: false,
        }
    }

    /// `units` units of one block still in use (so they share one [`Held`]), granted
    /// under a ceiling no higher than `limit` (the one in force), if any: counted in the
    /// window under its epoch.
    fn take_units(&mut self, now: Instant, keep: Duration, limit: u64, units: u64) -> Option<Held> {
        let block = self
            .blocks
            .iter_mut()
            .find(|b| b.left >= units && now < b.use_until && b.limit <= limit)?;
        block.left -= units;
        let held = Held::Block {
            epoch: block.epoch,
            turn: block.turn,
        };
        let epoch = block.epoch;
        for _ in 0..units {
            self.window.record(now, epoch, keep);
        }
        Some(held)
    }

    /// Whether the next block should be asked for now (see [`NEXT_BLOCK_BELOW`]); if so, it
    /// is marked asked. Not once a lower ceiling is in force than the whole grant's.
    fn next_block_due(&mut self, now: Instant, limit: u64) -> bool {
        let far = self.whole_under.is_some_and(|under| under <= limit);
        if !far || self.next_block_asked || self.leaving {
            return false;
        }
        let left: u64 = self
            .blocks
            .iter()
            .filter(|b| now < b.use_until && b.limit <= limit)
            .map(|b| b.left)
            .sum();
        self.next_block_asked = left < NEXT_BLOCK_BELOW;
        self.next_block_asked
    }

    /// Blocks past their use, or granted under a higher ceiling than `limit`, give back what
    /// they did not hand out (to settle): counted still, those units would make this
    /// replica's sends, and the others', find the fleet full while they go unused. Whether
    /// any did.
    fn give_back_spent(&mut self, now: Instant, limit: u64) -> bool {
        let mut leftover = Vec::new();
        self.blocks.retain(|b| {
            let spent = now >= b.use_until || b.limit > limit;
            if b.left > 0 && spent {
                leftover.push((b.epoch, b.turn, b.left));
            }
            b.left > 0 && !spent
        });
        let any = !leftover.is_empty();
        for (epoch, turn, left) in leftover {
            self.pending.entry((epoch, turn)).or_default().1 += left;
        }
        any
    }
}

/// What a replica judges a send in the fleet by ([`FleetSeat::judged_estimate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Judged {
    /// The fleet's estimate of the backlog, less this replica's unused block units.
    pub estimate: u64,
    /// The ceiling in force.
    pub limit: u64,
    /// Replicas in the fleet (at least 1).
    pub replicas: u64,
    /// The share round of the fleet's read the estimate is of.
    pub round: u64,
}

pub struct FleetSeat {
    fleet: Arc<Fleet>,
    key: String,
    queue: QueueName,
    policy: Arc<PolicyCell>,
    /// Whose admin plane is read: the lane's backend.
    backend: Arc<dyn Backend>,
    send_timeout: Duration,
    state: Mutex<SeatState>,
    /// One read attempt at a time in this replica.
    read_turn: tokio::sync::Mutex<()>,
    /// Held by a reservation asked for ahead while it is out, so that a leave waits for it.
    next_block_turn: tokio::sync::Mutex<()>,
    /// The process's runtime, where the seat's own tasks run: a send may end on an HTTP
    /// worker's runtime, which the server drops when it stops.
    runtime: tokio::runtime::Handle,
}

impl FleetSeat {
    pub fn new(
        fleet: Arc<Fleet>,
        key: String,
        queue: QueueName,
        policy: Arc<PolicyCell>,
        backend: Arc<dyn Backend>,
        send_timeout: Duration,
    ) -> Arc<Self> {
        let seat = Arc::new(Self {
            state: Mutex::new(SeatState::new(backend.depth_lag())),
            fleet,
            key,
            queue,
            policy,
            backend,
            send_timeout,
            read_turn: tokio::sync::Mutex::new(()),
            next_block_turn: tokio::sync::Mutex::new(()),
            runtime: tokio::runtime::Handle::current(),
        });
        seat.fleet.register(seat.key.clone(), seat.terms());
        seat.runtime.spawn(Self::heartbeat(Arc::downgrade(&seat)));
        seat
    }

    /// The queue's timings under the policy in force (docs/fleet.md, "what it assumes").
    pub fn terms(&self) -> Terms {
        let policy = self.policy.load();
        let t = self.fleet.ledger().timeout();
        let lag = self.backend.depth_lag();
        let max_read_age = policy.ttl + policy.read_timeout;
        Terms {
            hold: self.send_timeout + lag + max_read_age + t * 2 + HOLD_MARGIN,
            lag,
            max_read_age,
            grace: grace(t),
            member_for: MEMBER_FOR,
            idle: IDLE,
        }
    }

    fn queue_ref(&self) -> QueueRef<'_> {
        QueueRef {
            key: &self.key,
            terms: self.terms(),
        }
    }

    /// Who this replica is to the ledger now, carrying what the ledger it knows misses.
    fn caller(&self) -> Caller<'_> {
        let hold = self.terms().hold;
        let state = self.state.lock();
        let seen = state.seen;
        let open = state.open.get(&seen.id).copied().unwrap_or(0);
        Caller {
            replica: self.fleet.replica(),
            seen,
            carry: state
                .window
                .carry(Instant::now(), hold, seen.id)
                .saturating_add(open),
        }
    }

    /// A new reservation's turn and its block's id (new for every ask).
    fn next_turn(&self) -> (u64, String) {
        let turn = {
            let mut state = self.state.lock();
            state.turns += 1;
            state.turns
        };
        (turn, self.block_id(turn))
    }

    fn block_id(&self, turn: u64) -> String {
        format!("{}:{turn}", self.fleet.replica())
    }

    pub fn joined(&self) -> bool {
        self.fleet.joined()
    }

    /// When the replica last turned local (see [`Fleet::local_since`]).
    pub fn local_since(&self) -> Instant {
        self.fleet.local_since()
    }

    /// A call failed: the second in a row cuts the replica off until Redis answers again
    /// (see [`Fleet::failed`]). Its blocks stay: their units may be handed out until their
    /// use ends. Whether it is cut off now.
    pub fn fall_back(&self, error: &LedgerError) -> bool {
        let cut_off = self.fleet.failed(error);
        if cut_off {
            self.state.lock().last = None;
        }
        cut_off
    }

    /// While in the fleet, be heard from within [`HEARTBEAT`] of the last reply, whatever
    /// call it answered, so a new epoch is learnt, and the carry reported, within the
    /// grace. The beat is due a heartbeat after that reply: on a fixed tick, a call made
    /// just after a tick would leave almost two heartbeats to the next. Cut off, it looks
    /// every [`REJOINED_POLL`] for the rejoin, after which it calls at once (it reports its
    /// carry to an epoch made while it was away). Ends with the seat.
    async fn heartbeat(seat: std::sync::Weak<Self>) {
        let mut wait = HEARTBEAT;
        loop {
            tokio::time::sleep(wait).await;
            let Some(seat) = seat.upgrade() else { return };
            if seat.state.lock().leaving {
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
    fn see(self: &Arc<Self>, view: View) -> bool {
        self.fleet.answered();
        let adopted = {
            let mut state = self.state.lock();
            if view.epoch.id < state.seen.id {
                return false;
            }
            let adopted = view.epoch.id != state.seen.id;
            if adopted {
                state.seen = view.epoch;
                state.blocks.clear();
                let current = view.epoch.id;
                state.pending.retain(|(epoch, _), _| *epoch == current);
                // Open sends of the old epoch are in the window under it: in the carry now.
                state.open.retain(|epoch, _| *epoch == current);
                state.full = None;
                state.refusing = false;
                state.measured = None;
                state.drain.break_chain();
            } else if view.epoch.version > state.seen.version {
                state.seen.version = view.epoch.version;
            }
            Self::see_view(&mut state, view, Instant::now());
            adopted && !state.leaving
        };
        if adopted {
            let seat = Arc::clone(self);
            self.runtime.spawn(async move { seat.beat().await });
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
                    state.drain.record(before, estimate, read_at - at);
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
    fn still_refusing(&self, state: &mut SeatState, now: Instant) -> Option<Refusal> {
        let policy = self.policy.load();
        if !state.refusing || policy.resume_below >= Fraction::ONE {
            return None;
        }
        let (view, seen) = state.last?;
        let estimate = view.estimate()?;
        if estimate <= policy.resume_at() {
            state.refusing = false;
            return None;
        }
        let until = seen + policy.ttl.saturating_sub(view.read_age);
        state.full = Some((until, estimate, view.generation));
        Some(policy.queue_full(
            estimate,
            state.drain.rate(),
            until.saturating_duration_since(now),
        ))
    }

    /// The view last seen holds a read younger than the TTL.
    fn fresh(&self, state: &SeatState, now: Instant) -> bool {
        state.last.is_some_and(|(view, seen)| {
            view.read != ReadState::Never && view.read_age + (now - seen) < self.policy.load().ttl
        })
    }

    /// Decide one send against the fleet's ceiling (docs/fleet.md, steps 1 and 2).
    pub async fn admit(self: &Arc<Self>) -> FleetAnswer {
        self.admit_units(1).await
    }

    /// [`Self::admit`] for `units` sends at once (a batch): all admitted under one
    /// [`Held`] (a block's units, or one reservation of exactly `units`: docs/fleet.md, a
    /// batch), or none, the refusal saying how many would be (`room`).
    pub async fn admit_units(self: &Arc<Self>, units: u64) -> FleetAnswer {
        let units = units.max(1);
        let now = Instant::now();
        let (fresh, ahead, released) = {
            let mut state = self.state.lock();
            if state.leaving {
                return FleetAnswer::Refuse(Refusal::Stopped);
            }
            let age = state.last.map(|(view, seen)| view.read_age + (now - seen));
            let fresh = self.fresh(&state, now);
            // A live block's units are counted fleet-wide until its lease ends, whatever
            // the age of the read it was granted on: use them first.
            let limit = self.policy.load().limit;
            if let Some(held) = state.take_units(now, self.alone_span(), limit, units) {
                let ahead = self.ahead_due(&mut state, age, now);
                let next_block = state.next_block_due(now, limit);
                drop(state);
                self.spawn_ahead(ahead);
                self.spawn_next_block(next_block);
                return FleetAnswer::Admit(held);
            }
            let generation = state.last.map(|(view, _)| view.generation);
            if let Some((until, estimate, _)) = state
                .full
                .filter(|(until, _, seen)| now < *until && Some(*seen) == generation)
            {
                let ahead = self.ahead_due(&mut state, age, now);
                let rate = state.drain.rate();
                drop(state);
                self.spawn_ahead(ahead);
                return FleetAnswer::Refuse(self.policy.load().queue_full(
                    estimate,
                    rate,
                    until - now,
                ));
            }
            let ahead = fresh && self.ahead_due(&mut state, age, now);
            // Before this send reserves.
            let released = state.give_back_spent(now, self.policy.load().limit);
            (fresh, ahead, released)
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
        });
        for _ in 0..ASKS {
            match self.reserve_once(&mut counted, units).await {
                Step::Done(decided) => return decided,
                Step::Again(unanswered) => answer = unanswered,
            }
        }
        answer
    }

    /// One reservation, and what it means for this send (`counted`: see [`FleetSeat::admit`]),
    /// or these `units` sends: a single send asks for a block it takes one unit of, a batch
    /// for exactly its size (divisor 1: all of the room if need be, never more).
    async fn reserve_once(self: &Arc<Self>, counted: &mut bool, units: u64) -> Step {
        let ledger = self.fleet.ledger();
        // The block is handed out for its use from when it was asked for, which is before
        // its lease began in Redis.
        let asked = Instant::now();
        let (turn, block_id) = self.next_turn();
        let policy = self.policy.load_full();
        let terms = self.terms();
        let (want, divisor) = if units == 1 {
            (BLOCK_WANT, SHARE_DIVISOR)
        } else {
            (units, 1)
        };
        let ask = Ask {
            block_id: &block_id,
            want,
            limit: policy.limit,
            divisor,
            lease: USE_BLOCK_FOR + terms.hold,
        };
        let reply = ledger.reserve(self.queue_ref(), self.caller(), ask).await;
        let now = Instant::now();
        let (reservation, view) = match reply {
            Ok(reply) => reply,
            // Asked again once: a slow answer is not a partition (what the call may have
            // reserved comes back when its lease ends).
            Err(error) if !self.fall_back(&error) => {
                return Step::Again(FleetAnswer::Refuse(Refusal::CapacityUnknown {
                    consecutive_failures: 0,
                }))
            }
            Err(_) => return Step::Done(FleetAnswer::CutOff),
        };
        if now >= asked + USE_BLOCK_FOR {
            // Late (a paused process, a starved runtime): past its use, its first unit would
            // go to a send whose deadline starts now, which the block's lease (counted from
            // before the ask) may not outlive. Given back, never used. Earlier, the send is
            // stored by `asked + USE_BLOCK_FOR + D`, within the lease.
            if let ReserveAnswer::Granted { granted } = reservation {
                let mut state = self.state.lock();
                let epoch = view.epoch.id;
                state.pending.entry((epoch, turn)).or_default().1 += granted;
            }
            self.schedule_settle();
            self.fleet.fall_back(&LedgerError::Timeout);
            self.state.lock().last = None;
            return Step::Done(FleetAnswer::CutOff);
        }
        let current = self.see(view);
        let ask_again = |streak| {
            Step::Again(FleetAnswer::Refuse(Refusal::CapacityUnknown {
                consecutive_failures: streak,
            }))
        };
        if !current {
            // Answered by a ledger of an epoch this seat already saw replaced: a grant's
            // block is not in the current one, so it is not used (nothing to give back: the
            // state that held it is gone).
            return ask_again(view.streak);
        }
        match reservation {
            ReserveAnswer::Unread => {
                // A send that waited out a grace finds the read it made too old: the one it
                // makes again is still its one read (not counted twice in the streak).
                match self.refresh(true, !*counted).await {
                    Ok(read) => *counted |= read,
                    Err(error) => {
                        if self.fall_back(&error) {
                            return Step::Done(FleetAnswer::CutOff);
                        }
                    }
                }
                return Step::Again(self.unread_answer(&policy));
            }
            ReserveAnswer::Recovering => {
                tokio::time::sleep(view.grace_left.min(self.terms().grace)).await;
                return ask_again(view.streak);
            }
            ReserveAnswer::NewEpoch => return ask_again(view.streak),
            _ => {}
        }
        let mut state = self.state.lock();
        let epoch = view.epoch.id;
        if state.seen.id != epoch {
            // Another call's reply adopted a newer epoch since this one was seen (the lock
            // was let go in between): this grant's block is not in the current state.
            return ask_again(view.streak);
        }
        if state.leaving {
            if let ReserveAnswer::Granted { granted } = reservation {
                state.pending.entry((epoch, turn)).or_default().1 += granted;
            }
            return Step::Done(FleetAnswer::Refuse(Refusal::Stopped));
        }
        if let ReserveAnswer::Granted { granted } = reservation {
            if self.policy.load().limit < policy.limit {
                // Lowered while the call was out: not room under the ceiling in force.
                state.pending.entry((epoch, turn)).or_default().1 += granted;
                drop(state);
                self.schedule_settle();
                return ask_again(view.streak);
            }
        }
        if let ReserveAnswer::Granted { granted } = reservation {
            if granted < units {
                // Less room than the batch: none of it is used (given back), and the
                // refusal says how much there was.
                state.pending.entry((epoch, turn)).or_default().1 += granted;
                let ttl_left = policy.ttl.saturating_sub(view.read_age);
                let rate = state.drain.rate();
                drop(state);
                self.schedule_settle();
                let refusal =
                    policy.queue_full(policy.limit.saturating_sub(granted), rate, ttl_left);
                return Step::Done(FleetAnswer::Refuse(refusal.with_room(granted)));
            }
        }
        Step::Done(match reservation {
            ReserveAnswer::Granted { granted } => {
                for _ in 0..units {
                    state.window.record(now, epoch, self.alone_span());
                }
                if units == 1 {
                    state.whole_under = (granted >= BLOCK_WANT).then_some(policy.limit);
                }
                let rest = granted.saturating_sub(units);
                if rest > 0 {
                    state.blocks.push_back(Block {
                        epoch,
                        turn,
                        left: rest,
                        use_until: asked + USE_BLOCK_FOR,
                        limit: policy.limit,
                    });
                }
                FleetAnswer::Admit(Held::Block { epoch, turn })
            }
            ReserveAnswer::Full { estimate } => {
                // Cached at most a block's use: headroom others hold unused comes back
                // within that.
                let ttl_left = policy.ttl.saturating_sub(view.read_age);
                let until = now + ttl_left.min(USE_BLOCK_FOR);
                state.full = Some((until, estimate, view.generation));
                state.refusing = true;
                state.whole_under = None;
                FleetAnswer::Refuse(policy.queue_full(estimate, state.drain.rate(), ttl_left))
            }
            ReserveAnswer::Disabled => FleetAnswer::Refuse(Refusal::QueueDisabled),
            ReserveAnswer::Unknown
                if policy.fail_closed && view.streak >= policy.streak_threshold =>
            {
                FleetAnswer::Refuse(Refusal::CapacityUnknown {
                    consecutive_failures: view.streak,
                })
            }
            ReserveAnswer::Unknown => {
                for _ in 0..units {
                    state.window.record(now, epoch, self.alone_span());
                }
                // In no block: counted in the carry until settled.
                *state.open.entry(epoch).or_default() += units;
                FleetAnswer::Admit(Held::Open { epoch })
            }
            ReserveAnswer::Unread | ReserveAnswer::Recovering | ReserveAnswer::NewEpoch => {
                unreachable!("answered above")
            }
        })
    }

    fn spawn_next_block(self: &Arc<Self>, due: bool) {
        if !due {
            return;
        }
        let seat = Arc::clone(self);
        self.runtime.spawn(async move {
            seat.reserve_next_block().await;
            seat.state.lock().next_block_asked = false;
        });
    }

    /// Step 1's reservation, made for no send: a grant becomes a block whose every unit is
    /// left to hand out, under the rules of a send's (used only before `asked +`
    /// [`USE_BLOCK_FOR`] and under the ceiling it was granted at; given back if processed
    /// later or while leaving; dropped if of an epoch already replaced). Any other answer
    /// is left to the next send that finds no unit: it asks itself, and acts on it.
    async fn reserve_next_block(self: &Arc<Self>) {
        let _turn = self.next_block_turn.lock().await;
        if self.state.lock().leaving {
            return;
        }
        let asked = Instant::now();
        let (turn, block_id) = self.next_turn();
        let limit = self.policy.load().limit;
        let ask = Ask {
            block_id: &block_id,
            want: BLOCK_WANT,
            limit,
            divisor: SHARE_DIVISOR,
            lease: USE_BLOCK_FOR + self.terms().hold,
        };
        let reply = self
            .fleet
            .ledger()
            .reserve(self.queue_ref(), self.caller(), ask)
            .await;
        let (reservation, view) = match reply {
            Ok(reply) => reply,
            Err(error) => {
                self.fall_back(&error);
                return;
            }
        };
        let granted = match reservation {
            ReserveAnswer::Granted { granted } => granted,
            _ => 0,
        };
        let epoch = view.epoch.id;
        if Instant::now() >= asked + USE_BLOCK_FOR {
            if granted > 0 {
                self.state
                    .lock()
                    .pending
                    .entry((epoch, turn))
                    .or_default()
                    .1 += granted;
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
        if state.leaving {
            state.pending.entry((epoch, turn)).or_default().1 += granted;
            return;
        }
        state.whole_under = (granted >= BLOCK_WANT).then_some(limit);
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

    /// No read could be made for the fleet (no replica published one in time): the depth
    /// is unknown, and the gate decides as for a failed read, never admitting past a
    /// fail-closed gate.
    fn unread_answer(&self, policy: &CapacityPolicy) -> FleetAnswer {
        let streak = self.state.lock().last.map_or(0, |(view, _)| view.streak);
        if policy.fail_closed {
            return FleetAnswer::Refuse(Refusal::CapacityUnknown {
                consecutive_failures: streak,
            });
        }
        FleetAnswer::CutOff
    }

    /// How long an admission counts in the fail-open rule (docs/fleet.md, step 6): a hold
    /// until every read a reservation uses shows it, and a block's use and a hold more until
    /// what the reservations made meanwhile granted (which this replica's own read, all it
    /// has when cut off, cannot see) shows in that read. The longest span the window keeps.
    fn alone_span(&self) -> Duration {
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
        if state.leaving {
            return AloneAnswer::Refuse(Refusal::Stopped);
        }
        if let Some(held) = state.take_units(now, span, policy.limit, units) {
            return AloneAnswer::Admit(held);
        }
        if policy.fail_closed {
            return AloneAnswer::Refuse(Refusal::CapacityUnknown {
                consecutive_failures: state.last.map_or(0, |(view, _)| view.streak),
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

    /// A send admitted through the fleet ended: its outcome is settled with the next batch.
    pub fn finish(self: &Arc<Self>, held: Held, effect: BacklogEffect) {
        let stored = effect != BacklogEffect::NotStored;
        {
            let mut state = self.state.lock();
            let row = match held {
                Held::Block { epoch, turn } => (epoch, turn),
                Held::Open { epoch } => (epoch, 0),
            };
            let entry = state.pending.entry(row).or_default();
            match (held, stored) {
                (_, true) => entry.0 += 1,
                (Held::Block { .. }, false) => entry.1 += 1,
                (Held::Open { epoch }, false) => {
                    // Never stored: it need not be counted any more.
                    if let Some(open) = state.open.get_mut(&epoch) {
                        *open = open.saturating_sub(1);
                    }
                }
            }
        }
        self.schedule_settle();
    }

    fn schedule_settle(self: &Arc<Self>) {
        let schedule = {
            let mut state = self.state.lock();
            !state.pending.is_empty() && !std::mem::replace(&mut state.flush_scheduled, true)
        };
        if schedule {
            self.runtime.spawn(Arc::clone(self).settle_until_counted());
        }
    }

    /// Settle the batch; while Redis fails, keep what was stored and try again each
    /// [`REJOIN_EVERY`](crate::coordination::fleet::REJOIN_EVERY). One task per seat.
    async fn settle_until_counted(self: Arc<Self>) {
        let mut wait = SETTLE_EVERY;
        loop {
            tokio::time::sleep(wait).await;
            let Err(error) = self.settle_pending().await else {
                return;
            };
            self.fall_back(&error);
            if std::mem::replace(&mut self.state.lock().flush_scheduled, true) {
                return; // a send finished meanwhile and scheduled the next batch
            }
            wait = crate::coordination::fleet::REJOIN_EVERY;
        }
    }

    /// One settle call with this epoch's rows (another epoch's sends are in the carry).
    /// On failure the stored sends are kept, to be settled again as open (whether the call
    /// took their units is unknown: counted twice meanwhile, the safe side); units not
    /// taken stay in their block until its lease ends.
    async fn settle_pending(self: &Arc<Self>) -> Result<(), LedgerError> {
        let (rows, epoch, open) = {
            let mut state = self.state.lock();
            state.flush_scheduled = false;
            let epoch = state.seen.id;
            let pending = std::mem::take(&mut state.pending);
            let open = pending.get(&(epoch, 0)).map_or(0, |(stored, _)| *stored);
            let rows: Vec<(String, u64, u64)> = pending
                .into_iter()
                .filter(|((e, _), _)| *e == epoch)
                .map(|((_, turn), (stored, not))| (self.block_id(turn), stored, not))
                .collect();
            (rows, epoch, open)
        };
        if rows.is_empty() {
            return Ok(());
        }
        let batch: Vec<Settle<'_>> = rows
            .iter()
            .map(|(id, stored, not_stored)| Settle {
                block_id: id,
                stored: *stored,
                not_stored: *not_stored,
            })
            .collect();
        let settled = self
            .fleet
            .ledger()
            .settle(self.queue_ref(), self.caller(), &batch)
            .await;
        match settled {
            Ok(view) => {
                // Open sends stay in the carry until now (this call's carry counted them
                // too: twice for a moment, the safe side), never in neither.
                if let Some(left) = self.state.lock().open.get_mut(&epoch) {
                    *left = left.saturating_sub(open);
                }
                self.see(view);
                Ok(())
            }
            Err(error) => {
                let unsettled: u64 = batch.iter().map(|s| s.stored).sum();
                if unsettled > 0 {
                    let mut state = self.state.lock();
                    state.pending.entry((epoch, 0)).or_default().0 += unsettled;
                    // Row (epoch, 0) is counted in the carry: the block sends now in it too.
                    *state.open.entry(epoch).or_default() += unsettled.saturating_sub(open);
                }
                Err(error)
            }
        }
    }

    /// The replica drained and its HTTP server stopped: settle what its sends left, give
    /// back what its blocks did not hand out, and leave, in one call. From the moment this
    /// starts the seat admits nothing. What it admitted that no read shows yet stays
    /// counted: sends in flight in their blocks' leases, its carry until its hold.
    pub async fn leave(self: &Arc<Self>) -> Result<Goodbye, LedgerError> {
        self.state.lock().leaving = true;
        // A reservation asked for ahead and still out would put this replica back in the
        // fleet after its goodbye (every call names it a member): its grant is given back
        // below instead.
        drop(self.next_block_turn.lock().await);
        if !self.fleet.ever_joined() {
            return Ok(Goodbye::NeverJoined);
        }
        let rows: Vec<(String, u64, u64)> = {
            let mut state = self.state.lock();
            let epoch = state.seen.id;
            let mut pending = std::mem::take(&mut state.pending);
            // The leave script settles these rows with the carry it records, in one step:
            // the open sends among them leave the carry as they enter `since_read` (the
            // carry outlives the goodbye by a hold, and would count them twice that long).
            let settled_open = pending.get(&(epoch, 0)).map_or(0, |(stored, _)| *stored);
            if let Some(open) = state.open.get_mut(&epoch) {
                *open = open.saturating_sub(settled_open);
            }
            for block in std::mem::take(&mut state.blocks) {
                if block.left > 0 {
                    pending.entry((block.epoch, block.turn)).or_default().1 += block.left;
                }
            }
            pending
                .into_iter()
                .filter(|((e, _), _)| *e == epoch)
                .map(|((_, turn), (stored, not))| (self.block_id(turn), stored, not))
                .collect()
        };
        let batch: Vec<Settle<'_>> = rows
            .iter()
            .map(|(id, stored, not_stored)| Settle {
                block_id: id,
                stored: *stored,
                not_stored: *not_stored,
            })
            .collect();
        let caller = self.caller();
        let named = caller.seen.id;
        let view = self
            .fleet
            .ledger()
            .leave(self.queue_ref(), caller, &batch)
            .await?;
        if view.epoch.id != named {
            // The state was made anew (and named another epoch): the goodbye recorded no
            // carry and settled nothing. Adopted, every admission of the hold is carry now
            // (its rows are dropped with the old epoch): said again, the carry is kept until
            // its hold ends, as step 7 promises.
            self.see(view);
            self.fleet
                .ledger()
                .leave(self.queue_ref(), self.caller(), &[])
                .await?;
        }
        Ok(Goodbye::Left)
    }

    /// [`FleetSeat::leave`], and say how it went (a failure is only logged: what it holds
    /// then expires as a killed replica's would).
    pub async fn say_goodbye(self: &Arc<Self>) -> Result<Goodbye, LedgerError> {
        let goodbye = self.leave().await;
        match &goodbye {
            Ok(Goodbye::Left) => tracing::info!(
                event = "coordination_left",
                queue = %self.queue,
                "drained: left the fleet, what its blocks did not use is the others' again"
            ),
            Ok(Goodbye::NeverJoined) => {}
            Err(error) => tracing::warn!(
                event = "coordination_leave_failed",
                queue = %self.queue,
                error = %error,
                "could not leave the fleet: what this replica held comes back when its leases end"
            ),
        }
        goodbye
    }

    /// Whether this send should start a read ahead of expiry (throttled while another
    /// replica holds the lease).
    fn ahead_due(&self, state: &mut SeatState, age: Option<Duration>, now: Instant) -> bool {
        let Some(age) = age else { return false };
        let ttl = self.policy.load().ttl;
        let lead = (state.last_read_took * 2).max(AHEAD_RETRY).min(ttl / 2);
        if age + lead < ttl {
            return false;
        }
        if state.ahead_running
            || state
                .ahead_tried_at
                .is_some_and(|at| now < at + AHEAD_RETRY)
        {
            return false;
        }
        state.ahead_tried_at = Some(now);
        state.ahead_running = true;
        true
    }

    fn spawn_ahead(self: &Arc<Self>, ahead: bool) {
        if !ahead {
            return;
        }
        let seat = Arc::clone(self);
        self.runtime.spawn(async move {
            let refreshed = seat.refresh(false, true).await;
            seat.state.lock().ahead_running = false;
            if let Err(e) = refreshed {
                seat.fall_back(&e);
            }
        });
    }

    /// Make the fleet's read fresh: read the admin plane if this replica gets the lease,
    /// otherwise (when `wait`) wait for the replica that holds it to publish. A read made
    /// here counts in the streak when `counts`; true if one that counts was published.
    async fn refresh(self: &Arc<Self>, wait: bool, counts: bool) -> Result<bool, LedgerError> {
        let _turn = self.read_turn.lock().await;
        // The send before this one in line made the read fresh: no Redis call.
        if wait && self.fresh(&self.state.lock(), Instant::now()) {
            return Ok(false);
        }
        let ledger = self.fleet.ledger();
        let mut seen = ledger.heartbeat(self.queue_ref(), self.caller()).await?;
        self.see(seen);
        if wait && seen.grace_left > Duration::ZERO {
            // A new epoch grants nothing within its grace: the read is made after it, so
            // the reservation that follows finds it fresh rather than read again (a failed
            // read counts in the streak).
            tokio::time::sleep(seen.grace_left.min(self.terms().grace)).await;
            seen = ledger.heartbeat(self.queue_ref(), self.caller()).await?;
            self.see(seen);
        }
        if wait && self.fresh(&self.state.lock(), Instant::now()) {
            return Ok(false); // another replica published while this one queued
        }
        let lease = self.policy.load().ttl.max(Duration::from_millis(1));
        let (ticket, view) = ledger
            .lease_read(self.queue_ref(), self.caller(), lease)
            .await?;
        self.see(view);
        match ticket {
            Some(ticket) => {
                let started = Instant::now();
                let (outcome, error) = self.read_admin_plane().await;
                let published = ledger
                    .publish_read(self.queue_ref(), self.caller(), ticket, outcome, counts)
                    .await?;
                Self::count_read(&mut self.state.lock(), &outcome);
                if let Some(error) = error {
                    tracing::warn!(
                        event = "depth_read_failed",
                        queue = %self.queue,
                        consecutive_failures = published.streak,
                        error = %error,
                        "could not read the queue depth (published to the fleet)"
                    );
                }
                self.state.lock().last_read_took = started.elapsed();
                self.see(published);
                return Ok(counts);
            }
            // Another replica reads: wait for its read, at most a read's deadline. A reader
            // that died holds the lease until it ends: once one send waited that read out,
            // those queued behind it do not each wait it out again.
            None if wait && self.state.lock().waited_out != Some(view.generation) => {
                let deadline = Instant::now() + self.policy.base().read_timeout;
                loop {
                    if Instant::now() >= deadline {
                        self.state.lock().waited_out = Some(view.generation);
                        break;
                    }
                    tokio::time::sleep(WAIT_POLL).await;
                    let now = ledger.heartbeat(self.queue_ref(), self.caller()).await?;
                    self.see(now);
                    if now.generation != view.generation || now.epoch.id != view.epoch.id {
                        break;
                    }
                }
            }
            None => {}
        }
        Ok(false)
    }

    async fn read_admin_plane(&self) -> (ReadOutcome, Option<DepthError>) {
        let deadline = Instant::now() + self.policy.base().read_timeout;
        let read = self.backend.backlog(&self.queue, deadline);
        match tokio::time::timeout_at(deadline, read).await {
            Ok(Ok(backlog)) => (
                ReadOutcome::Ok {
                    backlog: backlog.messages,
                    send_disabled: backlog.send_disabled,
                },
                None,
            ),
            Ok(Err(error)) => (ReadOutcome::Failed, Some(error)),
            Err(_) => (ReadOutcome::Failed, Some(DepthError::Timeout)),
        }
    }

    /// A fail-closed refusal is logged once per fleet read, with the count since the last
    /// line (this one included).
    pub fn failclosed_to_log(&self) -> Option<u64> {
        let mut state = self.state.lock();
        let generation = state.last.map(|(view, _)| view.generation);
        state.failclosed_unlogged += 1;
        if state.failclosed_logged.is_some() && state.failclosed_logged == generation {
            return None;
        }
        state.failclosed_logged = generation;
        Some(std::mem::take(&mut state.failclosed_unlogged))
    }

    /// Read the fleet's state once at start-up (a failed read does not count in the streak).
    pub async fn prime(self: &Arc<Self>) -> Result<(), LedgerError> {
        let _turn = self.read_turn.lock().await;
        let ledger = self.fleet.ledger();
        let seen = ledger.heartbeat(self.queue_ref(), self.caller()).await?;
        self.see(seen);
        if self.fresh(&self.state.lock(), Instant::now()) {
            return Ok(());
        }
        let lease = self.policy.load().ttl.max(Duration::from_millis(1));
        let (ticket, view) = ledger
            .lease_read(self.queue_ref(), self.caller(), lease)
            .await?;
        self.see(view);
        if let Some(ticket) = ticket {
            let (outcome, _) = self.read_admin_plane().await;
            let published = ledger
                .publish_read(self.queue_ref(), self.caller(), ticket, outcome, false)
                .await?;
            Self::count_read(&mut self.state.lock(), &outcome);
            self.see(published);
        }
        Ok(())
    }

    fn count_read(state: &mut SeatState, outcome: &ReadOutcome) {
        match outcome {
            ReadOutcome::Ok { .. } => state.own_reads.0 += 1,
            ReadOutcome::Failed => state.own_reads.1 += 1,
        }
    }

    /// The fleet's estimate as this replica may judge a send by (docs/fairness.md, "In a
    /// fleet"), with the ceiling in force, the fleet's size and the read it is of: the last
    /// view's estimate, less the units its own blocks still hold (counted in it, not yet
    /// used). `None` without a good read in that view.
    pub fn judged_estimate(&self) -> Option<Judged> {
        let now = Instant::now();
        let state = self.state.lock();
        let policy = self.policy.load();
        let limit = policy.limit;
        let (view, _) = state.last?;
        let estimate = view.estimate()?;
        let unused: u64 = state
            .blocks
            .iter()
            .filter(|b| now < b.use_until && b.limit <= limit)
            .map(|b| b.left)
            .sum();
        Some(Judged {
            estimate: estimate.saturating_sub(unused),
            limit,
            replicas: state.fleet_size.max(1),
            round: policy.share_round(view.generation),
        })
    }

    /// A send the judge refused never reaches the seat, so it starts the read ahead when
    /// one is due, as a send's would: else a replica whose sends the judge all refuses would
    /// judge by one old read for as long as they come. A send that reaches the seat makes
    /// its own read (one failed read per send in the streak, contract section 2).
    pub fn read_ahead_if_due(self: &Arc<Self>) {
        let now = Instant::now();
        let ahead = {
            let mut state = self.state.lock();
            let age = state.last.map(|(view, seen)| view.read_age + (now - seen));
            self.ahead_due(&mut state, age, now)
        };
        self.spawn_ahead(ahead);
    }

    /// The share round of the fleet's read in the view last seen.
    pub fn share_round(&self) -> u64 {
        self.policy.load().share_round(self.read_generation())
    }

    /// The fleet's read generation in the view last seen (0 before any): it changes with
    /// each read the fleet publishes.
    pub fn read_generation(&self) -> u64 {
        self.state
            .lock()
            .last
            .map_or(0, |(view, _)| view.generation)
    }

    /// Admin-plane reads this replica made for the fleet: (ok, failed).
    pub fn own_reads(&self) -> (u64, u64) {
        self.state.lock().own_reads
    }

    /// The fleet's view of this queue as last seen, while in the fleet (the read counts are
    /// this replica's own).
    pub fn snapshot(&self) -> Option<GateSnapshot> {
        let state = self.state.lock();
        let (view, seen) = state.last?;
        let policy = self.policy.load();
        let unknown = !matches!(view.read, ReadState::Ok { .. });
        let backlog = view.estimate();
        let resume = policy.resume_at();
        let refusing = state.refusing && policy.resume_below < Fraction::ONE;
        Some(GateSnapshot {
            backlog,
            drain_rate: state.drain.rate(),
            refusing_until_backlog: backlog
                .filter(|b| (refusing && *b > resume) || *b >= policy.limit)
                .map(|_| resume),
            limit: policy.limit,
            consecutive_failures: view.streak,
            fail_closed: unknown && policy.fail_closed && view.streak >= policy.streak_threshold,
            last_read_ok_at: matches!(view.read, ReadState::Ok { .. })
                .then(|| SystemTime::now().checked_sub(view.read_age + seen.elapsed()))
                .flatten(),
            reads_ok: state.own_reads.0,
            reads_failed: state.own_reads.1,
        })
    }
}

/// `G` (docs/fleet.md, step 5): long enough for every replica that Redis answers to report
/// its carry to an epoch made at `b`. A replica in the fleet at `b` had its last reply at
/// most `T` after `b` and calls a heartbeat after it. A restart cuts every replica off at
/// once, and each rejoins at its own probe: within a probe period and a deadline of the
/// first one back, which made the epoch, then calls within [`REJOINED_POLL`]. Each then
/// learns the epoch (a deadline) and reports its carry (another): at most
/// `max(HEARTBEAT, REJOIN_EVERY + REJOINED_POLL) + 3T` after `b`.
fn grace(t: Duration) -> Duration {
    HEARTBEAT * 2 + t * 4
}

/// One reservation's result: decided, or ask again (with the answer should no ask remain).
enum Step {
    Done(FleetAnswer),
    Again(FleetAnswer),
}

#[cfg(test)]
mod tests;
