//! One GCRA (generic cell rate algorithm), a tenant's rate quota with its burst, over
//! tokio's `Instant`.
//!
//! GCRA is written over tokio's `Instant` rather than taken from the `governor`
//! crate: governor reads its own clocks (quanta's, or std's `Instant`), which tokio's paused
//! test clock does not move, and its check takes the units when they conform, where the
//! judge must first hear the share rule out. The rule itself is a few lines of integer
//! arithmetic.

use std::time::Duration;

use tokio::time::Instant;

use crate::admission::tenants::Rate;

/// One tenant's GCRA: the theoretical arrival time (`tat`) of its next unit. `units`
/// conform at `now` when `max(tat, now) + units × interval − now ≤ burst × interval`.
#[derive(Debug, Clone)]
pub struct Gcra {
    /// Nanoseconds one unit takes to come back.
    interval: u128,
    /// Nanoseconds of credit a full bucket holds: `burst × interval`.
    tolerance: u128,
    tat: Instant,
}

impl Gcra {
    /// A full bucket at `now`.
    pub fn new(rate: Rate, now: Instant) -> Self {
        let interval = u128::from(rate.interval_ns());
        Self {
            interval,
            tolerance: interval * u128::from(rate.burst()),
            tat: now,
        }
    }

    /// Nanoseconds of credit used at `now`.
    fn used(&self, now: Instant) -> u128 {
        self.tat.saturating_duration_since(now).as_nanos()
    }

    /// How long until `units` conform (zero: now); `None` when they never can (more
    /// than the burst).
    pub fn wait(&self, units: u64, now: Instant) -> Option<Duration> {
        let cost = u128::from(units).saturating_mul(self.interval);
        if cost > self.tolerance {
            return None;
        }
        let over = (self.used(now) + cost).saturating_sub(self.tolerance);
        Some(nanos(over))
    }

    /// Take `units` at `now` (the judge admitted them).
    pub fn take(&mut self, units: u64, now: Instant) {
        let cost = u128::from(units).saturating_mul(self.interval);
        self.tat = self.tat.max(now) + nanos(cost);
    }

    /// Give back `units` taken (the send the judge admitted was then refused by the
    /// fleet's ledger, or decided again by the replica's own gate).
    pub fn give_back(&mut self, units: u64) {
        let cost = nanos(u128::from(units).saturating_mul(self.interval));
        self.tat = self.tat.checked_sub(cost).unwrap_or(self.tat);
    }

    /// Units that conform at `now` (`RateLimit`'s `r`).
    pub fn available(&self, now: Instant) -> u64 {
        let left = self.tolerance.saturating_sub(self.used(now));
        u64::try_from(left / self.interval).unwrap_or(u64::MAX)
    }

    /// How long until one more unit is available; `None` with the bucket full.
    pub fn until_more(&self, now: Instant) -> Option<Duration> {
        let used = self.used(now);
        if used == 0 {
            return None;
        }
        let left = self.tolerance.saturating_sub(used);
        Some(nanos(self.interval - left % self.interval))
    }

    /// How long until the bucket is full again (zero: it is).
    pub fn until_full(&self, now: Instant) -> Duration {
        nanos(self.used(now))
    }
}

fn nanos(n: u128) -> Duration {
    Duration::from_nanos(u64::try_from(n).unwrap_or(u64::MAX))
}
