//! The retry policy: which answers are worth another attempt, how long to wait before it,
//! and a budget shared by every message so that a fleet of producers cannot storm a
//! gateway that is trying to recover.
//!
//! Everything here is pure: the randomness (`unit`, a number in `[0, 1)`) is passed in, so
//! tests drive it and the send loop supplies `rand`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use sendgate_backoff::{Doubling, Jitter};

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
    /// Attempts per message, the first included (at least 1), whatever their answers.
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

/// What a retry is paying for: the gateway pacing its producers, or a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryKind {
    /// A `429`, or a `503` with a `Retry-After`: the gateway answered, knows it is
    /// overloaded and said when to come back. Cheap: the retry lands when it was asked to.
    Throttled,
    /// A `504`, a `408`, a `502` whose outcome is unknown, a `503` without a `Retry-After`,
    /// or no answer once the request was sent: something failed and nobody said when it
    /// will work again.
    Transient,
}

impl RetryKind {
    /// The kind of a retryable answer with this status and `Retry-After`.
    pub fn of(status: u16, retry_after: Option<Duration>) -> Self {
        match (status, retry_after) {
            (429 | 503, Some(_)) => Self::Throttled,
            _ => Self::Transient,
        }
    }
}

/// The retry budget's knobs, after the AWS SDKs' retry quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetConfig {
    /// Tokens the budget holds when full (and starts with). 0 never retries.
    pub capacity: u32,
    /// Tokens a [`RetryKind::Throttled`] retry takes.
    pub throttled_cost: u32,
    /// Tokens a [`RetryKind::Transient`] retry takes.
    pub transient_cost: u32,
    /// Tokens a message (or batch request) queued on its first attempt gives back.
    pub success_refund: u32,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        Self {
            capacity: 500,
            throttled_cost: 5,
            transient_cost: 10,
            success_refund: 1,
        }
    }
}

impl BudgetConfig {
    /// What a retry of `kind` takes.
    pub fn cost(&self, kind: RetryKind) -> u32 {
        match kind {
            RetryKind::Throttled => self.throttled_cost,
            RetryKind::Transient => self.transient_cost,
        }
    }
}

/// The retry budget shared by every message (and every clone) of one client: a bucket of
/// tokens that only answers refill. A retry takes its cost, and gives it back if it queues
/// the message; a message queued at its first attempt gives back `success_refund`.
///
/// So tokens are lost only by retries that fail again, and earned only by messages that
/// get in: the retries that keep failing are bounded by what gets through. With the
/// defaults, once the first 500 tokens are spent, a refused retry (5) must be paid for by
/// five clean successes, which holds a client's retries to about a fifth of what gets in
/// at the first attempt (the AWS SDKs' sustained amplification of about 1.2). Time alone
/// refills nothing: a gateway that refuses everything is not retried into.
#[derive(Debug)]
pub struct RetryBudget {
    config: BudgetConfig,
    tokens: AtomicU32,
}

impl RetryBudget {
    /// A full budget.
    pub fn new(config: BudgetConfig) -> Self {
        Self {
            tokens: AtomicU32::new(config.capacity),
            config,
        }
    }

    pub fn config(&self) -> BudgetConfig {
        self.config
    }

    /// Take what a retry of `kind` costs: the tokens taken (to give back if it queues the
    /// message), or `None`, and nothing taken, when the budget holds less.
    pub fn try_withdraw(&self, kind: RetryKind) -> Option<u32> {
        let cost = self.config.cost(kind);
        self.tokens
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| t.checked_sub(cost))
            .ok()
            .map(|_| cost)
    }

    /// Give back `tokens`, never past the capacity.
    pub fn refund(&self, tokens: u32) {
        let capacity = self.config.capacity;
        let _ = self
            .tokens
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                Some(t.saturating_add(tokens).min(capacity))
            });
    }

    /// A message (or batch request) queued at its first attempt.
    pub fn refund_clean_success(&self) {
        self.refund(self.config.success_refund);
    }

    /// Tokens held now.
    pub fn balance(&self) -> u32 {
        self.tokens.load(Ordering::Acquire)
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

    #[test]
    fn a_throttled_retry_costs_less_than_a_transient_one() {
        let one_second = Some(Duration::from_secs(1));
        assert_eq!(RetryKind::of(429, one_second), RetryKind::Throttled);
        assert_eq!(RetryKind::of(503, one_second), RetryKind::Throttled);
        for (status, retry_after) in [(429, None), (503, None), (504, None), (408, one_second)] {
            assert_eq!(
                RetryKind::of(status, retry_after),
                RetryKind::Transient,
                "{status} {retry_after:?}"
            );
        }
        let budget = RetryBudget::new(BudgetConfig::default());
        assert_eq!(budget.balance(), 500, "a new budget is full");
        assert_eq!(budget.try_withdraw(RetryKind::Throttled), Some(5));
        assert_eq!(budget.try_withdraw(RetryKind::Transient), Some(10));
        assert_eq!(budget.balance(), 485);
    }

    #[test]
    fn a_successful_retry_gives_its_cost_back_and_a_clean_success_one_token() {
        let budget = RetryBudget::new(BudgetConfig {
            capacity: 20,
            ..BudgetConfig::default()
        });
        let cost = budget.try_withdraw(RetryKind::Transient).unwrap();
        assert_eq!(budget.balance(), 10);
        budget.refund(cost);
        assert_eq!(
            budget.balance(),
            20,
            "the retry queued the message: all of it back"
        );
        budget.try_withdraw(RetryKind::Throttled);
        budget.refund_clean_success();
        assert_eq!(budget.balance(), 16);
        // Never past the capacity, however many successes.
        for _ in 0..100 {
            budget.refund_clean_success();
        }
        budget.refund(u32::MAX);
        assert_eq!(budget.balance(), 20);
    }

    #[test]
    fn an_empty_budget_grants_nothing_and_takes_nothing_until_a_success_refills_it() {
        let budget = RetryBudget::new(BudgetConfig {
            capacity: 12,
            ..BudgetConfig::default()
        });
        assert_eq!(budget.try_withdraw(RetryKind::Transient), Some(10));
        assert_eq!(budget.try_withdraw(RetryKind::Transient), None, "2 left");
        assert_eq!(budget.try_withdraw(RetryKind::Throttled), None, "2 left");
        assert_eq!(budget.balance(), 2, "a refusal takes nothing");
        for _ in 0..3 {
            budget.refund_clean_success();
        }
        assert_eq!(budget.try_withdraw(RetryKind::Throttled), Some(5));
        assert_eq!(budget.balance(), 0);
        let never = RetryBudget::new(BudgetConfig {
            capacity: 0,
            ..BudgetConfig::default()
        });
        assert_eq!(never.try_withdraw(RetryKind::Throttled), None);
    }
}
