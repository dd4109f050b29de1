//! The one backoff policy of sendgate's processes: a wait that doubles from a first one up
//! to a cap, spread by a [`Jitter`]. Every place that waits before trying again (the OTLP
//! export, the RabbitMQ reconnect, the Entra ID signing keys' refresh, the Entra ID token
//! fetch, the producer client's retries) asks [`Doubling::wait`] with its own parameters.
//!
//! Pure: the retry's number and the random `unit` are passed in, so each caller keeps its
//! own count and its own randomness, and tests pin every wait exactly.
//!
//! Not `backon` (in the tree through lapin and redis), because what it computes differs from
//! what these places do: its waits come as an iterator where four of the five callers ask
//! for "the n-th wait" (a count they keep, up to `u32::MAX`); it multiplies in `f32`, so a
//! 100 ms first wait doubles to 200.000003 ms where the tests pin 200 ms; and its one
//! jitter adds up to the wait again from its own generator, none of the three spreads used
//! here (up to the whole wait below it, a share below it, a fixed amount above it).

#![forbid(unsafe_code)]

use std::time::Duration;

/// A wait that doubles with each retry from `first` up to `cap`, spread by `jitter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Doubling {
    /// The wait before the first retry (before jitter).
    pub first: Duration,
    /// The longest wait before jitter.
    pub cap: Duration,
    pub jitter: Jitter,
}

/// How a wait is spread, so processes that failed together do not retry in step. `unit`
/// (a random number in `[0, 1]`) picks the point in the range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Jitter {
    /// The wait as it is.
    None,
    /// Anywhere in `[0, wait]` ("full jitter"): the widest spread, which may retry at once.
    Full,
    /// The wait less up to `percent` of it, `[wait × (100 − percent) %, wait]`: spread, yet
    /// never longer than the doubling says.
    Shave { percent: u8 },
    /// The wait plus up to this much.
    Add(Duration),
}

/// Doublings past this many change no wait that has a cap below 34 years (at a first wait
/// of 1 s), and keep the multiplier inside a `u32`.
const MOST_DOUBLINGS: u32 = 30;

impl Doubling {
    /// `first`, doubling, at most `cap`, without jitter.
    pub const fn new(first: Duration, cap: Duration) -> Self {
        Self {
            first,
            cap,
            jitter: Jitter::None,
        }
    }

    pub const fn with_jitter(self, jitter: Jitter) -> Self {
        Self { jitter, ..self }
    }

    /// The wait before retry number `n` (counted from 1; 0 reads as 1), before jitter:
    /// `first × 2^(n−1)`, at most `cap`.
    pub fn ceiling(&self, n: u32) -> Duration {
        let doublings = n.saturating_sub(1).min(MOST_DOUBLINGS);
        self.first.saturating_mul(1u32 << doublings).min(self.cap)
    }

    /// The wait before retry number `n`, spread by the jitter at `unit` (clamped to
    /// `[0, 1]`; anything not finite reads as 0).
    pub fn wait(&self, n: u32, unit: f64) -> Duration {
        let ceiling = self.ceiling(n);
        let unit = if unit.is_finite() {
            unit.clamp(0.0, 1.0)
        } else {
            0.0
        };
        match self.jitter {
            Jitter::None => ceiling,
            Jitter::Full => ceiling.mul_f64(unit),
            Jitter::Shave { percent } => {
                let shave = f64::from(percent.min(100));
                ceiling.mul_f64((100.0 - shave) / 100.0 + shave / 100.0 * unit)
            }
            Jitter::Add(most) => ceiling.saturating_add(most.mul_f64(unit)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn the_wait_doubles_from_the_first_up_to_the_cap() {
        let d = Doubling::new(MS(100), MS(1600));
        let waits: Vec<_> = (1..=7).map(|n| d.ceiling(n)).collect();
        assert_eq!(
            waits,
            [100, 200, 400, 800, 1600, 1600, 1600].map(MS).to_vec()
        );
        assert_eq!(d.ceiling(0), MS(100), "0 reads as the first retry");
        assert_eq!(d.ceiling(u32::MAX), MS(1600));
        // A cap that is no power-of-two multiple of the first wait is reached exactly.
        assert_eq!(Doubling::new(MS(100), MS(5000)).ceiling(7), MS(5000));
        // A first wait above the cap is cut to it.
        assert_eq!(Doubling::new(MS(900), MS(500)).ceiling(1), MS(500));
        // No overflow on a huge first wait.
        let huge = Doubling::new(Duration::MAX, Duration::MAX);
        assert_eq!(huge.ceiling(40), Duration::MAX);
    }

    #[test]
    fn no_jitter_is_the_ceiling_whatever_the_unit() {
        let d = Doubling::new(MS(100), MS(5000));
        assert_eq!(d.wait(3, 0.0), MS(400));
        assert_eq!(d.wait(3, 0.99), MS(400));
    }

    #[test]
    fn full_jitter_spans_zero_to_the_ceiling() {
        let d = Doubling::new(MS(100), MS(1000)).with_jitter(Jitter::Full);
        assert_eq!(d.wait(3, 0.0), Duration::ZERO);
        assert_eq!(d.wait(3, 0.5), MS(200));
        assert_eq!(d.wait(3, 1.0), MS(400));
        assert_eq!(d.wait(3, 7.0), MS(400), "the unit is clamped");
        assert_eq!(d.wait(3, f64::NAN), Duration::ZERO, "NaN reads as 0");
    }

    #[test]
    fn shave_takes_up_to_its_share_off_the_ceiling() {
        let s = Duration::from_secs;
        let d = Doubling::new(s(5), s(30)).with_jitter(Jitter::Shave { percent: 20 });
        assert_eq!(d.wait(1, 1.0), s(5));
        assert_eq!(d.wait(1, 0.0), s(4));
        assert_eq!(d.wait(4, 0.0), s(24));
        assert_eq!(d.wait(4, f64::NAN), s(24), "NaN reads as 0, never panics");
    }

    #[test]
    fn add_puts_up_to_its_amount_on_top() {
        let d = Doubling::new(MS(100), MS(1600)).with_jitter(Jitter::Add(MS(100)));
        assert_eq!(d.wait(1, 0.0), MS(100));
        assert_eq!(d.wait(2, 0.5), MS(250));
        assert_eq!(d.wait(9, 1.0), MS(1700));
    }
}
