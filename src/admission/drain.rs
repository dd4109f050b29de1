//! How fast consumers take a queue's messages, estimated from successive depth reads, and
//! what a `429 queue_full` answers from it: `Retry-After` and the resume level.
//!
//! Between two reads of one queue the consumers took
//!
//! ```text
//! drained = (backlog read before + sends stored since it) − (backlog read now + sends stored since it)
//! ```
//!
//! i.e. the previous read's estimate minus the new one's, both taken when the new read
//! lands: the sends stored between the two reads appear on both sides and cancel, so a burst
//! of admissions is never mistaken for drain. The admin plane may trail the data plane
//! (RabbitMQ's management statistics are emitted every few seconds): one read then shows
//! no change and a later one a jump, so one pair's figure can be negative, or too big.
//! Pairs are therefore summed (signed: their errors telescope away) until they cover at least
//! [`MIN_SPAN`] (or the backend's lag, if longer); the sum over that span, negative taken as
//! no drain, is one sample, folded into an exponentially weighted average over time with
//! time constant [`SMOOTHING`], so no one sample moves the rate by more than its share of
//! that window.

use std::time::Duration;

use crate::config::Fraction;

/// Shortest span one rate sample covers: RabbitMQ's default statistics interval (5 s), so
/// a lagging count's "no change, then a jump" falls within one sample as a rule.
pub const MIN_SPAN: Duration = Duration::from_secs(5);

/// The smoothing window: a sample spanning `t` moves the rate by `1 − e^(−t / SMOOTHING)`
/// of its difference (a 5 s sample: 15 %).
pub const SMOOTHING: Duration = Duration::from_secs(30);

/// `Retry-After` is spread by ±this share, so a fleet of producers refused together does
/// not come back together.
pub const JITTER: f64 = 0.1;

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
        Self {
            span: MIN_SPAN.max(lag),
            pending: 0,
            pending_for: Duration::ZERO,
            rate: None,
        }
    }

    /// One pair of successive reads: the estimate before the new read minus the one after
    /// it (`before`, `after`: backlog plus the sends counted on top), `over` the time
    /// between the two reads.
    pub fn record(&mut self, before: u64, after: u64, over: Duration) {
        if before == 0 {
            // A queue that was empty shows how much there was to take, not how fast
            // consumers take: idle consumers at an empty queue are not "no drain" (an idle
            // spell would decay the rate to nothing, and the first refusals of the next burst
            // would ask for the maximum). Such pairs are no samples. (A pair that ends empty
            // is kept: what it took is a lower bound of the rate, the safe side.)
            self.break_chain();
            return;
        }
        self.pending += i128::from(before) - i128::from(after);
        self.pending_for += over;
        if self.pending_for < self.span {
            return;
        }
        let secs = self.pending_for.as_secs_f64();
        // A negative sum is a backlog that grew beyond what was counted (another producer
        // beside the gateway, or counts still catching up): no drain, never a negative one.
        let sample = self.pending.max(0) as f64 / secs;
        let weight = 1.0 - (-secs / SMOOTHING.as_secs_f64()).exp();
        self.rate = Some(match self.rate {
            None => sample,
            Some(rate) => rate + weight * (sample - rate),
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

/// `Retry-After` of a `429 queue_full`: the time the measured drain needs to take the
/// backlog down to `resume` (never sooner than the next read, which is the first moment the
/// gate can see it), within `[1 s, max]`, spread by ±[`JITTER`] (`unit`: uniform in
/// `[0, 1)`) and never below 1 s. With no drain measured, the time until the next read.
pub fn retry_after(
    backlog: u64,
    resume: u64,
    rate: Option<DrainRate>,
    until_next_read: Duration,
    max: Duration,
    unit: f64,
) -> Duration {
    let one = Duration::from_secs(1);
    let max = max.max(one);
    let Some(rate) = rate else {
        return until_next_read.min(max);
    };
    let need = backlog.saturating_sub(resume) as f64 / rate.per_second();
    let base = Duration::try_from_secs_f64(need)
        .unwrap_or(max)
        .max(until_next_read)
        .clamp(one, max);
    // The header has whole seconds: the spread is drawn in whole seconds too, uniformly in
    // [-k, +k] with k = 10 % of the estimate rounded, so it goes both ways around it
    // (jittering a fraction and rounding up would only ever add). Under 5 s, k is 0: a
    // second either way would be more than 10 %.
    let whole = base.as_secs_f64().round().max(1.0) as u64;
    let k = (whole as f64 * JITTER).round() as u64;
    let choices = 2 * k + 1;
    let pick = ((unit.clamp(0.0, 1.0) * choices as f64) as u64).min(choices - 1);
    let jittered = (whole + pick).saturating_sub(k);
    Duration::from_secs(jittered).clamp(one, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn no_rate_before_a_full_span_then_the_first_sample() {
        let mut e = DrainEstimator::new(Duration::ZERO);
        for _ in 0..4 {
            e.record(100, 90, secs(1));
            assert_eq!(e.rate(), None, "one read does not make a rate");
        }
        e.record(100, 90, secs(1));
        assert_eq!(e.rate().map(DrainRate::per_second), Some(10.0));
    }

    #[test]
    fn a_negative_span_is_no_drain_and_a_spike_moves_the_rate_by_its_weight_only() {
        let mut e = DrainEstimator::new(Duration::ZERO);
        e.record(100, 50, secs(5)); // 10/s
        e.record(50, 100, secs(5)); // grew: a sample of 0, not negative
        let after_zero = e.rate().unwrap().per_second();
        let weight = 1.0 - (-5.0f64 / 30.0).exp();
        assert!((after_zero - 10.0 * (1.0 - weight)).abs() < 1e-9);
        e.record(1000, 0, secs(5)); // a 200/s spike
        let after_spike = e.rate().unwrap().per_second();
        assert!(after_spike < 40.0, "one sample dominated: {after_spike}");
    }

    #[test]
    fn a_lag_longer_than_the_minimum_widens_the_span() {
        let mut e = DrainEstimator::new(secs(8));
        e.record(10, 0, secs(5));
        assert_eq!(e.rate(), None);
        e.record(10, 10, secs(3));
        assert_eq!(e.rate().map(DrainRate::per_second), Some(1.25));
    }

    /// Review 15: a span in which the queue stayed empty shows how much there was to take,
    /// not how fast consumers take: idle consumers at an empty queue are not "no drain".
    /// Today such spans are samples of 0, so after an idle spell the rate has decayed to
    /// next to nothing and the first refusals of a burst ask for `SENDGATE_RETRY_AFTER_MAX_S`
    /// although the consumers take the backlog in seconds.
    #[test]
    fn spans_at_an_empty_queue_are_not_samples_of_zero_drain() {
        let mut e = DrainEstimator::new(Duration::ZERO);
        // Consumers took 10/s for 30 s...
        for _ in 0..6 {
            e.record(100, 50, secs(5));
        }
        // ...then the queue sat empty for 5 minutes (nothing to take)...
        for _ in 0..60 {
            e.record(0, 0, secs(5));
        }
        // ...and a burst filled it: the first refusal (ceiling 1000, resume 0.5) should
        // still see consumers that take about 10/s, i.e. about 50 s, not the 300 s maximum.
        let wait = retry_after(1000, 500, e.rate(), Duration::ZERO, secs(300), 0.5);
        assert!(
            wait <= secs(120),
            "rate after an idle spell: {:?}, Retry-After {wait:?}",
            e.rate()
        );
    }

    /// Review 15 (a guard, passes today): a consumer that stopped leaves the queue full and
    /// every sample 0. The smoothed rate decays towards 0 and `Retry-After` must stay at the
    /// maximum however long the stall: were the rate ever to reach exactly 0.0, `rate()`
    /// would turn `None` and the answer drop to "until the next read" (1 s). Today the
    /// decay sticks at a subnormal (the step rounds to 0 first), which this pins down.
    #[test]
    fn a_consumer_stopped_for_hours_is_never_answered_with_one_second() {
        let mut e = DrainEstimator::new(Duration::ZERO);
        e.record(200, 100, secs(5)); // 20/s, then the consumer dies
                                     // One hour in, the answer is the maximum (the rate is ~e^-120 of 20/s)...
        for _ in 0..720 {
            e.record(100, 100, secs(5));
        }
        assert_eq!(
            retry_after(100, 50, e.rate(), secs(1), secs(300), 0.5),
            secs(300)
        );
        // ...and must stay so while nothing is taken (here up to ~7 h).
        let mut worst = Duration::MAX;
        for _ in 0..4_300 {
            e.record(100, 100, secs(5));
            let wait = retry_after(100, 50, e.rate(), secs(1), secs(300), 0.5);
            worst = worst.min(wait);
        }
        assert!(
            worst >= secs(300),
            "after a long stall Retry-After fell to {worst:?} (rate {:?})",
            e.rate()
        );
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
    fn retry_after_is_the_time_to_drain_clamped_and_jittered_within_bounds() {
        let r = |x| Some(DrainRate(x));
        let max = secs(300);
        let mid = 0.5; // no jitter
        assert_eq!(
            retry_after(120, 99, r(3.0), Duration::ZERO, max, mid),
            secs(7)
        );
        assert_eq!(
            retry_after(120, 99, None, Duration::from_millis(700), max, mid),
            Duration::from_millis(700),
            "no drain measured: until the next read"
        );
        assert_eq!(
            retry_after(1_000_000, 0, r(0.001), Duration::ZERO, max, mid),
            max
        );
        assert_eq!(
            retry_after(100, 99, r(1000.0), Duration::ZERO, max, mid),
            secs(1)
        );
        assert_eq!(
            retry_after(100, 99, r(1000.0), secs(2), max, mid),
            secs(2),
            "never before the next read"
        );
        for i in 0..=100 {
            let unit = f64::from(i) / 100.0;
            let d = retry_after(130, 99, r(1.0), Duration::ZERO, max, unit);
            // 31 messages at 1/s, ±10 %.
            assert!(
                d >= Duration::from_millis(27_900) && d <= Duration::from_millis(34_100),
                "{d:?}"
            );
            let low = retry_after(100, 99, r(1000.0), Duration::ZERO, max, unit);
            assert!(
                low >= secs(1) && low <= Duration::from_millis(1100),
                "{low:?}"
            );
            let high = retry_after(u64::MAX, 0, r(0.5), Duration::ZERO, max, unit);
            assert!(high >= secs(270) && high <= max, "{high:?}");
        }
    }
}
