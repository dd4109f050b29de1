//! The request-path circuit breaker, one per backend: a pure state machine on tokio's
//! clock (so tests drive it with a paused clock).
//!
//! ```text
//! closed ──(≥ min_failures and ≥ failure_rate of outcomes in the window)──▶ open
//! open ──(open_for elapsed; the next real send is a trial)──▶ half_open
//! half_open ──trial succeeds──▶ closed        half_open ──trial fails──▶ open
//! ```
//!
//! Only outcomes of real sends feed it. A health probe neither opens nor closes it: in the
//! outage this design answers, probes on their own healthy connections kept passing while
//! every request failed. Saturation and request-caused refusals (too large, bad input) are
//! not outcomes at all.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

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
}

impl Default for BreakerPolicy {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(60),
            min_failures: 10,
            failure_rate: 0.5,
            open_for: Duration::from_secs(15),
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
    /// Says nothing about the backend's health (e.g. the request's own fault).
    Neutral,
}

#[derive(Debug)]
enum State {
    Closed,
    Open {
        until: Instant,
    },
    HalfOpen {
        trial_in_flight: bool,
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

#[derive(Debug)]
struct Inner {
    state: State,
    buckets: VecDeque<SecondBucket>,
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
            State::Open { until } => Instant::now() >= until,
            State::HalfOpen { trial_in_flight } => !trial_in_flight,
            State::Held => false,
        }
    }

    /// Seconds until a send could be let through: the `Retry-After` of `backend_unavailable`.
    pub fn retry_after(&self) -> Duration {
        match self.inner.lock().state {
            State::Open { until } => until.saturating_duration_since(Instant::now()),
            State::Held => self.policy.open_for,
            _ => Duration::from_secs(1),
        }
    }

    /// Let one send through, or say how long until one could be.
    pub fn try_acquire(self: &Arc<Self>) -> Result<Ticket, Duration> {
        let mut inner = self.inner.lock();
        let now = Instant::now();
        let trial = match inner.state {
            State::Closed => false,
            State::Open { until } if now < until => return Err(until - now),
            State::Held => return Err(self.policy.open_for),
            State::Open { .. } => {
                inner.state = State::HalfOpen {
                    trial_in_flight: true,
                };
                tracing::info!(
                    event = "breaker_half_open",
                    backend = self.name,
                    "circuit half-open: trying one send"
                );
                true
            }
            State::HalfOpen {
                trial_in_flight: true,
            } => return Err(Duration::from_secs(1)),
            State::HalfOpen {
                trial_in_flight: false,
            } => {
                inner.state = State::HalfOpen {
                    trial_in_flight: true,
                };
                true
            }
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
        // An operator's command while the trial ran decides, not the trial.
        if trial && !matches!(inner.state, State::HalfOpen { .. }) {
            return;
        }
        if trial {
            match outcome {
                Outcome::Success => {
                    inner.state = State::Closed;
                    inner.buckets.clear();
                    tracing::info!(
                        event = "breaker_closed",
                        backend = self.name,
                        "circuit closed: the trial send succeeded"
                    );
                }
                Outcome::Failure => self.open(&mut inner, now, "the trial send failed"),
                Outcome::Neutral => {
                    inner.state = State::HalfOpen {
                        trial_in_flight: false,
                    }
                }
            }
            return;
        }
        // A send admitted before the breaker opened says nothing new once it is open.
        if !matches!(inner.state, State::Closed) || outcome == Outcome::Neutral {
            return;
        }
        let window_start = now.checked_sub(self.policy.window);
        while let (Some(first), Some(start)) = (inner.buckets.front(), window_start) {
            if first.start + Duration::from_secs(1) > start {
                break;
            }
            inner.buckets.pop_front();
        }
        match inner.buckets.back_mut() {
            Some(slot) if now < slot.start + Duration::from_secs(1) => match outcome {
                Outcome::Success => slot.successes += 1,
                _ => slot.failures += 1,
            },
            _ => inner.buckets.push_back(SecondBucket {
                start: now,
                successes: u32::from(outcome == Outcome::Success),
                failures: u32::from(outcome == Outcome::Failure),
            }),
        }
        let (successes, failures) = inner.buckets.iter().fold((0u64, 0u64), |(s, f), slot| {
            (s + u64::from(slot.successes), f + u64::from(slot.failures))
        });
        let rate = failures as f64 / (successes + failures) as f64;
        if failures >= u64::from(self.policy.min_failures) && rate >= self.policy.failure_rate {
            self.open(&mut inner, now, "failure threshold reached");
        }
    }

    /// Times the breaker has opened (for `/metrics`).
    pub fn opened_total(&self) -> u64 {
        self.opened.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn open(&self, inner: &mut Inner, now: Instant, why: &'static str) {
        self.opened
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        inner.state = State::Open {
            until: now + self.policy.open_for,
        };
        inner.buckets.clear();
        tracing::warn!(
            event = "breaker_open",
            backend = self.name,
            open_for_s = self.policy.open_for.as_secs(),
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
}
