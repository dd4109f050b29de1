//! The backlog ceiling and the fail-closed gate (contract section 2), one [`CapacityGate`]
//! per queue.
//!
//! A gate keeps the last depth read from the admin plane and reuses it for the TTL. One
//! read is in flight at a time per queue: sends that find the cache stale while a read
//! runs wait for that read instead of starting their own. On top of the last read the
//! gate counts the sends this process admitted since, so one process never overshoots
//! the ceiling between reads:
//!
//! ```text
//! estimate = backlog from the read
//!          + sends that completed after the read started (or within `lag` before it,
//!            for an admin plane whose counts trail the data plane)
//!          + sends admitted and still in flight
//! ```
//!
//! Reads are made ahead of expiry: the first send that finds the cached read within its
//! refresh lead of the TTL (twice the last read's duration, at most half the TTL) starts a
//! read in the background and is decided on the cached value, so under steady traffic no
//! send waits for the admin plane; only a queue's first read, or one after the value
//! expired with no traffic to refresh it, is waited for.
//!
//! A failed read (error, timeout, no permission) adds one to the queue's consecutive-failure
//! streak; a good read resets it. With the backlog unknown the send proceeds (fails open)
//! unless the gate is on and the streak has reached its threshold (fails closed).
//!
//! Each good read also measures how fast the queue drains (`drain.rs`): a `429` says how
//! long that drain needs to bring the backlog back to where sends resume. A queue refusing
//! at its ceiling keeps refusing until the estimate is at or below the resume level
//! (`SENDGATE_RESUME_BELOW` × ceiling), so admission does not flap at the boundary.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use tokio::time::Instant;

use super::drain::{self, DrainEstimator, DrainRate};
use super::shared::{FleetSeat, Held};
use crate::backend::{Backend, DepthError};
use crate::config::{CapacitySettings, Fraction};
use crate::domain::QueueName;

/// Completions are counted in slots this wide when a lag window is kept. A slot is
/// stamped with its end, so rounding can only over-count (refuse a little early), never
/// let a send through over the ceiling.
const SLOT: Duration = Duration::from_millis(10);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapacityPolicy {
    pub limit: u64,
    pub fail_closed: bool,
    pub streak_threshold: u32,
    pub ttl: Duration,
    pub read_timeout: Duration,
    /// How far the admin plane's counts may trail the data plane. Sends completed this
    /// long before a read started are still counted on top of it.
    pub lag: Duration,
    /// The longest `Retry-After` a `429` asks for.
    pub retry_after_max: Duration,
    /// Refusing at the ceiling, resume at or below this share of it (1 = at once under it).
    pub resume_below: Fraction,
}

/// The runtime overrides of one queue's policy (`PATCH /admin/settings`): each `Some`
/// replaces its variable's value; `None` keeps the variable's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PolicyOverride {
    pub limit: Option<u64>,
    pub fail_closed: Option<bool>,
    pub streak_threshold: Option<u32>,
    pub ttl: Option<Duration>,
}

/// A gate's policy, swappable at runtime: the variables' policy (`base`) and the one in
/// force (`base` with the overrides on top). Sends read the policy in force without a
/// lock (one atomic load); a change takes effect for the next decision.
#[derive(Debug)]
pub struct PolicyCell {
    base: CapacityPolicy,
    current: ArcSwap<CapacityPolicy>,
}

impl PolicyCell {
    pub fn new(base: CapacityPolicy) -> Arc<Self> {
        Arc::new(Self {
            current: ArcSwap::from_pointee(base.clone()),
            base,
        })
    }

    /// The policy in force.
    pub fn load(&self) -> arc_swap::Guard<Arc<CapacityPolicy>> {
        self.current.load()
    }

    /// The policy the variables give.
    pub fn base(&self) -> &CapacityPolicy {
        &self.base
    }

    /// Put `overrides` in force on top of the variables' policy (an empty one restores it).
    pub fn apply(&self, overrides: &PolicyOverride) {
        let base = &self.base;
        self.current.store(Arc::new(CapacityPolicy {
            limit: overrides.limit.unwrap_or(base.limit).max(1),
            fail_closed: overrides.fail_closed.unwrap_or(base.fail_closed),
            streak_threshold: overrides
                .streak_threshold
                .unwrap_or(base.streak_threshold)
                .max(1),
            ttl: overrides.ttl.unwrap_or(base.ttl),
            ..base.clone()
        }));
    }
}

impl CapacityPolicy {
    pub fn from_settings(s: &CapacitySettings, lag: Duration) -> Self {
        Self {
            limit: s.max_queue_depth.max(1),
            fail_closed: s.fail_closed,
            streak_threshold: s.fail_closed_streak.max(1),
            ttl: s.depth_ttl,
            read_timeout: s.admin_timeout,
            lag,
            retry_after_max: s.retry_after_max,
            resume_below: s.resume_below,
        }
    }

    /// The backlog at or below which a queue refusing at the ceiling admits again.
    pub fn resume_at(&self) -> u64 {
        drain::resume_at(self.limit, self.resume_below)
    }

    /// A `429`'s answer for an `estimate` at or over the ceiling.
    pub fn queue_full(
        &self,
        estimate: u64,
        rate: Option<DrainRate>,
        until_next_read: Duration,
    ) -> Refusal {
        Refusal::QueueFull {
            backlog: estimate,
            limit: self.limit,
            retry_after: drain::retry_after(
                estimate,
                self.resume_at(),
                rate,
                until_next_read,
                self.retry_after_max,
                rand::random(),
            ),
            drain_rate: rate,
        }
    }
}

/// A fixed policy, for a gate or seat that is never changed at runtime (tests, benches).
impl From<CapacityPolicy> for Arc<PolicyCell> {
    fn from(policy: CapacityPolicy) -> Self {
        PolicyCell::new(policy)
    }
}

/// Why a send is refused before it reaches the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    QueueFull {
        backlog: u64,
        limit: u64,
        retry_after: Duration,
        /// The measured drain rate; `None` until drain has been observed.
        drain_rate: Option<DrainRate>,
    },
    CapacityUnknown {
        consecutive_failures: u32,
    },
    /// The admin plane says the queue does not accept sends.
    QueueDisabled,
    /// The replica drained and is leaving (or left) the fleet: it admits nothing more, in
    /// the fleet or alone (see `FleetSeat::leave`). Answered as a send after the drain is
    /// (`503 draining`).
    Stopped,
}

/// How an admitted send ended, as far as the queue's backlog is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BacklogEffect {
    /// A new message is in the queue.
    Stored,
    /// Definitely nothing new in the queue (refused, or a detected duplicate).
    NotStored,
    /// It may be in the queue (timeout, cancelled): counted as stored, to stay under the ceiling.
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum LastRead {
    Never,
    Ok {
        backlog: u64,
        send_disabled: bool,
        at: Instant,
    },
    Failed {
        at: Instant,
    },
}

#[derive(Debug)]
struct GateState {
    last_read: LastRead,
    /// Bumped by every finished read; waiters compare it to learn that a read happened.
    generation: u64,
    streak: u32,
    /// Admitted, not yet finished.
    in_flight: u64,
    /// Finished sends counted on top of the last good read.
    since_read: u64,
    /// Every finished send that may be in the queue, ever (a monotonic counter).
    completed_total: u64,
    /// Recent completions in `SLOT`-wide slots `(slot end, count)`; kept only when `lag > 0`.
    recent: VecDeque<(Instant, u64)>,
    last_read_ok_at: Option<SystemTime>,
    reads_ok: u64,
    reads_failed: u64,
    /// The read generation whose fail-closed refusals were last logged, and the refusals
    /// not logged since: `send_failclosed` is logged once per depth read, not per send.
    failclosed_logged: Option<u64>,
    failclosed_unlogged: u64,
    /// How long the last read took: the refresh starts this long (twice) before expiry.
    last_read_took: Duration,
    /// A read started ahead of expiry is running in the background.
    refreshing_ahead: bool,
    /// The drain rate, measured between good reads.
    drain: DrainEstimator,
    /// The last good read's time and backlog: the previous end of the next measured pair.
    anchor: Option<(Instant, u64)>,
    /// Refused at the ceiling and not yet back at or below the resume level.
    refusing: bool,
}

/// Why a read is made: for a send (counts in the streak) or at start-up (does not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    ForSend,
    Priming,
}

/// What `/health/detailed` and `/metrics` show of one queue's gate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateSnapshot {
    pub backlog: Option<u64>,
    pub limit: u64,
    pub consecutive_failures: u32,
    pub fail_closed: bool,
    pub last_read_ok_at: Option<SystemTime>,
    pub reads_ok: u64,
    pub reads_failed: u64,
    pub drain_rate: Option<DrainRate>,
    /// While refusing at the ceiling: the backlog at or below which sends are admitted again.
    pub refusing_until_backlog: Option<u64>,
}

pub struct CapacityGate {
    queue: QueueName,
    /// Swapped by `PATCH /admin/settings`; read once or a few times per decision, no lock.
    policy: Arc<PolicyCell>,
    /// Whose admin plane is read: the lane's backend.
    backend: Arc<dyn Backend>,
    state: Mutex<GateState>,
    /// Held by the one read in flight; sends that find the cache stale queue here.
    read_turn: tokio::sync::Mutex<()>,
    /// With `SENDGATE_COORDINATION=redis`: the fleet's shared ceiling, used while the
    /// replica is in the fleet (this local gate decides while it is not).
    seat: std::sync::OnceLock<Arc<FleetSeat>>,
}

impl CapacityGate {
    pub fn new(queue: QueueName, policy: CapacityPolicy, backend: Arc<dyn Backend>) -> Arc<Self> {
        let policy = PolicyCell::new(policy);
        Arc::new(Self {
            queue,
            backend,
            state: Mutex::new(GateState {
                last_read: LastRead::Never,
                generation: 0,
                streak: 0,
                in_flight: 0,
                since_read: 0,
                completed_total: 0,
                recent: VecDeque::new(),
                last_read_ok_at: None,
                reads_ok: 0,
                reads_failed: 0,
                failclosed_logged: None,
                failclosed_unlogged: 0,
                last_read_took: Duration::ZERO,
                refreshing_ahead: false,
                drain: DrainEstimator::new(policy.base().lag),
                anchor: None,
                refusing: false,
            }),
            read_turn: tokio::sync::Mutex::new(()),
            seat: std::sync::OnceLock::new(),
            policy,
        })
    }

    /// Share this queue's ceiling with the fleet (once, at start-up).
    pub fn join_fleet(&self, seat: Arc<FleetSeat>) {
        let _ = self.seat.set(seat);
    }

    /// The replica drained: leave the fleet (see [`FleetSeat::leave`]), if in one.
    pub async fn leave_fleet(&self) {
        if let Some(seat) = self.seat.get() {
            // How it went is logged there.
            let _ = seat.say_goodbye().await;
        }
    }

    /// The fleet's decision while this replica is in the fleet; `None` in local mode, or
    /// when Redis just failed (the replica turns local and this send is decided here).
    async fn admit_in_fleet(self: &Arc<Self>) -> Option<Result<Reservation, Refusal>> {
        let seat = self.seat.get().filter(|s| s.joined())?;
        match seat.admit(&self.backend).await {
            Ok(Ok(held)) => {
                // Counted here too: should the replica turn local while this send runs, the
                // local gate's estimate must hold it (the fleet's count is out of reach).
                self.state.lock().in_flight += 1;
                Some(Ok(Reservation {
                    gate: self.clone(),
                    held: Some(held),
                    finished: false,
                }))
            }
            Ok(Err(refusal)) => {
                if let Refusal::CapacityUnknown {
                    consecutive_failures,
                } = refusal
                {
                    if let Some(refused_since_last_log) = seat.failclosed_to_log() {
                        tracing::warn!(
                            event = "send_failclosed",
                            queue = %self.queue,
                            consecutive_failures,
                            refused_since_last_log,
                            "queue depth unknown: refusing sends (fail-closed)"
                        );
                    }
                }
                Some(Err(refusal))
            }
            Err(error) => {
                seat.fall_back(&error);
                None
            }
        }
    }

    pub fn queue(&self) -> &QueueName {
        &self.queue
    }

    /// The policy in force now (the variables with any runtime overrides on top).
    pub fn policy(&self) -> Arc<CapacityPolicy> {
        self.policy.current.load_full()
    }

    /// The swappable policy, shared with the queue's [`FleetSeat`].
    pub fn policy_cell(&self) -> &Arc<PolicyCell> {
        &self.policy
    }

    /// Decide whether one more send may go to the queue, reading the depth first when the
    /// cached read is stale. An admitted send holds a [`Reservation`] until it finishes.
    pub async fn admit(self: &Arc<Self>) -> Result<Reservation, Refusal> {
        if let Some(decided) = self.admit_in_fleet().await {
            return decided;
        }
        let cached = {
            let mut state = self.state.lock();
            let now = Instant::now();
            if self.is_fresh(&state, now) || self.is_being_refreshed(&state, now) {
                let ahead = self.should_refresh_ahead(&mut state, now);
                let decision = self.decide(&mut state);
                Ok((
                    Self::failclosed_to_log(&mut state, &decision),
                    decision,
                    ahead,
                ))
            } else {
                Err(state.generation)
            }
        };
        let (log, decision) = match cached {
            Ok((log, decision, ahead)) => {
                if let Some(generation) = ahead {
                    let gate = Arc::clone(self);
                    tokio::spawn(async move {
                        gate.refresh(generation, Read::ForSend).await;
                        gate.state.lock().refreshing_ahead = false;
                    });
                }
                (log, decision)
            }
            Err(seen_generation) => {
                self.refresh(seen_generation, Read::ForSend).await;
                let mut state = self.state.lock();
                let decision = self.decide(&mut state);
                (Self::failclosed_to_log(&mut state, &decision), decision)
            }
        };
        // Logged after the lock is released: stderr must not serialise a queue's sends.
        if let (
            Some(refused_since_last_log),
            Err(Refusal::CapacityUnknown {
                consecutive_failures,
            }),
        ) = (log, &decision)
        {
            tracing::warn!(
                event = "send_failclosed",
                queue = %self.queue,
                consecutive_failures,
                refused_since_last_log,
                "queue depth unknown: refusing sends (fail-closed)"
            );
        }
        decision
    }

    /// A fail-closed refusal is logged once per depth read: the first after each read
    /// says how many were refused since the last line (this one included).
    fn failclosed_to_log(
        state: &mut GateState,
        decision: &Result<Reservation, Refusal>,
    ) -> Option<u64> {
        if !matches!(decision, Err(Refusal::CapacityUnknown { .. })) {
            return None;
        }
        state.failclosed_unlogged += 1;
        if state.failclosed_logged == Some(state.generation) {
            return None;
        }
        state.failclosed_logged = Some(state.generation);
        Some(std::mem::take(&mut state.failclosed_unlogged))
    }

    /// Read the depth now, whatever the cache holds (start-up).
    /// Read the depth now, whatever the cache holds (start-up). A failure here is recorded
    /// but does not start the streak: the streak counts the reads sends depend on, so with
    /// the admin plane down from the start, sends 1 and 2 still fail open and send 3 is the
    /// one refused (contract section 2).
    pub async fn prime(&self) {
        if let Some(seat) = self.seat.get().filter(|s| s.joined()) {
            match seat.prime(&self.backend).await {
                Ok(()) => return,
                Err(error) => seat.fall_back(&error),
            }
        }
        let generation = self.state.lock().generation;
        self.refresh(generation, Read::Priming).await;
    }

    fn is_fresh(&self, state: &GateState, now: Instant) -> bool {
        match state.last_read {
            LastRead::Never => false,
            LastRead::Ok { at, .. } | LastRead::Failed { at } => {
                // A read made before the replica last turned local is from before a spell in
                // the fleet, whose admissions it does not count: never reused.
                now < at + self.policy.load().ttl
                    && self.seat.get().is_none_or(|seat| at >= seat.local_since())
            }
        }
    }

    /// The cached value expired while its read ahead is still running (the read outlasted
    /// its lead: a saturated worker, a slow admin plane): sends keep deciding on it until
    /// the read lands, instead of all queueing behind that read and being released one by
    /// one (the tail spikes once per TTL under load). Only a queue's first read is waited
    /// for (contract section 2). Bounded by the read's own deadline, after which the read
    /// has ended one way or the other; a read made before a spell in the fleet is never
    /// reused.
    fn is_being_refreshed(&self, state: &GateState, now: Instant) -> bool {
        let (LastRead::Ok { at, .. } | LastRead::Failed { at }) = state.last_read else {
            return false;
        };
        state.refreshing_ahead
            && now < at + self.policy.load().ttl + self.policy.base().read_timeout
            && self.seat.get().is_none_or(|seat| at >= seat.local_since())
    }

    /// Whether this send starts the read ahead of expiry (and of which generation): the
    /// cached value is within its refresh lead of the TTL and no read runs yet.
    fn should_refresh_ahead(&self, state: &mut GateState, now: Instant) -> Option<u64> {
        let (LastRead::Ok { at, .. } | LastRead::Failed { at }) = state.last_read else {
            return None;
        };
        let lead = (state.last_read_took * 2).min(self.policy.load().ttl / 2);
        if state.refreshing_ahead || now < (at + self.policy.load().ttl).checked_sub(lead)? {
            return None;
        }
        state.refreshing_ahead = true;
        Some(state.generation)
    }

    /// Read the depth unless another caller finished a read while this one waited its turn.
    async fn refresh(&self, seen_generation: u64, kind: Read) {
        let _turn = self.read_turn.lock().await;
        let (started, completed_at_start, lagged) = {
            let mut state = self.state.lock();
            if state.generation != seen_generation {
                return;
            }
            let started = Instant::now();
            let lagged = self.lagged_completions(&mut state, started);
            (started, state.completed_total, lagged)
        };
        let deadline = started + self.policy.base().read_timeout;
        let read = self.backend.backlog(&self.queue, deadline);
        let result = match tokio::time::timeout_at(deadline, read).await {
            Ok(result) => result,
            Err(_) => Err(DepthError::Timeout),
        };
        let now = Instant::now();
        let mut state = self.state.lock();
        state.generation += 1;
        state.last_read_took = now - started;
        match result {
            Ok(backlog) => {
                // Completions before the read started are in its count (for an exact admin
                // plane); those after it, and those inside the lag window, are added on top.
                let since_read = lagged + (state.completed_total - completed_at_start);
                self.measure_drain(&mut state, now, backlog.messages, since_read);
                state.since_read = since_read;
                state.last_read = LastRead::Ok {
                    backlog: backlog.messages,
                    send_disabled: backlog.send_disabled,
                    at: now,
                };
                state.streak = 0;
                state.last_read_ok_at = Some(SystemTime::now());
                state.reads_ok += 1;
            }
            Err(error) => {
                state.last_read = LastRead::Failed { at: now };
                if kind == Read::ForSend {
                    state.streak = state.streak.saturating_add(1);
                }
                state.reads_failed += 1;
                let streak = state.streak;
                drop(state);
                tracing::warn!(
                    event = "depth_read_failed",
                    queue = %self.queue,
                    consecutive_failures = streak,
                    error = %error,
                    "could not read the queue depth"
                );
            }
        }
    }

    /// One pair of good reads for the drain rate: the previous read's estimate (its backlog
    /// and every send stored since) against this one's, as of now. A pair that spans a
    /// spell in the fleet is not measured: this gate did not count the fleet's sends.
    fn measure_drain(&self, state: &mut GateState, now: Instant, backlog: u64, since_read: u64) {
        let comparable = |at: Instant| self.seat.get().is_none_or(|seat| at >= seat.local_since());
        match state.anchor {
            Some((at, previous)) if comparable(at) => state.drain.record(
                previous.saturating_add(state.since_read),
                backlog.saturating_add(since_read),
                now - at,
            ),
            _ => state.drain.break_chain(),
        }
        state.anchor = Some((now, backlog));
    }

    /// Completions within `lag` before `started`, pruning slots no future read can need.
    fn lagged_completions(&self, state: &mut GateState, started: Instant) -> u64 {
        if self.policy.base().lag.is_zero() {
            return 0;
        }
        let cutoff = started.checked_sub(self.policy.base().lag);
        if let Some(cutoff) = cutoff {
            while state.recent.front().is_some_and(|(end, _)| *end < cutoff) {
                state.recent.pop_front();
            }
        }
        state.recent.iter().map(|(_, n)| n).sum()
    }

    fn decide(self: &Arc<Self>, state: &mut GateState) -> Result<Reservation, Refusal> {
        // One snapshot per decision: a concurrent settings change applies to the next one.
        let policy = self.policy.load();
        match state.last_read {
            LastRead::Ok {
                send_disabled: true,
                ..
            } => return Err(Refusal::QueueDisabled),
            LastRead::Ok { backlog, at, .. } => {
                let own = state.since_read.saturating_add(state.in_flight);
                // Local after a spell in the fleet: this replica's share of the room, and
                // the fleet's last estimate under a read that may not show it yet.
                let departure = self.seat.get().and_then(|seat| seat.departure());
                let (backlog, replicas) = match departure {
                    Some(d) if at < d.floor_until => (backlog.max(d.floor), d.replicas),
                    Some(d) => (backlog, d.replicas),
                    None => (backlog, 1),
                };
                let mut estimate = backlog.saturating_add(own.saturating_mul(replicas));
                // Its share must cover every send it admitted alone that Redis does not
                // count yet.
                if let (Some(d), Some(seat)) = (departure, self.seat.get()) {
                    if let Some((share, _)) = d.allowance {
                        if seat.alone_unsettled() >= share && Instant::now() < d.allowance_until {
                            estimate = estimate.max(policy.limit);
                        }
                    }
                }
                // Hysteresis: at the ceiling the queue starts refusing, and goes on until the
                // estimate is back at or below the resume level.
                state.refusing = if state.refusing {
                    estimate > policy.resume_at()
                } else {
                    estimate >= policy.limit
                };
                if state.refusing {
                    let until_next_read =
                        (at + policy.ttl).saturating_duration_since(Instant::now());
                    return Err(policy.queue_full(estimate, state.drain.rate(), until_next_read));
                }
            }
            LastRead::Failed { .. } | LastRead::Never => {
                if policy.fail_closed && state.streak >= policy.streak_threshold {
                    return Err(Refusal::CapacityUnknown {
                        consecutive_failures: state.streak,
                    });
                }
            }
        }
        if let Some(seat) = self.seat.get() {
            // Every send admitted alone counts against the share, fail-open ones too. Once
            // its seat is leaving the fleet, none is: Redis gives that share to the others.
            if !seat.admitted_alone() {
                return Err(Refusal::Stopped);
            }
        }
        state.in_flight += 1;
        Ok(Reservation {
            gate: self.clone(),
            held: None,
            finished: false,
        })
    }

    fn finish(&self, outcome: BacklogEffect) {
        let mut state = self.state.lock();
        state.in_flight = state.in_flight.saturating_sub(1);
        if outcome == BacklogEffect::NotStored {
            return;
        }
        state.completed_total += 1;
        state.since_read += 1;
        if !self.policy.base().lag.is_zero() {
            let now = Instant::now();
            match state.recent.back_mut() {
                Some((end, n)) if *end >= now => *n += 1,
                _ => state.recent.push_back((now + SLOT, 1)),
            }
            // Bound memory when reads are rare: nothing older than lag plus the longest
            // read can matter to a read that is running or yet to start.
            if let Some(cutoff) =
                now.checked_sub(self.policy.base().lag + self.policy.base().read_timeout + SLOT)
            {
                while state.recent.front().is_some_and(|(end, _)| *end < cutoff) {
                    state.recent.pop_front();
                }
            }
        }
    }

    pub fn snapshot(&self) -> GateSnapshot {
        let seat = self.seat.get();
        // The admin-plane reads this process made, in either mode: a counter in /metrics
        // that never goes down at a switch between the fleet and local mode.
        let (seat_ok, seat_failed) = seat.map_or((0, 0), |s| s.own_reads());
        let shared = seat.filter(|s| s.joined()).and_then(|s| s.snapshot());
        let state = self.state.lock();
        let reads_ok = state.reads_ok + seat_ok;
        let reads_failed = state.reads_failed + seat_failed;
        if let Some(shared) = shared {
            return GateSnapshot {
                reads_ok,
                reads_failed,
                ..shared
            };
        }
        let backlog = match state.last_read {
            LastRead::Ok { backlog, .. } => Some(
                backlog
                    .saturating_add(state.since_read)
                    .saturating_add(state.in_flight),
            ),
            _ => None,
        };
        let policy = self.policy.load();
        let unknown = !matches!(state.last_read, LastRead::Ok { .. });
        let resume = policy.resume_at();
        GateSnapshot {
            backlog,
            limit: policy.limit,
            consecutive_failures: state.streak,
            fail_closed: unknown && policy.fail_closed && state.streak >= policy.streak_threshold,
            last_read_ok_at: state.last_read_ok_at,
            reads_ok,
            reads_failed,
            drain_rate: state.drain.rate(),
            refusing_until_backlog: backlog
                .filter(|b| (state.refusing && *b > resume) || *b >= policy.limit)
                .map(|_| resume),
        }
    }
}

/// One admitted send's place under the ceiling. Finish it with the send's outcome; if it
/// is dropped unfinished (the request was cancelled mid-send) it counts as
/// [`BacklogEffect::Unknown`], the safe side.
pub struct Reservation {
    gate: Arc<CapacityGate>,
    /// What the fleet reserved; `None` when the local gate admitted the send.
    held: Option<Held>,
    finished: bool,
}

impl Reservation {
    pub fn finish(mut self, outcome: BacklogEffect) {
        self.finished = true;
        self.settle(outcome);
    }

    fn settle(&self, outcome: BacklogEffect) {
        match (self.held, self.gate.seat.get()) {
            (Some(held), Some(seat)) => {
                self.gate.finish(outcome);
                seat.finish(held, outcome);
            }
            (None, Some(seat)) => {
                self.gate.finish(outcome);
                // Admitted by this replica alone while Redis did not answer: the message
                // may be in the queue, and the fleet's count (which it rejoins) must say so
                // until its next read. Settled as open when Redis answers again, and
                // counted against its share until then.
                seat.finish_alone(outcome);
            }
            (_, None) => self.gate.finish(outcome),
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.finished {
            self.settle(BacklogEffect::Unknown);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Backlog, OutgoingMessage, SendError, SendReceipt};
    use async_trait::async_trait;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn fail_closed_refusals_are_logged_once_per_depth_read_with_the_count_since() {
        let backend = Arc::new(ScriptedDepth::new(vec![], Duration::ZERO));
        let gate = gate(policy(1, 1000, true, 3), &backend);
        let refused = || -> Result<Reservation, Refusal> {
            Err(Refusal::CapacityUnknown {
                consecutive_failures: 3,
            })
        };
        let mut state = gate.state.lock();
        state.generation = 7;
        assert_eq!(
            CapacityGate::failclosed_to_log(&mut state, &refused()),
            Some(1)
        );
        for _ in 0..4 {
            assert_eq!(
                CapacityGate::failclosed_to_log(&mut state, &refused()),
                None
            );
        }
        let full = Err(Refusal::QueueFull {
            backlog: 1,
            limit: 1,
            retry_after: Duration::from_secs(1),
            drain_rate: None,
        });
        assert_eq!(CapacityGate::failclosed_to_log(&mut state, &full), None);
        state.generation = 8;
        assert_eq!(
            CapacityGate::failclosed_to_log(&mut state, &refused()),
            Some(5),
            "the four silent ones and this one"
        );
        assert_eq!(
            CapacityGate::failclosed_to_log(&mut state, &refused()),
            None
        );
    }

    /// An admin plane that answers from a script (then repeats its last answer), after a delay.
    struct ScriptedDepth {
        answers: Mutex<VecDeque<Result<u64, DepthError>>>,
        last: Mutex<Result<u64, DepthError>>,
        delay: Duration,
        reads: AtomicU64,
    }

    impl ScriptedDepth {
        fn new(answers: Vec<Result<u64, DepthError>>, delay: Duration) -> Self {
            Self {
                answers: Mutex::new(answers.into()),
                last: Mutex::new(Ok(0)),
                delay,
                reads: AtomicU64::new(0),
            }
        }
        fn reads(&self) -> u64 {
            self.reads.load(Ordering::SeqCst)
        }
    }

    #[async_trait]
    impl Backend for ScriptedDepth {
        fn kind(&self) -> &'static str {
            "scripted"
        }
        async fn send(&self, _: OutgoingMessage, _: Instant) -> Result<SendReceipt, SendError> {
            unreachable!("capacity never sends")
        }
        async fn backlog(&self, _: &QueueName, _: Instant) -> Result<Backlog, DepthError> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            let answer = {
                let mut answers = self.answers.lock();
                match answers.pop_front() {
                    Some(a) => {
                        *self.last.lock() = a.clone();
                        a
                    }
                    None => self.last.lock().clone(),
                }
            };
            tokio::time::sleep(self.delay).await;
            answer.map(Backlog::of)
        }
    }

    fn policy(limit: u64, ttl_ms: u64, fail_closed: bool, threshold: u32) -> CapacityPolicy {
        CapacityPolicy {
            limit,
            fail_closed,
            streak_threshold: threshold,
            ttl: Duration::from_millis(ttl_ms),
            read_timeout: Duration::from_millis(2000),
            lag: Duration::ZERO,
            retry_after_max: Duration::from_secs(300),
            resume_below: Fraction::ONE,
        }
    }

    fn gate(p: CapacityPolicy, backend: &Arc<ScriptedDepth>) -> Arc<CapacityGate> {
        CapacityGate::new(QueueName::parse("requests").unwrap(), p, backend.clone())
    }

    fn down() -> Result<u64, DepthError> {
        Err(DepthError::Failed("admin plane down".into()))
    }

    #[tokio::test(start_paused = true)]
    async fn a_changed_policy_applies_to_the_next_decision_and_an_empty_one_restores_it() {
        let backend = Arc::new(ScriptedDepth::new(vec![Ok(5)], Duration::ZERO));
        let g = gate(policy(1000, 60_000, false, 3), &backend);
        g.admit()
            .await
            .expect("under 1000")
            .finish(BacklogEffect::NotStored);
        g.policy_cell().apply(&PolicyOverride {
            limit: Some(5),
            ..PolicyOverride::default()
        });
        match g.admit().await {
            Err(Refusal::QueueFull { backlog, limit, .. }) => assert_eq!((backlog, limit), (5, 5)),
            other => panic!(
                "expected queue_full at the new ceiling, got {:?}",
                other.err()
            ),
        }
        assert_eq!(g.snapshot().limit, 5);
        assert_eq!(
            backend.reads(),
            1,
            "the cached read is reused: only the policy changed"
        );
        g.policy_cell().apply(&PolicyOverride::default());
        assert!(g.admit().await.is_ok(), "back at the variable's 1000");
        assert_eq!(g.policy().limit, 1000);
    }

    #[tokio::test(start_paused = true)]
    async fn a_shorter_ttl_override_makes_the_next_send_read_again() {
        let backend = Arc::new(ScriptedDepth::new(vec![Ok(0)], Duration::ZERO));
        let g = gate(policy(1000, 60_000, false, 3), &backend);
        g.admit().await.unwrap().finish(BacklogEffect::NotStored);
        tokio::time::advance(Duration::from_millis(20)).await;
        g.admit().await.unwrap().finish(BacklogEffect::NotStored);
        assert_eq!(backend.reads(), 1);
        g.policy_cell().apply(&PolicyOverride {
            ttl: Some(Duration::from_millis(10)),
            ..PolicyOverride::default()
        });
        g.admit().await.unwrap().finish(BacklogEffect::NotStored);
        assert_eq!(
            backend.reads(),
            2,
            "the 20 ms old read is stale under a 10 ms TTL"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_is_reused_for_the_ttl() {
        let backend = Arc::new(ScriptedDepth::new(vec![Ok(0)], Duration::ZERO));
        let g = gate(policy(100, 1000, false, 3), &backend);
        for _ in 0..3 {
            g.admit().await.unwrap().finish(BacklogEffect::Stored);
        }
        assert_eq!(backend.reads(), 1);
        tokio::time::advance(Duration::from_millis(999)).await;
        g.admit().await.unwrap().finish(BacklogEffect::Stored);
        assert_eq!(backend.reads(), 1);
        tokio::time::advance(Duration::from_millis(1)).await;
        g.admit().await.unwrap().finish(BacklogEffect::Stored);
        assert_eq!(backend.reads(), 2);
    }

    /// Admit one send and say how long it waited.
    async fn timed_admit(g: &Arc<CapacityGate>) -> Duration {
        let started = Instant::now();
        g.admit().await.unwrap().finish(BacklogEffect::NotStored);
        started.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn under_steady_traffic_the_read_is_made_ahead_of_expiry_and_no_send_waits() {
        let backend = Arc::new(ScriptedDepth::new(vec![Ok(0)], Duration::from_millis(50)));
        let g = gate(policy(100, 1000, false, 3), &backend);
        assert_eq!(
            timed_admit(&g).await,
            Duration::from_millis(50),
            "only the first read is waited for"
        );
        // The read took 50 ms: the next one starts 100 ms before the value expires.
        tokio::time::advance(Duration::from_millis(899)).await;
        assert_eq!(timed_admit(&g).await, Duration::ZERO);
        tokio::task::yield_now().await;
        assert_eq!(backend.reads(), 1, "not yet within the lead");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(
            timed_admit(&g).await,
            Duration::ZERO,
            "decided on the cached value"
        );
        for _ in 0..5 {
            assert_eq!(timed_admit(&g).await, Duration::ZERO);
        }
        tokio::task::yield_now().await;
        assert_eq!(backend.reads(), 2, "one read ahead, however many sends");
        tokio::time::advance(Duration::from_millis(150)).await;
        // Past the first value's expiry: the value read ahead is fresh.
        assert_eq!(timed_admit(&g).await, Duration::ZERO);
        tokio::task::yield_now().await;
        assert_eq!(backend.reads(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_admin_plane_is_read_ahead_no_earlier_than_half_the_ttl() {
        // Reads take 40 ms against a 100 ms TTL: twice the read (80 ms) would start the
        // next one 20 ms into the value's life; the lead is capped at half the TTL.
        let backend = Arc::new(ScriptedDepth::new(vec![Ok(0)], Duration::from_millis(40)));
        let g = gate(policy(100, 100, false, 3), &backend);
        timed_admit(&g).await;
        tokio::time::advance(Duration::from_millis(30)).await;
        assert_eq!(timed_admit(&g).await, Duration::ZERO);
        tokio::task::yield_now().await;
        assert_eq!(backend.reads(), 1, "30 ms into a 100 ms TTL: too early");
        tokio::time::advance(Duration::from_millis(20)).await;
        assert_eq!(timed_admit(&g).await, Duration::ZERO);
        tokio::task::yield_now().await;
        assert_eq!(backend.reads(), 2, "half the TTL: read ahead");
    }

    /// An admin plane whose reads take the given times in turn (then the last one again).
    struct SlowingDepth {
        delays: Mutex<VecDeque<Duration>>,
        last: Mutex<Duration>,
        reads: AtomicU64,
    }

    impl SlowingDepth {
        fn new(delays_ms: &[u64]) -> Self {
            Self {
                delays: Mutex::new(
                    delays_ms
                        .iter()
                        .map(|&ms| Duration::from_millis(ms))
                        .collect(),
                ),
                last: Mutex::new(Duration::ZERO),
                reads: AtomicU64::new(0),
            }
        }
    }

    #[async_trait]
    impl Backend for SlowingDepth {
        fn kind(&self) -> &'static str {
            "slowing"
        }
        async fn send(&self, _: OutgoingMessage, _: Instant) -> Result<SendReceipt, SendError> {
            unreachable!("capacity never sends")
        }
        async fn backlog(&self, _: &QueueName, _: Instant) -> Result<Backlog, DepthError> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            let delay = match self.delays.lock().pop_front() {
                Some(d) => {
                    *self.last.lock() = d;
                    d
                }
                None => *self.last.lock(),
            };
            tokio::time::sleep(delay).await;
            Ok(Backlog::of(0))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_ahead_that_outlasts_its_lead_keeps_sends_on_the_cached_value() {
        // The first read takes 1 ms, so the next starts 2 ms before the value expires; that
        // one takes 50 ms (a saturated worker or a busy admin plane). Sends arriving after
        // the expiry, while it runs, must not queue behind it: at 256 connections they all
        // would, and be released one by one (the p99 and max spikes once per TTL).
        let backend = Arc::new(SlowingDepth::new(&[1, 50]));
        let g = CapacityGate::new(
            QueueName::parse("requests").unwrap(),
            policy(100, 1000, false, 3),
            backend.clone(),
        );
        assert_eq!(
            timed_admit(&g).await,
            Duration::from_millis(1),
            "the first read"
        );
        tokio::time::advance(Duration::from_millis(998)).await;
        assert_eq!(timed_admit(&g).await, Duration::ZERO);
        tokio::task::yield_now().await;
        assert_eq!(backend.reads.load(Ordering::SeqCst), 2, "read ahead");
        tokio::time::advance(Duration::from_millis(10)).await;
        for _ in 0..5 {
            assert_eq!(
                timed_admit(&g).await,
                Duration::ZERO,
                "past the expiry, the read ahead still running: decided on the last value"
            );
        }
        assert_eq!(
            backend.reads.load(Ordering::SeqCst),
            2,
            "no read of their own"
        );
        tokio::time::advance(Duration::from_millis(40)).await;
        tokio::task::yield_now().await;
        assert_eq!(g.snapshot().reads_ok, 2, "the read ahead landed");
        assert_eq!(timed_admit(&g).await, Duration::ZERO);
        assert_eq!(backend.reads.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn an_expired_value_is_reused_no_longer_than_a_read_ahead_can_run() {
        // A read ahead marked as running that never lands (its task gone with its worker):
        // past the TTL plus the read's deadline, a send reads for itself again.
        let backend = Arc::new(ScriptedDepth::new(vec![Ok(0)], Duration::ZERO));
        let g = gate(policy(100, 1000, false, 3), &backend);
        timed_admit(&g).await;
        g.state.lock().refreshing_ahead = true;
        tokio::time::advance(Duration::from_millis(1000 + 2000 - 1)).await;
        timed_admit(&g).await;
        assert_eq!(
            backend.reads(),
            1,
            "within the read's deadline: the last value"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        timed_admit(&g).await;
        assert_eq!(backend.reads(), 2, "past it: a read of its own");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lagging_read_counts_completions_within_the_lag_and_during_the_read() {
        let backend = Arc::new(ScriptedDepth::new(vec![Ok(0)], Duration::from_millis(100)));
        let p = CapacityPolicy {
            lag: Duration::from_secs(5),
            ..policy(100, 1000, false, 3)
        };
        let g = gate(p, &backend);
        let during = g.admit().await.unwrap(); // read 1 (100 ms)
        g.admit().await.unwrap().finish(BacklogEffect::Stored); // before read 2, in the lag
        assert_eq!(g.snapshot().reads_ok, 1);
        tokio::time::advance(Duration::from_millis(1000)).await;
        let waiting = {
            let g = g.clone();
            tokio::spawn(async move { g.admit().await.unwrap() })
        };
        tokio::task::yield_now().await; // read 2 starts
        during.finish(BacklogEffect::Stored); // completes while read 2 runs
        let third = waiting.await.unwrap();
        assert_eq!(g.snapshot().reads_ok, 2);
        assert_eq!(
            g.snapshot().backlog,
            Some(3),
            "0 read + 1 within the lag + 1 during the read + 1 in flight"
        );
        drop(third);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_read_ahead_counts_in_the_streak_and_the_next_send_sees_it() {
        let backend = Arc::new(ScriptedDepth::new(
            vec![Ok(0), down()],
            Duration::from_millis(10),
        ));
        let g = gate(policy(100, 1000, true, 1), &backend);
        timed_admit(&g).await;
        tokio::time::advance(Duration::from_millis(985)).await;
        assert_eq!(timed_admit(&g).await, Duration::ZERO);
        tokio::task::yield_now().await; // the read ahead starts
        tokio::time::advance(Duration::from_millis(10)).await;
        tokio::task::yield_now().await; // and finishes
        assert_eq!(g.snapshot().consecutive_failures, 1);
        assert!(matches!(
            g.admit().await.err(),
            Some(Refusal::CapacityUnknown { .. })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_sends_share_one_read_in_flight() {
        let backend = Arc::new(ScriptedDepth::new(vec![Ok(0)], Duration::from_millis(100)));
        let g = gate(policy(100, 0, false, 3), &backend);
        let admits: Vec<_> = (0..10)
            .map(|_| {
                let g = g.clone();
                tokio::spawn(async move { g.admit().await.is_ok() })
            })
            .collect();
        for a in admits {
            assert!(a.await.unwrap());
        }
        assert!(
            backend.reads() <= 2,
            "10 concurrent sends made {} reads",
            backend.reads()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn sends_since_the_read_count_so_the_ceiling_is_never_overshot() {
        let backend = Arc::new(ScriptedDepth::new(vec![Ok(0)], Duration::ZERO));
        let g = gate(policy(5, 60_000, false, 3), &backend);
        let mut queued = 0;
        let mut refused = Vec::new();
        for _ in 0..8 {
            match g.admit().await {
                Ok(r) => {
                    r.finish(BacklogEffect::Stored);
                    queued += 1;
                }
                Err(e) => refused.push(e),
            }
        }
        assert_eq!(queued, 5);
        assert_eq!(refused.len(), 3);
        assert!(matches!(
            refused[0],
            Refusal::QueueFull {
                backlog: 5,
                limit: 5,
                ..
            }
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn sends_in_flight_count_towards_the_backlog() {
        let backend = Arc::new(ScriptedDepth::new(vec![Ok(3)], Duration::ZERO));
        let g = gate(policy(5, 60_000, false, 3), &backend);
        let a = g.admit().await.unwrap();
        let b = g.admit().await.unwrap();
        assert!(
            g.admit().await.is_err(),
            "3 stored + 2 in flight is the ceiling"
        );
        b.finish(BacklogEffect::NotStored);
        let c = g.admit().await.expect("a refused send frees its place");
        drop(c); // a cancelled send counts as stored: the safe side
        assert!(g.admit().await.is_err());
        a.finish(BacklogEffect::Stored);
        assert_eq!(g.snapshot().backlog, Some(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_read_replaces_the_local_count_without_double_counting() {
        // The second read already counts the two sends stored before it: they must not be
        // added again on top of it.
        let backend = Arc::new(ScriptedDepth::new(vec![Ok(0), Ok(2)], Duration::ZERO));
        let g = gate(policy(3, 1000, false, 3), &backend);
        g.admit().await.unwrap().finish(BacklogEffect::Stored);
        g.admit().await.unwrap().finish(BacklogEffect::Stored);
        tokio::time::advance(Duration::from_millis(1000)).await;
        g.admit().await.unwrap().finish(BacklogEffect::Stored);
        assert_eq!(g.snapshot().backlog, Some(3));
        assert!(matches!(
            g.admit().await,
            Err(Refusal::QueueFull { backlog: 3, .. })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lagging_admin_plane_still_sees_recent_sends_counted() {
        // The admin plane reports 0 although 4 sends completed just before the read.
        let backend = Arc::new(ScriptedDepth::new(vec![Ok(0), Ok(0)], Duration::ZERO));
        let mut p = policy(5, 1000, false, 3);
        p.lag = Duration::from_secs(5);
        let g = gate(p, &backend);
        for _ in 0..4 {
            g.admit().await.unwrap().finish(BacklogEffect::Stored);
        }
        tokio::time::advance(Duration::from_secs(1)).await;
        g.admit().await.unwrap().finish(BacklogEffect::Stored);
        assert!(
            g.admit().await.is_err(),
            "lagging read of 0 + 5 recent sends is the ceiling"
        );
        // Well past the lag window, the admin plane's count is trusted alone.
        tokio::time::advance(Duration::from_secs(7)).await;
        assert!(g.admit().await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn queue_full_says_when_the_next_read_is_due() {
        let backend = Arc::new(ScriptedDepth::new(vec![Ok(10)], Duration::ZERO));
        let g = gate(policy(5, 4000, false, 3), &backend);
        assert!(g.admit().await.is_err());
        tokio::time::advance(Duration::from_millis(1500)).await;
        match g.admit().await {
            Err(Refusal::QueueFull {
                backlog: 10,
                limit: 5,
                retry_after,
                drain_rate: None,
            }) => {
                assert_eq!(retry_after, Duration::from_millis(2500));
            }
            other => panic!("{:?}", other.map(|_| ())),
        }
    }

    /// One send refused `429`: its `Retry-After` and drain rate.
    async fn refused(g: &Arc<CapacityGate>) -> (Duration, Option<f64>) {
        match g.admit().await {
            Err(Refusal::QueueFull {
                retry_after,
                drain_rate,
                ..
            }) => (retry_after, drain_rate.map(DrainRate::per_second)),
            other => panic!("not refused full: {:?}", other.map(|_| ())),
        }
    }

    /// A gate reading `depths` one per second (TTL 1 s), each read made by a refused send;
    /// the last refusal's answer.
    async fn read_each_second(g: &Arc<CapacityGate>, reads: usize) -> (Duration, Option<f64>) {
        let mut last = refused(g).await;
        for _ in 1..reads {
            tokio::time::advance(Duration::from_secs(1)).await;
            last = refused(g).await;
        }
        last
    }

    fn depths(values: impl IntoIterator<Item = u64>) -> Arc<ScriptedDepth> {
        Arc::new(ScriptedDepth::new(
            values.into_iter().map(Ok).collect(),
            Duration::ZERO,
        ))
    }

    fn within(d: Duration, low_s: f64, high_s: f64) -> bool {
        (low_s..=high_s).contains(&d.as_secs_f64())
    }

    #[tokio::test(start_paused = true)]
    async fn a_steady_drain_gives_the_time_to_drain_below_the_ceiling() {
        // 10 a second taken from 200 against a ceiling of 50.
        let backend = depths((0..6).map(|i| 200 - 10 * i));
        let g = gate(policy(50, 1000, false, 3), &backend);
        let (retry_after, rate) = read_each_second(&g, 6).await;
        assert_eq!(rate, Some(10.0));
        // 150 − 49 = 101 messages at 10/s: 10 s, ±10 % in whole seconds.
        assert!(within(retry_after, 9.0, 11.0), "{retry_after:?}");
        assert_eq!(
            g.snapshot().drain_rate.map(DrainRate::per_second),
            Some(10.0)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn with_no_drain_observed_retry_after_is_the_time_until_the_next_read() {
        let backend = depths([100]);
        let g = gate(policy(50, 1000, false, 3), &backend);
        read_each_second(&g, 8).await;
        tokio::time::advance(Duration::from_millis(300)).await;
        assert_eq!(refused(&g).await, (Duration::from_millis(700), None));
        assert_eq!(g.snapshot().drain_rate, None);
    }

    #[tokio::test(start_paused = true)]
    async fn counts_that_lag_and_jump_are_smoothed_to_the_true_rate() {
        // Consumers take 10/s, but the admin plane's count moves only every 5 s, off the
        // reads' phase: reads show no change, then a jump of 50.
        let backend = depths((0..31).map(|i| 1000 - 50 * ((i + 2) / 5)));
        let g = gate(policy(50, 1000, false, 3), &backend);
        let mut rates = Vec::new();
        refused(&g).await;
        for _ in 0..30 {
            tokio::time::advance(Duration::from_secs(1)).await;
            rates.push(refused(&g).await.1);
        }
        assert!(
            rates[..4].iter().all(Option::is_none),
            "one read is no rate"
        );
        for rate in rates[4..].iter() {
            let rate = rate.expect("drain observed");
            assert!((8.0..=12.0).contains(&rate), "{rates:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_admitted_sends_is_not_mistaken_for_drain() {
        // Nobody consumes: each read shows the 50 sends admitted since the one before.
        let backend = depths((0..6).map(|i| 50 * i));
        let g = gate(policy(250, 1000, false, 3), &backend);
        for _ in 0..5 {
            for _ in 0..50 {
                g.admit().await.unwrap().finish(BacklogEffect::Stored);
            }
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        assert_eq!(refused(&g).await, (Duration::from_secs(1), None));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_drain_is_clamped_to_the_longest_retry_after() {
        let backend = depths((0..6).map(|i| 10_000 - i));
        let p = CapacityPolicy {
            retry_after_max: Duration::from_secs(120),
            ..policy(10, 1000, false, 3)
        };
        let g = gate(p, &backend);
        let (retry_after, rate) = read_each_second(&g, 6).await;
        assert_eq!(rate, Some(1.0));
        assert!(within(retry_after, 108.0, 120.0), "{retry_after:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_is_spread_by_a_tenth_and_never_below_one_second() {
        let backend = depths((0..6).map(|i| 200 - 10 * i));
        let g = gate(policy(50, 1000, false, 3), &backend);
        read_each_second(&g, 6).await;
        // The header has whole seconds: 10 s ± 1 s, each of 9, 10 and 11 about a third of
        // the time, so a fleet refused together comes back spread both ways.
        let mut seen = std::collections::BTreeMap::new();
        for _ in 0..300 {
            let (retry_after, _) = refused(&g).await;
            assert!(within(retry_after, 9.0, 11.0), "{retry_after:?}");
            *seen.entry(retry_after.as_secs()).or_insert(0) += 1;
        }
        assert_eq!(seen.keys().copied().collect::<Vec<_>>(), [9, 10, 11]);
        assert!(seen.values().all(|&n| n >= 60), "{seen:?}");

        // 100/s, one message over: a hundredth of a second, raised to the next read (1 s);
        // the jitter never takes it under 1 s.
        let backend = depths((0..6).map(|i| 1000 - 100 * i));
        let g = gate(policy(500, 1000, false, 3), &backend);
        read_each_second(&g, 6).await;
        for _ in 0..200 {
            let (retry_after, _) = refused(&g).await;
            assert!(within(retry_after, 1.0, 1.1), "{retry_after:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn refusing_at_the_ceiling_goes_on_until_the_backlog_is_at_the_resume_level() {
        let backend = depths([10, 8, 6, 5]);
        let p = CapacityPolicy {
            resume_below: Fraction::new(0.5).unwrap(),
            ..policy(10, 1000, false, 3)
        };
        let g = gate(p, &backend);
        for backlog in [10, 8, 6] {
            assert!(
                matches!(g.admit().await, Err(Refusal::QueueFull { backlog: b, .. }) if b == backlog),
                "{backlog} is over the resume level"
            );
            assert_eq!(g.snapshot().refusing_until_backlog, Some(5));
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        g.admit()
            .await
            .expect("5 is the resume level")
            .finish(BacklogEffect::NotStored);
        assert_eq!(g.snapshot().refusing_until_backlog, None);
        for _ in 0..5 {
            g.admit()
                .await
                .expect("under the ceiling again")
                .finish(BacklogEffect::Stored);
        }
        assert!(g.admit().await.is_err(), "5 + 5 stored is the ceiling");
        assert_eq!(g.snapshot().refusing_until_backlog, Some(5));
    }

    #[tokio::test(start_paused = true)]
    async fn without_hysteresis_one_under_the_ceiling_admits() {
        let backend = depths([10, 9]);
        let g = gate(policy(10, 1000, false, 3), &backend);
        assert!(g.admit().await.is_err());
        assert_eq!(g.snapshot().refusing_until_backlog, Some(9));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(g.admit().await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn gate_on_fails_closed_at_the_threshold_and_recovers() {
        let backend = Arc::new(ScriptedDepth::new(
            vec![down(), down(), down(), Ok(0)],
            Duration::ZERO,
        ));
        let g = gate(policy(100, 0, true, 3), &backend);
        assert!(g.admit().await.is_ok());
        assert!(g.admit().await.is_ok());
        assert_eq!(
            g.admit().await.err(),
            Some(Refusal::CapacityUnknown {
                consecutive_failures: 3
            })
        );
        assert!(g.snapshot().fail_closed);
        assert!(g.admit().await.is_ok(), "a good read resets the streak");
        assert_eq!(g.snapshot().consecutive_failures, 0);
        assert!(!g.snapshot().fail_closed);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_start_up_read_does_not_start_the_streak() {
        let backend = Arc::new(ScriptedDepth::new(vec![down()], Duration::ZERO));
        let g = gate(policy(100, 0, true, 3), &backend);
        g.prime().await;
        assert_eq!(g.snapshot().consecutive_failures, 0);
        assert_eq!(g.snapshot().reads_failed, 1);
        assert!(g.admit().await.is_ok());
        assert!(g.admit().await.is_ok());
        assert_eq!(
            g.admit().await.err(),
            Some(Refusal::CapacityUnknown {
                consecutive_failures: 3
            }),
            "the contract's example: sends 1 and 2 queued, send 3 refused"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn gate_off_always_fails_open() {
        let backend = Arc::new(ScriptedDepth::new(vec![down()], Duration::ZERO));
        let g = gate(policy(100, 0, false, 3), &backend);
        for _ in 0..5 {
            g.admit().await.unwrap().finish(BacklogEffect::Stored);
        }
        assert_eq!(g.snapshot().consecutive_failures, 5);
        assert!(!g.snapshot().fail_closed);
    }

    #[tokio::test(start_paused = true)]
    async fn the_streak_counts_consecutive_failures_only() {
        let backend = Arc::new(ScriptedDepth::new(
            vec![down(), Ok(0), down()],
            Duration::ZERO,
        ));
        let g = gate(policy(100, 0, true, 2), &backend);
        for _ in 0..3 {
            assert!(g.admit().await.is_ok());
        }
        assert_eq!(g.snapshot().consecutive_failures, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_that_outlives_its_timeout_is_a_failure_and_ends_on_time() {
        let backend = Arc::new(ScriptedDepth::new(vec![Ok(0)], Duration::from_secs(60)));
        let g = gate(policy(100, 0, true, 1), &backend);
        let start = Instant::now();
        assert_eq!(
            g.admit().await.err(),
            Some(Refusal::CapacityUnknown {
                consecutive_failures: 1
            }),
            "the timed-out read counts before the send is decided"
        );
        assert_eq!(start.elapsed(), Duration::from_millis(2000));
        assert_eq!(g.snapshot().consecutive_failures, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn failed_reads_are_cached_for_the_ttl_too() {
        let backend = Arc::new(ScriptedDepth::new(vec![down()], Duration::ZERO));
        let g = gate(policy(100, 1000, true, 3), &backend);
        for _ in 0..10 {
            assert!(g.admit().await.is_ok());
        }
        assert_eq!(
            backend.reads(),
            1,
            "a failing admin plane is not hammered by every send"
        );
    }
}
