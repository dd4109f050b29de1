//! The ceiling as one process keeps it (contract section 2): the last depth read from the
//! admin plane, reused for the TTL (read again sooner when a send is refused at the
//! ceiling), with this process's own sends counted on top.
//!
//! One read is in flight at a time per queue: sends that find the cache stale while a read
//! runs wait for that read instead of starting their own. On top of the last read the
//! gate counts the sends it admitted since, so one process never overshoots the ceiling
//! between reads:
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
//! Reads are made again at the ceiling. Between two of the TTL's reads the estimate credits
//! none of what the consumers took: with a ceiling under a TTL's drain (ceiling 50, 100/s,
//! 1 s) room would open once per TTL and the queue run dry while sends are refused. A send
//! refused at the ceiling (`queue_full`), or admitted within a tenth of it, on a read that
//! landed at least the ceiling-read interval ago starts a read in the background (one at a
//! time with the read ahead) and is answered at once, so room shows as soon as consumers
//! make it, and as a rule before the sends that follow would be refused. The interval ([`LocalGate::ceiling_read_interval`]) is twice the last read's
//! duration, at least 20 ms, and half the lag of an admin plane that trails (its count
//! moves no faster). Such a read refreshes the value, not the TTL's schedule: the TTL's
//! reads still come once per TTL (they number the share rounds and the once-per-read logs,
//! count in the streak, and are the only reads a send may wait for); one that fails leaves
//! the cached read standing, out of the streak, and no read is made at the ceiling again
//! before the TTL's next good read.
//!
//! Why the estimate stays an upper bound of the backlog, however often reads are made: an
//! exact admin plane's read that starts at `s` shows the queue as it stood at some `τ ≥ s`
//! within the read's flight. Since `τ` the queue gained only sends stored after `τ`, and
//! lost what consumers took (never less than nothing). A send stored after `τ` settled
//! after its store, so after `s` (it is in `since_read`), or has not settled (it is in
//! flight). So backlog ≤ read + since_read + in flight = the estimate. Reading more often
//! only moves `s` later; the refused send that starts a read changes nothing counted. With
//! a lag `L` the read shows the queue at some `τ ≥ s − L`, and the sends settled from
//! `s − L` on are counted: the same argument from `s − L`.
//!
//! The double count: a send stored before `τ` and settled after `s` is both in the read and
//! counted on top of it (a read taken while sends are stored but not yet settled). Which of
//! them the read shows cannot be told here (it takes each store's time in the admin plane's
//! frame), so each stays counted until a read that starts after it settled: while refusing,
//! within a ceiling-read interval rather than a TTL.
//!
//! A lagging admin plane (RabbitMQ's management counts, Service Bus): a read shows the sends
//! stored before `s − L` and may or may not show those within the lag; nothing in its
//! answer says which, so none of them can be credited safely (that would take the count's
//! own time). What is reached: at the ceiling the estimate holds every send settled in the
//! last `L` and a read interval, so the admitted rate settles near ceiling / `L` when that
//! is under the drain rate, and consumers go short while sends are refused (RabbitMQ's
//! default `L` of 11 s, ceiling 50: about 4.5 a second). Work is conserved with a ceiling of
//! at least the drain rate × (`L` + a TTL), or an exact depth source (RabbitMQ's `amqp`).
//!
//! A failed read (error, timeout, no permission) adds one to the queue's consecutive-failure
//! streak; a good read resets it. With the backlog unknown the send proceeds (fails open)
//! unless the gate is on and the streak has reached its threshold (fails closed).
//!
//! Each good read also measures how fast the queue drains (`drain.rs`): a `429` says how
//! long that drain needs to bring the backlog back to where sends resume. A queue refusing
//! at its ceiling keeps refusing until the estimate is at or below the resume level
//! (`SENDGATE_RESUME_BELOW` × ceiling), so admission does not flap at the boundary.
//!
//! This gate knows nothing of a fleet: what a replica deciding alone must count on top is
//! handed to it as [`LocalBounds`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use tokio::time::Instant;

use super::policy::{
    BacklogEffect, CapacityPolicy, CeilingView, DepthRead, GateSnapshot, Judge, PolicyCell,
    Refusal, Unknown,
};
use crate::admission::drain::{DrainEstimator, DrainRate, Pair};
use crate::backend::{Backend, Backlog, DepthError};
use crate::domain::QueueName;

/// Completions are counted in slots this wide when a lag window is kept. A slot is
/// stamped with its end, so rounding can only over-count (refuse a little early), never
/// let a send through over the ceiling.
const SLOT: Duration = Duration::from_millis(10);

/// The shortest wait, after a read lands, before a send refused at the ceiling may read
/// again (see [`LocalGate::ceiling_read_interval`]).
const CEILING_READ_FLOOR: Duration = Duration::from_millis(20);

/// An admitted send reads at the ceiling once the estimate is within `1 / NEAR_CEILING` of
/// it (see [`LocalGate::is_near_full`]).
pub(super) const NEAR_CEILING: u64 = 10;

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
        /// The last good read's backlog and time, which still bounds what is admitted while
        /// the streak builds: the queue holds at most that and every send counted since.
        standing: Option<(u64, Instant)>,
    },
}

#[derive(Debug)]
pub(super) struct GateState {
    last_read: LastRead,
    /// Bumped by every finished read the TTL paces (not one at the ceiling, [`Read::AtCeiling`]);
    /// waiters compare it to learn that such a read happened, and it numbers the share
    /// rounds and the once-per-read log lines.
    pub(super) generation: u64,
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
    /// A read started in the background (ahead of expiry, or at the ceiling) is running: one
    /// at a time.
    pub(super) reading_in_background: bool,
    /// The earliest a send at the ceiling may start a read; `None` until a good read, and
    /// after a read at the ceiling failed (the TTL's next read is awaited).
    ceiling_read_after: Option<Instant>,
    /// The drain rate, measured between good reads.
    drain: DrainEstimator,
    /// The last good read's time and backlog: the previous end of the next measured pair.
    anchor: Option<(Instant, u64)>,
    /// Refused at the ceiling and not yet back at or below the resume level.
    refusing: bool,
    /// Reads made before this are not reused (see [`LocalGate::forget_reads_before`]).
    fresh_after: Option<Instant>,
}

/// Why a read is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    /// The TTL's: a send found the cached read stale or within its lead (counts in the
    /// streak).
    ForSend,
    /// At start-up (does not count in the streak).
    Priming,
    /// A send was refused at the ceiling, or admitted within a tenth of it, on a read older
    /// than the ceiling-read interval. It
    /// refreshes the cached value, not the TTL's schedule; a failure leaves the cached
    /// read in place and out of the streak (no send depends on this read).
    AtCeiling,
}

pub struct LocalGate {
    queue: QueueName,
    /// Swapped by `PATCH /admin/settings`; read once or a few times per decision, no lock.
    policy: Arc<PolicyCell>,
    /// Whose admin plane is read: the lane's backend.
    backend: Arc<dyn Backend>,
    pub(super) state: Mutex<GateState>,
    /// Held by the one read in flight; sends that find the cache stale queue here.
    read_turn: tokio::sync::Mutex<()>,
}

/// What the gate counts on top of its read when its sends are not all it must answer for
/// (a replica of a fleet deciding alone): the backlog is at least `floor`, and `counted`
/// sends of its own, weighed `replicas` times, go on top instead of its own count since the
/// read. `None`: the gate is the only writer, and counts itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalBounds {
    pub floor: u64,
    pub replicas: u64,
    pub counted: u64,
}

impl LocalGate {
    pub fn new(queue: QueueName, policy: Arc<PolicyCell>, backend: Arc<dyn Backend>) -> Arc<Self> {
        let lag = backend.depth_lag();
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
                reading_in_background: false,
                ceiling_read_after: None,
                drain: DrainEstimator::new(lag),
                anchor: None,
                refusing: false,
                fresh_after: None,
            }),
            read_turn: tokio::sync::Mutex::new(()),
            policy,
        })
    }

    pub fn queue(&self) -> &QueueName {
        &self.queue
    }

    /// The queue's drain rate as measured between this gate's reads.
    pub fn drain_rate(&self) -> Option<DrainRate> {
        self.state.lock().drain.rate()
    }

    /// How many depth reads have ended: a new number for each read (what `tenant_refused`
    /// is logged once per).
    pub fn reads(&self) -> u64 {
        self.state.lock().generation
    }

    /// Reads made before `at` are not reused, nor measured against (the gate was not the
    /// one deciding since: a spell in a fleet, whose admissions it did not count).
    pub fn forget_reads_before(&self, at: Instant) {
        let mut state = self.state.lock();
        if state.fresh_after.is_none_or(|after| after < at) {
            state.fresh_after = Some(at);
        }
    }

    /// Decide whether `units` more sends (one, or a batch's entries) may go to the queue,
    /// reading the depth first when the cached read is stale: all of them fit under the
    /// ceiling, or none is admitted and the refusal says how many would (`room`). `bounds`
    /// (a replica deciding alone) already count all of them. What the ceiling would admit
    /// goes past `judge` (under the gate's lock), which is told too what it refuses as
    /// full. Each admitted send is counted in flight until [`Self::finish`].
    pub async fn admit_units(
        self: &Arc<Self>,
        bounds: Option<LocalBounds>,
        units: u64,
        judge: &mut (dyn Judge + Send),
    ) -> Result<(), Refusal> {
        self.admit_units_read(None, bounds, units, judge).await
    }

    /// As [`Self::admit_units`], for a send that already waited for the read of generation
    /// `read` ([`Self::full_short_of`]): that read is its own, reused even past its TTL
    /// while no other read has landed (a TTL of 0 reads once per send, not twice, and a
    /// failing admin plane adds one to the streak per send, not two).
    pub async fn admit_units_read(
        self: &Arc<Self>,
        read: Option<u64>,
        bounds: Option<LocalBounds>,
        units: u64,
        judge: &mut (dyn Judge + Send),
    ) -> Result<(), Refusal> {
        let cached = {
            let mut state = self.state.lock();
            let now = Instant::now();
            let fresh = self.is_fresh(&state, now) || self.is_being_refreshed(&state, now);
            if fresh || read == Some(state.generation) {
                // Its own read past its TTL (a TTL of 0) is not read ahead of: the next
                // send reads.
                let ahead = fresh
                    .then(|| self.should_refresh_ahead(&mut state, now))
                    .flatten();
                let decision = self.decide(&mut state, bounds, units, judge);
                let background = ahead
                    .or_else(|| self.should_read_at_ceiling(&mut state, bounds, now, &decision));
                Ok((
                    Self::failclosed_to_log(&mut state, &decision),
                    decision,
                    background,
                ))
            } else {
                Err(state.generation)
            }
        };
        let (log, decision) = match cached {
            Ok((log, decision, background)) => {
                if let Some((generation, kind)) = background {
                    self.read_in_background(generation, kind);
                }
                (log, decision)
            }
            Err(seen_generation) => {
                self.refresh(seen_generation, Read::ForSend).await;
                let mut state = self.state.lock();
                let decision = self.decide(&mut state, bounds, units, judge);
                (Self::failclosed_to_log(&mut state, &decision), decision)
            }
        };
        // Logged after the lock is released: stderr must not serialise a queue's sends.
        self.log_failclosed(log, &decision);
        decision
    }

    /// A fail-closed refusal's `send_failclosed` line, when one is due (`log`: the
    /// refusals since the last).
    fn log_failclosed(&self, log: Option<u64>, decision: &Result<(), Refusal>) {
        if let (
            Some(refused_since_last_log),
            Err(Refusal::CapacityUnknown {
                consecutive_failures,
                ..
            }),
        ) = (log, decision)
        {
            tracing::warn!(
                event = "send_failclosed",
                queue = %self.queue,
                cause = Unknown::AdminPlane.as_str(),
                consecutive_failures,
                refused_since_last_log,
                "queue depth unknown: refusing sends (fail-closed)"
            );
        }
    }

    /// Read the depth in a task of its own: the send that started it is answered now.
    fn read_in_background(self: &Arc<Self>, generation: u64, kind: Read) {
        let gate = Arc::clone(self);
        tokio::spawn(async move {
            gate.refresh(generation, kind).await;
            gate.state.lock().reading_in_background = false;
        });
    }

    /// A fail-closed refusal is logged once per depth read: the first after each read
    /// says how many were refused since the last line (this one included).
    pub(super) fn failclosed_to_log(
        state: &mut GateState,
        decision: &Result<(), Refusal>,
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

    /// Read the depth now, whatever the cache holds (start-up). A failure here is recorded
    /// but does not start the streak: the streak counts the reads sends depend on, so with
    /// the admin plane down from the start, sends 1 and 2 still fail open and send 3 is the
    /// one refused (contract section 2).
    pub async fn prime(&self) {
        let generation = self.state.lock().generation;
        self.refresh(generation, Read::Priming).await;
    }

    fn is_fresh(&self, state: &GateState, now: Instant) -> bool {
        match state.last_read {
            LastRead::Never => false,
            LastRead::Ok { at, .. } | LastRead::Failed { at, .. } => {
                // A read made before the replica last turned local is from before a spell in
                // the fleet, whose admissions it does not count: never reused.
                now < at + self.policy.load().ttl && Self::comparable(state, at)
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
        let (LastRead::Ok { at, .. } | LastRead::Failed { at, .. }) = state.last_read else {
            return false;
        };
        state.reading_in_background
            && now < at + self.policy.load().ttl + self.policy.base().read_timeout
            && Self::comparable(state, at)
    }

    /// A read made at `at` counts everything admitted since: none was admitted elsewhere.
    fn comparable(state: &GateState, at: Instant) -> bool {
        state.fresh_after.is_none_or(|after| at >= after)
    }

    /// Whether this send starts the read ahead of expiry (and of which generation): the
    /// cached value is within its refresh lead of the TTL and no read runs yet.
    fn should_refresh_ahead(&self, state: &mut GateState, now: Instant) -> Option<(u64, Read)> {
        if state.reading_in_background || now < self.read_ahead_from(state)? {
            return None;
        }
        state.reading_in_background = true;
        Some((state.generation, Read::ForSend))
    }

    /// When the TTL's next read is due ahead of the cached read's expiry: its refresh lead
    /// (twice the last read's duration, at most half the TTL) before it.
    fn read_ahead_from(&self, state: &GateState) -> Option<Instant> {
        let (LastRead::Ok { at, .. } | LastRead::Failed { at, .. }) = state.last_read else {
            return None;
        };
        let ttl = self.policy.load().ttl;
        let lead = (state.last_read_took * 2).min(ttl / 2);
        (at + ttl).checked_sub(lead)
    }

    /// Whether this send starts a read at the ceiling (and of which generation): it was
    /// refused there (`queue_full`: the judge never answers that) or admitted near it
    /// ([`Self::is_near_full`]), the last good read landed at least the ceiling-read interval ago, and no
    /// read runs yet.
    fn should_read_at_ceiling(
        &self,
        state: &mut GateState,
        bounds: Option<LocalBounds>,
        now: Instant,
        decision: &Result<(), Refusal>,
    ) -> Option<(u64, Read)> {
        let at_ceiling = match decision {
            Err(Refusal::QueueFull { .. }) => true,
            Ok(()) => self.is_near_full(state, bounds),
            Err(_) => false,
        };
        if !at_ceiling
            || state.reading_in_background
            || state.ceiling_read_after.is_none_or(|after| now < after)
        {
            return None;
        }
        state.reading_in_background = true;
        Some((state.generation, Read::AtCeiling))
    }

    /// Whether the estimate, with the sends admitted so far, is within a tenth of the
    /// ceiling (or at its last place): room the next sends may fill before a read started
    /// now lands, so that read starts before any is refused.
    fn is_near_full(&self, state: &GateState, bounds: Option<LocalBounds>) -> bool {
        let LastRead::Ok { backlog, .. } = state.last_read else {
            return false;
        };
        let limit = self.policy.load().limit;
        let estimate = Self::estimate_before(state, backlog, bounds, 1);
        estimate.saturating_add((limit / NEAR_CEILING).max(1)) >= limit
    }

    /// How long after a read lands a send at the ceiling may read again: twice that read's
    /// duration (the admin plane then spends at most a third of its time on this queue),
    /// at least [`CEILING_READ_FLOOR`] (50 reads a second at most), and for an admin plane
    /// whose counts trail, half its lag (RabbitMQ's management counts move once per
    /// statistics refresh, the lag being twice that and a second: a read sooner would show
    /// the same count).
    fn ceiling_read_interval(&self, took: Duration) -> Duration {
        (took * 2)
            .max(CEILING_READ_FLOOR)
            .max(self.backend.depth_lag() / 2)
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
        state.last_read_took = now - started;
        match result {
            Ok(backlog) => {
                // Completions before the read started are in its count (for an exact admin
                // plane); those after it, and those inside the lag window, are added on top.
                let since_read = lagged + (state.completed_total - completed_at_start);
                self.land(&mut state, kind, backlog, since_read, now);
            }
            Err(error) => {
                if kind == Read::AtCeiling {
                    // The cached read stands (it is within its TTL); no more reads at the
                    // ceiling before the TTL's next good one, so a failing admin plane is
                    // asked no more often than the TTL says.
                    state.ceiling_read_after = None;
                } else {
                    state.generation += 1;
                    let standing = Self::standing(&state);
                    state.last_read = LastRead::Failed { at: now, standing };
                }
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

    /// A good read lands: its backlog, with `since_read` counted on top. A read at the ceiling
    /// keeps the TTL's schedule (the cached read's time, the generation) unless the TTL's
    /// read is due by now, which it then is: a send must not find the value expired and
    /// wait for the admin plane just after a read landed.
    fn land(
        &self,
        state: &mut GateState,
        kind: Read,
        backlog: Backlog,
        since_read: u64,
        now: Instant,
    ) {
        let scheduled_at = match state.last_read {
            LastRead::Ok { at, .. } if kind == Read::AtCeiling => {
                Some(at).filter(|_| self.read_ahead_from(state).is_some_and(|due| now < due))
            }
            _ => None,
        };
        if scheduled_at.is_none() {
            state.generation += 1;
        }
        Self::measure_drain(state, now, backlog.messages, since_read);
        state.since_read = since_read;
        state.last_read = LastRead::Ok {
            backlog: backlog.messages,
            send_disabled: backlog.send_disabled,
            at: scheduled_at.unwrap_or(now),
        };
        state.ceiling_read_after = Some(now + self.ceiling_read_interval(state.last_read_took));
        state.streak = 0;
        state.last_read_ok_at = Some(SystemTime::now());
        state.reads_ok += 1;
    }

    /// One pair of good reads for the drain rate: the previous read's estimate (its backlog
    /// and every send stored since) against this one's, as of now. A pair that spans a
    /// spell in the fleet is not measured: this gate did not count the fleet's sends.
    fn measure_drain(state: &mut GateState, now: Instant, backlog: u64, since_read: u64) {
        match state.anchor {
            Some((at, previous)) if Self::comparable(state, at) => state.drain.record(Pair {
                before: previous.saturating_add(state.since_read),
                after: backlog.saturating_add(since_read),
                read: backlog,
                over: now - at,
            }),
            _ => state.drain.break_chain(),
        }
        state.anchor = Some((now, backlog));
    }

    /// Completions within `lag` before `started`, pruning slots no future read can need.
    fn lagged_completions(&self, state: &mut GateState, started: Instant) -> u64 {
        if self.backend.depth_lag().is_zero() {
            return 0;
        }
        let cutoff = started.checked_sub(self.backend.depth_lag());
        if let Some(cutoff) = cutoff {
            while state.recent.front().is_some_and(|(end, _)| *end < cutoff) {
                state.recent.pop_front();
            }
        }
        state.recent.iter().map(|(_, n)| n).sum()
    }

    fn decide(
        &self,
        state: &mut GateState,
        bounds: Option<LocalBounds>,
        units: u64,
        judge: &mut (dyn Judge + Send),
    ) -> Result<(), Refusal> {
        // One snapshot per decision: a concurrent settings change applies to the next one.
        let policy = self.policy.load();
        match state.last_read {
            LastRead::Ok {
                send_disabled: true,
                ..
            } => return Err(Refusal::QueueDisabled),
            LastRead::Ok { backlog, at, .. } => {
                Self::decide_by_read(state, &policy, (backlog, at), bounds, units, judge)?;
            }
            LastRead::Failed { at, standing } => {
                Self::decide_unknown(state, &policy, (at, standing), bounds, units)?;
            }
            LastRead::Never => {
                Self::decide_unknown(state, &policy, (Instant::now(), None), bounds, units)?
            }
        }
        state.in_flight += units;
        Ok(())
    }

    /// The last good read whose count of sends since is still whole: the backlog it read
    /// and when (a read from before a spell in the fleet counts none of the fleet's sends).
    fn standing(state: &GateState) -> Option<(u64, Instant)> {
        let read = match state.last_read {
            LastRead::Ok { backlog, at, .. } => Some((backlog, at)),
            LastRead::Failed { standing, .. } => standing,
            LastRead::Never => None,
        };
        read.filter(|(_, at)| Self::comparable(state, *at))
    }

    /// With the backlog unknown (the last read, failed at `failed_at`): open with the gate
    /// off; with it on, closed at the streak, and while the streak builds, open only as far
    /// as what is known allows: the last good read (none: an empty queue) with every send
    /// counted since stays under the ceiling with these `units`. So the sends admitted blind
    /// are at most the room the last good read left, and never more than the ceiling.
    fn decide_unknown(
        state: &mut GateState,
        policy: &CapacityPolicy,
        (failed_at, standing): (Instant, Option<(u64, Instant)>),
        bounds: Option<LocalBounds>,
        units: u64,
    ) -> Result<(), Refusal> {
        if !policy.fail_closed {
            return Ok(());
        }
        let unknown = Refusal::CapacityUnknown {
            consecutive_failures: state.streak,
            cause: Unknown::AdminPlane,
        };
        if state.streak >= policy.streak_threshold {
            return Err(unknown);
        }
        let standing = standing.filter(|(_, at)| Self::comparable(state, *at));
        let estimate = Self::estimate_before(state, standing.map_or(0, |(b, _)| b), bounds, units);
        // The hysteresis as with a good read: what is known still says whether the queue
        // refuses until it is back at or below the resume level.
        state.refusing = if state.refusing {
            estimate > policy.resume_at()
        } else {
            estimate >= policy.limit
        };
        let weight = bounds.map_or(1, |b| b.replicas.max(1));
        let rest = units.saturating_sub(1).saturating_mul(weight);
        if !state.refusing && estimate.saturating_add(rest) < policy.limit {
            return Ok(());
        }
        let Some(_) = standing else {
            return Err(unknown);
        };
        let until_next_read = (failed_at + policy.ttl).saturating_duration_since(Instant::now());
        let full = policy.queue_full(estimate, state.drain.rate(), until_next_read);
        if state.refusing {
            return Err(full);
        }
        Err(full.with_room(policy.limit.saturating_sub(estimate).div_ceil(weight)))
    }

    /// With a good read (`backlog` read `at`): under the ceiling with all `units`, then
    /// past the judge.
    fn decide_by_read(
        state: &mut GateState,
        policy: &CapacityPolicy,
        (backlog, at): (u64, Instant),
        bounds: Option<LocalBounds>,
        units: u64,
        judge: &mut (dyn Judge + Send),
    ) -> Result<(), Refusal> {
        let estimate = Self::estimate_before(state, backlog, bounds, units);
        // Hysteresis: at the ceiling the queue starts refusing, and goes on until the
        // estimate is back at or below the resume level.
        state.refusing = if state.refusing {
            estimate > policy.resume_at()
        } else {
            estimate >= policy.limit
        };
        let round = policy.share_round(state.generation);
        let full = |state: &GateState| {
            let until_next_read = (at + policy.ttl).saturating_duration_since(Instant::now());
            policy.queue_full(estimate, state.drain.rate(), until_next_read)
        };
        if state.refusing {
            judge.refused_full(round, units);
            return Err(full(state));
        }
        // The rest of a batch on top (weighed as the bounds weigh a send): all of it
        // fits, or it is refused whole with the room there is.
        let weight = bounds.map_or(1, |b| b.replicas.max(1));
        let rest = units.saturating_sub(1).saturating_mul(weight);
        let room = policy.limit.saturating_sub(estimate).div_ceil(weight);
        if estimate.saturating_add(rest) >= policy.limit {
            judge.refused_full(round, units);
            return Err(full(state).with_room(room));
        }
        // What the queue holds with these sends as the check above weighs them: the
        // bounds already count the first, a gate alone does not.
        let first = u64::from(bounds.is_none());
        judge.judge(&CeilingView {
            round,
            units,
            room,
            estimate,
            after: estimate.saturating_add(rest).saturating_add(first),
            limit: policy.limit,
        })
    }

    /// What the queue holds before these sends: a batch's own units do not move the
    /// hysteresis a single send would not.
    fn estimate_before(
        state: &GateState,
        backlog: u64,
        bounds: Option<LocalBounds>,
        units: u64,
    ) -> u64 {
        match bounds {
            None => backlog
                .saturating_add(state.since_read)
                .saturating_add(state.in_flight),
            Some(b) => backlog.max(b.floor).saturating_add(
                b.counted
                    .saturating_sub(units.saturating_sub(1))
                    .saturating_mul(b.replicas),
            ),
        }
    }

    /// An admitted send ended.
    pub fn finish(&self, outcome: BacklogEffect) {
        let mut state = self.state.lock();
        state.in_flight = state.in_flight.saturating_sub(1);
        if outcome == BacklogEffect::NotStored {
            return;
        }
        state.completed_total += 1;
        state.since_read += 1;
        if !self.backend.depth_lag().is_zero() {
            let now = Instant::now();
            match state.recent.back_mut() {
                Some((end, n)) if *end >= now => *n += 1,
                _ => state.recent.push_back((now + SLOT, 1)),
            }
            // Bound memory when reads are rare: nothing older than lag plus the longest
            // read can matter to a read that is running or yet to start.
            if let Some(cutoff) =
                now.checked_sub(self.backend.depth_lag() + self.policy.base().read_timeout + SLOT)
            {
                while state.recent.front().is_some_and(|(end, _)| *end < cutoff) {
                    state.recent.pop_front();
                }
            }
        }
    }

    /// A `queue_full` as the estimate stands now (the last good read and the sends counted
    /// since), when it leaves less room under the ceiling than `units` with `kept` units on
    /// top and the queue holds half its ceiling or more (its `room` says what is left beside
    /// the units kept); `None` when it leaves that much, when the queue holds less than
    /// half (a batch too: no idle workers for a promise), or without a good read (the send
    /// is then decided as any other). A read past its TTL is made again first, as a send's
    /// decision would (one read shared with the sends asking meanwhile); the second value
    /// is that read's generation, which the send's decision reuses
    /// ([`Self::admit_units_read`]): with a TTL of 0, one read per send, not two.
    pub async fn full_short_of(&self, units: u64, kept: u64) -> (Option<Refusal>, Option<u64>) {
        let stale = {
            let state = self.state.lock();
            let now = Instant::now();
            let usable = self.is_fresh(&state, now) || self.is_being_refreshed(&state, now);
            (!usable).then_some(state.generation)
        };
        if let Some(generation) = stale {
            self.refresh(generation, Read::ForSend).await;
        }
        let state = self.state.lock();
        let read = stale.map(|_| state.generation);
        let now = Instant::now();
        let LastRead::Ok { backlog, at, .. } = state.last_read else {
            return (None, read);
        };
        let policy = self.policy.load();
        let estimate = backlog
            .saturating_add(state.since_read)
            .saturating_add(state.in_flight);
        let left = policy.limit.saturating_sub(estimate);
        if left >= units.saturating_add(kept) || estimate.saturating_mul(2) < policy.limit {
            return (None, read);
        }
        let until_next_read = (at + policy.ttl).saturating_duration_since(now);
        let full = policy.queue_full(estimate, state.drain.rate(), until_next_read);
        (Some(full.with_room(left.saturating_sub(kept))), read)
    }

    /// The gate as it stands; `reads` are the admin-plane reads this process made for
    /// the queue in any mode (a counter in /metrics never goes down at a switch of mode).
    pub fn snapshot(&self, other_reads: (u64, u64)) -> GateSnapshot {
        let state = self.state.lock();
        let reads_ok = state.reads_ok + other_reads.0;
        let reads_failed = state.reads_failed + other_reads.1;
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
            depth_read: state.anchor.map(|(at, backlog)| DepthRead {
                backlog,
                age: Instant::now().saturating_duration_since(at),
            }),
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
