//! One queue's seat in the fleet (`SENDGATE_COORDINATION=redis`): the replica's side of
//! docs/fleet.md, over any [`LedgerPort`](crate::coordination::port::LedgerPort).
//!
//! - **One admin read per TTL, fleet-wide**: the replica that takes the read lease reads the
//!   admin plane and publishes; the others use it. The read is started ahead of expiry, so
//!   under traffic no send waits for it.
//! - **Exact at the ceiling, free far from it**: headroom comes in blocks (a share of what is
//!   left, shrinking to one near the ceiling) handed out locally for [`USE_BLOCK_FOR`] from
//!   when they were asked for; outcomes are settled in batches every [`SETTLE_EVERY`].
//! - **Epochs**: every reply names the ledger's epoch. A new one (Redis lost the queue's
//!   state) drops this seat's blocks; what it admitted with them, and alone, is its
//!   *carry* ([`Window`](super::window::Window)), reported with every call until a read
//!   shows it.
//! - **Cut off**, the seat hands out what its blocks hold before their use ends, and then
//!   nothing: [`FleetSeat::alone`] says what the replica may do on its own.
//!
//! One state under one lock (`state.rs`: the seat's [`Mode`](state::Mode), reserving,
//! refusing or leaving, its blocks and what it owes), and a file per part of the protocol:
//! `reserve.rs` a send (steps 1 and 2, one function per answer), `read.rs` the fleet's read
//! (step 4), `settle.rs` the outcomes and the goodbye (steps 3 and 7), `view.rs` what each
//! reply says (step 5's epochs, the heartbeat), `alone.rs` a replica cut off (step 6),
//! `outstanding.rs` the reservations out at once (step 1's divisor).

mod alone;
mod outstanding;
mod read;
mod reserve;
mod settle;
mod state;
mod view;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use tokio::time::Instant;

use super::local::LocalBounds;
use super::policy::{DepthRead, GateSnapshot, PolicyCell, Refusal};
use crate::backend::Backend;
use crate::config::Fraction;
use crate::coordination::fleet::{Fleet, HEARTBEAT, IDLE, MEMBER_FOR};
use crate::coordination::port::{Caller, LedgerError, QueueRef, ReadState, Terms};
use crate::domain::QueueName;
use state::FailClosedLog;
pub use state::Held;
use state::SeatState;

/// How long a block's headroom is handed out, from when it was asked for.
pub const USE_BLOCK_FOR: Duration = Duration::from_millis(500);
/// Outcomes are settled in one call per this period (per queue, per replica).
const SETTLE_EVERY: Duration = Duration::from_millis(100);
/// A replica tries a read ahead at most this often while another replica holds the lease.
const AHEAD_RETRY: Duration = Duration::from_millis(10);
/// The shortest age of the fleet's read before a read again at the ceiling: a settle's
/// period, since `since_read` moves no faster.
const CEILING_READ_FLOOR: Duration = SETTLE_EVERY;
/// How often a replica waiting for another's read asks whether it was published.
const WAIT_POLL: Duration = Duration::from_millis(10);
/// The margin in the hold for what the other terms do not name (scheduling, rounding).
const HOLD_MARGIN: Duration = Duration::from_secs(1);
/// How often a cut-off seat looks whether its replica rejoined (an atomic read, no call).
const REJOINED_POLL: Duration = Duration::from_millis(10);
/// How often a replica cut off and failing closed logs `send_failclosed` again.
const CUT_OFF_LOG_EVERY: Duration = Duration::from_secs(10);
/// A reservation is asked again at most this many times for one send (a new epoch, a read
/// to make, a grace to wait out).
const ASKS: usize = 4;

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
    /// This replica's reservations out at Redis.
    outstanding: outstanding::Outstanding,
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
            outstanding: outstanding::Outstanding::default(),
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
            let mut state = self.state.lock();
            if state.last.take().is_some() {
                state.cut_off_at = Some(Instant::now());
            }
        }
        cut_off
    }

    /// A fail-closed refusal is logged once per fleet read, with the count since the last
    /// line (this one included). Cut off there are no fleet reads: once when the replica
    /// turned local, then once per [`CUT_OFF_LOG_EVERY`] while it stays so.
    pub fn failclosed_to_log(&self) -> Option<u64> {
        let mut state = self.state.lock();
        let key = match state.last {
            Some((view, _)) => FailClosedLog::Read(view.generation),
            None => {
                let since = *state.cut_off_at.get_or_insert_with(Instant::now);
                let periods = since.elapsed().as_secs() / CUT_OFF_LOG_EVERY.as_secs().max(1);
                FailClosedLog::CutOff(since, periods)
            }
        };
        state.failclosed_unlogged += 1;
        if state.failclosed_logged == Some(key) {
            return None;
        }
        state.failclosed_logged = Some(key);
        Some(std::mem::take(&mut state.failclosed_unlogged))
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
        Some(Judged {
            estimate: estimate.saturating_sub(state.unused(now, limit)),
            limit,
            replicas: state.fleet_size.max(1),
            round: policy.share_round(view.paced),
        })
    }

    /// The share round of the fleet's read in the view last seen: of the reads the TTL
    /// paces, not those made again at the ceiling.
    pub fn share_round(&self) -> u64 {
        self.policy.load().share_round(self.paced_reads())
    }

    /// The fleet's reads the TTL paces in the view last seen (0 before any): what
    /// once-per-read logs count by, so reads again at the ceiling add no lines.
    pub fn paced_reads(&self) -> u64 {
        self.state.lock().last.map_or(0, |(view, _)| view.paced)
    }

    /// The fleet's read generation in the view last seen (0 before any): it changes with
    /// each read the fleet publishes.
    pub fn read_generation(&self) -> u64 {
        self.state
            .lock()
            .last
            .map_or(0, |(view, _)| view.generation)
    }

    /// This replica's share of the queue's drain rate (messages a second): the rate the
    /// seat measured between the fleet's reads over the fleet's size as last seen (each
    /// replica paces its own refusals, `pacing.rs`). `None` until drain has been measured.
    pub fn drain_share(&self) -> Option<f64> {
        let state = self.state.lock();
        let rate = state.drain.rate()?.per_second();
        Some(rate / state.fleet_size.max(1) as f64)
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
        let refusing = state.mode.refusing() && policy.resume_below < Fraction::ONE;
        let depth_read = match view.read {
            ReadState::Ok { backlog, .. } => Some(DepthRead {
                backlog,
                age: view.read_age + seen.elapsed(),
            }),
            ReadState::Never | ReadState::Failed { .. } => None,
        };
        Some(GateSnapshot {
            backlog,
            depth_read,
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

#[cfg(test)]
mod tests;
