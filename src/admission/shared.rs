//! One queue's ceiling shared by the fleet (`SENDGATE_COORDINATION=redis`): the
//! [`FleetSeat`] a [`CapacityGate`](super::capacity::CapacityGate) consults while its
//! replica is in the fleet.
//!
//! - **One admin read per TTL, fleet-wide**: the replica that takes the read lease (held
//!   for the TTL) reads the admin plane and publishes the outcome; the others use it. The
//!   read is started ahead of expiry, so under traffic no send waits for it.
//! - **One streak**: failures are published, so every replica takes the same fail-closed
//!   decision on the same read.
//! - **Exact at the ceiling, free far from it**: headroom is reserved in blocks (a share of
//!   what remains, shrinking to one near the ceiling) that this replica hands out locally
//!   for [`USE_BLOCK_FOR`]; outcomes are settled in batches every [`SETTLE_EVERY`]. Each
//!   grant is a block of its own ([`BlockTurn`]), never extended. A block's
//!   lease outlives its use by a send deadline (and a Redis call's, since the lease starts
//!   before the grant arrives), so sends still in flight stay counted, and a
//!   replica killed holding a block gives it back when the lease ends.
//!
//! - **Drain rate and hysteresis**: the drain rate is measured from the fleet's successive
//!   reads as this replica sees them, with the fleet's counts (see [`FleetSeat::see`]). The
//!   refusing state (`SENDGATE_RESUME_BELOW`) is this replica's: once the fleet said "full" to
//!   it, it refuses until the fleet's estimate is at or below the resume level.
//!
//! Every call here may fail with a [`LedgerError`]: the caller then falls back to the local
//! gate for that send, and the fleet status to local mode.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use tokio::time::Instant;

use super::capacity::{BacklogEffect, GateSnapshot, PolicyCell, Refusal};
use super::drain::DrainEstimator;
use crate::backend::{Backend, DepthError};
use crate::config::Fraction;
use crate::coordination::fleet::{Fleet, REJOIN_EVERY};
use crate::coordination::ledger::HEARTBEAT;
use crate::coordination::ledger::{
    LedgerError, QueueKeys, ReadOutcome, Reservation, Settle, SharedRead, SharedState,
};
use crate::domain::QueueName;

/// Most headroom one reservation asks for.
const BLOCK_WANT: u64 = 32;
/// A block is at most this share of the room left (1/8), so replicas split the headroom
/// and blocks shrink to one send near the ceiling.
const SHARE_DIVISOR: u64 = 8;
/// How long a block's headroom is handed out before what is left goes back.
pub const USE_BLOCK_FOR: Duration = Duration::from_millis(500);
/// Outcomes are settled in one call per this period (per queue, per replica).
const SETTLE_EVERY: Duration = Duration::from_millis(50);
/// A replica tries a read ahead at most this often while another replica holds the lease.
const AHEAD_RETRY: Duration = Duration::from_millis(10);
/// How often a replica waiting for another's read asks whether it was published.
const WAIT_POLL: Duration = Duration::from_millis(10);

/// What an admission in the fleet holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// A unit of this replica's block, of the block's [`BlockTurn`].
    Block(BlockTurn),
    /// Nothing reserved: admitted fail-open (no good read); stored outcomes still count.
    Open,
}

/// Which of this replica's blocks a unit came from. Every grant is a block of its own,
/// `{replica}:{turn}`, with its own lease that nothing extends: headroom lost on the way (a
/// fall back with units unused, a reservation that ran in Redis after its caller gave up, a
/// batch that failed) returns when that lease ends, however busy the replica stays; and a late
/// settle finds nothing under an expired id instead of taking units that sends in flight of a
/// newer block hold (which would free headroom they use: an overshoot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct BlockTurn(u64);

/// A block granted to this replica, being handed out.
struct Block {
    turn: u64,
    /// Headroom not yet handed out, and until when it may be.
    left: u64,
    use_until: Instant,
}

struct SeatState {
    /// Blocks being handed out, oldest first. Sends that found none at the same moment each
    /// reserve one, and every grant is kept (handing out the oldest first), so concurrent
    /// reservations cost no extra round trips. Bounded: a block leaves once used up or past
    /// its use, and a new one is asked for only when none is usable.
    blocks: VecDeque<Block>,
    /// The last turn given to a reservation.
    turns: u64,
    /// The fleet's read as last seen, and when (local clock).
    last: Option<(SharedRead, Instant)>,
    /// What the fleet last said with a good read, kept across a fall back (see
    /// [`FleetSeat::departure`]).
    view: Option<FleetView>,
    /// Outcomes to settle, by block: (stored, not stored).
    pending_blocks: BTreeMap<BlockTurn, (u64, u64)>,
    pending_open_stored: u64,
    /// Of the sends this replica admitted alone (its own gate, Redis out of reach), those
    /// stored and waiting to be settled (as open), and all of them not yet in Redis's count
    /// (in flight, or stored and unsettled): what its share must still cover.
    pending_alone_stored: u64,
    alone_unsettled: u64,
    flush_scheduled: bool,
    ahead_tried_at: Option<Instant>,
    /// A read ahead runs in the background: no second one is queued behind it.
    ahead_running: bool,
    /// The read generation another replica's read was last waited for in vain.
    waited_out: Option<u64>,
    last_read_took: Duration,
    /// Admin-plane reads this replica made for the fleet: (ok, failed). `/metrics` counts a
    /// process's own reads (the fleet-wide totals in Redis would jump at every switch to
    /// local mode and back, and add up N times across N replicas).
    own_reads: (u64, u64),
    /// The read generation whose fail-closed refusals were last logged, and those since.
    failclosed_logged: Option<u64>,
    failclosed_unlogged: u64,
    /// The fleet said "full" on this read generation: refuse locally until that read
    /// expires (or a newer one is seen), as a local gate does, instead of asking Redis
    /// for every refusal at the ceiling. `(until, estimate, generation)`.
    full: Option<(Instant, u64, u64)>,
    /// The drain rate, from the fleet's reads as seen here.
    drain: DrainEstimator,
    /// The newest good read seen: `(generation, backlog + since_read as last seen, when it
    /// was read)`, the previous end of the next measured pair.
    measured: Option<(u64, u64, Instant)>,
    /// The fleet said "full" to this replica and its estimate has not yet come back to the
    /// resume level (used only with `SENDGATE_RESUME_BELOW` under 1).
    refusing: bool,
    /// The replica drained and is leaving the fleet (see [`FleetSeat::leave`]): no more
    /// heartbeats, and no send admitted, in the fleet or alone.
    leaving: bool,
}

/// The fleet as this replica last saw it.
#[derive(Debug, Clone, Copy)]
struct FleetView {
    /// Replicas in the fleet (at least this one).
    replicas: u64,
    /// With the last good read: backlog + sends stored since the read + headroom every
    /// replica holds, and when it was seen.
    estimate: Option<(u64, Instant)>,
    /// The newest share Redis recorded for this replica: `(share, sequence number, when its
    /// answer arrived)`. Replies may be handled out of order: an older one never replaces it.
    share: Option<(u64, u64, Instant)>,
}

/// What a replica that turned local keeps of the fleet, so that its own gate keeps the
/// fleet's ceiling without Redis:
/// - **its share** (`allowance`, with the sequence number it came with): what Redis last
///   recorded it may admit alone. Every other replica's reservations are checked with that
///   share counted (`reserve.lua`), so it is never given to anyone else: admitting it alone
///   keeps the fleet under the ceiling. Until `allowance_until`, a little before the fleet
///   forgets a replica it has not heard from (its horizon: it then withholds the share
///   until a read taken a send deadline and the admin plane's lag after it is published,
///   so every send admitted with it shows in the read the others reserve against);
/// - after that (a long outage) it admits as if each of the `replicas` it knew admitted as
///   much as it does (its own count × `replicas` on top of the backlog its reads see), so a
///   fleet all alone still stays under the ceiling;
/// - **a floor** under the backlog its reads see until `floor_until`: the fleet's estimate
///   includes sends the others stored that a lagging admin plane (RabbitMQ's management
///   statistics) does not show yet, and sends the others had in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Departure {
    pub replicas: u64,
    pub allowance: Option<(u64, u64)>,
    pub allowance_until: Instant,
    pub floor: u64,
    pub floor_until: Instant,
}

impl SeatState {
    /// Nothing seen, held or pending yet; `lag` is the admin plane's (for the drain rate).
    fn new(lag: Duration) -> Self {
        Self {
            blocks: VecDeque::new(),
            turns: 0,
            last: None,
            view: None,
            pending_blocks: BTreeMap::new(),
            pending_open_stored: 0,
            pending_alone_stored: 0,
            alone_unsettled: 0,
            flush_scheduled: false,
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
}

/// How a drained replica's seat left the fleet (see [`FleetSeat::leave`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Goodbye {
    /// Settled, and out of the fleet: its share is the others' again.
    Left,
    /// Settled, but `alone_in_flight` sends it admitted alone are still running (a drain
    /// cut short): its share, which covers them, is left to expire as a killed replica's.
    ShareKept { alone_in_flight: u64 },
    /// Never in the fleet (Redis never answered this replica): nothing of it in Redis to
    /// settle or take back, and no call made.
    NeverJoined,
}

pub struct FleetSeat {
    fleet: Arc<Fleet>,
    keys: QueueKeys,
    queue: QueueName,
    policy: Arc<PolicyCell>,
    /// How long a block stays counted: its use, plus a send's deadline, plus the longest
    /// its grant may take to arrive (the lease starts when the script runs), plus a margin.
    block_lease: Duration,
    /// This replica's name: its blocks are `{replica}:{turn}`, its open sends `{replica}-open`.
    replica: String,
    open_id: String,
    state: Mutex<SeatState>,
    /// One read attempt at a time in this replica.
    read_turn: tokio::sync::Mutex<()>,
    /// Held by a settle on its way to Redis, so the goodbye (which settles what is left)
    /// knows whether the sends admitted alone are all counted.
    settle_turn: tokio::sync::Mutex<()>,
    /// The runtime the seat was made on (the process's), where its own tasks run: a send
    /// may end on an HTTP worker's runtime, which the server drops when it stops, before
    /// the goodbye; a settle spawned there would die with it.
    runtime: tokio::runtime::Handle,
}

impl FleetSeat {
    pub fn new(
        fleet: Arc<Fleet>,
        keys: QueueKeys,
        queue: QueueName,
        policy: impl Into<Arc<PolicyCell>>,
        send_timeout: Duration,
    ) -> Arc<Self> {
        let policy = policy.into();
        fleet.register(keys.clone());
        let replica = fleet.replica().to_owned();
        let block_lease =
            USE_BLOCK_FOR + send_timeout + fleet.ledger().timeout() + Duration::from_secs(1);
        let seat = Arc::new(Self {
            open_id: format!("{replica}-open"),
            replica,
            fleet,
            keys,
            queue,
            block_lease,
            state: Mutex::new(SeatState::new(policy.base().lag)),
            read_turn: tokio::sync::Mutex::new(()),
            settle_turn: tokio::sync::Mutex::new(()),
            runtime: tokio::runtime::Handle::current(),
            policy,
        });
        seat.runtime.spawn(Self::heartbeat(Arc::downgrade(&seat)));
        seat
    }

    /// While in the fleet, be heard from at least every [`HEARTBEAT`]: a replica not heard
    /// from may have turned local, and the others withhold its share of the room
    /// (`reserve.lua`). A seat busy with sends makes no extra call; an idle one asks for the
    /// shared read, which also keeps its view of the fleet (size, estimate) fresh for a fall
    /// back. Ends with the seat.
    async fn heartbeat(seat: std::sync::Weak<Self>) {
        loop {
            tokio::time::sleep(HEARTBEAT).await;
            let Some(seat) = seat.upgrade() else { return };
            if seat.state.lock().leaving {
                return;
            }
            if !seat.fleet.joined() {
                continue;
            }
            let quiet = seat
                .state
                .lock()
                .last
                .is_none_or(|(_, seen)| seen.elapsed() >= HEARTBEAT);
            if !quiet {
                continue;
            }
            if let Err(error) = seat.settle_alone_first().await {
                seat.fall_back(&error);
                continue;
            }
            if seat.state.lock().leaving {
                return;
            }
            let ledger = seat.fleet.ledger();
            match ledger
                .shared_read_as(
                    &seat.keys,
                    seat.fleet.replica(),
                    seat.policy.load().limit,
                    seat.next_call(),
                    seat.acked(),
                )
                .await
            {
                Ok(read) => Self::see(&mut seat.state.lock(), read, Instant::now()),
                Err(error) => seat.fall_back(&error),
            }
        }
    }

    /// Record the fleet's read as seen now, and measure the drain between two good reads:
    /// the fleet's estimate of the older one as last seen here (its backlog plus every
    /// send the fleet stored since) minus the newer one's as first seen. Sends stored between
    /// those two sightings are missing from the first and counted in the second, so the
    /// drain is under-estimated by them (a longer `Retry-After`: the safe side); at the
    /// ceiling, where the fleet admits next to nothing, the two agree.
    fn see(state: &mut SeatState, read: SharedRead, now: Instant) {
        state.last = Some((read, now));
        let before = state.view;
        let share = match before.and_then(|v| v.share) {
            Some(kept @ (_, seq, _)) if seq >= read.share_seq => Some(kept),
            _ if read.share_seq > 0 => Some((read.share, read.share_seq, now)),
            kept => kept,
        };
        let replicas = if read.replicas > 0 {
            read.replicas
        } else {
            before.map_or(1, |v| v.replicas)
        };
        let SharedState::Ok { backlog, .. } = read.state else {
            state.view = Some(FleetView {
                replicas,
                estimate: before.and_then(|v| v.estimate),
                share,
            });
            return;
        };
        let fleet_estimate = backlog
            .saturating_add(read.since_read)
            .saturating_add(read.reserved);
        state.view = Some(FleetView {
            replicas,
            estimate: Some((fleet_estimate, now)),
            share,
        });
        let estimate = backlog.saturating_add(read.since_read);
        let read_at = now.checked_sub(read.age).unwrap_or(now);
        match state.measured {
            Some((generation, _, at)) if generation == read.generation => {
                state.measured = Some((generation, estimate, at));
            }
            Some((generation, before, at)) if generation < read.generation => {
                if read_at > at {
                    state.drain.record(before, estimate, read_at - at);
                }
                state.measured = Some((read.generation, estimate, read_at));
            }
            // An older reply overtaken by a newer one: nothing new.
            Some((_, _, at)) if read_at <= at => {}
            // The ledger's keys expired and its generations started again.
            _ => {
                state.drain.break_chain();
                state.measured = Some((read.generation, estimate, read_at));
            }
        }
    }

    /// With hysteresis on: refusing since the fleet said "full", and the fleet's estimate on
    /// the read last seen not yet back at or below the resume level. Refused here, cached
    /// like a "full" answer, without asking Redis.
    fn still_refusing(&self, state: &mut SeatState, now: Instant) -> Option<Refusal> {
        if !state.refusing || self.policy.load().resume_below >= Fraction::ONE {
            return None;
        }
        let (read, seen) = state.last?;
        let SharedState::Ok { backlog, .. } = read.state else {
            return None;
        };
        let estimate = backlog
            .saturating_add(read.since_read)
            .saturating_add(read.reserved);
        if estimate <= self.policy.load().resume_at() {
            state.refusing = false;
            return None;
        }
        let until = seen + self.policy.load().ttl.saturating_sub(read.age);
        state.full = Some((until, estimate, read.generation));
        Some(self.policy.load().queue_full(
            estimate,
            state.drain.rate(),
            until.saturating_duration_since(now),
        ))
    }

    pub fn joined(&self) -> bool {
        self.fleet.joined()
    }

    /// When the replica last turned local (see [`Fleet::local_since`]).
    pub fn local_since(&self) -> Instant {
        self.fleet.local_since()
    }

    /// While the replica is local after a spell in the fleet: what its own gate keeps of
    /// the fleet (see [`Departure`]). `None` in the fleet, or when it never heard from
    /// the fleet (it started without Redis: it knows of no one to share with).
    pub fn departure(&self) -> Option<Departure> {
        if self.fleet.joined() {
            return None;
        }
        let view = self.state.lock().view?;
        let now = Instant::now();
        let (floor, seen) = view.estimate.unwrap_or((0, now));
        let ledger = self.fleet.ledger();
        Some(Departure {
            replicas: view.replicas.max(1),
            allowance: view.share.map(|(share, seq, _)| (share, seq)),
            // The fleet forgets this replica (and its share) a member horizon after the
            // script that last heard from it ran; its answer arrived up to a deadline later.
            allowance_until: view.share.map_or(now, |(_, _, heard)| {
                heard + ledger.member_for().saturating_sub(ledger.timeout() * 2)
            }),
            floor,
            // Sends the others stored by then are in the admin plane's count once its lag
            // has passed; those they had in flight end within a block's lease; a read
            // finishing by then may have started before (its own deadline).
            floor_until: seen
                + self.policy.base().lag
                + self.block_lease
                + self.policy.base().read_timeout,
        })
    }

    /// Turn the replica to local mode after a failed call.
    pub fn fall_back(&self, error: &LedgerError) {
        self.fleet.fall_back(error);
        let mut state = self.state.lock();
        state.blocks.clear();
        state.last = None;
    }

    /// Decide one send against the fleet's ceiling. Once the seat is leaving the fleet,
    /// every send is refused ([`Refusal::Stopped`]).
    pub async fn admit(
        self: &Arc<Self>,
        backend: &Arc<dyn Backend>,
    ) -> Result<Result<Held, Refusal>, LedgerError> {
        let now = Instant::now();
        let (fresh, ahead, leftover) = {
            let mut state = self.state.lock();
            if state.leaving {
                return Ok(Err(Refusal::Stopped));
            }
            let age = state.last.map(|(read, seen)| read.age + (now - seen));
            let fresh = state
                .last
                .is_some_and(|(read, _)| read.state != SharedState::Never)
                && age.is_some_and(|a| a < self.policy.load().ttl);
            // Headroom already reserved for this replica is counted fleet-wide until its
            // lease ends, whatever the age of the read it was granted on: use it first (a
            // stale read is refreshed in the background). Asking Redis instead would count
            // this replica's own unused block against it and refuse a send the fleet has room for.
            if let Some(block) = state
                .blocks
                .iter_mut()
                .find(|b| b.left > 0 && now < b.use_until)
            {
                block.left -= 1;
                let turn = BlockTurn(block.turn);
                // Within the lead of the TTL, or past it: one read in the background
                // (throttled, so a flood of sends spawns no flood of reads).
                let ahead = self.ahead_due(&mut state, age, now);
                drop(state);
                self.spawn_ahead(ahead, backend);
                return Ok(Ok(Held::Block(turn)));
            }
            let generation = state.last.map(|(read, _)| read.generation);
            if let Some((until, estimate, _)) = state
                .full
                .filter(|(until, _, seen)| now < *until && Some(*seen) == generation)
            {
                let ahead = self.ahead_due(&mut state, age, now);
                let rate = state.drain.rate();
                drop(state);
                self.spawn_ahead(ahead, backend);
                return Ok(Err(self.policy.load().queue_full(
                    estimate,
                    rate,
                    until - now,
                )));
            }
            let ahead = fresh && self.ahead_due(&mut state, age, now);
            // The block's use is over: what it did not hand out goes back now (else with
            // its lease).
            let mut leftover = Vec::new();
            state.blocks.retain(|b| {
                if b.left > 0 && now >= b.use_until {
                    leftover.push((b.turn, b.left));
                }
                b.left > 0 && now < b.use_until
            });
            (fresh, ahead, leftover)
        };
        self.settle_alone_first().await?;
        if self.state.lock().leaving {
            return Ok(Err(Refusal::Stopped)); // the goodbye began while this waited
        }
        if !fresh {
            self.refresh(backend, true).await?;
        }
        self.spawn_ahead(ahead, backend);
        let refused = self.still_refusing(&mut self.state.lock(), Instant::now());
        self.release_leftover(&leftover).await?;
        if let Some(refusal) = refused {
            return Ok(Err(refusal));
        }
        let ledger = self.fleet.ledger();
        // The block is handed out for its use from when it was asked for, which is before
        // its lease began in Redis, however late the answer.
        let asked = Instant::now();
        let turn = {
            let mut state = self.state.lock();
            state.turns += 1;
            state.turns
        };
        let reservation = ledger
            .reserve_acked(
                &self.keys,
                &self.block_id(turn),
                BLOCK_WANT,
                self.policy.load().limit,
                SHARE_DIVISOR,
                self.block_lease,
                self.acked(),
            )
            .await?;
        let now = Instant::now();
        let mut state = self.state.lock();
        Ok(match reservation {
            Reservation::Granted { granted, read } => {
                Self::see(&mut state, read, now);
                // `refusing` is left as it is: only the estimate back at the resume level
                // ends it (`still_refusing`, before this send asked). A grant that was on its
                // way while another send's "full" arrived must not end it (review finding).
                let rest = granted.saturating_sub(1);
                if rest > 0 {
                    state.blocks.push_back(Block {
                        turn,
                        left: rest,
                        use_until: asked + USE_BLOCK_FOR,
                    });
                }
                Ok(Held::Block(BlockTurn(turn)))
            }
            Reservation::Full { estimate, read } => {
                Self::see(&mut state, read, now);
                // Cached at most a block's use: headroom other replicas hold unused comes
                // back within that, and one Redis call per replica per period is cheap.
                let until = now
                    + self
                        .policy
                        .load()
                        .ttl
                        .saturating_sub(read.age)
                        .min(USE_BLOCK_FOR);
                state.full = Some((until, estimate, read.generation));
                state.refusing = true;
                Err(self.policy.load().queue_full(
                    estimate,
                    state.drain.rate(),
                    self.policy.load().ttl.saturating_sub(read.age),
                ))
            }
            Reservation::Disabled { read } => {
                Self::see(&mut state, read, now);
                Err(Refusal::QueueDisabled)
            }
            Reservation::Unknown { read } => {
                Self::see(&mut state, read, now);
                if self.policy.load().fail_closed
                    && read.streak >= self.policy.load().streak_threshold
                {
                    Err(Refusal::CapacityUnknown {
                        consecutive_failures: read.streak,
                    })
                } else {
                    Ok(Held::Open)
                }
            }
        })
    }

    /// Back in the fleet, what this replica stored alone is settled before any call that
    /// records its new share (a reservation, a heartbeat): that share is then computed with
    /// those sends counted, and the gate's count against the old one may start again.
    async fn settle_alone_first(&self) -> Result<(), LedgerError> {
        if self.nothing_open_or_alone_pending() {
            return Ok(());
        }
        let _turn = self.settle_turn.lock().await;
        let (open, alone) = {
            let mut state = self.state.lock();
            // A goodbye began while this waited for the turn: it settles these itself (or
            // the settle batch does after it), and no call of this one delays it.
            if state.leaving {
                return Ok(());
            }
            (
                std::mem::take(&mut state.pending_open_stored),
                std::mem::take(&mut state.pending_alone_stored),
            )
        };
        if open + alone == 0 {
            return Ok(());
        }
        let settled = self
            .fleet
            .ledger()
            .settle(&self.keys, &self.open_id, open + alone, 0)
            .await;
        let mut state = self.state.lock();
        match settled {
            Ok(()) => state.alone_unsettled = state.alone_unsettled.saturating_sub(alone),
            Err(_) => {
                state.pending_open_stored += open;
                state.pending_alone_stored += alone;
            }
        }
        settled
    }

    fn nothing_open_or_alone_pending(&self) -> bool {
        let state = self.state.lock();
        state.pending_open_stored + state.pending_alone_stored == 0
    }

    /// The replica drained and its HTTP server stopped: settle what its sends left — their
    /// outcomes, the headroom its blocks did not hand out, what it stored alone — and leave
    /// the fleet, in one atomic call ([`Ledger::leave`]), so the others get its share of the
    /// room at once instead of a member horizon later. From the moment this starts the seat
    /// admits nothing, in the fleet or alone ([`Refusal::Stopped`]): once Redis has given
    /// its share away, a send admitted alone on it would be counted nowhere. With sends
    /// admitted alone still running (a drain cut short), their outcomes are unknown and its
    /// share must go on covering them: what is there is settled and the share is left to
    /// expire. Waits for the settle turn, then makes one call: ahead of it may be the call
    /// of whatever held the turn when this began, and the settle batch if it queued before
    /// (the turn is first come, first served; a settle of what was stored alone that gets
    /// the turn after this began makes no call), so at most three Redis deadlines. No
    /// heartbeat after it. A replica never in the fleet makes no call
    /// ([`Goodbye::NeverJoined`]).
    ///
    /// [`Ledger::leave`]: crate::coordination::ledger::Ledger::leave
    pub async fn leave(&self) -> Result<Goodbye, LedgerError> {
        self.state.lock().leaving = true;
        if !self.fleet.ever_joined() {
            return Ok(Goodbye::NeverJoined);
        }
        let _turn = self.settle_turn.lock().await;
        // Taken for good: whether this call goes through or not, the process is ending.
        let (blocks, open, alone, alone_in_flight) = {
            let mut state = self.state.lock();
            let mut blocks = std::mem::take(&mut state.pending_blocks);
            for block in std::mem::take(&mut state.blocks) {
                if block.left > 0 {
                    blocks.entry(BlockTurn(block.turn)).or_default().1 += block.left;
                }
            }
            let open = std::mem::take(&mut state.pending_open_stored);
            let alone = std::mem::take(&mut state.pending_alone_stored);
            (
                blocks,
                open,
                alone,
                state.alone_unsettled.saturating_sub(alone),
            )
        };
        let rows = self.settle_rows(blocks, open + alone);
        let batch = settle_batch(&rows);
        let ledger = self.fleet.ledger();
        if alone_in_flight > 0 {
            ledger.settle_batch(&self.keys, &batch).await?;
            return Ok(Goodbye::ShareKept { alone_in_flight });
        }
        ledger.leave(&self.keys, &self.replica, &batch).await?;
        Ok(Goodbye::Left)
    }

    /// [`FleetSeat::leave`], and say how it went: a failure is only logged (the share then
    /// expires as a killed replica's would). A seat that was never in the fleet says
    /// nothing.
    pub async fn say_goodbye(&self) -> Result<Goodbye, LedgerError> {
        let goodbye = self.leave().await;
        match &goodbye {
            Ok(Goodbye::Left) => tracing::info!(
                event = "coordination_left",
                queue = %self.queue,
                "drained: left the fleet, its share of the room is the others' again"
            ),
            Ok(Goodbye::ShareKept { alone_in_flight }) => tracing::warn!(
                event = "coordination_left_share_kept",
                queue = %self.queue,
                alone_in_flight,
                "drained with sends admitted alone still running: the fleet keeps this replica's share until it expires"
            ),
            Ok(Goodbye::NeverJoined) => {}
            Err(error) => tracing::warn!(
                event = "coordination_leave_failed",
                queue = %self.queue,
                error = %error,
                "could not leave the fleet: the others get its share of the room back only once it expires (a member horizon, then a send deadline and the lag, then the next read)"
            ),
        }
        goodbye
    }

    /// A send is admitted by this replica alone (its own gate decided): counted against
    /// its share until Redis has it (see [`FleetSeat::alone_unsettled`]). False once the
    /// seat is leaving the fleet: the send must be refused, as Redis gives that share to
    /// the others (decided under the lock the goodbye counts these sends under).
    pub fn admitted_alone(&self) -> bool {
        let mut state = self.state.lock();
        if state.leaving {
            return false;
        }
        state.alone_unsettled += 1;
        true
    }

    /// Sends admitted alone that Redis does not count yet: in flight, or stored and not yet
    /// settled. The share Redis holds for this replica must cover them. A count, never reset
    /// by a newer share: a reply handled late, or computed before they were settled, would
    /// otherwise let the share be spent twice (review finding).
    pub fn alone_unsettled(&self) -> u64 {
        self.state.lock().alone_unsettled
    }

    /// A send admitted alone ended: stored (or unknown), it is settled as open with the next
    /// batch; definitely not stored, it no longer counts against the share.
    pub fn finish_alone(self: &Arc<Self>, effect: BacklogEffect) {
        let schedule = {
            let mut state = self.state.lock();
            if effect == BacklogEffect::NotStored {
                state.alone_unsettled = state.alone_unsettled.saturating_sub(1);
                return;
            }
            state.pending_alone_stored += 1;
            !std::mem::replace(&mut state.flush_scheduled, true)
        };
        if schedule {
            self.runtime.spawn(Arc::clone(self).settle_until_counted());
        }
    }

    /// Give back what blocks past their use did not hand out, in one call.
    async fn release_leftover(&self, leftover: &[(u64, u64)]) -> Result<(), LedgerError> {
        let ids: Vec<(String, u64)> = leftover
            .iter()
            .map(|&(turn, left)| (self.block_id(turn), left))
            .collect();
        let batch: Vec<Settle<'_>> = ids
            .iter()
            .map(|(id, left)| Settle::new(id, 0, *left))
            .collect();
        self.fleet.ledger().settle_batch(&self.keys, &batch).await
    }

    /// The next number of this seat's share-recording calls (shared with its block ids'
    /// turns, so every call's number is higher than the last: see `record_share`).
    fn next_call(&self) -> u64 {
        let mut state = self.state.lock();
        state.turns += 1;
        state.turns
    }

    /// The number of the newest share this seat heard of (0: none): Redis withholds from
    /// the others the largest share of this replica's calls since, whose answers may be lost.
    fn acked(&self) -> u64 {
        self.state
            .lock()
            .view
            .and_then(|v| v.share)
            .map_or(0, |(_, seq, _)| seq)
    }

    fn block_id(&self, turn: u64) -> String {
        format!("{}:{turn}", self.replica)
    }

    /// Whether this send should start a read ahead of expiry (throttled while another
    /// replica holds the lease).
    fn ahead_due(&self, state: &mut SeatState, age: Option<Duration>, now: Instant) -> bool {
        let Some(age) = age else { return false };
        let lead = (state.last_read_took * 2)
            .max(AHEAD_RETRY)
            .min(self.policy.load().ttl / 2);
        if age + lead < self.policy.load().ttl {
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

    fn spawn_ahead(self: &Arc<Self>, ahead: bool, backend: &Arc<dyn Backend>) {
        if !ahead {
            return;
        }
        let (seat, backend) = (Arc::clone(self), Arc::clone(backend));
        self.runtime.spawn(async move {
            let refreshed = seat.refresh(&backend, false).await;
            seat.state.lock().ahead_running = false;
            if let Err(e) = refreshed {
                seat.fall_back(&e);
            }
        });
    }

    /// Make the fleet's read fresh: read the admin plane if this replica gets the lease,
    /// otherwise (when `wait`) wait for the replica that holds it to publish.
    async fn refresh(&self, backend: &Arc<dyn Backend>, wait: bool) -> Result<(), LedgerError> {
        let _turn = self.read_turn.lock().await;
        // The send before this one in line made the read fresh: no Redis call. Each one
        // queued here would otherwise make its own round trip while holding the turn, so the
        // last of N waiting sends waited N round trips.
        if wait && self.fresh(Instant::now()) {
            return Ok(());
        }
        let ledger = self.fleet.ledger();
        let seen = ledger
            .shared_read_as(
                &self.keys,
                self.fleet.replica(),
                self.policy.load().limit,
                self.next_call(),
                self.acked(),
            )
            .await?;
        Self::see(&mut self.state.lock(), seen, Instant::now());
        if seen.state != SharedState::Never && seen.age < self.policy.load().ttl && wait {
            return Ok(()); // another replica published while this one queued
        }
        let lease = self.policy.load().ttl.max(Duration::from_millis(1));
        match ledger
            .lease_read(&self.keys, self.fleet.replica(), lease)
            .await?
        {
            Some(ticket) => {
                let started = Instant::now();
                let deadline = started + self.policy.base().read_timeout;
                let read = backend.backlog(&self.queue, deadline);
                let (outcome, error) = match tokio::time::timeout_at(deadline, read).await {
                    Ok(Ok(backlog)) => (
                        ReadOutcome::Ok {
                            backlog: backlog.messages,
                            send_disabled: backlog.send_disabled,
                        },
                        None,
                    ),
                    Ok(Err(error)) => (ReadOutcome::Failed, Some(error)),
                    Err(_) => (ReadOutcome::Failed, Some(DepthError::Timeout)),
                };
                let published = ledger
                    .publish_read(&self.keys, ticket, outcome, true)
                    .await?;
                Self::count_read(&mut self.state.lock(), &outcome);
                if let Some(error) = error {
                    // Logged with the fleet's streak, as a local gate logs its own (alerts
                    // compare it with the fail-closed threshold).
                    tracing::warn!(
                        event = "depth_read_failed",
                        queue = %self.queue,
                        consecutive_failures = published.streak,
                        error = %error,
                        "could not read the queue depth (published to the fleet)"
                    );
                }
                let mut state = self.state.lock();
                state.last_read_took = started.elapsed();
                Self::see(&mut state, published, Instant::now());
            }
            // Another replica reads: wait for its read, at most a read's deadline. A reader
            // that died holds the lease until it ends (a TTL, maybe far longer): once one send
            // waited that read out, those queued behind it do not each wait it out again.
            None if wait && self.state.lock().waited_out != Some(seen.generation) => {
                let deadline = Instant::now() + self.policy.base().read_timeout;
                loop {
                    if Instant::now() >= deadline {
                        self.state.lock().waited_out = Some(seen.generation);
                        break;
                    }
                    tokio::time::sleep(WAIT_POLL).await;
                    let now = ledger
                        .shared_read_as(
                            &self.keys,
                            self.fleet.replica(),
                            self.policy.load().limit,
                            self.next_call(),
                            self.acked(),
                        )
                        .await?;
                    Self::see(&mut self.state.lock(), now, Instant::now());
                    if now.generation != seen.generation {
                        break;
                    }
                }
            }
            None => {}
        }
        Ok(())
    }

    /// The fleet's read as last seen is younger than the TTL.
    fn fresh(&self, now: Instant) -> bool {
        self.state.lock().last.is_some_and(|(read, seen)| {
            read.state != SharedState::Never && read.age + (now - seen) < self.policy.load().ttl
        })
    }

    /// A send admitted through the fleet ended: its outcome is settled with the next batch.
    pub fn finish(self: &Arc<Self>, held: Held, effect: BacklogEffect) {
        let stored = effect != BacklogEffect::NotStored;
        let schedule = {
            let mut state = self.state.lock();
            match (held, stored) {
                (Held::Block(turn), true) => state.pending_blocks.entry(turn).or_default().0 += 1,
                (Held::Block(turn), false) => state.pending_blocks.entry(turn).or_default().1 += 1,
                (Held::Open, true) => state.pending_open_stored += 1,
                (Held::Open, false) => return,
            }
            !std::mem::replace(&mut state.flush_scheduled, true)
        };
        if schedule {
            self.runtime.spawn(Arc::clone(self).settle_until_counted());
        }
    }

    /// Settle the batch; while Redis fails, keep what was stored and try again each
    /// [`REJOIN_EVERY`]. A stored send dropped with a failed call would vanish from the
    /// fleet's count (its block's headroom returns when the lease ends) until the next read:
    /// the fleet would admit it twice. One such task per seat at a time.
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
            wait = REJOIN_EVERY;
        }
    }

    /// One settle call's rows, `(id, stored, not stored)`: each block's, then the sends
    /// no block took (`open`: stored on top of the read, and those stored alone).
    fn settle_rows(
        &self,
        blocks: BTreeMap<BlockTurn, (u64, u64)>,
        open: u64,
    ) -> Vec<(String, u64, u64)> {
        let mut rows: Vec<(String, u64, u64)> = blocks
            .into_iter()
            .map(|(turn, (stored, not_stored))| (self.block_id(turn.0), stored, not_stored))
            .collect();
        if open > 0 {
            rows.push((self.open_id.clone(), open, 0));
        }
        rows
    }

    /// On failure, the stored sends not yet counted are put back before the settle turn
    /// is let go (a goodbye that takes it next must find them), to be settled again as
    /// *open* (counted on top of the read, taking nothing from a block: whether the failed
    /// call took their units is unknown). Units not taken stay in their block until its
    /// lease ends (counted twice meanwhile: the safe side), as do the not-stored ones.
    async fn settle_pending(&self) -> Result<(), LedgerError> {
        let _turn = self.settle_turn.lock().await;
        let (blocks, open, alone) = {
            let mut state = self.state.lock();
            state.flush_scheduled = false;
            (
                std::mem::take(&mut state.pending_blocks),
                std::mem::take(&mut state.pending_open_stored),
                std::mem::take(&mut state.pending_alone_stored),
            )
        };
        let rows = self.settle_rows(blocks, open + alone);
        let batch = settle_batch(&rows);
        // One atomic call: on failure none of it happened (or all of it did, with the reply
        // lost), so every stored send of the batch is kept to be settled again.
        let unsettled: u64 = batch.iter().map(|s| s.stored).sum::<u64>() - alone;
        let settled = self.fleet.ledger().settle_batch(&self.keys, &batch).await;
        let mut state = self.state.lock();
        match settled {
            Ok(()) => state.alone_unsettled = state.alone_unsettled.saturating_sub(alone),
            Err(_) => {
                state.pending_open_stored += unsettled;
                state.pending_alone_stored += alone;
            }
        }
        settled
    }

    /// A fail-closed refusal is logged once per fleet read, with the count since the last
    /// line (this one included).
    pub fn failclosed_to_log(&self) -> Option<u64> {
        let mut state = self.state.lock();
        let generation = state.last.map(|(read, _)| read.generation);
        state.failclosed_unlogged += 1;
        if state.failclosed_logged.is_some() && state.failclosed_logged == generation {
            return None;
        }
        state.failclosed_logged = generation;
        Some(std::mem::take(&mut state.failclosed_unlogged))
    }

    /// Read the fleet's state once at start-up (a failure does not count in the streak).
    pub async fn prime(&self, backend: &Arc<dyn Backend>) -> Result<(), LedgerError> {
        let _turn = self.read_turn.lock().await;
        let ledger = self.fleet.ledger();
        let seen = ledger
            .shared_read_as(
                &self.keys,
                self.fleet.replica(),
                self.policy.load().limit,
                self.next_call(),
                self.acked(),
            )
            .await?;
        Self::see(&mut self.state.lock(), seen, Instant::now());
        if seen.state != SharedState::Never && seen.age < self.policy.load().ttl {
            return Ok(());
        }
        let lease = self.policy.load().ttl.max(Duration::from_millis(1));
        if let Some(ticket) = ledger
            .lease_read(&self.keys, self.fleet.replica(), lease)
            .await?
        {
            let deadline = Instant::now() + self.policy.base().read_timeout;
            let outcome =
                match tokio::time::timeout_at(deadline, backend.backlog(&self.queue, deadline))
                    .await
                {
                    Ok(Ok(b)) => ReadOutcome::Ok {
                        backlog: b.messages,
                        send_disabled: b.send_disabled,
                    },
                    _ => ReadOutcome::Failed,
                };
            let published = ledger
                .publish_read(&self.keys, ticket, outcome, false)
                .await?;
            let mut state = self.state.lock();
            Self::count_read(&mut state, &outcome);
            Self::see(&mut state, published, Instant::now());
        }
        Ok(())
    }

    fn count_read(state: &mut SeatState, outcome: &ReadOutcome) {
        match outcome {
            ReadOutcome::Ok { .. } => state.own_reads.0 += 1,
            ReadOutcome::Failed => state.own_reads.1 += 1,
        }
    }

    /// Admin-plane reads this replica made for the fleet: (ok, failed).
    pub fn own_reads(&self) -> (u64, u64) {
        self.state.lock().own_reads
    }

    /// The fleet's view of this queue as last seen, while in the fleet (the read counts are
    /// this replica's own, see [`SeatState::own_reads`]).
    pub fn snapshot(&self) -> Option<GateSnapshot> {
        let state = self.state.lock();
        let (read, seen) = state.last?;
        let unknown = !matches!(read.state, SharedState::Ok { .. });
        let backlog = match read.state {
            SharedState::Ok { backlog, .. } => Some(
                backlog
                    .saturating_add(read.since_read)
                    .saturating_add(read.reserved),
            ),
            _ => None,
        };
        let resume = self.policy.load().resume_at();
        let refusing = state.refusing && self.policy.load().resume_below < Fraction::ONE;
        Some(GateSnapshot {
            backlog,
            drain_rate: state.drain.rate(),
            refusing_until_backlog: backlog
                .filter(|b| (refusing && *b > resume) || *b >= self.policy.load().limit)
                .map(|_| resume),
            limit: self.policy.load().limit,
            consecutive_failures: read.streak,
            fail_closed: unknown
                && self.policy.load().fail_closed
                && read.streak >= self.policy.load().streak_threshold,
            // The shared read is the fleet's last one; when it is good, it was made `age`
            // before it was seen.
            last_read_ok_at: matches!(read.state, SharedState::Ok { .. })
                .then(|| SystemTime::now().checked_sub(read.age + seen.elapsed()))
                .flatten(),
            reads_ok: state.own_reads.0,
            reads_failed: state.own_reads.1,
        })
    }
}

/// The ledger's view of [`FleetSeat::settle_rows`]: borrowed, for one call.
fn settle_batch(rows: &[(String, u64, u64)]) -> Vec<Settle<'_>> {
    rows.iter()
        .map(|(id, stored, not_stored)| Settle::new(id, *stored, *not_stored))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::drain::DrainRate;

    fn seat_state() -> SeatState {
        SeatState::new(Duration::ZERO)
    }

    fn read(generation: u64, backlog: u64, since_read: u64, age_ms: u64) -> SharedRead {
        SharedRead {
            state: SharedState::Ok {
                backlog,
                send_disabled: false,
            },
            age: Duration::from_millis(age_ms),
            streak: 0,
            generation,
            since_read,
            reserved: 7, // held, not yet in the queue: never part of the drain
            reads_ok: generation,
            reads_failed: 0,
            share: 0,
            share_seq: 0,
            replicas: 1,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_fleets_successive_reads_measure_the_drain_with_the_fleets_counts() {
        let mut s = seat_state();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        FleetSeat::see(&mut s, read(1, 200, 10, 0), t0);
        // Seen again later: the fleet stored 30 on top of that read by then.
        FleetSeat::see(&mut s, read(1, 200, 30, 500), t0 + ms(500));
        assert_eq!(s.drain.rate(), None);
        // The next read, made 5 s after the first: 180 left, so 200 + 30 − 180 = 50 taken.
        FleetSeat::see(&mut s, read(2, 180, 0, 0), t0 + ms(5000));
        assert_eq!(s.drain.rate().map(DrainRate::per_second), Some(10.0));
        // A late reply about the older read changes nothing.
        FleetSeat::see(&mut s, read(1, 200, 30, 5500), t0 + ms(5500));
        assert_eq!(s.measured.map(|(g, _, _)| g), Some(2));
        assert_eq!(s.drain.rate().map(DrainRate::per_second), Some(10.0));
    }

    #[tokio::test(start_paused = true)]
    async fn sends_the_fleet_stored_between_reads_are_not_drain() {
        let mut s = seat_state();
        let t0 = Instant::now();
        FleetSeat::see(&mut s, read(1, 100, 0, 0), t0);
        FleetSeat::see(&mut s, read(1, 100, 40, 0), t0 + Duration::from_secs(4));
        // The broker now holds the 40: no drain.
        FleetSeat::see(&mut s, read(2, 140, 0, 0), t0 + Duration::from_secs(5));
        assert_eq!(s.drain.rate(), None);
    }
}
