//! The request-path circuit breaker, one per backend: a pure state machine on tokio's
//! clock (so tests drive it with a paused clock).
//!
//! ```text
//! closed ──(≥ min_failures and ≥ failure_rate of outcomes in the window,
//!           or a streak: failures in a row for streak_for, or unsent in a row)──▶ open
//! open ──(its open time elapsed; the next real send is a trial)──▶ half_open
//! half_open ──trial succeeds──▶ closed        half_open ──trial fails──▶ open
//! ```
//!
//! Only outcomes of real sends feed it. A health probe neither opens nor closes it: in the
//! outage this design answers, probes on their own healthy connections kept passing while
//! every request failed. Saturation and request-caused refusals (too large, bad input, one
//! queue at its own length limit) are not outcomes at all.
//!
//! Two rules open it. The rate rule (a share of a minute's outcomes) ignores sparse
//! failures among successes, but after a long healthy spell it needs as many failures as
//! there were successes: a primary failing every send was failed over only after ~15 s.
//! The streak rule opens it once every send for `streak_for` has failed (`min_failures` at
//! least: an operator's lenient breaker stays lenient). A send that never reached the
//! broker (no connection: nothing was sent) is a failure that is certain and costs nothing
//! to try again, so a few of those in a row open it at once, and for `unsent_open_for`
//! only: the broker is tried again every second, not every 15 s.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::backend::{SendError, SendReceipt};

#[derive(Debug, Clone, PartialEq)]
pub struct BreakerPolicy {
    /// Outcomes older than this are forgotten.
    pub window: Duration,
    /// Fewest failures in the window before the breaker may open.
    pub min_failures: u32,
    /// Share of failures among the window's outcomes at which it opens (0–1).
    pub failure_rate: f64,
    /// How long it stays open before a trial send is let through.
    pub open_for: Duration,
    /// How long failures in a row (no success between, the first within `window`, at
    /// least `min_failures` of them) must have lasted, from the first, to open it.
    pub streak_for: Duration,
    /// Sends in a row that never reached the broker which open it at once.
    pub unsent_in_a_row: u32,
    /// How long it stays open when the send that opened it never reached the broker.
    pub unsent_open_for: Duration,
}

impl Default for BreakerPolicy {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(60),
            min_failures: 10,
            failure_rate: 0.5,
            open_for: Duration::from_secs(15),
            streak_for: Duration::from_secs(2),
            unsent_in_a_row: 3,
            unsent_open_for: Duration::from_secs(1),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

impl BreakerState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half_open",
        }
    }
}

/// What a finished send says about the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Failure,
    /// A failure in which nothing reached the broker (it could not be reached): certain,
    /// and free to try again.
    Unsent,
    /// Says nothing about the backend's health (e.g. the request's own fault).
    Neutral,
}

impl Outcome {
    /// What a send's result tells the breaker. The request's own fault (too large, a key
    /// reused for another message), the queue's configuration (disabled) and one queue at
    /// its own length limit (the broker nacked it: that queue's backpressure) say nothing
    /// about the backend: another queue on the same broker is taking sends. A busy backend
    /// (throttling, a memory or disk alarm, a full disk) answered, at once and with a wait:
    /// it is working, and opening the circuit would turn its honest `backend_busy` into `backend_unavailable`.
    pub fn of(result: &Result<SendReceipt, SendError>) -> Self {
        match result {
            Ok(_) => Self::Success,
            Err(
                SendError::TooLarge
                | SendError::KeyReused
                | SendError::QueueDisabled
                | SendError::QueueFull
                | SendError::Busy { .. },
            ) => Self::Neutral,
            Err(SendError::Unavailable(_)) => Self::Unsent,
            Err(_) => Self::Failure,
        }
    }

    /// A failure of either kind.
    pub fn failed(self) -> bool {
        matches!(self, Self::Failure | Self::Unsent)
    }
}

#[derive(Debug)]
enum State {
    Closed,
    Open {
        until: Instant,
        /// Opened because the broker could not be reached, since then (the outage's
        /// start: what a refusal's `Retry-After` is measured from).
        unsent_since: Option<Instant>,
    },
    HalfOpen {
        trial_in_flight: bool,
        unsent_since: Option<Instant>,
    },
    /// Opened by an operator (`POST /admin/breakers/{backend}`): no trial until an
    /// operator closes or resets it.
    Held,
}

/// What an operator asks of a breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Open and hold open: no send goes through, no trial is made, until `Close` or `Reset`.
    Open,
    /// Closed at once; the outcomes in the window are kept (the usual rule may reopen it).
    Close,
    /// Closed at once with the window forgotten, as at start-up.
    Reset,
}

/// One second's outcomes.
#[derive(Debug)]
struct SecondBucket {
    start: Instant,
    successes: u32,
    failures: u32,
}

/// Failures in a row since the last success.
#[derive(Debug, Clone, Copy)]
struct Streak {
    first: Instant,
    failures: u32,
    /// The last of them that never reached the broker, in a row (the first failures of a
    /// broker going down are often sends cut off mid-way: not unsent).
    unsent_tail: u32,
}

#[derive(Debug)]
struct Inner {
    state: State,
    buckets: VecDeque<SecondBucket>,
    streak: Option<Streak>,
}

pub struct Breaker {
    name: &'static str,
    policy: BreakerPolicy,
    inner: Mutex<Inner>,
    opened: std::sync::atomic::AtomicU64,
}

/// Permission for one send; report its outcome with [`Ticket::record`]. Dropped without a
/// record (the request was cancelled) it counts as neutral, so a trial slot is never lost.
pub struct Ticket {
    breaker: Arc<Breaker>,
    trial: bool,
    recorded: bool,
}

impl Ticket {
    pub fn record(mut self, outcome: Outcome) {
        self.recorded = true;
        self.breaker.record(self.trial, outcome);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.recorded {
            self.breaker.record(self.trial, Outcome::Neutral);
        }
    }
}

impl Breaker {
    pub fn new(name: &'static str, policy: BreakerPolicy) -> Arc<Self> {
        Arc::new(Self {
            name,
            policy,
            inner: Mutex::new(Inner {
                state: State::Closed,
                buckets: VecDeque::new(),
                streak: None,
            }),
            opened: std::sync::atomic::AtomicU64::new(0),
        })
    }

    pub fn state(&self) -> BreakerState {
        match self.inner.lock().state {
            State::Closed => BreakerState::Closed,
            State::Open { .. } | State::Held => BreakerState::Open,
            State::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// Held open by an operator (no trial until one closes or resets it).
    pub fn held(&self) -> bool {
        matches!(self.inner.lock().state, State::Held)
    }

    /// An operator's command; `by` is the API key's name, for the log.
    pub fn command(&self, command: Command, by: &str) {
        let mut inner = self.inner.lock();
        inner.streak = None;
        match command {
            Command::Open => {
                if !matches!(inner.state, State::Held) {
                    self.opened
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                inner.state = State::Held;
                inner.buckets.clear();
                drop(inner);
                tracing::warn!(
                    event = "breaker_open",
                    backend = self.name,
                    by,
                    why = "operator",
                    "circuit held open by an operator: sends fail fast or go to the fallback"
                );
            }
            Command::Close | Command::Reset => {
                inner.state = State::Closed;
                if command == Command::Reset {
                    inner.buckets.clear();
                }
                drop(inner);
                tracing::info!(
                    event = "breaker_closed",
                    backend = self.name,
                    by,
                    why = if command == Command::Reset {
                        "operator reset"
                    } else {
                        "operator"
                    },
                    "circuit closed by an operator"
                );
            }
        }
    }

    /// Would a send be let through now? (Routing asks this before committing to a backend.)
    pub fn would_allow(&self) -> bool {
        match self.inner.lock().state {
            State::Closed => true,
            State::Open { until, .. } => Instant::now() >= until,
            State::HalfOpen {
                trial_in_flight, ..
            } => !trial_in_flight,
            State::Held => false,
        }
    }

    /// Time until a send could be let through as the trial (`/health/detailed`'s
    /// `next_trial_in_s`). A refused send is told [`Self::try_acquire`]'s wait instead.
    pub fn retry_after(&self) -> Duration {
        match self.inner.lock().state {
            State::Open { until, .. } => until.saturating_duration_since(Instant::now()),
            State::Held => self.policy.open_for,
            _ => Duration::from_secs(1),
        }
    }

    /// How long a send refused now is told to wait; `None` when one would be let through.
    /// Opened by failures: until the next trial. Opened because the broker could not be
    /// reached: how long that has lasted (at least until the next trial, at most
    /// `open_for`), since when it comes back is unknown and a retry sooner would most
    /// likely be refused again; the trials themselves go on every `unsent_open_for`.
    fn wait(&self, state: &State, now: Instant) -> Option<Duration> {
        let outage = |since: Option<Instant>| {
            since.map_or(Duration::ZERO, |since| {
                now.saturating_duration_since(since)
                    .min(self.policy.open_for)
            })
        };
        match *state {
            State::Closed => None,
            State::Open {
                until,
                unsent_since,
            } if now < until => Some((until - now).max(outage(unsent_since))),
            State::Open { .. } => None,
            State::Held => Some(self.policy.open_for),
            State::HalfOpen {
                trial_in_flight: true,
                unsent_since,
            } => Some(Duration::from_secs(1).max(outage(unsent_since))),
            State::HalfOpen { .. } => None,
        }
    }

    /// Let one send through, or say how long until one could be.
    pub fn try_acquire(self: &Arc<Self>) -> Result<Ticket, Duration> {
        let mut inner = self.inner.lock();
        if let Some(wait) = self.wait(&inner.state, Instant::now()) {
            return Err(wait);
        }
        let trial = match inner.state {
            State::Closed => false,
            State::Open { unsent_since, .. } => {
                inner.state = State::HalfOpen {
                    trial_in_flight: true,
                    unsent_since,
                };
                // Every second while the broker cannot be reached: not worth a line each.
                if unsent_since.is_none() {
                    tracing::info!(
                        event = "breaker_half_open",
                        backend = self.name,
                        "circuit half-open: trying one send"
                    );
                }
                true
            }
            State::HalfOpen { unsent_since, .. } => {
                inner.state = State::HalfOpen {
                    trial_in_flight: true,
                    unsent_since,
                };
                true
            }
            State::Held => return Err(self.policy.open_for),
        };
        Ok(Ticket {
            breaker: self.clone(),
            trial,
            recorded: false,
        })
    }

    fn record(&self, trial: bool, outcome: Outcome) {
        let mut inner = self.inner.lock();
        let now = Instant::now();
        if trial {
            self.settle_trial(&mut inner, now, outcome);
            return;
        }
        // A send admitted before the breaker opened says nothing new once it is open.
        if !matches!(inner.state, State::Closed) || outcome == Outcome::Neutral {
            return;
        }
        self.count(&mut inner, now, outcome);
        if let Some(why) = self.should_open(&inner, now) {
            let unsent_since =
                (outcome == Outcome::Unsent).then(|| inner.streak.map_or(now, |s| s.first));
            self.open(&mut inner, now, unsent_since, why);
        }
    }

    /// A trial's outcome: success closes it, a failure opens it again, neutral lets
    /// another real send be the trial.
    fn settle_trial(&self, inner: &mut Inner, now: Instant, outcome: Outcome) {
        // An operator's command while the trial ran decides, not the trial.
        let State::HalfOpen { unsent_since, .. } = inner.state else {
            return;
        };
        match outcome {
            Outcome::Success => {
                inner.state = State::Closed;
                inner.buckets.clear();
                inner.streak = None;
                tracing::info!(
                    event = "breaker_closed",
                    backend = self.name,
                    "circuit closed: the trial send succeeded"
                );
            }
            // Still unreachable: open again as before, the outage's start kept, with no
            // new opening counted or logged (one a second would flood both).
            Outcome::Unsent if unsent_since.is_some() => {
                inner.state = State::Open {
                    until: now + self.policy.unsent_open_for,
                    unsent_since,
                };
            }
            Outcome::Unsent => self.open(inner, now, Some(now), "the trial send failed"),
            Outcome::Failure => self.open(inner, now, None, "the trial send failed"),
            Outcome::Neutral => {
                inner.state = State::HalfOpen {
                    trial_in_flight: false,
                    unsent_since,
                }
            }
        }
    }

    /// Adds a closed breaker's outcome to the window's buckets and to the streak.
    fn count(&self, inner: &mut Inner, now: Instant, outcome: Outcome) {
        let window_start = now.checked_sub(self.policy.window);
        while let (Some(first), Some(start)) = (inner.buckets.front(), window_start) {
            if first.start + Duration::from_secs(1) > start {
                break;
            }
            inner.buckets.pop_front();
        }
        let failed = outcome.failed();
        match inner.buckets.back_mut() {
            Some(slot) if now < slot.start + Duration::from_secs(1) => match failed {
                false => slot.successes += 1,
                true => slot.failures += 1,
            },
            _ => inner.buckets.push_back(SecondBucket {
                start: now,
                successes: u32::from(!failed),
                failures: u32::from(failed),
            }),
        }
        let unsent = outcome == Outcome::Unsent;
        inner.streak = match inner.streak {
            _ if !failed => None,
            Some(s) if now.saturating_duration_since(s.first) < self.policy.window => {
                Some(Streak {
                    first: s.first,
                    failures: s.failures.saturating_add(1),
                    unsent_tail: if unsent {
                        s.unsent_tail.saturating_add(1)
                    } else {
                        0
                    },
                })
            }
            _ => Some(Streak {
                first: now,
                failures: 1,
                unsent_tail: u32::from(unsent),
            }),
        };
    }

    /// Which rule, if any, opens a closed breaker now.
    fn should_open(&self, inner: &Inner, now: Instant) -> Option<&'static str> {
        if let Some(s) = inner.streak {
            if s.unsent_tail >= self.policy.unsent_in_a_row {
                return Some("the broker could not be reached");
            }
            if s.failures >= self.policy.min_failures
                && now.saturating_duration_since(s.first) >= self.policy.streak_for
            {
                return Some("every send failed for the streak time");
            }
        }
        let (successes, failures) = inner.buckets.iter().fold((0u64, 0u64), |(s, f), slot| {
            (s + u64::from(slot.successes), f + u64::from(slot.failures))
        });
        let rate = failures as f64 / (successes + failures).max(1) as f64;
        (failures >= u64::from(self.policy.min_failures) && rate >= self.policy.failure_rate)
            .then_some("failure threshold reached")
    }

    /// Times the breaker has opened (for `/metrics`).
    pub fn opened_total(&self) -> u64 {
        self.opened.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Open it: for `unsent_open_for` when the broker could not be reached (since
    /// `unsent_since`), else for `open_for`.
    fn open(
        &self,
        inner: &mut Inner,
        now: Instant,
        unsent_since: Option<Instant>,
        why: &'static str,
    ) {
        self.opened
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let open_for = match unsent_since {
            Some(_) => self.policy.unsent_open_for,
            None => self.policy.open_for,
        };
        inner.state = State::Open {
            until: now + open_for,
            unsent_since,
        };
        inner.buckets.clear();
        inner.streak = None;
        tracing::warn!(
            event = "breaker_open",
            backend = self.name,
            open_for_s = open_for.as_secs(),
            why,
            "circuit open: sends fail fast or go to the fallback"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker() -> Arc<Breaker> {
        Breaker::new("test", BreakerPolicy::default())
    }

    fn outcome(b: &Arc<Breaker>, o: Outcome) {
        b.try_acquire().expect("allowed").record(o);
    }

    #[tokio::test(start_paused = true)]
    async fn nine_failures_stay_closed_and_the_tenth_at_half_opens_it() {
        let b = breaker();
        for _ in 0..9 {
            outcome(&b, Outcome::Failure);
        }
        assert_eq!(b.state(), BreakerState::Closed);
        outcome(&b, Outcome::Failure);
        assert_eq!(b.state(), BreakerState::Open);
        assert!(b.try_acquire().is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn failures_below_the_rate_keep_it_closed() {
        let b = breaker();
        for _ in 0..11 {
            outcome(&b, Outcome::Success);
        }
        for _ in 0..10 {
            outcome(&b, Outcome::Failure);
        }
        assert_eq!(
            b.state(),
            BreakerState::Closed,
            "10 failures of 21 is under 50%"
        );
        outcome(&b, Outcome::Failure);
        assert_eq!(b.state(), BreakerState::Open, "11 of 22 is 50%");
    }

    #[tokio::test(start_paused = true)]
    async fn old_outcomes_leave_the_window() {
        let b = breaker();
        for _ in 0..9 {
            outcome(&b, Outcome::Failure);
        }
        tokio::time::advance(Duration::from_secs(61)).await;
        outcome(&b, Outcome::Failure);
        assert_eq!(
            b.state(),
            BreakerState::Closed,
            "the 9 earlier failures are out of the window"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_outcome_at_a_buckets_end_starts_the_next_bucket() {
        // One failure opens a bucket at t=0; the eight at t=1.0 s, exactly its end, start
        // the next one (9 in all: closed). At t=61.0 s the window starts at 1.0 s: the first
        // bucket has left it, the second has not, so those eight and two more open it.
        let b = breaker();
        outcome(&b, Outcome::Failure);
        tokio::time::advance(Duration::from_secs(1)).await;
        for _ in 0..8 {
            outcome(&b, Outcome::Failure);
        }
        assert_eq!(b.state(), BreakerState::Closed);
        tokio::time::advance(Duration::from_secs(60)).await;
        outcome(&b, Outcome::Failure);
        assert_eq!(b.state(), BreakerState::Closed, "8 + 1 in the window");
        outcome(&b, Outcome::Failure);
        assert_eq!(b.state(), BreakerState::Open, "8 + 2 in the window");
    }

    #[tokio::test(start_paused = true)]
    async fn a_bucket_still_partly_in_the_window_still_counts() {
        let b = breaker();
        for _ in 0..9 {
            outcome(&b, Outcome::Failure);
        }
        // The window starts at 0.5 s: the bucket [0, 1) s is partly inside it.
        tokio::time::advance(Duration::from_millis(60_500)).await;
        outcome(&b, Outcome::Failure);
        assert_eq!(b.state(), BreakerState::Open);
    }

    #[tokio::test(start_paused = true)]
    async fn neutral_outcomes_count_for_nothing() {
        let b = breaker();
        for _ in 0..50 {
            outcome(&b, Outcome::Neutral);
        }
        for _ in 0..10 {
            outcome(&b, Outcome::Failure);
        }
        assert_eq!(b.state(), BreakerState::Open);
    }

    #[tokio::test(start_paused = true)]
    async fn it_stays_open_for_the_minimum_time_then_lets_one_trial_through() {
        let b = breaker();
        for _ in 0..10 {
            outcome(&b, Outcome::Failure);
        }
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(b.try_acquire().err(), Some(Duration::from_secs(5)));
        assert_eq!(b.retry_after(), Duration::from_secs(5));
        tokio::time::advance(Duration::from_secs(5)).await;
        let trial = b.try_acquire().expect("a trial after the open time");
        assert_eq!(b.state(), BreakerState::HalfOpen);
        assert!(b.try_acquire().is_err(), "one trial at a time");
        trial.record(Outcome::Success);
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(b.try_acquire().is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_trial_reopens_it_for_another_full_period() {
        let b = breaker();
        for _ in 0..10 {
            outcome(&b, Outcome::Failure);
        }
        tokio::time::advance(Duration::from_secs(15)).await;
        b.try_acquire().unwrap().record(Outcome::Failure);
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(b.retry_after(), Duration::from_secs(15));
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_trial_frees_the_trial_slot() {
        let b = breaker();
        for _ in 0..10 {
            outcome(&b, Outcome::Failure);
        }
        tokio::time::advance(Duration::from_secs(15)).await;
        drop(b.try_acquire().unwrap());
        assert_eq!(b.state(), BreakerState::HalfOpen);
        assert!(
            b.try_acquire().is_ok(),
            "another real send may be the trial"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn sends_that_started_before_it_opened_do_not_move_it() {
        let b = breaker();
        let late = b.try_acquire().unwrap();
        for _ in 0..10 {
            outcome(&b, Outcome::Failure);
        }
        late.record(Outcome::Success);
        assert_eq!(b.state(), BreakerState::Open, "only a trial closes it");
    }

    #[tokio::test(start_paused = true)]
    async fn an_operators_open_holds_with_no_trial_until_closed() {
        let b = breaker();
        b.command(Command::Open, "ops");
        assert_eq!(b.state(), BreakerState::Open);
        assert!(b.held());
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert!(!b.would_allow(), "no trial while held");
        assert!(b.try_acquire().is_err());
        b.command(Command::Close, "ops");
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(!b.held());
        assert!(b.try_acquire().is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn close_keeps_the_window_and_reset_forgets_it() {
        let b = breaker();
        for _ in 0..9 {
            outcome(&b, Outcome::Failure);
        }
        b.command(Command::Close, "ops");
        outcome(&b, Outcome::Failure);
        assert_eq!(b.state(), BreakerState::Open, "the nine kept + one");
        b.command(Command::Reset, "ops");
        for _ in 0..9 {
            outcome(&b, Outcome::Failure);
        }
        assert_eq!(b.state(), BreakerState::Closed, "the window started afresh");
    }

    #[tokio::test(start_paused = true)]
    async fn a_trial_that_ends_after_an_operators_open_does_not_close_it() {
        let b = breaker();
        for _ in 0..10 {
            outcome(&b, Outcome::Failure);
        }
        tokio::time::advance(BreakerPolicy::default().open_for).await;
        let trial = b.try_acquire().expect("the trial");
        b.command(Command::Open, "ops");
        trial.record(Outcome::Success);
        assert!(b.held(), "the operator's hold stands");
    }

    /// Twenty sends a second for a minute, then every send fails: the streak rule opens it
    /// `streak_for` (2 s) after the first failure; the rate rule alone needed ~30 s (the
    /// minute's successes leaving the window one by one).
    #[tokio::test(start_paused = true)]
    async fn after_a_healthy_minute_a_backend_failing_every_send_opens_within_seconds() {
        let b = breaker();
        for _ in 0..1200 {
            outcome(&b, Outcome::Success);
            tokio::time::advance(Duration::from_millis(50)).await;
        }
        let first = Instant::now();
        while b.state() == BreakerState::Closed {
            assert!(
                first.elapsed() <= Duration::from_secs(5),
                "still closed {:?} after the first failure",
                first.elapsed()
            );
            outcome(&b, Outcome::Failure);
            tokio::time::advance(Duration::from_millis(50)).await;
        }
        let opened = first.elapsed();
        assert!(
            (Duration::from_secs(2)..=Duration::from_millis(2050)).contains(&opened),
            "{opened:?}"
        );
    }

    /// Failures among successes (one send in three failing, for two minutes), or many at
    /// one instant (the sends in flight on a connection that dropped), do not open it.
    #[tokio::test(start_paused = true)]
    async fn sparse_failures_or_a_burst_at_one_instant_keep_it_closed() {
        let b = breaker();
        for i in 0..2400 {
            let o = if i % 3 == 0 {
                Outcome::Failure
            } else {
                Outcome::Success
            };
            outcome(&b, o);
            tokio::time::advance(Duration::from_millis(50)).await;
        }
        assert_eq!(b.state(), BreakerState::Closed);
        for _ in 0..50 {
            outcome(&b, Outcome::Failure);
        }
        assert_eq!(b.state(), BreakerState::Closed, "50 at one instant");
    }

    /// The streak rule too needs `min_failures`: an operator's lenient breaker (1,000)
    /// stays closed through 5 s of failures at 20 a second.
    #[tokio::test(start_paused = true)]
    async fn the_streak_rule_needs_min_failures_too() {
        let b = Breaker::new(
            "test",
            BreakerPolicy {
                min_failures: 1000,
                ..BreakerPolicy::default()
            },
        );
        for _ in 0..100 {
            outcome(&b, Outcome::Failure);
            tokio::time::advance(Duration::from_millis(50)).await;
        }
        assert_eq!(b.state(), BreakerState::Closed);
    }

    /// Sends that never reached the broker (it could not be reached): three in a row open
    /// it at once, for a second; a trial goes each second with no new opening counted, and
    /// a refused send is told to wait as long as the outage has lasted (up to `open_for`).
    /// The first trial to succeed closes it.
    #[tokio::test(start_paused = true)]
    async fn unsent_sends_open_it_at_once_and_a_trial_goes_every_second() {
        let b = breaker();
        outcome(&b, Outcome::Success);
        for _ in 0..3 {
            outcome(&b, Outcome::Unsent);
        }
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(b.try_acquire().err(), Some(Duration::from_secs(1)));
        for second in 1..=6u64 {
            tokio::time::advance(Duration::from_secs(1)).await;
            assert!(b.would_allow(), "a trial each second ({second})");
            let trial = b.try_acquire().expect("the trial");
            assert_eq!(
                b.try_acquire().err(),
                Some(Duration::from_secs(second)),
                "told to wait as long as the outage so far"
            );
            trial.record(Outcome::Unsent);
            assert_eq!(b.state(), BreakerState::Open);
        }
        assert_eq!(b.opened_total(), 1, "one opening for the whole outage");
        tokio::time::advance(Duration::from_secs(30)).await;
        let trial = b.try_acquire().expect("the trial");
        assert_eq!(
            b.try_acquire().err(),
            Some(BreakerPolicy::default().open_for),
            "the wait told is at most open_for"
        );
        trial.record(Outcome::Success);
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(b.try_acquire().is_ok());
    }

    /// A broker going down first cuts off the sends under way (failures, not unsent): the
    /// three unsent after them still open it at once.
    #[tokio::test(start_paused = true)]
    async fn unsent_sends_after_cut_off_ones_open_it_at_once() {
        let b = breaker();
        for _ in 0..4 {
            outcome(&b, Outcome::Failure);
        }
        outcome(&b, Outcome::Unsent);
        outcome(&b, Outcome::Unsent);
        assert_eq!(b.state(), BreakerState::Closed);
        outcome(&b, Outcome::Unsent);
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(b.retry_after(), Duration::from_secs(1), "the unsent window");
    }

    /// Unsent sends among successes are failures like any other (the rate rule), and a
    /// trial that fails by timing out opens it for the full `open_for`.
    #[tokio::test(start_paused = true)]
    async fn an_unsent_streak_broken_by_a_success_does_not_open_it() {
        let b = breaker();
        for _ in 0..4 {
            outcome(&b, Outcome::Unsent);
            outcome(&b, Outcome::Unsent);
            outcome(&b, Outcome::Success);
        }
        assert_eq!(
            b.state(),
            BreakerState::Closed,
            "8 of 12, under 10 failures"
        );
        outcome(&b, Outcome::Unsent);
        outcome(&b, Outcome::Unsent);
        assert_eq!(b.state(), BreakerState::Open, "10 of 14: the rate rule");
        tokio::time::advance(Duration::from_secs(1)).await;
        b.try_acquire().expect("the trial").record(Outcome::Failure);
        assert_eq!(b.retry_after(), BreakerPolicy::default().open_for);
    }

    /// What a send's result says: a full queue (the broker's nack), a message too large, a
    /// disabled queue or a busy backend nothing; no connection is an unsent failure.
    #[test]
    fn a_full_queue_or_a_busy_backend_says_nothing_about_the_backend() {
        use crate::backend::{SendError, SendReceipt};
        let of = |r: Result<SendReceipt, SendError>| Outcome::of(&r);
        assert_eq!(of(Ok(SendReceipt { duplicate: false })), Outcome::Success);
        assert_eq!(of(Err(SendError::QueueFull)), Outcome::Neutral);
        assert_eq!(of(Err(SendError::TooLarge)), Outcome::Neutral);
        assert_eq!(of(Err(SendError::QueueDisabled)), Outcome::Neutral);
        assert_eq!(of(Err(SendError::KeyReused)), Outcome::Neutral);
        let alarm = SendError::Busy {
            reason: "the broker blocked publishers (memory alarm)".into(),
            retry_after: None,
        };
        assert_eq!(of(Err(alarm)), Outcome::Neutral);
        assert_eq!(
            of(Err(SendError::Unavailable("refused".into()))),
            Outcome::Unsent
        );
        assert_eq!(of(Err(SendError::Timeout)), Outcome::Failure);
        assert_eq!(
            of(Err(SendError::Failed("returned".into()))),
            Outcome::Failure
        );
    }
}
