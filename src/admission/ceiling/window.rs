//! A replica's own admissions of the last hold, by the ledger epoch that counts them
//! (docs/fleet.md, "what a replica holds"). Two numbers come out of it: the **carry** (those
//! the ledger of the current epoch does not hold: made alone, or from an older epoch's
//! blocks), reported with every call, and the **alone** count the fail-open rule weighs.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// Admissions are counted in buckets this wide, each stamped with its end, so an admission
/// is kept at least `hold` after it was made (a bucket is dropped `hold` after its end).
pub const BUCKET: Duration = Duration::from_millis(100);

/// The epoch of an admission made alone: no ledger counts it.
pub const ALONE: u64 = 0;

#[derive(Debug, Default)]
pub struct Window {
    /// `(end, epoch, count)`, oldest first. Bounded: one bucket per `BUCKET` per epoch
    /// switch within `hold`.
    buckets: VecDeque<(Instant, u64, u64)>,
}

impl Window {
    /// One admission at `now`, counted by the ledger of `epoch` ([`ALONE`]: by none).
    pub fn record(&mut self, now: Instant, epoch: u64) {
        match self.buckets.back_mut() {
            Some((end, e, n)) if *e == epoch && *end > now => *n += 1,
            _ => self.buckets.push_back((now + BUCKET, epoch, 1)),
        }
    }

    /// Take back the admission [`Window::record`] just made (the send was refused after all).
    pub fn unrecord(&mut self, epoch: u64) {
        if let Some(pos) = self.buckets.iter().rposition(|(_, e, _)| *e == epoch) {
            let bucket = &mut self.buckets[pos];
            bucket.2 -= 1;
            if bucket.2 == 0 {
                self.buckets.remove(pos);
            }
        }
    }

    /// Admissions of the last `hold` the ledger of epoch `current` does not hold.
    pub fn carry(&mut self, now: Instant, hold: Duration, current: u64) -> u64 {
        self.count(now, hold, |e| e != current)
    }

    /// Admissions of the last `hold` made alone.
    pub fn alone(&mut self, now: Instant, hold: Duration) -> u64 {
        self.count(now, hold, |e| e == ALONE)
    }

    fn count(&mut self, now: Instant, hold: Duration, which: impl Fn(u64) -> bool) -> u64 {
        while self
            .buckets
            .front()
            .is_some_and(|(end, _, _)| *end + hold <= now)
        {
            self.buckets.pop_front();
        }
        self.buckets
            .iter()
            .filter(|(_, e, _)| which(*e))
            .map(|(_, _, n)| n)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOLD: Duration = Duration::from_secs(10);

    #[tokio::test(start_paused = true)]
    async fn an_admission_counts_for_the_whole_hold_and_not_after() {
        let mut w = Window::default();
        let t0 = Instant::now();
        w.record(t0, ALONE);
        assert_eq!(w.alone(t0 + HOLD, HOLD), 1);
        assert_eq!(w.alone(t0 + HOLD + BUCKET, HOLD), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_carry_is_what_the_current_epoch_does_not_hold() {
        let mut w = Window::default();
        let t0 = Instant::now();
        w.record(t0, 7);
        w.record(t0, 7);
        w.record(t0, ALONE);
        w.record(t0, 9);
        assert_eq!(w.carry(t0, HOLD, 9), 3);
        assert_eq!(w.carry(t0, HOLD, 7), 2);
        assert_eq!(w.alone(t0, HOLD), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn admissions_share_a_bucket_only_within_its_width_and_epoch() {
        let mut w = Window::default();
        let t0 = Instant::now();
        w.record(t0, 1);
        w.record(t0 + BUCKET / 2, 1);
        w.record(t0 + BUCKET, 1);
        w.record(t0 + BUCKET, 2);
        assert_eq!(w.buckets.len(), 3);
        // The first bucket ends at t0 + BUCKET: gone at its end plus the hold.
        assert_eq!(w.carry(t0 + BUCKET + HOLD, HOLD, 0), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_admission_is_taken_back() {
        let mut w = Window::default();
        let t0 = Instant::now();
        w.record(t0, ALONE);
        w.record(t0, 3);
        w.unrecord(ALONE);
        assert_eq!(w.alone(t0, HOLD), 0);
        assert_eq!(w.carry(t0, HOLD, 5), 1);
        w.unrecord(ALONE);
        assert_eq!(w.carry(t0, HOLD, 5), 1);
    }
}
