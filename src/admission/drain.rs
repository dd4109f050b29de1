//! How fast consumers take a queue's messages, estimated from successive depth reads, and
//! the base of what a `429 queue_full` answers from it: the time to the resume level
//! (`pacing.rs` spreads the refused producers from there).
//!
//! Between two reads of one queue the consumers took
//!
//! ```text
//! drained = (backlog read before + sends stored since it) − (backlog read now + sends stored since it)
//! ```
//!
//! i.e. the previous read's estimate minus the new one's, both taken when the new read
//! lands: the sends stored between the two reads appear on both sides and cancel, so a burst
//! of admissions is never mistaken for drain.
//!
//! What is measured is the consumers' speed while they have work, the figure a refused
//! producer's wait depends on; two kinds of pair show something else:
//!
//! - **Idle**: the pair starts at an empty queue. It shows there was nothing to take, not
//!   "no drain": never a sample (an idle spell would decay the rate to nothing).
//! - **Emptied**: the new read finds the queue empty. The consumers took what there was,
//!   which says how much there was, not how fast they go (at half the drain rate of demand
//!   every such pair reads half). Once a rate exists it is no sample; before, it is kept as
//!   the first, a lower bound (the longer `Retry-After`: the safe side).
//!
//! The admin plane may trail the data plane (RabbitMQ's management statistics are emitted
//! every few seconds): one read then shows no change and a later one a jump, so one pair's
//! figure can be negative, or too big. Pairs are therefore summed (signed: their errors
//! telescope away) until they cover a span — [`EXACT_SPAN`] for an exact admin plane,
//! [`LAGGING_SPAN`] or the lag, if longer, for one that trails — and the sum over the span,
//! negative taken as no drain, is one sample. Samples are folded into an exponentially
//! weighted average with the short time constant [`SMOOTHING`]: the span already averages
//! out a lagging plane's steps, and the rate must follow the consumers within seconds (a
//! capacity drop, a storm after a quiet spell), not the half minute a long average needs.
//! A consumer that stops decays the rate to [`STOPPED`], never to "not measured": the
//! answer then is the longest wait, not the time to the next read.

use std::time::Duration;

use crate::config::Fraction;

/// The span one rate sample covers with an exact admin plane (no lag): a TTL's read or
/// more.
pub const EXACT_SPAN: Duration = Duration::from_secs(1);

/// The shortest span with a lagging admin plane: RabbitMQ's default statistics interval
/// (5 s), so a lagging count's "no change, then a jump" falls within one sample as a rule.
pub const LAGGING_SPAN: Duration = Duration::from_secs(5);

/// The smoothing time constant: a sample spanning `t` moves the rate by
/// `1 − e^(−t / SMOOTHING)` of its difference (1 s: 39 %; 5 s: 92 %), so a steady drain
/// is read within 10 % after four 1 s samples of it, whatever came before.
pub const SMOOTHING: Duration = Duration::from_secs(2);

/// The rate a stopped consumer decays to (messages per second): measured, nothing drains.
/// Above 0, so a long stall is never mistaken for "not measured" (whose answer is the time
/// to the next read), and small enough that any backlog waits the longest `Retry-After`.
pub const STOPPED: f64 = 1e-9;

/// A measured drain rate, messages per second: finite and above 0 by construction (so
/// equality is an equivalence).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct DrainRate(f64);

impl Eq for DrainRate {}

impl DrainRate {
    pub fn per_second(self) -> f64 {
        self.0
    }

    /// Rounded to a thousandth, for bodies meant to be read by people and tools.
    pub fn rounded(self) -> f64 {
        (self.0 * 1000.0).round() / 1000.0
    }

    /// A rate as if measured, for the tests of what is built on one (the header).
    #[cfg(test)]
    pub(crate) fn measured(per_second: f64) -> Self {
        assert!(per_second.is_finite() && per_second > 0.0);
        Self(per_second)
    }
}

/// One pair of successive good reads of a queue, as [`DrainEstimator::record`] takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pair {
    /// The older read's estimate as of the newer one: its backlog plus every send stored
    /// since it.
    pub before: u64,
    /// The newer read's estimate: its backlog plus the sends stored since it.
    pub after: u64,
    /// The backlog the newer read showed (0: the queue emptied).
    pub read: u64,
    /// The time between the two reads.
    pub over: Duration,
}

/// One queue's drain rate, from the reads as they come.
#[derive(Debug, Clone)]
pub struct DrainEstimator {
    span: Duration,
    /// Drained messages (signed) and time summed since the last sample.
    pending: i128,
    pending_for: Duration,
    /// The smoothed rate; `None` until the first sample.
    rate: Option<f64>,
}

impl DrainEstimator {
    /// `lag`: how far the backend's admin plane may trail (a sample covers at least that).
    pub fn new(lag: Duration) -> Self {
        let span = if lag.is_zero() {
            EXACT_SPAN
        } else {
            LAGGING_SPAN.max(lag)
        };
        Self {
            span,
            pending: 0,
            pending_for: Duration::ZERO,
            rate: None,
        }
    }

    /// One pair of successive reads (see the module's header for which are samples).
    pub fn record(&mut self, pair: Pair) {
        let idle = pair.before == 0;
        let emptied = pair.read == 0 && self.rate.is_some_and(|r| r > 0.0);
        if idle || emptied {
            self.break_chain();
            return;
        }
        self.pending += i128::from(pair.before) - i128::from(pair.after);
        self.pending_for += pair.over;
        if self.pending_for < self.span {
            return;
        }
        let secs = self.pending_for.as_secs_f64();
        // A negative sum is a backlog that grew beyond what was counted (another producer
        // beside the gateway, or counts still catching up): no drain, never a negative one.
        let sample = self.pending.max(0) as f64 / secs;
        let weight = 1.0 - (-secs / SMOOTHING.as_secs_f64()).exp();
        self.rate = Some(match self.rate {
            Some(rate) if rate > 0.0 => (rate + weight * (sample - rate)).max(STOPPED),
            // Samples of 0 alone are no drain observed (nobody has consumed yet).
            _ => sample,
        });
        self.pending = 0;
        self.pending_for = Duration::ZERO;
    }

    /// Forget the pending pair sums (the reads they came from are not comparable with the
    /// next one, e.g. after a spell in the fleet); the smoothed rate stays.
    pub fn break_chain(&mut self) {
        self.pending = 0;
        self.pending_for = Duration::ZERO;
    }

    /// The rate, once drain has been observed.
    pub fn rate(&self) -> Option<DrainRate> {
        self.rate
            .filter(|r| r.is_finite() && *r > 0.0)
            .map(DrainRate)
    }
}

/// The backlog at or below which a queue refusing at its ceiling admits again: the
/// fraction of the ceiling (`SENDGATE_RESUME_BELOW`), and never more than one under it.
pub fn resume_at(limit: u64, resume_below: Fraction) -> u64 {
    let level = (limit as f64 * resume_below.get()).floor() as u64;
    level.min(limit.saturating_sub(1))
}

/// The base of a `429 queue_full`'s `Retry-After`: the time the measured drain needs to
/// take the backlog down to `resume` (never sooner than the next read, which is the first
/// moment the gate can see it), within `[1 s, max]`; with no drain measured, the time until
/// the next read (at most `max`). Not rounded: `pacing.rs` adds the wait of the producers
/// refused before, and the header rounds the sum.
pub fn retry_after(
    backlog: u64,
    resume: u64,
    rate: Option<DrainRate>,
    until_next_read: Duration,
    max: Duration,
) -> Duration {
    let one = Duration::from_secs(1);
    let max = max.max(one);
    let Some(rate) = rate else {
        return until_next_read.min(max);
    };
    let need = backlog.saturating_sub(resume) as f64 / rate.per_second();
    Duration::try_from_secs_f64(need)
        .unwrap_or(max)
        .max(until_next_read)
        .clamp(one, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// A pair that ends with the queue holding `after` as read (no sends counted since).
    fn pair(before: u64, after: u64, over: Duration) -> Pair {
        Pair {
            before,
            after,
            read: after,
            over,
        }
    }

    fn rate(e: &DrainEstimator) -> f64 {
        e.rate().expect("a rate").per_second()
    }

    #[test]
    fn an_exact_plane_samples_each_read_a_lagging_one_only_over_a_full_span() {
        let mut exact = DrainEstimator::new(Duration::ZERO);
        exact.record(pair(100, 90, secs(1)));
        assert_eq!(exact.rate().map(DrainRate::per_second), Some(10.0));

        let mut lagging = DrainEstimator::new(secs(1));
        for _ in 0..4 {
            lagging.record(pair(100, 90, secs(1)));
            assert_eq!(lagging.rate(), None, "one read does not make a rate");
        }
        lagging.record(pair(100, 90, secs(1)));
        assert_eq!(lagging.rate().map(DrainRate::per_second), Some(10.0));
    }

    #[test]
    fn a_negative_span_is_no_drain() {
        let mut e = DrainEstimator::new(Duration::ZERO);
        e.record(pair(100, 50, secs(5))); // 10/s
        e.record(pair(50, 100, secs(5))); // grew: a sample of 0, not negative
        let weight = 1.0 - (-5.0f64 / SMOOTHING.as_secs_f64()).exp();
        assert!((rate(&e) - 10.0 * (1.0 - weight)).abs() < 1e-9);
    }

    #[test]
    fn a_lag_longer_than_the_minimum_widens_the_span() {
        let mut e = DrainEstimator::new(secs(8));
        e.record(pair(10, 0, secs(5)));
        assert_eq!(e.rate(), None);
        e.record(pair(10, 10, secs(3)));
        assert_eq!(e.rate().map(DrainRate::per_second), Some(1.25));
    }

    /// Issue 39: the rate read 68–73/s against a true 100/s through a storm that followed a
    /// quiet spell. At half the drain of demand every read found the queue emptied (each
    /// pair a "lower bound" of 50/s), and a 30 s average then took half a minute to leave
    /// it. Emptied pairs are no samples once a rate exists, and the average is short: four
    /// seconds of busy draining are read within 10 %.
    #[test]
    fn a_steady_drain_after_a_quiet_spell_is_read_within_a_tenth_in_five_seconds() {
        let mut e = DrainEstimator::new(Duration::ZERO);
        // 30 s at 50 sends a second, every one taken before the next read.
        for _ in 0..30 {
            e.record(Pair {
                before: 50,
                after: 0,
                read: 0,
                over: secs(1),
            });
        }
        assert_eq!(rate(&e), 50.0, "the first emptied pair: a lower bound");
        // Then 5× the drain: the queue stays at its ceiling of 200, 100 taken a second.
        for _ in 0..4 {
            e.record(Pair {
                before: 300,
                after: 200,
                read: 200,
                over: secs(1),
            });
        }
        assert!((90.0..=110.0).contains(&rate(&e)), "{}", rate(&e));
    }

    /// Issue 39: the consumers' capacity halves (a worker lost) while the queue stays full;
    /// the rate follows within about five seconds.
    #[test]
    fn a_halved_drain_is_tracked_within_five_seconds() {
        let mut e = DrainEstimator::new(Duration::ZERO);
        for _ in 0..60 {
            e.record(pair(300, 200, secs(1)));
        }
        assert_eq!(rate(&e), 100.0);
        for _ in 0..5 {
            e.record(pair(250, 200, secs(1)));
        }
        assert!((45.0..=55.0).contains(&rate(&e)), "{}", rate(&e));
    }

    /// An emptied pair, once a rate exists, leaves it (and the pending span) as it was: the
    /// consumers took what there was.
    #[test]
    fn an_emptied_pair_is_no_sample_once_a_rate_exists() {
        let mut e = DrainEstimator::new(secs(1)); // a lagging plane: 5 s spans
        for _ in 0..5 {
            e.record(pair(300, 200, secs(1)));
        }
        assert_eq!(rate(&e), 100.0);
        for _ in 0..4 {
            e.record(pair(300, 200, secs(1)));
        }
        e.record(pair(20, 0, secs(1)));
        assert_eq!(rate(&e), 100.0, "emptied: no sample");
        for _ in 0..4 {
            e.record(pair(300, 250, secs(1)));
        }
        assert_eq!(
            rate(&e),
            100.0,
            "the span began again after the emptied pair"
        );
        e.record(pair(300, 250, secs(1)));
        assert!(rate(&e) < 60.0, "a full span of 50/s: {}", rate(&e));
    }

    /// Review 15: a span in which the queue stayed empty shows how much there was to take,
    /// not how fast consumers take: idle consumers at an empty queue are not "no drain".
    /// Were such spans samples of 0, after an idle spell the rate would have decayed to
    /// next to nothing and the first refusals of a burst would ask for
    /// `SENDGATE_RETRY_AFTER_MAX_S` although the consumers take the backlog in seconds.
    #[test]
    fn spans_at_an_empty_queue_are_not_samples_of_zero_drain() {
        let mut e = DrainEstimator::new(Duration::ZERO);
        // Consumers took 10/s for 30 s...
        for _ in 0..6 {
            e.record(pair(100, 50, secs(5)));
        }
        // ...then the queue sat empty for 5 minutes (nothing to take)...
        for _ in 0..60 {
            e.record(pair(0, 0, secs(5)));
        }
        // ...and a burst filled it: the first refusal (ceiling 1000, resume 0.5) should
        // still see consumers that take about 10/s, i.e. about 50 s, not the 300 s maximum.
        let wait = retry_after(1000, 500, e.rate(), Duration::ZERO, secs(300));
        assert!(
            wait <= secs(120),
            "rate after an idle spell: {:?}, Retry-After {wait:?}",
            e.rate()
        );
    }

    /// Review 15: a consumer that stopped leaves the queue full and every sample 0. The
    /// smoothed rate decays towards 0 and `Retry-After` must stay at the maximum however
    /// long the stall: were the rate ever to reach exactly 0.0, `rate()` would turn `None`
    /// and the answer drop to "until the next read" (1 s). The decay stops at [`STOPPED`].
    #[test]
    fn a_consumer_stopped_for_hours_is_never_answered_with_one_second() {
        let mut e = DrainEstimator::new(Duration::ZERO);
        e.record(pair(200, 100, secs(5))); // 20/s, then the consumer dies
                                           // One hour in, the answer is the maximum...
        for _ in 0..720 {
            e.record(pair(100, 100, secs(5)));
        }
        assert_eq!(
            retry_after(100, 50, e.rate(), secs(1), secs(300)),
            secs(300)
        );
        // ...and must stay so while nothing is taken (here up to ~7 h).
        let mut worst = Duration::MAX;
        for _ in 0..4_300 {
            e.record(pair(100, 100, secs(5)));
            let wait = retry_after(100, 50, e.rate(), secs(1), secs(300));
            worst = worst.min(wait);
        }
        assert!(
            worst >= secs(300),
            "after a long stall Retry-After fell to {worst:?} (rate {:?})",
            e.rate()
        );
        assert_eq!(rate(&e), STOPPED);
    }

    #[test]
    fn samples_of_nothing_alone_are_no_drain_observed() {
        let mut e = DrainEstimator::new(Duration::ZERO);
        for _ in 0..5 {
            e.record(pair(50, 50, secs(1)));
        }
        assert_eq!(e.rate(), None);
        e.record(pair(60, 50, secs(1)));
        assert_eq!(e.rate().map(DrainRate::per_second), Some(10.0));
    }

    #[test]
    fn the_resume_level_is_the_fraction_and_at_most_one_under_the_ceiling() {
        let f = |x| Fraction::new(x).unwrap();
        assert_eq!(resume_at(100, f(1.0)), 99);
        assert_eq!(resume_at(100, f(0.8)), 80);
        assert_eq!(resume_at(1, f(1.0)), 0);
        assert_eq!(resume_at(7, f(0.5)), 3);
    }

    #[test]
    fn retry_after_is_the_time_to_drain_within_bounds() {
        let r = |x| Some(DrainRate(x));
        let max = secs(300);
        assert_eq!(retry_after(120, 99, r(3.0), Duration::ZERO, max), secs(7));
        assert_eq!(
            retry_after(130, 99, r(2.0), Duration::ZERO, max),
            Duration::from_millis(15_500),
            "not rounded: the header rounds what pacing adds to it"
        );
        assert_eq!(
            retry_after(120, 99, None, Duration::from_millis(700), max),
            Duration::from_millis(700),
            "no drain measured: until the next read"
        );
        assert_eq!(
            retry_after(1_000_000, 0, r(0.001), Duration::ZERO, max),
            max
        );
        assert_eq!(
            retry_after(u64::MAX, 0, r(STOPPED), Duration::ZERO, max),
            max
        );
        assert_eq!(
            retry_after(100, 99, r(1000.0), Duration::ZERO, max),
            secs(1)
        );
        assert_eq!(
            retry_after(100, 99, r(1000.0), secs(2), max),
            secs(2),
            "never before the next read"
        );
    }
}
