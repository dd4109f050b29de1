//! The retry policy: which answers are worth another attempt, how long to wait before it,
//! and a budget shared by every message so that a fleet of producers cannot storm a
//! gateway that is trying to recover.
//!
//! Everything here is pure: the time (`now`) and the randomness (`unit`, a number in
//! `[0, 1)`) are passed in, so tests drive both and the send loop in `mod.rs` supplies
//! tokio's clock (which tests can pause) and `rand`.

use std::collections::VecDeque;
use std::time::Duration;

use parking_lot::Mutex;
use sendgate_backoff::{Doubling, Jitter};
use tokio::time::Instant;

/// The longest `Retry-After` taken at its word. A larger value (a day, or a hostile
/// 10^18) is read as this, which is past any sensible deadline: the message then fails
/// at once instead of sleeping for ever or overflowing the clock.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 60 * 60);

/// Is an HTTP answer with this status worth another attempt with the same key?
///
/// Only `408` (the body did not arrive in time: nothing was sent), `429` (queue full), `503`
/// (capacity unknown, saturated, broker busy; a draining or starting gateway is a wait,
/// decided before this) and `504` (outcome unknown: the same `Idempotency-Key` makes the
/// retry safe). Everything else is final: `400`, `401`,
/// `403`, `404`, `409`, `413`, `415` would be refused again, and `502`
/// (`backend_auth_failed`, `send_failed`) is outside what the contract promises is
/// transient, so it is reported rather than repeated, unless its body says `outcome:
/// unknown` (the send loop's decision, from the body: see `Tries::judge`).
pub fn is_retryable_status(status: u16) -> bool {
    matches!(status, 408 | 429 | 503 | 504)
}

/// Capped exponential backoff with full jitter, and a per-message attempt cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The ceiling of the first retry's wait; it doubles with each further retry.
    pub base: Duration,
    /// The largest wait jitter may pick (a `Retry-After` may still ask for more).
    pub cap: Duration,
    /// Attempts per message, the first included (at least 1). The send loop does not count
    /// a `429 queue_full` with a `Retry-After` (the gateway pacing its producers at a full
    /// queue): the deadline and the retry budget bound those.
    pub max_attempts: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: Duration::from_millis(200),
            cap: Duration::from_secs(10),
            max_attempts: 5,
        }
    }
}

impl Backoff {
    /// The wait before the next attempt, after `attempts_made` attempts of one message
    /// failed in a retryable way; `None` when the attempt cap is reached.
    ///
    /// Full jitter (a uniform pick in `[0, min(cap, base·2^(n-1))]`) spreads the retries of
    /// many producers that failed together, instead of sending them back in waves. With a
    /// `Retry-After`, the gateway knows when its answer can change (a depth read expiring,
    /// the backlog draining), so its wait is honoured as is, never shortened, and the
    /// client's [`jitter`](Self::jitter) is added on top: the first retry's pick
    /// (`[0, min(cap, base)]`) on every attempt, so producers refused together, all told
    /// the same `Retry-After`, do not all come back in the same instant (which a wait of
    /// `max(Retry-After, pick)` did whenever the pick was the shorter). It does not grow
    /// with the attempts: the gateway's wait already says when to come back, and a growing
    /// pick on top sends the messages refused most often back last, past the moment the
    /// queue takes sends again, while a producer on a fresh message takes the room
    /// (bench comparison 7: Jain's index 0.74–0.87 over 16 producers).
    pub fn delay(
        &self,
        attempts_made: u32,
        retry_after: Option<Duration>,
        unit: f64,
    ) -> Option<Duration> {
        if attempts_made >= self.max_attempts.max(1) {
            return None;
        }
        Some(match retry_after {
            Some(floor) => floor.min(MAX_RETRY_AFTER) + self.jitter(unit),
            None => self.doubling().wait(attempts_made, unit),
        })
    }

    /// The client's small jitter on a wait it did not choose (a `Retry-After`, an
    /// unreachable gateway): a uniform pick in `[0, min(cap, base)]`, the first retry's,
    /// so the sends told the same wait do not all come back in the same instant.
    pub fn jitter(&self, unit: f64) -> Duration {
        self.doubling().wait(1, unit)
    }

    /// The shared policy with this client's numbers: `base` doubling up to `cap`, full jitter.
    fn doubling(&self) -> Doubling {
        Doubling::new(self.base, self.cap).with_jitter(Jitter::Full)
    }
}

/// The retry budget's knobs, after Finagle's `RetryBudget` and linkerd's `retry_budget`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetConfig {
    /// Tokens a first attempt deposits; a retry withdraws one. 0.2 keeps retries at about
    /// a fifth of first attempts once the reserve is spent.
    pub ratio: f64,
    /// Retries allowed per second whatever the traffic, so a producer that sends little
    /// can still retry (linkerd's `min_retries_per_second`).
    pub min_per_second: f64,
    /// How long a deposit counts. Tokens expire so that a long healthy run does not bank
    /// enough credit to flood the gateway when it later fails.
    pub window: Duration,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        Self {
            ratio: 0.2,
            min_per_second: 1.0,
            window: Duration::from_secs(10),
        }
    }
}

/// A retry budget shared by every message of one client: a token bucket whose tokens
/// expire after the window. Within any window, retries ≤ `ratio` × first attempts +
/// `min_per_second` × window. Thread-safe; the lock is held for a few additions only.
///
/// Tokens are counted in thousandths as integers, so a thousand deposits of 0.2 make
/// exactly 200 retries, not 199 after rounding errors.
#[derive(Debug)]
pub struct RetryBudget {
    config: BudgetConfig,
    deposit_milli: i64,
    reserve_milli: i64,
    slice: Duration,
    /// Net tokens per slice of the window (deposits minus withdrawals), oldest first.
    slices: Mutex<VecDeque<(Instant, i64)>>,
}

/// The window is kept as this many slices: a token expires at most one slice late.
const SLICES: u32 = 10;
const ONE_TOKEN: i64 = 1000;

fn milli(tokens: f64) -> i64 {
    if tokens.is_finite() && tokens > 0.0 {
        (tokens * ONE_TOKEN as f64)
            .round()
            .min(i64::MAX as f64 / 4.0) as i64
    } else {
        0
    }
}

impl RetryBudget {
    pub fn new(config: BudgetConfig) -> Self {
        Self {
            deposit_milli: milli(config.ratio),
            reserve_milli: milli(config.min_per_second * config.window.as_secs_f64()),
            slice: (config.window / SLICES).max(Duration::from_millis(1)),
            config,
            slices: Mutex::new(VecDeque::with_capacity(SLICES as usize + 1)),
        }
    }

    pub fn config(&self) -> BudgetConfig {
        self.config
    }

    /// A first attempt was made: it earns `ratio` tokens for retries.
    pub fn deposit(&self, now: Instant) {
        let mut slices = self.slices.lock();
        self.expire(&mut slices, now);
        self.add(&mut slices, now, self.deposit_milli);
    }

    /// Take one token for a retry; `false` (and nothing taken) when the budget is spent.
    pub fn try_withdraw(&self, now: Instant) -> bool {
        let mut slices = self.slices.lock();
        self.expire(&mut slices, now);
        if self.milli_balance(&slices) < ONE_TOKEN {
            return false;
        }
        self.add(&mut slices, now, -ONE_TOKEN);
        true
    }

    /// Tokens available now (for tests and the CLI's summary).
    pub fn balance(&self, now: Instant) -> f64 {
        let mut slices = self.slices.lock();
        self.expire(&mut slices, now);
        self.milli_balance(&slices) as f64 / ONE_TOKEN as f64
    }

    fn milli_balance(&self, slices: &VecDeque<(Instant, i64)>) -> i64 {
        self.reserve_milli.saturating_add(
            slices
                .iter()
                .map(|(_, t)| *t)
                .fold(0i64, i64::saturating_add),
        )
    }

    fn add(&self, slices: &mut VecDeque<(Instant, i64)>, now: Instant, tokens: i64) {
        match slices.back_mut() {
            Some((start, total)) if now.saturating_duration_since(*start) < self.slice => {
                *total = total.saturating_add(tokens)
            }
            _ => slices.push_back((now, tokens)),
        }
    }

    fn expire(&self, slices: &mut VecDeque<(Instant, i64)>, now: Instant) {
        while let Some((start, _)) = slices.front() {
            if now.saturating_duration_since(*start) >= self.config.window {
                slices.pop_front();
            } else {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_408_429_503_and_504_are_retried() {
        for s in [408, 429, 503, 504] {
            assert!(is_retryable_status(s), "{s}");
        }
        for s in [200, 201, 400, 401, 403, 404, 405, 409, 413, 415, 500, 502] {
            assert!(!is_retryable_status(s), "{s}");
        }
    }

    #[test]
    fn full_jitter_stays_under_a_doubling_capped_ceiling() {
        let b = Backoff {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(1),
            max_attempts: 10,
        };
        // The top of the range: unit just under 1.
        let top = |n| b.delay(n, None, 0.999_999).unwrap();
        assert!(top(1) <= Duration::from_millis(100) && top(1) > Duration::from_millis(99));
        assert!(top(2) <= Duration::from_millis(200) && top(2) > Duration::from_millis(199));
        assert!(top(3) <= Duration::from_millis(400));
        assert!(top(5) <= Duration::from_secs(1) && top(5) > Duration::from_millis(999));
        assert!(top(9) <= Duration::from_secs(1), "capped");
        // The bottom: full jitter may retry at once.
        assert_eq!(b.delay(3, None, 0.0), Some(Duration::ZERO));
        assert_eq!(b.delay(3, None, 0.5), Some(Duration::from_millis(200)));
        // Garbage from the rng never panics.
        assert_eq!(b.delay(3, None, f64::NAN), Some(Duration::ZERO));
        assert_eq!(b.delay(3, None, 7.0), Some(Duration::from_millis(400)));
    }

    #[test]
    fn retry_after_is_honoured_as_is_with_the_jitter_on_top() {
        let b = Backoff::default();
        // First retry: the jitter's ceiling is 200 ms, added to the 30 s asked for.
        for (unit, expected) in [(0.0, 30_000), (0.5, 30_100), (0.99, 30_198)] {
            let d = b.delay(1, Some(Duration::from_secs(30)), unit).unwrap();
            assert_eq!(d, Duration::from_millis(expected), "{unit}");
        }
        // A 1 s Retry-After: never sooner, and the jitter spreads it upwards only.
        assert_eq!(
            b.delay(1, Some(Duration::from_secs(1)), 0.0),
            Some(Duration::from_secs(1))
        );
        // The jitter is the first retry's on every attempt: it does not grow.
        assert_eq!(
            b.delay(3, Some(Duration::from_secs(1)), 0.5),
            Some(Duration::from_millis(1100))
        );
        assert_eq!(
            b.delay(4, Some(Duration::from_secs(1)), 0.99),
            Some(Duration::from_millis(1198))
        );
        // An absurd one is bounded.
        let d = b
            .delay(1, Some(Duration::from_secs(u64::MAX)), 0.0)
            .unwrap();
        assert_eq!(d, MAX_RETRY_AFTER);
    }

    #[test]
    fn the_attempt_cap_counts_the_first_attempt() {
        let b = Backoff {
            max_attempts: 3,
            ..Backoff::default()
        };
        assert!(b.delay(1, None, 0.5).is_some());
        assert!(b.delay(2, None, 0.5).is_some());
        assert_eq!(
            b.delay(3, None, 0.5),
            None,
            "three attempts made: no fourth"
        );
        let once = Backoff {
            max_attempts: 0,
            ..Backoff::default()
        };
        assert_eq!(once.delay(1, None, 0.5), None, "0 means 1: never retry");
    }

    #[tokio::test(start_paused = true)]
    async fn a_spent_budget_holds_retries_to_a_fifth_of_first_attempts() {
        let budget = RetryBudget::new(BudgetConfig::default());
        let now = Instant::now();
        // A thousand first attempts fail at once: 0.2 × 1000 + the reserve (1/s × 10 s).
        for _ in 0..1000 {
            budget.deposit(now);
        }
        let granted = (0..1000).filter(|_| budget.try_withdraw(now)).count();
        assert_eq!(granted, 210);
        assert!(budget.balance(now) < 1.0);

        // Steady failure afterwards: 500 more first attempts over the next 10 s earn 100
        // retries, and the reserve comes back as the old withdrawals expire.
        let mut firsts = 0;
        let mut retries = 0;
        for step in 1..=500u32 {
            let t = now + Duration::from_millis(20) * step;
            budget.deposit(t);
            firsts += 1;
            while budget.try_withdraw(t) {
                retries += 1;
            }
        }
        assert_eq!(firsts, 500);
        assert!(
            retries <= 100 + 10,
            "retries {retries} must stay near 20% of first attempts"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_reserve_lets_a_quiet_producer_retry() {
        let budget = RetryBudget::new(BudgetConfig::default());
        let now = Instant::now();
        budget.deposit(now);
        // One message, five retries: well within the 10-token reserve.
        assert!((0..5).all(|_| budget.try_withdraw(now)));
        // Spend the rest; then, a window later, the withdrawals have expired.
        while budget.try_withdraw(now) {}
        assert!(!budget.try_withdraw(now + Duration::from_secs(5)));
        assert!(budget.try_withdraw(now + Duration::from_secs(11)));
    }
}
